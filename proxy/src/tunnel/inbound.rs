//! The tunnel listener's server (a pod's 15008): the TLS handshake with
//! the pod's certificate on the handshake thread (never a datapath
//! worker), then HTTP/2 CONNECT streams on the worker, each checked (the
//! pod's own address, never a proxy port, a client address the peer proved
//! it holds), authorized against the pod's policies, connected to the app
//! with the original client's address and counted as the destination
//! side reports it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use ringway_config::authz::Identity;
use ringway_config::Mesh;
use ringway_hbone::{ConnectRequest, Decision, PeerInfo, Upstream};
use tokio::net::TcpStream;

use super::error::TunnelError;
use super::preauth::PreauthGuard;
use super::refusal::HboneRefusal;
use super::socket::connect_in_pod;
use super::state::TunnelState;
use super::tls_failure::{tls_failure_reason, HandshakeTimeout};
use super::tls_io::{LazyBufIo, TLS_WRITE_LIMIT};
use crate::handshake::{self, Handoff};
use crate::metrics::{DenyLabels, Metrics, SeriesKey, ServiceRef, Side, TlsLabels};
use crate::pod::PodShared;
use crate::policy::{self, pod_identity};
use crate::stats::Stats;

/// Serves one accepted connection of a pod's tunnel listener: TLS with the
/// pod's certificate (client certificate required) on the handshake thread,
/// then, back on this worker, HTTP/2 CONNECT streams, each authorized and
/// connected to the app with the original client's address.
///
/// A tunnel dialled by this same proxy (two pods of one node) is driven by
/// the worker that dialled it (`worker` is the caller's): both ends on one
/// thread, so a message through the tunnel wakes one worker, not two. This
/// task then waits for it to end, so the connection stays registered (and
/// reset with its pod) here.
#[allow(clippy::too_many_arguments)]
pub async fn inbound(
    state: Arc<TunnelState>,
    pod: Arc<PodShared>,
    mark: u32,
    tcp: std::net::TcpStream,
    peer_addr: SocketAddr,
    preauth: PreauthGuard,
    stats: Arc<Stats>,
    worker: usize,
) -> Result<(), TunnelError> {
    // Before authentication a connection costs a task, an fd and the TLS
    // state only (no read buffer), for a bounded time, and holds one of the
    // places capped per source and per pod (`preauth`, taken at accept).
    let (ids, mesh) = state.in_force.enabled().ok_or(TunnelError::Disabled)?;
    let local = pod_identity(&mesh, &pod).ok_or(TunnelError::NoLocalIdentity)?;
    // Read before the config: the roots the handshake checks the peer
    // against are at least this generation's.
    let generation = ids.trust_generation();
    let cfg = ids.server_config(&local)?;
    // When the certificate this end presents expires (the one the config
    // was built from, unless renewed this instant: then a later one).
    let own_expires = ids.cached(&local).ok().map(|c| c.not_after());
    let tls = server_handshake(&state, cfg, tcp, stats).await?;
    let trusted = Handshook {
        ids,
        generation,
        own_expires,
    };
    // The dial is registered before its TLS starts, so it is known by now.
    match state.serving_dial(peer_addr) {
        Some(w) if w != worker => {
            let (done_tx, done_rx) = tokio::sync::oneshot::channel();
            let job =
                serve_authenticated(state.clone(), pod, mark, tls, peer_addr, preauth, trusted);
            let job: super::state::ServeJob =
                Box::pin(tracing::Instrument::in_current_span(async move {
                    let _ = done_tx.send(job.await);
                }));
            match state.hand_to(w, job) {
                Ok(()) => {
                    tracing::debug!(worker = w, "hbone server end driven by the dialling worker");
                    // That worker gone (the proxy stopping): ended.
                    done_rx.await.unwrap_or(Ok(()))
                }
                // No such worker: driven here (the job attaches to this
                // thread's reactor when first polled).
                Err(job) => {
                    job.await;
                    done_rx.await.unwrap_or(Ok(()))
                }
            }
        }
        _ => serve_authenticated(state, pod, mark, tls, peer_addr, preauth, trusted).await,
    }
}

