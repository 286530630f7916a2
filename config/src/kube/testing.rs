//! Test support for code that talks to the Kubernetes API (feature `testing`,
//! and this crate's own tests): a fake API server behind kube's [`Client`]
//! ([`FakeApiServer`]) and the JSON objects the tests feed it or map
//! ([`fixtures`]).
//!
//! It serves this crate's mesh-source tests, ringway-cni's node-agent tests
//! (re-exported as `ringway_cni::testing`) and the testbed's
//! `agent_selection` tests. Not for production builds.
//!
//! [`Client`]: ::kube::Client

mod fake_api;
pub mod fixtures;

pub use self::fake_api::{ApiMode, ApiRequest, FakeApiServer, Kind, WatchStream};
pub use self::fixtures::FakePod;
