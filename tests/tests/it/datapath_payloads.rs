//! Payload integrity through the proxy, pod-a -> pod-b.
//!
//! Every exchange streams the checksummed pattern of `traffic.rs` in both
//! directions at once (each side sends while it receives, then half-closes)
//! and verifies every byte. Sizes run from a single byte to 256 MiB and sit
//! on the boundaries the datapath cares about: one segment, 64 KiB, the
//! 1 MiB copy pipe (one byte under, exact, one byte over), and several
//! pipes' worth. An empty direction (0 bytes: immediate half-close) is
//! included as well.
//!
//! Each test runs both with the same-node fast path (captured at pod-a,
//! delivered straight into pod-b with pod-a's address spoofed) and without
//! it (captured at pod-a outbound and again at pod-b inbound, crossing the
//! bridge), and checks that the server saw pod-a's real address, that the
//! proxy accepted exactly the expected number of hops, that its byte
//! counters moved by exactly the bytes exchanged, and that no connection is
//! left active afterwards.

use crate::common;

use std::net::SocketAddr;

use common::{MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};

const MIB: u64 = 1 << 20;

/// (client -> server, server -> client) byte counts: both directions flow at
/// once, symmetric and asymmetric, on the boundaries listed above.
const SIZES: &[(u64, u64)] = &[
    (1, 1),
    (0, 1),
    (1, 0),
    (7, 1448),
    (65_535, 65_536),
    (65_537, 3),
    (MIB - 1, MIB),
    (MIB + 1, MIB - 1),
    (MIB, MIB + 1),
    (4 * MIB + 13, 2 * MIB + 7),
    (16 * MIB + 1, 16 * MIB - 1),
];

/// The big one: 256 MiB each way, at the same time.
const HUGE: &[(u64, u64)] = &[(256 * MIB, 256 * MIB)];

/// Runs every exchange of `sizes` from pod-a to pod-b (port 8080), one after
/// the other on fresh connections, and checks bytes, peer address and stats.
fn a_to_b(mode: CaptureMode, datapath: Datapath, v6: bool, fast_path: bool, sizes: &[(u64, u64)]) {
    let mut settings = common::settings(mode, datapath);
    settings.same_node_fast_path = fast_path;
    let mn = MeshNode::with_settings(2, settings);
    let (a, b) = (mn.pod(0).clone(), mn.pod(1).clone());
    let addr = SocketAddr::new(b.ip(v6), 8080);
    let l = b.netns.run(|| listen(addr)).unwrap();
    let srv = PayloadServer::start(l, sizes.len());
    let before = mn.proxy.stats();
    for &(up, down) in sizes {
        let what = format!("{mode} v6={v6} fast_path={fast_path} {up}/{down}");
        let got = a
            .netns
            .run(|| client_exchange(connect(addr, TIMEOUT)?, up, down))
            .unwrap_or_else(|e| panic!("{what}: client side failed: {e}"));
        assert_eq!(got, down, "{what}");
        let rep = srv
            .next_report(TIMEOUT)
            .unwrap_or_else(|| panic!("{what}: no server report"));
        assert_eq!(rep.received, Ok(up), "{what}: server side: {rep:?}");
        assert_eq!(
            rep.peer.ip(),
            a.ip(v6),
            "{what}: the server must see pod-a's real address"
        );
        assert_eq!(rep.local, addr, "{what}: the server's local address");
    }
    let after = mn.proxy.stats();
    let n = sizes.len() as u64;
    // Without the fast path both ends are captured (outbound at a, inbound at b).
    let hops = if fast_path { 1 } else { 2 };
    assert_eq!(after.accepted - before.accepted, hops * n, "{after:?}");
    assert_eq!(
        after.same_node - before.same_node,
        if fast_path { n } else { 0 },
        "{after:?}"
    );
    assert_eq!(after.connect_failed, before.connect_failed, "{after:?}");
    assert_eq!(after.refused, before.refused, "{after:?}");
    // Each hop carries the 16-byte header plus both payloads.
    let up: u64 = sizes.iter().map(|(u, _)| u + 16).sum();
    let down: u64 = sizes.iter().map(|(_, d)| d).sum();
    assert_eq!(
        after.bytes_to_upstream - before.bytes_to_upstream,
        hops * up,
        "{after:?}"
    );
    assert_eq!(
        after.bytes_to_client - before.bytes_to_client,
        hops * down,
        "{after:?}"
    );
    common::wait_no_active(&mn.proxy);
}

fn both_paths(mode: CaptureMode, datapath: Datapath, v6: bool, sizes: &[(u64, u64)]) {
    a_to_b(mode, datapath, v6, false, sizes);
    a_to_b(mode, datapath, v6, true, sizes);
}

#[test]
fn tproxy_v4_sizes() {
    run_isolated("tproxy_v4_sizes", || {
        both_paths(CaptureMode::Tproxy, Datapath::Uring, false, SIZES)
    });
}

#[test]
fn tproxy_v6_sizes() {
    run_isolated("tproxy_v6_sizes", || {
        both_paths(CaptureMode::Tproxy, Datapath::Uring, true, SIZES)
    });
}

#[test]
fn redirect_v4_sizes() {
    run_isolated("redirect_v4_sizes", || {
        both_paths(CaptureMode::Redirect, Datapath::Uring, false, SIZES)
    });
}

#[test]
fn redirect_v6_sizes() {
    run_isolated("redirect_v6_sizes", || {
        both_paths(CaptureMode::Redirect, Datapath::Uring, true, SIZES)
    });
}

/// 256 MiB each way through both captures (no fast path): the longest
/// splice loop, pipes refilled thousands of times in both directions.
#[test]
fn tproxy_v4_256mib_two_hops() {
    run_isolated("tproxy_v4_256mib_two_hops", || {
        a_to_b(CaptureMode::Tproxy, Datapath::Uring, false, false, HUGE)
    });
}

/// 256 MiB each way over the fast path, IPv6, NATed capture.
#[test]
fn redirect_v6_256mib_fast_path() {
    run_isolated("redirect_v6_256mib_fast_path", || {
        a_to_b(CaptureMode::Redirect, Datapath::Uring, true, true, HUGE)
    });
}

/// The epoll fallback datapath moves the same bytes.
#[test]
fn tproxy_v6_sizes_epoll() {
    run_isolated("tproxy_v6_sizes_epoll", || {
        both_paths(CaptureMode::Tproxy, Datapath::Epoll, true, SIZES)
    });
}