/// The peer's certificate chain, when its certificate expires, and the
/// generation of the roots it was last found to chain to. A stream opened
/// after a root was removed checks the chain again (once per removal), and
/// so does one opened once the certificate's time is up (which the
/// verifier then refuses as expired): a connection authenticated under a
/// root no longer trusted, or with a certificate since expired, carries no
/// new stream (the server refuses it unprocessed and sends GOAWAY: the
/// client retries on a new connection, whose handshake checks its current
/// certificate). Shortly before the expiry the connection gets a graceful
/// GOAWAY anyway, so a client moves to a new connection before any stream
/// would be refused.
struct PeerProof {
    ids: Arc<ringway_identity::IdentityManager>,
    chain: Vec<tokio_rustls::rustls::pki_types::CertificateDer<'static>>,
    /// The leaf's `notAfter` (`None`: unreadable here, checked by the
    /// verifier at every stream).
    expires: Option<std::time::SystemTime>,
    /// When the certificate this end presented expires: the connection
    /// gets its GOAWAY before that too, so the client's next stream goes to
    /// a connection whose server it checks afresh.
    own_expires: Option<std::time::SystemTime>,
    checked: std::sync::atomic::AtomicU64,
}

impl PeerProof {
    fn still_valid(&self) -> Result<(), ringway_hbone::PeerRevoked> {
        use std::sync::atomic::Ordering;
        use tokio_rustls::rustls::server::danger::ClientCertVerifier;
        use tokio_rustls::rustls::{CertificateError, Error};
        let generation = self.ids.trust_generation();
        let timely = self
            .expires
            .is_some_and(|e| std::time::SystemTime::now() < e);
        if timely && self.checked.load(Ordering::Acquire) == generation {
            return Ok(());
        }
        let Some((leaf, rest)) = self.chain.split_first() else {
            return Err(ringway_hbone::PeerRevoked::Untrusted(
                "the peer presented no certificate".into(),
            ));
        };
        match self.ids.client_verifier().verify_client_cert(
            leaf,
            rest,
            tokio_rustls::rustls::pki_types::UnixTime::now(),
        ) {
            Ok(_) => {
                if timely {
                    self.checked.store(generation, Ordering::Release);
                }
                Ok(())
            }
            Err(Error::InvalidCertificate(
                CertificateError::Expired | CertificateError::ExpiredContext { .. },
            )) => Err(ringway_hbone::PeerRevoked::Expired),
            Err(e) => Err(ringway_hbone::PeerRevoked::Untrusted(e.to_string())),
        }
    }

    /// When the connection gets its graceful GOAWAY ahead of the first
    /// expiry, the peer's certificate's or this end's.
    fn goaway_at(&self) -> Option<tokio::time::Instant> {
        let first = [self.expires, self.own_expires]
            .into_iter()
            .flatten()
            .min()?;
        Some(ringway_hbone::move_on_at(first))
    }
}

/// What the handshake was checked under: the roots' generation read before
/// it, and when the certificate this end presented expires.
struct Handshook {
    ids: Arc<ringway_identity::IdentityManager>,
    generation: u64,
    own_expires: Option<std::time::SystemTime>,
}

