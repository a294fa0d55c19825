//! The `Deliveries` table: dispatch that respects declines, lease expiry at `poll_timeout`,
//! per-state counts, and G11/G12 across many tasks.
#![cfg(feature = "alloc")]

mod common;
use common::drain;

use core::time::Duration;

use persevere::{
    Backoff, Deliveries, DeliveryAction, DeliveryCounts, DeliveryError, DeliveryPolicy, DeliveryStatus, Failure,
    FailurePolicy, FreeReturn, Instant, Interruption, RetryPolicy, TerminalKind,
};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// Task ids `u32`, types `&str`, workers `u8`, checkpoints `u32`, errors `&str`, routes `&str`.
type Table = Deliveries<u32, &'static str, u8, u32, &'static str, &'static str>;
type Policy = DeliveryPolicy<&'static str>;

fn at(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn policy(max_attempts: u32, max_redeliveries: u32) -> Policy {
    let retry = RetryPolicy::builder(Backoff::constant(Duration::from_millis(100)).build().unwrap())
        .max_attempts(max_attempts)
        .build()
        .unwrap();
    DeliveryPolicy::builder(retry)
        .max_redeliveries(max_redeliveries)
        .start_timeout(Duration::from_secs(1))
        .heartbeat_timeout(Duration::from_secs(2))
        .on_failure(FailurePolicy::Divert("recover"))
        .build()
        .unwrap()
}

#[test]
fn d3_the_table_never_offers_a_declined_type_to_that_worker_again() {
    let p = policy(3, 3);
    let mut t = Table::new();
    for (id, ty) in [(1, "pdf"), (2, "pdf"), (3, "mail")] {
        t.insert(&p, at(0), id, ty, u64::from(id) * 10).unwrap();
    }
    assert_eq!(t.hand_out_next(&p, at(0), &1), Some(1));
    t.handle_returned(&p, at(0), &1, 1, &1, FreeReturn::Declined).unwrap();
    assert!(t.has_declined(&1, &"pdf"));
    // Worker 1 skips both "pdf" tasks, including task 2 that it was never offered.
    assert_eq!(t.hand_out_next(&p, at(0), &1), Some(3));
    assert_eq!(t.hand_out_next(&p, at(0), &1), None);
    assert_eq!(t.hand_out_next(&p, at(0), &2), Some(1));
    assert_eq!(t.get(&1).unwrap().attempt(), 1, "the decline kept the attempt number");
    assert_eq!(t.hand_out_next(&p, at(0), &2), Some(2));
    assert_eq!(t.hand_out_next(&p, at(0), &2), None);
}

#[test]
fn d2_leases_and_heartbeats_expire_at_poll_timeout() {
    let p = policy(3, 3);
    let mut r = ChaCha8Rng::seed_from_u64(1);
    let mut t = Table::new();
    t.insert(&p, at(0), 1, "a", 1).unwrap();
    t.insert(&p, at(0), 2, "a", 2).unwrap();
    assert_eq!(t.poll_timeout(), None);
    t.hand_out_next(&p, at(0), &1);
    t.hand_out_next(&p, at(500), &2);
    t.handle_started(&p, at(600), &2, 1, &2).unwrap();
    drain(&mut t);
    assert_eq!(t.poll_timeout(), Some(at(1_000)), "task 1's start lease");
    t.handle_timeout(&p, at(999), &mut r);
    assert_eq!(drain(&mut t), vec![]);
    t.handle_timeout(&p, at(1_000), &mut r);
    assert_eq!(
        drain(&mut t),
        vec![(1, DeliveryAction::Revoke { worker: 1, attempt: 1, reason: Interruption::LeaseExpired })]
    );
    assert_eq!(t.poll_timeout(), Some(at(1_100)), "task 1's retry delay");
    t.handle_timeout(&p, at(1_100), &mut r);
    assert_eq!(drain(&mut t), vec![(1, DeliveryAction::Ready { attempt: 2 })]);
    assert_eq!(t.poll_timeout(), Some(at(2_600)), "task 2's heartbeat deadline");
    t.handle_timeout(&p, at(2_600), &mut r);
    assert_eq!(
        drain(&mut t),
        vec![(2, DeliveryAction::Revoke { worker: 2, attempt: 1, reason: Interruption::HeartbeatMissed })]
    );
    assert_eq!(t.get(&2).unwrap().retries_used(), 1);
}

#[test]
fn d9_counts_cover_every_task_in_exactly_one_state() {
    let p = policy(1, 0);
    let mut r = ChaCha8Rng::seed_from_u64(2);
    let mut t = Table::new();
    for id in 1..=6 {
        t.insert(&p, at(0), id, "a", 0).unwrap();
    }
    for id in 1..=5u8 {
        assert_eq!(t.hand_out_next(&p, at(0), &id), Some(u32::from(id)));
    }
    t.handle_started(&p, at(0), &2, 1, &2).unwrap();
    t.handle_success(at(0), &3, 1, &3).unwrap();
    t.handle_failure(&p, at(0), &4, 1, &4, Failure::retryable("x"), &mut r).unwrap();
    t.handle_returned(&p, at(0), &5, 1, &5, FreeReturn::SendFailed).unwrap();
    let counts = t.counts();
    assert_eq!(
        counts,
        DeliveryCounts {
            pending: 1,
            handed_out: 1,
            running: 1,
            completed: 1,
            diverted: 1,
            dead_lettered: 1,
            ..Default::default()
        }
    );
    assert_eq!(counts.total(), t.len());
    let finished: Vec<_> = drain(&mut t)
        .into_iter()
        .filter_map(|(id, a)| if let DeliveryAction::Finish(term) = a { Some((id, term.kind())) } else { None })
        .collect();
    assert_eq!(
        finished,
        vec![(3, TerminalKind::Completed), (4, TerminalKind::Diverted), (5, TerminalKind::DeadLettered)]
    );
    // Removing gives the task back; nothing is lost.
    let (ty, task) = t.remove(&3).unwrap();
    assert_eq!((ty, task.terminal().map(|t| t.kind())), ("a", Some(TerminalKind::Completed)));
    assert_eq!(t.counts().total(), 5);
}

#[test]
fn a_worker_lost_interrupts_every_attempt_it_holds() {
    let p = policy(3, 3);
    let mut r = ChaCha8Rng::seed_from_u64(3);
    let mut t = Table::new();
    for id in 1..=3 {
        t.insert(&p, at(0), id, "a", 0).unwrap();
    }
    t.hand_out_next(&p, at(0), &1);
    t.hand_out_next(&p, at(0), &1);
    t.hand_out_next(&p, at(0), &2);
    assert_eq!(t.handle_worker_lost(&p, at(5), &1, Interruption::WorkerCrashed, &mut r), 2);
    for (id, attempt) in [(1, 2), (2, 2), (3, 1)] {
        assert_eq!(t.get(&id).unwrap().attempt(), attempt, "task {id}");
    }
    assert!(matches!(t.get(&3).unwrap().status(), DeliveryStatus::HandedOut { worker: 2, .. }));
}

#[test]
fn g12_the_table_refuses_unknown_and_duplicate_ids_and_changes_nothing() {
    let p = policy(3, 3);
    let mut r = ChaCha8Rng::seed_from_u64(4);
    let mut t = Table::new();
    t.insert(&p, at(0), 1, "a", 0).unwrap();
    let before = t.clone();
    let err = t.insert(&p, at(0), 1, "b", 0).unwrap_err();
    assert_eq!((err.error, err.input), (DeliveryError::DuplicateTask, (1, "b")));
    assert_eq!(t.handle_success(at(0), &9, 1, &1), Err(DeliveryError::UnknownTask));
    let err = t.handle_failure(&p, at(0), &9, 1, &1, Failure::fatal("kept"), &mut r).unwrap_err();
    assert_eq!((err.error, err.input), (DeliveryError::UnknownTask, Failure::fatal("kept")));
    let err = t.handle_heartbeat(&p, at(0), &9, 1, &1, Some(3)).unwrap_err();
    assert_eq!((err.error, err.input), (DeliveryError::UnknownTask, Some(3)));
    assert_eq!(t.handle_success(at(0), &1, 1, &1), Err(DeliveryError::NotHandedOut { attempt: 1 }));
    assert_eq!(t, before);
}

/// `poll_action` yields the actions of every task in one queue, in the order they were made:
/// not grouped by task, not in id order.
#[test]
fn actions_of_several_inputs_to_several_tasks_come_out_in_the_order_they_were_made() {
    let p = policy(3, 3);
    let mut r = ChaCha8Rng::seed_from_u64(6);
    let mut t = Table::new();
    // Inserted out of id order: each insert makes its task's `Ready`.
    for (id, ty) in [(3, "a"), (1, "a"), (2, "b")] {
        t.insert(&p, at(0), id, ty, u64::from(id)).unwrap();
    }
    // Hand-outs go by id (1, 2, 3), then reports come back for 3, 2, 1.
    assert_eq!(t.hand_out_next(&p, at(0), &1), Some(1));
    assert_eq!(t.hand_out_next(&p, at(0), &2), Some(2));
    assert_eq!(t.hand_out_next(&p, at(0), &3), Some(3));
    t.handle_returned(&p, at(5), &3, 1, &3, FreeReturn::Declined).unwrap();
    t.handle_success(at(6), &2, 1, &2).unwrap();
    t.handle_failure(&p, at(10), &1, 1, &1, Failure::retryable("busy"), &mut r).unwrap();
    t.handle_timeout(&p, at(110), &mut r);
    assert_eq!(t.hand_out_next(&p, at(110), &3), None, "worker 3 declined type \"a\"");
    assert_eq!(t.hand_out_next(&p, at(110), &1), Some(1));

    let summary: Vec<(u32, &str, u64)> = drain(&mut t)
        .into_iter()
        .map(|(id, action)| match action {
            DeliveryAction::Ready { attempt } => (id, "ready", attempt),
            DeliveryAction::HandOut(out) => (id, "hand-out", out.attempt),
            DeliveryAction::Revoke { attempt, .. } => (id, "revoke", attempt),
            DeliveryAction::Finish(terminal) => (id, "finish", u64::from(terminal.kind() == TerminalKind::Completed)),
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (3, "ready", 1),
            (1, "ready", 1),
            (2, "ready", 1),
            (1, "hand-out", 1),
            (2, "hand-out", 1),
            (3, "hand-out", 1),
            (3, "ready", 1),
            (2, "finish", 1),
            (1, "ready", 2),
            (1, "hand-out", 2),
        ]
    );
    assert_eq!(t.poll_action(), None);
}

/// A table of owned types, as one loaded from storage is (a `&'static str` cannot be loaded
/// from a string that goes away).
#[cfg(feature = "serde")]
type Owned = Deliveries<u32, u8, u8, u32, u32, u32>;

/// The policy of the `Owned` tables: three attempts 100 ms apart, diverted on failure.
#[cfg(feature = "serde")]
fn owned_policy() -> DeliveryPolicy<u32> {
    let retry = RetryPolicy::builder(Backoff::constant(Duration::from_millis(100)).build().unwrap())
        .max_attempts(3)
        .build()
        .unwrap();
    DeliveryPolicy::builder(retry).on_failure(FailurePolicy::Divert(9u32)).build().unwrap()
}

/// A table persists its tasks, the declines and the undrained actions, and resumes exactly.
#[cfg(feature = "serde")]
#[test]
fn a_table_survives_a_serde_round_trip_with_its_tasks_declines_and_undrained_actions() {
    let p = owned_policy();
    let mut r = ChaCha8Rng::seed_from_u64(7);
    let mut t = Owned::new();
    for (id, ty) in [(1, 0u8), (2, 0), (3, 1)] {
        t.insert(&p, at(0), id, ty, u64::from(id)).unwrap();
    }
    assert_eq!(t.hand_out_next(&p, at(0), &1), Some(1));
    t.handle_returned(&p, at(1), &1, 1, &1, FreeReturn::Declined).unwrap();
    assert_eq!(t.hand_out_next(&p, at(2), &2), Some(1));
    t.handle_heartbeat(&p, at(3), &1, 1, &2, Some(44)).unwrap();
    assert_eq!(t.hand_out_next(&p, at(4), &1), Some(3), "worker 1 declined type 0");
    t.handle_failure(&p, at(5), &3, 1, &1, Failure::retryable(500), &mut r).unwrap();
    // Nothing drained yet: seven actions wait (three `Ready`, a decline's `Ready`, three hand-outs).

    let json = serde_json::to_string(&t).unwrap();
    let mut back: Owned = serde_json::from_str(&json).unwrap();
    assert_eq!(back, t, "tasks, declines and undrained actions all come back");
    assert!(back.has_declined(&1, &0));
    assert_eq!(back.counts(), t.counts());
    assert_eq!(back.get(&1).unwrap().checkpoint(), Some(&44));
    let actions: Vec<_> = core::iter::from_fn(|| t.poll_action()).collect();
    assert_eq!(actions.len(), 7, "{actions:?}");
    assert_eq!(core::iter::from_fn(|| back.poll_action()).collect::<Vec<_>>(), actions);

    // Both resume alike: the loaded table still refuses worker 1 a type-0 task.
    assert_eq!(back.hand_out_next(&p, at(200), &1), t.hand_out_next(&p, at(200), &1));
    back.handle_success(at(201), &1, 1, &2).unwrap();
    t.handle_success(at(201), &1, 1, &2).unwrap();
    assert_eq!(back, t);
}

/// Any state that loads is safe to drive (persevere's crate docs, *Plain data*): a table whose
/// tasks or queued actions no inputs could have made is refused when it loads, with a message that
/// says what is wrong; a table whose task was removed and added again under its old id loads.
#[cfg(feature = "serde")]
#[test]
fn a_loaded_table_whose_tasks_or_queued_actions_no_input_could_make_is_refused() {
    use persevere::Delivery;
    use serde_json::{Value, json};
    let p = owned_policy();
    // Task 1 handed out, task 2 completed (its `Finish` queued), nothing drained.
    let mut t = Owned::new();
    for id in [1, 2] {
        t.insert(&p, at(0), id, 0, u64::from(id)).unwrap();
    }
    assert_eq!(t.hand_out_next(&p, at(1), &7), Some(1));
    assert_eq!(t.hand_out_next(&p, at(1), &7), Some(2));
    t.handle_success(at(2), &2, 1, &7).unwrap();
    let saved = serde_json::to_value(&t).unwrap();
    let load = |edit: &dyn Fn(&mut Value)| {
        let mut value = saved.clone();
        edit(&mut value);
        serde_json::from_value::<Owned>(value).map(|_| ()).map_err(|e| e.to_string())
    };
    assert_eq!(load(&|_| {}), Ok(()));
    // The index of a queued action of `task` of the given kind.
    let find = |task: u32, kind: &str| {
        saved["actions"]
            .as_array()
            .unwrap()
            .iter()
            .position(|a| a[0] == json!(task) && a[1].get(kind).is_some())
            .unwrap()
    };

    type Edit<'a> = &'a dyn Fn(&mut Value);
    let refusals: [(&str, Edit<'_>); 7] = [
        ("filed under another id", &|v| {
            let task = v["tasks"].as_object_mut().unwrap().remove("1").unwrap();
            v["tasks"]["5"] = task;
        }),
        ("holds undrained actions", &|v| {
            // A fresh task, its `Ready` not drained into the table's queue.
            v["tasks"]["1"]["delivery"] =
                serde_json::to_value(Delivery::<u32, u8, u32, u32, u32>::new(&p, at(0), 1, 1)).unwrap();
        }),
        ("hand-out names another task", &|v| v["actions"][find(1, "HandOut")][1]["HandOut"]["key"]["task"] = json!(2)),
        ("an attempt its task has not reached", &|v| v["actions"][find(1, "Ready")][1]["Ready"]["attempt"] = json!(2)),
        ("go on after its outcome", &|v| {
            // Task 2's outcome queued twice: the older one has an action after it.
            let finish = v["actions"][find(2, "Finish")].clone();
            v["actions"].as_array_mut().unwrap().push(finish);
        }),
        ("actions queued after its outcome", &|v| {
            let ready = v["actions"][find(2, "Ready")].clone();
            v["actions"].as_array_mut().unwrap().push(ready);
        }),
        ("not of the kind its task finished with", &|v| {
            // Task 2 as it was before it completed: handed out, drained.
            let mut earlier = Owned::new();
            earlier.insert(&p, at(0), 2, 0, 2).unwrap();
            assert_eq!(earlier.hand_out_next(&p, at(1), &7), Some(2));
            v["tasks"]["2"] = serde_json::to_value(&earlier).unwrap()["tasks"]["2"].take();
        }),
    ];
    for (why, edit) in refusals {
        let refused = load(edit).expect_err(why);
        assert!(refused.contains(why), "{why}: {refused}");
    }

    // Task 2 removed, then added again under its id: its old `Finish` is followed by the new
    // task's `Ready`, and the table loads (and resumes) as it was.
    t.remove(&2).unwrap();
    t.insert(&p, at(3), 2, 0, 22).unwrap();
    let back: Owned = serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
    assert_eq!(back, t);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// G11 and G12 across a table: refused inputs change nothing, every task is always counted in
    /// exactly one state, and each task finishes at most once.
    #[test]
    fn g11_g12_every_task_is_in_one_state_and_finishes_once(
        ops in prop::collection::vec((0..8u8, 1..5u32, 0..4u8, 0..3u8, 0..2_000u16), 1..120),
        seed in any::<u64>(),
    ) {
        let p = policy(3, 2);
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        let mut t = Table::new();
        for id in 1..=4 {
            t.insert(&p, at(0), id, ["a", "b"][id as usize % 2], u64::from(id)).unwrap();
        }
        let mut now = at(0);
        let mut finishes = [0u32; 5];
        for (kind, id, worker, k, dt) in ops {
            let before = t.clone();
            let attempt = t.get(&id).map_or(1, |d| d.attempt());
            let refused = match kind {
                0 => { t.hand_out_next(&p, now, &worker); false }
                1 => t.handle_started(&p, now, &id, attempt, &worker).is_err(),
                2 => t.handle_success(now, &id, attempt, &worker).is_err(),
                3 => t.handle_failure(&p, now, &id, attempt, &worker, Failure::retryable("e"), &mut r).is_err(),
                4 => t.handle_returned(&p, now, &id, attempt, &worker,
                        [FreeReturn::Declined, FreeReturn::SendFailed, FreeReturn::ClosedBeforeStart][k as usize]).is_err(),
                5 => { t.handle_worker_lost(&p, now, &worker, Interruption::Disconnected, &mut r); false }
                6 => t.handle_heartbeat(&p, now, &id, attempt, &worker, Some(u32::from(dt))).is_err(),
                _ => { now = now.saturating_add(Duration::from_millis(u64::from(dt))); t.handle_timeout(&p, now, &mut r); false }
            };
            if refused {
                prop_assert_eq!(&t, &before, "a refused input changed the table");
            }
            while let Some((id, action)) = t.poll_action() {
                if let DeliveryAction::Finish(term) = action {
                    finishes[id as usize] += 1;
                    prop_assert_eq!(Some(&term), t.get(&id).unwrap().terminal());
                }
            }
            prop_assert_eq!(t.counts().total(), 4);
            for id in 1..=4u32 {
                let finished = t.get(&id).unwrap().terminal().is_some();
                prop_assert_eq!(finishes[id as usize], u32::from(finished), "task {} finish count", id);
            }
        }
    }
}

/// Time never runs backwards inside a machine (the crate docs, *Time is an argument*), and a table
/// reads it as each of its tasks would: a timeout with a stale `now` expires what the task's own
/// latest `now` makes due.
#[test]
fn a_stale_timeout_expires_what_each_tasks_latest_now_makes_due() {
    // Async: the persisted start is an input with its own `now`.
    let p = DeliveryPolicy::builder(*policy(3, 3).retry())
        .durability(persevere::Durability::Async)
        .start_timeout(Duration::from_secs(1))
        .on_failure(FailurePolicy::Divert("recover"))
        .build()
        .unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut table = Table::new();
    table.insert(&p, at(0), 1, "pdf", 1).unwrap();
    assert_eq!(table.hand_out_next(&p, at(1_000), &7), Some(1)); // lease until 2 s
    table.handle_persisted(at(3_000), &1, 1).unwrap(); // the task has seen 3 s
    drain(&mut table);
    table.handle_timeout(&p, at(1_500), &mut rng); // a stale reading: read as 3 s
    let actions = drain(&mut table);
    assert!(
        actions.iter().any(|(_, a)| matches!(a, DeliveryAction::Revoke { reason: Interruption::LeaseExpired, .. })),
        "the lease ended at 2 s, before the task's latest 3 s: {actions:?}"
    );
    assert!(matches!(table.get(&1).unwrap().status(), DeliveryStatus::Pending { attempt: 2, .. }));
}

#[test]
fn d9_the_total_counts_every_state_once() {
    let counts = DeliveryCounts {
        pending: 1,
        handed_out: 2,
        running: 4,
        completed: 8,
        failed: 16,
        proceeded: 32,
        diverted: 64,
        dead_lettered: 128,
    };
    assert_eq!(counts.total(), 255);
}

#[test]
fn d2_the_table_interrupts_the_attempts_of_the_lost_worker_only() {
    let p = policy(3, 3);
    let mut t = Table::new();
    let mut r = ChaCha8Rng::seed_from_u64(7);
    assert!(t.is_empty());
    for (id, ty) in [(1, "pdf"), (2, "mail"), (3, "pdf")] {
        t.insert(&p, at(0), id, ty, u64::from(id)).unwrap();
    }
    assert!(!t.is_empty());
    assert_eq!(
        t.iter().map(|(id, ty, task)| (*id, *ty, task.attempt())).collect::<Vec<_>>(),
        [(1, "pdf", 1), (2, "mail", 1), (3, "pdf", 1)]
    );
    assert_eq!((t.task_type(&2), t.task_type(&9)), (Some(&"mail"), None));
    assert!(!t.has_declined(&1, &"pdf"), "nobody declined anything yet");
    for worker in 1..=3u8 {
        assert_eq!(t.hand_out_next(&p, at(0), &worker), Some(u32::from(worker)));
    }
    // Worker 1's attempt is interrupted by a disconnect: it consumes a retry (D2).
    t.handle_interrupted(&p, at(10), &1, 1, &1, Interruption::Disconnected, &mut r).unwrap();
    assert!(matches!(t.get(&1).unwrap().status(), DeliveryStatus::Pending { attempt: 2, .. }));
    assert_eq!(
        t.handle_interrupted(&p, at(10), &2, 1, &1, Interruption::Disconnected, &mut r),
        Err(DeliveryError::WrongWorker { attempt: 1 })
    );
    // Worker 2 crashes: only the attempt it holds is interrupted.
    assert_eq!(t.handle_worker_lost(&p, at(20), &2, Interruption::WorkerCrashed, &mut r), 1);
    assert!(matches!(t.get(&2).unwrap().status(), DeliveryStatus::Pending { attempt: 2, .. }));
    assert!(matches!(t.get(&3).unwrap().status(), DeliveryStatus::HandedOut { attempt: 1, worker: 3, .. }));
}

#[test]
fn d6_a_failover_of_the_table_interrupts_every_attempt_out() {
    let p = policy(3, 3);
    let mut t = Table::new();
    let mut r = ChaCha8Rng::seed_from_u64(7);
    for id in 1..=2 {
        t.insert(&p, at(0), id, "pdf", u64::from(id)).unwrap();
    }
    assert_eq!(t.hand_out_next(&p, at(0), &1), Some(1));
    t.handle_failover(&p, at(10), &mut r);
    // `Sync`: the hand-out was durable, so the failover consumes a retry (D2, D6); the task
    // that was never handed out is untouched.
    assert!(matches!(t.get(&1).unwrap().status(), DeliveryStatus::Pending { attempt: 2, .. }));
    assert!(matches!(t.get(&2).unwrap().status(), DeliveryStatus::Pending { attempt: 1, not_before: None }));
}
