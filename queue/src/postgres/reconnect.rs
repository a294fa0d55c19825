//! Recovery (Q9): the [`Store`] on top of one connection's statements ([`Session`]). When the
//! connection is lost, the store connects again with backoff before its next statement, and
//! redoes only what cannot happen twice by being redone (the rules are on [`Postgres`]).

use core::time::Duration;
use std::hash::{BuildHasher, RandomState};

use persevere::{Backoff, Failure, Instant, Jitter, Retry, RetryAction, RetryPolicy, SplitMix64};
use tokio_postgres::error::SqlState;

use super::{Postgres, open};
use crate::crash;
use crate::shared::{ReadWithClock, compare_and_set};
use crate::store::{Candidates, ClaimVisit, GuardedWrite, Insert, Row, SetAsideRow, Store, UpdateVisit, Write};
use crate::{Doorbell, QueueError, Status};

/// The statements of each store operation, run once on the current connection, knowing nothing
/// of reconnecting (`postgres.rs`). [`Store`] is built on them below.
pub(super) trait Session {
    fn now(&mut self) -> Result<Instant, QueueError>;
    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError>;
    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError>;
    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError>;
    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError>;
    fn clock_estimate(&self) -> Option<Instant>;
    fn write_if_leased(&mut self, write: &GuardedWrite) -> Result<bool, QueueError>;
    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError>;
    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError>;
    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError>;
    fn prune(&mut self, finished_before_ns: i64, limit: u32) -> Result<usize, QueueError>;
    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: Duration);
}

/// How a store connects again.
pub(super) struct Recovery {
    config: tokio_postgres::Config,
    policy: RetryPolicy,
    /// The jitter of the backoff (seeded per store, so workers that lost one server spread out).
    rng: SplitMix64,
    /// A statement failed because the connection is gone: the next one waits for a new one.
    lost: bool,
}

impl Recovery {
    pub(super) fn new(params: &str) -> Result<Self, QueueError> {
        Ok(Recovery {
            config: params.parse()?,
            policy: default_policy(),
            rng: SplitMix64::new(RandomState::new().hash_one(std::process::id())),
            lost: false,
        })
    }

    pub(super) fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }
}

/// Backoff from 50 ms, doubling, capped at 2 s, full jitter; 5 s for each attempt to connect,
/// and 30 s in all.
fn default_policy() -> RetryPolicy {
    let backoff = Backoff::exponential(Duration::from_millis(50), 2.0)
        .max_delay(Duration::from_secs(2))
        .jitter(Jitter::Full)
        .build()
        .expect("a valid backoff");
    RetryPolicy::builder(backoff)
        .attempt_timeout(Duration::from_secs(5))
        .total(Duration::from_secs(30))
        .build()
        .expect("a valid retry policy")
}

/// How many times one call connects again and runs its statements again before it returns the
/// error (a server that drops every new connection at once).
const REDOS: u32 = 3;

impl Postgres {
    /// Connects again after a lost connection with `policy` instead of the default (backoff from
    /// 50 ms, doubling, capped at 2 s, with full jitter; 5 s for each attempt; 30 s in all). Its
    /// limits bound how long one call waits for the server before it returns the error; its
    /// attempt timeout, if any, bounds each attempt to connect.
    #[must_use]
    pub fn reconnect_with(mut self, policy: RetryPolicy) -> Self {
        self.recovery.policy = policy;
        self
    }

    /// Connects again if the connection is known to be gone.
    fn connected(&mut self) -> Result<(), QueueError> {
        if self.recovery.lost || self.client.is_closed() { self.reconnect() } else { Ok(()) }
    }

