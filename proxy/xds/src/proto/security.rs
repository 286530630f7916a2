//! `istio.security`: the resources of type
//! `type.googleapis.com/istio.security.Authorization`, one L4 policy each
//! (named `<namespace>/<name>`), already turned by the control plane from the
//! mesh's AuthorizationPolicy and PeerAuthentication objects. Enum fields
//! stay `i32` so unknown values reach the caller.

/// One L4 authorization policy.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Authorization {
    /// Policy name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its namespace.
    #[prost(string, tag = "2")]
    pub namespace: String,
    /// [`Scope`]: which workloads it applies to.
    #[prost(enumeration = "Scope", tag = "3")]
    pub scope: i32,
    /// [`Action`] when a rule matches.
    #[prost(enumeration = "Action", tag = "4")]
    pub action: i32,
    /// Rules; any may match.
    #[prost(message, repeated, tag = "5")]
    pub rules: Vec<Rule>,
    /// Evaluate and report, never enforce.
    #[prost(bool, tag = "6")]
    pub dry_run: bool,
}

/// A rule: every clause must match.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Rule {
    /// The clauses (from, to, when).
    #[prost(message, repeated, tag = "1")]
    pub clauses: Vec<Clause>,
}

/// A clause: any of its matches may match.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Clause {
    /// The matches.
    #[prost(message, repeated, tag = "2")]
    pub matches: Vec<Match>,
}

/// One match: values of one field are OR-ed, the fields set are AND-ed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Match {
    /// Source namespaces.
    #[prost(message, repeated, tag = "1")]
    pub namespaces: Vec<StringMatch>,
    /// Source namespaces excluded.
    #[prost(message, repeated, tag = "2")]
    pub not_namespaces: Vec<StringMatch>,
    /// Source principals (`<td>/ns/<ns>/sa/<sa>`).
    #[prost(message, repeated, tag = "3")]
    pub principals: Vec<StringMatch>,
    /// Source principals excluded.
    #[prost(message, repeated, tag = "4")]
    pub not_principals: Vec<StringMatch>,
    /// Source IP ranges.
    #[prost(message, repeated, tag = "5")]
    pub source_ips: Vec<Address>,
    /// Source IP ranges excluded.
    #[prost(message, repeated, tag = "6")]
    pub not_source_ips: Vec<Address>,
    /// Destination IP ranges.
    #[prost(message, repeated, tag = "7")]
    pub destination_ips: Vec<Address>,
    /// Destination IP ranges excluded.
    #[prost(message, repeated, tag = "8")]
    pub not_destination_ips: Vec<Address>,
    /// Destination ports.
    #[prost(uint32, repeated, tag = "9")]
    pub destination_ports: Vec<u32>,
    /// Destination ports excluded.
    #[prost(uint32, repeated, tag = "10")]
    pub not_destination_ports: Vec<u32>,
    /// Source service accounts.
    #[prost(message, repeated, tag = "11")]
    pub service_accounts: Vec<ServiceAccountMatch>,
    /// Source service accounts excluded.
    #[prost(message, repeated, tag = "12")]
    pub not_service_accounts: Vec<ServiceAccountMatch>,
}

/// A service account by namespace and name.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ServiceAccountMatch {
    /// Namespace.
    #[prost(string, tag = "1")]
    pub namespace: String,
    /// Service account name.
    #[prost(string, tag = "2")]
    pub service_account: String,
}

/// An IP range: address bytes (4 or 16) and prefix length.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Address {
    /// The address.
    #[prost(bytes = "vec", tag = "1")]
    pub address: Vec<u8>,
    /// Prefix length.
    #[prost(uint32, tag = "2")]
    pub length: u32,
}

/// A string matcher.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringMatch {
    /// How (the schema's `oneof match_type`); `None` when unset.
    #[prost(oneof = "string_match::MatchType", tags = "1, 2, 3, 4")]
    pub match_type: Option<string_match::MatchType>,
}

/// The `StringMatch` oneof.
pub mod string_match {
    /// Exact, prefix, suffix or presence.
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum MatchType {
        /// Equal to.
        #[prost(string, tag = "1")]
        Exact(String),
        /// Starts with.
        #[prost(string, tag = "2")]
        Prefix(String),
        /// Ends with.
        #[prost(string, tag = "3")]
        Suffix(String),
        /// Any non-empty value (`google.protobuf.Empty`).
        #[prost(message, tag = "4")]
        Presence(()),
    }
}

/// Which workloads a policy applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Scope {
    /// Every workload of the mesh.
    Global = 0,
    /// Workloads in the policy's namespace.
    Namespace = 1,
    /// Only workloads that list it in their `authorization_policies`.
    WorkloadSelector = 2,
}

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Action {
    /// Allow.
    Allow = 0,
    /// Deny.
    Deny = 1,
}
