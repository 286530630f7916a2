//! What every worker shares about HBONE: the metrics it counts into, what
//! is in force (identities, mesh), the tunnel listener's limits, the drain
//! trigger of tunnel servers and the handshake thread.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringway_config::{HboneSettings, ProxySettings};
use ringway_hbone::{DrainSignal, DrainTrigger};

use super::refusal::HboneRefusal;
use crate::handshake::Handshaker;
use crate::in_force::InForce;
use crate::metrics::{Metrics, RefusedLabels};

/// What every worker shares about HBONE: the identity manager and the mesh
/// snapshot in force (both swappable), and the drain trigger of tunnel
/// servers.
#[derive(Debug)]
pub struct TunnelState {
    /// Where tunnel handshakes, streams and denials are counted.
    pub metrics: Arc<Metrics>,
    /// The identity manager and the mesh in force.
    pub in_force: Arc<InForce>,
    drain: DrainTrigger,
    pub(super) signal: DrainSignal,
    /// The limits of the tunnel listener (`proxy.hbone`).
    pub limits: HboneSettings,
    /// Bound on connecting to the app in a pod (`proxy.connectTimeout`, as
    /// on the plaintext path).
    pub connect_timeout: Duration,
    /// Ports a CONNECT may never target in a pod: the proxy's listeners
    /// and `limits.reserved_ports`.
    pub(super) proxy_ports: Vec<u16>,
    /// Where server TLS handshakes run (set once by the proxy at start;
    /// without it the tunnel listener refuses every connection).
    pub(super) handshaker: std::sync::OnceLock<Handshaker>,
    /// This proxy's own tunnel dials still open, by their local address
    /// (what the tunnel's server end sees as its peer), with the worker
    /// that drives each ([`DialMark`]).
    dials: Mutex<HashMap<SocketAddr, usize>>,
    /// Those of [`TunnelState::dials`] whose server end this proxy has
    /// authenticated (not another proxy sharing the port in an upgrade).
    served: Mutex<std::collections::HashSet<SocketAddr>>,
    /// Each worker's queue of tunnel servers to drive ([`TunnelState::hand_to`]).
    workers: Mutex<HashMap<usize, tokio::sync::mpsc::UnboundedSender<ServeJob>>>,
    /// The tunnel dials in flight per source address and destination
    /// (every worker's together; [`TunnelState::dial_slot`]).
    dialling: Mutex<HashMap<(IpAddr, SocketAddr), Arc<tokio::sync::Semaphore>>>,
}

/// A place among the tunnel dials in flight from one source address to one
/// destination ([`TunnelState::dial_slot`]); given back on drop, once the
/// dial's TLS handshake is done or failed.
#[derive(Debug)]
pub struct DialSlot {
    _place: tokio::sync::OwnedSemaphorePermit,
}

/// Tunnel dials in flight from one source to one destination, at most:
/// half the per-source cap a peer with this proxy's settings puts on
/// connections before authentication (`proxy.hbone.maxPreauthPerSource`;
/// half, as the peer counts a connection until its HTTP/2 preface arrives,
/// a moment after the dial is done), at least one.
fn dials_per_source(limits: &HboneSettings) -> usize {
    (limits.max_preauth_per_source as usize / 2).max(1)
}

/// An authenticated tunnel server to drive on another worker: it attaches
/// its socket to the reactor of the thread that polls it.
pub type ServeJob = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Registers one of this proxy's tunnel dials (client ends) by its local
/// address while it is open: when the same proxy serves the other end
/// (HBONE between two pods of one node), that end is driven by the
/// dialling worker too, so a message through the tunnel wakes one worker,
/// not two ([`TunnelState::dialled_by`]). Removed on drop.
#[derive(Debug)]
pub struct DialMark {
    state: Arc<TunnelState>,
    addr: SocketAddr,
}

impl Drop for DialMark {
    fn drop(&mut self) {
        let mut dials = self.state.dials.lock().unwrap_or_else(|p| p.into_inner());
        dials.remove(&self.addr);
        drop(dials);
        let mut served = self.state.served.lock().unwrap_or_else(|p| p.into_inner());
        served.remove(&self.addr);
    }
}

impl TunnelState {
    /// Whether `port` is one of the proxy's own (capture, tunnel,
    /// reserved): never a pod's app port that traffic may be sent to.
    pub fn is_proxy_port(&self, port: u16) -> bool {
        self.proxy_ports.contains(&port)
    }

