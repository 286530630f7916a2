//! The node proxy's datapath as its control thread drives it ([`Proxy`]):
//! the workers started, pods added (listeners made inside each pod's
//! netns, handed to every worker) and removed, the mesh and identities
//! published (and open flows re-checked), an upgrade's warm-up (the
//! previous proxy's tunnels dialled before this one reports ready, see
//! [`crate::tunnel::warm`]), listeners closed for an upgrade, the workers
//! stopped.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use ringway_config::{CaptureMode, Datapath, ProxySettings};
use tokio::sync::mpsc;

use crate::error::ProxyError;
use crate::handshake::Handshaker;
use crate::in_force::InForce;
use crate::metrics::Metrics;
use crate::netns::{canonical, check_pod_netns, ipv6_available, pod_addresses};
use crate::pod::{AddressSource, LocalPods, PodIdentity, PodInfo, PodShared};
use crate::policy;
use crate::sock::{self, Backend, ListenerKind};
use crate::stats::{Stats, StatsSnapshot};
use crate::sys;
use crate::tunnel::{warm, PreauthSlots, TunnelState};
use crate::uring;
use crate::worker::{self, Cmd};

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

struct PodRecord {
    info: PodInfo,
    shared: Arc<PodShared>,
    /// The last mesh identity the pod was found to have: its certificate
    /// is kept while the pod has none (its workload missing from a
    /// publish), and let go once it has another or is removed.
    last_identity: Option<ringway_identity::Identity>,
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
    metrics: Arc<Metrics>,
    trust_domain: std::sync::RwLock<String>,
    in_force: Arc<InForce>,
    tunnel: Arc<TunnelState>,
    hbone_pools: Vec<ringway_hbone::Pool>,
    /// The thread running the server TLS handshakes of 15008.
    handshake_thread: Option<JoinHandle<()>>,
    /// The record of the tunnels held, in the state directory
    /// ([`Proxy::set_state_dir`]), and the thread writing it.
    recorder: Mutex<Option<(std::path::PathBuf, warm::Recorder)>>,
    /// Gives the heaps' free memory back once the proxy is quiet.
    _idle_trim: Option<crate::idle_trim::IdleTrim>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("backend", &self.backend)
            .field("workers", &self.workers.len())
            .finish()
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
        let metrics = Arc::new(Metrics::default());
        metrics
            .datapath_uring
            .set(i64::from(backend == Backend::Uring));
        let n = settings.effective_workers();
        let in_force = Arc::new(InForce::new(settings.workload_wait));
        let tunnel = Arc::new(TunnelState::new(
            metrics.clone(),
            in_force.clone(),
            &settings,
        ));
        let (handshaker, handshake_thread) = Handshaker::start(settings.hbone.handshake_nice)
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
                in_force: in_force.clone(),
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
        let worker_txs: Vec<_> = workers.iter().map(|w| w.tx.clone()).collect();
        let idle_trim = crate::idle_trim::IdleTrim::start(
            Default::default(),
            metrics.clone(),
            move || release_worker_heaps(&worker_txs),
        )
                .map_err(|e| tracing::warn!(error = %e, "cannot start the idle trim: memory freed after a load stays resident"))
                .ok();
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
            in_force,
            tunnel,
            hbone_pools,
            handshake_thread: Some(handshake_thread),
            recorder: Mutex::new(None),
            _idle_trim: idle_trim,
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
        self.in_force.set_identity(ids);
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

