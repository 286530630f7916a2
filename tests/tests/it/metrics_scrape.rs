//! Scraping /metrics during traffic on the virtual node: the reference
//! mesh's `istio_tcp_*` series with their labels, byte counters that move
//! before the connection closes, and content negotiation.

use crate::common;
use ringway_testbed::prom;
use ringway_testbed::traffic::ReadNoIntr;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use ringway_config::{CaptureMode, Datapath};
use ringway_proxy::control::{metrics_handler, ControlServer};
use ringway_proxy::PodIdentity;
use ringway_testbed::{run_isolated, VirtualNode};

/// `/metrics` in either format: the content type and the page (the test
/// fails when the endpoint does not answer 200).
fn scrape(addr: SocketAddr, openmetrics: bool) -> (String, String) {
    let accept = if openmetrics {
        "application/openmetrics-text; version=1.0.0"
    } else {
        "text/plain"
    };
    let r = ringway_testbed::http::request(addr, "GET", "/metrics", &[("Accept", accept)]).unwrap();
    assert_eq!(r.status, 200, "GET /metrics: {}", r.body);
    (r.header("content-type").unwrap_or("").to_string(), r.body)
}

fn scrape_during_traffic(fast_path: bool) {
    let vn = VirtualNode::build(1, 2).unwrap();
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Auto);
    settings.same_node_fast_path = fast_path;
    let proxy = ringway_proxy::Proxy::start(settings).unwrap();
    for (i, p) in vn.pods.iter().enumerate() {
        common::capture(p, CaptureMode::Tproxy);
        let id = PodIdentity {
            name: format!("app-{i}"),
            namespace: "shop".into(),
            service_account: format!("sa-{i}"),
        };
        proxy
            .add_pod_with_identity(&p.name, p.netns.dup_fd().unwrap(), id)
            .unwrap();
    }
    let server = ControlServer::serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics_handler(proxy.metrics(), proxy.stats_handle()),
    )
    .unwrap();
    let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
    let addr = SocketAddr::new(b.ip(false), 8080);
    let l = b
        .netns
        .run(|| ringway_testbed::traffic::listen(addr))
        .unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 65536];
        while let Ok(n) = s.read_no_intr(&mut buf) {
            if n == 0 || s.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut client = a
        .netns
        .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
        .unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let chunk = vec![7u8; 100_000];
    client.write_all(&chunk).unwrap();
    let mut back = vec![0u8; chunk.len()];
    client.read_exact(&mut back).unwrap();

    // Mid-connection scrape: bytes already counted, connection open. The
    // worker adds to the counters right after each splice returns, which can
    // be a moment after the client already read the bytes: poll briefly.
    let src_labels = [
        "reporter=\"source\"",
        "source_workload=\"app-0\"",
        "source_workload_namespace=\"shop\"",
        // Plaintext: as the reference, the source principal only from mTLS.
        "source_principal=\"unknown\"",
        "source_canonical_service=\"app-0\"",
        "source_canonical_revision=\"latest\"",
        "destination_workload=\"app-1\"",
        "destination_principal=\"spiffe://cluster.local/ns/shop/sa/sa-1\"",
        "request_protocol=\"tcp\"",
        "response_flags=\"-\"",
        "connection_security_policy=\"none\"",
    ];
    let counted = |body: &str| {
        let r = prom::value(body, "istio_tcp_received_bytes_total", &src_labels).unwrap_or(0.0);
        let w = prom::value(body, "istio_tcp_sent_bytes_total", &src_labels).unwrap_or(0.0);
        r >= 100_000.0 && w >= 100_000.0
    };
    let mut scraped = scrape(server.addr, false);
    ringway_testbed::wait_until(Duration::from_secs(10), || {
        scraped = scrape(server.addr, false);
        counted(&scraped.1)
    });
    let (ct, body) = scraped;
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    assert_eq!(
        prom::value(&body, "istio_tcp_connections_opened_total", &src_labels),
        Some(1.0),
        "{body}"
    );
    let received = prom::value(&body, "istio_tcp_received_bytes_total", &src_labels).unwrap();
    let sent = prom::value(&body, "istio_tcp_sent_bytes_total", &src_labels).unwrap();
    assert!(
        received >= 100_000.0,
        "request bytes must be counted before close: {received}"
    );
    assert!(
        sent >= 100_000.0,
        "response bytes must be counted before close: {sent}"
    );
    // Not closed yet (the series exists from the open, at 0).
    assert_eq!(
        prom::value(&body, "istio_tcp_connections_closed_total", &src_labels).unwrap_or(0.0),
        0.0
    );
    // The destination side reports too (the fast path plays both sides, and
    // without it pod-b's inbound capture does).
    let dst_labels = [
        "reporter=\"destination\"",
        "source_workload=\"app-0\"",
        "destination_workload=\"app-1\"",
    ];
    assert_eq!(
        prom::value(&body, "istio_tcp_connections_opened_total", &dst_labels),
        Some(1.0),
        "{body}"
    );
    assert!(
        body.contains("# TYPE istio_tcp_connections_opened_total counter"),
        "{body}"
    );
    assert!(body.contains("ringway_pods_enrolled 2"), "{body}");
    assert!(body.contains("ringway_connections_active"), "{body}");
    assert!(body.contains("process_open_fds"), "{body}");
    assert!(!body.contains("# EOF"));

    drop(client);
    echo.join().unwrap();
    common::wait_no_active(&proxy);
    let (ct, body) = scrape(server.addr, true);
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(
        body.trim_end().ends_with("# EOF"),
        "OpenMetrics ends with # EOF"
    );
    // The datapath's buffers: every pipe went back (none leaked), some are
    // kept for reuse.
    assert_eq!(
        prom::value(&body, "ringway_pipes", &["state=\"in_use\""]),
        Some(0.0),
        "{body}"
    );
    assert!(
        prom::value(&body, "ringway_pipes", &["state=\"idle\""]).unwrap_or(0.0) >= 1.0,
        "{body}"
    );
    assert_eq!(
        prom::value(&body, "istio_tcp_connections_closed_total", &src_labels),
        Some(1.0),
        "{body}"
    );
}

