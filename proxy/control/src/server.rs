//! The control server: one HTTP/1.1 endpoint served from its own thread and
//! current-thread tokio runtime, never from a datapath worker.
//!
//! Every server is bounded ([`ControlLimits`]): a connection cap with
//! eviction of the longest-idle connection when full, a header-read (and
//! keep-alive idle) timeout and a write-stall timeout, so neither a flood
//! of idle connections nor a client that never reads can take its fds or
//! keep the probes out. What it answers is the caller's [`Handler`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

/// What an endpoint answers: status, content type, body.
pub type Answer = (StatusCode, &'static str, String);

/// An endpoint handler: method, path, query string, whether OpenMetrics was asked for.
pub type Handler = Arc<dyn Fn(&hyper::Method, &str, &str, bool) -> Answer + Send + Sync>;

/// `Content-Type` of a plain-text answer.
pub const TEXT: &str = "text/plain; charset=utf-8";
/// `Content-Type` of a JSON answer.
pub const JSON: &str = "application/json";

/// What a readiness endpoint reports: whether the process is ready, and
/// why not.
pub trait ReadyState: Send + Sync + 'static {
    /// Whether the process is ready.
    fn is_ready(&self) -> bool;
    /// Why it is not (shown in the 503's body).
    fn reason(&self) -> String;
}

