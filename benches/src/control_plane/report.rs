//! The `--control-plane` report: its typed document
//! (`control_plane.json`: the xDS client, the Kubernetes watch and the proxy
//! children, each a struct of figures), the Markdown, and the check that
//! every figure is there. Never judges the numbers.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::config::ControlPlaneConfig;
use crate::stat::{nearest_rank, Num};

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

impl Latency {
    /// The figures of changes that took `ms` each and cost `cpu_us`.
    pub fn of(mut ms: Vec<f64>, mut cpu_us: Vec<f64>) -> Latency {
        ms.sort_by(f64::total_cmp);
        cpu_us.sort_by(f64::total_cmp);
        let mean = if cpu_us.is_empty() {
            f64::NAN
        } else {
            cpu_us.iter().sum::<f64>() / cpu_us.len() as f64
        };
        Latency {
            count: ms.len(),
            p50_ms: Num(nearest_rank(&ms, 0.5)),
            p90_ms: Num(nearest_rank(&ms, 0.9)),
            p99_ms: Num(nearest_rank(&ms, 0.99)),
            max_ms: Num(ms.last().copied().unwrap_or(f64::NAN)),
            cpu_p50_us: Num(nearest_rank(&cpu_us, 0.5)),
            cpu_mean_us: Num(mean),
        }
    }
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
