//! `cargo bench -p ringway-benches -- --control-plane [--quick]`: the mesh
//! sources at scale, side by side: 10,000 workloads, 2,000 services and
//! 1,000 policies (the quick run a tenth), from the control plane over delta
//! xDS and from the Kubernetes API server.
//!
//! - **xDS**: a real test control plane (`ringway_xds::testing::XdsServer`,
//!   TLS 1.3 + HTTP/2 on 127.0.0.1 of the bench's own network namespace)
//!   serving the generated resources ([`gen`]); the client as the proxy runs
//!   it: `AdsClient` + `MeshState` on a current-thread runtime on a
//!   `ringway-xds` thread of its own, publishing into a sink that keeps each
//!   `Arc<Mesh>` with the instant and the thread's CPU time
//!   (`getrusage(RUSAGE_THREAD)`, read on that thread when it publishes).
//!   Timed: stream open -> both types applied (the first `synced`), and one
//!   pushed change (a workload, a policy, interleaved) -> its snapshot
//!   published.
//! - **Kubernetes watch**: the same mesh as objects (namespaces, pods,
//!   services, EndpointSlices, AuthorizationPolicies) in the fake API server
//!   (`ringway_testbed::kube_api`), served over HTTP on 127.0.0.1;
//!   `kube::MeshWatch` on its `ringway-kube` thread as the proxy runs it
//!   (default options: 100 ms debounce). Timed: start -> first snapshot, one
//!   changed object (a pod, a policy) -> the snapshot that has it.
//! - **Memory** from the real proxy as a child process (`ringway proxy
//!   --mesh-source xds|kubernetes` against the same servers): its VmRSS with
//!   the mesh loaded minus a child's with an empty control plane, per
//!   workload. The bench process holds the servers and their objects, so
//!   its own RSS would not say what the client keeps. The children also give
//!   the cross-check: their own time to the first snapshot (the proxy logs
//!   it), the mesh thread's CPU from `/proc` (schedstat), push -> ACK as the
//!   control plane sees it, and the proxy's own `process_resident_memory_bytes`.
//!
//! Figures, never assertions: the report is checked for completeness only.

pub mod gen;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use prost::Message;
use ringway_config::kube::{KubeOptions, MeshWatch};
use ringway_config::{Mesh, MeshConfig, NoEnv};
use ringway_testbed::kube_api::{FakeApiServer, Kind};
use ringway_xds::state::{MeshState, XdsStatus};
use ringway_xds::testing::{server_tls, XdsServer};
use ringway_xds::{
    AdsClient, ClientConfig, DeltaDiscoveryResponse, Event, Handler, Nack, Node, Resource,
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};
use serde::{Deserialize, Serialize};

pub use self::gen::Shape;
use crate::child::ProxyChild;
use crate::stat::Num;

/// The name the control plane's certificate is for.
const SERVER_NAME: &str = "istiod.istio-system.svc";
/// The bound of every wait for a snapshot or an ACK (a failure, not a pass).
const WAIT: Duration = Duration::from_secs(60);
/// The bound of a proxy child's first snapshot.
const CHILD_WAIT: Duration = Duration::from_secs(300);
/// The log line of the proxy's first snapshot (its ZDS thread writes it,
/// with `waited=<since start>`).
const FIRST_SNAPSHOT_LINE: &str = "first mesh snapshot in";

/// How big a run is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ControlPlaneConfig {
    /// "full", "quick" or "tiny (test)".
    pub label: String,
    /// The mesh.
    pub shape: Shape,
    /// xDS changes of each kind (workload, policy), interleaved.
    pub xds_updates: usize,
    /// Kubernetes changes of each kind (pod, policy), interleaved.
    pub kube_updates: usize,
    /// Changes given to each proxy child (xDS: push -> ACK timed; both:
    /// the mesh thread's CPU per change).
    pub child_updates: usize,
    /// Pause before a child's RSS is read, ms.
    pub settle_ms: u64,
}

impl ControlPlaneConfig {
    /// 10,000 workloads, 2,000 services, 1,000 policies; 200 xDS changes
    /// and 30 Kubernetes changes of each kind.
    pub fn full() -> ControlPlaneConfig {
        ControlPlaneConfig {
            label: "full".into(),
            shape: Shape {
                workloads: 10_000,
                services: 2_000,
                policies: 1_000,
            },
            xds_updates: 200,
            kube_updates: 30,
            child_updates: 20,
            settle_ms: 1_000,
        }
    }

    /// A tenth of the full run's sizes.
    pub fn quick() -> ControlPlaneConfig {
        ControlPlaneConfig {
            label: "quick".into(),
            shape: Shape {
                workloads: 1_000,
                services: 200,
                policies: 100,
            },
            xds_updates: 40,
            kube_updates: 8,
            child_updates: 10,
            settle_ms: 500,
        }
    }

    /// The test's run (`benches/tests/control_plane_report.rs`): the
    /// pipeline, not the numbers.
    pub fn tiny() -> ControlPlaneConfig {
        ControlPlaneConfig {
            label: "tiny (test)".into(),
            shape: Shape {
                workloads: 100,
                services: 20,
                policies: 10,
            },
            xds_updates: 5,
            kube_updates: 2,
            child_updates: 3,
            settle_ms: 200,
        }
    }

    /// `RINGWAY_BENCH_CP_WORKLOADS`, `_SERVICES`, `_POLICIES`,
    /// `_XDS_UPDATES`, `_KUBE_UPDATES`, `_CHILD_UPDATES`.
    pub fn with_env_overrides(mut self) -> ControlPlaneConfig {
        fn var(n: &str) -> Option<usize> {
            std::env::var(format!("RINGWAY_BENCH_CP_{n}"))
                .ok()
                .and_then(|v| v.parse().ok())
        }
        if let Some(v) = var("WORKLOADS") {
            self.shape.workloads = v;
        }
        if let Some(v) = var("SERVICES") {
            self.shape.services = v;
        }
        if let Some(v) = var("POLICIES") {
            self.shape.policies = v;
        }
        if let Some(v) = var("XDS_UPDATES") {
            self.xds_updates = v;
        }
        if let Some(v) = var("KUBE_UPDATES") {
            self.kube_updates = v;
        }
        if let Some(v) = var("CHILD_UPDATES") {
            self.child_updates = v;
        }
        self
    }
}

/// One kind of change, timed from the change to the snapshot that has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Changes measured.
    pub count: usize,
    /// Change -> published, percentiles (nearest rank), ms.
    pub p50_ms: Num,
    /// 90th percentile, ms.
    pub p90_ms: Num,
    /// 99th percentile, ms.
    pub p99_ms: Num,
    /// Largest, ms.
    pub max_ms: Num,
    /// The client thread's CPU per change (from the snapshot before to this
    /// one), median, µs.
    pub cpu_p50_us: Num,
    /// The same, mean, µs.
    pub cpu_mean_us: Num,
}

