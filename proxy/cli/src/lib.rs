//! The `ringway` binary: one executable, several roles, each composed here from
//! the product libraries.
//!
//! - `ringway proxy`: the node proxy (`ringway-proxy`), pods from the node agent
//!   over ZDS (`ringway-zds`) or named on the command line; the mesh from the
//!   configuration (`ringway-config`) and optionally the Kubernetes API.
//! - `ringway agent`: the node agent (`ringway-cni`'s `node`): CNI events,
//!   capture rules (`ringway-redirect`), the ZDS server.
//! - `ringway redirect apply|verify|remove`: manage one pod's capture rules.
//! - `ringway-cni` (this binary under that name): the chained CNI plugin.
//! - `ringway sandbox` (feature `sandbox`, on by default, off in the image):
//!   build an isolated virtual node on this machine, capture its pods, run the
//!   proxy and a short demo (the README's first command). Only this feature
//!   reaches the test bed (`ringway-testbed`) and the test CA.
//!
//! [`main`] is the whole program; `src/main.rs` only calls it, and the benches'
//! proxy child calls it too.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

mod ca_service;
#[cfg(feature = "sandbox")]
mod sandbox;
mod xds;
use clap::{Parser, Subcommand, ValueEnum};
use ringway_config::{CaptureMode, ProxySettings};
use ringway_proxy::Proxy;

#[derive(Parser, Debug)]
#[command(
    name = "ringway",
    version,
    about = "Per-node transparent proxy for Kubernetes pods"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `ringway_proxy=debug`.
    #[arg(long, global = true, env = "RINGWAY_LOG", default_value = "info")]
    log: String,
    /// Log format.
    #[arg(long, global = true, value_enum, env = "RINGWAY_LOG_FORMAT", default_value_t = LogFormat::Auto)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable on a terminal, JSON otherwise.
    Auto,
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
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
struct CaArgs {
    /// Where the gRPC/TLS service listens (the reference control plane uses 15012).
    #[arg(long, env = "RINGWAY_CA_LISTEN", default_value = "0.0.0.0:15012")]
    listen: std::net::SocketAddr,
    /// The service's own serving certificate (PEM chain), valid for the name
    /// proxies dial.
    #[arg(long, env = "RINGWAY_CA_TLS_CERT")]
    tls_cert: PathBuf,
    /// Its key (PEM).
    #[arg(long, env = "RINGWAY_CA_TLS_KEY")]
    tls_key: PathBuf,
    /// A signing CA certificate (PEM); repeat with --root-key for each root
    /// during a rotation: the newest valid one signs.
    #[arg(long = "root-cert", required = true)]
    root_certs: Vec<PathBuf>,
    /// The key of the --root-cert at the same position.
    #[arg(long = "root-key", required = true)]
    root_keys: Vec<PathBuf>,
    /// The mesh's trust domain.
    #[arg(long, env = "RINGWAY_TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// `namespace/serviceAccount` of the node proxies: the only callers that
    /// may ask for the identity of a pod on their node.
    #[arg(
        long,
        env = "RINGWAY_CA_NODE_PROXY_SA",
        default_value = "ringway-system/ringway-proxy"
    )]
    node_proxy_sa: String,
    /// The audience callers' tokens must be bound to.
    #[arg(long, env = "RINGWAY_CA_AUDIENCE", default_value = "istio-ca")]
    audience: String,
    /// The longest certificate lifetime granted, in seconds.
    #[arg(long, default_value_t = 86400)]
    max_lifetime_secs: u64,
    /// Requests per second per caller: the pod a bound token names (each
    /// node proxy has its own budget), else the service account.
    #[arg(long, default_value_t = 20.0)]
    rate_per_caller: f64,
    /// Seconds a successful token review is reused for calls with the same
    /// token (never past the token's expiry); 0 reviews every call. A
    /// revoked token is refused at the latest this long after revocation.
    #[arg(long, default_value_t = 10)]
    token_review_cache_secs: u64,
    /// Connections open at once, from every source; more are reset at
    /// accept (counted in `ringway_ca_connections_refused_total{reason="global"}`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().max_connections)]
    max_connections: usize,
    /// Connections open at once from one source address; more are reset at
    /// accept, before the global cap is looked at (`reason="per_source"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().max_connections_per_source)]
    max_connections_per_source: usize,
    /// Seconds for a connection's TLS handshake (`reason="handshake_timeout"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().handshake_timeout.as_secs())]
    handshake_timeout_secs: u64,
    /// Seconds for the HTTP/2 preface after TLS (`reason="preface_timeout"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().preface_timeout.as_secs())]
    preface_timeout_secs: u64,
    /// Seconds a connection may stay without a call before it is closed
    /// (`reason="idle_timeout"`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().idle_timeout.as_secs())]
    idle_timeout_secs: u64,
    /// Seconds for one call, from its headers to its answer (UNAVAILABLE
    /// `request_timeout`).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().request_timeout.as_secs())]
    request_timeout_secs: u64,
    /// Calls at once on one HTTP/2 connection.
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().max_concurrent_streams)]
    max_streams_per_connection: u32,
    /// Bytes of a call's body a caller may have sent before its token is
    /// checked (the HTTP/2 stream window; the body is read once the caller
    /// is authenticated).
    #[arg(long, default_value_t = ringway_ca::server::ServerLimits::default().preauth_body_bytes)]
    preauth_body_bytes: u32,
    /// TokenReviews in flight at once, for any token.
    #[arg(long, default_value_t = ringway_ca::Limits::default().max_concurrent_reviews)]
    max_concurrent_reviews: usize,
    /// Further TokenReviews in flight at once, only for tokens that passed a
    /// review before (junk tokens cannot take them).
    #[arg(long, default_value_t = ringway_ca::Limits::default().reserved_reviews)]
    reserved_reviews: usize,
    /// Seconds a call waits for a review slot before RESOURCE_EXHAUSTED
    /// `too_many_reviews`.
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_wait.as_secs())]
    review_wait_secs: u64,
    /// TokenReviews per second one source address may cause (tokens that
    /// passed a review before are not charged); more get RESOURCE_EXHAUSTED
    /// `source_rate_limited`.
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_rate_per_source)]
    reviews_per_source: f64,
    /// TokenReviews a source may cause at once above that rate.
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_burst_per_source)]
    review_burst_per_source: f64,
    /// Seconds a token the API server refused is refused again without a
    /// review; 0 reviews every call.
    #[arg(long, default_value_t = ringway_ca::Limits::default().refusal_cache_ttl.as_secs())]
    token_refusal_cache_secs: u64,
    /// Seconds a token that passed a review counts as known (never past its
    /// expiry): it may use the reserved review slots and is not charged to
    /// its source's budget.
    #[arg(long, default_value_t = ringway_ca::Limits::default().known_token_ttl.as_secs())]
    known_token_secs: u64,
    /// Tokens kept at once in each review memory (accepted, refused, known).
    #[arg(long, default_value_t = ringway_ca::Limits::default().review_cache_entries)]
    review_cache_entries: usize,
    /// Seconds the pod watch may fail (the API server unreachable, the watch
    /// refused) while the pods it last saw still authorize impersonation;
    /// after that, impersonation is refused (UNAVAILABLE `pod_cache_stale`)
    /// and `/healthz/ready` fails, until a list succeeds again.
    #[arg(long, default_value_t = 60)]
    pod_watch_stale_secs: u64,
    /// Metrics (`/metrics`) and readiness (`/healthz/ready`).
    #[arg(long, env = "RINGWAY_CA_METRICS_ADDR", default_value = "0.0.0.0:15014")]
    metrics_addr: std::net::SocketAddr,
}

