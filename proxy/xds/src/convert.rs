//! Resources of the workload API into ringway's mesh model
//! (`ringway_config`): what each field becomes, what is refused and why.
//!
//! A workload or service whose resource cannot be read (a bad address, a
//! port out of range, a name that does not match the resource) is refused
//! whole: the caller NACKs it naming the field, keeps a copy held only when
//! the refused version agrees with it on what authorization and routing
//! depend on ([`authority`], [`refused_claims`]), and otherwise has the
//! addresses it claims resolve to nothing, so traffic that needed it is
//! refused, never served from a guess.
//!
//! A workload or service this proxy cannot serve as the mesh means it (a
//! waypoint, a network gateway, an `application_tunnel` other than NONE:
//! its app wants a PROXY protocol header this proxy does not write) is
//! taken, marked [`Unsupported`]: its traffic is refused and counted by
//! that reason, never delivered some other way. `native_tunnel` is read and
//! ignored: HBONE to a workload already goes to its own address on 15008.
//!
//! An authorization policy is never refused whole: what cannot be read of it
//! is replaced by what errs toward deny for the workloads it could select
//! (an unreadable match of a DENY matches every connection, one of an ALLOW
//! none; an unknown action is a DENY of every connection to what the
//! policy selects, whatever its rules say; an unknown scope selects its
//! whole namespace (the whole mesh for the root namespace's), and an ALLOW
//! of unknown scope grants nothing; a policy that cannot be decoded at all
//! denies everything in its namespace, or the whole mesh when the namespace
//! is unknown or the root, under a name no valid policy has; a field its
//! bytes hold that this proxy does not know makes its match, clause or rule
//! err the same way), and each problem is reported for the NACK.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ringway_config::authz::Identity;
use ringway_config::{
    Action, AuthorizationPolicy, Cidr, Clause, LbMode, LoadBalancing, Locality, Match, MatchFields,
    Rule, Scope, Service, ServiceAccountRef, StringMatch, Unsupported, Workload,
};

use crate::proto::security::{self, string_match::MatchType};
use crate::proto::wire::UnknownFields;
use crate::proto::workload::{self as wl, address, gateway_address};

/// The trust domain of a workload that names none (the control plane's
/// convention for its own data).
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// The service account of a workload that names none.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// Why a workload or service resource was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct Refused {
    /// The field path in the resource (`workload.addresses[1]`).
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

