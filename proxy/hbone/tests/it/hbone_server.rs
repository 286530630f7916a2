//! Server answers (200/400/401/503), request validation, header round-trips, drain.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use ringway_hbone::{Baggage, ConnectHeaders, Decision, HboneError, TraceParent};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn dst() -> std::net::SocketAddr {
    "10.0.0.3:443".parse().unwrap()
}

async fn expect_error(handler: Handler) -> (HboneError, Server) {
    let server = Server::start(handler).await;
    let pool = pool();
    let e = server.open(&pool, dst()).await.unwrap_err();
    // A refused tunnel does not cost the connection.
    assert_eq!(pool.connections(), 1);
    assert_eq!(pool.streams(), 0);
    (e, server)
}

#[tokio::test]
async fn deny_is_401_denied() {
    let (e, _s) = expect_error(fixed_handler(|| {
        Decision::Deny401("no policy allows".into())
    }))
    .await;
    assert!(matches!(e, HboneError::Denied), "{e:?}");
    assert_eq!(e.status(), Some(StatusCode::UNAUTHORIZED));
    assert_eq!(
        e.to_string(),
        "peer denied the tunnel by policy (401 Unauthorized)"
    );
}

#[tokio::test]
async fn unavailable_is_503() {
    let (e, _s) = expect_error(fixed_handler(|| {
        Decision::Unavailable503("no endpoint".into())
    }))
    .await;
    assert!(matches!(e, HboneError::Unavailable), "{e:?}");
    assert_eq!(e.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(
        e.to_string(),
        "peer has no reachable upstream (503 Service Unavailable)"
    );
}

#[tokio::test]
async fn handler_bad_request_is_400() {
    let (e, _s) = expect_error(fixed_handler(|| Decision::BadRequest400("loop".into()))).await;
    assert!(matches!(e, HboneError::BadRequest), "{e:?}");
    assert_eq!(e.status(), Some(StatusCode::BAD_REQUEST));
    assert_eq!(
        e.to_string(),
        "peer rejected the tunnel request as malformed (400 Bad Request)"
    );
}

/// A refused upstream connect (the backend is gone) is a 503 through the real handler.
#[tokio::test]
async fn upstream_connect_refused_is_503() {
    let free = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = free.local_addr().unwrap();
    drop(free);
    let handler: Handler = Arc::new(move |_req| {
        Box::pin(async move {
            match tokio::net::TcpStream::connect(dead_addr).await {
                Ok(s) => Decision::Accept(s.into()),
                Err(e) => Decision::Unavailable503(e.to_string()),
            }
        })
    });
    let (e, _s) = expect_error(handler).await;
    assert!(matches!(e, HboneError::Unavailable), "{e:?}");
}

/// `forwarded`, `:authority`, `baggage` and `traceparent` reach the handler intact, for v4
/// and v6 clients; every connection gets a new trace id.
#[tokio::test]
async fn headers_round_trip_v4_and_v6() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let baggage = Baggage {
        cluster: Some("Kubernetes".into()),
        namespace: Some("shop".into()),
        workload_kind: Some("statefulset".into()),
        workload: Some("cart".into()),
        service: Some("cart".into()),
        revision: Some("v2".into()),
    };
    let cases: [(&str, &str); 2] = [
        ("10.244.1.7:41234", "10.244.2.9:8080"),
        ("[fd00:244:1::7]:41234", "[fd00:244:2::9]:8080"),
    ];
    for (client, target) in cases {
        let h = ConnectHeaders::new(target.parse().unwrap())
            .forwarded_for(client.parse().unwrap())
            .baggage(baggage.clone());
        let mut s = pool
            .connect(server.key(), || dial(server.addr), h)
            .await
            .unwrap();
        s.shutdown().await.unwrap();
        read_all(&mut s).await.unwrap();
    }
    let reqs = server.requests.lock().unwrap().clone();
    assert_eq!(reqs.len(), 2);
    for (req, (client, target)) in reqs.iter().zip(cases) {
        assert_eq!(req.forwarded_for, Some(client.parse().unwrap()));
        assert_eq!(req.authority, target.parse().unwrap());
        assert_eq!(req.baggage, baggage);
        assert!(req.traceparent.is_some());
        assert_eq!(
            req.peer.identity,
            "spiffe://cluster.local/ns/default/sa/client"
        );
    }
    assert_ne!(
        reqs[0].traceparent.unwrap().trace_id,
        reqs[1].traceparent.unwrap().trace_id
    );
}

