//! 10,000 flows on one scheduler and 10,000 supervised periodic tasks at once on tokio (paused
//! time): every flow and every task keeps its schedule exactly, and every task ends with one
//! outcome. Memory and real-time lateness are measured by
//! `cargo run --release -p persevere-tokio --example scale`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use persevere::{FlowStatus, TaskDefaults, TaskOutcomeKind};
use persevere_tokio::{Scheduler, Supervisor, TaskSpec};

const N: u32 = 10_000;

#[test]
fn ten_thousand_flows_and_ten_thousand_tasks_keep_their_schedules() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    runtime.block_on(async {
        let started = tokio::time::Instant::now();
        let runs = Arc::new(AtomicU64::new(0));
        let mut scheduler: Scheduler<u32, String> = Scheduler::new();
        for id in 0..N {
            let runs = runs.clone();
            // Flows are spread over the first 100 ms by their interval: 100..=199 ms.
            scheduler
                .every(id, Duration::from_millis(100 + u64::from(id % 100)), move || {
                    runs.fetch_add(1, Ordering::Relaxed);
                    std::future::ready(Ok(()))
                })
                .unwrap();
        }
        let handle = scheduler.start();

        let attempts = Arc::new(AtomicU64::new(0));
        let supervisor: Supervisor<u32, String> = Supervisor::new(TaskDefaults::new());
        let mut tasks = Vec::new();
        for id in 0..N {
            let attempts = attempts.clone();
            tasks.push(
                supervisor
                    .add(id, TaskSpec::periodic(Duration::from_millis(100)), move || {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        std::future::ready(Ok(()))
                    })
                    .unwrap(),
            );
        }

        // Just short of one second of virtual time.
        tokio::time::sleep(Duration::from_millis(999)).await;
        handle.stop();
        handle.wait().await;
        let report = supervisor.shutdown(Duration::from_secs(1)).await;
        assert!(started.elapsed() < Duration::from_millis(1_001), "paused time moved only as far as asked");

        // A flow every `i` ms with instant runs runs at 0, i, 2i, … < 999 ms.
        let mut expected = 0;
        for id in 0..N {
            let interval = 100 + u64::from(id % 100);
            let info = handle.status(&id).unwrap();
            let want = 998 / interval + 1;
            assert_eq!(info.run_count, want, "flow {id}");
            assert_eq!(info.status, FlowStatus::Completed);
            expected += want;
        }
        assert_eq!(runs.load(Ordering::Relaxed), expected);

        // A task every 100 ms: attempts at 0, 100, …, 900 ms.
        assert_eq!(attempts.load(Ordering::Relaxed), u64::from(N) * 10);
        assert_eq!(report.completed.len(), N as usize);
        assert!(report.aborted.is_empty());
        for task in tasks {
            let exit = task.await;
            assert_eq!((exit.outcome.kind(), exit.attempts, exit.aborted), (TaskOutcomeKind::Canceled, 10, false));
        }
    });
}
