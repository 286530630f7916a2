//! Two virtual nodes joined by a veth, one in-process proxy per node (each
//! with its own identity manager over one test CA), and a mesh listing the
//! client pod (node 1) and the server pods (node 2) as tunnel workloads.

use ringway_testbed::traffic::ReadNoIntr;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ringway_config::{CaptureMode, Datapath, Mesh, MeshConfig, NoEnv, ProxySettings};
use ringway_identity::{CaSigner, IdentityManager, TrustBundle};
use ringway_proxy::{PodIdentity, Proxy};
use ringway_testbed::mesh::{workloads_yaml, WorkloadYaml};
use ringway_testbed::{link_nodes, NodeLink, Pod, TempDir, VirtualNode};

use super::{capture, init_logs};

pub const TD: &str = "cluster.local";
pub const APP_PORT: u16 = 8080;
pub const CLIENT_ID: &str = "spiffe://cluster.local/ns/front/sa/frontend";

/// How to build the two nodes.
pub struct Opts {
    /// Names the temporary CA directory.
    pub test: String,
    pub datapath: Datapath,
    /// Whether the proxies get identity managers (HBONE on).
    pub hbone: bool,
    /// Server pods on node 2 (`server-0`, `server-1`, ...).
    pub server_pods: usize,
    /// YAML appended after the workloads (services, policies).
    pub extra: String,
    /// Lifetime of the workload certificates.
    pub cert_lifetime: Duration,
    /// The service account node 2's agent reports for its pods (the mesh
    /// says `web`).
    pub server_sa: String,
    /// The tunnel listener's limits (`proxy.hbone`) of both proxies.
    pub limits: ringway_config::HboneSettings,
    /// Datapath workers of each proxy (each worker has its own tunnels).
    pub workers: usize,
}

impl Opts {
    pub fn new(test: &str) -> Opts {
        Opts {
            test: test.to_string(),
            datapath: Datapath::Uring,
            hbone: true,
            server_pods: 1,
            extra: String::new(),
            cert_lifetime: Duration::from_secs(3600),
            server_sa: "web".into(),
            limits: ringway_config::HboneSettings::default(),
            workers: 2,
        }
    }
}

pub struct TwoNodes {
    pub n1: VirtualNode,
    pub n2: VirtualNode,
    pub link: NodeLink,
    pub p1: Proxy,
    pub p2: Proxy,
    pub ids1: Option<Arc<IdentityManager>>,
    pub ids2: Option<Arc<IdentityManager>>,
    pub dir: TempDir,
    server_pods: usize,
}

impl TwoNodes {
    pub fn client(&self) -> &Pod {
        self.n1.pod(0)
    }
    pub fn server(&self) -> &Pod {
        self.n2.pod(0)
    }
    /// Publishes `mesh` to both proxies; returns the connections each reset
    /// on the re-check.
    pub fn set_mesh(&self, mesh: Arc<Mesh>) -> (usize, usize) {
        (self.p1.set_mesh(mesh.clone()), self.p2.set_mesh(mesh))
    }
    /// This bed's workloads followed by `extra` (services, policies).
    pub fn mesh(&self, extra: &str) -> Arc<Mesh> {
        mesh_of(self.server_pods, extra)
    }

    /// This bed's workloads as a control plane's view holds them (not
    /// complete: a node's view may lag), each passed through `edit`, which
    /// may change it and says whether the view holds it.
    pub fn control_plane_view(
        &self,
        edit: impl Fn(&mut ringway_config::Workload) -> bool,
    ) -> Arc<Mesh> {
        let full = self.mesh("");
        let mut e = full.without_entries().edit();
        for w in full.workloads() {
            let mut w = w.clone();
            if edit(&mut w) {
                e.upsert_workload(w, Default::default());
            }
        }
        Arc::new(e.finish())
    }
}

