//! The mesh's workloads (pods) and services as the snapshot holds them,
//! with the reference's rules for a workload's canonical service, revision
//! and workload name.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use super::identity::Identity;

/// A pod of the mesh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// Unique id (the pod's UID).
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
    /// Pod IPs (IPv4-mapped IPv6 addresses are stored as IPv4).
    pub ips: Vec<IpAddr>,
    /// The pod shares its node's network (`hostNetwork`): its addresses
    /// are the node's, so they never name it (no lookup by address finds
    /// it); a service's connections may still go to them as an endpoint.
    pub host_network: bool,
    /// Node the pod runs on.
    pub node: String,
    /// Whether the pod's node proxy speaks HBONE (port 15008).
    pub tunnel: bool,
    /// Whether the workload takes new connections sent to its services.
    pub healthy: bool,
    /// The pod's labels (validated Kubernetes label syntax).
    pub labels: BTreeMap<String, String>,
    /// The topology of the pod's node, when known.
    pub locality: Locality,
    /// The workload the pod belongs to (see [`workload_name_of`]); the pod's
    /// name when it has no controller.
    pub workload_name: String,
    /// The trust domain of its identity when it is not the mesh's (the
    /// control plane says so per workload).
    pub trust_domain: Option<String>,
    /// Its canonical service and revision as the control plane computed
    /// them (from the pod's labels there); `None`: from [`Workload::labels`].
    pub canonical: Option<(String, String)>,
    /// Why traffic to it must not be sent straight to it (a waypoint, a
    /// network gateway), which this proxy does not support yet: such traffic
    /// is refused and counted, never sent around the waypoint.
    pub unsupported: Option<Unsupported>,
    /// Policies that apply to it because they name it (`namespace/name`;
    /// the control plane's label-selected policies), beside the mesh-wide
    /// and namespace ones.
    pub authorization_policies: Vec<Arc<str>>,
}

/// A part of the mesh this proxy cannot honour yet, on a workload or a
/// service: traffic that would need it is refused (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Unsupported {
    /// A waypoint proxy must see its inbound traffic (`namespace/hostname`
    /// or address of the waypoint).
    Waypoint(String),
    /// It is reached through an east-west network gateway.
    NetworkGateway(String),
    /// Its app wants its inbound traffic delivered with tunnel information
    /// in front (the control plane's `application_tunnel`, e.g. a PROXY
    /// protocol header), which this proxy does not write: plain TCP would
    /// reach it as if from the proxy. What it wants, in words.
    ApplicationTunnel(String),
}

impl Unsupported {
    /// A short name for metrics labels.
    pub fn label(&self) -> &'static str {
        match self {
            Unsupported::Waypoint(_) => "waypoint",
            Unsupported::NetworkGateway(_) => "network_gateway",
            Unsupported::ApplicationTunnel(_) => "application_tunnel",
        }
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::Waypoint(w) => write!(
                f,
                "its traffic must pass the waypoint {w}, which this proxy does not support"
            ),
            Unsupported::NetworkGateway(g) => {
                write!(f, "it is reached through the network gateway {g}, which this proxy does not support")
            }
            Unsupported::ApplicationTunnel(t) => write!(
                f,
                "its app wants its inbound traffic delivered with {t}, which this proxy does not write"
            ),
        }
    }
}

/// A node's topology (`topology.kubernetes.io/region` and `zone`, and the
/// mesh's subzone); empty strings when not known.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Locality {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Subzone (`topology.istio.io/subzone`).
    pub subzone: String,
}

/// How a connection to a service picks among its endpoints (the control
/// plane's `load_balancing`: `internalTrafficPolicy: Local`,
/// `trafficDistribution: PreferClose`, `publishNotReadyAddresses`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBalancing {
    /// What an endpoint should share with the client, in order of
    /// importance.
    pub routing_preference: Vec<Scope>,
    /// How the preference applies.
    pub mode: LbMode,
    /// Endpoints that are not ready take connections too.
    pub allow_unhealthy: bool,
}

/// A part of the topology a client and an endpoint may share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// The same region.
    Region,
    /// The same zone.
    Zone,
    /// The same subzone.
    Subzone,
    /// The same node.
    Node,
    /// The same cluster (this proxy serves one: always shared).
    Cluster,
    /// The same network (this proxy serves one: always shared).
    Network,
}

/// How [`LoadBalancing::routing_preference`] applies (with no scope
/// listed, strict and failover alike take every endpoint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LbMode {
    /// Only endpoints that share every scope with the client; none (the
    /// connection is refused) when no endpoint does.
    Strict,
    /// The endpoints that share the longest run of scopes, in order, with
    /// the client; the others only when none shares more.
    #[default]
    Failover,
    /// No endpoint is picked: the connection goes to the address the
    /// client dialled, as to an address outside the mesh.
    Passthrough,
}

/// The label that names a workload's canonical service.
pub const CANONICAL_NAME_LABEL: &str = "service.istio.io/canonical-name";
/// The label that names a workload's canonical revision.
pub const CANONICAL_REVISION_LABEL: &str = "service.istio.io/canonical-revision";

