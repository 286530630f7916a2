//! The load generator: blocking sockets on plain threads (one per stream or
//! connection, never more than a handful), servers in the destination pod's
//! netns, clients in the source pod's. Every loop is bounded in time and in
//! count, and every socket has read/write timeouts, so a stalled proxy ends
//! a measurement with an error instead of hanging the run.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use ringway_testbed::ns::Netns;
use ringway_testbed::traffic::listen;

/// Socket timeouts: a stall longer than this fails the measurement.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the load goes: clients in `client`, the server listening on
/// `listen` in `server`, clients connecting to `connect` (the same address,
/// except through a peer proxy that listens elsewhere).
#[derive(Debug, Clone)]
pub struct Path {
    /// Client pod's netns.
    pub client: Netns,
    /// Server pod's netns.
    pub server: Netns,
    /// The server's listening address.
    pub listen: SocketAddr,
    /// The address clients connect to.
    pub connect: SocketAddr,
}

impl Path {
    /// The same path on another port (a fresh port per measurement keeps
    /// TIME_WAIT of one measurement out of the next).
    pub fn on_port(&self, port: u16) -> Path {
        let mut p = self.clone();
        p.listen.set_port(port);
        p.connect.set_port(port);
        p
    }
}

/// CPU seconds (user + system) of this whole process: the load generator's
/// own cost (the proxy runs in a child process).
pub fn self_cpu_seconds() -> f64 {
    let Ok(u) = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF) else {
        return 0.0;
    };
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    tv(u.user_time()) + tv(u.system_time())
}

fn client_connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

