//! Datapath workers: one thread per core, each with its own event loop
//! (tokio-uring, or a current-thread tokio runtime on epoll), its own
//! SO_REUSEPORT listeners for every pod, and no work stealing. Workers take
//! commands from the control thread over a channel and never block on it.
//!
//! One concern per module, in layers: `ctx` (a worker's state, the pods it
//! serves, refusals), `splice` (the spliced path), `outbound` (where an
//! outbound connection goes: fast path, tunnel, direct), `conn` (the
//! accept loop and each connection's first steps), and this module (the
//! worker's thread and the control thread's commands).

mod conn;
mod ctx;
mod outbound;
mod splice;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;

use ringway_config::ProxySettings;
use tokio::sync::mpsc;

use crate::busy;
use crate::copy::PipePool;
use crate::in_force::InForce;
use crate::metrics::Metrics;
use crate::pod::{LocalPods, PodShared};
use crate::sock::{Backend, ListenerKind, Sock};
use crate::stats::Stats;
use crate::tunnel::{PreauthSlots, TunnelState};
use conn::accept_loop;
use ctx::{spawn_local, PodLocal, WorkerCtx};

/// The prefix of a worker thread's name: worker N is `ringway-wk-N`. Below
/// 10,000 workers (the config allows 1,024) every name fits in the 15 bytes
/// the kernel keeps, so `top -H`, `ps`, `perf` and
/// `/proc/<pid>/task/*/comm` tell the workers apart.
pub const THREAD_PREFIX: &str = "ringway-wk-";
const _: () = assert!(
    THREAD_PREFIX.len() + 4 <= 15,
    "worker names up to 4 digits must fit the 15 bytes the kernel keeps"
);

/// The name of worker `id`'s thread.
pub fn thread_name(id: usize) -> String {
    format!("{THREAD_PREFIX}{id}")
}

