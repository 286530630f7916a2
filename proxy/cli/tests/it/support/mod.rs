//! Helpers shared by the process-level drills.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use nix::sys::socket::{
    accept, bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
};
use ringway_testbed::Pod;
use ringway_zds::{
    self as zds, workload_request::Payload, AddWorkload, SnapshotSent, WorkloadInfo,
};

/// Held by each drill (the process-level load tests of `drill_cni` and
/// `drill_proxy_restart`) for its whole run, so no two drills run at once:
/// each loads the machine, and their packets share the kernel's per-CPU
/// input queue (`netdev_max_backlog`, one queue for every netns on a CPU).
/// A drill's bursts can overflow it (a broadcast on `drill_cni`'s bridge
/// of 200 pods is queued once per port), and a drill beside it would then
/// lose packets to a burst it did not make.
static DRILLS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes [`DRILLS`] (a drill that panicked does not poison it for the rest).
/// Take it before `run_isolated`, never inside: the isolated body holds
/// the test bed's shared gate, and an `alone` test waiting on that gate
/// would otherwise deadlock with a drill that holds this lock.
pub fn one_drill_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    DRILLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the readiness endpoint at `addr` answers 200.
pub fn ready(addr: SocketAddr) -> bool {
    ringway_testbed::http::get(addr, "/healthz/ready").is_ok_and(|r| r.status == 200)
}

/// Whether the agent's liveness endpoint at `addr` answers 200 (it serves,
/// with or without a proxy).
pub fn live(addr: SocketAddr) -> bool {
    ringway_testbed::http::get(addr, "/healthz/live").is_ok_and(|r| r.status == 200)
}

/// A child process, killed (and reaped) when dropped unless it already exited.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Proc {
    /// SIGTERM, then waits for the exit.
    pub fn sigterm_and_wait(mut self) -> std::process::ExitStatus {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        self.0.wait().unwrap()
    }
}

/// `ringway agent` as the drills run it: its sockets (`zds.sock`, `cni.sock`)
/// and its record of pods (`state/pods.json`, never the node's
/// /var/run/ringway-agent) in `dir`, namespaces from `netns_dir`, node
/// `node1`, text logs at info to `log`. Add flags, then spawn.
pub fn agent_command(
    dir: &std::path::Path,
    netns_dir: &std::path::Path,
    log: &std::path::Path,
) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ringway"));
    c.args(["--log-format", "text", "--log", "info", "agent"])
        .arg("--zds-socket")
        .arg(dir.join("zds.sock"))
        .arg("--cni-socket")
        .arg(dir.join("cni.sock"))
        .arg("--state-file")
        .arg(dir.join("state/pods.json"))
        .arg("--netns-dir")
        .arg(netns_dir)
        .args(["--node-name", "node1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    c
}

/// `ringway agent` as the two-node drills run it: node `n`'s sockets
/// (`node{n}-zds.sock`, `node{n}-cni.sock`) and its record of pods
/// (`node{n}-state/pods.json`) in `dir`, the test bed's namespaces, node
/// `node{n}`, metrics on `127.0.0.{n}:15022`, the `demo` namespace's pods as
/// `default`, text logs at info to `log`. Add flags, then spawn.
pub fn node_agent_command(
    dir: &std::path::Path,
    n: u8,
    log: &std::path::Path,
) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ringway"));
    c.args(["--log-format", "text", "--log", "info", "agent"])
        .arg("--zds-socket")
        .arg(dir.join(format!("node{n}-zds.sock")))
        .arg("--cni-socket")
        .arg(dir.join(format!("node{n}-cni.sock")))
        .arg("--state-file")
        .arg(dir.join(format!("node{n}-state/pods.json")))
        .args(["--netns-dir", ringway_testbed::ns::NETNS_RUN_DIR])
        .args(["--node-name", &format!("node{n}")])
        .args(["--pod-service-account", "demo=default"])
        .args(["--metrics-addr", &format!("127.0.0.{n}:15022")])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    c
}

/// `ringway proxy` as the two-node drills run it: node `n`'s agent socket
/// (`node{n}-zds.sock` in `dir`), readiness, metrics and admin on
/// `127.0.0.{n}` (15021, 15020, 15000), the configuration file `config`,
/// text logs at info to `log`. Add flags, then spawn.
pub fn node_proxy_command(
    dir: &std::path::Path,
    n: u8,
    config: &std::path::Path,
    log: &std::path::Path,
) -> std::process::Command {
    let ip = format!("127.0.0.{n}");
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_ringway"));
    c.args(["--log-format", "text", "--log", "info", "proxy"])
        .arg("--zds-socket")
        .arg(dir.join(format!("node{n}-zds.sock")))
        .args(["--readiness-addr", &format!("{ip}:15021")])
        .args(["--metrics-addr", &format!("{ip}:15020")])
        .args(["--admin-addr", &format!("{ip}:15000")])
        .arg("--config")
        .arg(config)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap());
    c
}

/// A minimal agent on the ZDS socket `path`: every proxy that connects gets
/// the same snapshot of `pods` (UID and name: the pod's name; namespace and
/// service account `default`), until `stop`.
pub fn serve_snapshots(
    path: &Path,
    pods: Vec<Pod>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let _ = std::fs::remove_file(path);
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &UnixAddr::new(path).unwrap(),
    )
    .unwrap();
    listen(&fd, Backlog::new(8).unwrap()).unwrap();
    std::thread::spawn(move || {
        let mut conns: Vec<OwnedFd> = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let mut pfd = [nix::poll::PollFd::new(
                fd.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            if nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(100u16)).unwrap_or(0) == 0 {
                continue;
            }
            let raw = accept(std::os::fd::AsRawFd::as_raw_fd(&fd)).unwrap();
            // SAFETY: `accept` just returned `raw`: open, and owned by nothing else.
            let c = unsafe { ringway_proxy::sys::adopt_received_fd(raw) }.unwrap();
            let p = zds::recv(c.as_fd(), &zds::refuse_fd).unwrap();
            zds::decode_hello(&p.bytes).unwrap();
            for pod in &pods {
                let add = Payload::Add(AddWorkload {
                    uid: pod.name.clone(),
                    workload_info: Some(WorkloadInfo {
                        name: pod.name.clone(),
                        namespace: "default".into(),
                        service_account: "default".into(),
                    }),
                    addresses: vec![pod.ipv4.to_string(), pod.ipv6.to_string()],
                });
                let netns = pod.netns.dup_fd().unwrap();
                zds::send(c.as_fd(), &zds::request(add), Some(netns.as_fd())).unwrap();
                let a = zds::recv(c.as_fd(), &zds::refuse_fd).unwrap();
                assert_eq!(zds::decode_response(&a.bytes).unwrap(), zds::Answer::Ack);
            }
            zds::send(
                c.as_fd(),
                &zds::request(Payload::SnapshotSent(SnapshotSent {})),
                None,
            )
            .unwrap();
            let a = zds::recv(c.as_fd(), &zds::refuse_fd).unwrap();
            assert_eq!(zds::decode_response(&a.bytes).unwrap(), zds::Answer::Ack);
            conns.push(c);
        }
    })
}
