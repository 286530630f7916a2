//! Profiles: one measurement alone for a while, with `perf stat` counting
//! the proxy's syscalls, io_uring operations and context switches, and
//! `perf record -a -g` beside it when asked: the connection-rate loop, one
//! HBONE stream (or its round trip, or its idle memory), a 64 B ping-pong,
//! or CNI ADDs one after another. Not part of the suite's report: each
//! prints a summary line (`cargo bench -p ringway-benches --
//! --profile-...`, see benches/README.md). Beside the measurements, on the bed.

use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_testbed::ns::Netns;

use crate::bed::{self, Bed, PORT_BASE};
use crate::config::Config;
use crate::figures::Figures;
use crate::host::{cpus, machine_busy_seconds, progress};
use crate::load;
use crate::measure::churn;
use crate::netstat::tcp_counters;
use crate::scenario::scenarios;
use crate::tools::{self, Tools};

/// What `profile` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The connection-rate loop through the default scenario (TPROXY fast path).
    ConnRate,
    /// One stream through HBONE on one node.
    HboneStream,
    /// `churn_pods` CNI ADDs one after another (plugin, agent, ZDS, proxy).
    CniAdd,
    /// 64 B closed-loop ping-pong through `RINGWAY_BENCH_PROFILE_SCENARIO`
    /// (default `tproxy_2hop`), with the proxy's syscalls, io_uring
    /// submissions and completions, context switches and wake-ups counted
    /// per message by `perf stat` (tracepoints, no PMU needed).
    Latency,
}

