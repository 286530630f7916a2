//! Kubernetes objects -> entries of the file model -> one validated [`Mesh`]
//! (see the module docs of [`crate::kube`] for the rules).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    Namespace, Node, Pod, PodStatus, Service as KubeService, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::istio::{self, AuthorizationPolicyObject, PeerAuthenticationObject, PolicyContext};
use super::{KubeOptions, SERVICE_NAME_LABEL};
use crate::enrollment::{self, PodMode};
use crate::model::ClusterPolicyNote;
use crate::{
    ConfigError, LoadBalancingConfig, LocalityConfig, Mesh, MeshConfig, PortMapConfig,
    ServiceConfig, WorkloadConfig,
};

#[cfg(test)]
mod tests;

/// The objects a mesh is built from (the watch's caches, or a test's).
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// Pods (of every namespace).
    pub pods: Vec<Arc<Pod>>,
    /// Namespaces; only their `ringway.io/dataplane-mode` and
    /// `istio.io/dataplane-mode` labels are read.
    pub namespaces: Vec<Arc<Namespace>>,
    /// Services.
    pub services: Vec<Arc<KubeService>>,
    /// EndpointSlices.
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    /// Nodes; only their topology labels are read (the region and zone of
    /// the pods on them).
    pub nodes: Vec<Arc<Node>>,
    /// `security.istio.io` AuthorizationPolicies.
    pub authorization_policies: Vec<Arc<AuthorizationPolicyObject>>,
    /// `security.istio.io` PeerAuthentications.
    pub peer_authentications: Vec<Arc<PeerAuthenticationObject>>,
}

/// A node's region label.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// A node's zone label.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Node name -> its topology labels.
fn localities(nodes: &[Arc<Node>]) -> HashMap<&str, LocalityConfig> {
    nodes
        .iter()
        .filter_map(|n| {
            let labels = n.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|l| l.get(k)).cloned().unwrap_or_default();
            Some((
                n.metadata.name.as_deref()?,
                LocalityConfig {
                    region: label(REGION_LABEL),
                    zone: label(ZONE_LABEL),
                },
            ))
        })
        .collect()
}

/// What [`build_mesh`] made.
#[derive(Debug, Clone)]
pub struct KubeMesh {
    /// The file's snapshot with the cluster's workloads and services added.
    pub mesh: Mesh,
    /// Objects (or parts of them) left out, each with why; sorted.
    pub skipped: Vec<Skipped>,
}

/// An object, or a part of one, left out of the mesh.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Skipped {
    /// Kind, namespace and name: `Pod shop/web-0`, `Service shop/web`.
    pub object: String,
    /// Why, as validation or the mapping says it.
    pub reason: String,
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.object, self.reason)
    }
}

