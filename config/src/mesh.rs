//! The validated, immutable mesh snapshot the proxy looks things up in.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use crate::authz::Identity;
use crate::catalog::Catalog;
pub use crate::catalog::{Claimant, EndpointPorts};
use crate::env::EnvOverride;
use crate::names::{Cidr, StringMatch};
use crate::ProxySettings;

/// A pod of the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Unique id (the pod's UID).
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
    /// Pod IPs (IPv4-mapped IPv6 addresses are stored as IPv4).
    pub ips: Vec<IpAddr>,
    /// Node the pod runs on.
    pub node: String,
    /// Whether the pod's node proxy speaks HBONE (port 15008).
    pub tunnel: bool,
    /// Whether the workload takes new connections sent to its services.
    pub healthy: bool,
    /// The pod's labels (validated Kubernetes label syntax).
    pub labels: BTreeMap<String, String>,
    /// The topology of the pod's node, when known.
    pub locality: Locality,
    /// The workload the pod belongs to (see [`workload_name_of`]); the pod's
    /// name when it has no controller.
    pub workload_name: String,
    /// The trust domain of its identity when it is not the mesh's (the
    /// control plane says so per workload).
    pub trust_domain: Option<String>,
    /// Its canonical service and revision as the control plane computed
    /// them (from the pod's labels there); `None`: from [`Workload::labels`].
    pub canonical: Option<(String, String)>,
    /// Why traffic to it must not be sent straight to it (a waypoint, a
    /// network gateway), which this proxy does not support yet: such traffic
    /// is refused and counted, never sent around the waypoint.
    pub unsupported: Option<Unsupported>,
    /// Policies that apply to it because they name it (`namespace/name`;
    /// the control plane's label-selected policies), beside the mesh-wide
    /// and namespace ones.
    pub authorization_policies: Vec<Arc<str>>,
}

/// A part of the mesh this proxy cannot honour yet, on a workload or a
/// service: traffic that would need it is refused (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// A waypoint proxy must see its inbound traffic (`namespace/hostname`
    /// or address of the waypoint).
    Waypoint(String),
    /// It is reached through an east-west network gateway.
    NetworkGateway(String),
}

impl Unsupported {
    /// A short name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Unsupported::Waypoint(_) => "waypoint",
            Unsupported::NetworkGateway(_) => "network_gateway",
        }
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::Waypoint(w) => write!(
                f,
                "its traffic must pass the waypoint {w}, which this proxy does not support"
            ),
            Unsupported::NetworkGateway(g) => {
                write!(f, "it is reached through the network gateway {g}, which this proxy does not support")
            }
        }
    }
}

/// A node's topology (`topology.kubernetes.io/region` and `zone`); empty
/// strings when not known.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Locality {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
}

/// The label that names a workload's canonical service.
pub const CANONICAL_NAME_LABEL: &str = "service.istio.io/canonical-name";
/// The label that names a workload's canonical revision.
pub const CANONICAL_REVISION_LABEL: &str = "service.istio.io/canonical-revision";

// The reference control plane derives both from the pod's labels
// (istio/istio `pkg/config/labels`, `CanonicalService(labels, workloadName)`):
// name = `service.istio.io/canonical-name`, else `app.kubernetes.io/name`,
// else `app`, else the workload name; revision =
// `service.istio.io/canonical-revision`, else `app.kubernetes.io/version`,
// else `version`, else the literal `latest`. The first label present wins,
// even when its value is empty.
const NAME_LABELS: [&str; 3] = [CANONICAL_NAME_LABEL, "app.kubernetes.io/name", "app"];
const REVISION_LABELS: [&str; 3] = [
    CANONICAL_REVISION_LABEL,
    "app.kubernetes.io/version",
    "version",
];

fn first_label<'a>(labels: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| labels.get(*k)).map(String::as_str)
}

