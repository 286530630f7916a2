//! The proxy's ZDS client against a scripted agent speaking the wire
//! protocol: snapshot, live Add/Del, readiness, and every kind of bad input.

use crate::common;

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{
    accept, bind, listen, socket, AddressFamily, Backlog, MsgFlags, SockFlag, SockType, UnixAddr,
};
use ringway_config::{CaptureMode, Datapath};
use ringway_proxy::control::ControlServer;
use ringway_proxy::zds_client::{self, Readiness, ZdsClientConfig};
use ringway_proxy::Proxy;
use ringway_testbed::{run_isolated, wait_for, TempDir, VirtualNode};
use ringway_zds::{
    self as zds, workload_request::Payload, AddWorkload, DelWorkload, KeepWorkload, SnapshotSent,
    WorkloadInfo,
};

struct FakeAgent {
    listener: OwnedFd,
    path: PathBuf,
}

impl FakeAgent {
    fn new(dir: &std::path::Path) -> FakeAgent {
        let path = dir.join("zds.sock");
        let _ = std::fs::remove_file(&path);
        let fd = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &UnixAddr::new(&path).unwrap(),
        )
        .unwrap();
        listen(&fd, Backlog::new(8).unwrap()).unwrap();
        FakeAgent { listener: fd, path }
    }

    /// Accepts the proxy and checks its hello.
    fn accept(&self) -> Conn {
        let raw = accept(std::os::fd::AsRawFd::as_raw_fd(&self.listener)).unwrap();
        // SAFETY: `accept` just returned `raw`: open, and owned by nothing else.
        let fd = unsafe { ringway_proxy::sys::adopt_received_fd(raw) }.unwrap();
        let tv = nix::sys::time::TimeVal::new(10, 0);
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv).unwrap();
        let c = Conn { fd };
        let p = zds::recv(c.fd.as_fd(), &zds::refuse_fd).unwrap();
        zds::decode_hello(&p.bytes).unwrap();
        c
    }
}

struct Conn {
    fd: OwnedFd,
}

impl Conn {
    fn ask(&self, p: Payload, netns: Option<&OwnedFd>) -> Result<(), String> {
        zds::send(self.fd.as_fd(), &zds::request(p), netns.map(|f| f.as_fd())).unwrap();
        self.answer()
    }

    fn answer(&self) -> Result<(), String> {
        let p = zds::recv(self.fd.as_fd(), &zds::refuse_fd).unwrap();
        match zds::decode_response(&p.bytes).unwrap() {
            zds::Answer::Ack => Ok(()),
            zds::Answer::Nack(reason) => Err(reason),
        }
    }

    fn raw(&self, bytes: &[u8]) -> Result<(), String> {
        nix::sys::socket::send(
            std::os::fd::AsRawFd::as_raw_fd(&self.fd),
            bytes,
            MsgFlags::empty(),
        )
        .unwrap();
        self.answer()
    }
}

fn add(uid: &str) -> Payload {
    Payload::Add(AddWorkload {
        uid: uid.into(),
        workload_info: Some(WorkloadInfo {
            name: format!("{uid}-name"),
            namespace: "default".into(),
            service_account: "sa".into(),
        }),
        // None: the proxy falls back to the netns's addresses.
        addresses: Vec::new(),
    })
}

fn http_ready(addr: SocketAddr) -> (u16, String) {
    let r = ringway_testbed::http::get(addr, "/healthz/ready").unwrap();
    (r.status, r.body)
}

/// How long a readiness change may take.
const WAIT: Duration = Duration::from_secs(10);

