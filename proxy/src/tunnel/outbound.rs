//! The source side of a tunnel: whether a captured outbound connection
//! goes over HBONE ([`outbound_plan`]), the CONNECT stream opened for it
//! over a pooled HTTP/2 connection dialled with mutual TLS from the pod's
//! netns ([`open_outbound`]), and the copy between the client and the
//! stream ([`outbound_pump`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringway_config::authz::Identity;
use ringway_hbone::{Baggage, ConnectHeaders, Dialled, Pool, PoolKey};
use ringway_identity::IdentityManager;
use tokio::net::TcpStream;

use super::error::TunnelError;
use super::socket::connect_in_pod;
use super::state::TunnelState;
use super::tls_failure::{tls_failure_reason, HandshakeTimeout};
use super::tls_io::{LazyBufIo, TLS_WRITE_LIMIT};
use crate::copy::Meter;
use crate::in_force::InForce;
use crate::metrics::{DstService, Metrics, Peer, Series, TlsLabels};
use crate::pod::PodShared;
use crate::policy::pod_identity;
use crate::stats::Stats;
use crate::sys;

/// How an outbound connection will be tunnelled.
#[derive(Debug)]
pub struct OutboundPlan {
    /// The original destination (`:authority`).
    pub dst: SocketAddr,
    /// The destination pod's name (the access log's; not the whole
    /// workload, which a connection would copy with its labels).
    pub dst_name: String,
    /// What the source presents.
    pub src_identity: Identity,
    /// What the destination must present.
    pub dst_identity: Identity,
    /// The service the client connected to (its VIP), if any: the
    /// `forwarded` header's `host=`.
    pub service: Option<DstService>,
    ids: Arc<IdentityManager>,
}

/// Whether a captured outbound connection to `dst` goes over HBONE: the
/// destination is a mesh workload speaking the tunnel and the source pod has
/// an identity.
pub fn outbound_plan(in_force: &InForce, pod: &PodShared, dst: SocketAddr) -> Option<OutboundPlan> {
    let (ids, mesh) = in_force.enabled()?;
    let w = mesh.workload_by_ip(dst.ip().to_canonical())?;
    if !w.tunnel {
        return None;
    }
    let src_identity = pod_identity(&mesh, pod)?;
    let dst_identity = w.identity(mesh.trust_domain());
    Some(OutboundPlan {
        dst,
        dst_name: w.name.clone(),
        src_identity,
        dst_identity,
        service: None,
        ids,
    })
}

/// Per-connection context the worker hands in.
#[derive(Debug)]
pub struct ConnCtx<'a> {
    /// Datapath counters.
    pub stats: &'a Stats,
    /// Prometheus metrics.
    pub metrics: &'a Metrics,
    /// The proxy's SO_MARK.
    pub mark: u32,
    /// Bound on the TCP connect and on the TLS handshake of a new tunnel
    /// (`proxy.connectTimeout`).
    pub connect_timeout: Duration,
    /// What the workers share about HBONE (where a new tunnel's dial is
    /// registered, see [`TunnelState::dialled_by`]).
    pub tunnel: &'a Arc<TunnelState>,
    /// The worker the connection runs on.
    pub worker: usize,
}

