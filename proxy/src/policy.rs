//! Flow authorization: who a pod is to the mesh ([`pod_identity`],
//! [`pod_workload`]), whether a connection to a pod may go through
//! ([`authorize_plaintext`], [`authorize_local`]; the tunnel's streams
//! through `authorize`), and the re-check of the flows already open when
//! the policies change ([`register`], [`recheck`]).
//!
//! Every connection that was authorized against a pod's policies (plaintext
//! inbound, same-node fast path, each HBONE stream) registers what the
//! decision was made on (source address, verified identity, destination
//! port) and a shared handle of the sockets to reset, in the pod's
//! [`FlowTable`](crate::pod::FlowTable). When a new mesh is published,
//! [`recheck`] evaluates them again on the control thread and resets the
//! ones the new policies deny; the datapath notices the reset on its next
//! wake-up and tears the connection down as for any peer reset.
//!
//! It names the pod model, the metrics and what is in force; the datapath
//! (`worker`, `tunnel`) calls it.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use ringway_config::authz::{self, ConnInfo, Decision, Identity};
use ringway_config::{Mesh, Unsupported, Workload};

use crate::in_force::InForce;
use crate::metrics::{DenyLabels, DryRunLabels, Metrics};
use crate::pod::{FlowAuthz, PodShared};

/// Why a connection to a pod was not authorized.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Denied {
    /// A control plane feeds the mesh and has not sent the pod's workload.
    #[error(
        "the control plane has not sent the workload of pod {uid}: refused, never authorized against a guess"
    )]
    UnknownWorkload {
        /// The pod's UID.
        uid: Arc<str>,
    },
    /// The pod's workload needs what this proxy does not support (a
    /// waypoint, a network gateway).
    #[error("workload {namespace}/{name}: {what}")]
    Unsupported {
        /// The workload's namespace.
        namespace: String,
        /// The workload's name.
        name: String,
        /// What it needs.
        what: Unsupported,
    },
    /// The pod's policies deny it.
    #[error("{0}")]
    Policy(Decision),
}

/// A pod's SPIFFE identity: from the agent's record when it names both the
/// namespace and the service account, else the mesh's workload of the pod
/// ([`PodShared::workload`]: never the record of another pod that held one
/// of its addresses).
/// Never a guess: `None` (no certificate, no HBONE for the pod) when neither
/// says it.
pub fn pod_identity(mesh: &Mesh, pod: &PodShared) -> Option<Identity> {
    let td = mesh.trust_domain();
    let namespace = {
        let who = pod.who.read().unwrap_or_else(|p| p.into_inner());
        if !who.0.namespace.is_empty() && !who.0.service_account.is_empty() {
            return Some(Identity::new(td, &who.0.namespace, &who.0.service_account));
        }
        who.0.namespace.clone()
    };
    let Some(w) = pod.workload(mesh) else {
        if let Some(other) = pod.ips.iter().find_map(|ip| mesh.workload_by_ip(*ip)) {
            tracing::warn!(pod.uid = %pod.uid, pod.namespace = %namespace, workload.namespace = %other.namespace,
                workload.name = %other.name,
                "the agent sent no service account and the mesh's workload of the pod's IPs is another pod: no identity");
        }
        return None;
    };
    if w.service_account.is_empty() {
        // A pod without a service account has no identity.
        return None;
    }
    Some(w.identity(td))
}

