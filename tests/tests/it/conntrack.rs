//! What capture costs a pod's conntrack table. A pod without capture rules
//! tracks nothing; the capture's `ct` rules make its namespace track every
//! TCP connection, and a closed connection's entry then waits in
//! `TIME_WAIT` for the namespace's `nf_conntrack_tcp_timeout_time_wait`
//! (120 s by default). The table's size is node-wide (`nf_conntrack_max`,
//! not settable in a pod), so at the default a pod that opens or accepts
//! about 2,000 connections a second through the proxy fills it in two
//! minutes and its new connections' SYNs are dropped (benches/HISTORY.md,
//! "The 1-3 s stall of the upgrade pass"). The capture caps that wait at
//! 30 s in the pod's namespace.
//!
//! And which connections carry the capture's connmark: only those whose
//! replies must be steered back to the proxy (each marked connection's
//! later packets are policy re-routed).

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{run_isolated, Pod};

/// The longest a closed connection's entry may wait in a captured pod.
const TIME_WAIT_CAP_S: u64 = 30;

/// One entry of `/proc/net/nf_conntrack` that concerns `port`.
#[derive(Debug)]
struct Entry {
    state: String,
    timeout_s: u64,
    line: String,
}

/// The TCP entries of `pod`'s conntrack table with `port` as either
/// side's port.
fn entries(pod: &Pod, port: u16) -> Vec<Entry> {
    let text = pod
        .netns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/nf_conntrack"))
        .expect("reading the pod's conntrack table");
    let want = [format!("dport={port}"), format!("sport={port}")];
    text.lines()
        .filter(|l| l.split_whitespace().any(|f| want.iter().any(|w| f == w)))
        .filter_map(|l| {
            // `ipv4 2 tcp 6 <timeout> <state> src=...`
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"tcp")).then(|| Entry {
                timeout_s: f[4].parse().expect("a conntrack timeout"),
                state: f[5].to_string(),
                line: l.to_string(),
            })
        })
        .collect()
}

/// `n` exchanges from pod 0 to pod 1 on `port`, each closed by both sides.
fn exchanges(mn: &MeshNode, v6: bool, port: u16, n: usize) {
    let (a, b) = (mn.pod(0), mn.pod(1));
    let addr = SocketAddr::new(b.ip(v6), port);
    let l = b.netns.run(|| listen(addr)).unwrap();
    let srv = PayloadServer::start(l, n);
    for i in 0..n {
        let got = a
            .netns
            .run(|| client_exchange(connect(addr, TIMEOUT)?, 1_000, 1_000))
            .unwrap_or_else(|e| panic!("exchange {i} to {addr}: {e}"));
        assert_eq!(got, 1_000, "exchange {i} to {addr}");
        let rep = srv.next_report(TIMEOUT).expect("server report");
        assert_eq!(rep.received, Ok(1_000), "exchange {i}: {rep:?}");
    }
}

/// Closed connections through the proxy (both hops, or the same-node fast
/// path) leave entries in both pods' tables, each gone within
/// [`TIME_WAIT_CAP_S`] of its close, not the kernel's 120 s.
fn closed_connections_leave_within_the_cap(mode: CaptureMode, fast_path: bool) {
    let mut settings = common::settings(mode, Datapath::Uring);
    settings.same_node_fast_path = fast_path;
    let mn = MeshNode::with_settings(2, settings);
    for (v6, port) in [(false, 7301), (true, 7302)] {
        exchanges(&mn, v6, port, 5);
        common::wait_no_active(&mn.proxy);
        // Closed on both sides: every entry of these connections is past
        // its FIN handshake (TIME_WAIT, or CLOSE after a reset).
        let closing = |e: &Entry| e.state == "TIME_WAIT" || e.state == "CLOSE";
        assert!(
            ringway_testbed::wait_until(Duration::from_secs(5), || {
                [mn.pod(0), mn.pod(1)]
                    .iter()
                    .all(|p| entries(p, port).iter().all(closing))
            }),
            "connections still open in conntrack: {:?} / {:?}",
            entries(mn.pod(0), port),
            entries(mn.pod(1), port)
        );
        for pod in [mn.pod(0), mn.pod(1)] {
            let e = entries(pod, port);
            // The capture tracks in both pods (the test sees what it claims).
            assert!(
                !e.is_empty(),
                "{}: no conntrack entry for port {port} (v6 {v6})",
                pod.name
            );
            for x in &e {
                assert!(
                    x.timeout_s <= TIME_WAIT_CAP_S,
                    "{}: a closed connection's entry waits {} s (cap {TIME_WAIT_CAP_S} s): {}",
                    pod.name,
                    x.timeout_s,
                    x.line
                );
            }
        }
    }
}

