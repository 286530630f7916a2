//! Prometheus metrics.
//!
//! The reference mesh's standard TCP metrics, with the same names and label
//! sets so existing Istio dashboards read them unchanged, plus ringway's own.
//! Workers only touch atomics (a connection holds clones of its counters and
//! adds to them as bytes move, so byte counters advance during a long
//! connection); encoding happens on the control thread at scrape time.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
/// The exposition's encoders (shared by every ringway process).
pub use ringway_control::{content_type, encode};

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
    /// empty): what [`Metrics::forget_owner`] drops.
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

/// One side of a connection as the series cache keys it.
#[derive(Clone, Debug)]
pub enum Side {
    /// A pod served here, labelled as it is now (one `Arc` per pod, mesh
    /// and identity, made on the control thread: compared by address, so a
    /// connection between pods seen before hashes two pointers, not ~20
    /// strings).
    Pod(Arc<Peer>),
    /// The mesh workload holding this address (another node's), with its
    /// own identity and locality; every label `unknown` when none does.
    Addr(IpAddr),
}

impl PartialEq for Side {
    fn eq(&self, other: &Side) -> bool {
        match (self, other) {
            (Side::Pod(a), Side::Pod(b)) => Arc::ptr_eq(a, b),
            (Side::Addr(a), Side::Addr(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Side {}

impl std::hash::Hash for Side {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        match self {
            Side::Pod(p) => (0u8, Arc::as_ptr(p) as usize).hash(h),
            Side::Addr(ip) => (1u8, ip).hash(h),
        }
    }
}

impl Side {
    /// The side's labels under `mesh`.
    fn peer(&self, mesh: Option<&ringway_config::Mesh>) -> Peer {
        match self {
            Side::Pod(p) => (**p).clone(),
            Side::Addr(ip) => mesh
                .and_then(|m| {
                    let w = m.workload_by_ip(ip.to_canonical())?;
                    let id = w.identity(m.trust_domain()).to_string();
                    Some(Peer::of_workload(w, id, m, &w.locality))
                })
                .unwrap_or_default(),
        }
    }
}

/// What one reporter's `istio_tcp_*` series of a connection is made of;
/// the labels follow from it and the mesh in force ([`Metrics::series`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SeriesKey {
    /// `source` or `destination`.
    pub reporter: &'static str,
    /// `none` (plaintext: the source principal is reported only when mTLS
    /// proved it, as the reference) or `mutual_tls`.
    pub security: &'static str,
    /// The source.
    pub src: Side,
    /// The destination.
    pub dst: Side,
    /// The service the connection went to.
    pub service: Option<ServiceRef>,
}

/// A mesh service as part of a series key: compared and hashed by which
/// entry of the mesh it is (no string copied or hashed per connection); a
/// snapshot derived from another shares the entries it did not change.
#[derive(Clone, Debug)]
pub struct ServiceRef(pub Arc<ringway_config::Service>);

impl PartialEq for ServiceRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ServiceRef {}

impl std::hash::Hash for ServiceRef {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0), state)
    }
}

impl SeriesKey {
    /// The labels of this series under `mesh`.
    pub fn labels(&self, mesh: Option<&ringway_config::Mesh>) -> TcpLabels {
        let mut src = self.src.peer(mesh);
        if self.security == "none" {
            src.principal.clear();
        }
        let dst = self.dst.peer(mesh);
        let service = self.service.as_ref().map(|s| DstService::of(&s.0));
        TcpLabels::new(
            self.reporter,
            &src,
            &dst,
            service.as_ref(),
            self.security,
            "-",
        )
    }
}

/// One reporter's `istio_tcp_*` series of a connection, with its counter
/// handles.
#[derive(Debug)]
pub struct Series {
    /// The labels (the access log's names; `UF` series are made from them).
    pub labels: TcpLabels,
    /// `istio_tcp_connections_opened_total`.
    pub opened: Counter,
    /// `istio_tcp_connections_closed_total`.
    pub closed: Counter,
    /// `istio_tcp_sent_bytes_total`.
    pub sent: Counter,
    /// `istio_tcp_received_bytes_total`.
    pub received: Counter,
}

