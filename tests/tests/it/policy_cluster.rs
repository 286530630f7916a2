//! Policies from the cluster, live, end to end: two virtual nodes with HBONE
//! (the client pod on node 1, the server pod on node 2), their mesh from a
//! fake Kubernetes API server through the same `MeshWatch` the proxy runs
//! with `--mesh-source kubernetes`, each snapshot published to both
//! proxies. An `AuthorizationPolicy` created in the API denies new
//! connections and resets the open one; deleted, they pass again. A STRICT
//! `PeerAuthentication` refuses plaintext from outside the mesh while HBONE
//! from the mesh's client pod passes.

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use common::hbone::{two_nodes, Opts, TwoNodes, APP_PORT};
use common::{wait_until, TIMEOUT};
use ringway_config::kube::{KubeOptions, MeshWatch};
use ringway_config::{Mesh, MeshConfig, NoEnv};
use ringway_testbed::kube_api::{fixtures, FakeApiServer, Kind};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{connect, listen, EchoServer};
use serde_json::{json, Value};

/// The configuration file: no workloads (they come from the API server).
const FILE: &str = "trustDomain: cluster.local\n";

/// The bed's pods as the API server lists them: `front/client-0`
/// (frontend, node1) and `shop/server-0` (web, node2, `app=web`), both
/// enrolled.
fn pods(api: &FakeApiServer) {
    let pod = |ns: &str, name: &str, sa: &str, ips: [&str; 2], app: &str| {
        fixtures::FakePod::new(&format!("uid-{name}"), ns, name, "node")
            .created("2026-01-01T00:00:00Z")
            .service_account(sa)
            .label("app", app)
            .mode("enabled")
            .running(&ips)
            .json()
    };
    api.apply(
        Kind::Pod,
        pod(
            "front",
            "client-0",
            "frontend",
            ["10.244.1.2", "fd00:244:1::2"],
            "client",
        ),
    );
    api.apply(
        Kind::Pod,
        pod(
            "shop",
            "server-0",
            "web",
            ["10.244.2.2", "fd00:244:2::2"],
            "web",
        ),
    );
}

fn istio_object(ns: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
        "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec})
}

/// The watch, publishing every snapshot to both proxies (on a thread of
/// the test's scope, as the proxy's callback does).
struct Cluster {
    api: FakeApiServer,
    watch: MeshWatch,
    /// The last snapshot both proxies have.
    applied: Arc<Mutex<Option<Arc<Mesh>>>>,
}

/// A fake API server on its own current-thread runtime (which the caller
/// keeps, or hands to a watch), and a client of it.
fn fake_api() -> (tokio::runtime::Runtime, kube::Client, FakeApiServer) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, api) = FakeApiServer::start(runtime.handle());
    (runtime, client, api)
}

fn start_watch<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    t: &'scope TwoNodes,
) -> Cluster {
    let (runtime, client, api) = fake_api();
    pods(&api);
    let file = Arc::new(MeshConfig::load_str(FILE, "policy_cluster", &NoEnv).unwrap());
    let (tx, rx) = mpsc::channel::<Arc<Mesh>>();
    let watch = MeshWatch::start(runtime, client, file, KubeOptions::default(), move |m| {
        let _ = tx.send(m);
    })
    .unwrap();
    let applied = Arc::new(Mutex::new(None));
    let last = applied.clone();
    scope.spawn(move || {
        // Ends when the watch stops (its callback, and the sender, drop).
        for m in rx {
            t.set_mesh(m.clone());
            *last.lock().unwrap() = Some(m);
        }
    });
    Cluster {
        api,
        watch,
        applied,
    }
}

impl Cluster {
    /// Waits (bounded) until both proxies have a snapshot where `ok`;
    /// returns how long it took.
    fn until(&self, what: &str, ok: impl Fn(&Mesh) -> bool) -> std::time::Duration {
        let t0 = Instant::now();
        assert!(
            wait_until(TIMEOUT, || self
                .applied
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|m| ok(m))),
            "no snapshot where {what}"
        );
        t0.elapsed()
    }
}

