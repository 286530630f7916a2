//! A fake Kubernetes API server: kube's [`Client`] over a `tower_test` mock
//! service, answering from an object store the test edits.
//!
//! It serves the kinds of [`Kind`] (`GET`, and `PATCH` of one object; another
//! method is answered 405, an unknown path 404):
//! - lists and watches, cluster-wide (`/api/v1/pods`) or of one namespace
//!   (`/api/v1/namespaces/<ns>/pods`), with a `fieldSelector` `a.b=v` (a
//!   dotted path into the object) and a `labelSelector` `k=v`. A list carries
//!   its kind's current resourceVersion; a watch first replays the changes
//!   after the requested `resourceVersion` (so a change between a list and its
//!   watch is not lost), then streams the new ones; a selected watch reports
//!   an object that stops matching as `DELETED`;
//! - GETs of one object (404 `NotFound` when absent);
//! - JSON merge patches (`application/merge-patch+json`, RFC 7386: `null`
//!   removes a key) of one object or of its `status` subresource (which, as
//!   for pods, changes its metadata and status, never its spec): applied to
//!   the stored object, which gets a new resourceVersion, the watches told
//!   (`MODIFIED`); 404 when absent, 415 for another patch type, 409 when the
//!   patch's `metadata.uid` is not the object's (the API server refuses to
//!   change a uid: the patch was meant for an object deleted and re-created
//!   under that name).
//!
//! It also answers TokenReviews (`POST
//! /apis/authentication.k8s.io/v1/tokenreviews`) for the tokens a test
//! registered ([`FakeApiServer::add_token`]), as the API server does: an
//! unknown token, or one none of whose audiences was asked for, is not
//! authenticated. [`FakeApiServer::serve_http`] serves the same fake over
//! HTTP on a listener the test made, for a process of its own (a kubeconfig
//! pointing at `http://<addr>`).
//!
//! Every request is recorded ([`FakeApiServer::requests`]; a request's
//! body with it: [`FakeApiServer::patches`]). To make the
//! watchers' hard cases, a test can also change objects without the watches
//! seeing it ([`FakeApiServer::replace_unseen`],
//! [`FakeApiServer::delete_unseen`]), end a kind's watches with 410 Gone
//! ([`FakeApiServer::expire`]) or close them ([`FakeApiServer::end_watches`]),
//! make requests fail, hang, wait or be refused ([`ApiMode`], for every kind,
//! one kind, or the `PATCH` requests: [`FakeApiServer::set_patch_mode`]), or
//! take a kind's watches over and write their events itself
//! ([`FakeApiServer::script_watches`], [`WatchStream`]).
//!
//! Each kind counts its own resourceVersions. A real API server has one
//! counter for all kinds; a watcher only compares the versions of one kind,
//! so the difference does not show, and it lets a test pin a kind's list
//! version ([`FakeApiServer::replace_unseen`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ::kube::Client;
use bytes::Bytes;
use futures::channel::mpsc as fmpsc;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use serde_json::{json, Value};
use tower_test::mock::SendResponse;

use super::fixtures;

type Chunks = fmpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>;
type Body = StreamBody<Chunks>;
type Sender = fmpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>;

/// How long [`FakeApiServer::next_watch`] waits: long enough to tell "soon"
/// from "never".
const PATIENCE: Duration = Duration::from_secs(10);

/// The resource kinds the fake serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `v1` Pods (namespaced).
    Pod,
    /// `v1` Namespaces (cluster-scoped).
    Namespace,
    /// `v1` Services (namespaced).
    Service,
    /// `discovery.k8s.io/v1` EndpointSlices (namespaced).
    EndpointSlice,
    /// `v1` Nodes (cluster-scoped).
    Node,
    /// `security.istio.io` AuthorizationPolicies (namespaced; served in `v1`
    /// and `v1beta1` unless [`FakeApiServer::serve_security_versions`] says).
    AuthorizationPolicy,
    /// `security.istio.io` PeerAuthentications (namespaced; as above).
    PeerAuthentication,
}

