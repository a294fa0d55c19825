//! A bulkhead (L1): at most N calls at once; the next waits, in arrival order, up to a
//! configured time, or is refused at once with how long to wait.
//!
//! **Why a ring of deadlines.** Waiters are numbered tickets. The queue keeps each waiting
//! ticket's deadline in a fixed ring of [`MAX_WAITERS`] instants inside the state: a driver
//! parks its waiters (wakers, channels) in its own FIFO and asks the machine which ticket may
//! claim a freed place. Deadlines cannot be derived from the ticket numbers alone (a policy
//! loaded with another `max_wait` changes them, and a waiter may give up in the middle of the
//! queue), and an `alloc`-gated queue would make the bulkhead unavailable to `no_std` users
//! without an allocator. The ring is 32 `u64`s (256 bytes of the state's 272), and it is never
//! touched on the uncontended path (a free place and nobody waiting): admission there reads and
//! writes two counters.

use core::time::Duration;

use crate::time::nanos_of;
use crate::{Instant, PolicyError};

/// The most waiters one bulkhead queues (its ring's size).
pub const MAX_WAITERS: u32 = 32;

const RING: usize = MAX_WAITERS as usize;

/// The configuration of a [`Bulkhead`]: resilience4j's `BulkheadConfig` (`maxConcurrentCalls`,
/// `maxWaitDuration`) with a bound on the waiters.
///
/// ```
/// use core::time::Duration;
/// use persevere::BulkheadPolicy;
///
/// let policy = BulkheadPolicy::builder(10).max_wait(Duration::from_millis(50), 5).build()?;
/// assert_eq!((policy.max_concurrent(), policy.max_waiting()), (10, 5));
/// assert!(BulkheadPolicy::builder(0).build().is_err(), "a bulkhead that admits nothing");
/// # Ok::<(), persevere::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(try_from = "BulkheadPolicyBuilder", into = "BulkheadPolicyBuilder")
)]
pub struct BulkheadPolicy {
    max_concurrent: u32,
    max_waiting: u32,
    max_wait_ns: u64,
    retry_after_ns: u64,
}

/// The settings of a [`BulkheadPolicy`] before validation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[must_use = "a builder does nothing until `build()` is called"]
pub struct BulkheadPolicyBuilder {
    /// Calls admitted at once: at least 1.
    pub max_concurrent: u32,
    /// Callers that may wait for a place: at most [`MAX_WAITERS`]; 0 refuses at once.
    pub max_waiting: u32,
    /// How long a caller waits at most.
    pub max_wait: Duration,
    /// What a refusal says to wait when nobody is queued (with waiters, it says until the
    /// first of them gives up): typically a call's usual duration.
    pub retry_after: Duration,
}

impl BulkheadPolicyBuilder {
    /// Up to `max_waiting` callers wait for a place, each at most `max_wait`.
    pub const fn max_wait(mut self, max_wait: Duration, max_waiting: u32) -> Self {
        self.max_wait = max_wait;
        self.max_waiting = max_waiting;
        self
    }

    /// What a refusal says to wait when nobody is queued.
    pub const fn retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`PolicyError`] when `max_concurrent` is zero, `max_waiting` exceeds [`MAX_WAITERS`],
    /// waiters are allowed with a zero `max_wait`, or a duration overflows.
    pub fn build(self) -> Result<BulkheadPolicy, PolicyError> {
        if self.max_concurrent == 0 {
            return Err(PolicyError::Zero { setting: "max_concurrent", why: "a bulkhead of 0 admits no call" });
        }
        if self.max_waiting > MAX_WAITERS {
            return Err(PolicyError::LimitTooLarge { setting: "max_waiting", max: u64::from(MAX_WAITERS) });
        }
        let max_wait_ns = nanos_of(self.max_wait).ok_or(PolicyError::DurationOverflow { setting: "max_wait" })?;
        if self.max_waiting > 0 && max_wait_ns == 0 {
            return Err(PolicyError::Zero {
                setting: "max_wait",
                why: "waiters that wait for nothing are refused at once; set max_waiting to 0 instead",
            });
        }
        let retry_after_ns =
            nanos_of(self.retry_after).ok_or(PolicyError::DurationOverflow { setting: "retry_after" })?;
        Ok(BulkheadPolicy {
            max_concurrent: self.max_concurrent,
            max_waiting: self.max_waiting,
            max_wait_ns,
            retry_after_ns,
        })
    }
}

impl TryFrom<BulkheadPolicyBuilder> for BulkheadPolicy {
    type Error = PolicyError;

