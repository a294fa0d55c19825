//! The supervisor's and the scheduler's `tracing` events and the scheduler's flow-trip counter
//! (O2): exact messages, fields and figures, as docs/guide.md's Observability tables list them;
//! and their listeners, which hear the same transitions as callbacks.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Tokio, ms, until};
use persevere::{Backoff, FlowPolicy, FlowStatusKind, TaskDefaults, TaskOutcome, TripReason};
use persevere_driver::{FlowChange, FlowTransition, Scheduler, SupervisorBuilder, TaskSpec};
use persevere_tokio::{TokioRuntime, TokioSpawn};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Keeps the events of one target as `level message: name=value …`, fields in their order.
struct Recorder {
    target: &'static str,
    events: Arc<Mutex<Vec<String>>>,
}

/// An event's message and its other fields.
#[derive(Default)]
struct Line {
    message: String,
    fields: Vec<String>,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            name => self.fields.push(format!("{name}={value:?}")),
        }
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.target() == self.target
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = Line::default();
        event.record(&mut line);
        let level = event.metadata().level().as_str().to_lowercase();
        self.events.lock().unwrap().push(format!("{level} {}: {}", line.message, line.fields.join(" ")));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The events of `target` while `scenario` runs on tokio with paused time.
fn recorded(target: &'static str, scenario: impl std::future::Future<Output = ()>) -> Vec<String> {
    let events = Arc::new(Mutex::new(Vec::new()));
    let recorder = Recorder { target, events: events.clone() };
    tracing::subscriber::with_default(recorder, || common::tokio_paused().block_on(scenario));
    events.lock().unwrap().clone()
}

#[test]
fn o2_a_supervised_task_reports_each_attempt_restart_and_its_end() {
    let lines = recorded("persevere::supervisor", async {
        let supervisor = SupervisorBuilder::<TokioRuntime, TokioSpawn>::new(TaskDefaults::new()).seed(7).build();
        let calls = Arc::new(AtomicU32::new(0));
        // A listener hears what the event stream carries, and all of it.
        let heard = Arc::new(Mutex::new(Vec::new()));
        let log = heard.clone();
        supervisor.on_event(move |e| log.lock().unwrap().push(e.clone()));
        let events = supervisor.events();
        let spec = TaskSpec::restartable().backoff(Backoff::constant(ms(5)).build().unwrap());
        let exit = supervisor
            .add("mailer", spec, move || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                std::future::ready(if n < 3 { Err(format!("down {n}")) } else { Ok(()) })
            })
            .unwrap()
            .await;
        assert_eq!((exit.outcome, exit.attempts), (TaskOutcome::Completed, 3));
        let mut streamed = Vec::new();
        while let Some(event) = events.try_recv() {
            streamed.push(event);
        }
        assert_eq!(streamed.len(), 9);
        assert_eq!(*heard.lock().unwrap(), streamed);
    });
    assert_eq!(
        lines,
        [
            r#"debug attempt starting: task="mailer" attempt=1"#,
            r#"debug attempt failed: task="mailer" attempt=1 class=Retryable"#,
            r#"debug restart scheduled: task="mailer" next_attempt=2 delay_ns=5000000"#,
            r#"debug attempt starting: task="mailer" attempt=2"#,
            r#"debug attempt failed: task="mailer" attempt=2 class=Retryable"#,
            r#"debug restart scheduled: task="mailer" next_attempt=3 delay_ns=5000000"#,
            r#"debug attempt starting: task="mailer" attempt=3"#,
            r#"debug attempt succeeded: task="mailer" attempt=3"#,
            r#"info task finished: task="mailer" outcome=Completed attempts=3"#,
        ]
    );
}

#[test]
fn o2_a_flow_reports_its_runs_its_trip_and_its_reset() {
    let metrics = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = metrics.snapshotter();
    let _recorder = metrics::set_default_local_recorder(&metrics);
    let lines = recorded("persevere::scheduler", async {
        let policy =
            FlowPolicy::builder().backoff(Backoff::constant(ms(50)).build().unwrap()).with_trip(2).build().unwrap();
        let mut scheduler: Scheduler<TokioRuntime, TokioSpawn, &'static str, String> = Scheduler::new();
        scheduler.seed(1).every("sync", ms(200), || async { Err::<(), _>("unreachable".to_owned()) }).unwrap();
        scheduler.set_backoff(&"sync", policy).unwrap();
        let handle = scheduler.start();
        let heard = Arc::new(Mutex::new(Vec::new()));
        let log = heard.clone();
        handle.on_transition(move |t: &FlowTransition<&'static str>| {
            log.lock().unwrap().push((t.flow, t.change, t.sequence));
        });
        handle.on_transition(|_| panic!("a listener's panic is its own"));
        let tripped = || handle.status(&"sync").unwrap().status.kind() == FlowStatusKind::Tripped;
        until::<Tokio>(Duration::from_secs(5), tripped).await;
        handle.reset_flow(&"sync").unwrap();
        handle.stop();
        handle.wait().await;
        assert_eq!(
            *heard.lock().unwrap(),
            [
                ("sync", FlowChange::Tripped { streak: 2, reason: TripReason::Streak }, 1),
                ("sync", FlowChange::Reset, 2)
            ]
        );
    });
    assert_eq!(
        lines,
        [
            r#"debug run dispatched: flow="sync" run=1"#,
            r#"debug run failed: flow="sync" class=Retryable"#,
            r#"debug run dispatched: flow="sync" run=2"#,
            r#"debug run failed: flow="sync" class=Retryable"#,
            r#"info flow tripped: flow="sync" streak=2 reason=Streak"#,
            r#"info flow reset: flow="sync" streak=2 tripped=true"#,
        ]
    );
    let counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            metrics_util::debugging::DebugValue::Counter(n) => Some((key.key().name().to_owned(), n)),
            _ => None,
        })
        .collect();
    assert_eq!(counters, [("persevere_flow_trips_total".to_owned(), 1)]);
}
