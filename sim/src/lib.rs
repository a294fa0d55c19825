//! # sim — persevere's deterministic simulator
//!
//! One `u64` seed feeds a ChaCha RNG that draws everything: the scenario itself (policies,
//! workloads, fault rates — swarm testing), the faults, and the jitter. The simulator drives the
//! real core machines, and the real driving loop on a virtual-time executor, and checks the
//! guarantees G0–G13 (`docs/RULES.md`) after every step. A failure prints the seed, the step, the
//! recent trace and the commands that replay it. No wall clock, no threads, no `HashMap` iteration:
//! the same seed gives the same trace hash (G0).
//!
//! Scenario families ([`Machine`]), one module each:
//!
//! - `retry` — several [`persevere::Retry`] machines interleaved, with a shared budget;
//! - `driven` — the real `persevere_driver::retry` loop on the virtual-time executor;
//! - `supervision` — supervised tasks of every restart mode (S1–S6);
//! - `flow` — recurring every and cron flows in one [`persevere::Flows`] registry (F1–F10);
//! - `breaker` — a [`persevere::Breaker`] and a shared retry budget under many callers (K, U);
//! - `delivery` — a [`persevere::Deliveries`] table and unreliable workers (D1–D10);
//! - `hedge` — the real `persevere_driver::hedge` driver on virtual time (X1–X5).
//!
//! Each family draws its scenario from the seed, drives the real machines, checks every step
//! against a reference model; the families over the machines alone have a `…Bug` enum of
//! injected defects that prove their checks can fail (the two over the real driver,
//! `driven` and `hedge`, were shown to catch real defects of it instead).
#![deny(missing_docs)]

pub mod breaker;
pub mod contention;
pub mod delivery;
pub mod driven;
pub mod executor;
pub mod flow;
pub mod fuzzing;
pub mod hedge;
pub mod model;
pub mod outage;
pub mod overload;
pub mod plot;
pub mod retry;
pub mod scheduler;
pub mod supervision;
pub mod supervisor;
pub mod tasks;
pub mod world;

pub use world::{Summary, Violation, World};

/// A scenario family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Machine {
    /// Interleaved retry machines with a shared token bucket.
    Retry,
    /// The real async driving loop on virtual time.
    Driven,
    /// Interleaved supervised tasks.
    Supervision,
    /// Recurring flows in one registry.
    Flow,
    /// A circuit breaker and a retry budget shared by many callers.
    Breaker,
    /// A delivery table handing tasks to unreliable workers.
    Delivery,
    /// The real hedging driver on virtual time.
    Hedge,
    /// The real supervisor of the driver, its tasks spawned on a many-task executor.
    Supervisor,
    /// The real scheduler of the driver, its timer loop and runs spawned on a many-task executor.
    Scheduler,
}

impl Machine {
    /// Every family, in report order.
    pub const ALL: [Machine; 9] = [
        Machine::Retry,
        Machine::Driven,
        Machine::Supervision,
        Machine::Flow,
        Machine::Breaker,
        Machine::Delivery,
        Machine::Hedge,
        Machine::Supervisor,
        Machine::Scheduler,
    ];

    /// The family's name, as used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Machine::Retry => "retry",
            Machine::Driven => "driven",
            Machine::Supervision => "supervision",
            Machine::Flow => "flow",
            Machine::Breaker => "breaker",
            Machine::Delivery => "delivery",
            Machine::Hedge => "hedge",
            Machine::Supervisor => "supervisor",
            Machine::Scheduler => "scheduler",
        }
    }

    /// The family named `name`.
    pub fn from_name(name: &str) -> Option<Machine> {
        Machine::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Runs the scenario of `seed`.
    pub fn run(self, seed: u64) -> Result<Summary, Violation> {
        match self {
            Machine::Retry => retry::run(seed, None),
            Machine::Driven => driven::run(seed),
            Machine::Supervision => supervision::run(seed, None),
            Machine::Flow => flow::run(seed, None),
            Machine::Breaker => breaker::run(seed, None),
            Machine::Delivery => delivery::run(seed, None),
            Machine::Hedge => hedge::run(seed),
            Machine::Supervisor => supervisor::run(seed),
            Machine::Scheduler => scheduler::run(seed),
        }
    }
}

/// Totals over many scenarios.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    /// Scenarios run.
    pub scenarios: u64,
    /// Steps taken.
    pub steps: u64,
    /// Guarantee checks evaluated.
    pub checks: u64,
    /// Events traced.
    pub events: u64,
    /// Checks evaluated per rule (see [`world::rule_name`]).
    pub by_rule: [u64; world::RULES],
}

/// Runs `count` scenarios of `machine` from seed `first` on; stops at the first violation.
pub fn suite(machine: Machine, first: u64, count: u64) -> Result<Totals, Violation> {
    let mut totals = Totals::default();
    for seed in first..first.saturating_add(count) {
        let s = machine.run(seed)?;
        totals.scenarios += 1;
        totals.steps += s.steps;
        totals.checks += s.checks;
        totals.events += s.events;
        for (total, n) in totals.by_rule.iter_mut().zip(s.by_rule) {
            *total += n;
        }
    }
    Ok(totals)
}
