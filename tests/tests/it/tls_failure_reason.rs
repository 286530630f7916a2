//! The `outcome` label of `ringway_tls_handshakes_total` for real rustls
//! failures: each handshake below fails for one reason (over an in-memory
//! pipe, with the identity crate's real configs and verifiers) and the
//! label must name that reason, taken from the error's type. The timeout
//! reason is checked on real proxies: their tunnel cuts real handshakes.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ringway_identity::testing::{raw_client_config, raw_server_config};
use ringway_identity::{
    placeholder_server_name, CaSigner, Identity, IdentityManager, TrustBundle,
    DEFAULT_CERT_LIFETIME,
};
use ringway_proxy::tunnel::{tls_failure_reason, HandshakeTimeout};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{duplex, AsyncWriteExt, DuplexStream};
use tokio_rustls::{client, server, TlsAcceptor, TlsConnector};

const TD: &str = "cluster.local";

fn web() -> Identity {
    Identity::new(TD, "shop", "web")
}

fn front() -> Identity {
    Identity::new(TD, "front", "frontend")
}

fn manager(ca: CaSigner, bundle: TrustBundle) -> IdentityManager {
    IdentityManager::new(ca, bundle, TD, DEFAULT_CERT_LIFETIME).unwrap()
}

type Handshake = (
    std::io::Result<client::TlsStream<DuplexStream>>,
    std::io::Result<server::TlsStream<DuplexStream>>,
);

async fn handshake(client: Arc<ClientConfig>, server: Arc<ServerConfig>) -> Handshake {
    let (a, b) = duplex(64 * 1024);
    let connect = TlsConnector::from(client).connect(placeholder_server_name(), a);
    let accept = TlsAcceptor::from(server).accept(b);
    tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(connect, accept)
    })
    .await
    .expect("handshake hung")
}

fn reason<T>(side: &str, r: std::io::Result<T>) -> &'static str {
    match r {
        Ok(_) => panic!("the {side} side's handshake succeeded"),
        Err(e) => {
            let reason = tls_failure_reason(&e);
            eprintln!("{side}: {e} -> {reason}");
            reason
        }
    }
}

