//! The proxy's datapath settings ([`ProxySettings`]) and the environment
//! variables that override them.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// How a pod's traffic is steered to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureMode {
    /// Inbound by TPROXY (no NAT), outbound by nat REDIRECT.
    #[default]
    Tproxy,
    /// Inbound and outbound by nat REDIRECT (for kernels/CNIs where TPROXY misbehaves).
    Redirect,
}

impl std::fmt::Display for CaptureMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CaptureMode::Tproxy => "tproxy",
            CaptureMode::Redirect => "redirect",
        })
    }
}

impl std::str::FromStr for CaptureMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tproxy" => Ok(CaptureMode::Tproxy),
            "redirect" => Ok(CaptureMode::Redirect),
            other => Err(ConfigError::Invalid {
                field: "captureMode",
                problem: format!("{other:?} is not one of \"tproxy\", \"redirect\""),
            }),
        }
    }
}

/// Which event loop the datapath workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Datapath {
    /// io_uring when the kernel allows it, else epoll (logged once).
    #[default]
    Auto,
    /// io_uring only: fail to start without it.
    Uring,
    /// epoll only.
    Epoll,
}

impl std::fmt::Display for Datapath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Datapath::Auto => "auto",
            Datapath::Uring => "uring",
            Datapath::Epoll => "epoll",
        })
    }
}

impl std::str::FromStr for Datapath {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Datapath::Auto),
            "uring" => Ok(Datapath::Uring),
            "epoll" => Ok(Datapath::Epoll),
            other => Err(ConfigError::Invalid {
                field: "datapath",
                problem: format!("{other:?} is not one of \"auto\", \"uring\", \"epoll\""),
            }),
        }
    }
}

/// The well-known ports of a pod's listener set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ports {
    /// Outbound capture listener (app -> anywhere).
    pub outbound: u16,
    /// Inbound plaintext capture listener (peer -> app).
    pub inbound: u16,
    /// Inbound tunnel (HBONE) listener; never captured.
    pub tunnel: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            outbound: 15001,
            inbound: 15006,
            tunnel: 15008,
        }
    }
}

/// Settings of the proxy's datapath.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProxySettings {
    /// Capture mode the pods' rules were installed with.
    pub capture_mode: CaptureMode,
    /// Listener ports.
    pub ports: Ports,
    /// SO_MARK on every socket the proxy opens inside a pod (never captured).
    pub proxy_mark: u32,
    /// Datapath workers; 0 means one per CPU.
    pub workers: usize,
    /// Event loop choice.
    pub datapath: Datapath,
    /// Requested capacity of each copy pipe, bytes.
    pub pipe_size: usize,
    /// Pipes kept for reuse per worker.
    pub pipe_pool: usize,
    /// Listen backlog of each listener.
    pub backlog: u32,
    /// Same-node fast path: when the destination of an outbound connection
    /// is another pod this proxy serves, connect straight into that pod
    /// (applying the inbound side's rules: spoofed client source, proxy
    /// mark) instead of crossing the node network and being captured again.
    pub same_node_fast_path: bool,
    /// How long the proxy keeps serving established connections after it
    /// was asked to stop.
    #[serde(with = "duration_secs")]
    pub drain_period: Duration,
    /// How long a plaintext upstream connect may take before it is given up
    /// (the client is reset, or a service's next endpoint is tried) instead
    /// of waiting for the kernel's SYN retries (about two minutes). HBONE
    /// uses it too: a tunnel's TCP connect and TLS handshake, and the
    /// inbound side's connect to the app.
    #[serde(with = "duration_secs")]
    pub connect_timeout: Duration,
    /// How long a connection to or from a pod waits for the pod's workload
    /// (its identity, labels and policies) when the mesh comes from a control
    /// plane that has not sent it yet; then it is refused and counted, never
    /// authorized against a guess. Not used where the configuration file is
    /// the whole mesh.
    #[serde(with = "duration_secs")]
    pub workload_wait: Duration,
    /// Limits of the tunnel listener (15008) against hostile peers.
    pub hbone: HboneSettings,
    /// Busy-poll window, microseconds: after a socket of the datapath
    /// became ready, a worker keeps polling its event loop without
    /// sleeping for this long before it parks (0 = off). Spinning only
    /// follows activity: an idle worker sleeps.
    pub busy_poll_micros: u32,
}

