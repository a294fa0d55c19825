//! What can go wrong talking to the queue.

use persevere::DeliveryError;

use crate::TaskId;

/// An error of a queue operation. A refused report leaves the task exactly as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// The task's redelivery machine refused the report: most often the job's lease was lost
    /// (its deadline passed and a sweep interrupted it, so another attempt now owns the task),
    /// or the task has already finished. Stop working on the job.
    #[error("task {task} refused the report: {error}")]
    Refused {
        /// The task.
        task: TaskId,
        /// Why, as the redelivery machine says.
        error: DeliveryError,
    },
    /// No task has this id.
    #[error(
        "no task {0}: it was never enqueued in this queue, or it finished and its row was deleted (`prune`, `keep_finished(false)`)"
    )]
    UnknownTask(TaskId),
    /// A re-drive of a task that has not failed or been dead-lettered.
    #[error("task {task} is {status}; only failed and dead-lettered tasks can be re-driven")]
    NotRedrivable {
        /// The task.
        task: TaskId,
        /// Its status.
        status: crate::Status,
    },
    /// The task's row kept changing under this report (its version moved every time it was
    /// read and decided on): other writers keep winning. Nothing was written; try again.
    #[error("task {0} kept changing under this report; nothing was written, try again")]
    Conflict(TaskId),
    /// A state or policy could not be encoded as JSON.
    #[error("could not encode a task's state or policy: {0}")]
    Encode(serde_json::Error),
    /// A stored state or policy did not load (edited by hand, or written by an incompatible
    /// version). Claims and sweeps set such a row aside as `Status::Corrupt`; see
    /// `Queue::corrupt_tasks`.
    #[error("task {task}: its stored {what} does not load: {source}")]
    Corrupt {
        /// The task.
        task: TaskId,
        /// `"state"` or `"policy"`.
        what: &'static str,
        /// The decoder's error.
        source: serde_json::Error,
    },
    /// A row that cannot be driven (Q10): its cells do not decode, or its state names what no
    /// claim could have written (an emptied state on a claimed row, an instant far from the
    /// database's clock, an attempt number past what the queue stores). Claims and sweeps set
    /// it aside as `Status::Corrupt` with this reason; see `Queue::corrupt_tasks`.
    #[error("task {task} cannot be driven: {reason}")]
    BadRow {
        /// The task.
        task: TaskId,
        /// What is wrong with it.
        reason: String,
    },
    /// A queue name that is empty, longer than 63 characters, or has characters other than
    /// letters, digits, `_`, `-`, `.` and `:`.
    #[error("{0:?} is not a queue name: use 1 to 63 letters, digits, '_', '-', '.' or ':'")]
    QueueName(String),
    /// `Sqlite::open` was given a file it will not use as a queue, and changed nothing in it.
    #[error("{path}: {reason}")]
    NotAQueue {
        /// The file.
        path: std::path::PathBuf,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The SQLite store failed.
    #[cfg(feature = "sqlite")]
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The PostgreSQL store failed.
    #[cfg(feature = "postgres")]
    #[error("postgres: {}", postgres_message(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// A [`Runner`](crate::Runner)'s thread that writes results on a second connection ended
    /// (it panicked): the batch it held is written again on the runner's own connection.
    #[error("the runner's thread that writes results ended; they are written on its claiming connection from now on")]
    FlusherEnded,
    /// The PostgreSQL store could not start its I/O runtime.
    #[cfg(feature = "postgres")]
    #[error("could not start the PostgreSQL connection's runtime: {0}")]
    Io(std::io::Error),
    /// The database's clock reads before 1970 or after 2262.
    #[error("the database clock reads {0} ns since 1970, outside what an `Instant` holds")]
    Clock(i64),
}

/// The server's own message (with its detail and hint) when the server sent one; otherwise the
/// client's error and its causes, so that "db error" never stands alone.
#[cfg(feature = "postgres")]
fn postgres_message(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        let mut message = format!("{}: {} (SQLSTATE {})", db.severity(), db.message(), db.code().code());
        for (label, text) in [("detail", db.detail()), ("hint", db.hint())] {
            if let Some(text) = text {
                message.push_str(&format!("; {label}: {text}"));
            }
        }
        return message;
    }
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    message
}