impl Workload {
    /// The workload's canonical service (the reference's rule: see
    /// [`CANONICAL_NAME_LABEL`]); the workload name when no label says.
    pub fn canonical_service(&self) -> &str {
        match &self.canonical {
            Some((name, _)) => name,
            None => first_label(&self.labels, &NAME_LABELS).unwrap_or(&self.workload_name),
        }
    }

    /// The workload's canonical revision; `latest` when no label says.
    pub fn canonical_revision(&self) -> &str {
        match &self.canonical {
            Some((_, revision)) => revision,
            None => first_label(&self.labels, &REVISION_LABELS).unwrap_or("latest"),
        }
    }

    /// The workload's SPIFFE identity: in its own trust domain when the
    /// control plane gave one, else in `mesh_trust_domain`.
    pub fn identity(&self, mesh_trust_domain: &str) -> Identity {
        let td = self.trust_domain.as_deref().unwrap_or(mesh_trust_domain);
        Identity::new(td, &self.namespace, &self.service_account)
    }
}

/// A service: virtual IPs in front of workloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// DNS name.
    pub hostname: String,
    /// Namespace.
    pub namespace: String,
    /// Virtual IPs.
    pub vips: Vec<IpAddr>,
    /// Service port -> target port (0: each endpoint says; see
    /// [`Mesh::endpoints`]).
    pub ports: BTreeMap<u16, u16>,
    /// Why its traffic must not go straight to its endpoints (a waypoint):
    /// refused while this proxy does not support it.
    pub unsupported: Option<Unsupported>,
}

impl Service {
    /// `namespace/hostname`: how the mesh names it.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }

    /// The service's name: the host name's first part (`reviews` of
    /// `reviews.default.svc.cluster.local`).
    pub fn name(&self) -> &str {
        self.hostname.split('.').next().unwrap_or(&self.hostname)
    }

    /// The workload port a connection to `service_port` goes to.
    pub fn target_port(&self, service_port: u16) -> Option<u16> {
        self.ports.get(&service_port).copied()
    }
}

/// What a policy does when one of its rules matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Allow the connection (and make every non-matching one denied).
    Allow,
    /// Deny the connection (checked before any ALLOW).
    Deny,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Allow => "ALLOW",
            Action::Deny => "DENY",
        })
    }
}

/// A validated authorization policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizationPolicy {
    /// Name.
    pub name: String,
    /// Namespace; the root namespace for a mesh-wide policy (a policy
    /// written without a namespace gets the root namespace).
    pub namespace: String,
    /// Whether the policy applies to every namespace.
    pub mesh_wide: bool,
    /// Workload names the policy is restricted to (`None` = all in scope).
    pub selector: Option<Vec<String>>,
    /// Pod labels a workload must all have for the policy to apply (`None`
    /// = no label condition).
    pub match_labels: Option<BTreeMap<String, String>>,
    /// The Kubernetes object a cluster policy was mapped from (`None`: the
    /// configuration file's).
    pub origin: Option<String>,
    /// ALLOW or DENY.
    pub action: Action,
    /// Rules; the policy matches when any rule does (none: never).
    pub rules: Vec<Rule>,
    /// It applies only to the workloads that name it in their
    /// [`Workload::authorization_policies`] (the control plane's
    /// WORKLOAD_SELECTOR scope), in any namespace.
    pub listed: bool,
    /// Evaluated and reported, never enforced.
    pub dry_run: bool,
    pub(crate) qualified: Arc<str>,
}

impl AuthorizationPolicy {
    /// A policy `namespace/name` doing `action` with no rules (it matches
    /// nothing) and no selector; set the other fields, never the name or
    /// the namespace, before use.
    pub fn new(namespace: &str, name: &str, action: Action) -> AuthorizationPolicy {
        AuthorizationPolicy {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            mesh_wide: false,
            selector: None,
            match_labels: None,
            origin: None,
            action,
            rules: Vec::new(),
            listed: false,
            dry_run: false,
            qualified: format!("{namespace}/{name}").into(),
        }
    }

    /// `namespace/name`, shared with [`crate::authz::Decision`] without copying.
    pub fn qualified_name(&self) -> &Arc<str> {
        &self.qualified
    }

