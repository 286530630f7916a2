//! The watch against a fake API server: kube's `Client` over a `tower_test` mock
//! service, answering the watcher's list requests with JSON and its watch requests with a
//! streaming body the test writes events into. A recording fake [`Enrollment`] stands for
//! the node agent.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::channel::mpsc as fmpsc;
use http::{Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::*;

type Body = StreamBody<fmpsc::UnboundedReceiver<Result<Frame<Bytes>, Infallible>>>;

const NODE: &str = "node-a";
const LABEL: &str = "ringway.io/dataplane-mode";

// ---------------------------------------------------------------- the fake agent

#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Enroll(String),
    Unenroll(String),
}

#[derive(Default)]
struct AgentState {
    enrolled: BTreeMap<String, PodIdentity>,
    calls: Vec<(Call, Instant)>,
    fail_enrolls: usize,
    fail_unenrolls: usize,
}

/// Records every call; `enrolled()` is what was enrolled and not unenrolled.
#[derive(Default)]
struct FakeAgent(Mutex<AgentState>);

impl FakeAgent {
    /// Holding `(uid, namespace)` pods with the identity [`PodB`] gives them
    /// (name `pod-<uid>`, service account `sa-x`).
    fn with_enrolled(pods: &[(&str, &str)]) -> Arc<FakeAgent> {
        let agent = FakeAgent::default();
        for (uid, namespace) in pods {
            agent.hold(uid, namespace, "sa-x");
        }
        Arc::new(agent)
    }

    /// Holds a pod as if enrolled earlier (by CNI ADD: `service_account` empty).
    fn hold(&self, uid: &str, namespace: &str, service_account: &str) {
        let id = PodIdentity {
            uid: uid.into(),
            name: format!("pod-{uid}"),
            namespace: namespace.into(),
            service_account: service_account.into(),
            ips: vec![],
        };
        self.0.lock().unwrap().enrolled.insert(uid.into(), id);
    }

    fn calls(&self) -> Vec<Call> {
        self.0
            .lock()
            .unwrap()
            .calls
            .iter()
            .map(|(c, _)| c.clone())
            .collect()
    }

    fn call_times(&self) -> Vec<Instant> {
        self.0
            .lock()
            .unwrap()
            .calls
            .iter()
            .map(|(_, t)| *t)
            .collect()
    }

    fn enrolled_set(&self) -> BTreeSet<String> {
        self.0.lock().unwrap().enrolled.keys().cloned().collect()
    }

    fn identity(&self, uid: &str) -> PodIdentity {
        self.0.lock().unwrap().enrolled[uid].clone()
    }