/// Copies bytes between the client and its open CONNECT stream, counting
/// them as they move, then logs the connection.
///
/// Counts the open now (in `series`, the source side's) and returns the
/// copy as a future that keeps only what it needs (counter handles and the
/// four names of the access log), so the caller can drop the plan, peers
/// and series before awaiting it: an idle tunnel holds that future for its
/// whole life.
pub fn outbound_pump<'a>(
    cx: ConnCtx<'a>,
    src_peer: &Peer,
    client: TcpStream,
    stream: ringway_hbone::HboneStream,
    plan: &OutboundPlan,
    series: &Series,
    started: Instant,
) -> impl std::future::Future<Output = ()> + 'a {
    series.opened.inc();
    cx.metrics
        .hbone_streams
        .get_or_create(&TlsLabels {
            side: "client",
            outcome: "ok",
        })
        .inc();
    // Counters advance as bytes move, as on the splice path.
    let up_meter = Meter {
        total: &cx.stats.bytes_to_upstream,
        counters: vec![series.received.clone()],
    };
    let down_meter = Meter {
        total: &cx.stats.bytes_to_client,
        counters: vec![series.sent.clone()],
    };
    let closed = series.closed.clone();
    let names = Box::new([
        src_peer.workload.clone(),
        plan.src_identity.to_string(),
        plan.dst_name.clone(),
        plan.dst_identity.to_string(),
    ]);
    async move {
        // The client's first bytes went out with the CONNECT.
        let first = stream.sent_first();
        up_meter.add(first);
        let (up, down, end) = pump(client, stream, &up_meter, &down_meter).await;
        let up = up + first;
        closed.inc();
        let [src_workload, src_identity, dst_workload, dst_identity] = *names;
        tracing::event!(
            target: "access",
            tracing::Level::INFO,
            src.workload = %src_workload,
            src.identity = %src_identity,
            dst.workload = %dst_workload,
            dst.identity = %dst_identity,
            bytes.sent = up,
            bytes.received = down,
            duration.ms = started.elapsed().as_millis() as u64,
            end = %end,
            security = "mutual_tls",
            "connection closed"
        );
    }
}

/// Opens a CONNECT stream for `plan`: over a pooled HTTP/2 connection from
/// `pod` to the destination's port 15008, dialled (TCP + mTLS) if needed.
pub async fn open_outbound(
    cx: &ConnCtx<'_>,
    pool: &Pool,
    pod: &PodShared,
    src_peer: &Peer,
    client_addr: SocketAddr,
    plan: &OutboundPlan,
    first: bytes::Bytes,
) -> Result<ringway_hbone::HboneStream, TunnelError> {
    let (key, tunnel) = tunnel_key(pod, plan, client_addr.ip());
    let src = key.src_ip;
    let dial = || dial_tunnel(cx, pod, plan, src, tunnel);
    let some = |s: &String| Some(s.clone()).filter(|s| !s.is_empty());
    let baggage = Baggage {
        cluster: some(&src_peer.cluster),
        namespace: some(&src_peer.namespace),
        workload: some(&src_peer.workload),
        service: some(&src_peer.canonical_service),
        revision: some(&src_peer.canonical_revision),
        ..Baggage::default()
    };
    let mut headers = ConnectHeaders::new(plan.dst)
        .forwarded_for(client_addr)
        .baggage(baggage);
    if let Some(svc) = &plan.service {
        // The destination reports the service from it (as the reference).
        headers = headers.forwarded_host(&svc.hostname);
    }
    Ok(pool.connect_with_data(key, dial, headers, first).await?)
}

