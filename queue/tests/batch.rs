//! Q7, batches: a claim of many due attempts in one transaction, results written together,
//! and a batch enqueue, on SQLite and PostgreSQL alike (see `common/mod.rs` for the latter).

mod common;

use std::time::Duration;

use common::{Db, policy};
use persevere::{DeliveryError, Failure};
use persevere_queue::{Handled, NewTask, QueueError, Status, TaskId};

fn q7_a_batch_claim_leases_up_to_n_due_attempts_oldest_first<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids: Vec<TaskId> =
        (0..10).map(|i| queue.enqueue(NewTask::new("t", format!("{i}"), policy(3))).unwrap().id).collect();
    queue.enqueue(NewTask::new("other", "x", policy(3))).unwrap();
    let first = queue.claim_batch("w", &["t"], 4).unwrap();
    assert_eq!(first.iter().map(|j| j.id).collect::<Vec<_>>(), ids[..4], "the four oldest, in order");
    assert!(first.iter().all(|j| j.attempt == 1 && j.worker == "w"));
    for job in &first {
        assert_eq!(queue.task(job.id).unwrap().status, Status::HandedOut, "written before the claim returned");
    }
    let rest = queue.claim_batch("w2", &["t"], 100).unwrap();
    assert_eq!(rest.iter().map(|j| j.id).collect::<Vec<_>>(), ids[4..], "the others, and no task of another type");
    assert!(queue.claim_batch("w3", &["t"], 100).unwrap().is_empty(), "every attempt is out");
    assert!(queue.claim_batch("w3", &["other"], 0).unwrap().is_empty(), "a batch of none claims nothing");
}

fn q7_each_task_of_a_batch_is_decided_as_one_is<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids: Vec<TaskId> = (0..3).map(|_| queue.enqueue(NewTask::new("t", "p", policy(2))).unwrap().id).collect();
    // The middle task's first attempt is lost: its lease runs out, and the batch that meets it
    // interrupts it (a retry used, D2) and hands out attempt 2.
    let lost = queue.claim("w1", &["t"]).unwrap().unwrap();
    assert_eq!(lost.id, ids[0]);
    queue.advance_clock(Duration::from_secs(11));
    let batch = queue.claim_batch("w2", &["t"], 10).unwrap();
    let claimed: Vec<(TaskId, u64)> = batch.iter().map(|j| (j.id, j.attempt)).collect();
    // Oldest deadline first: the lost lease ran out 10 s after the others were due.
    assert_eq!(claimed, [(ids[1], 1), (ids[2], 1), (ids[0], 2)]);
    assert_eq!(queue.task(ids[0]).unwrap().retries_used(), 1);
    assert_eq!(refused(queue.complete(&lost)), DeliveryError::StaleAttempt { got: 1, current: 2 });
}

fn q7_a_batch_of_results_is_written_together_and_each_refusal_is_its_own<D: Db>(db: &D) {
    let (mut queue, mut other) = (db.queue(), db.queue());
    let ids: Vec<TaskId> = (0..5).map(|_| queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id).collect();
    let jobs = queue.claim_batch("w", &["t"], 5).unwrap();
    // Job 0 is lost meanwhile: another worker, whose clock reads 11 s later, finds its lease
    // run out and runs attempt 2.
    other.advance_clock(Duration::from_secs(11));
    let taken = other.claim("w2", &["t"]).unwrap().unwrap();
    assert_eq!((taken.id, taken.attempt), (ids[0], 2));
    let reports = vec![
        (jobs[0].clone(), Handled::Completed),
        (jobs[1].clone(), Handled::Failed(Failure::retryable("boom".into()))),
        (jobs[2].clone(), Handled::Completed),
        (jobs[3].clone(), Handled::Declined),
    ];
    let results = queue.report_batch(&reports).unwrap();
    assert_eq!(results.len(), 4);
    assert!(
        matches!(&results[0], Err(QueueError::Refused { task, error: DeliveryError::StaleAttempt { got: 1, current: 2 } }) if *task == ids[0]),
        "{:?}",
        results[0]
    );
    assert_eq!(results[1].as_ref().unwrap(), &Status::Pending);
    assert_eq!(results[2].as_ref().unwrap(), &Status::Completed);
    assert_eq!(results[3].as_ref().unwrap(), &Status::Pending, "a decline is a free return");
    assert_eq!(queue.task(ids[0]).unwrap().status, Status::HandedOut, "still w2's");
    assert_eq!(queue.task(ids[1]).unwrap().retries_used(), 1);
    assert_eq!(queue.task(ids[2]).unwrap().status, Status::Completed);
    assert_eq!(queue.task(ids[3]).unwrap().redeliveries(), 1);
    // Job 4, never reported, is an interrupted attempt once its lease runs out (D2).
    queue.advance_clock(Duration::from_secs(11));
    assert_eq!(queue.sweep(10).unwrap(), 1, "job 4's lease");
    assert_eq!(queue.task(ids[4]).unwrap().retries_used(), 1);
}

