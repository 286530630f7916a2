//! Datapath workers: one thread per core, each with its own event loop
//! (tokio-uring, or a current-thread tokio runtime on epoll), its own
//! SO_REUSEPORT listeners for every pod, and no work stealing. Workers take
//! commands from the control thread over a channel and never block on it.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ringway_config::{CaptureMode, ProxySettings};
use socket2::SockAddr;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::copy::{copy_one_way, DirEnd, Meter, PipePool};
use crate::metrics::{Metrics, Peer, TcpLabels};
use crate::sock::{self, Backend, ListenerKind, Sock};
use crate::stats::Stats;
use crate::sys;
use crate::tunnel::{self, TunnelState};

/// A pod as every worker sees it (immutable, shared).
#[derive(Debug)]
pub struct PodShared {
    /// Pod UID.
    pub uid: Arc<str>,
    /// The pod's network namespace.
    pub netns: OwnedFd,
    /// The pod's addresses (found inside its netns when it was added).
    pub ips: Vec<IpAddr>,
    /// The pod's ephemeral port range, split between own and spoofed sockets.
    pub ports: sock::PortSplit,
    /// Who the pod is and its SPIFFE principal (empty when unknown); the
    /// agent may send a fuller identity later (same netns), so it can change.
    pub who: RwLock<(crate::PodIdentity, String)>,
}

impl PodShared {
    fn peer(&self) -> Peer {
        let who = self.who.read().unwrap_or_else(|p| p.into_inner());
        Peer {
            workload: if who.0.name.is_empty() {
                self.uid.to_string()
            } else {
                who.0.name.clone()
            },
            namespace: who.0.namespace.clone(),
            principal: who.1.clone(),
        }
    }
}

/// Pods served by this proxy, by IP: read by workers for the same-node fast path.
pub type LocalPods = Arc<RwLock<HashMap<IpAddr, Arc<PodShared>>>>;

/// Commands from the control thread.
#[derive(Debug)]
pub enum Cmd {
    /// Start serving a pod on these listeners (this worker's share).
    AddPod {
        /// The pod.
        pod: Arc<PodShared>,
        /// This worker's listeners.
        listeners: Vec<(ListenerKind, OwnedFd)>,
        /// Replied once the worker serves the pod.
        done: std::sync::mpsc::Sender<()>,
    },
    /// Stop serving a pod: close its listeners and reset its connections now.
    /// Replies with the number of connections reset.
    RemovePod {
        /// Pod UID.
        uid: Arc<str>,
        /// Reply channel.
        done: std::sync::mpsc::Sender<usize>,
    },
    /// Close every listener at once; keep serving established connections.
    CloseListeners {
        /// Reply channel.
        done: std::sync::mpsc::Sender<()>,
    },
    /// Reset every connection and exit.
    Stop,
}

struct PodLocal {
    shared: Arc<PodShared>,
    listeners: RefCell<Vec<Rc<OwnedFd>>>,
    conns: RefCell<HashMap<u64, [Option<Rc<OwnedFd>>; 2]>>,
    next_id: Cell<u64>,
    removed: Cell<bool>,
}

impl PodLocal {
    fn close_listeners(&self) {
        for l in self.listeners.borrow_mut().drain(..) {
            sys::shutdown_read(l.as_fd());
        }
    }

    fn abort_all(&self) -> usize {
        let conns: Vec<_> = self.conns.borrow_mut().drain().collect();
        for (_, fds) in &conns {
            for fd in fds.iter().flatten() {
                sys::tcp_abort(fd.as_fd());
            }
        }
        conns.len()
    }
}

struct WorkerCtx {
    id: usize,
    backend: Backend,
    settings: ProxySettings,
    stats: Arc<Stats>,
    pool: PipePool,
    pods: RefCell<HashMap<Arc<str>, Rc<PodLocal>>>,
    local_pods: LocalPods,
    metrics: Arc<Metrics>,
    last_fd_warning: Cell<Option<Instant>>,
    /// HBONE: identities and mesh (shared by all workers) and this worker's
    /// tunnel pool (its HTTP/2 connections are driven on this thread).
    tunnel: Arc<TunnelState>,
    hbone_pool: Rc<ringway_hbone::Pool>,
}

