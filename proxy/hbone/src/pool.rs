//! The tunnel client: a pool of HTTP/2 connections per [`PoolKey`], each carrying many
//! CONNECT streams.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use h2::Reason;
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Notify;
use tracing::{debug, Instrument};

use crate::conn::{Conn, ConnState, Counters, StreamGuard};
use crate::dialled::{Dialled, IntoDialled};
use crate::error::HboneError;
use crate::headers::{ConnectHeaders, TraceParent};
use crate::stream::HboneStream;

/// Pool settings; [`Default`] is the reference mesh's.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// Streams per HTTP/2 connection before a new connection is opened.
    pub max_streams_per_conn: usize,
    /// A connection without streams for this long is closed.
    pub idle_timeout: Duration,
    /// A connection without streams while another live connection of its
    /// key stays is closed after this shorter time: after a burst that
    /// took several connections, one per key stays warm for
    /// [`PoolConfig::idle_timeout`] and the others (their HTTP/2 stream
    /// tables and buffers sized for the burst, at both ends) are given back.
    pub surplus_idle_timeout: Duration,
    /// HTTP/2 PING period.
    pub ping_interval: Duration,
    /// Close a connection whose PING is unanswered this long.
    pub ping_timeout: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            max_streams_per_conn: 100,
            idle_timeout: Duration::from_secs(5 * 60),
            surplus_idle_timeout: Duration::from_secs(10),
            ping_interval: crate::PING_INTERVAL,
            ping_timeout: crate::PING_TIMEOUT,
        }
    }
}

/// Which connections may carry a tunnel: the same source identity, expected destination
/// identity (checked by the caller's TLS), source IP and destination `ip:15008`, dialled
/// under the same trusted roots.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    /// SPIFFE id the client presents.
    pub src_identity: String,
    /// SPIFFE id the server must present.
    pub dst_identity: String,
    /// Source IP the connection is made from.
    pub src_ip: IpAddr,
    /// The destination pod's HBONE address (`ip:15008`).
    pub dst: SocketAddr,
    /// The generation of the trusted roots the caller dials under (bumped
    /// when a root stops being trusted): a connection whose server was
    /// checked against a root since removed carries no new tunnel, and
    /// closes once idle.
    pub trust_generation: u64,
}

/// A pool of HBONE connections. Cheap to clone; clones share connections.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    config: PoolConfig,
    slots: Mutex<HashMap<PoolKey, Arc<Slot>>>,
    counters: Arc<Counters>,
}

/// The connections of one key, and the lock held while dialing a new one.
#[derive(Default)]
struct Slot {
    dial_lock: tokio::sync::Mutex<()>,
    conns: Mutex<Vec<Arc<Conn>>>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.shared.config)
            .field("connections", &self.connections())
            .field("streams", &self.streams())
            .finish()
    }
}

enum OpenError {
    /// The peer did not process the stream (GOAWAY, REFUSED_STREAM): safe on another conn.
    Retryable(h2::Error),
    Fatal(HboneError),
}

fn classify(e: h2::Error) -> OpenError {
    if e.is_go_away() || e.reason() == Some(Reason::REFUSED_STREAM) {
        OpenError::Retryable(e)
    } else {
        OpenError::Fatal(HboneError::Connection(e))
    }
}

impl Pool {
    /// An empty pool.
    pub fn new(config: PoolConfig) -> Self {
        assert!(
            config.max_streams_per_conn > 0,
            "max_streams_per_conn must be > 0"
        );
        Pool {
            shared: Arc::new(Shared {
                config,
                slots: Mutex::new(HashMap::new()),
                counters: Arc::new(Counters::default()),
            }),
        }
    }

    /// Open HTTP/2 connections (including ones draining after GOAWAY).
    pub fn connections(&self) -> usize {
        self.shared.counters.connections.load(Ordering::Relaxed)
    }

    /// Open tunnel streams (including ones being opened).
    pub fn streams(&self) -> usize {
        self.shared.counters.streams.load(Ordering::Relaxed)
    }

    /// HTTP/2 connections opened since the pool was made.
    pub fn connections_opened(&self) -> u64 {
        self.shared.counters.opened.load(Ordering::Relaxed)
    }