fn refused(field: impl Into<String>, problem: impl Into<String>) -> Refused {
    Refused {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The services a workload is an endpoint of: `namespace/hostname` -> its
/// own service port -> target port.
pub type Memberships = BTreeMap<String, BTreeMap<u16, u16>>;

/// An `Address` resource, read.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// A workload and the services it is an endpoint of.
    Workload(Box<Workload>, Memberships),
    /// A service.
    Service(Service),
}

/// Reads the `Address` resource named `name`.
pub fn address(name: &str, a: &wl::Address) -> Result<Entry, Refused> {
    match &a.kind {
        None => Err(refused(
            "type",
            "neither a workload nor a service (the oneof is unset)",
        )),
        Some(address::Kind::Workload(w)) => {
            if w.uid != name {
                return Err(refused(
                    "workload.uid",
                    format!("{:?} is not the resource's name {name:?}", w.uid),
                ));
            }
            workload(w).map(|(w, s)| Entry::Workload(Box::new(w), s))
        }
        Some(address::Kind::Service(s)) => {
            let key = format!("{}/{}", s.namespace, s.hostname);
            if key != name {
                return Err(refused(
                    "service",
                    format!("{key:?} (namespace/hostname) is not the resource's name {name:?}"),
                ));
            }
            service(s).map(Entry::Service)
        }
    }
}

/// What can still be read of an `Address` that was refused: the addresses
/// it claims (those that are addresses at all; none of a workload on its
/// node's network, whose addresses are the node's), and whether it asks for
/// its traffic to go another way than straight to it (a waypoint, a
/// network gateway, an `application_tunnel`), which no copy held before may
/// stand in for.
pub fn refused_claims(a: &wl::Address) -> (Vec<IpAddr>, bool) {
    let (raw, elsewhere): (Vec<&[u8]>, bool) = match &a.kind {
        None => (Vec::new(), false),
        Some(address::Kind::Workload(w)) => (
            if w.network_mode == wl::NetworkMode::HostNetwork as i32 {
                Vec::new()
            } else {
                w.addresses.iter().map(Vec::as_slice).collect()
            },
            w.waypoint.is_some()
                || w.network_gateway.is_some()
                || w.application_tunnel
                    .as_ref()
                    .is_some_and(|t| application_tunnel(t).is_some()),
        ),
        Some(address::Kind::Service(s)) => (
            s.addresses.iter().map(|a| a.address.as_slice()).collect(),
            s.waypoint.is_some(),
        ),
    };
    let mut ips: Vec<IpAddr> = Vec::with_capacity(raw.len());
    for ip in raw.into_iter().filter_map(|b| ip_of(b).ok()) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    (ips, elsewhere)
}

/// What of a workload decides how its connections are authorized: its
/// namespace, service account and trust domain (its identity, and the
/// namespace's policies), and the policies that name it (the control
/// plane's label-selected ones), sorted. A copy held may stand in for a
/// refused version only when both say the same here.
pub fn authority(w: &wl::Workload) -> (String, String, String, Vec<String>) {
    let or = |v: &str, d: &str| {
        if v.is_empty() {
            d.to_owned()
        } else {
            v.to_owned()
        }
    };
    let mut policies = w.authorization_policies.clone();
    policies.sort();
    (
        w.namespace.clone(),
        or(&w.service_account, DEFAULT_SERVICE_ACCOUNT),
        or(&w.trust_domain, DEFAULT_TRUST_DOMAIN),
        policies,
    )
}

/// Whether the workload speaks HBONE (`Some(true)`) or plain TCP
/// (`Some(false)`); `None` for a tunnel protocol this proxy does not know.
pub fn tunnel(w: &wl::Workload) -> Option<bool> {
    match w.tunnel_protocol {
        x if x == wl::TunnelProtocol::Hbone as i32 => Some(true),
        x if x == wl::TunnelProtocol::None as i32 => Some(false),
        _ => None,
    }
}

/// [`authority`] of a workload as held.
pub fn held_authority(w: &Workload) -> (String, String, String, Vec<String>) {
    let mut policies: Vec<String> = w
        .authorization_policies
        .iter()
        .map(|p| p.to_string())
        .collect();
    policies.sort();
    (
        w.namespace.clone(),
        w.service_account.clone(),
        w.trust_domain
            .clone()
            .unwrap_or_else(|| DEFAULT_TRUST_DOMAIN.to_owned()),
        policies,
    )
}

/// Bytes that are not an address: neither 4 (IPv4) nor 16 (IPv6) of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{len} bytes are not an IPv4 (4) or IPv6 (16) address")]
pub struct NotAnAddress {
    /// How many bytes there were.
    pub len: usize,
}

/// Bytes that must be an IPv4 or IPv6 address.
pub fn ip_of(bytes: &[u8]) -> Result<IpAddr, NotAnAddress> {
    match bytes.len() {
        4 => Ok(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(bytes).expect("4 bytes"),
        ))),
        16 => Ok(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(bytes).expect("16 bytes"),
        ))
        .to_canonical()),
        len => Err(NotAnAddress { len }),
    }
}

fn port(field: &str, n: u32, zero_ok: bool) -> Result<u16, Refused> {
    match u16::try_from(n) {
        Ok(0) if !zero_ok => Err(refused(field, "port 0")),
        Ok(p) => Ok(p),
        Err(_) => Err(refused(field, format!("{n} is not a port (0..=65535)"))),
    }
}

fn gateway(g: &wl::GatewayAddress) -> String {
    let at = match &g.destination {
        Some(gateway_address::Destination::Hostname(h)) => {
            format!("{}/{}", h.namespace, h.hostname)
        }
        Some(gateway_address::Destination::Address(a)) => ip_of(&a.address)
            .map(|ip| ip.to_string())
            .unwrap_or_else(|e| format!("<{e}>")),
        None => "<no destination>".to_owned(),
    };
    format!("{at}:{}", g.hbone_mtls_port)
}

