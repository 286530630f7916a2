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
use crate::model::ClusterPolicyNote;
use crate::names::Cidr;
use crate::validate::{namespace_pattern, principal_pattern, service_account};

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
    #[serde(deserialize_with = "strings_or_numbers")]
    ports: Vec<String>,
    #[serde(deserialize_with = "strings_or_numbers")]
    not_ports: Vec<String>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ConditionSpec {
    key: String,
    #[serde(deserialize_with = "strings_or_numbers")]
    values: Vec<String>,
    #[serde(deserialize_with = "strings_or_numbers")]
    not_values: Vec<String>,
}

/// A list whose entries the API takes as strings or integers (ports: `"22"`
/// or `22`), read as strings; anything else is an error naming it.
fn strings_or_numbers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Item {
        Text(String),
        Number(serde_json::Number),
    }
    let items: Option<Vec<Item>> = Option::deserialize(d)?;
    Ok(items
        .unwrap_or_default()
        .into_iter()
        .map(|i| match i {
            Item::Text(s) => s,
            Item::Number(n) => n.to_string(),
        })
        .collect())
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
        Err(e) if targets_another_proxy(&obj.spec) => {
            notes.push(note(
                &object,
                AP,
                true,
                "target-ref",
                format!("spec: {e}; targetRef/targetRefs: the policy is for another proxy"),
            ));
            return None;
        }
        Err(e) => {
            let p = deny_everything_selected(obj, cx);
            notes.push(note(
                &object,
                AP,
                false,
                "unreadable-deny-all",
                format!(
                    "spec: {e}: a policy that cannot be read denies every connection to what it \
                     could select ({})",
                    scope_of(&p)
                ),
            ));
            return Some(p);
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
            let p = deny_everything_selected(obj, cx);
            notes.push(note(
                &object,
                AP,
                false,
                "unreadable-deny-all",
                format!(
                    "action {other:?} is not ALLOW, DENY, AUDIT or CUSTOM (the API's values): \
                     the policy denies every connection to what it could select ({})",
                    scope_of(&p)
                ),
            ));
            return Some(p);
        }
    };
    let allow = action == "ALLOW";
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let rule_namespace = namespace.clone();
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let mut l7: Vec<String> = Vec::new();
        let mut entry_notes = Vec::new();
        let mapped = {
            let mut cx = RuleCx {
                object: &object,
                at: format!("rules[{i}]"),
                allow,
                notes: &mut entry_notes,
            };
            map_rule(rule, &rule_namespace, &mut cx, &mut l7)
        };
        if allow && !l7.is_empty() {
            notes.push(note(
                &object,
                AP,
                false,
                "l7-rule-omitted",
                format!(
                    "rules[{i}] has attributes a node proxy cannot see ({}): within an ALLOW \
                     policy the rule is omitted (it allows nothing)",
                    l7.join(", ")
                ),
            ));
            continue;
        }
        notes.append(&mut entry_notes);
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
        match mapped {
            Some(r) => rules.push(r),
            None => notes.push(note(
                &object,
                AP,
                false,
                "rule-never-matches",
                format!(
                    "rules[{i}] can match no connection (a part of it has only entries that \
                     never match, or none left): it is left out ({})",
                    if allow {
                        "it allows nothing"
                    } else {
                        "it denies nothing"
                    }
                ),
            )),
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

/// Whether a spec (readable or not) names a `targetRef`: a policy for a
/// waypoint or gateway, not for the node proxy.
fn targets_another_proxy(spec: &Value) -> bool {
    let Some(obj) = spec.as_object() else {
        return false;
    };
    ["targetRef", "targetRefs"].iter().any(|k| {
        obj.get(*k)
            .is_some_and(|v| !v.is_null() && v != &Value::Array(Vec::new()))
    })
}

/// The labels of a raw `selector.matchLabels` when they can be read (a map
/// of strings, not empty); `None` otherwise.
fn readable_selector(spec: &Value) -> Option<BTreeMap<String, String>> {
    let labels = spec.get("selector")?.get("matchLabels")?;
    let map: BTreeMap<String, String> = serde_json::from_value(labels.clone()).ok()?;
    (!map.is_empty()).then_some(map)
}

/// What stands for an AuthorizationPolicy that cannot be understood: a DENY
/// of every connection to what it could select: its selector when that can
/// be read, else its namespace (every workload, in the root namespace).
/// Whether it meant to allow or deny, nothing it selects is let through on
/// a guess.
pub(crate) fn deny_everything_selected(
    obj: &AuthorizationPolicyObject,
    cx: &PolicyContext<'_>,
) -> PolicyConfig {
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    PolicyConfig {
        name: entry_name(&obj.metadata),
        namespace: if namespace == cx.root_namespace {
            String::new()
        } else {
            namespace
        },
        selector: readable_selector(&obj.spec).map(|match_labels| SelectorConfig {
            workloads: Vec::new(),
            match_labels,
        }),
        action: "DENY".to_owned(),
        rules: vec![RuleConfig::default()],
        origin: Some(object_name(AP, &obj.metadata)),
    }
}

/// In words, what a policy entry selects.
pub(crate) fn scope_of(p: &PolicyConfig) -> String {
    let scope = if p.namespace.is_empty() {
        "every namespace".to_owned()
    } else {
        format!("namespace {}", p.namespace)
    };
    match &p.selector {
        Some(s) if !s.match_labels.is_empty() => {
            let labels: Vec<String> = s
                .match_labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            format!("{scope}, workloads labelled {}", labels.join(","))
        }
        _ => format!("every workload of {scope}"),
    }
}

fn parse_spec<T: serde::de::DeserializeOwned + Default>(
    spec: &Value,
) -> Result<T, serde_json::Error> {
    if spec.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(spec.clone())
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

/// Where a rule is, for the notes about its entries.
struct RuleCx<'a> {
    object: &'a str,
    at: String,
    allow: bool,
    notes: &'a mut Vec<ClusterPolicyNote>,
}

/// One entry of a list, as the reference reads it.
enum Entry {
    /// Kept, as the file model writes it.
    Keep(String),
    /// Kept by the reference as a value that can never match (a malformed
    /// principal or namespace pattern is an exact string no peer has; port
    /// 0): left out here, with what that means for its list.
    Never(String),
    /// Not readable: the reference skips it.
    Skip(String),
}

/// A list's entries after reading: those kept, and how many never match or
/// were skipped.
#[derive(Default)]
struct Entries {
    kept: Vec<String>,
    never: usize,
    skipped: usize,
}

impl RuleCx<'_> {
    /// Reads the list `field` with `read`, noting each entry left out.
    fn entries(&mut self, field: &str, list: &[String], read: impl Fn(&str) -> Entry) -> Entries {
        let mut out = Entries::default();
        for (k, text) in list.iter().enumerate() {
            let (code, why) = match read(text) {
                Entry::Keep(v) => {
                    if !out.kept.contains(&v) {
                        out.kept.push(v);
                    }
                    continue;
                }
                Entry::Never(why) => {
                    out.never += 1;
                    ("entry-never-matches", format!("{why}: it never matches"))
                }
                Entry::Skip(why) => {
                    out.skipped += 1;
                    ("entry-skipped", format!("{why}: the entry is skipped"))
                }
            };
            self.notes.push(note(
                self.object,
                AP,
                false,
                code,
                format!("{}.{field}[{k}] {text:?}: {why}", self.at),
            ));
        }
        out
    }
}

