//! The `hbone_preauth_flood` scenario (issue 10 item 5): a neighbour pod
//! pair's HBONE latency and throughput, quiet and while thousands of idle
//! and half-open connections hammer another pod's 15008 on the same proxy;
//! the proxy's RSS and fds before, during and after the flood, and what its
//! tunnel listener refused (`ringway_hbone_refused_total{reason}`).
//!
//! One virtual node, one proxy child carrying three pods: pod 1 the
//! victim (its 15008 flooded), pods 2 -> 3 the neighbours (HBONE on one
//! node: `sameNodeFastPath: false`, so their traffic is an HTTP/2 CONNECT
//! over mutual TLS to pod 3's 15008 on the same proxy). Pod 0 is the
//! attacker, outside the mesh, with extra addresses of its own (in its own
//! netns) as flood sources. The flood runs in `ringway-bench-flood`
//! processes started in pod 0's netns, pinned to the last CPU.
//!
//! Per round, on a fresh proxy: the neighbour's fixed-rate latency and one
//! stream's throughput quiet, then the flood's burst, the same two
//! measurements while the flood keeps reopening what the proxy closes, the
//! flood stopped and the proxy given time to let go. Reported, never
//! asserted: medians over the rounds, the flood/quiet p99 ratio beside the
//! issue's 2x bound.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path as FsPath;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_config::CaptureMode;
use ringway_testbed::VirtualNode;
use serde::{Deserialize, Serialize};

use crate::bed;
use crate::child::{ProxyArgs, ProxyChild};
use crate::load::{self, Path};

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
        }
    }

    /// The CI-sized run (`benches/tests/flood_report.rs`).
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
const PER_PROC: u64 = 10_000;

/// The neighbour's figures in one state (quiet or flooded).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Neighbour {
    /// Round trip of 64 B at a fixed rate (open loop), µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
    /// Requests completed per second (the asked rate unless the path lagged).
    pub achieved_rps: f64,
    /// One stream's throughput, Gbit/s.
    pub tput_gbps: f64,
    /// The proxy's CPU (all threads) during the two runs / their wall
    /// time: cores it used.
    pub proxy_cores: f64,
    /// The datapath workers' run-queue delay (runnable, waiting for a CPU:
    /// `schedstat`), summed over the `ringway-wk-N` worker threads, ms per second
    /// of the latency run (not the throughput run, which saturates the
    /// cores by design): the scheduling share of the neighbour's tail.
    pub worker_wait_ms_per_s: f64,
    /// CPU of the proxy's `ringway-tls-hs` thread (pre-auth TLS, when the
    /// proxy has one) during the latency run / its wall time: 0 when
    /// handshakes run on the workers.
    pub handshake_cores: f64,
    /// p99 of how late the neighbour's load generator sent, µs. Each of its
    /// connections waits for a reply before the next request, so a reply
    /// later than the send interval makes the next sends late too: this is
    /// the generator's own scheduling delay plus that carry-over.
    pub gen_lateness_p99_us: f64,
}

/// The proxy's resources at one moment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Resources {
    /// VmRSS, MiB.
    pub rss_mib: f64,
    /// Open fds.
    pub fds: usize,
}

/// What the flood generators did, summed over the processes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FloodCounts {
    /// Connections attempted (the burst and the reopenings).
    pub attempted: u64,
    /// Connections of the burst established (TCP).
    pub opened: u64,
    /// Connects or ClientHello writes that failed.
    pub failed: u64,
    /// Connections opened again after the proxy closed one.
    pub reopened: u64,
    /// Connections the proxy closed or reset while the flood ran.
    pub closed_by_proxy: u64,
    /// Connections the generators still held when stopped.
    pub held_at_end: u64,
    /// Seconds the burst took (slowest process).
    pub burst_secs: f64,
    /// Whether the generators were pinned to their CPU.
    pub pinned: bool,
    /// The generators' CPU seconds (all processes), read before they stop.
    pub cpu_s: f64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

/// One round.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodRound {
    /// The neighbour, no flood.
    pub quiet: Neighbour,
    /// The neighbour while the flood runs.
    pub flood: Neighbour,
    /// The proxy before the flood (after the quiet measurements).
    pub before: Resources,
    /// The proxy's largest RSS and fds sampled while the flood ran.
    pub during: Resources,
    /// The proxy once the flood stopped and its fds settled (bounded wait).
    pub after: Resources,
    /// The generators' counts.
    pub counts: FloodCounts,
    /// `ringway_hbone_refused_total{reason}` at the end of the round.
    pub refused: BTreeMap<String, f64>,
}

