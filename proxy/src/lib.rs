//! ringway's node proxy: per-pod transparent listeners and the datapath.
//!
//! The [`Proxy`] is driven by a control thread (the ZDS client, the sandbox,
//! tests): [`Proxy::add_pod`] creates the pod's listener set *inside the pod's
//! network namespace* (outbound 15001, inbound 15006, tunnel 15008; IPv4 and
//! IPv6; one SO_REUSEPORT listener per worker) and hands each worker its
//! share. Workers run thread-per-core event loops (io_uring through
//! tokio-uring, or epoll when io_uring is unavailable) and move bytes with
//! splice; see `copy` and `worker`. With an identity manager and a mesh
//! ([`Proxy::set_identity`], [`Proxy::set_mesh`]) connections between nodes
//! ride HBONE tunnels instead; see `tunnel`.
//!
//! `unsafe` lives only in the io_uring op layer (`uring`) and the syscall
//! layer (`sys`): both need raw pointers or raw fds the safe crates do not
//! expose. Every block carries a `// SAFETY:` comment.

#![deny(unsafe_code)]

mod busy;
pub mod config_dump;
pub mod control;
pub mod copy;
pub mod flows;
pub mod handshake;
pub mod metrics;
pub mod sock;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
pub mod tunnel;
pub mod uring;
pub mod worker;
pub mod zds_client;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ringway_config::{CaptureMode, Datapath, ProxySettings};
use tokio::sync::mpsc;

pub use sock::{Backend, ListenerKind};
pub use stats::{Stats, StatsSnapshot};
use worker::{Cmd, LocalPods, PodShared};

/// Errors of the proxy's control operations.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The settings are not usable.
    #[error("invalid settings: {0}")]
    Settings(#[from] ringway_config::ConfigError),
    /// The configuration's CA could not be loaded (HBONE).
    #[error("loading the mesh CA: {0}")]
    Ca(#[from] ringway_identity::IdentityError),
    /// The certificate refresher thread could not start.
    #[error("starting the certificate refresher: {0}")]
    Refresher(std::io::Error),
    /// io_uring was required but is not available.
    #[error("io_uring is required (datapath: uring) but unavailable: {0}")]
    UringUnavailable(#[source] io::Error),
    /// A worker thread could not be started.
    #[error("cannot start datapath worker {worker}: {source}")]
    Worker {
        /// Worker index.
        worker: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The thread of the tunnel listener's TLS handshakes could not start.
    #[error("cannot start the TLS handshake thread: {source}")]
    HandshakeThread {
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The fd handed in is not a network namespace.
    #[error("pod {uid}: fd is not a network namespace ({what})")]
    NotANetns {
        /// Pod UID.
        uid: String,
        /// What it is instead.
        what: String,
    },
    /// The host's own network namespace was passed where a pod's was expected.
    #[error("pod {uid}: refusing the host network namespace where a pod's is expected")]
    HostNetns {
        /// Pod UID.
        uid: String,
    },
    /// A listener could not be created inside the pod.
    #[error("pod {uid}: cannot create {kind} listener on {addr}: {source}")]
    Listen {
        /// Pod UID.
        uid: String,
        /// Which listener.
        kind: ListenerKind,
        /// Its address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Entering the pod's namespace failed.
    #[error("pod {uid}: cannot enter its network namespace: {source}")]
    EnterNetns {
        /// Pod UID.
        uid: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The datapath is shutting down.
    #[error("the datapath is stopped")]
    Stopped,
    /// The pod claims an address another served pod holds: refused, never
    /// resolved by letting the last one win.
    #[error("pod {uid}: address {addr} is already held by pod {holder}; refusing the pod")]
    AddressConflict {
        /// The pod refused.
        uid: String,
        /// The contested address.
        addr: IpAddr,
        /// The pod that holds it.
        holder: String,
    },
}

/// Who a pod is (from the node agent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodIdentity {
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

/// What the proxy knows about one pod.
#[derive(Debug, Clone)]
pub struct PodInfo {
    /// Pod UID.
    pub uid: String,
    /// Inode of its network namespace.
    pub netns_inode: u64,
    /// Listener addresses (each is bound once per worker).
    pub listeners: Vec<(ListenerKind, SocketAddr)>,
    /// The pod's IP addresses: the agent's (ZDS `addresses`), else, from
    /// agents that send none, those its netns held when it was added.
    pub ips: Vec<IpAddr>,
    /// Where `ips` came from.
    pub ips_source: AddressSource,
    /// Identity, when the agent sent one.
    pub identity: PodIdentity,
    /// Connections open to the pod that its policies authorized (re-checked
    /// on policy changes); filled in by [`Proxy::pods`].
    pub authorized_flows: usize,
}

/// Where the proxy took a pod's addresses from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressSource {
    /// The node agent sent them (CNI result or the pod's status in the API).
    Agent,
    /// The agent sent none (an older agent, or a pod added by hand): read
    /// from the pod's netns, which the pod can write. Logged at add.
    Netns,
}

impl std::fmt::Display for AddressSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AddressSource::Agent => "agent",
            AddressSource::Netns => "netns",
        })
    }
}

struct PodRecord {
    info: PodInfo,
    shared: Arc<PodShared>,
}

struct WorkerHandle {
    tx: mpsc::UnboundedSender<Cmd>,
    join: Option<JoinHandle<()>>,
}

/// The node proxy's datapath.
pub struct Proxy {
    settings: ProxySettings,
    backend: Backend,
    workers: Vec<WorkerHandle>,
    pods: Mutex<HashMap<String, PodRecord>>,
    /// Held for a whole add, so the address-conflict check and the insert
    /// are one step.
    adding: Mutex<()>,
    local_pods: LocalPods,
    stats: Arc<Stats>,
    metrics: Arc<metrics::Metrics>,
    trust_domain: std::sync::RwLock<String>,
    tunnel: Arc<tunnel::TunnelState>,
    hbone_pools: Vec<ringway_hbone::Pool>,
    /// The thread running the server TLS handshakes of 15008.
    handshake_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("backend", &self.backend)
            .field("workers", &self.workers.len())
            .finish()
    }
}

