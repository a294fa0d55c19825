//! What the supervisor and scheduler tests share: the executors they run on, and small helpers.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use persevere::Instant;
use persevere_driver::{Runtime, Spawn};
use persevere_smol::{SmolRuntime, SmolSpawn};
use persevere_tokio::{TokioRuntime, TokioSpawn};

/// An executor the scenarios run on: its runtime, its spawner, and whether its time is paused
/// (exact) or real (late by scheduling noise, never early).
pub trait Exec: 'static {
    type Rt: Runtime<Sleep: Send> + Default + Send + Sync + 'static;
    type Sp: Spawn + Default;
    const PAUSED: bool;
}

pub struct Tokio;
impl Exec for Tokio {
    type Rt = TokioRuntime;
    type Sp = TokioSpawn;
    const PAUSED: bool = true;
}

pub struct Smol;
impl Exec for Smol {
    type Rt = SmolRuntime;
    type Sp = SmolSpawn;
    const PAUSED: bool = false;
}

/// A current-thread tokio runtime with paused time.
pub fn tokio_paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap()
}

/// Runs `scenario` on tokio with paused time, and on smol (real time).
#[macro_export]
macro_rules! on_tokio_and_smol {
    ($name:ident) => {
        mod $name {
            use super::*;

            #[test]
            fn on_tokio() {
                common::tokio_paused().block_on(super::$name::<common::Tokio>())
            }

            #[test]
            fn on_smol() {
                smol::block_on(super::$name::<common::Smol>())
            }
        }
    };
}

/// Sleeps `d` on `X`'s timers.
pub fn sleep<X: Exec>(d: Duration) -> impl Future<Output = ()> + Send {
    let rt = X::Rt::default();
    let at = rt.now().saturating_add(d);
    let sleep = rt.sleep_until(at);
    async move {
        sleep.await;
    }
}

/// Polls `check` every millisecond until it holds; panics after `limit`.
pub async fn until<X: Exec>(limit: Duration, mut check: impl FnMut() -> bool) {
    let rt = X::Rt::default();
    let end = rt.now().saturating_add(limit);
    while !check() {
        assert!(rt.now() < end, "condition not reached within {limit:?}");
        sleep::<X>(Duration::from_millis(1)).await;
    }
}

/// Now on a runtime shared by a test's jobs.
pub fn now<Rt: Runtime>(rt: &Rt) -> Instant {
    rt.now()
}

/// A future that never completes and counts its drops.
pub struct Hang(pub Arc<AtomicU32>);

impl Future for Hang {
    type Output = Result<(), String>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Pending
    }
}

impl Drop for Hang {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
