//! The enrollment decision: a pure function of a pod and its namespace's labels
//! ([`PodFacts`], the part of a pod it reads, and [`Decision`]). Uses only
//! [`super::model`]; the selector and the reconciler build on it.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Namespace, Pod};

use super::model::{PodIdentity, MIRROR_ANNOTATION, REDIRECTION_ANNOTATION, REDIRECTION_ENABLED};

// The labels and the label rule are `ringway_config::enrollment`'s, shared with the
// proxy's Kubernetes mesh source (a workload's `tunnel` flag).
use ringway_config::enrollment::{self, NotSelected};
pub use ringway_config::enrollment::{
    PodMode, DATAPLANE_MODE_DISABLED, DATAPLANE_MODE_ENABLED, DATAPLANE_MODE_LABEL,
    ISTIO_DATAPLANE_MODE_AMBIENT, ISTIO_DATAPLANE_MODE_LABEL, ISTIO_DATAPLANE_MODE_NONE,
};

/// What to do with a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The pod is to be captured now.
    Enroll(PodIdentity),
    /// The pod must not be captured: unenroll it if it is.
    Unenroll(UnenrollReason),
    /// Leave the pod as it is (captured or not): it is in a transient state that the CNI
    /// plugin or a later event covers.
    Ignore(IgnoreReason),
}

/// Why a pod must not be captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnenrollReason {
    /// `spec.hostNetwork`: its network namespace is the node's.
    HostNetwork,
    /// The pod opted out: `ringway.io/dataplane-mode=disabled` or
    /// `istio.io/dataplane-mode=none` ([`PodMode::OptOut`]).
    PodOptOut,
    /// Neither the pod nor its namespace is enrolled by either label
    /// (`ringway.io/dataplane-mode=enabled`, `istio.io/dataplane-mode=ambient`).
    NotLabelled,
    /// Phase `Succeeded` or `Failed`: its containers are done.
    Finished,
    /// The pod no longer exists (deleted, or absent from a relist). Never returned by
    /// [`decide`]; the watcher uses it for pods it has no object for.
    Gone,
    /// The pod's namespace is one the node agent never captures (its
    /// `exclude_namespaces`: its own). Never returned by [`decide`]: the agent's
    /// setting, applied before it by the watch and by the CNI path alike.
    Excluded,
}

/// Why a pod is left as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IgnoreReason {
    /// The object has no `metadata.uid` (never the case for objects from the API server).
    NoUid,
    /// `metadata.deletionTimestamp` is set: the pod keeps its capture through graceful
    /// termination, and is unenrolled when it is deleted.
    Terminating,
    /// Not `Running` yet (`Pending`, `Unknown`, no phase): the CNI ADD captures a new
    /// pod; the watch enrolls it once it runs.
    NotRunning,
    /// Running but no IP in the status yet.
    NoIp,
}

impl fmt::Display for UnenrollReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            // The label rule's own words (one place for them).
            UnenrollReason::HostNetwork => return fmt::Display::fmt(&NotSelected::HostNetwork, f),
            UnenrollReason::PodOptOut => return fmt::Display::fmt(&NotSelected::PodOptOut, f),
            UnenrollReason::NotLabelled => return fmt::Display::fmt(&NotSelected::NotLabelled, f),
            UnenrollReason::Finished => "pod finished",
            UnenrollReason::Gone => "pod gone",
            UnenrollReason::Excluded => "namespace excluded from capture (exclude_namespaces)",
        })
    }
}

impl fmt::Display for IgnoreReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IgnoreReason::NoUid => "no uid",
            IgnoreReason::Terminating => "terminating",
            IgnoreReason::NotRunning => "not running",
            IgnoreReason::NoIp => "no IP yet",
        })
    }
}

