//! The label sets of the proxy's metrics: the reference's `istio_tcp_*`
//! labels ([`TcpLabels`], made from a [`Peer`] on each side and the
//! [`DstService`]), and ringway's own small ones.

use prometheus_client::encoding::EncodeLabelSet;

/// Labels of the `istio_tcp_*` metrics: the reference node proxy's set
/// (istio/ztunnel `src/proxy/metrics.rs`, `CommonTrafficLabels` with its
/// locality labels), with its values: `*_app`/`*_version` are the canonical
/// service and revision there too, and every value not known is `unknown`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TcpLabels {
    /// `source` or `destination`: which side's proxy reports.
    pub reporter: &'static str,
    /// Source workload name.
    pub source_workload: String,
    /// Source canonical service.
    pub source_canonical_service: String,
    /// Source canonical revision.
    pub source_canonical_revision: String,
    /// Source namespace.
    pub source_workload_namespace: String,
    /// Source SPIFFE principal.
    pub source_principal: String,
    /// Source app (the canonical service, as the reference).
    pub source_app: String,
    /// Source version (the canonical revision, as the reference).
    pub source_version: String,
    /// Source cluster.
    pub source_cluster: String,
    /// Destination service host name.
    pub destination_service: String,
    /// Destination service namespace.
    pub destination_service_namespace: String,
    /// Destination service name.
    pub destination_service_name: String,
    /// Destination workload name.
    pub destination_workload: String,
    /// Destination canonical service.
    pub destination_canonical_service: String,
    /// Destination canonical revision.
    pub destination_canonical_revision: String,
    /// Destination namespace.
    pub destination_workload_namespace: String,
    /// Destination SPIFFE principal.
    pub destination_principal: String,
    /// Destination app (the canonical service).
    pub destination_app: String,
    /// Destination version (the canonical revision).
    pub destination_version: String,
    /// Destination cluster.
    pub destination_cluster: String,
    /// Always `tcp` here.
    pub request_protocol: &'static str,
    /// `-` when fine, else the reason (`UF` upstream connect failure, `DENY`).
    pub response_flags: &'static str,
    /// `mutual_tls`, `none` (plaintext) or `unknown`.
    pub connection_security_policy: &'static str,
    /// Region of the source's node.
    pub source_region: String,
    /// Zone of the source's node.
    pub source_zone: String,
    /// Region of the destination's node.
    pub destination_region: String,
    /// Zone of the destination's node.
    pub destination_zone: String,
}

/// One side of a connection as the labels describe it. Empty fields are
/// labelled `unknown`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Peer {
    /// Workload name (the pod's controller, as the reference: a
    /// Deployment's name, else the pod's).
    pub workload: String,
    /// Namespace.
    pub namespace: String,
    /// SPIFFE principal.
    pub principal: String,
    /// Canonical service (also the `*_app` label).
    pub canonical_service: String,
    /// Canonical revision (also the `*_version` label).
    pub canonical_revision: String,
    /// Cluster ID.
    pub cluster: String,
    /// Region of the workload's node.
    pub region: String,
    /// Zone of the workload's node.
    pub zone: String,
}

impl Peer {
    /// A mesh workload as the labels describe it: its name, namespace,
    /// canonical service and revision (from its labels), the mesh's cluster
    /// ID, and `locality` (its node's).
    pub fn of_workload(
        w: &ringway_config::Workload,
        principal: String,
        mesh: &ringway_config::Mesh,
        locality: &ringway_config::Locality,
    ) -> Peer {
        Peer {
            workload: w.workload_name.clone(),
            namespace: w.namespace.clone(),
            principal,
            canonical_service: w.canonical_service().to_owned(),
            canonical_revision: w.canonical_revision().to_owned(),
            cluster: mesh.cluster_id().to_owned(),
            region: locality.region.clone(),
            zone: locality.zone.clone(),
        }
    }
}

impl Peer {
    /// The pod as the labels spell it (namespace, workload; `unknown` when
    /// empty): what [`Metrics::forget_owners`](super::Metrics::forget_owners) drops.
    pub fn owner(&self) -> (String, String) {
        let unknown = |s: &str| if s.is_empty() { "unknown" } else { s }.to_string();
        (unknown(&self.namespace), unknown(&self.workload))
    }
}

/// The service a connection went to: the `destination_service*` labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DstService {
    /// Host name (`destination_service`).
    pub hostname: String,
    /// Name (`destination_service_name`).
    pub name: String,
    /// Namespace (`destination_service_namespace`).
    pub namespace: String,
}