/// Reads a `Workload`: the model's workload and its service memberships.
pub fn workload(w: &wl::Workload) -> Result<(Workload, Memberships), Refused> {
    if w.uid.is_empty() {
        return Err(refused("workload.uid", "must not be empty"));
    }
    let trust_domain = if w.trust_domain.is_empty() {
        DEFAULT_TRUST_DOMAIN
    } else {
        &w.trust_domain
    };
    let service_account = if w.service_account.is_empty() {
        DEFAULT_SERVICE_ACCOUNT
    } else {
        &w.service_account
    };
    // The identity it will be held to must be a valid SPIFFE ID.
    let id = format!(
        "spiffe://{trust_domain}/ns/{}/sa/{service_account}",
        w.namespace
    );
    Identity::from_spiffe_id(&id).map_err(|e| {
        refused(
            "workload.{trustDomain,namespace,serviceAccount}",
            e.to_string(),
        )
    })?;
    // On its node's network, its addresses are the node's: kept for the
    // services it is an endpoint of, never an address that names it.
    let host_network = w.network_mode == wl::NetworkMode::HostNetwork as i32;
    let mut ips = Vec::with_capacity(w.addresses.len());
    for (i, a) in w.addresses.iter().enumerate() {
        let ip =
            ip_of(a).map_err(|e| refused(format!("workload.addresses[{i}]"), e.to_string()))?;
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    let tunnel = tunnel(w).ok_or_else(|| {
        refused(
            "workload.tunnelProtocol",
            format!(
                "{} is not a tunnel protocol this proxy knows (NONE 0, HBONE 1)",
                w.tunnel_protocol
            ),
        )
    })?;
    let healthy = match w.status {
        x if x == wl::WorkloadStatus::Healthy as i32 => true,
        x if x == wl::WorkloadStatus::Unhealthy as i32 => false,
        other => {
            return Err(refused(
                "workload.status",
                format!("{other} is not a status (HEALTHY 0, UNHEALTHY 1)"),
            ))
        }
    };
    let unsupported = match (&w.waypoint, &w.network_gateway) {
        (Some(g), _) => Some(Unsupported::Waypoint(gateway(g))),
        (None, Some(g)) => Some(Unsupported::NetworkGateway(gateway(g))),
        (None, None) => w.application_tunnel.as_ref().and_then(application_tunnel),
    };
    let mut services = BTreeMap::new();
    for (key, list) in &w.services {
        let at = format!("workload.services[{key}]");
        if key
            .split_once('/')
            .is_none_or(|(ns, h)| ns.is_empty() || h.is_empty())
        {
            return Err(refused(at, "a service is named namespace/hostname"));
        }
        let mut ports = BTreeMap::new();
        for (i, p) in list.ports.iter().enumerate() {
            let sp = port(
                &format!("{at}.ports[{i}].servicePort"),
                p.service_port,
                false,
            )?;
            let tp = port(&format!("{at}.ports[{i}].targetPort"), p.target_port, true)?;
            ports.insert(sp, tp);
        }
        services.insert(key.clone(), ports);
    }
    let canonical = (!w.canonical_name.is_empty() || !w.canonical_revision.is_empty()).then(|| {
        (
            if w.canonical_name.is_empty() {
                if w.workload_name.is_empty() {
                    w.name.clone()
                } else {
                    w.workload_name.clone()
                }
            } else {
                w.canonical_name.clone()
            },
            if w.canonical_revision.is_empty() {
                "latest".to_owned()
            } else {
                w.canonical_revision.clone()
            },
        )
    });
    let locality = w
        .locality
        .as_ref()
        .map(|l| Locality {
            region: l.region.clone(),
            zone: l.zone.clone(),
            subzone: l.subzone.clone(),
        })
        .unwrap_or_default();
    Ok((
        Workload {
            host_network,
            uid: w.uid.clone(),
            name: w.name.clone(),
            namespace: w.namespace.clone(),
            service_account: service_account.to_owned(),
            ips,
            node: w.node.clone(),
            tunnel,
            healthy,
            labels: BTreeMap::new(),
            locality,
            workload_name: if w.workload_name.is_empty() {
                w.name.clone()
            } else {
                w.workload_name.clone()
            },
            trust_domain: Some(trust_domain.to_owned()),
            canonical,
            unsupported,
            authorization_policies: w
                .authorization_policies
                .iter()
                .map(|p| Arc::from(p.as_str()))
                .collect(),
        },
        services,
    ))
}

/// What a workload's `application_tunnel` asks for, when it is more than
/// the bytes unchanged: its inbound traffic cannot be delivered as it wants
/// (this proxy writes no PROXY protocol header), so it is refused.
fn application_tunnel(t: &wl::ApplicationTunnel) -> Option<Unsupported> {
    use wl::application_tunnel::Protocol;
    let what = match t.protocol {
        x if x == Protocol::None as i32 => return None,
        x if x == Protocol::Proxy as i32 => "a PROXY protocol header".to_owned(),
        other => format!("tunnel protocol {other} (unknown)"),
    };
    Some(Unsupported::ApplicationTunnel(if t.port == 0 {
        what
    } else {
        format!("{what} on port {}", t.port)
    }))
}

/// Reads a `Service`.
pub fn service(s: &wl::Service) -> Result<Service, Refused> {
    if s.namespace.is_empty() || s.hostname.is_empty() {
        return Err(refused(
            "service.{namespace,hostname}",
            "a service needs a namespace and a hostname",
        ));
    }
    let mut vips = Vec::with_capacity(s.addresses.len());
    for (i, a) in s.addresses.iter().enumerate() {
        let ip = ip_of(&a.address)
            .map_err(|e| refused(format!("service.addresses[{i}]"), e.to_string()))?;
        if !vips.contains(&ip) {
            vips.push(ip);
        }
    }
    let mut ports = BTreeMap::new();
    for (i, p) in s.ports.iter().enumerate() {
        let sp = port(
            &format!("service.ports[{i}].servicePort"),
            p.service_port,
            false,
        )?;
        let tp = port(
            &format!("service.ports[{i}].targetPort"),
            p.target_port,
            true,
        )?;
        ports.insert(sp, tp);
    }
    let load_balancing = s.load_balancing.as_ref().map(load_balancing).transpose()?;
    Ok(Service {
        load_balancing,
        hostname: s.hostname.clone(),
        namespace: s.namespace.clone(),
        vips,
        ports,
        unsupported: s
            .waypoint
            .as_ref()
            .map(|g| Unsupported::Waypoint(gateway(g))),
    })
}

/// Reads a service's `load_balancing`. A scope or mode this proxy does not
/// know refuses the service: its endpoints would otherwise be picked
/// against what the control plane asked.
fn load_balancing(lb: &wl::LoadBalancing) -> Result<LoadBalancing, Refused> {
    use wl::load_balancing::{HealthPolicy, Mode, Scope as S};
    let mut routing_preference = Vec::with_capacity(lb.routing_preference.len());
    for (i, &scope) in lb.routing_preference.iter().enumerate() {
        routing_preference.push(match S::try_from(scope) {
            Ok(S::Region) => Scope::Region,
            Ok(S::Zone) => Scope::Zone,
            Ok(S::Subzone) => Scope::Subzone,
            Ok(S::Node) => Scope::Node,
            Ok(S::Cluster) => Scope::Cluster,
            Ok(S::Network) => Scope::Network,
            Ok(S::UnspecifiedScope) | Err(_) => {
                return Err(refused(
                    format!("service.loadBalancing.routingPreference[{i}]"),
                    format!("{scope} is not a scope this proxy knows (REGION 1 .. NETWORK 6)"),
                ))
            }
        });
    }
    let mode = match Mode::try_from(lb.mode) {
        Ok(Mode::Strict) => LbMode::Strict,
        // Unset with scopes listed: a preference, never a restriction.
        Ok(Mode::Failover | Mode::UnspecifiedMode) => LbMode::Failover,
        Ok(Mode::Passthrough) => LbMode::Passthrough,
        Err(_) => {
            return Err(refused(
                "service.loadBalancing.mode",
                format!(
                    "{} is not a mode (UNSPECIFIED 0, STRICT 1, FAILOVER 2, PASSTHROUGH 3)",
                    lb.mode
                ),
            ))
        }
    };
    let allow_unhealthy = match HealthPolicy::try_from(lb.health_policy) {
        Ok(HealthPolicy::OnlyHealthy) => false,
        Ok(HealthPolicy::AllowAll) => true,
        Err(_) => {
            return Err(refused(
                "service.loadBalancing.healthPolicy",
                format!(
                    "{} is not a health policy (ONLY_HEALTHY 0, ALLOW_ALL 1)",
                    lb.health_policy
                ),
            ))
        }
    };
    Ok(LoadBalancing {
        routing_preference,
        mode,
        allow_unhealthy,
    })
}

/// A policy as read, and what of it could not be read (each already
/// replaced by what errs toward deny).
#[derive(Debug, Clone)]
pub struct Policy {
    /// The policy to enforce.
    pub policy: AuthorizationPolicy,
    /// The problems, each naming its field (empty: read whole).
    pub problems: Vec<String>,
}

/// Reads the `Authorization` resource named `name`. `root_namespace`: the
/// namespace whose policies would apply mesh-wide.
pub fn authorization(name: &str, a: &security::Authorization, root_namespace: &str) -> Policy {
    authorization_with(name, a, &UnknownFields::default(), root_namespace)
}

/// [`authorization`], with the fields of its bytes this proxy does not
/// know ([`crate::proto::wire::unknown_in_authorization`]): each is a
/// condition it cannot evaluate, so what holds it errs toward deny (a
/// match, clause or rule of a DENY matches every connection, of an ALLOW
/// none; an ALLOW with an unknown field of its own grants nothing; a
/// DENY's own is reported, its rules enforced).
pub fn authorization_with(
    name: &str,
    a: &security::Authorization,
    unknown: &UnknownFields,
    root_namespace: &str,
) -> Policy {
    let mut p = authorization_read(name, a, root_namespace);
    if unknown.is_empty() {
        return p;
    }
    let deny = p.policy.action == Action::Deny;
    let (instead, stand_in, whole) = if deny {
        (
            "every",
            Match::Always,
            "its rules are enforced as read, on every workload of its namespace",
        )
    } else {
        ("no", Match::Never, "it grants nothing")
    };
    let fields = |f: &[u32]| {
        f.iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    for ((r, c, m), f) in &unknown.matches {
        if let Some(slot) = p
            .policy
            .rules
            .get_mut(*r)
            .and_then(|rule| rule.clauses.get_mut(*c))
            .and_then(|clause| clause.matches.get_mut(*m))
        {
            *slot = stand_in.clone();
            p.problems.push(format!(
                "rules[{r}].clauses[{c}].matches[{m}]: fields {} unknown to this proxy: it matches {instead} connection",
                fields(f)
            ));
        }
    }
    for ((r, c), f) in &unknown.clauses {
        if let Some(clause) = p
            .policy
            .rules
            .get_mut(*r)
            .and_then(|rule| rule.clauses.get_mut(*c))
        {
            clause.matches = vec![stand_in.clone()];
            p.problems.push(format!(
                "rules[{r}].clauses[{c}]: fields {} unknown to this proxy: it matches {instead} connection",
                fields(f)
            ));
        }
    }
    for (r, f) in &unknown.rules {
        if let Some(rule) = p.policy.rules.get_mut(*r) {
            rule.clauses = vec![Clause {
                matches: vec![stand_in.clone()],
            }];
            p.problems.push(format!(
                "rules[{r}]: fields {} unknown to this proxy: it matches {instead} connection",
                fields(f)
            ));
        }
    }
    if !unknown.policy.is_empty() {
        if deny {
            // What it selects may be what the field says: never narrower
            // than it could have been (as an unknown scope).
            p.policy.listed = false;
            p.policy.mesh_wide = p.policy.mesh_wide || p.policy.namespace == root_namespace;
        } else {
            p.policy.rules = Vec::new();
        }
        p.problems.push(format!(
            "fields {} unknown to this proxy: {whole}",
            fields(&unknown.policy)
        ));
    }
    p
}

fn authorization_read(name: &str, a: &security::Authorization, root_namespace: &str) -> Policy {
    let mut problems = Vec::new();
    let expected = format!("{}/{}", a.namespace, a.name);
    // '~' is in no Kubernetes name: the unreadable policies' stand-ins
    // (`deny_everything`) are named with it.
    if a.name.is_empty() || a.namespace.is_empty() || expected != name || name.contains('~') {
        // Scoped by what the resource's name says: never narrower than it
        // could have been.
        problems.push(format!(
            "name/namespace: {expected:?} is not the resource's name {name:?}"
        ));
        return Policy {
            policy: deny_everything(name, root_namespace),
            problems,
        };
    }
    // An action that cannot be read: neither its rules' ALLOW nor their
    // DENY can be trusted, so it denies every connection to what it selects.
    let (action, known_action) = match a.action {
        x if x == security::Action::Allow as i32 => (Action::Allow, true),
        x if x == security::Action::Deny as i32 => (Action::Deny, true),
        other => {
            problems.push(format!(
                "action: {other} is not ALLOW (0) or DENY (1): it denies every connection to what it selects"
            ));
            (Action::Deny, false)
        }
    };
    let mut p = AuthorizationPolicy::new(&a.namespace, &a.name, action);
    p.origin = Some(format!("xds:{name}"));
    p.dry_run = a.dry_run;
    // A scope that cannot be read: never narrower than it could have been
    // (a policy selects only its own namespace's workloads, every
    // workload when that is the root namespace), and an ALLOW then grants
    // nothing: its rules were written for workloads it may not select.
    let mut known_scope = true;
    match a.scope {
        x if x == security::Scope::Global as i32 => p.mesh_wide = true,
        x if x == security::Scope::Namespace as i32 => {}
        x if x == security::Scope::WorkloadSelector as i32 => p.listed = true,
        other => {
            known_scope = false;
            p.mesh_wide = a.namespace == root_namespace;
            let to = if p.mesh_wide {
                "every workload"
            } else {
                "every workload of its namespace"
            };
            let what = if action == Action::Allow && known_action {
                "; as an ALLOW it grants nothing"
            } else {
                ""
            };
            problems.push(format!(
                "scope: {other} is not GLOBAL (0), NAMESPACE (1) or WORKLOAD_SELECTOR (2): applied to {to}{what}"
            ));
        }
    }
    if !known_action {
        p.rules = deny_every_connection();
        return Policy {
            policy: p,
            problems,
        };
    }
    if !known_scope && action == Action::Allow {
        // No rule: an ALLOW that matches no connection.
        p.rules = Vec::new();
        return Policy {
            policy: p,
            problems,
        };
    }
    let deny = action == Action::Deny;
    p.rules = a
        .rules
        .iter()
        .enumerate()
        .map(|(r, rule)| Rule {
            clauses: rule
                .clauses
                .iter()
                .enumerate()
                .map(|(c, clause)| Clause {
                    matches: clause
                        .matches
                        .iter()
                        .enumerate()
                        .map(|(m, mt)| match match_fields(mt) {
                            Ok(f) => Match::Fields(Box::new(f)),
                            Err(e) => {
                                let instead = if deny { "every" } else { "no" };
                                problems.push(format!(
                                    "rules[{r}].clauses[{c}].matches[{m}].{e}: it matches {instead} connection"
                                ));
                                if deny {
                                    Match::Always
                                } else {
                                    Match::Never
                                }
                            }
                        })
                        .collect(),
                })
                .collect(),
            ..Rule::default()
        })
        .collect();
    Policy {
        policy: p,
        problems,
    }
}

/// The policy that stands for the resource `name` when nothing of it can be
/// read: it denies every connection to what it could have selected (its
/// namespace's workloads; every workload when its namespace is the root or
/// cannot be told).
pub fn deny_everything(name: &str, root_namespace: &str) -> AuthorizationPolicy {
    let split = name
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty());
    let ns = split.map_or(root_namespace, |(ns, _)| ns).to_owned();
    let short = match split {
        Some((_, n)) if !name.contains('~') => n.to_owned(),
        // Under a name no Kubernetes object can have ('~'), one to one
        // with the resource's: it never takes the place of another policy.
        _ => format!("~{}", name.replace('~', "~~").replace('/', "~s")),
    };
    let mut p = AuthorizationPolicy::new(&ns, &short, Action::Deny);
    p.origin = Some(format!(
        "xds:{name} (unreadable: denies everything it could select)"
    ));
    p.mesh_wide = ns == root_namespace;
    p.rules = deny_every_connection();
    p
}

/// The rules of a DENY that matches every connection.
fn deny_every_connection() -> Vec<Rule> {
    vec![Rule {
        clauses: vec![Clause {
            matches: vec![Match::Always],
        }],
        ..Rule::default()
    }]
}

fn string_matches(
    field: &str,
    list: &[security::StringMatch],
    principal: bool,
) -> Result<Vec<StringMatch>, Refused> {
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let with_scheme = |s: &str| -> Box<str> {
                if principal {
                    format!("spiffe://{s}").into()
                } else {
                    s.into()
                }
            };
            Ok(match &m.match_type {
                None => return Err(refused(format!("{field}[{i}]"), "no match type is set")),
                Some(MatchType::Exact(s)) => StringMatch::Exact(with_scheme(s)),
                // Principals are written without the scheme; a prefix or an
                // exact value starts after it, a suffix ends the same way.
                Some(MatchType::Prefix(s)) => StringMatch::Prefix(with_scheme(s)),
                Some(MatchType::Suffix(s)) => StringMatch::Suffix(s.as_str().into()),
                Some(MatchType::Presence(())) => StringMatch::Any,
            })
        })
        .collect()
}

