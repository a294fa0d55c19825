//! A counting global allocator for allocation-free proofs in tests.
//!
//! A test binary installs it and measures a closure:
//!
//! ```
//! #[global_allocator]
//! static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;
//!
//! assert_eq!(alloc_counter::allocations_in(|| drop(std::hint::black_box(Box::new(1u8)))), 1);
//! assert_eq!(alloc_counter::allocations_in(|| { std::hint::black_box(1 + 1); }), 0);
//! ```
//!
//! The count is per thread, so a test harness's allocations on other threads do not count.
//! Without `Counting` installed as the global allocator, every count is zero.
#![deny(missing_docs)]
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations and reallocations on the calling thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counting;

fn count_one() {
    // `try_with`: a thread that is exiting may allocate after its thread-locals are gone.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only a
// const-initialised thread-local `Cell<u64>`, which never allocates and has no destructor.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations counted on this thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
}

/// How many allocations `f` makes on this thread.
pub fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}

/// The system allocator, counting allocations over every thread and the bytes live (allocated
/// and not yet freed): for soaks, where the work runs on many threads.
///
/// ```
/// #[global_allocator]
/// static GLOBAL: alloc_counter::CountingEverywhere = alloc_counter::CountingEverywhere;
///
/// let (before, live) = (alloc_counter::total_allocations(), alloc_counter::live_bytes());
/// let kept = std::hint::black_box(vec![0u8; 4096]);
/// assert!(alloc_counter::total_allocations() > before);
/// assert!(alloc_counter::live_bytes() >= live + 4096);
/// drop(kept);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct CountingEverywhere;

static TOTAL: AtomicU64 = AtomicU64::new(0);
static LIVE: AtomicU64 = AtomicU64::new(0);

/// Allocations (and reallocations) counted by [`CountingEverywhere`] on every thread so far.
pub fn total_allocations() -> u64 {
    TOTAL.load(Ordering::Relaxed)
}

/// Bytes allocated through [`CountingEverywhere`] and not yet freed.
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// atomics, which never allocate.
unsafe impl GlobalAlloc for CountingEverywhere {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        TOTAL.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(new_size as u64, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// What glibc's `malloc` holds, from `mallinfo2` (glibc 2.33 or later): the bytes it has taken
/// from the system for its heaps and mapped blocks, and how much of that is in use and free. A
/// soak reads it to tell memory the program holds from memory the allocator keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MallocStats {
    /// Bytes of the arenas' heaps (`arena`) and of blocks mapped on their own (`hblkhd`).
    pub held: u64,
    /// Bytes in chunks handed out and not freed (`uordblks` + `hblkhd`).
    pub in_use: u64,
    /// Bytes in free chunks the allocator keeps (`fordblks`).
    pub free: u64,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    /// glibc's `struct mallinfo2`.
    #[repr(C)]
    pub(crate) struct Mallinfo2 {
        pub(crate) arena: usize,
        pub(crate) ordblks: usize,
        pub(crate) smblks: usize,
        pub(crate) hblks: usize,
        pub(crate) hblkhd: usize,
        pub(crate) usmblks: usize,
        pub(crate) fsmblks: usize,
        pub(crate) uordblks: usize,
        pub(crate) fordblks: usize,
        pub(crate) keepcost: usize,
    }

    unsafe extern "C" {
        pub(crate) fn mallinfo2() -> Mallinfo2;
        pub(crate) fn malloc_trim(pad: usize) -> i32;
    }
}

/// glibc's figures for every arena (`None` off glibc). Under another allocator preloaded
/// (`LD_PRELOAD`), these are glibc's own, unused arenas, not the allocator's.
pub fn malloc_stats() -> Option<MallocStats> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallinfo2` takes no argument and returns a plain struct by value.
        let info = unsafe { glibc::mallinfo2() };
        Some(MallocStats {
            held: (info.arena + info.hblkhd) as u64,
            in_use: (info.uordblks + info.hblkhd) as u64,
            free: info.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// Asks glibc to give free memory at the top of its heaps, and free whole pages inside them,
/// back to the system (`malloc_trim(0)`); returns whether any was released (`false` off glibc).
pub fn malloc_trim() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` only walks the allocator's own state, under its locks.
        unsafe { glibc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}
