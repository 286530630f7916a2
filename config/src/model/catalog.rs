//! The workloads, services and policies of a [`crate::Mesh`] snapshot and
//! their lookup indexes, in persistent maps (`imbl`).
//!
//! A snapshot derived from another shares every entry and every index node
//! it did not change: applying an update costs in proportion to what it
//! touches (O(log n) per entry), never to the size of the mesh, and the
//! snapshot the workers still hold stays valid and unchanged. The file and
//! the Kubernetes source fill one from scratch with the same operations the
//! control plane's incremental pushes use ([`crate::MeshEdit`]).
//!
//! **Addresses.** An address that exactly one workload (or one service, as a
//! VIP) claims resolves to it. An address that two entries claim is
//! *contested*: it resolves to nothing until all but one let it go, so
//! traffic to or from it is treated as traffic of an unknown address, never
//! given to whichever entry came last. A control plane's resource that was
//! refused claims its addresses too ([`Claimant::Refused`]): they resolve
//! to nothing while it is refused, and its traffic is refused, never taken
//! for traffic outside the mesh.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use imbl::{HashMap, OrdMap, OrdSet};

use super::policy::AuthorizationPolicy;
use super::workload::{Service, Workload};

/// A name in the catalog: a workload's uid, a service's
/// `namespace/hostname`, a policy's `namespace/name`.
pub(crate) type Key = Arc<str>;

/// Who claims an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Claimant {
    /// A workload, by uid.
    Workload(Arc<str>),
    /// A service's VIP, by `namespace/hostname`.
    Service(Arc<str>),
    /// A control plane's resource, by name, that was refused while it
    /// claims the address (no copy of it is held): the address is the
    /// mesh's, but nothing may be done with it.
    Refused(Arc<str>),
}

impl std::fmt::Display for Claimant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Claimant::Workload(uid) => write!(f, "workload {uid}"),
            Claimant::Service(key) => write!(f, "service {key}"),
            Claimant::Refused(name) => write!(f, "refused resource {name}"),
        }
    }
}

/// Service port -> target port of one endpoint, where it differs from its
/// service's (empty: the service's ports).
pub type EndpointPorts = Arc<BTreeMap<u16, u16>>;

/// A policy's place in the order policies are evaluated and listed: the
/// file's order (`seq`), then the name.
pub(crate) type PolicyKey = (u32, Key);

#[derive(Debug, Clone, Default)]
pub(crate) struct Catalog {
    workloads: OrdMap<Key, Arc<Workload>>,
    services: OrdMap<Key, Arc<Service>>,
    /// Every claim on an address (usually one).
    addresses: HashMap<IpAddr, Arc<[Claimant]>>,
    /// Service -> its endpoints and their port overrides.
    endpoints: HashMap<Key, OrdMap<Key, EndpointPorts>>,
    /// Workload -> the services it is an endpoint of.
    memberships: HashMap<Key, OrdSet<Key>>,
    policies: OrdMap<PolicyKey, Arc<AuthorizationPolicy>>,
    policy_keys: HashMap<Key, PolicyKey>,
    mesh_wide: OrdMap<PolicyKey, Arc<AuthorizationPolicy>>,
    by_namespace: HashMap<String, OrdMap<PolicyKey, Arc<AuthorizationPolicy>>>,
    /// Policies that apply only to the workloads that name them.
    listed: HashMap<Key, Arc<AuthorizationPolicy>>,
}

impl Catalog {
    pub(crate) fn workload(&self, uid: &str) -> Option<&Arc<Workload>> {
        self.workloads.get(uid)
    }

    pub(crate) fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    pub(crate) fn workload_count(&self) -> usize {
        self.workloads.len()
    }

    pub(crate) fn service(&self, key: &str) -> Option<&Arc<Service>> {
        self.services.get(key)
    }

    pub(crate) fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    pub(crate) fn service_count(&self) -> usize {
        self.services.len()
    }

    /// The one entry that claims `ip`; `None` when none or several do.
    pub(crate) fn owner(&self, ip: IpAddr) -> Option<&Claimant> {
        match self.addresses.get(&ip).map(|c| &c[..]) {
            Some([one]) => Some(one),
            _ => None,
        }
    }

    /// Every entry that claims `ip`.
    pub(crate) fn claimants(&self, ip: IpAddr) -> &[Claimant] {
        self.addresses.get(&ip).map(|c| &c[..]).unwrap_or_default()
    }

