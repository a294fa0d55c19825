//! Tests written to kill the mutants cargo-mutants found surviving (`.ci/mutants`): each pins
//! down a boundary or a formula that the rule tests only bounded.
//!
//! Survivors of `.ci/mutants core/src/{decision,backoff,time,random,jitter_rng}.rs` that no
//! test can kill, because the mutant behaves the same:
//! - `backoff.rs` `delay_ns`: `drawn < min` → `<=` and `floored > max` → `>=` select the
//!   bound when the draw equals it, which is the draw.
//! - `backoff.rs` `first_capped`: `< max` → `<=` on the last failure count, `>=` → `<` in the
//!   search, and `raw_envelope`'s cap ratio `max / base` → `max * base`: each changes only the
//!   failure count from which the cap is looked up instead of computed, and the computed
//!   envelope is capped to the same value.
//! - `random.rs` `uniform_inclusive`: `low < range` → `<=` sends a low product equal to the
//!   range to the rejection check, which keeps it (the threshold is below the range).
//!
//! `.ci/mutants core/src/attempt.rs core/src/decision.rs` (185 mutants, 2026-12-02): 116 caught,
//! 19 timeouts, 35 unviable, 15 missed. The tests after the delivery ones kill 12 of the 15;
//! `ENDED | WAIT` → `^` and `ENDED | FINISH` → `^` in `validate` are equivalent (disjoint
//! bits); `validate`'s `Abandoning if last_failure.is_none()` guard (a supervision state) is
//! killed by `s4_an_abandoning_task_loads_only_with_its_timeout` (2026-12-03).
//!
//! `.ci/mutants core/src/delivery.rs` (252 mutants): 28 survived the rule tests; the tests at the
//! end of this file kill 22. The other 6 are equivalent: `|` → `^` between the single-bit action
//! flags in `validate` (`REVOKE | READY | HAND_OUT | FINISH` and its parts), whose bits are
//! disjoint, so `a ^ b == a | b`.
//!
//! `.ci/mutants core/src/breaker.rs` (450 mutants, 2026-12-03): 328 caught, 0 timeouts, 34
//! unviable, 88 missed; 82 are killed by the tests at the end of this file and 6 are
//! equivalent. The tests kill the survivors of `Window::validate`
//! (crafted loads of a count and a time window, each bound just inside and just outside), the
//! `Permit` getters, `window_key`'s shift, the bucket-width limit, `NEVER`, `rate_ppm`'s rounding,
//! the builder a policy gives back, `successes_to_close`, `trip_reason`'s slow-call reason and
//! `Probes::latest` (each checked against its mutant applied by hand). Equivalent: `window_key`'s
//! `(width << 5) | buckets` → `^` (the bits overlap only for a loaded bucket count of 32 or
//! more, which is refused either way; only the reason named differs), and `|` → `^` in `push`'s
//! write of a count-window slot, `(w & !(3 << shift)) | new` and `f | (s << 1)` (disjoint bits).
//! Later in the file: `try_acquire`'s fast refusal and its probe test, `acquire_slow`'s id
//! counter, `Breaker::id`, `expire`'s freeing of a lease under the rates rule and
//! `Breaker::validate`'s check of a half-open state. Equivalent there: the fast refusal's guard
//! → `false` and `last_now < until` → `>` (the slow path refuses alike; `last_now` never passes
//! `until` while open), and `next_id | PROBE_BIT` → `^` (`next_id` never holds that bit).
//!
//! `.ci/mutants core/src/concurrency_budget.rs core/src/deliveries.rs` (113 mutants,
//! 2026-12-03): 84 caught, 0 timeouts, 16 unviable, 13 missed. Tests in `tests/deliveries.rs`
//! (`d2_the_table_interrupts_…`, `d6_a_failover_of_the_table_…`, `d9_the_total_…`) and
//! `tests/budget.rs` (`o1_a_concurrency_budget_counts_…`) kill 12; the other is equivalent:
//! `share > min` → `>=` in `ConcurrencyBudgetPolicy::limit` (equal values, the same maximum).
//!
//! `.ci/mutants core/src/hedge.rs` (144 mutants, 2026-12-03): 99 caught, 2 timeouts, 25
//! unviable, 18 missed. Tests in `tests/hedge.rs` (`x5_invalid_policies_…`, `x3_b6_a_hint_of_…`,
//! `x4_x5_a_canceled_attempt_…`, `x1_x5_sixteen_attempts_…`) kill 13; 5 are equivalent:
//! `bits | bit(a)` → `^` in `handle_rejected` (distinct bits), `started < max` → `<=` where
//! `advance` sets `next_at` (its end clears it at the limit), and in `check` and `bit` the
//! range tests that only out-of-range attempts reach (`||` → `&&` twice, `> MAX` → `==` in
//! `bit`), which `check` refuses before `bit` is asked.
//!
//! `.ci/mutants core/src/budget.rs` (239 mutants, 2026-12-03): 196 caught, 3 timeouts, 30
//! unviable, 10 missed. Tests in `tests/budget.rs` kill all 10: the gRPC token ratio's limit at
//! 10^12 and just past it, and a zero ratio (`u1_the_grpc_preset_…`), a retry that costs the
//! whole bucket (`u1_a_retry_may_cost_…`), the events each budget pushes out
//! (`o1_a_token_bucket_counts_…`, `o1_a_ratio_budget_counts_…`), and the loads of a budget with
//! no window shape and of one with 16 buckets (`u2_a_loaded_ratio_budget_with_no_window_…`,
//! `u2_a_ratio_budget_of_the_most_…`). The 3 timeouts (`*` → `+` in the costs of `costs` and
//! `aws`, `Throttle::granted` emptied) hang the tests: detected, not survivors.
//!
//! `.ci/mutants core/src/failure.rs core/src/outbox.rs core/src/presets.rs` (46 mutants,
//! 2026-12-03): 23 caught, 0 timeouts, 21 unviable, 2 missed, both equivalent:
//! `presets::scheduler` → `Default::default()` (its body is `FlowPolicy::default()`) and
//! `presets::supervisor` → `Default::default()` (`TaskDefaults::default()` is `new()`).
//! `error.rs` and `lib.rs` have no mutants. With these, every file of `core/src` has been run.

use core::convert::Infallible;
use core::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerPolicy, BreakerPolicyBuilder, BreakerStatus, CallOutcome, Delivery, DeliveryError,
    DeliveryPolicy, DeliveryStatus, Failure, FreeReturn, Instant, Jitter, Permit, PolicyError, RetryPolicy, SplitMix64,
};
use rand_core::{Rng, TryRng};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// An RNG that always draws the same value: 0 draws the low end of a range, `u64::MAX` its
/// high end.
struct Fixed(u64);

impl TryRng for Fixed {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        Ok(self.0 as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        dst.fill(0);
        Ok(())
    }
}

#[test]
fn b2_a_cap_equal_to_the_initial_delay_or_to_the_floor_is_accepted() {
    let at_initial = Backoff::exponential(ms(5), 2.0).max_delay(ms(5)).build().unwrap();
    assert_eq!((at_initial.envelope(1), at_initial.envelope(9)), (ms(5), ms(5)));
    let at_floor = Backoff::constant(ms(3)).min_delay(ms(5)).max_delay(ms(5)).build().unwrap();
    assert_eq!(at_floor.delay(1, Duration::ZERO, &mut Fixed(0)), ms(5));
}

#[test]
fn b2_b4_a_capped_envelope_grows_to_the_cap_then_stays_there() {
    let b = Backoff::exponential(ms(100), 2.0).max_delay(ms(1_000)).build().unwrap();
    let envelopes: Vec<_> = [1, 2, 3, 4, 5, 6, 16, 17, 40, u32::MAX].iter().map(|&n| b.envelope(n)).collect();
    assert_eq!(envelopes, [100, 200, 400, 800, 1_000, 1_000, 1_000, 1_000, 1_000, 1_000].map(ms));
    // Without jitter a delay is its envelope, below the cap and at it.
    assert_eq!(b.delay(3, Duration::ZERO, &mut Fixed(0)), ms(400));
    assert_eq!(b.delay(30, Duration::ZERO, &mut Fixed(0)), ms(1_000));
}

