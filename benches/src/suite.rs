//! The suite: scenarios x measurements, several rounds alternating the
//! scenarios, then the report (see `report`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use ringway_config::CaptureMode;
use ringway_testbed::ns::Netns;
use ringway_testbed::VirtualNode;

use crate::child::{haproxy_binary, haproxy_config, ProxyChild};
use crate::load::{self, Path};

/// How big a run is.
#[derive(Debug, Clone)]
pub struct Config {
    /// "full", "quick" or "tiny" (the test's).
    pub label: String,
    /// Rounds alternating the scenarios.
    pub rounds: usize,
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
    /// Client threads of the connection-rate run.
    pub conn_threads: usize,
    /// Seconds of the connection-rate run.
    pub conn_secs: f64,
    /// Upper bound on connections in one connection-rate run.
    pub conn_max: u64,
    /// The two idle-connection counts (RSS measured with each).
    pub idle: [usize; 2],
    /// The idle count the RSS target speaks of (10k): measured when `idle[1]`
    /// reaches it, else extrapolated.
    pub idle_target: usize,
    /// Pods enrolled by the churn measurement.
    pub churn_pods: usize,
    /// The proxy binary: `ringway` (run as `ringway proxy --pod ...`) or the
    /// bench wrapper `ringway-bench-proxy`.
    pub proxy_bin: PathBuf,
    /// Include HAProxy when installed.
    pub haproxy: bool,
}

impl Config {
    /// The full run (< 15 min on 2 cores).
    pub fn full(proxy_bin: PathBuf) -> Config {
        Config {
            label: "full".into(),
            rounds: 3,
            secs: 3.0,
            streams: 4,
            rps: 2000.0,
            lat_conns: 4,
            lat_secs: 3.0,
            conn_threads: 4,
            conn_secs: 2.0,
            conn_max: 20_000,
            idle: [1_000, 10_000],
            idle_target: 10_000,
            churn_pods: 1_000,
            proxy_bin,
            haproxy: true,
        }
    }

    /// The CI-sized run (< 2 min): same measurements, smaller.
    pub fn quick(proxy_bin: PathBuf) -> Config {
        Config {
            label: "quick".into(),
            rounds: 2,
            secs: 0.5,
            streams: 2,
            rps: 1000.0,
            lat_conns: 2,
            lat_secs: 0.5,
            conn_threads: 2,
            conn_secs: 0.5,
            conn_max: 5_000,
            idle: [100, 1_000],
            idle_target: 10_000,
            churn_pods: 100,
            proxy_bin,
            haproxy: true,
        }
    }

    /// The test's run (seconds): checks the pipeline, not the numbers.
    pub fn tiny(proxy_bin: PathBuf) -> Config {
        Config {
            label: "tiny (test)".into(),
            rounds: 2,
            secs: 0.2,
            streams: 2,
            rps: 500.0,
            lat_conns: 2,
            lat_secs: 0.2,
            conn_threads: 2,
            conn_secs: 0.2,
            conn_max: 500,
            idle: [20, 50],
            idle_target: 10_000,
            churn_pods: 10,
            proxy_bin,
            haproxy: false,
        }
    }

    /// Applies `RINGWAY_BENCH_*` overrides (rounds, seconds, rate, idle counts, pods).
    pub fn with_env_overrides(mut self) -> Config {
        fn var<T: std::str::FromStr>(n: &str) -> Option<T> {
            std::env::var(n).ok().and_then(|v| v.parse().ok())
        }
        if let Some(v) = var("RINGWAY_BENCH_ROUNDS") {
            self.rounds = v;
        }
        if let Some(v) = var::<f64>("RINGWAY_BENCH_SECS") {
            self.secs = v;
            self.lat_secs = v;
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
        if std::env::var("RINGWAY_BENCH_HAPROXY").as_deref() == Ok("0") {
            self.haproxy = false;
        }
        self
    }
}

/// What carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No proxy: pod a -> pod b over the bridge.
    Direct,
    /// ringway, capture rules in both pods.
    Ringway {
        /// TPROXY or REDIRECT.
        mode: CaptureMode,
        /// `sameNodeFastPath`.
        fast_path: bool,
    },
    /// HAProxy in TCP mode in the node netns: one hop, not transparent.
    Haproxy,
}

/// One scenario of the report.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short key (JSON, file names).
    pub key: &'static str,
    /// Row title.
    pub name: &'static str,
    /// What it is.
    pub kind: Kind,
}

