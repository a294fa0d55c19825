//! Q10 (no row blocks the others), Q11 (named queues) and retention, on SQLite and PostgreSQL
//! alike (see `common/mod.rs` for the latter). Every case of a bad row ends with the other
//! tasks running.

mod common;

use std::time::Duration;

use common::{Db, policy};
use persevere::{Backoff, DeliveryError, DeliveryPolicy, Failure, FailurePolicy, RetryPolicy};
use persevere_queue::{Handled, NewTask, Queue, QueueError, Status, Store, TaskId, Worker};
use serde_json::Value;

/// Enqueues `n` tasks of type `t`.
fn enqueue<S: Store>(queue: &mut Queue<S>, n: usize) -> Vec<TaskId> {
    (0..n).map(|i| queue.enqueue(NewTask::new("t", format!("good {i}"), policy(3))).unwrap().id).collect()
}

/// Claims and completes every due task of type `t`; returns their ids in order.
fn run_all<S: Store>(queue: &mut Queue<S>) -> Vec<TaskId> {
    let mut ran = Vec::new();
    while let Some(job) = queue.claim("runner", &["t"]).unwrap() {
        assert_eq!(queue.complete(&job).unwrap(), Status::Completed);
        ran.push(job.id);
    }
    ran
}

/// Rewrites task `id`'s stored state through `edit`, as a hand edit would (no version bump).
fn edit_state<D: Db>(db: &D, queue: &mut Queue<D::S>, id: TaskId, due_at: Option<i64>, edit: impl FnOnce(&mut Value)) {
    let row = queue.store().get(id.0).unwrap().unwrap();
    let mut state: Value = serde_json::from_str(&row.state).unwrap();
    edit(&mut state);
    let due = due_at.map_or("due_at".to_owned(), |at| at.to_string());
    db.execute(&format!(
        "UPDATE persevere_tasks SET state = '{}', due_at = {due} WHERE id = {}",
        serde_json::to_string(&state).unwrap().replace('\'', "''"),
        id.0
    ));
}

fn reason_of<S: Store>(queue: &mut Queue<S>, id: TaskId) -> String {
    let corrupt = queue.corrupt_tasks(100).unwrap();
    let task = corrupt.iter().find(|c| c.id == id).unwrap_or_else(|| panic!("{id} is not set aside: {corrupt:?}"));
    task.error.clone()
}

fn q10_rows_a_worker_declined_never_starve_its_claims<D: Db>(db: &D) {
    let mut producer = db.queue();
    // Seventeen tasks of a type worker-1 does not run, due before its own.
    let foreign: Vec<TaskId> =
        (0..17).map(|i| producer.enqueue(NewTask::new("other", format!("{i}"), policy(3))).unwrap().id).collect();
    let mine = enqueue(&mut producer, 3);
    // worker-1 restarts 17 times (a new queue each time, so it remembers nothing) and declines
    // one foreign task each time.
    for _ in 0..17 {
        let mut worker = Worker::new(db.queue(), "worker-1", &["other", "t"]);
        let worked =
            worker.work_one(|job, _| if job.task_type == "other" { Handled::Declined } else { Handled::Completed });
        assert_eq!(worked.unwrap().unwrap().handled, Handled::Declined);
    }
    let mut worker = Worker::new(db.queue(), "worker-1", &["other", "t"]);
    let mut ran = Vec::new();
    while let Some(worked) = worker.work_one(|_, _| Handled::Completed).unwrap() {
        ran.push(worked.id);
    }
    assert_eq!(ran, mine, "its own tasks, though 17 tasks it declined are due before them");
    // The declined tasks are still there for the others.
    let mut other = Worker::new(db.queue(), "worker-2", &["other"]);
    let mut theirs = Vec::new();
    while let Some(worked) = other.work_one(|_, _| Handled::Completed).unwrap() {
        theirs.push(worked.id);
    }
    assert_eq!(theirs, foreign);
}

