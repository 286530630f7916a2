//! The watch against a fake API server: kube's `Client` over a `tower_test`
//! mock service, answering the watchers' lists from an object store the test
//! edits and their watches with streaming bodies fed by the store's changes
//! (replayed from the requested `resourceVersion`, so nothing between a list
//! and its watch is lost). [`MeshWatch`] runs exactly as in the proxy: on its
//! own thread and runtime, publishing through its callback.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::channel::mpsc as fmpsc;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use serde_json::{json, Value};

use super::*;
use crate::enrollment::DATAPLANE_MODE_LABEL;
use crate::{Mesh, MeshConfig, NoEnv};

type Chunks = fmpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>;
type Body = StreamBody<Chunks>;
type Sender = fmpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

// ------------------------------------------------------------------ the fake API server

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pods,
    Namespaces,
    Services,
    Slices,
}

impl Kind {
    const ALL: [Kind; 4] = [Kind::Pods, Kind::Namespaces, Kind::Services, Kind::Slices];

    fn of_path(path: &str) -> Option<Kind> {
        match path {
            "/api/v1/pods" => Some(Kind::Pods),
            "/api/v1/namespaces" => Some(Kind::Namespaces),
            "/api/v1/services" => Some(Kind::Services),
            "/apis/discovery.k8s.io/v1/endpointslices" => Some(Kind::Slices),
            _ => None,
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::Slices => "discovery.k8s.io/v1",
            _ => "v1",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Pods => "Pod",
            Kind::Namespaces => "Namespace",
            Kind::Services => "Service",
            Kind::Slices => "EndpointSlice",
        }
    }
}

/// One change of the store, for watches.
struct Change {
    rv: u64,
    kind: Kind,
    old: Option<Value>,
    new: Option<Value>,
}

struct Watch {
    kind: Kind,
    label: Option<(String, String)>,
    tx: Sender,
}

#[derive(Default)]
struct State {
    rv: u64,
    objects: BTreeMap<(Kind, String, String), Value>,
    history: Vec<Change>,
    watches: Vec<Watch>,
    /// Kinds whose requests fail as if the API server were unreachable.
    down: BTreeSet<Kind>,
    /// Watches from an older resourceVersion than this get 410 Gone.
    expired_before: BTreeMap<Kind, u64>,
    /// (kind, is a watch, query) of every request.
    requests: Vec<(Kind, bool, BTreeMap<String, String>)>,
}

#[derive(Clone)]
struct FakeApi(Arc<Mutex<State>>);