/// Series keys remembered per thread; past this the cache starts over (the
/// metrics themselves are kept).
const SERIES_CACHE_MAX: usize = 16_384;

/// The series a thread (a worker) resolved, valid for one [`Metrics`], one
/// [`Metrics::series_epoch`] and one mesh snapshot.
struct SeriesCache {
    metrics: u64,
    epoch: u64,
    /// The mesh the labels were made under (a `Weak` keeps its address from
    /// being reused while the cache holds it).
    mesh: Option<std::sync::Weak<ringway_config::Mesh>>,
    map: HashMap<SeriesKey, Arc<Series>>,
}

thread_local! {
    static SERIES: std::cell::RefCell<Option<SeriesCache>> = const { std::cell::RefCell::new(None) };
}

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

/// `istio_build`'s `component`: the reference node proxy's name (see
/// [`Metrics::registry`]).
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
    /// this proxy does not support: refused, never sent around it).
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

/// A TLS handshake that did not finish within its deadline. Carried inside
/// the `io::Error` (kind `TimedOut`) that the handshake returns, so
/// [`tls_failure_reason`] tells it from every other failure by type.
#[derive(Debug, thiserror::Error)]
#[error("TLS handshake timed out after {0:?}")]
pub struct HandshakeTimeout(pub std::time::Duration);

impl HandshakeTimeout {
    /// The `io::Error` a timed-out handshake returns.
    pub fn io(after: std::time::Duration) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, HandshakeTimeout(after))
    }
}

/// A short, bounded reason for a failed TLS handshake (the `outcome` label
/// of `ringway_tls_handshakes_total`), from the error's type: a
/// [`HandshakeTimeout`], the `rustls::Error` tokio-rustls wraps in the
/// `io::Error` (ours, or the alert the peer sent), else the I/O error kind.
/// Never from the message text.
pub fn tls_failure_reason(e: &std::io::Error) -> &'static str {
    use std::io::ErrorKind;
    if let Some(inner) = e.get_ref() {
        if inner.is::<HandshakeTimeout>() {
            return "timeout";
        }
        if let Some(tls) = inner.downcast_ref::<tokio_rustls::rustls::Error>() {
            return rustls_reason(tls);
        }
    }
    match e.kind() {
        ErrorKind::UnexpectedEof => "peer_closed",
        ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe => {
            "peer_reset"
        }
        _ => "io",
    }
}

fn rustls_reason(e: &tokio_rustls::rustls::Error) -> &'static str {
    use tokio_rustls::rustls::{AlertDescription as A, CertificateError as C, Error as E};
    match e {
        E::InvalidCertificate(c) => match c {
            C::UnknownIssuer | C::BadSignature => "unknown_ca",
            C::Expired | C::ExpiredContext { .. } => "expired",
            C::NotValidYet | C::NotValidYetContext { .. } => "not_yet_valid",
            C::NotValidForName | C::NotValidForNameContext { .. } => "wrong_identity",
            // Our verifiers' SPIFFE checks (`ringway_identity`): a chain
            // that verified but names another, or no, SPIFFE identity.
            C::Other(o) if o.0.is::<ringway_identity::IdentityError>() => "wrong_identity",
            _ => "bad_certificate",
        },
        E::NoCertificatesPresented => "no_client_cert",
        E::AlertReceived(a) => match a {
            A::UnknownCA => "unknown_ca",
            A::CertificateExpired => "expired",
            A::CertificateRequired => "no_client_cert",
            A::BadCertificate | A::UnsupportedCertificate | A::CertificateUnknown => {
                "bad_certificate"
            }
            A::ProtocolVersion => "protocol_version",
            A::NoApplicationProtocol => "no_alpn",
            _ => "alert",
        },
        E::PeerIncompatible(p) => {
            use tokio_rustls::rustls::PeerIncompatible as P;
            match p {
                P::ServerDoesNotSupportTls12Or13
                | P::ServerTlsVersionIsDisabledByOurConfig
                | P::SupportedVersionsExtensionRequired
                | P::Tls12NotOffered
                | P::Tls12NotOfferedOrEnabled => "protocol_version",
                _ => "incompatible",
            }
        }
        E::NoApplicationProtocol => "no_alpn",
        E::InvalidMessage(_)
        | E::InappropriateMessage { .. }
        | E::InappropriateHandshakeMessage { .. }
        | E::PeerMisbehaved(_)
        | E::PeerSentOversizedRecord
        | E::DecryptError => "protocol_error",
        _ => "other",
    }
}

