//! Real TLS 1.3 handshakes over an in-memory pipe (`tokio::io::duplex`):
//! what HBONE's mutual TLS accepts and what it refuses.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ringway_identity::testing::{raw_client_config, raw_server_config};
use ringway_identity::{
    peer_identity, placeholder_server_name, CaSigner, Clock, Identity, IdentityManager,
    ManualClock, TrustBundle, ALPN_H2, DEFAULT_CERT_LIFETIME,
};
use rustls::{ClientConfig, ServerConfig};
use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_rustls::{client, server, TlsAcceptor, TlsConnector};

const TD: &str = "cluster.local";

fn id(ns: &str, sa: &str) -> Identity {
    Identity::new(TD, ns, sa)
}

fn web() -> Identity {
    id("shop", "web")
}

fn front() -> Identity {
    id("front", "frontend")
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

/// Writes a byte each way and reads it back.
async fn ping(
    c: &mut client::TlsStream<DuplexStream>,
    s: &mut server::TlsStream<DuplexStream>,
    n: u8,
) {
    c.write_all(&[n]).await.unwrap();
    c.flush().await.unwrap();
    let mut buf = [0u8; 1];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf[0], n);
    s.write_all(&[n + 1]).await.unwrap();
    s.flush().await.unwrap();
    c.read_exact(&mut buf).await.unwrap();
    assert_eq!(buf[0], n + 1);
}

/// A server that refused: its error, as text.
fn refused(r: std::io::Result<impl Sized>) -> String {
    match r {
        Ok(_) => panic!("handshake succeeded but must be refused"),
        Err(e) => e.to_string(),
    }
}

/// The client's side of a refused handshake: TLS 1.3 clients finish before
/// the server judges their certificate, so the refusal shows on first read.
async fn client_sees_refusal(r: std::io::Result<client::TlsStream<DuplexStream>>) {
    if let Ok(mut c) = r {
        let mut buf = [0u8; 1];
        let read = c.read(&mut buf).await;
        assert!(
            matches!(read, Err(_) | Ok(0)),
            "client read after refusal: {read:?}"
        );
    }
}

#[tokio::test]
async fn mutual_handshake_sees_both_identities_with_h2_and_tls13() {
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let (c, s) = handshake(
        m.client_config(&front(), &web()).unwrap(),
        m.server_config(&web()).unwrap(),
    )
    .await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    assert_eq!(peer_identity(s.get_ref().1).unwrap(), front());
    assert_eq!(peer_identity(c.get_ref().1).unwrap(), web());
    let conns: [&rustls::CommonState; 2] = [c.get_ref().1, s.get_ref().1];
    for conn in conns {
        assert_eq!(conn.alpn_protocol(), Some(ALPN_H2));
        assert_eq!(
            conn.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );
        let suite = format!("{:?}", conn.negotiated_cipher_suite().unwrap().suite());
        assert!(suite.contains("AES") && suite.contains("GCM"), "{suite}");
        assert_eq!(conn.handshake_kind(), Some(rustls::HandshakeKind::Full));
    }
    ping(&mut c, &mut s, 1).await;
    // The client sent no SNI.
    assert_eq!(s.get_ref().1.server_name(), None);

    // No resumption: the same configs make a second full handshake.
    let (c2, s2) = handshake(
        m.client_config(&front(), &web()).unwrap(),
        m.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(
        c2.unwrap().get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Full)
    );
    assert_eq!(
        s2.unwrap().get_ref().1.handshake_kind(),
        Some(rustls::HandshakeKind::Full)
    );
}

#[tokio::test]
async fn configs_are_cached_per_identity_pair() {
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let s1 = m.server_config(&web()).unwrap();
    assert!(Arc::ptr_eq(&s1, &m.server_config(&web()).unwrap()));
    let c1 = m.client_config(&front(), &web()).unwrap();
    assert!(Arc::ptr_eq(
        &c1,
        &m.client_config(&front(), &web()).unwrap()
    ));
    let c2 = m.client_config(&front(), &id("db", "db")).unwrap();
    assert!(!Arc::ptr_eq(&c1, &c2));
    assert_eq!(m.issued_count(), 2, "one certificate per local identity");
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let (c, s) = handshake(
        raw_client_config(&m, &web(), None, &[&rustls::version::TLS13]),
        m.server_config(&web()).unwrap(),
    )
    .await;
    let e = refused(s);
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    client_sees_refusal(c).await;
}

