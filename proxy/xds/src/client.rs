//! The delta ADS client: one bidirectional gRPC stream to the control plane
//! over TLS and HTTP/2 (h2 directly, as the certificate client does), kept
//! up for as long as the caller wants it.
//!
//! Each attempt reads the token file (a missing or empty token is an error:
//! no connection is made without credentials), resolves the address,
//! connects, checks the server's certificate with the caller's TLS config,
//! opens `DeltaAggregatedResources` with `authorization: Bearer <token>` and
//! `clusterid`, and sends one first request per subscribed type: the
//! [`Node`], a wildcard subscription (an empty list) and the
//! `initial_resource_versions` the [`Handler`] holds, so a reconnected
//! stream only receives what changed.
//!
//! Every response gets exactly one answer: an ACK (type URL and nonce) when
//! the handler applied it, a NACK (with `error_detail`, code 3
//! INVALID_ARGUMENT, and the handler's message) when it refused something,
//! and a NACK naming the type when it is of a type the client did not
//! subscribe to (the handler never sees those). What cannot be answered
//! ends the stream with a typed [`XdsError`]: a message that is not a
//! `DeltaDiscoveryResponse` (no nonce to answer), one announced larger than
//! the limit (refused from its 5-byte prefix, before it is buffered), a
//! reset, the server's trailers (`grpc-status`, `grpc-message`
//! percent-decoded), an unanswered PING. The handler's state is never
//! touched by a disconnect; the client waits a jittered exponential backoff
//! (reset once a stream has delivered a response) and tries again, until the
//! stop signal.
//!
//! The client never spawns: [`AdsClient::run`] is one future, driven by the
//! caller's runtime (a current-thread runtime on the control thread).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request};
use prost::Message;
use ringway_grpc::{encode_frame, FrameError, MessageDecoder, WireStatus};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

use crate::proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Status, ADDRESS_TYPE_URL,
    AUTHORIZATION_TYPE_URL, CODE_INVALID_ARGUMENT, DELTA_ADS_PATH,
};

/// The control plane's port for xDS (and certificates), as the mesh serves it.
pub const XDS_PORT: u16 = 15012;

/// Default limit of one response message (64 MiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The gRPC metadata header carrying the cluster name (the reference sends
/// `ClusterID`; HTTP/2 header names are lower case).
pub const CLUSTER_ID_HEADER: &str = "clusterid";

/// Longest NACK message sent; a longer one is cut at a character boundary
/// and says how much was left out.
pub const MAX_NACK_MESSAGE: usize = 4096;

/// Longest token file read.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// Jittered exponential backoff between attempts: `initial` doubling up to
/// `max`, each wait cut by up to half at random ([`Backoff::delays`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Backoff {
    /// The waits: [`ringway_config::Backoff`] from `initial` to `max`, each
    /// wait `d` drawn from `[d/2, d]`.
    pub fn delays(self) -> ringway_config::Backoff {
        ringway_config::Backoff::new(self.initial, self.max)
            .with_jitter(ringway_config::Jitter::Down(0.5))
    }
}

impl Default for Backoff {
    /// 100 ms doubling to 15 s.
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(15),
        }
    }
}

/// HTTP/2 PINGs that tell a dead connection from a quiet one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Time between PINGs.
    pub interval: Duration,
    /// Time a PING may go unanswered before the connection is dropped.
    pub timeout: Duration,
}

impl Default for Keepalive {
    /// Every 30 s, answered within 20 s.
    fn default() -> Self {
        Keepalive {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(20),
        }
    }
}

/// What the client connects to and how.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of the control plane, resolved at every connect.
    pub address: String,
    /// The name the server's certificate must be valid for.
    pub server_name: ServerName<'static>,
    /// TLS: roots (the mesh root), client certificate if any; ALPN must
    /// offer `h2`. Each connect takes the config in force (replaced when
    /// the roots rotate).
    pub tls: ringway_grpc::ClientTls,
    /// The service-account token, read at every (re)connect.
    pub token_file: PathBuf,
    /// Sent as the `clusterid` header (not sent when empty).
    pub cluster_id: String,
    /// Sent on the first request of each type on every stream.
    pub node: Node,
    /// Types to subscribe to (wildcard), in the order the first requests go.
    pub type_urls: Vec<String>,
    /// Largest response message; a larger one drops the stream.
    pub max_message_bytes: usize,
    /// Waits between attempts.
    pub backoff: Backoff,
    /// Limit of each of resolving, TCP connect, TLS and the HTTP/2 preface.
    pub connect_timeout: Duration,
    /// PINGs on an established connection.
    pub keepalive: Keepalive,
}

