//! Which identity a caller may have: its own, or, for the node proxy's
//! service account only, the identity of a pod running on the caller's node.

use ringway_identity::Identity;

use crate::authn::Caller;
use crate::grpc::{Code, Status};

/// What the CA knows of a pod (from its cache of the API's pods).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// The node it is scheduled on (empty: not scheduled).
    pub node: String,
    /// Its service account; empty when it has none (a static or mirror
    /// pod), and then it has no identity.
    pub service_account: String,
    /// Running, or about to (not finished; a pod being deleted runs until
    /// its grace period ends).
    pub live: bool,
    /// Being deleted (`deletionTimestamp`): it still holds its identity
    /// while live, but as a caller (a node proxy on its way out) it may no
    /// longer impersonate.
    pub terminating: bool,
}

impl PodView {
    /// Whether the pod counts as holding `ns/<namespace>/sa/<service_account>`:
    /// live, and with a service account.
    pub fn holds_identity(&self) -> bool {
        self.live && !self.service_account.is_empty()
    }
}

/// Why a [`PodDirectory`] cannot answer now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The pods have not been listed yet.
    #[error("the pod cache has not listed the cluster's pods yet")]
    NotListed {
        /// The watch's last error, when it is failing.
        error: Option<String>,
    },
    /// The pod watch has been failing for longer than allowed: the cache
    /// may lend a deleted or moved pod's identity.
    #[error("the pod watch has been failing for {}s (more than the {}s allowed), so the pod cache may be stale", .failing_for.as_secs(), .allowed.as_secs())]
    Stale {
        /// Since the first failure.
        failing_for: std::time::Duration,
        /// The bound.
        allowed: std::time::Duration,
        /// The watch's last error.
        error: String,
    },
}

impl NotReady {
    /// The `reason` of the refusal it causes.
    pub fn reason(&self) -> &'static str {
        match self {
            NotReady::NotListed { .. } => "pod_cache_not_ready",
            NotReady::Stale { .. } => "pod_cache_stale",
        }
    }

    /// The message with the watch's last error (for the CA's readiness
    /// endpoint and log; the caller gets the message alone).
    pub fn detail(&self) -> String {
        match self {
            NotReady::NotListed { error: None } => self.to_string(),
            NotReady::NotListed { error: Some(e) } | NotReady::Stale { error: e, .. } => {
                format!("{self}; last error: {e}")
            }
        }
    }
}

/// The pods of the cluster, as far as the CA has seen them.
pub trait PodDirectory: Send + Sync {
    /// `Err` while the cache cannot answer (not listed yet, or its watch
    /// has been failing for too long).
    fn ready(&self) -> Result<(), NotReady>;
    /// The pod `namespace/name`.
    fn pod(&self, namespace: &str, name: &str) -> Option<PodView>;
    /// Whether a live pod on `node` runs as `namespace/service_account`.
    fn has_identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool;
}

/// The authorization rules' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The mesh's trust domain.
    pub trust_domain: String,
    /// `namespace/serviceAccount` of the node proxies: the only callers that
    /// may ask for another identity.
    pub node_proxy: (String, String),
}

/// The identity `caller` gets, asking for `impersonate` (a SPIFFE ID) or for
/// itself.
pub fn authorize(
    policy: &Policy,
    caller: &Caller,
    impersonate: Option<&str>,
    pods: &dyn PodDirectory,
) -> Result<Identity, Status> {
    let own = Identity::new(
        &policy.trust_domain,
        &caller.namespace,
        &caller.service_account,
    );
    let Some(requested) = impersonate else {
        return Ok(own);
    };
    let wanted = Identity::from_spiffe_id(requested).map_err(|e| {
        Status::new(
            Code::InvalidArgument,
            "bad_impersonated_identity",
            format!("ImpersonatedIdentity: {e}"),
        )
    })?;
    if wanted.trust_domain != policy.trust_domain {
        return Err(Status::new(
            Code::PermissionDenied,
            "foreign_trust_domain",
            format!(
                "ImpersonatedIdentity {requested} is not in this CA's trust domain {:?}",
                policy.trust_domain
            ),
        ));
    }
    if wanted == own {
        return Ok(own);
    }
    let (np_ns, np_sa) = &policy.node_proxy;
    if caller.namespace != *np_ns || caller.service_account != *np_sa {
        return Err(Status::new(
            Code::PermissionDenied,
            "impersonation_not_allowed",
            format!(
                "{} may not ask for another identity: only the node proxy's service account {np_ns}/{np_sa} may",
                caller.key()
            ),
        ));
    }
    pods.ready().map_err(|why| {
        Status::new(
            Code::Unavailable,
            why.reason(),
            format!("cannot check ImpersonatedIdentity now: {why}"),
        )
    })?;
    let node = caller_node(caller, pods)?;
    if !pods.has_identity_on_node(&node, &wanted.namespace, &wanted.service_account) {
        return Err(Status::new(
            Code::PermissionDenied,
            "identity_not_on_node",
            format!("no pod running on node {node:?} (the caller's) has identity {requested}"),
        ));
    }
    Ok(wanted)
}

/// The caller's node: from its pod as the API knows it (the pod's UID must
/// match the token's: a token bound to a pod names both, and one that names
/// no UID cannot tell a replaced pod from the live one, so it is refused),
/// cross-checked with the token's node name when the cluster puts one there.
fn caller_node(caller: &Caller, pods: &dyn PodDirectory) -> Result<String, Status> {
    let deny = |reason, m: String| Status::new(Code::PermissionDenied, reason, m);
    let (Some(name), Some(uid)) = (caller.pod_name.as_deref(), caller.pod_uid.as_deref()) else {
        return Err(deny(
            "token_not_bound_to_a_pod",
            format!(
                "{}: the token is not bound to a pod (its name and UID), so the caller's node is unknown",
                caller.key()
            ),
        ));
    };
    let pod = pods.pod(&caller.namespace, name).ok_or_else(|| {
        deny(
            "caller_pod_unknown",
            format!("the caller's pod {}/{name} is not known", caller.namespace),
        )
    })?;
    if uid != pod.uid {
        return Err(deny(
            "caller_pod_replaced",
            format!(
                "the caller's pod {}/{name} has another UID than its token (a replaced pod)",
                caller.namespace
            ),
        ));
    }
    if !pod.live || pod.terminating || pod.node.is_empty() {
        return Err(deny(
            "caller_pod_not_running",
            format!(
                "the caller's pod {}/{name} is not running on a node",
                caller.namespace
            ),
        ));
    }
    if caller.node_name.as_deref().is_some_and(|n| n != pod.node) {
        return Err(deny(
            "caller_node_mismatch",
            format!(
                "the token names node {:?}, the caller's pod runs on {:?}",
                caller.node_name.as_deref().unwrap_or_default(),
                pod.node
            ),
        ));
    }
    if pod.service_account != caller.service_account {
        return Err(deny(
            "caller_pod_mismatch",
            format!(
                "the caller's pod {}/{name} runs as {}, not as the token's {}",
                caller.namespace, pod.service_account, caller.service_account
            ),
        ));
    }
    Ok(pod.node)
}
