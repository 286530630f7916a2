//! `istio.workload`: the resources of type
//! `type.googleapis.com/istio.workload.Address`, each a workload or a
//! service. Enum fields stay `i32` (prost's way) so a value this crate has no
//! name for reaches the caller instead of being silently mapped; use the
//! `try_from` of the enum (or prost's generated accessors) to read them.

use std::collections::HashMap;

/// One `Address` resource: a workload or a service (the schema's `oneof
/// type`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Address {
    /// Which one; `None` when the server sent neither.
    #[prost(oneof = "address::Kind", tags = "1, 2")]
    pub kind: Option<address::Kind>,
}

/// The `Address` oneof.
pub mod address {
    /// A workload or a service.
    #[derive(Clone, PartialEq, prost::Oneof)]
    #[allow(
        clippy::large_enum_variant,
        reason = "one allocation per resource either way; unboxed variants keep the caller's matches plain"
    )]
    pub enum Kind {
        /// A pod, VM, ... (named by its `uid`).
        #[prost(message, tag = "1")]
        Workload(super::Workload),
        /// A service (named `<namespace>/<hostname>`).
        #[prost(message, tag = "2")]
        Service(super::Service),
    }
}

/// A service: a group of workloads reachable together.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Service {
    /// Kubernetes Service name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// FQDN (`<name>.<namespace>.svc.<domain>`).
    #[prost(string, tag = "3")]
    pub hostname: String,
    /// Addresses it is reached at (per network; empty when headless).
    #[prost(message, repeated, tag = "4")]
    pub addresses: Vec<NetworkAddress>,
    /// Service port -> target port.
    #[prost(message, repeated, tag = "5")]
    pub ports: Vec<Port>,
    /// SANs to verify instead of the workloads' identities, when set.
    #[prost(string, repeated, tag = "6")]
    pub subject_alt_names: Vec<String>,
    /// The service's waypoint, when it has one.
    #[prost(message, optional, tag = "7")]
    pub waypoint: Option<GatewayAddress>,
    /// Endpoint selection.
    #[prost(message, optional, tag = "8")]
    pub load_balancing: Option<LoadBalancing>,
    /// [`IpFamilies`].
    #[prost(enumeration = "IpFamilies", tag = "9")]
    pub ip_families: i32,
    /// Opaque extensions.
    #[prost(message, repeated, tag = "10")]
    pub extensions: Vec<Extension>,
    /// Takes priority in hostname lookups outside the client's namespace.
    #[prost(bool, tag = "11")]
    pub canonical: bool,
}

/// The IP families a service supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum IpFamilies {
    /// Inferred from the addresses.
    Automatic = 0,
    /// IPv4 only.
    Ipv4Only = 1,
    /// IPv6 only.
    Ipv6Only = 2,
    /// Both.
    Dual = 3,
}

/// How a workload's addresses are to be treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum NetworkMode {
    /// The address identifies the workload within its network.
    Standard = 0,
    /// The address is shared (host network): never look the workload up by it.
    HostNetwork = 1,
}

/// Endpoint selection for a service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LoadBalancing {
    /// [`load_balancing::Scope`]s to keep traffic within, in order.
    #[prost(enumeration = "load_balancing::Scope", repeated, tag = "1")]
    pub routing_preference: Vec<i32>,
    /// [`load_balancing::Mode`].
    #[prost(enumeration = "load_balancing::Mode", tag = "2")]
    pub mode: i32,
    /// [`load_balancing::HealthPolicy`].
    #[prost(enumeration = "load_balancing::HealthPolicy", tag = "3")]
    pub health_policy: i32,
    /// [`load_balancing::DnsConnectStrategy`].
    #[prost(enumeration = "load_balancing::DnsConnectStrategy", tag = "4")]
    pub dns_connect_strategy: i32,
}

