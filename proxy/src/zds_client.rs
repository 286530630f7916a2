//! The proxy's side of ZDS: connect to the node agent, receive the pods
//! (with their network namespaces) and answer every request with one ack.
//!
//! Runs on its own control thread, never on a datapath worker. Flow per
//! connection: connect (backoff 10 ms doubling to 200 ms), send `ZdsHello{V1}`,
//! apply the snapshot (`Add`/`Keep` ... `SnapshotSent`, after which pods the
//! snapshot did not name are torn down), then live `Add`/`Del`. A pod whose
//! listeners cannot be created is nacked and retried every second until it
//! succeeds or is deleted; the proxy is ready only once a snapshot is in and
//! no pod is pending (and, after the first snapshot, the proxy's warm-up has
//! run: `Proxy::warm_up`), and, with a certificate service, no served pod's
//! certificate is awaited ([`Readiness::wait_for_certificates`]). Protocol violations (a second `SnapshotSent`, `Keep`
//! after the snapshot, undecodable packets) are nacked, make the proxy
//! unready and end the connection so the next one starts clean.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
use ringway_config::Backoff;
use ringway_zds::{self as zds, Request, ZdsError, ZdsHello};

use crate::{PodIdentity, Proxy};

/// What readiness depends on.
#[derive(Debug, Default)]
pub struct Readiness {
    /// What the mesh's source still has to deliver before the proxy is
    /// ready (a control plane's first workloads and policies); empty: none.
    mesh_waiting: Mutex<String>,
    snapshot_done: AtomicBool,
    protocol_error: AtomicBool,
    draining: AtomicBool,
    pending: Mutex<HashSet<String>>,
    /// With a certificate service: the proxy whose pods' certificates are
    /// awaited ([`Proxy::awaited_certificates`]).
    /// (Weak: the proxy is unwrapped at exit.)
    certificates: Mutex<Option<std::sync::Weak<Proxy>>>,
    /// Snapshots completed.
    pub snapshots: AtomicU64,
}

impl Readiness {
    /// Ready: a snapshot is in, no pod is pending, no workload certificate
    /// is awaited, no protocol error, not draining.
    pub fn is_ready(&self) -> bool {
        self.is_ready_but_certificates() && self.awaited_certificates().is_empty()
    }

    /// The workload certificates of the pods served that are not in hand
    /// and may still come, with why.
    fn awaited_certificates(&self) -> Vec<(ringway_identity::Identity, String)> {
        self.certificates
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(std::sync::Weak::upgrade)
            .map(|p| p.awaited_certificates())
            .unwrap_or_default()
    }

    /// Readiness waits for the certificates of `proxy`'s pods that its
    /// certificate service has yet to issue: a proxy that takes over a node
    /// (the old one is stopped once this one is ready) before they are in
    /// hand would refuse those pods' HBONE, while the old one still has
    /// them. Only while their issuance fails in ways that may pass (the
    /// service unreachable, slow, overloaded); never for a refusal.
    pub fn wait_for_certificates(&self, proxy: &Arc<Proxy>) {
        *self.certificates.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::downgrade(proxy));
    }

    fn is_ready_but_certificates(&self) -> bool {
        self.mesh_waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
            && self.snapshot_done.load(Ordering::SeqCst)
            && !self.protocol_error.load(Ordering::SeqCst)
            && !self.draining.load(Ordering::SeqCst)
            && self
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty()
    }

    /// Why not ready (for the readiness endpoint's body).
    pub fn reason(&self) -> String {
        if self.draining.load(Ordering::SeqCst) {
            return "draining".into();
        }
        if self.protocol_error.load(Ordering::SeqCst) {
            return "ZDS protocol error; reconnecting".into();
        }
        {
            let w = self.mesh_waiting.lock().unwrap_or_else(|p| p.into_inner());
            if !w.is_empty() {
                return format!("waiting for {w}");
            }
        }
        if !self.snapshot_done.load(Ordering::SeqCst) {
            return "waiting for the node agent's snapshot".into();
        }
        let p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if !p.is_empty() {
            let mut v: Vec<_> = p.iter().cloned().collect();
            v.sort();
            return format!("pods pending: {}", v.join(", "));
        }
        let awaited = self.awaited_certificates();
        if let Some((id, why)) = awaited.first() {
            return format!(
                "waiting for {} workload certificate(s), first {id}: {why}",
                awaited.len()
            );
        }
        "ready".into()
    }

    /// Says what the mesh's source has yet to deliver (`""`: nothing): the
    /// proxy is not ready before it has.
    pub fn set_mesh_waiting(&self, what: impl Into<String>) {
        *self.mesh_waiting.lock().unwrap_or_else(|p| p.into_inner()) = what.into();
    }

    /// Declares the snapshot applied (running without a node agent).
    pub fn mark_snapshot_applied(&self) {
        self.snapshot_done.store(true, Ordering::SeqCst);
    }

    /// Marks the proxy as draining (never ready again).
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }
}

