//! HBONE in a living mesh, between two virtual nodes: service VIPs load
//! balanced over healthy endpoints, 1,000 tunnelled connections on a few
//! HTTP/2 connections surviving (or not) policy changes, certificate
//! rotation during a long transfer, 256 MiB each way, and the adversarial
//! peers (expired certificate, wrong SAN, the wrong server identity, a
//! non-mesh client forging `forwarded`).

use crate::common;
use ringway_testbed::prom;
use ringway_testbed::traffic::ReadNoIntr;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::hbone::{two_nodes, Opts, TwoNodes, APP_PORT, CLIENT_ID, TD};
use common::{wait_until, TIMEOUT};
use ringway_identity::{CaSigner, Identity};
use ringway_testbed::mesh::{workloads_yaml, WorkloadYaml};
use ringway_testbed::traffic::{client_exchange, connect, listen, EchoServer, PayloadServer};
use ringway_testbed::{run_isolated, Netns};

const VIP4: &str = "10.96.0.10";
const VIP6: &str = "fd00:96::10";

fn service_yaml() -> String {
    format!(
        "services:\n  - hostname: web.shop.svc.cluster.local\n    namespace: shop\n    vips: [{VIP4}, \"{VIP6}\"]\n    ports: {{80: {APP_PORT}}}\n    endpoints: [server-0, server-1]\n"
    )
}

/// An echo app (tokio, any number of connections) listening on `addr` in
/// `ns` until the returned guard is dropped; counts connections and keeps
/// their peers.
/// The echo app on `addr` in `ns`.
fn echo_app(ns: &Netns, addr: SocketAddr) -> EchoServer {
    EchoServer::start(ns.run(|| listen(addr)).expect("listen"))
}

/// One round trip of `msg` on an open connection.
fn echo_once(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    s.write_all(msg)?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back)?;
    if back != msg {
        return Err(std::io::Error::other("echo differs"));
    }
    Ok(())
}

/// A fresh connection from the client pod to `addr`, one round trip, closed.
fn exchange(t: &TwoNodes, addr: SocketAddr) -> std::io::Result<()> {
    t.client().netns.run(|| {
        let mut s = connect(addr, TIMEOUT)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        echo_once(&mut s, b"ping")
    })
}

/// Expects the connection to be reset (or closed) without an echo: a
/// refusal, not a timeout or any other failure.
fn expect_no_echo(t: &TwoNodes, addr: SocketAddr) {
    let e = exchange(t, addr).expect_err(&format!("connection to {addr} should have been refused"));
    assert!(
        is_refusal(&e),
        "connection to {addr} failed, but not by a reset or close: {:?}: {e}",
        e.kind()
    );
}

/// A reset or an orderly close by the peer (what a refusal looks like to
/// the app), as opposed to a timeout or a local failure.
fn is_refusal(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
    )
}

/// The value of `ringway_tls_handshakes_total{side, outcome}` on `p`.
fn handshakes(p: &ringway_proxy::Proxy, side: &str, outcome: &str) -> f64 {
    prom::value(
        &common::hbone::metrics_text(p),
        "ringway_tls_handshakes_total",
        &[
            &format!("side=\"{side}\""),
            &format!("outcome=\"{outcome}\""),
        ],
    )
    .unwrap_or(0.0)
}

