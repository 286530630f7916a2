//! The suite: scenarios x measurements, several rounds alternating the
//! scenarios, then the report (see `report`).
//!
//! Per round: every scenario (a fresh proxy each), then the scrape-impact
//! measurement (fixed-rate latency through the fast path with and without a
//! concurrent `/metrics` + `/config_dump` scraper), then pod churn (1,000
//! pods given to a proxy on its command line, and 1,000 CNI ADDs through the
//! plugin code, the node agent and ZDS).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_config::CaptureMode;
use ringway_testbed::ns::Netns;
use ringway_testbed::{NodeLink, Pod, VirtualNode};

use crate::child::{haproxy_binary, haproxy_config, ProxyArgs, ProxyChild};
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
}

impl Config {
    /// The full run (< 15 min on 2 cores).
    pub fn full(proxy_bin: PathBuf) -> Config {
        Config {
            label: "full".into(),
            rounds: 3,
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
        }
    }

    /// The CI-sized run (< 2 min): same measurements, smaller.
    pub fn quick(proxy_bin: PathBuf) -> Config {
        Config {
            label: "quick".into(),
            rounds: 2,
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

/// What carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No proxy.
    Direct,
    /// ringway, capture rules in both pods.
    Ringway {
        /// TPROXY or REDIRECT.
        mode: CaptureMode,
        /// `sameNodeFastPath`.
        fast_path: bool,
        /// HBONE (mutual TLS + HTTP/2 CONNECT to 15008): the configuration
        /// has a `ca:` and lists both pods as tunnel workloads.
        hbone: bool,
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
    /// Client on node 1, server on node 2 (one proxy per node), instead of
    /// both pods on node 1.
    pub two_nodes: bool,
    /// The key of the no-proxy scenario its ratios are taken to.
    pub base: &'static str,
}

/// The scenarios, in report order.
pub fn scenarios(with_haproxy: bool) -> Vec<Scenario> {
    let ringway = |mode, fast_path, hbone| Kind::Ringway {
        mode,
        fast_path,
        hbone,
    };
    let one = |key, name, kind| Scenario {
        key,
        name,
        kind,
        two_nodes: false,
        base: "direct",
    };
    let two = |key, name, kind| Scenario {
        key,
        name,
        kind,
        two_nodes: true,
        base: "direct_2node",
    };
    let mut v = vec![
        one("direct", "direct (no proxy)", Kind::Direct),
        one(
            "tproxy_fast",
            "ringway TPROXY, same-node fast path (default, 1 hop)",
            ringway(CaptureMode::Tproxy, true, false),
        ),
        one(
            "tproxy_2hop",
            "ringway TPROXY, both hops",
            ringway(CaptureMode::Tproxy, false, false),
        ),
        one(
            "redirect_2hop",
            "ringway REDIRECT, both hops",
            ringway(CaptureMode::Redirect, false, false),
        ),
        one(
            "hbone_1node",
            "ringway HBONE, one node (fast path off, both hops, mTLS)",
            ringway(CaptureMode::Tproxy, false, true),
        ),
    ];
    if with_haproxy {
        v.push(one(
            "haproxy",
            "HAProxy TCP mode (peer, 1 hop, node netns)",
            Kind::Haproxy,
        ));
    }
    v.extend([
        two("direct_2node", "direct, two nodes (no proxy)", Kind::Direct),
        two(
            "tproxy_2node",
            "ringway TPROXY plaintext, two nodes (2 proxies)",
            ringway(CaptureMode::Tproxy, true, false),
        ),
        two(
            "hbone_2node",
            "ringway HBONE, two nodes (2 proxies, mTLS)",
            ringway(CaptureMode::Tproxy, true, true),
        ),
    ]);
    v
}

/// The scenario keys every report must have (HAProxy is optional).
pub const REQUIRED_SCENARIOS: &[&str] = &[
    "direct",
    "tproxy_fast",
    "tproxy_2hop",
    "redirect_2hop",
    "hbone_1node",
    "direct_2node",
    "tproxy_2node",
    "hbone_2node",
];

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
    /// Scrape-impact figures per round.
    pub scrape: Vec<Figures>,
    /// Churn figures per round.
    pub churn: Vec<Figures>,
    /// Measurements that failed (the report lists them; `check` flags the holes).
    pub errors: Vec<String>,
    /// Things the reader should know (e.g. connections that failed).
    pub notes: Vec<String>,
    /// The fd limit in force and why the large idle count was lowered, if it was.
    pub fd_limit: FdLimit,
    /// Total wall time of the run, seconds.
    pub wall_secs: f64,
    /// Machine description lines.
    pub machine: Vec<(String, String)>,
}

/// RLIMIT_NOFILE as the run found and left it.
#[derive(Debug, Clone, Default)]
pub struct FdLimit {
    /// Soft limit in force (the bench's and, inherited, the proxies').
    pub soft: u64,
    /// Hard limit in force.
    pub hard: u64,
    /// `/proc/sys/fs/nr_open`: the most any process may be given.
    pub nr_open: u64,
    /// Whether CAP_SYS_RESOURCE (needed to raise the hard limit) is in this
    /// process's effective set.
    pub cap_sys_resource: bool,
    /// Whether it is in the bounding set (no process here can gain it otherwise).
    pub cap_sys_resource_bounding: bool,
}

pub(crate) fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Whether capability `bit` is set in the `field` line of /proc/self/status.
fn has_cap(field: &str, bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
        })
        .is_some_and(|mask| mask & (1 << bit) != 0)
}

/// Raises RLIMIT_NOFILE, soft and hard, to `want` (at most `nr_open`) so
/// large idle counts fit; the proxy children inherit it (and the proxy sets
/// its soft limit to its hard one). Raising the hard limit needs
/// CAP_SYS_RESOURCE; without it the soft limit goes up to the hard one.
pub fn raise_nofile(want: u64) -> FdLimit {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const CAP_SYS_RESOURCE: u32 = 24;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20);
    let want = want.min(nr_open);
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < want && setrlimit(Resource::RLIMIT_NOFILE, want, want.max(hard)).is_err() {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    FdLimit {
        soft,
        hard,
        nr_open,
        cap_sys_resource: has_cap("CapEff:", CAP_SYS_RESOURCE),
        cap_sys_resource_bounding: has_cap("CapBnd:", CAP_SYS_RESOURCE),
    }
}