impl ClientConfig {
    /// A config subscribing to workloads/services and authorizations, with
    /// the default limit, backoff, timeouts and keepalive.
    pub fn new(
        address: impl Into<String>,
        server_name: ServerName<'static>,
        tls: impl Into<ringway_grpc::ClientTls>,
        token_file: impl Into<PathBuf>,
        cluster_id: impl Into<String>,
        node: Node,
    ) -> Self {
        ClientConfig {
            address: address.into(),
            server_name,
            tls: tls.into(),
            token_file: token_file.into(),
            cluster_id: cluster_id.into(),
            node,
            type_urls: vec![
                ADDRESS_TYPE_URL.to_owned(),
                AUTHORIZATION_TYPE_URL.to_owned(),
            ],
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            backoff: Backoff::default(),
            connect_timeout: Duration::from_secs(10),
            keepalive: Keepalive::default(),
        }
    }
}

/// A config the client cannot run with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The address is not `host:port`.
    #[error("xDS address {0:?} is not host:port")]
    Address(String),
    /// The cluster id cannot be a header value.
    #[error("cluster id {0:?} cannot be sent as a header value")]
    ClusterId(String),
    /// Nothing to subscribe to.
    #[error("no type URL to subscribe to")]
    NoTypes,
    /// A type URL is empty or listed twice.
    #[error("type URL {0:?} is empty or listed twice")]
    TypeUrl(String),
    /// The message limit is 0 or beyond what a gRPC prefix can announce.
    #[error("max_message_bytes {0} must be between 1 and 4294967295")]
    MaxMessage(usize),
    /// A zero wait, or an initial wait above the maximum.
    #[error("backoff {0:?}: the initial wait must be above zero and at most the maximum")]
    Backoff(Backoff),
    /// A zero timeout or interval.
    #[error("{0} must be above zero")]
    ZeroDuration(&'static str),
}

