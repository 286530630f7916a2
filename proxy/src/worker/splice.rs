//! The spliced path of a connection: its registration with the pods it
//! touches ([`ConnGuard`]), the upstream socket made in the right netns
//! and connected ([`Hop`], [`connect_hop`]), its series, and the bytes
//! moved both ways with splice ([`splice`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ringway_config::Mesh;

use super::ctx::{is_resource_exhaustion, PodLocal, WorkerCtx};
use crate::copy::{copy_one_way, DirEnd, Meter};
use crate::metrics::{ConnectFailLabels, Series, SeriesKey, ServiceRef, Side};
use crate::pod::{FlowAuthz, PodShared};
use crate::policy;
use crate::sock::{self, ListenerKind, Sock};
use crate::sys;

/// A connection's registration with its pod (and, on the fast path, with
/// the destination pod): removing either pod resets it. Dropped when the
/// connection ends.
pub(super) struct ConnGuard {
    pub(super) pod: Rc<PodLocal>,
    pub(super) id: u64,
    /// With the same-node fast path, the connection is also registered with
    /// the destination pod (its upstream socket lives in that pod's netns).
    pub(super) target: Option<(Rc<PodLocal>, u64)>,
    /// Counts the connection active until the guard goes.
    pub(super) _active: super::ctx::Counted,
}

impl ConnGuard {
    /// Records the connection's upstream socket (replacing an earlier
    /// attempt's), registering it with the destination pod when that pod is
    /// served here (fast path), so removing either pod resets it.
    fn set_upstream(
        &mut self,
        client: &Arc<OwnedFd>,
        upstream: Arc<OwnedFd>,
        target: Option<Rc<PodLocal>>,
    ) {
        if let Some((old, id)) = self.target.take() {
            old.conns.borrow_mut().remove(&id);
        }
        if let Some(slot) = self.pod.conns.borrow_mut().get_mut(&self.id) {
            slot[1] = Some(upstream.clone());
        }
        if let Some(target) = target {
            let tid = target.next_id.get();
            target.next_id.set(tid + 1);
            target
                .conns
                .borrow_mut()
                .insert(tid, [Some(client.clone()), Some(upstream)]);
            self.target = Some((target, tid));
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.pod.conns.borrow_mut().remove(&self.id);
        if let Some((target, id)) = &self.target {
            target.conns.borrow_mut().remove(id);
        }
    }
}

/// Where a spliced connection's upstream socket is made and what it dials.
pub(super) struct Hop {
    /// The address the upstream socket connects to.
    pub(super) addr: SocketAddr,
    /// The pod whose netns the upstream socket lives in.
    pub(super) netns: Arc<PodShared>,
    /// The source address to spoof (the client's), if any.
    pub(super) spoof: Option<IpAddr>,
    /// The authorization to register for re-checks, with the pod it was
    /// made against.
    pub(super) flow: Option<(Arc<PodShared>, FlowAuthz)>,
}

/// Makes the upstream socket of `hop` (in its netns) and connects it.
pub(super) async fn connect_hop(
    ctx: &WorkerCtx,
    guard: &mut ConnGuard,
    client: &Arc<OwnedFd>,
    hop: &Hop,
) -> io::Result<Sock> {
    let s = &ctx.settings;
    let up_fd = sys::in_netns(hop.netns.netns.as_fd(), || {
        sock::make_upstream(hop.addr, s.proxy_mark, hop.spoof, hop.netns.ports)
    })
    .and_then(|r| r)
    .inspect_err(|e| {
        if is_resource_exhaustion(e) {
            ctx.stats.accept_resource_errors.inc();
        }
    })?;
    // The client spoke first (its bytes are waiting): they are spliced as
    // soon as the connect completes, so its last ACK goes with them.
    if sys::bytes_waiting(client.as_fd()) {
        sock::hold_last_ack(up_fd.as_fd());
    }
    let upstream = Sock::new(up_fd, ctx.backend)?;
    // A fast-path connection belongs to the destination pod as well: removing
    // that pod must reset it (as it resets the inbound side of a connection
    // that crossed the network), and must not leave a proxy socket behind in
    // the removed pod's netns. Registered in the same synchronous step as the
    // `local_pods` lookup, so a RemovePod for the target, which this worker
    // handles only between awaits, always finds it.
    let target = if Arc::ptr_eq(&hop.netns, &guard.pod.shared) {
        None
    } else {
        let t = ctx.pods.borrow().get(&hop.netns.uid).cloned();
        if t.is_none() {
            // Removed since the lookup: nothing to connect to any more.
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "destination pod removed",
            ));
        }
        t
    };
    guard.set_upstream(client, upstream.shared(), target);
    let limit = s.connect_timeout;
    let r = match tokio::time::timeout(limit, upstream.connect(hop.addr.into())).await {
        Ok(r) => r,
        Err(_) => {
            // Given up: reset the socket so an io_uring connect still in
            // flight completes now and the fd goes, not after the SYN retries.
            sys::tcp_abort(upstream.fd());
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connect to {} timed out after {limit:?}", hop.addr),
            ))
        }
    };
    if let Err(e) = &r {
        ctx.metrics
            .connect_failures
            .get_or_create(&ConnectFailLabels::of(e))
            .inc();
    }
    r.map(|()| upstream)
}