/// Directory on a tmpfs private to the bench's mount namespace: the test CA
/// (key included) and the proxies' configuration files vanish with it.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new() -> anyhow::Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("ringway-bench-{}", std::process::id()));
        ringway_testbed::private_tmpfs(&dir).context("mounting the bench's tmpfs")?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) const TRUST_DOMAIN: &str = "cluster.local";

/// The mesh configuration of the HBONE scenarios: a CA and the pods as tunnel
/// workloads, the fast path off (so one node's traffic also goes through
/// 15008, as the reference mesh is measured).
pub(crate) fn hbone_yaml(ca_dir: &FsPath, pods: &[(&Pod, &str)]) -> String {
    let ws: Vec<_> = pods
        .iter()
        .map(|(p, node)| {
            ringway_testbed::mesh::WorkloadYaml::of_pod(p, &p.name, "bench", &p.name, node)
        })
        .collect();
    format!(
        "proxy:\n  sameNodeFastPath: false\ntrustDomain: {TRUST_DOMAIN}\nca:\n  certFile: {}\n  keyFile: {}\n{}",
        ca_dir.join("ca.crt").display(),
        ca_dir.join("ca.key").display(),
        ringway_testbed::mesh::workloads_yaml(&ws)
    )
}

pub(crate) struct Bed {
    /// Node 1: pods 0 -> 1 direct, 2 -> 3 through ringway.
    n1: VirtualNode,
    /// Node 2: pod 0 direct from node 1's pod 0, pod 1 through ringway from
    /// node 1's pod 2.
    n2: VirtualNode,
    _link: NodeLink,
    /// The HBONE configuration file.
    hbone_config: PathBuf,
    pub(crate) scratch: Scratch,
}

impl Bed {
    pub(crate) fn build() -> anyhow::Result<Bed> {
        let scratch = Scratch::new()?;
        let n1 = VirtualNode::build(1, 4).context("virtual node 1")?;
        let n2 = VirtualNode::build(2, 2).context("virtual node 2")?;
        let link = ringway_testbed::link_nodes(&n1, &n2).context("linking the nodes")?;
        // A throwaway mesh CA for this run only.
        ringway_identity::CaSigner::generate_for_tests(TRUST_DOMAIN)
            .write_pem_files(&scratch.0.join("ca.crt"), &scratch.0.join("ca.key"))?;
        let hbone_config = scratch.0.join("hbone.yaml");
        std::fs::write(
            &hbone_config,
            hbone_yaml(
                &scratch.0,
                &[
                    (n1.pod(2), "node1"),
                    (n1.pod(3), "node1"),
                    (n2.pod(1), "node2"),
                ],
            ),
        )?;
        Ok(Bed {
            n1,
            n2,
            _link: link,
            hbone_config,
            scratch,
        })
    }

    fn path(client: &Pod, server: &Pod) -> Path {
        let addr = SocketAddr::new(server.ip(false), PORT_BASE);
        Path {
            client: client.netns.clone(),
            server: server.netns.clone(),
            listen: addr,
            connect: addr,
        }
    }

    /// (client, server) of a scenario.
    fn pods(&self, sc: &Scenario) -> (&Pod, &Pod) {
        match (sc.kind, sc.two_nodes) {
            (Kind::Direct | Kind::Haproxy, false) => (self.n1.pod(0), self.n1.pod(1)),
            (Kind::Direct | Kind::Haproxy, true) => (self.n1.pod(0), self.n2.pod(0)),
            (Kind::Ringway { .. }, false) => (self.n1.pod(2), self.n1.pod(3)),
            (Kind::Ringway { .. }, true) => (self.n1.pod(2), self.n2.pod(1)),
        }
    }
}

pub(crate) const PORT_BASE: u16 = 20_000;
const PORT_SPAN: u16 = 999;

/// Runs the suite. Must be called inside `ringway_testbed::run_isolated`.
pub fn run(config: Config) -> anyhow::Result<Results> {
    let t_start = Instant::now();
    let fd_limit = raise_nofile((6 * config.idle[1] as u64 + 10_000).max(200_000));
    let mut notes = Vec::new();
    if fd_limit.soft < 6 * config.idle[1] as u64 + 2_000 {
        let msg = fd_limit_note(&fd_limit, config.idle[1]);
        progress(&msg);
        notes.push(msg);
    }
    let with_haproxy = config.haproxy && haproxy_binary().is_some();
    if config.haproxy && !with_haproxy {
        progress("haproxy not installed: peer scenario skipped (apt-get install haproxy)");
    }
    let scenarios = scenarios(with_haproxy);
    progress(format!(
        "{} run: {} rounds x {} scenarios + scrape impact + pod churn, proxy {}",
        config.label,
        config.rounds,
        scenarios.len(),
        config.proxy_bin.display()
    ));
    let bed = Bed::build()?;
    let mut rounds = Vec::new();
    let mut scrape = Vec::new();
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
            let f = match run_scenario(&config, &fd_limit, &bed, sc, &mut port) {
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
            "round {}/{}: scrape impact ({} scrapes/s)",
            round + 1,
            config.rounds,
            config.scrape_rate
        ));
        let t = Instant::now();
        let f = run_scrape(&config, &bed, round, &mut port).unwrap_or_else(|e| {
            progress(format!("  failed: {e:#}"));
            errors.push(format!("round {}, scrape impact: {e:#}", round + 1));
            Figures::new()
        });
        progress(format!(
            "  ({:.1} s) {}",
            t.elapsed().as_secs_f64(),
            summary_line(&f)
        ));
        scrape.push(f);
        progress(format!(
            "round {}/{}: pod churn ({} pods)",
            round + 1,
            config.rounds,
            config.churn_pods
        ));
        let t = Instant::now();
        let f = run_churn(&config, &bed.scratch.0, round).unwrap_or_else(|e| {
            progress(format!("  failed: {e:#}"));
            errors.push(format!("round {}, pod churn: {e:#}", round + 1));
            Figures::new()
        });
        progress(format!(
            "  ({:.1} s) {}",
            t.elapsed().as_secs_f64(),
            summary_line(&f)
        ));
        churn.push(f);
    }
    drop(bed);
    Ok(Results {
        machine: machine(),
        config,
        scenarios,
        rounds,
        scrape,
        churn,
        errors,
        notes,
        fd_limit,
        wall_secs: t_start.elapsed().as_secs_f64(),
    })
}

