//! The mesh model, the crate's bottom layer: the validated, immutable
//! snapshot ([`Mesh`]) of workloads, services and policies, its catalog of
//! persistent maps and indexes, and the identity a workload has.
//!
//! Everything else builds on it (the file schema and the environment, the
//! validation that turns them into a snapshot, authorization, the
//! Kubernetes source); it uses only the leaves below it: [`crate::names`]
//! (names, globs and CIDR blocks) and [`crate::settings`] (the proxy
//! settings a snapshot carries).
//!
//! - `identity`: a workload's SPIFFE identity;
//! - `workload`: workloads and services;
//! - `policy`: authorization policies and PeerAuthentications;
//! - `catalog`: the persistent maps holding them, and their indexes;
//! - `mesh`: the snapshot and its edits.

mod catalog;
mod identity;
mod mesh;
mod policy;
mod workload;

pub(crate) use self::catalog::Catalog;
pub use self::catalog::{Claimant, EndpointPorts};
pub use self::identity::{Identity, IdentityError};
pub use self::mesh::{CaPaths, CaService, EnvOverride, Mesh, MeshEdit, DEFAULT_CA_TOKEN_FILE};
pub use self::policy::{
    Action, AuthorizationPolicy, Clause, ClusterPolicyNote, Condition, Match, MatchFields,
    MtlsMode, Operation, PeerAuthentication, Rule, ServiceAccountRef, Source, Values,
};
pub use self::workload::{
    workload_name_of, LbMode, LoadBalancing, Locality, Scope, Service, Unsupported, Workload,
    CANONICAL_NAME_LABEL, CANONICAL_REVISION_LABEL,
};