/// The authenticated tunnel's HTTP/2 CONNECT streams, driven by the thread
/// that polls this (its socket is attached to that thread's reactor first).
async fn serve_authenticated(
    state: Arc<TunnelState>,
    pod: Arc<PodShared>,
    mark: u32,
    mut tls: ServerTls,
    peer_addr: SocketAddr,
    preauth: PreauthGuard,
    trusted: Handshook,
) -> Result<(), TunnelError> {
    let Handshook {
        ids,
        generation,
        own_expires,
    } = trusted;
    // On the driving worker: its reactor drives the socket from now on.
    tls.get_mut().0.tcp.attach()?;
    // Authenticated: from now on TLS reads go through the buffer.
    tls.get_mut().0.buffer();
    tls.get_mut().1.set_buffer_limit(Some(TLS_WRITE_LIMIT));
    let peer_id = ringway_identity::peer_identity(tls.get_ref().1)?;
    tracing::debug!(peer.id = %peer_id, "hbone peer authenticated");
    let chain: Vec<_> = tls
        .get_ref()
        .1
        .peer_certificates()
        .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
        .unwrap_or_default();
    let proof = PeerProof {
        ids,
        expires: chain.first().and_then(ringway_identity::cert_expiry),
        own_expires,
        chain,
        checked: std::sync::atomic::AtomicU64::new(generation),
    };
    let info = PeerInfo {
        identity: peer_id.to_string(),
        addr: peer_addr,
    };
    let handler = {
        let state = state.clone();
        let pod = pod.clone();
        move |req: ConnectRequest| {
            let state = state.clone();
            let pod = pod.clone();
            let peer_id = peer_id.clone();
            async move { decide(&state, &pod, mark, &peer_id, req).await }
        }
    };
    let l = &state.limits;
    let config = ringway_hbone::ServerConfig {
        max_header_list_size: l.max_header_list_size,
        max_connecting_streams: l.max_connecting_streams,
        max_early_resets: l.max_early_resets,
        preface_timeout: handshake::jittered(l.preface_timeout),
        idle_timeout: l.idle_timeout,
        ..ringway_hbone::ServerConfig::default()
    };
    let served = ringway_hbone::serve_connection_with(
        tls,
        info,
        &config,
        state.signal.clone(),
        handler,
        move || drop(preauth),
        ringway_hbone::PeerCheck {
            goaway_at: proof.goaway_at(),
            recheck: Some(proof.ids.watch_trust()),
            still_valid: Box::new(move || proof.still_valid()),
        },
    )
    .await;
    match &served {
        Err(ringway_hbone::HboneError::RapidReset(_)) => state.refused(HboneRefusal::RapidReset),
        Err(ringway_hbone::HboneError::UntrustedPeer(ringway_hbone::PeerRevoked::Expired)) => {
            state.refused(HboneRefusal::PeerExpired)
        }
        Err(ringway_hbone::HboneError::UntrustedPeer(_)) => {
            state.refused(HboneRefusal::UntrustedPeer)
        }
        Err(ringway_hbone::HboneError::PrefaceTimeout(_)) => {
            state.refused(HboneRefusal::PrefaceTimeout)
        }
        Err(ringway_hbone::HboneError::Idle(_)) => state.refused(HboneRefusal::Idle),
        _ => {}
    }
    served?;
    Ok(())
}

/// An authenticated server TLS stream over a socket that moves between
/// the handshake thread and its worker.
type ServerTls = tokio_rustls::server::TlsStream<LazyBufIo<Handoff>>;

/// Runs the server TLS handshake of `tcp` on the handshake thread (key
/// exchange, signature and the client certificate's verification are the
/// CPU a flood of ClientHellos buys: never on a datapath worker) and
/// returns the authenticated stream, detached from that thread's reactor.
/// Fail-closed: no handshake thread, no connection. When the worker's task
/// goes (the proxy stops), the handshake is dropped with it; a pod's
/// removal resets the socket, which ends the handshake at once.
async fn server_handshake(
    state: &Arc<TunnelState>,
    cfg: Arc<tokio_rustls::rustls::ServerConfig>,
    tcp: std::net::TcpStream,
    stats: Arc<Stats>,
) -> Result<ServerTls, TunnelError> {
    const GONE: TunnelError = TunnelError::Refused("the handshake thread has stopped");
    let handshaker = state.handshaker.get().ok_or(GONE)?;
    let (mut tx, rx) = tokio::sync::oneshot::channel();
    let job_state = state.clone();
    let job = async move {
        let r = tokio::select! {
            r = handshake_here(&job_state, cfg, tcp, &stats) => r,
            // Nobody waits for it any more.
            () = tx.closed() => return,
        };
        let _ = tx.send(r);
    };
    if !handshaker.run(tracing::Instrument::in_current_span(job)) {
        return Err(GONE);
    }
    Ok(rx.await.map_err(|_| GONE)??)
}

