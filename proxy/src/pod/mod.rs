//! The pod model: what the proxy knows of a pod it serves, shared by the
//! control thread and every worker ([`PodShared`]: its UID, network
//! namespace, addresses, identity, metrics labels and authorized flows),
//! what it reports of one ([`PodInfo`]), and the same-node map
//! ([`LocalPods`]).
//!
//! A leaf of the crate's layers: it names the metrics' label types and
//! the socket layer's port split, nothing above them. What the pod's flows
//! are allowed to be is `policy`'s; how one worker serves the pod is
//! `worker`'s.

mod flows;
mod labels;
mod spares;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, RwLock};

use ringway_config::Mesh;

pub use flows::{FlowAuthz, FlowTable};
pub use labels::PodLabels;
pub use spares::{SpareKind, Spares, BATCH as SPARE_BATCH};

use crate::metrics::Peer;
use crate::sock::{ListenerKind, PortSplit};

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
    /// on policy changes); filled in by `Proxy::pods`.
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

/// A pod as every worker sees it (immutable but for its identity and
/// labels, shared).
#[derive(Debug)]
pub struct PodShared {
    /// Pod UID.
    pub uid: Arc<str>,
    /// The pod's network namespace.
    pub netns: OwnedFd,
    /// The pod's addresses (the agent's, else its netns's at add; see
    /// [`PodInfo::ips`]).
    pub ips: Vec<IpAddr>,
    /// The pod's ephemeral port range, split between own and spoofed sockets.
    pub ports: PortSplit,
    /// Who the pod is and its SPIFFE principal (empty when unknown); the
    /// agent may send a fuller identity later (same netns), so it can change.
    pub who: RwLock<(PodIdentity, String)>,
    /// Connections authorized against this pod's policies (re-checked when
    /// the policies change: `policy::recheck`).
    pub flows: FlowTable,
    /// Its metrics labels, made once per mesh and identity (see
    /// [`PodShared::labels`]).
    pub labels: RwLock<PodLabels>,
    /// Upstream sockets made ahead in its netns ([`PodShared::upstream_socket`]).
    pub spares: Spares,
    /// Its addresses were read from its netns (the agent sent none), which
    /// the pod can write: see [`PodShared::confirms_address`].
    pub addresses_from_netns: std::sync::atomic::AtomicBool,
}

/// What the mesh holds for a pod (see [`PodShared::workload`]).
enum OwnRecord<'m> {
    Found(&'m ringway_config::Workload),
    NotYet,
    Ambiguous,
}

/// Pods served by this proxy, by IP: read by workers for the same-node fast path.
pub type LocalPods = Arc<RwLock<HashMap<IpAddr, Arc<PodShared>>>>;

impl PodShared {
    /// A pod known by `uid` in `netns`, with its addresses, port split and
    /// identity (`principal`: its SPIFFE principal, empty when unknown);
    /// no flow, labels not made yet.
    pub fn new(
        uid: &str,
        netns: OwnedFd,
        ips: Vec<IpAddr>,
        ports: PortSplit,
        identity: PodIdentity,
        principal: String,
    ) -> PodShared {
        PodShared {
            uid: Arc::from(uid),
            netns,
            ips,
            ports,
            who: RwLock::new((identity, principal)),
            flows: FlowTable::default(),
            labels: Default::default(),
            spares: Spares::default(),
            addresses_from_netns: Default::default(),
        }
    }

    /// Whether the pod's address `ip` is its own as far as `mesh` can
    /// tell. Always, unless the address was read from the pod's netns
    /// (which the pod can write: a pod could add the address of a pod of
    /// another node) and a control plane feeds the mesh; then only when the
    /// mesh's record of the pod ([`PodShared::workload`]: by uid, else the
    /// one record its addresses name, of the namespace and name the agent
    /// named) lists it: `Some(false)` when it does not, or when the pod's
    /// addresses name different records; `None` when no record has come
    /// yet.
    pub fn confirms_address(&self, mesh: &ringway_config::Mesh, ip: IpAddr) -> Option<bool> {
        if !self
            .addresses_from_netns
            .load(std::sync::atomic::Ordering::Relaxed)
            || mesh.is_complete()
        {
            return Some(true);
        }
        match self.own_record(mesh) {
            OwnRecord::Found(w) => Some(w.ips.contains(&ip.to_canonical())),
            OwnRecord::NotYet => None,
            OwnRecord::Ambiguous => Some(false),
        }
    }

    /// An upstream socket to `dst` in the pod's netns, with the proxy's
    /// `mark`, bound to `spoof` (the client's address) when given: made as
    /// [`crate::sock::make_upstream`] makes one, but from the pod's spares
    /// (a netns switch per [`SPARE_BATCH`] sockets, not per connection).
    pub fn upstream_socket(
        &self,
        dst: SocketAddr,
        mark: u32,
        spoof: Option<IpAddr>,
    ) -> std::io::Result<OwnedFd> {
        let kind = SpareKind {
            v6: dst.is_ipv6(),
            spoofed: spoof.is_some(),
            mark,
        };
        let fd = self.spares.take(&self.netns, kind, self.ports)?;
        if let Some(src) = spoof {
            crate::sock::bind_spoofed(std::os::fd::AsFd::as_fd(&fd), src, dst)?;
        }
        Ok(fd)
    }

