//! A fake Kubernetes API server behind kube's [`Client`]
//! ([`FakeApiServer`], or served over HTTP to another process), and the JSON
//! objects tests feed it or map ([`fixtures`]) (feature `kube-api`).
//!
//! It serves ringway-config's mesh-source tests, ringway-cni's node-agent
//! tests, the test bed's `agent_selection` and `policy_cluster` tests, the
//! binary's `csr_e2e` and the benches. It lives here, with the tests, so that
//! no product crate carries a test server; it depends on no ringway crate
//! (the fixtures spell the labels the product reads: ringway-config's tests
//! check that they agree).
//!
//! [`Client`]: ::kube::Client

mod fake_api;
pub mod fixtures;

pub use self::fake_api::{ApiMode, ApiRequest, FakeApiServer, Kind, WatchStream};
pub use self::fixtures::FakePod;
