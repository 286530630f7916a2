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
//!
//! [`config`] (how big a run is) at the bottom, [`report`] (the document,
//! its Markdown and check) above it, the measurement here on top.

pub mod config;
pub mod report;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path as FsPath;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_config::CaptureMode;
use ringway_testbed::VirtualNode;

pub use self::config::FloodConfig;
use self::report::summarize;
pub use self::report::{
    check, render, write, DeadlineSpread, FloodCounts, FloodReport, FloodRound, FloodSummary,
    Neighbour, Resources,
};
use crate::bed;
use crate::child::{ProxyArgs, ProxyChild};
use crate::load::{self, Path};

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
    let page = bed::scrape(metrics).context("the proxy's metrics")?;
    let mut m = BTreeMap::new();
    for s in page.matching("ringway_hbone_refused_total", &[]) {
        let reason = s.label("reason").unwrap_or("?");
        *m.entry(reason.to_string()).or_insert(0.0) += s.value;
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
    let metrics = bed::PROXY_METRICS;
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
    let deadlines = deadline_spread(attacker, target, config.deadline_conns)?;
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
        deadlines,
    })
}

/// `conns` connections opened together from `attacker` to `target` (a
/// pod's 15008) that never start TLS: how long each lived, from before its
/// connect to the proxy's close, and how spread those lives were. The
/// proxy's default `handshakeTimeout` bounds each (plus 10 s of slack).
fn deadline_spread(
    attacker: &ringway_testbed::Pod,
    target: SocketAddr,
    conns: usize,
) -> anyhow::Result<DeadlineSpread> {
    use std::io::Read;
    let timeout = ringway_config::HboneSettings::default().handshake_timeout;
    let opened: Vec<(Instant, std::net::TcpStream)> = attacker.netns.run(|| {
        (0..conns)
            .map(|_| {
                let t = Instant::now();
                std::net::TcpStream::connect_timeout(&target, Duration::from_secs(10))
                    .map(|s| (t, s))
            })
            .collect::<std::io::Result<_>>()
    })?;
    let lives: Vec<Option<Duration>> = std::thread::scope(|s| {
        let waits: Vec<_> = opened
            .into_iter()
            .map(|(t, mut c)| {
                s.spawn(move || {
                    let _ = c.set_read_timeout(Some(timeout + Duration::from_secs(10)));
                    let mut buf = [0u8; 256];
                    loop {
                        match c.read(&mut buf) {
                            Ok(0) => return Some(t.elapsed()),
                            Ok(_) => continue,
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) =>
                            {
                                return None
                            }
                            Err(_) => return Some(t.elapsed()),
                        }
                    }
                })
            })
            .collect();
        waits
            .into_iter()
            .map(|w| w.join().unwrap_or(None))
            .collect()
    });
    let closed: Vec<f64> = lives.iter().flatten().map(|d| d.as_secs_f64()).collect();
    let shortest = closed.iter().copied().fold(f64::NAN, f64::min);
    let longest = closed.iter().copied().fold(f64::NAN, f64::max);
    progress(format!(
        "  {conns} silent connections closed after {shortest:.2} to {longest:.2} s \
         (handshakeTimeout {timeout:?})"
    ));
    Ok(DeadlineSpread {
        conns,
        timeout_s: timeout.as_secs_f64(),
        shortest_s: shortest,
        longest_s: longest,
        spread_s: longest - shortest,
        not_closed: lives.len() - closed.len(),
    })
}
