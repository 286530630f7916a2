//! The tunnel server: accepts CONNECT streams on one HTTP/2 connection, asks the caller's
//! handler what to do with each, and pumps bytes between the stream and the upstream.

use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Reason, RecvStream, SendStream};
use http::{Method, Request, Response, StatusCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, info, warn, Instrument};

use crate::headers::{self, Baggage, ForwardedError, TraceParent};
use crate::upstream::Upstream;
use crate::{keepalive, HboneError, PeerRevoked};

/// Who is on the other end of the (m)TLS session, as the caller verified it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's SPIFFE identity (`spiffe://td/ns/<ns>/sa/<sa>`).
    pub identity: String,
    /// The peer proxy's TCP address.
    pub addr: SocketAddr,
}

/// One tunnel request, validated, for the handler to decide on.
#[derive(Debug, Clone)]
pub struct ConnectRequest {
    /// Original destination `ip:port` (`:authority`).
    pub authority: SocketAddr,
    /// The client's address from `forwarded: for=` (port 0 when the header had none).
    pub forwarded_for: Option<SocketAddr>,
    /// The service host name from `forwarded: …;host=` (lenient, telemetry;
    /// `None` when absent or malformed).
    pub forwarded_host: Option<String>,
    /// Source workload names (lenient: empty when missing or malformed).
    pub baggage: Baggage,
    /// Trace context (`None` when missing or malformed).
    pub traceparent: Option<TraceParent>,
    /// The peer proxy.
    pub peer: Arc<PeerInfo>,
    /// The peer's first bytes are already in hand (they came with the
    /// CONNECT, as a client that sends its app's early bytes with the
    /// HEADERS does) and go to the upstream as soon as it is connected: a
    /// connect may then hold back its handshake's last ACK to carry them
    /// (the app accepts the connection with its first bytes, one segment
    /// and one wake-up fewer). Never set when nothing is in hand: an app
    /// that speaks first must get its connection at once.
    pub early_data: bool,
}

/// The handler's answer for one tunnel request.
#[derive(Debug)]
pub enum Decision {
    /// 200, then bytes flow between the stream and this upstream.
    Accept(Upstream),
    /// 401: denied by policy. The reason is logged, never sent to the peer.
    Deny401(String),
    /// 503: no upstream, or connecting to it failed. The reason is logged.
    Unavailable503(String),
    /// 400: the request is unacceptable for a reason only the handler knows.
    BadRequest400(String),
}

/// Server connection settings; [`Default`] is the reference mesh's flow
/// control with limits against hostile peers.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Concurrent streams the peer may open (HTTP/2 SETTINGS).
    pub max_concurrent_streams: u32,
    /// HTTP/2 PING period.
    pub ping_interval: Duration,
    /// Close the connection when a PING is not answered within this.
    pub ping_timeout: Duration,
    /// Largest request header list (SETTINGS_MAX_HEADER_LIST_SIZE); also
    /// bounds how many CONTINUATION frames a header block may span.
    pub max_header_list_size: u32,
    /// Streams whose decision (the handler: authorization and upstream
    /// connect) may run at once; the others wait for a slot.
    pub max_connecting_streams: u32,
    /// Streams the peer may reset before they are answered (or within
    /// `SLOT_HOLD` of the answer, before its first byte) in 10 s; one more
    /// and the connection gets a graceful GOAWAY: its other streams finish,
    /// no new one is taken ([`HboneError::RapidReset`]).
    pub max_early_resets: u32,
    /// Bound on the client's HTTP/2 preface ([`HboneError::PrefaceTimeout`]).
    pub preface_timeout: Duration,
    /// A connection without streams this long is closed ([`HboneError::Idle`]).
    pub idle_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_concurrent_streams: crate::MAX_CONCURRENT_STREAMS,
            ping_interval: crate::PING_INTERVAL,
            ping_timeout: crate::PING_TIMEOUT,
            max_header_list_size: 16 * 1024,
            max_connecting_streams: 16,
            max_early_resets: 64,
            preface_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
        }
    }
}

