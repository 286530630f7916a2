//! Authorization on one node, without HBONE: the same-node fast path applies
//! the destination's policies (with the source pod's identity, which the
//! proxy knows first hand), and a policy change (or a pod's identity
//! update) re-checks the connections already open on the fast path and on
//! the plaintext inbound path. Also which pods' certificates readiness
//! awaits from a certificate service (no tunnel needed to tell).

use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use common::{wait_until, MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath, Mesh, MeshConfig, NoEnv};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{connect, listen, EchoServer};

const PORT: u16 = 8080;
const CLIENT: &str = "spiffe://cluster.local/ns/front/sa/frontend";

/// Pod 0 is front/frontend, pod 1 is shop/web (no `ca:`: no HBONE).
fn mesh(policies: &str) -> Arc<Mesh> {
    let yaml = format!(
        "workloads:\n  - {{uid: c, name: client-0, namespace: front, serviceAccount: frontend, ips: [10.244.1.2], node: n}}\n  - {{uid: s, name: server-0, namespace: shop, serviceAccount: web, ips: [10.244.1.3], node: n}}\n{policies}"
    );
    Arc::new(MeshConfig::load_str(&yaml, "policy_local", &NoEnv).unwrap())
}

fn deny_frontend() -> String {
    format!("policies:\n  - name: no-frontend\n    namespace: shop\n    action: DENY\n    rules:\n      - from:\n          - principals: [\"{CLIENT}\"]\n")
}

const REQUIRE_MTLS: &str = "policies:\n  - name: require-mtls\n    action: DENY\n    rules:\n      - from:\n          - notPrincipals: [\"*\"]\n";

/// The echo app on the server pod.
fn echo_app(node: &MeshNode) -> EchoServer {
    EchoServer::start(
        node.pod(1)
            .netns
            .run(|| listen(SocketAddr::new(node.pod(1).ip(false), PORT)))
            .unwrap(),
    )
}

fn round_trip(s: &mut TcpStream) -> std::io::Result<()> {
    s.write_all(b"ping")?;
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    assert_eq!(&b, b"ping");
    Ok(())
}

fn open(from: &ringway_testbed::Netns, to: SocketAddr) -> std::io::Result<TcpStream> {
    from.run(|| {
        let s = connect(to, TIMEOUT)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        Ok(s)
    })
}

fn denials(node: &MeshNode, path: &str) -> String {
    let text = ringway_proxy::metrics::encode(&node.proxy.metrics().registry(), false);
    text.lines()
        .find(|l| {
            l.starts_with(&format!(
                "ringway_authorization_denials_total{{path=\"{path}\"}}"
            ))
        })
        .unwrap_or("")
        .to_string()
}

#[test]
fn fast_path_enforces_destination_policy() {
    run_isolated("fast_path_enforces_destination_policy", || {
        let node = MeshNode::new(2, CaptureMode::Tproxy, Datapath::Uring);
        node.proxy.set_mesh(mesh(&deny_frontend()));
        let accepted = echo_app(&node);
        let dst = SocketAddr::new(node.pod(1).ip(false), PORT);
        // Denied by principal: the fast path must not deliver it.
        let r = open(&node.pod(0).netns, dst).and_then(|mut s| round_trip(&mut s));
        assert!(r.is_err(), "a denied same-node connection was delivered");
        assert_eq!(accepted.connections(), 0);
        assert!(
            denials(&node, "local").ends_with(" 1"),
            "{}",
            denials(&node, "local")
        );
        // Lifted: it goes through on the fast path.
        node.proxy.set_mesh(mesh(""));
        let mut s = open(&node.pod(0).netns, dst).unwrap();
        round_trip(&mut s).unwrap();
        assert!(node.proxy.stats().same_node >= 1);
    });
}

