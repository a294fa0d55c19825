//! The checks a loaded [`Delivery`] passes before it is driven: a state the transitions
//! could have made (see the crate docs, *Plain data*).

use super::{AttemptProgress, DECLINED_CAPACITY, Delivery, DeliveryStatus, FINISH, HAND_OUT, READY, REVOKE, Terminal};

impl<K, W, C, E, R> Delivery<K, W, C, E, R> {
    /// Whether a loaded state is one the transitions could have made: the task's state agrees
    /// with its embedded retry, and its pending actions with its state.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn validate(&self) -> Result<(), &'static str> {
        if self.pending & !(REVOKE | READY | HAND_OUT | FINISH) != 0 {
            return Err("an unknown action is pending");
        }
        if usize::from(self.declined_next) >= DECLINED_CAPACITY {
            return Err("the decliners' ring points past its end");
        }
        if self.declined_ring_is_broken() {
            return Err("the decliners' ring has a gap");
        }
        if (self.pending & REVOKE != 0) != self.revoked.is_some() {
            return Err("a pending revoke and its worker disagree");
        }
        if self.revoked.is_some()
            && matches!(self.state, DeliveryStatus::HandedOut { .. } | DeliveryStatus::Running { .. })
        {
            return Err("a revoked attempt's task is still out (a revoke leaves it pending or finished)");
        }
        let retry_attempt = self.retry.attempt();
        let may_have_run = retry_attempt > 1
            || matches!(
                self.state,
                DeliveryStatus::Running { .. }
                    | DeliveryStatus::Done(
                        Terminal::Completed { .. }
                            | Terminal::Failed(_)
                            | Terminal::Proceeded(_)
                            | Terminal::Diverted { .. }
                    )
            );
        if may_have_run && self.progress == AttemptProgress::NotStarted {
            return Err("an attempt may have run, yet the progress says none reached a worker");
        }
        match &self.state {
            DeliveryStatus::Pending { attempt, not_before } => {
                if *attempt != retry_attempt || !matches!(self.retry.status(), crate::RetryStatus::Running { .. }) {
                    return Err("a pending attempt is not the one its retry runs");
                }
                if self.pending & (HAND_OUT | FINISH) != 0 || (self.pending & READY != 0 && not_before.is_some()) {
                    return Err("a pending task has actions of another state");
                }
            }
            DeliveryStatus::HandedOut { attempt, .. } | DeliveryStatus::Running { attempt, .. } => {
                if *attempt != retry_attempt || !matches!(self.retry.status(), crate::RetryStatus::Running { .. }) {
                    return Err("an attempt that is out is not the one its retry runs");
                }
                if self.pending & (READY | FINISH) != 0 {
                    return Err("an attempt that is out has actions of another state");
                }
                if matches!(self.state, DeliveryStatus::Running { .. }) && self.pending & HAND_OUT != 0 {
                    return Err("a running attempt still has its hand-out pending");
                }
            }
            DeliveryStatus::Done(terminal) => {
                if self.pending & (READY | HAND_OUT) != 0 {
                    return Err("a finished task has actions of a live one");
                }
                if let Terminal::Completed { attempt } = terminal
                    && *attempt != retry_attempt
                {
                    return Err("a completed attempt is not its retry's last attempt");
                }
            }
        }
        if self.retry.has_actions() {
            return Err("the embedded retry has undrained actions");
        }
        Ok(())
    }

    /// Whether the decliners' ring is not one `handle_returned` fills: slots used from the
    /// first on, `declined_next` just past them until the ring is full.
    fn declined_ring_is_broken(&self) -> bool {
        let used = self.declined.iter().filter(|d| d.is_some()).count();
        used < DECLINED_CAPACITY && used != usize::from(self.declined_next)
            || self.declined.iter().take(used).any(Option::is_none)
    }
}

crate::serde_validated!(Delivery<K, W, C, E, R>, "a Delivery");
