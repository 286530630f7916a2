//! The command line: every command's arguments, as clap reads them (the
//! README's commands table is checked against these fields).

use crate::xds;
use clap::Parser;
use clap::Subcommand;
use clap::ValueEnum;
use ringway_config::CaptureMode;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "ringway",
    version,
    about = "Per-node transparent proxy for Kubernetes pods"
)]
pub(crate) struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `ringway_proxy=debug`.
    #[arg(long, global = true, env = "RINGWAY_LOG", default_value = "info")]
    pub(crate) log: String,
    /// Log format.
    #[arg(long, global = true, value_enum, env = "RINGWAY_LOG_FORMAT", default_value_t = LogFormat::Auto)]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable on a terminal, JSON otherwise.
    Auto,
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Build an isolated virtual node here, capture its pods, run the proxy
    /// and a demo, then clean up (root, or CAP_NET_ADMIN + CAP_SYS_ADMIN).
    #[cfg(feature = "sandbox")]
    Sandbox(SandboxArgs),
    /// Run the node proxy for the given pods until SIGTERM/SIGINT.
    Proxy(ProxyArgs),
    /// The node agent: CNI events, capture rules, and the pods' handoff to
    /// the proxy over ZDS. SIGTERM stops it and leaves pods and rules alone.
    Agent(AgentArgs),
    /// The certificate service: signs workload certificates from CSRs for
    /// callers authenticated by Kubernetes TokenReview (the mesh's
    /// IstioCertificateService over gRPC/TLS). The only component that holds
    /// the root key.
    Ca(CaArgs),
    /// Manage one pod's capture rules.
    Redirect {
        #[command(subcommand)]
        action: RedirectAction,
    },
}

