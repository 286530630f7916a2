//! Cross-check: the bundled load generator and the standard tools (iperf3,
//! sockperf, wrk against nginx, all from Debian) on the same paths, in the
//! same run, side by side, so a reader can reproduce the headline figures
//! with tools they already trust.
//!
//! Everything runs in the bench's own namespaces (`run_isolated`): servers
//! are bound to the server pod's address inside its netns, clients run in
//! the client pod's netns, every tool runs for a bounded time and is ended
//! by its pid (SIGTERM, then SIGKILL) if it outlives its deadline.
//!
//! Per round and scenario (one fresh proxy for all of them), alternating
//! bundled and tool: one stream (`load::throughput` / `iperf3 -t`), 4
//! streams (`load::throughput` with 4 / `iperf3 -P 4`), 64 B closed-loop
//! ping-pong (`load::ping_pong` / `sockperf ping-pong --tcp -m 64
//! --full-rtt`), new connections/s (`load::conn_rate` / `wrk -t2 -c16` with
//! `Connection: close` against nginx).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::child::ProxyChild;
use crate::load::{self, Path};
use crate::suite::{self, progress, Bed, Config};

/// The scenarios the cross-check measures (keys of `suite::scenarios`).
pub const SCENARIOS: &[&str] = &["direct", "tproxy_2hop", "tproxy_fast", "hbone_1node"];

/// The measures, in report order: key, title, unit, whether higher is better.
pub const MEASURES: &[(&str, &str, &str)] = &[
    ("tput1_gbps", "one stream", "Gbit/s"),
    ("tput4_gbps", "4 streams", "Gbit/s"),
    ("pp_p50_us", "64 B ping-pong RTT p50", "µs"),
    ("pp_p99_us", "64 B ping-pong RTT p99", "µs"),
    ("conn_per_s", "new connections/s", "conn/s"),
    ("cpu_s_per_gb", "proxy CPU-s/GB, one stream", "CPU-s/GB"),
];

/// Which tool measures what.
pub const TOOLS: &[(&str, &str)] = &[
    ("tput1_gbps", "iperf3 -t S"),
    ("tput4_gbps", "iperf3 -P 4 -t S"),
    ("pp_p50_us", "sockperf pp --tcp -m 64 --full-rtt"),
    ("pp_p99_us", "sockperf pp --tcp -m 64 --full-rtt"),
    ("conn_per_s", "wrk -t2 -c16 -H 'Connection: close' -> nginx"),
    ("cpu_s_per_gb", "iperf3 -t S (proxy /proc)"),
];

/// One scenario's figures: per measure, one value per round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    /// Scenario key.
    pub key: String,
    /// Scenario title.
    pub name: String,
    /// The bundled load generator's figures.
    pub bundled: BTreeMap<String, Vec<f64>>,
    /// The standard tools' figures.
    pub tools: BTreeMap<String, Vec<f64>>,
}

/// The cross-check's document (`crosscheck.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CrossCheck {
    /// Rounds run.
    pub rounds: usize,
    /// Seconds per measurement.
    pub secs: f64,
    /// Tools found on the machine (name -> path), and the missing ones.
    pub tools_found: BTreeMap<String, String>,
    /// Tools not installed (their columns are empty).
    pub tools_missing: Vec<String>,
    /// The scenarios, in order.
    pub rows: Vec<Row>,
    /// Measurements that failed.
    pub errors: Vec<String>,
    /// How the machine's idle CPUs wait ([`cpu_idle`]): on a VM it sets
    /// most of a 64 B round trip.
    #[serde(default)]
    pub cpu_idle: String,
}

