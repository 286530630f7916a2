//! Datapath counters shared by the workers (relaxed atomics: one add per
//! event, read by the control thread).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// A monotonically increasing counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    /// Subtracts one.
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    /// Current value.
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Datapath statistics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Connections accepted on any listener.
    pub accepted: Counter,
    /// Connections currently proxied (accepted, not yet closed).
    pub active: Gauge,
    /// Connections reset because the upstream connect failed.
    pub connect_failed: Counter,
    /// Connections reset because they had no usable destination.
    pub refused: Counter,
    /// accept/socket failures for lack of fds or memory.
    pub accept_resource_errors: Counter,
    /// Outbound connections delivered straight into a pod on this node.
    pub same_node: Counter,
    /// Splice pipes moving bytes right now (all workers).
    pub pipes_in_use: Gauge,
    /// Empty pipes kept for reuse (all workers).
    pub pipes_idle: Gauge,
    /// Bytes written toward the destination.
    pub bytes_to_upstream: AtomicU64,
    /// Bytes written back toward the client.
    pub bytes_to_client: AtomicU64,
    /// Server TLS handshakes of the tunnel listener that ran on a thread
    /// other than the handshake thread (a datapath worker): 0 when the
    /// datapath is kept free of them.
    pub server_handshakes_off_thread: Counter,
    /// Workers inside their busy-poll window right now (`busyPollMicros`).
    pub busy_polling: Gauge,
    /// Zero-timeout polls of the event loop made by busy-polling workers.
    pub busy_poll_yields: Counter,
}

/// A point-in-time copy of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    /// See [`Stats::accepted`].
    pub accepted: u64,
    /// See [`Stats::active`].
    pub active: i64,
    /// See [`Stats::connect_failed`].
    pub connect_failed: u64,
    /// See [`Stats::refused`].
    pub refused: u64,
    /// See [`Stats::accept_resource_errors`].
    pub accept_resource_errors: u64,
    /// See [`Stats::same_node`].
    pub same_node: u64,
    /// See [`Stats::bytes_to_upstream`].
    pub bytes_to_upstream: u64,
    /// See [`Stats::bytes_to_client`].
    pub bytes_to_client: u64,
    /// See [`Stats::server_handshakes_off_thread`].
    pub server_handshakes_off_thread: u64,
}

impl Stats {
    /// Reads every counter.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            accepted: self.accepted.get(),
            active: self.active.get(),
            connect_failed: self.connect_failed.get(),
            refused: self.refused.get(),
            accept_resource_errors: self.accept_resource_errors.get(),
            same_node: self.same_node.get(),
            bytes_to_upstream: self.bytes_to_upstream.load(Ordering::Relaxed),
            bytes_to_client: self.bytes_to_client.load(Ordering::Relaxed),
            server_handshakes_off_thread: self.server_handshakes_off_thread.get(),
        }
    }
}