/// Builds the snapshot of `base`'s configuration file merged with
/// `cluster`'s workloads and services: `base`'s settings, trust domain, CA,
/// policies, workloads and services, then the cluster's. Never fails: an
/// object that does not validate is left out and reported in
/// [`KubeMesh::skipped`].
pub fn build_mesh(base: &Mesh, cluster: &Cluster, options: &KubeOptions) -> KubeMesh {
    let mut skipped = Vec::new();
    let Some(file) = base.source::<MeshConfig>() else {
        // Cannot happen: every public way of building a Mesh keeps its
        // configuration. Keep the snapshot as it is rather than fail.
        skipped.push(Skipped {
            object: "the Kubernetes objects".into(),
            reason: format!(
                "the snapshot of {} does not hold its configuration",
                base.origin()
            ),
        });
        return KubeMesh {
            mesh: base.clone(),
            skipped,
        };
    };

    let not_ready: HashSet<&str> = cluster
        .endpoint_slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(false))
        .filter_map(pod_uid)
        .collect();
    let enabled_namespaces: HashSet<&str> = cluster
        .namespaces
        .iter()
        .filter(|ns| enrollment::namespace_enabled(ns.metadata.labels.as_ref()))
        .filter_map(|ns| ns.metadata.name.as_deref())
        .collect();

    let mut pods: Vec<&Pod> = cluster.pods.iter().map(|p| &**p).collect();
    pods.sort_by(|a, b| pod_order(a).cmp(&pod_order(b)));
    let localities = localities(&cluster.nodes);
    let mut workloads: Vec<(WorkloadConfig, String)> = Vec::new();
    for pod in &pods {
        if let Ok(mut w) = workload(pod, &enabled_namespaces, options) {
            w.healthy = !not_ready.contains(w.uid.as_str());
            if let Some(l) = localities.get(w.node.as_str()) {
                w.locality = l.clone();
            }
            workloads.push((w, object("Pod", &pod.metadata)));
        }
    }

    let services = {
        let known: HashSet<&str> = file
            .workloads
            .iter()
            .chain(workloads.iter().map(|(w, _)| w))
            .map(|w| w.uid.as_str())
            .collect();
        // Every address a workload of the mesh holds (a slice's address
        // without a pod may still be one).
        let held: HashSet<&str> = file
            .workloads
            .iter()
            .chain(workloads.iter().map(|(w, _)| w))
            .flat_map(|w| w.ips.iter().map(String::as_str))
            .collect();
        let known = Known {
            uids: known,
            addresses: held,
        };
        let index = Index::new(&pods, &cluster.endpoint_slices);
        let mut kube_services: Vec<&KubeService> = cluster.services.iter().map(|s| &**s).collect();
        kube_services
            .sort_by_key(|s| (s.metadata.namespace.as_deref(), s.metadata.name.as_deref()));
        let mut services = Vec::new();
        for svc in kube_services {
            let name = object("Service", &svc.metadata);
            let mut notes = Vec::new();
            if let Some(s) = service(svc, &index, &known, options, &mut notes) {
                services.push((s, name.clone()));
            }
            skipped.extend(notes.into_iter().map(|reason| Skipped {
                object: name.clone(),
                reason,
            }));
        }
        services
    };

    let mut mapped = istio::map_policies(
        &cluster.authorization_policies,
        &cluster.peer_authentications,
        &PolicyContext {
            root_namespace: &options.istio_root_namespace,
        },
    );
    let mut mesh = merge(base, &file, workloads, services, &mut mapped, &mut skipped);
    mapped.notes.sort();
    skipped.extend(mapped.notes.iter().map(|n| Skipped {
        object: n.object.clone(),
        reason: if n.skipped {
            n.reason.clone()
        } else {
            format!("kept, with a change: {}", n.reason)
        },
    }));
    mesh.cluster_policy_notes = mapped.notes;
    // Pods the watch has not seen yet may be enrolled already: their
    // traffic waits for them (`proxy.workloadWait`), never guessed.
    mesh.complete = false;
    skipped.sort();
    KubeMesh { mesh, skipped }
}

/// `Kind namespace/name`.
fn object(kind: &str, meta: &ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// Running pods before terminating ones, then newest first (the owner of a
/// reused IP is the newest pod), then by namespace and name.
fn pod_order(pod: &Pod) -> impl Ord + '_ {
    let meta = &pod.metadata;
    (
        meta.deletion_timestamp.is_some(),
        Reverse(meta.creation_timestamp.as_ref()),
        meta.namespace.as_deref(),
        meta.name.as_deref(),
    )
}

/// Why a pod is not a workload (not an error: such pods are simply not in
/// the mesh yet, or never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAWorkload {
    NoUid,
    HostNetwork,
    /// `Succeeded` or `Failed`: its containers are done.
    Finished,
    NoIp,
}

