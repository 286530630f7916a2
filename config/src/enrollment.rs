//! Which pods belong to the mesh: ringway's `ringway.io/dataplane-mode` label
//! and the Istio ambient mesh's `istio.io/dataplane-mode`, so a cluster that
//! already runs the ambient mesh keeps its enrollment when ringway takes over.
//!
//! One rule, used by the node agent (the CNI ADD and its Kubernetes watch,
//! `ringway_cni::kube::decide`) to capture a pod and by the Kubernetes mesh
//! source ([`crate::kube`], feature `kube`) to mark a workload `tunnel: true`
//! (its node proxy serves it, so it accepts HBONE). Pure: label values in, an
//! answer out; the Kubernetes objects are read by the callers.
//!
//! # The rule
//! | label | on a pod | on a namespace |
//! | --- | --- | --- |
//! | `ringway.io/dataplane-mode=enabled` | enrolls the pod | enrolls its pods |
//! | `ringway.io/dataplane-mode=disabled` | opts the pod out | nothing |
//! | `istio.io/dataplane-mode=ambient` | enrolls the pod | enrolls its pods |
//! | `istio.io/dataplane-mode=none` | opts the pod out | nothing |
//! | any other value, or no label | nothing | nothing |
//!
//! In order: a `hostNetwork` pod never (its network namespace is the node's);
//! a pod opted out by **either** label never, whatever the other label and its
//! namespace say; a pod enrolled by either label, or a pod without an opinion
//! in a namespace enrolled by either label, yes; anything else no.
//!
//! When the two labels disagree on one object, the opt-out wins: a pod
//! labelled `ringway.io/dataplane-mode=enabled` and
//! `istio.io/dataplane-mode=none` (or `disabled` and `ambient`) is not
//! captured. That is the safe and predictable side: whoever opted a pod out
//! (an owner who knows the app breaks behind a proxy) is never overruled by a
//! label someone else added for the other mesh, and no order between the two
//! labels needs remembering. A namespace has no opt-out: `disabled`/`none`
//! there enroll nothing, and either label's enrolling value enrolls (a
//! namespace labelled `ringway.io/dataplane-mode=enabled` and
//! `istio.io/dataplane-mode=none` is enrolled). Values other than these count
//! as no label, as in the reference mesh (`istio.io/dataplane-mode=Ambient`
//! enrolls nothing).
//!
//! Pods of the node agent's excluded namespaces ([`DEFAULT_EXCLUDE_NAMESPACES`]
//! unless configured) are never captured either, whatever their labels say;
//! callers apply that list first.
//!
//! The reference mesh also leaves out pods that carry a sidecar
//! (`sidecar.istio.io/status`); ringway does not look at sidecars.
//!
//! # Watching the namespaces
//! The node agent and the mesh source watch **every** namespace and apply
//! [`namespace_enabled`] to its labels, rather than watch the enrolled ones
//! with a label selector. No one selector matches "either label": a selector
//! ANDs its terms, and a set-based term names one key. Two selected watches
//! (one per label) cannot order one update that moves a namespace from one
//! label to the other (`kubectl label ns shop
//! ringway.io/dataplane-mode=enabled istio.io/dataplane-mode-`): when the
//! watch that loses it reports first, the namespace looks unenrolled until
//! the other watch reports, and the agent would release, then capture again,
//! every pod of it (their connections reset). Ordering the two streams would
//! mean comparing resourceVersions, which the API's conventions forbid. One
//! watch sees each namespace's changes in order, and namespaces are few and
//! small beside the pods the watches already hold.

use std::collections::BTreeMap;

/// ringway's label that enrolls a pod (on the pod or its namespace) or opts it out (on the pod).
pub const DATAPLANE_MODE_LABEL: &str = "ringway.io/dataplane-mode";
/// [`DATAPLANE_MODE_LABEL`] value that enrolls.
pub const DATAPLANE_MODE_ENABLED: &str = "enabled";
/// [`DATAPLANE_MODE_LABEL`] value that opts a pod out, whatever its namespace says.
pub const DATAPLANE_MODE_DISABLED: &str = "disabled";

