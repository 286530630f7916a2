//! The watch against the fake API server of the test bed (`ringway_testbed::kube_api`) (kube's
//! `Client` over a `tower_test` mock service, answering the watchers' lists
//! from an object store the test edits and their watches with the store's
//! changes). [`MeshWatch`] runs exactly as in the proxy: on its own thread
//! and runtime, publishing through its callback.

use std::net::IpAddr;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;
use crate::enrollment::{DATAPLANE_MODE_LABEL, ISTIO_DATAPLANE_MODE_LABEL};
use crate::{Mesh, MeshConfig, NoEnv};
use ringway_testbed::kube_api::fixtures::{
    self, endpoint, external_service, namespace, service, uid,
};
use ringway_testbed::kube_api::{ApiMode, FakeApiServer, Kind};

// ------------------------------------------------------------------ objects

/// A web pod: [`fixtures::pod`] labelled `app=web`, service account `web`.
fn pod(ns: &str, name: &str, ips: &[&str]) -> Value {
    fixtures::pod(ns, name, ips)
        .label("app", "web")
        .service_account("web")
        .json()
}

/// The slice `<svc>-abcde` of `svc` listing `pods` as `(name, address, ready)`.
fn slice(ns: &str, svc: &str, pods: &[(&str, &str, bool)], ports: Value) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, addr, ready)| endpoint(ns, pod, addr, Some(*ready)))
        .collect();
    fixtures::slice(
        ns,
        &format!("{svc}-abcde"),
        svc,
        "IPv4",
        json!(endpoints),
        ports,
    )
}

fn web_ports() -> Value {
    json!([{"name": "http", "port": 80, "targetPort": "http"}])
}

fn web_slice_ports() -> Value {
    json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
}

/// A namespace `shop` in the mesh with two web pods behind `web` (web-1
/// not ready), a pending and a host-network pod, a headless `db` and an
/// ExternalName service; a namespace `plain` outside the mesh.
fn shop(api: &FakeApiServer) {
    api.apply(Kind::Namespace, namespace("shop", Some("enabled")));
    api.apply(Kind::Namespace, namespace("plain", None));
    api.apply(Kind::Pod, pod("shop", "web-0", &["10.1.0.10"]));
    api.apply(Kind::Pod, pod("shop", "web-1", &["10.1.0.11"]));
    api.apply(Kind::Pod, pod("plain", "legacy-0", &["10.1.0.30"]));
    let mut pending = pod("shop", "web-2", &[]);
    pending["status"] = json!({"phase": "Pending"});
    api.apply(Kind::Pod, pending);
    let mut host = pod("shop", "agent", &["192.168.0.5"]);
    host["spec"]["hostNetwork"] = json!(true);
    api.apply(Kind::Pod, host);
    api.apply(
        Kind::Service,
        service("shop", "web", &["10.96.0.10"], web_ports()),
    );
    api.apply(
        Kind::EndpointSlice,
        slice(
            "shop",
            "web",
            &[("web-0", "10.1.0.10", true), ("web-1", "10.1.0.11", false)],
            web_slice_ports(),
        ),
    );
    api.apply(
        Kind::Service,
        service("shop", "db", &["None"], json!([{"port": 5432}])),
    );
    api.apply(
        Kind::Service,
        external_service("shop", "ext", "db.example.com"),
    );
}

const FILE: &str = r#"
trustDomain: example.org
policies:
  - name: web-from-frontend
    namespace: shop
    action: ALLOW
    rules: [{from: [{principals: ["spiffe://example.org/ns/front/sa/frontend"]}]}]
"#;

fn file(yaml: &str) -> Arc<Mesh> {
    Arc::new(MeshConfig::load_str(yaml, "config.yaml", &NoEnv).unwrap())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

// ------------------------------------------------------------------ the harness

/// Bounds that only tell "soon" from "hung".
const PATIENCE: Duration = Duration::from_secs(10);

struct Harness {
    api: FakeApiServer,
    watch: MeshWatch,
    meshes: mpsc::Receiver<Arc<Mesh>>,
}

fn test_options() -> KubeOptions {
    KubeOptions {
        debounce: Duration::from_millis(20),
        backoff_min: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        ..KubeOptions::default()
    }
}

impl Harness {
    fn start(setup: impl FnOnce(&FakeApiServer)) -> Harness {
        Harness::start_with(test_options(), setup)
    }

    fn start_with(options: KubeOptions, setup: impl FnOnce(&FakeApiServer)) -> Harness {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (client, api) = FakeApiServer::start(runtime.handle());
        setup(&api);
        let (tx, meshes) = mpsc::channel();
        let watch = MeshWatch::start(runtime, client, file(FILE), options, move |m| {
            let _ = tx.send(m);
        })
        .unwrap();
        Harness { api, watch, meshes }
    }

    /// The next snapshot published.
    fn next(&self) -> Arc<Mesh> {
        self.meshes
            .recv_timeout(PATIENCE)
            .expect("no snapshot published")
    }

    /// Snapshots until one satisfies `ok`.
    fn until(&self, what: &str, ok: impl Fn(&Mesh) -> bool) -> Arc<Mesh> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.meshes.recv_timeout(left) {
                Ok(m) if ok(&m) => return m,
                Ok(_) => {}
                Err(_) => panic!("no snapshot where {what}"),
            }
        }
    }

    /// Nothing published for `d`.
    fn quiet(&self, d: Duration) {
        if let Ok(m) = self.meshes.recv_timeout(d) {
            panic!(
                "unexpected snapshot: {} workloads, {} services",
                m.workload_count(),
                m.service_count()
            );
        }
    }
}

