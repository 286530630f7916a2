//! The server's limits against a hostile authenticated peer, over an
//! in-memory stream: a stream reset before its answer cancels its decision
//! (and whatever connect it started); decisions wait for one of
//! `max_connecting_streams` slots.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::{Method, Request};
use ringway_hbone::{serve_connection, Decision, DrainSignal, PeerInfo, ServerConfig};

/// Counts drops of the decision future it lives in.
struct DropCount(Arc<AtomicUsize>);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn connect_request() -> Request<()> {
    Request::builder()
        .method(Method::CONNECT)
        .uri("10.0.0.3:443")
        .body(())
        .unwrap()
}

#[tokio::test]
async fn adversarial_reset_cancels_the_decision_and_frees_the_slot() {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let started = Arc::new(AtomicUsize::new(0));
    let dropped = Arc::new(AtomicUsize::new(0));
    let (s, d) = (started.clone(), dropped.clone());
    let config = ServerConfig {
        max_connecting_streams: 1,
        ..ServerConfig::default()
    };
    let server = tokio::spawn(async move {
        let peer = PeerInfo {
            identity: "spiffe://cluster.local/ns/a/sa/b".into(),
            addr: "10.0.0.2:1000".parse().unwrap(),
        };
        serve_connection(
            server_io,
            peer,
            &config,
            DrainSignal::never(),
            move |_req| {
                let (s, d) = (s.clone(), d.clone());
                async move {
                    s.fetch_add(1, Ordering::SeqCst);
                    let _guard = DropCount(d);
                    // An upstream connect that never completes.
                    std::future::pending::<Decision>().await
                }
            },
        )
        .await
    });
    let (mut client, conn) = h2::client::handshake(client_io).await.unwrap();
    tokio::spawn(conn);
    let (_r1, mut first) = client.send_request(connect_request(), false).unwrap();
    let (_r2, _second) = client.send_request(connect_request(), false).unwrap();
    ringway_testbed::wait_for_async("the first decision", crate::support::WAIT, || {
        started.load(Ordering::SeqCst) == 1
    })
    .await;
    // The second waits for the only slot; resetting the first cancels its
    // decision (the pending connect is dropped) and lets the second start.
    first.send_reset(h2::Reason::CANCEL);
    ringway_testbed::wait_for_async("the first decision dropped", crate::support::WAIT, || {
        dropped.load(Ordering::SeqCst) == 1
    })
    .await;
    ringway_testbed::wait_for_async("the second decision", crate::support::WAIT, || {
        started.load(Ordering::SeqCst) == 2
    })
    .await;
    server.abort();
}