fn cidrs(field: &str, list: &[security::Address]) -> Result<Vec<Cidr>, Refused> {
    list.iter()
        .enumerate()
        .map(|(i, a)| {
            let at = || format!("{field}[{i}]");
            let ip = ip_of(&a.address).map_err(|e| refused(at(), e.to_string()))?;
            // A mapped IPv6 address was made IPv4: so is its length.
            let len = if ip.is_ipv4() && a.address.len() == 16 {
                a.length
                    .checked_sub(96)
                    .ok_or_else(|| refused(at(), "an IPv4-mapped block shorter than /96"))?
            } else {
                a.length
            };
            Cidr::from_prefix(ip, len).map_err(|e| refused(at(), e.to_string()))
        })
        .collect()
}

fn ports(field: &str, list: &[u32]) -> Result<Vec<u16>, Refused> {
    list.iter()
        .enumerate()
        .map(|(i, &p)| {
            u16::try_from(p).map_err(|_| {
                refused(
                    format!("{field}[{i}]"),
                    format!("{p} is not a port (0..=65535)"),
                )
            })
        })
        .collect()
}

fn accounts(
    field: &str,
    list: &[security::ServiceAccountMatch],
) -> Result<Vec<ServiceAccountRef>, Refused> {
    list.iter()
        .enumerate()
        .map(|(i, sa)| {
            if sa.namespace.is_empty() || sa.service_account.is_empty() {
                return Err(refused(
                    format!("{field}[{i}]"),
                    "a service account needs a namespace and a name",
                ));
            }
            Ok(ServiceAccountRef {
                namespace: sa.namespace.clone(),
                name: sa.service_account.clone(),
            })
        })
        .collect()
}