#[test]
fn policy_change_rechecks_open_connections() {
    run_isolated("policy_change_rechecks_open_connections", || {
        let node = MeshNode::new(2, CaptureMode::Tproxy, Datapath::Uring);
        node.proxy.set_mesh(mesh(""));
        let accepted = echo_app(&node);
        let dst = SocketAddr::new(node.pod(1).ip(false), PORT);
        // One same-node connection from the client pod, one plaintext
        // connection from outside the mesh (the node's own netns).
        let mut local = open(&node.pod(0).netns, dst).unwrap();
        let mut outside = open(&node.vn.node, dst).unwrap();
        round_trip(&mut local).unwrap();
        round_trip(&mut outside).unwrap();
        // An unrelated change keeps both.
        assert_eq!(node.proxy.set_mesh(mesh("policies: []\n")), 0);
        round_trip(&mut local).unwrap();
        round_trip(&mut outside).unwrap();
        // Require mTLS: the plaintext one is reset, the same-node one (it
        // carries the client pod's identity) stays.
        assert_eq!(node.proxy.set_mesh(mesh(REQUIRE_MTLS)), 1);
        assert!(
            round_trip(&mut outside).is_err(),
            "plaintext connection survived"
        );
        round_trip(&mut local).unwrap();
        // Deny the client's principal: the same-node one goes too.
        assert_eq!(node.proxy.set_mesh(mesh(&deny_frontend())), 1);
        assert!(
            round_trip(&mut local).is_err(),
            "denied connection survived"
        );
        assert!(
            denials(&node, "recheck").ends_with(" 2"),
            "{}",
            denials(&node, "recheck")
        );
        assert!(wait_until(TIMEOUT, || node.proxy.stats().active == 0));
        assert_eq!(accepted.connections(), 2);
    });
}

/// The same-node fast path refuses what a tunnel's far side refuses: the
/// proxy's own ports (capture, tunnel, and the reserved 15000, 15020,
/// 15021) in the destination pod's netns are never an app's, even with
/// something listening there; counted as `proxy_port`.
#[test]
fn fast_path_refuses_the_proxys_own_ports() {
    run_isolated("fast_path_refuses_the_proxys_own_ports", || {
        let node = MeshNode::new(2, CaptureMode::Tproxy, Datapath::Uring);
        node.proxy.set_mesh(mesh(""));
        let server = node.pod(1);
        let on_reserved = EchoServer::start(
            server
                .netns
                .run(|| listen(SocketAddr::new(server.ip(false), 15021)))
                .unwrap(),
        );
        let r = open(&node.pod(0).netns, SocketAddr::new(server.ip(false), 15021))
            .and_then(|mut s| round_trip(&mut s));
        assert!(r.is_err(), "a same-node connection to 15021 was delivered");
        assert_eq!(on_reserved.connections(), 0);
        let r = open(&node.pod(0).netns, SocketAddr::new(server.ip(false), 15008))
            .and_then(|mut s| round_trip(&mut s));
        assert!(r.is_err(), "a same-node connection to 15008 was delivered");
        let text = ringway_proxy::metrics::encode(&node.proxy.metrics().registry(), false);
        assert!(
            text.lines().any(
                |l| l.starts_with("ringway_connections_refused_total{reason=\"proxy_port\"} 2")
            ),
            "{text}"
        );
        // An app port still goes through on the fast path.
        let _app = echo_app(&node);
        let mut s = open(&node.pod(0).netns, SocketAddr::new(server.ip(false), PORT)).unwrap();
        round_trip(&mut s).unwrap();
    });
}

