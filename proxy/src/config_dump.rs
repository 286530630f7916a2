//! The admin `GET /config_dump` sections in the reference node proxy's
//! JSON shape (istio/ztunnel's dump, for `istioctl ztunnel-config
//! workloads|services|policies|certificates`): `workloads`, `services`,
//! `policies` and `certificates`, beside ringway's own keys. The shape is
//! the reference's as read from its source (and istioctl's types for it,
//! which `tests/tests/it/admin_config_dump.rs` checks the dump against); it
//! is not run through `istioctl` itself.
//!
//! What ringway's model knows is filled in; what it does not keep (a
//! workload's network or hostname, a service's subject alt names or load
//! balancing) is left out rather than guessed, so a reader that decodes the
//! reference's shape gets an empty value there, never a wrong one. The
//! table in ARCHITECTURE.md ("Ports", `/config_dump`) says which fields
//! are left out and why.
//!
//! Shapes (the reference's field names and value forms):
//! - a workload: `uid`, `workloadIps` (plain addresses), `protocol`
//!   (`HBONE`/`TCP`), `name`, `namespace`, `serviceAccount`,
//!   `workloadName`, `workloadType`, `canonicalName`, `canonicalRevision`,
//!   `clusterId`, `trustDomain`, `locality` (when known), `node`, `status`
//!   (`Healthy`/`Unhealthy`), `waypoint`/`networkGateway`
//!   (`{destination, hboneMtlsPort}`), `authorizationPolicies`, `services`
//!   (`namespace/hostname`);
//! - a service: `name`, `namespace`, `hostname`, `vips` (`network/ip`, the
//!   network empty: ringway does not keep one), `ports` (service port ->
//!   target port), `endpoints` keyed by workload uid (`{workloadUid, port,
//!   status}`), `waypoint`;
//! - a policy: `name`, `namespace`, `scope` (`Global`, `Namespace`,
//!   `WorkloadSelector`), `action` (`Allow`/`Deny`), `rules` as rules ->
//!   clauses -> matches (every clause of a rule must match, any match of a
//!   clause), `dryRun`;
//! - a certificate: `identity`, `state` (`Available`, `Initializing`,
//!   `Unavailable: <why>`), `certChain` and `rootCerts`, each certificate
//!   `{pem, serialNumber, validFrom, expirationTime}` with `pem` the PEM
//!   text base64-encoded and the serial in decimal, as the reference.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ringway_config::{
    Action, AuthorizationPolicy, Condition, Match, MatchFields, Mesh, Rule, Service,
    ServiceAccountRef, Source, StringMatch, Unsupported, Workload,
};
use ringway_identity::{CertState, IdentityManager};
use serde_json::{json, Map, Value};

/// What `workloadType` says when the model does not keep the controller's
/// kind (the reference's value for a pod without one).
pub const DEFAULT_WORKLOAD_TYPE: &str = "pod";

/// The four reference sections: `workloads`, `services`, `policies` (empty
/// lists without a mesh) and `certificates` (empty without HBONE).
pub fn reference_sections(
    mesh: Option<&Mesh>,
    ids: Option<&IdentityManager>,
) -> Map<String, Value> {
    let mut out = Map::new();
    let (workloads, services, policies) = match mesh {
        Some(m) => (
            m.workloads().map(|w| workload(m, w)).collect(),
            m.services().map(|s| service(m, s)).collect(),
            m.policies().map(policy).collect(),
        ),
        None => (Vec::new(), Vec::new(), Vec::new()),
    };
    out.insert("workloads".into(), Value::Array(workloads));
    out.insert("services".into(), Value::Array(services));
    out.insert("policies".into(), Value::Array(policies));
    out.insert(
        "certificates".into(),
        Value::Array(ids.map(certificates).unwrap_or_default()),
    );
    out
}

/// An address with its network, as the reference writes one (`network/ip`;
/// the network is empty: ringway's model does not keep one).
fn network_address(ip: IpAddr) -> String {
    format!("/{ip}")
}

