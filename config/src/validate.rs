//! [`MeshConfig`] -> [`Mesh`]: every field checked, errors naming the file
//! (or the environment variable that set the field), the field path and the
//! problem; then the lookup indexes.
//!
//! `context` says where an error is reported, `value` checks single values
//! (addresses, ports, patterns), `policy` the policies and
//! PeerAuthentications; this module the rest and the whole.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod context;
mod policy;
mod value;

use self::context::{Ctx, Result};
use self::policy::{peer_authentication, policy};
// The Kubernetes source reads the cluster's policies with the same checks.
#[cfg(feature = "kube")]
pub(crate) use self::value::{namespace_pattern, principal_pattern, service_account};
use self::value::{port_number, unicast};
use crate::error::ConfigError;
use crate::file::{CaConfig, LoadBalancingConfig, LocalityConfig, MeshConfig};
use crate::model::{
    CaPaths, CaService, Catalog, EndpointPorts, EnvOverride, LbMode, LoadBalancing, Locality, Mesh,
    PeerAuthentication, Scope, Service, Workload, DEFAULT_CA_TOKEN_FILE,
};
use crate::names::{
    check_label, check_label_key, check_label_value, check_subdomain, check_trust_domain,
};

#[cfg(test)]
mod tests;

pub(crate) fn validate(
    cfg: &MeshConfig,
    origin: &str,
    overrides: &[EnvOverride],
    revision: u64,
) -> Result<Mesh> {
    let cx = Ctx { origin, overrides };

    cfg.proxy.validate().map_err(|e| match e {
        ConfigError::Invalid { field, problem } => cx.err(format!("proxy.{field}"), problem),
        other => other,
    })?;
    check_trust_domain(&cfg.trust_domain).map_err(|p| cx.err("trustDomain", p))?;
    check_label("namespace", &cfg.root_namespace).map_err(|p| cx.err("rootNamespace", p))?;
    let (ca, ca_service) = match cfg.ca.as_ref() {
        None => (None, None),
        Some(ca) => ca_source(&cx, ca)?,
    };

    let mut catalog = Catalog::default();
    let mut workload_by_uid: HashMap<String, usize> = HashMap::new();
    let mut workload_by_ip: HashMap<IpAddr, usize> = HashMap::new();
    for (i, w) in cfg.workloads.iter().enumerate() {
        let at = format!("workloads[{i}]");
        if w.uid.is_empty() {
            return Err(cx.err(format!("{at}.uid"), "must not be empty"));
        }
        if w.uid.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(cx.err(
                format!("{at}.uid"),
                format!("{:?} contains whitespace or control characters", w.uid),
            ));
        }
        if let Some(&prev) = workload_by_uid.get(&w.uid) {
            return Err(cx.err(
                format!("{at}.uid"),
                format!("{:?} is already the uid of workloads[{prev}]", w.uid),
            ));
        }
        check_subdomain("workload name", &w.name).map_err(|p| cx.err(format!("{at}.name"), p))?;
        check_label("namespace", &w.namespace).map_err(|p| cx.err(format!("{at}.namespace"), p))?;
        // An empty service account is a workload with no identity (a
        // cluster's static pod): it cannot speak HBONE.
        if w.service_account.is_empty() {
            if w.tunnel {
                return Err(cx.err(
                    format!("{at}.serviceAccount"),
                    "a workload without a service account has no identity and cannot speak HBONE (tunnel: true)",
                ));
            }
        } else {
            check_subdomain("service account", &w.service_account)
                .map_err(|p| cx.err(format!("{at}.serviceAccount"), p))?;
        }
        check_subdomain("node name", &w.node).map_err(|p| cx.err(format!("{at}.node"), p))?;
        if w.ips.is_empty() {
            return Err(cx.err(
                format!("{at}.ips"),
                "a workload needs at least one IP address",
            ));
        }
        let mut ips = Vec::with_capacity(w.ips.len());
        for (j, text) in w.ips.iter().enumerate() {
            let ip = unicast(text).map_err(|p| cx.err(format!("{at}.ips[{j}]"), p))?;
            if let Some(&prev) = workload_by_ip.get(&ip) {
                let owner = &cfg.workloads[prev];
                return Err(cx.err(
                    format!("{at}.ips[{j}]"),
                    format!(
                        "{text:?} is already an address of workloads[{prev}] ({}/{})",
                        owner.namespace, owner.name
                    ),
                ));
            }
            workload_by_ip.insert(ip, i);
            ips.push(ip);
        }
        workload_by_uid.insert(w.uid.clone(), i);
        catalog.upsert_workload(Workload {
            host_network: false,
            uid: w.uid.clone(),
            name: w.name.clone(),
            namespace: w.namespace.clone(),
            service_account: w.service_account.clone(),
            ips,
            node: w.node.clone(),
            tunnel: w.tunnel,
            healthy: w.healthy,
            labels: pod_labels(&cx, &at, &w.labels)?,
            locality: locality(&cx, &format!("{at}.locality"), &w.locality)?,
            workload_name: match w.workload_name.as_deref() {
                None => w.name.clone(),
                Some(n) => {
                    check_subdomain("workload name", n)
                        .map_err(|p| cx.err(format!("{at}.workloadName"), p))?;
                    n.to_owned()
                }
            },
            trust_domain: None,
            canonical: None,
            unsupported: None,
            authorization_policies: Vec::new(),
        });
    }

    let mut service_by_vip: HashMap<IpAddr, usize> = HashMap::new();
    let mut memberships: BTreeMap<&str, BTreeMap<Arc<str>, EndpointPorts>> = BTreeMap::new();
    let mut service_names: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, s) in cfg.services.iter().enumerate() {
        let at = format!("services[{i}]");
        check_subdomain("host name", &s.hostname)
            .map_err(|p| cx.err(format!("{at}.hostname"), p))?;
        check_label("namespace", &s.namespace).map_err(|p| cx.err(format!("{at}.namespace"), p))?;
        if let Some(prev) = service_names.insert((&s.hostname, &s.namespace), i) {
            return Err(cx.err(
                format!("{at}.hostname"),
                format!(
                    "{:?} in namespace {:?} is already defined by services[{prev}]",
                    s.hostname, s.namespace
                ),
            ));
        }
        let mut vips = Vec::with_capacity(s.vips.len());
        for (j, text) in s.vips.iter().enumerate() {
            let path = format!("{at}.vips[{j}]");
            let ip = unicast(text).map_err(|p| cx.err(&path, p))?;
            if let Some(&prev) = service_by_vip.get(&ip) {
                return Err(cx.err(
                    path,
                    format!(
                        "{text:?} is already a VIP of services[{prev}] ({})",
                        cfg.services[prev].hostname
                    ),
                ));
            }
            if let Some(&w) = workload_by_ip.get(&ip) {
                let owner = &cfg.workloads[w];
                return Err(cx.err(
                    path,
                    format!(
                        "{text:?} is an address of workloads[{w}] ({}/{})",
                        owner.namespace, owner.name
                    ),
                ));
            }
            service_by_vip.insert(ip, i);
            vips.push(ip);
        }
        let mut ports = BTreeMap::new();
        for &(port, target) in &s.ports.0 {
            let path = format!("{at}.ports[{port}]");
            let port = port_number(port).map_err(|p| cx.err(&path, format!("service {p}")))?;
            let target = port_number(target).map_err(|p| cx.err(&path, format!("target {p}")))?;
            ports.insert(port, target);
        }
        for (j, uid) in s.endpoints.iter().enumerate() {
            let path = format!("{at}.endpoints[{j}]");
            if !workload_by_uid.contains_key(uid) {
                return Err(cx.err(path, format!("no workload has uid {uid:?}")));
            }
            if s.endpoints[..j].contains(uid) {
                return Err(cx.err(path, format!("{uid:?} is listed twice")));
            }
        }
        let load_balancing = s
            .load_balancing
            .as_ref()
            .map(|lb| load_balancing(&cx, &format!("{at}.loadBalancing"), lb))
            .transpose()?;
        let service = Service {
            load_balancing,
            hostname: s.hostname.clone(),
            namespace: s.namespace.clone(),
            vips,
            ports,
            unsupported: None,
        };
        let key: Arc<str> = Arc::from(service.key());
        for uid in &s.endpoints {
            memberships
                .entry(uid)
                .or_default()
                .insert(key.clone(), EndpointPorts::default());
        }
        catalog.upsert_service(key, service);
    }
    for (uid, services) in memberships {
        catalog.set_memberships(uid, services);
    }

    let mut policy_names: HashMap<Arc<str>, usize> = HashMap::new();
    for (i, p) in cfg.policies.iter().enumerate() {
        let policy = policy(&cx, &format!("policies[{i}]"), p, &cfg.root_namespace)?;
        if let Some(prev) = policy_names.insert(policy.qualified.clone(), i) {
            return Err(cx.err(
                format!("policies[{i}].name"),
                format!(
                    "{:?} is already defined by policies[{prev}]",
                    &*policy.qualified
                ),
            ));
        }
        catalog.upsert_policy(i as u32, policy);
    }
    let mut peer_authentications = Vec::with_capacity(cfg.peer_authentications.len());
    for (i, p) in cfg.peer_authentications.iter().enumerate() {
        let at = format!("peerAuthentications[{i}]");
        let pa = peer_authentication(&cx, &at, p)?;
        if peer_authentications
            .iter()
            .any(|o: &PeerAuthentication| o.name == pa.name)
        {
            return Err(cx.err(
                format!("{at}.name"),
                format!("{:?} is listed twice", &*pa.name),
            ));
        }
        peer_authentications.push(pa);
    }
    for (i, alias) in cfg.trust_domain_aliases.iter().enumerate() {
        check_trust_domain(alias).map_err(|e| cx.err(format!("trustDomainAliases[{i}]"), e))?;
    }

    Ok(Mesh {
        proxy: cfg.proxy.clone(),
        trust_domain: cfg.trust_domain.clone(),
        root_namespace: cfg.root_namespace.clone(),
        ca,
        ca_service,
        catalog,
        complete: true,
        peer_authentications,
        cluster_policy_notes: Vec::new(),
        cluster_id: cluster_id(&cx, &cfg.cluster_id)?,
        locality: locality(&cx, "locality", &cfg.locality)?,
        origin: origin.to_owned(),
        revision,
        env_overrides: overrides.to_vec(),
        #[cfg(feature = "kube")]
        source: None,
    })
}

