//! Waiting on a condition with a bounded deadline (never a fixed sleep):
//! [`wait_until`] and [`wait_for`] on a thread, [`wait_for_async`] (feature
//! `async`) inside a tokio runtime, whose other tasks go on meanwhile.

use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it holds or `timeout` passes; returns
/// whether it held. Never waits longer than `timeout` (plus one poll).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls `cond` like [`wait_until`] and fails the test naming `what` when it
/// does not hold within `timeout`.
#[track_caller]
pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    assert!(
        wait_until(timeout, cond),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// [`wait_for`] inside a tokio runtime: polls `cond` every 5 ms on tokio's
/// timer (so the runtime's other tasks, and paused time, go on), failing
/// the test naming `what` when it does not hold within `timeout`.
#[cfg(feature = "async")]
#[track_caller]
pub fn wait_for_async<'a>(
    what: &'a str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool + 'a,
) -> impl std::future::Future<Output = ()> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        let deadline = tokio::time::Instant::now() + timeout;
        while !cond() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what} ({caller})"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