/// The mesh: `client-0` (front/frontend) on node1, `server-i` (shop/web)
/// on node2, all tunnel workloads, then `extra`.
pub fn mesh_of(server_pods: usize, extra: &str) -> Arc<Mesh> {
    let workload =
        |name: &str, namespace: &str, sa: &str, node: &str, ips: [&str; 2]| WorkloadYaml {
            uid: name.into(),
            name: name.into(),
            namespace: namespace.into(),
            service_account: sa.into(),
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            node: node.into(),
            tunnel: true,
            healthy: true,
        };
    let mut ws = vec![workload(
        "client-0",
        "front",
        "frontend",
        "node1",
        ["10.244.1.2", "fd00:244:1::2"],
    )];
    for i in 0..server_pods {
        let h = i + 2;
        ws.push(workload(
            &format!("server-{i}"),
            "shop",
            "web",
            "node2",
            [&format!("10.244.2.{h}"), &format!("fd00:244:2::{h}")],
        ));
    }
    let yaml = workloads_yaml(&ws) + extra;
    Arc::new(MeshConfig::load_str(&yaml, "hbone test mesh", &NoEnv).expect("test mesh"))
}

/// A scratch dir holding a fresh test CA (`ca.crt`, `ca.key`) of `TD`.
pub fn ca_dir(test: &str) -> TempDir {
    let dir = TempDir::new(test);
    CaSigner::generate_for_tests(TD)
        .write_pem_files(&dir.join("ca.crt"), &dir.join("ca.key"))
        .unwrap();
    dir
}

pub fn manager(dir: &Path, extra_roots: &[&Path]) -> Arc<IdentityManager> {
    manager_with(dir, extra_roots, Duration::from_secs(3600))
}

pub fn manager_with(dir: &Path, extra_roots: &[&Path], lifetime: Duration) -> Arc<IdentityManager> {
    let ca = CaSigner::load(dir.join("ca.crt"), dir.join("ca.key")).unwrap();
    let bundle = TrustBundle::from_pem_files(extra_roots).unwrap();
    Arc::new(IdentityManager::new(ca, bundle, TD, lifetime).unwrap())
}

pub fn two_nodes(o: Opts) -> TwoNodes {
    init_logs();
    let n1 = VirtualNode::build(1, 1).unwrap();
    let n2 = VirtualNode::build(2, o.server_pods).unwrap();
    let link = link_nodes(&n1, &n2).unwrap();
    let dir = ca_dir(&o.test);
    let settings = ProxySettings {
        capture_mode: CaptureMode::Tproxy,
        datapath: o.datapath,
        workers: o.workers,
        hbone: o.limits.clone(),
        ..ProxySettings::default()
    };
    let m = mesh_of(o.server_pods, &o.extra);
    let start = |pods: &[(&Pod, PodIdentity)]| {
        let p = Proxy::start(settings.clone()).unwrap();
        let ids = o.hbone.then(|| manager_with(&dir, &[], o.cert_lifetime));
        p.set_identity(ids.clone());
        p.set_mesh(m.clone());
        for (pod, who) in pods {
            capture(pod, CaptureMode::Tproxy);
            p.add_pod_with_identity(&pod.name, pod.netns.dup_fd().unwrap(), who.clone())
                .unwrap();
        }
        assert_eq!(p.hbone_enabled(), o.hbone);
        (p, ids)
    };
    let (p1, ids1) = start(&[(
        n1.pod(0),
        PodIdentity {
            name: "client-0".into(),
            namespace: "front".into(),
            service_account: "frontend".into(),
        },
    )]);
    let servers: Vec<_> = (0..o.server_pods)
        .map(|i| {
            (
                n2.pod(i),
                PodIdentity {
                    name: format!("server-{i}"),
                    namespace: "shop".into(),
                    service_account: o.server_sa.clone(),
                },
            )
        })
        .collect();
    let (p2, ids2) = start(&servers);
    TwoNodes {
        n1,
        n2,
        link,
        p1,
        p2,
        ids1,
        ids2,
        dir,
        server_pods: o.server_pods,
    }
}

pub fn metrics_text(p: &Proxy) -> String {
    ringway_proxy::metrics::encode(&p.metrics().registry(), false)
}