fn spawn_local<F: Future<Output = ()> + 'static>(backend: Backend, f: F) {
    match backend {
        Backend::Uring => {
            tokio_uring::spawn(f);
        }
        Backend::Epoll => {
            tokio::task::spawn_local(f);
        }
    }
}

/// What a worker shares with the proxy besides its settings.
#[derive(Debug, Clone)]
pub struct Shared {
    /// Datapath counters.
    pub stats: Arc<Stats>,
    /// Pods served by this proxy, by IP.
    pub local_pods: LocalPods,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// HBONE identities and mesh.
    pub tunnel: Arc<TunnelState>,
    /// This worker's tunnel pool (the proxy keeps a clone for its counters).
    pub hbone_pool: ringway_hbone::Pool,
}

/// Runs worker `id` on the current thread until it is told to stop.
pub fn run(
    id: usize,
    backend: Backend,
    settings: ProxySettings,
    shared: Shared,
    rx: mpsc::UnboundedReceiver<Cmd>,
) -> io::Result<()> {
    let Shared {
        stats,
        local_pods,
        metrics,
        tunnel,
        hbone_pool,
    } = shared;
    let ctx = Rc::new(WorkerCtx {
        id,
        backend,
        pool: PipePool::new(settings.pipe_size, settings.pipe_pool),
        settings,
        stats,
        pods: RefCell::new(HashMap::new()),
        local_pods,
        metrics,
        last_fd_warning: Cell::new(None),
        tunnel,
        hbone_pool: Rc::new(hbone_pool),
    });
    match backend {
        Backend::Uring => {
            tokio_uring::builder()
                .entries(4096)
                .start(worker_main(ctx, rx));
            Ok(())
        }
        Backend::Epoll => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, worker_main(ctx, rx));
            Ok(())
        }
    }
}

async fn worker_main(ctx: Rc<WorkerCtx>, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    tracing::debug!(worker = ctx.id, backend = %ctx.backend, "worker started");
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Cmd::AddPod {
                pod,
                listeners,
                done,
            } => {
                add_pod(&ctx, pod, listeners);
                let _ = done.send(());
            }
            Cmd::RemovePod { uid, done } => {
                let n = remove_pod(&ctx, &uid);
                let _ = done.send(n);
            }
            Cmd::CloseListeners { done } => {
                for pod in ctx.pods.borrow().values() {
                    pod.close_listeners();
                }
                let _ = done.send(());
            }
            Cmd::Stop => break,
        }
    }
    let uids: Vec<_> = ctx.pods.borrow().keys().cloned().collect();
    for uid in uids {
        remove_pod(&ctx, &uid);
    }
    // Let the aborted connections' tasks observe their resets and finish.
    tokio::task::yield_now().await;
    tracing::debug!(worker = ctx.id, "worker stopped");
}

fn remove_pod(ctx: &WorkerCtx, uid: &str) -> usize {
    let Some(pod) = ctx.pods.borrow_mut().remove(uid) else {
        return 0;
    };
    pod.removed.set(true);
    pod.close_listeners();
    pod.abort_all()
}

fn add_pod(ctx: &Rc<WorkerCtx>, pod: Arc<PodShared>, listeners: Vec<(ListenerKind, OwnedFd)>) {
    if ctx.pods.borrow().contains_key(&pod.uid) {
        remove_pod(ctx, &pod.uid);
    }
    let local = Rc::new(PodLocal {
        shared: pod.clone(),
        listeners: RefCell::new(Vec::new()),
        conns: RefCell::new(HashMap::new()),
        next_id: Cell::new(0),
        removed: Cell::new(false),
    });
    for (kind, fd) in listeners {
        let lsock = match Sock::new(fd, ctx.backend) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(pod = %pod.uid, %kind, error = %e, "cannot register listener");
                continue;
            }
        };
        local.listeners.borrow_mut().push(lsock.shared());
        spawn_local(
            ctx.backend,
            accept_loop(ctx.clone(), local.clone(), kind, lsock),
        );
    }
    ctx.pods.borrow_mut().insert(pod.uid.clone(), local);
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