/// A pod's workload entry (`healthy` is set by the caller, from the slices).
pub(crate) fn workload(
    pod: &Pod,
    enabled_namespaces: &HashSet<&str>,
    options: &KubeOptions,
) -> Result<WorkloadConfig, NotAWorkload> {
    let meta = &pod.metadata;
    let uid = meta
        .uid
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(NotAWorkload::NoUid)?;
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.host_network).unwrap_or(false) {
        return Err(NotAWorkload::HostNetwork);
    }
    // Labels and selectors apply from the moment a pod has an address,
    // whatever its phase: a pod stuck `Pending` (an image that cannot be
    // pulled) or serving from native sidecars during its init is a pod the
    // policies must see.
    let status = pod.status.as_ref();
    if matches!(
        status.and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    ) {
        return Err(NotAWorkload::Finished);
    }
    let ips = status.map(pod_ips).unwrap_or_default();
    if ips.is_empty() {
        return Err(NotAWorkload::NoIp);
    }
    let namespace = meta.namespace.clone().unwrap_or_default();
    let excluded = options.exclude_namespaces.contains(&namespace);
    // No service account (a static pod's mirror): no identity, so no
    // certificate and no HBONE; never `default`, an identity no such pod has.
    let service_account = spec
        .and_then(|s| {
            s.service_account_name
                .as_deref()
                .or(s.service_account.as_deref())
        })
        .unwrap_or("")
        .to_owned();
    let tunnel = !excluded
        && !service_account.is_empty()
        && enrollment::selected(
            false,
            PodMode::from_labels(meta.labels.as_ref()),
            enabled_namespaces.contains(namespace.as_str()),
        )
        .is_ok();
    Ok(WorkloadConfig {
        uid: uid.to_owned(),
        name: meta.name.clone().unwrap_or_default(),
        namespace,
        service_account,
        ips,
        node: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        tunnel,
        healthy: true,
        labels: meta.labels.clone().unwrap_or_default(),
        // Set by the caller, from the pod's Node.
        locality: Default::default(),
        workload_name: Some(crate::model::workload_name_of(
            meta.name.as_deref().unwrap_or_default(),
            meta.owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .map(|o| (o.kind.as_str(), o.name.as_str())),
            meta.labels
                .as_ref()
                .and_then(|l| l.get("pod-template-hash"))
                .map(String::as_str),
        )),
    })
}

/// `status.podIPs` in order (primary first), else `status.podIP`.
fn pod_ips(status: &PodStatus) -> Vec<String> {
    match &status.pod_ips {
        Some(list) if !list.is_empty() => list.iter().map(|ip| ip.ip.clone()).collect(),
        _ => status
            .pod_ip
            .iter()
            .filter(|ip| !ip.is_empty())
            .cloned()
            .collect(),
    }
}

/// The uid of the pod an endpoint points at.
fn pod_uid(endpoint: &Endpoint) -> Option<&str> {
    let target = endpoint.target_ref.as_ref()?;
    if target.kind.as_deref() != Some("Pod") {
        return None;
    }
    target.uid.as_deref().filter(|u| !u.is_empty())
}

fn is_tcp(protocol: Option<&str>) -> bool {
    protocol.is_none_or(|p| p == "TCP")
}

/// Lookups for the services: slices by service, pods by uid and namespace.
pub(crate) struct Index<'a> {
    /// namespace -> service name -> its slices, by slice name.
    slices: HashMap<&'a str, HashMap<&'a str, Vec<&'a EndpointSlice>>>,
    pods_by_uid: HashMap<&'a str, &'a Pod>,
    pods_by_namespace: HashMap<&'a str, Vec<&'a Pod>>,
}

impl<'a> Index<'a> {
    pub(crate) fn new(pods: &[&'a Pod], slices: &'a [Arc<EndpointSlice>]) -> Index<'a> {
        let mut by_service: HashMap<&str, HashMap<&str, Vec<&EndpointSlice>>> = HashMap::new();
        for slice in slices {
            let meta = &slice.metadata;
            let service = meta.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
            if let (Some(ns), Some(service)) = (meta.namespace.as_deref(), service) {
                by_service
                    .entry(ns)
                    .or_default()
                    .entry(service)
                    .or_default()
                    .push(slice);
            }
        }
        for list in by_service.values_mut().flat_map(|m| m.values_mut()) {
            list.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        }
        let mut pods_by_uid = HashMap::new();
        let mut pods_by_namespace: HashMap<&str, Vec<&Pod>> = HashMap::new();
        for pod in pods {
            if let Some(uid) = pod.metadata.uid.as_deref() {
                pods_by_uid.insert(uid, *pod);
            }
            pods_by_namespace
                .entry(pod.metadata.namespace.as_deref().unwrap_or(""))
                .or_default()
                .push(*pod);
        }
        Index {
            slices: by_service,
            pods_by_uid,
            pods_by_namespace,
        }
    }

