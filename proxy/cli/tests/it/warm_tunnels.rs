//! An upgrade's warm-up (`ringway proxy --state-dir`): the proxy records
//! the tunnels it holds, and the proxy started beside it with the same
//! state directory dials them before it reports ready, so it holds them
//! before its first connection, whether its pods come on the command line
//! (`--pod`) or from the agent over ZDS (the warm-up runs when the first
//! snapshot is applied). A malformed or oversized record, or one
//! with an invalid entry, is refused with an error naming why, and nothing
//! is dialled.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringway_testbed::http::scrape;
use ringway_testbed::mesh::{workloads_yaml, WorkloadYaml};
use ringway_testbed::{prom, run_isolated, wait_for, Pod, TempDir, VirtualNode};

use crate::support::{ready, serve_snapshots, Proc};

const WAIT: Duration = Duration::from_secs(30);

/// HBONE between the node's two pods (fast path off), two workers; `zds`:
/// the workloads as the ZDS agent (`serve_snapshots`) names them.
fn mesh_config(dir: &Path, a: &Pod, b: &Pod, zds: bool) -> PathBuf {
    ringway_identity::CaSigner::generate_for_tests("cluster.local")
        .write_pem_files(&dir.join("ca.crt"), &dir.join("ca.key"))
        .unwrap();
    let workloads = if zds {
        [a, b].map(|p| WorkloadYaml::of_pod(p, &p.name, "default", "default", "node1"))
    } else {
        [
            WorkloadYaml::of_pod(a, "uid-a", "test", "a", "node1"),
            WorkloadYaml::of_pod(b, "uid-b", "test", "b", "node1"),
        ]
    };
    let config = dir.join("proxy.yaml");
    std::fs::write(
        &config,
        format!(
            "proxy:\n  sameNodeFastPath: false\n  workers: 2\n  drainPeriod: 2\ntrustDomain: cluster.local\nca:\n  certFile: {}\n  keyFile: {}\n{}",
            dir.join("ca.crt").display(),
            dir.join("ca.key").display(),
            workloads_yaml(&workloads)
        ),
    )
    .unwrap();
    config
}

/// Where a proxy gets its pods.
#[derive(Clone, Copy)]
enum Pods<'a> {
    /// `--pod uid-a=<netns> --pod uid-b=<netns>`.
    Flags(&'a Pod, &'a Pod),
    /// An agent's ZDS socket.
    Zds(&'a Path),
}

/// `ringway proxy` for both pods with `state` as its state directory, its
/// control endpoints on `host` (readiness on `ready_port`), its log in `log`.
fn proxy(config: &Path, state: &Path, pods: Pods, host: &str, ready_port: u16, log: &Path) -> Proc {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ringway"));
    c.args(["--log-format", "text", "--log", "warn", "proxy", "--config"])
        .arg(config)
        .arg("--state-dir")
        .arg(state)
        .args(["--readiness-addr", &format!("127.0.0.1:{ready_port}")])
        .args(["--metrics-addr", &format!("{host}:15020")])
        .args(["--admin-addr", &format!("{host}:15000")]);
    match pods {
        Pods::Flags(a, b) => c
            .arg("--pod")
            .arg(format!("uid-a={}", a.netns.path().display()))
            .arg("--pod")
            .arg(format!("uid-b={}", b.netns.path().display())),
        Pods::Zds(socket) => c.arg("--zds-socket").arg(socket),
    };
    Proc(
        c.stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("spawn ringway proxy"),
    )
}

/// The proxy's `ringway_hbone_pool_connections`; panics with the reason
/// when the page cannot be scraped or lacks it (never reads as 0).
fn pool_connections(host: &str) -> f64 {
    let m = scrape(format!("{host}:15020").parse().unwrap())
        .unwrap_or_else(|e| panic!("scraping {host}:15020/metrics: {e}"));
    prom::value(&m, "ringway_hbone_pool_connections", &[])
        .unwrap_or_else(|| panic!("{host}:15020/metrics has no ringway_hbone_pool_connections"))
}

fn echo_once(from: &Pod, addr: SocketAddr) {
    from.netns.run(|| {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"ping").unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"ping");
    });
}

fn node() -> (VirtualNode, Pod, Pod) {
    let vn = VirtualNode::build(1, 2).unwrap();
    let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
    let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings::default());
    for p in [&a, &b] {
        ringway_redirect::apply(p.netns.fd(), &spec).unwrap();
    }
    (vn, a, b)
}

#[test]
fn new_proxy_holds_the_old_ones_tunnels_before_its_first_connection() {
    run_isolated(
        "new_proxy_holds_the_old_ones_tunnels_before_its_first_connection",
        || warm_restart(false),
    );
}

/// Under ZDS: the warm-up runs when the agent's first snapshot is applied,
/// before readiness, so the new proxy holds the tunnels before its first
/// connection here too.
#[test]
fn new_proxy_under_zds_holds_the_old_ones_tunnels_before_its_first_connection() {
    run_isolated(
        "new_proxy_under_zds_holds_the_old_ones_tunnels_before_its_first_connection",
        || warm_restart(true),
    );
}