/// The decision for `pod`, given its namespace (`None`: unknown, treated as unlabelled).
///
/// In order: hostNetwork pods are never enrolled; a pod opted out by either label
/// (`ringway.io/dataplane-mode=disabled`, `istio.io/dataplane-mode=none`) is not
/// wanted; a pod is wanted when either label enrolls it
/// (`ringway.io/dataplane-mode=enabled`, `istio.io/dataplane-mode=ambient`), or when
/// either label enrolls its namespace; a wanted pod that finished is unenrolled; a
/// wanted pod that is terminating, not running, or has no IP yet is left alone;
/// otherwise it is enrolled (the label part: [`ringway_config::enrollment`]).
pub fn decide(pod: &Pod, namespace: Option<&Namespace>) -> Decision {
    match PodFacts::from_pod(pod) {
        Some(facts) => decide_facts(&facts, namespace.is_some_and(namespace_enabled)),
        None => Decision::Ignore(IgnoreReason::NoUid),
    }
}

/// Whether a namespace enrolls its pods (`ringway.io/dataplane-mode=enabled` or
/// `istio.io/dataplane-mode=ambient`).
pub fn namespace_enabled(ns: &Namespace) -> bool {
    enrollment::namespace_enabled(ns.metadata.labels.as_ref())
}

/// `status.phase`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    /// `Unknown`, absent, or a value this code does not know.
    Unknown,
}

/// The part of a pod the decision reads (kept per pod by the watcher instead of the
/// whole object).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodFacts {
    pub(crate) uid: String,
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) service_account: String,
    /// What the pod's [`DATAPLANE_MODE_LABEL`] and [`ISTIO_DATAPLANE_MODE_LABEL`] say.
    pub(crate) mode: PodMode,
    pub(crate) host_network: bool,
    pub(crate) phase: Phase,
    pub(crate) terminating: bool,
    pub(crate) ips: Vec<IpAddr>,
    /// Its `ambient.istio.io/redirection` annotation says `enabled`.
    pub(crate) redirection: bool,
    /// A mirror pod's static pod uid (`kubernetes.io/config.mirror`): the
    /// uid the agent holds the pod by.
    pub(crate) mirror_of: Option<String>,
}

impl PodFacts {
    /// `None` when the pod has no uid.
    pub(crate) fn from_pod(pod: &Pod) -> Option<PodFacts> {
        let meta = &pod.metadata;
        let uid = meta.uid.clone().filter(|u| !u.is_empty())?;
        let spec = pod.spec.as_ref();
        let status = pod.status.as_ref();
        let phase = match status.and_then(|s| s.phase.as_deref()) {
            Some("Pending") => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Unknown,
        };
        let ips = match status {
            Some(s) => match &s.pod_ips {
                Some(list) if !list.is_empty() => list.iter().map(|ip| ip.ip.as_str()).collect(),
                _ => s.pod_ip.as_deref().into_iter().collect::<Vec<_>>(),
            },
            None => Vec::new(),
        };
        Some(PodFacts {
            uid,
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            // None (a static pod's mirror; admission gives every other pod
            // one): the pod has no identity, never `default`.
            service_account: spec
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
            mode: PodMode::from_labels(meta.labels.as_ref()),
            host_network: spec.and_then(|s| s.host_network).unwrap_or(false),
            phase,
            terminating: meta.deletion_timestamp.is_some(),
            ips: ips.into_iter().filter_map(|ip| ip.parse().ok()).collect(),
            redirection: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(REDIRECTION_ANNOTATION))
                .is_some_and(|v| v == REDIRECTION_ENABLED),
            mirror_of: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(MIRROR_ANNOTATION))
                .filter(|m| !m.is_empty())
                .cloned(),
        })
    }

    /// A pod the API server has no object for (deleted, or a static pod whose mirror
    /// pod is not created yet): no label, not hostNetwork, not running. Its
    /// namespace's label decides for it.
    pub(crate) fn unknown(uid: &str, namespace: &str, name: &str) -> PodFacts {
        PodFacts {
            uid: uid.to_owned(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            service_account: String::new(),
            mode: PodMode::Unset,
            host_network: false,
            phase: Phase::Unknown,
            terminating: false,
            ips: Vec::new(),
            redirection: false,
            mirror_of: None,
        }
    }

    fn identity(&self) -> PodIdentity {
        PodIdentity {
            uid: self.uid.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            service_account: self.service_account.clone(),
            ips: self.ips.clone(),
        }
    }
}