#[test]
fn b1_a_decorrelated_envelope_is_base_times_three_to_the_n_capped() {
    let b = Backoff::decorrelated(ms(10)).max_delay(ms(1_000)).build().unwrap();
    let envelopes: Vec<_> = (1..=6).map(|n| b.envelope(n)).collect();
    assert_eq!(envelopes, [30, 90, 270, 810, 1_000, 1_000].map(ms));
}

#[test]
fn b1_a_decorrelated_delay_draws_up_to_three_times_the_previous_one() {
    let b = Backoff::decorrelated(ms(10)).max_delay(Duration::from_secs(60)).build().unwrap();
    // The high end of U[base, 3·previous] follows `previous`; the low end is the base.
    assert_eq!(b.delay(1, ms(100), &mut Fixed(u64::MAX)), ms(300));
    assert_eq!(b.delay(1, Duration::from_secs(1), &mut Fixed(u64::MAX)), Duration::from_secs(3));
    assert_eq!(b.delay(1, Duration::from_secs(1), &mut Fixed(0)), ms(10));
    assert_eq!(b.delay(1, Duration::ZERO, &mut Fixed(u64::MAX)), ms(30), "previous below base reads as base");
}

#[test]
fn b3_a_proportional_spread_is_rounded_to_the_nearest_unit() {
    // An envelope of 2^32 ns makes the spread equal to the factor in units of 2^-32: here
    // 2^31 + 0.75, which rounds up to 2^31 + 1.
    let envelope = Duration::from_nanos(1 << 32);
    let factor = 0.5 + 0.75 / 4_294_967_296.0;
    let b = Backoff::constant(envelope).jitter(Jitter::Proportional(factor)).build().unwrap();
    assert_eq!(b.delay(1, Duration::ZERO, &mut Fixed(0)), Duration::from_nanos((1 << 31) - 1));
    assert_eq!(b.delay(1, Duration::ZERO, &mut Fixed(u64::MAX)), Duration::from_nanos((1 << 32) + (1 << 31) + 1));
}

#[test]
fn splitmix64_draws_32_bits_from_the_top_of_its_64() {
    let (mut a, mut b) = (SplitMix64::new(42), SplitMix64::new(42));
    for _ in 0..4 {
        assert_eq!(a.next_u32(), (b.next_u64() >> 32) as u32);
    }
}

#[test]
fn instants_add_and_subtract_checked_and_in_place() {
    let one = Instant::from_secs(1);
    assert_eq!(one.checked_add(Duration::from_secs(2)), Some(Instant::from_secs(3)));
    assert_eq!(Instant::MAX.checked_add(Duration::from_nanos(1)), None);
    assert_eq!(one.checked_sub(ms(250)), Some(Instant::from_millis(750)));
    assert_eq!(one.checked_sub(Duration::from_secs(2)), None);
    let mut t = one;
    t += ms(500);
    assert_eq!(t, Instant::from_millis(1_500));
    t -= Duration::from_secs(1);
    assert_eq!(t, Instant::from_millis(500));
    t -= Duration::from_secs(9);
    assert_eq!(t, Instant::ZERO, "saturates at the epoch");
}

// ---- delivery.rs (`.ci/mutants core/src/delivery.rs`) ----------------------------------------

/// Workers `u8`, no checkpoints, errors `String`.
type Task = Delivery<u32, u8, (), String>;

/// 100 ms retry delays, 5 attempts, a 1 s start lease, up to 10 free returns.
fn delivery_policy() -> DeliveryPolicy {
    let retry = RetryPolicy::builder(Backoff::constant(ms(100)).build().unwrap()).max_attempts(5).build().unwrap();
    DeliveryPolicy::builder(retry).start_timeout(Duration::from_secs(1)).max_redeliveries(10).build().unwrap()
}

fn drained(task: &mut Task) {
    while task.poll_action().is_some() {}
}

/// A new task whose attempt 1 is handed to worker 1 at zero.
fn handed_out(policy: &DeliveryPolicy) -> Task {
    let mut task = Task::new(policy, Instant::ZERO, 1, 1);
    drained(&mut task);
    task.handle_hand_out(policy, Instant::ZERO, 1).unwrap();
    drained(&mut task);
    task
}

/// A task whose attempt 1 failed at `at`: attempt 2 waits for its 100 ms retry delay.
fn failed_once(policy: &DeliveryPolicy, at: Instant) -> Task {
    let mut task = handed_out(policy);
    task.handle_failure(policy, at, 1, &1, Failure::retryable("x".to_owned()), &mut SplitMix64::new(1)).unwrap();
    drained(&mut task);
    task
}

/// A task that declined `n` workers (1, 2, …) and is pending again.
fn declined_by(n: u8) -> Task {
    let policy = delivery_policy();
    let mut task = Task::new(&policy, Instant::ZERO, 1, 1);
    drained(&mut task);
    for worker in 1..=n {
        task.handle_hand_out(&policy, Instant::ZERO, worker).unwrap();
        drained(&mut task);
        task.handle_returned(&policy, Instant::ZERO, 1, &worker, FreeReturn::Declined).unwrap();
        drained(&mut task);
    }
    task
}

#[test]
fn d6_persisting_a_sync_start_changes_nothing_not_even_the_clock() {
    let policy = delivery_policy();
    let mut task = handed_out(&policy);
    let before = task.clone();
    task.handle_persisted(Instant::from_millis(500), 1).unwrap();
    assert_eq!(task, before, "a Sync start is durable already");
}

#[test]
fn d3_every_decliner_is_remembered_up_to_the_capacity() {
    let task = declined_by(4);
    assert!((1..=4u8).all(|w| task.has_declined(&w)), "all four decliners fit");
    let task = declined_by(5);
    assert!(task.has_declined(&5) && !task.has_declined(&1), "the fifth replaces the oldest");
    assert!((2..=4u8).all(|w| task.has_declined(&w)));
}

#[test]
fn d2_a_lease_is_not_revoked_before_its_deadline() {
    let policy = delivery_policy();
    let mut task = handed_out(&policy);
    task.handle_timeout(&policy, Instant::from_millis(999), &mut SplitMix64::new(1));
    assert_eq!(task.poll_action(), None);
    assert!(matches!(task.status(), DeliveryStatus::HandedOut { attempt: 1, .. }));
    task.handle_timeout(&policy, Instant::from_millis(1000), &mut SplitMix64::new(1));
    assert!(task.poll_action().is_some(), "revoked at the deadline");
}

#[test]
fn d1_stats_count_attempts_and_the_delays_between_them() {
    let task = failed_once(&delivery_policy(), Instant::from_millis(10));
    // The embedded retry counts the attempt it scheduled, and the delay before it.
    let stats = task.stats();
    assert_eq!((stats.attempts, stats.slept), (2, ms(100)));
}

#[test]
fn d1_a_hand_out_at_the_end_of_the_retry_delay_is_accepted_before_the_timeout_is_handled() {
    let policy = delivery_policy();
    let mut task = failed_once(&policy, Instant::ZERO);
    // Pending until 100 ms; `handle_timeout` has not been called.
    let early = task.handle_hand_out(&policy, Instant::from_millis(99), 2).unwrap_err();
    assert!(matches!(early.error, DeliveryError::NotYetEligible { attempt: 2, .. }));
    assert!(task.can_hand_out(Instant::from_millis(100), &2));
    task.handle_hand_out(&policy, Instant::from_millis(100), 2).unwrap();
}

/// A state taken through JSON, with `edit` applied to its JSON first.
#[cfg(feature = "serde")]
fn reloaded(task: &Task, edit: impl FnOnce(&mut serde_json::Value)) -> Result<Task, serde_json::Error> {
    let mut json = serde_json::to_value(task).unwrap();
    edit(&mut json);
    serde_json::from_value(json)
}