/// The dial of a new pooled connection for `plan`: TCP from `pod`'s netns
/// to `tunnel`, then mutual TLS, bounded by the connect timeout, counted
/// in the TLS handshake metrics. Only a new connection needs the TLS
/// config (a pooled one is reused). The pool takes no new stream on it
/// shortly before the first of the two certificates it was authenticated
/// with expires, the server's or the one this end presented: a server
/// that sends no GOAWAY ahead of an expiry (ringway's does) gets no new
/// tunnel on a connection whose proof has run out. The dials in flight
/// from `src` to `tunnel` are bounded across the workers
/// ([`TunnelState::dial_slot`]); the wait for a place and the TCP connect
/// share the connect timeout, and the TLS handshake has its own, as before.
async fn dial_tunnel(
    cx: &ConnCtx<'_>,
    pod: &PodShared,
    plan: &OutboundPlan,
    src: IpAddr,
    tunnel: SocketAddr,
) -> io::Result<Dialled<tokio_rustls::client::TlsStream<LazyBufIo<TcpStream>>>> {
    let (mark, timeout) = (cx.mark, cx.connect_timeout);
    let waiting = Instant::now();
    let _slot = tokio::time::timeout(timeout, cx.tunnel.dial_slot(src, tunnel))
        .await
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no place among the tunnel dials in flight to {tunnel} within {timeout:?}"),
            )
        })?;
    // Read before and after the config (which, with a local CA, may issue
    // or renew the one it presents): the earlier of the two, so a
    // certificate renewed in between only makes the connection move on
    // sooner than it needs to, never later.
    let own = || {
        plan.ids
            .cached(&plan.src_identity)
            .ok()
            .map(|c| c.not_after())
    };
    let before = own();
    let tls = plan
        .ids
        .client_config(&plan.src_identity, &plan.dst_identity)
        .map_err(io::Error::other)?;
    let own_expires = [before, own()].into_iter().flatten().min();
    // A TLS client speaks first: the ClientHello carries the last ACK.
    // What the wait for a place left of the connect's bound (never
    // nothing: a place that came at the bound still gets a try).
    let left = timeout
        .saturating_sub(waiting.elapsed())
        .max(Duration::from_millis(100));
    let tcp = connect_in_pod(pod, mark, tunnel, None, left, true).await?;
    // Registered before the first byte of TLS: if this proxy serves the
    // other end, its server finds the mark once the handshake is done.
    let dial_mark = tcp
        .local_addr()
        .ok()
        .map(|a| cx.tunnel.mark_dial(a, cx.worker));
    let connector = tokio_rustls::TlsConnector::from(tls);
    let r = match tokio::time::timeout(
        timeout,
        connector.connect(ringway_identity::placeholder_server_name(), {
            let mut io = LazyBufIo::new(tcp);
            io.buffer();
            if let Some(m) = dial_mark {
                io.hold(m);
            }
            io
        }),
    )
    .await
    {
        Ok(r) => r,
        Err(_) => Err(HandshakeTimeout::io(timeout)),
    };
    let r = r.map(|mut tls| {
        tls.get_mut().1.set_buffer_limit(Some(TLS_WRITE_LIMIT));
        tls
    });
    let outcome = match &r {
        Ok(_) => "ok",
        Err(e) => tls_failure_reason(e),
    };
    cx.metrics
        .tls_handshakes
        .get_or_create(&TlsLabels {
            side: "client",
            outcome,
        })
        .inc();
    r.map(|tls| {
        let server_expires = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(ringway_identity::cert_expiry);
        let first = [server_expires, own_expires].into_iter().flatten().min();
        Dialled::expiring(tls, first)
    })
}

/// The pool key of a tunnel from `pod` for `plan` (its source address of
/// the tunnel's family, else `fallback`) and the tunnel's address.
fn tunnel_key(pod: &PodShared, plan: &OutboundPlan, fallback: IpAddr) -> (PoolKey, SocketAddr) {
    let tunnel = SocketAddr::new(plan.dst.ip(), ringway_hbone::HBONE_PORT);
    let src_ip = pod
        .ips
        .iter()
        .copied()
        .find(|ip| ip.is_ipv6() == tunnel.is_ipv6())
        .unwrap_or(fallback);
    let key = PoolKey {
        src_identity: plan.src_identity.to_string(),
        dst_identity: plan.dst_identity.to_string(),
        src_ip,
        dst: tunnel,
        trust_generation: plan.ids.trust_generation(),
    };
    (key, tunnel)
}

/// Dials the pooled connection `plan` would ride from `pod`, without a
/// stream, unless one is pooled already and `extra` is false (an
/// upgrade's warm-up, see [`super::warm`]): `Ok(Some(its local address))`
/// when it dialled one.
pub async fn warm_outbound(
    cx: &ConnCtx<'_>,
    pool: &Pool,
    pod: &PodShared,
    plan: &OutboundPlan,
    extra: bool,
) -> Result<Option<SocketAddr>, TunnelError> {
    let Some(&fallback) = pod.ips.first() else {
        return Ok(None);
    };
    let (key, tunnel) = tunnel_key(pod, plan, fallback);
    let src = key.src_ip;
    let local = std::cell::Cell::new(None);
    let dial = || async {
        let tls = dial_tunnel(cx, pod, plan, src, tunnel).await?;
        local.set(tls.get_ref().get_ref().0.tcp.local_addr().ok());
        Ok(tls)
    };
    let dialled = pool.warm(key, dial, extra).await?;
    Ok(local.get().filter(|_| dialled))
}