    pub(crate) fn workload_by_ip(&self, ip: IpAddr) -> Option<&Arc<Workload>> {
        match self.owner(ip)? {
            Claimant::Workload(uid) => self.workloads.get(uid),
            Claimant::Service(_) | Claimant::Refused(_) => None,
        }
    }

    pub(crate) fn service_by_vip(&self, ip: IpAddr) -> Option<&Arc<Service>> {
        match self.owner(ip)? {
            Claimant::Service(key) => self.services.get(key),
            Claimant::Workload(_) | Claimant::Refused(_) => None,
        }
    }

    /// Addresses claimed by more than one entry, with their claimants.
    pub(crate) fn contested(&self) -> impl Iterator<Item = (IpAddr, &[Claimant])> {
        self.addresses
            .iter()
            .filter(|(_, c)| c.len() > 1)
            .map(|(ip, c)| (*ip, &c[..]))
    }

    /// The endpoints of the service `key` (uids that may not all exist).
    pub(crate) fn endpoints(&self, key: &str) -> impl Iterator<Item = (&Key, &EndpointPorts)> {
        self.endpoints.get(key).into_iter().flat_map(|m| m.iter())
    }

    /// The services (keys) `uid` is an endpoint of.
    pub(crate) fn memberships(&self, uid: &str) -> impl Iterator<Item = &Key> {
        self.memberships.get(uid).into_iter().flat_map(|s| s.iter())
    }

    pub(crate) fn policies(&self) -> impl Iterator<Item = &Arc<AuthorizationPolicy>> {
        self.policies.values()
    }

    pub(crate) fn policy_count(&self) -> usize {
        self.policies.len()
    }

    pub(crate) fn policy(&self, name: &str) -> Option<&Arc<AuthorizationPolicy>> {
        self.policy_keys
            .get(name)
            .and_then(|k| self.policies.get(k))
    }

    pub(crate) fn mesh_wide_policies(&self) -> impl Iterator<Item = &Arc<AuthorizationPolicy>> {
        self.mesh_wide.values()
    }

    pub(crate) fn namespace_policies(
        &self,
        namespace: &str,
    ) -> impl Iterator<Item = &Arc<AuthorizationPolicy>> {
        self.by_namespace
            .get(namespace)
            .into_iter()
            .flat_map(|m| m.values())
    }

    pub(crate) fn listed_policy(&self, name: &str) -> Option<&Arc<AuthorizationPolicy>> {
        self.listed.get(name)
    }

    // ---- changes ----

    fn claim(&mut self, ip: IpAddr, who: Claimant) {
        let next: Arc<[Claimant]> = match self.addresses.get(&ip) {
            None => Arc::new([who]),
            Some(have) if have.contains(&who) => return,
            Some(have) => {
                let mut v: Vec<Claimant> = have.to_vec();
                v.push(who);
                v.sort();
                v.into()
            }
        };
        self.addresses.insert(ip, next);
    }

    fn release(&mut self, ip: IpAddr, who: &Claimant) {
        let Some(have) = self.addresses.get(&ip) else {
            return;
        };
        let rest: Vec<Claimant> = have.iter().filter(|c| *c != who).cloned().collect();
        if rest.is_empty() {
            self.addresses.remove(&ip);
        } else if rest.len() != have.len() {
            self.addresses.insert(ip, rest.into());
        }
    }

    /// Adds or replaces the workload `w.uid` (its addresses name it unless
    /// it shares its node's network); returns the one it replaced.
    pub(crate) fn upsert_workload(&mut self, w: Workload) -> Option<Arc<Workload>> {
        let uid: Key = Arc::from(w.uid.as_str());
        let who = Claimant::Workload(uid.clone());
        let new = Arc::new(w);
        let old = self.workloads.insert(uid, new.clone());
        if let Some(old) = &old {
            for ip in claimed(old) {
                if !claimed(&new).contains(ip) {
                    self.release(*ip, &who);
                }
            }
        }
        for ip in claimed(&new) {
            self.claim(*ip, who.clone());
        }
        old
    }

    /// Removes the workload `uid` and its endpoint memberships.
    pub(crate) fn remove_workload(&mut self, uid: &str) -> Option<Arc<Workload>> {
        let old = self.workloads.remove(uid)?;
        let who = Claimant::Workload(Arc::from(uid));
        for ip in claimed(&old) {
            self.release(*ip, &who);
        }
        self.set_memberships(uid, BTreeMap::new());
        Some(old)
    }

