//! A pod's addresses are the ones the node agent says (issue 10, item 4):
//! a pod that adds its neighbour's address to its own netns cannot send
//! from it through the proxy, cannot take it over when the proxy restarts,
//! and the proxy relays plaintext inbound only to the pod's own addresses
//! (item 9).

use crate::common;
use ringway_testbed::prom;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::mpsc;

use common::{capture, init_logs, settings, MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath};
use ringway_proxy::Proxy;
use ringway_testbed::traffic::listen;
use ringway_testbed::{run_isolated, Netns, VirtualNode};

const PORT: u16 = 8080;

/// An app that reports the source address of every connection it accepts
/// and answers each client's `hello\n` with "ok".
fn reporting_app(netns: &Netns, addr: SocketAddr) -> mpsc::Receiver<SocketAddr> {
    let l: TcpListener = netns.run(|| listen(addr)).unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..16 {
            let Ok((mut s, peer)) = l.accept() else { break };
            let _ = tx.send(peer);
            // Read the client's line before answering: closing with unread
            // bytes would reset the connection.
            let _ = s.set_read_timeout(Some(TIMEOUT));
            let mut line = [0u8; 6];
            let _ = s.read_exact(&mut line);
            let _ = s.write_all(b"ok");
        }
    });
    rx
}

/// Connects from `netns` to `dst` with source address `src`, sends a line
/// and reads the answer: `Ok(answer)` or the error the client saw.
fn exchange_from(netns: &Netns, src: IpAddr, dst: SocketAddr) -> std::io::Result<Vec<u8>> {
    netns.run(|| {
        let domain = socket2::Domain::for_address(dst);
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
        s.bind(&SocketAddr::new(src, 0).into())?;
        s.connect_timeout(&dst.into(), TIMEOUT)?;
        let mut s: std::net::TcpStream = s.into();
        s.set_read_timeout(Some(TIMEOUT))?;
        s.write_all(b"hello\n")?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    })
}

fn refused(proxy: &Proxy, reason: &str) -> f64 {
    let text = ringway_proxy::metrics::encode(&proxy.metrics().registry(), false);
    prom::value(
        &text,
        "ringway_connections_refused_total",
        &[&format!("reason=\"{reason}\"")],
    )
    .unwrap_or(0.0)
}

/// Pod 0 (the attacker) puts pod 1's address on its `lo` and connects to
/// pod 2 from it. The proxy must reset that connection and count it; pod 2
/// must never see a connection from pod 1's address. Both families; the
/// attacker's own address still works.
#[test]
fn adversarial_spoofed_neighbour_source_is_reset_and_counted() {
    run_isolated(
        "adversarial_spoofed_neighbour_source_is_reset_and_counted",
        || {
            let node = MeshNode::new(3, CaptureMode::Tproxy, Datapath::Uring);
            let (attacker, victim, dst_pod) = (node.pod(0), node.pod(1), node.pod(2));
            for (n, v6) in [false, true].into_iter().enumerate() {
                let seen = reporting_app(
                    &dst_pod.netns,
                    SocketAddr::new(dst_pod.ip(v6), PORT + n as u16),
                );
                let dst = SocketAddr::new(dst_pod.ip(v6), PORT + n as u16);
                // The attacker's own address: served, and the app sees it.
                let ok = exchange_from(&attacker.netns, attacker.ip(v6), dst);
                assert_eq!(ok.as_deref().ok(), Some(&b"ok"[..]), "own address: {ok:?}");
                let first = seen.recv_timeout(TIMEOUT).unwrap();
                assert_eq!(first.ip(), attacker.ip(v6));
                // The neighbour's address on the attacker's lo (as NET_ADMIN allows).
                // `nodad`: an IPv6 address stays tentative (bind gives
                // EADDRNOTAVAIL) until duplicate detection ends, which CI
                // once lost the race against.
                let plen = if v6 { "128" } else { "32" };
                let addr = format!("{}/{plen}", victim.ip(v6));
                let mut add = vec!["addr", "add", addr.as_str(), "dev", "lo"];
                if v6 {
                    add.push("nodad");
                }
                attacker.netns.ip(&add).unwrap();
                let r = exchange_from(&attacker.netns, victim.ip(v6), dst);
                // Whatever the client saw, the destination must not have seen
                // the spoofed source. The client's exchange has ended (reset,
                // or EOF/timeout before the fix), so anything the app accepted
                // for it has been reported by now.
                let spoofed: Vec<SocketAddr> = seen.try_iter().collect();
                assert!(
                spoofed.is_empty(),
                "the destination saw a connection from the spoofed source: {spoofed:?} (client: {r:?})"
            );
                let e = r.expect_err("a spoofed-source connection was served");
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
                attacker
                    .netns
                    .ip(&[
                        "addr",
                        "del",
                        &format!("{}/{plen}", victim.ip(v6)),
                        "dev",
                        "lo",
                    ])
                    .unwrap();
            }
            assert_eq!(refused(&node.proxy, "source_not_pod_address"), 2.0);
        },
    );
}

