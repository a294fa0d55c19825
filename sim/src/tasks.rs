//! A deterministic executor of many tasks on virtual time: the [`Runtime`] and the [`Spawn`]
//! the real `Supervisor` and `Scheduler` run on inside the simulator.
//!
//! One thread polls every task. Tasks are woken by real [`Waker`]s (the driver's channels,
//! signals and listeners wake them) and polled in the order they were woken; only when none is
//! ready does virtual time move, straight to the earliest timer. So a run is a function of its
//! seed: no wall clock, no OS scheduling, no I/O. The types are `Send + Sync` because the
//! driver asks for that of a runtime and of what it spawns; nothing here runs on another thread.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Wake, Waker};

use persevere::Instant;
use persevere_driver::{Runtime, Spawn};

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

#[derive(Default)]
struct State {
    now: u64,
    /// Pending timers by (deadline, registration number): woken in that order.
    timers: BTreeMap<(u64, u64), Waker>,
    next_timer: u64,
    /// Tasks woken and not yet polled, in the order they were woken.
    ready: VecDeque<usize>,
    queued: Vec<bool>,
    /// `None` while the task is being polled, or once it has finished.
    tasks: Vec<Option<Task>>,
    finished: Vec<bool>,
    polls: u64,
}

struct Shared {
    state: Mutex<State>,
    seed: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

/// Locks `mutex`, also after a panic elsewhere poisoned it (the simulator injects panics; one
/// thread runs everything, so a poisoned lock holds consistent data).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The executor and its clock. Cheap to clone (one `Arc`); every clone is the same executor.
#[derive(Clone)]
pub struct Tasks {
    shared: Arc<Shared>,
}

/// How [`Tasks::run`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Every task has finished.
    Done,
    /// Tasks remain, none is ready and no timer is set: they wait for something that will
    /// never come.
    Stuck,
    /// The poll limit was reached.
    OutOfPolls,
}

impl Tasks {
    /// An executor at the epoch whose runtime's entropy is `seed`.
    pub fn new(seed: u64) -> Self {
        Tasks { shared: Arc::new(Shared { state: Mutex::default(), seed }) }
    }

    /// The current virtual instant.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(self.shared.lock().now)
    }

    /// A stall: virtual time jumps forward by `by` at once, as when the process was descheduled
    /// or the machine suspended. Every timer due in between fires late, at the new instant, and
    /// the tasks see the jump on their next reading of the clock.
    pub fn jump(&self, by: core::time::Duration) {
        let mut state = self.shared.lock();
        state.now = state.now.saturating_add(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Tasks spawned so far, and how many of them have finished.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.shared.lock();
        (state.tasks.len(), state.finished.iter().filter(|f| **f).count())
    }

    /// Polls so far.
    pub fn polls(&self) -> u64 {
        self.shared.lock().polls
    }

    /// Drops every task that has not finished, as an executor that shuts down does (each
    /// future's locals are dropped: their guards run). Returns how many it dropped. Call it
    /// between [`run`](Self::run)s, never from inside a task (the task being polled would be
    /// marked finished and kept).
    pub fn drop_unfinished(&self) -> usize {
        let dropped: Vec<Task> = {
            let mut state = self.shared.lock();
            let state = &mut *state;
            state.ready.clear();
            state.queued.iter_mut().for_each(|queued| *queued = false);
            state.finished.iter_mut().for_each(|finished| *finished = true);
            state.tasks.iter_mut().filter_map(Option::take).collect()
        };
        // Outside the lock: a dropped future may wake, spawn or read the clock.
        let count = dropped.len();
        drop(dropped);
        count
    }

    /// Polls ready tasks, in the order they were woken, and moves virtual time to the next
    /// timer whenever none is ready, until every task has finished, nothing can make progress,
    /// or `max_polls` polls.
    pub fn run(&self, max_polls: u64) -> Stop {
        loop {
            let next = {
                let mut state = self.shared.lock();
                if state.polls >= max_polls {
                    return Stop::OutOfPolls;
                }
                match state.ready.pop_front() {
                    Some(id) => {
                        state.queued[id] = false;
                        state.polls += 1;
                        state.tasks[id].take().map(|task| (id, task))
                    }
                    None => {
                        if state.finished.iter().all(|f| *f) {
                            return Stop::Done;
                        }
                        let Some((&(deadline, seq), _)) = state.timers.first_key_value() else {
                            return Stop::Stuck;
                        };
                        state.now = state.now.max(deadline);
                        let waker = state.timers.remove(&(deadline, seq));
                        drop(state);
                        if let Some(waker) = waker {
                            waker.wake();
                        }
                        None
                    }
                }
            };
            let Some((id, mut task)) = next else { continue };
            let waker = Waker::from(Arc::new(TaskWaker { id, shared: Arc::downgrade(&self.shared) }));
            let finished = task.as_mut().poll(&mut Context::from_waker(&waker)).is_ready();
            let mut state = self.shared.lock();
            if finished {
                state.finished[id] = true;
            } else {
                state.tasks[id] = Some(task);
            }
        }
    }
}