    /// Whether the policy's scope and selector include `workload`.
    pub fn applies_to(&self, workload: &Workload) -> bool {
        if self.listed {
            return workload
                .authorization_policies
                .iter()
                .any(|n| **n == *self.qualified);
        }
        (self.mesh_wide || self.namespace == workload.namespace)
            && self
                .selector
                .as_ref()
                .is_none_or(|names| names.contains(&workload.name))
            && labels_match(self.match_labels.as_ref(), workload)
    }
}

/// Whether `workload` has every label of `want` (`None`: yes).
fn labels_match(want: Option<&BTreeMap<String, String>>, workload: &Workload) -> bool {
    want.is_none_or(|want| {
        want.iter()
            .all(|(k, v)| workload.labels.get(k).is_some_and(|have| have == v))
    })
}

/// A cluster policy object left out of the mesh, or mapped with a part
/// changed (an L7 rule omitted, DISABLE read as PERMISSIVE, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterPolicyNote {
    /// `AuthorizationPolicy ns/name` or `PeerAuthentication ns/name`.
    pub object: String,
    /// `AuthorizationPolicy` or `PeerAuthentication`.
    pub kind: &'static str,
    /// Whether the whole object was left out.
    pub skipped: bool,
    /// A short code for metrics: `invalid`, `unsupported-action`,
    /// `target-ref`, `root-selector`, `l7-rule-omitted`, ...
    pub code: &'static str,
    /// Why, in words.
    pub reason: String,
}

/// A mutual-TLS mode of a [`PeerAuthentication`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MtlsMode {
    /// Inherit the mode of the enclosing scope (namespace, then mesh).
    Unset,
    /// Plaintext and mutual TLS are both accepted (the default).
    Permissive,
    /// Only mutual TLS (HBONE) is accepted: plaintext is refused.
    Strict,
}

impl fmt::Display for MtlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MtlsMode::Unset => "UNSET",
            MtlsMode::Permissive => "PERMISSIVE",
            MtlsMode::Strict => "STRICT",
        })
    }
}

/// A validated mutual-TLS requirement (from a cluster `PeerAuthentication`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAuthentication {
    /// `istio/<ns>/<name>`.
    pub name: Arc<str>,
    /// The object's namespace (the root namespace for a mesh-wide one).
    pub namespace: String,
    /// Whether it is the mesh-wide one (root namespace, no selector).
    pub mesh_wide: bool,
    /// Pod labels of the workloads it selects (`None`: its whole namespace).
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Mode of its workloads.
    pub mode: MtlsMode,
    /// Per target port modes (`portLevelMtls`), overriding `mode`.
    pub port_modes: BTreeMap<u16, MtlsMode>,
    /// The Kubernetes object it was mapped from.
    pub origin: String,
}

impl PeerAuthentication {
    fn port_mode(&self, port: u16) -> MtlsMode {
        match self.port_modes.get(&port) {
            Some(m) if *m != MtlsMode::Unset => *m,
            _ => self.mode,
        }
    }
}

/// A rule: matches when a source in `from` (or any source, if empty) and an
/// operation in `to` (or any port, if empty) match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// Sources, any of which may match.
    pub from: Vec<Source>,
    /// Destinations, any of which may match.
    pub to: Vec<Operation>,
    /// Conditions, every one of which must match.
    pub when: Vec<Condition>,
    /// The control plane's form of a rule: every clause must match (in
    /// addition to `from`, `to` and `when`, which it leaves empty).
    pub clauses: Vec<Clause>,
}

/// A clause of a control-plane rule: matches when any of its matches does;
/// a clause without matches matches every connection (as the reference
/// evaluates it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Clause {
    /// The alternatives.
    pub matches: Vec<Match>,
}