/// A pod the configuration file does not list is known by the identity the
/// agent gave it. When the agent gives a fuller one for the same netns,
/// the pod's open connections are re-checked under it: a DENY of the
/// namespace it turns out to be in resets what it had let through.
#[test]
fn an_identity_update_rechecks_the_pods_open_connections() {
    run_isolated(
        "an_identity_update_rechecks_the_pods_open_connections",
        || {
            let node = MeshNode::new(2, CaptureMode::Tproxy, Datapath::Uring);
            // The file lists the client only; the server is known by what the
            // agent says (nothing yet: it was added without an identity).
            let yaml = format!(
            "workloads:\n  - {{uid: c, name: client-0, namespace: front, serviceAccount: frontend, ips: [10.244.1.2], node: n}}\n{}",
            deny_frontend()
        );
            node.proxy.set_mesh(Arc::new(
                MeshConfig::load_str(&yaml, "policy_local", &NoEnv).unwrap(),
            ));
            let accepted = echo_app(&node);
            let dst = SocketAddr::new(node.pod(1).ip(false), PORT);
            let mut local = open(&node.pod(0).netns, dst).unwrap();
            round_trip(&mut local).expect("not in shop yet: shop's DENY does not apply");
            let server = node.pod(1);
            node.proxy
                .add_pod_with_addresses(
                    &server.name,
                    server.netns.dup_fd().unwrap(),
                    ringway_proxy::PodIdentity {
                        name: "server-0".into(),
                        namespace: "shop".into(),
                        service_account: "web".into(),
                    },
                    &[],
                )
                .unwrap();
            assert!(
                round_trip(&mut local).is_err(),
                "a connection shop's DENY refuses survived the pod's identity update"
            );
            assert!(
                denials(&node, "recheck").ends_with(" 1"),
                "{}",
                denials(&node, "recheck")
            );
            assert_eq!(accepted.connections(), 1);
            // New connections are refused too.
            let refused = open(&node.pod(0).netns, dst).and_then(|mut s| round_trip(&mut s));
            assert!(refused.is_err());
        },
    );
}

/// A certificate service that cannot be reached (a failure that may pass).
#[derive(Debug)]
struct Unreachable;

impl ringway_identity::CertSource for Unreachable {
    fn issue(
        &self,
        _: &ringway_identity::Identity,
        _: std::time::SystemTime,
        _: std::time::SystemTime,
    ) -> Result<ringway_identity::Issued, ringway_identity::IssueError> {
        Err(ringway_identity::IssueError::remote(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "the certificate service cannot be reached",
        )))
    }

    fn expires(&self) -> Option<std::time::SystemTime> {
        None
    }

    fn remote(&self) -> bool {
        true
    }

    fn transient(&self, _: &ringway_identity::IssueError) -> bool {
        true
    }
}

/// Readiness waits for the certificates of the pods served only: one the
/// service cannot issue now for a pod served is awaited (a pod's identity
/// is wanted as soon as a publish gives it one), one held for an identity
/// no pod served has (a pod gone, a former identity) is not.
#[test]
fn the_awaited_certificates_are_the_served_pods_only() {
    run_isolated("the_awaited_certificates_are_the_served_pods_only", || {
        let node = MeshNode::new(2, CaptureMode::Tproxy, Datapath::Uring);
        let mut bundle = ringway_identity::TrustBundle::new();
        bundle.add(
            ringway_identity::CaSigner::generate_for_tests("cluster.local")
                .cert()
                .clone(),
        );
        let ids = std::sync::Arc::new(
            ringway_identity::IdentityManager::with_source(
                std::sync::Arc::new(Unreachable),
                bundle,
                "cluster.local",
                std::time::Duration::from_secs(3600),
            )
            .unwrap(),
        );
        node.proxy.set_identity(Some(ids.clone()));
        node.proxy.set_mesh(mesh(""));
        let served = ringway_identity::Identity::new("cluster.local", "shop", "web");
        let gone = ringway_identity::Identity::new("cluster.local", "old", "gone");
        for id in [&served, &gone] {
            ids.prefetch(id, std::time::Duration::from_secs(2))
                .unwrap_err();
        }
        // The client pod's identity too: the publish wanted it.
        assert_eq!(ids.awaited().len(), 3, "{:?}", ids.awaited());
        let awaited: Vec<String> = node
            .proxy
            .awaited_certificates()
            .iter()
            .map(|(id, _)| id.to_string())
            .collect();
        assert_eq!(
            awaited,
            [
                "spiffe://cluster.local/ns/front/sa/frontend",
                "spiffe://cluster.local/ns/shop/sa/web"
            ]
        );
    });
}