/// A waypoint or network gateway, `{destination, hboneMtlsPort}`: the
/// destination `namespace/hostname` or `network/ip`. The model keeps it as
/// the control plane's client wrote it (`<namespace/hostname or ip>:<port>`).
fn gateway(at: &str) -> Value {
    let (dest, port) = match at.rsplit_once(':') {
        Some((d, p)) if !d.is_empty() => match p.parse::<u16>() {
            Ok(p) => (d, Some(p)),
            Err(_) => (at, None),
        },
        _ => (at, None),
    };
    let destination = match dest.parse::<IpAddr>() {
        Ok(ip) => network_address(ip),
        Err(_) => dest.to_owned(),
    };
    let mut g = Map::new();
    g.insert("destination".into(), Value::String(destination));
    if let Some(p) = port {
        g.insert("hboneMtlsPort".into(), json!(p));
    }
    Value::Object(g)
}

fn status(healthy: bool) -> &'static str {
    if healthy {
        "Healthy"
    } else {
        "Unhealthy"
    }
}

/// The policies that apply to `w` by selection rather than by scope: those
/// the control plane lists on it, and the file's or the cluster's policies
/// with a selector or labels that select it (the reference lists both on
/// the workload; its scope is then `WorkloadSelector`).
fn selected_policies(m: &Mesh, w: &Workload) -> Vec<String> {
    let mut names: Vec<String> = w
        .authorization_policies
        .iter()
        .map(|n| n.to_string())
        .collect();
    for p in m.policies() {
        if !p.listed && scope(p) == "WorkloadSelector" && p.applies_to(w) {
            let n = p.qualified_name().to_string();
            if !names.contains(&n) {
                names.push(n);
            }
        }
    }
    names
}

fn workload(m: &Mesh, w: &Workload) -> Value {
    let mut o = Map::new();
    o.insert("uid".into(), json!(w.uid));
    o.insert(
        "workloadIps".into(),
        json!(w.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>()),
    );
    match &w.unsupported {
        Some(Unsupported::Waypoint(at)) => {
            o.insert("waypoint".into(), gateway(at));
        }
        Some(Unsupported::NetworkGateway(at)) => {
            o.insert("networkGateway".into(), gateway(at));
        }
        // Not shown: the reference's shape for it was not read.
        Some(Unsupported::ApplicationTunnel(_)) | None => {}
    }
    o.insert(
        "protocol".into(),
        json!(if w.tunnel { "HBONE" } else { "TCP" }),
    );
    o.insert("name".into(), json!(w.name));
    o.insert("namespace".into(), json!(w.namespace));
    o.insert("serviceAccount".into(), json!(w.service_account));
    o.insert("workloadName".into(), json!(w.workload_name));
    o.insert("workloadType".into(), json!(DEFAULT_WORKLOAD_TYPE));
    o.insert("canonicalName".into(), json!(w.canonical_service()));
    o.insert("canonicalRevision".into(), json!(w.canonical_revision()));
    o.insert("clusterId".into(), json!(m.cluster_id()));
    o.insert(
        "trustDomain".into(),
        json!(w.trust_domain.as_deref().unwrap_or(m.trust_domain())),
    );
    let l = &w.locality;
    if !l.region.is_empty() || !l.zone.is_empty() || !l.subzone.is_empty() {
        let mut loc = json!({"region": l.region, "zone": l.zone});
        if !l.subzone.is_empty() {
            loc["subzone"] = json!(l.subzone);
        }
        o.insert("locality".into(), loc);
    }
    if w.host_network {
        o.insert("networkMode".into(), json!("HostNetwork"));
    }
    o.insert("node".into(), json!(w.node));
    o.insert("status".into(), json!(status(w.healthy)));
    let policies = selected_policies(m, w);
    if !policies.is_empty() {
        o.insert("authorizationPolicies".into(), json!(policies));
    }
    let services: Vec<String> = m.services_of(&w.uid).map(|s| s.key()).collect();
    if !services.is_empty() {
        o.insert("services".into(), json!(services));
    }
    Value::Object(o)
}

