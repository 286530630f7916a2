//! Latency through a rolling proxy upgrade: new connections (connect, 1 B
//! request, 1 B reply, close) at a fixed open-loop rate through one
//! scenario's path, first quiet, then while the proxy of the client's node
//! is replaced the way the restart drill does it (a new `ringway proxy`
//! beside the old one, the same pods, the same ports with SO_REUSEPORT;
//! once it serves, SIGTERM to the old one, which closes its listeners and
//! drains). Both proxies get the same state directory (`RINGWAY_STATE_DIR`,
//! ignored by a build without it), so the new one can warm what the old one
//! used.
//!
//! Each connection's latency runs from its scheduled start (not from when a
//! client thread got to it), so a stall is counted in full for every
//! connection it delays. The quiet window is the seconds before the new
//! proxy starts; the upgrade window runs from its start to the end of the
//! load (the old one's drain included). `cargo bench -p ringway-benches --
//! --upgrade [--quick]` prints the table; beside the suite, on the bed.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ringway_testbed::traffic::EchoServer;
use ringway_testbed::Pod;

use crate::bed::{self, next_port, Bed, PORT_BASE};
use crate::child::{ProxyArgs, ProxyChild};
use crate::host::progress;
use crate::netstat::{trouble_counters, trouble_deltas};
use crate::scenario::{by_key, Kind, Scenario};
use crate::stat::{fmt, nearest_rank};

/// How big an upgrade run is.
#[derive(Debug, Clone)]
pub struct UpgradeConfig {
    /// New connections per second (open loop).
    pub rate: f64,
    /// Seconds of load before the new proxy starts.
    pub quiet: Duration,
    /// Seconds of load after the old proxy got SIGTERM.
    pub after: Duration,
    /// Client threads sharing the schedule.
    pub threads: usize,
    /// Scenario keys to run (one-node and two-node, HBONE and plaintext).
    pub scenarios: Vec<&'static str>,
    /// Upgrades per scenario (alternating, one fresh pair of proxies each).
    pub rounds: usize,
}

impl UpgradeConfig {
    /// The full measurement (about 40 s).
    pub fn full() -> UpgradeConfig {
        UpgradeConfig {
            rate: 1000.0,
            quiet: Duration::from_secs(3),
            after: Duration::from_secs(2),
            threads: 32,
            scenarios: vec!["hbone_1node", "tproxy_fast", "hbone_2node", "tproxy_2node"],
            rounds: 2,
        }
    }

    /// The quick one (about 12 s).
    pub fn quick() -> UpgradeConfig {
        UpgradeConfig {
            quiet: Duration::from_secs(2),
            after: Duration::from_millis(1500),
            scenarios: vec!["hbone_1node", "tproxy_fast"],
            rounds: 1,
            ..UpgradeConfig::full()
        }
    }

    /// The test's (checks the pipeline, not the numbers).
    pub fn tiny() -> UpgradeConfig {
        UpgradeConfig {
            rate: 200.0,
            quiet: Duration::from_millis(1000),
            after: Duration::from_millis(500),
            threads: 4,
            scenarios: vec!["hbone_1node"],
            rounds: 1,
        }
    }

    /// `RINGWAY_BENCH_UPGRADE_RATE`, `RINGWAY_BENCH_UPGRADE_ROUNDS` and
    /// `RINGWAY_BENCH_UPGRADE_SCENARIOS` (comma-separated keys) override.
    pub fn with_env_overrides(mut self) -> UpgradeConfig {
        if let Some(v) = env_parse("RINGWAY_BENCH_UPGRADE_RATE") {
            self.rate = v;
        }
        if let Some(v) = env_parse("RINGWAY_BENCH_UPGRADE_ROUNDS") {
            self.rounds = v;
        }
        if let Ok(v) = std::env::var("RINGWAY_BENCH_UPGRADE_SCENARIOS") {
            self.scenarios = v
                .split(',')
                .filter_map(|k| by_key(k.trim()).map(|s| s.key))
                .collect();
        }
        self
    }
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// One window's connections.
#[derive(Debug, Clone, Default)]
pub struct Window {
    /// Latencies of the connections that completed, ms.
    pub ms: Vec<f64>,
    /// Connections that failed (connect, write, read or a wrong reply).
    pub failed: u64,
    /// The first failure's reason.
    pub first_error: Option<String>,
}

impl Window {
    /// (p50, p99, max) in ms; NaN when empty.
    pub fn percentiles(&self) -> (f64, f64, f64) {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return (f64::NAN, f64::NAN, f64::NAN);
        }
        (
            nearest_rank(&v, 0.50),
            nearest_rank(&v, 0.99),
            v[v.len() - 1],
        )
    }
}