    /// A state counting into `metrics`, with HBONE on once `in_force` has
    /// an identity manager and a mesh, holding the tunnel limits of
    /// `settings`.
    pub fn new(metrics: Arc<Metrics>, in_force: Arc<InForce>, settings: &ProxySettings) -> Self {
        let (drain, signal) = ringway_hbone::drain_channel();
        let p = settings.ports;
        let mut proxy_ports = vec![p.outbound, p.inbound, p.tunnel];
        proxy_ports.extend(&settings.hbone.reserved_ports);
        TunnelState {
            metrics,
            in_force,
            drain,
            signal,
            limits: settings.hbone.clone(),
            connect_timeout: settings.connect_timeout,
            proxy_ports,
            handshaker: std::sync::OnceLock::new(),
            dials: Mutex::new(HashMap::new()),
            served: Mutex::new(std::collections::HashSet::new()),
            workers: Mutex::new(HashMap::new()),
            dialling: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for a place among the tunnel dials in flight from `src` to
    /// `dst` (every worker's together): each worker dials its own tunnels,
    /// so a burst from one pod to one pod elsewhere would otherwise open
    /// one dial per worker at once, and a peer resets those beyond its
    /// per-source cap before authentication (see [`dials_per_source`]).
    /// Those beyond wait for a dial to finish; the caller bounds the wait.
    pub async fn dial_slot(&self, src: IpAddr, dst: SocketAddr) -> DialSlot {
        let key = (src.to_canonical(), canonical(dst));
        let places = {
            let mut dialling = self.dialling.lock().unwrap_or_else(|p| p.into_inner());
            if dialling.len() >= 1024 {
                // Destinations no dial is using now (the map's the only
                // reference left) go.
                dialling.retain(|_, s| Arc::strong_count(s) > 1);
            }
            dialling
                .entry(key)
                .or_insert_with(|| {
                    Arc::new(tokio::sync::Semaphore::new(dials_per_source(&self.limits)))
                })
                .clone()
        };
        // Never closed: a place always comes.
        DialSlot {
            _place: places
                .acquire_owned()
                .await
                .expect("the dial places are never closed"),
        }
    }

    /// Marks `addr` (a tunnel dial's local address) as dialled by `worker`
    /// until the mark is dropped.
    pub fn mark_dial(self: &Arc<Self>, addr: SocketAddr, worker: usize) -> DialMark {
        let addr = canonical(addr);
        let mut dials = self.dials.lock().unwrap_or_else(|p| p.into_inner());
        dials.insert(addr, worker);
        DialMark {
            state: self.clone(),
            addr,
        }
    }

    /// The worker of this proxy that dialled the tunnel whose client end is
    /// `peer`, if it is one of ours and still open.
    pub fn dialled_by(&self, peer: SocketAddr) -> Option<usize> {
        let dials = self.dials.lock().unwrap_or_else(|p| p.into_inner());
        dials.get(&canonical(peer)).copied()
    }

    /// [`TunnelState::dialled_by`] for the server end that has just
    /// authenticated `peer`: a dial of ours is noted as served here.
    pub fn serving_dial(&self, peer: SocketAddr) -> Option<usize> {
        let w = self.dialled_by(peer);
        if w.is_some() {
            let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
            served.insert(canonical(peer));
        }
        w
    }

    /// Whether this proxy serves the other end of its dial from `local`
    /// (a same-node tunnel; during an upgrade the port is shared with the
    /// other proxy, which may have taken it).
    pub fn served_here(&self, local: SocketAddr) -> bool {
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        served.contains(&canonical(local))
    }

    /// Registers `worker`'s queue of tunnel servers to drive.
    pub fn serve_queue(&self, worker: usize, tx: tokio::sync::mpsc::UnboundedSender<ServeJob>) {
        let mut w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        w.insert(worker, tx);
    }

    /// Hands `job` to `worker` to drive; gives it back when that worker has
    /// no queue (gone, or never registered): the caller drives it itself.
    pub fn hand_to(&self, worker: usize, job: ServeJob) -> Result<(), ServeJob> {
        let w = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        match w.get(&worker) {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }

    /// Sets the handshake thread server TLS handshakes run on (once).
    pub fn set_handshaker(&self, h: Handshaker) {
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
            .get_or_create(&RefusedLabels {
                reason: why.label(),
            })
            .inc();
    }

    /// Tunnel servers send GOAWAY and finish their streams.
    pub fn drain(&self) {
        self.drain.drain();
    }
}

/// The address as the other end reports it (a v4 peer on a v6 socket is
/// v4-mapped).
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Arc<TunnelState> {
        let settings = ProxySettings::default();
        Arc::new(TunnelState::new(
            Arc::new(Metrics::default()),
            Arc::new(InForce::new(settings.workload_wait)),
            &settings,
        ))
    }

    /// A tunnel's server end finds the worker that dialled it by its peer
    /// address (as the accepted socket reports it, v4-mapped or not) only
    /// while that dial is open: once its connection (holding the mark) is
    /// dropped, a later peer with the same address is served where it was
    /// accepted.
    #[test]
    fn a_dial_steers_its_server_end_only_while_open() {
        let st = state();
        let v4: SocketAddr = "10.0.0.4:40000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:10.0.0.4]:40000".parse().unwrap();
        assert_eq!(st.dialled_by(v4), None);
        let mark = st.mark_dial(v4, 1);
        assert_eq!(st.dialled_by(v4), Some(1));
        assert_eq!(st.dialled_by(mapped), Some(1));
        assert_eq!(st.dialled_by("10.0.0.4:40001".parse().unwrap()), None);
        drop(mark);
        assert_eq!(st.dialled_by(v4), None);
    }

    /// A dial is served here only once this proxy's server end took it,
    /// and no longer once it is closed.
    #[test]
    fn a_dial_is_served_here_once_its_server_end_took_it() {
        let st = state();
        let v4: SocketAddr = "10.0.0.4:40000".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:10.0.0.4]:40000".parse().unwrap();
        assert_eq!(st.serving_dial(v4), None);
        let mark = st.mark_dial(v4, 1);
        assert!(!st.served_here(v4));
        assert_eq!(st.serving_dial(mapped), Some(1));
        assert!(st.served_here(v4));
        drop(mark);
        assert!(!st.served_here(v4));
    }

    /// The dials in flight from one source to one destination are half the
    /// per-source cap (64 by default: 32), whichever worker asks (a
    /// v4-mapped source is the same source); the next waits until one is
    /// done; another destination, or another source, has places of its own.
    #[test]
    fn dials_from_one_source_to_one_destination_wait_beyond_half_the_per_source_cap() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let st = state();
            let src: IpAddr = "10.0.0.4".parse().unwrap();
            let mapped: IpAddr = "::ffff:10.0.0.4".parse().unwrap();
            let dst: SocketAddr = "10.0.1.7:15008".parse().unwrap();
            let mut held = Vec::new();
            for _ in 0..32 {
                held.push(st.dial_slot(src, dst).await);
            }
            let next = st.dial_slot(mapped, dst);
            tokio::pin!(next);
            let wait = Duration::from_millis(50);
            assert!(
                tokio::time::timeout(wait, next.as_mut()).await.is_err(),
                "a 33rd dial went out at once"
            );
            let other_dst = st.dial_slot(src, "10.0.1.8:15008".parse().unwrap());
            let other_src = st.dial_slot("10.0.0.5".parse().unwrap(), dst);
            assert!(tokio::time::timeout(wait, other_dst).await.is_ok());
            assert!(tokio::time::timeout(wait, other_src).await.is_ok());
            held.pop();
            assert!(
                tokio::time::timeout(wait, next).await.is_ok(),
                "a place given back went to no waiting dial"
            );
        });
    }

    /// A server handed to a worker without a queue (gone, or never
    /// started) comes back to the caller, which drives it itself: a tunnel
    /// is never dropped for want of a worker.
    #[test]
    fn a_job_for_a_worker_without_a_queue_comes_back() {
        let st = state();
        let job: ServeJob = Box::pin(async {});
        let job = st.hand_to(3, job).expect_err("no worker 3");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        st.serve_queue(3, tx);
        drop(rx);
        assert!(st.hand_to(3, job).is_err(), "worker 3's queue is gone");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        st.serve_queue(3, tx);
        assert!(st.hand_to(3, Box::pin(async {})).is_ok());
        assert!(rx.try_recv().is_ok(), "the job is queued for worker 3");
    }
}
