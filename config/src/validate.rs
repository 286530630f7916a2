//! [`MeshConfig`] -> [`Mesh`]: every field checked, errors naming the file
//! (or the environment variable that set the field), the field path and the
//! problem; then the lookup indexes.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::ConfigError;
use crate::file::{
    CaConfig, ConditionConfig, LocalityConfig, MeshConfig, OperationConfig,
    PeerAuthenticationConfig, PolicyConfig, SourceConfig,
};
use crate::model::{
    Action, AuthorizationPolicy, CaPaths, CaService, Catalog, Condition, EndpointPorts,
    EnvOverride, Identity, Locality, Mesh, MtlsMode, Operation, PeerAuthentication, Rule, Service,
    ServiceAccountRef, Source, Values, Workload, DEFAULT_CA_TOKEN_FILE,
};
use crate::names::{check_label, check_subdomain, check_trust_domain, Cidr, StringMatch};

#[cfg(test)]
mod tests;

struct Ctx<'a> {
    origin: &'a str,
    overrides: &'a [EnvOverride],
}

impl Ctx<'_> {
    /// An error at `path`, reported against the environment variable that
    /// set the field, else against the file.
    fn err(&self, path: impl Into<String>, problem: impl Into<String>) -> ConfigError {
        let path = path.into();
        let origin = self
            .overrides
            .iter()
            .find(|o| {
                path.strip_prefix(o.field)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .map(|o| format!("environment variable {}", o.var))
            .unwrap_or_else(|| self.origin.to_owned());
        ConfigError::Field {
            origin,
            path,
            problem: problem.into(),
        }
    }
}

type Result<T> = std::result::Result<T, ConfigError>;

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
        let service = Service {
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

/// A workload address or VIP: an IP, not unspecified, multicast or broadcast.
/// A Kubernetes label value: empty, or at most 63 letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit.
fn check_label_value(s: &str) -> std::result::Result<(), String> {
    if s.is_empty() {
        return Ok(());
    }
    if s.len() > 63 {
        return Err(format!("{s:?}: {} characters is more than 63", s.len()));
    }
    if let Some(c) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{s:?} contains {:?} (only letters, digits, \"-\", \"_\" and \".\" are allowed)",
            c.to_string()
        ));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().last()) {
        return Err(format!("{s:?} must start and end with a letter or digit"));
    }
    Ok(())
}

/// A Kubernetes label key: `[prefix/]name`, the prefix a DNS subdomain, the
/// name as a non-empty label value.
fn check_label_key(k: &str) -> std::result::Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        check_subdomain("label key prefix", p)?;
    }
    if name.is_empty() {
        return Err(format!("label key {k:?} has an empty name"));
    }
    check_label_value(name).map_err(|p| format!("label key name {p}"))
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

fn unicast(text: &str) -> std::result::Result<IpAddr, String> {
    let ip: IpAddr = text
        .parse()
        .map_err(|_| format!("{text:?} is not an IP address"))?;
    let ip = ip.to_canonical();
    let unusable = ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if unusable {
        return Err(format!("{text:?} is not a unicast address"));
    }
    Ok(ip)
}

fn port_number(n: i64) -> std::result::Result<u16, String> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("port {n} is not a port (1..=65535)"))
}

/// A cluster object's name: `istio/<namespace>/<name>` (a form no file
/// policy name can take, so the two never collide).
fn cluster_name(name: &str) -> std::result::Result<(), String> {
    let parts: Vec<&str> = name.split('/').collect();
    let ["istio", ns, n] = parts[..] else {
        return Err(format!("{name:?} is not istio/<namespace>/<name>"));
    };
    check_label("namespace", ns)?;
    check_subdomain("name", n)
}

