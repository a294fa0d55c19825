//! The shared store: PostgreSQL, for workers on many machines. This file holds its SQL, run on
//! one connection (`Session`); `reconnect.rs` makes that the [`Store`](crate::Store), with
//! recovery (Q9).

mod reconnect;

use core::future::Future;
use core::time::Duration;
use std::collections::HashMap;

use persevere::Instant;
use tokio_postgres::{Client, Statement};

use crate::crash;
use crate::shared::{ClockReading, Decided, ReadWithClock, check_queue_name, skewed, visit_rows};
use crate::store::{
    Candidates, ClaimVisit, GuardedWrite, Insert, Row, SetAsideRow, Write, declined_marker, instant_of,
};
use crate::{QueueError, Status};
use reconnect::{Recovery, Session};

mod listen;
mod policies;

const TABLES: &str = "
CREATE TABLE IF NOT EXISTS persevere_policies (
    id BIGSERIAL PRIMARY KEY,
    policy TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS persevere_policies_text ON persevere_policies (md5(policy));
CREATE TABLE IF NOT EXISTS persevere_tasks (
    id BIGSERIAL PRIMARY KEY,
    queue TEXT NOT NULL,
    task_type TEXT NOT NULL,
    payload BYTEA NOT NULL,
    policy TEXT,
    policy_id BIGINT,
    state TEXT NOT NULL,
    version BIGINT NOT NULL,
    status TEXT NOT NULL,
    due_at BIGINT,
    attempt BIGINT NOT NULL,
    idempotency_key TEXT,
    declined_by TEXT NOT NULL DEFAULT '',
    corrupt_reason TEXT,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);
";

/// The indexes of [`TABLES`], created once a table made by an earlier version is known to have
/// their columns.
const INDEXES: &str = "
CREATE UNIQUE INDEX IF NOT EXISTS persevere_tasks_key ON persevere_tasks (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS persevere_tasks_due ON persevere_tasks (queue, task_type, due_at, id)
    WHERE due_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS persevere_tasks_status ON persevere_tasks (queue, status, due_at, id)
    WHERE status NOT IN ('completed', 'proceeded', 'diverted');
CREATE INDEX IF NOT EXISTS persevere_tasks_finished ON persevere_tasks (queue, updated_at, id)
    WHERE status IN ('completed', 'proceeded', 'diverted');
";
// What the table and its indexes cost is what a task costs: every write of a row writes the
// whole row again and an entry in each index whose condition it meets (no write can be a HOT
// update: each one moves `due_at` or `status`). So:
// - a policy, the same for most tasks, is stored once in `persevere_policies` and named by its
//   id (`policy` on a task's row is for rows of earlier versions, and for a hand edit: it wins
//   over the id);
// - the indexes hold only the rows their queries look for: `due` the claims', `status` the
//   sweeps' and the lists' of tasks not finished well (their statuses are written into the
//   statements, so that the planner can use it), `finished` the prunes'. A claimed task's write
//   adds to three (the primary key, `due` and `status`), a completion's to two (the primary
//   key and `finished`), and a key only indexes tasks that have one.
// The indexes that order by `due_at` end with the id: tasks due at the same microsecond (the
// clock's precision) are claimed in the order they were enqueued, by an ordered index scan with
// no sort.

/// Brings a table made by 0.x versions before the policies table up to date (run when its
/// `policy_id` column is missing): its rows keep their policy text, and the indexes of every
/// row give way to the ones above.
const MIGRATE_POLICIES: &str = "
ALTER TABLE persevere_tasks ADD COLUMN IF NOT EXISTS policy_id BIGINT, ALTER COLUMN policy DROP NOT NULL;
DROP INDEX IF EXISTS persevere_tasks_due_order;
DROP INDEX IF EXISTS persevere_tasks_status_order;
";

const REQUIRED_COLUMNS: &str = "ARRAY['queue', 'declined_by', 'corrupt_reason']";

/// How many of `columns` (an SQL array of names) the queue's table lacks.
fn missing_columns(columns: &str) -> String {
    format!(
        "SELECT count(*) FROM unnest({columns}) AS required(name) WHERE NOT EXISTS
         (SELECT 1 FROM information_schema.columns WHERE table_name = 'persevere_tasks'
          AND table_schema = current_schema() AND column_name = required.name)"
    )
}

/// The clock in nanoseconds since 1970 (at microsecond precision): the server's
/// `statement_timestamp()` (Q2), which is stable within a statement, so a bound written with it
/// can use an index. `$1` is the connection's skew (`Store::advance_clock`, tests only).
const CLOCK: &str = "((extract(epoch FROM statement_timestamp()) * 1000000)::bigint * 1000 + $1::bigint)";

const COLUMNS: &str =
    "t.id, t.task_type, t.payload, coalesce(t.policy, p.policy), t.state, t.version, t.idempotency_key,
     t.created_at, t.due_at";

/// The tasks, as `t`, with their policies (a row's own text wins over its id: see [`TABLES`]).
const TASKS: &str = "persevere_tasks t LEFT JOIN persevere_policies p ON p.id = t.policy_id";

/// The channel an insert notifies, with its queue's name as the payload, at its commit: every
/// connection that ran `LISTEN persevere_tasks` hears it ([`Store::listen`]).
const NOTIFY_CHANNEL: &str = "persevere_tasks";

/// The column of the clock reading in a select of `COLUMNS` and the clock.
const CLOCK_COLUMN: usize = 9;

/// Prepared statements kept per connection (one per distinct text: sweeps with many limits
/// would otherwise accumulate them).
const MAX_STATEMENTS: usize = 64;

const WRITE: &str = "UPDATE persevere_tasks SET state = $1, status = $2, due_at = $3, attempt = $4, declined_by = $8,
     version = version + 1, updated_at = $5 WHERE id = $6 AND version = $7";

/// [`WRITE`] for a report decided on the clock estimate: only while the lease or heartbeat
/// deadline is ahead of the database's clock (`$1` is the skew).
static WRITE_IF_LEASED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE persevere_tasks SET state = $2, status = $3, due_at = $4, attempt = $5, declined_by = $8,
         version = version + 1, updated_at = {CLOCK} WHERE id = $6 AND version = $7 AND due_at > {CLOCK}"
    )
});

