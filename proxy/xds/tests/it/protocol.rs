//! The protocol as a correct client speaks it: what the first requests
//! carry, one answer per response, NACKs with the handler's words, resuming
//! from held versions after a reconnect, the server's trailers, stopping.

use std::collections::HashMap;

use ringway_xds::proto::CODE_INVALID_ARGUMENT;
use ringway_xds::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

use crate::support::*;

#[test]
fn first_requests_carry_node_bearer_and_cluster_id() {
    isolated("xds_first_requests", || {
        let bed = Bed::new("xds_first_requests");
        bed.server.update_fixture(
            ADDRESS_TYPE_URL,
            vec![workload(
                "Kubernetes//v1/Pod/shop/web-1",
                "1",
                [10, 244, 1, 5],
            )],
            vec![],
        );
        let config = bed.config();
        let client = RunningClient::start(config.clone());
        for type_url in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL] {
            let first = bed.request(&format!("the first request of {type_url}"), |r| {
                r.first_of_type && r.request.type_url == type_url
            });
            let req = &first.request;
            assert_eq!(req.node.as_ref(), Some(&config.node), "the node, in full");
            let node = req.node.as_ref().unwrap();
            assert_eq!(
                node.id,
                "ztunnel~10.244.1.2~ringway-node-a.istio-system~istio-system.svc.cluster.local"
            );
            assert_eq!(node.metadata_str("NODE_NAME"), Some("node-a"));
            assert!(req.response_nonce.is_empty(), "no nonce: {req:?}");
            assert!(req.error_detail.is_none());
            assert!(req.resource_names_subscribe.is_empty(), "wildcard: {req:?}");
            assert!(req.resource_names_unsubscribe.is_empty());
            assert!(
                req.initial_resource_versions.is_empty(),
                "nothing held yet: {req:?}"
            );
            assert_eq!(first.bearer_token(), Some(TOKEN), "{:?}", first.headers);
            assert_eq!(first.header("clusterid"), Some(CLUSTER));
            assert_eq!(first.header("content-type"), Some("application/grpc"));
            assert_eq!(first.header("te"), Some("trailers"));
        }
        let reqs = bed.server.requests();
        assert_eq!(
            reqs[0].request.type_url, ADDRESS_TYPE_URL,
            "first requests go in the configured order"
        );
        assert_eq!(reqs[0].stream, reqs[1].stream, "one stream for both types");
        // Later requests (the ACKs) carry no node.
        let ack = bed.request("an ACK", |r| r.request.is_ack());
        assert!(ack.request.node.is_none(), "{:?}", ack.request);
        client.wait("the workload applied", |s| {
            s.held(ADDRESS_TYPE_URL) == versions(&[("Kubernetes//v1/Pod/shop/web-1", "1")])
        });
    });
}

#[test]
fn every_response_is_answered_once_with_an_ack_carrying_its_nonce() {
    isolated("xds_acks", || {
        let bed = Bed::new("xds_acks");
        let client = RunningClient::start(bed.config());
        // The first response of each type comes even with nothing to send.
        client.wait("both initial responses", |s| s.responses.len() == 2);
        let mut nonces = Vec::new();
        for i in 0..5u8 {
            let uid = format!("Kubernetes//v1/Pod/shop/web-{i}");
            nonces.extend(bed.server.push(
                ADDRESS_TYPE_URL,
                vec![workload(&uid, "1", [10, 244, 1, i])],
                vec![],
            ));
            nonces.extend(bed.server.push(
                AUTHORIZATION_TYPE_URL,
                vec![policy("shop", &format!("p{i}"), "1")],
                vec![],
            ));
        }
        nonces.extend(bed.server.push(
            ADDRESS_TYPE_URL,
            vec![],
            vec!["Kubernetes//v1/Pod/shop/web-0".into()],
        ));
        assert_eq!(nonces.len(), 11, "one stream, one nonce per push");
        let last = nonces.last().unwrap().clone();
        bed.request("the ACK of the last push", |r| {
            r.request.response_nonce == last
        });

        let sent = bed.server.sent();
        let reqs = bed.server.requests();
        assert_eq!(sent.len(), 13, "2 initial responses and 11 pushes");
        for s in &sent {
            let answers: Vec<_> = reqs
                .iter()
                .filter(|r| r.request.response_nonce == s.nonce)
                .collect();
            assert_eq!(
                answers.len(),
                1,
                "exactly one answer to {}: {answers:?}",
                s.nonce
            );
            let a = &answers[0];
            assert!(a.request.is_ack(), "{:?}", a.request);
            assert_eq!(a.request.type_url, s.type_url);
            assert_eq!(a.stream, s.stream);
            assert!(a.request.node.is_none());
        }
        let answers = reqs.iter().filter(|r| r.request.is_answer()).count();
        assert_eq!(answers, sent.len(), "no answer without a response");
        let store = client.store();
        let acked = store
            .events
            .iter()
            .filter(|e| matches!(e, Seen::Acked { .. }))
            .count();
        assert_eq!(acked, 13);
        assert_eq!(store.held(ADDRESS_TYPE_URL).len(), 4, "web-0 was removed");
        assert_eq!(store.held(AUTHORIZATION_TYPE_URL).len(), 5);
        assert_eq!(store.connects(), 1, "no reconnect along the way");
    });
}

