//! The mapping, object by object and merged with a file.

use std::net::IpAddr;

use serde_json::{json, Value};

use super::*;
use crate::enrollment::{DATAPLANE_MODE_LABEL, ISTIO_DATAPLANE_MODE_LABEL};
use crate::Action;
use ringway_testbed::kube_api::fixtures::{
    self, endpoint, external_service, namespace, service, slice, uid,
};

const FILE: &str = r#"
trustDomain: example.org
ca: {certFile: /s/ca.crt, keyFile: /s/ca.key}
workloads:
  - {uid: file-vm, name: vm-0, namespace: legacy, ips: [10.9.0.1], node: vm-host}
services:
  - hostname: legacy.example.org
    namespace: legacy
    vips: [10.96.9.9]
    ports: {80: 8080}
    endpoints: [file-vm]
policies:
  - name: require-mtls
    action: DENY
    rules: [{from: [{notPrincipals: ["*"]}]}]
"#;

fn file() -> Mesh {
    MeshConfig::load_str(FILE, "config.yaml", &[("RINGWAY_WORKERS", "2")]).unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ------------------------------------------------------------------ objects

fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Arc<T> {
    Arc::new(serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}")))
}

/// [`fixtures::pod`] as JSON.
fn pod(ns: &str, name: &str, ips: &[&str]) -> Value {
    fixtures::pod(ns, name, ips).json()
}

#[derive(Default)]
struct Objects {
    pods: Vec<Value>,
    namespaces: Vec<Value>,
    services: Vec<Value>,
    slices: Vec<Value>,
    nodes: Vec<Value>,
}

impl Objects {
    fn cluster(&self) -> Cluster {
        Cluster {
            pods: self.pods.iter().cloned().map(typed).collect(),
            namespaces: self.namespaces.iter().cloned().map(typed).collect(),
            services: self.services.iter().cloned().map(typed).collect(),
            endpoint_slices: self.slices.iter().cloned().map(typed).collect(),
            nodes: self.nodes.iter().cloned().map(typed).collect(),
            ..Cluster::default()
        }
    }

    fn build(&self) -> KubeMesh {
        build_mesh(&file(), &self.cluster(), &KubeOptions::default())
    }
}

fn skipped_of(k: &KubeMesh) -> Vec<String> {
    k.skipped.iter().map(ToString::to_string).collect()
}

// ------------------------------------------------------------------ pods

fn workload_of(pod: Value, enabled: &[&str]) -> Result<WorkloadConfig, NotAWorkload> {
    let pod: Pod = serde_json::from_value(pod).unwrap();
    let enabled: HashSet<&str> = enabled.iter().copied().collect();
    workload(&pod, &enabled, &KubeOptions::default())
}

#[test]
fn a_running_pod_is_a_workload() {
    let mut p = pod("shop", "web-0", &["10.1.0.5", "fd00::5"]);
    p["metadata"]["labels"] = serde_json::json!({"app": "web", "version": "v2"});
    let w = workload_of(p, &["shop"]).unwrap();
    assert_eq!(
        w,
        WorkloadConfig {
            uid: uid("shop", "web-0"),
            name: "web-0".into(),
            namespace: "shop".into(),
            service_account: "sa-x".into(),
            ips: vec!["10.1.0.5".into(), "fd00::5".into()],
            node: "node-a".into(),
            tunnel: true,
            healthy: true,
            labels: [("app", "web"), ("version", "v2")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            locality: Default::default(),
            workload_name: Some("web-0".into()),
        }
    );

    // podIP alone (no podIPs); no service account at all (the admission
    // controller gives every pod one; a static pod's mirror has none): no
    // identity, so no HBONE, never `default`.
    let mut p = pod("shop", "web-1", &[]);
    p["status"] = json!({"phase": "Running", "podIP": "10.1.0.6"});
    p["spec"]
        .as_object_mut()
        .unwrap()
        .remove("serviceAccountName");
    let w = workload_of(p, &[]).unwrap();
    assert_eq!(w.ips, ["10.1.0.6"]);
    assert_eq!(w.service_account, "");
    assert!(!w.tunnel, "no identity: no HBONE");
    // The deprecated spec.serviceAccount still names it.
    let mut p = pod("shop", "web-2", &["10.1.0.7"]);
    p["spec"]
        .as_object_mut()
        .unwrap()
        .remove("serviceAccountName");
    p["spec"]["serviceAccount"] = json!("old-sa");
    assert_eq!(workload_of(p, &[]).unwrap().service_account, "old-sa");

    // Terminating pods still serve their connections: they stay.
    let mut p = pod("shop", "web-3", &["10.1.0.8"]);
    p["metadata"]["deletionTimestamp"] = json!("2026-01-02T00:00:00Z");
    assert!(workload_of(p, &[]).is_ok());
}

/// A pod's locality is its Node's topology labels (other labels of the
/// node are not read); a pod on a node not listed has none.
#[test]
fn a_pods_locality_is_its_nodes_topology() {
    let mut o = Objects::default();
    o.pods.push(pod("shop", "web-0", &["10.1.0.5"]));
    let mut other = pod("shop", "web-1", &["10.1.0.6"]);
    other["spec"]["nodeName"] = json!("node-b");
    o.pods.push(other);
    o.nodes.push(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {
            "topology.kubernetes.io/region": "eu-west1",
            "topology.kubernetes.io/zone": "eu-west1-b",
            "kubernetes.io/hostname": "node-a"
        }}
    }));
    let k = o.build();
    let w = |name: &str| {
        k.mesh
            .workloads()
            .find(|w| w.name == name)
            .unwrap()
            .locality
            .clone()
    };
    assert_eq!(w("web-0").region, "eu-west1");
    assert_eq!(w("web-0").zone, "eu-west1-b");
    assert_eq!(w("web-1"), crate::Locality::default());
}