/// Port maps as JSON objects keyed by the service port.
fn port_map(ports: &BTreeMap<u16, u16>) -> Value {
    Value::Object(
        ports
            .iter()
            .map(|(sp, tp)| (sp.to_string(), json!(tp)))
            .collect(),
    )
}

fn service(m: &Mesh, s: &Service) -> Value {
    let mut o = Map::new();
    o.insert("name".into(), json!(s.name()));
    o.insert("namespace".into(), json!(s.namespace));
    o.insert("hostname".into(), json!(s.hostname));
    o.insert(
        "vips".into(),
        json!(s
            .vips
            .iter()
            .map(|ip| network_address(*ip))
            .collect::<Vec<_>>()),
    );
    o.insert("ports".into(), port_map(&s.ports));
    // Each endpoint's ports as a connection to it uses them: the service's,
    // with the endpoint's own target ports over them.
    let endpoints: Map<String, Value> = m
        .endpoints(s)
        .map(|(w, own)| {
            let mut ports = s.ports.clone();
            ports.extend(own.iter().map(|(k, v)| (*k, *v)));
            (
                w.uid.clone(),
                json!({
                    "workloadUid": w.uid,
                    "port": port_map(&ports),
                    "status": status(w.healthy),
                }),
            )
        })
        .collect();
    o.insert("endpoints".into(), Value::Object(endpoints));
    if let Some(Unsupported::Waypoint(at)) = &s.unsupported {
        o.insert("waypoint".into(), gateway(at));
    }
    Value::Object(o)
}

/// The reference's scope: a policy that applies by being named on its
/// workloads, or that selects workloads (by name or labels), is
/// `WorkloadSelector`; one of the root namespace without a selector
/// `Global`; else `Namespace`.
fn scope(p: &AuthorizationPolicy) -> &'static str {
    if p.listed || p.selector.is_some() || p.match_labels.is_some() {
        "WorkloadSelector"
    } else if p.mesh_wide {
        "Global"
    } else {
        "Namespace"
    }
}

fn policy(p: &AuthorizationPolicy) -> Value {
    json!({
        "name": p.name,
        "namespace": p.namespace,
        "scope": scope(p),
        "action": match p.action {
            Action::Allow => "Allow",
            Action::Deny => "Deny",
        },
        "rules": p.rules.iter().map(rule).collect::<Vec<_>>(),
        "dryRun": p.dry_run,
    })
}

/// A string match as the reference writes one (`{"Exact": ...}`,
/// `{"Prefix": ...}`, `{"Suffix": ...}`, `{"Presence": []}`). Principals are
/// written without the `spiffe://` scheme, as the control plane sends them.
fn string_match(m: &StringMatch, principal: bool) -> Value {
    let bare = |s: &str| -> String {
        if principal {
            s.strip_prefix("spiffe://").unwrap_or(s).to_owned()
        } else {
            s.to_owned()
        }
    };
    match m {
        StringMatch::Any => json!({"Presence": []}),
        StringMatch::Exact(s) => json!({"Exact": bare(s)}),
        StringMatch::Prefix(s) => json!({"Prefix": bare(s)}),
        StringMatch::Suffix(s) => json!({"Suffix": s.to_string()}),
    }
}

/// Builds one reference match object, leaving out empty lists.
#[derive(Default)]
struct MatchObject(Map<String, Value>);

impl MatchObject {
    fn strings(mut self, key: &str, list: &[StringMatch], principal: bool) -> Self {
        if !list.is_empty() {
            let v = list.iter().map(|m| string_match(m, principal)).collect();
            self.0.insert(key.into(), Value::Array(v));
        }
        self
    }

