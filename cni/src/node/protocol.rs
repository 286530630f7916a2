//! The CNI event socket's protocol: one JSON object per line each way, on a
//! unix stream socket (`agentSocket`, mode 0600), one request per connection.
//!
//! Requests (`op` first; unknown fields are ignored):
//!
//! ```text
//! {"op":"add","network":"k8s-pod-network","containerId":"c0ffee","netns":"/var/run/netns/cni-1",
//!  "ifname":"eth0","pod":{"name":"web-0","namespace":"shop","uid":"8f3c...","serviceAccount":"web"},
//!  "ips":["10.244.1.5/24","fd00::5/64"]}
//! {"op":"del","network":"..","containerId":"c0ffee","netns":"/var/run/netns/cni-1" or null,
//!  "ifname":"eth0","pod":{"name":"web-0","namespace":"shop","uid":"8f3c..."}}
//! {"op":"check", ...same fields as add...}
//! {"op":"status","network":".."}
//! {"op":"gc","network":"..","validAttachments":[{"containerId":"c0ffee","ifname":"eth0"}]}
//! ```
//!
//! `pod.uid` is `K8S_POD_UID`. An add or check without it is matched by
//! name: the pod held with that sandbox, else (with `--kube`) the API
//! server's pod of that name on this node; a pod of an excluded namespace
//! passes through without it; without the API it is refused (see
//! [`super`], "The pod's identity"). Del finds the pod by `containerId` when
//! it is missing.
//! `pod.serviceAccount` is optional.
//!
//! Responses: `{"ok":true}`, `{"ok":true,"passThrough":"why"}` (add, check:
//! the agent's selection rule leaves the pod alone: no rules, nothing sent to
//! the proxy) or `{"ok":false,"kind":K,"error":"text"}` where K is
//! - `notReady`: retry later (no proxy ready, the proxy refused the pod, the
//!   pod is busy, the agent is stopping, the Kubernetes API server could not
//!   say whether to capture the pod): the plugin answers CNI code 11;
//! - `unknownContainer`: CHECK for a sandbox the agent does not hold;
//! - `rejected`: the request was understood and refused (bad pod or netns,
//!   rules could not be programmed);
//! - `badRequest`: the request is not the protocol (the text says why).

use serde::{Deserialize, Serialize};

/// The longest request or response line accepted, newline included.
pub const MAX_LINE: usize = 64 * 1024;

/// The `kind` of a failed response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorKind {
    /// Retry later.
    NotReady,
    /// The container is not known.
    UnknownContainer,
    /// Refused.
    Rejected,
    /// Not the protocol.
    BadRequest,
}

/// One response line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Success.
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
    /// The error text, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Why the agent leaves the pod uncaptured, when `ok` is true and it does.
    #[serde(
        default,
        rename = "passThrough",
        skip_serializing_if = "Option::is_none"
    )]
    pub pass_through: Option<String>,
}

impl Response {
    /// `{"ok":true}`.
    pub fn ok() -> Response {
        Response {
            ok: true,
            kind: None,
            error: None,
            pass_through: None,
        }
    }

    /// `{"ok":true,"passThrough":..}`.
    pub fn pass_through(why: impl Into<String>) -> Response {
        Response {
            pass_through: Some(why.into()),
            ..Response::ok()
        }
    }

    /// `{"ok":false,"kind":..,"error":..}`.
    pub fn err(kind: ErrorKind, error: impl Into<String>) -> Response {
        Response {
            ok: false,
            kind: Some(kind),
            error: Some(error.into()),
            pass_through: None,
        }
    }

    /// The line to send (without the newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| r#"{"ok":false}"#.to_string())
    }
}

/// The pod part of a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodJson {
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `K8S_POD_UID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// Service account, when the caller knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

/// One attachment of a GC request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachmentJson {
    /// Sandbox id.
    pub container_id: String,
    /// Interface name.
    pub ifname: String,
}

/// A request, as the client builds it. The server parses requests field by
/// field instead, to name exactly what is missing or malformed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// CNI ADD.
    #[serde(rename_all = "camelCase")]
    Add {
        /// Network name.
        network: String,
        /// `CNI_CONTAINERID`.
        container_id: String,
        /// `CNI_NETNS`.
        netns: String,
        /// `CNI_IFNAME`.
        ifname: String,
        /// The pod.
        pod: PodJson,
        /// `address/prefix` strings.
        ips: Vec<String>,
    },
    /// CNI DEL.
    #[serde(rename_all = "camelCase")]
    Del {
        /// Network name.
        network: String,
        /// `CNI_CONTAINERID`.
        container_id: String,
        /// `CNI_NETNS`, when the runtime still has it.
        netns: Option<String>,
        /// `CNI_IFNAME`.
        ifname: String,
        /// The pod.
        pod: PodJson,
    },
    /// CNI CHECK.
    #[serde(rename_all = "camelCase")]
    Check {
        /// Network name.
        network: String,
        /// `CNI_CONTAINERID`.
        container_id: String,
        /// `CNI_NETNS`.
        netns: String,
        /// `CNI_IFNAME`.
        ifname: String,
        /// The pod.
        pod: PodJson,
        /// `address/prefix` strings.
        ips: Vec<String>,
    },
    /// CNI STATUS.
    Status {
        /// Network name.
        network: String,
    },
    /// CNI GC.
    #[serde(rename_all = "camelCase")]
    Gc {
        /// Network name.
        network: String,
        /// Attachments still in use.
        valid_attachments: Vec<AttachmentJson>,
    },
}

impl Request {
    /// The line to send (without the newline).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_as_documented() {
        let r = Request::Add {
            network: "k8s".into(),
            container_id: "c1".into(),
            netns: "/run/netns/p".into(),
            ifname: "eth0".into(),
            pod: PodJson {
                name: "web-0".into(),
                namespace: "shop".into(),
                uid: Some("u1".into()),
                service_account: None,
            },
            ips: vec!["10.0.0.5/24".into()],
        };
        assert_eq!(
            r.to_line(),
            r#"{"op":"add","network":"k8s","containerId":"c1","netns":"/run/netns/p","ifname":"eth0","pod":{"name":"web-0","namespace":"shop","uid":"u1"},"ips":["10.0.0.5/24"]}"#
        );
        let r = Request::Gc {
            network: "k8s".into(),
            valid_attachments: vec![AttachmentJson {
                container_id: "c1".into(),
                ifname: "eth0".into(),
            }],
        };
        assert_eq!(
            r.to_line(),
            r#"{"op":"gc","network":"k8s","validAttachments":[{"containerId":"c1","ifname":"eth0"}]}"#
        );
        assert_eq!(
            Request::Status {
                network: "k8s".into()
            }
            .to_line(),
            r#"{"op":"status","network":"k8s"}"#
        );
        assert_eq!(Response::ok().to_line(), r#"{"ok":true}"#);
        assert_eq!(
            Response::pass_through("pod label disabled").to_line(),
            r#"{"ok":true,"passThrough":"pod label disabled"}"#
        );
        assert_eq!(
            Response::err(ErrorKind::NotReady, "no proxy").to_line(),
            r#"{"ok":false,"kind":"notReady","error":"no proxy"}"#
        );
    }
}
