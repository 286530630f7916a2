//! The renderer: Go text/template (gtmpl) plus the Helm functions the chart uses,
//! assembled the way Helm 4 does; and the committed manifests checked against it.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use gtmpl::{Context, FuncError, Template, Value};
use serde_json::Value as Json;

use super::{
    chart_dir, manifests_path, read, values, xds_manifests_path, yaml_to_json, NAMESPACE, RELEASE,
    XDS_VALUES,
};

thread_local! {
    /// The chart's files for `.Files.Get` (gtmpl functions are plain fn pointers).
    static CHART_FILES: RefCell<BTreeMap<String, String>> = const { RefCell::new(BTreeMap::new()) };
}

fn arg<'a>(args: &'a [Value], i: usize, f: &str) -> Result<&'a Value, FuncError> {
    args.get(i)
        .ok_or_else(|| FuncError::AtLeastXArgs(f.to_string(), i + 1))
}

/// Go's `fmt.Sprint` of a value, as Helm's string functions see it.
fn go_string(v: &Value) -> String {
    match v {
        Value::NoValue | Value::Nil => String::new(),
        other => other.to_string(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::NoValue | Value::Nil => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Map(m) | Value::Object(m) => m.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Function(_) => false,
    }
}

/// sprig `int`/`int64` (spf13/cast): numbers truncate, strings parse, anything else is 0.
fn to_i64(v: &Value) -> i64 {
    match v {
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_u64().map(|u| u as i64))
            .or_else(|| n.as_f64().map(|f| f as i64))
            .unwrap_or(0),
        Value::String(s) => s.trim().parse::<i64>().unwrap_or(0),
        Value::Bool(b) => i64::from(*b),
        _ => 0,
    }
}

fn f_int(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(to_i64(arg(args, 0, "int")?)))
}

fn f_add(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(args.iter().map(to_i64).sum::<i64>()))
}

fn f_default(args: &[Value]) -> Result<Value, FuncError> {
    let d = arg(args, 0, "default")?;
    match args.get(1) {
        Some(given) if !is_empty(given) => Ok(given.clone()),
        _ => Ok(d.clone()),
    }
}

/// Go's `%q` for the strings the chart quotes.
fn go_quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn f_quote(args: &[Value]) -> Result<Value, FuncError> {
    let parts: Vec<String> = args
        .iter()
        .filter(|v| !matches!(v, Value::NoValue | Value::Nil))
        .map(|v| go_quote(&go_string(v)))
        .collect();
    Ok(Value::from(parts.join(" ")))
}

fn indent_by(n: i64, s: &str) -> String {
    let pad = " ".repeat(n.max(0) as usize);
    format!("{pad}{}", s.replace('\n', &format!("\n{pad}")))
}

fn f_indent(args: &[Value]) -> Result<Value, FuncError> {
    let n = to_i64(arg(args, 0, "indent")?);
    Ok(Value::from(indent_by(
        n,
        &go_string(arg(args, 1, "indent")?),
    )))
}

fn f_nindent(args: &[Value]) -> Result<Value, FuncError> {
    let n = to_i64(arg(args, 0, "nindent")?);
    Ok(Value::from(format!(
        "\n{}",
        indent_by(n, &go_string(arg(args, 1, "nindent")?))
    )))
}

/// A gtmpl value as YAML, keys sorted (Helm's toYaml goes through JSON: sorted keys).
fn to_yaml_value(v: &Value) -> serde_norway::Value {
    match v {
        Value::NoValue | Value::Nil | Value::Function(_) => serde_norway::Value::Null,
        Value::Bool(b) => serde_norway::Value::Bool(*b),
        Value::String(s) => serde_norway::Value::String(s.clone()),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                serde_norway::Value::Number(i.into())
            } else if let Some(u) = n.as_u64() {
                serde_norway::Value::Number(u.into())
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                if f.fract() == 0.0 && f.abs() < 1e15 {
                    serde_norway::Value::Number((f as i64).into())
                } else {
                    serde_norway::Value::Number(f.into())
                }
            }
        }
        Value::Array(a) => serde_norway::Value::Sequence(a.iter().map(to_yaml_value).collect()),
        Value::Map(m) | Value::Object(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            let mut out = serde_norway::Mapping::new();
            for (k, v) in sorted {
                out.insert(serde_norway::Value::String(k.clone()), to_yaml_value(v));
            }
            serde_norway::Value::Mapping(out)
        }
    }
}