/// A proxy restart replays every pod; a pod whose netns holds its
/// neighbour's address (added by the pod itself) and is added first must
/// not take the address over, and the neighbour must not be silently
/// shadowed: the second claim is refused, loudly, whichever pod makes it.
#[test]
fn adversarial_address_conflict_is_refused() {
    run_isolated("adversarial_address_conflict_is_refused", || {
        init_logs();
        let vn = VirtualNode::build(1, 2).unwrap();
        let (attacker, victim) = (vn.pod(0), vn.pod(1));
        attacker
            .netns
            .ip(&["addr", "add", &format!("{}/32", victim.ipv4), "dev", "eth0"])
            .unwrap();
        let proxy = Proxy::start(settings(CaptureMode::Tproxy, Datapath::Uring)).unwrap();
        for p in [attacker, victim] {
            capture(p, CaptureMode::Tproxy);
        }
        proxy
            .add_pod(&attacker.name, attacker.netns.dup_fd().unwrap())
            .unwrap();
        let e = proxy
            .add_pod(&victim.name, victim.netns.dup_fd().unwrap())
            .expect_err("a second pod claiming a held address was added (last one wins)");
        let text = e.to_string();
        assert!(
            text.contains(&victim.ipv4.to_string()) && text.contains("already held by pod"),
            "{text}"
        );
        // Nothing of the refused pod is left; the first holder is unchanged.
        let pods = proxy.pods();
        assert_eq!(pods.len(), 1, "{pods:?}");
        assert_eq!(pods[0].uid, attacker.name);
    });
}

/// Plaintext inbound relays only to the pod's own addresses (as HBONE
/// checks `:authority`): a client that routes some other address through
/// the pod (here one on the pod's `lo`, where a pod keeps what only it
/// should reach) is reset and counted, and the app behind it never sees it.
fn inbound_to_a_foreign_address(mode: CaptureMode) {
    let node = MeshNode::new(1, mode, Datapath::Uring);
    let pod = node.pod(0);
    let hidden: IpAddr = "10.99.0.1".parse().unwrap();
    pod.netns
        .ip(&["addr", "add", &format!("{hidden}/32"), "dev", "lo"])
        .unwrap();
    let seen = reporting_app(&pod.netns, SocketAddr::new(hidden, PORT));
    node.vn
        .node
        .ip(&[
            "route",
            "add",
            &format!("{hidden}/32"),
            "via",
            &pod.ipv4.to_string(),
        ])
        .unwrap();
    let from: IpAddr = "10.244.1.1".parse().unwrap();
    let r = exchange_from(&node.vn.node, from, SocketAddr::new(hidden, PORT));
    // The exchange has ended, so anything the app accepted is reported.
    let relayed: Vec<SocketAddr> = seen.try_iter().collect();
    assert!(
        relayed.is_empty(),
        "the proxy relayed an inbound connection to {hidden}, not an address of the pod: {relayed:?} (client: {r:?})"
    );
    let e = r.expect_err("an inbound connection to a foreign address was served");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    assert_eq!(refused(&node.proxy, "destination_not_pod_address"), 1.0);
    // The pod's own address is still served.
    let seen = reporting_app(&pod.netns, SocketAddr::new(pod.ip(false), PORT + 1));
    let ok = exchange_from(
        &node.vn.node,
        from,
        SocketAddr::new(pod.ip(false), PORT + 1),
    );
    assert_eq!(ok.unwrap(), b"ok");
    assert_eq!(seen.recv_timeout(TIMEOUT).unwrap().ip(), from);
}

#[test]
fn adversarial_plaintext_inbound_to_foreign_address_tproxy() {
    run_isolated(
        "adversarial_plaintext_inbound_to_foreign_address_tproxy",
        || inbound_to_a_foreign_address(CaptureMode::Tproxy),
    );
}