/// The server TLS handshake on the calling thread (the handshake thread):
/// each connection's deadline jittered in [timeout / 2, timeout] (a burst
/// admitted together does not expire, and get replaced, together), its
/// outcome counted.
async fn handshake_here(
    state: &TunnelState,
    cfg: Arc<tokio_rustls::rustls::ServerConfig>,
    tcp: std::net::TcpStream,
    stats: &Stats,
) -> io::Result<ServerTls> {
    let tcp = Handoff::new(TcpStream::from_std(tcp)?);
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let timeout = handshake::jittered(state.limits.handshake_timeout);
    let accepted = match tokio::time::timeout(timeout, acceptor.accept(LazyBufIo::new(tcp))).await {
        Ok(r) => r,
        Err(_) => {
            state.refused(HboneRefusal::HandshakeTimeout);
            Err(HandshakeTimeout::io(timeout))
        }
    };
    if !handshake::on_handshake_thread() {
        stats.server_handshakes_off_thread.inc();
    }
    let outcome = match &accepted {
        Ok(_) => "ok",
        Err(e) => tls_failure_reason(e),
    };
    state
        .metrics
        .tls_handshakes
        .get_or_create(&TlsLabels {
            side: "server",
            outcome,
        })
        .inc();
    let mut tls = accepted?;
    // Off this thread's reactor: the worker registers it with its own.
    tls.get_mut().0.tcp.detach()?;
    Ok(tls)
}

