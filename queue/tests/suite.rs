//! The queue's behaviour, rule by rule (D1–D10 through a real database, Q1–Q3, Q5, Q6), run on
//! SQLite and on PostgreSQL alike: see `common/mod.rs` for how to run the PostgreSQL half.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::{Db, policy, policy_with};
use persevere::{
    AttemptFailure, AttemptProgress, Backoff, DeliveryError, DeliveryPolicy, DeliveryStatus, Durability, Failure,
    FailurePolicy, Interruption, OutcomeKind, RetryPolicy, Terminal,
};
use persevere_queue::{
    Candidates, ClaimVisit, GuardedWrite, Handled, Insert, NewTask, Queue, QueueError, Row, SetAsideRow, Status, Store,
    TaskId, UpdateVisit, Worker, Write,
};

fn refused(result: Result<impl std::fmt::Debug, QueueError>) -> DeliveryError {
    match result {
        Err(QueueError::Refused { error, .. }) => error,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn d1_a_task_goes_pending_handed_out_running_completed<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    assert_eq!(queue.task(id).unwrap().status, Status::Pending);
    let job = queue.claim("w1", &["t"]).unwrap().unwrap();
    assert_eq!((job.id, job.attempt, job.payload.as_slice(), job.worker.as_str()), (id, 1, &b"p"[..], "w1"));
    assert_eq!(queue.task(id).unwrap().status, Status::HandedOut);
    queue.heartbeat(&job, None).unwrap();
    assert_eq!(queue.task(id).unwrap().status, Status::Running);
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    let info = queue.task(id).unwrap();
    assert_eq!(info.terminal(), Some(&Terminal::Completed { attempt: 1 }));
    assert!(queue.claim("w1", &["t"]).unwrap().is_none());
}

fn d1_a_failed_attempt_is_claimable_again_only_after_its_retry_delay<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy_with(3, Duration::from_secs(60)))).unwrap().id;
    let job = queue.claim("w1", &["t"]).unwrap().unwrap();
    assert_eq!(queue.fail(&job, Failure::retryable("boom".into())).unwrap(), Status::Pending);
    assert!(queue.claim("w1", &["t"]).unwrap().is_none(), "the retry delay has not passed");
    queue.advance_clock(Duration::from_secs(61));
    let job = queue.claim("w1", &["t"]).unwrap().unwrap();
    assert_eq!((job.id, job.attempt), (id, 2));
    assert_eq!(queue.task(id).unwrap().retries_used(), 1);
}

fn d2_an_expired_lease_uses_a_retry_and_its_attempt_number_is_never_reused<D: Db>(db: &D) {
    let (mut a, mut b) = (db.queue(), db.queue());
    let id = a.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let first = a.claim("a", &["t"]).unwrap().unwrap();
    assert!(b.claim("b", &["t"]).unwrap().is_none(), "leased to a");
    // Worker a dies; its 10 s start lease expires on the database's clock.
    b.advance_clock(Duration::from_secs(11));
    let second = b.claim("b", &["t"]).unwrap().unwrap();
    assert_eq!((second.id, second.attempt), (id, 2));
    let info = b.task(id).unwrap();
    assert_eq!(info.retries_used(), 1);
    assert_eq!(
        info.last_failure().map(|f| f.error.clone()),
        Some(Some(AttemptFailure::Interrupted(Interruption::LeaseExpired)))
    );
    // a comes back: its attempt is gone.
    a.advance_clock(Duration::from_secs(11));
    assert_eq!(refused(a.complete(&first)), DeliveryError::StaleAttempt { current: 2, got: 1 });
    assert_eq!(b.complete(&second).unwrap(), Status::Completed);
}

fn d2_a_missed_heartbeat_is_found_by_any_workers_sweep<D: Db>(db: &D) {
    let (mut a, mut b) = (db.queue(), db.queue());
    let id = a.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = a.claim("a", &["t"]).unwrap().unwrap();
    let deadline = a.heartbeat(&job, None).unwrap();
    assert!(deadline >= job.deadline + Duration::from_secs(20), "30 s from the heartbeat, not 10 s from the claim");
    b.advance_clock(Duration::from_secs(29));
    assert_eq!(b.sweep(100).unwrap(), 0, "the heartbeat deadline is 30 s away");
    b.advance_clock(Duration::from_secs(2));
    assert_eq!(b.sweep(100).unwrap(), 1);
    let info = b.task(id).unwrap();
    assert!(matches!(info.state.status(), DeliveryStatus::Pending { attempt: 2, .. }));
    assert_eq!(
        info.last_failure().map(|f| f.error.clone()),
        Some(Some(AttemptFailure::Interrupted(Interruption::HeartbeatMissed)))
    );
}

