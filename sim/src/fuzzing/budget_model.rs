//! The retry budgets (U1–U3, G9): a token bucket against an exact balance, and a ratio budget
//! against a window kept as a plain list of requests and retries.

use arbitrary::Arbitrary;
use persevere::{
    BudgetEvent, Grant, MAX_BUDGET_BUCKETS, RatioBudget, RatioBudgetPolicy, RatioBudgetPolicyBuilder, RetryClass,
    TokenBucket, TokenBucketPolicy, TokenBucketPolicyBuilder,
};

use crate::model::budget::{BucketModel, RatioModel, RatioRules};

use super::{At, Clock, Count, Ctx, ErrorKind, Fraction, SETUP, Span, ensure, nanos, parse, verdict};

const PPM: u64 = 1_000_000;
const MILLI: u64 = 1_000;

/// An amount of milli-tokens.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum Milli {
    Tokens(u8),
    Raw(u16),
    Big(u64),
}

impl Milli {
    fn get(self) -> u64 {
        match self {
            Milli::Tokens(n) => u64::from(n) * MILLI,
            Milli::Raw(n) => u64::from(n),
            Milli::Big(n) => n,
        }
    }
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum BucketIn {
    Custom {
        capacity: Milli,
        throttling: Milli,
        transient: Milli,
        timeout: Milli,
        refund: Milli,
        refund_retry_cost: bool,
        threshold: Option<Milli>,
        charge_refused: bool,
    },
    Grpc(Count, Fraction),
    Aws,
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
struct RatioIn {
    ratio: Fraction,
    ttl: Option<Span>,
    buckets: Option<Count>,
    per_sec: Option<Count>,
    burst: Option<BurstIn>,
}

/// A burst window: mostly a whole number of buckets of the policy's width (so that the bound
/// is exercised, not only its validation), sometimes any span.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq)]
enum BurstIn {
    Buckets(u8),
    Span(Span),
}

#[derive(Arbitrary, Debug)]
struct Config {
    bucket: BucketIn,
    ratio: RatioIn,
}

fn bucket_reasons(b: &TokenBucketPolicyBuilder) -> Vec<ErrorKind> {
    let mut reasons = Vec::new();
    if b.capacity_milli == 0 {
        reasons.push(ErrorKind::Zero);
    }
    for cost in [b.throttling_cost_milli, b.transient_cost_milli, b.timeout_cost_milli] {
        if cost == 0 {
            reasons.push(ErrorKind::Zero);
        }
        if cost > b.capacity_milli {
            reasons.push(ErrorKind::LimitTooLarge);
        }
    }
    if b.threshold_milli.is_some_and(|t| t >= b.capacity_milli) {
        reasons.push(ErrorKind::LimitTooLarge);
    }
    reasons
}

fn build_bucket(input: &BucketIn) -> Option<TokenBucketPolicy> {
    match *input {
        BucketIn::Custom {
            capacity,
            throttling,
            transient,
            timeout,
            refund,
            refund_retry_cost,
            threshold,
            charge_refused,
        } => {
            let builder = TokenBucketPolicyBuilder {
                capacity_milli: capacity.get(),
                throttling_cost_milli: throttling.get(),
                transient_cost_milli: transient.get(),
                timeout_cost_milli: timeout.get(),
                success_refund_milli: refund.get(),
                refund_retry_cost,
                threshold_milli: threshold.map(Milli::get),
                charge_refused,
                // Tied to `charge_refused` (gRPC's pair), so the corpus decodes as before.
                charge_final_failure: charge_refused,
            };
            let policy = verdict("token bucket", builder.build(), &bucket_reasons(&builder))?;
            ensure!(SETUP, *policy.settings() == builder, "U1", "settings {:?}, given {builder:?}", policy.settings());
            Some(policy)
        }
        BucketIn::Grpc(max_tokens, ratio) => {
            let (max_tokens, ratio) = (max_tokens.get(), ratio.get());
            let mut reasons = Vec::new();
            if max_tokens == 0 {
                reasons.push(ErrorKind::Zero);
            }
            if max_tokens > 1000 {
                reasons.push(ErrorKind::LimitTooLarge);
            }
            let ratio_milli = if !ratio.is_finite() {
                reasons.push(ErrorKind::NotFinite);
                1
            } else if ratio < 0.0 {
                reasons.push(ErrorKind::FractionOutOfRange);
                1
            } else if ratio > 1e12 {
                reasons.push(ErrorKind::LimitTooLarge);
                1
            } else {
                // gRPC reads three decimals of the number as written and ignores the rest:
                // the shortest decimal of the f64, cut after the third decimal. Only -0.0 has a
                // sign here, and it is zero.
                let written = format!("{}", ratio.abs());
                let (whole, fraction) = written.split_once('.').unwrap_or((&written, ""));
                let fraction: String = fraction.chars().chain("000".chars()).take(3).collect();
                format!("{whole}{fraction}").parse::<u64>().expect("digits")
            };
            if ratio_milli == 0 {
                reasons.push(ErrorKind::Zero);
            }
            let policy = verdict("gRPC bucket", TokenBucketPolicy::grpc(max_tokens, ratio), &reasons)?;
            let max = u64::from(max_tokens) * MILLI;
            let expected = TokenBucketPolicyBuilder {
                capacity_milli: max,
                throttling_cost_milli: MILLI,
                transient_cost_milli: MILLI,
                timeout_cost_milli: MILLI,
                success_refund_milli: ratio_milli,
                refund_retry_cost: false,
                threshold_milli: Some(max / 2),
                charge_refused: true,
                charge_final_failure: true,
            };
            ensure!(
                SETUP,
                *policy.settings() == expected,
                "U1",
                "gRPC settings {:?}, expected {expected:?}",
                policy.settings()
            );
            Some(policy)
        }
        BucketIn::Aws => {
            let policy = TokenBucketPolicy::aws();
            let settings = *policy.settings();
            ensure!(SETUP, settings.build() == Ok(policy), "U1", "the AWS preset does not validate: {settings:?}");
            Some(policy)
        }
    }
}

fn build_ratio(input: &RatioIn) -> Option<(RatioBudgetPolicy, RatioRules)> {
    let mut builder = RatioBudgetPolicy::builder(input.ratio.get());
    if let Some(ttl) = input.ttl {
        builder = builder.ttl(ttl.get());
    }
    if let Some(buckets) = input.buckets {
        builder = builder.buckets(buckets.get());
    }
    if let Some(per_sec) = input.per_sec {
        builder = builder.min_retries_per_sec(per_sec.get());
    }
    if let Some(burst) = input.burst {
        let span = match burst {
            BurstIn::Buckets(n) => {
                let width = builder.ttl.checked_div(builder.buckets).unwrap_or_default();
                width.checked_mul(u32::from(n % 17)).unwrap_or(std::time::Duration::MAX)
            }
            BurstIn::Span(span) => span.get(),
        };
        builder = builder.burst_window(span);
    }
    let mut reasons = Vec::new();
    if !builder.ratio.is_finite() {
        reasons.push(ErrorKind::NotFinite);
    } else if !(0.0..=1000.0).contains(&builder.ratio) {
        // Finagle's `percentCanRetry` range.
        reasons.push(ErrorKind::OutOfRange);
    }
    let ttl_ns = nanos(builder.ttl);
    match ttl_ns {
        None => reasons.push(ErrorKind::DurationOverflow),
        Some(0) => reasons.push(ErrorKind::Zero),
        _ => {}
    }
    if builder.buckets == 0 {
        reasons.push(ErrorKind::Zero);
    }
    if builder.buckets > MAX_BUDGET_BUCKETS {
        reasons.push(ErrorKind::LimitTooLarge);
    }
    let ttl_ns = ttl_ns.unwrap_or(0);
    let width_ns = ttl_ns / u64::from(builder.buckets.max(1));
    if width_ns == 0 && ttl_ns != 0 {
        reasons.push(ErrorKind::Zero);
    }
    // The burst window: within the window, at least one bucket, whole buckets.
    let burst_ns = builder.burst_window.map(nanos);
    match burst_ns {
        Some(None) => reasons.push(ErrorKind::Conflict),
        Some(Some(ns)) if ns > ttl_ns => reasons.push(ErrorKind::Conflict),
        Some(Some(0)) => reasons.push(ErrorKind::Zero),
        Some(Some(ns)) if width_ns != 0 && ns % width_ns != 0 => reasons.push(ErrorKind::Conflict),
        _ => {}
    }
    let policy = verdict("ratio budget", builder.build(), &reasons)?;
    let floor_over = |span_ns: u64| {
        let floor = u128::from(builder.min_retries_per_sec) * u128::from(span_ns) / 1_000;
        u64::try_from(floor).unwrap_or(u64::MAX)
    };
    let floor = floor_over(ttl_ns);
    let ratio = RatioRules {
        ratio_ppm: (builder.ratio * PPM as f64).round() as u64,
        floor_ppm: floor,
        width_ns,
        buckets: builder.buckets,
        burst: burst_ns.flatten().map(|ns| (ns / width_ns, floor_over(ns))),
    };
    ensure!(
        SETUP,
        policy.burst_buckets().map(u64::from) == ratio.burst.map(|b| b.0),
        "U2",
        "burst window of {:?} buckets",
        policy.burst_buckets()
    );
    ensure!(
        SETUP,
        policy.ratio_ppm() == ratio.ratio_ppm,
        "U3",
        "ratio {} ppm, expected {}",
        policy.ratio_ppm(),
        ratio.ratio_ppm
    );
    ensure!(SETUP, policy.floor_retries() == ratio.floor_ppm / PPM, "U2", "floor {} retries", policy.floor_retries());
    ensure!(
        SETUP,
        policy.bucket_width().as_nanos() == u128::from(width_ns),
        "U2",
        "bucket width {:?}",
        policy.bucket_width()
    );
    ensure!(
        SETUP,
        RatioBudgetPolicyBuilder::from(policy).build() == Ok(policy),
        "U2",
        "the policy does not rebuild to itself"
    );
    Some((policy, ratio))
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum ClassIn {
    Throttling,
    Transient,
    Timeout,
}

#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
enum GrantPick {
    None,
    Latest,
    Back(u8),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Acquire(ClassIn),
    Acquire2(ClassIn),
    Success(GrantPick),
    Request(At),
    Request2(At),
    Retry(At),
    /// The bucket is driven under another policy from now on (a replaced policy, or a balance
    /// loaded under a new one).
    Rebucket(BucketIn),
    /// The ratio budget is driven under another policy from now on.
    Reratio(RatioIn),
}

pub(crate) fn run(data: &[u8]) {
    let Some((config, ops)) = parse::<Config, Op>(data) else { return };
    check(&config, &ops);
}

/// Drives both budgets through `ops` and checks them against the model after every step.
fn check(config: &Config, ops: &[Op]) {
    let finagle = RatioBudgetPolicy::builder(0.2).build();
    ensure!(SETUP, finagle == Ok(RatioBudgetPolicy::finagle()), "U2", "the Finagle preset differs from its settings");
    let mut bucket_policy = build_bucket(&config.bucket);
    let mut ratio_policy = build_ratio(&config.ratio);
    let mut bucket = bucket_policy.as_ref().map(TokenBucket::new);
    let mut bucket_model = BucketModel::new(bucket_policy.as_ref().map_or(0, TokenBucketPolicy::capacity_milli));
    let mut grants: Vec<Grant> = Vec::new();
    let mut ratio = RatioBudget::new();
    let mut ratio_model = RatioModel::default();
    let (mut bucket_turns, mut ratio_turns) = (Turns::default(), Turns::default());
    let mut clock = Clock::default();
    for (step, op) in ops.iter().enumerate() {
        let ctx = Ctx { step, op };
        match *op {
            Op::Acquire(class) | Op::Acquire2(class) => {
                let (Some(policy), Some(bucket)) = (&bucket_policy, bucket.as_mut()) else { continue };
                let class = match class {
                    ClassIn::Throttling => RetryClass::Throttling,
                    ClassIn::Transient => RetryClass::Transient,
                    ClassIn::Timeout => RetryClass::Timeout,
                };
                let balance = bucket_model.balance;
                let (granted, cost) = bucket_model.acquire(policy, class);
                let got = bucket.try_acquire(policy, class);
                let expected = bucket_turns.after(got.is_ok());
                let told = bucket.poll_event();
                ensure!(ctx, told == expected, "O1", "the bucket told {told:?}, expected {expected:?}");
                ensure!(
                    ctx,
                    got.is_ok() == granted,
                    "U1",
                    "balance {balance}, cost {cost}, threshold {:?}: granted {}, expected {granted}",
                    policy.settings().threshold_milli,
                    got.is_ok()
                );
                if let Ok(grant) = got {
                    ensure!(
                        ctx,
                        grant.cost_milli() == cost,
                        "U1",
                        "a grant of {} for a cost of {cost}",
                        grant.cost_milli()
                    );
                    grants.push(grant);
                    if grants.len() > 64 {
                        let _ = grants.remove(0);
                    }
                }
            }
            Op::Success(pick) => {
                let (Some(policy), Some(bucket)) = (&bucket_policy, bucket.as_mut()) else { continue };
                let grant = match pick {
                    GrantPick::None => None,
                    GrantPick::Latest => grants.last().copied(),
                    GrantPick::Back(k) => grants.len().checked_sub(1 + usize::from(k)).map(|i| grants[i]),
                };
                bucket_model.success(policy, grant);
                bucket.record_success(policy, grant);
            }
            Op::Request(at) | Op::Request2(at) => {
                let Some((policy, rules)) = &ratio_policy else { continue };
                let now = clock.at(at, None);
                ratio_model.request(rules, now);
                ratio.record_request(policy, now);
            }
            Op::Rebucket(input) => {
                // An invalid policy is refused by its builder (as the model expects): no switch.
                if let (Some(policy), Some(_)) = (build_bucket(&input), &bucket) {
                    bucket_policy = Some(policy);
                    bucket_model.replace();
                }
            }
            Op::Reratio(input) => {
                if let (Some(policy), Some(_)) = (build_ratio(&input), &ratio_policy) {
                    ratio_policy = Some(policy);
                }
            }
            Op::Retry(at) => {
                let Some((policy, rules)) = &ratio_policy else { continue };
                let now = clock.at(at, None);
                let (granted, requests, retries) = ratio_model.retry(rules, now);
                let got = ratio.try_acquire(policy, now);
                let expected = ratio_turns.after(got.is_ok());
                let told = ratio.poll_event();
                ensure!(ctx, told == expected, "O1", "the ratio budget told {told:?}, expected {expected:?}");
                ensure!(
                    ctx,
                    got.is_ok() == granted,
                    "G9",
                    "{retries} retries and {requests} requests in the window: granted {}, expected {granted}",
                    got.is_ok()
                );
                if got.is_ok() {
                    // G9, U3: the retries of the window, this one included, within ratio × requests + floor.
                    let bound = policy.allowance(requests);
                    ensure!(
                        ctx,
                        retries < bound,
                        "G9",
                        "{} retries granted against {requests} requests (allowance {bound})",
                        retries + 1
                    );
                }
            }
        }
        if let (Some(policy), Some(bucket)) = (&bucket_policy, &bucket) {
            let _ = bucket_model.check(&mut ctx.judge(), policy, bucket);
        }
        if ratio_policy.is_some() {
            let _ = ratio_model.check(&mut ctx.judge(), &ratio);
        }
    }
}

/// The configuration and operations `data` decodes to.
pub(crate) fn describe(data: &[u8]) -> String {
    format!("{:#?}", parse::<Config, Op>(data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use persevere::Instant;

    /// The burst bound is checked stretch by stretch: ten requests in one bucket back a retry
    /// over a burst window of two buckets, but not in the next bucket, which has no request of
    /// its own (a core that weighed only the whole burst window would grant it).
    #[test]
    fn u2_the_model_refuses_a_retry_that_a_recent_stretch_cannot_back() {
        let config = Config {
            bucket: BucketIn::Aws,
            ratio: RatioIn {
                ratio: Fraction::Thousandths(500),
                ttl: Some(Span::Secs(10)),
                buckets: Some(Count::Byte(10)),
                per_sec: Some(Count::Small(0)),
                burst: Some(BurstIn::Buckets(2)),
            },
        };
        let mut ops: Vec<Op> = (0..10).map(|_| Op::Request(At::Abs(1_000_000_000))).collect();
        ops.push(Op::Retry(At::Same));
        ops.push(Op::Retry(At::Abs(2_000_000_000)));
        let policy = build_ratio(&config.ratio).expect("a valid policy").0;
        let mut budget = RatioBudget::new();
        for _ in 0..10 {
            budget.record_request(&policy, Instant::from_secs(1));
        }
        assert!(budget.try_acquire(&policy, Instant::from_secs(1)).is_ok());
        assert!(budget.try_acquire(&policy, Instant::from_secs(2)).is_err(), "the newest bucket backs no retry");
        check(&config, &ops);
    }
}

/// O1's reference: the retries refused in a row, and the event each answer makes (exhausted at
/// the first refusal after a grant, recovered at the first grant after refusals).
#[derive(Default)]
struct Turns(u32);

impl Turns {
    fn after(&mut self, granted: bool) -> Option<BudgetEvent> {
        let refused = self.0;
        self.0 = if granted { 0 } else { refused.saturating_add(1) };
        match (granted, refused) {
            (true, 0) | (false, 1..) => None,
            (true, refused) => Some(BudgetEvent::Recovered { refused }),
            (false, 0) => Some(BudgetEvent::Exhausted),
        }
    }
}