#[test]
fn pods_that_are_not_workloads() {
    let base = pod("shop", "p", &["10.1.0.9"]);
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: [(&str, Edit, NotAWorkload); 8] = [
        (
            "pending, no IP yet",
            Box::new(|p| p["status"] = json!({"phase": "Pending"})),
            NotAWorkload::NoIp,
        ),
        (
            "succeeded",
            Box::new(|p| p["status"]["phase"] = json!("Succeeded")),
            NotAWorkload::Finished,
        ),
        (
            "failed",
            Box::new(|p| p["status"]["phase"] = json!("Failed")),
            NotAWorkload::Finished,
        ),
        (
            "no status",
            Box::new(|p| {
                p.as_object_mut().unwrap().remove("status");
            }),
            NotAWorkload::NoIp,
        ),
        (
            "running, no IP yet",
            Box::new(|p| p["status"] = json!({"phase": "Running"})),
            NotAWorkload::NoIp,
        ),
        (
            "running, empty podIPs and podIP",
            Box::new(|p| p["status"] = json!({"phase": "Running", "podIP": "", "podIPs": []})),
            NotAWorkload::NoIp,
        ),
        (
            "host network",
            Box::new(|p| p["spec"]["hostNetwork"] = json!(true)),
            NotAWorkload::HostNetwork,
        ),
        (
            "no uid",
            Box::new(|p| {
                p["metadata"].as_object_mut().unwrap().remove("uid");
            }),
            NotAWorkload::NoUid,
        ),
    ];
    for (what, edit, want) in cases {
        let mut p = base.clone();
        edit(&mut p);
        assert_eq!(workload_of(p, &["shop"]), Err(want), "{what}");
    }
}

