//! How big a run of the suite is: rounds, seconds per measurement, rates,
//! idle counts, pods, and the `ringway` program under test; the full, quick
//! and test sizes and the `RINGWAY_BENCH_*` overrides. A leaf: it names no
//! other module of the crate.

use std::path::PathBuf;
use std::time::Duration;

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Config {
    /// "full", "quick" or "tiny" (the test's).
    pub label: String,
    /// Rounds alternating the scenarios.
    pub rounds: usize,
    /// Rounds of the cross-check with the standard tools: more than the
    /// suite's, since its rows are single 64 B round-trip percentiles and
    /// connection rates whose ratio to direct moves from round to round (3
    /// rounds once put HBONE's p99 at 2.16x direct where 7 put it at 4.38x).
    pub crosscheck_rounds: usize,
    /// Seconds per throughput run.
    pub secs: f64,
    /// Parallel streams of the N-stream run.
    pub streams: usize,
    /// Requests per second of the latency run (all connections together).
    pub rps: f64,
    /// Connections carrying the latency run.
    pub lat_conns: usize,
    /// Seconds of the latency run.
    pub lat_secs: f64,
    /// Concurrent connections of the connection-rate run (like `wrk -c`;
    /// over 2 client threads).
    pub conn_threads: usize,
    /// Seconds of the connection-rate run.
    pub conn_secs: f64,
    /// Upper bound on connections in one connection-rate run.
    pub conn_max: u64,
    /// The two idle-connection counts (RSS measured with each). The large
    /// one is lowered per scenario when the fd limit cannot hold it.
    pub idle: [usize; 2],
    /// The idle count the RSS target speaks of (10k).
    pub idle_target: usize,
    /// Pods enrolled by the churn measurements.
    pub churn_pods: usize,
    /// Scrapes per second of the scrape-impact run (each one `GET /metrics`
    /// and one `GET /config_dump`).
    pub scrape_rate: f64,
    /// The `ringway` program under test, run as `BIN proxy ...`: the suite's
    /// `ringway-bench-proxy` (which is `ringway::main`) or
    /// `RINGWAY_BENCH_PROXY_BIN`.
    pub proxy_bin: PathBuf,
    /// Include HAProxy when installed.
    pub haproxy: bool,
    /// Pause before reading a process's RSS (after start, after opening or
    /// closing idle connections) so it reflects the new state.
    pub settle: Duration,
    /// How long the proxy is left alone after the load before its RSS is
    /// read ([`after_load_quiet`] in the full and quick runs).
    pub after_load: Duration,
}

/// Past the pool's surplus idle timeout (10 s), so the HBONE tunnels a
/// burst opened beyond one per worker and peer have closed, plus the idle
/// trim's tick and quiet second to give their memory back: what stays is
/// what a proxy keeps between loads.
pub fn after_load_quiet() -> Duration {
    ringway_hbone::PoolConfig::default().surplus_idle_timeout + Duration::from_secs(2)
}

impl Config {
    /// The full run.
    pub fn full(proxy_bin: PathBuf) -> Config {
        Config {
            label: "full".into(),
            rounds: 3,
            crosscheck_rounds: 5,
            secs: 3.0,
            streams: 8,
            rps: 2000.0,
            lat_conns: 4,
            lat_secs: 3.0,
            conn_threads: 16,
            conn_secs: 2.0,
            conn_max: 20_000,
            idle: [1_000, 10_000],
            idle_target: 10_000,
            churn_pods: 1_000,
            scrape_rate: 10.0,
            proxy_bin,
            haproxy: true,
            settle: Duration::from_millis(300),
            after_load: after_load_quiet(),
        }
    }

    /// The CI-sized run (< 2 min): same measurements, smaller.
    pub fn quick(proxy_bin: PathBuf) -> Config {
        Config {
            label: "quick".into(),
            rounds: 2,
            crosscheck_rounds: 2,
            secs: 0.5,
            streams: 8,
            rps: 1000.0,
            lat_conns: 2,
            lat_secs: 0.5,
            conn_threads: 8,
            conn_secs: 0.5,
            conn_max: 5_000,
            idle: [100, 1_000],
            idle_target: 10_000,
            churn_pods: 100,
            scrape_rate: 10.0,
            proxy_bin,
            haproxy: true,
            settle: Duration::from_millis(200),
            after_load: after_load_quiet(),
        }
    }

    /// The test's run (seconds): checks the pipeline, not the numbers.
    pub fn tiny(proxy_bin: PathBuf) -> Config {
        Config {
            label: "tiny (test)".into(),
            rounds: 2,
            crosscheck_rounds: 2,
            secs: 0.2,
            streams: 2,
            rps: 500.0,
            lat_conns: 2,
            lat_secs: 0.3,
            conn_threads: 2,
            conn_secs: 0.2,
            conn_max: 500,
            idle: [20, 50],
            idle_target: 10_000,
            churn_pods: 10,
            scrape_rate: 10.0,
            proxy_bin,
            haproxy: false,
            settle: Duration::from_millis(100),
            // Its figures are not read.
            after_load: Duration::from_millis(1500),
        }
    }

    /// Applies `RINGWAY_BENCH_*` overrides (rounds, seconds, rate, idle counts, pods).
    pub fn with_env_overrides(mut self) -> Config {
        fn var<T: std::str::FromStr>(n: &str) -> Option<T> {
            std::env::var(n).ok().and_then(|v| v.parse().ok())
        }
        if let Some(v) = var("RINGWAY_BENCH_ROUNDS") {
            self.rounds = v;
            self.crosscheck_rounds = v;
        }
        if let Some(v) = var::<f64>("RINGWAY_BENCH_SECS") {
            self.secs = v;
            self.lat_secs = v;
            self.conn_secs = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_STREAMS") {
            self.streams = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_RPS") {
            self.rps = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_IDLE_SMALL") {
            self.idle[0] = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_IDLE_LARGE") {
            self.idle[1] = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_CHURN_PODS") {
            self.churn_pods = v;
        }
        if let Some(v) = var("RINGWAY_BENCH_SCRAPE_RATE") {
            self.scrape_rate = v;
        }
        if std::env::var("RINGWAY_BENCH_HAPROXY").as_deref() == Ok("0") {
            self.haproxy = false;
        }
        self
    }
}
