//! The watcher's state and its calls to [`Enrollment`]: synchronous, fed one watch event
//! (or a timer tick) at a time by [`super::run_watch_with`]. The pods and namespaces it
//! knows live in the [`Selector`]'s cache, where the CNI path reads them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::runtime::watcher::Event;
use ringway_config::{Backoff, Jitter};
use tokio::time::Instant;
use tracing::{debug, info, trace, warn};

use super::decide::{decide_facts, namespace_enabled, Decision, PodFacts, UnenrollReason};
use super::enrollment::{Enrollment, EnrollmentError};
use super::model::{EnrolledPod, PodRef};
use super::select::{Cache, Selector};

/// The watch's settings: the node, and the timings (defaults from [`WatchConfig::new`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// This node's name (`spec.nodeName` of its pods).
    pub node: String,
    /// First retry delay of a failed enroll/unenroll (500 ms).
    pub retry_min: Duration,
    /// Longest retry delay (30 s).
    pub retry_max: Duration,
    /// How long an enrolled pod missing from a relist is given to show up (30 s).
    pub orphan_grace: Duration,
    /// First delay before the watcher lists/watches again after an error (800 ms).
    pub watch_backoff_min: Duration,
    /// Longest such delay (30 s).
    pub watch_backoff_max: Duration,
    /// After a watch failed, how long without another failure (or an
    /// event) before its cache answers the CNI path again (2 min: twice
    /// the longest backoff, plus what a failing attempt may itself take,
    /// the client's 30 s connect timeout twice over).
    pub trust_after_failure: Duration,
}

impl WatchConfig {
    /// The defaults for `node`.
    pub fn new(node: impl Into<String>) -> WatchConfig {
        WatchConfig {
            node: node.into(),
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            orphan_grace: Duration::from_secs(30),
            watch_backoff_min: Duration::from_millis(800),
            watch_backoff_max: Duration::from_secs(30),
            trust_after_failure: Duration::from_secs(120),
        }
    }

    /// A failed enroll/unenroll's retries: [`WatchConfig::retry_min`] doubling
    /// up to [`WatchConfig::retry_max`], not jittered (one pod's calls to this
    /// node's agent).
    pub(super) fn retry_backoff(&self) -> Backoff {
        Backoff::new(self.retry_min, self.retry_max)
    }

    /// The watchers' backoff after an error: [`WatchConfig::watch_backoff_min`]
    /// doubling up to [`WatchConfig::watch_backoff_max`], each delay cut by up to
    /// half at random so that the agents of every node do not relist at the same
    /// instant after an API server outage; kube's watcher resets it on the next
    /// success.
    pub(super) fn watch_backoff(&self) -> Backoff {
        Backoff::new(self.watch_backoff_min, self.watch_backoff_max).with_jitter(Jitter::Down(0.5))
    }
}

/// A pod whose enroll or unenroll failed (retried with backoff), or that was enrolled
/// but absent from a relist (checked again after the orphan grace).
#[derive(Debug, Clone, Copy)]
struct Retry {
    /// Failed calls so far (none for an orphan check), and so the next delay.
    backoff: Backoff,
    due: Instant,
}

/// The agent's enrolled set (uid -> the identity it holds), read at most once per
/// event and kept in step with the calls made while handling it.
struct Enrolled<'a> {
    source: &'a dyn Enrollment,
    set: Option<HashMap<String, EnrolledPod>>,
}

impl<'a> Enrolled<'a> {
    fn new(source: &'a dyn Enrollment) -> Enrolled<'a> {
        Enrolled { source, set: None }
    }

    fn set(&mut self) -> &mut HashMap<String, EnrolledPod> {
        self.set.get_or_insert_with(|| {
            self.source
                .enrolled()
                .into_iter()
                .map(|p| (p.uid.clone(), p))
                .collect()
        })
    }
}

pub(crate) struct Reconciler {
    enrollment: Arc<dyn Enrollment>,
    config: WatchConfig,
    /// Holds the watched pods and enrolled namespaces (shared with the CNI path).
    selector: Selector,
    /// Pods listed so far during a relist (replaces the cached pods at its end).
    pods_relist: Option<HashMap<String, PodFacts>>,
    namespaces_relist: Option<HashSet<String>>,
    retries: HashMap<String, Retry>,
}

impl Reconciler {
    pub(crate) fn new(
        enrollment: Arc<dyn Enrollment>,
        config: WatchConfig,
        selector: Selector,
    ) -> Reconciler {
        {
            // A watch (re)started on this selector lists everything again.
            let mut cache = selector.cache();
            *cache = Cache::default();
        }
        Reconciler {
            enrollment,
            config,
            selector,
            pods_relist: None,
            namespaces_relist: None,
            retries: HashMap::new(),
        }
    }

