//! Where the crate's own tasks run (an HTTP/2 connection's driver, each
//! served stream): on the calling thread's `LocalSet` when the thread said
//! all its tasks live there ([`LocalTasks`]), else on the tokio runtime.
//!
//! Why: a current-thread runtime that also drives a `LocalSet` keeps two run
//! queues. When a runtime task wakes a `LocalSet` task (the HTTP/2 driver
//! waking the tunnel copy that waits for its data, say), the scheduler polls
//! its I/O driver once more (`epoll_wait` with a zero timeout) before it
//! turns to the `LocalSet`: one event-loop syscall per hand-over, two per
//! HBONE round trip with both tunnel ends on one worker (benches/HISTORY.md,
//! "HBONE round trip: one run queue"). With every task of a tunnel in the
//! `LocalSet`, a wake-up is a push onto the queue being drained.
//!
//! A leaf: names no other module.

use std::cell::Cell;
use std::future::Future;

thread_local! {
    /// This thread runs every task inside a `LocalSet` ([`LocalTasks`]).
    static LOCAL: Cell<bool> = const { Cell::new(false) };
}

/// While held, the crate spawns its tasks on this thread's `LocalSet`
/// (`tokio::task::spawn_local`) instead of the runtime (`tokio::spawn`).
///
/// Only for a thread whose every task, and the code that holds this,
/// runs inside one `LocalSet` (a datapath worker): `spawn_local` panics
/// outside one. Dropped (or the thread's first [`LocalTasks`] dropped), the
/// thread spawns on the runtime again.
#[derive(Debug)]
pub struct LocalTasks {
    was: bool,
}

impl LocalTasks {
    /// Spawns on this thread's `LocalSet` from now on.
    pub fn enter() -> LocalTasks {
        LocalTasks {
            was: LOCAL.with(|l| l.replace(true)),
        }
    }
}

impl Drop for LocalTasks {
    fn drop(&mut self) {
        let was = self.was;
        // During thread exit the flag may be gone already: nothing to undo.
        let _ = LOCAL.try_with(|l| l.set(was));
    }
}

/// Whether this thread spawns the crate's tasks on its `LocalSet`.
pub(crate) fn local() -> bool {
    LOCAL.with(Cell::get)
}

/// Spawns one of the crate's tasks (see the module doc for where).
pub(crate) fn spawn<F>(f: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    if local() {
        tokio::task::spawn_local(f);
    } else {
        tokio::spawn(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under [`LocalTasks`] a task lands on the thread's `LocalSet` (the
    /// runtime does not own it); without it, on the runtime; and the guard
    /// gives back what was there before it.
    #[test]
    fn tasks_follow_the_threads_choice() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let set = tokio::task::LocalSet::new();
        set.block_on(&rt, async {
            let on_runtime = || {
                tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks()
            };
            assert!(!local());
            let (tx1, rx1) = tokio::sync::oneshot::channel::<()>();
            {
                let _g = LocalTasks::enter();
                assert!(local());
                spawn(async move {
                    let _ = rx1.await;
                });
                assert_eq!(
                    on_runtime(),
                    0,
                    "a task spawned under the guard is the runtime's"
                );
                {
                    let _inner = LocalTasks::enter();
                }
                assert!(local(), "an inner guard undid the outer one");
            }
            assert!(!local(), "the guard left the thread spawning locally");
            let (tx2, rx2) = tokio::sync::oneshot::channel::<()>();
            spawn(async move {
                let _ = rx2.await;
            });
            assert_eq!(
                on_runtime(),
                1,
                "a task spawned without the guard is not the runtime's"
            );
            drop((tx1, tx2));
        });
    }
}
