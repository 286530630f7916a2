//! HBONE in the datapath: captured outbound connections to tunnel workloads
//! leave as HTTP/2 CONNECT streams over mutual TLS to the destination pod's
//! port 15008, and the tunnel listener (15008) of every pod terminates them.
//!
//! rustls and h2 need `AsyncRead + AsyncWrite` streams; the datapath's own
//! sockets are raw fds driven by io_uring polls (or epoll) and spliced. The
//! adapter is the simplest one that exists on both backends: every worker
//! runtime (tokio-uring, or the epoll fallback) carries a current-thread tokio
//! reactor, so the tunnel's sockets are registered as `tokio::net::TcpStream`
//! there and bytes are copied through user space (TLS has to see them anyway).
//! See ARCHITECTURE.md ("HBONE") for its cost.
//!
//! HBONE is on only when the proxy has an identity manager
//! ([`crate::Proxy::set_identity`]) and a mesh ([`crate::Proxy::set_mesh`]);
//! without them every connection takes the plaintext path as before.

use std::borrow::Cow;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use ringway_config::authz::{self, ConnInfo, Identity};
use ringway_config::{HboneSettings, Mesh, ProxySettings, Workload};
use ringway_hbone::{
    Baggage, ConnectHeaders, ConnectRequest, Decision, DrainSignal, DrainTrigger, PeerInfo, Pool,
    PoolKey, Upstream,
};
use ringway_identity::IdentityManager;
use tokio::net::{TcpSocket, TcpStream};

use crate::copy::Meter;
use crate::flows::{self, FlowAuthz};
use crate::metrics::{
    DstService, HboneRefusal, Metrics, Peer, Series, SeriesKey, ServiceRef, Side,
};
use crate::sock;
use crate::stats::Stats;
use crate::sys;
use crate::worker::PodShared;

/// Read buffer under each tunnel's TLS: rustls reads one record (16 KiB) per
/// call; through this, one syscall brings several. Held by an HTTP/2
/// connection only while it has bytes TLS has not taken (see [`LazyBufIo`]).
const TLS_READ_BUF: usize = 256 * 1024;

/// Errors of the tunnel datapath, by the side that failed.
#[derive(Debug, thiserror::Error)]
pub enum TunnelError {
    /// The tunnel's pod has no identity to serve with.
    #[error("this pod has no workload identity (not in the mesh, and the agent sent none)")]
    NoLocalIdentity,
    /// HBONE is off (no identity manager or no mesh).
    #[error("HBONE is not configured")]
    Disabled,
    /// A certificate or TLS config could not be made.
    #[error("identity: {0}")]
    Identity(#[from] ringway_identity::IdentityError),
    /// The tunnel (dial, TLS, HTTP/2, the peer's answer) failed.
    #[error("tunnel: {0}")]
    Hbone(#[from] ringway_hbone::HboneError),
    /// A socket operation failed.
    #[error("socket: {0}")]
    Io(#[from] io::Error),
    /// The tunnel listener refused the connection before authentication.
    #[error("refused before authentication: {0}")]
    Refused(&'static str),
}

/// The identity manager and the mesh in force (either may be unset).
type Current = (Option<Arc<IdentityManager>>, Option<Arc<Mesh>>);

/// What every worker shares about HBONE: the identity manager and the mesh
/// snapshot (both swappable), and the drain trigger of tunnel servers.
#[derive(Debug)]
pub struct TunnelState {
    /// Where tunnel handshakes, streams and denials are counted.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The identity manager and the mesh, swapped together under one lock
    /// (read once per connection).
    current: RwLock<Current>,
    drain: DrainTrigger,
    signal: DrainSignal,
    /// The limits of the tunnel listener (`proxy.hbone`).
    pub limits: HboneSettings,
    /// Bound on connecting to the app in a pod (`proxy.connectTimeout`, as
    /// on the plaintext path).
    pub connect_timeout: Duration,
    /// Ports a CONNECT may never target in a pod: the proxy's listeners
    /// and `limits.reserved_ports`.
    proxy_ports: Vec<u16>,
    /// Where server TLS handshakes run (set once by the proxy at start;
    /// without it the tunnel listener refuses every connection).
    handshaker: std::sync::OnceLock<crate::handshake::Handshaker>,
    /// Woken at every new mesh: connections waiting for their pod's
    /// workload look again ([`TunnelState::mesh_knowing`]).
    mesh_changed: tokio::sync::Notify,
    /// How long they wait (`proxy.workloadWait`).
    workload_wait: Duration,
}

/// A pod's connection came while the mesh (fed by a control plane) did not
/// know the pod's workload, and it did not arrive in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownWorkload {
    /// How long the connection waited.
    pub waited: Duration,
}

impl std::fmt::Display for UnknownWorkload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the control plane has not sent the pod's workload (waited {:?})",
            self.waited
        )
    }
}

/// A pod's tunnel connections before authentication (TLS and the HTTP/2
/// preface not yet through), in total and per source; one per pod, shared
/// by every worker serving it. While the pod is at its cap its listeners
/// stop accepting ([`PreauthSlots::room`]): what comes beyond waits in the
/// kernel's backlog and costs the proxy nothing, rather than being accepted
/// only to be reset.
#[derive(Debug, Default)]
pub struct PreauthSlots {
    counts: std::sync::Mutex<PodPreauth>,
    /// Woken when a place comes free (and when the pod goes).
    freed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct PodPreauth {
    total: u32,
    by_source: std::collections::HashMap<IpAddr, u32>,
}

impl PreauthSlots {
    /// How many connections of the pod are before authentication.
    pub fn held(&self) -> u32 {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// Returns once the pod has fewer than `per_pod` connections before
    /// authentication, or `gone` says its listeners are closing (checked on
    /// every place freed and on [`PreauthSlots::wake_all`], which closing a
    /// pod's listeners calls). Cancel-safe.
    pub async fn room(&self, per_pod: u32, gone: impl Fn() -> bool) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check: a place freed in between wakes it.
            freed.as_mut().enable();
            if self.held() < per_pod || gone() {
                return;
            }
            freed.await;
        }
    }