/// Why one attempt (a connection and its stream) ended. Every variant is
/// retried; none drops the handler's state.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    /// The token file cannot be read.
    #[error("reading the token file {path}: {source}")]
    TokenRead {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds no token.
    #[error("the token file {path} is empty")]
    TokenEmpty {
        /// The file.
        path: PathBuf,
    },
    /// The token cannot be sent.
    #[error("the token in {path} cannot be sent: {problem}")]
    TokenInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong (never the token itself).
        problem: &'static str,
    },
    /// Name resolution failed.
    #[error("resolving {address}: {source}")]
    Resolve {
        /// The configured address.
        address: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The name resolved to nothing.
    #[error("{address} resolved to no address")]
    NoAddress {
        /// The configured address.
        address: String,
    },
    /// TCP connect failed.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The address tried.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed (a certificate not from the trusted root,
    /// a wrong name, no common protocol, ...).
    #[error("TLS with {addr}: {source}")]
    Tls {
        /// The server.
        addr: SocketAddr,
        /// rustls's reason (inside the I/O error).
        #[source]
        source: std::io::Error,
    },
    /// HTTP/2 failed, or the server reset the stream.
    #[error("HTTP/2 with {addr} ({during}): {source}")]
    Http2 {
        /// The server.
        addr: SocketAddr,
        /// What was being done.
        during: &'static str,
        /// h2's reason.
        #[source]
        source: h2::Error,
    },
    /// The connection ended.
    #[error("the connection to {addr} closed")]
    ConnectionClosed {
        /// The server.
        addr: SocketAddr,
    },
    /// A step took too long.
    #[error("{during} took longer than {after:?}")]
    Timeout {
        /// What was being done.
        during: &'static str,
        /// The limit.
        after: Duration,
    },
    /// A PING went unanswered.
    #[error("no answer to an HTTP/2 PING from {addr} within {after:?}")]
    KeepaliveTimeout {
        /// The server.
        addr: SocketAddr,
        /// The limit.
        after: Duration,
    },
    /// The server answered with an HTTP status other than 200.
    #[error("the server answered HTTP status {status}")]
    HttpStatus {
        /// The status.
        status: u16,
    },
    /// The server's answer is not gRPC.
    #[error("the server answered with content-type {content_type:?}, not application/grpc")]
    NotGrpc {
        /// What it said.
        content_type: String,
    },
    /// The server ended the stream with a gRPC status (an OK one too: the
    /// stream is meant to last).
    #[error("the server ended the stream: {status}")]
    Ended {
        /// `grpc-status` and `grpc-message`.
        status: WireStatus,
    },
    /// The server ended the stream without a status.
    #[error("the server ended the stream without a grpc-status")]
    EndedWithoutStatus,
    /// The server's bytes are not acceptable gRPC messages (larger than the
    /// limit, compressed, a bad flag, cut short).
    #[error("the server's stream: {0}")]
    Frame(#[from] FrameError),
    /// A message is not a `DeltaDiscoveryResponse`: it has no nonce to NACK.
    #[error("a {len}-byte message from the server is not a DeltaDiscoveryResponse: {source}")]
    Decode {
        /// Its length.
        len: usize,
        /// prost's reason.
        #[source]
        source: prost::DecodeError,
    },
}

impl XdsError {
    /// A short fixed reason (metric label).
    pub fn reason(&self) -> &'static str {
        match self {
            XdsError::TokenRead { .. } | XdsError::TokenEmpty { .. } => "token_missing",
            XdsError::TokenInvalid { .. } => "token_invalid",
            XdsError::Resolve { .. } | XdsError::NoAddress { .. } => "resolve",
            XdsError::Connect { .. } => "connect",
            XdsError::Tls { .. } => "tls",
            XdsError::Http2 { .. } => "http2",
            XdsError::ConnectionClosed { .. } => "connection_closed",
            XdsError::Timeout { .. } => "timeout",
            XdsError::KeepaliveTimeout { .. } => "keepalive_timeout",
            XdsError::HttpStatus { .. } | XdsError::NotGrpc { .. } => "not_grpc",
            XdsError::Ended { .. } | XdsError::EndedWithoutStatus => "ended",
            XdsError::Frame(FrameError::TooLarge { .. }) => "too_large",
            XdsError::Frame(_) => "bad_frame",
            XdsError::Decode { .. } => "decode",
        }
    }
}

/// A handler's refusal of (part of) a response: sent as a NACK.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Nack {
    /// What was refused and why, naming the resources.
    pub message: String,
}

impl Nack {
    /// A refusal saying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Nack {
            message: message.into(),
        }
    }
}

impl From<String> for Nack {
    fn from(message: String) -> Self {
        Nack { message }
    }
}

impl From<&str> for Nack {
    fn from(message: &str) -> Self {
        Nack::new(message)
    }
}

/// What happened on the connection, for metrics and logs (the client logs
/// them too).
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// A stream is open and its first requests are sent.
    Connected {
        /// The server.
        addr: SocketAddr,
    },
    /// A response was applied and ACKed.
    Acked {
        /// Its type.
        type_url: String,
        /// Its nonce.
        nonce: String,
    },
    /// A response was refused (in part) and NACKed.
    Nacked {
        /// Its type.
        type_url: String,
        /// Its nonce.
        nonce: String,
        /// The message sent.
        message: String,
    },
    /// An attempt ended (or never got a stream open); the next one follows
    /// after `retry_in`.
    Disconnected {
        /// Why.
        error: XdsError,
        /// Whether a stream had been opened.
        established: bool,
        /// Responses the stream delivered.
        responses: u64,
        /// The wait before the next attempt.
        retry_in: Duration,
    },
}

/// The caller's side: applies responses and says what it holds.
pub trait Handler {
    /// One response of a subscribed type. Apply what can be applied; return
    /// a [`Nack`] naming what was refused (it is sent as the NACK's
    /// message). The client does not check the resources' `Any` types:
    /// that is part of applying them.
    fn on_response(&mut self, response: &DeltaDiscoveryResponse) -> Result<(), Nack>;

    /// Name -> version of what is held of `type_url`, sent as
    /// `initial_resource_versions` on every (re)connect.
    fn resource_versions(&self, type_url: &str) -> HashMap<String, String>;

    /// Connection events (the client has logged them already).
    fn on_event(&mut self, event: Event) {
        let _ = event;
    }
}