/// One alternative of a [`Clause`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    /// Matches when every field it sets matches (a match that sets none
    /// matches nothing, as the reference evaluates it).
    Fields(Box<MatchFields>),
    /// Matches every connection: what an unreadable match of a DENY policy
    /// becomes (fail toward deny).
    Always,
    /// Matches no connection: what an unreadable match of an ALLOW policy
    /// becomes (fail toward deny).
    Never,
}

/// The fields of a control-plane [`Match`]: in each pair the value must be
/// one of the first list (when it is not empty) and none of the second.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MatchFields {
    /// The peer identity's namespace.
    pub namespaces: Vec<StringMatch>,
    /// Negated.
    pub not_namespaces: Vec<StringMatch>,
    /// The peer's SPIFFE ID (patterns carry the `spiffe://` prefix).
    pub principals: Vec<StringMatch>,
    /// Negated.
    pub not_principals: Vec<StringMatch>,
    /// The peer identity's namespace and service account.
    pub service_accounts: Vec<ServiceAccountRef>,
    /// Negated.
    pub not_service_accounts: Vec<ServiceAccountRef>,
    /// The peer's address.
    pub source_ips: Vec<Cidr>,
    /// Negated.
    pub not_source_ips: Vec<Cidr>,
    /// The address connected to.
    pub destination_ips: Vec<Cidr>,
    /// Negated.
    pub not_destination_ips: Vec<Cidr>,
    /// The destination (target) port.
    pub destination_ports: Vec<u16>,
    /// Negated.
    pub not_destination_ports: Vec<u16>,
}

impl MatchFields {
    /// Whether it sets no field.
    pub fn is_empty(&self) -> bool {
        *self == MatchFields::default()
    }
}

/// A `when` condition on an L4 attribute: matches when the attribute has
/// one of `values` (or `values` is empty) and none of `not_values`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// `source.ip`: the peer's address.
    SourceIp(Values<Cidr>),
    /// `source.namespace`: the namespace of the peer's identity.
    SourceNamespace(Values<StringMatch>),
    /// `source.principal`: the peer's SPIFFE ID.
    SourcePrincipal(Values<StringMatch>),
    /// `destination.ip`: the address the connection was made to.
    DestinationIp(Values<Cidr>),
    /// `destination.port`: the destination (target) port.
    DestinationPort(Values<u16>),
}

/// The values of a [`Condition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Values<T> {
    /// Any of these (empty: any value).
    pub values: Vec<T>,
    /// None of these.
    pub not_values: Vec<T>,
}

/// A source: matches when every non-empty field matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// Peer namespace patterns.
    pub namespaces: Vec<StringMatch>,
    /// Negated peer namespace patterns.
    pub not_namespaces: Vec<StringMatch>,
    /// SPIFFE ID patterns (`spiffe://td/ns/x/sa/y`, `*`, `prefix*`, `*suffix`).
    pub principals: Vec<StringMatch>,
    /// Negated SPIFFE ID patterns.
    pub not_principals: Vec<StringMatch>,
    /// Peer service accounts.
    pub service_accounts: Vec<ServiceAccountRef>,
    /// Negated peer service accounts.
    pub not_service_accounts: Vec<ServiceAccountRef>,
    /// Source address blocks.
    pub ip_blocks: Vec<Cidr>,
    /// Negated source address blocks.
    pub not_ip_blocks: Vec<Cidr>,
}

/// A `namespace/serviceAccount` pair.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceAccountRef {
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub name: String,
}

/// A destination: matches when every non-empty field matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operation {
    /// Destination ports.
    pub ports: Vec<u16>,
    /// Negated destination ports.
    pub not_ports: Vec<u16>,
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
    /// The configuration the snapshot was validated from (environment
    /// overrides applied); for a snapshot merged with Kubernetes objects, the
    /// file's part only. The Kubernetes source merges cluster objects into it.
    #[cfg(feature = "kube")]
    pub(crate) source: Option<Arc<crate::MeshConfig>>,
}

