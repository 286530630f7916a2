//! A real test control plane (feature `testing`; not for production
//! builds): `DeltaAggregatedResources` served over TLS and HTTP/2 (h2's
//! server side) on a runtime thread of its own, for this crate's tests and
//! other crates' end-to-end tests.
//!
//! [`XdsServer`] keeps a fixture of resources per type URL. On each stream,
//! the first request of a type is answered with every resource of that
//! type whose version differs from the request's
//! `initial_resource_versions`, and `removed_resources` for the names the
//! client listed that the fixture no longer has (always one response, even
//! an empty one, so a client knows it is in sync). Later requests that
//! subscribe to names get those. [`XdsServer::push`] changes the fixture
//! and sends the change to every live stream subscribed to it; faults
//! ([`push_raw_message`](XdsServer::push_raw_message),
//! [`push_oversized`](XdsServer::push_oversized),
//! [`drop_streams`](XdsServer::drop_streams),
//! [`end_streams`](XdsServer::end_streams)) reach every live stream, and
//! [`stall_connections`](XdsServer::stall_connections) every open
//! connection.
//!
//! Every request is recorded with its stream's request headers (bearer
//! token, `clusterid`), and tests wait for one matching a predicate with a
//! deadline ([`XdsServer::wait_for_request`], or
//! [`XdsServer::wait_for_request_async`] from async code), never a sleep.
//!
//! The server listens wherever its listener was bound: give
//! [`XdsServer::start_on`] a listener bound inside a node's network
//! namespace on the mesh's port ([`crate::client::XDS_PORT`]) to stand in
//! for the control plane there; the thread that serves it need not be in
//! that namespace.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use prost::Message;
use ringway_grpc::{encode_frame, encode_message, MessageDecoder};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::{mpsc, oneshot, watch};

use crate::proto::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource, DELTA_ADS_PATH};

/// Largest request message the server accepts.
const MAX_REQUEST_BYTES: usize = 4 << 20;

/// Time for the TLS handshake and the HTTP/2 preface.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of body sent after an oversized message's prefix.
pub const OVERSIZED_FILLER: usize = 64 * 1024;

/// A server TLS config for the test control plane: TLS 1.3, ALPN h2, no
/// client certificate (clients authenticate with their token), presenting
/// `chain` (leaf first) with `key`.
pub fn server_tls(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13])?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(cfg))
}

/// One request the server received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    /// Its position among all requests recorded (0, 1, ...).
    pub index: usize,
    /// The connection (1, 2, ... in accept order).
    pub connection: u64,
    /// The stream (1, 2, ... in open order, across connections).
    pub stream: u64,
    /// The first request of its type on its stream.
    pub first_of_type: bool,
    /// The stream's request headers.
    pub headers: HeaderMap,
    /// The request.
    pub request: DeltaDiscoveryRequest,
}

impl RecordedRequest {
    /// A request header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The token of `authorization: Bearer <token>`.
    pub fn bearer_token(&self) -> Option<&str> {
        self.header("authorization")?.strip_prefix("Bearer ")
    }

    /// The NACK's message, when it is a NACK.
    pub fn nack_message(&self) -> Option<&str> {
        if !self.request.is_nack() {
            return None;
        }
        self.request
            .error_detail
            .as_ref()
            .map(|s| s.message.as_str())
    }
}

/// One response the server sent (faults are not recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentResponse {
    /// The stream.
    pub stream: u64,
    /// Its type.
    pub type_url: String,
    /// Its nonce.
    pub nonce: String,
    /// (name, version) of each resource in it.
    pub resources: Vec<(String, String)>,
    /// Names removed.
    pub removed: Vec<String>,
}

/// No request matched before the deadline.
#[derive(Debug, thiserror::Error)]
#[error(
    "no request matched within {timeout:?}; {seen} requests were recorded, the last ones: {last}"
)]
pub struct WaitTimeout {
    /// How long was waited.
    pub timeout: Duration,
    /// Requests recorded in all.
    pub seen: usize,
    /// A summary of the last few.
    pub last: String,
}

/// What a stream's task is told to do.
#[derive(Debug)]
enum Command {
    /// Send these bytes (one or more gRPC messages, or a fault).
    Send(Bytes),
    /// Reset the stream (RST_STREAM CANCEL).
    Reset,
    /// End the stream with these trailers.
    End { code: u32, message: String },
}

#[derive(Debug, Default, Clone)]
struct Subscription {
    wildcard: bool,
    names: BTreeSet<String>,
}

impl Subscription {
    fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }
}

