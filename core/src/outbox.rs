//! Events waiting to be drained by a machine's `poll_event` (O1): a fixed number, oldest first.

/// At most `N` undrained events, oldest first, in place (no allocation). An event that arrives
/// while `N` wait pushes the oldest out, and that loss is counted ([`dropped`](Self::dropped)),
/// so an event is never lost unseen. A driver that drains after every input never loses one:
/// every machine that keeps an outbox makes fewer than `N` events per input.
///
/// Events are outputs, not state: a machine's serialized form leaves them out, a loaded
/// machine has none waiting, and they take no part in its equality or hash (every outbox is
/// equal to every other), so a machine loads back equal to the one saved, and two machines in
/// the same state are equal whether or not their events were drained.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Outbox<T, const N: usize> {
    /// The first `len` are the waiting events, oldest first.
    items: [Option<T>; N],
    len: u8,
    /// Events pushed out unseen since the machine was made (saturating).
    dropped: u32,
}

impl<T, const N: usize> PartialEq for Outbox<T, N> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl<T, const N: usize> Eq for Outbox<T, N> {}

impl<T, const N: usize> core::hash::Hash for Outbox<T, N> {
    fn hash<H: core::hash::Hasher>(&self, _: &mut H) {}
}

impl<T: Copy, const N: usize> Default for Outbox<T, N> {
    fn default() -> Self {
        Outbox::new()
    }
}

impl<T: Copy, const N: usize> Outbox<T, N> {
    pub(crate) const fn new() -> Self {
        Outbox { items: [None; N], len: 0, dropped: 0 }
    }

    /// Adds `event` after the waiting ones; when `N` wait, the oldest is pushed out.
    #[cold]
    pub(crate) fn push(&mut self, event: T) {
        let len = usize::from(self.len);
        if len < N {
            self.items[len] = Some(event);
            self.len += 1;
        } else {
            self.items.copy_within(1.., 0);
            self.items[N - 1] = Some(event);
            self.dropped = self.dropped.saturating_add(1);
        }
    }

    /// The oldest waiting event.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let first = self.items[0].take();
        self.items.copy_within(1.., 0);
        self.items[N - 1] = None;
        self.len -= 1;
        first
    }

    /// Events pushed out unseen so far.
    pub(crate) const fn dropped(&self) -> u32 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::Outbox;

    #[test]
    fn events_come_out_oldest_first_and_an_overflow_is_counted() {
        let mut outbox = Outbox::<u32, 2>::new();
        assert_eq!(outbox.pop(), None);
        outbox.push(1);
        outbox.push(2);
        assert_eq!((outbox.pop(), outbox.dropped()), (Some(1), 0));
        outbox.push(3);
        outbox.push(4);
        assert_eq!(outbox.dropped(), 1, "2 was pushed out unseen");
        assert_eq!((outbox.pop(), outbox.pop(), outbox.pop()), (Some(3), Some(4), None));
        assert_eq!(outbox.dropped(), 1);
    }
}