/// The Istio ambient mesh's label: the same role as [`DATAPLANE_MODE_LABEL`].
pub const ISTIO_DATAPLANE_MODE_LABEL: &str = "istio.io/dataplane-mode";
/// [`ISTIO_DATAPLANE_MODE_LABEL`] value that enrolls (on a pod or its namespace).
pub const ISTIO_DATAPLANE_MODE_AMBIENT: &str = "ambient";
/// [`ISTIO_DATAPLANE_MODE_LABEL`] value that opts a pod out, whatever its namespace says.
pub const ISTIO_DATAPLANE_MODE_NONE: &str = "none";

/// Namespaces whose pods are never captured unless configured otherwise:
/// ringway's own (the node agent and proxy must start without waiting for
/// themselves). The CNI plugin's `excludeNamespaces` default.
pub const DEFAULT_EXCLUDE_NAMESPACES: &[&str] = &["ringway-system"];

/// What a pod's own labels say about it (the two labels together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PodMode {
    /// `ringway.io/dataplane-mode=disabled` or `istio.io/dataplane-mode=none`:
    /// never captured, whatever the other label or the namespace says.
    OptOut,
    /// `ringway.io/dataplane-mode=enabled` or `istio.io/dataplane-mode=ambient`
    /// (and no opt-out).
    Enroll,
    /// Neither: its namespace decides.
    #[default]
    Unset,
}

impl PodMode {
    /// The mode of a pod whose [`DATAPLANE_MODE_LABEL`] is `ringway` and whose
    /// [`ISTIO_DATAPLANE_MODE_LABEL`] is `istio` (`None`: absent).
    pub fn of(ringway: Option<&str>, istio: Option<&str>) -> PodMode {
        if ringway == Some(DATAPLANE_MODE_DISABLED) || istio == Some(ISTIO_DATAPLANE_MODE_NONE) {
            PodMode::OptOut
        } else if ringway == Some(DATAPLANE_MODE_ENABLED)
            || istio == Some(ISTIO_DATAPLANE_MODE_AMBIENT)
        {
            PodMode::Enroll
        } else {
            PodMode::Unset
        }
    }

    /// The mode of a pod with these labels (`metadata.labels`).
    pub fn from_labels(labels: Option<&BTreeMap<String, String>>) -> PodMode {
        PodMode::of(
            label(labels, DATAPLANE_MODE_LABEL),
            label(labels, ISTIO_DATAPLANE_MODE_LABEL),
        )
    }
}

fn label<'a>(labels: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    labels.and_then(|l| l.get(key)).map(String::as_str)
}

/// Why [`selected`] passes a pod over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotSelected {
    /// `spec.hostNetwork`: its network namespace is the node's.
    HostNetwork,
    /// The pod opted out ([`PodMode::OptOut`]).
    PodOptOut,
    /// Neither the pod nor its namespace is enrolled by either label.
    NotLabelled,
}

impl std::fmt::Display for NotSelected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotSelected::HostNetwork => "host network",
            NotSelected::PodOptOut => {
                "pod opted out (ringway.io/dataplane-mode=disabled or istio.io/dataplane-mode=none)"
            }
            NotSelected::NotLabelled => {
                "neither pod nor namespace labelled ringway.io/dataplane-mode=enabled or istio.io/dataplane-mode=ambient"
            }
        })
    }
}

/// Whether a pod is in the mesh by its labels: `pod` is what its own labels
/// say ([`PodMode::from_labels`]), `namespace_enabled` whether its
/// namespace's labels enroll its pods ([`namespace_enabled`]). Phase, IPs
/// and the excluded namespaces are the callers' to check.
pub fn selected(
    host_network: bool,
    pod: PodMode,
    namespace_enabled: bool,
) -> Result<(), NotSelected> {
    if host_network {
        return Err(NotSelected::HostNetwork);
    }
    match pod {
        PodMode::OptOut => Err(NotSelected::PodOptOut),
        PodMode::Enroll => Ok(()),
        PodMode::Unset if namespace_enabled => Ok(()),
        PodMode::Unset => Err(NotSelected::NotLabelled),
    }
}

/// Whether a namespace whose [`DATAPLANE_MODE_LABEL`] is `ringway` and whose
/// [`ISTIO_DATAPLANE_MODE_LABEL`] is `istio` enrolls its pods (either label's
/// enrolling value).
pub fn namespace_enabled_by(ringway: Option<&str>, istio: Option<&str>) -> bool {
    ringway == Some(DATAPLANE_MODE_ENABLED) || istio == Some(ISTIO_DATAPLANE_MODE_AMBIENT)
}