/// `tunnel` is the node agent's enrollment rule, with either mesh's labels.
#[test]
fn tunnel_follows_the_enrollment_labels() {
    let with_labels = |ns: &str, ringway: Option<&str>, istio: Option<&str>| {
        let mut p = pod(ns, "p", &["10.1.0.9"]);
        if let Some(m) = ringway {
            p["metadata"]["labels"][DATAPLANE_MODE_LABEL] = json!(m);
        }
        if let Some(m) = istio {
            p["metadata"]["labels"][ISTIO_DATAPLANE_MODE_LABEL] = json!(m);
        }
        p
    };
    let cases = [
        // (namespace, pod's ringway label, pod's istio label, namespace enabled, tunnel)
        ("shop", None, None, true, true),
        ("shop", None, None, false, false),
        ("shop", Some("enabled"), None, false, true),
        ("shop", Some("disabled"), None, true, false),
        ("shop", Some("ambient"), None, false, false),
        ("shop", Some("ambient"), None, true, true),
        ("shop", None, Some("ambient"), false, true),
        ("shop", None, Some("none"), true, false),
        ("shop", None, Some("enabled"), false, false),
        // The labels disagree: the opt-out wins.
        ("shop", Some("enabled"), Some("none"), true, false),
        ("shop", Some("disabled"), Some("ambient"), true, false),
        // ringway's own namespace is never captured, whatever its labels say.
        ("ringway-system", Some("enabled"), None, true, false),
        ("ringway-system", None, Some("ambient"), true, false),
    ];
    for (ns, ringway, istio, ns_enabled, tunnel) in cases {
        let enabled: &[&str] = if ns_enabled { &[ns] } else { &[] };
        let w = workload_of(with_labels(ns, ringway, istio), enabled).unwrap();
        assert_eq!(
            w.tunnel, tunnel,
            "{ns} pod=({ringway:?}, {istio:?}) ns_enabled={ns_enabled}"
        );
    }
    // Through build_mesh: the namespaces' labels are read from the objects,
    // either mesh's label enrolling.
    let objects = Objects {
        pods: vec![
            pod("shop", "in", &["10.1.0.1"]),
            pod("plain", "out", &["10.1.0.2"]),
            pod("ambient", "in", &["10.1.0.3"]),
            pod("none", "out", &["10.1.0.4"]),
        ],
        namespaces: vec![
            namespace("shop", Some("enabled")),
            namespace("plain", Some("disabled")),
            fixtures::namespace_with_labels("ambient", &[(ISTIO_DATAPLANE_MODE_LABEL, "ambient")]),
            fixtures::namespace_with_labels("none", &[(ISTIO_DATAPLANE_MODE_LABEL, "none")]),
        ],
        ..Objects::default()
    };
    let mesh = objects.build().mesh;
    assert!(mesh.workload_by_ip(ip("10.1.0.1")).unwrap().tunnel);
    assert!(!mesh.workload_by_ip(ip("10.1.0.2")).unwrap().tunnel);
    assert!(mesh.workload_by_ip(ip("10.1.0.3")).unwrap().tunnel);
    assert!(!mesh.workload_by_ip(ip("10.1.0.4")).unwrap().tunnel);
}

// ------------------------------------------------------------------ services