/// [`WRITE_IF_LEASED`]'s delete, for a write that finishes the task when the queue keeps no
/// finished rows (`$1` is the skew, `$2` the id, `$3` the version).
static DELETE_IF_LEASED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("DELETE FROM persevere_tasks WHERE id = $2 AND version = $3 AND due_at > {CLOCK}")
});

/// Many guarded writes in one statement, as [`WRITE_MANY`] with the lease guard, but the rows
/// whose `$9` is true are deleted (under the same guards) instead of written. Returns the ids
/// written or deleted.
static WRITE_OR_DELETE_MANY_IF_LEASED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "WITH v AS (SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[],
                                        $7::bigint[], $8::text[], $9::bool[])
                    AS v(id, version, state, status, due_at, attempt, declined_by, forget)),
         gone AS (DELETE FROM persevere_tasks AS t USING v
                  WHERE v.forget AND t.id = v.id AND t.version = v.version AND t.due_at > {CLOCK} RETURNING t.id),
         kept AS (UPDATE persevere_tasks AS t SET state = v.state, status = v.status, due_at = v.due_at,
                  attempt = v.attempt, declined_by = v.declined_by, version = t.version + 1, updated_at = {CLOCK}
                  FROM v WHERE NOT v.forget AND t.id = v.id AND t.version = v.version AND t.due_at > {CLOCK}
                  RETURNING t.id)
         SELECT id FROM gone UNION ALL SELECT id FROM kept"
    )
});

/// Writes many rows in one statement (a claim's), each guarded by its version: `$2..$8` are
/// arrays of ids, versions, states, statuses, due instants, attempts and declining workers.
/// Returns the ids written.
static WRITE_MANY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE persevere_tasks AS t SET state = v.state, status = v.status, due_at = v.due_at, attempt = v.attempt,
         declined_by = v.declined_by, version = t.version + 1, updated_at = {CLOCK}
         FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::text[])
              AS v(id, version, state, status, due_at, attempt, declined_by)
         WHERE t.id = v.id AND t.version = v.version RETURNING t.id"
    )
});

/// The columns of many writes, as the arrays [`WRITE_MANY`] binds.
#[derive(Default)]
struct Columns {
    ids: Vec<i64>,
    versions: Vec<i64>,
    states: Vec<String>,
    statuses: Vec<&'static str>,
    due: Vec<Option<i64>>,
    attempts: Vec<i64>,
    declined_by: Vec<String>,
}

impl Columns {
    /// The parameters of [`write_many`], after the skew.
    fn params<'a>(&'a self, skew: &'a i64) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 8] {
        [skew, &self.ids, &self.versions, &self.states, &self.statuses, &self.due, &self.attempts, &self.declined_by]
    }

    fn of<'w>(writes: impl Iterator<Item = (i64, i64, &'w Write)>) -> Self {
        let mut columns = Columns::default();
        for (id, version, w) in writes {
            columns.ids.push(id);
            columns.versions.push(version);
            columns.states.push(w.state.clone());
            columns.statuses.push(w.status.as_str());
            columns.due.push(w.due_at);
            columns.attempts.push(w.attempt);
            columns.declined_by.push(w.declined_by.clone());
        }
        columns
    }
}

