//! The node agent: enrolls pods (capture rules + handoff to the node proxy over
//! ZDS), serves the CNI plugin's event socket, and survives its own restart
//! without touching traffic.
//!
//! Control plane only: blocking std threads, no async runtime.
//!
//! | thread | owns |
//! | --- | --- |
//! | `ringway-zds-accept` | the ZDS listener (`zds_socket`, SOCK_SEQPACKET, mode 0600; peers checked against `peer_uids` with SO_PEERCRED; at most [`MAX_ZDS_CONNECTIONS`]) |
//! | `ringway-zds-<n>` (one per proxy connection) | hello, snapshot, catch-up, then an idle watch for hang-ups |
//! | `ringway-cni-accept` | the CNI event socket (`cni_socket`, unix stream, mode 0600; peers checked against `peer_uids` before a byte is read) |
//! | `ringway-cni` (one per request, at most [`MAX_CNI_HANDLERS`]) | one request line, one response line |
//! | `ringway-reconcile` | every `reconcile_interval`: releases the netns of pods whose namespace is gone |
//!
//! Rule programming runs on short-lived threads inside the pod's netns
//! (`ringway-redirect`); the caller never moves.
//!
//! # Which pods: the selection rule
//! One rule decides for the CNI ADD and the Kubernetes watch ([`Selection`],
//! [`AgentConfig::selection`]): pods of `exclude_namespaces` never; then, with
//! [`Selection::All`] (no cluster: the sandbox, tests) every other pod, with
//! [`Selection::Kubernetes`] the pods [`crate::kube::decide`] wants (label
//! `ringway.io/dataplane-mode=enabled` or `istio.io/dataplane-mode=ambient` on
//! the pod or its namespace, pod label `ringway.io/dataplane-mode=disabled` or
//! `istio.io/dataplane-mode=none` opts out and wins over any enrollment, never
//! hostNetwork: [`ringway_config::enrollment`]), answered from the watch's caches or,
//! for a pod the watch has not seen yet, from the API server
//! ([`crate::kube::Selector`]). A CNI ADD for a pod the rule passes over answers
//! `{"ok":true,"passThrough":"<why>"}`: no rules, no `Add` to the proxy, and the
//! plugin prints `prevResult` back. When the API server cannot be read the ADD
//! is "try again later" (code 11): see [`crate::kube`] for why it does not guess.
//! The watch applies the same rule, so it never unenrolls a pod the ADD captured
//! and enrolls the wanted pods the ADD did not see (running before the agent).
//! A CHECK for a pod the agent does not hold succeeds when the rule passes over
//! it.
//!
//! # The pod's identity
//! CNI passes a pod's namespace, name and uid, never its service account,
//! and the agent never guesses one: the first `Add` a proxy gets must carry
//! the pod's real identity (a proxy may keep the first `Add` of a netns and
//! ignore later ones). The CNI ADD takes it from [`Selection::select`]:
//! with [`Selection::Kubernetes`] from the watch's cache or the API server,
//! only for the pod of that uid (or the mirror pod of that static pod); a pod
//! the API server does not know under that uid is "try again later". With
//! [`Selection::All`] (no API) from [`AgentConfig::service_accounts`]
//! (`--pod-service-account NS=SA` or `NS/POD=SA`); a pod no rule covers is
//! refused. A request that names another service account than the one found
//! is refused, and [`Enrollment::enroll`] refuses a pod without one.
//!
//! # Enrollment
//! [`Enrollment::enroll`] (CNI ADD, and the Kubernetes watch) refuses bad
//! input (an empty uid, name, namespace or service account) and the host's netns, fails fast with [`EnrollError::NoProxy`] when
//! no proxy is ready, applies the capture rules tagged with the pod's identity
//! ([`ringway_redirect::apply_for`]), records the pod (pinning its netns with
//! an open fd), and sends `Add` with the netns fd to the newest ready proxy,
//! waiting up to [`ACK_TIMEOUT`] for its ack. If that proxy's connection
//! breaks, the next newest is tried. On a nack or with no proxy left, a pod
//! that was new is rolled back (forgotten, `Del` to the proxy that nacked,
//! rules removed), so a failed ADD leaves nothing behind; a repeated enroll
//! of an already enrolled pod (same netns) keeps it. A new netns for a known
//! UID (a re-created sandbox) replaces the old one.
//!
//! [`Enrollment::unenroll`] (CNI DEL, the watch) forgets the pod, sends `Del`
//! to every ready proxy (acks awaited with [`ACK_TIMEOUT`]; a nack is
//! logged), removes the rules when the agent still holds the netns, and
//! releases it. Unknown UIDs are fine.
//!
//! # The `ambient.istio.io/redirection` annotation
//! With an [`AgentConfig::annotator`] (`--kube`), a successful enroll asks
//! for `ambient.istio.io/redirection: enabled` on the pod (after its rules
//! are in place and the proxy acked it), and an unenroll, or a failed
//! re-enroll that drops a pod the agent held, for its removal, as the Istio
//! ambient mesh's CNI agent does (its control plane and sidecars read it).
//! The request is queued and patched on the Kubernetes runtime, retried with
//! backoff: it never blocks or fails the CNI ADD. The watch reports the pods
//! whose annotation disagrees with what the agent holds
//! ([`crate::kube::Enrollment::annotation_seen`]), so it is repaired after a
//! restart.
//!
//! # ZDS, per proxy connection
//! Hello within 5 s (else the connection is closed), then the snapshot: `Add`
//! with the netns fd for every pod whose netns is held, `Keep` for pods known
//! without one, each acked before the next, then `SnapshotSent` (acked too).
//! Changes made while the snapshot was on the wire are sent next (`Add`/`Del`),
//! and only then does the connection become *ready*: eligible for new `Add`s
//! and counted by STATUS. `Add` goes to the newest ready connection, `Del` to
//! all of them. 5 s read/write deadlines; a deadline, a hang-up (seen on use,
//! or while idle by a poll: POLLHUP, or POLLIN with a zero-length read for a
//! half-close), an unsolicited packet or anything that is not the protocol
//! closes that connection only.
//!
//! # Restart
//! The agent records every pod it enrolls in its state file
//! ([`AgentConfig::state_file`], rewritten atomically after every enroll and
//! unenroll), on the node where pods cannot write. [`NodeAgent::start`] first
//! rebuilds the pods from the kernel and that record: it scans
//! `proc_root/*/ns/net` and `netns_dirs`, dedupes by namespace inode, skips
//! the agent's own and the host's namespace, and adopts a namespace whose
//! `inet ringway` table carries an owner tag ([`ringway_redirect::read_tag`])
//! for this node only when the record holds that pod UID *with that
//! namespace inode* and the tag agrees with the record on namespace, name,
//! service account, sandbox id and IPs. The owner tag is pod-writable (a
//! container with CAP_NET_ADMIN in its own netns rewrites it): it is a hint,
//! the pod's identity comes from the record; a tag that cannot be read (or
//! asks for more than [`ringway_redirect::MAX_PIECES`] pieces) is skipped,
//! never a crash. Each adopted pod's rules are verified; only on drift are
//! they re-applied (an atomic table replacement that keeps connections).
//! Rediscovery never removes rules; the record is then rewritten with the
//! adopted pods. The first proxy to connect gets the full snapshot.
//!
//! # Gone namespaces
//! A pod's namespace is *live* while a process is in it, it is mounted in one
//! of `netns_dirs`, or the path it was enrolled with still names it. Before
//! every snapshot and every `reconcile_interval`, the agent releases the fd
//! of a pod whose namespace is no longer live (the namespace can then be
//! freed); the pod stays known and is sent as `Keep` until it is unenrolled.
//!
//! # CNI event socket
//! One JSON request line, one JSON response line ([`protocol`]); the plugin's
//! side is [`UnixAgent`].
//!
//! # The Kubernetes watch
//! [`Enroller`] also implements [`crate::kube::Enrollment`], the trait the
//! watch calls with a pod's identity only: the agent uses the namespace it
//! already holds for the UID, else finds it among the processes whose
//! `<proc_root>/<pid>/cgroup` names the UID (oldest first, never the host's
//! namespace, confirmed by one of the pod's IPs). The watch calls it again for
//! a held pod whose identity differs from the one the agent holds (e.g. a
//! file-mode rule that disagrees with the API server): the agent re-tags the rules
//! (an atomic replacement that keeps connections) and re-sends `Add` with the
//! full `WorkloadInfo` for the same netns.