fn d3_a_decline_is_free_and_the_task_is_not_offered_to_that_worker_again<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(2))).unwrap().id;
    let job = queue.claim("picky", &["t"]).unwrap().unwrap();
    assert_eq!(queue.decline(&job).unwrap(), Status::Pending);
    let info = queue.task(id).unwrap();
    assert_eq!((info.attempt(), info.retries_used(), info.redeliveries()), (1, 0, 1));
    assert!(queue.claim("picky", &["t"]).unwrap().is_none(), "picky declined it");
    let job = queue.claim("other", &["t"]).unwrap().unwrap();
    assert_eq!(job.attempt, 1, "a free return keeps the attempt number");
    queue.heartbeat(&job, None).unwrap();
    assert_eq!(refused(queue.decline(&job)), DeliveryError::AlreadyStarted { attempt: 1 });
}

fn d4_free_returns_past_the_cap_dead_letter_the_task<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(5))).unwrap().id;
    for (i, worker) in ["w1", "w2", "w3", "w4"].into_iter().enumerate() {
        let job = queue.claim(worker, &["t"]).unwrap().unwrap();
        let status = queue.decline(&job).unwrap();
        assert_eq!(status, if i < 3 { Status::Pending } else { Status::DeadLettered });
    }
    let info = queue.task(id).unwrap();
    let Some(Terminal::DeadLettered(letter)) = info.terminal() else { panic!("{info:?}") };
    assert_eq!((letter.attempt, letter.redeliveries), (1, 3));
    assert_eq!(queue.tasks(Status::DeadLettered, 10).unwrap().iter().map(|t| t.id).collect::<Vec<_>>(), [id]);
}

fn d4_a_poison_task_that_keeps_killing_workers_ends<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "poison", policy(3))).unwrap().id;
    // Each worker claims it and dies: nobody reports, the lease expires, the next claim
    // interrupts it. Interruptions use retries, so the task cannot cycle forever.
    for attempt in 1..=3 {
        let job = queue.claim(&format!("w{attempt}"), &["t"]).unwrap().unwrap();
        assert_eq!(job.attempt, attempt);
        queue.advance_clock(Duration::from_secs(11));
    }
    assert!(queue.claim("w4", &["t"]).unwrap().is_none());
    let info = queue.task(id).unwrap();
    assert_eq!(info.status, Status::Failed);
    let error = info.terminal().and_then(Terminal::recovery_error).unwrap();
    assert_eq!(error.ended, OutcomeKind::Exhausted);
    assert_eq!(error.last_failure.error, Some(AttemptFailure::Interrupted(Interruption::LeaseExpired)));
}

fn d5_a_task_that_ran_reports_progress_not_completed<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(1))).unwrap().id;
    assert_eq!(queue.task(id).unwrap().progress(), AttemptProgress::NotStarted);
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.fail(&job, Failure::fatal("bad input".into())).unwrap(), Status::Failed);
    let info = queue.task(id).unwrap();
    assert_eq!(info.progress(), AttemptProgress::NotCompleted);
    let error = info.terminal().and_then(Terminal::recovery_error).unwrap();
    assert_eq!((error.ended, error.progress), (OutcomeKind::Fatal, AttemptProgress::NotCompleted));
}

fn d6_async_a_lost_claim_runs_the_same_attempt_again_without_a_retry<D: Db>(db: &D) {
    let mut queue = db.queue();
    let retry =
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(2).build().unwrap();
    let policy = DeliveryPolicy::builder(retry).durability(Durability::Async).build().unwrap();
    let id = queue.enqueue(NewTask::new("t", "p", policy)).unwrap().id;
    assert_eq!(queue.task(id).unwrap().progress(), AttemptProgress::NotCompleted, "D6: Async starts NotCompleted");
    let before = queue.store().get(id.0).unwrap().unwrap();
    let first = queue.claim("a", &["t"]).unwrap().unwrap();
    // The database loses the claim's commit (an asynchronous commit before a crash): the row
    // is as it was before the claim, version included.
    db.execute(&format!(
        "UPDATE persevere_tasks SET state = '{}', status = 'pending', due_at = {}, attempt = 1, version = {} WHERE id = {}",
        before.state,
        before.due_at.unwrap(),
        before.version,
        id.0
    ));
    let again = queue.claim("b", &["t"]).unwrap().unwrap();
    assert_eq!((first.attempt, again.attempt), (1, 1), "the same attempt number runs again");
    let info = queue.task(id).unwrap();
    assert_eq!(info.retries_used(), 0);
    // What Async promises: nobody is told the handler certainly did not run, although the
    // record of its start was lost. (A Sync task whose claim were lost would say `NotStarted`:
    // that is why the stores commit every claim durably.)
    assert_eq!(info.progress(), AttemptProgress::NotCompleted);
    assert_eq!(queue.complete(&again).unwrap(), Status::Completed);
    assert!(matches!(refused(queue.complete(&first)), DeliveryError::Finished(_)));
}

fn d7_the_last_stored_checkpoint_reaches_the_next_attempt<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(job.checkpoint, None);
    queue.heartbeat(&job, Some("page 1".into())).unwrap();
    queue.heartbeat(&job, Some("page 2".into())).unwrap();
    queue.heartbeat(&job, None).unwrap(); // no checkpoint: the stored one stays
    queue.fail(&job, Failure::retryable("crashed mid-page".into())).unwrap();
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!((job.id, job.attempt, job.checkpoint.as_deref()), (id, 2, Some("page 2")));
}