/// The PostgreSQL store: one connection (no TLS), on `tokio-postgres` driven by a private
/// single-threaded runtime, so the API stays blocking. Open one per worker thread or process.
///
/// - A claim is one transaction: its candidates are locked with `FOR UPDATE SKIP LOCKED` (Q3),
///   so concurrent workers never wait for each other's rows, and the claimed row is written
///   before the commit. `BEGIN` travels with the select and `COMMIT` with the write (pipelined),
///   so a claim costs two round trips.
/// - A report reads its task (and the clock) and writes it back with one `UPDATE` guarded by the
///   version it read (compare-and-set, Q1); if another writer moved the version in between, it
///   reads and decides again. The completion of a job its queue claimed skips the read: one
///   `UPDATE` guarded by the version the claim left and by the lease on the server's clock
///   ([`Store::write_if_leased`](crate::Store::write_if_leased)).
/// - An enqueue is one `INSERT` that reads the clock itself and sends
///   `NOTIFY persevere_tasks` with the queue's name, which wakes the runners listening
///   ([`Store::listen`](crate::Store::listen)) when it commits.
/// - Statements are prepared once per connection, and a connection whose
///   `synchronous_commit` is `off` is switched to `on` (a claim is on disk before its worker
///   runs).
///
/// # When the connection is lost (Q9)
///
/// The server restarts or crashes, the network drops the connection, an administrator ends the
/// session: the call that meets it connects again before its next statement, with backoff
/// driven by persevere's own [`Retry`](persevere::Retry) (from 50 ms, doubling, capped at 2 s,
/// full jitter, 5 s for each attempt), for up to 30 s; then it returns the last error, and the
/// next call tries again ([`reconnect_with`](Self::reconnect_with) sets another policy). The
/// same store then goes on working. What the lost connection was running is run again only
/// where running it twice cannot do it twice:
///
/// - A read (`task`, `tasks`, `corrupt_tasks`, the clock) runs again. A `prune` may have
///   deleted rows: it returns the error, and the next one goes on.
/// - A claim lost before it read its rows runs again. One lost after is an error: if its commit
///   was lost too, nothing was handed out; if it committed, its jobs' leases, which no worker
///   holds, run out and are interrupted, using a retry (D2), as after a worker's crash.
/// - An enqueue with an idempotency key runs again: the key makes it happen once (if the lost
///   one had committed, it answers `created: false` with the task's id). One without a key (or
///   a batch with a keyless task) may have committed, so it returns the error and the caller
///   decides. (Before one, the store reads what its idle connection received, so that the first
///   enqueue after a restart is sent on a new connection rather than lost with the old one.)
/// - A report whose write was sent but whose answer was lost reads its task's row on the new
///   connection. A row that holds exactly what the report wrote, at the next version, is a
///   report that committed: it succeeds. A row still at the version it read (the write did not
///   commit), or holding another writer's write, is decided again as it is, as every report
///   is (a lease lost meanwhile is refused). A row written more than once since cannot tell,
///   and the report returns the connection's error, never a refusal of what may have committed.
pub struct Postgres {
    runtime: tokio::runtime::Runtime,
    client: Client,
    /// The queue's name (Q11), checked to need no quoting: every statement reads and writes
    /// its rows only.
    queue: String,
    skew: Duration,
    statements: HashMap<String, Statement>,
    /// The latest clock reading of a claim or a report's read.
    clock: Option<ClockReading>,
    /// What it connected with: [`Store::listen`]'s connection connects alike.
    params: String,
    /// How to connect again when the connection is lost (Q9).
    recovery: Recovery,
    /// The ids of the policies it has stored or found.
    policy_ids: policies::PolicyIds,
}

impl core::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Postgres").field("skew", &self.skew).finish_non_exhaustive()
    }
}

impl Postgres {
    /// Connects with a libpq-style string or URL (`host=/var/run/postgresql dbname=jobs`,
    /// `postgres://user@localhost/jobs`) and creates the queue's table if it is missing.
    ///
    /// It tries once, so that a wrong address fails at once; once connected, the store connects
    /// again by itself (see [When the connection is lost](#when-the-connection-is-lost-q9)).
    ///
    /// # Errors
    /// When the server cannot be reached or the schema cannot be created.
    pub fn connect(params: &str) -> Result<Self, QueueError> {
        Self::connect_queue(params, "default")
    }