    /// Wakes every listener waiting for a place (the pod is going).
    pub fn wake_all(&self) {
        self.freed.notify_waiters();
    }
}

/// One admitted pre-authentication connection; dropping it (once the
/// preface arrived, or the connection ended) gives the place back.
#[derive(Debug)]
pub struct PreauthGuard {
    slots: Arc<PreauthSlots>,
    src: IpAddr,
}

impl Drop for PreauthGuard {
    fn drop(&mut self) {
        {
            let mut p = self.slots.counts.lock().unwrap_or_else(|p| p.into_inner());
            p.total = p.total.saturating_sub(1);
            if let Some(n) = p.by_source.get_mut(&self.src) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    p.by_source.remove(&self.src);
                }
            }
        }
        // One place, one waiting listener (a stored permit when none waits
        // costs one extra check later).
        self.slots.freed.notify_one();
    }
}

/// Admits one more connection of `src` to the pod of `slots` before
/// authentication, or names the cap it would pass.
pub fn admit_preauth(
    state: &TunnelState,
    slots: &Arc<PreauthSlots>,
    src: IpAddr,
) -> Result<PreauthGuard, HboneRefusal> {
    let src = src.to_canonical();
    let mut p = slots.counts.lock().unwrap_or_else(|p| p.into_inner());
    if p.total >= state.limits.max_preauth_per_pod {
        return Err(HboneRefusal::PerPod);
    }
    let n = p.by_source.entry(src).or_default();
    if *n >= state.limits.max_preauth_per_source {
        return Err(HboneRefusal::PerSource);
    }
    *n += 1;
    p.total += 1;
    Ok(PreauthGuard {
        slots: slots.clone(),
        src,
    })
}

impl TunnelState {
    /// A state counting into `metrics`, with HBONE off until configured,
    /// holding the tunnel limits of `settings`.
    pub fn new(metrics: Arc<crate::metrics::Metrics>, settings: &ProxySettings) -> Self {
        let (drain, signal) = ringway_hbone::drain_channel();
        let p = settings.ports;
        let mut proxy_ports = vec![p.outbound, p.inbound, p.tunnel];
        proxy_ports.extend(&settings.hbone.reserved_ports);
        TunnelState {
            metrics,
            current: RwLock::new((None, None)),
            drain,
            signal,
            limits: settings.hbone.clone(),
            connect_timeout: settings.connect_timeout,
            proxy_ports,
            handshaker: std::sync::OnceLock::new(),
            mesh_changed: tokio::sync::Notify::new(),
            workload_wait: settings.workload_wait,
        }
    }

    /// Sets the handshake thread server TLS handshakes run on (once).
    pub fn set_handshaker(&self, h: crate::handshake::Handshaker) {
        let _ = self.handshaker.set(h);
    }

    /// Tells the handshake thread to stop (the proxy is stopping).
    pub fn stop_handshaker(&self) {
        if let Some(h) = self.handshaker.get() {
            h.stop();
        }
    }

    /// Counts one refusal of the tunnel listener.
    pub fn refused(&self, why: HboneRefusal) {
        self.metrics
            .hbone_refused
            .get_or_create(&crate::metrics::RefusedLabels {
                reason: why.label(),
            })
            .inc();
    }
}

impl TunnelState {
    /// Sets (or clears) the identity manager.
    pub fn set_identity(&self, ids: Option<Arc<IdentityManager>>) {
        self.current.write().unwrap_or_else(|p| p.into_inner()).0 = ids;
    }

    /// Publishes a new mesh snapshot (hot reload); open connections keep theirs.
    pub fn set_mesh(&self, mesh: Arc<Mesh>) {
        self.current.write().unwrap_or_else(|p| p.into_inner()).1 = Some(mesh);
        self.mesh_changed.notify_waiters();
    }

