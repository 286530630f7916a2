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
//! keeps the pressure on: every connection the proxy closes (or that failed
//! to connect) is opened again,
//! at most `REOPEN x COUNT` reopenings in all (0: the burst only, held), until a line arrives on stdin, stdin
//! closes, or `SECS` pass; then it prints `{"phase":"end",...}` and exits.
//! Pinned to CPU `CPU` when the machine has it. Connects are non-blocking,
//! up to 256 in flight, each bounded (2 s): a target that stops accepting
//! (its backlog full) slows the flood down only by that bound. Readiness
//! comes from epoll, so holding 10,000 connections costs the generator
//! nothing between events.

use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
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

/// Connects in flight at once (an attacker does not wait for each).
const IN_FLIGHT: usize = 256;
/// Bound on one connect: a connection the target neither accepts into its
/// backlog nor refuses within this counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One connection of the flood: connecting (non-blocking) or established.
struct Conn {
    i: u64,
    s: Socket,
    since: Instant,
    connecting: bool,
}

/// Starts a non-blocking connect from `src` to `target`.
fn start(i: u64, src: IpAddr, target: SocketAddr) -> std::io::Result<Conn> {
    let s = Socket::new(
        Domain::for_address(target),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    s.bind(&SockAddr::from(SocketAddr::new(src, 0)))?;
    // Closing sends RST: no TIME_WAIT piles up over rounds.
    s.set_linger(Some(Duration::ZERO))?;
    s.set_nonblocking(true)?;
    match s.connect(&SockAddr::from(target)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(nix::libc::EINPROGRESS) => {}
        Err(e) => return Err(e),
    }
    Ok(Conn {
        i,
        s,
        since: Instant::now(),
        connecting: true,
    })
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
    let source = |i: u64| sources[i as usize % sources.len()];
    // Connections by slot; the slot is the epoll token, so a readiness
    // costs O(1) and a loop costs O(ready + connecting), never O(held): a
    // poll(2) over every held fd per event made this process burn most of
    // a core at 10,000 connections, CPU the bench then blamed on the proxy.
    let mut slots: Vec<Option<Conn>> = Vec::with_capacity(count as usize);
    let mut free: Vec<usize> = Vec::new();
    let mut connecting: Vec<usize> = Vec::with_capacity(IN_FLIGHT);
    // Established connections: the live slots that are not connecting.
    let held = |slots: &Vec<Option<Conn>>, free: &Vec<usize>, connecting: &Vec<usize>| {
        slots.len() - free.len() - connecting.len()
    };
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).context("epoll_create")?;
    let mut events = vec![EpollEvent::empty(); 1024];
    let t0 = Instant::now();
    let mut next = 0u64;
    // Connections to open again once the burst is through (closed by the
    // proxy, or failed), within the reopen budget.
    let mut owed = 0u64;
    let mut burst_secs: Option<f64> = None;
    let mut buf = [0u8; 4096];
    let line = |phase: &str, c: &Counts, held: usize, burst_secs: f64| -> anyhow::Result<String> {
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
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        // Start connects, at most IN_FLIGHT at once: the burst's first, then
        // what is owed (and allowed) once the burst is through.
        while connecting.len() < IN_FLIGHT {
            let i = if next < count {
                next
            } else if burst_secs.is_some() && owed > 0 && c.reopened < reopen * count {
                owed -= 1;
                c.reopened += 1;
                next
            } else {
                break;
            };
            next += 1;
            c.attempted += 1;
            let k = match start(i, source(i), target) {
                Ok(k) => k,
                Err(e) => {
                    c.failed += 1;
                    c.first_error.get_or_insert_with(|| e.to_string());
                    continue;
                }
            };
            let slot = free.pop().unwrap_or_else(|| {
                slots.push(None);
                slots.len() - 1
            });
            ep.add(&k.s, EpollEvent::new(EpollFlags::EPOLLOUT, slot as u64))
                .context("epoll_ctl ADD")?;
            slots[slot] = Some(k);
            connecting.push(slot);
        }
        // Which connects completed and which connections have something to
        // read (a ServerHello, FIN, RST).
        let n = match ep.wait(&mut events, EpollTimeout::from(100u16)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => return Err(e).context("epoll_wait"),
        };
        let mut gone = Vec::new();
        for ev in &events[..n] {
            let slot = ev.data() as usize;
            let Some(conn) = slots[slot].as_mut() else {
                continue;
            };
            if conn.connecting {
                match conn.s.take_error() {
                    Ok(None) => {
                        conn.connecting = false;
                        connecting.retain(|&k| k != slot);
                        c.opened += 1;
                        ep.modify(
                            &conn.s,
                            &mut EpollEvent::new(EpollFlags::EPOLLIN, slot as u64),
                        )
                        .context("epoll_ctl MOD")?;
                        if let Some(h) = kind(conn.i) {
                            // A few hundred bytes: the socket buffer takes them.
                            let _ = conn.s.send(h);
                        }
                    }
                    Ok(Some(e)) | Err(e) => {
                        c.failed += 1;
                        c.first_error.get_or_insert_with(|| e.to_string());
                        gone.push(slot);
                    }
                }
                continue;
            }
            match conn.s.read(&mut buf) {
                Ok(0) => gone.push(slot),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => gone.push(slot),
            }
        }
        let now = Instant::now();
        for &slot in &connecting {
            let Some(conn) = slots[slot].as_ref() else {
                continue;
            };
            if now.duration_since(conn.since) > CONNECT_TIMEOUT && !gone.contains(&slot) {
                c.failed += 1;
                c.first_error
                    .get_or_insert_with(|| "connect timed out (2 s)".to_string());
                gone.push(slot);
            }
        }
        for slot in gone {
            // Closing the socket takes it out of the epoll set.
            let Some(conn) = slots[slot].take() else {
                continue;
            };
            if conn.connecting {
                connecting.retain(|&k| k != slot);
            } else {
                c.closed_by_proxy += 1;
            }
            free.push(slot);
            owed += 1;
        }
        if burst_secs.is_none() && next >= count && connecting.is_empty() {
            let secs = t0.elapsed().as_secs_f64();
            burst_secs = Some(secs);
            println!(
                "{}",
                line("burst", &c, held(&slots, &free, &connecting), secs)?
            );
            std::io::stdout().flush()?;
        }
    }
    let burst_secs = burst_secs.unwrap_or_else(|| t0.elapsed().as_secs_f64());
    let held = held(&slots, &free, &connecting);
    if next < count || !connecting.is_empty() {
        // Stopped before the burst was through: still say where it got.
        println!("{}", line("burst", &c, held, burst_secs)?);
    }
    println!("{}", line("end", &c, held, burst_secs)?);
    std::io::stdout().flush()?;
    Ok(())
}