/// Limits of the tunnel listener (`proxy.hbone`): what a connection to a
/// pod's port 15008 may cost before and after it authenticates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HboneSettings {
    /// Ports of the proxy a CONNECT may never target in the destination pod,
    /// besides `ports.*` (always refused): its control endpoints.
    pub reserved_ports: Vec<u16>,
    /// Largest request header list accepted on a tunnel (HTTP/2
    /// SETTINGS_MAX_HEADER_LIST_SIZE), bytes.
    pub max_header_list_size: u32,
    /// Streams of one HTTP/2 connection whose authorization and upstream
    /// connect may be under way at once; more wait.
    pub max_connecting_streams: u32,
    /// Streams of one HTTP/2 connection the peer may reset before they are
    /// answered; one more and the connection gets GOAWAY (rapid reset).
    pub max_early_resets: u32,
    /// Bound on the TLS handshake of an accepted tunnel connection (each
    /// connection's deadline is drawn in `[bound / 2, bound]`).
    #[serde(with = "duration_secs")]
    pub handshake_timeout: Duration,
    /// Bound on the HTTP/2 preface and SETTINGS after TLS (jittered per
    /// connection as `handshake_timeout`).
    #[serde(with = "duration_secs")]
    pub preface_timeout: Duration,
    /// An HTTP/2 connection without streams for this long is closed.
    #[serde(with = "duration_secs")]
    pub idle_timeout: Duration,
    /// Tunnel connections not yet authenticated (TLS + HTTP/2 preface) at
    /// once from one source address, per pod; more are reset.
    pub max_preauth_per_source: u32,
    /// Tunnel connections not yet authenticated at once per pod; more are
    /// reset.
    pub max_preauth_per_pod: u32,
    /// Nice value of the thread running the tunnel listener's server TLS
    /// handshakes (the datapath workers keep the process's): 0..=19.
    pub handshake_nice: i32,
}

impl Default for HboneSettings {
    fn default() -> Self {
        HboneSettings {
            reserved_ports: vec![15000, 15020, 15021],
            max_header_list_size: 16 * 1024,
            max_connecting_streams: 16,
            max_early_resets: 64,
            handshake_timeout: Duration::from_secs(5),
            preface_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
            max_preauth_per_source: 64,
            max_preauth_per_pod: 1024,
            handshake_nice: 10,
        }
    }
}

impl HboneSettings {
    /// Checks the values; the error names the field (under `hbone.`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid =
            |field: &'static str, problem: String| Err(ConfigError::Invalid { field, problem });
        if self.reserved_ports.contains(&0) {
            return invalid("hbone.reservedPorts", "port 0 is no port".into());
        }
        if !(4096..=(1 << 20)).contains(&self.max_header_list_size) {
            return invalid(
                "hbone.maxHeaderListSize",
                format!(
                    "{} is outside 4096..=1048576 bytes",
                    self.max_header_list_size
                ),
            );
        }
        if self.max_connecting_streams == 0 {
            return invalid(
                "hbone.maxConnectingStreams",
                "0 would never connect a stream".into(),
            );
        }
        for (field, n) in [
            ("hbone.maxPreauthPerSource", self.max_preauth_per_source),
            ("hbone.maxPreauthPerPod", self.max_preauth_per_pod),
        ] {
            if n == 0 {
                return invalid(field, "0 would refuse every tunnel connection".into());
            }
        }
        if self.max_preauth_per_source > self.max_preauth_per_pod {
            return invalid(
                "hbone.maxPreauthPerSource",
                format!(
                    "{} is more than maxPreauthPerPod ({})",
                    self.max_preauth_per_source, self.max_preauth_per_pod
                ),
            );
        }
        if !(0..=19).contains(&self.handshake_nice) {
            return invalid(
                "hbone.handshakeNice",
                format!(
                    "{} is outside 0..=19 (below 0 the handshakes would outrank the datapath)",
                    self.handshake_nice
                ),
            );
        }
        for (field, d) in [
            ("hbone.handshakeTimeout", self.handshake_timeout),
            ("hbone.prefaceTimeout", self.preface_timeout),
            ("hbone.idleTimeout", self.idle_timeout),
        ] {
            if d.is_zero() {
                return invalid(field, "0 seconds would close every connection".into());
            }
        }
        Ok(())
    }
}

