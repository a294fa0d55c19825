//! Any state that loads is safe to drive (persevere's crate docs, *Plain data*): for every machine,
//! a *state* decoded from arbitrary bytes (as it could be loaded from storage someone edited) and
//! driven under an arbitrary policy — usually not the one it was made under — by arbitrary
//! operations.
//!
//! The bytes are the state's serde encoding (postcard), so the fuzzer edits exactly what a
//! store would hold. A state the machine refuses to load is the end of the run. A state it
//! accepts must then be driven without a panic (overflow checks are on in the fuzz build),
//! and after every operation:
//!
//! - `state-load`: the state re-encodes and loads back equal to itself (what validation accepts
//!   is closed under the transitions: no input leads from a loadable state to one that is
//!   refused, and validation refuses nothing the transitions make);
//! - `G12`: a refused input leaves the state exactly as it was;
//! - `drain`: the outputs of one input are few (at most four), then `None`;
//! - the machine's own bounds where a wrong answer would show: a breaker admits no call while
//!   open or isolated (G8); a token bucket never holds more than its policy's capacity and a
//!   ratio budget never grants past its allowance (G9); a backoff delay stays within the
//!   schedule's floor and cap (B2).

use core::fmt::Debug;

use arbitrary::{Arbitrary, Unstructured};
use persevere::{
    Backoff, BackoffState, Breaker, BreakerPolicy, BreakerStatus, CallOutcome, ConcurrencyBudget,
    ConcurrencyBudgetPolicy, Deliveries, Delivery, DeliveryPolicy, DeliveryStatus, Durability, Failure, FailurePolicy,
    Flow, FlowPolicy, Flows, FreeReturn, Instant, Interruption, Permit, RatioBudget, RatioBudgetPolicy, Restart, Retry,
    RetryClass, Supervision, SupervisionPolicyBuilder, TaskDefaults, TokenBucket, TokenBucketPolicy,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::backoff_model::BackoffIn;
use super::retry_model::{KindIn, RetryIn};
use super::{At, Clock, Count, Ctx, Fraction, MAX_OPS, Span, ensure, rng};

/// The longest encoded state read from the input.
const MAX_STATE_BYTES: usize = 1024;

/// Splits `data` into a state (two little-endian bytes of length, then the state's postcard
/// encoding), a policy input and operations. `None` when the machine refuses the state or the
/// input runs out first.
pub(super) fn decode<'a, S: DeserializeOwned, P: Arbitrary<'a>, O: Arbitrary<'a>>(
    data: &'a [u8],
) -> Option<(S, P, Vec<O>)> {
    let mut u = Unstructured::new(data);
    let len = u.bytes(2).ok()?;
    let len = usize::from(u16::from_le_bytes([len[0], len[1]])) % MAX_STATE_BYTES;
    let bytes = u.bytes(len.min(u.len())).ok()?;
    let state = postcard::from_bytes::<S>(bytes).ok()?;
    let policy = P::arbitrary(&mut u).ok()?;
    let mut ops = Vec::new();
    while ops.len() < MAX_OPS && !u.is_empty() {
        match O::arbitrary(&mut u) {
            Ok(op) => ops.push(op),
            Err(_) => break,
        }
    }
    Some((state, policy, ops))
}

/// `state-load`: the state encodes, and loads back equal to itself.
pub(super) fn reloads<S: Serialize + DeserializeOwned + PartialEq + Debug>(ctx: Ctx<'_>, state: &S) {
    let bytes = postcard::to_allocvec(state).expect("every state encodes");
    match postcard::from_bytes::<S>(&bytes) {
        Ok(back) => ensure!(ctx, back == *state, "state-load", "reloaded as {back:?}, not {state:?}"),
        Err(error) => {
            // postcard's error does not carry the validation's reason; JSON's does.
            let why = serde_json::to_string(state)
                .map_err(|e| e.to_string())
                .and_then(|json| serde_json::from_str::<S>(&json).map(drop).map_err(|e| e.to_string()));
            ensure!(
                ctx,
                false,
                "state-load",
                "a state the machine holds is refused when it loads: {error} ({why:?})\n  state: {state:?}"
            )
        }
    }
}

/// `G12`: a refused input changed nothing.
pub(super) fn unchanged<S: PartialEq + Debug, T: Debug>(ctx: Ctx<'_>, before: &S, after: &S, refused: &T) {
    ensure!(
        ctx,
        before == after,
        "G12",
        "refused with {refused:?} but the state changed:\n  before {before:?}\n  after  {after:?}"
    );
}

/// `drain`: drains `poll` and checks one input made at most four outputs.
fn drain<T: Debug>(ctx: Ctx<'_>, mut poll: impl FnMut() -> Option<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(action) = poll() {
        out.push(action);
        ensure!(ctx, out.len() <= 4, "drain", "more than four outputs from one input: {out:?}");
    }
    out
}

/// An attempt number relative to the machine's current one.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum Nth {
    Current,
    Current2,
    Previous,
    Next,
    Raw(u64),
}

