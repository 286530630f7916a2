//! Authorization policies and PeerAuthentications as the snapshot holds
//! them, validated: who may connect (rules, clauses, conditions) and which
//! connections must be mutual TLS. Evaluation is [`crate::authz`]'s.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use super::workload::Workload;
use crate::names::{Cidr, StringMatch};

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
pub(crate) fn labels_match(want: Option<&BTreeMap<String, String>>, workload: &Workload) -> bool {
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
    pub(crate) fn port_mode(&self, port: u16) -> MtlsMode {
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
