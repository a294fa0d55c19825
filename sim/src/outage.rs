//! The outage experiment: a dependency fails every call for a while, then recovers, under many
//! clients that each retry up to three times. How many calls does it take during the outage,
//! how soon is it healthy again afterwards, and how many requests succeed, with no protection,
//! a token bucket, a ratio budget, a breaker, and a budget with a breaker?
//!
//! One process calls one dependency through persevere's real machines, on virtual time:
//!
//! - **Load.** [`CLIENTS`] clients each send a request every [`REQUEST_EVERY`] (1 000 requests
//!   per second in all), from [`Instant::ZERO`] until [`LAST_REQUEST`]. Each request is a core
//!   [`Retry`] with at most four attempts (three retries), exponential backoff from 20 ms with
//!   full jitter, capped at 1 s.
//! - **The dependency.** Each call takes [`LATENCY`]. It fails every call from [`OUTAGE_START`]
//!   to [`OUTAGE_END`]; outside the outage it serves [`CAPACITY`] calls per 10 ms (1.5 × the
//!   requests) and fails the calls beyond that, overloaded.
//! - **Protection**, shared by the whole process, as a service shares one per dependency: a
//!   [`TokenBucket`] (gRPC's throttling, `maxTokens` 10, `tokenRatio` 0.1) or a [`RatioBudget`]
//!   (retries ≤ 10 % of requests over 10 s, plus 10 per second; with or without a 1 s burst
//!   window) asked before each retry; a
//!   [`Breaker`] around every call (opens at a 50 % failure rate over the last 100 calls, once
//!   20 are counted; open 500 ms; one probe). A call the breaker rejects ends its request (it is
//!   not retried) and never reaches the dependency.
//!
//! What is measured: the **retry amplification** (calls that reach the dependency per request
//! sent during the outage), the **time to recover** (from the end of the outage to the start of
//! the first 100 ms in which at least 99 % of the requests sent succeed), and the requests that
//! succeeded.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use persevere::{
    Backoff, Breaker, BreakerPolicy, CallOutcome, Failure, Grant, Instant, Jitter, Outcome, Permit, RatioBudget,
    RatioBudgetPolicy, Retry, RetryAction, RetryClass, RetryPolicy, TokenBucket, TokenBucketPolicy,
};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

/// Clients sending requests.
pub const CLIENTS: u64 = 100;
/// How often each client sends a request.
pub const REQUEST_EVERY: Duration = Duration::from_millis(100);
/// Requests are sent before this instant.
pub const LAST_REQUEST: Duration = Duration::from_secs(8);
/// When the dependency starts failing every call.
pub const OUTAGE_START: Duration = Duration::from_secs(2);
/// When it is healthy again.
pub const OUTAGE_END: Duration = Duration::from_secs(5);
/// How long a call takes, failed or not.
pub const LATENCY: Duration = Duration::from_millis(5);
/// Calls the dependency serves per 10 ms when healthy (1.5 × the request rate).
pub const CAPACITY: u32 = 15;
/// The width of one point of the timeline, and of the windows recovery is judged in.
pub const WINDOW: Duration = Duration::from_millis(100);

/// What guards the calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protection {
    /// Every failed attempt is retried, up to three times.
    None,
    /// gRPC's retry throttling: a token bucket asked before each retry.
    TokenBucket,
    /// A ratio budget (10 % of requests) asked before each retry.
    RatioBudget,
    /// The same ratio budget, with every second also held to 10 % of its own requests (its
    /// burst window), so the allowance of the healthy seconds before the outage is not spent
    /// at its start.
    RatioBudgetBurst,
    /// A circuit breaker around every call.
    Breaker,
    /// The ratio budget before each retry and the breaker around every call.
    BudgetAndBreaker,
}

impl Protection {
    /// Every protection, in table order.
    pub const ALL: [Protection; 6] = [
        Protection::None,
        Protection::TokenBucket,
        Protection::RatioBudget,
        Protection::RatioBudgetBurst,
        Protection::Breaker,
        Protection::BudgetAndBreaker,
    ];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Protection::None => "no protection",
            Protection::TokenBucket => "token bucket",
            Protection::RatioBudget => "ratio budget 10%",
            Protection::RatioBudgetBurst => "ratio budget, 1 s burst",
            Protection::Breaker => "breaker",
            Protection::BudgetAndBreaker => "budget + breaker",
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct OutageRun {
    /// Requests sent.
    pub requests: u64,
    /// Requests that succeeded.
    pub succeeded: u64,
    /// Requests sent during the outage.
    pub outage_requests: u64,
    /// Calls that reached the dependency during the outage.
    pub outage_calls: u64,
    /// From the end of the outage to the first window in which 99 % of the requests sent
    /// succeeded; `None` if no window after it did.
    pub recovery: Option<Duration>,
    /// Calls that reached the dependency, per [`WINDOW`], from time zero to 1 s after the last
    /// request.
    pub calls_per_window: Vec<u32>,
}

impl OutageRun {
    /// Calls that reached the dependency per request sent during the outage.
    pub fn amplification(&self) -> f64 {
        self.outage_calls as f64 / self.outage_requests.max(1) as f64
    }