#[test]
fn a_refused_resource_is_nacked_with_the_handlers_message_and_the_stream_goes_on() {
    isolated("xds_nack", || {
        let bed = Bed::new("xds_nack");
        let client = RunningClient::start(bed.config());
        client.wait("both initial responses", |s| s.responses.len() == 2);
        let nonce = bed
            .server
            .push(
                ADDRESS_TYPE_URL,
                vec![
                    workload("Kubernetes//v1/Pod/shop/good", "1", [10, 244, 1, 7]),
                    workload("bad-uid", "1", [10, 244, 1, 8]),
                ],
                vec![],
            )
            .pop()
            .unwrap();
        let nack = bed.request("the NACK", |r| r.request.response_nonce == nonce);
        assert!(nack.request.is_nack(), "{:?}", nack.request);
        let detail = nack.request.error_detail.as_ref().unwrap();
        assert_eq!(detail.code, CODE_INVALID_ARGUMENT);
        assert_eq!(detail.message, "refused bad-uid");
        assert_eq!(nack.request.type_url, ADDRESS_TYPE_URL);
        // The good resource of the same response is applied.
        client.wait("the good workload applied", |s| {
            s.held(ADDRESS_TYPE_URL) == versions(&[("Kubernetes//v1/Pod/shop/good", "1")])
        });
        assert!(client.store().events.contains(&Seen::Nacked {
            nonce: nonce.clone(),
            message: "refused bad-uid".into()
        }));

        // A payload of the wrong type is the handler's to refuse, by name.
        let mut wrong = policy("shop", "p", "1");
        wrong.name = "Kubernetes//v1/Pod/shop/not-a-workload".into();
        let nonce = bed
            .server
            .push(ADDRESS_TYPE_URL, vec![wrong], vec![])
            .pop()
            .unwrap();
        let nack = bed.request("the second NACK", |r| r.request.response_nonce == nonce);
        assert_eq!(
            nack.nack_message(),
            Some("refused Kubernetes//v1/Pod/shop/not-a-workload")
        );

        // The stream goes on: the next push is ACKed on it.
        let nonce = bed
            .server
            .push(
                ADDRESS_TYPE_URL,
                vec![workload(
                    "Kubernetes//v1/Pod/shop/next",
                    "1",
                    [10, 244, 1, 9],
                )],
                vec![],
            )
            .pop()
            .unwrap();
        let ack = bed.request("the ACK after the NACKs", |r| {
            r.request.response_nonce == nonce
        });
        assert!(ack.request.is_ack());
        assert_eq!(ack.stream, nack.stream, "same stream");
        assert_eq!(client.store().connects(), 1);
    });
}