/// The CPU idle driver, governor and (with the `haltpoll` driver of a KVM
/// guest) how long an idle vCPU polls before it halts: waking a halted vCPU
/// takes a trip through the hypervisor, which can outweigh the proxy's own
/// work per message (BENCHMARKS.md, "What bounds a 64 B round trip on a
/// VM"), so latencies compare only between machines that idle alike.
pub fn cpu_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    let governor = read("/sys/devices/system/cpu/cpuidle/current_governor");
    let mut s = format!("cpuidle driver {driver}, governor {governor}");
    if driver == "haltpoll" {
        let ns = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
        s.push_str(&format!(", guest_halt_poll_ns {ns}"));
    }
    s
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The standard tools and where they are; says loudly what is missing.
pub fn find_tools() -> (BTreeMap<String, PathBuf>, Vec<String>) {
    let mut found = BTreeMap::new();
    let mut missing = Vec::new();
    for t in ["iperf3", "sockperf", "wrk", "nginx"] {
        match which(t) {
            Some(p) => {
                found.insert(t.to_string(), p);
            }
            None => missing.push(t.to_string()),
        }
    }
    if !missing.is_empty() {
        progress(format!(
            "!!! cross-check: {} not installed: their columns stay empty \
             (apt-get install -y iperf3 sockperf wrk nginx-light) !!!",
            missing.join(", ")
        ));
    }
    (found, missing)
}

/// Whether the server pod's netns has a TCP listener on `port`
/// (`/proc/thread-self/net/tcp{,6}` read from inside it: no probe connection).
fn listening(path: &Path, port: u16) -> bool {
    let want = format!(":{port:04X} ");
    path.server.run(|| {
        ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .any(|t| {
                t.lines().skip(1).any(|l| {
                    let cols: Vec<&str> = l.split_whitespace().collect();
                    cols.len() > 3 && format!("{} ", cols[1]).ends_with(&want) && cols[3] == "0A"
                })
            })
    })
}

