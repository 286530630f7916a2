//! The agent's shared state and the enrollment logic: pods by UID, proxy
//! connections, per-pod serialisation, shutdown.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ringway_redirect::PodTag;

use super::record::{RecordWriter, RecordedPod};
use super::zds_server::{self, Conn};
use super::{discover, AgentConfig, EnrollError, Pod, PodSource, PodStatus, ProxyStatus};

/// How long an enroll/unenroll waits for another one of the same pod.
const BUSY_WAIT: Duration = Duration::from_secs(20);

/// A poisoned lock only means a thread panicked while holding it; the data
/// (maps of pods and connections) stays consistent at every await point.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The inode of a namespace fd.
pub(super) fn inode_of(fd: BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(fd.as_raw_fd()).ok().map(|s| s.st_ino)
}

/// The same namespace, reopened through `/proc/thread-self/ns/net` by a
/// short-lived thread that entered it. An fd opened through a bind mount
/// (`/var/run/netns/cni-...`, what runtimes pass as CNI_NETNS) shows that
/// path in `/proc/<pid>/fd`; proxies that identify a netns fd by its link
/// (`net:[inode]`) would refuse it, so every fd handed out is of this form.
pub(super) fn canonical_netns(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            std::fs::File::open("/proc/thread-self/ns/net").map(OwnedFd::from)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("netns reopen thread panicked")))
    })
}

/// One enrolled pod.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) pod: Pod,
    /// The pinned namespace; `None` once it is gone.
    pub(super) netns: Option<OwnedFd>,
    pub(super) inode: Option<u64>,
    /// The path the namespace was found by (CNI_NETNS, /proc/<pid>/ns/net).
    pub(super) path: Option<PathBuf>,
    pub(super) source: PodSource,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) pods: BTreeMap<String, Entry>,
    /// In accept order: the last ready one is the newest.
    pub(super) conns: Vec<Arc<Conn>>,
    /// Bumped on every change of `pods` (connections in their snapshot catch up).
    pub(super) gen: u64,
}

/// What a snapshot sends for one pod.
#[derive(Debug)]
pub(super) struct SnapItem {
    pub(super) pod: Pod,
    /// `Some` = Add with this fd, `None` = Keep.
    pub(super) netns: Option<OwnedFd>,
    pub(super) inode: Option<u64>,
}

/// Why sending a pod to a proxy failed, and to whom.
struct AddFailure {
    error: EnrollError,
    nacked_by: Option<Arc<Conn>>,
}

#[derive(Debug)]
pub(super) struct Core {
    config: AgentConfig,
    pub(super) state: Mutex<State>,
    busy: Mutex<HashSet<String>>,
    busy_cv: Condvar,
    stopping: AtomicBool,
    stop_lock: Mutex<()>,
    stop_cv: Condvar,
    next_conn: AtomicU64,
    workers: Mutex<Vec<JoinHandle<()>>>,
    pub(super) cni_handlers: AtomicUsize,
    /// ZDS connections being served (at most [`super::MAX_ZDS_CONNECTIONS`]).
    pub(super) zds_conns: AtomicUsize,
    /// Socket files this agent created, with their inodes, removed at shutdown.
    sockets: Mutex<Vec<(PathBuf, u64)>>,
    /// Prometheus metrics of the agent.
    pub(super) metrics: super::metrics::AgentMetrics,
    /// The state file's writer (made at the first write), held while the
    /// pods are compared with what it records and the changes are written,
    /// so an older snapshot never overwrites a newer one.
    record: Mutex<Option<RecordWriter>>,
}

/// How the state file records `e`.
fn recorded(e: &Entry) -> RecordedPod {
    RecordedPod {
        uid: e.pod.uid.clone(),
        namespace: e.pod.namespace.clone(),
        name: e.pod.name.clone(),
        service_account: e.pod.service_account.clone(),
        container_id: e.pod.container_id.clone(),
        ips: e.pod.ips.clone(),
        netns_inode: e.inode,
    }
}

/// Whether `r` is how the state file records `e` (compared in place: a
/// write looks at every pod, and most are unchanged). Every field is named,
/// so a field added to [`RecordedPod`] fails to compile here until it is
/// compared.
fn recorded_as(e: &Entry, r: &RecordedPod) -> bool {
    let RecordedPod {
        uid,
        namespace,
        name,
        service_account,
        container_id,
        ips,
        netns_inode,
    } = r;
    e.pod.uid == *uid
        && e.pod.namespace == *namespace
        && e.pod.name == *name
        && e.pod.service_account == *service_account
        && e.pod.container_id == *container_id
        && e.pod.ips == *ips
        && e.inode == *netns_inode
}