fn has_policy(m: &Mesh, name: &str) -> bool {
    m.policies().any(|p| p.qualified_name().as_ref() == name)
}

fn echo_once(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"ping")?;
    let mut back = [0u8; 4];
    s.read_exact(&mut back)?;
    if &back != b"ping" {
        return Err(std::io::Error::other("echo differs"));
    }
    Ok(())
}

fn open(ns: &ringway_testbed::Netns, to: SocketAddr) -> std::io::Result<TcpStream> {
    ns.run(|| {
        let s = connect(to, TIMEOUT)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        Ok(s)
    })
}

/// A fresh connection and one round trip.
fn exchange(ns: &ringway_testbed::Netns, to: SocketAddr) -> std::io::Result<()> {
    open(ns, to).and_then(|mut s| echo_once(&mut s))
}

fn is_refusal(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
    )
}

fn expect_refused(r: std::io::Result<()>, what: &str) {
    let e = r.expect_err(&format!("{what}: should have been refused"));
    assert!(
        is_refusal(&e),
        "{what}: failed, but not by a reset or close: {e}"
    );
}

#[test]
fn authorization_policy_from_the_cluster_applies_live() {
    run_isolated("authorization_policy_from_the_cluster_applies_live", || {
        let t = two_nodes(Opts::new("policy_cluster_ap"));
        std::thread::scope(|scope| {
            let c = start_watch(scope, &t);
            c.until("the pods are workloads", |m| m.workload_count() == 2);
            let server = SocketAddr::new(t.server().ip(false), APP_PORT);
            let app = EchoServer::start(t.server().netns.run(|| listen(server)).unwrap());

            // Allowed: one connection stays open, over HBONE.
            let mut open_one = open(&t.client().netns, server).unwrap();
            echo_once(&mut open_one).unwrap();
            assert!(t.p1.hbone_connections_opened() >= 1, "over HBONE");

            // An AuthorizationPolicy denying the client's principal.
            c.api.apply(
                Kind::AuthorizationPolicy,
                istio_object(
                    "shop",
                    "deny-frontend",
                    json!({"selector": {"matchLabels": {"app": "web"}}, "action": "DENY",
                        "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/front/sa/frontend"]}}]}]}),
                ),
            );
            let took = c.until("the policy is in force", |m| {
                has_policy(m, "istio/shop/deny-frontend")
            });
            eprintln!("AuthorizationPolicy created -> in force on both proxies: {took:?}");
            // The open connection was reset by the re-check; a new one is refused.
            expect_refused(echo_once(&mut open_one), "the open connection");
            expect_refused(exchange(&t.client().netns, server), "a new connection");

            // Deleted: allowed again.
            c.api
                .delete(Kind::AuthorizationPolicy, "shop", "deny-frontend");
            c.until("the policy is gone", |m| {
                !has_policy(m, "istio/shop/deny-frontend")
            });
            exchange(&t.client().netns, server).expect("allowed again");
            assert!(app.connections() >= 2);
            c.watch.stop();
        });
    });
}