async fn accept_loop(ctx: Rc<WorkerCtx>, pod: Rc<PodLocal>, kind: ListenerKind, lsock: Sock) {
    loop {
        match lsock.accept().await {
            Ok((fd, peer)) => {
                ctx.stats.accepted.inc();
                let span = tracing::debug_span!(
                    "conn",
                    pod.uid = %pod.shared.uid,
                    direction = %kind,
                    src.addr = %peer.as_socket().map(|a| a.to_string()).unwrap_or_default(),
                    dst.addr = tracing::field::Empty,
                    dst.pod = tracing::field::Empty,
                );
                spawn_local(
                    ctx.backend,
                    handle_conn(ctx.clone(), pod.clone(), kind, fd, peer).instrument(span),
                );
            }
            Err(_) if pod.removed.get() => break,
            Err(e) if is_resource_exhaustion(&e) => {
                // Out of fds/memory: the connection stays queued in the
                // kernel; refuse to spin, warn (at most once a second), retry.
                ctx.stats.accept_resource_errors.inc();
                let now = Instant::now();
                if ctx
                    .last_fd_warning
                    .get()
                    .is_none_or(|t| now.duration_since(t) > Duration::from_secs(1))
                {
                    ctx.last_fd_warning.set(Some(now));
                    tracing::warn!(pod = %pod.shared.uid, %kind, error = %e, "accept failed for lack of resources; retrying");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ECONNABORTED) | Some(libc::EINTR) | Some(libc::EPROTO)
                ) => {}
            Err(e) => {
                if !pod.removed.get() && pod.listeners.borrow().is_empty() {
                    // Listeners closed for a drain: not an error.
                    break;
                }
                tracing::error!(pod = %pod.shared.uid, %kind, error = %e, "listener failed");
                break;
            }
        }
    }
}

struct ConnGuard {
    pod: Rc<PodLocal>,
    id: u64,
    /// With the same-node fast path, the connection is also registered with
    /// the destination pod (its upstream socket lives in that pod's netns).
    target: Option<(Rc<PodLocal>, u64)>,
    stats: Arc<Stats>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.pod.conns.borrow_mut().remove(&self.id);
        if let Some((target, id)) = &self.target {
            target.conns.borrow_mut().remove(id);
        }
        self.stats.active.dec();
    }
}