/// How the annotator names `pod`'s API object.
fn pod_ref(pod: &Pod) -> crate::kube::PodRef {
    crate::kube::PodRef {
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    }
}

/// Held while one enroll/unenroll of a pod runs.
pub(super) struct PodGuard<'a> {
    core: &'a Core,
    uid: String,
}

impl Drop for PodGuard<'_> {
    fn drop(&mut self) {
        lock(&self.core.busy).remove(&self.uid);
        self.core.busy_cv.notify_all();
    }
}

impl Core {
    /// How many pods are enrolled.
    pub(super) fn pod_count(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pods
            .len()
    }

    pub(super) fn new(config: AgentConfig) -> Core {
        Core {
            config,
            state: Mutex::new(State::default()),
            busy: Mutex::new(HashSet::new()),
            busy_cv: Condvar::new(),
            stopping: AtomicBool::new(false),
            stop_lock: Mutex::new(()),
            stop_cv: Condvar::new(),
            next_conn: AtomicU64::new(1),
            workers: Mutex::new(Vec::new()),
            cni_handlers: AtomicUsize::new(0),
            zds_conns: AtomicUsize::new(0),
            sockets: Mutex::new(Vec::new()),
            metrics: super::metrics::AgentMetrics::default(),
            record: Mutex::new(None),
        }
    }

    /// Brings the whole state file in step with the pods held now (no-op
    /// without one): compares every pod with what the file records and
    /// appends the differences (see [`RecordWriter`]). For a start, where
    /// every pod is new; one pod's change takes [`Core::persist_pods`].
    pub(super) fn persist(&self) {
        self.sync_record(None);
    }

    /// Records the current state of the pods `uids` (held: written if the
    /// file says otherwise; gone: dropped from it), comparing nothing else:
    /// an enroll costs one line, however many pods the node has.
    pub(super) fn persist_pods(&self, uids: &[String]) {
        self.sync_record(Some(uids));
    }

    /// A failure is logged: the pods stay enrolled, but a restarted agent
    /// will not adopt the ones missing from the file.
    fn sync_record(&self, only: Option<&[String]>) {
        let Some(path) = self.config.state_file.as_deref() else {
            return;
        };
        let mut record = lock(&self.record);
        let writer = record.get_or_insert_with(|| RecordWriter::new(path, &self.config.node_name));
        let (put, del): (Vec<RecordedPod>, Vec<String>) = {
            let st = lock(&self.state);
            let written = writer.written();
            let stale =
                |uid: &String, e: &Entry| written.get(uid).is_none_or(|r| !recorded_as(e, r));
            match only {
                Some(uids) => {
                    let put = uids
                        .iter()
                        .filter_map(|uid| st.pods.get(uid).map(|e| (uid, e)))
                        .filter(|(uid, e)| stale(uid, e))
                        .map(|(_, e)| recorded(e))
                        .collect();
                    let del = uids
                        .iter()
                        .filter(|uid| !st.pods.contains_key(*uid) && written.contains_key(*uid))
                        .cloned()
                        .collect();
                    (put, del)
                }
                None => {
                    let put = st
                        .pods
                        .iter()
                        .filter(|(uid, e)| stale(uid, e))
                        .map(|(_, e)| recorded(e))
                        .collect();
                    let del = written
                        .keys()
                        .filter(|uid| !st.pods.contains_key(*uid))
                        .cloned()
                        .collect();
                    (put, del)
                }
            }
        };
        let changes = put.len() + del.len();
        match writer.sync(put, del) {
            Ok(()) => tracing::debug!(state_file = %path.display(), changes, "state file written"),
            Err(e) => {
                tracing::error!(error = %e, "the agent's record of its pods is not up to date: a restarted agent will not adopt the pods missing from it")
            }
        }
    }

    pub(super) fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The selection rule for `pod` (see [`super::Selection::selects`]).
    pub(super) fn selects(
        &self,
        pod: &Pod,
    ) -> Result<crate::kube::Verdict, crate::kube::SelectError> {
        self.config
            .selection
            .selects(pod, &self.config.exclude_namespaces)
    }

    /// The selection rule for `pod`, with its service account when known (see
    /// [`super::Selection::select`]).
    pub(super) fn select(
        &self,
        pod: &Pod,
    ) -> Result<crate::kube::Selected, crate::kube::SelectError> {
        self.config.selection.select(
            pod,
            &self.config.exclude_namespaces,
            &self.config.service_accounts,
        )
    }

