//! `ringway proxy --mesh-source xds` end to end, as a cluster that runs the
//! mesh would run it: separate processes on two virtual nodes, each with a
//! `ringway agent` and a `ringway proxy` whose configuration file holds no
//! workload, service, policy or CA, so everything comes from the test's
//! control plane on 127.0.0.1:15012 of the test's own network namespace:
//! the project's `XdsServer` (delta ADS over TLS + HTTP/2) with the
//! certificate service's `CreateCertificate` served on the same port, as
//! istiod serves both. Pods are enrolled through the `ringway-cni` plugin
//! binary; traffic between the nodes is HBONE with certificates the control
//! plane issued for identities its workloads named.

use ringway_testbed::traffic::ReadNoIntr;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support;

use ringway_ca::authn::{BoxFuture, Caller, TokenReviewer};
use ringway_ca::pods::StaticPods;
use ringway_ca::{Code, PodView, Policy, Status};
use ringway_testbed::http::scrape;
use ringway_testbed::traffic::{connect, listen, PayloadServer};
use ringway_testbed::{prom, run_isolated, wait_until, Pod, TempDir, VirtualNode};
use ringway_xds::proto::security::{self, string_match::MatchType};
use ringway_xds::proto::workload::{self as wl, address};
use ringway_xds::testing::{server_tls, XdsServer};
use ringway_xds::{Resource, TypedResource, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use support::{ready, Proc};

const TD: &str = "cluster.local";
const ISTIOD: &str = "istiod.istio-system.svc";
const XDS_ADDR: &str = "127.0.0.1:15012";
const PROXY_NS: &str = "istio-system";
const PROXY_SA: &str = "ztunnel";
const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const SERVICE: &str = "demo/web.demo.svc.cluster.local";
/// How long anything here may take to happen.
const PATIENCE: Duration = Duration::from_secs(20);
/// The proxies' `proxy.workloadWait`.
const WORKLOAD_WAIT: Duration = Duration::from_secs(2);

/// The drills load the machine: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `body` on a fresh bed named `bed`, one drill at a time, in the
/// test's own namespaces.
fn drill(test: &str, bed: &str, body: impl FnOnce(&Bed) + Send) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    run_isolated(test, || body(&Bed::new(bed)));
}

/// The API server's TokenReview as the certificate service sees it: the
/// node proxies' tokens (bound to their pods), and every token it was asked
/// about.
struct Reviewer {
    tokens: HashMap<String, Caller>,
    seen: Mutex<Vec<String>>,
}

impl TokenReviewer for Reviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Caller, Status>> {
        Box::pin(async move {
            self.seen.lock().unwrap().push(token.to_owned());
            self.tokens
                .get(token)
                .cloned()
                .ok_or_else(|| Status::new(Code::Unauthenticated, "bad_token", "unknown token"))
        })
    }
}

/// One virtual node's processes.
struct Node {
    index: u8,
    _agent: Proc,
    proxy: Proc,
    cni_socket: PathBuf,
    proxy_log: PathBuf,
}

impl Node {
    fn control(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, self.index)), port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.proxy_log).unwrap_or_default()
    }
}

/// The cluster: the control plane, its root, two virtual nodes.
struct Bed {
    dir: TempDir,
    root: PathBuf,
    istiod_tls: Arc<rustls::ServerConfig>,
    ca: Arc<ringway_ca::CaService>,
    reviewer: Arc<Reviewer>,
    plugin: PathBuf,
    n1: VirtualNode,
    n2: VirtualNode,
    _link: ringway_testbed::NodeLink,
}

fn token(n: u8) -> String {
    format!("projected-token-of-ztunnel-node{n}")
}

fn uid_of(pod: &Pod) -> String {
    format!("Kubernetes//Pod/demo/{}", pod.name)
}

impl Bed {
    /// Node 1 with two pods, node 2 with two; the control plane's root,
    /// serving certificate and certificate service (pods of `demo`, service
    /// account `default`, known to it on their nodes).
    fn new(name: &str) -> Bed {
        let dir = TempDir::new(name);
        let plugin = dir.join("ringway-cni");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ringway"), &plugin).unwrap();
        let signer = ringway_identity::CaSigner::generate_for_tests(TD);
        let root = dir.join("root-cert.pem");
        std::fs::write(&root, signer.cert_pem()).unwrap();
        let leaf = signer.issue_dns_for_tests(ISTIOD);
        let istiod_tls = server_tls(leaf.chain, leaf.key).unwrap();
        let n1 = VirtualNode::build(1, 2).unwrap();
        let n2 = VirtualNode::build(2, 2).unwrap();
        let link = ringway_testbed::link_nodes(&n1, &n2).unwrap();
        let pods = StaticPods::default();
        let mut tokens = HashMap::new();
        for (n, node) in [(1u8, &n1), (2, &n2)] {
            let proxy_pod = format!("ztunnel-node{n}");
            pods.put(PodView {
                namespace: PROXY_NS.into(),
                name: proxy_pod.clone(),
                uid: format!("uid-{proxy_pod}"),
                node: format!("node{n}"),
                service_account: PROXY_SA.into(),
                live: true,
                terminating: false,
            });
            tokens.insert(
                token(n),
                Caller {
                    namespace: PROXY_NS.into(),
                    service_account: PROXY_SA.into(),
                    pod_name: Some(proxy_pod.clone()),
                    pod_uid: Some(format!("uid-{proxy_pod}")),
                    node_name: Some(format!("node{n}")),
                },
            );
            std::fs::write(dir.join(format!("node{n}.token")), token(n)).unwrap();
            for i in 0..2 {
                let p = node.pod(i);
                pods.put(PodView {
                    namespace: "demo".into(),
                    name: p.name.clone(),
                    uid: format!("uid-{}", p.name),
                    node: format!("node{n}"),
                    service_account: "default".into(),
                    live: true,
                    terminating: false,
                });
            }
        }
        let reviewer = Arc::new(Reviewer {
            tokens,
            seen: Mutex::new(Vec::new()),
        });
        let ca = Arc::new(
            ringway_ca::CaService::new(
                Policy {
                    trust_domain: TD.into(),
                    node_proxy: (PROXY_NS.into(), PROXY_SA.into()),
                },
                ringway_ca::Limits::default(),
                reviewer.clone(),
                Arc::new(pods),
                vec![Arc::new(signer)],
            )
            .unwrap(),
        );
        Bed {
            dir,
            root,
            istiod_tls,
            ca,
            reviewer,
            plugin,
            n1,
            n2,
            _link: link,
        }
    }

    /// The control plane on [`XDS_ADDR`]: xDS, and `CreateCertificate`
    /// on the same port.
    fn start_istiod(&self) -> XdsServer {
        self.start_istiod_with(self.istiod_tls.clone())
    }

    /// [`Bed::start_istiod`] presenting the serving certificate of `tls`.
    fn start_istiod_with(&self, tls: Arc<rustls::ServerConfig>) -> XdsServer {
        let server = XdsServer::start(XDS_ADDR.parse().unwrap(), tls).unwrap();
        let ca = self.ca.clone();
        server.set_other_methods(Arc::new(move |req, respond| {
            let ca = ca.clone();
            Box::pin(async move { ringway_ca::server::serve_stream(req, respond, &ca).await })
        }));
        server
    }