    fn try_from(builder: BulkheadPolicyBuilder) -> Result<Self, PolicyError> {
        builder.build()
    }
}

impl From<BulkheadPolicy> for BulkheadPolicyBuilder {
    fn from(policy: BulkheadPolicy) -> Self {
        BulkheadPolicyBuilder {
            max_concurrent: policy.max_concurrent,
            max_waiting: policy.max_waiting,
            max_wait: Duration::from_nanos(policy.max_wait_ns),
            retry_after: Duration::from_nanos(policy.retry_after_ns),
        }
    }
}

impl BulkheadPolicy {
    /// A builder: `max_concurrent` calls at once, the next refused at once.
    pub const fn builder(max_concurrent: u32) -> BulkheadPolicyBuilder {
        BulkheadPolicyBuilder { max_concurrent, max_waiting: 0, max_wait: Duration::ZERO, retry_after: Duration::ZERO }
    }

    /// resilience4j's `SemaphoreBulkhead` defaults (`maxConcurrentCalls` 25,
    /// `maxWaitDuration` 0: refused at once), from `BulkheadConfig.java`.
    pub const fn resilience4j() -> BulkheadPolicy {
        BulkheadPolicy { max_concurrent: 25, max_waiting: 0, max_wait_ns: 0, retry_after_ns: 0 }
    }

    /// Calls admitted at once.
    pub const fn max_concurrent(&self) -> u32 {
        self.max_concurrent
    }

    /// Callers that may wait.
    pub const fn max_waiting(&self) -> u32 {
        self.max_waiting
    }

    /// How long a caller waits at most.
    pub const fn max_wait(&self) -> Duration {
        Duration::from_nanos(self.max_wait_ns)
    }
}

/// A refused admission (L1): no place, and no place to wait. `retry_after` says how long to
/// wait before asking again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[error("load shed: no place for the call (retry after {retry_after:?})")]
pub struct Shed {
    /// How long until asking again makes sense.
    pub retry_after: Duration,
}

/// Leave to make one call through a [`Bulkhead`]; hand it back to [`Bulkhead::release`] once.
/// It is neither `Clone` nor `Copy`: a permit is released at most once (L4).
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a permit holds a place until it is released"]
pub struct BulkheadPermit {
    acquired_at: Instant,
}

impl BulkheadPermit {
    /// When it was issued.
    pub const fn acquired_at(&self) -> Instant {
        self.acquired_at
    }
}

/// A place in a [`Bulkhead`]'s queue: claim it with [`Bulkhead::try_claim`] when the bulkhead
/// says it is [`ready`](Bulkhead::ready), or give it up with [`Bulkhead::cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Ticket {
    /// Its number: tickets are numbered in arrival order.
    pub number: u64,
    /// When its wait ends.
    pub deadline: Instant,
}

/// What [`Bulkhead::try_acquire`] answers when it does not admit the call at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Full {
    /// The caller waits with this ticket.
    Queued(Ticket),
    /// Refused, with how long to wait.
    Shed(Shed),
}

/// A caller mistake on a [`Bulkhead`]; nothing changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum BulkheadError {
    /// `release` with no call in flight.
    #[error("no call is in flight; release each permit once")]
    NotOutstanding,
    /// The ticket is not waiting: claimed, cancelled, expired and swept, or never issued.
    #[error("ticket {number} is not waiting (claimed, cancelled, expired, or never issued)")]
    NotWaiting {
        /// The ticket's number.
        number: u64,
    },
    /// The ticket's wait ended (its deadline passed): the caller is refused.
    #[error("ticket {number}'s wait ended")]
    Expired {
        /// The ticket's number.
        number: u64,
    },
}