impl FakeApi {
    /// A client whose every request goes to the returned fake. Call inside
    /// the runtime that will drive both.
    fn start() -> (Client, FakeApi) {
        let (service, mut handle) =
            tower_test::mock::pair::<Request<::kube::client::Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let api = FakeApi(Arc::new(Mutex::new(State {
            rv: 100,
            ..State::default()
        })));
        let server = api.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                server.serve(&req, send);
            }
        });
        (client, api)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates or replaces an object (its kind's apiVersion/kind are filled in).
    fn apply(&self, kind: Kind, mut obj: Value) {
        obj["apiVersion"] = json!(kind.api_version());
        obj["kind"] = json!(kind.name());
        let key = key(kind, &obj);
        let mut s = self.state();
        let old = s.objects.get(&key).cloned();
        if let Some(obj) = s.commit(kind, old, Some(obj)) {
            s.objects.insert(key, obj);
        }
    }

    /// Deletes an object, telling the watches.
    fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut s = self.state();
        if let Some(old) = s
            .objects
            .remove(&(kind, namespace.to_owned(), name.to_owned()))
        {
            s.commit(kind, Some(old), None);
        }
    }

    /// Deletes an object without telling anyone (an event the watch missed).
    fn delete_unseen(&self, kind: Kind, namespace: &str, name: &str) {
        let mut s = self.state();
        s.objects
            .remove(&(kind, namespace.to_owned(), name.to_owned()));
        s.rv += 1;
    }

    /// Ends the open watches of `kind` with 410 Gone and refuses to resume
    /// from before now: the watcher must list again.
    fn expire(&self, kind: Kind) {
        let mut s = self.state();
        let rv = s.rv;
        s.expired_before.insert(kind, rv);
        s.watches.retain(|w| {
            if w.kind == kind {
                send_line(&w.tx, &gone());
                false
            } else {
                true
            }
        });
    }

    /// `true`: requests of `kind` fail (connection refused) and its open
    /// watches end; `false`: served again.
    fn set_down(&self, kind: Kind, down: bool) {
        let mut s = self.state();
        if down {
            s.down.insert(kind);
            s.watches.retain(|w| w.kind != kind);
        } else {
            s.down.remove(&kind);
        }
    }

    fn requests(&self, kind: Kind) -> Vec<(bool, BTreeMap<String, String>)> {
        self.state()
            .requests
            .iter()
            .filter(|r| r.0 == kind)
            .map(|r| (r.1, r.2.clone()))
            .collect()
    }

    fn serve(
        &self,
        req: &Request<::kube::client::Body>,
        send: tower_test::mock::SendResponse<Response<Body>>,
    ) {
        let Some(kind) = Kind::of_path(req.uri().path()) else {
            panic!("unexpected request {} {}", req.method(), req.uri());
        };
        assert_eq!(req.method(), http::Method::GET, "{}", req.uri());
        let query = parse_query(req.uri().query().unwrap_or(""));
        let is_watch = query.get("watch").map(String::as_str) == Some("true");
        let mut s = self.state();
        s.requests.push((kind, is_watch, query.clone()));
        if s.down.contains(&kind) {
            send.send_error(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused (fake API server down)",
            ));
            return;
        }
        let label = query
            .get("labelSelector")
            .and_then(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()));
        if is_watch {
            let since: u64 = query
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let (tx, rx) = fmpsc::unbounded();
            send.send_response(Response::new(StreamBody::new(rx)));
            if s.expired_before.get(&kind).is_some_and(|&min| since < min) {
                send_line(&tx, &gone());
                return;
            }
            for c in s.history.iter().filter(|c| c.kind == kind && c.rv > since) {
                send_event(&tx, &label, c);
            }
            s.watches.push(Watch { kind, label, tx });
        } else {
            let items: Vec<Value> = s
                .objects
                .iter()
                .filter(|((k, _, _), o)| *k == kind && matches(&label, o))
                .map(|(_, o)| o.clone())
                .collect();
            let list = json!({
                "apiVersion": kind.api_version(), "kind": format!("{}List", kind.name()),
                "metadata": {"resourceVersion": s.rv.to_string()}, "items": items
            });
            let (tx, rx) = fmpsc::unbounded();
            let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(
                serde_json::to_vec(&list).unwrap(),
            ))));
            let mut resp = Response::new(StreamBody::new(rx));
            *resp.status_mut() = StatusCode::OK;
            send.send_response(resp);
        }
    }
}

impl State {
    /// Records a change (`new` gets the next resourceVersion) and tells the
    /// open watches. Returns the stored `new`.
    fn commit(&mut self, kind: Kind, old: Option<Value>, new: Option<Value>) -> Option<Value> {
        self.rv += 1;
        let rv = self.rv;
        let new = new.map(|mut o| {
            o["metadata"]["resourceVersion"] = json!(rv.to_string());
            o
        });
        let change = Change {
            rv,
            kind,
            old,
            new: new.clone(),
        };
        self.watches.retain(|w| {
            if w.kind == kind {
                send_event(&w.tx, &w.label, &change);
            }
            !w.tx.is_closed()
        });
        self.history.push(change);
        new
    }
}

fn key(kind: Kind, obj: &Value) -> (Kind, String, String) {
    let meta = &obj["metadata"];
    (
        kind,
        meta["namespace"].as_str().unwrap_or("").to_owned(),
        meta["name"].as_str().unwrap_or("").to_owned(),
    )
}

fn matches(label: &Option<(String, String)>, obj: &Value) -> bool {
    label
        .as_ref()
        .is_none_or(|(k, v)| obj["metadata"]["labels"][k.as_str()].as_str() == Some(v.as_str()))
}