// The reference control plane derives both from the pod's labels
// (istio/istio `pkg/config/labels`, `CanonicalService(labels, workloadName)`):
// name = `service.istio.io/canonical-name`, else `app.kubernetes.io/name`,
// else `app`, else the workload name; revision =
// `service.istio.io/canonical-revision`, else `app.kubernetes.io/version`,
// else `version`, else the literal `latest`. The first label present wins,
// even when its value is empty.
const NAME_LABELS: [&str; 3] = [CANONICAL_NAME_LABEL, "app.kubernetes.io/name", "app"];
const REVISION_LABELS: [&str; 3] = [
    CANONICAL_REVISION_LABEL,
    "app.kubernetes.io/version",
    "version",
];

fn first_label<'a>(labels: &'a BTreeMap<String, String>, keys: &[&str]) -> Option<&'a str> {
    keys.iter().find_map(|k| labels.get(*k)).map(String::as_str)
}

impl Workload {
    /// The workload's canonical service (the reference's rule: see
    /// [`CANONICAL_NAME_LABEL`]); the workload name when no label says.
    pub fn canonical_service(&self) -> &str {
        match &self.canonical {
            Some((name, _)) => name,
            None => first_label(&self.labels, &NAME_LABELS).unwrap_or(&self.workload_name),
        }
    }

    /// The workload's canonical revision; `latest` when no label says.
    pub fn canonical_revision(&self) -> &str {
        match &self.canonical {
            Some((_, revision)) => revision,
            None => first_label(&self.labels, &REVISION_LABELS).unwrap_or("latest"),
        }
    }

    /// The workload's SPIFFE identity: in its own trust domain when the
    /// control plane gave one, else in `mesh_trust_domain`.
    pub fn identity(&self, mesh_trust_domain: &str) -> Identity {
        let td = self.trust_domain.as_deref().unwrap_or(mesh_trust_domain);
        Identity::new(td, &self.namespace, &self.service_account)
    }
}

/// A service: virtual IPs in front of workloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// DNS name.
    pub hostname: String,
    /// Namespace.
    pub namespace: String,
    /// Virtual IPs.
    pub vips: Vec<IpAddr>,
    /// Service port -> target port (0: each endpoint says; see
    /// [`Mesh::endpoints`](super::Mesh::endpoints)).
    pub ports: BTreeMap<u16, u16>,
    /// Why its traffic must not go straight to its endpoints (a waypoint):
    /// refused while this proxy does not support it.
    pub unsupported: Option<Unsupported>,
    /// How its endpoints are picked (`None`: any healthy one).
    pub load_balancing: Option<LoadBalancing>,
}

impl Service {
    /// `namespace/hostname`: how the mesh names it.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.hostname)
    }

    /// The service's name: the host name's first part (`reviews` of
    /// `reviews.default.svc.cluster.local`).
    pub fn name(&self) -> &str {
        self.hostname.split('.').next().unwrap_or(&self.hostname)
    }

    /// The workload port a connection to `service_port` goes to.
    pub fn target_port(&self, service_port: u16) -> Option<u16> {
        self.ports.get(&service_port).copied()
    }
}

/// The name of the workload a pod belongs to, as the reference mesh derives
/// it from the pod's controller (istio's `GetDeployMetaFromPod`): a
/// ReplicaSet named `<deployment>-<pod-template-hash>` stands for its
/// Deployment; a Job named `<cronjob>-<8 to 11 digits>` for its CronJob; any
/// other controller by its own name; no controller: the pod's name.
pub fn workload_name_of(
    pod_name: &str,
    controller: Option<(&str, &str)>,
    pod_template_hash: Option<&str>,
) -> String {
    let Some((kind, name)) = controller else {
        return pod_name.to_owned();
    };
    match kind {
        "ReplicaSet" => match pod_template_hash {
            Some(hash) if !hash.is_empty() => name
                .strip_suffix(hash)
                .and_then(|n| n.strip_suffix('-'))
                .filter(|n| !n.is_empty())
                .unwrap_or(name)
                .to_owned(),
            _ => name.to_owned(),
        },
        "Job" => match name.rsplit_once('-') {
            Some((cron, stamp))
                if !cron.is_empty()
                    && (8..=11).contains(&stamp.len())
                    && stamp.bytes().all(|b| b.is_ascii_digit()) =>
            {
                cron.to_owned()
            }
            _ => name.to_owned(),
        },
        _ => name.to_owned(),
    }
}

#[cfg(test)]
mod workload_name_tests {
    use super::workload_name_of;

    #[test]
    fn workload_names_follow_the_pods_controller() {
        let cases = [
            (
                "web-7d9f8-x2x",
                Some(("ReplicaSet", "web-7d9f8")),
                Some("7d9f8"),
                "web",
            ),
            (
                "web-7d9f8-x2x",
                Some(("ReplicaSet", "web-7d9f8")),
                None,
                "web-7d9f8",
            ),
            (
                "odd-1",
                Some(("ReplicaSet", "other")),
                Some("7d9f8"),
                "other",
            ),
            ("db-0", Some(("StatefulSet", "db")), None, "db"),
            ("agent-abcde", Some(("DaemonSet", "agent")), None, "agent"),
            (
                "backup-28391040-abc",
                Some(("Job", "backup-28391040")),
                None,
                "backup",
            ),
            ("once-x", Some(("Job", "once")), None, "once"),
            (
                "migrate-1234-x",
                Some(("Job", "migrate-1234")),
                None,
                "migrate-1234",
            ),
            ("bare", None, None, "bare"),
        ];
        for (pod, controller, hash, want) in cases {
            assert_eq!(
                workload_name_of(pod, controller, hash),
                want,
                "{pod} {controller:?}"
            );
        }
    }
}
