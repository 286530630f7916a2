//! What every rendering must hold: capabilities, RBAC verbs, probes, flags (against
//! the built `ringway` binary's help), drain versus grace period, the configuration,
//! mounts, trust boundaries, update strategies.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde_json::Value as Json;

use super::ca_service::{check_ca_service, secret_refs, volume_of};
use super::objects::{container, pod_annotations, pod_spec, pod_specs, typed_objects, Objects};
use super::render::merged_values;
use super::xds::check_xds;
use super::{
    chart_dir, deploy, manifests_path, read, values, xds_manifests_path, yaml_to_json,
    BINARY_IN_IMAGE, NAMESPACE, XDS_VALUES,
};

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

/// The `ringway` binary of this package, built by cargo for this test.
fn ringway_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ringway"))
}

/// What `ringway [SUBCOMMAND] --help` says.
#[derive(Debug, Default)]
pub(super) struct Help {
    /// The full text.
    pub(super) text: String,
    /// `--flag` -> whether it takes a value.
    pub(super) flags: BTreeMap<String, bool>,
    /// `[env: NAME=]` entries.
    pub(super) env: BTreeSet<String>,
    /// Subcommands (top level only).
    pub(super) commands: BTreeSet<String>,
}

pub(super) fn help(sub: Option<&str>) -> Help {
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
pub(super) fn check_args(container: &Container, top: &Help) -> (String, BTreeMap<String, String>) {
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

/// Whether `c` sets a memory limit.
pub(super) fn has_memory_limit(c: &Container) -> bool {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| l.contains_key("memory"))
}

pub(super) fn caps(c: &Container) -> (Vec<String>, Vec<String>) {
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
    assert!(has_memory_limit(c), "{name}: memory limit");
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

pub(super) fn mesh_of(o: &Objects) -> ringway_config::Mesh {
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
pub(super) fn check_invariants(o: &Objects, text: &str, v: &Json) {
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
    let annotations = pod_annotations(o, "ringway-proxy");
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
pub(super) fn check_rbac(o: &Objects, proxy_role: bool) {
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
