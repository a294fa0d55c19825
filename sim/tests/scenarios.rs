//! `cargo test -p sim`: the seeded scenario suites, determinism (G0), replay, and proof that the
//! checks catch injected bugs.
//!
//! `SIM_RUNS` scales the number of seeds per family (default sized for CI); `SIM_SEED` and
//! `SIM_MACHINE` select the scenario the `replay` test runs.

use proptest::prelude::*;
use sim::breaker::BreakerBug;
use sim::delivery::DeliveryBug;
use sim::flow::FlowBug;
use sim::retry::RetryBug;
use sim::supervision::SupervisionBug;
use sim::{Machine, suite};

fn runs(default: u64) -> u64 {
    std::env::var("SIM_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn retry_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Retry, 0, runs(20_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios, "the checks ran");
}

#[test]
fn supervision_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Supervision, 0, runs(50_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios);
}

#[test]
fn flow_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Flow, 0, runs(30_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios);
}

#[test]
fn breaker_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Breaker, 0, runs(25_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios);
}

#[test]
fn delivery_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Delivery, 0, runs(30_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios);
}

#[test]
fn hedge_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Hedge, 0, runs(5_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios * 4, "{totals:?}");
}

#[test]
fn supervisor_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Supervisor, 0, runs(3_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios * 10, "{totals:?}");
}

#[test]
fn scheduler_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Scheduler, 0, runs(3_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > totals.scenarios * 4, "{totals:?}");
}

#[test]
fn driven_scenarios_hold_every_guarantee() {
    let totals = suite(Machine::Driven, 0, runs(5_000)).unwrap_or_else(|v| panic!("{v}"));
    assert!(totals.checks > 0);
}

#[test]
fn g0_each_seed_gives_the_same_trace_twice() {
    for machine in Machine::ALL {
        for seed in 0..200 {
            let (a, b) = (machine.run(seed).unwrap(), machine.run(seed).unwrap());
            assert_eq!(a, b, "{} seed {seed}", machine.name());
        }
        let hashes: std::collections::BTreeSet<u64> = (0..50).map(|s| machine.run(s).unwrap().trace_hash).collect();
        assert!(hashes.len() > 40, "different seeds give different traces");
    }
}

#[test]
fn replay() {
    // `SIM_SEED=… SIM_MACHINE=… cargo test -p sim --test scenarios replay -- --nocapture`
    let seed = std::env::var("SIM_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(42);
    let machine = std::env::var("SIM_MACHINE").ok().and_then(|m| Machine::from_name(&m)).unwrap_or(Machine::Retry);
    match machine.run(seed) {
        Ok(s) => println!("{} seed {seed}: ok, trace hash {:016x}", machine.name(), s.trace_hash),
        Err(v) => panic!("{v}"),
    }
}

/// Runs seeds until the bug is caught; returns the violated rule.
fn caught(bug: RetryBug) -> &'static str {
    (0..5_000)
        .find_map(|seed| sim::retry::run(seed, Some(bug)).err())
        .unwrap_or_else(|| panic!("{bug:?} was never caught"))
        .rule
}

#[test]
fn an_injected_retry_of_fatal_failures_is_caught_as_g4() {
    assert_eq!(caught(RetryBug::RetryFatal), "G4");
}

#[test]
fn an_injected_delay_past_the_cap_is_caught_as_g1() {
    assert_eq!(caught(RetryBug::DelayPastCap), "G1");
}

#[test]
fn an_injected_extra_attempt_is_caught_as_g2() {
    assert_eq!(caught(RetryBug::ExtraAttempt), "G2");
}

#[test]
fn b6_an_injected_shortened_hint_is_caught_as_g1() {
    // A hint past max_hint shortened to it (the rule before issue 12) instead of deferring.
    assert_eq!(caught(RetryBug::ClampHint), "G1");
}

/// Runs seeds of a family with an injected bug until it is caught; returns the violated rule.
fn caught_by(name: &str, run: impl Fn(u64) -> Result<sim::Summary, sim::Violation>) -> &'static str {
    (0..5_000).find_map(|seed| run(seed).err()).unwrap_or_else(|| panic!("{name} was never caught")).rule
}

#[test]
fn an_injected_retry_of_a_fatal_task_failure_is_caught_as_g4() {
    assert_eq!(caught_by("RetryFatal", |s| sim::supervision::run(s, Some(SupervisionBug::RetryFatal))), "G4");
}

#[test]
fn an_injected_periodic_interval_from_the_start_is_caught_as_g6() {
    assert_eq!(
        caught_by("IntervalFromStart", |s| sim::supervision::run(s, Some(SupervisionBug::IntervalFromStart))),
        "G6"
    );
}

#[test]
fn an_injected_second_task_finished_is_caught_as_g11() {
    assert_eq!(caught_by("DoubleFinish", |s| sim::supervision::run(s, Some(SupervisionBug::DoubleFinish))), "G11");
}

#[test]
fn b6_an_injected_shortened_task_hint_is_caught_as_g1() {
    assert_eq!(caught_by("ClampHint", |s| sim::supervision::run(s, Some(SupervisionBug::ClampHint))), "G1");
}