#[test]
fn service_vip_load_balancing() {
    run_isolated("service_vip_load_balancing", || {
        let t = two_nodes(Opts {
            server_pods: 2,
            extra: service_yaml(),
            ..Opts::new("hbone_vip")
        });
        let app = |i: usize, v6: bool| {
            let pod = t.n2.pod(i);
            echo_app(&pod.netns, SocketAddr::new(pod.ip(v6), APP_PORT))
        };
        let s0 = app(0, false);
        let s1 = app(1, false);
        let vip: SocketAddr = format!("{VIP4}:80").parse().unwrap();
        for i in 0..20 {
            exchange(&t, vip).unwrap_or_else(|e| panic!("VIP connection {i}: {e}"));
        }
        // Both endpoints took a share, over HBONE, and saw the client's IP.
        assert!(wait_until(TIMEOUT, || s0.connections() + s1.connections() == 20));
        let (a, b) = (s0.connections(), s1.connections());
        assert!(a >= 3 && b >= 3, "round robin over 2 endpoints: {a} / {b}");
        for p in s0.peers().iter().chain(s1.peers().iter()) {
            assert_eq!(p.ip(), t.client().ip(false), "the app sees the client's IP");
        }
        assert!(
            t.p1.hbone_connections_opened() >= 2,
            "one tunnel per endpoint"
        );
        assert_eq!(t.p1.stats().same_node, 0);
        // IPv6 VIP: an endpoint's IPv6 address.
        let e6 = (app(0, true), app(1, true));
        let vip6: SocketAddr = format!("[{VIP6}]:80").parse().unwrap();
        exchange(&t, vip6).expect("IPv6 VIP");
        assert!(wait_until(TIMEOUT, || e6.0.connections()
            + e6.1.connections()
            == 1));
        // A port the service does not list: reset, no endpoint sees it.
        expect_no_echo(&t, format!("{VIP4}:81").parse().unwrap());
        assert_eq!(s0.connections() + s1.connections(), 20);
        // An endpoint whose app is down (its proxy answers 503): the next
        // endpoint takes the connection; none fails. The client's `ping`
        // went out with the first CONNECT (peeked, not taken): the next
        // endpoint gets it too (taken at once, it was lost here).
        drop(s1);
        for i in 0..10 {
            exchange(&t, vip).unwrap_or_else(|e| panic!("with one app down, {i}: {e}"));
        }
        assert_eq!(s0.connections(), a + 10);
        // Not ready: server-1 listens again but is marked unhealthy; it
        // gets nothing.
        let s1 = app(1, false);
        t.set_mesh(mark_unhealthy(&t.mesh(&service_yaml()), &["server-1"]));
        for i in 0..10 {
            exchange(&t, vip).unwrap_or_else(|e| panic!("healthy endpoint, {i}: {e}"));
        }
        assert_eq!(
            s1.connections(),
            0,
            "an unhealthy endpoint takes no traffic"
        );
        // No healthy endpoint at all: reset.
        t.set_mesh(mark_unhealthy(
            &t.mesh(&service_yaml()),
            &["server-0", "server-1"],
        ));
        expect_no_echo(&t, vip);
        assert_eq!(s0.connections(), a + 20);
    });
}

/// `m` with workloads `uids` marked `healthy: false` (rebuilt from YAML,
/// as the Kubernetes source does when an endpoint is not ready).
fn mark_unhealthy(m: &ringway_config::Mesh, uids: &[&str]) -> Arc<ringway_config::Mesh> {
    let ws: Vec<WorkloadYaml> = m
        .workloads()
        .map(|w| WorkloadYaml {
            uid: w.uid.to_string(),
            name: w.name.to_string(),
            namespace: w.namespace.to_string(),
            service_account: w.service_account.to_string(),
            ips: w.ips.clone(),
            node: w.node.to_string(),
            tunnel: w.tunnel,
            healthy: w.healthy && !uids.contains(&w.uid.as_str()),
        })
        .collect();
    let mut yaml = workloads_yaml(&ws);
    yaml.push_str(&service_yaml());
    Arc::new(
        ringway_config::MeshConfig::load_str(&yaml, "unhealthy", &ringway_config::NoEnv)
            .expect("mesh"),
    )
}

/// Opens `n` connections from the client pod to `addr` (each echoes once).
fn open_many(t: &TwoNodes, addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    t.client().netns.run(|| {
        (0..n)
            .map(|i| {
                let s = connect(addr, TIMEOUT).unwrap_or_else(|e| panic!("connection {i}: {e}"));
                s.set_read_timeout(Some(TIMEOUT)).unwrap();
                s
            })
            .collect()
    })
}

/// Every connection echoes its own message (writes all, then reads all).
fn echo_all(conns: &mut [TcpStream], round: u32) -> Result<(), String> {
    for (i, s) in conns.iter_mut().enumerate() {
        let msg = format!("{round:04}:{i:06}");
        s.write_all(msg.as_bytes())
            .map_err(|e| format!("conn {i} write: {e}"))?;
    }
    for (i, s) in conns.iter_mut().enumerate() {
        let msg = format!("{round:04}:{i:06}");
        let mut back = vec![0u8; msg.len()];
        s.read_exact(&mut back)
            .map_err(|e| format!("conn {i} read: {e}"))?;
        if back != msg.as_bytes() {
            return Err(format!("conn {i}: echo of another connection"));
        }
    }
    Ok(())
}

