//! The plaintext path gives up an upstream connect after `connectTimeout`
//! (issue 10, item 9): a blackholed destination resets the client instead
//! of holding it for the kernel's ~2 minutes of SYN retries, and a service
//! VIP fails over to its next endpoint.

use crate::common;
use ringway_testbed::prom;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use common::{settings, MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath, MeshConfig, NoEnv, ProxySettings};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::listen;

const PORT: u16 = 9000;
const VIP: &str = "10.96.0.10";

/// Pod 0 is the client; the node's bridge address (10.244.1.1) is an
/// endpoint whose port 9000 drops every SYN; pod 1 is a live endpoint.
fn mesh() -> Arc<ringway_config::Mesh> {
    let yaml = format!(
        "workloads:\n  - {{uid: dead, name: dead-0, namespace: shop, serviceAccount: web, ips: [10.244.1.1], node: n}}\n  - {{uid: live, name: live-0, namespace: shop, serviceAccount: web, ips: [10.244.1.3], node: n}}\nservices:\n  - hostname: web.shop.svc.cluster.local\n    namespace: shop\n    vips: [{VIP}]\n    ports: {{80: {PORT}}}\n    endpoints: [dead, live]\n"
    );
    Arc::new(MeshConfig::load_str(&yaml, "connect_timeout", &NoEnv).unwrap())
}

fn exchange(node: &MeshNode, dst: SocketAddr) -> std::io::Result<Vec<u8>> {
    node.pod(0).netns.run(|| {
        let mut s = std::net::TcpStream::connect_timeout(&dst, TIMEOUT)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.write_all(b"hello\n")?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    })
}

fn failures(node: &MeshNode, reason: &str) -> f64 {
    let text = ringway_proxy::metrics::encode(&node.proxy.metrics().registry(), false);
    prom::value(
        &text,
        "ringway_upstream_connect_failures_total",
        &[&format!("reason=\"{reason}\"")],
    )
    .unwrap_or(0.0)
}

fn blackholed_destination_times_out(datapath: Datapath) {
    let node = MeshNode::with_settings(
        2,
        ProxySettings {
            connect_timeout: Duration::from_secs(1),
            ..settings(CaptureMode::Tproxy, datapath)
        },
    );
    node.proxy.set_mesh(mesh());
    // A blackhole in the node's netns: SYNs to port 9000 vanish.
    for cmd in [
        "add table inet blackhole",
        "add chain inet blackhole input { type filter hook input priority 0 ; }",
        &format!("add rule inet blackhole input tcp dport {PORT} drop"),
    ] {
        node.vn.node.exec("nft", &[cmd]).unwrap();
    }
    // The live endpoint answers a line with "ok".
    let l: TcpListener = node
        .pod(1)
        .netns
        .run(|| listen(SocketAddr::new(node.pod(1).ip(false), PORT)))
        .unwrap();
    std::thread::spawn(move || {
        for _ in 0..4 {
            let Ok((mut s, _)) = l.accept() else { break };
            let mut line = [0u8; 6];
            let _ = s.set_read_timeout(Some(TIMEOUT));
            let _ = s.read_exact(&mut line);
            let _ = s.write_all(b"ok");
        }
    });
    // Straight to the blackholed address: the client is reset once the
    // connect times out (the event; TIMEOUT only bounds the wait).
    let r = exchange(&node, "10.244.1.1:9000".parse().unwrap());
    let e = r.expect_err("a connection to a blackholed destination was served");
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset,
        "the client was not reset by the connect timeout: {e}"
    );
    assert_eq!(failures(&node, "timeout"), 1.0);
    // Through the service VIP: the first candidate (dead) times out,
    // the next one (live) serves the connection.
    let ok = exchange(&node, format!("{VIP}:80").parse().unwrap());
    assert_eq!(ok.as_deref().ok(), Some(&b"ok"[..]), "{ok:?}");
    assert_eq!(failures(&node, "timeout"), 2.0);
}

#[test]
fn adversarial_blackholed_destination_times_out() {
    run_isolated("adversarial_blackholed_destination_times_out", || {
        blackholed_destination_times_out(Datapath::Uring)
    });
}

#[test]
fn adversarial_blackholed_destination_times_out_epoll() {
    run_isolated("adversarial_blackholed_destination_times_out_epoll", || {
        blackholed_destination_times_out(Datapath::Epoll)
    });
}