/// A pod as the labels spell it: (namespace, workload).
type Owner = (String, String);

impl TcpLabels {
    /// The two pods of the series: source and destination.
    fn owners(&self) -> [Owner; 2] {
        [
            (
                self.source_workload_namespace.clone(),
                self.source_workload.clone(),
            ),
            (
                self.destination_workload_namespace.clone(),
                self.destination_workload.clone(),
            ),
        ]
    }
}

/// What every unnamed side is labelled: never an owner to forget.
const UNKNOWN: (&str, &str) = ("unknown", "unknown");

/// An `istio_tcp_*` family that indexes its series by the pods on either
/// side, so the series of a removed pod can be dropped
/// ([`Metrics::forget_workload`]): with pod churn the exposition (and the
/// proxy's memory) would otherwise grow with every pod that ever ran here
/// or talked to a pod here.
#[derive(Debug, Default)]
pub struct TcpFamily {
    family: Family<TcpLabels, Counter>,
    owners: std::sync::Mutex<HashMap<Owner, HashSet<TcpLabels>>>,
}

impl TcpFamily {
    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, HashSet<TcpLabels>>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The counter of `labels`, created (and indexed under its pods) on
    /// first use. A series seen before costs a read lock, as a plain family.
    pub fn get_or_create(&self, labels: &TcpLabels) -> Counter {
        if let Some(c) = self.family.get(labels) {
            return c.clone();
        }
        let mut owners = self.index();
        let c = self.family.get_or_create_owned(labels);
        for o in labels.owners() {
            owners.entry(o).or_default().insert(labels.clone());
        }
        c
    }

    /// The family, for registration.
    pub fn family(&self) -> &Family<TcpLabels, Counter> {
        &self.family
    }

    /// Every series' labels and value.
    fn samples(&self) -> Vec<(TcpLabels, u64)> {
        let owners = self.index();
        let mut all: HashSet<&TcpLabels> = HashSet::new();
        for set in owners.values() {
            all.extend(set.iter());
        }
        all.into_iter()
            .filter_map(|l| Some((l.clone(), self.family.get(l)?.get())))
            .collect()
    }

    /// Series in the family (every one is created through
    /// [`TcpFamily::get_or_create`], so the index holds them all).
    pub fn len(&self) -> usize {
        let owners = self.index();
        let mut all: HashSet<&TcpLabels> = HashSet::new();
        for set in owners.values() {
            all.extend(set.iter());
        }
        all.len()
    }

    /// Whether the family has no series.
    pub fn is_empty(&self) -> bool {
        self.index().is_empty()
    }

    /// Drops every series with `owner` on either side; returns how many.
    fn forget(&self, owner: &Owner) -> usize {
        if (owner.0.as_str(), owner.1.as_str()) == UNKNOWN {
            return 0;
        }
        let mut owners = self.index();
        let Some(set) = owners.remove(owner) else {
            return 0;
        };
        for labels in &set {
            self.family.remove(labels);
            for other in labels.owners() {
                if let Some(s) = owners.get_mut(&other) {
                    s.remove(labels);
                    if s.is_empty() {
                        owners.remove(&other);
                    }
                }
            }
        }
        set.len()
    }
}

/// Labels of what the tunnel listener (15008) refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Why: [`HboneRefusal::label`].
    pub reason: &'static str,
}

