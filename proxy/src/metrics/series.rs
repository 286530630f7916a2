//! The `istio_tcp_*` series of a connection: what one reporter's series is
//! made of ([`SeriesKey`]), its counter handles ([`Series`]), and the
//! per-thread cache that resolves a key to them ([`Metrics::series`]) so a
//! connection seen before costs a small hash and no string.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;

use super::labels::{DstService, Peer, TcpLabels};
use super::Metrics;

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

impl Metrics {
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
}