    /// Waits until `n` calls were made, and returns them all.
    async fn wait_calls(&self, n: usize) -> Vec<Call> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let calls = self.calls();
            if calls.len() >= n {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {n} calls, have {calls:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Enrollment for FakeAgent {
    fn enroll(&self, pod: &PodIdentity) -> Result<(), String> {
        let mut s = self.0.lock().unwrap();
        s.calls
            .push((Call::Enroll(pod.uid.clone()), Instant::now()));
        if s.fail_enrolls > 0 {
            s.fail_enrolls -= 1;
            return Err("netns not found".into());
        }
        s.enrolled.insert(pod.uid.clone(), pod.clone());
        Ok(())
    }

    fn unenroll(&self, uid: &str) -> Result<(), String> {
        let mut s = self.0.lock().unwrap();
        s.calls.push((Call::Unenroll(uid.into()), Instant::now()));
        if s.fail_unenrolls > 0 {
            s.fail_unenrolls -= 1;
            return Err("proxy did not ack".into());
        }
        s.enrolled.remove(uid);
        Ok(())
    }

    fn enrolled(&self) -> Vec<EnrolledPod> {
        self.0
            .lock()
            .unwrap()
            .enrolled
            .values()
            .map(EnrolledPod::from)
            .collect()
    }

    fn excludes(&self, namespace: &str) -> bool {
        namespace == "ringway-system"
    }
}

fn enroll(uid: &str) -> Call {
    Call::Enroll(uid.into())
}

fn unenroll(uid: &str) -> Call {
    Call::Unenroll(uid.into())
}

fn sorted(mut calls: Vec<Call>) -> Vec<Call> {
    calls.sort_by_key(|c| format!("{c:?}"));
    calls
}

// ---------------------------------------------------------------- the fake API server

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Pods,
    Namespaces,
}

/// One request the watcher made.
#[derive(Debug, Clone)]
struct Seen {
    kind: Kind,
    watch: bool,
    query: BTreeMap<String, String>,
}

/// An open watch: the test writes events into its response body.
struct WatchStream {
    query: BTreeMap<String, String>,
    tx: fmpsc::UnboundedSender<Result<Frame<Bytes>, Infallible>>,
}

impl WatchStream {
    fn send(&self, kind: &str, object: Value) {
        let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap();
        line.push(b'\n');
        self.tx
            .unbounded_send(Ok(Frame::data(Bytes::from(line))))
            .unwrap();
    }

    fn bookmark(&self, kind: &str, rv: &str) {
        self.send(
            "BOOKMARK",
            json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": rv}}),
        );
    }

    fn gone(&self) {
        self.send(
            "ERROR",
            json!({
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": "too old resource version: 100 (200)", "reason": "Expired", "code": 410
            }),
        );
    }
}

struct FakeApi {
    seen: Arc<Mutex<Vec<Seen>>>,
    lists: Arc<Mutex<BTreeMap<Kind, Value>>>,
    /// Lists are answered only while the gate of their kind is open.
    gates: BTreeMap<Kind, watch::Sender<bool>>,
    watches: BTreeMap<Kind, mpsc::UnboundedReceiver<WatchStream>>,
}

impl FakeApi {
    /// A client whose every request goes to the returned fake.
    fn start(pods: Vec<Value>, namespaces: Vec<Value>) -> (Client, FakeApi) {
        let (service, mut handle) =
            tower_test::mock::pair::<Request<::kube::client::Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let lists = Arc::new(Mutex::new(BTreeMap::new()));
        let mut gates = BTreeMap::new();
        let mut gate_rx = BTreeMap::new();
        let mut watch_tx = BTreeMap::new();
        let mut watches = BTreeMap::new();
        for kind in [Kind::Pods, Kind::Namespaces] {
            let (tx, rx) = watch::channel(true);
            gates.insert(kind, tx);
            gate_rx.insert(kind, rx);
            let (tx, rx) = mpsc::unbounded_channel();
            watch_tx.insert(kind, tx);
            watches.insert(kind, rx);
        }
        let api = FakeApi {
            seen: seen.clone(),
            lists: lists.clone(),
            gates,
            watches,
        };
        api.set_list(Kind::Pods, "100", pods);
        api.set_list(Kind::Namespaces, "50", namespaces);

        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                assert_eq!(req.method(), http::Method::GET, "{}", req.uri());
                let kind = match req.uri().path() {
                    "/api/v1/pods" => Kind::Pods,
                    "/api/v1/namespaces" => Kind::Namespaces,
                    other => panic!("unexpected request path {other}"),
                };
                let query = parse_query(req.uri().query().unwrap_or(""));
                let is_watch = query.get("watch").map(String::as_str) == Some("true");
                seen.lock().unwrap().push(Seen {
                    kind,
                    watch: is_watch,
                    query: query.clone(),
                });
                if is_watch {
                    let (tx, rx) = fmpsc::unbounded();
                    send.send_response(Response::new(StreamBody::new(rx)));
                    let _ = watch_tx[&kind].send(WatchStream { query, tx });
                } else {
                    let mut gate = gate_rx[&kind].clone();
                    let body = serde_json::to_vec(&lists.lock().unwrap()[&kind]).unwrap();
                    tokio::spawn(async move {
                        let _ = gate.wait_for(|open| *open).await;
                        let (tx, rx) = fmpsc::unbounded();
                        tx.unbounded_send(Ok(Frame::data(Bytes::from(body))))
                            .unwrap();
                        drop(tx);
                        let mut resp = Response::new(StreamBody::new(rx));
                        *resp.status_mut() = StatusCode::OK;
                        send.send_response(resp);
                    });
                }
            }
        });
        (client, api)
    }

    /// What the next list of `kind` returns.
    fn set_list(&self, kind: Kind, rv: &str, items: Vec<Value>) {
        let list_kind = match kind {
            Kind::Pods => "PodList",
            Kind::Namespaces => "NamespaceList",
        };
        self.lists.lock().unwrap().insert(
            kind,
            json!({"apiVersion": "v1", "kind": list_kind, "metadata": {"resourceVersion": rv}, "items": items}),
        );
    }

    fn hold_lists(&self, kind: Kind, hold: bool) {
        self.gates[&kind].send_replace(!hold);
    }

    /// The next watch request of `kind`.
    async fn next_watch(&mut self, kind: Kind) -> WatchStream {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.watches.get_mut(&kind).unwrap().recv(),
        )
        .await
        .unwrap_or_else(|_| panic!("no {kind:?} watch request"))
        .unwrap()
    }

    fn seen(&self, kind: Kind) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.kind == kind)
            .cloned()
            .collect()
    }
}

fn parse_query(q: &str) -> BTreeMap<String, String> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap();
                    out.push(u8::from_str_radix(hex, 16).unwrap());
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

// ---------------------------------------------------------------- objects

/// A pod of this node; `rv` is its resourceVersion.
#[derive(Clone)]
struct PodB {
    v: Value,
}

impl PodB {
    fn new(uid: &str, namespace: &str) -> PodB {
        PodB {
            v: json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": format!("pod-{uid}"), "namespace": namespace, "uid": uid, "resourceVersion": "1", "labels": {"app": "x"}},
                "spec": {"nodeName": NODE, "serviceAccountName": "sa-x", "containers": [{"name": "c", "image": "i"}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}
            }),
        }
    }

    fn label(mut self, value: &str) -> PodB {
        self.v["metadata"]["labels"][LABEL] = json!(value);
        self
    }

    fn unlabel(mut self) -> PodB {
        self.v["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove(LABEL);
        self
    }

    fn ip(mut self, ip: &str) -> PodB {
        self.v["status"]["podIP"] = json!(ip);
        self.v["status"]["podIPs"] = json!([{ "ip": ip }]);
        self
    }

    fn pending(mut self) -> PodB {
        self.v["status"] = json!({"phase": "Pending"});
        self
    }

    fn phase(mut self, phase: &str) -> PodB {
        self.v["status"]["phase"] = json!(phase);
        self
    }

    fn host_network(mut self) -> PodB {
        self.v["spec"]["hostNetwork"] = json!(true);
        self
    }

    fn terminating(mut self) -> PodB {
        self.v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        self
    }

    fn annotate(mut self, k: &str, v: &str) -> PodB {
        self.v["metadata"]["annotations"][k] = json!(v);
        self
    }

    fn rv(mut self, rv: &str) -> PodB {
        self.v["metadata"]["resourceVersion"] = json!(rv);
        self
    }

    fn json(&self) -> Value {
        self.v.clone()
    }
}