/// A certificate no pod served here needs any more is forgotten, so the
/// refresher stops renewing it (one certificate service request per
/// half-life each, for as long as the proxy runs) and it is never
/// presented again: the former identity of a pod the agent or the mesh
/// names anew, and the pod's own once it is removed. Before, only the
/// identity a pod had when it was removed was forgotten. A pod missing
/// from one publish keeps its certificate.
#[test]
fn a_pods_former_identity_and_a_removed_pods_certificates_are_forgotten() {
    run_isolated(
        "a_pods_former_identity_and_a_removed_pods_certificates_are_forgotten",
        || {
            let node = MeshNode::new(2, CaptureMode::Tproxy, Datapath::Uring);
            let ids = std::sync::Arc::new(
                ringway_identity::IdentityManager::new(
                    ringway_identity::CaSigner::generate_for_tests("cluster.local"),
                    ringway_identity::TrustBundle::new(),
                    "cluster.local",
                    std::time::Duration::from_secs(3600),
                )
                .unwrap(),
            );
            node.proxy.set_identity(Some(ids.clone()));
            node.proxy.set_mesh(mesh(""));
            let server = node.pod(1);
            let name = |sa: &str| ringway_proxy::PodIdentity {
                name: "server-0".into(),
                namespace: "shop".into(),
                service_account: sa.into(),
            };
            let held = || -> Vec<String> {
                ids.certificates()
                    .iter()
                    .map(|(id, _)| id.to_string())
                    .collect()
            };
            for sa in ["web", "cart"] {
                node.proxy
                    .add_pod_with_addresses(
                        &server.name,
                        server.netns.dup_fd().unwrap(),
                        name(sa),
                        &[],
                    )
                    .unwrap();
            }
            assert_eq!(
                held(),
                ["spiffe://cluster.local/ns/shop/sa/cart"],
                "the pod's former identity's certificate is still held"
            );
            node.proxy.remove_pod(&server.name).unwrap();
            assert_eq!(
                held(),
                Vec::<String>::new(),
                "the removed pod's certificate is still held"
            );
            // The client pod, named by the mesh only: its certificate in
            // hand (as after its first connection), then the mesh gives
            // the workload another service account.
            let frontend = ringway_identity::Identity::new("cluster.local", "front", "frontend");
            ids.fetch(&frontend).unwrap();
            // The same mesh again keeps it: the pod still has it.
            node.proxy.set_mesh(mesh(""));
            assert_eq!(held(), [frontend.to_string()]);
            // A publish that leaves the workload out for a moment keeps it
            // too: the pod has no other identity, and would otherwise come
            // back to no certificate.
            let without = "workloads:\n  - {uid: s, name: server-0, namespace: shop, serviceAccount: web, ips: [10.244.1.3], node: n}\n";
            node.proxy.set_mesh(Arc::new(
                MeshConfig::load_str(without, "policy_local", &NoEnv).unwrap(),
            ));
            assert_eq!(
                held(),
                [frontend.to_string()],
                "a pod missing from one publish lost its certificate"
            );
            node.proxy.set_mesh(mesh(""));
            let renamed = "workloads:\n  - {uid: c, name: client-0, namespace: front, serviceAccount: frontend-v2, ips: [10.244.1.2], node: n}\n";
            node.proxy.set_mesh(Arc::new(
                MeshConfig::load_str(renamed, "policy_local", &NoEnv).unwrap(),
            ));
            assert_eq!(
                held(),
                Vec::<String>::new(),
                "the identity the mesh no longer gives the pod is still held"
            );
            // (Its new identity is issued at first use by this local CA; a
            // certificate service's is wanted at once, see
            // `the_awaited_certificates_are_the_served_pods_only`.)

            // A pod added after the last publish, named by the mesh only,
            // whose workload the very next publish leaves out: it keeps
            // the identity it was added with.
            node.proxy.set_mesh(mesh(""));
            let client = node.pod(0);
            node.proxy.remove_pod(&client.name).unwrap();
            node.proxy
                .add_pod(&client.name, client.netns.dup_fd().unwrap())
                .unwrap();
            ids.fetch(&frontend).unwrap();
            node.proxy.set_mesh(Arc::new(
                MeshConfig::load_str(without, "policy_local", &NoEnv).unwrap(),
            ));
            assert_eq!(
                held(),
                [frontend.to_string()],
                "a pod added since the last publish lost its certificate to the next"
            );
        },
    );
}
