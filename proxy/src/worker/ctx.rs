//! A worker's own state ([`WorkerCtx`]), the pods it serves
//! ([`PodLocal`]: listeners and connections here), and what every
//! connection path does when it refuses one (counted, logged, reset).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ringway_config::ProxySettings;

use crate::copy::PipePool;
use crate::in_force::InForce;
use crate::metrics::{DenyLabels, Metrics, RefuseLabels, Series, TcpLabels};
use crate::pod::{LocalPods, PodShared};
use crate::policy::Denied;
use crate::sock::Backend;
use crate::stats::Stats;
use crate::sys;
use crate::tunnel::{PreauthSlots, TunnelState};

/// A pod as one worker serves it: its listeners here, the connections
/// this worker holds for it (reset when the pod goes), and the pod's
/// pre-authentication places on its tunnel port (one per pod, shared by
/// every worker serving it).
pub(super) struct PodLocal {
    pub(super) shared: Arc<PodShared>,
    pub(super) preauth: Arc<PreauthSlots>,
    pub(super) listeners: RefCell<Vec<Arc<OwnedFd>>>,
    pub(super) conns: RefCell<HashMap<u64, [Option<Arc<OwnedFd>>; 2]>>,
    pub(super) next_id: Cell<u64>,
    pub(super) removed: Cell<bool>,
}

impl PodLocal {
    /// A pod newly served on this worker: no listener, no connection yet.
    pub(super) fn new(shared: Arc<PodShared>, preauth: Arc<PreauthSlots>) -> PodLocal {
        PodLocal {
            shared,
            preauth,
            listeners: RefCell::new(Vec::new()),
            conns: RefCell::new(HashMap::new()),
            next_id: Cell::new(0),
            removed: Cell::new(false),
        }
    }

    /// Closes the pod's listeners here (a drain, or the pod going).
    pub(super) fn close_listeners(&self) {
        for l in self.listeners.borrow_mut().drain(..) {
            sys::shutdown_read(l.as_fd());
        }
        // A tunnel listener paused at the pre-auth cap sees it and ends.
        self.preauth.wake_all();
    }

    /// Resets every connection the pod has here; returns how many.
    pub(super) fn abort_all(&self) -> usize {
        let conns: Vec<_> = self.conns.borrow_mut().drain().collect();
        for (_, fds) in &conns {
            for fd in fds.iter().flatten() {
                sys::tcp_abort(fd.as_fd());
            }
        }
        conns.len()
    }
}

/// A worker's own state: its settings, counters, pipe pool, the pods it
/// serves and what it shares with the proxy.
pub(super) struct WorkerCtx {
    pub(super) id: usize,
    pub(super) backend: Backend,
    pub(super) settings: ProxySettings,
    pub(super) stats: Arc<Stats>,
    pub(super) pool: PipePool,
    pub(super) pods: RefCell<HashMap<Arc<str>, Rc<PodLocal>>>,
    pub(super) local_pods: LocalPods,
    pub(super) metrics: Arc<Metrics>,
    pub(super) last_fd_warning: Cell<Option<Instant>>,
    /// The identity manager and the mesh in force (shared by all workers).
    pub(super) in_force: Arc<InForce>,
    /// HBONE: the tunnel listener's state (shared by all workers) and this
    /// worker's tunnel pool (its HTTP/2 connections are driven on this
    /// thread).
    pub(super) tunnel: Arc<TunnelState>,
    pub(super) hbone_pool: Rc<ringway_hbone::Pool>,
    /// Round robin over service endpoints.
    pub(super) next_endpoint: Cell<usize>,
    /// Accept loops running on this worker ([`AcceptLoop`]).
    pub(super) accept_loops: Cell<usize>,
    /// Woken whenever an accept loop ends.
    pub(super) accept_loop_ended: tokio::sync::Notify,
}

/// Held by a running accept loop: counts it in `WorkerCtx::accept_loops`
/// until it ends. A drain waits for every loop of the worker to end after
/// closing the listeners ([`WorkerCtx::accept_loops_ended`]): a connection
/// the kernel handed over just before the close (an io_uring accept
/// already completed) is then in the hands of a connection task and
/// counted active, not lost with the process.
pub(super) struct AcceptLoop(Rc<WorkerCtx>);

impl AcceptLoop {
    pub(super) fn enter(ctx: Rc<WorkerCtx>) -> AcceptLoop {
        ctx.accept_loops.set(ctx.accept_loops.get() + 1);
        AcceptLoop(ctx)
    }
}

impl Drop for AcceptLoop {
    fn drop(&mut self) {
        let ctx = &self.0;
        ctx.accept_loops.set(ctx.accept_loops.get() - 1);
        ctx.accept_loop_ended.notify_waiters();
    }
}

/// One accepted connection counted in `Stats::active` from the moment it
/// was accepted until it is done (held by its task, then its `ConnGuard`),
/// so a drain never ends while an accepted connection is still on its way
/// to its task.
pub(super) struct Counted(Arc<Stats>);

impl Counted {
    pub(super) fn new(stats: &Arc<Stats>) -> Counted {
        stats.active.inc();
        Counted(stats.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.active.dec();
    }
}

impl WorkerCtx {
    /// Resolves once no accept loop runs on this worker (after the
    /// listeners were closed, every loop ends at its next accept).
    pub(super) async fn accept_loops_ended(&self) {
        // One thread: no loop can end between the check and the wait's
        // registration (both happen before this task yields).
        while self.accept_loops.get() > 0 {
            self.accept_loop_ended.notified().await;
        }
    }

