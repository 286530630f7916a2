//! `AuthorizationPolicy` objects -> policy entries of the file model: the
//! API's shapes, the rules as the reference's node proxy reads their L4
//! part, and an object that cannot be understood read toward deny.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use super::objects::{
    entry_name, note, object_name, parse_spec, readable_selector, AuthorizationPolicyObject,
    PolicyContext, WorkloadSelector, AP,
};
use crate::file::{
    ConditionConfig, OperationConfig, PolicyConfig, RuleConfig, SelectorConfig, SourceConfig,
};
use crate::model::ClusterPolicyNote;
use crate::names::Cidr;
use crate::validate::{namespace_pattern, principal_pattern, service_account};

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

/// The `when` keys a node proxy can see (the reference's list).
pub const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

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
pub(super) enum Entry {
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
pub(super) fn port_entry(text: &str) -> Entry {
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
