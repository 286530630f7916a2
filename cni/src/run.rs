//! The driver: one plugin invocation, from environment and stdin to stdout and exit code.

use crate::agent::{
    AddRequest, Added, Agent, AgentError, CheckRequest, DelRequest, GcRequest, StatusRequest,
};
use crate::conf::{sniff_version, NetConf, VALID_ATTACHMENTS_KEY};
use crate::env::{
    CniArgs, Command, Env, EnvSource, PodRef, CNI_CONTAINERID, CNI_IFNAME, CNI_NETNS,
};
use crate::error::{CniError, ErrorCode};
use crate::result::PrevResult;
use crate::version::{version_info_json, CniVersion};

/// What the binary prints and how it exits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The whole of stdout, without a trailing newline (the binary adds one): the
    /// result (ADD), the version info (VERSION), an error object, or nothing.
    pub stdout: String,
    /// 0 on success, 1 on any error (the code is in the error object).
    pub exit_code: i32,
}

impl Outcome {
    fn ok(stdout: String) -> Self {
        Outcome {
            stdout,
            exit_code: 0,
        }
    }
}

/// Why an ADD leaves a pod alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassThrough {
    /// `CNI_ARGS` has no `K8S_POD_NAME`/`K8S_POD_NAMESPACE`: not a Kubernetes pod.
    NotAPod,
    /// The pod's namespace is in `excludeNamespaces` (ringway's own pods by default).
    ExcludedNamespace(String),
}

impl std::fmt::Display for PassThrough {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassThrough::NotAPod => f.write_str("CNI_ARGS names no Kubernetes pod"),
            PassThrough::ExcludedNamespace(ns) => {
                write!(f, "namespace {ns:?} is in excludeNamespaces")
            }
        }
    }
}

/// The pod to capture, or why there is none.
pub fn capture_target(args: &CniArgs, conf: &NetConf) -> Result<PodRef, PassThrough> {
    let pod = args.pod().ok_or(PassThrough::NotAPod)?;
    if conf.is_excluded(&pod.namespace) {
        return Err(PassThrough::ExcludedNamespace(pod.namespace));
    }
    Ok(pod)
}

/// Runs one invocation of the plugin. Never panics and never touches the process
/// environment; all I/O with the node agent goes through `agent`.
///
/// - ADD: prints `prevResult` back at the config's cniVersion. Pods that pass through
///   (see [`capture_target`]) are not sent to the agent. For the others the ADD
///   succeeds only when the agent captured the pod or its selection rule passed the
///   pod over; an agent that is unavailable or not ready (which includes "cannot tell
///   whether to capture the pod") gives code 11, so the runtime retries and a pod the
///   rule selects never runs uncaptured.
/// - DEL: always succeeds once the environment is valid (see "Why DEL never fails
///   on the agent" in the crate docs), even with a config it cannot fully parse: it
///   then uses the fields it could read and the defaults (`agentSocket`,
///   `excludeNamespaces`), and logs what it could not read.
/// - CHECK: asks the agent; an unknown container is code 3.
/// - STATUS: code 50 when the agent cannot capture a pod now.
/// - GC: hands the valid attachments to the agent.
/// - VERSION: the supported versions.
pub fn run(env: &dyn EnvSource, stdin: &[u8], agent: &dyn Agent) -> Outcome {
    match dispatch(env, stdin, agent) {
        Ok(stdout) => Outcome::ok(stdout),
        Err(err) => {
            // Errors are encoded at the config's version when it can be read.
            let version = sniff_version(stdin).unwrap_or(CniVersion::LATEST);
            tracing::warn!(
                cni.code = err.code.as_u32(),
                cni.msg = %err.msg,
                cni.details = %err.details,
                "CNI call failed"
            );
            Outcome {
                stdout: err.to_json(version),
                exit_code: 1,
            }
        }
    }
}

fn dispatch(env: &dyn EnvSource, stdin: &[u8], agent: &dyn Agent) -> Result<String, CniError> {
    let env = Env::parse(env)?;
    if env.command == Command::Version {
        return version(stdin);
    }
    let conf = match NetConf::parse(stdin) {
        Ok(conf) => conf,
        // DEL still does what it can: see [`NetConf::best_effort`].
        Err(err) if env.command == Command::Del => {
            let (conf, problems) = NetConf::best_effort(stdin);
            tracing::warn!(
                cni.command = %env.command,
                cni.container_id = env.container_id.as_deref().unwrap_or(""),
                cni.error = %err.msg,
                cni.unreadable = %problems.join("; "),
                agent.socket = %conf.agent_socket.display(),
                "network config cannot be fully read: DEL goes on with the fields it could read and defaults for the rest"
            );
            conf
        }
        Err(err) => return Err(err),
    };
    let span = tracing::info_span!(
        "cni",
        cni.command = %env.command,
        cni.container_id = env.container_id.as_deref().unwrap_or(""),
        cni.network = %conf.name,
    );
    let _enter = span.enter();
    for unknown in conf.unknown_keys() {
        tracing::warn!(
            cni.config_key = %unknown,
            "unknown key in ringway-cni's network config, ignored"
        );
    }
    match env.command {
        Command::Add => add(&env, &conf, agent),
        Command::Del => del(&env, &conf, agent),
        Command::Check => check(&env, &conf, agent),
        Command::Status => status(&conf, agent),
        Command::Gc => gc(&conf, agent),
        Command::Version => version(stdin),
    }
}