/// The xDS client in the bench process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct XdsFigures {
    /// The client thread's start -> both types applied, ms.
    pub start_to_synced_ms: Num,
    /// The stream open (first requests sent) -> both types applied, ms.
    pub connected_to_synced_ms: Num,
    /// The stream open -> workloads and services applied, ms.
    pub connected_to_addresses_ms: Num,
    /// The client thread's CPU from its start to both types applied (TLS
    /// handshake included), ms.
    pub initial_cpu_ms: Num,
    /// The same from the stream's open, ms.
    pub load_cpu_ms: Num,
    /// The test control plane's thread CPU meanwhile (encoding and sending
    /// the first responses; it shares the machine's cores), ms.
    pub server_cpu_initial_ms: Num,
    /// One workload changed (HBONE <-> NONE).
    pub workload: Latency,
    /// One policy changed (a port of its first rule).
    pub policy: Latency,
    /// The first response of workloads and services, encoded, bytes.
    pub address_message_bytes: Num,
    /// The first response of policies, encoded, bytes.
    pub policy_message_bytes: Num,
    /// The client's limit of one message, bytes.
    pub max_message_bytes: Num,
    /// One workload resource (mean, as a message field), bytes.
    pub workload_resource_bytes: Num,
    /// Workloads (with services in the same ratio) whose first response
    /// would reach the limit.
    pub workloads_at_limit: Num,
    /// NACKs the client sent (0 expected: every resource is valid).
    pub nacks: usize,
    /// Streams that ended during the measurement (0 expected).
    pub disconnects: usize,
}

/// The Kubernetes watch in the bench process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KubeFigures {
    /// `MeshWatch::start` -> first snapshot, ms.
    pub start_to_first_ms: Num,
    /// The `ringway-kube` thread's CPU from its start to the first
    /// snapshot, ms.
    pub initial_cpu_ms: Num,
    /// The fake API server's thread CPU meanwhile (serializing the lists;
    /// it shares the machine's cores), ms.
    pub server_cpu_initial_ms: Num,
    /// The objects listed, as JSON (the lists' bodies, about), bytes.
    pub list_bytes: Num,
    /// The watch's debounce (the proxy's default), ms.
    pub debounce_ms: Num,
    /// One pod changed (labelled out of the mesh and back in).
    pub pod: Latency,
    /// One AuthorizationPolicy changed (a port of its first rule).
    pub policy: Latency,
}

/// A `ringway proxy` child with one mesh source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildFigures {
    /// `xds` or `kubernetes`.
    pub source: String,
    /// VmRSS with an empty control plane, after its first snapshot, MiB.
    pub rss_empty_mib: Num,
    /// VmRSS with the mesh loaded, MiB.
    pub rss_loaded_mib: Num,
    /// (loaded - empty) / workloads, KiB.
    pub kib_per_workload: Num,
    /// VmHWM (peak RSS) of the loaded child at its first snapshot, MiB.
    pub hwm_loaded_mib: Num,
    /// VmRSS after the changes given to it, MiB.
    pub rss_end_mib: Num,
    /// VmHWM after the changes (the peak while it applied them), MiB.
    pub hwm_end_mib: Num,
    /// The proxy's own `process_resident_memory_bytes`, empty and loaded,
    /// as KiB per workload.
    pub metrics_kib_per_workload: Num,
    /// Spawn -> the first-snapshot log line, by the bench's clock, ms.
    pub spawn_to_first_ms: Num,
    /// The proxy's own `waited=` of that line (from its ZDS thread's
    /// start), ms.
    pub logged_wait_ms: Num,
    /// The mesh thread's CPU (`ringway-xds` / `ringway-kube`, schedstat)
    /// at the first snapshot, ms.
    pub thread_cpu_initial_ms: Num,
    /// Changes given to the child.
    pub updates: usize,
    /// The mesh thread's CPU per change (schedstat before the change and
    /// once it is done: its ACK in and 2 ms more, or the pause given),
    /// median, µs.
    pub thread_cpu_per_update_us: Num,
    /// The same, mean, µs.
    pub thread_cpu_per_update_mean_us: Num,
    /// xDS: push -> the child's ACK at the control plane, median, ms.
    pub ack_p50_ms: Num,
    /// xDS: the same, 99th percentile, ms.
    pub ack_p99_ms: Num,
    /// xDS: the resources the proxy reports holding
    /// (`ringway_xds_resources{kind}`).
    pub resources: BTreeMap<String, Num>,
}

/// The whole document (`control_plane.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ControlPlaneReport {
    /// The run's size.
    pub config: ControlPlaneConfig,
    /// The proxy program of the children.
    pub proxy_bin: String,
    /// The xDS client; `None` when it failed (see `errors`).
    pub xds: Option<XdsFigures>,
    /// The Kubernetes watch; `None` when it failed.
    pub kube: Option<KubeFigures>,
    /// The proxy children (xDS, Kubernetes), those that completed.
    pub children: Vec<ChildFigures>,
    /// What failed.
    pub errors: Vec<String>,
    /// Notes for the reader.
    pub notes: Vec<String>,
    /// Machine description.
    pub machine: Vec<(String, String)>,
    /// Wall time of the run, seconds.
    pub wall_seconds: f64,
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench control-plane] {}", msg.as_ref());
}

