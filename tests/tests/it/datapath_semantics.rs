//! TCP semantics through the proxy, each scenario compared with the same
//! scenario between two *uncaptured* pods (no rules, no proxy).
//!
//! - Half-close: one side shuts down its write half, the other still sends
//!   1 MiB after reading EOF; both ways round. Identical to direct.
//! - Reset propagation: SO_LINGER 0 + close on either side makes the other
//!   side's read fail with `ECONNRESET`. Identical to direct.
//! - Connection refused and unreachable destinations: **not** identical, see
//!   [`refused_and_unreachable_tproxy`] for what the app sees and why.
//! - An app dialling the proxy's own port 15001: reset at once, no loop.
//!
//! The proxied runs cover TPROXY and REDIRECT capture, IPv4 and IPv6, with
//! and without the same-node fast path.

use crate::common;
use ringway_testbed::traffic::ReadNoIntr;

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::MeshNode;
use nix::errno::Errno;
use ringway_config::{CaptureMode, Datapath};
use ringway_proxy::Proxy;
use ringway_testbed::traffic::{listen, read_verify, write_pattern, CLIENT_SEED, SERVER_SEED};
use ringway_testbed::{run_isolated, Pod, VirtualNode};

const MIB: u64 = 1 << 20;
/// What the side that half-closes first sends before its FIN.
const FIRST: u64 = 100 * 1024;
/// What the other side sends after it has read that FIN.
const AFTER_EOF: u64 = MIB;
/// Upper bound on "promptly" (a reset or an error after the connect).
/// Generous: it tells "promptly" from "hangs until the 10 s I/O timeout".
const PROMPT: Duration = Duration::from_secs(5);
/// Bound on every blocking socket call, so that no scenario can hang.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Two pods, either captured and served by a proxy, or plain (direct).
struct Bed {
    vn: VirtualNode,
    proxy: Option<Proxy>,
}

impl Bed {
    fn direct() -> Bed {
        common::init_logs();
        Bed {
            vn: VirtualNode::build(1, 2).unwrap(),
            proxy: None,
        }
    }

    fn proxied(mode: CaptureMode, fast_path: bool) -> Bed {
        let mut settings = common::settings(mode, Datapath::Uring);
        settings.same_node_fast_path = fast_path;
        let MeshNode { vn, proxy } = MeshNode::with_settings(2, settings);
        Bed {
            vn,
            proxy: Some(proxy),
        }
    }

    fn a(&self) -> &Pod {
        self.vn.pod(0)
    }

    fn b(&self) -> &Pod {
        self.vn.pod(1)
    }

    fn stats(&self) -> ringway_proxy::StatsSnapshot {
        self.proxy.as_ref().map(|p| p.stats()).unwrap_or_default()
    }
}

/// An I/O error as its errno (readable in assertion messages).
fn errno(e: &io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(0))
}

fn accept_timeout(l: &TcpListener, timeout: Duration) -> io::Result<TcpStream> {
    l.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(IO_TIMEOUT))?;
                s.set_write_timeout(Some(IO_TIMEOUT))?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e),
        }
    }
}

fn connect_in(pod: &Pod, addr: SocketAddr) -> io::Result<TcpStream> {
    pod.netns.run(|| {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
        s.set_read_timeout(Some(IO_TIMEOUT))?;
        s.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(s)
    })
}

fn set_linger_zero(s: &TcpStream) {
    socket2::SockRef::from(s)
        .set_linger(Some(Duration::ZERO))
        .unwrap();
}

/// One side's view of a half-close exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HalfCloseSide {
    /// Verified bytes read up to EOF.
    read: Result<u64, String>,
    /// What a read after that EOF returned.
    read_after_eof: Result<usize, Errno>,
    /// Whether sending the payload (and the FIN) succeeded.
    sent: Result<(), String>,
}

/// The side that sends `FIRST` bytes, half-closes, then reads to EOF.
fn closes_first(mut s: TcpStream, seed: u64, expect_seed: u64) -> HalfCloseSide {
    let sent = write_pattern(&mut s, seed, FIRST)
        .and_then(|()| s.shutdown(Shutdown::Write))
        .map_err(|e| e.to_string());
    let read = read_verify(&mut s, expect_seed).map_err(|e| e.to_string());
    let read_after_eof = s.read_no_intr(&mut [0u8; 16]).map_err(|e| errno(&e));
    HalfCloseSide {
        read,
        read_after_eof,
        sent,
    }
}