/// 1,000 connections from one pod to one destination ride a few HTTP/2
/// connections (100 streams each, one pool per worker), stay byte-exact
/// through a policy change that still allows them, and are all reset by
/// one that denies them (open connections are re-checked); new ones are
/// then refused.
#[test]
fn thousand_connections_and_policy_changes() {
    run_isolated("thousand_connections_and_policy_changes", || {
        let t = two_nodes(Opts::new("hbone_1000"));
        let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
        let app = echo_app(&t.server().netns, addr);
        let mut conns = open_many(&t, addr, 1000);
        echo_all(&mut conns, 0).unwrap();
        assert!(wait_until(TIMEOUT, || t.p1.hbone_streams() == 1000));
        let h2 = t.p1.hbone_connections();
        // ceil(a/100) + ceil(b/100) for the two workers' shares a + b = 1000.
        assert!(
            (10..=11).contains(&h2),
            "1,000 streams rode {h2} HTTP/2 connections"
        );
        assert_eq!(app.connections(), 1000);
        // The pool as an operator sees it.
        let m = t.p1.metrics();
        m.refresh(&t.p1.stats_handle());
        let text = ringway_proxy::metrics::encode(&m.registry(), false);
        assert!(
            text.contains(&format!("ringway_hbone_pool_connections {h2}\n")),
            "{text}"
        );
        assert!(text.contains("ringway_hbone_pool_streams 1000\n"), "{text}");
        // A change that still allows them: nothing is reset.
        let allow = format!(
            "policies:\n  - name: frontend-only\n    namespace: shop\n    action: ALLOW\n    rules:\n      - from:\n          - principals: [\"{CLIENT_ID}\"]\n        to:\n          - ports: [{APP_PORT}]\n"
        );
        assert_eq!(t.set_mesh(t.mesh(&allow)), (0, 0));
        echo_all(&mut conns, 1).unwrap();
        // One that denies them: every open stream is reset at once.
        let deny = format!(
            "policies:\n  - name: no-frontend\n    namespace: shop\n    action: DENY\n    rules:\n      - from:\n          - principals: [\"{CLIENT_ID}\"]\n"
        );
        let (_, reset) = t.set_mesh(t.mesh(&deny));
        assert_eq!(
            reset, 1000,
            "the destination's proxy re-checks every stream"
        );
        let mut alive = 0;
        for s in &mut conns {
            let _ = s.write_all(b"x");
            let mut b = [0u8; 1];
            if let Ok(1) = s.read_no_intr(&mut b) {
                alive += 1;
            }
        }
        assert_eq!(alive, 0, "denied connections must not carry bytes");
        expect_no_echo(&t, addr);
        assert_eq!(app.connections(), 1000, "the app sees no new connection");
        let text = common::hbone::metrics_text(&t.p2);
        assert!(
            text.contains("ringway_authorization_denials_total{path=\"recheck\"} 1000"),
            "{text}"
        );
    });
}

