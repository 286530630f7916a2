//! A pod's listeners and the connections they accept: the accept loop
//! (bounded batches, the tunnel port's pre-authentication places), and
//! each connection's first steps (checks, its pod's registration, the
//! mesh knowing its workload) before the path it takes: the tunnel
//! listener's server, a plaintext inbound splice, or an outbound
//! connection.

use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringway_config::CaptureMode;
use socket2::SockAddr;
use tracing::Instrument;

use super::ctx::{connect_failed, refuse_foreign, spawn_local, PodLocal, WorkerCtx};
use super::ctx::{deny, failed_labels, is_resource_exhaustion, refuse, refuse_counted};
use super::ctx::{AcceptLoop, Counted};
use super::outbound::outbound;
use super::splice::{connect_hop, splice, splice_labels, ConnGuard, Hop};
use crate::policy;
use crate::sock::{self, ListenerKind, Sock};
use crate::sys;
use crate::tunnel::{self, HboneRefusal};

/// Connections one listener accepts before it lets the worker's other tasks
/// run. On epoll an accept with connections in the backlog completes
/// without waiting, so a burst (a flood's reconnects, places freed at once)
/// was taken whole in one go, stalling every other pod's bytes on the
/// worker for its length.
const ACCEPT_BATCH: u32 = 16;

pub(super) async fn accept_loop(
    ctx: Rc<WorkerCtx>,
    pod: Rc<PodLocal>,
    kind: ListenerKind,
    lsock: Sock,
) {
    let _running = AcceptLoop::enter(ctx.clone());
    let closing = || pod.removed.get() || pod.listeners.borrow().is_empty();
    let mut batch = 0;
    loop {
        batch += 1;
        if batch > ACCEPT_BATCH {
            batch = 1;
            tokio::task::yield_now().await;
        }
        match lsock.accept().await {
            Ok((fd, peer)) => {
                ctx.stats.accepted.inc();
                let counted = Counted::new(&ctx.stats);
                let preauth = if kind == ListenerKind::Tunnel {
                    match admit_tunnel(&ctx, &pod, &fd, &peer, closing).await {
                        Some(g) => Some(g),
                        None if closing() => break,
                        None => continue,
                    }
                } else {
                    None
                };
                let span = tracing::debug_span!(
                    "conn",
                    pod.uid = %pod.shared.uid,
                    direction = %kind,
                    src.addr = %peer.as_socket().map(|a| a.to_string()).unwrap_or_default(),
                    dst.addr = tracing::field::Empty,
                    dst.pod = tracing::field::Empty,
                );
                spawn_local(
                    ctx.backend,
                    handle_conn(ctx.clone(), pod.clone(), kind, fd, peer, preauth, counted)
                        .instrument(span),
                );
            }
            Err(_) if pod.removed.get() => break,
            Err(e) if is_resource_exhaustion(&e) => {
                // Out of fds/memory: the connection stays queued in the
                // kernel; refuse to spin, warn (at most once a second), retry.
                ctx.stats.accept_resource_errors.inc();
                let now = Instant::now();
                if ctx
                    .last_fd_warning
                    .get()
                    .is_none_or(|t| now.duration_since(t) > Duration::from_secs(1))
                {
                    ctx.last_fd_warning.set(Some(now));
                    tracing::warn!(pod = %pod.shared.uid, %kind, error = %e, "accept failed for lack of resources; retrying");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ECONNABORTED) | Some(libc::EINTR) | Some(libc::EPROTO)
                ) => {}
            Err(e) => {
                if !pod.removed.get() && pod.listeners.borrow().is_empty() {
                    // Listeners closed for a drain: not an error.
                    break;
                }
                tracing::error!(pod = %pod.shared.uid, %kind, error = %e, "listener failed");
                break;
            }
        }
    }
}

