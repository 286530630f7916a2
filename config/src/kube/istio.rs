//! The mesh's `security.istio.io` policy objects (`AuthorizationPolicy`,
//! `PeerAuthentication`, versions `v1` and `v1beta1`, which have the same
//! shape) -> entries of the file model, enforced as the reference's node
//! proxy enforces their L4 part. The rules and the reasons are in
//! `config/README.md` ("Policies from the cluster").
//!
//! The watch keeps each object's `spec` as raw JSON: an object whose spec
//! does not have the API's shape is one skipped object (named, with why),
//! never a failed watch.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::file::{
    ConditionConfig, OperationConfig, PeerAuthenticationConfig, PolicyConfig, RuleConfig,
    SelectorConfig, SourceConfig,
};
use crate::mesh::ClusterPolicyNote;

/// The reference's root namespace: its policies there apply mesh-wide.
pub const DEFAULT_ISTIO_ROOT_NAMESPACE: &str = "istio-system";

/// The API group of both kinds.
pub const SECURITY_GROUP: &str = "security.istio.io";

/// Which served version of `security.istio.io` a watch uses (the kinds'
/// "dynamic type": the same Rust type reads both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecurityVersion {
    /// `v1` (Istio 1.22 and later).
    #[default]
    V1,
    /// `v1beta1`.
    V1beta1,
}

impl SecurityVersion {
    /// `v1` or `v1beta1`.
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityVersion::V1 => "v1",
            SecurityVersion::V1beta1 => "v1beta1",
        }
    }

    /// The other version.
    pub fn other(self) -> SecurityVersion {
        match self {
            SecurityVersion::V1 => SecurityVersion::V1beta1,
            SecurityVersion::V1beta1 => SecurityVersion::V1,
        }
    }
}

