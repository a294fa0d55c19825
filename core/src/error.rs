//! Configuration errors shared by every policy builder.

/// Why a policy could not be built.
///
/// Policies are validated once, when built; a machine driven by a valid policy never fails
/// because of its configuration. Each message names the setting and the accepted range.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// A multiplier or ratio was NaN or infinite.
    #[error("{setting} must be a finite number, got {value}")]
    NotFinite {
        /// The setting, e.g. `"multiplier"`.
        setting: &'static str,
        /// The value given.
        value: f64,
    },
    /// An exponential multiplier was below 1 (the delays would shrink), or so close to 1 that
    /// it cannot be told apart from 1 in `f64` arithmetic.
    #[error(
        "multiplier must be exactly 1.0 or at least 1 + 1e-6 (the delays must grow measurably or not at all), got {value}"
    )]
    MultiplierOutOfRange {
        /// The value given.
        value: f64,
    },
    /// A jitter or rate fraction was outside `[0, 1]`.
    #[error("{setting} must lie in [0, 1], got {value}")]
    FractionOutOfRange {
        /// The setting, e.g. `"jitter factor"`.
        setting: &'static str,
        /// The value given.
        value: f64,
    },
    /// The cap (`max_delay`) is below a delay the schedule starts from.
    #[error("max_delay ({max_delay_ns} ns) is below {setting} ({value_ns} ns); raise max_delay or lower {setting}")]
    CapBelow {
        /// The setting the cap is below, e.g. `"initial delay"` or `"min_delay"`.
        setting: &'static str,
        /// The cap, in nanoseconds (saturated at `u64::MAX`).
        max_delay_ns: u64,
        /// The setting's value, in nanoseconds (saturated at `u64::MAX`).
        value_ns: u64,
    },
    /// A setting was zero where zero has no meaning.
    #[error("{setting} must not be zero: {why}")]
    Zero {
        /// The setting, e.g. `"max_attempts"`.
        setting: &'static str,
        /// What zero would mean, and what to use instead.
        why: &'static str,
    },
    /// A duration does not fit in `u64` nanoseconds (about 584 years).
    #[error("{setting} is too long: delays are whole nanoseconds up to u64::MAX (about 584 years)")]
    DurationOverflow {
        /// The setting, e.g. `"initial delay"`.
        setting: &'static str,
    },
    /// A count was too large to be counted exactly.
    #[error("{setting} is too large: at most {max} (leave it unset for no limit)")]
    LimitTooLarge {
        /// The setting, e.g. `"max_retries"`.
        setting: &'static str,
        /// The largest accepted value.
        max: u64,
    },
    /// Two settings that exclude each other were both given.
    #[error("{setting} cannot be combined with {other}: {why}")]
    Conflict {
        /// The first setting.
        setting: &'static str,
        /// The setting it conflicts with.
        other: &'static str,
        /// Why, and what to do instead.
        why: &'static str,
    },
}