/// Medians over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodSummary {
    /// Median quiet neighbour figures.
    pub quiet: Neighbour,
    /// Median flooded neighbour figures.
    pub flood: Neighbour,
    /// flood p99 / quiet p99, from the medians above.
    pub p99_ratio: f64,
    /// flood throughput / quiet throughput, from the medians above.
    pub tput_ratio: f64,
    /// Whether `p99_ratio` is at most 2 (the bound; reported, not asserted).
    pub p99_within_2x: bool,
    /// Median RSS before / during / after, MiB.
    pub rss_mib: [f64; 3],
    /// Median fds before / during / after.
    pub fds: [f64; 3],
    /// Median refused counts by reason.
    pub refused: BTreeMap<String, f64>,
}

/// The flood report (`flood.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodReport {
    /// The run's size.
    pub config: FloodConfig,
    /// The proxy binary measured.
    pub proxy_bin: String,
    /// The proxy's pre-auth limits in force (defaults of `hbone:`).
    pub limits: BTreeMap<String, String>,
    /// Every round.
    pub rounds: Vec<FloodRound>,
    /// Medians; `None` when no round completed.
    pub summary: Option<FloodSummary>,
    /// Measurements that failed.
    pub errors: Vec<String>,
    /// Machine description.
    pub machine: Vec<(String, String)>,
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench flood] {}", msg.as_ref());
}

/// Runs the scenario. Must be called inside `ringway_testbed::run_isolated`.
pub fn run(
    config: FloodConfig,
    proxy_bin: &FsPath,
    flood_bin: &FsPath,
) -> anyhow::Result<FloodReport> {
    crate::host::raise_nofile(200_000);
    let scratch = crate::host::Scratch::new()?;
    let n1 = VirtualNode::build(1, 4).context("virtual node 1")?;
    let (attacker, victim, client, server) = (n1.pod(0), n1.pod(1), n1.pod(2), n1.pod(3));
    ringway_identity::CaSigner::generate_for_tests(bed::TRUST_DOMAIN)
        .write_pem_files(&scratch.0.join("ca.crt"), &scratch.0.join("ca.key"))?;
    let yaml = scratch.0.join("flood.yaml");
    std::fs::write(
        &yaml,
        bed::hbone_yaml(
            &scratch.0,
            &[(victim, "node1"), (client, "node1"), (server, "node1")],
        ),
    )?;
    bed::capture(&[victim, client, server], CaptureMode::Tproxy)?;
    // The attacker's extra source addresses, in its own netns only.
    let mut sources = vec![attacker.ip(false)];
    let extra: Vec<String> = (1..config.sources)
        .map(|k| {
            let ip = Ipv4Addr::new(10, 244, n1.index, 99 + k as u8);
            sources.push(IpAddr::V4(ip));
            format!("addr add {ip}/24 dev eth0")
        })
        .collect();
    if !extra.is_empty() {
        attacker
            .netns
            .ip_batch(&extra)
            .context("attacker's source addresses")?;
    }
    let _ = attacker
        .netns
        .sysctl("net.ipv4.ip_local_port_range", "1024 65000");
    let target = SocketAddr::new(victim.ip(false), 15008);
    let base = Path {
        client: client.netns.clone(),
        server: server.netns.clone(),
        listen: SocketAddr::new(server.ip(false), 21_000),
        connect: SocketAddr::new(server.ip(false), 21_000),
    };
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let limits = ringway_config::HboneSettings::default();
    let mut report = FloodReport {
        config: config.clone(),
        proxy_bin: proxy_bin.display().to_string(),
        limits: BTreeMap::from([
            (
                "handshakeTimeout".into(),
                format!("{:?}", limits.handshake_timeout),
            ),
            (
                "maxPreauthPerSource".into(),
                limits.max_preauth_per_source.to_string(),
            ),
            (
                "maxPreauthPerPod".into(),
                limits.max_preauth_per_pod.to_string(),
            ),
        ]),
        rounds: Vec::new(),
        summary: None,
        errors: Vec::new(),
        machine: crate::host::machine(),
    };
    let mut port = 21_000u16;
    for round in 0..config.rounds {
        progress(format!(
            "round {}/{}: {} connections from {} sources to {target}",
            round + 1,
            config.rounds,
            config.conns,
            sources.len()
        ));
        let t = Instant::now();
        match run_round(
            &config, proxy_bin, flood_bin, &yaml, attacker, victim, client, server, &base,
            &mut port, target, &sources, cpus,
        ) {
            Ok(r) => {
                progress(format!(
                    "  ({:.1} s) quiet p50/p99 {:.0}/{:.0} µs {:.2} Gbit/s; flood p50/p99 {:.0}/{:.0} µs {:.2} Gbit/s; \
                     RSS {:.1}/{:.1}/{:.1} MiB, fds {}/{}/{}; refused {:?}",
                    t.elapsed().as_secs_f64(),
                    r.quiet.p50_us,
                    r.quiet.p99_us,
                    r.quiet.tput_gbps,
                    r.flood.p50_us,
                    r.flood.p99_us,
                    r.flood.tput_gbps,
                    r.before.rss_mib,
                    r.during.rss_mib,
                    r.after.rss_mib,
                    r.before.fds,
                    r.during.fds,
                    r.after.fds,
                    r.refused
                ));
                report.rounds.push(r);
            }
            Err(e) => {
                progress(format!("  failed: {e:#}"));
                report.errors.push(format!("round {}: {e:#}", round + 1));
            }
        }
    }
    report.summary = summarize(&report.rounds);
    Ok(report)
}

