//! Environment overrides: single settings replaced by `RINGWAY_*` variables,
//! read through [`EnvSource`] so tests pass a map instead of mutating the
//! process environment.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::error::ConfigError;
use crate::file::MeshConfig;
use crate::file::{
    ENV_CLUSTER_ID, ENV_NODE_REGION, ENV_NODE_ZONE, ENV_ROOT_NAMESPACE, ENV_TRUST_DOMAIN,
};
use crate::model::EnvOverride;
use crate::settings::{
    duration_secs::MAX_SECS, ENV_BACKLOG, ENV_BUSY_POLL_MICROS, ENV_CAPTURE_MODE,
    ENV_CONNECT_TIMEOUT, ENV_DATAPATH, ENV_DRAIN_PERIOD, ENV_PIPE_POOL, ENV_PIPE_SIZE,
    ENV_PROXY_MARK, ENV_SAME_NODE_FAST_PATH, ENV_WORKERS, ENV_WORKLOAD_WAIT,
};

/// Where environment variables come from.
pub trait EnvSource {
    /// The value of `name`, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment (a value that is not UTF-8 is read lossily,
/// then refused by the setting's parser).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl EnvSource for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }
}

/// No variables at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEnv;

impl EnvSource for NoEnv {
    fn var(&self, _: &str) -> Option<String> {
        None
    }
}

impl EnvSource for HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

impl EnvSource for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

