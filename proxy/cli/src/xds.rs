//! `ringway proxy --mesh-source xds`: the mesh's workloads, services and L4
//! policies from the control plane's workload API (one delta ADS stream to
//! istiod), on a `ringway-xds` control thread of its own.
//!
//! The configuration file keeps its settings (datapath, trust domain, root
//! namespace, cluster id, locality); every workload, service and policy comes
//! from the control plane, so a file that lists any is refused. Without a
//! `ca:` section the workload certificates come from the same control plane
//! (its `IstioCertificateService` on the same address), with the same token
//! and the same root as the xDS stream.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use ringway_config::{CaService, Mesh};
use ringway_proxy::Proxy;
use ringway_xds::state::{MeshState, SharedMeshState, XdsStatus};

/// The control plane's address in a cluster that runs the mesh.
pub const DEFAULT_XDS_ADDRESS: &str = "istiod.istio-system.svc:15012";
/// Where the mesh's root certificate is mounted (the `istio-ca-root-cert`
/// ConfigMap), as the reference node proxy reads it.
pub const DEFAULT_ROOT_CERT: &str = "/var/run/secrets/istio/root-cert.pem";

/// The flags of `--mesh-source xds`.
#[derive(clap::Args, Debug, Clone)]
pub struct XdsArgs {
    /// The control plane (`host:port`), for xDS and, without a `ca:`
    /// section, for certificates.
    #[arg(long, env = "RINGWAY_XDS_ADDRESS", default_value = DEFAULT_XDS_ADDRESS)]
    pub xds_address: String,
    /// The name the control plane's certificate must be valid for (default:
    /// the host of `--xds-address`).
    #[arg(long, env = "RINGWAY_XDS_SERVER_NAME")]
    pub xds_server_name: Option<String>,
    /// The mesh root the control plane's certificate is checked against.
    #[arg(long, env = "RINGWAY_XDS_ROOT_CERT", default_value = DEFAULT_ROOT_CERT)]
    pub xds_root_cert: PathBuf,
    /// This proxy pod's projected service-account token (audience
    /// `istio-ca`), sent as the bearer credential; read at every connect.
    #[arg(long, env = "RINGWAY_XDS_TOKEN_FILE", default_value = ringway_config::DEFAULT_CA_TOKEN_FILE)]
    pub xds_token_file: PathBuf,
    /// This proxy's pod name (the control plane's node id and metadata).
    #[arg(long, env = "POD_NAME", default_value = "")]
    pub pod_name: String,
    /// This proxy's namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "")]
    pub pod_namespace: String,
    /// This proxy's pod IPs (comma separated).
    #[arg(long, env = "INSTANCE_IP", value_delimiter = ',')]
    pub instance_ip: Vec<IpAddr>,
    /// The node this proxy serves: the control plane sends what its pods need.
    #[arg(long = "xds-node-name", env = "NODE_NAME", default_value = "")]
    pub node_name: String,
}

impl XdsArgs {
    fn server_name(&self) -> anyhow::Result<String> {
        match &self.xds_server_name {
            Some(n) => Ok(n.clone()),
            None => {
                let (host, _) = self.xds_address.rsplit_once(':').with_context(|| {
                    format!("--xds-address {:?} is not host:port", self.xds_address)
                })?;
                Ok(host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned())
            }
        }
    }

    /// The certificate service when the file names none: the control plane
    /// itself, with the same root and token as the xDS stream.
    pub fn ca_service(&self) -> anyhow::Result<CaService> {
        Ok(CaService {
            address: self.xds_address.clone(),
            server_name: self.server_name()?,
            root_cert_file: self.xds_root_cert.clone(),
            token_file: self.xds_token_file.clone(),
            bundle_files: Vec::new(),
        })
    }
}

/// Refuses a file that lists workloads, services or policies: with the
/// control plane as the source they would never apply.
pub fn check_file(mesh: &Mesh) -> anyhow::Result<()> {
    let (w, s, p, pa) = (
        mesh.workload_count(),
        mesh.service_count(),
        mesh.policy_count(),
        mesh.peer_authentications().len(),
    );
    if w + s + p + pa > 0 {
        bail!(
            "--mesh-source xds: the control plane sends every workload, service and policy, \
             but the configuration lists {w} workloads, {s} services, {p} policies and {pa} \
             peerAuthentications; remove them (they would never apply)"
        );
    }
    Ok(())
}