macro_rules! istio_kind {
    ($ty:ident, $kind:literal, $plural:literal) => {
        #[doc = concat!("A `security.istio.io` `", $kind, "` as the watch keeps it: its metadata and its raw `spec`.")]
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct $ty {
            /// The object's metadata.
            pub metadata: ObjectMeta,
            /// The spec, as the API server sent it (read by the mapping).
            #[serde(default)]
            pub spec: Value,
        }

        impl ::kube::Resource for $ty {
            type DynamicType = SecurityVersion;
            type Scope = NamespaceResourceScope;

            fn kind(_: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed(SECURITY_GROUP)
            }
            fn version(v: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed(v.as_str())
            }
            fn plural(_: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

istio_kind!(
    AuthorizationPolicyObject,
    "AuthorizationPolicy",
    "authorizationpolicies"
);
istio_kind!(
    PeerAuthenticationObject,
    "PeerAuthentication",
    "peerauthentications"
);

// ---- The API's shapes (the fields the mapping reads; anything else is kept
// in `other` so that an attribute this proxy does not know is never
// silently dropped from a rule). ----

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct WorkloadSelector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct AuthorizationPolicySpec {
    selector: Option<WorkloadSelector>,
    target_ref: Option<Value>,
    target_refs: Vec<Value>,
    action: Option<String>,
    // `provider` (CUSTOM only) and any other top-level field are not read.
    rules: Vec<RuleSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RuleSpec {
    from: Vec<FromSpec>,
    to: Vec<ToSpec>,
    when: Vec<ConditionSpec>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct FromSpec {
    source: SourceSpec,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct SourceSpec {
    principals: Vec<String>,
    not_principals: Vec<String>,
    namespaces: Vec<String>,
    not_namespaces: Vec<String>,
    service_accounts: Vec<String>,
    not_service_accounts: Vec<String>,
    ip_blocks: Vec<String>,
    not_ip_blocks: Vec<String>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ToSpec {
    operation: OperationSpec,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct OperationSpec {
    ports: Vec<String>,
    not_ports: Vec<String>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ConditionSpec {
    key: String,
    values: Vec<String>,
    not_values: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct PeerAuthenticationSpec {
    selector: Option<WorkloadSelector>,
    mtls: Option<MtlsSpec>,
    port_level_mtls: BTreeMap<String, MtlsSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct MtlsSpec {
    mode: Option<String>,
}

/// The `when` keys a node proxy can see (the reference's list).
pub const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

/// How the mapping reads the objects.
#[derive(Debug, Clone)]
pub(crate) struct PolicyContext<'a> {
    /// Objects here apply mesh-wide.
    pub root_namespace: &'a str,
}

/// What the mapping made: the entries, and what was skipped or changed.
#[derive(Debug, Default)]
pub(crate) struct MappedPolicies {
    pub policies: Vec<PolicyConfig>,
    pub peer_authentications: Vec<PeerAuthenticationConfig>,
    pub notes: Vec<ClusterPolicyNote>,
}

/// `Kind namespace/name`.
fn object_name(kind: &str, meta: &ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// The entry name of a cluster object: `istio/<ns>/<name>`.
fn entry_name(meta: &ObjectMeta) -> String {
    format!(
        "istio/{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

fn note(
    object: &str,
    kind: &'static str,
    skipped: bool,
    code: &'static str,
    reason: String,
) -> ClusterPolicyNote {
    ClusterPolicyNote {
        object: object.to_owned(),
        kind,
        skipped,
        code,
        reason,
    }
}

/// Objects sorted oldest first (the reference's tie-break: the oldest
/// PeerAuthentication of a scope wins), then by namespace and name.
fn oldest_first<T>(objects: &[Arc<T>], meta: impl Fn(&T) -> &ObjectMeta) -> Vec<&T> {
    let mut sorted: Vec<&T> = objects.iter().map(|o| &**o).collect();
    sorted.sort_by(|a, b| {
        let (a, b) = (meta(a), meta(b));
        (
            a.creation_timestamp.as_ref(),
            a.namespace.as_deref(),
            a.name.as_deref(),
        )
            .cmp(&(
                b.creation_timestamp.as_ref(),
                b.namespace.as_deref(),
                b.name.as_deref(),
            ))
    });
    sorted
}

/// Maps every object; an object that cannot be mapped is left out with a
/// note (`skipped`), a mapped one that lost a part gets a note too.
pub(crate) fn map_policies(
    authorization_policies: &[Arc<AuthorizationPolicyObject>],
    peer_authentications: &[Arc<PeerAuthenticationObject>],
    cx: &PolicyContext<'_>,
) -> MappedPolicies {
    let mut out = MappedPolicies::default();
    for obj in oldest_first(authorization_policies, |o| &o.metadata) {
        if let Some(p) = authorization_policy(obj, cx, &mut out.notes) {
            out.policies.push(p);
        }
    }
    for obj in oldest_first(peer_authentications, |o| &o.metadata) {
        if let Some(p) = peer_authentication(obj, cx, &mut out.notes) {
            out.peer_authentications.push(p);
        }
    }
    out
}

const AP: &str = "AuthorizationPolicy";
const PA: &str = "PeerAuthentication";

/// One AuthorizationPolicy -> a policy entry, or `None` (skipped, noted).
pub(crate) fn authorization_policy(
    obj: &AuthorizationPolicyObject,
    cx: &PolicyContext<'_>,
    notes: &mut Vec<ClusterPolicyNote>,
) -> Option<PolicyConfig> {
    let object = object_name(AP, &obj.metadata);
    let spec: AuthorizationPolicySpec = match parse_spec(&obj.spec) {
        Ok(spec) => spec,
        Err(e) => {
            notes.push(note(&object, AP, true, "invalid", format!("spec: {e}")));
            return None;
        }
    };
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        notes.push(note(
            &object,
            AP,
            true,
            "target-ref",
            "targetRef/targetRefs: the policy is for another proxy (a waypoint or gateway), \
             not the node proxy"
                .into(),
        ));
        return None;
    }
    let action = match spec.action.as_deref().unwrap_or("ALLOW") {
        "ALLOW" => "ALLOW",
        "DENY" => "DENY",
        a @ ("AUDIT" | "CUSTOM") => {
            notes.push(note(
                &object,
                AP,
                true,
                "unsupported-action",
                format!("action {a} is not enforced by a node proxy"),
            ));
            return None;
        }
        other => {
            notes.push(note(
                &object,
                AP,
                true,
                "invalid",
                format!("action {other:?} is not ALLOW, DENY, AUDIT or CUSTOM"),
            ));
            return None;
        }
    };
    let allow = action == "ALLOW";
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let rule_namespace = namespace.clone();
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let mut l7: Vec<String> = Vec::new();
        let mapped = map_rule(rule, &rule_namespace, &mut l7);
        match mapped {
            Err(e) => {
                notes.push(note(
                    &object,
                    AP,
                    true,
                    "invalid",
                    format!("rules[{i}]: {e}"),
                ));
                return None;
            }
            Ok(_) if allow && !l7.is_empty() => notes.push(note(
                &object,
                AP,
                false,
                "l7-rule-omitted",
                format!(
                    "rules[{i}] has attributes a node proxy cannot see ({}): within an ALLOW \
                     policy the rule is omitted (it allows nothing)",
                    l7.join(", ")
                ),
            )),
            Ok(r) => {
                if !l7.is_empty() {
                    notes.push(note(
                        &object,
                        AP,
                        false,
                        "l7-attributes-ignored",
                        format!(
                            "rules[{i}] has attributes a node proxy cannot see ({}): the DENY \
                             rule is enforced without them (more restrictive than written)",
                            l7.join(", ")
                        ),
                    ));
                }
                rules.push(r);
            }
        }
    }
    let selector = spec
        .selector
        .filter(|s| !s.match_labels.is_empty())
        .map(|s| SelectorConfig {
            workloads: Vec::new(),
            match_labels: s.match_labels,
        });
    Some(PolicyConfig {
        name: entry_name(&obj.metadata),
        namespace: if namespace == cx.root_namespace {
            String::new()
        } else {
            namespace
        },
        selector,
        action: action.to_owned(),
        rules,
        origin: Some(object),
    })
}

fn parse_spec<T: serde::de::DeserializeOwned + Default>(spec: &Value) -> Result<T, String> {
    if spec.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(spec.clone()).map_err(|e| e.to_string())
}

/// The names of the non-empty fields of `other` (attributes this proxy
/// does not enforce).
fn extra_fields(other: &BTreeMap<String, Value>, l7: &mut Vec<String>) {
    for (k, v) in other {
        let empty = v.is_null() || v.as_array().is_some_and(|a| a.is_empty());
        if !empty {
            l7.push(k.clone());
        }
    }
}

/// One rule, its L7 attributes named in `l7` (and left out: the caller
/// omits the whole rule of an ALLOW policy that has any).
fn map_rule(
    rule: &RuleSpec,
    rule_namespace: &str,
    l7: &mut Vec<String>,
) -> Result<RuleConfig, String> {
    extra_fields(&rule.other, l7);
    let mut from = Vec::new();
    let mut any_source = false;
    for f in &rule.from {
        extra_fields(&f.other, l7);
        let s = &f.source;
        extra_fields(&s.other, l7);
        let account = |sa: &String| {
            if sa.contains('/') {
                sa.clone()
            } else {
                format!("{rule_namespace}/{sa}")
            }
        };
        let source = SourceConfig {
            namespaces: s.namespaces.clone(),
            not_namespaces: s.not_namespaces.clone(),
            principals: principals(&s.principals),
            not_principals: principals(&s.not_principals),
            service_accounts: s.service_accounts.iter().map(account).collect(),
            not_service_accounts: s.not_service_accounts.iter().map(account).collect(),
            ip_blocks: s.ip_blocks.clone(),
            not_ip_blocks: s.not_ip_blocks.clone(),
        };
        // A source with no L4 field matches every peer (as in the
        // reference): so does the whole `from`.
        if source == SourceConfig::default() {
            any_source = true;
        }
        from.push(source);
    }
    if any_source {
        from.clear();
    }
    let mut to = Vec::new();
    let mut any_port = false;
    for t in &rule.to {
        extra_fields(&t.other, l7);
        let op = &t.operation;
        extra_fields(&op.other, l7);
        let operation = OperationConfig {
            ports: ports(&op.ports)?,
            not_ports: ports(&op.not_ports)?,
        };
        if operation == OperationConfig::default() {
            any_port = true;
        }
        to.push(operation);
    }
    if any_port {
        to.clear();
    }
    let mut when = Vec::new();
    for c in &rule.when {
        if !L4_WHEN_KEYS.contains(&c.key.as_str()) {
            l7.push(format!("when {}", c.key));
            continue;
        }
        let expand = |v: &[String]| {
            if c.key == "source.principal" {
                principals(v)
            } else {
                v.to_vec()
            }
        };
        when.push(ConditionConfig {
            key: c.key.clone(),
            values: expand(&c.values),
            not_values: expand(&c.not_values),
        });
    }
    Ok(RuleConfig { from, to, when })
}

fn ports(list: &[String]) -> Result<Vec<i64>, String> {
    list.iter()
        .map(|p| {
            p.parse::<i64>()
                .map_err(|_| format!("port {p:?} is not a number"))
        })
        .collect()
}

/// Principals as the reference's node proxy matches them: passed through
/// unchanged (its conversion rewrites no trust domain, so
/// `cluster.local/...` names only `cluster.local`, whatever this mesh's
/// trust domain and aliases are); `*`, `prefix*` and `*suffix` globs are
/// kept as written.
pub(crate) fn principals(list: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in list {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

/// One PeerAuthentication -> an entry, or `None` (skipped, noted).
pub(crate) fn peer_authentication(
    obj: &PeerAuthenticationObject,
    cx: &PolicyContext<'_>,
    notes: &mut Vec<ClusterPolicyNote>,
) -> Option<PeerAuthenticationConfig> {
    let object = object_name(PA, &obj.metadata);
    let spec: PeerAuthenticationSpec = match parse_spec(&obj.spec) {
        Ok(spec) => spec,
        Err(e) => {
            notes.push(note(&object, PA, true, "invalid", format!("spec: {e}")));
            return None;
        }
    };
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let labels = spec
        .selector
        .map(|s| s.match_labels)
        .filter(|l| !l.is_empty());
    if labels.is_some() && namespace == cx.root_namespace {
        notes.push(note(
            &object,
            PA,
            true,
            "root-selector",
            "a PeerAuthentication with a selector in the root namespace is ignored (as by the \
             reference)"
                .into(),
        ));
        return None;
    }
    let mut mode_of = |at: &str, m: Option<&MtlsSpec>| -> String {
        match m.and_then(|m| m.mode.as_deref()).unwrap_or("UNSET") {
            "DISABLE" => {
                notes.push(note(
                    &object,
                    PA,
                    false,
                    "disable-as-permissive",
                    format!(
                        "{at}: DISABLE is not supported by a node proxy (the mesh's traffic is \
                         always mutual TLS); it is PERMISSIVE"
                    ),
                ));
                "PERMISSIVE".into()
            }
            other => other.to_owned(),
        }
    };
    let mode = mode_of("mtls.mode", spec.mtls.as_ref());
    let mut port_modes = Vec::new();
    if labels.is_none() && !spec.port_level_mtls.is_empty() {
        notes.push(note(
            &object,
            PA,
            false,
            "port-level-without-selector",
            "portLevelMtls is ignored without a selector (as by the reference)".into(),
        ));
    } else {
        for (port, m) in &spec.port_level_mtls {
            let Ok(n) = port.parse::<i64>() else {
                notes.push(note(
                    &object,
                    PA,
                    true,
                    "invalid",
                    format!("portLevelMtls: {port:?} is not a port number"),
                ));
                return None;
            };
            let m = mode_of(&format!("portLevelMtls[{port}]"), Some(m));
            port_modes.push((n, m));
        }
    }
    Some(PeerAuthenticationConfig {
        name: entry_name(&obj.metadata),
        mesh_wide: namespace == cx.root_namespace,
        namespace,
        match_labels: labels,
        mode,
        port_modes,
        origin: object,
    })
}

#[cfg(test)]
mod tests;