/// The event a watch with `label` sees for `change`, if any (an object
/// leaving the selector is DELETED for it).
fn send_event(tx: &Sender, label: &Option<(String, String)>, change: &Change) {
    let was = change.old.as_ref().is_some_and(|o| matches(label, o));
    let is = change.new.as_ref().is_some_and(|o| matches(label, o));
    let (kind, obj) = match (was, is, &change.new) {
        (false, true, Some(o)) => ("ADDED", o.clone()),
        (true, true, Some(o)) => ("MODIFIED", o.clone()),
        (true, false, Some(o)) => ("DELETED", o.clone()),
        (true, _, None) => {
            let mut o = change.old.clone().unwrap_or_default();
            o["metadata"]["resourceVersion"] = json!(change.rv.to_string());
            ("DELETED", o)
        }
        _ => return,
    };
    send_line(tx, &json!({"type": kind, "object": obj}));
}

fn gone() -> Value {
    json!({"type": "ERROR", "object": {
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "too old resource version", "reason": "Expired", "code": 410}})
}

fn send_line(tx: &Sender, v: &Value) {
    let mut line = serde_json::to_vec(v).unwrap();
    line.push(b'\n');
    let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(line))));
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let mut out = Vec::new();
        let mut bytes = s.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'%' => {
                    let hex: Vec<u8> = bytes.by_ref().take(2).collect();
                    let hex = std::str::from_utf8(&hex).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
                }
                b'+' => out.push(b' '),
                b => out.push(b),
            }
        }
        String::from_utf8(out).unwrap()
    }
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

// ------------------------------------------------------------------ objects

fn pod(ns: &str, name: &str, ips: &[&str]) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns, "uid": uid(ns, name),
            "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"app": "web"}},
        "spec": {"nodeName": "node-a", "serviceAccountName": "web",
            "containers": [{"name": "app", "image": "app",
                "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ips.first(),
            "podIPs": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>()}
    })
}

fn uid(ns: &str, name: &str) -> String {
    format!("uid-{ns}-{name}")
}

fn namespace(name: &str, mode: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/metadata.name": name});
    if let Some(m) = mode {
        labels[DATAPLANE_MODE_LABEL] = json!(m);
    }
    json!({"metadata": {"name": name, "labels": labels}})
}

fn service(ns: &str, name: &str, cluster_ips: &[&str], ports: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"clusterIP": cluster_ips.first(), "clusterIPs": cluster_ips, "ports": ports,
            "selector": {"app": name}}
    })
}

/// The slice of `svc` listing `pods` as `(name, address, ready)`.
fn slice(ns: &str, svc: &str, pods: &[(&str, &str, bool)], ports: Value) -> Value {
    let endpoints: Vec<Value> = pods
        .iter()
        .map(|(pod, addr, ready)| {
            json!({"addresses": [addr], "conditions": {"ready": ready},
                "targetRef": {"kind": "Pod", "namespace": ns, "name": pod, "uid": uid(ns, pod)}})
        })
        .collect();
    json!({
        "metadata": {"name": format!("{svc}-abcde"), "namespace": ns,
            "labels": {SERVICE_NAME_LABEL: svc}},
        "addressType": "IPv4", "endpoints": endpoints, "ports": ports
    })
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
fn shop(api: &FakeApi) {
    api.apply(Kind::Namespaces, namespace("shop", Some("enabled")));
    api.apply(Kind::Namespaces, namespace("plain", None));
    api.apply(Kind::Pods, pod("shop", "web-0", &["10.1.0.10"]));
    api.apply(Kind::Pods, pod("shop", "web-1", &["10.1.0.11"]));
    api.apply(Kind::Pods, pod("plain", "legacy-0", &["10.1.0.30"]));
    let mut pending = pod("shop", "web-2", &[]);
    pending["status"] = json!({"phase": "Pending"});
    api.apply(Kind::Pods, pending);
    let mut host = pod("shop", "agent", &["192.168.0.5"]);
    host["spec"]["hostNetwork"] = json!(true);
    api.apply(Kind::Pods, host);
    api.apply(
        Kind::Services,
        service("shop", "web", &["10.96.0.10"], web_ports()),
    );
    api.apply(
        Kind::Slices,
        slice(
            "shop",
            "web",
            &[("web-0", "10.1.0.10", true), ("web-1", "10.1.0.11", false)],
            web_slice_ports(),
        ),
    );
    api.apply(
        Kind::Services,
        service("shop", "db", &["None"], json!([{"port": 5432}])),
    );
    api.apply(
        Kind::Services,
        json!({"metadata": {"name": "ext", "namespace": "shop"},
            "spec": {"type": "ExternalName", "externalName": "db.example.com"}}),
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
    api: FakeApi,
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
    fn start(setup: impl FnOnce(&FakeApi)) -> Harness {
        Harness::start_with(test_options(), setup)
    }

    fn start_with(options: KubeOptions, setup: impl FnOnce(&FakeApi)) -> Harness {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (client, api) = {
            let _in = runtime.enter();
            FakeApi::start()
        };
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
                m.workloads().len(),
                m.services().len()
            );
        }
    }
}