/// The objects of a namespace `shop` with a dual-stack service `web` over
/// two pods (one not ready), and a few services around it.
fn shop() -> Objects {
    Objects {
        pods: vec![
            pod("shop", "web-0", &["10.1.0.10", "fd00::10"]),
            pod("shop", "web-1", &["10.1.0.11", "fd00::11"]),
            pod("shop", "db-0", &["10.1.0.20"]),
        ],
        namespaces: vec![namespace("shop", Some("enabled"))],
        services: vec![
            service(
                "shop",
                "web",
                &["10.96.0.10", "fd00:96::10"],
                json!([
                    {"name": "http", "port": 80, "targetPort": 8080},
                    {"name": "https", "port": 443, "targetPort": "https"},
                    {"name": "plain", "port": 9090},
                    {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"}
                ]),
            ),
            // Headless: no VIP, endpoints still.
            service("shop", "db", &["None"], json!([{"port": 5432}])),
            // Its EndpointSlices are not there yet: the named port is
            // resolved on the pods its selector matches.
            {
                let mut s = service(
                    "shop",
                    "web-admin",
                    &["10.96.0.11"],
                    json!([{"name": "admin", "port": 8000, "targetPort": "http"}]),
                );
                s["spec"]["selector"] = json!({"app": "web-0"});
                s
            },
            // No pod has a port of that name.
            service(
                "shop",
                "broken",
                &["10.96.0.12"],
                json!([
                    {"name": "a", "port": 1, "targetPort": "nope"},
                    {"name": "b", "port": 2, "targetPort": 2000}
                ]),
            ),
            external_service("shop", "ext", "db.example.com"),
        ],
        slices: vec![
            slice(
                "shop",
                "web-v4",
                "web",
                "IPv4",
                json!([
                    endpoint("shop", "web-0", "10.1.0.10", Some(true)),
                    endpoint("shop", "web-1", "10.1.0.11", Some(false))
                ]),
                json!([{"name": "http", "port": 8080, "protocol": "TCP"},
                    {"name": "https", "port": 8443, "protocol": "TCP"},
                    {"name": "plain", "port": 9090, "protocol": "TCP"}]),
            ),
            // The same pods in the IPv6 slice: listed once.
            slice(
                "shop",
                "web-v6",
                "web",
                "IPv6",
                json!([
                    endpoint("shop", "web-0", "fd00::10", None),
                    endpoint("shop", "web-1", "fd00::11", Some(false))
                ]),
                json!([{"name": "https", "port": 8443}]),
            ),
            slice(
                "shop",
                "db-1",
                "db",
                "IPv4",
                json!([
                    endpoint("shop", "db-0", "10.1.0.20", Some(true)),
                    // A pod the mesh has no workload for (pending, gone).
                    endpoint("shop", "db-9", "10.1.0.29", Some(true)),
                    // An address without a pod.
                    {"addresses": ["192.0.2.1"]}
                ]),
                json!([{"port": 5432}]),
            ),
            slice(
                "shop",
                "db-fqdn",
                "db",
                "FQDN",
                json!([{"addresses": ["db.example.com"]}]),
                json!([]),
            ),
            // Same service name, other namespace.
            slice(
                "other",
                "web-x",
                "web",
                "IPv4",
                json!([endpoint("other", "web-9", "10.1.0.99", Some(true))]),
                json!([{"name": "https", "port": 1}]),
            ),
        ],
        nodes: Vec::new(),
    }
}

#[test]
fn services_from_services_and_endpoint_slices() {
    let built = shop().build();
    let mesh = &built.mesh;
    let by_host = |h: &str| {
        mesh.services()
            .find(|s| s.hostname == h)
            .unwrap_or_else(|| panic!("no service {h}: {:?}", mesh.services().collect::<Vec<_>>()))
    };

    let web = by_host("web.shop.svc.cluster.local");
    assert_eq!(web.namespace, "shop");
    assert_eq!(web.vips, [ip("10.96.0.10"), ip("fd00:96::10")]);
    // 80 -> number, 443 -> named (from the slices), 9090 -> no targetPort, 53/UDP left out.
    assert_eq!(
        web.ports.iter().map(|(p, t)| (*p, *t)).collect::<Vec<_>>(),
        [(80, 8080), (443, 8443), (9090, 9090)]
    );
    assert_eq!(
        mesh.endpoint_uids(web),
        [uid("shop", "web-0"), uid("shop", "web-1")]
    );
    // The VIP lookup the proxy does, both families.
    for vip in ["10.96.0.10", "fd00:96::10", "::ffff:10.96.0.10"] {
        assert_eq!(
            mesh.service_by_vip(ip(vip)).map(|s| &s.hostname),
            Some(&web.hostname),
            "{vip}"
        );
    }
    // Readiness: web-1 is not ready in its slices, web-0 is (ready, or unset).
    let healthy: Vec<_> = mesh
        .healthy_endpoints(web, 80, false)
        .map(|(w, a)| (w.name.clone(), a.ip()))
        .collect();
    assert_eq!(healthy, [("web-0".to_owned(), ip("10.1.0.10"))]);
    assert!(!mesh.workload_by_uid(&uid("shop", "web-1")).unwrap().healthy);
    assert!(mesh.workload_by_uid(&uid("shop", "db-0")).unwrap().healthy);

    let db = by_host("db.shop.svc.cluster.local");
    assert!(db.vips.is_empty(), "headless");
    assert_eq!(db.target_port(5432), Some(5432));
    assert_eq!(
        mesh.endpoint_uids(db),
        [uid("shop", "db-0")],
        "pods only, workloads only"
    );

    let admin = by_host("web-admin.shop.svc.cluster.local");
    assert_eq!(
        admin.target_port(8000),
        Some(8080),
        "named port from the pod"
    );

    let broken = by_host("broken.shop.svc.cluster.local");
    assert_eq!(broken.target_port(1), None);
    assert_eq!(broken.target_port(2), Some(2000));

    assert!(
        mesh.services().all(|s| !s.hostname.starts_with("ext.")),
        "ExternalName is not a service of the mesh"
    );
    assert_eq!(
        skipped_of(&built),
        [
            "Service shop/broken: port 1 left out: targetPort \"nope\" is not a TCP container \
             port of its pods"
        ]
    );
}

#[test]
fn cluster_domain_is_configurable() {
    let options = KubeOptions {
        cluster_domain: "corp.example".into(),
        ..KubeOptions::default()
    };
    let mesh = build_mesh(&file(), &shop().cluster(), &options).mesh;
    assert!(mesh
        .services()
        .any(|s| s.hostname == "web.shop.svc.corp.example"));
    assert!(KubeOptions {
        cluster_domain: "Corp_Example".into(),
        ..KubeOptions::default()
    }
    .validate()
    .is_err());
    KubeOptions::default().validate().unwrap();
}

/// A named targetPort resolves per pod; the model holds one number.
#[test]
fn named_port_resolving_differently_on_pods() {
    let mut o = shop();
    o.slices.push(slice(
        "shop",
        "web-v4-b",
        "web",
        "IPv4",
        json!([endpoint("shop", "db-0", "10.1.0.20", Some(true))]),
        json!([{"name": "https", "port": 9443}]),
    ));
    let built = o.build();
    let web = built.mesh.service_by_vip(ip("10.96.0.10")).unwrap().clone();
    assert_eq!(
        web.target_port(443),
        Some(8443),
        "the first slice's, by name"
    );
    assert!(
        skipped_of(&built).contains(
            &"Service shop/web: port 443: targetPort \"https\" is 8443 on some pods and [9443] \
              on others; the mesh holds one target port per service port, 8443 is used"
                .to_owned()
        ),
        "{:?}",
        built.skipped
    );
}

/// Resolution on pods: the endpoint pods first, sidecar init containers
/// count, UDP ports and ordinary init containers do not.
#[test]
fn container_port_is_kubernetes_find_port() {
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "app", "ports": [
                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                {"name": "http", "containerPort": 8080}]}],
            "initContainers": [
                {"name": "init", "ports": [{"name": "setup", "containerPort": 1}]},
                {"name": "proxy", "restartPolicy": "Always",
                    "ports": [{"name": "metrics", "containerPort": 15090}]}]
        }
    }))
    .unwrap();
    assert_eq!(container_port(&p, "http"), Some(8080));
    assert_eq!(container_port(&p, "metrics"), Some(15090));
    assert_eq!(container_port(&p, "dns"), None, "UDP");
    assert_eq!(container_port(&p, "setup"), None, "not a sidecar");
    assert_eq!(container_port(&p, "nope"), None);
}