fn q7_results_of_jobs_the_queue_holds_take_one_statement<D: Db>(db: &D) {
    let mut queue = db.queue();
    for _ in 0..20 {
        queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    }
    let jobs = queue.claim_batch("w", &["t"], 20).unwrap();
    let reports: Vec<_> = jobs.into_iter().map(|j| (j, Handled::Completed)).collect();
    let results = queue.report_batch(&reports).unwrap();
    assert!(results.iter().all(|r| matches!(r, Ok(Status::Completed))), "{results:?}");
    assert_eq!(queue.tasks(Status::Completed, 100).unwrap().len(), 20);
}

fn q7_a_hand_back_is_free_and_an_interruption_uses_a_retry<D: Db>(db: &D) {
    let mut queue = db.queue();
    let (a, b) = (
        queue.enqueue(NewTask::new("t", "a", policy(3))).unwrap().id,
        queue.enqueue(NewTask::new("t", "b", policy(3))).unwrap().id,
    );
    let jobs = queue.claim_batch("w", &["t"], 2).unwrap();
    assert_eq!(queue.hand_back(&jobs[0]).unwrap(), Status::Pending);
    queue.heartbeat(&jobs[1], None).unwrap();
    assert_eq!(refused(queue.hand_back(&jobs[1])), DeliveryError::AlreadyStarted { attempt: 1 });
    assert_eq!(queue.interrupt(&jobs[1]).unwrap(), Status::Pending);
    let (a, b) = (queue.task(a).unwrap(), queue.task(b).unwrap());
    assert_eq!((a.attempt(), a.retries_used(), a.redeliveries()), (1, 0, 1), "a free return");
    assert_eq!((b.attempt(), b.retries_used(), b.redeliveries()), (2, 1, 0), "an interruption");
    let again = queue.claim_batch("w", &["t"], 2).unwrap();
    assert_eq!(again.iter().map(|j| j.attempt).collect::<Vec<_>>(), [1, 2]);
}

fn q7_a_batch_enqueue_returns_each_task_in_order_and_keys_name_one_task<D: Db>(db: &D) {
    let mut queue = db.queue();
    let existing = queue.enqueue(NewTask::new("t", "old", policy(3)).key("k-old")).unwrap().id;
    let enqueued = queue
        .enqueue_batch(vec![
            NewTask::new("t", "0", policy(3)),
            NewTask::new("t", "1", policy(3)).key("k-new"),
            NewTask::new("t", "2", policy(3)).key("k-old"),
            NewTask::new("t", "3", policy(3)),
            NewTask::new("t", "4", policy(3)).key("k-new"),
        ])
        .unwrap();
    let created: Vec<bool> = enqueued.iter().map(|e| e.created).collect();
    assert_eq!(created, [true, true, false, true, false]);
    assert_eq!(enqueued[2].id, existing);
    assert_eq!(enqueued[4].id, enqueued[1].id, "a key repeated in the batch names its first task");
    for (index, payload) in [(0, "0"), (1, "1"), (3, "3")] {
        assert_eq!(queue.task(enqueued[index].id).unwrap().payload, payload.as_bytes(), "task {index}");
    }
    let claimed: Vec<TaskId> = queue.claim_batch("w", &["t"], 10).unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(claimed, [existing, enqueued[0].id, enqueued[1].id, enqueued[3].id], "in the batch's order");
    assert!(queue.enqueue_batch(Vec::new()).unwrap().is_empty());
}