#[cfg(feature = "serde")]
#[test]
fn g12_loaded_states_with_actions_of_another_state_are_refused() {
    let policy = delivery_policy();
    let pending = declined_by(0);
    // Pending: a hand-out or a finish pending is another state's action (READY = 2,
    // HAND_OUT = 4, FINISH = 8).
    for bits in [4, 8] {
        assert!(reloaded(&pending, |j| j["pending"] = bits.into()).is_err(), "pending with {bits}");
    }
    let out = handed_out(&policy);
    assert_eq!(reloaded(&out, |_| {}).unwrap(), out);
    for bits in [2, 8] {
        assert!(reloaded(&out, |j| j["pending"] = bits.into()).is_err(), "handed out with {bits}");
    }
    let mut done = out.clone();
    done.handle_success(Instant::ZERO, 1, &1).unwrap();
    let undrained = reloaded(&done, |_| {}).unwrap();
    assert_eq!(undrained, done, "a finish waiting to be drained loads");
    drained(&mut done);
    assert_eq!(reloaded(&done, |_| {}).unwrap(), done, "a finished, drained task loads");
    for bits in [2, 4] {
        assert!(reloaded(&done, |j| j["pending"] = bits.into()).is_err(), "finished with {bits}");
    }
    // A completion of an attempt its retry never ran.
    assert!(reloaded(&done, |j| j["state"]["Done"]["Completed"]["attempt"] = 3.into()).is_err());
}

#[cfg(feature = "serde")]
#[test]
fn g12_a_loaded_retried_task_that_claims_no_attempt_reached_a_worker_is_refused() {
    let task = failed_once(&delivery_policy(), Instant::ZERO);
    assert!(matches!(task.status(), DeliveryStatus::Pending { attempt: 2, .. }));
    assert_eq!(reloaded(&task, |_| {}).unwrap(), task);
    assert!(reloaded(&task, |j| j["progress"] = "NotStarted".into()).is_err());
}

#[cfg(feature = "serde")]
#[test]
fn g12_the_decliners_ring_loads_only_as_handle_returned_fills_it() {
    // Rings that declines make: empty, partly filled, full (its next slot wrapped to 0).
    for n in [0, 1, 3, 4, 5] {
        let task = declined_by(n);
        assert_eq!(reloaded(&task, |_| {}).unwrap(), task, "{n} decliners");
    }
    let one = declined_by(1);
    assert!(reloaded(&one, |j| j["declined_next"] = 2.into()).is_err(), "next slot past the used ones");
    assert!(
        reloaded(&one, |j| {
            j["declined"][1] = j["declined"][0].clone();
            j["declined"][0] = serde_json::Value::Null;
        })
        .is_err(),
        "a gap before a used slot"
    );
}

// `.ci/mutants core/src/attempt.rs`: the survivors these two kill are the refusal of an input
// that needs a started machine, on one that has not started (the `Idle` arm of
// `check_started`), and the count of a failure that ends a task by itself (`count_failure`).

#[test]
fn g12_a_rejection_or_an_abandon_before_the_start_is_refused_and_changes_nothing() {
    use persevere::{Retry, RetryError, Supervision, SupervisionError, SupervisionPolicy, TaskDefaults};
    let mut retry: Retry<()> = Retry::new();
    let before = retry;
    assert_eq!(retry.handle_rejected(Instant::from_nanos(5)), Err(RetryError::NotStarted));
    assert_eq!(retry, before);

    let policy = SupervisionPolicy::restartable().build(&TaskDefaults::new()).unwrap();
    let mut task = Supervision::<u32>::new();
    let before = task;
    let refused = task.handle_abandoned(&policy, Instant::from_nanos(5), 1, Some(3), &mut Fixed(0)).unwrap_err();
    assert_eq!((refused.error, refused.input), (SupervisionError::NotStarted, Some(3)));
    assert_eq!(task, before);
}

#[test]
fn s4_a_timed_out_attempt_whose_drop_panics_counts_into_the_streak() {
    use persevere::{Supervision, SupervisionAction, SupervisionPolicy, TaskDefaults, TaskOutcome};
    let defaults = TaskDefaults { backoff: Backoff::constant(ms(100)).build().unwrap(), ..TaskDefaults::new() };
    let policy = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&defaults).unwrap();
    let at = |n: u64| Instant::from_nanos(n * 1_000_000);
    let mut task = Supervision::<u32>::new();
    let drain = |task: &mut Supervision<u32>| while task.poll_action().is_some() {};
    task.handle_start(&policy, at(0)).unwrap();
    drain(&mut task);
    task.handle_timeout(&policy, at(30));
    assert_eq!(task.poll_action(), Some(SupervisionAction::AttemptTimedOut { attempt: 1 }));
    task.handle_abandoned(&policy, at(31), 1, Some(5), &mut Fixed(0)).unwrap();
    assert_eq!(task.streak(), 1, "the timed-out attempt failed: it counts");
    assert_eq!(
        task.poll_action(),
        Some(SupervisionAction::TaskFinished { outcome: TaskOutcome::Panicked { error: 5 }, attempts: 1 })
    );
}

#[test]
fn r6_a_wake_up_at_the_end_of_time_does_not_time_out_an_attempt_with_no_deadline() {
    use persevere::{Retry, RetryAction};
    let policy = retry_policy(3);
    let mut retry: Retry<()> = Retry::new();
    retry.handle_start(&policy, Instant::ZERO).unwrap();
    assert_eq!(retry.poll_action(), Some(RetryAction::Start { attempt: 1, deadline: None }));
    let before = retry;
    // A deadline-less attempt's timer is the end of time itself: a wake-up there is spurious.
    retry.handle_timeout(&policy, Instant::MAX, &mut Fixed(0));
    assert_eq!(retry, before);
    assert_eq!(retry.poll_action(), None);
}

/// Kills `ended_pending -> true` and its `&` → `|` in `attempt.rs`: only a state whose
/// attempt's end waits to be reported is checked against what followed that end, so a task
/// whose attempt runs (nothing to report) loads back.
#[cfg(feature = "serde")]
#[test]
fn s6_a_running_task_with_nothing_to_report_loads_back() {
    use persevere::{Supervision, SupervisionPolicy, TaskDefaults};
    let policy = SupervisionPolicy::restartable().build(&TaskDefaults::new()).unwrap();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&policy, Instant::ZERO).unwrap();
    while task.poll_action().is_some() {}
    let json = serde_json::to_string(&task).unwrap();
    let loaded: Supervision<u32> = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
    assert_eq!(loaded, task);
}

/// Kills `ENDED | FINISH` → `ENDED & FINISH` in `attempt.rs`'s `validate`: a state whose
/// canceled attempt's end and the outcome both wait to be drained loads back. (Its twin
/// `ENDED | WAIT` → `ENDED ^ WAIT` is equivalent: the bits are disjoint.)
#[cfg(feature = "serde")]
#[test]
fn g12_an_operation_canceled_mid_attempt_with_its_outputs_undrained_loads_back() {
    use persevere::{Retry, RetryAction};
    let policy = retry_policy(3);
    let mut retry = started(&policy);
    retry.handle_cancel(Instant::from_nanos(5)).unwrap();
    let json = serde_json::to_string(&retry).unwrap();
    let mut loaded: Retry<u8> = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
    assert_eq!(loaded, retry);
    assert_eq!(loaded.poll_action(), Some(RetryAction::Abandon { attempt: 1 }));
}

/// Kills `||` → `&&` in `attempt.rs`'s `validate` of a state that has not started and of a
/// wait: each single edit below is refused on its own.
#[cfg(feature = "serde")]
#[test]
fn g12_a_loaded_state_with_one_field_no_transition_could_have_made_is_refused() {
    use persevere::{Failure, Retry};
    use serde_json::{Value, json};
    let refused = |state: Value, why: &str| {
        assert!(serde_json::from_value::<Retry<u8>>(state.clone()).is_err(), "{why}: loaded {state}");
    };
    let idle = serde_json::to_value(Retry::<u8>::new()).unwrap();
    serde_json::from_value::<Retry<u8>>(idle.clone()).unwrap();
    for (field, value) in
        [("timer", json!(5)), ("last_now", json!(5)), ("last_failure", json!({ "class": "Retryable", "error": null }))]
    {
        let mut s = idle.clone();
        s["engine"][field] = value;
        refused(s, field);
    }
    let mut s = idle.clone();
    s["engine"]["backoff"]["last_delay_ns"] = json!(5);
    refused(s, "an idle backoff with a delay");

    let policy = retry_policy(3);
    let mut retry = started(&policy);
    retry.handle_failure(&policy, Instant::from_nanos(5), 1, Failure::retryable(1), &mut Fixed(0)).unwrap();
    while retry.poll_action().is_some() {}
    let waiting = serde_json::to_value(retry).unwrap();
    serde_json::from_value::<Retry<u8>>(waiting.clone()).unwrap();
    let mut s = waiting;
    s["engine"]["last_failure"] = Value::Null;
    refused(s, "a wait after a failure with no failure");
}