/// The workload of a pod for authorization: the mesh's; where the mesh is
/// the whole truth (the configuration file) and does not list the pod, one
/// made from what the agent told us; `None` where a control plane feeds the
/// mesh and has not sent it (its labels and policies are unknown: never
/// authorize against a guess).
pub fn pod_workload<'m>(mesh: &'m Mesh, pod: &PodShared) -> Option<Cow<'m, Workload>> {
    if let Some(w) = pod.workload(mesh) {
        // Borrowed: authorizing a connection copies nothing.
        return Some(Cow::Borrowed(w));
    }
    if !mesh.is_complete() {
        return None;
    }
    let who = pod.who.read().unwrap_or_else(|p| p.into_inner());
    Some(Cow::Owned(Workload {
        host_network: false,
        uid: pod.uid.to_string(),
        name: who.0.name.clone(),
        namespace: who.0.namespace.clone(),
        service_account: who.0.service_account.clone(),
        ips: pod.ips.clone(),
        node: String::new(),
        tunnel: true,
        healthy: true,
        labels: Default::default(),
        locality: Default::default(),
        workload_name: who.0.name.clone(),
        trust_domain: None,
        canonical: None,
        unsupported: None,
        authorization_policies: Vec::new(),
    }))
}

/// Authorizes a plaintext inbound connection (no identity) to `pod` under
/// `mesh` (the one in force). `Ok(Some(..))`: allowed by the mesh's
/// policies (the flow is to be registered for re-checks); `Ok(None)`: no
/// mesh, nothing to check; `Err`: denied.
pub fn authorize_plaintext(
    metrics: &Metrics,
    mesh: Option<&Arc<Mesh>>,
    pod: &PodShared,
    src: IpAddr,
    dst: SocketAddr,
) -> Result<Option<FlowAuthz>, Denied> {
    let Some(mesh) = mesh else {
        return Ok(None);
    };
    authorize(metrics, mesh, pod, src, None, dst, "plaintext").map(Some)
}

/// Authorizes a same-node connection from pod `src_pod` (whose identity the
/// proxy knows first hand: it captured the connection in that pod's netns)
/// to `dst_pod`, as `dst_pod`'s inbound side would.
pub fn authorize_local(
    metrics: &Metrics,
    mesh: &Arc<Mesh>,
    src_pod: &PodShared,
    src_ip: IpAddr,
    dst_pod: &PodShared,
    dst: SocketAddr,
) -> Result<FlowAuthz, Denied> {
    let id = pod_identity(mesh, src_pod);
    authorize(metrics, mesh, dst_pod, src_ip, id, dst, "local")
}

/// Authorizes a connection from `src_ip` (with `src_identity` when mTLS
/// proved one) to `pod`'s `dst` under `mesh`, on `path` (`plaintext`,
/// `local`, `hbone`), counting what dry-run policies would have changed.
pub fn authorize(
    metrics: &Metrics,
    mesh: &Arc<Mesh>,
    pod: &PodShared,
    src_ip: IpAddr,
    src_identity: Option<Identity>,
    dst: SocketAddr,
    path: &'static str,
) -> Result<FlowAuthz, Denied> {
    let (dst_ip, dst_port) = (dst.ip().to_canonical(), dst.port());
    let Some(w) = pod_workload(mesh, pod) else {
        return Err(Denied::UnknownWorkload {
            uid: pod.uid.clone(),
        });
    };
    if let Some(u) = &w.unsupported {
        return Err(Denied::Unsupported {
            namespace: w.namespace.clone(),
            name: w.name.clone(),
            what: u.clone(),
        });
    }
    let d = authz::evaluate(
        mesh,
        &ConnInfo {
            src_ip,
            src_identity: src_identity.as_ref(),
            dst_workload: &w,
            dst_ip,
            dst_port,
        },
    );
    let conn = ConnInfo {
        src_ip,
        src_identity: src_identity.as_ref(),
        dst_workload: &w,
        dst_ip,
        dst_port,
    };
    if let Some(shadow) = authz::evaluate_dry_run(mesh, &conn, &d) {
        let decision = if shadow.is_allowed() {
            "would_allow"
        } else {
            "would_deny"
        };
        metrics
            .dry_run
            .get_or_create(&DryRunLabels { decision })
            .inc();
        tracing::info!(target: "access", path, src.addr = %src_ip, dst.addr = %dst,
            enforced = %d, dry_run = %shadow, "a dry-run policy would change this verdict (not enforced)");
    }
    if d.is_allowed() {
        Ok(FlowAuthz {
            src_ip,
            src_identity,
            dst_port,
            dst_ip,
            path,
            decided_with: mesh.clone(),
        })
    } else {
        Err(Denied::Policy(d))
    }
}

