//! Test-only crash points (feature `crash-points`): `PERSEVERE_QUEUE_CRASH_AT=<op>:<k>` aborts
//! the process right after statement `k` (counted from 1) of the next `<op>` transaction, where
//! `<op>` is `insert`, `claim` or `update` (a report). Without the feature these are no-ops.
//!
//! `PERSEVERE_QUEUE_BREAK=split-claim` deliberately breaks the claim (for the test that shows
//! the crash tests catch a broken transaction): it decides in one transaction and writes the
//! state in another, without the version guard.

#[cfg(feature = "crash-points")]
mod points {
    use std::cell::Cell;
    use std::sync::OnceLock;

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

    thread_local! {
        static CURRENT: Cell<(&'static str, u32)> = const { Cell::new(("", 0)) };
    }

    pub(crate) fn begin(op: &'static str) {
        CURRENT.with(|current| current.set((op, 0)));
    }

    pub(crate) fn split_claim() -> bool {
        static SPLIT: OnceLock<bool> = OnceLock::new();
        *SPLIT.get_or_init(|| std::env::var("PERSEVERE_QUEUE_BREAK").is_ok_and(|v| v == "split-claim"))
    }

    pub(crate) fn statement() {
        let Some((op, k)) = target() else { return };
        CURRENT.with(|current| {
            let (name, done) = current.get();
            let done = done + 1;
            current.set((name, done));
            if name == op && done == *k {
                eprintln!("crash point {op}:{k}: aborting");
                std::process::abort();
            }
        });
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
