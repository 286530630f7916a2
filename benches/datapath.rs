//! Datapath benchmark: direct pod-a -> pod-b versus the same through ringway
//! (outbound hop at a, inbound hop at b, one proxy process carrying both),
//! on the virtual node. Prints one-stream throughput, the ratio to direct,
//! and the proxy workers' CPU-seconds per GB moved. Figures, not assertions.
//!
//! `cargo bench -p ringway-benches --bench datapath` (root). Environment:
//! `RINGWAY_BENCH_SECS` seconds per measurement (default 3),
//! `RINGWAY_BENCH_ROUNDS` rounds alternating the scenarios (default 3).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringway_benches::{capture, cpu_seconds_of_threads, median};
use ringway_config::{CaptureMode, Datapath, ProxySettings};
use ringway_proxy::Proxy;
use ringway_testbed::traffic::{connect, listen};
use ringway_testbed::{run_isolated, Pod, VirtualNode};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Streams from `a` to `b:port` for `secs`; returns bytes the server read.
fn one_stream(a: &Pod, b: &Pod, port: u16, secs: f64) -> (u64, Duration) {
    let addr = SocketAddr::new(b.ip(false), port);
    let l = b.netns.run(|| listen(addr)).expect("listen");
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n as u64,
                Err(e) => panic!("server read: {e}"),
            }
        }
        total
    });
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let client = a.netns.spawn(move || {
        let mut s = connect(addr, Duration::from_secs(10)).expect("connect");
        let buf = vec![0x5au8; 256 * 1024];
        let t0 = Instant::now();
        while !stop2.load(Ordering::Relaxed) {
            s.write_all(&buf).expect("client write");
        }
        s.shutdown(Shutdown::Write).expect("shutdown");
        let mut sink = [0u8; 16];
        let _ = s.read(&mut sink);
        t0.elapsed()
    });
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let elapsed = client.join().expect("client");
    let bytes = server.join().expect("server");
    (bytes, elapsed)
}

fn process_cpu_seconds() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(u.user_time()) + tv(u.system_time())
}

fn ncpus() -> f64 {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1) as f64
}

struct Scenario {
    name: &'static str,
    /// None = direct (no proxy).
    settings: Option<ProxySettings>,
    gbps: Vec<f64>,
    cpu_per_gb: Vec<f64>,
}

fn proxied(mode: CaptureMode, fast_path: bool) -> ProxySettings {
    ProxySettings {
        capture_mode: mode,
        same_node_fast_path: fast_path,
        datapath: match std::env::var("RINGWAY_BENCH_DATAPATH").as_deref() {
            Ok("epoll") => Datapath::Epoll,
            _ => Datapath::Auto,
        },
        workers: env_u64("RINGWAY_BENCH_WORKERS", 0) as usize,
        pipe_size: env_u64("RINGWAY_BENCH_PIPE", 1 << 20) as usize,
        ..ProxySettings::default()
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let secs = env_u64("RINGWAY_BENCH_SECS", 3) as f64;
    let rounds = env_u64("RINGWAY_BENCH_ROUNDS", 3) as usize;
    let mut scenarios = vec![
        Scenario {
            name: "direct (no proxy)",
            settings: None,
            gbps: vec![],
            cpu_per_gb: vec![],
        },
        Scenario {
            name: "ringway tproxy, same-node fast path (default)",
            settings: Some(proxied(CaptureMode::Tproxy, true)),
            gbps: vec![],
            cpu_per_gb: vec![],
        },
        Scenario {
            name: "ringway tproxy, both hops (captured at a and at b)",
            settings: Some(proxied(CaptureMode::Tproxy, false)),
            gbps: vec![],
            cpu_per_gb: vec![],
        },
        Scenario {
            name: "ringway redirect, both hops",
            settings: Some(proxied(CaptureMode::Redirect, false)),
            gbps: vec![],
            cpu_per_gb: vec![],
        },
    ];
    let mut backend = String::new();
    run_isolated("bench_datapath", || {
        let mut vn = VirtualNode::build(1, 2).expect("virtual node");
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let c = vn.add_pod().expect("pod");
        let d = vn.add_pod().expect("pod");
        let mut port = 7000u16;
        for round in 0..rounds {
            for sc in scenarios.iter_mut() {
                port += 1;
                let proc0 = process_cpu_seconds();
                let (bytes, t, cpu) = match &sc.settings {
                    None => {
                        let (bytes, t) = one_stream(&a, &b, port, secs);
                        (bytes, t, f64::NAN)
                    }
                    Some(settings) => {
                        let proxy = Proxy::start(settings.clone()).expect("proxy");
                        backend = proxy.backend().to_string();
                        for p in [&c, &d] {
                            capture(p, settings.capture_mode);
                            proxy
                                .add_pod(&p.name, p.netns.dup_fd().expect("fd"))
                                .expect("add pod");
                        }
                        let cpu0 = cpu_seconds_of_threads("ringway-worker");
                        let (bytes, t) = one_stream(&c, &d, port, secs);
                        let cpu = cpu_seconds_of_threads("ringway-worker") - cpu0;
                        proxy.shutdown();
                        (bytes, t, cpu)
                    }
                };
                let proc_cpu = process_cpu_seconds() - proc0;
                let gbps = bytes as f64 * 8.0 / t.as_secs_f64() / 1e9;
                let per_gb = cpu / (bytes as f64 / 1e9);
                eprintln!(
                    "round {}: {:<52} {:6.2} Gbit/s  {:.3} CPU-s/GB  (whole process: {:.2} CPU-s/GB, {:.0}% of the machine)",
                    round + 1,
                    sc.name,
                    gbps,
                    per_gb,
                    proc_cpu / (bytes as f64 / 1e9),
                    100.0 * proc_cpu / t.as_secs_f64() / ncpus()
                );
                sc.gbps.push(gbps);
                sc.cpu_per_gb.push(per_gb);
            }
        }
    });
    let direct = median(&scenarios[0].gbps);
    println!("\n## One stream, pod-a -> pod-b on one node (median of {rounds} rounds, {secs} s each, datapath {backend})\n");
    println!(
        "| scenario | throughput | vs direct | proxy CPU-s per GB | spread (min-max Gbit/s) |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for sc in &scenarios {
        let g = median(&sc.gbps);
        let lo = sc.gbps.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = sc.gbps.iter().cloned().fold(0.0, f64::max);
        let cpu = median(&sc.cpu_per_gb);
        let cpu = if cpu.is_nan() {
            "-".to_string()
        } else {
            format!("{cpu:.3}")
        };
        println!(
            "| {} | {g:.2} Gbit/s | {:.2}x | {cpu} | {lo:.2}-{hi:.2} |",
            sc.name,
            g / direct
        );
    }
}