async fn handle_conn(
    ctx: Rc<WorkerCtx>,
    pod: Rc<PodLocal>,
    kind: ListenerKind,
    fd: OwnedFd,
    peer: SockAddr,
) {
    // HBONE first: the tunnel listener, and outbound connections to tunnel
    // workloads, run on tokio streams instead of the splice datapath.
    let fd = match tunnel_intercept(&ctx, &pod, kind, fd, &peer) {
        Some(fd) => fd,
        None => return,
    };
    let started = Instant::now();
    let client = match Sock::new(fd, ctx.backend) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register accepted socket");
            return;
        }
    };
    let id = pod.next_id.get();
    pod.next_id.set(id + 1);
    if pod.removed.get() {
        sys::tcp_abort(client.fd());
        return;
    }
    pod.conns
        .borrow_mut()
        .insert(id, [Some(client.shared()), None]);
    ctx.stats.active.inc();
    let mut guard = ConnGuard {
        pod: pod.clone(),
        id,
        target: None,
        stats: ctx.stats.clone(),
    };
    let Some(peer) = peer.as_socket() else {
        sys::tcp_abort(client.fd());
        return;
    };
    let s = &ctx.settings;
    let (dst, spoof) = match kind {
        ListenerKind::Tunnel => {
            // HBONE is off (no CA configured), so nothing may come in
            // through 15008: refuse clearly rather than forward blindly.
            tracing::debug!("tunnel port without HBONE; resetting");
            ctx.stats.refused.inc();
            sys::tcp_abort(client.fd());
            return;
        }
        ListenerKind::Outbound => (sock::original_dst(client.fd(), true, peer.is_ipv6()), None),
        ListenerKind::Inbound => (
            sock::original_dst(
                client.fd(),
                s.capture_mode == CaptureMode::Redirect,
                peer.is_ipv6(),
            ),
            Some(peer.ip()),
        ),
    };
    let dst = match dst {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(error = %e, "no original destination; resetting");
            ctx.stats.refused.inc();
            sys::tcp_abort(client.fd());
            return;
        }
    };
    tracing::Span::current().record("dst.addr", tracing::field::display(dst));
    if kind == ListenerKind::Inbound {
        if let Some(why) = tunnel::plaintext_denied(&ctx.tunnel, &pod.shared, peer.ip(), dst) {
            ctx.metrics
                .denials
                .get_or_create(&crate::metrics::DenyLabels { path: "plaintext" })
                .inc();
            tracing::info!(target: "access", reason = %why, "plaintext connection denied by policy; reset");
            ctx.stats.refused.inc();
            sys::tcp_abort(client.fd());
            return;
        }
    }
    // A destination on one of our own capture ports means the connection
    // was not captured by the rules (e.g. an app dialling 15001 directly):
    // forwarding it would loop back to us.
    if dst.port() == s.ports.outbound || dst.port() == s.ports.inbound {
        tracing::debug!("destination is a capture port of the proxy; resetting");
        ctx.stats.refused.inc();
        sys::tcp_abort(client.fd());
        return;
    }
    // Same-node fast path: the destination is a pod we serve, so connect
    // inside *its* netns exactly as its inbound side would (spoofed client
    // source, proxy mark), skipping a second trip through the network.
    let mut netns_pod = pod.shared.clone();
    let mut spoof = spoof;
    if kind == ListenerKind::Outbound && s.same_node_fast_path {
        let target = ctx
            .local_pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&dst.ip())
            .cloned();
        if let Some(target) = target {
            tracing::Span::current().record("dst.pod", tracing::field::display(&target.uid));
            ctx.stats.same_node.inc();
            netns_pod = target;
            spoof = Some(peer.ip());
        }
    }
    let up_fd = match sys::in_netns(netns_pod.netns.as_fd(), || {
        sock::make_upstream(dst, s.proxy_mark, spoof, netns_pod.ports)
    }) {
        Ok(Ok(fd)) => fd,
        Ok(Err(e)) | Err(e) => {
            if is_resource_exhaustion(&e) {
                ctx.stats.accept_resource_errors.inc();
            }
            tracing::debug!(error = %e, "cannot create upstream socket; resetting");
            ctx.stats.connect_failed.inc();
            sys::tcp_abort(client.fd());
            return;
        }
    };
    let upstream = match Sock::new(up_fd, ctx.backend) {
        Ok(u) => u,
        Err(e) => {
            tracing::debug!(error = %e, "cannot register upstream socket; resetting");
            ctx.stats.connect_failed.inc();
            sys::tcp_abort(client.fd());
            return;
        }
    };
    if let Some(slot) = pod.conns.borrow_mut().get_mut(&id) {
        slot[1] = Some(upstream.shared());
    }
    // A fast-path connection belongs to the destination pod as well: removing
    // that pod must reset it (as it resets the inbound side of a connection
    // that crossed the network), and must not leave a proxy socket behind in
    // the removed pod's netns. Registered in the same synchronous step as the
    // `local_pods` lookup above, so a RemovePod for the target, which this
    // worker handles only between awaits, always finds it.
    if !Arc::ptr_eq(&netns_pod, &pod.shared) {
        let target = ctx.pods.borrow().get(&netns_pod.uid).cloned();
        if let Some(target) = target {
            let tid = target.next_id.get();
            target.next_id.set(tid + 1);
            target
                .conns
                .borrow_mut()
                .insert(tid, [Some(client.shared()), Some(upstream.shared())]);
            guard.target = Some((target, tid));
        }
    }
    // Metrics: who talks to whom, as each reporting side sees it. The
    // outbound side reports as `source`, the inbound side as `destination`;
    // the fast path plays both.
    let labels = {
        let local = |ip: std::net::IpAddr| {
            ctx.local_pods
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&ip)
                .map(|p| p.peer())
        };
        let (src, dst_peer) = match kind {
            ListenerKind::Inbound => (local(peer.ip()).unwrap_or_default(), pod.shared.peer()),
            _ => (pod.shared.peer(), local(dst.ip()).unwrap_or_default()),
        };
        let reporters: &[&'static str] = match kind {
            ListenerKind::Inbound => &["destination"],
            _ if !Arc::ptr_eq(&netns_pod, &pod.shared) => &["source", "destination"],
            _ => &["source"],
        };
        reporters
            .iter()
            .map(|r| TcpLabels::new(r, &src, &dst_peer, "none", "-"))
            .collect::<Vec<_>>()
    };
    if let Err(e) = upstream.connect(dst.into()).await {
        // Refused, unreachable, timed out: the client learns by a reset.
        tracing::info!(target: "access", error = %e, "connection failed: upstream connect; client reset");
        ctx.stats.connect_failed.inc();
        for l in &labels {
            let l = l.with_flags("UF");
            ctx.metrics.opened.get_or_create(&l).inc();
            ctx.metrics.closed.get_or_create(&l).inc();
        }
        sys::tcp_abort(client.fd());
        return;
    }
    for l in &labels {
        ctx.metrics.opened.get_or_create(l).inc();
    }
    let up_meter = Meter {
        total: &ctx.stats.bytes_to_upstream,
        counters: labels
            .iter()
            .map(|l| ctx.metrics.received.get_or_create(l).clone())
            .collect(),
    };
    let down_meter = Meter {
        total: &ctx.stats.bytes_to_client,
        counters: labels
            .iter()
            .map(|l| ctx.metrics.sent.get_or_create(l).clone())
            .collect(),
    };
    let (up_end, down_end) = tokio::join!(
        copy_one_way(&client, &upstream, &ctx.pool, &up_meter),
        copy_one_way(&upstream, &client, &ctx.pool, &down_meter),
    );
    for l in &labels {
        ctx.metrics.closed.get_or_create(l).inc();
    }
    let reason = |e: &DirEnd| match e {
        DirEnd::Eof => "eof".to_string(),
        DirEnd::ReadFailed(e) => format!("read: {e}"),
        DirEnd::WriteFailed(e) => format!("write: {e}"),
    };
    let (sent, received) = (up_end.1, down_end.1);
    let upstream_end = reason(&up_end.0);
    let downstream_end = reason(&down_end.0);
    let who = labels.first();
    tracing::event!(
        target: "access",
        tracing::Level::INFO,
        src.workload = who.map(|l| l.source_workload.as_str()).unwrap_or(""),
        src.identity = who.map(|l| l.source_principal.as_str()).unwrap_or(""),
        dst.workload = who.map(|l| l.destination_workload.as_str()).unwrap_or(""),
        dst.identity = who.map(|l| l.destination_principal.as_str()).unwrap_or(""),
        bytes.sent = sent,
        bytes.received = received,
        duration.ms = started.elapsed().as_millis() as u64,
        upstream.end = %upstream_end,
        downstream.end = %downstream_end,
        "connection closed"
    );
}

