//! The capture rule the CNI path shares with the watch: [`Selector`] answers "is this
//! pod to be captured?" from the watch's own caches, and asks the API server when the
//! watch has not seen the pod yet.

use std::collections::{HashMap, HashSet};
use std::sync::mpsc::{sync_channel, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::decide::{decide_facts, namespace_enabled, Decision, PodFacts, UnenrollReason};
use super::model::MIRROR_ANNOTATION;

/// How long [`Selector::selects`] waits for the API server (both GETs together).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether a pod is to be captured: the one rule of the CNI path and the watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Capture the pod (the watch's [`Decision::Enroll`] or [`Decision::Ignore`]: a
    /// wanted pod, maybe not running yet).
    Capture,
    /// Never capture it (the watch's [`Decision::Unenroll`]); the CNI ADD passes it
    /// through.
    PassThrough(UnenrollReason),
}

impl Verdict {
    /// The verdict of a watch decision: the watch unenrolls exactly the pods the CNI
    /// path passes through.
    pub fn of(decision: &Decision) -> Verdict {
        match decision {
            Decision::Unenroll(reason) => Verdict::PassThrough(*reason),
            Decision::Enroll(_) | Decision::Ignore(_) => Verdict::Capture,
        }
    }
}

/// What [`Selector::select`] found out about a pod: whether to capture it and,
/// when the watch or the API server knows the pod under that uid, its service
/// account (`spec.serviceAccountName`). `None` when nothing says it: the CNI
/// ADD then never guesses one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selected {
    /// Capture or pass through.
    pub verdict: Verdict,
    /// The pod's service account, when known for this uid.
    pub service_account: Option<String>,
}

/// [`Selector::select_by_name`]'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ByName {
    /// The pod: the uid to hold it by, and the rule's answer for it.
    Found {
        /// Its uid (a static pod's own, for its mirror).
        uid: String,
        /// Capture or pass through, and its service account.
        selected: Selected,
    },
    /// No pod of that name counts (none, another node's, being deleted, a
    /// mirror naming another pod): `verdict` is its namespace's, as for any
    /// pod the API server does not have; capturing it needs the uid.
    Unknown {
        /// What the namespace says.
        verdict: Verdict,
        /// Why no pod counts, in words.
        why: String,
    },
}

/// Why [`Selector::selects`] has no answer. Every case is "try again later": the CNI
/// ADD fails with code 11 rather than guess (see the module docs of [`super`]).
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    /// A GET failed: the API server is unreachable, or answered with an error (a 403
    /// means the agent's RBAC role lacks `get` on pods or namespaces).
    #[error("cannot read {what} from the Kubernetes API server: {source}")]
    Api {
        /// `pod <namespace>/<name>` or `namespace <name>`.
        what: String,
        /// What the client saw.
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("no answer from the Kubernetes API server about pod {pod} within {} ms", timeout.as_millis())]
    Timeout {
        /// `<namespace>/<name>`.
        pod: String,
        /// [`LOOKUP_TIMEOUT`] or the selector's own.
        timeout: Duration,
    },
    /// The runtime the client runs on is gone (the agent is stopping).
    #[error("the Kubernetes API client is stopped")]
    Stopped,
}

impl SelectError {
    /// The API server could not be reached: the connection or the HTTP
    /// exchange failed. Not an answer with an error status (a refusal), not
    /// a slow answer (it is up, and may have changed), not a failure to
    /// authenticate or to read what it sent.
    pub fn unreachable(&self) -> bool {
        match self {
            SelectError::Api { source, .. } => {
                matches!(source, kube::Error::HyperError(_) | kube::Error::Service(_))
            }
            SelectError::Timeout { .. } | SelectError::Stopped => false,
        }
    }
}

/// What the watch knows: this node's pods and the names of the enrolled namespaces.
/// Written by the watch only; read by [`Selector::selects`].
#[derive(Debug, Default)]
pub(crate) struct Cache {
    /// This node's pods by uid.
    pub(crate) pods: HashMap<String, PodFacts>,
    /// Names of the namespaces whose labels enroll their pods
    /// (`ringway.io/dataplane-mode=enabled` or `istio.io/dataplane-mode=ambient`).
    pub(crate) namespaces: HashSet<String>,
    pub(crate) pods_synced: bool,
    pub(crate) namespaces_synced: bool,
    /// The pod watch failed and has not delivered since: what it holds may be
    /// out of date until then. A watch that resumed with nothing to deliver
    /// reports no more failures: once its retries would have failed again
    /// (twice the longest backoff after the last failure) it is trusted.
    pub(crate) pods_stale_until: Option<std::time::Instant>,
    /// The same, for the namespace watch.
    pub(crate) namespaces_stale_until: Option<std::time::Instant>,
}