fn d8_failure_policies_fail_proceed_and_divert<D: Db>(db: &D) {
    let mut queue = db.queue();
    let base = policy(1);
    let divert = DeliveryPolicy::builder(*base.retry()).on_failure(FailurePolicy::Divert("refund")).build().unwrap();
    let proceed = DeliveryPolicy::builder(*base.retry()).on_failure(FailurePolicy::<String>::Proceed).build().unwrap();
    let failed = queue.enqueue(NewTask::new("t", "1", base)).unwrap().id;
    let proceeded = queue.enqueue(NewTask::new("t", "2", proceed)).unwrap().id;
    let diverted = queue.enqueue(NewTask::new("t", "3", divert)).unwrap().id;
    let mut statuses = BTreeMap::new();
    while let Some(job) = queue.claim("w", &["t"]).unwrap() {
        statuses.insert(job.id, queue.fail(&job, Failure::retryable(format!("no {}", job.id))).unwrap());
    }
    assert_eq!(statuses[&failed], Status::Failed);
    assert_eq!(statuses[&proceeded], Status::Proceeded);
    assert_eq!(statuses[&diverted], Status::Diverted);
    let Some(Terminal::Diverted { route, error }) = queue.task(diverted).unwrap().terminal().cloned() else {
        panic!("diverted")
    };
    assert_eq!(route, "refund");
    assert_eq!(error.last_failure.error, Some(AttemptFailure::Failed(format!("no {diverted}"))));
}

fn d8_the_last_failure_is_visible_while_retries_run<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.fail(&job, Failure::retryable("first".into())).unwrap();
    let info = queue.task(id).unwrap();
    assert_eq!(info.status, Status::Pending);
    assert_eq!(info.last_failure().and_then(|f| f.error.clone()), Some(AttemptFailure::Failed("first".into())));
}

fn d9_a_finished_task_refuses_every_further_report<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.complete(&job).unwrap();
    let version = queue.store().get(id.0).unwrap().unwrap().version;
    assert!(matches!(refused(queue.complete(&job)), DeliveryError::Finished(_)));
    assert!(matches!(refused(queue.fail(&job, Failure::retryable("late".into()))), DeliveryError::Finished(_)));
    assert!(matches!(refused(queue.heartbeat(&job, Some("late".into()))), DeliveryError::Finished(_)));
    assert_eq!(queue.store().get(id.0).unwrap().unwrap().version, version, "a refused report writes nothing");
    assert_eq!(queue.task(id).unwrap().status, Status::Completed);
}

fn d10_the_idempotency_key_is_stable_across_attempts<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let first = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.fail(&first, Failure::retryable("x".into())).unwrap();
    let second = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(first.idempotency_key, second.idempotency_key);
    assert_eq!(first.idempotency_key, format!("{}:1", id.0));
}

fn q1_two_reports_of_one_job_never_both_win<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let results: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = [true, false]
            .into_iter()
            .map(|complete| {
                let (barrier, job, mut queue) = (barrier.clone(), job.clone(), db.queue());
                scope.spawn(move || {
                    barrier.wait();
                    if complete { queue.complete(&job) } else { queue.fail(&job, Failure::fatal("no".into())) }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert_eq!(queue.task(id).unwrap().status, *winners[0]);
}

fn q1_the_row_holds_the_cores_state_and_every_write_bumps_its_version<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let v0 = queue.store().get(id.0).unwrap().unwrap().version;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    let row = queue.store().get(id.0).unwrap().unwrap();
    assert_eq!(row.version, v0 + 1);
    let state: persevere_queue::TaskState = serde_json::from_str(&row.state).unwrap();
    assert!(matches!(state.status(), DeliveryStatus::HandedOut { attempt: 1, worker, .. } if worker == "w"));
    queue.complete(&job).unwrap();
    assert_eq!(queue.store().get(id.0).unwrap().unwrap().version, v0 + 2);
}

fn q2_deadlines_are_read_from_the_database_clock<D: Db>(db: &D) {
    let mut queue = db.queue();
    queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    let before = queue.store().now().unwrap();
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    let after = queue.store().now().unwrap();
    assert!(job.deadline >= before + Duration::from_secs(10) && job.deadline <= after + Duration::from_secs(10));
    // A worker whose own view of time runs ahead cannot keep the lease, nor steal it early:
    // only the database's clock moves it (here, by `advance_clock` on the reporting connection).
    let mut other = db.queue();
    assert!(other.claim("thief", &["t"]).unwrap().is_none());
    other.advance_clock(Duration::from_secs(10) + (after - before) + Duration::from_millis(5));
    assert_eq!(other.claim("thief", &["t"]).unwrap().map(|j| j.attempt), Some(2));
}

fn q2_a_task_is_created_and_delayed_on_the_database_clock<D: Db>(db: &D) {
    let mut queue = db.queue();
    let before = queue.store().now().unwrap();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3)).delay(Duration::from_secs(5))).unwrap().id;
    let after = queue.store().now().unwrap();
    let row = queue.store().get(id.0).unwrap().unwrap();
    assert!(row.state.is_empty(), "an enqueue writes no state: the first load builds it from created_at");
    let created = persevere::Instant::from_nanos(u64::try_from(row.created_at).unwrap());
    assert!(before <= created && created <= after, "{before:?} <= {created:?} <= {after:?}");
    // The task's state is the one a `Delivery` created at that instant has.
    let mut fresh = persevere_queue::TaskState::new(&policy(3), created, (), 1);
    while fresh.poll_action().is_some() {}
    assert_eq!(queue.task(id).unwrap().state, fresh);
    assert_eq!(queue.task(id).unwrap().due_at, Some(created + Duration::from_secs(5)), "the query shows the delay");
    assert!(queue.claim("w", &["t"]).unwrap().is_none(), "not due before its delay on the database's clock");
    queue.advance_clock(Duration::from_secs(5));
    let job = queue.claim("w", &["t"]).unwrap().expect("due once the database's clock passed the delay");
    assert_eq!(job.attempt, 1);
    let info = queue.task(id).unwrap();
    assert!(matches!(info.state.status(), DeliveryStatus::HandedOut { attempt: 1, .. }));
}