mod accounts;
mod client;
mod cni_server;
mod discover;
mod error;
mod kube_bridge;
pub mod legacy;
pub mod metrics;
pub mod protocol;
mod record;
mod state;
mod zds_server;

use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ringway_redirect::CaptureSpec;

pub use client::UnixAgent;
pub use error::{EnrollError, StartError};

use crate::kube::{SelectError, Selected, Selector, UnenrollReason, Verdict};

use self::state::Core;

/// How long a proxy has to acknowledge a request, and the ZDS read/write deadline.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline for reading a request from, and writing a response to, the CNI socket.
pub const CNI_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests on the CNI socket served at once; more wait in the listen backlog.
pub const MAX_CNI_HANDLERS: usize = 64;
/// ZDS connections served at once (a node runs one proxy, two during an
/// upgrade); more are closed at accept.
pub const MAX_ZDS_CONNECTIONS: usize = 8;
/// Default `netns_dirs`: where containerd and CRI-O bind-mount pod namespaces.
pub const DEFAULT_NETNS_DIR: &str = "/var/run/netns";
/// The `ringway agent`'s default [`AgentConfig::state_file`].
pub const DEFAULT_STATE_FILE: &str = "/var/run/ringway-agent/pods.json";

pub use accounts::{service_account_of, ServiceAccountRule, ServiceAccountRuleError};
pub use record::{RecordError, RecordedPod, MAX_RECORD_BYTES};

