//! A pod's metrics labels as they were last made, and every name they had:
//! kept so a connection clones an `Arc` instead of building ~20 strings,
//! and so the pod's series can be dropped under each name when it goes.

use std::sync::{Arc, Weak};

use ringway_config::Mesh;

use crate::metrics::Peer;

/// A pod's metrics labels as they are now, and every name it had.
#[derive(Debug, Default)]
pub struct PodLabels {
    /// The labels and the mesh they were made under (`None` inside: no
    /// mesh); `None`: not made yet.
    current: Option<(Option<Weak<Mesh>>, Arc<Peer>)>,
    /// Every (namespace, workload) the pod was labelled under
    /// ([`Peer::owner`]): its series are dropped under exactly these when
    /// it goes.
    names: Vec<(String, String)>,
}

impl PodLabels {
    /// The labels last made, if they were made under `mesh`.
    pub fn made_under(&self, mesh: Option<&Arc<Mesh>>) -> Option<Arc<Peer>> {
        match &self.current {
            Some((made, peer)) if same_mesh(made.as_ref(), mesh) => Some(peer.clone()),
            _ => None,
        }
    }

    /// Keeps `peer`, made under `mesh`, as the labels now, and remembers its
    /// name; unchanged labels keep their `Arc` (so cached series stay hits).
    pub fn keep(&mut self, mesh: Option<&Arc<Mesh>>, peer: Peer) -> Arc<Peer> {
        let owner = peer.owner();
        if !self.names.contains(&owner) {
            self.names.push(owner);
        }
        let peer = match &self.current {
            // Unchanged: the same `Arc`, so cached series stay hits.
            Some((_, old)) if **old == peer => old.clone(),
            _ => Arc::new(peer),
        };
        self.current = Some((mesh.map(Arc::downgrade), peer.clone()));
        peer
    }

    /// Every (namespace, workload) the labels have named.
    pub fn names(&self) -> Vec<(String, String)> {
        self.names.clone()
    }
}

/// Whether labels made under `made` hold under `now`.
fn same_mesh(made: Option<&Weak<Mesh>>, now: Option<&Arc<Mesh>>) -> bool {
    match (made, now) {
        (None, None) => true,
        // The `Weak` keeps the address from being reused while held.
        (Some(w), Some(m)) => std::ptr::eq(w.as_ptr(), Arc::as_ptr(m)),
        _ => false,
    }
}