/// The enums of [`LoadBalancing`].
pub mod load_balancing {
    /// A locality scope.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Scope {
        /// Unset.
        UnspecifiedScope = 0,
        /// Same region.
        Region = 1,
        /// Same zone.
        Zone = 2,
        /// Same subzone.
        Subzone = 3,
        /// Same node.
        Node = 4,
        /// Same cluster.
        Cluster = 5,
        /// Same network.
        Network = 6,
    }

    /// How the routing preferences apply.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Mode {
        /// Unset.
        UnspecifiedMode = 0,
        /// Only endpoints matching every preference.
        Strict = 1,
        /// Prefer the best match, fall back to fewer matches.
        Failover = 2,
        /// No endpoint selection: to the original destination.
        Passthrough = 3,
    }

    /// Which endpoints may be chosen.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum HealthPolicy {
        /// Healthy ones only.
        OnlyHealthy = 0,
        /// All of them.
        AllowAll = 1,
    }

    /// Connecting to DNS-resolved endpoints.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum DnsConnectStrategy {
        /// One randomly chosen address.
        Default = 0,
        /// Race all addresses, first handshake wins.
        FirstHealthyRace = 1,
    }
}

/// A workload: one pod, VM, ... (named by `uid`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Workload {
    /// Globally unique name (`<cluster>//v1/Pod/<ns>/<name>` for a pod).
    #[prost(string, tag = "20")]
    pub uid: String,
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// IP addresses, 4 or 16 bytes each.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub addresses: Vec<Vec<u8>>,
    /// A hostname to resolve instead of addresses.
    #[prost(string, tag = "21")]
    pub hostname: String,
    /// Its network (empty: the default one).
    #[prost(string, tag = "4")]
    pub network: String,
    /// [`TunnelProtocol`].
    #[prost(enumeration = "TunnelProtocol", tag = "5")]
    pub tunnel_protocol: i32,
    /// Trust domain (empty: `cluster.local`).
    #[prost(string, tag = "6")]
    pub trust_domain: String,
    /// Service account (empty: `default`).
    #[prost(string, tag = "7")]
    pub service_account: String,
    /// Its waypoint, when it has one.
    #[prost(message, optional, tag = "8")]
    pub waypoint: Option<GatewayAddress>,
    /// The east-west gateway it is reached through from other networks.
    #[prost(message, optional, tag = "19")]
    pub network_gateway: Option<GatewayAddress>,
    /// The node it runs on.
    #[prost(string, tag = "9")]
    pub node: String,
    /// Canonical name (telemetry).
    #[prost(string, tag = "10")]
    pub canonical_name: String,
    /// Canonical revision (telemetry).
    #[prost(string, tag = "11")]
    pub canonical_revision: String,
    /// [`WorkloadType`] (telemetry).
    #[prost(enumeration = "WorkloadType", tag = "12")]
    pub workload_type: i32,
    /// Name of the owning deployment, job, ... (telemetry).
    #[prost(string, tag = "13")]
    pub workload_name: String,
    /// Receives tunnel traffic directly.
    #[prost(bool, tag = "14")]
    pub native_tunnel: bool,
    /// What the workload accepts of tunnel information.
    #[prost(message, optional, tag = "23")]
    pub application_tunnel: Option<ApplicationTunnel>,
    /// Services it is an endpoint of: `<namespace>/<hostname>` -> ports.
    #[prost(map = "string, message", tag = "22")]
    pub services: HashMap<String, PortList>,
    /// Names of the WORKLOAD_SELECTOR policies that select it.
    #[prost(string, repeated, tag = "16")]
    pub authorization_policies: Vec<String>,
    /// [`WorkloadStatus`].
    #[prost(enumeration = "WorkloadStatus", tag = "17")]
    pub status: i32,
    /// The cluster it belongs to.
    #[prost(string, tag = "18")]
    pub cluster_id: String,
    /// Where it runs.
    #[prost(message, optional, tag = "24")]
    pub locality: Option<Locality>,
    /// [`NetworkMode`].
    #[prost(enumeration = "NetworkMode", tag = "25")]
    pub network_mode: i32,
    /// Opaque extensions.
    #[prost(message, repeated, tag = "26")]
    pub extensions: Vec<Extension>,
    /// Relative capacity (unset: 1).
    #[prost(message, optional, tag = "27")]
    pub capacity: Option<u32>,
}

