//! The `ambient.istio.io/redirection: enabled` annotation on the pods the agent captures,
//! as the Istio ambient mesh's CNI agent writes it: its control plane and its sidecars
//! read it to know that a pod's traffic goes through the node proxy. [`Annotator`]
//! keeps it in step with what the agent holds.
//!
//! - **When.** The agent calls [`Annotator::captured`] once a pod's capture rules are in
//!   place and the proxy has acked its `Add`, and [`Annotator::released`] when it lets a
//!   pod go (unenroll: CNI DEL or GC, the watch, a failed re-enroll that dropped it).
//!   Both only queue the wish and return: a PATCH never blocks, slows or fails a CNI ADD
//!   (the pod's network must be ready when its app starts).
//! - **How.** A JSON merge patch of the pod's `status` subresource (as the reference
//!   does: `pods/status` may change the metadata but not the spec, so the agent's RBAC
//!   role needs `patch` on `pods/status` only, never on `pods`):
//!   `{"metadata": {"uid": U, "annotations": {"ambient.istio.io/redirection": "enabled"}}}`,
//!   `null` to remove it. The uid makes the patch apply to that very pod only: the API
//!   server refuses to change a uid, so a patch meant for a pod that was deleted and
//!   re-created under its name (a StatefulSet's) fails (409 or 422) instead of marking
//!   the new one.
//! - **Retries.** One patch at a time, on the agent's Kubernetes runtime. A failed patch
//!   (unreachable, timeout after [`AnnotatorConfig::request_timeout`], refused: a 403
//!   means the RBAC role lacks `patch` on `pods/status`) is logged at warn, counted
//!   (`ringway_agent_redirection_annotation_patches_total{outcome="error"}`) and tried
//!   again after [`AnnotatorConfig::retry_min`] doubling up to
//!   [`AnnotatorConfig::retry_max`], until it succeeds or a newer wish for the pod
//!   replaces it (the last wish wins: set then removed means removed). A pod that is gone
//!   (404) or replaced (409, 422) needs nothing more: the wish is dropped, counted as
//!   `not_found` or `replaced`.
//! - **Repair.** The wishes live in memory: an agent stopped with some pending (or a pod
//!   annotated by hand) is put right by the Kubernetes watch, which sees each pod's
//!   annotation and tells the agent when it disagrees with what the agent holds
//!   ([`super::Enrollment::annotation_seen`]): a held pod without it gets it again, a pod
//!   the agent does not hold loses it. A pod the watch sees deleted takes its wishes
//!   with it ([`Annotator::forget`]), so wishes the API server keeps refusing (a
//!   missing RBAC rule) stay bounded by the node's pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use ringway_config::Backoff;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::model::{PodRef, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED};

/// The field manager named in the patches.
const FIELD_MANAGER: &str = "ringway-agent";

/// What the annotation is to say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Wish {
    /// `enabled`.
    Set,
    /// Absent.
    Remove,
}

impl Wish {
    /// The metric's `op` label.
    fn op(self) -> &'static str {
        match self {
            Wish::Set => "set",
            Wish::Remove => "remove",
        }
    }
}

/// The annotator's timings ([`AnnotatorConfig::default`]: the production values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnnotatorConfig {
    /// First delay before a failed patch is tried again (500 ms).
    pub retry_min: Duration,
    /// Longest such delay, doubling from `retry_min` (30 s).
    pub retry_max: Duration,
    /// How long one patch may take before it counts as failed (10 s).
    pub request_timeout: Duration,
}

impl AnnotatorConfig {
    /// A failed patch's retries: [`AnnotatorConfig::retry_min`] doubling up to
    /// [`AnnotatorConfig::retry_max`], not jittered (one pod's patches, not a
    /// fleet's relists).
    pub(super) fn retry_backoff(&self) -> Backoff {
        Backoff::new(self.retry_min, self.retry_max)
    }
}