/// Median of the rounds' values of `f`.
fn med(rounds: &[FloodRound], f: impl Fn(&FloodRound) -> f64) -> f64 {
    crate::stat::median(&rounds.iter().map(f).collect::<Vec<_>>())
}

fn summarize(rounds: &[FloodRound]) -> Option<FloodSummary> {
    if rounds.is_empty() {
        return None;
    }
    let neighbour = |g: fn(&FloodRound) -> &Neighbour| Neighbour {
        p50_us: med(rounds, |r| g(r).p50_us),
        p90_us: med(rounds, |r| g(r).p90_us),
        p99_us: med(rounds, |r| g(r).p99_us),
        max_us: med(rounds, |r| g(r).max_us),
        achieved_rps: med(rounds, |r| g(r).achieved_rps),
        tput_gbps: med(rounds, |r| g(r).tput_gbps),
        proxy_cores: med(rounds, |r| g(r).proxy_cores),
        worker_wait_ms_per_s: med(rounds, |r| g(r).worker_wait_ms_per_s),
        handshake_cores: med(rounds, |r| g(r).handshake_cores),
        gen_lateness_p99_us: med(rounds, |r| g(r).gen_lateness_p99_us),
    };
    let quiet = neighbour(|r| &r.quiet);
    let flood = neighbour(|r| &r.flood);
    let p99_ratio = flood.p99_us / quiet.p99_us;
    let reasons: std::collections::BTreeSet<&String> =
        rounds.iter().flat_map(|r| r.refused.keys()).collect();
    Some(FloodSummary {
        p99_ratio,
        tput_ratio: flood.tput_gbps / quiet.tput_gbps,
        p99_within_2x: p99_ratio <= 2.0,
        rss_mib: [
            med(rounds, |r| r.before.rss_mib),
            med(rounds, |r| r.during.rss_mib),
            med(rounds, |r| r.after.rss_mib),
        ],
        fds: [
            med(rounds, |r| r.before.fds as f64),
            med(rounds, |r| r.during.fds as f64),
            med(rounds, |r| r.after.fds as f64),
        ],
        refused: reasons
            .into_iter()
            .map(|k| {
                (
                    k.clone(),
                    med(rounds, |r| r.refused.get(k).copied().unwrap_or(0.0)),
                )
            })
            .collect(),
        quiet,
        flood,
    })
}

fn next_port(port: &mut u16) -> u16 {
    *port = if *port >= 21_900 { 21_001 } else { *port + 1 };
    *port
}

/// Thread-name prefixes as `/proc/<pid>/task/<tid>/comm` shows them.
const WORKER_COMM: &str = ringway_proxy::worker::THREAD_PREFIX;
const HANDSHAKE_COMM: &str = ringway_proxy::handshake::THREAD_NAME;