/// One upgrade through one scenario.
#[derive(Debug, Clone)]
pub struct UpgradeRun {
    /// The scenario's key.
    pub scenario: &'static str,
    /// Before the new proxy started.
    pub quiet: Window,
    /// From the new proxy's start to the end of the load.
    pub upgrade: Window,
    /// Spawn to serving of the new proxy, ms.
    pub new_startup_ms: f64,
    /// Outbound tunnels the new proxy held once serving (warmed ones).
    pub tunnels_at_ready: f64,
    /// Client TLS handshakes (tunnel dials) of the new proxy to the end of
    /// the load, less its warm-up's (its log line's `dialled=`): tunnels
    /// it opened cold for connections.
    pub cold_dials: f64,
    /// Connections per second actually scheduled.
    pub rate: f64,
}

/// Runs every scenario of `config` `rounds` times with the `ringway`
/// program `bin`; must be called inside `ringway_testbed::run_isolated`.
pub fn run(config: &UpgradeConfig, bin: &FsPath) -> anyhow::Result<Vec<UpgradeRun>> {
    let bed = Bed::build()?;
    let mut port = PORT_BASE + 500;
    let mut runs = Vec::new();
    for round in 0..config.rounds {
        for key in &config.scenarios {
            let sc = by_key(key).with_context(|| format!("no scenario {key}"))?;
            progress(format!(
                "upgrade {}/{}: {} at {}/s",
                round + 1,
                config.rounds,
                sc.key,
                config.rate
            ));
            let r = one(config, bin, &bed, &sc, next_port(&mut port))
                .with_context(|| format!("upgrade through {}", sc.key))?;
            progress(format!("  {}", line(&r)));
            runs.push(r);
        }
    }
    Ok(runs)
}

/// The report: one row per window of each run.
pub fn render(runs: &[UpgradeRun]) -> String {
    let mut s = String::from(
        "| scenario | window | conns | failed | p50 ms | p99 ms | max ms | new proxy serving after ms | its tunnels at ready | its cold dials |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        for (name, w) in [("quiet", &r.quiet), ("upgrade", &r.upgrade)] {
            let (p50, p99, max) = w.percentiles();
            let new_proxy = if name == "upgrade" {
                format!(
                    "{} | {} | {}",
                    fmt(r.new_startup_ms, 0),
                    fmt(r.tunnels_at_ready, 0),
                    fmt(r.cold_dials, 0)
                )
            } else {
                " | | ".to_string()
            };
            s.push_str(&format!(
                "| {} | {name} | {} | {} | {} | {} | {} | {new_proxy} |\n",
                r.scenario,
                w.ms.len() as u64 + w.failed,
                w.failed,
                fmt(p50, 2),
                fmt(p99, 2),
                fmt(max, 2),
            ));
        }
    }
    for r in runs {
        for w in [&r.quiet, &r.upgrade] {
            if let Some(e) = &w.first_error {
                s.push_str(&format!("\n{}: first failure: {e}\n", r.scenario));
            }
        }
    }
    s
}

fn line(r: &UpgradeRun) -> String {
    let (q50, q99, qmax) = r.quiet.percentiles();
    let (u50, u99, umax) = r.upgrade.percentiles();
    format!(
        "{:.0}/s; quiet p50/p99/max {}/{}/{} ms, {} failed; upgrade {}/{}/{} ms, {} failed; new proxy serving after {} ms with {} tunnels, {} cold dials",
        r.rate,
        fmt(q50, 2),
        fmt(q99, 2),
        fmt(qmax, 1),
        r.quiet.failed,
        fmt(u50, 2),
        fmt(u99, 2),
        fmt(umax, 1),
        r.upgrade.failed,
        fmt(r.new_startup_ms, 0),
        fmt(r.tunnels_at_ready, 0),
        fmt(r.cold_dials, 0)
    )
}

/// The proxies of `sc` on `bed`: (the pods of each proxy, its control host);
/// the first one is the client node's, the one upgraded.
fn groups<'a>(sc: &Scenario, client: &'a Pod, server: &'a Pod) -> Vec<Vec<&'a Pod>> {
    if sc.two_nodes {
        vec![vec![client], vec![server]]
    } else {
        vec![vec![client, server]]
    }
}

fn start_proxy(
    bin: &FsPath,
    env: &[(&str, String)],
    pods: &[&Pod],
    config: Option<PathBuf>,
    host: Ipv4Addr,
) -> anyhow::Result<ProxyChild> {
    let mut args = ProxyArgs::pods(&pods.iter().map(|p| bed::pod_arg(p)).collect::<Vec<_>>());
    args.config = config;
    args.control_host = host;
    ProxyChild::start_ringway(bin, env, &args, Duration::from_secs(20))
}

