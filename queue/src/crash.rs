//! Test-only crash points (feature `crash-points`): `PERSEVERE_QUEUE_CRASH_AT=<op>:<k>` aborts
//! the process right after the `k`-th statement (counted from 1, over every `<op>` the thread
//! has run) of its `<op>` operations, where `<op>` is `insert`, `claim` or `update` (a report):
//! with `s` statements per operation, `k` in `1..=s` falls in the first one, `s+1..=2s` in the
//! second. Without the feature these are no-ops.
//!
//! `PERSEVERE_QUEUE_BREAK=split-claim` deliberately breaks the claim (for the test that shows
//! the crash tests catch a broken transaction): it decides in one transaction and writes the
//! state in another, without the version guard.

#[cfg(feature = "crash-points")]
mod points {
    use std::cell::Cell;
    use std::sync::OnceLock;

    const OPS: [&str; 3] = ["insert", "claim", "update"];

    fn target() -> Option<&'static (String, u32)> {
        static TARGET: OnceLock<Option<(String, u32)>> = OnceLock::new();
        TARGET
            .get_or_init(|| {
                let spec = std::env::var("PERSEVERE_QUEUE_CRASH_AT").ok()?;
                let (op, k) = spec.split_once(':')?;
                Some((op.to_owned(), k.parse().ok()?))
            })
            .as_ref()
    }

    pub(crate) fn split_claim() -> bool {
        static SPLIT: OnceLock<bool> = OnceLock::new();
        *SPLIT.get_or_init(|| std::env::var("PERSEVERE_QUEUE_BREAK").is_ok_and(|v| v == "split-claim"))
    }

    thread_local! {
        /// The operation running, and the statements run so far by each kind of operation.
        static CURRENT: Cell<usize> = const { Cell::new(0) };
        static COUNTS: Cell<[u32; 3]> = const { Cell::new([0; 3]) };
    }

    pub(crate) fn begin(op: &'static str) {
        let index = OPS.iter().position(|o| *o == op).unwrap_or(0);
        CURRENT.with(|current| current.set(index));
    }

    pub(crate) fn statement() {
        let Some((op, k)) = target() else { return };
        let index = CURRENT.with(Cell::get);
        let done = COUNTS.with(|counts| {
            let mut all = counts.get();
            all[index] += 1;
            counts.set(all);
            all[index]
        });
        if OPS[index] == op && done == *k {
            eprintln!("crash point {op}:{k}: aborting");
            std::process::abort();
        }
    }
}

#[cfg(feature = "crash-points")]
pub(crate) use points::{begin, split_claim, statement};

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub(crate) fn begin(_op: &'static str) {}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub(crate) fn statement() {}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub(crate) fn split_claim() -> bool {
    false
}
