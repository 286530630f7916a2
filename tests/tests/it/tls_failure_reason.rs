//! The `outcome` label of `ringway_tls_handshakes_total` for real rustls
//! failures: each handshake below fails for one reason (over an in-memory
//! pipe, with the identity crate's real configs and verifiers) and the
//! label must name that reason, taken from the error's type.

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

#[tokio::test]
async fn adversarial_tls_reason_timeout() {
    // A server that never answers: the handshake is cut at its deadline as
    // the tunnel cuts it (`tunnel::inbound`), and the label says so.
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