/// The versions of `security.istio.io` a real API server may serve.
const SECURITY_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 7] = [
        Kind::Pod,
        Kind::Namespace,
        Kind::Service,
        Kind::EndpointSlice,
        Kind::Node,
        Kind::AuthorizationPolicy,
        Kind::PeerAuthentication,
    ];

    /// The objects' `apiVersion`.
    pub fn api_version(self) -> &'static str {
        match self {
            Kind::EndpointSlice => "discovery.k8s.io/v1",
            Kind::AuthorizationPolicy | Kind::PeerAuthentication => "security.istio.io/v1",
            _ => "v1",
        }
    }

    fn security(self) -> bool {
        matches!(self, Kind::AuthorizationPolicy | Kind::PeerAuthentication)
    }

    /// The objects' `kind`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::Namespace => "Namespace",
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::PeerAuthentication => "PeerAuthentication",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::Namespace => "namespaces",
            Kind::Service => "services",
            Kind::EndpointSlice => "endpointslices",
            Kind::Node => "nodes",
            Kind::AuthorizationPolicy => "authorizationpolicies",
            Kind::PeerAuthentication => "peerauthentications",
        }
    }

    /// The API paths the kind is found under (`security.istio.io` in each
    /// of its versions).
    fn api_paths(self) -> &'static [&'static str] {
        match self {
            Kind::EndpointSlice => &["/apis/discovery.k8s.io/v1"],
            Kind::AuthorizationPolicy | Kind::PeerAuthentication => &[
                "/apis/security.istio.io/v1",
                "/apis/security.istio.io/v1beta1",
            ],
            _ => &["/api/v1"],
        }
    }

    fn namespaced(self) -> bool {
        !matches!(self, Kind::Namespace | Kind::Node)
    }
}

/// How the fake answers new requests (open watches are not affected).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiMode {
    /// From the store.
    Serve,
    /// With a connection error, as an unreachable API server.
    Unreachable,
    /// Never, as an API server that stopped answering. The requests left
    /// hanging are dropped (the client sees the connection close) when the
    /// mode changes.
    Hang,
    /// Later: the requests wait, and are answered as the next mode says once
    /// it changes (with [`ApiMode::Serve`], from the store as it is then).
    Hold,
    /// With this HTTP status and a `Status` object, as an API server that
    /// refuses (403: the caller's RBAC role lacks the verb; 500, 503, ...).
    Refuse(u16),
}

/// One request the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiRequest {
    /// `GET`, ...
    pub method: String,
    /// The URL's path.
    pub path: String,
    /// The URL's query, decoded.
    pub query: BTreeMap<String, String>,
    /// The kind listed or watched, for a list or a watch.
    pub collection: Option<Kind>,
    /// A watch (`watch=true`).
    pub watch: bool,
    /// The `Content-Type` header, when there is one.
    pub content_type: Option<String>,
    /// The body of a request that has one (`POST`, `PATCH`), as text.
    pub body: Option<String>,
}

/// What a request's path names.
enum Target {
    /// The objects of a kind, of one namespace or all.
    Collection(Kind, Option<String>),
    /// One object (namespace `""` for a cluster-scoped kind).
    Object(Kind, String, String),
    /// One object's `status` subresource.
    Status(Kind, String, String),
    Unknown,
}

impl Target {
    fn of(path: &str) -> Target {
        for (kind, prefix) in Kind::ALL
            .into_iter()
            .flat_map(|k| k.api_paths().iter().map(move |p| (k, *p)))
        {
            let Some(rest) = path.strip_prefix(prefix) else {
                continue;
            };
            let segments: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
            let plural = kind.plural();
            match (segments.as_slice(), kind.namespaced()) {
                ([p], _) if *p == plural => return Target::Collection(kind, None),
                ([p, name], false) if *p == plural => {
                    return Target::Object(kind, String::new(), (*name).to_owned())
                }
                (["namespaces", ns, p], true) if *p == plural => {
                    return Target::Collection(kind, Some((*ns).to_owned()))
                }
                (["namespaces", ns, p, name], true) if *p == plural => {
                    return Target::Object(kind, (*ns).to_owned(), (*name).to_owned())
                }
                ([p, name, "status"], false) if *p == plural => {
                    return Target::Status(kind, String::new(), (*name).to_owned())
                }
                (["namespaces", ns, p, name, "status"], true) if *p == plural => {
                    return Target::Status(kind, (*ns).to_owned(), (*name).to_owned())
                }
                _ => {}
            }
        }
        Target::Unknown
    }