/// Admits a connection accepted on a pod's tunnel port to the pod's
/// pre-authentication places. At the pod's cap the connection is held here,
/// and this listener accepts nothing more, until a place comes free: what
/// comes beyond the cap waits in the kernel's backlog and costs the proxy
/// nothing (a reconnect flood keeps no worker busy), rather than being
/// accepted only to be reset. Over its source's cap it is reset and
/// counted (`None`); `None` too when the pod goes while it waits.
async fn admit_tunnel(
    ctx: &WorkerCtx,
    pod: &PodLocal,
    fd: &OwnedFd,
    peer: &SockAddr,
    closing: impl Fn() -> bool,
) -> Option<tunnel::PreauthGuard> {
    let Some(src) = peer.as_socket() else {
        sys::tcp_abort(fd.as_fd());
        return None;
    };
    let slots = &pod.preauth;
    let per_pod = ctx.tunnel.limits.max_preauth_per_pod;
    let mut paused = false;
    loop {
        match tunnel::admit_preauth(&ctx.tunnel.limits, slots, src.ip()) {
            Ok(g) => return Some(g),
            Err(HboneRefusal::PerPod) => {
                if !paused {
                    paused = true;
                    ctx.tunnel.refused(HboneRefusal::PerPodPaused);
                    tracing::debug!(pod = %pod.shared.uid, "tunnel port at the pre-auth cap; accepts paused");
                }
                slots.room(per_pod, &closing).await;
                if closing() {
                    sys::tcp_abort(fd.as_fd());
                    return None;
                }
            }
            Err(reason) => {
                tracing::debug!(src.addr = %src, %reason, "tunnel connection over the pre-auth cap; resetting");
                sys::tcp_abort(fd.as_fd());
                ctx.tunnel.refused(reason);
                return None;
            }
        }
    }
}

async fn handle_conn(
    ctx: Rc<WorkerCtx>,
    pod: Rc<PodLocal>,
    kind: ListenerKind,
    fd: OwnedFd,
    peer: SockAddr,
    preauth: Option<tunnel::PreauthGuard>,
    counted: Counted,
) {
    let started = Instant::now();
    let Some(peer) = peer.as_socket() else {
        sys::tcp_abort(fd.as_fd());
        return;
    };
    if pod.removed.get() {
        sys::tcp_abort(fd.as_fd());
        return;
    }
    // Registered with its pod at once: removing the pod resets it, whatever
    // stage it is in.
    let client = Arc::new(fd);
    let id = pod.next_id.get();
    pod.next_id.set(id + 1);
    pod.conns
        .borrow_mut()
        .insert(id, [Some(client.clone()), None]);
    let guard = ConnGuard {
        pod: pod.clone(),
        id,
        target: None,
        _active: counted,
    };
    let s = &ctx.settings;
    let nat = match kind {
        ListenerKind::Tunnel => {
            if let (Some(preauth), Some(_)) = (preauth, ctx.in_force.enabled()) {
                // Boxed: TLS + HTTP/2 state must not size every connection.
                Box::pin(tunnel_inbound(&ctx, &pod, &client, peer, preauth)).await;
            } else {
                // HBONE is off (no CA configured), so nothing may come in
                // through 15008: refuse clearly rather than forward blindly.
                tracing::debug!("tunnel port without HBONE; resetting");
                refuse(&ctx, &client);
            }
            return;
        }
        ListenerKind::Outbound => {
            // Only the pod's own addresses may leave through its proxy: a
            // pod that puts a neighbour's address on an interface must not
            // reach anyone (or spoof it on the fast path, or claim it in
            // `forwarded`) with it.
            if !pod.shared.ips.contains(&peer.ip().to_canonical()) {
                refuse_foreign(&ctx, &client, "source_not_pod_address", peer.ip());
                return;
            }
            true
        }
        ListenerKind::Inbound => s.capture_mode == CaptureMode::Redirect,
    };
    let dst = match sock::original_dst(client.as_fd(), nat, peer.is_ipv6()) {
        Ok(d) => d,
        Err(e) => {
            tracing::debug!(error = %e, "no original destination; resetting");
            refuse(&ctx, &client);
            return;
        }
    };
    tracing::Span::current().record("dst.addr", tracing::field::display(dst));
    // A destination on one of our own capture ports means the connection
    // was not captured by the rules (e.g. an app dialling 15001 directly):
    // forwarding it would loop back to us.
    if dst.port() == s.ports.outbound || dst.port() == s.ports.inbound {
        tracing::debug!("destination is a capture port of the proxy; resetting");
        refuse(&ctx, &client);
        return;
    }
    // Where a control plane feeds the mesh, the pod's workload (its
    // identity, labels, policies) may not have arrived yet: wait for it a
    // bounded time, then refuse; never serve under a guess.
    let mesh = match ctx.in_force.mesh_knowing(&pod.shared).await {
        Ok(m) => m,
        Err(e) => {
            refuse_counted(&ctx, &client, "unknown_workload", &e);
            return;
        }
    };
    // A source address read from the pod's netns must also be one the
    // mesh's record of the pod lists (the pod can write its netns).
    if kind == ListenerKind::Outbound
        && mesh
            .as_deref()
            .is_some_and(|m| pod.shared.confirms_address(m, peer.ip()) != Some(true))
    {
        refuse_foreign(&ctx, &client, "source_not_pod_address", peer.ip());
        return;
    }
    match kind {
        ListenerKind::Inbound => {
            // Relay only to the pod's own addresses (HBONE checks
            // `:authority` likewise): anything else routed into the pod
            // (REDIRECT captures every destination; TPROXY every local one,
            // e.g. on the pod's `lo`) is not the pod's service.
            if !pod.shared.ips.contains(&dst.ip().to_canonical()) {
                refuse_foreign(&ctx, &client, "destination_not_pod_address", dst.ip());
                return;
            }
            let mesh = ctx.in_force.mesh();
            let flow = match policy::authorize_plaintext(
                &ctx.metrics,
                mesh.as_ref(),
                &pod.shared,
                peer.ip(),
                dst,
            ) {
                Ok(flow) => flow,
                Err(why) => {
                    deny(&ctx, &client, "plaintext", &why);
                    return;
                }
            };
            let hop = Hop {
                addr: dst,
                netns: pod.shared.clone(),
                spoof: Some(peer.ip()),
                flow: flow.map(|f| (pod.shared.clone(), f)),
            };
            let series = splice_labels(&ctx, mesh.as_ref(), &pod, kind, peer, &hop, None);
            let mut guard = guard;
            match connect_hop(&ctx, &mut guard, &client, &hop).await {
                Ok(upstream) => {
                    splice(&ctx, &client, upstream, &hop, series, started).await;
                }
                Err(e) => connect_failed(&ctx, &client, &failed_labels(&series), &e.to_string()),
            }
        }
        _ => outbound(ctx.clone(), pod, guard, client, peer, dst, started).await,
    }
}

