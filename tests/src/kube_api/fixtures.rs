//! Kubernetes objects as JSON, for [`FakeApiServer`](super::FakeApiServer)
//! and for the mapping's tests (which deserialize them into the
//! `k8s-openapi` types).
//!
//! Each builder makes the smallest object its readers need; tests edit the
//! JSON for their special cases.

use serde_json::{json, Value};

/// The pod and namespace label of ringway's enrollment rule
/// (`ringway_config::enrollment::DATAPLANE_MODE_LABEL`).
pub const DATAPLANE_MODE_LABEL: &str = "ringway.io/dataplane-mode";
/// The Istio ambient mesh's enrollment label
/// (`ringway_config::enrollment::ISTIO_DATAPLANE_MODE_LABEL`).
pub const ISTIO_DATAPLANE_MODE_LABEL: &str = "istio.io/dataplane-mode";
/// The EndpointSlice label naming its service
/// (`ringway_config::kube::SERVICE_NAME_LABEL`).
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The node of [`pod`]'s pods.
pub const NODE: &str = "node-a";

/// The uid [`pod`] gives pod `ns/name`.
pub fn uid(ns: &str, name: &str) -> String {
    format!("uid-{ns}-{name}")
}

/// A pod object: `Pending` without an IP until [`FakePod::running`].
#[derive(Debug, Clone)]
pub struct FakePod(Value);

