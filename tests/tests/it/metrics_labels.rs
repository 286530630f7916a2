//! The full label set of the `istio_tcp_*` series, as the reference node
//! proxy gives it for the same connection: canonical service and revision
//! from the pods' labels (`*_app`/`*_version` are the same values there),
//! the configured cluster ID, region and zone of both nodes, and the
//! service when the client dialled its VIP (the destination side learns it
//! from `forwarded: …;host=`, and trusts it only among the pod's own
//! services). Two virtual nodes, HBONE between them.

use crate::common;
use ringway_testbed::prom;
use ringway_testbed::traffic::ReadNoIntr;
use std::io::Read;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use common::hbone::{two_nodes, Opts, TwoNodes, APP_PORT, CLIENT_ID, TD};
use common::{wait_until, TIMEOUT};
use ringway_config::{Mesh, MeshConfig, NoEnv};
use ringway_identity::Identity;
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{connect, listen};

const VIP: &str = "10.96.0.10";
const SERVER_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";

/// The mesh as node `node`'s proxy sees it: the client carries `app` and
/// `version` labels and its node's locality; the server the canonical-name
/// label and `app.kubernetes.io/version`, no locality (a pod on another
/// node whose topology is not known). Two services front the server on
/// target port 8080; `other` comes first, so a guess by port alone names
/// it, and only `host=` names `web`. `db` fronts nothing of the server's.
fn mesh(node: &str, zone: &str) -> Arc<Mesh> {
    mesh_with(node, zone, "frontend", "2.1")
}

/// [`mesh`] with the client's `app` label and the server's
/// `app.kubernetes.io/version` label given.
fn mesh_with(node: &str, zone: &str, client_app: &str, server_version: &str) -> Arc<Mesh> {
    let yaml = format!(
        r#"clusterId: east-1
locality: {{ region: r1, zone: {zone} }}
workloads:
  - uid: client-0
    name: client-0
    namespace: front
    serviceAccount: frontend
    ips: [10.244.1.2, "fd00:244:1::2"]
    node: node1
    tunnel: true
    labels: {{ app: {client_app}, version: v1 }}
    locality: {{ region: r1, zone: z1 }}
  - uid: server-0
    name: server-0
    namespace: shop
    serviceAccount: web
    ips: [10.244.2.2, "fd00:244:2::2"]
    node: node2
    tunnel: true
    labels: {{ service.istio.io/canonical-name: web, app: web-app, app.kubernetes.io/version: "{server_version}", version: v0 }}
services:
  - hostname: other.shop.svc.cluster.local
    namespace: shop
    vips: [10.96.0.11]
    ports: {{ 81: {APP_PORT} }}
    endpoints: [server-0]
  - hostname: web.shop.svc.cluster.local
    namespace: shop
    vips: [{VIP}]
    ports: {{ 80: {APP_PORT} }}
    endpoints: [server-0]
  - hostname: db.data.svc.cluster.local
    namespace: data
    vips: [10.96.0.12]
    ports: {{ 80: {APP_PORT} }}
    endpoints: [client-0]
"#
    );
    Arc::new(
        MeshConfig::load_str(&yaml, &format!("{node} metrics mesh"), &NoEnv)
            .unwrap_or_else(|e| panic!("{e}")),
    )
}

fn bed(test: &str) -> TwoNodes {
    let t = two_nodes(Opts::new(test));
    t.p1.set_mesh(mesh("node1", "z1"));
    t.p2.set_mesh(mesh("node2", "z2"));
    t
}

/// Every label of every `metric` sample with `reporter`, as a map (values
/// unescaped; a page that does not parse fails the test).
fn series(body: &str, metric: &str, reporter: &str) -> Vec<BTreeMap<String, String>> {
    prom::parse(body)
        .matching(metric, &[&format!("reporter=\"{reporter}\"")])
        .map(|s| s.labels.clone())
        .collect()
}

fn text(p: &ringway_proxy::Proxy) -> String {
    common::hbone::metrics_text(p)
}