/// The side that reads to EOF first, then sends `AFTER_EOF` bytes and closes.
fn answers_after_eof(mut s: TcpStream, seed: u64, expect_seed: u64) -> HalfCloseSide {
    let read = read_verify(&mut s, expect_seed).map_err(|e| e.to_string());
    let read_after_eof = s.read_no_intr(&mut [0u8; 16]).map_err(|e| errno(&e));
    let sent = write_pattern(&mut s, seed, AFTER_EOF)
        .and_then(|()| s.shutdown(Shutdown::Write))
        .map_err(|e| e.to_string());
    HalfCloseSide {
        read,
        read_after_eof,
        sent,
    }
}

/// (client's view, server's view).
type HalfClose = (HalfCloseSide, HalfCloseSide);

/// Client half-closes first when `client_first`, else the server does.
fn half_close(bed: &Bed, v6: bool, port: u16, client_first: bool) -> HalfClose {
    let addr = SocketAddr::new(bed.b().ip(v6), port);
    let l = bed.b().netns.run(|| listen(addr)).unwrap();
    std::thread::scope(|sc| {
        let server = sc.spawn(|| {
            let s = accept_timeout(&l, IO_TIMEOUT).expect("server accept");
            if client_first {
                answers_after_eof(s, SERVER_SEED, CLIENT_SEED)
            } else {
                closes_first(s, SERVER_SEED, CLIENT_SEED)
            }
        });
        let c = connect_in(bed.a(), addr).expect("client connect");
        let client = if client_first {
            closes_first(c, CLIENT_SEED, SERVER_SEED)
        } else {
            answers_after_eof(c, CLIENT_SEED, SERVER_SEED)
        };
        (client, server.join().unwrap())
    })
}

/// What the surviving side saw after its peer reset the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ResetSeen {
    /// The first read after the reset.
    read: Result<usize, Errno>,
    /// Whether it came within [`PROMPT`].
    prompt: bool,
}

/// The client (`client_resets`) or the server sets SO_LINGER 0 and closes
/// once a 5-byte hello went end to end; returns what the other side reads.
fn reset(bed: &Bed, v6: bool, port: u16, client_resets: bool) -> ResetSeen {
    let addr = SocketAddr::new(bed.b().ip(v6), port);
    let l = bed.b().netns.run(|| listen(addr)).unwrap();
    let (hello_tx, hello_rx) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|sc| {
        let server = sc.spawn(move || {
            let mut s = accept_timeout(&l, IO_TIMEOUT).expect("server accept");
            let mut hello = [0u8; 5];
            s.read_exact(&mut hello).expect("server reads hello");
            assert_eq!(&hello, b"hello");
            if client_resets {
                hello_tx.send(()).unwrap();
                Some(read_after_reset(&mut s))
            } else {
                set_linger_zero(&s);
                drop(s);
                hello_tx.send(()).unwrap();
                None
            }
        });
        let mut c = connect_in(bed.a(), addr).expect("client connect");
        c.write_all(b"hello").unwrap();
        hello_rx
            .recv_timeout(IO_TIMEOUT)
            .expect("hello reached the server");
        if client_resets {
            set_linger_zero(&c);
            drop(c);
            server.join().unwrap().expect("the server's view")
        } else {
            let seen = read_after_reset(&mut c);
            assert_eq!(server.join().unwrap(), None);
            seen
        }
    })
}

fn read_after_reset(s: &mut TcpStream) -> ResetSeen {
    let start = Instant::now();
    let read = s.read_no_intr(&mut [0u8; 64]).map_err(|e| errno(&e));
    ResetSeen {
        read,
        prompt: start.elapsed() < PROMPT,
    }
}

/// Everything [`observe`] checks, per address family.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Semantics {
    client_half_closes_first: HalfClose,
    server_half_closes_first: HalfClose,
    client_resets: ResetSeen,
    server_resets: ResetSeen,
}

fn observe(bed: &Bed, v6: bool) -> Semantics {
    let base = if v6 { 9000 } else { 8000 };
    Semantics {
        client_half_closes_first: half_close(bed, v6, base + 1, true),
        server_half_closes_first: half_close(bed, v6, base + 2, false),
        client_resets: reset(bed, v6, base + 3, true),
        server_resets: reset(bed, v6, base + 4, false),
    }
}