impl FakePod {
    /// Pod `namespace/name` with `uid`, bound to `node`, labelled
    /// `app=<name>`, one container `app`, no service account.
    pub fn new(uid: &str, namespace: &str, name: &str, node: &str) -> FakePod {
        FakePod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
            "status": {"phase": "Pending"}
        }))
    }

    /// `ringway.io/dataplane-mode=<mode>` on the pod.
    pub fn mode(self, mode: &str) -> FakePod {
        self.label(DATAPLANE_MODE_LABEL, mode)
    }

    /// `istio.io/dataplane-mode=<mode>` on the pod (the Istio ambient mesh's label).
    pub fn istio_mode(self, mode: &str) -> FakePod {
        self.label(ISTIO_DATAPLANE_MODE_LABEL, mode)
    }

    /// No `istio.io/dataplane-mode` label on the pod.
    pub fn without_istio_mode(mut self) -> FakePod {
        if let Some(labels) = self.0["metadata"]["labels"].as_object_mut() {
            labels.remove(ISTIO_DATAPLANE_MODE_LABEL);
        }
        self
    }

    /// No `ringway.io/dataplane-mode` label on the pod.
    pub fn without_mode(mut self) -> FakePod {
        if let Some(labels) = self.0["metadata"]["labels"].as_object_mut() {
            labels.remove(DATAPLANE_MODE_LABEL);
        }
        self
    }

    /// Label `key=value`.
    pub fn label(mut self, key: &str, value: &str) -> FakePod {
        self.0["metadata"]["labels"][key] = json!(value);
        self
    }

    /// Annotation `key=value`.
    pub fn annotate(mut self, key: &str, value: &str) -> FakePod {
        self.0["metadata"]["annotations"][key] = json!(value);
        self
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(mut self, rv: &str) -> FakePod {
        self.0["metadata"]["resourceVersion"] = json!(rv);
        self
    }

    /// `metadata.creationTimestamp`.
    pub fn created(mut self, timestamp: &str) -> FakePod {
        self.0["metadata"]["creationTimestamp"] = json!(timestamp);
        self
    }

    /// Being deleted (`metadata.deletionTimestamp`).
    pub fn terminating(mut self) -> FakePod {
        self.0["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        self
    }

    /// `spec.serviceAccountName`.
    pub fn service_account(mut self, sa: &str) -> FakePod {
        self.0["spec"]["serviceAccountName"] = json!(sa);
        self
    }

    /// `spec.hostNetwork: true`.
    pub fn host_network(mut self) -> FakePod {
        self.0["spec"]["hostNetwork"] = json!(true);
        self
    }

    /// The container's `ports`.
    pub fn container_ports(mut self, ports: Value) -> FakePod {
        self.0["spec"]["containers"][0]["ports"] = ports;
        self
    }

    /// Phase `Running` with these IPs (primary first; none: no IP yet).
    pub fn running(mut self, ips: &[&str]) -> FakePod {
        let list: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
        self.0["status"] = json!({"phase": "Running", "podIP": ips.first(), "podIPs": list});
        self
    }

    /// Phase `Pending`, no IP.
    pub fn pending(mut self) -> FakePod {
        self.0["status"] = json!({"phase": "Pending"});
        self
    }

    /// `status.phase`, the rest of the status kept.
    pub fn phase(mut self, phase: &str) -> FakePod {
        self.0["status"]["phase"] = json!(phase);
        self
    }

    /// The object.
    pub fn json(&self) -> Value {
        self.0.clone()
    }
}

/// Pod `ns/name` (uid [`uid`]`(ns, name)`) on [`NODE`], created
/// 2026-01-01, service account `sa-x`, container ports `http` 8080 and
/// `dns` 5353/UDP, running with `ips` (none: no IP yet).
pub fn pod(ns: &str, name: &str, ips: &[&str]) -> FakePod {
    FakePod::new(&uid(ns, name), ns, name, NODE)
        .created("2026-01-01T00:00:00Z")
        .service_account("sa-x")
        .container_ports(json!([
            {"name": "http", "containerPort": 8080},
            {"name": "dns", "containerPort": 5353, "protocol": "UDP"}
        ]))
        .running(ips)
}

/// A TokenReview's `status.user` for service account `namespace/sa`; with
/// `pod` = (name, uid, node), a token bound to that pod (the `extra` keys
/// of a projected service-account token).
pub fn service_account_user(ns: &str, sa: &str, pod: Option<(&str, &str, &str)>) -> Value {
    let mut user = json!({
        "username": format!("system:serviceaccount:{ns}:{sa}"),
        "uid": format!("sa-uid-{ns}-{sa}"),
        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
    });
    if let Some((name, uid, node)) = pod {
        user["extra"] = json!({
            "authentication.kubernetes.io/pod-name": [name],
            "authentication.kubernetes.io/pod-uid": [uid],
            "authentication.kubernetes.io/node-name": [node],
        });
    }
    user
}

/// Namespace `name` (uid `ns-<name>`), with `ringway.io/dataplane-mode=<mode>`
/// when `mode` is given.
pub fn namespace(name: &str, mode: Option<&str>) -> Value {
    match mode {
        Some(m) => namespace_with_labels(name, &[(DATAPLANE_MODE_LABEL, m)]),
        None => namespace_with_labels(name, &[]),
    }
}

/// Namespace `name` (uid `ns-<name>`) with these labels besides
/// `kubernetes.io/metadata.name` (such as `istio.io/dataplane-mode=ambient`).
pub fn namespace_with_labels(name: &str, labels: &[(&str, &str)]) -> Value {
    let mut all = json!({ "kubernetes.io/metadata.name": name });
    for (k, v) in labels {
        all[*k] = json!(v);
    }
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": format!("ns-{name}"), "labels": all}
    })
}

/// Service `ns/name` with these cluster IPs (`["None"]`: headless) and
/// `ports`, selecting the pods labelled `app=<name>`.
pub fn service(ns: &str, name: &str, cluster_ips: &[&str], ports: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": cluster_ips.first(), "clusterIPs": cluster_ips, "ports": ports,
            "selector": {"app": name}}
    })
}

/// An `ExternalName` service `ns/name` for `host`.
pub fn external_service(ns: &str, name: &str, host: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"type": "ExternalName", "externalName": host}
    })
}

/// An EndpointSlice endpoint: pod `ns/pod` (uid [`uid`]) at `address`, with
/// `conditions.ready` when `ready` is given.
pub fn endpoint(ns: &str, pod: &str, address: &str, ready: Option<bool>) -> Value {
    let mut e = json!({"addresses": [address],
        "targetRef": {"kind": "Pod", "namespace": ns, "name": pod, "uid": uid(ns, pod)}});
    if let Some(r) = ready {
        e["conditions"] = json!({ "ready": r });
    }
    e
}

/// EndpointSlice `ns/name` of service `svc`, address type `family`.
pub fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    family: &str,
    endpoints: Value,
    ports: Value,
) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "labels": {SERVICE_NAME_LABEL: svc}},
        "addressType": family, "endpoints": endpoints, "ports": ports
    })
}