fn q10_twenty_rows_that_do_not_load_are_set_aside_and_the_due_tasks_run<D: Db>(db: &D) {
    let mut queue = db.queue();
    let bad = enqueue(&mut queue, 20);
    let good = enqueue(&mut queue, 20);
    for id in &bad {
        db.execute(&format!("UPDATE persevere_tasks SET policy = 'not a policy' WHERE id = {}", id.0));
    }
    assert_eq!(run_all(&mut queue), good);
    let corrupt = queue.corrupt_tasks(100).unwrap();
    assert_eq!(corrupt.iter().map(|c| c.id).collect::<Vec<_>>(), bad);
    assert!(corrupt.iter().all(|c| c.error.contains("policy")), "{:?}", corrupt[0]);
}

fn q10_an_emptied_state_of_a_claimed_row_is_not_read_as_a_fresh_task<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids = enqueue(&mut queue, 2);
    let first = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!((first.id, first.attempt), (ids[0], 1));
    db.execute(&format!(
        "UPDATE persevere_tasks SET state = '', status = 'pending', due_at = 0 WHERE id = {}",
        ids[0].0
    ));
    // Attempt 1 is not handed out a second time (D2): the row is set aside.
    assert_eq!(run_all(&mut queue), [ids[1]]);
    let reason = reason_of(&mut queue, ids[0]);
    assert!(reason.contains("state is empty"), "{reason}");
}

fn q10_a_lease_in_the_year_2200_is_set_aside_by_a_sweep<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids = enqueue(&mut queue, 2);
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    let year_2200: i64 = 7_258_118_400_000_000_000;
    edit_state(db, &mut queue, job.id, Some(year_2200), |state| {
        state["state"]["HandedOut"]["deadline"] = Value::from(year_2200);
    });
    assert_eq!(queue.sweep(10).unwrap(), 1, "the sweep meets the far lease");
    let reason = reason_of(&mut queue, ids[0]);
    assert!(reason.contains("start lease"), "{reason}");
    assert_eq!(run_all(&mut queue), [ids[1]]);
    // A lease its policy allows is left alone, however long.
    let long = DeliveryPolicy::builder(
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(2).build().unwrap(),
    )
    .start_timeout(Duration::from_secs(3 * 3600))
    .build()
    .unwrap();
    let id = queue.enqueue(NewTask::new("t", "long", long)).unwrap().id;
    queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.sweep(10).unwrap(), 0);
    assert_eq!(queue.task(id).unwrap().status, Status::HandedOut);
}

fn q10_instants_far_ahead_of_the_database_clock_are_refused_on_load<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids = enqueue(&mut queue, 2);
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.fail(&job, Failure::retryable("once".into())).unwrap();
    // The machine's own clock moved a day ahead: time never runs backwards inside a machine, so
    // it would act a day late on everything.
    let day_ahead = queue.store().now().unwrap().as_nanos() + 86_400 * 1_000_000_000;
    edit_state(db, &mut queue, ids[0], None, |state| state["last_now"] = Value::from(day_ahead));
    assert_eq!(run_all(&mut queue), [ids[1]]);
    let reason = reason_of(&mut queue, ids[0]);
    assert!(reason.contains("last input"), "{reason}");
}

fn q10_a_pending_row_with_no_due_instant_is_repaired_by_a_sweep<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids = enqueue(&mut queue, 2);
    db.execute(&format!("UPDATE persevere_tasks SET due_at = NULL WHERE id = {}", ids[0].0));
    assert_eq!(run_all(&mut queue), [ids[1]], "no claim sees it");
    assert_eq!(queue.sweep(10).unwrap(), 1);
    assert!(queue.task(ids[0]).unwrap().due_at.is_some());
    assert_eq!(run_all(&mut queue), [ids[0]], "repaired, it runs");
}

fn q10_attempt_numbers_never_saturate_into_reuse<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids = enqueue(&mut queue, 2);
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.fail(&job, Failure::retryable("once".into())).unwrap();
    edit_state(db, &mut queue, ids[0], None, |state| {
        state["state"]["Pending"]["attempt"] = Value::from(u64::MAX);
        state["retry"]["engine"]["attempt"] = Value::from(u64::MAX);
    });
    assert_eq!(run_all(&mut queue), [ids[1]]);
    let reason = reason_of(&mut queue, ids[0]);
    assert!(reason.contains("attempt number"), "{reason}");
}