    /// Whether the peer of `sock` may use the agent's sockets: its uid
    /// (SO_PEERCRED) is one of [`AgentConfig::peer_uids`]. `Err` names why not
    /// (and is counted as refused on `socket`).
    pub(super) fn check_peer(&self, sock: &impl AsFd, socket: &'static str) -> Result<(), String> {
        match nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials) {
            Ok(c) if self.config.peer_uids.contains(&c.uid()) => Ok(()),
            Ok(c) => {
                self.metrics.refuse(socket, "peer_uid");
                Err(format!(
                    "peer uid {} (pid {}) is not allowed on the {socket} socket (allowed uids: {:?})",
                    c.uid(),
                    c.pid(),
                    self.config.peer_uids
                ))
            }
            Err(e) => {
                self.metrics.refuse(socket, "peer_unknown");
                Err(format!("cannot read the peer's credentials: {e}"))
            }
        }
    }

    pub(super) fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    // ------------------------------------------------------------ lifecycle

    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    pub(super) fn register_socket(&self, path: &Path) {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            lock(&self.sockets).push((path.to_path_buf(), m.ino()));
        }
    }

    /// Runs `f` on a named thread that shutdown waits for.
    pub(super) fn spawn_worker(
        &self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name).spawn(f)?;
        let mut workers = lock(&self.workers);
        workers.retain(|h| !h.is_finished());
        workers.push(handle);
        Ok(())
    }

    /// Stops accepting, wakes every loop, closes every proxy connection.
    pub(super) fn begin_shutdown(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        {
            let _g = lock(&self.stop_lock);
            self.stop_cv.notify_all();
        }
        let conns = lock(&self.state).conns.clone();
        for c in conns {
            c.kill();
        }
    }

    /// Waits for the worker threads, removes the socket files, releases
    /// every pinned namespace. Rules are left in place.
    pub(super) fn finish_shutdown(&self) {
        let workers: Vec<_> = lock(&self.workers).drain(..).collect();
        for w in workers {
            let _ = w.join();
        }
        for (path, ino) in lock(&self.sockets).drain(..) {
            // Only our own file: a new agent may already have replaced it.
            if std::fs::symlink_metadata(&path).ok().map(|m| m.ino()) == Some(ino) {
                let _ = std::fs::remove_file(&path);
            }
        }
        let mut st = lock(&self.state);
        st.conns.clear();
        st.pods.clear();
    }

    /// Every `reconcile_interval` until shutdown: release gone namespaces.
    pub(super) fn reconcile_loop(&self) {
        loop {
            {
                let g = lock(&self.stop_lock);
                if self.is_stopping() {
                    return;
                }
                let _ = self
                    .stop_cv
                    .wait_timeout(g, self.config.reconcile_interval)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if self.is_stopping() {
                return;
            }
            self.release_gone_netns();
        }
    }

    // ------------------------------------------------------------ helpers

    fn lock_pod(&self, uid: &str) -> Result<PodGuard<'_>, EnrollError> {
        let deadline = Instant::now() + BUSY_WAIT;
        let mut busy = lock(&self.busy);
        while busy.contains(uid) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EnrollError::Busy {
                    uid: uid.to_string(),
                    secs: BUSY_WAIT.as_secs(),
                });
            }
            busy = self
                .busy_cv
                .wait_timeout(busy, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        busy.insert(uid.to_string());
        Ok(PodGuard {
            core: self,
            uid: uid.to_string(),
        })
    }

    pub(super) fn tag(&self, pod: &Pod) -> PodTag {
        PodTag {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            node: self.config.node_name.clone(),
            container_id: pod.container_id.clone().unwrap_or_default(),
            ips: pod.ips.clone(),
        }
    }

    fn validate(&self, pod: &Pod) -> Result<(), EnrollError> {
        // An empty service account is allowed: the API server's pod has
        // none (a static pod's mirror), so the pod is captured with no
        // identity (no certificate, no HBONE), never given `default`.
        for (field, v) in [
            ("uid", &pod.uid),
            ("name", &pod.name),
            ("namespace", &pod.namespace),
        ] {
            if v.trim().is_empty() {
                return Err(EnrollError::BadInput(format!("pod {field} is empty")));
            }
        }
        if self.config.exclude_namespaces.contains(&pod.namespace) {
            return Err(EnrollError::BadInput(format!(
                "namespace {:?} is excluded from capture (exclude_namespaces)",
                pod.namespace
            )));
        }
        Ok(())
    }

    pub(super) fn ready_conns(&self) -> Vec<Arc<Conn>> {
        lock(&self.state)
            .conns
            .iter()
            .filter(|c| c.is_ready() && !c.is_dead())
            .cloned()
            .collect()
    }

    pub(super) fn any_ready(&self) -> bool {
        !self.ready_conns().is_empty()
    }

    /// Closes a connection and forgets it; logs once (returns whether it
    /// was still registered).
    pub(super) fn drop_conn(&self, conn: &Conn, why: &str) -> bool {
        conn.kill();
        let mut st = lock(&self.state);
        let before = st.conns.len();
        st.conns.retain(|c| c.id != conn.id);
        let was_there = st.conns.len() != before;
        if was_there {
            tracing::warn!(
                proxy.conn = conn.id,
                proxy.pid = ?conn.pid,
                reason = why,
                proxies.left = st.conns.len(),
                "proxy connection dropped"
            );
        }
        was_there
    }

    /// Whether the agent holds pod `uid`.
    pub(super) fn holds(&self, uid: &str) -> bool {
        lock(&self.state).pods.contains_key(uid)
    }

    pub(super) fn enrolled(&self) -> Vec<PodStatus> {
        lock(&self.state)
            .pods
            .values()
            .map(|e| PodStatus {
                pod: e.pod.clone(),
                netns_inode: e.inode,
                source: e.source,
            })
            .collect()
    }

    pub(super) fn proxies(&self) -> Vec<ProxyStatus> {
        lock(&self.state)
            .conns
            .iter()
            .map(|c| ProxyStatus {
                id: c.id,
                pid: c.pid,
                ready: c.is_ready(),
            })
            .collect()
    }

    // ------------------------------------------------------------ enroll

    /// See [`super::Enrollment::enroll`]. `path` is where the namespace was
    /// found (kept for the liveness check).
    pub(super) fn enroll(
        &self,
        pod: Pod,
        netns: OwnedFd,
        path: Option<PathBuf>,
    ) -> Result<(), EnrollError> {
        if self.is_stopping() {
            return Err(EnrollError::ShuttingDown);
        }
        self.validate(&pod)?;
        ringway_redirect::check_pod_netns(netns.as_fd()).map_err(EnrollError::BadNetns)?;
        let netns = canonical_netns(&netns).map_err(|e| EnrollError::Io {
            what: "reopening the network namespace".into(),
            source: e,
        })?;
        let inode = inode_of(netns.as_fd());
        let span = tracing::info_span!(
            "enroll",
            pod.uid = %pod.uid,
            pod.name = %pod.name,
            pod.namespace = %pod.namespace,
            netns.inode = inode.unwrap_or(0),
        );
        let _span = span.enter();
        let _guard = self.lock_pod(&pod.uid)?;
        if !self.any_ready() {
            tracing::info!("no proxy ready: the runtime is to retry");
            return Err(EnrollError::NoProxy { last_error: None });
        }
        let uid = pod.uid.clone();
        let (same_netns, pod) = {
            let st = lock(&self.state);
            match st.pods.get(&uid) {
                Some(e) if e.inode == inode => (true, merge(pod, &e.pod)),
                _ => (false, pod),
            }
        };
        let tag = self.tag(&pod);
        let spec = &self.config.capture;
        let rules = |e| EnrollError::Rules {
            uid: uid.clone(),
            source: e,
        };
        if same_netns {
            // A repeated enroll: rules are only rewritten when they drifted.
            let drift = ringway_redirect::verify_for(netns.as_fd(), spec, &tag).map_err(rules)?;
            if !drift.is_empty() {
                ringway_redirect::apply_for(netns.as_fd(), spec, &tag).map_err(rules)?;
            }
        } else {
            ringway_redirect::apply_for(netns.as_fd(), spec, &tag).map_err(|e| match e {
                ringway_redirect::RedirectError::TagTooLong(t) => EnrollError::BadInput(t),
                e => rules(e),
            })?;
        }
        let send_fd = netns.try_clone().map_err(|e| EnrollError::Io {
            what: "duplicating the netns fd".into(),
            source: e,
        })?;
        let replaced = {
            let mut st = lock(&self.state);
            st.gen += 1;
            st.pods.insert(
                uid.clone(),
                Entry {
                    pod: pod.clone(),
                    netns: Some(netns),
                    inode,
                    path,
                    source: PodSource::Enrolled,
                },
            )
        };
        self.persist_pods(std::slice::from_ref(&uid));
        match self.add_to_newest(&pod, send_fd.as_fd()) {
            Ok(conn) => {
                tracing::info!(
                    proxy.conn = conn,
                    replaced_netns = ?replaced.as_ref().filter(|_| !same_netns).and_then(|e| e.inode),
                    "pod enrolled"
                );
                // Rules in place, the proxy acked: the pod is captured.
                if let Some(annotator) = &self.config.annotator {
                    annotator.captured(&pod_ref(&pod));
                }
                Ok(())
            }
            Err(fail) => {
                if same_netns {
                    // It was enrolled before this call and stays so.
                    tracing::warn!(error = %fail.error, "repeated enroll failed; the pod stays enrolled");
                    return Err(fail.error);
                }
                tracing::warn!(error = %fail.error, "enroll failed; rolling back");
                let removed = {
                    let mut st = lock(&self.state);
                    st.gen += 1;
                    st.pods.remove(&uid)
                };
                self.persist_pods(std::slice::from_ref(&uid));
                if let Some(conn) = fail.nacked_by {
                    // The proxy keeps retrying a nacked pod: tell it we gave up.
                    if let Err(e) = conn.exchange(&zds_server::del_request(&uid), None) {
                        self.drop_conn(&conn, &format!("Del after nack: {e}"));
                    }
                }
                if let Some(fd) = removed.as_ref().and_then(|e| e.netns.as_ref()) {
                    if let Err(e) = ringway_redirect::remove(fd.as_fd(), spec) {
                        tracing::warn!(error = %e, "rolling back the rules failed");
                    }
                }
                // A pod held before (in another netns) is no longer captured.
                if let (Some(annotator), Some(before)) = (&self.config.annotator, &replaced) {
                    annotator.released(&pod_ref(&before.pod));
                }
                Err(fail.error)
            }
        }
    }

    /// Sends `Add` to the newest ready proxy; on a broken connection, to the
    /// next newest. Returns the connection id that acknowledged.
    fn add_to_newest(&self, pod: &Pod, netns: BorrowedFd<'_>) -> Result<u64, AddFailure> {
        let req = zds_server::add_request(pod);
        let mut tried = HashSet::new();
        let mut last_error = None;
        loop {
            let target = {
                let st = lock(&self.state);
                st.conns
                    .iter()
                    .rev()
                    .find(|c| c.is_ready() && !c.is_dead() && !tried.contains(&c.id))
                    .cloned()
            };
            let Some(conn) = target else {
                return Err(AddFailure {
                    error: EnrollError::NoProxy { last_error },
                    nacked_by: None,
                });
            };
            tried.insert(conn.id);
            match conn.exchange(&req, Some(netns)) {
                Ok(Ok(())) => return Ok(conn.id),
                Ok(Err(reason)) => {
                    tracing::warn!(proxy.conn = conn.id, %reason, "proxy nacked the pod");
                    return Err(AddFailure {
                        error: EnrollError::Nacked {
                            uid: pod.uid.clone(),
                            reason,
                        },
                        nacked_by: Some(conn),
                    });
                }
                Err(e) => {
                    let why = format!("Add of pod {}: {e}", pod.uid);
                    self.drop_conn(&conn, &why);
                    last_error = Some(format!("proxy connection {}: {e}", conn.id));
                }
            }
        }
    }

    // ------------------------------------------------------------ unenroll

    /// See [`super::Enrollment::unenroll`].
    pub(super) fn unenroll(&self, uid: &str) -> Result<(), EnrollError> {
        self.unenroll_matching(uid, None, None).map(|_| ())
    }

    /// Unenrolls `uid` if it is enrolled with sandbox `container_id` and
    /// netns `inode` (each when given). Returns whether it was.
    pub(super) fn unenroll_matching(
        &self,
        uid: &str,
        container_id: Option<&str>,
        inode: Option<u64>,
    ) -> Result<bool, EnrollError> {
        let span = tracing::info_span!("unenroll", pod.uid = %uid);
        let _span = span.enter();
        let _guard = self.lock_pod(uid)?;
        let (entry, conns) = {
            let mut st = lock(&self.state);
            let matches = st.pods.get(uid).map(|e| {
                let cid_ok = match (container_id, e.pod.container_id.as_deref()) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                };
                let ino_ok = match (inode, e.inode) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                };
                (cid_ok, ino_ok)
            });
            match matches {
                None => {
                    tracing::debug!("pod not enrolled: nothing to do");
                    return Ok(false);
                }
                Some((false, _)) => {
                    tracing::info!(
                        container_id = container_id.unwrap_or(""),
                        "the pod is enrolled with another sandbox: left alone"
                    );
                    return Ok(false);
                }
                Some((_, false)) => {
                    tracing::info!(
                        netns.inode = inode.unwrap_or(0),
                        "the pod is enrolled with another network namespace: left alone"
                    );
                    return Ok(false);
                }
                Some((true, true)) => {}
            }
            st.gen += 1;
            let entry = st.pods.remove(uid);
            let conns: Vec<_> = st
                .conns
                .iter()
                .filter(|c| c.is_ready() && !c.is_dead())
                .cloned()
                .collect();
            (entry, conns)
        };
        self.persist_pods(&[uid.to_string()]);
        let req = zds_server::del_request(uid);
        for conn in conns {
            match conn.exchange(&req, None) {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => {
                    tracing::warn!(proxy.conn = conn.id, %reason, "proxy nacked Del")
                }
                Err(e) => {
                    self.drop_conn(&conn, &format!("Del of pod {uid}: {e}"));
                }
            }
        }
        // The proxies dropped it: no longer captured, whatever the rules do next.
        if let (Some(annotator), Some(e)) = (&self.config.annotator, &entry) {
            annotator.released(&pod_ref(&e.pod));
        }
        if let Some(fd) = entry.as_ref().and_then(|e| e.netns.as_ref()) {
            ringway_redirect::remove(fd.as_fd(), &self.config.capture).map_err(|e| {
                tracing::warn!(error = %e, "removing the rules failed");
                EnrollError::Rules {
                    uid: uid.to_string(),
                    source: e,
                }
            })?;
        }
        tracing::info!(
            netns.inode = entry.as_ref().and_then(|e| e.inode).unwrap_or(0),
            "pod unenrolled"
        );
        Ok(true)
    }

    // ------------------------------------------------------------ snapshot

    /// Adds `conn` (not ready yet) and returns the snapshot with the
    /// generation it reflects.
    pub(super) fn register_and_snapshot(&self, conn: &Arc<Conn>) -> (Vec<SnapItem>, u64) {
        let mut st = lock(&self.state);
        st.conns.push(conn.clone());
        let items = st
            .pods
            .values()
            .map(|e| {
                let netns = e.netns.as_ref().and_then(|f| match f.try_clone() {
                    Ok(fd) => Some(fd),
                    Err(err) => {
                        tracing::warn!(pod.uid = %e.pod.uid, error = %err, "cannot duplicate the netns fd: sending Keep");
                        None
                    }
                });
                SnapItem {
                    pod: e.pod.clone(),
                    inode: netns.as_ref().and(e.inode),
                    netns,
                }
            })
            .collect();
        (items, st.gen)
    }

    /// After `SnapshotSent`: either marks `conn` ready (nothing changed since
    /// generation `seen`), or returns what changed: pods to Add (new netns)
    /// and UIDs to Del, relative to what the connection was told.
    pub(super) fn catch_up(
        &self,
        conn: &Conn,
        seen: &mut u64,
        told: &BTreeMap<String, Option<u64>>,
    ) -> Option<(Vec<SnapItem>, Vec<String>)> {
        let st = lock(&self.state);
        if st.gen == *seen {
            conn.set_ready();
            return None;
        }
        *seen = st.gen;
        let adds = st
            .pods
            .values()
            .filter(|e| e.netns.is_some() && told.get(&e.pod.uid) != Some(&e.inode))
            .filter_map(|e| {
                Some(SnapItem {
                    pod: e.pod.clone(),
                    netns: Some(e.netns.as_ref()?.try_clone().ok()?),
                    inode: e.inode,
                })
            })
            .collect();
        let dels = told
            .keys()
            .filter(|uid| !st.pods.contains_key(*uid))
            .cloned()
            .collect();
        Some((adds, dels))
    }

    // ------------------------------------------------------------ liveness

    /// Releases the netns of every pod whose namespace is gone (no process,
    /// no mount in `netns_dirs`, and its path no longer names it). Returns
    /// their UIDs.
    pub(super) fn release_gone_netns(&self) -> Vec<String> {
        let candidates: Vec<(String, u64, Option<PathBuf>)> = lock(&self.state)
            .pods
            .values()
            .filter(|e| e.netns.is_some())
            .filter_map(|e| Some((e.pod.uid.clone(), e.inode?, e.path.clone())))
            .collect();
        if candidates.is_empty() {
            return Vec::new();
        }
        let live = discover::live_inodes(&self.config);
        let gone: Vec<(String, u64)> = candidates
            .into_iter()
            .filter(|(_, ino, path)| {
                let named_by_path = path
                    .as_ref()
                    .and_then(|p| std::fs::metadata(p).ok())
                    .is_some_and(|m| m.ino() == *ino);
                !live.contains(ino) && !named_by_path
            })
            .map(|(uid, ino, _)| (uid, ino))
            .collect();
        let mut released = Vec::new();
        let mut st = lock(&self.state);
        for (uid, ino) in gone {
            if let Some(e) = st.pods.get_mut(&uid) {
                if e.inode == Some(ino) {
                    e.netns = None;
                    e.inode = None;
                    tracing::warn!(
                        pod.uid = %uid,
                        netns.inode = ino,
                        "the pod's network namespace is gone (no process, no mount): released; \
                         proxies are told to Keep the pod until it is unenrolled"
                    );
                    released.push(uid);
                }
            }
        }
        if !released.is_empty() {
            st.gen += 1;
        }
        drop(st);
        // The record says the namespace is gone too (no inode to adopt).
        self.persist_pods(&released);
        released
    }

    /// Records pods rebuilt at start, and rewrites the state file with them
    /// (pods recorded but not found are gone: dropped from it).
    pub(super) fn insert_rediscovered(&self, entries: Vec<Entry>) {
        {
            let mut st = lock(&self.state);
            for e in entries {
                st.pods.insert(e.pod.uid.clone(), e);
            }
            st.gen += 1;
        }
        self.persist();
    }

    /// A duplicate of the netns fd held for `uid`, with its path.
    pub(super) fn pinned_netns(&self, uid: &str) -> Option<(OwnedFd, Option<PathBuf>)> {
        let st = lock(&self.state);
        let e = st.pods.get(uid)?;
        Some((e.netns.as_ref()?.try_clone().ok()?, e.path.clone()))
    }

    // ------------------------------------------------------------ CNI

    /// The pod enrolled with sandbox `container_id` (by UID when given).
    pub(super) fn find(
        &self,
        uid: Option<&str>,
        container_id: &str,
    ) -> Option<(String, Option<u64>)> {
        let st = lock(&self.state);
        let e = match uid {
            Some(uid) => st.pods.get(uid),
            None => st
                .pods
                .values()
                .find(|e| e.pod.container_id.as_deref() == Some(container_id)),
        }?;
        Some((e.pod.uid.clone(), e.inode))
    }

    /// CHECK: the pod is enrolled with this sandbox and netns, a proxy is
    /// ready, and the rules (with the owner tag) are in place.
    pub(super) fn check(
        &self,
        uid: &str,
        container_id: &str,
        netns_inode: Option<u64>,
    ) -> Result<(), CheckError> {
        let (tag, fd) = {
            let st = lock(&self.state);
            let Some(e) = st.pods.get(uid) else {
                return Err(CheckError::Unknown);
            };
            if e.pod
                .container_id
                .as_deref()
                .is_some_and(|c| c != container_id)
            {
                return Err(CheckError::Unknown);
            }
            if let (Some(want), Some(have)) = (netns_inode, e.inode) {
                if want != have {
                    return Err(CheckError::Failed(format!(
                        "pod {uid} is enrolled with net:[{have}], the runtime's namespace is net:[{want}]"
                    )));
                }
            }
            let fd = e.netns.as_ref().and_then(|f| f.try_clone().ok());
            (self.tag(&e.pod), fd)
        };
        if !self.any_ready() {
            return Err(CheckError::NotReady("no node proxy is ready".into()));
        }
        let Some(fd) = fd else {
            return Err(CheckError::Failed(format!(
                "the network namespace of pod {uid} is gone"
            )));
        };
        let drift = ringway_redirect::verify_for(fd.as_fd(), &self.config.capture, &tag)
            .map_err(|e| CheckError::Failed(format!("verifying the capture of pod {uid}: {e}")))?;
        if drift.is_empty() {
            Ok(())
        } else {
            Err(CheckError::Failed(format!(
                "capture of pod {uid} drifted: {}",
                drift
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join("; ")
            )))
        }
    }

    /// GC: unenrolls every pod enrolled through CNI whose sandbox is not in
    /// `valid` *and whose network namespace is gone*. Returns the UIDs removed.
    ///
    /// A GC request is only a claim (anything that reaches the CNI socket can
    /// send an empty list): removing the capture of a pod that still runs
    /// would let its traffic bypass its policy. A live pod left out of the
    /// list keeps its capture (warned about) until its DEL, or until its
    /// namespace is gone and a later GC or DEL comes.
    pub(super) fn gc(&self, valid: &HashSet<String>) -> Vec<String> {
        self.release_gone_netns();
        let unlisted: Vec<(String, String, bool)> = lock(&self.state)
            .pods
            .values()
            .filter_map(|e| {
                let cid = e.pod.container_id.as_ref()?;
                (!valid.contains(cid)).then(|| (e.pod.uid.clone(), cid.clone(), e.netns.is_some()))
            })
            .collect();
        let mut stale = Vec::new();
        for (uid, cid, live) in unlisted {
            if live {
                tracing::warn!(pod.uid = %uid, container_id = %cid, "GC: a pod missing from the valid attachments still has its network namespace: its capture is kept");
            } else {
                stale.push((uid, cid));
            }
        }
        let mut removed = Vec::new();
        for (uid, cid) in stale {
            match self.unenroll_matching(&uid, Some(&cid), None) {
                Ok(true) => removed.push(uid),
                Ok(false) => {}
                Err(e) => tracing::warn!(pod.uid = %uid, error = %e, "GC: unenroll failed"),
            }
        }
        removed
    }
}

