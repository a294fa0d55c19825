//! The one trait both databases implement: rows in, rows out.
//!
//! A store decides nothing (Q1): it reads the database's clock (Q2) in the statement that reads
//! a row, hands the row to the queue's `visit` closure (which runs the redelivery machine) and
//! writes back what the closure returns, guarded by the row's version: a write applies only if
//! the version it read is still the row's, and bumps it. That guard is what makes two writers
//! unable to both win; locks only spare them the wasted work. (A completion of a job the queue
//! holds reads nothing: [`Store::write_if_leased`] is guarded by the version the queue's own
//! last write left, and by the lease on the database's clock.)

use persevere::Instant;

use crate::{QueueError, Status};

/// What a claim does with one row it visits.
pub type ClaimVisit<'a> = dyn FnMut(Instant, &Row) -> Result<Visit, QueueError> + 'a;

/// What a report does with the one row it changes: a write, or `None` to leave it as it is.
pub type UpdateVisit<'a> = dyn FnMut(Instant, &Row) -> Result<Option<Write>, QueueError> + 'a;

/// A task's row as the store reads it.
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
    /// The task's `Delivery` state, as JSON; empty for a task no claim has visited yet, whose
    /// state is its policy's fresh one at `created_at` (so an enqueue needs no clock reading
    /// before its insert).
    pub state: String,
    /// Bumped by every write (compare-and-set, Q1).
    pub version: i64,
    /// The idempotency key given at enqueue, if any (Q5).
    pub key: Option<String>,
    /// When the task was enqueued: ns since 1970 on the database's clock (Q2).
    pub created_at: i64,
    /// When it next needs a claim or a sweep (ns since 1970 on the database's clock); `None`
    /// once it is finished.
    pub due_at: Option<i64>,
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
    /// The workers that declined the task, as the claim query matches them (see
    /// [`declined_marker`]): a claim for one of them skips the row in the query itself (Q10).
    pub declined_by: String,
}

/// How `worker` appears in a row's `declined_by` column: its name as a JSON string (quotes
/// included). The column concatenates the markers of the workers that declined the task, so
/// a claim skips the row when the column contains its worker's marker.
pub fn declined_marker(worker: &str) -> String {
    serde_json::to_string(worker).unwrap_or_default()
}

/// A new row. Its state is empty (see [`Row::state`]); the store sets `created_at` to the
/// database's clock and `due_at` to `delay_ns` later, or to `not_before` if that is later, in
/// the insert itself.
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
    /// Where a fresh task is ([`Status::Pending`]).
    pub status: Status,
    /// The attempt a fresh task is on (1).
    pub attempt: i64,
    /// How long after `created_at` it is due, in nanoseconds.
    pub delay_ns: i64,
    /// Not due before this instant (ns since 1970 on the database's clock; 0 for no bound).
    pub not_before: i64,
}

/// A write guarded by the version the writer last left and by the lease on the database's
/// clock: one row of [`Store::write_batch_if_leased`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuardedWrite {
    /// The task id.
    pub id: i64,
    /// The version the row must still have.
    pub version: i64,
    /// What to write.
    pub write: Write,
    /// The write finishes the task (completed, proceeded or diverted) and its queue keeps no
    /// finished rows ([`Queue::keep_finished`](crate::Queue::keep_finished)): the row is deleted,
    /// under the same guards, instead of written.
    pub delete: bool,
}

/// A row set aside as corrupt, read as text whatever its cells hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetAsideRow {
    /// The task id.
    pub id: i64,
    /// Its type.
    pub task_type: String,
    /// Its state as stored.
    pub state: String,
    /// Why it was set aside.
    pub reason: String,
}

/// Which rows a claim visits: always of the store's own queue (Q11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidates<'a> {
    /// Tasks of `types` that are due, and that `worker` did not decline (Q10): pending past
    /// their retry delay, or out past their lease or heartbeat deadline (an expired lease found
    /// by any worker, Q3).
    Due {
        /// The task types.
        types: &'a [&'a str],
        /// The claiming worker.
        worker: &'a str,
    },
    /// Tasks of any type that are out past their lease or heartbeat deadline, or out with a
    /// deadline more than an hour ahead ([`FAR_AHEAD_NS`]: the queue sets it aside if its policy
    /// allows no such lease), or unfinished with no due instant at all (repaired from its
    /// state). Rows edited by hand are found this way (Q10). A sweep.
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
    /// Set the row aside as [`Status::Corrupt`] with this reason, leaving its cells as they are
    /// for a person to read, and visit the next one (Q10).
    SetAside(String),
}

