//! The network configuration on stdin: the runtime's plugin entry from the conflist,
//! with `cniVersion`, `name`, `runtimeConfig` and (chained) `prevResult` added.

use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::error::{CniError, ErrorCode};
use crate::result::json_type;
use crate::version::CniVersion;

/// Where the node agent listens for the plugin, when `agentSocket` is not set.
pub const DEFAULT_AGENT_SOCKET: &str = "/var/run/ringway/cni/cni.sock";
/// Namespaces whose pods are never captured, when `excludeNamespaces` is not set:
/// ringway's own (the node agent must start without waiting for itself). The same
/// list marks those pods `tunnel: false` in the proxy's Kubernetes mesh source.
pub const DEFAULT_EXCLUDE_NAMESPACES: &[&str] =
    ringway_config::enrollment::DEFAULT_EXCLUDE_NAMESPACES;

/// GC's list of still-valid attachments (spec 1.1.0 as released).
pub const VALID_ATTACHMENTS_KEY: &str = "cni.dev/valid-attachments";
/// The same list under the name of the 1.1.0 tag; runtimes send both.
pub const ATTACHMENTS_KEY: &str = "cni.dev/attachments";

/// `logLevel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings (the default).
    #[default]
    Warn,
    /// Plus one line per invocation.
    Info,
    /// Plus decisions and agent calls.
    Debug,
    /// Everything.
    Trace,
}

impl LogLevel {
    const ALL: [LogLevel; 5] = [
        LogLevel::Error,
        LogLevel::Warn,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Trace,
    ];

    /// The config spelling (lower case).
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

impl std::fmt::Display for LogLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attachment named by GC (`{"containerID":..,"ifname":..}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attachment {
    /// The sandbox id.
    pub container_id: String,
    /// The interface name in the sandbox.
    pub ifname: String,
}

/// A decoded network configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion`: the version the runtime speaks, and the one results are printed at.
    pub cni_version: CniVersion,
    /// `name`: the network name.
    pub name: String,
    /// `type`: the plugin binary name.
    pub plugin_type: String,
    /// `prevResult`, raw, when the runtime passed one (chained ADD, DEL, CHECK).
    pub prev_result: Option<Value>,
    /// `runtimeConfig`, raw.
    pub runtime_config: Option<Value>,
    /// `cniVersions` (1.1.0, conflist level), when present.
    pub cni_versions: Option<Vec<String>>,
    /// `disableGC` (1.1.0).
    pub disable_gc: bool,
    /// `agentSocket` (ringway): the node agent's unix socket.
    pub agent_socket: PathBuf,
    /// `logFile` (ringway): where the binary writes its log (stderr when `None`).
    pub log_file: Option<PathBuf>,
    /// `logLevel` (ringway).
    pub log_level: LogLevel,
    /// `excludeNamespaces` (ringway): pods in these namespaces pass straight through.
    pub exclude_namespaces: Vec<String>,
    /// GC: the union of `cni.dev/valid-attachments` and `cni.dev/attachments`;
    /// `None` when neither is present.
    pub valid_attachments: Option<Vec<Attachment>>,
    /// Every other field, unchanged.
    pub extra: Map<String, Value>,
}

impl NetConf {
    /// Decodes stdin. Not JSON, not an object, or a field of the wrong JSON type:
    /// code 6. A missing `cniVersion`, `name` or `type`, or a bad value: code 7.
    /// A `cniVersion` this plugin does not speak: code 1.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                ErrorCode::Decode,
                format!("network config is not valid JSON: {e}"),
            )
        })?;
        let Value::Object(mut map) = value else {
            return Err(CniError::new(
                ErrorCode::Decode,
                format!(
                    "network config is {}, expected a JSON object",
                    json_type(&value)
                ),
            ));
        };

        let cni_version = match take_string(&mut map, "cniVersion")? {
            Some(v) => CniVersion::parse("cniVersion", &v)?,
            None => return Err(missing("cniVersion")),
        };
        let name = take_string(&mut map, "name")?.ok_or_else(|| missing("name"))?;
        let plugin_type = take_string(&mut map, "type")?.ok_or_else(|| missing("type"))?;
        let prev_result = map.remove("prevResult").filter(|v| !v.is_null());
        let runtime_config = map.remove("runtimeConfig").filter(|v| !v.is_null());
        let cni_versions = take_string_list(&mut map, "cniVersions")?;
        let disable_gc = match map.remove("disableGC") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => b,
            Some(other) => return Err(wrong_type("disableGC", &other, "a boolean")),
        };

        let agent_socket = match take_string(&mut map, "agentSocket")? {
            None => PathBuf::from(DEFAULT_AGENT_SOCKET),
            Some(p) => absolute_path("agentSocket", p)?,
        };
        let log_file = take_string(&mut map, "logFile")?
            .map(|p| absolute_path("logFile", p))
            .transpose()?;
        let log_level = match take_string(&mut map, "logLevel")? {
            None => LogLevel::default(),
            Some(l) => LogLevel::ALL
                .into_iter()
                .find(|x| x.as_str().eq_ignore_ascii_case(&l))
                .ok_or_else(|| {
                    invalid(format!(
                        "network config field \"logLevel\" is {l:?}, expected one of \
                         error, warn, info, debug, trace"
                    ))
                })?,
        };
        let exclude_namespaces = match take_string_list(&mut map, "excludeNamespaces")? {
            None => default_excludes(),
            Some(list) => {
                if list.iter().any(String::is_empty) {
                    return Err(invalid(
                        "network config field \"excludeNamespaces\" has an empty namespace",
                    ));
                }
                list
            }
        };

        let valid = parse_attachments(map.get(VALID_ATTACHMENTS_KEY), VALID_ATTACHMENTS_KEY)?;
        let tagged = parse_attachments(map.get(ATTACHMENTS_KEY), ATTACHMENTS_KEY)?;
        let valid_attachments = match (valid, tagged) {
            (None, None) => None,
            (a, b) => {
                let mut all: Vec<Attachment> = a.into_iter().chain(b).flatten().collect();
                all.sort();
                all.dedup();
                Some(all)
            }
        };

        Ok(NetConf {
            cni_version,
            name,
            plugin_type,
            prev_result,
            runtime_config,
            cni_versions,
            disable_gc,
            agent_socket,
            log_file,
            log_level,
            exclude_namespaces,
            valid_attachments,
            extra: map,
        })
    }

    /// Whether pods of `namespace` pass straight through.
    pub fn is_excluded(&self, namespace: &str) -> bool {
        self.exclude_namespaces.iter().any(|n| n == namespace)
    }
}