/// The old proxy serves a connection a -> b (a tunnel), records it; a new
/// proxy with the same state directory, pods from the same source (`zds`:
/// an agent's snapshots, else `--pod`), holds tunnels once ready, before
/// any connection went through it; the old one drains and exits cleanly.
fn warm_restart(zds: bool) {
    let dir = TempDir::new(if zds {
        "warm-tunnels-zds"
    } else {
        "warm-tunnels"
    });
    let (_vn, a, b) = node();
    let config = mesh_config(&dir, &a, &b, zds);
    let state = dir.join("state");
    let sock = dir.join("zds.sock");
    let stop = Arc::new(AtomicBool::new(false));
    let agent = zds.then(|| serve_snapshots(&sock, vec![a.clone(), b.clone()], stop.clone()));
    let pods = if zds {
        Pods::Zds(&sock)
    } else {
        Pods::Flags(&a, &b)
    };
    let old = proxy(
        &config,
        &state,
        pods,
        "127.0.0.1",
        15021,
        &dir.join("old.log"),
    );
    wait_for("the old proxy's readiness", WAIT, || {
        ready("127.0.0.1:15021".parse().unwrap())
    });
    let addr = SocketAddr::new(b.ip(false), 8080);
    let l = b
        .netns
        .run(|| ringway_testbed::traffic::listen(addr))
        .unwrap();
    let _echo = ringway_testbed::traffic::EchoServer::start(l);
    echo_once(&a, addr);
    let pooled = pool_connections("127.0.0.1");
    assert!(
        pooled >= 1.0,
        "{pooled} tunnels after an echo through the old proxy"
    );
    // The record names the tunnel a -> b:15008.
    let record = state.join("tunnels.json");
    let tunnel = format!("{}:15008", b.ipv4);
    wait_for("the old proxy's tunnel record", WAIT, || {
        std::fs::read_to_string(&record).is_ok_and(|r| r.contains(&tunnel))
    });
    let new = proxy(
        &config,
        &state,
        pods,
        "127.0.0.2",
        15022,
        &dir.join("new.log"),
    );
    wait_for("the new proxy's readiness", WAIT, || {
        ready("127.0.0.1:15022".parse().unwrap())
    });
    // Ready, and no connection has gone through it yet: at least
    // one tunnel per worker, dialled from the record (more when a
    // dial reached the old proxy's server end, which shares the
    // peer's tunnel port until it drains, and was made again).
    let held = pool_connections("127.0.0.2");
    assert!(
        held >= 2.0,
        "{held} tunnels; new proxy's log: {}",
        std::fs::read_to_string(dir.join("new.log")).unwrap_or_default()
    );
    let status = old.sigterm_and_wait();
    assert!(status.success(), "old proxy exit: {status}");
    echo_once(&a, addr);
    drop(new);
    stop.store(true, Ordering::SeqCst);
    if let Some(agent) = agent {
        agent.join().unwrap();
    }
}

#[test]
fn a_bad_tunnel_record_is_refused_with_its_reason_and_dials_nothing() {
    run_isolated(
        "a_bad_tunnel_record_is_refused_with_its_reason_and_dials_nothing",
        || {
            let dir = TempDir::new("warm-bad-record");
            let (_vn, a, b) = node();
            let config = mesh_config(&dir, &a, &b, false);
            // A valid entry (the tunnel a -> b the mesh plans): each bad
            // record below would dial it if it were read.
            let good = format!(
                r#"{{"src_ip":"{}","src_identity":"spiffe://cluster.local/ns/test/sa/a","dst":"{}:15008","dst_identity":"spiffe://cluster.local/ns/test/sa/b"}}"#,
                a.ipv4, b.ipv4
            );
            let bad_port = good.replace(":15008", ":8080");
            let cases = [
                (
                    "malformed",
                    format!(r#"{{"version":1,"tunnels":[{good}"#),
                    "is malformed",
                ),
                (
                    "oversized",
                    format!(
                        r#"{{"version":1,"tunnels":[{good}]}}{}"#,
                        " ".repeat(70_000)
                    ),
                    "is over 65536 bytes",
                ),
                (
                    "bad-entry",
                    format!(r#"{{"version":1,"tunnels":[{good},{bad_port}]}}"#),
                    "entry 1: the peer address is not a tunnel port",
                ),
            ];
            for (i, (name, text, reason)) in cases.iter().enumerate() {
                let state = dir.join(name);
                std::fs::create_dir_all(&state).unwrap();
                std::fs::write(state.join("tunnels.json"), text).unwrap();
                let log = dir.join(format!("{name}.log"));
                let port = 15031 + i as u16;
                let p = proxy(
                    &config,
                    &state,
                    Pods::Flags(&a, &b),
                    "127.0.0.1",
                    port,
                    &log,
                );
                wait_for("the proxy's readiness", WAIT, || {
                    ready(format!("127.0.0.1:{port}").parse().unwrap())
                });
                let text = std::fs::read_to_string(&log).unwrap();
                assert!(
                    text.contains("tunnel record refused") && text.contains(reason),
                    "{name}: log without the refusal ({reason}): {text}"
                );
                assert_eq!(pool_connections("127.0.0.1"), 0.0, "{name}");
                drop(p);
            }
        },
    );
}
