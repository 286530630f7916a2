//! What the watch calls: the [`Enrollment`] trait the node agent implements,
//! and [`EnrollmentError`], the agent's failure as the watch gets it. Uses
//! only [`super::model`]; the reconciler calls it.

use super::model::{EnrolledPod, PodIdentity, PodRef};

/// The node agent, as the watcher sees it. Implemented by the agent; every call is
/// made from a blocking-pool thread, one at a time.
pub trait Enrollment: Send + Sync {
    /// Captures a running pod (finding its netns is the agent's job), or updates the
    /// identity of one it holds (same netns: idempotent). Called only for pods not in
    /// [`Enrollment::enrolled`] or held there with another identity; an error is retried
    /// with backoff.
    fn enroll(&self, pod: &PodIdentity) -> Result<(), EnrollmentError>;
    /// Releases a pod by uid. Called only for pods in [`Enrollment::enrolled`]; an error
    /// is retried with backoff.
    fn unenroll(&self, uid: &str) -> Result<(), EnrollmentError>;
    /// Releases a pod whose object is gone from the API server (deleted, or
    /// absent from a relist past the orphan grace), which may still run: a
    /// forced delete (`--grace-period=0`), or the garbage collector on a
    /// node lost to the API server, removes the object before the kubelet
    /// stops the containers. The proxies drop it, but its capture stays
    /// (no listener: its traffic is dropped or refused, never uncaptured)
    /// until its network namespace goes with its sandbox. Called like
    /// [`Enrollment::unenroll`]; by default the same.
    fn release_gone(&self, uid: &str) -> Result<(), EnrollmentError> {
        self.unenroll(uid)
    }
    /// The pods the agent has captured, by this watch or by the CNI plugin.
    fn enrolled(&self) -> Vec<EnrolledPod>;
    /// Whether the agent never captures pods of `namespace` (its own). Such pods are
    /// not enrolled whatever their labels say (the CNI ADD passes them through).
    fn excludes(&self, namespace: &str) -> bool {
        let _ = namespace;
        false
    }
    /// The watch saw `pod`'s [`REDIRECTION_ANNOTATION`](crate::kube::REDIRECTION_ANNOTATION) say `enabled` (`annotated`) or
    /// not while it thinks the agent does not hold the pod, or holds it: called for a
    /// running pod the agent holds that lacks it, and for a pod the rule passes over
    /// that has it. The agent, which knows what it holds, puts the annotation right
    /// through its [`super::Annotator`] (none: nothing to do, the default).
    fn annotation_seen(&self, pod: &PodRef, annotated: bool) {
        let _ = (pod, annotated);
    }
    /// The watch saw pod `uid` deleted from the API server (after deciding on it): a
    /// wish about its annotation the agent still has (a removal the API server keeps
    /// refusing) is moot once the agent no longer holds the pod. Default: nothing.
    fn pod_deleted(&self, uid: &str) {
        let _ = uid;
    }
}

/// Why the agent did not do what the watch asked: the agent's own error, kept
/// whole (its message and its sources). The watch logs it and tries again
/// with backoff.
#[derive(Debug)]
pub struct EnrollmentError(Box<dyn std::error::Error + Send + Sync + 'static>);

impl EnrollmentError {
    /// Wraps the agent's error.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> EnrollmentError {
        EnrollmentError(Box::new(error))
    }
}

impl std::fmt::Display for EnrollmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for EnrollmentError {
    // Transparent: the agent's error speaks for itself, its sources are ours.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}