    /// The mesh to serve a connection of `pod` under: the one in force when
    /// it knows the pod's workload (or is the whole mesh, or there is none),
    /// else the first one that does within `proxy.workloadWait`. `Err` when
    /// none did: the caller refuses the connection.
    pub async fn mesh_knowing(
        &self,
        pod: &PodShared,
    ) -> Result<Option<Arc<Mesh>>, UnknownWorkload> {
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + self.workload_wait;
        loop {
            // Registered before looking, so a mesh published in between
            // still wakes it.
            let changed = self.mesh_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mesh = self.mesh();
            match &mesh {
                None => return Ok(None),
                Some(m) if m.is_complete() || pod.workload(m).is_some() => return Ok(mesh),
                Some(_) => {}
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(UnknownWorkload {
                    waited: started.elapsed(),
                });
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Current> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The identity manager, when HBONE is configured.
    pub fn identity(&self) -> Option<Arc<IdentityManager>> {
        self.read().0.clone()
    }

    /// The current mesh snapshot.
    pub fn mesh(&self) -> Option<Arc<Mesh>> {
        self.read().1.clone()
    }

    /// Both, when HBONE is on.
    pub fn enabled(&self) -> Option<(Arc<IdentityManager>, Arc<Mesh>)> {
        let cur = self.read();
        Some((cur.0.clone()?, cur.1.clone()?))
    }

    /// Tunnel servers send GOAWAY and finish their streams.
    pub fn drain(&self) {
        self.drain.drain();
    }
}

/// A pod's SPIFFE identity: from the agent's record when it names both the
/// namespace and the service account, else the mesh's workload of the pod's
/// IPs (when the agent named a namespace, only a workload of that namespace).
/// Never a guess: `None` (no certificate, no HBONE for the pod) when neither
/// says it.
pub fn pod_identity(mesh: &Mesh, pod: &PodShared) -> Option<Identity> {
    let td = mesh.trust_domain();
    let namespace = {
        let who = pod.who.read().unwrap_or_else(|p| p.into_inner());
        if !who.0.namespace.is_empty() && !who.0.service_account.is_empty() {
            return Some(Identity::new(td, &who.0.namespace, &who.0.service_account));
        }
        who.0.namespace.clone()
    };
    let w = pod.ips.iter().find_map(|ip| mesh.workload_by_ip(*ip))?;
    if w.service_account.is_empty() {
        // A pod without a service account has no identity.
        return None;
    }
    if !namespace.is_empty() && w.namespace != namespace {
        tracing::warn!(pod.uid = %pod.uid, pod.namespace = %namespace, workload.namespace = %w.namespace,
            "the agent sent no service account and the mesh's workload of the pod's IPs is of another namespace: no identity");
        return None;
    }
    Some(w.identity(td))
}

/// The workload of a pod for authorization: the mesh's; where the mesh is
/// the whole truth (the configuration file) and does not list the pod, one
/// made from what the agent told us; `None` where a control plane feeds the
/// mesh and has not sent it (its labels and policies are unknown: never
/// authorize against a guess).
pub(crate) fn pod_workload<'m>(mesh: &'m Mesh, pod: &PodShared) -> Option<Cow<'m, Workload>> {
    if let Some(w) = pod.ips.iter().find_map(|ip| mesh.workload_by_ip(*ip)) {
        // Borrowed: authorizing a connection copies nothing.
        return Some(Cow::Borrowed(w));
    }
    if !mesh.is_complete() {
        return None;
    }
    let who = pod.who.read().unwrap_or_else(|p| p.into_inner());
    Some(Cow::Owned(Workload {
        uid: pod.uid.to_string(),
        name: who.0.name.clone(),
        namespace: who.0.namespace.clone(),
        service_account: who.0.service_account.clone(),
        ips: pod.ips.clone(),
        node: String::new(),
        tunnel: true,
        healthy: true,
        labels: Default::default(),
        locality: Default::default(),
        workload_name: who.0.name.clone(),
        trust_domain: None,
        canonical: None,
        unsupported: None,
        authorization_policies: Vec::new(),
    }))
}

/// How an outbound connection will be tunnelled.
#[derive(Debug)]
pub struct OutboundPlan {
    /// The original destination (`:authority`).
    pub dst: SocketAddr,
    /// The destination pod's name (the access log's; not the whole
    /// workload, which a connection would copy with its labels).
    pub dst_name: String,
    /// What the source presents.
    pub src_identity: Identity,
    /// What the destination must present.
    pub dst_identity: Identity,
    /// The service the client connected to (its VIP), if any: the
    /// `forwarded` header's `host=`.
    pub service: Option<DstService>,
    ids: Arc<IdentityManager>,
}

/// Whether a captured outbound connection to `dst` goes over HBONE: the
/// destination is a mesh workload speaking the tunnel and the source pod has
/// an identity.
pub fn outbound_plan(
    state: &TunnelState,
    pod: &PodShared,
    dst: SocketAddr,
) -> Option<OutboundPlan> {
    let (ids, mesh) = state.enabled()?;
    let w = mesh.workload_by_ip(dst.ip().to_canonical())?;
    if !w.tunnel {
        return None;
    }
    let src_identity = pod_identity(&mesh, pod)?;
    let dst_identity = w.identity(mesh.trust_domain());
    Some(OutboundPlan {
        dst,
        dst_name: w.name.clone(),
        src_identity,
        dst_identity,
        service: None,
        ids,
    })
}

/// Authorizes a plaintext inbound connection (no identity) to `pod`.
/// `Ok(Some(..))`: allowed by the mesh's policies (the flow is to be
/// registered for re-checks); `Ok(None)`: no mesh, nothing to check;
/// `Err(reason)`: denied.
pub fn authorize_plaintext(
    state: &TunnelState,
    pod: &PodShared,
    src: IpAddr,
    dst: SocketAddr,
) -> Result<Option<FlowAuthz>, String> {
    let Some(mesh) = state.mesh() else {
        return Ok(None);
    };
    authorize(&state.metrics, &mesh, pod, src, None, dst, "plaintext").map(Some)
}

/// Authorizes a same-node connection from pod `src_pod` (whose identity the
/// proxy knows first hand: it captured the connection in that pod's netns)
/// to `dst_pod`, as `dst_pod`'s inbound side would.
pub fn authorize_local(
    metrics: &Metrics,
    mesh: &Arc<Mesh>,
    src_pod: &PodShared,
    src_ip: IpAddr,
    dst_pod: &PodShared,
    dst: SocketAddr,
) -> Result<FlowAuthz, String> {
    let id = pod_identity(mesh, src_pod);
    authorize(metrics, mesh, dst_pod, src_ip, id, dst, "local")
}

fn authorize(
    metrics: &Metrics,
    mesh: &Arc<Mesh>,
    pod: &PodShared,
    src_ip: IpAddr,
    src_identity: Option<Identity>,
    dst: SocketAddr,
    path: &'static str,
) -> Result<FlowAuthz, String> {
    let (dst_ip, dst_port) = (dst.ip().to_canonical(), dst.port());
    let Some(w) = pod_workload(mesh, pod) else {
        return Err(format!(
            "the control plane has not sent the workload of pod {}: refused, never authorized against a guess",
            pod.uid
        ));
    };
    if let Some(u) = &w.unsupported {
        return Err(format!("workload {}/{}: {u}", w.namespace, w.name));
    }
    let d = authz::evaluate(
        mesh,
        &ConnInfo {
            src_ip,
            src_identity: src_identity.as_ref(),
            dst_workload: &w,
            dst_ip,
            dst_port,
        },
    );
    let conn = ConnInfo {
        src_ip,
        src_identity: src_identity.as_ref(),
        dst_workload: &w,
        dst_ip,
        dst_port,
    };
    if let Some(shadow) = authz::evaluate_dry_run(mesh, &conn, &d) {
        let decision = if shadow.is_allowed() {
            "would_allow"
        } else {
            "would_deny"
        };
        metrics
            .dry_run
            .get_or_create(&crate::metrics::DryRunLabels { decision })
            .inc();
        tracing::info!(target: "access", path, src.addr = %src_ip, dst.addr = %dst,
            enforced = %d, dry_run = %shadow, "a dry-run policy would change this verdict (not enforced)");
    }
    if d.is_allowed() {
        Ok(FlowAuthz {
            src_ip,
            src_identity,
            dst_port,
            dst_ip,
            path,
            decided_with: mesh.clone(),
        })
    } else {
        Err(d.to_string())
    }
}

/// A nonblocking socket made inside `pod`'s netns (proxy mark, optionally
/// spoofing `spoof` as its source), connected through the tokio reactor.
async fn connect_in_pod(
    pod: &PodShared,
    mark: u32,
    dst: SocketAddr,
    spoof: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let fd = sys::in_netns(pod.netns.as_fd(), || {
        sock::make_upstream(dst, mark, spoof, pod.ports)
    })??;
    let sock = TcpSocket::from_std_stream(std::net::TcpStream::from(fd));
    match tokio::time::timeout(timeout, sock.connect(dst)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    }
}

/// The accepted client socket as a tokio stream (the adapter).
pub fn adopt(fd: OwnedFd) -> io::Result<TcpStream> {
    TcpStream::from_std(adopt_std(fd)?)
}

/// The accepted client socket, non-blocking, registered with no reactor
/// yet (it is handed to the handshake thread).
pub fn adopt_std(fd: OwnedFd) -> io::Result<std::net::TcpStream> {
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    Ok(std)
}

/// How much TLS may hold of records not yet written to the socket. rustls'
/// default (64 KiB) is less than one HTTP/2 DATA frame of a full read
/// ([`READ_CHUNK`], 256 KiB) with its 9-byte header and 16 records' 22
/// bytes of framing each, which would then take several `writev`s and a
/// tiny TLS record per frame; with this a frame is one. Bounded per HTTP/2
/// connection, and held only while the socket is full.
const TLS_WRITE_LIMIT: usize = 256 * 1024 + 1024;

/// Spare TLS read buffers kept per worker thread (more are freed).
const SPARE_TLS_BUFS: usize = 4;

thread_local! {
    /// TLS read buffers not holding bytes of any connection: a connection
    /// holds one only while it has read bytes that TLS has not taken yet.
    static SPARE_BUFS: std::cell::RefCell<Vec<bytes::BytesMut>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty buffer with room for [`TLS_READ_BUF`] bytes: a spare when the
/// worker has one, else a new allocation, never zeroed (the socket's bytes
/// are read into its spare capacity).
fn take_tls_buf() -> bytes::BytesMut {
    let mut buf = SPARE_BUFS
        .with(|s| s.borrow_mut().pop())
        .unwrap_or_default();
    // A spare is empty, so this only moves its start back (no allocation);
    // a new one is allocated here, uninitialised.
    buf.reserve(TLS_READ_BUF);
    buf
}

fn give_tls_buf(mut buf: bytes::BytesMut) {
    if buf.capacity() == 0 {
        return;
    }
    buf.clear();
    // During thread exit the spares may be gone already: then it is freed.
    let _ = SPARE_BUFS.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE_TLS_BUFS {
            s.push(buf);
        }
    });
}