    fn kind(&self) -> Option<Kind> {
        match self {
            Target::Collection(kind, _)
            | Target::Object(kind, _, _)
            | Target::Status(kind, _, _) => Some(*kind),
            Target::Unknown => None,
        }
    }
}

/// One change of the store, for watches.
#[derive(Debug)]
struct Change {
    rv: u64,
    kind: Kind,
    old: Option<Value>,
    new: Option<Value>,
}

/// The selectors of a list or watch.
#[derive(Debug, Clone, Default)]
struct Filter {
    /// A namespaced collection's namespace.
    namespace: Option<String>,
    /// `fieldSelector`: a dotted path into the object and its value.
    field: Option<(String, String)>,
    /// `labelSelector`: a label and its value.
    label: Option<(String, String)>,
}

impl Filter {
    fn new(namespace: Option<String>, query: &BTreeMap<String, String>) -> Filter {
        let pair = |k: &str| {
            query
                .get(k)
                .and_then(|s| s.split_once('='))
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
        };
        Filter {
            namespace,
            field: pair("fieldSelector"),
            label: pair("labelSelector"),
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if obj["metadata"]["namespace"].as_str() != Some(ns.as_str()) {
                return false;
            }
        }
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

/// A request left hanging or held, with the mode it waits under.
struct Waiting {
    mode: ApiMode,
    request: ApiRequest,
    send: SendResponse<Response<Body>>,
}

struct State {
    /// Each kind's last resourceVersion.
    rv: BTreeMap<Kind, u64>,
    objects: BTreeMap<(Kind, String, String), Value>,
    history: Vec<Change>,
    watches: Vec<Watch>,
    /// Watches of a kind from an older resourceVersion than this get 410 Gone.
    expired_before: BTreeMap<Kind, u64>,
    modes: BTreeMap<Kind, ApiMode>,
    /// How `PATCH` requests are answered, whatever their kind's mode.
    patch_mode: Option<ApiMode>,
    waiting: Vec<Waiting>,
    /// Kinds whose watches go to the test ([`FakeApiServer::script_watches`]).
    scripted: BTreeSet<Kind>,
    /// Their watches opened and not yet taken by [`FakeApiServer::next_watch`].
    handed: BTreeMap<Kind, VecDeque<WatchStream>>,
    requests: Vec<ApiRequest>,
    /// TokenReview answers: token -> (user, the token's audiences).
    tokens: BTreeMap<String, (Value, Vec<String>)>,
    /// The `security.istio.io` versions served (others: 404).
    security_versions: BTreeSet<&'static str>,
}

/// The path TokenReviews are posted to.
const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";

type Mock = tower_test::mock::Mock<Request<::kube::client::Body>, Response<Body>>;

/// The fake API server; see the module docs.
#[derive(Clone)]
pub struct FakeApiServer(Arc<Mutex<State>>);

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state();
        f.debug_struct("FakeApiServer")
            .field("rv", &s.rv)
            .field("objects", &s.objects.len())
            .field("watches", &s.watches.len())
            .field("modes", &s.modes)
            .finish_non_exhaustive()
    }
}

impl FakeApiServer {
    /// A client whose every request goes to the returned fake, which runs on
    /// `runtime` (the client is built there too; something must drive it).
    pub fn start(runtime: &tokio::runtime::Handle) -> (Client, FakeApiServer) {
        let _enter = runtime.enter();
        let (service, api) = Self::spawn(runtime);
        (Client::new(service, "default"), api)
    }

