//! The watch against the fake API server of the test bed (`ringway_testbed::kube_api`)
//! (kube's `Client` over a `tower_test` mock service): the watcher's lists are
//! answered from the fake's store, and its watch requests are handed to the test,
//! which writes their events. A recording fake [`Enrollment`] stands for the node
//! agent.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::*;
use ringway_config::Jitter;
use ringway_testbed::kube_api::{fixtures, ApiMode, FakeApiServer, FakePod, Kind};

const NODE: &str = "node-a";

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
    /// `annotation_seen` calls: (pod, annotated).
    annotations_seen: Vec<(PodRef, bool)>,
    /// `pod_deleted` calls.
    deleted: Vec<String>,
    /// The unenrolls that were `release_gone` (rules kept).
    gone: Vec<String>,
}

/// Records every call; `enrolled()` is what was enrolled and not unenrolled.
#[derive(Default)]
struct FakeAgent(Mutex<AgentState>);

impl FakeAgent {
    /// Holding `(uid, namespace)` pods with the identity [`pod`] gives them
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
    fn enroll(&self, pod: &PodIdentity) -> Result<(), EnrollmentError> {
        let mut s = self.0.lock().unwrap();
        s.calls
            .push((Call::Enroll(pod.uid.clone()), Instant::now()));
        if s.fail_enrolls > 0 {
            s.fail_enrolls -= 1;
            return Err(EnrollmentError::new(std::io::Error::other(
                "netns not found",
            )));
        }
        s.enrolled.insert(pod.uid.clone(), pod.clone());
        Ok(())
    }

    fn unenroll(&self, uid: &str) -> Result<(), EnrollmentError> {
        let mut s = self.0.lock().unwrap();
        s.calls.push((Call::Unenroll(uid.into()), Instant::now()));
        if s.fail_unenrolls > 0 {
            s.fail_unenrolls -= 1;
            return Err(EnrollmentError::new(std::io::Error::other(
                "proxy did not ack",
            )));
        }
        s.enrolled.remove(uid);
        Ok(())
    }