#[test]
fn scrape_during_traffic_fast_path() {
    run_isolated("scrape_during_traffic_fast_path", || {
        scrape_during_traffic(true)
    });
}

#[test]
fn scrape_during_traffic_both_hops() {
    run_isolated("scrape_during_traffic_both_hops", || {
        scrape_during_traffic(false)
    });
}

/// The number of `istio_tcp_*` samples of a Prometheus text scrape.
fn tcp_series(body: &str) -> usize {
    prom::parse(body)
        .samples
        .iter()
        .filter(|s| s.name.starts_with("istio_tcp_"))
        .count()
}

/// Pod churn: clients come and go (a new pod, a connection to a pod that
/// stays, the pod removed) and the proxy's series must go with them, or
/// its memory and every scrape grow with each pod that ever ran. A client
/// name that comes back (a StatefulSet's pod) starts its series afresh.
fn pod_churn_drops_series(fast_path: bool) {
    let vn = VirtualNode::build(1, 2).unwrap();
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Auto);
    settings.same_node_fast_path = fast_path;
    let proxy = ringway_proxy::Proxy::start(settings).unwrap();
    let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
    common::capture(&a, CaptureMode::Tproxy);
    common::capture(&b, CaptureMode::Tproxy);
    let identity = |name: &str| PodIdentity {
        name: name.into(),
        namespace: "shop".into(),
        service_account: name.into(),
    };
    proxy
        .add_pod_with_identity(&b.name, b.netns.dup_fd().unwrap(), identity("server"))
        .unwrap();
    let server = ControlServer::serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics_handler(proxy.metrics(), proxy.stats_handle()),
    )
    .unwrap();
    let addr = SocketAddr::new(b.ip(false), 8080);
    let l = b
        .netns
        .run(|| ringway_testbed::traffic::listen(addr))
        .unwrap();
    const ROUNDS: usize = 24;
    let echo = std::thread::spawn(move || {
        for _ in 0..ROUNDS {
            let Ok((mut s, _)) = l.accept() else { return };
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.read_no_intr(&mut buf) {
                if n == 0 || s.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    });
    let baseline = tcp_series(&scrape(server.addr, false).1);
    for round in 0..ROUNDS {
        // Names repeat every 3 rounds, UIDs never.
        let name = format!("client-{}", round % 3);
        let uid = format!("churn-{round}");
        proxy
            .add_pod_with_identity(&uid, a.netns.dup_fd().unwrap(), identity(&name))
            .unwrap();
        let mut c = a
            .netns
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).unwrap();
        drop(c);
        common::wait_no_active(&proxy);
        let body = scrape(server.addr, false).1;
        let who = format!("source_workload=\"{name}\"");
        assert_eq!(
            prom::value(
                &body,
                "istio_tcp_connections_opened_total",
                &["reporter=\"source\"", &who]
            ),
            Some(1.0),
            "round {round}: {name}'s one connection, counted once, in a series of its own\n{body}"
        );
        assert!(tcp_series(&body) > baseline, "round {round}: {body}");
        proxy.remove_pod(&uid).unwrap();
    }
    echo.join().unwrap();
    let body = scrape(server.addr, false).1;
    assert_eq!(
        tcp_series(&body),
        baseline,
        "{ROUNDS} pods came and went; their series must have gone with them:\n{body}"
    );
}

