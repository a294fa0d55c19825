//! The embedded store: one SQLite file (or memory), nothing to start.

use core::time::Duration;
use std::path::{Path, PathBuf};

use persevere::Instant;
use std::sync::Arc;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, params};

use crate::crash;
use crate::shared::{ClockReading, Decided, ReadWithClock, check_queue_name, compare_and_set, skewed, visit_rows};
use crate::sqlite_file::{self, FairLock, Turn};
use crate::store::{
    Candidates, ClaimVisit, GuardedWrite, Insert, Row, SetAsideRow, Store, UpdateVisit, Write, declined_marker,
    instant_of,
};
use crate::{Doorbell, QueueError, Status, wake};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS persevere_tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    task_type TEXT NOT NULL,
    payload BLOB NOT NULL,
    policy TEXT NOT NULL,
    state TEXT NOT NULL,
    version INTEGER NOT NULL,
    status TEXT NOT NULL,
    due_at INTEGER,
    attempt INTEGER NOT NULL,
    idempotency_key TEXT,
    declined_by TEXT NOT NULL DEFAULT '',
    corrupt_reason TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    UNIQUE (queue, idempotency_key)
);
CREATE INDEX IF NOT EXISTS persevere_tasks_due ON persevere_tasks (queue, task_type, due_at);
CREATE INDEX IF NOT EXISTS persevere_tasks_status ON persevere_tasks (queue, status, due_at);
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
/// - An enqueue is one `INSERT` that reads the clock itself; once it commits it wakes the
///   runners of this process on the same queue and file ([`Store::listen`]).
///
/// Durability: `synchronous = FULL`, so every commit is on disk before it returns (a claim
/// survives a power cut, not only a killed process). `PRAGMA synchronous = NORMAL` through
/// [`connection`](Self::connection) trades the last commits before a power cut (never before
/// a process crash) for speed.
#[derive(Debug)]
pub struct Sqlite {
    conn: Connection,
    /// The queue's name (Q11): every statement reads and writes its rows only.
    queue: String,
    /// The turns of this process's writers of the file (none in memory).
    writers: Option<Arc<FairLock>>,
    skew: Duration,
    /// The latest clock reading of a claim or a report's read.
    clock: Option<ClockReading>,
    /// The file's canonical path, whose runners an insert wakes (Q8); `None` in memory.
    path: Option<PathBuf>,
}

/// How to open a SQLite queue: [`Sqlite::options`].
#[derive(Clone, Debug)]
pub struct SqliteOptions {
    queue: String,
    share: bool,
}

impl SqliteOptions {
    /// The queue's name (Q11; `"default"` unless set): queues of different names in one file
    /// never exchange tasks, and idempotency keys are unique within a queue.
    #[must_use]
    pub fn queue(mut self, name: impl Into<String>) -> Self {
        self.queue = name.into();
        self
    }

    /// Whether the queue may add its table to a database that already holds other tables
    /// (an application's own); without it such a file is refused, unchanged.
    #[must_use]
    pub fn share_database(mut self, share: bool) -> Self {
        self.share = share;
        self
    }

    /// Opens (creating if needed) the queue in the SQLite file at `path`.
    ///
    /// # Errors
    /// [`QueueError::QueueName`] for a bad name; [`QueueError::NotAQueue`], with the file left
    /// unchanged, for a file with two hard links, one that is not a SQLite database, a
    /// queue table made by an earlier version, or another application's database (unless
    /// [`share_database`](Self::share_database)); or when SQLite fails.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Sqlite, QueueError> {
        let path = path.as_ref();
        check_queue_name(&self.queue)?;
        sqlite_file::check(path, self.share)?;
        let conn = Connection::open(path)?;
        let writers = FairLock::of(path);
        let mut store = Sqlite::setup(conn, self.queue, Some(writers))?;
        store.path = std::fs::canonicalize(path).ok();
        Ok(store)
    }
}

