//! An outbound connection: a service VIP resolved to its healthy
//! endpoints, and per endpoint the same-node fast path, a tunnel (HBONE)
//! or a direct connection, the next endpoint tried when connecting fails
//! (never after a denial). A tunnelled connection's copy runs in a task of
//! its own ([`tunnel_copy`]).

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use ringway_config::Mesh;
use tracing::Instrument;

use super::ctx::spawn_local;
use super::ctx::{connect_failed, deny, failed_labels, refuse, refuse_counted, refuse_foreign};
use super::ctx::{PodLocal, WorkerCtx};
use super::splice::{connect_hop, splice, splice_labels, ConnGuard, Hop};
use crate::metrics::{DstService, Peer, Series, SeriesKey, ServiceRef, Side, TcpLabels};
use crate::pod::PodShared;
use crate::policy;
use crate::sock::ListenerKind;
use crate::sys;
use crate::tunnel;

/// How many endpoints of a service one connection tries before it gives up.
const SERVICE_TRIES: usize = 3;

/// Why a connection to a service VIP has nowhere to go.
#[derive(Debug, thiserror::Error)]
enum NoEndpoint {
    /// The service does not serve the port dialled.
    #[error("service {service} has no port {port}")]
    NoPort {
        /// The service's host name.
        service: String,
        /// The port dialled.
        port: u16,
    },
    /// No endpoint that takes connections (healthy unless the service
    /// allows others, not contested, within its routing preference) has an
    /// address of the family dialled and a target port.
    #[error("service {service} has no endpoint that takes the connection (healthy, within its routing preference) with an {family} address and a target port for {port}")]
    NoHealthy {
        /// The service's host name.
        service: String,
        /// `IPv4` or `IPv6`: the family dialled.
        family: &'static str,
        /// The port dialled.
        port: u16,
    },
}

/// Where an outbound connection to one address goes.
enum Route {
    /// A pod served here: connect inside its netns (same-node fast path).
    Local(Arc<PodShared>),
    /// A workload speaking HBONE: tunnel to it.
    Tunnel(Box<tunnel::OutboundPlan>),
    /// Anything else: connect from the source pod's netns.
    Direct,
}

fn route(ctx: &WorkerCtx, mesh: Option<&Mesh>, pod: &PodLocal, addr: SocketAddr) -> Route {
    if ctx.settings.same_node_fast_path {
        let local = ctx
            .local_pods
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr.ip())
            .cloned();
        // Not to a pod whose address, read from its netns, the mesh's
        // record of it does not list (a pod of another node's, say): the
        // address goes where the mesh says. A record not come yet is
        // waited for on the fast path, then checked there.
        if let Some(target) =
            local.filter(|t| mesh.is_none_or(|m| t.confirms_address(m, addr.ip()) != Some(false)))
        {
            return Route::Local(target);
        }
    }
    match tunnel::outbound_plan(&ctx.in_force, &pod.shared, addr) {
        Some(plan) => Route::Tunnel(Box::new(plan)),
        None => Route::Direct,
    }
}

/// The addresses an outbound connection to `dst` from `pod` may go to, in
/// the order to try them: a service VIP's endpoints that take connections,
/// under its routing preference as seen from the pod (round robin, at most
/// [`SERVICE_TRIES`]), else `dst` itself (also for a service whose load
/// balancing is passthrough).
fn candidates(
    ctx: &WorkerCtx,
    mesh: Option<&ringway_config::Mesh>,
    pod: &PodShared,
    dst: SocketAddr,
) -> Result<Vec<SocketAddr>, NoEndpoint> {
    let Some((mesh, svc)) = mesh.and_then(|m| Some((m, m.service_by_vip(dst.ip())?))) else {
        return Ok(vec![dst]);
    };
    if svc.target_port(dst.port()).is_none() {
        return Err(NoEndpoint::NoPort {
            service: svc.hostname.clone(),
            port: dst.port(),
        });
    }
    if svc
        .load_balancing
        .as_ref()
        .is_some_and(|lb| lb.mode == ringway_config::LbMode::Passthrough)
    {
        return Ok(vec![dst]);
    }
    // The client's record only where the service has a preference.
    let client = svc
        .load_balancing
        .as_ref()
        .filter(|lb| !lb.routing_preference.is_empty())
        .and_then(|_| pod.workload(mesh));
    let eps: Vec<SocketAddr> = mesh
        .endpoints_for(svc, dst.port(), dst.is_ipv6(), client)
        .into_iter()
        .map(|(_, addr)| addr)
        .collect();
    if eps.is_empty() {
        return Err(NoEndpoint::NoHealthy {
            service: svc.hostname.clone(),
            family: if dst.is_ipv6() { "IPv6" } else { "IPv4" },
            port: dst.port(),
        });
    }
    let start = ctx.next_endpoint.get();
    ctx.next_endpoint.set(start.wrapping_add(1));
    Ok((0..eps.len().min(SERVICE_TRIES))
        .map(|i| eps[(start + i) % eps.len()])
        .collect())
}