fn workload<'a>(m: &'a Mesh, ns: &str, name: &str) -> Option<&'a crate::Workload> {
    m.workload_by_uid(&uid(ns, name))
}

fn service_named<'a>(m: &'a Mesh, host: &str) -> Option<&'a crate::Service> {
    m.services().find(|s| s.hostname == host).map(|s| &**s)
}

const WEB: &str = "web.shop.svc.cluster.local";

// ------------------------------------------------------------------ tests

/// Pods, services and EndpointSlices become the mesh, published once every
/// list is in, with the file's policies.
#[test]
fn the_cluster_becomes_the_mesh() {
    let h = Harness::start(shop);
    let m = h.next();

    let web0 = workload(&m, "shop", "web-0").expect("web-0");
    assert_eq!(web0.ips, [ip("10.1.0.10")]);
    assert_eq!(
        (web0.service_account.as_str(), web0.node.as_str()),
        ("web", "node-a")
    );
    assert!(web0.tunnel && web0.healthy);
    let web1 = workload(&m, "shop", "web-1").expect("web-1");
    assert!(web1.tunnel && !web1.healthy, "not ready in its slice");
    let legacy = workload(&m, "plain", "legacy-0").expect("legacy-0");
    assert!(!legacy.tunnel, "its namespace is not in the mesh");
    assert!(workload(&m, "shop", "web-2").is_none(), "pending, no IP");
    assert!(workload(&m, "shop", "agent").is_none(), "host network");
    assert_eq!(m.workload_count(), 3);

    let web = m.service_by_vip(ip("10.96.0.10")).expect("the web VIP");
    assert_eq!(web.hostname, WEB);
    assert_eq!(web.target_port(80), Some(8080), "named targetPort");
    assert_eq!(
        m.endpoint_uids(web),
        [uid("shop", "web-0"), uid("shop", "web-1")]
    );
    assert_eq!(
        m.healthy_endpoints(web, 80, false)
            .map(|(w, _)| w.name.as_str())
            .collect::<Vec<_>>(),
        ["web-0"]
    );
    let db = service_named(&m, "db.shop.svc.cluster.local").expect("db");
    assert!(db.vips.is_empty(), "headless");
    assert!(service_named(&m, "ext.shop.svc.cluster.local").is_none());
    assert_eq!(m.service_count(), 2);

    assert_eq!(m.trust_domain(), "example.org");
    assert_eq!(m.policy_count(), 1);
    assert_eq!(m.policies_for(web0).count(), 1);
    assert_eq!(m.origin(), "config.yaml + kubernetes");
    assert!(Arc::ptr_eq(&h.watch.current().unwrap(), &m));

    // One list and one watch per kind, cluster-wide, none label-selected:
    // every namespace is watched (either of two labels enrolls one).
    for kind in Kind::ALL {
        let reqs = h.api.requests_of(kind);
        assert!(
            reqs.iter().any(|r| !r.watch) && reqs.iter().any(|r| r.watch),
            "{kind:?}: {reqs:?}"
        );
        for q in reqs.into_iter().map(|r| r.query) {
            assert_eq!(q.get("labelSelector"), None, "{kind:?}");
            assert!(!q.contains_key("fieldSelector"), "{kind:?}: cluster-wide");
        }
    }
    h.quiet(Duration::from_millis(200));
}

