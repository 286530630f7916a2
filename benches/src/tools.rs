//! The standard tools, run on a load generator's path: `iperf3`,
//! `sockperf` and `wrk` against nginx (all from Debian), each bounded in
//! time. Servers run in the server pod's netns bound to its address,
//! clients in the client pod's netns, all inside the bench's private
//! namespaces; a client that outlives its deadline is killed by its pid,
//! servers are stopped by theirs (SIGTERM, then SIGKILL). Used by the
//! cross-check and the latency profile; above the proxy children and the
//! load generator's paths.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::child::ProxyChild;
use crate::host::progress;
use crate::load::Path;

/// Why a tool gave no figure.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// Spawning or waiting for it, or writing its files, failed.
    #[error("{what}: {source}")]
    Io {
        /// The command or file.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The server did not listen on its port in time.
    #[error("server not listening on {port} after 5 s: {log}")]
    NotListening {
        /// The port.
        port: u16,
        /// The server's last output.
        log: String,
    },
    /// The client outlived its deadline and was killed.
    #[error("{what} still running after {deadline:?}: killed (pid {pid})")]
    Timeout {
        /// The command.
        what: String,
        /// Its deadline.
        deadline: Duration,
        /// Its pid.
        pid: i32,
    },
    /// The client exited with an error.
    #[error("{what} failed ({status}): {stdout} {stderr}")]
    Failed {
        /// The command.
        what: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The start of its stdout.
        stdout: String,
        /// The start of its stderr.
        stderr: String,
    },
    /// Its output lacks the figure.
    #[error("{tool}: {what}")]
    Output {
        /// The tool.
        tool: &'static str,
        /// What is missing or wrong.
        what: String,
    },
}

/// The tools found on the machine and the missing ones.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    /// Name -> path.
    pub found: BTreeMap<String, PathBuf>,
    /// Not installed (their figures stay empty).
    pub missing: Vec<String>,
}

impl Tools {
    /// Looks for `iperf3`, `sockperf`, `wrk` and `nginx`; says loudly what
    /// is missing.
    pub fn find() -> Tools {
        let mut t = Tools::default();
        for name in ["iperf3", "sockperf", "wrk", "nginx"] {
            match which(name) {
                Some(p) => {
                    t.found.insert(name.to_string(), p);
                }
                None => t.missing.push(name.to_string()),
            }
        }
        if !t.missing.is_empty() {
            progress(format!(
                "!!! cross-check: {} not installed: their columns stay empty \
                 (apt-get install -y iperf3 sockperf wrk nginx-light) !!!",
                t.missing.join(", ")
            ));
        }
        t
    }