/// A repeated enroll of the same pod and netns: what the new call does not
/// know (the Kubernetes watch knows no sandbox id, nor the CNI result's
/// addresses) is kept from the earlier one. (Every enroll carries a service
/// account: `validate` refuses an empty one.)
fn merge(mut new: Pod, old: &Pod) -> Pod {
    if new.container_id.is_none() {
        new.container_id = old.container_id.clone();
    }
    if new.ips.is_empty() {
        new.ips = old.ips.clone();
    }
    new
}

/// Why CHECK failed.
#[derive(Debug)]
pub(super) enum CheckError {
    /// The sandbox is not enrolled.
    Unknown,
    /// No proxy ready.
    NotReady(String),
    /// Enrolled, but not as it should be.
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_enroll_keeps_what_it_does_not_know() {
        let cni = Pod {
            uid: "u".into(),
            name: "web".into(),
            namespace: "shop".into(),
            service_account: "web-sa".into(),
            ips: vec!["10.0.0.5".parse().unwrap()],
            container_id: Some("c1".into()),
        };
        let watch = Pod {
            ips: vec![],
            container_id: None,
            ..cni.clone()
        };
        let merged = merge(watch, &cni);
        assert_eq!(merged.container_id.as_deref(), Some("c1"));
        assert_eq!(merged.ips, cni.ips);
    }

