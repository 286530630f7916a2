//! Starting the agent and the handle on a running one, the top of the node
//! agent: [`NodeAgent::start`] rediscovers the pods, hands them to the owner
//! of the state (`Core`), binds both sockets and starts the servers, each
//! given what it needs; [`AgentHandle`] reads the agent (metrics, health,
//! pods) and stops it; [`Enroller`] is the [`Enrollment`] handle the
//! Kubernetes watch gets.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::cni_server::{self, CniServer};
use super::config::{AgentConfig, Selection};
use super::discover;
use super::error::{EnrollError, StartError, Unhealthy};
use super::lifecycle::Lifecycle;
use super::metrics::{AgentMetrics, EnrolledPods, PodCount};
use super::pod::{Pod, PodStatus, ProxyStatus, Rediscovery};
use super::state::Core;
use super::zds_server::{self, ZdsServer};

/// Enrolling and removing pods: the one internal API behind CNI ADD/DEL and
/// the Kubernetes watch.
pub trait Enrollment: Send + Sync {
    /// Captures `pod` in `netns` and hands it to the newest ready proxy;
    /// returns once the proxy acknowledged it. See the node agent's module
    /// docs, "Enrollment".
    fn enroll(&self, pod: Pod, netns: OwnedFd) -> Result<(), EnrollError>;
    /// Tells every proxy to drop the pod, removes its rules, forgets it.
    /// Unknown UIDs are fine.
    fn unenroll(&self, uid: &str) -> Result<(), EnrollError>;
    /// The enrolled pods.
    fn enrolled(&self) -> Vec<PodStatus>;
}

/// A cloneable handle on a running agent's enrollment (for the Kubernetes watch).
#[derive(Clone)]
pub struct Enroller(pub(super) Arc<Core>);

impl std::fmt::Debug for Enroller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Enroller").finish_non_exhaustive()
    }
}

impl Enrollment for Enroller {
    fn enroll(&self, pod: Pod, netns: OwnedFd) -> Result<(), EnrollError> {
        self.0.enroll(pod, netns, None)
    }
    fn unenroll(&self, uid: &str) -> Result<(), EnrollError> {
        self.0.unenroll(uid)
    }
    fn enrolled(&self) -> Vec<PodStatus> {
        self.0.enrolled()
    }
}

/// The node agent.
#[derive(Debug)]
pub struct NodeAgent;

impl NodeAgent {
    /// Rediscovers enrolled pods, then binds both sockets and starts serving.
    /// Fails (without leaving threads behind) when the config is invalid or a
    /// socket cannot be bound (e.g. another agent is serving it).
    pub fn start(config: AgentConfig) -> Result<AgentHandle, StartError> {
        config.capture.validate().map_err(StartError::Capture)?;
        let config = Arc::new(config);
        tracing::info!(
            zds.socket = %config.zds_socket.display(),
            cni.socket = %config.cni_socket.display(),
            capture.mode = ?config.capture.mode,
            netns_dirs = ?config.netns_dirs,
            proc_root = %config.proc_root.display(),
            exclude_namespaces = ?config.exclude_namespaces,
            node = %config.node_name,
            reconcile_interval = ?config.reconcile_interval,
            selection = match config.selection {
                Selection::All => "all pods",
                Selection::Kubernetes(_) => "Kubernetes labels",
            },
            "node agent starting"
        );
        let found = discover::rediscover(&config);
        let lifecycle = Arc::new(Lifecycle::default());
        let metrics = Arc::new(AgentMetrics::default());
        let core = Arc::new(Core::new(config.clone(), lifecycle.clone()));
        core.adopt(found.pods, found.keep);
        let report = found.report;
        tracing::info!(
            namespaces = report.namespaces,
            adopted = report.adopted.len(),
            reapplied = report.reapplied.len(),
            skipped = report.skipped.len(),
            kept = report.kept.len(),
            "rediscovery done"
        );
        let zds = zds_server::bind(&config.zds_socket)?;
        lifecycle.register_socket(&config.zds_socket);
        let cni = match cni_server::bind(&config.cni_socket) {
            Ok(l) => l,
            Err(e) => {
                // Leave nothing behind: the ZDS socket file, the pinned netns.
                drop(zds);
                lifecycle.stop();
                core.close_proxies();
                lifecycle.finish();
                core.release_all();
                return Err(e);
            }
        };
        lifecycle.register_socket(&config.cni_socket);
        let zds_srv = Arc::new(ZdsServer::new(
            core.clone(),
            lifecycle.clone(),
            metrics.clone(),
            config.peer_uids.clone(),
        ));
        let cni_srv = Arc::new(CniServer::new(
            core.clone(),
            config.clone(),
            lifecycle.clone(),
            metrics.clone(),
        ));
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(f)
                .map_err(|e| StartError::Thread {
                    name: name.to_string(),
                    source: e,
                })
        };
        let started = (|| {
            threads.push(spawn(
                "ringway-zds-accept",
                Box::new(move || zds_srv.accept_loop(zds)),
            )?);
            threads.push(spawn(
                "ringway-cni-accept",
                Box::new(move || cni_srv.accept_loop(cni)),
            )?);
            let c = core.clone();
            let repairs = metrics.repairs.clone();
            threads.push(spawn(
                "ringway-reconcile",
                Box::new(move || c.reconcile_loop(&repairs)),
            )?);
            Ok(())
        })();
        let handle = AgentHandle {
            core,
            config,
            lifecycle,
            metrics,
            threads,
            rediscovery: report,
        };
        match started {
            Ok(()) => {
                tracing::info!("node agent serving");
                Ok(handle)
            }
            Err(e) => {
                handle.shutdown();
                Err(e)
            }
        }
    }
}