/// What the streams of one connection share with its accept loop.
struct ConnShared {
    /// Slots for streams being set up: from the decision (authorization,
    /// upstream connect) until the peer's first byte or [`SLOT_HOLD`] after
    /// the 200.
    connecting: Arc<tokio::sync::Semaphore>,
    /// Streams the peer reset while they held a slot (before their answer,
    /// or after it before sending anything), in the current window.
    early_resets: std::sync::Mutex<(u32, tokio::time::Instant)>,
    max_early_resets: u32,
    /// Woken when `early_resets` passes the limit.
    abuse: tokio::sync::Notify,
    /// Set with `abuse`: no stream starts a decision any more.
    abusive: std::sync::atomic::AtomicBool,
    /// Streams alive, and when the last one ended (idle timeout).
    active: std::sync::atomic::AtomicUsize,
    last_end: std::sync::Mutex<tokio::time::Instant>,
}

/// How long a stream keeps its set-up slot after its 200 when the peer
/// sends nothing (server-first protocols): a peer that resets streams as
/// soon as they are answered never has more than the cap of upstream
/// connects under way.
const SLOT_HOLD: Duration = Duration::from_millis(200);

/// Window over which early resets are counted against `max_early_resets`.
const EARLY_RESET_WINDOW: Duration = Duration::from_secs(10);

impl ConnShared {
    /// Counts a reset of a stream still being set up; wakes the accept loop
    /// when the window's count passes the limit.
    fn early_reset(&self) {
        let mut g = self.early_resets.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        if now.duration_since(g.1) > EARLY_RESET_WINDOW {
            *g = (0, now);
        }
        g.0 += 1;
        if g.0 > self.max_early_resets {
            self.abusive
                .store(true, std::sync::atomic::Ordering::Relaxed);
            self.abuse.notify_one();
        }
    }
}

/// Counts a live stream; its drop records the end.
struct ActiveStream(Arc<ConnShared>);

impl ActiveStream {
    fn new(c: &Arc<ConnShared>) -> Self {
        c.active.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ActiveStream(c.clone())
    }
}

