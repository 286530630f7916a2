//! How big a `--flood` run is: rounds, connections, sources, reopenings,
//! and the neighbour's load; the full, quick and test sizes and the
//! `RINGWAY_BENCH_*` overrides. A leaf of the scenario.

use serde::{Deserialize, Serialize};

/// How big a flood run is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodConfig {
    /// "full", "quick" or "tiny (test)".
    pub label: String,
    /// Rounds (fresh proxy each), medians over them.
    pub rounds: usize,
    /// Connections the flood opens to the victim's 15008 (half idle TCP,
    /// half a ClientHello then silence); the generators reopen what the
    /// proxy closes, at most `reopen` times this many.
    pub conns: u64,
    /// Bound on reopenings as a multiple of `conns` (0: the burst only, the
    /// connections the proxy closes are not replaced).
    pub reopen: u64,
    /// Flood generator processes (each holds `conns / procs` fds).
    pub procs: usize,
    /// Source addresses of the attacking pod (its own plus extra ones).
    pub sources: usize,
    /// Seconds of each latency and throughput run.
    pub secs: f64,
    /// Requests per second of the latency run.
    pub rps: f64,
    /// Connections carrying the latency run.
    pub lat_conns: usize,
    /// Silent connections opened together before the flood, whose
    /// pre-authentication deadlines' spread is measured (at most the
    /// per-source cap, 64 by default).
    pub deadline_conns: usize,
}

impl FloodConfig {
    /// The full scenario: 20,000 connections, 3 rounds.
    pub fn full() -> FloodConfig {
        FloodConfig {
            label: "full".into(),
            rounds: 3,
            conns: 20_000,
            reopen: 5,
            procs: 2,
            sources: 32,
            secs: 3.0,
            rps: 2000.0,
            lat_conns: 4,
            deadline_conns: 40,
        }
    }

    /// A smaller run (`--flood --quick`): 5,000 connections, 2 rounds.
    pub fn quick() -> FloodConfig {
        FloodConfig {
            label: "quick".into(),
            rounds: 2,
            conns: 5_000,
            reopen: 5,
            procs: 1,
            sources: 32,
            secs: 1.0,
            rps: 1000.0,
            lat_conns: 2,
            deadline_conns: 40,
        }
    }

    /// The CI-sized run (`benches/tests/it/flood_report.rs`).
    pub fn tiny() -> FloodConfig {
        FloodConfig {
            label: "tiny (test)".into(),
            rounds: 1,
            conns: 500,
            reopen: 5,
            procs: 1,
            sources: 4,
            secs: 0.5,
            rps: 500.0,
            lat_conns: 2,
            deadline_conns: 40,
        }
    }

    /// `RINGWAY_BENCH_ROUNDS`, `RINGWAY_BENCH_SECS`, `RINGWAY_BENCH_RPS`,
    /// `RINGWAY_BENCH_FLOOD_CONNS`, `RINGWAY_BENCH_FLOOD_SOURCES`.
    pub fn with_env_overrides(mut self) -> FloodConfig {
        fn var<T: std::str::FromStr>(n: &str) -> Option<T> {
            std::env::var(n).ok().and_then(|v| v.parse().ok())
        }
        if let Some(v) = var("RINGWAY_BENCH_ROUNDS") {
            self.rounds = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_SECS") {
            self.secs = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_RPS") {
            self.rps = v;
        }
        if let Some(v) = var::<u64>("RINGWAY_BENCH_FLOOD_CONNS") {
            self.conns = v;
            self.procs = v.div_ceil(PER_PROC).max(1) as usize;
        }
        if let Some(v) = var("RINGWAY_BENCH_FLOOD_REOPEN") {
            self.reopen = v;
        }
        if let Some(v) = var::<usize>("RINGWAY_BENCH_FLOOD_SOURCES") {
            self.sources = v.clamp(1, 100);
        }
        if std::env::vars().any(|(k, _)| {
            [
                "RINGWAY_BENCH_ROUNDS",
                "RINGWAY_BENCH_SECS",
                "RINGWAY_BENCH_RPS",
                "RINGWAY_BENCH_FLOOD_CONNS",
                "RINGWAY_BENCH_FLOOD_SOURCES",
                "RINGWAY_BENCH_FLOOD_REOPEN",
            ]
            .contains(&k.as_str())
        }) {
            self.label.push_str(", environment overrides");
        }
        self
    }
}

/// Connections one flood process holds at most (one fd each, under the
/// 20,000 fd limit of this machine).
pub const PER_PROC: u64 = 10_000;