/// The agent's settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// ZDS listener (the proxy connects here).
    pub zds_socket: PathBuf,
    /// CNI event socket (the plugin connects here; the config's `agentSocket`).
    pub cni_socket: PathBuf,
    /// The capture rules applied to every pod.
    pub capture: CaptureSpec,
    /// Directories holding bind-mounted pod namespaces, scanned at start and
    /// for liveness.
    pub netns_dirs: Vec<PathBuf>,
    /// procfs, scanned for `<pid>/ns/net`.
    pub proc_root: PathBuf,
    /// Namespaces whose pods are never enrolled (the agent's own).
    pub exclude_namespaces: Vec<String>,
    /// This node's Kubernetes name, written into every pod's owner tag. At
    /// start only pods tagged with this name are adopted; empty adopts every
    /// tagged pod.
    pub node_name: String,
    /// How often the agent looks for pods whose namespace is gone.
    pub reconcile_interval: Duration,
    /// Which pods the agent captures (besides `exclude_namespaces`, never).
    pub selection: Selection,
    /// The agent's own record of its enrolled pods (see the module docs,
    /// "Restart"), on the node where pods cannot write. `None`: nothing is
    /// recorded and rediscovery adopts no pod (owner tags in the pods'
    /// namespaces are pod-writable and never trusted alone).
    pub state_file: Option<PathBuf>,
    /// With [`Selection::All`] (no API server): the service accounts of pods
    /// enrolled through CNI, which passes none. A CNI ADD for a pod no rule
    /// covers is refused: the agent never guesses an identity. Unused with
    /// [`Selection::Kubernetes`], where the API server says it.
    pub service_accounts: Vec<ServiceAccountRule>,
    /// The uids whose processes may use the ZDS and CNI sockets (checked
    /// with SO_PEERCRED at accept, on top of the sockets' mode 0600). Default:
    /// root only.
    pub peer_uids: Vec<u32>,
    /// With a Kubernetes client (`ringway agent --kube`): keeps the
    /// `ambient.istio.io/redirection: enabled` annotation on the pods the agent
    /// captures, set once a pod's rules are in place and the proxy acked it,
    /// removed when the agent lets it go ([`crate::kube::Annotator`]; never in
    /// the way of a CNI ADD). `None`: no annotation.
    pub annotator: Option<crate::kube::Annotator>,
}

/// Which pods the node agent captures: the one rule of the CNI ADD and the
/// Kubernetes watch (pods of `exclude_namespaces` are never captured, whatever
/// the selection).
#[derive(Debug, Clone, Default)]
pub enum Selection {
    /// Every pod (no cluster: the sandbox, tests).
    #[default]
    All,
    /// The pods [`crate::kube::decide`] wants, answered by the watch's caches
    /// or the API server ([`Selector::selects`]). Give the same selector to
    /// [`crate::kube::run_watch`].
    Kubernetes(Selector),
}

impl Selection {
    /// Whether `pod` is to be captured, with `exclude_namespaces` applied first.
    /// With [`Selection::Kubernetes`] this may block on the API server (at most
    /// its lookup timeout): never call it from async code.
    pub fn selects(
        &self,
        pod: &Pod,
        exclude_namespaces: &[String],
    ) -> Result<Verdict, SelectError> {
        if exclude_namespaces.contains(&pod.namespace) {
            return Ok(Verdict::PassThrough(UnenrollReason::Excluded));
        }
        match self {
            Selection::All => Ok(Verdict::Capture),
            Selection::Kubernetes(selector) => {
                selector.selects(&pod.uid, &pod.namespace, &pod.name)
            }
        }
    }

