//! The agent's model of a pod, a leaf: [`Pod`] (what is enrolled), how the
//! agent reports the pods and proxies it holds ([`PodStatus`],
//! [`ProxyStatus`]) and what rediscovery found ([`Rediscovery`]), and the
//! owner tag a pod's rules carry.

use std::net::IpAddr;

use ringway_redirect::PodTag;

/// A pod to enroll.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    /// Pod UID: the key the proxy knows the pod by (required).
    pub uid: String,
    /// Pod name (required).
    pub name: String,
    /// Pod namespace (required).
    pub namespace: String,
    /// Service account (required: the CNI ADD gets it from the API server or
    /// [`super::AgentConfig::service_accounts`], never by guessing; an enroll without
    /// one is refused).
    pub service_account: String,
    /// The pod's IPs.
    pub ips: Vec<IpAddr>,
    /// The CNI sandbox id, when enrolled through CNI: a DEL or GC for another
    /// sandbox of the same pod leaves this one alone.
    pub container_id: Option<String>,
}

impl std::fmt::Display for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

impl Pod {
    /// The owner tag of the pod's rules, written by the agent of `node`.
    pub(super) fn owner_tag(&self, node: &str) -> PodTag {
        PodTag {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
            node: node.to_owned(),
            container_id: self.container_id.clone().unwrap_or_default(),
            ips: self.ips.clone(),
        }
    }
}

/// An enrolled pod, as the agent holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatus {
    /// The pod.
    pub pod: Pod,
    /// Inode of the pod's netns while the agent holds it; `None` once the
    /// namespace is gone (the pod is sent as `Keep`).
    pub netns_inode: Option<u64>,
    /// Where the pod came from.
    pub source: PodSource,
}

/// How the agent learnt about a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSource {
    /// [`super::Enrollment::enroll`] (CNI ADD or the Kubernetes watch).
    Enrolled,
    /// Rebuilt from an owner tag at start.
    Rediscovered,
}

/// A connected proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyStatus {
    /// Connection number (higher is newer).
    pub id: u64,
    /// The proxy's PID, from SO_PEERCRED.
    pub pid: Option<i32>,
    /// Snapshot delivered: eligible for new pods.
    pub ready: bool,
}

/// What rediscovery found at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rediscovery {
    /// Distinct network namespaces examined.
    pub namespaces: usize,
    /// UIDs of the pods rebuilt from their owner tags.
    pub adopted: Vec<String>,
    /// UIDs whose rules had drifted and were re-applied.
    pub reapplied: Vec<String>,
    /// Tagged namespaces that were skipped, and why (other node, unreadable tag,
    /// duplicate UID).
    pub skipped: Vec<String>,
    /// UIDs of this node's tags found while the record could not be used
    /// (unreadable, or gone), or kept at the start before (in the namespaces
    /// the file beside the record lists): not adopted (a tag is the pod's to write, so
    /// never an identity), but the proxies are told to `Keep` them until
    /// each is enrolled, unenrolled, or its namespace is gone, so an agent
    /// that lost its record does not tear down every pod of its node.
    pub kept: Vec<String>,
}