/// Accepts until `stop`, polling the listener every 100 ms (no added latency
/// while connections are pending). Calls `f` for each accepted stream.
fn accept_until(l: &TcpListener, stop: &AtomicBool, mut f: impl FnMut(TcpStream) -> bool) {
    use nix::poll::{poll, PollFd, PollFlags};
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(l.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, 100u16) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
        }
        match l.accept() {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                let _ = s.set_read_timeout(Some(IO_TIMEOUT));
                let _ = s.set_write_timeout(Some(IO_TIMEOUT));
                if !f(s) {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

fn bind(path: &Path) -> anyhow::Result<TcpListener> {
    let addr = path.listen;
    let l = path
        .server
        .run(|| listen(addr))
        .with_context(|| format!("listen on {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Result of a throughput run.
#[derive(Debug, Clone, Copy)]
pub struct Throughput {
    /// Bytes the server read (equal to the bytes the clients wrote: checked).
    pub bytes: u64,
    /// Seconds from the common start to the last stream's end.
    pub secs: f64,
    /// Load generator CPU seconds during the run.
    pub gen_cpu: f64,
}

impl Throughput {
    /// Gbit/s.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.secs / 1e9
    }
}

/// `streams` parallel streams client -> server for `dur`, 256 KiB writes.
/// Every byte written is counted by the server; a mismatch is an error.
pub fn throughput(path: &Path, streams: usize, dur: Duration) -> anyhow::Result<Throughput> {
    let l = bind(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = std::sync::mpsc::channel::<std::thread::JoinHandle<std::io::Result<u64>>>();
    let acceptor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            accept_until(&l, &stop, |mut s| {
                let h = std::thread::spawn(move || {
                    let mut buf = vec![0u8; 256 * 1024];
                    let mut total = 0u64;
                    loop {
                        match s.read(&mut buf)? {
                            0 => return Ok(total),
                            k => total += k as u64,
                        }
                    }
                });
                let _ = tx.send(h);
                n += 1;
                n < streams
            });
        })
    };
    let gen0 = self_cpu_seconds();
    let barrier = Arc::new(Barrier::new(streams + 1));
    let addr = path.connect;
    let clients: Vec<_> = (0..streams)
        .map(|_| {
            let barrier = barrier.clone();
            path.client
                .spawn(move || -> std::io::Result<(u64, Instant)> {
                    let s = client_connect(addr);
                    barrier.wait();
                    let mut s = s?;
                    let buf = vec![0x5au8; 256 * 1024];
                    let deadline = Instant::now() + dur;
                    let mut sent = 0u64;
                    while Instant::now() < deadline {
                        s.write_all(&buf)?;
                        sent += buf.len() as u64;
                    }
                    s.shutdown(Shutdown::Write)?;
                    // The server closes after reading every byte: wait for it.
                    let mut sink = [0u8; 16];
                    while s.read(&mut sink)? > 0 {}
                    Ok((sent, Instant::now()))
                })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    let mut sent = 0u64;
    let mut end = t0;
    let mut err = None;
    for c in clients {
        match c.join().expect("client thread") {
            Ok((b, t)) => {
                sent += b;
                end = end.max(t);
            }
            Err(e) => err = Some(e),
        }
    }
    stop.store(true, Ordering::Relaxed);
    acceptor.join().expect("acceptor");
    let mut received = 0u64;
    for h in rx.try_iter() {
        received += h.join().expect("server thread").context("server read")?;
    }
    if let Some(e) = err {
        bail!("client: {e}");
    }
    if sent != received {
        bail!("byte count mismatch: clients wrote {sent}, server read {received}");
    }
    Ok(Throughput {
        bytes: received,
        secs: (end - t0).as_secs_f64(),
        gen_cpu: self_cpu_seconds() - gen0,
    })
}

/// Result of an open-loop latency run.
#[derive(Debug)]
pub struct Latency {
    /// Round trips in nanoseconds, each measured from its *scheduled* send time.
    pub hist: Histogram<u64>,
    /// Requests completed.
    pub requests: u64,
    /// Seconds from the first scheduled send to the last reply.
    pub secs: f64,
    /// How late the load generator itself sent (actual - scheduled), ns:
    /// its own share of the latency.
    pub lateness: Histogram<u64>,
}

/// Request/response (64 B each way) at a fixed total `rate` over `conns`
/// connections for `dur`. Open loop: request `i` of a connection is
/// scheduled at `start + offset + i / (rate / conns)`; its latency is
/// measured from that time, so a stall delays (and is charged to) every
/// request scheduled during it ("coordinated omission" avoided).
pub fn latency(path: &Path, rate: f64, conns: usize, dur: Duration) -> anyhow::Result<Latency> {
    let l = bind(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut handles = Vec::new();
            accept_until(&l, &stop, |mut s| {
                handles.push(std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while s.read_exact(&mut buf).is_ok() {
                        if s.write_all(&buf).is_err() {
                            break;
                        }
                    }
                }));
                handles.len() < conns
            });
            handles
        })
    };
    let per_conn_rate = rate / conns as f64;
    let interval = Duration::from_secs_f64(1.0 / per_conn_rate);
    let per_conn = ((dur.as_secs_f64() * per_conn_rate).ceil() as u64).max(1);
    let barrier = Arc::new(Barrier::new(conns + 1));
    let start_cell = Arc::new(Mutex::new(None::<Instant>));
    let addr = path.connect;
    let clients: Vec<_> = (0..conns)
        .map(|k| {
            let (barrier, start_cell) = (barrier.clone(), start_cell.clone());
            path.client.spawn(
                move || -> anyhow::Result<(Histogram<u64>, Histogram<u64>, Instant)> {
                    // Wake-ups within ~µs of the schedule, not the default 50 µs slack.
                    let _ = nix::sys::prctl::set_timerslack(1);
                    let s = client_connect(addr);
                    barrier.wait();
                    let mut s = s?;
                    let start = start_cell.lock().expect("lock").expect("start set");
                    let mut h = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
                    let mut late = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
                    let offset = interval.mul_f64(k as f64 / conns as f64);
                    let mut buf = [0x42u8; 64];
                    for i in 0..per_conn {
                        let at = start + offset + interval.mul_f64(i as f64);
                        let now = Instant::now();
                        if at > now {
                            std::thread::sleep(at - now);
                        }
                        late.saturating_record(at.elapsed().as_nanos() as u64);
                        s.write_all(&buf)?;
                        s.read_exact(&mut buf)?;
                        h.saturating_record(at.elapsed().as_nanos() as u64);
                    }
                    Ok((h, late, Instant::now()))
                },
            )
        })
        .collect();
    let t0 = Instant::now() + Duration::from_millis(20);
    *start_cell.lock().expect("lock") = Some(t0);
    barrier.wait();
    let mut hist = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
    let mut lateness = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
    let mut end = t0;
    let mut err = None;
    for c in clients {
        match c.join().expect("client thread") {
            Ok((h, l, t)) => {
                hist.add(&h)?;
                lateness.add(&l)?;
                end = end.max(t);
            }
            Err(e) => err = Some(e),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in acceptor.join().expect("acceptor") {
        let _ = h.join();
    }
    if let Some(e) = err {
        return Err(e.context("latency client"));
    }
    Ok(Latency {
        requests: hist.len(),
        hist,
        lateness,
        secs: (end - t0).as_secs_f64(),
    })
}

/// Result of a connection-rate run.
#[derive(Debug, Clone)]
pub struct ConnRate {
    /// Connections that completed connect + 1 B request + 1 B reply + close.
    pub conns: u64,
    /// Connection attempts that failed.
    pub failures: u64,
    /// Seconds.
    pub secs: f64,
    /// The first failure's error, if any.
    pub first_error: Option<String>,
}

/// Client threads (and server threads) of the connection-rate run: like
/// `wrk -t2` against a 2-worker nginx.
const CONN_RATE_THREADS: usize = 2;

/// `conns` concurrent connections (like `wrk -c`), spread over 2 client
/// threads, each looping: connect, send 1 B, read the 1 B reply, close
/// (the server closes right after its reply); for `dur` or `max_conns` in
/// total. The server is
/// event-driven too (2 threads, each a current-thread tokio runtime that
/// serves every accepted connection as its own task), so a connection the
/// proxy has not delivered yet never holds up the others (what a blocking
/// accept-read-write server did: see benches/HISTORY.md, "Why the bundled
/// bench disagreed").
pub fn conn_rate(
    path: &Path,
    conns: usize,
    dur: Duration,
    max_conns: u64,
) -> anyhow::Result<ConnRate> {
    // The client usually closes first now (as wrk does): let its connects
    // reuse its own TIME_WAIT ports (this is the bench's own pod netns), so
    // a long run cannot run out of ephemeral ports.
    path.client
        .sysctl("net.ipv4.tcp_tw_reuse", "1")
        .context("tcp_tw_reuse in the client pod")?;
    // One SO_REUSEPORT listener per server thread (as nginx's workers get
    // their connections without a thundering herd on one queue).
    let listeners = (0..CONN_RATE_THREADS)
        .map(|_| reuseport_listener(path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let servers: Vec<_> = listeners
        .into_iter()
        .map(|l| {
            let stop = stop.clone();
            std::thread::spawn(move || -> std::io::Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    let l = tokio::net::TcpListener::from_std(l)?;
                    let serve = async {
                        loop {
                            let Ok((mut s, _)) = l.accept().await else {
                                continue;
                            };
                            tokio::task::spawn_local(async move {
                                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                                let _ = s.set_nodelay(true);
                                let mut b = [0u8; 1];
                                let _ = tokio::time::timeout(IO_TIMEOUT, async {
                                    if s.read_exact(&mut b).await.is_ok() {
                                        let _ = s.write_all(&b).await;
                                    }
                                })
                                .await;
                            });
                        }
                    };
                    // Stop checked every 100 ms by one timer, not one per accept.
                    let stopped = async {
                        while !stop.load(Ordering::Relaxed) {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    };
                    tokio::select! {
                        () = serve => {}
                        () = stopped => {}
                    }
                    Ok::<_, std::io::Error>(())
                })
            })
        })
        .collect();
    let budget = Arc::new(std::sync::atomic::AtomicU64::new(max_conns));
    let failed_total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let barrier = Arc::new(Barrier::new(CONN_RATE_THREADS + 1));
    let addr = path.connect;
    let per_thread = conns.div_ceil(CONN_RATE_THREADS).max(1);
    let clients: Vec<_> = (0..CONN_RATE_THREADS)
        .map(|_| {
            let (budget, barrier, failed_total) =
                (budget.clone(), barrier.clone(), failed_total.clone());
            path.client
                .spawn(move || -> (u64, u64, Option<String>, Instant) {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            barrier.wait();
                            return (0, 1, Some(format!("client runtime: {e}")), Instant::now());
                        }
                    };
                    barrier.wait();
                    let deadline = Instant::now() + dur;
                    let local = tokio::task::LocalSet::new();
                    let results = local.block_on(&rt, async {
                        let tasks: Vec<_> = (0..per_thread)
                            .map(|_| {
                                let (budget, failed_total) = (budget.clone(), failed_total.clone());
                                tokio::task::spawn_local(async move {
                                    let (mut ok, mut failed, mut first) = (0u64, 0u64, None);
                                    while Instant::now() < deadline
                                        && failed_total.load(Ordering::Relaxed) < 100
                                    {
                                        if budget
                                            .fetch_update(
                                                Ordering::Relaxed,
                                                Ordering::Relaxed,
                                                |b| b.checked_sub(1),
                                            )
                                            .is_err()
                                        {
                                            break;
                                        }
                                        let t = Instant::now();
                                        match tokio::time::timeout(IO_TIMEOUT, one_conn(addr)).await
                                        {
                                            Ok(Ok(())) => ok += 1,
                                            r => {
                                                failed += 1;
                                                failed_total.fetch_add(1, Ordering::Relaxed);
                                                let e = match r {
                                                    Ok(Err(e)) => e.to_string(),
                                                    _ => format!("no close within {IO_TIMEOUT:?}"),
                                                };
                                                first.get_or_insert_with(|| {
                                                    format!(
                                                        "{e} after {:.1} s",
                                                        t.elapsed().as_secs_f64()
                                                    )
                                                });
                                            }
                                        }
                                    }
                                    (ok, failed, first)
                                })
                            })
                            .collect();
                        let mut sum = (0u64, 0u64, None::<String>);
                        for t in tasks {
                            if let Ok((o, f, e)) = t.await {
                                sum.0 += o;
                                sum.1 += f;
                                sum.2 = sum.2.or(e);
                            }
                        }
                        sum
                    });
                    (results.0, results.1, results.2, Instant::now())
                })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    let (mut n, mut failures, mut end, mut first_error) = (0, 0, t0, None);
    for c in clients {
        let (o, f, e, t) = c.join().expect("client thread");
        first_error = first_error.or(e);
        n += o;
        failures += f;
        end = end.max(t);
    }
    stop.store(true, Ordering::Relaxed);
    for s in servers {
        let _ = s.join();
    }
    if n == 0 {
        bail!("no connection completed ({failures} failed)");
    }
    Ok(ConnRate {
        conns: n,
        failures,
        secs: (end - t0).as_secs_f64(),
        first_error,
    })
}

/// A non-blocking listener on `path.listen` in the server pod's netns with
/// SO_REUSEPORT, so several can share the port.
fn reuseport_listener(path: &Path) -> anyhow::Result<TcpListener> {
    let addr = path.listen;
    let l = path
        .server
        .run(|| -> std::io::Result<TcpListener> {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                None,
            )?;
            s.set_reuse_address(true)?;
            s.set_reuse_port(true)?;
            if addr.is_ipv6() {
                s.set_only_v6(true)?;
            }
            s.bind(&addr.into())?;
            s.listen(1024)?;
            s.set_nonblocking(true)?;
            Ok(s.into())
        })
        .with_context(|| format!("listen on {addr}"))?;
    Ok(l)
}

/// One connection of the connection-rate run. Like wrk with
/// `Connection: close`, the client is done once the reply is in: it closes
/// without waiting for the server's FIN (which the server sends right after
/// its reply) to come back through the proxy.
async fn one_conn(addr: SocketAddr) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    s.write_all(&[7]).await?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b).await?;
    Ok(())
}

