//! Layer-4 authorization: which connections a destination workload accepts.
//!
//! # Semantics
//!
//! The policies that govern a connection are the mesh-wide ones (those of
//! the root namespace, or written without a namespace) and those of the
//! destination workload's namespace, each restricted by its `selector`
//! (workload names). Then:
//!
//! 1. if any applicable **DENY** policy matches, the connection is denied;
//! 2. else, if any **ALLOW** policy applies and none matches, it is denied;
//! 3. else it is allowed (no policy at all = allow).
//!
//! A policy matches when any of its rules matches; **a policy without rules
//! matches nothing** (as in Istio): an ALLOW policy with `rules: []` (or no
//! `rules`) therefore denies every connection it governs, and `rules: [{}]`
//! (one rule with no conditions) allows them all; a DENY policy without
//! rules never denies.
//!
//! A rule matches when its `from` matches (any of its sources; an empty or
//! absent `from` = any source) and its `to` matches (any of its
//! destinations; empty = any port). A source matches when every field it
//! sets matches; `not*` fields match when the value is in none of the
//! listed patterns.
//!
//! `principals`, `namespaces` and `serviceAccounts` come from the peer's
//! SPIFFE identity. A plaintext peer (no identity) never matches these
//! positive fields (not even `*`), while their negations match it, because
//! it has nothing in the excluded list: `DENY` with
//! `notPrincipals: ["*"]` is the idiom that refuses plaintext, and
//! `ALLOW` with `principals: ["*"]` admits only authenticated peers, both as
//! in Istio. `ipBlocks` apply to every peer.
//!
//! # Cost
//!
//! [`evaluate`] allocates nothing: policies are found through the
//! snapshot's per-namespace index, principal patterns are compared against
//! the identity's parts without building its SPIFFE ID, and a denial
//! carries the policy's name as a shared `Arc<str>`.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::{
    Action, AuthorizationPolicy, Clause, Condition, Match, MatchFields, Mesh, MtlsMode, Operation,
    Rule, ServiceAccountRef, Source, Values, Workload,
};
pub use crate::model::{Identity, IdentityError};
use crate::names::{Cidr, StringMatch};

/// What the authorizer knows about a connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnInfo<'a> {
    /// The peer's address (for HBONE: the client address the tunnel carries).
    pub src_ip: IpAddr,
    /// The peer's verified identity; `None` for plaintext.
    pub src_identity: Option<&'a Identity>,
    /// The workload being connected to.
    pub dst_workload: &'a Workload,
    /// The address the connection was made to (one of the workload's; for
    /// HBONE the CONNECT authority's).
    pub dst_ip: IpAddr,
    /// The destination (target) port.
    pub dst_port: u16,
}

/// The verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Let the connection through.
    Allow,
    /// Refuse it (HBONE: 401; plaintext: close).
    Deny {
        /// `namespace/name` of the deciding policy: the DENY policy that
        /// matched, or the first applicable ALLOW policy when none matched.
        policy: Arc<str>,
        /// Why.
        reason: DenyReason,
    },
}

/// Why a connection was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// A DENY policy's rule (index in its `rules`) matched.
    DenyPolicyMatched {
        /// Index of the matching rule.
        rule: usize,
    },
    /// ALLOW policies govern the destination and none matched.
    NoAllowPolicyMatched {
        /// How many ALLOW policies applied.
        allow_policies: usize,
    },
    /// A STRICT PeerAuthentication governs the destination port and the
    /// peer is plaintext (no verified identity).
    MtlsRequired,
}

impl Decision {
    /// Whether the connection may proceed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow)
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Allow => f.write_str("allowed"),
            Decision::Deny {
                policy,
                reason: DenyReason::DenyPolicyMatched { rule },
            } => write!(f, "denied by DENY policy {policy} (rules[{rule}])"),
            Decision::Deny {
                policy,
                reason: DenyReason::NoAllowPolicyMatched { allow_policies },
            } => write!(
                f,
                "denied: {allow_policies} ALLOW policies apply (first: {policy}) and none matched"
            ),
            Decision::Deny {
                policy,
                reason: DenyReason::MtlsRequired,
            } => write!(
                f,
                "denied: PeerAuthentication {policy} is STRICT and the connection is plaintext"
            ),
        }
    }
}