/// Picks the event loop: io_uring unless disabled by config or unavailable.
pub fn choose_backend(want: Datapath) -> Result<Backend, ProxyError> {
    match want {
        Datapath::Epoll => Ok(Backend::Epoll),
        Datapath::Uring => uring::probe()
            .map(|_| Backend::Uring)
            .map_err(ProxyError::UringUnavailable),
        Datapath::Auto => match uring::probe() {
            Ok(()) => Ok(Backend::Uring),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "io_uring is unavailable (kernel.io_uring_disabled or a seccomp profile?); falling back to the epoll datapath"
                );
                Ok(Backend::Epoll)
            }
        },
    }
}

impl Proxy {
    /// Starts the workers.
    pub fn start(settings: ProxySettings) -> Result<Proxy, ProxyError> {
        settings.validate()?;
        let backend = choose_backend(settings.datapath)?;
        match sys::raise_nofile_limit() {
            Ok((old, new)) => {
                if old != new {
                    tracing::info!(from = old, to = new, "raised the open-file limit");
                }
                // Room for 16k connections' fds without a table resize on
                // the datapath (128 KiB of kernel memory).
                sys::reserve_fd_table(new.min(16_384));
            }
            Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
        }
        if !sys::keep_heap_pages() {
            tracing::warn!(
                "cannot set glibc's malloc thresholds: freed buffers are faulted in again"
            );
        }
        let stats = Arc::new(Stats::default());
        let local_pods: LocalPods = Arc::new(RwLock::new(HashMap::new()));
        let metrics = Arc::new(metrics::Metrics::default());
        metrics
            .datapath_uring
            .set(i64::from(backend == Backend::Uring));
        let n = settings.effective_workers();
        let tunnel = Arc::new(tunnel::TunnelState::new(metrics.clone(), &settings));
        let (handshaker, handshake_thread) =
            handshake::Handshaker::start(settings.hbone.handshake_nice)
                .map_err(|source| ProxyError::HandshakeThread { source })?;
        tunnel.set_handshaker(handshaker);
        let mut workers = Vec::with_capacity(n);
        let mut hbone_pools = Vec::with_capacity(n);
        for id in 0..n {
            let (tx, rx) = mpsc::unbounded_channel();
            let s = settings.clone();
            let pool = ringway_hbone::Pool::new(ringway_hbone::PoolConfig::default());
            hbone_pools.push(pool.clone());
            let shared = worker::Shared {
                stats: stats.clone(),
                local_pods: local_pods.clone(),
                metrics: metrics.clone(),
                tunnel: tunnel.clone(),
                hbone_pool: pool,
            };
            let join = std::thread::Builder::new()
                .name(worker::thread_name(id))
                .spawn(move || {
                    if let Err(e) = worker::run(id, backend, s, shared, rx) {
                        tracing::error!(worker = id, error = %e, "worker failed");
                    }
                })
                .map_err(|source| ProxyError::Worker { worker: id, source })?;
            workers.push(WorkerHandle {
                tx,
                join: Some(join),
            });
        }
        let _ = metrics.hbone_pools.set(hbone_pools.clone());
        tracing::info!(workers = n, datapath = %backend, mode = %settings.capture_mode, "datapath started");
        Ok(Proxy {
            settings,
            backend,
            workers,
            pods: Mutex::new(HashMap::new()),
            adding: Mutex::new(()),
            local_pods,
            stats,
            metrics,
            trust_domain: std::sync::RwLock::new("cluster.local".to_string()),
            tunnel,
            hbone_pools,
            handshake_thread: Some(handshake_thread),
        })
    }