    /// Node `n`'s agent and proxy (`--mesh-source xds`); waits for the
    /// agent's sockets and the proxy's process, not its readiness.
    fn start_node(&self, n: u8) -> Node {
        let zds = self.dir.join(format!("node{n}-zds.sock"));
        let cni_socket = self.dir.join(format!("node{n}-cni.sock"));
        let agent =
            support::node_agent_command(&self.dir, n, &self.dir.join(format!("agent{n}.log")))
                .spawn()
                .unwrap();
        let agent = Proc(agent);
        assert!(
            wait_until(PATIENCE, || cni_socket.exists() && zds.exists()),
            "node{n}'s agent sockets never appeared"
        );
        let config = self.dir.join(format!("node{n}.yaml"));
        std::fs::write(
            &config,
            format!(
                "trustDomain: {TD}\nproxy:\n  workloadWait: {}\n",
                WORKLOAD_WAIT.as_secs()
            ),
        )
        .unwrap();
        let proxy_log = self.dir.join(format!("proxy{n}.log"));
        let proxy = support::node_proxy_command(&self.dir, n, &config, &proxy_log)
            .env("POD_NAME", format!("ztunnel-node{n}"))
            .env("POD_NAMESPACE", PROXY_NS)
            .env("INSTANCE_IP", format!("10.0.0.{n}"))
            .env("NODE_NAME", format!("node{n}"))
            .args(["--mesh-source", "xds", "--xds-address", XDS_ADDR])
            .args(["--xds-server-name", ISTIOD])
            .arg("--xds-root-cert")
            .arg(&self.root)
            .arg("--xds-token-file")
            .arg(self.dir.join(format!("node{n}.token")))
            .spawn()
            .unwrap();
        Node {
            index: n,
            _agent: agent,
            proxy: Proc(proxy),
            cni_socket,
            proxy_log,
        }
    }

    fn wait_ready(&self, node: &Node) {
        assert!(
            wait_until(PATIENCE, || ready(node.control(15021))),
            "node{}'s proxy never became ready:\n{}",
            node.index,
            node.log()
        );
    }

    /// CNI ADD of `pod` on `node` through the plugin binary; panics unless
    /// it succeeds.
    fn cni_add(&self, node: &Node, pod: &Pod) {
        let call = ringway_testbed::cni::CniPod::of(pod, &format!("uid-{}", pod.name))
            .in_namespace("demo");
        let out = call
            .run_plugin_binary(&self.plugin, "ADD", self.dir.path(), &node.cni_socket)
            .unwrap();
        assert!(
            out.status.success(),
            "CNI ADD {}: {} {}\nproxy log:\n{}",
            pod.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            node.log()
        );
    }
}

/// Makes the workload an endpoint of [`SERVICE`] (its port 80 on 8080).
fn web_endpoint(w: &mut wl::Workload) {
    w.services.insert(
        SERVICE.into(),
        wl::PortList {
            ports: vec![wl::Port {
                service_port: 80,
                target_port: 8080,
            }],
        },
    );
}

/// The control plane's workload for `pod` on `node`, version `version`.
fn workload(pod: &Pod, node: u8, version: &str) -> Resource {
    workload_with(pod, node, version, |_| {})
}

fn workload_with(
    pod: &Pod,
    node: u8,
    version: &str,
    f: impl FnOnce(&mut wl::Workload),
) -> Resource {
    let mut w = wl::Workload {
        uid: uid_of(pod),
        name: pod.name.clone(),
        namespace: "demo".into(),
        addresses: vec![pod.ipv4.octets().to_vec(), pod.ipv6.octets().to_vec()],
        tunnel_protocol: wl::TunnelProtocol::Hbone as i32,
        service_account: String::new(),
        node: format!("node{node}"),
        canonical_name: "demo-app".into(),
        canonical_revision: "v1".into(),
        ..Default::default()
    };
    f(&mut w);
    Resource::new(
        uid_of(pod),
        version,
        wl::Address {
            kind: Some(address::Kind::Workload(w)),
        }
        .to_any(),
    )
}

/// The service `web` of `demo`: [`VIP`]:80 -> 8080 on its endpoints.
fn web_service() -> Resource {
    with_service(web_service_with(|_| {}))
}

/// [`web_service`]'s message, changed by `f`.
fn web_service_with(f: impl FnOnce(&mut wl::Service)) -> wl::Service {
    let mut s = wl::Service {
        name: "web".into(),
        namespace: "demo".into(),
        hostname: "web.demo.svc.cluster.local".into(),
        addresses: vec![wl::NetworkAddress {
            network: String::new(),
            address: VIP.octets().to_vec(),
        }],
        ports: vec![wl::Port {
            service_port: 80,
            target_port: 8080,
        }],
        ..Default::default()
    };
    f(&mut s);
    s
}

/// `s` as the resource [`SERVICE`] (version 1).
fn with_service(s: wl::Service) -> Resource {
    Resource::new(
        SERVICE,
        "1",
        wl::Address {
            kind: Some(address::Kind::Service(s)),
        }
        .to_any(),
    )
}

/// A DENY of `demo`'s namespace scope refusing peers whose principal is
/// `principal` (written as the control plane does, without `spiffe://`).
fn deny_principal(name: &str, principal: &str) -> Resource {
    deny_matching(
        name,
        security::Match {
            principals: vec![security::StringMatch {
                match_type: Some(MatchType::Exact(principal.into())),
            }],
            ..Default::default()
        },
    )
}

/// A DENY of `demo`'s namespace scope refusing connections from `ip`.
fn deny_source(name: &str, ip: Ipv4Addr) -> Resource {
    deny_matching(
        name,
        security::Match {
            source_ips: vec![security::Address {
                address: ip.octets().to_vec(),
                length: 32,
            }],
            ..Default::default()
        },
    )
}

/// A DENY of `demo`'s namespace scope refusing what `m` matches.
fn deny_matching(name: &str, m: security::Match) -> Resource {
    let a = security::Authorization {
        name: name.into(),
        namespace: "demo".into(),
        scope: security::Scope::Namespace as i32,
        action: security::Action::Deny as i32,
        rules: vec![security::Rule {
            clauses: vec![security::Clause { matches: vec![m] }],
        }],
        dry_run: false,
    };
    Resource::new(format!("demo/{name}"), "1", a.to_any())
}

/// [`exchange`] from `from` to the service's VIP (port 80), served by the
/// app on `server`'s 8080.
fn through_the_vip(from: &Pod, server: &Pod) -> Result<IpAddr, String> {
    exchange(
        from,
        server,
        SocketAddr::new(server.ip(false), 8080),
        SocketAddr::new(IpAddr::V4(VIP), 80),
    )
}

/// A verified payload exchange from `from` to `to` (an app listening on
/// `server`'s `listen_at`); the address the app saw.
fn exchange(
    from: &Pod,
    server: &Pod,
    listen_at: SocketAddr,
    to: SocketAddr,
) -> Result<IpAddr, String> {
    let l = server
        .netns
        .run(|| listen(listen_at))
        .map_err(|e| e.to_string())?;
    let srv = PayloadServer::start(l, 1);
    from.netns
        .run(|| {
            ringway_testbed::traffic::client_exchange(
                connect(to, Duration::from_secs(5))?,
                64 * 1024,
                64 * 1024,
            )
        })
        .map_err(|e| format!("{} -> {to}: {e}", from.name))?;
    let rep = srv
        .next_report(PATIENCE)
        .ok_or("the server gave no report")?;
    rep.received?;
    Ok(rep.peer.ip())
}

/// A connection from `from` to `to` that must never reach the app listening
/// on `server`: returns what the client saw and how long it took.
fn refused(from: &Pod, server: &Pod, to: SocketAddr) -> (String, Duration) {
    refused_at(from, server, to, to)
}