impl Cache {
    /// Both lists are in: the cache can answer (until then the watch decides nothing
    /// and the selector asks the API server).
    pub(crate) fn synced(&self) -> bool {
        self.pods_synced && self.namespaces_synced
    }

    /// Listed, and neither watch failed since it last delivered: the CNI
    /// path may answer from it. A watch that fails (an RBAC change, an API
    /// server away longer than its backoff) would otherwise leave a
    /// namespace labelled meanwhile looking unlabelled, and its new pods
    /// would start uncaptured.
    pub(crate) fn answers(&self) -> bool {
        let now = std::time::Instant::now();
        let fresh = |until: Option<std::time::Instant>| until.is_none_or(|t| now >= t);
        self.synced() && fresh(self.pods_stale_until) && fresh(self.namespaces_stale_until)
    }

    /// Whether the last failure of either watch is still recent (see
    /// [`Cache::answers`]).
    pub(crate) fn stale(&self) -> bool {
        self.synced() && !self.answers()
    }

    /// The decision for a cached pod.
    pub(crate) fn decide(&self, uid: &str) -> Option<Decision> {
        let pod = self.pods.get(uid)?;
        Some(decide_facts(pod, self.namespaces.contains(&pod.namespace)))
    }
}

/// The capture rule of a node in a Kubernetes cluster, shared by the CNI path and the
/// watch ([`super::run_watch`] fills its caches). Cheap to clone.
///
/// [`Selector::selects`] answers from the watch's caches when they hold the pod, else
/// (the CNI ADD usually runs before the watch sees a new pod) GETs the pod and, when
/// its labels leave the answer to its namespace, the namespace, within
/// [`LOOKUP_TIMEOUT`]. The rule is [`super::decide`]'s: a pod is captured unless the
/// watch would unenroll it.
#[derive(Clone)]
pub struct Selector(Arc<Inner>);

struct Inner {
    client: Client,
    runtime: tokio::runtime::Handle,
    lookup_timeout: Duration,
    cache: Mutex<Cache>,
    /// Pod and namespace watch events the watch has finished applying.
    events: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cache = self.cache();
        f.debug_struct("Selector")
            .field("lookup_timeout", &self.0.lookup_timeout)
            .field("synced", &cache.synced())
            .field("pods", &cache.pods.len())
            .field("enabled_namespaces", &cache.namespaces.len())
            .finish_non_exhaustive()
    }
}

impl Selector {
    /// A selector whose API lookups run on `runtime` (the one `client` was built
    /// in, which must keep running), with [`LOOKUP_TIMEOUT`].
    pub fn new(client: Client, runtime: tokio::runtime::Handle) -> Selector {
        Selector::with_lookup_timeout(client, runtime, LOOKUP_TIMEOUT)
    }

    /// [`Selector::new`] with another lookup timeout.
    pub fn with_lookup_timeout(
        client: Client,
        runtime: tokio::runtime::Handle,
        lookup_timeout: Duration,
    ) -> Selector {
        Selector(Arc::new(Inner {
            client,
            runtime,
            lookup_timeout,
            cache: Mutex::new(Cache::default()),
            events: std::sync::atomic::AtomicU64::new(0),
        }))
    }

    /// The API client (the watch uses it too).
    pub fn client(&self) -> &Client {
        &self.0.client
    }

    /// Whether the watch has listed both pods and namespaces (the cache answers).
    pub fn synced(&self) -> bool {
        self.cache().synced()
    }