/// The behaviour of two plain pods, spelled out: whoever half-closes first
/// still receives everything the other side sends after reading the FIN,
/// then a clean EOF; a reset by either side is an `ECONNRESET` on the
/// other's next read, promptly.
fn expected() -> Semantics {
    let first = |read: u64| HalfCloseSide {
        read: Ok(read),
        read_after_eof: Ok(0),
        sent: Ok(()),
    };
    let reset_seen = ResetSeen {
        read: Err(Errno::ECONNRESET),
        prompt: true,
    };
    Semantics {
        client_half_closes_first: (first(AFTER_EOF), first(FIRST)),
        server_half_closes_first: (first(FIRST), first(AFTER_EOF)),
        client_resets: reset_seen.clone(),
        server_resets: reset_seen,
    }
}

/// Direct first (and it must match [`expected`]), then through the proxy in
/// `mode`, both fast-path settings, both families: the same observations.
fn same_as_direct(mode: CaptureMode) {
    let direct = Bed::direct();
    for v6 in [false, true] {
        assert_eq!(observe(&direct, v6), expected(), "direct, v6={v6}");
    }
    drop(direct);
    for fast_path in [false, true] {
        let bed = Bed::proxied(mode, fast_path);
        for v6 in [false, true] {
            let before = bed.stats();
            assert_eq!(
                observe(&bed, v6),
                expected(),
                "{mode} fast_path={fast_path} v6={v6}: differs from direct"
            );
            // Four connections per family, every one proxied (once or twice).
            let hops = if fast_path { 1 } else { 2 };
            let after = bed.stats();
            assert_eq!(after.accepted - before.accepted, 4 * hops, "{after:?}");
            assert_eq!(after.connect_failed, before.connect_failed, "{after:?}");
        }
        common::wait_no_active(bed.proxy.as_ref().unwrap());
    }
}

#[test]
fn half_close_and_reset_same_as_direct_tproxy() {
    run_isolated("half_close_and_reset_same_as_direct_tproxy", || {
        same_as_direct(CaptureMode::Tproxy)
    });
}

#[test]
fn half_close_and_reset_same_as_direct_redirect() {
    run_isolated("half_close_and_reset_same_as_direct_redirect", || {
        same_as_direct(CaptureMode::Redirect)
    });
}

/// How a dial of a destination that cannot be served ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DialEnd {
    /// `connect()` failed.
    ConnectFailed(Errno),
    /// `connect()` succeeded, then the first read failed (no data came).
    ReadFailed(Errno),
    /// `connect()` succeeded, then the first read returned this many bytes
    /// (0: EOF). Never expected here.
    Read(usize),
}

/// What a client saw dialling a destination that cannot be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dial {
    end: DialEnd,
    /// Whether it ended within [`PROMPT`].
    prompt: bool,
}

impl Dial {
    /// A reset and nothing else, promptly. The proxy's reset usually comes
    /// after the app's `connect()` returned, and then the first read fails;
    /// when it overtakes the handshake's completion in the app's kernel
    /// (over loopback it can), `connect()` itself reports it. Either way the
    /// app gets `ECONNRESET` and no data.
    fn is_prompt_reset(&self) -> bool {
        self.prompt
            && matches!(
                self.end,
                DialEnd::ConnectFailed(Errno::ECONNRESET) | DialEnd::ReadFailed(Errno::ECONNRESET)
            )
    }
}

fn dial(pod: &Pod, addr: SocketAddr) -> Dial {
    pod.netns.run(|| {
        let start = Instant::now();
        let end = match TcpStream::connect_timeout(&addr, IO_TIMEOUT) {
            Err(e) => DialEnd::ConnectFailed(errno(&e)),
            Ok(mut s) => {
                s.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                match s.read_no_intr(&mut [0u8; 64]) {
                    Ok(n) => DialEnd::Read(n),
                    Err(e) => DialEnd::ReadFailed(errno(&e)),
                }
            }
        };
        Dial {
            end,
            prompt: start.elapsed() < PROMPT,
        }
    })
}

