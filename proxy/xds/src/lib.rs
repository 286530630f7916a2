//! ringway's xDS client for the mesh control plane's workload API:
//! workloads, services and L4 policies from the control plane into ringway's
//! mesh model.
//!
//! - [`proto`]: the messages, written by hand with prost's derive from the
//!   public schema's field numbers: delta ADS (`envoy.service.discovery.v3`),
//!   `istio.workload` (workloads and services) and `istio.security` (L4
//!   authorization policies), and the two type URLs.
//! - [`client`]: [`AdsClient`], one delta ADS stream over TLS and HTTP/2
//!   (h2 directly, no gRPC framework) with a bearer token and the
//!   `clusterid` header, ACK/NACK of every response through a caller's
//!   [`Handler`], resume by resource versions after a reconnect, typed
//!   errors, jittered backoff, a size limit enforced before buffering.
//! - [`convert`]: each resource into the mesh model (`ringway_config`):
//!   workloads and services refused whole when unreadable, policies never
//!   refused but read toward deny where a part cannot be read.
//! - [`state`]: [`state::MeshState`], the client's handler: each response
//!   applied to the mesh snapshot incrementally and published, refusals
//!   NACKed by name, the metrics and readiness ([`state::XdsStatus`]).
//! - `testing` (feature `testing`): `XdsServer`, a real test control plane
//!   (TLS + h2 server) with fixtures, pushes, faults and a record of every
//!   request, for this crate's tests and other crates' end-to-end tests.
//!
//! The client runs on the caller's runtime and spawns nothing; the caller
//! (the proxy's control thread, on a current-thread runtime) owns the
//! handler's state, which no disconnect ever empties.

#![forbid(unsafe_code)]

pub mod client;
pub mod convert;
pub mod proto;
pub mod state;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{
    AdsClient, Backoff, ClientConfig, ConfigError, Event, Handler, Keepalive, Nack, XdsError,
};
pub use proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource, TypedResource, ADDRESS_TYPE_URL,
    AUTHORIZATION_TYPE_URL, DELTA_ADS_PATH,
};