impl DstService {
    /// The labels of a mesh service.
    pub fn of(s: &ringway_config::Service) -> DstService {
        DstService {
            hostname: s.hostname.clone(),
            name: s.name().to_owned(),
            namespace: s.namespace.clone(),
        }
    }
}

impl TcpLabels {
    /// Labels for a connection from `src` to `dst` reported by `reporter`;
    /// `service` when it went to a service (else every `destination_service*`
    /// label is `unknown`, as the reference).
    pub fn new(
        reporter: &'static str,
        src: &Peer,
        dst: &Peer,
        service: Option<&DstService>,
        security: &'static str,
        flags: &'static str,
    ) -> TcpLabels {
        let unknown = |s: &str| {
            if s.is_empty() {
                "unknown".to_string()
            } else {
                s.to_string()
            }
        };
        let svc = |f: fn(&DstService) -> &String| unknown(service.map(f).map_or("", |s| s));
        TcpLabels {
            reporter,
            source_workload: unknown(&src.workload),
            source_canonical_service: unknown(&src.canonical_service),
            source_canonical_revision: unknown(&src.canonical_revision),
            source_workload_namespace: unknown(&src.namespace),
            source_principal: unknown(&src.principal),
            source_app: unknown(&src.canonical_service),
            source_version: unknown(&src.canonical_revision),
            source_cluster: unknown(&src.cluster),
            destination_service: svc(|s| &s.hostname),
            destination_service_namespace: svc(|s| &s.namespace),
            destination_service_name: svc(|s| &s.name),
            destination_workload: unknown(&dst.workload),
            destination_canonical_service: unknown(&dst.canonical_service),
            destination_canonical_revision: unknown(&dst.canonical_revision),
            destination_workload_namespace: unknown(&dst.namespace),
            destination_principal: unknown(&dst.principal),
            destination_app: unknown(&dst.canonical_service),
            destination_version: unknown(&dst.canonical_revision),
            destination_cluster: unknown(&dst.cluster),
            request_protocol: "tcp",
            response_flags: flags,
            connection_security_policy: security,
            source_region: unknown(&src.region),
            source_zone: unknown(&src.zone),
            destination_region: unknown(&dst.region),
            destination_zone: unknown(&dst.zone),
        }
    }

    /// The same labels with other response flags.
    pub fn with_flags(&self, flags: &'static str) -> TcpLabels {
        TcpLabels {
            response_flags: flags,
            ..self.clone()
        }
    }
}

/// `istio_build`'s `component`: the reference node proxy's name (see
/// [`Metrics::registry`](super::Metrics::registry)).
pub const BUILD_COMPONENT: &str = "ztunnel";
/// `istio_build`'s `tag`: this build's version.
pub const BUILD_TAG: &str = env!("CARGO_PKG_VERSION");

/// Labels of `istio_build`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// Always [`BUILD_COMPONENT`].
    pub component: &'static str,
    /// Always [`BUILD_TAG`].
    pub tag: &'static str,
}

/// Labels of ZDS request counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ZdsLabels {
    /// Ack or nack.
    pub outcome: &'static str,
}

/// Labels of TLS handshake counts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TlsLabels {
    /// `client` (outbound tunnel) or `server` (inbound 15008).
    pub side: &'static str,
    /// `ok` or the failure reason.
    pub outcome: &'static str,
}

/// Labels of authorization denials.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DenyLabels {
    /// `hbone` (401 on a tunnel) or `plaintext` (connection reset).
    pub path: &'static str,
}

/// Labels of `ringway_authorization_dry_run_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DryRunLabels {
    /// `would_deny` (the dry-run policies would refuse a connection that
    /// was let through) or `would_allow` (they would let through one that
    /// was refused).
    pub decision: &'static str,
}

/// Labels of `ringway_cluster_policies_skipped`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterPolicyLabels {
    /// `AuthorizationPolicy` or `PeerAuthentication`.
    pub kind: &'static str,
    /// `invalid`, `unsupported-action`, `target-ref`, `root-selector`.
    pub reason: &'static str,
}

/// Labels of `ringway_cluster_policies_read_toward_deny`: one series per
/// object (their number is the cluster's policies at most).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyObjectLabels {
    /// `AuthorizationPolicy` or `PeerAuthentication`.
    pub kind: &'static str,
    /// `Kind namespace/name`.
    pub object: String,
    /// `unreadable-deny-all`, `unreadable-strict` or `unknown-mode-strict`.
    pub reason: &'static str,
}

