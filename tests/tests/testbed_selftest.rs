//! The test bed itself: isolation holds, pods reach each other directly.

use std::time::Duration;

use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{ns, run_isolated, VirtualNode};

#[test]
fn isolated_world_is_not_the_host_netns() {
    let host = ns::current_netns_inode();
    run_isolated("isolated_world_is_not_the_host_netns", || {
        assert_ne!(
            ns::current_netns_inode(),
            host,
            "test did not leave the host netns"
        );
        let links = std::process::Command::new("ip")
            .args(["-o", "link"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&links.stdout).to_string();
        assert_eq!(
            links.lines().count(),
            1,
            "fresh netns should only have lo: {links}"
        );
    });
}

#[test]
fn pods_talk_directly_over_v4_and_v6() {
    run_isolated("pods_talk_directly_over_v4_and_v6", || {
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        for v6 in [false, true] {
            let addr = std::net::SocketAddr::new(b.ip(v6), 8080);
            let l = b.netns.run(|| listen(addr)).unwrap();
            let srv = PayloadServer::start(l, 1);
            let got = a
                .netns
                .run(|| client_exchange(connect(addr, Duration::from_secs(5))?, 100_000, 50_000))
                .unwrap();
            assert_eq!(got, 50_000);
            let rep = srv.next_report(Duration::from_secs(5)).unwrap();
            assert_eq!(rep.received.unwrap(), 100_000);
            assert_eq!(rep.peer.ip(), a.ip(v6));
        }
    });
}
