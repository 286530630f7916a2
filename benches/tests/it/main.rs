//! The tests of ringway-benches, one binary: each module runs one
//! measurement at its smallest (or reads the report's document back) and
//! checks the report it writes is complete. None asserts performance.
//!
//! Scratch directories are the test bed's [`ringway_testbed::TempDir`];
//! the measured programs are this package's binaries ([`proxy_bin`],
//! [`flood_bin`]). The measurements take turns ([`one_at_a_time`]).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

mod ca_flood_report;
mod cni_ca_report;
mod control_plane_report;
mod flood_report;
mod quick_report;
mod report_fields;
mod upgrade_report;

/// The proxy under test: `ringway-bench-proxy`, the `ringway` program.
fn proxy_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringway-bench-proxy"))
}

/// The flood generator of `hbone_preauth_flood`: `ringway-bench-flood`.
fn flood_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringway-bench-flood"))
}

/// Held while a measurement runs: one at a time, as when each had a binary
/// of its own. A measurement loads every CPU, counts the process's file
/// descriptors and raises its RLIMIT_NOFILE: two at once would read each
/// other's. A test that failed holding it does not fail the others.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