/// Each watch event publishes an updated mesh.
#[test]
fn watch_events_update_the_mesh() {
    let h = Harness::start(shop);
    h.next();

    // A pod is deleted: gone from the workloads and its service.
    h.api.delete(Kind::Pod, "shop", "web-0");
    let m = h.until("web-0 is gone", |m| workload(m, "shop", "web-0").is_none());
    assert_eq!(
        m.endpoint_uids(m.service_by_vip(ip("10.96.0.10")).unwrap()),
        [uid("shop", "web-1")]
    );

    // An endpoint becomes ready.
    h.api.apply(
        Kind::EndpointSlice,
        slice(
            "shop",
            "web",
            &[("web-1", "10.1.0.11", true)],
            web_slice_ports(),
        ),
    );
    let m = h.until("web-1 is healthy", |m| {
        workload(m, "shop", "web-1").is_some_and(|w| w.healthy)
    });
    let web = m.service_by_vip(ip("10.96.0.10")).unwrap();
    assert_eq!(m.healthy_endpoints(web, 80, false).count(), 1);

    // A service gets a VIP (dual stack).
    h.api.apply(
        Kind::Service,
        service("shop", "web", &["10.96.0.10", "fd00:96::10"], web_ports()),
    );
    let m = h.until("the IPv6 VIP is known", |m| {
        m.service_by_vip(ip("fd00:96::10")).is_some()
    });
    assert_eq!(m.service_by_vip(ip("fd00:96::10")).unwrap().hostname, WEB);

    // A new pod starts running.
    h.api.apply(Kind::Pod, pod("shop", "web-3", &["10.1.0.13"]));
    h.until("web-3 is a workload", |m| {
        m.workload_by_ip(ip("10.1.0.13")).is_some()
    });

    // Its namespace leaves the mesh: its pods no longer speak the tunnel.
    h.api.apply(Kind::Namespace, namespace("shop", None));
    let m = h.until("shop left the mesh", |m| {
        workload(m, "shop", "web-1").is_some_and(|w| !w.tunnel)
    });
    assert!(m.workloads().all(|w| !w.tunnel));

    // The Istio ambient mesh's label enrolls it again.
    h.api.apply(
        Kind::Namespace,
        fixtures::namespace_with_labels("shop", &[(ISTIO_DATAPLANE_MODE_LABEL, "ambient")]),
    );
    h.until("shop is in the mesh by its istio.io label", |m| {
        workload(m, "shop", "web-1").is_some_and(|w| w.tunnel)
    });
    // Moved from one label to the other in one update, both ways, then
    // both labels and one removed: it never leaves the mesh.
    for labels in [
        &[(DATAPLANE_MODE_LABEL, "enabled")][..],
        &[(ISTIO_DATAPLANE_MODE_LABEL, "ambient")],
        &[
            (ISTIO_DATAPLANE_MODE_LABEL, "ambient"),
            (DATAPLANE_MODE_LABEL, "enabled"),
        ],
        &[(ISTIO_DATAPLANE_MODE_LABEL, "ambient")],
    ] {
        h.api.apply(
            Kind::Namespace,
            fixtures::namespace_with_labels("shop", labels),
        );
    }
    // A pod opted out by the Istio label, in the enrolled namespace.
    let mut opted_out = pod("shop", "web-3", &["10.1.0.13"]);
    opted_out["metadata"]["labels"][ISTIO_DATAPLANE_MODE_LABEL] = json!("none");
    h.api.apply(Kind::Pod, opted_out);
    // Every snapshot up to it has shop in the mesh.
    h.until("web-3 opted out", |m| {
        assert!(
            workload(m, "shop", "web-1").is_some_and(|w| w.tunnel),
            "shop left the mesh while one of its labels enrolled it"
        );
        workload(m, "shop", "web-3").is_some_and(|w| !w.tunnel)
    });
    h.api.apply(Kind::Pod, pod("shop", "web-3", &["10.1.0.13"]));
    h.until("web-3 back", |m| {
        workload(m, "shop", "web-3").is_some_and(|w| w.tunnel)
    });

    // A change the mesh does not depend on publishes nothing.
    let mut p = pod("shop", "web-3", &["10.1.0.13"]);
    p["metadata"]["annotations"] = json!({"touched": "yes"});
    h.api.apply(Kind::Pod, p);
    h.quiet(Duration::from_millis(300));
}

