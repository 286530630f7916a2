//! What a hostile or broken server, or a broken environment, must not
//! achieve: garbage, oversized and compressed messages drop the stream
//! (never the handler's state) and the client comes back; responses of
//! types it did not ask for are NACKed unseen by the handler; a server
//! whose certificate is not from the mesh root, or not for the configured
//! name, gets no request (and the next address of the name is tried);
//! without a token the client never connects.

use std::time::Duration;

use prost::Message;
use ringway_identity::CaSigner;
use ringway_xds::proto::{DeltaDiscoveryResponse, CODE_INVALID_ARGUMENT};
use ringway_xds::{
    ClientConfig, Keepalive, TypedResource, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL,
};

use crate::support::*;

/// A client holding one workload, and the stream it got it on.
fn holding_one(test: &str) -> (Bed, RunningClient, u64) {
    holding_one_with(test, |_| {})
}

/// [`holding_one`] with a change to the client's config (after a 1 MiB
/// message limit).
fn holding_one_with(
    test: &str,
    change: impl FnOnce(&mut ClientConfig),
) -> (Bed, RunningClient, u64) {
    let bed = Bed::new(test);
    bed.server.update_fixture(
        ADDRESS_TYPE_URL,
        vec![workload("Kubernetes//v1/Pod/shop/a", "1", [10, 0, 0, 1])],
        vec![],
    );
    let mut config = bed.config();
    config.max_message_bytes = 1 << 20;
    change(&mut config);
    let client = RunningClient::start(config);
    client.wait("the workload applied", |s| {
        s.held(ADDRESS_TYPE_URL).len() == 1
    });
    let stream = bed.server.requests()[0].stream;
    (bed, client, stream)
}

/// After a fault on `old`: the client came back on a new stream (streams
/// are numbered in open order), sent what it holds, and its state was never
/// emptied. The new stream.
fn came_back_holding_it(bed: &Bed, client: &RunningClient, old: u64) -> u64 {
    let again = bed.request("the client back on a new stream", |r| {
        r.first_of_type && r.stream > old && r.request.type_url == ADDRESS_TYPE_URL
    });
    assert_eq!(
        again
            .request
            .initial_resource_versions
            .get("Kubernetes//v1/Pod/shop/a"),
        Some(&"1".to_owned()),
        "the held version is sent: {:?}",
        again.request
    );
    let store = client.store();
    assert_eq!(store.held(ADDRESS_TYPE_URL).len(), 1, "state kept");
    assert!(
        store.held_at_disconnect.iter().all(|n| *n == 1),
        "never emptied by a disconnect: {:?}",
        store.held_at_disconnect
    );
    again.stream
}

#[test]
fn adversarial_garbage_message_drops_the_stream_and_keeps_the_state() {
    isolated("xds_garbage", || {
        let (bed, client, stream) = holding_one("xds_garbage");
        let answers_before = bed.server.requests().len();
        // Field 1 with wire type 7, which does not exist: no nonce to NACK.
        assert_eq!(bed.server.push_raw_message(&[0x0f, 0xff, 0xff]), 1);
        client.wait("the stream dropped for the garbage", |s| {
            !s.disconnects("decode").is_empty()
        });
        came_back_holding_it(&bed, &client, stream);
        let reqs = bed.server.requests();
        assert!(
            reqs[answers_before..]
                .iter()
                .filter(|r| r.stream == stream)
                .all(|r| !r.request.is_answer()),
            "the garbage got no answer on its stream"
        );
        let store = client.store();
        let Seen::Disconnected {
            error, established, ..
        } = store.disconnects("decode")[0]
        else {
            unreachable!()
        };
        assert!(*established);
        assert!(error.contains("3-byte message"), "{error}");
        assert!(error.contains("not a DeltaDiscoveryResponse"), "{error}");
    });
}

#[test]
fn adversarial_oversized_message_is_refused_from_its_prefix() {
    isolated("xds_oversized", || {
        let (bed, client, stream) = holding_one("xds_oversized");
        // 64 MiB announced against a 1 MiB limit; only 64 KiB of it ever
        // comes, so a client that waited for the rest would hang there.
        assert_eq!(bed.server.push_oversized(64 << 20), 1);
        client.wait("the stream dropped for the size", |s| {
            !s.disconnects("too_large").is_empty()
        });
        let store = client.store();
        let Seen::Disconnected { error, .. } = store.disconnects("too_large")[0] else {
            unreachable!()
        };
        assert!(error.contains("67108864 bytes"), "{error}");
        assert!(error.contains("limit of 1048576 bytes"), "{error}");
        drop(store);
        came_back_holding_it(&bed, &client, stream);
    });
}