#[derive(clap::Args, Debug)]
pub(crate) struct CaArgs {
    /// Where the gRPC/TLS service listens (the reference control plane uses 15012).
    #[arg(long, env = "RINGWAY_CA_LISTEN", default_value = "0.0.0.0:15012")]
    pub(crate) listen: std::net::SocketAddr,
    /// The service's own serving certificate (PEM chain), valid for the name
    /// proxies dial.
    #[arg(long, env = "RINGWAY_CA_TLS_CERT")]
    pub(crate) tls_cert: PathBuf,
    /// Its key (PEM).
    #[arg(long, env = "RINGWAY_CA_TLS_KEY")]
    pub(crate) tls_key: PathBuf,
    /// A signing CA certificate (PEM); repeat with --root-key for each root
    /// during a rotation: the newest valid one signs.
    #[arg(long = "root-cert", required = true)]
    pub(crate) root_certs: Vec<PathBuf>,
    /// The key of the --root-cert at the same position.
    #[arg(long = "root-key", required = true)]
    pub(crate) root_keys: Vec<PathBuf>,
    /// The mesh's trust domain.
    #[arg(long, env = "RINGWAY_TRUST_DOMAIN", default_value = "cluster.local")]
    pub(crate) trust_domain: String,
    /// `namespace/serviceAccount` of the node proxies: the only callers that
    /// may ask for the identity of a pod on their node.
    #[arg(
        long,
        env = "RINGWAY_CA_NODE_PROXY_SA",
        default_value = "ringway-system/ringway-proxy"
    )]
    pub(crate) node_proxy_sa: String,
    /// The audience callers' tokens must be bound to.
    #[arg(long, env = "RINGWAY_CA_AUDIENCE", default_value = "istio-ca")]
    pub(crate) audience: String,
    /// The longest certificate lifetime granted, in seconds.
    #[arg(long, default_value_t = 86400)]
    pub(crate) max_lifetime_secs: u64,
    /// Requests per second per caller: the pod a bound token names (each
    /// node proxy has its own budget), else the service account.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) rate_per_caller: f64,
    /// Seconds a successful token review is reused for calls with the same
    /// token (never past the token's expiry); 0 reviews every call. A
    /// revoked token is refused at the latest this long after revocation.
    #[arg(long, default_value_t = 10)]
    pub(crate) token_review_cache_secs: u64,
    /// Connections open at once, from every source; more are reset at
    /// accept (counted in `ringway_ca_connections_refused_total{reason="global"}`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().max_connections)]
    pub(crate) max_connections: usize,
    /// Connections open at once from one source address; more are reset at
    /// accept, before the global cap is looked at (`reason="per_source"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().max_connections_per_source)]
    pub(crate) max_connections_per_source: usize,
    /// Seconds for a connection's TLS handshake (`reason="handshake_timeout"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().handshake_timeout.as_secs())]
    pub(crate) handshake_timeout_secs: u64,
    /// Seconds for the HTTP/2 preface after TLS (`reason="preface_timeout"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().preface_timeout.as_secs())]
    pub(crate) preface_timeout_secs: u64,
    /// Seconds a connection may stay without a call before it is closed
    /// (`reason="idle_timeout"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().idle_timeout.as_secs())]
    pub(crate) idle_timeout_secs: u64,
    /// Seconds for one call, from its headers to its answer (UNAVAILABLE
    /// `request_timeout`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().request_timeout.as_secs())]
    pub(crate) request_timeout_secs: u64,
    /// Calls at once on one HTTP/2 connection.
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().max_concurrent_streams)]
    pub(crate) max_streams_per_connection: u32,
    /// Bytes of a call's body a caller may have sent before its token is
    /// checked (the HTTP/2 stream window; the body is read once the caller
    /// is authenticated).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().preauth_body_bytes)]
    pub(crate) preauth_body_bytes: u32,
    /// TokenReviews in flight at once, for any token.
    #[arg(long, default_value_t = ringway_ca::Limits::default().max_concurrent_reviews)]
    pub(crate) max_concurrent_reviews: usize,
    /// Further TokenReviews in flight at once, only for tokens that passed a
    /// review before (junk tokens cannot take them).
    #[arg(long, default_value_t = ringway_ca::Limits::default().reserved_reviews)]
    pub(crate) reserved_reviews: usize,
    /// Seconds a call waits for a review slot before RESOURCE_EXHAUSTED
    /// `too_many_reviews`.
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_wait.as_secs())]
    pub(crate) review_wait_secs: u64,
    /// TokenReviews per second one source address may cause (tokens that
    /// passed a review before are not charged); more get RESOURCE_EXHAUSTED
    /// `source_rate_limited`.
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_rate_per_source)]
    pub(crate) reviews_per_source: f64,
    /// TokenReviews a source may cause at once above that rate.
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_burst_per_source)]
    pub(crate) review_burst_per_source: f64,
    /// Seconds a token the API server refused is refused again without a
    /// review; 0 reviews every call.
    #[arg(long, default_value_t = ringway_ca::Limits::default().refusal_cache_ttl.as_secs())]
    pub(crate) token_refusal_cache_secs: u64,
    /// Seconds a token that passed a review counts as known (never past its
    /// expiry): it may use the reserved review slots and is not charged to
    /// its source's budget.
    #[arg(long, default_value_t = ringway_ca::Limits::default().known_token_ttl.as_secs())]
    pub(crate) known_token_secs: u64,
    /// Tokens kept at once in each review memory (accepted, refused, known).
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_cache_entries)]
    pub(crate) review_cache_entries: usize,
    /// Seconds the pod watch may fail (the API server unreachable, the watch
    /// refused) while the pods it last saw still authorize impersonation;
    /// after that, impersonation is refused (UNAVAILABLE `pod_cache_stale`)
    /// and `/healthz/ready` fails, until a list succeeds again.
    #[arg(long, default_value_t = 60)]
    pub(crate) pod_watch_stale_secs: u64,
    /// Metrics (`/metrics`) and readiness (`/healthz/ready`).
    #[arg(long, env = "RINGWAY_CA_METRICS_ADDR", default_value = "0.0.0.0:15014")]
    pub(crate) metrics_addr: std::net::SocketAddr,
}