fn q2_a_task_runs_no_earlier_than_its_run_at_on_the_database_clock<D: Db>(db: &D) {
    let mut queue = db.queue();
    let now = queue.store().now().unwrap();
    let wall = |at: persevere::Instant| std::time::UNIX_EPOCH + Duration::from_nanos(at.as_nanos());
    let at = now + Duration::from_secs(60);
    let later = queue.enqueue(NewTask::new("t", "at", policy(3)).run_at(wall(at))).unwrap().id;
    // With a delay too, the later of the two bounds wins, either way round.
    let delayed = queue
        .enqueue(NewTask::new("t", "both", policy(3)).run_at(wall(now)).delay(Duration::from_secs(120)))
        .unwrap()
        .id;
    let at_wins =
        queue.enqueue(NewTask::new("t", "both", policy(3)).delay(Duration::from_secs(1)).run_at(wall(at))).unwrap().id;
    let past = queue.enqueue(NewTask::new("t", "past", policy(3)).run_at(std::time::UNIX_EPOCH)).unwrap().id;
    assert_eq!(queue.task(later).unwrap().due_at, Some(at));
    assert_eq!(queue.task(at_wins).unwrap().due_at, Some(at));
    assert!(queue.task(delayed).unwrap().due_at.unwrap() >= now + Duration::from_secs(120));
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(job.id, past, "an instant in the past: due at once");
    queue.complete(&job).unwrap();
    assert!(queue.claim("w", &["t"]).unwrap().is_none(), "nothing else is due before its instant");
    queue.advance_clock(Duration::from_secs(61));
    let due: BTreeSet<TaskId> = std::iter::from_fn(|| queue.claim("w", &["t"]).unwrap().map(|j| j.id)).collect();
    assert_eq!(due, BTreeSet::from([later, at_wins]), "due at their instant, the 120 s delay still running");
}