fn neighbour(
    config: &FloodConfig,
    base: &Path,
    port: &mut u16,
    proxy: &ProxyChild,
    sample: &mut dyn FnMut(),
) -> anyhow::Result<Neighbour> {
    let dur = Duration::from_secs_f64(config.secs);
    let (c0, t0) = (proxy.cpu_seconds(), Instant::now());
    let w0 = proxy.thread_wait_seconds(WORKER_COMM);
    let h0 = proxy.thread_cpu_seconds(HANDSHAKE_COMM);
    let l = load::latency(
        &base.on_port(next_port(port)),
        config.rps,
        config.lat_conns,
        dur,
    )
    .context("neighbour latency")?;
    let lat_wall = t0.elapsed().as_secs_f64();
    let worker_wait_ms_per_s = (proxy.thread_wait_seconds(WORKER_COMM) - w0) * 1e3 / lat_wall;
    let handshake_cores = (proxy.thread_cpu_seconds(HANDSHAKE_COMM) - h0) / lat_wall;
    sample();
    let t =
        load::throughput(&base.on_port(next_port(port)), 1, dur).context("neighbour throughput")?;
    sample();
    let wall = t0.elapsed().as_secs_f64();
    let proxy_cores = (proxy.cpu_seconds() - c0) / wall;
    let q = |p: f64| l.hist.value_at_quantile(p) as f64 / 1e3;
    Ok(Neighbour {
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        max_us: l.hist.max() as f64 / 1e3,
        achieved_rps: l.requests as f64 / l.secs,
        tput_gbps: t.gbps(),
        proxy_cores,
        worker_wait_ms_per_s,
        handshake_cores,
        gen_lateness_p99_us: l.lateness.value_at_quantile(0.99) as f64 / 1e3,
    })
}

/// A running flood generator process, ended by its pid.
struct Generator {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Generator {
    fn next_line(&self, timeout: Duration) -> anyhow::Result<FloodCounts> {
        let line = self.lines.recv_timeout(timeout).with_context(|| {
            format!("flood generator {} silent for {timeout:?}", self.child.id())
        })?;
        parse_counts(&line)
    }

    fn stop(&mut self) -> anyhow::Result<FloodCounts> {
        if let Some(mut i) = self.child.stdin.take() {
            let _ = i.write_all(b"stop\n");
        }
        let r = self.next_line(Duration::from_secs(20));
        self.kill();
        r
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        self.kill();
    }
}

fn parse_counts(line: &str) -> anyhow::Result<FloodCounts> {
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("flood generator said {line:?}"))?;
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    Ok(FloodCounts {
        attempted: n("attempted"),
        opened: n("opened"),
        failed: n("failed"),
        reopened: n("reopened"),
        closed_by_proxy: n("closed_by_proxy"),
        held_at_end: n("held"),
        burst_secs: v.get("burst_secs").and_then(|x| x.as_f64()).unwrap_or(0.0),
        pinned: v.get("pinned").and_then(|x| x.as_bool()).unwrap_or(false),
        cpu_s: 0.0,
        first_error: v
            .get("first_error")
            .and_then(|x| x.as_str())
            .map(String::from),
    })
}

fn add_counts(a: &mut FloodCounts, b: FloodCounts) {
    a.attempted += b.attempted;
    a.opened += b.opened;
    a.failed += b.failed;
    a.reopened += b.reopened;
    a.closed_by_proxy += b.closed_by_proxy;
    a.held_at_end += b.held_at_end;
    a.burst_secs = a.burst_secs.max(b.burst_secs);
    a.pinned |= b.pinned;
    a.cpu_s += b.cpu_s;
    if a.first_error.is_none() {
        a.first_error = b.first_error;
    }
}

fn refused(metrics: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let body = bed::http_get(metrics, "/metrics").context("scraping the proxy's /metrics")?;
    let mut m = BTreeMap::new();
    let text = String::from_utf8_lossy(&body);
    for (labels, value) in crate::prom::samples(&text, "ringway_hbone_refused_total") {
        let reason = crate::prom::label(labels, "reason").unwrap_or(labels);
        *m.entry(reason.to_string()).or_insert(0.0) += value;
    }
    Ok(m)
}