/// Keys of a network config that the CNI spec defines or that runtimes are
/// known to add, besides those [`NetConf`] decodes. Anything else in
/// [`NetConf::extra`] is reported by [`NetConf::unknown_keys`].
pub const SPEC_KEYS: &[&str] = &[
    "ipam",
    "dns",
    "args",
    "capabilities",
    "ipMasq",
    "disableCheck",
    VALID_ATTACHMENTS_KEY,
    ATTACHMENTS_KEY,
];

/// ringway's own config keys (documented in the crate docs).
pub const RINGWAY_KEYS: &[&str] = &["agentSocket", "logFile", "logLevel", "excludeNamespaces"];

/// A key of the plugin's config that neither the spec nor ringway defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// The key as written.
    pub key: String,
    /// The known key it differs from only in case or punctuation, if any
    /// (`agentsocket` for `agentSocket`).
    pub did_you_mean: Option<&'static str>,
}

impl std::fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.key)?;
        if let Some(k) = self.did_you_mean {
            write!(f, " (did you mean {k:?}?)")?;
        }
        Ok(())
    }
}

fn fold_key(k: &str) -> String {
    k.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

impl NetConf {
    /// The keys of [`NetConf::extra`] that neither the spec nor ringway defines,
    /// sorted. Not an error (runtimes add keys of their own), but a misspelled
    /// `agentSocket` silently means the default socket, so the plugin logs each.
    pub fn unknown_keys(&self) -> Vec<UnknownKey> {
        let mut out: Vec<UnknownKey> = self
            .extra
            .keys()
            .filter(|k| !SPEC_KEYS.contains(&k.as_str()))
            .map(|k| UnknownKey {
                key: k.clone(),
                did_you_mean: RINGWAY_KEYS
                    .iter()
                    .chain(SPEC_KEYS)
                    .chain(["cniVersion", "cniVersions", "name", "type", "disableGC"].iter())
                    .find(|known| fold_key(known) == fold_key(k))
                    .copied(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// What DEL works with when [`NetConf::parse`] refused the config: every
    /// field that can still be read on its own, defaults for the rest
    /// (`agentSocket`, `excludeNamespaces`), and what could not be read. DEL must
    /// not fail on a config it cannot fully parse: runtimes run DEL through the
    /// chain in reverse order, so a failing ringway-cni would keep the primary
    /// plugin from releasing the pod's interface and address.
    pub fn best_effort(stdin: &[u8]) -> (NetConf, Vec<String>) {
        let mut problems = Vec::new();
        let mut map = match serde_json::from_slice::<Value>(stdin) {
            Ok(Value::Object(map)) => map,
            Ok(other) => {
                problems.push(format!(
                    "network config is {}, expected a JSON object",
                    json_type(&other)
                ));
                Map::new()
            }
            Err(e) => {
                problems.push(format!("network config is not valid JSON: {e}"));
                Map::new()
            }
        };
        let mut field = |name: &str, problems: &mut Vec<String>| match take_string(&mut map, name) {
            Ok(v) => v,
            Err(e) => {
                problems.push(e.msg);
                None
            }
        };
        let cni_version = field("cniVersion", &mut problems)
            .and_then(|v| CniVersion::from_str_exact(&v))
            .unwrap_or(CniVersion::LATEST);
        let name = field("name", &mut problems).unwrap_or_default();
        let plugin_type = field("type", &mut problems).unwrap_or_default();
        let agent_socket =
            match field("agentSocket", &mut problems).map(|p| absolute_path("agentSocket", p)) {
                None => PathBuf::from(DEFAULT_AGENT_SOCKET),
                Some(Ok(p)) => p,
                Some(Err(e)) => {
                    problems.push(e.msg);
                    PathBuf::from(DEFAULT_AGENT_SOCKET)
                }
            };
        let (log_file, log_level) = log_settings(stdin);
        let exclude_namespaces = match take_string_list(&mut map, "excludeNamespaces") {
            Ok(Some(list)) if !list.iter().any(String::is_empty) => list,
            Ok(None) => default_excludes(),
            Ok(Some(_)) => {
                problems.push(
                    "network config field \"excludeNamespaces\" has an empty namespace".into(),
                );
                default_excludes()
            }
            Err(e) => {
                problems.push(e.msg);
                default_excludes()
            }
        };
        let conf = NetConf {
            cni_version,
            name,
            plugin_type,
            prev_result: None,
            runtime_config: None,
            cni_versions: None,
            disable_gc: false,
            agent_socket,
            log_file,
            log_level,
            exclude_namespaces,
            valid_attachments: None,
            extra: Map::new(),
        };
        (conf, problems)
    }
}

fn default_excludes() -> Vec<String> {
    DEFAULT_EXCLUDE_NAMESPACES
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
}

/// `logFile` and `logLevel` read on their own, before (and whatever) the rest of
/// the config decodes, so the plugin can log to its file why the config was
/// refused. A value that is not valid is ignored here (stderr, `warn`);
/// [`NetConf::parse`] reports it.
pub fn log_settings(stdin: &[u8]) -> (Option<PathBuf>, LogLevel) {
    let Ok(value) = serde_json::from_slice::<Value>(stdin) else {
        return (None, LogLevel::default());
    };
    let file = value
        .get("logFile")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let level = value
        .get("logLevel")
        .and_then(Value::as_str)
        .and_then(|l| {
            LogLevel::ALL
                .into_iter()
                .find(|x| x.as_str().eq_ignore_ascii_case(l))
        })
        .unwrap_or_default();
    (file, level)
}

/// The `cniVersion` of stdin if it can be read and is supported, for the version of
/// an error object printed before (or although) the config fully decodes.
pub fn sniff_version(stdin: &[u8]) -> Option<CniVersion> {
    let value: Value = serde_json::from_slice(stdin).ok()?;
    CniVersion::from_str_exact(value.get("cniVersion")?.as_str()?)
}

fn missing(field: &str) -> CniError {
    invalid(format!("network config has no {field:?}"))
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(ErrorCode::InvalidConfig, msg)
}

fn wrong_type(field: &str, v: &Value, expected: &str) -> CniError {
    CniError::new(
        ErrorCode::Decode,
        format!(
            "network config field {field:?} is {}, expected {expected}",
            json_type(v)
        ),
    )
}

/// Removes `field`; `None` when absent, null or empty.
fn take_string(map: &mut Map<String, Value>, field: &str) -> Result<Option<String>, CniError> {
    match map.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(wrong_type(field, &other, "a string")),
    }
}

fn take_string_list(
    map: &mut Map<String, Value>,
    field: &str,
) -> Result<Option<Vec<String>>, CniError> {
    match map.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                other => Err(wrong_type(field, &other, "an array of strings")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(wrong_type(field, &other, "an array of strings")),
    }
}

fn absolute_path(field: &str, p: String) -> Result<PathBuf, CniError> {
    let path = PathBuf::from(&p);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(invalid(format!(
            "network config field {field:?} is {p:?}, expected an absolute path"
        )))
    }
}

/// `[{"containerID":"..","ifname":".."}, ...]`; left in `extra` as well.
fn parse_attachments(v: Option<&Value>, key: &str) -> Result<Option<Vec<Attachment>>, CniError> {
    let items = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items,
        Some(other) => return Err(wrong_type(key, other, "an array")),
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = |name: &str| match item.get(name) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                _ => Err(invalid(format!(
                    "network config field \"{key}\"[{i}] has no {name:?} string"
                ))),
            };
            Ok(Attachment {
                container_id: field("containerID")?,
                ifname: field("ifname")?,
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<NetConf, CniError> {
        NetConf::parse(v.to_string().as_bytes())
    }

    #[test]
    fn minimal_config_gets_defaults() {
        let c =
            parse(json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "ringway-cni"}))
                .unwrap();
        assert_eq!(c.cni_version, CniVersion::V1_0_0);
        assert_eq!(c.name, "k8s-pod-network");
        assert_eq!(c.plugin_type, "ringway-cni");
        assert_eq!(c.prev_result, None);
        assert_eq!(c.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
        assert_eq!(c.log_file, None);
        assert_eq!(c.log_level, LogLevel::Warn);
        assert_eq!(c.exclude_namespaces, ["ringway-system"]);
        assert!(c.is_excluded("ringway-system"));
        assert!(!c.is_excluded("default"));
        assert!(!c.disable_gc);
        assert_eq!(c.valid_attachments, None);
        assert!(c.extra.is_empty());
    }

    #[test]
    fn every_field_and_unknown_fields_kept() {
        let c = parse(json!({
            "cniVersion": "1.1.0",
            "cniVersions": ["1.0.0", "1.1.0"],
            "name": "net",
            "type": "ringway-cni",
            "disableGC": true,
            "agentSocket": "/run/ringway/agent.sock",
            "logFile": "/var/log/ringway-cni.log",
            "logLevel": "DEBUG",
            "excludeNamespaces": ["kube-system", "ringway-system"],
            "runtimeConfig": {"portMappings": []},
            "prevResult": {"cniVersion": "1.1.0", "ips": []},
            "capabilities": {"portMappings": true},
            "somethingElse": {"nested": [1, 2]}
        }))
        .unwrap();
        assert_eq!(c.cni_versions, Some(vec!["1.0.0".into(), "1.1.0".into()]));
        assert!(c.disable_gc);
        assert_eq!(c.agent_socket, PathBuf::from("/run/ringway/agent.sock"));
        assert_eq!(c.log_file, Some(PathBuf::from("/var/log/ringway-cni.log")));
        assert_eq!(c.log_level, LogLevel::Debug);
        assert_eq!(c.exclude_namespaces, ["kube-system", "ringway-system"]);
        assert_eq!(c.runtime_config, Some(json!({"portMappings": []})));
        assert_eq!(
            c.prev_result,
            Some(json!({"cniVersion": "1.1.0", "ips": []}))
        );
        assert_eq!(
            Value::Object(c.extra),
            json!({"capabilities": {"portMappings": true}, "somethingElse": {"nested": [1, 2]}})
        );
    }

    #[test]
    fn not_json() {
        let e = NetConf::parse(b"garbage").unwrap_err();
        assert_eq!(e.code, ErrorCode::Decode);
        assert_eq!(
            e.msg,
            "network config is not valid JSON: expected value at line 1 column 1"
        );
        let e = NetConf::parse(b"").unwrap_err();
        assert_eq!(
            e.msg,
            "network config is not valid JSON: EOF while parsing a value at line 1 column 0"
        );
        let e = NetConf::parse(b"[1]").unwrap_err();
        assert_eq!(e.code, ErrorCode::Decode);
        assert_eq!(e.msg, "network config is an array, expected a JSON object");
    }

    #[test]
    fn required_fields() {
        for (v, msg) in [
            (
                json!({"name": "n", "type": "t"}),
                r#"network config has no "cniVersion""#,
            ),
            (
                json!({"cniVersion": "1.0.0", "type": "t"}),
                r#"network config has no "name""#,
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n"}),
                r#"network config has no "type""#,
            ),
            (
                json!({"cniVersion": "1.0.0", "name": "n", "type": ""}),
                r#"network config has no "type""#,
            ),
        ] {
            let e = parse(v).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (ErrorCode::InvalidConfig, msg));
        }
    }

    #[test]
    fn unsupported_version() {
        let e = parse(json!({"cniVersion": "2.0.0", "name": "n", "type": "t"})).unwrap_err();
        assert_eq!(e.code, ErrorCode::IncompatibleVersion);
        assert_eq!(
            e.msg,
            r#"cniVersion "2.0.0" is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"#
        );
    }

    #[test]
    fn wrong_types_and_values() {
        let base = || json!({"cniVersion": "1.0.0", "name": "n", "type": "t"});
        for (field, value, code, msg) in [
            (
                "type",
                json!(5),
                ErrorCode::Decode,
                r#"network config field "type" is a number, expected a string"#,
            ),
            (
                "disableGC",
                json!("yes"),
                ErrorCode::Decode,
                r#"network config field "disableGC" is a string, expected a boolean"#,
            ),
            (
                "cniVersions",
                json!("1.0.0"),
                ErrorCode::Decode,
                r#"network config field "cniVersions" is a string, expected an array of strings"#,
            ),
            (
                "excludeNamespaces",
                json!([1]),
                ErrorCode::Decode,
                r#"network config field "excludeNamespaces" is a number, expected an array of strings"#,
            ),
            (
                "excludeNamespaces",
                json!([""]),
                ErrorCode::InvalidConfig,
                r#"network config field "excludeNamespaces" has an empty namespace"#,
            ),
            (
                "agentSocket",
                json!("agent.sock"),
                ErrorCode::InvalidConfig,
                r#"network config field "agentSocket" is "agent.sock", expected an absolute path"#,
            ),
            (
                "logFile",
                json!("cni.log"),
                ErrorCode::InvalidConfig,
                r#"network config field "logFile" is "cni.log", expected an absolute path"#,
            ),
            (
                "logLevel",
                json!("loud"),
                ErrorCode::InvalidConfig,
                r#"network config field "logLevel" is "loud", expected one of error, warn, info, debug, trace"#,
            ),
            (
                "cni.dev/valid-attachments",
                json!({}),
                ErrorCode::Decode,
                r#"network config field "cni.dev/valid-attachments" is an object, expected an array"#,
            ),
            (
                "cni.dev/attachments",
                json!([{"containerID": "a"}]),
                ErrorCode::InvalidConfig,
                r#"network config field "cni.dev/attachments"[0] has no "ifname" string"#,
            ),
        ] {
            let mut v = base();
            v[field] = value;
            let e = parse(v).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (code, msg), "{field}");
        }
    }

    #[test]
    fn empty_exclude_list_is_allowed() {
        let c = parse(
            json!({"cniVersion": "1.0.0", "name": "n", "type": "t", "excludeNamespaces": []}),
        )
        .unwrap();
        assert!(c.exclude_namespaces.is_empty());
        assert!(!c.is_excluded("ringway-system"));
    }

    #[test]
    fn gc_attachments_are_merged_from_both_keys() {
        let c = parse(json!({
            "cniVersion": "1.1.0", "name": "n", "type": "t",
            "cni.dev/valid-attachments": [
                {"containerID": "b", "ifname": "eth0"},
                {"containerID": "a", "ifname": "eth0"}
            ],
            "cni.dev/attachments": [
                {"containerID": "a", "ifname": "eth0"},
                {"containerID": "c", "ifname": "net1"}
            ]
        }))
        .unwrap();
        let ids: Vec<(&str, &str)> = c
            .valid_attachments
            .as_ref()
            .unwrap()
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        assert_eq!(ids, [("a", "eth0"), ("b", "eth0"), ("c", "net1")]);
        // The raw lists stay in `extra`, untouched.
        assert!(c.extra.contains_key(VALID_ATTACHMENTS_KEY));
        assert!(c.extra.contains_key(ATTACHMENTS_KEY));
    }

    #[test]
    fn sniffing_the_version() {
        assert_eq!(
            sniff_version(br#"{"cniVersion":"0.4.0"}"#),
            Some(CniVersion::V0_4_0)
        );
        assert_eq!(sniff_version(br#"{"cniVersion":"9.9.9"}"#), None);
        assert_eq!(sniff_version(b"nope"), None);
    }
}