fn q10_a_created_at_before_1970_is_set_aside_with_its_own_reason<D: Db>(db: &D) {
    let mut queue = db.queue();
    let ids = enqueue(&mut queue, 2);
    db.execute(&format!("UPDATE persevere_tasks SET created_at = -5 WHERE id = {}", ids[0].0));
    assert_eq!(run_all(&mut queue), [ids[1]]);
    let reason = reason_of(&mut queue, ids[0]);
    assert!(reason.contains("created_at is -5 ns since 1970"), "{reason}");
    assert!(!reason.contains("clock reads"), "not blamed on the database's clock: {reason}");
}

fn q10_a_lease_lost_to_waiting_is_counted_not_an_error<D: Db>(db: &D) {
    let mut queue = db.queue();
    enqueue(&mut queue, 1);
    let mut worker = Worker::new(db.queue(), "slow", &["t"]);
    let mut thief = db.queue();
    let worked = worker
        .work_one(|_, _| {
            // While the handler runs, its lease runs out and another worker takes attempt 2.
            thief.advance_clock(Duration::from_secs(11));
            thief.claim("thief", &["t"]).unwrap().unwrap();
            Handled::Completed
        })
        .expect("a lost lease does not end the worker's loop")
        .unwrap();
    assert_eq!(worked.refused, Some(DeliveryError::StaleAttempt { current: 2, got: 1 }));
    assert_eq!(worked.status, Status::HandedOut, "attempt 2 is the thief's");
    assert_eq!(worker.work_one(|_, _| Handled::Completed).unwrap(), None, "and the worker goes on");
}

fn q11_two_named_queues_on_one_database_never_exchange_tasks<D: Db>(db: &D) {
    let (mut billing, mut email) = (named(db, "billing"), named(db, "email"));
    let bill = billing.enqueue(NewTask::new("send", "invoice", policy(3)).key("k")).unwrap();
    let mail = email.enqueue(NewTask::new("send", "welcome", policy(3)).key("k")).unwrap();
    assert!(bill.created && mail.created, "an idempotency key is unique within its queue");
    assert_ne!(bill.id, mail.id);
    assert!(matches!(billing.task(mail.id), Err(QueueError::UnknownTask(_))));
    let from_email: Vec<TaskId> = std::iter::from_fn(|| email.claim("w", &["send"]).unwrap().map(|j| j.id)).collect();
    assert_eq!(from_email, [mail.id]);
    let job = billing.claim("w", &["send"]).unwrap().unwrap();
    assert_eq!((job.id, job.payload.as_slice()), (bill.id, &b"invoice"[..]));
    assert_eq!(billing.tasks(Status::HandedOut, 10).unwrap().len(), 1);
    // A sweep of one queue leaves the other's expired leases alone.
    email.advance_clock(Duration::from_secs(11));
    assert_eq!(email.sweep(10).unwrap(), 1, "only its own");
    assert_eq!(billing.task(bill.id).unwrap().status, Status::HandedOut);
    assert!(matches!(named_or_error(db, "no spaces"), Err(QueueError::QueueName(_))));
}

fn retention_prunes_finished_tasks_and_keeps_what_a_person_must_see<D: Db>(db: &D) {
    let mut queue = db.queue();
    let done = enqueue(&mut queue, 3);
    run_all(&mut queue);
    let failing = DeliveryPolicy::builder(
        RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(1).build().unwrap(),
    )
    .max_redeliveries(0)
    .on_failure(FailurePolicy::Fail)
    .build()
    .unwrap()
    .map_route(|()| String::new());
    let failed = queue.enqueue(NewTask::new("t", "fails", failing.clone())).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.fail(&job, Failure::fatal("no".into())).unwrap(), Status::Failed);
    let letter = queue.enqueue(NewTask::new("t", "declined", failing)).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.decline(&job).unwrap(), Status::DeadLettered);
    assert_eq!(queue.prune(Duration::from_secs(60), 100).unwrap(), 0, "finished less than a minute ago");
    queue.advance_clock(Duration::from_secs(61));
    assert_eq!(queue.prune(Duration::from_secs(60), 2).unwrap(), 2, "at most the limit");
    assert_eq!(queue.prune(Duration::from_secs(60), 100).unwrap(), 1);
    for id in done {
        assert!(matches!(queue.task(id), Err(QueueError::UnknownTask(_))));
    }
    assert_eq!(queue.task(failed).unwrap().status, Status::Failed);
    assert_eq!(queue.task(letter).unwrap().status, Status::DeadLettered);
}

