//! The real proxy as a child process with one mesh source: its RSS with
//! the mesh loaded against an empty control plane's, its own account of
//! the first snapshot (`waited=`, its mesh thread's CPU, its metrics), and
//! the changes given to it (xDS: push -> ACK).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use ringway_testbed::kube_api::Kind;
use ringway_testbed::prom::Metrics;
use ringway_xds::testing::XdsServer;
use ringway_xds::ADDRESS_TYPE_URL;

use super::config::{progress, ControlPlaneConfig, CHILD_WAIT, FIRST_SNAPSHOT_LINE, WAIT};
use super::report::ChildFigures;
use super::servers::{Api, Files};
use super::timing::ms;
use crate::child::ProxyChild;
use crate::stat::{nearest_rank, Num};

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
pub(super) fn strip_ansi(line: &str) -> String {
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
pub(super) fn logged_wait_ms(child: &ProxyChild) -> f64 {
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
pub(super) fn thread_cpu_seconds(child: &ProxyChild, prefix: &str) -> f64 {
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
pub(super) fn proc_hwm_kib(pid: u32) -> f64 {
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

pub(super) const CHILD_METRICS: &str = "127.0.0.1:15020";

/// The child's `/metrics` page: an error naming the endpoint when it cannot
/// be read.
pub(super) fn child_metrics() -> anyhow::Result<Metrics> {
    crate::bed::scrape(CHILD_METRICS.parse()?)
}

/// A `ringway proxy` child with `source_args`, started and waited for until
/// its first snapshot. `--zds-socket` names a socket nobody serves: the ZDS
/// thread is what waits for the first snapshot and logs it (then retries
/// the agent, harmlessly).
pub(super) fn start_child(
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
pub(super) struct ChildState {
    pub(super) rss_kib: f64,
    pub(super) hwm_kib: f64,
    pub(super) metrics_rss_kib: f64,
    pub(super) metrics: Metrics,
}

pub(super) fn child_state(child: &ProxyChild, settle: Duration) -> anyhow::Result<ChildState> {
    std::thread::sleep(settle);
    let metrics = child_metrics()
        .with_context(|| format!("the proxy child's metrics; its log: {}", child.log_tail()))?;
    Ok(ChildState {
        rss_kib: child.rss_kib(),
        hwm_kib: proc_hwm_kib(child.pid),
        metrics_rss_kib: metrics
            .get("process_resident_memory_bytes", &[])
            .unwrap_or(f64::NAN)
            / 1024.0,
        metrics,
    })
}

/// The mesh source's changes given to a loaded child.
pub(super) enum ChildChanges<'a> {
    /// Pushes of workload changes; their ACKs timed.
    Xds(&'a XdsServer),
    /// Pod changes, each given `pause` to be rebuilt and published.
    Kube(&'a Api, Duration),
}

/// A child's extra environment.
pub(super) type Env = Vec<(&'static str, String)>;

/// One proxy child measurement: the source, its thread, the command-line
/// arguments and environment of the empty and the loaded child, the
/// changes.
pub(super) struct ChildSpec<'a> {
    pub(super) source: &'static str,
    pub(super) thread: &'static str,
    pub(super) args: (Vec<String>, Vec<String>),
    pub(super) env: (Env, Env),
    pub(super) changes: ChildChanges<'a>,
}

/// The proxy child with one mesh source: empty, then loaded; RSS, its own
/// figures, and `cfg.child_updates` changes.
pub(super) fn measure_child(
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
    let e = child_state(&empty, settle)?;
    empty.stop();
    progress(format!("proxy child, {source}: the mesh loaded"));
    let mut child = start_child(bin, files, &args.1, &env.1)?;
    let spawn_to_first = child.startup;
    // Now, while the line is in the child's log tail (the ZDS thread's
    // retries push it out later).
    let logged = logged_wait_ms(&child);
    let thread_cpu = |child: &ProxyChild| thread_cpu_seconds(child, thread);
    let thread_cpu0 = thread_cpu(&child);
    let l = child_state(&child, settle)?;
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
        thread_cpu_per_update_us: Num(nearest_rank(&cpu_us, 0.5)),
        thread_cpu_per_update_mean_us: Num(cpu_us.iter().sum::<f64>() / cpu_us.len().max(1) as f64),
        ack_p50_ms: Num(nearest_rank(&ack_ms, 0.5)),
        ack_p99_ms: Num(nearest_rank(&ack_ms, 0.99)),
        resources,
    })
}

pub(super) fn ringway_xds_resources(page: &Metrics) -> BTreeMap<String, Num> {
    page.matching("ringway_xds_resources", &[])
        .filter_map(|s| Some((s.label("kind")?.to_owned(), Num(s.value))))
        .collect()
}
