//! Prometheus metrics.
//!
//! The reference mesh's standard TCP metrics, with the same names and label
//! sets so existing Istio dashboards read them unchanged, plus ringway's own.
//! Workers only touch atomics (a connection holds clones of its counters and
//! adds to them as bytes move, so byte counters advance during a long
//! connection); encoding happens on the control thread at scrape time.

//! One module per part, in layers: `labels` (the label sets), `family`
//! (the `istio_tcp_*` families indexed by pod), this module ([`Metrics`]:
//! every metric and what changes them as a whole), `series` (a
//! connection's series and the per-thread cache) and `registry` (the
//! exposition's registry and the collectors read at scrape time).

mod family;
mod labels;
mod registry;
mod series;

use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
/// The exposition's encoders (shared by every ringway process).
pub use ringway_control::{content_type, encode};

pub use family::TcpFamily;
pub use labels::{
    BuildLabels, ClusterPolicyLabels, ConnectFailLabels, DenyLabels, DryRunLabels, DstService,
    Peer, PipeLabels, PolicyObjectLabels, RefuseLabels, RefusedLabels, TcpLabels, TlsLabels,
    ZdsLabels, BUILD_COMPONENT, BUILD_TAG,
};
pub use series::{Series, SeriesKey, ServiceRef, Side};

/// A unique id per [`Metrics`] (the thread-local series cache must never
/// hand one registry's counters to another).
#[derive(Debug)]
pub struct MetricsId(u64);

impl Default for MetricsId {
    fn default() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        MetricsId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

/// Every metric the proxy exports.
#[derive(Debug, Default)]
pub struct Metrics {
    /// `istio_tcp_connections_opened_total`.
    pub opened: TcpFamily,
    /// `istio_tcp_connections_closed_total`.
    pub closed: TcpFamily,
    /// `istio_tcp_connections_failed_total`: connections whose upstream
    /// could not be reached (every endpoint tried) or whose tunnel the
    /// destination refused, with the labels of their `UF` opened series
    /// ([`Metrics::connection_failed`]).
    pub failed: TcpFamily,
    /// `istio_tcp_sent_bytes_total` (destination -> source).
    pub sent: TcpFamily,
    /// `istio_tcp_received_bytes_total` (source -> destination).
    pub received: TcpFamily,
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
    /// `ringway_authorization_dry_run_total{decision}`: connections whose
    /// verdict the dry-run policies would have changed (never enforced).
    pub dry_run: Family<DryRunLabels, Counter>,
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
    /// `ringway_connections_refused_total{reason}`.
    pub refused: Family<RefuseLabels, Counter>,
    /// `ringway_upstream_connect_failures_total{reason}`: plaintext
    /// upstream connect attempts that failed.
    pub connect_failures: Family<ConnectFailLabels, Counter>,
    /// `ringway_cluster_policies_skipped{kind,reason}`: cluster policy
    /// objects left out of the mesh in force.
    pub cluster_policies_skipped: Family<ClusterPolicyLabels, Gauge>,
    /// `ringway_cluster_policy_entries_skipped{kind,reason}`: entries of
    /// cluster policies in force that were left out (`entry-skipped`:
    /// unreadable; `entry-never-matches`: a value no peer can have).
    pub cluster_policy_entries_skipped: Family<ClusterPolicyLabels, Gauge>,
    /// `ringway_cluster_policies_read_toward_deny{kind,object,reason}`:
    /// cluster policy objects in force that could not be read, enforced as
    /// what errs toward deny for what they could select.
    pub cluster_policies_toward_deny: Family<PolicyObjectLabels, Gauge>,
    /// The workers' tunnel pools, read at scrape time.
    pub hbone_pools: std::sync::OnceLock<Vec<ringway_hbone::Pool>>,
    /// Bumped each time series are dropped ([`Metrics::forget_workload`]):
    /// workers that cache counter handles start their cache over.
    pub series_epoch: AtomicU64,
    /// The workload certificates (HBONE on), read at scrape time.
    pub identities: std::sync::RwLock<Option<Arc<ringway_identity::IdentityManager>>>,
    /// Tells this registry's series apart in the threads' caches.
    pub id: MetricsId,
    /// `ringway_heap_trims_total`: the idle trim's runs
    /// ([`crate::idle_trim::IdleTrim`]).
    pub heap_trims: Counter<u64, AtomicU64>,
    /// `ringway_heap_trimmed_bytes_total`: resident memory they gave back.
    pub heap_trimmed_bytes: Counter<u64, AtomicU64>,
}

impl Metrics {
    /// Sets `ringway_cluster_policies_skipped` from the mesh now in force.
    pub fn set_cluster_policy_notes(&self, notes: &[ringway_config::ClusterPolicyNote]) {
        self.cluster_policies_skipped.clear();
        self.cluster_policy_entries_skipped.clear();
        self.cluster_policies_toward_deny.clear();
        for n in notes {
            if matches!(
                n.code,
                "unreadable-deny-all" | "unreadable-strict" | "unknown-mode-strict"
            ) {
                self.cluster_policies_toward_deny
                    .get_or_create(&PolicyObjectLabels {
                        kind: n.kind,
                        object: n.object.clone(),
                        reason: n.code,
                    })
                    .set(1);
                continue;
            }
            let family = if n.skipped {
                &self.cluster_policies_skipped
            } else if n.code.starts_with("entry-") {
                &self.cluster_policy_entries_skipped
            } else {
                continue;
            };
            family
                .get_or_create(&ClusterPolicyLabels {
                    kind: n.kind,
                    reason: n.code,
                })
                .inc();
        }
    }

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
    /// Drops the `istio_tcp_*` series with `peer` on either side (the
    /// series of a removed pod), so memory and the exposition do not grow
    /// with pod churn. Returns how many series went. Workers see
    /// [`Metrics::series_epoch`] move and drop their cached handles.
    pub fn forget_workload(&self, peer: &Peer) -> usize {
        self.forget_owners(&[peer.owner()])
    }