fn q3_concurrent_workers_run_each_task_exactly_once<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids: Vec<TaskId> =
        (0..40).map(|i| queue.enqueue(NewTask::new("t", format!("{i}"), policy(3))).unwrap().id).collect();
    let ran: Vec<(TaskId, u64, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|w| {
                let mut worker = Worker::new(db.queue(), format!("w{w}"), &["t"]);
                scope.spawn(move || {
                    let mut ran = Vec::new();
                    while let Some(worked) = worker.work_one(|_, _| Handled::Completed).unwrap() {
                        ran.push((worked.id, worked.attempt, worker.id().to_owned()));
                    }
                    ran
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut seen: Vec<TaskId> = ran.iter().map(|(id, ..)| *id).collect();
    seen.sort();
    assert_eq!(seen, ids, "every task ran exactly once");
    assert!(ran.iter().all(|(_, attempt, _)| *attempt == 1));
    assert_eq!(queue.tasks(Status::Completed, 100).unwrap().len(), 40);
}

fn q3_a_claim_takes_only_the_types_it_asks_for_and_due_tasks_first<D: Db>(db: &D) {
    let mut queue = db.queue();
    let later = queue.enqueue(NewTask::new("a", "later", policy(1)).delay(Duration::from_secs(60))).unwrap().id;
    let b = queue.enqueue(NewTask::new("b", "b", policy(1))).unwrap().id;
    let a = queue.enqueue(NewTask::new("a", "now", policy(1))).unwrap().id;
    assert_eq!(queue.claim("w", &["a"]).unwrap().map(|j| j.id), Some(a));
    assert_eq!(queue.claim("w", &["a"]).unwrap(), None, "`later` is not due");
    assert_eq!(queue.claim("w", &["c", "b"]).unwrap().map(|j| j.id), Some(b));
    queue.advance_clock(Duration::from_secs(61));
    assert_eq!(queue.claim("w", &["a"]).unwrap().map(|j| j.id), Some(later));
}

fn q3_tasks_due_at_one_instant_are_claimed_in_the_order_they_were_enqueued<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids: Vec<i64> = (0..6).map(|_| queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id.0).collect();
    // Every task due at the same instant, each row rewritten from the newest to the oldest (on
    // PostgreSQL, an update writes a new row version: the newest rows then come first in the
    // table, and in the index's entries for that instant unless the index orders by id).
    let due = "(SELECT min(due_at) FROM persevere_tasks)";
    let rewrites: String =
        ids.iter().rev().map(|id| format!("UPDATE persevere_tasks SET due_at = {due} WHERE id = {id};")).collect();
    db.execute(&rewrites);
    let claimed: Vec<i64> = (0..6).map(|_| queue.claim("w", &["t"]).unwrap().unwrap().id.0).collect();
    assert_eq!(claimed, ids, "oldest first");
}

fn q5_enqueueing_a_key_twice_returns_the_existing_task<D: Db>(db: &D) {
    let mut queue = db.queue();
    let first = queue.enqueue(NewTask::new("t", "one", policy(3)).key("order-17")).unwrap();
    let second = queue.enqueue(NewTask::new("t", "two", policy(3)).key("order-17")).unwrap();
    assert!(first.created && !second.created);
    assert_eq!(first.id, second.id);
    assert_eq!(queue.task(first.id).unwrap().payload, b"one");
    assert_eq!(queue.task(first.id).unwrap().key.as_deref(), Some("order-17"));
    let other = queue.enqueue(NewTask::new("t", "three", policy(3)).key("order-18")).unwrap();
    assert!(other.created && other.id != first.id);
}

fn q5_concurrent_enqueues_of_one_key_create_one_task<D: Db>(db: &D) {
    let barrier = Arc::new(Barrier::new(4));
    let ids: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (barrier, mut queue) = (barrier.clone(), db.queue());
                scope.spawn(move || {
                    barrier.wait();
                    queue.enqueue(NewTask::new("t", "x", policy(3)).key("once")).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ids.iter().filter(|e| e.created).count(), 1, "{ids:?}");
    assert!(ids.iter().all(|e| e.id == ids[0].id));
}

fn q6_failed_and_dead_lettered_tasks_are_listed_and_redriven<D: Db>(db: &D) {
    let mut queue = db.queue();
    let failed = queue.enqueue(NewTask::new("t", "f", policy(1))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.fail(&job, Failure::fatal("bad".into())).unwrap();
    let retry = *policy(1).retry();
    let letter = queue
        .enqueue(NewTask::new("t", "d", DeliveryPolicy::builder(retry).max_redeliveries(0).build().unwrap()))
        .unwrap()
        .id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.decline(&job).unwrap(), Status::DeadLettered);

    assert_eq!(queue.tasks(Status::Failed, 10).unwrap().iter().map(|t| t.id).collect::<Vec<_>>(), [failed]);
    assert_eq!(queue.tasks(Status::DeadLettered, 10).unwrap().iter().map(|t| t.id).collect::<Vec<_>>(), [letter]);

    queue.redrive(failed).unwrap();
    queue.redrive(letter).unwrap();
    let mut ran = Vec::new();
    while let Some(job) = queue.claim("fixed", &["t"]).unwrap() {
        assert_eq!(job.attempt, 1, "a re-drive counts afresh");
        assert_eq!(job.idempotency_key, format!("{}:2", job.id.0), "a new execution of the step");
        queue.complete(&job).unwrap();
        ran.push(job.id);
    }
    ran.sort();
    assert_eq!(ran, [failed, letter]);
    assert!(matches!(queue.redrive(failed), Err(QueueError::NotRedrivable { status: Status::Completed, .. })));
    assert!(matches!(queue.redrive(TaskId(999_999)), Err(QueueError::UnknownTask(_))));
}

fn a_corrupt_row_is_set_aside_and_does_not_block_the_tasks_behind_it<D: Db>(db: &D) {
    let mut queue = db.queue();
    let bad = queue.enqueue(NewTask::new("t", "bad", policy(3))).unwrap().id;
    let good = queue.enqueue(NewTask::new("t", "good", policy(3))).unwrap().id;
    queue
        .store()
        .update(bad.0, &mut |_, _| {
            Ok(Some(Write {
                state: "{\"not\":\"a state\"}".into(),
                status: Status::Pending,
                due_at: Some(0),
                attempt: 1,
                declined_by: String::new(),
            }))
        })
        .unwrap();
    assert!(matches!(queue.task(bad), Err(QueueError::Corrupt { what: "state", .. })));
    // The bad row is the oldest due one; the claim sets it aside and hands out the next.
    assert_eq!(queue.claim("w", &["t"]).unwrap().map(|j| j.id), Some(good));
    let corrupt = queue.corrupt_tasks(10).unwrap();
    assert_eq!(corrupt.iter().map(|c| c.id).collect::<Vec<_>>(), [bad]);
    assert_eq!(corrupt[0].state, "{\"not\":\"a state\"}", "its text is kept for a person to read");
    assert!(corrupt[0].error.contains("state"), "{}", corrupt[0].error);
    assert!(queue.claim("w", &["t"]).unwrap().is_none());
}

fn d3_a_worker_that_declined_a_type_is_not_given_that_type_again<D: Db>(db: &D) {
    let mut queue = db.queue();
    let first = queue.enqueue(NewTask::new("gpu", "1", policy(3))).unwrap().id;
    let second = queue.enqueue(NewTask::new("gpu", "2", policy(3))).unwrap().id;
    let email = queue.enqueue(NewTask::new("email", "3", policy(3))).unwrap().id;
    let job = queue.claim("cpu", &["gpu", "email"]).unwrap().unwrap();
    assert_eq!(job.id, first);
    queue.decline(&job).unwrap();
    // `second` is due and older than `email`, but this worker declined its type.
    assert_eq!(queue.claim("cpu", &["gpu", "email"]).unwrap().map(|j| j.id), Some(email));
    assert_eq!(queue.claim("cpu", &["gpu"]).unwrap(), None);
    // Another worker gets both (the declined one went back to the end of the line).
    let mut gpu = db.queue();
    assert_eq!(gpu.claim("gpu-worker", &["gpu"]).unwrap().map(|j| j.id), Some(second));
    assert_eq!(gpu.claim("gpu-worker", &["gpu"]).unwrap().map(|j| j.id), Some(first));
}

fn a_handler_panic_fails_the_attempt_with_the_panicked_class<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(2))).unwrap().id;
    let mut worker = Worker::new(queue, "w", &["t"]);
    let worked = worker.work_one(|_, _| panic!("handler bug")).unwrap().unwrap();
    assert_eq!(worked.handled, Handled::Failed(Failure::panicked("handler bug".into())));
    assert_eq!(worked.status, Status::Pending);
    let worked = worker.work_one(|job, lease| {
        lease.beat(Some("halfway".into())).unwrap();
        assert_eq!(job.attempt, 2);
        Handled::Completed
    });
    assert_eq!(worked.unwrap().map(|w| w.status), Some(Status::Completed));
    assert_eq!(worker.queue().task(id).unwrap().status, Status::Completed);
}