fn policy(cx: &Ctx<'_>, at: &str, p: &PolicyConfig, root: &str) -> Result<AuthorizationPolicy> {
    if p.origin.is_some() {
        cluster_name(&p.name).map_err(|e| cx.err(format!("{at}.name"), e))?;
    } else {
        check_subdomain("policy name", &p.name).map_err(|e| cx.err(format!("{at}.name"), e))?;
    }
    // A cluster object is mesh-wide when the mapping says so (it knows the
    // cluster's root namespace), never by the file's `rootNamespace`.
    let mesh_wide = p.namespace.is_empty() || (p.origin.is_none() && p.namespace == root);
    if !p.namespace.is_empty() {
        check_label("namespace", &p.namespace).map_err(|e| cx.err(format!("{at}.namespace"), e))?;
    }
    let namespace = if mesh_wide { root } else { &p.namespace };
    let (selector, match_labels) = match &p.selector {
        None => (None, None),
        Some(sel) => {
            if sel.workloads.is_empty() && sel.match_labels.is_empty() {
                return Err(cx.err(
                    format!("{at}.selector.workloads"),
                    "an empty list selects no workload (omit `selector` to apply the policy to \
                     every workload in its scope)",
                ));
            }
            for (j, name) in sel.workloads.iter().enumerate() {
                check_subdomain("workload name", name)
                    .map_err(|e| cx.err(format!("{at}.selector.workloads[{j}]"), e))?;
            }
            for (k, v) in &sel.match_labels {
                check_label_key(k).map_err(|e| cx.err(format!("{at}.selector.matchLabels"), e))?;
                check_label_value(v)
                    .map_err(|e| cx.err(format!("{at}.selector.matchLabels[{k}]"), e))?;
            }
            (
                (!sel.workloads.is_empty()).then(|| sel.workloads.clone()),
                (!sel.match_labels.is_empty()).then(|| sel.match_labels.clone()),
            )
        }
    };
    let action = if p.action.eq_ignore_ascii_case("allow") {
        Action::Allow
    } else if p.action.eq_ignore_ascii_case("deny") {
        Action::Deny
    } else {
        return Err(cx.err(
            format!("{at}.action"),
            format!("{:?} is not one of \"ALLOW\", \"DENY\"", p.action),
        ));
    };
    let mut rules = Vec::with_capacity(p.rules.len());
    for (r, rule) in p.rules.iter().enumerate() {
        let at = format!("{at}.rules[{r}]");
        let from = rule
            .from
            .iter()
            .enumerate()
            .map(|(s, src)| source(cx, &format!("{at}.from[{s}]"), src))
            .collect::<Result<Vec<_>>>()?;
        let to = rule
            .to
            .iter()
            .enumerate()
            .map(|(o, op)| operation(cx, &format!("{at}.to[{o}]"), op))
            .collect::<Result<Vec<_>>>()?;
        let when = rule
            .when
            .iter()
            .enumerate()
            .map(|(c, cond)| condition(cx, &format!("{at}.when[{c}]"), cond))
            .collect::<Result<Vec<_>>>()?;
        rules.push(Rule {
            from,
            to,
            when,
            clauses: Vec::new(),
        });
    }
    let qualified = match p.origin {
        Some(_) => p.name.clone(),
        None => format!("{namespace}/{}", p.name),
    };
    Ok(AuthorizationPolicy {
        name: p.name.clone(),
        namespace: namespace.to_owned(),
        mesh_wide,
        selector,
        match_labels,
        origin: p.origin.clone(),
        action,
        rules,
        listed: false,
        dry_run: false,
        qualified: qualified.into(),
    })
}