/// Why the large idle count may not be reachable, in one sentence.
fn fd_limit_note(l: &FdLimit, asked: usize) -> String {
    let why = if l.cap_sys_resource {
        "raising it failed".to_string()
    } else if l.cap_sys_resource_bounding {
        "this process lacks CAP_SYS_RESOURCE, which raising a hard limit needs".to_string()
    } else {
        "CAP_SYS_RESOURCE, which raising a hard limit needs, is not even in this machine's \
         capability bounding set (CapBnd), so no process here, root included, can raise it"
            .to_string()
    };
    format!(
        "RLIMIT_NOFILE is {} (hard {}; fs.nr_open {}) and cannot be raised: {why}. \
         Every process (the load generator, each proxy) is capped at {} open fds, so the large \
         idle count ({asked} asked) is lowered per scenario to what its proxy's measured fds per \
         idle connection and the load generator's 2 allow (the count reached is in the table)",
        l.soft, l.hard, l.nr_open, l.soft
    )
}

fn summary_line(f: &Figures) -> String {
    f.iter()
        .map(|(k, v)| format!("{k}={v:.3}"))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(crate) fn next_port(port: &mut u16) -> u16 {
    *port += 1;
    if *port > PORT_BASE + PORT_SPAN {
        *port = PORT_BASE + 1;
    }
    *port
}

/// The proxies of a scenario together: CPU and RSS are their sums (one
/// process carries both hops on one node; two nodes have one proxy each).
pub(crate) struct Proxies(pub(crate) Vec<ProxyChild>);

impl Proxies {
    pub(crate) fn cpu(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|p| p.cpu_seconds()).sum())
    }

    fn rss_kib(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|p| p.rss_kib()).sum())
    }

    fn log_tail(&self) -> String {
        self.0
            .iter()
            .map(|p| p.log_tail())
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

fn ringway_env(mode: CaptureMode, fast_path: Option<bool>) -> Vec<(&'static str, String)> {
    let mut env = vec![
        (
            "RINGWAY_CAPTURE_MODE",
            match mode {
                CaptureMode::Tproxy => "tproxy",
                CaptureMode::Redirect => "redirect",
            }
            .to_string(),
        ),
        ("RINGWAY_DRAIN_PERIOD", "200ms".to_string()),
    ];
    if let Some(f) = fast_path {
        env.push(("RINGWAY_SAME_NODE_FAST_PATH", f.to_string()));
    }
    env
}

pub(crate) fn capture(pods: &[&Pod], mode: CaptureMode) -> anyhow::Result<()> {
    let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings {
        capture_mode: mode,
        ..ringway_config::ProxySettings::default()
    });
    for p in pods {
        ringway_redirect::apply(p.netns.fd(), &spec)
            .with_context(|| format!("capture rules in {}", p.name))?;
    }
    Ok(())
}

fn pod_arg(p: &Pod) -> (String, PathBuf) {
    (p.name.clone(), p.netns.path().to_path_buf())
}

/// Starts what carries a scenario's traffic; returns the path the load
/// generator uses and the proxies to measure.
pub(crate) fn start(config: &Config, bed: &Bed, sc: &Scenario) -> anyhow::Result<(Path, Proxies)> {
    let (client, server) = bed.pods(sc);
    let mut path = Bed::path(client, server);
    let proxies = match sc.kind {
        Kind::Direct => Vec::new(),
        Kind::Ringway {
            mode,
            fast_path,
            hbone,
        } => {
            capture(&[client, server], mode)?;
            // HBONE's settings (fast path off) come from its YAML file.
            let env = ringway_env(mode, (!hbone).then_some(fast_path));
            let config_file = hbone.then(|| bed.hbone_config.clone());
            let groups: Vec<Vec<&Pod>> = if sc.two_nodes {
                vec![vec![client], vec![server]]
            } else {
                vec![vec![client, server]]
            };
            let mut v = Vec::new();
            for (i, pods) in groups.iter().enumerate() {
                let mut args =
                    ProxyArgs::pods(&pods.iter().map(|p| pod_arg(p)).collect::<Vec<_>>());
                args.config = config_file.clone();
                // Each proxy's endpoints on its own loopback address: the
                // metrics tell whether the traffic really rode HBONE.
                args.control_host = Ipv4Addr::new(127, 0, 0, 1 + i as u8);
                v.push(ProxyChild::start_ringway(
                    &config.proxy_bin,
                    &env,
                    &args,
                    Duration::from_secs(20),
                )?);
            }
            v
        }
        Kind::Haproxy => {
            let bin = haproxy_binary().context("haproxy not installed")?;
            let node_ip = IpAddr::V4(Ipv4Addr::new(10, 244, bed.n1.index, 1));
            let cfg_path = bed.scratch.0.join("haproxy.cfg");
            std::fs::write(
                &cfg_path,
                haproxy_config(
                    node_ip,
                    (PORT_BASE, PORT_BASE + PORT_SPAN),
                    server.ip(false),
                    haproxy_maxconn(),
                ),
            )?;
            let mut cmd = std::process::Command::new(bin);
            cmd.arg("-db").arg("-f").arg(&cfg_path);
            let p = bed
                .n1
                .node
                .run(|| ProxyChild::spawn(cmd, None, Duration::ZERO))?;
            path.connect = SocketAddr::new(node_ip, PORT_BASE);
            // Ready once its listener accepts.
            let probe = SocketAddr::new(node_ip, PORT_BASE + PORT_SPAN);
            let t0 = Instant::now();
            while path
                .client
                .run(|| std::net::TcpStream::connect_timeout(&probe, Duration::from_millis(200)))
                .is_err()
            {
                if t0.elapsed() > Duration::from_secs(10) {
                    bail!("haproxy not listening after 10 s:\n{}", p.log_tail());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            vec![p]
        }
    };
    Ok((path, Proxies(proxies)))
}

/// HAProxy's maxconn: what the fd limit lets it hold. HAProxy refuses to
/// start unless it can have 2 fds per connection plus one per listening port
/// (1,000 here) and a few of its own.
fn haproxy_maxconn() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(s, _)| s)
        .unwrap_or(1024);
    (soft.saturating_sub(u64::from(PORT_SPAN) + 1 + 200) / 2) as usize
}