/// Serves a connection accepted on the pod's tunnel port (HBONE inbound).
async fn tunnel_inbound(
    ctx: &Rc<WorkerCtx>,
    pod: &PodLocal,
    client: &OwnedFd,
    peer: SocketAddr,
    preauth: tunnel::PreauthGuard,
) {
    // A duplicate (the pod registry keeps the original to reset it), on no
    // reactor yet: the TLS handshake runs on the handshake thread.
    let tcp = match client.try_clone().and_then(tunnel::adopt_std) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot hand over accepted socket; resetting");
            sys::tcp_abort(client.as_fd());
            return;
        }
    };
    if let Err(e) = tunnel::inbound(
        ctx.tunnel.clone(),
        pod.shared.clone(),
        ctx.settings.proxy_mark,
        tcp,
        peer,
        preauth,
        ctx.stats.clone(),
        ctx.id,
    )
    .await
    {
        tracing::debug!(error = %e, "hbone inbound connection ended");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sock::Backend;
    use crate::stats::Stats;
    use crate::worker::ctx::tests::{null_fd, test_ctx, test_pod};

    /// Every connection's task holds this future while it waits: an idle
    /// connection's memory is mostly this (plus the kernel's). The tunnel
    /// paths are boxed so their TLS/HTTP/2 state does not size it; before
    /// that it was 10 KiB.
    #[test]
    fn per_connection_future_stays_small() {
        let ctx = test_ctx(Arc::new(Stats::default()));
        let pod = test_pod();
        let peer = SockAddr::from(SocketAddr::from(([127, 0, 0, 1], 1)));
        // Built, never polled: nothing runs.
        let counted = Counted::new(&ctx.stats);
        let fut = handle_conn(
            ctx,
            pod,
            ListenerKind::Outbound,
            null_fd(),
            peer,
            None,
            counted,
        );
        let size = std::mem::size_of_val(&fut);
        println!("per-connection future: {size} bytes");
        assert!(
            size <= 4096,
            "the per-connection future grew to {size} bytes"
        );
    }

    /// A burst waiting in a listener's backlog is accepted in bounded
    /// batches: the worker's other tasks (other pods' bytes) run between
    /// them. Epoll's accept completes without waiting while the backlog
    /// holds connections; a listener used to take the whole backlog before
    /// anything else on the worker ran.
    #[test]
    fn adversarial_accept_burst_yields_to_other_tasks() {
        ringway_testbed::run_isolated("adversarial_accept_burst_yields_to_other_tasks", || {
            const N: u64 = 100;
            // The isolated netns's loopback; a backlog above N.
            let l =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
                .unwrap();
            l.listen(1024).unwrap();
            l.set_nonblocking(true).unwrap();
            let addr = l.local_addr().unwrap().as_socket().unwrap();
            let clients: Vec<_> = (0..N)
                .map(|_| std::net::TcpStream::connect(addr).unwrap())
                .collect();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let local = tokio::task::LocalSet::new();
            let most = local.block_on(&rt, async {
                let stats = Arc::new(Stats::default());
                let ctx = test_ctx(stats.clone());
                // No address: not the clients', so each accepted connection
                // is refused at once (no netns, no upstream).
                let pod = test_pod();
                let lsock = Sock::new(OwnedFd::from(l), Backend::Epoll).unwrap();
                pod.listeners.borrow_mut().push(lsock.shared());
                // Another task of the worker: how many accepts happened
                // between two of its turns, at most.
                let probe = tokio::task::spawn_local(async move {
                    let (mut last, mut most) = (0, 0);
                    while last < N {
                        tokio::task::yield_now().await;
                        let now = stats.accepted.get();
                        most = most.max(now - last);
                        last = now;
                    }
                    most
                });
                tokio::task::spawn_local(accept_loop(
                    ctx,
                    pod.clone(),
                    ListenerKind::Outbound,
                    lsock,
                ));
                let most = tokio::time::timeout(Duration::from_secs(20), probe)
                    .await
                    .expect("the burst is accepted")
                    .unwrap();
                pod.removed.set(true);
                pod.close_listeners();
                most
            });
            drop(clients);
            println!("at most {most} accepts between two turns of another task");
            // Both tasks yield; the runtime may take the two deferred wakes
            // in either order, so a turn of the probe may see two batches.
            assert!(
                most <= 2 * u64::from(ACCEPT_BATCH),
                "{most} connections accepted in one go: the worker's other tasks waited for all of them"
            );
        });
    }

    /// A drain waits for the worker's accept loops to end after the close
    /// (not before), and a connection counted from its accept is counted
    /// off exactly once when it is done. With both, the drain's count
    /// (`Stats::active`) includes every connection the kernel handed over
    /// before the close, where it used to miss one whose task had not run
    /// yet and reset it at exit (2 in 55 fast-path upgrade rounds of the
    /// bench, 0 in 60 after: benches/HISTORY.md, "Connections reset through
    /// an upgrade with nothing open at SIGTERM").
    #[test]
    fn a_drain_waits_for_the_accept_loops_and_counts_what_they_accepted() {
        ringway_testbed::run_isolated(
            "a_drain_waits_for_the_accept_loops_and_counts_what_they_accepted",
            || {
                let l = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                    .unwrap();
                l.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
                    .unwrap();
                l.listen(16).unwrap();
                l.set_nonblocking(true).unwrap();
                let addr = l.local_addr().unwrap().as_socket().unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async {
                    let stats = Arc::new(Stats::default());
                    let ctx = test_ctx(stats.clone());
                    // No address: each accepted connection is refused at once.
                    let pod = test_pod();
                    let lsock = Sock::new(OwnedFd::from(l), Backend::Epoll).unwrap();
                    pod.listeners.borrow_mut().push(lsock.shared());
                    tokio::task::spawn_local(accept_loop(
                        ctx.clone(),
                        pod.clone(),
                        ListenerKind::Outbound,
                        lsock,
                    ));
                    tokio::task::yield_now().await;
                    assert_eq!(ctx.accept_loops.get(), 1, "the loop is not counted");
                    let short = Duration::from_millis(200);
                    assert!(
                        tokio::time::timeout(short, ctx.accept_loops_ended())
                            .await
                            .is_err(),
                        "the wait ended with a loop still accepting"
                    );
                    // A connection accepted and refused: counted, then not.
                    let c = std::net::TcpStream::connect(addr).unwrap();
                    for _ in 0..200 {
                        if stats.accepted.get() == 1 && stats.active.get() == 0 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    assert_eq!(stats.accepted.get(), 1);
                    assert_eq!(stats.active.get(), 0, "a refused connection stays active");
                    pod.close_listeners();
                    tokio::time::timeout(Duration::from_secs(5), ctx.accept_loops_ended())
                        .await
                        .expect("the accept loop ended after the close");
                    assert_eq!(ctx.accept_loops.get(), 0);
                    drop(c);
                });
            },
        );
    }
}