/// Overrides `proxy.captureMode` (`tproxy` or `redirect`).
pub const ENV_CAPTURE_MODE: &str = "RINGWAY_CAPTURE_MODE";
/// Overrides `proxy.datapath` (`auto`, `uring` or `epoll`).
pub const ENV_DATAPATH: &str = "RINGWAY_DATAPATH";
/// Overrides `proxy.workers` (a whole number; 0 = one per CPU).
pub const ENV_WORKERS: &str = "RINGWAY_WORKERS";
/// Overrides `proxy.pipeSize` (bytes).
pub const ENV_PIPE_SIZE: &str = "RINGWAY_PIPE_SIZE";
/// Overrides `proxy.pipePool` (pipes kept per worker).
pub const ENV_PIPE_POOL: &str = "RINGWAY_PIPE_POOL";
/// Overrides `proxy.backlog`.
pub const ENV_BACKLOG: &str = "RINGWAY_BACKLOG";
/// Overrides `proxy.proxyMark` (decimal or `0x` hexadecimal).
pub const ENV_PROXY_MARK: &str = "RINGWAY_PROXY_MARK";
/// Overrides `proxy.sameNodeFastPath` (`true` or `false`).
pub const ENV_SAME_NODE_FAST_PATH: &str = "RINGWAY_SAME_NODE_FAST_PATH";
/// Overrides `proxy.drainPeriod` (seconds: `30`, `1.5`, `30s` or `500ms`).
pub const ENV_DRAIN_PERIOD: &str = "RINGWAY_DRAIN_PERIOD";
/// Overrides `proxy.connectTimeout` (seconds, as `ENV_DRAIN_PERIOD`; not 0).
pub const ENV_CONNECT_TIMEOUT: &str = "RINGWAY_CONNECT_TIMEOUT";
/// Overrides `proxy.workloadWait` (seconds, as `ENV_DRAIN_PERIOD`).
pub const ENV_WORKLOAD_WAIT: &str = "RINGWAY_WORKLOAD_WAIT";
/// Overrides `proxy.busyPollMicros` (microseconds, 0..=1000).
pub const ENV_BUSY_POLL_MICROS: &str = "RINGWAY_BUSY_POLL_MICROS";

/// The longest `workloadWait`: a connection is held that long at most.
pub const MAX_WORKLOAD_WAIT: Duration = Duration::from_secs(60);

/// The defaults; each field's environment override is the `ENV_*` constant above.
impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            capture_mode: CaptureMode::Tproxy,
            ports: Ports::default(),
            proxy_mark: 0x539,
            workers: 0,
            datapath: Datapath::Auto,
            pipe_size: 1 << 20,
            pipe_pool: 512,
            backlog: 4096,
            same_node_fast_path: true,
            drain_period: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            workload_wait: Duration::from_secs(5),
            hbone: HboneSettings::default(),
            busy_poll_micros: 0,
        }
    }
}

/// Largest `busyPollMicros`: a longer window only burns CPU (a reply that
/// takes a millisecond is not waiting on the proxy's wake-up).
pub const MAX_BUSY_POLL_MICROS: u32 = 1000;