    /// The fraction of requests that succeeded.
    pub fn success_ratio(&self) -> f64 {
        self.succeeded as f64 / self.requests.max(1) as f64
    }
}

/// One request: its retry machine, and what it holds while an attempt is out.
struct Request {
    retry: Retry<()>,
    sent_at: Instant,
    permit: Option<Permit>,
    /// The budget's grant for the retry running, refunded if it succeeds.
    grant: Option<Grant>,
}

/// Something due at an instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// Client `n` sends its next request.
    Send(u64),
    /// The call of request `r` returns, successful or not.
    Returned(usize, bool),
    /// Request `r`'s retry delay is over.
    Wake(usize),
}

/// The process: its protection and what it has seen.
struct Process {
    retry: RetryPolicy,
    bucket: Option<(TokenBucketPolicy, TokenBucket)>,
    ratio: Option<(RatioBudgetPolicy, RatioBudget)>,
    breaker: Option<(BreakerPolicy, Breaker)>,
    rng: ChaCha8Rng,
    /// (instant in ns, sequence, event): the earliest first, in the order scheduled.
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    sequence: u64,
    requests: Vec<Request>,
    /// Calls served in the current 10 ms, and which 10 ms that is.
    served: (u64, u32),
    run: OutageRun,
    /// Per window of sending time: requests sent, and those that succeeded.
    sent_per_window: Vec<(u32, u32)>,
}

fn instant(d: Duration) -> Instant {
    Instant::from_nanos(d.as_nanos() as u64)
}

fn window_of(at: Instant) -> usize {
    (at.as_nanos() / WINDOW.as_nanos() as u64) as usize
}

impl Process {
    fn new(protection: Protection, seed: u64) -> Self {
        let backoff = Backoff::exponential(Duration::from_millis(20), 2.0)
            .max_delay(Duration::from_secs(1))
            .jitter(Jitter::Full)
            .build()
            .expect("the experiment's backoff is valid");
        let retry = RetryPolicy::builder(backoff).max_attempts(4).build().expect("the experiment's policy is valid");
        let ratio = |burst: bool| {
            let builder = RatioBudgetPolicy::builder(0.1);
            let builder = if burst { builder.burst_window(Duration::from_secs(1)) } else { builder };
            let policy = builder.build().expect("the experiment's budget is valid");
            Some((policy, RatioBudget::new()))
        };
        let breaker = || {
            let open = Backoff::constant(Duration::from_millis(500)).build().expect("a valid open duration");
            let policy = BreakerPolicy::builder(open)
                .failure_rate(0.5)
                .count_window(100)
                .minimum_calls(20)
                .build()
                .expect("the experiment's breaker is valid");
            Some((policy, Breaker::new(&policy, 0)))
        };
        let windows = window_of(instant(LAST_REQUEST)) + 1;
        Process {
            retry,
            bucket: (protection == Protection::TokenBucket).then(|| {
                let policy = TokenBucketPolicy::grpc(10, 0.1).expect("gRPC's example throttling is valid");
                (policy, TokenBucket::new(&policy))
            }),
            ratio: match protection {
                Protection::RatioBudget | Protection::BudgetAndBreaker => ratio(false),
                Protection::RatioBudgetBurst => ratio(true),
                _ => None,
            },
            breaker: if matches!(protection, Protection::Breaker | Protection::BudgetAndBreaker) {
                breaker()
            } else {
                None
            },
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            sequence: 0,
            requests: Vec::new(),
            served: (u64::MAX, 0),
            run: OutageRun {
                requests: 0,
                succeeded: 0,
                outage_requests: 0,
                outage_calls: 0,
                recovery: None,
                calls_per_window: vec![0; windows + 10],
            },
            sent_per_window: vec![(0, 0); windows],
        }
    }

    fn at(&mut self, at: Instant, event: Event) {
        self.sequence += 1;
        self.queue.push(Reverse((at.as_nanos(), self.sequence, event)));
    }

    fn in_outage(at: Instant) -> bool {
        (instant(OUTAGE_START)..instant(OUTAGE_END)).contains(&at)
    }