    /// Whether a reloaded configuration may replace the one in force: not
    /// when HBONE is on and it names another trust domain (the workload
    /// certificates, and the peers' checks of them, are of the one the
    /// proxy started with: every tunnel would fail).
    pub fn check_reload(&self, mesh: &ringway_config::Mesh) -> Result<(), ProxyError> {
        match self.identities() {
            Some(ids) if ids.trust_domain() != mesh.trust_domain() => {
                Err(ProxyError::TrustDomainChanged {
                    running: ids.trust_domain().to_owned(),
                    edited: mesh.trust_domain().to_owned(),
                })
            }
            _ => Ok(()),
        }
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
        // Publish first, re-check second (see `policy::register`).
        self.in_force.set_mesh(mesh.clone());
        let pods = self.pods_shared();
        // The pods' metrics labels under this mesh, made once here rather
        // than by connections.
        for pod in &pods {
            pod.relabel(Some(&mesh));
        }
        let reset = policy::recheck(&mesh, &pods, &self.metrics);
        if reset > 0 {
            tracing::info!(
                connections_reset = reset,
                "policy change: open connections re-checked"
            );
        }
        // A pod the mesh now gives another identity leaves the former's
        // certificate unused.
        self.reconcile_certificates();
        reset
    }

    /// Forgets the certificate of every identity no pod served here has
    /// (its pod gone, or given another identity by the agent or the mesh),
    /// so the refresher stops renewing it and readiness never waits for
    /// it; a pod that has no identity (its workload missing from a
    /// publish) keeps its last one's. And wants the certificate
    /// of every identity a pod has that is not held yet (the mesh gave a
    /// pod a new one): with a certificate service the refresher gets it
    /// now, not after a connection failed for want of it. Decides under
    /// the pods' lock with the mesh in force read under it, so of two
    /// threads deciding at once (a publish, a removal) the last decides
    /// with the newest mesh; a pod being added is in the map before its
    /// certificate is fetched, so its own is kept. Open connections keep
    /// the certificate they were made with.
    fn reconcile_certificates(&self) {
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let Some((ids, mesh)) = self.in_force.enabled() else {
            return;
        };
        let mut in_use = std::collections::HashSet::new();
        for rec in pods.values_mut() {
            if let Some(id) = policy::pod_identity(&mesh, &rec.shared) {
                rec.last_identity = Some(id);
            }
            if let Some(id) = &rec.last_identity {
                in_use.insert(id.clone());
            }
        }
        let gone = ids.retain(|id| in_use.contains(id));
        for id in &in_use {
            ids.want(id);
        }
        drop(pods);
        for id in gone {
            tracing::info!(identity = %id, "certificate forgotten: no pod served here has the identity");
        }
    }

    /// The certificates of the pods served that the certificate service
    /// has yet to issue and may still issue
    /// ([`ringway_identity::IdentityManager::awaited`]), with why: only
    /// identities a pod served now has (a certificate kept for one gone is
    /// not waited for).
    pub fn awaited_certificates(&self) -> Vec<(ringway_identity::Identity, String)> {
        let Some((ids, mesh)) = self.in_force.enabled() else {
            return Vec::new();
        };
        let awaited = ids.awaited();
        if awaited.is_empty() {
            return awaited;
        }
        let served: std::collections::HashSet<ringway_identity::Identity> = self
            .pods_shared()
            .iter()
            .filter_map(|p| policy::pod_identity(&mesh, p))
            .collect();
        awaited
            .into_iter()
            .filter(|(id, _)| served.contains(id))
            .collect()
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
        self.in_force.mesh()
    }