/// At most N calls at once, the next waiting in arrival order up to the policy's `max_wait`
/// or refused at once (L1).
///
/// Verbs: [`try_acquire`](Self::try_acquire) before a call (a [`BulkheadPermit`], a [`Ticket`]
/// to wait with, or [`Shed`]); [`release`](Self::release) when the call ends, however it ends.
/// A waiter claims its place with [`try_claim`](Self::try_claim) once [`ready`](Self::ready)
/// names its ticket (after a release), or gives up with [`cancel`](Self::cancel). Outputs:
/// the answers of those calls; [`poll_timeout`](Self::poll_timeout) is the earliest waiting
/// deadline, and [`handle_timeout`](Self::handle_timeout) sweeps the waits that ended. No
/// clock, no allocation; a caller who arrives while others wait queues behind them.
///
/// ```
/// use core::time::Duration;
/// use persevere::{Bulkhead, BulkheadPolicy, Full, Instant};
///
/// let policy = BulkheadPolicy::builder(1).max_wait(Duration::from_millis(10), 1).build()?;
/// let mut bulkhead = Bulkhead::new();
/// let first = bulkhead.try_acquire(&policy, Instant::ZERO).expect("a free place");
/// let Err(Full::Queued(ticket)) = bulkhead.try_acquire(&policy, Instant::ZERO) else { panic!() };
/// assert!(matches!(bulkhead.try_acquire(&policy, Instant::ZERO), Err(Full::Shed(_))), "the queue is full");
/// bulkhead.release(first)?;
/// assert_eq!(bulkhead.ready(&policy, Instant::from_millis(1)), Some(ticket));
/// let second = bulkhead.try_claim(&policy, Instant::from_millis(1), ticket)?.expect("its turn");
/// bulkhead.release(second)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(remote = "Self"))]
pub struct Bulkhead {
    in_flight: u32,
    /// The number of the oldest ticket the ring still holds.
    head: u64,
    /// Tickets the ring holds, from `head` on (waiting ones, and given-up ones behind them).
    len: u32,
    /// Slot `number % MAX_WAITERS`: the ticket's deadline in ns, 0 once it left the queue (a
    /// deadline is never 0: a queued caller waits a positive `max_wait`).
    ring: [u64; RING],
}

crate::serde_validated!(Bulkhead, "Bulkhead");

impl Default for Bulkhead {
    fn default() -> Self {
        Bulkhead::new()
    }
}

impl Bulkhead {
    /// Nothing in flight, nobody waiting.
    pub const fn new() -> Self {
        Bulkhead { in_flight: 0, head: 0, len: 0, ring: [0; RING] }
    }

    /// Asks for a place at `now`: a permit while fewer than `max_concurrent` calls are in
    /// flight and nobody waits (waits that ended by `now` are swept first); else a ticket while
    /// fewer than `max_waiting` wait; else [`Shed`].
    ///
    /// # Errors
    /// [`Full`]: queued or shed. A queued caller's wait ends at `now + max_wait`.
    #[inline]
    pub fn try_acquire(&mut self, policy: &BulkheadPolicy, now: Instant) -> Result<BulkheadPermit, Full> {
        if self.len == 0 && self.in_flight < policy.max_concurrent {
            self.in_flight += 1;
            return Ok(BulkheadPermit { acquired_at: now });
        }
        self.queue(policy, now)
    }

    /// Every place taken or someone queued: sweeps the waits that ended (the work due at
    /// `now`), then admits, queues or sheds.
    #[cold]
    fn queue(&mut self, policy: &BulkheadPolicy, now: Instant) -> Result<BulkheadPermit, Full> {
        self.handle_timeout(now);
        if self.len == 0 && self.in_flight < policy.max_concurrent {
            self.in_flight += 1;
            return Ok(BulkheadPermit { acquired_at: now });
        }
        let end = self.head.saturating_add(u64::from(self.len));
        if self.waiting() >= policy.max_waiting || self.len >= MAX_WAITERS || end == u64::MAX {
            let retry_after = match self.earliest() {
                Some(deadline) => deadline.saturating_duration_since(now),
                None => Duration::from_nanos(policy.retry_after_ns),
            };
            return Err(Full::Shed(Shed { retry_after }));
        }
        let deadline = now.saturating_add(Duration::from_nanos(policy.max_wait_ns));
        self.ring[slot(end)] = deadline.as_nanos().max(1);
        self.len += 1;
        Err(Full::Queued(Ticket { number: end, deadline }))
    }

    /// The call made with `permit` ended, however it ended: its place frees, for the first
    /// waiter if any ([`ready`](Self::ready)).
    ///
    /// # Errors
    /// [`BulkheadError::NotOutstanding`] when no call is in flight; nothing changes.
    #[inline]
    pub fn release(&mut self, permit: BulkheadPermit) -> Result<(), BulkheadError> {
        let _ = permit;
        self.in_flight = self.in_flight.checked_sub(1).ok_or(BulkheadError::NotOutstanding)?;
        Ok(())
    }

    /// The ticket that may claim a place at `now`: the oldest whose wait has not ended, if a
    /// place is free. A pure query.
    pub fn ready(&self, policy: &BulkheadPolicy, now: Instant) -> Option<Ticket> {
        if self.in_flight >= policy.max_concurrent {
            return None;
        }
        self.first_alive(now).map(|(number, deadline)| Ticket { number, deadline })
    }

