//! The embedded store: one SQLite file (or memory), nothing to start.

use core::time::Duration;
use std::path::Path;

use persevere::Instant;
use rusqlite::{Connection, OptionalExtension, params};

use crate::crash;
use crate::shared::{ClockReading, ReadWithClock, compare_and_set, skewed, visit_rows};
use crate::store::{Candidates, ClaimVisit, GuardedWrite, Insert, Row, Store, UpdateVisit, Write, instant_of};
use crate::{QueueError, Status};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS persevere_tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_type TEXT NOT NULL,
    payload BLOB NOT NULL,
    policy TEXT NOT NULL,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    status TEXT NOT NULL,
    due_at INTEGER,
    attempt INTEGER NOT NULL,
    idempotency_key TEXT UNIQUE,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS persevere_tasks_due ON persevere_tasks (task_type, due_at);
CREATE INDEX IF NOT EXISTS persevere_tasks_status ON persevere_tasks (status, due_at);
";
// The indexes are not partial: a partial index whose condition a bound `due_at` must imply
// makes SQLite re-prepare the statement at every bind.

/// The clock in nanoseconds since 1970, at millisecond precision (SQLite's `julianday('now')`
/// has no more), the same for every use within one statement.
macro_rules! clock {
    () => {
        "(CAST(round((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000000)"
    };
}

const NOW: &str = concat!("SELECT ", clock!());

const COLUMNS: &str = "id, task_type, payload, policy, state, version, idempotency_key, created_at, due_at";

/// The SQLite store: one connection. Open one per worker thread or process on the same file;
/// SQLite serialises their writes and the file is in WAL mode, so readers never wait.
///
/// - A claim is one `BEGIN IMMEDIATE` transaction (Q3): it holds the database from its select
///   to its commit, so two claims never hand out one attempt.
/// - A report reads its task (and the clock) and writes it back with one `UPDATE` guarded by
///   the version it read (compare-and-set, Q1), reading and deciding again if another writer
///   moved it: the database is held only for that `UPDATE`. The completion of a job its queue
///   claimed skips the read ([`Store::write_if_leased`]).
/// - An enqueue is one `INSERT` that reads the clock itself.
///
/// Durability: `synchronous = FULL`, so every commit is on disk before it returns (a claim
/// survives a power cut, not only a killed process). `PRAGMA synchronous = NORMAL` through
/// [`connection`](Self::connection) trades the last commits before a power cut (never before
/// a process crash) for speed.
#[derive(Debug)]
pub struct Sqlite {
    conn: Connection,
    skew: Duration,
    /// The latest clock reading of a claim or a report's read.
    clock: Option<ClockReading>,
}

impl Sqlite {
    /// Opens (creating if needed) the queue in the SQLite file at `path`.
    ///
    /// # Errors
    /// When the file cannot be opened or its schema created.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, QueueError> {
        Self::setup(Connection::open(path)?)
    }

    /// A queue in memory, for tests and examples: gone when this value drops, and not shared
    /// with any other connection.
    ///
    /// # Errors
    /// When SQLite cannot allocate it.
    pub fn in_memory() -> Result<Self, QueueError> {
        Self::setup(Connection::open_in_memory()?)
    }

    fn setup(conn: Connection) -> Result<Self, QueueError> {
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        Ok(Sqlite { conn, skew: Duration::ZERO, clock: None })
    }

    /// The connection, for queries of your own and pragmas. Writing the queue's table by hand
    /// bypasses the redelivery machine.
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Task `id` and the clock, read in one statement (a report's read, in its own
    /// transaction).
    fn read_row(&mut self, id: i64) -> ReadWithClock {
        // The read and the write are each their own transaction (the version guard joins them).
        end_stray_transaction(&self.conn)?;
        let row = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS}, {} FROM persevere_tasks WHERE id = ?1", clock!()))?
            .query_row([id], |row| Ok((row.get::<_, i64>(9)?, row_of(row)?)))
            .optional()?;
        crash::statement();
        let read = row.map(|(nanos, row)| (skewed(nanos, self.skew), row));
        if let Some((now, _)) = &read {
            self.clock = Some(ClockReading::new(*now, self.skew));
        }
        Ok(read)
    }
}

/// A write transaction (`BEGIN IMMEDIATE`) with cached `BEGIN` / `COMMIT` statements, rolled
/// back when dropped uncommitted.
struct Tx<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> Tx<'c> {
    fn immediate(conn: &'c Connection) -> Result<Self, QueueError> {
        end_stray_transaction(conn)?;
        conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        crash::statement();
        Ok(Tx { conn, open: true })
    }

    fn commit(mut self) -> Result<(), QueueError> {
        self.conn.prepare_cached("COMMIT")?.execute([])?;
        self.open = false;
        crash::statement();
        Ok(())
    }
}

