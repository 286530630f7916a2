//! A fake Kubernetes API server for the node agent's tests: kube's [`Client`] over a
//! `tower_test` mock service, answering from an object store the test edits.
//!
//! It serves what the agent asks for: lists and watches of pods (`fieldSelector`
//! `a.b=v`) and namespaces (`labelSelector` `k=v`), with watch events replayed from
//! the requested `resourceVersion` on (so a change between a list and its watch is not
//! lost) and a label-selected watch reporting an object that stops matching as
//! `DELETED`; and GETs of one pod or namespace (404 `NotFound` when absent). Every
//! request is recorded. [`ApiMode`] makes it refuse or ignore new requests.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use futures::channel::mpsc as fmpsc;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use serde_json::{json, Value};
use tower_test::mock::SendResponse;

use crate::kube::Client;

type Chunks = fmpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>;
type Body = StreamBody<Chunks>;
type Sender = fmpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// How the fake answers new requests (open watches are not affected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiMode {
    /// From the store.
    Serve,
    /// With a connection error, as an unreachable API server.
    Unreachable,
    /// Never (the request hangs), as an API server that stopped answering.
    Hang,
}

/// The resource kinds the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pod,
    Namespace,
}

/// One change of the store, for watches.
#[derive(Debug)]
struct Change {
    rv: u64,
    kind: Kind,
    old: Option<Value>,
    new: Option<Value>,
}

/// `key=value` selectors of a list or watch.
#[derive(Debug, Clone, Default)]
struct Filter {
    /// `fieldSelector`: a dotted path into the object and its value.
    field: Option<(String, String)>,
    /// `labelSelector`: a label and its value.
    label: Option<(String, String)>,
}