#[test]
fn an_injected_dispatch_of_a_tripped_flow_is_caught_as_g5() {
    assert_eq!(caught_by("DispatchWhileTripped", |s| sim::flow::run(s, Some(FlowBug::DispatchWhileTripped))), "G5");
}

#[test]
fn an_injected_replay_of_a_skipped_cron_tick_is_caught_as_g6() {
    assert_eq!(caught_by("ReplaySkippedTick", |s| sim::flow::run(s, Some(FlowBug::ReplaySkippedTick))), "G6");
}

#[test]
fn an_injected_extra_half_open_probe_is_caught_as_g8() {
    assert_eq!(caught_by("ExtraProbe", |s| sim::breaker::run(s, Some(BreakerBug::ExtraProbe))), "G8");
}

#[test]
fn an_injected_admission_while_open_is_caught_as_g8() {
    assert_eq!(caught_by("AdmitWhileOpen", |s| sim::breaker::run(s, Some(BreakerBug::AdmitWhileOpen))), "G8");
}

#[test]
fn an_injected_budget_overgrant_is_caught_as_g9() {
    assert_eq!(caught_by("Overgrant", |s| sim::breaker::run(s, Some(BreakerBug::Overgrant))), "G9");
}

#[test]
fn an_injected_second_worker_for_a_sync_attempt_is_caught_as_g10() {
    assert_eq!(caught_by("SecondWorker", |s| sim::delivery::run(s, Some(DeliveryBug::SecondWorker))), "G10");
}

#[test]
fn an_injected_free_return_that_consumes_a_retry_is_caught_as_g10() {
    assert_eq!(
        caught_by("DeclineAsDisconnect", |s| sim::delivery::run(s, Some(DeliveryBug::DeclineAsDisconnect))),
        "G10"
    );
}

#[test]
fn an_injected_lost_task_is_caught_as_g11() {
    assert_eq!(caught_by("LoseCompleted", |s| sim::delivery::run(s, Some(DeliveryBug::LoseCompleted))), "G11");
}

#[test]
fn an_injected_second_task_finished_of_a_supervised_task_is_caught_as_g11() {
    let bug = Some(sim::supervisor::SupervisorBug::SecondFinish);
    assert_eq!(caught_by("supervisor", |seed| sim::supervisor::run_with(seed, bug)), "G11");
}

#[test]
fn s4_an_injected_report_that_forgets_an_aborted_task_is_caught() {
    let bug = Some(sim::supervisor::SupervisorBug::ForgottenAbort);
    assert_eq!(caught_by("supervisor", |seed| sim::supervisor::run_with(seed, bug)), "S4");
}

#[test]
fn an_injected_lost_reset_of_a_scheduled_flow_is_caught_as_f10() {
    let bug = Some(sim::scheduler::SchedulerBug::LostReset);
    assert_eq!(caught_by("scheduler", |seed| sim::scheduler::run_with(seed, bug)), "F10");
}

#[test]
fn an_injected_restart_after_fatal_in_the_drivers_supervisor_is_caught_as_g4() {
    let bug = Some(sim::supervisor::SupervisorBug::RestartAfterFatal);
    assert_eq!(caught_by("supervisor", |seed| sim::supervisor::run_with(seed, bug)), "G4");
}

#[test]
fn an_injected_dropped_task_finished_in_the_drivers_supervisor_is_caught_as_g11() {
    let bug = Some(sim::supervisor::SupervisorBug::DroppedFinish);
    assert_eq!(caught_by("supervisor", |seed| sim::supervisor::run_with(seed, bug)), "G11");
}

#[test]
fn an_injected_dispatch_while_tripped_in_the_drivers_scheduler_is_caught_as_g5() {
    let bug = Some(sim::scheduler::SchedulerBug::DispatchWhileTripped);
    assert_eq!(caught_by("scheduler", |seed| sim::scheduler::run_with(seed, bug)), "G5");
}

#[test]
fn an_injected_replay_of_a_skipped_tick_in_the_drivers_scheduler_is_caught_as_g6() {
    let bug = Some(sim::scheduler::SchedulerBug::ReplaySkippedTick);
    assert_eq!(caught_by("scheduler", |seed| sim::scheduler::run_with(seed, bug)), "G6");
}

#[test]
fn a_violation_names_the_seed_and_the_replay_commands() {
    let violation = (0..5_000).find_map(|seed| sim::retry::run(seed, Some(RetryBug::RetryFatal)).err()).unwrap();
    let text = violation.to_string();
    assert!(text.contains(&format!("seed: {}", violation.seed)));
    assert!(text.contains(&format!("cargo run -p sim --release -- replay retry {}", violation.seed)));
    assert!(text.contains(&format!("SIM_SEED={}", violation.seed)));
    assert!(!violation.recent.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Arbitrary seeds, beyond the fixed ranges above.
    #[test]
    fn any_seed_holds_every_guarantee(seed in any::<u64>()) {
        for machine in Machine::ALL {
            if let Err(v) = machine.run(seed) {
                prop_assert!(false, "{}", v);
            }
        }
    }
}
