//! The transport: TLS (the CA service's own serving certificate; callers
//! authenticate with their token, not a client certificate), HTTP/2, one
//! unary gRPC method.
//!
//! Port 15012 is open to every pod, so what a connection may cost before
//! its caller is authenticated is bounded as on the tunnel port (15008):
//! - at accept, a per-source cap ([`ServerLimits::max_connections_per_source`])
//!   and then a global one ([`ServerLimits::max_connections`]); a connection
//!   over either is reset at once, before TLS, and counted. The global cap is
//!   taken after accept and after the source's, so one source can hold at
//!   most its own share of it;
//! - bounds on the TLS handshake, on the HTTP/2 preface after it, and on a
//!   connection without a stream (idle); a call has its own bound;
//! - a request's token is read from its headers and checked before any of
//!   its body: an unauthenticated stream's flow-control window is what a
//!   CSR needs ([`ServerLimits::preauth_body_bytes`]), and the body is read
//!   (up to the request limit) only once the caller is authenticated.
//!
//! Each refusal is counted: connections in
//! `ringway_ca_connections_refused_total{reason}`, calls in
//! `ringway_ca_requests_total{code,reason}`.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use prost::Message;
use tokio::net::{TcpListener, TcpStream};

use crate::grpc::{encode_frame, encode_message, Code, Status};
use crate::proto::{IstioCertificateResponse, CREATE_CERTIFICATE_PATH};
use crate::service::CaService;

/// Transport limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections open at once, from every source; more are reset at
    /// accept.
    pub max_connections: usize,
    /// Connections open at once from one source address; more are reset at
    /// accept (before the global cap is looked at).
    pub max_connections_per_source: usize,
    /// Time for the TLS handshake.
    pub handshake_timeout: Duration,
    /// Time for the HTTP/2 preface and SETTINGS after TLS.
    pub preface_timeout: Duration,
    /// A connection without a stream for this long is closed (GOAWAY).
    pub idle_timeout: Duration,
    /// Time for one call, from its headers to its last byte.
    pub request_timeout: Duration,
    /// Streams at once on one connection.
    pub max_concurrent_streams: u32,
    /// Largest header block.
    pub max_header_list_size: u32,
    /// A stream's HTTP/2 flow-control window (SETTINGS_INITIAL_WINDOW_SIZE):
    /// what a caller not yet authenticated may have buffered, per stream.
    /// The body is read, and the window opened as it is, once the caller
    /// is authenticated.
    pub preauth_body_bytes: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 4096,
            max_connections_per_source: 128,
            handshake_timeout: Duration::from_secs(5),
            preface_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(15),
            max_concurrent_streams: 32,
            max_header_list_size: 16 * 1024,
            // A CSR (16 KiB at most) and the rest of its request.
            preauth_body_bytes: 20 * 1024,
        }
    }
}

/// A transport limit out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{limit}: {problem}")]
pub struct ServerLimitsError {
    /// The limit (its field name).
    pub limit: &'static str,
    /// What is wrong.
    pub problem: String,
}

impl ServerLimits {
    /// Checks the values; the error names the limit.
    pub fn validate(&self) -> Result<(), ServerLimitsError> {
        let err = |limit, problem: String| Err(ServerLimitsError { limit, problem });
        if self.max_connections == 0 {
            return err("max_connections", "0 would refuse every connection".into());
        }
        if self.max_connections_per_source == 0 {
            return err(
                "max_connections_per_source",
                "0 would refuse every connection".into(),
            );
        }
        if self.max_connections_per_source > self.max_connections {
            return err(
                "max_connections_per_source",
                format!(
                    "{} is more than max_connections ({})",
                    self.max_connections_per_source, self.max_connections
                ),
            );
        }
        for (limit, d) in [
            ("handshake_timeout", self.handshake_timeout),
            ("preface_timeout", self.preface_timeout),
            ("idle_timeout", self.idle_timeout),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                return err(limit, "must be more than 0".into());
            }
        }
        if self.max_concurrent_streams == 0 {
            return err("max_concurrent_streams", "0 would refuse every call".into());
        }
        if !(4096..=(1 << 20)).contains(&self.max_header_list_size) {
            return err(
                "max_header_list_size",
                format!("{} is outside 4096..=1048576", self.max_header_list_size),
            );
        }
        if !(1024..=(1 << 20)).contains(&self.preauth_body_bytes) {
            return err(
                "preauth_body_bytes",
                format!("{} is outside 1024..=1048576", self.preauth_body_bytes),
            );
        }
        Ok(())
    }
}