/// Workload certificates living 4 s (rotated every ~2 s) during an 8 s
/// transfer: the transfer completes byte-exact, and new connections keep
/// working on the rotated certificates.
#[test]
fn cert_rotation_during_long_transfer() {
    run_isolated("cert_rotation_during_long_transfer", || {
        let t = two_nodes(Opts {
            cert_lifetime: Duration::from_secs(4),
            ..Opts::new("hbone_rotate")
        });
        let (ids1, ids2) = (t.ids1.clone().unwrap(), t.ids2.clone().unwrap());
        let _r1 = ids1.spawn_refresher(Duration::from_millis(200)).unwrap();
        let _r2 = ids2.spawn_refresher(Duration::from_millis(200)).unwrap();
        let server_id = Identity::new(TD, "shop", "web");
        let client_id = Identity::new(TD, "front", "frontend");
        let serial = |ids: &ringway_identity::IdentityManager, id: &Identity| {
            ids.fetch(id).unwrap().serial().to_string()
        };
        let (c0, s0) = (serial(&ids1, &client_id), serial(&ids2, &server_id));
        let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
        let _app = echo_app(&t.server().netns, addr);
        let chunk: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
        let chunks = 320; // 20 MiB, one every 25 ms
                          // Whether both certificates had rotated while the transfer still had
                          // a quarter to go (checked from inside the read loop).
        let mut rotated_mid = false;
        let echoed = t.client().netns.run(|| -> std::io::Result<u64> {
            let mut s = connect(addr, TIMEOUT)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            let mut w = s.try_clone()?;
            let c = chunk.clone();
            let writer = std::thread::spawn(move || -> std::io::Result<()> {
                for _ in 0..chunks {
                    w.write_all(&c)?;
                    std::thread::sleep(Duration::from_millis(25));
                }
                w.shutdown(std::net::Shutdown::Write)
            });
            let mut got = 0u64;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = s.read_no_intr(&mut buf)?;
                if n == 0 {
                    break;
                }
                for (k, b) in buf[..n].iter().enumerate() {
                    let at = ((got + k as u64) % chunk.len() as u64) as usize;
                    if *b != chunk[at] {
                        return Err(std::io::Error::other(format!(
                            "byte {} differs",
                            got + k as u64
                        )));
                    }
                }
                got += n as u64;
                let total = (chunks * chunk.len()) as u64;
                if !rotated_mid && got < total * 3 / 4 {
                    rotated_mid =
                        serial(&ids1, &client_id) != c0 && serial(&ids2, &server_id) != s0;
                }
                // A new connection while the long one runs.
                if got % (4 << 20) < n as u64 {
                    let mut s2 = connect(addr, TIMEOUT)?;
                    s2.set_read_timeout(Some(TIMEOUT))?;
                    echo_once(&mut s2, b"meanwhile")?;
                }
            }
            writer.join().unwrap()?;
            Ok(got)
        });
        assert_eq!(
            echoed.expect("long transfer"),
            (chunks * chunk.len()) as u64
        );
        assert!(
            rotated_mid,
            "both certificates must rotate while the transfer is under way"
        );
        assert!(ids1.issued_count() >= 3 && ids2.issued_count() >= 3);
        exchange(&t, addr).expect("new connection after rotation");
    });
}

/// 256 MiB each way through the tunnel, at once, checksummed.
#[test]
fn hbone_256_mib_both_ways() {
    run_isolated("hbone_256_mib_both_ways", || {
        let t = two_nodes(Opts::new("hbone_256"));
        let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
        let l = t.server().netns.run(|| listen(addr)).unwrap();
        let srv = PayloadServer::start(l, 1);
        let size = 256u64 << 20;
        let got = t
            .client()
            .netns
            .run(|| client_exchange(connect(addr, TIMEOUT)?, size, size))
            .expect("256 MiB exchange");
        assert_eq!(got, size);
        let rep = srv.next_report(TIMEOUT).expect("server report");
        assert_eq!(rep.received.clone().unwrap(), size, "{rep:?}");
        assert_eq!(rep.peer.ip(), t.client().ip(false));
        assert_eq!(t.p1.hbone_connections_opened(), 1);
    });
}

/// A client certificate that chains to the mesh CA but is expired, or names
/// another trust domain, or is not SPIFFE at all: refused by the server.
#[test]
fn hbone_refuses_expired_and_wrong_san_clients() {
    run_isolated("hbone_refuses_expired_and_wrong_san_clients", || {
        let t = two_nodes(Opts::new("hbone_badcert"));
        let ca = CaSigner::load(t.dir.join("ca.crt"), t.dir.join("ca.key")).unwrap();
        let ids = t.ids1.clone().unwrap();
        let server_id = Identity::new(TD, "shop", "web");
        let client_id = Identity::new(TD, "front", "frontend");
        let config = |leaf: ringway_identity::TestLeaf| {
            let mut c =
                rustls::ClientConfig::builder_with_provider(ringway_identity::crypto_provider())
                    .with_protocol_versions(&[&rustls::version::TLS13])
                    .unwrap()
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ids.server_verifier(&server_id)))
                    .with_client_auth_cert(leaf.chain, leaf.key)
                    .unwrap();
            c.alpn_protocols = vec![b"h2".to_vec()];
            c
        };
        // Control: a valid leaf made the same way is accepted.
        let now = SystemTime::now();
        let good = ca.issue_for_tests(
            &client_id,
            now - Duration::from_secs(60),
            now + Duration::from_secs(3600),
        );
        assert!(common::hbone::raw_tls(&t, config(good)).expect("valid leaf") > 0);
        let cases = [
            (
                "expired",
                ca.issue_for_tests(
                    &client_id,
                    now - Duration::from_secs(7200),
                    now - Duration::from_secs(3600),
                ),
                rustls::AlertDescription::CertificateExpired,
                "expired",
            ),
            (
                "another trust domain",
                ca.issue_with_uris_for_tests(&["spiffe://other.example/ns/front/sa/frontend"]),
                rustls::AlertDescription::CertificateUnknown,
                "wrong_identity",
            ),
            (
                "not SPIFFE",
                ca.issue_with_uris_for_tests(&["https://front.example/frontend"]),
                rustls::AlertDescription::CertificateUnknown,
                "wrong_identity",
            ),
            (
                "no URI SAN",
                ca.issue_with_uris_for_tests(&[]),
                rustls::AlertDescription::CertificateUnknown,
                "wrong_identity",
            ),
        ];
        for (what, leaf, alert, reason) in cases {
            let before = handshakes(&t.p2, "server", reason);
            let r = common::hbone::raw_tls(&t, config(leaf));
            // The server's refusal is the TLS alert for the certificate,
            // never a timeout (raw_tls's read timeout) or a bare close.
            assert_eq!(
                common::hbone::tls_error(&r),
                Some(rustls::Error::AlertReceived(alert)),
                "{what} client certificate: not refused by the server's alert: {r:?}"
            );
            // ...and the server counted the failed handshake.
            assert!(
                wait_until(TIMEOUT, || handshakes(&t.p2, "server", reason) > before),
                "{what} client certificate: no server handshake failure `{reason}`: {}",
                common::hbone::metrics_text(&t.p2)
            );
        }
        assert!(wait_until(TIMEOUT, || t.p2.stats().active == 0));
    });
}