#[test]
fn peer_authentication_strict_refuses_plaintext_while_hbone_passes() {
    run_isolated(
        "peer_authentication_strict_refuses_plaintext_while_hbone_passes",
        || {
            let t = two_nodes(Opts::new("policy_cluster_pa"));
            std::thread::scope(|scope| {
                let c = start_watch(scope, &t);
                c.until("the pods are workloads", |m| m.workload_count() == 2);
                let server = SocketAddr::new(t.server().ip(false), APP_PORT);
                let _app = EchoServer::start(t.server().netns.run(|| listen(server)).unwrap());

                // PERMISSIVE (nothing set): plaintext from outside the mesh
                // (node 2's own netns) passes; one stays open.
                let mut plain = open(&t.n2.node, server).unwrap();
                echo_once(&mut plain).unwrap();
                exchange(&t.client().netns, server).expect("HBONE");

                c.api.apply(
                    Kind::PeerAuthentication,
                    istio_object("shop", "default", json!({"mtls": {"mode": "STRICT"}})),
                );
                let took = c.until("STRICT is in force", |m| {
                    !m.peer_authentications().is_empty()
                });
                eprintln!("PeerAuthentication created -> in force on both proxies: {took:?}");
                expect_refused(echo_once(&mut plain), "the open plaintext connection");
                expect_refused(exchange(&t.n2.node, server), "new plaintext");
                exchange(&t.client().netns, server).expect("HBONE from a mesh pod passes");

                // A DISABLE on the workload is PERMISSIVE (ambient has no plaintext mode).
                c.api.apply(
                    Kind::PeerAuthentication,
                    istio_object(
                        "shop",
                        "web",
                        json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "DISABLE"}}),
                    ),
                );
                c.until("the workload's override is in force", |m| {
                    m.peer_authentications().len() == 2
                });
                exchange(&t.n2.node, server).expect("plaintext under PERMISSIVE");
                c.watch.stop();
            });
        },
    );
}

