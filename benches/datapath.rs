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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let secs = env_u64("RINGWAY_BENCH_SECS", 3) as f64;
    let rounds = env_u64("RINGWAY_BENCH_ROUNDS", 3) as usize;
    run_isolated("bench_datapath", || {
        let vn = VirtualNode::build(1, 2).expect("virtual node");
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let settings = ProxySettings {
            capture_mode: CaptureMode::Tproxy,
            datapath: match std::env::var("RINGWAY_BENCH_DATAPATH").as_deref() {
                Ok("epoll") => Datapath::Epoll,
                _ => Datapath::Auto,
            },
            workers: env_u64("RINGWAY_BENCH_WORKERS", 0) as usize,
            pipe_size: env_u64("RINGWAY_BENCH_PIPE", 1 << 20) as usize,
            ..ProxySettings::default()
        };
        let proxy = Proxy::start(settings).expect("proxy");
        // Direct traffic uses port 7000, which the proxied pods... capture
        // applies to all TCP, so direct runs happen before capture is
        // installed each round: we install capture on a second pair instead.
        let mut vn2 = vn;
        let c = vn2.add_pod().expect("pod");
        let d = vn2.add_pod().expect("pod");
        for p in [&c, &d] {
            capture(p, CaptureMode::Tproxy);
            proxy
                .add_pod(&p.name, p.netns.dup_fd().expect("fd"))
                .expect("add pod");
        }
        let mut direct = Vec::new();
        let mut proxied = Vec::new();
        let mut cpu_per_gb = Vec::new();
        for round in 0..rounds {
            let (bytes, t) = one_stream(&a, &b, 7000 + round as u16, secs);
            let gbps = bytes as f64 * 8.0 / t.as_secs_f64() / 1e9;
            direct.push(gbps);
            let cpu0 = cpu_seconds_of_threads("ringway-worker");
            let (bytes, t) = one_stream(&c, &d, 7100 + round as u16, secs);
            let cpu = cpu_seconds_of_threads("ringway-worker") - cpu0;
            let pgbps = bytes as f64 * 8.0 / t.as_secs_f64() / 1e9;
            proxied.push(pgbps);
            cpu_per_gb.push(cpu / (bytes as f64 / 1e9));
            eprintln!(
                "round {}: direct {:.2} Gbit/s, ringway {:.2} Gbit/s ({:.2}x), proxy {:.3} CPU-s/GB",
                round + 1,
                gbps,
                pgbps,
                pgbps / gbps,
                cpu / (bytes as f64 / 1e9)
            );
        }
        let (d, p, c) = (median(&direct), median(&proxied), median(&cpu_per_gb));
        println!("\n| one stream, pod-a -> pod-b | median of {rounds} |");
        println!("| --- | --- |");
        println!("| direct | {d:.2} Gbit/s |");
        println!(
            "| ringway ({}, tproxy) | {p:.2} Gbit/s ({:.2}x direct) |",
            proxy.backend(),
            p / d
        );
        println!("| proxy CPU-s per GB | {c:.3} |");
        proxy.shutdown();
    });
}