impl core::ops::Deref for Tx<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.prepare_cached("ROLLBACK").and_then(|mut rollback| rollback.execute([]));
        }
    }
}

/// Ends a transaction left open (a failed rollback, or one begun by hand through
/// [`Sqlite::connection`]) rather than run the queue's statements inside it, where a later
/// rollback would silently undo them.
fn end_stray_transaction(conn: &Connection) -> Result<(), QueueError> {
    if !conn.is_autocommit() {
        conn.prepare_cached("ROLLBACK")?.execute([])?;
    }
    Ok(())
}

fn clock(conn: &Connection, skew: Duration) -> Result<i64, QueueError> {
    let nanos: i64 = conn.prepare_cached(NOW)?.query_row([], |row| row.get(0))?;
    Ok(skewed(nanos, skew))
}

fn row_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        id: row.get(0)?,
        task_type: row.get(1)?,
        payload: row.get(2)?,
        policy: row.get(3)?,
        state: row.get(4)?,
        version: row.get(5)?,
        key: row.get(6)?,
        created_at: row.get(7)?,
        due_at: row.get(8)?,
    })
}

/// Inserts one task with a statement that reads the clock itself (`skew` is the test-only
/// skew); returns its id and `true`, or the id of the task that has its key and `false`.
fn insert_row(conn: &Connection, insert: &Insert, skew: Duration) -> Result<(i64, bool), QueueError> {
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO persevere_tasks (task_type, payload, policy, state, version, status, due_at, attempt,
             idempotency_key, created_at, updated_at)
             VALUES (?1, ?2, ?3, '', 0, ?4,
                     MAX(CASE WHEN {now} + ?8 > {MAX} - ?5 THEN {MAX} ELSE {now} + ?8 + ?5 END, ?9),
                     ?6, ?7, {now} + ?8, {now} + ?8)
             ON CONFLICT (idempotency_key) DO NOTHING",
            now = clock!(),
            MAX = i64::MAX
        ))?
        .execute(params![
            insert.task_type,
            insert.payload,
            insert.policy,
            insert.status.as_str(),
            insert.delay_ns,
            insert.attempt,
            insert.key,
            skewed(0, skew),
            insert.not_before
        ])?;
    crash::statement();
    if inserted == 1 {
        return Ok((conn.last_insert_rowid(), true));
    }
    // The key exists (SQLite runs one writer at a time, so it is committed, or it is this
    // transaction's own).
    let id = conn
        .prepare_cached("SELECT id FROM persevere_tasks WHERE idempotency_key = ?1")?
        .query_row([&insert.key], |row| row.get(0))?;
    crash::statement();
    Ok((id, false))
}

/// Writes `write` over row `id` if its version is still `version` and its lease or heartbeat
/// deadline is ahead of the database's clock (`skew` is the test-only skew).
fn write_row_if_leased(
    conn: &Connection,
    id: i64,
    version: i64,
    write: &Write,
    skew: Duration,
) -> Result<bool, QueueError> {
    let changed = conn
        .prepare_cached(&format!(
            "UPDATE persevere_tasks SET state = ?1, status = ?2, due_at = ?3, attempt = ?4, version = version + 1,
             updated_at = {now} + ?5 WHERE id = ?6 AND version = ?7 AND due_at > {now} + ?5",
            now = clock!()
        ))?
        .execute(params![
            write.state,
            write.status.as_str(),
            write.due_at,
            write.attempt,
            skewed(0, skew),
            id,
            version
        ])?;
    crash::statement();
    Ok(changed == 1)
}

/// Writes `write` over row `id` if its version is still `version`; `false` if it moved.
fn write_row(conn: &Connection, id: i64, version: i64, write: &Write, now: i64) -> Result<bool, QueueError> {
    let changed = conn
        .prepare_cached(
            "UPDATE persevere_tasks SET state = ?1, status = ?2, due_at = ?3, attempt = ?4, version = version + 1,
             updated_at = ?5 WHERE id = ?6 AND version = ?7",
        )?
        .execute(params![write.state, write.status.as_str(), write.due_at, write.attempt, now, id, version])?;
    crash::statement();
    Ok(changed == 1)
}

