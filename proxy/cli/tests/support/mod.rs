//! Helpers shared by the process-level drills.

#![allow(dead_code)]

use std::net::SocketAddr;

/// Whether the readiness endpoint at `addr` answers 200.
pub fn ready(addr: SocketAddr) -> bool {
    ringway_testbed::http::get(addr, "/healthz/ready").is_ok_and(|r| r.status == 200)
}

/// Whether the agent's liveness endpoint at `addr` answers 200 (it serves,
/// with or without a proxy).
pub fn live(addr: SocketAddr) -> bool {
    ringway_testbed::http::get(addr, "/healthz/live").is_ok_and(|r| r.status == 200)
}