fn namespace(name: &str, label: Option<&str>, rv: &str) -> Value {
    let labels = match label {
        Some(l) => json!({ LABEL: l, "kubernetes.io/metadata.name": name }),
        None => json!({ "kubernetes.io/metadata.name": name }),
    };
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": format!("ns-{name}"), "resourceVersion": rv, "labels": labels}})
}

fn fast() -> WatchConfig {
    WatchConfig {
        node: NODE.into(),
        retry_min: Duration::from_millis(40),
        retry_max: Duration::from_millis(200),
        orphan_grace: Duration::from_millis(150),
        watch_backoff_min: Duration::from_millis(10),
        watch_backoff_max: Duration::from_millis(50),
    }
}

/// Starts the watch; the task is aborted when the test ends.
fn spawn(
    client: Client,
    agent: &Arc<FakeAgent>,
    config: WatchConfig,
) -> tokio::task::JoinHandle<()> {
    spawn_with(
        Selector::new(client, tokio::runtime::Handle::current()),
        agent,
        config,
    )
}

/// [`spawn`] on a given selector.
fn spawn_with(
    selector: Selector,
    agent: &Arc<FakeAgent>,
    config: WatchConfig,
) -> tokio::task::JoinHandle<()> {
    let agent: Arc<dyn Enrollment> = agent.clone();
    tokio::spawn(run_watch_with(selector, config, agent))
}

/// Lets the watch handle what was sent, for the assertions that nothing happened.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

// ---------------------------------------------------------------- tests

