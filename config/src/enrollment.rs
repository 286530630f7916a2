//! Which pods belong to the mesh: the `ringway.io/dataplane-mode` rule.
//!
//! One rule, used by the node agent (the CNI ADD and its Kubernetes watch,
//! `ringway_cni::kube::decide`) to capture a pod and by the Kubernetes mesh
//! source ([`crate::kube`], feature `kube`) to mark a workload `tunnel: true`
//! (its node proxy serves it, so it accepts HBONE). Pure: label values in, an
//! answer out; the Kubernetes objects are read by the callers.
//!
//! In order: a `hostNetwork` pod never (its network namespace is the node's);
//! a pod labelled `disabled` never; a pod labelled `enabled`, or a pod without
//! either value in a namespace labelled `enabled`, yes; anything else no. A
//! label value other than `enabled`/`disabled` on a pod counts as no label.
//! Pods of the node agent's excluded namespaces ([`DEFAULT_EXCLUDE_NAMESPACES`]
//! unless configured) are never captured either, whatever their labels say;
//! callers apply that list first.

/// The label that enrolls a pod (on the pod or its namespace) or opts it out (on the pod).
pub const DATAPLANE_MODE_LABEL: &str = "ringway.io/dataplane-mode";
/// [`DATAPLANE_MODE_LABEL`] value that enrolls.
pub const DATAPLANE_MODE_ENABLED: &str = "enabled";
/// [`DATAPLANE_MODE_LABEL`] value that opts a pod out, whatever its namespace says.
pub const DATAPLANE_MODE_DISABLED: &str = "disabled";

/// Namespaces whose pods are never captured unless configured otherwise:
/// ringway's own (the node agent and proxy must start without waiting for
/// themselves). The CNI plugin's `excludeNamespaces` default.
pub const DEFAULT_EXCLUDE_NAMESPACES: &[&str] = &["ringway-system"];

/// Why [`selected`] passes a pod over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotSelected {
    /// `spec.hostNetwork`: its network namespace is the node's.
    HostNetwork,
    /// The pod's own label is `disabled`.
    PodOptOut,
    /// Neither the pod nor its namespace is labelled `enabled`.
    NotLabelled,
}

impl std::fmt::Display for NotSelected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotSelected::HostNetwork => "host network",
            NotSelected::PodOptOut => "pod label disabled",
            NotSelected::NotLabelled => "neither pod nor namespace labelled enabled",
        })
    }
}

/// Whether a pod is in the mesh by its labels: `pod_mode` is its
/// [`DATAPLANE_MODE_LABEL`] value, `namespace_enabled` whether its
/// namespace's value is `enabled` ([`namespace_enabled`]). Phase, IPs and
/// the excluded namespaces are the callers' to check.
pub fn selected(
    host_network: bool,
    pod_mode: Option<&str>,
    namespace_enabled: bool,
) -> Result<(), NotSelected> {
    if host_network {
        return Err(NotSelected::HostNetwork);
    }
    match pod_mode {
        Some(DATAPLANE_MODE_ENABLED) => Ok(()),
        Some(DATAPLANE_MODE_DISABLED) => Err(NotSelected::PodOptOut),
        _ if namespace_enabled => Ok(()),
        _ => Err(NotSelected::NotLabelled),
    }
}

/// Whether a namespace whose [`DATAPLANE_MODE_LABEL`] is `mode` enrolls its pods.
pub fn namespace_enabled(mode: Option<&str>) -> bool {
    mode == Some(DATAPLANE_MODE_ENABLED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_combination() {
        for host_network in [false, true] {
            for mode in [None, Some("enabled"), Some("disabled"), Some("ambient")] {
                for ns in [false, true] {
                    let got = selected(host_network, mode, ns);
                    let want = if host_network {
                        Err(NotSelected::HostNetwork)
                    } else if mode == Some("disabled") {
                        Err(NotSelected::PodOptOut)
                    } else if mode == Some("enabled") || ns {
                        Ok(())
                    } else {
                        Err(NotSelected::NotLabelled)
                    };
                    assert_eq!(got, want, "hostNetwork={host_network} pod={mode:?} ns={ns}");
                }
            }
        }
        assert!(namespace_enabled(Some("enabled")));
        assert!(!namespace_enabled(Some("disabled")));
        assert!(!namespace_enabled(Some("Enabled")));
        assert!(!namespace_enabled(None));
    }
}
