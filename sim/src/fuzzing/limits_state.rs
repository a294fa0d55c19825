//! A loaded [`Limiter`] and [`Bulkhead`] driven under arbitrary policies (see [`super::state`]):
//! besides `state-load` and `G12`, L1 (a permit only while a place is free and nobody waits,
//! a ticket only while the queue has room, a claim only on the ticket whose turn it is), L3 (a
//! limit that moves lands in the policy's bounds, finite) and L4 (a permit only under the
//! admission limit; each release returns exactly one place).

use arbitrary::Arbitrary;
use persevere::{
    Bulkhead, BulkheadPermit, BulkheadPolicy, Completion, Full, LimitAlgorithm, Limiter, LimiterPermit, LimiterPolicy,
    MinRttProbe, Ticket,
};

use super::state::{decode, reloads, unchanged};
use super::{At, Clock, Count, Ctx, Span, ensure, rng};

/// The policies' settings, valid by construction but for the spans (the builders' refusals are
/// the unit tests' business; a loaded state under an unexpected policy is this target's).
#[derive(Arbitrary, Clone, Copy, Debug)]
pub(super) struct LimitsIn {
    algorithm: u8,
    /// Thousandths: AIMD's ratio is 0.5 + n/1000 (mod 500), a smoothing (1 + n mod 1000)/1000,
    /// the tolerance 1 + n/1000.
    ratio: u16,
    smoothing: u16,
    tolerance: u16,
    queue_size: u8,
    window: u16,
    timeout: Span,
    /// The lowest limit (from 1), then the initial and highest as offsets above.
    limits: (u16, u16, Count),
    /// Interval, jitter in thousandths, samples and floor (from 1).
    probe: Option<(Span, u16, u8, u8)>,
    /// Places (from 1), waiters (up to the ring's size), and the longest wait.
    bulkhead: (u8, u8, Span),
}

#[derive(Arbitrary, Clone, Copy, Debug)]
enum LimitsOp {
    Acquire(At),
    Release(u8, u8, At),
    Foreign(At),
    Timeout(At),
    Enter(At),
    Leave(u8),
    Claim(u8, At),
    Cancel(u8),
    Sweep(At),
}

fn policies(input: &LimitsIn) -> Option<(LimiterPolicy, BulkheadPolicy)> {
    let thousandths = |n: u16| f64::from(n) / 1000.0;
    let algorithm = match input.algorithm % 3 {
        0 => LimitAlgorithm::Aimd { backoff_ratio: 0.5 + thousandths(input.ratio % 500), timeout: input.timeout.get() },
        1 => LimitAlgorithm::Vegas { smoothing: thousandths(1 + input.smoothing % 1000) },
        _ => LimitAlgorithm::Gradient2 {
            smoothing: thousandths(1 + input.smoothing % 1000),
            rtt_tolerance: 1.0 + thousandths(input.tolerance),
            queue_size: u32::from(input.queue_size),
            long_window: u32::from(input.window).max(1),
        },
    };
    let (min, above_min, above_initial) = input.limits;
    let min = u32::from(min).max(1);
    let initial = min + u32::from(above_min);
    let max = initial.saturating_add(above_initial.get()).min(persevere::MAX_LIMIT);
    let mut limiter = LimiterPolicy::builder(algorithm).limits(min, initial.min(max), max);
    if let Some((interval, jitter, samples, floor)) = input.probe {
        let probe = MinRttProbe {
            interval: interval.get(),
            jitter: thousandths(jitter % 1001),
            samples: u32::from(samples).max(1),
            floor: u32::from(floor).max(1),
        };
        limiter = limiter.min_rtt_probe(probe);
    }
    let (places, waiters, wait) = input.bulkhead;
    let waiters = u32::from(waiters) % (persevere::MAX_WAITERS + 1);
    let bulkhead = BulkheadPolicy::builder(u32::from(places).max(1)).max_wait(wait.get(), waiters);
    Some((limiter.build().ok()?, bulkhead.build().ok()?))
}

/// The driver's side: what it holds.
#[derive(Default)]
struct Held {
    permits: Vec<LimiterPermit>,
    places: Vec<BulkheadPermit>,
    tickets: Vec<Ticket>,
}