    fn slices(&self, namespace: &str, service: &str) -> &[&'a EndpointSlice] {
        self.slices
            .get(namespace)
            .and_then(|m| m.get(service))
            .map(Vec::as_slice)
            .unwrap_or_default()
    }
}

/// The workloads of the mesh a service's endpoints may be: their uids and
/// every address they hold.
pub(crate) struct Known<'a> {
    pub(crate) uids: HashSet<&'a str>,
    pub(crate) addresses: HashSet<&'a str>,
}

/// A service's entry, or `None` for an ExternalName service and for one
/// whose endpoints are all outside the mesh (with a note). Ports that
/// cannot be mapped are left out with a note in `notes`.
pub(crate) fn service(
    svc: &KubeService,
    index: &Index<'_>,
    workloads: &Known<'_>,
    options: &KubeOptions,
    notes: &mut Vec<String>,
) -> Option<ServiceConfig> {
    let spec = svc.spec.clone().unwrap_or_default();
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let name = svc.metadata.name.as_deref().unwrap_or("");
    let namespace = svc.metadata.namespace.as_deref().unwrap_or("");
    let slices: Vec<&EndpointSlice> = index
        .slices(namespace, name)
        .iter()
        .copied()
        .filter(|s| s.address_type != "FQDN")
        .collect();

    let vips = match spec.cluster_ips.as_deref() {
        Some(list) if !list.is_empty() => list.to_vec(),
        _ => spec.cluster_ip.iter().cloned().collect(),
    };
    let vips = vips
        .into_iter()
        .filter(|ip| !ip.is_empty() && ip != "None")
        .collect();

    // Each pod once: dual-stack services list it in an IPv4 and an IPv6 slice.
    let mut listed: HashSet<&str> = HashSet::new();
    let endpoints: Vec<String> = slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter_map(pod_uid)
        .filter(|uid| workloads.uids.contains(uid) && listed.insert(uid))
        .map(str::to_owned)
        .collect();
    // Endpoints that are not of the mesh and never will be: addresses
    // without a pod that no workload of the mesh holds (the API server's
    // `default/kubernetes`) and pods on their node's network. A service
    // all of whose endpoints are such is left out: its addresses are then
    // passed through like any outside the mesh, never refused for want of
    // a mesh endpoint. (A pod the watch has not delivered yet, or a mesh
    // workload's address in a hand-made slice, is not one of them: its
    // service stays, never a way around the mesh's TLS.)
    let all: Vec<&Endpoint> = slices.iter().flat_map(|s| s.endpoints.iter()).collect();
    let outside = |e: &Endpoint| match pod_uid(e) {
        None => e
            .addresses
            .iter()
            .all(|a| !workloads.addresses.contains(a.as_str())),
        Some(uid) => index.pods_by_uid.get(uid).is_some_and(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false)
        }),
    };
    if endpoints.is_empty() && !all.is_empty() && all.iter().all(|e| outside(e)) {
        notes.push(
            "left out of the mesh: none of its endpoints is of the mesh (addresses no workload of \
             the mesh holds, or pods on their node's network); its addresses are passed through \
             like any outside the mesh"
                .to_owned(),
        );
        return None;
    }

    let mut ports = Vec::new();
    for sp in spec.ports.iter().flatten() {
        if !is_tcp(sp.protocol.as_deref()) {
            continue;
        }
        let target = match &sp.target_port {
            None => i64::from(sp.port),
            Some(IntOrString::Int(n)) => i64::from(*n),
            Some(IntOrString::String(port_name)) => {
                match named_target(sp, port_name, &slices, index, &spec.selector, namespace) {
                    Ok((port, others)) => {
                        if !others.is_empty() {
                            notes.push(format!(
                                "port {}: targetPort {port_name:?} is {port} on some pods and {others:?} \
                                 on others; the mesh holds one target port per service port, {port} is used",
                                sp.port
                            ));
                        }
                        i64::from(port)
                    }
                    Err(why) => {
                        notes.push(format!("port {} left out: {why}", sp.port));
                        continue;
                    }
                }
            }
        };
        ports.push((i64::from(sp.port), target));
    }

    Some(ServiceConfig {
        hostname: format!("{name}.{namespace}.svc.{}", options.cluster_domain),
        namespace: namespace.to_owned(),
        vips,
        ports: PortMapConfig(ports),
        endpoints,
        load_balancing: load_balancing(&spec),
    })
}