// ------------------------------------------------------------------ merging

#[test]
fn the_file_keeps_its_policies_settings_and_entries() {
    let base = file();
    let built = shop().build();
    let mesh = &built.mesh;
    assert_eq!(mesh.trust_domain(), "example.org");
    assert_eq!(mesh.proxy().workers, 2, "env overrides applied");
    assert_eq!(mesh.env_overrides(), base.env_overrides());
    assert_eq!(mesh.ca(), base.ca());
    assert!(mesh.policies().eq(base.policies()));
    assert_eq!(mesh.policies().next().unwrap().action, Action::Deny);
    assert_eq!(mesh.origin(), "config.yaml + kubernetes");
    assert_eq!(mesh.revision(), base.revision());
    // The file's entries first, then the cluster's.
    assert_eq!(
        mesh.workloads().next().unwrap(),
        base.workloads().next().unwrap()
    );
    assert_eq!(
        mesh.services().next().unwrap(),
        base.services().next().unwrap()
    );
    assert_eq!(mesh.workload_count(), 1 + 3);
    assert_eq!(mesh.service_count(), 1 + 4);
    // Authorization sees the cluster's workloads.
    let web = mesh.workload_by_ip(ip("10.1.0.10")).unwrap();
    assert_eq!(mesh.policies_for(web).count(), 1);
    // And the merged snapshot can be merged again (it keeps the file's part).
    let again = build_mesh(mesh, &Objects::default().cluster(), &KubeOptions::default()).mesh;
    assert!(again.workloads().eq(base.workloads()));
    assert!(again.services().eq(base.services()));
}

#[test]
fn an_empty_cluster_is_the_file() {
    let base = file();
    let built = build_mesh(&base, &Cluster::default(), &KubeOptions::default());
    assert!(built.skipped.is_empty());
    assert!(built.mesh.workloads().eq(base.workloads()));
    assert!(built.mesh.services().eq(base.services()));
}