/// Labels of `ringway_connections_refused_total`: connections reset before
/// any upstream was dialled because what the pod sent cannot be its own.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefuseLabels {
    /// `source_not_pod_address` (outbound from an address that is not the
    /// pod's), `destination_not_pod_address` (plaintext inbound to one),
    /// `unknown_workload` (the control plane has not sent the pod's
    /// workload within `proxy.workloadWait`), `waypoint` or
    /// `network_gateway` (the destination's traffic must pass one, which
    /// this proxy does not support: refused, never sent around it),
    /// `application_tunnel` (the destination's app wants a PROXY protocol
    /// header), `contested_address` (two entries of the control plane
    /// claim the destination's address: it resolves to neither),
    /// `refused_address` (a resource of the control plane this proxy
    /// refused claims it: it resolves to nothing), `proxy_port` (a same-node connection to one of the proxy's own
    /// ports, which a tunnel's far side refuses too).
    pub reason: &'static str,
}

/// Labels of `ringway_upstream_connect_failures_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectFailLabels {
    /// `timeout` (no answer within `connectTimeout`), `refused`,
    /// `unreachable` or `other`.
    pub reason: &'static str,
}

impl ConnectFailLabels {
    /// The label for a failed connect's error.
    pub fn of(e: &std::io::Error) -> ConnectFailLabels {
        use std::io::ErrorKind;
        let reason = match e.kind() {
            ErrorKind::TimedOut => "timeout",
            ErrorKind::ConnectionRefused => "refused",
            ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable => "unreachable",
            _ => "other",
        };
        ConnectFailLabels { reason }
    }
}

/// Labels of what the tunnel listener (15008) refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Why: `tunnel::HboneRefusal::label`.
    pub reason: &'static str,
}

/// `state` label of `ringway_pipes`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PipeLabels {
    /// `in_use` (moving bytes) or `idle` (kept for reuse).
    pub state: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's values: app/version are the canonical service and
    /// revision, unknown sides and a missing service say `unknown`
    /// (`destination_service_namespace` too, not the workload's namespace).
    #[test]
    fn labels_follow_the_reference_values() {
        let mesh = ringway_config::MeshConfig::load_str(
            "clusterId: c1\nworkloads:\n  - { uid: u, name: web-0, namespace: shop, ips: [10.0.0.1], node: n, \
             labels: { app: web, app.kubernetes.io/name: shop-web, version: v2 } }\n\
             services:\n  - { hostname: web.shop.svc.cluster.local, namespace: shop, vips: [10.96.0.1], ports: { 80: 8080 }, endpoints: [u] }\n",
            "t",
            &ringway_config::NoEnv,
        )
        .unwrap();
        let w = mesh.workloads().next().unwrap();
        let loc = ringway_config::Locality {
            subzone: String::new(),
            region: "r".into(),
            zone: String::new(),
        };
        let src = Peer::of_workload(w, "spiffe://x/ns/shop/sa/default".into(), &mesh, &loc);
        let l = TcpLabels::new("source", &src, &Peer::default(), None, "none", "-");
        assert_eq!(l.source_workload, "web-0");
        assert_eq!(l.source_canonical_service, "shop-web");
        assert_eq!(l.source_app, "shop-web");
        assert_eq!(l.source_canonical_revision, "v2");
        assert_eq!(l.source_version, "v2");
        assert_eq!(l.source_cluster, "c1");
        assert_eq!(
            (l.source_region.as_str(), l.source_zone.as_str()),
            ("r", "unknown")
        );
        for v in [
            &l.destination_service,
            &l.destination_service_name,
            &l.destination_service_namespace,
            &l.destination_workload,
            &l.destination_canonical_service,
            &l.destination_canonical_revision,
            &l.destination_app,
            &l.destination_version,
            &l.destination_cluster,
            &l.destination_region,
            &l.destination_zone,
        ] {
            assert_eq!(v, "unknown");
        }
        let svc = DstService::of(mesh.services().next().unwrap());
        let l = TcpLabels::new(
            "destination",
            &Peer::default(),
            &src,
            Some(&svc),
            "mutual_tls",
            "-",
        );
        assert_eq!(l.destination_service, "web.shop.svc.cluster.local");
        assert_eq!(l.destination_service_name, "web");
        assert_eq!(l.destination_service_namespace, "shop");
        assert_eq!(l.destination_canonical_revision, "v2");
    }
}
