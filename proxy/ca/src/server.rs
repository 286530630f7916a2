//! The transport: TLS (the CA service's own serving certificate; callers
//! authenticate with their token, not a client certificate), HTTP/2, one
//! unary gRPC method.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use prost::Message;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::grpc::{encode_frame, encode_message, Code, Status};
use crate::proto::CREATE_CERTIFICATE_PATH;
use crate::service::CaService;

/// Transport limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// Time for the TLS handshake and the HTTP/2 preface.
    pub handshake_timeout: Duration,
    /// Time for one call, from its headers to its last byte.
    pub request_timeout: Duration,
    /// Streams at once on one connection.
    pub max_concurrent_streams: u32,
    /// Largest header block.
    pub max_header_list_size: u32,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(15),
            max_concurrent_streams: 32,
            max_header_list_size: 16 * 1024,
        }
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
    let conns = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = conns.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            () = &mut shutdown => return,
        };
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
        let (acceptor, service, limits) = (acceptor.clone(), service.clone(), limits.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection(stream, peer, acceptor, service, limits).await {
                tracing::debug!(ca.peer = %peer, error = %e, "connection ended");
            }
        });
    }
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    service: Arc<CaService>,
    limits: Arc<ServerLimits>,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let mut h2 = tokio::time::timeout(limits.handshake_timeout, async {
        let tls = acceptor
            .accept(stream)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        h2::server::Builder::new()
            .max_concurrent_streams(limits.max_concurrent_streams)
            .max_header_list_size(limits.max_header_list_size)
            .handshake::<_, Bytes>(tls)
            .await
            .map_err(|e| format!("HTTP/2 preface: {e}"))
    })
    .await
    .map_err(|_| "handshake timed out".to_owned())??;
    while let Some(req) = h2.accept().await {
        let (req, respond) = req.map_err(|e| format!("HTTP/2: {e}"))?;
        let (service, limits) = (service.clone(), limits.clone());
        tokio::spawn(async move {
            let timeout = limits.request_timeout;
            let outcome = tokio::time::timeout(timeout, call(req, &service)).await;
            let result = outcome.unwrap_or_else(|_| {
                Err(Status::new(
                    Code::Unavailable,
                    "request_timeout",
                    format!("the call took longer than {timeout:?}"),
                ))
            });
            if let Err(s) = &result {
                tracing::info!(ca.peer = %peer, ca.code = s.code.name(), ca.reason = s.reason, ca.message = %s.message, "CreateCertificate refused");
            }
            respond_with(respond, result);
        });
    }
    Ok(())
}

/// Serves one `CreateCertificate` stream of an HTTP/2 connection someone
/// else accepted (a server that also serves other methods on the same
/// port, as the mesh's control plane serves xDS and certificates on 15012).
pub async fn serve_stream(
    req: Request<h2::RecvStream>,
    respond: h2::server::SendResponse<Bytes>,
    service: &CaService,
) {
    respond_with(respond, call(req, service).await);
}

async fn call(req: Request<h2::RecvStream>, service: &CaService) -> Result<Bytes, Status> {
    if req.uri().path() != CREATE_CERTIFICATE_PATH {
        return Err(Status::new(
            Code::Unimplemented,
            "unknown_method",
            format!("no method {}", req.uri().path()),
        ));
    }
    if req.method() != http::Method::POST {
        return Err(Status::new(
            Code::Unimplemented,
            "unknown_method",
            "gRPC calls are POSTs",
        ));
    }
    let content_type = req
        .headers()
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
    let authorization = req
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read at most the request limit (plus the frame prefix): a bigger body
    // is refused before it is all buffered.
    let cap = service.limits().max_request_bytes + 5;
    let mut body = req.into_body();
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
    let resp = service
        .create_certificate(authorization.as_deref(), &buf)
        .await?;
    Ok(encode_frame(&resp.encode_to_vec()))
}

fn respond_with(mut respond: h2::server::SendResponse<Bytes>, result: Result<Bytes, Status>) {
    let ok_headers = || {
        Response::builder()
            .status(StatusCode::OK)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .body(())
            .unwrap_or_default()
    };
    match result {
        Ok(frame) => {
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