impl Mesh {
    /// Keeps `cfg`, the configuration this snapshot was validated from
    /// (only with the `kube` feature, which merges cluster objects into it).
    #[cfg(feature = "kube")]
    pub(crate) fn with_source(mut self, cfg: impl FnOnce() -> crate::MeshConfig) -> Mesh {
        self.source = Some(Arc::new(cfg()));
        self
    }

    /// Without the `kube` feature nothing needs the configuration.
    #[cfg(not(feature = "kube"))]
    pub(crate) fn with_source(self, _cfg: impl FnOnce() -> crate::MeshConfig) -> Mesh {
        self
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

    /// Where a new connection to `service`'s `port` may go: its healthy
    /// endpoints with an address in the family asked for, each with the
    /// port it takes the connection on (its own target port, else the
    /// service's; an endpoint for which neither names one is left out).
    pub fn healthy_endpoints<'a>(
        &'a self,
        service: &'a Service,
        port: u16,
        ipv6: bool,
    ) -> impl Iterator<Item = (&'a Workload, SocketAddr)> {
        let default = service.target_port(port).filter(|p| *p != 0);
        self.endpoints(service)
            .filter(|(w, _)| w.healthy)
            .filter_map(move |(w, ports)| {
                let target = ports.get(&port).copied().filter(|p| *p != 0).or(default)?;
                let ip = w.ips.iter().copied().find(|ip| ip.is_ipv6() == ipv6)?;
                Some((w, SocketAddr::new(ip, target)))
            })
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

/// The name of the workload a pod belongs to, as the reference mesh derives
/// it from the pod's controller (istio's `GetDeployMetaFromPod`): a
/// ReplicaSet named `<deployment>-<pod-template-hash>` stands for its
/// Deployment; a Job named `<cronjob>-<8 to 11 digits>` for its CronJob; any
/// other controller by its own name; no controller: the pod's name.
pub fn workload_name_of(
    pod_name: &str,
    controller: Option<(&str, &str)>,
    pod_template_hash: Option<&str>,
) -> String {
    let Some((kind, name)) = controller else {
        return pod_name.to_owned();
    };
    match kind {
        "ReplicaSet" => match pod_template_hash {
            Some(hash) if !hash.is_empty() => name
                .strip_suffix(hash)
                .and_then(|n| n.strip_suffix('-'))
                .filter(|n| !n.is_empty())
                .unwrap_or(name)
                .to_owned(),
            _ => name.to_owned(),
        },
        "Job" => match name.rsplit_once('-') {
            Some((cron, stamp))
                if !cron.is_empty()
                    && (8..=11).contains(&stamp.len())
                    && stamp.bytes().all(|b| b.is_ascii_digit()) =>
            {
                cron.to_owned()
            }
            _ => name.to_owned(),
        },
        _ => name.to_owned(),
    }
}

#[cfg(test)]
mod workload_name_tests {
    use super::workload_name_of;

    #[test]
    fn workload_names_follow_the_pods_controller() {
        let cases = [
            (
                "web-7d9f8-x2x",
                Some(("ReplicaSet", "web-7d9f8")),
                Some("7d9f8"),
                "web",
            ),
            (
                "web-7d9f8-x2x",
                Some(("ReplicaSet", "web-7d9f8")),
                None,
                "web-7d9f8",
            ),
            (
                "odd-1",
                Some(("ReplicaSet", "other")),
                Some("7d9f8"),
                "other",
            ),
            ("db-0", Some(("StatefulSet", "db")), None, "db"),
            ("agent-abcde", Some(("DaemonSet", "agent")), None, "agent"),
            (
                "backup-28391040-abc",
                Some(("Job", "backup-28391040")),
                None,
                "backup",
            ),
            ("once-x", Some(("Job", "once")), None, "once"),
            (
                "migrate-1234-x",
                Some(("Job", "migrate-1234")),
                None,
                "migrate-1234",
            ),
            ("bare", None, None, "bare"),
        ];
        for (pod, controller, hash, want) in cases {
            assert_eq!(
                workload_name_of(pod, controller, hash),
                want,
                "{pod} {controller:?}"
            );
        }
    }
}