    /// Turns HBONE on (with an identity manager) or off (`None`). HBONE also
    /// needs a mesh ([`Proxy::set_mesh`]); without both, every connection
    /// takes the plaintext path.
    pub fn set_identity(&self, ids: Option<Arc<ringway_identity::IdentityManager>>) {
        *self
            .metrics
            .identities
            .write()
            .unwrap_or_else(|p| p.into_inner()) = ids.clone();
        self.tunnel.set_identity(ids);
    }

    /// Turns HBONE on as `mesh` says: with a `ca:` section, an identity
    /// manager over that CA issuing workload certificates (refreshed by the
    /// returned thread every minute); without one, HBONE stays off (`None`).
    /// `ringway proxy` and the bench's proxy both start HBONE this way.
    pub fn enable_hbone(
        &self,
        mesh: &ringway_config::Mesh,
    ) -> Result<Option<ringway_identity::Refresher>, ProxyError> {
        let Some(ca) = mesh.ca() else {
            tracing::info!("HBONE off: no `ca:` in the configuration");
            return Ok(None);
        };
        let ids = Arc::new(ringway_identity::IdentityManager::from_config(
            ca,
            mesh.trust_domain(),
            ringway_identity::DEFAULT_CERT_LIFETIME,
        )?);
        let refresher = ids
            .spawn_refresher(Duration::from_secs(60))
            .map_err(ProxyError::Refresher)?;
        self.set_identity(Some(ids));
        tracing::info!("HBONE on: workload certificates issued by the configured CA");
        Ok(Some(refresher))
    }