/// The delta ADS client (see the module documentation).
#[derive(Debug, Clone)]
pub struct AdsClient {
    config: ClientConfig,
    uri: http::Uri,
    cluster_id: Option<HeaderValue>,
    subscribed: HashSet<String>,
}

/// What one attempt achieved.
#[derive(Debug, Default)]
struct Progress {
    established: bool,
    responses: u64,
}

impl AdsClient {
    /// Checks `config`.
    pub fn new(config: ClientConfig) -> Result<Self, ConfigError> {
        let bad_address = || ConfigError::Address(config.address.clone());
        let (host, port) = config.address.rsplit_once(':').ok_or_else(bad_address)?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad_address());
        }
        let uri = http::Uri::builder()
            .scheme("https")
            .authority(config.address.as_str())
            .path_and_query(DELTA_ADS_PATH)
            .build()
            .map_err(|_| bad_address())?;
        let cluster_id = match config.cluster_id.as_str() {
            "" => None,
            id => Some(
                HeaderValue::from_str(id)
                    .map_err(|_| ConfigError::ClusterId(config.cluster_id.clone()))?,
            ),
        };
        if config.type_urls.is_empty() {
            return Err(ConfigError::NoTypes);
        }
        let mut subscribed = HashSet::new();
        for t in &config.type_urls {
            if t.is_empty() || !subscribed.insert(t.clone()) {
                return Err(ConfigError::TypeUrl(t.clone()));
            }
        }
        if config.max_message_bytes == 0 || config.max_message_bytes > u32::MAX as usize {
            return Err(ConfigError::MaxMessage(config.max_message_bytes));
        }
        let b = config.backoff;
        if b.initial.is_zero() || b.initial > b.max {
            return Err(ConfigError::Backoff(b));
        }
        for (what, d) in [
            ("connect_timeout", config.connect_timeout),
            ("keepalive.interval", config.keepalive.interval),
            ("keepalive.timeout", config.keepalive.timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::ZeroDuration(what));
            }
        }
        Ok(AdsClient {
            config,
            uri,
            cluster_id,
            subscribed,
        })
    }

    /// The config.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// Keeps a stream up and feeds `handler` until `stop` completes, then
    /// returns (dropping the stream and its connection).
    pub async fn run<H: Handler>(&self, handler: &mut H, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut backoff = self.config.backoff.delays();
        loop {
            let mut progress = Progress::default();
            let error = tokio::select! {
                biased;
                () = &mut stop => return,
                e = self.attempt(handler, &mut progress) => e,
            };
            if progress.responses > 0 {
                backoff.reset();
            }
            let retry_in = backoff.next_delay();
            // The server closing a stream that worked (a rebalance, a
            // restart) is routine; anything else is worth a warning.
            let routine = progress.responses > 0
                && match &error {
                    XdsError::Ended { status } => status.is_ok(),
                    XdsError::ConnectionClosed { .. } => true,
                    _ => false,
                };
            if routine {
                tracing::info!(
                    error = %error,
                    xds.reason = error.reason(),
                    xds.responses = progress.responses,
                    xds.retry_in = ?retry_in,
                    "xDS stream closed by the server"
                );
            } else if progress.established {
                tracing::warn!(
                    error = %error,
                    xds.reason = error.reason(),
                    xds.responses = progress.responses,
                    xds.retry_in = ?retry_in,
                    "xDS stream ended"
                );
            } else {
                tracing::warn!(
                    error = %error,
                    xds.reason = error.reason(),
                    xds.retry_in = ?retry_in,
                    "xDS connection failed"
                );
            }
            handler.on_event(Event::Disconnected {
                error,
                established: progress.established,
                responses: progress.responses,
                retry_in,
            });
            tokio::select! {
                biased;
                () = &mut stop => return,
                () = tokio::time::sleep(retry_in) => {}
            }
        }
    }

    /// One attempt: the error that ended it.
    async fn attempt<H: Handler>(&self, handler: &mut H, progress: &mut Progress) -> XdsError {
        match self.try_attempt(handler, progress).await {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }

    async fn try_attempt<H: Handler>(
        &self,
        handler: &mut H,
        progress: &mut Progress,
    ) -> Result<Infallible, XdsError> {
        // Credentials first: no connection is made without them.
        let authorization = self.read_token()?;
        let (tls, addr) = self.connect().await?;
        let limit = self.config.connect_timeout;
        let (client, mut conn) = tokio::time::timeout(
            limit,
            h2::client::Builder::new()
                .initial_window_size(1 << 20)
                .initial_connection_window_size(2 << 20)
                .max_header_list_size(64 * 1024)
                .handshake::<_, Bytes>(tls),
        )
        .await
        .map_err(|_| XdsError::Timeout {
            during: "the HTTP/2 handshake",
            after: limit,
        })?
        .map_err(|source| XdsError::Http2 {
            addr,
            during: "handshake",
            source,
        })?;
        let ping = conn.ping_pong();
        let session = self.session(client, authorization, addr, handler, progress);
        tokio::select! {
            // The connection first: a pong it reads is seen by the
            // keepalive in the same round.
            biased;
            r = &mut conn => Err(match r {
                Ok(()) => XdsError::ConnectionClosed { addr },
                Err(source) => XdsError::Http2 { addr, during: "connection", source },
            }),
            r = session => r,
            e = keepalive(ping, addr, self.config.keepalive) => Err(e),
        }
    }

    /// `Bearer <token>` from the token file, marked sensitive (never
    /// indexed by HPACK, never logged).
    fn read_token(&self) -> Result<HeaderValue, XdsError> {
        let path = &self.config.token_file;
        let mut raw = Vec::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_TOKEN_BYTES + 1).read_to_end(&mut raw))
            .map_err(|source| XdsError::TokenRead {
                path: path.clone(),
                source,
            })?;
        let invalid = |problem| XdsError::TokenInvalid {
            path: path.clone(),
            problem,
        };
        if raw.len() as u64 > MAX_TOKEN_BYTES {
            return Err(invalid("the file is larger than 64 KiB"));
        }
        let text = std::str::from_utf8(&raw).map_err(|_| invalid("it is not UTF-8"))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(XdsError::TokenEmpty { path: path.clone() });
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| invalid("it holds characters a header value cannot"))?;
        value.set_sensitive(true);
        Ok(value)
    }

    /// Resolves the address and connects to the first address that
    /// answers and completes TLS; the error is the first TLS failure met,
    /// else the last address's.
    async fn connect(
        &self,
    ) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, SocketAddr), XdsError> {
        let limit = self.config.connect_timeout;
        let timeout = |during| XdsError::Timeout {
            during,
            after: limit,
        };
        let address = &self.config.address;
        let addrs: Vec<SocketAddr> =
            tokio::time::timeout(limit, tokio::net::lookup_host(address.as_str()))
                .await
                .map_err(|_| timeout("resolving the address"))?
                .map_err(|source| XdsError::Resolve {
                    address: address.clone(),
                    source,
                })?
                .collect();
        let mut last = XdsError::NoAddress {
            address: address.clone(),
        };
        for addr in addrs {
            let tcp = match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
                Ok(Ok(tcp)) => tcp,
                // A TLS failure at an earlier address (an untrusted root,
                // a wrong name) says more than a later refusal: kept.
                Ok(Err(source)) => {
                    tracing::debug!(xds.addr = %addr, error = %source, "xDS connect failed");
                    if !matches!(last, XdsError::Tls { .. }) {
                        last = XdsError::Connect { addr, source };
                    }
                    continue;
                }
                Err(_) => {
                    if !matches!(last, XdsError::Tls { .. }) {
                        last = timeout("TCP connect");
                    }
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            // A handshake that fails or stalls at one address (a replica
            // not yet serving the current certificate, a stale endpoint)
            // moves on to the next, as a refused connect does.
            match tokio::time::timeout(
                limit,
                tokio_rustls::TlsConnector::from(self.config.tls.current())
                    .connect(self.config.server_name.clone(), tcp),
            )
            .await
            {
                Ok(Ok(tls)) => return Ok((tls, addr)),
                Ok(Err(source)) => {
                    tracing::debug!(xds.addr = %addr, error = %source, "xDS TLS handshake failed");
                    last = XdsError::Tls { addr, source };
                }
                Err(_) if !matches!(last, XdsError::Tls { .. }) => {
                    last = timeout("the TLS handshake")
                }
                Err(_) => {}
            }
        }
        Err(last)
    }

    /// The stream: first requests, then one answer per response, until the
    /// stream ends.
    async fn session<H: Handler>(
        &self,
        client: h2::client::SendRequest<Bytes>,
        authorization: HeaderValue,
        addr: SocketAddr,
        handler: &mut H,
        progress: &mut Progress,
    ) -> Result<Infallible, XdsError> {
        let h2_err = |during| {
            move |source| XdsError::Http2 {
                addr,
                during,
                source,
            }
        };
        let mut client = client.ready().await.map_err(h2_err("opening the stream"))?;
        let mut request = Request::new(());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers.insert(http::header::AUTHORIZATION, authorization);
        if let Some(id) = &self.cluster_id {
            headers.insert(CLUSTER_ID_HEADER, id.clone());
        }
        let (response, mut send) = client
            .send_request(request, false)
            .map_err(h2_err("opening the stream"))?;
        for type_url in &self.config.type_urls {
            let first = DeltaDiscoveryRequest {
                node: Some(self.config.node.clone()),
                type_url: type_url.clone(),
                initial_resource_versions: handler.resource_versions(type_url),
                ..Default::default()
            };
            tracing::debug!(
                xds.type_url = %type_url,
                xds.held = first.initial_resource_versions.len(),
                "xDS subscribe"
            );
            send.send_data(encode_frame(&first.encode_to_vec()), false)
                .map_err(h2_err("sending"))?;
        }
        progress.established = true;
        tracing::info!(xds.addr = %addr, "xDS stream open");
        handler.on_event(Event::Connected { addr });

        let response = response.await.map_err(h2_err("awaiting the response"))?;
        if let Some(status) = WireStatus::from_headers(response.headers()) {
            // Trailers-only: the call ended before it started.
            return Err(self.ended(status));
        }
        if response.status() != http::StatusCode::OK {
            return Err(XdsError::HttpStatus {
                status: response.status().as_u16(),
            });
        }
        let content_type = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .unwrap_or_default();
        if !content_type.starts_with("application/grpc") {
            return Err(XdsError::NotGrpc { content_type });
        }
        let mut body = response.into_body();
        let mut decoder = MessageDecoder::new(self.config.max_message_bytes);
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(h2_err("receiving"))?;
            let len = chunk.len();
            let pushed = decoder.push(chunk);
            // Answer what arrived whole before any bad prefix.
            while let Some(message) = decoder.next_message() {
                let resp = DeltaDiscoveryResponse::decode(message.as_ref()).map_err(|source| {
                    XdsError::Decode {
                        len: message.len(),
                        source,
                    }
                })?;
                progress.responses += 1;
                let answer = self.answer(handler, &resp);
                send.send_data(encode_frame(&answer.encode_to_vec()), false)
                    .map_err(h2_err("sending"))?;
            }
            pushed?;
            let _ = body.flow_control().release_capacity(len);
        }
        let trailers = body
            .trailers()
            .await
            .map_err(h2_err("receiving trailers"))?;
        if let Some(status) = trailers.as_ref().and_then(WireStatus::from_headers) {
            if let Err(cut) = decoder.finish() {
                tracing::debug!(error = %cut, "xDS stream ended inside a message");
            }
            return Err(self.ended(status));
        }
        decoder.finish()?;
        Err(XdsError::EndedWithoutStatus)
    }

    fn ended(&self, status: WireStatus) -> XdsError {
        tracing::info!(
            xds.grpc_status = status.code,
            xds.grpc_message = %status.message,
            "xDS stream ended by the server"
        );
        XdsError::Ended { status }
    }

    /// The one answer to `resp`.
    fn answer<H: Handler>(
        &self,
        handler: &mut H,
        resp: &DeltaDiscoveryResponse,
    ) -> DeltaDiscoveryRequest {
        let outcome = if self.subscribed.contains(&resp.type_url) {
            handler.on_response(resp)
        } else {
            Err(Nack::new(format!(
                "not subscribed to type {:?}; this client subscribes to {}",
                resp.type_url,
                self.config.type_urls.join(", ")
            )))
        };
        let mut answer = DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            ..Default::default()
        };
        match outcome {
            Ok(()) => {
                tracing::debug!(
                    xds.type_url = %resp.type_url,
                    xds.nonce = %resp.nonce,
                    xds.resources = resp.resources.len(),
                    xds.removed = resp.removed_resources.len(),
                    "xDS ACK"
                );
                handler.on_event(Event::Acked {
                    type_url: resp.type_url.clone(),
                    nonce: resp.nonce.clone(),
                });
            }
            Err(nack) => {
                let message = cap_message(nack.message);
                tracing::warn!(
                    xds.type_url = %resp.type_url,
                    xds.nonce = %resp.nonce,
                    xds.message = %message,
                    "xDS NACK"
                );
                answer.error_detail = Some(Status {
                    code: CODE_INVALID_ARGUMENT,
                    message: message.clone(),
                    details: Vec::new(),
                });
                handler.on_event(Event::Nacked {
                    type_url: resp.type_url.clone(),
                    nonce: resp.nonce.clone(),
                    message,
                });
            }
        }
        answer
    }
}