/// [`refused`], the app listening on `listen_at` (a service's endpoint
/// when `to` is its VIP).
fn refused_at(
    from: &Pod,
    server: &Pod,
    listen_at: SocketAddr,
    to: SocketAddr,
) -> (String, Duration) {
    let l = server.netns.run(|| listen(listen_at)).unwrap();
    l.set_nonblocking(true).unwrap();
    let t0 = Instant::now();
    let outcome = from.netns.run(|| -> std::io::Result<usize> {
        let mut s = connect(to, Duration::from_secs(5))?;
        s.set_read_timeout(Some(PATIENCE))?;
        let _ = s.write_all(b"who am I?");
        let mut b = [0u8; 16];
        s.read_no_intr(&mut b)
    });
    let took = t0.elapsed();
    let accepted = l.accept();
    assert!(
        accepted.is_err(),
        "{} -> {to} reached the app ({:?}) while it must be refused; the client saw {outcome:?}",
        from.name,
        accepted.map(|(_, p)| p)
    );
    let what = match outcome {
        Ok(0) => "closed by the proxy".into(),
        Ok(n) => panic!("{} -> {to}: {n} bytes came back from nowhere", from.name),
        Err(e) => e.to_string(),
    };
    (what, took)
}

/// An open connection from `from` to an echo app on `server`'s `to`.
struct Held {
    client: std::net::TcpStream,
    _server: std::thread::JoinHandle<()>,
}

impl Held {
    fn open(from: &Pod, server: &Pod, to: SocketAddr) -> Held {
        let l = server.netns.run(|| listen(to)).unwrap();
        let srv = std::thread::spawn(move || {
            if let Ok((mut s, _)) = l.accept() {
                let mut b = [0u8; 64];
                while let Ok(n) = s.read_no_intr(&mut b) {
                    if n == 0 || s.write_all(&b[..n]).is_err() {
                        break;
                    }
                }
            }
        });
        let client = from
            .netns
            .run(|| connect(to, Duration::from_secs(5)))
            .unwrap();
        client
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let mut h = Held {
            client,
            _server: srv,
        };
        assert!(h.echoes(), "the held connection does not echo");
        h
    }

    /// One round trip; false once the connection is gone.
    fn echoes(&mut self) -> bool {
        if self.client.write_all(b"ping").is_err() {
            return false;
        }
        let mut b = [0u8; 4];
        matches!(self.client.read_exact(&mut b), Ok(()) if &b == b"ping")
    }
}

/// Pushes to every stream and waits until each has applied (ACKed) it.
fn push_applied(istiod: &XdsServer, type_url: &str, upserts: Vec<Resource>, removals: Vec<String>) {
    applied(istiod, istiod.push(type_url, upserts, removals));
}

/// Waits until every stream a push went to (`nonces`) ACKed it: applied.
fn applied(istiod: &XdsServer, nonces: Vec<String>) {
    assert!(!nonces.is_empty(), "the push reached no stream");
    for nonce in nonces {
        istiod
            .wait_for_request(PATIENCE, |r| {
                r.request.is_ack() && r.request.response_nonce == nonce
            })
            .unwrap_or_else(|e| panic!("a push was not applied: {e}"));
    }
}

fn readiness_body(node: &Node) -> String {
    ringway_testbed::http::get(node.control(15021), "/healthz/ready")
        .map(|r| format!("{} {}", r.status, r.body))
        .unwrap_or_else(|e| e.to_string())
}

