//! Shared pieces of the node-agent tests: an agent configured into a temp
//! directory, a fake node proxy speaking ZDS (scripted or auto-acking), the
//! CNI plugin driven through the agent's real socket, and raw CNI requests.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ringway_cni::node::{AgentConfig, AgentHandle, NodeAgent, Selection, UnixAgent};
use ringway_cni::Outcome;
use ringway_redirect::CaptureSpec;
use ringway_testbed::Pod;
use ringway_zds::{self as zds, Request, ZdsError, ZdsHello};
use socket2::{Domain, SockAddr, Socket, Type};

pub const WAIT: Duration = Duration::from_secs(10);

pub use ringway_testbed::init_logs;

pub use ringway_testbed::{wait_until, TempDir};

/// An agent config for one test: sockets in `dir`, a node name of its own
/// (so agents of tests running at the same time never adopt each other's
/// pods), netns dirs = the test bed's `/run/netns`.
pub fn config(test: &str, dir: &Path) -> AgentConfig {
    AgentConfig {
        zds_socket: dir.join("zds.sock"),
        cni_socket: dir.join("cni.sock"),
        capture: CaptureSpec::default(),
        netns_dirs: vec![PathBuf::from("/run/netns")],
        proc_root: PathBuf::from("/proc"),
        exclude_namespaces: vec!["ringway-system".into()],
        node_name: format!("{test}-{}", std::process::id()),
        reconcile_interval: Duration::from_secs(3600),
        selection: Selection::All,
        state_file: Some(dir.join("state/pods.json")),
        // The pods of `CniPod::of` (file mode: CNI passes no service account).
        service_accounts: vec!["shop=shop-sa".parse().unwrap()],
        peer_uids: vec![0],
        annotator: None,
    }
}

pub fn start(cfg: &AgentConfig) -> AgentHandle {
    NodeAgent::start(cfg.clone()).unwrap_or_else(|e| panic!("agent start: {e}"))
}

/// An agent on `cfg` with one auto-acking proxy, ready.
pub fn start_with_proxy(cfg: &AgentConfig) -> (AgentHandle, AutoProxy) {
    let agent = start(cfg);
    let proxy = AutoProxy::start(&cfg.zds_socket);
    wait_ready_proxies(&agent, 1);
    (agent, proxy)
}

/// CNI ADD of each of `pods` as `uid-<i>` (`i` its index on the node)
/// through the plugin's code; panics unless each succeeds. The requests.
pub fn add_all(cfg: &AgentConfig, pods: &[(usize, &Pod)]) -> Vec<CniPod> {
    pods.iter()
        .map(|(i, pod)| {
            let p = CniPod::of(pod, &format!("uid-{i}"));
            ok(plugin("ADD", &p, &cfg.cni_socket));
            p
        })
        .collect()
}

/// Waits until the agent has `n` proxies connected, all ready.
pub fn wait_ready_proxies(agent: &AgentHandle, n: usize) {
    assert!(
        wait_until(WAIT, || {
            let p = agent.proxies();
            p.len() == n && p.iter().all(|p| p.ready)
        }),
        "want {n} ready proxies, have {:?}",
        agent.proxies()
    );
}

// ------------------------------------------------------------------ fake proxy

/// One request as the fake proxy received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// `Add`, `Keep`, `Del`, `SnapshotSent`.
    pub kind: &'static str,
    pub uid: String,
    /// (name, namespace, service account) of an Add.
    pub info: Option<(String, String, String)>,
    /// The addresses an Add carried (ringway's field 1001).
    pub addresses: Vec<std::net::IpAddr>,
    /// Inode of the namespace fd an Add carried.
    pub netns_inode: Option<u64>,
    /// Whether that fd passed `check_pod_netns` in the receiving process
    /// (a network namespace, not the host's nor the receiver's own).
    pub is_pod_netns: Option<bool>,
    /// What `/proc/thread-self/fd/<n>` says about that fd.
    pub netns_link: Option<String>,
}

/// A node proxy's side of ZDS, driven step by step by the test.
pub struct FakeProxy {
    pub sock: Socket,
}