    /// Client `client` sends a request at `now`.
    fn send(&mut self, client: u64, now: Instant) {
        let next = now.saturating_add(REQUEST_EVERY);
        if next < instant(LAST_REQUEST) {
            self.at(next, Event::Send(client));
        }
        self.run.requests += 1;
        if Self::in_outage(now) {
            self.run.outage_requests += 1;
        }
        self.sent_per_window[window_of(now)].0 += 1;
        if let Some((policy, budget)) = &mut self.ratio {
            budget.record_request(policy, now);
        }
        let mut retry = Retry::new();
        retry.handle_start(&self.retry, now).expect("a new machine starts");
        self.requests.push(Request { retry, sent_at: now, permit: None, grant: None });
        self.drain(self.requests.len() - 1, now);
    }

    /// Acts on request `r`'s actions.
    fn drain(&mut self, r: usize, now: Instant) {
        while let Some(action) = self.requests[r].retry.poll_action() {
            match action {
                RetryAction::Start { .. } => self.call(r, now),
                RetryAction::Sleep { until, .. } => {
                    let granted = match (&mut self.bucket, &mut self.ratio) {
                        (Some((policy, bucket)), _) => {
                            bucket.try_acquire(policy, RetryClass::Transient).map(|g| self.requests[r].grant = Some(g))
                        }
                        (_, Some((policy, budget))) => budget.try_acquire(policy, now),
                        (None, None) => Ok(()),
                    };
                    if granted.is_ok() {
                        self.at(until, Event::Wake(r));
                    } else {
                        self.requests[r].retry.handle_rejected(now).expect("a sleeping retry is rejected");
                    }
                }
                RetryAction::Finish { outcome, .. } => {
                    if matches!(outcome, Outcome::Succeeded) {
                        self.run.succeeded += 1;
                        self.sent_per_window[window_of(self.requests[r].sent_at)].1 += 1;
                        if let Some((policy, bucket)) = &mut self.bucket {
                            bucket.record_success(policy, self.requests[r].grant.take());
                        }
                    } else if matches!(outcome, Outcome::Exhausted { .. })
                        && let Some((policy, bucket)) = &mut self.bucket
                    {
                        // gRPC charges every failed attempt, the last one too (as the driver's
                        // `Budget` does through `RetryGate::on_final_failure`).
                        bucket.record_final_failure(policy, RetryClass::Transient);
                    }
                }
                RetryAction::Abandon { .. } => unreachable!("the experiment has no attempt timeout"),
            }
        }
    }

    /// Request `r` calls the dependency at `now`, through the breaker if there is one.
    fn call(&mut self, r: usize, now: Instant) {
        if let Some((policy, breaker)) = &mut self.breaker {
            match breaker.try_acquire(policy, now, &mut self.rng) {
                Ok(permit) => self.requests[r].permit = Some(permit),
                Err(_) => {
                    // Rejected without a call: the request ends.
                    let attempt = self.requests[r].retry.attempt();
                    self.requests[r]
                        .retry
                        .handle_failure(&self.retry, now, attempt, Failure::fatal(()), &mut self.rng)
                        .expect("the running attempt fails");
                    return;
                }
            }
        }
        if let Some(calls) = self.run.calls_per_window.get_mut(window_of(now)) {
            *calls += 1;
        }
        let ok = if Self::in_outage(now) {
            self.run.outage_calls += 1;
            false
        } else {
            let slot = now.as_nanos() / 10_000_000;
            if self.served.0 != slot {
                self.served = (slot, 0);
            }
            self.served.1 += 1;
            self.served.1 <= CAPACITY
        };
        self.at(now.saturating_add(LATENCY), Event::Returned(r, ok));
    }

    /// Request `r`'s call returned at `now`.
    fn returned(&mut self, r: usize, ok: bool, now: Instant) {
        if let (Some((policy, breaker)), Some(permit)) = (&mut self.breaker, self.requests[r].permit.take()) {
            let outcome = if ok { CallOutcome::Success } else { CallOutcome::Failure };
            // A permit issued before the breaker last changed state is refused as stale: its
            // result is about a state that is over.
            let _ = breaker.record(policy, now, permit, outcome, &mut self.rng);
        }
        let request = &mut self.requests[r];
        let attempt = request.retry.attempt();
        if ok {
            request.retry.handle_success(now, attempt).expect("the running attempt succeeds");
        } else {
            request
                .retry
                .handle_failure(&self.retry, now, attempt, Failure::retryable(()), &mut self.rng)
                .expect("the running attempt fails");
        }
        self.drain(r, now);
    }

