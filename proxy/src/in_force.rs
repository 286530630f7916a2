//! What is in force: the identity manager (HBONE's certificates) and the
//! mesh snapshot (workloads, services, policies), swapped together under
//! one lock and read once per connection; and the wait for a pod's workload
//! where a control plane feeds the mesh ([`InForce::mesh_knowing`]).
//!
//! Shared by the proxy (which publishes), the workers, the tunnel and the
//! policy re-checks; it names only the pod model.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ringway_config::Mesh;
use ringway_identity::IdentityManager;

use crate::pod::PodShared;

/// The identity manager and the mesh in force (either may be unset).
type Current = (Option<Arc<IdentityManager>>, Option<Arc<Mesh>>);

/// The identity manager and the mesh in force, both swappable.
#[derive(Debug)]
pub struct InForce {
    /// The identity manager and the mesh, swapped together under one lock
    /// (read once per connection).
    current: RwLock<Current>,
    /// Woken at every new mesh: connections waiting for their pod's
    /// workload look again ([`InForce::mesh_knowing`]).
    mesh_changed: tokio::sync::Notify,
    /// How long they wait (`proxy.workloadWait`).
    workload_wait: Duration,
}

/// A pod's connection came while the mesh (fed by a control plane) did not
/// know the pod's workload, and it did not arrive in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownWorkload {
    /// How long the connection waited.
    pub waited: Duration,
}

impl std::fmt::Display for UnknownWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the control plane has not sent the pod's workload (waited {:?})",
            self.waited
        )
    }
}

impl InForce {
    /// Nothing in force yet (HBONE off, no mesh); connections of a pod whose
    /// workload a control plane has not sent wait up to `workload_wait`.
    pub fn new(workload_wait: Duration) -> Self {
        InForce {
            current: RwLock::new((None, None)),
            mesh_changed: tokio::sync::Notify::new(),
            workload_wait,
        }
    }

    /// Sets (or clears) the identity manager.
    pub fn set_identity(&self, ids: Option<Arc<IdentityManager>>) {
        self.current.write().unwrap_or_else(|p| p.into_inner()).0 = ids;
    }

    /// Publishes a new mesh snapshot (hot reload); open connections keep theirs.
    pub fn set_mesh(&self, mesh: Arc<Mesh>) {
        self.current.write().unwrap_or_else(|p| p.into_inner()).1 = Some(mesh);
        self.mesh_changed.notify_waiters();
    }

    /// The mesh to serve a connection of `pod` under: the one in force when
    /// it knows the pod's workload (or is the whole mesh, or there is none),
    /// else the first one that does within `proxy.workloadWait`. `Err` when
    /// none did: the caller refuses the connection.
    pub async fn mesh_knowing(
        &self,
        pod: &PodShared,
    ) -> Result<Option<Arc<Mesh>>, UnknownWorkload> {
        self.mesh_where(|m| pod.workload(m).is_some()).await
    }

    /// The mesh in force when it is the whole mesh, there is none, or
    /// `knows` says it has what the caller needs; else the first that does
    /// within `proxy.workloadWait`. `Err` when none did.
    pub async fn mesh_where(
        &self,
        knows: impl Fn(&Mesh) -> bool,
    ) -> Result<Option<Arc<Mesh>>, UnknownWorkload> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.workload_wait;
        loop {
            // Registered before looking, so a mesh published in between
            // still wakes it.
            let changed = self.mesh_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mesh = self.mesh();
            match &mesh {
                None => return Ok(None),
                Some(m) if m.is_complete() || knows(m) => return Ok(mesh),
                Some(_) => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(UnknownWorkload {
                    waited: started.elapsed(),
                });
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The identity manager, when HBONE is configured.
    pub fn identity(&self) -> Option<Arc<IdentityManager>> {
        self.read().0.clone()
    }

    /// The current mesh snapshot.
    pub fn mesh(&self) -> Option<Arc<Mesh>> {
        self.read().1.clone()
    }

    /// Both, when HBONE is on.
    pub fn enabled(&self) -> Option<(Arc<IdentityManager>, Arc<Mesh>)> {
        let cur = self.read();
        Some((cur.0.clone()?, cur.1.clone()?))
    }
}
