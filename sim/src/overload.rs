//! The overload experiment (L5): a server of known capacity under 1×, 2× and 5× its capacity,
//! with no limit, a fixed limit, and each adaptive algorithm in front of it. Does goodput stay
//! near capacity and latency near the no-load latency?
//!
//! - **The server.** [`WORKERS`] workers, each serving one request at a time for
//!   [`SERVICE`] ± 10 % (uniform), so its capacity `C` is `WORKERS / SERVICE` (4 000 requests
//!   per second) and its no-load latency is [`SERVICE`]. Requests it admits and cannot serve
//!   yet wait in a FIFO queue (the queueing delay); nothing in the queue is ever dropped.
//! - **The clients.** Requests arrive as a Poisson process at `load × C`, from time zero until
//!   [`DURATION`]. A client waits [`CLIENT_TIMEOUT`] for its answer and gives up after it
//!   (the server, not told, still serves the request).
//! - **The limit**, in front of the queue, as Envoy's filter or a server-side Netflix limiter
//!   sits: a request it refuses is answered at once (shed) and never reaches the queue. The
//!   limiter is told of each request's end with its RTT (from admission to answer), the
//!   in-flight count it started with, and whether it took longer than the client waited
//!   (dropped).
//!
//! What is measured, over the requests that arrive after the first [`WARMUP`]: the **goodput**
//! (answers that reach their client within its timeout, per second, as a share of `C`), and the
//! **p50 and p99 latency** of the answered requests against the no-load latency.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::time::Duration;

use persevere::{
    Bulkhead, BulkheadPermit, BulkheadPolicy, Completion, Instant, LimitAlgorithm, Limiter, LimiterPermit,
    LimiterPolicy, MinRttProbe,
};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// Requests the server serves at once.
pub const WORKERS: u32 = 20;
/// How long one request takes to serve (± 10 %): the no-load latency.
pub const SERVICE: Duration = Duration::from_millis(5);
/// How long a client waits for its answer.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(1);
/// Requests arrive until then.
pub const DURATION: Duration = Duration::from_secs(10);
/// Requests that arrive before then are not measured (every limiter starts at its initial limit).
pub const WARMUP: Duration = Duration::from_secs(1);
/// The fixed limit: 1.5 × the workers, a hand-tuned bulkhead.
pub const FIXED_LIMIT: u32 = 30;

/// The server's capacity, in requests per second.
pub fn capacity() -> f64 {
    f64::from(WORKERS) / SERVICE.as_secs_f64()
}

/// What stands in front of the server. The adaptive limits are Netflix's defaults with the
/// settings this server needs changed (each named in its doc); the `…Preset` guards are the
/// published defaults unchanged, shown beside them in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// Every request is admitted.
    None,
    /// A [`Bulkhead`] of [`FIXED_LIMIT`], refusing at once.
    Fixed,
    /// AIMD, its loss timeout 1.25× the no-load latency (a call slower than that counts as
    /// dropped): the one setting AIMD has to be told for a service.
    Aimd,
    /// Vegas, its smoothing 0.2 (each completion moves the limit a fifth of its step: service
    /// times that vary by ±10 % read as queues to Vegas at its default of 1.0), with Envoy's
    /// minimum-RTT window every 5 s.
    Vegas,
    /// Gradient2, its `rtt_tolerance` 1.0 and `queue_size` 2 (its defaults, 1.5 and 4, hold a
    /// standing queue of several service times).
    Gradient2,
    /// [`LimiterPolicy::aimd`] unchanged (its 5 s timeout never fires here).
    AimdPreset,
    /// [`LimiterPolicy::vegas`] unchanged.
    VegasPreset,
    /// [`LimiterPolicy::gradient2`] unchanged.
    Gradient2Preset,
}

impl Guard {
    /// Every guard, in table order.
    pub const ALL: [Guard; 8] = [
        Guard::None,
        Guard::Fixed,
        Guard::Aimd,
        Guard::Vegas,
        Guard::Gradient2,
        Guard::AimdPreset,
        Guard::VegasPreset,
        Guard::Gradient2Preset,
    ];