/// IP reuse: the newest running pod keeps the address; the other one is
/// left out, named, and removed from its service's endpoints.
#[test]
fn a_reused_ip_goes_to_the_newest_running_pod() {
    let mut o = shop();
    let mut old = pod("shop", "old-0", &["10.1.0.10"]);
    old["metadata"]["creationTimestamp"] = json!("2025-12-01T00:00:00Z");
    o.pods.push(old);
    o.slices.push(slice(
        "shop",
        "old-1",
        "db",
        "IPv4",
        json!([endpoint("shop", "old-0", "10.1.0.10", Some(true))]),
        json!([{"port": 5432}]),
    ));
    let built = o.build();
    let mesh = &built.mesh;
    assert_eq!(mesh.workload_by_ip(ip("10.1.0.10")).unwrap().name, "web-0");
    assert!(mesh.workload_by_uid(&uid("shop", "old-0")).is_none());
    let db = mesh
        .services()
        .find(|s| s.hostname.starts_with("db."))
        .unwrap();
    assert_eq!(mesh.endpoint_uids(db), [uid("shop", "db-0")]);
    let skipped = skipped_of(&built);
    assert!(
        skipped.iter().any(|s| s.starts_with(
            "Pod shop/old-0: ips[0]: \"10.1.0.10\" is already an address of workloads["
        ) && s.ends_with("(shop/web-0)")),
        "{skipped:?}"
    );

    // A terminating pod loses even when it is the newer one.
    let mut o = shop();
    let mut dying = pod("shop", "dying", &["10.1.0.11"]);
    dying["metadata"]["creationTimestamp"] = json!("2026-06-01T00:00:00Z");
    dying["metadata"]["deletionTimestamp"] = json!("2026-06-02T00:00:00Z");
    o.pods.push(dying);
    let mesh = o.build().mesh;
    assert_eq!(mesh.workload_by_ip(ip("10.1.0.11")).unwrap().name, "web-1");
}

/// Objects that fail validation are left out one by one, the rest kept.
#[test]
fn bad_objects_are_left_out_and_the_rest_kept() {
    let mut o = shop();
    // Not an address.
    o.pods.push(pod("shop", "bad-ip", &["10.1.0.300"]));
    // The uid of a workload of the file.
    let mut twin = pod("legacy", "twin", &["10.1.0.40"]);
    twin["metadata"]["uid"] = json!("file-vm");
    o.pods.push(twin);
    // The address of a VIP of the file.
    o.pods.push(pod("shop", "on-vip", &["10.96.9.9"]));
    // A VIP that is a pod's address.
    o.services.push(service(
        "shop",
        "vip-is-pod",
        &["10.1.0.20"],
        json!([{"port": 1}]),
    ));
    // A VIP that is the file's workload's address.
    o.services.push(service(
        "shop",
        "vip-is-vm",
        &["10.9.0.1"],
        json!([{"port": 1}]),
    ));
    // A service port out of range.
    o.services.push(service(
        "shop",
        "bad-port",
        &["10.96.0.50"],
        json!([{"port": 80, "targetPort": 70000}]),
    ));
    let built = o.build();
    let skipped = skipped_of(&built);
    let expect = [
        "Pod legacy/twin: uid: \"file-vm\" is already the uid of workloads[0]",
        "Pod shop/bad-ip: ips[0]: \"10.1.0.300\" is not an IP address",
        "Pod shop/on-vip: ips: 10.96.9.9 is a VIP of the configuration's services[0] (legacy.example.org)",
        "Service shop/bad-port: ports[80]: target port 70000 is not a port (1..=65535)",
    ];
    for e in expect {
        assert!(skipped.iter().any(|s| s == e), "{e:?} not in {skipped:?}");
    }
    assert!(
        skipped.iter().any(|s| s.starts_with(
            "Service shop/vip-is-pod: vips[0]: \"10.1.0.20\" is an address of workloads["
        )),
        "{skipped:?}"
    );
    assert!(
        skipped.iter().any(|s| s == "Service shop/vip-is-vm: vips[0]: \"10.9.0.1\" is an address of workloads[0] (legacy/vm-0)"),
        "{skipped:?}"
    );
    let mesh = &built.mesh;
    // Everything else is there.
    assert_eq!(mesh.workload_count(), 1 + 3);
    assert_eq!(mesh.workload_by_uid("file-vm").unwrap().name, "vm-0");
    assert!(mesh.service_by_vip(ip("10.96.0.10")).is_some());
    assert_eq!(
        mesh.service_by_vip(ip("10.96.9.9")).unwrap().hostname,
        "legacy.example.org"
    );
    for gone in ["10.1.0.20", "10.9.0.1", "10.96.0.50"] {
        assert_ne!(
            mesh.service_by_vip(ip(gone)).map(|s| s.namespace.as_str()),
            Some("shop"),
            "{gone}"
        );
    }

    // A service with the host name of one of the file's.
    let mut o = Objects::default();
    o.services.push(
        json!({"metadata": {"name": "legacy", "namespace": "legacy"},
        "spec": {"clusterIPs": ["10.96.0.60"], "ports": [{"port": 80}]}}),
    );
    let fqdn = KubeOptions {
        cluster_domain: "example.org".into(),
        ..KubeOptions::default()
    };
    let mut cfg = MeshConfig::parse(FILE, "config.yaml").unwrap();
    cfg.services[0].hostname = "legacy.legacy.svc.example.org".into();
    let base = cfg.validate("config.yaml").unwrap();
    let built = build_mesh(&base, &o.cluster(), &fqdn);
    assert_eq!(
        skipped_of(&built),
        [
            "Service legacy/legacy: hostname: \"legacy.legacy.svc.example.org\" in namespace \
          \"legacy\" is already defined by services[0]"
        ]
    );
    assert_eq!(built.mesh.service_count(), 1);
}