impl Sqlite {
    /// Opens (creating if needed) the queue `"default"` in the SQLite file at `path`; see
    /// [`options`](Self::options) for a named queue, and for the files it refuses.
    ///
    /// # Errors
    /// As [`SqliteOptions::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Self, QueueError> {
        Self::options().open(path)
    }

    /// Options for opening a queue: its name, and whether it may share a database with other
    /// tables.
    ///
    /// ```
    /// # let path = std::env::temp_dir().join(format!("persevere-doc-options-{}.sqlite3", std::process::id()));
    /// use persevere_queue::Sqlite;
    /// let billing = Sqlite::options().queue("billing").open(&path)?;
    /// let email = Sqlite::options().queue("email").open(&path)?; // one file, two queues
    /// # drop((billing, email));
    /// # for suffix in ["", "-wal", "-shm"] { std::fs::remove_file(format!("{}{suffix}", path.display())).ok(); }
    /// # Ok::<(), persevere_queue::QueueError>(())
    /// ```
    pub fn options() -> SqliteOptions {
        SqliteOptions { queue: "default".to_owned(), share: false }
    }

    /// A queue in memory, for tests and examples: gone when this value drops, and not shared
    /// with any other connection.
    ///
    /// # Errors
    /// When SQLite cannot allocate it.
    pub fn in_memory() -> Result<Self, QueueError> {
        Self::setup(Connection::open_in_memory()?, "default".to_owned(), None)
    }

    fn setup(conn: Connection, queue: String, writers: Option<Arc<FairLock>>) -> Result<Self, QueueError> {
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(SCHEMA)?;
        Ok(Sqlite { conn, queue, writers, skew: Duration::ZERO, clock: None, path: None })
    }

    /// The queue's name.
    pub fn queue_name(&self) -> &str {
        &self.queue
    }

    /// The connection, for queries of your own and pragmas. Writing the queue's table by hand
    /// bypasses the redelivery machine.
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Rings the runners of this process on this file's queue (after an insert committed).
    fn wake_runners(&self) {
        if let Some(path) = &self.path {
            wake::files::ring(path, &self.queue);
        }
    }

    /// Waits for this store's turn among the process's writers of its file.
    fn turn(&self) -> Option<Turn<'_>> {
        self.writers.as_deref().map(FairLock::turn)
    }

    /// Task `id` and the clock, read in one statement (a report's read, in its own
    /// transaction).
    fn read_row(&mut self, id: i64) -> ReadWithClock {
        // The read and the write are each their own transaction (the version guard joins them).
        end_stray_transaction(&self.conn)?;
        let row = self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS}, {} FROM persevere_tasks WHERE id = ?1 AND queue = ?2",
                clock!()
            ))?
            .query_row(params![id, self.queue], |row| Ok((row.get::<_, i64>(9)?, row_of(row))))
            .optional()?;
        crash::statement();
        let Some((nanos, row)) = row else { return Ok(None) };
        let row = row.map_err(|(task, reason)| QueueError::BadRow { task: crate::TaskId(task), reason })?;
        let now = skewed(nanos, self.skew);
        self.clock = Some(ClockReading::new(now, self.skew));
        Ok(Some((now, row)))
    }
}

/// A write transaction (`BEGIN IMMEDIATE`, after this process's earlier writers of the file)
/// with cached `BEGIN` / `COMMIT` statements, rolled back when dropped uncommitted.
struct Tx<'c> {
    conn: &'c Connection,
    open: bool,
    _turn: Option<Turn<'c>>,
}