/// VERSION: echoes the caller's cniVersion when supported, else answers at the
/// newest version (the answer is for discovery: the list is what matters).
/// Empty stdin is allowed; stdin that is there must be JSON.
fn version(stdin: &[u8]) -> Result<String, CniError> {
    if stdin.iter().all(u8::is_ascii_whitespace) {
        return Ok(version_info_json(CniVersion::LATEST));
    }
    let value: serde_json::Value = serde_json::from_slice(stdin).map_err(|e| {
        CniError::new(
            ErrorCode::Decode,
            format!("network config is not valid JSON: {e}"),
        )
    })?;
    let version = value
        .get("cniVersion")
        .and_then(|v| v.as_str())
        .and_then(CniVersion::from_str_exact)
        .unwrap_or(CniVersion::LATEST);
    Ok(version_info_json(version))
}

fn add(env: &Env, conf: &NetConf, agent: &dyn Agent) -> Result<String, CniError> {
    let container_id = required(&env.container_id, CNI_CONTAINERID, env.command)?;
    let netns = required(&env.netns, CNI_NETNS, env.command)?;
    let ifname = required(&env.ifname, CNI_IFNAME, env.command)?;
    let prev = prev_result(conf)?;
    let output = prev.to_json(conf.cni_version);

    let pod = match capture_target(&env.args, conf) {
        Ok(pod) => pod,
        Err(why) => {
            tracing::info!(reason = %why, "pod passes through uncaptured");
            return Ok(output);
        }
    };
    let req = AddRequest {
        agent_socket: conf.agent_socket.clone(),
        network: conf.name.clone(),
        container_id: container_id.clone(),
        netns: netns.clone(),
        ifname: ifname.clone(),
        pod,
        ips: prev.ips().to_vec(),
    };
    match agent
        .add(&req)
        .map_err(|e| agent_failure(e, &req.agent_socket))?
    {
        Added::Captured => tracing::info!(k8s.pod = %req.pod, "pod captured"),
        Added::PassedThrough(why) => {
            tracing::info!(k8s.pod = %req.pod, reason = %why, "the node agent passes the pod through uncaptured")
        }
    }
    Ok(output)
}

/// DEL: idempotent, best-effort, and it succeeds whatever the agent says (the
/// crate docs say why). Agent failures are logged at warn.
fn del(env: &Env, conf: &NetConf, agent: &dyn Agent) -> Result<String, CniError> {
    let container_id = required(&env.container_id, CNI_CONTAINERID, env.command)?;
    let ifname = required(&env.ifname, CNI_IFNAME, env.command)?;
    // prevResult is not needed (and not decoded): a bad cached result must not block DEL.
    let pod = match capture_target(&env.args, conf) {
        Ok(pod) => pod,
        Err(why) => {
            tracing::debug!(reason = %why, "pod was not captured, nothing to release");
            return Ok(String::new());
        }
    };
    let req = DelRequest {
        agent_socket: conf.agent_socket.clone(),
        network: conf.name.clone(),
        container_id: container_id.clone(),
        netns: env.netns.clone(),
        ifname: ifname.clone(),
        pod,
    };
    match agent.del(&req) {
        Ok(()) => tracing::info!(k8s.pod = %req.pod, "pod released"),
        Err(AgentError::UnknownContainer { .. }) => {
            tracing::debug!(k8s.pod = %req.pod, "agent does not know the container: already released")
        }
        Err(e) => tracing::warn!(
            k8s.pod = %req.pod,
            error = %e,
            agent.socket = %req.agent_socket.display(),
            "DEL succeeds without the agent; it reconciles the pod later"
        ),
    }
    Ok(String::new())
}