/// A raw HTTP/2 client, to send what the pool never would.
async fn raw_client(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = dial(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    send
}

async fn raw_status(send: &mut h2::client::SendRequest<Bytes>, req: Request<()>) -> StatusCode {
    let mut ready = send.clone().ready().await.unwrap();
    let (resp, _body) = ready.send_request(req, false).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .unwrap()
        .unwrap();
    resp.status()
}

fn connect_req(authority: &str, forwarded: &[&str]) -> Request<()> {
    let mut b = Request::builder().method(Method::CONNECT).uri(authority);
    for f in forwarded {
        b = b.header("forwarded", *f);
    }
    b.body(()).unwrap()
}

/// Malformed requests get 400 before the handler runs: wrong method, an authority that is
/// not `ip:port`, forged or garbage `forwarded` headers. Good ones on the same connection
/// still work.
#[tokio::test]
async fn malformed_requests_are_400_without_calling_handler() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let echo = echo_handler();
    let handler: Handler = Arc::new(move |req| {
        c.fetch_add(1, Ordering::SeqCst);
        echo(req)
    });
    let server = Server::start(handler).await;
    let mut send = raw_client(server.addr).await;

    let get = Request::builder()
        .method(Method::GET)
        .uri("http://10.0.0.3:443/")
        .body(())
        .unwrap();
    let post = Request::builder()
        .method(Method::POST)
        .uri("https://10.0.0.3:443/x")
        .body(())
        .unwrap();
    let bad: Vec<(&str, Request<()>)> = vec![
        ("GET", get),
        ("POST", post),
        ("host name authority", connect_req("example.com:443", &[])),
        ("authority without port", connect_req("10.0.0.3", &[])),
        ("invalid IPv4 authority", connect_req("10.0.0.300:80", &[])),
        ("port 0 authority", connect_req("10.0.0.3:0", &[])),
        ("port out of range", connect_req("10.0.0.3:65536", &[])),
        (
            "garbage forwarded",
            connect_req("10.0.0.3:443", &["garbage"]),
        ),
        (
            "unknown node",
            connect_req("10.0.0.3:443", &["for=unknown"]),
        ),
        (
            "obfuscated node",
            connect_req("10.0.0.3:443", &["for=_proxy1"]),
        ),
        (
            "name as node",
            connect_req("10.0.0.3:443", &["for=\"evil.example:1\""]),
        ),
        (
            "two elements",
            connect_req("10.0.0.3:443", &["for=1.2.3.4, for=5.6.7.8"]),
        ),
        (
            "two for params",
            connect_req("10.0.0.3:443", &["for=1.2.3.4;for=5.6.7.8"]),
        ),
        (
            "two headers",
            connect_req("10.0.0.3:443", &["for=\"1.2.3.4:1\"", "for=\"5.6.7.8:2\""]),
        ),
        (
            "unquoted v6",
            connect_req("10.0.0.3:443", &["for=[::1]:80"]),
        ),
        (
            "bad port",
            connect_req("10.0.0.3:443", &["for=\"1.2.3.4:70000\""]),
        ),
    ];
    for (what, req) in bad {
        assert_eq!(
            raw_status(&mut send, req).await,
            StatusCode::BAD_REQUEST,
            "{what}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Well-formed, including the lenient forms, are accepted on the same connection.
    for f in [
        "for=\"10.1.1.1:5000\"",
        "for=\"[fd00::1]:5000\"",
        "for=10.1.1.1",
        "proto=https;for=\"10.1.1.1:1\"",
    ] {
        assert_eq!(
            raw_status(&mut send, connect_req("10.0.0.3:443", &[f])).await,
            StatusCode::OK,
            "{f}"
        );
    }
    assert_eq!(
        raw_status(&mut send, connect_req("[fd00::3]:443", &[])).await,
        StatusCode::OK
    );
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let seen = server.seen(|r| r.forwarded_for);
    assert_eq!(
        seen,
        vec![
            Some("10.1.1.1:5000".parse().unwrap()),
            Some("[fd00::1]:5000".parse().unwrap()),
            Some("10.1.1.1:0".parse().unwrap()),
            Some("10.1.1.1:1".parse().unwrap()),
            None,
        ]
    );
    // A garbage traceparent is ignored, not fatal.
    let mut req = connect_req("10.0.0.3:443", &[]);
    req.headers_mut()
        .insert("traceparent", "zz".parse().unwrap());
    assert_eq!(raw_status(&mut send, req).await, StatusCode::OK);
    assert_eq!(
        server.requests.lock().unwrap().last().unwrap().traceparent,
        None
    );
}

/// A trace parent given by the caller is sent as is.
#[tokio::test]
async fn explicit_traceparent_is_sent() {
    let server = Server::start(echo_handler()).await;
    let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
    let mut h = ConnectHeaders::new(dst());
    h.traceparent = Some(tp);
    let mut s = pool()
        .connect(server.key(), || dial(server.addr), h)
        .await
        .unwrap();
    s.shutdown().await.unwrap();
    read_all(&mut s).await.unwrap();
    assert_eq!(server.requests.lock().unwrap()[0].traceparent, Some(tp));
}

/// Drain: the server sends GOAWAY; the open stream finishes normally, the next tunnel goes
/// to a new connection, and the drained connection's serve task ends cleanly.
#[tokio::test]
async fn goaway_on_drain_moves_new_streams_to_new_connection() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut old = server.open(&pool, dst()).await.unwrap();
    let mut old_up = backend.next().await;
    old.write_all(b"before").await.unwrap();
    let mut b = [0u8; 6];
    old_up.read_exact(&mut b).await.unwrap();

    let drained = server.drain_current();
    // The client has read the GOAWAY: the old connection takes no new stream.
    ringway_testbed::wait_for_async("GOAWAY seen by the client", WAIT, || {
        pool.accepting_connections(&server.key()) == 0
    })
    .await;
    assert_eq!(
        pool.connections(),
        1,
        "the old connection stays for its stream"
    );

    let mut new = server.open(&pool, dst()).await.unwrap();
    let mut new_up = backend.next().await;
    assert_eq!(pool.connections_opened(), 2);
    assert_eq!(server.accepted(), 2);

    // The old stream still carries bytes both ways and closes cleanly.
    old.write_all(b" after").await.unwrap();
    old.shutdown().await.unwrap();
    assert_eq!(read_all(&mut old_up).await.unwrap(), b" after");
    old_up.write_all(b"bye").await.unwrap();
    old_up.shutdown().await.unwrap();
    assert_eq!(read_all(&mut old).await.unwrap(), b"bye");
    drop(old);

    for t in drained {
        let r = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_ok(), "drained connection ended with {r:?}");
    }
    ringway_testbed::wait_for_async("old connection gone", WAIT, || pool.connections() == 1).await;

    new.write_all(b"new").await.unwrap();
    new.shutdown().await.unwrap();
    assert_eq!(read_all(&mut new_up).await.unwrap(), b"new");
}

