//! Waiting on a condition with a bounded deadline (never a fixed sleep).

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
