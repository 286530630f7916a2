//! The bed the scenarios run on: two virtual nodes joined by a veth, a
//! throwaway mesh CA on the bench's private tmpfs, and what starts a
//! scenario's proxies (capture rules, the `ringway` children, HAProxy) and
//! hands back the path the load generator drives. Also the node agent's
//! side of a pod's enrollment: a CNI ADD as a container runtime makes it,
//! and a proxy started for an agent.
//!
//! Node 1 holds pods 0 -> 1 (direct, HAProxy) and 2 -> 3 (ringway); node 2
//! holds pod 0 (direct from node 1's pod 0) and pod 1 (ringway from node
//! 1's pod 2). Below the measurements; above the scenario catalogue, the
//! proxy children and the load generator's paths.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_config::CaptureMode;
use ringway_testbed::ns::Netns;
use ringway_testbed::{NodeLink, Pod, VirtualNode};

use crate::child::{haproxy_binary, haproxy_config, ProxyArgs, ProxyChild};
use crate::config::Config;
use crate::host::{nofile_soft, Scratch};
use crate::load::Path;
use crate::scenario::{Kind, Scenario};

/// The trust domain of the bench's throwaway mesh CA.
pub const TRUST_DOMAIN: &str = "cluster.local";

/// The first server port; every measurement takes the next one
/// ([`next_port`]), so one measurement's TIME_WAIT never meets the next.
pub const PORT_BASE: u16 = 20_000;

/// A proxy child's metrics endpoint, from the node's namespace it runs in.
pub const PROXY_METRICS: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 15020);
const PORT_SPAN: u16 = 999;

/// The next server port after `port`, wrapping within the span HAProxy
/// listens on.
pub fn next_port(port: &mut u16) -> u16 {
    *port += 1;
    if *port > PORT_BASE + PORT_SPAN {
        *port = PORT_BASE + 1;
    }
    *port
}

/// The mesh configuration of the HBONE scenarios: a CA and the pods as tunnel
/// workloads, the fast path off (so one node's traffic also goes through
/// 15008, as the reference mesh is measured).
pub fn hbone_yaml(ca_dir: &FsPath, pods: &[(&Pod, &str)]) -> String {
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

/// The two virtual nodes, their link, the CA and the HBONE configuration.
#[derive(Debug)]
pub struct Bed {
    /// Node 1: pods 0 -> 1 direct, 2 -> 3 through ringway.
    n1: VirtualNode,
    /// Node 2: pod 0 direct from node 1's pod 0, pod 1 through ringway from
    /// node 1's pod 2.
    n2: VirtualNode,
    _link: NodeLink,
    /// The HBONE configuration file.
    hbone_config: PathBuf,
    /// The private tmpfs holding the CA, the configuration files and the
    /// agents' sockets.
    pub scratch: Scratch,
}

impl Bed {
    /// Builds it (inside the bench's isolated namespaces).
    pub fn build() -> anyhow::Result<Bed> {
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

    /// The two nodes' own namespaces (where the bridges and the link are).
    pub fn nodes_netns(&self) -> [&Netns; 2] {
        [&self.n1.node, &self.n2.node]
    }

    /// The HBONE configuration file (the CA and the pods as tunnel workloads).
    pub fn hbone_config_path(&self) -> &FsPath {
        &self.hbone_config
    }

    /// The path from `client` to `server` on the first port.
    pub fn path(client: &Pod, server: &Pod) -> Path {
        let addr = SocketAddr::new(server.ip(false), PORT_BASE);
        Path {
            client: client.netns.clone(),
            server: server.netns.clone(),
            listen: addr,
            connect: addr,
        }
    }

    /// (client, server) of a scenario.
    pub fn pods(&self, sc: &Scenario) -> (&Pod, &Pod) {
        match (sc.kind, sc.two_nodes) {
            (Kind::Direct | Kind::Haproxy, false) => (self.n1.pod(0), self.n1.pod(1)),
            (Kind::Direct | Kind::Haproxy, true) => (self.n1.pod(0), self.n2.pod(0)),
            (Kind::Ringway { .. }, false) => (self.n1.pod(2), self.n1.pod(3)),
            (Kind::Ringway { .. }, true) => (self.n1.pod(2), self.n2.pod(1)),
        }
    }
}

/// The proxies of a scenario together: CPU and RSS are their sums (one
/// process carries both hops on one node; two nodes have one proxy each).
#[derive(Debug)]
pub struct Proxies(pub Vec<ProxyChild>);

impl Proxies {
    /// Their CPU-seconds so far; `None` without a proxy.
    pub fn cpu(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|p| p.cpu_seconds()).sum())
    }

    /// Their RSS, KiB; `None` without a proxy.
    pub fn rss_kib(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|p| p.rss_kib()).sum())
    }

    /// Their anonymous resident set, summed, KiB.
    pub fn rss_anon_kib(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.0.iter().map(|p| p.rss_anon_kib()).sum())
    }

    /// Their last log lines.
    pub fn log_tail(&self) -> String {
        self.0
            .iter()
            .map(|p| p.log_tail())
            .collect::<Vec<_>>()
            .join(" / ")
    }
}