impl ringway_control::ReadyState for Readiness {
    fn is_ready(&self) -> bool {
        Readiness::is_ready(self)
    }

    fn reason(&self) -> String {
        Readiness::reason(self)
    }
}

/// Settings of the ZDS client.
#[derive(Debug, Clone)]
pub struct ZdsClientConfig {
    /// The agent's socket.
    pub socket: PathBuf,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// How often pending pods are retried.
    pub retry_every: Duration,
}

impl ZdsClientConfig {
    /// The reconnect delays: [`ZdsClientConfig::backoff_min`] doubling up to
    /// [`ZdsClientConfig::backoff_max`], not jittered (one proxy, one local
    /// socket); reset once connected.
    fn reconnect_backoff(&self) -> Backoff {
        Backoff::new(self.backoff_min, self.backoff_max)
    }

    /// Defaults for `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        ZdsClientConfig {
            socket: socket.into(),
            backoff_min: Duration::from_millis(10),
            // Capped low: a failed connect to a unix socket costs microseconds,
            // and every CNI ADD fails while the proxy is away from a restarted
            // agent (it took up to 15 s with a longer cap).
            backoff_max: Duration::from_millis(200),
            retry_every: Duration::from_secs(1),
        }
    }
}

struct Pending {
    info: PodIdentity,
    addresses: Vec<std::net::IpAddr>,
    netns: OwnedFd,
    last_error: String,
}

/// Runs the client until `stop` is set. Blocking; call on a control thread.
pub fn run(proxy: Arc<Proxy>, cfg: ZdsClientConfig, ready: Arc<Readiness>, stop: Arc<AtomicBool>) {
    let mut backoff = cfg.reconnect_backoff();
    let mut pending: HashMap<String, Pending> = HashMap::new();
    // Since when the agent has been unreachable, and whether that was logged.
    let mut outage: Option<(Instant, bool)> = None;
    while !stop.load(Ordering::SeqCst) {
        match connect_agent(&cfg.socket) {
            Ok(sock) => {
                if let Some((since, _)) = outage.take() {
                    tracing::info!(socket = %cfg.socket.display(), unreachable_for = ?since.elapsed(), "node agent reachable again");
                }
                backoff.reset();
                tracing::info!(socket = %cfg.socket.display(), "connected to the node agent");
                match session(&proxy, &cfg, &ready, &stop, &sock, &mut pending) {
                    Ok(()) => tracing::info!("ZDS session ended"),
                    Err(e) => tracing::warn!(error = %e, "ZDS session ended"),
                }
            }
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::debug!(socket = %cfg.socket.display(), error = %e, backoff = ?delay, "node agent not reachable");
                let (since, warned) = outage.get_or_insert((Instant::now(), false));
                if !*warned && since.elapsed() >= Duration::from_secs(10) {
                    *warned = true;
                    tracing::warn!(socket = %cfg.socket.display(), error = %e, "node agent unreachable for 10 s: no pod can be added on this node until it is back");
                }
                sleep_unless_stopped(delay, &stop);
            }
        }
    }
}