on_both_stores!(
    q10_rows_a_worker_declined_never_starve_its_claims,
    q10_twenty_rows_that_do_not_load_are_set_aside_and_the_due_tasks_run,
    q10_an_emptied_state_of_a_claimed_row_is_not_read_as_a_fresh_task,
    q10_a_lease_in_the_year_2200_is_set_aside_by_a_sweep,
    q10_instants_far_ahead_of_the_database_clock_are_refused_on_load,
    q10_a_pending_row_with_no_due_instant_is_repaired_by_a_sweep,
    q10_attempt_numbers_never_saturate_into_reuse,
    q10_a_created_at_before_1970_is_set_aside_with_its_own_reason,
    q10_a_lease_lost_to_waiting_is_counted_not_an_error,
    q11_two_named_queues_on_one_database_never_exchange_tasks,
    retention_prunes_finished_tasks_and_keeps_what_a_person_must_see,
);

/// A queue named `name` on `db`'s database.
fn named<D: Db>(db: &D, name: &str) -> Queue<Box<dyn Store + Send>> {
    named_or_error(db, name).unwrap()
}

fn named_or_error<D: Db>(db: &D, name: &str) -> Result<Queue<Box<dyn Store + Send>>, QueueError> {
    db.named(name).map(Queue::new)
}

/// What only SQLite can hold or do: any value in any cell, files of other kinds, hard links,
/// and its writers' turns.
mod sqlite_only {
    use super::*;
    use persevere_queue::Sqlite;

    #[test]
    fn q10_text_in_a_number_cell_is_set_aside_and_a_text_payload_is_read_as_its_bytes() {
        let db = common::sqlite("q10_text_cells");
        let mut queue = db.queue();
        let ids = enqueue(&mut queue, 3);
        // What a hand fix with `sqlite3`, or a producer in another language, writes.
        db.execute(&format!("UPDATE persevere_tasks SET version = 'seven' WHERE id = {}", ids[0].0));
        db.execute(&format!("UPDATE persevere_tasks SET payload = 'plain text' WHERE id = {}", ids[1].0));
        let first = queue.claim("w", &["t"]).unwrap().unwrap();
        assert_eq!((first.id, first.payload.as_slice()), (ids[1], &b"plain text"[..]));
        queue.complete(&first).unwrap();
        assert_eq!(run_all(&mut queue), [ids[2]]);
        let reason = reason_of(&mut queue, ids[0]);
        assert!(reason.contains("does not decode"), "{reason}");
    }

    /// The file's bytes and the names beside it (a `-wal` or `-shm` appears if SQLite wrote).
    fn snapshot(path: &std::path::Path) -> (Vec<u8>, bool, bool) {
        let beside = |suffix: &str| std::path::Path::new(&format!("{}{suffix}", path.display())).exists();
        (std::fs::read(path).unwrap(), beside("-wal"), beside("-shm"))
    }

