//! The one trait both databases implement: rows in, rows out, inside one transaction each.
//!
//! A store decides nothing (Q1): it reads the database's clock (Q2), locks the rows a claim or
//! a report touches, hands each to the queue's `visit` closure (which runs the redelivery
//! machine) and writes back what the closure returns, guarded by the row's version, in the same
//! transaction.

use core::time::Duration;

use persevere::Instant;

use crate::{QueueError, Status};

/// What a claim does with one row it visits.
pub type ClaimVisit<'a> = dyn FnMut(Instant, &Row) -> Result<Visit, QueueError> + 'a;

/// What a report does with the one row it changes: a write, or `None` to leave it as it is.
pub type UpdateVisit<'a> = dyn FnMut(Instant, &Row) -> Result<Option<Write>, QueueError> + 'a;

/// A task's row as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The task id.
    pub id: i64,
    /// The task type workers claim by.
    pub task_type: String,
    /// The payload, as enqueued.
    pub payload: Vec<u8>,
    /// The task's `DeliveryPolicy`, as JSON.
    pub policy: String,
    /// The task's `Delivery` state, as JSON.
    pub state: String,
    /// Bumped by every write (compare-and-set, Q1).
    pub version: i64,
    /// The idempotency key given at enqueue, if any (Q5).
    pub key: Option<String>,
}

/// What a write puts in a row besides the state: the columns the queries and the claim index
/// read, all derived from the state by the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The new state, as JSON.
    pub state: String,
    /// Where the task now is.
    pub status: Status,
    /// When the task next needs a claim or a sweep (ns since 1970 on the database's clock);
    /// `None` once it is finished.
    pub due_at: Option<i64>,
    /// The attempt number it is on.
    pub attempt: i64,
}

/// A new row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Insert {
    /// The task type.
    pub task_type: String,
    /// The payload.
    pub payload: Vec<u8>,
    /// The policy, as JSON.
    pub policy: String,
    /// The idempotency key, if any (Q5).
    pub key: Option<String>,
    /// The state and the derived columns.
    pub write: Write,
}

/// Which rows a claim visits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidates<'a> {
    /// Tasks of these types that are due: pending past their retry delay, or out past their
    /// lease or heartbeat deadline (an expired lease found by any worker, Q3).
    Due(&'a [&'a str]),
    /// Tasks of any type that are out past their lease or heartbeat deadline (a sweep).
    Expired,
}

/// What the queue made of one visited row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Visit {
    /// Leave it as it is and visit the next one.
    Skip,
    /// Write this and visit the next one.
    Write(Write),
    /// Write this and stop: the claim got its job.
    WriteAndStop(Write),
}

/// A database the queue keeps its tasks in: [`Sqlite`](crate::Sqlite) and
/// [`Postgres`](crate::Postgres). Every method is one transaction.
pub trait Store {
    /// The database's clock (plus any [`advance_clock`](Self::advance_clock)), as an `Instant`
    /// in nanoseconds since 1970.
    fn now(&mut self) -> Result<Instant, QueueError>;

    /// Inserts a task built by `make` from the database's clock and returns its id and `true`;
    /// when `key` names an existing task, inserts nothing and returns that task's id and
    /// `false` (Q5).
    fn insert(&mut self, make: &mut dyn FnMut(Instant) -> Insert) -> Result<(i64, bool), QueueError>;

    /// Locks up to `limit` due `candidates` (skipping rows another transaction holds), oldest
    /// deadline first, and passes each to `visit` with the clock read in this transaction,
    /// writing what it returns, until it says stop. Returns how many rows were written.
    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError>;

    /// Locks task `id`, passes it to `visit` with the clock read in this transaction and
    /// writes what it returns (nothing for `None`). Returns `false` if there is no such task.
    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError>;

    /// Task `id`, if it exists.
    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError>;

    /// Up to `limit` tasks in `status`, by id.
    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError>;

    /// Moves this connection's reading of the database clock forward by `by`: for tests and
    /// simulations that must not sleep through leases and retry delays. Every connection of
    /// one test must be moved alike.
    fn advance_clock(&mut self, by: Duration);
}

/// Nanoseconds since 1970 as an `Instant`.
pub(crate) fn instant_of(nanos: i64) -> Result<Instant, QueueError> {
    u64::try_from(nanos).map(Instant::from_nanos).map_err(|_| QueueError::Clock(nanos))
}

/// An `Instant` as nanoseconds since 1970 for a `BIGINT` column (saturating past 2262).
pub(crate) fn nanos_of(instant: Instant) -> i64 {
    i64::try_from(instant.as_nanos()).unwrap_or(i64::MAX)
}

/// The clock reading plus the skew, saturating.
pub(crate) fn skewed(nanos: i64, skew: Duration) -> i64 {
    nanos.saturating_add(i64::try_from(skew.as_nanos()).unwrap_or(i64::MAX))
}

/// A write a claim decided on: the row, the version it read, and what to write.
pub(crate) type Decided = (i64, i64, Write);

/// Passes `rows` (each with the clock reading of its statement) to `visit` in order until it
/// claims one; returns the writes it asked for.
pub(crate) fn visit_rows(
    rows: impl Iterator<Item = Result<(Instant, Row), QueueError>>,
    visit: &mut ClaimVisit<'_>,
) -> Result<Vec<Decided>, QueueError> {
    let mut writes = Vec::new();
    for row in rows {
        let (now, row) = row?;
        match visit(now, &row)? {
            Visit::Skip => {}
            Visit::Write(write) => writes.push((row.id, row.version, write)),
            Visit::WriteAndStop(write) => {
                writes.push((row.id, row.version, write));
                break;
            }
        }
    }
    Ok(writes)
}
