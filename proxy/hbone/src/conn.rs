//! One pooled HTTP/2 connection's bookkeeping ([`Conn`], the pool's
//! [`Counters`]) and the stream slot a tunnel holds on it ([`StreamGuard`],
//! given back when the tunnel's stream is dropped). A leaf: the pool takes
//! slots, a stream holds one.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use h2::client::SendRequest;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The pool's gauges and counter, shared with its connection tasks.
#[derive(Default)]
pub(crate) struct Counters {
    /// Connections open now.
    pub(crate) connections: AtomicUsize,
    /// Streams (tunnels) open now.
    pub(crate) streams: AtomicUsize,
    /// Connections ever opened (the next one's id).
    pub(crate) opened: AtomicU64,
}

/// One HTTP/2 connection of the pool.
pub(crate) struct Conn {
    /// Its number in the pool (for logs).
    pub(crate) id: u64,
    /// Opens streams on it.
    pub(crate) send: SendRequest<Bytes>,
    /// Its streams and whether it takes more.
    pub(crate) state: Mutex<ConnState>,
    /// Wakes the connection task when its last stream ends.
    pub(crate) idle: Notify,
    /// Closes the connection now (its streams are reset).
    pub(crate) close: Notify,
}

/// What a connection carries, under its lock.
pub(crate) struct ConnState {
    /// Streams open on it.
    pub(crate) active: usize,
    /// No new streams (GOAWAY, error, idle close, PING timeout).
    pub(crate) dead: bool,
    /// Since when it has carried no stream.
    pub(crate) idle_since: Option<Instant>,
}

/// Holds one stream slot on a connection; released on drop.
pub(crate) struct StreamGuard {
    /// The connection the slot is on.
    pub(crate) conn: Arc<Conn>,
    counters: Arc<Counters>,
}

impl StreamGuard {
    /// The slot just taken on `conn` (its `active` and the stream counter
    /// already count it).
    pub(crate) fn new(conn: Arc<Conn>, counters: Arc<Counters>) -> Self {
        StreamGuard { conn, counters }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.counters.streams.fetch_sub(1, Ordering::Relaxed);
        let mut st = self.conn.state.lock().unwrap_or_else(|p| p.into_inner());
        st.active -= 1;
        if st.active == 0 {
            st.idle_since = Some(Instant::now());
            drop(st);
            self.conn.idle.notify_one();
        }
    }
}