/// A bad object is left out; the others stay, and it comes back once the
/// conflict is gone.
#[test]
fn a_bad_object_is_left_out_and_the_rest_kept() {
    let h = Harness::start(shop);
    h.next();

    // IP reuse seen before the old pod's deletion: the newer pod wins.
    let mut newer = pod("shop", "web-9", &["10.1.0.10"]);
    newer["metadata"]["creationTimestamp"] = json!("2026-02-01T00:00:00Z");
    h.api.apply(Kind::Pod, newer);
    // A service whose VIP is a pod's address.
    h.api.apply(
        Kind::Service,
        service("shop", "clash", &["10.1.0.11"], json!([{"port": 80}])),
    );
    let m = h.until("web-9 owns 10.1.0.10", |m| {
        m.workload_by_ip(ip("10.1.0.10"))
            .is_some_and(|w| w.name == "web-9")
    });
    assert!(
        workload(&m, "shop", "web-0").is_none(),
        "the older pod is left out"
    );
    assert!(service_named(&m, "clash.shop.svc.cluster.local").is_none());
    assert!(workload(&m, "shop", "web-1").is_some());
    assert!(workload(&m, "plain", "legacy-0").is_some());
    let web = service_named(&m, WEB).unwrap();
    assert_eq!(m.endpoint_uids(web), [uid("shop", "web-1")]);
    assert_eq!(m.policy_count(), 1);

    // The newer pod goes: the older one is back, with its endpoint.
    h.api.delete(Kind::Pod, "shop", "web-9");
    let m = h.until("web-0 is back", |m| workload(m, "shop", "web-0").is_some());
    assert_eq!(
        m.endpoint_uids(service_named(&m, WEB).unwrap()),
        [uid("shop", "web-0"), uid("shop", "web-1")]
    );
}

/// The file's policies survive cluster updates, and a file reload is merged
/// with the latest cluster state.
#[test]
fn file_reloads_and_cluster_updates_merge() {
    let h = Harness::start(shop);
    let first = h.next();
    assert_eq!(first.policies().next().unwrap().name, "web-from-frontend");

    h.api.apply(Kind::Pod, pod("shop", "web-3", &["10.1.0.13"]));
    let m = h.until("web-3", |m| workload(m, "shop", "web-3").is_some());
    assert!(m.policies().eq(first.policies()), "policies survive");
    assert_eq!(m.trust_domain(), "example.org");

    // The file is reloaded with another policy.
    let reloaded = "trustDomain: example.org\npolicies:\n  - {name: no-debug, namespace: shop, \
                    action: DENY, rules: [{to: [{ports: [9090]}]}]}\n";
    h.watch.set_file(file(reloaded));
    let m = h.until("the reloaded policy", |m| {
        m.policies().any(|p| p.name == "no-debug")
    });
    assert_eq!(m.policy_count(), 1);
    assert!(
        workload(&m, "shop", "web-3").is_some(),
        "cluster state kept"
    );
    assert!(m.service_by_vip(ip("10.96.0.10")).is_some());

    // And survives the next cluster update.
    h.api.delete(Kind::Pod, "shop", "web-3");
    let m = h.until("web-3 gone", |m| workload(m, "shop", "web-3").is_none());
    assert_eq!(m.policies().next().unwrap().name, "no-debug");
    assert!(Arc::ptr_eq(&h.watch.current().unwrap(), &m));
}

/// Nothing is published before every kind is listed; a failing list or
/// watch is retried with backoff and the watch resumes where it was.
#[test]
fn api_errors_are_retried() {
    let h = Harness::start(|api| {
        shop(api);
        api.set_mode_of(Kind::EndpointSlice, ApiMode::Unreachable);
    });
    // Without the slices no snapshot (it would have no endpoints).
    h.quiet(Duration::from_millis(300));
    let tries = h.api.requests_of(Kind::EndpointSlice).len();
    assert!(tries >= 2, "the slice list is retried ({tries} requests)");
    h.api.set_mode_of(Kind::EndpointSlice, ApiMode::Serve);
    let m = h.next();
    assert_eq!(m.endpoint_uids(service_named(&m, WEB).unwrap()).len(), 2);

    // The pod watch breaks; a change made meanwhile arrives once it is back.
    h.api.set_mode_of(Kind::Pod, ApiMode::Unreachable);
    h.api.end_watches(Kind::Pod);
    h.api.apply(Kind::Pod, pod("shop", "web-3", &["10.1.0.13"]));
    std::thread::sleep(Duration::from_millis(100));
    h.api.set_mode_of(Kind::Pod, ApiMode::Serve);
    h.until("web-3 after the outage", |m| {
        workload(m, "shop", "web-3").is_some()
    });

    // An event lost for good: the watch expires (410), the watcher lists
    // again, and the list no longer has the pod.
    h.api.delete_unseen(Kind::Pod, "shop", "web-3");
    h.api.expire(Kind::Pod);
    h.until("web-3 gone after the relist", |m| {
        workload(m, "shop", "web-3").is_none()
    });
    assert!(
        h.api
            .requests_of(Kind::Pod)
            .iter()
            .filter(|r| !r.watch)
            .count()
            >= 2
    );
}

/// A burst of changes is published as one snapshot (or very few), with the
/// production debounce.
#[test]
fn bursts_are_debounced() {
    let h = Harness::start_with(
        KubeOptions {
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            ..KubeOptions::default()
        },
        shop,
    );
    h.next();
    for i in 0..50 {
        h.api.apply(
            Kind::Pod,
            pod("shop", &format!("burst-{i}"), &[&format!("10.1.1.{i}")]),
        );
    }
    let mut snapshots = 0;
    loop {
        let m = h.next();
        snapshots += 1;
        if workload(&m, "shop", "burst-49").is_some() {
            assert_eq!(m.workload_count(), 3 + 50);
            break;
        }
    }
    assert!(snapshots <= 5, "{snapshots} snapshots for one burst");
    h.quiet(Duration::from_millis(300));
}

