//! `ringway proxy --pod UID=NETNS` looks the pod up in the configured
//! workloads by uid, so its metrics name the workload (and carry its
//! labels and the configured cluster ID), not the UID.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ringway_config::ProxySettings;
use ringway_testbed::{run_isolated, VirtualNode};

mod support;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n").unwrap().1.to_string()
}

fn scrape(addr: SocketAddr) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|x| x.1.to_string())
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn proxy_pod_flag_names_the_configured_workload() {
    run_isolated("proxy_pod_flag_names_the_configured_workload", || {
        let dir = std::env::temp_dir().join(format!("ringway-pod-flag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
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
        wait_for("the proxy serves both pods", || {
            scrape(metrics).is_some_and(|m| m.contains("ringway_pods_enrolled 2"))
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
        let mut last = String::new();
        wait_for("the connection's series names the workloads", || {
            last = scrape(metrics).unwrap_or_default();
            last.lines()
                .filter(|l| l.starts_with("istio_tcp_connections_opened_total{"))
                .any(|l| want.iter().all(|w| l.contains(w)))
        });
        assert!(!last.contains("uid-a"), "named by uid:\n{last}");
        // The pod's record names it too (identity: certificates, logs).
        let dump = http_get("127.0.0.1:15000".parse().unwrap(), "/config_dump");
        let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
        let pods = dump["pods"].as_array().unwrap();
        let a_rec = pods.iter().find(|p| p["uid"] == "uid-a").unwrap();
        assert_eq!(a_rec["name"], "web-0", "{dump}");
        assert_eq!(a_rec["namespace"], "shop", "{dump}");
        assert_eq!(a_rec["serviceAccount"], "web", "{dump}");
        drop(echo);
        let _ = std::fs::remove_dir_all(&dir);
    });
}