/// An outbound connection: resolve a service VIP, then per candidate
/// endpoint take the fast path, a tunnel, or a direct connection; the next
/// endpoint is tried when connecting fails (never after a denial).
pub(super) async fn outbound(
    ctx: Rc<WorkerCtx>,
    pod: Rc<PodLocal>,
    mut guard: ConnGuard,
    client: Arc<OwnedFd>,
    peer: SocketAddr,
    dst: SocketAddr,
    started: Instant,
) {
    let mesh = ctx.in_force.mesh();
    // The service the client dialled (its VIP): the metrics'
    // destination_service* on this side, `host=` to the tunnel's far side.
    let service = mesh.as_deref().and_then(|m| m.service_by_vip(dst.ip()));
    // A destination whose traffic must pass a waypoint (or a network
    // gateway) this proxy does not support: refused, never sent around it.
    let unsupported = match (service, mesh.as_deref()) {
        (Some(s), _) => s.unsupported.as_ref(),
        (None, Some(m)) => m
            .workload_by_ip(dst.ip())
            .and_then(|w| w.unsupported.as_ref()),
        (None, None) => None,
    };
    if let Some(u) = unsupported {
        refuse_counted(&ctx, &client, u.label(), u);
        return;
    }
    // An address of a resource the control plane sent and this proxy
    // refused resolves to nothing: refused, never sent in plaintext as if it
    // were outside the mesh.
    if let Some(name) = mesh.as_deref().and_then(|m| m.refused_claim(dst.ip())) {
        let why = format!(
            "{} is claimed by {name}, a resource of the control plane this proxy refused (see the NACK): it resolves to nothing",
            dst.ip()
        );
        refuse_counted(&ctx, &client, "refused_address", &why);
        return;
    }
    // An address two entries of the control plane claim resolves to
    // neither: refused, never sent in plaintext as if it were outside the
    // mesh (a claim on another's address must not strip its traffic's TLS).
    let claimants = mesh
        .as_deref()
        .map_or(0, |m| m.address_claimants(dst.ip()).len());
    if claimants > 1 {
        let why = format!(
            "{} is claimed by {claimants} entries of the mesh (contested): it resolves to none",
            dst.ip()
        );
        refuse_counted(&ctx, &client, "contested_address", &why);
        return;
    }
    let targets = match candidates(&ctx, mesh.as_deref(), &pod.shared, dst) {
        Ok(t) => t,
        Err(why) => {
            tracing::info!(target: "access", reason = %why, "connection to a service refused; reset");
            refuse(&ctx, &client);
            return;
        }
    };
    let mut failed: Option<(Vec<TcpLabels>, String)> = None;
    for addr in targets {
        if failed.is_some() {
            tracing::debug!(dst.endpoint = %addr, "trying the next endpoint");
        }
        match route(&ctx, mesh.as_deref(), &pod, addr) {
            Route::Local(target) => {
                tracing::Span::current().record("dst.pod", tracing::field::display(&target.uid));
                // The destination pod's workload (labels, policies) may not
                // have come from the control plane yet: wait for it a bounded
                // time, as its inbound side would, then refuse; never decide
                // without it. Boxed: the wait is rare and must not size
                // every connection's state.
                let mesh = match &mesh {
                    Some(m) if !m.is_complete() && target.workload(m).is_none() => {
                        match Box::pin(ctx.in_force.mesh_knowing(&target)).await {
                            Ok(m) => m,
                            Err(e) => {
                                refuse_counted(&ctx, &client, "unknown_workload", &e);
                                return;
                            }
                        }
                    }
                    _ => mesh.clone(),
                };
                if mesh
                    .as_deref()
                    .is_some_and(|m| target.confirms_address(m, addr.ip()) != Some(true))
                {
                    refuse_foreign(&ctx, &client, "destination_not_pod_address", addr.ip());
                    return;
                }
                // As a tunnel's far side refuses it: the proxy's own ports
                // in the pod's netns are never an app's.
                if ctx.tunnel.is_proxy_port(addr.port()) {
                    let why = format!("{addr} is a port of the proxy, not of the app");
                    refuse_counted(&ctx, &client, "proxy_port", &why);
                    return;
                }
                let flow = match &mesh {
                    Some(mesh) => {
                        match policy::authorize_local(
                            &ctx.metrics,
                            mesh,
                            &pod.shared,
                            peer.ip(),
                            &target,
                            addr,
                        ) {
                            Ok(f) => Some((target.clone(), f)),
                            Err(why) => {
                                deny(&ctx, &client, "local", &why);
                                return;
                            }
                        }
                    }
                    None => None,
                };
                ctx.stats.same_node.inc();
                let hop = Hop {
                    addr,
                    netns: target,
                    spoof: Some(peer.ip()),
                    flow,
                };
                let series = splice_labels(
                    &ctx,
                    mesh.as_ref(),
                    &pod,
                    ListenerKind::Outbound,
                    peer,
                    &hop,
                    service,
                );
                match connect_hop(&ctx, &mut guard, &client, &hop).await {
                    Ok(up) => return splice(&ctx, &client, up, &hop, series, started).await,
                    Err(e) => failed = Some((failed_labels(&series), e.to_string())),
                }
            }
            Route::Direct => {
                let hop = Hop {
                    addr,
                    netns: pod.shared.clone(),
                    spoof: None,
                    flow: None,
                };
                let series = splice_labels(
                    &ctx,
                    mesh.as_ref(),
                    &pod,
                    ListenerKind::Outbound,
                    peer,
                    &hop,
                    service,
                );
                match connect_hop(&ctx, &mut guard, &client, &hop).await {
                    Ok(up) => return splice(&ctx, &client, up, &hop, series, started).await,
                    Err(e) => failed = Some((failed_labels(&series), e.to_string())),
                }
            }
            Route::Tunnel(mut plan) => {
                plan.service = service.map(|s| DstService::of(s));
                let svc = service.map(|s| ServiceRef(s.clone()));
                // Boxed: the tunnel's futures (TLS, HTTP/2, copies) are large
                // and would otherwise sit in every spliced connection's state.
                let open = tunnel_outbound(&ctx, mesh.as_ref(), &pod, &client, peer, plan, svc);
                match Box::pin(open).await {
                    TunnelOutcome::Open(open) => {
                        // The copy runs in a task of its own that takes the
                        // connection's registration; this task, sized for
                        // every path of a connection, ends here instead of
                        // waiting as long as the tunnel is open.
                        let span = tracing::Span::current();
                        let copy = tunnel_copy(ctx.clone(), guard, open, started);
                        spawn_local(ctx.backend, copy.instrument(span));
                        return;
                    }
                    TunnelOutcome::Done => return,
                    TunnelOutcome::Failed(f) => failed = Some(f),
                }
            }
        }
    }
    let (labels, error) = failed.unwrap_or_default();
    connect_failed(&ctx, &client, &labels, &error);
}

