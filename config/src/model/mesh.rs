//! The validated, immutable mesh snapshot the proxy looks things up in
//! ([`Mesh`]), and its incremental edits ([`MeshEdit`]).

#[cfg(feature = "kube")]
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use super::catalog::{Catalog, Claimant, EndpointPorts};
use super::policy::{
    labels_match, Action, AuthorizationPolicy, ClusterPolicyNote, MtlsMode, PeerAuthentication,
};
use super::workload::{LbMode, Locality, Scope, Service, Unsupported, Workload};
use crate::settings::ProxySettings;

/// An environment variable's override that was applied: which variable set
/// which field to what (the `env` layer reads them; the snapshot keeps them
/// for its summary and to blame a bad value on its variable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvOverride {
    /// The variable.
    pub var: &'static str,
    /// The field path it replaced.
    pub field: &'static str,
    /// The value as given (trimmed).
    pub value: String,
}

/// Paths of the CA files (never their content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPaths {
    /// CA certificate.
    pub cert_file: PathBuf,
    /// CA private key.
    pub key_file: PathBuf,
    /// Extra trusted roots.
    pub bundle_files: Vec<PathBuf>,
}

/// A certificate service to get workload certificates from (`ca.address`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaService {
    /// `host:port`.
    pub address: String,
    /// The name its serving certificate must be valid for.
    pub server_name: String,
    /// The mesh root (PEM).
    pub root_cert_file: PathBuf,
    /// The proxy's token (read per request).
    pub token_file: PathBuf,
    /// Extra trusted roots.
    pub bundle_files: Vec<PathBuf>,
}

/// The token a node proxy presents to the certificate service by default
/// (the reference's projected token path).
pub const DEFAULT_CA_TOKEN_FILE: &str = "/var/run/secrets/tokens/istio-token";

/// An immutable, validated configuration with lookup indexes. Build one
/// with [`crate::MeshConfig::load`] or [`crate::MeshConfig::validate`];
/// share it as `Arc<Mesh>`; derive the next one with [`Mesh::edit`].
#[derive(Debug, Clone)]
pub struct Mesh {
    pub(crate) proxy: ProxySettings,
    pub(crate) trust_domain: String,
    pub(crate) root_namespace: String,
    pub(crate) ca: Option<CaPaths>,
    pub(crate) ca_service: Option<CaService>,
    pub(crate) catalog: Catalog,
    /// Whether every workload of the mesh is in it (the file is the whole
    /// mesh), or workloads may still be on their way (a control plane).
    pub(crate) complete: bool,
    pub(crate) peer_authentications: Vec<PeerAuthentication>,
    pub(crate) cluster_policy_notes: Vec<ClusterPolicyNote>,
    pub(crate) cluster_id: String,
    pub(crate) locality: Locality,
    pub(crate) origin: String,
    pub(crate) revision: u64,
    pub(crate) env_overrides: Vec<EnvOverride>,
    /// What the snapshot was validated from, for a layer above that
    /// rebuilds it with more entries: the configuration file (environment
    /// overrides applied), into which the Kubernetes source merges cluster
    /// objects; for a merged snapshot, the file's part only. The model never
    /// looks inside (see [`Mesh::source`]).
    #[cfg(feature = "kube")]
    pub(crate) source: Option<Arc<dyn Any + Send + Sync>>,
}

impl Mesh {
    /// Keeps `source`, what this snapshot was validated from (only with the
    /// `kube` feature, whose source rebuilds snapshots from it).
    #[cfg(feature = "kube")]
    pub(crate) fn with_source<T: Any + Send + Sync>(mut self, source: impl FnOnce() -> T) -> Mesh {
        self.source = Some(Arc::new(source()));
        self
    }

    /// Without the `kube` feature nothing needs the source.
    #[cfg(not(feature = "kube"))]
    pub(crate) fn with_source<T>(self, _source: impl FnOnce() -> T) -> Mesh {
        self
    }