    /// How many pod and namespace watch events the watch on this selector
    /// has finished applying (enrollment calls included): an observer that
    /// must know the watch caught up with the API server waits on it.
    pub fn events_applied(&self) -> u64 {
        self.0.events.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn event_applied(&self) {
        self.0
            .events
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn cache(&self) -> MutexGuard<'_, Cache> {
        self.0.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether pod `uid` (`namespace`/`name`) is to be captured.
    ///
    /// Blocking (at most the lookup timeout): call it from a thread that is not one of
    /// the runtime's own (the agent's CNI threads), never from async code.
    pub fn selects(&self, uid: &str, namespace: &str, name: &str) -> Result<Verdict, SelectError> {
        self.select(uid, namespace, name).map(|s| s.verdict)
    }

    /// [`Selector::selects`], with the pod's service account when the watch's cache or
    /// the API server holds the pod under `uid` (or its mirror pod, for a static pod).
    pub fn select(&self, uid: &str, namespace: &str, name: &str) -> Result<Selected, SelectError> {
        // What the watch's cache says, and whether it may be behind (a watch
        // failed lately).
        let (cached, stale) = {
            let cache = self.cache();
            // Only the very pod: a uid under another namespace or name is
            // not the request's pod (the API server decides then).
            let same = cache
                .pods
                .get(uid)
                .is_some_and(|p| p.namespace == namespace && p.name == name);
            let cached = (cache.synced() && same).then(|| {
                cache.decide(uid).map(|d| {
                    // Known when the API has the pod; empty when the pod
                    // has none (no identity, never `default`).
                    let sa = cache.pods.get(uid).map(|p| p.service_account.clone());
                    Selected {
                        verdict: Verdict::of(&d),
                        service_account: sa,
                    }
                })
            });
            (cached.flatten(), cache.stale())
        };
        if let (Some(selected), false) = (&cached, stale) {
            debug!(pod.uid = %uid, verdict = ?selected.verdict, source = "watch cache", "capture rule");
            return Ok(selected.clone());
        }
        let started = Instant::now();
        let (client, ns, n, u) = (
            self.0.client.clone(),
            namespace.to_owned(),
            name.to_owned(),
            uid.to_owned(),
        );
        let answer = self.blocking(
            namespace,
            name,
            async move { lookup(client, &u, &ns, &n).await },
        );
        if let Ok(selected) = &answer {
            info!(pod.uid = %uid, pod.namespace = %namespace, pod.name = %name, verdict = ?selected.verdict,
                pod.service_account = selected.service_account.as_deref().unwrap_or(""),
                source = "API server", took = ?started.elapsed(), "capture rule");
        }
        match (answer, cached) {
            // The watch failed because the API server cannot be reached, and
            // it still cannot: nothing can have changed there since the
            // watch last delivered, so the cache answers. An API server that
            // answers with a refusal (403: the watch's RBAC role changed)
            // fails the ADD instead: labels may have changed meanwhile.
            (Err(e), Some(selected)) if e.unreachable() => {
                warn!(pod.uid = %uid, pod.namespace = %namespace, pod.name = %name, verdict = ?selected.verdict, error = %e,
                    "the API server cannot be reached: the watch's cache answers");
                Ok(selected)
            }
            (answer, _) => answer,
        }
    }
}

impl Selector {
    /// The capture rule for a CNI request whose runtime gave no pod uid
    /// (`K8S_POD_UID`), with the uid the agent is to hold the pod by.
    ///
    /// The API server's pod of that name is always asked for (the watch's
    /// cache may still hold an older pod of the name). It counts only when
    /// it is on `node` and not being deleted; its uid is the pod's own, or
    /// for a static pod's mirror the static pod's (`kubernetes.io/config.mirror`),
    /// unless that names a pod the watch knows under its own uid (anyone who
    /// may create pods can set the annotation). Otherwise the pod is
    /// [`ByName::Unknown`] and its namespace decides, as for a pod the API
    /// server does not have.
    ///
    /// Blocking (at most the lookup timeout), as [`Selector::selects`].
    pub fn select_by_name(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
    ) -> Result<ByName, SelectError> {
        let (selector, ns, n, node) = (
            self.clone(),
            namespace.to_owned(),
            name.to_owned(),
            node.to_owned(),
        );
        let client = self.0.client.clone();
        let answer = self.blocking(namespace, name, async move {
            let pod = Api::<Pod>::namespaced(client.clone(), &ns)
                .get_opt(&n)
                .await
                .map_err(|source| SelectError::Api {
                    what: format!("pod {ns}/{n}"),
                    source,
                })?;
            let found = match pod.as_ref().map(|p| (p, PodFacts::from_pod(p))) {
                None | Some((_, None)) => Err("the API server has no such pod".to_owned()),
                Some((p, Some(facts))) => {
                    let on = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
                    if on != Some(node.as_str()) {
                        Err(format!(
                            "the API server's pod of that name is on node {:?}, not this node ({node:?})",
                            on.unwrap_or("")
                        ))
                    } else if facts.terminating {
                        Err("the API server's pod of that name is being deleted".to_owned())
                    } else {
                        match facts.mirror_of {
                            Some(m) if selector.cache().pods.contains_key(&m) => Err(format!(
                                "the API server's pod of that name names pod {m} as its static \
                                 pod, but that uid is another pod's"
                            )),
                            Some(m) => Ok(m),
                            None => Ok(facts.uid),
                        }
                    }
                }
            };
            match found {
                Ok(uid) => {
                    let selected = lookup_in(client, pod.as_ref(), &uid, &ns, &n).await?;
                    Ok(ByName::Found { uid, selected })
                }
                Err(why) => {
                    let selected = lookup_in(client, None, "", &ns, &n).await?;
                    Ok(ByName::Unknown {
                        verdict: selected.verdict,
                        why,
                    })
                }
            }
        });
        if let Ok(by_name) = &answer {
            match by_name {
                ByName::Found { uid, selected } => {
                    info!(pod.uid = %uid, pod.namespace = %namespace, pod.name = %name, verdict = ?selected.verdict,
                        source = "API server", "the runtime gave no pod uid: the API server's pod of that name")
                }
                ByName::Unknown { verdict, why } => {
                    info!(pod.namespace = %namespace, pod.name = %name, verdict = ?verdict, %why,
                        source = "API server", "the runtime gave no pod uid and no pod of that name counts: its namespace decides")
                }
            }
        }
        answer
    }

    /// Runs `lookup` on the client's runtime and waits for it, at most the
    /// lookup timeout (about pod `namespace`/`name`, for the error).
    fn blocking<T: Send + 'static>(
        &self,
        namespace: &str,
        name: &str,
        lookup: impl std::future::Future<Output = Result<T, SelectError>> + Send + 'static,
    ) -> Result<T, SelectError> {
        let (tx, rx) = sync_channel(1);
        let task = self.0.runtime.spawn(async move {
            let _ = tx.send(lookup.await);
        });
        match rx.recv_timeout(self.0.lookup_timeout) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => {
                task.abort();
                Err(SelectError::Timeout {
                    pod: format!("{namespace}/{name}"),
                    timeout: self.0.lookup_timeout,
                })
            }
            // The task was dropped unrun: the runtime is shut down.
            Err(RecvTimeoutError::Disconnected) => Err(SelectError::Stopped),
        }
    }
}