/// A pod the mesh renames while it runs (its owner changed: another
/// `workloadName`) has reported under both names; removing it must drop
/// the series of both, not only those of the name it has at the end (the
/// others would stay in every scrape, and the proxy's memory, for good).
fn renamed_pod_drops_all_series(fast_path: bool) {
    use std::sync::Arc;
    let vn = VirtualNode::build(1, 2).unwrap();
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Auto);
    settings.same_node_fast_path = fast_path;
    let proxy = ringway_proxy::Proxy::start(settings).unwrap();
    let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
    let mesh = |client: &str| {
        let yaml = format!(
            r#"workloads:
  - {{ uid: {ua}, name: {ua}, namespace: front, serviceAccount: client, workloadName: {client}, ips: [{ia}], node: node1 }}
  - {{ uid: {ub}, name: {ub}, namespace: shop, serviceAccount: web, workloadName: server, ips: [{ib}], node: node1 }}
"#,
            ua = a.name,
            ub = b.name,
            ia = a.ipv4,
            ib = b.ipv4,
        );
        Arc::new(
            ringway_config::MeshConfig::load_str(&yaml, "rename mesh", &ringway_config::NoEnv)
                .unwrap_or_else(|e| panic!("{e}")),
        )
    };
    proxy.set_mesh(mesh("client-v1"));
    for p in [&a, &b] {
        common::capture(p, CaptureMode::Tproxy);
        proxy.add_pod(&p.name, p.netns.dup_fd().unwrap()).unwrap();
    }
    let addr = SocketAddr::new(b.ip(false), 8080);
    let l = b
        .netns
        .run(|| ringway_testbed::traffic::listen(addr))
        .unwrap();
    let echo = std::thread::spawn(move || {
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
    let text = || ringway_proxy::metrics::encode(&proxy.metrics().registry(), false);
    for name in ["client-v1", "client-v2"] {
        if name == "client-v2" {
            proxy.set_mesh(mesh(name));
        }
        let mut c = a
            .netns
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        c.read_exact(&mut back).unwrap();
        drop(c);
        common::wait_no_active(&proxy);
        let body = text();
        assert_eq!(
            prom::value(
                &body,
                "istio_tcp_connections_closed_total",
                &[
                    "reporter=\"source\"",
                    &format!("source_workload=\"{name}\"")
                ]
            ),
            Some(1.0),
            "the connection is reported under the pod's name now ({name}):\n{body}"
        );
    }
    echo.join().unwrap();
    proxy.remove_pod(&a.name).unwrap();
    let body = text();
    let left: Vec<String> = prom::parse(&body)
        .samples
        .iter()
        .filter(|s| {
            s.name.starts_with("istio_tcp_") && s.labels.values().any(|v| v.contains("client-v"))
        })
        .map(|s| s.to_string())
        .collect();
    assert!(
        left.is_empty(),
        "the removed pod's series under every name it had must go:\n{}",
        left.join("\n")
    );
}

#[test]
fn adversarial_renamed_pod_drops_all_its_series_fast_path() {
    run_isolated(
        "adversarial_renamed_pod_drops_all_its_series_fast_path",
        || renamed_pod_drops_all_series(true),
    );
}

#[test]
fn adversarial_renamed_pod_drops_all_its_series_both_hops() {
    run_isolated(
        "adversarial_renamed_pod_drops_all_its_series_both_hops",
        || renamed_pod_drops_all_series(false),
    );
}

#[test]
fn adversarial_pod_churn_drops_metric_series_fast_path() {
    run_isolated(
        "adversarial_pod_churn_drops_metric_series_fast_path",
        || pod_churn_drops_series(true),
    );
}

#[test]
fn adversarial_pod_churn_drops_metric_series_both_hops() {
    run_isolated(
        "adversarial_pod_churn_drops_metric_series_both_hops",
        || pod_churn_drops_series(false),
    );
}

/// A connection to a port nothing listens on, from one pod to the other of
/// the same node, over the fast path or the plaintext hops: each reporter
/// whose connect failed reports one `UF` connection opened and closed, and
/// `istio_tcp_connections_failed_total` with exactly the same labels; the
/// proxy also says which build it is (`istio_build`).
fn failed_upstream_connect_is_counted(fast_path: bool) {
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Auto);
    settings.same_node_fast_path = fast_path;
    let mn = common::MeshNode::with_settings(2, settings);
    let server = ControlServer::serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics_handler(mn.proxy.metrics(), mn.proxy.stats_handle()),
    )
    .unwrap();
    // Nothing listens on 9999 in pod-b: the upstream connect is refused.
    let addr = SocketAddr::new(mn.pod(1).ip(false), 9999);
    let _ = mn.pod(0).netns.run(|| {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        let mut b = [0u8; 1];
        s.read_no_intr(&mut b)
    });
    common::wait_no_active(&mn.proxy);
    let (_, body) = scrape(server.addr, false);
    let page = prom::parse(&body);
    let failed: Vec<_> = page
        .matching("istio_tcp_connections_failed_total", &[])
        .collect();
    let opened: Vec<_> = page
        .matching("istio_tcp_connections_opened_total", &[])
        .collect();
    // Every failed series is the `UF` series its connection was opened (and
    // closed) under, once.
    for f in &failed {
        assert_eq!(f.label("response_flags"), Some("UF"), "{f}");
        assert_eq!(f.value, 1.0, "{body}");
        assert!(
            opened
                .iter()
                .any(|o| o.labels == f.labels && o.value == 1.0),
            "no opened series with the failed one's labels {f}:\n{body}"
        );
        assert!(
            page.matching("istio_tcp_connections_closed_total", &[])
                .any(|c| c.labels == f.labels && c.value == 1.0),
            "no closed series with the failed one's labels {f}:\n{body}"
        );
    }
    // Both pods are this proxy's. The fast path's one hop fails as the
    // source and as the destination; over the plaintext hops the inbound
    // hop always fails (the source's connect reached the proxy in pod-b,
    // and whether it sees that hop's reset as its own connect failing
    // depends on timing, so it is not required).
    let required: &[&str] = if fast_path {
        &["destination", "source"]
    } else {
        &["destination"]
    };
    for reporter in required {
        assert!(
            failed.iter().any(|f| f.label("reporter") == Some(reporter)),
            "no failed series for {reporter}:\n{body}"
        );
    }
    assert!(failed.len() <= 2, "{body}");
    assert_eq!(
        prom::value(
            &body,
            "istio_build",
            &[
                "component=\"ztunnel\"",
                &format!("tag=\"{}\"", env!("CARGO_PKG_VERSION"))
            ]
        ),
        Some(1.0),
        "{body}"
    );
    assert!(body.contains("# TYPE istio_build gauge"), "{body}");
}