    /// Keeps `source`, already shared.
    #[cfg(feature = "kube")]
    pub(crate) fn set_source<T: Any + Send + Sync>(&mut self, source: Arc<T>) {
        self.source = Some(source);
    }

    /// What this snapshot was validated from, when it is a `T`.
    #[cfg(feature = "kube")]
    pub(crate) fn source<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        self.source.clone()?.downcast().ok()
    }

    /// Datapath settings.
    pub fn proxy(&self) -> &ProxySettings {
        &self.proxy
    }

    /// SPIFFE trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// Namespace whose policies apply mesh-wide.
    pub fn root_namespace(&self) -> &str {
        &self.root_namespace
    }

    /// CA files, when HBONE is configured with a local CA key.
    pub fn ca(&self) -> Option<&CaPaths> {
        self.ca.as_ref()
    }

    /// The certificate service, when HBONE is configured with one.
    pub fn ca_service(&self) -> Option<&CaService> {
        self.ca_service.as_ref()
    }

    /// Every workload, by uid.
    pub fn workloads(&self) -> impl Iterator<Item = &Workload> {
        self.catalog.workloads().map(|w| &**w)
    }

    /// How many workloads there are.
    pub fn workload_count(&self) -> usize {
        self.catalog.workload_count()
    }

    /// Every service, by `namespace/hostname`.
    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.catalog.services()
    }

    /// How many services there are.
    pub fn service_count(&self) -> usize {
        self.catalog.service_count()
    }

    /// The service `namespace/hostname`.
    pub fn service(&self, key: &str) -> Option<&Arc<Service>> {
        self.catalog.service(key)
    }

    /// Every policy, in evaluation order (the file's order, then by name).
    pub fn policies(&self) -> impl Iterator<Item = &AuthorizationPolicy> {
        self.catalog.policies().map(|p| &**p)
    }

    /// How many policies there are.
    pub fn policy_count(&self) -> usize {
        self.catalog.policy_count()
    }

    /// The policy `namespace/name`.
    pub fn policy(&self, name: &str) -> Option<&AuthorizationPolicy> {
        self.catalog.policy(name).map(|p| &**p)
    }

    /// The cluster policy objects left out, or mapped with a part changed,
    /// each with why (empty without the Kubernetes source).
    pub fn cluster_policy_notes(&self) -> &[ClusterPolicyNote] {
        &self.cluster_policy_notes
    }

    /// Every mutual-TLS requirement (from the cluster's PeerAuthentications).
    pub fn peer_authentications(&self) -> &[PeerAuthentication] {
        &self.peer_authentications
    }

    /// The mutual-TLS mode of connections to `workload`'s `port`, and the
    /// PeerAuthentication that decided it: the most specific one applies (a
    /// selector's in the workload's namespace, else the namespace's, else the
    /// mesh-wide one), its `portLevelMtls` before its `mode`; `UNSET` falls
    /// back to the next scope; nothing set: PERMISSIVE.
    pub fn mtls_mode(
        &self,
        workload: &Workload,
        port: u16,
    ) -> (MtlsMode, Option<&PeerAuthentication>) {
        let pas = &self.peer_authentications;
        let selected = pas.iter().find(|p| {
            !p.mesh_wide
                && p.match_labels.is_some()
                && p.namespace == workload.namespace
                && labels_match(p.match_labels.as_ref(), workload)
        });
        let namespace = pas.iter().find(|p| {
            !p.mesh_wide && p.match_labels.is_none() && p.namespace == workload.namespace
        });
        let mesh = pas.iter().find(|p| p.mesh_wide);
        for pa in [selected, namespace, mesh].into_iter().flatten() {
            let mode = pa.port_mode(port);
            if mode != MtlsMode::Unset {
                return (mode, Some(pa));
            }
        }
        (MtlsMode::Permissive, None)
    }

    /// The workload that owns `ip` (IPv4-mapped IPv6 counts as IPv4); `None`
    /// when no workload, or more than one entry, claims it.
    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<&Workload> {
        self.catalog.workload_by_ip(ip.to_canonical()).map(|w| &**w)
    }

    /// The workload with `uid`.
    pub fn workload_by_uid(&self, uid: &str) -> Option<&Workload> {
        self.catalog.workload(uid).map(|w| &**w)
    }

    /// The service whose virtual IP is `vip` (`None` when the address is
    /// contested).
    pub fn service_by_vip(&self, vip: IpAddr) -> Option<&Arc<Service>> {
        self.catalog.service_by_vip(vip.to_canonical())
    }

    /// Everything that claims `ip`: one entry normally; more when the
    /// address is contested (then it resolves to nothing).
    pub fn address_claimants(&self, ip: IpAddr) -> &[Claimant] {
        self.catalog.claimants(ip.to_canonical())
    }

    /// The refused resource (by name) that claims `ip`, if one does: the
    /// address is the mesh's but resolves to nothing, so traffic to it is
    /// refused, never sent as if it were outside the mesh.
    pub fn refused_claim(&self, ip: IpAddr) -> Option<&str> {
        self.address_claimants(ip).iter().find_map(|c| match c {
            Claimant::Refused(name) => Some(&**name),
            _ => None,
        })
    }

    /// The contested addresses and who claims each.
    pub fn contested_addresses(&self) -> impl Iterator<Item = (IpAddr, &[Claimant])> {
        self.catalog.contested()
    }

    /// The services `uid` is an endpoint of, by `namespace/hostname`.
    pub fn services_of<'a>(&'a self, uid: &str) -> impl Iterator<Item = &'a Arc<Service>> {
        self.catalog
            .memberships(uid)
            .filter_map(|k| self.catalog.service(k))
    }

    /// Whether every workload is in this snapshot (the configuration file
    /// is the whole mesh). `false` when a control plane feeds it: a pod
    /// whose workload is not here yet may only be waiting for it, and its
    /// traffic must wait too, never be served under a guess
    /// (`proxy.workloadWait`).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// Whether `other` has the same workloads, services (with their
    /// endpoints), policies and PeerAuthentications.
    pub fn same_entries(&self, other: &Mesh) -> bool {
        let eps = |m: &Mesh, s: &Service| -> Vec<(String, EndpointPorts)> {
            m.endpoints(s)
                .map(|(w, p)| (w.uid.clone(), p.clone()))
                .collect()
        };
        self.workloads().eq(other.workloads())
            && self
                .services()
                .map(|s| &**s)
                .eq(other.services().map(|s| &**s))
            && self.services().all(|s| eps(self, s) == eps(other, s))
            && self.policies().eq(other.policies())
            && self.peer_authentications == other.peer_authentications
    }

    /// A snapshot to change: its entries and indexes are shared with this
    /// one until changed, so an edit costs what it touches.
    pub fn edit(&self) -> MeshEdit {
        MeshEdit { mesh: self.clone() }
    }

    /// This snapshot's settings with no workload, service or policy, and
    /// not complete: what a control plane starts filling.
    pub fn without_entries(&self) -> Mesh {
        Mesh {
            catalog: Catalog::default(),
            complete: false,
            peer_authentications: Vec::new(),
            cluster_policy_notes: Vec::new(),
            ..self.clone()
        }
    }

    /// This snapshot's settings (proxy, trust domain, CA, ...) with the
    /// workloads, services and policies of `entries` (a control plane's
    /// snapshot taking a reloaded file's settings).
    pub fn with_entries_of(&self, entries: &Mesh) -> Mesh {
        Mesh {
            catalog: entries.catalog.clone(),
            complete: entries.complete,
            peer_authentications: entries.peer_authentications.clone(),
            cluster_policy_notes: entries.cluster_policy_notes.clone(),
            ..self.clone()
        }
    }

    /// The cluster ID (`clusterId`): the metrics' `*_cluster` labels.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// This node's topology (`locality`), for the pods this proxy serves.
    pub fn node_locality(&self) -> &Locality {
        &self.locality
    }

    /// The workloads behind `service`, each with its own port overrides
    /// (empty: the service's ports).
    pub fn endpoints<'a>(
        &'a self,
        service: &'a Service,
    ) -> impl Iterator<Item = (&'a Workload, &'a EndpointPorts)> {
        self.catalog
            .endpoints(&service.key())
            .filter_map(|(uid, ports)| Some((&**self.catalog.workload(uid)?, ports)))
    }

    /// The uids of `service`'s endpoints that are workloads of the mesh.
    pub fn endpoint_uids(&self, service: &Service) -> Vec<String> {
        self.endpoints(service)
            .map(|(w, _)| w.uid.clone())
            .collect()
    }

    /// Where a new connection to `service`'s `port` may go: its endpoints
    /// that take connections (the healthy ones; every one when the service
    /// allows unhealthy endpoints) with an address in the family asked for,
    /// each with the port it takes the connection on (its own target port,
    /// else the service's; an endpoint for which neither names one is left
    /// out), as is one behind a network gateway. An address another entry
    /// claims too (contested) is left out:
    /// it resolves to neither, and its traffic is refused. The service's
    /// routing preference is not applied here ([`Mesh::endpoints_for`]).
    pub fn healthy_endpoints<'a>(
        &'a self,
        service: &'a Service,
        port: u16,
        ipv6: bool,
    ) -> impl Iterator<Item = (&'a Workload, SocketAddr)> {
        let default = service.target_port(port).filter(|p| *p != 0);
        let allow_unhealthy = service
            .load_balancing
            .as_ref()
            .is_some_and(|lb| lb.allow_unhealthy);
        self.endpoints(service)
            .filter(move |(w, _)| w.healthy || allow_unhealthy)
            // Reached only through its network's gateway, which this proxy
            // does not support: never dialled straight.
            .filter(|(w, _)| !matches!(w.unsupported, Some(Unsupported::NetworkGateway(_))))
            .filter_map(move |(w, ports)| {
                let target = ports.get(&port).copied().filter(|p| *p != 0).or(default)?;
                let ip = w.ips.iter().copied().find(|ip| ip.is_ipv6() == ipv6)?;
                if self.catalog.claimants(ip.to_canonical()).len() > 1 {
                    return None;
                }
                Some((w, SocketAddr::new(ip, target)))
            })
    }

    /// [`Mesh::healthy_endpoints`] that a connection from `client` (the
    /// connecting pod's workload, when known) may go to under the
    /// service's routing preference: with [`LbMode::Strict`], only those
    /// that share every scope with the client (none when the client is not
    /// known); with [`LbMode::Failover`], those that share the longest run
    /// of scopes, in order.
    pub fn endpoints_for<'a>(
        &'a self,
        service: &'a Service,
        port: u16,
        ipv6: bool,
        client: Option<&Workload>,
    ) -> Vec<(&'a Workload, SocketAddr)> {
        let eps = self.healthy_endpoints(service, port, ipv6);
        let Some(lb) = service
            .load_balancing
            .as_ref()
            .filter(|lb| lb.mode != LbMode::Passthrough && !lb.routing_preference.is_empty())
        else {
            return eps.collect();
        };
        let shared = |w: &Workload| {
            client.map_or(0, |c| {
                lb.routing_preference
                    .iter()
                    .take_while(|scope| shares(**scope, c, w))
                    .count()
            })
        };
        let ranked: Vec<_> = eps.map(|e| (shared(e.0), e)).collect();
        let want = match lb.mode {
            LbMode::Strict => lb.routing_preference.len(),
            _ => ranked.iter().map(|(r, _)| *r).max().unwrap_or(0),
        };
        ranked
            .into_iter()
            .filter(|(r, _)| *r == want)
            .map(|(_, e)| e)
            .collect()
    }

    /// Policies of the root namespace (every workload is in their scope).
    pub fn mesh_wide_policies(&self) -> impl Iterator<Item = &AuthorizationPolicy> {
        self.catalog.mesh_wide_policies().map(|p| &**p)
    }

    /// Policies scoped to `namespace` (not the mesh-wide ones, nor those
    /// that apply by name).
    pub fn namespace_policies(
        &self,
        namespace: &str,
    ) -> impl Iterator<Item = &AuthorizationPolicy> {
        self.catalog.namespace_policies(namespace).map(|p| &**p)
    }

    /// The policies that govern connections to `workload`: mesh-wide, then
    /// its namespace's, each in order and restricted by selectors, then
    /// those it names (a name no policy has yet is skipped).
    pub fn policies_for<'a>(
        &'a self,
        workload: &'a Workload,
    ) -> impl Iterator<Item = &'a AuthorizationPolicy> {
        self.mesh_wide_policies()
            .chain(self.namespace_policies(&workload.namespace))
            .filter(move |p| p.applies_to(workload))
            .chain(
                workload
                    .authorization_policies
                    .iter()
                    .filter_map(|n| self.catalog.listed_policy(n))
                    .map(|p| &**p),
            )
    }

    /// Where the configuration came from (a path or the embedded default).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Hash of the file's bytes (0 when built from a value, not text).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The environment overrides that were applied.
    pub fn env_overrides(&self) -> &[EnvOverride] {
        &self.env_overrides
    }

    /// One line for the start-up log: every effective setting, where it
    /// came from, and counts of the model. CA files appear as paths only.
    pub fn effective_summary(&self) -> String {
        let p = &self.proxy;
        let mut s = String::new();
        let _ = write!(s, "source={} revision={:016x}", self.origin, self.revision);
        if !self.env_overrides.is_empty() {
            s.push_str(" env=[");
            for (i, o) in self.env_overrides.iter().enumerate() {
                let sep = if i == 0 { "" } else { ", " };
                let _ = write!(s, "{sep}{}={} -> {}", o.var, o.value, o.field);
            }
            s.push(']');
        }
        let _ = write!(
            s,
            " trustDomain={} rootNamespace={} clusterId={} locality={}/{} captureMode={} datapath={} workers={} (effective {}) \
             ports=outbound:{},inbound:{},tunnel:{} proxyMark={:#x} pipeSize={} pipePool={} \
             backlog={} sameNodeFastPath={} drainPeriod={}s connectTimeout={}s workloadWait={}s",
            self.trust_domain,
            self.root_namespace,
            self.cluster_id,
            self.locality.region,
            self.locality.zone,
            p.capture_mode,
            p.datapath,
            p.workers,
            p.effective_workers(),
            p.ports.outbound,
            p.ports.inbound,
            p.ports.tunnel,
            p.proxy_mark,
            p.pipe_size,
            p.pipe_pool,
            p.backlog,
            p.same_node_fast_path,
            p.drain_period.as_secs_f64(),
            p.connect_timeout.as_secs_f64(),
            p.workload_wait.as_secs_f64(),
        );
        match (&self.ca, &self.ca_service) {
            (None, Some(svc)) => {
                let _ = write!(
                    s,
                    " ca.address={} ca.serverName={} ca.rootCertFile={} ca.tokenFile={}",
                    svc.address,
                    svc.server_name,
                    svc.root_cert_file.display(),
                    svc.token_file.display()
                );
            }
            (None, None) => s.push_str(" ca=none"),
            (Some(ca), _) => {
                let _ = write!(
                    s,
                    " ca.certFile={} ca.keyFile={} ca.bundleFiles={:?}",
                    ca.cert_file.display(),
                    ca.key_file.display(),
                    ca.bundle_files
                );
            }
        }
        let allow = self
            .policies()
            .filter(|p| p.action == Action::Allow)
            .count();
        let _ = write!(
            s,
            " workloads={} services={} policies={} (allow {}, deny {})",
            self.workload_count(),
            self.service_count(),
            self.policy_count(),
            allow,
            self.policy_count() - allow
        );
        s
    }
}