#[derive(Debug)]
struct StreamEntry {
    tx: mpsc::UnboundedSender<Command>,
    subs: HashMap<String, Subscription>,
}

#[derive(Debug, Default)]
struct State {
    fixtures: HashMap<String, BTreeMap<String, Resource>>,
    streams: BTreeMap<u64, StreamEntry>,
    requests: Vec<RecordedRequest>,
    sent: Vec<SentResponse>,
    connections: u64,
    tls_failures: u64,
    streams_opened: u64,
    next_nonce: u64,
    /// Types whose first request on a stream gets no answer.
    held: std::collections::HashSet<String>,
}

impl State {
    fn update_fixture(&mut self, type_url: &str, upserts: &[Resource], removals: &[String]) {
        let fixture = self.fixtures.entry(type_url.to_owned()).or_default();
        for r in upserts {
            fixture.insert(r.name.clone(), r.clone());
        }
        for name in removals {
            fixture.remove(name);
        }
    }

    /// A response for `stream`, recorded; its nonce and its frame.
    fn response(
        &mut self,
        stream: u64,
        type_url: &str,
        resources: Vec<Resource>,
        removed: Vec<String>,
    ) -> (String, Bytes) {
        self.next_nonce += 1;
        let nonce = format!("nonce-{}", self.next_nonce);
        self.sent.push(SentResponse {
            stream,
            type_url: type_url.to_owned(),
            nonce: nonce.clone(),
            resources: resources
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect(),
            removed: removed.clone(),
        });
        let msg = DeltaDiscoveryResponse {
            system_version_info: format!("test-{}", self.next_nonce),
            resources,
            type_url: type_url.to_owned(),
            nonce: nonce.clone(),
            removed_resources: removed,
        };
        (nonce, encode_frame(&msg.encode_to_vec()))
    }

    /// Records `req` and returns what to answer it with.
    fn on_request(
        &mut self,
        stream: u64,
        connection: u64,
        headers: &HeaderMap,
        req: DeltaDiscoveryRequest,
    ) -> Option<Bytes> {
        let type_url = req.type_url.clone();
        let known = self
            .streams
            .get(&stream)
            .map(|e| e.subs.contains_key(&type_url));
        let first_of_type = !type_url.is_empty() && known == Some(false);
        self.requests.push(RecordedRequest {
            index: self.requests.len(),
            connection,
            stream,
            first_of_type,
            headers: headers.clone(),
            request: req.clone(),
        });
        if type_url.is_empty() {
            return None;
        }
        // Borrowed, not copied: an ACK reads none of it, and a copy per
        // request costs what the fixture holds (tens of ms at 10,000
        // resources in a debug build, delaying every recorded answer).
        let none = BTreeMap::new();
        let fixture = self.fixtures.get(&type_url).unwrap_or(&none);
        let entry = self.streams.get_mut(&stream)?;
        let (resources, removed) = if first_of_type {
            let mut sub = Subscription {
                wildcard: req.resource_names_subscribe.is_empty()
                    || req.resource_names_subscribe.iter().any(|n| n == "*"),
                names: req
                    .resource_names_subscribe
                    .iter()
                    .filter(|n| *n != "*")
                    .cloned()
                    .collect(),
            };
            unsubscribe(&mut sub, &req.resource_names_unsubscribe);
            let resources: Vec<Resource> = fixture
                .values()
                .filter(|r| {
                    sub.wants(&r.name)
                        && req.initial_resource_versions.get(&r.name) != Some(&r.version)
                })
                .cloned()
                .collect();
            let mut removed: Vec<String> = req
                .initial_resource_versions
                .keys()
                .filter(|n| !fixture.contains_key(*n))
                .cloned()
                .collect();
            removed.sort();
            entry.subs.insert(type_url.clone(), sub);
            if self.held.contains(&type_url) {
                return None;
            }
            (resources, removed)
        } else {
            let sub = entry.subs.entry(type_url.clone()).or_default();
            let mut wanted: Vec<String> = Vec::new();
            for name in &req.resource_names_subscribe {
                if name == "*" {
                    if !sub.wildcard {
                        sub.wildcard = true;
                        wanted.extend(fixture.keys().cloned());
                    }
                } else if sub.names.insert(name.clone()) {
                    wanted.push(name.clone());
                }
            }
            unsubscribe(sub, &req.resource_names_unsubscribe);
            if wanted.is_empty() {
                return None;
            }
            let resources = wanted
                .iter()
                .filter_map(|n| fixture.get(n).cloned())
                .collect();
            let removed = wanted
                .into_iter()
                .filter(|n| !fixture.contains_key(n))
                .collect();
            (resources, removed)
        };
        Some(self.response(stream, &type_url, resources, removed).1)
    }
}