#[tokio::test]
async fn adversarial_tls_reason_unknown_ca() {
    // The server's certificate comes from a CA the client does not trust.
    let client = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let server = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let (c, s) = handshake(
        client.client_config(&front(), &web()).unwrap(),
        server.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(reason("client", c), "unknown_ca");
    // The client told the server with an alert.
    assert_eq!(reason("server", s), "unknown_ca");
}

#[tokio::test]
async fn adversarial_tls_reason_wrong_identity() {
    // A valid certificate of the mesh's CA, for another workload.
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let (c, s) = handshake(
        m.client_config(&front(), &web()).unwrap(),
        m.server_config(&Identity::new(TD, "shop", "db")).unwrap(),
    )
    .await;
    assert_eq!(reason("client", c), "wrong_identity");
    assert_eq!(reason("server", s), "bad_certificate");

    // A client certificate of the right CA that is not a SPIFFE ID of the
    // trust domain.
    let ca = CaSigner::generate_for_tests(TD);
    let foreign = ca.issue_with_uris_for_tests(&["spiffe://evil.org/ns/front/sa/frontend"]);
    let m = manager(ca, TrustBundle::new());
    let (_, s) = handshake(
        raw_client_config(&m, &web(), Some(foreign), &[&rustls::version::TLS13]),
        m.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(reason("server", s), "wrong_identity");
}

#[tokio::test]
async fn adversarial_tls_reason_bad_certificates() {
    let ca = CaSigner::generate_for_tests(TD);
    let now = SystemTime::now();
    let day = Duration::from_secs(86400);
    let expired = ca.issue_for_tests(&front(), now - 2 * day, now - day);
    let expired_server = ca.issue_for_tests(&web(), now - 2 * day, now - day);
    let m = manager(ca, TrustBundle::new());
    let (c, s) = handshake(
        raw_client_config(&m, &web(), Some(expired), &[&rustls::version::TLS13]),
        m.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(reason("server", s), "expired");
    drop(c);
    let (c, _) = handshake(
        m.client_config(&front(), &web()).unwrap(),
        raw_server_config(expired_server),
    )
    .await;
    assert_eq!(reason("client", c), "expired");

    // No client certificate at all.
    let (c, s) = handshake(
        raw_client_config(&m, &web(), None, &[&rustls::version::TLS13]),
        m.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(reason("server", s), "no_client_cert");
    drop(c);
}

#[tokio::test]
async fn adversarial_tls_reason_protocol() {
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    // Garbage instead of a ClientHello (a plaintext HTTP request).
    let (mut a, b) = duplex(64 * 1024);
    let accept = TlsAcceptor::from(m.server_config(&web()).unwrap()).accept(b);
    a.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let s = tokio::time::timeout(Duration::from_secs(10), accept)
        .await
        .expect("accept hung");
    assert_eq!(reason("server", s), "protocol_error");
    drop(a);

    // A TLS 1.2-only client.
    let (c, s) = handshake(
        raw_client_config(&m, &web(), None, &[&rustls::version::TLS12]),
        m.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(reason("server", s), "protocol_version");
    assert_eq!(reason("client", c), "protocol_version");

    // The peer hangs up in the middle of the handshake.
    let (a, b) = duplex(64 * 1024);
    let accept = TlsAcceptor::from(m.server_config(&web()).unwrap()).accept(b);
    drop(a);
    let s = tokio::time::timeout(Duration::from_secs(10), accept)
        .await
        .expect("accept hung");
    assert_eq!(reason("server", s), "peer_closed");
}

/// The tunnel's handshake deadlines, on real proxies (two virtual nodes,
/// real sockets, real TLS): the label of a handshake cut at its deadline is
/// `timeout`, read off the proxy's metrics as its endpoint serves them.
///
/// Inbound: connections to the server pod's 15008 that never send a
/// ClientHello, or stall halfway through one, are cut after
/// `handshakeTimeout` (1 s here) and counted as
/// `{side="server",outcome="timeout"}`. Outbound: the server pod's proxy is
/// replaced by a listener on its 15008 that accepts and never answers; the
/// client pod's connection makes its proxy dial that peer, and the client
/// handshake is cut after `connectTimeout` (10 s, the default) and counted
/// as `{side="client",outcome="timeout"}`.
#[test]
fn adversarial_tls_reason_timeout() {
    use common::hbone::{two_nodes, Opts, APP_PORT};
    use std::net::SocketAddr;
    ringway_testbed::run_isolated("adversarial_tls_reason_timeout", || {
        let t = two_nodes(Opts {
            limits: ringway_config::HboneSettings {
                handshake_timeout: Duration::from_secs(1),
                ..Default::default()
            },
            ..Opts::new("tls_reason_timeout")
        });
        let handshakes = |p: &ringway_proxy::Proxy, side: &str, outcome: &str| {
            ringway_testbed::prom::value(
                &common::hbone::metrics_text(p),
                "ringway_tls_handshakes_total",
                &[
                    &format!("side=\"{side}\""),
                    &format!("outcome=\"{outcome}\""),
                ],
            )
            .unwrap_or(0.0)
        };
        let tunnel = SocketAddr::new(t.server().ip(false), 15008);
        // Inbound: one silent connection, one ClientHello cut short.
        let connect = || {
            t.n1.node
                .run(|| std::net::TcpStream::connect_timeout(&tunnel, common::TIMEOUT))
                .expect("TCP to 15008")
        };
        let silent = connect();
        let mut half = connect();
        std::io::Write::write_all(&mut half, &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
        assert!(
            common::wait_until(common::TIMEOUT, || handshakes(&t.p2, "server", "timeout")
                >= 2.0),
            "server handshakes cut at their deadline are labelled timeout:\n{}",
            common::hbone::metrics_text(&t.p2)
        );
        drop((silent, half));

        // Outbound: the server pod's 15008 accepts and never answers.
        assert!(t.p2.remove_pod(&t.server().name).is_some());
        let listener = t.server().netns.run(|| {
            let deadline = std::time::Instant::now() + common::TIMEOUT;
            loop {
                match std::net::TcpListener::bind(tunnel) {
                    Ok(l) => return l,
                    // The proxy's listener may take a moment to go.
                    Err(e) if std::time::Instant::now() < deadline => {
                        eprintln!("binding {tunnel}: {e}; again");
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => panic!("binding {tunnel}: {e}"),
                }
            }
        });
        let before = handshakes(&t.p1, "client", "timeout");
        let app = SocketAddr::new(t.server().ip(false), APP_PORT);
        let mut client = t
            .client()
            .netns
            .run(|| std::net::TcpStream::connect_timeout(&app, common::TIMEOUT))
            .expect("the client's connection is taken by its proxy");
        std::io::Write::write_all(&mut client, b"hello").unwrap();
        assert!(
            common::wait_until(common::TIMEOUT, || handshakes(&t.p1, "client", "timeout")
                > before),
            "a client handshake to a peer that never answers is labelled timeout:\n{}",
            common::hbone::metrics_text(&t.p1)
        );
        // The silent peer saw the proxy's connection (and nothing answered it).
        listener.set_nonblocking(true).unwrap();
        assert!(
            listener.accept().is_ok(),
            "the proxy dialled the silent peer"
        );
    });
}

/// The classification the tunnel relies on: its deadline error
/// ([`HandshakeTimeout`]) is `timeout`; any other I/O timeout is `io`.
#[tokio::test]
async fn tls_reason_of_the_handshake_deadline_error() {
    // A handshake against a peer that never answers, cut by a deadline
    // raised as the tunnel raises it.
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let (a, _silent) = duplex(64 * 1024);
    let limit = Duration::from_millis(200);
    let connect = TlsConnector::from(m.client_config(&front(), &web()).unwrap())
        .connect(placeholder_server_name(), a);
    let c = match tokio::time::timeout(limit, connect).await {
        Ok(r) => r,
        Err(_) => Err(HandshakeTimeout::io(limit)),
    };
    assert_eq!(reason("client", c), "timeout");
    // An I/O timeout that is not the handshake deadline is not counted as one.
    let other = std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out");
    assert_eq!(tls_failure_reason(&other), "io");
}