    fn release_gone(&self, uid: &str) -> Result<(), EnrollmentError> {
        self.unenroll(uid)?;
        self.0.lock().unwrap().gone.push(uid.into());
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

    fn annotation_seen(&self, pod: &PodRef, annotated: bool) {
        self.0
            .lock()
            .unwrap()
            .annotations_seen
            .push((pod.clone(), annotated));
    }

    fn pod_deleted(&self, uid: &str) {
        self.0.lock().unwrap().deleted.push(uid.to_owned());
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

/// A fake API server listing `pods` (at resourceVersion 100) and `namespaces` (at 50);
/// the watches of both kinds are the test's ([`FakeApiServer::next_watch`]).
fn scripted(pods: Vec<Value>, namespaces: Vec<Value>) -> (Client, FakeApiServer) {
    let (client, api) = FakeApiServer::start(&tokio::runtime::Handle::current());
    api.script_watches(Kind::Pod);
    api.script_watches(Kind::Namespace);
    api.replace_unseen(Kind::Pod, 100, pods);
    api.replace_unseen(Kind::Namespace, 50, namespaces);
    (client, api)
}

// ---------------------------------------------------------------- objects

/// Pod `pod-<uid>` of this node: service account `sa-x`, running at 10.0.0.1,
/// resourceVersion 1.
fn pod(uid: &str, namespace: &str) -> FakePod {
    FakePod::new(uid, namespace, &format!("pod-{uid}"), NODE)
        .service_account("sa-x")
        .running(&["10.0.0.1"])
        .resource_version("1")
}

/// [`fixtures::namespace`] at resourceVersion `rv`.
fn namespace(name: &str, mode: Option<&str>, rv: &str) -> Value {
    let mut ns = fixtures::namespace(name, mode);
    ns["metadata"]["resourceVersion"] = json!(rv);
    ns
}

/// [`fixtures::namespace_with_labels`] at resourceVersion `rv`.
fn namespace_labelled(name: &str, labels: &[(&str, &str)], rv: &str) -> Value {
    let mut ns = fixtures::namespace_with_labels(name, labels);
    ns["metadata"]["resourceVersion"] = json!(rv);
    ns
}

const RINGWAY: &str = DATAPLANE_MODE_LABEL;
const ISTIO: &str = ISTIO_DATAPLANE_MODE_LABEL;

fn fast() -> WatchConfig {
    WatchConfig {
        node: NODE.into(),
        retry_min: Duration::from_millis(40),
        retry_max: Duration::from_millis(200),
        orphan_grace: Duration::from_millis(150),
        watch_backoff_min: Duration::from_millis(10),
        watch_backoff_max: Duration::from_millis(50),
        trust_after_failure: Duration::from_millis(100),
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
        pod("a", "plain").mode("enabled").json(),
        pod("b", "plain").json(),
        pod("c", "mesh").json(),
        pod("d", "mesh").mode("enabled").host_network().json(),
        pod("e", "plain").mode("enabled").pending().json(),
    ];
    let (client, api) = scripted(pods, vec![namespace("mesh", Some("enabled"), "7")]);
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

    // The requests: the pods of this node; every namespace (either of two labels
    // enrolls one: no label selector).
    let pod_watch = api.next_watch(Kind::Pod).await;
    let ns_watch = api.next_watch(Kind::Namespace).await;
    let pod_reqs = api.requests_of(Kind::Pod);
    let ns_reqs = api.requests_of(Kind::Namespace);
    let list = &pod_reqs[0];
    assert!(!list.watch);
    assert_eq!(
        list.query.get("fieldSelector").map(String::as_str),
        Some("spec.nodeName=node-a")
    );
    assert_eq!(list.query.get("labelSelector"), None);
    assert_eq!(ns_reqs.len(), 2, "{ns_reqs:?}");
    for r in &ns_reqs {
        assert!(!r.query.contains_key("fieldSelector"));
        assert!(!r.query.contains_key("labelSelector"));
    }
    assert_eq!(pod_watch.query["watch"], "true");
    assert_eq!(pod_watch.query["fieldSelector"], "spec.nodeName=node-a");
    assert_eq!(pod_watch.query["resourceVersion"], "100");
    assert_eq!(pod_watch.query["allowWatchBookmarks"], "true");
    assert_eq!(ns_watch.query["resourceVersion"], "50");

    // e starts running with an IP: enrolled. A new hostNetwork pod, and an annotation
    // change on an enrolled pod: nothing. a deleted: unenrolled.
    pod_watch.send(
        "MODIFIED",
        pod("e", "plain")
            .mode("enabled")
            .running(&["10.0.0.5"])
            .resource_version("101")
            .json(),
    );
    pod_watch.send(
        "ADDED",
        pod("f", "mesh")
            .mode("enabled")
            .host_network()
            .resource_version("102")
            .json(),
    );
    pod_watch.send(
        "MODIFIED",
        pod("a", "plain")
            .mode("enabled")
            .annotate("note", "x")
            .resource_version("103")
            .json(),
    );
    pod_watch.send(
        "DELETED",
        pod("a", "plain")
            .mode("enabled")
            .resource_version("104")
            .json(),
    );
    let calls = agent.wait_calls(4).await;
    assert_eq!(calls[2..], [enroll("e"), unenroll("a")]);
    // Deleted: released with its rules kept (it may still run).
    assert_eq!(agent.0.lock().unwrap().gone, ["a"]);
    assert_eq!(
        agent.identity("e").ips,
        vec!["10.0.0.5".parse::<std::net::IpAddr>().unwrap()]
    );

    // A bookmark, then the server ends the watch: the watch resumes from the bookmark,
    // without a relist.
    pod_watch.bookmark(Kind::Pod, "150");
    drop(pod_watch);
    let resumed = api.next_watch(Kind::Pod).await;
    assert_eq!(resumed.query["resourceVersion"], "150");
    assert_eq!(
        api.requests_of(Kind::Pod)
            .iter()
            .filter(|s| !s.watch)
            .count(),
        1
    );
    resumed.send("ADDED", pod("g", "mesh").resource_version("151").json());
    assert_eq!(agent.wait_calls(5).await[4], enroll("g"));
    drop(ns_watch);
    task.abort();
}

#[tokio::test]
async fn pod_label_opt_in_opt_out_and_removal() {
    let (client, api) = scripted(
        vec![pod("m", "mesh").json(), pod("p", "plain").json()],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    assert_eq!(agent.wait_calls(1).await, [enroll("m")]);
    let w = api.next_watch(Kind::Pod).await;

    // Opt-out on a pod of an enabled namespace, then back.
    w.send(
        "MODIFIED",
        pod("m", "mesh")
            .mode("disabled")
            .resource_version("2")
            .json(),
    );
    assert_eq!(agent.wait_calls(2).await[1], unenroll("m"));
    w.send(
        "MODIFIED",
        pod("m", "mesh").without_mode().resource_version("3").json(),
    );
    assert_eq!(agent.wait_calls(3).await[2], enroll("m"));
    // Opt-in of a pod of a plain namespace, then the label removed.
    w.send(
        "MODIFIED",
        pod("p", "plain")
            .mode("enabled")
            .resource_version("4")
            .json(),
    );
    assert_eq!(agent.wait_calls(4).await[3], enroll("p"));
    w.send(
        "MODIFIED",
        pod("p", "plain")
            .mode("something-else")
            .resource_version("5")
            .json(),
    );
    assert_eq!(agent.wait_calls(5).await[4], unenroll("p"));
    assert_eq!(agent.enrolled_set(), BTreeSet::from(["m".to_string()]));
    task.abort();
}

#[tokio::test]
async fn namespace_label_flip_re_evaluates_its_pods() {
    let (client, api) = scripted(
        vec![
            pod("s1", "shop").json(),
            pod("s2", "shop").json(),
            pod("s3", "shop").mode("disabled").json(),
            pod("s4", "shop").host_network().json(),
            pod("o1", "other").json(),
        ],
        vec![],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    let ns_watch = api.next_watch(Kind::Namespace).await;
    let _pod_watch = api.next_watch(Kind::Pod).await;
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
    // No longer selected (still running): released and its rules removed.
    assert!(agent.0.lock().unwrap().gone.is_empty());
    task.abort();
}

/// The watch expires (410 Gone): the watcher lists again; pods deleted meanwhile are
/// unenrolled (after the grace), new ones enrolled.
#[tokio::test]
async fn gone_relists_and_reconciles() {
    let (client, api) = scripted(
        vec![
            pod("a", "x").mode("enabled").json(),
            pod("b", "x").mode("enabled").json(),
        ],
        vec![],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    assert_eq!(
        sorted(agent.wait_calls(2).await),
        [enroll("a"), enroll("b")]
    );
    let w = api.next_watch(Kind::Pod).await;

    // While the watch was away: b deleted, c created.
    api.replace_unseen(
        Kind::Pod,
        300,
        vec![
            pod("a", "x").mode("enabled").json(),
            pod("c", "x").mode("enabled").json(),
        ],
    );
    let before = Instant::now();
    w.gone();
    let calls = agent.wait_calls(4).await;
    assert_eq!(calls[2..], [enroll("c"), unenroll("b")]);
    assert_eq!(agent.0.lock().unwrap().gone, ["b"], "absent: rules kept");
    // b went through the orphan grace.
    assert!(agent.call_times()[3] - before >= fast().orphan_grace);
    let lists: Vec<_> = api
        .requests_of(Kind::Pod)
        .into_iter()
        .filter(|s| !s.watch)
        .collect();
    assert_eq!(lists.len(), 2);
    assert_eq!(lists[1].query["fieldSelector"], "spec.nodeName=node-a");
    let w2 = api.next_watch(Kind::Pod).await;
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
    let (client, api) = scripted(
        vec![
            pod("keep", "x").mode("enabled").json(),
            pod("optout", "mesh").mode("disabled").json(),
            pod("new", "mesh").json(),
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
    let w = api.next_watch(Kind::Pod).await;
    w.send(
        "ADDED",
        pod("late", "x")
            .mode("enabled")
            .resource_version("101")
            .json(),
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
    let (client, api) = scripted(
        vec![pod("m", "mesh").json(), pod("n", "mesh").json()],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    api.set_mode_of(Kind::Namespace, ApiMode::Hold);
    let agent = FakeAgent::with_enrolled(&[("m", "mesh")]);
    let task = spawn(client, &agent, fast());
    let pod_watch = api.next_watch(Kind::Pod).await;
    pod_watch.send(
        "MODIFIED",
        pod("m", "mesh")
            .annotate("k", "v")
            .resource_version("101")
            .json(),
    );
    settle().await;
    assert_eq!(agent.calls(), []);
    api.set_mode_of(Kind::Namespace, ApiMode::Serve);
    assert_eq!(agent.wait_calls(1).await, [enroll("n")]);
    settle().await;
    assert_eq!(agent.calls(), [enroll("n")]);
    task.abort();
}

/// The Istio ambient mesh's labels: `istio.io/dataplane-mode=ambient` on a namespace
/// or on a pod enrolls, `none` on a pod opts it out whatever its namespace says. A
/// namespace moved from one enrolling label to the other in one update, either way, or
/// given both and then one removed, never leaves the mesh (no call for its pod); it
/// leaves when it has neither.
#[tokio::test]
async fn istio_labels_enroll_opt_out_and_either_namespace_label_holds() {
    let (client, api) = scripted(
        vec![
            pod("m", "amb").json(),
            pod("o", "amb").istio_mode("none").json(),
            pod("p", "plain").istio_mode("ambient").json(),
            pod("q", "plain").json(),
            pod("r", "both").json(),
            pod("z", "late").json(),
        ],
        vec![
            namespace_labelled("amb", &[(ISTIO, "ambient")], "7"),
            namespace_labelled("both", &[(RINGWAY, "enabled")], "8"),
            namespace_labelled("plain", &[(ISTIO, "none")], "9"),
        ],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    assert_eq!(
        sorted(agent.wait_calls(3).await),
        [enroll("m"), enroll("p"), enroll("r")]
    );
    let pods = api.next_watch(Kind::Pod).await;
    let namespaces = api.next_watch(Kind::Namespace).await;

    // "both": ringway's label -> istio's -> both -> ringway's -> istio's, each in one
    // update. The watch applies its events in order, so a later one whose call is
    // awaited (namespace "late" enrolled: its pod z enrolled) is a barrier.
    let steps: [&[(&str, &str)]; 4] = [
        &[(ISTIO, "ambient")],
        &[(ISTIO, "ambient"), (RINGWAY, "enabled")],
        &[(RINGWAY, "enabled")],
        &[(ISTIO, "ambient"), (RINGWAY, "disabled")],
    ];
    for (i, labels) in steps.into_iter().enumerate() {
        namespaces.send(
            "MODIFIED",
            namespace_labelled("both", labels, &(10 + i).to_string()),
        );
    }
    namespaces.send(
        "ADDED",
        namespace_labelled("late", &[(ISTIO, "ambient")], "20"),
    );
    assert_eq!(agent.wait_calls(4).await[3], enroll("z"));
    // Neither label (a namespace has no opt-out, and `none` there enrolls nothing).
    namespaces.send(
        "MODIFIED",
        namespace_labelled("both", &[(ISTIO, "none")], "21"),
    );
    assert_eq!(agent.wait_calls(5).await[4], unenroll("r"));

    // The pod's own label: none removed (its namespace enrolls it), then set on
    // another pod of that namespace; ambient removed from a pod of a plain namespace.
    pods.send("MODIFIED", pod("o", "amb").resource_version("30").json());
    assert_eq!(agent.wait_calls(6).await[5], enroll("o"));
    pods.send(
        "MODIFIED",
        pod("m", "amb")
            .istio_mode("none")
            .resource_version("31")
            .json(),
    );
    assert_eq!(agent.wait_calls(7).await[6], unenroll("m"));
    pods.send("MODIFIED", pod("p", "plain").resource_version("32").json());
    assert_eq!(agent.wait_calls(8).await[7], unenroll("p"));
    // Another value of the istio.io label is no label; the opt-out beats ringway's
    // enabled on the same pod.
    pods.send(
        "MODIFIED",
        pod("q", "plain")
            .istio_mode("Ambient")
            .resource_version("33")
            .json(),
    );
    pods.send(
        "MODIFIED",
        pod("r", "both")
            .mode("enabled")
            .istio_mode("none")
            .resource_version("34")
            .json(),
    );
    pods.send(
        "MODIFIED",
        pod("q", "plain")
            .istio_mode("ambient")
            .resource_version("35")
            .json(),
    );
    assert_eq!(agent.wait_calls(9).await[8], enroll("q"));
    assert_eq!(
        agent.enrolled_set(),
        ["o", "q", "z"].into_iter().map(String::from).collect()
    );
    drop(namespaces);
    task.abort();
}

/// The watch reports the pods whose `ambient.istio.io/redirection` annotation
/// disagrees with what the agent holds: a running pod it holds without it, a pod the
/// rule passes over with it. The others (held with it, not held without it, a pod
/// the watch enrolls: the agent annotates those itself) are not reported.
#[tokio::test]
async fn the_watch_reports_annotations_that_disagree_with_the_agent() {
    let annotated = |p: FakePod| p.annotate(REDIRECTION_ANNOTATION, REDIRECTION_ENABLED);
    let (client, api) = scripted(
        vec![
            pod("held-bare", "mesh").json(),
            annotated(pod("held-annotated", "mesh")).json(),
            annotated(pod("stray", "plain")).json(),
            pod("plain", "plain").json(),
            annotated(pod("new", "mesh")).json(),
            // Another value is not `enabled`: a held pod with it is reported.
            pod("held-other", "mesh")
                .annotate(REDIRECTION_ANNOTATION, "pending")
                .json(),
        ],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    let agent = FakeAgent::with_enrolled(&[
        ("held-bare", "mesh"),
        ("held-annotated", "mesh"),
        ("held-other", "mesh"),
    ]);
    let task = spawn(client, &agent, fast());
    assert_eq!(agent.wait_calls(1).await, [enroll("new")]);
    let seen = |agent: &FakeAgent| {
        let mut seen: Vec<(String, bool)> = agent
            .0
            .lock()
            .unwrap()
            .annotations_seen
            .iter()
            .map(|(p, a)| {
                assert_eq!(p.name, format!("pod-{}", p.uid), "{p:?}");
                (p.uid.clone(), *a)
            })
            .collect();
        seen.sort();
        seen
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen(&agent).len() < 3 {
        assert!(Instant::now() < deadline, "{:?}", seen(&agent));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let want = vec![
        ("held-bare".to_string(), false),
        ("held-other".to_string(), false),
        ("stray".to_string(), true),
    ];
    assert_eq!(seen(&agent), want);

    // Once annotated, no more reports; the namespace of "stray" is still plain. A
    // deleted pod is reported as such (its wishes are moot).
    let w = api.next_watch(Kind::Pod).await;
    w.send(
        "MODIFIED",
        annotated(pod("held-bare", "mesh"))
            .resource_version("2")
            .json(),
    );
    w.send(
        "DELETED",
        annotated(pod("stray", "plain"))
            .resource_version("3")
            .json(),
    );
    // A barrier on the same watch: a pod whose enroll call is awaited.
    w.send("ADDED", pod("late", "mesh").resource_version("4").json());
    assert_eq!(agent.wait_calls(2).await[1], enroll("late"));
    assert_eq!(seen(&agent), want);
    assert_eq!(agent.0.lock().unwrap().deleted, ["stray"]);
    task.abort();
}

#[tokio::test]
async fn failed_calls_are_retried_with_backoff() {
    let (client, api) = scripted(vec![pod("a", "x").mode("enabled").json()], vec![]);
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
    let w = api.next_watch(Kind::Pod).await;
    w.send(
        "DELETED",
        pod("a", "x").mode("enabled").resource_version("101").json(),
    );
    assert_eq!(
        agent.wait_calls(6).await[4..],
        [unenroll("a"), unenroll("a")]
    );
    agent.0.lock().unwrap().fail_enrolls = usize::MAX;
    w.send(
        "ADDED",
        pod("b", "x").mode("enabled").resource_version("102").json(),
    );
    agent.wait_calls(7).await;
    w.send(
        "DELETED",
        pod("b", "x").mode("enabled").resource_version("103").json(),
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
    let (client, api) = scripted(
        vec![
            pod("t", "x").mode("enabled").json(),
            pod("j", "x").mode("enabled").json(),
        ],
        vec![],
    );
    let agent = Arc::new(FakeAgent::default());
    let task = spawn(client, &agent, fast());
    agent.wait_calls(2).await;
    let w = api.next_watch(Kind::Pod).await;
    w.send(
        "MODIFIED",
        pod("t", "x")
            .mode("enabled")
            .terminating()
            .resource_version("101")
            .json(),
    );
    w.send(
        "MODIFIED",
        pod("j", "x")
            .mode("enabled")
            .phase("Succeeded")
            .resource_version("102")
            .json(),
    );
    assert_eq!(agent.wait_calls(3).await[2], unenroll("j"));
    w.send(
        "DELETED",
        pod("t", "x")
            .mode("enabled")
            .terminating()
            .resource_version("103")
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
    let dir = ringway_testbed::TempDir::new("kube-tls");
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
    client.unwrap();
}

/// The doubling, the cap, the jitter and the reset are `ringway_config::Backoff`'s
/// (its tests); here, the figures each retry of the watch is built with.
#[test]
fn retries_and_the_watchers_backoff_have_their_documented_figures() {
    let ms = Duration::from_millis;
    let figures = |b: ringway_config::Backoff| {
        (
            b.min_delay(),
            b.max_delay(),
            b.jitter(),
            (1..=8).map(|n| b.base_delay(n)).collect::<Vec<_>>(),
        )
    };
    let doubling =
        |first: u64| -> Vec<Duration> { (0..8).map(|n| ms(first << n).min(ms(30_000))).collect() };
    let config = WatchConfig::new(NODE);
    // Enroll/unenroll calls: 500 ms doubling to 30 s, exact.
    assert_eq!(
        figures(config.retry_backoff()),
        (ms(500), ms(30_000), Jitter::None, doubling(500))
    );
    // The watchers: 800 ms doubling to 30 s, each cut by up to half.
    assert_eq!(
        figures(config.watch_backoff()),
        (ms(800), ms(30_000), Jitter::Down(0.5), doubling(800))
    );
    // The annotator's patches: 500 ms doubling to 30 s, exact.
    assert_eq!(
        figures(AnnotatorConfig::default().retry_backoff()),
        (ms(500), ms(30_000), Jitter::None, doubling(500))
    );
}

// ---------------------------------------------------------------- the selector (CNI path)

mod selector {
    use super::*;

    /// The selector's answer, asked from a blocking thread as the agent's CNI threads do.
    /// The selector's verdict for the pod, asserted to come from its cache
    /// (no GET).
    async fn from_cache(
        s: &Selector,
        api: &FakeApiServer,
        uid: &str,
        ns: &str,
        name: &str,
    ) -> Verdict {
        let gets = api.gets().len();
        let verdict = ask(s, uid, ns, name).await.unwrap();
        assert_eq!(
            api.gets()[gets..],
            [] as [String; 0],
            "answered from the cache"
        );
        verdict
    }

    /// Starts the watch on `s` and waits (at most 10 s) until it has listed.
    async fn spawn_synced(s: &Selector, agent: &Arc<FakeAgent>) -> tokio::task::JoinHandle<()> {
        let task = spawn_with(s.clone(), agent, fast());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !s.synced() {
            assert!(Instant::now() < deadline, "the watch did not list");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        task
    }

    /// Waits (at most 10 s) until the selector's cache is stale (a watch
    /// failed lately), or no longer is.
    async fn wait_stale(s: &Selector, stale: bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while s.cache().stale() != stale {
            assert!(
                Instant::now() < deadline,
                "the cache never became stale={stale}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

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

    async fn by_name(s: &Selector, ns: &str, name: &str) -> Result<ByName, SelectError> {
        let (s, ns, name) = (s.clone(), ns.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || s.select_by_name(&ns, &name, NODE))
            .await
            .unwrap()
    }

    fn found(uid: &str, verdict: Verdict, sa: &str) -> ByName {
        ByName::Found {
            uid: uid.into(),
            selected: Selected {
                verdict,
                service_account: Some(sa.into()),
            },
        }
    }

    /// The verdict and the reason of an [`ByName::Unknown`].
    fn unknown(b: ByName) -> (Verdict, String) {
        match b {
            ByName::Unknown { verdict, why } => (verdict, why),
            other => panic!("expected no pod to count, got {other:?}"),
        }
    }

    /// For a runtime that gave no pod uid: the API server's pod of that name
    /// gives the uid and the rule's answer, when it is this node's and not
    /// being deleted (a static pod's mirror: the static pod's uid, unless a
    /// pod the watch knows has that uid); otherwise no pod counts and the
    /// namespace decides. Never the watch's cache (an older pod of that
    /// name), never a guess.
    #[tokio::test]
    async fn a_pod_without_a_uid_is_the_api_servers_pod_of_that_name_on_this_node() {
        let (s, api) = start();
        api.apply_pod(
            FakePod::new("uid-web", "mesh", "web", NODE)
                .service_account("web")
                .json(),
        );
        api.apply_pod(FakePod::new("uid-plain", "plain", "web", NODE).json());
        api.apply_pod(
            FakePod::new("uid-mirror", "mesh", "static-web", NODE)
                .annotate("kubernetes.io/config.mirror", "config-hash")
                .json(),
        );
        api.apply_pod(FakePod::new("uid-far", "mesh", "far", "another-node").json());
        api.apply_pod(
            FakePod::new("uid-going", "mesh", "going", NODE)
                .terminating()
                .json(),
        );
        api.apply_pod(
            FakePod::new("uid-liar", "mesh", "liar", NODE)
                .annotate("kubernetes.io/config.mirror", "uid-victim")
                .json(),
        );

        assert_eq!(
            by_name(&s, "mesh", "web").await.unwrap(),
            found("uid-web", Verdict::Capture, "web")
        );
        assert_eq!(
            by_name(&s, "plain", "web").await.unwrap(),
            found(
                "uid-plain",
                Verdict::PassThrough(UnenrollReason::NotLabelled),
                ""
            )
        );
        match by_name(&s, "mesh", "static-web").await.unwrap() {
            ByName::Found { uid, selected } => {
                assert_eq!(uid, "config-hash");
                assert_eq!(selected.verdict, Verdict::Capture);
            }
            other => panic!("{other:?}"),
        }
        let (verdict, why) = unknown(by_name(&s, "mesh", "gone").await.unwrap());
        assert_eq!(
            (verdict, why.as_str()),
            (Verdict::Capture, "the API server has no such pod")
        );
        let (verdict, _) = unknown(by_name(&s, "plain", "gone").await.unwrap());
        assert_eq!(verdict, Verdict::PassThrough(UnenrollReason::NotLabelled));
        let (_, why) = unknown(by_name(&s, "mesh", "far").await.unwrap());
        assert_eq!(
            why,
            format!("the API server's pod of that name is on node \"another-node\", not this node (\"{NODE}\")")
        );
        let (_, why) = unknown(by_name(&s, "mesh", "going").await.unwrap());
        assert_eq!(why, "the API server's pod of that name is being deleted");

        // A mirror annotation naming a pod the watch knows by that uid.
        s.cache().pods.insert(
            "uid-victim".into(),
            super::super::decide::PodFacts::unknown("uid-victim", "mesh", "victim"),
        );
        let (_, why) = unknown(by_name(&s, "mesh", "liar").await.unwrap());
        assert!(
            why.contains("names pod uid-victim as its static pod"),
            "{why}"
        );

        // The watch's cache holds an older pod of the name: the API server's
        // pod counts.
        {
            let mut cache = s.cache();
            cache.pods.insert(
                "uid-old".into(),
                super::super::decide::PodFacts::unknown("uid-old", "mesh", "web"),
            );
            cache.pods_synced = true;
            cache.namespaces_synced = true;
        }
        let gets = api.gets().len();
        match by_name(&s, "mesh", "web").await.unwrap() {
            ByName::Found { uid, .. } => assert_eq!(uid, "uid-web"),
            other => panic!("{other:?}"),
        }
        assert_eq!(api.gets()[gets], pod_get("mesh", "web"));
        // Re-created under the same name: the new uid.
        api.delete_pod("mesh", "web");
        api.apply_pod(
            FakePod::new("uid-web-2", "mesh", "web", NODE)
                .service_account("web")
                .json(),
        );
        assert_eq!(
            by_name(&s, "mesh", "web").await.unwrap(),
            found("uid-web-2", Verdict::Capture, "web")
        );
    }

    /// An API server that cannot be read: an error (the ADD is retried),
    /// within the lookup timeout; never the cache's word.
    #[tokio::test]
    async fn a_pod_without_a_uid_and_no_api_server_is_an_error() {
        let rt = tokio::runtime::Handle::current();
        let (client, api) = FakeApiServer::start(&rt);
        let s = Selector::with_lookup_timeout(client, rt, Duration::from_millis(200));
        api.apply_pod(FakePod::new("uid-web", "mesh", "web", NODE).json());
        api.set_mode(ApiMode::Unreachable);
        let e = by_name(&s, "mesh", "web").await.unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot read pod mesh/web from the Kubernetes API server: "),
            "{e}"
        );
        api.set_mode(ApiMode::Hang);
        assert_eq!(
            by_name(&s, "mesh", "web").await.unwrap_err().to_string(),
            "no answer from the Kubernetes API server about pod mesh/web within 200 ms"
        );
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

    async fn ask_sa(s: &Selector, uid: &str, ns: &str, name: &str) -> Option<String> {
        let (s, uid, ns, name) = (s.clone(), uid.to_owned(), ns.to_owned(), name.to_owned());
        tokio::task::spawn_blocking(move || s.select(&uid, &ns, &name))
            .await
            .unwrap()
            .unwrap()
            .service_account
    }

    /// The CNI ADD takes the pod's service account from the selector: only for the
    /// very pod (its uid, or the mirror pod of that static pod), never for a pod that
    /// was re-created under the same name, never a default for a pod the API server
    /// does not know. From the watch's cache once it has listed.
    #[tokio::test]
    async fn adversarial_the_service_account_is_only_the_pods_own() {
        let (s, api) = start();
        api.apply_pod(
            FakePod::new("u-web", "mesh", "web", NODE)
                .service_account("web")
                .json(),
        );
        api.apply_pod(
            FakePod::new("u-old", "mesh", "reused", NODE)
                .service_account("admin")
                .json(),
        );
        api.apply_pod(
            FakePod::new("u-mirror", "mesh", "static", NODE)
                .service_account("node-agent")
                .annotate("kubernetes.io/config.mirror", "u-static")
                .json(),
        );
        assert_eq!(
            ask_sa(&s, "u-web", "mesh", "web").await.as_deref(),
            Some("web")
        );
        assert_eq!(ask_sa(&s, "u-new", "mesh", "reused").await, None);
        assert_eq!(ask_sa(&s, "u-none", "mesh", "ghost").await, None);
        assert_eq!(
            ask_sa(&s, "u-static", "mesh", "static").await.as_deref(),
            Some("node-agent")
        );
        // The verdict is unchanged by it: the namespace still captures.
        assert_eq!(
            ask(&s, "u-none", "mesh", "ghost").await.unwrap(),
            Verdict::Capture
        );

        let agent = Arc::new(FakeAgent::default());
        let task = spawn_synced(&s, &agent).await;
        let gets = api.gets().len();
        assert_eq!(
            ask_sa(&s, "u-web", "mesh", "web").await.as_deref(),
            Some("web")
        );
        assert_eq!(api.gets().len(), gets, "answered from the cache");
        task.abort();
    }

    /// The namespace watch fails (its RBAC role lost `watch`: 403, or an API server
    /// away longer than the backoff): what the cache holds may be out of date, so the
    /// selector asks the API server until the watch delivers again. A namespace
    /// labelled meanwhile is never answered "pass through" from the stale cache (its
    /// new pods would start uncaptured).
    #[tokio::test]
    async fn adversarial_a_failing_watch_is_not_answered_from_its_stale_cache() {
        let (s, api) = start();
        api.apply_pod(FakePod::new("b", "plain", "pod-b", NODE).json());
        let agent = Arc::new(FakeAgent::default());
        let task = spawn_synced(&s, &agent).await;
        assert_eq!(
            ask(&s, "b", "plain", "pod-b").await.unwrap(),
            Verdict::PassThrough(UnenrollReason::NotLabelled)
        );
        api.set_mode_of(Kind::Namespace, ApiMode::Refuse(403));
        api.end_watches(Kind::Namespace);
        wait_stale(&s, true).await;
        // Labelled while the watch cannot see it.
        api.apply_namespace("plain", Some("enabled"));
        let gets = api.gets().len();
        let e = ask(&s, "b", "plain", "pod-b").await.unwrap_err();
        assert!(matches!(e, SelectError::Api { .. }), "{e:?}");
        assert_eq!(
            api.gets()[gets..],
            [pod_get("plain", "pod-b"), ns_get("plain")],
            "asked the API server, not the stale cache"
        );
        // The watch delivers again: the cache answers, and is right.
        api.set_mode_of(Kind::Namespace, ApiMode::Serve);
        wait_stale(&s, false).await;
        assert_eq!(
            from_cache(&s, &api, "b", "plain", "pod-b").await,
            Verdict::Capture
        );

        // It fails again and resumes with nothing to deliver (a quiet
        // namespace watch): trusted again once it went twice its longest
        // backoff without failing.
        api.set_mode_of(Kind::Namespace, ApiMode::Refuse(403));
        api.end_watches(Kind::Namespace);
        wait_stale(&s, true).await;
        api.set_mode_of(Kind::Namespace, ApiMode::Serve);
        wait_stale(&s, false).await;
        assert_eq!(
            from_cache(&s, &api, "b", "plain", "pod-b").await,
            Verdict::Capture
        );

        // The API server cannot be reached at all: no label can change
        // there, so the cache answers rather than failing every ADD.
        api.set_mode(ApiMode::Unreachable);
        api.end_watches(Kind::Namespace);
        api.end_watches(Kind::Pod);
        wait_stale(&s, true).await;
        assert_eq!(
            ask(&s, "b", "plain", "pod-b").await.unwrap(),
            Verdict::Capture
        );
        // Still failing (so this came after a failed lookup, not from a
        // cache trusted again).
        assert!(s.cache().stale());
        // A pod the watch has not seen is still an error, never a guess.
        let e = ask(&s, "new", "plain", "pod-new").await.unwrap_err();
        assert!(e.unreachable(), "{e:?}");
        api.set_mode(ApiMode::Serve);
        task.abort();
    }

    /// Once the watch has listed pods and namespaces, the selector answers from its
    /// caches (no GET) and follows what the watch sees.
    #[tokio::test]
    async fn after_the_watch_lists_the_cache_answers() {
        let (s, api) = start();
        api.apply_pod(FakePod::new("a", "mesh", "pod-a", NODE).json());
        api.apply_pod(FakePod::new("b", "plain", "pod-b", NODE).json());
        let agent = Arc::new(FakeAgent::default());
        let task = spawn_synced(&s, &agent).await;
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
        // A known uid under another name is not that pod: the API server
        // decides, on the pod of the name asked about, with no identity.
        let gets = api.gets().len();
        api.apply_pod(
            FakePod::new("c", "mesh", "pod-c", NODE)
                .service_account("c")
                .json(),
        );
        assert_eq!(
            ask_sa(&s, "a", "mesh", "pod-c").await,
            None,
            "the identity of pod-c for uid a"
        );
        assert_eq!(api.gets()[gets], pod_get("mesh", "pod-c"));
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
            agent.hold(&uid, &ns, "");
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

    /// A pod the agent holds with another identity (here: none): the watch enrolls it again
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

    /// A pod labelled `istio.io/dataplane-mode=none` in a namespace labelled
    /// `istio.io/dataplane-mode=ambient` is never captured: the CNI path passes it
    /// through (from the API server, then from the watch's cache), and the watch never
    /// enrolls it, not when its namespace gains ringway's label too, not when the pod
    /// gains `ringway.io/dataplane-mode=enabled` (the opt-out wins), not after a relist.
    /// A captured pod whose label changes from `ambient` to `none` is released.
    #[tokio::test]
    async fn adversarial_an_istio_opt_out_is_never_captured_and_releases() {
        let (s, api) = start();
        api.apply_namespace_labels("amb", &[(ISTIO, "ambient")]);
        let opted_out = || {
            FakePod::new("x", "amb", "pod-x", NODE)
                .service_account("sa-x")
                .istio_mode("none")
                .running(&["10.0.0.8"])
        };
        let switched = || {
            FakePod::new("y", "amb", "pod-y", NODE)
                .service_account("sa-x")
                .running(&["10.0.0.9"])
        };
        api.apply_pod(opted_out().json());
        api.apply_pod(switched().istio_mode("ambient").json());
        let out = Verdict::PassThrough(UnenrollReason::PodOptOut);
        assert_eq!(ask(&s, "x", "amb", "pod-x").await.unwrap(), out);
        assert_eq!(
            ask(&s, "y", "amb", "pod-y").await.unwrap(),
            Verdict::Capture
        );

        // The CNI ADD captured y (the agent holds it with the watch's identity).
        let agent = Arc::new(FakeAgent::default());
        agent.hold("y", "amb", "sa-x");
        let task = spawn_synced(&s, &agent).await;
        assert_eq!(ask(&s, "x", "amb", "pod-x").await.unwrap(), out);

        // Everything else says "enroll": still not. Each watch applies its events in
        // order, so a later event of the same watch whose call is awaited is a
        // barrier: namespace amb2 (after amb's change) enrolls pod b; y's switch to
        // none (after x's change and a relist of the pods) releases y.
        api.apply_pod(
            FakePod::new("b", "amb2", "pod-b", NODE)
                .service_account("sa-x")
                .running(&["10.0.0.10"])
                .json(),
        );
        api.apply_namespace_labels("amb", &[(ISTIO, "ambient"), (RINGWAY, "enabled")]);
        api.apply_namespace("amb2", Some("enabled"));
        api.apply_pod(opted_out().mode("enabled").json());
        api.expire(Kind::Pod);
        api.apply_pod(switched().istio_mode("none").json());
        assert_eq!(
            sorted(agent.wait_calls(2).await),
            [enroll("b"), unenroll("y")]
        );
        assert_eq!(ask(&s, "x", "amb", "pod-x").await.unwrap(), out);
        assert_eq!(ask(&s, "y", "amb", "pod-y").await.unwrap(), out);
        settle().await;
        assert_eq!(agent.calls().len(), 2, "{:?}", agent.calls());
        assert_eq!(agent.enrolled_set(), BTreeSet::from(["b".to_string()]));
        task.abort();
    }
}

/// The annotator against the fake API server: what it patches, when, and how it
/// retries.
mod annotator {
    use super::*;
    use prometheus_client::registry::Registry;
    use ringway_testbed::wait_for_async;

    fn fast() -> AnnotatorConfig {
        AnnotatorConfig {
            retry_min: Duration::from_millis(20),
            retry_max: Duration::from_millis(100),
            request_timeout: Duration::from_millis(200),
        }
    }

    fn web() -> PodRef {
        PodRef {
            uid: "u-web".into(),
            namespace: "shop".into(),
            name: "web-1".into(),
        }
    }

    fn start(config: AnnotatorConfig) -> (Annotator, FakeApiServer) {
        let rt = tokio::runtime::Handle::current();
        let (client, api) = FakeApiServer::start(&rt);
        api.apply_pod(
            FakePod::new("u-web", "shop", "web-1", NODE)
                .annotate("other", "kept")
                .json(),
        );
        (Annotator::start(client, &rt, config), api)
    }

    /// The stored pod's `ambient.istio.io/redirection`.
    fn annotation(api: &FakeApiServer, ns: &str, name: &str) -> Option<String> {
        api.get(Kind::Pod, ns, name)?["metadata"]["annotations"][REDIRECTION_ANNOTATION]
            .as_str()
            .map(str::to_owned)
    }

    /// How long an annotation patch may take to land.
    const WAIT: Duration = Duration::from_secs(10);

    fn metrics(a: &Annotator) -> String {
        let mut r = Registry::default();
        a.register_metrics(&mut r);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &r).unwrap();
        out
    }

    /// The value of the `name` sample with labels `matchers` (0 when absent).
    fn sample(text: &str, name: &str, matchers: &[&str]) -> u64 {
        ringway_testbed::prom::value(text, name, matchers).unwrap_or(0.0) as u64
    }

    fn body(r: &ringway_testbed::kube_api::ApiRequest) -> Value {
        serde_json::from_str(r.body.as_deref().unwrap()).unwrap()
    }

    /// Captured: one merge patch of the pod's status subresource, naming its uid, sets
    /// the annotation (the others kept); released: one more removes it.
    #[tokio::test]
    async fn the_annotation_is_set_once_captured_and_removed_once_released() {
        let (a, api) = start(fast());
        a.captured(&web());
        wait_for_async("the annotation", WAIT, || {
            annotation(&api, "shop", "web-1").as_deref() == Some("enabled")
        })
        .await;
        wait_for_async("nothing pending", WAIT, || a.pending() == 0).await;
        let patches = api.patches();
        assert_eq!(patches.len(), 1, "{patches:?}");
        assert_eq!(patches[0].path, "/api/v1/namespaces/shop/pods/web-1/status");
        assert_eq!(
            patches[0].content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        assert_eq!(
            body(&patches[0]),
            json!({"metadata": {"uid": "u-web",
                "annotations": {"ambient.istio.io/redirection": "enabled"}}})
        );
        a.released(&web());
        wait_for_async("the annotation removed", WAIT, || {
            annotation(&api, "shop", "web-1").is_none()
        })
        .await;
        wait_for_async("nothing pending", WAIT, || a.pending() == 0).await;
        let patches = api.patches();
        assert_eq!(patches.len(), 2, "{patches:?}");
        assert_eq!(
            body(&patches[1]),
            json!({"metadata": {"uid": "u-web",
                "annotations": {"ambient.istio.io/redirection": null}}})
        );
        let pod = api.get(Kind::Pod, "shop", "web-1").unwrap();
        assert_eq!(pod["metadata"]["annotations"], json!({"other": "kept"}));
        let m = metrics(&a);
        let ok = |op: &str| {
            sample(
                &m,
                "ringway_agent_redirection_annotation_patches_total",
                &[&format!("op=\"{op}\""), "outcome=\"ok\""],
            )
        };
        assert_eq!((ok("set"), ok("remove")), (1, 1), "{m}");
        assert!(
            m.contains("ringway_agent_redirection_annotation_pending 0"),
            "{m}"
        );
    }

    /// A refused, unreachable or silent API server: the patch is tried again, with a
    /// doubling delay, counted as an error each time, and lands once the API server
    /// takes it.
    #[tokio::test]
    async fn a_failing_patch_is_retried_with_backoff_until_it_lands() {
        let config = AnnotatorConfig {
            retry_min: Duration::from_millis(40),
            retry_max: Duration::from_millis(160),
            request_timeout: Duration::from_millis(100),
        };
        let (a, api) = start(config);
        api.set_patch_mode(ApiMode::Refuse(403));
        let started = Instant::now();
        a.captured(&web());
        wait_for_async("four refused patches", WAIT, || api.patches().len() >= 4).await;
        // Three waits before the fourth try: 40 + 80 + 160 ms at least.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(280), "{took:?}");
        assert_eq!(a.pending(), 1);
        let errors = || {
            sample(
                &metrics(&a),
                "ringway_agent_redirection_annotation_patches_total",
                &["op=\"set\"", "outcome=\"error\""],
            )
        };
        assert!(errors() >= 3, "{}", metrics(&a));
        assert!(
            metrics(&a).contains("ringway_agent_redirection_annotation_pending 1"),
            "{}",
            metrics(&a)
        );

        // Unreachable, then silent (each patch times out): still tried.
        for mode in [ApiMode::Unreachable, ApiMode::Hang] {
            api.set_patch_mode(mode);
            let (n, e) = (api.patches().len(), errors());
            wait_for_async("two more failed patches", WAIT, || {
                api.patches().len() >= n + 2 && errors() >= e + 2
            })
            .await;
            assert_eq!(annotation(&api, "shop", "web-1"), None, "{mode:?}");
        }
        api.set_patch_mode(ApiMode::Serve);
        wait_for_async("the annotation", WAIT, || {
            annotation(&api, "shop", "web-1").as_deref() == Some("enabled")
        })
        .await;
        wait_for_async("nothing pending", WAIT, || a.pending() == 0).await;
    }

    /// The last wish wins, also over a patch in flight; a pod re-created under the
    /// same name (another uid) is left alone (409: replaced); a pod that is gone
    /// needs nothing (404); neither is tried again.
    #[tokio::test]
    async fn the_last_wish_wins_and_other_pods_are_left_alone() {
        let (a, api) = start(fast());
        api.set_patch_mode(ApiMode::Hold);
        a.captured(&web());
        wait_for_async("the set patch in flight", WAIT, || api.patches().len() == 1).await;
        a.released(&web());
        a.captured(&web());
        a.released(&web());
        api.set_patch_mode(ApiMode::Serve);
        wait_for_async("nothing pending", WAIT, || a.pending() == 0).await;
        let ops: Vec<Value> = api
            .patches()
            .iter()
            .map(|p| body(p)["metadata"]["annotations"][REDIRECTION_ANNOTATION].clone())
            .collect();
        assert_eq!(ops, [json!("enabled"), Value::Null]);
        assert_eq!(annotation(&api, "shop", "web-1"), None);

        // web-1 re-created (uid u-new) and annotated by its own capture; the old
        // pod's release must not touch it.
        api.apply_pod(
            FakePod::new("u-new", "shop", "web-1", NODE)
                .annotate(REDIRECTION_ANNOTATION, REDIRECTION_ENABLED)
                .json(),
        );
        a.released(&web());
        let gone = PodRef {
            uid: "u-gone".into(),
            namespace: "shop".into(),
            name: "gone".into(),
        };
        a.released(&gone);
        wait_for_async("nothing pending", WAIT, || a.pending() == 0).await;
        assert_eq!(
            annotation(&api, "shop", "web-1").as_deref(),
            Some("enabled")
        );
        let m = metrics(&a);
        let series = |outcome: &str| {
            sample(
                &m,
                "ringway_agent_redirection_annotation_patches_total",
                &["op=\"remove\"", &format!("outcome=\"{outcome}\"")],
            )
        };
        assert_eq!((series("replaced"), series("not_found")), (1, 1), "{m}");
        let n = api.patches().len();
        assert_eq!(n, 4, "{:?}", api.patches());
        settle().await;
        assert_eq!(api.patches().len(), n, "tried again");
    }

    /// A wish the API server keeps refusing is dropped when forgotten (its pod is
    /// gone), and not tried again.
    #[tokio::test]
    async fn a_forgotten_wish_is_not_tried_again() {
        let (a, api) = start(fast());
        api.set_patch_mode(ApiMode::Refuse(403));
        a.released(&web());
        wait_for_async("two refused patches", WAIT, || api.patches().len() >= 2).await;
        assert_eq!(a.pending(), 1);
        a.forget("u-web");
        assert_eq!(a.pending(), 0);
        // At most the patch in flight when it was forgotten lands after it.
        settle().await;
        let n = api.patches().len();
        settle().await;
        assert_eq!(api.patches().len(), n, "tried again");
        assert_eq!(a.pending(), 0);
    }
}

/// A static pod: its CNI ADD enrolled it under the kubelet's uid, and the API
/// server's object of it is a mirror pod with a uid of its own, naming that
/// uid in `kubernetes.io/config.mirror` (and with the static pod's name). The
/// watch calls the agent with the uid it holds (an identity update), and
/// never takes the held uid for a gone pod (it once released it after the
/// orphan grace: all its traffic dropped).
#[tokio::test]
async fn a_static_pod_is_known_by_the_uid_its_mirror_names() {
    let mirror = |uid: &str| {
        FakePod::new(uid, "mesh", "pod-static", NODE)
            .service_account("sa-x")
            .running(&["10.0.0.1"])
            .annotate("kubernetes.io/config.mirror", "static")
    };
    let (client, _api) = scripted(
        vec![mirror("mirror").label("app", "web").json()],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    let agent = FakeAgent::with_enrolled(&[("static", "mesh")]);
    agent
        .0
        .lock()
        .unwrap()
        .enrolled
        .get_mut("static")
        .unwrap()
        .service_account = String::new();
    let task = spawn(client, &agent, fast());
    assert_eq!(agent.wait_calls(1).await, [enroll("static")]);
    assert_eq!(agent.identity("static").service_account, "sa-x");
    // Past the orphan grace: nothing released.
    tokio::time::sleep(fast().orphan_grace * 3).await;
    assert_eq!(agent.calls(), [enroll("static")]);
    assert_eq!(agent.enrolled_set(), BTreeSet::from(["static".to_string()]));
    task.abort();
}

/// Anyone who may create pods can put `kubernetes.io/config.mirror` on one:
/// a pod naming another pod's uid under another name is no mirror of it (it
/// would have had the watch unenroll it, its labels deciding), and two pods
/// naming one uid are neither.
#[tokio::test]
async fn adversarial_a_pod_that_names_another_pods_uid_as_its_static_pod_is_ignored() {
    let (client, api) = scripted(
        vec![FakePod::new("hostile", "mesh", "hostile", NODE)
            .service_account("sa-x")
            .running(&["10.0.0.9"])
            .mode("disabled")
            .annotate("kubernetes.io/config.mirror", "victim")
            .json()],
        vec![namespace("mesh", Some("enabled"), "7")],
    );
    let agent = FakeAgent::with_enrolled(&[("victim", "mesh")]);
    let task = spawn(client, &agent, fast());
    tokio::time::sleep(fast().orphan_grace * 3).await;
    // The victim is not listed (it has no object): released as gone after
    // the grace, never unenrolled by the hostile pod's labels.
    let calls = agent.calls();
    assert!(calls.iter().all(|c| *c != enroll("victim")), "{calls:?}");
    assert_eq!(agent.0.lock().unwrap().gone, ["victim"], "{calls:?}");
    // A held static pod: an impostor naming its uid under another name
    // changes nothing (it once had the watch unenroll it); its real mirror
    // is it.
    agent.hold("static", "mesh", "sa-x");
    let w = api.next_watch(Kind::Pod).await;
    w.send(
        "ADDED",
        FakePod::new("impostor", "mesh", "impostor", NODE)
            .service_account("sa-x")
            .running(&["10.0.0.2"])
            .mode("disabled")
            .annotate("kubernetes.io/config.mirror", "static")
            .resource_version("101")
            .json(),
    );
    w.send(
        "ADDED",
        FakePod::new("mirror", "mesh", "pod-static", NODE)
            .service_account("sa-x")
            .running(&["10.0.0.3"])
            .annotate("kubernetes.io/config.mirror", "static")
            .resource_version("102")
            .json(),
    );
    settle().await;
    tokio::time::sleep(fast().orphan_grace * 2).await;
    let calls = agent.calls();
    assert!(
        calls
            .iter()
            .all(|c| *c != enroll("static") && *c != unenroll("static")),
        "{calls:?}"
    );
    assert!(agent.enrolled_set().contains("static"), "{calls:?}");
    task.abort();
}