/// Connections open, in total and per source.
#[derive(Debug)]
struct ConnSlots {
    per_source: usize,
    total: usize,
    counts: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// The cap a connection was over ([`ConnSlots::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum OverCap {
    /// Its source holds its share (`max_connections_per_source`) already.
    #[error("over the per-source connection cap")]
    PerSource,
    /// `max_connections` are open.
    #[error("over the global connection cap")]
    Global,
}

impl OverCap {
    /// The `reason` it is counted under in
    /// `ringway_ca_connections_refused_total`.
    fn reason(self) -> &'static str {
        match self {
            OverCap::PerSource => "per_source",
            OverCap::Global => "global",
        }
    }
}

/// One admitted connection; dropping it gives its places back.
struct ConnGuard {
    slots: Arc<ConnSlots>,
    service: Arc<CaService>,
    src: IpAddr,
}

impl ConnSlots {
    /// Admits one more connection of `src`: its source's cap first (so one
    /// source never holds more of the global cap than its own share), then
    /// the global one; `Err` names the cap.
    fn admit(
        self: &Arc<Self>,
        src: IpAddr,
        service: &Arc<CaService>,
    ) -> Result<ConnGuard, OverCap> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (total, by_source) = &mut *c;
        let n = by_source.get(&src).copied().unwrap_or(0);
        if n >= self.per_source {
            return Err(OverCap::PerSource);
        }
        if *total >= self.total {
            return Err(OverCap::Global);
        }
        by_source.insert(src, n + 1);
        *total += 1;
        service.connections_gauge().inc();
        Ok(ConnGuard {
            slots: self.clone(),
            service: service.clone(),
            src,
        })
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut c = self.slots.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (total, by_source) = &mut *c;
        *total = total.saturating_sub(1);
        if let Some(n) = by_source.get_mut(&self.src) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                by_source.remove(&self.src);
            }
        }
        self.service.connections_gauge().dec();
    }
}

/// Serves `service` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    service: Arc<CaService>,
    limits: ServerLimits,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(ConnSlots {
        per_source: limits.max_connections_per_source,
        total: limits.max_connections,
        counts: Mutex::new((0, HashMap::new())),
    });
    let limits = Arc::new(limits);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let src = peer.ip().to_canonical();
        let guard = match slots.admit(src, &service) {
            Ok(g) => g,
            Err(over) => {
                let reason = over.reason();
                // Reset, not closed: nothing lingers on either side.
                let _ = stream.set_zero_linger();
                drop(stream);
                service.connection_refused(reason);
                tracing::debug!(ca.peer = %peer, ca.reason = reason, "connection over a cap; reset");
                continue;
            }
        };
        let (acceptor, service, limits) = (acceptor.clone(), service.clone(), limits.clone());
        tokio::spawn(async move {
            let _guard = guard;
            if let Err(e) = connection(stream, peer, acceptor, service, limits).await {
                tracing::debug!(ca.peer = %peer, error = %e, "connection ended");
            }
        });
    }
}

/// Streams open on a connection, and when the last one ended.
struct Activity {
    open: AtomicUsize,
    last_end: Mutex<Instant>,
}