fn sleep_unless_stopped(d: Duration, stop: &AtomicBool) {
    let until = Instant::now() + d;
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
    }
}

fn connect_agent(path: &Path) -> std::io::Result<OwnedFd> {
    let fd = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let addr = UnixAddr::new(path)?;
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)?;
    Ok(fd)
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Zds(#[from] ZdsError),
    #[error("protocol violation: {0}")]
    Protocol(String),
}

fn reply(
    sock: &OwnedFd,
    metrics: &crate::metrics::Metrics,
    error: Option<String>,
) -> Result<(), ZdsError> {
    let outcome = if error.is_some() { "nack" } else { "ack" };
    metrics
        .zds
        .get_or_create(&crate::metrics::ZdsLabels { outcome })
        .inc();
    zds::send(sock.as_fd(), &zds::ack(error), None)
}

fn session(
    proxy: &Proxy,
    cfg: &ZdsClientConfig,
    ready: &Readiness,
    stop: &AtomicBool,
    sock: &OwnedFd,
    pending: &mut HashMap<String, Pending>,
) -> Result<(), SessionError> {
    // A receive timeout lets the loop retry pending pods and notice `stop`.
    let timeout = socket_timeout(cfg.retry_every);
    let _ = nix::sys::socket::setsockopt(sock, nix::sys::socket::sockopt::ReceiveTimeout, &timeout);
    zds::send(
        sock.as_fd(),
        &ZdsHello {
            version: zds::Version::V1 as i32,
        },
        None,
    )?;
    let mut in_snapshot = true;
    let mut named: HashSet<String> = HashSet::new();
    let mut last_retry = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if last_retry.elapsed() >= cfg.retry_every {
            retry_pending(proxy, ready, pending);
            last_retry = Instant::now();
        }
        let packet = match crate::sys::zds_recv(sock.as_fd()) {
            Ok(p) => p,
            Err(ZdsError::Io { source, .. })
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(ZdsError::Closed) => return Ok(()),
            Err(e @ (ZdsError::Truncated | ZdsError::TooManyFds)) => {
                // The agent waits for one ack per request: answer, then go on.
                tracing::warn!(error = %e, "bad ZDS packet from the agent");
                reply(sock, &proxy.metrics(), Some(e.to_string()))?;
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let req = match zds::decode_request(&packet.bytes, packet.fd) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "bad ZDS request from the agent");
                reply(sock, &proxy.metrics(), Some(e.to_string()))?;
                continue;
            }
        };
        tracing::debug!(request = req.kind(), "ZDS request");
        match req {
            Request::Add {
                uid,
                info,
                addresses,
                netns,
            } => {
                if in_snapshot {
                    named.insert(uid.clone());
                }
                let identity = PodIdentity {
                    name: info.name,
                    namespace: info.namespace,
                    service_account: info.service_account,
                };
                match proxy.add_pod_with_addresses(
                    &uid,
                    netns.try_clone().map_err(|e| ZdsError::Io {
                        op: "dup netns fd",
                        source: e,
                    })?,
                    identity.clone(),
                    &addresses,
                ) {
                    Ok(()) => {
                        pending.remove(&uid);
                        set_pending(ready, pending);
                        reply(sock, &proxy.metrics(), None)?;
                    }
                    Err(e) => {
                        if matches!(
                            e,
                            crate::ProxyError::AddressConflict { .. }
                                | crate::ProxyError::NetnsConflict { .. }
                        ) {
                            // Loud: two pods claim one address. Retried, so
                            // the pod is served once the holder is deleted.
                            tracing::error!(pod.uid = %uid, error = %e, "two pods claim one address or one network namespace: pod refused (nacked), will retry");
                        } else {
                            tracing::warn!(pod.uid = %uid, error = %e, "cannot serve pod; nacked, will retry");
                        }
                        let text = e.to_string();
                        // A fd that is not a usable netns will never work: do not retry it.
                        if matches!(
                            e,
                            crate::ProxyError::NotANetns { .. }
                                | crate::ProxyError::HostNetns { .. }
                        ) {
                            reply(sock, &proxy.metrics(), Some(text))?;
                            continue;
                        }
                        pending.insert(
                            uid.clone(),
                            Pending {
                                info: identity,
                                addresses,
                                netns,
                                last_error: text.clone(),
                            },
                        );
                        set_pending(ready, pending);
                        reply(sock, &proxy.metrics(), Some(text))?;
                    }
                }
            }
            Request::Keep { uid } => {
                if !in_snapshot {
                    ready.protocol_error.store(true, Ordering::SeqCst);
                    reply(
                        sock,
                        &proxy.metrics(),
                        Some(format!("Keep for pod {uid} after the snapshot")),
                    )?;
                    return Err(SessionError::Protocol(format!(
                        "Keep for pod {uid} after the snapshot"
                    )));
                }
                named.insert(uid);
                reply(sock, &proxy.metrics(), None)?;
            }
            Request::Del { uid } => {
                pending.remove(&uid);
                set_pending(ready, pending);
                proxy.remove_pod(&uid);
                reply(sock, &proxy.metrics(), None)?;
            }
            Request::SnapshotSent => {
                if !in_snapshot {
                    ready.protocol_error.store(true, Ordering::SeqCst);
                    reply(sock, &proxy.metrics(), Some("second SnapshotSent".into()))?;
                    return Err(SessionError::Protocol("second SnapshotSent".into()));
                }
                in_snapshot = false;
                let mut removed = 0;
                for pod in proxy.pods() {
                    if !named.contains(&pod.uid) {
                        proxy.remove_pod(&pod.uid);
                        removed += 1;
                    }
                }
                pending.retain(|uid, _| named.contains(uid));
                set_pending(ready, pending);
                // Before the first snapshot counts as applied (readiness):
                // the previous proxy's tunnels dialled again.
                proxy.warm_up(crate::tunnel::warm::WARM_UP_BUDGET);
                ready.snapshot_done.store(true, Ordering::SeqCst);
                ready.protocol_error.store(false, Ordering::SeqCst);
                ready.snapshots.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    pods = proxy.pods().len(),
                    removed,
                    pending = pending.len(),
                    "ZDS snapshot applied"
                );
                reply(sock, &proxy.metrics(), None)?;
            }
        }
    }
}