impl Drop for ActiveStream {
    fn drop(&mut self) {
        *self.0.last_end.lock().unwrap_or_else(|p| p.into_inner()) = tokio::time::Instant::now();
        self.0
            .active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Fires a drain: every connection served with the matching [`DrainSignal`] sends GOAWAY,
/// finishes its open streams and closes.
#[derive(Debug)]
pub struct DrainTrigger(watch::Sender<bool>);

/// Watched by [`serve_connection`]; clone it for every connection.
#[derive(Debug, Clone)]
pub struct DrainSignal(watch::Receiver<bool>);

/// A new trigger and its signal.
pub fn drain_channel() -> (DrainTrigger, DrainSignal) {
    let (tx, rx) = watch::channel(false);
    (DrainTrigger(tx), DrainSignal(rx))
}

impl DrainTrigger {
    /// Starts draining (idempotent).
    pub fn drain(&self) {
        self.0.send_replace(true);
    }
}

impl DrainSignal {
    /// A signal that never fires.
    pub fn never() -> Self {
        // With its trigger gone, `wait` pends forever.
        let (_tx, rx) = watch::channel(false);
        DrainSignal(rx)
    }

    /// Whether draining has started.
    pub fn is_draining(&self) -> bool {
        *self.0.borrow()
    }

    async fn wait(&mut self) {
        loop {
            if *self.0.borrow_and_update() {
                return;
            }
            if self.0.changed().await.is_err() {
                // Trigger gone without draining: never fire.
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Serves one HTTP/2 connection (the caller did TCP accept and TLS) until the peer closes
/// it, a PING goes unanswered, or a drain completes. Each CONNECT stream runs on its own
/// task: `handler` decides, then bytes are pumped with half-close and reset mapped both ways.
pub async fn serve_connection<IO, H, Fut>(
    io: IO,
    peer: PeerInfo,
    config: &ServerConfig,
    drain: DrainSignal,
    handler: H,
) -> Result<(), HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    serve_connection_with(io, peer, config, drain, handler, || (), PeerCheck::none()).await
}

/// What a connection checks of its peer after the handshake: before taking
/// each new stream (`still_valid`), and when to send a graceful GOAWAY
/// ahead of its certificate's expiry (`goaway_at`) so that clients move to
/// a new connection, with their renewed certificate, before any stream
/// would be refused.
pub struct PeerCheck {
    /// Whether the peer may open a new stream now.
    pub still_valid: Box<dyn Fn() -> Result<(), PeerRevoked> + Send>,
    /// When the connection gets a graceful GOAWAY (shortly before the
    /// peer's certificate expires); `None`: never for this reason.
    pub goaway_at: Option<tokio::time::Instant>,
    /// Changes when what `still_valid` checks against may have changed (a
    /// root removed): the connection checks at once, and a peer that fails
    /// gets its graceful GOAWAY before it opens another stream.
    pub recheck: Option<watch::Receiver<u64>>,
}

impl PeerCheck {
    /// No check: every stream is taken, no GOAWAY is planned.
    pub fn none() -> PeerCheck {
        PeerCheck {
            still_valid: Box::new(|| Ok(())),
            goaway_at: None,
            recheck: None,
        }
    }
}

impl std::fmt::Debug for PeerCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCheck")
            .field("goaway_at", &self.goaway_at)
            .finish_non_exhaustive()
    }
}

/// [`serve_connection`], calling `on_preface` once the client's HTTP/2
/// preface has arrived (the caller's pre-authentication accounting ends
/// there), and checking the peer with `check`: at `check.goaway_at` the
/// connection gets a graceful GOAWAY (its streams finish, new ones go to a
/// new connection); before taking each new stream `check.still_valid`
/// runs, and once it fails (the peer's certificate expired, or no longer
/// verifies) the stream is refused unprocessed (`REFUSED_STREAM`: a client
/// may retry it on a new connection, whose handshake checks the peer
/// afresh) and the connection gets a graceful GOAWAY, its other streams
/// finishing ([`HboneError::UntrustedPeer`]).
pub async fn serve_connection_with<IO, H, Fut>(
    io: IO,
    peer: PeerInfo,
    config: &ServerConfig,
    mut drain: DrainSignal,
    handler: H,
    on_preface: impl FnOnce(),
    check: PeerCheck,
) -> Result<(), HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    let peer = Arc::new(peer);
    let handler = Arc::new(handler);
    let handshake = h2::server::Builder::new()
        .initial_window_size(crate::STREAM_WINDOW)
        .initial_connection_window_size(crate::CONNECTION_WINDOW)
        .max_frame_size(crate::MAX_FRAME_SIZE)
        .max_concurrent_streams(config.max_concurrent_streams)
        .max_send_buffer_size(crate::MAX_FRAME_SIZE as usize)
        .max_header_list_size(config.max_header_list_size)
        .max_pending_accept_reset_streams(20)
        .max_local_error_reset_streams(Some(1024))
        .handshake::<_, Bytes>(io);
    let mut conn = match tokio::time::timeout(config.preface_timeout, handshake).await {
        Ok(r) => r.map_err(HboneError::Handshake)?,
        Err(_) => return Err(HboneError::PrefaceTimeout(config.preface_timeout)),
    };
    on_preface();
    conn.set_target_window_size(crate::CONNECTION_WINDOW);
    let ping = conn.ping_pong().expect("ping_pong is taken once");
    let keepalive = keepalive(ping, config.ping_interval, config.ping_timeout);
    tokio::pin!(keepalive);
    let shared = Arc::new(ConnShared {
        connecting: Arc::new(tokio::sync::Semaphore::new(
            config.max_connecting_streams.max(1) as usize,
        )),
        early_resets: std::sync::Mutex::new((0, tokio::time::Instant::now())),
        max_early_resets: config.max_early_resets,
        abuse: tokio::sync::Notify::new(),
        abusive: Default::default(),
        active: Default::default(),
        last_end: std::sync::Mutex::new(tokio::time::Instant::now()),
    });
    let idle = tokio::time::sleep(config.idle_timeout);
    tokio::pin!(idle);
    let goaway_at = check.goaway_at;
    let expiring = async move {
        match goaway_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(expiring);
    let mut recheck = check.recheck;
    let mut draining = false;
    let mut ending: Option<HboneError> = None;
    // Streams refused after the rapid-reset (or untrusted peer's) GOAWAY:
    // a peer that goes on
    // opening them (a client honours GOAWAY; only what it had in flight
    // when the GOAWAY came may still arrive) is cut off past four times
    // the limit.
    let mut refused_after_goaway = 0u32;
    let mut idle_closed = false;
    loop {
        tokio::select! {
            // Abuse first: no stream is accepted once it is known.
            biased;
            _ = shared.abuse.notified(), if ending.is_none() => {
                warn!(
                    peer.id = %peer.identity,
                    peer.addr = %peer.addr,
                    limit = config.max_early_resets,
                    "peer resets streams before their answer: GOAWAY"
                );
                // Graceful: the connection's other streams (a client's
                // long-lived connections beside the ones it aborts) finish;
                // no new stream is taken (refused below, then by h2 past
                // the last one processed), and the peer opens a new
                // connection, with a new handshake, for more.
                if !draining {
                    draining = true;
                    conn.graceful_shutdown();
                }
                ending = Some(HboneError::RapidReset(config.max_early_resets));
            }
            next = conn.accept() => match next {
                Some(Ok((req, mut respond))) => {
                    if ending.is_none() {
                        if let Err(why) = (check.still_valid)() {
                            ending = Some(revoke(&mut conn, &mut draining, &peer, why));
                        }
                    }
                    if matches!(
                        ending,
                        Some(HboneError::RapidReset(_) | HboneError::UntrustedPeer(_))
                    ) {
                        respond.send_reset(Reason::REFUSED_STREAM);
                        refused_after_goaway += 1;
                        if refused_after_goaway == config.max_early_resets.max(1).saturating_mul(4) {
                            warn!(
                                peer.id = %peer.identity,
                                peer.addr = %peer.addr,
                                "peer opens streams past its GOAWAY: closing"
                            );
                            conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                        }
                        continue;
                    }
                    let span = tracing::debug_span!(
                        "hbone.stream",
                        peer.id = %peer.identity,
                        peer.addr = %peer.addr,
                        stream = respond.stream_id().as_u32(),
                    );
                    let active = ActiveStream::new(&shared);
                    crate::spawn::spawn(
                        handle_stream(req, respond, peer.clone(), handler.clone(), active)
                            .instrument(span),
                    );
                }
                Some(Err(e)) => {
                    debug!(peer.addr = %peer.addr, error = %e, "hbone server connection error");
                    return Err(ending.unwrap_or(HboneError::Server(e)));
                }
                None => break,
            },
            changed = async {
                match recheck.as_mut() {
                    Some(r) => r.changed().await.is_ok(),
                    None => std::future::pending().await,
                }
            }, if ending.is_none() => {
                if !changed {
                    // No more changes will come.
                    recheck = None;
                } else if let Err(why) = (check.still_valid)() {
                    ending = Some(revoke(&mut conn, &mut draining, &peer, why));
                }
            }
            () = &mut expiring, if !draining => {
                debug!(peer.addr = %peer.addr, "the peer's certificate expires soon: GOAWAY");
                draining = true;
                conn.graceful_shutdown();
            }
            _ = drain.wait(), if !draining => {
                debug!(peer.addr = %peer.addr, "draining: sending GOAWAY");
                draining = true;
                conn.graceful_shutdown();
            }
            // Also after a rapid-reset GOAWAY: a peer that never answers
            // the GOAWAY's PING must not hold the connection forever.
            _ = &mut idle, if !idle_closed
                && (ending.is_none()
                    || matches!(
                        ending,
                        Some(HboneError::RapidReset(_) | HboneError::UntrustedPeer(_))
                    )) => {
                let last = *shared.last_end.lock().unwrap_or_else(|p| p.into_inner());
                let quiet_until = last + config.idle_timeout;
                if shared.active.load(std::sync::atomic::Ordering::Relaxed) == 0
                    && tokio::time::Instant::now() >= quiet_until
                {
                    debug!(peer.addr = %peer.addr, "idle hbone connection: GOAWAY");
                    // No stream to finish: GOAWAY and close now (a graceful
                    // shutdown would wait for the peer's PING answer).
                    conn.abrupt_shutdown(Reason::NO_ERROR);
                    idle_closed = true;
                    if ending.is_none() {
                        ending = Some(HboneError::Idle(config.idle_timeout));
                    }
                } else {
                    let now = tokio::time::Instant::now();
                    idle.as_mut().reset(quiet_until.max(now + config.idle_timeout / 4));
                }
            }
            e = &mut keepalive => {
                warn!(peer.addr = %peer.addr, error = %e, "closing hbone server connection");
                return Err(e);
            }
        }
    }
    let closed = poll_fn(|cx| conn.poll_closed(cx)).await;
    match ending {
        Some(e) => Err(e),
        None => closed.map_err(HboneError::Server),
    }
}

/// A peer that may open no more streams on `conn` ([`PeerCheck`]): a
/// graceful GOAWAY unless one was sent already; what ends the connection.
fn revoke<IO: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut h2::server::Connection<IO, Bytes>,
    draining: &mut bool,
    peer: &PeerInfo,
    why: PeerRevoked,
) -> HboneError {
    warn!(
        peer.id = %peer.identity,
        peer.addr = %peer.addr,
        reason = %why,
        "peer may open no more streams here: GOAWAY"
    );
    if !*draining {
        *draining = true;
        conn.graceful_shutdown();
    }
    HboneError::UntrustedPeer(why)
}

/// Why a request is answered 400 before the handler sees it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BadRequest {
    #[error("method {0} is not CONNECT")]
    Method(Method),
    #[error("missing :authority")]
    MissingAuthority,
    #[error(":authority {0:?} is not an ip:port")]
    Authority(String),
    #[error("bad forwarded header: {0}")]
    Forwarded(#[from] ForwardedError),
}

fn validate(req: &Request<RecvStream>, peer: &Arc<PeerInfo>) -> Result<ConnectRequest, BadRequest> {
    if req.method() != Method::CONNECT {
        return Err(BadRequest::Method(req.method().clone()));
    }
    let authority = req
        .uri()
        .authority()
        .ok_or(BadRequest::MissingAuthority)?
        .as_str();
    let authority: SocketAddr = authority
        .parse()
        .ok()
        .filter(|a: &SocketAddr| a.port() != 0)
        .ok_or_else(|| BadRequest::Authority(authority.to_string()))?;
    let forwarded_for = headers::parse_forwarded_headers(req.headers())?;
    let forwarded_host = headers::parse_forwarded_host(req.headers());
    let baggage = req
        .headers()
        .get(headers::BAGGAGE)
        .and_then(|v| v.to_str().ok())
        .map(Baggage::parse)
        .unwrap_or_default();
    let traceparent = req
        .headers()
        .get(headers::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(TraceParent::parse);
    Ok(ConnectRequest {
        authority,
        forwarded_for,
        forwarded_host,
        baggage,
        traceparent,
        peer: peer.clone(),
        early_data: false,
    })
}

fn respond_status(respond: &mut SendResponse<Bytes>, status: StatusCode) {
    let resp = Response::builder()
        .status(status)
        .body(())
        .expect("static response");
    if let Err(e) = respond.send_response(resp, true) {
        debug!(error = %e, %status, "could not send response");
    }
}

async fn handle_stream<H, Fut>(
    mut req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: Arc<PeerInfo>,
    handler: Arc<H>,
    active: ActiveStream,
) where
    H: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    let mut creq = match validate(&req, &peer) {
        Ok(c) => c,
        Err(e) => {
            info!(reason = %e, status = 400, "hbone request rejected");
            respond_status(&mut respond, StatusCode::BAD_REQUEST);
            return;
        }
    };
    // What the peer sent with the CONNECT, if it is already here: taken
    // now (one poll; nothing is waited for) so the handler knows it has
    // bytes in hand, and written first once the upstream is connected.
    let first = match poll_fn(|cx| std::task::Poll::Ready(req.body_mut().poll_data(cx))).await {
        std::task::Poll::Ready(next) => Some(next),
        std::task::Poll::Pending => None,
    };
    creq.early_data = matches!(&first, Some(Some(Ok(b))) if !b.is_empty());
    let dst = creq.authority;
    let src = creq.forwarded_for;
    let conn = active.0.clone();
    // The decision (authorization, upstream connect) waits for a slot of
    // the connection and is cancelled, with whatever connect it started,
    // when the peer resets the stream first.
    // Boxed: the decision's state (the caller's handler, its connect) is
    // freed once decided instead of sizing the task every idle stream holds.
    let decided = Box::pin(async {
        let slot = conn.connecting.clone().acquire_owned().await.ok();
        if conn.abusive.load(std::sync::atomic::Ordering::Relaxed) {
            // The connection is being closed for rapid resets.
            return None;
        }
        Some((handler(creq).await, slot))
    });
    let (decision, slot) = tokio::select! {
        // A stream already reset never starts its decision.
        biased;
        r = poll_fn(|cx| respond.poll_reset(cx)) => {
            debug!(dst.addr = %dst, reset = ?r, "hbone stream reset before its answer: cancelled");
            conn.early_reset();
            return;
        }
        d = decided => match d {
            Some(d) => d,
            None => return respond.send_reset(Reason::REFUSED_STREAM),
        },
    };
    let upstream = match decision {
        Decision::Accept(u) => u,
        Decision::Deny401(reason) => {
            info!(dst.addr = %dst, src.addr = ?src, %reason, status = 401, "hbone request denied");
            return respond_status(&mut respond, StatusCode::UNAUTHORIZED);
        }
        Decision::Unavailable503(reason) => {
            info!(dst.addr = %dst, src.addr = ?src, %reason, status = 503, "hbone upstream unavailable");
            return respond_status(&mut respond, StatusCode::SERVICE_UNAVAILABLE);
        }
        Decision::BadRequest400(reason) => {
            info!(dst.addr = %dst, src.addr = ?src, %reason, status = 400, "hbone request rejected");
            return respond_status(&mut respond, StatusCode::BAD_REQUEST);
        }
    };
    let resp = Response::builder()
        .status(StatusCode::OK)
        .body(())
        .expect("static response");
    let send = match respond.send_response(resp, false) {
        Ok(s) => s,
        Err(e) => {
            debug!(error = %e, "stream gone before 200");
            return upstream.reset();
        }
    };
    match pump(req.into_body(), first, send, upstream, slot, &conn).await {
        PumpOutcome::Closed {
            to_upstream,
            to_peer,
        } => {
            debug!(dst.addr = %dst, src.addr = ?src, to_upstream, to_peer, "hbone stream closed")
        }
        PumpOutcome::PeerReset(e) => {
            debug!(dst.addr = %dst, src.addr = ?src, error = %e, "hbone stream reset by peer")
        }
        PumpOutcome::UpstreamFailed(e) => {
            debug!(dst.addr = %dst, src.addr = ?src, error = %e, "hbone upstream failed: stream reset")
        }
    }
}

/// How a pumped stream ended (bytes peer->upstream, upstream->peer).
pub(crate) enum PumpOutcome {
    /// Both directions half-closed cleanly.
    Closed { to_upstream: u64, to_peer: u64 },
    /// The peer reset the stream (or its connection died): upstream reset.
    PeerReset(h2::Error),
    /// The upstream failed: stream reset with CONNECT_ERROR.
    UpstreamFailed(std::io::Error),
}

enum PumpErr {
    /// The peer's side failed (a reset read with its data, or the
    /// connection).
    Peer(h2::Error),
    /// The peer reset the stream (RST_STREAM seen while sending).
    Reset(h2::Error),
    Upstream(std::io::Error),
}

/// Largest read from the app at once, sent as one DATA frame (when the
/// peer's max frame size allows; 1 MiB between ringway proxies): one
/// frame header, one TLS write and one wake-up of the peer per 256 KiB.
const READ_CHUNK: usize = 256 * 1024;

/// The first (and after a short read, the next) read size from the app.
const MIN_READ: usize = 4 * 1024;

/// Reads up to `want` bytes from `r` straight into a new buffer of that
/// capacity, which becomes the `Bytes` HTTP/2 frames: the kernel writes
/// the app's bytes where TLS will encrypt them from, with no copy in
/// between and no zeroing (the capacity is never initialised by us). An
/// empty `Bytes` is EOF. A pending read frees the buffer at once, so a
/// stream waiting on a quiet app holds none.
fn poll_read_chunk(
    r: &mut (impl AsyncRead + Unpin),
    cx: &mut std::task::Context<'_>,
    want: usize,
) -> std::task::Poll<std::io::Result<Bytes>> {
    let mut buf = BytesMut::with_capacity(want.min(READ_CHUNK));
    // One poll of tokio's `read_buf` is one `poll_read` into the spare
    // capacity; dropped right after, so nothing is kept across polls.
    let read = std::pin::pin!(r.read_buf(&mut buf));
    match read.poll(cx) {
        std::task::Poll::Ready(Ok(_)) => std::task::Poll::Ready(Ok(buf.freeze())),
        std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
        std::task::Poll::Pending => std::task::Poll::Pending,
    }
}

/// What one read of a stream's body gives: a chunk, the peer's error, or
/// `None` at END_STREAM.
type BodyNext = Option<Result<Bytes, h2::Error>>;

/// Pumps bytes between an accepted stream and its upstream; `first` is the
/// body's first read when it was taken before (it goes first).
async fn pump(
    mut h2r: RecvStream,
    mut first: Option<BodyNext>,
    mut h2w: SendStream<Bytes>,
    upstream: Upstream,
    mut slot: Option<tokio::sync::OwnedSemaphorePermit>,
    conn: &ConnShared,
) -> PumpOutcome {
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let to_upstream = async {
        let mut n = 0u64;
        // The set-up slot is given back at the peer's first byte, or after
        // SLOT_HOLD; a reset before that counts as an early reset.
        let hold = tokio::time::sleep(SLOT_HOLD);
        tokio::pin!(hold);
        loop {
            let next = match first.take() {
                Some(next) => next,
                None => tokio::select! {
                    d = h2r.data() => d,
                    _ = &mut hold, if slot.is_some() => {
                        slot = None;
                        continue;
                    }
                },
            };
            if let Some(Err(e)) = &next {
                if slot.take().is_some() && e.is_reset() {
                    conn.early_reset();
                }
            }
            slot = None;
            match next {
                Some(Ok(data)) => {
                    uw.write_all(&data).await.map_err(PumpErr::Upstream)?;
                    let _ = h2r.flow_control().release_capacity(data.len());
                    n += data.len() as u64;
                }
                Some(Err(e)) => return Err(PumpErr::Peer(e)),
                None => {
                    // END_STREAM: half-close toward the app.
                    uw.shutdown().await.map_err(PumpErr::Upstream)?;
                    return Ok(n);
                }
            }
        }
    };
    let to_peer = async {
        let mut n = 0u64;
        // Reads start small and double while they fill their buffer, back to
        // small after a short one: a stream waiting on a quiet app holds a
        // small buffer, a busy one reads big.
        let mut want = MIN_READ;
        loop {
            let chunk = tokio::select! {
                r = poll_fn(|cx| poll_read_chunk(&mut ur, cx, want)) => r.map_err(PumpErr::Upstream)?,
                r = poll_fn(|cx| h2w.poll_reset(cx)) => return Err(match r {
                    Ok(reason) => PumpErr::Reset(h2::Error::from(reason)),
                    Err(e) => PumpErr::Peer(e),
                }),
            };
            let read = chunk.len();
            if read == 0 {
                // FIN from the app: END_STREAM toward the peer.
                h2w.send_data(Bytes::new(), true).map_err(PumpErr::Peer)?;
                return Ok(n);
            }
            n += read as u64;
            want = if read == want {
                (want * 2).min(READ_CHUNK)
            } else {
                MIN_READ
            };
            send_all(&mut h2w, chunk).await?;
        }
    };
    let result = tokio::try_join!(to_upstream, to_peer);
    let upstream = ur.unsplit(uw);
    match result {
        Ok((to_upstream, to_peer)) => PumpOutcome::Closed {
            to_upstream,
            to_peer,
        },
        Err(PumpErr::Peer(e)) => {
            if slot.take().is_some() && e.is_reset() {
                conn.early_reset();
            }
            upstream.reset();
            PumpOutcome::PeerReset(e)
        }
        Err(PumpErr::Reset(e)) => {
            if slot.take().is_some() {
                conn.early_reset();
            }
            upstream.reset();
            PumpOutcome::PeerReset(e)
        }
        Err(PumpErr::Upstream(e)) => {
            h2w.send_reset(Reason::CONNECT_ERROR);
            upstream.reset();
            PumpOutcome::UpstreamFailed(e)
        }
    }
}

async fn send_all(h2w: &mut SendStream<Bytes>, mut chunk: Bytes) -> Result<(), PumpErr> {
    while !chunk.is_empty() {
        h2w.reserve_capacity(chunk.len());
        let cap = match poll_fn(|cx| h2w.poll_capacity(cx)).await {
            Some(Ok(cap)) => cap,
            Some(Err(e)) => return Err(PumpErr::Peer(e)),
            None => {
                // The stream stopped sending: reset (or its connection failed).
                let e = match poll_fn(|cx| std::task::Poll::Ready(h2w.poll_reset(cx))).await {
                    std::task::Poll::Ready(Ok(reason)) => h2::Error::from(reason),
                    std::task::Poll::Ready(Err(e)) => e,
                    std::task::Poll::Pending => h2::Error::from(Reason::CANCEL),
                };
                return Err(PumpErr::Peer(e));
            }
        };
        if cap == 0 {
            continue;
        }
        let part = chunk.split_to(cap.min(chunk.len()));
        h2w.send_data(part, false).map_err(PumpErr::Peer)?;
    }
    Ok(())
}
