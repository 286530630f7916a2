//! `ringway-redirect` in real pod network namespaces: the programmed rule
//! set (read back with the `nft`/`ip` binaries, used here only to inspect),
//! idempotence, drift detection, clean removal, refusal of bad input, and
//! real TCP traffic through the capture plumbing without any proxy.
//!
//! Every test runs inside `run_isolated` on its own virtual node; nothing
//! touches the machine's root network namespace.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use ringway_redirect::{
    apply, apply_with_extra_rule_for_test, check_pod_netns, open_netns, remove, verify,
    CaptureMode, CaptureSpec, Drift, InjectedFault, RedirectError,
};
use ringway_testbed::traffic::{client_exchange, connect, Listener, PayloadServer};
use ringway_testbed::{run_isolated, Pod, VirtualNode};
use socket2::{Domain, SockAddr, SockRef, Socket, Type};

const SHORT: Duration = Duration::from_secs(5);
/// How long a connect to a dropped SYN is given before it counts as dropped.
const DROPPED: Duration = Duration::from_secs(2);

fn tproxy() -> CaptureSpec {
    CaptureSpec::default()
}

fn redirect() -> CaptureSpec {
    CaptureSpec {
        mode: CaptureMode::Redirect,
        ..CaptureSpec::default()
    }
}

// ---------------------------------------------------------------- helpers

fn nft(pod: &Pod, args: &[&str]) -> String {
    pod.netns.nft(args)
}

fn ip(pod: &Pod, args: &[&str]) -> String {
    pod.netns
        .ip(args)
        .unwrap_or_else(|e| panic!("ip {args:?} in {}: {e}", pod.name))
}

fn drift(pod: &Pod, spec: &CaptureSpec) -> Vec<Drift> {
    verify(pod.netns.fd(), spec).expect("verify")
}

fn drift_text(pod: &Pod, spec: &CaptureSpec) -> Vec<String> {
    drift(pod, spec).iter().map(|d| d.to_string()).collect()
}

fn any_addr(v6: bool, port: u16) -> SocketAddr {
    if v6 {
        SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port)
    } else {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port)
    }
}

/// A listener with `IP_TRANSPARENT`, as the proxy's inbound listener is.
fn transparent_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_ip_transparent(true)?;
    if addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&addr.into())?;
    s.listen(128)?;
    Ok(s.into())
}

/// A listener in `pod` that is gone when dropped (see [`Listener`]): tests
/// here reuse fixed ports and expect a closed one to refuse.
fn listener(pod: &Pod, addr: SocketAddr) -> Listener {
    Listener::bind(&pod.netns, addr)
        .unwrap_or_else(|e| panic!("listen on {addr} in {}: {e}", pod.name))
}

/// A transparent listener in `pod` that is gone when dropped.
fn tproxy_listener(pod: &Pod, addr: SocketAddr) -> Listener {
    let l = pod
        .netns
        .run(|| transparent_listener(addr))
        .unwrap_or_else(|e| panic!("transparent listen on {addr} in {}: {e}", pod.name));
    Listener::adopt(&pod.netns, l).expect("listener address")
}