    /// Publishes the mesh (workloads, policies, trust domain): which
    /// destinations are tunnelled and what authorization allows. Swappable
    /// at any time (hot reload); connections opened afterwards use it.
    ///
    /// Open connections are then re-checked against the new policies and
    /// those now denied are reset (the number is returned).
    pub fn set_mesh(&self, mesh: Arc<ringway_config::Mesh>) -> usize {
        self.set_trust_domain(mesh.trust_domain());
        self.metrics
            .set_cluster_policy_notes(mesh.cluster_policy_notes());
        // Publish first, re-check second (see `flows::register`).
        self.tunnel.set_mesh(mesh.clone());
        let pods: Vec<Arc<PodShared>> = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| r.shared.clone())
            .collect();
        // The pods' metrics labels under this mesh, made once here rather
        // than by connections.
        for pod in &pods {
            pod.relabel(Some(&mesh));
        }
        let reset = flows::recheck(&mesh, &pods, &self.metrics);
        if reset > 0 {
            tracing::info!(
                connections_reset = reset,
                "policy change: open connections re-checked"
            );
        }
        reset
    }

    /// The identity manager HBONE uses, if HBONE is on
    /// ([`Proxy::set_identity`]).
    pub fn identities(&self) -> Option<Arc<ringway_identity::IdentityManager>> {
        self.metrics
            .identities
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The mesh snapshot in force, if any.
    pub fn mesh(&self) -> Option<Arc<ringway_config::Mesh>> {
        self.tunnel.mesh()
    }

    /// Whether HBONE is on (identity manager and mesh present).
    pub fn hbone_enabled(&self) -> bool {
        self.tunnel.enabled().is_some()
    }

    /// Open outbound HBONE (HTTP/2) connections, all workers' pools together.
    pub fn hbone_connections(&self) -> usize {
        self.hbone_pools.iter().map(|p| p.connections()).sum()
    }

    /// Outbound HBONE connections opened since start, all workers together.
    pub fn hbone_connections_opened(&self) -> u64 {
        self.hbone_pools
            .iter()
            .map(|p| p.connections_opened())
            .sum()
    }

    /// Open outbound HBONE streams, all workers together.
    pub fn hbone_streams(&self) -> usize {
        self.hbone_pools.iter().map(|p| p.streams()).sum()
    }

    /// The event loop in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The settings in force.
    pub fn settings(&self) -> &ProxySettings {
        &self.settings
    }

    /// Datapath counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// The live counters (for the metrics endpoint).
    pub fn stats_handle(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// The Prometheus metrics.
    pub fn metrics(&self) -> Arc<metrics::Metrics> {
        self.metrics.clone()
    }

    /// Sets the trust domain of the pods' SPIFFE principals (metrics labels),
    /// for the pods served now and those added later.
    fn set_trust_domain(&self, td: &str) {
        {
            let mut cur = self.trust_domain.write().unwrap_or_else(|p| p.into_inner());
            if *cur == td {
                return;
            }
            *cur = td.to_string();
        }
        for rec in self.pods.lock().unwrap_or_else(|p| p.into_inner()).values() {
            let principal = self.principal_of(&rec.info.identity);
            rec.shared.who.write().unwrap_or_else(|p| p.into_inner()).1 = principal;
            rec.shared.relabel(self.tunnel.mesh().as_ref());
        }
    }

    /// Starts serving pod `uid` whose network namespace is `netns`.
    ///
    /// Idempotent for the same namespace; a different namespace for the same
    /// UID replaces the pod's listeners. On error nothing of the pod is left.
    pub fn add_pod(&self, uid: &str, netns: OwnedFd) -> Result<(), ProxyError> {
        self.add_pod_with_identity(uid, netns, PodIdentity::default())
    }

    /// [`Proxy::add_pod`] with the pod's identity (addresses from its netns).
    pub fn add_pod_with_identity(
        &self,
        uid: &str,
        netns: OwnedFd,
        identity: PodIdentity,
    ) -> Result<(), ProxyError> {
        self.add_pod_with_addresses(uid, netns, identity, &[])
    }

    /// [`Proxy::add_pod`] with the pod's identity and its addresses as the
    /// node agent knows them. Those addresses are the pod's: outbound
    /// connections from any other source are reset, and inbound ones to any
    /// other destination. With none (an older agent) they are read from the
    /// pod's netns, with a warning: the pod can write those.
    ///
    /// A pod that claims an address another served pod holds is refused
    /// ([`ProxyError::AddressConflict`]); nothing of it is left.
    pub fn add_pod_with_addresses(
        &self,
        uid: &str,
        netns: OwnedFd,
        identity: PodIdentity,
        addresses: &[IpAddr],
    ) -> Result<(), ProxyError> {
        let _adding = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        check_pod_netns(uid, netns.as_fd())?;
        let ino =
            sys::netns_inode(Some(netns.as_fd())).map_err(|source| ProxyError::EnterNetns {
                uid: uid.to_string(),
                source,
            })?;
        {
            let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            let sent = canonical(addresses);
            let same = pods
                .get_mut(uid)
                .filter(|p| p.info.netns_inode == ino)
                // Addresses taken from the netns (an older agent) give way
                // to the agent's when they differ: the pod is served anew
                // below (its connections reset), as for another netns.
                .filter(|p| {
                    sent.is_empty()
                        || sent == p.info.ips
                        || p.info.ips_source == AddressSource::Agent
                });
            if let Some(rec) = same {
                // Same pod, same netns: keep listeners and connections; take
                // a fuller identity if the agent now knows one.
                if identity != rec.info.identity && !identity.namespace.is_empty() {
                    let principal = self.principal_of(&identity);
                    *rec.shared.who.write().unwrap_or_else(|p| p.into_inner()) =
                        (identity.clone(), principal);
                    rec.shared.relabel(self.tunnel.mesh().as_ref());
                    rec.info.identity = identity;
                    tracing::info!(pod.uid = uid, "pod identity updated");
                }
                if !sent.is_empty() && sent == rec.info.ips {
                    rec.info.ips_source = AddressSource::Agent;
                } else if !sent.is_empty() {
                    tracing::warn!(
                        pod.uid = uid,
                        pod.addresses = ?rec.info.ips,
                        sent.addresses = ?sent,
                        "the agent sent other addresses for a pod already served in the same netns; keeping the first"
                    );
                }
                return Ok(());
            }
        }
        let (ips, ips_source) = if addresses.is_empty() {
            let ips = sys::in_netns(netns.as_fd(), pod_addresses).map_err(|source| {
                ProxyError::EnterNetns {
                    uid: uid.to_string(),
                    source,
                }
            })?;
            tracing::warn!(
                pod.uid = uid,
                pod.addresses = ?ips,
                "the agent sent no addresses for the pod; taking those its netns holds (the pod can write them)"
            );
            (ips, AddressSource::Netns)
        } else {
            (canonical(addresses), AddressSource::Agent)
        };
        if ips.is_empty() {
            tracing::warn!(
                pod.uid = uid,
                "the pod has no addresses: its outbound connections will be refused"
            );
        }
        {
            let pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
            for (other, rec) in pods.iter().filter(|(other, _)| other.as_str() != uid) {
                if let Some(addr) = ips.iter().find(|ip| rec.info.ips.contains(ip)) {
                    return Err(ProxyError::AddressConflict {
                        uid: uid.to_string(),
                        addr: *addr,
                        holder: other.clone(),
                    });
                }
            }
        }
        let (per_worker, addrs) = self.make_listeners(uid, netns.as_fd())?;
        let ports = sys::in_netns(netns.as_fd(), sock::PortSplit::current).unwrap_or_default();
        let principal = self.principal_of(&identity);
        let shared = Arc::new(PodShared {
            uid: Arc::from(uid),
            netns,
            ips: ips.clone(),
            ports,
            who: RwLock::new((identity.clone(), principal)),
            flows: flows::FlowTable::default(),
            preauth: Default::default(),
            labels: Default::default(),
        });
        shared.relabel(self.tunnel.mesh().as_ref());
        // Every worker knows the pod before it becomes a same-node fast-path
        // target (`local_pods`): a fast-path connection is then always
        // registered with the target, so removing the target resets it.
        let mut waits = Vec::with_capacity(self.workers.len());
        for (w, listeners) in self.workers.iter().zip(per_worker) {
            let (done, rx) = std::sync::mpsc::channel();
            w.tx.send(Cmd::AddPod {
                pod: shared.clone(),
                listeners,
                done,
            })
            .map_err(|_| ProxyError::Stopped)?;
            waits.push(rx);
        }
        for rx in waits {
            rx.recv_timeout(Duration::from_secs(5))
                .map_err(|_| ProxyError::Stopped)?;
        }
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        {
            let mut local = self.local_pods.write().unwrap_or_else(|p| p.into_inner());
            if let Some(old) = pods.get(uid) {
                for ip in &old.info.ips {
                    local.remove(ip);
                }
            }
            for ip in &ips {
                local.insert(*ip, shared.clone());
            }
        }
        let listeners_added = (addrs.len() * self.workers.len()) as i64;
        if let Some(old) = pods.get(uid) {
            self.metrics
                .listeners
                .dec_by((old.info.listeners.len() * self.workers.len()) as i64);
        } else {
            self.metrics.pods.inc();
        }
        self.metrics.listeners.inc_by(listeners_added);
        pods.insert(
            uid.to_string(),
            PodRecord {
                info: PodInfo {
                    uid: uid.to_string(),
                    netns_inode: ino,
                    listeners: addrs,
                    ips,
                    ips_source,
                    identity,
                    authorized_flows: 0,
                },
                shared: shared.clone(),
            },
        );
        // Get the pod's certificate now, on the control thread, so the
        // datapath seldom has to (key generation takes milliseconds; a
        // certificate service one round trip, waited for at most 2 s: the
        // agent waits for this Add's ack).
        if let Some((ids, mesh)) = self.tunnel.enabled() {
            if let Some(id) = tunnel::pod_identity(&mesh, &shared) {
                if let Err(e) = ids.prefetch(&id, Duration::from_secs(2)) {
                    tracing::warn!(pod.uid = uid, error = %e, "cannot issue the pod's certificate");
                }
            }
        }
        tracing::info!(pod.uid = uid, "pod added");
        Ok(())
    }

    /// The pod's SPIFFE principal, empty when the agent did not say both its
    /// namespace and service account (never a guessed `sa/default`).
    fn principal_of(&self, identity: &PodIdentity) -> String {
        if identity.namespace.is_empty() || identity.service_account.is_empty() {
            return String::new();
        }
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain.read().unwrap_or_else(|p| p.into_inner()),
            identity.namespace,
            identity.service_account
        )
    }

    fn make_listeners(&self, uid: &str, netns: BorrowedFd<'_>) -> Result<ListenerSet, ProxyError> {
        let s = &self.settings;
        let kinds = [
            (ListenerKind::Outbound, s.ports.outbound, false),
            (
                ListenerKind::Inbound,
                s.ports.inbound,
                s.capture_mode == CaptureMode::Tproxy,
            ),
            (ListenerKind::Tunnel, s.ports.tunnel, false),
        ];
        let result = sys::in_netns(netns, || {
            let mut per_worker: Vec<Vec<(ListenerKind, OwnedFd)>> =
                (0..self.workers.len()).map(|_| Vec::new()).collect();
            let mut addrs = Vec::new();
            let v6_ok = ipv6_available();
            for (kind, port, transparent) in kinds {
                let mut fams = vec![IpAddr::V4(Ipv4Addr::UNSPECIFIED)];
                if v6_ok {
                    fams.push(IpAddr::V6(Ipv6Addr::UNSPECIFIED));
                }
                for ip in fams {
                    let addr = SocketAddr::new(ip, port);
                    for slot in per_worker.iter_mut() {
                        let fd = sock::make_listener(addr, transparent, s.proxy_mark, s.backlog)
                            .map_err(|source| ProxyError::Listen {
                                uid: uid.to_string(),
                                kind,
                                addr,
                                source,
                            })?;
                        slot.push((kind, fd));
                    }
                    addrs.push((kind, addr));
                }
            }
            Ok((per_worker, addrs))
        })
        .map_err(|source| ProxyError::EnterNetns {
            uid: uid.to_string(),
            source,
        })?;
        result
    }

    /// Stops serving pod `uid`: its listeners close and its connections are
    /// reset before this returns. Returns the number of connections reset, or
    /// `None` for an unknown pod.
    pub fn remove_pod(&self, uid: &str) -> Option<usize> {
        let rec = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid)?;
        {
            let mut local = self.local_pods.write().unwrap_or_else(|p| p.into_inner());
            for ip in &rec.info.ips {
                local.remove(ip);
            }
        }
        self.metrics.pods.dec();
        self.metrics
            .listeners
            .dec_by((rec.info.listeners.len() * self.workers.len()) as i64);
        let mut total = 0;
        let mut waits = Vec::new();
        for w in &self.workers {
            let (tx, rx) = std::sync::mpsc::channel();
            if w.tx
                .send(Cmd::RemovePod {
                    uid: Arc::from(uid),
                    done: tx,
                })
                .is_ok()
            {
                waits.push(rx);
            }
        }
        for rx in waits {
            total += rx.recv_timeout(Duration::from_secs(5)).unwrap_or(0);
        }
        // Its istio_tcp_* series go with it (after its connections were
        // reset and counted), unless another pod still serving reports
        // under the same workload and namespace.
        let series = self.forget_series_of(&rec.shared);
        // Its certificate goes too, unless another pod here has the same
        // identity (open connections keep theirs).
        if let Some((ids, mesh)) = self.tunnel.enabled() {
            if let Some(id) = tunnel::pod_identity(&mesh, &rec.shared) {
                let shared_by_another = self
                    .pods
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .values()
                    .any(|other| tunnel::pod_identity(&mesh, &other.shared).as_ref() == Some(&id));
                if !shared_by_another {
                    ids.forget(&id);
                }
            }
        }
        tracing::info!(pod.uid = %rec.info.uid, connections_reset = total, metrics.series_dropped = series, "pod removed");
        Some(total)
    }

    /// Drops the metric series of `removed` under every name its labels
    /// ever had (its UID before the agent named it, the agent's name, each
    /// name the mesh gave it: [`PodShared::label_names`]), skipping a name
    /// another served pod has had (replicas of one workload share it).
    fn forget_series_of(&self, removed: &PodShared) -> usize {
        let live: std::collections::HashSet<(String, String)> = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flat_map(|r| r.shared.label_names())
            .collect();
        let gone: Vec<(String, String)> = removed
            .label_names()
            .into_iter()
            .filter(|n| !live.contains(n))
            .collect();
        self.metrics.forget_owners(&gone)
    }

    /// The pods being served.
    pub fn pods(&self) -> Vec<PodInfo> {
        let mut v: Vec<_> = self
            .pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| PodInfo {
                authorized_flows: r.shared.flows.len(),
                ..r.info.clone()
            })
            .collect();
        v.sort_by(|a, b| a.uid.cmp(&b.uid));
        v
    }

    /// Closes every listener at once (new connections go to another proxy
    /// bound to the same ports, or wait in the kernel), keeping established
    /// connections flowing.
    pub fn close_listeners(&self) {
        // Tunnel servers send GOAWAY so peers stop opening streams here.
        self.tunnel.drain();
        let mut waits = Vec::new();
        for w in &self.workers {
            let (tx, rx) = std::sync::mpsc::channel();
            if w.tx.send(Cmd::CloseListeners { done: tx }).is_ok() {
                waits.push(rx);
            }
        }
        for rx in waits {
            let _ = rx.recv_timeout(Duration::from_secs(5));
        }
    }

    /// Tells every worker to reset its connections and stop, without waiting
    /// (for a proxy still shared elsewhere at exit).
    pub fn stop_workers_now(&self) {
        for w in &self.workers {
            let _ = w.tx.send(Cmd::Stop);
        }
        self.tunnel.stop_handshaker();
    }

    /// Resets every connection and stops the workers.
    pub fn shutdown(mut self) {
        self.stop_workers();
    }

    fn stop_workers(&mut self) {
        for w in &self.workers {
            let _ = w.tx.send(Cmd::Stop);
        }
        for w in &mut self.workers {
            if let Some(j) = w.join.take() {
                let _ = j.join();
            }
        }
        // Then the handshakes still under way (their workers are gone).
        self.tunnel.stop_handshaker();
        if let Some(j) = self.handshake_thread.take() {
            let _ = j.join();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop_workers();
    }
}