/// Takes the connection when HBONE handles it (spawning its task) and gives
/// the fd back otherwise.
fn tunnel_intercept(
    ctx: &Rc<WorkerCtx>,
    pod: &Rc<PodLocal>,
    kind: ListenerKind,
    fd: OwnedFd,
    peer: &SockAddr,
) -> Option<OwnedFd> {
    // Every "not HBONE" answer gives the fd back to the plaintext path.
    let Some(peer) = peer.as_socket() else {
        return Some(fd);
    };
    match kind {
        ListenerKind::Tunnel if ctx.tunnel.enabled().is_some() => {
            spawn_local(
                ctx.backend,
                tunnel_task(
                    ctx.clone(),
                    pod.clone(),
                    fd,
                    move |ctx, pod, tcp| async move {
                        if let Err(e) = tunnel::inbound(
                            ctx.tunnel.clone(),
                            pod.shared.clone(),
                            ctx.settings.proxy_mark,
                            tcp,
                            peer,
                        )
                        .await
                        {
                            tracing::debug!(error = %e, "hbone inbound connection ended");
                        }
                    },
                )
                .instrument(tracing::Span::current()),
            );
            None
        }
        ListenerKind::Outbound => {
            if ctx.tunnel.enabled().is_none() {
                return Some(fd);
            }
            let Ok(dst) = sock::original_dst(fd.as_fd(), true, peer.is_ipv6()) else {
                return Some(fd);
            };
            if dst.port() == ctx.settings.ports.outbound || dst.port() == ctx.settings.ports.inbound
            {
                return Some(fd);
            }
            // The same-node fast path wins: the bytes never leave the node.
            if ctx.settings.same_node_fast_path
                && ctx
                    .local_pods
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains_key(&dst.ip())
            {
                return Some(fd);
            }
            let Some(plan) = tunnel::outbound_plan(&ctx.tunnel, &pod.shared, dst) else {
                return Some(fd);
            };
            tracing::Span::current().record("dst.addr", tracing::field::display(dst));
            spawn_local(
                ctx.backend,
                tunnel_task(
                    ctx.clone(),
                    pod.clone(),
                    fd,
                    move |ctx, pod, tcp| async move {
                        let cx = tunnel::ConnCtx {
                            stats: &ctx.stats,
                            metrics: &ctx.metrics,
                            mark: ctx.settings.proxy_mark,
                        };
                        let src = pod.shared.peer();
                        tunnel::outbound(cx, &ctx.hbone_pool, &pod.shared, src, tcp, peer, plan)
                            .await;
                    },
                )
                .instrument(tracing::Span::current()),
            );
            None
        }
        _ => Some(fd),
    }
}