/// The connection as rules see it.
struct Peer<'a> {
    ip: IpAddr,
    identity: Option<&'a Identity>,
    port: u16,
    dst_ip: IpAddr,
}

/// Decides whether `conn` may reach its destination; see the
/// [module documentation](self) for the semantics. Dry-run policies take no
/// part: see [`evaluate_dry_run`].
pub fn evaluate(mesh: &Mesh, conn: &ConnInfo<'_>) -> Decision {
    decide(mesh, conn, false)
}

/// What the verdict would be if the dry-run policies that govern `conn`'s
/// destination were enforced, when that differs from [`evaluate`]'s
/// `actual` verdict: the caller reports it (log, metric) and enforces
/// `actual`. `None` when no dry-run policy governs the destination, or the
/// verdict would be the same.
pub fn evaluate_dry_run(mesh: &Mesh, conn: &ConnInfo<'_>, actual: &Decision) -> Option<Decision> {
    if !mesh.policies_for(conn.dst_workload).any(|p| p.dry_run) {
        return None;
    }
    let shadow = decide(mesh, conn, true);
    (shadow != *actual).then_some(shadow)
}

fn decide(mesh: &Mesh, conn: &ConnInfo<'_>, with_dry_run: bool) -> Decision {
    let peer = Peer {
        ip: conn.src_ip.to_canonical(),
        identity: conn.src_identity,
        port: conn.dst_port,
        dst_ip: conn.dst_ip.to_canonical(),
    };
    if conn.src_identity.is_none() && !mesh.peer_authentications.is_empty() {
        if let (MtlsMode::Strict, Some(pa)) = mesh.mtls_mode(conn.dst_workload, conn.dst_port) {
            return Decision::Deny {
                policy: pa.name.clone(),
                reason: DenyReason::MtlsRequired,
            };
        }
    }
    let mut first_allow: Option<&AuthorizationPolicy> = None;
    let mut allow_policies = 0;
    let mut allowed = false;
    for policy in mesh.policies_for(conn.dst_workload) {
        if policy.dry_run && !with_dry_run {
            continue;
        }
        match policy.action {
            Action::Deny => {
                if let Some(rule) = policy.rules.iter().position(|r| r.matches(&peer)) {
                    return Decision::Deny {
                        policy: policy.qualified.clone(),
                        reason: DenyReason::DenyPolicyMatched { rule },
                    };
                }
            }
            Action::Allow => {
                allow_policies += 1;
                first_allow.get_or_insert(policy);
                // Once an ALLOW matched, only DENY policies can change the verdict.
                if !allowed {
                    allowed = policy.rules.iter().any(|r| r.matches(&peer));
                }
            }
        }
    }
    match first_allow {
        Some(policy) if !allowed => Decision::Deny {
            policy: policy.qualified.clone(),
            reason: DenyReason::NoAllowPolicyMatched { allow_policies },
        },
        _ => Decision::Allow,
    }
}

fn any_of<T>(list: &[T], f: impl Fn(&T) -> bool) -> bool {
    list.is_empty() || list.iter().any(f)
}

fn none_of<T>(list: &[T], f: impl Fn(&T) -> bool) -> bool {
    !list.iter().any(f)
}

impl Rule {
    fn matches(&self, peer: &Peer<'_>) -> bool {
        any_of(&self.from, |s| s.matches(peer))
            && any_of(&self.to, |o| o.matches(peer.port))
            && self.when.iter().all(|c| c.matches(peer))
            && self.clauses.iter().all(|c| c.matches(peer))
    }
}

