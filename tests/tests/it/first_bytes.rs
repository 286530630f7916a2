//! The handshake of each connection the proxy opens toward an app (and on
//! both hops, toward the destination pod): when the client has already
//! sent bytes, the proxy's last ACK of the handshake goes with them, so
//! the app's `accept` finds the connection with its first bytes (one
//! segment and one wake-up of the app fewer per connection). When the
//! client has sent nothing, an app that speaks first gets its connection
//! with the bare ACK at once. IPv4, seen from the destination pod.

use crate::common;

use std::net::SocketAddr;

use common::sniff::{connections_to, first_bytes_rounds, first_segment_after_syn_carries_bytes};
use common::MeshNode;
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::run_isolated;

/// Connections of each kind (client first, then app first).
const ROUNDS: usize = 4;

fn first_bytes_ride_on_the_last_ack(mode: CaptureMode, datapath: Datapath, fast_path: bool) {
    let mut settings = common::settings(mode, datapath);
    settings.same_node_fast_path = fast_path;
    let mn = MeshNode::with_settings(2, settings);
    let (a, b) = (mn.pod(0), mn.pod(1));
    let port = 7411;
    let addr = SocketAddr::new(b.ip(false), port);
    let frames = first_bytes_rounds(&a.netns, &b.netns, addr, ROUNDS);
    // Every connection to the app's address seen in its pod: the proxy's
    // connect to the app, and on both hops the source side's connect too.
    let carried =
        first_segment_after_syn_carries_bytes(&connections_to(&frames, (addr.ip(), port)));
    let hops = if fast_path { 1 } else { 2 };
    assert_eq!(
        carried.len(),
        2 * ROUNDS * hops,
        "{hops} connection(s) per round to {addr}: {carried:?}"
    );
    let (client_first, app_first) = carried.split_at(ROUNDS * hops);
    assert!(
        client_first.iter().all(|c| *c),
        "the client's first bytes ride on the handshake's last ACK: {carried:?}"
    );
    assert!(
        app_first.iter().all(|c| !c),
        "an app that speaks first gets the bare ACK at once: {carried:?}"
    );
}

#[test]
fn first_bytes_ride_on_the_last_ack_both_hops() {
    run_isolated("first_bytes_both_hops", || {
        first_bytes_ride_on_the_last_ack(CaptureMode::Tproxy, Datapath::Uring, false);
    });
}

#[test]
fn first_bytes_ride_on_the_last_ack_fast_path() {
    run_isolated("first_bytes_fast_path", || {
        first_bytes_ride_on_the_last_ack(CaptureMode::Tproxy, Datapath::Uring, true);
    });
}

#[test]
fn first_bytes_ride_on_the_last_ack_epoll() {
    run_isolated("first_bytes_epoll", || {
        first_bytes_ride_on_the_last_ack(CaptureMode::Tproxy, Datapath::Epoll, false);
    });
}

#[test]
fn first_bytes_ride_on_the_last_ack_redirect() {
    run_isolated("first_bytes_redirect", || {
        first_bytes_ride_on_the_last_ack(CaptureMode::Redirect, Datapath::Uring, false);
    });
}