fn q7_a_batch_enqueue_that_fails_adds_nothing<D: Db>(db: &D) {
    let mut queue = db.queue();
    // A trigger refuses one task type, as a constraint of the application's might.
    if std::any::type_name::<D>().contains("Sqlite") {
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON persevere_tasks WHEN NEW.task_type = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poison refused'); END;",
        );
    } else {
        db.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN IF NEW.task_type = 'poison' THEN RAISE EXCEPTION 'poison refused'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON persevere_tasks FOR EACH ROW EXECUTE FUNCTION refuse();",
        );
    }
    let batch = vec![
        NewTask::new("t", "a", policy(3)),
        NewTask::new("poison", "b", policy(3)),
        NewTask::new("t", "c", policy(3)),
    ];
    let error = queue.enqueue_batch(batch).unwrap_err();
    assert!(error.to_string().contains("poison refused"), "the database's own message: {error}");
    assert!(queue.claim_batch("w", &["t"], 10).unwrap().is_empty(), "none of the batch was added");
}

fn q6_without_kept_finished_rows_a_completion_deletes_its_row_and_a_failure_stays<D: Db>(db: &D) {
    let mut queue = db.queue();
    queue.keep_finished(false);
    let ids: Vec<TaskId> =
        (0..5).map(|i| queue.enqueue(NewTask::new("t", "p", policy(1)).key(format!("k{i}"))).unwrap().id).collect();
    let jobs = queue.claim_batch("w", &["t"], 5).unwrap();
    let reports = vec![
        (jobs[0].clone(), Handled::Completed),
        (jobs[1].clone(), Handled::Failed(Failure::retryable("last".into()))),
        (jobs[2].clone(), Handled::Completed),
    ];
    let results = queue.report_batch(&reports).unwrap();
    assert_eq!(
        results.into_iter().collect::<Result<Vec<_>, _>>().unwrap(),
        [Status::Completed, Status::Failed, Status::Completed]
    );
    assert!(matches!(queue.task(ids[0]), Err(QueueError::UnknownTask(_))), "deleted with its completion");
    assert!(matches!(queue.task(ids[2]), Err(QueueError::UnknownTask(_))));
    assert_eq!(queue.task(ids[1]).unwrap().status, Status::Failed, "kept for a person (Q6)");
    // One at a time, likewise.
    assert_eq!(queue.complete(&jobs[3]).unwrap(), Status::Completed);
    assert!(matches!(queue.task(ids[3]), Err(QueueError::UnknownTask(_))));
    // A completion refused by its guard deletes nothing: job 4's lease ran out and another
    // worker holds attempt 2.
    let mut other = db.queue();
    other.advance_clock(Duration::from_secs(11));
    let taken = other.claim("w2", &["t"]).unwrap();
    assert!(taken.is_none(), "one attempt only: the lease that ran out ended it");
    assert!(matches!(
        refused(queue.complete(&jobs[4])),
        DeliveryError::StaleAttempt { .. } | DeliveryError::Finished(_)
    ));
    assert_eq!(queue.task(ids[4]).unwrap().status, Status::Failed);
    // A deleted task's key is free again.
    assert!(queue.enqueue(NewTask::new("t", "p", policy(1)).key("k0")).unwrap().created);
    assert!(!queue.enqueue(NewTask::new("t", "p", policy(1)).key("k1")).unwrap().created);
}

fn refused(result: Result<impl std::fmt::Debug, QueueError>) -> DeliveryError {
    match result {
        Err(QueueError::Refused { error, .. }) => error,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

on_both_stores!(
    q7_a_batch_claim_leases_up_to_n_due_attempts_oldest_first,
    q7_each_task_of_a_batch_is_decided_as_one_is,
    q7_a_batch_of_results_is_written_together_and_each_refusal_is_its_own,
    q7_results_of_jobs_the_queue_holds_take_one_statement,
    q7_a_hand_back_is_free_and_an_interruption_uses_a_retry,
    q7_a_batch_enqueue_returns_each_task_in_order_and_keys_name_one_task,
    q7_a_batch_enqueue_that_fails_adds_nothing,
    q6_without_kept_finished_rows_a_completion_deletes_its_row_and_a_failure_stays,
);
