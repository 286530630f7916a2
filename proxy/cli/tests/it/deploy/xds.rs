//! The mesh's control plane as the source (`proxy.meshSource: xds`): the proxy's
//! environment, no Kubernetes watch, and the combinations the chart refuses.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value as Json;

use super::ca_service::volume_of;
use super::invariants::{check_args, check_invariants, check_rbac, help, mesh_of};
use super::objects::{container, pod_spec, typed_objects, Objects};
use super::render::{merged_values, render_chart};
use super::{NAMESPACE, XDS_VALUES};

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
pub(super) fn check_xds(o: &Objects, v: &Json) {
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
