//! The watch's shared vocabulary, at the bottom of the `kube` module: a pod's
//! identity as the agent holds it, the reference a patch names, and the
//! annotation the agent keeps on the pods it captures. Every other module of
//! `kube` may use it; it uses none of them.

use std::net::IpAddr;

/// The annotation the Istio ambient mesh's CNI agent sets on each pod it captures.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";
/// [`REDIRECTION_ANNOTATION`]'s value on a captured pod.
pub const REDIRECTION_ENABLED: &str = "enabled";
/// The annotation a mirror pod (the API server's object of a static pod,
/// with a uid of its own) carries with its static pod's uid: the uid the
/// kubelet, and so the CNI ADD, knows the pod by.
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What the node agent needs to enroll a running pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodIdentity {
    /// `metadata.uid`: the key of every enroll/unenroll.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `spec.serviceAccountName` (`default` when unset).
    pub service_account: String,
    /// `status.podIPs` in order (primary first), or `status.podIP` when the list is
    /// absent; values that are not IP addresses are left out.
    pub ips: Vec<IpAddr>,
}

/// A pod as the agent holds it: the identity it hands to the node proxy (ZDS
/// `WorkloadInfo`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnrolledPod {
    /// Pod uid.
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Service account; empty when the pod was enrolled by CNI ADD and the watch has
    /// not filled it in yet.
    pub service_account: String,
}

impl From<&PodIdentity> for EnrolledPod {
    fn from(id: &PodIdentity) -> EnrolledPod {
        EnrolledPod {
            uid: id.uid.clone(),
            name: id.name.clone(),
            namespace: id.namespace.clone(),
            service_account: id.service_account.clone(),
        }
    }
}

/// The pod a patch is for: its API object, by namespace and name, and the uid it must
/// have.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}
