//! Prometheus metrics.
//!
//! The reference mesh's standard TCP metrics, with the same names and label
//! sets so existing Istio dashboards read them unchanged, plus ringway's own.
//! Workers only touch atomics (a connection holds clones of its counters and
//! adds to them as bytes move, so byte counters advance during a long
//! connection); encoding happens on the control thread at scrape time.

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the `istio_tcp_*` metrics (the reference mesh's set).
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
    /// Source `app` label.
    pub source_app: String,
    /// Source `version` label.
    pub source_version: String,
    /// Source cluster.
    pub source_cluster: String,
    /// Destination service host.
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
    /// Destination `app` label.
    pub destination_app: String,
    /// Destination `version` label.
    pub destination_version: String,
    /// Destination cluster.
    pub destination_cluster: String,
    /// Always `tcp` here.
    pub request_protocol: &'static str,
    /// `-` when fine, else the reason (`UF` upstream connect failure, `DENY`).
    pub response_flags: &'static str,
    /// `mutual_tls`, `none` (plaintext) or `unknown`.
    pub connection_security_policy: &'static str,
}

/// One side of a connection as the labels describe it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Peer {
    /// Workload (pod) name.
    pub workload: String,
    /// Namespace.
    pub namespace: String,
    /// SPIFFE principal.
    pub principal: String,
}

impl TcpLabels {
    /// Labels for a connection from `src` to `dst` reported by `reporter`.
    pub fn new(
        reporter: &'static str,
        src: &Peer,
        dst: &Peer,
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
        TcpLabels {
            reporter,
            source_workload: unknown(&src.workload),
            source_canonical_service: unknown(&src.workload),
            source_canonical_revision: "latest".into(),
            source_workload_namespace: unknown(&src.namespace),
            source_principal: unknown(&src.principal),
            source_app: unknown(&src.workload),
            source_version: "unknown".into(),
            source_cluster: "Kubernetes".into(),
            destination_service: "unknown".into(),
            destination_service_namespace: unknown(&dst.namespace),
            destination_service_name: "unknown".into(),
            destination_workload: unknown(&dst.workload),
            destination_canonical_service: unknown(&dst.workload),
            destination_canonical_revision: "latest".into(),
            destination_workload_namespace: unknown(&dst.namespace),
            destination_principal: unknown(&dst.principal),
            destination_app: unknown(&dst.workload),
            destination_version: "unknown".into(),
            destination_cluster: "Kubernetes".into(),
            request_protocol: "tcp",
            response_flags: flags,
            connection_security_policy: security,
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

/// Labels of what the tunnel listener (15008) refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Why, from a fixed set: `forwarded_not_peer`, `forwarded_reserved`,
    /// `proxy_port`, `rapid_reset`, `handshake_timeout`, `preface_timeout`,
    /// `idle`, `per_source`, `per_pod`.
    pub reason: &'static str,
}

/// A short, bounded reason for a TLS failure (metric label).
pub fn tls_failure_reason(e: &dyn std::fmt::Display) -> &'static str {
    let s = e.to_string();
    if s.contains("timed out") {
        "timeout"
    } else if s.contains("UnknownIssuer") || s.contains("UnknownCA") || s.contains("unknown CA") {
        "unknown_ca"
    } else if s.contains("Expired") || s.contains("expired") {
        "expired"
    } else if s.contains("CertificateRequired") || s.contains("NoCertificatesPresented") {
        "no_client_cert"
    } else if s.contains("NotValidForName") || s.contains("identity") || s.contains("SAN") {
        "wrong_identity"
    } else if s.contains("ProtocolVersion") || s.contains("version") {
        "protocol_version"
    } else {
        "other"
    }
}

/// `state` label of `ringway_pipes`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PipeLabels {
    /// `in_use` (moving bytes) or `idle` (kept for reuse).
    pub state: &'static str,
}

