//! The per-task delivery path allocates nothing (§8): a counting global allocator proves it.

use std::time::Duration;

use persevere::{
    Backoff, Delivery, DeliveryAction, DeliveryPolicy, Durability, Failure, FailurePolicy, FreeReturn, Instant,
    Interruption, Jitter, RetryPolicy,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

use alloc_counter::allocations_in;

type Task = Delivery<u64, u32, u64, u32, u32>;

fn drain(task: &mut Task) -> usize {
    let mut n = 0;
    while let Some(action) = task.poll_action() {
        std::hint::black_box(&action);
        if let DeliveryAction::Finish(_) = action {
            n += 1;
        }
    }
    n
}

#[test]
fn the_per_task_delivery_path_allocates_nothing() {
    let retry = RetryPolicy::builder(
        Backoff::exponential(Duration::from_millis(10), 2.0)
            .max_delay(Duration::from_secs(1))
            .jitter(Jitter::Full)
            .build()
            .unwrap(),
    )
    .max_attempts(4)
    .build()
    .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for durability in [Durability::Sync, Durability::Async] {
        let policy = DeliveryPolicy::builder(retry)
            .durability(durability)
            .on_failure(FailurePolicy::Divert(7u32))
            .build()
            .unwrap();
        let mut finishes = 0;
        let n = allocations_in(|| {
            for task_id in 0..200u64 {
                let mut now = Instant::from_millis(task_id);
                let mut task = Task::new(&policy, now, task_id, task_id + 1);
                drain(&mut task);
                // A decline (free), a crash (a retry), a heartbeat timeout (a retry), a failover,
                // then a success or a final failure; drained after every input (the drain rule).
                task.handle_hand_out(&policy, now, 1).unwrap();
                drain(&mut task);
                task.handle_returned(&policy, now, 1, &1, FreeReturn::Declined).unwrap();
                drain(&mut task);
                task.handle_hand_out(&policy, now, 2).unwrap();
                drain(&mut task);
                task.handle_persisted(now, 1).unwrap();
                task.handle_started(&policy, now, 1, &2).unwrap();
                task.handle_heartbeat(&policy, now, 1, &2, Some(task_id)).unwrap();
                task.handle_interrupted(&policy, now, 1, &2, Interruption::WorkerCrashed, &mut rng).unwrap();
                drain(&mut task);
                now = task.poll_timeout().unwrap_or(now);
                task.handle_timeout(&policy, now, &mut rng);
                drain(&mut task);
                task.handle_hand_out(&policy, now, 3).unwrap();
                drain(&mut task);
                task.handle_heartbeat(&policy, now, 2, &3, None).unwrap();
                now = task.poll_timeout().unwrap();
                task.handle_timeout(&policy, now, &mut rng);
                drain(&mut task);
                now = task.poll_timeout().unwrap_or(now);
                task.handle_timeout(&policy, now, &mut rng);
                drain(&mut task);
                task.handle_hand_out(&policy, now, 4).unwrap();
                drain(&mut task);
                task.handle_failover(&policy, now, &mut rng).unwrap();
                drain(&mut task);
                now = task.poll_timeout().unwrap_or(now);
                task.handle_timeout(&policy, now, &mut rng);
                drain(&mut task);
                let attempt = task.attempt();
                task.handle_hand_out(&policy, now, 5).unwrap();
                drain(&mut task);
                if task_id % 2 == 0 {
                    task.handle_success(now, attempt, &5).unwrap();
                } else {
                    task.handle_failure(&policy, now, attempt, &5, Failure::retryable(1), &mut rng).unwrap();
                }
                finishes += drain(&mut task);
                std::hint::black_box(&task);
            }
        });
        // In Async the failover rolled attempt 3 back (no retry used), so a failure of attempt 3
        // still leaves one attempt: only the completed half finished.
        let expected = if durability == Durability::Sync { 200 } else { 100 };
        assert_eq!(finishes, expected, "{durability:?}: tasks finished once");
        assert_eq!(n, 0, "{durability:?}: the per-task path allocated {n} times");
    }
}

#[test]
fn the_counter_sees_allocations() {
    // Guards the test above against a counter that counts nothing.
    let n = allocations_in(|| {
        std::hint::black_box(vec![1u8; 16]);
    });
    assert!(n >= 1);
}

#[cfg(feature = "alloc")]
#[test]
fn the_table_allocates_nothing_per_hand_out_and_result_once_warm() {
    use persevere::Deliveries;
    let retry = RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).unbounded().build().unwrap();
    let policy = DeliveryPolicy::builder(retry).build().unwrap();
    let mut table = Deliveries::<u64, u8, u32, u64, u32>::new();
    let now = Instant::ZERO;
    for id in 0..1_000u64 {
        table.insert(&policy, now, id, (id % 3) as u8, id).unwrap();
    }
    while table.poll_action().is_some() {}
    let n = allocations_in(|| {
        for worker in 0..1_000u32 {
            let id = table.hand_out_next(&policy, now, &worker).unwrap();
            while table.poll_action().is_some() {}
            table.handle_started(&policy, now, &id, 1, &worker).unwrap();
            table.handle_success(now, &id, 1, &worker).unwrap();
            while table.poll_action().is_some() {}
        }
    });
    assert_eq!(table.counts().completed, 1_000);
    assert_eq!(n, 0, "the table allocated {n} times on hand-out → result");
}