    /// How many of `key`'s pooled connections would take a new stream now:
    /// not retired, and their peer has neither sent GOAWAY nor failed (as
    /// far as the connection task has read). Lets an observer (a test of a
    /// drain) wait until the client has seen a GOAWAY instead of guessing.
    pub fn accepting_connections(&self, key: &PoolKey) -> usize {
        let Some(slot) = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
        else {
            return 0;
        };
        let conns: Vec<_> = slot.conns.lock().unwrap_or_else(|p| p.into_inner()).clone();
        conns
            .iter()
            .filter(|conn| {
                if conn.state.lock().unwrap_or_else(|p| p.into_inner()).dead {
                    return false;
                }
                // A clone has no pending stream: polling it only checks the
                // connection's error (set by a received GOAWAY) and registers
                // no waker worth keeping.
                let mut send = conn.send.clone();
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                !matches!(send.poll_ready(&mut cx), std::task::Poll::Ready(Err(_)))
            })
            .count()
    }

    /// The keys that have a live connection now (for a record of the
    /// tunnels in use that a successor proxy warms, see
    /// `ringway_proxy::tunnel::warm`).
    pub fn keys(&self) -> Vec<PoolKey> {
        let slots = self.shared.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .iter()
            .filter(|(_, s)| !s.conns.lock().unwrap_or_else(|p| p.into_inner()).is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Dials a connection for `key` ahead of any stream (a warm-up) unless
    /// one is pooled already and `extra` is false: `Ok(true)` when it
    /// dialled. The connection then waits idle in the pool like one whose
    /// streams have ended (after those pooled before it: a stream takes it
    /// when they are full or gone).
    pub async fn warm<D, F, T, IO>(
        &self,
        key: PoolKey,
        dial: D,
        extra: bool,
    ) -> Result<bool, HboneError>
    where
        D: FnOnce() -> F,
        F: Future<Output = io::Result<T>>,
        T: IntoDialled<Io = IO>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let slot = self.slot(&key);
        let _lock = slot.dial_lock.lock().await;
        if !extra && self.reserve(&slot).is_some() {
            return Ok(false);
        }
        self.dial_new(&key, &slot, dial).await.map(|_guard| true)
    }

    /// Closes every connection whose key matches `evict` now (their streams
    /// are reset), e.g. those dialled from a pod that is gone. Returns how
    /// many were closed.
    pub fn evict(&self, evict: impl Fn(&PoolKey) -> bool) -> usize {
        let slots: Vec<Arc<Slot>> = self
            .shared
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(k, _)| evict(k))
            .map(|(_, s)| s.clone())
            .collect();
        let mut n = 0;
        for slot in slots {
            let conns: Vec<_> = slot.conns.lock().unwrap_or_else(|p| p.into_inner()).clone();
            for conn in conns {
                retire(&slot, &conn);
                // `notify_one` stores a permit: the task sees it even if it
                // is not waiting yet.
                conn.close.notify_one();
                n += 1;
            }
        }
        n
    }

