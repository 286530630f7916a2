//! The Kubernetes watch in the bench process, as the proxy runs it
//! (`MeshWatch` on its `ringway-kube` thread) against the fake API server:
//! time and CPU to the first snapshot, then one changed object (a pod, a
//! policy) to the snapshot that has it.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use anyhow::anyhow;
use ringway_config::kube::{KubeOptions, MeshWatch};
use ringway_config::{Mesh, MeshConfig, NoEnv};
use ringway_testbed::kube_api::Kind;

use super::config::{progress, ControlPlaneConfig, WAIT};
use super::report::{KubeFigures, Latency};
use super::servers::Api;
use super::timing::{
    check_counts, ms, next_published, own_thread_cpu_seconds, published_when, thread_cpu, Check,
    Published,
};
use crate::stat::Num;

/// The cluster policy mapped from AuthorizationPolicy `ns/name`: its name
/// in the snapshot (`istio/<ns>/<name>`, in its namespace, or in the
/// file's root namespace for a mesh-wide one).
pub(super) fn kube_policy_name(mesh: &Mesh, ns: &str, name: &str) -> Option<String> {
    let mapped = format!("istio/{ns}/{name}");
    mesh.policies()
        .find(|p| p.name == mapped)
        .map(|p| p.qualified_name().to_string())
}

/// `MeshWatch` in this process against `api` (loaded with `shape`).
pub(super) fn run_kube(cfg: &ControlPlaneConfig, api: &Api) -> anyhow::Result<KubeFigures> {
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
        pod: Latency::of(pod_ms, pod_cpu),
        policy: Latency::of(pol_ms, pol_cpu),
    })
}
