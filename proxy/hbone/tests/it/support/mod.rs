//! Test harness: an HBONE server on 127.0.0.1 and a TCP backend whose accepted sockets the
//! test drives, all in-process.
#![allow(dead_code)]

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringway_hbone::{
    drain_channel, serve_connection, ConnectRequest, Decision, DrainTrigger, HboneError, PeerInfo,
    Pool, PoolConfig, PoolKey, ServerConfig, Upstream,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub type Handler = Arc<dyn Fn(ConnectRequest) -> DecisionFuture + Send + Sync>;
/// A drained-or-not connection: its drain trigger and serve task.
type ServedConn = (DrainTrigger, JoinHandle<Result<(), HboneError>>);

pub type DecisionFuture = std::pin::Pin<Box<dyn Future<Output = Decision> + Send>>;

/// An HBONE server on loopback TCP; every connection gets its own drain trigger.
pub struct Server {
    pub addr: SocketAddr,
    /// HTTP/2 connections accepted.
    pub accepted: Arc<AtomicUsize>,
    /// Requests the handler saw (validated ones only).
    pub requests: Arc<Mutex<Vec<ConnectRequest>>>,
    conns: Arc<Mutex<Vec<ServedConn>>>,
    accept_task: JoinHandle<()>,
}

impl Server {
    pub async fn start(handler: Handler) -> Server {
        Self::start_with(ServerConfig::default(), handler).await
    }

    pub async fn start_with(config: ServerConfig, handler: Handler) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (a, r, c) = (accepted.clone(), requests.clone(), conns.clone());
        let accept_task = tokio::spawn(async move {
            loop {
                let Ok((tcp, peer_addr)) = listener.accept().await else {
                    return;
                };
                tcp.set_nodelay(true).unwrap();
                a.fetch_add(1, Ordering::SeqCst);
                let (trigger, signal) = drain_channel();
                let peer = PeerInfo {
                    identity: "spiffe://cluster.local/ns/default/sa/client".into(),
                    addr: peer_addr,
                };
                let handler = handler.clone();
                let requests = r.clone();
                let config = config.clone();
                let task = tokio::spawn(async move {
                    serve_connection(tcp, peer, &config, signal, move |req: ConnectRequest| {
                        requests.lock().unwrap().push(req.clone());
                        handler(req)
                    })
                    .await
                });
                c.lock().unwrap().push((trigger, task));
            }
        });
        Server {
            addr,
            accepted,
            requests,
            conns,
            accept_task,
        }
    }

    /// Drains every connection accepted so far; returns their serve tasks.
    pub fn drain_current(&self) -> Vec<JoinHandle<Result<(), HboneError>>> {
        let mut conns = self.conns.lock().unwrap();
        conns
            .drain(..)
            .map(|(trigger, task)| {
                trigger.drain();
                // Keep the trigger alive until the task ends so the signal stays "drained".
                tokio::spawn(async move {
                    let r = task.await.unwrap();
                    drop(trigger);
                    r
                })
            })
            .collect()
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Opens a tunnel to `dst` through this server with `pool` (this
    /// server's key, a plain TCP dial).
    pub async fn open(
        &self,
        pool: &ringway_hbone::Pool,
        dst: SocketAddr,
    ) -> Result<ringway_hbone::HboneStream, ringway_hbone::HboneError> {
        let addr = self.addr;
        pool.connect(
            self.key(),
            || dial(addr),
            ringway_hbone::ConnectHeaders::new(dst),
        )
        .await
    }

    /// One field of each request the handler saw, in order.
    pub fn seen<T>(&self, field: impl Fn(&ConnectRequest) -> T) -> Vec<T> {
        self.requests.lock().unwrap().iter().map(field).collect()
    }

    pub fn key(&self) -> PoolKey {
        key_for(self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

/// The pool key of the tests' client toward a peer listening on `dst`.
pub fn key_for(dst: SocketAddr) -> PoolKey {
    PoolKey {
        src_identity: "spiffe://cluster.local/ns/default/sa/client".into(),
        dst_identity: "spiffe://cluster.local/ns/default/sa/server".into(),
        src_ip: "127.0.0.1".parse().unwrap(),
        dst,
        trust_generation: 0,
    }
}

/// Plain loopback TCP dial.
pub async fn dial(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let s = TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    Ok(s)
}

/// A handler that echoes (through an in-memory duplex: no TCP upstream).
pub fn echo_handler() -> Handler {
    Arc::new(|_req| {
        Box::pin(async {
            let (ours, theirs) = tokio::io::duplex(256 * 1024);
            tokio::spawn(async move {
                let (mut r, mut w) = tokio::io::split(theirs);
                if tokio::io::copy(&mut r, &mut w).await.is_ok() {
                    let _ = w.shutdown().await;
                }
            });
            Decision::Accept(Upstream::new(ours))
        })
    })
}

/// A handler that always answers `decision()`.
pub fn fixed_handler(decision: fn() -> Decision) -> Handler {
    Arc::new(move |_req| Box::pin(async move { decision() }))
}

/// A TCP backend: the handler connects each tunnel to it; the test gets the accepted
/// sockets from `accepted`.
pub struct Backend {
    pub addr: SocketAddr,
    pub accepted: mpsc::UnboundedReceiver<TcpStream>,
}

impl Backend {
    pub async fn start() -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                s.set_nodelay(true).unwrap();
                if tx.send(s).is_err() {
                    return;
                }
            }
        });
        Backend { addr, accepted: rx }
    }

    /// Handler that connects every tunnel to this backend (503 if that fails).
    pub fn handler(&self) -> Handler {
        let addr = self.addr;
        Arc::new(move |_req| {
            Box::pin(async move {
                match TcpStream::connect(addr).await {
                    Ok(s) => Decision::Accept(Upstream::tcp(s)),
                    Err(e) => Decision::Unavailable503(e.to_string()),
                }
            })
        })
    }

    pub async fn next(&mut self) -> TcpStream {
        tokio::time::timeout(Duration::from_secs(5), self.accepted.recv())
            .await
            .expect("backend connection within 5 s")
            .expect("backend open")
    }
}

pub fn pool() -> Pool {
    Pool::new(PoolConfig::default())
}

/// Deterministic pseudo-random payload.
pub fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// How long anything awaited here may take (`ringway_testbed::wait_for_async`):
/// generous, it only bounds how long a failing test hangs.
pub const WAIT: Duration = Duration::from_secs(20);

/// Reads to EOF with a 10 s cap.
pub async fn read_all(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> std::io::Result<Vec<u8>> {
    let mut v = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), r.read_to_end(&mut v))
        .await
        .expect("read within 10 s")?;
    Ok(v)
}
