//! ringway's xDS client for the mesh control plane's workload API: the
//! transport half (the conversion of resources into ringway's mesh model is
//! the caller's).
//!
//! - [`proto`]: the messages, written by hand with prost's derive from the
//!   public schema's field numbers: delta ADS (`envoy.service.discovery.v3`),
//!   `istio.workload` (workloads and services) and `istio.security` (L4
//!   authorization policies), and the two type URLs.

#![forbid(unsafe_code)]

pub mod proto;

pub use proto::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource, TypedResource, ADDRESS_TYPE_URL,
    AUTHORIZATION_TYPE_URL, DELTA_ADS_PATH,
};