struct Running {
    proxy: Arc<Proxy>,
    ready: Arc<Readiness>,
    control: ControlServer,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start_proxy(socket: PathBuf) -> Running {
    common::init_logs();
    let proxy =
        Arc::new(Proxy::start(common::settings(CaptureMode::Tproxy, Datapath::Auto)).unwrap());
    let ready = Arc::new(Readiness::default());
    let control = ControlServer::start("127.0.0.1:0".parse().unwrap(), ready.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut cfg = ZdsClientConfig::new(socket);
    cfg.retry_every = Duration::from_millis(100);
    let (p, r, s) = (proxy.clone(), ready.clone(), stop.clone());
    let thread = std::thread::spawn(move || zds_client::run(p, cfg, r, s));
    Running {
        proxy,
        ready,
        control,
        stop,
        thread: Some(thread),
    }
}

#[test]
fn snapshot_then_live_add_and_del_with_readiness() {
    run_isolated("snapshot_then_live_add_and_del_with_readiness", || {
        let dir = TempDir::new("zds1");
        let vn = VirtualNode::build(1, 3).unwrap();
        for p in &vn.pods {
            common::capture(p, CaptureMode::Tproxy);
        }
        let agent = FakeAgent::new(&dir);
        let run = start_proxy(agent.path.clone());
        let conn = agent.accept();
        // Before the snapshot: not ready.
        let (code, body) = http_ready(run.control.addr);
        assert_eq!(code, 503, "{body}");
        assert!(
            body.contains("waiting for the node agent's snapshot"),
            "{body}"
        );
        conn.ask(add("pod-a"), Some(&vn.pod(0).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(
            Payload::Keep(KeepWorkload {
                uid: "pod-gone".into(),
            }),
            None,
        )
        .unwrap();
        assert_eq!(http_ready(run.control.addr).0, 503);
        conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap();
        let (code, body) = http_ready(run.control.addr);
        assert_eq!((code, body.as_str()), (200, "ready\n"));
        let pods = run.proxy.pods();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].identity.name, "pod-a-name");
        assert_eq!(pods[0].netns_inode, vn.pod(0).netns.inode());
        // Live Add, idempotent re-Add, then Del: listeners gone at once.
        conn.ask(add("pod-b"), Some(&vn.pod(1).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(add("pod-b"), Some(&vn.pod(1).netns.dup_fd().unwrap()))
            .unwrap();
        assert_eq!(run.proxy.pods().len(), 2);
        let listening = |pod: &ringway_testbed::Pod| {
            pod.netns
                .exec("ss", &["-Htln", "sport = :15006"])
                .unwrap()
                .lines()
                .count()
        };
        assert!(listening(vn.pod(1)) > 0);
        conn.ask(
            Payload::Del(DelWorkload {
                uid: "pod-b".into(),
            }),
            None,
        )
        .unwrap();
        assert_eq!(
            listening(vn.pod(1)),
            0,
            "pod-b's listeners must be gone when Del is acked"
        );
        assert!(listening(vn.pod(0)) > 0, "other pods untouched");
        assert_eq!(run.proxy.pods().len(), 1);
    });
}

#[test]
fn a_new_snapshot_tears_down_pods_it_does_not_name() {
    run_isolated("a_new_snapshot_tears_down_pods_it_does_not_name", || {
        let dir = TempDir::new("zds2");
        let vn = VirtualNode::build(1, 2).unwrap();
        let agent = FakeAgent::new(&dir);
        let run = start_proxy(agent.path.clone());
        let conn = agent.accept();
        conn.ask(add("a"), Some(&vn.pod(0).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(add("b"), Some(&vn.pod(1).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap();
        assert_eq!(run.proxy.pods().len(), 2);
        // The agent restarts: the proxy reconnects and gets a snapshot naming only `a`.
        drop(conn);
        let conn = agent.accept();
        conn.ask(add("a"), Some(&vn.pod(0).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap();
        let uids: Vec<_> = run.proxy.pods().into_iter().map(|p| p.uid).collect();
        assert_eq!(uids, vec!["a".to_string()]);
        assert!(run.ready.is_ready());
    });
}

#[test]
fn bad_input_is_nacked_never_crashes() {
    run_isolated("bad_input_is_nacked_never_crashes", || {
        let dir = TempDir::new("zds3");
        let vn = VirtualNode::build(1, 1).unwrap();
        let agent = FakeAgent::new(&dir);
        let run = start_proxy(agent.path.clone());
        let conn = agent.accept();
        // Garbage.
        let e = conn.raw(&[0xff, 0xfe, 0xfd]).unwrap_err();
        assert!(
            e.starts_with("ZDS packet is not a valid WorkloadRequest"),
            "{e}"
        );
        // Truncated (larger than 1 KiB).
        let e = conn.raw(&[0u8; 3000]).unwrap_err();
        assert_eq!(e, "ZDS packet truncated: larger than 1024 bytes");
        // Add without an fd.
        let e = conn.ask(add("x"), None).unwrap_err();
        assert_eq!(e, "ZDS Add for pod x carried no network namespace fd");
        // Add whose fd is not a netns.
        let file = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let e = conn.ask(add("y"), Some(&file)).unwrap_err();
        assert!(e.contains("pod y: fd is not a network namespace"), "{e}");
        // Add with the proxy's own (host) netns.
        let own = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net").unwrap());
        let e = conn.ask(add("z"), Some(&own)).unwrap_err();
        assert!(e.contains("refusing the host network namespace"), "{e}");
        assert!(run.proxy.pods().is_empty(), "nothing half-added");
        // A good pod still works on the same connection.
        conn.ask(add("good"), Some(&vn.pod(0).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap();
        assert!(run.ready.is_ready());
        // Keep after the snapshot: protocol error, unready, connection ended.
        let e = conn
            .ask(Payload::Keep(KeepWorkload { uid: "good".into() }), None)
            .unwrap_err();
        assert_eq!(e, "Keep for pod good after the snapshot");
        assert!(!run.ready.is_ready());
        // The proxy reconnects; a second SnapshotSent is refused the same way.
        let conn = agent.accept();
        conn.ask(add("good"), Some(&vn.pod(0).netns.dup_fd().unwrap()))
            .unwrap();
        conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap();
        wait_for("ready after a clean snapshot", WAIT, || {
            run.ready.is_ready()
        });
        let e = conn
            .ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap_err();
        assert_eq!(e, "second SnapshotSent");
        assert_eq!(run.proxy.pods().len(), 1, "the pod kept serving throughout");
    });
}

#[test]
fn a_pod_whose_listeners_fail_is_nacked_and_retried() {
    run_isolated("a_pod_whose_listeners_fail_is_nacked_and_retried", || {
        let dir = TempDir::new("zds4");
        let vn = VirtualNode::build(1, 1).unwrap();
        let pod = vn.pod(0).clone();
        // Something else holds 15001 in the pod without SO_REUSEPORT.
        let blocker = pod
            .netns
            .run(|| std::net::TcpListener::bind("0.0.0.0:15001"))
            .unwrap();
        let agent = FakeAgent::new(&dir);
        let run = start_proxy(agent.path.clone());
        let conn = agent.accept();
        let e = conn
            .ask(add("p"), Some(&pod.netns.dup_fd().unwrap()))
            .unwrap_err();
        assert!(
            e.contains("cannot create outbound listener on 0.0.0.0:15001"),
            "{e}"
        );
        conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
            .unwrap();
        let (code, body) = http_ready(run.control.addr);
        assert_eq!(code, 503);
        assert!(body.contains("pods pending: p"), "{body}");
        drop(blocker);
        wait_for("the pending pod to be retried", WAIT, || {
            run.ready.is_ready()
        });
        assert_eq!(run.proxy.pods().len(), 1);
    });
}

fn add_with(uid: &str, addresses: &[std::net::IpAddr]) -> Payload {
    let Payload::Add(mut a) = add(uid) else {
        unreachable!()
    };
    a.addresses = addresses.iter().map(|ip| ip.to_string()).collect();
    Payload::Add(a)
}

/// The pod's addresses come from the agent's `Add` (ringway's field 1001),
/// not from the netns the pod controls; a second pod claiming an address
/// another holds is nacked with `AddressConflict`, and one in another
/// pod's netns with `NetnsConflict`, also when a restarted proxy replays
/// the snapshot; the first is served once the holder is deleted.
#[test]
fn adversarial_conflicting_add_is_nacked() {
    run_isolated("adversarial_conflicting_add_is_nacked", || {
        let dir = TempDir::new("zds5");
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0), vn.pod(1));
        // Pod a's netns also holds b's address: ignored, the agent says.
        a.netns
            .ip(&["addr", "add", &format!("{}/32", b.ipv4), "dev", "eth0"])
            .unwrap();
        let agent = FakeAgent::new(&dir);
        for round in 0..2 {
            // Round 1 is a restarted proxy replaying the agent's snapshot.
            let run = start_proxy(agent.path.clone());
            let conn = agent.accept();
            conn.ask(
                add_with("a", &[a.ip(false), a.ip(true)]),
                Some(&a.netns.dup_fd().unwrap()),
            )
            .unwrap();
            // The agent's own record is wrong (stale): b claims a's address.
            let e = conn
                .ask(
                    add_with("b", &[b.ip(false), a.ip(true)]),
                    Some(&b.netns.dup_fd().unwrap()),
                )
                .unwrap_err();
            assert_eq!(
                e,
                format!(
                    "pod b: address {} is already held by pod a; refusing the pod",
                    a.ip(true)
                ),
                "round {round}"
            );
            // Another uid in a's netns (a runtime's mistake, or an agent
            // that lost track): nacked naming a, which keeps its listeners.
            let e = conn
                .ask(
                    add_with("d", &[b.ip(false), b.ip(true)]),
                    Some(&a.netns.dup_fd().unwrap()),
                )
                .unwrap_err();
            assert_eq!(
                e,
                format!(
                    "pod d: its network namespace net:[{}] is pod a's; refusing the pod",
                    a.netns.inode()
                ),
                "round {round}"
            );
            // The agent gives it up (it is no longer retried).
            conn.ask(Payload::Del(DelWorkload { uid: "d".into() }), None)
                .unwrap();
            conn.ask(Payload::SnapshotSent(SnapshotSent {}), None)
                .unwrap();
            let (code, body) = http_ready(run.control.addr);
            assert_eq!(code, 503, "round {round}");
            assert!(body.contains("pods pending: b"), "round {round}: {body}");
            let pods = run.proxy.pods();
            assert_eq!(pods.len(), 1, "round {round}: {pods:?}");
            assert_eq!(
                pods[0].ips,
                vec![a.ip(false), a.ip(true)],
                "the agent's, not the netns's"
            );
            assert_eq!(pods[0].ips_source, ringway_proxy::AddressSource::Agent);
            // Junk in the addresses is named in the nack.
            let Payload::Add(mut junk) = add("c") else {
                unreachable!()
            };
            junk.addresses = vec!["10.0.0.0/8".into()];
            let e = conn
                .ask(Payload::Add(junk), Some(&b.netns.dup_fd().unwrap()))
                .unwrap_err();
            assert_eq!(
                e,
                "ZDS Add for pod c: addresses[0] \"10.0.0.0/8\" is not an IP address"
            );
            if round == 1 {
                // The holder goes: the refused pod is retried and served.
                conn.ask(Payload::Del(DelWorkload { uid: "a".into() }), None)
                    .unwrap();
                wait_for("the conflicting pod to be served", WAIT, || {
                    run.ready.is_ready()
                });
                let uids: Vec<_> = run.proxy.pods().into_iter().map(|p| p.uid).collect();
                assert_eq!(uids, vec!["b".to_string()]);
            }
            // Stop this proxy before the agent's end closes: a client that
            // saw the close first would reconnect, and the next round would
            // accept that stale connection instead of the new proxy's.
            drop(run);
            drop(conn);
        }
    });
}

/// A pod first added without addresses (an older agent: the netns's, which
/// here include a neighbour's address the pod put on its eth0) takes the
/// agent's once it sends them for the same netns; the same addresses again
/// change nothing.
#[test]
fn agent_addresses_replace_the_netns_fallback() {
    run_isolated("agent_addresses_replace_the_netns_fallback", || {
        let dir = TempDir::new("zds6");
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0), vn.pod(1));
        a.netns
            .ip(&["addr", "add", &format!("{}/32", b.ipv4), "dev", "eth0"])
            .unwrap();
        let agent = FakeAgent::new(&dir);
        let run = start_proxy(agent.path.clone());
        let conn = agent.accept();
        conn.ask(add("a"), Some(&a.netns.dup_fd().unwrap()))
            .unwrap();
        let pod = &run.proxy.pods()[0];
        assert_eq!(pod.ips_source, ringway_proxy::AddressSource::Netns);
        assert!(pod.ips.contains(&b.ip(false)), "{:?}", pod.ips);
        let mine = [a.ip(false), a.ip(true)];
        for _ in 0..2 {
            conn.ask(add_with("a", &mine), Some(&a.netns.dup_fd().unwrap()))
                .unwrap();
            let pod = &run.proxy.pods()[0];
            assert_eq!(pod.ips, mine.to_vec());
            assert_eq!(pod.ips_source, ringway_proxy::AddressSource::Agent);
        }
        // Now b's address is free for b.
        conn.ask(
            add_with("b", &[b.ip(false)]),
            Some(&b.netns.dup_fd().unwrap()),
        )
        .unwrap();
        assert_eq!(run.proxy.pods().len(), 2);
    });
}