/// The proxy's environment for a capture mode (and the fast path, unless
/// its YAML sets it).
pub fn ringway_env(mode: CaptureMode, fast_path: Option<bool>) -> Vec<(&'static str, String)> {
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

/// The production capture rules of `mode` in each pod.
pub fn capture(pods: &[&Pod], mode: CaptureMode) -> anyhow::Result<()> {
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

/// A pod as the proxy's `--pod` flag names it.
pub fn pod_arg(p: &Pod) -> (String, PathBuf) {
    (p.name.clone(), p.netns.path().to_path_buf())
}

/// Starts what carries a scenario's traffic; returns the path the load
/// generator uses and the proxies to measure.
pub fn start(config: &Config, bed: &Bed, sc: &Scenario) -> anyhow::Result<(Path, Proxies)> {
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
            let listening = ringway_testbed::wait_until(Duration::from_secs(10), || {
                path.client
                    .run(|| {
                        std::net::TcpStream::connect_timeout(&probe, Duration::from_millis(200))
                    })
                    .is_ok()
            });
            if !listening {
                bail!("haproxy not listening after 10 s:\n{}", p.log_tail());
            }
            vec![p]
        }
    };
    Ok((path, Proxies(proxies)))
}

/// HAProxy's maxconn: what the fd limit lets it hold. HAProxy refuses to
/// start unless it can have 2 fds per connection plus one per listening port
/// (1,000 here) and a few of its own.
pub fn haproxy_maxconn() -> usize {
    (nofile_soft().saturating_sub(u64::from(PORT_SPAN) + 1 + 200) / 2) as usize
}

/// The `/metrics` page at `addr`, parsed by the test bed's parser: an error
/// naming the endpoint when it does not answer, answers another status than
/// 200 or does not parse. Never an empty page in its place: a down endpoint
/// must not read as zero.
pub fn scrape(addr: SocketAddr) -> anyhow::Result<ringway_testbed::prom::Metrics> {
    ringway_testbed::http::scrape_metrics(addr)
        .with_context(|| format!("scraping http://{addr}/metrics"))
}

/// One HTTP/1.1 GET with `Connection: close`; the body of a 200.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Vec<u8>> {
    let r = ringway_testbed::http::get(addr, path)?;
    if r.status != 200 {
        return Err(std::io::Error::other(format!(
            "GET {path}: status {}",
            r.status
        )));
    }
    Ok(r.body.into_bytes())
}

/// One CNI ADD for churn pod `i` as a container runtime makes it: `CNI_*`
/// variables and the chained config with the primary plugin's result, through
/// the plugin code over the agent's socket. Times the whole call.
pub fn cni_add(agent_socket: &FsPath, ns: &Netns, i: usize) -> anyhow::Result<Duration> {
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

/// Starts the `ringway` program `bin` as a proxy with `args` and waits (at
/// most 20 s) until it has said hello to the node `agent` over ZDS.
pub fn start_proxy_for_agent(
    bin: &FsPath,
    args: &ProxyArgs,
    agent: &ringway_cni::node::AgentHandle,
) -> anyhow::Result<ProxyChild> {
    let proxy = ProxyChild::start_ringway(
        bin,
        &[("RINGWAY_DRAIN_PERIOD", "200ms".to_string())],
        args,
        Duration::from_secs(20),
    )?;
    if !ringway_testbed::wait_until(Duration::from_secs(20), || {
        agent.proxies().iter().any(|p| p.ready)
    }) {
        bail!(
            "the proxy never said hello to the agent: {}",
            proxy.log_tail()
        );
    }
    Ok(proxy)
}
