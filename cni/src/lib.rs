//! ringway's CNI plugin, as a library: the CNI 1.0.0/1.1.0 contract of a **chained**
//! plugin, pure and testable without a container runtime.
//!
//! The runtime runs the plugin binary last in the node's conflist, with the call in
//! `CNI_*` environment variables ([`env`](mod@env)) and the network config on stdin
//! ([`conf`]). [`run`] turns both into what the binary prints and its exit code
//! ([`Outcome`]), talking to ringway's node agent only through the [`Agent`] trait.
//! The plugin binary (`ringway` run as `ringway-cni`, in the `ringway` crate) does no
//! more than gather the inputs ([`ProcessEnv`], stdin), pick the real agent client
//! ([`node::UnixAgent`]), print `stdout` with a newline and exit with `exit_code`.
//!
//! | command | what happens | stdout |
//! | --- | --- | --- |
//! | ADD | pass-through pods are left alone; the others go to the agent, which captures them or passes them over by its selection rule, and the ADD fails with code 11 until it has answered (the runtime retries: a selected pod never runs uncaptured) | `prevResult`, re-encoded at the config's cniVersion |
//! | DEL | the agent releases the pod; always succeeds (see below) | nothing |
//! | CHECK (0.4.0+) | the agent confirms the pod is captured | nothing |
//! | STATUS (1.1.0+) | code 50 unless the agent could capture a pod now | nothing |
//! | GC (1.1.0+) | the agent drops state of attachments not in `cni.dev/valid-attachments` ∪ `cni.dev/attachments` | nothing |
//! | VERSION | | `{"cniVersion":..,"supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}` |
//!
//! Errors are printed on stdout as `{"cniVersion","code","msg","details"}` with exit
//! code 1 ([`CniError`], [`ErrorCode`]); `msg` names the variable, field or value
//! that was wrong.
//!
//! # Pass-through pods
//! A pod is not captured when `CNI_ARGS` does not name a Kubernetes pod
//! (`K8S_POD_NAME` and `K8S_POD_NAMESPACE`), or when its namespace is in the config's
//! `excludeNamespaces` (default `["ringway-system"]`: the node agent's own pods must
//! start without waiting for the agent). See [`capture_target`]. The agent then
//! applies its own selection rule (in a cluster: the `ringway.io/dataplane-mode`
//! and `istio.io/dataplane-mode` labels, the same rule as its Kubernetes watch, see [`node`] and [`kube`]) and may
//! answer that the pod passes through ([`Added::PassedThrough`]): the ADD prints
//! `prevResult` back as for any other pass-through pod.
//!
//! # Why DEL never fails on the agent
//! Once the environment and config are valid, DEL succeeds whatever the agent says
//! (unreachable, not ready, refusing), logging the failure at warn:
//! - a failed DEL is retried by the runtime and blocks removal of the sandbox, so an
//!   agent outage would leave every deleted pod of the node stuck terminating;
//! - the capture rules live inside the pod's network namespace and disappear with it,
//!   so a missed DEL cannot leave another pod's traffic redirected;
//! - what remains is the agent's own bookkeeping, which the agent is required to
//!   reconcile against the pods that exist (and GC hands it the valid attachments).
//!
//! A DEL with an empty `CNI_NETNS` (the netns is already gone) or for a container
//! the agent does not know is the normal case of a repeated DEL.
//!
//! # Plugin config fields
//! Besides the spec's fields: `agentSocket` (absolute path, default
//! [`conf::DEFAULT_AGENT_SOCKET`]), `logFile` (absolute path), `logLevel`
//! (`error`..`trace`, default `warn`), `excludeNamespaces` (list of namespaces).
//! The binary appends its log to `logFile` (stderr when unset, which runtimes
//! mostly swallow) at `logLevel`; `RINGWAY_CNI_LOG` (a tracing filter) overrides
//! the level. Unknown fields are kept in [`NetConf::extra`], and each one that
//! neither the spec nor ringway defines is named in a warning in the log
//! ([`NetConf::unknown_keys`]): runtimes add keys of their own, so it is not an
//! error, but a misspelled `agentSocket` would otherwise silently mean the
//! default socket.
//!
//! # DEL with a config that cannot be fully parsed
//! DEL does not fail on such a config: runtimes run DEL through the chain in
//! reverse order, so a failing ringway-cni would keep the primary plugin from
//! releasing the pod's interface and address lease. It uses the fields it can
//! read, the defaults for the rest, and logs what it could not read
//! ([`NetConf::best_effort`]).

#![forbid(unsafe_code)]

pub mod agent;
pub mod conf;
pub mod env;
pub mod error;
pub mod install;
pub mod kube;
pub mod node;
pub mod result;
mod run;
pub mod version;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use agent::{
    AddRequest, Added, Agent, AgentError, CheckRequest, DelRequest, GcRequest, StatusRequest,
};
pub use conf::{Attachment, LogLevel, NetConf};
pub use env::{CniArgs, Command, Env, EnvSource, PodRef, ProcessEnv};
pub use error::{CniError, ErrorCode};
pub use result::{PodIp, PodIpError, PrevResult};
pub use run::{capture_target, run, Outcome, PassThrough};
pub use version::{CniVersion, UnsupportedVersion, SUPPORTED_VERSIONS};