struct TaskWaker {
    id: usize,
    shared: Weak<Shared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let Some(shared) = self.shared.upgrade() else { return };
        let mut state = shared.lock();
        if !state.queued[self.id] && !state.finished[self.id] {
            state.queued[self.id] = true;
            state.ready.push_back(self.id);
        }
    }
}

impl Spawn for Tasks {
    fn spawn<F: Future<Output = ()> + Send + 'static>(&self, future: F) {
        let mut state = self.shared.lock();
        let id = state.tasks.len();
        state.tasks.push(Some(Box::pin(future)));
        state.finished.push(false);
        state.queued.push(true);
        state.ready.push_back(id);
    }
}

impl Runtime for Tasks {
    type Sleep = Timer;

    fn now(&self) -> Instant {
        Tasks::now(self)
    }

    fn sleep_until(&self, deadline: Instant) -> Timer {
        Timer { shared: self.shared.clone(), deadline: deadline.as_nanos(), key: None }
    }

    fn entropy(&self) -> u64 {
        self.shared.seed
    }
}

/// A virtual-time sleep: ready once virtual time reaches its deadline.
pub struct Timer {
    shared: Arc<Shared>,
    deadline: u64,
    key: Option<(u64, u64)>,
}

impl Future for Timer {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        if state.now >= self.deadline {
            if let Some(key) = self.key.take() {
                state.timers.remove(&key);
            }
            return Poll::Ready(());
        }
        let key = match self.key {
            Some(key) => key,
            None => {
                state.next_timer += 1;
                let key = (self.deadline, state.next_timer);
                self.key = Some(key);
                key
            }
        };
        state.timers.insert(key, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.shared.lock().timers.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[test]
    fn tasks_interleave_on_virtual_time_and_spawn_more() {
        let tasks = Tasks::new(1);
        let log = Arc::new(Mutex::new(Vec::new()));
        for (name, ms) in [("a", 30u64), ("b", 10)] {
            let (rt, log) = (tasks.clone(), log.clone());
            tasks.spawn(async move {
                rt.sleep_until(Instant::from_millis(ms)).await;
                log.lock().unwrap().push((name, rt.now().as_nanos() / 1_000_000));
                let (inner_rt, inner_log) = (rt.clone(), log.clone());
                rt.spawn(async move {
                    let at = inner_rt.now().saturating_add(Duration::from_millis(1));
                    inner_rt.sleep_until(at).await;
                    inner_log.lock().unwrap().push(("child", inner_rt.now().as_nanos() / 1_000_000));
                });
            });
        }
        assert_eq!(tasks.run(1_000), Stop::Done);
        assert_eq!(*log.lock().unwrap(), [("b", 10), ("child", 11), ("a", 30), ("child", 31)]);
    }

    #[test]
    fn a_task_waiting_for_nothing_is_stuck_and_a_jump_fires_timers_late() {
        let tasks = Tasks::new(1);
        tasks.spawn(std::future::pending());
        assert_eq!(tasks.run(100), Stop::Stuck);

        let tasks = Tasks::new(1);
        let read = Arc::new(AtomicU64::new(0));
        let (rt, seen) = (tasks.clone(), read.clone());
        tasks.spawn(async move {
            rt.sleep_until(Instant::from_millis(20)).await;
            seen.store(rt.now().as_nanos(), Ordering::Relaxed);
        });
        tasks.jump(Duration::from_millis(50));
        assert_eq!(tasks.run(100), Stop::Done);
        assert_eq!(read.load(Ordering::Relaxed), 50_000_000, "the 20 ms timer fired late, at 50 ms");
    }
}