#[allow(clippy::too_many_arguments)]
fn run_round(
    config: &FloodConfig,
    proxy_bin: &FsPath,
    flood_bin: &FsPath,
    yaml: &FsPath,
    attacker: &ringway_testbed::Pod,
    victim: &ringway_testbed::Pod,
    client: &ringway_testbed::Pod,
    server: &ringway_testbed::Pod,
    base: &Path,
    port: &mut u16,
    target: SocketAddr,
    sources: &[IpAddr],
    cpus: usize,
) -> anyhow::Result<FloodRound> {
    let pod_arg = |p: &ringway_testbed::Pod| (p.name.clone(), p.netns.path().to_path_buf());
    let mut args = ProxyArgs::pods(&[pod_arg(victim), pod_arg(client), pod_arg(server)]);
    args.config = Some(yaml.to_path_buf());
    let env = vec![
        ("RINGWAY_CAPTURE_MODE", "tproxy".to_string()),
        ("RINGWAY_DRAIN_PERIOD", "200ms".to_string()),
    ];
    let mut proxy = ProxyChild::start_ringway(proxy_bin, &env, &args, Duration::from_secs(20))?;
    let metrics = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 15020);
    let res = |p: &ProxyChild| Resources {
        rss_mib: p.rss_kib() / 1024.0,
        fds: p.fds(),
    };
    // Warm the certificates and every worker's tunnel to the neighbour:
    // one connection warmed one worker's pool only, and the quiet run's
    // connections that landed on the other worker paid a tunnel's TLS
    // handshake inside the measurement (a few ms at the handshake thread's
    // low priority, carried over to the next sends: quiet p99s of 1-10 ms).
    // 16 connections leave a worker without one with odds 2^-15 on 2 CPUs.
    load::latency(
        &base.on_port(next_port(port)),
        800.0,
        16,
        Duration::from_millis(500),
    )
    .context("warm-up")?;
    let quiet = neighbour(config, base, port, &proxy, &mut || {})?;
    let before = res(&proxy);
    // The flood: processes in the attacker's netns, pinned to the last CPU.
    let secs_bound = 60.0 + 10.0 * config.secs + config.conns as f64 / 200.0;
    let per = config.conns.div_ceil(config.procs as u64);
    let list = sources
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut gens = Vec::new();
    for i in 0..config.procs {
        let count = per.min(config.conns.saturating_sub(per * i as u64));
        let mut cmd = Command::new(flood_bin);
        cmd.arg(target.to_string())
            .arg(count.to_string())
            .arg(&list)
            .arg((cpus - 1).to_string())
            .arg(format!("{secs_bound}"))
            .arg(config.reopen.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = attacker
            .netns
            .run(|| cmd.spawn())
            .with_context(|| format!("spawning {}", flood_bin.display()))?;
        let out = child.stdout.take().context("flood stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        gens.push(Generator { child, lines: rx });
    }
    let mut during = res(&proxy);
    let sample = |p: &ProxyChild, d: &mut Resources| {
        let r = res(p);
        d.rss_mib = d.rss_mib.max(r.rss_mib);
        d.fds = d.fds.max(r.fds);
    };
    let burst_timeout = Duration::from_secs_f64(30.0 + config.conns as f64 / 500.0);
    for g in &gens {
        g.next_line(burst_timeout).context("the flood's burst")?;
        sample(&proxy, &mut during);
    }
    let flood = neighbour(config, base, port, &proxy, &mut || {
        sample(&proxy, &mut during)
    })?;
    sample(&proxy, &mut during);
    let mut counts = FloodCounts {
        cpu_s: gens
            .iter()
            .map(|g| crate::child::proc_cpu_seconds(g.child.id()))
            .sum(),
        ..FloodCounts::default()
    };
    for g in &mut gens {
        add_counts(&mut counts, g.stop().context("stopping the flood")?);
    }
    drop(gens);
    // Let the proxy close what it still holds: its fds back near the quiet
    // level (bounded).
    let t0 = Instant::now();
    while proxy.fds() > before.fds + 16 && t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = res(&proxy);
    let refused = refused(metrics)?;
    if !proxy.alive() {
        bail!("the proxy exited during the flood: {}", proxy.log_tail());
    }
    proxy.stop();
    Ok(FloodRound {
        quiet,
        flood,
        before,
        during,
        after,
        counts,
        refused,
    })
}

/// The report as Markdown: the neighbour quiet vs flooded (medians), the
/// proxy's resources, what was refused, and every round.
pub fn render(r: &FloodReport) -> String {
    let mut s = format!(
        "# hbone_preauth_flood ({})\n\n{} rounds; per round {} connections to one pod's 15008 \
         (half idle TCP, half a ClientHello then silence) from {} source addresses of one pod, \
         in {} generator process(es) pinned to the last CPU, every one the proxy closes opened \
         again (at most {} times the count); the neighbour pair's HBONE latency ({} req/s over {} \
         connections, 64 B, open loop) and one stream's throughput, {} s each, quiet then \
         flooded. Proxy: `{}`. Pre-auth limits: {}.\n\n",
        r.config.label,
        r.config.rounds,
        r.config.conns,
        r.config.sources,
        r.config.procs,
        r.config.reopen,
        r.config.rps,
        r.config.lat_conns,
        r.config.secs,
        r.proxy_bin,
        r.limits
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(m) = &r.summary {
        s.push_str(
            "| neighbour (medians) | p50 µs | p90 µs | p99 µs | max µs | req/s | Gbit/s | proxy cores | \
             workers' run-queue wait ms/s | handshake thread cores | generator send lateness p99 µs |\n",
        );
        s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for (k, n) in [("quiet", &m.quiet), ("flood", &m.flood)] {
            s.push_str(&format!(
                "| {k} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.0} |\n",
                n.p50_us,
                n.p90_us,
                n.p99_us,
                n.max_us,
                n.achieved_rps,
                n.tput_gbps,
                n.proxy_cores,
                n.worker_wait_ms_per_s,
                n.handshake_cores,
                n.gen_lateness_p99_us
            ));
        }
        s.push_str(&format!(
            "\np99 flood / quiet: **{:.2}x** ({} the issue's 2x); throughput flood / quiet: {:.2}x.\n\n",
            m.p99_ratio,
            if m.p99_within_2x { "within" } else { "over" },
            m.tput_ratio
        ));
        s.push_str(&format!(
            "Proxy RSS before / during (max) / after: {:.1} / {:.1} / {:.1} MiB; \
             fds {:.0} / {:.0} / {:.0}.\n\nRefused (`ringway_hbone_refused_total`, medians): {}.\n\n",
            m.rss_mib[0],
            m.rss_mib[1],
            m.rss_mib[2],
            m.fds[0],
            m.fds[1],
            m.fds[2],
            if m.refused.is_empty() {
                "none".to_string()
            } else {
                m.refused
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    }
    s.push_str(
        "| round | quiet p50/p99 µs | flood p50/p99 µs | quiet / flood Gbit/s | RSS MiB b/d/a | fds b/d/a | \
         opened / failed / reopened / closed by proxy / held | generator CPU-s |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (i, x) in r.rounds.iter().enumerate() {
        s.push_str(&format!(
            "| {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} / {:.2} | {:.1} / {:.1} / {:.1} | {} / {} / {} | {} / {} / {} / {} / {} | {:.1} |\n",
            i + 1,
            x.quiet.p50_us,
            x.quiet.p99_us,
            x.flood.p50_us,
            x.flood.p99_us,
            x.quiet.tput_gbps,
            x.flood.tput_gbps,
            x.before.rss_mib,
            x.during.rss_mib,
            x.after.rss_mib,
            x.before.fds,
            x.during.fds,
            x.after.fds,
            x.counts.opened,
            x.counts.failed,
            x.counts.reopened,
            x.counts.closed_by_proxy,
            x.counts.held_at_end,
            x.counts.cpu_s,
        ));
    }
    for e in &r.errors {
        s.push_str(&format!("\nFailed: {e}\n"));
    }
    s
}

/// Problems that make the report incomplete (never the numbers): a failed
/// round, a missing summary, a figure not finite.
pub fn check(r: &FloodReport) -> Vec<String> {
    let mut p: Vec<String> = r.errors.iter().map(|e| format!("failed: {e}")).collect();
    if r.rounds.len() != r.config.rounds {
        p.push(format!(
            "{} of {} rounds measured",
            r.rounds.len(),
            r.config.rounds
        ));
    }
    match &r.summary {
        None => p.push("no summary".into()),
        Some(m) => {
            let figs = [
                m.quiet.p50_us,
                m.quiet.p99_us,
                m.flood.p50_us,
                m.flood.p99_us,
                m.quiet.tput_gbps,
                m.flood.tput_gbps,
                m.p99_ratio,
                m.tput_ratio,
                m.quiet.worker_wait_ms_per_s,
                m.flood.worker_wait_ms_per_s,
                m.quiet.handshake_cores,
                m.flood.handshake_cores,
                m.flood.gen_lateness_p99_us,
            ];
            if figs.iter().any(|v| !v.is_finite()) {
                p.push(format!("a figure is not finite: {figs:?}"));
            }
            if (m.flood.p99_us / m.quiet.p99_us - m.p99_ratio).abs() > 1e-9 {
                p.push("p99 ratio does not follow from the medians".into());
            }
        }
    }
    p
}

/// Writes `flood.json` and `flood.md` to `out`; returns the Markdown.
pub fn write(out: &FsPath, r: &FloodReport) -> anyhow::Result<String> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("flood.json"), serde_json::to_string_pretty(r)?)?;
    let md = render(r);
    std::fs::write(out.join("flood.md"), &md)?;
    Ok(md)
}