/// Registers a tunnel connection with its pod (a duplicate of the fd, so
/// removing the pod resets it), counts it active, adopts the fd as a tokio
/// stream and runs `f`.
async fn tunnel_task<F, Fut>(ctx: Rc<WorkerCtx>, pod: Rc<PodLocal>, fd: OwnedFd, f: F)
where
    F: FnOnce(Rc<WorkerCtx>, Rc<PodLocal>, tokio::net::TcpStream) -> Fut,
    Fut: Future<Output = ()>,
{
    if pod.removed.get() {
        sys::tcp_abort(fd.as_fd());
        return;
    }
    let dup = match fd.try_clone() {
        Ok(d) => Rc::new(d),
        Err(e) => {
            tracing::warn!(error = %e, "cannot duplicate accepted socket; resetting");
            sys::tcp_abort(fd.as_fd());
            return;
        }
    };
    let tcp = match tunnel::adopt(fd) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register accepted socket; resetting");
            sys::tcp_abort(dup.as_fd());
            return;
        }
    };
    let id = pod.next_id.get();
    pod.next_id.set(id + 1);
    pod.conns.borrow_mut().insert(id, [Some(dup), None]);
    ctx.stats.active.inc();
    let _guard = ConnGuard {
        pod: pod.clone(),
        id,
        target: None,
        stats: ctx.stats.clone(),
    };
    f(ctx.clone(), pod.clone(), tcp).await;
}
