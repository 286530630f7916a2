//! The registry that exports the proxy's metrics ([`Metrics::registry`]),
//! with the collectors read at scrape time: the certificates in hand, the
//! `istio_tcp_sockets_open` gauge and the process metrics.

use std::collections::HashMap;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{BuildLabels, TcpLabels, BUILD_COMPONENT, BUILD_TAG};
use super::Metrics;

impl Metrics {
    /// Builds the registry that exports these metrics.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::default();
        r.register(
            "istio_tcp_connections_opened",
            "Total number of TCP connections opened",
            self.opened.family().clone(),
        );
        r.register(
            "istio_tcp_connections_closed",
            "Total number of TCP connections closed",
            self.closed.family().clone(),
        );
        r.register(
            "istio_tcp_connections_failed",
            "Total number of TCP connections that failed to establish: the upstream could not be reached (response_flags UF), or the destination refused the tunnel",
            self.failed.family().clone(),
        );
        // The mesh's dashboards select the node proxy's build with
        // component="ztunnel": ringway takes the node proxy's place, so it
        // answers to that name, with its own version as the tag.
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                component: BUILD_COMPONENT,
                tag: BUILD_TAG,
            })
            .set(1);
        r.register(
            "istio_build",
            "Istio component build info: component=\"ztunnel\" (the node proxy's name, which ringway stands in for; dashboards select it) and tag=ringway's version",
            build,
        );
        r.register(
            "istio_tcp_sent_bytes",
            "Total number of bytes sent during response of a TCP connection",
            self.sent.family().clone(),
        );
        r.register(
            "istio_tcp_received_bytes",
            "Total number of bytes received during request of a TCP connection",
            self.received.family().clone(),
        );
        r.register(
            "ringway_pods_enrolled",
            "Pods served by this proxy",
            self.pods.clone(),
        );
        r.register(
            "ringway_listeners",
            "Listening sockets across all pods and workers",
            self.listeners.clone(),
        );
        r.register(
            "ringway_connections_active",
            "Proxied connections currently open",
            self.active.clone(),
        );
        r.register(
            "ringway_zds_requests",
            "ZDS requests from the node agent, by outcome",
            self.zds.clone(),
        );
        r.register(
            "ringway_accept_resource_errors",
            "accept/socket failures for lack of file descriptors or memory",
            self.accept_resource_errors.clone(),
        );
        r.register(
            "ringway_tls_handshakes",
            "HBONE TLS handshakes by side and outcome (failure reason)",
            self.tls_handshakes.clone(),
        );
        r.register(
            "ringway_authorization_denials",
            "Connections denied by L4 authorization policy",
            self.denials.clone(),
        );
        r.register(
            "ringway_authorization_dry_run",
            "Connections whose verdict the dry-run authorization policies would have changed (reported, never enforced)",
            self.dry_run.clone(),
        );
        r.register(
            "ringway_cluster_policies_skipped",
            "Cluster AuthorizationPolicy and PeerAuthentication objects left out of the mesh in force, by reason (the admin config_dump names them)",
            self.cluster_policies_skipped.clone(),
        );
        r.register(
            "ringway_cluster_policy_entries_skipped",
            "Entries of cluster AuthorizationPolicy and PeerAuthentication objects in force that were left out (unreadable, or a value no peer can have), by reason (the admin config_dump names each)",
            self.cluster_policy_entries_skipped.clone(),
        );
        r.register(
            "ringway_cluster_policies_read_toward_deny",
            "Cluster AuthorizationPolicy and PeerAuthentication objects that could not be read (or name a value the API does not define), enforced as a deny of everything they could select or as STRICT; one series per object",
            self.cluster_policies_toward_deny.clone(),
        );
        r.register(
            "ringway_hbone_refused",
            "Tunnel (15008) connections and streams refused, by reason",
            self.hbone_refused.clone(),
        );
        r.register(
            "ringway_hbone_streams",
            "HBONE CONNECT streams opened (side client: outbound, server: inbound)",
            self.hbone_streams.clone(),
        );
        r.register(
            "ringway_pipes",
            "Splice pipes of the datapath (its buffers), in use or idle in the pools",
            self.pipes.clone(),
        );
        r.register(
            "ringway_hbone_pool_connections",
            "Outbound HBONE HTTP/2 connections open in the pools",
            self.hbone_pool_connections.clone(),
        );
        r.register(
            "ringway_hbone_pool_streams",
            "Outbound HBONE streams open on pooled connections",
            self.hbone_pool_streams.clone(),
        );
        r.register(
            "ringway_connections_refused",
            "Connections reset before any upstream was dialled, by reason: a source (outbound) or destination (plaintext inbound) that is not the pod's, a pod whose workload the control plane has not sent, a destination behind a waypoint or network gateway, one whose app wants a PROXY header, one whose address two entries of the control plane claim, a same-node connection to a port of the proxy",
            self.refused.clone(),
        );
        r.register(
            "ringway_upstream_connect_failures",
            "Plaintext upstream connect attempts that failed, by reason (timeout: no answer within connectTimeout)",
            self.connect_failures.clone(),
        );
        r.register(
            "ringway_datapath_io_uring",
            "1 when the datapath runs on io_uring, 0 on the epoll fallback",
            self.datapath_uring.clone(),
        );
        r.register(
            "ringway_heap_trims",
            "Times the proxy gave its heaps' free memory back to the kernel after being quiet",
            self.heap_trims.clone(),
        );
        r.register(
            "ringway_heap_trimmed_bytes",
            "Resident memory those trims gave back",
            self.heap_trimmed_bytes.clone(),
        );
        r.register_collector(Box::new(SocketsOpen(self.clone())));
        r.register_collector(Box::new(Certificates(self.clone())));
        r.register_collector(Box::new(Heap));
        r.register_collector(Box::new(ringway_control::ProcessCollector));
        r
    }
}