fn start_perf(out: Option<&FsPath>, secs: f64) -> anyhow::Result<Option<std::process::Child>> {
    let Some(out) = out else {
        return Ok(None);
    };
    let mut cmd = std::process::Command::new("perf");
    cmd.args(["record", "-a", "-g", "-o"])
        .arg(out)
        .args(["--", "sleep"])
        .arg(format!("{secs}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    Ok(Some(cmd.spawn().context("starting perf record")?))
}

/// Tracepoints `perf stat` counts on the proxy in the latency profile.
const STAT_EVENTS: &[&str] = &[
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_splice",
    "syscalls:sys_enter_io_uring_enter",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_epoll_pwait",
    "syscalls:sys_enter_epoll_ctl",
    "syscalls:sys_enter_read",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_recvfrom",
    "syscalls:sys_enter_sendto",
    "syscalls:sys_enter_readv",
    "syscalls:sys_enter_writev",
    "syscalls:sys_enter_recvmsg",
    "syscalls:sys_enter_sendmsg",
    "syscalls:sys_enter_futex",
    "syscalls:sys_enter_sched_yield",
    "io_uring:io_uring_submit_req",
    "io_uring:io_uring_complete",
    "io_uring:io_uring_poll_arm",
    "io_uring:io_uring_task_add",
    "io_uring:io_uring_task_work_run",
    "sched:sched_switch",
    "sched:sched_wakeup",
];

/// Tracepoints `perf stat` counts on the proxy in the connection-rate
/// profile: the syscalls a proxied connection costs, one by one.
const CONN_STAT_EVENTS: &[&str] = &[
    "raw_syscalls:sys_enter",
    "syscalls:sys_enter_socket",
    "syscalls:sys_enter_setns",
    "syscalls:sys_enter_setsockopt",
    "syscalls:sys_enter_getsockopt",
    "syscalls:sys_enter_bind",
    "syscalls:sys_enter_connect",
    "syscalls:sys_enter_getsockname",
    "syscalls:sys_enter_getpeername",
    "syscalls:sys_enter_fcntl",
    "syscalls:sys_enter_shutdown",
    "syscalls:sys_enter_close",
    "syscalls:sys_enter_splice",
    "syscalls:sys_enter_pipe2",
    "syscalls:sys_enter_epoll_ctl",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_io_uring_enter",
    "syscalls:sys_enter_read",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_futex",
    "syscalls:sys_enter_mmap",
    "syscalls:sys_enter_munmap",
    "syscalls:sys_enter_madvise",
    "syscalls:sys_enter_brk",
    "io_uring:io_uring_submit_req",
    "io_uring:io_uring_complete",
    "sched:sched_switch",
];

fn perf_stat_start(pid: u32) -> anyhow::Result<(std::process::Child, PathBuf)> {
    perf_stat_events(pid, STAT_EVENTS)
}

/// RINGWAY_BENCH_PROFILE_LOAD=wrk: the connection-rate profile runs wrk
/// against nginx (the cross-check's pair) instead of the bundled generator.
fn wrk_load() -> bool {
    std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("wrk")
}

/// wrk against nginx on `path` for `dur` (whole seconds): the rate, and
/// wrk's report with its latency percentiles.
fn wrk_conn_rate(
    bed: &Bed,
    path: &load::Path,
    dur: Duration,
) -> anyhow::Result<(load::ConnRate, String)> {
    let tools = Tools::find();
    let (Some(w), Some(n)) = (tools.get("wrk"), tools.get("nginx")) else {
        bail!("RINGWAY_BENCH_PROFILE_LOAD=wrk needs wrk and nginx installed");
    };
    let (rps, out) = tools::wrk_with_output(
        w,
        n,
        &bed.scratch.0,
        &path.on_port(PORT_BASE + 2),
        dur.as_secs_f64(),
    )?;
    // wrk runs whole seconds and reports its own rate over them.
    let run = dur.as_secs_f64().ceil().max(1.0);
    Ok((
        load::ConnRate {
            conns: (rps * run) as u64,
            failures: tools::wrk_socket_errors(&out),
            secs: run,
            first_error: None,
        },
        out,
    ))
}

fn perf_stat_events(pid: u32, events: &[&str]) -> anyhow::Result<(std::process::Child, PathBuf)> {
    let out = std::env::temp_dir().join(format!("ringway-perf-stat-{}.csv", std::process::id()));
    let mut cmd = std::process::Command::new("perf");
    cmd.args(["stat", "-x", ",", "-o"])
        .arg(&out)
        .arg("-p")
        .arg(pid.to_string());
    for e in events {
        cmd.arg("-e").arg(e);
    }
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    let child = cmd.spawn().context("starting perf stat")?;
    // perf attaches in a few ms; give it a bounded head start.
    std::thread::sleep(Duration::from_millis(300));
    Ok((child, out))
}

/// Stops `perf stat` (SIGINT, by its pid) and reads its counts.
fn perf_stat_finish(
    (mut child, out): (std::process::Child, PathBuf),
) -> anyhow::Result<Vec<(String, f64)>> {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("perf stat did not stop on SIGINT within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&out).context("perf stat output")?;
    let _ = std::fs::remove_file(&out);
    Ok(text
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split(',').collect();
            (c.len() > 2).then(|| (c[2].to_string(), c[0].parse::<f64>().unwrap_or(0.0)))
        })
        .collect())
}

/// One measurement alone for `secs`, with `perf record -a -g` running beside
/// it when `perf_out` is given (the proxy's pid is printed for `perf report
/// --pid`; its workers are named `ringway-wk-N`). Returns a summary line.
pub fn profile(
    config: &Config,
    what: Profile,
    secs: f64,
    perf_out: Option<&FsPath>,
) -> anyhow::Result<String> {
    let bed = Bed::build()?;
    if what == Profile::CniAdd {
        let pods = (0..config.churn_pods)
            .map(|i| Netns::create(&format!("churn-{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        progress(format!(
            "profile: {} CNI ADDs (perf for {secs} s)",
            pods.len()
        ));
        let mut perf = start_perf(perf_out, secs)?;
        std::thread::sleep(Duration::from_millis(300));
        let mut f = Figures::new();
        churn::cni(config, &bed.scratch.0, 0, &pods, &mut f)?;
        if let Some(p) = perf.as_mut() {
            let _ = p.wait();
        }
        return Ok(f.summary());
    }
    let all = scenarios(false);
    let chosen = |default: &str| -> anyhow::Result<&'static str> {
        let k = std::env::var("RINGWAY_BENCH_PROFILE_SCENARIO").unwrap_or_else(|_| default.into());
        Ok(all
            .iter()
            .find(|s| s.key == k && !s.two_nodes)
            .with_context(|| format!("no one-node scenario {k}"))?
            .key)
    };
    let key = match what {
        Profile::ConnRate => chosen("tproxy_fast")?,
        Profile::HboneStream => "hbone_1node",
        Profile::CniAdd => unreachable!("measured above"),
        Profile::Latency => chosen("tproxy_2hop")?,
    };
    let sc = all.iter().find(|s| s.key == key).expect("scenario");
    let (path, proxies) = bed::start(config, &bed, sc)?;
    // What is measured: the profile's time less the warm-up's share.
    let dur = Duration::from_secs_f64((secs - 0.6).max(0.5));
    if proxies.0.is_empty() && what == Profile::ConnRate && wrk_load() {
        // The baseline for the wrk load: no proxy to profile; the same
        // measured time as through a proxy.
        let (m0, t) = (machine_busy_seconds(), Instant::now());
        let (cr, out) = wrk_conn_rate(&bed, &path, dur)?;
        let m1 = machine_busy_seconds();
        return Ok(format!(
            "{} connections in {:.1} s through {key}: {:.0} conn/s, {} failed; machine busy {:.1} of {:.1} CPU-s\nwrk's report:\n{out}",
            cr.conns,
            cr.secs,
            cr.conns as f64 / cr.secs,
            cr.failures,
            m1 - m0,
            t.elapsed().as_secs_f64() * cpus() as f64,
        ));
    }
    let proxy = proxies
        .0
        .first()
        .with_context(|| format!("{key} runs no proxy to profile"))?;
    progress(format!(
        "profile: {what:?} through {} for {secs} s; proxy pid {}",
        sc.name, proxy.pid
    ));
    // Warm up (pipe pool, metrics series, the HBONE pool) before recording.
    load::conn_rate(
        &path.on_port(PORT_BASE + 1),
        config.conn_threads,
        Duration::from_millis(500),
        2_000,
    )?;
    let mut perf = start_perf(perf_out, secs)?;
    std::thread::sleep(Duration::from_millis(300));
    let c0 = proxy.cpu_seconds();
    let line = match what {
        Profile::ConnRate => {
            // Syscalls per connection, counted on the proxy alone.
            let stat = perf_stat_events(proxy.pid, CONN_STAT_EVENTS)?;
            let (m0, b0) = (machine_busy_seconds(), bench_cpu_seconds());
            let (sc0, ss0) = (tcp_counters(&path.client), tcp_counters(&path.server));
            let t0 = threads(proxy.pid);
            // RINGWAY_BENCH_PROFILE_LOAD=wrk: wrk against nginx (the
            // cross-check's pair) instead of the bundled generator, with
            // wrk's latency percentiles.
            let mut wrk_report = None;
            let cr = if wrk_load() {
                let (cr, out) = wrk_conn_rate(&bed, &path, dur)?;
                wrk_report = Some(out);
                cr
            } else {
                load::conn_rate(
                    &path.on_port(PORT_BASE + 2),
                    config.conn_threads,
                    dur,
                    (secs * 100_000.0) as u64,
                )?
            };
            let c1 = proxy.cpu_seconds();
            let (m1, b1) = (machine_busy_seconds(), bench_cpu_seconds());
            let (sc1, ss1) = (tcp_counters(&path.client), tcp_counters(&path.server));
            let t1 = threads(proxy.pid);
            let counts = perf_stat_finish(stat)?;
            let per = |s: f64| s / cr.conns as f64 * 1e6;
            let cpus = cpus() as f64;
            let mut line = format!(
                "{} connections in {:.1} s through {key}: {:.0} conn/s, {} failed; proxy {:.1} CPU-µs per connection\n\
                 machine busy {:.1} of {:.1} CPU-s ({:.1} CPU-µs per connection): proxy {:.0}%, load generator + server (this process) {:.1} CPU-µs per connection = {:.0}%, the rest (other processes, softirq threads) {:.0}%",
                cr.conns,
                cr.secs,
                cr.conns as f64 / cr.secs,
                cr.failures,
                per(c1 - c0),
                m1 - m0,
                cr.secs * cpus,
                per(m1 - m0),
                (c1 - c0) / (m1 - m0) * 100.0,
                per(b1 - b0),
                (b1 - b0) / (m1 - m0) * 100.0,
                (1.0 - (c1 - c0 + b1 - b0) / (m1 - m0)) * 100.0,
            );
            line.push_str("\nper connection, proxy process only (perf stat; the warm-up and the stat's start and end are outside the count):");
            for (ev, n) in &counts {
                if *n > 0.0 {
                    line.push_str(&format!("\n  {:>8.2}  {ev}", n / cr.conns as f64));
                }
            }
            line.push_str(&format!(
                "\nper connection, TCP counters of the client pod's netns | the server pod's (every socket in each: app, proxy, tunnel end):{}",
                counter_deltas(&sc0, &sc1, &ss0, &ss1, cr.conns.max(1))
            ));
            line.push_str(&per_thread(&t0, &t1, cr.conns.max(1), "connection"));
            if let Some(out) = wrk_report {
                line.push_str("\nwrk's report:\n");
                line.push_str(&out);
            }
            line
        }
        Profile::CniAdd => unreachable!("measured above"),
        Profile::Latency => {
            let msgs = (secs * 5_000.0) as u64;
            let t0 = threads(proxy.pid);
            // The sockets' and netns' TCP counters from a quarter to three
            // quarters of the run (the ping-pong's own sockets exist only
            // while it runs); its round trips in that window are its client
            // socket's bytes sent / 64.
            let window = {
                let (c, s) = (path.client.clone(), path.server.clone());
                std::thread::spawn(move || {
                    let snap = || {
                        (
                            tcp_counters(&c),
                            tcp_counters(&s),
                            tcp_sockets(&c),
                            tcp_sockets(&s),
                        )
                    };
                    std::thread::sleep(dur / 4);
                    let a = snap();
                    std::thread::sleep(dur / 2);
                    (a, snap())
                })
            };
            let stat = perf_stat_start(proxy.pid)?;
            let l = load::ping_pong(&path.on_port(PORT_BASE + 2), dur, msgs)?;
            let c1 = proxy.cpu_seconds();
            let counts = perf_stat_finish(stat)?;
            let t1 = threads(proxy.pid);
            let ((sc0, ss0, k0, ks0), (sc1, ss1, k1, ks1)) = window
                .join()
                .map_err(|_| anyhow::anyhow!("snapshot thread panicked"))?;
            let port = format!(":{}", PORT_BASE + 2);
            let window_rts = k1
                .iter()
                .filter(|(key, _)| key.ends_with(&port))
                .filter_map(|(key, m1)| {
                    let (_, m0) = k0.iter().find(|(k, _)| k == key)?;
                    Some(m1.get("bytes_sent")?.saturating_sub(*m0.get("bytes_sent")?))
                })
                .max()
                .unwrap_or(0)
                / 64;
            let per = |n: f64| n / l.requests as f64;
            let mut line = format!(
                "{} round trips of 64 B in {:.1} s; RTT p50 {:.1} µs, p99 {:.1} µs; proxy {:.1} CPU-µs per round trip",
                l.requests,
                l.secs,
                l.hist.value_at_quantile(0.5) as f64 / 1e3,
                l.hist.value_at_quantile(0.99) as f64 / 1e3,
                (c1 - c0) / l.requests as f64 * 1e6
            );
            line.push_str("\nper round trip (both directions, every hop of the scenario), proxy process only:");
            for (ev, n) in &counts {
                if *n > 0.0 {
                    line.push_str(&format!("\n  {:>8.2}  {ev}", per(*n)));
                }
            }
            line.push_str(&per_thread(&t0, &t1, l.requests, "round trip"));
            let n = window_rts.max(1);
            line.push_str(&format!(
                "\nper round trip ({window_rts} in the middle half), TCP counters of the client pod's netns (app <-> proxy, tunnel client end) | the server pod's (tunnel server end, proxy <-> app):{}",
                counter_deltas(&sc0, &sc1, &ss0, &ss1, n)
            ));
            line.push_str("\nper round trip, each socket that moved bytes (ss -ti; local -> peer); client pod's netns:");
            line.push_str(&socket_deltas(&k0, &k1, n));
            line.push_str("\nserver pod's netns:");
            line.push_str(&socket_deltas(&ks0, &ks1, n));
            // RINGWAY_BENCH_PROFILE_LOAD=sockperf: then sockperf's own
            // ping-pong on the same path and proxy (untraced), when installed.
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("sockperf") {
                if let Some(bin) = Tools::find().get("sockperf") {
                    let c0 = proxy.cpu_seconds();
                    let (p50, p99) = tools::sockperf(bin, &path.on_port(PORT_BASE + 3), secs)?;
                    line.push_str(&format!(
                        "\nsockperf ping-pong 64 B, untraced: RTT p50 {p50:.1} µs, p99 {p99:.1} µs; proxy {:.2} CPU-s in {secs} s",
                        proxy.cpu_seconds() - c0
                    ));
                }
            }
            // An idle proxy must not spin (busyPollMicros follows activity).
            let c0 = proxy.cpu_seconds();
            std::thread::sleep(Duration::from_secs(1));
            line.push_str(&format!(
                "\nidle for 1 s after the load: proxy {:.1} CPU-ms",
                (proxy.cpu_seconds() - c0) * 1e3
            ));
            line
        }
        // RINGWAY_BENCH_PROFILE_LOAD=rtt: 64 B ping-pong at 2,000/s on one
        // connection; =idle: RSS per idle connection (1,000) instead.
        Profile::HboneStream
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("rtt") =>
        {
            let l = load::latency(&path.on_port(PORT_BASE + 2), 2_000.0, 1, dur)?;
            let q = |p: f64| l.hist.value_at_quantile(p) as f64 / 1e3;
            let c1 = proxy.cpu_seconds();
            format!(
                "{} round trips (64 B): p50 {:.1} µs, p99 {:.1} µs; proxy {:.1} CPU-µs per round trip",
                l.requests, q(0.5), q(0.99), (c1 - c0) / l.requests as f64 * 1e6
            )
        }
        // RINGWAY_BENCH_PROFILE_LOAD=connmem: the connection-rate loop
        // again and again, each run followed by a quiet pause (the idle
        // trim runs), the proxy's memory read after each: resident size and
        // what its heaps hold (live and free). Live bytes that grow with
        // the connections made are a leak; free bytes that stay are the
        // allocator's.
        Profile::HboneStream
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("connmem") =>
        {
            let metrics = bed::PROXY_METRICS;
            let heap = || -> anyhow::Result<(f64, f64, f64)> {
                let text =
                    String::from_utf8_lossy(&bed::http_get(metrics, "/metrics")?).into_owned();
                let m = ringway_testbed::prom::Metrics::parse(&text)?;
                let v = |n: &str| {
                    m.get(n, &[])
                        .with_context(|| format!("{n} not in the proxy's metrics"))
                };
                Ok((
                    v("ringway_heap_in_use_bytes")? / 1048576.0,
                    v("ringway_heap_free_bytes")? / 1048576.0,
                    m.sum("ringway_hbone_pool_streams", &[]),
                ))
            };
            let mut line = String::from("connections made -> proxy RSS MiB, heap in use MiB, heap free MiB (3 s after each run); the run's conn/s and proxy CPU-µs per connection");
            let mut made = 0u64;
            std::thread::sleep(Duration::from_secs(3));
            let (u, fr, st) = heap()?;
            line.push_str(&format!(
                "\n  {made:>7} -> {:.1}, {u:.2}, {fr:.2}; {st} pooled streams open",
                proxy.rss_kib() / 1024.0
            ));
            // The suite's other loads first, each read the same way: idle
            // connections held then closed, then eight streams of bulk data.
            let idle_n: usize = std::env::var("RINGWAY_BENCH_PROFILE_IDLE")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(4_000);
            if idle_n > 0 {
                let idle = load::open_idle(&path.on_port(PORT_BASE + 3), idle_n)?;
                std::thread::sleep(Duration::from_millis(500));
                let held = proxy.rss_kib() / 1024.0;
                let n = idle.len();
                drop(idle);
                std::thread::sleep(Duration::from_secs(3));
                let (u, fr, st) = heap()?;
                line.push_str(&format!(
                    "\n  after {n} idle connections (RSS {held:.1} while held), closed: {:.1}, {u:.2}, {fr:.2}; {st} pooled streams open",
                    proxy.rss_kib() / 1024.0
                ));
                // Still quiet, past the pool's surplus idle timeout: the
                // tunnels the idle connections took beyond one per worker
                // have closed; what they held is given back without load.
                std::thread::sleep(
                    crate::config::after_load_quiet().saturating_sub(Duration::from_secs(3)),
                );
                let (u, fr, st) = heap()?;
                line.push_str(&format!(
                    "\n  then quiet past the surplus tunnels' idle timeout: {:.1}, {u:.2}, {fr:.2}; {st} pooled streams open",
                    proxy.rss_kib() / 1024.0
                ));
                // RINGWAY_BENCH_PROFILE_KILL=1: the proxy is killed here,
                // with what it holds now still allocated (for a heap
                // profiler's "leaked" view of a proxy run under it).
                if std::env::var("RINGWAY_BENCH_PROFILE_KILL").as_deref() == Ok("1") {
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(proxy.pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    )?;
                    return Ok(line);
                }
            }
            load::throughput(&path.on_port(PORT_BASE + 4), 8, dur)?;
            std::thread::sleep(Duration::from_secs(3));
            let (u, fr, st) = heap()?;
            line.push_str(&format!(
                "\n  after 8 streams for {:.1} s: {:.1}, {u:.2}, {fr:.2}; {st} pooled streams open",
                dur.as_secs_f64(),
                proxy.rss_kib() / 1024.0
            ));
            // RINGWAY_BENCH_PROFILE_SAME_PORT=1: every run to the same
            // port (their TIME_WAIT 4-tuples meet), else a new port each.
            let same_port = std::env::var("RINGWAY_BENCH_PROFILE_SAME_PORT").as_deref() == Ok("1");
            for i in 0..5u16 {
                let c0 = proxy.cpu_seconds();
                let port = if same_port {
                    PORT_BASE + 2
                } else {
                    PORT_BASE + 10 + i
                };
                let cr = load::conn_rate(
                    &path.on_port(port),
                    config.conn_threads,
                    dur,
                    (secs * 100_000.0) as u64,
                )?;
                let cpu_us = (proxy.cpu_seconds() - c0) / cr.conns.max(1) as f64 * 1e6;
                made += cr.conns;
                std::thread::sleep(Duration::from_secs(3));
                let (u, fr, st) = heap()?;
                let tw = |ns: &Netns| -> String {
                    ns.run(|| std::fs::read_to_string("/proc/thread-self/net/sockstat"))
                        .ok()
                        .and_then(|t| {
                            let l = t.lines().find(|l| l.starts_with("TCP:"))?.to_string();
                            let mut it = l.split_whitespace();
                            it.position(|w| w == "tw")?;
                            it.next().map(str::to_string)
                        })
                        .unwrap_or_else(|| "?".into())
                };
                line.push_str(&format!(
                    "\n  {made:>7} -> {:.1}, {u:.2}, {fr:.2}; {st} pooled streams open; {:.0} conn/s, {cpu_us:.0} CPU-µs/conn, {} failed; TIME_WAIT client pod {}, server pod {}",
                    proxy.rss_kib() / 1024.0,
                    cr.conns as f64 / cr.secs,
                    cr.failures,
                    tw(&path.client),
                    tw(&path.server)
                ));
            }
            line
        }
        Profile::HboneStream
            if std::env::var("RINGWAY_BENCH_PROFILE_LOAD").as_deref() == Ok("idle") =>
        {
            let before = proxy.rss_kib();
            let idle = load::open_idle(&path.on_port(PORT_BASE + 2), 1_000)?;
            std::thread::sleep(Duration::from_millis(500));
            let after = proxy.rss_kib();
            format!(
                "{} idle connections: proxy RSS {before:.0} -> {after:.0} KiB, {:.2} KiB each",
                idle.len(),
                (after - before) / idle.len() as f64
            )
        }
        Profile::HboneStream => {
            let t = load::throughput(&path.on_port(PORT_BASE + 2), 1, dur)?;
            let c1 = proxy.cpu_seconds();
            format!(
                "{:.2} Gbit/s over one stream for {:.1} s; proxy {:.3} CPU-s/GB",
                t.gbps(),
                t.secs,
                (c1 - c0) / (t.bytes as f64 / 1e9)
            )
        }
    };
    if let Some(p) = perf.as_mut() {
        let _ = p.wait();
    }
    drop(proxies);
    Ok(line)
}

/// CPU-seconds of this process (the load generator and the server),
/// threads that ended included.
fn bench_cpu_seconds() -> f64 {
    crate::child::proc_stat_cpu_seconds(std::process::id())
}

/// Each thread of `pid`: (tid, name, voluntary switches, involuntary
/// switches, run time in ns), from /proc.
fn threads(pid: u32) -> Vec<(u32, String, u64, u64, u64)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for e in dir.flatten() {
        let Some(tid) = e.file_name().to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        let base = e.path();
        let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(base.join("status")).unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        let run_ns = std::fs::read_to_string(base.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0);
        out.push((
            tid,
            comm.trim().to_string(),
            field("voluntary_ctxt_switches:"),
            field("nonvoluntary_ctxt_switches:"),
            run_ns,
        ));
    }
    out
}