#[test]
fn stopping_joins_the_thread() {
    let h = Harness::start(shop);
    h.next();
    let Harness { watch, meshes, .. } = h;
    watch.stop();
    // The callback (and its sender) went with the thread.
    assert!(matches!(
        meshes.recv_timeout(PATIENCE),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
}

// ------------------------------------------------------------------ cluster policies

fn istio_object(ns: &str, name: &str, spec: Value) -> Value {
    json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
        "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec})
}

fn cluster_policy<'a>(m: &'a Mesh, name: &str) -> Option<&'a crate::AuthorizationPolicy> {
    m.policies().find(|p| p.qualified_name().as_ref() == name)
}

fn deny_port(port: &str) -> Value {
    json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": [port]}}]}]})
}

#[test]
fn authorization_policy_watch_create_update_delete() {
    let h = Harness::start(shop);
    let m = h.next();
    assert_eq!(m.policy_count(), 1, "the file's only");

    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object("shop", "deny", deny_port("8080")),
    );
    let m = h.until("the policy is in", |m| {
        cluster_policy(m, "istio/shop/deny").is_some()
    });
    let p = cluster_policy(&m, "istio/shop/deny").unwrap();
    assert_eq!(p.origin.as_deref(), Some("AuthorizationPolicy shop/deny"));
    assert_eq!(p.rules[0].to[0].ports, [8080]);
    // The file's policy stays.
    assert!(cluster_policy(&m, "shop/web-from-frontend").is_some());

    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object("shop", "deny", deny_port("9090")),
    );
    h.until("the policy is updated", |m| {
        cluster_policy(m, "istio/shop/deny").is_some_and(|p| p.rules[0].to[0].ports == [9090])
    });

    h.api.delete(Kind::AuthorizationPolicy, "shop", "deny");
    h.until("the policy is gone", |m| {
        cluster_policy(m, "istio/shop/deny").is_none()
    });
}

#[test]
fn authorization_policy_watch_relists_after_410() {
    let h = Harness::start(|api| {
        shop(api);
        api.apply(
            Kind::AuthorizationPolicy,
            istio_object("shop", "deny", deny_port("8080")),
        );
    });
    h.until("the policy is in", |m| {
        cluster_policy(m, "istio/shop/deny").is_some()
    });
    // A deletion the watch never sees; the watch expires: the relist has it.
    h.api
        .delete_unseen(Kind::AuthorizationPolicy, "shop", "deny");
    h.api.expire(Kind::AuthorizationPolicy);
    h.until("the policy is gone after the relist", |m| {
        cluster_policy(m, "istio/shop/deny").is_none()
    });
    let lists = h
        .api
        .requests_of(Kind::AuthorizationPolicy)
        .iter()
        .filter(|r| !r.watch)
        .count();
    assert!(lists >= 2, "{lists} lists");
}

#[test]
fn adversarial_authorization_policy_watch_reads_a_malformed_object_toward_deny_next_to_good_ones() {
    let h = Harness::start(shop);
    h.next();
    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object(
            "shop",
            "bad",
            json!({"action": "DENY", "rules": [{"from": "everyone"}]}),
        ),
    );
    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object("shop", "good", deny_port("8080")),
    );
    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object(
            "shop",
            "bad-principal",
            json!({"action": "PERMIT", "rules": [{"from": [{"source": {"principals": ["a"]}}]}]}),
        ),
    );
    let m = h.until("the good policy is in", |m| {
        cluster_policy(m, "istio/shop/good").is_some() && m.cluster_policy_notes().len() == 2
    });
    // Neither malformed object is dropped (a DENY would vanish): each
    // denies every connection to what it could select, named in a note.
    let toward_deny: Vec<&str> = m
        .cluster_policy_notes()
        .iter()
        .filter(|n| !n.skipped && n.code == "unreadable-deny-all")
        .map(|n| n.object.as_str())
        .collect();
    assert_eq!(
        toward_deny,
        [
            "AuthorizationPolicy shop/bad",
            "AuthorizationPolicy shop/bad-principal"
        ]
    );
    let bad = cluster_policy(&m, "istio/shop/bad").expect("kept, toward deny");
    assert_eq!(bad.action, crate::Action::Deny);

    // Fixed: it comes in, nothing is skipped any more.
    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object("shop", "bad", deny_port("9090")),
    );
    h.api
        .delete(Kind::AuthorizationPolicy, "shop", "bad-principal");
    h.until("the fixed policy is in", |m| {
        cluster_policy(m, "istio/shop/bad").is_some() && m.cluster_policy_notes().is_empty()
    });
}