/// `when[]`: an L4 key, and at least one value.
fn condition(cx: &Ctx<'_>, at: &str, c: &ConditionConfig) -> Result<Condition> {
    if c.values.is_empty() && c.not_values.is_empty() {
        return Err(cx.err(at, "a condition needs `values` or `notValues`"));
    }
    fn values<T>(
        cx: &Ctx<'_>,
        at: &str,
        c: &ConditionConfig,
        each: impl Fn(&str) -> std::result::Result<T, String>,
    ) -> Result<Values<T>> {
        Ok(Values {
            values: list(cx, at, "values", &c.values, &each)?,
            not_values: list(cx, at, "notValues", &c.not_values, &each)?,
        })
    }
    let port = |v: &str| {
        v.parse::<i64>()
            .map_err(|_| format!("{v:?} is not a port (1..=65535)"))
            .and_then(port_number)
    };
    Ok(match c.key.as_str() {
        "source.ip" => Condition::SourceIp(values(cx, at, c, Cidr::parse)?),
        "source.namespace" => Condition::SourceNamespace(values(cx, at, c, namespace_pattern)?),
        "source.principal" => Condition::SourcePrincipal(values(cx, at, c, principal_pattern)?),
        "destination.ip" => Condition::DestinationIp(values(cx, at, c, Cidr::parse)?),
        "destination.port" => Condition::DestinationPort(values(cx, at, c, port)?),
        other => {
            return Err(cx.err(
                format!("{at}.key"),
                format!(
                    "{other:?} is not an L4 attribute (source.ip, source.namespace, \
                     source.principal, destination.ip, destination.port)"
                ),
            ))
        }
    })
}

/// `peerAuthentications[i]`.
fn peer_authentication(
    cx: &Ctx<'_>,
    at: &str,
    p: &PeerAuthenticationConfig,
) -> Result<PeerAuthentication> {
    cluster_name(&p.name).map_err(|e| cx.err(format!("{at}.name"), e))?;
    check_label("namespace", &p.namespace).map_err(|e| cx.err(format!("{at}.namespace"), e))?;
    if let Some(labels) = &p.match_labels {
        for (k, v) in labels {
            check_label_key(k).map_err(|e| cx.err(format!("{at}.selector.matchLabels"), e))?;
            check_label_value(v)
                .map_err(|e| cx.err(format!("{at}.selector.matchLabels[{k}]"), e))?;
        }
    }
    let mode = |path: String, m: &str| match m {
        "" | "UNSET" => Ok(MtlsMode::Unset),
        "PERMISSIVE" => Ok(MtlsMode::Permissive),
        "STRICT" => Ok(MtlsMode::Strict),
        other => Err(cx.err(
            path,
            format!("{other:?} is not one of UNSET, PERMISSIVE, STRICT"),
        )),
    };
    let mut port_modes = BTreeMap::new();
    for (port, m) in &p.port_modes {
        let path = format!("{at}.portLevelMtls[{port}]");
        let n = port_number(*port).map_err(|e| cx.err(&path, e))?;
        port_modes.insert(n, mode(path, m)?);
    }
    Ok(PeerAuthentication {
        name: p.name.clone().into(),
        namespace: p.namespace.clone(),
        mesh_wide: p.mesh_wide && p.match_labels.is_none(),
        match_labels: p.match_labels.clone(),
        mode: mode(format!("{at}.mtls.mode"), &p.mode)?,
        port_modes,
        origin: p.origin.clone(),
    })
}

/// Checks each value of the list `at.field` with `each`.
fn list<T>(
    cx: &Ctx<'_>,
    at: &str,
    field: &str,
    values: &[String],
    each: impl Fn(&str) -> std::result::Result<T, String>,
) -> Result<Vec<T>> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| each(v).map_err(|e| cx.err(format!("{at}.{field}[{i}]"), e)))
        .collect()
}

fn source(cx: &Ctx<'_>, at: &str, s: &SourceConfig) -> Result<Source> {
    if s == &SourceConfig::default() {
        return Err(cx.err(
            at,
            "a source needs at least one field (to match any source, leave `from` out)",
        ));
    }
    Ok(Source {
        namespaces: list(cx, at, "namespaces", &s.namespaces, namespace_pattern)?,
        not_namespaces: list(
            cx,
            at,
            "notNamespaces",
            &s.not_namespaces,
            namespace_pattern,
        )?,
        principals: list(cx, at, "principals", &s.principals, principal_pattern)?,
        not_principals: list(
            cx,
            at,
            "notPrincipals",
            &s.not_principals,
            principal_pattern,
        )?,
        service_accounts: list(
            cx,
            at,
            "serviceAccounts",
            &s.service_accounts,
            service_account,
        )?,
        not_service_accounts: list(
            cx,
            at,
            "notServiceAccounts",
            &s.not_service_accounts,
            service_account,
        )?,
        ip_blocks: list(cx, at, "ipBlocks", &s.ip_blocks, Cidr::parse)?,
        not_ip_blocks: list(cx, at, "notIpBlocks", &s.not_ip_blocks, Cidr::parse)?,
    })
}

