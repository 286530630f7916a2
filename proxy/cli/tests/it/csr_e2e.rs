//! The certificate service end to end, as the cluster runs it: separate
//! processes. `ringway ca` serves on 127.0.0.1 of the test's own network
//! namespace and reaches the test's fake Kubernetes API server
//! (`ringway_testbed::kube_api::FakeApiServer::serve_http`) through a
//! kubeconfig: TokenReviews of the node proxies' tokens, and the pods it
//! watches. Two virtual nodes, each with a `ringway agent` and a `ringway
//! proxy` in CA-client mode (`ca: {address, serverName, rootCertFile,
//! tokenFile}`: the public root and a token, never a key); pods are enrolled
//! through the `ringway-cni` plugin binary. Traffic between the nodes is
//! HBONE with certificates the service issued.

use ringway_testbed::traffic::ReadNoIntr;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::support;

use ringway_testbed::http::scrape;
use ringway_testbed::kube_api::{fixtures, FakeApiServer, FakePod};
use ringway_testbed::traffic::{connect, listen, pattern_fill, PayloadServer, CLIENT_SEED};
use ringway_testbed::{prom, run_isolated, wait_until, Pod, TempDir, VirtualNode};
use rustls_pki_types::CertificateDer;
use support::{ready, Proc};

const TD: &str = "cluster.local";
const PROXY_NS: &str = "ringway-system";
const PROXY_SA: &str = "ringway-proxy";
const CA_NAME: &str = "ringway-ca.ringway-system.svc";
const AUDIENCE: &str = "istio-ca";
const CA_ADDR: &str = "127.0.0.1:15012";
const CA_METRICS: &str = "127.0.0.1:15014";
const DEFAULT_ID: &str = "spiffe://cluster.local/ns/demo/sa/default";
const LATE_ID: &str = "spiffe://cluster.local/ns/demo/sa/late";
/// The pod that joins late (its own service account, `late`).
const LATE_POD: &str = "n1-pod1";
/// How long anything here may take to happen (a process to start, a
/// transfer, a report): generous, as a loaded 2-core machine needs; no test
/// asserts that something happens sooner.
const PATIENCE: Duration = Duration::from_secs(60);
/// The lifetime (s) of the short-lived leaves of the outage and rotation
/// drills: their renewal falls due at half of it, 15 s after issuance. What
/// must happen before a renewal (an overlap shown, an exchange on the
/// certificate in hand) takes a few seconds (the rotation drill names a
/// renewal that came too early; the outage drill reads its baseline after
/// the outage starts); what must happen after one is
/// waited for (the event itself, [`RENEWAL_PATIENCE`]), never timed.
const LEAF_SECS: u64 = 30;
/// How long a renewal may take to be attempted or to succeed: the leaf's
/// half-life, plus the refresher's backoff after failures (1 s doubling to
/// 60 s, plus up to a quarter), plus slack.
const RENEWAL_PATIENCE: Duration = Duration::from_secs(LEAF_SECS / 2 + 75 + 45);

/// A signing root on disk, as the CA's Secret mounts it.
struct Root {
    cert: PathBuf,
    key: PathBuf,
}

/// One virtual node's processes.
struct Node {
    index: u8,
    agent: Proc,
    proxy: Proc,
    cni_socket: PathBuf,
    config: PathBuf,
}

impl Node {
    fn metrics(&self) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, self.index)), 15020)
    }
}

/// The cluster: the fake API server, the CA's files, two virtual nodes.
struct Bed {
    /// `ca.address` in the proxies' configuration.
    ca_address: String,
    dir: TempDir,
    _rt: tokio::runtime::Runtime,
    api: FakeApiServer,
    kubeconfig: PathBuf,
    /// The CA's serving certificate and key (issued by the first root).
    tls: (PathBuf, PathBuf),
    /// The roots, oldest first; the first is the mesh root the proxies get.
    roots: Vec<Root>,
    /// The public copies of the roots (no key).
    public_roots: Vec<PathBuf>,
    /// How many of them (the first ones) the proxies trust: all by default.
    trusted: usize,
    /// The proxies' `rootCertFile` (the mesh root's ConfigMap): the first
    /// root's certificate until a test edits it.
    root_cert: PathBuf,
    plugin: PathBuf,
    n1: VirtualNode,
    n2: VirtualNode,
    _link: ringway_testbed::NodeLink,
}

