//! What the SQLite store knows of the file it opens: whether it may use it (checked without
//! writing to it, Q10), and the in-process lock that makes its writers take turns fairly.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, OpenFlags};

use crate::QueueError;

/// The columns a queue's table must have: a table made by an earlier version lacks some.
const COLUMNS: [&str; 15] = [
    "id",
    "queue",
    "task_type",
    "payload",
    "policy",
    "state",
    "version",
    "status",
    "due_at",
    "attempt",
    "idempotency_key",
    "declined_by",
    "corrupt_reason",
    "created_at",
    "updated_at",
];

/// Refuses, without writing to it, a file the queue must not use: one with more than one
/// hard link (SQLite names its write-ahead log after the path, so two names for one file
/// lose commits), one that is not a SQLite database, one whose queue table an earlier version
/// made, and, unless `share` allows it, a database of another application's (tables of its
/// own and no queue). A missing or empty file is fine: the queue creates it.
pub(crate) fn check(path: &Path, share: bool) -> Result<(), QueueError> {
    let refuse = |reason: String| Err(QueueError::NotAQueue { path: path.to_owned(), reason });
    let Ok(metadata) = std::fs::metadata(path) else { return Ok(()) };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if metadata.nlink() > 1 {
            return refuse(format!(
                "the file has {} hard links; SQLite keeps its write-ahead log by name, so writers through \
                 different names lose each other's commits: open it by a single name",
                metadata.nlink()
            ));
        }
    }
    if metadata.len() == 0 {
        return Ok(());
    }
    let tables = match read_tables(path) {
        Ok(tables) => tables,
        Err(error) => {
            return refuse(format!("not a SQLite database the queue can read ({error}); nothing was changed"));
        }
    };
    let Some(columns) = tables.get("persevere_tasks") else {
        if tables.is_empty() || share {
            return Ok(());
        }
        let mut names: Vec<&str> = tables.keys().map(String::as_str).collect();
        names.sort_unstable();
        return refuse(format!(
            "the database holds another application's tables ({}) and no queue; nothing was changed. To add the \
             queue's table to it, open it with `Sqlite::options().share_database(true).open(path)`",
            names.join(", ")
        ));
    };
    let missing: Vec<&str> = COLUMNS.iter().copied().filter(|c| !columns.iter().any(|have| have == c)).collect();
    if !missing.is_empty() {
        return refuse(format!(
            "its persevere_tasks table lacks the columns {}: an earlier version of persevere-queue made it; \
             drain that queue and drop the table, nothing was changed",
            missing.join(", ")
        ));
    }
    Ok(())
}

/// The file's tables and their columns, read through a read-only connection.
fn read_tables(path: &Path) -> rusqlite::Result<HashMap<String, Vec<String>>> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    let mut statement = conn.prepare(
        "SELECT m.name, p.name FROM sqlite_master AS m LEFT JOIN pragma_table_info(m.name) AS p
         WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'",
    )?;
    let mut tables: HashMap<String, Vec<String>> = HashMap::new();
    let rows = statement.query_map([], |row| Ok((row.get::<_, String>(0)?, row.get::<_, Option<String>>(1)?)))?;
    for row in rows {
        let (table, column) = row?;
        tables.entry(table).or_default().extend(column);
    }
    Ok(tables)
}

/// A first-come, first-served lock (a ticket lock): the in-process writers of one file take
/// turns in the order they asked, so none waits while others write again and again (SQLite's
/// own busy wait is not fair: under 16 writers one could wait past its lease).
#[derive(Debug, Default)]
pub(crate) struct FairLock {
    tickets: Mutex<(u64, u64)>,
    turn: Condvar,
}

/// A turn at writing, given back when dropped.
pub(crate) struct Turn<'a>(&'a FairLock);

impl FairLock {
    /// The lock of the file at `path` (its canonical path), shared by every store of this
    /// process that opened it.
    pub(crate) fn of(path: &Path) -> Arc<FairLock> {
        static LOCKS: Mutex<Option<HashMap<PathBuf, Arc<FairLock>>>> = Mutex::new(None);
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let mut locks = LOCKS.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(locks.get_or_insert_with(HashMap::new).entry(key).or_default())
    }

    /// Waits for this caller's turn.
    pub(crate) fn turn(&self) -> Turn<'_> {
        let mut tickets = self.lock();
        let mine = tickets.0;
        tickets.0 += 1;
        while tickets.1 != mine {
            tickets = self.turn.wait(tickets).unwrap_or_else(PoisonError::into_inner);
        }
        Turn(self)
    }

    fn lock(&self) -> MutexGuard<'_, (u64, u64)> {
        self.tickets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.lock().1 += 1;
        self.0.turn.notify_all();
    }
}