#[test]
fn adversarial_plaintext_inbound_to_foreign_address_redirect() {
    run_isolated(
        "adversarial_plaintext_inbound_to_foreign_address_redirect",
        || inbound_to_a_foreign_address(CaptureMode::Redirect),
    );
}

/// Where the agent sends no addresses, the proxy reads them from the pod's
/// netns, which the pod can write. A pod that adds the address of a pod of
/// another node before it is (re)added must not become that address for
/// this node: where a control plane feeds the mesh (whose record of the
/// attacker does not list it), a same-node client's connection to the
/// address is not delivered into the attacker by the fast path, and the
/// attacker cannot send from it.
#[test]
fn adversarial_a_netns_address_the_mesh_gives_another_node_is_not_the_pods() {
    run_isolated(
        "adversarial_a_netns_address_the_mesh_gives_another_node_is_not_the_pods",
        || {
            init_logs();
            let vn = VirtualNode::build(1, 2).unwrap();
            let (client, attacker) = (vn.pod(0), vn.pod(1));
            // A pod of another node, by the mesh.
            let victim: IpAddr = "10.244.2.50".parse().unwrap();
            attacker
                .netns
                .ip(&["addr", "add", &format!("{victim}/32"), "dev", "eth0"])
                .unwrap();
            let proxy = Proxy::start(settings(CaptureMode::Tproxy, Datapath::Uring)).unwrap();
            let w = |name: &str, ns: &str, ip: IpAddr, node: &str| {
                ringway_testbed::mesh::WorkloadYaml {
                    uid: format!("cluster//Pod/{ns}/{name}"),
                    name: name.into(),
                    namespace: ns.into(),
                    service_account: name.into(),
                    ips: vec![ip],
                    node: node.into(),
                    tunnel: false,
                    healthy: true,
                }
            };
            let file = ringway_config::MeshConfig::load_str(
                &ringway_testbed::mesh::workloads_yaml(&[
                    w(&client.name, "front", IpAddr::V4(client.ipv4), "node1"),
                    w(&attacker.name, "evil", IpAddr::V4(attacker.ipv4), "node1"),
                    w("bank-0", "bank", victim, "node2"),
                ]),
                "test",
                &ringway_config::NoEnv,
            )
            .unwrap();
            // As a control plane feeds it: not the whole mesh.
            let mut edit = file.without_entries().edit();
            for w in file.workloads() {
                edit.upsert_workload(w.clone(), Default::default());
            }
            let mesh = std::sync::Arc::new(edit.finish());
            assert!(!mesh.is_complete());
            proxy.set_mesh(mesh);
            for (p, ns) in [(client, "front"), (attacker, "evil")] {
                capture(p, CaptureMode::Tproxy);
                proxy
                    .add_pod_with_identity(
                        &p.name,
                        p.netns.dup_fd().unwrap(),
                        ringway_proxy::pod::PodIdentity {
                            name: p.name.clone(),
                            namespace: ns.into(),
                            service_account: p.name.clone(),
                        },
                    )
                    .unwrap();
            }
            // The attacker answers on the address it took: a client that
            // got an answer was delivered into it.
            let taken = reporting_app(&attacker.netns, SocketAddr::new(victim, PORT));
            let r = exchange_from(
                &client.netns,
                IpAddr::V4(client.ipv4),
                SocketAddr::new(victim, PORT),
            );
            assert!(
                taken.recv_timeout(std::time::Duration::from_millis(500)).is_err(),
                "a same-node connection to another node's pod address was delivered into the pod that took it (client: {r:?})"
            );
            assert!(r.is_err(), "{r:?}");
            // Nor may it send from that address; its own still works.
            let seen = reporting_app(
                &client.netns,
                SocketAddr::new(IpAddr::V4(client.ipv4), PORT),
            );
            let dst = SocketAddr::new(IpAddr::V4(client.ipv4), PORT);
            let ok = exchange_from(&attacker.netns, IpAddr::V4(attacker.ipv4), dst);
            assert_eq!(ok.as_deref().ok(), Some(&b"ok"[..]), "own address: {ok:?}");
            assert_eq!(
                seen.recv_timeout(TIMEOUT).unwrap().ip(),
                IpAddr::V4(attacker.ipv4)
            );
            let r = exchange_from(&attacker.netns, victim, dst);
            let spoofed: Vec<SocketAddr> = seen.try_iter().collect();
            assert!(spoofed.is_empty(), "the client saw {spoofed:?} ({r:?})");
            assert!(refused(&proxy, "source_not_pod_address") >= 1.0);
        },
    );
}