fn socket_timeout(d: Duration) -> nix::sys::time::TimeVal {
    nix::sys::time::TimeVal::new(d.as_secs() as i64, d.subsec_micros() as i64)
}

fn set_pending(ready: &Readiness, pending: &HashMap<String, Pending>) {
    let mut p = ready.pending.lock().unwrap_or_else(|p| p.into_inner());
    p.clear();
    p.extend(pending.keys().cloned());
}

fn retry_pending(proxy: &Proxy, ready: &Readiness, pending: &mut HashMap<String, Pending>) {
    let uids: Vec<String> = pending.keys().cloned().collect();
    for uid in uids {
        let Some(p) = pending.get_mut(&uid) else {
            continue;
        };
        let fd = match p.netns.try_clone() {
            Ok(fd) => fd,
            Err(e) => {
                p.last_error = e.to_string();
                continue;
            }
        };
        match proxy.add_pod_with_addresses(&uid, fd, p.info.clone(), &p.addresses) {
            Ok(()) => {
                tracing::info!(pod.uid = %uid, "pending pod now served");
                pending.remove(&uid);
            }
            Err(e) => p.last_error = e.to_string(),
        }
    }
    set_pending(ready, pending);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doubling, the cap and the reset are `ringway_config::Backoff`'s
    /// (its tests); here, the reconnect figures.
    #[test]
    fn reconnects_back_off_10ms_doubling_to_200ms_without_jitter() {
        let mut b = ZdsClientConfig::new("/agent.sock").reconnect_backoff();
        assert_eq!(b.jitter(), ringway_config::Jitter::None);
        let ms: Vec<u64> = (0..7).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(ms, [10, 20, 40, 80, 160, 200, 200]);
    }
}
