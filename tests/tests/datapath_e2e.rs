//! pod-a -> pod-b through the proxy: captured at both ends, bytes intact.

mod common;

use std::net::SocketAddr;

use common::{MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};

fn a_to_b(mode: CaptureMode, datapath: Datapath, v6: bool, sizes: &[(u64, u64)]) {
    let mn = MeshNode::new(2, mode, datapath);
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
    // Both hops (outbound at a, inbound at b) went through the proxy.
    assert_eq!(
        after.accepted - before.accepted,
        2 * sizes.len() as u64,
        "{after:?}"
    );
    let moved: u64 =
        sizes.iter().map(|(u, d)| 2 * (u + d + 0)).sum::<u64>() + 2 * 16 * sizes.len() as u64;
    assert_eq!(
        (after.bytes_to_upstream + after.bytes_to_client)
            - (before.bytes_to_upstream + before.bytes_to_client),
        moved
    );
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