/// Kills two more survivors in `validate`: a finished operation whose outcome was drained
/// (its failure taken with it) loads back, and one canceled before its start that carries a
/// failure is refused.
#[cfg(feature = "serde")]
#[test]
fn g12_a_drained_outcome_loads_back_and_a_cancel_before_the_start_with_a_failure_does_not() {
    use persevere::{Failure, Retry};
    use serde_json::json;
    let policy = retry_policy(1);
    let mut retry = started(&policy);
    retry.handle_failure(&policy, Instant::from_nanos(5), 1, Failure::retryable(1), &mut Fixed(0)).unwrap();
    while retry.poll_action().is_some() {}
    let json = serde_json::to_string(&retry).unwrap();
    assert_eq!(serde_json::from_str::<Retry<u8>>(&json).map_err(|e| e.to_string()), Ok(retry));

    let mut canceled: Retry<u8> = Retry::new();
    canceled.handle_cancel(Instant::ZERO).unwrap();
    let mut s = serde_json::to_value(canceled).unwrap();
    serde_json::from_value::<Retry<u8>>(s.clone()).unwrap();
    s["engine"]["last_failure"] = json!({ "class": "Retryable", "error": null });
    assert!(serde_json::from_value::<Retry<u8>>(s.clone()).is_err(), "loaded {s}");
}

// `.ci/mutants core/src/retry.rs` (123 mutants, 2026-12-03, 32 min): 72 caught, 6 timeouts,
// 41 unviable, 4 missed before the three tests below, which kill all four.

/// Kills `u32::MAX - 1` → `u32::MAX / 1` in the error of a `max_retries` too large to count
/// attempts in `u32`: the error names the largest `max_retries` that fits.
#[test]
fn r3_a_max_retries_too_large_names_the_largest_that_fits() {
    let built = RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_retries(u32::MAX).build();
    assert_eq!(
        built,
        Err(persevere::PolicyError::LimitTooLarge { setting: "max_retries", max: u64::from(u32::MAX) - 1 })
    );
    let largest = RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_retries(u32::MAX - 1).build();
    assert_eq!(largest.map(|p| p.max_attempts()), Ok(Some(u32::MAX)));
}

/// Kills `needs_clock` → `false` and its `&` → `|`: a policy needs the clock on the success
/// path with a total budget, with an attempt timeout, with both, and not with neither.
#[test]
fn r3_a_policy_needs_the_clock_exactly_with_a_budget_or_an_attempt_timeout() {
    let builder = || RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_attempts(3);
    assert!(!builder().build().unwrap().needs_clock());
    assert!(builder().total(ms(50)).build().unwrap().needs_clock());
    assert!(builder().attempt_timeout(ms(5)).build().unwrap().needs_clock());
    assert!(builder().total(ms(50)).attempt_timeout(ms(5)).build().unwrap().needs_clock());
}

/// Kills `Display for OutcomeKind` → `Ok(())`: each outcome reads as words a log line can use.
#[test]
fn r5_every_outcome_kind_has_its_own_words() {
    use persevere::OutcomeKind::*;
    let kinds = [Succeeded, Exhausted, Fatal, Canceled, OutOfTime, Rejected, Deferred];
    let words: Vec<String> = kinds.iter().map(ToString::to_string).collect();
    assert_eq!(words[1], "attempt limit reached");
    assert!(words.iter().all(|w| !w.is_empty()), "{words:?}");
    let mut distinct = words.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), kinds.len(), "{words:?}");
}

// `.ci/mutants core/src/supervision.rs` (101 mutants, 2026-12-03, 25 min): 44 caught, 43
// unviable, 14 missed. The six tests below kill all 14 (each but the two accessors' checked
// against its mutant by hand): a zero attempt
// timeout set on the task, `has_failure` either way, a drop reported for another attempt while
// one is abandoned, the accessors `has_actions` and `last_failure`, and the seven mutants of
// `validate`'s check of an attempt's end that waits to be drained. One of them also kills
// attempt.rs's `Abandoning if last_failure.is_none()` guard.

/// Kills `d.is_zero()` → `false` for the task's own attempt timeout: zero is refused, with the
/// setting named, as the defaults' is.
#[test]
fn s1_a_zero_attempt_timeout_set_on_the_task_is_refused() {
    use persevere::{PolicyError, Setting, SupervisionPolicy, TaskDefaults};
    let mut builder = SupervisionPolicy::restartable();
    builder.attempt_timeout = Setting::Set(Duration::ZERO);
    let refused = builder.build(&TaskDefaults::new());
    assert!(matches!(refused, Err(PolicyError::Zero { setting: "attempt_timeout", .. })), "{refused:?}");
}

/// Kills `has_failure` → `true` and → `false`: a task whose `TaskFinished` waits to be drained
/// loads back when it completed (no failure to report), and is refused when it failed but
/// carries no failure.
#[cfg(feature = "serde")]
#[test]
fn s6_an_undrained_outcome_loads_only_with_the_failure_it_reports() {
    use persevere::{Failure, Supervision, SupervisionPolicy, TaskDefaults};
    let policy = SupervisionPolicy::once().build(&TaskDefaults::new()).unwrap();
    let finished = |failed: bool| {
        let mut task = Supervision::<u8>::new();
        task.handle_start(&policy, Instant::ZERO).unwrap();
        while task.poll_action().is_some() {}
        if failed {
            task.handle_failure(&policy, Instant::from_nanos(5), 1, Failure::retryable(1), &mut Fixed(0)).unwrap();
        } else {
            task.handle_success(&policy, Instant::from_nanos(5), 1).unwrap();
        }
        // The attempt's end drained; `TaskFinished` still waits.
        assert!(task.poll_action().is_some());
        assert!(task.has_actions());
        task
    };
    let completed = finished(false);
    let json = serde_json::to_string(&completed).unwrap();
    assert_eq!(serde_json::from_str::<Supervision<u8>>(&json).map_err(|e| e.to_string()), Ok(completed));

    let failed = finished(true);
    let mut s = serde_json::to_value(failed).unwrap();
    serde_json::from_value::<Supervision<u8>>(s.clone()).unwrap();
    s["engine"]["last_failure"] = serde_json::Value::Null;
    assert!(serde_json::from_value::<Supervision<u8>>(s.clone()).is_err(), "loaded {s}");
}

/// Kills the `StaleAttempt` guard of `handle_abandoned`: while attempt 1 is abandoned, a drop
/// reported for attempt 2 is refused with both numbers and changes nothing.
#[test]
fn s4_a_drop_reported_for_another_attempt_is_refused() {
    use persevere::{Supervision, SupervisionError, SupervisionPolicy, TaskDefaults};
    let policy = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&TaskDefaults::new()).unwrap();
    let mut task = Supervision::<u32>::new();
    task.handle_start(&policy, Instant::ZERO).unwrap();
    while task.poll_action().is_some() {}
    task.handle_timeout(&policy, Instant::from_nanos(30_000_000));
    while task.poll_action().is_some() {}
    let before = task;
    let refused = task.handle_abandoned(&policy, Instant::from_nanos(31_000_000), 2, None, &mut Fixed(0)).unwrap_err();
    assert_eq!((refused.error, refused.input), (SupervisionError::StaleAttempt { current: 1, got: 2 }, None));
    assert_eq!(task, before);
}

/// Kills attempt.rs's `Abandoning if last_failure.is_none()` in `validate`: a task whose
/// timed-out attempt waits to be dropped loads back, and is refused without the timeout
/// failure it keeps.
#[cfg(feature = "serde")]
#[test]
fn s4_an_abandoning_task_loads_only_with_its_timeout() {
    use persevere::{Supervision, SupervisionPolicy, TaskDefaults};
    let policy = SupervisionPolicy::restartable().attempt_timeout(ms(30)).build(&TaskDefaults::new()).unwrap();
    let mut task = Supervision::<u8>::new();
    task.handle_start(&policy, Instant::ZERO).unwrap();
    while task.poll_action().is_some() {}
    task.handle_timeout(&policy, Instant::from_nanos(30_000_000));
    while task.poll_action().is_some() {}
    let mut s = serde_json::to_value(task).unwrap();
    assert_eq!(serde_json::from_value::<Supervision<u8>>(s.clone()).map_err(|e| e.to_string()), Ok(task));
    s["engine"]["last_failure"] = serde_json::Value::Null;
    assert!(serde_json::from_value::<Supervision<u8>>(s.clone()).is_err(), "loaded {s}");
}