#[cfg(feature = "sandbox")]
#[derive(clap::Args, Debug)]
pub(crate) struct SandboxArgs {
    /// Number of pods on the virtual node.
    #[arg(long, default_value_t = 3)]
    pub(crate) pods: usize,
    /// Capture mode.
    #[arg(long, default_value = "tproxy")]
    pub(crate) mode: CaptureMode,
    /// Bytes each way in the demo exchange.
    #[arg(long, default_value_t = 8 << 20)]
    pub(crate) bytes: u64,
    /// Stay up after the demo until Ctrl-C.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Proxy settings file (YAML); the embedded defaults otherwise.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Certificates from a certificate service run in the sandbox (the only
    /// holder of the root key) instead of a CA key in each proxy.
    #[arg(long)]
    pub(crate) ca_service: bool,
    /// The components' logs (agents, proxies, CNI plugin, certificate
    /// service) on this terminal (stderr), between the demo's lines, instead
    /// of in a file.
    #[arg(long, short)]
    pub(crate) verbose: bool,
    /// Where the components' logs go (created, or truncated), read after
    /// the run; without it a new file `ringway-sandbox-XXXXXX.log` in the
    /// temporary directory ($TMPDIR, else /tmp). The demo names the file at
    /// its start and end.
    #[arg(long, value_name = "FILE", conflicts_with = "verbose")]
    pub(crate) log_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ProxyArgs {
    /// A pod to serve, as `UID=NETNS_PATH` (repeatable; for running without a node agent).
    #[arg(long = "pod", value_name = "UID=NETNS_PATH")]
    pub(crate) pods: Vec<String>,
    /// The node agent's ZDS socket; pods come from the agent (the normal mode).
    #[arg(long, env = "RINGWAY_ZDS_SOCKET")]
    pub(crate) zds_socket: Option<PathBuf>,
    /// Where the readiness endpoint (`/healthz/ready`) listens.
    #[arg(long, env = "RINGWAY_READINESS_ADDR", default_value = "0.0.0.0:15021")]
    pub(crate) readiness_addr: SocketAddr,
    /// Where Prometheus scrapes `/metrics`.
    #[arg(long, env = "RINGWAY_METRICS_ADDR", default_value = "0.0.0.0:15020")]
    pub(crate) metrics_addr: SocketAddr,
    /// The admin endpoint (`/config_dump`, `/logging`): keep it on loopback.
    #[arg(long, env = "RINGWAY_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    pub(crate) admin_addr: SocketAddr,
    /// Proxy settings file (YAML); the embedded defaults otherwise.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// The proxy's state directory, shared with the proxy that replaces it
    /// in an upgrade: the record of the tunnels it holds (`tunnels.json`),
    /// which the next proxy dials before it reports ready. None: no record,
    /// no warm-up of tunnels.
    #[arg(long, env = "RINGWAY_STATE_DIR")]
    pub(crate) state_dir: Option<PathBuf>,
    /// Where the mesh's workloads and services come from: `file` (the
    /// configuration's `workloads`/`services`), `kubernetes` (pods,
    /// services and EndpointSlices watched through the API server with the
    /// pod's service account, added to the file's, and the cluster's
    /// security.istio.io AuthorizationPolicies and PeerAuthentications
    /// enforced beside the file's policies; trust domain and CA always come
    /// from the file) or `xds` (the mesh's control plane: workloads,
    /// services and L4 policies over its workload API, certificates from it
    /// too unless the file has a `ca:` section; the file gives settings
    /// only).
    #[arg(long, value_enum, env = "RINGWAY_MESH_SOURCE", default_value_t = MeshSource::File)]
    pub(crate) mesh_source: MeshSource,
    /// The cluster's DNS domain: services are `<name>.<namespace>.svc.<domain>`
    /// (with `--mesh-source kubernetes`).
    #[arg(long, env = "RINGWAY_CLUSTER_DOMAIN", default_value = ringway_config::kube::DEFAULT_CLUSTER_DOMAIN)]
    pub(crate) cluster_domain: String,
    /// The namespace whose AuthorizationPolicies and PeerAuthentications
    /// apply mesh-wide (with `--mesh-source kubernetes`; the reference's root
    /// namespace).
    #[arg(long, env = "RINGWAY_ISTIO_ROOT_NAMESPACE", default_value = ringway_config::kube::istio::DEFAULT_ISTIO_ROOT_NAMESPACE)]
    pub(crate) istio_root_namespace: String,
    /// With `--mesh-source xds`.
    #[command(flatten)]
    pub(crate) xds: xds::XdsArgs,
}

/// `ringway proxy --mesh-source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum MeshSource {
    /// The configuration file only.
    File,
    /// The Kubernetes API (in-cluster config), merged with the file.
    Kubernetes,
    /// The mesh's control plane (istiod) over its workload API.
    Xds,
}