/// Makes the node answer traffic for 10.99.0.0/16 and fd99::/64 with ICMP
/// "unreachable": the pods route it to the node (their default route), the
/// node forwards and has an `unreachable` route for it. ICMP rate limiting
/// is off so that every SYN gets its answer.
fn unreachable_beyond_node(vn: &VirtualNode) {
    vn.node.sysctl("net.ipv4.ip_forward", "1").unwrap();
    vn.node.sysctl("net.ipv6.conf.all.forwarding", "1").unwrap();
    vn.node.sysctl("net.ipv4.icmp_ratelimit", "0").unwrap();
    vn.node.sysctl("net.ipv6.icmp.ratelimit", "0").unwrap();
    vn.node
        .ip(&["route", "add", "unreachable", "10.99.0.0/16"])
        .unwrap();
    vn.node
        .ip(&["-6", "route", "add", "unreachable", "fd99::/64"])
        .unwrap();
}

/// Makes pod-a itself have an `unreachable` route for 10.98.0.0/16 and fd98::/64.
fn unreachable_in_pod(pod: &Pod) {
    pod.netns
        .ip(&["route", "add", "unreachable", "10.98.0.0/16"])
        .unwrap();
    pod.netns
        .ip(&["-6", "route", "add", "unreachable", "fd98::/64"])
        .unwrap();
}

fn unreachable_targets(v6: bool) -> (SocketAddr, SocketAddr) {
    if v6 {
        (
            "[fd99::7]:80".parse().unwrap(),
            "[fd98::7]:80".parse().unwrap(),
        )
    } else {
        (
            "10.99.0.7:80".parse().unwrap(),
            "10.98.0.7:80".parse().unwrap(),
        )
    }
}

/// Connection refused and unreachable destinations: the one place where a
/// transparent proxy cannot be transparent.
///
/// Directly, the client's `connect()` itself fails: `ECONNREFUSED` when
/// nothing listens on the port (the server's kernel answers the SYN with a
/// RST); `EHOSTUNREACH` (IPv4) or `ENETUNREACH` (IPv6, ICMPv6 "no route")
/// when a router on the way answers with ICMP "unreachable".
///
/// Through the proxy, the client's SYN is captured in its own pod and
/// answered by the proxy's listener, so **`connect()` succeeds** before the
/// proxy has even tried the real destination. When the proxy's own connect
/// then fails, all it can do is reset the client's connection: the client's
/// first read fails with **`ECONNRESET`**, promptly (well within 2 s), with
/// no data and never an EOF (see [`Dial::is_prompt_reset`] for the rare case
/// of the reset overtaking `connect()`). The errno of the real failure
/// (refused, host or network unreachable) is lost. Every transparent proxy
/// (Istio's sidecars and ztunnel, Linkerd, Envoy) behaves this way: TCP has
/// no way to take back a completed handshake, and the proxy only learns the
/// destination from the handshake. Applications must treat a reset on the
/// first read like a refused connect.
///
/// One unreachable case *is* identical: a route of type `unreachable` in the
/// client's own pod fails `connect()` with `EHOSTUNREACH` in both setups and
/// both families, because the kernel looks the route up inside `connect()`,
/// before the first packet exists and so before any capture rule (the nat
/// output hook) can see it. The proxy never hears of that connection.
fn refused_and_unreachable(mode: CaptureMode) {
    let failed = |errno| Dial {
        end: DialEnd::ConnectFailed(errno),
        prompt: true,
    };
    let icmp_unreachable = |v6: bool| {
        failed(if v6 {
            Errno::ENETUNREACH
        } else {
            Errno::EHOSTUNREACH
        })
    };

    let direct = Bed::direct();
    unreachable_beyond_node(&direct.vn);
    unreachable_in_pod(direct.a());
    for v6 in [false, true] {
        let closed_port = SocketAddr::new(direct.b().ip(v6), 8081);
        let d = dial(direct.a(), closed_port);
        assert_eq!(d, failed(Errno::ECONNREFUSED), "direct, refused, v6={v6}");
        let (beyond, in_pod) = unreachable_targets(v6);
        let d = dial(direct.a(), beyond);
        assert_eq!(d, icmp_unreachable(v6), "direct, ICMP unreachable, v6={v6}");
        let d = dial(direct.a(), in_pod);
        assert_eq!(
            d,
            failed(Errno::EHOSTUNREACH),
            "direct, unreachable route, v6={v6}"
        );
    }
    drop(direct);

    for fast_path in [false, true] {
        let bed = Bed::proxied(mode, fast_path);
        unreachable_beyond_node(&bed.vn);
        unreachable_in_pod(bed.a());
        for v6 in [false, true] {
            let what = format!("{mode} fast_path={fast_path} v6={v6}");
            let hops = if fast_path { 1 } else { 2 };

            let before = bed.stats();
            let closed_port = SocketAddr::new(bed.b().ip(v6), 8081);
            let d = dial(bed.a(), closed_port);
            assert!(d.is_prompt_reset(), "{what}: refused: {d:?}");
            let after = bed.stats();
            // With the fast path pod-a's proxy is refused by pod-b's kernel.
            // Without it pod-b's inbound side is refused and resets pod-a's
            // proxy, which counts a failed connect too when that reset
            // arrives before its own connect completed (a race).
            assert_eq!(after.accepted - before.accepted, hops, "{what} {after:?}");
            let n_failed = after.connect_failed - before.connect_failed;
            assert!((1..=hops).contains(&n_failed), "{what} {after:?}");

            let (beyond, in_pod) = unreachable_targets(v6);
            let before = bed.stats();
            let d = dial(bed.a(), beyond);
            assert!(d.is_prompt_reset(), "{what}: ICMP unreachable: {d:?}");
            let after = bed.stats();
            assert_eq!(after.accepted - before.accepted, 1, "{what} {after:?}");
            assert_eq!(after.connect_failed - before.connect_failed, 1, "{what}");

            let before = bed.stats();
            assert_eq!(
                dial(bed.a(), in_pod),
                failed(Errno::EHOSTUNREACH),
                "{what}: unreachable route in the client's pod"
            );
            let after = bed.stats();
            assert_eq!(
                (after.accepted, after.connect_failed, after.refused),
                (before.accepted, before.connect_failed, before.refused),
                "{what}: the proxy saw nothing"
            );
        }
        common::wait_no_active(bed.proxy.as_ref().unwrap());
    }
}

