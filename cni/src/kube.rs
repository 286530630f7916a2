//! Enrollment of running pods from a Kubernetes watch: the node agent's second source of
//! pods besides the CNI plugin (which captures pods as they are created), and the rule
//! both follow.
//!
//! [`run_watch`] watches this node's pods (field selector `spec.nodeName=<node>`) and
//! every namespace (keeping the names of those whose labels enroll their pods), and
//! calls the agent through the [`Enrollment`] trait. Namespaces are not label-selected:
//! either `ringway.io/dataplane-mode=enabled` or the Istio ambient mesh's
//! `istio.io/dataplane-mode=ambient` enrolls one, no one selector says "either", and two
//! selected watches cannot order an update that moves a namespace from one label to the
//! other (its pods would be released and captured again; see
//! `ringway_config::enrollment`, "Watching the namespaces"). The module is a thin layer:
//! - [`decide`] is the whole policy, a pure function of a pod and its namespace;
//! - [`Selector`] holds what the watch knows and answers the CNI path's question
//!   "capture this pod?" with the same policy ([`Verdict`]);
//! - `reconcile` keeps the watched state (in the selector) and turns decisions into calls;
//! - [`run_watch`] only feeds it the events of kube's watcher and timer ticks.
//!
//! Its modules are layers, each using only those listed before it: `model` (the pod
//! identity, [`PodRef`], [`EnrolledPod`], the annotation's name) at the bottom;
//! `decide` (the pod facts and the [`Decision`]); `enrollment` (the
//! [`Enrollment`] trait); `select` ([`Selector`]); `annotate` ([`Annotator`]);
//! `reconcile` (the watch's state and calls, [`WatchConfig`]); this module, the
//! watch itself, on top.
//!
//! # One rule for the CNI ADD and the watch
//! A pod is captured unless its namespace is excluded by the agent
//! ([`Enrollment::excludes`]) or [`decide`] says [`Unenroll`](Decision::Unenroll)
//! (hostNetwork, opted out, neither pod nor namespace enrolled by a label, finished). The CNI ADD asks [`Selector::selects`]: from the watch's caches when they
//! hold the pod, else (a new pod: the ADD usually runs before the watch sees it) from the
//! API server, GETting the pod and, when its labels leave the answer to its namespace,
//! the namespace, within [`LOOKUP_TIMEOUT`] (2 s). The API server's object counts even
//! when its uid is not the ADD's (a static pod's mirror); a pod it does not know is
//! decided by its namespace alone. An ADD without a uid asks
//! [`Selector::select_by_name`], which always GETs the pod (the cache may hold an
//! older pod of that name) and counts it only on this node and not being deleted.
//! A pod the rule passes over is passed straight through by the ADD; the watch unenrolls exactly those pods and enrolls the others once they
//! run, so neither undoes the other.
//!
//! When the API server cannot be read at ADD time (unreachable, timeout, an RBAC
//! refusal) the ADD fails with code 11 ("try again later", [`SelectError`]) rather than
//! guess. Guessing "capture" would put pods that are not in the mesh (or opted out of
//! it) behind the proxy, to be unenrolled again by the watch: their traffic would change
//! under them twice. Guessing "pass through" would start a pod of a labelled namespace
//! uncaptured: a hole in the mesh's policy (fail open) until the watch sees the pod
//! running and enrolls it, and its connections opened meanwhile stay uncaptured.
//! Failing keeps the pod in ContainerCreating while the kubelet retries: an availability
//! cost only for pods whose ADD comes during an API outage before the watch has seen
//! them, and only while the outage lasts. Pods the watch already holds are answered
//! from its caches and do not depend on the API server. A watch that failed is not
//! trusted until it delivers again (or has gone [`WatchConfig::trust_after_failure`]
//! without failing): meanwhile the ADD asks the API server, since a namespace
//! labelled while the watch could not see it would otherwise start its pods
//! uncaptured; only when the connection to the API server fails does the cache
//! answer (a refusal or a slow answer fails the ADD). The reference mesh's plugin makes the same choice (its ADD fails
//! when it cannot read the pod).
//!
//! # The decision ([`decide`])
//! The labels are ringway's `ringway.io/dataplane-mode` and the Istio ambient mesh's
//! `istio.io/dataplane-mode` (the rule and its precedence: [`ringway_config::enrollment`]).
//!
//! | pod | decision |
//! | --- | --- |
//! | `spec.hostNetwork` | [`Unenroll`](Decision::Unenroll) (never enrolled: its netns is the node's) |
//! | opted out: `ringway.io/dataplane-mode=disabled` or `istio.io/dataplane-mode=none` | Unenroll (whatever the other label and the namespace say) |
//! | neither the pod nor its namespace labelled `ringway.io/dataplane-mode=enabled` or `istio.io/dataplane-mode=ambient` | Unenroll |
//! | wanted, phase `Succeeded`/`Failed` | Unenroll |
//! | wanted, `deletionTimestamp` set | [`Ignore`](Decision::Ignore): stays captured through graceful termination |
//! | wanted, not `Running` yet, or no IP yet | Ignore: the CNI ADD captures new pods |
//! | wanted, running with an IP | [`Enroll`](Decision::Enroll) |
//!
//! Any other value of either label counts as no label.
//!
//! # Calls to the agent
//! - The agent's [`Enrollment::enrolled`] set is the truth (the CNI plugin enrolls pods
//!   too): `enroll` is called only for a pod to enroll that is not in it, or that the
//!   agent holds with another identity (name, namespace, service account: a pod the CNI
//!   ADD enrolled from a file-mode rule that the API server contradicts), `unenroll` only for one
//!   that is in it, so repeated MODIFIED events (status updates, annotation changes)
//!   cost nothing.
//! - Nothing is called before both the pod and the namespace lists are in.
//! - Pod deleted: `release_gone` (the proxies drop it, its rules stay until its
//!   namespace goes: it may still run). Namespace label changed: its pods are decided
//!   again.
//! - After every (re)list (start, or a watch that expired with 410 Gone): every pod is
//!   decided again, and an enrolled pod that was not listed is released the same way
//!   when it is still unknown [`WatchConfig::orphan_grace`] later (a pod bound just
//!   after the list was taken may already be enrolled by its CNI ADD; its ADDED event
//!   will come).
//! - The pods' [`REDIRECTION_ANNOTATION`] (`ambient.istio.io/redirection`, which the
//!   agent sets on the pods it captures, see [`Annotator`]): a running pod the agent holds
//!   without it, or a pod the rule passes over with it, is reported to the agent
//!   ([`Enrollment::annotation_seen`]), which puts it right; so an annotation lost while
//!   the agent was down, or written by someone else, is repaired from the watch. A pod
//!   deleted from the API server is reported too ([`Enrollment::pod_deleted`]): its
//!   pending wishes are dropped.
//! - A failed `enroll`/`unenroll` is retried with exponential backoff
//!   ([`WatchConfig::retry_min`] doubling up to [`WatchConfig::retry_max`]), deciding
//!   again each time (the pod may have changed or gone meanwhile).
//! - The calls are made on tokio's blocking pool, one at a time, never on the runtime's
//!   own threads: the agent may block (a ZDS add waits for the proxy's ack) and may need
//!   the same runtime to make progress.
//!
//! Watch errors (API server unreachable, 403) are logged at warn and retried by the
//! watcher with backoff; the last known state stays in effect meanwhile.

