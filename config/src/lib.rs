//! ringway's node configuration and mesh model.
//!
//! - [`ProxySettings`] (capture mode, ports, marks, workers, buffers) with
//!   their defaults and [`ProxySettings::validate`];
//! - the configuration file, [`MeshConfig`]: the proxy settings plus the
//!   mesh a control plane would otherwise provide (trust domain, CA paths,
//!   workloads, services, authorization policies). It is parsed with serde
//!   (unknown fields refused), overridden by `RINGWAY_*` environment
//!   variables ([`ENV_VARS`], read through [`EnvSource`]), then validated
//!   into an immutable [`Mesh`] snapshot with lookup indexes;
//! - [`ConfigWatcher`]: hot reload of the file, publishing a new
//!   `Arc<Mesh>` only when an edit is valid;
//! - [`authz`]: the layer-4 authorization engine;
//! - [`Backoff`]: the exponential backoff (with [`Jitter`]) of every retry
//!   loop in ringway, each user with its own figures;
//! - [`enrollment`]: which pods are in the mesh (the
//!   `ringway.io/dataplane-mode` labels, and the Istio ambient mesh's
//!   `istio.io/dataplane-mode`), shared with the node agent;
//! - `kube` (feature `kube`): in a cluster, the workloads and services
//!   filled from Kubernetes (pods, services, EndpointSlices) through kube-rs
//!   watches, merged with the file's policies, trust domain and CA.
//!
//! Every error names where the value came from (file or variable), the
//! field path and the problem:
//! `config.yaml: workloads[2].ips[0]: "10.0.0.300" is not an IP address`.
//! The YAML schema is documented in `config/README.md`; the embedded
//! default is `config/default.yaml` ([`EMBEDDED_DEFAULT`]).
//!
//! ```
//! use ringway_config::authz::{evaluate, ConnInfo, Identity};
//! use ringway_config::{MeshConfig, NoEnv};
//!
//! let yaml = r#"
//! workloads:
//!   - {uid: u1, name: web-0, namespace: shop, ips: [10.0.0.1], node: node-a}
//! policies:
//!   - name: frontend-only
//!     namespace: shop
//!     action: ALLOW
//!     rules: [{from: [{principals: ["spiffe://cluster.local/ns/front/sa/frontend"]}]}]
//! "#;
//! let env = [("RINGWAY_WORKERS", "2")]; // in production: `ProcessEnv`
//! let mesh = MeshConfig::load_str(yaml, "config.yaml", &env)?;
//! assert_eq!(mesh.proxy().workers, 2);
//!
//! let web = mesh.workload_by_ip("10.0.0.1".parse().unwrap()).unwrap();
//! let frontend = Identity::from_spiffe_id("spiffe://cluster.local/ns/front/sa/frontend")?;
//! let conn = ConnInfo {
//!     src_ip: "10.0.1.7".parse().unwrap(),
//!     src_identity: Some(&frontend),
//!     dst_workload: web,
//!     dst_ip: web.ips[0],
//!     dst_port: 8080,
//! };
//! assert!(evaluate(&mesh, &conn).is_allowed());
//! let plaintext = ConnInfo { src_identity: None, ..conn };
//! assert_eq!(
//!     evaluate(&mesh, &plaintext).to_string(),
//!     "denied: 1 ALLOW policies apply (first: shop/frontend-only) and none matched"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod authz;
mod backoff;
mod control_thread;
pub mod enrollment;
mod env;
mod error;
mod file;
#[cfg(feature = "kube")]
pub mod kube;
mod load;
mod model;
mod names;
mod settings;
mod validate;
mod watch;

pub use backoff::{Backoff, Jitter};
pub use env::{EnvSource, EnvVar, NoEnv, ProcessEnv, ENV_VARS};
pub use error::{ConfigError, IoError};
pub use file::{
    CaConfig, ConditionConfig, LoadBalancingConfig, LocalityConfig, MeshConfig, OperationConfig,
    PeerAuthenticationConfig, PolicyConfig, PortMapConfig, RuleConfig, SelectorConfig,
    ServiceConfig, SourceConfig, WorkloadConfig, DEFAULT_CLUSTER_ID, DEFAULT_ROOT_NAMESPACE,
    DEFAULT_TRUST_DOMAIN, EMBEDDED_DEFAULT, EMBEDDED_ORIGIN, ENV_CLUSTER_ID, ENV_NODE_REGION,
    ENV_NODE_ZONE, ENV_ROOT_NAMESPACE, ENV_TRUST_DOMAIN, MAX_FILE_BYTES,
};
pub use model::{
    workload_name_of, Action, AuthorizationPolicy, CaPaths, CaService, Claimant, Clause,
    ClusterPolicyNote, Condition, EndpointPorts, EnvOverride, LbMode, LoadBalancing, Locality,
    Match, MatchFields, Mesh, MeshEdit, MtlsMode, Operation, PeerAuthentication, Rule, Scope,
    Service, ServiceAccountRef, Source, Unsupported, Values, Workload, CANONICAL_NAME_LABEL,
    CANONICAL_REVISION_LABEL, DEFAULT_CA_TOKEN_FILE,
};
pub use names::{Cidr, CidrError, StringMatch};
pub use settings::{
    CaptureMode, Datapath, HboneSettings, Ports, ProxySettings, ENV_BACKLOG, ENV_BUSY_POLL_MICROS,
    ENV_CAPTURE_MODE, ENV_CONNECT_TIMEOUT, ENV_DATAPATH, ENV_DRAIN_PERIOD, ENV_PIPE_POOL,
    ENV_PIPE_SIZE, ENV_PROXY_MARK, ENV_SAME_NODE_FAST_PATH, ENV_WORKERS, ENV_WORKLOAD_WAIT,
    MAX_WORKLOAD_WAIT,
};
pub use watch::{ConfigWatcher, FileWatcher, Loader, ThreadFailed, POLL_INTERVAL};

#[cfg(test)]
mod tests {
    #[test]
    fn shared_types_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<crate::Mesh>();
        send_sync::<crate::ConfigError>();
        send_sync::<crate::ConfigWatcher>();
        send_sync::<crate::authz::Decision>();
    }
}