/// How one match (a source, an operation, a condition) reads once its
/// entries are read: the reference's rules, erring toward deny.
#[derive(Default)]
struct MatchState {
    /// It can match no connection.
    never: bool,
    /// It has an entry the reference keeps (an empty match never matches).
    present: bool,
    /// An entry could not be read (skipped).
    unreadable: bool,
}

impl MatchState {
    /// Takes one list (`positive`: `principals`; else `notPrincipals`) and
    /// returns the entries the file model keeps for it.
    fn take(&mut self, e: Entries, positive: bool, allow: bool) -> Vec<String> {
        if !e.kept.is_empty() || e.never > 0 {
            self.present = true;
        }
        if e.skipped > 0 {
            self.unreadable = true;
        }
        if e.kept.is_empty() {
            if positive && e.never > 0 {
                // Only values that never match: nothing matches.
                self.never = true;
            } else if e.skipped > 0 && e.never == 0 && allow {
                // Every entry unreadable: within an ALLOW the list matches
                // nothing, never anyone (within a DENY it constrains
                // nothing, as in the reference: the DENY denies more).
                self.never = true;
            }
        }
        e.kept
    }
}

fn ip_entry(text: &str) -> Entry {
    match Cidr::parse_masked(text) {
        Ok((cidr, _)) => Entry::Keep(cidr.to_string()),
        Err(e) => Entry::Skip(e.to_string()),
    }
}