/// [`decide`] on the extracted facts; `ns_enabled`: the namespace's labels enroll its pods.
pub(crate) fn decide_facts(pod: &PodFacts, ns_enabled: bool) -> Decision {
    if let Err(why) = enrollment::selected(pod.host_network, pod.mode, ns_enabled) {
        return Decision::Unenroll(match why {
            NotSelected::HostNetwork => UnenrollReason::HostNetwork,
            NotSelected::PodOptOut => UnenrollReason::PodOptOut,
            NotSelected::NotLabelled => UnenrollReason::NotLabelled,
        });
    }
    match pod.phase {
        Phase::Succeeded | Phase::Failed => Decision::Unenroll(UnenrollReason::Finished),
        _ if pod.terminating => Decision::Ignore(IgnoreReason::Terminating),
        Phase::Pending | Phase::Unknown => Decision::Ignore(IgnoreReason::NotRunning),
        Phase::Running if pod.ips.is_empty() => Decision::Ignore(IgnoreReason::NoIp),
        Phase::Running => Decision::Enroll(pod.identity()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Every combination of the inputs (both labels on the pod and on its namespace,
    /// host network, phase, deletion, IPs), as Kubernetes objects through [`decide`],
    /// checked against the rules stated as properties.
    #[test]
    fn exhaustive_over_every_input_combination() {
        let values = [
            None,
            Some("enabled"),
            Some("disabled"),
            Some("ambient"),
            Some("none"),
        ];
        let phases = [
            (Some("Pending"), Phase::Pending),
            (Some("Running"), Phase::Running),
            (Some("Succeeded"), Phase::Succeeded),
            (Some("Failed"), Phase::Failed),
            (None, Phase::Unknown),
        ];
        let labels = |ringway: Option<&str>, istio: Option<&str>| {
            let mut l = json!({"app": "web"});
            if let Some(v) = ringway {
                l[DATAPLANE_MODE_LABEL] = json!(v);
            }
            if let Some(v) = istio {
                l[ISTIO_DATAPLANE_MODE_LABEL] = json!(v);
            }
            l
        };
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let mut n = 0;
        let mut enrolled = 0;
        for host_network in [false, true] {
            for (pod_ringway, pod_istio) in values.iter().flat_map(|a| values.map(|b| (*a, b))) {
                for (ns_ringway, ns_istio) in values.iter().flat_map(|a| values.map(|b| (*a, b))) {
                    let namespace: Namespace = serde_json::from_value(json!({
                        "metadata": {"name": "ns", "labels": labels(ns_ringway, ns_istio)}
                    }))
                    .unwrap();
                    for (phase_name, phase) in phases {
                        for terminating in [false, true] {
                            for has_ip in [false, true] {
                                n += 1;
                                let mut v = json!({
                                    "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                                        "labels": labels(pod_ringway, pod_istio)},
                                    "spec": {"containers": [], "serviceAccountName": "sa",
                                        "hostNetwork": host_network},
                                    "status": {}
                                });
                                if let Some(p) = phase_name {
                                    v["status"]["phase"] = json!(p);
                                }
                                if has_ip {
                                    v["status"]["podIP"] = json!(ip.to_string());
                                }
                                if terminating {
                                    v["metadata"]["deletionTimestamp"] =
                                        json!("2026-01-01T00:00:00Z");
                                }
                                let got = decide(&pod(v), Some(&namespace));

                                let opt_out =
                                    pod_ringway == Some("disabled") || pod_istio == Some("none");
                                let pod_in =
                                    pod_ringway == Some("enabled") || pod_istio == Some("ambient");
                                let ns_in =
                                    ns_ringway == Some("enabled") || ns_istio == Some("ambient");
                                let wanted = !opt_out && (pod_in || ns_in);
                                let finished = matches!(phase, Phase::Succeeded | Phase::Failed);
                                let ctx = format!(
                                    "pod=({pod_ringway:?}, {pod_istio:?}) ns=({ns_ringway:?}, \
                                     {ns_istio:?}) hostNetwork={host_network} {phase:?} \
                                     terminating={terminating} ip={has_ip} -> {got:?}"
                                );

                                // Enrolled exactly when every condition holds.
                                let enroll = !host_network
                                    && wanted
                                    && phase == Phase::Running
                                    && !terminating
                                    && has_ip;
                                assert_eq!(matches!(got, Decision::Enroll(_)), enroll, "{ctx}");
                                enrolled += usize::from(enroll);
                                // Unenrolled exactly when capture is wrong whatever happens next.
                                let unenroll = host_network || !wanted || finished;
                                assert_eq!(matches!(got, Decision::Unenroll(_)), unenroll, "{ctx}");

                                // The reason is the first rule that applies.
                                let want = if host_network {
                                    Decision::Unenroll(UnenrollReason::HostNetwork)
                                } else if opt_out {
                                    Decision::Unenroll(UnenrollReason::PodOptOut)
                                } else if !wanted {
                                    Decision::Unenroll(UnenrollReason::NotLabelled)
                                } else if finished {
                                    Decision::Unenroll(UnenrollReason::Finished)
                                } else if terminating {
                                    Decision::Ignore(IgnoreReason::Terminating)
                                } else if phase != Phase::Running {
                                    Decision::Ignore(IgnoreReason::NotRunning)
                                } else if !has_ip {
                                    Decision::Ignore(IgnoreReason::NoIp)
                                } else {
                                    Decision::Enroll(PodIdentity {
                                        uid: "u".into(),
                                        name: "p".into(),
                                        namespace: "ns".into(),
                                        service_account: "sa".into(),
                                        ips: vec![ip],
                                    })
                                };
                                assert_eq!(got, want, "{ctx}");
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 2 * 25 * 25 * 5 * 2 * 2);
        assert!(enrolled > 0, "no combination enrolls");
    }

    /// The words a pass-through names, for each label reason: the rule's own.
    #[test]
    fn the_reasons_name_both_labels() {
        assert_eq!(
            UnenrollReason::PodOptOut.to_string(),
            "pod opted out (ringway.io/dataplane-mode=disabled or istio.io/dataplane-mode=none)"
        );
        assert_eq!(
            UnenrollReason::NotLabelled.to_string(),
            "neither pod nor namespace labelled ringway.io/dataplane-mode=enabled or \
             istio.io/dataplane-mode=ambient"
        );
        assert_eq!(UnenrollReason::HostNetwork.to_string(), "host network");
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    fn ns(label: Option<&str>) -> Namespace {
        let labels = match label {
            Some(l) => json!({ DATAPLANE_MODE_LABEL: l }),
            None => json!({}),
        };
        serde_json::from_value(json!({"metadata": {"name": "shop", "labels": labels}})).unwrap()
    }

    fn running(labels: serde_json::Value) -> serde_json::Value {
        json!({
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-1", "labels": labels},
            "spec": {"containers": [], "serviceAccountName": "web", "nodeName": "node-a"},
            "status": {"phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]}
        })
    }

    fn web(ips: &[&str]) -> Decision {
        Decision::Enroll(PodIdentity {
            uid: "uid-1".into(),
            name: "web-1".into(),
            namespace: "shop".into(),
            service_account: "web".into(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
        })
    }

    #[test]
    fn from_kubernetes_objects() {
        let enabled = ns(Some("enabled"));
        let plain = ns(None);
        let disabled_ns = ns(Some("disabled"));
        let labelled = running(json!({ DATAPLANE_MODE_LABEL: "enabled" }));
        let unlabelled = running(json!({"app": "web"}));
        let opted_out = running(json!({ DATAPLANE_MODE_LABEL: "disabled" }));

        // Dual stack, in the order of podIPs.
        assert_eq!(
            decide(&pod(labelled.clone()), None),
            web(&["10.1.0.5", "fd00::5"])
        );
        assert_eq!(
            decide(&pod(labelled.clone()), Some(&disabled_ns)),
            web(&["10.1.0.5", "fd00::5"])
        );
        assert_eq!(
            decide(&pod(unlabelled.clone()), Some(&enabled)),
            web(&["10.1.0.5", "fd00::5"])
        );
        assert_eq!(
            decide(&pod(unlabelled.clone()), Some(&plain)),
            Decision::Unenroll(UnenrollReason::NotLabelled)
        );
        assert_eq!(
            decide(&pod(unlabelled.clone()), Some(&disabled_ns)),
            Decision::Unenroll(UnenrollReason::NotLabelled)
        );
        assert_eq!(
            decide(&pod(unlabelled.clone()), None),
            Decision::Unenroll(UnenrollReason::NotLabelled)
        );
        assert_eq!(
            decide(&pod(opted_out), Some(&enabled)),
            Decision::Unenroll(UnenrollReason::PodOptOut)
        );

        // The Istio ambient mesh's label, on the pod or its namespace.
        let ambient: Namespace = serde_json::from_value(json!({"metadata": {"name": "shop",
            "labels": { ISTIO_DATAPLANE_MODE_LABEL: "ambient" }}}))
        .unwrap();
        assert_eq!(
            decide(&pod(unlabelled.clone()), Some(&ambient)),
            web(&["10.1.0.5", "fd00::5"])
        );
        assert_eq!(
            decide(
                &pod(running(json!({ ISTIO_DATAPLANE_MODE_LABEL: "ambient" }))),
                Some(&plain)
            ),
            web(&["10.1.0.5", "fd00::5"])
        );
        assert_eq!(
            decide(
                &pod(running(json!({ ISTIO_DATAPLANE_MODE_LABEL: "none" }))),
                Some(&ambient)
            ),
            Decision::Unenroll(UnenrollReason::PodOptOut)
        );
        // The labels disagree on the pod: the opt-out wins.
        assert_eq!(
            decide(
                &pod(running(json!({ DATAPLANE_MODE_LABEL: "enabled",
                    ISTIO_DATAPLANE_MODE_LABEL: "none" }))),
                Some(&enabled)
            ),
            Decision::Unenroll(UnenrollReason::PodOptOut)
        );

        let mut host = labelled.clone();
        host["spec"]["hostNetwork"] = json!(true);
        assert_eq!(
            decide(&pod(host), Some(&enabled)),
            Decision::Unenroll(UnenrollReason::HostNetwork)
        );

        // podIP alone (older API servers); a value that is not an IP is left out.
        let mut single = labelled.clone();
        single["status"] = json!({"phase": "Running", "podIP": "10.1.0.9"});
        assert_eq!(decide(&pod(single), None), web(&["10.1.0.9"]));
        let mut bad = labelled.clone();
        bad["status"]["podIPs"] = json!([{"ip": "not-an-ip"}, {"ip": "fd00::5"}]);
        assert_eq!(decide(&pod(bad), None), web(&["fd00::5"]));
        let mut no_ip = labelled.clone();
        no_ip["status"] = json!({"phase": "Running"});
        assert_eq!(
            decide(&pod(no_ip), None),
            Decision::Ignore(IgnoreReason::NoIp)
        );

        let mut pending = labelled.clone();
        pending["status"] = json!({"phase": "Pending"});
        assert_eq!(
            decide(&pod(pending), None),
            Decision::Ignore(IgnoreReason::NotRunning)
        );
        let mut no_status = labelled.clone();
        no_status.as_object_mut().unwrap().remove("status");
        assert_eq!(
            decide(&pod(no_status), None),
            Decision::Ignore(IgnoreReason::NotRunning)
        );
        let mut done = labelled.clone();
        done["status"]["phase"] = json!("Succeeded");
        assert_eq!(
            decide(&pod(done), None),
            Decision::Unenroll(UnenrollReason::Finished)
        );
        let mut deleting = labelled.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(
            decide(&pod(deleting), None),
            Decision::Ignore(IgnoreReason::Terminating)
        );

        // No service account name (a static pod's mirror): no identity,
        // never the API server's `default`.
        let mut no_sa = labelled.clone();
        no_sa["spec"]
            .as_object_mut()
            .unwrap()
            .remove("serviceAccountName");
        let Decision::Enroll(id) = decide(&pod(no_sa), None) else {
            panic!("not enrolled")
        };
        assert_eq!(id.service_account, "");

        let mut no_uid = labelled;
        no_uid["metadata"].as_object_mut().unwrap().remove("uid");
        assert_eq!(
            decide(&pod(no_uid), None),
            Decision::Ignore(IgnoreReason::NoUid)
        );
    }
}