/// GETs the pod and, when its own labels do not settle it, its namespace.
async fn lookup(
    client: Client,
    uid: &str,
    namespace: &str,
    name: &str,
) -> Result<Selected, SelectError> {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|source| SelectError::Api {
            what: format!("pod {namespace}/{name}"),
            source,
        })?;
    lookup_in(client, pod.as_ref(), uid, namespace, name).await
}

/// [`lookup`] once the pod is read (`None`: the API server has none): its
/// namespace is read when the pod's own labels do not settle it.
async fn lookup_in(
    client: Client,
    pod: Option<&Pod>,
    uid: &str,
    namespace: &str,
    name: &str,
) -> Result<Selected, SelectError> {
    let api_error = |what: String| move |source: kube::Error| SelectError::Api { what, source };
    // The service account counts only for this very pod: a pod re-created under the
    // same name may run as another one.
    let mirror_of = |p: &Pod| {
        p.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MIRROR_ANNOTATION))
            .is_some_and(|m| m == uid)
    };
    let facts = match pod.and_then(PodFacts::from_pod) {
        Some(facts) => {
            if facts.uid != uid {
                // A static pod (its mirror pod has a uid of its own), or a pod re-created
                // under the same name: its labels and namespace are what count.
                info!(pod.uid = %uid, api.uid = %facts.uid, pod.namespace = %namespace, pod.name = %name,
                    "the API server's pod of that name has another uid: deciding on it");
            }
            facts
        }
        None => {
            info!(pod.uid = %uid, pod.namespace = %namespace, pod.name = %name,
                "the API server has no such pod (deleted, or a static pod without its mirror yet): its namespace decides");
            PodFacts::unknown(uid, namespace, name)
        }
    };
    // Known when the API has the pod (empty: it has none, so no identity);
    // unknown (`None`) when it has no such pod.
    let service_account = pod
        .filter(|p| facts.uid == uid || mirror_of(p))
        .map(|_| facts.service_account.clone());
    let (plain, enabled) = (
        Verdict::of(&decide_facts(&facts, false)),
        Verdict::of(&decide_facts(&facts, true)),
    );
    if plain == enabled {
        return Ok(Selected {
            verdict: plain,
            service_account,
        });
    }
    let ns = Api::<Namespace>::all(client)
        .get_opt(namespace)
        .await
        .map_err(api_error(format!("namespace {namespace}")))?;
    let verdict = if ns.as_ref().is_some_and(namespace_enabled) {
        enabled
    } else {
        plain
    };
    Ok(Selected {
        verdict,
        service_account,
    })
}