/// `ca`: the local-key mode (`certFile` + `keyFile`) or the service mode
/// (`address` + `rootCertFile`, `tokenFile`), never a mix.
fn ca_source(cx: &Ctx<'_>, ca: &CaConfig) -> Result<(Option<CaPaths>, Option<CaService>)> {
    let file = |path: String, text: &str| -> Result<PathBuf> {
        if text.is_empty() {
            return Err(cx.err(path, "must not be empty"));
        }
        if !Path::new(text).is_absolute() {
            return Err(cx.err(
                path,
                format!("{text:?} is a relative path; CA files must be absolute paths"),
            ));
        }
        Ok(PathBuf::from(text))
    };
    let bundle_files = ca
        .bundle_files
        .iter()
        .enumerate()
        .map(|(i, f)| file(format!("ca.bundleFiles[{i}]"), f))
        .collect::<Result<Vec<_>>>()?;
    let local = ca.cert_file.is_some() || ca.key_file.is_some();
    let service = ca.address.is_some()
        || ca.server_name.is_some()
        || ca.root_cert_file.is_some()
        || ca.token_file.is_some();
    match (local, service) {
        (true, true) => Err(cx.err(
            String::from("ca"),
            "certFile/keyFile (the local CA) and address/serverName/rootCertFile/tokenFile \
             (a certificate service) exclude each other: choose one mode",
        )),
        (false, false) => Err(cx.err(
            String::from("ca"),
            "needs certFile and keyFile (the local CA) or address and rootCertFile (a certificate service)",
        )),
        (true, false) => {
            let cert = ca
                .cert_file
                .as_deref()
                .ok_or_else(|| cx.err(String::from("ca.certFile"), "is required with ca.keyFile"))?;
            let key = ca
                .key_file
                .as_deref()
                .ok_or_else(|| cx.err(String::from("ca.keyFile"), "is required with ca.certFile"))?;
            Ok((
                Some(CaPaths {
                    cert_file: file("ca.certFile".into(), cert)?,
                    key_file: file("ca.keyFile".into(), key)?,
                    bundle_files,
                }),
                None,
            ))
        }
        (false, true) => {
            let address = ca
                .address
                .as_deref()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| cx.err(String::from("ca.address"), "is required for a certificate service"))?;
            let (host, port) = address.rsplit_once(':').ok_or_else(|| {
                cx.err(String::from("ca.address"), format!("{address:?} is not host:port"))
            })?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(cx.err(String::from("ca.address"), format!("{address:?} is not host:port")));
            }
            let root = ca.root_cert_file.as_deref().ok_or_else(|| {
                cx.err(
                    "ca.rootCertFile",
                    "is required for a certificate service (the root its certificate chains to)",
                )
            })?;
            let server_name = match ca.server_name.as_deref() {
                Some("") => return Err(cx.err(String::from("ca.serverName"), "must not be empty")),
                Some(n) => n.to_owned(),
                None => host.to_owned(),
            };
            Ok((
                None,
                Some(CaService {
                    address: address.to_owned(),
                    server_name,
                    root_cert_file: file("ca.rootCertFile".into(), root)?,
                    token_file: file(
                        "ca.tokenFile".to_owned(),
                        ca.token_file.as_deref().unwrap_or(DEFAULT_CA_TOKEN_FILE),
                    )?,
                    bundle_files,
                }),
            ))
        }
    }
}