fn f_to_yaml(args: &[Value]) -> Result<Value, FuncError> {
    let v = arg(args, 0, "toYaml")?;
    let s = serde_norway::to_string(&to_yaml_value(v))
        .map_err(|e| FuncError::Generic(format!("toYaml: {e}")))?;
    Ok(Value::from(s.trim_end_matches('\n').to_string()))
}

fn f_fail(args: &[Value]) -> Result<Value, FuncError> {
    Err(FuncError::Generic(format!(
        "fail: {}",
        go_string(arg(args, 0, "fail")?)
    )))
}

/// Go's path.Base / path.Dir (slash-separated, as Helm's `base`/`dir`).
fn f_base(args: &[Value]) -> Result<Value, FuncError> {
    let s = go_string(arg(args, 0, "base")?);
    let t = s.trim_end_matches('/');
    Ok(Value::from(
        t.rsplit('/').next().unwrap_or_default().to_string(),
    ))
}

fn f_dir(args: &[Value]) -> Result<Value, FuncError> {
    let s = go_string(arg(args, 0, "dir")?);
    Ok(Value::from(match s.rfind('/') {
        Some(0) => "/".to_string(),
        Some(i) => s[..i].to_string(),
        None => ".".to_string(),
    }))
}

/// Sprig's `trim`: Go's strings.TrimSpace.
fn f_trim(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::from(
        go_string(arg(args, 0, "trim")?).trim().to_string(),
    ))
}

/// `.Files.Get "path"` (rewritten to `filesGet "path"` before parsing: gtmpl cannot call
/// a method with arguments).
fn f_files_get(args: &[Value]) -> Result<Value, FuncError> {
    let name = go_string(arg(args, 0, "Files.Get")?);
    CHART_FILES.with(|f| {
        f.borrow()
            .get(&name)
            .cloned()
            .map(Value::from)
            .ok_or_else(|| FuncError::Generic(format!(".Files.Get: no file {name:?} in the chart")))
    })
}

/// Helm's `fromYaml`: a YAML mapping as a map; anything else (a list, a scalar,
/// invalid YAML) as a map holding only `Error`, the message. Empty text is an empty map.
fn f_from_yaml(args: &[Value]) -> Result<Value, FuncError> {
    let text = go_string(arg(args, 0, "fromYaml")?);
    let error = |e: String| Value::Map(HashMap::from([("Error".to_string(), Value::from(e))]));
    Ok(match serde_norway::from_str::<Json>(&text) {
        Ok(Json::Null) => Value::Map(HashMap::new()),
        Ok(m @ Json::Object(_)) => json_to_gtmpl(&m),
        Ok(other) => error(format!("cannot unmarshal {other} into a map")),
        Err(e) => error(e.to_string()),
    })
}

/// The template functions the chart may use (besides Go's builtins: and, or, not, eq,
/// ne, lt, le, gt, ge, len, index, print, printf). deploy/README.md lists them.
const HELM_FUNCS: &[(&str, gtmpl::Func)] = &[
    ("toYaml", f_to_yaml),
    ("nindent", f_nindent),
    ("indent", f_indent),
    ("quote", f_quote),
    ("default", f_default),
    ("int", f_int),
    ("int64", f_int),
    ("add", f_add),
    ("fail", f_fail),
    ("base", f_base),
    ("dir", f_dir),
    ("filesGet", f_files_get),
    ("fromYaml", f_from_yaml),
    ("trim", f_trim),
];