#[test]
fn xds_two_nodes_serve_hbone_services_and_policies_from_the_control_plane() {
    drill(
        "xds_two_nodes_serve_hbone_services_and_policies_from_the_control_plane",
        "xds-e2e",
        |bed| {
            // The proxies start before the control plane can be reached:
            // not ready, whatever else is in place.
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            let (client, server) = (bed.n1.pod(0), bed.n2.pod(0));
            assert!(
                wait_until(PATIENCE, || {
                    let r = readiness_body(&node1);
                    r.starts_with("503") && r.contains("waiting for the control plane")
                }),
                "before any push: {}",
                readiness_body(&node1)
            );
            let istiod = bed.start_istiod();
            istiod.update_fixture(
                ADDRESS_TYPE_URL,
                vec![
                    workload(client, 1, "1"),
                    workload(server, 2, "1"),
                    web_service(),
                ],
                vec![],
            );
            // The server's workload is an endpoint of the service.
            istiod.update_fixture(
                ADDRESS_TYPE_URL,
                vec![workload_with(server, 2, "1", web_endpoint)],
                vec![],
            );
            bed.wait_ready(&node1);
            bed.wait_ready(&node2);
            bed.cni_add(&node1, client);
            bed.cni_add(&node2, server);

            // Pod to pod over HBONE, both families; the app sees the client.
            for v6 in [false, true] {
                let to = SocketAddr::new(server.ip(v6), 8080);
                let seen = exchange(client, server, to, to).unwrap();
                assert_eq!(seen, client.ip(v6), "the app saw the client's address");
            }
            let m2 = scrape(node2.control(15020)).unwrap();
            assert!(
                prom::sum(
                    &m2,
                    "istio_tcp_connections_opened_total",
                    &[
                        "source_principal=\"spiffe://cluster.local/ns/demo/sa/default\"",
                        "connection_security_policy=\"mutual_tls\""
                    ]
                ) >= 2.0,
                "node2 saw no mutual-TLS connection from the client's identity:\n{m2}"
            );
            assert!(
                prom::sum(
                    &m2,
                    "istio_tcp_connections_opened_total",
                    &["destination_canonical_service=\"demo-app\""]
                ) >= 2.0,
                "the workload's canonical name from the control plane:\n{m2}"
            );
            // The service's VIP reaches its endpoint over the tunnel.
            let seen = through_the_vip(client, server).unwrap();
            assert_eq!(seen, client.ip(false));

            // The same token and root served both streams: every xDS stream
            // carried the node's token, and the certificate service
            // reviewed exactly those tokens (its certificates are what the
            // tunnels used: the exchanges above passed).
            for n in [1u8, 2] {
                assert!(
                    istiod
                        .requests()
                        .iter()
                        .filter(|r| r.first_of_type)
                        .any(|r| r.bearer_token() == Some(token(n).as_str())),
                    "no xDS stream of node{n} carried its token"
                );
            }
            let reviewed = bed.reviewer.seen.lock().unwrap().clone();
            assert!(
                reviewed.contains(&token(1)) && reviewed.contains(&token(2)),
                "the certificate service reviewed {reviewed:?}"
            );
            assert!(
                reviewed.iter().all(|t| *t == token(1) || *t == token(2)),
                "{reviewed:?}"
            );
            let first = istiod
                .requests()
                .into_iter()
                .find(|r| r.first_of_type)
                .unwrap();
            assert_eq!(first.header("clusterid"), Some("Kubernetes"));

            // A policy pushed later closes an open connection it now denies.
            let to = SocketAddr::new(server.ip(false), 9090);
            let mut held = Held::open(client, server, to);
            istiod.push(
                AUTHORIZATION_TYPE_URL,
                vec![deny_principal(
                    "deny-default",
                    "cluster.local/ns/demo/sa/default",
                )],
                vec![],
            );
            assert!(
                wait_until(PATIENCE, || !held.echoes()),
                "the connection the new DENY covers stayed open"
            );
            let (what, _) = refused(client, server, SocketAddr::new(server.ip(false), 9091));
            eprintln!("a new connection under the DENY: {what}");
            push_applied(
                &istiod,
                AUTHORIZATION_TYPE_URL,
                vec![],
                vec!["demo/deny-default".into()],
            );
            exchange(
                client,
                server,
                SocketAddr::new(server.ip(false), 9092),
                SocketAddr::new(server.ip(false), 9092),
            )
            .expect("allowed again once the DENY is removed");

            // A stream drop: counted as a termination, and the proxy
            // comes back at once.
            assert_ne!(istiod.drop_streams(), 0, "no stream to drop");
            for node in [&node1, &node2] {
                assert!(
                    wait_until(PATIENCE, || {
                        let m = scrape(node.control(15020)).unwrap();
                        prom::sum(&m, "istio_xds_connection_terminations_total", &[]) >= 1.0
                            && prom::value(&m, "ringway_xds_connected", &[]) == Some(1.0)
                    }),
                    "node{}: no termination counted, or not connected again:\n{}",
                    node.index,
                    scrape(node.control(15020)).unwrap()
                );
            }

            // The control plane goes away: both proxies are really
            // disconnected, and the state held keeps serving.
            let fixtures =
                [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL].map(|t| (t, istiod.fixture(t)));
            let terminations = |node: &Node| {
                let m = scrape(node.control(15020)).unwrap();
                prom::sum(&m, "istio_xds_connection_terminations_total", &[])
            };
            let before = [terminations(&node1), terminations(&node2)];
            istiod.stop();
            for (node, before) in [&node1, &node2].into_iter().zip(before) {
                assert!(
                    wait_until(PATIENCE, || {
                        let m = scrape(node.control(15020)).unwrap();
                        prom::value(&m, "ringway_xds_connected", &[]) == Some(0.0)
                            && prom::sum(&m, "istio_xds_connection_terminations_total", &[])
                                > before
                    }),
                    "node{} still says it is connected, or counted no termination:\n{}",
                    node.index,
                    scrape(node.control(15020)).unwrap()
                );
            }
            for (port, v6) in [(9093, false), (9095, true)] {
                let to = SocketAddr::new(server.ip(v6), port);
                let seen = exchange(client, server, to, to)
                    .unwrap_or_else(|e| panic!("not served while disconnected: {e}"));
                assert_eq!(seen, client.ip(v6));
            }
            for node in [&node1, &node2] {
                let m = scrape(node.control(15020)).unwrap();
                assert_eq!(
                    prom::value(&m, "ringway_xds_connected", &[]),
                    Some(0.0),
                    "the exchange ran while node{} was disconnected",
                    node.index
                );
            }
            // It comes back (with what it held): the proxies reconnect and
            // resume from the versions held.
            let istiod = bed.start_istiod();
            for (t, resources) in fixtures {
                istiod.update_fixture(t, resources, vec![]);
            }
            let resumed = istiod
                .wait_for_request(PATIENCE, |r| {
                    r.first_of_type
                        && r.request.type_url == ADDRESS_TYPE_URL
                        && r.request
                            .initial_resource_versions
                            .get(&uid_of(server))
                            .is_some_and(|v| v == "1")
                })
                .unwrap_or_else(|e| panic!("no resume with the versions held: {e}"));
            assert!(resumed
                .request
                .initial_resource_versions
                .contains_key(SERVICE));
            for node in [&node1, &node2] {
                assert!(
                    wait_until(PATIENCE, || {
                        let m = scrape(node.control(15020)).unwrap();
                        prom::value(&m, "ringway_xds_connected", &[]) == Some(1.0)
                    }),
                    "node{} never connected again",
                    node.index
                );
            }
            // The service held still reaches its endpoint.
            let seen = through_the_vip(client, server).unwrap();
            assert_eq!(seen, client.ip(false));

            // A removed workload's traffic is refused (the server's side no
            // longer knows whom it serves; the wait runs out).
            istiod.push(ADDRESS_TYPE_URL, vec![], vec![uid_of(server)]);
            // Both nodes applied it: the client's side no longer tunnels to
            // it (plaintext, as to any address outside the mesh), and the
            // server's side has nobody to serve it as.
            for node in [&node1, &node2] {
                assert!(wait_until(PATIENCE, || {
                    let m = scrape(node.control(15020)).unwrap();
                    prom::sum(&m, "ringway_xds_resources", &["kind=\"workload\""]) == 1.0
                }));
            }
            let (what, took) = refused(client, server, SocketAddr::new(server.ip(false), 9094));
            eprintln!("to a removed workload: {what} after {took:?}");
            assert!(
                took >= WORKLOAD_WAIT - Duration::from_millis(200),
                "refused after {took:?}, before the workload wait ran out"
            );
            let m2 = scrape(node2.control(15020)).unwrap();
            assert!(
                prom::sum(
                    &m2,
                    "ringway_connections_refused_total",
                    &["reason=\"unknown_workload\""]
                ) >= 1.0,
                "{m2}"
            );
            for m in [scrape(node1.control(15020)).unwrap(), m2] {
                assert!(prom::sum(&m, "istio_xds_message_total", &[]) >= 4.0, "{m}");
                assert_eq!(prom::sum(&m, "ringway_xds_nacks_total", &[]), 0.0, "{m}");
            }
            drop(node1.proxy);
            drop(node2.proxy);
        },
    );
}