    /// Opens a tunnel to `req.authority` through the peer proxy of `key`. Reuses a pooled
    /// connection with a free stream slot; otherwise, holding the key's lock, calls `dial`
    /// (TCP + TLS to `key.dst`, done by the caller) at most once and handshakes HTTP/2.
    /// A stream the peer did not process (GOAWAY, REFUSED_STREAM) on a pooled connection
    /// is retried on another one.
    ///
    /// Flows of the same key wait for a dial in progress, so give `dial` a timeout. Dropping
    /// the returned future releases its stream slot (and abandons a dial it was running).
    pub async fn connect<D, F, T, IO>(
        &self,
        key: PoolKey,
        dial: D,
        req: ConnectHeaders,
    ) -> Result<HboneStream, HboneError>
    where
        D: FnOnce() -> F,
        F: Future<Output = io::Result<T>>,
        T: IntoDialled<Io = IO>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        self.connect_with_data(key, dial, req, Bytes::new()).await
    }

    /// [`Pool::connect`], with `first` (the client's bytes already read,
    /// may be empty) sent as DATA right behind the CONNECT's HEADERS, in the
    /// same write, instead of after the peer's `200`: a client that speaks
    /// first (HTTP, TLS) saves one tunnel round trip and one TLS record per
    /// connection. The peer holds the bytes in the stream's window until it
    /// has connected to the app; a refused stream drops them (the caller
    /// resets its client, as without them), a retried one sends them again.
    pub async fn connect_with_data<D, F, T, IO>(
        &self,
        key: PoolKey,
        dial: D,
        mut req: ConnectHeaders,
        first: Bytes,
    ) -> Result<HboneStream, HboneError>
    where
        D: FnOnce() -> F,
        F: Future<Output = io::Result<T>>,
        T: IntoDialled<Io = IO>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // One trace id per connection, kept across retries.
        req.traceparent.get_or_insert_with(TraceParent::random);
        // Built (and so validated) before touching the network, once: a
        // retry on another connection builds it again.
        let mut request = Some(req.to_request()?);
        let slot = self.slot(&key);
        let mut dial = Some(dial);
        loop {
            let (guard, fresh) = match self.reserve(&slot) {
                Some(g) => (g, false),
                None => {
                    let _lock = slot.dial_lock.lock().await;
                    match self.reserve(&slot) {
                        Some(g) => (g, false),
                        None => {
                            // Unreachable in practice: after a dial we never loop.
                            let Some(dial) = dial.take() else {
                                return Err(HboneError::Refused(Reason::REFUSED_STREAM.into()));
                            };
                            (self.dial_new(&key, &slot, dial).await?, true)
                        }
                    }
                }
            };
            let conn = guard.conn.clone();
            let request = match request.take() {
                Some(r) => r,
                None => req.to_request()?,
            };
            match open_stream(guard, request, first.clone()).await {
                Ok(s) => return Ok(s),
                Err(OpenError::Retryable(e)) => {
                    debug!(conn = conn.id, error = %e, "stream refused, connection retired");
                    retire(&slot, &conn);
                    if fresh {
                        return Err(HboneError::Refused(e));
                    }
                }
                Err(OpenError::Fatal(e)) => {
                    // A connection-level failure (not one stream's reset) retires it.
                    if matches!(&e, HboneError::Connection(h) if !h.is_reset()) {
                        retire(&slot, &conn);
                    }
                    return Err(e);
                }
            }
        }
    }

    fn slot(&self, key: &PoolKey) -> Arc<Slot> {
        let mut slots = self.shared.slots.lock().unwrap_or_else(|p| p.into_inner());
        // A pooled key (every stream but a destination's first) is found
        // without copying its identities.
        if let Some(slot) = slots.get(key) {
            return slot.clone();
        }
        slots.entry(key.clone()).or_default().clone()
    }

    /// Takes a stream slot on the fullest live connection that has room.
    fn reserve(&self, slot: &Slot) -> Option<StreamGuard> {
        let conns = slot.conns.lock().unwrap_or_else(|p| p.into_inner());
        let max = self.shared.config.max_streams_per_conn;
        for conn in conns.iter() {
            let mut st = conn.state.lock().unwrap_or_else(|p| p.into_inner());
            if !st.dead && st.active < max {
                st.active += 1;
                st.idle_since = None;
                self.shared.counters.streams.fetch_add(1, Ordering::Relaxed);
                return Some(StreamGuard::new(conn.clone(), self.shared.counters.clone()));
            }
        }
        None
    }

    async fn dial_new<D, F, T, IO>(
        &self,
        key: &PoolKey,
        slot: &Arc<Slot>,
        dial: D,
    ) -> Result<StreamGuard, HboneError>
    where
        D: FnOnce() -> F,
        F: Future<Output = io::Result<T>>,
        T: IntoDialled<Io = IO>,
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Dialled { io, move_on } = dial().await.map_err(HboneError::Dial)?.into_dialled();
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(crate::STREAM_WINDOW)
            .initial_connection_window_size(crate::CONNECTION_WINDOW)
            .max_frame_size(crate::MAX_FRAME_SIZE)
            .max_send_buffer_size(crate::MAX_FRAME_SIZE as usize)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await
            .map_err(HboneError::Handshake)?;
        let counters = &self.shared.counters;
        let id = counters.opened.fetch_add(1, Ordering::Relaxed) + 1;
        counters.connections.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            send,
            state: Mutex::new(ConnState {
                active: 1,
                dead: false,
                idle_since: None,
            }),
            idle: Notify::new(),
            close: Notify::new(),
        });
        counters.streams.fetch_add(1, Ordering::Relaxed);
        let guard = StreamGuard::new(conn.clone(), counters.clone());
        slot.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(conn.clone());
        debug!(conn = id, dst = %key.dst, dst.id = %key.dst_identity, "hbone connection opened");

        let config = self.shared.config.clone();
        let ping = connection.ping_pong().expect("ping_pong is taken once");
        let task_slot = slot.clone();
        let task_counters = counters.clone();
        let shared = Arc::downgrade(&self.shared);
        let key = key.clone();
        let span = tracing::debug_span!("hbone.conn", conn = id, dst.addr = %key.dst);
        crate::spawn::spawn(
            async move {
                let keepalive = crate::keepalive(ping, config.ping_interval, config.ping_timeout);
                let idle = idle_watch(&conn, &task_slot, &config);
                let expiry = move_on_when_due(move_on, &conn, &task_slot);
                tokio::select! {
                    r = &mut connection => debug!(result = ?r.err(), "hbone connection closed"),
                    never = expiry => match never {},
                    e = keepalive => debug!(error = %e, "hbone connection failed"),
                    _ = idle => debug!("idle hbone connection released"),
                    _ = conn.close.notified() => debug!("hbone connection evicted"),
                }
                retire(&task_slot, &conn);
                drop(connection);
                task_counters.connections.fetch_sub(1, Ordering::Relaxed);
                forget_slot(shared, &key, task_slot);
            }
            .instrument(span),
        );
        Ok(guard)
    }
}