    /// Makes `uid` an endpoint of exactly the services in `services` (keys),
    /// with their port overrides.
    pub(crate) fn set_memberships(&mut self, uid: &str, services: BTreeMap<Key, EndpointPorts>) {
        let uid: Key = Arc::from(uid);
        let before: Vec<Key> = self.memberships(&uid).cloned().collect();
        for svc in &before {
            if !services.contains_key(svc) {
                if let Some(eps) = self.endpoints.get_mut(svc) {
                    eps.remove(&uid);
                    if eps.is_empty() {
                        self.endpoints.remove(svc);
                    }
                }
            }
        }
        for (svc, ports) in &services {
            let eps = self.endpoints.entry(svc.clone()).or_default();
            if eps.get(&uid) != Some(ports) {
                eps.insert(uid.clone(), ports.clone());
            }
        }
        if services.is_empty() {
            self.memberships.remove(&uid);
        } else if before.len() != services.len() || before.iter().any(|s| !services.contains_key(s))
        {
            self.memberships
                .insert(uid, services.into_keys().collect::<OrdSet<Key>>());
        }
    }

    /// Adds or replaces the service `key`; returns the one it replaced.
    pub(crate) fn upsert_service(&mut self, key: Key, s: Service) -> Option<Arc<Service>> {
        let who = Claimant::Service(key.clone());
        let new = Arc::new(s);
        let old = self.services.insert(key, new.clone());
        if let Some(old) = &old {
            for ip in &old.vips {
                if !new.vips.contains(ip) {
                    self.release(*ip, &who);
                }
            }
        }
        for ip in &new.vips {
            self.claim(*ip, who.clone());
        }
        old
    }

    /// Removes the service `key` (its endpoints' memberships stay: they are
    /// the workloads' own statements and apply again if it comes back).
    pub(crate) fn remove_service(&mut self, key: &str) -> Option<Arc<Service>> {
        let old = self.services.remove(key)?;
        let who = Claimant::Service(Arc::from(key));
        for ip in &old.vips {
            self.release(*ip, &who);
        }
        Some(old)
    }

    /// Makes `name` a refused claimant of exactly `ips` (none: it claims
    /// nothing).
    pub(crate) fn set_refused(&mut self, name: &str, before: &[IpAddr], ips: &[IpAddr]) {
        let who = Claimant::Refused(Arc::from(name));
        for ip in before {
            if !ips.contains(ip) {
                self.release(*ip, &who);
            }
        }
        for ip in ips {
            self.claim(*ip, who.clone());
        }
    }

    /// Adds or replaces a policy (by its qualified name), at `seq` in the
    /// evaluation order.
    pub(crate) fn upsert_policy(&mut self, seq: u32, p: AuthorizationPolicy) {
        let name = p.qualified_name().clone();
        self.remove_policy(&name);
        let key: PolicyKey = (seq, name.clone());
        let p = Arc::new(p);
        if p.listed {
            self.listed.insert(name.clone(), p.clone());
        } else if p.mesh_wide {
            self.mesh_wide.insert(key.clone(), p.clone());
        } else {
            self.by_namespace
                .entry(p.namespace.clone())
                .or_default()
                .insert(key.clone(), p.clone());
        }
        self.policy_keys.insert(name, key.clone());
        self.policies.insert(key, p);
    }

    /// Removes the policy named `name` (`namespace/name`).
    pub(crate) fn remove_policy(&mut self, name: &str) -> Option<Arc<AuthorizationPolicy>> {
        let key = self.policy_keys.remove(name)?;
        let old = self.policies.remove(&key)?;
        if old.listed {
            self.listed.remove(name);
        } else if old.mesh_wide {
            self.mesh_wide.remove(&key);
        } else if let Some(ns) = self.by_namespace.get_mut(&old.namespace) {
            ns.remove(&key);
            if ns.is_empty() {
                self.by_namespace.remove(&old.namespace);
            }
        }
        Some(old)
    }
}

#[cfg(test)]
mod tests;

/// The addresses that name `w`: none for a pod on its node's network (they
/// are the node's, shared by every such pod).
fn claimed(w: &Workload) -> &[IpAddr] {
    if w.host_network {
        &[]
    } else {
        &w.ips
    }
}