#[cfg(feature = "sandbox")]
#[derive(clap::Args, Debug)]
struct SandboxArgs {
    /// Number of pods on the virtual node.
    #[arg(long, default_value_t = 3)]
    pods: usize,
    /// Capture mode.
    #[arg(long, default_value = "tproxy")]
    mode: CaptureMode,
    /// Bytes each way in the demo exchange.
    #[arg(long, default_value_t = 8 << 20)]
    bytes: u64,
    /// Stay up after the demo until Ctrl-C.
    #[arg(long)]
    wait: bool,
    /// Proxy settings file (YAML); the embedded defaults otherwise.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Certificates from a certificate service run in the sandbox (the only
    /// holder of the root key) instead of a CA key in each proxy.
    #[arg(long)]
    ca_service: bool,
    /// The components' logs (agents, proxies, CNI plugin, certificate
    /// service) on this terminal (stderr), between the demo's lines, instead
    /// of in a file.
    #[arg(long, short)]
    verbose: bool,
    /// Where the components' logs go (created, or truncated), read after
    /// the run; without it a new file `ringway-sandbox-XXXXXX.log` in the
    /// temporary directory ($TMPDIR, else /tmp). The demo names the file at
    /// its start and end.
    #[arg(long, value_name = "FILE", conflicts_with = "verbose")]
    log_file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ProxyArgs {
    /// A pod to serve, as `UID=NETNS_PATH` (repeatable; for running without a node agent).
    #[arg(long = "pod", value_name = "UID=NETNS_PATH")]
    pods: Vec<String>,
    /// The node agent's ZDS socket; pods come from the agent (the normal mode).
    #[arg(long, env = "RINGWAY_ZDS_SOCKET")]
    zds_socket: Option<PathBuf>,
    /// Where the readiness endpoint (`/healthz/ready`) listens.
    #[arg(long, env = "RINGWAY_READINESS_ADDR", default_value = "0.0.0.0:15021")]
    readiness_addr: SocketAddr,
    /// Where Prometheus scrapes `/metrics`.
    #[arg(long, env = "RINGWAY_METRICS_ADDR", default_value = "0.0.0.0:15020")]
    metrics_addr: SocketAddr,
    /// The admin endpoint (`/config_dump`, `/logging`): keep it on loopback.
    #[arg(long, env = "RINGWAY_ADMIN_ADDR", default_value = "127.0.0.1:15000")]
    admin_addr: SocketAddr,
    /// Proxy settings file (YAML); the embedded defaults otherwise.
    #[arg(long)]
    config: Option<PathBuf>,
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
    mesh_source: MeshSource,
    /// The cluster's DNS domain: services are `<name>.<namespace>.svc.<domain>`
    /// (with `--mesh-source kubernetes`).
    #[arg(long, env = "RINGWAY_CLUSTER_DOMAIN", default_value = ringway_config::kube::DEFAULT_CLUSTER_DOMAIN)]
    cluster_domain: String,
    /// The namespace whose AuthorizationPolicies and PeerAuthentications
    /// apply mesh-wide (with `--mesh-source kubernetes`; the reference's root
    /// namespace).
    #[arg(long, env = "RINGWAY_ISTIO_ROOT_NAMESPACE", default_value = ringway_config::kube::istio::DEFAULT_ISTIO_ROOT_NAMESPACE)]
    istio_root_namespace: String,
    /// With `--mesh-source xds`.
    #[command(flatten)]
    xds: xds::XdsArgs,
}

/// `ringway proxy --mesh-source`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MeshSource {
    /// The configuration file only.
    File,
    /// The Kubernetes API (in-cluster config), merged with the file.
    Kubernetes,
    /// The mesh's control plane (istiod) over its workload API.
    Xds,
}

