//! The HBONE trust boundary against hostile peers that hold a real mesh
//! certificate: forged `forwarded` claims, CONNECTs to the proxy's own
//! ports, rapid reset floods, CONTINUATION floods, and connections that stall
//! before or after authentication. Two virtual nodes, real TLS, real sockets.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::hbone::{two_nodes, Opts, TwoNodes, APP_PORT, TD};
use common::{wait_until, TIMEOUT};
use ringway_identity::Identity;
use ringway_testbed::run_isolated;
use ringway_testbed::Netns;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A counting app: accepts on `addr` in `ns` until dropped, echoes, and
/// counts accepted connections and remembers their peers.
struct App {
    count: Arc<AtomicUsize>,
    peers: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl App {
    fn start(ns: &Netns, addr: SocketAddr) -> App {
        let l = ns
            .run(|| ringway_testbed::traffic::listen(addr))
            .expect("listen");
        l.set_nonblocking(true).unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let peers = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let (c, p) = (count.clone(), peers.clone());
        let join = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(l).unwrap();
                let deadline = tokio::time::sleep(Duration::from_secs(300));
                tokio::pin!(deadline);
                loop {
                    tokio::select! {
                        _ = &mut stopped => break,
                        _ = &mut deadline => break,
                        r = l.accept() => {
                            let Ok((mut s, peer)) = r else { continue };
                            c.fetch_add(1, Ordering::SeqCst);
                            p.lock().unwrap().push(peer);
                            tokio::spawn(async move {
                                let (mut r, mut w) = s.split();
                                let _ = tokio::io::copy(&mut r, &mut w).await;
                                let _ = w.shutdown().await;
                            });
                        }
                    }
                }
            });
        });
        App {
            count,
            peers,
            stop: Some(stop),
            join: Some(join),
        }
    }

    fn connections(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
}

impl Drop for App {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

fn web() -> Identity {
    Identity::new(TD, "shop", "web")
}

fn frontend() -> Identity {
    Identity::new(TD, "front", "frontend")
}

/// A hostile peer on node 1 holding a valid certificate for `as_id` opens a
/// CONNECT to `authority` on the server pod's 15008 claiming `forwarded`;
/// on 200 it echoes one message. Returns the HTTP status (200 when the
/// stream opened and echoed).
fn hostile_connect(
    t: &TwoNodes,
    as_id: &Identity,
    authority: SocketAddr,
    forwarded: Option<SocketAddr>,
) -> Result<u16, String> {
    let ids = t.ids1.clone().expect("HBONE on");
    let tunnel = SocketAddr::new(t.server().ip(authority.is_ipv6()), 15008);
    let tls = ids
        .client_config(as_id, &web())
        .map_err(|e| e.to_string())?;
    t.n1.node.run(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let pool = ringway_hbone::Pool::new(ringway_hbone::PoolConfig::default());
            let key = ringway_hbone::PoolKey {
                src_identity: as_id.to_string(),
                dst_identity: web().to_string(),
                src_ip: t.client().ip(authority.is_ipv6()),
                dst: tunnel,
            };
            let mut headers = ringway_hbone::ConnectHeaders::new(authority);
            if let Some(f) = forwarded {
                headers = headers.forwarded_for(f);
            }
            let dial = move || async move {
                let tcp = tokio::net::TcpStream::connect(tunnel).await?;
                tokio_rustls::TlsConnector::from(tls)
                    .connect(ringway_identity::placeholder_server_name(), tcp)
                    .await
            };
            let opened = tokio::time::timeout(TIMEOUT, pool.connect(key, dial, headers))
                .await
                .map_err(|_| "CONNECT timed out".to_string())?;
            match opened {
                Ok(mut s) => {
                    s.write_all(b"ping").await.map_err(|e| e.to_string())?;
                    let mut back = [0u8; 4];
                    tokio::time::timeout(TIMEOUT, s.read_exact(&mut back))
                        .await
                        .map_err(|_| "echo timed out".to_string())?
                        .map_err(|e| e.to_string())?;
                    Ok(200)
                }
                Err(e) => e
                    .status()
                    .map(|s| s.as_u16())
                    .ok_or_else(|| format!("no status: {e}")),
            }
        })
    })
}