#[derive(clap::Args, Debug)]
pub(crate) struct AgentArgs {
    /// ZDS socket the proxy connects to.
    #[arg(long, env = "RINGWAY_ZDS_SOCKET", default_value = ringway_zds::DEFAULT_SOCKET)]
    pub(crate) zds_socket: PathBuf,
    /// Socket the CNI plugin talks to (the plugin config's `agentSocket`).
    #[arg(long, env = "RINGWAY_CNI_SOCKET", default_value = ringway_cni::conf::DEFAULT_AGENT_SOCKET)]
    pub(crate) cni_socket: PathBuf,
    /// This node's name (Kubernetes `spec.nodeName`).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    pub(crate) node_name: String,
    /// Watch this node's pods in Kubernetes and enroll/unenroll running pods
    /// by the `ringway.io/dataplane-mode` label (or the Istio ambient mesh's
    /// `istio.io/dataplane-mode`); annotate the captured pods
    /// `ambient.istio.io/redirection: enabled`.
    #[arg(long)]
    pub(crate) kube: bool,
    /// Install the CNI plugin binary and keep ringway's entry in the node's
    /// CNI config (re-inserted when the primary CNI rewrites it).
    #[arg(long)]
    pub(crate) install_cni: bool,
    /// With --install-cni: the CNI bin dir.
    #[arg(long, default_value = "/opt/cni/bin")]
    pub(crate) cni_bin_dir: PathBuf,
    /// With --install-cni: the CNI conf dir.
    #[arg(long, default_value = "/etc/cni/net.d")]
    pub(crate) cni_conf_dir: PathBuf,
    /// With --install-cni: the plugin's `logFile` (a path on the node; runtimes
    /// mostly swallow the plugin's stderr).
    #[arg(long, env = "RINGWAY_CNI_LOG_FILE")]
    pub(crate) cni_log_file: Option<PathBuf>,
    /// Directory holding bind-mounted pod namespaces (scanned at start).
    #[arg(long, default_value = "/var/run/netns")]
    pub(crate) netns_dir: Vec<PathBuf>,
    /// The agent's record of its enrolled pods, on the node where pods
    /// cannot write (a journal: one appended line per change, rewritten
    /// atomically when it grows). At restart a pod is adopted only
    /// when the owner tag in its namespace agrees with this record.
    #[arg(long, env = "RINGWAY_AGENT_STATE_FILE", default_value = ringway_cni::node::DEFAULT_STATE_FILE)]
    pub(crate) state_file: PathBuf,
    /// Without --kube: the service account of the pods of namespace NS (or
    /// of pod NS/POD), which CNI does not pass (repeatable; a pod's own rule
    /// wins). A CNI ADD for a pod no rule covers is refused: the agent never
    /// guesses an identity. With --kube the API server says it.
    #[arg(long, value_name = "NS=SA|NS/POD=SA")]
    pub(crate) pod_service_account: Vec<ringway_cni::node::ServiceAccountRule>,
    /// The uids whose processes may use the ZDS and CNI sockets (checked with
    /// SO_PEERCRED, on top of the sockets' mode 0600; repeatable).
    #[arg(long = "peer-uid", value_name = "UID", default_values_t = [0u32])]
    pub(crate) peer_uids: Vec<u32>,
    /// Proxy/capture settings file (YAML); the embedded defaults otherwise.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Where Prometheus scrapes the agent's `/metrics` (CNI request latency).
    #[arg(
        long,
        env = "RINGWAY_AGENT_METRICS_ADDR",
        default_value = "0.0.0.0:15022"
    )]
    pub(crate) metrics_addr: SocketAddr,
}

#[derive(Subcommand, Debug)]
pub(crate) enum RedirectAction {
    /// Install (or atomically replace) a pod's capture rules.
    Apply(RedirectArgs),
    /// Report drift between the pod's rules and what they should be.
    Verify(RedirectArgs),
    /// Remove the pod's capture rules.
    Remove(RedirectArgs),
}

#[derive(clap::Args, Debug)]
pub(crate) struct RedirectArgs {
    /// The pod's network namespace (e.g. /var/run/netns/cni-1234 or /proc/PID/ns/net).
    #[arg(long)]
    pub(crate) netns: PathBuf,
    /// Capture mode; the configuration's `proxy.captureMode` (or
    /// `RINGWAY_CAPTURE_MODE`) otherwise.
    #[arg(long)]
    pub(crate) mode: Option<CaptureMode>,
    /// Proxy/capture settings file (YAML), the same file the proxy and the
    /// agent read (ports, mark, capture mode); the embedded defaults
    /// otherwise. `RINGWAY_*` variables override single settings.
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
}