/// A TLS client connecting straight to the server pod's 15008 from node1's
/// netns; returns what the first read after the handshake gave.
pub fn raw_tls(t: &TwoNodes, cfg: rustls::ClientConfig) -> std::io::Result<usize> {
    let addr = SocketAddr::new(t.server().ip(false), 15008);
    t.n1.node.run(|| {
        let mut tcp = ringway_testbed::traffic::connect(addr, super::TIMEOUT)?;
        tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
        let conn = rustls::ClientConnection::new(
            Arc::new(cfg),
            ringway_identity::placeholder_server_name(),
        )
        .map_err(std::io::Error::other)?;
        let mut tls = rustls::StreamOwned::new(conn, &mut tcp);
        // HTTP/2 preface; an accepting server answers with its SETTINGS.
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")?;
        let mut buf = [0u8; 64];
        tls.read_no_intr(&mut buf)
    })
}

/// The TLS error a [`raw_tls`] client got, when it was one (e.g. the
/// server's alert: `rustls::Error::AlertReceived(..)`); `None` for a
/// timeout, a close or any other I/O error.
pub fn tls_error(r: &std::io::Result<usize>) -> Option<rustls::Error> {
    r.as_ref()
        .err()?
        .get_ref()?
        .downcast_ref::<rustls::Error>()
        .cloned()
}

/// A mesh peer on node 1 holding a real certificate for `as_id` opens an
/// HBONE CONNECT to the server pod's 15008 (dialled as `dst_id`) with
/// `headers`, and on success echoes one message through it. `Ok(200)` when
/// the stream opened and echoed, `Ok(status)` when the server refused it,
/// `Err` for anything else (timeouts, transport errors).
#[allow(dead_code)]
pub fn peer_connect(
    t: &TwoNodes,
    as_id: &ringway_identity::Identity,
    dst_id: &ringway_identity::Identity,
    v6: bool,
    headers: ringway_hbone::ConnectHeaders,
) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let timeout = super::TIMEOUT;
    let ids = t.ids1.clone().expect("HBONE on");
    let tunnel = SocketAddr::new(t.server().ip(v6), ringway_hbone::HBONE_PORT);
    let tls = ids
        .client_config(as_id, dst_id)
        .map_err(|e| e.to_string())?;
    let key = peer_key(t, as_id, dst_id, v6);
    on_node1(t, async {
        {
            let pool = ringway_hbone::Pool::new(ringway_hbone::PoolConfig::default());
            let dial = move || tls_dial(tls, tunnel);
            let opened = tokio::time::timeout(timeout, pool.connect(key, dial, headers))
                .await
                .map_err(|_| "CONNECT timed out".to_string())?;
            match opened {
                Ok(mut s) => {
                    s.write_all(b"ping").await.map_err(|e| e.to_string())?;
                    let mut back = [0u8; 4];
                    tokio::time::timeout(timeout, s.read_exact(&mut back))
                        .await
                        .map_err(|_| "echo timed out".to_string())?
                        .map_err(|e| e.to_string())?;
                    Ok(200)
                }
                Err(e) => e
                    .status()
                    .map(|s| s.as_u16())
                    .ok_or_else(|| format!("no status: {e}")),
            }
        }
    })
}

/// The pool key of a mesh peer on node 1 (the client pod's address of the
/// family) dialling the server pod's 15008 as `as_id`, expecting `dst_id`.
#[allow(dead_code)]
pub fn peer_key(
    t: &TwoNodes,
    as_id: &ringway_identity::Identity,
    dst_id: &ringway_identity::Identity,
    v6: bool,
) -> ringway_hbone::PoolKey {
    ringway_hbone::PoolKey {
        src_identity: as_id.to_string(),
        dst_identity: dst_id.to_string(),
        src_ip: t.client().ip(v6),
        dst: SocketAddr::new(t.server().ip(v6), ringway_hbone::HBONE_PORT),
        trust_generation: 0,
    }
}

/// Runs `f` to its end on a current-thread runtime in node 1's netns.
#[allow(dead_code)]
pub fn on_node1<T: Send>(t: &TwoNodes, f: impl std::future::Future<Output = T> + Send) -> T {
    t.n1.node.run(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    })
}

/// TCP to `to`, then a TLS handshake under `tls` (a tunnel's dial).
#[allow(dead_code)]
pub async fn tls_dial(
    tls: Arc<rustls::ClientConfig>,
    to: SocketAddr,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(to).await?;
    tokio_rustls::TlsConnector::from(tls)
        .connect(ringway_identity::placeholder_server_name(), tcp)
        .await
}
