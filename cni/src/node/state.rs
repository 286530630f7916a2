//! The owner of the agent's state: [`Core`] holds the pods and the proxy
//! connections ([`State`], under one lock), the state file's writer and the
//! per-pod locks, and is the only code that changes them: enroll and
//! unenroll, the snapshot and catch-up of a proxy connection, the release
//! of gone namespaces, CHECK and GC. The servers reach it through the narrow
//! traits they define ([`Proxies`], [`Pods`]), the metrics through
//! [`PodCount`]; it uses every leaf below it and nothing above.

use std::collections::{BTreeMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ringway_zds::Answer;

use super::cni_server::Pods;
use super::config::AgentConfig;
use super::discover::Adopted;
use super::error::{CheckError, EnrollError};
use super::lifecycle::Lifecycle;
use super::locks::{lock, PodLocks};
use super::metrics::PodCount;
use super::netns::{canonical_netns, inode_of, live_inodes};
use super::pod::{Pod, PodSource, PodStatus, ProxyStatus};
use super::proxy_conn::{add_request, del_request, Conn, SnapItem};
use super::record::RecordWriter;
use super::table::Kept;
use super::table::{Entry, State};
use super::zds_server::Proxies;

/// Why sending a pod to a proxy failed, and to whom.
struct AddFailure {
    error: EnrollError,
    nacked_by: Option<Arc<Conn>>,
}

/// Which network namespace an unenroll is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NetnsMatch {
    /// Whichever the pod is held with.
    Any,
    /// Only this one (by inode; a pod whose namespace is gone matches).
    Inode(u64),
    /// Only a namespace found gone (none held): a pod enrolled again since
    /// is left alone.
    Gone,
}

/// The owner of the agent's state.
#[derive(Debug)]
pub(super) struct Core {
    config: Arc<AgentConfig>,
    lifecycle: Arc<Lifecycle>,
    pub(super) state: Mutex<State>,
    /// One enroll/unenroll of a pod at a time.
    pod_locks: PodLocks,
    /// The state file's writer (made at the first write), held while the
    /// pods are compared with what it records and the changes are written,
    /// so an older snapshot never overwrites a newer one.
    record: Mutex<Option<RecordWriter>>,
}

/// How the annotator names `pod`'s API object.
fn pod_ref(pod: &Pod) -> crate::kube::PodRef {
    crate::kube::PodRef {
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    }
}

impl Core {
    /// The owner of an agent's state under `config`, stopping with `lifecycle`.
    pub(super) fn new(config: Arc<AgentConfig>, lifecycle: Arc<Lifecycle>) -> Core {
        Core {
            config,
            lifecycle,
            state: Mutex::new(State::default()),
            pod_locks: PodLocks::default(),
            record: Mutex::new(None),
        }
    }

    pub(super) fn config(&self) -> &AgentConfig {
        &self.config
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
        let (put, del) = lock(&self.state).record_changes(only, writer.written());
        let changes = put.len() + del.len();
        match writer.sync(put, del) {
            Ok(()) => tracing::debug!(state_file = %path.display(), changes, "state file written"),
            Err(e) => {
                tracing::error!(error = %e, "the agent's record of its pods is not up to date: a restarted agent will not adopt the pods missing from it")
            }
        }
    }

    /// Adopts the pods rediscovery found at start, and rewrites the state
    /// file with them (pods recorded but not found are gone: dropped from it).
    pub(super) fn adopt(&self, pods: Vec<Adopted>, keep: BTreeMap<String, Vec<Kept>>) {
        {
            let mut st = lock(&self.state);
            st.keep_only = keep;
            for a in pods {
                st.pods.insert(
                    a.pod.uid.clone(),
                    Entry {
                        pod: a.pod,
                        netns: Some(a.netns),
                        inode: Some(a.inode),
                        path: Some(a.path),
                        source: PodSource::Rediscovered,
                    },
                );
            }
            st.gen += 1;
        }
        // The kept pods first: a crash between the two leaves them written
        // down beside a record that still cannot be used (kept again).
        self.store_kept();
        self.persist();
    }

