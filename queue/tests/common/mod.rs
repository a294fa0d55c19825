//! One database per test, on SQLite (always) and PostgreSQL (when `PERSEVERE_PG_URL` is set).
//!
//! Run the PostgreSQL half locally with a throwaway cluster:
//!
//! ```text
//! url=$(.ci/postgres start /tmp/persevere-pg)
//! PERSEVERE_PG_URL="$url" cargo test -p persevere-queue --features postgres
//! .ci/postgres stop /tmp/persevere-pg
//! ```
//!
//! With `PERSEVERE_PG_REQUIRED=1` (as `.ci/run` sets) a missing `PERSEVERE_PG_URL` fails the
//! PostgreSQL tests instead of skipping them.
#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use persevere::{Backoff, DeliveryPolicy, RetryPolicy};
use persevere_queue::{Queue, Store, TaskPolicy};

/// A database the tests open connections to.
pub trait Db: Sync {
    /// The store a connection is.
    type S: Store + Send + 'static;
    /// A new connection.
    fn connect(&self) -> Self::S;
    /// A new queue on a new connection.
    fn queue(&self) -> Queue<Self::S> {
        Queue::new(self.connect())
    }
    /// A writer on a connection of its own that bumps a task's version, as another worker's
    /// write would.
    fn interloper(&self) -> Box<dyn FnMut(i64) + Send>;
    /// Runs `sql` (statements without parameters) on a connection of its own.
    fn execute(&self, sql: &str);
    /// A connection to the queue named `name` in the same database (Q11).
    fn named(&self, name: &str) -> Result<Box<dyn Store + Send>, persevere_queue::QueueError>;
}

const BUMP: &str = "UPDATE persevere_tasks SET version = version + 1 WHERE id = $1";

/// A fresh SQLite file for test `name`.
pub struct SqliteDb {
    pub path: PathBuf,
}

pub fn sqlite(name: &str) -> SqliteDb {
    let dir = std::env::temp_dir().join(format!("persevere-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.sqlite3"));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    SqliteDb { path }
}

impl Db for SqliteDb {
    type S = persevere_queue::Sqlite;
    fn connect(&self) -> Self::S {
        persevere_queue::Sqlite::open(&self.path).unwrap()
    }
    fn interloper(&self) -> Box<dyn FnMut(i64) + Send> {
        let conn = rusqlite::Connection::open(&self.path).unwrap();
        Box::new(move |id| assert_eq!(conn.execute(BUMP, [id]).unwrap(), 1))
    }
    fn execute(&self, sql: &str) {
        rusqlite::Connection::open(&self.path).unwrap().execute_batch(sql).unwrap();
    }
    fn named(&self, name: &str) -> Result<Box<dyn Store + Send>, persevere_queue::QueueError> {
        Ok(Box::new(persevere_queue::Sqlite::options().queue(name).open(&self.path)?))
    }
}

/// A fresh schema for test `name` in the PostgreSQL database `PERSEVERE_PG_URL` names.
#[cfg(feature = "postgres")]
pub struct PgDb {
    pub params: String,
}

#[cfg(feature = "postgres")]
pub fn postgres(name: &str) -> Option<PgDb> {
    let Ok(url) = std::env::var("PERSEVERE_PG_URL") else {
        assert!(
            std::env::var_os("PERSEVERE_PG_REQUIRED").is_none(),
            "PERSEVERE_PG_REQUIRED is set but PERSEVERE_PG_URL is not: start a cluster with .ci/postgres"
        );
        eprintln!("PERSEVERE_PG_URL is not set: the PostgreSQL half of {name} is skipped");
        return None;
    };
    let schema = format!("t_{name}");
    let mut admin = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    admin.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}")).unwrap();
    Some(PgDb { params: format!("{url} options='-c search_path={schema}'") })
}

#[cfg(feature = "postgres")]
impl Db for PgDb {
    type S = persevere_queue::Postgres;
    fn connect(&self) -> Self::S {
        persevere_queue::Postgres::connect(&self.params).unwrap()
    }
    fn interloper(&self) -> Box<dyn FnMut(i64) + Send> {
        let mut client = postgres::Client::connect(&self.params, postgres::NoTls).unwrap();
        Box::new(move |id| assert_eq!(client.execute(BUMP, &[&id]).unwrap(), 1))
    }
    fn execute(&self, sql: &str) {
        postgres::Client::connect(&self.params, postgres::NoTls).unwrap().batch_execute(sql).unwrap();
    }
    fn named(&self, name: &str) -> Result<Box<dyn Store + Send>, persevere_queue::QueueError> {
        Ok(Box::new(persevere_queue::Postgres::connect_queue(&self.params, name)?))
    }
}

/// `max_attempts` attempts with no delay between them.
pub fn policy(max_attempts: u32) -> TaskPolicy {
    policy_with(max_attempts, Duration::ZERO)
}

/// `max_attempts` attempts `delay` apart, 10 s leases, 30 s heartbeats.
pub fn policy_with(max_attempts: u32, delay: Duration) -> TaskPolicy {
    let retry =
        RetryPolicy::builder(Backoff::constant(delay).build().unwrap()).max_attempts(max_attempts).build().unwrap();
    DeliveryPolicy::builder(retry).build().unwrap().map_route(|()| String::new())
}

/// Runs `$name` (a function generic over [`Db`]) on SQLite, and on PostgreSQL when it is there.
#[macro_export]
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(&$crate::common::sqlite(stringify!($name))) } )*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $( #[test] fn $name() {
                if let Some(db) = $crate::common::postgres(stringify!($name)) { super::$name(&db) }
            } )*
        }
    };
}
