//! pod-a -> pod-b through the proxy: captured at both ends, bytes intact.

mod common;

use std::net::SocketAddr;

use common::{MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};

fn a_to_b(mode: CaptureMode, datapath: Datapath, v6: bool, sizes: &[(u64, u64)]) {
    // Both hops through the node network (captured at a and again at b)...
    a_to_b_with(mode, datapath, v6, sizes, false);
    // ...and the same-node fast path (captured at a, delivered into b).
    a_to_b_with(mode, datapath, v6, sizes, true);
}

fn a_to_b_with(
    mode: CaptureMode,
    datapath: Datapath,
    v6: bool,
    sizes: &[(u64, u64)],
    fast_path: bool,
) {
    let mut settings = common::settings(mode, datapath);
    settings.same_node_fast_path = fast_path;
    let mn = MeshNode::with_settings(2, settings);
    let (a, b) = (mn.pod(0).clone(), mn.pod(1).clone());
    let addr = SocketAddr::new(b.ip(v6), 8080);
    let l = b.netns.run(|| listen(addr)).unwrap();
    let srv = PayloadServer::start(l, sizes.len());
    let before = mn.proxy.stats();
    for &(up, down) in sizes {
        let got = a
            .netns
            .run(|| client_exchange(connect(addr, TIMEOUT)?, up, down))
            .unwrap_or_else(|e| panic!("exchange {up}/{down} failed: {e}"));
        assert_eq!(got, down);
        let rep = srv.next_report(TIMEOUT).expect("server report");
        assert_eq!(rep.received.clone().unwrap(), up, "{rep:?}");
        assert_eq!(rep.peer.ip(), a.ip(v6), "server must see pod-a's real IP");
    }
    let after = mn.proxy.stats();
    let n = sizes.len() as u64;
    let hops = if fast_path { 1 } else { 2 };
    // Without the fast path both ends are captured (outbound at a, inbound at b).
    assert_eq!(after.accepted - before.accepted, hops * n, "{after:?}");
    let fast = if fast_path { n } else { 0 };
    assert_eq!(after.same_node - before.same_node, fast);
    let moved: u64 = hops * (sizes.iter().map(|(u, d)| u + d).sum::<u64>() + 16 * n);
    let total = |s: &ringway_proxy::StatsSnapshot| s.bytes_to_upstream + s.bytes_to_client;
    assert_eq!(total(&after) - total(&before), moved);
}

const SMALL: &[(u64, u64)] = &[(1, 1), (1000, 70_000), (3 << 20, 1 << 20)];

#[test]
fn tproxy_v4_uring() {
    run_isolated("tproxy_v4_uring", || {
        a_to_b(CaptureMode::Tproxy, Datapath::Uring, false, SMALL)
    });
}
#[test]
fn tproxy_v6_uring() {
    run_isolated("tproxy_v6_uring", || {
        a_to_b(CaptureMode::Tproxy, Datapath::Uring, true, SMALL)
    });
}
#[test]
fn redirect_v4_uring() {
    run_isolated("redirect_v4_uring", || {
        a_to_b(CaptureMode::Redirect, Datapath::Uring, false, SMALL)
    });
}
#[test]
fn redirect_v6_uring() {
    run_isolated("redirect_v6_uring", || {
        a_to_b(CaptureMode::Redirect, Datapath::Uring, true, SMALL)
    });
}
#[test]
fn tproxy_v4_epoll() {
    run_isolated("tproxy_v4_epoll", || {
        a_to_b(CaptureMode::Tproxy, Datapath::Epoll, false, SMALL)
    });
}
