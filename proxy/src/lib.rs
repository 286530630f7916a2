//! ringway's node proxy: per-pod transparent listeners and the datapath.
//!
//! The [`Proxy`] is driven by a control thread (the ZDS client, the sandbox,
//! tests): [`Proxy::add_pod`] creates the pod's listener set *inside the pod's
//! network namespace* (outbound 15001, inbound 15006, tunnel 15008; IPv4 and
//! IPv6; one SO_REUSEPORT listener per worker) and hands each worker its
//! share. Workers run thread-per-core event loops (io_uring through
//! tokio-uring, or epoll when io_uring is unavailable) and move bytes with
//! splice; see `copy` and `worker`. With an identity manager and a mesh
//! ([`Proxy::set_identity`], [`Proxy::set_mesh`]) connections between nodes
//! ride HBONE tunnels instead; see `tunnel`.
//!
//! The modules are layers; each names only those below it (checked by the
//! crate-graph test, `cargo test -p ringway-testbed --test it -- crate_graph::`):
//! 1. `sys`, `stats`, `busy`, `uring`, `sock`, `copy`, `handshake`: syscalls,
//!    counters, io_uring ops, sockets, splice, the handshake thread;
//! 2. `metrics`: the Prometheus metrics and their labels;
//! 3. `error`, `pod`: the proxy's errors, the pod model (identity,
//!    addresses, labels, its table of authorized flows);
//! 4. `in_force`, `netns`: the mesh and identities in force, what a pod's
//!    netns holds;
//! 5. `policy`: flow authorization and the re-check of open flows;
//! 6. `tunnel`: HBONE (outbound, the tunnel listener's server);
//! 7. `worker`: the datapath threads, serving every pod's listeners;
//!    7b. `idle_trim`: the thread that gives the heaps' free memory back once
//!    the proxy is quiet;
//! 8. `proxy`: [`Proxy`], which the control thread drives;
//! 9. `config_dump`, `control`, `zds_client`: the admin, metrics and
//!    readiness endpoints and the node agent's client, which drive it.
//!
//! `unsafe` lives only in the io_uring op layer (`uring`) and the syscall
//! layer (`sys`): both need raw pointers or raw fds the safe crates do not
//! expose. Every block carries a `// SAFETY:` comment.

#![deny(unsafe_code)]

mod busy;
pub mod config_dump;
pub mod control;
pub mod copy;
mod error;
pub mod handshake;
pub mod idle_trim;
pub mod in_force;
pub mod metrics;
mod netns;
pub mod pod;
pub mod policy;
mod proxy;
pub mod sock;
pub mod stats;
#[allow(unsafe_code)]
pub mod sys;
pub mod tunnel;
pub mod uring;
pub mod worker;
pub mod zds_client;

pub use error::ProxyError;
pub use netns::check_pod_netns;
pub use pod::{AddressSource, PodIdentity, PodInfo};
pub use proxy::{capture_spec, choose_backend, Proxy};
pub use sock::{Backend, ListenerKind};
pub use stats::{Stats, StatsSnapshot};