impl Default for AnnotatorConfig {
    fn default() -> Self {
        AnnotatorConfig {
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a patch failed (it is tried again).
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The API server answered with an error status (403: the agent's RBAC role lacks
    /// `patch` on `pods/status`).
    #[error("the API server refused the patch ({code}): {message}")]
    Refused {
        /// The HTTP status.
        code: u16,
        /// The API server's message.
        message: String,
    },
    /// No answer in time.
    #[error("no answer from the API server within {} ms", .0.as_millis())]
    Timeout(Duration),
    /// The request did not get through (connection, TLS, a body that is not an API
    /// object).
    #[error("the patch did not reach the API server: {0}")]
    Client(#[source] kube::Error),
}

/// How one patch ended.
#[derive(Debug)]
enum Outcome {
    /// Applied.
    Done,
    /// No such pod (404): gone, nothing to annotate.
    NotFound,
    /// A pod of that name with another uid (409/422): re-created, not ours to mark.
    Replaced,
    /// Tried again later.
    Failed(PatchError),
}

impl Outcome {
    /// The metric's `outcome` label.
    fn label(&self) -> &'static str {
        match self {
            Outcome::Done => "ok",
            Outcome::NotFound => "not_found",
            Outcome::Replaced => "replaced",
            Outcome::Failed(_) => "error",
        }
    }
}

/// Labels of `ringway_agent_redirection_annotation_patches_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PatchLabels {
    /// `set` or `remove`.
    op: &'static str,
    /// `ok`, `not_found`, `replaced`, `error`.
    outcome: &'static str,
}

/// One pod's wish, until it is done.
#[derive(Debug)]
struct Job {
    pod: PodRef,
    wish: Wish,
    /// Failed patches of this wish so far, and so the next delay.
    backoff: Backoff,
    /// Not before.
    due: Instant,
    /// Tells a wish from the one that replaced it while its patch was in flight.
    generation: u64,
    /// Its patch is being sent.
    in_flight: bool,
}

#[derive(Debug, Default)]
struct Queue {
    /// By pod uid: the last wish only.
    jobs: HashMap<String, Job>,
    next_generation: u64,
}

struct Inner {
    client: Client,
    config: AnnotatorConfig,
    queue: Mutex<Queue>,
    /// Wakes the worker for a new wish.
    wake: Notify,
    patches: Family<PatchLabels, Counter>,
}

/// Keeps the [`REDIRECTION_ANNOTATION`] of the pods the agent captures (see the module
/// docs). Cheap to clone; every clone feeds the one worker started by
/// [`Annotator::start`].
#[derive(Clone)]
pub struct Annotator(Arc<Inner>);

impl std::fmt::Debug for Annotator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Annotator")
            .field("config", &self.0.config)
            .field("pending", &self.pending())
            .finish_non_exhaustive()
    }
}

impl Annotator {
    /// An annotator patching through `client`, its worker spawned on `runtime` (the one
    /// `client` was made in, which must keep running: the agent's Kubernetes runtime).
    pub fn start(
        client: Client,
        runtime: &tokio::runtime::Handle,
        config: AnnotatorConfig,
    ) -> Annotator {
        let inner = Arc::new(Inner {
            client,
            config,
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            patches: Family::default(),
        });
        runtime.spawn(run(inner.clone()));
        Annotator(inner)
    }

    /// `pod` is captured (rules in place, the proxy acked it): it is to carry
    /// `ambient.istio.io/redirection: enabled`. Never blocks.
    pub fn captured(&self, pod: &PodRef) {
        self.wish(pod, Wish::Set);
    }

    /// The agent let `pod` go: the annotation is to be removed. Never blocks.
    pub fn released(&self, pod: &PodRef) {
        self.wish(pod, Wish::Remove);
    }

    /// Drops any wish about pod `uid` (its object is gone: there is nothing left to
    /// annotate). A patch in flight finishes; it is not tried again.
    pub fn forget(&self, uid: &str) {
        if let Some(job) = self.0.queue().jobs.remove(uid) {
            debug!(pod.uid = %uid, annotation.op = job.wish.op(), failures = job.backoff.failures(),
                "redirection annotation wish dropped: the pod is gone");
        }
    }

    /// Pods whose annotation is not yet as wished (queued, in flight or failing).
    pub fn pending(&self) -> usize {
        self.0.queue().jobs.len()
    }

    /// Adds the annotator's metrics to `registry`:
    /// `ringway_agent_redirection_annotation_patches_total{op,outcome}` and
    /// `ringway_agent_redirection_annotation_pending`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "ringway_agent_redirection_annotation_patches",
            "PATCHes of pods' ambient.istio.io/redirection annotation by op (set, remove) \
             and outcome (ok; not_found and replaced: the pod is gone or re-created; error: \
             tried again with backoff)",
            self.0.patches.clone(),
        );
        registry.register_collector(Box::new(Pending(self.0.clone())));
    }

    fn wish(&self, pod: &PodRef, wish: Wish) {
        {
            let mut queue = self.0.queue();
            let generation = queue.next_generation;
            if let Some(job) = queue.jobs.get_mut(&pod.uid) {
                if job.wish == wish && job.pod == *pod {
                    if job.in_flight {
                        // Wished again while its patch is under way: the
                        // object may have changed after the patch reached
                        // it (a repair of a lost mark), so patch once more.
                        job.generation = generation;
                        queue.next_generation += 1;
                    }
                    // Otherwise already wished: its retries keep their pace.
                    return;
                }
            }
            queue.next_generation += 1;
            debug!(pod.uid = %pod.uid, pod.namespace = %pod.namespace, pod.name = %pod.name,
                annotation.op = wish.op(), "redirection annotation queued");
            queue.jobs.insert(
                pod.uid.clone(),
                Job {
                    pod: pod.clone(),
                    wish,
                    backoff: self.0.config.retry_backoff(),
                    due: Instant::now(),
                    generation,
                    in_flight: false,
                },
            );
        }
        self.0.wake.notify_one();
    }
}