impl Nth {
    fn get(self, current: u64) -> u64 {
        match self {
            Nth::Current | Nth::Current2 => current,
            Nth::Previous => current.wrapping_sub(1),
            Nth::Next => current.wrapping_add(1),
            Nth::Raw(n) => n,
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum RetryOp {
    Start(At),
    Success(At, Nth),
    Failure(At, Nth, KindIn, u8),
    Timeout(At),
    Cancel(At),
    Reject(At),
}

/// A loaded [`Retry`] driven under an arbitrary [`persevere::RetryPolicy`].
pub fn retry(data: &[u8]) {
    let Some((mut machine, policy, ops)) = decode::<Retry<u8>, RetryIn, RetryOp>(data) else { return };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(1);
    let mut clock = Clock { now: machine.now() };
    reloads(Ctx { step: 0, op: &"(loaded)" }, &machine);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = machine;
        let now = |clock: &mut Clock, at: At, due| clock.at(at, due);
        let due = machine.poll_timeout();
        let refused = match *op {
            RetryOp::Start(at) => {
                machine.handle_start(&policy, now(&mut clock, at, due)).err().map(|e| format!("{e:?}"))
            }
            RetryOp::Success(at, n) => {
                let attempt = n.get(machine.attempt());
                machine.handle_success(now(&mut clock, at, due), attempt).err().map(|e| format!("{e:?}"))
            }
            RetryOp::Failure(at, n, kind, error) => {
                let now = now(&mut clock, at, due);
                let attempt = n.get(machine.attempt());
                let failure = Failure::new(kind.get(now), error);
                machine.handle_failure(&policy, now, attempt, failure, &mut rng).err().map(|e| format!("{e:?}"))
            }
            RetryOp::Timeout(at) => {
                machine.handle_timeout(&policy, now(&mut clock, at, due), &mut rng);
                None
            }
            RetryOp::Cancel(at) => machine.handle_cancel(now(&mut clock, at, due)).err().map(|e| format!("{e:?}")),
            RetryOp::Reject(at) => machine.handle_rejected(now(&mut clock, at, due)).err().map(|e| format!("{e:?}")),
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &machine, &refused);
        }
        let _ = machine.poll_timeout();
        let _ = (machine.status(), machine.stats(), machine.streak());
        if step % 2 == 0 {
            drain(ctx, || machine.poll_action());
        }
        reloads(ctx, &machine);
    }
}

/// A supervision policy, as the fuzzer draws it.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct SupervisionIn {
    restart: u8,
    interval: Span,
    backoff: Option<BackoffIn>,
    attempt_timeout: Option<Span>,
    max_retries: Option<Count>,
    min_spacing: Option<Span>,
    max_hint: Option<Span>,
    restart_after_hint: bool,
}

impl SupervisionIn {
    fn build(&self) -> Option<persevere::SupervisionPolicy> {
        let mut builder = match self.restart % 4 {
            0 => SupervisionPolicyBuilder::once(),
            1 => SupervisionPolicyBuilder::restartable(),
            2 => SupervisionPolicyBuilder::periodic(self.interval.get()),
            _ => SupervisionPolicyBuilder::from_defaults().restart(Restart::Restartable),
        };
        if let Some(backoff) = self.backoff {
            builder = builder.backoff(backoff.build()?);
        }
        if let Some(timeout) = self.attempt_timeout {
            builder = builder.attempt_timeout(timeout.get());
        }
        if let Some(n) = self.max_retries {
            builder = builder.max_retries(n.get());
        }
        if let Some(spacing) = self.min_spacing {
            builder = builder.min_spacing(spacing.get());
        }
        if let Some(max_hint) = self.max_hint {
            builder = builder.max_hint(max_hint.get());
        }
        builder.restart_after_hint(self.restart_after_hint).build(&TaskDefaults::new()).ok()
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum SupervisionOp {
    Start(At),
    Success(At, Nth),
    Failure(At, Nth, KindIn, u8),
    Abandoned(At, Nth, Option<u8>),
    Timeout(At),
    Cancel(At),
}

/// A loaded [`Supervision`] driven under an arbitrary [`persevere::SupervisionPolicy`].
pub fn supervision(data: &[u8]) {
    let Some((mut machine, policy, ops)) = decode::<Supervision<u8>, SupervisionIn, SupervisionOp>(data) else {
        return;
    };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(2);
    let mut clock = Clock { now: machine.now() };
    reloads(Ctx { step: 0, op: &"(loaded)" }, &machine);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = machine;
        let due = machine.poll_timeout();
        let current = machine.attempt();
        let refused = match *op {
            SupervisionOp::Start(at) => {
                machine.handle_start(&policy, clock.at(at, due)).err().map(|e| format!("{e:?}"))
            }
            SupervisionOp::Success(at, n) => {
                machine.handle_success(&policy, clock.at(at, due), n.get(current)).err().map(|e| format!("{e:?}"))
            }
            SupervisionOp::Failure(at, n, kind, error) => {
                let now = clock.at(at, due);
                let failure = Failure::new(kind.get(now), error);
                machine.handle_failure(&policy, now, n.get(current), failure, &mut rng).err().map(|e| format!("{e:?}"))
            }
            SupervisionOp::Abandoned(at, n, panic) => machine
                .handle_abandoned(&policy, clock.at(at, due), n.get(current), panic, &mut rng)
                .err()
                .map(|e| format!("{e:?}")),
            SupervisionOp::Timeout(at) => {
                machine.handle_timeout(&policy, clock.at(at, due));
                None
            }
            SupervisionOp::Cancel(at) => machine.handle_cancel(clock.at(at, due)).err().map(|e| format!("{e:?}")),
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &machine, &refused);
        }
        let _ = (machine.poll_timeout(), machine.status(), machine.streak());
        if step % 2 == 0 {
            drain(ctx, || machine.poll_action());
        }
        reloads(ctx, &machine);
    }
}

/// A flow policy, as the fuzzer draws it.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct FlowIn {
    backoff: BackoffIn,
    trip_after: Option<Count>,
    max_hint: Option<Span>,
    restart_after_hint: bool,
}