/// Whether a namespace with these labels (`metadata.labels`) enrolls its pods.
pub fn namespace_enabled(labels: Option<&BTreeMap<String, String>>) -> bool {
    namespace_enabled_by(
        label(labels, DATAPLANE_MODE_LABEL),
        label(labels, ISTIO_DATAPLANE_MODE_LABEL),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value either label may have (absent, each meaningful value of
    /// both labels, a value of the other label, a wrong case, empty).
    const VALUES: [Option<&str>; 8] = [
        None,
        Some("enabled"),
        Some("disabled"),
        Some("ambient"),
        Some("none"),
        Some("Ambient"),
        Some(""),
        Some("something-else"),
    ];

    fn labels(ringway: Option<&str>, istio: Option<&str>) -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        if let Some(v) = ringway {
            l.insert(DATAPLANE_MODE_LABEL.to_owned(), v.to_owned());
        }
        if let Some(v) = istio {
            l.insert(ISTIO_DATAPLANE_MODE_LABEL.to_owned(), v.to_owned());
        }
        l
    }

    /// Every combination of both labels on the pod, both labels on the
    /// namespace and hostNetwork, against the rule stated independently:
    /// host network never; an opt-out by either pod label never; else an
    /// enrolling value of either label on the pod or on the namespace.
    #[test]
    fn every_combination() {
        let mut n = 0;
        let mut captured = 0;
        for host_network in [false, true] {
            for pod_ringway in VALUES {
                for pod_istio in VALUES {
                    for ns_ringway in VALUES {
                        for ns_istio in VALUES {
                            n += 1;
                            let pod = PodMode::from_labels(Some(&labels(pod_ringway, pod_istio)));
                            assert_eq!(pod, PodMode::of(pod_ringway, pod_istio));
                            let ns = namespace_enabled(Some(&labels(ns_ringway, ns_istio)));
                            assert_eq!(ns, namespace_enabled_by(ns_ringway, ns_istio));
                            let got = selected(host_network, pod, ns);

                            let opt_out =
                                pod_ringway == Some("disabled") || pod_istio == Some("none");
                            let pod_in =
                                pod_ringway == Some("enabled") || pod_istio == Some("ambient");
                            let ns_in =
                                ns_ringway == Some("enabled") || ns_istio == Some("ambient");
                            let want = if host_network {
                                Err(NotSelected::HostNetwork)
                            } else if opt_out {
                                Err(NotSelected::PodOptOut)
                            } else if pod_in || ns_in {
                                Ok(())
                            } else {
                                Err(NotSelected::NotLabelled)
                            };
                            assert_eq!(
                                got, want,
                                "hostNetwork={host_network} pod=({pod_ringway:?}, {pod_istio:?}) \
                                 namespace=({ns_ringway:?}, {ns_istio:?})"
                            );
                            captured += usize::from(got.is_ok());
                        }
                    }
                }
            }
        }
        assert_eq!(n, 2 * 8 * 8 * 8 * 8);
        // Not vacuous: both outcomes occur.
        assert!(captured > 0 && captured < n, "{captured} of {n}");
    }

    /// The precedence when the two labels disagree, spelled out.
    #[test]
    fn an_opt_out_by_either_label_wins_over_any_enrollment() {
        for (ringway, istio) in [
            (Some("enabled"), Some("none")),
            (Some("disabled"), Some("ambient")),
            (Some("disabled"), None),
            (None, Some("none")),
        ] {
            assert_eq!(PodMode::of(ringway, istio), PodMode::OptOut);
            assert_eq!(
                selected(false, PodMode::of(ringway, istio), true),
                Err(NotSelected::PodOptOut),
                "{ringway:?} {istio:?} in an enrolled namespace"
            );
        }
        // Either label enrolls a pod of a namespace that enrolls nothing.
        for (ringway, istio) in [(Some("enabled"), None), (None, Some("ambient"))] {
            assert_eq!(selected(false, PodMode::of(ringway, istio), false), Ok(()));
        }
        // A namespace has no opt-out: either enrolling label enrolls it.
        assert!(namespace_enabled_by(Some("enabled"), Some("none")));
        assert!(namespace_enabled_by(Some("disabled"), Some("ambient")));
        assert!(!namespace_enabled_by(Some("ambient"), Some("enabled")));
        assert!(!namespace_enabled_by(Some("Enabled"), Some("Ambient")));
        assert!(!namespace_enabled(None));
    }
}