#[test]
fn closed_connections_leave_the_pods_conntrack_tables_within_30_s_both_hops() {
    run_isolated("conntrack_closed_within_30_s_both_hops", || {
        closed_connections_leave_within_the_cap(CaptureMode::Tproxy, false);
    });
}

#[test]
fn closed_connections_leave_the_pods_conntrack_tables_within_30_s_fast_path() {
    run_isolated("conntrack_closed_within_30_s_fast_path", || {
        closed_connections_leave_within_the_cap(CaptureMode::Tproxy, true);
    });
}

#[test]
fn closed_connections_leave_the_pods_conntrack_tables_within_30_s_redirect() {
    run_isolated("conntrack_closed_within_30_s_redirect", || {
        closed_connections_leave_within_the_cap(CaptureMode::Redirect, false);
    });
}

/// An entry's connection mark (`mark=N`; 0 when the kernel prints none).
fn ct_mark(e: &Entry) -> u32 {
    e.line
        .split_whitespace()
        .find_map(|f| f.strip_prefix("mark="))
        .map(|m| m.parse().expect("a conntrack mark"))
        .unwrap_or(0)
}

/// The capture's connmark (`0x111`) is for connections whose replies must
/// be steered back to the proxy: the proxy's spoofed-source connections to
/// an app. On an app's IPv4 outbound connection, redirected to the proxy's
/// local 15001, it steers nothing (the destination is already local) and
/// costs a policy re-route of every later packet the app sends. The
/// proxy's replies on that connection loop through `lo` marked `0x539`,
/// like its spoofed packets, so only the connection's direction tells them
/// apart.
fn outbound_connections_carry_no_capture_connmark(fast_path: bool) {
    let mut settings = common::settings(CaptureMode::Tproxy, Datapath::Uring);
    settings.same_node_fast_path = fast_path;
    let mn = MeshNode::with_settings(2, settings);
    let port = 7303;
    exchanges(&mn, false, port, 5);
    common::wait_no_active(&mn.proxy);
    let capture_mark = ringway_redirect::CaptureSpec::default().capture_mark;
    // Pod 0's app connected out: its entries are redirected to 15001.
    let outbound: Vec<_> = entries(mn.pod(0), port)
        .into_iter()
        .filter(|e| e.line.contains("sport=15001"))
        .collect();
    assert!(
        !outbound.is_empty(),
        "no redirected outbound entry in {}: {:?}",
        mn.pod(0).name,
        entries(mn.pod(0), port)
    );
    for e in &outbound {
        assert_eq!(
            ct_mark(e),
            0,
            "the app's outbound connection carries a connmark: {}",
            e.line
        );
    }
    // Pod 1's app was connected to by the proxy with the client's address:
    // those connections need the mark (the test sees marks where they are).
    let inbound = entries(mn.pod(1), port);
    assert!(
        inbound.iter().any(|e| ct_mark(e) == capture_mark),
        "no spoofed-source connection with the capture connmark {capture_mark:#x} in {}: {inbound:?}",
        mn.pod(1).name
    );
}

#[test]
fn the_apps_outbound_connections_carry_no_capture_connmark_both_hops() {
    run_isolated("conntrack_outbound_no_connmark_both_hops", || {
        outbound_connections_carry_no_capture_connmark(false);
    });
}

#[test]
fn the_apps_outbound_connections_carry_no_capture_connmark_fast_path() {
    run_isolated("conntrack_outbound_no_connmark_fast_path", || {
        outbound_connections_carry_no_capture_connmark(true);
    });
}