impl Filter {
    fn parse(query: &BTreeMap<String, String>) -> Filter {
        let pair = |k: &str| {
            query
                .get(k)
                .and_then(|s| s.split_once('='))
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
        };
        Filter {
            field: pair("fieldSelector"),
            label: pair("labelSelector"),
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some((path, want)) = &self.field {
            let got = path.split('.').fold(obj, |v, k| &v[k]);
            if got.as_str() != Some(want.as_str()) {
                return false;
            }
        }
        if let Some((label, want)) = &self.label {
            if obj["metadata"]["labels"][label.as_str()].as_str() != Some(want.as_str()) {
                return false;
            }
        }
        true
    }
}

struct Watch {
    kind: Kind,
    filter: Filter,
    tx: Sender,
}

struct State {
    rv: u64,
    pods: BTreeMap<(String, String), Value>,
    namespaces: BTreeMap<String, Value>,
    history: Vec<Change>,
    watches: Vec<Watch>,
    requests: Vec<String>,
    mode: ApiMode,
    /// Requests left unanswered in [`ApiMode::Hang`].
    hung: Vec<SendResponse<Response<Body>>>,
}

/// The fake API server; see the module docs.
#[derive(Clone)]
pub struct FakeApiServer(Arc<Mutex<State>>);

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("FakeApiServer")
            .field("rv", &s.rv)
            .field("pods", &s.pods.len())
            .field("namespaces", &s.namespaces.len())
            .field("mode", &s.mode)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// A client whose every request goes to the returned fake, which runs on
    /// `runtime` (the client is built there too; something must drive it).
    pub fn start(runtime: &tokio::runtime::Handle) -> (Client, FakeApiServer) {
        let _enter = runtime.enter();
        let (service, mut handle) =
            tower_test::mock::pair::<Request<kube::client::Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let api = FakeApiServer(Arc::new(Mutex::new(State {
            rv: 1,
            pods: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            history: Vec::new(),
            watches: Vec::new(),
            requests: Vec::new(),
            mode: ApiMode::Serve,
            hung: Vec::new(),
        })));
        let server = api.clone();
        runtime.spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                server.serve(&req, send);
            }
        });
        (client, api)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How new requests are answered.
    pub fn set_mode(&self, mode: ApiMode) {
        let mut s = self.state();
        s.mode = mode;
        if mode != ApiMode::Hang {
            s.hung.clear();
        }
    }

    /// Every request so far, as `METHOD path?query`.
    pub fn requests(&self) -> Vec<String> {
        self.state().requests.clone()
    }

    /// The paths of the GETs of one object so far (`/api/v1/namespaces/<ns>` and
    /// `/api/v1/namespaces/<ns>/pods/<name>`).
    pub fn gets(&self) -> Vec<String> {
        self.requests()
            .into_iter()
            .filter_map(|r| r.strip_prefix("GET ").map(str::to_owned))
            .filter(|p| {
                p.starts_with("/api/v1/namespaces/") && !p.contains('?') && !p.ends_with("/pods")
            })
            .collect()
    }

    /// Creates or replaces namespace `name`, with `ringway.io/dataplane-mode=<mode>`
    /// when `mode` is given.
    pub fn apply_namespace(&self, name: &str, mode: Option<&str>) {
        let mut labels = json!({ "kubernetes.io/metadata.name": name });
        if let Some(m) = mode {
            labels[crate::kube::DATAPLANE_MODE_LABEL] = json!(m);
        }
        let obj = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": format!("ns-{name}"), "labels": labels}
        });
        let mut s = self.state();
        let old = s.namespaces.get(name).cloned();
        let obj = s.commit(Kind::Namespace, old, Some(obj));
        if let Some(obj) = obj {
            s.namespaces.insert(name.to_owned(), obj);
        }
    }

    /// Creates or replaces a pod (an object like [`FakePod::json`]'s).
    pub fn apply_pod(&self, pod: Value) {
        let key = (
            pod["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            pod["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        );
        let mut s = self.state();
        let old = s.pods.get(&key).cloned();
        if let Some(obj) = s.commit(Kind::Pod, old, Some(pod)) {
            s.pods.insert(key, obj);
        }
    }

    /// Deletes pod `namespace/name` (if present).
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        let mut s = self.state();
        let key = (namespace.to_owned(), name.to_owned());
        if let Some(old) = s.pods.remove(&key) {
            s.commit(Kind::Pod, Some(old), None);
        }
    }

    fn serve(&self, req: &Request<kube::client::Body>, send: SendResponse<Response<Body>>) {
        let path = req.uri().path().to_owned();
        let query = parse_query(req.uri().query().unwrap_or(""));
        let mut s = self.state();
        s.requests.push(format!(
            "{} {}{}",
            req.method(),
            path,
            req.uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default()
        ));
        match s.mode {
            ApiMode::Serve => {}
            ApiMode::Unreachable => {
                send.send_error(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "connection refused (fake API server set unreachable)",
                ));
                return;
            }
            ApiMode::Hang => {
                s.hung.push(send);
                return;
            }
        }
        if req.method() != http::Method::GET {
            send.send_response(status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"));
            return;
        }
        let segments: Vec<&str> = path
            .trim_start_matches("/api/v1/")
            .split('/')
            .filter(|p| !p.is_empty())
            .collect();
        let collection = match segments.as_slice() {
            ["pods"] => Some(Kind::Pod),
            ["namespaces"] => Some(Kind::Namespace),
            _ => None,
        };
        if let Some(kind) = collection {
            let filter = Filter::parse(&query);
            if query.get("watch").map(String::as_str) == Some("true") {
                let since: u64 = query
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (tx, rx) = fmpsc::unbounded();
                for c in s.history.iter().filter(|c| c.kind == kind && c.rv > since) {
                    send_event(&tx, &filter, c);
                }
                s.watches.push(Watch { kind, filter, tx });
                send.send_response(Response::new(StreamBody::new(rx)));
            } else {
                let items: Vec<Value> = match kind {
                    Kind::Pod => s
                        .pods
                        .values()
                        .filter(|o| filter.matches(o))
                        .cloned()
                        .collect(),
                    Kind::Namespace => s
                        .namespaces
                        .values()
                        .filter(|o| filter.matches(o))
                        .cloned()
                        .collect(),
                };
                let list_kind = match kind {
                    Kind::Pod => "PodList",
                    Kind::Namespace => "NamespaceList",
                };
                send.send_response(body(
                    StatusCode::OK,
                    &json!({"apiVersion": "v1", "kind": list_kind,
                        "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}),
                ));
            }
            return;
        }
        let found = match segments.as_slice() {
            ["namespaces", ns] => s.namespaces.get(*ns).cloned(),
            ["namespaces", ns, "pods", name] => {
                s.pods.get(&((*ns).to_owned(), (*name).to_owned())).cloned()
            }
            _ => None,
        };
        send.send_response(match found {
            Some(obj) => body(StatusCode::OK, &obj),
            None => status(StatusCode::NOT_FOUND, "NotFound"),
        });
    }
}

impl State {
    /// Records a change (`new` gets the next resourceVersion) and tells the open
    /// watches. Returns the stored `new`.
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
            if w.kind != change.kind {
                return true;
            }
            send_event(&w.tx, &w.filter, &change);
            !w.tx.is_closed()
        });
        self.history.push(change);
        new
    }
}