fn run_scenario(
    config: &Config,
    limit: &FdLimit,
    bed: &Bed,
    sc: &Scenario,
    port: &mut u16,
) -> anyhow::Result<(Figures, Vec<String>, Vec<String>)> {
    let mut f = Figures::new();
    let (path, proxies) = start(config, bed, sc)?;
    let proxied = !proxies.0.is_empty();
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    // A failed measurement is recorded (with the proxy's last log lines) and
    // the others still run: the report shows the hole and why.
    let mut record = |what: &str, r: anyhow::Result<()>, p: &Proxies| {
        if let Err(e) = r {
            let tail = p.log_tail();
            progress(format!("  {what} failed: {e:#}"));
            errors.push(if tail.is_empty() {
                format!("{what}: {e:#}")
            } else {
                format!("{what}: {e:#}; proxy log: {}", tail.replace('\n', " / "))
            });
        }
    };
    if proxied {
        std::thread::sleep(config.settle);
        f.insert(
            "rss_idle_mib".into(),
            proxies.rss_kib().unwrap_or(f64::NAN) / 1024.0,
        );
    }
    // Throughput, one stream and N.
    for (key, streams) in [("1", 1), ("n", config.streams)] {
        let r = (|| {
            let c0 = proxies.cpu();
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
            if let (Some(c0), Some(c1)) = (c0, proxies.cpu()) {
                let k = if key == "1" { "" } else { "_n" };
                f.insert(format!("cpu_s_per_gb{k}"), (c1 - c0) / gb);
            }
            Ok(())
        })();
        record(&format!("throughput, {streams} stream(s)"), r, &proxies);
    }
    // Latency at a fixed rate.
    let r = (|| {
        let c0 = proxies.cpu();
        let l = load::latency(
            &path.on_port(next_port(port)),
            config.rps,
            config.lat_conns,
            Duration::from_secs_f64(config.lat_secs),
        )?;
        insert_latency(&mut f, "lat", &l);
        f.insert(
            "gen_late_p99_us".into(),
            l.lateness.value_at_quantile(0.99) as f64 / 1e3,
        );
        f.insert("lat_rps".into(), l.requests as f64 / l.secs);
        if let (Some(c0), Some(c1)) = (c0, proxies.cpu()) {
            f.insert(
                "cpu_s_per_1k_req".into(),
                (c1 - c0) / (l.requests as f64 / 1e3),
            );
        }
        Ok(())
    })();
    record("latency", r, &proxies);
    // Connection rate.
    let r = (|| {
        let c0 = proxies.cpu();
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
        if let (Some(c0), Some(c1)) = (c0, proxies.cpu()) {
            f.insert("cpu_us_per_conn".into(), (c1 - c0) / cr.conns as f64 * 1e6);
        }
        Ok(())
    })();
    record("connection rate", r, &proxies);
    // Idle connections: proxy RSS with each count open. The small count also
    // tells how many fds an idle connection holds in each proxy, which bounds
    // the large count under the fd limit.
    let mut large = config.idle[1];
    for (key, asked) in [("small", config.idle[0]), ("large", config.idle[1])] {
        let r = (|| {
            // Let the proxy finish closing the previous run's sockets so
            // "before" is its idle state again.
            std::thread::sleep(config.settle);
            let n = if key == "large" { large } else { asked };
            let before = proxies.rss_kib();
            let fds_before: Vec<usize> = proxies.0.iter().map(|p| p.fds()).collect();
            let gen_before = crate::child::proc_fd_count(std::process::id());
            let kinds_before: Vec<_> = proxies
                .0
                .iter()
                .map(|p| crate::child::proc_fd_kinds(p.pid))
                .collect();
            let idle = load::open_idle(&path.on_port(next_port(port)), n)?;
            std::thread::sleep(config.settle);
            if std::env::var_os("RINGWAY_BENCH_FD_DUMP").is_some() {
                for (p, b) in proxies.0.iter().zip(&kinds_before) {
                    progress(format!(
                        "  fds of {} with {n} idle: {:?} (before: {b:?})",
                        p.pid,
                        crate::child::proc_fd_kinds(p.pid)
                    ));
                }
            }
            if let (Some(rss), Some(before)) = (proxies.rss_kib(), before) {
                f.insert(format!("rss_{key}_mib"), rss / 1024.0);
                let per = (rss - before) / idle.len() as f64;
                if key == "large" {
                    f.insert("kib_per_idle_conn".into(), per);
                    let est = if idle.len() >= config.idle_target {
                        rss
                    } else {
                        before + per * config.idle_target as f64
                    };
                    f.insert("rss_target_idle_mib".into(), est / 1024.0);
                }
            }
            if key == "small" {
                // fds each process holds per idle connection; the large count
                // is what the tightest process can hold under the limit.
                let margin = 600u64;
                let soft = limit.soft;
                let mut cap = soft.saturating_sub(gen_before as u64 + margin) / 2;
                let mut per_conn_total = 0.0;
                for (p, b) in proxies.0.iter().zip(&fds_before) {
                    let per = (p.fds().saturating_sub(*b) as f64 / n.max(1) as f64).max(1.0);
                    per_conn_total += per;
                    cap = cap.min((soft.saturating_sub(*b as u64 + margin) as f64 / per) as u64);
                }
                if sc.kind == Kind::Haproxy {
                    cap = cap.min(haproxy_maxconn().saturating_sub(100) as u64);
                }
                if proxied {
                    f.insert("fds_per_idle_conn".into(), per_conn_total);
                }
                let cap = (cap / 100 * 100) as usize;
                if cap < config.idle[1] {
                    large = cap.max(n);
                }
            } else {
                f.insert("idle_large_n".into(), idle.len() as f64);
            }
            drop(idle);
            Ok(())
        })();
        record(&format!("{asked} idle connections"), r, &proxies);
    }
    // The traffic took the path the scenario says: every connection the
    // client-side proxy opened was mutual TLS with HBONE, none without.
    if let Kind::Ringway { hbone, .. } = sc.kind {
        let metrics = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 15020);
        match opened_by_security(metrics) {
            Ok(m) => {
                let mtls = m.get("mutual_tls").copied().unwrap_or(0.0);
                let plain = m.get("none").copied().unwrap_or(0.0);
                let ok = if hbone {
                    mtls > 0.0 && plain == 0.0
                } else {
                    mtls == 0.0 && plain > 0.0
                };
                if !ok {
                    errors.push(format!(
                        "connections opened by security policy, as the client-side proxy reports them: {m:?}; \
                         want {} only",
                        if hbone { "mutual_tls" } else { "none" }
                    ));
                }
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    let mut proxies = proxies;
    for p in &mut proxies.0 {
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

fn insert_latency(f: &mut Figures, prefix: &str, l: &load::Latency) {
    for (k, q) in [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9)] {
        f.insert(
            format!("{prefix}_{k}_us"),
            l.hist.value_at_quantile(q / 100.0) as f64 / 1e3,
        );
    }
    f.insert(format!("{prefix}_max_us"), l.hist.max() as f64 / 1e3);
}

/// One HTTP/1.1 GET with `Connection: close`; the body of a 200.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let r = ringway_testbed::http::get(addr, path)?;
    if r.status != 200 {
        return Err(std::io::Error::other(format!(
            "GET {path}: status {}",
            r.status
        )));
    }
    Ok(r.body.into_bytes())
}

/// Connections a proxy reported opening as the source side, by
/// `connection_security_policy` (`mutual_tls`, `none`), from its `/metrics`.
fn opened_by_security(metrics: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let body = http_get(metrics, "/metrics").context("scraping the proxy's /metrics")?;
    let mut m = BTreeMap::new();
    let text = String::from_utf8_lossy(&body);
    for (labels, value) in crate::prom::samples(&text, "istio_tcp_connections_opened_total") {
        if crate::prom::label(labels, "reporter") != Some("source") {
            continue;
        }
        let policy = crate::prom::label(labels, "connection_security_policy").unwrap_or("");
        *m.entry(policy.to_string()).or_insert(0.0) += value;
    }
    Ok(m)
}

/// What the scraper did.
struct Scraped {
    scrapes: u64,
    secs: f64,
    metrics_bytes: usize,
    durations_ms: Vec<f64>,
    error: Option<String>,
}

/// Scrapes `GET /metrics` then `GET /config_dump` at `rate` per second until
/// `stop` (and at most `max` times).
fn scraper(
    metrics: SocketAddr,
    admin: SocketAddr,
    rate: f64,
    max: u64,
    stop: Arc<AtomicBool>,
) -> Scraped {
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let t0 = Instant::now();
    let mut out = Scraped {
        scrapes: 0,
        secs: 0.0,
        metrics_bytes: 0,
        durations_ms: Vec::new(),
        error: None,
    };
    while !stop.load(Ordering::Relaxed) && out.scrapes < max {
        let at = t0 + interval.mul_f64(out.scrapes as f64);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let t = Instant::now();
        match http_get(metrics, "/metrics").and_then(|b| http_get(admin, "/config_dump").map(|_| b))
        {
            Ok(b) => {
                out.metrics_bytes = b.len();
                out.durations_ms.push(t.elapsed().as_secs_f64() * 1e3);
                out.scrapes += 1;
            }
            Err(e) => {
                out.error.get_or_insert_with(|| e.to_string());
                break;
            }
        }
    }
    out.secs = t0.elapsed().as_secs_f64();
    out
}

/// Scrape impact: the default scenario (TPROXY fast path), one proxy, the
/// same fixed-rate latency run twice: alone, and with a scraper hitting
/// `/metrics` (15020) and `/config_dump` (15000) `scrape_rate` times a
/// second. The order alternates with the round.
fn run_scrape(config: &Config, bed: &Bed, round: usize, port: &mut u16) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let (client, server) = (bed.n1.pod(2), bed.n1.pod(3));
    capture(&[client, server], CaptureMode::Tproxy)?;
    let args = ProxyArgs::pods(&[pod_arg(client), pod_arg(server)]);
    let host = args.control_host;
    let mut proxy = ProxyChild::start_ringway(
        &config.proxy_bin,
        &ringway_env(CaptureMode::Tproxy, Some(true)),
        &args,
        Duration::from_secs(20),
    )?;
    let metrics = SocketAddr::new(IpAddr::V4(host), 15020);
    let admin = SocketAddr::new(IpAddr::V4(host), 15000);
    let path = Bed::path(client, server);
    // Series to encode: a few hundred connections first.
    load::conn_rate(
        &path.on_port(next_port(port)),
        1,
        Duration::from_millis(300),
        200,
    )?;
    let dur = Duration::from_secs_f64(config.lat_secs);
    let order = if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    };
    for with in order {
        let key = if with { "on" } else { "off" };
        let stop = Arc::new(AtomicBool::new(false));
        let scrape = with.then(|| {
            let stop = stop.clone();
            let max = (config.lat_secs * config.scrape_rate).ceil() as u64 + 5;
            let rate = config.scrape_rate;
            std::thread::spawn(move || scraper(metrics, admin, rate, max, stop))
        });
        let (c0, w0) = (
            proxy.thread_cpu_seconds("ringway-control"),
            proxy.thread_cpu_seconds(ringway_proxy::worker::THREAD_PREFIX),
        );
        let l = load::latency(
            &path.on_port(next_port(port)),
            config.rps,
            config.lat_conns,
            dur,
        );
        stop.store(true, Ordering::Relaxed);
        let scraped = scrape.map(|h| h.join().expect("scraper thread"));
        let (c1, w1) = (
            proxy.thread_cpu_seconds("ringway-control"),
            proxy.thread_cpu_seconds(ringway_proxy::worker::THREAD_PREFIX),
        );
        let l = l?;
        insert_latency(&mut f, &format!("scrape_{key}"), &l);
        f.insert(
            format!("scrape_{key}_worker_cpu_s_per_1k_req"),
            (w1 - w0) / (l.requests as f64 / 1e3),
        );
        if let Some(s) = scraped {
            if let Some(e) = s.error {
                bail!("scraper: {e}");
            }
            if s.scrapes == 0 {
                bail!("no scrape completed");
            }
            f.insert("scrapes_per_s".into(), s.scrapes as f64 / s.secs);
            f.insert("metrics_kib".into(), s.metrics_bytes as f64 / 1024.0);
            f.insert("scrape_ms_p50".into(), crate::median(&s.durations_ms));
            f.insert(
                "control_cpu_ms_per_scrape".into(),
                (c1 - c0) * 1e3 / s.scrapes as f64,
            );
        }
    }
    if !proxy.alive() {
        bail!("the proxy exited: {}", proxy.log_tail());
    }
    proxy.stop();
    Ok(f)
}