/// A port as Go's `strconv.ParseUint(s, 10, 32)` reads it, then <= 65535
/// (the reference's `stringToPort`); 0 is kept there and never matches.
fn port_entry(text: &str) -> Entry {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Entry::Skip("not a port number".into());
    }
    match text.parse::<u64>() {
        Ok(0) => Entry::Never("port 0".into()),
        Ok(n) if n <= 65535 => Entry::Keep(n.to_string()),
        _ => Entry::Skip("not a port (1..=65535)".into()),
    }
}

fn namespace_entry(text: &str) -> Entry {
    match namespace_pattern(text) {
        Ok(_) => Entry::Keep(text.to_owned()),
        Err(e) => Entry::Never(e.to_string()),
    }
}

/// A principal as the reference's node proxy matches it: against the
/// peer's ID with `spiffe://` stripped (`td/ns/x/sa/y`, four `/`).
fn principal_entry(text: &str) -> Entry {
    if text.contains("spiffe://") {
        return Entry::Never(
            "a principal is written without spiffe:// (the reference strips it from the \
             peer's ID before matching)"
                .into(),
        );
    }
    match principal_pattern(text) {
        // Here a suffix is matched against the whole SPIFFE ID: one that
        // reaches past the trust domain (more `/` than `td/ns/x/sa/y` has)
        // would match here and never in the reference.
        Ok(crate::StringMatch::Suffix(x)) if x.matches('/').count() > 4 => Entry::Never(
            "a suffix longer than <trust domain>/ns/<namespace>/sa/<service account>".into(),
        ),
        Ok(_) => Entry::Keep(text.to_owned()),
        Err(e) => Entry::Never(e.to_string()),
    }
}

/// Whether a source or operation with no entry the reference keeps never
/// matches: yes (the reference's node proxy skips an empty match:
/// `source: {}`, `from: [{}]`, `operation: {}`, or one whose entries were
/// all unreadable), unless it is empty only of attributes a node proxy
/// cannot see (a DENY's L7-only source denies every source: more than
/// written, toward deny).
fn empty_match_never(l7: &[String]) -> bool {
    l7.is_empty()
}