impl<'c> Tx<'c> {
    fn immediate(store: &'c Sqlite) -> Result<Self, QueueError> {
        let turn = store.turn();
        end_stray_transaction(&store.conn)?;
        store.conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
        crash::statement();
        Ok(Tx { conn: &store.conn, open: true, _turn: turn })
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

/// A row of `COLUMNS`, or its id and which cell does not decode (SQLite keeps any value in
/// any column: a hand edit or another program can write text where a number belongs). A
/// payload written as text is read as its bytes.
fn row_of(row: &rusqlite::Row<'_>) -> Result<Row, (i64, String)> {
    let id: i64 = row.get(0).map_err(|e| (0, format!("its id does not decode: {e}")))?;
    let cell = |e: rusqlite::Error| (id, format!("a cell does not decode: {e}"));
    let payload = match row.get_ref(2).map_err(cell)? {
        ValueRef::Blob(bytes) | ValueRef::Text(bytes) => bytes.to_vec(),
        other => return Err((id, format!("its payload is {:?}, not bytes", other.data_type()))),
    };
    Ok(Row {
        id,
        task_type: row.get(1).map_err(cell)?,
        payload,
        policy: row.get(3).map_err(cell)?,
        state: row.get(4).map_err(cell)?,
        version: row.get(5).map_err(cell)?,
        key: row.get(6).map_err(cell)?,
        created_at: row.get(7).map_err(cell)?,
        due_at: row.get(8).map_err(cell)?,
    })
}

/// Inserts one task into `queue` with a statement that reads the clock itself (`skew` is the
/// test-only skew); returns its id and `true`, or the id of the task that has its key and
/// `false`.
fn insert_row(conn: &Connection, queue: &str, insert: &Insert, skew: Duration) -> Result<(i64, bool), QueueError> {
    let inserted = conn
        .prepare_cached(&format!(
            "INSERT INTO persevere_tasks (queue, task_type, payload, policy, state, version, status, due_at, attempt,
             idempotency_key, created_at, updated_at)
             VALUES (?10, ?1, ?2, ?3, '', 0, ?4,
                     MAX(CASE WHEN {now} + ?8 > {MAX} - ?5 THEN {MAX} ELSE {now} + ?8 + ?5 END, ?9),
                     ?6, ?7, {now} + ?8, {now} + ?8)
             ON CONFLICT (queue, idempotency_key) DO NOTHING",
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
            insert.not_before,
            queue
        ])?;
    crash::statement();
    if inserted == 1 {
        return Ok((conn.last_insert_rowid(), true));
    }
    // The key exists (SQLite runs one writer at a time, so it is committed, or it is this
    // transaction's own).
    let id = conn
        .prepare_cached("SELECT id FROM persevere_tasks WHERE queue = ?1 AND idempotency_key = ?2")?
        .query_row(params![queue, insert.key], |row| row.get(0))?;
    crash::statement();
    Ok((id, false))
}

/// Writes a guarded write over its row (or deletes the row) if its version is still the one
/// guarded and its lease or heartbeat deadline is ahead of the database's clock (`skew` is the
/// test-only skew).
fn write_row_if_leased(conn: &Connection, guarded: &GuardedWrite, skew: Duration) -> Result<bool, QueueError> {
    let GuardedWrite { id, version, write, delete } = guarded;
    let changed = if *delete {
        conn.prepare_cached(&format!(
            "DELETE FROM persevere_tasks WHERE id = ?1 AND version = ?2 AND due_at > {now} + ?3",
            now = clock!()
        ))?
        .execute(params![id, version, skewed(0, skew)])?
    } else {
        conn.prepare_cached(&format!(
            "UPDATE persevere_tasks SET state = ?1, status = ?2, due_at = ?3, attempt = ?4, declined_by = ?8,
             version = version + 1, updated_at = {now} + ?5 WHERE id = ?6 AND version = ?7 AND due_at > {now} + ?5",
            now = clock!()
        ))?
        .execute(params![
            write.state,
            write.status.as_str(),
            write.due_at,
            write.attempt,
            skewed(0, skew),
            id,
            version,
            write.declined_by
        ])?
    };
    crash::statement();
    Ok(changed == 1)
}

/// Writes `write` over row `id` if its version is still `version`; `false` if it moved.
fn write_row(conn: &Connection, id: i64, version: i64, write: &Write, now: i64) -> Result<bool, QueueError> {
    let changed = conn
        .prepare_cached(
            "UPDATE persevere_tasks SET state = ?1, status = ?2, due_at = ?3, attempt = ?4, declined_by = ?8,
             version = version + 1, updated_at = ?5 WHERE id = ?6 AND version = ?7",
        )?
        .execute(params![
            write.state,
            write.status.as_str(),
            write.due_at,
            write.attempt,
            now,
            id,
            version,
            write.declined_by
        ])?;
    crash::statement();
    Ok(changed == 1)
}

/// Sets row `id` aside as corrupt with `reason`, leaving its other cells as they are (Q10).
fn set_aside(conn: &Connection, id: i64, reason: &str, now: i64) -> Result<(), QueueError> {
    conn.prepare_cached(
        "UPDATE persevere_tasks SET status = 'corrupt', due_at = NULL, corrupt_reason = ?1, version = version + 1,
         updated_at = ?2 WHERE id = ?3",
    )?
    .execute(params![reason, now, id])?;
    crash::statement();
    Ok(())
}

/// The rows `candidates` names in `queue`, due by `now`, oldest deadline first, at most
/// `limit`, decoded one at a time and passed to `visit` (the scan stops at its last job).
fn visit_candidates(
    tx: &Connection,
    queue: &str,
    candidates: Candidates<'_>,
    limit: u32,
    now: i64,
    visit: &mut ClaimVisit<'_>,
) -> Result<Vec<Decided>, QueueError> {
    let instant = instant_of(now)?;
    let mut statement;
    let mut rows = match candidates {
        Candidates::Due { types, worker } => {
            // The limit is part of the text: a bound `LIMIT` makes SQLite re-prepare the
            // statement at every bind. Tasks due at the same millisecond (the clock's
            // precision) go in the order they were enqueued: the index ends with the rowid.
            let marks = (1..=types.len()).map(|i| format!("?{}", i + 3)).collect::<Vec<_>>().join(", ");
            statement = tx.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM persevere_tasks WHERE queue = ?2 AND due_at <= ?1 AND task_type IN ({marks})
                 AND instr(declined_by, ?3) = 0 ORDER BY due_at, id LIMIT {limit}"
            ))?;
            let marker = declined_marker(worker);
            let values = [&now as &dyn rusqlite::ToSql, &queue, &marker]
                .into_iter()
                .chain(types.iter().map(|t| t as &dyn rusqlite::ToSql));
            statement.query(rusqlite::params_from_iter(values))?
        }
        Candidates::Expired => {
            statement = tx.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM persevere_tasks WHERE queue = ?2 AND status IN ('pending', 'handed_out', 'running')
                 AND (due_at IS NULL OR (status != 'pending' AND (due_at <= ?1 OR due_at > ?1 + {AHEAD})))
                 ORDER BY due_at, id LIMIT {limit}",
                AHEAD = crate::store::FAR_AHEAD_NS
            ))?;
            statement.query(params![now, queue])?
        }
    };
    crash::statement();
    let decoded = core::iter::from_fn(|| match rows.next() {
        Ok(Some(row)) => Some(Ok(row_of(row).map(|row| (instant, row)))),
        Ok(None) => None,
        Err(error) => Some(Err(error.into())),
    });
    visit_rows(decoded, visit)
}

