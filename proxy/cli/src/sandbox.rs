//! `ringway sandbox`: a newcomer's one-command look at ringway working.
//!
//! Everything happens inside the process's own network and mount namespaces
//! (made by the test bed's `run_isolated`), so nothing touches the host's
//! interfaces, routes or files outside a temp dir, and a crashed earlier run
//! leaves nothing behind. Two virtual nodes, each with its own node agent and
//! proxy; pods are enrolled through the real CNI plugin code path (the same
//! `ringway_cni::run` the `ringway-cni` binary runs, over the agent's unix
//! socket, the agent then handing the pod to the proxy over ZDS); then a demo:
//! plaintext on one node, HBONE (mTLS) between nodes, and a policy deny.
//!
//! The terminal gets the demo's story (numbered steps and their results);
//! the components' logs go to a file named at the start and the end
//! ([`open_log_file`]), or to stderr with `--verbose`. A clean run logs no
//! warning: each node stops in order (its proxy lets go of the agent, then
//! the agent stops).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_config::{CaptureMode, MeshConfig, NoEnv, ProxySettings};
use ringway_proxy::zds_client::{Readiness, ZdsClientConfig};
use ringway_proxy::Proxy;
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{Pod, VirtualNode};

use crate::ca_service;

/// What the sandbox was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// Pods on node 1 (node 2 gets one).
    pub pods: usize,
    /// Capture mode.
    pub mode: CaptureMode,
    /// Bytes each way per demo exchange.
    pub bytes: u64,
    /// Proxy settings (embedded default or --config).
    pub settings: ProxySettings,
    /// Certificates from an in-process certificate service (`--ca-service`)
    /// instead of a CA key in each proxy.
    pub ca_service: bool,
    /// The file the components log to (`None`: the terminal, `--verbose`).
    pub log: Option<PathBuf>,
}

struct NodeRig {
    proxy: Arc<Proxy>,
    ready: Arc<Readiness>,
    agent: Option<ringway_cni::node::AgentHandle>,
    zds_stop: Arc<AtomicBool>,
    zds: Option<std::thread::JoinHandle<()>>,
    cni_socket: PathBuf,
    metrics: ringway_control::ControlServer,
    _refresher: Option<ringway_identity::Refresher>,
}

impl Drop for NodeRig {
    fn drop(&mut self) {
        // In order, so that a clean run logs no warning: the proxy's ZDS
        // client is told to stop (it will not reconnect), then the agent
        // shuts down (it closes the connection, which ends the client's
        // session), then the client is joined; the proxy goes last.
        self.zds_stop.store(true, Ordering::SeqCst);
        if let Some(a) = self.agent.take() {
            a.shutdown();
        }
        if let Some(t) = self.zds.take() {
            let _ = t.join();
        }
    }
}

const TD: &str = "cluster.local";

/// The mesh the demo runs with: every pod speaks the tunnel; port 9090 is
/// denied by policy.
fn mesh_yaml(pods: &[(&Pod, &str)]) -> String {
    let ws: Vec<_> = pods
        .iter()
        .map(|(p, node)| {
            ringway_testbed::mesh::WorkloadYaml::of_pod(
                p,
                &format!("uid-{}", p.name),
                "demo",
                "default",
                node,
            )
        })
        .collect();
    let mut s = format!(
        "trustDomain: cluster.local\n{}",
        ringway_testbed::mesh::workloads_yaml(&ws)
    );
    s.push_str(
        "policies:\n  - name: no-admin-port\n    namespace: demo\n    action: Deny\n    rules:\n      - to:\n          - ports: [9090]\n",
    );
    s
}

