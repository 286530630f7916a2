//! The `CNI_*` environment variables of one plugin invocation.
//!
//! Variables are read through [`EnvSource`], so tests (and the binary) pass a map
//! instead of touching the process environment.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::error::{CniError, ErrorCode};

/// `CNI_COMMAND`: the operation.
pub const CNI_COMMAND: &str = "CNI_COMMAND";
/// `CNI_CONTAINERID`: the sandbox id.
pub const CNI_CONTAINERID: &str = "CNI_CONTAINERID";
/// `CNI_NETNS`: path of the pod's network namespace.
pub const CNI_NETNS: &str = "CNI_NETNS";
/// `CNI_IFNAME`: interface name inside the pod.
pub const CNI_IFNAME: &str = "CNI_IFNAME";
/// `CNI_ARGS`: `K=V;K=V` extra arguments.
pub const CNI_ARGS: &str = "CNI_ARGS";
/// `CNI_PATH`: `:`-separated plugin search path.
pub const CNI_PATH: &str = "CNI_PATH";

/// Longest Linux interface name (IFNAMSIZ - 1).
const MAX_IFNAME_LEN: usize = 15;

/// Where environment variables come from.
pub trait EnvSource {
    /// The value of `name`: `Ok(None)` when unset, `Err(NotUnicode)` when set but not UTF-8.
    fn var(&self, name: &str) -> Result<Option<String>, NotUnicode>;
}

/// An environment variable whose value is not valid UTF-8.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotUnicode;

impl EnvSource for HashMap<String, String> {
    fn var(&self, name: &str) -> Result<Option<String>, NotUnicode> {
        Ok(self.get(name).cloned())
    }
}

impl EnvSource for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Result<Option<String>, NotUnicode> {
        Ok(self.get(name).cloned())
    }
}

/// Reads (never writes) the process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn var(&self, name: &str) -> Result<Option<String>, NotUnicode> {
        match std::env::var_os(name) {
            None => Ok(None),
            Some(v) => v.into_string().map(Some).map_err(|_| NotUnicode),
        }
    }
}

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach the container to the network.
    Add,
    /// Detach; idempotent and best-effort.
    Del,
    /// Verify an existing attachment (0.4.0+).
    Check,
    /// Report the supported spec versions.
    Version,
    /// Can the plugin serve ADD now? (1.1.0+)
    Status,
    /// Remove state of attachments not in the valid list (1.1.0+).
    Gc,
}

