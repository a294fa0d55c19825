//! Redelivery on a hand-moved clock: three workers, four tasks, printed as a timeline.
//!
//! - `pay-1`: its worker crashes mid-run: the crash consumes a retry (D2) and attempt 2 resumes
//!   from the last stored checkpoint (D7) on another worker;
//! - `report-2`: `gamma` declines reports: the task returns for free, same attempt number (D3),
//!   and `gamma` is never offered a report again;
//! - `render-3`: a poison task that makes every worker close before starting it: dead-lettered
//!   after `max_redeliveries` free returns instead of recycled forever (D4);
//! - `pay-4`: fails every attempt: retries end and the failure policy diverts it to the `refund`
//!   step, whose recovery error says `NotCompleted`: the charge may have gone through (D5, D8).
//!
//! Deterministic: the jitter comes from a seeded ChaCha8 RNG. The story is asserted at the end,
//! so the example fails loudly if it changes.
//!
//! Run with `cargo run -p persevere --example redelivery --features alloc`.

use core::time::Duration;

use persevere::{
    AttemptProgress, Backoff, Deliveries, DeliveryAction, DeliveryPolicy, DeliveryStatus, Failure, FailurePolicy,
    FreeReturn, Instant, Interruption, Jitter, RetryPolicy, Terminal,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

type Table = Deliveries<&'static str, &'static str, &'static str, u32, &'static str, &'static str>;

const WORKERS: [&str; 3] = ["alpha", "beta", "gamma"];

/// What a worker does with an attempt it receives.
enum Script {
    Decline,
    CloseBeforeStart,
    CrashAfterCheckpoint(u32),
    Fail(&'static str),
    Complete,
}

fn script(worker: &str, task_type: &str, task: &str, attempt: u64) -> Script {
    match (worker, task_type, task, attempt) {
        ("gamma", "report", ..) => Script::Decline,
        (_, "render", ..) => Script::CloseBeforeStart,
        ("alpha", _, "pay-1", 1) => Script::CrashAfterCheckpoint(40),
        (_, _, "pay-4", _) => Script::Fail("card issuer timeout"),
        _ => Script::Complete,
    }
}

struct Timeline {
    now: Instant,
    lines: Vec<String>,
}

impl Timeline {
    fn log(&mut self, task: &str, event: String) {
        let line = format!("{:>8.3}s  {task:<9} {event}", self.now.since_epoch().as_secs_f64());
        println!("{line}");
        self.lines.push(line);
    }

    fn drain(&mut self, table: &mut Table) {
        while let Some((task, action)) = table.poll_action() {
            let event = match action {
                DeliveryAction::Ready { attempt } => format!("attempt {attempt} ready"),
                DeliveryAction::HandOut(out) => format!(
                    "hand-out attempt {} -> {} (key {}#{}, checkpoint {:?})",
                    out.attempt, out.worker, out.key.task, out.key.step_execution, out.checkpoint
                ),
                DeliveryAction::Revoke { worker, attempt, reason } => {
                    format!("revoke attempt {attempt} from {worker}: {reason:?}")
                }
                DeliveryAction::Finish(terminal) => format!("FINISHED: {}", describe(&terminal)),
            };
            self.log(task, event);
        }
    }
}

fn describe(terminal: &Terminal<&str, &str>) -> String {
    match terminal {
        Terminal::Completed { attempt } => format!("completed by attempt {attempt}"),
        Terminal::Failed(e) => format!("failed ({:?}, {:?})", e.ended, e.progress),
        Terminal::Proceeded(e) => format!("proceeded ({:?}, {:?})", e.ended, e.progress),
        Terminal::Diverted { route, error } => format!(
            "diverted to `{route}` after {} attempts ({:?}, {:?}, last failure {:?})",
            error.stats.attempts, error.ended, error.progress, error.last_failure.error
        ),
        Terminal::DeadLettered(dead) => {
            format!("dead-lettered after {} free returns ({:?}, {:?})", dead.redeliveries, dead.reason, dead.progress)
        }
    }
}

fn main() {
    let retry = RetryPolicy::builder(
        Backoff::exponential(Duration::from_secs(1), 2.0)
            .max_delay(Duration::from_secs(10))
            .jitter(Jitter::Equal)
            .build()
            .expect("a valid backoff"),
    )
    .max_attempts(3)
    .build()
    .expect("a valid retry policy");
    let policy = DeliveryPolicy::builder(retry)
        .max_redeliveries(2)
        .start_timeout(Duration::from_secs(2))
        .heartbeat_timeout(Duration::from_secs(5))
        .on_failure(FailurePolicy::Divert("refund"))
        .build()
        .expect("a valid delivery policy");
    let mut rng = ChaCha8Rng::seed_from_u64(2026);
    let mut table = Table::new();
    let mut t = Timeline { now: Instant::ZERO, lines: Vec::new() };

    for (step, (task, task_type)) in
        [("pay-1", "payment"), ("report-2", "report"), ("render-3", "render"), ("pay-4", "payment")]
            .into_iter()
            .enumerate()
    {
        table.insert(&policy, t.now, task, task_type, 100 + step as u64).expect("unique task ids");
    }
    t.drain(&mut table);

    for _round in 0..100 {
        let mut handed = false;
        for worker in WORKERS {
            let Some(task) = table.hand_out_next(&policy, t.now, &worker) else { continue };
            handed = true;
            t.drain(&mut table);
            let attempt = table.get(&task).expect("just handed out").attempt();
            let task_type = *table.task_type(&task).expect("known task");
            t.now = t.now.saturating_add(Duration::from_millis(100));
            match script(worker, task_type, task, attempt) {
                Script::Decline => {
                    t.log(task, format!("{worker} declines type `{task_type}`"));
                    table.handle_returned(&policy, t.now, &task, attempt, &worker, FreeReturn::Declined)
                }
                Script::CloseBeforeStart => {
                    t.log(task, format!("{worker} dies cleanly before starting it"));
                    table.handle_returned(&policy, t.now, &task, attempt, &worker, FreeReturn::ClosedBeforeStart)
                }
                Script::CrashAfterCheckpoint(checkpoint) => {
                    table.handle_started(&policy, t.now, &task, attempt, &worker).expect("started");
                    table
                        .handle_heartbeat(&policy, t.now, &task, attempt, &worker, Some(checkpoint))
                        .expect("heartbeat");
                    t.log(task, format!("{worker} runs it, stores checkpoint {checkpoint}"));
                    t.now = t.now.saturating_add(Duration::from_millis(700));
                    t.log(task, format!("{worker} crashes"));
                    let lost = table.handle_worker_lost(&policy, t.now, &worker, Interruption::WorkerCrashed, &mut rng);
                    assert_eq!(lost, 1);
                    Ok(())
                }
                Script::Fail(error) => {
                    table.handle_started(&policy, t.now, &task, attempt, &worker).expect("started");
                    t.now = t.now.saturating_add(Duration::from_millis(300));
                    t.log(task, format!("{worker} fails attempt {attempt}: {error}"));
                    table
                        .handle_failure(&policy, t.now, &task, attempt, &worker, Failure::timeout(error), &mut rng)
                        .map_err(|refused| refused.error)
                }
                Script::Complete => {
                    table.handle_started(&policy, t.now, &task, attempt, &worker).expect("started");
                    t.now = t.now.saturating_add(Duration::from_millis(400));
                    t.log(task, format!("{worker} completes attempt {attempt}"));
                    table.handle_success(t.now, &task, attempt, &worker)
                }
            }
            .expect("the report is accepted");
            t.drain(&mut table);
            if let Some(DeliveryStatus::Pending { attempt, not_before: Some(until) }) =
                table.get(&task).map(|d| d.status())
            {
                let used = table.get(&task).map_or(0, |d| d.retries_used());
                let event = format!(
                    "attempt {attempt} waits until {:.3}s ({used} retries used)",
                    until.since_epoch().as_secs_f64()
                );
                t.log(task, event);
            }
        }
        let counts = table.counts();
        if counts.pending + counts.handed_out + counts.running == 0 {
            break;
        }
        if !handed {
            let Some(wake) = table.poll_timeout() else { break };
            t.now = t.now.later(wake);
            table.handle_timeout(&policy, t.now, &mut rng);
            t.drain(&mut table);
        }
    }

    let counts = table.counts();
    println!("\n{counts:?}");

    // The story, asserted: if any of this changes, the example fails.
    let pay1 = table.get(&"pay-1").expect("pay-1");
    assert_eq!(pay1.terminal(), Some(&Terminal::Completed { attempt: 2 }), "pay-1: the crash consumed a retry");
    assert_eq!(pay1.retries_used(), 1);
    assert!(t.lines.iter().any(|l| l.contains("hand-out attempt 2 -> ") && l.contains("checkpoint Some(40)")));
    let report = table.get(&"report-2").expect("report-2");
    assert_eq!(report.terminal(), Some(&Terminal::Completed { attempt: 1 }), "report-2: the decline was free");
    assert_eq!((report.retries_used(), report.redeliveries()), (0, 1));
    assert!(table.has_declined(&"gamma", &"report"));
    match table.get(&"render-3").and_then(|d| d.terminal()) {
        Some(Terminal::DeadLettered(dead)) => {
            assert_eq!((dead.attempt, dead.redeliveries), (1, 2), "render-3: dead-lettered, no retry used");
            assert_eq!(dead.progress, AttemptProgress::NotCompleted);
        }
        other => panic!("render-3 should be dead-lettered, is {other:?}"),
    }
    match table.get(&"pay-4").and_then(|d| d.terminal()) {
        Some(Terminal::Diverted { route, error }) => {
            assert_eq!(*route, "refund");
            assert_eq!(error.progress, AttemptProgress::NotCompleted, "the refund step must check the charge");
            assert_eq!(error.stats.attempts, 3);
        }
        other => panic!("pay-4 should be diverted, is {other:?}"),
    }
    assert_eq!((counts.completed, counts.diverted, counts.dead_lettered, counts.total()), (2, 1, 1, 4));
    println!("story checked: crash -> retry, decline -> free return, poison -> dead letter, recovery -> NotCompleted");
}