on_both_stores!(
    d1_a_task_goes_pending_handed_out_running_completed,
    d1_a_failed_attempt_is_claimable_again_only_after_its_retry_delay,
    d2_an_expired_lease_uses_a_retry_and_its_attempt_number_is_never_reused,
    d2_a_missed_heartbeat_is_found_by_any_workers_sweep,
    d3_a_decline_is_free_and_the_task_is_not_offered_to_that_worker_again,
    d4_free_returns_past_the_cap_dead_letter_the_task,
    d4_a_poison_task_that_keeps_killing_workers_ends,
    d5_a_task_that_ran_reports_progress_not_completed,
    d6_async_a_lost_claim_runs_the_same_attempt_again_without_a_retry,
    d7_the_last_stored_checkpoint_reaches_the_next_attempt,
    d8_failure_policies_fail_proceed_and_divert,
    d8_the_last_failure_is_visible_while_retries_run,
    d9_a_finished_task_refuses_every_further_report,
    d10_the_idempotency_key_is_stable_across_attempts,
    q1_two_reports_of_one_job_never_both_win,
    q1_the_row_holds_the_cores_state_and_every_write_bumps_its_version,
    q2_deadlines_are_read_from_the_database_clock,
    q2_a_task_is_created_and_delayed_on_the_database_clock,
    q2_a_task_runs_no_earlier_than_its_run_at_on_the_database_clock,
    q3_concurrent_workers_run_each_task_exactly_once,
    q3_a_claim_takes_only_the_types_it_asks_for_and_due_tasks_first,
    q3_tasks_due_at_one_instant_are_claimed_in_the_order_they_were_enqueued,
    q5_enqueueing_a_key_twice_returns_the_existing_task,
    q5_concurrent_enqueues_of_one_key_create_one_task,
    q6_failed_and_dead_lettered_tasks_are_listed_and_redriven,
    a_corrupt_row_is_set_aside_and_does_not_block_the_tasks_behind_it,
    d3_a_worker_that_declined_a_type_is_not_given_that_type_again,
    a_handler_panic_fails_the_attempt_with_the_panicked_class,
    q1_a_report_whose_row_moved_meanwhile_reads_and_decides_again,
    q1_a_report_that_keeps_losing_the_race_is_a_conflict_and_writes_nothing,
    q1_a_held_completion_is_one_guarded_write_and_reads_again_when_the_row_moved,
    q2_the_guarded_write_checks_the_lease_on_the_database_clock,
    q2_a_held_completion_is_decided_on_the_database_clock_as_it_moves,
    q2_a_completion_decided_on_a_lagging_estimate_is_not_written_past_the_lease,
);

/// Q1's version guard: a report reads its row unlocked, and another writer moves the version
/// between the report's read and its write, `bumps` times.
struct Interloper<S> {
    inner: S,
    bump: Box<dyn FnMut(i64) + Send>,
    bumps: usize,
    visits: usize,
}