/// Copies both ways with half-close passed on (FIN <-> END_STREAM); an error
/// on either side resets both (TCP RST, RST_STREAM).
async fn pump(
    mut client: TcpStream,
    mut stream: ringway_hbone::HboneStream,
    up_meter: &Meter<'_>,
    down_meter: &Meter<'_>,
) -> (u64, u64, String) {
    let (mut up, mut down) = (0u64, 0u64);
    match pump_both(
        &mut client,
        &mut stream,
        up_meter,
        down_meter,
        &mut up,
        &mut down,
    )
    .await
    {
        Ok(()) => (up, down, "eof".to_string()),
        Err(e) => {
            sys::tcp_abort(client.as_fd());
            stream.reset();
            (up, down, format!("reset: {e}"))
        }
    }
}

/// Writes what it can of `buf` to `client` with MSG_MORE (for bytes a
/// `shutdown(SHUT_WR)` follows at once): the kernel holds them for the FIN.
fn poll_send_more(
    client: &TcpStream,
    cx: &mut std::task::Context<'_>,
    buf: &[u8],
) -> std::task::Poll<io::Result<usize>> {
    loop {
        std::task::ready!(client.poll_write_ready(cx))?;
        match client.try_io(tokio::io::Interest::WRITABLE, || {
            sys::send_more(client.as_fd(), buf)
        }) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return std::task::Poll::Ready(r),
        }
    }
}

/// Largest read from a client socket at once.
const READ_CHUNK: usize = 256 * 1024;

/// The first read from a client socket, and the next one after a short
/// read; reads double while they fill their buffer, up to [`READ_CHUNK`].
const MIN_READ: usize = 4 * 1024;