fn check(env: &Env, conf: &NetConf, agent: &dyn Agent) -> Result<String, CniError> {
    needs_version(conf, Command::Check, CniVersion::V0_4_0)?;
    let container_id = required(&env.container_id, CNI_CONTAINERID, env.command)?;
    let netns = required(&env.netns, CNI_NETNS, env.command)?;
    let ifname = required(&env.ifname, CNI_IFNAME, env.command)?;
    let prev = prev_result(conf)?;
    let pod = match capture_target(&env.args, conf) {
        Ok(pod) => pod,
        Err(why) => {
            tracing::debug!(reason = %why, "pod passes through, nothing to check");
            return Ok(String::new());
        }
    };
    let req = CheckRequest {
        agent_socket: conf.agent_socket.clone(),
        network: conf.name.clone(),
        container_id: container_id.clone(),
        netns: netns.clone(),
        ifname: ifname.clone(),
        pod,
        ips: prev.ips().to_vec(),
    };
    agent
        .check(&req)
        .map_err(|e| agent_failure(e, &req.agent_socket))?;
    Ok(String::new())
}

fn status(conf: &NetConf, agent: &dyn Agent) -> Result<String, CniError> {
    needs_version(conf, Command::Status, CniVersion::V1_1_0)?;
    let req = StatusRequest {
        agent_socket: conf.agent_socket.clone(),
        network: conf.name.clone(),
    };
    agent.status(&req).map_err(|e| {
        // Whatever the reason, the plugin cannot serve ADD now.
        CniError::new(
            ErrorCode::NotAvailable,
            format!("plugin not available: {e}"),
        )
        .with_details(format!("agentSocket {}", req.agent_socket.display()))
    })?;
    Ok(String::new())
}

fn gc(conf: &NetConf, agent: &dyn Agent) -> Result<String, CniError> {
    needs_version(conf, Command::Gc, CniVersion::V1_1_0)?;
    if conf.disable_gc {
        tracing::info!("disableGC is set: GC does nothing");
        return Ok(String::new());
    }
    let Some(valid) = &conf.valid_attachments else {
        // An absent list must not read as "nothing is valid": that would drop every pod.
        return Err(CniError::new(
            ErrorCode::InvalidConfig,
            format!("GC needs {VALID_ATTACHMENTS_KEY:?} in the network config"),
        ));
    };
    let req = GcRequest {
        agent_socket: conf.agent_socket.clone(),
        network: conf.name.clone(),
        valid_attachments: valid.clone(),
    };
    match agent.gc(&req) {
        Ok(()) | Err(AgentError::UnknownContainer { .. }) => Ok(String::new()),
        Err(e) => Err(agent_failure(e, &req.agent_socket)),
    }
}

/// A variable `Env::parse` already required for the command; the error cannot occur
/// for an `Env` it produced, but an `Env` built by hand gets a proper one.
fn required<'a, T>(v: &'a Option<T>, name: &str, command: Command) -> Result<&'a T, CniError> {
    v.as_ref().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidEnvironment,
            format!(
                "required environment variable {name} is not set or empty (needed for {command})"
            ),
        )
    })
}

fn needs_version(conf: &NetConf, command: Command, min: CniVersion) -> Result<(), CniError> {
    if conf.cni_version < min {
        return Err(CniError::new(
            ErrorCode::IncompatibleVersion,
            format!(
                "config version {} does not allow {command} (needs {min} or later)",
                conf.cni_version
            ),
        ));
    }
    Ok(())
}

fn prev_result(conf: &NetConf) -> Result<PrevResult, CniError> {
    let raw = conf.prev_result.as_ref().ok_or_else(|| {
        CniError::new(
            ErrorCode::InvalidConfig,
            "network config has no \"prevResult\": must be chained after a plugin that returns a result",
        )
        .with_details(format!(
            "list {:?} after the main CNI plugin in the conflist's \"plugins\"",
            conf.plugin_type
        ))
    })?;
    PrevResult::parse(raw, conf.cni_version)
}

/// The error for a failed ADD, CHECK or GC call to the agent.
fn agent_failure(err: AgentError, socket: &std::path::Path) -> CniError {
    let socket = format!("agentSocket {}", socket.display());
    match err {
        AgentError::Unavailable { .. } | AgentError::NotReady { .. } => {
            CniError::new(ErrorCode::TryAgainLater, format!("try again later: {err}")).with_details(
                format!(
                    "{socket}; a pod does not start before ringway captures its traffic, \
             the runtime retries"
                ),
            )
        }
        AgentError::UnknownContainer { .. } => {
            CniError::new(ErrorCode::UnknownContainer, err.to_string()).with_details(socket)
        }
        AgentError::Rejected { .. } => {
            CniError::new(ErrorCode::AgentRejected, err.to_string()).with_details(socket)
        }
        AgentError::Protocol { .. } => {
            CniError::new(ErrorCode::AgentProtocol, err.to_string()).with_details(socket)
        }
    }
}

#[cfg(test)]
mod tests;
