//! O2 for the durable queue: every task that ends is logged and counted once its write has
//! committed, dead letters included, and a runner tells its batches, lost leases and shutdown
//! (docs/guide.md's Observability section).
#![cfg(all(feature = "tracing", feature = "metrics", feature = "sqlite"))]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use persevere::Failure;
use persevere_queue::{Handled, NewTask, Queue, Runner, Sqlite, Status};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

mod common;
use common::{Db, policy};

/// Writes down each event as `target: message field=value …`.
struct Lines(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            self.0.push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

impl Subscriber for Lines {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.0.lock().unwrap().push(format!("{}: {}", event.metadata().target(), fields.0));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// Four tasks end four ways, through each path that can end one: a report that completes, a
/// report that fails the last attempt, a fourth free return (a dead letter, D4), and a sweep
/// that finds a lease run out on the last attempt. A refused report ends nothing.
fn scenario(queue: &mut Queue<Sqlite>) {
    let completed = queue.enqueue(NewTask::new("t", "a", policy(3))).unwrap().id;
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!((job.id, queue.complete(&job).unwrap()), (completed, Status::Completed));
    assert!(queue.complete(&job).is_err(), "a report for a finished task is refused, and tells nothing");

    queue.enqueue(NewTask::new("t", "b", policy(1))).unwrap();
    let job = queue.claim("w", &["t"]).unwrap().unwrap();
    assert_eq!(queue.fail(&job, Failure::retryable("down".into())).unwrap(), Status::Failed);

    queue.enqueue(NewTask::new("declined", "c", policy(5))).unwrap();
    for worker in ["w1", "w2", "w3", "w4"] {
        let job = queue.claim(worker, &["declined"]).unwrap().unwrap();
        queue.decline(&job).unwrap();
    }

    queue.enqueue(NewTask::new("lost", "d", policy(1))).unwrap();
    let _lost = queue.claim("w", &["lost"]).unwrap().unwrap();
    queue.advance_clock(Duration::from_secs(11));
    assert_eq!(queue.sweep(10).unwrap(), 1);
}

#[test]
fn o2_every_task_that_ends_is_one_event_and_dead_letters_are_counted() {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(Lines(lines.clone()), || {
            scenario(&mut Queue::new(Sqlite::in_memory().unwrap()));
        });
    });
    assert_eq!(
        *lines.lock().unwrap(),
        [
            r#"persevere::queue: task finished task=1 status="completed" attempt=1"#,
            r#"persevere::queue: task finished task=2 status="failed" attempt=1"#,
            r#"persevere::queue: task finished task=3 status="dead_lettered" attempt=1"#,
            r#"persevere::queue: task finished task=4 status="failed" attempt=1"#,
        ]
    );
    let figures: BTreeMap<String, u64> = recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<_> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let DebugValue::Counter(n) = value else { panic!("{key:?} is not a counter") };
            (format!("{}{{{}}}", key.name(), labels.join(",")), n)
        })
        .collect();
    let expected: BTreeMap<String, u64> = [
        ("persevere_tasks_finished_total{status=completed}", 1),
        ("persevere_tasks_finished_total{status=failed}", 2),
        ("persevere_tasks_finished_total{status=dead_lettered}", 1),
        ("persevere_dead_letters_total{}", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(figures, expected);
}

/// The counters and histograms `recorder` holds: a counter's value, a histogram's sum.
fn figures(recorder: &DebuggingRecorder) -> BTreeMap<String, f64> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<_> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Histogram(values) => values.iter().map(|v| v.into_inner()).sum(),
                DebugValue::Gauge(value) => value.into_inner(),
            };
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

/// A runner claims two jobs in one batch; the first one's lease is lost while its handler runs
/// (another worker, whose clock reads 11 s later, takes and completes attempt 2); the second
/// completes. Every event is told from the runner's own thread (the one `run_blocking` runs on).
#[test]
fn o2_a_runner_tells_its_batches_its_lost_leases_and_its_shutdown() {
    let db = common::sqlite("o2_a_runner_tells");
    let mut producer = db.queue();
    let lost = producer.enqueue(NewTask::new("t", "lost", policy(3))).unwrap().id;
    producer.enqueue(NewTask::new("t", "kept", policy(3))).unwrap();
    let runner = Runner::builder(db.queue(), "w", &["t"]).build();
    let stop = runner.shutdown_handle();
    let ((started, starts), (release, released)) = (mpsc::channel(), mpsc::channel::<()>());
    let (started, released) = (Mutex::new(started), Mutex::new(released));
    let thief = std::thread::spawn(move || {
        assert_eq!(starts.recv().unwrap(), lost);
        let mut thief = db.queue();
        thief.advance_clock(Duration::from_secs(11));
        let job = thief.claim("thief", &["t"]).unwrap().expect("the lease ran out");
        thief.complete(&job).unwrap();
        release.send(()).unwrap();
        starts.recv().unwrap();
        // The second job runs: the shutdown waits for it.
        stop.shutdown(Duration::from_secs(10));
    });
    let lines = Arc::new(Mutex::new(Vec::new()));
    let recorder = DebuggingRecorder::new();
    let report = metrics::with_local_recorder(&recorder, || {
        tracing::subscriber::with_default(Lines(lines.clone()), || {
            runner.run_blocking(move |job| {
                started.lock().unwrap().send(job.id).unwrap();
                if job.payload == b"lost" {
                    released.lock().unwrap().recv().unwrap();
                }
                Handled::Completed
            })
        })
    });
    thief.join().unwrap();
    let lines = lines.lock().unwrap();
    let with = |start: &str| lines.iter().filter(|l| l.starts_with(&format!("persevere::queue: {start}"))).count();
    assert_eq!(with(r#"claimed worker="w" jobs=2"#), 1, "{lines:#?}");
    assert_eq!(
        with(r#"lease lost task=1 attempt=1 worker="w" error=the task has finished (Completed)"#),
        1,
        "{lines:#?}"
    );
    assert_eq!(with(r#"task finished task=2 status="completed" attempt=1"#), 1, "{lines:#?}");
    assert!(with(r#"flushed worker="w" reports="#) >= 1, "{lines:#?}");
    assert_eq!(with(r#"runner stopping worker="w""#), 1, "{lines:#?}");
    let stopped = r#"runner stopped worker="w" claimed=2 completed=1 failed=0 declined=0 handed_back=0 interrupted=0 leases_lost=1 unreported=0"#;
    assert_eq!(with(stopped), 1, "{lines:#?}");
    assert_eq!((report.claimed, report.completed, report.leases_lost), (2, 1, 1));
    let figures = figures(&recorder);
    for (name, value) in [
        ("persevere_queue_claimed_total{}", 2.0),
        ("persevere_queue_leases_lost_total{}", 1.0),
        ("persevere_queue_flush_reports{}", 2.0),
        ("persevere_tasks_finished_total{status=completed}", 1.0),
    ] {
        assert_eq!(figures.get(name), Some(&value), "{name} in {figures:?}");
    }
    assert_eq!(figures.get("persevere_queue_store_errors_total{}"), None);
}