/// PINGs every `interval`; an error when one goes unanswered.
async fn keepalive(ping: Option<h2::PingPong>, addr: SocketAddr, k: Keepalive) -> XdsError {
    let Some(mut ping) = ping else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(k.interval).await;
        match tokio::time::timeout(k.timeout, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(source)) => {
                return XdsError::Http2 {
                    addr,
                    during: "PING",
                    source,
                }
            }
            Err(_) => {
                return XdsError::KeepaliveTimeout {
                    addr,
                    after: k.timeout,
                }
            }
        }
    }
}

/// `message`, cut to [`MAX_NACK_MESSAGE`] bytes at a character boundary.
fn cap_message(message: String) -> String {
    if message.len() <= MAX_NACK_MESSAGE {
        return message;
    }
    let mut end = MAX_NACK_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{} ... ({} more bytes)",
        &message[..end],
        message.len() - end
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The doubling, the cap, the jitter and the reset are
    /// `ringway_config::Backoff`'s (its tests); here, the client's figures.
    #[test]
    fn backoff_is_100ms_doubling_to_15s_jittered_down_to_half() {
        let b = Backoff::default().delays();
        assert_eq!(
            (b.min_delay(), b.max_delay(), b.jitter()),
            (
                Duration::from_millis(100),
                Duration::from_secs(15),
                ringway_config::Jitter::Down(0.5)
            )
        );
        let ceilings: Vec<u64> = (1..=10)
            .map(|n| b.base_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 15000, 15000]
        );
    }

    #[test]
    fn long_nack_messages_are_cut_at_a_character_boundary() {
        assert_eq!(cap_message("short".into()), "short");
        let long = "ü".repeat(MAX_NACK_MESSAGE); // 2 bytes each
        let cut = cap_message(long.clone());
        assert!(cut.len() < MAX_NACK_MESSAGE + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("({} more bytes)", long.len() - MAX_NACK_MESSAGE)));
    }

    fn config() -> ClientConfig {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        ClientConfig::new(
            "istiod.istio-system.svc:15012",
            ServerName::try_from("istiod.istio-system.svc").unwrap(),
            Arc::new(tls),
            "/nonexistent/token",
            "Kubernetes",
            Node::default(),
        )
    }

    #[test]
    fn configs_that_cannot_work_are_refused() {
        AdsClient::new(config()).unwrap();
        type Change = fn(&mut ClientConfig);
        let cases: Vec<(Change, &str)> = vec![
            (|c| c.address = "istiod".into(), "host:port"),
            (|c| c.address = "istiod:http".into(), "host:port"),
            (|c| c.address = ":15012".into(), "host:port"),
            (|c| c.cluster_id = "a\nb".into(), "cluster id"),
            (|c| c.type_urls.clear(), "no type URL"),
            (
                |c| c.type_urls.push(ADDRESS_TYPE_URL.into()),
                "listed twice",
            ),
            (|c| c.max_message_bytes = 0, "max_message_bytes"),
            (
                |c| c.max_message_bytes = u32::MAX as usize + 1,
                "max_message_bytes",
            ),
            (
                |c| c.backoff.initial = Duration::from_secs(60),
                "initial wait",
            ),
            (|c| c.connect_timeout = Duration::ZERO, "connect_timeout"),
        ];
        for (change, words) in cases {
            let mut c = config();
            change(&mut c);
            let e = AdsClient::new(c).unwrap_err();
            assert!(e.to_string().contains(words), "{e}");
        }
        // IPv6 literals and an empty cluster id (header not sent) are fine.
        let mut c = config();
        c.address = "[fd00::1]:15012".into();
        c.cluster_id = String::new();
        let client = AdsClient::new(c).unwrap();
        assert!(client.cluster_id.is_none());
        assert_eq!(client.uri.path(), DELTA_ADS_PATH);
    }
}