#[test]
fn adversarial_a_silent_server_is_dropped_after_an_unanswered_ping() {
    isolated("xds_silent", || {
        let (bed, client, stream) = holding_one_with("xds_silent", |c| {
            c.keepalive = Keepalive {
                interval: Duration::from_millis(100),
                timeout: Duration::from_secs(2),
            };
        });
        assert!(
            client.store().disconnects("keepalive_timeout").is_empty(),
            "answered PINGs keep the connection"
        );
        assert_eq!(bed.server.connections(), 1);
        // The connection goes silent: no FIN, no RST, no answer.
        bed.server.stall_connections();
        client.wait("the silent connection dropped", |s| {
            !s.disconnects("keepalive_timeout").is_empty()
        });
        {
            let store = client.store();
            let Seen::Disconnected { error, .. } = store.disconnects("keepalive_timeout")[0] else {
                unreachable!()
            };
            assert!(error.contains("no answer to an HTTP/2 PING"), "{error}");
        }
        came_back_holding_it(&bed, &client, stream);
        assert_eq!(bed.server.connections(), 2, "a new connection");
    });
}

#[test]
fn adversarial_compressed_or_misflagged_messages_drop_the_stream() {
    isolated("xds_flags", || {
        let (bed, client, mut stream) = holding_one("xds_flags");
        for (data, words) in [
            (vec![1u8, 0, 0, 0, 1, 0], "compressed"),
            (vec![7u8, 0, 0, 0, 0], "flag 7"),
        ] {
            let before = client.store().disconnects("bad_frame").len();
            assert_eq!(bed.server.push_raw_data(&data), 1);
            client.wait(words, |s| s.disconnects("bad_frame").len() == before + 1);
            let store = client.store();
            let Seen::Disconnected { error, .. } = store.disconnects("bad_frame")[before] else {
                unreachable!()
            };
            assert!(error.contains(words), "{error}");
            drop(store);
            stream = came_back_holding_it(&bed, &client, stream);
        }
    });
}

#[test]
fn adversarial_response_of_an_unsubscribed_type_is_nacked_naming_it() {
    isolated("xds_stray_type", || {
        let bed = Bed::new("xds_stray_type");
        let mut config = bed.config();
        config.type_urls = vec![ADDRESS_TYPE_URL.to_owned()];
        let client = RunningClient::start(config);
        client.wait("the initial response", |s| s.responses.len() == 1);
        let stray = DeltaDiscoveryResponse {
            resources: vec![policy("shop", "p", "1")],
            type_url: AUTHORIZATION_TYPE_URL.to_owned(),
            nonce: "stray-1".into(),
            ..Default::default()
        };
        bed.server.push_raw_message(&stray.encode_to_vec());
        let nack = bed.request("the NACK of the stray type", |r| {
            r.request.response_nonce == "stray-1"
        });
        assert_eq!(nack.request.type_url, AUTHORIZATION_TYPE_URL);
        let detail = nack.request.error_detail.as_ref().expect("a NACK");
        assert_eq!(detail.code, CODE_INVALID_ARGUMENT);
        assert!(
            detail.message.contains(AUTHORIZATION_TYPE_URL),
            "names the type: {}",
            detail.message
        );
        // A stray type_url in an Address type: the handler never saw it,
        // and the stream goes on.
        let nonce = bed
            .server
            .push(
                ADDRESS_TYPE_URL,
                vec![workload("Kubernetes//v1/Pod/shop/a", "1", [10, 0, 0, 1])],
                vec![],
            )
            .pop()
            .unwrap();
        let ack = bed.request("the next ACK", |r| r.request.response_nonce == nonce);
        assert_eq!(ack.stream, nack.stream);
        let store = client.store();
        assert!(
            store
                .responses
                .iter()
                .all(|r| r.type_url == ADDRESS_TYPE_URL),
            "the handler saw only its type"
        );
        assert!(store.held(AUTHORIZATION_TYPE_URL).is_empty());
        assert_eq!(store.connects(), 1);
        // The payload was decodable: it was refused for its type alone.
        assert!(ringway_xds::proto::security::Authorization::from_any(
            stray.resources[0].resource.as_ref().unwrap()
        )
        .is_ok());
    });
}

#[test]
fn adversarial_server_certificate_not_from_the_mesh_root_is_refused() {
    isolated("xds_untrusted", || {
        // The server's certificate is for the right name, from another CA.
        let other = CaSigner::generate_for_tests("cluster.local");
        let leaf = other.issue_dns_for_tests(SERVER_NAME);
        let mesh = CaSigner::generate_for_tests("cluster.local");
        let bed = Bed::serving("xds_untrusted", mesh, leaf);
        let client = RunningClient::start(bed.config());
        client.wait("two refused handshakes", |s| {
            s.disconnects("tls").len() >= 2
        });
        let store = client.store();
        let Seen::Disconnected {
            error, established, ..
        } = store.disconnects("tls")[0]
        else {
            unreachable!()
        };
        assert!(!*established);
        assert!(error.contains("UnknownIssuer"), "{error}");
        assert_eq!(store.connects(), 0);
        drop(store);
        assert!(bed.server.connections() >= 2, "it did reach the server");
        assert_eq!(
            bed.server.request_count(),
            0,
            "no request to an untrusted server"
        );
    });
}