/// The calling thread's CPU time (user + system).
fn thread_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_THREAD) {
        Ok(u) => {
            let tv = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
            };
            tv(u.user_time()) + tv(u.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// Nearest-rank percentile of sorted `v` (NaN when empty).
fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

fn latency(mut ms: Vec<f64>, mut cpu_us: Vec<f64>) -> Latency {
    ms.sort_by(f64::total_cmp);
    cpu_us.sort_by(f64::total_cmp);
    let mean = if cpu_us.is_empty() {
        f64::NAN
    } else {
        cpu_us.iter().sum::<f64>() / cpu_us.len() as f64
    };
    Latency {
        count: ms.len(),
        p50_ms: Num(pct(&ms, 0.5)),
        p90_ms: Num(pct(&ms, 0.9)),
        p99_ms: Num(pct(&ms, 0.99)),
        max_ms: Num(ms.last().copied().unwrap_or(f64::NAN)),
        cpu_p50_us: Num(pct(&cpu_us, 0.5)),
        cpu_mean_us: Num(mean),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A snapshot as the sink got it.
struct Published {
    at: Instant,
    /// The publishing thread's CPU time then.
    cpu: Duration,
    mesh: Arc<Mesh>,
    /// xDS: both types applied.
    synced: bool,
}

fn next_published(rx: &mpsc::Receiver<Published>, deadline: Instant) -> anyhow::Result<Published> {
    rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .map_err(|_| anyhow!("no snapshot published within {WAIT:?}"))
}

/// The first snapshot from `rx` that `ok` accepts, within [`WAIT`].
fn published_when(
    rx: &mpsc::Receiver<Published>,
    ok: impl Fn(&Mesh) -> bool,
) -> anyhow::Result<Published> {
    let deadline = Instant::now() + WAIT;
    loop {
        let p = next_published(rx, deadline)?;
        if ok(&p.mesh) {
            return Ok(p);
        }
    }
}

/// What a snapshot must show for a change to be in it.
type Check = Box<dyn Fn(&Mesh) -> bool>;

/// Fails unless `mesh` holds the shape's entries.
fn check_counts(mesh: &Mesh, shape: &Shape) -> anyhow::Result<()> {
    let got = (
        mesh.workload_count(),
        mesh.service_count(),
        mesh.policy_count(),
    );
    let want = (shape.workloads, shape.services, shape.policies);
    if got != want {
        bail!(
            "the snapshot holds {got:?} (workloads, services, policies), the control plane {want:?}"
        );
    }
    Ok(())
}

/// Files both measurements share: the mesh root, the control plane's
/// certificate, the token, the proxy children's configuration.
struct Files {
    dir: PathBuf,
    signer: ringway_identity::CaSigner,
    root: PathBuf,
    token: PathBuf,
}

impl Files {
    fn new(dir: &Path) -> anyhow::Result<Files> {
        let signer = ringway_identity::CaSigner::generate_for_tests(crate::bed::TRUST_DOMAIN);
        let root = dir.join("ca.crt");
        signer.write_pem_files(&root, &dir.join("ca.key"))?;
        let token = dir.join("token");
        std::fs::write(&token, "bench-node-proxy-token\n")?;
        Ok(Files {
            dir: dir.to_path_buf(),
            signer,
            root,
            token,
        })
    }

    /// A control plane on 127.0.0.1 of this namespace serving `addresses`
    /// and `policies`.
    fn xds_server(
        &self,
        addresses: Vec<Resource>,
        policies: Vec<Resource>,
    ) -> anyhow::Result<XdsServer> {
        let leaf = self.signer.issue_dns_for_tests(SERVER_NAME);
        let tls = server_tls(leaf.chain, leaf.key)?;
        let server = XdsServer::start_on(std::net::TcpListener::bind("127.0.0.1:0")?, tls)?;
        server.update_fixture(ADDRESS_TYPE_URL, addresses, vec![]);
        server.update_fixture(AUTHORIZATION_TYPE_URL, policies, vec![]);
        Ok(server)
    }
}

/// The client's handler as the proxy's: [`MeshState`], with the stream's
/// open and end marked.
struct Timed {
    state: MeshState,
    marks: Arc<Mutex<Marks>>,
}

#[derive(Default)]
struct Marks {
    /// Stream open: when, and the thread's CPU then.
    connected: Option<(Instant, Duration)>,
    /// Why streams ended.
    disconnects: Vec<String>,
}

impl Handler for Timed {
    fn on_response(&mut self, response: &DeltaDiscoveryResponse) -> Result<(), Nack> {
        self.state.on_response(response)
    }

    fn resource_versions(&self, type_url: &str) -> HashMap<String, String> {
        self.state.resource_versions(type_url)
    }

    fn on_event(&mut self, event: Event) {
        {
            let mut m = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
            match &event {
                Event::Connected { .. } if m.connected.is_none() => {
                    m.connected = Some((Instant::now(), thread_cpu()));
                }
                Event::Disconnected { error, .. } => m.disconnects.push(error.to_string()),
                _ => {}
            }
        }
        self.state.on_event(event);
    }
}

/// The client's thread; stopped and joined when dropped.
struct ClientThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ClientThread {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// CPU seconds of this process's threads named `prefix...`.
fn own_thread_cpu_seconds(prefix: &str) -> f64 {
    crate::child::proc_thread_cpu_seconds(std::process::id(), prefix)
}

/// The encoded size of a response carrying `resources`.
fn message_bytes(resources: &[Resource], type_url: &str) -> usize {
    DeltaDiscoveryResponse {
        system_version_info: "test-1".into(),
        resources: resources.to_vec(),
        type_url: type_url.into(),
        nonce: "nonce-1".into(),
        removed_resources: Vec::new(),
    }
    .encoded_len()
}

/// The xDS client in this process against `server` (loaded with `shape`).
fn run_xds(
    cfg: &ControlPlaneConfig,
    files: &Files,
    server: &XdsServer,
    notes: &mut Vec<String>,
) -> anyhow::Result<XdsFigures> {
    let shape = cfg.shape;
    let base = Arc::new(MeshConfig::load_str(
        "trustDomain: cluster.local\n",
        "control-plane bench",
        &NoEnv,
    )?);
    let bundle = ringway_identity::TrustBundle::from_pem_files(&[&files.root])?;
    let tls = ringway_ca::CaClient::tls_config(bundle.roots()).map_err(|e| anyhow!(e))?;
    let node = Node::node_proxy(
        &["10.0.0.1".parse::<std::net::IpAddr>()?],
        "ringway-bench",
        gen::ROOT_NAMESPACE,
        "node-0",
        "cluster.local",
    );
    let config = ClientConfig::new(
        server.addr().to_string(),
        rustls_pki_types::ServerName::try_from(SERVER_NAME)?,
        tls,
        &files.token,
        gen::CLUSTER,
        node,
    );
    let max_message = config.max_message_bytes;
    let client = AdsClient::new(config)?;
    let status = Arc::new(XdsStatus::default());
    let (tx, rx) = mpsc::channel::<Published>();
    let st = status.clone();
    // The sink keeps the latest snapshot, as the proxy's `set_mesh` does:
    // the one it replaces is released on this thread (the bench's own
    // reference to it is gone by then).
    let mut latest: Option<Arc<Mesh>> = None;
    let mut state = MeshState::new(
        base,
        status.clone(),
        Box::new(move |mesh| {
            drop(latest.replace(mesh.clone()));
            let (at, cpu) = (Instant::now(), thread_cpu());
            let _ = tx.send(Published {
                at,
                cpu,
                mesh,
                synced: st.synced(),
            });
        }),
    );
    // As the proxy does: the settings with no entries, before connecting.
    state.publish();
    let _ = rx.recv();
    let marks = Arc::new(Mutex::new(Marks::default()));
    let mut handler = Timed {
        state,
        marks: marks.clone(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    progress(format!(
        "xDS: {} workloads, {} services, {} policies from the control plane",
        shape.workloads, shape.services, shape.policies
    ));
    let server_cpu0 = own_thread_cpu_seconds("xds-test-server");
    let t_start = Instant::now();
    let thread = std::thread::Builder::new()
        .name("ringway-xds".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the xDS runtime");
            rt.block_on(client.run(&mut handler, async {
                let _ = stopped.await;
            }));
        })?;
    let client_thread = ClientThread {
        stop: Some(stop),
        thread: Some(thread),
    };
    let deadline = Instant::now() + WAIT;
    let mut addresses_at = None;
    let synced = loop {
        let p = next_published(&rx, deadline)?;
        if addresses_at.is_none() && p.mesh.workload_count() + p.mesh.service_count() > 0 {
            addresses_at = Some(p.at);
        }
        if p.synced {
            break p;
        }
    };
    let server_cpu = own_thread_cpu_seconds("xds-test-server") - server_cpu0;
    check_counts(&synced.mesh, &shape)?;
    let (connected_at, connected_cpu) = marks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .connected
        .ok_or_else(|| anyhow!("synced without a stream open"))?;
    progress(format!(
        "  synced {:.1} ms after the stream opened; {} changes of each kind",
        ms(synced.at - connected_at),
        cfg.xds_updates
    ));

    // One change at a time, workloads and policies interleaved, each
    // waited for until published and ACKed (so the server is idle again).
    let (mut wl_ms, mut wl_cpu, mut pol_ms, mut pol_cpu) = (vec![], vec![], vec![], vec![]);
    let mut last_cpu = synced.cpu;
    let (synced_at, synced_cpu) = (synced.at, synced.cpu);
    let mut current = Some(synced.mesh);
    let mut tunnel: HashMap<usize, bool> = HashMap::new();
    let mut variant: HashMap<usize, u32> = HashMap::new();
    for k in 0..2 * cfg.xds_updates {
        let version = 2 + k as u64;
        let (url, resource, check): (_, _, Check) = if k % 2 == 0 {
            let i = (k / 2 * 7919 + 13) % shape.workloads;
            let on = !tunnel.get(&i).copied().unwrap_or(true);
            tunnel.insert(i, on);
            let uid = shape.workload_uid(i);
            (
                ADDRESS_TYPE_URL,
                shape.xds_workload(i, on, version),
                Box::new(move |m: &Mesh| m.workload_by_uid(&uid).is_some_and(|w| w.tunnel == on)),
            )
        } else {
            let j = (k / 2 * 389 + 7) % shape.policies;
            let v = 1 - variant.get(&j).copied().unwrap_or(0);
            variant.insert(j, v);
            let name = shape.policy_name(j);
            let before = current.as_ref().and_then(|m| m.policy(&name).cloned());
            (
                AUTHORIZATION_TYPE_URL,
                shape.xds_policy(j, v, version),
                Box::new(move |m: &Mesh| {
                    m.policy(&name).is_some() && m.policy(&name) != before.as_ref()
                }),
            )
        };
        // Released before the change, so that the client thread is the one
        // that lets the old snapshot go.
        drop(current.take());
        let t0 = Instant::now();
        let nonces = server.push(url, vec![resource], vec![]);
        let [nonce] = &nonces[..] else {
            bail!("a push reached {} streams, not one", nonces.len());
        };
        let p = published_when(&rx, check)?;
        let (lat, cpu) = (ms(p.at - t0), (p.cpu - last_cpu).as_secs_f64() * 1e6);
        last_cpu = p.cpu;
        current = Some(p.mesh);
        if k % 2 == 0 {
            wl_ms.push(lat);
            wl_cpu.push(cpu);
        } else {
            pol_ms.push(lat);
            pol_cpu.push(cpu);
        }
        let answer = server
            .wait_for_request(WAIT, |r| r.request.response_nonce == *nonce)
            .map_err(|e| anyhow!("the answer to {nonce}: {e}"))?;
        if answer.request.is_nack() {
            bail!("update {k} NACKed: {:?}", answer.nack_message());
        }
    }
    drop(client_thread);
    let nacks = server
        .requests()
        .iter()
        .filter(|r| r.request.is_nack())
        .count();
    let disconnects = marks
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .disconnects
        .clone();
    if !disconnects.is_empty() {
        notes.push(format!(
            "xDS: the stream ended {} time(s) during the measurement: {}",
            disconnects.len(),
            disconnects.join("; ")
        ));
    }

    let addresses = shape.xds_addresses();
    let address_bytes = message_bytes(&addresses, ADDRESS_TYPE_URL);
    let workload_bytes = message_bytes(&addresses[..shape.workloads], ADDRESS_TYPE_URL) as f64
        / shape.workloads.max(1) as f64;
    let policy_bytes = message_bytes(&shape.xds_policies(), AUTHORIZATION_TYPE_URL);
    Ok(XdsFigures {
        start_to_synced_ms: Num(ms(synced_at - t_start)),
        connected_to_synced_ms: Num(ms(synced_at - connected_at)),
        connected_to_addresses_ms: Num(addresses_at.map_or(f64::NAN, |a| ms(a - connected_at))),
        initial_cpu_ms: Num(ms(synced_cpu)),
        load_cpu_ms: Num(ms(synced_cpu.saturating_sub(connected_cpu))),
        server_cpu_initial_ms: Num(server_cpu * 1e3),
        workload: latency(wl_ms, wl_cpu),
        policy: latency(pol_ms, pol_cpu),
        address_message_bytes: Num(address_bytes as f64),
        policy_message_bytes: Num(policy_bytes as f64),
        max_message_bytes: Num(max_message as f64),
        workload_resource_bytes: Num(workload_bytes),
        workloads_at_limit: Num((max_message as f64 / address_bytes as f64
            * shape.workloads as f64)
            .floor()),
        nacks,
        disconnects: disconnects.len(),
    })
}

/// The fake API server over HTTP on 127.0.0.1, on a runtime thread of its
/// own, loaded with `objects`.
struct Api {
    api: FakeApiServer,
    addr: SocketAddr,
    // Last: dropping it ends the serving task and its connections.
    _rt: tokio::runtime::Runtime,
}

impl Api {
    fn start(objects: Vec<(Kind, serde_json::Value)>) -> anyhow::Result<Api> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-apiserver")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let api = FakeApiServer::serve_http(rt.handle(), listener)?;
        for (kind, obj) in objects {
            api.apply(kind, obj);
        }
        Ok(Api { api, addr, _rt: rt })
    }

    /// A kubeconfig pointing at it (for a proxy child).
    fn kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: proxy\n  user:\n    token: bench-node-proxy-token\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: proxy\ncurrent-context: fake\n",
                self.addr
            ),
        )?;
        Ok(())
    }
}

/// The cluster policy mapped from AuthorizationPolicy `ns/name`: its name
/// in the snapshot (`istio/<ns>/<name>`, in its namespace, or in the
/// file's root namespace for a mesh-wide one).
fn kube_policy_name(mesh: &Mesh, ns: &str, name: &str) -> Option<String> {
    let mapped = format!("istio/{ns}/{name}");
    mesh.policies()
        .find(|p| p.name == mapped)
        .map(|p| p.qualified_name().to_string())
}

/// `MeshWatch` in this process against `api` (loaded with `shape`).
fn run_kube(cfg: &ControlPlaneConfig, api: &Api) -> anyhow::Result<KubeFigures> {
    let shape = cfg.shape;
    let file = Arc::new(MeshConfig::load_str(
        "trustDomain: cluster.local\n",
        "control-plane bench",
        &NoEnv,
    )?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let url: http::Uri = format!("http://{}", api.addr).parse()?;
    // kube's client spawns its I/O on the runtime it is made in: the
    // watch's own, as the proxy makes it.
    let client = rt.block_on(async { kube::Client::try_from(kube::Config::new(url)) })?;
    let options = KubeOptions::default();
    let (tx, rx) = mpsc::channel::<Published>();
    progress(format!(
        "Kubernetes watch: {} pods, {} services and EndpointSlices, {} AuthorizationPolicies",
        shape.workloads, shape.services, shape.policies
    ));
    let server_cpu0 = own_thread_cpu_seconds("fake-apiserver");
    let t0 = Instant::now();
    let watch = MeshWatch::start(rt, client, file, options.clone(), move |mesh| {
        let (at, cpu) = (Instant::now(), thread_cpu());
        let _ = tx.send(Published {
            at,
            cpu,
            mesh,
            synced: true,
        });
    })?;
    let first = next_published(&rx, Instant::now() + WAIT)?;
    let server_cpu = own_thread_cpu_seconds("fake-apiserver") - server_cpu0;
    check_counts(&first.mesh, &shape)?;
    progress(format!(
        "  first snapshot {:.1} ms after the start; {} changes of each kind",
        ms(first.at - t0),
        cfg.kube_updates
    ));
    let (mut pod_ms, mut pod_cpu, mut pol_ms, mut pol_cpu) = (vec![], vec![], vec![], vec![]);
    let mut last_cpu = first.cpu;
    let (first_at, first_cpu) = (first.at, first.cpu);
    let mut current = Some(first.mesh);
    let mut opted_out: HashMap<usize, bool> = HashMap::new();
    let mut variant: HashMap<usize, u32> = HashMap::new();
    for k in 0..2 * cfg.kube_updates {
        let (kind, obj, check): (_, _, Check) = if k % 2 == 0 {
            let i = (k / 2 * 7919 + 13) % shape.workloads;
            let out = !opted_out.get(&i).copied().unwrap_or(false);
            opted_out.insert(i, out);
            let uid = shape.pod_uid(i);
            (
                Kind::Pod,
                shape.kube_pod(i, out),
                Box::new(move |m: &Mesh| m.workload_by_uid(&uid).is_some_and(|w| w.tunnel != out)),
            )
        } else {
            let j = (k / 2 * 389 + 7) % shape.policies;
            let v = 1 - variant.get(&j).copied().unwrap_or(0);
            variant.insert(j, v);
            let (ns, name, _) = shape.policy(j);
            let now = current.as_deref().ok_or_else(|| anyhow!("no snapshot"))?;
            let qualified = kube_policy_name(now, &ns, &name)
                .ok_or_else(|| anyhow!("policy {ns}/{name} is not in the snapshot"))?;
            let before = now.policy(&qualified).cloned();
            (
                Kind::AuthorizationPolicy,
                shape.kube_policy(j, v),
                Box::new(move |m: &Mesh| {
                    m.policy(&qualified).is_some() && m.policy(&qualified) != before.as_ref()
                }),
            )
        };
        // Released before the change (as above): the watch's thread lets
        // the old snapshot go.
        drop(current.take());
        let t0 = Instant::now();
        api.api.apply(kind, obj);
        let p = published_when(&rx, check)?;
        let (lat, cpu) = (ms(p.at - t0), (p.cpu - last_cpu).as_secs_f64() * 1e6);
        last_cpu = p.cpu;
        current = Some(p.mesh);
        if k % 2 == 0 {
            pod_ms.push(lat);
            pod_cpu.push(cpu);
        } else {
            pol_ms.push(lat);
            pol_cpu.push(cpu);
        }
    }
    watch.stop();
    Ok(KubeFigures {
        start_to_first_ms: Num(ms(first_at - t0)),
        initial_cpu_ms: Num(ms(first_cpu)),
        server_cpu_initial_ms: Num(server_cpu * 1e3),
        list_bytes: Num(shape
            .kube_objects()
            .iter()
            .map(|(_, o)| serde_json::to_vec(o).map_or(0, |v| v.len()))
            .sum::<usize>() as f64),
        debounce_ms: Num(ms(options.debounce)),
        pod: latency(pod_ms, pod_cpu),
        policy: latency(pol_ms, pol_cpu),
    })
}

/// `Duration`'s `Debug` text (`1.5s`, `812.3ms`, `15µs`, `7ns`) in ms.
pub fn parse_debug_duration_ms(s: &str) -> Option<f64> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().ok()?;
    Some(match unit {
        "s" => n * 1e3,
        "ms" => n,
        "µs" | "us" => n / 1e3,
        "ns" => n / 1e6,
        _ => return None,
    })
}

/// `line` without its terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The `waited=` of the proxy's first-snapshot line, ms. (`ProxyChild`
/// reports the line before it reaches the log tail: looked for during at
/// most 2 s.)
fn logged_wait_ms(child: &ProxyChild) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(2);
    let line = loop {
        let line = child
            .log_tail()
            .lines()
            .map(strip_ansi)
            .find(|l| l.contains(FIRST_SNAPSHOT_LINE));
        if line.is_some() || Instant::now() > deadline {
            break line;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    line.and_then(|l| {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix("waited=").map(str::to_owned))
    })
    .as_deref()
    .and_then(parse_debug_duration_ms)
    .unwrap_or_else(|| {
        progress(format!(
            "no `waited=` in the proxy's first-snapshot line; its log:\n{}",
            child.log_tail()
        ));
        f64::NAN
    })
}

/// CPU seconds of `child`'s threads named `prefix...`; NaN when it has
/// none (a wrapper's pid, say: never read as 0).
fn thread_cpu_seconds(child: &ProxyChild, prefix: &str) -> f64 {
    let has = std::fs::read_dir(format!("/proc/{}/task", child.pid))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|name| name.starts_with(prefix))
        });
    if has {
        child.thread_cpu_seconds(prefix)
    } else {
        f64::NAN
    }
}