/// See the module's docs.
pub(super) fn run(data: &[u8]) {
    let Some(((mut limiter, mut bulkhead), input, ops)) = decode::<(Limiter, Bulkhead), LimitsIn, LimitsOp>(data)
    else {
        return;
    };
    let Some((policy, bulkhead_policy)) = policies(&input) else { return };
    let mut other = Limiter::new(&policy, limiter.id().wrapping_add(1));
    let mut rng = rng(11);
    let mut clock = Clock::default();
    let mut held = Held::default();
    reloads(Ctx { step: 0, op: &"(loaded)" }, &(limiter.clone(), bulkhead.clone()));
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step: step + 1, op };
        let (before, before_bulkhead) = (limiter.clone(), bulkhead.clone());
        match *op {
            LimitsOp::Acquire(at) => {
                let now = clock.at(at, limiter.poll_timeout());
                if let Ok(permit) = limiter.try_acquire(&policy, now) {
                    ensure!(
                        ctx,
                        before.in_flight() < limiter.admission_limit(),
                        "L4",
                        "a permit with {} in flight and an admission limit of {}",
                        before.in_flight(),
                        limiter.admission_limit()
                    );
                    held.permits.push(permit);
                }
            }
            LimitsOp::Release(i, kind, at) => {
                if held.permits.is_empty() {
                    continue;
                }
                let permit = held.permits.swap_remove(usize::from(i) % held.permits.len());
                let completion = [Completion::Success, Completion::Dropped, Completion::Ignored][usize::from(kind % 3)];
                let now = clock.at(at, limiter.poll_timeout());
                let released = limiter.release(&policy, now, permit, completion, &mut rng);
                ensure!(ctx, released.is_ok(), "L4", "a held permit was refused: {released:?}");
                ensure!(ctx, limiter.in_flight() + 1 == before.in_flight(), "L4", "a release returned not one place");
                check_bounds(ctx, &policy, &before, &limiter);
            }
            LimitsOp::Foreign(at) => {
                let now = clock.at(at, None);
                if let Ok(permit) = other.try_acquire(&policy, now) {
                    let refused = limiter.release(&policy, now, permit, Completion::Success, &mut rng);
                    ensure!(ctx, refused.is_err(), "L4", "a foreign permit was released");
                    unchanged(ctx, &before, &limiter, &refused);
                }
            }
            LimitsOp::Timeout(at) => {
                limiter.handle_timeout(&policy, clock.at(at, limiter.poll_timeout()));
                ensure!(ctx, limiter.estimate() == before.estimate(), "L2", "the limit moved on a timeout");
            }
            op => bulkhead_op(ctx, op, &bulkhead_policy, &mut bulkhead, &before_bulkhead, &mut held, &mut clock),
        }
        reloads(ctx, &(limiter.clone(), bulkhead.clone()));
    }
}

/// L3: a limit that moved lands in the policy's bounds.
fn check_bounds(ctx: Ctx<'_>, policy: &LimiterPolicy, before: &Limiter, after: &Limiter) {
    let limit = after.estimate();
    if limit != before.estimate() {
        ensure!(
            ctx,
            limit.is_finite() && limit >= f64::from(policy.min_limit()) && limit <= f64::from(policy.max_limit()),
            "L3",
            "the limit moved to {limit}, outside [{}, {}]",
            policy.min_limit(),
            policy.max_limit()
        );
    }
}

fn bulkhead_op(
    ctx: Ctx<'_>,
    op: LimitsOp,
    policy: &BulkheadPolicy,
    bulkhead: &mut Bulkhead,
    before: &Bulkhead,
    held: &mut Held,
    clock: &mut Clock,
) {
    match op {
        LimitsOp::Enter(at) => {
            let now = clock.at(at, bulkhead.poll_timeout());
            // Admission first sweeps the waits that ended: judge it against the swept state.
            let mut swept = before.clone();
            swept.handle_timeout(now);
            match bulkhead.try_acquire(policy, now) {
                Ok(place) => {
                    let free = swept.in_flight() < policy.max_concurrent() && swept.waiting() == 0;
                    ensure!(
                        ctx,
                        free,
                        "L1",
                        "admitted with {} in flight, {} waiting",
                        swept.in_flight(),
                        swept.waiting()
                    );
                    held.places.push(place);
                }
                Err(Full::Queued(ticket)) => {
                    ensure!(ctx, swept.waiting() < policy.max_waiting(), "L1", "queued past max_waiting");
                    held.tickets.push(ticket);
                }
                Err(Full::Shed(_)) => unchanged(ctx, &swept, bulkhead, &"shed"),
            }
        }
        LimitsOp::Leave(i) => {
            if !held.places.is_empty() {
                let place = held.places.swap_remove(usize::from(i) % held.places.len());
                let released = bulkhead.release(place);
                ensure!(ctx, released.is_ok(), "L4", "a held place was refused: {released:?}");
            }
        }
        LimitsOp::Claim(i, at) => {
            if held.tickets.is_empty() {
                return;
            }
            let ticket = held.tickets[usize::from(i) % held.tickets.len()];
            let now = clock.at(at, bulkhead.poll_timeout());
            let ready = bulkhead.ready(policy, now);
            match bulkhead.try_claim(policy, now, ticket) {
                Ok(Some(place)) => {
                    ensure!(ctx, ready == Some(ticket), "L1", "{ticket:?} claimed out of turn (ready: {ready:?})");
                    held.places.push(place);
                    held.tickets.retain(|t| *t != ticket);
                }
                Ok(None) => unchanged(ctx, before, bulkhead, &"still waiting"),
                Err(refused) => unchanged(ctx, before, bulkhead, &refused),
            }
        }
        LimitsOp::Cancel(i) => {
            if !held.tickets.is_empty() {
                let ticket = held.tickets.swap_remove(usize::from(i) % held.tickets.len());
                if let Err(refused) = bulkhead.cancel(ticket) {
                    unchanged(ctx, before, bulkhead, &refused);
                }
            }
        }
        LimitsOp::Sweep(at) => bulkhead.handle_timeout(clock.at(at, bulkhead.poll_timeout())),
        LimitsOp::Acquire(_) | LimitsOp::Release(..) | LimitsOp::Foreign(_) | LimitsOp::Timeout(_) => {}
    }
}