#[test]
fn peer_authentication_watch_create_update_delete_and_relist() {
    let h = Harness::start(shop);
    h.next();
    let mode = |m: &Mesh| {
        let w = workload(m, "shop", "web-0").unwrap();
        m.mtls_mode(w, 8080).0
    };
    h.api.apply(
        Kind::PeerAuthentication,
        istio_object("shop", "default", json!({"mtls": {"mode": "STRICT"}})),
    );
    h.until("STRICT", |m| mode(m) == crate::MtlsMode::Strict);
    h.api.apply(
        Kind::PeerAuthentication,
        istio_object("shop", "default", json!({"mtls": {"mode": "PERMISSIVE"}})),
    );
    h.until("PERMISSIVE", |m| {
        mode(m) == crate::MtlsMode::Permissive && !m.peer_authentications().is_empty()
    });
    h.api.delete(Kind::PeerAuthentication, "shop", "default");
    h.until("gone", |m| m.peer_authentications().is_empty());

    h.api.apply(
        Kind::PeerAuthentication,
        istio_object("shop", "default", json!({"mtls": {"mode": "STRICT"}})),
    );
    h.until("STRICT again", |m| mode(m) == crate::MtlsMode::Strict);
    h.api
        .delete_unseen(Kind::PeerAuthentication, "shop", "default");
    h.api.expire(Kind::PeerAuthentication);
    h.until("gone after the relist", |m| {
        m.peer_authentications().is_empty()
    });
}

#[test]
fn authorization_policy_watch_uses_v1beta1_when_v1_is_not_served() {
    let h = Harness::start(|api| {
        shop(api);
        api.serve_security_versions(&["v1beta1"]);
        api.apply(
            Kind::AuthorizationPolicy,
            istio_object("shop", "deny", deny_port("8080")),
        );
    });
    h.until("the policy is in", |m| {
        cluster_policy(m, "istio/shop/deny").is_some()
    });
    let paths: Vec<String> = h
        .api
        .requests_of(Kind::AuthorizationPolicy)
        .into_iter()
        .map(|r| r.path)
        .collect();
    assert!(
        paths
            .iter()
            .any(|p| p == "/apis/security.istio.io/v1beta1/authorizationpolicies"),
        "{paths:?}"
    );
    // Watches follow (live changes arrive).
    h.api.delete(Kind::AuthorizationPolicy, "shop", "deny");
    h.until("the policy is gone", |m| {
        cluster_policy(m, "istio/shop/deny").is_none()
    });
}

/// A 403 on the policy watch (the proxy's RBAC role lacks the kind: RBAC
/// drift) never means "no policies": policies may exist that the proxy
/// cannot see, so no snapshot is published until it may list them (the
/// proxy stays unready and takes no pods), where a missing CRD (404, no
/// such policy can exist) publishes at once.
#[test]
fn adversarial_a_forbidden_policy_watch_holds_the_mesh_until_access() {
    let h = Harness::start(|api| {
        shop(api);
        api.apply(
            Kind::AuthorizationPolicy,
            istio_object("shop", "deny", deny_port("8080")),
        );
        api.set_mode_of(Kind::AuthorizationPolicy, ApiMode::Refuse(403));
    });
    // Several rounds of refused lists (both versions, then again after the
    // longest backoff, 50 ms here), and no snapshot.
    let lists = || {
        h.api
            .requests_of(Kind::AuthorizationPolicy)
            .iter()
            .filter(|r| !r.watch)
            .count()
    };
    let deadline = Instant::now() + PATIENCE;
    while lists() < 6 {
        assert!(Instant::now() < deadline, "the lists are not retried");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        h.watch.current().is_none(),
        "a snapshot was published without the policies the proxy may not see"
    );
    // Access granted: the policy is in the first snapshot.
    h.api.set_mode_of(Kind::AuthorizationPolicy, ApiMode::Serve);
    let m = h.next();
    assert!(cluster_policy(&m, "istio/shop/deny").is_some());
}

#[test]
fn adversarial_authorization_policy_watch_without_the_crds_never_blocks_the_mesh() {
    let h = Harness::start(|api| {
        shop(api);
        api.serve_security_versions(&[]);
    });
    let m = h.next();
    assert!(workload(&m, "shop", "web-0").is_some());
    assert_eq!(m.policy_count(), 1);
    // The CRDs are installed later: their objects arrive (tried again after
    // the longest backoff).
    h.api.apply(
        Kind::AuthorizationPolicy,
        istio_object("shop", "deny", deny_port("8080")),
    );
    h.api.serve_security_versions(&["v1"]);
    h.until("the policy arrives once served", |m| {
        cluster_policy(m, "istio/shop/deny").is_some()
    });
}

