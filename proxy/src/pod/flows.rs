//! A pod's table of authorized flows: each connection authorized against
//! the pod's policies, with what the decision was made on and the sockets
//! whose reset ends it. What goes in, and what a policy change revokes, is
//! `policy`'s (`policy::register`, `policy::recheck`); this is the table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ringway_config::authz::Identity;
use ringway_config::Mesh;

use crate::sys;

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

/// Flows a pod's table keeps room for whatever its past bursts.
const FLOW_TABLE_KEEP: usize = 64;

/// A pod's authorized flows.
#[derive(Debug, Default)]
pub struct FlowTable {
    next: AtomicU64,
    flows: Mutex<HashMap<u64, Flow>>,
}

impl FlowTable {
    /// Open flows (for tests and the config dump).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no flow is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Flow>> {
        self.flows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a flow; `fds` are the sockets a revocation resets (shared with
    /// the connection, not duplicated). Returns its id, for [`FlowTable::remove`].
    pub fn insert(&self, authz: FlowAuthz, fds: Vec<Arc<OwnedFd>>) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(
            id,
            Flow {
                authz,
                fds,
                revoked: false,
            },
        );
        id
    }

    /// Removes a flow (its connection ended). A table emptied to a quarter
    /// of its capacity after a burst is shrunk to twice what it holds (never
    /// below [`FLOW_TABLE_KEEP`]): its memory goes back once the burst is
    /// over, and the amortized cost per removal stays constant.
    pub fn remove(&self, id: u64) {
        let mut flows = self.lock();
        flows.remove(&id);
        if flows.capacity() > FLOW_TABLE_KEEP && flows.len() < flows.capacity() / 4 {
            let keep = (flows.len() * 2).max(FLOW_TABLE_KEEP);
            flows.shrink_to(keep);
        }
    }

    /// The table's capacity now.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.lock().capacity()
    }

    /// Revokes every flow not revoked yet that `verdict` refuses (a reason):
    /// resets its sockets, marks it, and tells `revoked` (its authorization
    /// and the reason), all under the table's lock. Returns how many.
    pub fn revoke(
        &self,
        mut verdict: impl FnMut(&FlowAuthz) -> Option<String>,
        mut revoked: impl FnMut(&FlowAuthz, &str),
    ) -> usize {
        let mut n = 0;
        let mut flows = self.lock();
        for flow in flows.values_mut().filter(|f| !f.revoked) {
            let Some(reason) = verdict(&flow.authz) else {
                continue;
            };
            for fd in &flow.fds {
                sys::tcp_abort(fd.as_fd());
            }
            flow.revoked = true;
            n += 1;
            revoked(&flow.authz, &reason);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn authz() -> FlowAuthz {
        let mesh = ringway_config::MeshConfig::parse("trustDomain: cluster.local\n", "test")
            .expect("parse")
            .validate("test")
            .expect("valid");
        FlowAuthz {
            src_ip: "10.0.0.1".parse().expect("ip"),
            src_identity: None,
            dst_port: 80,
            dst_ip: "10.0.0.2".parse().expect("ip"),
            path: "plaintext",
            decided_with: Arc::new(mesh),
        }
    }

    /// After a burst of flows ends, the table gives its room back (down to
    /// twice what it still holds, at least FLOW_TABLE_KEEP), and the flows
    /// still open stay in it.
    #[test]
    fn a_table_shrinks_after_a_burst_and_keeps_its_open_flows() {
        let table = FlowTable::default();
        let a = authz();
        let ids: Vec<u64> = (0..4_000)
            .map(|_| table.insert(a.clone(), Vec::new()))
            .collect();
        assert!(table.capacity() >= 4_000);
        for id in &ids[3..] {
            table.remove(*id);
        }
        assert_eq!(table.len(), 3);
        assert!(
            table.capacity() <= 4 * FLOW_TABLE_KEEP,
            "capacity {} after the burst",
            table.capacity()
        );
        let kept = table.lock();
        assert!(ids[..3].iter().all(|id| kept.contains_key(id)));
    }
}