/// Deregisters its flow when dropped (the connection ended).
#[derive(Debug)]
pub struct FlowGuard {
    pod: Arc<PodShared>,
    id: u64,
}

impl Drop for FlowGuard {
    fn drop(&mut self) {
        self.pod.flows.remove(self.id);
    }
}

/// Registers a flow authorized against `pod`'s policies; `fds` are the
/// sockets a revocation resets (shared with the connection, not duplicated:
/// no extra descriptor or syscall per connection). Returns the guard that
/// deregisters the flow when the connection ends.
///
/// A mesh published between the decision and this registration is applied
/// here: `Proxy::set_mesh` publishes first and re-checks second, so a flow
/// either is in the table when the re-check runs, or sees the new mesh now.
pub fn register(
    pod: &Arc<PodShared>,
    fds: Vec<Arc<OwnedFd>>,
    authz: FlowAuthz,
    in_force: &InForce,
    metrics: &Metrics,
) -> FlowGuard {
    let decided_with = authz.decided_with.clone();
    let id = pod.flows.insert(authz, fds);
    let guard = FlowGuard {
        pod: pod.clone(),
        id,
    };
    if let Some(current) = in_force.mesh() {
        if !Arc::ptr_eq(&current, &decided_with) {
            recheck(&current, [pod], metrics);
        }
    }
    guard
}