/// A tunnel socket under TLS: reads go straight to the socket until
/// [`LazyBufIo::buffer`] (on the server side: after the handshake), then
/// through a [`TLS_READ_BUF`] buffer taken from the worker's spares for one
/// read and given back as soon as TLS has taken every byte of it. An idle
/// tunnel, and one that never authenticates, holds no read buffer.
#[derive(Debug)]
pub struct LazyBufIo<T = TcpStream> {
    tcp: T,
    buffered: bool,
    /// Bytes read from the socket that TLS has not taken yet (none: no
    /// buffer held).
    buf: bytes::BytesMut,
}

impl<T> LazyBufIo<T> {
    fn new(tcp: T) -> Self {
        LazyBufIo {
            tcp,
            buffered: false,
            buf: bytes::BytesMut::new(),
        }
    }

    /// Reads through the buffer from now on.
    fn buffer(&mut self) {
        self.buffered = true;
    }

    /// Whether the connection holds a read buffer now (tests).
    pub fn holds_buffer(&self) -> bool {
        self.buf.capacity() > 0
    }
}

impl<T> Drop for LazyBufIo<T> {
    fn drop(&mut self) {
        give_tls_buf(std::mem::take(&mut self.buf));
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for LazyBufIo<T> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        use tokio::io::AsyncReadExt;
        let this = self.get_mut();
        if !this.buffered {
            return std::pin::Pin::new(&mut this.tcp).poll_read(cx, out);
        }
        // (rustls reads at most one record, about 16 KiB, per call: always
        // through the buffer once buffered.)
        if this.buf.is_empty() {
            let mut buf = take_tls_buf();
            match std::pin::pin!(this.tcp.read_buf(&mut buf)).poll(cx) {
                Poll::Ready(Ok(n)) if n > 0 => this.buf = buf,
                other => {
                    // Nothing read (pending, EOF or an error): nothing to keep.
                    give_tls_buf(buf);
                    return other.map_ok(|_| ());
                }
            }
        }
        let n = this.buf.len().min(out.remaining());
        out.put_slice(&this.buf[..n]);
        // Moves the start only (no copy, no allocation).
        bytes::Buf::advance(&mut this.buf, n);
        if this.buf.is_empty() {
            // All taken: the buffer goes back to the worker's spares.
            give_tls_buf(std::mem::take(&mut this.buf));
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for LazyBufIo<T> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

/// Per-connection context the worker hands in.
#[derive(Debug)]
pub struct ConnCtx<'a> {
    /// Datapath counters.
    pub stats: &'a Stats,
    /// Prometheus metrics.
    pub metrics: &'a Metrics,
    /// The proxy's SO_MARK.
    pub mark: u32,
    /// Bound on the TCP connect and on the TLS handshake of a new tunnel
    /// (`proxy.connectTimeout`).
    pub connect_timeout: Duration,
}

/// Copies bytes between the client and its open CONNECT stream, counting
/// them as they move, then logs the connection.
///
/// Counts the open now (in `series`, the source side's) and returns the
/// copy as a future that keeps only what it needs (counter handles and the
/// four names of the access log), so the caller can drop the plan, peers
/// and series before awaiting it: an idle tunnel holds that future for its
/// whole life.
pub fn outbound_pump<'a>(
    cx: ConnCtx<'a>,
    src_peer: &Peer,
    client: TcpStream,
    stream: ringway_hbone::HboneStream,
    plan: &OutboundPlan,
    series: &Series,
    started: Instant,
) -> impl std::future::Future<Output = ()> + 'a {
    series.opened.inc();
    cx.metrics
        .hbone_streams
        .get_or_create(&crate::metrics::TlsLabels {
            side: "client",
            outcome: "ok",
        })
        .inc();
    // Counters advance as bytes move, as on the splice path.
    let up_meter = Meter {
        total: &cx.stats.bytes_to_upstream,
        counters: vec![series.received.clone()],
    };
    let down_meter = Meter {
        total: &cx.stats.bytes_to_client,
        counters: vec![series.sent.clone()],
    };
    let closed = series.closed.clone();
    let names = Box::new([
        src_peer.workload.clone(),
        plan.src_identity.to_string(),
        plan.dst_name.clone(),
        plan.dst_identity.to_string(),
    ]);
    async move {
        let (up, down, end) = pump(client, stream, &up_meter, &down_meter).await;
        closed.inc();
        let [src_workload, src_identity, dst_workload, dst_identity] = *names;
        tracing::event!(
            target: "access",
            tracing::Level::INFO,
            src.workload = %src_workload,
            src.identity = %src_identity,
            dst.workload = %dst_workload,
            dst.identity = %dst_identity,
            bytes.sent = up,
            bytes.received = down,
            duration.ms = started.elapsed().as_millis() as u64,
            end = %end,
            security = "mutual_tls",
            "connection closed"
        );
    }
}