/// The workload certificates in hand: `ringway_certificate_expiry_timestamp_seconds{identity}`
/// (when each expires; renewal is due at half its lifetime) and
/// `ringway_certificate_issue_failures_total` (issuances and renewals that
/// failed: a CA that cannot be reached, a refusal). Read at scrape time.
#[derive(Debug)]
struct Certificates(Arc<Metrics>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertLabels {
    identity: String,
}

impl prometheus_client::collector::Collector for Certificates {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let ids = self
            .0
            .identities
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let Some(ids) = ids else {
            return Ok(());
        };
        let certs = ids.certificates();
        let mut family = encoder.encode_descriptor(
            "ringway_certificate_expiry_timestamp_seconds",
            "When each workload certificate in hand expires (Unix time)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (id, not_after) in certs {
            let secs = not_after
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            let labels = CertLabels {
                identity: id.to_string(),
            };
            ConstGauge::new(secs).encode(family.encode_family(&labels)?)?;
        }
        let failures = ConstCounter::new(ids.issue_failure_count());
        failures.encode(encoder.encode_descriptor(
            "ringway_certificate_issue_failures",
            "Workload certificate issuances and renewals that failed",
            None,
            failures.metric_type(),
        )?)?;
        let roots = ConstGauge::new(ids.bundle().roots().len() as i64);
        roots.encode(encoder.encode_descriptor(
            "ringway_trust_roots",
            "Root certificates HBONE peers are verified against",
            None,
            roots.metric_type(),
        )?)?;
        let (reloads, rejected) = ids.bundle_reload_counts();
        for (name, help, v) in [
            (
                "ringway_trust_bundle_reloads",
                "Edits of the roots' files put in force without a restart",
                reloads,
            ),
            (
                "ringway_trust_bundle_rejected",
                "Edits of the roots' files refused (unreadable, no certificate, unusable root); the roots in force stayed",
                rejected,
            ),
        ] {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        Ok(())
    }
}

/// What the heaps hold at scrape time ([`crate::sys::heap_usage`]):
/// `ringway_heap_in_use_bytes` (live allocations) and
/// `ringway_heap_free_bytes` (free inside the heaps). Beside the resident
/// size they tell a leak (in use grows with connections made) from memory
/// the allocator keeps (free stays high after a trim).
#[derive(Debug)]
struct Heap;

impl prometheus_client::collector::Collector for Heap {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        let Some(h) = crate::sys::heap_usage() else {
            return Ok(());
        };
        for (name, help, v) in [
            (
                "ringway_heap_in_use_bytes",
                "Bytes of live heap allocations (glibc, every arena)",
                h.in_use,
            ),
            (
                "ringway_heap_free_bytes",
                "Free bytes inside the heaps (glibc, every arena; the idle trim gives the resident part back)",
                h.free,
            ),
        ] {
            let g = ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

/// `istio_tcp_sockets_open`: the connections of each `istio_tcp_*` series
/// open now, computed at scrape time as opened minus closed over the series
/// without its response flag (how a connection ended is not part of what is
/// open: the gauge's `response_flags` is always `-`). A series with none
/// open reports 0 until its pods are forgotten.
#[derive(Debug)]
struct SocketsOpen(Arc<Metrics>);

impl prometheus_client::collector::Collector for SocketsOpen {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::gauge::ConstGauge;
        // Flags say how a connection ended (or failed to start); the
        // count of open ones is per series without them.
        let mut opened: HashMap<TcpLabels, u64> = HashMap::new();
        for (l, v) in self.0.opened.samples() {
            *opened.entry(l.with_flags("-")).or_default() += v;
        }
        let mut closed: HashMap<TcpLabels, u64> = HashMap::new();
        for (l, v) in self.0.closed.samples() {
            *closed.entry(l.with_flags("-")).or_default() += v;
        }
        let open: Vec<(TcpLabels, i64)> = opened
            .into_iter()
            .map(|(l, v)| {
                let c = closed.get(&l).copied().unwrap_or(0);
                (l, i64::try_from(v.saturating_sub(c)).unwrap_or(i64::MAX))
            })
            .collect();
        if open.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "istio_tcp_sockets_open",
            "The number of TCP connections currently open",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (labels, v) in open {
            ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