    /// Opens a new connection, driving persevere's retry machine by hand: each failed attempt
    /// sleeps the delay the machine draws, until one succeeds or the policy gives up (then the
    /// last attempt's error). Statements prepared on the old connection are forgotten.
    fn reconnect(&mut self) -> Result<(), QueueError> {
        self.recovery.lost = true;
        let policy = self.recovery.policy;
        let origin = std::time::Instant::now();
        let now = || Instant::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX));
        let mut retry = Retry::new();
        retry.handle_start(&policy, now()).expect("a new operation starts");
        loop {
            match retry.poll_action() {
                Some(RetryAction::Start { attempt, deadline }) => {
                    let mut config = self.recovery.config.clone();
                    if let Some(deadline) = deadline {
                        let left = deadline.saturating_duration_since(now());
                        config.connect_timeout(config.get_connect_timeout().map_or(left, |own| left.min(*own)));
                    }
                    match open(&self.runtime, &config) {
                        Ok(client) => {
                            self.statements.clear();
                            self.client = client;
                            self.recovery.lost = false;
                            return Ok(());
                        }
                        Err(error) => {
                            let failure =
                                if worth_retrying(&error) { Failure::retryable(error) } else { Failure::fatal(error) };
                            let rng = &mut self.recovery.rng;
                            if let Err(refused) = retry.handle_failure(&policy, now(), attempt, failure, rng) {
                                return Err(refused.input.error);
                            }
                        }
                    }
                }
                Some(RetryAction::Finish { outcome, .. }) => {
                    return Err(outcome.into_last_failure().and_then(|last| last.error).expect(
                        "every failure carries its error: the machine never times an attempt out here, since it is \
                         told of each attempt's end before it is woken",
                    ));
                }
                Some(RetryAction::Sleep { .. } | RetryAction::Abandon { .. }) => {}
                None => {
                    let until = retry.poll_timeout().expect("a retry that has not finished waits for something");
                    std::thread::sleep(until.saturating_duration_since(now()));
                    retry.handle_timeout(&policy, now(), &mut self.recovery.rng);
                }
            }
        }
    }

    /// Notes whether `error` says the connection is gone (then the next statement waits for a
    /// new one), and returns it.
    fn lost(&mut self, error: &QueueError) -> bool {
        let lost = connection_lost(error);
        self.recovery.lost |= lost;
        lost
    }

    /// Runs `run`, which can safely run twice, on a live connection, again on a new one each
    /// time the connection is lost under it.
    fn redo<T>(&mut self, mut run: impl FnMut(&mut Self) -> Result<T, QueueError>) -> Result<T, QueueError> {
        let mut redos = 0;
        loop {
            self.connected()?;
            match run(self) {
                Err(error) if self.lost(&error) && redos < REDOS => redos += 1,
                result => return result,
            }
        }
    }

    /// Runs `run` once on a live connection: what it did is unknown if the connection is lost
    /// under it, so that error is returned.
    fn once<T>(&mut self, run: impl FnOnce(&mut Self) -> Result<T, QueueError>) -> Result<T, QueueError> {
        self.connected()?;
        let result = run(self);
        if let Err(error) = &result {
            self.lost(error);
        }
        result
    }

    /// Lets the connection read what the server sent while this store was idle, so that a
    /// connection closed meanwhile (a restart, an administrator ending it) is known to be closed
    /// before a statement that cannot be redone is sent on it.
    fn look_at_connection(&mut self) {
        // A yield lets the runtime poll the socket; the next lets the connection's task read what
        // arrived (the third is to spare).
        self.runtime.block_on(async {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
        });
    }

    /// Runs `write`, which makes `writes` in one statement. When the connection is lost before
    /// the answer, reads the rows on a new connection to tell what happened (see [`applied`]),
    /// and returns the error only when no one can tell.
    fn write_settled<T>(
        &mut self,
        writes: &[Settle<'_>],
        write: impl FnOnce(&mut Self) -> Result<T, QueueError>,
        of: impl FnOnce(Vec<bool>) -> T,
    ) -> Result<T, QueueError> {
        let error = match self.once(write) {
            Err(error) if connection_lost(&error) => error,
            result => return result,
        };
        let mut found = Vec::with_capacity(writes.len());
        for settle in writes {
            let row = self.redo(|store| Session::get(store, settle.id))?;
            match applied(row.as_ref(), settle) {
                Some(applied) => found.push(applied),
                None => return Err(error),
            }
        }
        Ok(of(found))
    }

    /// A report's read ([`compare_and_set`]): run again on a new connection if it is lost.
    fn read_again(&mut self, id: i64) -> ReadWithClock {
        self.redo(|store| store.read_row(id))
    }

    /// A report's write ([`compare_and_set`]), settled when its answer is lost.
    fn write_row_settled(&mut self, row: &Row, write: &Write, now: i64) -> Result<bool, QueueError> {
        let settle = [Settle { id: row.id, version: row.version, write, delete: false }];
        self.write_settled(&settle, |store| store.write_row(row, write, now), |a| a[0])
    }
}

/// A write whose answer may be lost: the task, the version it is guarded by, what it writes,
/// and whether it deletes the row instead.
struct Settle<'a> {
    id: i64,
    version: i64,
    write: &'a Write,
    delete: bool,
}

impl<'a> Settle<'a> {
    fn of(guarded: &'a GuardedWrite) -> Self {
        Settle { id: guarded.id, version: guarded.version, write: &guarded.write, delete: guarded.delete }
    }
}

/// Whether a write applied, from its row read after the answer to it was lost: yes if the row
/// holds exactly what it wrote, at the next version (or, for a delete, is gone: only a write
/// that finishes the task deletes its row, so the task is over either way; a delete by another
/// worker that claimed it after this lease ran out counts as this one); no if
/// the row still has the version guarded (it did not commit, or its guard failed), holds
/// another write at the next version (that one won), or (for a write) is gone; `None` when the
/// row was written more than once since, so that no one can tell.
fn applied(row: Option<&Row>, settle: &Settle<'_>) -> Option<bool> {
    let Some(row) = row else { return Some(settle.delete) };
    if row.version == settle.version {
        Some(false)
    } else if row.version == settle.version.saturating_add(1) {
        Some(!settle.delete && row.state == settle.write.state && row.due_at == settle.write.due_at)
    } else {
        None
    }
}