impl Store for Sqlite {
    fn now(&mut self) -> Result<Instant, QueueError> {
        instant_of(clock(&self.conn, self.skew)?)
    }

    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        crash::begin("insert");
        end_stray_transaction(&self.conn)?;
        // One statement, its own transaction: the row appears whole or not at all.
        insert_row(&self.conn, insert, self.skew)
    }

    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError> {
        crash::begin("insert");
        let tx = Tx::immediate(&self.conn)?;
        let ids = inserts.iter().map(|insert| insert_row(&tx, insert, self.skew)).collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(ids)
    }

    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError> {
        crash::begin("claim");
        let tx = Tx::immediate(&self.conn)?;
        let now = clock(&tx, self.skew)?;
        crash::statement();
        let instant = instant_of(now)?;
        self.clock = Some(ClockReading::new(now, self.skew));
        // Rows are decoded one at a time and the scan stops at the claimed one; the writes
        // follow once the scan is closed.
        let writes;
        {
            let mut statement;
            let mut rows = match candidates {
                Candidates::Due(types) => {
                    // The limit is part of the text: a bound `LIMIT` makes SQLite re-prepare the
                    // statement at every bind. Tasks due at the same millisecond (the clock's
                    // precision) go in the order they were enqueued: the index ends with the rowid.
                    let marks = (1..=types.len()).map(|i| format!("?{}", i + 1)).collect::<Vec<_>>().join(", ");
                    statement = tx.prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM persevere_tasks WHERE due_at <= ?1 AND task_type IN ({marks})
                         ORDER BY due_at, id LIMIT {limit}"
                    ))?;
                    let values = core::iter::once(&now as &dyn rusqlite::ToSql)
                        .chain(types.iter().map(|t| t as &dyn rusqlite::ToSql));
                    statement.query(rusqlite::params_from_iter(values))?
                }
                Candidates::Expired => {
                    statement = tx.prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM persevere_tasks WHERE status IN ('handed_out', 'running') AND due_at <= ?1
                         ORDER BY due_at, id LIMIT {limit}"
                    ))?;
                    statement.query(params![now])?
                }
            };
            crash::statement();
            let decoded = core::iter::from_fn(|| match rows.next() {
                Ok(Some(row)) => Some(row_of(row).map(|row| (instant, row)).map_err(QueueError::from)),
                Ok(None) => None,
                Err(error) => Some(Err(error.into())),
            });
            writes = visit_rows(decoded, visit)?;
        }
        if crash::split_claim() {
            // Deliberately broken (crash tests only): the state is written outside the claim's
            // transaction, unguarded.
            tx.commit()?;
            std::thread::sleep(Duration::from_millis(2));
            for (id, _, write) in &writes {
                self.conn.execute(
                    "UPDATE persevere_tasks SET state = ?1, status = ?2, due_at = ?3, attempt = ?4, version = version + 1 WHERE id = ?5",
                    params![write.state, write.status.as_str(), write.due_at, write.attempt, id],
                )?;
            }
            return Ok(writes.len());
        }
        for (id, version, write) in &writes {
            // The transaction holds the database: no version can have moved.
            if !write_row(&tx, *id, *version, write, now)? {
                return Err(QueueError::Conflict(crate::TaskId(*id)));
            }
        }
        tx.commit()?;
        Ok(writes.len())
    }

    fn clock_estimate(&self) -> Option<Instant> {
        self.clock?.estimate(self.skew)
    }

    fn write_if_leased(&mut self, id: i64, version: i64, write: &Write) -> Result<bool, QueueError> {
        crash::begin("update");
        end_stray_transaction(&self.conn)?;
        write_row_if_leased(&self.conn, id, version, write, self.skew)
    }

    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError> {
        crash::begin("update");
        // One transaction: one commit (and one sync to disk) for the whole batch.
        let tx = Tx::immediate(&self.conn)?;
        let applied = writes
            .iter()
            .map(|w| write_row_if_leased(&tx, w.id, w.version, &w.write, self.skew))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(applied)
    }

    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError> {
        crash::begin("update");
        compare_and_set(self, id, visit, Self::read_row, |store, row, write, now| {
            write_row(&store.conn, row.id, row.version, write, now)
        })
    }

    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        Ok(self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM persevere_tasks WHERE id = ?1"))?
            .query_row([id], row_of)
            .optional()?)
    }

    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM persevere_tasks WHERE status = ?1 ORDER BY id LIMIT {limit}"
        ))?;
        let rows = statement.query_map(params![status.as_str()], row_of)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: Duration) {
        self.skew = self.skew.saturating_add(by);
    }
}