fn unsubscribe(sub: &mut Subscription, names: &[String]) {
    for name in names {
        if name == "*" {
            sub.wildcard = false;
        } else {
            sub.names.remove(name);
        }
    }
}

/// Serves a stream of another gRPC method on the same port (the mesh's
/// control plane serves certificates beside xDS).
pub type OtherMethods = Arc<
    dyn Fn(
            http::Request<h2::RecvStream>,
            h2::server::SendResponse<Bytes>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

struct Shared {
    /// Streams of other paths than delta ADS go here (none: UNIMPLEMENTED).
    other: Mutex<Option<OtherMethods>>,
    state: Mutex<State>,
    changed: Condvar,
    seen: watch::Sender<usize>,
    /// Bumped to stall every connection open at the time.
    stall: watch::Sender<u64>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiters after a request was recorded.
    fn notify(&self, recorded: usize) {
        self.changed.notify_all();
        self.seen.send_replace(recorded);
    }
}

/// The test control plane (see the module documentation). Stops, closing
/// every connection, when dropped.
pub struct XdsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for XdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl XdsServer {
    /// Binds `addr` (in the calling thread's network namespace) and serves.
    pub fn start(addr: SocketAddr, tls: Arc<rustls::ServerConfig>) -> std::io::Result<XdsServer> {
        XdsServer::start_on(std::net::TcpListener::bind(addr)?, tls)
    }

    /// Serves on `listener` (bound wherever the caller chose) from a thread
    /// of its own (`xds-test-server`, a current-thread runtime).
    pub fn start_on(
        listener: std::net::TcpListener,
        tls: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<XdsServer> {
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let listener = {
            let _entered = rt.enter();
            tokio::net::TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared {
            other: Mutex::new(None),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            seen: watch::channel(0).0,
            stall: watch::channel(0).0,
        });
        let (stop, stopped) = oneshot::channel();
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let serving = shared.clone();
        let thread = std::thread::Builder::new()
            .name("xds-test-server".into())
            .spawn(move || {
                rt.block_on(accept_loop(listener, acceptor, serving, stopped));
                // Dropping the runtime here drops every connection's task.
            })?;
        Ok(XdsServer {
            addr,
            shared,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves streams of other methods than delta ADS with `other` (a
    /// certificate service on the same port, as the control plane has).
    pub fn set_other_methods(&self, other: OtherMethods) {
        *self
            .shared
            .other
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(other);
    }

    /// Changes the fixture of `type_url` without telling any stream (what
    /// a client that reconnects will be sent).
    pub fn update_fixture(&self, type_url: &str, upserts: Vec<Resource>, removals: Vec<String>) {
        self.shared
            .lock()
            .update_fixture(type_url, &upserts, &removals);
    }

    /// From now on, a stream's first request for `type_url` is recorded
    /// and subscribed but not answered (a control plane slow to compute
    /// it); [`push`](XdsServer::push) sends it what it subscribed to.
    pub fn hold_first_responses(&self, type_url: &str) {
        self.shared.lock().held.insert(type_url.to_owned());
    }

    /// The fixture of `type_url`, by name.
    pub fn fixture(&self, type_url: &str) -> Vec<Resource> {
        self.shared
            .lock()
            .fixtures
            .get(type_url)
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Changes the fixture and sends the change to every live stream
    /// subscribed to it (a stream that wants none of it gets nothing).
    /// The nonces sent, one per stream.
    pub fn push(
        &self,
        type_url: &str,
        upserts: Vec<Resource>,
        removals: Vec<String>,
    ) -> Vec<String> {
        let mut st = self.shared.lock();
        st.update_fixture(type_url, &upserts, &removals);
        let targets: Vec<(u64, Vec<Resource>, Vec<String>)> = st
            .streams
            .iter()
            .filter_map(|(id, e)| {
                let sub = e.subs.get(type_url)?;
                let r: Vec<Resource> = upserts
                    .iter()
                    .filter(|r| sub.wants(&r.name))
                    .cloned()
                    .collect();
                let d: Vec<String> = removals.iter().filter(|n| sub.wants(n)).cloned().collect();
                (!r.is_empty() || !d.is_empty()).then_some((*id, r, d))
            })
            .collect();
        let mut nonces = Vec::new();
        for (id, resources, removed) in targets {
            let (nonce, frame) = st.response(id, type_url, resources, removed);
            if let Some(e) = st.streams.get(&id) {
                if e.tx.send(Command::Send(frame)).is_ok() {
                    nonces.push(nonce);
                }
            }
        }
        nonces
    }

    /// Sends one gRPC message of arbitrary bytes on every live stream; the
    /// number of streams.
    pub fn push_raw_message(&self, bytes: &[u8]) -> usize {
        self.command_all(|| Command::Send(encode_frame(bytes)))
    }

    /// Sends arbitrary bytes as DATA on every live stream, with no gRPC
    /// framing added (a bad prefix, a compressed flag, ...); the number of
    /// streams.
    pub fn push_raw_data(&self, bytes: &[u8]) -> usize {
        let bytes = Bytes::copy_from_slice(bytes);
        self.command_all(|| Command::Send(bytes.clone()))
    }

    /// Sends, on every live stream, the prefix of a message of `n` bytes
    /// and then at most [`OVERSIZED_FILLER`] bytes of it: the rest never
    /// comes, so only a client that refuses it from its prefix gets on.
    /// The number of streams.
    pub fn push_oversized(&self, n: u32) -> usize {
        let filler = (n as usize).min(OVERSIZED_FILLER);
        let mut b = BytesMut::with_capacity(5 + filler);
        b.put_u8(0);
        b.put_u32(n);
        b.put_bytes(0, filler);
        let b = b.freeze();
        self.command_all(|| Command::Send(b.clone()))
    }

    /// Resets every live stream (RST_STREAM CANCEL); the number reset.
    pub fn drop_streams(&self) -> usize {
        self.command_all(|| Command::Reset)
    }

    /// Ends every live stream with trailers `grpc-status: code` and
    /// `grpc-message: message` (percent-encoded); the number ended.
    pub fn end_streams(&self, code: u32, message: &str) -> usize {
        self.command_all(|| Command::End {
            code,
            message: message.to_owned(),
        })
    }

    /// Stops serving every connection open now, without closing it: its
    /// bytes (PINGs included) are never read or answered again, as behind a
    /// dead peer. Later connections are served as usual.
    pub fn stall_connections(&self) {
        self.shared.stall.send_modify(|generation| *generation += 1);
    }

    fn command_all(&self, command: impl Fn() -> Command) -> usize {
        let st = self.shared.lock();
        st.streams
            .values()
            .filter(|e| e.tx.send(command()).is_ok())
            .count()
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.lock().requests.clone()
    }

    /// How many requests were received so far.
    pub fn request_count(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// Every response sent so far.
    pub fn sent(&self) -> Vec<SentResponse> {
        self.shared.lock().sent.clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.lock().connections
    }

    /// Connections whose TLS handshake or HTTP/2 preface failed.
    pub fn tls_failures(&self) -> u64 {
        self.shared.lock().tls_failures
    }

    /// Streams open now.
    pub fn live_streams(&self) -> usize {
        self.shared.lock().streams.len()
    }

    /// The first request (oldest first, already recorded or arriving before
    /// `timeout`) that `pred` accepts. Blocks the calling thread: from async
    /// code use [`Self::wait_for_request_async`].
    pub fn wait_for_request(
        &self,
        timeout: Duration,
        pred: impl Fn(&RecordedRequest) -> bool,
    ) -> Result<RecordedRequest, WaitTimeout> {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        let mut checked = 0;
        loop {
            if let Some(r) = st.requests[checked..].iter().find(|r| pred(r)) {
                return Ok(r.clone());
            }
            checked = st.requests.len();
            let now = Instant::now();
            if now >= deadline {
                return Err(wait_timeout(timeout, &st.requests));
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// [`Self::wait_for_request`] for async code.
    pub async fn wait_for_request_async(
        &self,
        timeout: Duration,
        pred: impl Fn(&RecordedRequest) -> bool,
    ) -> Result<RecordedRequest, WaitTimeout> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut seen = self.shared.seen.subscribe();
        let mut checked = 0;
        loop {
            {
                let st = self.shared.lock();
                if let Some(r) = st.requests[checked..].iter().find(|r| pred(r)) {
                    return Ok(r.clone());
                }
                checked = st.requests.len();
            }
            match tokio::time::timeout_at(deadline, seen.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(wait_timeout(timeout, &self.shared.lock().requests))
                }
            }
        }
    }

    /// Stops serving and closes every connection.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

fn wait_timeout(timeout: Duration, requests: &[RecordedRequest]) -> WaitTimeout {
    let last = requests
        .iter()
        .rev()
        .take(5)
        .map(|r| {
            format!(
                "#{} stream {} type {:?} nonce {:?} first {} nack {:?}",
                r.index,
                r.stream,
                r.request.type_url,
                r.request.response_nonce,
                r.first_of_type,
                r.nack_message()
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    WaitTimeout {
        timeout,
        seen: requests.len(),
        last,
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut stop => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "test xDS server: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let connection = {
            let mut st = shared.lock();
            st.connections += 1;
            st.connections
        };
        tokio::spawn(serve_connection(
            shared.clone(),
            acceptor.clone(),
            tcp,
            peer,
            connection,
        ));
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    acceptor: tokio_rustls::TlsAcceptor,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    connection: u64,
) {
    let _ = tcp.set_nodelay(true);
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        let tls = acceptor.accept(tcp).await.map_err(|e| e.to_string())?;
        h2::server::Builder::new()
            .max_concurrent_streams(16)
            .handshake::<_, Bytes>(tls)
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|_| Err("handshake timed out".to_owned()));
    let mut h2 = match handshake {
        Ok(h2) => h2,
        Err(e) => {
            tracing::debug!(xds.peer = %peer, error = %e, "test xDS server: handshake failed");
            shared.lock().tls_failures += 1;
            return;
        }
    };
    let mut stall = shared.stall.subscribe();
    loop {
        tokio::select! {
            next = h2.accept() => {
                let Some(Ok((req, respond))) = next else { break };
                tokio::spawn(serve_stream(shared.clone(), connection, req, respond));
            }
            Ok(()) = stall.changed() => {
                // Hold the connection, never poll it again.
                tracing::debug!(xds.peer = %peer, "test xDS server: connection stalled");
                std::future::pending::<()>().await;
            }
        }
    }
}

fn grpc_headers() -> Response<()> {
    let mut resp = Response::new(());
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    resp
}

fn status_trailers(code: u32, message: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("grpc-status", HeaderValue::from(code));
    if let Ok(v) = HeaderValue::from_str(&encode_message(message)) {
        h.insert("grpc-message", v);
    }
    h
}

async fn serve_stream(
    shared: Arc<Shared>,
    connection: u64,
    req: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    if req.uri().path() != DELTA_ADS_PATH {
        let other = shared
            .other
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(other) = other {
            other(req, respond).await;
            return;
        }
        let mut resp = grpc_headers();
        resp.headers_mut().extend(status_trailers(
            12,
            &format!("no method {}", req.uri().path()),
        ));
        let _ = respond.send_response(resp, true);
        return;
    }
    let (parts, mut body) = req.into_parts();
    let Ok(mut send) = respond.send_response(grpc_headers(), false) else {
        return;
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = {
        let mut st = shared.lock();
        st.streams_opened += 1;
        let id = st.streams_opened;
        st.streams.insert(
            id,
            StreamEntry {
                tx,
                subs: HashMap::new(),
            },
        );
        id
    };
    let mut decoder = MessageDecoder::new(MAX_REQUEST_BYTES);
    'stream: loop {
        tokio::select! {
            chunk = body.data() => {
                let Some(Ok(chunk)) = chunk else { break 'stream };
                let len = chunk.len();
                let pushed = decoder.push(chunk);
                let _ = body.flow_control().release_capacity(len);
                while let Some(message) = decoder.next_message() {
                    let req = match DeltaDiscoveryRequest::decode(message) {
                        Ok(r) => r,
                        Err(e) => {
                            let _ = send.send_trailers(status_trailers(3, &format!("not a DeltaDiscoveryRequest: {e}")));
                            break 'stream;
                        }
                    };
                    let reply = {
                        let mut st = shared.lock();
                        let reply = st.on_request(stream, connection, &parts.headers, req);
                        shared.notify(st.requests.len());
                        reply
                    };
                    if let Some(frame) = reply {
                        if send.send_data(frame, false).is_err() {
                            break 'stream;
                        }
                    }
                }
                if let Err(e) = pushed {
                    let _ = send.send_trailers(status_trailers(e.code().as_u32(), &e.to_string()));
                    break 'stream;
                }
            }
            command = rx.recv() => match command {
                Some(Command::Send(bytes)) => {
                    if send.send_data(bytes, false).is_err() {
                        break 'stream;
                    }
                }
                Some(Command::Reset) => {
                    send.send_reset(h2::Reason::CANCEL);
                    break 'stream;
                }
                Some(Command::End { code, message }) => {
                    let _ = send.send_trailers(status_trailers(code, &message));
                    shared.lock().streams.remove(&stream);
                    // Read on until the client goes: dropping the request
                    // body now would reset the stream behind the trailers.
                    while let Some(Ok(chunk)) = body.data().await {
                        let _ = body.flow_control().release_capacity(chunk.len());
                    }
                    return;
                }
                None => break 'stream,
            },
        }
    }
    shared.lock().streams.remove(&stream);
}
