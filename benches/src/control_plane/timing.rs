//! Timing the mesh sources: the snapshots a client publishes (when, and
//! its thread's CPU then), waiting for the one that holds a change, and
//! checking a snapshot holds the whole mesh.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use ringway_config::Mesh;

use super::config::WAIT;
use super::gen::Shape;

/// The calling thread's CPU time (user + system).
pub(super) fn thread_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A snapshot as the sink got it.
pub(super) struct Published {
    pub(super) at: Instant,
    /// The publishing thread's CPU time then.
    pub(super) cpu: Duration,
    pub(super) mesh: Arc<Mesh>,
    /// xDS: both types applied.
    pub(super) synced: bool,
}

pub(super) fn next_published(
    rx: &mpsc::Receiver<Published>,
    deadline: Instant,
) -> anyhow::Result<Published> {
    rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| anyhow!("no snapshot published within {WAIT:?}"))
}

/// The first snapshot from `rx` that `ok` accepts, within [`WAIT`].
pub(super) fn published_when(
    rx: &mpsc::Receiver<Published>,
    ok: impl Fn(&Mesh) -> bool,
) -> anyhow::Result<Published> {
    let deadline = Instant::now() + WAIT;
    loop {
        let p = next_published(rx, deadline)?;
        if ok(&p.mesh) {
            return Ok(p);
        }
    }
}

/// What a snapshot must show for a change to be in it.
pub(super) type Check = Box<dyn Fn(&Mesh) -> bool>;

/// Fails unless `mesh` holds the shape's entries.
pub(super) fn check_counts(mesh: &Mesh, shape: &Shape) -> anyhow::Result<()> {
    let got = (
        mesh.workload_count(),
        mesh.service_count(),
        mesh.policy_count(),
    );
    let want = (shape.workloads, shape.services, shape.policies);
    if got != want {
        bail!(
            "the snapshot holds {got:?} (workloads, services, policies), the control plane {want:?}"
        );
    }
    Ok(())
}

/// CPU seconds of this process's threads named `prefix...`.
pub(super) fn own_thread_cpu_seconds(prefix: &str) -> f64 {
    crate::child::proc_thread_cpu_seconds(std::process::id(), prefix)
}