/// The series of a spliced connection, one per reporting side: the
/// outbound side reports as `source` (with `service`, the VIP's, if the
/// client dialled one), the inbound side as `destination` (with the
/// destination pod's service it guesses, as the reference: the one the
/// source named, else one with the target port); the fast path plays both.
/// Pods served here are keyed by their shared labels, others by address,
/// so a pair seen before costs the worker a small hash and no string.
pub(super) fn splice_labels(
    ctx: &WorkerCtx,
    mesh: Option<&Arc<Mesh>>,
    pod: &PodLocal,
    kind: ListenerKind,
    peer: SocketAddr,
    hop: &Hop,
    service: Option<&Arc<ringway_config::Service>>,
) -> Vec<Arc<Series>> {
    // A pod served here, else the mesh's workload at that address.
    let side = |ip: IpAddr| {
        let local = ctx
            .local_pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ip)
            .cloned();
        match local {
            Some(p) => Side::Pod(p.labels(mesh)),
            None => Side::Addr(ip),
        }
    };
    let fast = !Arc::ptr_eq(&hop.netns, &pod.shared);
    let me = Side::Pod(pod.shared.labels(mesh));
    let (src, dst) = match kind {
        ListenerKind::Inbound => (side(peer.ip()), me),
        _ if fast => (me, Side::Pod(hop.netns.labels(mesh))),
        _ => (me, side(hop.addr.ip())),
    };
    let index = |s: &Arc<ringway_config::Service>| Some(ServiceRef(s.clone()));
    let inbound_service = |target: &PodShared| {
        let host = service.map(|s| s.hostname.as_str());
        let m = mesh?;
        index(target.inbound_service(m, host, hop.addr.port())?)
    };
    let key = |reporter, service| SeriesKey {
        reporter,
        security: "none",
        src: src.clone(),
        dst: dst.clone(),
        service,
    };
    let series = |k| ctx.metrics.series(mesh, k);
    match kind {
        ListenerKind::Inbound => vec![series(key("destination", inbound_service(&pod.shared)))],
        _ if fast => vec![
            series(key("source", service.and_then(index))),
            series(key("destination", inbound_service(&hop.netns))),
        ],
        _ => vec![series(key("source", service.and_then(index)))],
    }
}

/// Moves bytes both ways between the client and its connected upstream
/// with splice, then logs the connection.
pub(super) async fn splice(
    ctx: &WorkerCtx,
    client: &Arc<OwnedFd>,
    upstream: Sock,
    hop: &Hop,
    series: Vec<Arc<Series>>,
    started: Instant,
) {
    let client = match Sock::from_shared(client.clone(), ctx.backend) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot register accepted socket; resetting");
            sys::tcp_abort(client.as_fd());
            sys::tcp_abort(upstream.fd());
            return;
        }
    };
    // Authorized against the destination's policies: re-checked when they change.
    let _flow = hop.flow.as_ref().map(|(pod, authz)| {
        policy::register(
            pod,
            vec![client.shared(), upstream.shared()],
            authz.clone(),
            &ctx.in_force,
            &ctx.metrics,
        )
    });
    for s in &series {
        s.opened.inc();
    }
    let up_meter = Meter {
        total: &ctx.stats.bytes_to_upstream,
        counters: series.iter().map(|s| s.received.clone()).collect(),
    };
    let down_meter = Meter {
        total: &ctx.stats.bytes_to_client,
        counters: series.iter().map(|s| s.sent.clone()).collect(),
    };
    let (up_end, down_end) = tokio::join!(
        copy_one_way(&client, &upstream, &ctx.pool, &up_meter),
        copy_one_way(&upstream, &client, &ctx.pool, &down_meter),
    );
    for s in &series {
        s.closed.inc();
    }
    // Formatted only when the access log is on (the macro evaluates its
    // fields then): two strings per connection otherwise.
    let reason = |e: &DirEnd| match e {
        DirEnd::Eof => "eof".to_string(),
        DirEnd::ReadFailed(e) => format!("read: {e}"),
        DirEnd::WriteFailed(e) => format!("write: {e}"),
    };
    let (sent, received) = (up_end.1, down_end.1);
    let who = series.first().map(|s| &s.labels);
    tracing::event!(
        target: "access",
        tracing::Level::INFO,
        src.workload = who.map(|l| l.source_workload.as_str()).unwrap_or(""),
        src.identity = who.map(|l| l.source_principal.as_str()).unwrap_or(""),
        dst.workload = who.map(|l| l.destination_workload.as_str()).unwrap_or(""),
        dst.identity = who.map(|l| l.destination_principal.as_str()).unwrap_or(""),
        bytes.sent = sent,
        bytes.received = received,
        duration.ms = started.elapsed().as_millis() as u64,
        upstream.end = %reason(&up_end.0),
        downstream.end = %reason(&down_end.0),
        "connection closed"
    );
}