/// VmHWM of `pid`, KiB.
fn proc_hwm_kib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

const CHILD_METRICS: &str = "127.0.0.1:15020";

/// The child's `/metrics` page (empty when it cannot be read).
fn child_metrics() -> String {
    CHILD_METRICS
        .parse()
        .ok()
        .and_then(|a| ringway_testbed::http::get(a, "/metrics").ok())
        .map(|r| r.body)
        .unwrap_or_default()
}

/// An unlabelled sample of `page`.
fn plain_sample(page: &str, metric: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// A `ringway proxy` child with `source_args`, started and waited for until
/// its first snapshot. `--zds-socket` names a socket nobody serves: the ZDS
/// thread is what waits for the first snapshot and logs it (then retries
/// the agent, harmlessly).
fn start_child(
    bin: &Path,
    files: &Files,
    source_args: &[String],
    env: &[(&str, String)],
) -> anyhow::Result<ProxyChild> {
    let mut cmd = Command::new(bin);
    cmd.arg("proxy")
        .args(source_args)
        .arg("--zds-socket")
        .arg(files.dir.join("no-agent.sock"))
        .args([
            "--readiness-addr",
            "127.0.0.1:15021",
            "--metrics-addr",
            CHILD_METRICS,
            "--admin-addr",
            "127.0.0.1:15000",
        ])
        .env_clear()
        .env("RINGWAY_LOG", "info,access=off")
        .env("RINGWAY_LOG_FORMAT", "text")
        .env("RINGWAY_DRAIN_PERIOD", "200ms")
        .envs(env.iter().map(|(k, v)| (k, v)));
    ProxyChild::spawn(cmd, Some(FIRST_SNAPSHOT_LINE), CHILD_WAIT)
}

/// What a child says once its first snapshot is in (after `settle`).
struct ChildState {
    rss_kib: f64,
    hwm_kib: f64,
    metrics_rss_kib: f64,
    metrics: String,
}

fn child_state(child: &ProxyChild, settle: Duration) -> ChildState {
    std::thread::sleep(settle);
    let metrics = child_metrics();
    ChildState {
        rss_kib: child.rss_kib(),
        hwm_kib: proc_hwm_kib(child.pid),
        metrics_rss_kib: plain_sample(&metrics, "process_resident_memory_bytes") / 1024.0,
        metrics,
    }
}

/// The mesh source's changes given to a loaded child.
enum ChildChanges<'a> {
    /// Pushes of workload changes; their ACKs timed.
    Xds(&'a XdsServer),
    /// Pod changes, each given `pause` to be rebuilt and published.
    Kube(&'a Api, Duration),
}

/// A child's extra environment.
type Env = Vec<(&'static str, String)>;

/// One proxy child measurement: the source, its thread, the command-line
/// arguments and environment of the empty and the loaded child, the
/// changes.
struct ChildSpec<'a> {
    source: &'static str,
    thread: &'static str,
    args: (Vec<String>, Vec<String>),
    env: (Env, Env),
    changes: ChildChanges<'a>,
}

/// The proxy child with one mesh source: empty, then loaded; RSS, its own
/// figures, and `cfg.child_updates` changes.
fn measure_child(
    cfg: &ControlPlaneConfig,
    bin: &Path,
    files: &Files,
    spec: ChildSpec<'_>,
) -> anyhow::Result<ChildFigures> {
    let ChildSpec {
        source,
        thread,
        args,
        env,
        changes,
    } = spec;
    let settle = Duration::from_millis(cfg.settle_ms);
    let shape = cfg.shape;
    progress(format!("proxy child, {source}: empty control plane"));
    let mut empty = start_child(bin, files, &args.0, &env.0)?;
    let e = child_state(&empty, settle);
    empty.stop();
    progress(format!("proxy child, {source}: the mesh loaded"));
    let mut child = start_child(bin, files, &args.1, &env.1)?;
    let spawn_to_first = child.startup;
    // Now, while the line is in the child's log tail (the ZDS thread's
    // retries push it out later).
    let logged = logged_wait_ms(&child);
    let thread_cpu = |child: &ProxyChild| thread_cpu_seconds(child, thread);
    let thread_cpu0 = thread_cpu(&child);
    let l = child_state(&child, settle);
    let mut ack_ms = Vec::new();
    let mut cpu_us = Vec::new();
    match changes {
        ChildChanges::Xds(server) => {
            for k in 0..cfg.child_updates {
                let i = (k * 104_729 + 31) % shape.workloads;
                let cpu0 = thread_cpu(&child);
                let t0 = Instant::now();
                let nonces = server.push(
                    ADDRESS_TYPE_URL,
                    vec![shape.xds_workload(i, k % 2 == 1, 10_000 + k as u64)],
                    vec![],
                );
                let [nonce] = &nonces[..] else {
                    bail!("a push reached {} streams, not one", nonces.len());
                };
                let answer = server
                    .wait_for_request(WAIT, |r| r.request.response_nonce == *nonce)
                    .map_err(|e| anyhow!("the child's answer to {nonce}: {e}"))?;
                ack_ms.push(ms(t0.elapsed()));
                if answer.request.is_nack() {
                    bail!("the child NACKed: {:?}", answer.nack_message());
                }
                std::thread::sleep(Duration::from_millis(2));
                cpu_us.push((thread_cpu(&child) - cpu0) * 1e6);
            }
        }
        ChildChanges::Kube(api, pause) => {
            for k in 0..cfg.child_updates {
                let i = (k * 104_729 + 31) % shape.workloads;
                let cpu0 = thread_cpu(&child);
                api.api.apply(Kind::Pod, shape.kube_pod(i, k % 2 == 0));
                std::thread::sleep(pause);
                cpu_us.push((thread_cpu(&child) - cpu0) * 1e6);
            }
        }
    }
    if !child.alive() {
        bail!("the {source} proxy child exited: {}", child.log_tail());
    }
    let (rss_end, hwm_end) = (child.rss_kib(), proc_hwm_kib(child.pid));
    child.stop();
    ack_ms.sort_by(f64::total_cmp);
    cpu_us.sort_by(f64::total_cmp);
    let resources = ringway_xds_resources(&l.metrics);
    let per = |loaded: f64, empty: f64| (loaded - empty) / shape.workloads.max(1) as f64;
    Ok(ChildFigures {
        source: source.into(),
        rss_empty_mib: Num(e.rss_kib / 1024.0),
        rss_loaded_mib: Num(l.rss_kib / 1024.0),
        kib_per_workload: Num(per(l.rss_kib, e.rss_kib)),
        hwm_loaded_mib: Num(l.hwm_kib / 1024.0),
        rss_end_mib: Num(rss_end / 1024.0),
        hwm_end_mib: Num(hwm_end / 1024.0),
        metrics_kib_per_workload: Num(per(l.metrics_rss_kib, e.metrics_rss_kib)),
        spawn_to_first_ms: Num(ms(spawn_to_first)),
        logged_wait_ms: Num(logged),
        thread_cpu_initial_ms: Num(thread_cpu0 * 1e3),
        updates: cfg.child_updates,
        thread_cpu_per_update_us: Num(pct(&cpu_us, 0.5)),
        thread_cpu_per_update_mean_us: Num(cpu_us.iter().sum::<f64>() / cpu_us.len().max(1) as f64),
        ack_p50_ms: Num(pct(&ack_ms, 0.5)),
        ack_p99_ms: Num(pct(&ack_ms, 0.99)),
        resources,
    })
}

fn ringway_xds_resources(page: &str) -> BTreeMap<String, Num> {
    crate::prom::samples(page, "ringway_xds_resources")
        .filter_map(|(labels, v)| Some((crate::prom::label(labels, "kind")?.to_owned(), Num(v))))
        .collect()
}

/// Runs the measurement (inside `ringway_testbed::run_isolated`): xDS and
/// the Kubernetes watch in this process, then the proxy children.
pub fn run(cfg: &ControlPlaneConfig, bin: &Path) -> anyhow::Result<ControlPlaneReport> {
    let t_run = Instant::now();
    let shape = cfg.shape;
    if shape.workloads == 0 || shape.services == 0 || shape.policies == 0 {
        bail!("nothing to measure: {shape:?}");
    }
    let scratch = crate::host::Scratch::new()?;
    let files = Files::new(&scratch.0)?;
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    let mut children = Vec::new();

    // ---- xDS ----
    let server = files.xds_server(shape.xds_addresses(), shape.xds_policies())?;
    let xds = run_xds(cfg, &files, &server, &mut notes)
        .map_err(|e| errors.push(format!("xDS client: {e:#}")))
        .ok();
    let yaml = files.dir.join("xds.yaml");
    std::fs::write(
        &yaml,
        format!(
            "trustDomain: cluster.local\nca:\n  certFile: {}\n  keyFile: {}\n",
            files.root.display(),
            files.dir.join("ca.key").display()
        ),
    )?;
    let xds_args = |addr: SocketAddr| -> Vec<String> {
        [
            "--config",
            &yaml.display().to_string(),
            "--mesh-source",
            "xds",
            "--xds-address",
            &addr.to_string(),
            "--xds-server-name",
            SERVER_NAME,
            "--xds-root-cert",
            &files.root.display().to_string(),
            "--xds-token-file",
            &files.token.display().to_string(),
            "--pod-name",
            "ringway-bench",
            "--pod-namespace",
            gen::ROOT_NAMESPACE,
            "--instance-ip",
            "10.0.0.1",
            "--xds-node-name",
            "node-0",
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let empty_server = files.xds_server(vec![], vec![])?;
    match measure_child(
        cfg,
        bin,
        &files,
        ChildSpec {
            source: "xds",
            thread: "ringway-xds",
            args: (xds_args(empty_server.addr()), xds_args(server.addr())),
            env: (vec![], vec![]),
            changes: ChildChanges::Xds(&server),
        },
    ) {
        Ok(c) => {
            let want = [
                ("workload", shape.workloads),
                ("service", shape.services),
                ("authorization", shape.policies),
            ];
            for (kind, n) in want {
                if c.resources.get(kind).and_then(|v| v.finite()) != Some(n as f64) {
                    errors.push(format!(
                        "the xDS proxy child reports {:?} for ringway_xds_resources{{kind=\"{kind}\"}}, not {n}",
                        c.resources.get(kind)
                    ));
                }
            }
            children.push(c);
        }
        Err(e) => errors.push(format!("xDS proxy child: {e:#}")),
    }
    drop(empty_server);
    drop(server);

    // ---- Kubernetes ----
    let api = Api::start(shape.kube_objects())?;
    let kube = run_kube(cfg, &api)
        .map_err(|e| errors.push(format!("Kubernetes watch: {e:#}")))
        .ok();
    let empty_api = Api::start(vec![])?;
    let (kc_empty, kc) = (
        files.dir.join("kubeconfig-empty"),
        files.dir.join("kubeconfig"),
    );
    empty_api.kubeconfig(&kc_empty)?;
    api.kubeconfig(&kc)?;
    let kube_yaml = files.dir.join("kube.yaml");
    std::fs::write(&kube_yaml, "trustDomain: cluster.local\n")?;
    let kube_args: Vec<String> = [
        "--config",
        &kube_yaml.display().to_string(),
        "--mesh-source",
        "kubernetes",
    ]
    .map(str::to_owned)
    .to_vec();
    // Time for a change to be rebuilt and published in the child: the
    // in-process p99 with room to spare.
    let pause = kube
        .as_ref()
        .and_then(|k| k.pod.p99_ms.finite())
        .map_or(Duration::from_secs(2), |p| {
            Duration::from_secs_f64((p * 2.0 / 1e3).max(0.4))
        });
    match measure_child(
        cfg,
        bin,
        &files,
        ChildSpec {
            source: "kubernetes",
            thread: "ringway-kube",
            args: (kube_args.clone(), kube_args),
            env: (
                vec![("KUBECONFIG", kc_empty.display().to_string())],
                vec![("KUBECONFIG", kc.display().to_string())],
            ),
            changes: ChildChanges::Kube(&api, pause),
        },
    ) {
        Ok(c) => children.push(c),
        Err(e) => errors.push(format!("Kubernetes proxy child: {e:#}")),
    }
    drop(empty_api);
    drop(api);

    notes.push(
        "Percentiles are nearest-rank: with fewer than 100 changes of a kind, p99 is the largest"
            .into(),
    );
    notes.push(format!(
        "Proxy children started with `--zds-socket` naming a socket nobody serves: their ZDS thread waits for the first snapshot and logs it (`{FIRST_SNAPSHOT_LINE}`, with the proxy's own `waited=`), then retries the agent harmlessly"
    ));
    Ok(ControlPlaneReport {
        config: cfg.clone(),
        proxy_bin: bin.display().to_string(),
        xds,
        kube,
        children,
        errors,
        notes,
        machine: crate::host::machine(),
        wall_seconds: t_run.elapsed().as_secs_f64(),
    })
}

fn f(v: Num, decimals: usize) -> String {
    v.finite()
        .map_or_else(|| "—".into(), |v| crate::stat::fmt(v, decimals))
}

/// Both percentiles, `p50 / p99`.
fn pair(l: &Latency, decimals: usize) -> String {
    format!("{} / {}", f(l.p50_ms, decimals), f(l.p99_ms, decimals))
}

/// The Markdown report.
pub fn render(r: &ControlPlaneReport) -> String {
    let s = &r.config.shape;
    let [g, n, sel] = s.scopes();
    let mut md = format!(
        "# Control plane at scale: xDS vs Kubernetes watch ({} run)\n\n\
         {} workloads, {} services (one VIP, 2 ports, {} endpoints each), {} policies \
         ({g} mesh-wide, {n} namespace, {sel} workload-selector; 2 rules each), {} namespaces. \
         xDS: delta ADS over TLS 1.3 + HTTP/2 from a test control plane on loopback, \
         {} changes of each kind; Kubernetes: the fake API server over HTTP on loopback, \
         {} changes of each kind. Proxy children: `{}`.\n\n",
        r.config.label,
        s.workloads,
        s.services,
        s.workloads / s.services.max(1),
        s.policies,
        s.namespaces(),
        r.config.xds_updates,
        r.config.kube_updates,
        r.proxy_bin,
    );
    let x = r.xds.as_ref();
    let k = r.kube.as_ref();
    let child = |src: &str| r.children.iter().find(|c| c.source == src);
    let (cx, ck) = (child("xds"), child("kubernetes"));
    let opt = |v: Option<String>| v.unwrap_or_else(|| "—".into());
    let rows: Vec<(String, String, String)> = vec![
        (
            "first complete snapshot (ms)".into(),
            opt(x.map(|x| {
                format!(
                    "{} from the stream's open (workloads and services: {}; {} from the client's start)",
                    f(x.connected_to_synced_ms, 1),
                    f(x.connected_to_addresses_ms, 1),
                    f(x.start_to_synced_ms, 1)
                )
            })),
            opt(k.map(|k| format!("{} from the watch's start", f(k.start_to_first_ms, 1)))),
        ),
        (
            "client thread CPU for it (ms)".into(),
            opt(x.map(|x| {
                format!(
                    "{} ({} from the stream's open)",
                    f(x.initial_cpu_ms, 1),
                    f(x.load_cpu_ms, 1)
                )
            })),
            opt(k.map(|k| f(k.initial_cpu_ms, 1))),
        ),
        (
            "the server's thread CPU meanwhile (ms; same 2 cores)".into(),
            opt(x.map(|x| format!("{} (test control plane: encoding, TLS)", f(x.server_cpu_initial_ms, 1)))),
            opt(k.map(|k| format!("{} (fake API server: JSON lists)", f(k.server_cpu_initial_ms, 1)))),
        ),
        (
            "one workload / pod changed -> published, p50 / p99 (ms)".into(),
            opt(x.map(|x| pair(&x.workload, 3))),
            opt(k.map(|k| {
                format!(
                    "{} (the debounce is {} ms)",
                    pair(&k.pod, 1),
                    f(k.debounce_ms, 0)
                )
            })),
        ),
        (
            "one policy changed -> published, p50 / p99 (ms)".into(),
            opt(x.map(|x| pair(&x.policy, 3))),
            opt(k.map(|k| pair(&k.policy, 1))),
        ),
        (
            "client thread CPU per workload / pod change, p50 (µs)".into(),
            opt(x.map(|x| f(x.workload.cpu_p50_us, 0))),
            opt(k.map(|k| f(k.pod.cpu_p50_us, 0))),
        ),
        (
            "client thread CPU per policy change, p50 (µs)".into(),
            opt(x.map(|x| f(x.policy.cpu_p50_us, 0))),
            opt(k.map(|k| f(k.policy.cpu_p50_us, 0))),
        ),
        (
            "proxy child RSS, empty -> loaded (MiB)".into(),
            opt(cx.map(|c| format!("{} -> {}", f(c.rss_empty_mib, 1), f(c.rss_loaded_mib, 1)))),
            opt(ck.map(|c| format!("{} -> {}", f(c.rss_empty_mib, 1), f(c.rss_loaded_mib, 1)))),
        ),
        (
            "**proxy child RSS per workload (KiB)**".into(),
            opt(cx.map(|c| format!("**{}**", f(c.kib_per_workload, 2)))),
            opt(ck.map(|c| format!("**{}**", f(c.kib_per_workload, 2)))),
        ),
        (
            "proxy child peak RSS, loaded (VmHWM, MiB)".into(),
            opt(cx.map(|c| f(c.hwm_loaded_mib, 1))),
            opt(ck.map(|c| f(c.hwm_loaded_mib, 1))),
        ),
        (
            "proxy child RSS / peak RSS after its changes (MiB)".into(),
            opt(cx.map(|c| {
                format!(
                    "{} / {} ({} workload changes)",
                    f(c.rss_end_mib, 1),
                    f(c.hwm_end_mib, 1),
                    c.updates
                )
            })),
            opt(ck.map(|c| {
                format!(
                    "{} / {} ({} pod changes)",
                    f(c.rss_end_mib, 1),
                    f(c.hwm_end_mib, 1),
                    c.updates
                )
            })),
        ),
        (
            "largest message (first response of workloads and services)".into(),
            opt(x.map(|x| {
                format!(
                    "{} MiB of the client's {} MiB limit ({} B per workload: the limit is reached near {} workloads); policies {} KiB",
                    f(Num(x.address_message_bytes.0 / 1048576.0), 2),
                    f(Num(x.max_message_bytes.0 / 1048576.0), 0),
                    f(x.workload_resource_bytes, 0),
                    f(x.workloads_at_limit, 0),
                    f(Num(x.policy_message_bytes.0 / 1024.0), 0)
                )
            })),
            opt(k.map(|k| {
                format!(
                    "— (no limit: lists of {} MiB of JSON in all, over HTTP)",
                    f(Num(k.list_bytes.0 / 1048576.0), 1)
                )
            })),
        ),
    ];
    md.push_str("| figure | xDS (delta ADS, applied incrementally) | Kubernetes watch (the mesh rebuilt per change) |\n| --- | --- | --- |\n");
    for (a, b, c) in &rows {
        md.push_str(&format!("| {a} | {b} | {c} |\n"));
    }
    md.push_str(
        "\nCross-check: the real proxy (`ringway proxy --mesh-source xds|kubernetes`) as a child process against the same servers.\n\n\
         | cross-check | xDS | Kubernetes |\n| --- | --- | --- |\n",
    );
    let crow = |name: &str, get: &dyn Fn(&ChildFigures) -> String| {
        format!("| {name} | {} | {} |\n", opt(cx.map(get)), opt(ck.map(get)))
    };
    md.push_str(&crow(
        "spawn -> first snapshot, bench's clock / the proxy's own `waited=` (ms)",
        &|c| format!("{} / {}", f(c.spawn_to_first_ms, 1), f(c.logged_wait_ms, 1)),
    ));
    md.push_str(&crow(
        "mesh thread CPU to the first snapshot (`/proc` schedstat, ms)",
        &|c| f(c.thread_cpu_initial_ms, 1),
    ));
    md.push_str(&crow(
        "mesh thread CPU per change, p50 / mean (µs; xDS: a workload, Kubernetes: a pod)",
        &|c| {
            format!(
                "{} / {} ({} changes)",
                f(c.thread_cpu_per_update_us, 0),
                f(c.thread_cpu_per_update_mean_us, 0),
                c.updates
            )
        },
    ));
    md.push_str(&crow(
        "push -> ACK at the control plane, p50 / p99 (ms)",
        &|c| {
            if c.source == "xds" {
                format!("{} / {}", f(c.ack_p50_ms, 3), f(c.ack_p99_ms, 3))
            } else {
                "— (no acknowledgement)".into()
            }
        },
    ));
    md.push_str(&crow(
        "RSS per workload from the proxy's own `process_resident_memory_bytes` (KiB)",
        &|c| f(c.metrics_kib_per_workload, 2),
    ));
    md.push_str(&crow(
        "resources the proxy reports (`ringway_xds_resources`)",
        &|c| {
            if c.resources.is_empty() {
                "—".into()
            } else {
                c.resources
                    .iter()
                    .map(|(k, v)| format!("{k} {}", f(*v, 0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        },
    ));
    if !r.notes.is_empty() {
        md.push_str("\nNotes:\n\n");
        for n in &r.notes {
            md.push_str(&format!("- {n}\n"));
        }
    }
    if !r.errors.is_empty() {
        md.push_str("\n**Failed:**\n\n");
        for e in &r.errors {
            md.push_str(&format!("- {e}\n"));
        }
    }
    md.push_str(&format!(
        "\nMachine: {}. Wall time {:.0} s.\n",
        r.machine
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.wall_seconds
    ));
    md
}

/// What makes the report incomplete or inconsistent (never the numbers).
pub fn check(r: &ControlPlaneReport) -> Vec<String> {
    fn need(p: &mut Vec<String>, what: &str, v: Num) {
        if v.finite().is_none() {
            p.push(format!("{what} is not finite"));
        }
    }
    fn lat(p: &mut Vec<String>, what: &str, l: &Latency, want: usize) {
        need(p, &format!("{what} p50"), l.p50_ms);
        need(p, &format!("{what} p99"), l.p99_ms);
        need(p, &format!("{what} CPU p50"), l.cpu_p50_us);
        if l.count != want {
            p.push(format!(
                "{what}: {} changes measured, {want} asked",
                l.count
            ));
        }
        if l.p50_ms.0 > l.p99_ms.0 || l.p99_ms.0 > l.max_ms.0 {
            p.push(format!("{what}: percentiles out of order"));
        }
    }
    let mut p: Vec<String> = r.errors.iter().map(|e| format!("failed: {e}")).collect();
    match &r.xds {
        None => p.push("no xDS figures".into()),
        Some(x) => {
            need(&mut p, "xDS time to synced", x.connected_to_synced_ms);
            need(&mut p, "xDS initial CPU", x.initial_cpu_ms);
            need(&mut p, "xDS message size", x.address_message_bytes);
            lat(
                &mut p,
                "xDS workload change",
                &x.workload,
                r.config.xds_updates,
            );
            lat(&mut p, "xDS policy change", &x.policy, r.config.xds_updates);
            if x.nacks > 0 {
                p.push(format!(
                    "xDS: {} NACKs (every generated resource is valid)",
                    x.nacks
                ));
            }
        }
    }
    match &r.kube {
        None => p.push("no Kubernetes figures".into()),
        Some(k) => {
            need(
                &mut p,
                "Kubernetes time to first snapshot",
                k.start_to_first_ms,
            );
            need(&mut p, "Kubernetes initial CPU", k.initial_cpu_ms);
            lat(
                &mut p,
                "Kubernetes pod change",
                &k.pod,
                r.config.kube_updates,
            );
            lat(
                &mut p,
                "Kubernetes policy change",
                &k.policy,
                r.config.kube_updates,
            );
        }
    }
    for src in ["xds", "kubernetes"] {
        match r.children.iter().find(|c| c.source == src) {
            None => p.push(format!("no {src} proxy child figures")),
            Some(c) => {
                need(
                    &mut p,
                    &format!("{src} child RSS per workload"),
                    c.kib_per_workload,
                );
                need(
                    &mut p,
                    &format!("{src} child logged wait"),
                    c.logged_wait_ms,
                );
                need(
                    &mut p,
                    &format!("{src} child thread CPU"),
                    c.thread_cpu_initial_ms,
                );
                need(
                    &mut p,
                    &format!("{src} child thread CPU per change"),
                    c.thread_cpu_per_update_us,
                );
                need(
                    &mut p,
                    &format!("{src} child peak RSS at the end"),
                    c.hwm_end_mib,
                );
            }
        }
    }
    p
}

/// Writes `control_plane.json` and `control_plane.md` to `out`; returns the
/// Markdown.
pub fn write(out: &Path, r: &ControlPlaneReport) -> anyhow::Result<String> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(
        out.join("control_plane.json"),
        serde_json::to_string_pretty(r)?,
    )?;
    let md = render(r);
    std::fs::write(out.join("control_plane.md"), &md)?;
    Ok(md)
}
