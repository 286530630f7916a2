//! `--control-plane`'s own helpers: the generated mesh is what it says it is
//! (over xDS through the proxy's own handler, and as Kubernetes objects
//! through the watch and the fake API server, no network needed), and the
//! measurement at its smallest writes a complete report. Never asserts
//! performance.

use std::collections::{BTreeSet, HashMap};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use ringway_benches::control_plane::gen::{Scope, Shape, PORTS};
use ringway_benches::control_plane::{self, ControlPlaneConfig, ControlPlaneReport};
use ringway_config::kube::{KubeOptions, MeshWatch};
use ringway_config::{Mesh, MeshConfig, NoEnv};
use ringway_testbed::kube_api::FakeApiServer;
use ringway_testbed::TempDir;
use ringway_xds::proto::{workload, TypedResource};
use ringway_xds::state::{MeshState, XdsStatus};
use ringway_xds::{DeltaDiscoveryResponse, Handler, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

/// Odd sizes, so that no split comes out even by luck.
const SHAPE: Shape = Shape {
    workloads: 257,
    services: 51,
    policies: 137,
};

fn file() -> Arc<Mesh> {
    Arc::new(MeshConfig::load_str("trustDomain: cluster.local\n", "test", &NoEnv).unwrap())
}

/// The generated resources through the proxy's own handler.
fn xds_mesh(shape: &Shape) -> (Mesh, Arc<XdsStatus>) {
    let status = Arc::new(XdsStatus::default());
    let mut state = MeshState::new(file(), status.clone(), Box::new(|_| {}));
    for (url, resources) in [
        (ADDRESS_TYPE_URL, shape.xds_addresses()),
        (AUTHORIZATION_TYPE_URL, shape.xds_policies()),
    ] {
        let resp = DeltaDiscoveryResponse {
            resources,
            type_url: url.into(),
            nonce: "n".into(),
            ..Default::default()
        };
        state
            .on_response(&resp)
            .unwrap_or_else(|nack| panic!("{url} refused: {nack}"));
    }
    assert!(status.synced());
    (state.mesh(), status)
}

#[test]
fn generated_resources_are_the_shape_over_xds() {
    let s = SHAPE;
    let [global, namespace, selector] = s.scopes();
    assert_eq!(global + namespace + selector, s.policies);
    assert_eq!((global, namespace), (1, 41), "1% (at least one) and 30%");
    assert_eq!(s.namespaces(), 2, "40 services per namespace");
    let (mesh, status) = xds_mesh(&s);
    assert!(status.problems().is_empty(), "{:?}", status.problems());
    assert!(
        status.contested().is_empty(),
        "every address is claimed once"
    );
    assert_eq!(mesh.workload_count(), s.workloads);
    assert_eq!(mesh.service_count(), s.services);
    assert_eq!(mesh.policy_count(), s.policies);
    // Scopes as said.
    let policies: Vec<_> = mesh.policies().collect();
    assert_eq!(policies.iter().filter(|p| p.mesh_wide).count(), global);
    assert_eq!(policies.iter().filter(|p| p.listed).count(), selector);
    assert!(policies.iter().all(|p| p.rules.len() == 2));
    // Every service: its VIP, its ports, workloads / services endpoints.
    let mut ips = BTreeSet::new();
    for svc in 0..s.services {
        let got = mesh.service(&s.service_key(svc)).expect("service");
        assert_eq!(got.vips, vec![Shape::service_vip(svc)]);
        assert_eq!(got.ports, PORTS.into_iter().collect());
        let eps = mesh.endpoint_uids(got);
        assert_eq!(eps.len(), s.endpoints_of(svc).count());
        assert!(eps.len() == s.workloads / s.services || eps.len() == s.workloads / s.services + 1);
        assert!(ips.insert(Shape::service_vip(svc)));
    }
    // Every workload: its address, enrolled, healthy, in its service's
    // namespace, naming exactly the selector policies of its service, each
    // of which exists.
    let mut listed: HashMap<String, usize> = HashMap::new();
    for i in 0..s.workloads {
        let w = mesh.workload_by_uid(&s.workload_uid(i)).expect("workload");
        assert_eq!(w.ips, vec![Shape::workload_ip(i)]);
        assert!(ips.insert(Shape::workload_ip(i)), "addresses are unique");
        assert!(w.tunnel && w.healthy);
        assert_eq!(w.namespace, s.workload_namespace(i));
        for name in &w.authorization_policies {
            let p = mesh.policy(name).expect("a listed policy exists");
            assert!(p.listed);
            *listed.entry(name.to_string()).or_default() += 1;
        }
    }
    assert_eq!(listed.len(), selector, "every selector policy is listed");
    for j in 0..s.policies {
        if let (_, _, Scope::Selector(svc)) = s.policy(j) {
            assert_eq!(listed[&s.policy_name(j)], s.endpoints_of(svc).count());
        }
    }
    // A change is one resource that reads back changed.
    let changed = s.xds_workload(5, false, 2);
    let a = workload::Address::from_any(changed.resource.as_ref().unwrap()).unwrap();
    match a.kind {
        Some(workload::address::Kind::Workload(w)) => {
            assert_eq!(w.tunnel_protocol, workload::TunnelProtocol::None as i32)
        }
        other => panic!("{other:?}"),
    }
    assert_ne!(s.xds_policy(3, 1, 2), s.xds_policy(3, 0, 2));
}

#[test]
fn generated_objects_are_the_same_mesh_through_the_kubernetes_watch() {
    let s = SHAPE;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, api) = FakeApiServer::start(runtime.handle());
    for (kind, obj) in s.kube_objects() {
        api.apply(kind, obj);
    }
    let (tx, rx) = mpsc::channel();
    let options = KubeOptions {
        debounce: Duration::from_millis(10),
        ..KubeOptions::default()
    };
    let watch = MeshWatch::start(runtime, client, file(), options, move |m| {
        let _ = tx.send(m);
    })
    .unwrap();
    let kube = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a snapshot");
    assert_eq!(kube.workload_count(), s.workloads);
    assert_eq!(kube.service_count(), s.services);
    assert_eq!(kube.policy_count(), s.policies, "every policy mapped");
    let skipped: Vec<_> = kube
        .cluster_policy_notes()
        .iter()
        .filter(|n| n.skipped)
        .collect();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(
        kube.policies().filter(|p| p.mesh_wide).count(),
        s.scopes()[0]
    );
    for j in 0..s.policies {
        // As the bench finds a policy it changes.
        let (ns, name, _) = s.policy(j);
        let mapped = format!("istio/{ns}/{name}");
        assert!(kube.policies().any(|p| p.name == mapped), "{mapped}");
    }
    assert_eq!(
        kube.policies().filter(|p| p.match_labels.is_some()).count(),
        s.scopes()[2],
        "the selector policies select by label"
    );
    // The same workloads and services as over xDS.
    let (xds, _) = xds_mesh(&s);
    for i in 0..s.workloads {
        let k = kube.workload_by_uid(&s.pod_uid(i)).expect("pod's workload");
        let x = xds.workload_by_uid(&s.workload_uid(i)).unwrap();
        assert_eq!(
            (
                &k.ips,
                &k.namespace,
                &k.service_account,
                k.tunnel,
                k.healthy
            ),
            (
                &x.ips,
                &x.namespace,
                &x.service_account,
                x.tunnel,
                x.healthy
            ),
            "pod {i}"
        );
    }
    for svc in 0..s.services {
        let (k, x) = (
            kube.service(&s.service_key(svc)).expect("service"),
            xds.service(&s.service_key(svc)).unwrap(),
        );
        assert_eq!((&k.vips, &k.ports), (&x.vips, &x.ports));
        assert_eq!(kube.endpoint_uids(k).len(), xds.endpoint_uids(x).len());
    }
    // The change the bench makes: a pod labelled out of the mesh.
    api.apply(ringway_testbed::kube_api::Kind::Pod, s.kube_pod(7, true));
    let uid = s.pod_uid(7);
    let out = loop {
        let m = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a snapshot");
        if m.workload_by_uid(&uid).is_some_and(|w| !w.tunnel) {
            break m;
        }
    };
    assert_eq!(out.workload_count(), s.workloads);
    watch.stop();
}