async fn decide(
    state: &TunnelState,
    pod: &Arc<PodShared>,
    mark: u32,
    peer_id: &Identity,
    req: ConnectRequest,
) -> Decision {
    let dst = req.authority;
    if !pod.ips.contains(&dst.ip().to_canonical()) {
        return Decision::BadRequest400(format!("{dst} is not an address of this pod"));
    }
    let mut mesh = match state.in_force.mesh_knowing(pod).await {
        Ok(Some(mesh)) => mesh,
        Ok(None) => return Decision::Unavailable503("no mesh configuration".into()),
        Err(e) => {
            state.refused(HboneRefusal::UnknownWorkload);
            return Decision::Unavailable503(e.to_string());
        }
    };
    if let Some(u) = pod.workload(&mesh).and_then(|w| w.unsupported.as_ref()) {
        state.refused(HboneRefusal::Unsupported);
        return deny_401(state, format!("this pod's workload: {u}"));
    }
    if state.proxy_ports.contains(&dst.port()) {
        state.refused(HboneRefusal::ProxyPort);
        return deny_401(
            state,
            format!("{dst} is a port of the proxy, not of the app"),
        );
    }
    // The client address the app will see and policies judge: the peer's
    // claim (`forwarded`), else its own TCP address. Accepted only when it
    // is an address of a workload whose identity is the one the peer
    // proved; never a loopback, unspecified, multicast or link-local one.
    let client_addr = req.forwarded_for.unwrap_or(req.peer.addr);
    let client = client_addr.ip().to_canonical();
    let mut claim = check_client_claim(&mesh, peer_id, client);
    // The peer's own address (the tunnel's TCP source): a peer may not
    // have any other address waited for on another identity's behalf.
    let own = client == req.peer.addr.ip().to_canonical();
    let wait = match &claim {
        Err(ClaimError::NoWorkload { .. }) => true,
        Err(ClaimError::OtherIdentity { .. }) => own,
        _ => false,
    };
    if wait {
        // A control plane reaches nodes at different times: the client's
        // node may have its new workload before this one does, and an
        // address the cluster gave a new pod (the peer's own) may still
        // name the pod it had before here. Waited for as the pod's own is
        // (a mesh from a file, complete, is judged at once), then judged
        // on the mesh that has it.
        if let Ok(Some(newer)) = state
            .in_force
            .mesh_where(|m| check_client_claim(m, peer_id, client).is_ok())
            .await
        {
            mesh = newer;
            claim = check_client_claim(&mesh, peer_id, client);
        }
    }
    if let Err(why) = claim {
        state.refused(why.reason());
        return deny_401(state, format!("client address {client}: {why}"));
    }
    let authz = match policy::authorize(
        &state.metrics,
        &mesh,
        pod,
        client,
        Some(peer_id.clone()),
        dst,
        "hbone",
    ) {
        Ok(a) => a,
        Err(why) => return deny_401(state, why.to_string()),
    };
    match connect_in_pod(
        pod,
        mark,
        dst,
        Some(client),
        state.connect_timeout,
        req.early_data,
    )
    .await
    {
        Ok(s) => {
            // Re-checked when the policies change (reset if then denied).
            // The stream owns the socket: the flow table gets a duplicate.
            // A flow the re-checks could not reset is never served (a
            // DENY published later would not end it): reset and 503.
            let flow = match s.as_fd().try_clone_to_owned() {
                Ok(dup) => Some(policy::register(
                    pod,
                    vec![Arc::new(dup)],
                    authz,
                    &state.in_force,
                    &state.metrics,
                )),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot duplicate a socket for policy re-checks; resetting it");
                    crate::sys::tcp_abort(s.as_fd());
                    return Decision::Unavailable503(format!(
                        "cannot track the connection to {dst} for policy re-checks: {e}"
                    ));
                }
            };
            // Counted once the stream is really served (not for a 503).
            state
                .metrics
                .hbone_streams
                .get_or_create(&TlsLabels {
                    side: "server",
                    outcome: "ok",
                })
                .inc();
            let service = pod.inbound_service(&mesh, req.forwarded_host.as_deref(), dst.port());
            let observer = InboundObserver::new(
                &state.metrics,
                &mesh,
                pod,
                peer_id,
                client_addr,
                dst,
                service.map(|s| ServiceRef(s.clone())),
            );
            Decision::Accept(Upstream::tcp(s).with_guard(flow).observed(observer))
        }
        Err(e) => Decision::Unavailable503(format!("connecting to {dst}: {e}")),
    }
}

/// Answers 401 and counts the denial.
fn deny_401(state: &TunnelState, why: String) -> Decision {
    state
        .metrics
        .denials
        .get_or_create(&DenyLabels { path: "hbone" })
        .inc();
    Decision::Deny401(why)
}

/// Why a peer's client address claim is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClaimError {
    /// Loopback, unspecified, multicast, broadcast or link-local.
    #[error("{0} is never a client of a tunnel")]
    Reserved(&'static str),
    /// No workload holds the address.
    #[error("no mesh workload holds this address; the peer is {peer}")]
    NoWorkload {
        /// The identity the peer proved.
        peer: String,
    },
    /// The workload holding the address has another identity.
    #[error("it belongs to {owner}, not to the peer {peer}")]
    OtherIdentity {
        /// The identity of the address's workload.
        owner: String,
        /// The identity the peer proved.
        peer: String,
    },
}

impl ClaimError {
    /// The `ringway_hbone_refused_total` reason.
    pub fn reason(&self) -> HboneRefusal {
        match self {
            ClaimError::Reserved(_) => HboneRefusal::ForwardedReserved,
            _ => HboneRefusal::ForwardedNotPeer,
        }
    }
}