/// Whether `error` says the connection is gone: closed, an I/O error on its socket, or the
/// server ending the session (it is shutting down or crashed: SQLSTATE 57P01–57P03, or a
/// connection exception, class 08).
fn connection_lost(error: &QueueError) -> bool {
    let QueueError::Postgres(error) = error else { return false };
    if error.is_closed() || error.code().is_some_and(|code| gone(code) || code.code().starts_with("08")) {
        return true;
    }
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        if error.is::<std::io::Error>() {
            return true;
        }
        cause = error.source();
    }
    false
}

fn gone(code: &SqlState) -> bool {
    [SqlState::ADMIN_SHUTDOWN, SqlState::CRASH_SHUTDOWN, SqlState::CANNOT_CONNECT_NOW].contains(code)
}

/// Whether a failed attempt to connect is worth another: the server did not answer (refused,
/// reset, timed out), or answered that it is starting, stopping or recovering (57P01–57P03),
/// a connection exception (class 08), or out of resources (class 53: too many connections). It
/// is not when the server refused this connection for good: a password, a database that does not
/// exist.
fn worth_retrying(error: &QueueError) -> bool {
    match error {
        QueueError::Postgres(error) => {
            error.code().is_none_or(|code| gone(code) || code.code().starts_with("08") || code.code().starts_with("53"))
        }
        _ => false,
    }
}

impl Store for Postgres {
    fn now(&mut self) -> Result<Instant, QueueError> {
        self.redo(Session::now)
    }

    fn insert(&mut self, insert: &Insert) -> Result<(i64, bool), QueueError> {
        if insert.key.is_some() {
            return self.redo(|store| Session::insert(store, insert));
        }
        self.look_at_connection();
        self.once(|store| Session::insert(store, insert))
    }

    fn claim(
        &mut self,
        candidates: Candidates<'_>,
        limit: u32,
        visit: &mut ClaimVisit<'_>,
    ) -> Result<usize, QueueError> {
        let mut redos = 0;
        loop {
            self.connected()?;
            // A claim lost before it read its rows changed nothing: it runs again. Once `visit`
            // has seen a row, running again would call it for rows it already decided on.
            let mut visited = false;
            let result = Session::claim(self, candidates, limit, &mut |now, row| {
                visited = true;
                visit(now, row)
            });
            match result {
                Err(error) if self.lost(&error) && !visited && redos < REDOS => redos += 1,
                result => return result,
            }
        }
    }

    fn update(&mut self, id: i64, visit: &mut UpdateVisit<'_>) -> Result<bool, QueueError> {
        crash::begin("update");
        compare_and_set(self, id, visit, Self::read_again, Self::write_row_settled)
    }

    fn get(&mut self, id: i64) -> Result<Option<Row>, QueueError> {
        self.redo(|store| Session::get(store, id))
    }

    fn list(&mut self, status: Status, limit: u32) -> Result<Vec<Row>, QueueError> {
        self.redo(|store| Session::list(store, status, limit))
    }

    fn clock_estimate(&self) -> Option<Instant> {
        Session::clock_estimate(self)
    }

    fn write_if_leased(&mut self, write: &GuardedWrite) -> Result<bool, QueueError> {
        let settle = [Settle::of(write)];
        self.write_settled(&settle, |store| Session::write_if_leased(store, write), |a| a[0])
    }

    fn write_batch_if_leased(&mut self, writes: &[GuardedWrite]) -> Result<Vec<bool>, QueueError> {
        let settle: Vec<Settle<'_>> = writes.iter().map(Settle::of).collect();
        self.write_settled(&settle, |store| Session::write_batch_if_leased(store, writes), |a| a)
    }

    fn insert_batch(&mut self, inserts: &[Insert]) -> Result<Vec<(i64, bool)>, QueueError> {
        if inserts.iter().all(|insert| insert.key.is_some()) {
            return self.redo(|store| Session::insert_batch(store, inserts));
        }
        self.look_at_connection();
        self.once(|store| Session::insert_batch(store, inserts))
    }

    fn set_aside_rows(&mut self, limit: u32) -> Result<Vec<SetAsideRow>, QueueError> {
        self.redo(|store| Session::set_aside_rows(store, limit))
    }

    fn prune(&mut self, finished_before_ns: i64, limit: u32) -> Result<usize, QueueError> {
        // Run again, it could delete up to `limit` more rows and count only those.
        self.once(|store| Session::prune(store, finished_before_ns, limit))
    }

    fn listen(&mut self, doorbell: &Doorbell) -> Result<(), QueueError> {
        // A connection of its own, which reconnects by itself (`listen.rs`).
        super::listen::spawn(self.params.clone(), self.queue.clone(), doorbell.downgrade())
    }

    #[cfg(feature = "test-clock")]
    fn advance_clock(&mut self, by: Duration) {
        Session::advance_clock(self, by);
    }

    fn connect_again(&self) -> Option<Result<Box<dyn Store + Send>, QueueError>> {
        Some(Postgres::connect_queue(&self.params, &self.queue).map(|mut store| {
            store.recovery.policy = self.recovery.policy;
            store.skew = self.skew;
            Box::new(store) as Box<dyn Store + Send>
        }))
    }
}