    /// [`connect`](Self::connect) to the queue named `queue` (Q11): queues of different names
    /// in one database never exchange tasks, and idempotency keys are unique within a queue.
    ///
    /// # Errors
    /// [`QueueError::QueueName`] for a bad name; [`QueueError::NotAQueue`] when the database's
    /// `persevere_tasks` table was made by an earlier version; as [`connect`](Self::connect).
    pub fn connect_queue(params: &str, queue: &str) -> Result<Self, QueueError> {
        check_queue_name(queue)?;
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(QueueError::Io)?;
        let recovery = Recovery::new(params)?;
        let client = open(&runtime, recovery.config())?;
        let store = Postgres {
            runtime,
            client,
            queue: queue.to_owned(),
            skew: Duration::ZERO,
            statements: HashMap::new(),
            clock: None,
            params: params.to_owned(),
            recovery,
            policy_ids: policies::PolicyIds::default(),
        };
        store.create_schema(params)?;
        Ok(store)
    }

    /// Creates the queue's tables and indexes if they are missing, and brings a table made by
    /// an earlier version up to date, or refuses it.
    fn create_schema(&self, params: &str) -> Result<(), QueueError> {
        // Two workers creating the schema at once race on `CREATE ... IF NOT EXISTS`; a
        // transaction-level advisory lock makes it one at a time.
        let client = &self.client;
        self.block_on(client.batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock(7202611); {TABLES}")))?;
        let missing = |columns: &str| -> Result<i64, QueueError> {
            Ok(self.block_on(client.query_one(&missing_columns(columns), &[]))?.try_get(0)?)
        };
        let created = (|| {
            if missing(REQUIRED_COLUMNS)? > 0 {
                return Err(QueueError::NotAQueue {
                    path: params.into(),
                    reason: "its persevere_tasks table was made by an earlier version of persevere-queue (it lacks \
                             the queue, declined_by and corrupt_reason columns): drain that queue and drop the table"
                        .to_owned(),
                });
            }
            if missing("ARRAY['policy_id']")? > 0 {
                self.block_on(client.batch_execute(MIGRATE_POLICIES))?;
            }
            Ok(self.block_on(client.batch_execute(&format!("{INDEXES} COMMIT;")))?)
        })();
        if created.is_err() {
            self.roll_back();
        }
        created
    }

    fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    fn prepared(&mut self, sql: &str) -> Result<Statement, QueueError> {
        if let Some(statement) = self.statements.get(sql) {
            return Ok(statement.clone());
        }
        let statement = self.block_on(self.client.prepare(sql))?;
        if self.statements.len() >= MAX_STATEMENTS {
            // Dropping a `Statement` closes it on the server.
            self.statements.clear();
        }
        self.statements.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    fn skew_ns(&self) -> i64 {
        skewed(0, self.skew)
    }

    /// Task `id` and the clock, read in one statement (a report's read).
    fn read_row(&mut self, id: i64) -> ReadWithClock {
        let select = self.prepared(&format!(
            "SELECT {COLUMNS}, {CLOCK} FROM {TASKS} WHERE t.id = $2 AND t.queue = '{}'",
            self.queue
        ))?;
        let skew = self.skew_ns();
        let row = self.block_on(self.client.query_opt(&select, &[&skew, &id]))?;
        crash::statement();
        let read = row.map(|row| Ok::<_, QueueError>((row.try_get(CLOCK_COLUMN)?, row_of(&row)?))).transpose()?;
        if let Some((now, _)) = &read {
            self.clock = Some(ClockReading::new(*now, self.skew));
        }
        Ok(read)
    }

    /// Writes `write` over `row` if its version is still the one read (a report's write, one
    /// statement: the result and the state it changed are written together, or not at all).
    fn write_row(&mut self, row: &Row, w: &Write, now: i64) -> Result<bool, QueueError> {
        let statement = self.prepared(WRITE)?;
        let changed = self.block_on(self.client.execute(
            &statement,
            &[&w.state, &w.status.as_str(), &w.due_at, &w.attempt, &now, &row.id, &row.version, &w.declined_by],
        ))?;
        crash::statement();
        Ok(changed == 1)
    }

    /// Each insert's id and whether it was created, given the rows a batch insert created (in
    /// id order, with their keys): keyless rows take the keyless ids in order, a key its
    /// created row or, if none, the existing task's id (read here).
    fn match_inserted(
        &mut self,
        inserts: &[Insert],
        created: &[(i64, Option<String>)],
    ) -> Result<Vec<(i64, bool)>, QueueError> {
        let mut keyless = created.iter().filter(|(_, key)| key.is_none()).map(|(id, _)| *id);
        let mut by_key: HashMap<&str, i64> =
            created.iter().filter_map(|(id, key)| key.as_deref().map(|key| (key, *id))).collect();
        let missing: Vec<&str> =
            inserts.iter().filter_map(|i| i.key.as_deref()).filter(|key| !by_key.contains_key(key)).collect();
        let mut existing = HashMap::new();
        if !missing.is_empty() {
            let select = self.prepared(&format!(
                "SELECT idempotency_key, id FROM persevere_tasks WHERE queue = '{}' AND idempotency_key = ANY($1)",
                self.queue
            ))?;
            for row in self.block_on(self.client.query(&select, &[&missing]))? {
                existing.insert(row.try_get::<_, String>(0)?, row.try_get::<_, i64>(1)?);
            }
            crash::statement();
        }
        inserts
            .iter()
            .map(|insert| match insert.key.as_deref() {
                None => keyless.next().map(|id| (id, true)).ok_or(QueueError::Conflict(crate::TaskId(0))),
                // The first insert of a key created it; a repeat in the batch names the same task.
                Some(key) => match by_key.remove(key) {
                    Some(id) => {
                        existing.insert(key.to_owned(), id);
                        Ok((id, true))
                    }
                    None => existing.get(key).map(|id| (*id, false)).ok_or(QueueError::Conflict(crate::TaskId(0))),
                },
            })
            .collect()
    }

    /// Begins a claim's transaction and locks its candidates (`BEGIN` and the select in one
    /// round trip): the outer error is the store's, the inner the select's (the transaction is
    /// then open, to be rolled back).
    fn lock_candidates(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
    ) -> Result<Result<Vec<tokio_postgres::Row>, QueueError>, QueueError> {
        let queue = &self.queue;
        let select = match candidates {
            // One type: an ordered scan of the (queue, task_type, due_at) index that stops at
            // `limit`; `= ANY` would sort every due row first.
            Candidates::Due { types: [_], .. } => format!(
                "SELECT {COLUMNS}, {CLOCK} FROM {TASKS} WHERE t.queue = '{queue}' AND t.due_at <= {CLOCK}
                 AND t.task_type = $2 AND strpos(t.declined_by, $3) = 0
                 ORDER BY t.due_at, t.id LIMIT {limit} FOR UPDATE OF t SKIP LOCKED"
            ),
            Candidates::Due { .. } => format!(
                "SELECT {COLUMNS}, {CLOCK} FROM {TASKS} WHERE t.queue = '{queue}' AND t.due_at <= {CLOCK}
                 AND t.task_type = ANY($2) AND strpos(t.declined_by, $3) = 0
                 ORDER BY t.due_at, t.id LIMIT {limit} FOR UPDATE OF t SKIP LOCKED"
            ),
            Candidates::Expired => format!(
                "SELECT {COLUMNS}, {CLOCK} FROM {TASKS} WHERE t.queue = '{queue}'
                 AND t.status IN ('pending', 'handed_out', 'running')
                 AND (t.due_at IS NULL OR (t.status != 'pending' AND (t.due_at <= {CLOCK} OR t.due_at > {CLOCK} + {AHEAD})))
                 ORDER BY t.due_at, t.id LIMIT {limit} FOR UPDATE OF t SKIP LOCKED",
                AHEAD = crate::store::FAR_AHEAD_NS
            ),
        };
        let select = self.prepared(&select)?;
        let skew = self.skew_ns();
        let client = &self.client;
        let (begun, rows) = self.block_on(async {
            let rows = async {
                match candidates {
                    Candidates::Due { types: [single], worker } => {
                        client.query(&select, &[&skew, single, &declined_marker(worker)]).await
                    }
                    Candidates::Due { types, worker } => {
                        client.query(&select, &[&skew, &types, &declined_marker(worker)]).await
                    }
                    Candidates::Expired => client.query(&select, &[&skew]).await,
                }
            };
            tokio::join!(client.batch_execute("BEGIN"), rows)
        });
        crash::statement();
        Ok(begun.map_err(QueueError::from).and_then(|()| Ok(rows?)))
    }

    /// Writes what a claim decided (one statement for the writes, one for the rows set aside)
    /// and commits, in one round trip. The rows are locked: no version can have moved, and a
    /// write that failed makes the COMMIT a rollback.
    fn commit_decided(&mut self, decided: &[Decided]) -> Result<usize, QueueError> {
        let write = self.prepared(&WRITE_MANY)?;
        let set_aside = self.prepared(&format!(
            "UPDATE persevere_tasks AS t SET status = 'corrupt', due_at = NULL, corrupt_reason = v.reason,
             version = t.version + 1, updated_at = {CLOCK}
             FROM unnest($2::bigint[], $3::text[]) AS v(id, reason) WHERE t.id = v.id"
        ))?;
        let writes = Columns::of(decided.iter().filter_map(|d| match d {
            Decided::Write { id, version, write } => Some((*id, *version, write)),
            Decided::SetAside { .. } => None,
        }));
        let (aside_ids, reasons): (Vec<i64>, Vec<&str>) = decided
            .iter()
            .filter_map(|d| match d {
                Decided::SetAside { id, reason } => Some((*id, reason.as_str())),
                Decided::Write { .. } => None,
            })
            .unzip();
        let skew = self.skew_ns();
        let client = &self.client;
        let params = writes.params(&skew);
        let (written, aside, committed) = self.block_on(async {
            let written =
                async { if writes.ids.is_empty() { Ok(Vec::new()) } else { client.query(&write, &params).await } };
            let aside = async {
                if aside_ids.is_empty() {
                    Ok(0)
                } else {
                    client.execute(&set_aside, &[&skew, &aside_ids, &reasons]).await
                }
            };
            tokio::join!(written, aside, client.batch_execute("COMMIT"))
        });
        crash::statement();
        let (written, _) = (written?, aside?);
        committed?;
        if written.len() != writes.ids.len() {
            return Err(QueueError::Conflict(crate::TaskId(writes.ids.first().copied().unwrap_or(0))));
        }
        Ok(decided.len())
    }

    /// Deliberately broken (crash tests only): the claim commits, then writes the state outside
    /// its transaction, unguarded.
    fn split_claim(&mut self, decided: &[Decided]) -> Result<usize, QueueError> {
        self.block_on(self.client.batch_execute("COMMIT"))?;
        std::thread::sleep(Duration::from_millis(2));
        for decided in decided {
            if let Decided::Write { id, write: w, .. } = decided {
                self.block_on(self.client.execute(
                    "UPDATE persevere_tasks SET state = $1, status = $2, due_at = $3, attempt = $4, version = version + 1 WHERE id = $5",
                    &[&w.state, &w.status.as_str(), &w.due_at, &w.attempt, id],
                ))?;
            }
        }
        Ok(decided.len())
    }

    /// Ends the open transaction after an error (its own error, if any, is secondary).
    fn roll_back(&self) {
        let _ = self.block_on(self.client.batch_execute("ROLLBACK"));
    }
}

/// Opens a connection on `runtime` (the first one, and each one after a reconnect) and makes
/// its session's settings.
fn open(runtime: &tokio::runtime::Runtime, config: &tokio_postgres::Config) -> Result<Client, QueueError> {
    let (client, connection) = runtime.block_on(config.connect(tokio_postgres::NoTls))?;
    // The connection runs whenever this store blocks on the runtime.
    runtime.spawn(async move {
        let _ = connection.await;
    });
    // A claim must be on disk before its worker runs (D6 `Sync`): never commit
    // asynchronously on this connection.
    let setting: String = runtime.block_on(client.query_one("SHOW synchronous_commit", &[]))?.try_get(0)?;
    if setting == "off" {
        runtime.block_on(client.batch_execute("SET synchronous_commit = on"))?;
    }
    Ok(client)
}

fn row_of(row: &tokio_postgres::Row) -> Result<Row, QueueError> {
    Ok(Row {
        id: row.try_get(0)?,
        task_type: row.try_get(1)?,
        payload: row.try_get(2)?,
        policy: row.try_get(3)?,
        state: row.try_get(4)?,
        version: row.try_get(5)?,
        key: row.try_get(6)?,
        created_at: row.try_get(7)?,
        due_at: row.try_get(8)?,
    })
}

impl Session for Postgres {
    fn now(&mut self) -> Result<Instant, QueueError> {
        let statement = self.prepared(&format!("SELECT {CLOCK}"))?;
        let skew = self.skew_ns();
        let nanos: i64 = self.block_on(self.client.query_one(&statement, &[&skew]))?.try_get(0)?;
        instant_of(nanos)
    }

    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        crash::begin("insert");
        // One statement and one round trip: the clock is read by the insert itself (a fresh
        // task's state is built from `created_at` when it is first loaded), and a row it adds
        // wakes the queue's listening runners at its commit (Q8).
        let insert_statement = self.prepared(&format!(
            "WITH inserted AS (INSERT INTO persevere_tasks (queue, task_type, payload, policy_id, state, version,
             status, due_at, attempt, idempotency_key, created_at, updated_at)
             SELECT '{queue}', $2::text, $3::bytea, $4::bigint, '', 0, $5::text,
                    GREATEST(CASE WHEN clock.now > {MAX} - $6::bigint THEN {MAX} ELSE clock.now + $6::bigint END,
                             $9::bigint),
                    $7::bigint, $8::text, clock.now, clock.now
             FROM (SELECT {CLOCK} AS now) AS clock
             ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING RETURNING id)
             SELECT id, pg_notify('{NOTIFY_CHANNEL}', '{queue}') FROM inserted",
            MAX = i64::MAX,
            queue = self.queue
        ))?;
        let policy = self.policy_ids(&[&insert.policy])?[0];
        let skew = self.skew_ns();
        // One statement, so no transaction: the row appears whole or not at all.
        let inserted = self.block_on(self.client.query_opt(
            &insert_statement,
            &[
                &skew,
                &insert.task_type,
                &insert.payload,
                &policy,
                &insert.status.as_str(),
                &insert.delay_ns,
                &insert.attempt,
                &insert.key,
                &insert.not_before,
            ],
        ))?;
        crash::statement();
        if let Some(row) = inserted {
            return Ok((row.try_get(0)?, true));
        }
        // The key exists, committed (ON CONFLICT waited for a concurrent insert to finish).
        let existing = self.prepared(&format!(
            "SELECT id FROM persevere_tasks WHERE queue = '{}' AND idempotency_key = $1",
            self.queue
        ))?;
        let row = self.block_on(self.client.query_one(&existing, &[&insert.key]))?;
        crash::statement();
        Ok((row.try_get(0)?, false))
    }

    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError> {
        crash::begin("claim");
        let rows = self.lock_candidates(candidates, limit)?;
        let skew = self.skew;
        let clock = &mut self.clock;
        let decided = rows.and_then(|rows| {
            // Every row carries the same clock reading (the statement's).
            if let Some(now) = rows.first().map(|row| row.try_get(CLOCK_COLUMN)).transpose()? {
                *clock = Some(ClockReading::new(now, skew));
            }
            let decoded = rows.iter().map(|pg_row| {
                let now = instant_of(pg_row.try_get(CLOCK_COLUMN)?)?;
                Ok(row_of(pg_row).map(|row| (now, row)).map_err(|e| (pg_row.get::<_, i64>(0), e.to_string())))
            });
            visit_rows(decoded, visit)
        });
        let decided = match decided {
            Ok(decided) => decided,
            Err(error) => {
                self.roll_back();
                return Err(error);
            }
        };
        if crash::split_claim() {
            return self.split_claim(&decided);
        }
        self.commit_decided(&decided)
    }

    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        let statement =
            self.prepared(&format!("SELECT {COLUMNS} FROM {TASKS} WHERE t.id = $1 AND t.queue = '{}'", self.queue))?;
        let row = self.block_on(self.client.query_opt(&statement, &[&id]))?;
        row.as_ref().map(row_of).transpose()
    }

    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        let statement = self.prepared(&format!(
            "SELECT {COLUMNS} FROM {TASKS} WHERE t.queue = '{}' AND t.status = '{}' ORDER BY t.id LIMIT $1",
            self.queue,
            status.as_str()
        ))?;
        let rows = self.block_on(self.client.query(&statement, &[&i64::from(limit)]))?;
        rows.iter().map(row_of).collect()
    }

    fn clock_estimate(&self) -> Option<Instant> {
        self.clock?.estimate(self.skew)
    }

    fn write_if_leased(&mut self, guarded: &GuardedWrite) -> Result<bool, QueueError> {
        crash::begin("update");
        let GuardedWrite { id, version, write: w, delete } = guarded;
        let skew = self.skew_ns();
        let changed = if *delete {
            let statement = self.prepared(&DELETE_IF_LEASED)?;
            self.block_on(self.client.execute(&statement, &[&skew, id, version]))?
        } else {
            let statement = self.prepared(&WRITE_IF_LEASED)?;
            self.block_on(self.client.execute(
                &statement,
                &[&skew, &w.state, &w.status.as_str(), &w.due_at, &w.attempt, id, version, &w.declined_by],
            ))?
        };
        crash::statement();
        Ok(changed == 1)
    }

    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError> {
        crash::begin("update");
        let statement = self.prepared(&WRITE_OR_DELETE_MANY_IF_LEASED)?;
        let columns = Columns::of(writes.iter().map(|w| (w.id, w.version, &w.write)));
        let delete: Vec<bool> = writes.iter().map(|w| w.delete).collect();
        let skew = self.skew_ns();
        let mut params = columns.params(&skew).to_vec();
        params.push(&delete);
        let written = self.block_on(self.client.query(&statement, &params))?;
        crash::statement();
        let written: std::collections::HashSet<i64> =
            written.iter().map(|row| row.try_get(0)).collect::<Result<_, _>>()?;
        Ok(writes.iter().map(|w| written.contains(&w.id)).collect())
    }

    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError> {
        crash::begin("insert");
        // The rows it adds wake the queue's listening runners at its commit (Q8): the server
        // sends one notification for the statement's identical ones.
        let statement = self.prepared(&format!(
            "WITH inserted AS (INSERT INTO persevere_tasks (queue, task_type, payload, policy_id, state, version,
             status, due_at, attempt, idempotency_key, created_at, updated_at)
             SELECT '{queue}', t.task_type, t.payload, t.policy_id, '', 0, t.status,
                    GREATEST(CASE WHEN clock.now > {MAX} - t.delay_ns THEN {MAX} ELSE clock.now + t.delay_ns END,
                             t.not_before),
                    t.attempt, t.key, clock.now, clock.now
             FROM (SELECT {CLOCK} AS now) AS clock,
                  unnest($2::text[], $3::bytea[], $4::bigint[], $5::text[], $6::bigint[], $7::bigint[], $8::text[],
                         $9::bigint[]) WITH ORDINALITY
                  AS t(task_type, payload, policy_id, status, delay_ns, attempt, key, not_before, ord)
             ORDER BY t.ord
             ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
             RETURNING id, idempotency_key)
             SELECT id, idempotency_key, pg_notify('{NOTIFY_CHANNEL}', '{queue}') FROM inserted",
            MAX = i64::MAX,
            queue = self.queue
        ))?;
        let types: Vec<&str> = inserts.iter().map(|i| i.task_type.as_str()).collect();
        let payloads: Vec<&[u8]> = inserts.iter().map(|i| i.payload.as_slice()).collect();
        let policies: Vec<&str> = inserts.iter().map(|i| i.policy.as_str()).collect();
        let policies = self.policy_ids(&policies)?;
        let statuses: Vec<&str> = inserts.iter().map(|i| i.status.as_str()).collect();
        let delays: Vec<i64> = inserts.iter().map(|i| i.delay_ns).collect();
        let attempts: Vec<i64> = inserts.iter().map(|i| i.attempt).collect();
        let keys: Vec<Option<&str>> = inserts.iter().map(|i| i.key.as_deref()).collect();
        let not_before: Vec<i64> = inserts.iter().map(|i| i.not_before).collect();
        let skew = self.skew_ns();
        // One statement: the rows appear together or not at all.
        let rows = self.block_on(self.client.query(
            &statement,
            &[&skew, &types, &payloads, &policies, &statuses, &delays, &attempts, &keys, &not_before],
        ))?;
        crash::statement();
        let mut created: Vec<(i64, Option<String>)> =
            rows.iter().map(|row| Ok((row.try_get(0)?, row.try_get(1)?))).collect::<Result<_, QueueError>>()?;
        // Ids are drawn in the order the rows were inserted, which is the batch's.
        created.sort_unstable_by_key(|(id, _)| *id);
        self.match_inserted(inserts, &created)
    }

    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError> {
        let statement = self.prepared(&format!(
            "SELECT id, task_type, state, coalesce(corrupt_reason, '') FROM persevere_tasks
             WHERE queue = '{}' AND status = 'corrupt' ORDER BY id LIMIT $1",
            self.queue
        ))?;
        let rows = self.block_on(self.client.query(&statement, &[&i64::from(limit)]))?;
        rows.iter()
            .map(|row| {
                Ok(SetAsideRow {
                    id: row.try_get(0)?,
                    task_type: row.try_get(1)?,
                    state: row.try_get(2)?,
                    reason: row.try_get(3)?,
                })
            })
            .collect()
    }

    fn prune(&mut self, finished_before_ns: i64, limit: u32) -> Result<usize, QueueError> {
        let statement = self.prepared(&format!(
            "DELETE FROM persevere_tasks WHERE id IN (SELECT id FROM persevere_tasks WHERE queue = '{}'
             AND status IN ('completed', 'proceeded', 'diverted') AND updated_at <= $1 ORDER BY updated_at, id LIMIT $2)",
            self.queue
        ))?;
        let deleted = self.block_on(self.client.execute(&statement, &[&finished_before_ns, &i64::from(limit)]))?;
        Ok(usize::try_from(deleted).unwrap_or(usize::MAX))
    }

    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: Duration) {
        self.skew = self.skew.saturating_add(by);
    }
}