fn match_fields(m: &security::Match) -> Result<MatchFields, Refused> {
    Ok(MatchFields {
        namespaces: string_matches("namespaces", &m.namespaces, false)?,
        not_namespaces: string_matches("notNamespaces", &m.not_namespaces, false)?,
        principals: string_matches("principals", &m.principals, true)?,
        not_principals: string_matches("notPrincipals", &m.not_principals, true)?,
        service_accounts: accounts("serviceAccounts", &m.service_accounts)?,
        not_service_accounts: accounts("notServiceAccounts", &m.not_service_accounts)?,
        source_ips: cidrs("sourceIps", &m.source_ips)?,
        not_source_ips: cidrs("notSourceIps", &m.not_source_ips)?,
        destination_ips: cidrs("destinationIps", &m.destination_ips)?,
        not_destination_ips: cidrs("notDestinationIps", &m.not_destination_ips)?,
        destination_ports: ports("destinationPorts", &m.destination_ports)?,
        not_destination_ports: ports("notDestinationPorts", &m.not_destination_ports)?,
    })
}

/// One line naming a policy's problems, for logs and NACKs.
pub fn describe_problems(name: &str, problems: &[String]) -> String {
    let mut s = format!("Authorization {name}: ");
    for (i, p) in problems.iter().enumerate() {
        let _ = write!(s, "{}{p}", if i == 0 { "" } else { "; " });
    }
    s
}

#[cfg(test)]
mod tests;