/// Evaluates every open flow of `pods` against `mesh` and resets those it
/// denies. Returns how many were reset.
pub fn recheck<'a>(
    mesh: &Mesh,
    pods: impl IntoIterator<Item = &'a Arc<PodShared>>,
    metrics: &Metrics,
) -> usize {
    let mut revoked = 0;
    for pod in pods {
        // Gone from a control plane's mesh (removed, or its address now
        // contested): nothing may reach it any more.
        let workload = pod_workload(mesh, pod);
        let verdict = |a: &FlowAuthz| match &workload {
            None => Some("the pod's workload left the mesh".to_owned()),
            Some(w) => match &w.unsupported {
                Some(u) => Some(u.to_string()),
                None => {
                    let v = authz::evaluate(
                        mesh,
                        &ConnInfo {
                            src_ip: a.src_ip,
                            src_identity: a.src_identity.as_ref(),
                            dst_workload: w,
                            dst_ip: a.dst_ip,
                            dst_port: a.dst_port,
                        },
                    );
                    (!v.is_allowed()).then(|| v.to_string())
                }
            },
        };
        revoked += pod.flows.revoke(verdict, |a, verdict| {
            metrics
                .denials
                .get_or_create(&DenyLabels { path: "recheck" })
                .inc();
            tracing::event!(
                target: "access",
                tracing::Level::INFO,
                pod.uid = %pod.uid,
                src.addr = %a.src_ip,
                src.identity = a.src_identity.as_ref().map(|i| i.to_string()).unwrap_or_default(),
                dst.port = a.dst_port,
                path = a.path,
                reason = %verdict,
                "open connection denied by the new policy; reset"
            );
        });
    }
    revoked
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::RwLock;

    fn mesh() -> Mesh {
        ringway_config::MeshConfig::parse(
            "trustDomain: cluster.local\nworkloads:\n  - uid: uid-web\n    name: web\n    namespace: shop\n    serviceAccount: web\n    ips: [10.0.0.2]\n    node: n1\n    tunnel: true\n",
            "test",
        )
        .unwrap()
        .validate("test")
        .unwrap()
    }

    fn pod(ip: &str, namespace: &str, service_account: &str) -> PodShared {
        PodShared {
            uid: Arc::from("uid"),
            netns: std::fs::File::open("/dev/null").unwrap().into(),
            ips: vec![ip.parse().unwrap()],
            ports: crate::sock::PortSplit::default(),
            who: RwLock::new((
                crate::pod::PodIdentity {
                    name: "p".into(),
                    namespace: namespace.into(),
                    service_account: service_account.into(),
                },
                String::new(),
            )),
            flows: Default::default(),
            labels: Default::default(),
            spares: Default::default(),
            addresses_from_netns: Default::default(),
        }
    }

    /// The agent's info without a service account must never become
    /// `sa/default` (a DENY on the real account would miss the pod, an ALLOW
    /// for `default` would admit it): the mesh's record of the pod, when it
    /// agrees on the namespace, else no identity at all (no certificate, no
    /// HBONE).
    #[test]
    fn adversarial_proxy_never_guesses_a_pods_service_account() {
        let mesh = mesh();
        let id = |p: &PodShared| pod_identity(&mesh, p).map(|i| i.to_string());
        // No service account from the agent, no workload in the mesh: none.
        assert_eq!(id(&pod("10.0.0.9", "shop", "")), None);
        // No service account from the agent: the mesh's record of the pod.
        assert_eq!(
            id(&pod("10.0.0.2", "shop", "")).as_deref(),
            Some("spiffe://cluster.local/ns/shop/sa/web")
        );
        // ... but not when it names another namespace than the agent's.
        assert_eq!(id(&pod("10.0.0.2", "bank", "")), None);
        // The agent's full identity wins.
        assert_eq!(
            id(&pod("10.0.0.9", "shop", "cart")).as_deref(),
            Some("spiffe://cluster.local/ns/shop/sa/cart")
        );
    }

    /// An address outlives its pod: where a control plane feeds the mesh,
    /// the record of a deleted pod may still hold an address the cluster
    /// has given a new pod. The new pod must never be authorized, nor named,
    /// as the old one (another namespace's policies, other labels): only its
    /// own record counts, and until it comes the pod has no workload.
    #[test]
    fn adversarial_a_stale_record_of_a_pods_address_is_not_the_pod() {
        // The old pod, `open/old` at 10.0.0.2, and a policy of `secure`
        // that allows nothing: fed as a control plane feeds (incomplete).
        let mut edit = mesh().without_entries().edit();
        let old = Workload {
            uid: "cluster//Pod/open/old".into(),
            name: "old".into(),
            namespace: "open".into(),
            service_account: "old".into(),
            ips: vec!["10.0.0.2".parse().unwrap()],
            ..mesh()
                .workload_by_ip("10.0.0.2".parse().unwrap())
                .unwrap()
                .clone()
        };
        edit.upsert_workload(old.clone(), Default::default());
        let stale = edit.finish();
        assert!(!stale.is_complete());
        // The new pod `secure/new` on the same address, its service account
        // not sent by the agent.
        let mut new = pod("10.0.0.2", "secure", "");
        new.who.get_mut().unwrap().0.name = "new".into();
        assert!(
            pod_workload(&stale, &new).is_none(),
            "authorized as the stale record"
        );
        assert_eq!(
            pod_identity(&stale, &new),
            None,
            "named as the stale record"
        );
        // Same namespace, another pod's name: not this pod either.
        let mut same_ns = pod("10.0.0.2", "open", "");
        same_ns.who.get_mut().unwrap().0.name = "new".into();
        assert!(pod_workload(&stale, &same_ns).is_none());
        assert_eq!(pod_identity(&stale, &same_ns), None);
        // Its own record, once it comes, is.
        let mut edit = stale.edit();
        edit.remove_workload(&old.uid);
        edit.upsert_workload(
            Workload {
                uid: "cluster//Pod/secure/new".into(),
                name: "new".into(),
                namespace: "secure".into(),
                service_account: "new".into(),
                ..old.clone()
            },
            Default::default(),
        );
        let fresh = edit.finish();
        assert_eq!(pod_workload(&fresh, &new).unwrap().name, "new");
        assert_eq!(
            pod_identity(&fresh, &new).map(|i| i.to_string()).as_deref(),
            Some("spiffe://cluster.local/ns/secure/sa/new")
        );
    }

    /// A pod the agent names nowhere, its addresses read from its netns:
    /// the record its addresses name is its own only when they all name
    /// the same one. A pod that took another pod's address names two: no
    /// record, and none of its addresses confirmed (where a control plane
    /// feeds the mesh), so it is neither the fast path's target at that
    /// address nor a source from it.
    #[test]
    fn adversarial_an_unnamed_pods_netns_addresses_confirm_only_one_record() {
        let base = mesh();
        let mut edit = base.without_entries().edit();
        let own = base
            .workload_by_ip("10.0.0.2".parse().unwrap())
            .unwrap()
            .clone();
        let other = Workload {
            uid: "uid-bank".into(),
            name: "bank".into(),
            namespace: "bank".into(),
            ips: vec!["10.0.9.9".parse().unwrap()],
            ..own.clone()
        };
        edit.upsert_workload(own, Default::default());
        edit.upsert_workload(other, Default::default());
        let m = edit.finish();
        let unnamed = |ips: &[&str]| {
            let mut p = pod(ips[0], "", "");
            p.who.get_mut().unwrap().0.name = String::new();
            p.ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
            p.addresses_from_netns
                .store(true, std::sync::atomic::Ordering::Relaxed);
            p
        };
        let honest = unnamed(&["10.0.0.2"]);
        assert_eq!(honest.workload(&m).map(|w| w.name.as_str()), Some("web"));
        assert_eq!(
            honest.confirms_address(&m, "10.0.0.2".parse().unwrap()),
            Some(true)
        );
        let taker = unnamed(&["10.0.0.2", "10.0.9.9"]);
        assert!(taker.workload(&m).is_none());
        assert_eq!(
            taker.confirms_address(&m, "10.0.9.9".parse().unwrap()),
            Some(false)
        );
        assert_eq!(
            taker.confirms_address(&m, "10.0.0.2".parse().unwrap()),
            Some(false)
        );
        let early = unnamed(&["10.0.0.7"]);
        assert_eq!(
            early.confirms_address(&m, "10.0.0.7".parse().unwrap()),
            None
        );
    }

    /// A pod that has no service account (a static pod's mirror) has no
    /// identity: no certificate is asked for it and no tunnel carries it,
    /// never `sa/default`.
    #[test]
    fn adversarial_a_pod_without_a_service_account_has_no_identity() {
        let mesh = ringway_config::MeshConfig::parse(
            "trustDomain: cluster.local\nworkloads:\n  - {uid: uid-static, name: static, namespace: kube-system, serviceAccount: \"\", ips: [10.0.0.7], node: n1}\n",
            "test",
        )
        .unwrap()
        .validate("test")
        .unwrap();
        assert_eq!(
            pod_identity(&mesh, &pod("10.0.0.7", "kube-system", "")).map(|i| i.to_string()),
            None
        );
        // Nor can the file say it speaks HBONE.
        let e = ringway_config::MeshConfig::parse(
            "workloads:\n  - {uid: u, name: s, namespace: x, serviceAccount: \"\", ips: [10.0.0.8], node: n1, tunnel: true}\n",
            "test.yaml",
        )
        .unwrap()
        .validate("test.yaml")
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot speak HBONE"), "{e}");
    }

    /// A denial says why, in the words the access log and the 401 carry.
    #[test]
    fn denials_say_why() {
        let e = Denied::UnknownWorkload { uid: "u1".into() };
        assert_eq!(
            e.to_string(),
            "the control plane has not sent the workload of pod u1: refused, never authorized against a guess"
        );
        let e = Denied::Unsupported {
            namespace: "shop".into(),
            name: "web".into(),
            what: Unsupported::Waypoint("shop/wp".into()),
        };
        assert!(e.to_string().starts_with("workload shop/web: "), "{e}");
    }
}