    fn finish(mut self) -> OutageRun {
        let first = window_of(instant(OUTAGE_END));
        self.run.recovery = self.sent_per_window[first..]
            .iter()
            .position(|&(sent, succeeded)| sent > 0 && u64::from(succeeded) * 100 >= u64::from(sent) * 99)
            .map(|w| WINDOW * w as u32);
        self.run
    }
}

/// Runs the experiment under `protection`, jitter and breaker draws from `seed`.
pub fn run(protection: Protection, seed: u64) -> OutageRun {
    let mut process = Process::new(protection, seed);
    // The clients' requests are spread evenly over each period.
    let spacing = REQUEST_EVERY.as_nanos() as u64 / CLIENTS;
    for client in 0..CLIENTS {
        process.at(Instant::from_nanos(client * spacing), Event::Send(client));
    }
    // Bounded: every request makes at most four calls and a wake-up between each two.
    let bound = 16 * CLIENTS * (LAST_REQUEST.as_nanos() / REQUEST_EVERY.as_nanos() + 1) as u64;
    for _ in 0..bound {
        let Some(Reverse((at, _, event))) = process.queue.pop() else { break };
        let now = Instant::from_nanos(at);
        match event {
            Event::Send(client) => process.send(client, now),
            Event::Returned(r, ok) => process.returned(r, ok, now),
            Event::Wake(r) => {
                let request = &mut process.requests[r];
                request.retry.handle_timeout(&process.retry, now, &mut process.rng);
                process.drain(r, now);
            }
        }
    }
    assert!(process.queue.is_empty(), "the experiment ends within its bound");
    process.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outage_a_ratio_budget_keeps_amplification_under_1_2_where_no_protection_gives_about_4() {
        let none = run(Protection::None, 1);
        // Every call fails during the outage: each request makes its four attempts (but those
        // sent in its last moments, which succeed after it).
        assert!((3.9..=4.0).contains(&none.amplification()), "no protection: {:.3}", none.amplification());
        // The ratio budget's bound: its 10 s window at the outage's end holds 5 000 requests,
        // so at most 10 % of them plus its floor of 100 retries: 600 retries for the outage's
        // 3 000 requests, 1.2. It spends the healthy seconds' allowance at the outage's start.
        let budget = run(Protection::RatioBudget, 1);
        assert!(budget.amplification() <= 1.2, "ratio budget: {:.3}", budget.amplification());
        assert!(budget.amplification() > 1.15, "ratio budget: {:.3}", budget.amplification());
        // With a 1 s burst window, each second of the outage keeps to 10 % of its own requests
        // (and the floor's 10 a second): at most 1.1 and a bit.
        let burst = run(Protection::RatioBudgetBurst, 1);
        assert!(burst.amplification() <= 1.11, "burst window: {:.3}", burst.amplification());
        // gRPC's bucket empties to its threshold within the outage's first failures.
        let bucket = run(Protection::TokenBucket, 1);
        assert!(bucket.amplification() < 1.01, "token bucket: {:.3}", bucket.amplification());
    }

    #[test]
    fn outage_a_breaker_keeps_the_dependency_almost_idle_and_costs_recovery_time() {
        let breaker = run(Protection::Breaker, 1);
        let none = run(Protection::None, 1);
        // It opens within the outage's first moments and rejects what follows, but for a probe
        // each open period.
        assert!(breaker.amplification() < 0.1, "breaker: {:.2}", breaker.amplification());
        // After the outage it admits calls again only once its open period ends and a probe
        // succeeds: later than without it, and within one open period and a window.
        assert_eq!(none.recovery, Some(Duration::ZERO));
        let recovery = breaker.recovery.expect("the breaker closes again");
        assert!(recovery > Duration::ZERO && recovery <= Duration::from_millis(600), "{recovery:?}");
        assert_eq!(run(Protection::BudgetAndBreaker, 1).amplification(), breaker.amplification());
    }

    #[test]
    fn outage_every_request_is_counted_and_healthy_periods_succeed() {
        for protection in Protection::ALL {
            let run = run(protection, 3);
            assert_eq!(run.requests, 8_000);
            assert_eq!(run.outage_requests, CLIENTS * 30, "{}", protection.name());
            assert!(run.recovery.is_some(), "{} never recovered", protection.name());
            // Before the outage nothing fails.
            let before: u32 = run.calls_per_window[..window_of(instant(OUTAGE_START))].iter().sum();
            assert_eq!(
                u64::from(before),
                CLIENTS * 20,
                "{}: one call per request before the outage",
                protection.name()
            );
        }
    }

    #[test]
    fn outage_the_same_seed_gives_the_same_run() {
        for protection in Protection::ALL {
            assert_eq!(run(protection, 9), run(protection, 9));
        }
    }
}