#[test]
fn the_result_does_not_depend_on_the_order_of_the_objects() {
    let o = shop();
    let a = o.build().mesh;
    let mut r = shop();
    r.pods.reverse();
    r.services.reverse();
    r.slices.reverse();
    let b = r.build().mesh;
    assert!(a.workloads().eq(b.workloads()));
    assert!(a.services().eq(b.services()));
}

#[test]
fn validation_paths_split() {
    assert_eq!(
        split_path("workloads[12].ips[0]"),
        Some(("workloads", 12, "ips[0]"))
    );
    assert_eq!(split_path("services[3]"), Some(("services", 3, "")));
    assert_eq!(split_path("vips[1]"), Some(("vips", 1, "")));
    assert_eq!(split_path("trustDomain"), None);
}

#[test]
fn a_pods_workload_name_is_its_controllers_as_the_reference_names_it() {
    let mut p = pod("shop", "web-7d9f8-x2x", &["10.1.0.5"]);
    p["metadata"]["labels"] = serde_json::json!({"pod-template-hash": "7d9f8"});
    p["metadata"]["ownerReferences"] = serde_json::json!([
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-the-controller", "uid": "u1"},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f8", "uid": "u2", "controller": true}
    ]);
    let w = workload_of(p, &["shop"]).unwrap();
    assert_eq!(w.workload_name.as_deref(), Some("web"));
    let bare = workload_of(pod("shop", "solo", &["10.1.0.6"]), &["shop"]).unwrap();
    assert_eq!(bare.workload_name.as_deref(), Some("solo"));
}

/// A service whose endpoints are all outside the mesh (the API server's
/// addresses, which no pod holds; pods on their node's network) is left
/// out, named, so its addresses are passed through like any outside the
/// mesh: never refused for want of a mesh endpoint. A service whose
/// endpoint pod the watch has not delivered yet stays (its traffic waits).
#[test]
fn a_service_with_no_endpoint_in_the_mesh_is_left_out_to_be_passed_through() {
    let mut o = shop();
    o.namespaces.push(namespace("default", None));
    o.services.push(service(
        "default",
        "kubernetes",
        &["10.96.0.1"],
        json!([{"name": "https", "port": 443, "targetPort": 6443}]),
    ));
    o.slices.push(slice(
        "default",
        "kubernetes",
        "kubernetes",
        "IPv4",
        json!([{"addresses": ["172.18.0.2"], "conditions": {"ready": true}}]),
        json!([{"name": "https", "port": 6443}]),
    ));
    let mut host = pod("shop", "node-agent-0", &["172.18.0.3"]);
    host["spec"]["hostNetwork"] = json!(true);
    o.pods.push(host);
    o.services.push(service(
        "shop",
        "agent",
        &["10.96.0.20"],
        json!([{"port": 9100}]),
    ));
    o.slices.push(slice(
        "shop",
        "agent-1",
        "agent",
        "IPv4",
        json!([endpoint("shop", "node-agent-0", "172.18.0.3", Some(true))]),
        json!([{"port": 9100}]),
    ));
    o.services.push(service(
        "shop",
        "soon",
        &["10.96.0.21"],
        json!([{"port": 80}]),
    ));
    o.slices.push(slice(
        "shop",
        "soon-1",
        "soon",
        "IPv4",
        json!([endpoint("shop", "soon-0", "10.1.0.40", Some(true))]),
        json!([{"port": 80}]),
    ));
    // A hand-made slice pointing at a mesh pod's address, without a pod
    // reference: that address is the mesh's, so the service stays (never
    // passed through to a mesh pod in plaintext).
    o.services.push(service(
        "shop",
        "by-hand",
        &["10.96.0.22"],
        json!([{"port": 8080}]),
    ));
    o.slices.push(slice(
        "shop",
        "by-hand-1",
        "by-hand",
        "IPv4",
        json!([{"addresses": ["10.1.0.10"], "conditions": {"ready": true}}]),
        json!([{"port": 8080}]),
    ));
    // A host-network pod beside a pod not delivered yet: not all outside.
    o.services.push(service(
        "shop",
        "mixed",
        &["10.96.0.23"],
        json!([{"port": 9100}]),
    ));
    o.slices.push(slice(
        "shop",
        "mixed-1",
        "mixed",
        "IPv4",
        json!([
            endpoint("shop", "node-agent-0", "172.18.0.3", Some(true)),
            endpoint("shop", "soon-1", "10.1.0.41", Some(true))
        ]),
        json!([{"port": 9100}]),
    ));
    let built = o.build();
    let mesh = &built.mesh;
    assert!(
        mesh.service_by_vip(ip("10.96.0.22")).is_some(),
        "a mesh pod's address by hand"
    );
    assert!(
        mesh.service_by_vip(ip("10.96.0.23")).is_some(),
        "not all outside"
    );
    assert!(mesh.service_by_vip(ip("10.96.0.1")).is_none());
    assert!(mesh.address_claimants(ip("10.96.0.1")).is_empty());
    assert!(mesh.service_by_vip(ip("10.96.0.20")).is_none());
    assert!(
        mesh.service_by_vip(ip("10.96.0.21")).is_some(),
        "a pod not delivered yet keeps its service"
    );
    let skipped = skipped_of(&built);
    for name in ["Service default/kubernetes", "Service shop/agent"] {
        assert!(
            skipped
                .iter()
                .any(|s| s.starts_with(name) && s.contains("none of its endpoints is of the mesh")),
            "{name} not named: {skipped:?}"
        );
    }
    // The others as before.
    assert!(mesh.service_by_vip(ip("10.96.0.10")).is_some());
}

