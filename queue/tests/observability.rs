//! O2 for the durable queue: every task that ends is logged and counted once its write has
//! committed, dead letters included (docs/guide.md's Observability section).
#![cfg(all(feature = "tracing", feature = "metrics", feature = "sqlite"))]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use persevere::Failure;
use persevere_queue::{NewTask, Queue, Sqlite, Status};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

mod common;
use common::policy;

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