/// Kills `has_actions` → `true` / `false` and `last_failure` → `None` (supervision.rs): the
/// accessors say what waits and what failed.
#[test]
fn s6_a_task_says_whether_events_wait_and_what_failed_last() {
    use persevere::{Failure, FailureClass, LastFailure, Supervision, SupervisionPolicy, TaskDefaults};
    let policy = SupervisionPolicy::restartable().build(&TaskDefaults::new()).unwrap();
    let mut task = Supervision::<u8>::new();
    assert!(!task.has_actions());
    task.handle_start(&policy, Instant::ZERO).unwrap();
    assert!(task.has_actions());
    while task.poll_action().is_some() {}
    assert!(!task.has_actions());
    assert_eq!(task.last_failure(), None);
    task.handle_failure(&policy, Instant::from_nanos(5), 1, Failure::retryable(7), &mut Fixed(0)).unwrap();
    assert_eq!(task.last_failure(), Some(&LastFailure { class: FailureClass::Retryable, error: Some(7) }));
}

/// Kills the survivors in `Supervision::validate`'s check of an attempt's end that waits to be
/// drained: each end the transitions leave loads back (a periodic success, a retried failure,
/// a cancel while running, a completed task, a failed one), and an end that does not fit what followed it is refused (a
/// failure before a periodic wait with no streak; a fatal failure before a retry).
#[cfg(feature = "serde")]
#[test]
fn s6_an_undrained_attempt_end_loads_only_where_it_fits() {
    use persevere::{Failure, Supervision, SupervisionPolicy, TaskDefaults};
    use serde_json::{Value, json};
    let defaults = TaskDefaults::new();
    let started = |policy: &SupervisionPolicy| {
        let mut task = Supervision::<u8>::new();
        task.handle_start(policy, Instant::ZERO).unwrap();
        while task.poll_action().is_some() {}
        task
    };
    let loads = |task: Supervision<u8>| {
        assert!(task.has_actions());
        let value = serde_json::to_value(task).unwrap();
        assert_eq!(serde_json::from_value::<Supervision<u8>>(value.clone()).map_err(|e| e.to_string()), Ok(task));
        value
    };
    let refused = |mut value: Value, ended: Value| {
        value["ended"] = ended;
        assert!(serde_json::from_value::<Supervision<u8>>(value.clone()).is_err(), "loaded {value}");
    };

    let periodic = SupervisionPolicy::periodic(ms(10)).build(&defaults).unwrap();
    let mut task = started(&periodic);
    task.handle_success(&periodic, Instant::from_nanos(5), 1).unwrap();
    let waiting_after_success = loads(task);
    refused(waiting_after_success, json!({ "Failed": "Retryable" }));

    let restartable = SupervisionPolicy::restartable().build(&defaults).unwrap();
    let mut task = started(&restartable);
    task.handle_failure(&restartable, Instant::from_nanos(5), 1, Failure::retryable(1), &mut Fixed(0)).unwrap();
    let waiting_after_failure = loads(task);
    refused(waiting_after_failure, json!({ "Failed": "Fatal" }));

    let mut task = started(&restartable);
    task.handle_cancel(Instant::from_nanos(5)).unwrap();
    loads(task);

    let once = SupervisionPolicy::once().build(&defaults).unwrap();
    let mut task = started(&once);
    task.handle_success(&once, Instant::from_nanos(5), 1).unwrap();
    loads(task);
    let mut task = started(&once);
    task.handle_failure(&once, Instant::from_nanos(5), 1, Failure::retryable(1), &mut Fixed(0)).unwrap();
    loads(task);
}

// `.ci/mutants core/src/flow.rs` (166 mutants, 2026-12-03, 30 min): 82 caught, 2 timeouts, 55
// unviable, 27 missed. The tests below kill all 27, all in `Flow::validate` (a window's
// presence against the phase; each kind of action waiting to be drained against the flow) but
// `Flows::is_empty`'s two.

/// Kills the deleted arms `(Backoff, None)` and `(Tripped | Completed, Some(_))` of
/// `Flow::validate`: a flow that backs off loads only with its window, and a tripped or
/// completed one only without one.
#[cfg(feature = "serde")]
#[test]
fn f3_a_loaded_flow_has_a_window_exactly_when_it_backs_off() {
    use persevere::{Failure, Flow, FlowPolicy};
    use serde_json::Value;
    let ended = |policy: &FlowPolicy, failed: bool| {
        let mut flow = Flow::<u8>::every(Instant::ZERO, ms(10));
        flow.trigger(Instant::ZERO).unwrap();
        while flow.poll_action().is_some() {}
        if failed {
            flow.handle_failure(policy, Instant::from_nanos(5), Failure::retryable(1), &mut Fixed(0)).unwrap();
        } else {
            flow.handle_success(Instant::from_nanos(5)).unwrap();
        }
        while flow.poll_action().is_some() {}
        let value = serde_json::to_value(flow).unwrap();
        assert_eq!(serde_json::from_value::<Flow<u8>>(value.clone()).map_err(|e| e.to_string()), Ok(flow));
        value
    };
    let refused = |mut value: Value, next_eligible: Value| {
        value["next_eligible"] = next_eligible;
        assert!(serde_json::from_value::<Flow<u8>>(value.clone()).is_err(), "loaded {value}");
    };
    let backing_off = FlowPolicy::builder().backoff(Backoff::constant(ms(50)).build().unwrap()).build().unwrap();
    refused(ended(&backing_off, true), Value::Null);
    let tripping = FlowPolicy::builder().with_trip(1).build().unwrap();
    let tripped = ended(&tripping, true);
    let some = tripped["last_now"].clone();
    refused(tripped, some.clone());
    refused(ended(&tripping, false), some);
}

/// Kills the survivors in `Flow::validate`'s check of the action waiting to be drained: each
/// one a transition leaves loads back (a dispatch, a skipped tick, a trip, a reset of a flow
/// that backed off and of one that tripped), and one that does not fit the flow is refused (a
/// dispatch of another run, a skipped tick on an every-flow, a trip with another streak, a
/// reset that cleared no streak).
#[cfg(feature = "serde")]
#[test]
fn f1_a_loaded_flow_holds_only_an_action_its_transitions_leave() {
    use persevere::{Failure, Flow, FlowPolicy};
    use serde_json::{Value, json};
    let loads = |flow: Flow<u8>| {
        assert!({ flow }.poll_action().is_some(), "{flow:?}");
        let value = serde_json::to_value(flow).unwrap();
        assert_eq!(serde_json::from_value::<Flow<u8>>(value.clone()).map_err(|e| e.to_string()), Ok(flow));
        value
    };
    let refused = |value: &Value, edit: &dyn Fn(&mut Value)| {
        let mut value = value.clone();
        edit(&mut value);
        assert!(serde_json::from_value::<Flow<u8>>(value.clone()).is_err(), "loaded {value}");
    };
    let policy = FlowPolicy::builder().backoff(Backoff::constant(ms(50)).build().unwrap()).build().unwrap();
    let tripping = FlowPolicy::builder().with_trip(1).build().unwrap();
    let running = |flow: &mut Flow<u8>| {
        flow.trigger(Instant::ZERO).unwrap();
        while flow.poll_action().is_some() {}
    };

    let mut flow = Flow::<u8>::every(Instant::ZERO, ms(10));
    flow.trigger(Instant::ZERO).unwrap();
    let dispatch = loads(flow);
    refused(&dispatch, &|v| v["pending"]["Dispatch"]["run"] = json!(2));

    let mut cron = Flow::<u8>::cron(Instant::ZERO);
    running(&mut cron);
    cron.handle_tick(Instant::from_nanos(3), Instant::from_nanos(3)).unwrap();
    let skipped = loads(cron);
    let mut every = Flow::<u8>::every(Instant::ZERO, ms(10));
    running(&mut every);
    let every = serde_json::to_value(every).unwrap();
    refused(&every, &|v| v["pending"] = skipped["pending"].clone());

    let mut flow = Flow::<u8>::every(Instant::ZERO, ms(10));
    running(&mut flow);
    flow.handle_failure(&tripping, Instant::from_nanos(5), Failure::retryable(1), &mut Fixed(0)).unwrap();
    let trip = loads(flow);
    refused(&trip, &|v| v["pending"]["Tripped"]["streak"] = json!(2));
    while flow.poll_action().is_some() {}
    flow.reset_flow(Instant::from_nanos(6)).unwrap();
    loads(flow);

    let mut flow = Flow::<u8>::every(Instant::ZERO, ms(10));
    running(&mut flow);
    flow.handle_failure(&policy, Instant::from_nanos(5), Failure::retryable(1), &mut Fixed(0)).unwrap();
    while flow.poll_action().is_some() {}
    flow.reset_flow(Instant::from_nanos(6)).unwrap();
    let reset = loads(flow);
    refused(&reset, &|v| v["pending"]["Reset"]["streak"] = json!(0));
}