    #[test]
    fn q10_open_refuses_a_file_that_is_not_its_queue_without_writing_to_it() {
        let dir = std::env::temp_dir().join(format!("persevere-q10-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Not a database at all.
        let text = dir.join("notes.txt");
        std::fs::write(&text, "shopping list\n").unwrap();
        let before = snapshot(&text);
        let error = Sqlite::open(&text).unwrap_err();
        assert!(error.to_string().contains("not a SQLite database"), "{error}");
        assert_eq!(snapshot(&text), before);
        // Another application's database: refused unchanged unless sharing is asked for.
        let app = dir.join("app.sqlite3");
        let _ = std::fs::remove_file(&app);
        rusqlite::Connection::open(&app).unwrap().execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY)").unwrap();
        let before = snapshot(&app);
        let error = Sqlite::open(&app).unwrap_err();
        assert!(error.to_string().contains("another application's tables (users)"), "{error}");
        assert_eq!(snapshot(&app), before, "not switched to WAL, no table added");
        let mut shared = Queue::new(Sqlite::options().share_database(true).open(&app).unwrap());
        shared.enqueue(NewTask::new("t", "p", policy(1))).unwrap();
        // A table an earlier version made.
        let old = dir.join("old.sqlite3");
        let _ = std::fs::remove_file(&old);
        rusqlite::Connection::open(&old)
            .unwrap()
            .execute_batch("CREATE TABLE persevere_tasks (id INTEGER PRIMARY KEY, task_type TEXT)")
            .unwrap();
        let before = snapshot(&old);
        let error = Sqlite::open(&old).unwrap_err();
        assert!(error.to_string().contains("earlier version"), "{error}");
        assert_eq!(snapshot(&old), before);
        // A queue file with a second name.
        let queue_file = dir.join("queue.sqlite3");
        let _ = std::fs::remove_file(&queue_file);
        drop(Sqlite::open(&queue_file).unwrap());
        let link = dir.join("queue-link.sqlite3");
        let _ = std::fs::remove_file(&link);
        std::fs::hard_link(&queue_file, &link).unwrap();
        let error = Sqlite::open(&link).unwrap_err();
        assert!(error.to_string().contains("2 hard links"), "{error}");
        assert!(Sqlite::open(&queue_file).is_err(), "by either name");
        std::fs::remove_file(&link).unwrap();
        assert!(Sqlite::open(&queue_file).is_ok(), "one name again: fine");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn q10_sixteen_workers_on_one_file_lose_no_lease_to_waiting() {
        const TASKS: usize = 4000;
        let db = common::sqlite("q10_fair_turns");
        let mut producer = db.queue();
        // A short start lease: a worker kept waiting for the write lock past 300 ms loses its job.
        let policy = DeliveryPolicy::builder(
            RetryPolicy::builder(Backoff::constant(Duration::ZERO).build().unwrap()).max_attempts(3).build().unwrap(),
        )
        .start_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
        let tasks: Vec<NewTask> = (0..TASKS).map(|i| NewTask::new("t", format!("{i}"), policy)).collect();
        producer.enqueue_batch(tasks).unwrap();
        let started = std::time::Instant::now();
        let (worked, lost): (usize, usize) = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..16)
                .map(|w| {
                    let mut worker = Worker::new(db.queue(), format!("w{w}"), &["t"]);
                    scope.spawn(move || {
                        let (mut worked, mut lost) = (0, 0);
                        while let Some(done) = worker.work_one(|_, _| Handled::Completed).unwrap() {
                            worked += 1;
                            lost += usize::from(done.refused.is_some());
                        }
                        (worked, lost)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
        });
        println!("16 workers ran {TASKS} tasks in {:.1?}", started.elapsed());
        assert_eq!(lost, 0, "no lease was lost to waiting");
        assert_eq!(worked, TASKS);
        let completed = producer.tasks(Status::Completed, 10_000).unwrap();
        assert_eq!(completed.len(), TASKS);
        assert!(completed.iter().all(|t| t.retries_used() == 0), "no attempt was interrupted");
    }
}

/// Q9: an error shows the database's own message, not only its kind.
#[cfg(feature = "postgres")]
#[test]
fn q9_a_postgres_error_shows_the_servers_own_message() {
    let Some(db) = common::postgres("q9_messages") else { return };
    // A key given twice: the last wins.
    let missing = format!("{} dbname=no_such_database", db.params);
    let error = persevere_queue::Postgres::connect(&missing).unwrap_err().to_string();
    assert!(error.contains("database \"no_such_database\" does not exist"), "{error}");
    let mut queue = db.queue();
    // A key past what a btree index row holds (text that does not compress).
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let key: String = (0..2000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            format!("{:08x}", seed as u32)
        })
        .collect();
    let error = queue.enqueue(NewTask::new("t", "p", policy(1)).key(key)).unwrap_err().to_string();
    assert!(error.contains("index row") && error.contains("maximum size"), "{error}");
    db.execute("ALTER TABLE persevere_tasks RENAME COLUMN task_type TO kind");
    let error = queue.claim("w", &["t"]).unwrap_err().to_string();
    assert!(error.contains("column t.task_type does not exist"), "{error}");
}

#[test]
fn q9_a_sqlite_error_shows_its_own_message() {
    let db = common::sqlite("q9_messages");
    let mut queue = db.queue();
    db.execute("ALTER TABLE persevere_tasks RENAME COLUMN task_type TO kind");
    let error = queue.enqueue(NewTask::new("t", "p", policy(1))).unwrap_err().to_string();
    assert!(error.contains("task_type"), "{error}");
}
