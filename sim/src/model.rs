//! The reference models the scenario families and the fuzz targets share: each rule of
//! `docs/RULES.md` written once, from the rule's own statement, never by asking the core for the
//! answer.
//!
//! - [`backoff`]: the envelope of a schedule (B1, B4), the bounds of every jittered delay
//!   (B2, B3), and how a model adopts a draw it does not make ([`backoff::adopt`]): no model
//!   samples jitter, so none restates the core's sampling.
//! - [`breaker`]: a breaker's closed window and its trip rules (K2), and the breaker's every
//!   transition, permit and refusal (K1–K5), for the fuzz target and the breaker family alike.
//! - [`budget`]: retry budgets' grants (U1, U2, G9), a token bucket's balance and every token
//!   through it (U1, U3), and a ratio budget's window and decisions (U2), for the budget fuzz
//!   target and the breaker family alike.
//! - [`delivery`]: one task's redelivery, its every input and action (D1–D10, with the retry
//!   model inside), for the fuzz target and the delivery family alike.
//! - [`flow`]: when an every-flow is due (F5, F10), why a cron tick is skipped (F6), and a
//!   flow's every transition (F1–F10, B6).
//! - [`hint`]: what a hinted failure does (B6): waited in full, or deferred past `max_hint` or
//!   the total budget.
//! - [`retry`]: the retry machine's every action (R1–R6, B6), for the fuzz target and the
//!   retry family alike.
//! - [`supervision`]: a supervised task's settings (S1), its event stream (S1, S3, S5, S6, B6),
//!   and its every event (S1–S6, B6).
//!
//! A model says whether a rule holds through a [`Judge`]: the simulator's
//! [`World`](crate::world::World) turns a broken rule into a `Violation` (with the seed and the
//! trace), a fuzz target's context panics with it.

pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod delivery;
pub mod flow;
pub mod hint;
pub mod retry;
pub mod supervision;

/// Where a model's verdicts go.
pub trait Judge {
    /// What a broken rule becomes.
    type Error;

    /// Records that `rule` was checked; `Err` if it does not hold (`why` says how).
    fn check(&mut self, rule: &'static str, holds: bool, why: impl FnOnce() -> String) -> Result<(), Self::Error>;
}

impl Judge for crate::world::World {
    type Error = crate::world::Violation;

    fn check(&mut self, rule: &'static str, holds: bool, why: impl FnOnce() -> String) -> Result<(), Self::Error> {
        crate::world::World::check(self, rule, holds, why)
    }
}
