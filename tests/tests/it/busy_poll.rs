//! The busy-poll window (`proxy.busyPollMicros`): with it on, the proxy
//! moves the same bytes (64 B ping-pongs and the payload exchanges, both
//! hops and the fast path, both event loops), its workers do spin after
//! activity, and an idle proxy stops spinning (the window only follows
//! activity). With it off (the default), no worker ever spins.

use crate::common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::{MeshNode, TIMEOUT};
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::run_isolated;
use ringway_testbed::traffic::{client_exchange, connect, listen, EchoServer, PayloadServer};

/// 64 B request/reply round trips on one connection, each reply checked.
fn ping_pong(addr: SocketAddr, a: &ringway_testbed::Pod, rounds: usize) {
    a.netns
        .run(|| {
            let mut c = connect(addr, TIMEOUT)?;
            c.set_nodelay(true)?;
            c.set_read_timeout(Some(TIMEOUT))?;
            let mut back = [0u8; 64];
            for i in 0..rounds {
                let msg = [(i % 251) as u8; 64];
                c.write_all(&msg)?;
                c.read_exact(&mut back)?;
                assert_eq!(back, msg, "round {i}: the echo differs");
            }
            Ok::<_, std::io::Error>(())
        })
        .unwrap_or_else(|e| panic!("ping-pong through {addr}: {e}"));
}

fn exercise(datapath: Datapath, fast_path: bool, window_micros: u32) {
    let mut settings = common::settings(CaptureMode::Tproxy, datapath);
    settings.same_node_fast_path = fast_path;
    settings.busy_poll_micros = window_micros;
    let mn = MeshNode::with_settings(2, settings);
    let (a, b) = (mn.pod(0).clone(), mn.pod(1).clone());
    let stats = mn.proxy.stats_handle();
    let what = format!("{datapath:?} fast_path={fast_path} busyPollMicros={window_micros}");

    // Ping-pong: the latency case the window is for.
    let echo_addr = SocketAddr::new(b.ip(false), 7070);
    let _echo = EchoServer::start(b.netns.run(|| listen(echo_addr)).unwrap());
    ping_pong(echo_addr, &a, 200);

    // Bulk both ways, verified byte for byte.
    let addr = SocketAddr::new(b.ip(false), 8080);
    let sizes: &[(u64, u64)] = &[(1, 1), (0, 1), (65_537, 3), (4 << 20, (2 << 20) + 7)];
    let srv = PayloadServer::start(b.netns.run(|| listen(addr)).unwrap(), sizes.len());
    for &(up, down) in sizes {
        let got = a
            .netns
            .run(|| client_exchange(connect(addr, TIMEOUT)?, up, down))
            .unwrap_or_else(|e| panic!("{what} {up}/{down}: client side failed: {e}"));
        assert_eq!(got, down, "{what} {up}/{down}");
        let rep = srv
            .next_report(TIMEOUT)
            .unwrap_or_else(|| panic!("{what} {up}/{down}: no server report"));
        assert_eq!(rep.received, Ok(up), "{what} {up}/{down}: {rep:?}");
        assert_eq!(
            rep.peer.ip(),
            a.ip(false),
            "{what}: the client's real address"
        );
    }

    if window_micros == 0 {
        assert_eq!(
            stats.busy_poll_yields.get(),
            0,
            "{what}: spun with the window off"
        );
        assert_eq!(stats.busy_polling.get(), 0, "{what}");
    } else {
        assert!(
            stats.busy_poll_yields.get() > 0,
            "{what}: no worker spun after 200 round trips"
        );
    }

    // Idle: once the proxy has seen every connection end, every worker
    // leaves its window, then stays asleep. (A connection's last FIN is a
    // readiness and rightly opens a window; checked before the proxy had
    // seen them all, a CI run once saw a worker spin again after its
    // window had closed.)
    common::wait_no_active(&mn.proxy);
    assert!(
        common::wait_until(Duration::from_secs(5), || stats.busy_polling.get() == 0),
        "{what}: {} workers still spinning 5 s after the traffic stopped",
        stats.busy_polling.get()
    );
    let yields = stats.busy_poll_yields.get();
    // An observation window for the absence of spinning (not a
    // synchronisation): 100x the largest window.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        stats.busy_poll_yields.get(),
        yields,
        "{what}: an idle proxy kept spinning"
    );
    drop(_echo);
    common::wait_no_active(&mn.proxy);
}

#[test]
fn busy_poll_window_moves_the_same_bytes_and_idles_io_uring() {
    run_isolated(
        "busy_poll_window_moves_the_same_bytes_and_idles_io_uring",
        || {
            exercise(Datapath::Uring, false, 1000);
            exercise(Datapath::Uring, true, 1000);
        },
    );
}

#[test]
fn busy_poll_window_moves_the_same_bytes_and_idles_epoll() {
    run_isolated(
        "busy_poll_window_moves_the_same_bytes_and_idles_epoll",
        || {
            exercise(Datapath::Epoll, false, 1000);
            exercise(Datapath::Epoll, true, 1000);
        },
    );
}

#[test]
fn busy_poll_off_never_spins() {
    run_isolated("busy_poll_off_never_spins", || {
        exercise(Datapath::Uring, false, 0);
    });
}