/// A database the queue keeps its tasks in: [`Sqlite`](crate::Sqlite) and
/// [`Postgres`](crate::Postgres).
///
/// The contract, for anyone writing another store:
/// - every write is guarded by the version read with the row and bumps it (Q1);
/// - `now` comes from the database's clock, read in the statement that reads the row (Q2);
/// - a claim is one transaction: the rows it visits are locked (or the whole store is) until
///   its writes commit, so two claims never hand out one attempt (Q3);
/// - an update either locks its row for the whole read-decide-write, or reads it unlocked and
///   writes with the version guard, reading and deciding again (calling `visit` again) when the
///   version moved, and returning [`QueueError::Conflict`] if it keeps moving (both stores here
///   do the latter).
pub trait Store {
    /// The database's clock (plus any [`advance_clock`](Self::advance_clock)), as an `Instant`
    /// in nanoseconds since 1970.
    fn now(&mut self) -> Result<Instant, QueueError>;

    /// Inserts a task, created now on the database's clock and due `delay_ns` later (both
    /// computed by the insert statement), and returns its id and `true`; when `key` names an
    /// existing task, inserts nothing and returns that task's id and `false` (Q5).
    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError>;

    /// Locks up to `limit` due `candidates` (skipping rows another transaction holds), oldest
    /// deadline first, and passes each to `visit` with the clock read in this transaction,
    /// writing what it returns, until it says stop. Returns how many rows were written.
    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError>;

    /// Reads task `id` (locked, or with the version guard on the write: see the contract),
    /// passes it to `visit` with the clock read with it and writes what it returns (nothing
    /// for `None`). Returns `false` if there is no such task.
    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError>;

    /// Task `id`, if it exists.
    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError>;

    /// Up to `limit` tasks in `status`, by id.
    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError>;

    /// This connection's latest reading of the database's clock, moved on by the time this
    /// machine's monotonic clock has counted since (never its wall clock). It is usually a
    /// little behind the database's clock (by the reading's trip back), up to a millisecond
    /// either way on SQLite (whose clock has millisecond precision), and further behind after
    /// the machine was suspended (the monotonic clock does not count that). `None` before any
    /// reading; the default, for a store that keeps none, which then decides every report on a
    /// fresh read.
    ///
    /// The queue decides a completion of a job it claimed at this estimate and writes it with
    /// [`write_if_leased`](Self::write_if_leased), which checks the lease on the database's
    /// own clock (Q2): one statement instead of a read and a write.
    fn clock_estimate(&self) -> Option<Instant> {
        None
    }

    /// Writes `write.write` over task `write.id` (or deletes it, if `write.delete`) if its
    /// version is still `write.version` and its lease or heartbeat deadline (`due_at`) is still
    /// ahead of the database's clock, in one statement that bumps the version (Q1) and sets
    /// `updated_at` from that clock; returns whether it applied. When it did not, the queue reads
    /// the row and decides again. The default applies nothing.
    fn write_if_leased(&mut self, write: &GuardedWrite) -> Result<bool, QueueError> {
        let _ = write;
        Ok(false)
    }

    /// Up to `limit` rows of this queue set aside as corrupt, by id (Q10).
    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError>;

    /// Deletes up to `limit` of this queue's completed, proceeded and diverted tasks last
    /// written before `finished_before_ns` (ns since 1970 on the database's clock); returns
    /// how many. Failed and dead-lettered tasks are kept for a person (Q6).
    fn prune(&mut self, finished_before_ns: i64, limit: u32) -> Result<usize, QueueError>;