/// `workloads[].labels`, checked as Kubernetes checks them.
fn pod_labels(
    cx: &Ctx<'_>,
    at: &str,
    labels: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>> {
    for (k, v) in labels {
        check_label_key(k).map_err(|p| cx.err(format!("{at}.labels"), p))?;
        check_label_value(v).map_err(|p| cx.err(format!("{at}.labels[{k}]"), p))?;
    }
    Ok(labels.clone())
}

/// A region and zone: label values (they come from node labels).
fn locality(cx: &Ctx<'_>, at: &str, l: &LocalityConfig) -> Result<Locality> {
    check_label_value(&l.region).map_err(|p| cx.err(format!("{at}.region"), p))?;
    check_label_value(&l.zone).map_err(|p| cx.err(format!("{at}.zone"), p))?;
    Ok(Locality {
        subzone: String::new(),
        region: l.region.clone(),
        zone: l.zone.clone(),
    })
}

/// `clusterId`: a non-empty label value (it becomes a metric label).
fn cluster_id(cx: &Ctx<'_>, id: &str) -> Result<String> {
    if id.is_empty() {
        return Err(cx.err("clusterId", "must not be empty"));
    }
    check_label_value(id).map_err(|p| cx.err("clusterId", p))?;
    Ok(id.to_owned())
}

/// `services[].loadBalancing`: every word checked, none guessed.
fn load_balancing(cx: &Ctx<'_>, at: &str, lb: &LoadBalancingConfig) -> Result<LoadBalancing> {
    let mut routing_preference = Vec::with_capacity(lb.routing_preference.len());
    for (i, scope) in lb.routing_preference.iter().enumerate() {
        let scope = match scope.as_str() {
            "region" => Scope::Region,
            "zone" => Scope::Zone,
            "subzone" => Scope::Subzone,
            "node" => Scope::Node,
            "cluster" => Scope::Cluster,
            "network" => Scope::Network,
            other => {
                return Err(cx.err(
                    format!("{at}.routingPreference[{i}]"),
                    format!(
                        "{other:?} is not a scope (region, zone, subzone, node, cluster, network)"
                    ),
                ))
            }
        };
        if routing_preference.contains(&scope) {
            return Err(cx.err(
                format!("{at}.routingPreference[{i}]"),
                format!("{:?} is listed twice", lb.routing_preference[i]),
            ));
        }
        routing_preference.push(scope);
    }
    let mode = match lb.mode.as_deref() {
        None | Some("failover") => LbMode::Failover,
        Some("strict") => LbMode::Strict,
        Some("passthrough") => LbMode::Passthrough,
        Some(other) => {
            return Err(cx.err(
                format!("{at}.mode"),
                format!("{other:?} is not a mode (strict, failover, passthrough)"),
            ))
        }
    };
    let allow_unhealthy = match lb.health_policy.as_deref() {
        None | Some("onlyHealthy") => false,
        Some("allowAll") => true,
        Some(other) => {
            return Err(cx.err(
                format!("{at}.healthPolicy"),
                format!("{other:?} is not a health policy (onlyHealthy, allowAll)"),
            ))
        }
    };
    Ok(LoadBalancing {
        routing_preference,
        mode,
        allow_unhealthy,
    })
}