impl FlowIn {
    fn build(&self) -> Option<FlowPolicy> {
        let mut builder =
            FlowPolicy::builder().backoff(self.backoff.build()?).restart_after_hint(self.restart_after_hint);
        builder.trip_after = self.trip_after.map(Count::get);
        if let Some(max_hint) = self.max_hint {
            builder = builder.max_hint(max_hint.get());
        }
        builder.build().ok()
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum FlowOp {
    Timeout(At),
    Tick(At, At),
    Trigger(At),
    Success(At),
    Failure(At, KindIn, u8),
    Cancel(At),
    Reset(At),
}

/// A loaded [`Flow`] driven under an arbitrary [`FlowPolicy`].
pub fn flow(data: &[u8]) {
    let Some((mut flow, policy, ops)) = decode::<Flow<u8>, FlowIn, FlowOp>(data) else { return };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(3);
    let mut clock = Clock { now: flow.now() };
    reloads(Ctx { step: 0, op: &"(loaded)" }, &flow);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = flow;
        let due = flow.poll_timeout();
        let refused = match *op {
            FlowOp::Timeout(at) => {
                flow.handle_timeout(clock.at(at, due));
                None
            }
            FlowOp::Tick(at, tick) => {
                let now = clock.at(at, due);
                let tick = Clock { now }.at(tick, None);
                flow.handle_tick(now, tick).err().map(|e| format!("{e:?}"))
            }
            FlowOp::Trigger(at) => flow.trigger(clock.at(at, due)).err().map(|e| format!("{e:?}")),
            FlowOp::Success(at) => flow.handle_success(clock.at(at, due)).err().map(|e| format!("{e:?}")),
            FlowOp::Failure(at, kind, error) => {
                let now = clock.at(at, due);
                flow.handle_failure(&policy, now, Failure::new(kind.get(now), error), &mut rng)
                    .err()
                    .map(|e| format!("{e:?}"))
            }
            FlowOp::Cancel(at) => flow.handle_cancel(clock.at(at, due)).err().map(|e| format!("{e:?}")),
            FlowOp::Reset(at) => flow.reset_flow(clock.at(at, due)).err().map(|e| format!("{e:?}")),
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &flow, &refused);
        }
        let _ = (flow.poll_timeout(), flow.info());
        if step % 2 == 0 {
            drain(ctx, || flow.poll_action());
        }
        reloads(ctx, &flow);
    }
}

/// A breaker policy, as the fuzzer draws it.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct BreakerIn {
    open: BackoffIn,
    consecutive: Option<Count>,
    failure_rate: Option<Fraction>,
    slow: Option<(Fraction, Span)>,
    time_window: Option<(Span, Count)>,
    calls_window: Count,
    minimum_calls: Option<Count>,
    permits: Count,
    successes_to_close: Option<Count>,
    probe_timeout: Span,
}

impl BreakerIn {
    fn build(&self) -> Option<BreakerPolicy> {
        let mut builder = BreakerPolicy::builder(self.open.build()?)
            .half_open_permits(self.permits.get())
            .probe_timeout(self.probe_timeout.get());
        builder.consecutive_failures = self.consecutive.map(Count::get);
        builder.failure_rate = self.failure_rate.map(Fraction::get);
        if let Some((rate, threshold)) = self.slow {
            builder = builder.slow_call_rate(rate.get(), threshold.get());
        }
        builder = match self.time_window {
            Some((span, buckets)) => builder.time_window(span.get(), buckets.get()),
            None => builder.count_window(self.calls_window.get()),
        };
        builder.minimum_calls = self.minimum_calls.map(Count::get);
        builder.successes_to_close = self.successes_to_close.map(Count::get);
        builder.build().ok()
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum BreakerOp {
    Acquire(At),
    Record(At, u8, u8),
    RecordWithDuration(At, u8, u8, Span),
    Timeout(At),
    Isolate(At),
    Disable(At),
    Reset(At),
}

fn call_outcome(n: u8) -> CallOutcome {
    match n % 3 {
        0 => CallOutcome::Success,
        1 => CallOutcome::Failure,
        _ => CallOutcome::Ignored,
    }
}

/// A loaded [`Breaker`] driven under an arbitrary [`BreakerPolicy`]: also `G8`, no admission
/// while open (before its end) or isolated.
pub fn breaker(data: &[u8]) {
    let Some((mut breaker, policy, ops)) = decode::<Breaker, BreakerIn, BreakerOp>(data) else { return };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(4);
    let mut clock = Clock::default();
    let mut permits: Vec<Permit> = Vec::new();
    reloads(Ctx { step: 0, op: &"(loaded)" }, &breaker);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = breaker;
        let due = breaker.poll_timeout();
        let refused = match *op {
            BreakerOp::Acquire(at) => {
                let now = clock.at(at, due);
                let status = breaker.status();
                // The breaker reads an earlier `now` than its latest as its latest.
                let effective = now.later(breaker.now());
                match breaker.try_acquire(&policy, now, &mut rng) {
                    Ok(permit) => {
                        let admitted_while_closed = match status {
                            BreakerStatus::Isolated => false,
                            BreakerStatus::Open { until } => effective >= until,
                            _ => true,
                        };
                        ensure!(ctx, admitted_while_closed, "G8", "admitted a call while {status:?} at {effective:?}");
                        if permits.len() < 32 {
                            permits.push(permit);
                        }
                    }
                    Err(rejected) => {
                        ensure!(
                            ctx,
                            !matches!(
                                status,
                                BreakerStatus::Closed | BreakerStatus::Disabled | BreakerStatus::MetricsOnly
                            ),
                            "K5",
                            "rejected ({rejected:?}) while {status:?}"
                        );
                    }
                }
                None
            }
            BreakerOp::Record(at, i, outcome) | BreakerOp::RecordWithDuration(at, i, outcome, _) => {
                let now = clock.at(at, due);
                match permits.get(usize::from(i) % permits.len().max(1)).copied() {
                    None => None,
                    Some(permit) => {
                        let result = match *op {
                            BreakerOp::RecordWithDuration(.., span) => breaker.record_with_duration(
                                &policy,
                                now,
                                permit,
                                call_outcome(outcome),
                                span.get(),
                                &mut rng,
                            ),
                            _ => breaker.record(&policy, now, permit, call_outcome(outcome), &mut rng),
                        };
                        result.err().map(|e| format!("{e:?}"))
                    }
                }
            }
            BreakerOp::Timeout(at) => {
                breaker.handle_timeout(&policy, clock.at(at, due), &mut rng);
                None
            }
            BreakerOp::Isolate(at) => {
                breaker.handle_isolate(clock.at(at, due));
                None
            }
            BreakerOp::Disable(at) => {
                breaker.handle_disable(clock.at(at, due));
                None
            }
            BreakerOp::Reset(at) => {
                breaker.handle_reset(&policy, clock.at(at, due));
                None
            }
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &breaker, &refused);
        }
        let _ = (breaker.poll_timeout(), breaker.window_counts(), breaker.openings());
        reloads(ctx, &breaker);
    }
}