    /// Where `name` is, if installed.
    pub fn get(&self, name: &str) -> Option<&PathBuf> {
        self.found.get(name)
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
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
fn start_server(path: &Path, cmd: Command, port: u16) -> Result<ProxyChild, ToolError> {
    let what = format!("{cmd:?}");
    let server = path
        .server
        .run(move || ProxyChild::spawn(cmd, None, Duration::ZERO))
        .map_err(|e| ToolError::Io {
            what,
            source: std::io::Error::other(format!("{e:#}")),
        })?;
    if !ringway_testbed::wait_until(Duration::from_secs(5), || listening(path, port)) {
        return Err(ToolError::NotListening {
            port,
            log: server.log_tail(),
        });
    }
    Ok(server)
}

/// Runs a client process in the client pod's netns; kills it by its pid if
/// it is still running at `deadline`. Returns its stdout.
fn run_client(path: &Path, mut cmd: Command, deadline: Duration) -> Result<String, ToolError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let what = format!("{cmd:?}");
    let child = path
        .client
        .run(move || cmd.spawn())
        .map_err(|source| ToolError::Io {
            what: format!("spawning {what}"),
            source,
        })?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(deadline) {
        Ok(o) => o.map_err(|source| ToolError::Io {
            what: format!("waiting for {what}"),
            source,
        })?,
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = rx.recv_timeout(Duration::from_secs(5));
            return Err(ToolError::Timeout {
                what,
                deadline,
                pid: pid.as_raw(),
            });
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(ToolError::Failed {
            what,
            status: out.status,
            stdout: stdout.chars().take(400).collect(),
            stderr: String::from_utf8_lossy(&out.stderr)
                .chars()
                .take(400)
                .collect(),
        });
    }
    Ok(stdout)
}

/// Whole seconds a tool runs for `secs` (at least 1).
fn whole_secs(secs: f64) -> u64 {
    secs.ceil().max(1.0) as u64
}

/// `iperf3 -c` with `streams` parallel streams for `secs`: (Gbit/s
/// received, bytes received).
pub fn iperf3(
    bin: &FsPath,
    path: &Path,
    streams: usize,
    secs: f64,
) -> Result<(f64, f64), ToolError> {
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
        .arg(whole_secs(secs).to_string())
        .arg("-P")
        .arg(streams.to_string())
        .arg("-J");
    let out = run_client(path, c, Duration::from_secs_f64(secs + 20.0));
    server.stop();
    let v: serde_json::Value = serde_json::from_str(&out?).map_err(|e| ToolError::Output {
        tool: "iperf3",
        what: format!("-J output: {e}"),
    })?;
    let sum = &v["end"]["sum_received"];
    let bps = sum["bits_per_second"]
        .as_f64()
        .ok_or_else(|| ToolError::Output {
            tool: "iperf3",
            what: "no end.sum_received.bits_per_second".into(),
        })?;
    let bytes = sum["bytes"].as_f64().unwrap_or(f64::NAN);
    Ok((bps / 1e9, bytes))
}

/// `sockperf ping-pong --tcp -m 64 --full-rtt` for `secs`: (p50, p99) µs.
pub fn sockperf(bin: &FsPath, path: &Path, secs: f64) -> Result<(f64, f64), ToolError> {
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
        .arg(whole_secs(secs).to_string());
    let out = run_client(path, c, Duration::from_secs_f64(secs + 20.0));
    server.stop();
    let out = out?;
    let pct = |q: &str| -> Result<f64, ToolError> {
        out.lines()
            .find(|l| l.contains(&format!("percentile {q} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .ok_or_else(|| ToolError::Output {
                tool: "sockperf",
                what: format!("no percentile {q} in its output: {out}"),
            })
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

/// `wrk -t2 -c16 -H 'Connection: close'` for `secs` against nginx (its
/// files in `dir`): requests/s, each a new connection.
pub fn wrk(
    wrk: &FsPath,
    nginx: &FsPath,
    dir: &FsPath,
    path: &Path,
    secs: f64,
) -> Result<f64, ToolError> {
    wrk_with_output(wrk, nginx, dir, path, secs).map(|(rps, _)| rps)
}

/// The connections wrk counted as failed in its report (`Socket errors:
/// connect N, read N, write N, timeout N`, summed; none when the line is
/// absent, as wrk prints it only when there were some).
pub fn wrk_socket_errors(report: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix("Socket errors:"))
        .map(|rest| {
            rest.split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// [`wrk`], with wrk's own report (`--latency`: its latency percentiles).
pub fn wrk_with_output(
    wrk: &FsPath,
    nginx: &FsPath,
    dir: &FsPath,
    path: &Path,
    secs: f64,
) -> Result<(f64, String), ToolError> {
    let addr = path.listen;
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(dir, addr)).map_err(|source| ToolError::Io {
        what: conf.display().to_string(),
        source,
    })?;
    let mut s = Command::new(nginx);
    s.arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&conf)
        .args(["-g", "daemon off;"]);
    let mut server = start_server(path, s, addr.port())?;
    let mut c = Command::new(wrk);
    c.args(["-t2", "-c16", "--latency", "-H", "Connection: close"])
        .arg(format!("-d{}s", whole_secs(secs)))
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
        .ok_or_else(|| ToolError::Output {
            tool: "wrk",
            what: format!("no Requests/sec in its output: {out}"),
        })?;
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors")) {
        progress(format!("    wrk: {}", l.trim()));
    }
    if let Some(l) = out.lines().find(|l| l.contains("Non-2xx")) {
        return Err(ToolError::Output {
            tool: "wrk",
            what: l.trim().to_string(),
        });
    }
    Ok((rps, out))
}

#[cfg(test)]
mod wrk_report_tests {
    use super::wrk_socket_errors;

    #[test]
    fn socket_errors_are_summed_and_absent_means_none() {
        let report = "Running 6s test @ http://10.0.0.1:80/\n  Socket errors: connect 3, read 12, write 0, timeout 5\nRequests/sec:   4468.24\n";
        assert_eq!(wrk_socket_errors(report), 20);
        assert_eq!(wrk_socket_errors("Requests/sec:   4468.24\n"), 0);
        // A malformed line counts what it can read.
        assert_eq!(wrk_socket_errors("Socket errors: connect x, read 2"), 2);
    }
}
