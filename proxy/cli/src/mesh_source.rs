//! Where the proxy's mesh comes from at start: the configuration file, or
//! the Kubernetes API watched on a thread of its own (its first complete
//! snapshot awaited); the settings and the capture spec derived from it.

use anyhow::Context;
use ringway_config::CaptureMode;
use ringway_config::ProxySettings;
use ringway_proxy::Proxy;
use std::path::PathBuf;
use std::time::Duration;
use std::time::Instant;

/// Loads the node's configuration: the YAML file given, else the embedded
/// default; environment variables (`RINGWAY_*`) override single settings.
pub(crate) fn load_mesh(path: Option<&PathBuf>) -> anyhow::Result<ringway_config::Mesh> {
    let mesh =
        ringway_config::MeshConfig::load(path.map(|p| p.as_path()), &ringway_config::ProcessEnv)?;
    tracing::info!(config = %mesh.effective_summary(), "effective configuration");
    Ok(mesh)
}

/// `--mesh-source kubernetes`: connects with the in-cluster config (else the
/// kubeconfig) and watches the cluster on a `ringway-kube` thread, publishing
/// `file` merged with its workloads and services to `proxy`.
pub(crate) fn start_kube_mesh(
    file: std::sync::Arc<ringway_config::Mesh>,
    cluster_domain: &str,
    istio_root_namespace: &str,
    proxy: std::sync::Arc<Proxy>,
    first: std::sync::mpsc::SyncSender<()>,
) -> anyhow::Result<ringway_config::kube::MeshWatch> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the Kubernetes mesh runtime")?;
    let client = rt.block_on(ringway_config::kube::connect()).context(
        "--mesh-source kubernetes: without the Kubernetes API there are no workloads or services",
    )?;
    let options = ringway_config::kube::KubeOptions {
        cluster_domain: cluster_domain.to_owned(),
        istio_root_namespace: istio_root_namespace.to_owned(),
        ..ringway_config::kube::KubeOptions::default()
    };
    let watch = ringway_config::kube::MeshWatch::start(rt, client, file, options, move |m| {
        proxy.set_mesh(m);
        // The first snapshot lets the ZDS client start taking pods.
        let _ = first.try_send(());
    })
    .context("starting the Kubernetes mesh source")?;
    tracing::info!(
        cluster_domain,
        istio.root_namespace = istio_root_namespace,
        "mesh source: Kubernetes (pods, services, EndpointSlices, AuthorizationPolicies, \
         PeerAuthentications) + the configuration file"
    );
    Ok(watch)
}

/// How a wait for the mesh source's first snapshot ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstSnapshot {
    In,
    /// Asked to stop first.
    Stopped,
    /// The mesh source ended first.
    Ended,
}

/// Waits for the mesh source's first snapshot (Kubernetes or xDS), logging
/// while it does, until `stopped()` says to give up (checked every 200 ms).
pub(crate) fn wait_first_snapshot(
    rx: &std::sync::mpsc::Receiver<()>,
    stopped: impl Fn() -> bool,
) -> FirstSnapshot {
    use std::sync::mpsc::RecvTimeoutError;
    let t0 = Instant::now();
    let mut next_log = Duration::ZERO;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(()) => {
                tracing::info!(waited = ?t0.elapsed(), "first mesh snapshot in; taking pods");
                return FirstSnapshot::In;
            }
            Err(RecvTimeoutError::Disconnected) => return FirstSnapshot::Ended,
            Err(RecvTimeoutError::Timeout) => {
                if stopped() {
                    return FirstSnapshot::Stopped;
                }
                if t0.elapsed() >= next_log {
                    tracing::warn!(waited = ?t0.elapsed(), "waiting for the mesh source's first snapshot (Kubernetes: pods, services, EndpointSlices; xDS: the control plane's first workloads and policies) before taking pods");
                    next_log += Duration::from_secs(10);
                }
            }
        }
    }
}

pub(crate) fn load_settings(path: Option<&PathBuf>) -> anyhow::Result<ProxySettings> {
    Ok(load_mesh(path)?.proxy().clone())
}

pub(crate) fn capture_spec(
    mode: CaptureMode,
    settings: &ProxySettings,
) -> ringway_redirect::CaptureSpec {
    ringway_proxy::capture_spec(&ProxySettings {
        capture_mode: mode,
        ..settings.clone()
    })
}
