//! Proxies under test as child processes: their CPU from `/proc/<pid>/stat`
//! and their memory from `/proc/<pid>/status` (VmRSS) are theirs alone, not
//! mixed with the load generator's. Children are started from the isolated
//! thread (so they live in its network and mount namespaces) and ended by
//! their own pid: SIGTERM, then SIGKILL after a grace period.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// How to start a ringway proxy child.
#[derive(Debug, Clone)]
pub struct ProxyArgs {
    /// Pods named on the command line (`--pod UID=NETNS_PATH`).
    pub pods: Vec<(String, PathBuf)>,
    /// `--config FILE` (the mesh; `ca:` turns HBONE on).
    pub config: Option<PathBuf>,
    /// `--zds-socket PATH`: pods from the node agent.
    pub zds_socket: Option<PathBuf>,
    /// Loopback address of this proxy's control endpoints (15021, 15020, 15000).
    pub control_host: std::net::Ipv4Addr,
}

impl ProxyArgs {
    /// A proxy for `pods` with the default (embedded) configuration.
    pub fn pods(pods: &[(String, PathBuf)]) -> ProxyArgs {
        ProxyArgs {
            pods: pods.to_vec(),
            config: None,
            zds_socket: None,
            control_host: std::net::Ipv4Addr::new(127, 0, 0, 1),
        }
    }
}

/// A proxy running as a child process.
#[derive(Debug)]
pub struct ProxyChild {
    child: Option<Child>,
    /// Its pid.
    pub pid: u32,
    /// Time from spawn to "serving" (every `--pod` enrolled), when known.
    pub startup: Duration,
    log_tail: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Its warnings, errors and failed connections (the first
    /// [`NOTABLE_LINES`]), which the tail soon loses.
    notable: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// How many notable lines a [`ProxyChild`] keeps.
const NOTABLE_LINES: usize = 200;

/// A log line worth keeping past the tail: a warning or an error, or a
/// connection that failed or was refused (the access log's own words).
fn notable(line: &str) -> bool {
    line.contains(" WARN ")
        || line.contains(" ERROR ")
        || (line.contains(" access:")
            && ["failed", "denied", "reset", "refused"]
                .iter()
                .any(|w| line.contains(w)))
}

impl ProxyChild {
    /// Starts `bin proxy ...` (`bin` is the `ringway` program: the real
    /// binary or the suite's `ringway-bench-proxy`, which runs the same
    /// `ringway::main`) with `env` and `args`, and waits up to `timeout` for
    /// its `serving` log line.
    pub fn start_ringway(
        bin: &Path,
        env: &[(&str, String)],
        args: &ProxyArgs,
        timeout: Duration,
    ) -> anyhow::Result<ProxyChild> {
        let mut cmd = Command::new(bin);
        cmd.arg("proxy");
        for (uid, path) in &args.pods {
            cmd.arg("--pod").arg(format!("{uid}={}", path.display()));
        }
        if let Some(c) = &args.config {
            cmd.arg("--config").arg(c);
        }
        if let Some(z) = &args.zds_socket {
            cmd.arg("--zds-socket").arg(z);
        }
        // `ringway proxy` always serves its endpoints (defaults 15021,
        // 15020, 127.0.0.1:15000); the bench gives each proxy its own
        // loopback address so two proxies never share a port.
        let host = args.control_host;
        cmd.arg("--readiness-addr")
            .arg(format!("{host}:15021"))
            .arg("--metrics-addr")
            .arg(format!("{host}:15020"))
            .arg("--admin-addr")
            .arg(format!("{host}:15000"));
        // The access log is off: a line per connection would cost the
        // proxy CPU the figures count. A diagnostic run can ask for it
        // (`RINGWAY_BENCH_PROXY_LOG=info`); its failed connections are then
        // kept ([`ProxyChild::notable`]).
        let log = std::env::var("RINGWAY_BENCH_PROXY_LOG")
            .unwrap_or_else(|_| "info,access=off".to_string());
        cmd.env("RINGWAY_LOG", log)
            .env("RINGWAY_LOG_FORMAT", "text")
            .envs(env.iter().map(|(k, v)| (k, v)));
        Self::spawn(cmd, Some("serving"), timeout)
    }

    /// Starts any process; when `ready_line` is given, waits for a stderr line
    /// containing it.
    pub fn spawn(
        mut cmd: Command,
        ready_line: Option<&'static str>,
        timeout: Duration,
    ) -> anyhow::Result<ProxyChild> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let t0 = Instant::now();
        let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
        let pid = child.id();
        let stderr = child.stderr.take().expect("piped stderr");
        let log_tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let notable_lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log_tail = log_tail.clone();
            let notable_lines = notable_lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if ready_line.is_some_and(|r| line.contains(r)) {
                        let _ = tx.send(Instant::now());
                    }
                    if notable(&line) {
                        let mut n = notable_lines.lock().expect("lock");
                        if n.len() < NOTABLE_LINES {
                            n.push(line.clone());
                        }
                    }
                    let mut t = log_tail.lock().expect("lock");
                    t.push(line);
                    if t.len() > 40 {
                        t.remove(0);
                    }
                }
            });
        }
        let mut me = ProxyChild {
            child: Some(child),
            pid,
            startup: Duration::ZERO,
            log_tail,
            notable: notable_lines,
        };
        if ready_line.is_some() {
            match rx.recv_timeout(timeout) {
                Ok(t) => me.startup = t - t0,
                Err(_) => {
                    let tail = me.log_tail();
                    me.stop();
                    bail!("{cmd:?} not serving after {timeout:?}; its last log lines:\n{tail}");
                }
            }
        }
        Ok(me)
    }

    /// The last lines the child wrote on stderr.
    pub fn log_tail(&self) -> String {
        self.log_tail.lock().expect("lock").join("\n")
    }

    /// Its warnings, errors and failed connections so far (the first
    /// [`NOTABLE_LINES`]).
    pub fn notable(&self) -> Vec<String> {
        self.notable.lock().expect("lock").clone()
    }

    /// CPU seconds (user + system, all threads) used so far.
    pub fn cpu_seconds(&self) -> f64 {
        proc_cpu_seconds(self.pid)
    }

    /// Resident set size in KiB (VmRSS).
    pub fn rss_kib(&self) -> f64 {
        proc_rss_kib(self.pid)
    }

    /// Anonymous resident set, KiB ([`proc_rss_anon_kib`]).
    pub fn rss_anon_kib(&self) -> f64 {
        proc_rss_anon_kib(self.pid)
    }

    /// File-backed resident set, KiB ([`proc_rss_file_kib`]).
    pub fn rss_file_kib(&self) -> f64 {
        proc_rss_file_kib(self.pid)
    }

    /// Open file descriptors.
    pub fn fds(&self) -> usize {
        proc_fd_count(self.pid)
    }

    /// CPU seconds so far of the threads whose name starts with `prefix`
    /// (e.g. `ringway-control`, `ringway-wk-`).
    pub fn thread_cpu_seconds(&self, prefix: &str) -> f64 {
        proc_thread_cpu_seconds(self.pid, prefix)
    }

    /// Run-queue wait so far (runnable, no CPU) of the threads whose name
    /// starts with `prefix`, seconds.
    pub fn thread_wait_seconds(&self, prefix: &str) -> f64 {
        proc_thread_wait_seconds(self.pid, prefix)
    }

    /// Whether the child is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// SIGTERM, wait up to 10 s, then SIGKILL; reaps the child.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ProxyChild {
    fn drop(&mut self) {
        self.stop();
    }
}