/// Accepts one connection within `d`, or `None`.
fn accept_within(l: &TcpListener, d: Duration) -> Option<(TcpStream, SocketAddr)> {
    l.set_nonblocking(true).expect("nonblocking listener");
    let end = Instant::now() + d;
    loop {
        match l.accept() {
            Ok((s, a)) => {
                s.set_nonblocking(false).expect("blocking stream");
                return Some((s, a));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= end {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn assert_nothing_accepted(l: &TcpListener, what: &str) {
    if let Some((_, peer)) = accept_within(l, Duration::from_millis(50)) {
        panic!("{what} accepted a connection from {peer} it must never see");
    }
}

/// Connects from inside `pod` with an optional socket mark.
fn connect_from(pod: &Pod, dst: SocketAddr, mark: Option<u32>) -> std::io::Result<TcpStream> {
    pod.netns.run(|| {
        let s = Socket::new(Domain::for_address(dst), Type::STREAM, None)?;
        if let Some(m) = mark {
            s.set_mark(m)?;
        }
        s.connect_timeout(&dst.into(), SHORT)?;
        Ok(s.into())
    })
}

fn original_dst(s: &TcpStream, v6: bool) -> SocketAddr {
    let r = SockRef::from(s);
    let a: SockAddr = if v6 {
        r.original_dst_ipv6()
    } else {
        r.original_dst()
    }
    .expect("SO_ORIGINAL_DST");
    a.as_socket().expect("inet address")
}

/// One byte each way, to prove the connection carries data.
fn ping(mut c: TcpStream, mut s: TcpStream) {
    c.set_read_timeout(Some(SHORT)).unwrap();
    s.set_read_timeout(Some(SHORT)).unwrap();
    c.write_all(b"q").unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    s.write_all(b"a").unwrap();
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"a");
}

fn node_with_capture(spec: &CaptureSpec) -> (VirtualNode, Pod, Pod) {
    let vn = VirtualNode::build(1, 2).expect("virtual node");
    let (p0, p1) = (vn.pod(0).clone(), vn.pod(1).clone());
    apply(p1.netns.fd(), spec).expect("apply");
    assert_eq!(drift(&p1, spec), vec![], "fresh apply must verify clean");
    (vn, p0, p1)
}

// ------------------------------------------------------ rule set listings

fn listing_checks(spec: &CaptureSpec, pod: &Pod) -> String {
    let table = nft(pod, &["list", "table", "inet", "ringway"]);
    let must = [
        "chain prerouting {",
        "type filter hook prerouting priority mangle; policy accept;",
        "meta l4proto != tcp return",
        "meta mark & 0x00000fff == 0x00000539 ct direction original ct mark set 0x00000111 return",
        "meta mark & 0x00000fff == 0x00000539 return",
        "iif \"lo\" socket transparent 1 meta mark set 0x00000111 accept",
        "iif \"lo\" return",
        "chain output {",
        "type route hook output priority mangle; policy accept;",
        "ct mark & 0x00000fff == 0x00000111 meta mark set 0x00000111",
        "chain nat_output {",
        "type nat hook output priority -100; policy accept;",
        "oif \"lo\" return",
        "dnat ip to jhash ip daddr . tcp dport mod 16777214 seed 0x72696e67 offset 2130706433:15001",
        "meta nfproto ipv6 meta l4proto tcp meta mark set 0x00000111 ct mark set 0x00000111 dnat ip6 to [fd16:9254:7127:1500::]:15001",
        "comment \"ringway:v1:prerouting:1:",
    ];
    for m in must {
        assert!(table.contains(m), "missing `{m}` in:\n{table}");
    }
    let tproxy_only = [
        "socket transparent 1 accept",
        "ip saddr 169.254.7.127 return",
        "ip6 saddr fd16:9254:7127:1337:ffff:ffff:ffff:ffff return",
        "tcp dport 15008 return",
        "meta l4proto tcp tproxy to :15006 accept",
        "meta l4proto tcp drop",
    ];
    match spec.mode {
        CaptureMode::Tproxy => {
            for m in tproxy_only {
                assert!(table.contains(m), "missing `{m}` in:\n{table}");
            }
            assert!(!table.contains("nat_prerouting"), "{table}");
        }
        CaptureMode::Redirect => {
            for m in [
                "chain nat_prerouting {",
                "type nat hook prerouting priority dstnat; policy accept;",
                "meta l4proto tcp redirect to :15006",
                "ip saddr 169.254.7.127 return",
                "tcp dport 15008 return",
            ] {
                assert!(table.contains(m), "missing `{m}` in:\n{table}");
            }
            assert!(!table.contains("tproxy"), "{table}");
            assert!(!table.contains("drop"), "{table}");
        }
    }
    table
}

fn routing_listing(pod: &Pod) -> String {
    let mut out = String::new();
    for fam in ["-4", "-6"] {
        out += &ip(pod, &[fam, "rule"]);
        out += &ip(pod, &[fam, "route", "show", "table", "all"]);
    }
    out
}

fn assert_routing_present(pod: &Pod) {
    for fam in ["-4", "-6"] {
        let rules = ip(pod, &[fam, "rule"]);
        assert!(
            rules.contains("100:\tfrom all fwmark 0x111/0xfff lookup 133"),
            "{fam} rule missing:\n{rules}"
        );
        let routes = ip(pod, &[fam, "route", "show", "table", "133"]);
        assert!(
            routes.contains("local default dev lo"),
            "{fam} route missing:\n{routes}"
        );
    }
    assert!(ip(pod, &["link", "show", "lo"]).contains("UP"));
}

fn assert_nothing_left(pod: &Pod) {
    let ruleset = nft(pod, &["list", "ruleset"]);
    assert_eq!(ruleset.trim(), "", "nft ruleset not empty:\n{ruleset}");
    for fam in ["-4", "-6"] {
        let rules = ip(pod, &[fam, "rule"]);
        assert!(!rules.contains("fwmark"), "{fam} ip rule left:\n{rules}");
        assert!(!rules.contains("133"), "{fam} ip rule left:\n{rules}");
        let routes = ip(pod, &[fam, "route", "show", "table", "all"]);
        assert!(!routes.contains("table 133"), "{fam} route left:\n{routes}");
    }
}

fn apply_listing_idempotent(spec: CaptureSpec, test: &str) {
    run_isolated(test, || {
        let vn = VirtualNode::build(1, 1).unwrap();
        let pod = vn.pod(0).clone();
        apply(pod.netns.fd(), &spec).expect("apply");
        let first = listing_checks(&spec, &pod);
        let routing = routing_listing(&pod);
        assert_routing_present(&pod);
        assert_eq!(drift(&pod, &spec), vec![]);

        apply(pod.netns.fd(), &spec).expect("second apply");
        let second = listing_checks(&spec, &pod);
        assert_eq!(first, second, "re-apply changed the rule set");
        assert_eq!(routing, routing_listing(&pod), "re-apply changed routing");
        assert_eq!(drift(&pod, &spec), vec![]);

        remove(pod.netns.fd(), &spec).expect("remove");
        assert_nothing_left(&pod);
        remove(pod.netns.fd(), &spec).expect("second remove");
        assert_nothing_left(&pod);
        let gone = drift(&pod, &spec);
        assert!(gone.contains(&Drift::TableMissing), "{gone:?}");
        assert_eq!(gone.len(), 5, "table + rule and route per family: {gone:?}");
    });
}

#[test]
fn tproxy_rules_listed_idempotent_and_removed() {
    apply_listing_idempotent(tproxy(), "tproxy_rules_listed_idempotent_and_removed");
}

#[test]
fn redirect_rules_listed_idempotent_and_removed() {
    apply_listing_idempotent(redirect(), "redirect_rules_listed_idempotent_and_removed");
}

#[test]
fn remove_is_a_no_op_on_a_clean_pod_and_spares_other_tables() {
    run_isolated(
        "remove_is_a_no_op_on_a_clean_pod_and_spares_other_tables",
        || {
            let vn = VirtualNode::build(1, 1).unwrap();
            let pod = vn.pod(0).clone();
            remove(pod.netns.fd(), &tproxy()).expect("remove on a clean pod");
            assert_nothing_left(&pod);

            // Other tables (a CNI's, say) are neither checked nor touched.
            nft(&pod, &["add", "table", "ip", "cni"]);
            nft(
                &pod,
                &[
                    "add",
                    "chain",
                    "ip",
                    "cni",
                    "post",
                    "{",
                    "type",
                    "nat",
                    "hook",
                    "postrouting",
                    "priority",
                    "100",
                    ";",
                    "}",
                ],
            );
            let cni = nft(&pod, &["list", "table", "ip", "cni"]);
            apply(pod.netns.fd(), &tproxy()).unwrap();
            assert_eq!(drift(&pod, &tproxy()), vec![]);
            remove(pod.netns.fd(), &tproxy()).unwrap();
            assert_eq!(nft(&pod, &["list", "ruleset"]), cni);
        },
    );
}

#[test]
fn switching_modes_replaces_the_rule_set() {
    run_isolated("switching_modes_replaces_the_rule_set", || {
        let vn = VirtualNode::build(1, 1).unwrap();
        let pod = vn.pod(0).clone();
        apply(pod.netns.fd(), &tproxy()).unwrap();
        apply(pod.netns.fd(), &redirect()).unwrap();
        listing_checks(&redirect(), &pod);
        assert_eq!(drift(&pod, &redirect()), vec![]);
        let d = drift_text(&pod, &tproxy());
        assert!(
            d.contains(&"foreign nft chain inet ringway nat_prerouting (type nat hook prerouting priority -100 policy accept)".to_string()),
            "{d:?}"
        );
        assert!(
            d.contains(
                &"rule 6 of chain prerouting missing (tcp flags & (syn | ack) != syn socket transparent 1 accept)".to_string()
            ),
            "{d:?}"
        );
        apply(pod.netns.fd(), &tproxy()).unwrap();
        listing_checks(&tproxy(), &pod);
        assert_eq!(drift(&pod, &tproxy()), vec![]);
    });
}

// ------------------------------------------------------------------ drift

fn handle_of(pod: &Pod, chain: &str, needle: &str) -> String {
    let listing = nft(pod, &["-a", "list", "chain", "inet", "ringway", chain]);
    let line = listing
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no rule with `{needle}` in:\n{listing}"));
    line.rsplit("# handle ")
        .next()
        .expect("handle")
        .trim()
        .to_string()
}

#[test]
fn verify_reports_each_kind_of_drift() {
    run_isolated("verify_reports_each_kind_of_drift", || {
        let spec = tproxy();
        let vn = VirtualNode::build(1, 1).unwrap();
        let pod = vn.pod(0).clone();
        let reapply = || {
            apply(pod.netns.fd(), &spec).expect("re-apply");
            assert_eq!(drift(&pod, &spec), vec![], "re-apply must repair");
        };
        reapply();

        // A deleted rule.
        let h = handle_of(&pod, "prerouting", "tproxy to :15006");
        nft(
            &pod,
            &[
                "delete",
                "rule",
                "inet",
                "ringway",
                "prerouting",
                "handle",
                &h,
            ],
        );
        assert_eq!(
            drift_text(&pod, &spec),
            vec!["rule 11 of chain prerouting missing (meta l4proto tcp tproxy to :15006 accept)"]
        );
        reapply();

        // A flushed chain.
        nft(&pod, &["flush", "chain", "inet", "ringway", "output"]);
        assert_eq!(
            drift_text(&pod, &spec),
            vec![
                "rule 1 of chain output missing (meta l4proto != tcp return)",
                "rule 2 of chain output missing (meta mark & 0xfff == 0x539 return)",
                "rule 3 of chain output missing (ct mark & 0xfff == 0x111 meta mark set 0x111)",
            ]
        );
        reapply();

        // A foreign rule.
        nft(
            &pod,
            &["add", "rule", "inet", "ringway", "output", "counter"],
        );
        assert_eq!(
            drift(&pod, &spec),
            vec![Drift::ForeignRule {
                chain: "output".into(),
                position: 4,
                handle: handle_of(&pod, "output", "counter").parse().unwrap(),
            }]
        );
        reapply();

        // A rule changed in place but still wearing our tag.
        let h = handle_of(&pod, "output", "meta l4proto != tcp return");
        let listing = nft(&pod, &["list", "chain", "inet", "ringway", "output"]);
        let tag = listing
            .split("comment \"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .expect("tag of rule 1")
            .to_string();
        let comment = format!("\"{tag}\"");
        nft(
            &pod,
            &[
                "replace", "rule", "inet", "ringway", "output", "handle", &h, "meta", "l4proto",
                "!=", "udp", "return", "comment", &comment,
            ],
        );
        let d = drift_text(&pod, &spec);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].starts_with("rule 1 of chain output differs: its expressions were changed"),
            "{d:?}"
        );
        reapply();

        // Two rules swapped: delete rule 1 and add it back at the end.
        let h = handle_of(&pod, "output", "meta l4proto != tcp return");
        let listing = nft(&pod, &["list", "chain", "inet", "ringway", "output"]);
        let tag = listing
            .split("comment \"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap()
            .to_string();
        nft(
            &pod,
            &["delete", "rule", "inet", "ringway", "output", "handle", &h],
        );
        let comment = format!("\"{tag}\"");
        nft(
            &pod,
            &[
                "add", "rule", "inet", "ringway", "output", "meta", "l4proto", "!=", "tcp",
                "return", "comment", &comment,
            ],
        );
        assert_eq!(
            drift_text(&pod, &spec),
            vec!["rules of chain output are out of order"]
        );
        reapply();

        // ip rules, per family.
        ip(
            &pod,
            &[
                "-4",
                "rule",
                "del",
                "fwmark",
                "0x111/0xfff",
                "lookup",
                "133",
            ],
        );
        assert_eq!(
            drift_text(&pod, &spec),
            vec!["ip rule fwmark 0x111/0xfff lookup 133 (IPv4) missing"]
        );
        ip(
            &pod,
            &[
                "-6",
                "rule",
                "del",
                "fwmark",
                "0x111/0xfff",
                "lookup",
                "133",
            ],
        );
        assert_eq!(
            drift_text(&pod, &spec),
            vec![
                "ip rule fwmark 0x111/0xfff lookup 133 (IPv4) missing",
                "ip rule fwmark 0x111/0xfff lookup 133 (IPv6) missing",
            ]
        );
        reapply();

        // Same rule at another priority.
        ip(
            &pod,
            &[
                "-4",
                "rule",
                "del",
                "fwmark",
                "0x111/0xfff",
                "lookup",
                "133",
            ],
        );
        ip(
            &pod,
            &[
                "-4",
                "rule",
                "add",
                "fwmark",
                "0x111/0xfff",
                "lookup",
                "133",
                "priority",
                "200",
            ],
        );
        assert_eq!(
            drift_text(&pod, &spec),
            vec!["ip rule fwmark 0x111/0xfff lookup 133 (IPv4) has priority [200], want 100"]
        );
        reapply();
        remove(pod.netns.fd(), &spec).unwrap();
        assert_nothing_left(&pod);
        reapply();

        // Local routes, per family.
        ip(
            &pod,
            &[
                "-4", "route", "del", "local", "default", "dev", "lo", "table", "133",
            ],
        );
        ip(
            &pod,
            &[
                "-6", "route", "del", "local", "::/0", "dev", "lo", "table", "133",
            ],
        );
        assert_eq!(
            drift_text(&pod, &spec),
            vec![
                "ip route local 0.0.0.0/0 dev lo table 133 (IPv4) missing",
                "ip route local ::/0 dev lo table 133 (IPv6) missing",
            ]
        );
        reapply();

        // Chains: foreign, missing, changed.
        nft(&pod, &["add", "chain", "inet", "ringway", "extra"]);
        assert_eq!(
            drift_text(&pod, &spec),
            vec!["foreign nft chain inet ringway extra (a regular (non-base) chain)"]
        );
        reapply();
        nft(&pod, &["flush", "chain", "inet", "ringway", "nat_output"]);
        nft(&pod, &["delete", "chain", "inet", "ringway", "nat_output"]);
        assert_eq!(
            drift_text(&pod, &spec),
            vec!["nft chain inet ringway nat_output missing"]
        );
        reapply();
        nft(&pod, &["delete", "table", "inet", "ringway"]);
        nft(&pod, &["add", "table", "inet", "ringway"]);
        nft(
            &pod,
            &[
                "add", "chain", "inet", "ringway", "output", "{", "type", "filter", "hook",
                "output", "priority", "0", ";", "policy", "drop", ";", "}",
            ],
        );
        let d = drift_text(&pod, &spec);
        assert!(
            d.contains(&"nft chain inet ringway output differs: want type route hook output priority -150 policy accept, found type filter hook output priority 0 policy drop".to_string()),
            "{d:?}"
        );
        reapply();

        // The whole table.
        nft(&pod, &["delete", "table", "inet", "ringway"]);
        assert_eq!(drift(&pod, &spec), vec![Drift::TableMissing]);
        assert_eq!(
            Drift::TableMissing.to_string(),
            "nft table inet ringway missing"
        );
        reapply();

        // lo down also takes its local routes with it; apply brings both back.
        ip(&pod, &["link", "set", "lo", "down"]);
        let d = drift_text(&pod, &spec);
        assert!(d.contains(&"link lo is down".to_string()), "{d:?}");
        reapply();
        assert_routing_present(&pod);
    });
}

// --------------------------------------------------------- refused input

#[test]
fn bad_namespaces_are_refused() {
    run_isolated("bad_namespaces_are_refused", || {
        let spec = tproxy();
        // A regular file.
        let dir = ringway_testbed::TempDir::new("not-a-netns");
        let path = dir.join("file");
        std::fs::write(&path, b"x").unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let e = check_pod_netns(f.as_fd()).unwrap_err();
        assert!(matches!(e, RedirectError::NotANetns { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        let e = apply(f.as_fd(), &spec).unwrap_err();
        assert!(matches!(e, RedirectError::NotANetns { .. }), "{e}");
        let e = open_netns(&path).unwrap_err();
        assert!(matches!(e, RedirectError::NotANetns { .. }), "{e}");
        std::fs::remove_file(&path).unwrap();

        // A namespace, but not a network namespace.
        let e = open_netns(Path::new("/proc/thread-self/ns/mnt")).unwrap_err();
        assert!(
            matches!(e, RedirectError::NotANetns { ref found, .. } if found.starts_with("mnt:[")),
            "{e}"
        );

        // A bind-mounted namespace of another kind (the way /run/netns/<name>
        // pins a netns): /proc shows the mount path, not `uts:[...]`.
        let uts = Path::new(ringway_testbed::ns::NETNS_RUN_DIR).join("not-a-netns-uts");
        std::fs::write(&uts, b"").unwrap();
        nix::mount::mount(
            Some("/proc/thread-self/ns/uts"),
            &uts,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind-mount a uts namespace in the test's private mount namespace");
        let e = open_netns(&uts).unwrap_err();
        assert!(matches!(e, RedirectError::NotANetns { .. }), "{e}");
        assert!(e.to_string().contains("a namespace of another kind"), "{e}");
        nix::mount::umount2(&uts, nix::mount::MntFlags::MNT_DETACH).unwrap();

        // The caller's own netns and the process's (the machine's root netns).
        for p in ["/proc/thread-self/ns/net", "/proc/self/ns/net"] {
            let e = open_netns(Path::new(p)).unwrap_err();
            assert!(matches!(e, RedirectError::HostNetns { .. }), "{p}: {e}");
            assert!(e.to_string().contains(p), "{e}");
        }
        let own = std::fs::File::open("/proc/thread-self/ns/net").unwrap();
        for r in [
            apply(own.as_fd(), &spec).map(|_| ()),
            remove(own.as_fd(), &spec),
            verify(own.as_fd(), &spec).map(|_| ()),
        ] {
            assert!(matches!(r, Err(RedirectError::HostNetns { .. })), "{r:?}");
        }
        // Nothing landed in the test's own namespace.
        ringway_testbed::ns::require_nft();
        let out = std::process::Command::new("nft")
            .args(["list", "ruleset"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");

        // PID 1's netns: refused, either as the host netns or because even
        // root may not open it (sandboxes deny ptrace access to PID 1).
        match open_netns(Path::new("/proc/1/ns/net")) {
            Err(RedirectError::HostNetns { .. }) => {}
            Err(RedirectError::Io {
                ref what,
                ref source,
            }) if source.kind() == ErrorKind::PermissionDenied => {
                assert!(what.contains("/proc/1/ns/net"), "{what}");
            }
            other => panic!("/proc/1/ns/net must be refused, got {other:?}"),
        }

        // A path that does not exist.
        let missing = Path::new("/run/netns/no-such-pod");
        let e = open_netns(missing).unwrap_err();
        assert!(
            matches!(e, RedirectError::NetnsNotFound { ref path } if path == missing),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "network namespace /run/netns/no-such-pod not found"
        );

        // A real pod namespace path is accepted.
        let vn = VirtualNode::build(1, 1).unwrap();
        let fd = open_netns(vn.pod(0).netns.path()).expect("pod netns path");
        check_pod_netns(fd.as_fd()).expect("pod netns");
    });
}

#[test]
fn refused_batch_applies_nothing() {
    run_isolated("refused_batch_applies_nothing", || {
        let spec = tproxy();
        let vn = VirtualNode::build(1, 2).unwrap();
        let fresh = vn.pod(0).clone();

        let e = apply_with_extra_rule_for_test(
            fresh.netns.fd(),
            &spec,
            InjectedFault::UnknownExpression,
        )
        .unwrap_err();
        assert!(
            matches!(e, RedirectError::MissingKernelFeature { .. }),
            "{e}"
        );
        assert!(
            e.to_string().starts_with(
                "adding rule 4 of chain output (injected test fault: unknown expression ringway_no_such_expr)"
            ),
            "{e}"
        );
        // Nothing at all: no table, and the ip rules/routes were rolled back.
        assert_nothing_left(&fresh);
        let d = drift(&fresh, &spec);
        assert!(d.contains(&Drift::TableMissing), "{d:?}");
        assert_eq!(d.len(), 5, "{d:?}");

        let e = apply_with_extra_rule_for_test(fresh.netns.fd(), &spec, InjectedFault::BadRegister)
            .unwrap_err();
        assert!(matches!(e, RedirectError::Netlink { .. }), "{e}");
        assert!(
            e.to_string().starts_with(
                "adding rule 4 of chain output (injected test fault: cmp on register 99): "
            ),
            "{e}"
        );
        assert_nothing_left(&fresh);

        // On a pod with capture in place, a refused re-apply keeps it intact.
        let pod = vn.pod(1).clone();
        apply(pod.netns.fd(), &spec).unwrap();
        let before = nft(&pod, &["list", "ruleset"]);
        let e =
            apply_with_extra_rule_for_test(pod.netns.fd(), &redirect(), InjectedFault::BadRegister)
                .unwrap_err();
        assert!(matches!(e, RedirectError::Netlink { .. }), "{e}");
        assert_eq!(before, nft(&pod, &["list", "ruleset"]));
        assert_eq!(drift(&pod, &spec), vec![]);
        assert_routing_present(&pod);
    });
}

#[test]
fn invalid_spec_is_refused_before_touching_anything() {
    run_isolated("invalid_spec_is_refused_before_touching_anything", || {
        let vn = VirtualNode::build(1, 1).unwrap();
        let pod = vn.pod(0).clone();
        let bad = CaptureSpec {
            capture_mark: 0x539,
            ..tproxy()
        };
        let e = apply(pod.netns.fd(), &bad).unwrap_err();
        assert!(matches!(e, RedirectError::InvalidSpec(_)), "{e}");
        assert_nothing_left(&pod);
    });
}

#[test]
fn ipv6_disabled_pod_gets_ipv4_capture() {
    run_isolated("ipv6_disabled_pod_gets_ipv4_capture", || {
        let spec = tproxy();
        let vn = VirtualNode::build(1, 2).unwrap();
        let (p0, p1) = (vn.pod(0).clone(), vn.pod(1).clone());
        p1.netns
            .sysctl("net.ipv6.conf.all.disable_ipv6", "1")
            .unwrap();
        p1.netns
            .sysctl("net.ipv6.conf.lo.disable_ipv6", "1")
            .unwrap();
        apply(p1.netns.fd(), &spec).expect("apply without IPv6");
        assert_eq!(drift(&p1, &spec), vec![]);
        assert!(!ip(&p1, &["-6", "rule"]).contains("fwmark"));
        assert!(ip(&p1, &["-4", "rule"]).contains("fwmark 0x111/0xfff lookup 133"));
        inbound_tproxy_captured(&p0, &p1, false);
        remove(p1.netns.fd(), &spec).unwrap();
        assert_nothing_left(&p1);
    });
}

// ---------------------------------------------------------------- traffic

/// pod0 -> pod1:8080 lands on pod1's transparent listener on 15006 with the
/// original destination as local address and pod0's real IP as peer; the
/// app on 8080 never sees it.
fn inbound_tproxy_captured(p0: &Pod, p1: &Pod, v6: bool) {
    let app_addr = SocketAddr::new(p1.ip(v6), 8080);
    let app = listener(p1, app_addr);
    let l = tproxy_listener(p1, any_addr(v6, 15006));
    let srv = PayloadServer::start(l.try_clone().expect("listener clone"), 1);
    let got = p0
        .netns
        .run(|| client_exchange(connect(app_addr, SHORT)?, 200_000, 300_000))
        .expect("captured exchange");
    assert_eq!(got, 300_000);
    let rep = srv.next_report(SHORT).expect("report from 15006");
    assert_eq!(rep.received.as_ref().copied(), Ok(200_000));
    assert_eq!(
        rep.local, app_addr,
        "local address must be the original destination"
    );
    assert_eq!(rep.peer.ip(), p0.ip(v6), "peer must be pod0's real IP");
    assert_nothing_accepted(&app, "the app on 8080 (capture bypassed)");
}

/// An app can (re)listen on its port while an inbound TPROXYed connection to
/// that port is open, provided both the proxy's transparent listener and the
/// app set SO_REUSEADDR: the accepted child socket (local address pod1:port)
/// sits in the port's bind bucket (`__inet_inherit_port`).
fn app_can_rebind_during_inbound_connection(p0: &Pod, p1: &Pod, v6: bool) {
    for (port, proxy_reuse) in [(8090, true), (8091, false)] {
        let proxy = p1
            .netns
            .run(|| {
                let a = any_addr(v6, 15006);
                let s = Socket::new(Domain::for_address(a), Type::STREAM, None)?;
                s.set_reuse_address(proxy_reuse)?;
                s.set_ip_transparent(true)?;
                if v6 {
                    s.set_only_v6(true)?;
                }
                s.bind(&a.into())?;
                s.listen(16)?;
                Ok::<_, std::io::Error>(TcpListener::from(s))
            })
            .unwrap();
        let proxy = Listener::adopt(&p1.netns, proxy).expect("listener address");
        let dst = SocketAddr::new(p1.ip(v6), port);
        let c = connect_from(p0, dst, None).expect("inbound connect");
        let (s, _) = accept_within(&proxy, SHORT).expect("captured");
        assert_eq!(s.local_addr().unwrap(), dst);
        // std's TcpListener::bind sets SO_REUSEADDR, like most servers.
        let app = p1.netns.run(|| TcpListener::bind(any_addr(v6, port)));
        if proxy_reuse {
            app.expect("app must be able to listen while a proxied connection is open");
        } else {
            let e = app.expect_err("documents why the proxy listener needs SO_REUSEADDR");
            assert_eq!(e.kind(), ErrorKind::AddrInUse, "{e}");
        }
        ping(c, s);
    }
}

/// No listener on 15006: the SYN is dropped; nothing reaches the app.
///
/// The drop is proven by the kernel, not by the client's timeout (which
/// only says no answer came): a probe table in pod1 counts the SYNs to the
/// app's port before the capture chain (prerouting, priority raw) and after
/// it (input); they arrived, and none went past the capture chain.
fn inbound_fails_closed(p0: &Pod, p1: &Pod, v6: bool) {
    let app_addr = SocketAddr::new(p1.ip(v6), 8080);
    let app = listener(p1, app_addr);
    let probe = SynProbe::install(p1, 8080);
    let r = p0
        .netns
        .run(|| TcpStream::connect_timeout(&app_addr, DROPPED));
    let e = r.expect_err("connect must not succeed without the proxy");
    assert_eq!(
        e.kind(),
        ErrorKind::TimedOut,
        "SYN must be dropped, not refused: {e}"
    );
    let (arrived, delivered) = probe.counts();
    assert!(
        arrived >= 1,
        "no SYN to {app_addr} reached pod1: the timeout proves nothing"
    );
    assert_eq!(
        delivered, 0,
        "{delivered} of {arrived} SYNs to {app_addr} went past the capture chain"
    );
    probe.remove();
    assert_nothing_accepted(&app, "the app on 8080 with no proxy");
}

/// Counters on a pod's SYNs to one port: at prerouting before the capture
/// chain (`raw`, -300 < mangle -150) and at input (after it).
struct SynProbe<'a> {
    pod: &'a Pod,
}

impl<'a> SynProbe<'a> {
    const TABLE: &'static str = "syn_probe";

    fn install(pod: &'a Pod, port: u16) -> SynProbe<'a> {
        let port = port.to_string();
        nft(pod, &["add", "table", "inet", Self::TABLE]);
        for (chain, hook, prio) in [
            ("arrived", "prerouting", "raw"),
            ("delivered", "input", "filter"),
        ] {
            nft(
                pod,
                &[
                    "add",
                    "chain",
                    "inet",
                    Self::TABLE,
                    chain,
                    "{",
                    "type",
                    "filter",
                    "hook",
                    hook,
                    "priority",
                    prio,
                    ";",
                    "}",
                ],
            );
            nft(
                pod,
                &[
                    "add",
                    "rule",
                    "inet",
                    Self::TABLE,
                    chain,
                    "tcp",
                    "dport",
                    &port,
                    "tcp",
                    "flags",
                    "&",
                    "(syn|ack)",
                    "==",
                    "syn",
                    "counter",
                ],
            );
        }
        SynProbe { pod }
    }

    fn count(&self, chain: &str) -> u64 {
        let text = nft(self.pod, &["list", "chain", "inet", Self::TABLE, chain]);
        text.split_once("counter packets ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter in the probe chain {chain}: {text}"))
    }

    /// (SYNs seen at prerouting, SYNs seen at input).
    fn counts(&self) -> (u64, u64) {
        (self.count("arrived"), self.count("delivered"))
    }

    fn remove(self) {
        nft(self.pod, &["delete", "table", "inet", Self::TABLE]);
    }
}

/// pod1 -> pod0:9000 lands on 15001 in pod1 with SO_ORIGINAL_DST pod0:9000;
/// while it is open the app can still listen on 9000; a socket with the
/// proxy mark goes straight to pod0.
fn outbound_redirected(p0: &Pod, p1: &Pod, v6: bool) {
    let remote = SocketAddr::new(p0.ip(v6), 9000);
    let remote_srv = listener(p0, remote);
    let outbound = listener(p1, any_addr(v6, 15001));

    let c = connect_from(p1, remote, None).expect("outbound connect");
    let (s, peer) = accept_within(&outbound, SHORT).expect("accepted on 15001");
    assert_eq!(original_dst(&s, v6), remote);
    assert_eq!(peer, c.local_addr().unwrap());
    assert_nothing_accepted(&remote_srv, "pod0:9000 (outbound capture bypassed)");

    // The app can bind the remote's port while the proxied connection is
    // open: a REDIRECTed socket occupies 15001 on loopback, not 9000.
    let app_9000 = p1.netns.run(|| {
        let s = Socket::new(Domain::for_address(remote), Type::STREAM, None)?;
        if v6 {
            s.set_only_v6(true)?;
        }
        s.bind(&any_addr(v6, 9000).into())?;
        s.listen(16)?;
        Ok::<_, std::io::Error>(TcpListener::from(s))
    });
    app_9000.expect("app must be able to listen on 9000 while a proxied connection is open");
    ping(c, s);

    // The proxy's own upstream socket (SO_MARK 0x539) is not captured.
    let c = connect_from(p1, remote, Some(0x539)).expect("marked connect");
    let (s, peer) = accept_within(&remote_srv, SHORT).expect("pod0 sees the marked connection");
    assert_eq!(peer.ip(), p1.ip(v6));
    assert_nothing_accepted(&outbound, "15001 (marked socket captured)");
    ping(c, s);
}

/// Loopback and the pod's own IP are not captured; 15008 is not captured.
fn local_and_tunnel_not_captured(p0: &Pod, p1: &Pod, v6: bool) {
    let outbound = listener(p1, any_addr(v6, 15001));
    let lo = if v6 {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    };
    for dst in [SocketAddr::new(lo, 7000), SocketAddr::new(p1.ip(v6), 7001)] {
        let l = listener(p1, dst);
        let c = connect_from(p1, dst, None).expect("local connect");
        let (s, _) = accept_within(&l, SHORT).unwrap_or_else(|| panic!("{dst} not reached"));
        assert_eq!(s.local_addr().unwrap(), dst);
        ping(c, s);
    }
    assert_nothing_accepted(&outbound, "15001 (local traffic captured)");

    let tunnel = SocketAddr::new(p1.ip(v6), 15008);
    let l = tproxy_listener(p1, tunnel);
    let inbound = tproxy_listener(p1, any_addr(v6, 15006));
    let c = connect_from(p0, tunnel, None).expect("tunnel connect");
    let (s, peer) = accept_within(&l, SHORT).expect("15008 reached directly");
    assert_eq!(s.local_addr().unwrap(), tunnel);
    assert_eq!(peer.ip(), p0.ip(v6));
    assert_nothing_accepted(&inbound, "15006 (tunnel port captured)");
    ping(c, s);
}

/// The proxy's spoofed-source connection to the app (IP_TRANSPARENT + mark
/// 0x539, bound to pod0's IP) works both ways: the app sees pod0's IP and
/// its replies come back through connmark + the policy route.
fn spoofed_source_reaches_app(p0: &Pod, p1: &Pod, v6: bool) {
    let app_addr = SocketAddr::new(p1.ip(v6), 8081);
    let app = listener(p1, app_addr);
    let srv = PayloadServer::start(app.try_clone().expect("listener clone"), 1);
    let got = p1
        .netns
        .run(|| {
            let s = Socket::new(Domain::for_address(app_addr), Type::STREAM, None)?;
            s.set_ip_transparent(true)?;
            s.set_mark(0x539)?;
            s.bind(&SocketAddr::new(p0.ip(v6), 0).into())?;
            s.connect_timeout(&app_addr.into(), SHORT)?;
            client_exchange(s.into(), 150_000, 250_000)
        })
        .expect("spoofed-source exchange");
    assert_eq!(got, 250_000);
    let rep = srv.next_report(SHORT).expect("app report");
    assert_eq!(rep.received.as_ref().copied(), Ok(150_000));
    assert_eq!(
        rep.peer.ip(),
        p0.ip(v6),
        "the app must see the spoofed source"
    );
}

/// Kubelet probes (node-SNATed to the probe source) reach the app directly;
/// the node's own address is captured as a control.
fn probes_not_captured(
    vn: &VirtualNode,
    p1: &Pod,
    v6: bool,
    captured: &TcpListener,
    mode: CaptureMode,
) {
    let spec = CaptureSpec::default();
    let probe_ip = if v6 {
        IpAddr::V6(spec.probe_source_v6)
    } else {
        IpAddr::V4(spec.probe_source_v4)
    };
    let node_ip: IpAddr = if v6 {
        "fd00:244:1::1".parse().unwrap()
    } else {
        "10.244.1.1".parse().unwrap()
    };
    let plen = if v6 { "128" } else { "32" };
    let mut add = vec!["addr", "add"];
    let cidr = format!("{probe_ip}/{plen}");
    add.extend([cidr.as_str(), "dev", "br0"]);
    if v6 {
        add.push("nodad");
    }
    vn.node.ip(&add).expect("probe source on the node bridge");
    let app_addr = SocketAddr::new(p1.ip(v6), 8082);
    let app = listener(p1, app_addr);
    let probe = vn
        .node
        .run(|| {
            let s = Socket::new(Domain::for_address(app_addr), Type::STREAM, None)?;
            s.bind(&SocketAddr::new(probe_ip, 0).into())?;
            s.connect_timeout(&app_addr.into(), SHORT)?;
            Ok::<_, std::io::Error>(TcpStream::from(s))
        })
        .expect("probe connect");
    let (s, peer) = accept_within(&app, SHORT).expect("probe reaches the app directly");
    assert_eq!(peer.ip(), probe_ip);
    assert_nothing_accepted(captured, "15006 (probe captured)");
    ping(probe, s);

    let c = vn
        .node
        .run(|| TcpStream::connect_timeout(&app_addr, SHORT))
        .expect("node connect");
    let (s, peer) = accept_within(captured, SHORT).expect("node traffic is captured");
    assert_eq!(peer.ip(), node_ip);
    match mode {
        CaptureMode::Tproxy => assert_eq!(s.local_addr().unwrap(), app_addr),
        CaptureMode::Redirect => assert_eq!(original_dst(&s, v6), app_addr),
    }
    assert_nothing_accepted(&app, "the app (node traffic bypassed capture)");
    ping(c, s);
}

fn tproxy_traffic(v6: bool, test: &str) {
    run_isolated(test, || {
        let (vn, p0, p1) = node_with_capture(&tproxy());
        inbound_tproxy_captured(&p0, &p1, v6);
        inbound_fails_closed(&p0, &p1, v6);
        app_can_rebind_during_inbound_connection(&p0, &p1, v6);
        outbound_redirected(&p0, &p1, v6);
        local_and_tunnel_not_captured(&p0, &p1, v6);
        spoofed_source_reaches_app(&p0, &p1, v6);
        let inbound = tproxy_listener(&p1, any_addr(v6, 15006));
        probes_not_captured(&vn, &p1, v6, &inbound, CaptureMode::Tproxy);
        assert_eq!(drift(&p1, &tproxy()), vec![]);
    });
}

#[test]
fn tproxy_traffic_ipv4() {
    tproxy_traffic(false, "tproxy_traffic_ipv4");
}

#[test]
fn tproxy_traffic_ipv6() {
    tproxy_traffic(true, "tproxy_traffic_ipv6");
}

/// REDIRECT mode: inbound lands on a plain listener on 15006 with
/// SO_ORIGINAL_DST = pod1:8080; with no listener the client is refused and
/// the app sees nothing.
fn inbound_redirected(p0: &Pod, p1: &Pod, v6: bool) {
    let app_addr = SocketAddr::new(p1.ip(v6), 8080);
    let app = listener(p1, app_addr);
    let inbound = listener(p1, any_addr(v6, 15006));
    let c = connect_from(p0, app_addr, None).expect("inbound connect");
    let (s, peer) = accept_within(&inbound, SHORT).expect("accepted on 15006");
    assert_eq!(original_dst(&s, v6), app_addr);
    assert_eq!(peer.ip(), p0.ip(v6));
    assert_nothing_accepted(&app, "the app on 8080 (capture bypassed)");
    ping(c, s);
    drop(inbound);
    let e = connect_from(p0, app_addr, None).expect_err("no proxy: must not connect");
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
    assert_nothing_accepted(&app, "the app on 8080 with no proxy");
}

fn redirect_traffic(v6: bool, test: &str) {
    run_isolated(test, || {
        let (vn, p0, p1) = node_with_capture(&redirect());
        inbound_redirected(&p0, &p1, v6);
        outbound_redirected(&p0, &p1, v6);
        local_and_tunnel_not_captured(&p0, &p1, v6);
        spoofed_source_reaches_app(&p0, &p1, v6);
        let inbound = listener(&p1, any_addr(v6, 15006));
        probes_not_captured(&vn, &p1, v6, &inbound, CaptureMode::Redirect);
        assert_eq!(drift(&p1, &redirect()), vec![]);
    });
}

#[test]
fn redirect_traffic_ipv4() {
    redirect_traffic(false, "redirect_traffic_ipv4");
}

#[test]
fn redirect_traffic_ipv6() {
    redirect_traffic(true, "redirect_traffic_ipv6");
}

/// `net.ipv4.conf.*.src_valid_mark=1` (set by some CNIs) before and after
/// apply: TPROXY delivery and spoofed-source replies still work.
#[test]
fn tproxy_works_with_src_valid_mark() {
    run_isolated("tproxy_works_with_src_valid_mark", || {
        let spec = tproxy();
        let vn = VirtualNode::build(1, 2).unwrap();
        let (p0, p1) = (vn.pod(0).clone(), vn.pod(1).clone());
        let set = |v: &str| {
            for k in ["all", "default", "eth0", "lo"] {
                p1.netns
                    .sysctl(&format!("net/ipv4/conf/{k}/src_valid_mark"), v)
                    .unwrap();
            }
        };
        // Before apply.
        set("1");
        apply(p1.netns.fd(), &spec).unwrap();
        assert_eq!(drift(&p1, &spec), vec![]);
        inbound_tproxy_captured(&p0, &p1, false);
        spoofed_source_reaches_app(&p0, &p1, false);
        outbound_redirected(&p0, &p1, false);
        remove(p1.netns.fd(), &spec).unwrap();

        // After apply.
        set("0");
        apply(p1.netns.fd(), &spec).unwrap();
        set("1");
        assert_eq!(
            p1.netns
                .read_sysctl("net/ipv4/conf/eth0/src_valid_mark")
                .unwrap(),
            "1"
        );
        let p1b = p1.clone();
        inbound_tproxy_captured(&p0, &p1b, false);
        inbound_tproxy_captured(&p0, &p1b, true);
        spoofed_source_reaches_app(&p0, &p1b, false);
    });
}

/// After the capture is removed, traffic flows directly again.
#[test]
fn traffic_is_direct_after_remove() {
    run_isolated("traffic_is_direct_after_remove", || {
        let (_vn, p0, p1) = node_with_capture(&tproxy());
        remove(p1.netns.fd(), &tproxy()).unwrap();
        for v6 in [false, true] {
            let app_addr = SocketAddr::new(p1.ip(v6), 8080);
            let app = listener(&p1, app_addr);
            let c = connect_from(&p0, app_addr, None).expect("direct connect");
            let (s, peer) = accept_within(&app, SHORT).expect("app reached");
            assert_eq!(peer.ip(), p0.ip(v6));
            ping(c, s);
        }
    });
}

/// `TcpExtPAWSTimewait` and `TcpExtTCPSynRetrans` of the calling thread's
/// network namespace.
fn paws_and_syn_retrans(pod: &Pod) -> (u64, u64) {
    let text = pod
        .netns
        .run(|| std::fs::read_to_string("/proc/thread-self/net/netstat"))
        .expect("netstat");
    let lines: Vec<&str> = text.lines().collect();
    let get = |name: &str| -> u64 {
        for pair in lines.chunks(2) {
            let (keys, vals) = (pair[0].split_whitespace(), pair[1].split_whitespace());
            for (k, v) in keys.zip(vals) {
                if k == name {
                    return v.parse().expect("counter");
                }
            }
        }
        panic!("no {name} in /proc/net/netstat");
    };
    (get("PAWSTimewait"), get("TCPSynRetrans"))
}

/// The proxy closes first whenever the far side does, so its accepted
/// outbound sockets wait in TIME_WAIT. An app that reuses a source port for
/// another destination must never meet one of them: that SYN carries
/// timestamps of another 4-tuple, fails PAWS and is retried after a second
/// (what made the connection rate fall as a pod's TIME_WAIT sockets grew).
/// IPv4 outbound is DNATed to a loopback address keyed by the destination;
/// with one address for all (`redirect`) this test fails.
fn outbound_time_wait_is_kept_per_destination(p0: &Pod, p1: &Pod, v6: bool) {
    // conntrack forgets a closed connection after 1 s (not 120 s), as it
    // does under port pressure: nothing remaps the next connection's port
    // around the proxy's TIME_WAIT socket.
    p1.netns
        .sysctl("net/netfilter/nf_conntrack_tcp_timeout_time_wait", "1")
        .expect("conntrack TIME_WAIT timeout");
    let proxy = listener(p1, any_addr(v6, 15001));
    let before = paws_and_syn_retrans(p1);
    let mut seen: Vec<(SocketAddr, IpAddr)> = Vec::new();
    // 6 source ports, each used for 3 destinations in turn, then once more
    // for its first destination (the same 4-tuple may meet its own
    // TIME_WAIT, as without a proxy, and gets the same address).
    let sources: Vec<u16> = (0..6).map(|i| 41_000 + i).collect();
    for round in 0..4u16 {
        for (i, sport) in sources.iter().enumerate() {
            let dport = if round == 3 {
                9_100 + i as u16 * 3
            } else {
                9_100 + i as u16 * 3 + round
            };
            let remote = SocketAddr::new(p0.ip(v6), dport);
            let c = p1
                .netns
                .run(|| {
                    let s = Socket::new(Domain::for_address(remote), Type::STREAM, None)?;
                    s.set_reuse_address(true)?;
                    s.bind(&SocketAddr::new(p1.ip(v6), *sport).into())?;
                    s.connect_timeout(&remote.into(), SHORT)?;
                    Ok::<_, std::io::Error>(TcpStream::from(s))
                })
                .unwrap_or_else(|e| panic!("connect from :{sport} to {remote}: {e}"));
            let (mut s, _) = accept_within(&proxy, SHORT).expect("accepted on 15001");
            assert_eq!(original_dst(&s, v6), remote);
            let local = s.local_addr().unwrap().ip();
            match local {
                IpAddr::V4(a) if !v6 => assert!(a.is_loopback(), "{a} is not loopback"),
                IpAddr::V6(a) if v6 => assert_eq!(
                    a.segments()[..6],
                    [0xfd16, 0x9254, 0x7127, 0x1500, 0, 0],
                    "{a} is not in the outbound block"
                ),
                a => panic!("accepted on {a} (IPv6: {v6})"),
            }
            seen.push((remote, local));
            // The proxy side closes first (the far end did): TIME_WAIT here.
            s.write_all(b"x").unwrap();
            drop(s);
            let mut c = c;
            c.set_read_timeout(Some(SHORT)).unwrap();
            let mut b = Vec::new();
            c.read_to_end(&mut b).unwrap();
            assert_eq!(b, b"x");
        }
        std::thread::sleep(Duration::from_millis(1_300));
    }
    let after = paws_and_syn_retrans(p1);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (0, 0),
        "SYNs refused by a TIME_WAIT socket of the proxy (PAWS) / retransmitted"
    );
    // One address per destination, the same each time.
    for (r, l) in &seen {
        for (r2, l2) in &seen {
            if r == r2 {
                assert_eq!(l, l2, "{r} reached the proxy on {l} and on {l2}");
            }
        }
    }
    let mut locals: Vec<IpAddr> = seen.iter().map(|(_, l)| *l).collect();
    locals.sort();
    locals.dedup();
    assert!(
        locals.len() >= 17,
        "18 destinations share {} proxy addresses: {locals:?}",
        locals.len()
    );
}

#[test]
fn outbound_time_wait_is_kept_per_destination_tproxy() {
    run_isolated("outbound_time_wait_is_kept_per_destination_tproxy", || {
        let (_vn, p0, p1) = node_with_capture(&tproxy());
        outbound_time_wait_is_kept_per_destination(&p0, &p1, false);
    });
}

#[test]
fn outbound_time_wait_is_kept_per_destination_tproxy_ipv6() {
    run_isolated(
        "outbound_time_wait_is_kept_per_destination_tproxy_ipv6",
        || {
            let (_vn, p0, p1) = node_with_capture(&tproxy());
            outbound_time_wait_is_kept_per_destination(&p0, &p1, true);
        },
    );
}

#[test]
fn outbound_time_wait_is_kept_per_destination_redirect() {
    run_isolated(
        "outbound_time_wait_is_kept_per_destination_redirect",
        || {
            let (_vn, p0, p1) = node_with_capture(&redirect());
            outbound_time_wait_is_kept_per_destination(&p0, &p1, false);
        },
    );
}

#[test]
fn outbound_time_wait_is_kept_per_destination_redirect_ipv6() {
    run_isolated(
        "outbound_time_wait_is_kept_per_destination_redirect_ipv6",
        || {
            let (_vn, p0, p1) = node_with_capture(&redirect());
            outbound_time_wait_is_kept_per_destination(&p0, &p1, true);
        },
    );
}