/// Pod churn, two ways over the same `churn_pods` bare pod namespaces (lo
/// only):
/// 1. handed to a fresh proxy on its command line: time from process start
///    to every pod's listeners open, RSS against a proxy with no pods;
/// 2. enrolled one after another by a CNI ADD through the plugin's library
///    entry (`ringway_cni::run`, what the `ringway-cni` binary runs) over the
///    node agent's socket: the agent (in this process) applies the capture
///    rules in the pod and hands the netns to a fresh proxy over ZDS, which
///    acks once the pod's listeners are open; each ADD timed end to end.
fn run_churn(config: &Config, scratch: &FsPath, round: usize) -> anyhow::Result<Figures> {
    let mut f = Figures::new();
    let t0 = Instant::now();
    let mut pods = Vec::with_capacity(config.churn_pods);
    for i in 0..config.churn_pods {
        pods.push(Netns::create(&format!("churn{round}-{i}"))?);
    }
    f.insert("netns_create_s".into(), t0.elapsed().as_secs_f64());
    let env = vec![("RINGWAY_DRAIN_PERIOD", "200ms".to_string())];
    let mut empty = ProxyChild::start_ringway(
        &config.proxy_bin,
        &env,
        &ProxyArgs::pods(&[]),
        Duration::from_secs(20),
    )?;
    std::thread::sleep(config.settle);
    let rss0 = empty.rss_kib();
    empty.stop();
    let specs: Vec<(String, PathBuf)> = pods
        .iter()
        .map(|p| (p.name().to_string(), p.path().to_path_buf()))
        .collect();
    let mut full = ProxyChild::start_ringway(
        &config.proxy_bin,
        &env,
        &ProxyArgs::pods(&specs),
        Duration::from_secs(120),
    )?;
    let startup = full.startup;
    let cpu = full.cpu_seconds();
    std::thread::sleep(config.settle);
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
    cni_churn(config, scratch, round, &pods, &mut f)?;
    drop(pods);
    Ok(f)
}