#[test]
fn adversarial_xds_unknown_workloads_wait_then_are_refused_and_waypoint_traffic_is_refused() {
    drill(
        "adversarial_xds_unknown_workloads_wait_then_are_refused_and_waypoint_traffic_is_refused",
        "xds-e2e-adv",
        |bed| {
            let istiod = bed.start_istiod();
            let (client, server, late) = (bed.n1.pod(0), bed.n2.pod(0), bed.n2.pod(1));
            istiod.update_fixture(
                ADDRESS_TYPE_URL,
                vec![workload(client, 1, "1"), workload(server, 2, "1")],
                vec![],
            );
            let (node1, node2) = (bed.start_node(1), bed.start_node(2));
            bed.wait_ready(&node1);
            bed.wait_ready(&node2);
            bed.cni_add(&node1, client);
            bed.cni_add(&node2, server);
            // `late` is enrolled before the control plane has sent its
            // workload: its traffic waits, then is refused.
            bed.cni_add(&node2, late);
            let (what, took) = refused(client, late, SocketAddr::new(late.ip(false), 8080));
            assert!(
                took >= WORKLOAD_WAIT - Duration::from_millis(200),
                "refused after {took:?}: {what}"
            );
            // The same, and its workload arrives while the connection waits:
            // served with it.
            let l = late
                .netns
                .run(|| listen(SocketAddr::new(late.ip(false), 8081)))
                .unwrap();
            let srv = PayloadServer::start(l, 1);
            let to = SocketAddr::new(late.ip(false), 8081);
            let conn = std::thread::spawn({
                let netns = client.netns.clone();
                move || {
                    netns.run(|| {
                        ringway_testbed::traffic::client_exchange(
                            connect(to, Duration::from_secs(5))?,
                            4096,
                            4096,
                        )
                    })
                }
            });
            std::thread::sleep(WORKLOAD_WAIT / 4);
            istiod.push(ADDRESS_TYPE_URL, vec![workload(late, 2, "1")], vec![]);
            conn.join()
                .unwrap()
                .expect("served once its workload arrived within the wait");
            let rep = srv
                .next_report(PATIENCE)
                .expect("the late pod's app saw it");
            assert_eq!(rep.peer.ip(), client.ip(false));

            // A workload behind a waypoint: never sent around it.
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![workload_with(server, 2, "2", |w| {
                    w.waypoint = Some(wl::GatewayAddress {
                        destination: Some(wl::gateway_address::Destination::Hostname(
                            wl::NamespacedHostname {
                                namespace: "demo".into(),
                                hostname: "waypoint.demo.svc.cluster.local".into(),
                            },
                        )),
                        hbone_mtls_port: 15008,
                    });
                })],
                vec![],
            );
            let (what, _) = refused(client, server, SocketAddr::new(server.ip(false), 8080));
            eprintln!("to a workload behind a waypoint: {what}");
            let m1 = scrape(node1.control(15020)).unwrap();
            assert!(
                prom::sum(
                    &m1,
                    "ringway_connections_refused_total",
                    &["reason=\"waypoint\""]
                ) >= 1.0,
                "not counted:\n{m1}"
            );

            // A service behind a waypoint: its VIP is refused, never sent
            // to its endpoints around the waypoint. First without one (the
            // server's workload back without its waypoint): served.
            let waypoint = || wl::GatewayAddress {
                destination: Some(wl::gateway_address::Destination::Hostname(
                    wl::NamespacedHostname {
                        namespace: "demo".into(),
                        hostname: "waypoint.demo.svc.cluster.local".into(),
                    },
                )),
                hbone_mtls_port: 15008,
            };
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![workload_with(server, 2, "3", web_endpoint), web_service()],
                vec![],
            );
            let vip = SocketAddr::new(IpAddr::V4(VIP), 80);
            let at_server = SocketAddr::new(server.ip(false), 8080);
            let seen = exchange(client, server, at_server, vip).unwrap();
            assert_eq!(seen, client.ip(false), "the VIP without a waypoint: served");
            let waypoint_refusals = |m: &str| {
                prom::sum(
                    m,
                    "ringway_connections_refused_total",
                    &["reason=\"waypoint\""],
                )
            };
            let before = waypoint_refusals(&scrape(node1.control(15020)).unwrap());
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![with_service(web_service_with(|s| {
                    s.waypoint = Some(waypoint())
                }))],
                vec![],
            );
            let (what, _) = refused_at(client, server, at_server, vip);
            eprintln!("to a service behind a waypoint: {what}");
            let m1 = scrape(node1.control(15020)).unwrap();
            assert!(
                waypoint_refusals(&m1) > before,
                "the VIP behind a waypoint was not counted:\n{m1}"
            );
            let exchange_direct = exchange(client, server, at_server, at_server);
            assert!(
                exchange_direct.is_ok(),
                "the workload itself has no waypoint: {exchange_direct:?}"
            );

            // A workload whose app wants a PROXY protocol header (its
            // `application_tunnel`): refused and counted, never sent plain
            // TCP; said once in the log when it arrives.
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![workload_with(server, 2, "4", |w| {
                    w.application_tunnel = Some(wl::ApplicationTunnel {
                        protocol: wl::application_tunnel::Protocol::Proxy as i32,
                        port: 0,
                    });
                })],
                vec![],
            );
            for _ in 0..2 {
                let (what, _) = refused(client, server, at_server);
                eprintln!("to a workload that wants a PROXY header: {what}");
            }
            let m1 = scrape(node1.control(15020)).unwrap();
            assert!(
                prom::sum(
                    &m1,
                    "ringway_connections_refused_total",
                    &["reason=\"application_tunnel\""]
                ) >= 2.0,
                "not counted:\n{m1}"
            );
            let said = node1
                .log()
                .lines()
                .filter(|l| {
                    l.contains("workload from the control plane")
                        && l.contains("a PROXY protocol header")
                })
                .count();
            assert_eq!(said, 1, "said once when it arrived:\n{}", node1.log());

            // A second entry claiming the server's address (a workload of
            // another namespace, as a WorkloadEntry anyone may write): the
            // address resolves to neither, so its traffic is refused at the
            // source and counted, never sent in plaintext as if the address
            // were outside the mesh; and so is the VIP whose only endpoint
            // it is.
            let claim = Resource::new(
                "Kubernetes//networking.istio.io/WorkloadEntry/other/claim",
                "1",
                wl::Address {
                    kind: Some(address::Kind::Workload(wl::Workload {
                        uid: "Kubernetes//networking.istio.io/WorkloadEntry/other/claim".into(),
                        name: "claim".into(),
                        namespace: "other".into(),
                        addresses: vec![server.ipv4.octets().to_vec()],
                        node: "node2".into(),
                        ..Default::default()
                    })),
                }
                .to_any(),
            );
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![
                    workload_with(server, 2, "5", web_endpoint),
                    web_service(),
                    claim,
                ],
                vec![],
            );
            let contested = |m: &str| {
                prom::sum(
                    m,
                    "ringway_connections_refused_total",
                    &["reason=\"contested_address\""],
                )
            };
            let before = contested(&scrape(node1.control(15020)).unwrap());
            let (what, _) = refused(client, server, at_server);
            eprintln!("to a contested address: {what}");
            let m1 = scrape(node1.control(15020)).unwrap();
            assert_eq!(
                contested(&m1),
                before + 1.0,
                "a contested address was not refused at the source:\n{m1}"
            );
            let (what, _) = refused_at(client, server, at_server, vip);
            eprintln!("to a VIP whose only endpoint is contested: {what}");
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![],
                vec!["Kubernetes//networking.istio.io/WorkloadEntry/other/claim".into()],
            );
            let seen = exchange(client, server, at_server, vip).unwrap();
            assert_eq!(seen, client.ip(false), "the claim gone: served again");

            // Garbage from the control plane: NACKed, and the state held
            // keeps serving.
            istiod.push(
                ADDRESS_TYPE_URL,
                vec![Resource::new(
                    "Kubernetes//Pod/demo/garbage",
                    "1",
                    prost_types::Any {
                        type_url: ADDRESS_TYPE_URL.into(),
                        value: vec![0xff; 9],
                    },
                )],
                vec![],
            );
            let nack = istiod
                .wait_for_request(PATIENCE, |r| r.nack_message().is_some())
                .unwrap_or_else(|e| panic!("no NACK: {e}"));
            assert!(
                nack.nack_message()
                    .unwrap()
                    .contains("Kubernetes//Pod/demo/garbage"),
                "{:?}",
                nack.nack_message()
            );
            let seen = exchange(
                client,
                late,
                SocketAddr::new(late.ip(false), 8082),
                SocketAddr::new(late.ip(false), 8082),
            )
            .unwrap();
            assert_eq!(seen, client.ip(false));
        },
    );
}

/// The control plane holds the client (node 1), the server (node 2, an
/// endpoint of `web`) and `web`; both nodes started, ready, and their pod
/// enrolled.
fn serving_web(bed: &Bed, istiod: &XdsServer) -> (Node, Node) {
    let (client, server) = (bed.n1.pod(0), bed.n2.pod(0));
    istiod.update_fixture(
        ADDRESS_TYPE_URL,
        vec![
            workload(client, 1, "1"),
            workload_with(server, 2, "1", web_endpoint),
            web_service(),
        ],
        vec![],
    );
    let (node1, node2) = (bed.start_node(1), bed.start_node(2));
    bed.wait_ready(&node1);
    bed.wait_ready(&node2);
    bed.cni_add(&node1, client);
    bed.cni_add(&node2, server);
    (node1, node2)
}