    fn accounts(mut self, key: &str, list: &[ServiceAccountRef]) -> Self {
        if !list.is_empty() {
            let v = list
                .iter()
                .map(|a| json!({"namespace": a.namespace, "serviceAccount": a.name}))
                .collect();
            self.0.insert(key.into(), Value::Array(v));
        }
        self
    }

    fn display<T: std::fmt::Display>(mut self, key: &str, list: &[T]) -> Self {
        if !list.is_empty() {
            let v = list.iter().map(|c| json!(c.to_string())).collect();
            self.0.insert(key.into(), Value::Array(v));
        }
        self
    }

    fn ports(mut self, key: &str, list: &[u16]) -> Self {
        if !list.is_empty() {
            self.0.insert(key.into(), json!(list));
        }
        self
    }

    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn match_fields(f: &MatchFields) -> Value {
    MatchObject::default()
        .strings("namespaces", &f.namespaces, false)
        .strings("notNamespaces", &f.not_namespaces, false)
        .accounts("serviceAccounts", &f.service_accounts)
        .accounts("notServiceAccounts", &f.not_service_accounts)
        .strings("principals", &f.principals, true)
        .strings("notPrincipals", &f.not_principals, true)
        .display("sourceIps", &f.source_ips)
        .display("notSourceIps", &f.not_source_ips)
        .display("destinationIps", &f.destination_ips)
        .display("notDestinationIps", &f.not_destination_ips)
        .ports("destinationPorts", &f.destination_ports)
        .ports("notDestinationPorts", &f.not_destination_ports)
        .done()
}

/// A file or cluster source as one match of the `from` clause.
fn source(s: &Source) -> Value {
    MatchObject::default()
        .strings("namespaces", &s.namespaces, false)
        .strings("notNamespaces", &s.not_namespaces, false)
        .accounts("serviceAccounts", &s.service_accounts)
        .accounts("notServiceAccounts", &s.not_service_accounts)
        .strings("principals", &s.principals, true)
        .strings("notPrincipals", &s.not_principals, true)
        .display("sourceIps", &s.ip_blocks)
        .display("notSourceIps", &s.not_ip_blocks)
        .done()
}

/// A `when` condition as a clause of one match; `None` when it constrains
/// nothing (no values either way).
fn condition(c: &Condition) -> Option<Value> {
    let m = MatchObject::default();
    let m = match c {
        Condition::SourceIp(v) => m
            .display("sourceIps", &v.values)
            .display("notSourceIps", &v.not_values),
        Condition::SourceNamespace(v) => {
            m.strings("namespaces", &v.values, false)
                .strings("notNamespaces", &v.not_values, false)
        }
        Condition::SourcePrincipal(v) => {
            m.strings("principals", &v.values, true)
                .strings("notPrincipals", &v.not_values, true)
        }
        Condition::DestinationIp(v) => m
            .display("destinationIps", &v.values)
            .display("notDestinationIps", &v.not_values),
        Condition::DestinationPort(v) => m
            .ports("destinationPorts", &v.values)
            .ports("notDestinationPorts", &v.not_values),
    };
    (!m.0.is_empty()).then(|| m.done())
}

/// What stands for a match the control plane sent that could not be read
/// (ringway enforces it toward deny): no field of the reference can say
/// "every connection", so it is named.
fn unreadable(matches_all: bool) -> Value {
    json!({"unreadable": if matches_all { "matchesAll" } else { "matchesNone" }})
}

/// A rule as its clauses. The control plane's rules are written as they
/// came; a file or cluster rule becomes a `from` clause (its sources), a
/// `to` clause (its operations) and one clause per `when` condition, a
/// source or operation that sets nothing making its clause match anything
/// (so it is left out, as is an empty list).
fn rule(r: &Rule) -> Value {
    let mut clauses: Vec<Value> = r
        .clauses
        .iter()
        .map(|c| {
            Value::Array(
                c.matches
                    .iter()
                    .map(|m| match m {
                        Match::Fields(f) => match_fields(f),
                        Match::Always => unreadable(true),
                        Match::Never => unreadable(false),
                    })
                    .collect(),
            )
        })
        .collect();
    let from: Vec<Value> = r.from.iter().map(source).collect();
    if !from.is_empty()
        && from
            .iter()
            .all(|m| m.as_object().is_some_and(|o| !o.is_empty()))
    {
        clauses.push(Value::Array(from));
    }
    let to: Vec<Value> =
        r.to.iter()
            .map(|o| {
                MatchObject::default()
                    .ports("destinationPorts", &o.ports)
                    .ports("notDestinationPorts", &o.not_ports)
                    .done()
            })
            .collect();
    if !to.is_empty()
        && to
            .iter()
            .all(|m| m.as_object().is_some_and(|o| !o.is_empty()))
    {
        clauses.push(Value::Array(to));
    }
    clauses.extend(
        r.when
            .iter()
            .filter_map(condition)
            .map(|m| Value::Array(vec![m])),
    );
    Value::Array(clauses)
}

/// One certificate as the reference writes it.
fn cert(der: &tokio_rustls::rustls::pki_types::CertificateDer<'_>) -> Value {
    match ringway_identity::describe_certificate(der) {
        Ok(s) => json!({
            "pem": ringway_identity::base64(s.pem.as_bytes()),
            "serialNumber": s.serial,
            "validFrom": ringway_identity::rfc3339(s.not_before),
            "expirationTime": ringway_identity::rfc3339(s.not_after),
        }),
        // Never expected (the manager read it when it was issued): the
        // entry says so instead of vanishing.
        Err(e) => json!({
            "pem": ringway_identity::base64(
                format!("<unreadable certificate: {e}>").as_bytes()
            ),
            "serialNumber": "",
            "validFrom": "",
            "expirationTime": "",
        }),
    }
}

fn certificates(ids: &IdentityManager) -> Vec<Value> {
    let bundle = ids.bundle();
    let roots = bundle.roots();
    ids.certificate_states()
        .into_iter()
        .map(|(id, state)| {
            let (chain, root_certs) = match &state {
                CertState::Available(c) => (
                    c.chain()
                        .iter()
                        .filter(|c| !roots.contains(c))
                        .map(cert)
                        .collect(),
                    roots.iter().map(cert).collect(),
                ),
                _ => (Vec::new(), Vec::new()),
            };
            json!({
                "identity": id.to_string(),
                "state": state.label(),
                "certChain": chain,
                "rootCerts": root_certs,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_read_as_the_reference_writes_them() {
        assert_eq!(
            gateway("shop/waypoint.shop.svc.cluster.local:15008"),
            json!({"destination": "shop/waypoint.shop.svc.cluster.local", "hboneMtlsPort": 15008})
        );
        assert_eq!(
            gateway("10.96.0.9:15008"),
            json!({"destination": "/10.96.0.9", "hboneMtlsPort": 15008})
        );
        assert_eq!(
            gateway("fd00::9:15008"),
            json!({"destination": "/fd00::9", "hboneMtlsPort": 15008})
        );
        assert_eq!(
            gateway("shop/waypoint"),
            json!({"destination": "shop/waypoint"})
        );
    }

    #[test]
    fn principals_lose_their_scheme_and_presence_is_an_empty_list() {
        let exact = StringMatch::Exact("spiffe://td/ns/a/sa/b".into());
        assert_eq!(string_match(&exact, true), json!({"Exact": "td/ns/a/sa/b"}));
        assert_eq!(
            string_match(&exact, false),
            json!({"Exact": "spiffe://td/ns/a/sa/b"})
        );
        assert_eq!(
            string_match(&StringMatch::Suffix("/sa/b".into()), true),
            json!({"Suffix": "/sa/b"})
        );
        assert_eq!(
            string_match(&StringMatch::Any, true),
            json!({"Presence": []})
        );
    }
}