/// One connection's outcome: when it was due (since the load started) and
/// its latency from then, or why it failed.
type Outcome = (Duration, Result<Duration, String>);

fn one(
    config: &UpgradeConfig,
    bin: &FsPath,
    bed: &Bed,
    sc: &Scenario,
    port: u16,
) -> anyhow::Result<UpgradeRun> {
    let Kind::Ringway {
        mode,
        fast_path,
        hbone,
    } = sc.kind
    else {
        anyhow::bail!("{}: not a ringway scenario", sc.key);
    };
    let (client, server) = bed.pods(sc);
    bed::capture(&[client, server], mode)?;
    for p in [client, server] {
        // Queued connections of the old proxy's closed listeners move to
        // the new one's (as the drill and the deployment set it).
        p.netns.sysctl("net.ipv4.tcp_migrate_req", "1")?;
    }
    let config_file = hbone.then(|| bed.hbone_config_path().to_path_buf());
    let groups = groups(sc, client, server);
    // Each node's proxy its own state directory (as on a real node); the
    // new proxy shares the upgraded one's.
    let mut envs = Vec::new();
    let mut proxies = Vec::new();
    for (i, pods) in groups.iter().enumerate() {
        let state = bed
            .scratch
            .0
            .join(format!("state-{}-{port}-node{i}", sc.key));
        std::fs::create_dir_all(&state)?;
        let mut env = bed::ringway_env(mode, (!hbone).then_some(fast_path));
        env.push(("RINGWAY_STATE_DIR", state.display().to_string()));
        proxies.push(start_proxy(
            bin,
            &env,
            pods,
            config_file.clone(),
            Ipv4Addr::new(127, 0, 0, 1 + i as u8),
        )?);
        envs.push(env);
    }
    let env = &envs[0];
    let addr = SocketAddr::new(server.ip(false), port);
    let l = server
        .netns
        .run(|| ringway_testbed::traffic::listen(addr))
        .context("server listener")?;
    let echo = EchoServer::start(l);
    // Counters that tell where a stalled or lost connection went (SYN
    // retransmissions, listen queue drops, PAWS, conntrack drops), in the
    // two pods and the two nodes, read around the whole load.
    let watched: Vec<(&str, &ringway_testbed::ns::Netns)> = {
        let [n1, n2] = bed.nodes_netns();
        vec![
            ("client pod", &client.netns),
            ("server pod", &server.netns),
            ("node 1", n1),
            ("node 2", n2),
        ]
    };
    let before: Vec<_> = watched.iter().map(|(_, ns)| trouble_counters(ns)).collect();

    // The load: thread k takes connections k, k + threads, ...
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now() + Duration::from_millis(50);
    let period = Duration::from_secs_f64(1.0 / config.rate);
    let mut loaders = Vec::new();
    for k in 0..config.threads {
        let (stop, threads) = (stop.clone(), config.threads);
        loaders.push(client.netns.spawn(move || {
            let mut out: Vec<Outcome> = Vec::new();
            let mut i = k as u32;
            while !stop.load(Ordering::Relaxed) {
                let due = t0 + period * i;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let r = exchange(addr).map(|()| due.elapsed());
                out.push((due - t0, r));
                i += threads as u32;
            }
            out
        }));
    }
    std::thread::sleep(config.quiet);
    let upgrade_from = t0.elapsed();
    // The new proxy of the client's node beside the old one.
    let new = start_proxy(
        bin,
        env,
        &groups[0],
        config_file.clone(),
        Ipv4Addr::new(127, 0, 0, 11),
    );
    let mut new = match new {
        Ok(p) => p,
        Err(e) => {
            stop.store(true, Ordering::Relaxed);
            for l in loaders {
                let _ = l.join();
            }
            return Err(e.context("starting the new proxy"));
        }
    };
    let new_startup_ms = new.startup.as_secs_f64() * 1e3;
    let new_metrics = SocketAddr::new(Ipv4Addr::new(127, 0, 0, 11).into(), 15020);
    let at_ready = tunnel_counts(new_metrics);
    let old_pid = nix::unistd::Pid::from_raw(proxies[0].pid as i32);
    let _ = nix::sys::signal::kill(old_pid, nix::sys::signal::Signal::SIGTERM);
    std::thread::sleep(config.after);
    stop.store(true, Ordering::Relaxed);
    let mut outcomes = Vec::new();
    for l in loaders {
        outcomes.extend(
            l.join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))?,
        );
    }
    let end = t0.elapsed();
    let after: Vec<_> = watched.iter().map(|(_, ns)| trouble_counters(ns)).collect();
    let trouble: Vec<String> = watched
        .iter()
        .zip(before.iter().zip(&after))
        .filter_map(|((name, _), (b, a))| {
            let d = trouble_deltas(b, a);
            (!d.is_empty()).then(|| format!("{name}: {d}"))
        })
        .collect();
    if !trouble.is_empty() {
        progress(format!("  counters: {}", trouble.join("; ")));
    }
    // Each netns's conntrack table (a full one drops new SYNs: "table
    // full, dropping packet" in the kernel log, `ct.drop` above).
    progress(format!(
        "  conntrack entries: {}",
        watched
            .iter()
            .zip(&after)
            .map(|((name, _), a)| format!(
                "{name} {}",
                a.get("ct.entries")
                    .map_or("-".to_string(), |n| n.to_string())
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let at_end = tunnel_counts(new_metrics);
    let (mut quiet, mut upgrade) = (Window::default(), Window::default());
    for (due, r) in outcomes {
        // The first half second warms the load generator itself.
        let w = if due < Duration::from_millis(500) {
            continue;
        } else if due < upgrade_from {
            &mut quiet
        } else {
            &mut upgrade
        };
        match r {
            Ok(d) => w.ms.push(d.as_secs_f64() * 1e3),
            Err(e) => {
                w.failed += 1;
                w.first_error.get_or_insert(e);
            }
        }
    }
    let n = (quiet.ms.len() + upgrade.ms.len()) as u64 + quiet.failed + upgrade.failed;
    let alive = new.alive();
    let tail = new.log_tail();
    // What the new proxy's warm-up did and how long it took (its log line).
    let warm_line = tail.lines().find(|l| l.contains("warm-up done"));
    if let Some(l) = warm_line {
        progress(format!("  new proxy: {}", l.trim()));
    }
    let warm_dials: f64 = warm_line
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("dialled="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    // How the old proxy's drain went (how many were open at SIGTERM, how
    // many it reset at the end, how long it drained), and any error it
    // logged, to tell a connection lost in the drain from one lost
    // elsewhere. (Its start-up warnings are the same every round: left out.)
    let old_tail = proxies[0].log_tail();
    for l in old_tail.lines().filter(|l| {
        l.contains("ringway::proxy_main: draining")
            || l.contains("ringway::proxy_main: stopped")
            || l.contains("ERROR")
    }) {
        progress(format!("  old proxy: {}", l.trim()));
    }
    // A round that lost connections: every proxy's warnings, errors and
    // failed connections (the latter with `RINGWAY_BENCH_PROXY_LOG=info`).
    if quiet.failed + upgrade.failed > 0 {
        let named = proxies
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("old proxy of node {}", i + 1), p))
            .chain(std::iter::once(("new proxy".to_string(), &new)));
        for (name, p) in named {
            for l in p.notable() {
                progress(format!("  {name}: {}", l.trim()));
            }
        }
    }
    new.stop();
    for mut p in proxies {
        p.stop();
    }
    drop(echo);
    if !alive {
        anyhow::bail!("the new proxy exited: {tail}");
    }
    Ok(UpgradeRun {
        scenario: sc.key,
        quiet,
        upgrade,
        new_startup_ms,
        tunnels_at_ready: at_ready.0,
        // (+ 0.0: an empty sum is -0.)
        cold_dials: at_end.1 - warm_dials + 0.0,
        rate: n as f64 / (end.as_secs_f64() - 0.5).max(1e-3),
    })
}

/// (outbound tunnels held, client TLS handshakes so far) of the proxy whose
/// metrics are at `addr`; NaN when it does not answer.
fn tunnel_counts(addr: SocketAddr) -> (f64, f64) {
    let Ok(m) = ringway_testbed::http::scrape_metrics(addr) else {
        return (f64::NAN, f64::NAN);
    };
    (
        m.get("ringway_hbone_pool_connections", &[]).unwrap_or(0.0),
        m.sum("ringway_tls_handshakes_total", &["side=\"client\""]),
    )
}

/// Connect, 1 B request, 1 B reply (the echo), close.
fn exchange(addr: SocketAddr) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
    let _ = s.set_nodelay(true);
    s.write_all(b"u").map_err(|e| format!("write: {e}"))?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).map_err(|e| format!("read: {e}"))?;
    if &b != b"u" {
        return Err("wrong reply".into());
    }
    Ok(())
}