/// Waits until both nodes NACKed a response naming `what`.
fn nacked_by_both(istiod: &XdsServer, what: &str) {
    let both = wait_until(PATIENCE, || {
        istiod
            .requests()
            .iter()
            .filter(|r| r.nack_message().is_some_and(|m| m.contains(what)))
            .count()
            >= 2
    });
    assert!(both, "both nodes did not NACK {what}");
}

/// What the control plane sends and this proxy refuses never takes traffic
/// out of the mesh, nor takes down what it served (a control plane newer
/// than its proxies, as an upgrade of the control plane first makes it,
/// sends values they do not know): a refused update of a service or a
/// workload keeps the copy held (the VIP and the pod still served over
/// mutual TLS, a connection open to the pod kept); a refused new service's
/// VIP and a refused new workload's address are refused at the source,
/// never connected to in plaintext as if outside the mesh. A policy that
/// could not be read denies what it could select, and once the control
/// plane has deleted it while no stream was open, the next stream takes
/// the deny away: the proxy lists it, so the server names its removal.
#[test]
fn adversarial_xds_refused_resources_keep_their_copy_or_are_refused_never_plaintext() {
    drill(
        "adversarial_xds_refused_resources_keep_their_copy_or_are_refused_never_plaintext",
        "xds-e2e-refused",
        |bed| {
            let istiod = bed.start_istiod();
            let (client, server, late) = (bed.n1.pod(0), bed.n2.pod(0), bed.n2.pod(1));
            let (node1, node2) = serving_web(bed, &istiod);
            bed.cni_add(&node2, late);
            let at_server = SocketAddr::new(server.ip(false), 8080);
            let mtls = |n: &Node| {
                prom::sum(
                    &scrape(n.control(15020)).unwrap(),
                    "istio_tcp_connections_opened_total",
                    &["connection_security_policy=\"mutual_tls\""],
                )
            };
            assert_eq!(through_the_vip(client, server).unwrap(), client.ip(false));
            let mut open = Held::open(client, server, SocketAddr::new(server.ip(false), 9090));

            // Updates this proxy cannot read: a service port 0, a tunnel
            // protocol it does not know.
            push_nacked(
                &istiod,
                vec![
                    Resource::new(
                        SERVICE,
                        "2",
                        wl::Address {
                            kind: Some(address::Kind::Service(web_service_with(|s| {
                                s.ports[0].service_port = 0
                            }))),
                        }
                        .to_any(),
                    ),
                    workload_with(server, 2, "2", |w| {
                        web_endpoint(w);
                        w.tunnel_protocol = 7;
                    }),
                ],
            );
            nacked_by_both(&istiod, "workload.tunnelProtocol");
            nacked_by_both(&istiod, "service.ports[0]");
            let before = mtls(&node2);
            assert!(
                open.echoes(),
                "a connection open to the pod whose update was refused was cut"
            );
            assert_eq!(
                through_the_vip(client, server).unwrap(),
                client.ip(false),
                "the VIP resolves to the copy held"
            );
            assert_eq!(
                exchange(client, server, at_server, at_server).unwrap(),
                client.ip(false),
                "the pod is served from the copy held"
            );
            assert!(
                mtls(&node2) >= before + 2.0,
                "not over mutual TLS: node2 counted {} such connections before, {} after",
                before,
                mtls(&node2)
            );

            // New resources this proxy cannot read: their addresses are
            // the mesh's, so their traffic is refused at the source.
            let new_vip = Ipv4Addr::new(10, 96, 0, 11);
            push_nacked(
                &istiod,
                vec![
                    Resource::new(
                        "demo/new.demo.svc.cluster.local",
                        "1",
                        wl::Address {
                            kind: Some(address::Kind::Service(web_service_with(|s| {
                                s.name = "new".into();
                                s.hostname = "new.demo.svc.cluster.local".into();
                                s.addresses[0].address = new_vip.octets().to_vec();
                                s.ports[0].service_port = 0;
                            }))),
                        }
                        .to_any(),
                    ),
                    workload_with(late, 2, "1", |w| w.tunnel_protocol = 7),
                ],
            );
            nacked_by_both(&istiod, "demo/new.demo.svc.cluster.local");
            let refused_here = |n: &Node| {
                prom::sum(
                    &scrape(n.control(15020)).unwrap(),
                    "ringway_connections_refused_total",
                    &["reason=\"refused_address\""],
                )
            };
            let before = refused_here(&node1);
            let (what, _) = refused_at(
                client,
                server,
                at_server,
                SocketAddr::new(IpAddr::V4(new_vip), 80),
            );
            eprintln!("to a refused service's VIP: {what}");
            let m1 = scrape(node1.control(15020)).unwrap();
            assert_eq!(
                refused_here(&node1),
                before + 1.0,
                "the refused service's VIP was not refused at the source:\n{m1}"
            );
            let (what, took) = refused(client, late, SocketAddr::new(late.ip(false), 8080));
            eprintln!("to a refused workload's address: {what} after {took:?}");
            let m1 = scrape(node1.control(15020)).unwrap();
            assert_eq!(
                refused_here(&node1),
                before + 2.0,
                "the refused workload's address was not refused at the source:\n{m1}"
            );

            // A policy that cannot be decoded denies what it could select.
            let corrupt = Resource::new(
                "demo/corrupt",
                "1",
                prost_types::Any {
                    type_url: AUTHORIZATION_TYPE_URL.into(),
                    value: vec![0x0a, 0xff],
                },
            );
            istiod.push(AUTHORIZATION_TYPE_URL, vec![corrupt], vec![]);
            nacked_by_both(&istiod, "demo/corrupt");
            let (what, _) = refused(client, server, at_server);
            eprintln!("to a pod under an unreadable policy: {what}");
            // Deleted while no stream is open: the next stream lists it
            // with a version no server gives, and the server removes it.
            istiod.update_fixture(AUTHORIZATION_TYPE_URL, vec![], vec!["demo/corrupt".into()]);
            let old_stream = istiod.requests().iter().map(|r| r.stream).max().unwrap();
            assert!(istiod.drop_streams() >= 2);
            for n in 1..=2 {
                let again = istiod
                    .wait_for_request(PATIENCE, |r| {
                        r.first_of_type
                            && r.stream > old_stream
                            && r.request.type_url == AUTHORIZATION_TYPE_URL
                            && r.bearer_token() == Some(token(n).as_str())
                    })
                    .unwrap_or_else(|e| panic!("node{n}'s stream did not come back: {e}"));
                assert_eq!(
                    again.request.initial_resource_versions.get("demo/corrupt"),
                    Some(&String::new()),
                    "node{n} did not list the stand-in: {:?}",
                    again.request.initial_resource_versions
                );
                let removal = wait_until(PATIENCE, || {
                    istiod.sent().iter().any(|r| {
                        r.stream == again.stream && r.removed.iter().any(|n| n == "demo/corrupt")
                    })
                });
                assert!(removal, "the server named no removal to node{n}");
                let nonce = istiod
                    .sent()
                    .into_iter()
                    .find(|r| {
                        r.stream == again.stream && r.removed.iter().any(|n| n == "demo/corrupt")
                    })
                    .unwrap()
                    .nonce;
                applied(&istiod, vec![nonce]);
            }
            assert_eq!(
                exchange(client, server, at_server, at_server).unwrap(),
                client.ip(false),
                "the deny of a policy deleted while no stream was open stayed in force"
            );
        },
    );
}

/// Pushes `upserts` of addresses to every stream (each NACKs them).
fn push_nacked(istiod: &XdsServer, upserts: Vec<Resource>) {
    assert!(!istiod.push(ADDRESS_TYPE_URL, upserts, vec![]).is_empty());
}