/// Both directions of a tunnelled connection in one task, driven by
/// readiness: client -> stream reads up to [`READ_CHUNK`] at once;
/// stream -> client writes each DATA chunk as it arrived. EOF on one side
/// becomes END_STREAM / `shutdown(SHUT_WR)` on the other; an error ends both.
async fn pump_both(
    client: &mut TcpStream,
    stream: &mut ringway_hbone::HboneStream,
    up_meter: &Meter<'_>,
    down_meter: &Meter<'_>,
    up: &mut u64,
    down: &mut u64,
) -> io::Result<()> {
    use std::future::Future;
    use std::task::Poll;
    use tokio::io::AsyncReadExt;
    // Read chunks still to hand to HTTP/2, oldest first.
    let mut to_stream: std::collections::VecDeque<bytes::Bytes> = Default::default();
    let mut to_client = bytes::Bytes::new();
    let (mut up_done, mut down_done) = (false, false);
    let mut want = MIN_READ;
    std::future::poll_fn(|cx| {
        // A busy connection yields after this many chunks per wake-up, so
        // the worker's other connections get their turn.
        let (mut up_budget, mut down_budget, mut yielded) = (16u32, 16u32, false);
        // client -> tunnel
        while !up_done {
            if up_budget == 0 {
                yielded = true;
                break;
            }
            up_budget -= 1;
            if let Some(front) = to_stream.front_mut() {
                match stream.poll_send(cx, front) {
                    Poll::Ready(Ok(())) => {
                        to_stream.pop_front();
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
            }
            // One `poll_read` (not readiness + `try_read`): a short read
            // clears the readiness, so a small message costs one `read`, not
            // a second one that finds EAGAIN. The kernel writes straight into
            // a new buffer that leaves as the `Bytes` HTTP/2 frames (no copy,
            // no zeroing); a pending read frees it, so a quiet connection
            // holds none.
            let mut buf = bytes::BytesMut::with_capacity(want);
            let read = std::pin::pin!(client.read_buf(&mut buf)).poll(cx);
            if let Poll::Ready(Ok(n)) = read {
                want = if n >= want {
                    (want * 2).min(READ_CHUNK)
                } else {
                    MIN_READ
                };
                // One read, one DATA frame (up to the peer's max frame
                // size, 1 MiB between ringway proxies; h2 splits it to a
                // smaller one's): fewer frame headers, TLS writes and wake-ups
                // per MB than 64 KiB pieces.
                to_stream.push_back(buf.freeze());
            }
            match read {
                Poll::Ready(Ok(0)) => {
                    stream.finish()?;
                    up_done = true;
                }
                Poll::Ready(Ok(n)) => {
                    up_meter.add(n as u64);
                    *up += n as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        // tunnel -> client
        while !down_done {
            if down_budget == 0 {
                yielded = true;
                break;
            }
            down_budget -= 1;
            if !to_client.is_empty() {
                // The peer's END_STREAM already came after these bytes: they
                // go with MSG_MORE, and the `shutdown` right after puts the
                // FIN on their segment (one segment and one wake-up of the
                // client fewer per response that closes its connection).
                let written = if stream.at_end() {
                    poll_send_more(client, cx, &to_client)
                } else {
                    tokio::io::AsyncWrite::poll_write(
                        std::pin::Pin::new(&mut *client),
                        cx,
                        &to_client,
                    )
                };
                match written {
                    Poll::Ready(Ok(n)) => {
                        let _ = to_client.split_to(n);
                        down_meter.add(n as u64);
                        *down += n as u64;
                        if to_client.is_empty() && stream.at_end() {
                            // The FIN now, before any yield: bytes sent with
                            // MSG_MORE never wait for a later poll.
                            let _ = sys::shutdown_write(client.as_fd());
                            down_done = true;
                            break;
                        }
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
                continue;
            }
            match stream.poll_chunk(cx) {
                Poll::Ready(Ok(Some(b))) => to_client = b,
                Poll::Ready(Ok(None)) => {
                    // The client may be gone already; its own reads tell.
                    let _ = sys::shutdown_write(client.as_fd());
                    down_done = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        if up_done && down_done {
            return Poll::Ready(Ok(()));
        }
        if yielded {
            // More to do right away: come back after the others.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root removed moves the pool key of every tunnel on (a connection
    /// dialled before, its server checked against that root, carries no new
    /// tunnel); a root added does not (the pooled connections stay).
    #[test]
    fn a_removed_root_gives_tunnels_a_new_pool_key_and_an_added_one_does_not() {
        let td = "cluster.local";
        let (ours, theirs) = (
            ringway_identity::CaSigner::generate_for_tests(td),
            ringway_identity::CaSigner::generate_for_tests(td),
        );
        let mut theirs_only = ringway_identity::TrustBundle::new();
        theirs_only.add(theirs.cert().clone());
        let ids = Arc::new(
            IdentityManager::new(
                ours,
                ringway_identity::TrustBundle::new(),
                td,
                std::time::Duration::from_secs(3600),
            )
            .unwrap(),
        );
        let plan = OutboundPlan {
            dst: "10.0.0.9:8080".parse().unwrap(),
            dst_name: "web-0".into(),
            src_identity: Identity::new(td, "front", "frontend"),
            dst_identity: Identity::new(td, "shop", "web"),
            service: None,
            ids: ids.clone(),
        };
        let pod = PodShared::new(
            "pod",
            std::os::fd::OwnedFd::from(std::fs::File::open("/dev/null").unwrap()),
            vec!["10.0.0.5".parse().unwrap()],
            crate::sock::PortSplit::default(),
            Default::default(),
            String::new(),
        );
        let key = || tunnel_key(&pod, &plan, "10.0.0.5".parse().unwrap()).0;
        let first = key();
        ids.set_bundle(theirs_only).unwrap();
        assert_eq!(key(), first, "a root added keeps the pooled connections");
        ids.set_bundle(ringway_identity::TrustBundle::new())
            .unwrap();
        assert_ne!(key(), first, "a root removed: a new connection");
    }
}