/// Changes to a [`Mesh`] snapshot (from [`Mesh::edit`]): each operation
/// touches its entry and the index paths to it; [`MeshEdit::finish`] gives
/// the new snapshot. Entries are taken as they are: the caller (the control
/// plane's client) has checked each one. Addresses two entries claim are
/// contested, not refused: see [`Mesh::workload_by_ip`].
#[derive(Debug)]
pub struct MeshEdit {
    mesh: Mesh,
}

impl MeshEdit {
    /// Adds or replaces the workload `w.uid`, an endpoint of exactly the
    /// services in `services` (`namespace/hostname` -> its port overrides).
    /// Returns whether it replaced one.
    pub fn upsert_workload(
        &mut self,
        w: Workload,
        services: BTreeMap<String, BTreeMap<u16, u16>>,
    ) -> bool {
        let uid = w.uid.clone();
        let replaced = self.mesh.catalog.upsert_workload(w).is_some();
        self.mesh.catalog.set_memberships(
            &uid,
            services
                .into_iter()
                .map(|(k, p)| (Arc::from(k), Arc::new(p)))
                .collect(),
        );
        replaced
    }

    /// Removes the workload `uid`; whether there was one.
    pub fn remove_workload(&mut self, uid: &str) -> bool {
        self.mesh.catalog.remove_workload(uid).is_some()
    }