fn refused(t: &TwoNodes, reason: &str) -> f64 {
    common::sample(
        &common::hbone::metrics_text(&t.p2),
        "ringway_hbone_refused_total",
        &[&format!("reason=\"{reason}\"")],
    )
    .unwrap_or(0.0)
}

/// A peer with a valid mesh certificate (front/frontend) claims client
/// addresses that are not its own: another workload's (shop/web), one no
/// workload holds, loopback, unspecified, multicast, link-local. Each is
/// refused with 401 and counted; the app never sees a connection. The same
/// peer claiming its own workload's address is served, and the app sees
/// that address.
#[test]
fn adversarial_hbone_forwarded_claims_must_match_the_peer() {
    run_isolated(
        "adversarial_hbone_forwarded_claims_must_match_the_peer",
        || {
            let t = two_nodes(Opts {
                server_pods: 2,
                ..Opts::new("hbone_forwarded_claims")
            });
            let addr = SocketAddr::new(t.server().ip(false), APP_PORT);
            let app = App::start(&t.server().netns, addr);
            let claims: [(&str, IpAddr); 9] = [
                ("another workload (shop/web)", t.n2.pod(1).ip(false)),
                ("no workload", "10.244.9.9".parse().unwrap()),
                ("loopback", "127.0.0.1".parse().unwrap()),
                ("unspecified", "0.0.0.0".parse().unwrap()),
                ("multicast", "224.0.0.1".parse().unwrap()),
                ("link-local", "169.254.1.1".parse().unwrap()),
                ("broadcast", "255.255.255.255".parse().unwrap()),
                ("v6 loopback", "::1".parse().unwrap()),
                ("v6 link-local", "fe80::1".parse().unwrap()),
            ];
            for (what, ip) in claims {
                let status =
                    hostile_connect(&t, &frontend(), addr, Some(SocketAddr::new(ip, 40000)));
                assert_eq!(status, Ok(401), "forwarded claim of {what} ({ip})");
            }
            assert_eq!(app.connections(), 0, "no forged claim reached the app");
            // No `forwarded` at all: the peer's own (node) address is no
            // workload's either.
            assert_eq!(hostile_connect(&t, &frontend(), addr, None), Ok(401));
            assert!(refused(&t, "forwarded_not_peer") >= 3.0);
            assert!(refused(&t, "forwarded_reserved") >= 7.0);
            // Control: the peer's own workload address is served.
            let own = SocketAddr::new(t.client().ip(false), 40000);
            assert_eq!(hostile_connect(&t, &frontend(), addr, Some(own)), Ok(200));
            assert!(wait_until(TIMEOUT, || app.connections() == 1));
            assert_eq!(
                app.peers.lock().unwrap()[0].ip(),
                t.client().ip(false),
                "the app sees the verified client address"
            );
        },
    );
}

/// A peer asks for the proxy's own ports in the destination pod (the
/// capture and tunnel listeners, and a control port where the pod happens
/// to listen): refused with 401 before any connect, and counted.
#[test]
fn adversarial_hbone_connect_to_proxy_ports_refused() {
    run_isolated("adversarial_hbone_connect_to_proxy_ports_refused", || {
        let t = two_nodes(Opts::new("hbone_proxy_ports"));
        let own = SocketAddr::new(t.client().ip(false), 40000);
        let metrics_port = SocketAddr::new(t.server().ip(false), 15020);
        let app = App::start(&t.server().netns, metrics_port);
        for port in [15001, 15006, 15008, 15020, 15021, 15000] {
            let dst = SocketAddr::new(t.server().ip(false), port);
            assert_eq!(
                hostile_connect(&t, &frontend(), dst, Some(own)),
                Ok(401),
                "CONNECT to the proxy's port {port}"
            );
        }
        assert_eq!(app.connections(), 0);
        assert!(refused(&t, "proxy_port") >= 6.0);
    });
}