fn start_node(
    index: u8,
    dir: &Path,
    opts: &Options,
    ca_dir: &Path,
    mesh: Arc<ringway_config::Mesh>,
) -> anyhow::Result<NodeRig> {
    let settings = ProxySettings {
        capture_mode: opts.mode,
        ..opts.settings.clone()
    };
    let proxy = Arc::new(Proxy::start(settings.clone())?);
    let refresher = match mesh.ca_service() {
        // The product path of `ringway proxy` with `ca.address`: a key per
        // identity made here, a CSR to the certificate service.
        Some(svc) => Some(
            ca_service::enable_hbone_with_ca_service(&proxy, svc, TD)
                .with_context(|| format!("node{index}'s proxy as a certificate service client"))?
                .refresher,
        ),
        None => {
            let ca =
                ringway_identity::CaSigner::load(ca_dir.join("ca.crt"), ca_dir.join("ca.key"))?;
            let bundle = ringway_identity::TrustBundle::from_pem_files(&[] as &[&Path])?;
            let ids =
                ringway_identity::IdentityManager::new(ca, bundle, TD, Duration::from_secs(3600))?;
            proxy.set_identity(Some(Arc::new(ids)));
            None
        }
    };
    proxy.set_mesh(mesh);
    let zds_socket = dir.join(format!("node{index}-zds.sock"));
    let cni_socket = dir.join(format!("node{index}-cni.sock"));
    let agent = ringway_cni::node::NodeAgent::start(ringway_cni::node::AgentConfig {
        zds_socket: zds_socket.clone(),
        cni_socket: cni_socket.clone(),
        capture: ringway_proxy::capture_spec(&settings),
        netns_dirs: vec![PathBuf::from(ringway_testbed::ns::NETNS_RUN_DIR)],
        node_name: format!("node{index}"),
        // The mesh's workloads of the demo namespace run as `default`.
        service_accounts: vec!["demo=default".parse()?],
        ..ringway_cni::node::AgentConfig::default()
    })
    .with_context(|| format!("starting node{index}'s agent"))?;
    let ready = Arc::new(Readiness::default());
    let zds_stop = Arc::new(AtomicBool::new(false));
    let (p, r, st) = (proxy.clone(), ready.clone(), zds_stop.clone());
    let cfg = ZdsClientConfig::new(zds_socket);
    let zds = std::thread::Builder::new()
        .name(format!("ringway-zds-{index}"))
        .spawn(move || ringway_proxy::zds_client::run(p, cfg, r, st))?;
    let metrics = ringway_control::ControlServer::serve(
        format!("127.0.0.{index}:15020").parse()?,
        ringway_proxy::control::metrics_handler(proxy.metrics(), proxy.stats_handle()),
    )?;
    let t0 = Instant::now();
    while !ready.is_ready() {
        if t0.elapsed() > Duration::from_secs(20) {
            bail!("node{index}'s proxy never became ready: {}", ready.reason());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(NodeRig {
        proxy,
        ready,
        agent: Some(agent),
        zds_stop,
        zds: Some(zds),
        cni_socket,
        metrics,
        _refresher: refresher,
    })
}

/// Enrolls `pod` exactly as a container runtime would: CNI_* variables and
/// the chained config with the primary plugin's result on stdin, through the
/// plugin code the `ringway-cni` binary runs.
fn cni_add(rig: &NodeRig, pod: &Pod) -> anyhow::Result<Duration> {
    let call =
        ringway_testbed::cni::CniPod::of(pod, &format!("uid-{}", pod.name)).in_namespace("demo");
    let env: HashMap<String, String> = call
        .env("ADD", Path::new("/opt/cni/bin"))
        .into_iter()
        .collect();
    let conf = call.netconf("1.0.0", "sandbox-net", &rig.cni_socket);
    let t0 = Instant::now();
    let out = ringway_cni::run(
        &env,
        conf.as_bytes(),
        &ringway_cni::node::UnixAgent::default(),
    );
    if out.exit_code != 0 {
        bail!("CNI ADD for {} failed: {}", pod.name, out.stdout);
    }
    Ok(t0.elapsed())
}

fn exchange(
    from: &Pod,
    to: SocketAddr,
    bytes: u64,
) -> anyhow::Result<(Duration, std::net::IpAddr)> {
    let l = listen_in(to)?;
    let srv = PayloadServer::start(l, 1);
    let t0 = Instant::now();
    from.netns
        .run(|| client_exchange(connect(to, Duration::from_secs(10))?, bytes, bytes))
        .with_context(|| format!("{} -> {to}", from.name))?;
    let rep = srv
        .next_report(Duration::from_secs(30))
        .context("the demo server gave no report")?;
    rep.received.map_err(anyhow::Error::msg)?;
    Ok((t0.elapsed(), rep.peer.ip()))
}

thread_local! {
    static SERVER_POD: std::cell::RefCell<Option<Pod>> = const { std::cell::RefCell::new(None) };
}

fn listen_in(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let pod = SERVER_POD
        .with(|p| p.borrow().clone())
        .context("no server pod")?;
    Ok(pod.netns.run(|| listen(addr))?)
}

fn scrape(addr: SocketAddr) -> String {
    ringway_testbed::http::get(addr, "/metrics")
        .map(|r| r.body)
        .unwrap_or_default()
}

/// Opens the file the sandbox's components log to: `path` (created, or
/// truncated), else a new file `ringway-sandbox-XXXXXX.log` in the temporary
/// directory, mode 0600, made with `O_EXCL` (never a file or symlink that was
/// already there). Opened before the sandbox enters its own mount namespace,
/// so the file outlives the run; returns its absolute path and the file.
pub fn open_log_file(path: Option<&Path>) -> anyhow::Result<(PathBuf, std::fs::File)> {
    use std::hash::{BuildHasher, Hasher};
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(p) = path {
        let f = std::fs::File::create(p)
            .with_context(|| format!("creating the sandbox's log file {}", p.display()))?;
        return Ok((std::path::absolute(p).unwrap_or_else(|_| p.to_owned()), f));
    }
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    // RandomState's keys are random per process: a name nobody can predict.
    let random = std::collections::hash_map::RandomState::new();
    for attempt in 0u32..100 {
        let mut h = random.build_hasher();
        h.write_u32(attempt);
        let mut bits = h.finish();
        let suffix: String = (0..6)
            .map(|_| {
                let c = ALPHABET[(bits % ALPHABET.len() as u64) as usize];
                bits /= ALPHABET.len() as u64;
                char::from(c)
            })
            .collect();
        let p = std::env::temp_dir().join(format!("ringway-sandbox-{suffix}.log"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
        {
            Ok(f) => return Ok((std::path::absolute(&p).unwrap_or(p), f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("creating the log file {}", p.display()))
            }
        }
    }
    bail!(
        "no new log file name free in {} after 100 tries",
        std::env::temp_dir().display()
    )
}

/// A new directory only this user can enter, made atomically under the
/// temporary directory with a random name (`mkdtemp`): never a predictable
/// path that another user could have put a symlink at, never one removed
/// and made again.
fn private_dir() -> anyhow::Result<std::path::PathBuf> {
    let template = std::env::temp_dir().join("ringway-sandbox-XXXXXX");
    nix::unistd::mkdtemp(&template)
        .with_context(|| format!("making a private directory like {}", template.display()))
}

/// Where the components' logs are, for the demo's first and last lines.
fn logs_at(opts: &Options) -> String {
    match &opts.log {
        Some(p) => p.display().to_string(),
        None => "this terminal (--verbose)".into(),
    }
}

/// Runs the sandbox; `wait` keeps it up until `stop` is signalled.
pub fn run(opts: &Options, wait: Option<nix::sys::signal::SigSet>) -> anyhow::Result<()> {
    let t0 = Instant::now();
    println!(
        "ringway sandbox: two virtual nodes in this process's own network and mount namespaces"
    );
    println!("components' logs: {}", logs_at(opts));
    let dir = private_dir()?;
    let _cleanup = Cleanup(dir.clone());
    // A tmpfs in the sandbox's private mount namespace: the CA key and the
    // sockets vanish with the namespace, even if this process crashes.
    ringway_testbed::private_tmpfs(&dir).context("mounting the sandbox's tmpfs")?;
    let mut n1 = VirtualNode::build(1, opts.pods).context("building node 1")?;
    let n2 = VirtualNode::build(2, 1).context("building node 2")?;
    let _link = ringway_testbed::link_nodes(&n1, &n2).context("linking the nodes")?;
    let _ = &mut n1;
    // A mesh CA for this run only (never leaves the temp dir).
    ringway_identity::CaSigner::generate_for_tests(TD)
        .write_pem_files(&dir.join("ca.crt"), &dir.join("ca.key"))?;
    let mut all: Vec<(&Pod, &str)> = n1.pods.iter().map(|p| (p, "node1")).collect();
    all.push((n2.pod(0), "node2"));
    let ca = if opts.ca_service {
        Some(CaRig::start(&dir, &all).context("starting the certificate service")?)
    } else {
        None
    };
    // Each node's proxy config: in CA-service mode its own token, the
    // service's address and the public root, and never the root key.
    let node_mesh = |n: u8| -> anyhow::Result<Arc<ringway_config::Mesh>> {
        let mut yaml = mesh_yaml(&all);
        if let Some(ca) = &ca {
            yaml.push_str(&ca.proxy_yaml(n));
            let key = ca.root_key.display().to_string();
            if yaml.contains(&key) {
                bail!("node{n}'s proxy config names the root key {key}");
            }
        }
        Ok(Arc::new(MeshConfig::load_str(
            &yaml,
            &format!("sandbox mesh of node{n}"),
            &NoEnv,
        )?))
    };
    let (mesh1, mesh2) = (node_mesh(1)?, node_mesh(2)?);
    println!("\n1. The mesh: every pod of namespace demo runs as spiffe://{TD}/ns/demo/sa/default and speaks HBONE; policy demo/no-admin-port denies port 9090");
    if let Some(ca) = &ca {
        for m in [&mesh1, &mesh2] {
            if m.ca().is_some() {
                bail!("a proxy was given a CA key (ca.keyFile) in CA-service mode");
            }
        }
        println!(
            "   certificates: from the certificate service at {} (root key only there, {}; the proxies' configs name no key)",
            ca.addr,
            ca.root_key.display()
        );
    } else {
        println!("   certificates: signed in each proxy with a local test CA key (the weaker trust model; --ca-service for a certificate service)");
    }
    let rig1 = start_node(1, &dir, opts, &dir, mesh1.clone())?;
    let rig2 = start_node(2, &dir, opts, &dir, mesh2)?;
    println!(
        "\n2. Two nodes, each with a node agent and a proxy joined over ZDS: {} worker(s) per proxy on {}, both ready ({:.0} ms)",
        opts.settings.effective_workers(),
        rig1.proxy.backend(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "\n3. Pods enrolled as a container runtime does, through the CNI plugin: the agent installs the pod's capture rules ({}) and hands the pod to the proxy",
        match opts.mode {
            CaptureMode::Tproxy => "tproxy",
            CaptureMode::Redirect => "redirect",
        }
    );
    for p in &n1.pods {
        let took = cni_add(&rig1, p)?;
        println!(
            "   CNI ADD {:<9} {:<12} node1  captured in {:.1} ms",
            p.name,
            p.ipv4,
            took.as_secs_f64() * 1e3
        );
    }
    let took = cni_add(&rig2, n2.pod(0))?;
    println!(
        "   CNI ADD {:<9} {:<12} node2  captured in {:.1} ms",
        n2.pod(0).name,
        n2.pod(0).ipv4,
        took.as_secs_f64() * 1e3
    );

    let client = n1.pod(0).clone();
    println!(
        "\n4. Traffic from {} ({} bytes each way, checked): the apps know nothing of the proxy and see the client's own address",
        client.name, opts.bytes
    );
    // Plaintext on one node (same-node fast path).
    let local = n1.pod(1).clone();
    SERVER_POD.with(|p| *p.borrow_mut() = Some(local.clone()));
    let to = SocketAddr::new(local.ip(false), 8080);
    let (took, seen) = exchange(&client, to, opts.bytes)?;
    println!(
        "   plaintext  {} -> {to}: {} bytes each way in {:.1} ms; the app saw {seen}",
        client.name,
        opts.bytes,
        took.as_secs_f64() * 1e3
    );
    if seen != client.ip(false) {
        bail!("the app did not see the client's real address");
    }
    // HBONE between nodes.
    let remote = n2.pod(0).clone();
    SERVER_POD.with(|p| *p.borrow_mut() = Some(remote.clone()));
    for v6 in [false, true] {
        let to = SocketAddr::new(remote.ip(v6), 8080);
        let (took, seen) = exchange(&client, to, opts.bytes)?;
        println!(
            "   HBONE/mTLS {} -> {to}: {} bytes each way in {:.1} ms; the app saw {seen}",
            client.name,
            opts.bytes,
            took.as_secs_f64() * 1e3
        );
        if seen != client.ip(v6) {
            bail!("the app did not see the client's real address");
        }
    }
    // Policy deny: port 9090 of the demo namespace.
    println!("\n5. A connection the policy denies never reaches the app");
    let denied = SocketAddr::new(remote.ip(false), 9090);
    let l = remote.netns.run(|| listen(denied))?;
    l.set_nonblocking(true)?;
    let outcome = client.netns.run(|| -> std::io::Result<usize> {
        let mut s = connect(denied, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let _ = s.write_all(b"hello?");
        let mut b = [0u8; 16];
        s.read(&mut b)
    });
    let reached = l.accept().is_ok();
    match (&outcome, reached) {
        (Ok(0) | Err(_), false) => println!(
            "   policy     {} -> {denied}: denied by policy demo/no-admin-port ({}); the app never saw it",
            client.name,
            match &outcome {
                Err(e) => e.to_string(),
                Ok(_) => "closed".into(),
            }
        ),
        _ => bail!("the denied connection reached the app: {outcome:?}"),
    }
    let body = scrape(rig1.metrics.addr);
    let mtls = body
        .lines()
        .filter(|l| l.starts_with("istio_tcp_connections_opened_total") && l.contains("mutual_tls"))
        .count();
    println!("\n6. What an operator sees");
    println!(
        "   metrics: node1 {} / node2 {} (GET /metrics inside the sandbox); {} mutual_tls series on node1",
        rig1.metrics.addr, rig2.metrics.addr, mtls
    );
    if mtls == 0 {
        bail!("no mutual_tls connection in node1's metrics");
    }
    if !rig1.ready.is_ready() || !rig2.ready.is_ready() {
        bail!("a proxy is not ready after the demo");
    }
    if let Some(ca) = &ca {
        let (issued, refused) = ca.counts();
        println!(
            "   certificate service: {issued} certificate(s) issued, {refused} request(s) refused"
        );
        if issued == 0 || refused != 0 {
            bail!("the certificate service issued {issued} and refused {refused} certificate(s)");
        }
        const ROUNDS: usize = 200;
        let (p50, p99) = ca.measure(&mesh1, ROUNDS)?;
        println!(
            "   CSR round trip (key + CSR + TLS call, {ROUNDS} issuances): p50 {:.2} ms, p99 {:.2} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    if let Some(set) = wait {
        println!("\nsandbox up; Ctrl-C to stop");
        let _ = set.wait();
    }
    let t_stop = Instant::now();
    drop(rig1);
    drop(rig2);
    drop(ca);
    println!(
        "\n7. Stopped in order ({:.0} ms): on each node the proxy let go of its agent, the agent stopped (pods and rules stay, as on a real node), then the proxy",
        t_stop.elapsed().as_secs_f64() * 1e3
    );
    println!(
        "\nsandbox done in {:.1} s: everything lived in this process's own namespaces and is gone with it",
        t0.elapsed().as_secs_f64()
    );
    if opts.log.is_some() {
        println!("components' logs: {}", logs_at(opts));
    }
    Ok(())
}

struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The sandbox's tokens: no API server here, so one token per node proxy,
/// standing for `ringway-system/ringway-proxy` bound to the pod
/// `proxy-nodeN`; any other token is refused as a TokenReview would.
struct SandboxReviewer(HashMap<String, ringway_ca::Caller>);

impl ringway_ca::TokenReviewer for SandboxReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
    ) -> ringway_ca::authn::BoxFuture<'a, Result<ringway_ca::Caller, ringway_ca::Status>> {
        Box::pin(async move {
            self.0.get(token).cloned().ok_or_else(|| {
                ringway_ca::Status::new(
                    ringway_ca::Code::Unauthenticated,
                    "token_rejected",
                    "the token is not one of the sandbox's node proxy tokens",
                )
            })
        })
    }
}

/// The node proxies' service account (as the Helm chart names it).
const PROXY_NS: &str = "ringway-system";
const PROXY_SA: &str = "ringway-proxy";
/// The name the certificate service's serving certificate is issued for.
const CA_SERVER_NAME: &str = "ringway-ca.ringway-system.svc";

/// `ringway ca` in-process: the only holder of the root key.
struct CaRig {
    service: Arc<ringway_ca::CaService>,
    addr: SocketAddr,
    /// The public root, the only CA file the proxies get.
    root_cert: PathBuf,
    /// The root key, read by the service only.
    root_key: PathBuf,
    /// Node N's token file at `[N - 1]`.
    tokens: Vec<PathBuf>,
    /// Stopped when the rig is dropped.
    _server: ringway_ca::server::Server,
}

impl CaRig {
    /// Starts the service on 127.0.0.1 of the sandbox's own netns (where
    /// both nodes' proxies run), with the pods of `all` and the two proxy
    /// pods in its directory.
    fn start(dir: &Path, all: &[(&Pod, &str)]) -> anyhow::Result<CaRig> {
        let ca_dir = dir.join("ca-service");
        std::fs::create_dir_all(&ca_dir)?;
        let (root_cert, root_key) = (ca_dir.join("root.crt"), ca_dir.join("root.key"));
        let root = ringway_identity::CaSigner::generate_for_tests(TD);
        root.write_pem_files(&root_cert, &root_key)?;
        // The proxies' copy of the public root, outside the service's dir.
        let public_root = dir.join("mesh-root.crt");
        std::fs::write(&public_root, root.cert_pem())?;
        drop(root);
        // The service loads its root from files, as `ringway ca` does.
        let signer = Arc::new(
            ringway_identity::CaSigner::load(&root_cert, &root_key)
                .context("loading the sandbox's root for the certificate service")?,
        );
        let serving = signer.issue_dns_for_tests(CA_SERVER_NAME);
        let (tls_cert, tls_key) = (ca_dir.join("tls.crt"), ca_dir.join("tls.key"));
        let chain: String = serving
            .chain
            .iter()
            .map(|c| pem::encode(&pem::Pem::new("CERTIFICATE", c.to_vec())))
            .collect();
        std::fs::write(&tls_cert, chain)?;
        let label = match &serving.key {
            rustls_pki_types::PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
            rustls_pki_types::PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
            _ => "PRIVATE KEY",
        };
        std::fs::write(
            &tls_key,
            pem::encode(&pem::Pem::new(label, serving.key.secret_der().to_vec())),
        )?;
        let tls = ringway_ca::server::tls_config_from_files(&tls_cert, &tls_key)
            .context("loading the certificate service's serving certificate")?;

        let pods = ringway_ca::pods::StaticPods::default();
        for (p, node) in all {
            pods.put(ringway_ca::PodView {
                namespace: "demo".into(),
                name: p.name.clone(),
                uid: format!("uid-{}", p.name),
                node: (*node).to_owned(),
                service_account: "default".into(),
                live: true,
                terminating: false,
            });
        }
        let mut callers = HashMap::new();
        let mut tokens = Vec::new();
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        for n in 1..=2u8 {
            let pod = format!("proxy-node{n}");
            let uid = format!("uid-{pod}");
            pods.put(ringway_ca::PodView {
                namespace: PROXY_NS.into(),
                name: pod.clone(),
                uid: uid.clone(),
                node: format!("node{n}"),
                service_account: PROXY_SA.into(),
                live: true,
                terminating: false,
            });
            let token = format!("sandbox-node{n}-{}-{nonce:x}", std::process::id());
            callers.insert(
                token.clone(),
                ringway_ca::Caller {
                    namespace: PROXY_NS.into(),
                    service_account: PROXY_SA.into(),
                    pod_name: Some(pod),
                    pod_uid: Some(uid),
                    node_name: Some(format!("node{n}")),
                },
            );
            let file = dir.join(format!("node{n}.token"));
            std::fs::write(&file, token)?;
            tokens.push(file);
        }
        let service = Arc::new(ringway_ca::CaService::new(
            ringway_ca::Policy {
                trust_domain: TD.into(),
                node_proxy: (PROXY_NS.into(), PROXY_SA.into()),
            },
            // The sandbox's CSR round-trip measurement adds a few hundred
            // calls from node1's proxy.
            ringway_ca::Limits {
                rate_per_caller: 1000.0,
                burst_per_caller: 1000.0,
                ..ringway_ca::Limits::default()
            },
            Arc::new(SandboxReviewer(callers)),
            Arc::new(pods),
            vec![signer],
        )?);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sandbox-ca")
            .enable_all()
            .build()
            .context("starting the certificate service's runtime")?;
        let server = ringway_ca::server::Server::start(
            rt,
            "127.0.0.1:0".parse()?,
            tls,
            service.clone(),
            ringway_ca::server::ServerLimits::default(),
        )
        .context("binding the certificate service")?;
        Ok(CaRig {
            service,
            addr: server.addr(),
            root_cert: public_root,
            root_key,
            tokens,
            _server: server,
        })
    }

    /// Node `n`'s `ca:` section: the service's address, the public root and
    /// the node's token; no key.
    fn proxy_yaml(&self, n: u8) -> String {
        format!(
            "ca:\n  address: \"{}\"\n  serverName: {CA_SERVER_NAME}\n  rootCertFile: {}\n  tokenFile: {}\n",
            self.addr,
            self.root_cert.display(),
            self.tokens[usize::from(n - 1)].display()
        )
    }

    /// (issued, refused) so far, from `ringway_ca_requests_total`.
    fn counts(&self) -> (u64, u64) {
        let (mut issued, mut refused) = (0u64, 0u64);
        for line in self.service.encode_metrics().lines() {
            let Some(rest) = line.strip_prefix("ringway_ca_requests_total{") else {
                continue;
            };
            let n = rest
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0) as u64;
            if rest.contains("code=\"ok\"") {
                issued += n;
            } else {
                refused += n;
            }
        }
        (issued, refused)
    }

    /// CSR round trips as node1's proxy makes them (a P-256 key, a CSR, the
    /// call over TLS, the chain checked): `count` issuances of `identity`,
    /// (p50, p99).
    fn measure(
        &self,
        mesh: &ringway_config::Mesh,
        count: usize,
    ) -> anyhow::Result<(Duration, Duration)> {
        use ringway_identity::CertSource;
        let svc = mesh
            .ca_service()
            .context("no certificate service in node1's mesh")?;
        let bundle = ringway_identity::TrustBundle::from_pem_files(&[&svc.root_cert_file])?;
        let tls = ringway_ca::CaClient::tls_config(bundle.roots())
            .map_err(|e| anyhow::anyhow!("the certificate service's TLS: {e}"))?;
        let name = rustls_pki_types::ServerName::try_from(svc.server_name.clone())?;
        let source = ringway_ca::client::RemoteSource::new(
            ringway_ca::CaClient::new(self.addr, name, tls),
            &svc.token_file,
        )?;
        let id = ringway_identity::parse_spiffe(&format!("spiffe://{TD}/ns/demo/sa/default"), TD)?;
        let mut took = Vec::with_capacity(count);
        for _ in 0..count {
            let now = std::time::SystemTime::now();
            let t0 = Instant::now();
            source
                .issue(&id, now, now + Duration::from_secs(3600))
                .map_err(|e| anyhow::anyhow!("a measured CSR was refused: {e}"))?;
            took.push(t0.elapsed());
        }
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
        Ok((at(0.5), at(0.99)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each sandbox gets a fresh directory of its own, mode 0700, even when
    /// a symlink sits at the old predictable path.
    #[test]
    fn adversarial_the_sandbox_directory_is_private_and_new() {
        use std::os::unix::fs::PermissionsExt;
        let predictable =
            std::env::temp_dir().join(format!("ringway-sandbox-{}", std::process::id()));
        let _ = std::fs::remove_file(&predictable);
        std::os::unix::fs::symlink("/", &predictable).unwrap();
        let (a, b) = (private_dir().unwrap(), private_dir().unwrap());
        assert_ne!(a, b);
        for d in [&a, &b] {
            let meta = std::fs::symlink_metadata(d).unwrap();
            assert!(meta.is_dir() && !meta.file_type().is_symlink());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
            assert_ne!(d, &predictable);
            std::fs::remove_dir(d).unwrap();
        }
        std::fs::remove_file(&predictable).unwrap();
    }
}