    /// The adaptive limits the claims are made for.
    pub const ADAPTIVE: [Guard; 3] = [Guard::Aimd, Guard::Vegas, Guard::Gradient2];

    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Guard::None => "no limit",
            Guard::Fixed => "fixed limit 30",
            Guard::Aimd => "AIMD",
            Guard::Vegas => "Vegas",
            Guard::Gradient2 => "Gradient2",
            Guard::AimdPreset => "AIMD preset",
            Guard::VegasPreset => "Vegas preset",
            Guard::Gradient2Preset => "Gradient2 preset",
        }
    }

    /// The limiter's policy, if the guard is one.
    pub fn limiter_policy(self) -> Option<LimiterPolicy> {
        let build = |builder: persevere::LimiterPolicyBuilder| Some(builder.build().expect("a valid policy"));
        match self {
            Guard::None | Guard::Fixed => None,
            // Netflix's AIMD bounds and ratio (the builder's defaults), its timeout shortened.
            Guard::Aimd => build(LimiterPolicy::builder(LimitAlgorithm::Aimd {
                backoff_ratio: 0.9,
                timeout: SERVICE.mul_f64(1.25),
            })),
            Guard::Vegas => build(
                LimiterPolicy::vegas()
                    .to_builder()
                    .algorithm(LimitAlgorithm::Vegas { smoothing: 0.2 })
                    .min_rtt_probe(MinRttProbe::envoy(Duration::from_secs(5))),
            ),
            Guard::Gradient2 => build(LimiterPolicy::gradient2().to_builder().algorithm(LimitAlgorithm::Gradient2 {
                smoothing: 0.2,
                rtt_tolerance: 1.0,
                queue_size: 2,
                long_window: 600,
            })),
            Guard::AimdPreset => Some(LimiterPolicy::aimd()),
            Guard::VegasPreset => Some(LimiterPolicy::vegas()),
            Guard::Gradient2Preset => Some(LimiterPolicy::gradient2()),
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct OverloadRun {
    /// Requests that arrived in the measured span.
    pub arrived: u64,
    /// Of those, refused at once.
    pub shed: u64,
    /// Of those, answered within the client's timeout.
    pub good: u64,
    /// Latencies of the measured requests that were answered, sorted, in ns.
    pub latencies: Vec<u64>,
    /// The p99 latency of the requests arriving in each 100 ms, in ms (for the plot).
    pub p99_per_window: Vec<f64>,
    /// The limiter's admission limit at the end (the bulkhead's size; 0 with no limit).
    pub final_limit: u32,
}

impl OverloadRun {
    /// Good answers per second, as a share of the capacity.
    pub fn goodput(&self, duration: Duration) -> f64 {
        self.good as f64 / (duration - WARMUP).as_secs_f64() / capacity()
    }

    /// The `q` quantile of the answered requests' latency, as a multiple of the no-load latency.
    pub fn latency(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[i] as f64 / SERVICE.as_nanos() as f64
    }

    /// The share of the measured requests refused at once.
    pub fn shed_share(&self) -> f64 {
        self.shed as f64 / self.arrived.max(1) as f64
    }
}

/// The permit an admitted request holds.
enum Held {
    Nothing,
    Limiter(LimiterPermit),
    Bulkhead(BulkheadPermit),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrive,
    Done(usize),
}

struct Server {
    limiter: Option<(LimiterPolicy, Limiter)>,
    bulkhead: Option<(BulkheadPolicy, Bulkhead)>,
    rng: ChaCha8Rng,
    queue: BinaryHeap<Reverse<(u64, u64, Event)>>,
    sequence: u64,
    /// Admitted requests waiting for a worker: their index.
    waiting: VecDeque<usize>,
    busy: u32,
    /// Per request: when it arrived, and its permit.
    requests: Vec<(Instant, Held)>,
    rate: f64,
    duration: Duration,
    run: OverloadRun,
    /// Per 100 ms of arrival: the latencies answered.
    per_window: Vec<Vec<u64>>,
}

impl Server {
    fn new(fixed: bool, limiter: Option<LimiterPolicy>, load: f64, duration: Duration, seed: u64) -> Self {
        Server {
            limiter: limiter.map(|policy| (policy, Limiter::new(&policy, 0))),
            bulkhead: fixed.then(|| {
                (BulkheadPolicy::builder(FIXED_LIMIT).retry_after(SERVICE).build().expect("valid"), Bulkhead::new())
            }),
            rng: ChaCha8Rng::seed_from_u64(seed),
            queue: BinaryHeap::new(),
            sequence: 0,
            waiting: VecDeque::new(),
            busy: 0,
            requests: Vec::new(),
            rate: load * capacity(),
            duration,
            run: OverloadRun {
                arrived: 0,
                shed: 0,
                good: 0,
                latencies: Vec::new(),
                p99_per_window: Vec::new(),
                final_limit: 0,
            },
            per_window: vec![Vec::new(); (duration.as_millis() / 100) as usize + 1],
        }
    }

    fn at(&mut self, at: Instant, event: Event) {
        self.sequence += 1;
        self.queue.push(Reverse((at.as_nanos(), self.sequence, event)));
    }

    /// A uniform draw in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn arrive(&mut self, now: Instant) {
        let gap = -(1.0 - self.unit()).ln() / self.rate;
        let next = now.saturating_add(Duration::from_secs_f64(gap));
        if next.as_nanos() < self.duration.as_nanos() as u64 {
            self.at(next, Event::Arrive);
        }
        let measured = now.as_nanos() >= WARMUP.as_nanos() as u64;
        self.run.arrived += u64::from(measured);
        let held = match (&mut self.limiter, &mut self.bulkhead) {
            (Some((policy, limiter)), _) => limiter.try_acquire(policy, now).map(Held::Limiter).ok(),
            (_, Some((policy, bulkhead))) => bulkhead.try_acquire(policy, now).map(Held::Bulkhead).ok(),
            (None, None) => Some(Held::Nothing),
        };
        let Some(held) = held else {
            self.run.shed += u64::from(measured);
            return;
        };
        self.requests.push((now, held));
        self.waiting.push_back(self.requests.len() - 1);
        self.serve(now);
    }

    /// Starts the waiting requests that free workers can take.
    fn serve(&mut self, now: Instant) {
        while self.busy < WORKERS {
            let Some(r) = self.waiting.pop_front() else { return };
            self.busy += 1;
            let service = SERVICE.as_secs_f64() * (0.9 + 0.2 * self.unit());
            self.at(now.saturating_add(Duration::from_secs_f64(service)), Event::Done(r));
        }
    }

    fn done(&mut self, r: usize, now: Instant) {
        self.busy -= 1;
        let (arrived, held) = std::mem::replace(&mut self.requests[r], (Instant::ZERO, Held::Nothing));
        let latency = now.saturating_duration_since(arrived);
        let late = latency > CLIENT_TIMEOUT;
        match held {
            Held::Nothing => {}
            Held::Limiter(permit) => {
                let (policy, limiter) = self.limiter.as_mut().expect("a limiter issued it");
                let completion = if late { Completion::Dropped } else { Completion::Success };
                limiter.release(policy, now, permit, completion, &mut self.rng).expect("a permit of this limiter");
            }
            Held::Bulkhead(permit) => {
                self.bulkhead.as_mut().expect("a bulkhead issued it").1.release(permit).expect("held");
            }
        }
        if arrived.as_nanos() >= WARMUP.as_nanos() as u64 {
            self.run.good += u64::from(!late);
            self.run.latencies.push(latency.as_nanos() as u64);
            let window = (arrived.as_nanos() / 100_000_000) as usize;
            if let Some(w) = self.per_window.get_mut(window) {
                w.push(latency.as_nanos() as u64);
            }
        }
        self.serve(now);
    }

    fn finish(mut self) -> OverloadRun {
        self.run.latencies.sort_unstable();
        self.run.p99_per_window = self
            .per_window
            .iter_mut()
            .map(|w| {
                w.sort_unstable();
                w.get(w.len().saturating_sub(1) * 99 / 100).map_or(0.0, |&ns| ns as f64 / 1e6)
            })
            .collect();
        self.run.final_limit = match (&self.limiter, &self.bulkhead) {
            (Some((_, limiter)), _) => limiter.admission_limit(),
            (_, Some((policy, _))) => policy.max_concurrent(),
            _ => 0,
        };
        self.run
    }
}

/// Runs `guard` at `load` × the capacity for `duration`, arrivals and service times drawn from
/// `seed`.
pub fn run(guard: Guard, load: f64, duration: Duration, seed: u64) -> OverloadRun {
    simulate(guard == Guard::Fixed, guard.limiter_policy(), load, duration, seed)
}

/// [`run`] with `limiter` in front of the server (to try other settings).
pub fn run_limiter(limiter: LimiterPolicy, load: f64, duration: Duration, seed: u64) -> OverloadRun {
    simulate(false, Some(limiter), load, duration, seed)
}

fn simulate(fixed: bool, limiter: Option<LimiterPolicy>, load: f64, duration: Duration, seed: u64) -> OverloadRun {
    let mut server = Server::new(fixed, limiter, load, duration, seed);
    server.at(Instant::ZERO, Event::Arrive);
    // Bounded: each request arrives once and is served at most once.
    let bound = 4 * (load * capacity() * duration.as_secs_f64()) as u64 + 1_000;
    for _ in 0..bound {
        let Some(Reverse((at, _, event))) = server.queue.pop() else { break };
        let now = Instant::from_nanos(at);
        match event {
            Event::Arrive => server.arrive(now),
            Event::Done(r) => server.done(r, now),
        }
    }
    assert!(server.queue.is_empty(), "the experiment ends within its bound");
    server.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L5: at 5× overload each adaptive limit keeps goodput at or above 90 % of the capacity
    /// and p99 latency at or below 3× the no-load latency. Replace the limiter by no limit and
    /// this fails (the next test shows by how much).
    #[test]
    fn l5_at_5x_overload_an_adaptive_limit_keeps_goodput_near_capacity_and_latency_near_no_load() {
        for (guard, seed) in Guard::ADAPTIVE.into_iter().flat_map(|guard| (1..=3).map(move |seed| (guard, seed))) {
            let run = run(guard, 5.0, DURATION, seed);
            let (goodput, p99) = (run.goodput(DURATION), run.latency(0.99));
            assert!(goodput >= 0.9, "{} seed {seed}: goodput {:.1}% of capacity", guard.name(), goodput * 100.0);
            assert!(p99 <= 3.0, "{} seed {seed}: p99 {p99:.2}× the no-load latency", guard.name());
        }
    }

    /// L5: with no limit the queue grows as long as the overload lasts: p99 latency grows with
    /// the run's length, far past the client's timeout, and goodput collapses.
    #[test]
    fn l5_with_no_limit_latency_grows_without_bound() {
        let short = run(Guard::None, 5.0, Duration::from_secs(3), 1);
        let long = run(Guard::None, 5.0, Duration::from_secs(6), 1);
        assert!(
            long.latency(0.99) > 1.8 * short.latency(0.99),
            "p99 {:.0}× at 3 s, {:.0}× at 6 s",
            short.latency(0.99),
            long.latency(0.99)
        );
        assert!(short.latency(0.99) > 100.0, "p99 {:.0}×", short.latency(0.99));
        assert!(long.goodput(Duration::from_secs(6)) < 0.1, "goodput {:.3}", long.goodput(Duration::from_secs(6)));
    }

    /// At 1× the capacity the fixed and adaptive limits shed little: a limit costs little when
    /// it is not needed.
    #[test]
    fn l5_at_capacity_a_limit_sheds_little() {
        for guard in [Guard::Fixed, Guard::Aimd, Guard::Vegas, Guard::Gradient2] {
            let run = run(guard, 1.0, Duration::from_secs(4), 2);
            assert!(run.shed_share() < 0.1, "{}: shed {:.1}%", guard.name(), 100.0 * run.shed_share());
        }
    }
}
