//! Q9, what a PostgreSQL store does when its connection is lost under a call: each decision of
//! `Postgres`'s recovery rules, made to happen exactly by a proxy between the store and the
//! server that cuts the connection at a chosen statement, before or after the server ran it.
//! (The server restarting under running workers is `restart.rs`.) On the cluster
//! `PERSEVERE_PG_URL` names, as the other tests (see `common/mod.rs`).

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::{Db, PgDb, policy};
use persevere::{Backoff, Failure, RetryPolicy};
use persevere_queue::{Handled, NewTask, Postgres, Queue, QueueError, Status, TaskId};

/// A TCP proxy to the test cluster that can cut its connections at a chosen request or answer.
struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Cut the connection when the server has answered this many more requests; the last
    /// answer is never delivered (the server ran the request, and committed it if it commits).
    cut_answer: Option<u32>,
    /// Cut the connection instead of sending the client's request this many more on (the
    /// server never sees it).
    cut_request: Option<u32>,
    /// New connections are closed at once while set (the server is away).
    down: bool,
    /// Connections cut so far.
    cuts: u32,
    /// The sockets of the open connections, to cut them all.
    open: Vec<(TcpStream, TcpStream)>,
}

impl Proxy {
    fn start(server: (String, u16)) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), changed: Condvar::new() });
        let accepting = Arc::clone(&shared);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if accepting.state.lock().unwrap().down {
                    drop(client);
                    continue;
                }
                let server = TcpStream::connect((server.0.as_str(), server.1)).unwrap();
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let ends = (client.try_clone().unwrap(), server.try_clone().unwrap());
                accepting.state.lock().unwrap().open.push(ends);
                let (to_server, to_client) = (server.try_clone().unwrap(), client.try_clone().unwrap());
                let (requests, answers) = (Arc::clone(&accepting), Arc::clone(&accepting));
                std::thread::spawn(move || pump(client, to_server, &requests, Direction::Requests));
                std::thread::spawn(move || pump(server, to_client, &answers, Direction::Answers));
            }
        });
        Proxy { port, shared }
    }

    /// Cut the connection once the server has answered `n` more requests, withholding the
    /// `n`-th answer; with `stay_down`, refuse new connections until [`up`](Self::up).
    fn cut_answer(&self, n: u32, stay_down: bool) {
        let mut state = self.shared.state.lock().unwrap();
        state.cut_answer = Some(n);
        state.down = stay_down;
    }

    /// Cut the connection instead of forwarding the client's `n`-th next request.
    fn cut_request(&self, n: u32, stay_down: bool) {
        let mut state = self.shared.state.lock().unwrap();
        state.cut_request = Some(n);
        state.down = stay_down;
    }

    /// Cuts every open connection and refuses new ones until [`up`](Self::up).
    fn down(&self) {
        let mut state = self.shared.state.lock().unwrap();
        state.down = true;
        for (client, server) in state.open.drain(..) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    fn up(&self) {
        self.shared.state.lock().unwrap().down = false;
    }

    fn cuts(&self) -> u32 {
        self.shared.state.lock().unwrap().cuts
    }

    /// Waits until `n` connections have been cut.
    fn wait_for_cuts(&self, n: u32) {
        let state = self.shared.state.lock().unwrap();
        let (state, timeout) =
            self.shared.changed.wait_timeout_while(state, Duration::from_secs(10), |state| state.cuts < n).unwrap();
        assert!(!timeout.timed_out(), "{} cuts, waited for {n}", state.cuts);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Direction {
    Requests,
    Answers,
}

/// Copies messages from `from` to `to`, a request or an answer at a time when a cut is armed (a
/// request ends with Sync or a simple Query, an answer with ReadyForQuery).
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared, direction: Direction) {
    let mut buffer = Vec::new();
    // The client's first message, the startup, has no type byte.
    let mut untyped = direction == Direction::Requests;
    let mut held = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(read) = from.read(&mut chunk) {
        if read == 0 {
            break;
        }
        buffer.extend_from_slice(&chunk[..read]);
        loop {
            let header = if untyped { 4 } else { 5 };
            if buffer.len() < header {
                break;
            }
            let length = u32::from_be_bytes(buffer[header - 4..header].try_into().unwrap()) as usize;
            let total = header - 4 + length;
            if buffer.len() < total {
                break;
            }
            let message: Vec<u8> = buffer.drain(..total).collect();
            let kind = if untyped { 0 } else { message[0] };
            untyped = false;
            held.extend_from_slice(&message);
            let ends = match direction {
                Direction::Requests => matches!(kind, b'S' | b'Q'),
                Direction::Answers => kind == b'Z',
            };
            let mut state = shared.state.lock().unwrap();
            let armed = match direction {
                Direction::Requests => &mut state.cut_request,
                Direction::Answers => &mut state.cut_answer,
            };
            if armed.is_some() && !ends {
                continue; // held until the request or answer is whole
            }
            if ends && let Some(n) = armed {
                *n -= 1;
                if *n == 0 {
                    *armed = None;
                    state.cuts += 1;
                    shared.changed.notify_all();
                    drop(state);
                    let _ = from.shutdown(Shutdown::Both);
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
            }
            drop(state);
            if to.write_all(&held).is_err() {
                return;
            }
            held.clear();
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// The test's schema on the cluster, and a proxy to it.
struct Setup {
    db: PgDb,
    proxy: Proxy,
    /// The connection string through the proxy.
    params: String,
    /// The `application_name` of the connections through the proxy.
    name: String,
}

fn setup(name: &str) -> Option<Setup> {
    let db = common::postgres(name)?;
    let url = std::env::var("PERSEVERE_PG_URL").unwrap();
    let config: postgres::Config = url.parse().unwrap();
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        // `.ci/postgres` listens on 127.0.0.1 as well as on its socket.
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let proxy = Proxy::start((host, port));
    let params = format!(
        "host=127.0.0.1 port={} user={} dbname={} application_name={name} options='-c search_path=t_{name}'",
        proxy.port,
        config.get_user().unwrap(),
        config.get_dbname().unwrap(),
    );
    Some(Setup { db, proxy, params, name: name.to_owned() })
}

impl Setup {
    fn queue(&self) -> Queue<Postgres> {
        Queue::new(Postgres::connect(&self.params).unwrap())
    }

    /// A query on a connection of its own, straight to the server.
    fn count(&self, sql: &str) -> i64 {
        let mut client = postgres::Client::connect(&self.db.params, postgres::NoTls).unwrap();
        client.query_one(sql, &[]).unwrap().get(0)
    }

    /// Waits until the server has ended every session that came through the proxy (a cut
    /// connection's transaction is rolled back and its locks released when its session ends).
    fn wait_for_sessions_to_end(&self) {
        let sql = format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}'", self.name);
        let start = Instant::now();
        while self.count(&sql) > 0 {
            assert!(start.elapsed() < Duration::from_secs(10), "the cut sessions did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn lost_connection(result: Result<impl std::fmt::Debug, QueueError>) -> QueueError {
    match result {
        Err(error @ QueueError::Postgres(_)) => error,
        other => panic!("expected the lost connection's error, got {other:?}"),
    }
}

/// A completion (one guarded statement) that committed but whose answer was lost succeeds: the
/// row holds exactly what it wrote. (Each cut follows a call that prepared its statements on the
/// connection: the cut counts the statements' answers.)
#[test]
fn q9_a_completion_that_committed_but_whose_answer_was_lost_succeeds() {
    let Some(setup) = setup("q9_completion_answer_lost") else { return };
    let mut queue = setup.queue();
    for _ in 0..4 {
        queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    }
    let jobs = queue.claim_batch("w", &["t"], 2).unwrap();
    assert_eq!(queue.complete(&jobs[0]).unwrap(), Status::Completed);
    setup.proxy.cut_answer(1, false);
    assert_eq!(queue.complete(&jobs[1]).unwrap(), Status::Completed);
    assert_eq!(setup.proxy.cuts(), 1);
    assert_eq!(queue.task(jobs[1].id).unwrap().status, Status::Completed);

    // A batch of completions, one statement, likewise.
    let jobs = queue.claim_batch("w", &["t"], 2).unwrap();
    let completed = |job: &persevere_queue::Job| vec![(job.clone(), Handled::Completed)];
    assert!(matches!(queue.report_batch(&completed(&jobs[0])).unwrap()[..], [Ok(Status::Completed)]));
    setup.proxy.cut_answer(1, false);
    let results = queue.report_batch(&completed(&jobs[1])).unwrap();
    assert_eq!(setup.proxy.cuts(), 2);
    assert!(matches!(results[..], [Ok(Status::Completed)]), "{results:?}");
    let task = queue.task(jobs[1].id).unwrap();
    assert_eq!((task.status, task.attempt()), (Status::Completed, 1), "no attempt ran again");

    // A completion that deletes its row (no finished rows kept): the row is gone, so it was.
    // (An uncut one first prepares each statement on the connection: the cuts are of the
    // deletes' answers.)
    queue.keep_finished(false);
    for _ in 0..4 {
        queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    }
    let jobs = queue.claim_batch("w", &["t"], 4).unwrap();
    assert_eq!(queue.complete(&jobs[0]).unwrap(), Status::Completed);
    setup.proxy.cut_answer(1, false);
    assert_eq!(queue.complete(&jobs[1]).unwrap(), Status::Completed);
    assert!(matches!(queue.report_batch(&completed(&jobs[2])).unwrap()[..], [Ok(Status::Completed)]));
    setup.proxy.cut_answer(1, false);
    let results = queue.report_batch(&completed(&jobs[3])).unwrap();
    assert_eq!(setup.proxy.cuts(), 4);
    assert!(matches!(results[..], [Ok(Status::Completed)]), "{results:?}");
    let left: Vec<_> = jobs.iter().map(|job| queue.task(job.id).map(|t| (t.status, t.attempt()))).collect();
    assert!(left.iter().all(Result::is_err), "every row deleted: {left:?}");
}

/// A report that reads its row and writes it back: a lost read runs again; a write that
/// committed unanswered succeeds; a write the server never saw is decided again on the row.
#[test]
fn q9_a_report_lost_at_its_read_or_at_its_write_is_told_by_its_row() {
    let Some(setup) = setup("q9_report_read_or_write_lost") else { return };
    let mut queue = setup.queue();
    for _ in 0..6 {
        queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    }
    let retry = || Failure::retryable("boom".to_owned());
    // A retry is decided on a fresh read: one answer for the read, one for the write.
    for (cut, what) in [
        (Cut::Answer(1), "the read's answer lost: the read runs again"),
        (Cut::Answer(2), "the write committed, its answer lost"),
        (Cut::Request(2), "the write never reached the server: decided again"),
    ] {
        let jobs = queue.claim_batch("w", &["t"], 2).unwrap();
        assert_eq!(queue.fail(&jobs[0], retry()).unwrap(), Status::Pending);
        let cuts = setup.proxy.cuts();
        cut.arm(&setup.proxy);
        assert_eq!(queue.fail(&jobs[1], retry()).unwrap(), Status::Pending, "{what}");
        assert_eq!(setup.proxy.cuts(), cuts + 1, "{what}");
        let task = queue.task(jobs[1].id).unwrap();
        assert_eq!((task.status, task.retries_used(), task.attempt()), (Status::Pending, 1, 2), "{what}");
    }
    let again = queue.claim_batch("w", &["t"], 10).unwrap();
    assert_eq!(again.iter().map(|job| job.attempt).collect::<Vec<_>>(), [2; 6], "each task's attempt 2, once");
}

enum Cut {
    Answer(u32),
    Request(u32),
}

impl Cut {
    fn arm(&self, proxy: &Proxy) {
        match *self {
            Cut::Answer(n) => proxy.cut_answer(n, false),
            Cut::Request(n) => proxy.cut_request(n, false),
        }
    }
}

/// A report whose write may have committed, on a row written twice since, cannot be told: it
/// returns the connection's error, not a refusal, and the store goes on.
#[test]
fn q9_a_report_whose_row_moved_on_twice_since_its_lost_write_is_an_error_not_a_refusal() {
    let Some(setup) = setup("q9_report_row_moved_on") else { return };
    let mut queue = setup.queue();
    for _ in 0..2 {
        queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap();
    }
    let warm = queue.claim("w", &["t"]).unwrap().unwrap();
    queue.complete(&warm).unwrap();
    let job = queue.claim("w", &["t"]).unwrap().unwrap();

    setup.proxy.cut_answer(1, true);
    let mut bump = setup.db.interloper();
    let id = job.id.0;
    let completing = std::thread::spawn(move || {
        let result = queue.complete(&job);
        (queue, job, result)
    });
    setup.proxy.wait_for_cuts(1);
    // While the store waits for the server, two other writes move the row on.
    bump(id);
    bump(id);
    setup.proxy.up();
    let (mut queue, job, result) = completing.join().unwrap();
    let error = lost_connection(result);
    assert!(error.to_string().starts_with("postgres: "), "{error}");
    assert_eq!(queue.task(job.id).unwrap().status, Status::Completed, "it had committed; the store goes on");
}

/// A claim lost before it read its rows runs again and hands out attempt 1. One lost after it
/// decided is an error: if the server never committed it, the task is claimed again at once;
/// if it committed, its lease, held by nobody, runs out and the next attempt is handed out
/// (D2). No attempt reaches two workers.
#[test]
fn q9_a_claim_runs_again_only_if_it_had_read_nothing() {
    let Some(setup) = setup("q9_claim_lost") else { return };
    let mut queue = setup.queue();
    let mut other = setup.db.queue();
    let ids: Vec<TaskId> = (0..4).map(|_| queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id).collect();
    let warm = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(warm.id, ids[0], "prepares the statements");
    queue.complete(&warm).unwrap();

    // A claim is BEGIN and its select (two answers), then its write and COMMIT (two more).
    setup.proxy.cut_answer(2, true);
    let claiming = std::thread::spawn(move || {
        let result = queue.claim("w", &["t"]);
        (queue, result)
    });
    setup.proxy.wait_for_cuts(1);
    setup.wait_for_sessions_to_end();
    setup.proxy.up();
    let (mut queue, result) = claiming.join().unwrap();
    let job = result.unwrap().expect("the claim ran again");
    assert_eq!((job.id, job.attempt), (ids[1], 1));
    queue.complete(&job).unwrap();

    // Its write and COMMIT never reach the server: rolled back, claimed again at once.
    setup.proxy.cut_request(3, true);
    let claiming = std::thread::spawn(move || {
        let result = queue.claim("w", &["t"]);
        (queue, result)
    });
    setup.proxy.wait_for_cuts(1 + 1);
    setup.wait_for_sessions_to_end();
    setup.proxy.up();
    let (mut queue, result) = claiming.join().unwrap();
    lost_connection(result);
    let job = queue.claim("w", &["t"]).unwrap().expect("nothing was handed out");
    assert_eq!((job.id, job.attempt), (ids[2], 1));
    queue.complete(&job).unwrap();

    // It committed, and the answer was lost: attempt 1 is out with nobody, until its lease
    // runs out.
    setup.proxy.cut_answer(4, false);
    lost_connection(queue.claim("w", &["t"]));
    assert_eq!(setup.proxy.cuts(), 3);
    assert_eq!(queue.claim("w", &["t"]).unwrap(), None, "attempt 1 is handed out");
    assert_eq!(queue.task(ids[3]).unwrap().status, Status::HandedOut);
    other.advance_clock(Duration::from_secs(11));
    let job = other.claim("w2", &["t"]).unwrap().expect("the lease ran out");
    assert_eq!((job.id, job.attempt), (ids[3], 2));
    assert_eq!(other.task(ids[3]).unwrap().retries_used(), 1, "an interrupted attempt (D2)");
}

/// An enqueue with a key runs again after a lost connection (the key makes it one task); one
/// without a key is never sent twice: the error goes to the caller, whether or not the server
/// had committed it.
#[test]
fn q9_an_enqueue_runs_again_only_with_an_idempotency_key() {
    let Some(setup) = setup("q9_enqueue_lost") else { return };
    let mut queue = setup.queue();
    let count = |payload: &str| {
        setup.count(&format!(
            "SELECT count(*) FROM t_q9_enqueue_lost.persevere_tasks WHERE payload = '{payload}'::bytea"
        ))
    };
    // Prepares every statement an enqueue runs, on the connection as it is now.
    let warm = |queue: &mut Queue<Postgres>| {
        queue.enqueue(NewTask::new("t", "warm", policy(3))).unwrap();
        queue.enqueue(NewTask::new("t", "warm", policy(3)).key("warm")).unwrap();
        queue.enqueue_batch(vec![NewTask::new("t", "warm", policy(3)).key("warm")]).unwrap();
    };
    let keyed = |payload: &str, key: &str| NewTask::new("t", payload, policy(3)).key(key);
    warm(&mut queue);

    // Committed, its answer lost.
    setup.proxy.cut_answer(1, false);
    lost_connection(queue.enqueue(NewTask::new("t", "a", policy(3))));
    assert_eq!(count("a"), 1, "committed once, and not run again");
    warm(&mut queue);
    setup.proxy.cut_answer(1, false);
    let b = queue.enqueue(keyed("b", "b")).unwrap();
    assert!(!b.created, "the lost insert created it; run again, it found its key");
    assert_eq!((count("b"), queue.task(b.id).unwrap().payload), (1, b"b".to_vec()));

    // Never sent.
    warm(&mut queue);
    setup.proxy.cut_request(1, false);
    lost_connection(queue.enqueue(NewTask::new("t", "c", policy(3))));
    assert_eq!(count("c"), 0, "the caller decides");
    warm(&mut queue);
    setup.proxy.cut_request(1, false);
    assert!(queue.enqueue(keyed("d", "d")).unwrap().created);
    assert_eq!(count("d"), 1);

    // A batch runs again if every task has a key; with a keyless one, the error.
    warm(&mut queue);
    setup.proxy.cut_answer(1, false);
    let e = queue.enqueue_batch(vec![keyed("e", "e1"), keyed("e", "e2")]).unwrap();
    assert_eq!(e.iter().map(|e| e.created).collect::<Vec<_>>(), [false, false]);
    assert_eq!(count("e"), 2);
    warm(&mut queue);
    setup.proxy.cut_answer(1, false);
    lost_connection(queue.enqueue_batch(vec![keyed("f", "f1"), NewTask::new("t", "f", policy(3))]));
    assert_eq!(count("f"), 2, "committed once");
    assert_eq!(setup.proxy.cuts(), 6);
}

/// A session the server ended while the store was idle (as a restart or an administrator's
/// `pg_terminate_backend` ends it) is seen closed before a keyless enqueue is sent on it: the
/// enqueue goes to a new connection and succeeds.
#[test]
fn q9_an_enqueue_after_the_server_ended_an_idle_session_goes_to_a_new_connection() {
    let Some(setup) = setup("q9_idle_session_ended") else { return };
    let mut queue = setup.queue();
    queue.enqueue(NewTask::new("t", "before", policy(3))).unwrap();
    let ended = setup.count(&format!(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '{}'",
        setup.name
    ));
    assert_eq!(ended, 1);
    setup.wait_for_sessions_to_end();
    let id = queue.enqueue(NewTask::new("t", "after", policy(3))).unwrap().id;
    assert_eq!(queue.task(id).unwrap().payload, b"after");
    assert_eq!(setup.count("SELECT count(*) FROM t_q9_idle_session_ended.persevere_tasks"), 2);
}

/// While the server is away a call waits for it (with backoff) and goes on when it is back;
/// past its reconnect policy's budget it returns the error, and the next call tries again.
#[test]
fn q9_a_call_waits_for_the_server_up_to_its_reconnect_budget() {
    let Some(setup) = setup("q9_reconnect_budget") else { return };
    let mut queue = setup.queue();
    let id = queue.enqueue(NewTask::new("t", "p", policy(3))).unwrap().id;

    setup.proxy.down();
    let start = Instant::now();
    let proxy = Arc::clone(&setup.proxy.shared);
    let back = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        proxy.state.lock().unwrap().down = false;
    });
    assert_eq!(queue.task(id).unwrap().status, Status::Pending, "waited for the server");
    assert!(start.elapsed() >= Duration::from_millis(600));
    back.join().unwrap();

    let budget = RetryPolicy::builder(Backoff::constant(Duration::from_millis(50)).build().unwrap())
        .total(Duration::from_millis(300))
        .build()
        .unwrap();
    let mut queue = Queue::new(Postgres::connect(&setup.params).unwrap().reconnect_with(budget));
    setup.proxy.down();
    let start = Instant::now();
    let error = lost_connection(queue.task(id));
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(3), "{waited:?}: {error}");
    setup.proxy.up();
    assert_eq!(queue.task(id).unwrap().status, Status::Pending, "the next call connects again");
}