impl Clause {
    /// Any match; a clause without matches matches (the reference's rule).
    fn matches(&self, peer: &Peer<'_>) -> bool {
        self.matches.is_empty() || self.matches.iter().any(|m| m.matches(peer))
    }
}

impl Match {
    fn matches(&self, peer: &Peer<'_>) -> bool {
        match self {
            Match::Always => true,
            Match::Never => false,
            Match::Fields(f) => !f.is_empty() && f.matches(peer),
        }
    }
}

impl MatchFields {
    /// Identity fields never match a plaintext peer and their negations
    /// always do, as for a rule's `from`.
    fn matches(&self, peer: &Peer<'_>) -> bool {
        let id = peer.identity;
        let principal = |m: &StringMatch| id.is_some_and(|i| m.matches_pieces(&i.pieces()));
        let namespace = |m: &StringMatch| id.is_some_and(|i| m.matches(&i.namespace));
        let account = |sa: &ServiceAccountRef| {
            id.is_some_and(|i| sa.namespace == i.namespace && sa.name == i.service_account)
        };
        let src = |c: &Cidr| c.contains(peer.ip);
        let dst = |c: &Cidr| c.contains(peer.dst_ip);
        let port = |p: &u16| *p == peer.port;
        any_of(&self.namespaces, namespace)
            && none_of(&self.not_namespaces, namespace)
            && any_of(&self.principals, principal)
            && none_of(&self.not_principals, principal)
            && any_of(&self.service_accounts, account)
            && none_of(&self.not_service_accounts, account)
            && any_of(&self.source_ips, src)
            && none_of(&self.not_source_ips, src)
            && any_of(&self.destination_ips, dst)
            && none_of(&self.not_destination_ips, dst)
            && any_of(&self.destination_ports, port)
            && none_of(&self.not_destination_ports, port)
    }
}

impl<T> Values<T> {
    fn test(&self, f: impl Fn(&T) -> bool) -> bool {
        any_of(&self.values, &f) && none_of(&self.not_values, &f)
    }
}

impl Condition {
    /// Identity-based values never match a plaintext peer and their
    /// negations always do, as for the `from` fields.
    fn matches(&self, peer: &Peer<'_>) -> bool {
        let id = peer.identity;
        match self {
            Condition::SourceIp(v) => v.test(|c| c.contains(peer.ip)),
            Condition::SourceNamespace(v) => {
                v.test(|m| id.is_some_and(|i| m.matches(&i.namespace)))
            }
            Condition::SourcePrincipal(v) => {
                v.test(|m| id.is_some_and(|i| m.matches_pieces(&i.pieces())))
            }
            Condition::DestinationIp(v) => v.test(|c| c.contains(peer.dst_ip)),
            Condition::DestinationPort(v) => v.test(|p| *p == peer.port),
        }
    }
}

impl Source {
    fn matches(&self, peer: &Peer<'_>) -> bool {
        let id = peer.identity;
        let principal = |m: &StringMatch| id.is_some_and(|i| m.matches_pieces(&i.pieces()));
        let namespace = |m: &StringMatch| id.is_some_and(|i| m.matches(&i.namespace));
        let account = |sa: &ServiceAccountRef| {
            id.is_some_and(|i| sa.namespace == i.namespace && sa.name == i.service_account)
        };
        let ip = |c: &Cidr| c.contains(peer.ip);
        any_of(&self.principals, principal)
            && none_of(&self.not_principals, principal)
            && any_of(&self.namespaces, namespace)
            && none_of(&self.not_namespaces, namespace)
            && any_of(&self.service_accounts, account)
            && none_of(&self.not_service_accounts, account)
            && any_of(&self.ip_blocks, ip)
            && none_of(&self.not_ip_blocks, ip)
    }
}

impl Operation {
    fn matches(&self, port: u16) -> bool {
        any_of(&self.ports, |p| *p == port) && none_of(&self.not_ports, |p| *p == port)
    }
}

#[cfg(test)]
mod tests;
