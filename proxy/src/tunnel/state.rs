//! What every worker shares about HBONE: the metrics it counts into, what
//! is in force (identities, mesh), the tunnel listener's limits, the drain
//! trigger of tunnel servers and the handshake thread.

use std::sync::Arc;
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
}

impl TunnelState {
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