/// Waits until both proxies report the connection closed, then returns the
/// source reporter's (node 1) and the destination reporter's (node 2)
/// label sets; each must be the only one.
fn both_reporters(t: &TwoNodes) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let closed = |p: &ringway_proxy::Proxy, r: &str| {
        series(&text(p), "istio_tcp_connections_closed_total", r).len() == 1
    };
    assert!(
        wait_until(TIMEOUT, || closed(&t.p1, "source")
            && closed(&t.p2, "destination")),
        "both sides report the closed connection:\n{}\n{}",
        text(&t.p1),
        text(&t.p2)
    );
    let src = series(&text(&t.p1), "istio_tcp_connections_opened_total", "source");
    let dst = series(
        &text(&t.p2),
        "istio_tcp_connections_opened_total",
        "destination",
    );
    assert_eq!(src.len(), 1, "{src:?}");
    assert_eq!(dst.len(), 1, "{dst:?}");
    (src[0].clone(), dst[0].clone())
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels both reporters agree on, then each side's locality view.
fn expected(reporter: &str, service: [&str; 3], dst_zone: &str) -> BTreeMap<String, String> {
    let dst_region = if dst_zone == "unknown" {
        "unknown"
    } else {
        "r1"
    };
    labels(&[
        ("reporter", reporter),
        ("source_workload", "client-0"),
        ("source_canonical_service", "frontend"),
        ("source_canonical_revision", "v1"),
        ("source_workload_namespace", "front"),
        ("source_principal", CLIENT_ID),
        ("source_app", "frontend"),
        ("source_version", "v1"),
        ("source_cluster", "east-1"),
        ("destination_service", service[0]),
        ("destination_service_namespace", service[1]),
        ("destination_service_name", service[2]),
        ("destination_workload", "server-0"),
        ("destination_canonical_service", "web"),
        ("destination_canonical_revision", "2.1"),
        ("destination_workload_namespace", "shop"),
        ("destination_principal", SERVER_ID),
        ("destination_app", "web"),
        ("destination_version", "2.1"),
        ("destination_cluster", "east-1"),
        ("request_protocol", "tcp"),
        ("response_flags", "-"),
        ("connection_security_policy", "mutual_tls"),
        ("source_region", "r1"),
        ("source_zone", "z1"),
        ("destination_region", dst_region),
        ("destination_zone", dst_zone),
    ])
}

/// One echoed exchange from the client pod to `addr`, then close.
fn one_connection(t: &TwoNodes, addr: SocketAddr) {
    let app = SocketAddr::new(t.server().ip(false), APP_PORT);
    let l = t.server().netns.run(|| listen(app)).unwrap();
    let echo = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read_no_intr(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    t.client().netns.run(|| {
        use std::io::Write;
        let mut s = connect(addr, TIMEOUT).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).unwrap();
    });
    echo.join().unwrap();
}

/// Through the service VIP: both sides name the service (the destination
/// from `host=`, though a guess by port would name `other`).
#[test]
fn metrics_full_label_set_through_a_service_vip() {
    run_isolated("metrics_full_label_set_through_a_service_vip", || {
        let t = bed("metrics_labels_vip");
        one_connection(&t, SocketAddr::new(VIP.parse().unwrap(), 80));
        let (src, dst) = both_reporters(&t);
        let web = ["web.shop.svc.cluster.local", "shop", "web"];
        // Node 1 does not know node 2's topology; node 2 knows its own.
        assert_eq!(src, expected("source", web, "unknown"));
        assert_eq!(dst, expected("destination", web, "z2"));
    });
}

/// Straight to the pod's address: no service on the source side (every
/// `destination_service*` is `unknown`, the namespace too); the destination
/// side names the first of the pod's services with that target port, as the
/// reference's `guess_inbound_service`.
#[test]
fn metrics_full_label_set_direct_to_a_pod() {
    run_isolated("metrics_full_label_set_direct_to_a_pod", || {
        let t = bed("metrics_labels_direct");
        one_connection(&t, SocketAddr::new(t.server().ip(false), APP_PORT));
        let (src, dst) = both_reporters(&t);
        assert_eq!(
            src,
            expected("source", ["unknown", "unknown", "unknown"], "unknown")
        );
        let other = ["other.shop.svc.cluster.local", "shop", "other"];
        assert_eq!(dst, expected("destination", other, "z2"));
    });
}