/// Kills `Flows::is_empty` → `true` / `false`.
#[cfg(feature = "alloc")]
#[test]
fn f9_a_registry_says_whether_it_holds_a_flow() {
    use persevere::{Flow, Flows};
    let mut flows: Flows<u8, u8> = Flows::new();
    assert!(flows.is_empty());
    flows.insert(1, Flow::every(Instant::ZERO, ms(10))).unwrap();
    assert!(!flows.is_empty());
}

/// Attempts 1 ms apart, at most `max_attempts`.
fn retry_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::builder(Backoff::constant(ms(1)).build().unwrap()).max_attempts(max_attempts).build().unwrap()
}

/// A retry whose attempt 1 started at the epoch, its start drained.
#[cfg(feature = "serde")]
fn started(policy: &RetryPolicy) -> persevere::Retry<u8> {
    let mut retry = persevere::Retry::new();
    retry.handle_start(policy, Instant::ZERO).unwrap();
    while retry.poll_action().is_some() {}
    retry
}

// ---- breaker.rs (`.ci/mutants core/src/breaker.rs`) -------------------------------------------

/// A breaker policy open for 1 s, with `rules`.
fn breaker_policy(rules: impl FnOnce(BreakerPolicyBuilder) -> BreakerPolicyBuilder) -> BreakerPolicy {
    rules(BreakerPolicy::builder(Backoff::constant(ms(1_000)).build().unwrap())).build().unwrap()
}

/// One call on `b` at `at_ms` milliseconds, taking `took_ms`, that ends with `outcome`.
fn breaker_call(b: &mut Breaker, p: &BreakerPolicy, at_ms: u64, took_ms: u64, outcome: CallOutcome) {
    let now = Instant::from_millis(at_ms);
    let permit = b.try_acquire(p, now, &mut Fixed(0)).unwrap();
    b.record_with_duration(p, now, permit, outcome, ms(took_ms), &mut Fixed(0)).unwrap();
}

/// Kills `Permit::id`, `generation` and `breaker` → 0 / 1, `is_probe` → `true` and its `&` →
/// `|`: a permit names its breaker, its state's generation and its own id, and only a
/// half-open permit is a probe.
#[test]
fn k5_a_permit_names_its_breaker_its_generation_and_itself() {
    let p = breaker_policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 7);
    assert_eq!(b.id(), 7);
    let closed: Vec<Permit> = (0..3).map(|_| b.try_acquire(&p, Instant::ZERO, &mut Fixed(0)).unwrap()).collect();
    assert_eq!(closed.iter().map(Permit::id).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(closed.iter().all(|permit| permit.breaker() == 7 && permit.generation() == 0 && !permit.is_probe()));
    b.record(&p, Instant::ZERO, closed[0], CallOutcome::Failure, &mut Fixed(0)).unwrap();
    // Open (generation 1), then half-open at the end of the open period (generation 2).
    let probe = b.try_acquire(&p, Instant::from_secs(1), &mut Fixed(0)).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
    assert_eq!((probe.breaker(), probe.generation(), b.generation()), (7, 2, 2));
    assert!(probe.is_probe());
    assert!(closed.iter().all(|permit| permit.id() != probe.id()));
}

/// Kills `BreakerPolicy::successes_to_close` → 1: it is `half_open_permits` by default, and
/// what was set otherwise.
#[test]
fn k4_a_policy_says_how_many_successful_probes_close_it() {
    assert_eq!(breaker_policy(|b| b.consecutive_failures(1).half_open_permits(3)).successes_to_close(), 3);
    let p = breaker_policy(|b| b.consecutive_failures(1).half_open_permits(3).successes_to_close(2));
    assert_eq!(p.successes_to_close(), 2);
}

/// Kills `rate * PPM + 0.5` → `- 0.5` in `rate_ppm`: a rate is rounded to the nearest part
/// per million, so 1 ppm is a rate (not rounded down to zero), and 0.4 ppm is none.
#[test]
fn k2_a_rate_of_one_part_per_million_is_the_smallest_there_is() {
    let builder = |rate| BreakerPolicy::builder(Backoff::constant(ms(1_000)).build().unwrap()).failure_rate(rate);
    assert!(builder(1e-6).build().unwrap().counts_every_call());
    assert!(matches!(builder(0.4e-6).build(), Err(PolicyError::Zero { setting: "failure_rate", .. })));
}

/// Kills `NEVER = PPM + 1` → `PPM - 1`: a rate one part per million below 1 is a rate rule
/// like any other (the window counts every call, and the rate trips the breaker).
#[test]
fn k2_a_failure_rate_one_ppm_below_one_trips() {
    let p = breaker_policy(|b| b.failure_rate(0.999_999).count_window(2));
    assert!(p.counts_every_call());
    let mut b = Breaker::new(&p, 1);
    breaker_call(&mut b, &p, 0, 0, CallOutcome::Failure);
    assert_eq!(b.window_counts().map(|c| c.calls), Some(1));
    breaker_call(&mut b, &p, 0, 0, CallOutcome::Failure);
    assert_eq!(b.status(), BreakerStatus::Open { until: Instant::from_secs(1) }, "2 failures of 2");
}

/// Kills `MAX_BUCKET_WIDTH_NS = (1 << 59) - 1` → `+ 1` and → `/ 1`: the widest bucket is
/// 2^59 − 1 ns; one more is refused.
#[test]
fn k2_a_time_window_bucket_is_at_most_two_to_the_59_minus_one_ns_wide() {
    let builder = |span_ns: u64| {
        BreakerPolicy::builder(Backoff::constant(ms(1_000)).build().unwrap())
            .failure_rate(0.5)
            .time_window(Duration::from_nanos(span_ns), 1)
    };
    assert!(builder((1 << 59) - 1).build().is_ok());
    let refused = builder(1 << 59).build();
    assert!(matches!(refused, Err(PolicyError::LimitTooLarge { max: 0x07FF_FFFF_FFFF_FFFF, .. })), "{refused:?}");
}

/// Kills `slow_ns != u64::MAX` → `==` in `From<BreakerPolicy> for BreakerPolicyBuilder`: a
/// policy gives back the builder it was built from, field for field: no slow-call threshold
/// where none was set, and a threshold set without a slow-call rate.
#[test]
fn k2_a_policy_gives_back_the_builder_it_was_built_from() {
    let explicit = BreakerPolicy::builder(Backoff::constant(ms(1_000)).build().unwrap())
        .failure_rate(0.5)
        .minimum_calls(100)
        .successes_to_close(1);
    assert_eq!(explicit.slow_call_threshold, None);
    assert_eq!(BreakerPolicyBuilder::from(explicit.build().unwrap()), explicit);
    let threshold_alone = BreakerPolicyBuilder { slow_call_threshold: Some(ms(100)), ..explicit };
    assert_eq!(BreakerPolicyBuilder::from(threshold_alone.build().unwrap()), threshold_alone);
}

/// Kills `failure_ppm * calls` → `failure_ppm + calls` in `Window::trip_reason`: a breaker
/// tripped by its slow calls, with a failure in its window below the failure rate, says it
/// opened on the slow-call rate.
#[test]
fn k2_a_trip_on_the_slow_call_rate_is_told_as_one() {
    use persevere::BreakerReason;
    let p = breaker_policy(|b| b.failure_rate(0.5).slow_call_rate(0.5, ms(100)).count_window(4));
    let mut b = Breaker::new(&p, 1);
    for (took, outcome) in [(0, CallOutcome::Failure), (100, CallOutcome::Success), (0, CallOutcome::Success)] {
        breaker_call(&mut b, &p, 0, took, outcome);
    }
    assert_eq!(b.status(), BreakerStatus::Closed);
    breaker_call(&mut b, &p, 0, 100, CallOutcome::Success);
    let event = b.poll_event().unwrap();
    assert_eq!(
        (event.to, event.reason),
        (BreakerStatus::Open { until: Instant::from_secs(1) }, BreakerReason::SlowCallRate)
    );
}