/// CPU seconds of process `pid`: the sum of its threads' on-CPU time from
/// `/proc/<pid>/task/*/schedstat` (nanoseconds), else utime + stime from
/// `/proc/<pid>/stat` (clock ticks: 10 ms resolution).
pub fn proc_cpu_seconds(pid: u32) -> f64 {
    if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        let mut ns = 0u64;
        let mut any = false;
        for e in dir.flatten() {
            if let Some(v) = std::fs::read_to_string(e.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            {
                ns += v;
                any = true;
            }
        }
        if any {
            return ns as f64 / 1e9;
        }
    }
    proc_stat_cpu_seconds(pid)
}

/// utime + stime of process `pid` (fields 14 and 15 of `/proc/<pid>/stat`).
pub fn proc_stat_cpu_seconds(pid: u32) -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let Some(rest) = stat.rsplit(')').next() else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    if f.len() <= 12 {
        return f64::NAN;
    }
    let t = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
    t as f64 / ticks
}

/// Open file descriptors of process `pid` (entries of `/proc/<pid>/fd`).
pub fn proc_fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Open fds of process `pid` by kind (`socket`, `pipe`, `anon_inode:[...]`, ...).
pub fn proc_fd_kinds(pid: u32) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let t = std::fs::read_link(e.path())
            .map(|l| l.display().to_string())
            .unwrap_or_default();
        let kind = match t.split_once(':') {
            Some((k, rest)) if k == "anon_inode" => format!("{k}:{rest}"),
            Some((k, _)) => k.to_string(),
            None => "file".to_string(),
        };
        *m.entry(kind).or_insert(0) += 1;
    }
    m
}

