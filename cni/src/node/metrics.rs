//! The node agent's Prometheus metrics, a leaf: CNI request latency (ADD's is
//! the time a pod waits in ContainerCreating for its capture), outcomes,
//! refused connections, and the enrolled pods, read at scrape time from the
//! owner of the state through `PodCount`.
//! With `--kube`, the annotator's (`ringway_agent_redirection_annotation_*`)
//! are added beside them by [`crate::kube::Annotator::register_metrics`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of CNI request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CniLabels {
    /// add, del, check, status, gc.
    pub op: String,
    /// ok, or the error kind.
    pub outcome: &'static str,
}

/// Labels of refused connections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `zds` or `cni`.
    pub socket: &'static str,
    /// `peer_uid` (SO_PEERCRED not allowed), `peer_unknown` (no credentials),
    /// `connection_cap` (too many ZDS connections).
    pub reason: &'static str,
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~4 s.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 13,
    ))
}

/// The agent's metrics.
#[derive(Debug)]
pub struct AgentMetrics {
    /// `ringway_cni_request_duration_seconds{op,outcome}`.
    pub latency: Family<CniLabels, Histogram, fn() -> Histogram>,
    /// `ringway_cni_requests_total{op,outcome}`.
    pub requests: Family<CniLabels, Counter>,
    /// `ringway_agent_connections_refused_total{socket,reason}`.
    pub refused: Family<RefusedLabels, Counter>,
    /// `ringway_agent_capture_repairs_total`.
    pub repairs: Counter,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        AgentMetrics {
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            requests: Family::default(),
            refused: Family::default(),
            repairs: Counter::default(),
        }
    }
}

impl AgentMetrics {
    /// Records one CNI request.
    pub fn observe(&self, op: &str, outcome: &'static str, seconds: f64) {
        let l = CniLabels {
            op: op.to_string(),
            outcome,
        };
        self.latency.get_or_create(&l).observe(seconds);
        self.requests.get_or_create(&l).inc();
    }

    /// Counts one refused connection.
    pub fn refuse(&self, socket: &'static str, reason: &'static str) {
        self.refused
            .get_or_create(&RefusedLabels { socket, reason })
            .inc();
    }

    /// A registry of the request metrics (the agent's handle adds the
    /// enrolled pods, the binary the process metrics). Encode it with
    /// prometheus-client's encoders, never by editing the text.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::default();
        r.register(
            "ringway_cni_request_duration_seconds",
            "Time to answer a CNI plugin request (ADD: rules in place and the proxy acked)",
            self.latency.clone(),
        );
        r.register(
            "ringway_cni_requests",
            "CNI plugin requests by op and outcome",
            self.requests.clone(),
        );
        r.register(
            "ringway_agent_connections_refused",
            "Connections to the agent's sockets refused (peer credentials, connection cap)",
            self.refused.clone(),
        );
        r.register(
            "ringway_agent_capture_repairs",
            "Enrolled pods whose capture (rules, routes, owner tag) was found changed and re-applied",
            self.repairs.clone(),
        );
        r
    }
}

/// What the pod gauge reads at scrape time (the owner of the state).
pub(super) trait PodCount: Send + Sync + 'static {
    /// How many pods are enrolled now.
    fn pod_count(&self) -> usize;
}

/// `ringway_agent_pods_enrolled`, read from the agent's state at scrape time.
pub(super) struct EnrolledPods(pub(super) std::sync::Arc<dyn PodCount>);

impl std::fmt::Debug for EnrolledPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EnrolledPods")
            .field(&self.0.pod_count())
            .finish()
    }
}

impl prometheus_client::collector::Collector for EnrolledPods {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let g = ConstGauge::new(self.0.pod_count() as i64);
        g.encode(encoder.encode_descriptor(
            "ringway_agent_pods_enrolled",
            "Pods this agent has enrolled",
            None,
            g.metric_type(),
        )?)
    }
}