impl FakeProxy {
    /// Connects (retrying while the socket is not there yet), without hello.
    pub fn connect_raw(path: &Path) -> FakeProxy {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = Socket::new(Domain::UNIX, Type::SEQPACKET, None).unwrap();
            match s.connect(&SockAddr::unix(path).unwrap()) {
                Ok(()) => {
                    s.set_read_timeout(Some(WAIT)).unwrap();
                    return FakeProxy { sock: s };
                }
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("connecting to {}: {e}", path.display()),
            }
        }
    }

    /// Connects and says hello (V1).
    pub fn connect(path: &Path) -> FakeProxy {
        let p = Self::connect_raw(path);
        p.hello(1);
        p
    }

    pub fn hello(&self, version: i32) {
        zds::send(self.sock.as_fd(), &ZdsHello { version }, None).unwrap();
    }

    /// Sends raw bytes as one packet.
    pub fn send_raw(&self, bytes: &[u8]) {
        nix::sys::socket::send(
            self.sock.as_raw_fd(),
            bytes,
            nix::sys::socket::MsgFlags::empty(),
        )
        .unwrap();
    }

    pub fn ack(&self) {
        zds::send(self.sock.as_fd(), &zds::ack(None), None).unwrap();
    }

    pub fn nack(&self, text: &str) {
        zds::send(self.sock.as_fd(), &zds::ack(Some(text.into())), None).unwrap();
    }

    /// Receives and decodes one request within `timeout`: `Ok(None)` on
    /// timeout, `Err` when the agent closed the connection (or sent garbage).
    pub fn recv_within(&self, timeout: Duration) -> Result<Option<Received>, String> {
        self.sock.set_read_timeout(Some(timeout)).unwrap();
        let fd_info: Mutex<Option<(u64, bool, String)>> = Mutex::new(None);
        let adopt = |raw: RawFd| -> Option<OwnedFd> {
            // SAFETY: `zds::recv` hands its adopter each fd it has just
            // received with SCM_RIGHTS, once: open, and owned by nothing else.
            let fd = unsafe { ringway_proxy::sys::adopt_received_fd(raw) }?;
            let ino = nix::sys::stat::fstat(fd.as_raw_fd())
                .map(|s| s.st_ino)
                .unwrap_or(0);
            let pod = ringway_redirect::check_pod_netns(fd.as_fd()).is_ok();
            let link = std::fs::read_link(format!("/proc/thread-self/fd/{}", fd.as_raw_fd()))
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            *fd_info.lock().unwrap() = Some((ino, pod, link));
            Some(fd)
        };
        let p = match zds::recv(self.sock.as_fd(), &adopt) {
            Ok(p) => p,
            Err(ZdsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::WouldBlock => {
                return Ok(None)
            }
            Err(e) => return Err(e.to_string()),
        };
        let info = fd_info.lock().unwrap().take();
        let req = zds::decode_request(&p.bytes, p.fd).map_err(|e| e.to_string())?;
        let (netns_inode, is_pod_netns, netns_link) = match info {
            Some((i, p, l)) => (Some(i), Some(p), Some(l)),
            None => (None, None, None),
        };
        Ok(Some(match req {
            Request::Add {
                uid,
                info,
                addresses,
                ..
            } => Received {
                kind: "Add",
                uid,
                info: Some((info.name, info.namespace, info.service_account)),
                addresses,
                netns_inode,
                is_pod_netns,
                netns_link,
            },
            Request::Keep { uid } => Received {
                kind: "Keep",
                uid,
                info: None,
                addresses: Vec::new(),
                netns_inode,
                is_pod_netns,
                netns_link,
            },
            Request::Del { uid } => Received {
                kind: "Del",
                uid,
                info: None,
                addresses: Vec::new(),
                netns_inode,
                is_pod_netns,
                netns_link,
            },
            Request::SnapshotSent => Received {
                kind: "SnapshotSent",
                uid: String::new(),
                info: None,
                addresses: Vec::new(),
                netns_inode,
                is_pod_netns,
                netns_link,
            },
        }))
    }

    /// The next request (panics after [`WAIT`]).
    pub fn recv(&self) -> Received {
        match self.recv_within(WAIT) {
            Ok(Some(r)) => r,
            Ok(None) => panic!("no request from the agent within {WAIT:?}"),
            Err(e) => panic!("receiving from the agent: {e}"),
        }
    }

    /// Takes an empty snapshot: `SnapshotSent` first, acked.
    pub fn empty_snapshot(&self) {
        let r = self.recv();
        assert_eq!(r.kind, "SnapshotSent", "{r:?}");
        self.ack();
    }

    /// True when the agent closes the connection within `within`.
    pub fn closed_within(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self.sock.set_read_timeout(Some(left));
            let mut buf = [0u8; 2048];
            match nix::sys::socket::recv(
                self.sock.as_raw_fd(),
                &mut buf,
                nix::sys::socket::MsgFlags::empty(),
            ) {
                Ok(0) => return true,
                Ok(_) => continue, // a request: the agent is still talking
                Err(nix::errno::Errno::EAGAIN) => return false,
                Err(nix::errno::Errno::ECONNRESET) => return true,
                Err(e) => panic!("recv: {e}"),
            }
        }
    }
}