fn cni_churn(
    config: &Config,
    scratch: &FsPath,
    round: usize,
    pods: &[Netns],
    f: &mut Figures,
) -> anyhow::Result<()> {
    let dir = scratch.join(format!("agent{round}"));
    std::fs::create_dir_all(&dir)?;
    let settings = ringway_config::ProxySettings::default();
    let agent = ringway_cni::node::NodeAgent::start(ringway_cni::node::AgentConfig {
        zds_socket: dir.join("zds.sock"),
        cni_socket: dir.join("cni.sock"),
        capture: ringway_proxy::capture_spec(&settings),
        // Nothing to rediscover: no netns dirs, an empty procfs stand-in.
        netns_dirs: vec![],
        proc_root: dir.clone(),
        node_name: "node1".into(),
        reconcile_interval: Duration::from_secs(3600),
        // The churn pods' identity (CNI passes no service account).
        service_accounts: vec!["bench=churn".parse()?],
        ..ringway_cni::node::AgentConfig::default()
    })
    .context("starting the node agent")?;
    let mut args = ProxyArgs::pods(&[]);
    args.zds_socket = Some(dir.join("zds.sock"));
    let mut proxy = start_proxy_for_agent(&config.proxy_bin, &args, &agent)?;
    std::thread::sleep(config.settle);
    let rss0 = proxy.rss_kib();
    let mut lat_ms = Vec::with_capacity(pods.len());
    let t_all = Instant::now();
    for (i, ns) in pods.iter().enumerate() {
        let took = cni_add(&dir.join("cni.sock"), ns, i)
            .with_context(|| format!("CNI ADD of pod {i} ({})", ns.name()))?;
        lat_ms.push(took.as_secs_f64() * 1e3);
    }
    let total = t_all.elapsed().as_secs_f64();
    std::thread::sleep(config.settle);
    let rss = proxy.rss_kib();
    let enrolled = agent.pods().len();
    if enrolled != pods.len() {
        bail!("the agent holds {enrolled} pods after {} ADDs", pods.len());
    }
    lat_ms.sort_by(f64::total_cmp);
    let q = |p: f64| lat_ms[((lat_ms.len() as f64 * p).ceil() as usize).clamp(1, lat_ms.len()) - 1];
    f.insert("cni_add_p50_ms".into(), q(0.50));
    f.insert("cni_add_p90_ms".into(), q(0.90));
    f.insert("cni_add_p99_ms".into(), q(0.99));
    f.insert("cni_add_max_ms".into(), *lat_ms.last().unwrap_or(&f64::NAN));
    f.insert("cni_add_total_s".into(), total);
    f.insert(
        "cni_kib_per_pod".into(),
        (rss - rss0) / pods.len().max(1) as f64,
    );
    if !proxy.alive() {
        bail!("the proxy exited: {}", proxy.log_tail());
    }
    proxy.stop();
    agent.shutdown();
    Ok(())
}

/// One CNI ADD for churn pod `i` as a container runtime makes it: `CNI_*`
/// variables and the chained config with the primary plugin's result, through
/// the plugin code over the agent's socket. Times the whole call.
pub(crate) fn cni_add(agent_socket: &FsPath, ns: &Netns, i: usize) -> anyhow::Result<Duration> {
    let name = ns.name().to_string();
    // Addresses the primary plugin would have given (the pod holds none:
    // only the capture rules' exclusions use them).
    let v4 = Ipv4Addr::new(10, 250, (i / 250) as u8, (i % 250 + 2) as u8);
    let call = ringway_testbed::cni::CniPod {
        uid: format!("uid-{name}"),
        container_id: format!("bench-{name}"),
        name,
        namespace: "bench".into(),
        netns: ns.path().to_path_buf(),
        ips: vec![format!("{v4}/16")],
    };
    let env: std::collections::HashMap<String, String> = call
        .env("ADD", FsPath::new("/opt/cni/bin"))
        .into_iter()
        .collect();
    let conf = call.netconf("1.0.0", "bench-net", agent_socket);
    let t0 = Instant::now();
    let out = ringway_cni::run(
        &env,
        conf.as_bytes(),
        &ringway_cni::node::UnixAgent::default(),
    );
    let took = t0.elapsed();
    if out.exit_code != 0 {
        bail!("exit {}: {}", out.exit_code, out.stdout);
    }
    Ok(took)
}

/// What `profile` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The connection-rate loop through the default scenario (TPROXY fast path).
    ConnRate,
    /// One stream through HBONE on one node.
    HboneStream,
    /// `churn_pods` CNI ADDs one after another (plugin, agent, ZDS, proxy).
    CniAdd,
    /// 64 B closed-loop ping-pong through `RINGWAY_BENCH_PROFILE_SCENARIO`
    /// (default `tproxy_2hop`), with the proxy's syscalls, io_uring
    /// submissions and completions, context switches and wake-ups counted
    /// per message by `perf stat` (tracepoints, no PMU needed).
    Latency,
}