/// One stream of a connection, open while it lives.
struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        *self.0.last_end.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why a connection ended other than by its peer closing it or going idle.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    /// No TLS handshake within the limit.
    #[error("TLS handshake timed out")]
    HandshakeTimeout,
    /// The TLS handshake failed.
    #[error("TLS: {0}")]
    Handshake(#[source] std::io::Error),
    /// No HTTP/2 preface within the limit.
    #[error("HTTP/2 preface timed out")]
    PrefaceTimeout,
    /// The HTTP/2 preface or SETTINGS were wrong.
    #[error("HTTP/2 preface: {0}")]
    Preface(#[source] h2::Error),
    /// The HTTP/2 connection failed after its preface.
    #[error("HTTP/2: {0}")]
    Http2(#[source] h2::Error),
}

impl ConnectionError {
    /// The `reason` it is counted under in
    /// `ringway_ca_connections_refused_total`, if it is a refusal.
    fn refusal(&self) -> Option<&'static str> {
        match self {
            ConnectionError::HandshakeTimeout => Some("handshake_timeout"),
            ConnectionError::Handshake(_) => Some("handshake_failed"),
            ConnectionError::PrefaceTimeout => Some("preface_timeout"),
            ConnectionError::Preface(_) => Some("preface_failed"),
            ConnectionError::Http2(_) => None,
        }
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    service: Arc<CaService>,
    limits: Arc<ServerLimits>,
) -> Result<(), ConnectionError> {
    let _ = stream.set_nodelay(true);
    let refused = |e: ConnectionError| {
        if let Some(reason) = e.refusal() {
            service.connection_refused(reason);
        }
        e
    };
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
        Err(_) => return Err(refused(ConnectionError::HandshakeTimeout)),
        Ok(Err(e)) => return Err(refused(ConnectionError::Handshake(e))),
        Ok(Ok(tls)) => tls,
    };
    let preface = h2::server::Builder::new()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(limits.max_header_list_size)
        .initial_window_size(limits.preauth_body_bytes)
        .handshake::<_, Bytes>(tls);
    let mut h2 = match tokio::time::timeout(limits.preface_timeout, preface).await {
        Err(_) => return Err(refused(ConnectionError::PrefaceTimeout)),
        Ok(Err(e)) => return Err(refused(ConnectionError::Preface(e))),
        Ok(Ok(h2)) => h2,
    };
    let src = peer.ip().to_canonical();
    let idle = limits.idle_timeout;
    let activity = Arc::new(Activity {
        open: AtomicUsize::new(0),
        last_end: Mutex::new(Instant::now()),
    });
    loop {
        // While streams are open, look again one idle period later.
        let deadline = if activity.open.load(Ordering::SeqCst) == 0 {
            *activity.last_end.lock().unwrap_or_else(|p| p.into_inner()) + idle
        } else {
            Instant::now() + idle
        };
        tokio::select! {
            next = h2.accept() => {
                let Some(next) = next else { return Ok(()) };
                let (req, respond) = next.map_err(ConnectionError::Http2)?;
                activity.open.fetch_add(1, Ordering::SeqCst);
                let guard = StreamGuard(activity.clone());
                let (service, limits) = (service.clone(), limits.clone());
                tokio::spawn(async move {
                    let _open = guard;
                    serve_call(req, respond, &service, &limits, peer, src).await;
                });
            }
            () = tokio::time::sleep_until(deadline.into()) => {
                let quiet = activity.open.load(Ordering::SeqCst) == 0
                    && activity.last_end.lock().unwrap_or_else(|p| p.into_inner()).elapsed() >= idle;
                if quiet {
                    service.connection_refused("idle_timeout");
                    tracing::debug!(ca.peer = %peer, "connection idle; closing");
                    h2.graceful_shutdown();
                    // Lets the GOAWAY out; no stream is open to wait for.
                    let _ = tokio::time::timeout(Duration::from_secs(1), async {
                        while let Some(Ok(_)) = h2.accept().await {}
                    })
                    .await;
                    return Ok(());
                }
            }
        }
    }
}

/// One call of a connection this server accepted: bounded by the request
/// timeout, counted, answered.
async fn serve_call(
    req: Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    service: &CaService,
    limits: &ServerLimits,
    peer: SocketAddr,
    src: IpAddr,
) {
    let timeout = limits.request_timeout;
    let result = tokio::time::timeout(timeout, call(req, service, Some(src)))
        .await
        .unwrap_or_else(|_| {
            Err(Status::new(
                Code::Unavailable,
                "request_timeout",
                format!("the call took longer than {timeout:?}"),
            ))
        });
    service.record(&result);
    if let Err(s) = &result {
        // Refusals of callers not (yet) authenticated come in floods: the
        // counters have them, the log at debug.
        if matches!(s.code, Code::Unauthenticated | Code::ResourceExhausted) {
            tracing::debug!(ca.peer = %peer, ca.code = s.code.name(), ca.reason = s.reason, ca.message = %s.message, "CreateCertificate refused");
        } else {
            tracing::info!(ca.peer = %peer, ca.code = s.code.name(), ca.reason = s.reason, ca.message = %s.message, "CreateCertificate refused");
        }
    }
    respond_with(respond, result);
}

/// Serves one `CreateCertificate` stream of an HTTP/2 connection someone
/// else accepted (a server that also serves other methods on the same
/// port, as the mesh's control plane serves xDS and certificates on 15012).
/// That server owns the connection's limits; no source budget applies.
pub async fn serve_stream(
    req: Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    service: &CaService,
) {
    let result = call(req, service, None).await;
    service.record(&result);
    respond_with(respond, result);
}

async fn call(
    req: Request<h2::RecvStream>,
    service: &CaService,
    source: Option<IpAddr>,
) -> Result<IstioCertificateResponse, Status> {
    let (parts, mut body) = req.into_parts();
    if parts.uri.path() != CREATE_CERTIFICATE_PATH {
        return Err(Status::new(
            Code::Unimplemented,
            "unknown_method",
            format!("no method {}", parts.uri.path()),
        ));
    }
    if parts.method != http::Method::POST {
        return Err(Status::new(
            Code::Unimplemented,
            "unknown_method",
            "gRPC calls are POSTs",
        ));
    }
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/grpc") {
        return Err(Status::new(
            Code::InvalidArgument,
            "not_grpc",
            format!("content-type is {content_type:?}, expected application/grpc"),
        ));
    }
    let authorization = parts
        .headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    // The token first: nothing of the body is read (h2 holds at most the
    // stream's window of it) until the caller is authenticated.
    let caller = service.authenticate(source, authorization).await?;
    // Read at most the request limit (plus the frame prefix): a bigger body
    // is refused before it is all buffered.
    let cap = service.limits().max_request_bytes + 5;
    let mut buf = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| {
            Status::new(
                Code::InvalidArgument,
                "body_error",
                format!("reading the request: {e}"),
            )
        })?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if buf.len() + chunk.len() > cap {
            return Err(Status::new(
                Code::ResourceExhausted,
                "too_large",
                format!("request body is more than {cap} bytes"),
            ));
        }
        buf.extend_from_slice(&chunk);
    }
    service.issue(&caller, &buf).await
}

