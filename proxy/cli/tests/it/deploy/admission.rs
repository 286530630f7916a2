//! The bundled mesh CRDs' schemas: admission as the API server does it (the
//! structural-schema keywords the CRDs use, pruning, and their CEL rules).

use serde_json::Value as Json;

/// The keywords [`admit`] implements. A schema that uses another fails the tests until
/// the validator learns it: no keyword of the schemas goes unchecked.
pub(super) const SCHEMA_KEYWORDS: &[&str] = &[
    "type",
    "description",
    "properties",
    "additionalProperties",
    "items",
    "required",
    "enum",
    "maxItems",
    "maxLength",
    "minLength",
    "maxProperties",
    "minProperties",
    "pattern",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-validations",
];

/// What the API server makes of an object under a structural schema, for the keywords
/// in [`SCHEMA_KEYWORDS`]: the errors it refuses the object for, and the fields it
/// prunes (not in the schema; kubectl's default strict field validation refuses them).
#[derive(Debug, Default)]
pub(super) struct Admission {
    pub(super) errors: Vec<String>,
    pub(super) pruned: Vec<String>,
}

impl Admission {
    pub(super) fn admitted_whole(&self) -> bool {
        self.errors.is_empty() && self.pruned.is_empty()
    }
}

/// Validates `object` (a whole object: apiVersion, kind and metadata are the API
/// server's) against a CRD version's `openAPIV3Schema`.
pub(super) fn admit(schema: &Json, object: &Json) -> Admission {
    let mut a = Admission::default();
    admit_value(schema, object, "", true, &mut a);
    a
}

fn is_integer(v: &Json) -> bool {
    v.as_i64().is_some() || v.as_u64().is_some()
}

fn admit_value(schema: &Json, v: &Json, path: &str, root: bool, a: &mut Admission) {
    let s = schema
        .as_object()
        .unwrap_or_else(|| panic!("{path}: a schema is a mapping"));
    for k in s.keys() {
        assert!(
            SCHEMA_KEYWORDS.contains(&k.as_str()),
            "{path}: the test's validator does not implement `{k}`: teach it first"
        );
    }
    let flag = |k: &str| s.get(k) == Some(&Json::Bool(true));
    let preserve = flag("x-kubernetes-preserve-unknown-fields");
    let int_or_string = flag("x-kubernetes-int-or-string");
    let ty = s.get("type").and_then(Json::as_str);
    let typed = if int_or_string {
        v.is_string() || is_integer(v)
    } else {
        match ty {
            Some("object") => v.is_object(),
            Some("array") => v.is_array(),
            Some("string") => v.is_string(),
            Some("integer") => is_integer(v),
            Some("number") => v.is_number(),
            Some("boolean") => v.is_boolean(),
            None => preserve,
            Some(t) => panic!("{path}: unknown type {t:?}"),
        }
    };
    if !typed {
        let want = if int_or_string {
            "integer or string"
        } else {
            ty.unwrap_or("(none)")
        };
        a.errors.push(format!(
            "{path}: Invalid value: {v}: must be of type {want}"
        ));
        return;
    }
    if let Some(allowed) = s.get("enum") {
        if !allowed.as_array().unwrap().contains(v) {
            a.errors.push(format!(
                "{path}: Unsupported value: {v}: supported values: {allowed}"
            ));
        }
    }
    let bound = |k: &str| s.get(k).map(|b| b.as_u64().unwrap() as usize);
    let mut limit = |n: usize, min: &str, max: &str, what: &str| {
        if bound(max).is_some_and(|m| n > m) {
            a.errors.push(format!(
                "{path}: Too many: {n} {what}: must have at most {}",
                bound(max).unwrap()
            ));
        }
        if bound(min).is_some_and(|m| n < m) {
            a.errors.push(format!(
                "{path}: Too few: {n} {what}: must have at least {}",
                bound(min).unwrap()
            ));
        }
    };
    match v {
        Json::String(text) => {
            limit(text.chars().count(), "minLength", "maxLength", "characters");
            if let Some(p) = s.get("pattern").and_then(Json::as_str) {
                let re = regex::Regex::new(p).unwrap_or_else(|e| panic!("{path}: pattern: {e}"));
                if !re.is_match(text) {
                    a.errors
                        .push(format!("{path}: Invalid value: {v}: should match '{p}'"));
                }
            }
        }
        Json::Array(items) => {
            limit(items.len(), "minItems", "maxItems", "items");
            if let Some(item) = s.get("items") {
                for (i, x) in items.iter().enumerate() {
                    admit_value(item, x, &format!("{path}[{i}]"), false, a);
                }
            }
        }
        Json::Object(fields) => {
            limit(fields.len(), "minProperties", "maxProperties", "properties");
            for r in s
                .get("required")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                let r = r.as_str().unwrap();
                if fields.get(r).is_none_or(Json::is_null) {
                    a.errors.push(format!("{path}.{r}: Required value"));
                }
            }
            let properties = s.get("properties").and_then(Json::as_object);
            let additional = s.get("additionalProperties");
            for (k, x) in fields {
                if root && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (properties.and_then(|p| p.get(k)), additional) {
                    // A null field is dropped (no schema here is nullable).
                    (Some(_), _) if x.is_null() => {}
                    (Some(sub), _) => {
                        let at = if path.is_empty() {
                            k.clone()
                        } else {
                            format!("{path}.{k}")
                        };
                        admit_value(sub, x, &at, false, a);
                    }
                    (None, Some(sub)) => admit_value(sub, x, &format!("{path}[{k}]"), false, a),
                    (None, None) if preserve => {}
                    (None, None) => a.pruned.push(format!("{path}.{k}")),
                }
            }
        }
        _ => {}
    }
    for r in s
        .get("x-kubernetes-validations")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let (rule, message) = (r["rule"].as_str().unwrap(), r["message"].as_str().unwrap());
        match cel_rule(rule)(v) {
            Ok(true) => {}
            Ok(false) => a.errors.push(format!("{path}: Invalid value: {message}")),
            Err(e) => a
                .errors
                .push(format!("{path}: Invalid value: {message}: {e}")),
        }
    }
}