fn json_to_gtmpl(v: &Json) -> Value {
    match v {
        Json::Null => Value::Nil,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(0.0))
            }
        }
        Json::String(s) => Value::from(s.clone()),
        Json::Array(a) => Value::Array(a.iter().map(json_to_gtmpl).collect()),
        Json::Object(o) => Value::Map(
            o.iter()
                .map(|(k, v)| (k.clone(), json_to_gtmpl(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

/// Helm's merge of user values over the chart's: maps merge, anything else replaces.
fn merge(base: &mut Json, over: &Json) {
    match (base, over) {
        (Json::Object(b), Json::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (slot, v) => *slot = v.clone(),
    }
}

/// Helm 4's kind order for installs (pkg/release/v1/util/kind_sorter.go).
const INSTALL_ORDER: &[&str] = &[
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

/// Helm's document split: the regex `(?:^|\s*\n)---\s*` (whitespace before the newline
/// and after the dashes belongs to the separator), empty pieces dropped, each piece
/// trimmed on the left (Helm 4, pkg/release/v1/util/manifest.go).
pub(super) fn split_manifests(text: &str) -> Vec<String> {
    let text = text.trim_start();
    let mut docs = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let at_sep = text[i..].starts_with("---") && (i == 0 || bytes[i - 1] == b'\n');
        if at_sep {
            // The separator starts at the whitespace run ending in the newline before it.
            let mut s = i;
            if s > 0 {
                s -= 1; // the newline
                while s > start && text.as_bytes()[s - 1].is_ascii_whitespace() {
                    s -= 1;
                }
            }
            let mut e = i + 3;
            while e < bytes.len() && bytes[e].is_ascii_whitespace() {
                e += 1;
            }
            docs.push(text[start..s].to_string());
            start = e;
            i = e;
            continue;
        }
        i += 1;
    }
    docs.push(text[start..].to_string());
    docs.into_iter()
        .filter(|d| !d.is_empty())
        .map(|d| d.trim_start().to_string())
        .collect()
}

/// values.yaml with `overrides` merged over it, as Helm gives them to the templates.
pub(super) fn merged_values(overrides: &str) -> Json {
    let mut values = values();
    if !overrides.trim().is_empty() {
        merge(&mut values, &yaml_to_json(overrides, "overrides"));
    }
    values
}

/// Renders the chart with `overrides` merged over values.yaml, in `namespace`, as
/// `helm template RELEASE deploy/helm/ringway -n NAMESPACE` prints it.
pub(super) fn render_chart(overrides: &str, namespace: &str) -> Result<String, String> {
    let dir = chart_dir();
    let chart = yaml_to_json(&read(&dir.join("Chart.yaml")), "Chart.yaml");
    let values = merged_values(overrides);
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(dir.join("files")).expect("chart files/") {
        let p = e.unwrap().path();
        let name = format!("files/{}", p.file_name().unwrap().to_string_lossy());
        files.insert(name, read(&p));
    }
    CHART_FILES.with(|f| *f.borrow_mut() = files);
    let ctx = serde_json::json!({
        "Values": values,
        "Release": {
            "Name": RELEASE, "Namespace": namespace, "Service": "Helm",
            "IsInstall": true, "IsUpgrade": false, "Revision": 1,
        },
        "Chart": {
            "Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"],
        },
    });
    let ctx = Context::from(json_to_gtmpl(&ctx));
    let chart_name = chart["name"].as_str().unwrap_or("ringway").to_string();

    let mut names: Vec<String> = std::fs::read_dir(dir.join("templates"))
        .expect("chart templates/")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('_') && (n.ends_with(".yaml") || n.ends_with(".tpl")))
        .collect();
    names.sort();
    let mut manifests: Vec<(usize, String, String)> = Vec::new(); // (kind rank, source, doc)
    let mut unknown: Vec<(String, String, String)> = Vec::new(); // (kind, source, doc)
    for name in names {
        let source = format!("{chart_name}/templates/{name}");
        let text = read(&dir.join("templates").join(&name)).replace(".Files.Get ", "filesGet ");
        let mut t = Template::with_name(source.clone());
        t.add_funcs(HELM_FUNCS);
        t.parse(text).map_err(|e| format!("{source}: {e}"))?;
        let out = t.render(&ctx).map_err(|e| format!("{source}: {e}"))?;
        // Helm prints a missing value as nothing, not as Go's "<no value>".
        let out = out.replace("<no value>", "");
        for doc in split_manifests(&out) {
            let head: Json = serde_norway::from_str(&doc)
                .map_err(|e| format!("{source}: rendered invalid YAML: {e}\n{doc}"))?;
            let kind = head["kind"].as_str().unwrap_or_default().to_string();
            match INSTALL_ORDER.iter().position(|k| *k == kind) {
                Some(rank) => manifests.push((rank, source.clone(), doc)),
                None => unknown.push((kind, source.clone(), doc)),
            }
        }
    }
    manifests.sort_by_key(|m| m.0); // stable: file order within a kind
    unknown.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (source, doc) in manifests
        .into_iter()
        .map(|(_, s, d)| (s, d))
        .chain(unknown.into_iter().map(|(_, s, d)| (s, d)))
    {
        out.push_str(&format!("---\n# Source: {source}\n{doc}\n"));
    }
    Ok(out)
}

/// `path` is the chart rendered with `overrides`, byte for byte; with
/// `RINGWAY_UPDATE_MANIFESTS` set, it is rewritten instead.
fn check_committed_rendering(path: &Path, overrides: &str, test: &str) {
    let rendered = render_chart(overrides, NAMESPACE).unwrap_or_else(|e| panic!("rendering: {e}"));
    if std::env::var_os("RINGWAY_UPDATE_MANIFESTS").is_some() {
        std::fs::write(path, &rendered).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = read(path);
    if committed != rendered {
        let first = committed
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(rendered.lines().count()));
        panic!(
            "{} differs from the chart's rendering from line {}:\n  committed: {:?}\n  rendered:  {:?}\n\
             Regenerate it: RINGWAY_UPDATE_MANIFESTS=1 cargo test -p ringway --test it -- \
             {test} (or helm template, deploy/README.md)",
            path.display(),
            first + 1,
            committed.lines().nth(first),
            rendered.lines().nth(first),
        );
    }
}

/// The committed manifests are the chart as the tests' own gtmpl emulation of Helm
/// renders it ([`render_chart`]), byte for byte; a real Helm is compared in
/// `helm_template_agrees_with_the_manifests`.
#[test]
fn manifests_are_the_chart_rendered_with_default_values() {
    check_committed_rendering(
        &manifests_path(),
        "",
        "manifests_are_the_chart_rendered_with_default_values",
    );
}

/// As above for `proxy.meshSource: xds`, against the emulation ([`render_chart`]).
#[test]
fn xds_manifests_are_the_chart_rendered_with_mesh_source_xds() {
    check_committed_rendering(
        &xds_manifests_path(),
        XDS_VALUES,
        "xds_manifests_are_the_chart_rendered_with_mesh_source_xds",
    );
}

/// Helm reads numbers in values as float64 and prints large ones as 1e+06: every
/// template use of such a value must go through `int`.
#[test]
fn large_numbers_are_printed_through_int() {
    fn numbers(v: &Json, path: String, out: &mut Vec<String>) {
        match v {
            Json::Object(o) => {
                for (k, v) in o {
                    numbers(v, format!("{path}.{k}"), out);
                }
            }
            Json::Number(n) if n.as_f64().is_some_and(|f| f.abs() >= 1e6) => out.push(path),
            _ => {}
        }
    }
    let mut large = Vec::new();
    numbers(&values(), ".Values".into(), &mut large);
    assert!(
        !large.is_empty(),
        "values.yaml has large numbers (pipeSize)"
    );
    for e in std::fs::read_dir(chart_dir().join("templates")).unwrap() {
        let p = e.unwrap().path();
        let text = read(&p);
        for action in text
            .split("{{")
            .skip(1)
            .filter_map(|a| a.split("}}").next())
        {
            for path in &large {
                let used = action.match_indices(path.as_str()).any(|(i, _)| {
                    !action[i + path.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '.')
                });
                assert!(
                    !used || action.contains("int"),
                    "{}: `{{{{{action}}}}}` prints {path} without `int` (Helm would print 1e+06)",
                    p.display()
                );
            }
        }
    }
}

/// The emulation's document split and Helm functions against outputs written
/// down by hand from Helm's semantics (no Helm runs here: real `helm template`
/// output is compared in `helm_template_agrees_with_the_emulation_for_the_tested_values`).
#[test]
fn emulated_helm_functions_give_the_hand_written_outputs() {
    // Document splitting: Helm's regex keeps the last document's trailing whitespace.
    assert_eq!(
        split_manifests("\na: 1\n\n---\nb: 2\n---   \n\nc: 3\n"),
        ["a: 1", "b: 2", "c: 3\n"]
    );
    let mut t = Template::default();
    t.add_funcs(HELM_FUNCS);
    t.parse(
        r#"{{ "x" | quote }} {{ 30 | int }} {{ add 30 10 }} {{ "" | default "d" }} {{ base "a/b.json" }} {{ dir "a/b.json" }}{{ "a\nb" | nindent 2 }}{{ " \n t \n" | trim | nindent 1 }}"#,
    )
    .unwrap();
    assert_eq!(
        t.render(&Context::empty()).unwrap(),
        "\"x\" 30 40 d b.json a\n  a\n  b\n t"
    );
    // fromYaml: a mapping, an `Error` for anything else, an empty map for nothing.
    let mut t = Template::default();
    t.add_funcs(HELM_FUNCS);
    t.parse(
        r#"{{ $m := fromYaml "a: [1, 2]" }}{{ len $m.a }} {{ if $m.Error }}bad{{ end }}{{ $e := fromYaml "- x" }}{{ if $e.Error }}error{{ end }} {{ if fromYaml "" }}full{{ else }}empty{{ end }}"#,
    )
    .unwrap();
    assert_eq!(t.render(&Context::empty()).unwrap(), "2 error empty");
}

/// NOTES.txt (printed by `helm install`, not a manifest) renders for each mode and
/// says where the mesh and the certificates come from.
#[test]
fn notes_render_for_each_mode() {
    let text = read(&chart_dir().join("templates/NOTES.txt"));
    let render = |over: &str| {
        let values = merged_values(over);
        let ctx = serde_json::json!({
            "Values": values,
            "Release": {"Name": RELEASE, "Namespace": NAMESPACE, "Service": "Helm"},
        });
        let mut t = Template::default();
        t.add_funcs(HELM_FUNCS);
        t.parse(text.as_str()).expect("NOTES.txt parses");
        t.render(&Context::from(json_to_gtmpl(&ctx)))
            .unwrap_or_else(|e| panic!("NOTES.txt with {over:?}: {e}"))
    };
    let default = render("");
    assert!(default.contains("ca.mode=service"), "{default}");
    assert!(!default.contains("xds"), "{default}");
    let xds = render(XDS_VALUES);
    assert!(
        xds.contains("istiod.istio-system.svc:15012")
            && xds.contains("CA_TRUSTED_NODE_ACCOUNTS=ringway-system/ringway-proxy")
            && xds.contains("ca.mode=istiod"),
        "{xds}"
    );
    assert!(!xds.contains("ringway-ca"), "{xds}");
    let local = render("ca: {mode: local}");
    assert!(local.contains("ca.mode=local"), "{local}");
    let none = render("ca: {mode: local, secretName: \"\"}");
    assert!(none.contains("No CA"), "{none}");
}