    /// The fake served over HTTP/1.1 on `listener` (made by the test, in
    /// the network namespace it chose), on `runtime`: for a process of its
    /// own, whose kubeconfig points at `http://<listener's address>`. Every
    /// connection is served until the runtime stops.
    pub fn serve_http(
        runtime: &tokio::runtime::Handle,
        listener: std::net::TcpListener,
    ) -> std::io::Result<FakeApiServer> {
        listener.set_nonblocking(true)?;
        let _enter = runtime.enter();
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let (service, api) = Self::spawn(runtime);
        runtime.spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // EMFILE and the like: let the test's deadline tell.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let service = service.clone();
                tokio::spawn(async move {
                    let serve =
                        hyper::service::service_fn(move |req| forward(service.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), serve)
                        .await;
                });
            }
        });
        Ok(api)
    }

    /// The mock service kube's client (or [`Self::serve_http`]) sends to,
    /// and the fake answering it on `runtime`.
    fn spawn(runtime: &tokio::runtime::Handle) -> (Mock, FakeApiServer) {
        let (service, mut handle) =
            tower_test::mock::pair::<Request<::kube::client::Body>, Response<Body>>();
        let api = FakeApiServer(Arc::new(Mutex::new(State {
            rv: Kind::ALL.into_iter().map(|k| (k, 1)).collect(),
            objects: BTreeMap::new(),
            history: Vec::new(),
            watches: Vec::new(),
            expired_before: BTreeMap::new(),
            modes: Kind::ALL.into_iter().map(|k| (k, ApiMode::Serve)).collect(),
            patch_mode: None,
            waiting: Vec::new(),
            scripted: BTreeSet::new(),
            handed: BTreeMap::new(),
            requests: Vec::new(),
            tokens: BTreeMap::new(),
            security_versions: SECURITY_VERSIONS.into_iter().collect(),
        })));
        let server = api.clone();
        runtime.spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let uri = req.uri();
                let query = parse_query(uri.query().unwrap_or(""));
                let mut request = ApiRequest {
                    method: req.method().to_string(),
                    path: uri.path().to_owned(),
                    collection: match Target::of(uri.path()) {
                        Target::Collection(kind, _) => Some(kind),
                        _ => None,
                    },
                    watch: query.get("watch").map(String::as_str) == Some("true"),
                    query,
                    content_type: req
                        .headers()
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                    body: None,
                };
                if request.method == "GET" {
                    let mut s = server.state();
                    s.requests.push(request.clone());
                    s.handle(request, send);
                    continue;
                }
                // A request with a body: read it first, then record and answer it.
                let server = server.clone();
                tokio::spawn(async move {
                    use http_body_util::BodyExt;
                    let Ok(bytes) = req.into_body().collect().await.map(|b| b.to_bytes()) else {
                        send.send_response(status(StatusCode::BAD_REQUEST, "BadRequest"));
                        return;
                    };
                    request.body = Some(String::from_utf8_lossy(&bytes).into_owned());
                    let review = request.method == "POST" && request.path == TOKEN_REVIEWS;
                    let mut s = server.state();
                    s.requests.push(request.clone());
                    if review {
                        let answer = s.token_review(&bytes);
                        send.send_response(answer);
                    } else {
                        s.handle(request, send);
                    }
                });
            }
        });
        (service, api)
    }

    /// TokenReviews of `token` authenticate `user` (a TokenReview's
    /// `status.user`: [`fixtures::service_account_user`]) when they ask for
    /// one of `audiences` (or for none); the answer's `status.audiences`
    /// are the ones asked for that the token has. Replaces an earlier
    /// registration of the token.
    pub fn add_token(&self, token: &str, user: Value, audiences: &[&str]) {
        self.state().tokens.insert(
            token.to_owned(),
            (user, audiences.iter().map(|a| (*a).to_owned()).collect()),
        );
    }

    /// `token` is no longer valid (its reviews say unauthenticated).
    pub fn revoke_token(&self, token: &str) {
        self.state().tokens.remove(token);
    }

    /// How many TokenReviews were posted so far.
    pub fn token_reviews(&self) -> usize {
        self.state()
            .requests
            .iter()
            .filter(|r| r.method == "POST" && r.path == TOKEN_REVIEWS)
            .count()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves `security.istio.io` in `versions` only (of `v1`, `v1beta1`):
    /// requests for another version are answered 404, as by an API server
    /// whose CRDs lack it (none: the CRDs are not installed).
    pub fn serve_security_versions(&self, versions: &[&str]) {
        self.state().security_versions = SECURITY_VERSIONS
            .into_iter()
            .filter(|v| versions.contains(v))
            .collect();
    }

    /// How new requests of every kind are answered.
    pub fn set_mode(&self, mode: ApiMode) {
        let mut s = self.state();
        for kind in Kind::ALL {
            s.modes.insert(kind, mode);
        }
        s.release();
    }

    /// How new requests of `kind` (its lists, watches and objects) are answered.
    pub fn set_mode_of(&self, kind: Kind, mode: ApiMode) {
        let mut s = self.state();
        s.modes.insert(kind, mode);
        s.release();
    }

    /// How new `PATCH` requests (of any kind) are answered, whatever their
    /// kind's mode says (which the GETs, lists and watches keep following);
    /// [`ApiMode::Serve`] applies them.
    pub fn set_patch_mode(&self, mode: ApiMode) {
        let mut s = self.state();
        s.patch_mode = Some(mode);
        s.release();
    }

    /// The `PATCH` requests so far, in order (path, content type, body).
    pub fn patches(&self) -> Vec<ApiRequest> {
        self.state()
            .requests
            .iter()
            .filter(|r| r.method == "PATCH")
            .cloned()
            .collect()
    }

    /// The stored object `namespace/name` of `kind` (namespace `""` for a
    /// cluster-scoped kind), as a GET would return it.
    pub fn get(&self, kind: Kind, namespace: &str, name: &str) -> Option<Value> {
        self.state()
            .objects
            .get(&(kind, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.state().requests.clone()
    }

    /// The lists and watches of `kind` so far.
    pub fn requests_of(&self, kind: Kind) -> Vec<ApiRequest> {
        self.state()
            .requests
            .iter()
            .filter(|r| r.collection == Some(kind))
            .cloned()
            .collect()
    }

    /// The paths of the GETs of one object so far (such as
    /// `/api/v1/namespaces/<ns>` and `/api/v1/namespaces/<ns>/pods/<name>`).
    pub fn gets(&self) -> Vec<String> {
        self.state()
            .requests
            .iter()
            .filter(|r| r.method == "GET" && r.collection.is_none())
            .map(|r| r.path.clone())
            .collect()
    }

    /// Creates or replaces an object (its kind's `apiVersion` and `kind` are
    /// filled in), telling the watches.
    pub fn apply(&self, kind: Kind, obj: Value) {
        let obj = typed(kind, obj);
        let key = key(kind, &obj);
        let mut s = self.state();
        let old = s.objects.get(&key).cloned();
        if let Some(obj) = s.commit(kind, old, Some(obj)) {
            s.objects.insert(key, obj);
        }
    }

    /// Deletes an object (if present), telling the watches.
    pub fn delete(&self, kind: Kind, namespace: &str, name: &str) {
        let mut s = self.state();
        if let Some(old) = s
            .objects
            .remove(&(kind, namespace.to_owned(), name.to_owned()))
        {
            s.commit(kind, Some(old), None);
        }
    }

    /// Creates or replaces a pod (an object like [`FakePod::json`]'s).
    ///
    /// [`FakePod::json`]: super::FakePod::json
    pub fn apply_pod(&self, pod: Value) {
        self.apply(Kind::Pod, pod);
    }

    /// Deletes pod `namespace/name` (if present).
    pub fn delete_pod(&self, namespace: &str, name: &str) {
        self.delete(Kind::Pod, namespace, name);
    }

    /// Creates or replaces namespace `name` ([`fixtures::namespace`]).
    pub fn apply_namespace(&self, name: &str, mode: Option<&str>) {
        self.apply(Kind::Namespace, fixtures::namespace(name, mode));
    }

    /// Creates or replaces namespace `name` with these labels
    /// ([`fixtures::namespace_with_labels`]).
    pub fn apply_namespace_labels(&self, name: &str, labels: &[(&str, &str)]) {
        self.apply(
            Kind::Namespace,
            fixtures::namespace_with_labels(name, labels),
        );
    }

    /// Deletes an object without telling anyone (an event the watches
    /// missed); the kind's resourceVersion moves on.
    pub fn delete_unseen(&self, kind: Kind, namespace: &str, name: &str) {
        let mut s = self.state();
        s.objects
            .remove(&(kind, namespace.to_owned(), name.to_owned()));
        s.next_rv(kind);
    }

    /// Replaces every object of `kind` with `objects` (as given, but for
    /// their `apiVersion` and `kind`) without telling anyone, and sets the
    /// kind's resourceVersion, which its next lists carry, to
    /// `resource_version`.
    pub fn replace_unseen(&self, kind: Kind, resource_version: u64, objects: Vec<Value>) {
        let mut s = self.state();
        s.objects.retain(|(k, _, _), _| *k != kind);
        for obj in objects {
            let obj = typed(kind, obj);
            s.objects.insert(key(kind, &obj), obj);
        }
        s.rv.insert(kind, resource_version);
    }

    /// Ends the open watches of `kind` with 410 Gone and refuses to resume
    /// from before now: the watcher must list again.
    pub fn expire(&self, kind: Kind) {
        let mut s = self.state();
        let rv = s.rv[&kind];
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

    /// Closes the open watches of `kind` (the watcher resumes where it was).
    pub fn end_watches(&self, kind: Kind) {
        self.state().watches.retain(|w| w.kind != kind);
    }

    /// The watches of `kind` opened from now on are the test's: each is
    /// handed out by [`FakeApiServer::next_watch`], without the store's
    /// events; the test writes them, and ends the watch by dropping it.
    pub fn script_watches(&self, kind: Kind) {
        self.state().scripted.insert(kind);
    }

    /// The next watch of `kind` the watcher opened (see
    /// [`FakeApiServer::script_watches`]). Panics after 10 s without one.
    pub async fn next_watch(&self, kind: Kind) -> WatchStream {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let next = self
                .state()
                .handed
                .get_mut(&kind)
                .and_then(VecDeque::pop_front);
            if let Some(w) = next {
                return w;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {kind:?} watch request"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// One HTTP request of [`FakeApiServer::serve_http`], through the mock.
async fn forward(
    mut service: Mock,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Box<dyn std::error::Error + Send + Sync>> {
    use http_body_util::BodyExt;
    use tower_service::Service;
    let (parts, body) = req.into_parts();
    let bytes = body.collect().await?.to_bytes();
    let req = Request::from_parts(parts, ::kube::client::Body::from(bytes));
    futures::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(req).await
}

impl State {
    /// The answer to a TokenReview whose body is `body`.
    fn token_review(&self, raw: &[u8]) -> Response<Body> {
        let Ok(review) = serde_json::from_slice::<Value>(raw) else {
            return status(StatusCode::BAD_REQUEST, "BadRequest");
        };
        let token = review["spec"]["token"].as_str().unwrap_or("");
        let asked: Vec<String> = review["spec"]["audiences"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let result = match self.tokens.get(token) {
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
            Some((user, has)) => {
                let granted: Vec<&String> = if asked.is_empty() {
                    has.iter().collect()
                } else {
                    asked.iter().filter(|a| has.contains(a)).collect()
                };
                if granted.is_empty() {
                    json!({"authenticated": false, "error": format!(
                        "token audiences {has:?} is invalid for the target audiences {asked:?}")})
                } else {
                    json!({"authenticated": true, "user": user, "audiences": granted})
                }
            }
        };
        body(
            StatusCode::CREATED,
            &json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "metadata": {},
                "spec": review["spec"].clone(),
                "status": result,
            }),
        )
    }

    fn next_rv(&mut self, kind: Kind) -> u64 {
        let rv = self.rv.entry(kind).or_insert(1);
        *rv += 1;
        *rv
    }

    /// The mode `request` is answered under: the patch mode for a `PATCH`
    /// when one is set, else its kind's.
    fn mode_of(&self, request: &ApiRequest) -> ApiMode {
        match self.patch_mode {
            Some(mode) if request.method == "PATCH" => mode,
            _ => Target::of(&request.path)
                .kind()
                .map_or(ApiMode::Serve, |k| self.modes[&k]),
        }
    }

    /// Answers `request` as its mode says.
    fn handle(&mut self, request: ApiRequest, send: SendResponse<Response<Body>>) {
        let target = Target::of(&request.path);
        let mode = self.mode_of(&request);
        match mode {
            ApiMode::Serve => self.serve(&request, target, send),
            ApiMode::Unreachable => send.send_error(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                "connection refused (fake API server set unreachable)",
            )),
            ApiMode::Hang | ApiMode::Hold => self.waiting.push(Waiting {
                mode,
                request,
                send,
            }),
            ApiMode::Refuse(code) => {
                let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                send.send_response(status(code, code.canonical_reason().unwrap_or("Error")));
            }
        }
    }

    /// After a mode change: drops the requests left hanging and answers the
    /// held ones, where their kind's mode is not the one they wait under.
    fn release(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for w in waiting {
            let now = self.mode_of(&w.request);
            if now == w.mode {
                self.waiting.push(w);
            } else if w.mode == ApiMode::Hold {
                self.handle(w.request, w.send);
            }
        }
    }

    fn serve(&mut self, request: &ApiRequest, target: Target, send: SendResponse<Response<Body>>) {
        if target.kind().is_some_and(Kind::security) {
            let version = request
                .path
                .strip_prefix("/apis/security.istio.io/")
                .and_then(|r| r.split('/').next())
                .unwrap_or("");
            if !self.security_versions.contains(version) {
                send.send_response(status(StatusCode::NOT_FOUND, "NotFound"));
                return;
            }
        }
        if request.method == "PATCH" {
            let answer = match target {
                Target::Object(kind, ns, name) => self.patch(kind, (ns, name), false, request),
                Target::Status(kind, ns, name) => self.patch(kind, (ns, name), true, request),
                Target::Collection(..) => {
                    status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed")
                }
                Target::Unknown => status(StatusCode::NOT_FOUND, "NotFound"),
            };
            send.send_response(answer);
            return;
        }
        if request.method != "GET" {
            send.send_response(status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"));
            return;
        }
        match target {
            Target::Collection(kind, namespace) => {
                let filter = Filter::new(namespace, &request.query);
                if request.watch {
                    self.watch(kind, filter, request, send);
                } else {
                    let items: Vec<&Value> = self
                        .objects
                        .iter()
                        .filter(|((k, _, _), o)| *k == kind && filter.matches(o))
                        .map(|(_, o)| o)
                        .collect();
                    send.send_response(body(
                        StatusCode::OK,
                        &json!({
                            "apiVersion": kind.api_version(),
                            "kind": format!("{}List", kind.name()),
                            "metadata": {"resourceVersion": self.rv[&kind].to_string()},
                            "items": items
                        }),
                    ));
                }
            }
            Target::Object(kind, namespace, name) => {
                send.send_response(match self.objects.get(&(kind, namespace, name)) {
                    Some(obj) => body(StatusCode::OK, obj),
                    None => status(StatusCode::NOT_FOUND, "NotFound"),
                });
            }
            Target::Status(..) | Target::Unknown => {
                send.send_response(status(StatusCode::NOT_FOUND, "NotFound"))
            }
        }
    }

    /// A JSON merge patch of one object (`status_only`: of its `status`
    /// subresource, which leaves the spec alone); see the module docs.
    fn patch(
        &mut self,
        kind: Kind,
        (namespace, name): (String, String),
        status_only: bool,
        request: &ApiRequest,
    ) -> Response<Body> {
        let key = (kind, namespace, name);
        let Some(old) = self.objects.get(&key).cloned() else {
            return status(StatusCode::NOT_FOUND, "NotFound");
        };
        if request.content_type.as_deref() != Some("application/merge-patch+json") {
            return status(StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaType");
        }
        let Ok(mut patch) = serde_json::from_str::<Value>(request.body.as_deref().unwrap_or(""))
        else {
            return status(StatusCode::BAD_REQUEST, "BadRequest");
        };
        if let Some(uid) = patch["metadata"].get("uid").and_then(Value::as_str) {
            if old["metadata"]["uid"].as_str() != Some(uid) {
                return status(StatusCode::CONFLICT, "Conflict");
            }
        }
        if status_only {
            if let Some(p) = patch.as_object_mut() {
                p.remove("spec");
            }
        }
        let mut new = old.clone();
        merge_patch(&mut new, &patch);
        match self.commit(kind, Some(old), Some(new)) {
            Some(stored) => {
                self.objects.insert(key, stored.clone());
                body(StatusCode::OK, &stored)
            }
            None => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
        }
    }

    fn watch(
        &mut self,
        kind: Kind,
        filter: Filter,
        request: &ApiRequest,
        send: SendResponse<Response<Body>>,
    ) {
        let since: u64 = request
            .query
            .get("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let (tx, rx) = fmpsc::unbounded();
        send.send_response(Response::new(StreamBody::new(rx)));
        if self.scripted.contains(&kind) {
            let stream = WatchStream {
                query: request.query.clone(),
                tx,
            };
            self.handed.entry(kind).or_default().push_back(stream);
            return;
        }
        if self
            .expired_before
            .get(&kind)
            .is_some_and(|&min| since < min)
        {
            send_line(&tx, &gone());
            return;
        }
        for c in self
            .history
            .iter()
            .filter(|c| c.kind == kind && c.rv > since)
        {
            send_event(&tx, &filter, c);
        }
        self.watches.push(Watch { kind, filter, tx });
    }

    /// Records a change (`new` gets the kind's next resourceVersion) and
    /// tells the open watches. Returns the stored `new`.
    fn commit(&mut self, kind: Kind, old: Option<Value>, new: Option<Value>) -> Option<Value> {
        let rv = self.next_rv(kind);
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
                send_event(&w.tx, &w.filter, &change);
            }
            !w.tx.is_closed()
        });
        self.history.push(change);
        new
    }
}

/// An open watch of a kind the test scripts ([`FakeApiServer::script_watches`]):
/// the test writes its events. Dropping it ends the watch.
pub struct WatchStream {
    /// The watch request's query, decoded.
    pub query: BTreeMap<String, String>,
    tx: Sender,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("query", &self.query)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    /// Sends an event (`ADDED`, `MODIFIED`, `DELETED`, ...) about `object`.
    /// Panics if the watcher closed the watch.
    pub fn send(&self, event: &str, object: Value) {
        let mut line = serde_json::to_vec(&json!({"type": event, "object": object}))
            .expect("a JSON value serializes");
        line.push(b'\n');
        self.tx
            .unbounded_send(Ok(Frame::data(Bytes::from(line))))
            .expect("the watcher closed the watch");
    }

    /// Sends a `BOOKMARK` at `resource_version`.
    pub fn bookmark(&self, kind: Kind, resource_version: &str) {
        self.send(
            "BOOKMARK",
            json!({"apiVersion": kind.api_version(), "kind": kind.name(),
                "metadata": {"resourceVersion": resource_version}}),
        );
    }

    /// Ends the watch as expired (410 Gone): the watcher must list again.
    pub fn gone(&self) {
        self.send("ERROR", expired());
    }
}

/// RFC 7386: `patch` merged into `target` (an object patch merges key by
/// key, `null` removing one; anything else replaces).
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in fields {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// `obj` with `kind`'s `apiVersion` and `kind`.
fn typed(kind: Kind, mut obj: Value) -> Value {
    obj["apiVersion"] = json!(kind.api_version());
    obj["kind"] = json!(kind.name());
    obj
}

fn key(kind: Kind, obj: &Value) -> (Kind, String, String) {
    let meta = &obj["metadata"];
    (
        kind,
        meta["namespace"].as_str().unwrap_or("").to_owned(),
        meta["name"].as_str().unwrap_or("").to_owned(),
    )
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
    send_line(tx, &json!({"type": kind, "object": obj}));
}

/// The watch event of an expired resourceVersion.
fn gone() -> Value {
    json!({"type": "ERROR", "object": expired()})
}

/// The status of an expired resourceVersion (410 Gone).
fn expired() -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "too old resource version", "reason": "Expired", "code": 410})
}

fn send_line(tx: &Sender, v: &Value) {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
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
