//! The agent as the Kubernetes watch sees it ([`crate::kube::Enrollment`]),
//! on top of the handle: the watch knows pods, the agent finds their network
//! namespaces.

use std::os::fd::AsFd;

use super::handle::Enroller;
use super::netns::find_pod_netns;
use super::pod::Pod;
use crate::kube::{
    EnrolledPod, Enrollment as WatchEnrollment, EnrollmentError, PodIdentity, PodRef,
};

impl WatchEnrollment for Enroller {
    /// Enrolls a running pod. Its namespace is the one the agent already
    /// holds for the UID (a repeated enroll that updates the pod's identity,
    /// e.g. a service account that changed: the rules are re-tagged
    /// and the proxy gets `Add` again for the same netns), else the one
    /// found among the processes whose cgroup names the UID (oldest first,
    /// never the host's namespace, confirmed by one of the pod's IPs).
    fn enroll(&self, pod: &PodIdentity) -> Result<(), EnrollmentError> {
        let wanted = Pod {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            service_account: pod.service_account.clone(),
            ips: pod.ips.clone(),
            container_id: None,
        };
        let (fd, path) = match self.0.pinned_netns(&pod.uid) {
            Some(found) => found,
            None => find_pod_netns(&self.0.config().proc_root, &pod.uid, &pod.ips)
                .map(|(fd, path)| (fd, Some(path)))
                .map_err(EnrollmentError::new)?,
        };
        tracing::info!(pod.uid = %pod.uid, netns = %path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(), "enrolling a running pod");
        ringway_redirect::check_pod_netns(fd.as_fd()).map_err(EnrollmentError::new)?;
        self.0
            .enroll(wanted, fd, path)
            .map_err(EnrollmentError::new)
    }

    fn unenroll(&self, uid: &str) -> Result<(), EnrollmentError> {
        self.0.unenroll(uid).map_err(EnrollmentError::new)
    }

    /// The proxies drop the pod; its rules stay in its namespace (which
    /// goes with the sandbox): a pod still running after its object was
    /// removed is never left uncaptured.
    fn release_gone(&self, uid: &str) -> Result<(), EnrollmentError> {
        self.0.release_gone(uid).map_err(EnrollmentError::new)
    }

    /// The pods held, and the pods only kept at the proxies with no
    /// identity (none was recorded): the watch enrolls those it wants under
    /// the identity it sees (an update), and releases the others.
    fn enrolled(&self) -> Vec<EnrolledPod> {
        let (held, kept) = self.0.enrolled_and_kept();
        let held = held.into_iter().map(|p| EnrolledPod {
            uid: p.pod.uid,
            name: p.pod.name,
            namespace: p.pod.namespace,
            service_account: p.pod.service_account,
        });
        let kept = kept.into_iter().map(|uid| EnrolledPod {
            uid,
            name: String::new(),
            namespace: String::new(),
            service_account: String::new(),
        });
        held.chain(kept).collect()
    }

    /// Puts the pod's `ambient.istio.io/redirection` annotation right when the
    /// watch saw it disagree with what the agent holds now: a held pod gets it,
    /// a pod the agent does not hold loses it. Without an annotator, nothing.
    fn annotation_seen(&self, pod: &PodRef, annotated: bool) {
        let Some(annotator) = &self.0.config().annotator else {
            return;
        };
        match (self.0.holds(&pod.uid), annotated) {
            (true, false) => {
                tracing::info!(pod.uid = %pod.uid, pod.namespace = %pod.namespace, pod.name = %pod.name,
                    "a captured pod lacks its redirection annotation: setting it");
                annotator.captured(pod);
            }
            (false, true) => {
                tracing::info!(pod.uid = %pod.uid, pod.namespace = %pod.namespace, pod.name = %pod.name,
                    "a pod the agent does not hold carries the redirection annotation: removing it");
                annotator.released(pod);
            }
            _ => {}
        }
    }

    /// The pod's object is gone: unless the agent still holds it, any wish about
    /// its annotation is dropped (a removal the API server keeps refusing would
    /// otherwise be retried for ever).
    fn pod_deleted(&self, uid: &str) {
        if let Some(annotator) = &self.0.config().annotator {
            if !self.0.holds(uid) {
                annotator.forget(uid);
            }
        }
    }

    fn excludes(&self, namespace: &str) -> bool {
        self.0
            .config()
            .exclude_namespaces
            .iter()
            .any(|n| n == namespace)
    }
}