#[test]
fn refused_and_unreachable_tproxy() {
    run_isolated("refused_and_unreachable_tproxy", || {
        refused_and_unreachable(CaptureMode::Tproxy)
    });
}

#[test]
fn refused_and_unreachable_redirect() {
    run_isolated("refused_and_unreachable_redirect", || {
        refused_and_unreachable(CaptureMode::Redirect)
    });
}

/// An app that dials the proxy's outbound port itself (its own address,
/// loopback, or a peer's 15001 which its capture sends to its own 15001)
/// is reset at once: one accept, one refusal, no second connection. A loop
/// would show as the proxy accepting its own upstream connections over and
/// over. Without the proxy nothing listens there (`ECONNREFUSED`).
fn dial_proxy_port(mode: CaptureMode) {
    let port = common::settings(mode, Datapath::Uring).ports.outbound;
    {
        let bed = Bed::proxied(mode, true);
        let (a, b) = (bed.a(), bed.b());
        let targets: [IpAddr; 6] = [
            a.ipv4.into(),
            IpAddr::from([127, 0, 0, 1]),
            b.ipv4.into(),
            a.ipv6.into(),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            b.ipv6.into(),
        ];
        for ip in targets {
            let before = bed.stats();
            let d = dial(a, SocketAddr::new(ip, port));
            assert!(d.is_prompt_reset(), "{mode}: dialling {ip}:{port}: {d:?}");
            let after = bed.stats();
            assert_eq!(after.accepted - before.accepted, 1, "{ip}: {after:?}");
            assert_eq!(after.refused - before.refused, 1, "{ip}: {after:?}");
            assert_eq!(after.connect_failed, before.connect_failed, "{ip}");
        }
        common::wait_no_active(bed.proxy.as_ref().unwrap());
    }
    let direct = Bed::direct();
    let d = dial(direct.a(), SocketAddr::new(direct.b().ip(false), port));
    assert_eq!(d.end, DialEnd::ConnectFailed(Errno::ECONNREFUSED), "direct");
}

#[test]
fn dialling_15001_is_reset_not_looped_tproxy() {
    run_isolated("dialling_15001_is_reset_not_looped_tproxy", || {
        dial_proxy_port(CaptureMode::Tproxy)
    });
}

#[test]
fn dialling_15001_is_reset_not_looped_redirect() {
    run_isolated("dialling_15001_is_reset_not_looped_redirect", || {
        dial_proxy_port(CaptureMode::Redirect)
    });
}