    /// The pod's mesh workload: by uid, else the one record that owns its
    /// addresses, if that is this pod ([`PodShared::is_this_pod`]); none
    /// when its addresses name different records (a pod that took another
    /// pod's address names two).
    pub fn workload<'m>(
        &self,
        mesh: &'m ringway_config::Mesh,
    ) -> Option<&'m ringway_config::Workload> {
        match self.own_record(mesh) {
            OwnRecord::Found(w) => Some(w),
            OwnRecord::NotYet | OwnRecord::Ambiguous => None,
        }
    }

    fn own_record<'m>(&self, mesh: &'m ringway_config::Mesh) -> OwnRecord<'m> {
        if let Some(w) = mesh.workload_by_uid(&self.uid) {
            return OwnRecord::Found(w);
        }
        let mut found: Option<&ringway_config::Workload> = None;
        for w in self
            .ips
            .iter()
            .filter_map(|ip| mesh.workload_by_ip(*ip))
            .filter(|w| self.is_this_pod(mesh, w))
        {
            match found {
                Some(f) if f.uid != w.uid => return OwnRecord::Ambiguous,
                _ => found = Some(w),
            }
        }
        found.map_or(OwnRecord::NotYet, OwnRecord::Found)
    }

    /// Whether `w`, a workload that owns one of the pod's addresses, is
    /// this pod: of the namespace the agent named, and, where a control
    /// plane feeds the mesh, of the name it named too. An address outlives
    /// its pod: the record of a deleted pod may still hold an address the
    /// cluster has given a new one, and its namespace, labels and policies
    /// are not the new pod's. (A configuration file is the whole truth:
    /// there, the file's record of the address is the pod's.)
    fn is_this_pod(&self, mesh: &ringway_config::Mesh, w: &ringway_config::Workload) -> bool {
        let who = self.who.read().unwrap_or_else(|p| p.into_inner());
        let named = &who.0;
        if !named.namespace.is_empty() && w.namespace != named.namespace {
            return false;
        }
        mesh.is_complete() || named.name.is_empty() || w.name == named.name
    }

    /// The service a connection that arrived at this pod's port `port`
    /// went to, as the destination side reports it (the reference's
    /// `guess_inbound_service`): the one of the pod's own services that the
    /// client named (`forwarded: …;host=`), else the first of its services
    /// with a target port `port`. A name that is not one of the pod's
    /// services is ignored: a peer cannot make a pod's metrics claim
    /// another service.
    pub fn inbound_service<'m>(
        &self,
        mesh: &'m Mesh,
        host: Option<&str>,
        port: u16,
    ) -> Option<&'m Arc<ringway_config::Service>> {
        let w = self.workload(mesh)?;
        let named = host.and_then(|h| mesh.services_of(&w.uid).find(|s| s.hostname == h));
        named.or_else(|| {
            mesh.services_of(&w.uid)
                .find(|s| s.ports.values().any(|&t| t == port))
        })
    }

    /// The pod's metrics labels under `mesh` (the snapshot the caller
    /// holds): those the control thread made when the pod was added, the
    /// mesh published or the pod's identity changed ([`PodShared::relabel`]),
    /// so a connection clones an `Arc`; made here only when they were made
    /// under another mesh (a connection racing a mesh update).
    pub fn labels(&self, mesh: Option<&Arc<Mesh>>) -> Arc<Peer> {
        let made = self
            .labels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .made_under(mesh);
        match made {
            Some(peer) => peer,
            None => self.relabel(mesh),
        }
    }

    /// Makes the pod's labels under `mesh` from its workload and identity
    /// now, keeps them and remembers the name (call after either changed).
    pub fn relabel(&self, mesh: Option<&Arc<Mesh>>) -> Arc<Peer> {
        let mut l = self.labels.write().unwrap_or_else(|p| p.into_inner());
        // Made under the lock: a later identity change's relabel always
        // lands after (and over) one that read the identity before it.
        let peer = self.peer(mesh.map(|m| &**m));
        l.keep(mesh, peer)
    }

    /// Every (namespace, workload) the pod's labels have named.
    pub fn label_names(&self) -> Vec<(String, String)> {
        self.labels
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .names()
    }

    /// Who the pod is, for metrics labels: its mesh workload (by uid, else
    /// by address) with this node's locality, else what the agent said
    /// (its uid when it named nothing). Built anew: connections take
    /// [`PodShared::labels`].
    fn peer(&self, mesh: Option<&ringway_config::Mesh>) -> Peer {
        let who = self.who.read().unwrap_or_else(|p| p.into_inner());
        let workload = mesh.and_then(|m| Some((m, self.workload(m)?)));
        if let Some((mesh, w)) = workload {
            let node = mesh.node_locality();
            let locality = if node.region.is_empty() && node.zone.is_empty() {
                &w.locality
            } else {
                node
            };
            // The agent's principal, else the workload's identity.
            let principal = if who.1.is_empty() {
                w.identity(mesh.trust_domain()).to_string()
            } else {
                who.1.clone()
            };
            return Peer::of_workload(w, principal, mesh, locality);
        }
        // Not in the mesh: what the agent said, with the canonical service
        // and revision a pod without labels gets (its name, `latest`).
        let named = !who.0.name.is_empty();
        Peer {
            workload: if named {
                who.0.name.clone()
            } else {
                self.uid.to_string()
            },
            namespace: who.0.namespace.clone(),
            principal: who.1.clone(),
            canonical_service: if named {
                who.0.name.clone()
            } else {
                String::new()
            },
            canonical_revision: if named {
                "latest".into()
            } else {
                String::new()
            },
            cluster: mesh.map(|m| m.cluster_id().to_owned()).unwrap_or_default(),
            ..Peer::default()
        }
    }
}