/// `n` established, idle connections (each proven end to end by a 1 B
/// exchange). Dropping it closes both ends.
#[derive(Debug)]
pub struct IdleConns {
    client: Vec<TcpStream>,
    server: Vec<TcpStream>,
}

impl IdleConns {
    /// How many connections are open.
    pub fn len(&self) -> usize {
        self.client.len().min(self.server.len())
    }

    /// Whether none are open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Opens `n` idle connections along `path`.
pub fn open_idle(path: &Path, n: usize) -> anyhow::Result<IdleConns> {
    let l = bind(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut kept = Vec::with_capacity(n);
            accept_until(&l, &stop, |mut s| {
                let mut b = [0u8; 1];
                if s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {
                    kept.push(s);
                }
                kept.len() < n
            });
            kept
        })
    };
    let addr = path.connect;
    let client = path
        .client
        .spawn(move || -> std::io::Result<Vec<TcpStream>> {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let mut s = client_connect(addr)?;
                s.write_all(&[1])?;
                let mut b = [0u8; 1];
                s.read_exact(&mut b)?;
                v.push(s);
            }
            Ok(v)
        });
    let client = client.join().expect("client thread");
    stop.store(true, Ordering::Relaxed);
    let server = acceptor.join().expect("acceptor");
    let client = client.context("opening idle connections")?;
    if server.len() != n {
        bail!("server kept {} of {n} idle connections", server.len());
    }
    Ok(IdleConns { client, server })
}