/// The running xDS source: stops its thread when dropped.
pub struct XdsMesh {
    state: SharedMeshState,
    status: Arc<XdsStatus>,
    /// The client's TLS (replaced when the root rotates).
    tls: ringway_grpc::ClientTls,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for XdsMesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsMesh")
            .field("synced", &self.status.synced())
            .finish_non_exhaustive()
    }
}

impl XdsMesh {
    /// The client's status (readiness, metrics, refused resources).
    pub fn status(&self) -> &Arc<XdsStatus> {
        &self.status
    }

    /// The client's TLS: replace it to check the control plane's
    /// certificate against other roots from the next connect on.
    pub fn tls(&self) -> &ringway_grpc::ClientTls {
        &self.tls
    }

    /// A reloaded configuration file: its settings apply, its entries do not.
    pub fn set_file(&self, file: Arc<Mesh>) {
        if check_file(&file).is_err() {
            tracing::warn!(
                "the reloaded configuration lists workloads, services or policies: ignored \
                 (they come from the control plane)"
            );
        }
        self.state
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .set_base(file);
    }
}

impl Drop for XdsMesh {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the xDS client on a `ringway-xds` thread: each response is applied
/// and published to `proxy`; `ready` says what is still awaited; `first`
/// gets one message once the first response of each type is in.
pub fn start(
    file: Arc<Mesh>,
    args: &XdsArgs,
    cluster_domain: &str,
    proxy: Arc<Proxy>,
    ready: Arc<ringway_proxy::zds_client::Readiness>,
    first: std::sync::mpsc::SyncSender<()>,
) -> anyhow::Result<XdsMesh> {
    let bundle = ringway_identity::TrustBundle::from_pem_files(&[&args.xds_root_cert])
        .with_context(|| {
            format!(
                "loading the mesh root for the control plane from {}",
                args.xds_root_cert.display()
            )
        })?;
    let tls = ringway_grpc::ClientTls::new(
        ringway_ca::CaClient::tls_config(bundle.roots())
            .map_err(|e| anyhow::anyhow!("the control plane's TLS: {e}"))?,
    );
    let server_name = args.server_name()?;
    let name = rustls_pki_types::ServerName::try_from(server_name.clone())
        .with_context(|| format!("--xds-server-name {server_name:?}"))?;
    let node = ringway_xds::Node::node_proxy(
        &args.instance_ip,
        &args.pod_name,
        &args.pod_namespace,
        &args.node_name,
        cluster_domain,
    )
    .with_metadata("CLUSTER_ID", file.cluster_id());
    let config = ringway_xds::ClientConfig::new(
        args.xds_address.clone(),
        name,
        tls.clone(),
        args.xds_token_file.clone(),
        file.cluster_id(),
        node,
    );
    let client = ringway_xds::AdsClient::new(config).context("the xDS client's configuration")?;
    let status = Arc::new(XdsStatus::default());
    ready.set_mesh_waiting("the control plane's first workloads and policies");
    let publish_status = status.clone();
    let mut first = Some(first);
    let state = MeshState::new(
        file,
        status.clone(),
        Box::new(move |mesh| {
            proxy.set_mesh(mesh);
            if publish_status.synced() {
                if let Some(tx) = first.take() {
                    ready.set_mesh_waiting("");
                    let _ = tx.try_send(());
                }
            }
        }),
    );
    // Until the first push: no workload is known, and the mesh says so
    // (a pod's traffic waits for its workload instead of being guessed).
    let mut state = state;
    state.publish();
    let state = SharedMeshState(Arc::new(Mutex::new(state)));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the xDS runtime")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut handler = state.clone();
    let thread = std::thread::Builder::new()
        .name("ringway-xds".into())
        .spawn(move || {
            rt.block_on(client.run(&mut handler, async {
                let _ = stopped.await;
            }));
        })
        .context("starting the xDS thread")?;
    tracing::info!(xds.address = %args.xds_address, xds.server_name = %server_name,
        "mesh source: the control plane's workload API (xDS); the file gives the settings only");
    Ok(XdsMesh {
        state,
        status,
        tls,
        stop: Some(stop),
        thread: Some(thread),
    })
}