/// Why the tunnel listener refused a connection or a stream, as
/// `ringway_hbone_refused_total{reason}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HboneRefusal {
    /// A `forwarded` client address of a workload the peer is not.
    ForwardedNotPeer,
    /// A `forwarded` loopback, unspecified, multicast or link-local address.
    ForwardedReserved,
    /// CONNECT to one of the proxy's own ports.
    ProxyPort,
    /// HEADERS + RST_STREAM faster than allowed.
    RapidReset,
    /// The TLS handshake did not finish in time.
    HandshakeTimeout,
    /// The HTTP/2 preface did not come in time.
    PrefaceTimeout,
    /// An authenticated connection idle too long.
    Idle,
    /// One source over its pre-authentication cap.
    PerSource,
    /// The pod at its pre-authentication cap (the listener pauses; counted
    /// as [`HboneRefusal::PerPodPaused`], once per pause).
    PerPod,
    /// A pod's tunnel listeners paused at its pre-authentication cap.
    PerPodPaused,
    /// A stream to a pod whose workload the control plane has not sent
    /// (within `proxy.workloadWait`).
    UnknownWorkload,
    /// A stream to a workload whose traffic must pass a waypoint or a
    /// network gateway this proxy does not support.
    Unsupported,
}

impl HboneRefusal {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            HboneRefusal::ForwardedNotPeer => "forwarded_not_peer",
            HboneRefusal::ForwardedReserved => "forwarded_reserved",
            HboneRefusal::ProxyPort => "proxy_port",
            HboneRefusal::RapidReset => "rapid_reset",
            HboneRefusal::HandshakeTimeout => "handshake_timeout",
            HboneRefusal::PrefaceTimeout => "preface_timeout",
            HboneRefusal::Idle => "idle",
            HboneRefusal::PerSource => "per_source",
            HboneRefusal::PerPod => "per_pod",
            HboneRefusal::PerPodPaused => "per_pod_paused",
            HboneRefusal::UnknownWorkload => "unknown_workload",
            HboneRefusal::Unsupported => "unsupported",
        }
    }
}

impl std::fmt::Display for HboneRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
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

    /// The series of `key` under `mesh` (the snapshot the caller decided
    /// the connection with), from this thread's cache: made (labels built,
    /// counters created) only the first time this thread sees the key
    /// under this mesh and since series were last dropped.
    pub fn series(&self, mesh: Option<&Arc<ringway_config::Mesh>>, key: SeriesKey) -> Arc<Series> {
        let epoch = self.series_epoch.load(std::sync::atomic::Ordering::Acquire);
        SERIES.with(|cell| {
            let mut cell = cell.borrow_mut();
            let valid = cell.as_ref().is_some_and(|c| {
                c.metrics == self.id.0
                    && c.epoch == epoch
                    && match (&c.mesh, mesh) {
                        (None, None) => true,
                        (Some(w), Some(m)) => std::ptr::eq(w.as_ptr(), Arc::as_ptr(m)),
                        _ => false,
                    }
            });
            if !valid {
                *cell = Some(SeriesCache {
                    metrics: self.id.0,
                    epoch,
                    mesh: mesh.map(Arc::downgrade),
                    map: HashMap::new(),
                });
            }
            let cache = cell.as_mut().expect("set above");
            if let Some(s) = cache.map.get(&key) {
                return s.clone();
            }
            let labels = key.labels(mesh.map(|m| &**m));
            let s = Arc::new(Series {
                opened: self.opened.get_or_create(&labels),
                closed: self.closed.get_or_create(&labels),
                sent: self.sent.get_or_create(&labels),
                received: self.received.get_or_create(&labels),
                labels,
            });
            if cache.map.len() >= SERIES_CACHE_MAX {
                cache.map.clear();
            }
            cache.map.insert(key, s.clone());
            s
        })
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
            "Connections reset before any upstream was dialled, by reason: a source (outbound) or destination (plaintext inbound) that is not the pod's, a pod whose workload the control plane has not sent, a destination behind a waypoint or network gateway",
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
        r.register_collector(Box::new(SocketsOpen(self.clone())));
        r.register_collector(Box::new(Certificates(self.clone())));
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
        )?)
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