/// Every metric the proxy exports.
#[derive(Debug, Default)]
pub struct Metrics {
    /// `istio_tcp_connections_opened_total`.
    pub opened: Family<TcpLabels, Counter>,
    /// `istio_tcp_connections_closed_total`.
    pub closed: Family<TcpLabels, Counter>,
    /// `istio_tcp_sent_bytes_total` (destination -> source).
    pub sent: Family<TcpLabels, Counter>,
    /// `istio_tcp_received_bytes_total` (source -> destination).
    pub received: Family<TcpLabels, Counter>,
    /// `ringway_pods_enrolled`.
    pub pods: Gauge,
    /// `ringway_listeners`.
    pub listeners: Gauge,
    /// `ringway_connections_active` (set from [`crate::Stats`] at scrape time).
    pub active: Gauge<i64, AtomicI64>,
    /// `ringway_zds_requests_total`.
    pub zds: Family<ZdsLabels, Counter>,
    /// `ringway_accept_resource_errors_total` (caught up with [`crate::Stats`] at scrape time).
    pub accept_resource_errors: Counter<u64, AtomicU64>,
    /// `ringway_datapath_io_uring` (1 = io_uring, 0 = epoll fallback).
    pub datapath_uring: Gauge,
    /// `ringway_tls_handshakes_total{side,outcome}`.
    pub tls_handshakes: Family<TlsLabels, Counter>,
    /// `ringway_authorization_denials_total{path}`.
    pub denials: Family<DenyLabels, Counter>,
    /// `ringway_hbone_refused_total{reason}`: what the tunnel listener refused.
    pub hbone_refused: Family<RefusedLabels, Counter>,
    /// `ringway_hbone_streams_total{side}`: tunnel streams opened.
    pub hbone_streams: Family<TlsLabels, Counter>,
    /// `ringway_pipes{state}`: splice pipes (the datapath's buffers), set
    /// from [`crate::Stats`] at scrape time.
    pub pipes: Family<PipeLabels, Gauge>,
    /// `ringway_hbone_pool_connections`: outbound HTTP/2 connections.
    pub hbone_pool_connections: Gauge,
    /// `ringway_hbone_pool_streams`: outbound tunnel streams open on them.
    pub hbone_pool_streams: Gauge,
    /// The workers' tunnel pools, read at scrape time.
    pub hbone_pools: std::sync::OnceLock<Vec<ringway_hbone::Pool>>,
}

impl Metrics {
    /// Brings the gauges derived from live state up to date (call before
    /// encoding).
    pub fn refresh(&self, stats: &crate::Stats) {
        self.active.set(stats.active.get());
        let errors = stats.accept_resource_errors.get();
        let exported = self.accept_resource_errors.get();
        if errors > exported {
            self.accept_resource_errors.inc_by(errors - exported);
        }
        self.pipes
            .get_or_create(&PipeLabels { state: "in_use" })
            .set(stats.pipes_in_use.get());
        self.pipes
            .get_or_create(&PipeLabels { state: "idle" })
            .set(stats.pipes_idle.get());
        if let Some(pools) = self.hbone_pools.get() {
            let conns: usize = pools.iter().map(|p| p.connections()).sum();
            let streams: usize = pools.iter().map(|p| p.streams()).sum();
            self.hbone_pool_connections.set(conns as i64);
            self.hbone_pool_streams.set(streams as i64);
        }
    }
}

impl Metrics {
    /// Builds the registry that exports these metrics.
    pub fn registry(self: &Arc<Self>) -> Registry {
        let mut r = Registry::default();
        r.register(
            "istio_tcp_connections_opened",
            "Total number of TCP connections opened",
            self.opened.clone(),
        );
        r.register(
            "istio_tcp_connections_closed",
            "Total number of TCP connections closed",
            self.closed.clone(),
        );
        r.register(
            "istio_tcp_sent_bytes",
            "Total number of bytes sent during response of a TCP connection",
            self.sent.clone(),
        );
        r.register(
            "istio_tcp_received_bytes",
            "Total number of bytes received during request of a TCP connection",
            self.received.clone(),
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
            "ringway_datapath_io_uring",
            "1 when the datapath runs on io_uring, 0 on the epoll fallback",
            self.datapath_uring.clone(),
        );
        r
    }
}

/// Encodes `registry` as OpenMetrics text, or as Prometheus text 0.0.4
/// (counter families named with `_total`, no `# EOF`/`# UNIT`) when
/// `openmetrics` is false.
pub fn encode(registry: &Registry, openmetrics: bool) -> String {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        return String::new();
    }
    append_process_metrics(&mut out);
    if openmetrics {
        return out;
    }
    // Counter families are named with `_total` in Prometheus text: collect
    // them first (HELP lines come before TYPE lines), then rewrite.
    let counters: std::collections::HashSet<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut prom = String::with_capacity(out.len());
    for line in out.lines() {
        if line.starts_with("# EOF") || line.starts_with("# UNIT") {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let name = rest.split(' ').next()?;
            counters
                .contains(name)
                .then(|| format!("{tag}{name}_total{}", &rest[name.len()..]))
        });
        prom.push_str(renamed.as_deref().unwrap_or(line));
        prom.push('\n');
    }
    prom
}

/// Process metrics read at scrape time (before `# EOF`).
fn append_process_metrics(out: &mut String) {
    let fds = std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0);
    let rss_pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    let extra = format!(
        "# HELP process_open_fds Open file descriptors\n# TYPE process_open_fds gauge\nprocess_open_fds {fds}\n\
         # HELP process_resident_memory_bytes Resident memory\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n",
        rss_pages * page
    );
    if let Some(pos) = out.rfind("# EOF") {
        out.insert_str(pos, &extra);
    } else {
        out.push_str(&extra);
    }
}
