//! Drills of the pod lifecycle through the real binaries: the `ringway-cni`
//! plugin driven exactly as a container runtime drives it (CNI_* variables,
//! the network config with the primary plugin's `prevResult` on stdin), the
//! `ringway agent` and the `ringway proxy` processes.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support;

use ringway_testbed::http::scrape;
use ringway_testbed::traffic::EchoServer;
use ringway_testbed::{prom, run_isolated, wait_for, wait_until, Pod, VirtualNode};
use support::{ready, Proc};

/// How long a process may take to start or to react: generous, as a loaded
/// 2-core machine needs (never a timed assertion).
const PATIENCE: Duration = Duration::from_secs(60);
/// The agent's control endpoint (readiness, metrics) in the test's netns.
const AGENT_CONTROL: &str = "127.0.0.1:15022";

struct Env {
    dir: ringway_testbed::TempDir,
    plugin: PathBuf,
}

impl Env {
    fn new(name: &str) -> Env {
        let dir = ringway_testbed::TempDir::new(name);
        let plugin = dir.join("ringway-cni");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ringway"), &plugin).unwrap();
        Env { dir, plugin }
    }

    fn zds(&self) -> PathBuf {
        self.dir.join("zds.sock")
    }

    fn cni(&self) -> PathBuf {
        self.dir.join("cni.sock")
    }

    fn agent(&self) -> Proc {
        let log = self.dir.join(format!("agent-{}.log", now_ms()));
        let child = support::agent_command(&self.dir, Path::new("/run/netns"), &log)
            .args(["--pod-service-account", "default=default"])
            .spawn()
            .unwrap();
        let agent = Proc(child);
        wait_for("the agent's sockets", PATIENCE, || {
            self.cni().exists() && self.zds().exists()
        });
        agent
    }

    fn proxy(&self, ready_addr: &str) -> (Proc, PathBuf) {
        let log_path = self.dir.join(format!("proxy-{ready_addr}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_ringway"))
            .args([
                "--log-format",
                "text",
                "--log",
                "info",
                "proxy",
                "--zds-socket",
            ])
            .arg(self.zds())
            .args(["--readiness-addr", ready_addr])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let proxy = Proc(child);
        let addr: SocketAddr = ready_addr.parse().unwrap();
        wait_for("the proxy's readiness", PATIENCE, || ready(addr));
        // The proxy says it is ready once it has the agent's snapshot; the
        // agent hands it pods once it has the proxy's answer: wait for that
        // too (the agent is ready when a proxy is), or an ADD right after
        // can find no ready proxy on a loaded machine.
        wait_for("the agent's readiness (a ready proxy)", PATIENCE, || {
            ready(AGENT_CONTROL.parse().unwrap())
        });
        (proxy, log_path)
    }