/// Whether a breaker's JSON state loads; the refusal's message if not.
#[cfg(feature = "serde")]
fn breaker_loads(state: &serde_json::Value) -> Result<Breaker, String> {
    serde_json::from_value(state.clone()).map_err(|e| e.to_string())
}

/// `state` with the values at JSON pointers `edits` replaced.
#[cfg(feature = "serde")]
fn edited(state: &serde_json::Value, edits: &[(&str, serde_json::Value)]) -> serde_json::Value {
    let mut state = state.clone();
    for (pointer, value) in edits {
        *state.pointer_mut(pointer).unwrap_or_else(|| panic!("no {pointer} in the breaker's JSON")) = value.clone();
    }
    state
}

/// Kills the survivors in `Window::validate`'s check of a loaded count window (any state that loads
/// is safe to drive, persevere's crate docs, *Plain data*): the windows `push` makes load back (one
/// not yet full, with a failed and a slow call; a full one that wrapped), and each bound is edited
/// to just inside and just outside: a window of 512 calls loads, one of 513 does not; a head at the
/// length, more calls than the length, a head that does not continue a window that is not full, and
/// a call in a slot never written are refused.
#[cfg(feature = "serde")]
#[test]
fn k2_a_loaded_count_window_loads_only_as_push_could_have_made_it() {
    use serde_json::json;
    let p = breaker_policy(|b| b.failure_rate(0.5).slow_call_rate(0.5, ms(100)).count_window(4));
    let mut b = Breaker::new(&p, 1);
    // A failed call, a fast one and a slow one: slots 0 (failed), 1 and 2 (slow) of 4, two
    // bits each.
    for (took, outcome) in [(0, CallOutcome::Failure), (0, CallOutcome::Success), (100, CallOutcome::Success)] {
        breaker_call(&mut b, &p, 0, took, outcome);
    }
    let partial = serde_json::to_value(b).unwrap();
    assert_eq!(breaker_loads(&partial), Ok(b));
    assert_eq!(partial["phase"]["Closed"]["key"], json!(4 << 5), "the window key's encoding changed");
    assert_eq!(partial["phase"]["Closed"]["ring"]["Calls"]["bits"][0], json!(1 | (2 << 4)));
    // Two more calls: full, and the head wrapped to slot 1.
    breaker_call(&mut b, &p, 0, 0, CallOutcome::Success);
    breaker_call(&mut b, &p, 0, 0, CallOutcome::Failure);
    assert_eq!(b.status(), BreakerStatus::Closed);
    let full = serde_json::to_value(b).unwrap();
    assert_eq!(full["phase"]["Closed"]["ring"]["Calls"]["head"], json!(1));
    assert_eq!(breaker_loads(&full), Ok(b));

    const LEN: &str = "/phase/Closed/ring/Calls/len";
    const HEAD: &str = "/phase/Closed/ring/Calls/head";
    const KEY: &str = "/phase/Closed/key";
    let longest = edited(&partial, &[(LEN, json!(512)), (KEY, json!(512 << 5))]);
    assert!(breaker_loads(&longest).is_ok(), "a window of 512 calls");

    let refused = [
        ("a window of 513 calls", edited(&partial, &[(LEN, json!(513)), (KEY, json!(513 << 5))]), "out of range"),
        ("a head at the length", edited(&full, &[(HEAD, json!(4))]), "out of range"),
        ("more calls than the length", edited(&full, &[("/phase/Closed/calls", json!(5))]), "out of range"),
        ("a head behind the calls", edited(&partial, &[(HEAD, json!(2))]), "does not continue"),
        (
            "a failed call in slot 3 of 3 calls",
            edited(
                &partial,
                &[
                    ("/phase/Closed/ring/Calls/bits/0", json!(1 | (2 << 4) | (1 << 6))),
                    ("/phase/Closed/failures", json!(2)),
                ],
            ),
            "never wrote",
        ),
    ];
    for (what, state, why) in refused {
        let err = breaker_loads(&state).expect_err(what);
        assert!(err.contains(why), "{what}: {err}");
    }
}

/// Kills the survivors in `Window::validate`'s check of a loaded time window, and `window_key`'s
/// `width << 5` → `>>` (any state that loads is safe to drive): a window `push` makes (with a
/// failed and a slow call) loads back, and each bound is edited to just inside and just outside: a
/// bucket width of 2^59 − 1 ns and 16 buckets load; a zero width, a width of 2^59 ns and 17 buckets
/// do not, nor a width its key does not describe, a call in a bucket past the count, or a bucket
/// with more failed or slow calls than calls.
#[cfg(feature = "serde")]
#[test]
fn k2_a_loaded_time_window_loads_only_as_push_could_have_made_it() {
    use serde_json::json;
    let p = breaker_policy(|b| {
        b.failure_rate(0.5).slow_call_rate(0.5, ms(100)).time_window(Duration::from_secs(10), 10).minimum_calls(5)
    });
    let mut b = Breaker::new(&p, 1);
    // All in the first bucket of 1 s, which starts at zero.
    for (took, outcome) in [(0, CallOutcome::Failure), (100, CallOutcome::Success), (0, CallOutcome::Success)] {
        breaker_call(&mut b, &p, 500, took, outcome);
    }
    let state = serde_json::to_value(b).unwrap();
    assert_eq!(breaker_loads(&state), Ok(b));
    assert_eq!(state["phase"]["Closed"]["ring"]["Time"]["buckets"][0], json!({ "calls": 3, "failures": 1, "slow": 1 }));
    // The key of a time window: its bucket width, shifted past the bucket count.
    let key = |width: u64, buckets: u64| json!((width << 5) | buckets);
    assert_eq!(state["phase"]["Closed"]["key"], key(1_000_000_000, 10), "the window key's encoding changed");

    const WIDTH: &str = "/phase/Closed/ring/Time/width";
    const COUNT: &str = "/phase/Closed/ring/Time/count";
    const KEY: &str = "/phase/Closed/key";
    const WIDEST: u64 = (1 << 59) - 1;
    let loads = [
        ("a bucket 2^59 - 1 ns wide", edited(&state, &[(WIDTH, json!(WIDEST)), (KEY, key(WIDEST, 10))])),
        ("16 buckets", edited(&state, &[(COUNT, json!(16)), (KEY, key(1_000_000_000, 16))])),
    ];
    for (what, state) in loads {
        assert!(breaker_loads(&state).is_ok(), "{what}: {:?}", breaker_loads(&state));
    }

    let bucket = |i: usize, field: &str| format!("/phase/Closed/ring/Time/buckets/{i}/{field}");
    let refused = [
        ("a zero width", edited(&state, &[(WIDTH, json!(0)), (KEY, key(0, 10))]), "out of range"),
        (
            "a bucket 2^59 ns wide",
            edited(&state, &[(WIDTH, json!(WIDEST + 1)), (KEY, key(WIDEST + 1, 10))]),
            "out of range",
        ),
        ("17 buckets", edited(&state, &[(COUNT, json!(17)), (KEY, key(1_000_000_000, 17))]), "out of range"),
        ("a width 1 ns wider than its key", edited(&state, &[(WIDTH, json!(1_000_000_001))]), "key"),
        (
            "a call in bucket 12 of 10",
            edited(&state, &[(&bucket(12, "calls"), json!(1)), ("/phase/Closed/calls", json!(4))]),
            "cannot have",
        ),
        (
            "more failed calls than calls",
            edited(&state, &[(&bucket(0, "failures"), json!(4)), ("/phase/Closed/failures", json!(4))]),
            "cannot have",
        ),
        (
            "more slow calls than calls",
            edited(&state, &[(&bucket(0, "slow"), json!(4)), ("/phase/Closed/slow", json!(4))]),
            "cannot have",
        ),
    ];
    for (what, state, why) in refused {
        let err = breaker_loads(&state).expect_err(what);
        assert!(err.contains(why), "{what}: {err}");
    }
}