    /// Writes the kept pods beside the record (see [`State::keep_only`]).
    fn store_kept(&self) {
        let Some(path) = self.config.state_file.as_deref() else {
            return;
        };
        // One writer at a time, the state read under it (as the record's).
        let _record = lock(&self.record);
        let kept: BTreeMap<String, Vec<u64>> = lock(&self.state)
            .keep_only
            .iter()
            .map(|(uid, k)| (uid.clone(), k.iter().map(|k| k.inode).collect()))
            .collect();
        if let Err(e) = super::record::store_kept(path, &self.config.node_name, &kept) {
            tracing::error!(error = %e, "the kept pods are not written down: a restarted agent will not keep them");
        }
    }

    /// The pods held, and the uids of those only kept at the proxies (see
    /// [`State::keep_only`]; none held), read together.
    pub(super) fn enrolled_and_kept(&self) -> (Vec<PodStatus>, Vec<String>) {
        let st = lock(&self.state);
        let kept = st
            .keep_only
            .keys()
            .filter(|uid| !st.pods.contains_key(*uid))
            .cloned()
            .collect();
        (st.enrolled(), kept)
    }

    /// Every `reconcile_interval` until shutdown: release gone namespaces,
    /// and put back the capture of every held pod whose rules drifted
    /// (counted in `repairs`).
    pub(super) fn reconcile_loop(&self, repairs: &prometheus_client::metrics::counter::Counter) {
        while !self.lifecycle.wait(self.config.reconcile_interval) {
            self.release_gone_netns();
            let repaired = self.repair_drifted();
            repairs.inc_by(repaired.len() as u64);
        }
    }