/// Whether `ip`, claimed as the client of a tunnel by a peer that proved
/// `peer_id`, may be used: not a special address, and an address of a
/// workload with exactly that identity.
pub fn check_client_claim(mesh: &Mesh, peer_id: &Identity, ip: IpAddr) -> Result<(), ClaimError> {
    let ip = ip.to_canonical();
    let special = match ip {
        IpAddr::V4(v4) if v4.is_loopback() => Some("loopback"),
        IpAddr::V4(v4) if v4.is_unspecified() => Some("unspecified"),
        IpAddr::V4(v4) if v4.is_multicast() => Some("multicast"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V6(v6) if v6.is_loopback() => Some("loopback"),
        IpAddr::V6(v6) if v6.is_unspecified() => Some("unspecified"),
        IpAddr::V6(v6) if v6.is_multicast() => Some("multicast"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("link-local"),
        _ => None,
    };
    if let Some(what) = special {
        return Err(ClaimError::Reserved(what));
    }
    let Some(w) = mesh.workload_by_ip(ip) else {
        return Err(ClaimError::NoWorkload {
            peer: peer_id.to_string(),
        });
    };
    let owner = w.identity(mesh.trust_domain());
    if &owner != peer_id {
        return Err(ClaimError::OtherIdentity {
            owner: owner.to_string(),
            peer: peer_id.to_string(),
        });
    }
    Ok(())
}

/// The destination side's view of a tunnelled connection: its istio_tcp_*
/// series (`reporter="destination"`), advanced as bytes reach and leave the
/// app, and its access-log event when the stream ends.
struct InboundObserver {
    received: prometheus_client::metrics::counter::Counter,
    sent: prometheus_client::metrics::counter::Counter,
    closed: prometheus_client::metrics::counter::Counter,
    to_app: std::sync::atomic::AtomicU64,
    from_app: std::sync::atomic::AtomicU64,
    started: Instant,
    src_addr: SocketAddr,
    src_identity: String,
    dst_addr: SocketAddr,
    dst_workload: String,
}

impl InboundObserver {
    /// `service`: the service the stream went to.
    fn new(
        metrics: &Metrics,
        mesh: &Arc<Mesh>,
        pod: &PodShared,
        peer_id: &Identity,
        src_addr: SocketAddr,
        dst_addr: SocketAddr,
        service: Option<ServiceRef>,
    ) -> Self {
        let dst = pod.labels(Some(mesh));
        let series = metrics.series(
            Some(mesh),
            SeriesKey {
                reporter: "destination",
                security: "mutual_tls",
                // The client address was checked to be a workload's whose
                // identity is the one the peer proved (`check_client_claim`):
                // the workload at that address, with that identity.
                src: Side::Addr(src_addr.ip()),
                dst: Side::Pod(dst.clone()),
                service,
            },
        );
        series.opened.inc();
        InboundObserver {
            received: series.received.clone(),
            sent: series.sent.clone(),
            closed: series.closed.clone(),
            to_app: Default::default(),
            from_app: Default::default(),
            started: Instant::now(),
            src_addr,
            src_identity: peer_id.to_string(),
            dst_addr,
            dst_workload: dst.workload.clone(),
        }
    }
}

impl ringway_hbone::Observer for InboundObserver {
    fn read(&self, n: usize) {
        self.sent.inc_by(n as u64);
        self.from_app
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn written(&self, n: usize) {
        self.received.inc_by(n as u64);
        self.to_app
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for InboundObserver {
    fn drop(&mut self) {
        self.closed.inc();
        tracing::event!(
            target: "access",
            tracing::Level::INFO,
            direction = "inbound",
            src.addr = %self.src_addr,
            src.identity = %self.src_identity,
            dst.addr = %self.dst_addr,
            dst.workload = %self.dst_workload,
            bytes.received = self.to_app.load(std::sync::atomic::Ordering::Relaxed),
            bytes.sent = self.from_app.load(std::sync::atomic::Ordering::Relaxed),
            duration.ms = self.started.elapsed().as_millis() as u64,
            security = "mutual_tls",
            "connection closed"
        );
    }
}
