//! The small HTTP control server of every ringway process, and the metrics
//! every process exports about itself.
//!
//! - [`ControlServer`]: one endpoint (readiness, metrics, admin) served
//!   from its own thread and current-thread tokio runtime, never from a
//!   datapath worker, bounded by [`ControlLimits`]. What it answers is the
//!   caller's [`Handler`]; the proxy, the node agent and the certificate
//!   service each bring their own.
//! - [`ProcessCollector`]: the standard `process_*` metrics, read from
//!   `/proc/self` at scrape time.
//! - [`encode`] and [`content_type`]: a registry in Prometheus text 0.0.4
//!   or OpenMetrics, as the scraper asked.
//!
//! It depends on no other ringway crate, so the agent and the certificate
//! service use it without depending on the datapath.

#![forbid(unsafe_code)]

mod exposition;
mod process;
mod server;

pub use exposition::{content_type, encode};
pub use process::{ProcessCollector, ProcessSample};
pub use server::{
    readiness_handler, Answer, ControlLimits, ControlServer, Handler, ReadyState, JSON, TEXT,
};