/// Region, zone, subzone.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Locality {
    /// Region.
    #[prost(string, tag = "1")]
    pub region: String,
    /// Zone.
    #[prost(string, tag = "2")]
    pub zone: String,
    /// Subzone.
    #[prost(string, tag = "3")]
    pub subzone: String,
}

/// Whether a workload may receive traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum WorkloadStatus {
    /// Ready.
    Healthy = 0,
    /// Not ready.
    Unhealthy = 1,
}

/// The kind of object a workload belongs to (telemetry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum WorkloadType {
    /// A Deployment.
    Deployment = 0,
    /// A CronJob.
    Cronjob = 1,
    /// A bare pod.
    Pod = 2,
    /// A Job.
    Job = 3,
}

/// The ports of a workload for one service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PortList {
    /// The ports.
    #[prost(message, repeated, tag = "1")]
    pub ports: Vec<Port>,
}

/// A service port and where it forwards.
#[derive(Clone, Copy, PartialEq, Eq, prost::Message)]
pub struct Port {
    /// The port the service is reached at.
    #[prost(uint32, tag = "1")]
    pub service_port: u32,
    /// The workload's port.
    #[prost(uint32, tag = "2")]
    pub target_port: u32,
}

/// How to reach a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum TunnelProtocol {
    /// As is, no tunnel.
    None = 0,
    /// HBONE (HTTP CONNECT over mutual TLS).
    Hbone = 1,
}

/// What an application (a sandwiched waypoint, say) accepts of tunnel
/// information.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ApplicationTunnel {
    /// [`application_tunnel::Protocol`].
    #[prost(enumeration = "application_tunnel::Protocol", tag = "1")]
    pub protocol: i32,
    /// Port to send to after the last hop, when set.
    #[prost(uint32, tag = "2")]
    pub port: u32,
}

/// The enum of [`ApplicationTunnel`].
pub mod application_tunnel {
    /// The protocol the application understands.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub enum Protocol {
        /// Bytes unchanged.
        None = 0,
        /// A PROXY protocol header first.
        Proxy = 1,
    }
}

/// A gateway (waypoint or network gateway): a hostname or an address.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GatewayAddress {
    /// Where (the schema's `oneof destination`).
    #[prost(oneof = "gateway_address::Destination", tags = "1, 2")]
    pub destination: Option<gateway_address::Destination>,
    /// Its HBONE mTLS port.
    #[prost(uint32, tag = "3")]
    pub hbone_mtls_port: u32,
}

/// The `GatewayAddress` oneof.
pub mod gateway_address {
    /// A hostname or an address.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Destination {
        /// A service by namespace and hostname.
        #[prost(message, tag = "1")]
        Hostname(super::NamespacedHostname),
        /// An address in a network.
        #[prost(message, tag = "2")]
        Address(super::NetworkAddress),
    }
}

/// An IP address in a network.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NetworkAddress {
    /// The network (empty: the default one).
    #[prost(string, tag = "1")]
    pub network: String,
    /// 4 or 16 bytes.
    #[prost(bytes = "vec", tag = "2")]
    pub address: Vec<u8>,
}

/// A service by namespace and hostname.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespacedHostname {
    /// Namespace.
    #[prost(string, tag = "1")]
    pub namespace: String,
    /// Hostname.
    #[prost(string, tag = "2")]
    pub hostname: String,
}

/// Opaque extra configuration attached to an object.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Extension {
    /// Its name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its configuration.
    #[prost(message, optional, tag = "2")]
    pub config: Option<prost_types::Any>,
}