/// A Service's endpoint selection as the reference's control plane reads
/// it: `internalTrafficPolicy: Local` (the client's node only),
/// `trafficDistribution: PreferClose` (the closest first),
/// `publishNotReadyAddresses` (those not ready too); none of them: any
/// ready endpoint.
#[test]
fn a_services_traffic_policies_become_its_load_balancing() {
    use crate::{LbMode, LoadBalancing, Scope};
    let mut o = shop();
    let with = |name: &str, vip: &str, f: &dyn Fn(&mut Value)| {
        let mut s = service("shop", name, &[vip], json!([{"port": 80}]));
        f(&mut s["spec"]);
        s
    };
    o.services.push(with("local", "10.96.1.1", &|s| {
        s["internalTrafficPolicy"] = json!("Local")
    }));
    o.services.push(with("close", "10.96.1.2", &|s| {
        s["trafficDistribution"] = json!("PreferClose")
    }));
    o.services.push(with("unready", "10.96.1.3", &|s| {
        s["publishNotReadyAddresses"] = json!(true);
        s["internalTrafficPolicy"] = json!("Cluster");
    }));
    for name in ["local", "close", "unready"] {
        o.slices.push(slice(
            "shop",
            &format!("{name}-1"),
            name,
            "IPv4",
            json!([endpoint("shop", "web-0", "10.1.0.10", Some(true))]),
            json!([{"port": 80}]),
        ));
    }
    let built = o.build();
    let lb = |vip: &str| {
        built
            .mesh
            .service_by_vip(ip(vip))
            .unwrap_or_else(|| panic!("no service at {vip}"))
            .load_balancing
            .clone()
    };
    assert_eq!(
        lb("10.96.1.1"),
        Some(LoadBalancing {
            routing_preference: vec![Scope::Node],
            mode: LbMode::Strict,
            allow_unhealthy: false,
        })
    );
    assert_eq!(
        lb("10.96.1.2"),
        Some(LoadBalancing {
            routing_preference: vec![Scope::Network, Scope::Region, Scope::Zone, Scope::Subzone],
            mode: LbMode::Failover,
            allow_unhealthy: false,
        })
    );
    assert_eq!(
        lb("10.96.1.3"),
        Some(LoadBalancing {
            allow_unhealthy: true,
            mode: LbMode::Failover,
            ..Default::default()
        })
    );
    assert_eq!(lb("10.96.0.10"), None, "no policy: any ready endpoint");
}