/// Closed-loop ping-pong: one connection, a 64 B request and its 64 B reply
/// one after another for `dur` (at most `max` round trips): what `sockperf
/// ping-pong` measures, for the cross-check. Round trips in nanoseconds.
pub fn ping_pong(path: &Path, dur: Duration, max: u64) -> anyhow::Result<Latency> {
    let l = bind(path)?;
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut handle = None;
            accept_until(&l, &stop, |mut s| {
                handle = Some(std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    while s.read_exact(&mut buf).is_ok() {
                        if s.write_all(&buf).is_err() {
                            break;
                        }
                    }
                }));
                false
            });
            handle
        })
    };
    let addr = path.connect;
    let client = path
        .client
        .spawn(move || -> anyhow::Result<(Histogram<u64>, u64, f64)> {
            let mut s = client_connect(addr)?;
            let mut h = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
            let mut buf = [0x42u8; 64];
            let t0 = Instant::now();
            let mut n = 0u64;
            while t0.elapsed() < dur && n < max {
                let t = Instant::now();
                s.write_all(&buf)?;
                s.read_exact(&mut buf)?;
                h.saturating_record(t.elapsed().as_nanos() as u64);
                n += 1;
            }
            Ok((h, n, t0.elapsed().as_secs_f64()))
        });
    let r = client.join().expect("client thread");
    stop.store(true, Ordering::Relaxed);
    if let Some(h) = acceptor.join().expect("acceptor") {
        let _ = h.join();
    }
    let (hist, requests, secs) = r.context("ping-pong client")?;
    let lateness = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3)?;
    Ok(Latency {
        hist,
        requests,
        secs,
        lateness,
    })
}
