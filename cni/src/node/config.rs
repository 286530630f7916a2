//! The agent's settings, above the pod model: [`AgentConfig`], the
//! selection rule it applies ([`Selection`]), and the agent's fixed limits
//! and defaults.

use std::path::PathBuf;
use std::time::Duration;

use ringway_redirect::CaptureSpec;

use super::accounts::{service_account_of, ServiceAccountRule};
use super::pod::Pod;
use crate::conf::{DEFAULT_AGENT_SOCKET, DEFAULT_EXCLUDE_NAMESPACES};
use crate::kube::{Annotator, SelectError, Selected, Selector, UnenrollReason, Verdict};

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
    /// How often the agent looks for pods whose namespace is gone, and
    /// verifies (and repairs) every held pod's capture.
    pub reconcile_interval: Duration,
    /// Which pods the agent captures (besides `exclude_namespaces`, never).
    pub selection: Selection,
    /// The agent's own record of its enrolled pods (see the node agent's module docs,
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
    pub annotator: Option<Annotator>,
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
            cni_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            capture: CaptureSpec::default(),
            netns_dirs: vec![PathBuf::from(DEFAULT_NETNS_DIR)],
            proc_root: PathBuf::from("/proc"),
            exclude_namespaces: DEFAULT_EXCLUDE_NAMESPACES
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