impl Command {
    /// Every command, in the order they are listed in error messages.
    pub const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Version,
        Command::Status,
        Command::Gc,
    ];

    /// The `CNI_COMMAND` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }

    /// Parses `CNI_COMMAND` (exact, upper case), naming the value and the choices on failure.
    pub fn parse(s: &str) -> Result<Command, CniError> {
        Command::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| {
                let all: Vec<&str> = Command::ALL.iter().map(|c| c.as_str()).collect();
                CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("{CNI_COMMAND} {s:?} is not one of {}", all.join(", ")),
                )
            })
    }

    /// The variables (besides `CNI_COMMAND`) the command reads; the others are ignored
    /// (not even validated), whatever the runtime put in them.
    pub fn used_vars(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check | Command::Del => {
                &[CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS, CNI_PATH]
            }
            Command::Gc => &[CNI_PATH],
            Command::Version | Command::Status => &[],
        }
    }

    /// The variables (besides `CNI_COMMAND`) that must be set and non-empty.
    pub fn required_vars(self) -> &'static [&'static str] {
        match self {
            Command::Add | Command::Check => &[CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH],
            // CNI_NETNS may be empty on DEL: the netns can already be gone.
            Command::Del => &[CNI_CONTAINERID, CNI_IFNAME, CNI_PATH],
            Command::Gc => &[CNI_PATH],
            Command::Version | Command::Status => &[],
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The environment of one invocation, validated for its command.
///
/// Variables the command does not read ([`Command::used_vars`]) are left unset here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: Command,
    /// `CNI_CONTAINERID`; always `Some` for ADD, DEL and CHECK.
    pub container_id: Option<String>,
    /// `CNI_NETNS`; always `Some` for ADD and CHECK, `None` on a DEL whose netns is gone.
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`; always `Some` for ADD, DEL and CHECK.
    pub ifname: Option<String>,
    /// `CNI_ARGS`, parsed.
    pub args: CniArgs,
    /// `CNI_PATH`, split on `:` (empty entries dropped).
    pub path: Vec<PathBuf>,
}

impl Env {
    /// Reads and validates the variables `CNI_COMMAND` needs. Fails with code 4
    /// naming the variable (all missing ones at once).
    pub fn parse(source: &dyn EnvSource) -> Result<Env, CniError> {
        let command = match read(source, CNI_COMMAND)? {
            Some(c) => Command::parse(&c)?,
            None => {
                return Err(CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("required environment variable {CNI_COMMAND} is not set"),
                ))
            }
        };

        let mut missing = Vec::new();
        let mut get = |name: &'static str| -> Result<Option<String>, CniError> {
            if !command.used_vars().contains(&name) {
                return Ok(None);
            }
            let v = read(source, name)?;
            if v.is_none() && command.required_vars().contains(&name) {
                missing.push(name);
            }
            Ok(v)
        };
        let container_id = get(CNI_CONTAINERID)?;
        let netns = get(CNI_NETNS)?;
        let ifname = get(CNI_IFNAME)?;
        let path = get(CNI_PATH)?;
        let args = get(CNI_ARGS)?;
        if !missing.is_empty() {
            let (noun, verb) = if missing.len() == 1 {
                ("variable", "is")
            } else {
                ("variables", "are")
            };
            return Err(CniError::new(
                ErrorCode::InvalidEnvironment,
                format!(
                    "required environment {noun} {} {verb} not set or empty (needed for {command})",
                    missing.join(", ")
                ),
            ));
        }

        if let Some(id) = &container_id {
            validate_container_id(id)?;
        }
        let netns = netns.map(PathBuf::from);
        if let Some(p) = &netns {
            if !p.is_absolute() {
                return Err(CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!(
                        "{CNI_NETNS} {:?} is not an absolute path",
                        p.display().to_string()
                    ),
                ));
            }
        }
        if let Some(name) = &ifname {
            validate_ifname(name)?;
        }
        let args = match args {
            Some(a) => CniArgs::parse(&a)?,
            None => CniArgs::default(),
        };
        let path = path
            .map(|p| {
                p.split(':')
                    .filter(|s| !s.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();

        Ok(Env {
            command,
            container_id,
            netns,
            ifname,
            args,
            path,
        })
    }
}

/// Reads one variable; an empty value counts as unset (as in the reference plugins).
fn read(source: &dyn EnvSource, name: &str) -> Result<Option<String>, CniError> {
    match source.var(name) {
        Ok(Some(v)) if v.is_empty() => Ok(None),
        Ok(v) => Ok(v),
        Err(NotUnicode) => Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("environment variable {name} is not valid UTF-8"),
        )),
    }
}

/// The spec's container id rule: `[a-zA-Z0-9][a-zA-Z0-9_.-]*`.
fn validate_container_id(id: &str) -> Result<(), CniError> {
    let mut chars = id.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!(
                "{CNI_CONTAINERID} {id:?} is not a valid container id \
                 (letters, digits, '_', '.', '-'; starting with a letter or digit)"
            ),
        ))
    }
}

/// Linux interface names: 1 to 15 bytes, no '/', ':' or whitespace, not "." or "..".
fn validate_ifname(name: &str) -> Result<(), CniError> {
    let problem = if name.len() > MAX_IFNAME_LEN {
        Some(format!("is longer than {MAX_IFNAME_LEN} bytes"))
    } else if name == "." || name == ".." {
        Some("is not allowed".to_owned())
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        Some("contains '/', ':' or whitespace".to_owned())
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(p) => Err(CniError::new(
            ErrorCode::InvalidEnvironment,
            format!("{CNI_IFNAME} {name:?} {p}"),
        )),
    }
}

/// `K8S_POD_NAME`.
pub const K8S_POD_NAME: &str = "K8S_POD_NAME";
/// `K8S_POD_NAMESPACE`.
pub const K8S_POD_NAMESPACE: &str = "K8S_POD_NAMESPACE";
/// `K8S_POD_UID`.
pub const K8S_POD_UID: &str = "K8S_POD_UID";
/// `K8S_POD_INFRA_CONTAINER_ID`.
pub const K8S_POD_INFRA_CONTAINER_ID: &str = "K8S_POD_INFRA_CONTAINER_ID";
/// `IgnoreUnknown`: when true, keys this plugin does not know are accepted.
pub const IGNORE_UNKNOWN: &str = "IgnoreUnknown";

/// `CNI_ARGS`, parsed. Empty values count as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`.
    pub pod_infra_container_id: Option<String>,
    /// `IgnoreUnknown` (`1`/`true` or `0`/`false`, any case).
    pub ignore_unknown: bool,
    /// Keys this plugin does not interpret (only accepted with `IgnoreUnknown`).
    pub other: BTreeMap<String, String>,
}

impl CniArgs {
    /// Parses `K=V;K=V`. Empty segments (`A=1;;B=2`, a trailing `;`) are skipped; a
    /// segment without `=`, an empty key, or a repeated key is an error (code 4), as is
    /// an unknown key unless `IgnoreUnknown` is true (the convention of the reference
    /// plugins; Kubernetes runtimes always pass `IgnoreUnknown=1`).
    pub fn parse(raw: &str) -> Result<CniArgs, CniError> {
        let bad = |problem: String| {
            CniError::new(
                ErrorCode::InvalidEnvironment,
                format!("{CNI_ARGS} {raw:?} is malformed: {problem}"),
            )
            .with_details("expected K=V pairs separated by ';'")
        };
        let mut pairs: BTreeMap<&str, &str> = BTreeMap::new();
        for segment in raw.split(';') {
            if segment.is_empty() {
                continue;
            }
            let Some((k, v)) = segment.split_once('=') else {
                return Err(bad(format!("pair {segment:?} has no '='")));
            };
            if k.is_empty() {
                return Err(bad(format!("pair {segment:?} has an empty key")));
            }
            if pairs.insert(k, v).is_some() {
                return Err(bad(format!("key {k:?} is given more than once")));
            }
        }

        let mut args = CniArgs::default();
        for (k, v) in pairs {
            let value = (!v.is_empty()).then(|| v.to_owned());
            match k {
                K8S_POD_NAME => args.pod_name = value,
                K8S_POD_NAMESPACE => args.pod_namespace = value,
                K8S_POD_UID => args.pod_uid = value,
                K8S_POD_INFRA_CONTAINER_ID => args.pod_infra_container_id = value,
                IGNORE_UNKNOWN => {
                    args.ignore_unknown = match v.to_ascii_lowercase().as_str() {
                        "1" | "true" => true,
                        "0" | "false" => false,
                        _ => {
                            return Err(bad(format!(
                                "{IGNORE_UNKNOWN} is {v:?}, expected 1, 0, true or false"
                            )))
                        }
                    }
                }
                _ => {
                    args.other.insert(k.to_owned(), v.to_owned());
                }
            }
        }
        if !args.ignore_unknown {
            if let Some(k) = args.other.keys().next() {
                return Err(CniError::new(
                    ErrorCode::InvalidEnvironment,
                    format!("{CNI_ARGS} has unknown key {k:?} and no {IGNORE_UNKNOWN}=1"),
                ));
            }
        }
        Ok(args)
    }

    /// The Kubernetes pod, when both `K8S_POD_NAME` and `K8S_POD_NAMESPACE` are set.
    pub fn pod(&self) -> Option<PodRef> {
        Some(PodRef {
            name: self.pod_name.clone()?,
            namespace: self.pod_namespace.clone()?,
            uid: self.pod_uid.clone(),
            infra_container_id: self.pod_infra_container_id.clone(),
        })
    }
}

/// A Kubernetes pod, as named by the runtime in `CNI_ARGS`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_UID`, when given.
    pub uid: Option<String>,
    /// `K8S_POD_INFRA_CONTAINER_ID`, when given.
    pub infra_container_id: Option<String>,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const FULL: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "abc123"),
        ("CNI_NETNS", "/var/run/netns/cni-1234"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin::/usr/libexec/cni"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;\
             K8S_POD_INFRA_CONTAINER_ID=abc123;K8S_POD_UID=1f2e",
        ),
    ];

    fn without(name: &str, command: &str) -> HashMap<String, String> {
        let mut m = env(FULL);
        m.remove(name);
        m.insert("CNI_COMMAND".into(), command.into());
        m
    }

    #[test]
    fn full_add_environment() {
        let e = Env::parse(&env(FULL)).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id.as_deref(), Some("abc123"));
        assert_eq!(e.netns, Some(PathBuf::from("/var/run/netns/cni-1234")));
        assert_eq!(e.ifname.as_deref(), Some("eth0"));
        assert_eq!(
            e.path,
            vec![
                PathBuf::from("/opt/cni/bin"),
                PathBuf::from("/usr/libexec/cni")
            ]
        );
        assert_eq!(
            e.args.pod(),
            Some(PodRef {
                name: "web-0".into(),
                namespace: "default".into(),
                uid: Some("1f2e".into()),
                infra_container_id: Some("abc123".into()),
            })
        );
        assert!(e.args.ignore_unknown);
    }

    #[test]
    fn commands_parse_exactly() {
        for c in Command::ALL {
            assert_eq!(Command::parse(c.as_str()).unwrap(), c);
        }
        let e = Command::parse("add").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnvironment);
        assert_eq!(
            e.msg,
            r#"CNI_COMMAND "add" is not one of ADD, DEL, CHECK, VERSION, STATUS, GC"#
        );
    }

    #[test]
    fn missing_command() {
        let e = Env::parse(&env(&[])).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnvironment);
        assert_eq!(
            e.msg,
            "required environment variable CNI_COMMAND is not set"
        );
    }

    #[test]
    fn each_required_variable_is_named() {
        for (command, vars) in [
            (
                "ADD",
                &[CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH][..],
            ),
            (
                "CHECK",
                &[CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH][..],
            ),
            ("DEL", &[CNI_CONTAINERID, CNI_IFNAME, CNI_PATH][..]),
            ("GC", &[CNI_PATH][..]),
        ] {
            for var in vars {
                let e = Env::parse(&without(var, command)).unwrap_err();
                assert_eq!(e.code, ErrorCode::InvalidEnvironment);
                assert_eq!(
                    e.msg,
                    format!(
                        "required environment variable {var} is not set or empty (needed for {command})"
                    )
                );
            }
        }
    }

    #[test]
    fn empty_value_counts_as_missing_and_all_missing_are_listed() {
        let e = Env::parse(&env(&[("CNI_COMMAND", "ADD"), ("CNI_CONTAINERID", "")])).unwrap_err();
        assert_eq!(
            e.msg,
            "required environment variables CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_PATH \
             are not set or empty (needed for ADD)"
        );
    }

    #[test]
    fn del_allows_empty_netns() {
        let mut m = without(CNI_NETNS, "DEL");
        let e = Env::parse(&m).unwrap();
        assert_eq!(e.netns, None);
        m.insert(CNI_NETNS.into(), String::new());
        assert_eq!(Env::parse(&m).unwrap().netns, None);
    }

    #[test]
    fn version_and_status_need_only_the_command() {
        for c in ["VERSION", "STATUS"] {
            let e = Env::parse(&env(&[("CNI_COMMAND", c)])).unwrap();
            assert_eq!(e.command.as_str(), c);
            assert_eq!(e.container_id, None);
        }
    }

    #[test]
    fn variables_a_command_does_not_use_are_ignored() {
        let junk = [
            ("CNI_CONTAINERID", "-bad"),
            ("CNI_NETNS", "relative"),
            ("CNI_IFNAME", "way/too/long/an/ifname"),
            ("CNI_ARGS", "garbage"),
        ];
        for c in ["VERSION", "STATUS", "GC"] {
            let mut m = env(&junk);
            m.insert("CNI_COMMAND".into(), c.into());
            m.insert("CNI_PATH".into(), "/opt/cni/bin".into());
            let e = Env::parse(&m).unwrap();
            assert_eq!((e.container_id, e.netns, e.ifname), (None, None, None));
            assert_eq!(e.args, CniArgs::default());
        }
    }

    #[test]
    fn relative_netns_is_rejected() {
        let mut m = env(FULL);
        m.insert(CNI_NETNS.into(), "netns/cni-1".into());
        let e = Env::parse(&m).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnvironment);
        assert_eq!(e.msg, r#"CNI_NETNS "netns/cni-1" is not an absolute path"#);
    }

    #[test]
    fn invalid_container_id_and_ifname() {
        let mut m = env(FULL);
        m.insert(CNI_CONTAINERID.into(), "-abc".into());
        let e = Env::parse(&m).unwrap_err();
        assert!(e
            .msg
            .starts_with(r#"CNI_CONTAINERID "-abc" is not a valid container id"#));

        for (name, problem) in [
            ("a-very-long-interface-name", "is longer than 15 bytes"),
            ("eth/0", "contains '/', ':' or whitespace"),
            ("eth 0", "contains '/', ':' or whitespace"),
            ("..", "is not allowed"),
        ] {
            let mut m = env(FULL);
            m.insert(CNI_IFNAME.into(), name.into());
            let e = Env::parse(&m).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidEnvironment);
            assert_eq!(e.msg, format!("CNI_IFNAME {name:?} {problem}"));
        }
    }

    #[test]
    fn not_unicode_is_named() {
        struct Bad;
        impl EnvSource for Bad {
            fn var(&self, name: &str) -> Result<Option<String>, NotUnicode> {
                match name {
                    "CNI_COMMAND" => Ok(Some("DEL".into())),
                    "CNI_CONTAINERID" => Err(NotUnicode),
                    _ => Ok(None),
                }
            }
        }
        let e = Env::parse(&Bad).unwrap_err();
        assert_eq!(
            e.msg,
            "environment variable CNI_CONTAINERID is not valid UTF-8"
        );
    }

    #[test]
    fn args_malformed() {
        for (raw, problem) in [
            ("K8S_POD_NAME", r#"pair "K8S_POD_NAME" has no '='"#),
            ("IgnoreUnknown=1;=x", r#"pair "=x" has an empty key"#),
            (
                "IgnoreUnknown=1;K8S_POD_NAME=a;K8S_POD_NAME=b",
                r#"key "K8S_POD_NAME" is given more than once"#,
            ),
            (
                "IgnoreUnknown=yes",
                r#"IgnoreUnknown is "yes", expected 1, 0, true or false"#,
            ),
        ] {
            let e = CniArgs::parse(raw).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidEnvironment);
            assert_eq!(e.msg, format!("CNI_ARGS {raw:?} is malformed: {problem}"));
            assert_eq!(e.details, "expected K=V pairs separated by ';'");
        }
    }

    #[test]
    fn args_unknown_keys_need_ignore_unknown() {
        let e = CniArgs::parse("K8S_POD_NAME=a;FOO=1").unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnvironment);
        assert_eq!(
            e.msg,
            r#"CNI_ARGS has unknown key "FOO" and no IgnoreUnknown=1"#
        );

        let a = CniArgs::parse("IgnoreUnknown=true;FOO=1;K8S_POD_NAME=a;").unwrap();
        assert_eq!(a.other.get("FOO").map(String::as_str), Some("1"));
        assert_eq!(a.pod_name.as_deref(), Some("a"));
        assert_eq!(a.pod(), None, "no namespace, no pod");
    }

    #[test]
    fn args_edge_cases() {
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse(";;").unwrap(), CniArgs::default());
        // '=' inside a value is kept; empty values count as absent.
        let a = CniArgs::parse("IgnoreUnknown=1;X=a=b;K8S_POD_UID=").unwrap();
        assert_eq!(a.other.get("X").map(String::as_str), Some("a=b"));
        assert_eq!(a.pod_uid, None);
    }

    #[test]
    fn malformed_args_fail_env_parse() {
        let mut m = env(FULL);
        m.insert(CNI_ARGS.into(), "garbage".into());
        let e = Env::parse(&m).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidEnvironment);
        assert_eq!(
            e.msg,
            r#"CNI_ARGS "garbage" is malformed: pair "garbage" has no '='"#
        );
    }
}