/// Opens a CONNECT stream for `plan`: over a pooled HTTP/2 connection from
/// `pod` to the destination's port 15008, dialled (TCP + mTLS) if needed.
pub async fn open_outbound(
    cx: &ConnCtx<'_>,
    pool: &Pool,
    pod: &PodShared,
    src_peer: &Peer,
    client_addr: SocketAddr,
    plan: &OutboundPlan,
) -> Result<ringway_hbone::HboneStream, TunnelError> {
    let tunnel = SocketAddr::new(plan.dst.ip(), ringway_hbone::HBONE_PORT);
    let src_ip = pod
        .ips
        .iter()
        .copied()
        .find(|ip| ip.is_ipv6() == tunnel.is_ipv6())
        .unwrap_or(client_addr.ip());
    let key = PoolKey {
        src_identity: plan.src_identity.to_string(),
        dst_identity: plan.dst_identity.to_string(),
        src_ip,
        dst: tunnel,
    };
    let (mark, timeout) = (cx.mark, cx.connect_timeout);
    let handshakes = cx.metrics.tls_handshakes.clone();
    // Only a new connection needs the TLS config (a pooled one is reused).
    let dial = move || async move {
        let tls = plan
            .ids
            .client_config(&plan.src_identity, &plan.dst_identity)
            .map_err(io::Error::other)?;
        let tcp = connect_in_pod(pod, mark, tunnel, None, timeout).await?;
        let connector = tokio_rustls::TlsConnector::from(tls);
        let r = match tokio::time::timeout(
            timeout,
            connector.connect(ringway_identity::placeholder_server_name(), {
                let mut io = LazyBufIo::new(tcp);
                io.buffer();
                io
            }),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => Err(crate::metrics::HandshakeTimeout::io(timeout)),
        };
        let r = r.map(|mut tls| {
            tls.get_mut().1.set_buffer_limit(Some(TLS_WRITE_LIMIT));
            tls
        });
        let outcome = match &r {
            Ok(_) => "ok",
            Err(e) => crate::metrics::tls_failure_reason(e),
        };
        handshakes
            .get_or_create(&crate::metrics::TlsLabels {
                side: "client",
                outcome,
            })
            .inc();
        r
    };
    let some = |s: &String| Some(s.clone()).filter(|s| !s.is_empty());
    let baggage = Baggage {
        cluster: some(&src_peer.cluster),
        namespace: some(&src_peer.namespace),
        workload: some(&src_peer.workload),
        service: some(&src_peer.canonical_service),
        revision: some(&src_peer.canonical_revision),
        ..Baggage::default()
    };
    let mut headers = ConnectHeaders::new(plan.dst)
        .forwarded_for(client_addr)
        .baggage(baggage);
    if let Some(svc) = &plan.service {
        // The destination reports the service from it (as the reference).
        headers = headers.forwarded_host(&svc.hostname);
    }
    Ok(pool.connect(key, dial, headers).await?)
}

