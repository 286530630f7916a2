//! Authorized inbound flows, kept per destination pod so that a policy
//! change can re-check the connections already open.
//!
//! Every connection that was authorized against a pod's policies (plaintext
//! inbound, same-node fast path, each HBONE stream) registers what the
//! decision was made on (source address, verified identity, destination
//! port) and a shared handle of the sockets to reset. When a new mesh is
//! published, [`recheck`] evaluates them again on the control thread and
//! resets the ones the new policies deny; the datapath notices the reset on
//! its next wake-up and tears the connection down as for any peer reset.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ringway_config::authz::{self, ConnInfo, Identity};
use ringway_config::Mesh;

use crate::metrics::{DenyLabels, Metrics};
use crate::sys;
use crate::tunnel::TunnelState;
use crate::worker::PodShared;

/// What an authorization decision was made on.
#[derive(Debug, Clone)]
pub struct FlowAuthz {
    /// The client's address as the policy saw it.
    pub src_ip: IpAddr,
    /// The verified client identity (`None` for plaintext).
    pub src_identity: Option<Identity>,
    /// The destination port on the pod.
    pub dst_port: u16,
    /// The pod's address the connection was made to.
    pub dst_ip: IpAddr,
    /// `plaintext`, `local` (same-node fast path) or `hbone`.
    pub path: &'static str,
    /// The mesh snapshot the decision was made with.
    pub decided_with: Arc<Mesh>,
}

#[derive(Debug)]
struct Flow {
    authz: FlowAuthz,
    /// The sockets whose reset ends the flow.
    fds: Vec<Arc<OwnedFd>>,
    /// Already reset by a re-check (not reset twice, not counted twice).
    revoked: bool,
}

/// A pod's authorized flows.
#[derive(Debug, Default)]
pub struct FlowTable {
    next: AtomicU64,
    flows: Mutex<HashMap<u64, Flow>>,
}

impl FlowTable {
    /// Open flows (for tests and the config dump).
    pub fn len(&self) -> usize {
        self.flows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no flow is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        self.pod
            .flows
            .flows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// Registers a flow authorized against `pod`'s policies; `fds` are the
/// sockets a revocation resets (shared with the connection, not duplicated:
/// no extra descriptor or syscall per connection). Returns the guard that
/// deregisters the flow when the connection ends.
///
/// A mesh published between the decision and this registration is applied
/// here: [`crate::Proxy::set_mesh`] publishes first and re-checks second, so
/// a flow either is in the table when the re-check runs, or sees the new
/// mesh now.
pub fn register(
    pod: &Arc<PodShared>,
    fds: Vec<Arc<OwnedFd>>,
    authz: FlowAuthz,
    state: &TunnelState,
) -> FlowGuard {
    let decided_with = authz.decided_with.clone();
    let id = pod.flows.next.fetch_add(1, Ordering::Relaxed);
    pod.flows
        .flows
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(
            id,
            Flow {
                authz,
                fds,
                revoked: false,
            },
        );
    let guard = FlowGuard {
        pod: pod.clone(),
        id,
    };
    if let Some(current) = state.mesh() {
        if !Arc::ptr_eq(&current, &decided_with) {
            recheck(&current, [pod], &state.metrics);
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
        let workload = crate::tunnel::pod_workload(mesh, pod);
        let mut flows = pod.flows.flows.lock().unwrap_or_else(|p| p.into_inner());
        for flow in flows.values_mut().filter(|f| !f.revoked) {
            let a = &flow.authz;
            let refused = match &workload {
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
            let Some(verdict) = refused else {
                continue;
            };
            for fd in &flow.fds {
                sys::tcp_abort(fd.as_fd());
            }
            flow.revoked = true;
            revoked += 1;
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
        }
    }
    revoked
}