/// The destination's proxy presents an identity other than the one the mesh
/// expects for that workload (here: the agent reported another service
/// account): the client's proxy refuses the tunnel and resets the client.
#[test]
fn hbone_refuses_wrong_server_identity() {
    run_isolated("hbone_refuses_wrong_server_identity", || {
        let t = two_nodes(Opts {
            server_sa: "impostor".into(),
            ..Opts::new("hbone_impostor")
        });
        let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
        let app = echo_app(&t.server().netns, addr);
        expect_no_echo(&t, addr);
        // The client's proxy refused the server's identity (the tunnel
        // never opened, so nothing can reach the app after this).
        let client_failures = || handshakes(&t.p1, "client", "wrong_identity");
        assert!(
            wait_until(TIMEOUT, || client_failures() >= 1.0),
            "client-side handshake failure `wrong_identity` counted: {}",
            common::hbone::metrics_text(&t.p1)
        );
        assert_eq!(
            handshakes(&t.p2, "server", "ok"),
            0.0,
            "{}",
            common::hbone::metrics_text(&t.p2)
        );
        assert_eq!(app.connections(), 0, "nothing reaches the app");
    });
}

/// A client outside the mesh speaks HTTP/2 CONNECT to a pod's 15008 with a
/// forged `forwarded` header (claiming the mesh client's address) but no
/// TLS: refused before any header is read; the app sees nothing.
#[test]
fn hbone_refuses_forged_forwarded_from_non_mesh_client() {
    run_isolated(
        "hbone_refuses_forged_forwarded_from_non_mesh_client",
        || {
            let t = two_nodes(Opts::new("hbone_forged"));
            let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
            let app = echo_app(&t.server().netns, addr);
            let tunnel = SocketAddr::new(t.server().ip(false), 15008);
            let forged = SocketAddr::new(t.client().ip(false), 40000);
            let r = t.n1.node.run(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let pool = ringway_hbone::Pool::new(ringway_hbone::PoolConfig::default());
                    let key = ringway_hbone::PoolKey {
                        src_identity: CLIENT_ID.into(),
                        dst_identity: "spiffe://cluster.local/ns/shop/sa/web".into(),
                        src_ip: t.client().ip(false),
                        dst: tunnel,
                        trust_generation: 0,
                    };
                    let headers = ringway_hbone::ConnectHeaders::new(addr).forwarded_for(forged);
                    let dial = || tokio::net::TcpStream::connect(tunnel);
                    tokio::time::timeout(TIMEOUT, pool.connect(key, dial, headers)).await
                })
            });
            // Refused by the TLS server before any HTTP/2: what comes back
            // is not HTTP/2 (a TLS alert record, which the client's HTTP/2
            // library rejects as a frame, or a close), so the tunnel fails
            // at the HTTP/2 layer: not the dial, not a timeout, not a status.
            use ringway_hbone::HboneError;
            assert!(
                match &r {
                    Ok(Err(
                        HboneError::Handshake(e)
                        | HboneError::Connection(e)
                        | HboneError::Refused(e),
                    )) => {
                        e.is_io() || (e.is_go_away() && e.is_library())
                    }
                    _ => false,
                },
                "plaintext CONNECT must be refused by the server, got {:?}",
                r.map(|x| x.map(|_| "a stream"))
            );
            assert!(
                wait_until(TIMEOUT, || handshakes(&t.p2, "server", "protocol_error")
                    >= 1.0),
                "the server counted the failed handshake: {}",
                common::hbone::metrics_text(&t.p2)
            );
            assert_eq!(handshakes(&t.p2, "server", "ok"), 0.0);
            assert_eq!(app.connections(), 0, "nothing reaches the app");
        },
    );
}

