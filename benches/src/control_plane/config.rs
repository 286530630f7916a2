//! How big a `--control-plane` run is (the mesh's shape, the changes of
//! each kind, the children's settle time) and what bounds its waits; its
//! progress lines. A leaf of the measurement.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::gen::Shape;

/// The name the control plane's certificate is for.
pub const SERVER_NAME: &str = "istiod.istio-system.svc";
/// The bound of every wait for a snapshot or an ACK (a failure, not a pass).
pub const WAIT: Duration = Duration::from_secs(60);
/// The bound of a proxy child's first snapshot.
pub const CHILD_WAIT: Duration = Duration::from_secs(300);
/// The log line of the proxy's first snapshot (its ZDS thread writes it,
/// with `waited=<since start>`).
pub const FIRST_SNAPSHOT_LINE: &str = "first mesh snapshot in";

/// How big a run is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ControlPlaneConfig {
    /// "full", "quick" or "tiny (test)".
    pub label: String,
    /// The mesh.
    pub shape: Shape,
    /// xDS changes of each kind (workload, policy), interleaved.
    pub xds_updates: usize,
    /// Kubernetes changes of each kind (pod, policy), interleaved.
    pub kube_updates: usize,
    /// Changes given to each proxy child (xDS: push -> ACK timed; both:
    /// the mesh thread's CPU per change).
    pub child_updates: usize,
    /// Pause before a child's RSS is read, ms.
    pub settle_ms: u64,
}

impl ControlPlaneConfig {
    /// 10,000 workloads, 2,000 services, 1,000 policies; 200 xDS changes
    /// and 30 Kubernetes changes of each kind.
    pub fn full() -> ControlPlaneConfig {
        ControlPlaneConfig {
            label: "full".into(),
            shape: Shape {
                workloads: 10_000,
                services: 2_000,
                policies: 1_000,
            },
            xds_updates: 200,
            kube_updates: 30,
            child_updates: 20,
            settle_ms: 1_000,
        }
    }

    /// A tenth of the full run's sizes.
    pub fn quick() -> ControlPlaneConfig {
        ControlPlaneConfig {
            label: "quick".into(),
            shape: Shape {
                workloads: 1_000,
                services: 200,
                policies: 100,
            },
            xds_updates: 40,
            kube_updates: 8,
            child_updates: 10,
            settle_ms: 500,
        }
    }

    /// The test's run (`benches/tests/it/control_plane_report.rs`): the
    /// pipeline, not the numbers.
    pub fn tiny() -> ControlPlaneConfig {
        ControlPlaneConfig {
            label: "tiny (test)".into(),
            shape: Shape {
                workloads: 100,
                services: 20,
                policies: 10,
            },
            xds_updates: 5,
            kube_updates: 2,
            child_updates: 3,
            settle_ms: 200,
        }
    }

    /// `RINGWAY_BENCH_CP_WORKLOADS`, `_SERVICES`, `_POLICIES`,
    /// `_XDS_UPDATES`, `_KUBE_UPDATES`, `_CHILD_UPDATES`.
    pub fn with_env_overrides(mut self) -> ControlPlaneConfig {
        fn var(n: &str) -> Option<usize> {
            std::env::var(format!("RINGWAY_BENCH_CP_{n}"))
                .ok()
                .and_then(|v| v.parse().ok())
        }
        if let Some(v) = var("WORKLOADS") {
            self.shape.workloads = v;
        }
        if let Some(v) = var("SERVICES") {
            self.shape.services = v;
        }
        if let Some(v) = var("POLICIES") {
            self.shape.policies = v;
        }
        if let Some(v) = var("XDS_UPDATES") {
            self.xds_updates = v;
        }
        if let Some(v) = var("KUBE_UPDATES") {
            self.kube_updates = v;
        }
        if let Some(v) = var("CHILD_UPDATES") {
            self.child_updates = v;
        }
        self
    }
}

pub(super) fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench control-plane] {}", msg.as_ref());
}
