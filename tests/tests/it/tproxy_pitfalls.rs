//! The two field failures that made Istio drop TPROXY, as tests (see
//! `capture-rules.md`): `src_valid_mark=1` breaking delivery, and apps
//! getting `EADDRINUSE` while proxied connections are open. Both capture
//! modes run too, with and without the same-node fast path.
//!
//! The tests of this module run alone in the test process
//! (`ringway_testbed::exclusive::alone`), one at a time and beside no other
//! test: a process spawned by another test thread (`ip`, `nft`) holds
//! copies of every fd between its fork and its exec, so a socket the app
//! closed can briefly still hold its port, and the bind checks here must
//! see only the sockets they mean to.

use crate::common;

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use common::{MeshNode, TIMEOUT};
use nix::errno::Errno;
use ringway_config::{CaptureMode, Datapath};
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{run_isolated, Pod, VirtualNode};

/// Keeps every other test of the process out (see the module doc).
fn serial() -> ringway_testbed::exclusive::Alone {
    ringway_testbed::exclusive::alone()
}

fn settings(mode: CaptureMode, fast_path: bool) -> ringway_config::ProxySettings {
    let mut s = common::settings(mode, Datapath::Uring);
    s.same_node_fast_path = fast_path;
    s
}

// ---------------------------------------------------------------------------
// (a) src_valid_mark=1

const SRC_VALID_MARK: [&str; 3] = [
    "net.ipv4.conf.all.src_valid_mark",
    "net.ipv4.conf.default.src_valid_mark",
    "net.ipv4.conf.eth0.src_valid_mark",
];

fn set_src_valid_mark(p: &Pod) {
    for key in SRC_VALID_MARK {
        p.netns.sysctl(key, "1").unwrap();
    }
}

/// `from` -> `to` on `port`, both directions at once; the server must see
/// `from`'s real address.
fn exchange(mn: &MeshNode, from: usize, to: usize, v6: bool, port: u16) {
    let (a, b) = (mn.pod(from).clone(), mn.pod(to).clone());
    let addr = SocketAddr::new(b.ip(v6), port);
    let l = b.netns.run(|| listen(addr)).unwrap();
    let srv = PayloadServer::start(l, 1);
    let what = format!("{} -> {addr}", a.name);
    let got = a
        .netns
        .run(|| client_exchange(connect(addr, TIMEOUT)?, 300_000, 200_000))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got, 200_000, "{what}");
    let rep = srv.next_report(TIMEOUT).expect("server report");
    assert_eq!(rep.received, Ok(300_000), "{what}: {rep:?}");
    assert_eq!(
        rep.peer.ip(),
        a.ip(v6),
        "{what}: the app must see the real client"
    );
}

/// Traffic works both ways between two pods whose `all`, `default` and
/// `eth0` `src_valid_mark` are 1 (a cloud CNI's node-wide setting), set
/// before the capture rules and the proxy exist or after, and the app sees
/// the real client address. The rules must not rely on the sysctl being 0
/// (Istio's TPROXY rules marked inbound packets, so with the sysctl the
/// reverse-path check routed their source through the `local` table and
/// dropped them as martians); they must not change it either.
fn src_valid_mark(mode: CaptureMode, fast_path: bool, before: bool) {
    let mn = if before {
        common::mesh_node_prepared(2, settings(mode, fast_path), set_src_valid_mark)
    } else {
        let mn = MeshNode::with_settings(2, settings(mode, fast_path));
        for p in &mn.vn.pods {
            set_src_valid_mark(p);
        }
        mn
    };
    let before_stats = mn.proxy.stats();
    for v6 in [false, true] {
        exchange(&mn, 0, 1, v6, 8080);
        exchange(&mn, 1, 0, v6, 8081);
    }
    let after = mn.proxy.stats();
    let hops = if fast_path { 1 } else { 2 };
    assert_eq!(
        after.accepted - before_stats.accepted,
        4 * hops,
        "{after:?}"
    );
    for p in &mn.vn.pods {
        for key in SRC_VALID_MARK {
            assert_eq!(p.netns.read_sysctl(key).unwrap(), "1", "{}: {key}", p.name);
        }
    }
    common::wait_no_active(&mn.proxy);
}