/// `config_dump` names each cluster policy's origin object, the skipped
/// objects with why, and the metrics count them; the objects read toward
/// deny (an unreadable AuthorizationPolicy, a PeerAuthentication that cannot
/// be read or names an unknown mode) are each named in
/// `ringway_cluster_policies_read_toward_deny`.
#[test]
fn authorization_policy_config_dump_shows_origins_and_skipped_objects() {
    run_isolated(
        "authorization_policy_config_dump_shows_origins_and_skipped_objects",
        || {
            let mn = common::MeshNode::new(
                1,
                ringway_config::CaptureMode::Tproxy,
                ringway_config::Datapath::Auto,
            );
            let proxy = Arc::new(mn.proxy);
            let (runtime, client, api) = fake_api();
            pods(&api);
            api.apply(
                Kind::AuthorizationPolicy,
                istio_object("shop", "good", json!({"action": "DENY", "rules": [{}]})),
            );
            api.apply(
                Kind::AuthorizationPolicy,
                istio_object("shop", "audit", json!({"action": "AUDIT", "rules": [{}]})),
            );
            api.apply(
                Kind::AuthorizationPolicy,
                istio_object(
                    "shop",
                    "broken",
                    json!({"action": "DENY", "rules": [{"from": [{"source":
                        {"ipBlocks": ["not-an-address", "192.0.2.0/24"]}}]}]}),
                ),
            );
            api.apply(
                Kind::AuthorizationPolicy,
                istio_object("shop", "bad-action", json!({"action": "PERMIT"})),
            );
            api.apply(
                Kind::PeerAuthentication,
                istio_object(
                    "istio-system",
                    "default",
                    json!({"mtls": {"mode": "STRICT"}}),
                ),
            );
            // Read toward deny: a mode the API does not define, and a spec
            // that cannot be read; both STRICT, both named in the metric.
            api.apply(
                Kind::PeerAuthentication,
                istio_object("shop", "bad-mode", json!({"mtls": {"mode": "SOMETIMES"}})),
            );
            api.apply(
                Kind::PeerAuthentication,
                istio_object("shop", "bad-shape", json!({"mtls": "STRICT"})),
            );
            let file = Arc::new(MeshConfig::load_str(FILE, "policy_cluster", &NoEnv).unwrap());
            let target = proxy.clone();
            let watch = MeshWatch::start(runtime, client, file, KubeOptions::default(), move |m| {
                target.set_mesh(m);
            })
            .unwrap();
            assert!(wait_until(TIMEOUT, || proxy
                .mesh()
                .is_some_and(|m| m.cluster_policy_notes().len() == 5)));
            let admin = ringway_proxy::control::ControlServer::serve(
                "127.0.0.1:0".parse().unwrap(),
                ringway_proxy::control::admin_handler(proxy.clone(), Arc::new(|_: &str| Ok(()))),
            )
            .unwrap();
            let r = ringway_testbed::http::request(admin.addr, "GET", "/config_dump", &[]).unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
            let dump: Value = serde_json::from_str(&r.body).unwrap();
            let mesh = &dump["mesh"];
            let good = mesh["policies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "istio/shop/good")
                .unwrap_or_else(|| panic!("{}", r.body));
            assert_eq!(good["origin"], "AuthorizationPolicy shop/good");
            assert_eq!(good["action"], "DENY");
            let pa = mesh["peerAuthentications"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["origin"] == "PeerAuthentication istio-system/default")
                .unwrap_or_else(|| panic!("{}", r.body));
            assert_eq!(pa["mode"], "STRICT");
            assert_eq!(pa["meshWide"], true);
            let notes = mesh["clusterPolicyNotes"].as_array().unwrap();
            let reason_of = |object: &str| {
                notes
                    .iter()
                    .find(|n| n["object"] == object)
                    .unwrap_or_else(|| panic!("{object} not in {notes:?}"))
                    .clone()
            };
            let audit = reason_of("AuthorizationPolicy shop/audit");
            assert_eq!(audit["skipped"], true);
            assert_eq!(audit["reason"], "unsupported-action");
            // A bad entry is left out, its policy kept.
            let broken = reason_of("AuthorizationPolicy shop/broken");
            assert_eq!(broken["skipped"], false);
            assert_eq!(broken["reason"], "entry-skipped");
            assert!(mesh["policies"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "istio/shop/broken"));
            // An action the API does not define: kept, denying everything
            // of its namespace, named.
            let bad_action = reason_of("AuthorizationPolicy shop/bad-action");
            assert_eq!(bad_action["reason"], "unreadable-deny-all");
            assert_eq!(bad_action["skipped"], false);
            assert!(mesh["policies"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "istio/shop/bad-action" && p["action"] == "DENY"));
            assert!(
                broken["detail"]
                    .as_str()
                    .unwrap()
                    .contains("not-an-address"),
                "{broken}"
            );
            let text = ringway_proxy::metrics::encode(&proxy.metrics().registry(), false);
            let line = "ringway_cluster_policies_skipped{kind=\"AuthorizationPolicy\",reason=\"unsupported-action\"} 1";
            assert!(text.contains(line), "{line} not in\n{text}");
            let line = "ringway_cluster_policies_read_toward_deny{kind=\"AuthorizationPolicy\",object=\"AuthorizationPolicy shop/bad-action\",reason=\"unreadable-deny-all\"} 1";
            assert!(text.contains(line), "{line} not in\n{text}");
            let line = "ringway_cluster_policy_entries_skipped{kind=\"AuthorizationPolicy\",reason=\"entry-skipped\"} 1";
            assert!(text.contains(line), "{line} not in\n{text}");
            let line = "ringway_cluster_policies_read_toward_deny{kind=\"PeerAuthentication\",object=\"PeerAuthentication shop/bad-mode\",reason=\"unknown-mode-strict\"} 1";
            assert!(text.contains(line), "{line} not in\n{text}");
            let line = "ringway_cluster_policies_read_toward_deny{kind=\"PeerAuthentication\",object=\"PeerAuthentication shop/bad-shape\",reason=\"unreadable-strict\"} 1";
            assert!(text.contains(line), "{line} not in\n{text}");
            for name in ["bad-mode", "bad-shape"] {
                assert!(
                    mesh["peerAuthentications"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|p| p["origin"] == format!("PeerAuthentication shop/{name}")
                            && p["mode"] == "STRICT"),
                    "{name} is STRICT: {}",
                    r.body
                );
            }
            watch.stop();
        },
    );
}

/// A pod is in the mesh from the moment it has an address, whatever its
/// phase: `server-0` stays `Pending` (a container whose image cannot be
/// pulled) while it serves, and the label-selected ALLOW that admits only
/// namespace `other` governs it, so the client of namespace `front` is
/// refused. Deleted from the API (a pod the watch has not seen), it is
/// unknown: its traffic waits `proxy.workloadWait` and is refused (counted
/// `unknown_workload` by the server's proxy), never authorized against a
/// guess without its labels. Before the fix the Pending pod was left out of
/// the mesh and both connections passed (the ALLOW's selector found no
/// labels, and no ALLOW left means allow).
#[test]
fn adversarial_a_pending_or_unseen_pod_is_governed_never_guessed() {
    run_isolated(
        "adversarial_a_pending_or_unseen_pod_is_governed_never_guessed",
        || {
            let t = two_nodes(Opts::new("policy_cluster_pending"));
            std::thread::scope(|scope| {
                let c = start_watch(scope, &t);
                c.api.apply(
                    Kind::Pod,
                    fixtures::FakePod::new("uid-server-0", "shop", "server-0", "node")
                        .created("2026-01-01T00:00:00Z")
                        .service_account("web")
                        .label("app", "web")
                        .mode("enabled")
                        .running(&["10.244.2.2", "fd00:244:2::2"])
                        .phase("Pending")
                        .json(),
                );
                c.api.apply(
                    Kind::AuthorizationPolicy,
                    istio_object(
                        "shop",
                        "only-other",
                        json!({"selector": {"matchLabels": {"app": "web"}}, "action": "ALLOW",
                            "rules": [{"from": [{"source": {"namespaces": ["other"]}}]}]}),
                    ),
                );
                // Both applied before the policy: one snapshot holds both
                // (or, before the fix, a snapshot without the pod).
                c.until("the policy is in force", |m| {
                    has_policy(m, "istio/shop/only-other")
                });
                let server = SocketAddr::new(t.server().ip(false), APP_PORT);
                let app = EchoServer::start(t.server().netns.run(|| listen(server)).unwrap());
                expect_refused(
                    exchange(&t.client().netns, server),
                    "front -> a Pending pod only `other` may reach",
                );
                assert_eq!(app.connections(), 0, "the app saw the refused client");
                c.until("the Pending pod is a workload", |m| {
                    m.workloads().any(|w| w.name == "server-0")
                });

                // Gone from the API: the proxy does not know whom it serves.
                c.api.delete(Kind::Pod, "shop", "server-0");
                c.until("the pod left the mesh", |m| {
                    !m.workloads().any(|w| w.name == "server-0")
                });
                let t0 = Instant::now();
                expect_refused(
                    exchange(&t.client().netns, server),
                    "front -> a pod the mesh does not know",
                );
                let waited = t0.elapsed();
                assert!(
                    waited
                        >= ringway_config::ProxySettings::default().workload_wait
                            - std::time::Duration::from_millis(200),
                    "refused after {waited:?}, before the wait for its workload ran out"
                );
                assert_eq!(app.connections(), 0);
                // Counted by the server's proxy as what it is: a connection
                // to a pod whose workload never came.
                let text = common::hbone::metrics_text(&t.p2);
                let line = "ringway_connections_refused_total{reason=\"unknown_workload\"} 1";
                assert!(text.contains(line), "{line} not in\n{text}");
                c.watch.stop();
            });
        },
    );
}

/// The same-node fast path waits for its destination's workload as the
/// destination's own inbound side does: `client-0` and `server-1` are pods
/// of one node, and `server-1` is not in the API yet. A connection to it
/// waits; the pod added meanwhile, it passes. Deleted again (the mesh does
/// not know whom the proxy would deliver to), a connection waits
/// `proxy.workloadWait`, is refused and counted `unknown_workload`. Before
/// the fix the fast path refused at once as a policy denial
/// (`ringway_authorization_denials_total{path="local"}`), the first connection too.
#[test]
fn adversarial_same_node_traffic_to_an_unknown_pod_waits_for_it_then_is_refused() {
    run_isolated(
        "adversarial_same_node_traffic_to_an_unknown_pod_waits_for_it_then_is_refused",
        || {
            let mn = common::MeshNode::new(
                2,
                ringway_config::CaptureMode::Tproxy,
                ringway_config::Datapath::Uring,
            );
            let proxy = Arc::new(mn.proxy);
            let (runtime, client, api) = fake_api();
            let pod = |name: &str, sa: &str, ips: [&str; 2]| {
                fixtures::FakePod::new(&format!("uid-{name}"), "shop", name, "node")
                    .created("2026-01-01T00:00:00Z")
                    .service_account(sa)
                    .mode("enabled")
                    .running(&ips)
                    .json()
            };
            // Pod 0 of the node (the client) is known; pod 1 (the server)
            // is not.
            api.apply(
                Kind::Pod,
                pod("client-0", "frontend", ["10.244.1.2", "fd00:244:1::2"]),
            );
            let file = Arc::new(MeshConfig::load_str(FILE, "policy_cluster", &NoEnv).unwrap());
            let target = proxy.clone();
            let watch = MeshWatch::start(runtime, client, file, KubeOptions::default(), move |m| {
                target.set_mesh(m);
            })
            .unwrap();
            let has = |name: &str| {
                proxy
                    .mesh()
                    .is_some_and(|m| !m.is_complete() && m.workloads().any(|w| w.name == name))
            };
            assert!(
                wait_until(TIMEOUT, || has("client-0")),
                "client-0 in the mesh"
            );
            assert!(!has("server-1"));
            let server = SocketAddr::new(mn.vn.pod(1).ip(false), APP_PORT);
            let app = EchoServer::start(mn.vn.pod(1).netns.run(|| listen(server)).unwrap());
            let client_ns = &mn.vn.pod(0).netns;

            // Waiting for server-1; it arrives: the connection passes.
            std::thread::scope(|s| {
                let waiting = s.spawn(|| exchange(client_ns, server));
                assert!(
                    wait_until(TIMEOUT, || proxy.stats().accepted >= 1),
                    "the connection reached the proxy"
                );
                api.apply(
                    Kind::Pod,
                    pod("server-1", "web", ["10.244.1.3", "fd00:244:1::3"]),
                );
                waiting
                    .join()
                    .unwrap()
                    .expect("the pod came within the wait: passes");
            });
            assert_eq!(app.connections(), 1);
            assert!(proxy.stats().same_node >= 1, "on the fast path");

            // Gone: waits the whole wait, then refused and counted.
            api.delete(Kind::Pod, "shop", "server-1");
            assert!(
                wait_until(TIMEOUT, || !has("server-1") && has("client-0")),
                "server-1 left the mesh"
            );
            let t0 = Instant::now();
            expect_refused(
                exchange(client_ns, server),
                "client-0 -> a same-node pod the mesh does not know",
            );
            let waited = t0.elapsed();
            assert!(
                waited
                    >= ringway_config::ProxySettings::default().workload_wait
                        - std::time::Duration::from_millis(200),
                "refused after {waited:?}, before the wait for its workload ran out"
            );
            assert_eq!(app.connections(), 1, "the app saw the refused client");
            let text = ringway_proxy::metrics::encode(&proxy.metrics().registry(), false);
            let line = "ringway_connections_refused_total{reason=\"unknown_workload\"} 1";
            assert!(text.contains(line), "{line} not in\n{text}");
            assert!(
                !text.contains("ringway_authorization_denials_total{path=\"local\"}"),
                "counted as a policy denial:\n{text}"
            );
            watch.stop();
        },
    );
}