    /// The waiter holding `ticket` claims a place at `now`: a permit when its turn has come
    /// ([`ready`](Self::ready) names it), `None` while it still waits. Waits that ended before
    /// it leave the queue with it.
    ///
    /// # Errors
    /// [`BulkheadError::NotWaiting`] for a ticket that is not queued, [`BulkheadError::Expired`]
    /// once its wait ended (the caller is refused); nothing changes.
    pub fn try_claim(
        &mut self,
        policy: &BulkheadPolicy,
        now: Instant,
        ticket: Ticket,
    ) -> Result<Option<BulkheadPermit>, BulkheadError> {
        let deadline = self.deadline_of(ticket.number).ok_or(BulkheadError::NotWaiting { number: ticket.number })?;
        if deadline <= now {
            return Err(BulkheadError::Expired { number: ticket.number });
        }
        match self.ready(policy, now) {
            Some(first) if first.number == ticket.number => {
                for number in self.head..=ticket.number {
                    self.ring[slot(number)] = 0;
                }
                self.compact();
                self.in_flight += 1;
                Ok(Some(BulkheadPermit { acquired_at: now }))
            }
            _ => Ok(None),
        }
    }

    /// The waiter holding `ticket` gives up its place.
    ///
    /// # Errors
    /// [`BulkheadError::NotWaiting`]; nothing changes.
    pub fn cancel(&mut self, ticket: Ticket) -> Result<(), BulkheadError> {
        self.deadline_of(ticket.number).ok_or(BulkheadError::NotWaiting { number: ticket.number })?;
        self.ring[slot(ticket.number)] = 0;
        self.compact();
        Ok(())
    }

    /// Sweeps the waits that ended by `now` (their callers are refused). Early, repeated or
    /// spurious calls change nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.len {
            let s = slot(self.head + u64::from(i));
            if self.at(s).is_some_and(|deadline| deadline <= now) {
                self.ring[s] = 0;
            }
        }
        self.compact();
    }

    /// The earliest deadline of a waiting ticket: when [`handle_timeout`](Self::handle_timeout)
    /// is next due. A pure minimum over the ring.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.earliest()
    }

    /// Calls in flight.
    pub const fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Tickets waiting (those whose wait ended count until swept).
    pub fn waiting(&self) -> u32 {
        (0..self.len).filter(|&i| self.at(slot(self.head + u64::from(i))).is_some()).count() as u32
    }

    fn earliest(&self) -> Option<Instant> {
        (0..self.len).filter_map(|i| self.at(slot(self.head + u64::from(i)))).min()
    }

    fn first_alive(&self, now: Instant) -> Option<(u64, Instant)> {
        (0..self.len)
            .map(|i| self.head + u64::from(i))
            .find_map(|number| self.at(slot(number)).filter(|&d| d > now).map(|d| (number, d)))
    }

    fn deadline_of(&self, number: u64) -> Option<Instant> {
        let offset = number.checked_sub(self.head)?;
        if offset >= u64::from(self.len) {
            return None;
        }
        self.at(slot(number))
    }

    /// The deadline in slot `s`, if a ticket waits there.
    fn at(&self, s: usize) -> Option<Instant> {
        (self.ring[s] != 0).then(|| Instant::from_nanos(self.ring[s]))
    }

    /// Drops the given-up tickets at the head, so that the head is a waiting ticket.
    fn compact(&mut self) {
        while self.len > 0 && self.ring[slot(self.head)] == 0 {
            self.head += 1;
            self.len -= 1;
        }
    }

    /// Whether a loaded state could have been made by the verbs: the ring's length within
    /// [`MAX_WAITERS`], its head waiting, no slot outside it holding a deadline, and ticket
    /// numbers that do not overflow.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.len > MAX_WAITERS {
            return Err("more tickets than the ring holds");
        }
        if self.head.checked_add(u64::from(self.len)).is_none() {
            return Err("ticket numbers overflow");
        }
        if self.len > 0 && self.ring[slot(self.head)] == 0 {
            return Err("the oldest ticket held is not waiting");
        }
        let held = |s: usize| (0..self.len).any(|i| slot(self.head + u64::from(i)) == s);
        if (0..RING).any(|s| self.ring[s] != 0 && !held(s)) {
            return Err("a deadline outside the queue");
        }
        Ok(())
    }
}

const fn slot(number: u64) -> usize {
    (number % MAX_WAITERS as u64) as usize
}
