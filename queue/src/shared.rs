//! What the two databases here share: the clock estimate, the skew, and the compare-and-set
//! report and claim visit they both make (absent when neither store is built).

use core::time::Duration;

use persevere::Instant;

use crate::QueueError;
use crate::store::{ClaimVisit, Row, UpdateVisit, Visit, Write, instant_of};

/// A reading of the database's clock (without the test-only skew) and when, on this machine's
/// monotonic clock, it arrived: what [`Store::clock_estimate`] moves forward.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClockReading {
    nanos: i64,
    arrived: std::time::Instant,
}

impl ClockReading {
    /// A reading of `nanos` (skew included) on a connection skewed by `skew`, arriving now.
    pub(crate) fn new(nanos: i64, skew: Duration) -> Self {
        let skew = i64::try_from(skew.as_nanos()).unwrap_or(i64::MAX);
        ClockReading { nanos: nanos.saturating_sub(skew), arrived: std::time::Instant::now() }
    }

    /// The reading moved on by the time elapsed since it arrived, plus the connection's skew
    /// now (which a test may have moved since).
    pub(crate) fn estimate(&self, skew: Duration) -> Option<Instant> {
        let elapsed = Duration::from_nanos(u64::try_from(self.arrived.elapsed().as_nanos()).unwrap_or(u64::MAX));
        instant_of(skewed(self.nanos, skew.saturating_add(elapsed))).ok()
    }
}

/// The clock reading plus the skew, saturating.
pub(crate) fn skewed(nanos: i64, skew: Duration) -> i64 {
    nanos.saturating_add(i64::try_from(skew.as_nanos()).unwrap_or(i64::MAX))
}

/// A row read with the clock of its statement (ns since 1970), or `None` if there is no such
/// row.
pub(crate) type ReadWithClock = Result<Option<(i64, Row)>, QueueError>;

/// How often a report re-reads a task whose version moved between its read and its write.
const CAS_TRIES: u32 = 16;

/// A report by compare-and-set (Q1), as both stores make it: `read` the row (unlocked) with the
/// clock of its statement, let `visit` decide, and `write` the decision guarded by the version
/// read (`true` if it applied). When another writer moved the version in between, it reads and
/// decides again, up to 16 times, then gives up with [`QueueError::Conflict`]. No lock is held
/// while the queue decides, so reports never wait for each other's decisions.
pub(crate) fn compare_and_set<S>(
    store: &mut S,
    id: i64,
    visit: &mut UpdateVisit<'_>,
    read: fn(&mut S, i64) -> ReadWithClock,
    write: fn(&mut S, &Row, &Write, i64) -> Result<bool, QueueError>,
) -> Result<bool, QueueError> {
    for _ in 0..CAS_TRIES {
        let Some((now, row)) = read(store, id)? else { return Ok(false) };
        let Some(decided) = visit(instant_of(now)?, &row)? else { return Ok(true) };
        if write(store, &row, &decided, now)? {
            return Ok(true);
        }
    }
    Err(QueueError::Conflict(crate::TaskId(id)))
}

/// What a claim decided for one row it visited.
#[derive(Debug)]
pub(crate) enum Decided {
    /// Write this over row `id` if it still has `version`.
    Write { id: i64, version: i64, write: Write },
    /// Set row `id` aside as corrupt, with why (Q10).
    SetAside { id: i64, reason: String },
}

/// A row read with the clock of its statement, or the id of a row whose cells do not decode
/// and why.
pub(crate) type Decoded = Result<(Instant, Row), (i64, String)>;

/// Passes `rows` to `visit` in order until it claims the last job it wants; returns what to
/// write. A row whose cells do not decode is set aside without a visit (Q10).
pub(crate) fn visit_rows(
    rows: impl Iterator<Item = Result<Decoded, QueueError>>,
    visit: &mut ClaimVisit<'_>,
) -> Result<Vec<Decided>, QueueError> {
    let mut decided = Vec::new();
    for row in rows {
        let (now, row) = match row? {
            Ok(read) => read,
            Err((id, reason)) => {
                decided.push(Decided::SetAside { id, reason });
                continue;
            }
        };
        let (id, version) = (row.id, row.version);
        match visit(now, &row)? {
            Visit::Skip => {}
            Visit::Write(write) => decided.push(Decided::Write { id, version, write }),
            Visit::SetAside(reason) => decided.push(Decided::SetAside { id, reason }),
            Visit::WriteAndStop(write) => {
                decided.push(Decided::Write { id, version, write });
                break;
            }
        }
    }
    Ok(decided)
}

/// Checks a queue name (Q11): 1 to 63 characters, letters, digits, `_`, `-`, `.` and `:`.
pub(crate) fn check_queue_name(name: &str) -> Result<(), QueueError> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if valid { Ok(()) } else { Err(QueueError::QueueName(name.to_owned())) }
}