    /// Nothing is enrolled or unenrolled before both lists are in: a pod of an enrolled
    /// namespace must not be unenrolled because the namespace was not listed yet.
    fn ready(&self) -> bool {
        self.selector.cache().synced()
    }

    /// Counts one pod or namespace event as applied (see
    /// [`Selector::events_applied`]).
    pub(crate) fn event_applied(&self) {
        self.selector.event_applied();
    }

    /// When [`Reconciler::tick`] has work.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        if !self.ready() {
            return None;
        }
        self.retries.values().map(|r| r.due).min()
    }

    pub(crate) fn pod_event(&mut self, event: Event<Pod>, now: Instant) {
        match event {
            Event::Init => {
                debug!(node = %self.config.node, "listing pods");
                self.pods_relist = Some(HashMap::new());
            }
            Event::InitApply(pod) => {
                if let Some(facts) = PodFacts::from_pod(&pod) {
                    match self.pods_relist.as_mut() {
                        Some(listed) => {
                            listed.insert(facts.uid.clone(), facts);
                        }
                        None => {
                            self.selector.cache().pods.insert(facts.uid.clone(), facts);
                        }
                    }
                }
            }
            Event::InitDone => {
                let pods = {
                    let mut cache = self.selector.cache();
                    if let Some(listed) = self.pods_relist.take() {
                        cache.pods = listed;
                    }
                    cache.pods_synced = true;
                    cache.pods.len()
                };
                debug!(node = %self.config.node, pods, "pods listed");
                self.reconcile_all(now);
            }
            Event::Apply(pod) => {
                let Some(facts) = PodFacts::from_pod(&pod) else {
                    warn!(pod.name = ?pod.metadata.name, "pod without uid ignored");
                    return;
                };
                let uid = facts.uid.clone();
                self.selector.cache().pods.insert(uid.clone(), facts);
                if self.ready() {
                    self.evaluate(&uid, &mut Enrolled::new(&*self.enrollment.clone()));
                }
            }
            Event::Delete(pod) => {
                let Some(uid) = pod.metadata.uid else { return };
                self.selector.cache().pods.remove(&uid);
                if self.ready() {
                    self.evaluate(&uid, &mut Enrolled::new(&*self.enrollment.clone()));
                }
                // Its object is gone: no annotation of it is left to write.
                self.enrollment.pod_deleted(&uid);
            }
        }
    }

    pub(crate) fn namespace_event(&mut self, event: Event<Namespace>, now: Instant) {
        match event {
            Event::Init => self.namespaces_relist = Some(HashSet::new()),
            Event::InitApply(ns) => {
                if let (true, Some(name)) = (namespace_enabled(&ns), ns.metadata.name) {
                    match self.namespaces_relist.as_mut() {
                        Some(listed) => {
                            listed.insert(name);
                        }
                        None => {
                            self.selector.cache().namespaces.insert(name);
                        }
                    }
                }
            }
            Event::InitDone => {
                {
                    let mut cache = self.selector.cache();
                    if let Some(listed) = self.namespaces_relist.take() {
                        cache.namespaces = listed;
                    }
                    cache.namespaces_synced = true;
                    debug!(enabled = ?cache.namespaces, "namespaces listed");
                }
                self.reconcile_all(now);
            }
            Event::Apply(ns) => {
                let enabled = namespace_enabled(&ns);
                let Some(name) = ns.metadata.name else { return };
                let changed = {
                    let mut cache = self.selector.cache();
                    if enabled {
                        cache.namespaces.insert(name.clone())
                    } else {
                        cache.namespaces.remove(&name)
                    }
                };
                if changed {
                    info!(namespace = %name, enabled, "namespace label changed");
                    self.evaluate_namespace(&name);
                }
            }
            // Deleted.
            Event::Delete(ns) => {
                let Some(name) = ns.metadata.name else { return };
                let removed = self.selector.cache().namespaces.remove(&name);
                if removed {
                    info!(namespace = %name, enabled = false, "namespace label changed");
                    self.evaluate_namespace(&name);
                }
            }
        }
    }

    /// Handles the retries and orphan checks that are due.
    pub(crate) fn tick(&mut self, now: Instant) {
        let due: Vec<String> = self
            .retries
            .iter()
            .filter(|(_, r)| r.due <= now)
            .map(|(uid, _)| uid.clone())
            .collect();
        if due.is_empty() {
            return;
        }
        let enrollment = self.enrollment.clone();
        let mut enrolled = Enrolled::new(&*enrollment);
        for uid in due {
            self.evaluate(&uid, &mut enrolled);
        }
    }

    fn evaluate_namespace(&mut self, namespace: &str) {
        if !self.ready() {
            return;
        }
        let uids: Vec<String> = self
            .selector
            .cache()
            .pods
            .values()
            .filter(|p| p.namespace == namespace)
            .map(|p| p.uid.clone())
            .collect();
        let enrollment = self.enrollment.clone();
        let mut enrolled = Enrolled::new(&*enrollment);
        for uid in uids {
            self.evaluate(&uid, &mut enrolled);
        }
    }

    /// After a (re)list: every pod is evaluated, and every enrolled pod that was not
    /// listed is unenrolled if it is still absent after the orphan grace (a pod bound to
    /// this node just after the list was taken may already be enrolled by its CNI ADD).
    fn reconcile_all(&mut self, now: Instant) {
        if !self.ready() {
            return;
        }
        let enrollment = self.enrollment.clone();
        let mut enrolled = Enrolled::new(&*enrollment);
        let uids: Vec<String> = self.selector.cache().pods.keys().cloned().collect();
        for uid in &uids {
            self.evaluate(uid, &mut enrolled);
        }
        let orphans: Vec<String> = {
            let cache = self.selector.cache();
            enrolled
                .set()
                .iter()
                .filter(|(uid, held)| {
                    !cache.pods.contains_key(*uid) && static_mirror(&cache, uid, held).is_none()
                })
                .map(|(uid, _)| uid.clone())
                .collect()
        };
        for uid in &orphans {
            debug!(pod.uid = %uid, grace = ?self.config.orphan_grace, "enrolled pod not listed");
            self.retries.entry(uid.clone()).or_insert(Retry {
                backoff: self.config.retry_backoff(),
                due: now + self.config.orphan_grace,
            });
        }
        info!(
            node = %self.config.node,
            pods = uids.len(),
            enrolled = enrolled.set().len(),
            unlisted = orphans.len(),
            "reconciled pods with the enrolled set"
        );
    }

    /// Decides for one pod (absent: gone) and calls the agent if its state differs:
    /// enroll a pod to enroll that the agent does not hold, or holds with another
    /// identity (another service account than the watch sees); unenroll a pod
    /// to unenroll that it holds.
    ///
    /// The decision is the CNI path's rule ([`super::Verdict`]): an excluded namespace
    /// first ([`Enrollment::excludes`]), then [`decide_facts`] on the cached pod and
    /// namespace, so the watch never unenrolls a pod the CNI ADD captured.
    ///
    /// A pod whose `ambient.istio.io/redirection` annotation disagrees with that (held,
    /// running and without it; not held and with it) is reported to the agent
    /// ([`Enrollment::annotation_seen`]).
    fn evaluate(&mut self, uid: &str, enrolled: &mut Enrolled<'_>) {
        // A static pod is held by the agent under the uid its CNI ADD had
        // (the kubelet's), which its mirror pod (the API's object, a uid of
        // its own) names: the agent is called with that one, the API object
        // is annotated under its own.
        let (facts, ns_enabled, agent_uid) = {
            let cache = self.selector.cache();
            let found = match cache.pods.get(uid) {
                Some(p) => {
                    // A mirror pod: the agent's uid only when the agent holds
                    // that uid as this very pod (see `static_mirror`).
                    let held_as_mirror = p.mirror_of.as_deref().filter(|s| {
                        enrolled
                            .set()
                            .get(*s)
                            .and_then(|held| static_mirror(&cache, s, held))
                            .is_some_and(|m| m.uid == p.uid)
                    });
                    Some((p, held_as_mirror.unwrap_or(uid).to_owned()))
                }
                None => enrolled
                    .set()
                    .get(uid)
                    .and_then(|held| static_mirror(&cache, uid, held))
                    .map(|m| (m, uid.to_owned())),
            };
            match found {
                Some((p, agent_uid)) => (
                    Some(p.clone()),
                    cache.namespaces.contains(&p.namespace),
                    agent_uid,
                ),
                None => (None, false, uid.to_owned()),
            }
        };
        let api_uid = facts.as_ref().map_or(uid, |p| p.uid.as_str()).to_owned();
        let uid = agent_uid.as_str();
        let annotated = facts.as_ref().map(|p| p.redirection);
        let (decision, namespace, name) = match facts {
            Some(p) if self.enrollment.excludes(&p.namespace) => (
                Decision::Unenroll(UnenrollReason::Excluded),
                p.namespace,
                p.name,
            ),
            Some(p) => (decide_facts(&p, ns_enabled), p.namespace, p.name),
            None => (
                Decision::Unenroll(UnenrollReason::Gone),
                String::new(),
                String::new(),
            ),
        };
        match decision {
            Decision::Enroll(mut id) => {
                id.uid = uid.to_owned();
                let wanted = EnrolledPod::from(&id);
                let update = match enrolled.set().get(uid) {
                    Some(held) if *held == wanted => {
                        trace!(pod.uid = %uid, "already enrolled");
                        self.retries.remove(uid);
                        if annotated == Some(false) {
                            self.enrollment
                                .annotation_seen(&pod_ref(&api_uid, &namespace, &name), false);
                        }
                        return;
                    }
                    Some(held) => {
                        info!(
                            pod.uid = %uid,
                            held.name = %held.name,
                            held.namespace = %held.namespace,
                            held.service_account = %held.service_account,
                            pod.service_account = %id.service_account,
                            "the agent holds the pod with another identity: updating it"
                        );
                        true
                    }
                    None => false,
                };
                match self.enrollment.enroll(&id) {
                    Ok(()) => {
                        info!(pod.namespace = %id.namespace, pod.name = %id.name, pod.uid = %uid, pod.ips = ?id.ips, pod.service_account = %id.service_account, update, "enrolled pod");
                        enrolled.set().insert(uid.to_owned(), wanted);
                        self.retries.remove(uid);
                        // Held before and updated (new addresses, another
                        // identity): its mark is still wanted, and this
                        // event may be the only one to say it is gone.
                        if update && annotated == Some(false) {
                            self.enrollment
                                .annotation_seen(&pod_ref(&api_uid, &namespace, &name), false);
                        }
                    }
                    Err(error) => self.retry_later(uid, "enroll", &error),
                }
            }
            Decision::Unenroll(reason) => {
                if !enrolled.set().contains_key(uid) {
                    trace!(pod.uid = %uid, %reason, "not enrolled");
                    self.retries.remove(uid);
                    if annotated == Some(true) {
                        self.enrollment
                            .annotation_seen(&pod_ref(&api_uid, &namespace, &name), true);
                    }
                    return;
                }
                let released = if reason == UnenrollReason::Gone {
                    self.enrollment.release_gone(uid)
                } else {
                    self.enrollment.unenroll(uid)
                };
                match released {
                    Ok(()) => {
                        info!(pod.namespace = %namespace, pod.name = %name, pod.uid = %uid, %reason, "unenrolled pod");
                        enrolled.set().remove(uid);
                        self.retries.remove(uid);
                    }
                    Err(error) => self.retry_later(uid, "unenroll", &error),
                }
            }
            Decision::Ignore(reason) => {
                trace!(pod.uid = %uid, %reason, "left as it is");
                self.retries.remove(uid);
            }
        }
    }

    /// Schedules the next attempt, counted from now (the failed call may have taken a
    /// while).
    fn retry_later(&mut self, uid: &str, call: &str, error: &EnrollmentError) {
        let now = Instant::now();
        let mut backoff = self
            .retries
            .get(uid)
            .map_or_else(|| self.config.retry_backoff(), |r| r.backoff);
        let delay = backoff.next_delay();
        let failures = backoff.failures();
        warn!(pod.uid = %uid, call, %error, failures, retry_in = ?delay, "node agent call failed");
        self.retries.insert(
            uid.to_owned(),
            Retry {
                backoff,
                due: now + delay,
            },
        );
    }
}

/// The mirror pod of the static pod the agent holds as `uid` (`held`): the
/// cached pod whose `kubernetes.io/config.mirror` names `uid` and that has
/// the namespace and name the agent holds it under (the kubelet's CNI ADD
/// gave the static pod's, which its mirror has), when no cached pod has
/// `uid` itself. Anyone who may create pods can put that annotation on one:
/// a pod naming another pod's uid under another name is no mirror of it.
fn static_mirror<'c>(cache: &'c Cache, uid: &str, held: &EnrolledPod) -> Option<&'c PodFacts> {
    if cache.pods.contains_key(uid) {
        return None;
    }
    cache.pods.values().find(|p| {
        p.mirror_of.as_deref() == Some(uid) && p.namespace == held.namespace && p.name == held.name
    })
}

fn pod_ref(uid: &str, namespace: &str, name: &str) -> PodRef {
    PodRef {
        uid: uid.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}
