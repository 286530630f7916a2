//! The certificate service (`ca.mode: service`): its Deployment, Service, RBAC and
//! secrets, and which pods may hold the root key.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde_json::Value as Json;

use super::invariants::{
    caps, check_args, check_invariants, check_rbac, has_memory_limit, help, mesh_of,
};
use super::objects::{container, pod_spec, pod_specs, typed_objects, Objects};
use super::render::{merged_values, render_chart};
use super::{manifests_path, read, NAMESPACE};

/// Values selecting the certificate service, with a second root (a rotation).
pub(super) const CA_SERVICE_VALUES: &str =
    "ca: {mode: service, service: {extraRootSecrets: [ringway-ca-next]}}\n";

/// Every reference of a pod spec to a Secret, whatever the way: (where, Secret name).
/// A Secret referenced by a pod is readable with its node's kubelet credentials (the node
/// authorizer grants a node the Secrets of its pods), so a reference is as good as a
/// mount, even of one key only.
pub(super) fn secret_refs(spec: &PodSpec) -> Vec<(String, String)> {
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
pub(super) fn volume_of<'a>(
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
pub(super) fn check_ca_service(o: &Objects) {
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
    assert!(has_memory_limit(ca), "ca: memory limit");

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
