//! Why the tunnel listener (15008) refused a connection or a stream: the
//! reasons `ringway_hbone_refused_total{reason}` counts.

/// Why the tunnel listener refused a connection or a stream, as
/// `ringway_hbone_refused_total{reason}` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HboneRefusal {
    /// A `forwarded` client address of a workload the peer is not.
    ForwardedNotPeer,
    /// A `forwarded` loopback, unspecified, multicast or link-local address.
    ForwardedReserved,
    /// CONNECT to one of the proxy's own ports.
    ProxyPort,
    /// HEADERS + RST_STREAM faster than allowed.
    RapidReset,
    /// The TLS handshake did not finish in time.
    HandshakeTimeout,
    /// The HTTP/2 preface did not come in time.
    PrefaceTimeout,
    /// An authenticated connection idle too long.
    Idle,
    /// One source over its pre-authentication cap.
    PerSource,
    /// The pod at its pre-authentication cap (the listener pauses; counted
    /// as [`HboneRefusal::PerPodPaused`], once per pause).
    PerPod,
    /// A pod's tunnel listeners paused at its pre-authentication cap.
    PerPodPaused,
    /// A stream to a pod whose workload the control plane has not sent
    /// (within `proxy.workloadWait`).
    UnknownWorkload,
    /// A stream to a workload whose traffic must pass a waypoint or a
    /// network gateway this proxy does not support.
    Unsupported,
    /// A connection whose peer's certificate no longer verified against
    /// the trusted roots (a root removed since it was authenticated) when
    /// it opened a stream: the stream refused unprocessed, GOAWAY; counted
    /// when the connection closes.
    UntrustedPeer,
    /// The same for a peer whose certificate had expired since the
    /// handshake (a client that kept a connection past its certificate's
    /// lifetime and ignored the GOAWAY sent shortly before it).
    PeerExpired,
}

impl HboneRefusal {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            HboneRefusal::ForwardedNotPeer => "forwarded_not_peer",
            HboneRefusal::ForwardedReserved => "forwarded_reserved",
            HboneRefusal::ProxyPort => "proxy_port",
            HboneRefusal::RapidReset => "rapid_reset",
            HboneRefusal::HandshakeTimeout => "handshake_timeout",
            HboneRefusal::PrefaceTimeout => "preface_timeout",
            HboneRefusal::Idle => "idle",
            HboneRefusal::PerSource => "per_source",
            HboneRefusal::PerPod => "per_pod",
            HboneRefusal::PerPodPaused => "per_pod_paused",
            HboneRefusal::UnknownWorkload => "unknown_workload",
            HboneRefusal::Unsupported => "unsupported",
            HboneRefusal::UntrustedPeer => "untrusted_peer",
            HboneRefusal::PeerExpired => "peer_expired",
        }
    }
}

impl std::fmt::Display for HboneRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}