impl<S: Store> Store for Interloper<S> {
    fn now(&mut self) -> Result<persevere::Instant, QueueError> {
        self.inner.now()
    }
    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        self.inner.insert(insert)
    }
    fn claim(&mut self, c: Candidates<'_>, limit: u32, visit: &mut ClaimVisit<'_>) -> Result<usize, QueueError> {
        self.inner.claim(c, limit, visit)
    }
    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError> {
        let Interloper { inner, bump, bumps, visits } = self;
        inner.update(id, &mut |now, row| {
            *visits += 1;
            if *bumps > 0 {
                *bumps -= 1;
                bump(id);
            }
            visit(now, row)
        })
    }
    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        self.inner.get(id)
    }
    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        self.inner.list(status, limit)
    }
    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError> {
        self.inner.set_aside_rows(limit)
    }
    fn prune(&mut self, before: i64, limit: u32) -> Result<usize, QueueError> {
        self.inner.prune(before, limit)
    }
    fn advance_clock(&mut self, by: Duration) {
        self.inner.advance_clock(by);
    }
}

fn interloper<D: Db>(db: &D, bumps: usize) -> Queue<Interloper<D::S>> {
    Queue::new(Interloper { inner: db.connect(), bump: db.interloper(), bumps, visits: 0 })
}

fn q1_a_report_whose_row_moved_meanwhile_reads_and_decides_again<D: Db>(db: &D) {
    let mut queue = interloper(db, 1);
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    assert_eq!(queue.store().visits, 2, "the first write lost to the interloper's; the second decided afresh");
    assert_eq!(queue.task(id).unwrap().terminal(), Some(&Terminal::Completed { attempt: 1 }));
}

fn q1_a_report_that_keeps_losing_the_race_is_a_conflict_and_writes_nothing<D: Db>(db: &D) {
    let mut queue = interloper(db, usize::MAX);
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert!(matches!(queue.complete(&job), Err(QueueError::Conflict(task)) if task == id));
    assert_eq!(queue.store().visits, 16, "it read and decided 16 times");
    assert_eq!(queue.task(id).unwrap().status, Status::HandedOut, "no report was written");
}

/// A transaction left open on the SQLite connection (begun by hand through `connection()`) is
/// ended before the queue's statements run, so none of them is undone by its later rollback.
#[test]
fn a_transaction_left_open_by_hand_does_not_swallow_an_enqueue_or_a_report() {
    let db = common::sqlite("stray_transaction");
    let mut queue = db.queue();
    queue.store().connection().execute_batch("BEGIN").unwrap();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.store().connection().execute_batch("BEGIN").unwrap();
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    queue.store().connection().execute_batch("BEGIN").unwrap();
    drop(queue);
    // Another connection sees both.
    assert_eq!(db.queue().task(id).unwrap().status, Status::Completed);
}

/// The completion path without a read (`Queue::complete` of a job this queue claimed): counts
/// which path each report took, and can hold the clock estimate back to the last claim's
/// reading, as a connection whose estimate lags the database's clock would.
struct Watched<S> {
    inner: S,
    guarded_writes: usize,
    applied: usize,
    updates: usize,
    lagging: Option<persevere::Instant>,
}

impl<S: Store> Store for Watched<S> {
    fn now(&mut self) -> Result<persevere::Instant, QueueError> {
        self.inner.now()
    }
    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        self.inner.insert(insert)
    }
    fn claim(&mut self, c: Candidates<'_>, limit: u32, visit: &mut ClaimVisit<'_>) -> Result<usize, QueueError> {
        let claimed = self.inner.claim(c, limit, visit);
        if self.lagging.is_some() {
            self.lagging = self.inner.clock_estimate();
        }
        claimed
    }
    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError> {
        self.updates += 1;
        self.inner.update(id, visit)
    }
    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        self.inner.get(id)
    }
    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        self.inner.list(status, limit)
    }
    fn clock_estimate(&self) -> Option<persevere::Instant> {
        self.lagging.or_else(|| self.inner.clock_estimate())
    }
    fn write_if_leased(&mut self, write: &GuardedWrite) -> Result<bool, QueueError> {
        self.guarded_writes += 1;
        let applied = self.inner.write_if_leased(write)?;
        self.applied += usize::from(applied);
        Ok(applied)
    }
    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError> {
        self.inner.set_aside_rows(limit)
    }
    fn prune(&mut self, before: i64, limit: u32) -> Result<usize, QueueError> {
        self.inner.prune(before, limit)
    }
    fn advance_clock(&mut self, by: Duration) {
        self.inner.advance_clock(by);
    }
}

fn watched<D: Db>(db: &D, lagging: bool) -> Queue<Watched<D::S>> {
    let lagging = lagging.then_some(persevere::Instant::ZERO);
    Queue::new(Watched { inner: db.connect(), guarded_writes: 0, applied: 0, updates: 0, lagging })
}