fn roots(certs: &[&rustls_pki_types::CertificateDer<'static>]) -> TrustBundle {
    let mut b = TrustBundle::new();
    for c in certs {
        b.add((*c).clone());
    }
    b
}

#[tokio::test]
async fn client_from_another_root_is_refused() {
    let ours = CaSigner::generate_for_tests(TD);
    let theirs = CaSigner::generate_for_tests(TD);
    let our_root = ours.cert().clone();
    // The foreign client trusts our root, so only the server can refuse.
    let server = manager(ours, TrustBundle::new());
    let client = manager(theirs, roots(&[&our_root]));
    let (c, s) = handshake(
        client.client_config(&front(), &web()).unwrap(),
        server.server_config(&web()).unwrap(),
    )
    .await;
    let e = refused(s);
    assert!(e.contains("UnknownIssuer"), "{e}");
    client_sees_refusal(c).await;
}

#[tokio::test]
async fn server_from_another_root_is_refused() {
    let ours = CaSigner::generate_for_tests(TD);
    let theirs = CaSigner::generate_for_tests(TD);
    let client = manager(ours, TrustBundle::new());
    let server = manager(theirs, TrustBundle::new());
    let (c, s) = handshake(
        client.client_config(&front(), &web()).unwrap(),
        server.server_config(&web()).unwrap(),
    )
    .await;
    let e = refused(c);
    assert!(e.contains("UnknownIssuer"), "{e}");
    assert!(s.is_err());
}

#[tokio::test]
async fn expired_certificates_are_refused() {
    let ca = CaSigner::generate_for_tests(TD);
    let now = SystemTime::now();
    let day = Duration::from_secs(86400);
    let expired_client = ca.issue_for_tests(&front(), now - 2 * day, now - day);
    let expired_server = ca.issue_for_tests(&web(), now - 2 * day, now - day);
    let m = manager(ca, TrustBundle::new());

    // Server refuses an expired client certificate.
    let (c, s) = handshake(
        raw_client_config(&m, &web(), Some(expired_client), &[&rustls::version::TLS13]),
        m.server_config(&web()).unwrap(),
    )
    .await;
    let e = refused(s);
    assert!(e.contains("certificate expired"), "{e}");
    client_sees_refusal(c).await;

    // Client refuses an expired server certificate.
    let (c, _) = handshake(
        m.client_config(&front(), &web()).unwrap(),
        raw_server_config(expired_server),
    )
    .await;
    let e = refused(c);
    assert!(e.contains("certificate expired"), "{e}");
}

#[tokio::test]
async fn client_refuses_a_server_san_that_is_not_the_expected_spiffe_id() {
    let ca = CaSigner::generate_for_tests(TD);
    let leaves = [
        (
            ca.issue_with_uris_for_tests(&["spiffe://evil.org/ns/shop/sa/web"]),
            "evil.org",
        ),
        (
            ca.issue_with_uris_for_tests(&["https://web.shop.svc/"]),
            "scheme",
        ),
        (ca.issue_with_uris_for_tests(&[]), "no subjectAltName"),
        (
            ca.issue_with_uris_for_tests(&[
                "spiffe://cluster.local/ns/shop/sa/web",
                "spiffe://cluster.local/ns/shop/sa/admin",
            ]),
            "2 URI SANs",
        ),
        (
            ca.issue_with_uris_for_tests(&["spiffe://cluster.local/ns/shop"]),
            "path",
        ),
    ];
    let m = manager(ca, TrustBundle::new());
    for (leaf, why) in leaves {
        let (c, _) = handshake(
            m.client_config(&front(), &web()).unwrap(),
            raw_server_config(leaf),
        )
        .await;
        let e = refused(c);
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[tokio::test]
async fn client_refuses_a_valid_server_of_the_wrong_identity() {
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let (c, s) = handshake(
        m.client_config(&front(), &web()).unwrap(),
        m.server_config(&id("shop", "db")).unwrap(),
    )
    .await;
    let e = refused(c);
    // rustls renders our error with Debug.
    assert!(
        e.contains("UnexpectedPeer") && e.contains("\"spiffe://cluster.local/ns/shop/sa/db\""),
        "{e}"
    );
    assert!(s.is_err());
}

#[tokio::test]
async fn server_refuses_a_client_of_another_trust_domain() {
    let ca = CaSigner::generate_for_tests(TD);
    let foreign = ca.issue_with_uris_for_tests(&["spiffe://evil.org/ns/front/sa/frontend"]);
    let not_spiffe = ca.issue_with_uris_for_tests(&["https://front.example/"]);
    let m = manager(ca, TrustBundle::new());
    for (leaf, why) in [(foreign, "evil.org"), (not_spiffe, "scheme")] {
        let (c, s) = handshake(
            raw_client_config(&m, &web(), Some(leaf), &[&rustls::version::TLS13]),
            m.server_config(&web()).unwrap(),
        )
        .await;
        let e = refused(s);
        assert!(e.contains(why), "{why}: {e}");
        client_sees_refusal(c).await;
    }
}

#[tokio::test]
async fn ca_rotation_old_and_new_roots_both_accepted_while_bundled() {
    let old = CaSigner::generate_for_tests(TD);
    let new = CaSigner::generate_for_tests(TD);
    let newer = CaSigner::generate_for_tests(TD);
    let (old_root, new_root, newer_root) =
        (old.cert().clone(), new.cert().clone(), newer.cert().clone());
    // A node already on the new CA trusts the old root too; a node still on
    // the old CA has received the new root.
    let new_node = manager(new, roots(&[&old_root]));
    let old_node = manager(old, roots(&[&new_root, &newer_root]));
    assert_eq!(new_node.bundle().roots().len(), 2);

    // old-signed client -> new-signed server
    let (c, s) = handshake(
        old_node.client_config(&front(), &web()).unwrap(),
        new_node.server_config(&web()).unwrap(),
    )
    .await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    assert_eq!(peer_identity(s.get_ref().1).unwrap(), front());
    ping(&mut c, &mut s, 7).await;

    // new-signed client -> old-signed server
    let (c, s) = handshake(
        new_node.client_config(&front(), &web()).unwrap(),
        old_node.server_config(&web()).unwrap(),
    )
    .await;
    assert_eq!(peer_identity(s.unwrap().get_ref().1).unwrap(), front());
    assert_eq!(peer_identity(c.unwrap().get_ref().1).unwrap(), web());

    // Once the old root leaves the bundle, old-signed leaves are refused.
    let new_only = manager(newer, roots(&[&new_root]));
    let (_, s) = handshake(
        old_node.client_config(&front(), &web()).unwrap(),
        new_only.server_config(&web()).unwrap(),
    )
    .await;
    assert!(refused(s).contains("UnknownIssuer"));
}

#[tokio::test]
async fn rotation_at_half_life_new_cert_new_config_old_session_survives() {
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let hour = Duration::from_secs(3600);
    let m = IdentityManager::new(
        CaSigner::generate_for_tests(TD),
        TrustBundle::new(),
        TD,
        hour,
    )
    .unwrap()
    .with_clock(clock.clone());

    let cert1 = m.fetch(&web()).unwrap();
    let backdated = clock.now().duration_since(cert1.not_before()).unwrap();
    assert!(
        backdated >= Duration::from_secs(299),
        "notBefore backdated: {backdated:?}"
    );
    let server1 = m.server_config(&web()).unwrap();
    let client1 = m.client_config(&front(), &web()).unwrap();
    let (c, s) = handshake(client1.clone(), server1.clone()).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    ping(&mut c, &mut s, 1).await;

    // Before half-life: same certificate, same configs.
    clock.advance(Duration::from_secs(29 * 60));
    assert!(Arc::ptr_eq(&cert1, &m.fetch(&web()).unwrap()));
    assert!(Arc::ptr_eq(&server1, &m.server_config(&web()).unwrap()));

    // Past half-life: renewed, configs rebuilt.
    clock.advance(Duration::from_secs(2 * 60));
    let cert2 = m.fetch(&web()).unwrap();
    assert!(!Arc::ptr_eq(&cert1, &cert2));
    assert_ne!(cert1.serial(), cert2.serial());
    assert_ne!(cert1.chain()[0], cert2.chain()[0]);
    let server2 = m.server_config(&web()).unwrap();
    assert!(!Arc::ptr_eq(&server1, &server2));
    let client2 = m.client_config(&front(), &web()).unwrap();
    // front's certificate (issued at t=0 too) rotated as well.
    assert!(!Arc::ptr_eq(&client1, &client2));

    // The established session keeps working on the old certificate...
    ping(&mut c, &mut s, 3).await;
    // ... and a new handshake gets the new one.
    let (c2, s2) = handshake(client2, server2).await;
    let c2 = c2.unwrap();
    assert_eq!(
        c2.get_ref().1.peer_certificates().unwrap()[0],
        cert2.chain()[0]
    );
    drop(s2);
    ping(&mut c, &mut s, 5).await;
}

#[tokio::test]
async fn tls12_client_is_refused() {
    let ca = CaSigner::generate_for_tests(TD);
    let leaf = ca.issue_with_uris_for_tests(&["spiffe://cluster.local/ns/front/sa/frontend"]);
    let m = manager(ca, TrustBundle::new());
    // A TLS 1.2-only client with every ring suite, a valid certificate, h2.
    let mut cfg =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(m.server_verifier(&web())))
            .with_client_auth_cert(leaf.chain, leaf.key)
            .unwrap();
    cfg.alpn_protocols = vec![ALPN_H2.to_vec()];
    let (c, s) = handshake(Arc::new(cfg), m.server_config(&web()).unwrap()).await;
    let e = refused(s);
    assert!(e.contains("Tls12NotOfferedOrEnabled"), "{e}");
    assert!(c.is_err());
}

#[tokio::test]
async fn alpn_other_than_h2_is_refused() {
    let m = manager(CaSigner::generate_for_tests(TD), TrustBundle::new());
    let mut cfg = (*m.client_config(&front(), &web()).unwrap()).clone();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let (_, s) = handshake(Arc::new(cfg), m.server_config(&web()).unwrap()).await;
    let e = refused(s);
    assert!(e.contains("doesn't support any known protocol"), "{e}");
}

/// A rotation on running managers (`set_bundle`, the roots' file edited):
/// the configs handed out after it carry the new roots in both directions
/// (a peer of the added root is accepted as client and as server), and
/// after the root is removed again both handshakes are refused.
#[tokio::test]
async fn a_bundle_set_at_run_time_is_what_the_handshakes_after_it_verify_against() {
    let (ours, theirs) = (
        CaSigner::generate_for_tests(TD),
        CaSigner::generate_for_tests(TD),
    );
    let (our_root, their_root) = (ours.cert().clone(), theirs.cert().clone());
    let us = manager(ours, TrustBundle::new());
    // The peer already trusts our root; we do not trust theirs yet.
    let peer = manager(theirs, roots(&[&our_root]));
    let both_ways = |us: &IdentityManager| {
        (
            (
                peer.client_config(&front(), &web()).unwrap(),
                us.server_config(&web()).unwrap(),
            ),
            (
                us.client_config(&front(), &web()).unwrap(),
                peer.server_config(&web()).unwrap(),
            ),
        )
    };
    let ((c1, s1), (c2, s2)) = both_ways(&us);
    refused(handshake(c1, s1).await.1);
    client_sees_refusal(handshake(c2, s2).await.0).await;

    us.set_bundle(roots(&[&their_root])).unwrap();
    let ((c1, s1), (c2, s2)) = both_ways(&us);
    let (c, s) = handshake(c1, s1).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    assert_eq!(peer_identity(s.get_ref().1).unwrap(), front());
    ping(&mut c, &mut s, 3).await;
    let (c, s) = handshake(c2, s2).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    ping(&mut c, &mut s, 3).await;

    us.set_bundle(TrustBundle::new()).unwrap();
    let ((c1, s1), (c2, s2)) = both_ways(&us);
    refused(handshake(c1, s1).await.1);
    client_sees_refusal(handshake(c2, s2).await.0).await;
}
