//! The mesh's workloads and services from Kubernetes (feature `kube`).
//!
//! In a cluster, the workloads and services of the mesh come from the API
//! server instead of the file: [`MeshWatch`] watches Pods, Services and
//! EndpointSlices cluster-wide (plus the Namespaces, whose
//! `ringway.io/dataplane-mode` and `istio.io/dataplane-mode` labels the
//! enrollment rule needs), and
//! publishes a new `Arc<Mesh>` whenever they change. It also watches the
//! mesh's `security.istio.io` AuthorizationPolicies and PeerAuthentications
//! ([`istio`]), enforced beside the file's policies. The trust domain, the
//! CA and the proxy settings keep coming from the configuration file (the
//! ConfigMap): every snapshot is the latest file merged with the latest
//! cluster state, rebuilt on a change of either.
//!
//! The module is two layers:
//! - [`build_mesh`] is the whole mapping, a pure function of the file's
//!   snapshot and the objects ([`Cluster`]): each object becomes an entry of
//!   the file model ([`WorkloadConfig`](crate::WorkloadConfig),
//!   [`ServiceConfig`](crate::ServiceConfig)), the entries are appended to the
//!   file's, and the result goes through the one validation the file goes
//!   through. An object that fails it is left out with a [`Skipped`] naming
//!   it; it never fails the snapshot.
//! - [`MeshWatch`] / [`run`] keep kube-rs reflector caches of the objects and
//!   call [`build_mesh`] at most once per [`KubeOptions::debounce`].
//!
//! The tests run the watch against the fake API server of the test bed
//! (`ringway_testbed::kube_api`), as a dev-dependency: the product carries
//! no test server.
//!
//! # Mapping
//! | object | becomes |
//! | --- | --- |
//! | Pod, `Running` with an IP, not `hostNetwork` | a workload: `uid`, `name`, `namespace`, `serviceAccount` (`spec.serviceAccountName`, default `default`), `ips` (`status.podIPs`, else `status.podIP`), `node` (`spec.nodeName`), `tunnel` = the pod is enrolled by the node agent's rule ([`crate::enrollment`]: its `ringway.io/dataplane-mode` and `istio.io/dataplane-mode` labels, its namespace's, never in [`KubeOptions::exclude_namespaces`]), `healthy` = no EndpointSlice endpoint of it has `conditions.ready: false` |
//! | other pods (pending, finished, no IP yet, host network) | nothing |
//! | Service, not `ExternalName` | a service: `hostname` `<name>.<namespace>.svc.<clusterDomain>`, `vips` = `spec.clusterIPs` (none for a headless service), `ports` = each TCP `port: targetPort` (see below), `endpoints` = the pods (by `targetRef` uid) of its EndpointSlices that are workloads |
//! | EndpointSlice (label `kubernetes.io/service-name`) | its service's endpoints and their readiness |
//!
//! A `targetPort` is a number, absent (= the service port), or the name of a
//! container port. A name is resolved as Kubernetes resolves it: from the
//! service's EndpointSlices, whose ports carry the service port's name and the
//! number the name resolved to on the pods; when no slice lists the port yet,
//! from the container ports (and sidecar init containers) of the service's
//! endpoint pods, then of the pods its selector matches. A name no pod
//! defines leaves that service port out (noted in [`Skipped`]). The model has
//! one target port per service port: when pods resolve a name to different
//! numbers, the first slice's (by name) is used and the others are noted.
//!
//! # Order and conflicts
//! The file's entries come first, so a cluster object that conflicts with one
//! of them (same uid, an address already taken, a service host name the file
//! defines) is the one left out. Pods are ordered running-before-terminating,
//! then newest first: when an IP is reused while the previous owner's pod is
//! still listed (terminating, or its deletion not yet seen), the new pod keeps
//! the address and the old one is left out. A pod left out is also removed
//! from its services' endpoints.
//!
//! # Limitations
//! - `healthy` is per workload: a pod that one EndpointSlice lists as not
//!   ready (e.g. a second service without `publishNotReadyAddresses`) is
//!   unhealthy for all of its services.
//! - Only TCP service ports are mapped (the proxy carries TCP only).
//! - Endpoints without a pod `targetRef` (hand-written EndpointSlices pointing
//!   at addresses) are not mapped: the model's endpoints are workloads.

pub mod istio;
mod map;
mod watch;

use std::time::Duration;

pub use self::map::{build_mesh, Cluster, KubeMesh, Skipped};
pub use self::watch::{connect, run, KubeError, MeshWatch};
pub use ::kube::Client;

/// The cluster's DNS domain unless configured (`--cluster-domain`).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";

/// The EndpointSlice label naming its service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// How objects are mapped and how the watch behaves. [`KubeOptions::default`]
/// gives the production values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeOptions {
    /// Service host names are `<name>.<namespace>.svc.<cluster_domain>`.
    pub cluster_domain: String,
    /// Namespaces whose pods the node agent never captures (the CNI
    /// plugin's `excludeNamespaces`): their workloads get `tunnel: false`.
    pub exclude_namespaces: Vec<String>,
    /// Longest wait between a change and the snapshot that includes it;
    /// changes within it are published together (100 ms).
    pub debounce: Duration,
    /// First delay before a failed list/watch is retried (800 ms).
    pub backoff_min: Duration,
    /// Longest such delay, doubling from `backoff_min` (30 s).
    pub backoff_max: Duration,
    /// The namespace whose `AuthorizationPolicy` and `PeerAuthentication`
    /// objects apply mesh-wide (the reference's root namespace,
    /// `istio-system`).
    pub istio_root_namespace: String,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            cluster_domain: DEFAULT_CLUSTER_DOMAIN.to_owned(),
            exclude_namespaces: crate::enrollment::DEFAULT_EXCLUDE_NAMESPACES
                .iter()
                .map(|n| (*n).to_owned())
                .collect(),
            debounce: Duration::from_millis(100),
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
            istio_root_namespace: istio::DEFAULT_ISTIO_ROOT_NAMESPACE.to_owned(),
        }
    }
}

impl KubeOptions {
    /// Checks the cluster domain (a DNS name) and the timings.
    pub fn validate(&self) -> Result<(), KubeError> {
        crate::names::check_subdomain("cluster domain", &self.cluster_domain)
            .map_err(|e| KubeError::Options(format!("cluster domain: {e}")))?;
        crate::names::check_label("root namespace", &self.istio_root_namespace)
            .map_err(|e| KubeError::Options(format!("istio root namespace: {e}")))?;
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err(KubeError::Options(format!(
                "watch backoff {:?}..{:?}: the first delay must be above 0 and at most the longest",
                self.backoff_min, self.backoff_max
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
