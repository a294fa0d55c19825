//! The PostgreSQL table's layout: a policy is stored once however many tasks use it, and a
//! table made by an earlier version (each row holding its policy's text, and indexes over every
//! row) is brought up to date at `connect` and goes on running its tasks.
//!
//! ```text
//! PERSEVERE_PG_URL=... cargo test -p persevere-queue --features postgres,sqlite --test schema
//! ```

mod common;

use common::{Db, policy};
use persevere::Failure;
use persevere_queue::{NewTask, Queue, Status};

fn count(db: &common::PgDb, sql: &str) -> i64 {
    let mut client = postgres::Client::connect(&db.params, postgres::NoTls).unwrap();
    client.query_one(sql, &[]).unwrap().get(0)
}

#[test]
fn a_policy_is_stored_once_for_all_the_tasks_that_use_it() {
    let Some(db) = common::postgres("schema_policies") else { return };
    let mut queue = db.queue();
    for i in 0..10 {
        queue.enqueue(NewTask::new("t", format!("{i}"), policy(3))).unwrap();
    }
    let batch = (0..10).map(|i| NewTask::new("t", format!("b{i}"), policy(if i % 2 == 0 { 3 } else { 4 }))).collect();
    queue.enqueue_batch(batch).unwrap();
    // Another connection finds the stored policies rather than storing them again.
    let mut other = db.queue();
    other.enqueue(NewTask::new("t", "other", policy(4))).unwrap();
    assert_eq!(count(&db, "SELECT count(*) FROM persevere_policies"), 2);
    assert_eq!(count(&db, "SELECT count(*) FROM persevere_tasks WHERE policy IS NULL AND policy_id IS NOT NULL"), 21);
    // Each task runs under its own policy: 3 attempts or 4.
    let mut attempts = Vec::new();
    while let Some(job) = queue.claim("w", &["t"]).unwrap() {
        let status = queue.fail(&job, Failure::retryable("no".to_owned())).unwrap();
        if status != Status::Pending {
            attempts.push(job.attempt);
        }
    }
    attempts.sort_unstable();
    assert_eq!(attempts, [[3; 15].as_slice(), &[4; 6]].concat());
}

/// The table as persevere-queue made it before policies were stored once.
const EARLIER_TABLE: &str = "
CREATE TABLE persevere_tasks (
    id BIGSERIAL PRIMARY KEY, queue TEXT NOT NULL, task_type TEXT NOT NULL, payload BYTEA NOT NULL,
    policy TEXT NOT NULL, state TEXT NOT NULL, version BIGINT NOT NULL, status TEXT NOT NULL, due_at BIGINT,
    attempt BIGINT NOT NULL, idempotency_key TEXT, declined_by TEXT NOT NULL DEFAULT '', corrupt_reason TEXT,
    created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, UNIQUE (queue, idempotency_key)
);
CREATE INDEX persevere_tasks_due_order ON persevere_tasks (queue, task_type, due_at, id);
CREATE INDEX persevere_tasks_status_order ON persevere_tasks (queue, status, due_at, id);
";

#[test]
fn a_table_of_an_earlier_version_is_brought_up_to_date_and_its_tasks_run() {
    let Some(db) = common::postgres("schema_earlier") else { return };
    db.execute(EARLIER_TABLE);
    let text = serde_json::to_string(&policy(2)).unwrap();
    db.execute(&format!(
        "INSERT INTO persevere_tasks (queue, task_type, payload, policy, state, version, status, due_at, attempt,
         idempotency_key, created_at, updated_at)
         VALUES ('default', 't', 'old', '{text}', '', 0, 'pending', 0, 1, 'k', 0, 0)"
    ));
    let mut queue = Queue::new(db.connect());
    let indexes = "SELECT count(*) FROM pg_indexes WHERE tablename = 'persevere_tasks' AND indexname LIKE '%_order'";
    assert_eq!(count(&db, indexes), 0, "the indexes over every row are gone");
    // The key of the earlier row still makes an enqueue with it happen once (Q5).
    assert!(!queue.enqueue(NewTask::new("t", "new", policy(5)).key("k")).unwrap().created);
    queue.enqueue(NewTask::new("t", "new", policy(5))).unwrap();
    // The earlier row runs under its own policy: two attempts.
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(job.payload, b"old");
    assert_eq!(queue.fail(&job, Failure::retryable("no".to_owned())).unwrap(), Status::Pending);
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(job.payload, b"new");
    queue.complete(&job).unwrap();
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!((job.payload.as_slice(), job.attempt), (b"old".as_slice(), 2));
    assert_eq!(queue.fail(&job, Failure::retryable("no".to_owned())).unwrap(), Status::Failed);
    // A second connect finds it up to date.
    drop(db.connect());
}