/// A running agent. Dropping it shuts the agent down (pods stay enrolled:
/// their rules and the proxy's listeners are left as they are).
#[derive(Debug)]
pub struct AgentHandle {
    core: Arc<Core>,
    config: Arc<AgentConfig>,
    lifecycle: Arc<Lifecycle>,
    metrics: Arc<AgentMetrics>,
    threads: Vec<JoinHandle<()>>,
    rediscovery: Rediscovery,
}

impl AgentHandle {
    /// The agent's metrics in OpenMetrics text (prometheus-client's
    /// encoder), without the process metrics: for tests and debugging.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.metrics_registry());
        out
    }

    /// A registry of the agent's metrics (for `/metrics`): CNI request
    /// latency and outcomes, refused connections, the enrolled pods read
    /// at scrape time, and with an [`AgentConfig::annotator`] its patches
    /// (`ringway_agent_redirection_annotation_patches_total{op,outcome}`,
    /// `ringway_agent_redirection_annotation_pending`). It can live on another thread; encode it with
    /// prometheus-client (the binary adds the process collector).
    pub fn metrics_registry(&self) -> prometheus_client::registry::Registry {
        let mut r = self.metrics.registry();
        r.register_collector(Box::new(EnrolledPods(self.core.clone())));
        if let Some(annotator) = &self.config.annotator {
            annotator.register_metrics(&mut r);
        }
        r
    }

    /// A liveness check that can live on another thread (for the agent's
    /// `/healthz/live`): `Ok` while the agent serves, `Err` naming what is wrong
    /// otherwise (shutting down; a socket file the CNI plugin or the proxies
    /// connect to has disappeared). It does not depend on a proxy: an agent
    /// waiting for its proxy is healthy and must not be restarted.
    pub fn liveness_source(&self) -> Arc<dyn Fn() -> Result<String, Unhealthy> + Send + Sync> {
        let (config, lifecycle) = (self.config.clone(), self.lifecycle.clone());
        Arc::new(move || live(&config, &lifecycle).map(|()| "serving".to_owned()))
    }

    /// A readiness check that can live on another thread (for the agent's
    /// `/healthz/ready`): [`AgentHandle::liveness_source`], and a proxy has taken
    /// the snapshot. Until one has, every CNI ADD of a pod to capture fails with
    /// code 11 (try again later), so the agent does not claim to be ready.
    pub fn health_source(&self) -> Arc<dyn Fn() -> Result<String, Unhealthy> + Send + Sync> {
        let (core, config, lifecycle) = (
            self.core.clone(),
            self.config.clone(),
            self.lifecycle.clone(),
        );
        Arc::new(move || {
            live(&config, &lifecycle)?;
            let proxies = core.proxies();
            let ready = proxies.iter().filter(|p| p.ready).count();
            if ready == 0 {
                return Err(Unhealthy::NoProxy {
                    connected: proxies.len(),
                });
            }
            Ok(format!(
                "ready: {} pods enrolled, {} proxies connected, {ready} with the snapshot",
                core.pod_count(),
                proxies.len()
            ))
        })
    }

    /// Enrollment, for the Kubernetes watch.
    pub fn enrollment(&self) -> Enroller {
        Enroller(self.core.clone())
    }

    /// The enrolled pods.
    pub fn pods(&self) -> Vec<PodStatus> {
        self.core.enrolled()
    }

    /// The connected proxies, oldest first.
    pub fn proxies(&self) -> Vec<ProxyStatus> {
        self.core.proxies()
    }

    /// What rediscovery found at start.
    pub fn rediscovery(&self) -> &Rediscovery {
        &self.rediscovery
    }

    /// Runs the gone-namespace check now (it also runs every
    /// `reconcile_interval`); returns the UIDs whose netns was released.
    pub fn reconcile_now(&self) -> Vec<String> {
        self.core.release_gone_netns()
    }

    /// Stops serving: closes both sockets (and removes their files), closes
    /// every proxy connection, waits for the agent's threads (each is bounded
    /// by its deadlines). Pods, rules and proxy listeners are left untouched.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.threads.is_empty() && self.lifecycle.is_stopping() {
            return;
        }
        tracing::info!("node agent shutting down");
        // Stop accepting, wake every loop; take the ZDS socket's name away
        // before closing the proxy connections, so a proxy that sees its
        // connection close finds no agent to reconnect to until the next
        // one binds (never this one, on its way out); then close them.
        self.lifecycle.stop();
        self.lifecycle.remove_socket(&self.config.zds_socket);
        self.core.close_proxies();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // Wait for the workers, remove the socket files, release every
        // pinned namespace. Rules are left in place.
        self.lifecycle.finish();
        self.core.release_all();
        tracing::info!("node agent stopped");
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// See [`AgentHandle::liveness_source`].
fn live(config: &AgentConfig, lifecycle: &Lifecycle) -> Result<(), Unhealthy> {
    if lifecycle.is_stopping() {
        return Err(Unhealthy::ShuttingDown);
    }
    for (what, path) in [
        ("ZDS socket", &config.zds_socket),
        ("CNI event socket", &config.cni_socket),
    ] {
        if !path.exists() {
            return Err(Unhealthy::SocketGone {
                what,
                path: path.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_cross_threads() {
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<Enroller>();
        send_sync::<AgentHandle>();
        // What the Kubernetes watch takes.
        let _: fn(Enroller) -> Arc<dyn crate::kube::Enrollment> = |e| Arc::new(e);
        let _: fn(Enroller) -> Arc<dyn Enrollment> = |e| Arc::new(e);
    }
}