/// Listeners per worker and their addresses.
type ListenerSet = (
    Vec<Vec<(ListenerKind, OwnedFd)>>,
    Vec<(ListenerKind, SocketAddr)>,
);

/// Addresses in canonical form (IPv4-mapped IPv6 as IPv4), deduplicated.
fn canonical(addresses: &[IpAddr]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(addresses.len());
    for ip in addresses.iter().map(|ip| ip.to_canonical()) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// The calling thread's netns addresses, loopback and link-local excluded,
/// and nothing on a loopback interface (a pod's address is never there).
fn pod_addresses() -> Vec<IpAddr> {
    let mut ips = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            if a.flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
            {
                continue;
            }
            let Some(sa) = a.address else { continue };
            let ip = if let Some(v4) = sa.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else if let Some(v6) = sa.as_sockaddr_in6() {
                IpAddr::V6(v6.ip())
            } else {
                continue;
            };
            let link_local = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
            if !ip.is_loopback() && !link_local && !ips.contains(&ip) {
                ips.push(ip);
            }
        }
    }
    ips
}

fn ipv6_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// Refuses anything but a pod's network namespace: a non-netns fd, and the
/// host's (PID 1's, this process's, the calling thread's). Accepts fds opened
/// through a bind mount (`/var/run/netns/cni-...`), as runtimes pass them.
pub fn check_pod_netns(uid: &str, fd: BorrowedFd<'_>) -> Result<(), ProxyError> {
    use ringway_redirect::RedirectError;
    match ringway_redirect::check_pod_netns(fd) {
        Ok(()) => Ok(()),
        Err(RedirectError::NotANetns { found, .. }) => Err(ProxyError::NotANetns {
            uid: uid.to_string(),
            what: found,
        }),
        Err(RedirectError::HostNetns { .. }) => Err(ProxyError::HostNetns {
            uid: uid.to_string(),
        }),
        Err(e) => Err(ProxyError::EnterNetns {
            uid: uid.to_string(),
            source: io::Error::other(e.to_string()),
        }),
    }
}

/// The capture rules that match these proxy settings (same ports and mark).
pub fn capture_spec(settings: &ProxySettings) -> ringway_redirect::CaptureSpec {
    ringway_redirect::CaptureSpec {
        mode: match settings.capture_mode {
            CaptureMode::Tproxy => ringway_redirect::CaptureMode::Tproxy,
            CaptureMode::Redirect => ringway_redirect::CaptureMode::Redirect,
        },
        outbound_port: settings.ports.outbound,
        inbound_port: settings.ports.inbound,
        tunnel_port: settings.ports.tunnel,
        proxy_mark: settings.proxy_mark,
        ..ringway_redirect::CaptureSpec::default()
    }
}