/// Streams opened on a connection after GOAWAY are refused (not silently lost): the pool
/// retries them on a new connection, even when many are in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_with_flows_in_flight_loses_none() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let keep = server.open(&pool, dst()).await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..40u32 {
        let (pool, key, addr) = (pool.clone(), server.key(), server.addr);
        set.spawn(async move {
            tokio::time::sleep(Duration::from_millis(u64::from(i % 10))).await;
            let mut s = pool
                .connect(key, || dial(addr), ConnectHeaders::new(dst()))
                .await
                .unwrap();
            s.write_all(&i.to_be_bytes()).await.unwrap();
            s.shutdown().await.unwrap();
            assert_eq!(read_all(&mut s).await.unwrap(), i.to_be_bytes());
        });
    }
    tokio::time::sleep(Duration::from_millis(3)).await;
    let _drained = server.drain_current();
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    drop(keep);
}

/// HTTP/2 frame header + payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// HPACK: literal header without indexing, static-table name (index < 15), raw value.
fn hpack_literal(name_index: u8, value: &str) -> Vec<u8> {
    let mut v = vec![name_index, value.len() as u8];
    v.extend_from_slice(value.as_bytes());
    v
}

/// A second HEADERS frame (a second request) on an open tunnel stream is a protocol error:
/// that stream is reset with PROTOCOL_ERROR and the upstream with it; the connection and
/// its other streams are unaffected.
#[tokio::test]
async fn second_request_on_a_stream_is_reset() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let mut tcp = dial(server.addr).await.unwrap();
    let mut block = hpack_literal(2, "CONNECT"); // :method
    block.extend(hpack_literal(1, "10.0.0.3:443")); // :authority
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[])); // SETTINGS
    out.extend(frame(0x1, 0x4, 1, &block)); // HEADERS, END_HEADERS, stream 1
    tcp.write_all(&out).await.unwrap();

    // Read frames until the 200 HEADERS for stream 1 arrives.
    async fn next_frame(tcp: &mut tokio::net::TcpStream) -> (u8, u8, u32, Vec<u8>) {
        let mut h = [0u8; 9];
        tcp.read_exact(&mut h).await.unwrap();
        let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
        let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
        let mut p = vec![0u8; len];
        tcp.read_exact(&mut p).await.unwrap();
        (h[3], h[4], stream, p)
    }
    let deadline = Duration::from_secs(5);
    tokio::time::timeout(deadline, async {
        loop {
            let (kind, _, stream, _) = next_frame(&mut tcp).await;
            if kind == 0x1 && stream == 1 {
                return;
            }
        }
    })
    .await
    .expect("200 for the first request");
    let mut up = backend.next().await;

    // The second request on the same stream.
    tcp.write_all(&frame(0x1, 0x4, 1, &block)).await.unwrap();
    let code = tokio::time::timeout(deadline, async {
        loop {
            let (kind, _, stream, p) = next_frame(&mut tcp).await;
            if kind == 0x3 && stream == 1 {
                return u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
            }
            assert_ne!(kind, 0x7, "GOAWAY: the whole connection failed");
        }
    })
    .await
    .expect("RST_STREAM for stream 1");
    assert_eq!(code, 0x1, "PROTOCOL_ERROR");
    let mut rest = Vec::new();
    let e = tokio::time::timeout(deadline, up.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset);

    // Stream 3 on the same connection still gets a 200.
    tcp.write_all(&frame(0x1, 0x4, 3, &block)).await.unwrap();
    tokio::time::timeout(deadline, async {
        loop {
            let (kind, _, stream, _) = next_frame(&mut tcp).await;
            if kind == 0x1 && stream == 3 {
                return;
            }
        }
    })
    .await
    .expect("200 for stream 3");
}