#[test]
fn src_valid_mark_tproxy() {
    let _serial = serial();
    run_isolated("src_valid_mark_tproxy", || {
        for fast_path in [false, true] {
            for before in [true, false] {
                src_valid_mark(CaptureMode::Tproxy, fast_path, before);
            }
        }
    });
}

#[test]
fn src_valid_mark_redirect() {
    let _serial = serial();
    run_isolated("src_valid_mark_redirect", || {
        for fast_path in [false, true] {
            for before in [true, false] {
                src_valid_mark(CaptureMode::Redirect, fast_path, before);
            }
        }
    });
}

// ---------------------------------------------------------------------------
// (b) EADDRINUSE while proxied connections are open

/// The app's service port (pod-b) and the peer's port it dials (pod-a).
const SERVICE: u16 = 8080;
const PEER_PORT: u16 = 9090;
/// Connections kept open in each direction while the app binds.
const OPEN: usize = 4;

/// Ports the app binds while the connections are open: the peer's port,
/// the service port's neighbours, and a spread of others (well-known,
/// around the proxy's own ports, both ends of the range, just outside the
/// default ephemeral range).
const ARBITRARY: &[u16] = &[
    PEER_PORT,
    SERVICE - 1,
    SERVICE + 1,
    1,
    80,
    443,
    1024,
    5000,
    9000,
    15000,
    15002,
    15005,
    15007,
    15009,
    20000,
    32767,
    61000,
    65535,
];

fn parse_proc_addr(s: &str) -> SocketAddr {
    let (ip, port) = s.split_once(':').expect("addr:port");
    let port = u16::from_str_radix(port, 16).expect("hex port");
    let ip: IpAddr = if ip.len() == 8 {
        Ipv4Addr::from(u32::from_str_radix(ip, 16).expect("hex").swap_bytes()).into()
    } else {
        let mut b = [0u8; 16];
        for w in 0..4 {
            let v = u32::from_str_radix(&ip[w * 8..w * 8 + 8], 16).expect("hex");
            b[w * 4..w * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        Ipv6Addr::from(b).into()
    };
    SocketAddr::new(ip, port)
}

/// Local addresses of the pod's TCP sockets, (listening, others).
fn tcp_sockets(p: &Pod) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    p.netns.run(|| {
        let (mut listening, mut other) = (Vec::new(), Vec::new());
        for f in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
            let text = std::fs::read_to_string(f).unwrap();
            for line in text.lines().skip(1) {
                let x: Vec<&str> = line.split_whitespace().collect();
                let local = parse_proc_addr(x[1]);
                if x[3] == "0A" {
                    listening.push(local);
                } else {
                    other.push(local);
                }
            }
        }
        (listening, other)
    })
}

/// Binds and listens on `addr` inside `p` (IPv6 wildcard: dual-stack, the
/// Linux default); the socket is closed again right away.
fn bind_listen(p: &Pod, addr: SocketAddr, reuse: bool) -> Result<(), Errno> {
    p.netns.run(|| {
        let go = || -> io::Result<()> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                None,
            )?;
            s.set_reuse_address(reuse)?;
            if addr.is_ipv6() {
                s.set_only_v6(false)?;
            }
            s.bind(&addr.into())?;
            s.listen(16)
        };
        go().map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
    })
}

fn wildcards(port: u16) -> [SocketAddr; 2] {
    [
        SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port),
        SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port),
    ]
}

/// Inbound a -> b:SERVICE and outbound b -> a:PEER_PORT connections, open
/// and verified end to end. Returns (app-side streams in b, peer-side
/// streams in a).
fn open_connections(
    a: &Pod,
    b: &Pod,
    app: &TcpListener,
    peer: &TcpListener,
) -> Vec<(TcpStream, TcpStream)> {
    let mut v = Vec::new();
    for _ in 0..OPEN {
        let c = a
            .netns
            .run(|| connect(SocketAddr::new(b.ip(false), SERVICE), TIMEOUT))
            .unwrap();
        let (s, _) = app.accept().unwrap();
        v.push((s, c));
        let c = b
            .netns
            .run(|| connect(SocketAddr::new(a.ip(false), PEER_PORT), TIMEOUT))
            .unwrap();
        let (s, _) = peer.accept().unwrap();
        v.push((c, s));
    }
    for (x, y) in &mut v {
        ping(x, y);
    }
    v
}

