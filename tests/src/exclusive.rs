//! Tests that must have their process to themselves, in a test binary
//! whose other tests run beside them.
//!
//! A crate's integration tests are one binary, and libtest runs its tests
//! on several threads of one process. A few tests cannot share it:
//! - a socket's port checks (`bind` must see only the sockets the test
//!   means to): a process forked by another test thread (`ip`, `nft`, a
//!   child program) holds a copy of every fd between its fork and its
//!   exec, so a socket the test closed can briefly still hold its port;
//! - thousands of connections at once, counted against the process's fd
//!   limit, or measurements of the whole process (its CPU time, its fds);
//! - load that other tests' timing cannot stand beside.
//!
//! Such a test takes [`alone`] first. Every [`crate::run_isolated`] holds
//! [`shared`] while its body runs, and so does any test that forks outside
//! `run_isolated` (it takes [`shared`] itself): an `alone` test waits until
//! none of them runs, and none starts until it is done. A thread that holds
//! either (and the isolated thread `run_isolated` starts from it) passes
//! through a nested `run_isolated` without waiting on itself.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    /// Holders of [`Shared`].
    shared: usize,
    /// An [`Alone`] is held.
    alone: bool,
    /// Callers of [`alone`] waiting: new [`shared`] callers wait behind
    /// them, so an `alone` test is not starved by the others.
    waiting: usize,
}

static STATE: Mutex<State> = Mutex::new(State {
    shared: 0,
    alone: false,
    waiting: 0,
});
static CHANGED: Condvar = Condvar::new();

thread_local! {
    /// This thread runs under the gate already (holds a guard, or was
    /// started for a body that does).
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait(s: MutexGuard<'static, State>) -> MutexGuard<'static, State> {
    CHANGED.wait(s).unwrap_or_else(|p| p.into_inner())
}

/// Held by a test that must run with no other gated test running.
#[derive(Debug)]
#[must_use = "the test runs alone only while this is held"]
pub struct Alone(());

/// Held while a test that forks (or otherwise shares the process) runs.
#[derive(Debug)]
#[must_use = "the test is counted only while this is held"]
pub struct Shared {
    counted: bool,
}

/// Waits until no other gated test runs, then keeps any from starting
/// until the guard is dropped.
///
/// Panics when this thread already holds a guard (it would wait on itself).
pub fn alone() -> Alone {
    assert!(
        !INSIDE.get(),
        "exclusive::alone() from inside run_isolated or another guard: take it first"
    );
    let mut s = state();
    s.waiting += 1;
    while s.alone || s.shared > 0 {
        s = wait(s);
    }
    s.waiting -= 1;
    s.alone = true;
    INSIDE.set(true);
    Alone(())
}

impl Drop for Alone {
    fn drop(&mut self) {
        state().alone = false;
        INSIDE.set(false);
        CHANGED.notify_all();
    }
}

/// Counts this test as running (waiting while an [`alone`] test runs or
/// waits), until the guard is dropped. Free on a thread that holds a guard.
pub fn shared() -> Shared {
    if INSIDE.get() {
        return Shared { counted: false };
    }
    let mut s = state();
    while s.alone || s.waiting > 0 {
        s = wait(s);
    }
    s.shared += 1;
    INSIDE.set(true);
    Shared { counted: true }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.counted {
            state().shared -= 1;
            INSIDE.set(false);
            CHANGED.notify_all();
        }
    }
}

/// Marks the calling thread as running under a guard that its parent
/// holds (the isolated thread of [`crate::run_isolated`]).
pub(crate) fn enter_child() {
    INSIDE.set(true);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// While an `alone` guard is held no `shared` holder runs, and the
    /// other way round; guards nest on one thread without waiting.
    #[test]
    fn alone_excludes_shared_and_shared_ones_overlap() {
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static ALONE_SAW_OTHERS: AtomicUsize = AtomicUsize::new(0);
        std::thread::scope(|sc| {
            for i in 0..6 {
                sc.spawn(move || {
                    for _ in 0..20 {
                        if i == 0 {
                            let _a = alone();
                            if RUNNING.load(Ordering::SeqCst) != 0 {
                                ALONE_SAW_OTHERS.fetch_add(1, Ordering::SeqCst);
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        } else {
                            let _s = shared();
                            let _nested = shared();
                            RUNNING.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(1));
                            RUNNING.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        assert_eq!(ALONE_SAW_OTHERS.load(Ordering::SeqCst), 0);
        assert!(!INSIDE.get());
    }
}