#[derive(clap::Args, Debug)]
struct AgentArgs {
    /// ZDS socket the proxy connects to.
    #[arg(long, env = "RINGWAY_ZDS_SOCKET", default_value = ringway_zds::DEFAULT_SOCKET)]
    zds_socket: PathBuf,
    /// Socket the CNI plugin talks to (the plugin config's `agentSocket`).
    #[arg(long, env = "RINGWAY_CNI_SOCKET", default_value = ringway_cni::conf::DEFAULT_AGENT_SOCKET)]
    cni_socket: PathBuf,
    /// This node's name (Kubernetes `spec.nodeName`).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node_name: String,
    /// Watch this node's pods in Kubernetes and enroll/unenroll running pods
    /// by the `ringway.io/dataplane-mode` label (or the Istio ambient mesh's
    /// `istio.io/dataplane-mode`); annotate the captured pods
    /// `ambient.istio.io/redirection: enabled`.
    #[arg(long)]
    kube: bool,
    /// Install the CNI plugin binary and keep ringway's entry in the node's
    /// CNI config (re-inserted when the primary CNI rewrites it).
    #[arg(long)]
    install_cni: bool,
    /// With --install-cni: the CNI bin dir.
    #[arg(long, default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// With --install-cni: the CNI conf dir.
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// With --install-cni: the plugin's `logFile` (a path on the node; runtimes
    /// mostly swallow the plugin's stderr).
    #[arg(long, env = "RINGWAY_CNI_LOG_FILE")]
    cni_log_file: Option<PathBuf>,
    /// Directory holding bind-mounted pod namespaces (scanned at start).
    #[arg(long, default_value = "/var/run/netns")]
    netns_dir: Vec<PathBuf>,
    /// The agent's record of its enrolled pods, on the node where pods
    /// cannot write (a journal: one appended line per change, rewritten
    /// atomically when it grows). At restart a pod is adopted only
    /// when the owner tag in its namespace agrees with this record.
    #[arg(long, env = "RINGWAY_AGENT_STATE_FILE", default_value = ringway_cni::node::DEFAULT_STATE_FILE)]
    state_file: PathBuf,
    /// Without --kube: the service account of the pods of namespace NS (or
    /// of pod NS/POD), which CNI does not pass (repeatable; a pod's own rule
    /// wins). A CNI ADD for a pod no rule covers is refused: the agent never
    /// guesses an identity. With --kube the API server says it.
    #[arg(long, value_name = "NS=SA|NS/POD=SA")]
    pod_service_account: Vec<ringway_cni::node::ServiceAccountRule>,
    /// The uids whose processes may use the ZDS and CNI sockets (checked with
    /// SO_PEERCRED, on top of the sockets' mode 0600; repeatable).
    #[arg(long = "peer-uid", value_name = "UID", default_values_t = [0u32])]
    peer_uids: Vec<u32>,
    /// Proxy/capture settings file (YAML); the embedded defaults otherwise.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where Prometheus scrapes the agent's `/metrics` (CNI request latency).
    #[arg(
        long,
        env = "RINGWAY_AGENT_METRICS_ADDR",
        default_value = "0.0.0.0:15022"
    )]
    metrics_addr: SocketAddr,
}

#[derive(Subcommand, Debug)]
enum RedirectAction {
    /// Install (or atomically replace) a pod's capture rules.
    Apply(RedirectArgs),
    /// Report drift between the pod's rules and what they should be.
    Verify(RedirectArgs),
    /// Remove the pod's capture rules.
    Remove(RedirectArgs),
}

#[derive(clap::Args, Debug)]
struct RedirectArgs {
    /// The pod's network namespace (e.g. /var/run/netns/cni-1234 or /proc/PID/ns/net).
    #[arg(long)]
    netns: PathBuf,
    /// Capture mode; the configuration's `proxy.captureMode` (or
    /// `RINGWAY_CAPTURE_MODE`) otherwise.
    #[arg(long)]
    mode: Option<CaptureMode>,
    /// Proxy/capture settings file (YAML), the same file the proxy and the
    /// agent read (ports, mark, capture mode); the embedded defaults
    /// otherwise. `RINGWAY_*` variables override single settings.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Changes the log filter at run time (the admin endpoint's `/logging`).
static LOG_RELOAD: std::sync::OnceLock<ringway_proxy::control::SetLogLevel> =
    std::sync::OnceLock::new();

/// Logs to stderr, or (`file`) to a file a person reads later: there
/// `auto` is text. Text has colours only on a terminal.
fn init_logs(filter: &str, format: LogFormat, file: Option<std::fs::File>) {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => file.is_none() && !std::io::stderr().is_terminal(),
    };
    let to_file = file.is_some();
    let writer = match file {
        Some(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(writer),
            )
            .init();
    } else {
        // Colours only for a person at a terminal, never in a file or a pipe.
        let ansi = !to_file && std::io::stderr().is_terminal();
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(writer),
            )
            .init();
    }
    let _ = LOG_RELOAD.set(std::sync::Arc::new(move |level: &str| {
        use ringway_proxy::control::LogLevelError;
        let f = tracing_subscriber::EnvFilter::try_new(level)
            .map_err(|e| LogLevelError::Invalid(e.into()))?;
        handle.reload(f).map_err(|e| LogLevelError::Apply(e.into()))
    }));
}

/// Loads the node's configuration: the YAML file given, else the embedded
/// default; environment variables (`RINGWAY_*`) override single settings.
fn load_mesh(path: Option<&PathBuf>) -> anyhow::Result<ringway_config::Mesh> {
    let mesh =
        ringway_config::MeshConfig::load(path.map(|p| p.as_path()), &ringway_config::ProcessEnv)?;
    tracing::info!(config = %mesh.effective_summary(), "effective configuration");
    Ok(mesh)
}