impl Inner {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Patches the annotation of `pod` as `wish` says.
    async fn patch(&self, pod: &PodRef, wish: Wish) -> Outcome {
        let value = match wish {
            Wish::Set => json!(REDIRECTION_ENABLED),
            Wish::Remove => Value::Null,
        };
        let body = json!({"metadata": {
            "uid": pod.uid,
            "annotations": { REDIRECTION_ANNOTATION: value },
        }});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_owned()),
            ..PatchParams::default()
        };
        let api = Api::<Pod>::namespaced(self.client.clone(), &pod.namespace);
        let patch = Patch::Merge(&body);
        let request = api.patch_status(&pod.name, &params, &patch);
        match tokio::time::timeout(self.config.request_timeout, request).await {
            Ok(Ok(_)) => Outcome::Done,
            Ok(Err(kube::Error::Api(status))) => match status.code {
                404 => Outcome::NotFound,
                409 | 422 => Outcome::Replaced,
                code => Outcome::Failed(PatchError::Refused {
                    code,
                    message: status.message,
                }),
            },
            Ok(Err(e)) => Outcome::Failed(PatchError::Client(e)),
            Err(_) => Outcome::Failed(PatchError::Timeout(self.config.request_timeout)),
        }
    }

    /// Records how the patch of `uid`'s wish `generation` ended.
    fn finish(&self, uid: &str, generation: u64, wish: Wish, outcome: Outcome) {
        self.patches
            .get_or_create(&PatchLabels {
                op: wish.op(),
                outcome: outcome.label(),
            })
            .inc();
        let mut queue = self.queue();
        let Some(job) = queue.jobs.get_mut(uid) else {
            return;
        };
        job.in_flight = false;
        let pod = job.pod.clone();
        if job.generation != generation {
            // A newer wish came meanwhile: it runs next, whatever this one did.
            debug!(pod.uid = %uid, annotation.op = wish.op(), "redirection annotation wish replaced while in flight");
            return;
        }
        match outcome {
            Outcome::Done => {
                queue.jobs.remove(uid);
                info!(pod.uid = %uid, pod.namespace = %pod.namespace, pod.name = %pod.name,
                    annotation.op = wish.op(), "redirection annotation written");
            }
            Outcome::NotFound | Outcome::Replaced => {
                queue.jobs.remove(uid);
                info!(pod.uid = %uid, pod.namespace = %pod.namespace, pod.name = %pod.name,
                    annotation.op = wish.op(), outcome = outcome.label(),
                    "redirection annotation not written: the pod is gone or was re-created");
            }
            Outcome::Failed(error) => {
                let delay = job.backoff.next_delay();
                job.due = Instant::now() + delay;
                warn!(pod.uid = %uid, pod.namespace = %pod.namespace, pod.name = %pod.name,
                    annotation.op = wish.op(), failures = job.backoff.failures(), retry_in = ?delay,
                    error = %error, "redirection annotation patch failed; trying again");
            }
        }
    }
}

/// What the worker does next.
enum Next {
    Patch {
        pod: PodRef,
        wish: Wish,
        generation: u64,
    },
    WaitUntil(Instant),
    Idle,
}

/// The worker: one patch at a time, the most overdue first.
async fn run(inner: Arc<Inner>) {
    loop {
        let next = {
            let mut queue = inner.queue();
            let now = Instant::now();
            match queue
                .jobs
                .values_mut()
                .min_by_key(|j| (j.due, j.generation))
            {
                Some(job) if job.due <= now => {
                    job.in_flight = true;
                    Next::Patch {
                        pod: job.pod.clone(),
                        wish: job.wish,
                        generation: job.generation,
                    }
                }
                Some(job) => Next::WaitUntil(job.due),
                None => Next::Idle,
            }
        };
        match next {
            Next::Patch {
                pod,
                wish,
                generation,
            } => {
                let outcome = inner.patch(&pod, wish).await;
                inner.finish(&pod.uid, generation, wish, outcome);
            }
            // A new wish wakes the worker (a wake before the wait is kept as a permit).
            Next::WaitUntil(due) => {
                tokio::select! {
                    () = inner.wake.notified() => {}
                    () = tokio::time::sleep_until(due) => {}
                }
            }
            Next::Idle => inner.wake.notified().await,
        }
    }
}

/// `ringway_agent_redirection_annotation_pending`, read at scrape time.
struct Pending(Arc<Inner>);

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending").finish_non_exhaustive()
    }
}

impl prometheus_client::collector::Collector for Pending {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let g =
            prometheus_client::metrics::gauge::ConstGauge::new(self.0.queue().jobs.len() as i64);
        g.encode(encoder.encode_descriptor(
            "ringway_agent_redirection_annotation_pending",
            "Pods whose ambient.istio.io/redirection annotation is not yet as the agent wants \
             it (queued, in flight or being retried)",
            None,
            g.metric_type(),
        )?)
    }
}
