//! The two kinds of error every machine shares: a policy that cannot be built ([`PolicyError`]),
//! and an input a machine refuses ([`Refused`]).

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
    /// A setting was outside the range it is defined on.
    #[error("{setting} must lie in [{min}, {max}], got {value}")]
    OutOfRange {
        /// The setting, e.g. `"ratio"`.
        setting: &'static str,
        /// The value given.
        value: f64,
        /// The smallest value allowed.
        min: f64,
        /// The largest value allowed.
        max: f64,
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
    /// A retry policy with no limit at all (R3): no attempt limit and no total budget.
    #[error(
        "a retry policy needs a limit: set max_attempts, max_retries or total, or call unbounded() to retry for ever on purpose"
    )]
    Unbounded,
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

/// A refused input: why, and the input handed back unchanged (the crate docs: only caller mistakes
/// are `Err`; G12).
///
/// Every machine refuses a caller mistake the same way: the machine is left exactly as it was,
/// `error` says what was wrong (the machine's own error type: [`RetryError`](crate::RetryError),
/// [`SupervisionError`](crate::SupervisionError), [`FlowError`](crate::FlowError),
/// [`DeliveryError`](crate::DeliveryError)), and `input` gives back what the caller passed in
/// (a [`Failure`](crate::Failure), a worker id, a checkpoint), so nothing the caller owned is
/// lost. Inputs that carry nothing to hand back return the machine's error alone.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Backoff, Failure, Instant, Retry, RetryError, RetryPolicy};
/// use rand_core::SeedableRng;
///
/// let policy = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build()?).max_attempts(2).build()?;
/// let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
/// let mut retry = Retry::<String>::new();
/// let refused = retry
///     .handle_failure(&policy, Instant::ZERO, 1, Failure::retryable("late".to_string()), &mut rng)
///     .unwrap_err();
/// assert_eq!(refused.error, RetryError::NotStarted);
/// assert_eq!(refused.input.error, "late"); // handed back
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{error}")]
pub struct Refused<E, I> {
    /// Why the input was refused.
    pub error: E,
    /// The input, as given.
    pub input: I,
}

impl<E, I> Refused<E, I> {
    /// A refusal of `input` for `error`.
    pub const fn new(error: E, input: I) -> Self {
        Refused { error, input }
    }
}