impl Store for Sqlite {
    fn now(&mut self) -> Result<Instant, QueueError> {
        instant_of(clock(&self.conn, self.skew)?)
    }

    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        crash::begin("insert");
        let (id, created) = {
            let _turn = self.turn();
            end_stray_transaction(&self.conn)?;
            // One statement, its own transaction: the row appears whole or not at all.
            insert_row(&self.conn, &self.queue, insert, self.skew)?
        };
        if created {
            self.wake_runners();
        }
        Ok((id, created))
    }

    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError> {
        crash::begin("insert");
        let tx = Tx::immediate(self)?;
        let ids = inserts
            .iter()
            .map(|insert| insert_row(&tx, &self.queue, insert, self.skew))
            .collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        if ids.iter().any(|(_, created)| *created) {
            self.wake_runners();
        }
        Ok(ids)
    }

    fn listen(&mut self, doorbell: &Doorbell) -> Result<(), QueueError> {
        if let Some(path) = &self.path {
            wake::files::register(path, &self.queue, doorbell);
        }
        Ok(())
    }

    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError> {
        crash::begin("claim");
        let tx = Tx::immediate(self)?;
        let now = clock(&tx, self.skew)?;
        crash::statement();
        let decided = visit_candidates(&tx, &self.queue, candidates, limit, now, visit)?;
        if crash::split_claim() {
            // Deliberately broken (crash tests only): the state is written outside the claim's
            // transaction, unguarded.
            tx.commit()?;
            std::thread::sleep(Duration::from_millis(2));
            for decided in &decided {
                if let Decided::Write { id, write, .. } = decided {
                    self.conn.execute(
                        "UPDATE persevere_tasks SET state = ?1, status = ?2, due_at = ?3, attempt = ?4, version = version + 1 WHERE id = ?5",
                        params![write.state, write.status.as_str(), write.due_at, write.attempt, id],
                    )?;
                }
            }
            return Ok(decided.len());
        }
        for decided in &decided {
            match decided {
                // The transaction holds the database: no version can have moved.
                Decided::Write { id, version, write } => {
                    if !write_row(&tx, *id, *version, write, now)? {
                        return Err(QueueError::Conflict(crate::TaskId(*id)));
                    }
                }
                Decided::SetAside { id, reason } => set_aside(&tx, *id, reason, now)?,
            }
        }
        tx.commit()?;
        self.clock = Some(ClockReading::new(now, self.skew));
        Ok(decided.len())
    }

    fn clock_estimate(&self) -> Option<Instant> {
        self.clock?.estimate(self.skew)
    }

    fn write_if_leased(&mut self, write: &GuardedWrite) -> Result<bool, QueueError> {
        crash::begin("update");
        let _turn = self.turn();
        end_stray_transaction(&self.conn)?;
        write_row_if_leased(&self.conn, write, self.skew)
    }

    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError> {
        crash::begin("update");
        // One transaction: one commit (and one sync to disk) for the whole batch.
        let tx = Tx::immediate(self)?;
        let applied = writes.iter().map(|w| write_row_if_leased(&tx, w, self.skew)).collect::<Result<Vec<_>, _>>()?;
        tx.commit()?;
        Ok(applied)
    }

    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError> {
        crash::begin("update");
        compare_and_set(self, id, visit, Self::read_row, |store, row, write, now| {
            let _turn = store.turn();
            write_row(&store.conn, row.id, row.version, write, now)
        })
    }

    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        let row = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM persevere_tasks WHERE id = ?1 AND queue = ?2"))?
            .query_row(params![id, self.queue], |row| Ok(row_of(row)))
            .optional()?;
        row.transpose().map_err(|(task, reason)| QueueError::BadRow { task: crate::TaskId(task), reason })
    }

    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM persevere_tasks WHERE queue = ?2 AND status = ?1 ORDER BY id LIMIT {limit}"
        ))?;
        let rows = statement.query_map(params![status.as_str(), self.queue], |row| Ok(row_of(row)))?;
        rows.map(|row| row?.map_err(|(task, reason)| QueueError::BadRow { task: crate::TaskId(task), reason }))
            .collect()
    }

    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError> {
        let mut statement = self.conn.prepare_cached(&format!(
            "SELECT id, CAST(task_type AS TEXT), CAST(state AS TEXT), coalesce(corrupt_reason, '')
             FROM persevere_tasks WHERE queue = ?1 AND status = 'corrupt' ORDER BY id LIMIT {limit}"
        ))?;
        let rows = statement.query_map(params![self.queue], |row| {
            Ok(SetAsideRow { id: row.get(0)?, task_type: row.get(1)?, state: row.get(2)?, reason: row.get(3)? })
        })?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    fn prune(&mut self, finished_before_ns: i64, limit: u32) -> Result<usize, QueueError> {
        let _turn = self.turn();
        end_stray_transaction(&self.conn)?;
        let deleted = self
            .conn
            .prepare_cached(&format!(
                "DELETE FROM persevere_tasks WHERE id IN (SELECT id FROM persevere_tasks WHERE queue = ?1
                 AND status IN ('completed', 'proceeded', 'diverted') AND updated_at <= ?2 ORDER BY id LIMIT {limit})"
            ))?
            .execute(params![self.queue, finished_before_ns])?;
        Ok(deleted)
    }

    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: Duration) {
        self.skew = self.skew.saturating_add(by);
    }
}