fn start_perf(out: Option<&FsPath>, secs: f64) -> anyhow::Result<Option<std::process::Child>> {
    let Some(out) = out else {
        return Ok(None);
    };
    let mut cmd = std::process::Command::new("perf");
    cmd.args(["record", "-a", "-g", "-o"])
        .arg(out)
        .args(["--", "sleep"])
        .arg(format!("{secs}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    Ok(Some(cmd.spawn().context("starting perf record")?))
}

/// Tracepoints `perf stat` counts on the proxy in the latency profile.
const STAT_EVENTS: &[&str] = &[
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_splice",
    "syscalls:sys_enter_io_uring_enter",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_epoll_pwait",
    "syscalls:sys_enter_epoll_ctl",
    "syscalls:sys_enter_read",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_futex",
    "io_uring:io_uring_submit_req",
    "io_uring:io_uring_complete",
    "io_uring:io_uring_poll_arm",
    "io_uring:io_uring_task_add",
    "io_uring:io_uring_task_work_run",
    "sched:sched_switch",
    "sched:sched_wakeup",
];

/// Tracepoints `perf stat` counts on the proxy in the connection-rate
/// profile: the syscalls a proxied connection costs, one by one.
const CONN_STAT_EVENTS: &[&str] = &[
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_socket",
    "syscalls:sys_enter_setns",
    "syscalls:sys_enter_setsockopt",
    "syscalls:sys_enter_getsockopt",
    "syscalls:sys_enter_bind",
    "syscalls:sys_enter_connect",
    "syscalls:sys_enter_getsockname",
    "syscalls:sys_enter_getpeername",
    "syscalls:sys_enter_fcntl",
    "syscalls:sys_enter_shutdown",
    "syscalls:sys_enter_close",
    "syscalls:sys_enter_splice",
    "syscalls:sys_enter_pipe2",
    "syscalls:sys_enter_epoll_ctl",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_io_uring_enter",
    "syscalls:sys_enter_read",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_futex",
    "syscalls:sys_enter_mmap",
    "syscalls:sys_enter_munmap",
    "syscalls:sys_enter_madvise",
    "syscalls:sys_enter_brk",
    "io_uring:io_uring_submit_req",
    "io_uring:io_uring_complete",
    "sched:sched_switch",
];

fn perf_stat_start(pid: u32) -> anyhow::Result<(std::process::Child, PathBuf)> {
    perf_stat_events(pid, STAT_EVENTS)
}

fn perf_stat_events(pid: u32, events: &[&str]) -> anyhow::Result<(std::process::Child, PathBuf)> {
    let out = std::env::temp_dir().join(format!("ringway-perf-stat-{}.csv", std::process::id()));
    let mut cmd = std::process::Command::new("perf");
    cmd.args(["stat", "-x", ",", "-o"])
        .arg(&out)
        .arg("-p")
        .arg(pid.to_string());
    for e in events {
        cmd.arg("-e").arg(e);
    }
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    let child = cmd.spawn().context("starting perf stat")?;
    // perf attaches in a few ms; give it a bounded head start.
    std::thread::sleep(Duration::from_millis(300));
    Ok((child, out))
}

/// Stops `perf stat` (SIGINT, by its pid) and reads its counts.
fn perf_stat_finish(
    (mut child, out): (std::process::Child, PathBuf),
) -> anyhow::Result<Vec<(String, f64)>> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("perf stat did not stop on SIGINT within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&out).context("perf stat output")?;
    let _ = std::fs::remove_file(&out);
    Ok(text
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c.len() > 2).then(|| (c[2].to_string(), c[0].parse::<f64>().unwrap_or(0.0)))
        })
        .collect())
}