/// Per round trip, each thread that ran: its switches and CPU time.
fn per_thread(
    t0: &[(u32, String, u64, u64, u64)],
    t1: &[(u32, String, u64, u64, u64)],
    n: u64,
    unit: &str,
) -> String {
    let mut line = format!(
        "\nper {unit}, each proxy thread that ran (/proc: voluntary + involuntary switches, CPU-µs):",
    );
    for (tid, name, v1, i1, r1) in t1 {
        let Some((_, _, v0, i0, r0)) = t0.iter().find(|t| t.0 == *tid) else {
            continue;
        };
        if r1 > r0 {
            line.push_str(&format!(
                "\n  {name} ({tid}): {:.2} + {:.2} switches, {:.1} CPU-µs",
                (v1 - v0) as f64 / n as f64,
                (i1 - i0) as f64 / n as f64,
                (r1 - r0) as f64 / 1e3 / n as f64
            ));
        }
    }
    line
}

/// The counters that say how segments and ACKs went, per round trip or
/// connection (`n`).
fn counter_deltas(
    c0: &std::collections::BTreeMap<String, u64>,
    c1: &std::collections::BTreeMap<String, u64>,
    s0: &std::collections::BTreeMap<String, u64>,
    s1: &std::collections::BTreeMap<String, u64>,
    n: u64,
) -> String {
    let mut line = String::new();
    for k in [
        "OutSegs",
        "InSegs",
        "RetransSegs",
        "DelayedACKs",
        "DelayedACKLocked",
        "DelayedACKLost",
        "TCPPureAcks",
        "TCPHPAcks",
        "TCPAutoCorking",
        "TCPOrigDataSent",
    ] {
        let d = |a: &std::collections::BTreeMap<String, u64>,
                 b: &std::collections::BTreeMap<String, u64>| {
            (b.get(k)
                .copied()
                .unwrap_or(0)
                .saturating_sub(a.get(k).copied().unwrap_or(0))) as f64
                / n as f64
        };
        line.push_str(&format!("\n  {:>8.2} | {:>8.2}  {k}", d(c0, c1), d(s0, s1)));
    }
    line
}