/// Both sides of a tunnelled connection report it: the source proxy as
/// `reporter="source"`, the destination proxy as `reporter="destination"`,
/// both `mutual_tls` with the client's principal, and both byte counters
/// move while the connection is open, not only at close.
#[test]
fn hbone_metrics_both_reporters_mid_connection() {
    run_isolated("hbone_metrics_both_reporters_mid_connection", || {
        let t = two_nodes(Opts::new("hbone_metrics"));
        let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
        let _app = echo_app(&t.server().netns, addr);
        let mut s = t.client().netns.run(|| {
            let s = connect(addr, TIMEOUT).unwrap();
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
            s
        });
        let msg = vec![7u8; 100_000];
        echo_once(&mut s, &msg).unwrap();
        let scrape = |p: &ringway_proxy::Proxy| {
            ringway_proxy::metrics::encode(&p.metrics().registry(), false)
        };
        let moved = |body: &str, reporter: &str| {
            let want = [
                &format!("reporter=\"{reporter}\"")[..],
                "connection_security_policy=\"mutual_tls\"",
                &format!("source_principal=\"{CLIENT_ID}\""),
                "source_workload=\"client-0\"",
                "destination_workload=\"server-0\"",
            ];
            let r = prom::value(body, "istio_tcp_received_bytes_total", &want).unwrap_or(0.0);
            let w = prom::value(body, "istio_tcp_sent_bytes_total", &want).unwrap_or(0.0);
            let open = prom::value(body, "istio_tcp_connections_opened_total", &want);
            let closed = prom::value(body, "istio_tcp_connections_closed_total", &want);
            (r >= 100_000.0 && w >= 100_000.0, open, closed)
        };
        assert!(
            wait_until(TIMEOUT, || moved(&scrape(&t.p1), "source").0
                && moved(&scrape(&t.p2), "destination").0),
            "mid-connection counters:\n{}\n{}",
            scrape(&t.p1),
            scrape(&t.p2)
        );
        assert_eq!(moved(&scrape(&t.p2), "destination").1, Some(1.0));
        let closed = moved(&scrape(&t.p2), "destination").2;
        assert_eq!(closed.unwrap_or(0.0), 0.0, "still open");
        drop(s);
        assert!(wait_until(TIMEOUT, || moved(&scrape(&t.p2), "destination")
            .2
            == Some(1.0)
            && moved(&scrape(&t.p1), "source").2 == Some(1.0)));
    });
}

