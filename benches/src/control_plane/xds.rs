//! The xDS client in the bench process, as the proxy runs it (`AdsClient`
//! and `MeshState` on a `ringway-xds` thread): time and CPU to the first
//! complete snapshot, then one pushed change (a workload, a policy) to its
//! snapshot; the first responses' encoded size against the client's limit.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use prost::Message;
use ringway_config::{Mesh, MeshConfig, NoEnv};
use ringway_xds::state::{MeshState, XdsStatus};
use ringway_xds::testing::XdsServer;
use ringway_xds::{
    AdsClient, ClientConfig, DeltaDiscoveryResponse, Event, Handler, Nack, Node, Resource,
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};

use super::config::{progress, ControlPlaneConfig, SERVER_NAME, WAIT};
use super::gen;
use super::report::{Latency, XdsFigures};
use super::servers::Files;
use super::timing::{
    check_counts, ms, next_published, own_thread_cpu_seconds, published_when, thread_cpu, Check,
    Published,
};
use crate::stat::Num;

/// The client's handler as the proxy's: [`MeshState`], with the stream's
/// open and end marked.
pub(super) struct Timed {
    state: MeshState,
    marks: Arc<Mutex<Marks>>,
}

#[derive(Default)]
pub(super) struct Marks {
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
pub(super) struct ClientThread {
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

/// The encoded size of a response carrying `resources`.
pub(super) fn message_bytes(resources: &[Resource], type_url: &str) -> usize {
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
pub(super) fn run_xds(
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
        workload: Latency::of(wl_ms, wl_cpu),
        policy: Latency::of(pol_ms, pol_cpu),
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