/// CPU seconds of the threads of `pid` whose name starts with `prefix`.
pub fn proc_thread_cpu_seconds(pid: u32, prefix: &str) -> f64 {
    proc_thread_schedstat(pid, prefix).0
}

/// Seconds the threads of `pid` whose name starts with `prefix` spent
/// runnable but waiting for a CPU (the run-queue delay, the second field of
/// `/proc/<pid>/task/<tid>/schedstat`), summed.
pub fn proc_thread_wait_seconds(pid: u32, prefix: &str) -> f64 {
    proc_thread_schedstat(pid, prefix).1
}

/// (on-CPU, run-queue wait) seconds of the matching threads, summed; NaN
/// when the process is gone.
fn proc_thread_schedstat(pid: u32, prefix: &str) -> (f64, f64) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (f64::NAN, f64::NAN);
    };
    let (mut run, mut wait) = (0u64, 0u64);
    for e in dir.flatten() {
        let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("schedstat")) else {
            continue;
        };
        let mut f = stat.split_whitespace().map(|v| v.parse::<u64>().ok());
        if let (Some(Some(r)), Some(Some(w))) = (f.next(), f.next()) {
            run += r;
            wait += w;
        }
    }
    (run as f64 / 1e9, wait as f64 / 1e9)
}

/// VmRSS of process `pid` in KiB.
pub fn proc_rss_kib(pid: u32) -> f64 {
    proc_status_kib(pid, "VmRSS:")
}

/// The anonymous part of a process's resident set (`RssAnon`: heaps,
/// stacks, anonymous mappings; not the program's file-backed pages), KiB.
pub fn proc_rss_anon_kib(pid: u32) -> f64 {
    proc_status_kib(pid, "RssAnon:")
}

/// The file-backed part of a process's resident set (`RssFile`: the
/// program's and libraries' pages), KiB.
pub fn proc_rss_file_kib(pid: u32) -> f64 {
    proc_status_kib(pid, "RssFile:")
}

/// A `kB` line of `/proc/<pid>/status`; NaN when absent.
fn proc_status_kib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(f64::NAN)
}

/// The HAProxy binary, when installed.
pub fn haproxy_binary() -> Option<PathBuf> {
    for d in ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let p = Path::new(d).join("haproxy");
        if p.exists() {
            return Some(p);
        }
    }
    None
}

/// HAProxy's TCP-mode configuration for the bench: listen on
/// `bind_ip:ports`, forward each connection to `server_ip` on the port the
/// client connected to.
pub fn haproxy_config(
    bind_ip: std::net::IpAddr,
    ports: (u16, u16),
    server_ip: std::net::IpAddr,
    maxconn: usize,
) -> String {
    format!(
        "global\n    maxconn {maxconn}\n    nbthread {threads}\n\n\
         defaults\n    mode tcp\n    timeout connect 5s\n    timeout client 1h\n    timeout server 1h\n\n\
         listen bench\n    bind {bind_ip}:{lo}-{hi}\n    server app {server_ip}\n",
        threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        lo = ports.0,
        hi = ports.1,
    )
}

#[cfg(test)]
mod tests {
    use super::notable;

    #[test]
    fn notable_keeps_warnings_errors_and_failed_connections_only() {
        let kept = [
            "2026-12-05T23:36:10.356201Z  WARN ringway_proxy::proxy: the agent sent no addresses",
            "2026-12-05T23:36:10.356201Z ERROR ringway_proxy::worker::conn: listener failed",
            "2026-12-05T23:36:10.356201Z  INFO access: connection failed: upstream connect; client reset error=hbone: broken pipe",
            "2026-12-05T23:36:10.356201Z  INFO access: connection denied by policy; reset",
        ];
        let dropped = [
            "2026-12-05T23:36:10.356201Z  INFO access: connection closed bytes.sent=1 bytes.received=1 end=eof",
            "2026-12-05T23:36:10.356201Z  INFO ringway::proxy_main: stopped reset=0 drained_for=101ms",
            "2026-12-05T23:36:10.356201Z  INFO ringway_proxy::tunnel::warm: warm-up done failed=0",
        ];
        for l in kept {
            assert!(notable(l), "{l}");
        }
        for l in dropped {
            assert!(!notable(l), "{l}");
        }
    }
}