/// The readiness handler: `GET /healthz/ready` answers 200 `ready`, or 503
/// with the reason.
pub fn readiness_handler(ready: Arc<impl ReadyState>) -> Handler {
    Arc::new(move |method, path, _, _| match (method, path) {
        (&hyper::Method::GET, "/healthz/ready") => {
            if ready.is_ready() {
                (StatusCode::OK, TEXT, "ready\n".to_string())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    format!("not ready: {}\n", ready.reason()),
                )
            }
        }
        (_, "/healthz/ready") => (StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into()),
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

/// Limits of a control server: a pod or anything else that reaches the
/// port must not be able to hold its fds or starve the probes.
#[derive(Debug, Clone, Copy)]
pub struct ControlLimits {
    /// Connections served at once. When full, the next accepted connection
    /// evicts the one that has gone longest without a request (idle
    /// keep-alive or partial headers), so a flood of idle connections cannot
    /// keep a probe out; the fds held stay at most `max_connections + 1`.
    pub max_connections: usize,
    /// Time for a request's headers to arrive, counted from when the
    /// connection starts waiting for them: the first request's, and each
    /// next one's on a kept-alive connection (so also the idle timeout).
    pub header_read_timeout: Duration,
    /// Time to write a response (a client that stops reading).
    pub write_timeout: Duration,
}

impl Default for ControlLimits {
    fn default() -> Self {
        ControlLimits {
            max_connections: 256,
            header_read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
        }
    }
}

/// A running control server.
#[derive(Debug)]
pub struct ControlServer {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Serves the readiness endpoint on `addr` ([`readiness_handler`]).
    pub fn start(addr: SocketAddr, ready: Arc<impl ReadyState>) -> std::io::Result<ControlServer> {
        Self::serve(addr, readiness_handler(ready))
    }

    /// Binds `addr` and serves `handler` on a new thread named `ringway-control`.
    pub fn serve(addr: SocketAddr, handler: Handler) -> std::io::Result<ControlServer> {
        Self::serve_listener(bind(addr, false)?, handler)
    }

    /// [`ControlServer::serve`] with other limits.
    pub fn serve_with(
        addr: SocketAddr,
        handler: Handler,
        limits: ControlLimits,
    ) -> std::io::Result<ControlServer> {
        Self::serve_listener_with(bind(addr, false)?, handler, limits)
    }

    /// [`ControlServer::serve`] with SO_REUSEPORT: during an upgrade the new
    /// proxy binds beside the old one (as its pod listeners do) instead of
    /// failing; until the old one exits, either may answer.
    pub fn serve_shared(addr: SocketAddr, handler: Handler) -> std::io::Result<ControlServer> {
        Self::serve_listener(bind(addr, true)?, handler)
    }

    fn serve_listener(
        std_listener: std::net::TcpListener,
        handler: Handler,
    ) -> std::io::Result<ControlServer> {
        Self::serve_listener_with(std_listener, handler, ControlLimits::default())
    }

    /// Serves `handler` on an already bound listener with `limits`.
    pub fn serve_listener_with(
        std_listener: std::net::TcpListener,
        handler: Handler,
        limits: ControlLimits,
    ) -> std::io::Result<ControlServer> {
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ringway-control".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the control runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "cannot register the control listener");
                            return;
                        }
                    };
                    let conns = Arc::new(Connections::new(limits.max_connections));
                    loop {
                        tokio::select! {
                            _ = &mut rx => break,
                            acc = listener.accept() => {
                                let Ok((stream, _)) = acc else {
                                    // Out of fds or similar: don't spin.
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                    continue;
                                };
                                // The semaphore around accept: a slot per
                                // connection; when none is free, the longest
                                // idle connection gives its own up.
                                let permit = match conns.slots.clone().try_acquire_owned() {
                                    Ok(p) => p,
                                    Err(_) => {
                                        conns.evict_oldest_idle();
                                        tokio::select! {
                                            _ = &mut rx => break,
                                            p = conns.slots.clone().acquire_owned() => match p {
                                                Ok(p) => p,
                                                Err(_) => break,
                                            },
                                        }
                                    }
                                };
                                let handler = handler.clone();
                                let conns = conns.clone();
                                tokio::spawn(async move {
                                    serve_one(stream, handler, conns, limits).await;
                                    drop(permit);
                                });
                            }
                        }
                    }
                });
            })?;
        Ok(ControlServer {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

/// Connections the kernel completes before the accept loop takes them: a
/// flood fills a short queue faster than eviction empties it, and a probe's
/// SYN dropped there waits a second for its retransmit.
const BACKLOG: i32 = 1024;

fn bind(addr: SocketAddr, shared: bool) -> std::io::Result<std::net::TcpListener> {
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM.cloexec(),
        None,
    )?;
    sock.set_reuse_address(true)?;
    if shared {
        sock.set_reuse_port(true)?;
    }
    sock.bind(&addr.into())?;
    sock.listen(BACKLOG)?;
    Ok(sock.into())
}

/// The connections of one control server, for eviction.
#[derive(Debug)]
struct Connections {
    slots: Arc<tokio::sync::Semaphore>,
    /// Per connection: when it was accepted or last got a request (a
    /// sequence number, smaller = longer ago) and the signal that evicts it.
    waiting: std::sync::Mutex<HashMap<u64, (u64, Arc<tokio::sync::Notify>)>>,
    seq: AtomicU64,
}

impl Connections {
    fn new(max: usize) -> Connections {
        Connections {
            slots: Arc::new(tokio::sync::Semaphore::new(max.max(1))),
            waiting: std::sync::Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u64, Arc<tokio::sync::Notify>)>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Closes the connection that has gone longest without a request
    /// (answers are synchronous on this one thread: no connection is in the
    /// middle of computing one while the accept loop runs).
    fn evict_oldest_idle(&self) {
        let map = self.lock();
        if let Some((_, n)) = map.values().min_by_key(|(since, _)| *since) {
            n.notify_one();
        }
    }
}

/// Serves one connection until it ends, times out or is evicted.
async fn serve_one(
    stream: tokio::net::TcpStream,
    handler: Handler,
    conns: Arc<Connections>,
    limits: ControlLimits,
) {
    let id = conns.next();
    let evict = Arc::new(tokio::sync::Notify::new());
    conns.lock().insert(id, (conns.next(), evict.clone()));
    let c = conns.clone();
    let svc = hyper::service::service_fn(move |req| {
        // A request: this connection is in use, the last to evict.
        if let Some(e) = c.lock().get_mut(&id) {
            e.0 = c.next();
        }
        handle(req, handler.clone())
    });
    let io = TokioIo::new(TimedWrites::new(stream, limits.write_timeout));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(16 * 1024)
        .serve_connection(io, svc);
    tokio::select! {
        _ = conn => {}
        // Dropping the connection closes it; it had no request in progress.
        _ = evict.notified() => {
            tracing::debug!(connection.id = id, "control connection evicted: the server is full and it was the longest idle");
        }
    }
    conns.lock().remove(&id);
}

/// A stream whose writes fail once one has been pending for `limit` (a
/// client that stops reading cannot hold a connection forever).
struct TimedWrites {
    inner: tokio::net::TcpStream,
    limit: Duration,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl TimedWrites {
    fn new(inner: tokio::net::TcpStream, limit: Duration) -> TimedWrites {
        TimedWrites {
            inner,
            limit,
            stalled: None,
        }
    }

    fn check(
        &mut self,
        cx: &mut std::task::Context<'_>,
        r: std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        match r {
            Poll::Pending => {
                let limit = self.limit;
                let sleep = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("control client read nothing for {limit:?}"),
                    )));
                }
                Poll::Pending
            }
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl tokio::io::AsyncRead for TimedWrites {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for TimedWrites {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.check(cx, r)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    handler: Handler,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let openmetrics = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let (status, ct, body) = handler(
        req.method(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
        openmetrics,
    );
    Ok(Response::builder()
        .status(status)
        .header("content-type", ct)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"internal error\n")))))
}