fn q1_a_held_completion_is_one_guarded_write_and_reads_again_when_the_row_moved<D: Db>(db: &D) {
    let mut queue = watched(db, false);
    let first = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let second = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let v0 = queue.store().get(first.0).unwrap().unwrap().version;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    let store = queue.store();
    assert_eq!((store.guarded_writes, store.applied, store.updates), (1, 1, 0), "one statement, no read");
    let row = store.get(first.0).unwrap().unwrap();
    assert_eq!(row.version, v0 + 2, "the guarded write bumps the version too");
    let state: persevere_queue::TaskState = serde_json::from_str(&row.state).unwrap();
    assert!(matches!(state.status(), DeliveryStatus::Done(Terminal::Completed { attempt: 1 })));
    assert_eq!(queue.task(first).unwrap().terminal(), Some(&Terminal::Completed { attempt: 1 }));

    // Another writer moves the second task's row after the claim: the guarded write finds
    // another version, writes nothing, and the report reads the row and decides afresh.
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(job.id, second);
    db.interloper()(second.0);
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    let store = queue.store();
    assert_eq!((store.guarded_writes, store.applied, store.updates), (2, 1, 1));
    assert_eq!(queue.task(second).unwrap().terminal(), Some(&Terminal::Completed { attempt: 1 }));

    // A heartbeat keeps the job held: its completion needs no read either.
    let third = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.heartbeat(&job, None).unwrap();
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    let store = queue.store();
    assert_eq!(
        (store.guarded_writes, store.applied, store.updates),
        (3, 2, 2),
        "the heartbeat read, the completion did not"
    );
    assert_eq!(queue.task(third).unwrap().terminal(), Some(&Terminal::Completed { attempt: 1 }));
}

fn q2_the_guarded_write_checks_the_lease_on_the_database_clock<D: Db>(db: &D) {
    let mut queue = db.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    queue.claim("w", &["t"]).unwrap().unwrap();
    let row = queue.store().get(id.0).unwrap().unwrap();
    let write = Write {
        state: row.state.clone(),
        status: Status::Completed,
        due_at: None,
        attempt: 1,
        declined_by: String::new(),
    };
    let guarded = |version| GuardedWrite { id: id.0, version, write: write.clone(), delete: false };
    let store = queue.store();
    assert!(!store.write_if_leased(&guarded(row.version - 1)).unwrap(), "another version");
    // The 10 s start lease runs out on the database's clock.
    store.advance_clock(Duration::from_secs(11));
    assert!(!store.write_if_leased(&guarded(row.version)).unwrap(), "past the lease");
    assert_eq!(store.get(id.0).unwrap().unwrap(), row, "nothing was written");
    let mut fresh = db.queue();
    assert!(fresh.store().write_if_leased(&guarded(row.version)).unwrap(), "within the lease, at that version");
    let written = fresh.store().get(id.0).unwrap().unwrap();
    assert_eq!((written.version, written.state), (row.version + 1, row.state));
    let listed = fresh.store().list(Status::Completed, 10).unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [id.0], "its status column was written");

    // A running attempt: its heartbeat deadline is the lease.
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.heartbeat(&job, None).unwrap();
    let row = queue.store().get(id.0).unwrap().unwrap();
    queue.advance_clock(Duration::from_secs(31));
    let guarded = GuardedWrite { id: id.0, version: row.version, write, delete: false };
    assert!(!queue.store().write_if_leased(&guarded).unwrap(), "past the heartbeat deadline");
    assert_eq!(queue.store().get(id.0).unwrap().unwrap(), row, "nothing was written");
}

fn q2_a_held_completion_is_decided_on_the_database_clock_as_it_moves<D: Db>(db: &D) {
    // The estimate follows the database's clock, a test's advance of it included: a completion
    // 5 s into a 10 s lease still needs no read, and the state records it 5 s after the claim.
    let mut queue = watched(db, false);
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    let claimed_at = queue.task(id).unwrap().state.now();
    queue.advance_clock(Duration::from_secs(5));
    assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
    let store = queue.store();
    assert_eq!((store.guarded_writes, store.applied, store.updates), (1, 1, 0));
    let done_at = queue.task(id).unwrap().state.now();
    assert!(
        done_at >= claimed_at + Duration::from_secs(5) && done_at < job.deadline,
        "{claimed_at:?} + 5 s <= {done_at:?} < {:?}",
        job.deadline
    );
}

fn q2_a_completion_decided_on_a_lagging_estimate_is_not_written_past_the_lease<D: Db>(db: &D) {
    // The estimate stays at the claim's reading while the database's clock passes the lease:
    // the queue decides the completion is in time, the guarded write finds it is not, and the
    // report read on the database's clock interrupts the attempt and refuses it (D2, Q2).
    let mut queue = watched(db, true);
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.advance_clock(Duration::from_secs(11));
    assert!(queue.store().clock_estimate().unwrap() < job.deadline, "the estimate lags behind the lease");
    assert_eq!(refused(queue.complete(&job)), DeliveryError::StaleAttempt { current: 2, got: 1 });
    let store = queue.store();
    assert_eq!((store.guarded_writes, store.applied, store.updates), (1, 0, 1));
    let info = queue.task(id).unwrap();
    assert_eq!(info.status, Status::Pending);
    assert_eq!(info.retries_used(), 1, "the lease ran out: the attempt was interrupted");
}