impl ProxySettings {
    /// Checks the values; the error names the field and the problem.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = &self.ports;
        for (field, port) in [
            ("ports.outbound", p.outbound),
            ("ports.inbound", p.inbound),
            ("ports.tunnel", p.tunnel),
        ] {
            if port == 0 {
                return Err(ConfigError::Invalid {
                    field,
                    problem: "port 0 is not a usable listener port".into(),
                });
            }
        }
        if p.outbound == p.inbound || p.outbound == p.tunnel || p.inbound == p.tunnel {
            return Err(ConfigError::Invalid {
                field: "ports",
                problem: format!(
                    "outbound ({}), inbound ({}) and tunnel ({}) must differ",
                    p.outbound, p.inbound, p.tunnel
                ),
            });
        }
        if self.proxy_mark == 0 {
            return Err(ConfigError::Invalid {
                field: "proxyMark",
                problem: "0 is no mark: the proxy's own packets would be captured again".into(),
            });
        }
        if !(4096..=(64 << 20)).contains(&self.pipe_size) {
            return Err(ConfigError::Invalid {
                field: "pipeSize",
                problem: format!("{} is outside 4096..=67108864 bytes", self.pipe_size),
            });
        }
        if self.workers > 1024 {
            return Err(ConfigError::Invalid {
                field: "workers",
                problem: format!("{} workers is more than 1024", self.workers),
            });
        }
        if self.busy_poll_micros > MAX_BUSY_POLL_MICROS {
            return Err(ConfigError::Invalid {
                field: "busyPollMicros",
                problem: format!(
                    "{} µs is outside 0..={MAX_BUSY_POLL_MICROS} µs",
                    self.busy_poll_micros
                ),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                field: "connectTimeout",
                problem: "a connect timeout of 0 s gives up every upstream connect".into(),
            });
        }
        if self.workload_wait > MAX_WORKLOAD_WAIT {
            return Err(ConfigError::Invalid {
                field: "workloadWait",
                problem: format!(
                    "{} s holds a connection longer than {} s; a pod's workload that late is refused",
                    self.workload_wait.as_secs_f64(),
                    MAX_WORKLOAD_WAIT.as_secs()
                ),
            });
        }
        self.hbone.validate()?;
        if self.backlog == 0 {
            return Err(ConfigError::Invalid {
                field: "backlog",
                problem: "a listen backlog of 0 refuses bursts".into(),
            });
        }
        Ok(())
    }

    /// The number of workers to start (resolves 0 to the CPU count).
    pub fn effective_workers(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        }
    }
}