/// A service's endpoints are picked as the control plane asks
/// (`load_balancing`): `internalTrafficPolicy: Local` (node, strict) never
/// sends a connection to another node's endpoint (refused when its own
/// node has none), a preference (failover) falls back to it,
/// `publishNotReadyAddresses` (allow all) takes an endpoint that is not
/// ready; and an endpoint on its node's network (`hostNetwork`) is reached
/// at its node's address.
#[test]
fn xds_services_follow_their_load_balancing_and_reach_host_network_endpoints() {
    drill(
        "xds_services_follow_their_load_balancing_and_reach_host_network_endpoints",
        "xds-e2e-lb",
        |bed| {
            use wl::load_balancing::{HealthPolicy, Mode, Scope};
            let istiod = bed.start_istiod();
            let (client, server) = (bed.n1.pod(0), bed.n2.pod(0));
            // Kept: dropping a node stops its processes.
            let _nodes = serving_web(bed, &istiod);
            let vip = SocketAddr::new(IpAddr::V4(VIP), 80);
            let at_server = SocketAddr::new(server.ip(false), 8080);
            assert_eq!(
                exchange(client, server, at_server, vip).unwrap(),
                client.ip(false)
            );
            let lb = |scopes: &[Scope], mode: Mode, health: HealthPolicy| {
                with_service(web_service_with(|s| {
                    s.load_balancing = Some(wl::LoadBalancing {
                        routing_preference: scopes.iter().map(|s| *s as i32).collect(),
                        mode: mode as i32,
                        health_policy: health as i32,
                        dns_connect_strategy: 0,
                    })
                }))
            };
            // internalTrafficPolicy: Local: the only endpoint is on node 2.
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![lb(&[Scope::Node], Mode::Strict, HealthPolicy::OnlyHealthy)],
                vec![],
            );
            let (what, _) = refused_at(client, server, at_server, vip);
            eprintln!("node-local service, no endpoint on the client's node: {what}");
            // The same scope as a preference: the other node's, for want
            // of a closer one.
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![lb(
                    &[Scope::Node],
                    Mode::Failover,
                    HealthPolicy::OnlyHealthy,
                )],
                vec![],
            );
            assert_eq!(
                exchange(client, server, at_server, vip).unwrap(),
                client.ip(false)
            );
            // The endpoint not ready: refused, unless the service takes
            // endpoints that are not ready.
            let unready = |w: &mut wl::Workload| {
                web_endpoint(w);
                w.status = wl::WorkloadStatus::Unhealthy as i32;
            };
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![workload_with(server, 2, "2", unready), web_service()],
                vec![],
            );
            let (what, _) = refused_at(client, server, at_server, vip);
            eprintln!("its only endpoint not ready: {what}");
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![lb(&[], Mode::UnspecifiedMode, HealthPolicy::AllowAll)],
                vec![],
            );
            assert_eq!(
                exchange(client, server, at_server, vip).unwrap(),
                client.ip(false)
            );

            // A service whose only endpoint is on node 2's own network.
            let node_ip = Ipv4Addr::new(10, 244, 2, 1);
            let host_vip = Ipv4Addr::new(10, 96, 0, 77);
            let host_svc = "demo/hostapp.demo.svc.cluster.local";
            let host_app = Resource::new(
                "Kubernetes//Pod/demo/hostapp",
                "1",
                wl::Address {
                    kind: Some(address::Kind::Workload(wl::Workload {
                        uid: "Kubernetes//Pod/demo/hostapp".into(),
                        name: "hostapp".into(),
                        namespace: "demo".into(),
                        addresses: vec![node_ip.octets().to_vec()],
                        network_mode: wl::NetworkMode::HostNetwork as i32,
                        node: "node2".into(),
                        services: [(
                            host_svc.to_owned(),
                            wl::PortList {
                                ports: vec![wl::Port {
                                    service_port: 80,
                                    target_port: 9090,
                                }],
                            },
                        )]
                        .into(),
                        ..Default::default()
                    })),
                }
                .to_any(),
            );
            let hostapp = web_service_with(|s| {
                s.name = "hostapp".into();
                s.hostname = "hostapp.demo.svc.cluster.local".into();
                s.addresses[0].address = host_vip.octets().to_vec();
                s.ports[0].target_port = 9090;
            });
            let host_service = Resource::new(
                host_svc,
                "1",
                wl::Address {
                    kind: Some(address::Kind::Service(hostapp)),
                }
                .to_any(),
            );
            push_applied(
                &istiod,
                ADDRESS_TYPE_URL,
                vec![host_app, host_service],
                vec![],
            );
            let l = bed
                .n2
                .node
                .run(|| listen(SocketAddr::new(IpAddr::V4(node_ip), 9090)))
                .unwrap();
            let srv = PayloadServer::start(l, 1);
            client
                .netns
                .run(|| {
                    ringway_testbed::traffic::client_exchange(
                        connect(SocketAddr::new(IpAddr::V4(host_vip), 80), PATIENCE)?,
                        4096,
                        4096,
                    )
                })
                .expect("the host-network endpoint reached through the service");
            let rep = srv.next_report(PATIENCE).expect("the host app saw it");
            assert_eq!(rep.peer.ip(), client.ip(false));
        },
    );
}

/// `ringway proxy --mesh-source xds --pod UID=NETNS` (no agent): the pods
/// on the command line are taken only once the control plane's first
/// workloads *and* policies are in. Here the control plane sends the
/// workloads and is slow with the policies: a pod served before the
/// policies came would take traffic its policy denies.
#[test]
fn adversarial_xds_pod_flag_pods_wait_for_the_first_policies() {
    drill(
        "adversarial_xds_pod_flag_pods_wait_for_the_first_policies",
        "xds-pod-flag",
        |bed| {
            let istiod = bed.start_istiod();
            let (denied, server, allowed) = (bed.n1.pod(0), bed.n1.pod(1), bed.n2.pod(0));
            istiod.update_fixture(ADDRESS_TYPE_URL, vec![workload(server, 1, "1")], vec![]);
            istiod.hold_first_responses(AUTHORIZATION_TYPE_URL);
            let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings::default());
            ringway_redirect::apply(server.netns.fd(), &spec).unwrap();
            let (proxy, log) = pod_flag_proxy(bed, server);
            let proxy_log = || std::fs::read_to_string(&log).unwrap_or_default();
            // The workloads are in (applied), the policies are not.
            istiod
                .wait_for_request(PATIENCE, |r| {
                    r.request.type_url == ADDRESS_TYPE_URL && r.request.is_ack()
                })
                .unwrap_or_else(|e| panic!("the workloads were not applied: {e}\n{}", proxy_log()));
            let metrics: SocketAddr = "127.0.0.1:15020".parse().unwrap();
            assert!(
                wait_until(PATIENCE, || scrape(metrics).is_ok()),
                "no metrics endpoint:\n{}",
                proxy_log()
            );
            // Not a pod taken, not ready, nothing served: the denied
            // client's connection never reaches the app.
            let (what, _) = refused(denied, server, SocketAddr::new(server.ip(false), 8080));
            eprintln!("before the first policies: {what}");
            let page = scrape(metrics).unwrap();
            assert_eq!(
                prom::value(&page, "ringway_pods_enrolled", &[]),
                Some(0.0),
                "a pod was taken before the first policies:\n{}",
                proxy_log()
            );
            let body =
                ringway_testbed::http::get("127.0.0.1:15021".parse().unwrap(), "/healthz/ready")
                    .map(|r| format!("{} {}", r.status, r.body))
                    .unwrap_or_else(|e| e.to_string());
            assert!(
                body.starts_with("503"),
                "ready before the first policies: {body}"
            );
            // The policies come: the pod is taken, named by its workload,
            // and its policy holds from its first connection.
            push_applied(
                &istiod,
                AUTHORIZATION_TYPE_URL,
                vec![deny_source("deny-n1-pod0", denied.ipv4)],
                vec![],
            );
            assert!(
                wait_until(PATIENCE, || ready("127.0.0.1:15021".parse().unwrap())),
                "never ready after the first policies:\n{}",
                proxy_log()
            );
            assert_eq!(
                prom::value(&scrape(metrics).unwrap(), "ringway_pods_enrolled", &[]),
                Some(1.0)
            );
            let (what, _) = refused(denied, server, SocketAddr::new(server.ip(false), 8080));
            eprintln!("the denied client after the first policies: {what}");
            let to = SocketAddr::new(server.ip(false), 8080);
            let saw = exchange(allowed, server, to, to).expect("the allowed client is served");
            assert_eq!(saw, allowed.ip(false));
            let dump =
                ringway_testbed::http::get("127.0.0.1:15000".parse().unwrap(), "/config_dump")
                    .unwrap();
            let dump: serde_json::Value = serde_json::from_str(&dump.body).unwrap();
            let pods = dump["pods"].as_array().unwrap();
            let rec = pods
                .iter()
                .find(|p| p["uid"] == uid_of(server).as_str())
                .unwrap();
            assert_eq!(rec["name"], server.name.as_str(), "{dump}");
            assert_eq!(rec["namespace"], "demo", "{dump}");
            drop(proxy);
        },
    );
}

