//! `envoy.service.discovery.v3`: the delta ADS messages (and `Node`,
//! `google.rpc.Status`) as the workload API uses them. Only the fields the
//! protocol needs here are defined; a decoder skips the others (proto3).

use std::collections::HashMap;

/// `envoy.config.core.v3.Node`: who is asking.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Node {
    /// Opaque node identifier (the node proxy's:
    /// `ztunnel~<pod IP>~<pod name>.<namespace>~<namespace>.svc.<domain>`).
    #[prost(string, tag = "1")]
    pub id: String,
    /// The local service cluster (unused by the workload API).
    #[prost(string, tag = "2")]
    pub cluster: String,
    /// Opaque metadata (`NAME`, `NAMESPACE`, `INSTANCE_IPS`, `NODE_NAME`, ...).
    #[prost(message, optional, tag = "3")]
    pub metadata: Option<prost_types::Struct>,
}

/// `google.rpc.Status`: a NACK's reason.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    /// A `google.rpc.Code` (3, INVALID_ARGUMENT, for a NACK).
    #[prost(int32, tag = "1")]
    pub code: i32,
    /// Why, in English, for people.
    #[prost(string, tag = "2")]
    pub message: String,
    /// Structured details (unused here).
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<prost_types::Any>,
}

/// One resource of a delta response.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Resource {
    /// The resource's version, opaque (sent back in
    /// `initial_resource_versions` on reconnect).
    #[prost(string, tag = "1")]
    pub version: String,
    /// The resource itself.
    #[prost(message, optional, tag = "2")]
    pub resource: Option<prost_types::Any>,
    /// Its name, unique within its type.
    #[prost(string, tag = "3")]
    pub name: String,
    /// Other names it goes by (`<network>/<IP>` for addresses).
    #[prost(string, repeated, tag = "4")]
    pub aliases: Vec<String>,
    /// Time to live, when the server sets one.
    #[prost(message, optional, tag = "6")]
    pub ttl: Option<prost_types::Duration>,
}

/// Client -> server on the delta ADS stream: a subscription, an ACK or a
/// NACK.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaDiscoveryRequest {
    /// The node; set on the first request of each type on a stream.
    #[prost(message, optional, tag = "1")]
    pub node: Option<Node>,
    /// The type of resource this request is about.
    #[prost(string, tag = "2")]
    pub type_url: String,
    /// Names to add to the tracked set; empty on the first request means
    /// every resource of the type (wildcard).
    #[prost(string, repeated, tag = "3")]
    pub resource_names_subscribe: Vec<String>,
    /// Names to remove from the tracked set.
    #[prost(string, repeated, tag = "4")]
    pub resource_names_unsubscribe: Vec<String>,
    /// Name -> version of what the client holds, on the first request of
    /// each type of a (re)connected stream.
    #[prost(map = "string, string", tag = "5")]
    pub initial_resource_versions: HashMap<String, String>,
    /// The nonce of the response this ACKs or NACKs; empty otherwise.
    #[prost(string, tag = "6")]
    pub response_nonce: String,
    /// Set on a NACK: why the response was refused.
    #[prost(message, optional, tag = "7")]
    pub error_detail: Option<Status>,
}

/// Server -> client on the delta ADS stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaDiscoveryResponse {
    /// The server's version of its data, for debugging.
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    /// Resources added or changed.
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<Resource>,
    /// Their type.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// The nonce the answer must carry.
    #[prost(string, tag = "5")]
    pub nonce: String,
    /// Names of resources removed.
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}