/// The requests carry the node's field selector and the namespace label selector; list
/// and watch drive the right calls; a bookmark moves the resume point.
#[tokio::test]
async fn list_then_watch_enrolls_and_unenrolls_with_the_right_selectors() {
    let pods = vec![
        PodB::new("a", "plain").label("enabled").json(),
        PodB::new("b", "plain").json(),
        PodB::new("c", "mesh").json(),
        PodB::new("d", "mesh")
            .label("enabled")
            .host_network()
            .json(),
        PodB::new("e", "plain").label("enabled").pending().json(),
    ];
    let (client, mut api) = FakeApi::start(pods, vec![namespace("mesh", Some("enabled"), "7")]);
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());

    assert_eq!(
        sorted(agent.wait_calls(2).await),
        [enroll("a"), enroll("c")]
    );
    let a = agent.identity("a");
    assert_eq!(
        a,
        PodIdentity {
            uid: "a".into(),
            name: "pod-a".into(),
            namespace: "plain".into(),
            service_account: "sa-x".into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
        }
    );

    // The requests.
    let pod_watch = api.next_watch(Kind::Pods).await;
    let ns_watch = api.next_watch(Kind::Namespaces).await;
    let pod_reqs = api.seen(Kind::Pods);
    let ns_reqs = api.seen(Kind::Namespaces);
    let list = &pod_reqs[0];
    assert!(!list.watch);
    assert_eq!(
        list.query.get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(list.query.get("labelSelector"), None);
    assert!(!ns_reqs[0].query.contains_key("fieldSelector"));
    assert_eq!(
        ns_reqs[0].query.get("labelSelector").map(String::as_str),
        Some("ringway.io/dataplane-mode=enabled")
    );
    assert_eq!(pod_watch.query["watch"], "true");
    assert_eq!(pod_watch.query["fieldSelector"], "spec.nodeName=node-a");
    assert_eq!(pod_watch.query["resourceVersion"], "100");
    assert_eq!(pod_watch.query["allowWatchBookmarks"], "true");
    assert_eq!(
        ns_watch.query["labelSelector"],
        "ringway.io/dataplane-mode=enabled"
    );
    assert_eq!(ns_watch.query["resourceVersion"], "50");

    // e starts running with an IP: enrolled. A new hostNetwork pod, and an annotation
    // change on an enrolled pod: nothing. a deleted: unenrolled.
    pod_watch.send(
        "MODIFIED",
        PodB::new("e", "plain")
            .label("enabled")
            .ip("10.0.0.5")
            .rv("101")
            .json(),
    );
    pod_watch.send(
        "ADDED",
        PodB::new("f", "mesh")
            .label("enabled")
            .host_network()
            .rv("102")
            .json(),
    );
    pod_watch.send(
        "MODIFIED",
        PodB::new("a", "plain")
            .label("enabled")
            .annotate("note", "x")
            .rv("103")
            .json(),
    );
    pod_watch.send(
        "DELETED",
        PodB::new("a", "plain").label("enabled").rv("104").json(),
    );
    let calls = agent.wait_calls(4).await;
    assert_eq!(calls[2..], [enroll("e"), unenroll("a")]);
    assert_eq!(
        agent.identity("e").ips,
        vec!["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
    );

    // A bookmark, then the server ends the watch: the watch resumes from the bookmark,
    // without a relist.
    pod_watch.bookmark("Pod", "150");
    drop(pod_watch);
    let resumed = api.next_watch(Kind::Pods).await;
    assert_eq!(resumed.query["resourceVersion"], "150");
    assert_eq!(api.seen(Kind::Pods).iter().filter(|s| !s.watch).count(), 1);
    resumed.send("ADDED", PodB::new("g", "mesh").rv("151").json());
    assert_eq!(agent.wait_calls(5).await[4], enroll("g"));
    drop(ns_watch);
    task.abort();
}

#[tokio::test]
async fn pod_label_opt_in_opt_out_and_removal() {
    let (client, mut api) = FakeApi::start(
        vec![
            PodB::new("m", "mesh").json(),
            PodB::new("p", "plain").json(),
        ],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    assert_eq!(agent.wait_calls(1).await, [enroll("m")]);
    let w = api.next_watch(Kind::Pods).await;

    // Opt-out on a pod of an enabled namespace, then back.
    w.send(
        "MODIFIED",
        PodB::new("m", "mesh").label("disabled").rv("2").json(),
    );
    assert_eq!(agent.wait_calls(2).await[1], unenroll("m"));
    w.send("MODIFIED", PodB::new("m", "mesh").unlabel().rv("3").json());
    assert_eq!(agent.wait_calls(3).await[2], enroll("m"));
    // Opt-in of a pod of a plain namespace, then the label removed.
    w.send(
        "MODIFIED",
        PodB::new("p", "plain").label("enabled").rv("4").json(),
    );
    assert_eq!(agent.wait_calls(4).await[3], enroll("p"));
    w.send(
        "MODIFIED",
        PodB::new("p", "plain")
            .label("something-else")
            .rv("5")
            .json(),
    );
    assert_eq!(agent.wait_calls(5).await[4], unenroll("p"));
    assert_eq!(agent.enrolled_set(), BTreeSet::from(["m".to_string()]));
    task.abort();
}

#[tokio::test]
async fn namespace_label_flip_re_evaluates_its_pods() {
    let (client, mut api) = FakeApi::start(
        vec![
            PodB::new("s1", "shop").json(),
            PodB::new("s2", "shop").json(),
            PodB::new("s3", "shop").label("disabled").json(),
            PodB::new("s4", "shop").host_network().json(),
            PodB::new("o1", "other").json(),
        ],
        vec![],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    let ns_watch = api.next_watch(Kind::Namespaces).await;
    let _pod_watch = api.next_watch(Kind::Pods).await;
    settle().await;
    assert_eq!(agent.calls(), []);

    // Labelled: it enters the label-selected watch.
    ns_watch.send("ADDED", namespace("shop", Some("enabled"), "8"));
    assert_eq!(
        sorted(agent.wait_calls(2).await),
        [enroll("s1"), enroll("s2")]
    );
    // Another change of the namespace that keeps the label: nothing.
    ns_watch.send("MODIFIED", namespace("shop", Some("enabled"), "9"));
    // Label removed: the API server reports it as DELETED from the selected watch.
    ns_watch.send("DELETED", namespace("shop", None, "10"));
    assert_eq!(
        sorted(agent.wait_calls(4).await[2..].to_vec()),
        [unenroll("s1"), unenroll("s2")]
    );
    // A MODIFIED with another value counts as not enabled too.
    ns_watch.send("ADDED", namespace("shop", Some("enabled"), "11"));
    agent.wait_calls(6).await;
    ns_watch.send("MODIFIED", namespace("shop", Some("disabled"), "12"));
    assert_eq!(
        sorted(agent.wait_calls(8).await[6..].to_vec()),
        [unenroll("s1"), unenroll("s2")]
    );
    assert_eq!(agent.enrolled_set(), BTreeSet::new());
    task.abort();
}

/// The watch expires (410 Gone): the watcher lists again; pods deleted meanwhile are
/// unenrolled (after the grace), new ones enrolled.
#[tokio::test]
async fn gone_relists_and_reconciles() {
    let (client, mut api) = FakeApi::start(
        vec![
            PodB::new("a", "x").label("enabled").json(),
            PodB::new("b", "x").label("enabled").json(),
        ],
        vec![],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    assert_eq!(
        sorted(agent.wait_calls(2).await),
        [enroll("a"), enroll("b")]
    );
    let w = api.next_watch(Kind::Pods).await;

    // While the watch was away: b deleted, c created.
    api.set_list(
        Kind::Pods,
        "300",
        vec![
            PodB::new("a", "x").label("enabled").json(),
            PodB::new("c", "x").label("enabled").json(),
        ],
    );
    let before = Instant::now();
    w.gone();
    let calls = agent.wait_calls(4).await;
    assert_eq!(calls[2..], [enroll("c"), unenroll("b")]);
    // b went through the orphan grace.
    assert!(agent.call_times()[3] - before >= fast().orphan_grace);
    let lists: Vec<_> = api
        .seen(Kind::Pods)
        .into_iter()
        .filter(|s| !s.watch)
        .collect();
    assert_eq!(lists.len(), 2);
    assert_eq!(lists[1].query["fieldSelector"], "spec.nodeName=node-a");
    let w2 = api.next_watch(Kind::Pods).await;
    assert_eq!(w2.query["resourceVersion"], "300");
    assert_eq!(
        agent.enrolled_set(),
        BTreeSet::from(["a".to_string(), "c".to_string()])
    );
    task.abort();
}

/// At start the agent already has pods (from CNI ADDs, or its own restart): the listed
/// ones are kept without a call, unwanted ones unenrolled, and an unlisted one that shows
/// up within the grace is kept.
#[tokio::test]
async fn start_reconciles_with_the_agents_enrolled_set() {
    let (client, mut api) = FakeApi::start(
        vec![
            PodB::new("keep", "x").label("enabled").json(),
            PodB::new("optout", "mesh").label("disabled").json(),
            PodB::new("new", "mesh").json(),
        ],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    let agent = FakeAgent::with_enrolled(&[
        ("keep", "x"),
        ("optout", "mesh"),
        ("late", "x"),
        ("stale", "x"),
    ]);
    let mut config = fast();
    config.orphan_grace = Duration::from_secs(1);
    let task = spawn(client, &agent, config);
    assert_eq!(
        sorted(agent.wait_calls(2).await),
        [enroll("new"), unenroll("optout")]
    );
    // "late" was bound to the node after the list was taken: its ADDED comes within the
    // grace. "stale" never comes.
    let w = api.next_watch(Kind::Pods).await;
    w.send(
        "ADDED",
        PodB::new("late", "x").label("enabled").rv("101").json(),
    );
    assert_eq!(agent.wait_calls(3).await[2], unenroll("stale"));
    settle().await;
    assert_eq!(agent.calls().len(), 3);
    assert_eq!(
        agent.enrolled_set(),
        BTreeSet::from(["keep".to_string(), "late".to_string(), "new".to_string()])
    );
    task.abort();
}

/// Until both lists are in, nothing is decided: a pod of an enabled namespace is not
/// unenrolled because the namespaces were not listed yet.
#[tokio::test]
async fn nothing_is_called_before_both_lists_are_in() {
    let (client, mut api) = FakeApi::start(
        vec![PodB::new("m", "mesh").json(), PodB::new("n", "mesh").json()],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    api.hold_lists(Kind::Namespaces, true);
    let agent = FakeAgent::with_enrolled(&[("m", "mesh")]);
    let task = spawn(client, &agent, fast());
    let pod_watch = api.next_watch(Kind::Pods).await;
    pod_watch.send(
        "MODIFIED",
        PodB::new("m", "mesh").annotate("k", "v").rv("101").json(),
    );
    settle().await;
    assert_eq!(agent.calls(), []);
    api.hold_lists(Kind::Namespaces, false);
    assert_eq!(agent.wait_calls(1).await, [enroll("n")]);
    settle().await;
    assert_eq!(agent.calls(), [enroll("n")]);
    task.abort();
}

#[tokio::test]
async fn failed_calls_are_retried_with_backoff() {
    let (client, mut api) =
        FakeApi::start(vec![PodB::new("a", "x").label("enabled").json()], vec![]);
    let agent = Arc::new(FakeAgent::default());
    agent.0.lock().unwrap().fail_enrolls = 3;
    let task = spawn(client, &agent, fast());
    let calls = agent.wait_calls(4).await;
    assert_eq!(calls, [enroll("a"), enroll("a"), enroll("a"), enroll("a")]);
    let t = agent.call_times();
    // 40 ms, 80 ms, 160 ms.
    for (i, min) in [40u64, 80, 160].into_iter().enumerate() {
        let gap = t[i + 1] - t[i];
        assert!(gap >= Duration::from_millis(min), "retry {i} after {gap:?}");
    }
    assert_eq!(agent.enrolled_set(), BTreeSet::from(["a".to_string()]));

    // An unenroll that fails is retried too; and a retry decides again: a pod whose
    // enroll keeps failing but that is then deleted is not enrolled any more.
    agent.0.lock().unwrap().fail_unenrolls = 1;
    let w = api.next_watch(Kind::Pods).await;
    w.send(
        "DELETED",
        PodB::new("a", "x").label("enabled").rv("101").json(),
    );
    assert_eq!(
        agent.wait_calls(6).await[4..],
        [unenroll("a"), unenroll("a")]
    );
    agent.0.lock().unwrap().fail_enrolls = usize::MAX;
    w.send(
        "ADDED",
        PodB::new("b", "x").label("enabled").rv("102").json(),
    );
    agent.wait_calls(7).await;
    w.send(
        "DELETED",
        PodB::new("b", "x").label("enabled").rv("103").json(),
    );
    // Past the longest retry delay (200 ms), the retries have stopped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let n = agent.calls().len();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let calls = agent.calls();
    assert_eq!(calls.len(), n, "{calls:?}");
    assert!(calls[6..].iter().all(|c| *c == enroll("b")), "{calls:?}");
    assert_eq!(agent.enrolled_set(), BTreeSet::new());
    task.abort();
}

#[tokio::test]
async fn terminating_pods_stay_until_deleted_and_finished_pods_leave() {
    let (client, mut api) = FakeApi::start(
        vec![
            PodB::new("t", "x").label("enabled").json(),
            PodB::new("j", "x").label("enabled").json(),
        ],
        vec![],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    agent.wait_calls(2).await;
    let w = api.next_watch(Kind::Pods).await;
    w.send(
        "MODIFIED",
        PodB::new("t", "x")
            .label("enabled")
            .terminating()
            .rv("101")
            .json(),
    );
    w.send(
        "MODIFIED",
        PodB::new("j", "x")
            .label("enabled")
            .phase("Succeeded")
            .rv("102")
            .json(),
    );
    assert_eq!(agent.wait_calls(3).await[2], unenroll("j"));
    w.send(
        "DELETED",
        PodB::new("t", "x")
            .label("enabled")
            .terminating()
            .rv("103")
            .json(),
    );
    assert_eq!(agent.wait_calls(4).await[3], unenroll("t"));
    task.abort();
}

/// The TLS stack (rustls with ring) builds a client from a config like the in-cluster
/// one: an https API server URL, a CA certificate, a bearer token. No connection is made.
#[tokio::test]
async fn a_client_builds_from_an_https_config_with_a_ca() {
    const CA: &str = "-----BEGIN CERTIFICATE-----
MIIBizCCATGgAwIBAgIUANi61zbcgjfWivPFTXnf1zY4VpQwCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPcmluZ3dheS10ZXN0LWNhMCAXDTI2MTEyOTE2MzUxMVoYDzIx
MjYxMTA1MTYzNTExWjAaMRgwFgYDVQQDDA9yaW5nd2F5LXRlc3QtY2EwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAATC5rjopueIAP/bLRo+FyumjfcDdvakQo6KMEd5
xdJHKWjWQfw5btp+fk7GIojr40D1UjNcCEpkcc8PG/ftbGLbo1MwUTAdBgNVHQ4E
FgQUGUwPmzjf0z+MvA/w+rS+Hco27xwwHwYDVR0jBBgwFoAUGUwPmzjf0z+MvA/w
+rS+Hco27xwwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiBcZIvA
eVO1kQDryQGG5oMLLKGDaCl3gboFbsRkBtkUZAIhAM8xav9jlmxqAEUQzqpXLDkB
G07/37zDU8RyOVOJoxfZ
-----END CERTIFICATE-----
";
    let dir = std::env::temp_dir().join(format!("ringway-kube-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca = dir.join("ca.crt");
    std::fs::write(&ca, CA).unwrap();
    let kubeconfig = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://10.96.0.1:443
    certificate-authority: {}
users:
- name: u
  user:
    token: not-a-real-token
contexts:
- name: x
  context: {{cluster: c, user: u}}
current-context: x
",
        ca.display()
    );
    let kc = ::kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = ::kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.scheme_str(), Some("https"));
    assert_eq!(config.root_cert.as_ref().map(Vec::len), Some(1));
    let client = Client::try_from(config);
    std::fs::remove_dir_all(&dir).unwrap();
    client.unwrap();
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let ms = Duration::from_millis;
    let got: Vec<_> = (1..=6)
        .map(|n| reconcile::backoff(ms(500), ms(5000), n))
        .collect();
    assert_eq!(
        got,
        [ms(500), ms(1000), ms(2000), ms(4000), ms(5000), ms(5000)]
    );
    assert_eq!(
        reconcile::backoff(ms(500), ms(30_000), u32::MAX),
        ms(30_000)
    );
    // The watcher's: the same, jittered into [d/2, d].
    let mut b = ExponentialBackoff::new(ms(100), ms(250));
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let got: Vec<_> = b.by_ref().take(4).collect();
        for (d, full) in got.iter().zip([100, 200, 250, 250]) {
            assert!(*d >= ms(full) / 2 && *d <= ms(full), "{d:?} for {full} ms");
            seen.insert(*d);
        }
        b.reset();
    }
    assert!(seen.len() > 10, "not jittered: {seen:?}");
}

// ---------------------------------------------------------------- the selector (CNI path)

mod selector {
    use super::*;
    use crate::testing::{ApiMode, FakeApiServer, FakePod};

    /// The selector's answer, asked from a blocking thread as the agent's CNI threads do.
    async fn ask(s: &Selector, uid: &str, ns: &str, name: &str) -> Result<Verdict, SelectError> {
        let (s, uid, ns, name) = (s.clone(), uid.to_owned(), ns.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || s.selects(&uid, &ns, &name))
            .await
            .unwrap()
    }

    fn pod_get(ns: &str, name: &str) -> String {
        format!("/api/v1/namespaces/{ns}/pods/{name}")
    }

    fn ns_get(ns: &str) -> String {
        format!("/api/v1/namespaces/{ns}")
    }

    fn start() -> (Selector, FakeApiServer) {
        let rt = tokio::runtime::Handle::current();
        let (client, api) = FakeApiServer::start(&rt);
        api.apply_namespace("mesh", Some("enabled"));
        api.apply_namespace("plain", None);
        api.apply_namespace("off", Some("disabled"));
        (Selector::new(client, rt), api)
    }

    /// Before the watch has seen a pod, the selector GETs it, and its namespace only
    /// when the pod's own labels leave the answer to it; the rule is `decide`'s.
    #[tokio::test]
    async fn a_pod_the_watch_has_not_seen_is_decided_by_the_api_server() {
        let (s, api) = start();
        let pod = |uid: &str, ns: &str| FakePod::new(uid, ns, &format!("pod-{uid}"), NODE);
        api.apply_pod(pod("a", "mesh").json());
        api.apply_pod(pod("b", "plain").json());
        api.apply_pod(pod("c", "mesh").mode("disabled").json());
        api.apply_pod(pod("d", "plain").mode("enabled").json());
        api.apply_pod(pod("e", "mesh").mode("enabled").host_network().json());
        api.apply_pod(pod("f", "off").json());
        api.apply_pod(pod("g", "mesh").mode("something-else").json());
        api.apply_pod(pod("h", "mesh").running(&["10.0.0.8"]).json());
        let mut done = pod("i", "mesh").running(&["10.0.0.9"]).json();
        done["status"]["phase"] = json!("Succeeded");
        api.apply_pod(done);
        let cases = [
            ("a", "mesh", Verdict::Capture, true),
            (
                "b",
                "plain",
                Verdict::PassThrough(UnenrollReason::NotLabelled),
                true,
            ),
            (
                "c",
                "mesh",
                Verdict::PassThrough(UnenrollReason::PodOptOut),
                false,
            ),
            ("d", "plain", Verdict::Capture, false),
            (
                "e",
                "mesh",
                Verdict::PassThrough(UnenrollReason::HostNetwork),
                false,
            ),
            (
                "f",
                "off",
                Verdict::PassThrough(UnenrollReason::NotLabelled),
                true,
            ),
            ("g", "mesh", Verdict::Capture, true),
            ("h", "mesh", Verdict::Capture, true),
            (
                "i",
                "mesh",
                Verdict::PassThrough(UnenrollReason::Finished),
                true,
            ),
        ];
        for (uid, ns, want, ns_needed) in cases {
            let before = api.gets().len();
            let got = ask(&s, uid, ns, &format!("pod-{uid}")).await.unwrap();
            assert_eq!(got, want, "pod {uid}");
            let mut gets = vec![pod_get(ns, &format!("pod-{uid}"))];
            if ns_needed {
                gets.push(ns_get(ns));
            }
            assert_eq!(api.gets()[before..], gets, "pod {uid}");
        }
        assert!(!s.synced());
    }

    /// A pod the API server does not know (deleted, or a static pod whose mirror pod is
    /// not there yet) is decided by its namespace; one known under another uid (a static
    /// pod's mirror) by the object found.
    #[tokio::test]
    async fn unknown_pods_and_other_uids() {
        let (s, api) = start();
        assert_eq!(
            ask(&s, "x", "mesh", "gone").await.unwrap(),
            Verdict::Capture
        );
        assert_eq!(
            ask(&s, "x", "plain", "gone").await.unwrap(),
            Verdict::PassThrough(UnenrollReason::NotLabelled)
        );
        // No namespace either.
        assert_eq!(
            ask(&s, "x", "nowhere", "gone").await.unwrap(),
            Verdict::PassThrough(UnenrollReason::NotLabelled)
        );
        api.apply_pod(
            FakePod::new("mirror-uid", "plain", "static-web", NODE)
                .mode("enabled")
                .json(),
        );
        assert_eq!(
            ask(&s, "config-hash", "plain", "static-web").await.unwrap(),
            Verdict::Capture
        );
    }

    /// An unreachable or silent API server: an error (the ADD answers "try again later"),
    /// within the lookup timeout; never a guess.
    #[tokio::test]
    async fn no_answer_from_the_api_server_is_an_error_not_a_guess() {
        let rt = tokio::runtime::Handle::current();
        let (client, api) = FakeApiServer::start(&rt);
        api.apply_namespace("mesh", Some("enabled"));
        let s = Selector::with_lookup_timeout(client, rt, Duration::from_millis(200));

        api.set_mode(ApiMode::Unreachable);
        let e = ask(&s, "u", "mesh", "web").await.unwrap_err();
        assert!(matches!(e, SelectError::Api { .. }), "{e:?}");
        let text = e.to_string();
        assert!(
            text.starts_with("cannot read pod mesh/web from the Kubernetes API server: "),
            "{text}"
        );

        api.set_mode(ApiMode::Hang);
        let started = Instant::now();
        let e = ask(&s, "u", "mesh", "web").await.unwrap_err();
        let took = started.elapsed();
        assert_eq!(
            e.to_string(),
            "no answer from the Kubernetes API server about pod mesh/web within 200 ms"
        );
        assert!(
            took >= Duration::from_millis(200) && took < Duration::from_secs(10),
            "{took:?}"
        );

        api.set_mode(ApiMode::Serve);
        assert_eq!(ask(&s, "u", "mesh", "web").await.unwrap(), Verdict::Capture);
    }

    /// The runtime the client runs on is gone (the agent is stopping): an error at once.
    #[test]
    fn a_stopped_runtime_is_an_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (client, _api) = FakeApiServer::start(rt.handle());
        let s = Selector::new(client, rt.handle().clone());
        drop(rt);
        let started = std::time::Instant::now();
        assert!(matches!(
            s.selects("u", "mesh", "web"),
            Err(SelectError::Stopped)
        ));
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    /// Once the watch has listed pods and namespaces, the selector answers from its
    /// caches (no GET) and follows what the watch sees.
    #[tokio::test]
    async fn after_the_watch_lists_the_cache_answers() {
        let (s, api) = start();
        api.apply_pod(FakePod::new("a", "mesh", "pod-a", NODE).json());
        api.apply_pod(FakePod::new("b", "plain", "pod-b", NODE).json());
        let agent = Arc::new(FakeAgent::default());
        let task = spawn_with(s.clone(), &agent, fast());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s.synced() {
            assert!(Instant::now() < deadline, "the watch did not list");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            ask(&s, "a", "mesh", "pod-a").await.unwrap(),
            Verdict::Capture
        );
        assert_eq!(
            ask(&s, "b", "plain", "pod-b").await.unwrap(),
            Verdict::PassThrough(UnenrollReason::NotLabelled)
        );
        assert_eq!(api.gets(), Vec::<String>::new());

        // The namespace loses its label: the watch sees it, the selector follows.
        api.apply_namespace("mesh", None);
        let deadline = Instant::now() + Duration::from_secs(10);
        while ask(&s, "a", "mesh", "pod-a").await.unwrap() == Verdict::Capture {
            assert!(Instant::now() < deadline, "the cache did not follow");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A pod the watch has not seen yet is still looked up.
        assert_eq!(
            ask(&s, "new", "plain", "pod-new").await.unwrap(),
            Verdict::PassThrough(UnenrollReason::NotLabelled)
        );
        assert_eq!(api.gets(), [pod_get("plain", "pod-new"), ns_get("plain")]);
        assert_eq!(agent.calls(), []);
        task.abort();
    }

    /// The pods the CNI path captured (the agent holds them, with the identity the watch
    /// would give) are left alone by the watch exactly when the selector captures them;
    /// the others it unenrolls. No pod is enrolled and unenrolled back and forth.
    #[tokio::test]
    async fn the_watch_keeps_exactly_what_the_selector_captures() {
        let (s, api) = start();
        let pods = [
            FakePod::new("a", "mesh", "pod-a", NODE),
            FakePod::new("b", "plain", "pod-b", NODE),
            FakePod::new("c", "mesh", "pod-c", NODE).mode("disabled"),
            FakePod::new("d", "plain", "pod-d", NODE).mode("enabled"),
            FakePod::new("e", "off", "pod-e", NODE),
            FakePod::new("f", "mesh", "pod-f", NODE).running(&["10.0.0.6"]),
            FakePod::new("g", "plain", "pod-g", NODE).running(&["10.0.0.7"]),
            FakePod::new("h", "ringway-system", "pod-h", NODE).mode("enabled"),
        ];
        let agent = Arc::new(FakeAgent::default());
        let mut captured = BTreeSet::new();
        for p in &pods {
            let v = p.json();
            let uid = v["metadata"]["uid"].as_str().unwrap().to_owned();
            let ns = v["metadata"]["namespace"].as_str().unwrap().to_owned();
            api.apply_pod(v);
            // What the CNI ADD did (the agent applies its exclusions first).
            let verdict = if agent.excludes(&ns) {
                Verdict::PassThrough(UnenrollReason::Excluded)
            } else {
                ask(&s, &uid, &ns, &format!("pod-{uid}")).await.unwrap()
            };
            agent.hold(&uid, &ns, "default");
            if verdict == Verdict::Capture {
                captured.insert(uid);
            }
        }
        assert_eq!(
            captured,
            ["a", "d", "f"].into_iter().map(String::from).collect()
        );
        let task = spawn_with(s.clone(), &agent, fast());
        let mut released: Vec<Call> = ["b", "c", "e", "g", "h"]
            .into_iter()
            .map(unenroll)
            .collect();
        released.sort_by_key(|c| format!("{c:?}"));
        assert_eq!(sorted(agent.wait_calls(5).await), released);
        settle().await;
        assert_eq!(agent.calls().len(), 5, "{:?}", agent.calls());
        assert_eq!(agent.enrolled_set(), captured);
        task.abort();
    }

    /// A pod the CNI ADD enrolled has no service account: the watch enrolls it again
    /// with its identity once, then leaves it.
    #[tokio::test]
    async fn the_watch_fills_in_the_service_account_once() {
        let (s, api) = start();
        api.apply_pod(
            FakePod::new("a", "mesh", "pod-a", NODE)
                .service_account("cart")
                .running(&["10.0.0.5"])
                .json(),
        );
        let agent = Arc::new(FakeAgent::default());
        agent.hold("a", "mesh", "");
        let task = spawn_with(s.clone(), &agent, fast());
        assert_eq!(agent.wait_calls(1).await, [enroll("a")]);
        assert_eq!(agent.identity("a").service_account, "cart");
        // More events about the pod: nothing more.
        let mut again = FakePod::new("a", "mesh", "pod-a", NODE)
            .service_account("cart")
            .running(&["10.0.0.5"])
            .json();
        again["metadata"]["annotations"] = json!({"note": "x"});
        api.apply_pod(again);
        settle().await;
        assert_eq!(agent.calls(), [enroll("a")]);
        task.abort();
    }
}