/// Apps that wait for more of the client than its first bytes, through
/// HBONE between two nodes. The source proxy sends what its client has
/// written by the time the connection is accepted with the CONNECT, then
/// the rest once the stream is answered; neither may be lost or wait on
/// the other:
/// - a request written in two pieces (headers, then a body 20 ms later)
///   to an app that answers only once it has both;
/// - a request followed by FIN to an app that reads to the end first.
///
/// Each round is a new connection, so the first bytes are often on the
/// CONNECT (the source proxy takes what the client has written by then).
#[test]
fn hbone_apps_that_wait_for_more_than_the_first_bytes() {
    run_isolated("hbone_apps_that_wait_for_more_than_the_first_bytes", || {
        const ROUNDS: usize = 20;
        let t = two_nodes(Opts::new("hbone_more_than_first"));
        let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
        let l = t.server().netns.run(|| listen(addr)).unwrap();
        // The app: per connection, odd ones read to EOF, even ones read 8
        // bytes; then answer and close. Bounded: 2 * ROUNDS connections.
        let app = std::thread::spawn(move || {
            for (i, s) in l.incoming().take(2 * ROUNDS).enumerate() {
                let mut s = s.unwrap();
                s.set_read_timeout(Some(TIMEOUT)).unwrap();
                let mut got = Vec::new();
                if i % 2 == 1 {
                    s.read_to_end(&mut got).unwrap();
                } else {
                    got.resize(8, 0);
                    s.read_exact(&mut got).unwrap();
                }
                s.write_all(&got).unwrap();
            }
        });
        for round in 0..ROUNDS {
            t.client().netns.run(|| {
                let mut s = connect(addr, TIMEOUT).unwrap();
                s.set_read_timeout(Some(TIMEOUT)).unwrap();
                s.write_all(b"HEAD").unwrap();
                std::thread::sleep(Duration::from_millis(20));
                s.write_all(b"BODY").unwrap();
                let mut back = [0u8; 8];
                s.read_exact(&mut back).unwrap_or_else(|e| {
                    panic!("round {round}: no answer to a request sent in two pieces: {e}")
                });
                assert_eq!(&back, b"HEADBODY");

                let mut s = connect(addr, TIMEOUT).unwrap();
                s.set_read_timeout(Some(TIMEOUT)).unwrap();
                s.write_all(b"all of it").unwrap();
                s.shutdown(std::net::Shutdown::Write).unwrap();
                let mut back = Vec::new();
                s.read_to_end(&mut back).unwrap_or_else(|e| {
                    panic!("round {round}: no answer to a request closed by FIN: {e}")
                });
                assert_eq!(back, b"all of it");
            });
        }
        app.join().unwrap();
    });
}

/// An exchange to `addr` begun while node 2's view is `lagging`; 500 ms in,
/// the view catches up (`caught_up`): what the exchange came to.
fn exchange_while_node2_catches_up(
    t: &TwoNodes,
    addr: SocketAddr,
    lagging: Arc<ringway_config::Mesh>,
    caught_up: Arc<ringway_config::Mesh>,
) -> std::io::Result<()> {
    t.p2.set_mesh(lagging);
    std::thread::scope(|s| {
        let c = s.spawn(|| exchange(t, addr));
        std::thread::sleep(Duration::from_millis(500));
        t.p2.set_mesh(caught_up);
        c.join().unwrap()
    })
}

/// An address the cluster gave a new client pod may still name the pod it
/// had before at the destination's node, whose control plane has not told
/// it yet: the destination waits (`proxy.workloadWait`) for the address to
/// be the peer's, then serves; a 401 at once would be an outage of every
/// such pod's first connections.
#[test]
fn hbone_waits_when_a_reused_client_address_still_names_its_old_pod() {
    run_isolated(
        "hbone_waits_when_a_reused_client_address_still_names_its_old_pod",
        || {
            let t = two_nodes(Opts::new("hbone_reused_client_ip"));
            let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
            let app = echo_app(&t.server().netns, addr);
            // Node 2's view (a control plane's, incomplete): the client's
            // addresses still held by the pod that had them before.
            let view = |updated: bool| {
                t.control_plane_view(|w| {
                    if w.uid == "client-0" && !updated {
                        w.uid = "old-client-0".into();
                        w.name = "old-client-0".into();
                        w.namespace = "old".into();
                        w.service_account = "gone".into();
                    }
                    true
                })
            };
            let conn = exchange_while_node2_catches_up(&t, addr, view(false), view(true));
            conn.expect("served once the address was the client's at the destination's node");
            assert_eq!(app.connections(), 1);
        },
    );
}

/// The control plane reaches nodes at different times: a new client pod's
/// node may know its workload (and tunnel its first connection) before the
/// destination's node does. The destination waits for the client's
/// workload as it waits for its own pod's (`proxy.workloadWait`), then
/// judges the client's address claim: served once the record arrives,
/// never refused at once for a lag (an outage), never accepted unchecked.
#[test]
fn hbone_waits_for_a_new_clients_workload_that_reaches_its_node_late() {
    run_isolated(
        "hbone_waits_for_a_new_clients_workload_that_reaches_its_node_late",
        || {
            let t = two_nodes(Opts::new("hbone_late_client"));
            let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
            let app = echo_app(&t.server().netns, addr);
            // Node 2's view, fed by a control plane (incomplete), without
            // the client's workload yet.
            let view =
                |with_client: bool| t.control_plane_view(|w| with_client || w.uid != "client-0");
            let conn = exchange_while_node2_catches_up(&t, addr, view(false), view(true));
            conn.expect("served once the client's workload reached the destination's node");
            assert_eq!(app.connections(), 1);
        },
    );
}