fn workload<'a>(m: &'a Mesh, ns: &str, name: &str) -> Option<&'a crate::Workload> {
    m.workload_by_uid(&uid(ns, name))
}

fn service_named<'a>(m: &'a Mesh, host: &str) -> Option<&'a crate::Service> {
    m.services().iter().find(|s| s.hostname == host)
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
    assert_eq!(m.workloads().len(), 3);

    let web = m.service_by_vip(ip("10.96.0.10")).expect("the web VIP");
    assert_eq!(web.hostname, WEB);
    assert_eq!(web.target_port(80), Some(8080), "named targetPort");
    assert_eq!(web.endpoints, [uid("shop", "web-0"), uid("shop", "web-1")]);
    assert_eq!(
        m.healthy_endpoints(web, false)
            .map(|(w, _)| w.name.as_str())
            .collect::<Vec<_>>(),
        ["web-0"]
    );
    let db = service_named(&m, "db.shop.svc.cluster.local").expect("db");
    assert!(db.vips.is_empty(), "headless");
    assert!(service_named(&m, "ext.shop.svc.cluster.local").is_none());
    assert_eq!(m.services().len(), 2);

    assert_eq!(m.trust_domain(), "example.org");
    assert_eq!(m.policies().len(), 1);
    assert_eq!(m.policies_for(web0).count(), 1);
    assert_eq!(m.origin(), "config.yaml + kubernetes");
    assert!(Arc::ptr_eq(&h.watch.current().unwrap(), &m));

    // One list and one watch per kind, cluster-wide; only the enabled
    // namespaces are watched.
    for kind in Kind::ALL {
        let reqs = h.api.requests(kind);
        assert!(
            reqs.iter().any(|(w, _)| !w) && reqs.iter().any(|(w, _)| *w),
            "{kind:?}: {reqs:?}"
        );
        for (_, q) in reqs {
            let label = q.get("labelSelector").map(String::as_str);
            let want = (kind == Kind::Namespaces).then_some("ringway.io/dataplane-mode=enabled");
            assert_eq!(label, want, "{kind:?}");
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
    h.api.delete(Kind::Pods, "shop", "web-0");
    let m = h.until("web-0 is gone", |m| workload(m, "shop", "web-0").is_none());
    assert_eq!(
        m.service_by_vip(ip("10.96.0.10")).unwrap().endpoints,
        [uid("shop", "web-1")]
    );

    // An endpoint becomes ready.
    h.api.apply(
        Kind::Slices,
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
    assert_eq!(m.healthy_endpoints(web, false).count(), 1);

    // A service gets a VIP (dual stack).
    h.api.apply(
        Kind::Services,
        service("shop", "web", &["10.96.0.10", "fd00:96::10"], web_ports()),
    );
    let m = h.until("the IPv6 VIP is known", |m| {
        m.service_by_vip(ip("fd00:96::10")).is_some()
    });
    assert_eq!(m.service_by_vip(ip("fd00:96::10")).unwrap().hostname, WEB);

    // A new pod starts running.
    h.api
        .apply(Kind::Pods, pod("shop", "web-3", &["10.1.0.13"]));
    h.until("web-3 is a workload", |m| {
        m.workload_by_ip(ip("10.1.0.13")).is_some()
    });

    // Its namespace leaves the mesh: its pods no longer speak the tunnel.
    h.api.apply(Kind::Namespaces, namespace("shop", None));
    let m = h.until("shop left the mesh", |m| {
        workload(m, "shop", "web-1").is_some_and(|w| !w.tunnel)
    });
    assert!(m.workloads().iter().all(|w| !w.tunnel));

    // A change the mesh does not depend on publishes nothing.
    let mut p = pod("shop", "web-3", &["10.1.0.13"]);
    p["metadata"]["annotations"] = json!({"touched": "yes"});
    h.api.apply(Kind::Pods, p);
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
    h.api.apply(Kind::Pods, newer);
    // A service whose VIP is a pod's address.
    h.api.apply(
        Kind::Services,
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
    assert_eq!(web.endpoints, [uid("shop", "web-1")]);
    assert_eq!(m.policies().len(), 1);

    // The newer pod goes: the older one is back, with its endpoint.
    h.api.delete(Kind::Pods, "shop", "web-9");
    let m = h.until("web-0 is back", |m| workload(m, "shop", "web-0").is_some());
    assert_eq!(
        service_named(&m, WEB).unwrap().endpoints,
        [uid("shop", "web-0"), uid("shop", "web-1")]
    );
}

/// The file's policies survive cluster updates, and a file reload is merged
/// with the latest cluster state.
#[test]
fn file_reloads_and_cluster_updates_merge() {
    let h = Harness::start(shop);
    let first = h.next();
    assert_eq!(first.policies()[0].name, "web-from-frontend");

    h.api
        .apply(Kind::Pods, pod("shop", "web-3", &["10.1.0.13"]));
    let m = h.until("web-3", |m| workload(m, "shop", "web-3").is_some());
    assert_eq!(m.policies(), first.policies(), "policies survive");
    assert_eq!(m.trust_domain(), "example.org");

    // The file is reloaded with another policy.
    let reloaded = "trustDomain: example.org\npolicies:\n  - {name: no-debug, namespace: shop, \
                    action: DENY, rules: [{to: [{ports: [9090]}]}]}\n";
    h.watch.set_file(file(reloaded));
    let m = h.until("the reloaded policy", |m| {
        m.policies().iter().any(|p| p.name == "no-debug")
    });
    assert_eq!(m.policies().len(), 1);
    assert!(
        workload(&m, "shop", "web-3").is_some(),
        "cluster state kept"
    );
    assert!(m.service_by_vip(ip("10.96.0.10")).is_some());

    // And survives the next cluster update.
    h.api.delete(Kind::Pods, "shop", "web-3");
    let m = h.until("web-3 gone", |m| workload(m, "shop", "web-3").is_none());
    assert_eq!(m.policies()[0].name, "no-debug");
    assert!(Arc::ptr_eq(&h.watch.current().unwrap(), &m));
}

/// Nothing is published before every kind is listed; a failing list or
/// watch is retried with backoff and the watch resumes where it was.
#[test]
fn api_errors_are_retried() {
    let h = Harness::start(|api| {
        shop(api);
        api.set_down(Kind::Slices, true);
    });
    // Without the slices no snapshot (it would have no endpoints).
    h.quiet(Duration::from_millis(300));
    let tries = h.api.requests(Kind::Slices).len();
    assert!(tries >= 2, "the slice list is retried ({tries} requests)");
    h.api.set_down(Kind::Slices, false);
    let m = h.next();
    assert_eq!(service_named(&m, WEB).unwrap().endpoints.len(), 2);

    // The pod watch breaks; a change made meanwhile arrives once it is back.
    h.api.set_down(Kind::Pods, true);
    h.api
        .apply(Kind::Pods, pod("shop", "web-3", &["10.1.0.13"]));
    std::thread::sleep(Duration::from_millis(100));
    h.api.set_down(Kind::Pods, false);
    h.until("web-3 after the outage", |m| {
        workload(m, "shop", "web-3").is_some()
    });

    // An event lost for good: the watch expires (410), the watcher lists
    // again, and the list no longer has the pod.
    h.api.delete_unseen(Kind::Pods, "shop", "web-3");
    h.api.expire(Kind::Pods);
    h.until("web-3 gone after the relist", |m| {
        workload(m, "shop", "web-3").is_none()
    });
    assert!(
        h.api
            .requests(Kind::Pods)
            .iter()
            .filter(|(w, _)| !w)
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
            Kind::Pods,
            pod("shop", &format!("burst-{i}"), &[&format!("10.1.1.{i}")]),
        );
    }
    let mut snapshots = 0;
    loop {
        let m = h.next();
        snapshots += 1;
        if workload(&m, "shop", "burst-49").is_some() {
            assert_eq!(m.workloads().len(), 3 + 50);
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
