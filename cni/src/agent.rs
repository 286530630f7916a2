//! The node-agent client abstraction: what the plugin asks of ringway's node agent.
//!
//! The real client is [`crate::node::UnixAgent`] (one JSON line each way over the
//! agent's unix socket); the driver only sees this trait, so every decision is
//! testable with `testing::FakeAgent` (the `testing` feature).
//! Each request carries the socket path from the config (`agentSocket`), so one
//! client value serves any config.

use std::path::PathBuf;

use crate::conf::Attachment;
use crate::env::PodRef;
use crate::result::PodIp;

/// The node agent, as seen from the plugin.
pub trait Agent {
    /// Captures a new pod: succeeds only once the pod's rules are in place and the
    /// node proxy has acknowledged the pod, or once the agent decided that its
    /// selection rule leaves the pod alone.
    fn add(&self, req: &AddRequest) -> Result<Added, AgentError>;
    /// Releases a pod. Called best-effort: the driver treats every failure as done.
    fn del(&self, req: &DelRequest) -> Result<(), AgentError>;
    /// Verifies that a pod is still captured.
    fn check(&self, req: &CheckRequest) -> Result<(), AgentError>;
    /// Whether the agent could capture a new pod now.
    fn status(&self, req: &StatusRequest) -> Result<(), AgentError>;
    /// Forgets every pod of the network that is not in the valid list.
    fn gc(&self, req: &GcRequest) -> Result<(), AgentError>;
}

/// What the agent did with an ADD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Added {
    /// The pod's rules are in place and the node proxy acknowledged the pod.
    Captured,
    /// The agent's selection rule leaves the pod uncaptured (e.g. not labelled for
    /// the mesh); the text says why.
    PassedThrough(String),
}

/// ADD for a pod that may be captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddRequest {
    /// The agent's socket (`agentSocket`).
    pub agent_socket: PathBuf,
    /// The network's `name`.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod, from `CNI_ARGS`.
    pub pod: PodRef,
    /// The pod's IPs, from `prevResult.ips`.
    pub ips: Vec<PodIp>,
}

/// DEL for a pod that may have been captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DelRequest {
    /// The agent's socket (`agentSocket`).
    pub agent_socket: PathBuf,
    /// The network's `name`.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`; `None` when the runtime no longer has the netns.
    pub netns: Option<PathBuf>,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod, from `CNI_ARGS`.
    pub pod: PodRef,
}

/// CHECK for a pod that should be captured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckRequest {
    /// The agent's socket (`agentSocket`).
    pub agent_socket: PathBuf,
    /// The network's `name`.
    pub network: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// The pod, from `CNI_ARGS`.
    pub pod: PodRef,
    /// The pod's IPs, from `prevResult.ips`.
    pub ips: Vec<PodIp>,
}

/// STATUS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRequest {
    /// The agent's socket (`agentSocket`).
    pub agent_socket: PathBuf,
    /// The network's `name`.
    pub network: String,
}

/// GC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcRequest {
    /// The agent's socket (`agentSocket`).
    pub agent_socket: PathBuf,
    /// The network's `name`.
    pub network: String,
    /// Attachments still in use; the agent drops state for every other one.
    pub valid_attachments: Vec<Attachment>,
}

/// Why the agent did not do what was asked. The variants say which side failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// The agent could not be reached (no socket, connection refused, timeout).
    #[error("node agent unavailable: {reason}")]
    Unavailable {
        /// What the client saw.
        reason: String,
    },
    /// The agent answered but cannot capture pods yet (rules not in place, or no
    /// node proxy connected to acknowledge the pod).
    #[error("node agent not ready: {reason}")]
    NotReady {
        /// What the agent said.
        reason: String,
    },
    /// The agent does not know the container (CHECK after a restart, DEL twice).
    #[error("node agent does not know container {container_id}")]
    UnknownContainer {
        /// `CNI_CONTAINERID`.
        container_id: String,
    },
    /// The agent answered and refused the request.
    #[error("node agent refused the request: {reason}")]
    Rejected {
        /// What the agent said.
        reason: String,
    },
    /// The agent's answer was not the protocol (bad status line, undecodable body).
    #[error("node agent answered outside the protocol: {reason}")]
    Protocol {
        /// What was wrong with the answer.
        reason: String,
    },
}