#[test]
fn a_reconnect_resumes_from_held_versions_and_gets_only_what_changed() {
    isolated("xds_resume", || {
        let bed = Bed::new("xds_resume");
        let (a, b, c, d) = (
            "Kubernetes//v1/Pod/shop/a",
            "Kubernetes//v1/Pod/shop/b",
            "Kubernetes//v1/Pod/shop/c",
            "Kubernetes//v1/Pod/shop/d",
        );
        bed.server.update_fixture(
            ADDRESS_TYPE_URL,
            vec![
                workload(a, "1", [10, 0, 0, 1]),
                workload(b, "1", [10, 0, 0, 2]),
                workload(c, "1", [10, 0, 0, 3]),
            ],
            vec![],
        );
        bed.server.update_fixture(
            AUTHORIZATION_TYPE_URL,
            vec![policy("shop", "p", "1")],
            vec![],
        );
        let client = RunningClient::start(bed.config());
        client.wait("everything applied", |s| {
            s.held(ADDRESS_TYPE_URL).len() == 3 && s.held(AUTHORIZATION_TYPE_URL).len() == 1
        });
        let first_stream = bed.server.requests()[0].stream;

        // While the stream is down: b changes, c goes, d comes; and the
        // token rotates (it is read at every connect).
        bed.server.update_fixture(
            ADDRESS_TYPE_URL,
            vec![
                workload(b, "2", [10, 0, 0, 22]),
                workload(d, "1", [10, 0, 0, 4]),
            ],
            vec![c.into()],
        );
        std::fs::write(bed.token_file(), "rotated-token").unwrap();
        assert_eq!(bed.server.drop_streams(), 1);

        let again = bed.request("the first address request after the reset", |r| {
            r.first_of_type && r.stream != first_stream && r.request.type_url == ADDRESS_TYPE_URL
        });
        assert_eq!(
            again.request.initial_resource_versions,
            HashMap::from([
                (a.to_owned(), "1".to_owned()),
                (b.to_owned(), "1".to_owned()),
                (c.to_owned(), "1".to_owned()),
            ]),
            "what the handler held"
        );
        assert!(
            again.request.node.is_some(),
            "the node again on the new stream"
        );
        assert_eq!(again.bearer_token(), Some("rotated-token"));
        let policies = bed.request("the first policy request after the reset", |r| {
            r.first_of_type
                && r.stream == again.stream
                && r.request.type_url == AUTHORIZATION_TYPE_URL
        });
        assert_eq!(
            policies.request.initial_resource_versions,
            HashMap::from([("shop/p".to_owned(), "1".to_owned())])
        );

        client.wait("the changes applied", |s| {
            s.held(ADDRESS_TYPE_URL) == versions(&[(a, "1"), (b, "2"), (d, "1")])
        });
        // Only what changed was sent on the new stream.
        let sent: Vec<_> = bed
            .server
            .sent()
            .into_iter()
            .filter(|s| s.stream == again.stream)
            .collect();
        let addresses = sent
            .iter()
            .find(|s| s.type_url == ADDRESS_TYPE_URL)
            .unwrap();
        assert_eq!(
            addresses.resources,
            [
                (b.to_owned(), "2".to_owned()),
                (d.to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(addresses.removed, [c.to_owned()]);
        let pols = sent
            .iter()
            .find(|s| s.type_url == AUTHORIZATION_TYPE_URL)
            .unwrap();
        assert!(
            pols.resources.is_empty() && pols.removed.is_empty(),
            "{pols:?}"
        );

        let store = client.store();
        let resets = store.disconnects("http2");
        assert_eq!(resets.len(), 1, "{:?}", store.events);
        assert!(
            matches!(
                resets[0],
                Seen::Disconnected {
                    established: true,
                    ..
                }
            ),
            "{resets:?}"
        );
        assert_eq!(
            store.held_at_disconnect,
            [4],
            "state kept through the disconnect"
        );
        assert_eq!(store.connects(), 2);
    });
}

#[test]
fn the_servers_trailers_end_the_stream_and_the_client_comes_back() {
    isolated("xds_trailers", || {
        let bed = Bed::new("xds_trailers");
        bed.server.update_fixture(
            AUTHORIZATION_TYPE_URL,
            vec![policy("shop", "p", "1")],
            vec![],
        );
        let client = RunningClient::start(bed.config());
        client.wait("the policy applied", |s| {
            s.held(AUTHORIZATION_TYPE_URL).len() == 1
        });
        assert_eq!(bed.server.end_streams(14, "überlastet: 100% busy\n"), 1);
        client.wait("the stream's end seen", |s| {
            !s.disconnects("ended").is_empty()
        });
        let store = client.store();
        let Seen::Disconnected { error, .. } = store.disconnects("ended")[0] else {
            unreachable!()
        };
        assert!(
            error.contains("unavailable (14): überlastet: 100% busy\n"),
            "grpc-message percent-decoded: {error}"
        );
        drop(store);
        let second = bed.request("a new stream", |r| {
            r.first_of_type && r.stream == 2 && r.request.type_url == AUTHORIZATION_TYPE_URL
        });
        assert_eq!(
            second.request.initial_resource_versions,
            HashMap::from([("shop/p".to_owned(), "1".to_owned())])
        );
    });
}

#[test]
fn stop_ends_the_client_and_its_stream() {
    isolated("xds_stop", || {
        let bed = Bed::new("xds_stop");
        let client = RunningClient::start(bed.config());
        client.wait("both initial responses", |s| s.responses.len() == 2);
        assert_eq!(bed.server.live_streams(), 1);
        client.stop();
        assert!(
            ringway_testbed::wait_until(WAIT, || bed.server.live_streams() == 0),
            "the stream is closed once the client stopped"
        );
        let count = bed.server.connections();
        assert_eq!(count, 1, "no reconnect after stop");
    });
}