/// `--mesh-source kubernetes`: connects with the in-cluster config (else the
/// kubeconfig) and watches the cluster on a `ringway-kube` thread, publishing
/// `file` merged with its workloads and services to `proxy`.
fn start_kube_mesh(
    file: std::sync::Arc<ringway_config::Mesh>,
    cluster_domain: &str,
    istio_root_namespace: &str,
    proxy: std::sync::Arc<Proxy>,
    first: std::sync::mpsc::SyncSender<()>,
) -> anyhow::Result<ringway_config::kube::MeshWatch> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the Kubernetes mesh runtime")?;
    let client = rt.block_on(ringway_config::kube::connect()).context(
        "--mesh-source kubernetes: without the Kubernetes API there are no workloads or services",
    )?;
    let options = ringway_config::kube::KubeOptions {
        cluster_domain: cluster_domain.to_owned(),
        istio_root_namespace: istio_root_namespace.to_owned(),
        ..ringway_config::kube::KubeOptions::default()
    };
    let watch = ringway_config::kube::MeshWatch::start(rt, client, file, options, move |m| {
        proxy.set_mesh(m);
        // The first snapshot lets the ZDS client start taking pods.
        let _ = first.try_send(());
    })
    .context("starting the Kubernetes mesh source")?;
    tracing::info!(
        cluster_domain,
        istio.root_namespace = istio_root_namespace,
        "mesh source: Kubernetes (pods, services, EndpointSlices, AuthorizationPolicies, \
         PeerAuthentications) + the configuration file"
    );
    Ok(watch)
}

/// Waits for the mesh source's first snapshot (Kubernetes or xDS), logging
/// while it does;
/// false when stopped (or the watch ended) first.
fn wait_first_snapshot(
    rx: &std::sync::mpsc::Receiver<()>,
    stop: &std::sync::atomic::AtomicBool,
) -> bool {
    use std::sync::mpsc::RecvTimeoutError;
    let t0 = Instant::now();
    let mut next_log = Duration::ZERO;
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(()) => {
                tracing::info!(waited = ?t0.elapsed(), "first mesh snapshot in; taking pods from the agent");
                return true;
            }
            Err(RecvTimeoutError::Disconnected) => return false,
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return false;
                }
                if t0.elapsed() >= next_log {
                    tracing::warn!(waited = ?t0.elapsed(), "waiting for the mesh source's first snapshot (Kubernetes: pods, services, EndpointSlices; xDS: the control plane's first workloads and policies) before taking pods");
                    next_log += Duration::from_secs(10);
                }
            }
        }
    }
}

fn load_settings(path: Option<&PathBuf>) -> anyhow::Result<ProxySettings> {
    Ok(load_mesh(path)?.proxy().clone())
}

fn capture_spec(mode: CaptureMode, settings: &ProxySettings) -> ringway_redirect::CaptureSpec {
    ringway_proxy::capture_spec(&ProxySettings {
        capture_mode: mode,
        ..settings.clone()
    })
}

/// The `ringway` program: parses the command line (or, run as `ringway-cni`,
/// the CNI call) and runs the command.
pub fn main() -> anyhow::Result<()> {
    // Installed as /opt/cni/bin/ringway-cni, the same binary is the CNI
    // plugin: the runtime passes the call in CNI_* variables and stdin.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("ringway-cni")) {
        cni_plugin_main();
    }
    let cli = Cli::parse();
    let (log_file, file) = sandbox_log(&cli.command)?.unzip();
    init_logs(&cli.log, cli.log_format, file);
    match cli.command {
        #[cfg(feature = "sandbox")]
        Command::Sandbox(args) => sandbox(args, log_file),
        Command::Proxy(args) => run_proxy(args),
        Command::Agent(args) => run_agent(args),
        Command::Ca(args) => run_ca(args),
        Command::Redirect { action } => redirect(action),
    }
}

/// The sandbox tells its story on the terminal and writes the components'
/// logs to a file (path and file), unless `--verbose`; every other command
/// logs to stderr (`None`).
#[cfg(feature = "sandbox")]
fn sandbox_log(command: &Command) -> anyhow::Result<Option<(PathBuf, std::fs::File)>> {
    match command {
        Command::Sandbox(args) if !args.verbose => {
            sandbox::open_log_file(args.log_file.as_deref()).map(Some)
        }
        _ => Ok(None),
    }
}

#[cfg(not(feature = "sandbox"))]
fn sandbox_log(_: &Command) -> anyhow::Result<Option<(PathBuf, std::fs::File)>> {
    Ok(None)
}

/// The CNI plugin: result or error JSON on stdout, exit code as the spec says,
/// logs to the config's `logFile` (appended; stderr when unset or when it cannot
/// be opened) at its `logLevel` (`RINGWAY_CNI_LOG`, a tracing filter, overrides
/// the level when set). Never returns.
fn cni_plugin_main() -> ! {
    use std::io::{Read, Write};
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let (log_file, level) = ringway_cni::conf::log_settings(&stdin);
    let filter = tracing_subscriber::EnvFilter::try_from_env("RINGWAY_CNI_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.as_str()));
    let file = log_file.as_ref().map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("ringway-cni: cannot open logFile {}", path.display()))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    let _ = match file {
        Some(Ok(f)) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
        other => {
            if let Some(Err(why)) = other {
                eprintln!("{why:#}; logging to stderr");
            }
            builder.with_writer(std::io::stderr).try_init()
        }
    };
    let out = ringway_cni::run(
        &ringway_cni::ProcessEnv,
        &stdin,
        &ringway_cni::node::UnixAgent::default(),
    );
    let mut so = std::io::stdout().lock();
    if !out.stdout.is_empty() {
        let _ = writeln!(so, "{}", out.stdout);
    }
    let _ = so.flush();
    std::process::exit(out.exit_code)
}

fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let stop = block_stop_signals();
    // As the proxy: the soft fd limit (often 1024) up to the hard one, so
    // connections to the control port, pods and proxies cannot run the
    // agent out of fds before its own caps apply.
    match ringway_proxy::sys::raise_nofile_limit() {
        Ok((old, new)) => {
            tracing::info!(rlimit.nofile.old = old, rlimit.nofile.new = new, "fd limit")
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the fd limit"),
    }
    let settings = load_settings(args.config.as_ref())?;
    // With --kube the CNI ADD and the watch follow one rule (the
    // `ringway.io/dataplane-mode` and `istio.io/dataplane-mode` labels),
    // answered from the watch's caches or the API server: the client and the
    // runtime it runs on exist before the agent serves its first ADD. The runtime is the agent's control plane, on
    // its own thread (`ringway-kube`, below), never the datapath's.
    let kube = if args.kube {
        if args.node_name.is_empty() {
            bail!("--kube needs the node's name (--node-name or NODE_NAME)");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the Kubernetes watch runtime")?;
        let client = rt.block_on(ringway_cni::kube::connect()).context(
            "--kube: without the Kubernetes API the agent cannot tell which pods to capture",
        )?;
        // The pods it captures carry `ambient.istio.io/redirection: enabled`,
        // patched on the same runtime, never in the way of a CNI ADD.
        let annotator = ringway_cni::kube::Annotator::start(
            client.clone(),
            rt.handle(),
            ringway_cni::kube::AnnotatorConfig::default(),
        );
        let selector = ringway_cni::kube::Selector::new(client, rt.handle().clone());
        Some((rt, selector, annotator))
    } else {
        None
    };
    let (selection, annotator) = match &kube {
        Some((_, selector, annotator)) => (
            ringway_cni::node::Selection::Kubernetes(selector.clone()),
            Some(annotator.clone()),
        ),
        None => (ringway_cni::node::Selection::All, None),
    };
    let config = ringway_cni::node::AgentConfig {
        zds_socket: args.zds_socket.clone(),
        cni_socket: args.cni_socket.clone(),
        capture: ringway_proxy::capture_spec(&settings),
        netns_dirs: args.netns_dir.clone(),
        node_name: args.node_name.clone(),
        selection,
        state_file: Some(args.state_file.clone()),
        service_accounts: args.pod_service_account.clone(),
        peer_uids: args.peer_uids.clone(),
        annotator,
        ..ringway_cni::node::AgentConfig::default()
    };
    let agent = ringway_cni::node::NodeAgent::start(config).context("starting the node agent")?;
    // The previous release's socket paths, for its proxies and CNI entries
    // during a rolling upgrade (see `ringway_cni::node::legacy`).
    // Only for the default paths: an agent given paths of its own (tests, odd
    // installs) never touches the node's /var/run/ringway.
    for (socket, default, legacy) in [
        (
            &args.zds_socket,
            ringway_zds::DEFAULT_SOCKET,
            ringway_cni::node::legacy::LEGACY_ZDS_SOCKET,
        ),
        (
            &args.cni_socket,
            ringway_cni::conf::DEFAULT_AGENT_SOCKET,
            ringway_cni::node::legacy::LEGACY_CNI_SOCKET,
        ),
    ] {
        if socket.as_path() != std::path::Path::new(default) {
            continue;
        }
        match ringway_cni::node::legacy::link_legacy_socket(socket, std::path::Path::new(legacy)) {
            Ok(true) => {
                tracing::info!(legacy, socket = %socket.display(), "previous release's socket path linked")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(legacy, error = %e, "cannot link the previous release's socket path")
            }
        }
    }
    tracing::info!(zds = %args.zds_socket.display(), cni = %args.cni_socket.display(), pods = agent.pods().len(), kube = args.kube, "node agent serving");
    let install = if args.install_cni {
        let exe = std::env::current_exe().context("locating the ringway binary to install")?;
        let mut cfg = ringway_cni::install::InstallConfig::new(exe);
        cfg.bin_dir = args.cni_bin_dir.clone();
        cfg.conf_dir = args.cni_conf_dir.clone();
        cfg.agent_socket = args.cni_socket.clone();
        cfg.log_file = args.cni_log_file.clone();
        let installer = ringway_cni::install::Installer::new(cfg);
        installer
            .install_binary()
            .context("installing the CNI plugin binary")?;
        Some(installer.watch().context("watching the CNI config")?)
    } else {
        None
    };
    let kube_rt = match kube {
        Some((rt, selector, _)) => {
            let enrollment: std::sync::Arc<dyn ringway_cni::kube::Enrollment> =
                std::sync::Arc::new(agent.enrollment());
            let node = args.node_name.clone();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            // Drives the runtime: the watch, and the API lookups of CNI ADDs.
            let thread = std::thread::Builder::new()
                .name("ringway-kube".into())
                .spawn(move || {
                    rt.block_on(async move {
                        tokio::select! {
                            _ = ringway_cni::kube::run_watch(selector, node, enrollment) => {}
                            _ = rx => {}
                        }
                    });
                })?;
            Some((tx, thread))
        }
        None => None,
    };
    // The agent's metrics and the process's, encoded by prometheus-client
    // in the format the scraper asked for.
    let mut registry = agent.metrics_registry();
    registry.register_collector(Box::new(ringway_control::ProcessCollector));
    let registry = std::sync::Arc::new(registry);
    let health = agent.health_source();
    let live = agent.liveness_source();
    let metrics_server = ringway_control::ControlServer::serve(
        args.metrics_addr,
        std::sync::Arc::new(move |method, path, _, openmetrics| match (method, path) {
            (&hyper::Method::GET, "/metrics") => (
                hyper::StatusCode::OK,
                ringway_control::content_type(openmetrics),
                ringway_control::encode(&registry, openmetrics),
            ),
            (&hyper::Method::GET, "/healthz/ready") => match health() {
                Ok(s) => (hyper::StatusCode::OK, "text/plain; charset=utf-8", s + "\n"),
                Err(e) => (
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    format!("not ready: {e}\n"),
                ),
            },
            (&hyper::Method::GET, "/healthz/live") => match live() {
                Ok(s) => (hyper::StatusCode::OK, "text/plain; charset=utf-8", s + "\n"),
                Err(e) => (
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    format!("not live: {e}\n"),
                ),
            },
            (_, path) => (
                hyper::StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                format!("no such endpoint: {path}\n"),
            ),
        }),
    )
    .with_context(|| {
        format!(
            "binding the agent's metrics endpoint on {}",
            args.metrics_addr
        )
    })?;
    tracing::info!(addr = %metrics_server.addr, "agent endpoint: GET /metrics, GET /healthz/ready, GET /healthz/live");
    let sig = stop.wait()?;
    drop(metrics_server);
    tracing::info!(signal = ?sig, "node agent stopping; pods, rules and the proxy are left as they are");
    if let Some((tx, thread)) = kube_rt {
        let _ = tx.send(());
        let _ = thread.join();
    }
    if let Some(w) = install {
        w.stop();
    }
    agent.shutdown();
    Ok(())
}

fn redirect(action: RedirectAction) -> anyhow::Result<()> {
    let (args, what) = match &action {
        RedirectAction::Apply(a) => (a, "apply"),
        RedirectAction::Verify(a) => (a, "verify"),
        RedirectAction::Remove(a) => (a, "remove"),
    };
    // The same settings (file + environment) as `ringway proxy` and `ringway
    // agent`: ports and mark differ from the defaults on some nodes.
    let settings = load_settings(args.config.as_ref())?;
    let mode = args.mode.unwrap_or(settings.capture_mode);
    let spec = capture_spec(mode, &settings);
    let fd = ringway_redirect::open_netns(&args.netns)?;
    match what {
        "apply" => {
            ringway_redirect::apply(fd.as_fd(), &spec)?;
            println!(
                "capture rules ({}) in place in {}",
                mode,
                args.netns.display()
            );
        }
        "verify" => {
            let drift = ringway_redirect::verify(fd.as_fd(), &spec)?;
            if drift.is_empty() {
                println!(
                    "capture rules ({}) in place in {}",
                    mode,
                    args.netns.display()
                );
            } else {
                for d in &drift {
                    println!("drift: {d}");
                }
                bail!("{} difference(s) from the expected rules", drift.len());
            }
        }
        _ => {
            ringway_redirect::remove(fd.as_fd(), &spec)?;
            println!("capture rules removed from {}", args.netns.display());
        }
    }
    Ok(())
}

fn run_ca(args: CaArgs) -> anyhow::Result<()> {
    use std::sync::Arc;
    let stop = block_stop_signals();
    if args.root_certs.len() != args.root_keys.len() {
        bail!(
            "{} --root-cert but {} --root-key: give them in pairs",
            args.root_certs.len(),
            args.root_keys.len()
        );
    }
    let (np_ns, np_sa) = args
        .node_proxy_sa
        .split_once('/')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .with_context(|| {
            format!(
                "--node-proxy-sa {:?} is not namespace/serviceAccount",
                args.node_proxy_sa
            )
        })?;
    let secs = std::time::Duration::from_secs;
    let limits = ringway_ca::Limits {
        max_lifetime: secs(args.max_lifetime_secs),
        default_lifetime: secs(args.max_lifetime_secs),
        rate_per_caller: args.rate_per_caller,
        review_cache_ttl: secs(args.token_review_cache_secs),
        refusal_cache_ttl: secs(args.token_refusal_cache_secs),
        known_token_ttl: secs(args.known_token_secs),
        review_cache_entries: args.review_cache_entries,
        max_concurrent_reviews: args.max_concurrent_reviews,
        reserved_reviews: args.reserved_reviews,
        review_wait: secs(args.review_wait_secs),
        review_rate_per_source: args.reviews_per_source,
        review_burst_per_source: args.review_burst_per_source,
        ..ringway_ca::Limits::default()
    };
    let server_limits = ringway_ca::server::ServerLimits {
        max_connections: args.max_connections,
        max_connections_per_source: args.max_connections_per_source,
        handshake_timeout: secs(args.handshake_timeout_secs),
        preface_timeout: secs(args.preface_timeout_secs),
        idle_timeout: secs(args.idle_timeout_secs),
        request_timeout: secs(args.request_timeout_secs),
        max_concurrent_streams: args.max_streams_per_connection,
        preauth_body_bytes: args.preauth_body_bytes,
        ..ringway_ca::server::ServerLimits::default()
    };
    limits
        .validate()
        .context("the certificate service's limits")?;
    server_limits
        .validate()
        .context("the certificate service's connection limits")?;
    let signers = args
        .root_certs
        .iter()
        .zip(&args.root_keys)
        .map(|(c, k)| ringway_identity::CaSigner::load(c, k).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .context("loading a signing root")?;
    let tls = ringway_ca::server::tls_config_from_files(&args.tls_cert, &args.tls_key)
        .context("loading the CA service's serving certificate")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ringway-ca")
        .enable_all()
        .build()
        .context("starting the CA runtime")?;
    let client = rt
        .block_on(kube::Client::try_default())
        .context("the certificate service needs the Kubernetes API (TokenReview, pods)")?;
    let pods = {
        let _guard = rt.enter();
        Arc::new(ringway_ca::pods::WatchedPods::start(
            client.clone(),
            std::time::Duration::from_secs(args.pod_watch_stale_secs),
        ))
    };

    let service = Arc::new(ringway_ca::CaService::new(
        ringway_ca::Policy {
            trust_domain: args.trust_domain.clone(),
            node_proxy: (np_ns.to_owned(), np_sa.to_owned()),
        },
        limits,
        Arc::new(ringway_ca::KubeTokenReviewer::new(
            client,
            args.audience.clone(),
        )),
        pods.clone(),
        signers,
    )?);
    let server =
        ringway_ca::server::Server::start(rt, args.listen, tls, service.clone(), server_limits)
            .with_context(|| format!("binding the certificate service on {}", args.listen))?;
    let metrics = service.clone();
    let ready_pods = pods;
    let control = ringway_control::ControlServer::serve(
        args.metrics_addr,
        Arc::new(move |method, path, _, _| match (method, path) {
            (&hyper::Method::GET, "/metrics") => (
                hyper::StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode_metrics(),
            ),
            (&hyper::Method::GET, "/healthz/ready") => {
                use ringway_ca::PodDirectory;
                match ready_pods.ready() {
                    Ok(()) => (
                        hyper::StatusCode::OK,
                        "text/plain; charset=utf-8",
                        "ready\n".into(),
                    ),
                    Err(e) => (
                        hyper::StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain; charset=utf-8",
                        format!("not ready: {}\n", e.detail()),
                    ),
                }
            }
            (_, path) => (
                hyper::StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                format!("no such endpoint: {path}\n"),
            ),
        }),
    )
    .with_context(|| format!("binding the CA's metrics endpoint on {}", args.metrics_addr))?;
    tracing::info!(listen = %args.listen, metrics = %control.addr, trust_domain = %args.trust_domain, "certificate service serving");
    let sig = stop.wait()?;
    tracing::info!(signal = ?sig, "certificate service stopping");
    server.stop();
    drop(control);
    Ok(())
}

/// Blocks SIGINT/SIGTERM in the calling thread (and the threads it spawns
/// later) so they can be waited for with `wait_for_stop`.
fn block_stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    let _ = set.thread_block();
    set
}

fn run_proxy(args: ProxyArgs) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stop = block_stop_signals();
    let mesh = load_mesh(args.config.as_ref())?;
    let mut settings = mesh.proxy().clone();
    // A tunnel may never target the proxy's own control ports in a pod,
    // wherever they were moved to. Port 0 (an ephemeral port, as the tests
    // ask for) names no port and is not reserved: it would fail validation.
    for addr in [args.readiness_addr, args.metrics_addr, args.admin_addr] {
        if addr.port() != 0 && !settings.hbone.reserved_ports.contains(&addr.port()) {
            settings.hbone.reserved_ports.push(addr.port());
        }
    }
    let drain_period = settings.drain_period;
    if args.mesh_source == MeshSource::Xds {
        xds::check_file(&mesh)?;
    }
    let proxy = Arc::new(Proxy::start(settings)?);
    // HBONE: on when the config has a CA (`ca:`); with the control plane as
    // the mesh source, its certificate service otherwise; off otherwise.
    let _refresher = match (mesh.ca(), mesh.ca_service(), args.mesh_source) {
        (None, None, MeshSource::Xds) => Some(ca_service::enable_hbone_with_ca_service(
            &proxy,
            &args.xds.ca_service()?,
            mesh.trust_domain(),
        )?),
        (_, None, _) => proxy.enable_hbone(&mesh)?,
        (_, Some(svc), _) => Some(ca_service::enable_hbone_with_ca_service(
            &proxy,
            svc,
            mesh.trust_domain(),
        )?),
    };
    let mesh = Arc::new(mesh);
    if args.mesh_source != MeshSource::Xds {
        proxy.set_mesh(mesh.clone());
    }
    let ready = Arc::new(ringway_proxy::zds_client::Readiness::default());
    // `--mesh-source kubernetes`: the cluster's workloads and services are
    // added to the file's, on the `ringway-kube` control thread; until its
    // first snapshot (every watch listed) the file's mesh is in force.
    let (first_tx, first_rx) = std::sync::mpsc::sync_channel(1);
    let (mut kube_mesh, mut xds_mesh, mut first_snapshot) = (None, None, None);
    match args.mesh_source {
        MeshSource::File => {}
        MeshSource::Kubernetes => {
            kube_mesh = Some(Arc::new(start_kube_mesh(
                mesh,
                &args.cluster_domain,
                &args.istio_root_namespace,
                proxy.clone(),
                first_tx,
            )?));
            first_snapshot = Some(first_rx);
        }
        MeshSource::Xds => {
            xds_mesh = Some(Arc::new(xds::start(
                mesh,
                &args.xds,
                &args.cluster_domain,
                proxy.clone(),
                ready.clone(),
                first_tx,
            )?));
            first_snapshot = Some(first_rx);
        }
    }
    // Hot reload of the mesh (workloads, policies): connections opened after
    // a valid edit use it; datapath settings and the CA need a restart. With
    // the Kubernetes source the edit is merged with the cluster's objects.
    let _watcher = match &args.config {
        Some(path) => {
            let p = proxy.clone();
            let kube_mesh = kube_mesh.clone();
            let xds_mesh = xds_mesh.clone();
            Some(
                ringway_config::ConfigWatcher::spawn(
                    path.clone(),
                    ringway_config::ProcessEnv,
                    move |m| {
                        tracing::info!(revision = m.revision(), "configuration reloaded");
                        match (&kube_mesh, &xds_mesh) {
                            (Some(k), _) => k.set_file(m),
                            (None, Some(x)) => x.set_file(m),
                            (None, None) => {
                                p.set_mesh(m);
                            }
                        }
                    },
                    |e| tracing::error!(error = %e, "configuration edit rejected; keeping the previous one"),
                )
                .context("watching the configuration file")?,
            )
        }
        None => None,
    };
    let xds_status = xds_mesh.as_ref().map(|x| x.status().clone());
    let metrics_server = ringway_control::ControlServer::serve_shared(
        args.metrics_addr,
        ringway_proxy::control::metrics_handler_with(proxy.metrics(), proxy.stats_handle(), |r| {
            if let Some(s) = &xds_status {
                s.register(r);
            }
        }),
    )
    .with_context(|| format!("binding the metrics endpoint on {}", args.metrics_addr))?;
    tracing::info!(addr = %metrics_server.addr, "metrics endpoint: GET /metrics");
    let set_level = LOG_RELOAD.get().cloned().unwrap_or_else(|| {
        std::sync::Arc::new(|_: &str| Err(ringway_proxy::control::LogLevelError::NotInitialised))
    });
    let admin_server = ringway_control::ControlServer::serve_shared(
        args.admin_addr,
        ringway_proxy::control::admin_handler(proxy.clone(), set_level),
    )
    .with_context(|| format!("binding the admin endpoint on {}", args.admin_addr))?;
    tracing::info!(addr = %admin_server.addr, "admin endpoint: GET /config_dump, POST /logging?level=");
    let control = ringway_control::ControlServer::start(args.readiness_addr, ready.clone())
        .with_context(|| format!("binding the readiness endpoint on {}", args.readiness_addr))?;
    tracing::info!(addr = %control.addr, "readiness endpoint: GET /healthz/ready");
    for spec in &args.pods {
        let (uid, path) = spec
            .split_once('=')
            .with_context(|| format!("--pod {spec:?} is not UID=NETNS_PATH"))?;
        let fd = ringway_redirect::open_netns(std::path::Path::new(path))?;
        // The configured workload with this uid names the pod (metrics,
        // identity), as the agent's record would.
        let identity = match proxy.mesh().as_deref().and_then(|m| m.workload_by_uid(uid)) {
            Some(w) => ringway_proxy::PodIdentity {
                name: w.name.clone(),
                namespace: w.namespace.clone(),
                service_account: w.service_account.clone(),
            },
            None => {
                tracing::warn!(
                    pod.uid = uid,
                    "--pod: no configured workload has this uid; its metrics name it by uid"
                );
                ringway_proxy::PodIdentity::default()
            }
        };
        proxy
            .add_pod_with_identity(uid, fd, identity)
            .with_context(|| format!("adding pod {uid}"))?;
    }
    let zds_stop = Arc::new(AtomicBool::new(false));
    let zds_thread = match &args.zds_socket {
        Some(path) => {
            let (p, r, st) = (proxy.clone(), ready.clone(), zds_stop.clone());
            let cfg = ringway_proxy::zds_client::ZdsClientConfig::new(path.clone());
            Some(
                std::thread::Builder::new()
                    .name("ringway-zds".into())
                    .spawn(move || {
                        // With the Kubernetes source, no pod is taken (and
                        // readiness stays 503) before the cluster's workloads
                        // are known: until then every destination would look
                        // outside the mesh and every policy would see no
                        // workload. The agent keeps the pods on the old
                        // proxy (or answers CNI ADD "try again").
                        if let Some(rx) = first_snapshot {
                            if !wait_first_snapshot(&rx, &st) {
                                return;
                            }
                        }
                        ringway_proxy::zds_client::run(p, cfg, r, st)
                    })?,
            )
        }
        None => {
            // Without an agent the pods on the command line are the snapshot.
            ready.mark_snapshot_applied();
            None
        }
    };
    tracing::info!("serving; SIGTERM or SIGINT starts the drain");
    let sig = stop.wait()?;
    // Drain: close every listener at once (a new proxy bound to the same
    // ports takes the new connections; queued ones migrate to it), stop
    // taking pods, keep established connections for the drain period.
    let t0 = Instant::now();
    ready.set_draining();
    proxy.close_listeners();
    zds_stop.store(true, Ordering::SeqCst);
    let active = proxy.stats().active;
    tracing::info!(signal = ?sig, active, drain_period = ?drain_period, "draining");
    while proxy.stats().active > 0 && t0.elapsed() < drain_period {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = proxy.stats().active;
    if let Some(t) = zds_thread {
        let _ = t.join();
    }
    drop(xds_mesh);
    drop(control);
    drop(metrics_server);
    drop(admin_server);
    match Arc::try_unwrap(proxy) {
        Ok(p) => p.shutdown(),
        Err(p) => {
            p.stop_workers_now();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    tracing::info!(reset = left, drained_for = ?t0.elapsed(), "stopped");
    Ok(())
}

/// Runs the sandbox; its components log to `log` (a file) when given, else
/// to stderr.
#[cfg(feature = "sandbox")]
fn sandbox(args: SandboxArgs, log: Option<PathBuf>) -> anyhow::Result<()> {
    if let Some(why) = ringway_testbed::missing_privileges() {
        bail!(
            "ringway sandbox builds network namespaces and needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2: {why}"
        );
    }
    if args.pods < 2 {
        bail!("--pods must be at least 2 (a client and a server)");
    }
    let stop = block_stop_signals();
    let settings = load_settings(args.config.as_ref())?;
    let opts = sandbox::Options {
        pods: args.pods,
        mode: args.mode,
        bytes: args.bytes,
        settings,
        ca_service: args.ca_service,
        log: log.clone(),
    };
    let wait = args.wait.then_some(stop);
    let out = ringway_testbed::run_isolated("sandbox", || sandbox::run(&opts, wait))
        .unwrap_or_else(|| bail!("the sandbox could not run"));
    if let (Err(_), Some(log)) = (&out, &log) {
        eprintln!(
            "ringway sandbox failed; the components' logs are in {}",
            log.display()
        );
    }
    out
}