#[test]
fn debug_durations_parse() {
    for (text, ms) in [
        ("1.5s", 1500.0),
        ("812.25ms", 812.25),
        ("15µs", 0.015),
        ("7ns", 7e-6),
    ] {
        assert_eq!(control_plane::parse_debug_duration_ms(text), Some(ms));
    }
    assert_eq!(control_plane::parse_debug_duration_ms("soon"), None);
}

#[test]
fn tiny_control_plane_run_writes_a_complete_report() {
    let _turn = super::one_at_a_time();
    let bin = super::proxy_bin();
    let out = TempDir::new("cp-test");
    let Some((md, report, problems)) =
        ringway_benches::run_control_plane(ControlPlaneConfig::tiny(), bin, &out)
            .expect("control-plane run")
    else {
        return; // privileges missing: run_isolated printed the banner (and panics under CI)
    };
    assert!(problems.is_empty(), "report problems: {problems:#?}\n{md}");
    assert_eq!(report.children.len(), 2, "{md}");
    let text = std::fs::read_to_string(out.join("control_plane.json")).expect("control_plane.json");
    let back: ControlPlaneReport = serde_json::from_str(&text).expect("control_plane.json parses");
    assert_eq!(back.children.len(), 2);
    assert_eq!(control_plane::render(&back), md);
}
