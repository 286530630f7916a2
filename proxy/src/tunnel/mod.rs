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
//! See ARCHITECTURE.md ("HBONE between nodes", "The adapter"); its cost is
//! measured in BENCHMARKS.md.
//!
//! HBONE is on only when the proxy has an identity manager
//! (`Proxy::set_identity`) and a mesh (`Proxy::set_mesh`); without them
//! every connection takes the plaintext path as before.
//!
//! One concern per module, in layers (each names only those before it):
//! - `error`, `refusal`, `tls_failure`: what can go wrong, and how the
//!   metrics name it ([`TunnelError`], [`HboneRefusal`],
//!   [`tls_failure_reason`]);
//! - `preauth`: the pre-authentication places of a pod's tunnel listener
//!   and their caps ([`PreauthSlots`], [`admit_preauth`]);
//! - `state`: what every worker shares about HBONE ([`TunnelState`]);
//! - `tls_io`: the TLS read buffer pool under each tunnel ([`LazyBufIo`]);
//! - `socket`: the tunnel's sockets as tokio streams;
//! - `outbound`: the source side (plan, dial, pump);
//! - `inbound`: the tunnel listener's server (handshake off the workers,
//!   CONNECT streams authorized and connected to the app);
//! - `warm`: an upgrade's warm-up (the record of the tunnels held, read
//!   and dialled again by the proxy that replaces this one).

mod error;
mod inbound;
mod outbound;
mod preauth;
mod refusal;
mod socket;
mod state;
mod tls_failure;
mod tls_io;
pub mod warm;

pub use error::TunnelError;
pub use inbound::{check_client_claim, inbound, ClaimError};
pub use outbound::{open_outbound, outbound_plan, outbound_pump, ConnCtx, OutboundPlan};
pub use preauth::{admit_preauth, PreauthGuard, PreauthSlots};
pub use refusal::HboneRefusal;
pub use socket::{adopt, adopt_std};
pub use state::{DialMark, ServeJob, TunnelState};
pub use tls_failure::{tls_failure_reason, HandshakeTimeout};
pub use tls_io::{drop_spare_tls_bufs, LazyBufIo};