/// How opening a tunnel for an outbound connection went.
enum TunnelOutcome {
    /// Open: the copy is to run ([`tunnel_copy`]).
    Open(Box<OpenTunnel>),
    /// Done: denied by the destination (final), or the client is gone.
    Done,
    /// Failed: the caller may try another endpoint.
    Failed((Vec<TcpLabels>, String)),
}

/// An open tunnel and its client, with what the copy's setup needs.
struct OpenTunnel {
    client: tokio::net::TcpStream,
    stream: ringway_hbone::HboneStream,
    plan: Box<tunnel::OutboundPlan>,
    /// The source pod's labels and the connection's series.
    named: Box<(Arc<Peer>, Arc<Series>)>,
}

/// Opens an outbound connection's tunnel to `plan.dst` over HBONE; `svc`
/// is the dialled service ([`SeriesKey::service`]).
async fn tunnel_outbound(
    ctx: &WorkerCtx,
    mesh: Option<&Arc<Mesh>>,
    pod: &PodLocal,
    client: &Arc<OwnedFd>,
    peer: SocketAddr,
    plan: Box<tunnel::OutboundPlan>,
    svc: Option<ServiceRef>,
) -> TunnelOutcome {
    let cx = ctx.tunnel_ctx();
    let addr = plan.dst;
    let src = pod.shared.labels(mesh);
    let series = ctx.metrics.series(
        mesh,
        SeriesKey {
            reporter: "source",
            security: "mutual_tls",
            src: Side::Pod(src.clone()),
            // The plan's destination: the mesh's workload at that address.
            dst: Side::Addr(addr.ip()),
            service: svc,
        },
    );
    // What the client has sent already (a client that speaks first: HTTP,
    // TLS) leaves with the CONNECT instead of after the peer's answer. Only
    // peeked: they stay queued until this stream is open, so another
    // endpoint tried after a failure gets them all.
    let first = match sys::peek_ready(client.as_fd()) {
        Ok(b) => b,
        Err(e) => {
            // Reset before we answered: nothing to open.
            tracing::debug!(error = %e, "client gone before the tunnel opened");
            sys::tcp_abort(client.as_fd());
            return TunnelOutcome::Done;
        }
    };
    // Boxed: the open's state (dial, TLS handshake, HTTP/2 request) is
    // freed once the stream is open.
    let opened = Box::pin(tunnel::open_outbound(
        &cx,
        &ctx.hbone_pool,
        &pod.shared,
        &src,
        peer,
        &plan,
        first,
    ))
    .await;
    match opened {
        Ok(stream) => {
            if let Err(e) = sys::consume_peeked(client.as_fd(), stream.sent_first() as usize) {
                tracing::debug!(error = %e, "client's first bytes not consumed; reset");
                sys::tcp_abort(client.as_fd());
                stream.reset();
                return TunnelOutcome::Done;
            }
            match adopt_client(client) {
                Some(client) => TunnelOutcome::Open(Box::new(OpenTunnel {
                    client,
                    stream,
                    plan,
                    named: Box::new((src, series)),
                })),
                None => TunnelOutcome::Done,
            }
        }
        Err(tunnel::TunnelError::Hbone(ringway_hbone::HboneError::Denied)) => {
            // The destination's policy said no: final, and the client
            // learns it as a reset.
            tracing::event!(
                target: "access",
                tracing::Level::INFO,
                dst.endpoint = %addr,
                "tunnel denied by the destination (401); client reset"
            );
            ctx.stats.connect_failed.inc();
            ctx.metrics.connection_failed(&series.labels);
            sys::tcp_abort(client.as_fd());
            TunnelOutcome::Done
        }
        Err(e) => TunnelOutcome::Failed((vec![series.labels.clone()], format!("hbone: {e}"))),
    }
}