/// The event a watch with `filter` sees for `change`, if any.
fn send_event(tx: &Sender, filter: &Filter, change: &Change) {
    let was = change.old.as_ref().is_some_and(|o| filter.matches(o));
    let is = change.new.as_ref().is_some_and(|o| filter.matches(o));
    let (kind, obj) = match (was, is, &change.new) {
        (false, true, Some(o)) => ("ADDED", o.clone()),
        (true, true, Some(o)) => ("MODIFIED", o.clone()),
        (true, false, Some(o)) => ("DELETED", o.clone()),
        (true, _, None) => {
            // Deleted: the last state, at the deletion's resourceVersion.
            let mut o = change.old.clone().unwrap_or_default();
            o["metadata"]["resourceVersion"] = json!(change.rv.to_string());
            ("DELETED", o)
        }
        _ => return,
    };
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap_or_default();
    line.push(b'\n');
    let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(line))));
}

fn body(code: StatusCode, v: &Value) -> Response<Body> {
    let (tx, rx) = fmpsc::unbounded();
    let _ = tx.unbounded_send(Ok(Frame::data(Bytes::from(
        serde_json::to_vec(v).unwrap_or_default(),
    ))));
    let mut resp = Response::new(StreamBody::new(rx));
    *resp.status_mut() = code;
    resp
}

fn status(code: StatusCode, reason: &str) -> Response<Body> {
    body(
        code,
        &json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": reason, "reason": reason, "code": code.as_u16()}),
    )
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    match std::str::from_utf8(&b[i + 1..i + 3])
                        .ok()
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                    {
                        Some(c) => out.push(c),
                        None => out.extend_from_slice(&b[i..i + 3]),
                    }
                    i += 3;
                }
                b'+' => {
                    out.push(b' ');
                    i += 1;
                }
                c => {
                    out.push(c);
                    i += 1;
                }
            }
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// A pod object for [`FakeApiServer::apply_pod`]: `Pending` without an IP until
/// [`FakePod::running`].
#[derive(Debug, Clone)]
pub struct FakePod(Value);

impl FakePod {
    /// Pod `namespace/name` with `uid`, bound to `node`, service account `default`.
    pub fn new(uid: &str, namespace: &str, name: &str, node: &str) -> FakePod {
        FakePod(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]},
            "status": {"phase": "Pending"}
        }))
    }

    /// `ringway.io/dataplane-mode=<mode>` on the pod.
    pub fn mode(mut self, mode: &str) -> FakePod {
        self.0["metadata"]["labels"][crate::kube::DATAPLANE_MODE_LABEL] = json!(mode);
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

    /// Phase `Running` with these IPs (primary first).
    pub fn running(mut self, ips: &[&str]) -> FakePod {
        let list: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
        self.0["status"] = json!({"phase": "Running", "podIP": ips.first(), "podIPs": list});
        self
    }

    /// The object.
    pub fn json(&self) -> Value {
        self.0.clone()
    }
}
