//! The messages of the workload API, written by hand with prost's derive
//! from the public schema's field numbers (no code generation, no protoc):
//!
//! - [`discovery`]: `envoy.service.discovery.v3` delta ADS
//!   ([`DeltaDiscoveryRequest`], [`DeltaDiscoveryResponse`], [`Resource`],
//!   [`Node`], and `google.rpc.Status` as [`Status`]);
//! - [`workload`]: `istio.workload` (an [`workload::Address`] is a
//!   [`workload::Workload`] or a [`workload::Service`]);
//! - [`security`]: `istio.security` ([`security::Authorization`]);
//! - [`wire`]: the fields of a policy's bytes that these structs do not
//!   name (prost drops them).
//!
//! [`TypedResource`] wraps and unwraps the two resource types in the `Any`
//! that carries them, checking the type URL.

pub mod discovery;
pub mod security;
pub mod wire;
pub mod workload;

#[cfg(test)]
mod tests;

use std::net::IpAddr;

pub use discovery::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Node, Resource, Status};
use prost::Message;

/// Type URL of workloads and services (`istio.workload.Address`).
pub const ADDRESS_TYPE_URL: &str = "type.googleapis.com/istio.workload.Address";

/// Type URL of L4 policies (`istio.security.Authorization`).
pub const AUTHORIZATION_TYPE_URL: &str = "type.googleapis.com/istio.security.Authorization";

/// The delta ADS method's gRPC path.
pub const DELTA_ADS_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// `google.rpc.Code` INVALID_ARGUMENT, the code of a NACK's `error_detail`.
pub const CODE_INVALID_ARGUMENT: i32 = 3;

/// A resource's `Any` could not be unwrapped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AnyError {
    /// The `Any` says another type.
    #[error("resource is of type {got:?}, expected {expected}")]
    WrongType {
        /// The type wanted.
        expected: &'static str,
        /// The `Any`'s type URL.
        got: String,
    },
    /// The payload is not a valid message of the type.
    #[error("resource is not a valid {what}: {source}")]
    Decode {
        /// The type wanted.
        what: &'static str,
        /// prost's reason.
        #[source]
        source: prost::DecodeError,
    },
}

/// A resource type of the workload API, carried in an `Any`.
pub trait TypedResource: Message + Default + Sized {
    /// Its type URL.
    const TYPE_URL: &'static str;

    /// Wrapped in an `Any` with its type URL.
    fn to_any(&self) -> prost_types::Any {
        prost_types::Any {
            type_url: Self::TYPE_URL.to_owned(),
            value: self.encode_to_vec(),
        }
    }

    /// Unwrapped from `any`, which must say this type.
    fn from_any(any: &prost_types::Any) -> Result<Self, AnyError> {
        if any.type_url != Self::TYPE_URL {
            return Err(AnyError::WrongType {
                expected: Self::TYPE_URL,
                got: any.type_url.clone(),
            });
        }
        Self::decode(any.value.as_slice()).map_err(|source| AnyError::Decode {
            what: Self::TYPE_URL,
            source,
        })
    }
}

impl TypedResource for workload::Address {
    const TYPE_URL: &'static str = ADDRESS_TYPE_URL;
}

impl TypedResource for security::Authorization {
    const TYPE_URL: &'static str = AUTHORIZATION_TYPE_URL;
}

impl Resource {
    /// A resource named `name` at `version` holding `payload`.
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        payload: prost_types::Any,
    ) -> Self {
        Resource {
            name: name.into(),
            version: version.into(),
            resource: Some(payload),
            aliases: Vec::new(),
            ttl: None,
        }
    }
}

impl Node {
    /// A node proxy's `Node` as the control plane expects it: `id`
    /// `ztunnel~<first pod IP>~<pod>.<namespace>~<namespace>.svc.<domain>`
    /// and `metadata` with `NAME`, `NAMESPACE`, `INSTANCE_IPS` (comma
    /// separated) and `NODE_NAME`. Add more with [`Node::with_metadata`].
    pub fn node_proxy(
        pod_ips: &[IpAddr],
        pod_name: &str,
        namespace: &str,
        node_name: &str,
        cluster_domain: &str,
    ) -> Node {
        let first = pod_ips.first().map(ToString::to_string).unwrap_or_default();
        let ips: Vec<String> = pod_ips.iter().map(ToString::to_string).collect();
        Node {
            id: format!("ztunnel~{first}~{pod_name}.{namespace}~{namespace}.svc.{cluster_domain}"),
            cluster: String::new(),
            metadata: None,
        }
        .with_metadata("NAME", pod_name)
        .with_metadata("NAMESPACE", namespace)
        .with_metadata("INSTANCE_IPS", &ips.join(","))
        .with_metadata("NODE_NAME", node_name)
    }

    /// With the string `value` at `key` of the metadata (replacing one).
    pub fn with_metadata(mut self, key: &str, value: &str) -> Node {
        self.metadata
            .get_or_insert_with(Default::default)
            .fields
            .insert(
                key.to_owned(),
                prost_types::Value {
                    kind: Some(prost_types::value::Kind::StringValue(value.to_owned())),
                },
            );
        self
    }

    /// The string at `key` of the metadata, if there is one.
    pub fn metadata_str(&self, key: &str) -> Option<&str> {
        match self.metadata.as_ref()?.fields.get(key)?.kind.as_ref()? {
            prost_types::value::Kind::StringValue(s) => Some(s),
            _ => None,
        }
    }
}

impl DeltaDiscoveryRequest {
    /// True when it answers a response (an ACK or a NACK).
    pub fn is_answer(&self) -> bool {
        !self.response_nonce.is_empty()
    }

    /// True for a NACK (an answer with an `error_detail`).
    pub fn is_nack(&self) -> bool {
        self.is_answer() && self.error_detail.is_some()
    }

    /// True for an ACK (an answer without an `error_detail`).
    pub fn is_ack(&self) -> bool {
        self.is_answer() && self.error_detail.is_none()
    }
}
