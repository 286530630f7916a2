//! Strict typed parsing: every rendered document as its k8s-openapi object,
//! serialized back and compared, so an unknown field is a difference.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PodSpec, PodTemplateSpec, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value as Json;

use super::render::split_manifests;
use super::yaml_to_json;

/// The documents of a manifest stream, as JSON, with their `# Source:`.
pub(super) fn documents(text: &str) -> Vec<(String, Json)> {
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
pub(super) fn strict<
    T: k8s_openapi::serde::de::DeserializeOwned + k8s_openapi::serde::Serialize,
>(
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
pub(super) struct Objects {
    pub(super) daemonsets: BTreeMap<String, DaemonSet>,
    pub(super) deployments: BTreeMap<String, Deployment>,
    pub(super) pod_disruption_budgets: BTreeMap<String, PodDisruptionBudget>,
    pub(super) service_accounts: BTreeMap<String, ServiceAccount>,
    pub(super) cluster_roles: BTreeMap<String, ClusterRole>,
    pub(super) cluster_role_bindings: BTreeMap<String, ClusterRoleBinding>,
    pub(super) config_maps: BTreeMap<String, ConfigMap>,
    pub(super) priority_classes: BTreeMap<String, PriorityClass>,
    pub(super) services: BTreeMap<String, Service>,
    pub(super) custom_resource_definitions: BTreeMap<String, CustomResourceDefinition>,
    /// Kinds without a k8s-openapi type (ServiceMonitor), untyped.
    pub(super) others: Vec<Json>,
}

pub(super) fn typed_objects(text: &str) -> Objects {
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

/// DaemonSet `ds`'s pod template.
fn pod_template<'a>(o: &'a Objects, ds: &str) -> &'a PodTemplateSpec {
    &o.daemonsets
        .get(ds)
        .unwrap_or_else(|| panic!("no DaemonSet {ds}"))
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("{ds}: no spec"))
        .template
}

/// The annotations of DaemonSet `ds`'s pod template (empty when none).
pub(super) fn pod_annotations(o: &Objects, ds: &str) -> std::collections::BTreeMap<String, String> {
    pod_template(o, ds)
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default()
}

pub(super) fn pod_spec<'a>(o: &'a Objects, ds: &str) -> &'a PodSpec {
    pod_template(o, ds)
        .spec
        .as_ref()
        .unwrap_or_else(|| panic!("{ds}: no pod spec"))
}

pub(super) fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// Every pod template of the manifests: (kind/name, pod spec).
pub(super) fn pod_specs(o: &Objects) -> Vec<(String, &PodSpec)> {
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