/// The server advertises 200 concurrent streams: the 201st waits until one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_allows_200_concurrent_streams() {
    let server = Server::start(echo_handler()).await;
    let send = raw_client(server.addr).await;
    let mut open = Vec::new();
    for _ in 0..200 {
        let mut ready = send.clone().ready().await.unwrap();
        let (resp, body) = ready
            .send_request(connect_req("10.0.0.3:443", &[]), false)
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(5), resp)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        open.push((resp, body));
    }
    let mut ready = send.clone().ready().await.unwrap();
    let (resp, _body) = ready
        .send_request(connect_req("10.0.0.3:443", &[]), false)
        .unwrap();
    tokio::pin!(resp);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut resp)
            .await
            .is_err(),
        "a 201st stream was opened"
    );
    // End one stream (both directions): the waiting one gets its slot.
    let (first_resp, mut first_body) = open.remove(0);
    first_body.send_data(Bytes::new(), true).unwrap();
    let mut recv = first_resp.into_body();
    while let Some(d) = recv.data().await {
        d.unwrap();
    }
    let resp = tokio::time::timeout(Duration::from_secs(5), resp)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

/// A client that stops answering PING (here: never reads) is disconnected by the server
/// after the PING timeout.
#[tokio::test]
async fn server_closes_connection_without_ping_answer() {
    let config = ringway_hbone::ServerConfig {
        ping_interval: Duration::from_millis(100),
        ping_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let (client, server_io) = tokio::io::duplex(1 << 20);
    let (_trigger, signal) = ringway_hbone::drain_channel();
    let peer = ringway_hbone::PeerInfo {
        identity: "spiffe://cluster.local/ns/default/sa/client".into(),
        addr: "127.0.0.1:1".parse().unwrap(),
    };
    let serve = tokio::spawn(async move {
        ringway_hbone::serve_connection(server_io, peer, &config, signal, |_r| async {
            Decision::Deny401("unused".into())
        })
        .await
    });
    // Preface + empty SETTINGS, then silence (the duplex buffer absorbs the server's frames).
    let mut client = client;
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    client.write_all(&out).await.unwrap();
    let started = tokio::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), serve)
        .await
        .expect("server gave up on the silent client")
        .unwrap();
    assert!(matches!(r, Err(HboneError::PingTimeout(_))), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    drop(client);
}

/// The `200` goes as soon as the app is connected, even when the client's
/// first bytes came with the CONNECT and the app has not answered them: the
/// client counts its connection open (`istio_tcp_sockets_open`, the opened
/// counter) on the `200`, so a `200` held until the app speaks would hide a
/// connection to a slow app (a long poll) from the source's metrics
/// (benches/HISTORY.md, "The `200` with the app's answer": tried, reverted).
#[tokio::test]
async fn the_200_goes_once_the_app_is_connected_even_before_it_answers_the_first_bytes() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let send = raw_client(server.addr).await;
    let mut ready = send.ready().await.unwrap();
    let (resp, mut body) = ready
        .send_request(connect_req(&dst().to_string(), &[]), false)
        .unwrap();
    body.send_data(Bytes::from_static(b"GET /poll HTTP/1.1\r\n\r\n"), false)
        .unwrap();
    let mut app = backend.next().await;
    let mut got = [0u8; 22];
    tokio::time::timeout(WAIT, app.read_exact(&mut got))
        .await
        .expect("the first bytes reach the app")
        .unwrap();
    // The app stays silent: the 200 must come anyway.
    let resp = tokio::time::timeout(WAIT, resp)
        .await
        .expect("the 200 waited for the app to answer")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}