/// Node 1's proxy with `--mesh-source xds` and no agent: `server` given
/// with `--pod` (its uid the control plane's); its log file.
fn pod_flag_proxy(bed: &Bed, server: &Pod) -> (Proc, PathBuf) {
    let config = bed.dir.join("node1.yaml");
    std::fs::write(
        &config,
        format!("trustDomain: {TD}\nproxy:\n  workloadWait: 1\n"),
    )
    .unwrap();
    let log = bed.dir.join("proxy1.log");
    let proxy = Proc(
        std::process::Command::new(env!("CARGO_BIN_EXE_ringway"))
            .args(["--log-format", "text", "--log", "info", "proxy"])
            .args(["--readiness-addr", "127.0.0.1:15021"])
            .args(["--metrics-addr", "127.0.0.1:15020"])
            .args(["--admin-addr", "127.0.0.1:15000"])
            .arg("--config")
            .arg(&config)
            .env("POD_NAME", "ztunnel-node1")
            .env("POD_NAMESPACE", PROXY_NS)
            .env("INSTANCE_IP", "10.0.0.1")
            .env("NODE_NAME", "node1")
            .args(["--mesh-source", "xds", "--xds-address", XDS_ADDR])
            .args(["--xds-server-name", ISTIOD])
            .arg("--xds-root-cert")
            .arg(&bed.root)
            .arg("--xds-token-file")
            .arg(bed.dir.join("node1.token"))
            .arg("--pod")
            .arg(format!(
                "{}={}",
                uid_of(server),
                server.netns.path().display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    (proxy, log)
}

/// The same proxy, its control plane unreachable: SIGTERM while it waits
/// for the first snapshot stops it at once, no pod taken.
#[test]
fn xds_pod_flag_proxy_stops_on_sigterm_while_it_waits_for_the_control_plane() {
    drill(
        "xds_pod_flag_proxy_stops_on_sigterm_while_it_waits_for_the_control_plane",
        "xds-pod-flag-stop",
        |bed| {
            let server = bed.n1.pod(1);
            let (mut proxy, log) = pod_flag_proxy(bed, server);
            let proxy_log = || std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                wait_until(PATIENCE, || proxy_log()
                    .contains("waiting for the mesh source's first snapshot")),
                "the proxy is not waiting for its control plane:\n{}",
                proxy_log()
            );
            let t0 = Instant::now();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(proxy.0.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            let status = loop {
                if let Some(st) = proxy.0.try_wait().unwrap() {
                    break st;
                }
                assert!(
                    t0.elapsed() < PATIENCE,
                    "still running {PATIENCE:?} after SIGTERM:\n{}",
                    proxy_log()
                );
                std::thread::sleep(Duration::from_millis(20));
            };
            assert!(status.success(), "{status:?}:\n{}", proxy_log());
            eprintln!("stopped {:?} after SIGTERM", t0.elapsed());
            let log = proxy_log();
            assert!(log.contains("no pod was taken"), "{log}");
        },
    );
}

/// The control plane's root rotated: istiod restarts with a serving
/// certificate of a new root, which the running proxy refuses (its root
/// file names only the old one) until the file holds both; then it
/// reconnects, with no restart, and the certificate service's client (the
/// same root file) takes both roots too.
#[test]
fn xds_a_control_plane_root_rotation_is_followed_without_a_restart() {
    drill(
        "xds_a_control_plane_root_rotation_is_followed_without_a_restart",
        "xds-root-rotation",
        |bed| {
            let istiod = bed.start_istiod();
            let node1 = bed.start_node(1);
            bed.wait_ready(&node1);
            let metric = |name: &str| {
                prom::value(&scrape(node1.control(15020)).unwrap(), name, &[]).unwrap_or(-1.0)
            };
            assert_eq!(metric("ringway_xds_connected"), 1.0);
            assert_eq!(metric("ringway_trust_roots"), 1.0);

            // istiod comes back with a serving certificate of a new root.
            let next = ringway_identity::CaSigner::generate_for_tests(TD);
            let leaf = next.issue_dns_for_tests(ISTIOD);
            istiod.stop();
            let istiod = bed.start_istiod_with(server_tls(leaf.chain, leaf.key).unwrap());
            assert!(
                wait_until(PATIENCE, || istiod.tls_failures() >= 1),
                "the proxy never tried the new serving certificate"
            );
            assert_eq!(
                metric("ringway_xds_connected"),
                0.0,
                "connected through a root it was not given"
            );

            // The root file gets both roots: the running proxy reconnects.
            let old = std::fs::read_to_string(&bed.root).unwrap();
            let tmp = bed.root.with_extension("tmp");
            std::fs::write(&tmp, format!("{old}{}", next.cert_pem())).unwrap();
            std::fs::rename(&tmp, &bed.root).unwrap();
            assert!(
                wait_until(PATIENCE * 3, || metric("ringway_xds_connected") == 1.0),
                "never reconnected after the root file was edited:\n{}",
                node1.log()
            );
            assert_eq!(metric("ringway_trust_roots"), 2.0);
            // The certificate service behind the new serving certificate:
            // a pod enrolled now gets its certificate through it.
            bed.cni_add(&node1, bed.n1.pod(0));
            let id = "identity=\"spiffe://cluster.local/ns/demo/sa/default\"";
            assert!(
                wait_until(PATIENCE, || prom::value(
                    &scrape(node1.control(15020)).unwrap(),
                    "ringway_certificate_expiry_timestamp_seconds",
                    &[id]
                )
                .is_some_and(|v| v > 0.0)),
                "no certificate through the control plane's new serving certificate:\n{}",
                node1.log()
            );
            assert!(
                node1.log().contains("trust bundle reloaded"),
                "{}",
                node1.log()
            );
        },
    );
}