/// Every established TCP socket of the netns with its `ss -ti` counters,
/// keyed by "local -> peer".
fn tcp_sockets(ns: &Netns) -> Vec<(String, std::collections::BTreeMap<String, u64>)> {
    let text = ns.run(|| {
        std::process::Command::new("ss")
            .args(["-tinH", "state", "established"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    });
    let mut out: Vec<(String, std::collections::BTreeMap<String, u64>)> = Vec::new();
    for l in text.lines() {
        if !l.starts_with(char::is_whitespace) {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Recv-Q Send-Q Local Peer (state filtered: no state column).
            if f.len() >= 4 {
                out.push((format!("{} -> {}", f[2], f[3]), Default::default()));
            }
        } else if let Some((_, m)) = out.last_mut() {
            for tok in l.split_whitespace() {
                if let Some((k, v)) = tok.split_once(':') {
                    if let Ok(v) = v.parse::<u64>() {
                        m.insert(k.to_string(), v);
                    }
                }
            }
        }
    }
    out
}

/// Per round trip, for each socket present before and after that moved
/// bytes: bytes and segments sent and received.
fn socket_deltas(
    before: &[(String, std::collections::BTreeMap<String, u64>)],
    after: &[(String, std::collections::BTreeMap<String, u64>)],
    n: u64,
) -> String {
    let mut line = String::new();
    for (key, m1) in after {
        let Some((_, m0)) = before.iter().find(|(k, _)| k == key) else {
            continue;
        };
        let d = |k: &str| {
            (m1.get(k)
                .copied()
                .unwrap_or(0)
                .saturating_sub(m0.get(k).copied().unwrap_or(0))) as f64
                / n as f64
        };
        if d("bytes_received") + d("bytes_sent") < 0.5 {
            continue;
        }
        line.push_str(&format!(
            "\n  {key}: sent {:.1} B in {:.2} segments ({:.2} with data), received {:.1} B in {:.2} segments ({:.2} with data)",
            d("bytes_sent"),
            d("segs_out"),
            d("data_segs_out"),
            d("bytes_received"),
            d("segs_in"),
            d("data_segs_in"),
        ));
    }
    line
}