/// One rule -> its entry, or `None` when it can match no connection. Its
/// L7 attributes are named in `l7` and left out (the caller omits the whole
/// rule of an ALLOW policy that has any).
fn map_rule(
    rule: &RuleSpec,
    rule_namespace: &str,
    cx: &mut RuleCx<'_>,
    l7: &mut Vec<String>,
) -> Option<RuleConfig> {
    extra_fields(&rule.other, l7);
    let allow = cx.allow;
    let rule_at = cx.at.clone();
    let mut never = false;
    let mut from = Vec::new();
    let mut any_source = false;
    for (j, f) in rule.from.iter().enumerate() {
        let mut source_l7 = Vec::new();
        extra_fields(&f.other, &mut source_l7);
        let s = &f.source;
        extra_fields(&s.other, &mut source_l7);
        l7.extend(source_l7.iter().cloned());
        let account = |sa: &str| {
            let full = if sa.contains('/') {
                sa.to_owned()
            } else {
                format!("{rule_namespace}/{sa}")
            };
            match service_account(&full) {
                Ok(_) => Entry::Keep(full),
                Err(e) => Entry::Never(e.to_string()),
            }
        };
        cx.at = format!("{rule_at}.from[{j}].source");
        let mut st = MatchState::default();
        let source = SourceConfig {
            principals: st.take(
                cx.entries("principals", &s.principals, principal_entry),
                true,
                allow,
            ),
            not_principals: st.take(
                cx.entries("notPrincipals", &s.not_principals, principal_entry),
                false,
                allow,
            ),
            namespaces: st.take(
                cx.entries("namespaces", &s.namespaces, namespace_entry),
                true,
                allow,
            ),
            not_namespaces: st.take(
                cx.entries("notNamespaces", &s.not_namespaces, namespace_entry),
                false,
                allow,
            ),
            service_accounts: st.take(
                cx.entries("serviceAccounts", &s.service_accounts, account),
                true,
                allow,
            ),
            not_service_accounts: st.take(
                cx.entries("notServiceAccounts", &s.not_service_accounts, account),
                false,
                allow,
            ),
            ip_blocks: st.take(cx.entries("ipBlocks", &s.ip_blocks, ip_entry), true, allow),
            not_ip_blocks: st.take(
                cx.entries("notIpBlocks", &s.not_ip_blocks, ip_entry),
                false,
                allow,
            ),
        };
        if !allow && !st.present && st.unreadable {
            // A DENY's source none of whose entries can be read: it may
            // have named anyone, so it matches every peer (toward deny;
            // the reference would skip it and deny no one).
            any_source = true;
            continue;
        }
        if st.never || (!st.present && empty_match_never(&source_l7)) {
            continue;
        }
        if source == SourceConfig::default() {
            // No constraint left (a DENY's L7-only source, a negation that
            // excludes no one): it matches every peer, so does the `from`.
            any_source = true;
        } else {
            from.push(source);
        }
    }
    if any_source {
        from.clear();
    } else if !rule.from.is_empty() && from.is_empty() {
        never = true;
    }
    let mut to = Vec::new();
    let mut any_port = false;
    for (j, t) in rule.to.iter().enumerate() {
        let mut op_l7 = Vec::new();
        extra_fields(&t.other, &mut op_l7);
        let op = &t.operation;
        extra_fields(&op.other, &mut op_l7);
        l7.extend(op_l7.iter().cloned());
        cx.at = format!("{rule_at}.to[{j}].operation");
        let mut st = MatchState::default();
        let ports = st.take(cx.entries("ports", &op.ports, port_entry), true, allow);
        let not_ports = st.take(
            cx.entries("notPorts", &op.not_ports, port_entry),
            false,
            allow,
        );
        if !allow && !st.present && st.unreadable {
            // A DENY's operation none of whose ports can be read: any port.
            any_port = true;
            continue;
        }
        if st.never || (!st.present && empty_match_never(&op_l7)) {
            continue;
        }
        let number = |v: Vec<String>| v.iter().filter_map(|p| p.parse().ok()).collect();
        let operation = OperationConfig {
            ports: number(ports),
            not_ports: number(not_ports),
        };
        if operation == OperationConfig::default() {
            any_port = true;
        } else {
            to.push(operation);
        }
    }
    if any_port {
        to.clear();
    } else if !rule.to.is_empty() && to.is_empty() {
        never = true;
    }
    let mut when = Vec::new();
    for (j, c) in rule.when.iter().enumerate() {
        if !L4_WHEN_KEYS.contains(&c.key.as_str()) {
            l7.push(format!("when {}", c.key));
            continue;
        }
        let read: fn(&str) -> Entry = match c.key.as_str() {
            "source.ip" | "destination.ip" => ip_entry,
            "source.namespace" => namespace_entry,
            "source.principal" => principal_entry,
            _ => port_entry,
        };
        cx.at = format!("{rule_at}.when[{j}]");
        let mut st = MatchState::default();
        let values = st.take(cx.entries("values", &c.values, read), true, allow);
        let not_values = st.take(cx.entries("notValues", &c.not_values, read), false, allow);
        if !allow && !st.present && st.unreadable {
            // A DENY's condition none of whose values can be read: it
            // holds for every connection (toward deny).
            continue;
        }
        if st.never || !st.present {
            // No value that can match (or none at all): the condition, so
            // the rule, never matches.
            never = true;
            continue;
        }
        if values.is_empty() && not_values.is_empty() {
            // Only negations that exclude no one: always true.
            continue;
        }
        when.push(ConditionConfig {
            key: c.key.clone(),
            values,
            not_values,
        });
    }
    cx.at = rule_at;
    (!never).then_some(RuleConfig { from, to, when })
}