/// Kills `busy & (1 << i)` → `|` in `Probes::latest`: under the rates rule, a half-open
/// breaker whose probes are all taken says to come back when its last held lease ends, not
/// at the deadline a recorded probe's free slot still holds.
#[test]
fn k4_under_the_rates_rule_a_full_half_open_breaker_waits_for_its_last_held_lease() {
    let p = breaker_policy(|b| b.consecutive_failures(1).failure_rate(0.5).half_open_permits(2).half_open_by_rates());
    let mut b = Breaker::new(&p, 1);
    breaker_call(&mut b, &p, 0, 0, CallOutcome::Failure);
    let first = b.try_acquire(&p, Instant::from_secs(1), &mut Fixed(0)).unwrap();
    let second = b.try_acquire(&p, Instant::from_secs(2), &mut Fixed(0)).unwrap();
    // The second probe answers; its slot is free, with its lease's deadline (12 s) left in it.
    b.record(&p, Instant::from_secs(2), second, CallOutcome::Success, &mut Fixed(0)).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
    let rejected = b.try_acquire(&p, Instant::from_secs(3), &mut Fixed(0)).unwrap_err();
    assert_eq!(rejected.retry_after, Some(Duration::from_secs(8)), "the first probe's lease ends at 11 s");
    assert!(first.is_probe());
}

/// An open breaker not yet due refuses a call, changes nothing (not even its latest time) and
/// says how long is left; past its period's end it admits a probe (kills `now < until` →
/// `now > until` in `try_acquire`'s fast refusal). Its mutant `false` is equivalent: the slow
/// path refuses exactly alike, as this test shows.
#[test]
fn k1_an_open_breaker_refuses_a_call_before_its_period_ends_and_changes_nothing() {
    let p = breaker_policy(|b| b.consecutive_failures(1));
    let mut b = Breaker::new(&p, 1);
    let permit = b.try_acquire(&p, Instant::ZERO, &mut Fixed(0)).unwrap();
    b.record(&p, Instant::ZERO, permit, CallOutcome::Failure, &mut Fixed(0)).unwrap();
    let BreakerStatus::Open { until } = b.status() else { panic!("{:?}", b.status()) };
    let before = b;
    let rejected = b.try_acquire(&p, Instant::from_millis(400), &mut Fixed(0)).unwrap_err();
    assert_eq!(rejected.retry_after, Some(until.saturating_duration_since(Instant::from_millis(400))));
    assert_eq!(b, before);
    // Past the end of the period (not only at it), the next call is a probe.
    let late = until.saturating_add(ms(1));
    assert!(b.try_acquire(&p, late, &mut Fixed(0)).unwrap().is_probe());
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
}

/// A zero open period with a stale clock: the breaker's own time is already at the period's
/// end, so the next call is a probe whatever `now` says (kills `last_now < until` → `<=` / `==`
/// in `try_acquire`'s fast refusal; `>` is equivalent, as `last_now` never passes `until` while
/// open). Permit ids run on across a probe and a close, and a disabled breaker's permit is
/// acquired at the `now` it was asked at (kills `& !PROBE_BIT` → `|` / `^` / `& PROBE_BIT` in
/// `acquire_slow` and `id & PROBE_BIT != 0` → `==` / `|` / `^` in `try_acquire`; `next_id |
/// PROBE_BIT` → `^` is equivalent, as `next_id` never holds that bit).
#[test]
fn k4_k5_a_zero_open_period_probes_at_once_and_permit_ids_run_on() {
    let p = BreakerPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap())
        .consecutive_failures(1)
        .build()
        .unwrap();
    let mut b = Breaker::new(&p, 1);
    let first = b.try_acquire(&p, Instant::from_secs(1), &mut Fixed(0)).unwrap();
    b.record(&p, Instant::from_secs(1), first, CallOutcome::Failure, &mut Fixed(0)).unwrap();
    assert_eq!(b.status(), BreakerStatus::Open { until: Instant::from_secs(1) });
    let probe = b.try_acquire(&p, Instant::from_millis(500), &mut Fixed(0)).unwrap();
    assert!(probe.is_probe());
    assert_eq!((probe.id() & !(1 << 31), probe.acquired_at()), (1, Instant::from_secs(1)));
    b.record(&p, Instant::from_secs(1), probe, CallOutcome::Success, &mut Fixed(0)).unwrap();
    assert_eq!(b.status(), BreakerStatus::Closed);
    let next = b.try_acquire(&p, Instant::from_secs(1), &mut Fixed(0)).unwrap();
    assert_eq!((next.id(), next.is_probe()), (2, false));
    b.handle_disable(Instant::from_secs(2));
    let disabled = b.try_acquire(&p, Instant::from_secs(1), &mut Fixed(0)).unwrap();
    assert_eq!((disabled.id(), disabled.acquired_at()), (3, Instant::from_secs(1)));
}

/// A breaker that half-opens under the rates rule with three permits.
fn rates_rule_policy() -> BreakerPolicy {
    breaker_policy(|b| b.consecutive_failures(1).failure_rate(0.5).half_open_permits(3).half_open_by_rates())
}

/// A breaker under [`rates_rule_policy`], tripped at 0 s, with probes acquired at 1, 2 and 3 s
/// and probe `answered` recorded as a success at 3 s: half-open with two probes out.
fn three_probes_one_answered(answered: usize) -> Breaker {
    let p = rates_rule_policy();
    let mut b = Breaker::new(&p, 1);
    breaker_call(&mut b, &p, 0, 0, CallOutcome::Failure);
    let probes: Vec<Permit> =
        (1..=3).map(|s| b.try_acquire(&p, Instant::from_secs(s), &mut Fixed(0)).unwrap()).collect();
    b.record(&p, Instant::from_secs(3), probes[answered], CallOutcome::Success, &mut Fixed(0)).unwrap();
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 2 });
    b
}

/// Kills the survivors in `Breaker::validate`'s check of a loaded half-open state (any state that
/// loads is safe to drive): a real half-open state under the rates rule, with a probe answered and
/// two held in slots 0 and 2, loads back; a permit counter with the probe bit, a held lease whose
/// id lacks it (in a slot past the first), two leases with one id, and more slow probes than
/// answered are refused.
#[cfg(feature = "serde")]
#[test]
fn k4_a_loaded_half_open_breaker_loads_only_as_its_probes_could_have_made_it() {
    use serde_json::json;
    let b = three_probes_one_answered(1);
    let state = serde_json::to_value(b).unwrap();
    assert_eq!(breaker_loads(&state), Ok(b), "a real half-open state loads back");
    const PROBES: &str = "/phase/HalfOpen";
    let id = |i: usize| state["phase"]["HalfOpen"]["ids"][i].as_u64().unwrap();
    let refused = [
        (
            "a counter with the probe bit",
            edited(&state, &[("/next_id", json!(state["next_id"].as_u64().unwrap() | (1 << 31)))]),
        ),
        (
            "slot 2's id without the probe bit",
            edited(&state, &[(&format!("{PROBES}/ids/2"), json!(id(2) & !(1 << 31)))]),
        ),
        ("slots 0 and 2 with one id", edited(&state, &[(&format!("{PROBES}/ids/2"), json!(id(0)))])),
        ("more slow probes than answered", edited(&state, &[(&format!("{PROBES}/slow"), json!(2))])),
    ];
    for (what, state) in refused {
        assert!(breaker_loads(&state).is_err(), "{what} loaded");
    }
}

/// Under the rates rule an expired lease frees its slot and counts once (kills `!(1 << slot)`
/// → `>>` in `expire`, under which a lease in slot 1 stays held and is counted again).
#[test]
fn k4_under_the_rates_rule_an_expired_lease_in_a_later_slot_is_freed() {
    let p = rates_rule_policy();
    let mut b = three_probes_one_answered(0);
    // The second probe's lease (slot 1) ends first: one success, one failure, one still out.
    let second = b.poll_timeout().unwrap();
    b.handle_timeout(&p, second, &mut Fixed(0));
    assert_eq!(b.status(), BreakerStatus::HalfOpen { permits: 1 });
    assert_eq!(b.poll_timeout(), Some(second.saturating_add(Duration::from_secs(1))), "the third lease");
}