    /// [`Metrics::forget_workload`] for the pods named `owners` ([`Peer::owner`]).
    pub fn forget_owners(&self, owners: &[(String, String)]) -> usize {
        let n = owners
            .iter()
            .flat_map(|o| {
                [
                    &self.opened,
                    &self.closed,
                    &self.failed,
                    &self.sent,
                    &self.received,
                ]
                .into_iter()
                .map(move |f| f.forget(o))
            })
            .sum();
        self.series_epoch
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        n
    }

    /// Counts a connection that failed before it opened (its upstream could
    /// not be reached, or the destination refused the tunnel): its series
    /// `labels` with response flag `UF` is opened and closed at once, and
    /// `istio_tcp_connections_failed_total` of the same labels goes up.
    pub fn connection_failed(&self, labels: &TcpLabels) {
        let l = labels.with_flags("UF");
        self.opened.get_or_create(&l).inc();
        self.closed.get_or_create(&l).inc();
        self.failed.get_or_create(&l).inc();
    }

    /// `istio_tcp_*` series currently exported, over the five counter
    /// families.
    pub fn tcp_series(&self) -> usize {
        [
            &self.opened,
            &self.closed,
            &self.failed,
            &self.sent,
            &self.received,
        ]
        .iter()
        .map(|f| f.len())
        .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(ns: &str, name: &str) -> Peer {
        Peer {
            workload: name.into(),
            namespace: ns.into(),
            principal: format!("spiffe://cluster.local/ns/{ns}/sa/{name}"),
            ..Peer::default()
        }
    }

    #[test]
    fn both_formats_come_from_the_encoders_with_process_metrics() {
        let m = Arc::new(Metrics::default());
        let l = TcpLabels::new(
            "source",
            &peer("a", "x"),
            &peer("b", "y"),
            None,
            "none",
            "-",
        );
        m.opened.get_or_create(&l).inc();
        let r = m.registry();
        let om = encode(&r, true);
        let prom = encode(&r, false);
        assert!(om.trim_end().ends_with("# EOF"), "{om}");
        assert!(!prom.contains("# EOF"), "{prom}");
        assert!(
            om.contains("# TYPE istio_tcp_connections_opened counter"),
            "{om}"
        );
        assert!(
            prom.contains("# TYPE istio_tcp_connections_opened_total counter"),
            "{prom}"
        );
        for text in [&om, &prom] {
            assert!(
                text.contains("istio_tcp_connections_opened_total{"),
                "{text}"
            );
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_virtual_memory_bytes ",
                "process_open_fds ",
                "process_max_fds ",
                "process_start_time_seconds ",
            ] {
                assert!(
                    text.lines().any(|l| l.starts_with(name)),
                    "{name}missing: {text}"
                );
            }
        }
        assert!(om.contains("# TYPE process_cpu_seconds counter"), "{om}");
        assert!(
            prom.contains("# TYPE process_cpu_seconds_total counter"),
            "{prom}"
        );
        assert_eq!(
            content_type(false),
            "text/plain; version=0.0.4; charset=utf-8"
        );
    }

    #[test]
    fn forgetting_a_workload_drops_its_series_on_both_sides() {
        let m = Arc::new(Metrics::default());
        let (a, b, c) = (peer("ns", "a"), peer("ns", "b"), peer("ns", "c"));
        for (rep, s, d) in [
            ("source", &a, &b),
            ("destination", &a, &b),
            ("source", &c, &b),
            ("destination", &b, &c),
        ] {
            let l = TcpLabels::new(rep, s, d, None, "none", "-");
            m.opened.get_or_create(&l).inc();
            m.closed.get_or_create(&l.with_flags("UF")).inc();
        }
        assert_eq!(m.tcp_series(), 8);
        let epoch = m.series_epoch.load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(m.forget_workload(&a), 4);
        assert_eq!(m.tcp_series(), 4);
        assert!(m.series_epoch.load(std::sync::atomic::Ordering::Acquire) > epoch);
        // Unknown sides are never an owner.
        let unknown = Peer::default();
        let l = TcpLabels::new("destination", &unknown, &c, None, "none", "-");
        m.opened.get_or_create(&l).inc();
        assert_eq!(m.forget_workload(&unknown), 0);
        assert_eq!(m.forget_workload(&c), 5);
        assert_eq!(m.tcp_series(), 0);
        assert!(!encode(&m.registry(), false).contains("istio_tcp_connections_opened_total{"));
    }
}
