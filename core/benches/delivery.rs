//! The delivery machine's hot path: hand-out → result, against baselines measured in the same run.
//!
//! `cargo bench -p persevere --bench delivery -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use persevere::{Backoff, Delivery, DeliveryPolicy, Failure, FreeReturn, Instant, Jitter, Retry, RetryPolicy};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

type Task = Delivery<u64, u32, u64, u32>;

fn drain(task: &mut Task) {
    while let Some(action) = task.poll_action() {
        black_box(action);
    }
}

fn benches(c: &mut Criterion) {
    let retry = RetryPolicy::builder(
        Backoff::exponential(Duration::from_millis(100), 2.0)
            .max_delay(Duration::from_secs(10))
            .jitter(Jitter::Full)
            .build()
            .unwrap(),
    )
    .max_attempts(5)
    .build()
    .unwrap();
    let policy = DeliveryPolicy::builder(retry).build().unwrap();
    let now = Instant::from_secs(1);
    let mut template = Task::new(&policy, now, 42, 7);
    drain(&mut template);
    let mut rng = ChaCha8Rng::seed_from_u64(1);

    let mut g = c.benchmark_group("delivery");
    g.bench_function("baseline/direct_call", |b| b.iter(|| black_box(black_box(41u64).wrapping_add(1))));
    g.bench_function("baseline/retry_success_path", |b| {
        let retry_policy = *policy.retry();
        b.iter(|| {
            let mut r = Retry::<u32>::new();
            r.handle_start(&retry_policy, black_box(now)).unwrap();
            while let Some(a) = r.poll_action() {
                black_box(a);
            }
            r.handle_success(now, 1).unwrap();
            while let Some(a) = r.poll_action() {
                black_box(a);
            }
        })
    });
    g.bench_function("baseline/copy_task_state", |b| b.iter(|| black_box(black_box(template))));
    g.bench_function("hand_out_then_completed", |b| {
        b.iter_batched_ref(
            || template,
            |t| {
                t.handle_hand_out(&policy, now, black_box(3)).unwrap();
                drain(t);
                t.handle_success(now, 1, &3).unwrap();
                drain(t);
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("hand_out_started_heartbeat_completed", |b| {
        b.iter_batched_ref(
            || template,
            |t| {
                t.handle_hand_out(&policy, now, black_box(3)).unwrap();
                drain(t);
                t.handle_started(&policy, now, 1, &3).unwrap();
                t.handle_heartbeat(&policy, now, 1, &3, Some(black_box(9))).unwrap();
                t.handle_success(now, 1, &3).unwrap();
                drain(t);
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("hand_out_then_failed_with_jittered_retry", |b| {
        b.iter_batched_ref(
            || template,
            |t| {
                t.handle_hand_out(&policy, now, black_box(3)).unwrap();
                drain(t);
                t.handle_failure(&policy, now, 1, &3, Failure::retryable(black_box(5)), &mut rng).unwrap();
                drain(t);
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("hand_out_then_declined", |b| {
        b.iter_batched_ref(
            || template,
            |t| {
                t.handle_hand_out(&policy, now, black_box(3)).unwrap();
                drain(t);
                t.handle_returned(&policy, now, 1, &3, FreeReturn::Declined).unwrap();
                drain(t);
            },
            BatchSize::SmallInput,
        )
    });
    g.bench_function("new_task", |b| b.iter(|| Task::new(&policy, black_box(now), black_box(42), 7)));
    g.finish();
}

criterion_group!(delivery, benches);
criterion_main!(delivery);
