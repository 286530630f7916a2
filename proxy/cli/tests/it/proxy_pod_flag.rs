//! `ringway proxy --pod UID=NETNS` looks the pod up in the configured
//! workloads by uid, so its metrics name the workload (and carry its
//! labels and the configured cluster ID), not the UID.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use ringway_config::ProxySettings;
use ringway_testbed::http::{get, scrape};
use ringway_testbed::{prom, run_isolated, wait_for, TempDir, VirtualNode};

use crate::support::Proc;

/// How long the proxy may take to serve, and to count a connection.
const WAIT: Duration = Duration::from_secs(30);

#[test]
fn proxy_pod_flag_names_the_configured_workload() {
    run_isolated("proxy_pod_flag_names_the_configured_workload", || {
        let dir = TempDir::new("pod-flag");
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let spec = ringway_proxy::capture_spec(&ProxySettings::default());
        for p in [&a, &b] {
            ringway_redirect::apply(p.netns.fd(), &spec).unwrap();
        }
        let config = dir.join("proxy.yaml");
        std::fs::write(
            &config,
            format!(
                "clusterId: test-cluster\nworkloads:\n  \
                 - {{ uid: uid-a, name: web-0, namespace: shop, serviceAccount: web, ips: [{}], node: node1, labels: {{ app: web, version: v3 }} }}\n  \
                 - {{ uid: uid-b, name: db-0, namespace: data, ips: [{}], node: node1 }}\n",
                a.ipv4, b.ipv4
            ),
        )
        .unwrap();
        let metrics: SocketAddr = "127.0.0.1:15020".parse().unwrap();
        let _proxy = Proc(
            Command::new(env!("CARGO_BIN_EXE_ringway"))
                .args(["--log", "warn", "proxy", "--config"])
                .arg(&config)
                .args(["--metrics-addr", &metrics.to_string()])
                .args(["--admin-addr", "127.0.0.1:15000"])
                .args(["--readiness-addr", "127.0.0.1:15021"])
                .arg("--pod")
                .arg(format!("uid-a={}", a.netns.path().display()))
                .arg("--pod")
                .arg(format!("uid-b={}", b.netns.path().display()))
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn ringway proxy"),
        );
        wait_for("the proxy serves both pods", WAIT, || {
            scrape(metrics)
                .is_ok_and(|m| prom::value(&m, "ringway_pods_enrolled", &[]) == Some(2.0))
        });
        let addr = SocketAddr::new(b.ip(false), 8080);
        let l = b
            .netns
            .run(|| ringway_testbed::traffic::listen(addr))
            .unwrap();
        let echo = ringway_testbed::traffic::EchoServer::start(l);
        a.netns.run(|| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"ping").unwrap();
            let mut back = [0u8; 4];
            s.read_exact(&mut back).unwrap();
        });
        let want = [
            "reporter=\"source\"",
            "source_workload=\"web-0\"",
            "source_canonical_service=\"web\"",
            "source_canonical_revision=\"v3\"",
            "source_workload_namespace=\"shop\"",
            // Plaintext: no source principal (as the reference); the
            // destination's is its workload's identity.
            "source_principal=\"unknown\"",
            "destination_principal=\"spiffe://cluster.local/ns/data/sa/default\"",
            "source_cluster=\"test-cluster\"",
            "destination_workload=\"db-0\"",
            "destination_canonical_service=\"db-0\"",
            "destination_canonical_revision=\"latest\"",
            "destination_workload_namespace=\"data\"",
            "destination_service_namespace=\"unknown\"",
        ];
        wait_for("the connection's series names the workloads", WAIT, || {
            let page = scrape(metrics).unwrap();
            prom::value(&page, "istio_tcp_connections_opened_total", &want).is_some()
        });
        // A page that the endpoint really served (an error fails the test).
        let last = scrape(metrics).unwrap();
        assert!(!last.contains("uid-a"), "named by uid:\n{last}");
        // The pod's record names it too (identity: certificates, logs).
        let dump = get("127.0.0.1:15000".parse().unwrap(), "/config_dump").unwrap();
        assert_eq!(dump.status, 200, "{}", dump.body);
        let dump: serde_json::Value = serde_json::from_str(&dump.body).unwrap();
        let pods = dump["pods"].as_array().unwrap();
        let a_rec = pods.iter().find(|p| p["uid"] == "uid-a").unwrap();
        assert_eq!(a_rec["name"], "web-0", "{dump}");
        assert_eq!(a_rec["namespace"], "shop", "{dump}");
        assert_eq!(a_rec["serviceAccount"], "web", "{dump}");
        drop(echo);
    });
}