    /// What a tunnel of this worker's needs of it (counters, mark,
    /// timeout, the shared tunnel state, its id).
    pub(super) fn tunnel_ctx(&self) -> crate::tunnel::ConnCtx<'_> {
        crate::tunnel::ConnCtx {
            stats: &self.stats,
            metrics: &self.metrics,
            mark: self.settings.proxy_mark,
            connect_timeout: self.settings.connect_timeout,
            tunnel: &self.tunnel,
            worker: self.id,
        }
    }
}

/// Spawns `f` on the worker's runtime.
pub(super) fn spawn_local<F: Future<Output = ()> + 'static>(backend: Backend, f: F) {
    match backend {
        Backend::Uring => {
            tokio_uring::spawn(f);
        }
        Backend::Epoll => {
            tokio::task::spawn_local(f);
        }
    }
}

/// Whether `e` says the process is out of fds or memory.
pub(super) fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS) | Some(libc::ENOMEM)
    )
}

/// Resets the client: the connection is refused (policy, no destination).
pub(super) fn refuse(ctx: &WorkerCtx, client: &OwnedFd) {
    ctx.stats.refused.inc();
    sys::tcp_abort(client.as_fd());
}

/// Counts and logs a connection whose source (outbound) or destination
/// (inbound) is not an address of the pod, and resets it.
pub(super) fn refuse_foreign(
    ctx: &WorkerCtx,
    client: &OwnedFd,
    reason: &'static str,
    addr: IpAddr,
) {
    ctx.metrics
        .refused
        .get_or_create(&RefuseLabels { reason })
        .inc();
    tracing::warn!(target: "access", reason, addr = %addr, "connection refused: not an address of the pod; reset");
    refuse(ctx, client);
}

/// Counts and logs a connection refused for `reason` (a label of
/// `ringway_connections_refused_total`), and resets it.
pub(super) fn refuse_counted(
    ctx: &WorkerCtx,
    client: &OwnedFd,
    reason: &'static str,
    why: &dyn std::fmt::Display,
) {
    ctx.metrics
        .refused
        .get_or_create(&RefuseLabels { reason })
        .inc();
    tracing::warn!(target: "access", reason, why = %why, "connection refused; reset");
    refuse(ctx, client);
}

/// Counts and logs a connection refused by policy, and resets it.
pub(super) fn deny(ctx: &WorkerCtx, client: &OwnedFd, path: &'static str, why: &Denied) {
    ctx.metrics
        .denials
        .get_or_create(&DenyLabels { path })
        .inc();
    tracing::info!(target: "access", path, reason = %why, "connection denied by policy; reset");
    refuse(ctx, client);
}

/// The labels of a connection that failed before it opened (rare: built
/// from the cached series only then).
pub(super) fn failed_labels(series: &[Arc<Series>]) -> Vec<TcpLabels> {
    series.iter().map(|s| s.labels.clone()).collect()
}

/// Counts and logs a connection whose destination could not be reached
/// (every attempt failed), and resets the client.
pub(super) fn connect_failed(ctx: &WorkerCtx, client: &OwnedFd, labels: &[TcpLabels], error: &str) {
    tracing::info!(target: "access", %error, "connection failed: upstream connect; client reset");
    ctx.stats.connect_failed.inc();
    for l in labels {
        ctx.metrics.connection_failed(l);
    }
    sys::tcp_abort(client.as_fd());
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// An fd that is no socket: enough for what tests build and never poll.
    pub fn null_fd() -> OwnedFd {
        std::fs::File::open("/dev/null").unwrap().into()
    }

    /// A worker's state on the epoll backend with default settings,
    /// counting into `stats`.
    pub fn test_ctx(stats: Arc<Stats>) -> Rc<WorkerCtx> {
        let settings = ProxySettings::default();
        let metrics = Arc::new(Metrics::default());
        let in_force = Arc::new(InForce::new(settings.workload_wait));
        Rc::new(WorkerCtx {
            id: 0,
            backend: Backend::Epoll,
            pool: PipePool::new(settings.pipe_size, settings.pipe_pool, stats.clone()),
            stats,
            pods: RefCell::new(HashMap::new()),
            local_pods: LocalPods::default(),
            metrics: metrics.clone(),
            last_fd_warning: Cell::new(None),
            tunnel: Arc::new(TunnelState::new(metrics, in_force.clone(), &settings)),
            in_force,
            settings,
            hbone_pool: Rc::new(ringway_hbone::Pool::new(
                ringway_hbone::PoolConfig::default(),
            )),
            next_endpoint: Cell::new(0),
            accept_loops: Cell::new(0),
            accept_loop_ended: tokio::sync::Notify::new(),
        })
    }

    /// A pod "pod" with no address, served here.
    pub fn test_pod() -> Rc<PodLocal> {
        Rc::new(PodLocal::new(
            Arc::new(PodShared::new(
                "pod",
                null_fd(),
                Vec::new(),
                crate::sock::PortSplit::default(),
                Default::default(),
                String::new(),
            )),
            Default::default(),
        ))
    }
}