    /// Verifies the capture of every pod held (its rules, routes, sysctls
    /// and owner tag) and re-applies what drifted: a pod with `NET_ADMIN`
    /// can flush or delete its rules, and nothing else would notice while
    /// the agent runs. Returns the UIDs repaired. A pod being enrolled or
    /// unenrolled meanwhile is left to that call.
    pub(super) fn repair_drifted(&self) -> Vec<String> {
        let held: Vec<String> = lock(&self.state).pods.keys().cloned().collect();
        let spec = &self.config.capture;
        let mut repaired = Vec::new();
        for uid in held {
            if self.lifecycle.is_stopping() {
                break;
            }
            let Ok(_guard) = self.pod_locks.lock(&uid) else {
                continue;
            };
            // Still held (not unenrolled while this waited), with its netns.
            let (fd, tag) = {
                let st = lock(&self.state);
                let Some(e) = st.pods.get(&uid) else { continue };
                let Some(fd) = e.netns.as_ref().and_then(|f| f.try_clone().ok()) else {
                    continue;
                };
                (fd, e.pod.owner_tag(&self.config.node_name))
            };
            let span = tracing::info_span!("repair", pod.uid = %uid);
            let _span = span.enter();
            match ringway_redirect::verify_for(fd.as_fd(), spec, &tag) {
                Ok(drift) if drift.is_empty() => {}
                Ok(drift) => {
                    let drift: Vec<String> = drift.iter().map(|d| d.to_string()).collect();
                    match ringway_redirect::apply_for(fd.as_fd(), spec, &tag) {
                        Ok(()) => {
                            tracing::warn!(drift = %drift.join("; "), "the capture of an enrolled pod drifted (its rules changed from inside the pod?): re-applied");
                            repaired.push(uid);
                        }
                        Err(e) => {
                            tracing::error!(drift = %drift.join("; "), error = %e, "the capture of an enrolled pod drifted and re-applying it failed")
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "verifying an enrolled pod's capture failed"),
            }
        }
        repaired
    }

    /// Closes every proxy connection (shutdown has begun).
    pub(super) fn close_proxies(&self) {
        let conns = lock(&self.state).conns.clone();
        for c in conns {
            c.kill();
        }
    }

    /// Forgets every connection and releases every pinned namespace (the
    /// agent has stopped). Rules are left in place.
    pub(super) fn release_all(&self) {
        let mut st = lock(&self.state);
        st.conns.clear();
        st.pods.clear();
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

    pub(super) fn any_ready(&self) -> bool {
        !lock(&self.state).ready_conns().is_empty()
    }

    /// Closes a connection and forgets it; logs once (returns whether it
    /// was still registered).
    fn close_conn(&self, conn: &Conn, why: &str) -> bool {
        conn.kill();
        let mut st = lock(&self.state);
        let was_there = st.remove_conn(conn.id);
        if was_there && self.lifecycle.is_stopping() {
            // The agent's own orderly end: the proxy reconnects to the next.
            tracing::info!(
                proxy.conn = conn.id,
                proxy.pid = ?conn.pid,
                reason = why,
                "proxy connection closed: the agent is stopping"
            );
        } else if was_there {
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
        lock(&self.state).enrolled()
    }

    pub(super) fn proxies(&self) -> Vec<ProxyStatus> {
        lock(&self.state).proxies()
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
        if self.lifecycle.is_stopping() {
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
        if self.any_ready() {
            self.release_dead_holders(&pod);
        }
        let _guard = self.pod_locks.lock(&pod.uid)?;
        if !self.any_ready() {
            tracing::info!("no proxy ready: the runtime is to retry");
            return Err(EnrollError::NoProxy { last_error: None });
        }
        let uid = pod.uid.clone();
        let (same_netns, pod) = {
            let st = lock(&self.state);
            // A uid is one pod: the same uid under another namespace or name
            // (a runtime's or a caller's mistake) would move that pod's
            // capture and identity to this one.
            if let Some(e) = st
                .pods
                .get(&uid)
                .filter(|e| e.pod.namespace != pod.namespace || e.pod.name != pod.name)
            {
                tracing::warn!(holder.namespace = %e.pod.namespace, holder.name = %e.pod.name, "the uid is held for another pod: refused");
                return Err(EnrollError::BadInput(format!(
                    "pod {uid} ({}/{}): the uid is held for pod {}/{}; one uid is one pod",
                    pod.namespace, pod.name, e.pod.namespace, e.pod.name
                )));
            }
            // One network namespace is one pod: another uid in a namespace
            // held for a pod (a runtime's mistake, a reused path) would take
            // over its capture's tag and split its traffic between two
            // identities at the proxy.
            let held = st
                .pods
                .iter()
                .find(|(u, e)| {
                    **u != uid && e.netns.is_some() && inode.is_some() && e.inode == inode
                })
                .map(|(u, _)| u.clone());
            let kept = || {
                st.keep_only
                    .iter()
                    .find(|(u, k)| **u != uid && k.iter().any(|k| Some(k.inode) == inode))
                    .map(|(u, _)| u.clone())
            };
            if let Some(other) = held.or_else(kept) {
                tracing::warn!(holder = %other, "the network namespace is another pod's: refused");
                return Err(EnrollError::BadInput(format!(
                    "pod {uid}: network namespace net:[{}] is pod {other}'s; one network namespace is one pod",
                    inode.unwrap_or(0)
                )));
            }
            match st.pods.get(&uid) {
                Some(e) if e.inode == inode => (true, merge(pod, &e.pod)),
                _ => (false, pod),
            }
        };
        let tag = pod.owner_tag(&self.config.node_name);
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
        // A pod kept at the proxies, enrolled again in the same namespace:
        // a failed Add leaves it kept, its rules in place.
        let was_kept = lock(&self.state)
            .keep_only
            .get(&uid)
            .is_some_and(|k| k.iter().any(|k| Some(k.inode) == inode));
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
                let unkept = {
                    let mut st = lock(&self.state);
                    let gone = st.keep_only.remove(&uid).is_some();
                    if gone {
                        st.gen += 1;
                    }
                    gone
                };
                if unkept {
                    tracing::info!("a pod the proxies kept is enrolled again");
                    self.store_kept();
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
                if was_kept {
                    // Still kept: the proxies keep serving it as before.
                    return Err(fail.error);
                }
                if let Some(conn) = fail.nacked_by {
                    // The proxy keeps retrying a nacked pod: tell it we gave up.
                    if let Err(e) = conn.exchange(&del_request(&uid), None) {
                        self.close_conn(&conn, &format!("Del after nack: {e}"));
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

    /// Unenrolls each pod held here that claims one of `pod`'s addresses
    /// and whose network namespace is gone: the runtime gave its address to
    /// `pod`, so its sandbox was torn down and the DEL that should have
    /// released it was missed (refused while the agent was busy: the plugin
    /// answers DEL as done). Held
    /// on, it would have the proxies refuse `pod` as a second claim on the
    /// address, every retry of its ADD, until the agent restarted. A holder
    /// whose namespace is live is left alone: the proxy refuses two live
    /// pods on one address. Runs before `pod`'s own lock is taken, so no
    /// two pod locks are ever held at once; a holder whose enroll or
    /// unenroll runs now is left to it (`pod`'s ADD is retried). Kept pods
    /// (no record at start: their addresses unknown here) whose namespaces
    /// are gone leave the proxies too.
    fn release_dead_holders(&self, pod: &Pod) {
        let holders = || -> Vec<(String, bool)> {
            lock(&self.state)
                .pods
                .iter()
                .filter(|(uid, e)| {
                    **uid != pod.uid && e.pod.ips.iter().any(|ip| pod.ips.contains(ip))
                })
                .map(|(uid, e)| (uid.clone(), e.netns.is_some()))
                .collect()
        };
        let found = holders();
        let kept = !lock(&self.state).keep_only.is_empty();
        // A namespace may have gone since the last reconcile: look now.
        if kept || found.iter().any(|(_, pinned)| *pinned) {
            self.release_gone_netns();
        }
        if found.is_empty() {
            return;
        }
        for (uid, pinned) in holders() {
            if pinned {
                tracing::warn!(holder = %uid, "a pod with a live network namespace holds one of this pod's addresses");
                continue;
            }
            tracing::warn!(holder = %uid, "the runtime gave this pod the address of a pod whose network namespace is gone and whose DEL never came: that pod is unenrolled");
            if let Err(e) = self.unenroll_inner(&uid, None, NetnsMatch::Gone, false) {
                tracing::warn!(holder = %uid, error = %e, "unenrolling the pod that held the address failed");
            }
        }
    }

    /// Sends `Add` to the newest ready proxy; on a broken connection, to the
    /// next newest. Returns the connection id that acknowledged.
    fn add_to_newest(&self, pod: &Pod, netns: BorrowedFd<'_>) -> Result<u64, AddFailure> {
        let req = add_request(pod);
        let mut tried = Vec::new();
        let mut last_error = None;
        loop {
            let target = lock(&self.state).newest_ready(&tried);
            let Some(conn) = target else {
                return Err(AddFailure {
                    error: EnrollError::NoProxy { last_error },
                    nacked_by: None,
                });
            };
            tried.push(conn.id);
            match conn.exchange(&req, Some(netns)) {
                Ok(Answer::Ack) => return Ok(conn.id),
                Ok(Answer::Nack(reason)) => {
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
                    self.close_conn(&conn, &why);
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

    /// See [`crate::kube::Enrollment::release_gone`]: as [`Self::unenroll`],
    /// the rules left in place.
    pub(super) fn release_gone(&self, uid: &str) -> Result<(), EnrollError> {
        self.unenroll_inner(uid, None, NetnsMatch::Any, false)
            .map(|_| ())
    }

    /// Unenrolls `uid` if it is enrolled with sandbox `container_id` and
    /// netns `inode` (each when given). Returns whether it was.
    pub(super) fn unenroll_matching(
        &self,
        uid: &str,
        container_id: Option<&str>,
        inode: Option<u64>,
    ) -> Result<bool, EnrollError> {
        let netns = inode.map_or(NetnsMatch::Any, NetnsMatch::Inode);
        self.unenroll_inner(uid, container_id, netns, true)
    }

    fn unenroll_inner(
        &self,
        uid: &str,
        container_id: Option<&str>,
        netns: NetnsMatch,
        remove_rules: bool,
    ) -> Result<bool, EnrollError> {
        let span = tracing::info_span!("unenroll", pod.uid = %uid, remove_rules);
        let _span = span.enter();
        let _guard = if netns == NetnsMatch::Gone {
            // Another pod's enroll: never waits on this one.
            self.pod_locks
                .try_lock(uid)
                .ok_or_else(|| EnrollError::Busy {
                    uid: uid.to_string(),
                    secs: 0,
                })?
        } else {
            self.pod_locks.lock(uid)?
        };
        let inode = match netns {
            NetnsMatch::Inode(inode) => Some(inode),
            NetnsMatch::Any | NetnsMatch::Gone => None,
        };
        if netns != NetnsMatch::Gone && self.release_kept(uid, inode, remove_rules) {
            return Ok(true);
        }
        let (entry, conns) = {
            let mut st = lock(&self.state);
            let matches = st.pods.get(uid).map(|e| {
                let cid_ok = match (container_id, e.pod.container_id.as_deref()) {
                    (Some(want), Some(have)) => want == have,
                    _ => true,
                };
                let ino_ok = match (netns, e.inode) {
                    (NetnsMatch::Inode(want), Some(have)) => want == have,
                    // Enrolled again (a namespace held) since it was found gone.
                    (NetnsMatch::Gone, _) => e.netns.is_none(),
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
            (entry, st.ready_conns())
        };
        self.persist_pods(&[uid.to_string()]);
        self.del_everywhere(uid, conns);
        // The proxies dropped it: no longer captured, whatever the rules do next.
        if let (Some(annotator), Some(e)) = (&self.config.annotator, &entry) {
            annotator.released(&pod_ref(&e.pod));
        }
        if let Some(fd) = entry
            .as_ref()
            .and_then(|e| e.netns.as_ref())
            .filter(|_| remove_rules)
        {
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

    /// `Del` of `uid` to each of `conns`.
    fn del_everywhere(&self, uid: &str, conns: Vec<Arc<Conn>>) {
        let req = del_request(uid);
        for conn in conns {
            match conn.exchange(&req, None) {
                Ok(Answer::Ack) => {}
                Ok(Answer::Nack(reason)) => {
                    tracing::warn!(proxy.conn = conn.id, %reason, "proxy nacked Del")
                }
                Err(e) => {
                    self.close_conn(&conn, &format!("Del of pod {uid}: {e}"));
                }
            }
        }
    }

    /// A pod only kept at the proxies (see [`State::keep_only`]) leaves:
    /// `Del` to every ready proxy, and with `remove_rules` its rules are
    /// removed from each namespace whose tag still names it. Whether it was
    /// one (kept in namespace `inode`, when given). The caller holds the
    /// pod's lock.
    fn release_kept(&self, uid: &str, inode: Option<u64>, remove_rules: bool) -> bool {
        let (kept, conns) = {
            let mut st = lock(&self.state);
            if st.pods.contains_key(uid) {
                return false;
            }
            match st.keep_only.get(uid) {
                Some(k) if inode.is_none_or(|want| k.iter().any(|k| k.inode == want)) => {}
                _ => return false,
            }
            let kept = st.keep_only.remove(uid).unwrap_or_default();
            st.gen += 1;
            (kept, st.ready_conns())
        };
        self.del_everywhere(uid, conns);
        if remove_rules {
            for k in &kept {
                let named = ringway_redirect::read_tag(k.netns.as_fd())
                    .ok()
                    .flatten()
                    .is_some_and(|t| t.uid == uid);
                if named {
                    if let Err(e) = ringway_redirect::remove(k.netns.as_fd(), &self.config.capture)
                    {
                        tracing::warn!(pod.uid = %uid, netns.inode = k.inode, error = %e, "removing a kept pod's rules failed");
                    }
                }
            }
        }
        self.store_kept();
        tracing::info!(pod.uid = %uid, remove_rules, "a pod the proxies kept (no record of it at start) left them");
        true
    }

    // ------------------------------------------------------------ liveness

    /// Releases the netns of every pod whose namespace is gone (no process,
    /// no mount in `netns_dirs`, and its path no longer names it). Returns
    /// their UIDs.
    pub(super) fn release_gone_netns(&self) -> Vec<String> {
        let (candidates, kept) = {
            let st = lock(&self.state);
            (st.pinned(), !st.keep_only.is_empty())
        };
        if candidates.is_empty() && !kept {
            return Vec::new();
        }
        let Some(live) = live_inodes(&self.config.proc_root, &self.config.netns_dirs) else {
            return Vec::new();
        };
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
        let released = lock(&self.state).release(gone);
        // The record says the namespace is gone too (no inode to adopt).
        self.persist_pods(&released);
        self.release_gone_kept(&live);
        released
    }

    /// The kept pods none of whose namespaces is live any more leave the
    /// proxies (their namespaces that are gone are forgotten).
    fn release_gone_kept(&self, live: &std::collections::HashSet<u64>) {
        let (gone, changed): (Vec<String>, bool) = {
            let mut st = lock(&self.state);
            let mut changed = false;
            for k in st.keep_only.values_mut() {
                let before = k.len();
                k.retain(|k| live.contains(&k.inode));
                changed |= k.len() != before;
            }
            let gone = st
                .keep_only
                .iter()
                .filter(|(_, k)| k.is_empty())
                .map(|(uid, _)| uid.clone())
                .collect();
            (gone, changed)
        };
        for uid in gone {
            if let Ok(_guard) = self.pod_locks.lock(&uid) {
                self.release_kept(&uid, None, false);
            }
        }
        if changed {
            self.store_kept();
        }
    }

    /// A duplicate of the netns fd held for `uid`, with its path.
    pub(super) fn pinned_netns(&self, uid: &str) -> Option<(OwnedFd, Option<PathBuf>)> {
        let st = lock(&self.state);
        let e = st.pods.get(uid)?;
        Some((e.netns.as_ref()?.try_clone().ok()?, e.path.clone()))
    }

    // ------------------------------------------------------------ CNI

    /// See [`Pods::check`].
    fn check_pod(
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
            (e.pod.owner_tag(&self.config.node_name), fd)
        };
        if !self.any_ready() {
            return Err(CheckError::NotReady);
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
    fn collect_garbage(&self, valid: &HashSet<String>) -> Vec<String> {
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

impl Proxies for Core {
    fn snapshot(&self, conn: &Arc<Conn>) -> (Vec<SnapItem>, u64) {
        self.release_gone_netns();
        lock(&self.state).register_and_snapshot(conn)
    }

    fn catch_up(
        &self,
        conn: &Conn,
        seen: &mut u64,
        told: &BTreeMap<String, Option<u64>>,
    ) -> Option<(Vec<SnapItem>, Vec<String>)> {
        lock(&self.state).catch_up(conn, seen, told)
    }

    fn drop_conn(&self, conn: &Conn, why: &str) -> bool {
        self.close_conn(conn, why)
    }
}

impl Pods for Core {
    fn enroll(&self, pod: Pod, netns: OwnedFd, path: Option<PathBuf>) -> Result<(), EnrollError> {
        Core::enroll(self, pod, netns, path)
    }

    fn find(&self, uid: Option<&str>, container_id: &str) -> Option<String> {
        lock(&self.state).find(uid, container_id)
    }

    fn name_of(&self, uid: &str) -> Option<(String, String)> {
        let state = lock(&self.state);
        let e = state.pods.get(uid)?;
        Some((e.pod.namespace.clone(), e.pod.name.clone()))
    }

    fn unenroll_matching(
        &self,
        uid: &str,
        container_id: Option<&str>,
        inode: Option<u64>,
    ) -> Result<bool, EnrollError> {
        Core::unenroll_matching(self, uid, container_id, inode)
    }

    fn check(
        &self,
        uid: &str,
        container_id: &str,
        netns_inode: Option<u64>,
    ) -> Result<(), CheckError> {
        self.check_pod(uid, container_id, netns_inode)
    }

    fn any_ready(&self) -> bool {
        Core::any_ready(self)
    }

    fn gc(&self, valid: &HashSet<String>) -> Vec<String> {
        self.collect_garbage(valid)
    }
}

impl PodCount for Core {
    fn pod_count(&self) -> usize {
        lock(&self.state).pods.len()
    }
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
        let dir = ringway_testbed::TempDir::new("persist");
        let path = dir.join("pods.json");
        let core = Core::new(
            Arc::new(AgentConfig {
                state_file: Some(path.clone()),
                ..AgentConfig::default()
            }),
            Arc::default(),
        );
        let on_file = || {
            super::super::record::load(&path, "")
                .unwrap()
                .unwrap()
                .into_values()
                .map(|r| (r.uid, r.netns_inode))
                .collect::<Vec<_>>()
        };
        {
            let mut st = lock(&core.state);
            for e in [entry("a", 1), entry("b", 2), entry("c", 3)] {
                st.pods.insert(e.pod.uid.clone(), e);
            }
        }
        core.persist();
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