/// One PeerAuthentication -> an entry, or `None` (skipped, noted).
pub(crate) fn peer_authentication(
    obj: &PeerAuthenticationObject,
    cx: &PolicyContext<'_>,
    notes: &mut Vec<ClusterPolicyNote>,
) -> Option<PeerAuthenticationConfig> {
    let object = object_name(PA, &obj.metadata);
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let spec: PeerAuthenticationSpec = match parse_spec(&obj.spec) {
        Ok(spec) => spec,
        Err(e) => {
            let labels = readable_selector(&obj.spec);
            if labels.is_some() && namespace == cx.root_namespace {
                notes.push(note(
                    &object,
                    PA,
                    true,
                    "root-selector",
                    format!("spec: {e}; a PeerAuthentication with a selector in the root namespace is ignored (as by the reference)"),
                ));
                return None;
            }
            // It may have said STRICT: it stays STRICT, over what it could
            // select.
            notes.push(note(
                &object,
                PA,
                false,
                "unreadable-strict",
                format!(
                    "spec: {e}: a PeerAuthentication that cannot be read is STRICT for what it \
                     could select ({})",
                    match &labels {
                        Some(l) => format!("workloads labelled {l:?}"),
                        None if namespace == cx.root_namespace => "the whole mesh".into(),
                        None => format!("every workload of namespace {namespace}"),
                    }
                ),
            ));
            return Some(PeerAuthenticationConfig {
                name: entry_name(&obj.metadata),
                mesh_wide: namespace == cx.root_namespace,
                namespace,
                match_labels: labels,
                mode: "STRICT".into(),
                port_modes: Vec::new(),
                origin: object,
            });
        }
    };
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
    let mode_of = |at: &str, m: Option<&MtlsSpec>, notes: &mut Vec<ClusterPolicyNote>| -> String {
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
            known @ ("UNSET" | "PERMISSIVE" | "STRICT") => known.to_owned(),
            other => {
                notes.push(note(
                    &object,
                    PA,
                    false,
                    "unknown-mode-strict",
                    format!(
                        "{at}: {other:?} is not UNSET, DISABLE, PERMISSIVE or STRICT (the API's \
                         values): it counts as STRICT"
                    ),
                ));
                "STRICT".into()
            }
        }
    };
    let mut mode = mode_of("mtls.mode", spec.mtls.as_ref(), notes);
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
        let mut stricter_everywhere = false;
        for (port, m) in &spec.port_level_mtls {
            let strict_or_unknown = !matches!(
                m.mode.as_deref(),
                None | Some("UNSET" | "PERMISSIVE" | "DISABLE")
            );
            // A port that cannot be read: an entry that may have made it
            // STRICT cannot be placed, so the whole workload is STRICT;
            // one that relaxes a port is left out (the workload's mode
            // stays). Never the whole object.
            let n = match port_entry(port) {
                Entry::Keep(n) => n.parse::<i64>().unwrap_or_default(),
                Entry::Never(why) | Entry::Skip(why) => {
                    let what = if strict_or_unknown {
                        stricter_everywhere = true;
                        "it may say STRICT, so every port of the workload is STRICT"
                    } else {
                        "the entry is skipped (the workload's mode applies to the port)"
                    };
                    notes.push(note(
                        &object,
                        PA,
                        false,
                        if strict_or_unknown {
                            "unreadable-strict"
                        } else {
                            "entry-skipped"
                        },
                        format!("portLevelMtls[{port:?}]: {why}: {what}"),
                    ));
                    continue;
                }
            };
            // With the workload's own mode unset, the reference counts only
            // PERMISSIVE ports as exceptions to an inherited STRICT: a
            // DISABLE port then inherits (stays STRICT under STRICT).
            if matches!(mode.as_str(), "UNSET" | "") && m.mode.as_deref() == Some("DISABLE") {
                notes.push(note(
                    &object,
                    PA,
                    false,
                    "port-disable-inherits",
                    format!(
                        "portLevelMtls[{port}]: DISABLE under an unset mtls.mode is no \
                         exception to an inherited STRICT (as the reference): the port \
                         inherits the enclosing mode"
                    ),
                ));
                port_modes.push((n, "UNSET".to_owned()));
                continue;
            }
            let m = mode_of(&format!("portLevelMtls[{port}]"), Some(m), notes);
            port_modes.push((n, m));
        }
        if stricter_everywhere {
            mode = "STRICT".into();
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
