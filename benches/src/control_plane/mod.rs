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
//!
//! In layers: [`config`] and [`gen`] (the mesh) at the bottom; `timing`
//! (published snapshots) and `servers` (the test control plane, the fake
//! API server) above them; the measurements `xds`, `kube` and `child`;
//! [`report`] (the document, its Markdown and check); [`run`] on top.

mod child;
pub mod config;
pub mod gen;
mod kube;
pub mod report;
mod servers;
mod timing;
mod xds;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

pub use self::child::parse_debug_duration_ms;
use self::child::{measure_child, ChildChanges, ChildSpec};
pub use self::config::ControlPlaneConfig;
use self::config::{FIRST_SNAPSHOT_LINE, SERVER_NAME};
pub use self::gen::Shape;
use self::kube::run_kube;
pub use self::report::{
    check, render, write, ChildFigures, ControlPlaneReport, KubeFigures, Latency, XdsFigures,
};
use self::servers::{Api, Files};
use self::xds::run_xds;

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