    fn entry(uid: &str, inode: u64) -> Entry {
        Entry {
            pod: Pod {
                uid: uid.into(),
                name: format!("pod-{uid}"),
                namespace: "shop".into(),
                service_account: "web".into(),
                ips: vec!["10.0.0.5".parse().unwrap()],
                container_id: Some(format!("c-{uid}")),
            },
            netns: None,
            inode: Some(inode),
            path: None,
            source: PodSource::Enrolled,
        }
    }

    /// The state file follows the held pods through every kind of change:
    /// added, changed in place (a namespace gone: inode dropped), removed.
    #[test]
    fn persist_writes_what_changed_and_the_file_follows_the_pods() {
        let dir = crate::test_dir::ScratchDir::new("persist");
        let path = dir.join("pods.json");
        let core = Core::new(AgentConfig {
            state_file: Some(path.clone()),
            ..AgentConfig::default()
        });
        let on_file = || {
            super::super::record::load(&path, "")
                .unwrap()
                .unwrap()
                .into_values()
                .map(|r| (r.uid, r.netns_inode))
                .collect::<Vec<_>>()
        };
        core.insert_rediscovered(vec![entry("a", 1), entry("b", 2), entry("c", 3)]);
        assert_eq!(
            on_file(),
            [
                ("a".into(), Some(1)),
                ("b".into(), Some(2)),
                ("c".into(), Some(3))
            ]
        );
        let before = std::fs::read_to_string(&path).unwrap().lines().count();
        {
            let mut st = lock(&core.state);
            st.pods.get_mut("b").unwrap().inode = None;
            st.pods.remove("c");
            st.pods.insert("d".into(), entry("d", 4));
        }
        core.persist();
        assert_eq!(
            on_file(),
            [
                ("a".into(), Some(1)),
                ("b".into(), None),
                ("d".into(), Some(4))
            ]
        );
        let after = std::fs::read_to_string(&path).unwrap().lines().count();
        assert_eq!(
            after,
            before + 3,
            "one line per change, nothing for the unchanged pod"
        );
        core.persist();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().count(),
            after,
            "no change, no line"
        );
        // One pod's change writes that pod alone: added, then removed, and
        // a uid neither held nor recorded writes nothing.
        lock(&core.state).pods.insert("e".into(), entry("e", 5));
        core.persist_pods(&["e".into(), "nobody".into()]);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().count(),
            after + 1
        );
        lock(&core.state).pods.remove("a");
        core.persist_pods(&["a".into()]);
        assert_eq!(
            on_file(),
            [
                ("b".into(), None),
                ("d".into(), Some(4)),
                ("e".into(), Some(5))
            ]
        );
        assert_eq!(
            std::fs::read_to_string(&path).unwrap().lines().count(),
            after + 2
        );
    }
}