fn respond_with(
    mut respond: h2::server::SendResponse<Bytes>,
    result: Result<IstioCertificateResponse, Status>,
) {
    let ok_headers = || {
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap_or_default()
    };
    match result {
        Ok(resp) => {
            let frame = encode_frame(&resp.encode_to_vec());
            let Ok(mut send) = respond.send_response(ok_headers(), false) else {
                return;
            };
            let _ = send.send_data(frame, false);
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            let _ = send.send_trailers(trailers);
        }
        Err(status) => {
            // Trailers-only: the status in the response headers.
            let mut resp = ok_headers();
            let h = resp.headers_mut();
            h.insert("grpc-status", HeaderValue::from(status.code.as_u32()));
            if let Ok(v) = HeaderValue::from_str(&encode_message(&status.message)) {
                h.insert("grpc-message", v);
            }
            let _ = respond.send_response(resp, true);
        }
    }
}

/// The serving certificate could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsFilesError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("{file}: {problem}")]
    File {
        /// The file.
        file: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// rustls refused the pair (a key that is not the certificate's, ...).
    #[error("serving certificate {cert} with key {key}: {problem}")]
    Pair {
        /// Certificate file.
        cert: std::path::PathBuf,
        /// Key file.
        key: std::path::PathBuf,
        /// rustls's reason.
        problem: String,
    },
}

/// The CA service's TLS config from PEM files: its serving certificate chain
/// and key (TLS 1.3, ALPN h2, no client certificate: callers authenticate
/// with their token).
pub fn tls_config_from_files(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Arc<rustls::ServerConfig>, TlsFilesError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let file_err = |file: &std::path::Path, problem: String| TlsFilesError::File {
        file: file.to_owned(),
        problem,
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| file_err(cert, e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_err(cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_err(cert, "no CERTIFICATE in the file".into()));
    }
    let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_err(key, e.to_string()))?;
    let pair = |problem: String| TlsFilesError::Pair {
        cert: cert.to_owned(),
        key: key.to_owned(),
        problem,
    };
    let mut cfg = rustls::ServerConfig::builder_with_provider(ringway_identity::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| pair(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| pair(e.to_string()))?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// The service running on a runtime it owns (the CA's own threads, never a
/// proxy's): [`serve`] on `addr`, stopped and joined by [`Server::stop`] or
/// when dropped.
pub struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Binds `addr` and serves `service` on `rt` (which may already run
    /// other tasks of the CA, such as its pod watch). `rt` must have worker
    /// threads of its own: nothing else drives it.
    pub fn start(
        rt: tokio::runtime::Runtime,
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        service: Arc<CaService>,
        limits: ServerLimits,
    ) -> std::io::Result<Server> {
        limits
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        if rt.handle().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the certificate service needs a multi-thread runtime (nothing would drive a current-thread one)",
            ));
        }
        let listener = rt.block_on(TcpListener::bind(addr))?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = rt.spawn(serve(listener, tls, service, limits, async {
            let _ = stopped.await;
        }));
        Ok(Server {
            addr,
            stop: Some(stop),
            task: Some(task),
            rt: Some(rt),
        })
    }

    /// Where it listens (the port the kernel chose for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the accept loop to end.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let Some(rt) = self.rt.take() else { return };
        // Inside another runtime (a drop from async code) neither waiting nor
        // dropping a runtime is allowed: let it wind down in the background.
        if tokio::runtime::Handle::try_current().is_ok() {
            rt.shutdown_background();
            return;
        }
        if let Some(t) = self.task.take() {
            let _ = rt.block_on(t);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut_down();
    }
}