/// How the Service asks its endpoints to be picked, as the reference's
/// control plane reads it: `internalTrafficPolicy: Local` only the
/// client's node's; `trafficDistribution: PreferClose` the closest first;
/// `publishNotReadyAddresses` those not ready too.
fn load_balancing(spec: &ServiceSpec) -> Option<LoadBalancingConfig> {
    let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect();
    let mut lb = if spec.internal_traffic_policy.as_deref() == Some("Local") {
        LoadBalancingConfig {
            routing_preference: words(&["node"]),
            mode: Some("strict".into()),
            health_policy: None,
        }
    } else if spec.traffic_distribution.as_deref() == Some("PreferClose") {
        LoadBalancingConfig {
            routing_preference: words(&["network", "region", "zone", "subzone"]),
            mode: Some("failover".into()),
            health_policy: None,
        }
    } else {
        LoadBalancingConfig::default()
    };
    if spec.publish_not_ready_addresses == Some(true) {
        lb.health_policy = Some("allowAll".into());
    }
    (lb != LoadBalancingConfig::default()).then_some(lb)
}

/// A named `targetPort` that no pod of the service defines.
#[derive(Debug, thiserror::Error)]
#[error("targetPort {0:?} is not a TCP container port of its pods")]
struct UnresolvedPort(String);

