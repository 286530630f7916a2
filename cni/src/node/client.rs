//! The plugin's side of the CNI event socket: [`UnixAgent`] implements
//! [`Agent`] with one connection and one request line per call.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::protocol::{AttachmentJson, ErrorKind as Kind, PodJson, Request, Response, MAX_LINE};
use super::{ACK_TIMEOUT, CNI_IO_TIMEOUT};
use crate::agent::{
    AddRequest, Added, Agent, AgentError, CheckRequest, DelRequest, GcRequest, StatusRequest,
};
use crate::env::PodRef;

/// The node agent over its unix socket (`agentSocket`).
///
/// A missing socket, a refused connection or a timeout is
/// [`AgentError::Unavailable`]; the agent's "not ready" (no proxy, the proxy
/// refused the pod) is [`AgentError::NotReady`]: both make ADD answer code 11
/// so the runtime retries.
#[derive(Debug, Clone)]
pub struct UnixAgent {
    /// How long to wait for the answer once the request is sent. The default
    /// covers the agent's own deadlines: rules plus the proxy's ack
    /// ([`ACK_TIMEOUT`]), with room to spare.
    pub response_timeout: Duration,
}

impl Default for UnixAgent {
    fn default() -> Self {
        UnixAgent {
            response_timeout: ACK_TIMEOUT * 2 + CNI_IO_TIMEOUT,
        }
    }
}

fn pod_json(pod: &PodRef) -> PodJson {
    PodJson {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        uid: pod.uid.clone(),
        service_account: None,
    }
}

impl UnixAgent {
    /// Sends `req` and returns the agent's answer. `container_id` names the
    /// container in [`AgentError::UnknownContainer`].
    fn call(&self, socket: &Path, req: &Request, container_id: &str) -> Result<(), AgentError> {
        self.call_for(socket, req, container_id).map(|_| ())
    }

    /// [`UnixAgent::call`], returning the `passThrough` text of a success.
    fn call_for(
        &self,
        socket: &Path,
        req: &Request,
        container_id: &str,
    ) -> Result<Option<String>, AgentError> {
        let unavailable = |reason: String| AgentError::Unavailable { reason };
        let mut s = UnixStream::connect(socket)
            .map_err(|e| unavailable(format!("cannot connect to {}: {e}", socket.display())))?;
        s.set_write_timeout(Some(CNI_IO_TIMEOUT))
            .and_then(|()| s.write_all(format!("{}\n", req.to_line()).as_bytes()))
            .map_err(|e| {
                unavailable(format!("sending the request to {}: {e}", socket.display()))
            })?;
        let line = self.read_line(&mut s, socket)?;
        let resp: Response = serde_json::from_str(&line).map_err(|e| AgentError::Protocol {
            reason: format!("the answer is not a response: {e}: {line:?}"),
        })?;
        if resp.ok {
            return Ok(resp.pass_through);
        }
        let text = resp.error.unwrap_or_default();
        match resp.kind {
            Some(Kind::NotReady) => Err(AgentError::NotReady { reason: text }),
            Some(Kind::UnknownContainer) => Err(AgentError::UnknownContainer {
                container_id: container_id.to_string(),
            }),
            Some(Kind::Rejected) | Some(Kind::BadRequest) => {
                Err(AgentError::Rejected { reason: text })
            }
            None => Err(AgentError::Protocol {
                reason: format!("a failed response without a kind: {line:?}"),
            }),
        }
    }

    fn read_line(&self, s: &mut UnixStream, socket: &Path) -> Result<String, AgentError> {
        let deadline = Instant::now() + self.response_timeout;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(AgentError::Unavailable {
                    reason: format!(
                        "no answer from {} within {}s",
                        socket.display(),
                        self.response_timeout.as_secs()
                    ),
                });
            }
            s.set_read_timeout(Some(left))
                .map_err(|e| AgentError::Unavailable {
                    reason: format!("reading from {}: {e}", socket.display()),
                })?;
            match s.read(&mut chunk) {
                Ok(0) => {
                    return Err(AgentError::Protocol {
                        reason: format!(
                            "the agent closed the connection without a full answer ({} bytes)",
                            buf.len()
                        ),
                    })
                }
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                        buf.truncate(pos);
                        return Ok(String::from_utf8_lossy(&buf).into_owned());
                    }
                    if buf.len() > MAX_LINE {
                        return Err(AgentError::Protocol {
                            reason: format!("the answer is longer than {MAX_LINE} bytes"),
                        });
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => {
                    return Err(AgentError::Unavailable {
                        reason: format!("reading from {}: {e}", socket.display()),
                    })
                }
            }
        }
    }
}

fn ips(ips: &[crate::result::PodIp]) -> Vec<String> {
    ips.iter()
        .map(|ip| format!("{}/{}", ip.addr, ip.prefix_len))
        .collect()
}

impl Agent for UnixAgent {
    fn add(&self, req: &AddRequest) -> Result<Added, AgentError> {
        let r = Request::Add {
            network: req.network.clone(),
            container_id: req.container_id.clone(),
            netns: req.netns.to_string_lossy().into_owned(),
            ifname: req.ifname.clone(),
            pod: pod_json(&req.pod),
            ips: ips(&req.ips),
        };
        Ok(
            match self.call_for(&req.agent_socket, &r, &req.container_id)? {
                None => Added::Captured,
                Some(why) => Added::PassedThrough(why),
            },
        )
    }

    fn del(&self, req: &DelRequest) -> Result<(), AgentError> {
        let r = Request::Del {
            network: req.network.clone(),
            container_id: req.container_id.clone(),
            netns: req.netns.as_ref().map(|p| p.to_string_lossy().into_owned()),
            ifname: req.ifname.clone(),
            pod: pod_json(&req.pod),
        };
        self.call(&req.agent_socket, &r, &req.container_id)
    }

    fn check(&self, req: &CheckRequest) -> Result<(), AgentError> {
        let r = Request::Check {
            network: req.network.clone(),
            container_id: req.container_id.clone(),
            netns: req.netns.to_string_lossy().into_owned(),
            ifname: req.ifname.clone(),
            pod: pod_json(&req.pod),
            ips: ips(&req.ips),
        };
        self.call(&req.agent_socket, &r, &req.container_id)
    }

    fn status(&self, req: &StatusRequest) -> Result<(), AgentError> {
        let r = Request::Status {
            network: req.network.clone(),
        };
        self.call(&req.agent_socket, &r, "")
    }

    fn gc(&self, req: &GcRequest) -> Result<(), AgentError> {
        let r = Request::Gc {
            network: req.network.clone(),
            valid_attachments: req
                .valid_attachments
                .iter()
                .map(|a| AttachmentJson {
                    container_id: a.container_id.clone(),
                    ifname: a.ifname.clone(),
                })
                .collect(),
        };
        self.call(&req.agent_socket, &r, "")
    }
}