pub(crate) mod duration_secs {
    use serde::{Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    /// The accepted range of a duration in seconds.
    pub const MAX_SECS: f64 = 86_400.0;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        // The range check runs inside the visitor, so the YAML error
        // carries the field's path and position.
        struct Secs;
        impl serde::de::Visitor<'_> for Secs {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of seconds")
            }
            fn visit_f64<E: serde::de::Error>(self, secs: f64) -> Result<Duration, E> {
                if !(0.0..=MAX_SECS).contains(&secs) {
                    return Err(E::custom(format!("{secs} seconds is outside 0..=86400")));
                }
                Ok(Duration::from_secs_f64(secs))
            }
            fn visit_i64<E: serde::de::Error>(self, secs: i64) -> Result<Duration, E> {
                self.visit_f64(secs as f64)
            }
            fn visit_u64<E: serde::de::Error>(self, secs: u64) -> Result<Duration, E> {
                self.visit_f64(secs as f64)
            }
        }
        d.deserialize_f64(Secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        ProxySettings::default().validate().unwrap();
    }

    #[test]
    fn errors_name_the_field() {
        let mut s = ProxySettings::default();
        s.ports.inbound = s.ports.outbound;
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "invalid `ports`: outbound (15001), inbound (15001) and tunnel (15008) must differ"
        );
        let s = ProxySettings {
            pipe_size: 10,
            ..ProxySettings::default()
        };
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "invalid `pipeSize`: 10 is outside 4096..=67108864 bytes"
        );
        let s = ProxySettings {
            proxy_mark: 0,
            ..ProxySettings::default()
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("invalid `proxyMark`"));
        let s = ProxySettings {
            connect_timeout: Duration::ZERO,
            ..ProxySettings::default()
        };
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "invalid `connectTimeout`: a connect timeout of 0 s gives up every upstream connect"
        );
        let s = ProxySettings {
            busy_poll_micros: 1001,
            ..ProxySettings::default()
        };
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "invalid `busyPollMicros`: 1001 µs is outside 0..=1000 µs"
        );
        let s = ProxySettings {
            busy_poll_micros: 1000,
            ..ProxySettings::default()
        };
        s.validate().unwrap();
        assert_eq!(
            "nat".parse::<CaptureMode>().unwrap_err().to_string(),
            "invalid `captureMode`: \"nat\" is not one of \"tproxy\", \"redirect\""
        );
    }

    #[test]
    fn hbone_limits_are_validated_naming_the_field() {
        let bad = |h: HboneSettings| {
            ProxySettings {
                hbone: h,
                ..ProxySettings::default()
            }
            .validate()
            .unwrap_err()
            .to_string()
        };
        let d = HboneSettings::default;
        assert!(bad(HboneSettings {
            max_header_list_size: 100,
            ..d()
        })
        .starts_with("invalid `hbone.maxHeaderListSize`"));
        assert!(bad(HboneSettings {
            max_connecting_streams: 0,
            ..d()
        })
        .starts_with("invalid `hbone.maxConnectingStreams`"));
        assert!(bad(HboneSettings {
            max_preauth_per_source: 2000,
            ..d()
        })
        .starts_with("invalid `hbone.maxPreauthPerSource`"));
        assert!(bad(HboneSettings {
            idle_timeout: Duration::ZERO,
            ..d()
        })
        .starts_with("invalid `hbone.idleTimeout`"));
        assert!(bad(HboneSettings {
            reserved_ports: vec![0],
            ..d()
        })
        .starts_with("invalid `hbone.reservedPorts`"));
        assert!(bad(HboneSettings {
            handshake_nice: -5,
            ..d()
        })
        .starts_with("invalid `hbone.handshakeNice`"));
        let s: ProxySettings =
            serde_norway::from_str("hbone: {handshakeTimeout: 1.5, maxPreauthPerSource: 8}\n")
                .unwrap();
        assert_eq!(s.hbone.handshake_timeout, Duration::from_millis(1500));
        assert_eq!(s.hbone.max_preauth_per_source, 8);
        assert_eq!(s.hbone.max_preauth_per_pod, 1024);
        let err = serde_norway::from_str::<ProxySettings>("hbone: {idle: 1}\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `idle`"), "{err}");
    }

    #[test]
    fn yaml_round_trip_and_unknown_fields() {
        let s: ProxySettings =
            serde_norway::from_str("captureMode: redirect\nworkers: 2\ndrainPeriod: 1.5\n")
                .unwrap();
        assert_eq!(s.capture_mode, CaptureMode::Redirect);
        assert_eq!(s.workers, 2);
        assert_eq!(s.drain_period, Duration::from_millis(1500));
        assert_eq!(s.connect_timeout, Duration::from_secs(10), "the default");
        let s: ProxySettings = serde_norway::from_str("connectTimeout: 2.5\n").unwrap();
        assert_eq!(s.connect_timeout, Duration::from_millis(2500));
        assert_eq!(s.workload_wait, Duration::from_secs(5), "the default");
        let s: ProxySettings = serde_norway::from_str("workloadWait: 0.25\n").unwrap();
        assert_eq!(s.workload_wait, Duration::from_millis(250));
        s.validate().unwrap();
        let s: ProxySettings = serde_norway::from_str("workloadWait: 61\n").unwrap();
        let e = s.validate().unwrap_err().to_string();
        assert!(
            e.contains("invalid `workloadWait`: 61 s holds a connection longer than 60 s"),
            "{e}"
        );
        let err = serde_norway::from_str::<ProxySettings>("wokers: 2\n").unwrap_err();
        assert!(err.to_string().contains("unknown field `wokers`"), "{err}");
    }
}
