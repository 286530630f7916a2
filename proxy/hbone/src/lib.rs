//! HBONE tunnels for ringway: each proxied TCP connection is one HTTP/2 `CONNECT` stream
//! between node proxies, wire-compatible with the reference mesh (see the crate's
//! [`headers`] for the exact request headers).
//!
//! - [`serve_connection`] serves one HTTP/2 connection: it validates every CONNECT
//!   (`:authority` = `ip:port`, strict `forwarded`), asks the caller's handler for a
//!   [`Decision`], answers 200/400/401/503 and pumps bytes between the stream and the
//!   [`Upstream`], mapping END_STREAM <-> FIN and RST_STREAM <-> TCP reset. A
//!   [`DrainSignal`] makes it send GOAWAY and finish the open streams.
//! - [`Pool::connect`] opens a tunnel as an [`HboneStream`] (`AsyncRead + AsyncWrite`),
//!   sharing HTTP/2 connections per [`PoolKey`] (source identity, expected destination
//!   identity, source IP, destination `ip:15008`): at most
//!   [`PoolConfig::max_streams_per_conn`] streams each, a new connection when all are full,
//!   got GOAWAY or are about to outlive the certificates they were authenticated with
//!   ([`Dialled`], [`move_on_at`]), a per-key lock so a burst of first flows dials once, idle
//!   connections closed, HTTP/2 PING keepalive.
//!
//! TLS is not this crate's concern: both sides take any `AsyncRead + AsyncWrite + Unpin +
//! Send` stream; the caller wraps TCP in tokio-rustls (ALPN `h2`, mutual TLS) with the
//! identity crate's configs and passes the verified peer identity in.
//!
//! HTTP/2 settings are the reference's: stream window 4 MiB, connection window 16 MiB, max
//! frame 1 MiB, 200 concurrent streams (server), PING every 10 s, closed after 20 s without
//! an answer. Against hostile peers the server also bounds the header list, the streams
//! authorizing/connecting at once, the streams reset before their answer (rapid reset:
//! GOAWAY), the wait for the preface and the time without streams ([`ServerConfig`]).
//!
//! Modules name only modules below them (the workspace's module-graph test): the
//! crate root's constants, `error`, `upstream`, `conn`, `dialled` and `spawn` (leaves), then
//! `headers`, then `stream`, and `pool` and `server` on top.
#![forbid(unsafe_code)]

use std::time::Duration;

mod conn;
mod dialled;
mod error;
pub mod headers;
mod pool;
mod server;
mod spawn;
mod stream;
mod upstream;

pub use dialled::{move_on_at, Dialled, IntoDialled, EXPIRY_MARGIN};
pub use error::{HboneError, PeerRevoked};
pub use headers::{Baggage, ConnectHeaders, TraceParent};
pub use pool::{Pool, PoolConfig, PoolKey};
pub use server::{
    drain_channel, serve_connection, serve_connection_with, ConnectRequest, Decision, DrainSignal,
    DrainTrigger, PeerCheck, PeerInfo, ServerConfig,
};
pub use spawn::LocalTasks;
pub use stream::HboneStream;
pub use upstream::{AsyncIo, Observer, Upstream};

/// The HBONE port on every meshed pod.
pub const HBONE_PORT: u16 = 15008;
/// HTTP/2 initial stream window.
pub const STREAM_WINDOW: u32 = 4 * 1024 * 1024;
/// HTTP/2 connection window.
pub const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// HTTP/2 max frame size.
pub const MAX_FRAME_SIZE: u32 = 1024 * 1024;
/// Concurrent streams a server allows per connection.
pub const MAX_CONCURRENT_STREAMS: u32 = 200;
/// HTTP/2 PING period.
pub const PING_INTERVAL: Duration = Duration::from_secs(10);
/// A connection whose PING is unanswered this long is closed.
pub const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends a PING every `interval` and returns when one is not answered within `timeout` or
/// the connection is gone; never returns otherwise.
pub(crate) async fn keepalive(
    mut ping: h2::PingPong,
    interval: Duration,
    timeout: Duration,
) -> HboneError {
    loop {
        tokio::time::sleep(interval).await;
        match tokio::time::timeout(timeout, ping.ping(h2::Ping::opaque())).await {
            Ok(Ok(_pong)) => {}
            Ok(Err(e)) => return HboneError::Connection(e),
            Err(_) => return HboneError::PingTimeout(timeout),
        }
    }
}