/// Copies an open tunnel's bytes until both sides are done, holding the
/// connection's registration; the plan, peers and labels are dropped once
/// the copy is set up (it keeps counter handles and the access log's
/// names), so an idle tunnel holds little more than its sockets.
async fn tunnel_copy(
    ctx: Rc<WorkerCtx>,
    guard: ConnGuard,
    open: Box<OpenTunnel>,
    started: Instant,
) {
    let cx = ctx.tunnel_ctx();
    let OpenTunnel {
        client,
        stream,
        plan,
        named,
    } = *open;
    let pumping = tunnel::outbound_pump(cx, &named.0, client, stream, &plan, &named.1, started);
    drop((plan, named));
    pumping.await;
    drop(guard);
}

/// The accepted client as a tokio stream (a duplicate: the pod registry keeps
/// the original to reset it); the client is reset when that fails.
fn adopt_client(client: &OwnedFd) -> Option<tokio::net::TcpStream> {
    match client.try_clone().and_then(tunnel::adopt) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(error = %e, "cannot register accepted socket; resetting");
            sys::tcp_abort(client.as_fd());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ret_size4<A, B, C, D, R>(_: impl Fn(A, B, C, D) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// An idle tunnelled connection holds the task of its copy
    /// (`tunnel_copy`) for its whole life, and nothing else of its own: the
    /// open (dial, TLS, HTTP/2 request) is boxed and freed once open, the
    /// connection's first task (sized for every path) ends then, and the
    /// plan, peer and labels are dropped before the copy. Before, the
    /// connection's task (2,976 B in a heap profile of the release build)
    /// waited on the boxed `tunnel_outbound` future (3,416 B) for the
    /// tunnel's life; in a debug build that future was 6,656 B, then 3,408.
    #[test]
    fn tunnel_copy_task_stays_small() {
        let size = ret_size4(tunnel_copy);
        println!("tunnel_copy future: {size} bytes");
        assert!(size <= 1280, "the tunnel_copy future grew to {size} bytes");
    }
}