/// The budgets' policies, as the fuzzer draws them.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct BudgetIn {
    capacity: Count,
    costs: (Count, Count, Count),
    refund_milli: u32,
    refund_retry_cost: bool,
    threshold: Option<Count>,
    charge_refused: bool,
    ratio: Fraction,
    ttl: Span,
    buckets: Count,
    min_retries_per_sec: Count,
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum BudgetOp {
    TokenAcquire(u8),
    TokenSuccess(bool),
    Request(At),
    RatioAcquire(At),
}

/// A loaded [`TokenBucket`] and [`RatioBudget`] driven under arbitrary policies: also `G9`, a
/// bucket never holds more than its capacity after a call, and a ratio budget never grants past
/// its allowance.
pub fn budget(data: &[u8]) {
    let Some(((mut bucket, mut ratio), input, ops)) = decode::<(TokenBucket, RatioBudget), BudgetIn, BudgetOp>(data)
    else {
        return;
    };
    let tokens = TokenBucketPolicy::builder(input.capacity.get())
        .costs(input.costs.0.get(), input.costs.1.get(), input.costs.2.get())
        .success_refund_milli(u64::from(input.refund_milli))
        .refund_retry_cost(input.refund_retry_cost)
        .charge_refused(input.charge_refused);
    let tokens = match input.threshold {
        Some(t) => tokens.refuse_at_or_below(t.get()),
        None => tokens,
    };
    let ratio_policy = RatioBudgetPolicy::builder(input.ratio.get())
        .ttl(input.ttl.get())
        .buckets(input.buckets.get())
        .min_retries_per_sec(input.min_retries_per_sec.get())
        .build();
    let (Ok(tokens), Ok(ratio_policy)) = (tokens.build(), ratio_policy) else { return };
    let mut clock = Clock::default();
    let mut grant = None;
    reloads(Ctx { step: 0, op: &"(loaded)" }, &(bucket, ratio));
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        match *op {
            BudgetOp::TokenAcquire(class) => {
                let class =
                    [RetryClass::Throttling, RetryClass::Transient, RetryClass::Timeout][usize::from(class % 3)];
                if let Ok(granted) = bucket.try_acquire(&tokens, class) {
                    grant = Some(granted);
                }
                ensure!(
                    ctx,
                    bucket.balance_milli() <= tokens.capacity_milli(),
                    "G9",
                    "the bucket holds {} milli-tokens, more than its capacity {}",
                    bucket.balance_milli(),
                    tokens.capacity_milli()
                );
            }
            BudgetOp::TokenSuccess(with_grant) => {
                bucket.record_success(&tokens, if with_grant { grant.take() } else { None });
                ensure!(ctx, bucket.balance_milli() <= tokens.capacity_milli(), "G9", "a refund overfilled the bucket");
            }
            BudgetOp::Request(at) => ratio.record_request(&ratio_policy, clock.at(at, None)),
            BudgetOp::RatioAcquire(at) => {
                if ratio.try_acquire(&ratio_policy, clock.at(at, None)).is_ok() {
                    let allowed = ratio_policy.allowance(u64::from(ratio.requests()));
                    ensure!(
                        ctx,
                        u64::from(ratio.retries()) <= allowed,
                        "G9",
                        "granted a retry past the allowance: {} retries for {} requests (allowance {allowed})",
                        ratio.retries(),
                        ratio.requests()
                    );
                }
            }
        }
        reloads(ctx, &(bucket, ratio));
    }
}

/// A delivery policy, as the fuzzer draws it.
#[derive(Arbitrary, Clone, Copy, Debug)]
struct DeliveryIn {
    retry: RetryIn,
    max_redeliveries: Count,
    asynchronous: bool,
    start_timeout: Span,
    heartbeat_timeout: Span,
    on_failure: u8,
}

