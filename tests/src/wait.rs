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