/// The number a named `targetPort` stands for, and the other numbers it
/// stands for on other pods (if any).
fn named_target(
    sp: &ServicePort,
    port_name: &str,
    slices: &[&EndpointSlice],
    index: &Index<'_>,
    selector: &Option<BTreeMap<String, String>>,
    namespace: &str,
) -> Result<(i32, Vec<i32>), UnresolvedPort> {
    // The EndpointSlice controller writes, per group of pods, the service
    // port's name and the number the target name resolved to on them.
    let wanted = sp.name.as_deref().unwrap_or("");
    let mut found: Vec<i32> = Vec::new();
    for p in slices.iter().flat_map(|s| s.ports.iter().flatten()) {
        if p.name.as_deref().unwrap_or("") == wanted && is_tcp(p.protocol.as_deref()) {
            if let Some(n) = p.port.filter(|n| !found.contains(n)) {
                found.push(n);
            }
        }
    }
    if let Some((&first, rest)) = found.split_first() {
        return Ok((first, rest.to_vec()));
    }
    // No slice lists it yet: resolve it on the pods, as the controller does:
    // the service's endpoint pods, then the pods its selector matches.
    let endpoint_pods = slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter_map(pod_uid)
        .filter_map(|uid| index.pods_by_uid.get(uid).copied());
    let selected = selector
        .as_ref()
        .filter(|sel| !sel.is_empty())
        .into_iter()
        .flat_map(|sel| {
            index
                .pods_by_namespace
                .get(namespace)
                .into_iter()
                .flatten()
                .copied()
                .filter(move |pod| {
                    let labels = pod.metadata.labels.as_ref();
                    sel.iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
        });
    endpoint_pods
        .chain(selected)
        .find_map(|pod| container_port(pod, port_name))
        .map(|n| (n, Vec::new()))
        .ok_or_else(|| UnresolvedPort(port_name.to_owned()))
}

/// Kubernetes' FindPort: the TCP port called `name` of the pod's containers
/// (sidecar init containers, `restartPolicy: Always`, included).
fn container_port(pod: &Pod, name: &str) -> Option<i32> {
    let spec = pod.spec.as_ref()?;
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some(name) && is_tcp(p.protocol.as_deref()))
        .map(|p| p.container_port)
}

/// Which entry a validation error is about.
#[derive(Debug, PartialEq, Eq)]
enum Culprit {
    Workload(usize),
    Service(usize),
    Policy(usize),
    PeerAuthentication(usize),
}

/// `workloads[12].ips[0]` -> (`workloads`, 12, `ips[0]`).
fn split_path(path: &str) -> Option<(&str, usize, &str)> {
    let (section, rest) = path.split_once('[')?;
    let (index, rest) = rest.split_once(']')?;
    Some((
        section,
        index.parse().ok()?,
        rest.strip_prefix('.').unwrap_or(rest),
    ))
}

/// Appends the cluster's entries to the file's and validates, leaving out
/// each entry the validation refuses until it passes.
fn merge(
    base: &Mesh,
    file: &Arc<MeshConfig>,
    workloads: Vec<(WorkloadConfig, String)>,
    services: Vec<(ServiceConfig, String)>,
    policies: &mut istio::MappedPolicies,
    skipped: &mut Vec<Skipped>,
) -> Mesh {
    let file_workloads = file.workloads.len();
    let file_services = file.services.len();
    let file_policies = file.policies.len();
    let mut cfg = MeshConfig::clone(file);
    cfg.policies.append(&mut policies.policies);
    cfg.peer_authentications
        .append(&mut policies.peer_authentications);
    let (ws, mut workload_objects): (Vec<_>, Vec<_>) = workloads.into_iter().unzip();
    let (ss, mut service_objects): (Vec<_>, Vec<_>) = services.into_iter().unzip();
    cfg.workloads.extend(ws);
    cfg.services.extend(ss);
    let origin = format!("{} + kubernetes", base.origin());
    loop {
        let err =
            match crate::validate::validate(&cfg, &origin, base.env_overrides(), base.revision()) {
                Ok(mut mesh) => {
                    mesh.set_source(file.clone());
                    return mesh;
                }
                Err(err) => err,
            };
        let (culprit, reason) =
            match blame(&err, &cfg, file_workloads, file_services, file_policies) {
                Some(found) => found,
                None => {
                    // Not an entry of the cluster's: the file's part is valid on
                    // its own (it is `base`), so this cannot happen; keep the
                    // file's snapshot rather than fail.
                    skipped.push(Skipped {
                        object: "the Kubernetes objects".into(),
                        reason: err.to_string(),
                    });
                    return base.clone();
                }
            };
        match culprit {
            Culprit::Workload(i) => {
                let w = cfg.workloads.remove(i);
                let object = workload_objects.remove(i - file_workloads);
                skipped.push(Skipped { object, reason });
                if !cfg.workloads.iter().any(|o| o.uid == w.uid) {
                    for s in &mut cfg.services[file_services..] {
                        s.endpoints.retain(|uid| *uid != w.uid);
                    }
                }
            }
            Culprit::Service(i) => {
                cfg.services.remove(i);
                let object = service_objects.remove(i - file_services);
                skipped.push(Skipped { object, reason });
            }
            // A policy the validation refuses is not dropped (a DENY or a
            // STRICT would vanish): it stands as what errs toward deny for
            // what it could select, its namespace. Only that replacement
            // refused too (it cannot be) is left out.
            Culprit::Policy(i) => {
                let p = &mut cfg.policies[i];
                let object = p.origin.clone().unwrap_or_else(|| p.name.clone());
                let deny_all = crate::PolicyConfig {
                    name: p.name.clone(),
                    namespace: p.namespace.clone(),
                    selector: None,
                    action: "DENY".into(),
                    rules: vec![crate::RuleConfig::default()],
                    origin: p.origin.clone(),
                };
                if *p == deny_all {
                    cfg.policies.remove(i);
                    policies
                        .notes
                        .push(invalid("AuthorizationPolicy", object, reason));
                } else {
                    let scope = istio::scope_of(&deny_all);
                    *p = deny_all;
                    policies.notes.push(ClusterPolicyNote {
                        object,
                        kind: "AuthorizationPolicy",
                        skipped: false,
                        code: "unreadable-deny-all",
                        reason: format!(
                            "{reason}: a policy that cannot be read denies every connection to \
                             what it could select ({scope})"
                        ),
                    });
                }
            }
            Culprit::PeerAuthentication(i) => {
                let p = &mut cfg.peer_authentications[i];
                let strict = crate::PeerAuthenticationConfig {
                    match_labels: None,
                    mode: "STRICT".into(),
                    port_modes: Vec::new(),
                    ..p.clone()
                };
                if *p == strict {
                    let p = cfg.peer_authentications.remove(i);
                    policies
                        .notes
                        .push(invalid("PeerAuthentication", p.origin, reason));
                } else {
                    let object = p.origin.clone();
                    *p = strict;
                    policies.notes.push(ClusterPolicyNote {
                        object,
                        kind: "PeerAuthentication",
                        skipped: false,
                        code: "unreadable-strict",
                        reason: format!(
                            "{reason}: a PeerAuthentication that cannot be read is STRICT for \
                             every workload of its namespace"
                        ),
                    });
                }
            }
        }
    }
}

fn invalid(kind: &'static str, object: String, reason: String) -> ClusterPolicyNote {
    ClusterPolicyNote {
        object,
        kind,
        skipped: true,
        code: "invalid",
        reason,
    }
}

/// The cluster entry a validation error is about, and the reason to give
/// for leaving it out. `None` when the error is not about one.
fn blame(
    err: &ConfigError,
    cfg: &MeshConfig,
    file_workloads: usize,
    file_services: usize,
    file_policies: usize,
) -> Option<(Culprit, String)> {
    let ConfigError::Field { path, problem, .. } = err else {
        return None;
    };
    let (section, i, rest) = split_path(path)?;
    let reason = if rest.is_empty() {
        problem.clone()
    } else {
        format!("{rest}: {problem}")
    };
    match section {
        "workloads" if i >= file_workloads && i < cfg.workloads.len() => {
            Some((Culprit::Workload(i), reason))
        }
        "services" if i >= file_services && i < cfg.services.len() => {
            Some((Culprit::Service(i), reason))
        }
        "policies" if i >= file_policies && i < cfg.policies.len() => {
            Some((Culprit::Policy(i), reason))
        }
        "peerAuthentications" if i < cfg.peer_authentications.len() => {
            Some((Culprit::PeerAuthentication(i), reason))
        }
        "services" if i < file_services => {
            // A VIP of the file's that is a pod's address: the pod is the
            // one left out (the file's entries come first).
            let (_, j, _) = split_path(rest).filter(|(f, _, _)| *f == "vips")?;
            let file_service = cfg.services.get(i)?;
            let vip = file_service.vips.get(j)?.parse::<IpAddr>().ok()?;
            let owner = cfg.workloads[file_workloads..].iter().position(|w| {
                w.ips.iter().any(|ip| {
                    ip.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
                        == Some(vip.to_canonical())
                })
            })?;
            Some((
                Culprit::Workload(file_workloads + owner),
                format!(
                    "ips: {vip} is a VIP of the configuration's services[{i}] ({})",
                    file_service.hostname
                ),
            ))
        }
        _ => None,
    }
}