/// Copies both ways with half-close passed on (FIN <-> END_STREAM); an error
/// on either side resets both (TCP RST, RST_STREAM).
async fn pump(
    mut client: TcpStream,
    mut stream: ringway_hbone::HboneStream,
    up_meter: &Meter<'_>,
    down_meter: &Meter<'_>,
) -> (u64, u64, String) {
    let (mut up, mut down) = (0u64, 0u64);
    match pump_both(
        &mut client,
        &mut stream,
        up_meter,
        down_meter,
        &mut up,
        &mut down,
    )
    .await
    {
        Ok(()) => (up, down, "eof".to_string()),
        Err(e) => {
            sys::tcp_abort(client.as_fd());
            stream.reset();
            (up, down, format!("reset: {e}"))
        }
    }
}

/// Largest read from a client socket at once.
const READ_CHUNK: usize = 256 * 1024;

/// The first read from a client socket, and the next one after a short
/// read; reads double while they fill their buffer, up to [`READ_CHUNK`].
const MIN_READ: usize = 4 * 1024;

/// Both directions of a tunnelled connection in one task, driven by
/// readiness: client -> stream reads up to [`READ_CHUNK`] at once;
/// stream -> client writes each DATA chunk as it arrived. EOF on one side
/// becomes END_STREAM / `shutdown(SHUT_WR)` on the other; an error ends both.
async fn pump_both(
    client: &mut TcpStream,
    stream: &mut ringway_hbone::HboneStream,
    up_meter: &Meter<'_>,
    down_meter: &Meter<'_>,
    up: &mut u64,
    down: &mut u64,
) -> io::Result<()> {
    use std::future::Future;
    use std::task::Poll;
    use tokio::io::AsyncReadExt;
    // Read chunks still to hand to HTTP/2, oldest first.
    let mut to_stream: std::collections::VecDeque<bytes::Bytes> = Default::default();
    let mut to_client = bytes::Bytes::new();
    let (mut up_done, mut down_done) = (false, false);
    let mut want = MIN_READ;
    std::future::poll_fn(|cx| {
        // A busy connection yields after this many chunks per wake-up, so
        // the worker's other connections get their turn.
        let (mut up_budget, mut down_budget, mut yielded) = (16u32, 16u32, false);
        // client -> tunnel
        while !up_done {
            if up_budget == 0 {
                yielded = true;
                break;
            }
            up_budget -= 1;
            if let Some(front) = to_stream.front_mut() {
                match stream.poll_send(cx, front) {
                    Poll::Ready(Ok(())) => {
                        to_stream.pop_front();
                        continue;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
            }
            // One `poll_read` (not readiness + `try_read`): a short read
            // clears the readiness, so a small message costs one `read`, not
            // a second one that finds EAGAIN. The kernel writes straight into
            // a new buffer that leaves as the `Bytes` HTTP/2 frames (no copy,
            // no zeroing); a pending read frees it, so a quiet connection
            // holds none.
            let mut buf = bytes::BytesMut::with_capacity(want);
            let read = std::pin::pin!(client.read_buf(&mut buf)).poll(cx);
            if let Poll::Ready(Ok(n)) = read {
                want = if n >= want {
                    (want * 2).min(READ_CHUNK)
                } else {
                    MIN_READ
                };
                // One read, one DATA frame (up to the peer's max frame
                // size, 1 MiB between ringway proxies; h2 splits it to a
                // smaller one's): fewer frame headers, TLS writes and wake-ups
                // per MB than 64 KiB pieces.
                to_stream.push_back(buf.freeze());
            }
            match read {
                Poll::Ready(Ok(0)) => {
                    stream.finish()?;
                    up_done = true;
                }
                Poll::Ready(Ok(n)) => {
                    up_meter.add(n as u64);
                    *up += n as u64;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        // tunnel -> client
        while !down_done {
            if down_budget == 0 {
                yielded = true;
                break;
            }
            down_budget -= 1;
            if !to_client.is_empty() {
                match tokio::io::AsyncWrite::poll_write(
                    std::pin::Pin::new(&mut *client),
                    cx,
                    &to_client,
                ) {
                    Poll::Ready(Ok(n)) => {
                        let _ = to_client.split_to(n);
                        down_meter.add(n as u64);
                        *down += n as u64;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
                continue;
            }
            match stream.poll_chunk(cx) {
                Poll::Ready(Ok(Some(b))) => to_client = b,
                Poll::Ready(Ok(None)) => {
                    // The client may be gone already; its own reads tell.
                    let _ = sys::shutdown_write(client.as_fd());
                    down_done = true;
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => break,
            }
        }
        if up_done && down_done {
            return Poll::Ready(Ok(()));
        }
        if yielded {
            // More to do right away: come back after the others.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    })
    .await
}

/// Serves one accepted connection of a pod's tunnel listener: TLS with the
/// pod's certificate (client certificate required) on the handshake thread,
/// then, back on this worker, HTTP/2 CONNECT streams, each authorized and
/// connected to the app with the original client's address.
pub async fn inbound(
    state: Arc<TunnelState>,
    pod: Arc<PodShared>,
    mark: u32,
    tcp: std::net::TcpStream,
    peer_addr: SocketAddr,
    preauth: PreauthGuard,
    stats: Arc<Stats>,
) -> Result<(), TunnelError> {
    // Before authentication a connection costs a task, an fd and the TLS
    // state only (no read buffer), for a bounded time, and holds one of the
    // places capped per source and per pod (`preauth`, taken at accept).
    let (ids, mesh) = state.enabled().ok_or(TunnelError::Disabled)?;
    let local = pod_identity(&mesh, &pod).ok_or(TunnelError::NoLocalIdentity)?;
    let cfg = ids.server_config(&local)?;
    let mut tls = server_handshake(&state, cfg, tcp, stats).await?;
    // Back on this worker: its reactor drives the socket from now on.
    tls.get_mut().0.tcp.attach()?;
    // Authenticated: from now on TLS reads go through the buffer.
    tls.get_mut().0.buffer();
    tls.get_mut().1.set_buffer_limit(Some(TLS_WRITE_LIMIT));
    let peer_id = ringway_identity::peer_identity(tls.get_ref().1)?;
    tracing::debug!(peer.id = %peer_id, "hbone peer authenticated");
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
        preface_timeout: crate::handshake::jittered(l.preface_timeout),
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
    )
    .await;
    match &served {
        Err(ringway_hbone::HboneError::RapidReset(_)) => state.refused(HboneRefusal::RapidReset),
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
type ServerTls = tokio_rustls::server::TlsStream<LazyBufIo<crate::handshake::Handoff>>;

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
    let tcp = crate::handshake::Handoff::new(TcpStream::from_std(tcp)?);
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let timeout = crate::handshake::jittered(state.limits.handshake_timeout);
    let accepted = match tokio::time::timeout(timeout, acceptor.accept(LazyBufIo::new(tcp))).await {
        Ok(r) => r,
        Err(_) => {
            state.refused(HboneRefusal::HandshakeTimeout);
            Err(crate::metrics::HandshakeTimeout::io(timeout))
        }
    };
    if !crate::handshake::on_handshake_thread() {
        stats.server_handshakes_off_thread.inc();
    }
    let outcome = match &accepted {
        Ok(_) => "ok",
        Err(e) => crate::metrics::tls_failure_reason(e),
    };
    state
        .metrics
        .tls_handshakes
        .get_or_create(&crate::metrics::TlsLabels {
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
    let mesh = match state.mesh_knowing(pod).await {
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
    if let Err(why) = check_client_claim(&mesh, peer_id, client) {
        state.refused(why.reason());
        return deny_401(state, format!("client address {client}: {why}"));
    }
    let authz = match authorize(
        &state.metrics,
        &mesh,
        pod,
        client,
        Some(peer_id.clone()),
        dst,
        "hbone",
    ) {
        Ok(a) => a,
        Err(why) => return deny_401(state, why),
    };
    match connect_in_pod(pod, mark, dst, Some(client), state.connect_timeout).await {
        Ok(s) => {
            // Re-checked when the policies change (reset if then denied).
            // The stream owns the socket: the flow table gets a duplicate.
            let flow = match s.as_fd().try_clone_to_owned() {
                Ok(dup) => Some(flows::register(pod, vec![Arc::new(dup)], authz, state)),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot duplicate a socket for policy re-checks");
                    None
                }
            };
            // Counted once the stream is really served (not for a 503).
            state
                .metrics
                .hbone_streams
                .get_or_create(&crate::metrics::TlsLabels {
                    side: "server",
                    outcome: "ok",
                })
                .inc();
            let service = inbound_service(&mesh, pod, req.forwarded_host.as_deref(), dst.port());
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
        .get_or_create(&crate::metrics::DenyLabels { path: "hbone" })
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

/// The service a connection that arrived at `pod`'s port `port` went to,
/// as the destination side reports it (the reference's
/// `guess_inbound_service`): the one of the pod's own services that the
/// client named (`forwarded: …;host=`), else the first of its services
/// with a target port `port`. A name that is not one of the pod's services
/// is ignored: a peer cannot make a pod's metrics claim another service.
pub(crate) fn inbound_service<'m>(
    mesh: &'m Mesh,
    pod: &PodShared,
    host: Option<&str>,
    port: u16,
) -> Option<&'m Arc<ringway_config::Service>> {
    let w = pod.workload(mesh)?;
    let named = host.and_then(|h| mesh.services_of(&w.uid).find(|s| s.hostname == h));
    named.or_else(|| {
        mesh.services_of(&w.uid)
            .find(|s| s.ports.values().any(|&t| t == port))
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh() -> Mesh {
        ringway_config::MeshConfig::parse(
            "trustDomain: cluster.local\nworkloads:\n  - uid: uid-web\n    name: web\n    namespace: shop\n    serviceAccount: web\n    ips: [10.0.0.2]\n    node: n1\n    tunnel: true\n",
            "test",
        )
        .unwrap()
        .validate("test")
        .unwrap()
    }

    fn pod(ip: &str, namespace: &str, service_account: &str) -> PodShared {
        PodShared {
            uid: Arc::from("uid"),
            netns: std::fs::File::open("/dev/null").unwrap().into(),
            ips: vec![ip.parse().unwrap()],
            ports: sock::PortSplit::default(),
            who: RwLock::new((
                crate::PodIdentity {
                    name: "p".into(),
                    namespace: namespace.into(),
                    service_account: service_account.into(),
                },
                String::new(),
            )),
            flows: flows::FlowTable::default(),
            preauth: Default::default(),
            labels: Default::default(),
        }
    }

    /// A peer that sends a few bytes and then goes quiet, on thousands of
    /// tunnels, must not make each hold a TLS read buffer: the buffer is
    /// given back once TLS has taken every byte read into it, and a read
    /// that finds nothing holds none.
    #[test]
    fn adversarial_quiet_tunnel_holds_no_tls_read_buffer() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut peer, ours) = tokio::io::duplex(4096);
            let mut io = LazyBufIo::new(ours);
            io.buffer();
            peer.write_all(&[7u8; 100]).await.unwrap();
            // TLS takes a record header first: the rest waits in the buffer.
            let mut head = [0u8; 5];
            io.read_exact(&mut head).await.unwrap();
            assert!(io.holds_buffer(), "unread bytes are kept");
            let mut rest = [0u8; 95];
            io.read_exact(&mut rest).await.unwrap();
            assert_eq!(rest, [7u8; 95]);
            assert!(
                !io.holds_buffer(),
                "a tunnel whose bytes were all taken still holds a TLS read buffer"
            );
            // A read that finds nothing (the peer is quiet) keeps none either.
            let mut one = [0u8; 1];
            let mut rb = tokio::io::ReadBuf::new(&mut one);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let polled =
                tokio::io::AsyncRead::poll_read(std::pin::Pin::new(&mut io), &mut cx, &mut rb);
            assert!(polled.is_pending(), "nothing was sent");
            assert!(!io.holds_buffer(), "a pending read holds a TLS read buffer");
            // Bytes arriving later are read whole (nothing lost on the way).
            peer.write_all(b"later").await.unwrap();
            let mut later = [0u8; 5];
            io.read_exact(&mut later).await.unwrap();
            assert_eq!(&later, b"later");
            assert!(!io.holds_buffer());
        });
    }

    /// More tunnels holding unread TLS bytes at once than the worker keeps
    /// spare buffers: each gets every byte back in order whatever the read
    /// sizes, and once all are drained the worker keeps at most
    /// `SPARE_TLS_BUFS` buffers (the rest are freed, none is leaked or
    /// handed out twice).
    #[test]
    fn many_tunnels_share_the_spare_tls_buffers_without_mixing_bytes() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let n = SPARE_TLS_BUFS * 3;
            let mut ends = Vec::new();
            for i in 0..n {
                let (mut peer, ours) = tokio::io::duplex(64 * 1024);
                let mut io = LazyBufIo::new(ours);
                io.buffer();
                let msg: Vec<u8> = (0..40_000u32).map(|k| (k as usize * 7 + i) as u8).collect();
                peer.write_all(&msg).await.unwrap();
                // A first small read makes each hold a buffer with the rest.
                let mut head = [0u8; 3];
                io.read_exact(&mut head).await.unwrap();
                assert_eq!(head, msg[..3]);
                assert!(io.holds_buffer());
                ends.push((peer, io, msg));
            }
            for (k, (_peer, io, msg)) in ends.iter_mut().enumerate() {
                let mut rest = vec![0u8; msg.len() - 3];
                let step = 1 + k * 997 % 5000;
                let mut at = 0;
                while at < rest.len() {
                    let end = (at + step).min(rest.len());
                    io.read_exact(&mut rest[at..end]).await.unwrap();
                    at = end;
                }
                assert!(rest == msg[3..], "tunnel {k} got bytes of another");
                assert!(!io.holds_buffer());
            }
            drop(ends);
            let spares = SPARE_BUFS.with(|s| s.borrow().len());
            assert!(spares <= SPARE_TLS_BUFS, "{spares} spare buffers kept");
        });
    }

    /// The agent's info without a service account must never become
    /// `sa/default` (a DENY on the real account would miss the pod, an ALLOW
    /// for `default` would admit it): the mesh's record of the pod, when it
    /// agrees on the namespace, else no identity at all (no certificate, no
    /// HBONE).
    #[test]
    fn adversarial_proxy_never_guesses_a_pods_service_account() {
        let mesh = mesh();
        let id = |p: &PodShared| pod_identity(&mesh, p).map(|i| i.to_string());
        // No service account from the agent, no workload in the mesh: none.
        assert_eq!(id(&pod("10.0.0.9", "shop", "")), None);
        // No service account from the agent: the mesh's record of the pod.
        assert_eq!(
            id(&pod("10.0.0.2", "shop", "")).as_deref(),
            Some("spiffe://cluster.local/ns/shop/sa/web")
        );
        // ... but not when it names another namespace than the agent's.
        assert_eq!(id(&pod("10.0.0.2", "bank", "")), None);
        // The agent's full identity wins.
        assert_eq!(
            id(&pod("10.0.0.9", "shop", "cart")).as_deref(),
            Some("spiffe://cluster.local/ns/shop/sa/cart")
        );
    }

    /// A pod that has no service account (a static pod's mirror) has no
    /// identity: no certificate is asked for it and no tunnel carries it,
    /// never `sa/default`.
    #[test]
    fn adversarial_a_pod_without_a_service_account_has_no_identity() {
        let mesh = ringway_config::MeshConfig::parse(
            "trustDomain: cluster.local\nworkloads:\n  - {uid: uid-static, name: static, namespace: kube-system, serviceAccount: \"\", ips: [10.0.0.7], node: n1}\n",
            "test",
        )
        .unwrap()
        .validate("test")
        .unwrap();
        assert_eq!(
            pod_identity(&mesh, &pod("10.0.0.7", "kube-system", "")).map(|i| i.to_string()),
            None
        );
        // Nor can the file say it speaks HBONE.
        let e = ringway_config::MeshConfig::parse(
            "workloads:\n  - {uid: u, name: s, namespace: x, serviceAccount: \"\", ips: [10.0.0.8], node: n1, tunnel: true}\n",
            "test.yaml",
        )
        .unwrap()
        .validate("test.yaml")
        .unwrap_err()
        .to_string();
        assert!(e.contains("cannot speak HBONE"), "{e}");
    }
}