/// Marks a connection dead and removes it from its slot (no new streams on it).
fn retire(slot: &Slot, conn: &Arc<Conn>) {
    conn.state.lock().unwrap_or_else(|p| p.into_inner()).dead = true;
    slot.conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|c| !Arc::ptr_eq(c, conn));
}

/// At `move_on` (shortly before the first of the connection's
/// certificates expires, see [`crate::move_on_at`]), retires it (its open streams go
/// on; the next stream of its key dials a new connection, authenticated
/// with the certificates in force then) and wakes its idle watch, which
/// closes it once its streams are done. Never resolves.
async fn move_on_when_due(
    move_on: Option<tokio::time::Instant>,
    conn: &Arc<Conn>,
    slot: &Slot,
) -> std::convert::Infallible {
    if let Some(at) = move_on {
        tokio::time::sleep_until(at).await;
        debug!("certificate expiring: hbone connection takes no new stream");
        retire(slot, conn);
        conn.idle.notify_one();
    }
    std::future::pending().await
}

/// Drops the key's slot from the map when it holds no connection and nobody else uses it.
fn forget_slot(shared: Weak<Shared>, key: &PoolKey, slot: Arc<Slot>) {
    let Some(shared) = shared.upgrade() else {
        return;
    };
    let mut slots = shared.slots.lock().unwrap_or_else(|p| p.into_inner());
    let empty = slot
        .conns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty();
    // References: the map's and ours. Any caller in `connect` holds another.
    if empty && Arc::strong_count(&slot) == 2 {
        slots.remove(key);
    }
}

/// Resolves once the connection has had no stream for its idle timeout: the
/// pool's [`PoolConfig::idle_timeout`], or [`PoolConfig::surplus_idle_timeout`]
/// while another live connection of its key stays or once it takes no new
/// stream itself (retired). It is then marked dead
/// under the slot's and its state's locks (the order [`Pool::reserve`] takes
/// them), so no stream can be reserved on it afterwards, and of two idle
/// connections of a key deciding at once one sees the other dead and stays.
async fn idle_watch(conn: &Conn, slot: &Slot, config: &PoolConfig) {
    loop {
        let notified = conn.idle.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let deadline = {
            let conns = slot.conns.lock().unwrap_or_else(|p| p.into_inner());
            let mut st = conn.state.lock().unwrap_or_else(|p| p.into_inner());
            let surplus = st.dead
                || conns.iter().any(|c| {
                    !std::ptr::eq(Arc::as_ptr(c), conn)
                        && !c.state.lock().unwrap_or_else(|p| p.into_inner()).dead
                });
            let timeout = if surplus {
                config.surplus_idle_timeout.min(config.idle_timeout)
            } else {
                config.idle_timeout
            };
            match st.idle_since {
                Some(t) if st.active == 0 && t.elapsed() >= timeout => {
                    st.dead = true;
                    return;
                }
                Some(t) if st.active == 0 => Some(t + timeout),
                _ => None,
            }
        };
        match deadline {
            Some(d) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(d) => {}
                    _ = &mut notified => {}
                }
            }
            None => notified.await,
        }
    }
}

async fn open_stream(
    guard: StreamGuard,
    request: http::Request<()>,
    first: Bytes,
) -> Result<HboneStream, OpenError> {
    let send = guard.conn.send.clone();
    let mut send = send.ready().await.map_err(classify)?;
    let (response, mut send_stream) = send.send_request(request, false).map_err(classify)?;
    let sent_first = first.len();
    if !first.is_empty() {
        // Queued behind the HEADERS before the connection task runs, so
        // both leave in one write; h2 asks the window for them itself.
        send_stream.send_data(first, false).map_err(classify)?;
    }
    let response = response.await.map_err(classify)?;
    match response.status() {
        StatusCode::OK => Ok(
            HboneStream::new(send_stream, response.into_body(), Some(guard))
                .with_sent_first(sent_first),
        ),
        status => Err(OpenError::Fatal(HboneError::from_status(status))),
    }
}