mod annotate;
mod decide;
mod enrollment;
mod model;
mod reconcile;
mod select;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use tokio::time::Instant;
use tracing::{error, info, warn};

pub use self::annotate::{Annotator, AnnotatorConfig, PatchError};
pub use self::decide::{
    decide, namespace_enabled, Decision, IgnoreReason, PodMode, UnenrollReason,
    DATAPLANE_MODE_DISABLED, DATAPLANE_MODE_ENABLED, DATAPLANE_MODE_LABEL,
    ISTIO_DATAPLANE_MODE_AMBIENT, ISTIO_DATAPLANE_MODE_LABEL, ISTIO_DATAPLANE_MODE_NONE,
};
pub use self::enrollment::{Enrollment, EnrollmentError};
pub use self::model::{
    EnrolledPod, PodIdentity, PodRef, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED,
};
use self::reconcile::Reconciler;
pub use self::reconcile::WatchConfig;
pub use self::select::{ByName, SelectError, Selected, Selector, Verdict, LOOKUP_TIMEOUT};
use ::kube::runtime::{watcher, WatchStreamExt};
use ::kube::Api;
pub use ::kube::Client;

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Neither in-cluster config (service account token and CA, `KUBERNETES_SERVICE_*`)
    /// nor a kubeconfig was found or usable.
    #[error("no Kubernetes API config: {0}")]
    Config(#[source] ::kube::config::InferConfigError),
    /// The config was found but no client could be built from it (bad CA, bad URL).
    #[error("cannot build Kubernetes API client: {0}")]
    Client(#[source] ::kube::Error),
}

/// A client for the API server: in-cluster config when running in a pod (the service
/// account's token and CA), else the kubeconfig (`KUBECONFIG`, `~/.kube/config`).
/// Does not contact the server.
pub async fn connect() -> Result<Client, ConnectError> {
    let config = ::kube::Config::infer()
        .await
        .map_err(ConnectError::Config)?;
    info!(api.url = %config.cluster_url, "Kubernetes API config");
    Client::try_from(config).map_err(ConnectError::Client)
}

/// Watches this node's pods and the namespaces with `selector`'s client, keeps what it
/// sees in `selector` (for the CNI path) and the agent's enrolled set in line (see the
/// module docs). Runs until the future is dropped (abort its task to stop it): watch
/// errors are retried, never returned. One watch per selector.
pub async fn run_watch(selector: Selector, node: String, enrollment: Arc<dyn Enrollment>) {
    run_watch_with(selector, WatchConfig::new(node), enrollment).await
}

/// [`run_watch`] with explicit timings.
pub async fn run_watch_with(
    selector: Selector,
    config: WatchConfig,
    enrollment: Arc<dyn Enrollment>,
) {
    let client = selector.client().clone();
    let backoff = || config.watch_backoff();
    let pods = watcher(
        Api::<Pod>::all(client.clone()),
        pod_watch_config(&config.node),
    )
    .backoff(backoff())
    .map(Input::Pod);
    let namespaces = watcher(Api::<Namespace>::all(client), namespace_watch_config())
        .backoff(backoff())
        .map(Input::Namespace);
    let mut inputs = std::pin::pin!(futures::stream::select(pods, namespaces));
    info!(node = %config.node, "watching pods and namespaces");

    let freshness = selector.clone();
    // After a failure, a watch is trusted again once it delivers, or once
    // it has gone this long without failing again (its retries report
    // each failure).
    let quiet = config.trust_after_failure;
    let mut reconciler = Reconciler::new(enrollment, config, selector);
    loop {
        let input = tokio::select! {
            input = inputs.next() => match input {
                Some(input) => input,
                // kube's watcher streams never end.
                None => {
                    error!("pod/namespace watch ended");
                    return;
                }
            },
            () = sleep_until(reconciler.next_due()) => Input::Tick,
        };
        // A failed watch's cache may be out of date: the CNI path asks the
        // API server until that watch delivers again (an event, or a relist
        // done).
        match &input {
            Input::Pod(Err(e)) => {
                warn!(error = %e, "pod watch failed, retrying; CNI ADD asks the API server meanwhile");
                freshness.cache().pods_stale_until = Some(std::time::Instant::now() + quiet);
                continue;
            }
            Input::Namespace(Err(e)) => {
                warn!(error = %e, "namespace watch failed, retrying; CNI ADD asks the API server meanwhile");
                freshness.cache().namespaces_stale_until = Some(std::time::Instant::now() + quiet);
                continue;
            }
            _ => {}
        }
        // Which watch this event shows delivering again (cleared once the
        // event is applied, so the cache answers with it).
        let delivered = match &input {
            Input::Pod(Ok(
                watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
            )) => Some(Watched::Pods),
            Input::Namespace(Ok(
                watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
            )) => Some(Watched::Namespaces),
            _ => None,
        };
        let now = Instant::now();
        if let Input::Pod(Ok(event @ (watcher::Event::Init | watcher::Event::InitApply(_)))) = input
        {
            // Only buffers the listed pod: no agent call, no need for a blocking thread.
            reconciler.pod_event(event, now);
            reconciler.event_applied();
            continue;
        }
        let task = tokio::task::spawn_blocking(move || {
            match input {
                Input::Pod(Ok(event)) => {
                    reconciler.pod_event(event, now);
                    reconciler.event_applied();
                }
                Input::Namespace(Ok(event)) => {
                    reconciler.namespace_event(event, now);
                    reconciler.event_applied();
                }
                Input::Tick => reconciler.tick(now),
                Input::Pod(Err(_)) | Input::Namespace(Err(_)) => {}
            }
            reconciler
        });
        reconciler = match task.await {
            Ok(r) => r,
            // A panic in the agent's Enrollment: not ours to hide.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down.
            Err(_) => return,
        };
        match delivered {
            Some(Watched::Pods) => freshness.cache().pods_stale_until = None,
            Some(Watched::Namespaces) => freshness.cache().namespaces_stale_until = None,
            None => {}
        }
    }
}

/// The two watches.
enum Watched {
    Pods,
    Namespaces,
}

/// This node's pods.
fn pod_watch_config(node: &str) -> watcher::Config {
    watcher::Config::default().fields(&format!("spec.nodeName={node}"))
}

/// Every namespace: either of two labels enrolls one, and no label selector says
/// "either" (see `ringway_config::enrollment`, "Watching the namespaces"). Only the
/// names of the enrolled ones are kept.
fn namespace_watch_config() -> watcher::Config {
    watcher::Config::default()
}

#[expect(
    clippy::large_enum_variant,
    reason = "one value at a time, moved to the blocking pool; a box would cost an allocation per event"
)]
enum Input {
    Pod(Result<watcher::Event<Pod>, watcher::Error>),
    Namespace(Result<watcher::Event<Namespace>, watcher::Error>),
    Tick,
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