#[test]
fn failed_upstream_connect_is_counted_fast_path() {
    run_isolated("failed_upstream_connect_is_counted_fast_path", || {
        failed_upstream_connect_is_counted(true)
    });
}

#[test]
fn failed_upstream_connect_is_counted_both_hops() {
    run_isolated("failed_upstream_connect_is_counted_both_hops", || {
        failed_upstream_connect_is_counted(false)
    });
}

fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let r = ringway_testbed::http::request(addr, method, path, &[]).unwrap();
    (r.status, r.body)
}

#[test]
fn admin_config_dump_and_log_level() {
    run_isolated("admin_config_dump_and_log_level", || {
        let mn = common::MeshNode::new(2, CaptureMode::Tproxy, Datapath::Auto);
        let proxy = std::sync::Arc::new(mn.proxy);
        let levels = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = levels.clone();
        let set: ringway_proxy::control::SetLogLevel = std::sync::Arc::new(move |l: &str| {
            if l.contains('[') && !l.contains(']') {
                return Err(ringway_proxy::control::LogLevelError::Invalid(
                    "unbalanced".into(),
                ));
            }
            seen.lock().unwrap().push(l.to_string());
            Ok(())
        });
        let admin = ControlServer::serve(
            "127.0.0.1:0".parse().unwrap(),
            ringway_proxy::control::admin_handler(proxy.clone(), set),
        )
        .unwrap();
        let (code, body) = http(admin.addr, "GET", "/config_dump");
        assert_eq!(code, 200, "{body}");
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
        let pods = dump["pods"].as_array().unwrap();
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0]["uid"], "n1-pod0");
        assert!(pods[0]["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "inbound 0.0.0.0:15006"));
        assert_eq!(dump["settings"]["captureMode"], "tproxy");
        // No mesh configured here: no HBONE, nothing authorized to re-check.
        assert_eq!(dump["hbone"]["enabled"], false, "{body}");
        assert_eq!(dump["hbone"]["poolConnections"], 0, "{body}");
        assert!(dump["mesh"].is_null(), "{body}");
        assert_eq!(pods[0]["authorizedFlows"], 0, "{body}");
        let (code, _) = http(admin.addr, "POST", "/logging?level=info,access=debug");
        assert_eq!(code, 200);
        assert_eq!(levels.lock().unwrap().as_slice(), ["info,access=debug"]);
        let (code, body) = http(admin.addr, "POST", "/logging");
        assert_eq!(code, 400, "{body}");
        let (code, _) = http(admin.addr, "GET", "/nope");
        assert_eq!(code, 404);
    });
}