    /// Whether HBONE is on (identity manager and mesh present).
    pub fn hbone_enabled(&self) -> bool {
        self.in_force.enabled().is_some()
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
    pub fn metrics(&self) -> Arc<Metrics> {
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
            rec.shared.relabel(self.in_force.mesh().as_ref());
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
    /// ([`ProxyError::AddressConflict`]), and so is one in another served
    /// pod's network namespace ([`ProxyError::NetnsConflict`]); nothing of
    /// it is left.
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
        // For a pod served already in this netns: Some(the pod, if its
        // identity changed).
        let same_pod: Option<Option<Arc<PodShared>>> = 'same: {
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
                let mut changed = false;
                if identity != rec.info.identity && !identity.namespace.is_empty() {
                    changed = true;
                    let principal = self.principal_of(&identity);
                    *rec.shared.who.write().unwrap_or_else(|p| p.into_inner()) =
                        (identity.clone(), principal);
                    rec.shared.relabel(self.in_force.mesh().as_ref());
                    rec.info.identity = identity.clone();
                    tracing::info!(pod.uid = uid, "pod identity updated");
                }
                if !sent.is_empty() && sent == rec.info.ips {
                    rec.info.ips_source = AddressSource::Agent;
                    rec.shared
                        .addresses_from_netns
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                } else if !sent.is_empty() {
                    tracing::warn!(
                        pod.uid = uid,
                        pod.addresses = ?rec.info.ips,
                        sent.addresses = ?sent,
                        "the agent sent other addresses for a pod already served in the same netns; keeping the first"
                    );
                }
                break 'same Some(changed.then(|| rec.shared.clone()));
            }
            None
        };
        let Some(changed) = same_pod else {
            return self.add_new_pod(uid, netns, identity, addresses, ino);
        };
        // Its connections were authorized under the identity it had (a pod
        // unnamed in a file mesh takes its namespace from it): re-checked
        // under the new one.
        if let (Some(pod), Some(mesh)) = (changed, self.in_force.mesh()) {
            let reset = policy::recheck(&mesh, std::iter::once(&pod), &self.metrics);
            if reset > 0 {
                tracing::info!(
                    pod.uid = uid,
                    connections_reset = reset,
                    "identity change: open connections re-checked"
                );
            }
            // Its certificate under the new identity, as for a new pod;
            // the former one's goes unless another pod here has it.
            self.prefetch_certificate(uid, &pod);
            self.reconcile_certificates();
        }
        Ok(())
    }

    /// Gets the pod's certificate now, on the control thread, so the
    /// datapath seldom has to (key generation takes milliseconds; a
    /// certificate service one round trip, waited for at most 2 s: the
    /// agent waits for the `Add`'s ack).
    fn prefetch_certificate(&self, uid: &str, pod: &PodShared) {
        if let Some((ids, mesh)) = self.in_force.enabled() {
            if let Some(id) = policy::pod_identity(&mesh, pod) {
                if let Err(e) = ids.prefetch(&id, Duration::from_secs(2)) {
                    tracing::warn!(pod.uid = uid, error = %e, "cannot issue the pod's certificate");
                }
            }
        }
    }

    /// The rest of [`Proxy::add_pod_with_addresses`] for a pod not served
    /// yet in that netns (new, or served anew).
    fn add_new_pod(
        &self,
        uid: &str,
        netns: OwnedFd,
        identity: PodIdentity,
        addresses: &[IpAddr],
        ino: u64,
    ) -> Result<(), ProxyError> {
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
                if rec.info.netns_inode == ino {
                    return Err(ProxyError::NetnsConflict {
                        uid: uid.to_string(),
                        inode: ino,
                        holder: other.clone(),
                    });
                }
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
        let shared = Arc::new(PodShared::new(
            uid,
            netns,
            ips.clone(),
            ports,
            identity.clone(),
            principal,
        ));
        if ips_source == AddressSource::Netns {
            shared
                .addresses_from_netns
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        shared.relabel(self.in_force.mesh().as_ref());
        // Its tunnel port's pre-authentication places, shared by every
        // worker serving it.
        let preauth = Arc::new(PreauthSlots::default());
        // Every worker knows the pod before it becomes a same-node fast-path
        // target (`local_pods`): a fast-path connection is then always
        // registered with the target, so removing the target resets it.
        let mut waits = Vec::with_capacity(self.workers.len());
        for (w, listeners) in self.workers.iter().zip(per_worker) {
            let (done, rx) = std::sync::mpsc::channel();
            w.tx.send(Cmd::AddPod {
                pod: shared.clone(),
                preauth: preauth.clone(),
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
                // Its identity now: kept through a publish that leaves its
                // workload out before the next reconcile.
                last_identity: self
                    .in_force
                    .mesh()
                    .and_then(|mesh| policy::pod_identity(&mesh, &shared)),
            },
        );
        drop(pods);
        // A mesh published while the workers were taking the pod did not
        // reach it (`set_mesh` re-checks the pods listed above, and the
        // workers accept its connections before it is listed): its labels
        // and any connection already open are brought up to the mesh in
        // force now.
        if let Some(mesh) = self.in_force.mesh() {
            shared.relabel(Some(&mesh));
            policy::recheck(&mesh, [&shared], &self.metrics);
        }
        self.prefetch_certificate(uid, &shared);
        tracing::info!(pod.uid = uid, "pod added");
        Ok(())
    }

    /// The pods being served, as the workers share them.
    fn pods_shared(&self) -> Vec<Arc<PodShared>> {
        self.pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|r| r.shared.clone())
            .collect()
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
        // identity (open connections keep theirs), and so does any it had
        // before its identity changed.
        self.reconcile_certificates();
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

    /// Keeps the record of the tunnels this proxy holds in `dir` (created
    /// when missing), written once [`Proxy::warm_up`] has read the one a
    /// previous proxy left there.
    pub fn set_state_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(warm::RECORD_FILE);
        let rec = warm::Recorder::start(path.clone(), self.hbone_pools.clone())?;
        *self.recorder.lock().unwrap_or_else(|p| p.into_inner()) = Some((path, rec));
        Ok(())
    }

    /// An upgrade's warm-up, run once before the proxy reports ready (after
    /// its pods are added): every pod's server TLS config made, and the
    /// tunnels of the previous proxy's record (see [`crate::tunnel::warm`])
    /// that the mesh in force still plans dialled on every worker, for at
    /// most `budget`. A refused record is a warning and warms nothing;
    /// without a state directory, or once done, it does nothing.
    pub fn warm_up(&self, budget: Duration) -> warm::WarmReport {
        let guard = self.recorder.lock().unwrap_or_else(|p| p.into_inner());
        let Some((path, rec)) = guard.as_ref().filter(|(_, rec)| !rec.armed()) else {
            return warm::WarmReport::default();
        };
        let pods = self.pods_shared();
        let report = warm::warm_up(path, &pods, &self.in_force, budget, |targets, deadline| {
            let mut waits = Vec::new();
            for w in &self.workers {
                let (done, rx) = std::sync::mpsc::channel();
                let cmd = Cmd::WarmTunnels {
                    targets: targets.clone(),
                    deadline,
                    done,
                };
                if w.tx.send(cmd).is_ok() {
                    waits.push(rx);
                }
            }
            waits
        });
        rec.arm();
        report
    }

    /// Closes every listener at once (new connections go to another proxy
    /// bound to the same ports, or wait in the kernel), keeping established
    /// connections flowing.
    pub fn close_listeners(&self) {
        // The record keeps the tunnels held before the drain.
        if let Some((_, rec)) = &*self.recorder.lock().unwrap_or_else(|p| p.into_inner()) {
            rec.stop();
        }
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

/// Asks every worker to give the free top of its heap back
/// ([`Cmd::ReleaseHeap`]) and waits for them (at most 1 s each).
fn release_worker_heaps(workers: &[mpsc::UnboundedSender<Cmd>]) {
    let waits: Vec<_> = workers
        .iter()
        .filter_map(|tx| {
            let (done, rx) = std::sync::mpsc::channel();
            tx.send(Cmd::ReleaseHeap { done }).ok().map(|_| rx)
        })
        .collect();
    for rx in waits {
        let _ = rx.recv_timeout(Duration::from_secs(1));
    }
}

/// Listeners per worker and their addresses.
type ListenerSet = (
    Vec<Vec<(ListenerKind, OwnedFd)>>,
    Vec<(ListenerKind, SocketAddr)>,
);

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