/// The mesh changes the client's and the server's labels while both run:
/// connections opened afterwards are reported under the new labels on both
/// sides (each proxy makes a pod's labels once per mesh, and caches series
/// per mesh), those before stay under the old ones.
#[test]
fn metrics_labels_follow_a_mesh_update_hbone() {
    run_isolated("metrics_labels_follow_a_mesh_update_hbone", || {
        let t = bed("metrics_labels_update");
        let vip = SocketAddr::new(VIP.parse().unwrap(), 80);
        one_connection(&t, vip);
        both_reporters(&t);
        t.p1.set_mesh(mesh_with("node1", "z1", "frontend-v2", "2.2"));
        t.p2.set_mesh(mesh_with("node2", "z2", "frontend-v2", "2.2"));
        one_connection(&t, vip);
        let web = ["web.shop.svc.cluster.local", "shop", "web"];
        let updated = |reporter: &str, zone: &str| {
            let mut e = expected(reporter, web, zone);
            for k in ["source_canonical_service", "source_app"] {
                e.insert(k.into(), "frontend-v2".into());
            }
            for k in ["destination_canonical_revision", "destination_version"] {
                e.insert(k.into(), "2.2".into());
            }
            e
        };
        for (p, reporter, zone) in [(&t.p1, "source", "unknown"), (&t.p2, "destination", "z2")] {
            assert!(
                wait_until(TIMEOUT, || series(
                    &text(p),
                    "istio_tcp_connections_closed_total",
                    reporter
                )
                .len()
                    == 2),
                "{}",
                text(p)
            );
            let mut got = series(&text(p), "istio_tcp_connections_opened_total", reporter);
            got.sort();
            let mut want = vec![expected(reporter, web, zone), updated(reporter, zone)];
            want.sort();
            assert_eq!(got, want, "{}", text(p));
        }
    });
}