/// Every metric the shipped Grafana dashboard queries is one the proxy or
/// the agent exports (names taken from a real proxy's and agent's output).
#[test]
fn grafana_dashboard_reads_exported_metrics() {
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/grafana/ringway-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    use ringway_proxy::metrics::*;
    // One sample in every family (empty families are not described).
    let m = std::sync::Arc::new(Metrics::default());
    let l = TcpLabels::new(
        "source",
        &Peer::default(),
        &Peer::default(),
        None,
        "none",
        "-",
    );
    for f in [&m.opened, &m.closed, &m.failed, &m.sent, &m.received] {
        f.get_or_create(&l).inc();
    }
    m.zds.get_or_create(&ZdsLabels { outcome: "ack" }).inc();
    let tls = TlsLabels {
        side: "client",
        outcome: "ok",
    };
    m.tls_handshakes.get_or_create(&tls).inc();
    m.hbone_streams.get_or_create(&tls).inc();
    m.denials.get_or_create(&DenyLabels { path: "hbone" }).inc();
    m.refresh(&ringway_proxy::Stats::default());
    let mut exported = encode(&m.registry(), false);
    let agent = ringway_cni::node::metrics::AgentMetrics::default();
    agent.observe("ADD", "ok", 0.01);
    exported.push_str(&encode(&agent.registry(), false));
    let names: std::collections::HashSet<&str> = exported
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            // Metric names: identifiers followed by `{`.
            for (i, _) in expr.match_indices('{') {
                let name: String = expr[..i]
                    .chars()
                    .rev()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                if name.is_empty() || name == "by" {
                    continue;
                }
                let family = name.strip_suffix("_bucket").unwrap_or(&name).to_string();
                assert!(
                    names.contains(family.as_str()) || names.contains(name.as_str()),
                    "panel {:?} queries {name}, which nothing exports",
                    panel["title"]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 15, "only {checked} metric references found");
}
