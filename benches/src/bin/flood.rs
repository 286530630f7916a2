//! `ringway-bench-flood`: the flood generator of the `hbone_preauth_flood`
//! scenario, a process of its own (its fds do not count against the load
//! generator's limit, its CPU is not the proxy's). Started by the bench
//! inside the attacking pod's network namespace:
//!
//! ```text
//! ringway-bench-flood TARGET_IP:PORT COUNT SOURCES CPU SECS REOPEN
//! ```
//!
//! opens `COUNT` connections to `TARGET` (one pod's 15008), cycling over the
//! comma-separated `SOURCES` addresses: even ones stay idle (TCP only), odd
//! ones send a real TLS ClientHello and then nothing (half-open TLS). It
//! prints one JSON line `{"phase":"burst",...}` once all are attempted, then
//! keeps the pressure on: every connection the proxy closes is opened again,
//! at most `REOPEN x COUNT` reopenings in all (0: the burst only, held), until a line arrives on stdin, stdin
//! closes, or `SECS` pass; then it prints `{"phase":"end",...}` and exits.
//! Pinned to CPU `CPU` when the machine has it. Every connect is bounded (2 s).

use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// A ClientHello as a real client sends it (rustls, TLS 1.2 and 1.3).
fn client_hello() -> anyhow::Result<Vec<u8>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from("flood.invalid")?;
    let mut c = rustls::ClientConnection::new(Arc::new(cfg), name)?;
    let mut out = Vec::new();
    while c.wants_write() {
        c.write_tls(&mut out)?;
    }
    Ok(out)
}

#[derive(Default)]
struct Counts {
    attempted: u64,
    opened: u64,
    failed: u64,
    reopened: u64,
    closed_by_proxy: u64,
    first_error: Option<String>,
}

fn open(src: IpAddr, target: SocketAddr, hello: Option<&[u8]>) -> std::io::Result<TcpStream> {
    let s = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
    // Closing sends RST: no TIME_WAIT piles up over rounds.
    s.set_linger(Some(Duration::ZERO))?;
    s.connect_timeout(&SockAddr::from(target), Duration::from_secs(2))?;
    let mut t: TcpStream = s.into();
    if let Some(h) = hello {
        t.set_write_timeout(Some(Duration::from_secs(2)))?;
        t.write_all(h)?;
    }
    t.set_nonblocking(true)?;
    Ok(t)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 7 {
        bail!("usage: ringway-bench-flood TARGET_IP:PORT COUNT SOURCES CPU SECS REOPEN");
    }
    let target: SocketAddr = args[1].parse().context("TARGET")?;
    let count: u64 = args[2].parse().context("COUNT")?;
    let sources: Vec<IpAddr> = args[3]
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .context("SOURCES")?;
    if sources.is_empty() {
        bail!("SOURCES: at least one address");
    }
    let cpu: usize = args[4].parse().context("CPU")?;
    let secs: f64 = args[5].parse().context("SECS")?;
    // Bound on reopenings, as a multiple of the burst's count.
    let reopen: u64 = args[6].parse().context("REOPEN")?;
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let mut set = nix::sched::CpuSet::new();
    let pinned = set.set(cpu).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).is_ok();
    // One fd per connection: the soft limit up to the hard one.
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let hello = client_hello()?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            stop.store(true, Ordering::Relaxed);
        });
    }
    let mut c = Counts::default();
    let kind = |i: u64| (i % 2 == 1).then_some(hello.as_slice());
    let mut held: Vec<(u64, TcpStream)> = Vec::with_capacity(count as usize);
    let t0 = Instant::now();
    for i in 0..count {
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            break;
        }
        c.attempted += 1;
        match open(sources[i as usize % sources.len()], target, kind(i)) {
            Ok(s) => {
                c.opened += 1;
                held.push((i, s));
            }
            Err(e) => {
                c.failed += 1;
                c.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    let burst_secs = t0.elapsed().as_secs_f64();
    let line = |phase: &str, c: &Counts, held: usize| -> anyhow::Result<String> {
        Ok(format!(
            "{{\"phase\":\"{phase}\",\"attempted\":{},\"opened\":{},\"failed\":{},\"reopened\":{},\
             \"closed_by_proxy\":{},\"held\":{held},\"burst_secs\":{burst_secs:.3},\"pinned\":{pinned},\
             \"first_error\":{}}}",
            c.attempted,
            c.opened,
            c.failed,
            c.reopened,
            c.closed_by_proxy,
            serde_json::to_string(&c.first_error)?,
        ))
    };
    println!("{}", line("burst", &c, held.len())?);
    std::io::stdout().flush()?;
    // Keep the pressure on: what the proxy closed is opened again.
    let mut next = count;
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        // Which connections have something to read (a ServerHello, FIN, RST).
        let ready: Vec<usize> = {
            let mut pfds: Vec<nix::poll::PollFd> = held
                .iter()
                .map(|(_, s)| nix::poll::PollFd::new(s.as_fd(), nix::poll::PollFlags::POLLIN))
                .collect();
            let _ = nix::poll::poll(&mut pfds, nix::poll::PollTimeout::from(200u16));
            pfds.iter()
                .enumerate()
                .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
                .map(|(k, _)| k)
                .collect()
        };
        let mut closed = Vec::new();
        for k in ready {
            match held[k].1.read(&mut buf) {
                Ok(0) => closed.push(k),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => closed.push(k),
            }
        }
        for k in closed.into_iter().rev() {
            held.swap_remove(k);
            c.closed_by_proxy += 1;
            if c.reopened >= reopen * count || stop.load(Ordering::Relaxed) {
                continue;
            }
            c.attempted += 1;
            c.reopened += 1;
            match open(sources[next as usize % sources.len()], target, kind(next)) {
                Ok(s) => held.push((next, s)),
                Err(e) => {
                    c.failed += 1;
                    c.first_error.get_or_insert_with(|| e.to_string());
                }
            }
            next += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    println!("{}", line("end", &c, held.len())?);
    std::io::stdout().flush()?;
    Ok(())
}
