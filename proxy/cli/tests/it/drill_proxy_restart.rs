//! Drill: restart the proxy under continuous load. A new `ringway proxy`
//! process starts beside the old one, gets the snapshot and binds the same
//! ports (SO_REUSEPORT); the old one gets SIGTERM, closes its listeners at
//! once and drains. Not one of the new connections attempted meanwhile may
//! fail, and a long-lived connection survives because the drain period
//! outlasts it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support;
use ringway_config::ProxySettings;

use ringway_testbed::traffic::EchoServer;
use ringway_testbed::{run_isolated, VirtualNode};
use support::{ready, serve_snapshots};

struct ProxyProc {
    child: Child,
    ready_addr: SocketAddr,
}

impl ProxyProc {
    fn start(socket: &Path, ready_addr: &str, config: &Path) -> ProxyProc {
        let child = Command::new(env!("CARGO_BIN_EXE_ringway"))
            .args([
                "--log-format",
                "text",
                "--log",
                "warn",
                "proxy",
                "--zds-socket",
            ])
            .arg(socket)
            .args(["--readiness-addr", ready_addr])
            // Two proxies share this netns during the drill: metrics and admin
            // on ephemeral ports so the second one can bind.
            .args([
                "--metrics-addr",
                "127.0.0.1:0",
                "--admin-addr",
                "127.0.0.1:0",
                "--config",
            ])
            .arg(config)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn ringway proxy");
        ProxyProc {
            child,
            ready_addr: ready_addr.parse().unwrap(),
        }
    }

    fn wait_ready(&self) {
        ringway_testbed::wait_for("the proxy's readiness", Duration::from_secs(60), || {
            ready(self.ready_addr)
        });
    }

    fn sigterm(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }
}

impl Drop for ProxyProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn one_request(addr: SocketAddr, i: u64) -> Result<(), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))
        .map_err(|e| e.to_string())?;
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

#[test]
fn proxy_restart_under_load_drops_no_connection_tproxy() {
    // Before `run_isolated`, as every drill takes it (one lock order).
    let _drill = support::one_drill_at_a_time();
    run_isolated(
        "proxy_restart_under_load_drops_no_connection_tproxy",
        || drill(ringway_config::CaptureMode::Tproxy),
    );
}

/// REDIRECT mode is the stricter case: a SYN that finds no listener is
/// answered with a reset (connection refused), not dropped and retransmitted.
#[test]
fn proxy_restart_under_load_drops_no_connection_redirect() {
    // Before `run_isolated`, as every drill takes it (one lock order).
    let _drill = support::one_drill_at_a_time();
    run_isolated(
        "proxy_restart_under_load_drops_no_connection_redirect",
        || drill(ringway_config::CaptureMode::Redirect),
    );
}

fn drill(mode: ringway_config::CaptureMode) {
    {
        let dir = ringway_testbed::TempDir::new(&format!("drill-{mode}"));
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let settings = ProxySettings {
            drain_period: Duration::from_secs(8),
            capture_mode: mode,
            ..ProxySettings::default()
        };
        let spec = ringway_proxy::capture_spec(&settings);
        for p in [&a, &b] {
            ringway_redirect::apply(p.netns.fd(), &spec).unwrap();
            p.netns.sysctl("net.ipv4.tcp_migrate_req", "1").unwrap();
        }
        let config = dir.join("proxy.yaml");
        std::fs::write(
            &config,
            format!("proxy:\n  drainPeriod: 8\n  workers: 2\n  captureMode: {mode}\n"),
        )
        .unwrap();
        let sock = dir.join("zds.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let agent = serve_snapshots(&sock, vec![a.clone(), b.clone()], stop.clone());
        let addr = SocketAddr::new(b.ip(false), 8080);
        let l = b
            .netns
            .run(|| ringway_testbed::traffic::listen(addr))
            .unwrap();
        let server = EchoServer::start(l);

        let old = ProxyProc::start(&sock, "127.0.0.1:15021", &config);
        old.wait_ready();

        // A long-lived connection: one message every 50 ms for 3 s.
        let long = a.netns.spawn(move || -> Result<u64, String> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
                .map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(3)))
                .map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            let mut n = 0u64;
            while t0.elapsed() < Duration::from_secs(3) {
                let msg = format!("{n:032}");
                s.write_all(msg.as_bytes())
                    .map_err(|e| format!("long write {n}: {e}"))?;
                let mut back = [0u8; 32];
                s.read_exact(&mut back)
                    .map_err(|e| format!("long read {n}: {e}"))?;
                if back != msg.as_bytes() {
                    return Err(format!("long reply {n} corrupted"));
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            Ok(n)
        });

        // Load: >= 500 new connections per second for 4 s, on 4 threads.
        let attempted = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
        let load_start = Instant::now();
        let mut loaders = Vec::new();
        for t in 0..4u64 {
            let (att, fail, fe) = (attempted.clone(), failed.clone(), first_error.clone());
            loaders.push(a.netns.spawn(move || {
                let t0 = Instant::now();
                let mut i = t << 40;
                while t0.elapsed() < Duration::from_secs(4) {
                    att.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = one_request(addr, i) {
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
        std::thread::sleep(Duration::from_millis(800));
        let new = ProxyProc::start(&sock, "127.0.0.1:15022", &config);
        new.wait_ready();
        old.sigterm();
        for l in loaders {
            l.join().unwrap();
        }
        let elapsed = load_start.elapsed().as_secs_f64();
        let long = long.join().unwrap();
        let mut old = old;
        let status = old.child.wait().unwrap();
        stop.store(true, Ordering::SeqCst);
        let _ = agent.join();
        drop(server);
        let attempted = attempted.load(Ordering::Relaxed);
        let failed = failed.load(Ordering::Relaxed);
        eprintln!(
            "drill: {attempted} connections in {elapsed:.1} s ({:.0}/s), {failed} failed; long-lived: {long:?}",
            attempted as f64 / elapsed
        );
        assert!(
            attempted as f64 / elapsed >= 500.0,
            "load too low to prove anything: {attempted} in {elapsed:.1} s"
        );
        assert_eq!(
            failed,
            0,
            "first failure: {:?}",
            first_error.lock().unwrap()
        );
        let n = long.expect("the long-lived connection must survive the restart");
        assert!(n >= 40, "long-lived connection exchanged only {n} messages");
        assert!(status.success(), "old proxy exit: {status}");
        drop(new);
        drop(dir);
    }
}