/// A fake proxy on its own thread: hello, then answers every request
/// (nack when `policy` says so) and records it.
pub struct AutoProxy {
    pub log: Arc<Mutex<Vec<Received>>>,
    pub policy: Arc<Mutex<HashMap<String, String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AutoProxy {
    pub fn start(path: &Path) -> AutoProxy {
        let proxy = FakeProxy::connect(path);
        let log = Arc::new(Mutex::new(Vec::new()));
        let policy: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (l, p, s) = (log.clone(), policy.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match proxy.recv_within(Duration::from_millis(100)) {
                    Ok(Some(r)) => {
                        let nack = p.lock().unwrap().get(&r.uid).cloned();
                        l.lock().unwrap().push(r);
                        match nack {
                            Some(text) => proxy.nack(&text),
                            None => proxy.ack(),
                        }
                    }
                    Ok(None) => {}
                    Err(_) => return,
                }
            }
        });
        AutoProxy {
            log,
            policy,
            stop,
            thread: Some(thread),
        }
    }

    /// Nacks every request about `uid` with `text` (until [`AutoProxy::accept`]).
    pub fn refuse(&self, uid: &str, text: &str) {
        self.policy.lock().unwrap().insert(uid.into(), text.into());
    }

    pub fn accept(&self, uid: &str) {
        self.policy.lock().unwrap().remove(uid);
    }

    pub fn log(&self) -> Vec<Received> {
        self.log.lock().unwrap().clone()
    }

    /// (kind, uid) of every request so far.
    pub fn kinds(&self) -> Vec<(&'static str, String)> {
        self.log().into_iter().map(|r| (r.kind, r.uid)).collect()
    }

    /// Waits until the log holds `n` requests.
    pub fn wait_for(&self, n: usize) -> Vec<Received> {
        assert!(
            wait_until(WAIT, || self.log().len() >= n),
            "want {n} requests, got {:?}",
            self.kinds()
        );
        self.log()
    }

    /// Closes the connection (the agent sees a hang-up).
    pub fn disconnect(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AutoProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ------------------------------------------------------------------ CNI

pub use ringway_testbed::cni::CniPod;

/// Runs the CNI plugin (the library the binary wraps) with the real
/// [`UnixAgent`] against `socket`.
pub fn plugin(command: &str, pod: &CniPod, socket: &Path) -> Outcome {
    let env: HashMap<String, String> = pod
        .env(command, Path::new("/opt/cni/bin"))
        .into_iter()
        .collect();
    let stdin = pod.netconf("1.1.0", "k8s-pod-network", socket);
    ringway_cni::run(&env, stdin.as_bytes(), &UnixAgent::default())
}

/// [`plugin`] on a thread of its own (the test answers the agent's requests
/// meanwhile, as the proxy): join it for the outcome.
pub fn plugin_in_background(
    command: &'static str,
    pod: &CniPod,
    socket: &Path,
) -> std::thread::JoinHandle<Outcome> {
    let (pod, socket) = (pod.clone(), socket.to_path_buf());
    std::thread::spawn(move || plugin(command, &pod, &socket))
}

/// Asserts a successful plugin run.
pub fn ok(o: Outcome) -> Outcome {
    assert_eq!(o.exit_code, 0, "plugin failed: {}", o.stdout);
    o
}

/// Asserts a failed plugin run whose answer says `text`.
pub fn failed_with(o: Outcome, text: &str) -> Outcome {
    assert_ne!(o.exit_code, 0, "plugin succeeded: {}", o.stdout);
    assert!(o.stdout.contains(text), "{}", o.stdout);
    o
}

/// One raw request line to the CNI socket; the response line.
pub fn cni_line(socket: &Path, line: &[u8]) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    // The agent may answer and close before it read everything (too long a
    // line): the answer is still there to read.
    let _ = s.write_all(line);
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.trim_end_matches('\n').to_string()
}

/// The inode of a path (a namespace's identity).
pub fn inode(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.ino()).unwrap_or(0)
}

/// See `Netns::ringway_handles`.
pub fn handles(pod: &Pod) -> Vec<String> {
    pod.netns.ringway_handles()
}
