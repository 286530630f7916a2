//! Authorization policies and PeerAuthentications of a [`MeshConfig`],
//! checked into the model's ([`AuthorizationPolicy`], [`PeerAuthentication`]).
//!
//! [`MeshConfig`]: crate::MeshConfig

use std::collections::BTreeMap;
use std::fmt;

use super::context::{Ctx, Result};
use super::value::{
    cluster_name, namespace_pattern, port_number, port_text, principal_pattern, service_account,
};
use crate::file::{
    ConditionConfig, OperationConfig, PeerAuthenticationConfig, PolicyConfig, SourceConfig,
};
use crate::model::{
    Action, AuthorizationPolicy, Condition, MtlsMode, Operation, PeerAuthentication, Rule, Source,
    Values,
};
use crate::names::{check_label, check_label_key, check_label_value, check_subdomain, Cidr};

pub(super) fn policy(
    cx: &Ctx<'_>,
    at: &str,
    p: &PolicyConfig,
    root: &str,
) -> Result<AuthorizationPolicy> {
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
    fn values<T, E: fmt::Display>(
        cx: &Ctx<'_>,
        at: &str,
        c: &ConditionConfig,
        each: impl Fn(&str) -> std::result::Result<T, E>,
    ) -> Result<Values<T>> {
        Ok(Values {
            values: list(cx, at, "values", &c.values, &each)?,
            not_values: list(cx, at, "notValues", &c.not_values, &each)?,
        })
    }
    Ok(match c.key.as_str() {
        "source.ip" => Condition::SourceIp(values(cx, at, c, Cidr::parse)?),
        "source.namespace" => Condition::SourceNamespace(values(cx, at, c, namespace_pattern)?),
        "source.principal" => Condition::SourcePrincipal(values(cx, at, c, principal_pattern)?),
        "destination.ip" => Condition::DestinationIp(values(cx, at, c, Cidr::parse)?),
        "destination.port" => Condition::DestinationPort(values(cx, at, c, port_text)?),
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
pub(super) fn peer_authentication(
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
fn list<T, E: fmt::Display>(
    cx: &Ctx<'_>,
    at: &str,
    field: &str,
    values: &[String],
    each: impl Fn(&str) -> std::result::Result<T, E>,
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