/// A peer with a valid mesh certificate names, in `forwarded: …;host=`,
/// services the destination pod is not behind (another namespace's, one
/// that does not exist, junk): the destination's metrics never report them;
/// it falls back to the pod's own service by port. Naming the pod's real
/// service is honoured.
#[test]
fn adversarial_forwarded_host_cannot_claim_another_service() {
    run_isolated(
        "adversarial_forwarded_host_cannot_claim_another_service",
        || {
            let t = bed("metrics_labels_forged_host");
            let app = SocketAddr::new(t.server().ip(false), APP_PORT);
            let l = t.server().netns.run(|| listen(app)).unwrap();
            const CLAIMS: [&str; 4] = [
                "db.data.svc.cluster.local",
                "nothing.shop.svc.cluster.local",
                "kube-apiserver.default.svc.cluster.local",
                "web.shop.svc.cluster.local",
            ];
            let echo = std::thread::spawn(move || {
                use std::io::Write;
                for _ in CLAIMS {
                    let Ok((mut s, _)) = l.accept() else { return };
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read_no_intr(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            });
            for (i, host) in CLAIMS.iter().enumerate() {
                hostile_connect(&t, app, host, 40000 + i as u16).unwrap();
            }
            echo.join().unwrap();
            let body = text(&t.p2);
            let services: std::collections::BTreeSet<String> =
                series(&body, "istio_tcp_connections_opened_total", "destination")
                    .into_iter()
                    .map(|m| m["destination_service"].clone())
                    .collect();
            assert_eq!(
                services,
                [
                    "other.shop.svc.cluster.local".to_string(),
                    "web.shop.svc.cluster.local".to_string()
                ]
                .into(),
                "only the pod's own services are ever reported:\n{body}"
            );
            assert_eq!(
                prom::value(
                    &body,
                    "istio_tcp_connections_opened_total",
                    &[
                        "reporter=\"destination\"",
                        "destination_service=\"other.shop.svc.cluster.local\""
                    ]
                ),
                Some(3.0),
                "{body}"
            );
        },
    );
}

/// A CONNECT from node 1 as the client's identity (a real mesh certificate)
/// to `authority`, claiming the client's own address (port `port`) and
/// `host`; echoes one
/// message.
fn hostile_connect(
    t: &TwoNodes,
    authority: SocketAddr,
    host: &str,
    port: u16,
) -> Result<(), String> {
    let me = Identity::new(TD, "front", "frontend");
    let web = Identity::new(TD, "shop", "web");
    let client = t.client().ip(false);
    let headers = ringway_hbone::ConnectHeaders::new(authority)
        .forwarded_for(SocketAddr::new(client, port))
        .forwarded_host(host);
    match common::hbone::peer_connect(t, &me, &web, false, headers)? {
        200 => Ok(()),
        status => Err(format!("CONNECT refused with {status}")),
    }
}

/// `istio_tcp_sockets_open`: 1 on both sides while the connection is open
/// (with the series' labels), 0 once closed; a connection whose upstream
/// connect failed (closed as `UF`) is not left open.
#[test]
fn metrics_sockets_open_follows_open_connections() {
    run_isolated("metrics_sockets_open_follows_open_connections", || {
        let t = bed("metrics_sockets_open");
        let app = SocketAddr::new(t.server().ip(false), APP_PORT);
        let l = t.server().netns.run(|| listen(app)).unwrap();
        let open = |p: &ringway_proxy::Proxy, r: &str| {
            prom::value(
                &text(p),
                "istio_tcp_sockets_open",
                &[
                    &format!("reporter=\"{r}\""),
                    "source_workload=\"client-0\"",
                    "destination_workload=\"server-0\"",
                    "destination_service=\"web.shop.svc.cluster.local\"",
                    "response_flags=\"-\"",
                ],
            )
        };
        let client = t.client().netns.run(|| {
            use std::io::Write;
            let mut s = connect(SocketAddr::new(VIP.parse().unwrap(), 80), TIMEOUT).unwrap();
            s.write_all(b"x").unwrap();
            s
        });
        let (server, _) = l.accept().unwrap();
        assert!(
            wait_until(TIMEOUT, || open(&t.p1, "source") == Some(1.0)
                && open(&t.p2, "destination") == Some(1.0)),
            "one open connection on each side:\n{}\n{}",
            text(&t.p1),
            text(&t.p2)
        );
        drop(client);
        drop(server);
        assert!(
            wait_until(TIMEOUT, || open(&t.p1, "source") == Some(0.0)
                && open(&t.p2, "destination") == Some(0.0)),
            "none open after close:\n{}\n{}",
            text(&t.p1),
            text(&t.p2)
        );
        // Nothing listens on 9: the destination answers 503, the source
        // closes the series as UF. Nothing stays open, nothing negative.
        let _ = t.client().netns.run(|| {
            let mut s = connect(SocketAddr::new(t.server().ip(false), 9), TIMEOUT)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            s.read_no_intr(&mut [0u8; 1])
        });
        assert!(
            wait_until(TIMEOUT, || prom::value(
                &text(&t.p1),
                "istio_tcp_connections_closed_total",
                &["reporter=\"source\"", "response_flags=\"UF\""]
            ) == Some(1.0)),
            "{}",
            text(&t.p1)
        );
        let body = text(&t.p1);
        for s in prom::parse(&body).matching("istio_tcp_sockets_open", &[]) {
            assert_eq!(s.value, 0.0, "{s}\n{body}");
        }
    });
}

/// Plaintext on one node, through a service VIP (same-node fast path, both
/// reporters; and both hops): as the reference, the source principal is
/// known only from mTLS (`unknown` here), the destination's is its
/// workload's identity, the service is named on both sides, and both pods
/// carry this node's region and zone.
fn plaintext_vip(fast_path: bool) {
    use ringway_config::{CaptureMode, Datapath};
    let vn = ringway_testbed::VirtualNode::build(1, 2).unwrap();
    let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Auto);
    settings.same_node_fast_path = fast_path;
    let proxy = ringway_proxy::Proxy::start(settings).unwrap();
    let yaml = format!(
        r#"clusterId: east-1
locality: {{ region: r1, zone: z1 }}
workloads:
  - {{ uid: {ua}, name: client-0, namespace: front, serviceAccount: frontend, ips: [{ia}], node: node1, labels: {{ app: frontend }} }}
  - {{ uid: {ub}, name: server-0, namespace: shop, serviceAccount: web, ips: [{ib}], node: node1, labels: {{ app: web, version: v1 }} }}
services:
  - {{ hostname: web.shop.svc.cluster.local, namespace: shop, vips: [10.96.0.20], ports: {{ 80: {APP_PORT} }}, endpoints: [{ub}] }}
"#,
        ua = a.name,
        ub = b.name,
        ia = a.ipv4,
        ib = b.ipv4,
    );
    proxy.set_mesh(Arc::new(
        MeshConfig::load_str(&yaml, "plaintext mesh", &NoEnv).unwrap_or_else(|e| panic!("{e}")),
    ));
    for p in [&a, &b] {
        common::capture(p, CaptureMode::Tproxy);
        proxy.add_pod(&p.name, p.netns.dup_fd().unwrap()).unwrap();
    }
    let app = SocketAddr::new(b.ip(false), APP_PORT);
    let l = b.netns.run(|| listen(app)).unwrap();
    let echo = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = l.accept().unwrap();
        let mut buf = [0u8; 64];
        while let Ok(n) = s.read_no_intr(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    a.netns.run(|| {
        use std::io::Write;
        let mut s = connect(SocketAddr::new("10.96.0.20".parse().unwrap(), 80), TIMEOUT).unwrap();
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).unwrap();
    });
    echo.join().unwrap();
    common::wait_no_active(&proxy);
    let body = text(&proxy);
    let expect = |reporter: &str| {
        labels(&[
            ("reporter", reporter),
            ("source_workload", "client-0"),
            ("source_canonical_service", "frontend"),
            ("source_canonical_revision", "latest"),
            ("source_workload_namespace", "front"),
            ("source_principal", "unknown"),
            ("source_app", "frontend"),
            ("source_version", "latest"),
            ("source_cluster", "east-1"),
            ("destination_service", "web.shop.svc.cluster.local"),
            ("destination_service_namespace", "shop"),
            ("destination_service_name", "web"),
            ("destination_workload", "server-0"),
            ("destination_canonical_service", "web"),
            ("destination_canonical_revision", "v1"),
            ("destination_workload_namespace", "shop"),
            ("destination_principal", SERVER_ID),
            ("destination_app", "web"),
            ("destination_version", "v1"),
            ("destination_cluster", "east-1"),
            ("request_protocol", "tcp"),
            ("response_flags", "-"),
            ("connection_security_policy", "none"),
            ("source_region", "r1"),
            ("source_zone", "z1"),
            ("destination_region", "r1"),
            ("destination_zone", "z1"),
        ])
    };
    for reporter in ["source", "destination"] {
        assert_eq!(
            series(&body, "istio_tcp_connections_closed_total", reporter),
            vec![expect(reporter)],
            "{body}"
        );
    }
}

#[test]
fn metrics_full_label_set_plaintext_vip_fast_path() {
    run_isolated("metrics_full_label_set_plaintext_vip_fast_path", || {
        plaintext_vip(true)
    });
}

#[test]
fn metrics_full_label_set_plaintext_vip_both_hops() {
    run_isolated("metrics_full_label_set_plaintext_vip_both_hops", || {
        plaintext_vip(false)
    });
}

/// Plaintext on one node (fast path, or both hops): the mesh moves the
/// server to another service account and renames the client's canonical
/// service; the next connection's series on both reporters carry the new
/// principal and names, the first connection's keep the old ones (one each).
fn plaintext_mesh_update(fast_path: bool) {
    use ringway_config::{CaptureMode, Datapath};
    let vn = ringway_testbed::VirtualNode::build(1, 2).unwrap();
    let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Auto);
    settings.same_node_fast_path = fast_path;
    let proxy = ringway_proxy::Proxy::start(settings).unwrap();
    let mesh = |client_app: &str, server_sa: &str| {
        let yaml = format!(
            r#"workloads:
  - {{ uid: {ua}, name: client-0, namespace: front, serviceAccount: frontend, ips: [{ia}], node: node1, labels: {{ app: {client_app} }} }}
  - {{ uid: {ub}, name: server-0, namespace: shop, serviceAccount: {server_sa}, ips: [{ib}], node: node1 }}
"#,
            ua = a.name,
            ub = b.name,
            ia = a.ipv4,
            ib = b.ipv4,
        );
        Arc::new(
            MeshConfig::load_str(&yaml, "update mesh", &NoEnv).unwrap_or_else(|e| panic!("{e}")),
        )
    };
    proxy.set_mesh(mesh("frontend", "web"));
    for p in [&a, &b] {
        common::capture(p, CaptureMode::Tproxy);
        proxy.add_pod(&p.name, p.netns.dup_fd().unwrap()).unwrap();
    }
    let app = SocketAddr::new(b.ip(false), APP_PORT);
    let l = b.netns.run(|| listen(app)).unwrap();
    let echo = std::thread::spawn(move || {
        use std::io::Write;
        for _ in 0..2 {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut buf = [0u8; 64];
            while let Ok(n) = s.read_no_intr(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let exchange = || {
        a.netns.run(|| {
            use std::io::Write;
            let mut s = connect(app, TIMEOUT).unwrap();
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
            s.write_all(b"ping").unwrap();
            let mut back = [0u8; 4];
            s.read_exact(&mut back).unwrap();
        });
        common::wait_no_active(&proxy);
    };
    exchange();
    proxy.set_mesh(mesh("frontend-v2", "web-v2"));
    exchange();
    echo.join().unwrap();
    let body = text(&proxy);
    for reporter in ["source", "destination"] {
        let got: BTreeMap<(String, String), usize> =
            series(&body, "istio_tcp_connections_closed_total", reporter)
                .into_iter()
                .fold(BTreeMap::new(), |mut m, l| {
                    *m.entry((
                        l["source_canonical_service"].clone(),
                        l["destination_principal"].clone(),
                    ))
                    .or_default() += 1;
                    m
                });
        let want: BTreeMap<(String, String), usize> = [
            (("frontend".into(), SERVER_ID.into()), 1),
            (
                (
                    "frontend-v2".into(),
                    "spiffe://cluster.local/ns/shop/sa/web-v2".into(),
                ),
                1,
            ),
        ]
        .into();
        assert_eq!(got, want, "{reporter}: {body}");
        for l in series(&body, "istio_tcp_connections_closed_total", reporter) {
            assert_eq!(l["source_principal"], "unknown", "plaintext: {body}");
        }
    }
    for s in prom::parse(&body).matching("istio_tcp_connections_closed_total", &[]) {
        assert_eq!(s.value, 1.0, "one connection per series: {s}\n{body}");
    }
}

#[test]
fn metrics_labels_follow_a_mesh_update_fast_path() {
    run_isolated("metrics_labels_follow_a_mesh_update_fast_path", || {
        plaintext_mesh_update(true)
    });
}

#[test]
fn metrics_labels_follow_a_mesh_update_both_hops() {
    run_isolated("metrics_labels_follow_a_mesh_update_both_hops", || {
        plaintext_mesh_update(false)
    });
}

/// An HBONE connection whose destination pod has nothing listening: node 2
/// cannot connect inside the pod and answers 503, and node 1 reports the
/// connection as failed: `istio_tcp_connections_failed_total` with the
/// labels of its `UF` opened series, the full source label set.
#[test]
fn metrics_hbone_connect_failure_counts_failed_with_the_opened_labels() {
    run_isolated(
        "metrics_hbone_connect_failure_counts_failed_with_the_opened_labels",
        || {
            let t = bed("metrics_labels_failed");
            // Nothing listens on APP_PORT in the server pod.
            let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
            t.client().netns.run(|| {
                if let Ok(mut s) = connect(addr, TIMEOUT) {
                    s.set_read_timeout(Some(TIMEOUT)).unwrap();
                    let mut b = [0u8; 1];
                    // Reset (or closed) once the tunnel fails; never data.
                    assert!(!matches!(s.read_no_intr(&mut b), Ok(n) if n > 0));
                }
            });
            let failed = |p: &ringway_proxy::Proxy| {
                series(&text(p), "istio_tcp_connections_failed_total", "source")
            };
            assert!(
                wait_until(TIMEOUT, || failed(&t.p1).len() == 1),
                "node 1 reports the failed connection:\n{}",
                text(&t.p1)
            );
            let body = text(&t.p1);
            let got = failed(&t.p1).remove(0);
            let mut want = expected("source", ["unknown", "unknown", "unknown"], "unknown");
            want.insert("response_flags".into(), "UF".into());
            assert_eq!(got, want, "{body}");
            // The same labels as the connection's `UF` opened series.
            let opened = series(&body, "istio_tcp_connections_opened_total", "source");
            assert!(opened.contains(&want), "{body}");
            assert!(
                prom::parse(&body)
                    .matching("istio_tcp_connections_failed_total", &[])
                    .any(|s| s.value == 1.0),
                "{body}"
            );
        },
    );
}
