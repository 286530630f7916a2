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
use crate::{keepalive, HboneError};

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
    /// Source workload names (lenient: empty when missing or malformed).
    pub baggage: Baggage,
    /// Trace context (`None` when missing or malformed).
    pub traceparent: Option<TraceParent>,
    /// The peer proxy.
    pub peer: Arc<PeerInfo>,
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

/// Server connection settings; [`Default`] is the reference mesh's.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Concurrent streams the peer may open (HTTP/2 SETTINGS).
    pub max_concurrent_streams: u32,
    /// HTTP/2 PING period.
    pub ping_interval: Duration,
    /// Close the connection when a PING is not answered within this.
    pub ping_timeout: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_concurrent_streams: crate::MAX_CONCURRENT_STREAMS,
            ping_interval: crate::PING_INTERVAL,
            ping_timeout: crate::PING_TIMEOUT,
        }
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
    mut drain: DrainSignal,
    handler: H,
) -> Result<(), HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    let peer = Arc::new(peer);
    let handler = Arc::new(handler);
    let mut conn = h2::server::Builder::new()
        .initial_window_size(crate::STREAM_WINDOW)
        .initial_connection_window_size(crate::CONNECTION_WINDOW)
        .max_frame_size(crate::MAX_FRAME_SIZE)
        .max_concurrent_streams(config.max_concurrent_streams)
        .max_send_buffer_size(crate::MAX_FRAME_SIZE as usize)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(HboneError::Handshake)?;
    conn.set_target_window_size(crate::CONNECTION_WINDOW);
    let ping = conn.ping_pong().expect("ping_pong is taken once");
    let keepalive = keepalive(ping, config.ping_interval, config.ping_timeout);
    tokio::pin!(keepalive);
    let mut draining = false;
    loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((req, respond))) => {
                    let span = tracing::debug_span!(
                        "hbone.stream",
                        peer.id = %peer.identity,
                        peer.addr = %peer.addr,
                        stream = respond.stream_id().as_u32(),
                    );
                    tokio::spawn(
                        handle_stream(req, respond, peer.clone(), handler.clone()).instrument(span),
                    );
                }
                Some(Err(e)) => {
                    debug!(peer.addr = %peer.addr, error = %e, "hbone server connection error");
                    return Err(HboneError::Server(e));
                }
                None => break,
            },
            _ = drain.wait(), if !draining => {
                debug!(peer.addr = %peer.addr, "draining: sending GOAWAY");
                draining = true;
                conn.graceful_shutdown();
            }
            e = &mut keepalive => {
                warn!(peer.addr = %peer.addr, error = %e, "closing hbone server connection");
                return Err(e);
            }
        }
    }
    poll_fn(|cx| conn.poll_closed(cx))
        .await
        .map_err(HboneError::Server)
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
        baggage,
        traceparent,
        peer: peer.clone(),
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
    req: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    peer: Arc<PeerInfo>,
    handler: Arc<H>,
) where
    H: Fn(ConnectRequest) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Decision> + Send + 'static,
{
    let creq = match validate(&req, &peer) {
        Ok(c) => c,
        Err(e) => {
            info!(reason = %e, status = 400, "hbone request rejected");
            respond_status(&mut respond, StatusCode::BAD_REQUEST);
            return;
        }
    };
    let dst = creq.authority;
    let src = creq.forwarded_for;
    let decision = handler(creq).await;
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
    match pump(req.into_body(), send, upstream).await {
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
    Peer(h2::Error),
    Upstream(std::io::Error),
}

const READ_CHUNK: usize = 64 * 1024;

/// The first (and after a short read, the next) read size from the app.
const MIN_READ: usize = 4 * 1024;

/// Pumps bytes between an accepted stream and its upstream.
pub(crate) async fn pump(
    mut h2r: RecvStream,
    mut h2w: SendStream<Bytes>,
    upstream: Upstream,
) -> PumpOutcome {
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let to_upstream = async {
        let mut n = 0u64;
        loop {
            match h2r.data().await {
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
            let mut buf = BytesMut::with_capacity(want);
            let read = tokio::select! {
                r = ur.read_buf(&mut buf) => r.map_err(PumpErr::Upstream)?,
                r = poll_fn(|cx| h2w.poll_reset(cx)) => return Err(match r {
                    Ok(reason) => PumpErr::Peer(h2::Error::from(reason)),
                    Err(e) => PumpErr::Peer(e),
                }),
            };
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
            send_all(&mut h2w, buf.freeze()).await?;
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