impl Bed {
    /// `roots` signing roots (made now, each newer than the last); node 1
    /// with two pods (`n1-pod0` of `demo/default`, [`LATE_POD`] of
    /// `demo/late`), node 2 with one (`n2-pod0`, `demo/default`). The API
    /// server knows the node proxies' pods and `n1-pod0` and `n2-pod0`.
    fn new(name: &str, roots: usize) -> Bed {
        let dir = TempDir::new(name);
        let plugin = dir.join("ringway-cni");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ringway"), &plugin).unwrap();
        let ca_dir = dir.join("ca-secret");
        std::fs::create_dir_all(&ca_dir).unwrap();
        let mut signers = Vec::new();
        let mut root_files = Vec::new();
        let mut public_roots = Vec::new();
        for i in 0..roots {
            // Each newer than the last (the service signs with the newest).
            let now = SystemTime::now();
            let s = ringway_identity::CaSigner::generate_for_tests_with_validity(
                TD,
                now - Duration::from_secs(3600 - 60 * i as u64),
                now + Duration::from_secs(10 * 365 * 86400),
            );
            let r = Root {
                cert: ca_dir.join(format!("root{i}.crt")),
                key: ca_dir.join(format!("root{i}.key")),
            };
            s.write_pem_files(&r.cert, &r.key).unwrap();
            let public = dir.join(format!("mesh-root{i}.crt"));
            std::fs::write(&public, s.cert_pem()).unwrap();
            public_roots.push(public);
            root_files.push(r);
            signers.push(s);
        }
        // The service's serving certificate, from the first root.
        let root_cert = dir.join("root-cert.pem");
        std::fs::write(&root_cert, signers[0].cert_pem()).unwrap();
        let serving = signers[0].issue_dns_for_tests(CA_NAME);
        let tls = (ca_dir.join("tls.crt"), ca_dir.join("tls.key"));
        serving.write_pem_files(&tls.0, &tls.1).unwrap();
        drop(signers);

        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let api_addr = listener.local_addr().unwrap();
        let api = FakeApiServer::serve_http(rt.handle(), listener).unwrap();
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{api_addr}\nusers:\n- name: ca\n  user:\n    token: the-ca-service-account-token\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: ca\n    namespace: {PROXY_NS}\ncurrent-context: fake\n"
            ),
        )
        .unwrap();

        let n1 = VirtualNode::build(1, 2).unwrap();
        let n2 = VirtualNode::build(2, 1).unwrap();
        let link = ringway_testbed::link_nodes(&n1, &n2).unwrap();
        let bed = Bed {
            ca_address: CA_ADDR.into(),
            dir,
            _rt: rt,
            api,
            kubeconfig,
            tls,
            roots: root_files,
            trusted: public_roots.len(),
            public_roots,
            root_cert,
            plugin,
            n1,
            n2,
            _link: link,
        };
        for n in 1..=2u8 {
            let (pod, uid, node) = (
                format!("proxy-node{n}"),
                format!("uid-proxy-node{n}"),
                format!("node{n}"),
            );
            bed.api.apply_pod(
                FakePod::new(&uid, PROXY_NS, &pod, &node)
                    .service_account(PROXY_SA)
                    .running(&[])
                    .json(),
            );
            bed.api.add_token(
                &bed.token(n),
                fixtures::service_account_user(PROXY_NS, PROXY_SA, Some((&pod, &uid, &node))),
                &[AUDIENCE],
            );
            std::fs::write(bed.token_file(n), bed.token(n)).unwrap();
        }
        bed.api_pod(bed.n1.pod(0), "node1", "default");
        bed.api_pod(bed.n2.pod(0), "node2", "default");
        bed
    }

    fn token(&self, n: u8) -> String {
        format!("projected-token-of-proxy-node{n}")
    }

    fn token_file(&self, n: u8) -> PathBuf {
        self.dir.join(format!("node{n}.token"))
    }

    /// Pod `pod` of namespace `demo` as the API server has it.
    fn api_pod(&self, pod: &Pod, node: &str, sa: &str) {
        self.api.apply_pod(
            FakePod::new(&format!("uid-{}", pod.name), "demo", &pod.name, node)
                .service_account(sa)
                .running(&[&pod.ipv4.to_string(), &pod.ipv6.to_string()])
                .json(),
        );
    }

    fn late(&self) -> &Pod {
        self.n1.pod(1)
    }

    /// `ringway ca` signing with `roots` (indices into [`Bed::roots`]),
    /// granting at most `max_lifetime_secs`; waits until it is ready (its
    /// pod cache listed the API server's pods).
    fn start_ca(&self, roots: &[usize], max_lifetime_secs: u64) -> Proc {
        self.start_ca_serving(roots, max_lifetime_secs, &self.tls)
    }

    /// [`Bed::start_ca`] presenting the serving certificate and key in
    /// `tls` (PEM files).
    fn start_ca_serving(
        &self,
        roots: &[usize],
        max_lifetime_secs: u64,
        tls: &(PathBuf, PathBuf),
    ) -> Proc {
        let log = self.dir.join(format!("ca-{}.log", now_ms()));
        let mut c = Command::new(env!("CARGO_BIN_EXE_ringway"));
        c.env_clear()
            .env("KUBECONFIG", &self.kubeconfig)
            .args(["--log-format", "text", "--log", "info", "ca"])
            .args(["--listen", CA_ADDR, "--metrics-addr", CA_METRICS])
            .arg("--tls-cert")
            .arg(&tls.0)
            .arg("--tls-key")
            .arg(&tls.1)
            .args(["--max-lifetime-secs", &max_lifetime_secs.to_string()]);
        for &i in roots {
            c.arg("--root-cert")
                .arg(&self.roots[i].cert)
                .arg("--root-key")
                .arg(&self.roots[i].key);
        }
        let child = c
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let ca = Proc(child);
        let addr: SocketAddr = CA_METRICS.parse().unwrap();
        assert!(
            wait_until(PATIENCE, || ready(addr)),
            "ringway ca never became ready:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        ca
    }

    /// Node `n`'s agent and proxy; the proxy's config names the service,
    /// the public root(s) and the node's token file.
    fn start_node(&self, n: u8) -> Node {
        let zds = self.dir.join(format!("node{n}-zds.sock"));
        let cni_socket = self.dir.join(format!("node{n}-cni.sock"));
        let agent_log = self.dir.join(format!("agent{n}.log"));
        let agent = support::node_agent_command(&self.dir, n, &agent_log)
            .args(["--pod-service-account", &format!("demo/{LATE_POD}=late")])
            .spawn()
            .unwrap();
        let agent = Proc(agent);
        assert!(
            wait_until(PATIENCE, || cni_socket.exists() && zds.exists()),
            "node{n}'s agent sockets never appeared"
        );
        let config = self.dir.join(format!("node{n}.yaml"));
        std::fs::write(&config, self.proxy_config(n)).unwrap();
        let proxy_log = self.dir.join(format!("proxy{n}.log"));
        let proxy = support::node_proxy_command(&self.dir, n, &config, &proxy_log)
            .spawn()
            .unwrap();
        let proxy = Proc(proxy);
        let addr = ready_at(n);
        assert!(
            wait_until(PATIENCE, || ready(addr)),
            "node{n}'s proxy never became ready:\n{}",
            std::fs::read_to_string(&proxy_log).unwrap_or_default()
        );
        Node {
            index: n,
            agent,
            proxy,
            cni_socket,
            config,
        }
    }

    /// The mesh (every pod speaks HBONE) and the `ca:` section of node
    /// `n`'s proxy: the service, the mesh root and the newer roots as a
    /// bundle, the node's token. No key.
    fn proxy_config(&self, n: u8) -> String {
        let pods = [
            (self.n1.pod(0), "node1", "default"),
            (self.late(), "node1", "late"),
            (self.n2.pod(0), "node2", "default"),
        ];
        let ws: Vec<_> = pods
            .iter()
            .map(|(p, node, sa)| {
                ringway_testbed::mesh::WorkloadYaml::of_pod(
                    p,
                    &format!("uid-{}", p.name),
                    "demo",
                    sa,
                    node,
                )
            })
            .collect();
        let bundle: Vec<String> = self.public_roots[1..self.trusted]
            .iter()
            .map(|p| format!("\"{}\"", p.display()))
            .collect();
        format!(
            "trustDomain: {TD}\n{}ca:\n  address: \"{}\"\n  serverName: {CA_NAME}\n  rootCertFile: \"{}\"\n  bundleFiles: [{}]\n  tokenFile: \"{}\"\n",
            ringway_testbed::mesh::workloads_yaml(&ws),
            self.ca_address,
            self.root_cert.display(),
            bundle.join(", "),
            self.token_file(n).display()
        )
    }

    /// CNI ADD of `pod` on `node`, through the plugin binary as a runtime
    /// runs it; panics unless it succeeds.
    fn cni_add(&self, node: &Node, pod: &Pod) {
        let call = ringway_testbed::cni::CniPod::of(pod, &format!("uid-{}", pod.name))
            .in_namespace("demo");
        let out = call
            .run_plugin_binary(&self.plugin, "ADD", self.dir.path(), &node.cni_socket)
            .unwrap();
        assert!(
            out.status.success(),
            "CNI ADD {}: {} {}",
            pod.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Node `n`'s proxy's readiness address.
fn ready_at(n: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, n)), 15021)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Certificates the service issued so far (`ringway_ca_requests_total{code="ok"}`).
fn ca_issued() -> f64 {
    prom::sum(
        &scrape(CA_METRICS.parse().unwrap()).unwrap(),
        "ringway_ca_requests_total",
        &["code=\"ok\""],
    )
}

fn failures(node: &Node) -> f64 {
    prom::sum(
        &scrape(node.metrics()).unwrap(),
        "ringway_certificate_issue_failures_total",
        &[],
    )
}

/// When `node`'s certificate of `id` expires (0 when it has none).
fn expiry(node: &Node, id: &str) -> f64 {
    prom::sum(
        &scrape(node.metrics()).unwrap(),
        "ringway_certificate_expiry_timestamp_seconds",
        &[&format!("identity=\"{id}\"")],
    )
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A verified payload exchange from `from` to `to` (a [`PayloadServer`] in
/// `server`'s netns); the address the app saw.
fn exchange(from: &Pod, server: &Pod, to: SocketAddr, bytes: u64) -> Result<IpAddr, String> {
    let l = server.netns.run(|| listen(to)).map_err(|e| e.to_string())?;
    let srv = PayloadServer::start(l, 1);
    from.netns
        .run(|| {
            ringway_testbed::traffic::client_exchange(
                connect(to, Duration::from_secs(5))?,
                bytes,
                bytes,
            )
        })
        .map_err(|e| format!("{} -> {to}: {e}", from.name))?;
    let rep = srv
        .next_report(PATIENCE)
        .ok_or("the server gave no report")?;
    rep.received?;
    Ok(rep.peer.ip())
}

/// A connection from `from` to `to` that must not reach the app listening
/// there: returns what the client saw; panics if the app accepted it.
fn refused(from: &Pod, server: &Pod, to: SocketAddr) -> String {
    let l = server.netns.run(|| listen(to)).unwrap();
    l.set_nonblocking(true).unwrap();
    let outcome = from.netns.run(|| -> std::io::Result<usize> {
        let mut s = connect(to, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let _ = s.write_all(b"who am I?");
        let mut b = [0u8; 16];
        s.read_no_intr(&mut b)
    });
    let accepted = l.accept();
    assert!(
        accepted.is_err(),
        "{} -> {to} reached the app ({:?}) while it must be refused; the client saw {outcome:?}",
        from.name,
        accepted.map(|(_, p)| p)
    );
    match outcome {
        Ok(0) => "closed by the proxy".into(),
        Ok(n) => panic!("{} -> {to}: {n} bytes came back from nowhere", from.name),
        Err(e) => e.to_string(),
    }
}

/// Records the chain a server presents, accepting it (the test checks it
/// afterwards against each root).
#[derive(Debug)]
struct Capture(Mutex<Vec<CertificateDer<'static>>>);

impl rustls::client::danger::ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _: &rustls_pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let mut chain = vec![end_entity.clone().into_owned()];
        chain.extend(intermediates.iter().map(|c| c.clone().into_owned()));
        *self.0.lock().unwrap() = chain;
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            m,
            c,
            d,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            m,
            c,
            d,
            &rustls::crypto::ring::default_provider().signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A TLS 1.3 client of a tunnel port (ALPN h2) that takes whatever chain
/// the server presents into `capture`, presenting `leaf` if given.
fn tunnel_client(
    capture: Arc<Capture>,
    leaf: Option<&ringway_identity::TestLeaf>,
) -> rustls::ClientConfig {
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(capture);
    let mut cfg = match leaf {
        Some(l) => builder
            .with_client_auth_cert(l.chain.clone(), l.key.clone_key())
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    cfg
}

/// The chain the proxy's tunnel port (15008) of `server` presents, as seen
/// from node netns `from` (a pod's own connections to 15008 are captured as
/// outbound): a TLS client without a certificate, as the server's chain
/// comes before it asks for the client's.
fn presented_chain(from: &ringway_testbed::Netns, server: &Pod) -> Vec<CertificateDer<'static>> {
    let capture = Arc::new(Capture(Mutex::new(Vec::new())));
    let cfg = tunnel_client(capture.clone(), None);
    let to = SocketAddr::new(IpAddr::V4(server.ipv4), 15008);
    let outcome = from.run(|| -> std::io::Result<()> {
        let mut tcp = connect(to, Duration::from_secs(5))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut conn = rustls::ClientConnection::new(
            Arc::new(cfg),
            rustls_pki_types::ServerName::try_from("tunnel").unwrap(),
        )
        .map_err(std::io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        Ok(())
    });
    let chain = capture.0.lock().unwrap().clone();
    assert!(
        !chain.is_empty(),
        "{}'s tunnel port presented no certificate: {outcome:?}",
        server.name
    );
    chain
}

/// Whether `chain` is a valid certificate of `id` chained to the root in
/// `root_pem` (and only that root).
fn chains_to(chain: &[CertificateDer<'static>], root_pem: &Path, id: &str) -> Result<(), String> {
    use rustls::client::danger::ServerCertVerifier;
    let bundle = ringway_identity::TrustBundle::from_pem_files(&[root_pem]).unwrap();
    let mgr = ringway_identity::IdentityManager::with_source(
        Arc::new(ringway_identity::CaSigner::generate_for_tests(TD)),
        bundle,
        TD,
        Duration::from_secs(3600),
    )
    .unwrap();
    mgr.server_verifier(&mgr.parse_spiffe(id).unwrap())
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &rustls_pki_types::ServerName::try_from("tunnel").unwrap(),
            &[],
            rustls_pki_types::UnixTime::now(),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The leaf's lifetime (notAfter - now), seconds.
fn seconds_left(chain: &[CertificateDer<'static>]) -> i64 {
    let (_, leaf) = x509_parser::parse_x509_certificate(&chain[0]).unwrap();
    leaf.validity().not_after.timestamp() - unix_now() as i64
}

/// What of a process could name a file: its open files, memory maps,
/// command line and environment.
fn process_refs(pid: u32) -> Vec<String> {
    let mut refs = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        if let Ok(t) = std::fs::read_link(e.unwrap().path()) {
            refs.push(format!("fd -> {}", t.display()));
        }
    }
    for (what, sep) in [("cmdline", '\0'), ("environ", '\0'), ("maps", '\n')] {
        let raw = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
        for part in String::from_utf8_lossy(&raw).split(sep) {
            if !part.is_empty() {
                refs.push(format!("{what}: {part}"));
            }
        }
    }
    refs
}

/// No node process (agent, proxy) holds, names or was given any root
/// key: not an open file, a mapping, an argument, a variable or its
/// configuration (neither the path nor the key's bytes).
fn assert_no_root_key_on_nodes(bed: &Bed, nodes: &[&Node]) {
    for root in &bed.roots {
        let key_path = root.key.display().to_string();
        let key_pem = std::fs::read_to_string(&root.key).unwrap();
        // The base64 body of the key, line by line (any line would give it away).
        let key_lines: Vec<&str> = key_pem
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() > 16)
            .collect();
        assert!(!key_lines.is_empty());
        for node in nodes {
            for (what, pid) in [("agent", node.agent.0.id()), ("proxy", node.proxy.0.id())] {
                let refs = process_refs(pid);
                assert!(refs.len() > 3, "node{}'s {what}: {refs:?}", node.index);
                for r in &refs {
                    assert!(
                        !r.contains(&key_path) && !r.contains("ca-secret"),
                        "node{}'s {what} (pid {pid}) refers to the root key: {r}",
                        node.index
                    );
                    for l in &key_lines {
                        assert!(
                            !r.contains(l),
                            "node{}'s {what} holds the key's bytes",
                            node.index
                        );
                    }
                }
            }
            let config = std::fs::read_to_string(&node.config).unwrap();
            assert!(
                !config.contains(&key_path)
                    && !config.contains("ca-secret")
                    && !config.contains("keyFile"),
                "node{}'s proxy config names a key:\n{config}",
                node.index
            );
            for l in &key_lines {
                assert!(
                    !config.contains(l),
                    "node{}'s proxy config holds the key's bytes",
                    node.index
                );
            }
        }
    }
}

/// `ringway ca` serving, two `ringway proxy` processes in CA-client mode on
/// two virtual nodes: pods on the two nodes talk over HBONE with
/// certificates the service issued (the chain the tunnel port presents
/// verifies against the mesh root alone, for the pod's identity, with the
/// service's lifetime cap rather than the proxy's 24 h), and no node
/// process has the root key.
#[test]
fn csr_two_nodes_talk_over_hbone_with_ca_issued_certificates_and_no_node_holds_the_root_key() {
    run_isolated(
        "csr_two_nodes_talk_over_hbone_with_ca_issued_certificates_and_no_node_holds_the_root_key",
        || {
            let bed = Bed::new("csr-e2e", 1);
            // A cap of 1 h: leaves the proxies made themselves would say 24 h.
            let ca = bed.start_ca(&[0], 3600);
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            let (client, server) = (bed.n1.pod(0), bed.n2.pod(0));
            bed.cni_add(&node1, client);
            bed.cni_add(&node2, server);
            // The Add waited for the certificate: both are in hand already.
            assert!(
                ca_issued() >= 2.0,
                "{}",
                scrape(CA_METRICS.parse().unwrap()).unwrap()
            );

            for v6 in [false, true] {
                let to = SocketAddr::new(server.ip(v6), 8080);
                let seen = exchange(client, server, to, 1 << 20).unwrap();
                assert_eq!(seen, client.ip(v6), "the app saw the client's address");
            }
            let m1 = scrape(node1.metrics()).unwrap();
            assert!(
                prom::sum(
                    &m1,
                    "istio_tcp_connections_opened_total",
                    &["connection_security_policy=\"mutual_tls\""]
                ) >= 2.0,
                "no mutual_tls connection on node1:\n{m1}"
            );
            let m2 = scrape(node2.metrics()).unwrap();
            assert!(
                prom::sum(
                    &m2,
                    "istio_tcp_connections_opened_total",
                    &[&format!("source_principal=\"{DEFAULT_ID}\"")]
                ) >= 2.0,
                "node2 did not see the client's SPIFFE identity:\n{m2}"
            );

            // The certificates the pods present are the service's.
            for (from, to, node) in [
                (&bed.n1.node, server, &node2),
                (&bed.n2.node, client, &node1),
            ] {
                let chain = presented_chain(from, to);
                chains_to(&chain, &bed.public_roots[0], DEFAULT_ID)
                    .unwrap_or_else(|e| panic!("{}'s certificate: {e}", to.name));
                let left = seconds_left(&chain);
                assert!(
                    (3000..=3700).contains(&left),
                    "{}'s certificate lives {left} s more: not the service's 1 h cap",
                    to.name
                );
                let exp = expiry(node, DEFAULT_ID);
                assert!(
                    (exp - unix_now() - left as f64).abs() < 30.0,
                    "node{}'s expiry metric {exp} is not the presented certificate's",
                    node.index
                );
            }
            // The refusals counted by the service: none.
            let cam = scrape(CA_METRICS.parse().unwrap()).unwrap();
            assert_eq!(
                prom::sum(&cam, "ringway_ca_requests_total", &[]),
                prom::sum(&cam, "ringway_ca_requests_total", &["code=\"ok\""]),
                "{cam}"
            );
            assert!(
                bed.api.token_reviews() >= 2,
                "the service reviewed no token"
            );

            assert_no_root_key_on_nodes(&bed, &[&node1, &node2]);
            // The walk does see what a process was given: the CA names its key.
            let ca_refs = process_refs(ca.0.id());
            assert!(
                ca_refs
                    .iter()
                    .any(|r| r.contains(&bed.roots[0].key.display().to_string())),
                "{ca_refs:?}"
            );
        },
    );
}

/// A long transfer, client to server, that stops half way until told to go
/// on: the server verifies every byte against the pattern and counts them,
/// then answers the total.
struct Transfer {
    received: Arc<AtomicU64>,
    go: mpsc::Sender<()>,
    client: std::thread::JoinHandle<std::io::Result<u64>>,
    server: std::thread::JoinHandle<Result<u64, String>>,
}

impl Transfer {
    const CHUNK: usize = 256 * 1024;

    fn start(from: &Pod, server: &Pod, to: SocketAddr, first: u64, total: u64) -> Transfer {
        let l = server.netns.run(|| listen(to)).unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let r = received.clone();
        let server = std::thread::spawn(move || -> Result<u64, String> {
            let (mut c, _) = l.accept().map_err(|e| e.to_string())?;
            let (mut buf, mut want) = (vec![0u8; Self::CHUNK], vec![0u8; Self::CHUNK]);
            let mut off = 0u64;
            loop {
                let n = c
                    .read_no_intr(&mut buf)
                    .map_err(|e| format!("at byte {off}: {e}"))?;
                if n == 0 {
                    break;
                }
                pattern_fill(CLIENT_SEED, off, &mut want[..n]);
                if buf[..n] != want[..n] {
                    return Err(format!("corrupted after byte {off}"));
                }
                off += n as u64;
                r.store(off, Ordering::SeqCst);
            }
            c.write_all(&off.to_le_bytes()).map_err(|e| e.to_string())?;
            Ok(off)
        });
        let mut stream = from
            .netns
            .run(|| connect(to, Duration::from_secs(5)))
            .unwrap();
        let (go, wait) = mpsc::channel::<()>();
        let client = std::thread::spawn(move || -> std::io::Result<u64> {
            let mut buf = vec![0u8; Self::CHUNK];
            let mut off = 0u64;
            for (end, pause) in [(first, true), (total, false)] {
                while off < end {
                    let n = ((end - off) as usize).min(buf.len());
                    pattern_fill(CLIENT_SEED, off, &mut buf[..n]);
                    stream.write_all(&buf[..n])?;
                    off += n as u64;
                }
                // The test holds the pause over a renewal
                // ([`RENEWAL_PATIENCE`]) and the checks of the outage.
                if pause && wait.recv_timeout(RENEWAL_PATIENCE + 2 * PATIENCE).is_err() {
                    return Err(std::io::Error::other("never told to go on"));
                }
            }
            stream.shutdown(std::net::Shutdown::Write)?;
            stream.set_read_timeout(Some(PATIENCE))?;
            let mut got = [0u8; 8];
            stream.read_exact(&mut got)?;
            Ok(u64::from_le_bytes(got))
        });
        Transfer {
            received,
            go,
            client,
            server,
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    /// Sends the rest; (what the client was told arrived, what the server
    /// verified).
    fn finish(self) -> (std::io::Result<u64>, Result<u64, String>) {
        let _ = self.go.send(());
        (self.client.join().unwrap(), self.server.join().unwrap())
    }
}

/// Kills `ca` (SIGKILL, by its PID) and reaps it.
fn kill(mut ca: Proc) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ca.0.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    ca.0.wait().unwrap();
}

/// `ca.address` names the service by a name that does not resolve yet (the
/// Service or cluster DNS not there when the node starts): the proxies
/// start anyway, enrol their pods, and are not ready while the pods'
/// certificates are awaited; once the name resolves, the certificates come
/// and the pods talk over HBONE, with no proxy restarted. Before, a name
/// that did not resolve at start stopped the proxy, and one that moved
/// later was never followed.
#[test]
fn csr_a_certificate_service_name_that_resolves_only_later_needs_no_proxy_restart() {
    run_isolated(
        "csr_a_certificate_service_name_that_resolves_only_later_needs_no_proxy_restart",
        || {
            let mut bed = Bed::new("csr-late-dns", 1);
            // The proxies (started from this thread) read this hosts file.
            ringway_testbed::ns::override_etc_hosts(&bed.dir, "# the CA's name not yet\n").unwrap();
            let port = CA_ADDR.rsplit_once(':').unwrap().1;
            bed.ca_address = format!("ringway-ca.test:{port}");
            let _ca = bed.start_ca(&[0], 3600);
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            let (client, server) = (bed.n1.pod(0), bed.n2.pod(0));
            bed.cni_add(&node1, client);
            bed.cni_add(&node2, server);
            // Not ready, naming the name that does not resolve (once the
            // first request for the certificate has failed).
            let body = || ringway_testbed::http::get(ready_at(1), "/healthz/ready").unwrap();
            assert!(
                wait_until(PATIENCE, || {
                    let r = body();
                    r.status == 503 && r.body.contains("resolving")
                }),
                "not a wait naming the name that does not resolve: {:?}",
                body()
            );
            assert_eq!(expiry(&node1, DEFAULT_ID), 0.0);
            // The name resolves now (the file is the mount's source: the
            // proxies read the new text).
            std::fs::write(bed.dir.join("hosts"), "127.0.0.1 ringway-ca.test\n").unwrap();
            for n in [1, 2] {
                assert!(
                    wait_until(RENEWAL_PATIENCE, || ready(ready_at(n))),
                    "node{n} never got its pod's certificate once the name resolved"
                );
            }
            assert!(expiry(&node1, DEFAULT_ID) > 0.0 && expiry(&node2, DEFAULT_ID) > 0.0);
            let seen = exchange(
                client,
                server,
                SocketAddr::new(server.ip(false), 8080),
                64 << 10,
            )
            .unwrap();
            assert_eq!(seen, client.ip(false));
            drop((node1, node2));
        },
    );
}

/// The certificate service dies in the middle of a long HBONE transfer and
/// stays down over the certificates' renewal ([`LEAF_SECS`] leaves: the
/// renewal falls due in the outage, whenever the kill came; the test waits
/// for it). The transfer completes with every byte; the renewal fails and is
/// counted; new connections of the pods in hand still work on the valid
/// certificates (half their lifetime left when the renewal falls due); a pod enrolled during the outage is not served over HBONE,
/// either way, and has no certificate (never another identity). Once the
/// service is back, renewal recovers (the expiry moves forward) and the new
/// pod is served with its own identity.
#[test]
fn csr_ca_down_mid_transfer_and_over_a_renewal_then_recovers_and_a_new_pod_fails_closed() {
    run_isolated(
        "csr_ca_down_mid_transfer_and_over_a_renewal_then_recovers_and_a_new_pod_fails_closed",
        || {
            let bed = Bed::new("csr-outage", 1);
            let ca = bed.start_ca(&[0], LEAF_SECS);
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            let (client, server, late) = (bed.n1.pod(0), bed.n2.pod(0), bed.late());
            bed.cni_add(&node1, client);
            bed.cni_add(&node2, server);
            assert!(
                expiry(&node1, DEFAULT_ID) > 0.0 && expiry(&node2, DEFAULT_ID) > 0.0,
                "no certificate in hand after the Adds"
            );
            let (f1, f2) = (failures(&node1), failures(&node2));

            // A long transfer over HBONE; half of it through, the CA dies.
            const TOTAL: u64 = 32 << 20;
            let t = Transfer::start(
                client,
                server,
                SocketAddr::new(server.ip(false), 8080),
                TOTAL / 2,
                TOTAL,
            );
            assert!(
                wait_until(PATIENCE, || t.received() >= TOTAL / 2),
                "half the transfer never arrived: {} bytes",
                t.received()
            );
            kill(ca);
            // No renewal can succeed from here on: these are the
            // certificates in hand for the whole outage (a renewal before
            // the kill, on a slow machine, only moved them forward).
            let (exp1, exp2) = (expiry(&node1, DEFAULT_ID), expiry(&node2, DEFAULT_ID));

            // The next renewal falls due in the outage (within half a
            // lifetime): it fails, on both nodes, and is counted.
            assert!(
                wait_until(RENEWAL_PATIENCE, || failures(&node1) > f1
                    && failures(&node2) > f2),
                "no renewal failure counted: node1 {} node2 {}",
                failures(&node1),
                failures(&node2)
            );
            assert_eq!(
                (expiry(&node1, DEFAULT_ID), expiry(&node2, DEFAULT_ID)),
                (exp1, exp2),
                "renewed with the CA down?"
            );
            // The certificates in hand are still valid (renewal falls due
            // with half the lifetime left): new connections work.
            assert!(
                exp1.min(exp2) > unix_now(),
                "the certificates in hand expired before the renewal failed: {exp1}, {exp2}"
            );
            let seen = exchange(
                client,
                server,
                SocketAddr::new(server.ip(false), 8081),
                64 << 10,
            )
            .unwrap();
            assert_eq!(seen, client.ip(false));

            // A pod enrolled during the outage (the cluster has it; the
            // service will see it when it is back): no certificate, so no
            // HBONE, out or in, and no other identity in its place.
            bed.api_pod(late, "node1", "late");
            bed.cni_add(&node1, late);
            // Node1 awaits a certificate the service cannot give now: not
            // ready, so a rollout does not stop its old proxy for one
            // that would refuse this pod's HBONE. Node2 has all it needs.
            let r = ringway_testbed::http::get(ready_at(1), "/healthz/ready").unwrap();
            assert_eq!(
                r.status, 503,
                "node1 ready while a certificate is awaited: {}",
                r.body
            );
            assert!(
                r.body.contains(&format!(
                    "waiting for 1 workload certificate(s), first {LATE_ID}: "
                )),
                "{}",
                r.body
            );
            assert!(ready(ready_at(2)), "node2 has every certificate it needs");
            let out = refused(late, server, SocketAddr::new(server.ip(false), 8082));
            let inb = refused(server, late, SocketAddr::new(late.ip(false), 8083));
            println!(
                "during the outage: {} -> {}: {out}; {} -> {}: {inb}",
                late.name, server.name, server.name, late.name
            );
            assert_eq!(
                expiry(&node1, LATE_ID),
                0.0,
                "node1 has a certificate for the new pod"
            );
            let m2 = scrape(node2.metrics()).unwrap();
            assert_eq!(
                prom::parse(&m2)
                    .matching(
                        "istio_tcp_connections_opened_total",
                        &[&format!("source_workload=\"{}\"", late.name)]
                    )
                    .count(),
                0,
                "node2 accepted a connection of the new pod:\n{m2}"
            );

            // The transfer completes with every byte.
            assert!(
                t.received() < TOTAL,
                "the transfer finished before the outage"
            );
            let (sent, verified) = t.finish();
            assert_eq!(verified, Ok(TOTAL), "the server's count");
            assert_eq!(
                sent.unwrap(),
                TOTAL,
                "the client's view of the server's count"
            );

            // The service returns: renewal recovers, the new pod is served.
            let _ca = bed.start_ca(&[0], LEAF_SECS);
            assert!(
                wait_until(RENEWAL_PATIENCE, || expiry(&node1, DEFAULT_ID) > exp1
                    && expiry(&node2, DEFAULT_ID) > exp2),
                "renewal did not recover: node1 {} (was {exp1}), node2 {} (was {exp2})",
                expiry(&node1, DEFAULT_ID),
                expiry(&node2, DEFAULT_ID)
            );
            assert!(
                wait_until(RENEWAL_PATIENCE, || expiry(&node1, LATE_ID) > 0.0),
                "the new pod never got its certificate"
            );
            assert!(
                wait_until(PATIENCE, || ready(ready_at(1))),
                "node1 not ready once every certificate was in hand"
            );
            let seen = exchange(
                late,
                server,
                SocketAddr::new(server.ip(false), 8084),
                64 << 10,
            )
            .unwrap();
            assert_eq!(seen, late.ip(false));
            let m2 = scrape(node2.metrics()).unwrap();
            assert!(
                prom::sum(
                    &m2,
                    "istio_tcp_connections_opened_total",
                    &[&format!("source_principal=\"{LATE_ID}\"")]
                ) >= 1.0,
                "node2 did not see the new pod's own identity:\n{m2}"
            );
        },
    );
}

/// Root rotation end to end. The proxies trust the old root and, already,
/// the new one (`rootCertFile` + `bundleFiles`, as a rotation distributes
/// it first). The service signs with the old root, then restarts with both
/// (the newer signs): a pod enrolled now gets a leaf of the new root while
/// the other node's pod still has one of the old, and they talk both ways
/// (both roots trusted during the overlap); then the old leaf's renewal
/// re-issues it under the new root, and they still talk.
#[test]
fn csr_root_rotation_overlap_trusts_both_roots_and_renewal_reissues_under_the_new_one() {
    run_isolated(
        "csr_root_rotation_overlap_trusts_both_roots_and_renewal_reissues_under_the_new_one",
        || {
            let bed = Bed::new("csr-rotation", 2);
            let (old_root, new_root) = (&bed.public_roots[0], &bed.public_roots[1]);
            // Short leaves before the rotation: b's renewal falls due
            // half a lifetime after its Add, well after the overlap below.
            let ca = bed.start_ca(&[0], LEAF_SECS);
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            let (a, b) = (bed.n1.pod(0), bed.n2.pod(0));
            bed.cni_add(&node2, b);
            let old_leaf = presented_chain(&bed.n1.node, b);
            chains_to(&old_leaf, old_root, DEFAULT_ID).unwrap();
            assert!(chains_to(&old_leaf, new_root, DEFAULT_ID).is_err());
            let exp_b = expiry(&node2, DEFAULT_ID);

            // The rotation: the service restarts with both roots.
            kill(ca);
            let _ca = bed.start_ca(&[0, 1], 3600);
            bed.cni_add(&node1, a);
            let new_leaf = presented_chain(&bed.n2.node, a);
            chains_to(&new_leaf, new_root, DEFAULT_ID)
                .unwrap_or_else(|e| panic!("{}'s leaf after the rotation: {e}", a.name));
            assert!(
                chains_to(&new_leaf, old_root, DEFAULT_ID).is_err(),
                "signed by the old root after the rotation"
            );
            // The overlap: a (new root) and b (old root) talk both ways.
            for (from, to) in [(a, b), (b, a)] {
                let addr = SocketAddr::new(to.ip(false), 8080);
                assert_eq!(exchange(from, to, addr, 256 << 10).unwrap(), from.ip(false));
            }
            let still_old = presented_chain(&bed.n1.node, b);
            assert_eq!(
                still_old[0], old_leaf[0],
                "b's leaf was renewed before the overlap was shown: lengthen its lifetime"
            );

            // Renewal re-issues b's leaf under the new root.
            assert!(
                wait_until(RENEWAL_PATIENCE, || expiry(&node2, DEFAULT_ID) > exp_b),
                "b's certificate was never renewed"
            );
            let renewed = presented_chain(&bed.n1.node, b);
            chains_to(&renewed, new_root, DEFAULT_ID)
                .unwrap_or_else(|e| panic!("{}'s renewed leaf: {e}", b.name));
            assert!(
                seconds_left(&renewed) > 3000,
                "not the new service's lifetime"
            );
            for (from, to) in [(a, b), (b, a)] {
                let addr = SocketAddr::new(to.ip(false), 8081);
                assert_eq!(exchange(from, to, addr, 256 << 10).unwrap(), from.ip(false));
            }
        },
    );
}

/// A misstep of a root rotation: the service restarted to sign with a root
/// the proxies were never given. A renewed leaf that does not chain to the
/// proxy's own trust bundle would be refused by every peer; the proxy must
/// refuse it (a counted renewal failure) and keep serving with the current,
/// still valid, certificate instead of breaking its pods' HBONE.
#[test]
fn adversarial_csr_a_renewed_leaf_of_an_untrusted_root_is_refused_and_the_current_one_kept() {
    run_isolated(
        "adversarial_csr_a_renewed_leaf_of_an_untrusted_root_is_refused_and_the_current_one_kept",
        || {
            let mut bed = Bed::new("csr-untrusted", 2);
            bed.trusted = 1;
            // Short leaves: renewal falls due half a lifetime after the Adds,
            // with half the lifetime left to show the current one still works.
            let ca = bed.start_ca(&[0], LEAF_SECS);
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            let (a, b) = (bed.n1.pod(0), bed.n2.pod(0));
            bed.cni_add(&node1, a);
            bed.cni_add(&node2, b);
            let leaf_b = presented_chain(&bed.n1.node, b);
            let (exp_b, f2) = (expiry(&node2, DEFAULT_ID), failures(&node2));

            // The service now signs with root 1, which no proxy trusts (its
            // serving certificate is still root 0's: the proxies reach it).
            kill(ca);
            let _ca = bed.start_ca(&[1], 3600);
            let issued = ca_issued();
            assert!(
                wait_until(RENEWAL_PATIENCE, || ca_issued() > issued
                    || failures(&node2) > f2),
                "no renewal was attempted"
            );
            assert!(
                wait_until(RENEWAL_PATIENCE, || failures(&node2) > f2),
                "node2 took a leaf its peers cannot verify: expiry {} (was {exp_b}), presenting {}",
                expiry(&node2, DEFAULT_ID),
                match chains_to(
                    &presented_chain(&bed.n1.node, b),
                    &bed.public_roots[1],
                    DEFAULT_ID
                ) {
                    Ok(()) => "a leaf of the untrusted root",
                    Err(_) => "the old leaf",
                }
            );
            assert_eq!(
                expiry(&node2, DEFAULT_ID),
                exp_b,
                "the current certificate is kept"
            );
            assert_eq!(
                presented_chain(&bed.n1.node, b)[0],
                leaf_b[0],
                "b still presents its current leaf"
            );
            for (from, to) in [(a, b), (b, a)] {
                let addr = SocketAddr::new(to.ip(false), 8080);
                assert_eq!(
                    exchange(from, to, addr, 64 << 10).unwrap(),
                    from.ip(false),
                    "HBONE broke"
                );
            }
        },
    );
}

/// Writes `text` beside `path` and renames it over `path` (a ConfigMap
/// update as the file's readers see it: whole or not at all).
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A node proxy's metric (0 when absent).
fn node_metric(node: &Node, name: &str) -> f64 {
    prom::sum(&scrape(node.metrics()).unwrap(), name, &[])
}

/// A TLS handshake to `server`'s tunnel port (15008) from node netns
/// `from`, presenting `leaf`, then the HTTP/2 preface: `Ok` once the
/// server's SETTINGS come back (the client certificate was accepted), the
/// error otherwise (TLS 1.3 reports a refused client certificate after the
/// client's side of the handshake, on the first read).
fn tunnel_accepts(
    from: &ringway_testbed::Netns,
    server: &Pod,
    leaf: &ringway_identity::TestLeaf,
) -> Result<(), String> {
    let cfg = tunnel_client(Arc::new(Capture(Mutex::new(Vec::new()))), Some(leaf));
    let to = SocketAddr::new(IpAddr::V4(server.ipv4), 15008);
    from.run(|| -> std::io::Result<()> {
        let tcp = connect(to, Duration::from_secs(5))?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let conn = rustls::ClientConnection::new(
            Arc::new(cfg),
            rustls_pki_types::ServerName::try_from("tunnel").unwrap(),
        )
        .map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        // The preface and an empty SETTINGS frame.
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")?;
        let mut frame = [0u8; 9];
        tls.read_exact(&mut frame)?;
        if frame[3] != 4 {
            return Err(std::io::Error::other(format!(
                "the first frame back is of type {}, not SETTINGS",
                frame[3]
            )));
        }
        Ok(())
    })
    .map_err(|e| e.to_string())
}

/// A root rotation as deploy/README gives it, with no proxy restarted:
/// the roots' file edited (both roots), the service moved to the new root
/// (leaves renewed under it), the old root removed from the file. Each
/// edit is followed by the running proxies: pods talk over HBONE
/// throughout, a broken edit of the file is refused and counted with the
/// roots in force kept, and once the old root is removed a peer presenting
/// a leaf of it is refused where it was accepted during the overlap.
#[test]
fn csr_root_rotation_without_restarting_the_proxies() {
    run_isolated("csr_root_rotation_without_restarting_the_proxies", || {
        let mut bed = Bed::new("csr-live-rotation", 2);
        bed.trusted = 1;
        let ca = bed.start_ca(&[0], LEAF_SECS);
        let (mut node1, mut node2) = (bed.start_node(1), bed.start_node(2));
        let (a, b) = (bed.n1.pod(0), bed.n2.pod(0));
        bed.cni_add(&node1, a);
        bed.cni_add(&node2, b);
        let mut port = 8080;
        let mut talk = |why: &str| {
            for (from, to) in [(a, b), (b, a)] {
                let addr = SocketAddr::new(to.ip(false), port);
                port += 1;
                assert_eq!(
                    exchange(from, to, addr, 64 << 10).unwrap_or_else(|e| panic!("{why}: {e}")),
                    from.ip(false),
                    "{why}"
                );
            }
        };
        talk("before the rotation");
        let roots = |n: &Node| node_metric(n, "ringway_trust_roots");
        assert_eq!((roots(&node1), roots(&node2)), (1.0, 1.0));
        // A leaf of the old root, as a peer would present it.
        let old_ca =
            ringway_identity::CaSigner::load(&bed.roots[0].cert, &bed.roots[0].key).unwrap();
        let now = SystemTime::now();
        let old_leaf = old_ca.issue_for_tests(
            &ringway_identity::parse_spiffe(DEFAULT_ID, TD).unwrap(),
            now - Duration::from_secs(60),
            now + Duration::from_secs(3600),
        );
        drop(old_ca);
        tunnel_accepts(&bed.n1.node, b, &old_leaf).expect("a leaf of the root in force");

        // A broken edit: refused, counted, the roots kept.
        replace_file(&bed.root_cert, "not a certificate\n");
        let rejected = |n: &Node| node_metric(n, "ringway_trust_bundle_rejected_total");
        assert!(
            wait_until(PATIENCE, || rejected(&node1) >= 1.0
                && rejected(&node2) >= 1.0),
            "the broken edit was not refused"
        );
        assert_eq!((roots(&node1), roots(&node2)), (1.0, 1.0));
        talk("after a broken edit of the roots");

        // Step 1: both roots in the file.
        let (old_pem, new_pem) = (
            std::fs::read_to_string(&bed.public_roots[0]).unwrap(),
            std::fs::read_to_string(&bed.public_roots[1]).unwrap(),
        );
        replace_file(&bed.root_cert, &format!("{old_pem}{new_pem}"));
        assert!(
            wait_until(PATIENCE, || roots(&node1) == 2.0 && roots(&node2) == 2.0),
            "the proxies never took both roots"
        );
        // Step 2: the service signs with the new root; the leaves renew
        // under it (a proxy that did not take the new root refuses them).
        kill(ca);
        let ca = bed.start_ca(&[0, 1], LEAF_SECS);
        let (new_root, old_root) = (&bed.public_roots[1], &bed.public_roots[0]);
        for (at, pod) in [(&bed.n1.node, b), (&bed.n2.node, a)] {
            assert!(
                wait_until(RENEWAL_PATIENCE, || chains_to(
                    &presented_chain(at, pod),
                    new_root,
                    DEFAULT_ID
                )
                .is_ok()),
                "{}'s leaf was never renewed under the new root",
                pod.name
            );
        }
        talk("the leaves renewed under the new root");
        tunnel_accepts(&bed.n1.node, b, &old_leaf).expect("the old root's leaf in the overlap");

        // Step 3: the service's serving certificate re-issued under the new
        // root, the service left with the new root only (the proxies reach
        // it only if their client took the edited roots), then the old root
        // removed from the file.
        let next_tls = (bed.dir.join("tls-next.crt"), bed.dir.join("tls-next.key"));
        ringway_identity::CaSigner::load(&bed.roots[1].cert, &bed.roots[1].key)
            .unwrap()
            .issue_dns_for_tests(CA_NAME)
            .write_pem_files(&next_tls.0, &next_tls.1)
            .unwrap();
        kill(ca);
        let _ca = bed.start_ca_serving(&[1], LEAF_SECS, &next_tls);
        let handshakes = |n: &Node| {
            prom::sum(
                &scrape(n.metrics()).unwrap(),
                "ringway_tls_handshakes_total",
                &["side=\"client\"", "outcome=\"ok\""],
            )
        };
        let dialled = (handshakes(&node1), handshakes(&node2));
        replace_file(&bed.root_cert, &new_pem);
        assert!(
            wait_until(PATIENCE, || roots(&node1) == 1.0 && roots(&node2) == 1.0),
            "the proxies never dropped the old root"
        );
        let (exp_a, exp_b) = (expiry(&node1, DEFAULT_ID), expiry(&node2, DEFAULT_ID));
        assert!(
            wait_until(RENEWAL_PATIENCE, || expiry(&node1, DEFAULT_ID) > exp_a
                && expiry(&node2, DEFAULT_ID) > exp_b),
            "no renewal through the service's new serving certificate"
        );
        talk("after the old root was removed");
        assert!(
            handshakes(&node1) > dialled.0 && handshakes(&node2) > dialled.1,
            "the tunnels authenticated before the old root went were reused"
        );
        let e = tunnel_accepts(&bed.n1.node, b, &old_leaf)
            .expect_err("a leaf of the removed root was accepted");
        assert!(
            chains_to(&presented_chain(&bed.n1.node, b), old_root, DEFAULT_ID).is_err(),
            "b presents a leaf of the removed root ({e})"
        );
        for n in [&mut node1, &mut node2] {
            assert!(
                n.proxy.0.try_wait().unwrap().is_none(),
                "node{}'s proxy exited",
                n.index
            );
        }
        let reloads = |n: &Node| node_metric(n, "ringway_trust_bundle_reloads_total");
        assert_eq!((reloads(&node1), reloads(&node2)), (2.0, 2.0));
    });
}