impl EnvSource for [(&str, &str)] {
    fn var(&self, name: &str) -> Option<String> {
        self.iter()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

impl<const N: usize> EnvSource for [(&str, &str); N] {
    fn var(&self, name: &str) -> Option<String> {
        self[..].var(name)
    }
}

impl<T: EnvSource + ?Sized> EnvSource for &T {
    fn var(&self, name: &str) -> Option<String> {
        (**self).var(name)
    }
}

impl<T: EnvSource + ?Sized> EnvSource for Box<T> {
    fn var(&self, name: &str) -> Option<String> {
        (**self).var(name)
    }
}

/// One setting that an environment variable overrides.
#[derive(Debug)]
pub struct EnvVar {
    /// The variable, e.g. `RINGWAY_WORKERS`.
    pub name: &'static str,
    /// The field it replaces, as a path in the YAML document.
    pub field: &'static str,
    /// The accepted values.
    pub help: &'static str,
    apply: fn(&mut MeshConfig, &str) -> Result<(), EnvValueError>,
}

/// Every variable ringway-config reads, in the order they are applied.
pub static ENV_VARS: &[EnvVar] = &[
    EnvVar {
        name: ENV_CAPTURE_MODE,
        field: "proxy.captureMode",
        help: "tproxy or redirect",
        apply: |c, v| {
            c.proxy.capture_mode = v.parse().map_err(EnvValueError::Setting)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_DATAPATH,
        field: "proxy.datapath",
        help: "auto, uring or epoll",
        apply: |c, v| {
            c.proxy.datapath = v.parse().map_err(EnvValueError::Setting)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_WORKERS,
        field: "proxy.workers",
        help: "whole number; 0 = one per CPU",
        apply: |c, v| {
            c.proxy.workers = whole(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_PIPE_SIZE,
        field: "proxy.pipeSize",
        help: "bytes per splice pipe",
        apply: |c, v| {
            c.proxy.pipe_size = whole(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_PIPE_POOL,
        field: "proxy.pipePool",
        help: "idle pipes kept per worker",
        apply: |c, v| {
            c.proxy.pipe_pool = whole(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_BACKLOG,
        field: "proxy.backlog",
        help: "listen backlog",
        apply: |c, v| {
            c.proxy.backlog = whole(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_PROXY_MARK,
        field: "proxy.proxyMark",
        help: "decimal or 0x hexadecimal",
        apply: |c, v| {
            c.proxy.proxy_mark = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                Some(hex) => u32::from_str_radix(hex, 16)
                    .map_err(|_| EnvValueError::Hexadecimal(v.to_owned()))?,
                None => whole(v)?,
            };
            Ok(())
        },
    },
    EnvVar {
        name: ENV_SAME_NODE_FAST_PATH,
        field: "proxy.sameNodeFastPath",
        help: "true or false",
        apply: |c, v| {
            c.proxy.same_node_fast_path = match v {
                "true" => true,
                "false" => false,
                _ => return Err(EnvValueError::Boolean(v.to_owned())),
            };
            Ok(())
        },
    },
    EnvVar {
        name: ENV_DRAIN_PERIOD,
        field: "proxy.drainPeriod",
        help: "seconds: 30, 1.5, 30s or 500ms",
        apply: |c, v| {
            c.proxy.drain_period = duration(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_CONNECT_TIMEOUT,
        field: "proxy.connectTimeout",
        help: "seconds: 10, 1.5, 10s or 500ms; not 0",
        apply: |c, v| {
            c.proxy.connect_timeout = duration(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_WORKLOAD_WAIT,
        field: "proxy.workloadWait",
        help: "seconds: 5, 1.5, 5s or 500ms; at most 60",
        apply: |c, v| {
            c.proxy.workload_wait = duration(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_BUSY_POLL_MICROS,
        field: "proxy.busyPollMicros",
        help: "microseconds, 0..=1000; 0 = off",
        apply: |c, v| {
            c.proxy.busy_poll_micros = whole(v)?;
            Ok(())
        },
    },
    EnvVar {
        name: ENV_TRUST_DOMAIN,
        field: "trustDomain",
        help: "SPIFFE trust domain",
        apply: |c, v| {
            c.trust_domain = v.to_owned();
            Ok(())
        },
    },
    EnvVar {
        name: ENV_CLUSTER_ID,
        field: "clusterId",
        help: "cluster ID of the metrics' *_cluster labels",
        apply: |c, v| {
            c.cluster_id = v.to_owned();
            Ok(())
        },
    },
    EnvVar {
        name: ENV_NODE_REGION,
        field: "locality.region",
        help: "this node's topology.kubernetes.io/region",
        apply: |c, v| {
            c.locality.region = v.to_owned();
            Ok(())
        },
    },
    EnvVar {
        name: ENV_NODE_ZONE,
        field: "locality.zone",
        help: "this node's topology.kubernetes.io/zone",
        apply: |c, v| {
            c.locality.zone = v.to_owned();
            Ok(())
        },
    },
    EnvVar {
        name: ENV_ROOT_NAMESPACE,
        field: "rootNamespace",
        help: "namespace whose policies apply mesh-wide",
        apply: |c, v| {
            c.root_namespace = v.to_owned();
            Ok(())
        },
    },
];

/// Why a variable's value cannot be used (the variable is the caller's:
/// [`ConfigError::Env`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum EnvValueError {
    /// Not one of the setting's words (`tproxy`, `redirect`, ...): the
    /// setting's own error.
    #[error("{}", problem(.0))]
    Setting(ConfigError),
    /// Not a whole number in the setting's range.
    #[error("{0:?} is not a whole number in range")]
    Whole(String),
    /// Not a 32-bit hexadecimal number.
    #[error("{0:?} is not a 32-bit hexadecimal number")]
    Hexadecimal(String),
    /// Not `true` or `false`.
    #[error("{0:?} is not one of \"true\", \"false\"")]
    Boolean(String),
    /// Not a duration.
    #[error("{0:?} is not a duration (seconds: 30, 1.5, 30s or 500ms)")]
    Duration(String),
    /// A duration outside 0..=86400 seconds.
    #[error("{0:?} is outside 0..=86400 seconds")]
    DurationRange(String),
}

/// The problem of a setting's error, without its field.
fn problem(e: &ConfigError) -> String {
    match e {
        ConfigError::Invalid { problem, .. } => problem.clone(),
        other => other.to_string(),
    }
}

fn whole<T: std::str::FromStr>(v: &str) -> Result<T, EnvValueError> {
    // `FromStr` for integers accepts a leading `+`; a setting does not need it.
    v.parse::<T>()
        .ok()
        .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| EnvValueError::Whole(v.to_owned()))
}

fn duration(v: &str) -> Result<Duration, EnvValueError> {
    let (number, scale) = if let Some(ms) = v.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = v.strip_suffix('s') {
        (s, 1.0)
    } else {
        (v, 1.0)
    };
    let secs = number
        .parse::<f64>()
        .ok()
        .filter(|_| number.bytes().all(|b| b.is_ascii_digit() || b == b'.'))
        .map(|n| n * scale)
        .ok_or_else(|| EnvValueError::Duration(v.to_owned()))?;
    if !(0.0..=MAX_SECS).contains(&secs) {
        return Err(EnvValueError::DurationRange(v.to_owned()));
    }
    Ok(Duration::from_secs_f64(secs))
}

impl MeshConfig {
    /// Applies the `RINGWAY_*` overrides ([`crate::ENV_VARS`]) that `env`
    /// sets; the error names the variable.
    pub fn apply_env(&mut self, env: &dyn EnvSource) -> Result<Vec<EnvOverride>, ConfigError> {
        apply(self, env)
    }
}

/// Applies every set variable of [`ENV_VARS`] to `cfg`. An empty (or
/// all-blank) value counts as unset.
pub(crate) fn apply(
    cfg: &mut MeshConfig,
    env: &dyn EnvSource,
) -> Result<Vec<EnvOverride>, ConfigError> {
    let mut applied = Vec::new();
    for var in ENV_VARS {
        let Some(raw) = env.var(var.name) else {
            continue;
        };
        let value = raw.trim();
        if value.is_empty() {
            continue;
        }
        (var.apply)(cfg, value).map_err(|e| ConfigError::Env {
            var: var.name,
            problem: e.to_string(),
        })?;
        applied.push(EnvOverride {
            var: var.name,
            field: var.field,
            value: value.to_owned(),
        });
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::{CaptureMode, Datapath, ProxySettings};

    fn load(env: &[(&str, &str)]) -> Result<crate::Mesh, ConfigError> {
        MeshConfig::load(None, &env)
    }

    fn env_error(var: &str, value: &str) -> String {
        load(&[(var, value)]).unwrap_err().to_string()
    }

    #[test]
    fn every_variable_overrides_its_field() {
        let mesh = load(&[
            ("RINGWAY_CAPTURE_MODE", "redirect"),
            ("RINGWAY_DATAPATH", "epoll"),
            ("RINGWAY_WORKERS", "3"),
            ("RINGWAY_PIPE_SIZE", "65536"),
            ("RINGWAY_PIPE_POOL", "7"),
            ("RINGWAY_BACKLOG", "128"),
            ("RINGWAY_PROXY_MARK", "0x1f"),
            ("RINGWAY_SAME_NODE_FAST_PATH", "false"),
            ("RINGWAY_DRAIN_PERIOD", "500ms"),
            ("RINGWAY_CONNECT_TIMEOUT", "2.5"),
            ("RINGWAY_WORKLOAD_WAIT", "1.5"),
            ("RINGWAY_BUSY_POLL_MICROS", "50"),
            ("RINGWAY_TRUST_DOMAIN", "example.org"),
            ("RINGWAY_CLUSTER_ID", "east-1"),
            ("RINGWAY_NODE_REGION", "eu-west1"),
            ("RINGWAY_NODE_ZONE", "eu-west1-b"),
            ("RINGWAY_ROOT_NAMESPACE", "mesh-root"),
        ])
        .unwrap();
        let p = mesh.proxy();
        assert_eq!(p.capture_mode, CaptureMode::Redirect);
        assert_eq!(p.datapath, Datapath::Epoll);
        assert_eq!(p.workers, 3);
        assert_eq!(p.pipe_size, 65536);
        assert_eq!(p.pipe_pool, 7);
        assert_eq!(p.backlog, 128);
        assert_eq!(p.proxy_mark, 0x1f);
        assert!(!p.same_node_fast_path);
        assert_eq!(p.drain_period, Duration::from_millis(500));
        assert_eq!(p.connect_timeout, Duration::from_millis(2500));
        assert_eq!(p.workload_wait, Duration::from_millis(1500));
        assert_eq!(p.busy_poll_micros, 50);
        assert_eq!(mesh.trust_domain(), "example.org");
        assert_eq!(mesh.root_namespace(), "mesh-root");
        assert_eq!(mesh.cluster_id(), "east-1");
        assert_eq!(mesh.node_locality().region, "eu-west1");
        assert_eq!(mesh.node_locality().zone, "eu-west1-b");
        assert_eq!(mesh.env_overrides().len(), ENV_VARS.len());
        // Untouched fields keep the file's values.
        assert_eq!(p.ports, ProxySettings::default().ports);
    }

    #[test]
    fn durations_and_marks() {
        for (text, want) in [
            ("30", 30_000),
            ("1.5", 1_500),
            ("2s", 2_000),
            ("250ms", 250),
            ("0", 0),
        ] {
            let mesh = load(&[("RINGWAY_DRAIN_PERIOD", text)]).unwrap();
            assert_eq!(
                mesh.proxy().drain_period,
                Duration::from_millis(want),
                "{text}"
            );
        }
        let mesh = load(&[("RINGWAY_PROXY_MARK", "1337")]).unwrap();
        assert_eq!(mesh.proxy().proxy_mark, 0x539);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            (
                "RINGWAY_CAPTURE_MODE",
                "nat",
                "environment variable RINGWAY_CAPTURE_MODE: \"nat\" is not one of \"tproxy\", \"redirect\"",
            ),
            (
                "RINGWAY_DATAPATH",
                "io_uring",
                "environment variable RINGWAY_DATAPATH: \"io_uring\" is not one of \"auto\", \"uring\", \"epoll\"",
            ),
            (
                "RINGWAY_WORKERS",
                "many",
                "environment variable RINGWAY_WORKERS: \"many\" is not a whole number in range",
            ),
            (
                "RINGWAY_WORKERS",
                "-1",
                "environment variable RINGWAY_WORKERS: \"-1\" is not a whole number in range",
            ),
            (
                "RINGWAY_PIPE_SIZE",
                "1M",
                "environment variable RINGWAY_PIPE_SIZE: \"1M\" is not a whole number in range",
            ),
            (
                "RINGWAY_PIPE_POOL",
                "+3",
                "environment variable RINGWAY_PIPE_POOL: \"+3\" is not a whole number in range",
            ),
            (
                "RINGWAY_BACKLOG",
                "99999999999",
                "environment variable RINGWAY_BACKLOG: \"99999999999\" is not a whole number in range",
            ),
            (
                "RINGWAY_PROXY_MARK",
                "0xzz",
                "environment variable RINGWAY_PROXY_MARK: \"0xzz\" is not a 32-bit hexadecimal number",
            ),
            (
                "RINGWAY_SAME_NODE_FAST_PATH",
                "yes",
                "environment variable RINGWAY_SAME_NODE_FAST_PATH: \"yes\" is not one of \"true\", \"false\"",
            ),
            (
                "RINGWAY_DRAIN_PERIOD",
                "1m",
                "environment variable RINGWAY_DRAIN_PERIOD: \"1m\" is not a duration (seconds: 30, 1.5, 30s or 500ms)",
            ),
            (
                "RINGWAY_DRAIN_PERIOD",
                "-1",
                "environment variable RINGWAY_DRAIN_PERIOD: \"-1\" is not a duration (seconds: 30, 1.5, 30s or 500ms)",
            ),
            (
                "RINGWAY_DRAIN_PERIOD",
                "inf",
                "environment variable RINGWAY_DRAIN_PERIOD: \"inf\" is not a duration (seconds: 30, 1.5, 30s or 500ms)",
            ),
            (
                "RINGWAY_DRAIN_PERIOD",
                "90000",
                "environment variable RINGWAY_DRAIN_PERIOD: \"90000\" is outside 0..=86400 seconds",
            ),
        ];
        for (var, value, want) in cases {
            assert_eq!(env_error(var, value), want);
        }
    }

    #[test]
    fn values_that_fail_validation_are_reported_against_the_variable() {
        assert_eq!(
            env_error("RINGWAY_WORKERS", "5000"),
            "environment variable RINGWAY_WORKERS: proxy.workers: 5000 workers is more than 1024"
        );
        assert_eq!(
            env_error("RINGWAY_BUSY_POLL_MICROS", "2000"),
            "environment variable RINGWAY_BUSY_POLL_MICROS: proxy.busyPollMicros: 2000 µs is outside 0..=1000 µs"
        );
        assert_eq!(
            env_error("RINGWAY_PIPE_SIZE", "10"),
            "environment variable RINGWAY_PIPE_SIZE: proxy.pipeSize: 10 is outside 4096..=67108864 bytes"
        );
        assert!(
            env_error("RINGWAY_CONNECT_TIMEOUT", "0").starts_with(
                "environment variable RINGWAY_CONNECT_TIMEOUT: proxy.connectTimeout: a connect timeout of 0 s"
            ),
            "{}",
            env_error("RINGWAY_CONNECT_TIMEOUT", "0")
        );
        assert_eq!(
            env_error("RINGWAY_TRUST_DOMAIN", "Example.org"),
            "environment variable RINGWAY_TRUST_DOMAIN: trustDomain: \"Example.org\" is not a valid \
             trust domain: contains \"E\" (only lowercase letters, digits, \".\", \"-\" and \"_\" are allowed)"
        );
        assert_eq!(
            env_error("RINGWAY_ROOT_NAMESPACE", "a.b"),
            "environment variable RINGWAY_ROOT_NAMESPACE: rootNamespace: \"a.b\" is not a valid \
             namespace: contains \".\" (only lowercase letters, digits and \"-\" are allowed)"
        );
        // A field the variable did not set is still blamed on the file.
        let err = MeshConfig::load_str(
            "proxy: {backlog: 0}\n",
            "f.yaml",
            &[("RINGWAY_WORKERS", "2")],
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "f.yaml: proxy.backlog: a listen backlog of 0 refuses bursts"
        );
    }

    #[test]
    fn blank_values_are_unset_and_values_are_trimmed() {
        let mesh = load(&[("RINGWAY_WORKERS", ""), ("RINGWAY_BACKLOG", "  64 ")]).unwrap();
        assert_eq!(mesh.proxy().workers, 0);
        assert_eq!(mesh.proxy().backlog, 64);
        assert_eq!(
            mesh.env_overrides(),
            [EnvOverride {
                var: "RINGWAY_BACKLOG",
                field: "proxy.backlog",
                value: "64".into()
            }]
        );
    }

    #[test]
    fn sources() {
        let map: HashMap<String, String> = [("RINGWAY_WORKERS".to_owned(), "2".to_owned())].into();
        assert_eq!(MeshConfig::load(None, &map).unwrap().proxy().workers, 2);
        let tree: BTreeMap<String, String> =
            [("RINGWAY_WORKERS".to_owned(), "3".to_owned())].into();
        assert_eq!(MeshConfig::load(None, &tree).unwrap().proxy().workers, 3);
        let boxed: Box<dyn EnvSource> = Box::new([("RINGWAY_WORKERS", "4")]);
        assert_eq!(MeshConfig::load(None, &boxed).unwrap().proxy().workers, 4);
        // The last of repeated pairs wins, as in a process environment built by appending.
        let pairs = [("RINGWAY_WORKERS", "5"), ("RINGWAY_WORKERS", "6")];
        assert_eq!(MeshConfig::load(None, &pairs).unwrap().proxy().workers, 6);
        assert!(NoEnv.var("PATH").is_none());
        // Reading the real environment works (nothing is mutated).
        let _ = ProcessEnv.var("PATH");
    }

    #[test]
    fn table_matches_the_constants() {
        let names: Vec<&str> = ENV_VARS.iter().map(|v| v.name).collect();
        assert_eq!(
            names,
            [
                ENV_CAPTURE_MODE,
                ENV_DATAPATH,
                ENV_WORKERS,
                ENV_PIPE_SIZE,
                ENV_PIPE_POOL,
                ENV_BACKLOG,
                ENV_PROXY_MARK,
                ENV_SAME_NODE_FAST_PATH,
                ENV_DRAIN_PERIOD,
                ENV_CONNECT_TIMEOUT,
                ENV_WORKLOAD_WAIT,
                ENV_BUSY_POLL_MICROS,
                ENV_TRUST_DOMAIN,
                ENV_CLUSTER_ID,
                ENV_NODE_REGION,
                ENV_NODE_ZONE,
                ENV_ROOT_NAMESPACE,
            ]
        );
        assert!(names.iter().all(|n| n.starts_with("RINGWAY_")));
    }
}