impl DeliveryIn {
    fn build(&self) -> Option<DeliveryPolicy<u8>> {
        let builder = DeliveryPolicy::builder(self.retry.build()?)
            .max_redeliveries(self.max_redeliveries.get())
            .durability(if self.asynchronous { Durability::Async } else { Durability::Sync })
            .start_timeout(self.start_timeout.get())
            .heartbeat_timeout(self.heartbeat_timeout.get());
        let on_failure = match self.on_failure % 3 {
            0 => FailurePolicy::Fail,
            1 => FailurePolicy::Proceed,
            _ => FailurePolicy::Divert(self.on_failure),
        };
        builder.on_failure(on_failure).build().ok()
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum DeliveryOp {
    HandOut(At, u8),
    Started(At, Nth, u8),
    Heartbeat(At, Nth, u8, Option<u16>),
    Persisted(At, Nth),
    Completed(At, Nth, u8),
    Failed(At, Nth, u8, KindIn, u8),
    Interrupted(At, Nth, u8, u8),
    Returned(At, Nth, u8, u8),
    Failover(At),
    Timeout(At),
}

/// The interruption the fuzzer's byte names.
fn interruption(n: u8) -> Interruption {
    [
        Interruption::WorkerCrashed,
        Interruption::Disconnected,
        Interruption::LeaseExpired,
        Interruption::HeartbeatMissed,
        Interruption::ServerFailover,
    ][usize::from(n % 5)]
}

/// The free return the fuzzer's byte names.
fn free_return(n: u8) -> FreeReturn {
    [FreeReturn::Declined, FreeReturn::SendFailed, FreeReturn::ClosedBeforeStart][usize::from(n % 3)]
}

/// A loaded [`Delivery`] driven under an arbitrary [`DeliveryPolicy`].
pub fn delivery(data: &[u8]) {
    type Task = Delivery<u8, u8, u16, u8, u8>;
    let Some((mut task, policy, ops)) = decode::<Task, DeliveryIn, DeliveryOp>(data) else { return };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(5);
    let mut clock = Clock::default();
    reloads(Ctx { step: 0, op: &"(loaded)" }, &task);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = task;
        let due = task.poll_timeout();
        let current = task.attempt();
        let refused = match *op {
            DeliveryOp::HandOut(at, w) => {
                task.handle_hand_out(&policy, clock.at(at, due), w).err().map(|e| format!("{e:?}"))
            }
            DeliveryOp::Started(at, n, w) => {
                task.handle_started(&policy, clock.at(at, due), n.get(current), &w).err().map(|e| format!("{e:?}"))
            }
            DeliveryOp::Heartbeat(at, n, w, checkpoint) => task
                .handle_heartbeat(&policy, clock.at(at, due), n.get(current), &w, checkpoint)
                .err()
                .map(|e| format!("{e:?}")),
            DeliveryOp::Persisted(at, n) => {
                task.handle_persisted(clock.at(at, due), n.get(current)).err().map(|e| format!("{e:?}"))
            }
            DeliveryOp::Completed(at, n, w) => {
                task.handle_success(clock.at(at, due), n.get(current), &w).err().map(|e| format!("{e:?}"))
            }
            DeliveryOp::Failed(at, n, w, kind, error) => {
                let now = clock.at(at, due);
                let failure = Failure::new(kind.get(now), error);
                task.handle_failure(&policy, now, n.get(current), &w, failure, &mut rng).err().map(|e| format!("{e:?}"))
            }
            DeliveryOp::Interrupted(at, n, w, why) => task
                .handle_interrupted(&policy, clock.at(at, due), n.get(current), &w, interruption(why), &mut rng)
                .err()
                .map(|e| format!("{e:?}")),
            DeliveryOp::Returned(at, n, w, why) => task
                .handle_returned(&policy, clock.at(at, due), n.get(current), &w, free_return(why))
                .err()
                .map(|e| format!("{e:?}")),
            DeliveryOp::Failover(at) => {
                task.handle_failover(&policy, clock.at(at, due), &mut rng).err().map(|e| format!("{e:?}"))
            }
            DeliveryOp::Timeout(at) => {
                task.handle_timeout(&policy, clock.at(at, due), &mut rng);
                None
            }
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &task, &refused);
        }
        let _ = (task.poll_timeout(), task.status(), task.stats(), task.retries_used(), task.attempt_progress());
        if step % 2 == 0 {
            drain(ctx, || task.poll_action());
        }
        reloads(ctx, &task);
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum FlowsOp {
    Insert(u8, At, Option<Span>),
    Remove(u8),
    Timeout(At),
    Poll,
    Tick(u8, At, At),
    Trigger(u8, At),
    Success(u8, At),
    Failure(u8, At, KindIn, u8),
    Cancel(u8, At),
    Reset(u8, At),
}

/// A loaded [`Flows`] registry driven under an arbitrary [`FlowPolicy`]: also `due`, every flow
/// the registry dispatches is one its own `poll_timeout` said was due by the registry's clock.
pub fn flows(data: &[u8]) {
    let Some((mut flows, policy, ops)) = decode::<Flows<u8, u8>, FlowIn, FlowsOp>(data) else { return };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(8);
    let mut clock = Clock { now: flows.now() };
    reloads(Ctx { step: 0, op: &"(loaded)" }, &flows);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = flows.clone();
        let due = flows.poll_timeout();
        let refused = match *op {
            FlowsOp::Insert(id, at, interval) => {
                let now = clock.at(at, due);
                let flow = match interval {
                    Some(interval) => Flow::every(now, interval.get()),
                    None => Flow::cron(now),
                };
                flows.insert(id, flow).err().map(|e| format!("{:?}", e.error))
            }
            FlowsOp::Remove(id) => {
                let _ = flows.remove(&id);
                None
            }
            FlowsOp::Timeout(at) => {
                flows.handle_timeout(clock.at(at, due));
                None
            }
            FlowsOp::Poll => {
                // The earliest due flow is dispatched, and only once the registry's clock reached
                // its time; none is missed (the due index agrees with the flows).
                let earliest = before.poll_timeout();
                match flows.poll_action() {
                    Some((id, _)) => {
                        let due = before.get(&id).and_then(Flow::poll_timeout);
                        ensure!(
                            ctx,
                            due == earliest && due.is_some_and(|due| due <= before.now()),
                            "due",
                            "dispatched flow {id} due at {due:?}; earliest {earliest:?}, registry at {:?}",
                            before.now()
                        );
                    }
                    None => ensure!(
                        ctx,
                        earliest.is_none_or(|due| due > before.now()),
                        "due",
                        "nothing dispatched, with a flow due at {earliest:?} and the registry at {:?}",
                        before.now()
                    ),
                }
                None
            }
            FlowsOp::Tick(id, at, tick) => {
                let now = clock.at(at, due);
                let tick = Clock { now }.at(tick, None);
                flows.handle_tick(now, &id, tick).err().map(|e| format!("{e:?}"))
            }
            FlowsOp::Trigger(id, at) => flows.trigger(clock.at(at, due), &id).err().map(|e| format!("{e:?}")),
            FlowsOp::Success(id, at) => flows.handle_success(clock.at(at, due), &id).err().map(|e| format!("{e:?}")),
            FlowsOp::Failure(id, at, kind, error) => {
                let now = clock.at(at, due);
                flows
                    .handle_failure(&policy, now, &id, Failure::new(kind.get(now), error), &mut rng)
                    .err()
                    .map(|e| format!("{e:?}"))
            }
            FlowsOp::Cancel(id, at) => flows.handle_cancel(clock.at(at, due), &id).err().map(|e| format!("{e:?}")),
            FlowsOp::Reset(id, at) => flows.reset_flow(clock.at(at, due), &id).err().map(|e| format!("{e:?}")),
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &flows, &refused);
        }
        for (_, flow) in flows.iter() {
            let _ = flow.info();
        }
        reloads(ctx, &flows);
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum DeliveriesOp {
    Insert(u8, u8, At),
    Remove(u8),
    HandOutNext(At, u8),
    Started(u8, At, Nth, u8),
    Heartbeat(u8, At, Nth, u8, Option<u16>),
    Persisted(u8, At, Nth),
    Completed(u8, At, Nth, u8),
    Failed(u8, At, Nth, u8, KindIn, u8),
    Interrupted(u8, At, Nth, u8, u8),
    Returned(u8, At, Nth, u8, u8),
    WorkerLost(At, u8, u8),
    Failover(At),
    Timeout(At),
    Drain(u8),
}

/// A loaded [`Deliveries`] table driven under an arbitrary [`DeliveryPolicy`]: every queued
/// action loads back with the table (so the check of queued actions refuses nothing the table
/// makes), and a task the table hands out is handed out to that worker (D1).
pub fn deliveries(data: &[u8]) {
    type Table = Deliveries<u8, u8, u8, u16, u8, u8>;
    let Some((mut table, policy, ops)) = decode::<Table, DeliveryIn, DeliveriesOp>(data) else { return };
    let Some(policy) = policy.build() else { return };
    let mut rng = rng(9);
    let mut clock = Clock::default();
    reloads(Ctx { step: 0, op: &"(loaded)" }, &table);
    let current = |table: &Table, task: u8| table.get(&task).map_or(1, Delivery::attempt);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = table.clone();
        let due = table.poll_timeout();
        let refused = match *op {
            DeliveriesOp::Insert(task, task_type, at) => table
                .insert(&policy, clock.at(at, due), task, task_type, u64::from(task))
                .err()
                .map(|e| format!("{:?}", e.error)),
            DeliveriesOp::Remove(task) => {
                let _ = table.remove(&task);
                None
            }
            DeliveriesOp::HandOutNext(at, worker) => {
                if let Some(task) = table.hand_out_next(&policy, clock.at(at, due), &worker) {
                    let status = table.get(&task).map(Delivery::status);
                    ensure!(
                        ctx,
                        matches!(status, Some(DeliveryStatus::HandedOut { worker: w, .. }) if *w == worker),
                        "D1",
                        "task {task} handed to worker {worker} is {status:?}"
                    );
                }
                None
            }
            DeliveriesOp::Started(task, at, n, w) => table
                .handle_started(&policy, clock.at(at, due), &task, n.get(current(&table, task)), &w)
                .err()
                .map(|e| format!("{e:?}")),
            DeliveriesOp::Heartbeat(task, at, n, w, checkpoint) => table
                .handle_heartbeat(&policy, clock.at(at, due), &task, n.get(current(&table, task)), &w, checkpoint)
                .err()
                .map(|e| format!("{e:?}")),
            DeliveriesOp::Persisted(task, at, n) => table
                .handle_persisted(clock.at(at, due), &task, n.get(current(&table, task)))
                .err()
                .map(|e| format!("{e:?}")),
            DeliveriesOp::Interrupted(task, at, n, w, why) => table
                .handle_interrupted(
                    &policy,
                    clock.at(at, due),
                    &task,
                    n.get(current(&table, task)),
                    &w,
                    interruption(why),
                    &mut rng,
                )
                .err()
                .map(|e| format!("{e:?}")),
            DeliveriesOp::Completed(task, at, n, w) => table
                .handle_success(clock.at(at, due), &task, n.get(current(&table, task)), &w)
                .err()
                .map(|e| format!("{e:?}")),
            DeliveriesOp::Failed(task, at, n, w, kind, error) => {
                let now = clock.at(at, due);
                let attempt = n.get(current(&table, task));
                table
                    .handle_failure(&policy, now, &task, attempt, &w, Failure::new(kind.get(now), error), &mut rng)
                    .err()
                    .map(|e| format!("{e:?}"))
            }
            DeliveriesOp::Returned(task, at, n, w, why) => {
                let reason = free_return(why);
                table
                    .handle_returned(&policy, clock.at(at, due), &task, n.get(current(&table, task)), &w, reason)
                    .err()
                    .map(|e| format!("{e:?}"))
            }
            DeliveriesOp::WorkerLost(at, w, why) => {
                let _ = table.handle_worker_lost(&policy, clock.at(at, due), &w, interruption(why), &mut rng);
                None
            }
            DeliveriesOp::Failover(at) => {
                table.handle_failover(&policy, clock.at(at, due), &mut rng);
                None
            }
            DeliveriesOp::Timeout(at) => {
                table.handle_timeout(&policy, clock.at(at, due), &mut rng);
                None
            }
            DeliveriesOp::Drain(n) => {
                for _ in 0..n % 8 {
                    let _ = table.poll_action();
                }
                None
            }
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &table, &refused);
        }
        let _ = (table.counts(), table.poll_timeout());
        reloads(ctx, &table);
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum ConcurrencyOp {
    Start,
    End,
    Acquire,
    Release,
}

/// A loaded [`ConcurrencyBudget`] driven under an arbitrary policy: also `G9`, a retry is
/// granted exactly while the retries in flight are under the policy's limit.
pub fn concurrency(data: &[u8]) {
    let Some((mut budget, (percent, min), ops)) = decode::<ConcurrencyBudget, (Fraction, Count), ConcurrencyOp>(data)
    else {
        return;
    };
    let Ok(policy) = ConcurrencyBudgetPolicy::builder(percent.get() * 100.0).min_retry_concurrency(min.get()).build()
    else {
        return;
    };
    reloads(Ctx { step: 0, op: &"(loaded)" }, &budget);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let before = budget;
        let refused = match op {
            ConcurrencyOp::Start => {
                budget.record_request_start();
                None
            }
            ConcurrencyOp::End => budget.record_request_end().err().map(|e| format!("{e:?}")),
            ConcurrencyOp::Acquire => {
                // Granted exactly while the retries in flight are under the limit (U1, G9).
                let limit = policy.limit(budget.requests());
                let granted = budget.try_acquire(&policy).is_ok();
                ensure!(
                    ctx,
                    granted == (before.retries() < limit),
                    "G9",
                    "granted: {granted}, with {} retries in flight and a limit of {limit}",
                    before.retries()
                );
                None
            }
            ConcurrencyOp::Release => budget.release_retry().err().map(|e| format!("{e:?}")),
        };
        if let Some(refused) = refused {
            unchanged(ctx, &before, &budget, &refused);
        }
        while budget.poll_event().is_some() {}
        reloads(ctx, &budget);
    }
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum BackoffOp {
    Next,
    Reset,
}

/// A loaded [`BackoffState`] driven under an arbitrary [`Backoff`]: every delay within the
/// schedule's floor and cap (B2).
pub fn backoff(data: &[u8]) {
    let Some((mut state, backoff, ops)) = decode::<BackoffState, BackoffIn, BackoffOp>(data) else { return };
    let Some(backoff): Option<Backoff> = backoff.build() else { return };
    let mut rng = rng(6);
    reloads(Ctx { step: 0, op: &"(loaded)" }, &state);
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        match op {
            BackoffOp::Next => {
                let delay = state.next_delay(&backoff, &mut rng);
                ensure!(
                    ctx,
                    delay >= backoff.min_delay() && delay <= backoff.max_delay(),
                    "B2",
                    "delay {delay:?} outside [{:?}, {:?}]",
                    backoff.min_delay(),
                    backoff.max_delay()
                );
            }
            BackoffOp::Reset => state.reset(),
        }
        reloads(ctx, &state);
    }
}

/// Seed inputs for the state targets: `(target, input)`, each a state made by driving the
/// machine with its own policy (a spread of phases: fresh, running, waiting, finished), framed
/// as the targets read it (two little-endian bytes of length, then the encoding) and followed
/// by `tail` (the policy and operations).
pub fn seed_inputs(tail: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    seed_states()
        .into_iter()
        .map(|(target, state)| {
            let mut input = (state.len() as u16).to_le_bytes().to_vec();
            input.extend_from_slice(&state);
            input.extend_from_slice(tail);
            (target, input)
        })
        .collect()
}

/// Encoded states made by driving each machine with its own policy: `(target, bytes)`.
fn seed_states() -> Vec<(&'static str, Vec<u8>)> {
    use core::time::Duration;

    let encode = |value: &dyn erased::Encode| value.encode();
    let mut seeds = Vec::new();
    let backoff =
        Backoff::exponential(Duration::from_millis(10), 2.0).max_delay(Duration::from_secs(1)).build().expect("valid");
    let retry_policy = persevere::RetryPolicy::builder(backoff).max_attempts(4).build().expect("valid");
    let mut rng = rng(7);
    let mut retry = Retry::<u8>::new();
    seeds.push(("retry_state", encode(&retry)));
    let _ = retry.handle_start(&retry_policy, Instant::ZERO);
    seeds.push(("retry_state", encode(&retry)));
    let _ = retry.poll_action();
    let _ = retry.handle_failure(&retry_policy, Instant::from_millis(5), 1, Failure::retryable(3), &mut rng);
    seeds.push(("retry_state", encode(&retry)));
    while retry.poll_action().is_some() {}
    seeds.push(("retry_state", encode(&retry)));

    let sup_policy = SupervisionPolicyBuilder::restartable().build(&TaskDefaults::new()).expect("valid");
    let mut task = Supervision::<u8>::new();
    let _ = task.handle_start(&sup_policy, Instant::ZERO);
    seeds.push(("supervision_state", encode(&task)));
    let _ = task.poll_action();
    let _ = task.handle_failure(&sup_policy, Instant::from_millis(3), 1, Failure::retryable(1), &mut rng);
    while task.poll_action().is_some() {}
    seeds.push(("supervision_state", encode(&task)));

    let flow_policy = FlowPolicy::builder().with_trip(3).build().expect("valid");
    let mut flow = Flow::<u8>::every(Instant::ZERO, Duration::from_secs(1));
    seeds.push(("flow_state", encode(&flow)));
    flow.handle_timeout(Instant::ZERO);
    let _ = flow.poll_action();
    let _ = flow.handle_failure(&flow_policy, Instant::from_millis(1), Failure::retryable(9), &mut rng);
    seeds.push(("flow_state", encode(&flow)));

    let breaker_policy =
        BreakerPolicy::builder(backoff).failure_rate(0.5).count_window(8).minimum_calls(2).build().expect("valid");
    let mut breaker = Breaker::new(&breaker_policy, 1);
    for i in 0..6 {
        if let Ok(permit) = breaker.try_acquire(&breaker_policy, Instant::from_millis(i), &mut rng) {
            let outcome = if i % 2 == 0 { CallOutcome::Failure } else { CallOutcome::Success };
            let _ = breaker.record(&breaker_policy, Instant::from_millis(i), permit, outcome, &mut rng);
        }
        seeds.push(("breaker_state", encode(&breaker)));
    }

    let ratio_policy = RatioBudgetPolicy::finagle();
    let mut ratio = RatioBudget::new();
    ratio.record_request(&ratio_policy, Instant::from_secs(1));
    let _ = ratio.try_acquire(&ratio_policy, Instant::from_secs(2));
    seeds.push(("budget_state", encode(&(TokenBucket::new(&TokenBucketPolicy::aws()), ratio))));

    let delivery_policy =
        DeliveryPolicy::builder(retry_policy).on_failure(FailurePolicy::<u8>::Fail).build().expect("valid");
    let mut delivery = Delivery::<u8, u8, u16, u8, u8>::new(&delivery_policy, Instant::ZERO, 1, 1);
    seeds.push(("delivery_state", encode(&delivery)));
    while delivery.poll_action().is_some() {}
    let _ = delivery.handle_hand_out(&delivery_policy, Instant::ZERO, 2);
    while delivery.poll_action().is_some() {}
    seeds.push(("delivery_state", encode(&delivery)));
    let _ = delivery.handle_started(&delivery_policy, Instant::ZERO, 1, &2);
    seeds.push(("delivery_state", encode(&delivery)));

    let mut state = BackoffState::new();
    let _ = state.next_delay(&backoff, &mut rng);
    seeds.push(("backoff_state", encode(&state)));

    // Appended, so that the seeds above keep their names.
    let mut flows = Flows::<u8, u8>::new();
    seeds.push(("flows_state", encode(&flows)));
    let _ = flows.insert(1, Flow::every(Instant::ZERO, Duration::from_secs(1)));
    let _ = flows.insert(2, Flow::cron(Instant::ZERO));
    let _ = flows.insert(3, Flow::every(Instant::from_millis(5), Duration::from_millis(100)));
    flows.handle_timeout(Instant::from_millis(5));
    seeds.push(("flows_state", encode(&flows)));
    let _ = flows.poll_action();
    let _ = flows.handle_failure(&flow_policy, Instant::from_millis(6), &1, Failure::retryable(2), &mut rng);
    let _ = flows.trigger(Instant::from_millis(7), &2);
    seeds.push(("flows_state", encode(&flows)));

    let mut table = Deliveries::<u8, u8, u8, u16, u8, u8>::new();
    seeds.push(("deliveries_state", encode(&table)));
    for task in 1..=3 {
        let _ = table.insert(&delivery_policy, Instant::ZERO, task, task % 2, u64::from(task));
    }
    let _ = table.hand_out_next(&delivery_policy, Instant::from_millis(1), &7);
    let _ = table.hand_out_next(&delivery_policy, Instant::from_millis(1), &8);
    let _ = table.handle_success(Instant::from_millis(2), &1, 1, &7);
    seeds.push(("deliveries_state", encode(&table)));
    while table.poll_action().is_some() {}
    let _ = table.handle_failure(&delivery_policy, Instant::from_millis(3), &2, 1, &8, Failure::retryable(4), &mut rng);
    seeds.push(("deliveries_state", encode(&table)));

    let mut budget = ConcurrencyBudget::new();
    budget.record_request_start();
    seeds.push(("concurrency_state", encode(&budget)));
    budget.record_request_start();
    let _ = budget.try_acquire(&ConcurrencyBudgetPolicy::envoy());
    seeds.push(("concurrency_state", encode(&budget)));

    let limiter_policy = persevere::LimiterPolicy::vegas()
        .to_builder()
        .min_rtt_probe(persevere::MinRttProbe::envoy(Duration::from_secs(1)))
        .build()
        .expect("valid");
    let bulkhead_policy =
        persevere::BulkheadPolicy::builder(2).max_wait(Duration::from_millis(5), 3).build().expect("valid");
    let (mut limiter, mut bulkhead) = (persevere::Limiter::new(&limiter_policy, 1), persevere::Bulkhead::new());
    seeds.push(("limits_state", encode(&(limiter.clone(), bulkhead.clone()))));
    for i in 0..4 {
        let _held = bulkhead.try_acquire(&bulkhead_policy, Instant::from_millis(i));
        if let Ok(permit) = limiter.try_acquire(&limiter_policy, Instant::from_millis(i)) {
            let _ = limiter.release(
                &limiter_policy,
                Instant::from_millis(i + 5),
                permit,
                persevere::Completion::Success,
                &mut rng,
            );
        }
    }
    let _in_flight = limiter.try_acquire(&limiter_policy, Instant::from_millis(9));
    seeds.push(("limits_state", encode(&(limiter.clone(), bulkhead.clone()))));
    limiter.handle_timeout(&limiter_policy, Instant::from_secs(3));
    seeds.push(("limits_state", encode(&(limiter, bulkhead))));
    seeds
}

mod erased {
    /// Encoding behind `dyn`, for the seed list.
    pub(super) trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            postcard::to_allocvec(self).expect("every state encodes")
        }
    }
}