/// Once listed, the policies stay in force when the kind stops being
/// served or allowed (an RBAC edit, an API outage answering 404/403): the
/// last snapshot stays, as for every other watch, instead of a DENY
/// silently vanishing.
#[test]
fn adversarial_authorization_policy_watch_keeps_policies_when_access_is_lost() {
    let h = Harness::start(|api| {
        shop(api);
        api.apply(
            Kind::AuthorizationPolicy,
            istio_object("shop", "deny", deny_port("8080")),
        );
    });
    h.until("the policy is in", |m| {
        cluster_policy(m, "istio/shop/deny").is_some()
    });
    h.api.serve_security_versions(&[]);
    h.api.expire(Kind::AuthorizationPolicy);
    // The relists fail (every version, then again after the longest
    // backoff, 50 ms here): wait for several rounds of them.
    let lists = || {
        h.api
            .requests_of(Kind::AuthorizationPolicy)
            .iter()
            .filter(|r| !r.watch)
            .count()
    };
    let before = lists();
    let deadline = Instant::now() + PATIENCE;
    while lists() < before + 6 {
        assert!(Instant::now() < deadline, "the relists are not retried");
        std::thread::sleep(Duration::from_millis(10));
    }
    let m = h.watch.current().unwrap();
    assert!(
        cluster_policy(&m, "istio/shop/deny").is_some(),
        "the DENY policy vanished when the API stopped serving it"
    );
    // Served again: the watch resumes from a fresh list.
    h.api
        .delete_unseen(Kind::AuthorizationPolicy, "shop", "deny");
    h.api.serve_security_versions(&["v1"]);
    h.until("the relist after access returned", |m| {
        cluster_policy(m, "istio/shop/deny").is_none()
    });
}

/// The fake over HTTP (for another process) answers as through the mock:
/// the store's pods, and TokenReviews of the registered tokens, with the
/// audience checked as the API server does.
#[test]
fn the_fake_api_server_over_http_lists_and_reviews_tokens() {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::core::v1::Pod;
    ringway_testbed::run_isolated(
        "the_fake_api_server_over_http_lists_and_reviews_tokens",
        || {
            // The fake serves while the test blocks on the runtime.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let api = FakeApiServer::serve_http(runtime.handle(), listener).unwrap();
            api.apply_pod(pod("shop", "web-1", &["10.0.0.5"]));
            api.add_token(
                "good",
                fixtures::service_account_user("shop", "web", Some(("web-1", "u-1", "node-a"))),
                &["istio-ca", "other"],
            );
            runtime.block_on(async {
                let config = ::kube::Config::new(format!("http://{addr}").parse().unwrap());
                let client = ::kube::Client::try_from(config).unwrap();
                let pods = ::kube::Api::<Pod>::all(client.clone())
                    .list(&Default::default())
                    .await
                    .unwrap();
                assert_eq!(pods.items.len(), 1);
                let reviews = ::kube::Api::<TokenReview>::all(client);
                let review = |token: &str, audience: &str| {
                    let tr = TokenReview {
                        spec: TokenReviewSpec {
                            token: Some(token.to_owned()),
                            audiences: Some(vec![audience.to_owned()]),
                        },
                        ..TokenReview::default()
                    };
                    let reviews = reviews.clone();
                    async move {
                        reviews
                            .create(&Default::default(), &tr)
                            .await
                            .unwrap()
                            .status
                            .unwrap()
                    }
                };
                let ok = review("good", "istio-ca").await;
                assert_eq!(ok.authenticated, Some(true));
                assert_eq!(ok.audiences, Some(vec!["istio-ca".to_owned()]));
                let user = ok.user.unwrap();
                assert_eq!(
                    user.username.as_deref(),
                    Some("system:serviceaccount:shop:web")
                );
                assert_eq!(
                    user.extra.unwrap()["authentication.kubernetes.io/node-name"],
                    vec!["node-a".to_owned()]
                );
                let wrong = review("good", "kubernetes").await;
                assert_eq!(wrong.authenticated, Some(false), "{wrong:?}");
                assert!(wrong.error.unwrap().contains("audiences"));
                assert_eq!(
                    review("forged", "istio-ca").await.authenticated,
                    Some(false)
                );
                api.revoke_token("good");
                assert_eq!(review("good", "istio-ca").await.authenticated, Some(false));
            });
            assert_eq!(api.token_reviews(), 4);
        },
    );
}