    /// Inserts `inserts` in one transaction, all or none, each as [`insert`](Self::insert)
    /// would; returns each one's id and whether it was created, in order (a key given twice
    /// names the first). The default inserts them one by one (not atomically).
    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError> {
        inserts.iter().map(|insert| self.insert(insert)).collect()
    }

    /// [`write_if_leased`](Self::write_if_leased) for many rows, in one statement or
    /// transaction; returns whether each applied, in order. The default writes them one by one.
    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError> {
        writes.iter().map(|w| self.write_if_leased(w)).collect()
    }

    /// Rings `doorbell` whenever tasks may have become due that a claim would not otherwise
    /// find before its next poll (Q8): [`Sqlite`](crate::Sqlite) rings it after each insert
    /// into its queue in the same file from this process, [`Postgres`](crate::Postgres) on
    /// each `NOTIFY persevere_tasks` naming its queue that inserts send, heard on a connection
    /// of its own (replaced with backoff when it breaks; each new one rings once, for what it
    /// may have missed). A store keeps only a weak reference: what it started ends once the
    /// bell's last clone is gone. The default rings nothing (the runner then polls).
    ///
    /// # Errors
    /// When what listens cannot be started.
    fn listen(&mut self, doorbell: &crate::Doorbell) -> Result<(), QueueError> {
        let _ = doorbell;
        Ok(())
    }

    /// Moves this connection's reading of the database clock forward by `by`: for tests and
    /// simulations that must not sleep through leases and retry delays (feature
    /// `test-clock`). Every connection of one test must be moved alike; never in production.
    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: core::time::Duration);

    /// Another connection to the same queue, made as this one was (a test clock's skew
    /// included): a [`Runner`](crate::Runner) writes its results on it while this one claims.
    /// `None` when the store has no such thing: the default, and [`Sqlite`](crate::Sqlite),
    /// whose writers take turns anyway.
    fn connect_again(&self) -> Option<Result<Box<dyn Store + Send>, QueueError>> {
        None
    }
}

/// A boxed store is a store, so one program can choose its database at run time
/// (`Queue<Box<dyn Store + Send>>`).
impl<S: Store + ?Sized> Store for Box<S> {
    fn now(&mut self) -> Result<Instant, QueueError> {
        (**self).now()
    }
    fn connect_again(&self) -> Option<Result<Box<dyn Store + Send>, QueueError>> {
        (**self).connect_again()
    }
    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        (**self).insert(insert)
    }
    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError> {
        (**self).claim(candidates, limit, visit)
    }
    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError> {
        (**self).update(id, visit)
    }
    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        (**self).get(id)
    }
    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        (**self).list(status, limit)
    }
    fn clock_estimate(&self) -> Option<Instant> {
        (**self).clock_estimate()
    }
    fn write_if_leased(&mut self, write: &GuardedWrite) -> Result<bool, QueueError> {
        (**self).write_if_leased(write)
    }
    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError> {
        (**self).insert_batch(inserts)
    }
    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError> {
        (**self).set_aside_rows(limit)
    }
    fn prune(&mut self, finished_before_ns: i64, limit: u32) -> Result<usize, QueueError> {
        (**self).prune(finished_before_ns, limit)
    }
    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError> {
        (**self).write_batch_if_leased(writes)
    }
    fn listen(&mut self, doorbell: &crate::Doorbell) -> Result<(), QueueError> {
        (**self).listen(doorbell)
    }
    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: core::time::Duration) {
        (**self).advance_clock(by);
    }
}

/// How far ahead of the database's clock (in ns: an hour) a lease deadline may be before a
/// sweep looks at its row, to set it aside unless its policy allows so long a lease (Q10).
pub const FAR_AHEAD_NS: i64 = 3_600_000_000_000;

/// Nanoseconds since 1970 as an `Instant`.
pub(crate) fn instant_of(nanos: i64) -> Result<Instant, QueueError> {
    u64::try_from(nanos).map(Instant::from_nanos).map_err(|_| QueueError::Clock(nanos))
}

/// An `Instant` as nanoseconds since 1970 for a `BIGINT` column (saturating past 2262).
pub(crate) fn nanos_of(instant: Instant) -> i64 {
    i64::try_from(instant.as_nanos()).unwrap_or(i64::MAX)
}