/// A CEL rule evaluated by the API server, as its meaning in Rust.
pub(super) type CelRule = fn(&Json) -> Result<bool, String>;

/// The meaning of each `x-kubernetes-validations` rule the schemas carry (no CEL
/// interpreter here: each rule is known by its text, whitespace aside). A rule the
/// table does not know fails the tests until its meaning is added.
pub(super) fn cel_rule(rule: &str) -> CelRule {
    // `has(self.f)`: the field is set (a null one is dropped before validation).
    fn has(v: &Json, f: &str) -> bool {
        v.get(f).is_some_and(|x| !x.is_null())
    }
    fn keys(v: &Json) -> impl Iterator<Item = &String> {
        v.as_object().into_iter().flat_map(|m| m.keys())
    }
    let rule = rule.split_whitespace().collect::<Vec<_>>().join(" ");
    match rule.as_str() {
        r#"self.all(key, !key.contains("*"))"# => |v| Ok(keys(v).all(|k| !k.contains('*'))),
        "self.all(key, key.size() != 0)" => |v| Ok(keys(v).all(|k| !k.is_empty())),
        r#"!self.contains("*")"# => |v| Ok(!v.as_str().unwrap().contains('*')),
        "self.size() == 0" => |v| Ok(v.as_str().unwrap().is_empty()),
        "(has(self.selector) ? 1 : 0) + (has(self.targetRef) ? 1 : 0) + \
         (has(self.targetRefs) ? 1 : 0) <= 1" => |v| {
            Ok(["selector", "targetRef", "targetRefs"]
                .iter()
                .filter(|f| has(v, f))
                .count()
                <= 1)
        },
        "(has(self.serviceAccounts) || has(self.notServiceAccounts)) ? (!has(self.principals) \
         && !has(self.notPrincipals) && !has(self.namespaces) && !has(self.notNamespaces)) \
         : true" => |v| {
            let accounts = has(v, "serviceAccounts") || has(v, "notServiceAccounts");
            Ok(!accounts
                || ["principals", "notPrincipals", "namespaces", "notNamespaces"]
                    .iter()
                    .all(|f| !has(v, f)))
        },
        // CEL's int(string) is Go's strconv.ParseInt(s, 10, 64), as Rust's i64 parse
        // (an optional sign, decimal digits): a key that is no number is an error.
        "self.all(key, 0 < int(key) && int(key) <= 65535)" => |v| {
            for k in keys(v) {
                let n: i64 = k.parse().map_err(|_| format!("int({k:?}): not a number"))?;
                if !(1..=65535).contains(&n) {
                    return Ok(false);
                }
            }
            Ok(true)
        },
        "has(self.portLevelMtls) ? (((has(self.selector) && has(self.selector.matchLabels)) \
         ? self.selector.matchLabels : {}).size() > 0) : true" => |v| {
            let labels = v
                .get("selector")
                .and_then(|s| s.get("matchLabels"))
                .and_then(Json::as_object)
                .map_or(0, |m| m.len());
            Ok(!has(v, "portLevelMtls") || labels > 0)
        },
        other => panic!("the test does not know the CEL rule {other:?}: add its meaning"),
    }
}

/// Every node of a schema with its path (`spec.rules[].from[].source.principals`).
pub(super) fn schema_nodes<'a>(schema: &'a Json, path: &str, out: &mut Vec<(String, &'a Json)>) {
    out.push((path.to_string(), schema));
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    if let Some(props) = schema.get("properties").and_then(Json::as_object) {
        for (k, sub) in props {
            schema_nodes(sub, &join(k), out);
        }
    }
    if let Some(sub) = schema.get("additionalProperties") {
        schema_nodes(sub, &format!("{path}{{}}"), out);
    }
    if let Some(sub) = schema.get("items") {
        schema_nodes(sub, &format!("{path}[]"), out);
    }
}

/// The property names of the schema node at `path` (as [`schema_nodes`] names it).
pub(super) fn schema_fields(schema: &Json, path: &str) -> Vec<String> {
    let mut nodes = Vec::new();
    schema_nodes(schema, "", &mut nodes);
    let (_, node) = nodes
        .into_iter()
        .find(|(p, _)| p == path)
        .unwrap_or_else(|| panic!("no schema node {path}"));
    let mut fields: Vec<String> = node["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{path}: no properties"))
        .keys()
        .cloned()
        .collect();
    fields.sort();
    fields
}