/// The fake's `PATCH`: a JSON merge patch of a pod's `status` subresource (as
/// a node agent annotates a pod) is applied to the stored object (`null`
/// removes a key, the spec is left alone), the watches see it, and the
/// request is recorded with its body; a patch naming another uid, of an
/// absent pod, or of another patch type is refused; the patch mode fails
/// patches only.
#[test]
fn the_fake_api_server_applies_and_records_merge_patches() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (client, api) = FakeApiServer::start(runtime.handle());
    api.apply_pod(pod("shop", "web-1", &["10.0.0.5"]));
    let uid = uid("shop", "web-1");
    runtime.block_on(async {
        let pods = ::kube::Api::<Pod>::namespaced(client.clone(), "shop");
        let mut events = std::pin::pin!(kube::runtime::watcher(
            ::kube::Api::<Pod>::all(client),
            Default::default()
        ));
        use futures::StreamExt;
        // The watch's list is in.
        loop {
            let e = tokio::time::timeout(PATIENCE, events.next()).await.unwrap();
            if matches!(e, Some(Ok(kube::runtime::watcher::Event::InitDone))) {
                break;
            }
        }
        let set = json!({"metadata": {"uid": uid, "annotations": {"a.b/c": "on", "keep": "x"}},
            "spec": {"nodeName": "elsewhere"}});
        let patched = pods
            .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&set))
            .await
            .unwrap();
        let annotations = patched.metadata.annotations.clone().unwrap();
        assert_eq!(annotations["a.b/c"], "on");
        assert_eq!(
            patched.spec.unwrap().node_name.as_deref(),
            Some("node-a"),
            "the status subresource leaves the spec alone"
        );
        // The watch sees the change.
        loop {
            match tokio::time::timeout(PATIENCE, events.next()).await.unwrap() {
                Some(Ok(kube::runtime::watcher::Event::Apply(p))) => {
                    assert_eq!(p.metadata.annotations.unwrap()["a.b/c"], "on");
                    break;
                }
                other => assert!(matches!(other, Some(Ok(_))), "{other:?}"),
            }
        }
        let remove = json!({"metadata": {"uid": uid, "annotations": {"a.b/c": null}}});
        pods.patch_status("web-1", &PatchParams::default(), &Patch::Merge(&remove))
            .await
            .unwrap();
        let stored = api.get(Kind::Pod, "shop", "web-1").unwrap();
        assert_eq!(stored["metadata"]["annotations"], json!({"keep": "x"}));

        // Refused: another uid (409), an absent pod (404), a strategic merge
        // patch (415).
        let code = |e: kube::Error| match e {
            kube::Error::Api(s) => s.code,
            other => panic!("{other:?}"),
        };
        let other = json!({"metadata": {"uid": "uid-of-another", "annotations": {"z": "1"}}});
        let e = pods
            .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&other))
            .await
            .unwrap_err();
        assert_eq!(code(e), 409);
        let e = pods
            .patch_status("gone", &PatchParams::default(), &Patch::Merge(&set))
            .await
            .unwrap_err();
        assert_eq!(code(e), 404);
        let e = pods
            .patch_status("web-1", &PatchParams::default(), &Patch::Strategic(&set))
            .await
            .unwrap_err();
        assert_eq!(code(e), 415);

        // The patch mode: patches refused, GETs still served.
        api.set_patch_mode(ApiMode::Refuse(403));
        let e = pods
            .patch_status("web-1", &PatchParams::default(), &Patch::Merge(&set))
            .await
            .unwrap_err();
        assert_eq!(code(e), 403);
        assert!(pods.get("web-1").await.is_ok());
    });
    let patches = api.patches();
    assert_eq!(patches.len(), 6, "{patches:?}");
    assert_eq!(patches[0].path, "/api/v1/namespaces/shop/pods/web-1/status");
    assert_eq!(
        patches[0].content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        serde_json::from_str::<Value>(patches[1].body.as_deref().unwrap()).unwrap(),
        json!({"metadata": {"uid": uid, "annotations": {"a.b/c": null}}})
    );
    assert_eq!(
        api.get(Kind::Pod, "shop", "web-1").unwrap()["metadata"]["annotations"],
        json!({"keep": "x"}),
        "nothing refused was applied"
    );
}

/// The test bed's fixtures spell the labels the mapping reads (the test bed
/// depends on no ringway crate, so it cannot name the constants).
#[test]
fn fixture_labels_are_the_ones_the_product_reads() {
    assert_eq!(fixtures::DATAPLANE_MODE_LABEL, DATAPLANE_MODE_LABEL);
    assert_eq!(
        fixtures::ISTIO_DATAPLANE_MODE_LABEL,
        ISTIO_DATAPLANE_MODE_LABEL
    );
    assert_eq!(fixtures::SERVICE_NAME_LABEL, SERVICE_NAME_LABEL);
}