/// The scenarios, in report order.
pub fn scenarios(with_haproxy: bool) -> Vec<Scenario> {
    let mut v = vec![
        Scenario {
            key: "direct",
            name: "direct (no proxy)",
            kind: Kind::Direct,
        },
        Scenario {
            key: "tproxy_fast",
            name: "ringway TPROXY, same-node fast path (default, 1 hop)",
            kind: Kind::Ringway {
                mode: CaptureMode::Tproxy,
                fast_path: true,
            },
        },
        Scenario {
            key: "tproxy_2hop",
            name: "ringway TPROXY, both hops",
            kind: Kind::Ringway {
                mode: CaptureMode::Tproxy,
                fast_path: false,
            },
        },
        Scenario {
            key: "redirect_2hop",
            name: "ringway REDIRECT, both hops",
            kind: Kind::Ringway {
                mode: CaptureMode::Redirect,
                fast_path: false,
            },
        },
    ];
    if with_haproxy {
        v.push(Scenario {
            key: "haproxy",
            name: "HAProxy TCP mode (peer, 1 hop, node netns)",
            kind: Kind::Haproxy,
        });
    }
    v
}

/// Figures of one scenario in one round, by key (see `report::FIGURES`).
pub type Figures = BTreeMap<String, f64>;

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct Results {
    /// The run's configuration.
    pub config: Config,
    /// Scenarios measured, in order.
    pub scenarios: Vec<Scenario>,
    /// `rounds[r][s]`: figures of scenario `s` in round `r`.
    pub rounds: Vec<Vec<Figures>>,
    /// Churn figures per round.
    pub churn: Vec<Figures>,
    /// Measurements that failed (the report lists them; `check` flags the holes).
    pub errors: Vec<String>,
    /// Things the reader should know (e.g. connections that failed).
    pub notes: Vec<String>,
    /// Total wall time of the run, seconds.
    pub wall_secs: f64,
    /// Machine description lines.
    pub machine: Vec<(String, String)>,
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Raises RLIMIT_NOFILE (soft and hard) so 10k idle connections fit on both
/// ends in this process; the proxy child inherits it.
/// Returns the soft limit in force afterwards.
pub fn raise_nofile(want: u64) -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < want
            // Raising the hard limit needs CAP_SYS_RESOURCE; else settle for it.
            && setrlimit(Resource::RLIMIT_NOFILE, want, want.max(hard)).is_err()
        {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    getrlimit(Resource::RLIMIT_NOFILE)
        .map(|(s, _)| s)
        .unwrap_or(1024)
}

/// The most idle connections every scenario can hold under a per-process
/// fd limit of `nofile`: a connection through both ringway hops holds 4 fds
/// in the proxy (2 per hop), and 2 in the load generator (client + server).
pub fn idle_cap(nofile: u64) -> usize {
    (nofile.saturating_sub(1_000) / 4 / 100 * 100) as usize
}

struct Bed {
    direct: Path,
    proxied: Path,
    proxied_pods: Vec<(String, PathBuf)>,
    proxied_netns: Vec<Netns>,
    haproxy: Option<(PathBuf, Netns, IpAddr, IpAddr)>,
}

const PORT_BASE: u16 = 20_000;
const PORT_SPAN: u16 = 999;

/// Runs the suite. Must be called inside `ringway_testbed::run_isolated`.
pub fn run(config: Config) -> anyhow::Result<Results> {
    let t_start = Instant::now();
    let mut config = config;
    let nofile = raise_nofile((4 * config.idle[1] as u64 + 10_000).max(200_000));
    let cap = idle_cap(nofile);
    let mut notes = Vec::new();
    if config.idle[1] > cap {
        let msg = format!(
            "idle connections capped at {cap} (asked {}): RLIMIT_NOFILE is {nofile} here and \
             cannot be raised (no CAP_SYS_RESOURCE); a two-hop connection holds 4 fds in the proxy. \
             RSS at {} idle connections is extrapolated from the per-connection cost",
            config.idle[1], config.idle_target
        );
        progress(&msg);
        notes.push(msg);
        config.idle[1] = cap;
        config.idle[0] = config.idle[0].min(cap / 2);
    }
    let with_haproxy = config.haproxy && haproxy_binary().is_some();
    if config.haproxy && !with_haproxy {
        progress("haproxy not installed: peer scenario skipped (apt-get install haproxy)");
    }
    let scenarios = scenarios(with_haproxy);
    progress(format!(
        "{} run: {} rounds x {} scenarios, proxy {}",
        config.label,
        config.rounds,
        scenarios.len(),
        config.proxy_bin.display()
    ));
    let vn = VirtualNode::build(1, 4).context("virtual node")?;
    let (a, b, c, d) = (
        vn.pod(0).clone(),
        vn.pod(1).clone(),
        vn.pod(2).clone(),
        vn.pod(3).clone(),
    );
    let bed = Bed {
        direct: Path {
            client: a.netns.clone(),
            server: b.netns.clone(),
            listen: SocketAddr::new(b.ip(false), PORT_BASE),
            connect: SocketAddr::new(b.ip(false), PORT_BASE),
        },
        proxied: Path {
            client: c.netns.clone(),
            server: d.netns.clone(),
            listen: SocketAddr::new(d.ip(false), PORT_BASE),
            connect: SocketAddr::new(d.ip(false), PORT_BASE),
        },
        proxied_pods: [&c, &d]
            .iter()
            .map(|p| (p.name.clone(), p.netns.path().to_path_buf()))
            .collect(),
        proxied_netns: vec![c.netns.clone(), d.netns.clone()],
        haproxy: haproxy_binary().map(|bin| {
            (
                bin,
                vn.node.clone(),
                IpAddr::V4(std::net::Ipv4Addr::new(10, 244, vn.index, 1)),
                b.ip(false),
            )
        }),
    };
    let mut rounds = Vec::new();
    let mut churn = Vec::new();
    let mut errors = Vec::new();
    let mut port = PORT_BASE;
    for round in 0..config.rounds {
        let mut figs = Vec::new();
        for sc in &scenarios {
            progress(format!(
                "round {}/{}: {}",
                round + 1,
                config.rounds,
                sc.name
            ));
            let t = Instant::now();
            let f = match run_scenario(&config, &bed, sc, &mut port) {
                Ok((f, errs, n)) => {
                    for e in n {
                        notes.push(format!("round {}, {e}", round + 1));
                    }
                    for e in errs {
                        errors.push(format!("round {}, {}: {e}", round + 1, sc.name));
                    }
                    f
                }
                Err(e) => {
                    progress(format!("  failed: {e:#}"));
                    errors.push(format!("round {}, {}: {e:#}", round + 1, sc.name));
                    Figures::new()
                }
            };
            progress(format!(
                "  ({:.1} s) {}",
                t.elapsed().as_secs_f64(),
                summary_line(&f)
            ));
            figs.push(f);
        }
        rounds.push(figs);
        progress(format!(
            "round {}/{}: pod churn ({} pods)",
            round + 1,
            config.rounds,
            config.churn_pods
        ));
        let f = run_churn(&config, round).unwrap_or_else(|e| {
            progress(format!("  failed: {e:#}"));
            errors.push(format!("round {}, pod churn: {e:#}", round + 1));
            Figures::new()
        });
        progress(format!("  {}", summary_line(&f)));
        churn.push(f);
    }
    drop(vn);
    Ok(Results {
        machine: machine(),
        config,
        scenarios,
        rounds,
        churn,
        errors,
        notes,
        wall_secs: t_start.elapsed().as_secs_f64(),
    })
}

fn summary_line(f: &Figures) -> String {
    f.iter()
        .map(|(k, v)| format!("{k}={v:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn next_port(port: &mut u16) -> u16 {
    *port += 1;
    if *port > PORT_BASE + PORT_SPAN {
        *port = PORT_BASE + 1;
    }
    *port
}

fn run_scenario(
    config: &Config,
    bed: &Bed,
    sc: &Scenario,
    port: &mut u16,
) -> anyhow::Result<(Figures, Vec<String>, Vec<String>)> {
    let mut f = Figures::new();
    let (path, proxy) = match sc.kind {
        Kind::Direct => (bed.direct.clone(), None),
        Kind::Ringway { mode, fast_path } => {
            for ns in &bed.proxied_netns {
                let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings {
                    capture_mode: mode,
                    ..ringway_config::ProxySettings::default()
                });
                ringway_redirect::apply(ns.fd(), &spec).context("capture rules")?;
            }
            let env = vec![
                (
                    "RINGWAY_CAPTURE_MODE",
                    match mode {
                        CaptureMode::Tproxy => "tproxy",
                        CaptureMode::Redirect => "redirect",
                    }
                    .to_string(),
                ),
                ("RINGWAY_SAME_NODE_FAST_PATH", fast_path.to_string()),
                ("RINGWAY_DRAIN_PERIOD", "200ms".to_string()),
            ];
            let p = ProxyChild::start_ringway(
                &config.proxy_bin,
                &env,
                &bed.proxied_pods,
                Duration::from_secs(20),
            )?;
            (bed.proxied.clone(), Some(p))
        }
        Kind::Haproxy => {
            let (bin, node, node_ip, server_ip) =
                bed.haproxy.clone().context("haproxy not installed")?;
            let cfg_path = std::env::temp_dir()
                .join(format!("ringway-bench-haproxy-{}.cfg", std::process::id()));
            std::fs::write(
                &cfg_path,
                haproxy_config(
                    node_ip,
                    (PORT_BASE, PORT_BASE + PORT_SPAN),
                    server_ip,
                    config.idle[1] + 1_000,
                ),
            )?;
            let mut cmd = std::process::Command::new(bin);
            cmd.arg("-db").arg("-f").arg(&cfg_path);
            let p = node.run(|| ProxyChild::spawn(cmd, None, Duration::ZERO))?;
            let mut path = bed.direct.clone();
            path.connect = SocketAddr::new(node_ip, PORT_BASE);
            // Ready once its listener accepts.
            let probe = SocketAddr::new(node_ip, PORT_BASE + PORT_SPAN);
            let t0 = Instant::now();
            while bed
                .direct
                .client
                .run(|| std::net::TcpStream::connect_timeout(&probe, Duration::from_millis(200)))
                .is_err()
            {
                if t0.elapsed() > Duration::from_secs(10) {
                    anyhow::bail!("haproxy not listening after 10 s:\n{}", p.log_tail());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (path, Some(p))
        }
    };
    let cpu = |p: &Option<ProxyChild>| p.as_ref().map(|p| p.cpu_seconds());
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    // A failed measurement is recorded (with the proxy's last log lines) and
    // the others still run: the report shows the hole and why.
    let mut record = |what: &str, r: anyhow::Result<()>, p: &Option<ProxyChild>| {
        if let Err(e) = r {
            let tail = p.as_ref().map(|p| p.log_tail()).unwrap_or_default();
            progress(format!("  {what} failed: {e:#}"));
            errors.push(if tail.is_empty() {
                format!("{what}: {e:#}")
            } else {
                format!("{what}: {e:#}; proxy log: {}", tail.replace('\n', " / "))
            });
        }
    };
    if let Some(p) = &proxy {
        std::thread::sleep(Duration::from_millis(200));
        f.insert("rss_idle_mib".into(), p.rss_kib() / 1024.0);
    }
    // Throughput, one stream and N.
    for (key, streams) in [("1", 1), ("n", config.streams)] {
        let r = (|| {
            let c0 = cpu(&proxy);
            let t = load::throughput(
                &path.on_port(next_port(port)),
                streams,
                Duration::from_secs_f64(config.secs),
            )?;
            let gb = t.bytes as f64 / 1e9;
            f.insert(format!("tput{key}_gbps"), t.gbps());
            if key == "1" {
                f.insert("gen_cpu_s_per_gb".into(), t.gen_cpu / gb);
            }
            if let (Some(c0), Some(c1)) = (c0, cpu(&proxy)) {
                let k = if key == "1" { "" } else { "_n" };
                f.insert(format!("cpu_s_per_gb{k}"), (c1 - c0) / gb);
            }
            Ok(())
        })();
        record(&format!("throughput, {streams} stream(s)"), r, &proxy);
    }
    // Latency at a fixed rate.
    let r = (|| {
        let c0 = cpu(&proxy);
        let l = load::latency(
            &path.on_port(next_port(port)),
            config.rps,
            config.lat_conns,
            Duration::from_secs_f64(config.lat_secs),
        )?;
        for (k, q) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9)] {
            f.insert(
                format!("lat_{k}_us"),
                l.hist.value_at_quantile(q / 100.0) as f64 / 1e3,
            );
        }
        f.insert("lat_max_us".into(), l.hist.max() as f64 / 1e3);
        f.insert(
            "gen_late_p99_us".into(),
            l.lateness.value_at_quantile(0.99) as f64 / 1e3,
        );
        f.insert("lat_rps".into(), l.requests as f64 / l.secs);
        if let (Some(c0), Some(c1)) = (c0, cpu(&proxy)) {
            f.insert(
                "cpu_s_per_1k_req".into(),
                (c1 - c0) / (l.requests as f64 / 1e3),
            );
        }
        Ok(())
    })();
    record("latency", r, &proxy);
    // Connection rate.
    let r = (|| {
        let c0 = cpu(&proxy);
        let cr = load::conn_rate(
            &path.on_port(next_port(port)),
            config.conn_threads,
            Duration::from_secs_f64(config.conn_secs),
            config.conn_max,
        )?;
        f.insert("conn_per_s".into(), cr.conns as f64 / cr.secs);
        f.insert("conn_failures".into(), cr.failures as f64);
        if let Some(e) = cr.first_error {
            notes.push(format!(
                "{}: {} of {} connections failed, first: {e}",
                sc.name,
                cr.failures,
                cr.failures + cr.conns
            ));
        }
        if let (Some(c0), Some(c1)) = (c0, cpu(&proxy)) {
            f.insert("cpu_us_per_conn".into(), (c1 - c0) / cr.conns as f64 * 1e6);
        }
        Ok(())
    })();
    record("connection rate", r, &proxy);
    // Idle connections: proxy RSS with each count open.
    for (key, n) in [("small", config.idle[0]), ("large", config.idle[1])] {
        let r = (|| {
            // Let the proxy finish closing the previous run's sockets so
            // "before" is its idle state again.
            std::thread::sleep(Duration::from_millis(300));
            let before = proxy.as_ref().map(|p| p.rss_kib());
            let idle = load::open_idle(&path.on_port(next_port(port)), n)?;
            std::thread::sleep(Duration::from_millis(300));
            if let (Some(p), Some(before)) = (&proxy, before) {
                let rss = p.rss_kib();
                f.insert(format!("rss_{key}_mib"), rss / 1024.0);
                if key == "large" {
                    let per = (rss - before) / idle.len() as f64;
                    f.insert("kib_per_idle_conn".into(), per);
                    let est = if idle.len() >= config.idle_target {
                        rss
                    } else {
                        before + per * config.idle_target as f64
                    };
                    f.insert("rss_target_idle_mib".into(), est / 1024.0);
                }
            }
            drop(idle);
            Ok(())
        })();
        record(&format!("{n} idle connections"), r, &proxy);
    }
    if let Some(mut p) = proxy {
        if !p.alive() {
            errors.push(format!(
                "the proxy exited during the scenario: {}",
                p.log_tail()
            ));
        }
        p.stop();
    }
    Ok((f, errors, notes))
}

/// Pod churn: `churn_pods` bare pod namespaces (lo only: the proxy's side of
/// enrollment, no veth) handed to a fresh proxy on its command line; time to
/// serving and RSS against a proxy with no pods.
fn run_churn(config: &Config, round: usize) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let t0 = Instant::now();
    let mut pods = Vec::with_capacity(config.churn_pods);
    for i in 0..config.churn_pods {
        pods.push(Netns::create(&format!("churn{round}-{i}"))?);
    }
    f.insert("netns_create_s".into(), t0.elapsed().as_secs_f64());
    let env = vec![("RINGWAY_DRAIN_PERIOD", "200ms".to_string())];
    let mut empty =
        ProxyChild::start_ringway(&config.proxy_bin, &env, &[], Duration::from_secs(20))?;
    std::thread::sleep(Duration::from_millis(200));
    let rss0 = empty.rss_kib();
    empty.stop();
    let specs: Vec<(String, PathBuf)> = pods
        .iter()
        .map(|p| (p.name().to_string(), p.path().to_path_buf()))
        .collect();
    let mut full =
        ProxyChild::start_ringway(&config.proxy_bin, &env, &specs, Duration::from_secs(120))?;
    let startup = full.startup;
    let cpu = full.cpu_seconds();
    std::thread::sleep(Duration::from_millis(200));
    let rss = full.rss_kib();
    full.stop();
    f.insert("enroll_s".into(), startup.as_secs_f64());
    f.insert("enroll_cpu_s".into(), cpu);
    f.insert("rss_empty_mib".into(), rss0 / 1024.0);
    f.insert("rss_pods_mib".into(), rss / 1024.0);
    f.insert(
        "kib_per_pod".into(),
        (rss - rss0) / config.churn_pods.max(1) as f64,
    );
    drop(pods);
    Ok(f)
}

fn machine() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem = read("/proc/meminfo")
        .lines()
        .next()
        .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| format!("{:.1} GiB", k / 1024.0 / 1024.0))
        .unwrap_or_default();
    vec![
        (
            "CPUs".into(),
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0)
                .to_string(),
        ),
        ("CPU".into(), cpu),
        ("memory".into(), mem),
        (
            "kernel".into(),
            read("/proc/sys/kernel/osrelease").trim().to_string(),
        ),
        (
            "load average at the end".into(),
            read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ]
}
