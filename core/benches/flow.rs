//! A flow outcome transition (F3), measured against a hand-written baseline in the same run.
//!
//! `cargo bench -p persevere --bench flow -- --warm-up-time 1 --measurement-time 2`
//!
//! - `flow/baseline/handwritten`: streak + 1, a capped exponential envelope by shift, a
//!   proportional-jitter draw (one multiply-shift), `until = now + delay` on a plain struct.
//! - `flow/failure`: [`Flow::handle_failure`] from `Running` with the F2 policy (proportional
//!   jitter 0.1), streaks cycling 0..8; includes copying the 120-byte state in.
//!
//! Draws come from [`SplitMix64`], the RNG the adapters' drivers own (baseline and machine alike).
//! States are copied in from a table and policies hidden from the optimiser once per bench, not
//! through `black_box` per call: that writes them to a stack slot and reads them back, and the
//! reload stalls on store forwarding (the harness, not the transition, would be measured).
//! - `flow/failure_nojitter`: the same with an unjittered backoff (no draw).
//! - `flow/delay_only`: the F2 backoff's delay alone ([`persevere::Backoff::delay`]): what the
//!   transition adds around the schedule is `failure − delay_only`.
//! - `flow/success`: [`Flow::handle_success`] from `Running`.
//! - `flow/dispatch_and_fail`: a whole run on one flow: `trigger`, drain, `handle_failure`.
//!
//! Every measured input starts from a drained flow (the drain rule: an input that arrives while
//! the dispatch waits to be drained is refused).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use persevere::{Failure, Flow, FlowPolicy, Instant, SplitMix64};
use rand_core::Rng;

#[derive(Clone, Copy)]
struct Plain {
    streak: u32,
    until: u64,
}

/// Running flows (their dispatch drained) after 0..8 consecutive failures.
fn running_flows(policy: &FlowPolicy, rng: &mut SplitMix64) -> Vec<Flow<u32>> {
    let mut flow = Flow::every(Instant::ZERO, Duration::from_secs(1));
    flow.trigger(Instant::ZERO).unwrap();
    flow.poll_action().unwrap();
    let mut flows = Vec::new();
    for _ in 0..8 {
        flows.push(flow);
        flow.handle_failure(policy, Instant::ZERO, Failure::retryable(0), rng).unwrap();
        flow.trigger(Instant::ZERO).unwrap();
        flow.poll_action().unwrap();
    }
    flows
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("flow");
    let mut rng = SplitMix64::new(1);
    let policy = FlowPolicy::default();
    group.bench_function("baseline/handwritten", |b| {
        let mut state = Plain { streak: 0, until: 0 };
        b.iter(|| {
            let mut s = state;
            s.streak = (s.streak & 7) + 1;
            let envelope = (1_000_000_000u64 << (s.streak - 1)).min(300_000_000_000);
            let spread = envelope / 10;
            let draw = ((u128::from(rng.next_u64()) * u128::from(2 * spread + 1)) >> 64) as u64;
            s.until = 5u64.saturating_add(envelope - spread + draw);
            state = s;
            state.until
        })
    });
    let flows = running_flows(&policy, &mut rng);
    group.bench_function("failure", |b| {
        let policy = black_box(&policy);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut flow = flows[i];
            flow.handle_failure(policy, Instant::from_nanos(5), Failure::retryable(1), &mut rng).unwrap();
            flow.next_eligible()
        })
    });
    let nojit = FlowPolicy::builder()
        .backoff(persevere::Backoff::exponential(Duration::from_secs(1), 2.0).build().unwrap())
        .build()
        .unwrap();
    group.bench_function("failure_nojitter", |b| {
        let nojit = black_box(&nojit);
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut flow = flows[i];
            flow.handle_failure(nojit, Instant::from_nanos(5), Failure::retryable(1), &mut rng).unwrap();
            flow.next_eligible()
        })
    });
    group.bench_function("delay_only", |b| {
        let mut i = 0u32;
        b.iter(|| {
            i = (i + 1) & 7;
            black_box(policy.backoff().delay(i + 1, Duration::ZERO, &mut rng))
        })
    });
    group.bench_function("success", |b| {
        let mut i = 0;
        b.iter(|| {
            i = (i + 1) & 7;
            let mut flow = flows[i];
            flow.handle_success(Instant::from_nanos(5)).unwrap();
            // The whole state: a field alone (the streak is always 0 after a success) would let
            // the transition fold away.
            black_box(&flow);
        })
    });
    group.bench_function("dispatch_and_fail", |b| {
        let mut flow = Flow::<u32>::every(Instant::ZERO, Duration::from_secs(1));
        b.iter(|| {
            if flow.streak() == 8 {
                flow.reset_flow(Instant::ZERO).unwrap();
                black_box(flow.poll_action());
            }
            flow.trigger(Instant::ZERO).unwrap();
            black_box(flow.poll_action());
            flow.handle_failure(black_box(&policy), Instant::ZERO, Failure::retryable(1), &mut rng).unwrap();
            black_box(flow.next_eligible())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