/// The control plane's name resolves to two addresses and the first one
/// completes no handshake the client accepts (a replica still serving a
/// certificate of another root, a stale endpoint): the client goes on to
/// the next address in the same attempt and connects there. Without that,
/// each attempt would stop at the first address and the proxy would never
/// reach the control plane while one replica is bad.
#[test]
fn adversarial_a_tls_failure_at_the_first_address_moves_on_to_the_next() {
    isolated("xds_next_address", || {
        let hosts = ringway_testbed::TempDir::new("xds_next_address_hosts");
        ringway_testbed::ns::override_etc_hosts(
            &hosts,
            "127.0.0.2 istiod.test\n127.0.0.3 istiod.test\n",
        )
        .unwrap();
        // In the order the resolver gives them.
        let order: Vec<std::net::IpAddr> =
            std::net::ToSocketAddrs::to_socket_addrs("istiod.test:1")
                .unwrap()
                .map(|a| a.ip())
                .collect();
        assert_eq!(order.len(), 2, "{order:?}");
        let mesh = CaSigner::generate_for_tests("cluster.local");
        let leaf = mesh.issue_dns_for_tests(SERVER_NAME);
        let good = ringway_xds::testing::XdsServer::start(
            std::net::SocketAddr::new(order[1], 0),
            ringway_xds::testing::server_tls(leaf.chain, leaf.key).unwrap(),
        )
        .unwrap();
        let port = good.addr().port();
        let other = CaSigner::generate_for_tests("cluster.local");
        let leaf = other.issue_dns_for_tests(SERVER_NAME);
        let bad = ringway_xds::testing::XdsServer::start(
            std::net::SocketAddr::new(order[0], port),
            ringway_xds::testing::server_tls(leaf.chain, leaf.key).unwrap(),
        )
        .unwrap();
        let bed = Bed {
            ca: mesh,
            server: good,
            dir: ringway_testbed::TempDir::new("xds_next_address"),
        };
        std::fs::write(bed.token_file(), format!("{TOKEN}\n")).unwrap();
        let mut config = bed.config();
        config.address = format!("istiod.test:{port}");
        let client = RunningClient::start(config);
        client.wait("connected through the second address", |s| {
            s.connects() >= 1
        });
        // The subscription reaches the second replica (the client says it
        // is connected once it has sent it, maybe before it arrives).
        bed.request("the subscription at the second address", |_| true);
        assert!(bad.connections() >= 1, "the first address was not tried");
        assert_eq!(bad.request_count(), 0, "a request to the untrusted replica");
    });
}

#[test]
fn adversarial_server_certificate_for_another_name_is_refused() {
    isolated("xds_wrong_name", || {
        let mesh = CaSigner::generate_for_tests("cluster.local");
        let leaf = mesh.issue_dns_for_tests("evil.istio-system.svc");
        let bed = Bed::serving("xds_wrong_name", mesh, leaf);
        let client = RunningClient::start(bed.config());
        client.wait("two refused handshakes", |s| {
            s.disconnects("tls").len() >= 2
        });
        let store = client.store();
        let Seen::Disconnected { error, .. } = store.disconnects("tls")[0] else {
            unreachable!()
        };
        assert!(
            error.contains("not valid for name \"istiod.istio-system.svc\""),
            "{error}"
        );
        drop(store);
        assert_eq!(bed.server.request_count(), 0);
    });
}

#[test]
fn adversarial_missing_token_file_never_connects_without_credentials() {
    isolated("xds_no_token", || {
        let bed = Bed::new("xds_no_token");
        std::fs::remove_file(bed.token_file()).unwrap();
        let client = RunningClient::start(bed.config());
        client.wait("two attempts without a token", |s| {
            s.disconnects("token_missing").len() >= 2
        });
        {
            let store = client.store();
            let Seen::Disconnected {
                error, established, ..
            } = store.disconnects("token_missing")[0]
            else {
                unreachable!()
            };
            assert!(!*established);
            assert!(error.contains("reading the token file"), "{error}");
        }
        assert_eq!(bed.server.connections(), 0, "no connection without a token");

        // An empty (whitespace) token is no better.
        std::fs::write(bed.token_file(), " \n").unwrap();
        client.wait("two attempts with an empty token", |s| {
            s.events
                .iter()
                .filter(
                    |e| matches!(e, Seen::Disconnected { error, .. } if error.contains("is empty")),
                )
                .count()
                >= 2
        });
        assert_eq!(
            bed.server.connections(),
            0,
            "no connection with an empty token"
        );

        std::fs::write(bed.token_file(), format!("{TOKEN}\n")).unwrap();
        let first = bed.request("a request once the token is there", |r| r.first_of_type);
        assert_eq!(first.bearer_token(), Some(TOKEN));
        assert!(
            bed.server
                .requests()
                .iter()
                .all(|r| r.bearer_token() == Some(TOKEN)),
            "every request carries the token"
        );
        client.wait("the initial responses", |s| s.responses.len() == 2);
    });
}
