//! The reference models the scenario families and the fuzz targets share: each rule of DESIGN
//! written once, from DESIGN's own formulas, never by asking the core for the answer.
//!
//! - [`backoff`]: the envelope of a schedule (B1, B4) and the bounds of every jittered delay
//!   (B2, B3).

pub mod backoff;
