//! The agent's table of pods and proxy connections, the data the owner of
//! the state keeps under one lock ([`State`]): a pod and the connections it
//! is sent to change together, and every question about them (a snapshot,
//! what a connection missed, the pods to record) is answered here without
//! I/O. Above the pod model, the proxy connection and the record.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use super::pod::{Pod, PodSource, PodStatus, ProxyStatus};
use super::proxy_conn::{Conn, SnapItem};
use super::record::RecordedPod;

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

/// The pods and the proxy connections.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) pods: BTreeMap<String, Entry>,
    /// In accept order: the last ready one is the newest.
    pub(super) conns: Vec<Arc<Conn>>,
    /// Bumped on every change of `pods` or `keep_only` (connections in
    /// their snapshot catch up).
    pub(super) gen: u64,
    /// Pods the proxies are told to `Keep` though the agent does not hold
    /// them: named by this node's tags when the agent's record could not be
    /// used at start (uid -> each namespace whose tag names it). Never an
    /// identity; written beside the record (`<state file>.kept`) so a
    /// restart keeps them again. Each leaves when it is enrolled (an `Add`),
    /// unenrolled (a `Del`) or its namespaces are gone (a `Del`).
    pub(super) keep_only: BTreeMap<String, Vec<Kept>>,
}

/// A namespace whose tag names a kept pod (held: its rules can be removed
/// when the pod is unenrolled).
#[derive(Debug)]
pub(super) struct Kept {
    pub(super) inode: u64,
    pub(super) netns: OwnedFd,
}

impl State {
    /// The connections that are ready and alive, oldest first.
    pub(super) fn ready_conns(&self) -> Vec<Arc<Conn>> {
        self.conns
            .iter()
            .filter(|c| c.is_ready() && !c.is_dead())
            .cloned()
            .collect()
    }

    /// The newest ready, live connection whose id is not in `tried`.
    pub(super) fn newest_ready(&self, tried: &[u64]) -> Option<Arc<Conn>> {
        self.conns
            .iter()
            .rev()
            .find(|c| c.is_ready() && !c.is_dead() && !tried.contains(&c.id))
            .cloned()
    }

    /// Forgets connection `id`; whether it was registered.
    pub(super) fn remove_conn(&mut self, id: u64) -> bool {
        let before = self.conns.len();
        self.conns.retain(|c| c.id != id);
        self.conns.len() != before
    }

    /// The enrolled pods.
    pub(super) fn enrolled(&self) -> Vec<PodStatus> {
        self.pods
            .values()
            .map(|e| PodStatus {
                pod: e.pod.clone(),
                netns_inode: e.inode,
                source: e.source,
            })
            .collect()
    }

    /// The connected proxies, oldest first.
    pub(super) fn proxies(&self) -> Vec<ProxyStatus> {
        self.conns
            .iter()
            .map(|c| ProxyStatus {
                id: c.id,
                pid: c.pid,
                ready: c.is_ready(),
            })
            .collect()
    }

    /// Adds `conn` (not ready yet) and returns the snapshot with the
    /// generation it reflects.
    pub(super) fn register_and_snapshot(&mut self, conn: &Arc<Conn>) -> (Vec<SnapItem>, u64) {
        self.conns.push(conn.clone());
        let items = self
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
            .chain(
                self.keep_only
                    .keys()
                    .filter(|uid| !self.pods.contains_key(*uid))
                    .map(|uid| SnapItem {
                        pod: Pod {
                            uid: uid.clone(),
                            ..Pod::default()
                        },
                        netns: None,
                        inode: None,
                    }),
            )
            .collect();
        (items, self.gen)
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
        if self.gen == *seen {
            conn.set_ready();
            return None;
        }
        *seen = self.gen;
        let adds = self
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
            .filter(|uid| !self.pods.contains_key(*uid) && !self.keep_only.contains_key(*uid))
            .cloned()
            .collect();
        Some((adds, dels))
    }

    /// The pods holding a namespace: (uid, inode, path).
    pub(super) fn pinned(&self) -> Vec<(String, u64, Option<PathBuf>)> {
        self.pods
            .values()
            .filter(|e| e.netns.is_some())
            .filter_map(|e| Some((e.pod.uid.clone(), e.inode?, e.path.clone())))
            .collect()
    }

    /// Releases the namespace of each `(uid, inode)` still held with that
    /// inode; returns their UIDs.
    pub(super) fn release(&mut self, gone: Vec<(String, u64)>) -> Vec<String> {
        let mut released = Vec::new();
        for (uid, ino) in gone {
            if let Some(e) = self.pods.get_mut(&uid) {
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
            self.gen += 1;
        }
        released
    }

    /// The UID of the pod enrolled with sandbox `container_id` (by UID when
    /// given).
    pub(super) fn find(&self, uid: Option<&str>, container_id: &str) -> Option<String> {
        let e = match uid {
            // A pod only kept at the proxies is named by its uid alone.
            Some(uid) if !self.pods.contains_key(uid) && self.keep_only.contains_key(uid) => {
                return Some(uid.to_owned());
            }
            Some(uid) => self.pods.get(uid),
            None => self
                .pods
                .values()
                .find(|e| e.pod.container_id.as_deref() == Some(container_id)),
        }?;
        Some(e.pod.uid.clone())
    }

    /// What the state file is to record to agree with the pods held: the
    /// pods it records otherwise (`put`) and the UIDs it records that are no
    /// longer held (`del`), among `only` (every pod when `None`).
    pub(super) fn record_changes(
        &self,
        only: Option<&[String]>,
        written: &BTreeMap<String, RecordedPod>,
    ) -> (Vec<RecordedPod>, Vec<String>) {
        let stale = |uid: &String, e: &Entry| written.get(uid).is_none_or(|r| !recorded_as(e, r));
        match only {
            Some(uids) => {
                let put = uids
                    .iter()
                    .filter_map(|uid| self.pods.get(uid).map(|e| (uid, e)))
                    .filter(|(uid, e)| stale(uid, e))
                    .map(|(_, e)| recorded(e))
                    .collect();
                let del = uids
                    .iter()
                    .filter(|uid| !self.pods.contains_key(*uid) && written.contains_key(*uid))
                    .cloned()
                    .collect();
                (put, del)
            }
            None => {
                let put = self
                    .pods
                    .iter()
                    .filter(|(uid, e)| stale(uid, e))
                    .map(|(_, e)| recorded(e))
                    .collect();
                let del = written
                    .keys()
                    .filter(|uid| !self.pods.contains_key(*uid))
                    .cloned()
                    .collect();
                (put, del)
            }
        }
    }
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