fn operation(cx: &Ctx<'_>, at: &str, o: &OperationConfig) -> Result<Operation> {
    if o == &OperationConfig::default() {
        return Err(cx.err(
            at,
            "a destination needs at least one field (to match any port, leave `to` out)",
        ));
    }
    let list = |field: &str, values: &[i64]| {
        values
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                u16::try_from(n).ok().filter(|p| *p != 0).ok_or_else(|| {
                    cx.err(
                        format!("{at}.{field}[{i}]"),
                        format!("{n} is not a port (1..=65535)"),
                    )
                })
            })
            .collect::<Result<Vec<u16>>>()
    };
    Ok(Operation {
        ports: list("ports", &o.ports)?,
        not_ports: list("notPorts", &o.not_ports)?,
    })
}

/// `default`, `*`, `prod-*`, `*-system`.
pub(crate) fn namespace_pattern(text: &str) -> std::result::Result<StringMatch, String> {
    let m = StringMatch::parse(text)?;
    match &m {
        StringMatch::Any => {}
        StringMatch::Exact(ns) => check_label("namespace", ns)?,
        StringMatch::Prefix(part) | StringMatch::Suffix(part) => {
            if let Some(c) = part
                .chars()
                .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
            {
                return Err(format!(
                    "{text:?} is not a valid namespace pattern: contains {:?} (only lowercase \
                     letters, digits and \"-\" are allowed)",
                    c.to_string()
                ));
            }
        }
    }
    Ok(m)
}

/// `spiffe://<td>/ns/<ns>/sa/<sa>` (or Istio's form without `spiffe://`),
/// `*`, `prefix*`, `*suffix`.
pub(crate) fn principal_pattern(text: &str) -> std::result::Result<StringMatch, String> {
    const SHAPE: &str = "expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>, \
                         \"*\", or a prefix or suffix of one with \"*\" in place of the rest";
    if text.is_empty() {
        return Err("must not be empty".into());
    }
    let normalized;
    let full = if text.starts_with("spiffe://") || text.starts_with('*') {
        text
    } else {
        normalized = format!("spiffe://{text}");
        &normalized
    };
    let m = StringMatch::parse(full).map_err(|_| {
        format!("{text:?} is not a principal: \"*\" may appear once, at the start or at the end")
    })?;
    match &m {
        StringMatch::Any => {}
        StringMatch::Exact(id) => {
            Identity::from_spiffe_id(id)
                .map_err(|e| format!("{text:?} is not a principal: {}", e.reason()))?;
        }
        StringMatch::Prefix(part) | StringMatch::Suffix(part) => {
            if let Some(c) = part.chars().find(|c| {
                !(c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || matches!(c, '.' | '-' | '_' | '/' | ':'))
            }) {
                return Err(format!(
                    "{text:?} is not a principal: contains {:?}; {SHAPE}",
                    c.to_string()
                ));
            }
        }
    }
    Ok(m)
}

/// `namespace/serviceAccount`.
pub(crate) fn service_account(text: &str) -> std::result::Result<ServiceAccountRef, String> {
    let Some((ns, sa)) = text.split_once('/') else {
        return Err(format!("{text:?} is not <namespace>/<service account>"));
    };
    check_label("namespace", ns).map_err(|e| format!("{text:?}: {e}"))?;
    check_subdomain("service account", sa).map_err(|e| format!("{text:?}: {e}"))?;
    Ok(ServiceAccountRef {
        namespace: ns.to_owned(),
        name: sa.to_owned(),
    })
}