    /// Runs the plugin as a runtime does.
    fn cni_call(&self, command: &str, pod: &Pod, uid: &str) -> Output {
        let call = ringway_testbed::cni::CniPod::of(pod, uid).in_namespace("default");
        call.run_plugin_binary(&self.plugin, command, self.dir.path(), &self.cni())
            .unwrap()
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// How long a request waits for its echo in the drills of two pods: a
/// longer stall counts as a failure.
const REPLY_WAIT: Duration = Duration::from_secs(3);

/// How long a request waits for its echo in the drill of 200 pods, which
/// proves where each first connection goes (captured or not), not how
/// fast. On the test bed's bridge a broadcast is queued once per pod, so
/// near 200 pods a few at once overflow the kernel's input queue and
/// packets are dropped, ARP replies among them. The proxy's upstream
/// connect then waits for a SYN retransmission (1, 3, 7 s after the
/// first) or for the next of the pod's ARP requests, 1 s apart (ten, see
/// where the pods are added; the kernel's default of three gave up within
/// the second sighting's 3 s). 20 s outlasts that. A connection that is
/// not captured still fails at once (the check on 15001), and one that is
/// reset fails with the reset.
const REPLY_WAIT_200_PODS: Duration = Duration::from_secs(20);

fn request(s: &mut TcpStream, i: u64, wait: Duration) -> Result<(), String> {
    s.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    let req = format!("{i:032}");
    s.write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    let mut resp = [0u8; 32];
    s.read_exact(&mut resp).map_err(|e| format!("read: {e}"))?;
    if resp != req.as_bytes() {
        return Err("wrong reply".into());
    }
    Ok(())
}

fn error_code(out: &Output) -> i64 {
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["code"].as_i64().unwrap_or(-1)
}

fn listeners(pod: &Pod) -> usize {
    pod.netns
        .exec(
            "ss",
            &[
                "-Htln",
                "( sport = :15001 or sport = :15006 or sport = :15008 )",
            ],
        )
        .unwrap()
        .lines()
        .count()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// ADD fails with a retryable error while no proxy is connected and succeeds
/// once one is; then 200 pods in a row, each with an app that connects the
/// instant ADD returns and is captured; DEL removes a pod's listeners at once.
#[test]
fn cni_add_captures_the_app_from_its_first_connection() {
    let _drill = support::one_drill_at_a_time();
    run_isolated("cni_add_captures_the_app_from_its_first_connection", || {
        let env = Env::new("drill-cni");
        let mut vn = VirtualNode::build(1, 1).unwrap();
        let server = vn.pod(0).clone();
        let addr = SocketAddr::new(server.ip(false), 8080);
        let l = server
            .netns
            .run(|| ringway_testbed::traffic::listen(addr))
            .unwrap();
        let srv = EchoServer::start(l);
        let _agent = env.agent();

        // No proxy yet: ADD must fail, retryably (code 11).
        let first = vn.add_pod().unwrap();
        let out = env.cni_call("ADD", &first, "uid-first");
        assert!(!out.status.success(), "ADD must fail without a proxy");
        assert_eq!(
            error_code(&out),
            11,
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let (_proxy, proxy_log) = env.proxy("127.0.0.1:15021");
        let out = env.cni_call("ADD", &first, "uid-first");
        assert!(
            out.status.success(),
            "retried ADD: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(result["cniVersion"], "1.0.0");
        assert_eq!(result["ips"][0]["address"], format!("{}/24", first.ipv4));

        // 200 pods in a row.
        let mut latencies = Vec::new();
        for i in 0..200u64 {
            let pod = vn.add_pod().unwrap();
            // Ten ARP requests for the server before the kernel gives up
            // (three by default): an address given up fails the proxy's
            // upstream connect at once (host unreachable), and the pod's
            // first connection with it. See `REPLY_WAIT_200_PODS`.
            pod.netns
                .sysctl("net.ipv4.neigh.eth0.mcast_solicit", "10")
                .unwrap();
            let uid = format!("uid-{i}");
            let t0 = Instant::now();
            let out = env.cni_call("ADD", &pod, &uid);
            let took = t0.elapsed();
            assert!(
                out.status.success(),
                "ADD {i}: {} {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            latencies.push(took.as_secs_f64() * 1e3);
            // The app starts now: its very first connection must be captured.
            let proof = pod.netns.run(|| -> Result<usize, String> {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
                    .map_err(|e| format!("connect: {e}"))?;
                request(&mut s, i, REPLY_WAIT_200_PODS)?;
                let local = s.local_addr().map_err(|e| e.to_string())?;
                // While it is open, the proxy's end of it sits on 15001 in this pod.
                let ss = std::process::Command::new("ss")
                    .args(["-Htn", "state", "established", "( sport = :15001 )"])
                    .output()
                    .map_err(|e| e.to_string())?;
                let text = String::from_utf8_lossy(&ss.stdout).to_string();
                Ok(text
                    .lines()
                    .filter(|l| l.contains(&format!(":{}", local.port())))
                    .count())
            });
            if proof != Ok(1) {
                // Seen twice in CI with a 3 s read timeout; the second
                // time at pod 199 of 200, whose ARP for the server had
                // FAILED. With 200 pods on the bridge each broadcast is
                // queued once per port, and the kernel's input queue
                // overflowed (`/proc/net/softnet_stat` counts drops in the
                // loop's last second, with this test alone). Hence ten ARP
                // tries and `REPLY_WAIT_200_PODS`. Should it come back, say
                // where the connection stood.
                let sockets = |pod: &ringway_testbed::Pod| {
                    pod.netns
                        .ip(&["neigh", "show"])
                        .unwrap_or_else(|e| e.to_string())
                        + &pod.netns.run(|| {
                            std::process::Command::new("ss")
                                .args(["-Htanoi"])
                                .output()
                                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                                .unwrap_or_else(|e| e.to_string())
                        })
                };
                let log = std::fs::read_to_string(&proxy_log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                panic!(
                    "pod {i}: first connection was not captured: {proof:?}\n\
                     --- pod {i}: neighbours and sockets\n{}\n\
                     --- server pod\n{}\n\
                     --- echo server accepted {} connections\n\
                     --- proxy log, last 40 lines (newest first)\n{}",
                    sockets(&pod),
                    sockets(&server),
                    srv.connections(),
                    tail.join("\n")
                );
            }
        }
        latencies.sort_by(|a, b| a.total_cmp(b));
        eprintln!(
            "CNI ADD latency over 200 pods: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
            latencies[latencies.len() - 1]
        );

        // The agent's histogram saw every ADD (the failed first one included).
        let metrics = scrape(AGENT_CONTROL.parse().unwrap()).unwrap();
        let adds_ok = prom::value(
            &metrics,
            "ringway_cni_request_duration_seconds_count",
            &["op=\"add\"", "outcome=\"ok\""],
        );
        assert_eq!(adds_ok, Some(201.0), "{metrics}");
        assert!(
            metrics.contains("ringway_cni_requests_total{op=\"add\",outcome=\"error\"} 1"),
            "{metrics}"
        );

        // DEL: the pod's listeners are gone when DEL returns; others untouched.
        let victim = vn.pods[2].clone();
        let other = vn.pods[3].clone();
        assert!(listeners(&victim) > 0 && listeners(&other) > 0);
        let out = env.cni_call("DEL", &victim, "uid-0");
        assert!(
            out.status.success(),
            "DEL: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert_eq!(
            listeners(&victim),
            0,
            "listeners must be gone when DEL returns"
        );
        assert!(listeners(&other) > 0, "other pods untouched");
        let ok = other.netns.run(|| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
                .map_err(|e| e.to_string())?;
            request(&mut s, 7, REPLY_WAIT_200_PODS)
        });
        assert_eq!(ok, Ok(()));
        // DEL again: idempotent.
        assert!(env.cni_call("DEL", &victim, "uid-0").status.success());
        drop(srv);
    });
}

/// Restarting the agent under load: no connection fails, the rules are not
/// touched, and the proxy receives a fresh snapshot.
#[test]
fn agent_restart_under_load_is_invisible_to_traffic() {
    let _drill = support::one_drill_at_a_time();
    run_isolated("agent_restart_under_load_is_invisible_to_traffic", || {
        let env = Env::new("drill-agent");
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let _pauses = [a.start_pause().unwrap(), b.start_pause().unwrap()];
        let addr = SocketAddr::new(b.ip(false), 8080);
        let l = b
            .netns
            .run(|| ringway_testbed::traffic::listen(addr))
            .unwrap();
        let srv = EchoServer::start(l);
        let agent = env.agent();
        let (_proxy, proxy_log) = env.proxy("127.0.0.1:15021");
        for (i, p) in [&a, &b].into_iter().enumerate() {
            let out = env.cni_call("ADD", p, &format!("uid-{i}"));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let rules = |p: &Pod| {
            p.netns
                .exec("nft", &["-a", "list", "table", "inet", "ringway"])
                .unwrap()
        };
        let before = (rules(&a), rules(&b));

        let attempted = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
        let t_load = Instant::now();
        let mut loaders = Vec::new();
        for t in 0..4u64 {
            let (att, fail, fe) = (attempted.clone(), failed.clone(), first_error.clone());
            loaders.push(a.netns.spawn(move || {
                let t0 = Instant::now();
                let mut i = t << 40;
                while t0.elapsed() < Duration::from_secs(4) {
                    att.fetch_add(1, Ordering::Relaxed);
                    let r = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
                        .map_err(|e| format!("connect: {e}"))
                        .and_then(|mut s| request(&mut s, i, REPLY_WAIT));
                    if let Err(e) = r {
                        fail.fetch_add(1, Ordering::Relaxed);
                        fe.lock().unwrap().get_or_insert(e);
                    }
                    i += 1;
                    // Paced at 250 connections/s per thread (1,000/s in all),
                    // catching up without sleeping when behind.
                    let next = t0 + Duration::from_millis(4) * ((i & 0xff_ffff) as u32);
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
            }));
        }
        // The load is flowing (a fifth of a second at its pace) before the
        // agent goes.
        assert!(
            ringway_testbed::wait_until(Duration::from_secs(5), || {
                attempted.load(Ordering::Relaxed) >= 200
            }),
            "the load never started"
        );
        let at_term = attempted.load(Ordering::Relaxed);
        let status = agent.sigterm_and_wait();
        assert!(status.success(), "agent exit: {status}");
        let _agent2 = env.agent();
        for l in loaders {
            l.join().unwrap();
        }
        let elapsed = t_load.elapsed().as_secs_f64();
        let (attempted, failed) = (
            attempted.load(Ordering::Relaxed),
            failed.load(Ordering::Relaxed),
        );
        eprintln!(
            "agent restart drill: {attempted} connections in {elapsed:.1} s, {failed} failed"
        );
        assert!(
            attempted >= at_term + 200,
            "connections must keep coming through the agent's restart: {at_term} before it, {attempted} in all"
        );
        assert_eq!(
            failed,
            0,
            "first failure: {:?}",
            first_error.lock().unwrap()
        );
        assert_eq!(
            (rules(&a), rules(&b)),
            before,
            "rules must be untouched (same handles)"
        );
        // The proxy reconnected and applied a second snapshot.
        let snapshots = || {
            std::fs::read_to_string(&proxy_log)
                .unwrap()
                .matches("ZDS snapshot applied")
                .count()
        };
        if !wait_until(PATIENCE, || snapshots() >= 2) {
            panic!(
                "no second snapshot:\n{}",
                std::fs::read_to_string(&proxy_log).unwrap()
            );
        }
        drop(srv);
    });
}

/// A node agent restart as Kubernetes does it (the container is down for a few
/// seconds, then a new one binds the sockets): the proxy notices the new socket
/// at once (its reconnect backoff is capped well under a second), so a pod ADD
/// that arrives right after the new agent starts succeeds after at most one
/// retry by the runtime. With the old backoff (doubling to 15 s) the proxy was
/// still asleep and ADDs failed with code 11 for up to 15 s.
#[test]
fn adds_right_after_an_agent_restart_succeed_after_at_most_one_retry() {
    let _drill = support::one_drill_at_a_time();
    run_isolated(
        "adds_right_after_an_agent_restart_succeed_after_at_most_one_retry",
        || {
            let env = Env::new("drill-agent-readd");
            let vn = VirtualNode::build(1, 2).unwrap();
            let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
            let _pauses = [a.start_pause().unwrap(), b.start_pause().unwrap()];
            let agent = env.agent();
            let (_proxy, proxy_log) = env.proxy("127.0.0.1:15021");
            let out = env.cni_call("ADD", &a, "uid-a");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );

            let status = agent.sigterm_and_wait();
            assert!(status.success(), "agent exit: {status}");
            // The outage a container restart takes; the proxy keeps trying meanwhile.
            std::thread::sleep(Duration::from_secs(5));
            let t_restart = Instant::now();
            let _agent2 = env.agent();
            let mut attempts = Vec::new();
            for attempt in 1..=2 {
                let out = env.cni_call("ADD", &b, "uid-b");
                attempts.push((t_restart.elapsed(), error_code(&out)));
                if out.status.success() {
                    break;
                }
                assert_eq!(
                    error_code(&out),
                    11,
                    "an ADD during the reconnect is retryable: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
                if attempt == 1 {
                    // The runtime's retry of a failed sandbox comes no sooner.
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            eprintln!(
                "ADD attempts after the agent restart (time since restart, code): {attempts:?}"
            );
            let log = std::fs::read_to_string(&proxy_log).unwrap();
            assert!(
                attempts.last().is_some_and(|(_, code)| *code == -1),
                "the ADD still failed after one retry: {attempts:?}\nproxy log:\n{log}"
            );
            assert!(listeners(&b) > 0, "pod b has its listeners");
        },
    );
}

/// A DEL that arrives while no proxy is connected reaches the proxy as a
/// removal in the next snapshot: proxy down, DEL, proxy up, and the pod's
/// listeners do not come back while the other pod's do.
#[test]
fn a_del_missed_by_the_proxy_is_in_the_next_snapshot() {
    let _drill = support::one_drill_at_a_time();
    run_isolated("a_del_missed_by_the_proxy_is_in_the_next_snapshot", || {
        let env = Env::new("drill-missed-del");
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let _pauses = [a.start_pause().unwrap(), b.start_pause().unwrap()];
        let _agent = env.agent();
        let (proxy, _) = env.proxy("127.0.0.1:15021");
        for (p, uid) in [(&a, "uid-a"), (&b, "uid-b")] {
            let out = env.cni_call("ADD", p, uid);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        assert!(listeners(&a) > 0 && listeners(&b) > 0);

        let status = proxy.sigterm_and_wait();
        assert!(status.success(), "proxy exit: {status}");
        let out = env.cni_call("DEL", &a, "uid-a");
        assert!(
            out.status.success(),
            "DEL without a proxy: {}",
            String::from_utf8_lossy(&out.stdout)
        );

        let (_proxy2, log) = env.proxy("127.0.0.1:15021");
        // Ready means the snapshot is applied and no pod is pending.
        let log = std::fs::read_to_string(log).unwrap();
        assert!(listeners(&b) > 0, "pod b is served again:\n{log}");
        assert_eq!(
            listeners(&a),
            0,
            "the deleted pod's listeners came back:\n{log}"
        );
        assert!(
            !log.contains("uid-a"),
            "the new proxy heard of pod a:\n{log}"
        );
    });
}