/// Starts a server process in the server pod's netns and waits (at most
/// 5 s) until it listens on `port`. Ended by its pid when dropped.
fn start_server(path: &Path, cmd: Command, port: u16) -> anyhow::Result<ProxyChild> {
    let server = path
        .server
        .run(move || ProxyChild::spawn(cmd, None, Duration::ZERO))?;
    let t0 = Instant::now();
    while !listening(path, port) {
        if t0.elapsed() > Duration::from_secs(5) {
            bail!(
                "server not listening on {port} after 5 s: {}",
                server.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(server)
}

/// Runs a client process in the client pod's netns; kills it by its pid if
/// it is still running at `deadline`. Returns its stdout.
fn run_client(path: &Path, mut cmd: Command, deadline: Duration) -> anyhow::Result<String> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what = format!("{cmd:?}");
    let child = path
        .client
        .run(move || cmd.spawn())
        .with_context(|| format!("spawning {what}"))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(deadline) {
        Ok(o) => o.with_context(|| format!("waiting for {what}"))?,
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = rx.recv_timeout(Duration::from_secs(5));
            bail!("{what} still running after {deadline:?}: killed (pid {pid})");
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {} {}",
            out.status,
            stdout.chars().take(400).collect::<String>(),
            String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(400)
                .collect::<String>()
        );
    }
    Ok(stdout)
}

/// `iperf3 -c` with `streams` parallel streams for `secs`: Gbit/s received.
fn iperf3(bin: &FsPath, path: &Path, streams: usize, secs: f64) -> anyhow::Result<(f64, f64)> {
    let addr = path.listen;
    let mut s = Command::new(bin);
    s.args(["-s", "-B"])
        .arg(addr.ip().to_string())
        .arg("-p")
        .arg(addr.port().to_string());
    let mut server = start_server(path, s, addr.port())?;
    let mut c = Command::new(bin);
    c.arg("-c")
        .arg(path.connect.ip().to_string())
        .arg("-p")
        .arg(path.connect.port().to_string())
        .arg("-t")
        .arg(format!("{}", secs.ceil().max(1.0) as u64))
        .arg("-P")
        .arg(streams.to_string())
        .arg("-J");
    let out = run_client(path, c, Duration::from_secs_f64(secs + 20.0));
    server.stop();
    let v: serde_json::Value = serde_json::from_str(&out?).context("iperf3 -J output")?;
    let sum = &v["end"]["sum_received"];
    let bps = sum["bits_per_second"]
        .as_f64()
        .context("iperf3: no end.sum_received.bits_per_second")?;
    let bytes = sum["bytes"].as_f64().unwrap_or(f64::NAN);
    Ok((bps / 1e9, bytes))
}

/// `sockperf ping-pong --tcp -m 64 --full-rtt` for `secs`: (p50, p99) µs.
pub(crate) fn sockperf(bin: &FsPath, path: &Path, secs: f64) -> anyhow::Result<(f64, f64)> {
    let addr = path.listen;
    let mut s = Command::new(bin);
    s.args(["sr", "--tcp", "-i"])
        .arg(addr.ip().to_string())
        .arg("-p")
        .arg(addr.port().to_string());
    let mut server = start_server(path, s, addr.port())?;
    let mut c = Command::new(bin);
    c.args(["pp", "--tcp", "--full-rtt", "-m", "64", "-i"])
        .arg(path.connect.ip().to_string())
        .arg("-p")
        .arg(path.connect.port().to_string())
        .arg("-t")
        .arg(format!("{}", secs.ceil().max(1.0) as u64));
    let out = run_client(path, c, Duration::from_secs_f64(secs + 20.0));
    server.stop();
    let out = out?;
    let pct = |q: &str| -> anyhow::Result<f64> {
        out.lines()
            .find(|l| l.contains(&format!("percentile {q} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .with_context(|| format!("sockperf: no percentile {q} in its output: {out}"))
    };
    Ok((pct("50.000")?, pct("99.000")?))
}

fn nginx_conf(dir: &FsPath, addr: SocketAddr) -> String {
    let d = dir.display();
    format!(
        "worker_processes 2;\n\
         pid {d}/nginx.pid;\n\
         error_log {d}/nginx-error.log;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
         keepalive_timeout 0;\n  \
         server {{\n    listen {addr};\n    location / {{ return 200 \"ok\\n\"; }}\n  }}\n}}\n"
    )
}

/// `wrk -t2 -c16 -H 'Connection: close'` for `secs` against nginx: requests/s.
fn wrk(wrk: &FsPath, nginx: &FsPath, dir: &FsPath, path: &Path, secs: f64) -> anyhow::Result<f64> {
    let addr = path.listen;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, addr))?;
    let mut s = Command::new(nginx);
    s.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .args(["-g", "daemon off;"]);
    let mut server = start_server(path, s, addr.port())?;
    let mut c = Command::new(wrk);
    c.args(["-t2", "-c16", "-H", "Connection: close"])
        .arg(format!("-d{}s", secs.ceil().max(1.0) as u64))
        .arg(format!("http://{}/", path.connect));
    let out = run_client(path, c, Duration::from_secs_f64(secs + 20.0));
    // SIGTERM to the master: fast shutdown of its workers too.
    server.stop();
    let out = out?;
    let rps = out
        .lines()
        .find(|l| l.starts_with("Requests/sec:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("wrk: no Requests/sec in its output: {out}"))?;
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors")) {
        progress(format!("    wrk: {}", l.trim()));
    }
    if let Some(l) = out.lines().find(|l| l.contains("Non-2xx")) {
        bail!("wrk: {}", l.trim());
    }
    Ok(rps)
}

/// Runs the cross-check inside the bench's namespaces (call inside
/// `run_isolated`).
pub fn run(config: &Config) -> anyhow::Result<CrossCheck> {
    let (tools, missing) = find_tools();
    let bed = Bed::build()?;
    let all = suite::scenarios(false);
    let scenarios: Vec<_> = SCENARIOS
        .iter()
        .map(|k| all.iter().find(|s| s.key == *k).expect("scenario").clone())
        .collect();
    let mut doc = CrossCheck {
        rounds: config.rounds,
        secs: config.secs,
        tools_found: tools
            .iter()
            .map(|(k, v)| (k.clone(), v.display().to_string()))
            .collect(),
        tools_missing: missing,
        rows: scenarios
            .iter()
            .map(|s| Row {
                key: s.key.into(),
                name: s.name.into(),
                ..Row::default()
            })
            .collect(),
        errors: Vec::new(),
        cpu_idle: cpu_idle(),
    };
    let secs = config.secs;
    let dur = Duration::from_secs_f64(secs);
    let mut port = suite::PORT_BASE;
    for round in 0..config.rounds {
        for (i, sc) in scenarios.iter().enumerate() {
            progress(format!(
                "cross-check round {}/{}: {}",
                round + 1,
                config.rounds,
                sc.name
            ));
            let (path, proxies) = match suite::start(config, &bed, sc) {
                Ok(x) => x,
                Err(e) => {
                    doc.errors
                        .push(format!("round {}, {}: start: {e:#}", round + 1, sc.key));
                    continue;
                }
            };
            std::thread::sleep(config.settle);
            let row = &mut doc.rows[i];
            let mut errors = Vec::new();
            let put = |m: &mut BTreeMap<String, Vec<f64>>, k: &str, v: f64| {
                m.entry(k.to_string()).or_default().push(v)
            };
            // Alternate which goes first by round.
            for first_tool in [round % 2 == 1, round % 2 == 0] {
                if first_tool {
                    let mut t = |what: &str, r: anyhow::Result<()>| {
                        if let Err(e) = r {
                            progress(format!("  {what} failed: {e:#}"));
                            errors.push(format!("round {}, {}, {what}: {e:#}", round + 1, sc.key));
                        }
                    };
                    if let Some(bin) = tools.get("iperf3") {
                        for (k, n) in [("tput1_gbps", 1), ("tput4_gbps", 4)] {
                            let c0 = proxies.cpu();
                            let r =
                                iperf3(bin, &path.on_port(suite::next_port(&mut port)), n, secs)
                                    .map(|(g, bytes)| {
                                        put(&mut row.tools, k, g);
                                        if let (1, Some(c0), Some(c1)) = (n, c0, proxies.cpu()) {
                                            put(
                                                &mut row.tools,
                                                "cpu_s_per_gb",
                                                (c1 - c0) / (bytes / 1e9),
                                            );
                                        }
                                    });
                            t(&format!("iperf3 -P {n}"), r);
                        }
                    }
                    if let Some(bin) = tools.get("sockperf") {
                        let r = sockperf(bin, &path.on_port(suite::next_port(&mut port)), secs)
                            .map(|(p50, p99)| {
                                put(&mut row.tools, "pp_p50_us", p50);
                                put(&mut row.tools, "pp_p99_us", p99);
                            });
                        t("sockperf", r);
                    }
                    if let (Some(w), Some(n)) = (tools.get("wrk"), tools.get("nginx")) {
                        let r = wrk(
                            w,
                            n,
                            &bed.scratch.0,
                            &path.on_port(suite::next_port(&mut port)),
                            secs,
                        )
                        .map(|rps| put(&mut row.tools, "conn_per_s", rps));
                        t("wrk", r);
                    }
                } else {
                    let mut t = |what: &str, r: anyhow::Result<()>| {
                        if let Err(e) = r {
                            progress(format!("  {what} failed: {e:#}"));
                            errors.push(format!("round {}, {}, {what}: {e:#}", round + 1, sc.key));
                        }
                    };
                    for (k, n) in [("tput1_gbps", 1), ("tput4_gbps", 4)] {
                        let c0 = proxies.cpu();
                        let r =
                            load::throughput(&path.on_port(suite::next_port(&mut port)), n, dur)
                                .map(|tp| {
                                    put(&mut row.bundled, k, tp.gbps());
                                    if let (1, Some(c0), Some(c1)) = (n, c0, proxies.cpu()) {
                                        put(
                                            &mut row.bundled,
                                            "cpu_s_per_gb",
                                            (c1 - c0) / (tp.bytes as f64 / 1e9),
                                        );
                                    }
                                });
                        t(&format!("bundled throughput {n}"), r);
                    }
                    let r = load::ping_pong(
                        &path.on_port(suite::next_port(&mut port)),
                        dur,
                        (secs * 200_000.0) as u64,
                    )
                    .map(|l| {
                        put(
                            &mut row.bundled,
                            "pp_p50_us",
                            l.hist.value_at_quantile(0.5) as f64 / 1e3,
                        );
                        put(
                            &mut row.bundled,
                            "pp_p99_us",
                            l.hist.value_at_quantile(0.99) as f64 / 1e3,
                        );
                    });
                    t("bundled ping-pong", r);
                    let r = load::conn_rate(
                        &path.on_port(suite::next_port(&mut port)),
                        config.conn_threads,
                        dur,
                        (secs * 100_000.0) as u64,
                    )
                    .map(|c| put(&mut row.bundled, "conn_per_s", c.conns as f64 / c.secs));
                    t("bundled connection rate", r);
                }
            }
            doc.errors.extend(errors);
            let mut proxies = proxies;
            for p in &mut proxies.0 {
                p.stop();
            }
        }
    }
    Ok(doc)
}

fn med(v: Option<&Vec<f64>>) -> Option<f64> {
    v.filter(|v| !v.is_empty()).map(|v| crate::median(v))
}

/// The Markdown: per measure, the bundled and the tool's medians side by
/// side, each with its ratio to direct (added µs for latency).
pub fn render(doc: &CrossCheck) -> String {
    let mut s = String::new();
    s.push_str("## Cross-check with the standard tools\n\n");
    s.push_str(&format!(
        "Same namespaces, same proxies, same run: for each scenario one fresh proxy, then the bundled \
         generator and the tool alternately (order swapped every round); medians of {} rounds, {} s per \
         measurement. Bundled: `load::throughput`, `load::ping_pong` (closed loop, one connection), \
         `load::conn_rate`. Tools: {}.\n\n",
        doc.rounds,
        doc.secs,
        TOOLS
            .iter()
            .map(|(k, t)| format!("{k}: `{t}`"))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    if !doc.cpu_idle.is_empty() {
        s.push_str(&format!(
            "Machine idle: {} (on a VM, how idle vCPUs wait sets most of a 64 B round trip: compare \
             latencies only between runs that idle alike).\n\n",
            doc.cpu_idle
        ));
    }
    if !doc.tools_missing.is_empty() {
        s.push_str(&format!(
            "**Not installed: {}; their columns are empty** (`apt-get install -y iperf3 sockperf wrk nginx-light`).\n\n",
            doc.tools_missing.join(", ")
        ));
    }
    let direct = doc.rows.iter().find(|r| r.key == "direct");
    let fmt = |v: f64| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    s.push_str("| measure | by |");
    for r in &doc.rows {
        s.push_str(&format!(" {} |", r.name));
    }
    s.push_str("\n| --- | --- |");
    for _ in &doc.rows {
        s.push_str(" --- |");
    }
    s.push('\n');
    for (k, title, unit) in MEASURES {
        for (by, tool) in [("bundled", false), ("tool", true)] {
            let pick = |r: &Row| {
                med(if tool {
                    r.tools.get(*k)
                } else {
                    r.bundled.get(*k)
                })
            };
            let base = direct.and_then(pick);
            s.push_str(&format!("| {title} ({unit}) | {by} |"));
            for r in &doc.rows {
                let cell = match (pick(r), base) {
                    (None, _) => "—".to_string(),
                    (Some(m), Some(b)) if r.key != "direct" && k.starts_with("pp_") => {
                        format!("{} (+{:.1})", fmt(m), m - b)
                    }
                    (Some(m), Some(b)) if r.key != "direct" && !k.starts_with("cpu") => {
                        format!("{} ({:.2}x)", fmt(m), m / b)
                    }
                    (Some(m), _) => fmt(m),
                };
                s.push_str(&format!(" {cell} |"));
            }
            s.push('\n');
        }
    }
    s.push_str(
        "\nRatios are to direct (`x`), added round trip to direct (`+µs`), computed from the medians above.\n",
    );
    if !doc.errors.is_empty() {
        s.push_str("\nFailed measurements:\n\n");
        for e in &doc.errors {
            s.push_str(&format!("- {e}\n"));
        }
    }
    s
}

/// Writes `crosscheck.json` and `crosscheck.md` to `out`; returns the Markdown.
pub fn write(out: &FsPath, doc: &CrossCheck) -> anyhow::Result<String> {
    std::fs::create_dir_all(out)?;
    let md = render(doc);
    std::fs::write(
        out.join("crosscheck.json"),
        serde_json::to_string_pretty(doc)?,
    )?;
    std::fs::write(out.join("crosscheck.md"), &md)?;
    Ok(md)
}