    /// [`Selection::selects`], with the pod's service account when known: from
    /// the API server (or the watch's cache) with [`Selection::Kubernetes`], from
    /// `accounts` (the configured rules) with [`Selection::All`]. Never a guess.
    pub fn select(
        &self,
        pod: &Pod,
        exclude_namespaces: &[String],
        accounts: &[ServiceAccountRule],
    ) -> Result<Selected, SelectError> {
        if exclude_namespaces.contains(&pod.namespace) {
            return Ok(Selected {
                verdict: Verdict::PassThrough(UnenrollReason::Excluded),
                service_account: None,
            });
        }
        match self {
            Selection::All => Ok(Selected {
                verdict: Verdict::Capture,
                service_account: service_account_of(accounts, &pod.namespace, &pod.name)
                    .map(str::to_string),
            }),
            Selection::Kubernetes(selector) => selector.select(&pod.uid, &pod.namespace, &pod.name),
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            zds_socket: PathBuf::from(ringway_zds::DEFAULT_SOCKET),
            cni_socket: PathBuf::from(crate::conf::DEFAULT_AGENT_SOCKET),
            capture: CaptureSpec::default(),
            netns_dirs: vec![PathBuf::from(DEFAULT_NETNS_DIR)],
            proc_root: PathBuf::from("/proc"),
            exclude_namespaces: crate::conf::DEFAULT_EXCLUDE_NAMESPACES
                .iter()
                .map(|s| s.to_string())
                .collect(),
            node_name: String::new(),
            reconcile_interval: Duration::from_secs(30),
            selection: Selection::All,
            state_file: None,
            service_accounts: Vec::new(),
            peer_uids: vec![0],
            annotator: None,
        }
    }
}

/// A pod to enroll.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pod {
    /// Pod UID: the key the proxy knows the pod by (required).
    pub uid: String,
    /// Pod name (required).
    pub name: String,
    /// Pod namespace (required).
    pub namespace: String,
    /// Service account (required: the CNI ADD gets it from the API server or
    /// [`AgentConfig::service_accounts`], never by guessing; an enroll without
    /// one is refused).
    pub service_account: String,
    /// The pod's IPs.
    pub ips: Vec<IpAddr>,
    /// The CNI sandbox id, when enrolled through CNI: a DEL or GC for another
    /// sandbox of the same pod leaves this one alone.
    pub container_id: Option<String>,
}

impl std::fmt::Display for Pod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{} ({})", self.namespace, self.name, self.uid)
    }
}

/// An enrolled pod, as the agent holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodStatus {
    /// The pod.
    pub pod: Pod,
    /// Inode of the pod's netns while the agent holds it; `None` once the
    /// namespace is gone (the pod is sent as `Keep`).
    pub netns_inode: Option<u64>,
    /// Where the pod came from.
    pub source: PodSource,
}

/// How the agent learnt about a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodSource {
    /// [`Enrollment::enroll`] (CNI ADD or the Kubernetes watch).
    Enrolled,
    /// Rebuilt from an owner tag at start.
    Rediscovered,
}

/// A connected proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyStatus {
    /// Connection number (higher is newer).
    pub id: u64,
    /// The proxy's PID, from SO_PEERCRED.
    pub pid: Option<i32>,
    /// Snapshot delivered: eligible for new pods.
    pub ready: bool,
}

/// What rediscovery found at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rediscovery {
    /// Distinct network namespaces examined.
    pub namespaces: usize,
    /// UIDs of the pods rebuilt from their owner tags.
    pub adopted: Vec<String>,
    /// UIDs whose rules had drifted and were re-applied.
    pub reapplied: Vec<String>,
    /// Tagged namespaces that were skipped, and why (other node, unreadable tag,
    /// duplicate UID).
    pub skipped: Vec<String>,
}

/// Enrolling and removing pods: the one internal API behind CNI ADD/DEL and
/// the Kubernetes watch.
pub trait Enrollment: Send + Sync {
    /// Captures `pod` in `netns` and hands it to the newest ready proxy;
    /// returns once the proxy acknowledged it. See the module docs.
    fn enroll(&self, pod: Pod, netns: OwnedFd) -> Result<(), EnrollError>;
    /// Tells every proxy to drop the pod, removes its rules, forgets it.
    /// Unknown UIDs are fine.
    fn unenroll(&self, uid: &str) -> Result<(), EnrollError>;
    /// The enrolled pods.
    fn enrolled(&self) -> Vec<PodStatus>;
}

