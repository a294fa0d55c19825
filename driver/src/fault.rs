//! Test-only faults (feature `fault-injection`): defects a test can switch on in a real
//! `Supervisor` or `Scheduler` to prove that the simulator's checks catch them. Never enable
//! the feature in production: an injected fault breaks the rules on purpose. Without the
//! feature, [`Faults`] is empty and every check of it is a constant `false`.

/// A defect to inject into a [`Supervisor`](crate::Supervisor) (through
/// `SupervisorBuilder::inject_fault`) or a [`Scheduler`](crate::Scheduler) (through
/// `Scheduler::inject_fault`).
// Without the feature, nothing injects a fault: a variant checked only by the other machine's
// code is never named.
#[cfg_attr(not(feature = "fault-injection"), allow(dead_code, unreachable_pub))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Supervisor: a task whose machine finished it `Fatal` runs one more attempt (created,
    /// polled once and dropped, with no event) before it finishes.
    RestartAfterFatal,
    /// Supervisor: a task's `TaskFinished` event is never emitted (its exit still resolves).
    DropTaskFinished,
    /// Scheduler: a `trigger` of a tripped flow dispatches a run anyway.
    DispatchWhileTripped,
    /// Scheduler: a cron tick skipped because its flow was backing off is replayed when the
    /// window ends.
    ReplaySkippedTick,
}

/// The faults injected into one supervisor or scheduler (none, without the feature).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    #[cfg(feature = "fault-injection")]
    injected: Option<Fault>,
}

impl Faults {
    /// Injects `fault`.
    #[cfg(feature = "fault-injection")]
    pub(crate) fn inject(&mut self, fault: Fault) {
        self.injected = Some(fault);
    }

    /// Whether `fault` is injected.
    #[inline(always)]
    pub(crate) fn has(&self, fault: Fault) -> bool {
        #[cfg(feature = "fault-injection")]
        return self.injected == Some(fault);
        #[cfg(not(feature = "fault-injection"))]
        {
            let _ = fault;
            false
        }
    }
}