/// Commands from the control thread.
#[derive(Debug)]
pub enum Cmd {
    /// Start serving a pod on these listeners (this worker's share).
    AddPod {
        /// The pod.
        pod: Arc<PodShared>,
        /// Its pre-authentication places on the tunnel port (one per pod,
        /// shared by every worker).
        preauth: Arc<PreauthSlots>,
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
    /// Answered once the worker's accept loops have ended, so that what
    /// they accepted before the close is counted active.
    CloseListeners {
        /// Reply channel.
        done: std::sync::mpsc::Sender<()>,
    },
    /// Dial these tunnels into this worker's pool ahead of traffic (an
    /// upgrade's warm-up, see `crate::tunnel::warm`), until `deadline`;
    /// replies with what it did.
    WarmTunnels {
        /// The tunnels.
        targets: Arc<Vec<crate::tunnel::warm::WarmTarget>>,
        /// When to give up.
        deadline: std::time::Instant,
        /// Reply channel.
        done: std::sync::mpsc::Sender<crate::tunnel::warm::WarmReport>,
    },
    /// Free this worker's spare TLS read buffers and give the free memory
    /// at the top of its heap back (the idle trim,
    /// [`crate::idle_trim::IdleTrim`], asks once the proxy is quiet).
    ReleaseHeap {
        /// Replied once done.
        done: std::sync::mpsc::Sender<()>,
    },
    /// Reset every connection and exit.
    Stop,
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
    /// The identity manager and the mesh in force.
    pub in_force: Arc<InForce>,
    /// HBONE: the tunnel listener's state.
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
        in_force,
        tunnel,
        hbone_pool,
    } = shared;
    let ctx = Rc::new(WorkerCtx {
        id,
        backend,
        pool: PipePool::new(settings.pipe_size, settings.pipe_pool, stats.clone()),
        settings,
        stats,
        pods: RefCell::new(HashMap::new()),
        local_pods,
        metrics,
        last_fd_warning: Cell::new(None),
        in_force,
        tunnel,
        hbone_pool: Rc::new(hbone_pool),
        next_endpoint: Cell::new(0),
        accept_loops: Cell::new(0),
        accept_loop_ended: tokio::sync::Notify::new(),
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
    // Every task of this worker runs in its LocalSet: the tunnels' HTTP/2
    // tasks too, so one wake-up hands a message along without the extra
    // event-loop poll a hand-over between run queues costs (see
    // `ringway_hbone::LocalTasks`).
    let _local = ringway_hbone::LocalTasks::enter();
    // Tunnel servers other workers hand here (the server end of a tunnel
    // this worker dialled: both ends on one thread).
    let (serve_tx, mut serve_rx) = mpsc::unbounded_channel::<crate::tunnel::ServeJob>();
    ctx.tunnel.serve_queue(ctx.id, serve_tx);
    {
        let backend = ctx.backend;
        spawn_local(backend, async move {
            while let Some(job) = serve_rx.recv().await {
                spawn_local(backend, job);
            }
        });
    }
    if ctx.settings.busy_poll_micros > 0 {
        let window = std::time::Duration::from_micros(ctx.settings.busy_poll_micros.into());
        spawn_local(ctx.backend, busy::run(window, ctx.stats.clone()));
    }
    while let Some(cmd) = rx.recv().await {
        match cmd {
            Cmd::AddPod {
                pod,
                preauth,
                listeners,
                done,
            } => {
                add_pod(&ctx, pod, preauth, listeners);
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
                // Done once every accept loop has ended: what they accepted
                // before the close is then counted active (see `AcceptLoop`).
                let ctx = ctx.clone();
                spawn_local(ctx.backend, async move {
                    ctx.accept_loops_ended().await;
                    let _ = done.send(());
                });
            }
            Cmd::WarmTunnels {
                targets,
                deadline,
                done,
            } => {
                let ctx = ctx.clone();
                spawn_local(ctx.backend, async move {
                    let cx = ctx.tunnel_ctx();
                    let r = crate::tunnel::warm::dial_all(&cx, &ctx.hbone_pool, &targets, deadline)
                        .await;
                    let _ = done.send(r);
                });
            }
            Cmd::ReleaseHeap { done } => {
                crate::tunnel::drop_spare_tls_bufs();
                crate::sys::release_heap_top();
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
    // Tunnels dialled from the pod's netns go with it (an address reused by
    // a later pod must not ride them).
    let ips = &pod.shared.ips;
    ctx.hbone_pool.evict(|k| ips.contains(&k.src_ip));
    pod.abort_all()
}

fn add_pod(
    ctx: &Rc<WorkerCtx>,
    pod: Arc<PodShared>,
    preauth: Arc<PreauthSlots>,
    listeners: Vec<(ListenerKind, OwnedFd)>,
) {
    if ctx.pods.borrow().contains_key(&pod.uid) {
        remove_pod(ctx, &pod.uid);
    }
    // A tunnel pooled under one of the pod's addresses belongs to the pod
    // that held the address before (a dial that ended after its removal):
    // its socket is in that pod's netns. Never ridden by this one.
    let stale = ctx.hbone_pool.evict(|k| pod.ips.contains(&k.src_ip));
    if stale > 0 {
        tracing::debug!(pod = %pod.uid, stale, "closed tunnels pooled under the pod's addresses before it came");
    }
    let local = Rc::new(PodLocal::new(pod.clone(), preauth));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::PodShared;
    use crate::stats::Stats;
    use crate::worker::ctx::tests::{null_fd, test_ctx};

    /// An address outlives its pod: a tunnel pooled under it (a dial that
    /// ended after the old pod's removal, its socket in the old pod's
    /// netns) is closed when a new pod comes with the address, so the new
    /// pod's connections never ride it.
    #[test]
    fn a_new_pod_never_rides_a_tunnel_pooled_under_its_address_before_it_came() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, async {
            let ctx = test_ctx(Arc::new(Stats::default()));
            let ip: std::net::IpAddr = "10.0.0.5".parse().unwrap();
            let key = |src_ip| ringway_hbone::PoolKey {
                src_identity: "spiffe://cluster.local/ns/a/sa/a".into(),
                dst_identity: "spiffe://cluster.local/ns/b/sa/b".into(),
                src_ip,
                dst: "10.0.0.9:15008".parse().unwrap(),
                trust_generation: 0,
            };
            // Two pooled tunnels, one under the address, one under another.
            for src in [ip, "10.0.0.6".parse().unwrap()] {
                let (near, far) = tokio::io::duplex(64 * 1024);
                tokio::spawn(async move {
                    let peer = ringway_hbone::PeerInfo {
                        identity: "spiffe://cluster.local/ns/a/sa/a".into(),
                        addr: "10.0.0.1:40000".parse().unwrap(),
                    };
                    let config = ringway_hbone::ServerConfig::default();
                    let never = ringway_hbone::DrainSignal::never();
                    let deny = |_req| async { ringway_hbone::Decision::Deny401("test".into()) };
                    let _ = ringway_hbone::serve_connection(far, peer, &config, never, deny).await;
                });
                let dialled = ctx
                    .hbone_pool
                    .warm(key(src), || async { Ok(near) }, false)
                    .await
                    .unwrap();
                assert!(dialled);
            }
            assert_eq!(ctx.hbone_pool.keys().len(), 2);
            let pod = Arc::new(PodShared::new(
                "new",
                null_fd(),
                vec![ip],
                crate::sock::PortSplit::default(),
                Default::default(),
                String::new(),
            ));
            add_pod(&ctx, pod, Default::default(), Vec::new());
            assert_eq!(
                ctx.hbone_pool.keys(),
                vec![key("10.0.0.6".parse().unwrap())],
                "the tunnel under the new pod's address is still pooled"
            );
        });
    }

    /// Every worker's name is whole in `/proc/<pid>/task/*/comm` (the kernel
    /// keeps 15 bytes): the last worker the config allows, seen from its own
    /// thread.
    #[test]
    fn worker_names_fit_what_the_kernel_keeps() {
        let name = thread_name(1023);
        let comm = std::thread::Builder::new()
            .name(name.clone())
            .spawn(|| std::fs::read_to_string("/proc/thread-self/comm").unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(comm.trim_end(), name);
        assert!(name.starts_with(THREAD_PREFIX));
    }
}
