//! The chart follows its values: optional objects, seccomp and CA choices, metrics
//! annotations, the state directory, the file mesh source, and the settings it
//! refuses.

use super::invariants::{check_args, check_invariants, check_rbac, help, mesh_of};
use super::objects::{container, pod_annotations, pod_spec, typed_objects};
use super::render::{merged_values, render_chart};
use super::NAMESPACE;

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
    let annotations = pod_annotations(&o, "ringway-proxy");
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