/// One measurement alone for `secs`, with `perf record -a -g` running beside
/// it when `perf_out` is given (the proxy's pid is printed for `perf report
/// --pid`; its workers are named `ringway-wk-N`). Returns a summary line.
pub fn profile(
    config: &Config,
    what: Profile,
    secs: f64,
    perf_out: Option<&FsPath>,
) -> anyhow::Result<String> {
    let bed = Bed::build()?;
    if what == Profile::CniAdd {
        let pods = (0..config.churn_pods)
            .map(|i| Netns::create(&format!("churn-{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        progress(format!(
            "profile: {} CNI ADDs (perf for {secs} s)",
            pods.len()
        ));
        let mut perf = start_perf(perf_out, secs)?;
        std::thread::sleep(Duration::from_millis(300));
        let mut f = Figures::new();
        cni_churn(config, &bed.scratch.0, 0, &pods, &mut f)?;
        if let Some(p) = perf.as_mut() {
            let _ = p.wait();
        }
        return Ok(summary_line(&f));
    }
    let all = scenarios(false);
    let chosen = |default: &str| -> anyhow::Result<&'static str> {
        let k = std::env::var("RINGWAY_BENCH_PROFILE_SCENARIO").unwrap_or_else(|_| default.into());
        Ok(all
            .iter()
            .find(|s| s.key == k && !s.two_nodes)
            .with_context(|| format!("no one-node scenario {k}"))?
            .key)
    };
    let key = match what {
        Profile::ConnRate => chosen("tproxy_fast")?,
        Profile::HboneStream => "hbone_1node",
        Profile::CniAdd => unreachable!("measured above"),
        Profile::Latency => chosen("tproxy_2hop")?,
    };
    let sc = all.iter().find(|s| s.key == key).expect("scenario");
    let (path, proxies) = start(config, &bed, sc)?;
    let proxy = &proxies.0[0];
    progress(format!(
        "profile: {what:?} through {} for {secs} s; proxy pid {}",
        sc.name, proxy.pid
    ));
    // Warm up (pipe pool, metrics series, the HBONE pool) before recording.
    load::conn_rate(
        &path.on_port(PORT_BASE + 1),
        config.conn_threads,
        Duration::from_millis(500),
        2_000,
    )?;
    let mut perf = start_perf(perf_out, secs)?;
    std::thread::sleep(Duration::from_millis(300));
    let c0 = proxy.cpu_seconds();
    let dur = Duration::from_secs_f64((secs - 0.6).max(0.5));
    let line = match what {
        Profile::ConnRate => {
            // Syscalls per connection, counted on the proxy alone.
            let stat = perf_stat_events(proxy.pid, CONN_STAT_EVENTS)?;
            let (m0, b0) = (machine_busy_seconds(), bench_cpu_seconds());
            let cr = load::conn_rate(
                &path.on_port(PORT_BASE + 2),
                config.conn_threads,
                dur,
                (secs * 100_000.0) as u64,
            )?;
            let c1 = proxy.cpu_seconds();
            let (m1, b1) = (machine_busy_seconds(), bench_cpu_seconds());
            let counts = perf_stat_finish(stat)?;
            let per = |s: f64| s / cr.conns as f64 * 1e6;
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
            let mut line = format!(
                "{} connections in {:.1} s through {key}: {:.0} conn/s, {} failed; proxy {:.1} CPU-µs per connection\n\
                 machine busy {:.1} of {:.1} CPU-s ({:.1} CPU-µs per connection): proxy {:.0}%, load generator + server (this process) {:.1} CPU-µs per connection = {:.0}%, the rest (other processes, softirq threads) {:.0}%",
                cr.conns,
                cr.secs,
                cr.conns as f64 / cr.secs,
                cr.failures,
                per(c1 - c0),
                m1 - m0,
                cr.secs * cpus,
                per(m1 - m0),
                (c1 - c0) / (m1 - m0) * 100.0,
                per(b1 - b0),
                (b1 - b0) / (m1 - m0) * 100.0,
                (1.0 - (c1 - c0 + b1 - b0) / (m1 - m0)) * 100.0,
            );
            line.push_str("\nper connection, proxy process only (perf stat; the warm-up and the stat's start and end are outside the count):");
            for (ev, n) in &counts {
                if *n > 0.0 {
                    line.push_str(&format!("\n  {:>8.2}  {ev}", n / cr.conns as f64));
                }
            }
            line
        }
        Profile::CniAdd => unreachable!("measured above"),
        Profile::Latency => {
            let msgs = (secs * 5_000.0) as u64;
            let stat = perf_stat_start(proxy.pid)?;
            let l = load::ping_pong(&path.on_port(PORT_BASE + 2), dur, msgs)?;
            let c1 = proxy.cpu_seconds();
            let counts = perf_stat_finish(stat)?;
            let per = |n: f64| n / l.requests as f64;
            let mut line = format!(
                "{} round trips of 64 B in {:.1} s; RTT p50 {:.1} µs, p99 {:.1} µs; proxy {:.1} CPU-µs per round trip",
                l.requests,
                l.secs,
                l.hist.value_at_quantile(0.5) as f64 / 1e3,
                l.hist.value_at_quantile(0.99) as f64 / 1e3,
                (c1 - c0) / l.requests as f64 * 1e6
            );
            line.push_str("\nper round trip (both directions, every hop of the scenario), proxy process only:");
            for (ev, n) in &counts {
                if *n > 0.0 {
                    line.push_str(&format!("\n  {:>8.2}  {ev}", per(*n)));
                }
            }
            // RINGWAY_BENCH_PROFILE_LOAD=sockperf: then sockperf's own
            // ping-pong on the same path and proxy (untraced), when installed.
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("sockperf") {
                let (tools, _) = crate::crosscheck::find_tools();
                if let Some(bin) = tools.get("sockperf") {
                    let c0 = proxy.cpu_seconds();
                    let (p50, p99) =
                        crate::crosscheck::sockperf(bin, &path.on_port(PORT_BASE + 3), secs)?;
                    line.push_str(&format!(
                        "\nsockperf ping-pong 64 B, untraced: RTT p50 {p50:.1} µs, p99 {p99:.1} µs; proxy {:.2} CPU-s in {secs} s",
                        proxy.cpu_seconds() - c0
                    ));
                }
            }
            // An idle proxy must not spin (busyPollMicros follows activity).
            let c0 = proxy.cpu_seconds();
            std::thread::sleep(Duration::from_secs(1));
            line.push_str(&format!(
                "\nidle for 1 s after the load: proxy {:.1} CPU-ms",
                (proxy.cpu_seconds() - c0) * 1e3
            ));
            line
        }
        // RINGWAY_BENCH_PROFILE_LOAD=rtt: 64 B ping-pong at 2,000/s on one
        // connection; =idle: RSS per idle connection (1,000) instead.
        Profile::HboneStream
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("rtt") =>
        {
            let l = load::latency(&path.on_port(PORT_BASE + 2), 2_000.0, 1, dur)?;
            let q = |p: f64| l.hist.value_at_quantile(p) as f64 / 1e3;
            let c1 = proxy.cpu_seconds();
            format!(
                "{} round trips (64 B): p50 {:.1} µs, p99 {:.1} µs; proxy {:.1} CPU-µs per round trip",
                l.requests, q(0.5), q(0.99), (c1 - c0) / l.requests as f64 * 1e6
            )
        }
        Profile::HboneStream
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("idle") =>
        {
            let before = proxy.rss_kib();
            let idle = load::open_idle(&path.on_port(PORT_BASE + 2), 1_000)?;
            std::thread::sleep(Duration::from_millis(500));
            let after = proxy.rss_kib();
            format!(
                "{} idle connections: proxy RSS {before:.0} -> {after:.0} KiB, {:.2} KiB each",
                idle.len(),
                (after - before) / idle.len() as f64
            )
        }
        Profile::HboneStream => {
            let t = load::throughput(&path.on_port(PORT_BASE + 2), 1, dur)?;
            let c1 = proxy.cpu_seconds();
            format!(
                "{:.2} Gbit/s over one stream for {:.1} s; proxy {:.3} CPU-s/GB",
                t.gbps(),
                t.secs,
                (c1 - c0) / (t.bytes as f64 / 1e9)
            )
        }
    };
    if let Some(p) = perf.as_mut() {
        let _ = p.wait();
    }
    drop(proxies);
    Ok(line)
}

/// CPU-seconds the whole machine spent busy so far (`/proc/stat`: every
/// state but idle and iowait, all CPUs).
fn machine_busy_seconds() -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return f64::NAN;
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let busy: u64 = f
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    busy as f64 / ticks
}

/// CPU-seconds of this process (the load generator and the server),
/// threads that ended included.
fn bench_cpu_seconds() -> f64 {
    crate::child::proc_stat_cpu_seconds(std::process::id())
}

pub(crate) fn machine() -> Vec<(String, String)> {
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

/// Starts the `ringway` program `bin` as a proxy with `args` and waits (at
/// most 20 s) until it has said hello to the node `agent` over ZDS.
pub(crate) fn start_proxy_for_agent(
    bin: &std::path::Path,
    args: &ProxyArgs,
    agent: &ringway_cni::node::AgentHandle,
) -> anyhow::Result<ProxyChild> {
    let proxy = ProxyChild::start_ringway(
        bin,
        &[("RINGWAY_DRAIN_PERIOD", "200ms".to_string())],
        args,
        Duration::from_secs(20),
    )?;
    let t = Instant::now();
    while !agent.proxies().iter().any(|p| p.ready) {
        if t.elapsed() > Duration::from_secs(20) {
            bail!(
                "the proxy never said hello to the agent: {}",
                proxy.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(proxy)
}