/// A cloneable handle on a running agent's enrollment (for the Kubernetes watch).
#[derive(Clone)]
pub struct Enroller(Arc<Core>);

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
        let core = Arc::new(Core::new(config));
        let report = discover::rediscover(&core);
        tracing::info!(
            namespaces = report.namespaces,
            adopted = report.adopted.len(),
            reapplied = report.reapplied.len(),
            skipped = report.skipped.len(),
            "rediscovery done"
        );
        let zds = zds_server::bind(&core.config().zds_socket)?;
        core.register_socket(&core.config().zds_socket);
        let cni = match cni_server::bind(&core.config().cni_socket) {
            Ok(l) => l,
            Err(e) => {
                // Leave nothing behind: the ZDS socket file, the pinned netns.
                drop(zds);
                core.begin_shutdown();
                core.finish_shutdown();
                return Err(e);
            }
        };
        core.register_socket(&core.config().cni_socket);
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
            let c = core.clone();
            threads.push(spawn(
                "ringway-zds-accept",
                Box::new(move || zds_server::accept_loop(c, zds)),
            )?);
            let c = core.clone();
            threads.push(spawn(
                "ringway-cni-accept",
                Box::new(move || cni_server::accept_loop(c, cni)),
            )?);
            let c = core.clone();
            threads.push(spawn(
                "ringway-reconcile",
                Box::new(move || c.reconcile_loop()),
            )?);
            Ok(())
        })();
        let handle = AgentHandle {
            core,
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
        let mut r = self.core.metrics.registry();
        r.register_collector(Box::new(metrics::EnrolledPods(self.core.clone())));
        if let Some(annotator) = &self.core.config().annotator {
            annotator.register_metrics(&mut r);
        }
        r
    }

    /// A liveness check that can live on another thread (for the agent's
    /// `/healthz/live`): `Ok` while the agent serves, `Err` naming what is wrong
    /// otherwise (shutting down; a socket file the CNI plugin or the proxies
    /// connect to has disappeared). It does not depend on a proxy: an agent
    /// waiting for its proxy is healthy and must not be restarted.
    pub fn liveness_source(
        &self,
    ) -> std::sync::Arc<dyn Fn() -> Result<String, String> + Send + Sync> {
        let core = self.core.clone();
        std::sync::Arc::new(move || live(&core).map(|()| "serving".to_owned()))
    }

    /// A readiness check that can live on another thread (for the agent's
    /// `/healthz/ready`): [`AgentHandle::liveness_source`], and a proxy has taken
    /// the snapshot. Until one has, every CNI ADD of a pod to capture fails with
    /// code 11 (try again later), so the agent does not claim to be ready.
    pub fn health_source(
        &self,
    ) -> std::sync::Arc<dyn Fn() -> Result<String, String> + Send + Sync> {
        let core = self.core.clone();
        std::sync::Arc::new(move || {
            live(&core)?;
            let proxies = core.proxies();
            let ready = proxies.iter().filter(|p| p.ready).count();
            if ready == 0 {
                return Err(format!(
                    "no proxy has taken the snapshot ({} connected): pods to capture cannot be added",
                    proxies.len()
                ));
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
        if self.threads.is_empty() && self.core.is_stopping() {
            return;
        }
        tracing::info!("node agent shutting down");
        self.core.begin_shutdown();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.core.finish_shutdown();
        tracing::info!("node agent stopped");
    }
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// See [`AgentHandle::liveness_source`].
fn live(core: &Core) -> Result<(), String> {
    if core.is_stopping() {
        return Err("the agent is shutting down".into());
    }
    let cfg = core.config();
    for (what, path) in [
        ("ZDS socket", &cfg.zds_socket),
        ("CNI event socket", &cfg.cni_socket),
    ] {
        if !path.exists() {
            return Err(format!("{what} {} is gone", path.display()));
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

    #[test]
    fn retryable_errors_are_the_proxy_side_ones() {
        assert!(EnrollError::NoProxy { last_error: None }.is_retryable());
        assert!(EnrollError::Nacked {
            uid: "u".into(),
            reason: "r".into()
        }
        .is_retryable());
        assert!(!EnrollError::BadInput("x".into()).is_retryable());
        assert_eq!(
            EnrollError::NoProxy {
                last_error: Some("proxy connection 3: the proxy closed the connection".into())
            }
            .to_string(),
            "no node proxy is ready to take the pod (last proxy failure: proxy connection 3: the proxy closed the connection)"
        );
    }
}