fn ping(x: &mut TcpStream, y: &mut TcpStream) {
    for s in [&*x, &*y] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    }
    x.write_all(b"p").unwrap();
    let mut m = [0u8; 1];
    y.read_exact(&mut m).unwrap();
    y.write_all(b"q").unwrap();
    x.read_exact(&mut m).unwrap();
}

/// What binding the app's service port again looks like after the app
/// closed its listener (a restart in place) with its connections open:
/// (with SO_REUSEADDR, without).
fn rebind_service(b: &Pod) -> (Result<(), Errno>, Result<(), Errno>) {
    assert!(
        common::wait_until(Duration::from_secs(5), || tcp_sockets(b)
            .0
            .iter()
            .all(|l| l.port() != SERVICE)),
        "the app's listener is still there"
    );
    let addr = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), SERVICE);
    (bind_listen(b, addr, true), bind_listen(b, addr, false))
}

/// The proxy must not make ports unavailable to the app in ways a plain
/// pod would not. What holds, precisely, while connections into the app
/// (a -> b:8080) and out of it (b -> a:9090) are open through the proxy:
///
/// - **Any port that no socket in the pod holds can be bound and listened
///   on, with or without SO_REUSEADDR**, on the IPv4 and the dual-stack
///   IPv6 wildcard and on the pod's own address: the peer's port 9090,
///   the service port's neighbours 8079/8081, and the spread in
///   [`ARBITRARY`]. The peer's port is free because outbound capture is
///   REDIRECT in both modes: the proxy's accepted outbound socket is local
///   to 127.0.0.1:15001, not to the destination's port (outbound TPROXY
///   would put the remote's port in the pod's bind table, Istio's bug).
/// - **The proxy's upstream sockets inside the pod hold ephemeral ports**
///   (from `net.ipv4.ip_local_port_range`, 32768-60999 by default): the
///   spoofed ones it opens to the app for inbound connections (local
///   address = the client's IP) and, without the fast path, the ordinary
///   ones of its outbound connections (local address = the pod's IP). They
///   all have SO_REUSEADDR and never listen, so an app binding such a port
///   *with* SO_REUSEADDR succeeds. *Without* SO_REUSEADDR, a bind to a
///   wildcard address fails with `EADDRINUSE` (the wildcard overlaps every
///   address); a bind to the pod's own address fails only for the ordinary
///   ones. That is the rule the app's own outgoing connections' ports
///   follow without any proxy; the proxy adds about one held ephemeral port
///   per proxied connection. (Before this test, the ordinary upstream
///   sockets had no SO_REUSEADDR, so their ports were unavailable even to
///   apps that set it: fixed in `sock::make_upstream`.)
/// - **Re-binding the service port after closing its listener** (a restart
///   in place) works with SO_REUSEADDR and fails with `EADDRINUSE` without
///   it, exactly as without the proxy: the app's own accepted connections
///   hold the port either way (and under TPROXY the proxy's accepted
///   sockets too, local to the app's address and port, with SO_REUSEADDR).
/// - The proxy's listener ports (15001, 15006, 15008) are taken.
fn bind_while_proxied(mode: CaptureMode, fast_path: bool) {
    let mn = MeshNode::with_settings(2, settings(mode, fast_path));
    let (a, b) = (mn.pod(0).clone(), mn.pod(1).clone());
    let what = format!("{mode} fast_path={fast_path}");
    let app = b
        .netns
        .run(|| listen(SocketAddr::new(b.ip(false), SERVICE)))
        .unwrap();
    let peer = a
        .netns
        .run(|| listen(SocketAddr::new(a.ip(false), PEER_PORT)))
        .unwrap();
    let mut conns = open_connections(&a, &b, &app, &peer);
    let hops = if fast_path { 1 } else { 2 };
    assert_eq!(mn.proxy.stats().active, (2 * OPEN * hops) as i64, "{what}");

    // Sockets in b that are neither the app's nor a listener: the proxy's.
    let app_side: Vec<SocketAddr> = conns.iter().map(|(x, _)| x.local_addr().unwrap()).collect();
    let reserved = [15001, 15006, 15008, SERVICE];
    let held: Vec<SocketAddr> = tcp_sockets(&b)
        .1
        .into_iter()
        .filter(|l| !app_side.contains(l) && !reserved.contains(&l.port()))
        .collect();
    let range = b.netns.read_sysctl("net.ipv4.ip_local_port_range").unwrap();
    let (lo, hi) = range.split_once(char::is_whitespace).unwrap();
    let (lo, hi): (u16, u16) = (lo.trim().parse().unwrap(), hi.trim().parse().unwrap());
    // Spoofed sockets for the inbound connections; plus the outbound
    // upstreams without the fast path.
    let expect_held = if fast_path { OPEN } else { 2 * OPEN };
    assert_eq!(held.len(), expect_held, "{what}: {held:?}");
    let spoofed = held.iter().filter(|l| l.ip() == a.ip(false)).count();
    assert_eq!(spoofed, OPEN, "{what}: {held:?}");

    for &port in ARBITRARY {
        assert!(
            held.iter().all(|l| l.port() != port),
            "{what}: {port} is held"
        );
        let addrs = wildcards(port);
        for addr in addrs.iter().chain([&SocketAddr::new(b.ip(false), port)]) {
            for reuse in [false, true] {
                assert_eq!(
                    bind_listen(&b, *addr, reuse),
                    Ok(()),
                    "{what}: bind {addr} SO_REUSEADDR={reuse}"
                );
            }
        }
    }
    for l in &held {
        let port = l.port();
        assert!((lo..=hi).contains(&port), "{what}: {l} outside {range}");
        let own = SocketAddr::new(b.ip(false), port);
        let ordinary = l.ip() == b.ip(false);
        for addr in wildcards(port) {
            assert_eq!(
                bind_listen(&b, addr, true),
                Ok(()),
                "{what}: {addr} held by {l}, SO_REUSEADDR"
            );
            assert_eq!(
                bind_listen(&b, addr, false),
                Err(Errno::EADDRINUSE),
                "{what}: {addr} held by {l}, no SO_REUSEADDR"
            );
        }
        assert_eq!(
            bind_listen(&b, own, true),
            Ok(()),
            "{what}: {own} held by {l}"
        );
        assert_eq!(
            bind_listen(&b, own, false),
            if ordinary {
                Err(Errno::EADDRINUSE)
            } else {
                Ok(())
            },
            "{what}: {own} held by {l}, no SO_REUSEADDR"
        );
    }

    // Restart the service listener in place, compared with no proxy.
    drop(app);
    let proxied = rebind_service(&b);
    assert_eq!(proxied, (Ok(()), Err(Errno::EADDRINUSE)), "{what}");
    let direct = {
        let vn = VirtualNode::build(2, 2).unwrap();
        let (da, db) = (vn.pod(0).clone(), vn.pod(1).clone());
        let app = db
            .netns
            .run(|| listen(SocketAddr::new(db.ip(false), SERVICE)))
            .unwrap();
        let peer = da
            .netns
            .run(|| listen(SocketAddr::new(da.ip(false), PEER_PORT)))
            .unwrap();
        let _open = open_connections(&da, &db, &app, &peer);
        drop(app);
        rebind_service(&db)
    };
    assert_eq!(proxied, direct, "{what}: differs from direct");

    // None of this disturbed the proxied connections.
    for (x, y) in &mut conns {
        ping(x, y);
    }
}

#[test]
fn bind_while_proxied_tproxy() {
    let _serial = serial();
    run_isolated("bind_while_proxied_tproxy", || {
        bind_while_proxied(CaptureMode::Tproxy, false);
        bind_while_proxied(CaptureMode::Tproxy, true);
    });
}

#[test]
fn bind_while_proxied_redirect() {
    let _serial = serial();
    run_isolated("bind_while_proxied_redirect", || {
        bind_while_proxied(CaptureMode::Redirect, false);
        bind_while_proxied(CaptureMode::Redirect, true);
    });
}
