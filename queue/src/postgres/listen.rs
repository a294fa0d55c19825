//! [`Store::listen`](crate::Store::listen) on PostgreSQL: `LISTEN persevere_tasks` on a
//! connection and a thread of its own, ringing the runner's doorbell on each notification the
//! inserts into its queue send (Q8).

use core::fmt;
use core::future::poll_fn;
use core::time::Duration;

use persevere::{BackoffState, SplitMix64};
use tokio_postgres::{AsyncMessage, NoTls};

use super::NOTIFY_CHANNEL;
use crate::QueueError;
use crate::runner::AbortOnDrop;
use crate::wake::{WeakDoorbell, jitter_seed, reconnect_backoff};

/// How often a listener that hears nothing checks that its doorbell is still there.
const ALIVE_CHECK: Duration = Duration::from_millis(250);

/// Starts the listener's thread: it connects with `params`, rings `bell` when tasks are added
/// to `queue`, and ends once `bell` is gone.
pub(super) fn spawn(params: String, queue: String, bell: WeakDoorbell) -> Result<(), QueueError> {
    std::thread::Builder::new()
        .name("persevere-listen".to_owned())
        .spawn(move || listen(&params, &queue, &bell))
        .map(drop)
        .map_err(QueueError::Io)
}

/// Why a listening connection ended while its bell was still there.
struct Lost(String);

impl From<tokio_postgres::Error> for Lost {
    fn from(error: tokio_postgres::Error) -> Self {
        Lost(QueueError::from(error).to_string())
    }
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Listens until the bell is gone: a connection that fails is replaced after the reconnect
/// backoff (persevere's own `Backoff`, its streak ended by each connection that listens).
fn listen(params: &str, queue: &str, bell: &WeakDoorbell) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return lost(&Lost(error.to_string()), None),
    };
    let backoff = reconnect_backoff();
    let mut failures = BackoffState::new();
    let mut rng = SplitMix64::new(jitter_seed());
    while bell.is_alive() {
        let Err(why) = runtime.block_on(session(params, queue, bell, &mut failures)) else { return };
        let delay = failures.next_delay(&backoff, &mut rng);
        lost(&why, Some(delay));
        std::thread::sleep(delay);
    }
}

/// One connection: `LISTEN`, then a ring (what was inserted while no connection listened was
/// not heard), then a ring per notification of `queue`. `Ok` once the bell is gone.
async fn session(params: &str, queue: &str, bell: &WeakDoorbell, failures: &mut BackoffState) -> Result<(), Lost> {
    let (client, mut connection) = tokio_postgres::connect(params, NoTls).await?;
    let (ringer, queue) = (bell.clone(), queue.to_owned());
    // Polling the connection's messages also runs its queries (the `LISTEN` below); the task
    // ends with the session.
    let mut driver = AbortOnDrop(tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(note))) if note.payload() == queue => {
                    ringer.ring();
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return Lost::from(error),
                None => return Lost("the server closed the listening connection".to_owned()),
            }
        }
    }));
    client.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}")).await?;
    failures.reset();
    listening();
    bell.ring();
    loop {
        match tokio::time::timeout(ALIVE_CHECK, &mut driver.0).await {
            Err(_) if bell.is_alive() => {}
            Err(_) => return Ok(()),
            Ok(Ok(why)) => return Err(why),
            Ok(Err(join)) => return Err(Lost(format!("the listening connection's task failed: {join}"))),
        }
    }
}

/// Logs that a connection listens (target `persevere::queue`, debug `listening`).
fn listening() {
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "persevere::queue", channel = "persevere_tasks", "listening");
}

/// Logs a connection lost (warn `listening connection lost`, with the error and the delay
/// before the next try) and counts it (`persevere_queue_listener_lost_total`).
fn lost(why: &Lost, retry_in: Option<Duration>) {
    #[cfg(feature = "tracing")]
    tracing::warn!(
        target: "persevere::queue",
        error = %why,
        retry_in_ms = retry_in.map(|d| d.as_millis() as u64),
        "listening connection lost"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("persevere_queue_listener_lost_total").increment(1);
    let _ = (why, retry_in);
}
