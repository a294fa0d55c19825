//! The runner's second connection (where the store offers one, [`Store::connect_again`]): it
//! makes the guarded writes of a batch of results the feeder decided, while the feeder claims
//! on its own connection. One batch at a time: the next is sent once this one is answered (Q7,
//! results flushed as soon as the previous flush returns).

use std::sync::mpsc;

use crate::wake::WeakDoorbell;
use crate::{GuardedWrite, QueueError, Store};

/// What the flusher's thread answers for a batch: whether each write applied, in order.
pub(super) type Written = Result<Vec<bool>, QueueError>;

/// The handle of the flusher's thread, which ends when this drops.
pub(super) struct Flusher {
    writes: mpsc::Sender<Vec<GuardedWrite>>,
    written: mpsc::Receiver<Written>,
}

impl Flusher {
    /// Starts a thread that writes each batch sent on `store`, sends back what applied and rings
    /// `doorbell`. `None` if the thread cannot start (the feeder then writes on its own
    /// connection).
    pub(super) fn start(mut store: Box<dyn Store + Send>, doorbell: WeakDoorbell) -> Option<Self> {
        let (writes, to_write) = mpsc::channel::<Vec<GuardedWrite>>();
        let (answer, written) = mpsc::channel();
        std::thread::Builder::new()
            .name("persevere-flusher".to_owned())
            .spawn(move || {
                while let Ok(batch) = to_write.recv() {
                    if answer.send(store.write_batch_if_leased(&batch)).is_err() {
                        return;
                    }
                    doorbell.ring();
                }
            })
            .ok()?;
        Some(Flusher { writes, written })
    }

    /// Sends a batch to write; gives it back if the thread is gone.
    pub(super) fn send(&self, batch: Vec<GuardedWrite>) -> Result<(), Vec<GuardedWrite>> {
        self.writes.send(batch).map_err(|unsent| unsent.0)
    }

    /// The answer for the batch sent, if it has come; [`QueueError::FlusherEnded`] if the
    /// thread is gone (it panicked).
    pub(super) fn answer(&self) -> Option<Written> {
        match self.written.try_recv() {
            Ok(written) => Some(written),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(QueueError::FlusherEnded)),
        }
    }
}