    /// Adds or replaces the service `s.key()`; whether it replaced one.
    pub fn upsert_service(&mut self, s: Service) -> bool {
        self.mesh
            .catalog
            .upsert_service(Arc::from(s.key()), s)
            .is_some()
    }

    /// Removes the service `namespace/hostname`; whether there was one.
    pub fn remove_service(&mut self, key: &str) -> bool {
        self.mesh.catalog.remove_service(key).is_some()
    }

    /// Makes the refused resource `name` claim exactly `ips` (it claimed
    /// `before`; `ips` empty: it claims nothing any more). Each such
    /// address resolves to nothing ([`Mesh::refused_claim`]).
    pub fn set_refused(&mut self, name: &str, before: &[IpAddr], ips: &[IpAddr]) {
        let canonical = |v: &[IpAddr]| v.iter().map(|ip| ip.to_canonical()).collect::<Vec<_>>();
        self.mesh
            .catalog
            .set_refused(name, &canonical(before), &canonical(ips));
    }

    /// Adds or replaces the policy `namespace/name` (evaluated after the
    /// file's, by name).
    pub fn upsert_policy(&mut self, p: AuthorizationPolicy) {
        self.mesh.catalog.upsert_policy(u32::MAX, p);
    }

    /// Removes the policy `namespace/name`; whether there was one.
    pub fn remove_policy(&mut self, name: &str) -> bool {
        self.mesh.catalog.remove_policy(name).is_some()
    }

    /// Says whether every workload is in the snapshot (see
    /// [`Mesh::is_complete`]).
    pub fn set_complete(&mut self, complete: bool) {
        self.mesh.complete = complete;
    }

    /// The snapshot as edited so far.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The new snapshot.
    pub fn finish(self) -> Mesh {
        self.mesh
    }
}

/// Whether `a` and `b` share `scope` (this proxy serves one cluster and one
/// network: those are always shared).
fn shares(scope: Scope, a: &Workload, b: &Workload) -> bool {
    match scope {
        Scope::Region => a.locality.region == b.locality.region,
        Scope::Zone => a.locality.zone == b.locality.zone,
        Scope::Subzone => a.locality.subzone == b.locality.subzone,
        Scope::Node => a.node == b.node,
        Scope::Cluster | Scope::Network => true,
    }
}
