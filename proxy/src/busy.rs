//! The busy-poll window (`proxy.busyPollMicros`): after a datapath socket
//! became ready, a worker keeps polling its event loop without sleeping for
//! up to the window, so the next message (a reply, typically) is picked up
//! by a running thread instead of one woken from `epoll_wait`.
//!
//! How: one task per worker ([`run`]) that, while the last readiness is
//! younger than the window, does nothing but `yield_now()`. A yielded task
//! makes tokio's current-thread scheduler poll the reactor with a zero
//! timeout (`epoll_wait(.., 0)`, its `park_yield`) instead of parking, and a
//! zero-timeout poll skips the `on_thread_park` hook. When the window has
//! passed, the task sleeps until the next readiness ([`note_activity`]), so
//! an idle worker never spins.
//!
//! io_uring backend: tokio-uring submits queued ring ops (accept, connect)
//! only in that park hook, so a worker that spins would hold a queued op
//! back for up to the window. Every ring op ([`note_ring_op`]) therefore
//! ends the spin at once and lets the worker park (which submits it).
//!
//! State is per thread: each worker is one thread and one runtime.

use std::cell::Cell;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use crate::stats::Stats;

struct State {
    /// A window is configured on this thread (a worker's).
    enabled: Cell<bool>,
    /// When a datapath socket last became ready.
    last: Cell<Option<Instant>>,
    /// The spinning task, asleep until the next readiness.
    sleeper: Cell<Option<Waker>>,
    /// Set by a readiness while the task slept.
    kicked: Cell<bool>,
    /// A ring op was queued since the spin began (it waits for a park).
    ring_op: Cell<bool>,
}

thread_local! {
    static STATE: State = const {
        State {
            enabled: Cell::new(false),
            last: Cell::new(None),
            sleeper: Cell::new(None),
            kicked: Cell::new(false),
            ring_op: Cell::new(false),
        }
    };
}

/// A datapath socket of this thread became ready: (re)opens the window.
/// Costs one thread-local read when no window is configured.
pub(crate) fn note_activity() {
    STATE.with(|s| {
        if !s.enabled.get() {
            return;
        }
        s.last.set(Some(Instant::now()));
        if let Some(w) = s.sleeper.take() {
            s.kicked.set(true);
            w.wake();
        }
    });
}

/// A ring op was queued on this thread: the spin must let the worker park
/// so tokio-uring's park hook submits it.
pub(crate) fn note_ring_op() {
    STATE.with(|s| {
        if s.enabled.get() {
            s.ring_op.set(true);
        }
    });
}

/// Clears this thread's state when the task ends (the worker stops).
struct Enabled;

impl Drop for Enabled {
    fn drop(&mut self) {
        STATE.with(|s| {
            s.enabled.set(false);
            s.last.set(None);
            s.sleeper.take();
            s.kicked.set(false);
            s.ring_op.set(false);
        });
    }
}

/// The worker's busy-poll task for a window of `window` (not zero). Counts
/// its yields in `stats.busy_poll_yields` and marks itself in
/// `stats.busy_polling` while it spins.
pub(crate) async fn run(window: Duration, stats: Arc<Stats>) {
    STATE.with(|s| s.enabled.set(true));
    let _enabled = Enabled;
    loop {
        // Asleep until a socket becomes ready.
        std::future::poll_fn(|cx| {
            STATE.with(|s| {
                if s.kicked.replace(false) {
                    Poll::Ready(())
                } else {
                    s.sleeper.set(Some(cx.waker().clone()));
                    Poll::Pending
                }
            })
        })
        .await;
        STATE.with(|s| s.ring_op.set(false));
        let _spinning = Spinning::new(&stats);
        loop {
            let (spin, ring_op) = STATE.with(|s| {
                let fresh = s.last.get().is_some_and(|t| t.elapsed() < window);
                (fresh, s.ring_op.replace(false))
            });
            if !spin || ring_op {
                break;
            }
            stats.busy_poll_yields.inc();
            tokio::task::yield_now().await;
        }
    }
}

/// Counts the worker in `busy_polling` while it spins (also when the task
/// is dropped mid-spin).
struct Spinning<'a>(&'a Stats);

impl<'a> Spinning<'a> {
    fn new(stats: &'a Stats) -> Self {
        stats.busy_polling.inc();
        Spinning(stats)
    }
}

impl Drop for Spinning<'_> {
    fn drop(&mut self) {
        self.0.busy_polling.dec();
    }
}
