//! Connection sharing: streams per connection, reuse, the per-key dial lock, idle release,
//! PING timeout.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringway_hbone::{ConnectHeaders, HboneError, Pool, PoolConfig};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn dst() -> std::net::SocketAddr {
    "10.0.0.1:8080".parse().unwrap()
}

/// 300 tunnels open at once with a cap of 100 streams per connection ride exactly 3
/// HTTP/2 connections, and every one of them carries its own bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_300_streams_use_exactly_3_connections() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..300u32 {
        let (pool, key, addr) = (pool.clone(), server.key(), server.addr);
        set.spawn(async move {
            let s = pool
                .connect(key, || dial(addr), ConnectHeaders::new(dst()))
                .await
                .unwrap();
            (i, s)
        });
    }
    let mut streams = Vec::new();
    while let Some(r) = set.join_next().await {
        streams.push(r.unwrap());
    }
    assert_eq!(pool.streams(), 300);
    assert_eq!(pool.connections(), 3);
    assert_eq!(pool.connections_opened(), 3);
    assert_eq!(server.accepted(), 3);
    // All 300 are live at once: each echoes its own id.
    for (i, s) in &mut streams {
        s.write_all(&i.to_be_bytes()).await.unwrap();
    }
    for (i, s) in &mut streams {
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        assert_eq!(u32::from_be_bytes(b), *i);
        s.shutdown().await.unwrap();
        assert_eq!(read_all(s).await.unwrap(), b"");
    }
    drop(streams);
    assert_eq!(pool.streams(), 0);
    assert_eq!(
        pool.connections(),
        3,
        "idle connections stay pooled until the idle timeout"
    );
}

/// 1,000 tunnels one after the other reuse one connection.
#[tokio::test]
async fn sequential_1000_streams_reuse_one_connection() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    for i in 0..1000u32 {
        let mut s = server.open(&pool, dst()).await.unwrap();
        s.write_all(&i.to_le_bytes()).await.unwrap();
        s.shutdown().await.unwrap();
        assert_eq!(read_all(&mut s).await.unwrap(), i.to_le_bytes());
    }
    assert_eq!(pool.connections_opened(), 1);
    assert_eq!(server.accepted(), 1);
    assert_eq!(pool.streams(), 0);
}

/// 50 flows starting at once toward a key with no connection dial once, not 50 times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_of_50_first_connects_dials_once() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let dials = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(50));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (pool, key, addr) = (pool.clone(), server.key(), server.addr);
        let (dials, start) = (dials.clone(), start.clone());
        set.spawn(async move {
            start.wait().await;
            let dial = move || async move {
                dials.fetch_add(1, Ordering::SeqCst);
                // A slow dial (TLS handshake) widens the window for a storm.
                tokio::time::sleep(Duration::from_millis(50)).await;
                dial(addr).await
            };
            let mut s = pool
                .connect(key, dial, ConnectHeaders::new(dst()))
                .await
                .unwrap();
            s.write_all(b"x").await.unwrap();
            s.shutdown().await.unwrap();
            assert_eq!(read_all(&mut s).await.unwrap(), b"x");
        });
    }
    while let Some(r) = set.join_next().await {
        r.unwrap();
    }
    assert_eq!(dials.load(Ordering::SeqCst), 1);
    assert_eq!(pool.connections_opened(), 1);
    assert_eq!(server.accepted(), 1);
}

/// Keys are separate: another source identity gets its own connection.
#[tokio::test]
async fn different_keys_do_not_share() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let a = server.open(&pool, dst()).await.unwrap();
    let mut other = server.key();
    other.src_identity = "spiffe://cluster.local/ns/other/sa/x".into();
    let b = pool
        .connect(other, || dial(server.addr), ConnectHeaders::new(dst()))
        .await
        .unwrap();
    assert_eq!(pool.connections(), 2);
    drop((a, b));
}

/// A connection without streams for the idle timeout is closed (both ends see it), and the
/// next flow dials a new one.
#[tokio::test]
async fn idle_connection_released() {
    let server = Server::start(echo_handler()).await;
    let pool = Pool::new(PoolConfig {
        idle_timeout: Duration::from_millis(150),
        ..PoolConfig::default()
    });
    let mut s = server.open(&pool, dst()).await.unwrap();
    // Busy connections are not idle, however long the stream lives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pool.connections(), 1);
    s.shutdown().await.unwrap();
    read_all(&mut s).await.unwrap();
    drop(s);
    assert_eq!(pool.connections(), 1);
    ringway_testbed::wait_for_async("idle release", WAIT, || pool.connections() == 0).await;
    // The server side saw the connection end cleanly.
    let tasks = server.drain_current();
    for t in tasks {
        let r = tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .unwrap()
            .unwrap();
        assert!(r.is_ok(), "server connection ended with {r:?}");
    }
    let s = server.open(&pool, dst()).await.unwrap();
    assert_eq!(pool.connections_opened(), 2);
    drop(s);
}

/// After a burst that took several connections of one key, the idle ones
/// beyond the first are closed after the surplus timeout (their stream
/// tables and buffers given back at both ends); the last stays warm for
/// the idle timeout and carries the next stream without a new handshake.
#[tokio::test]
async fn surplus_idle_connections_released_one_stays_warm() {
    let server = Server::start(echo_handler()).await;
    let pool = Pool::new(PoolConfig {
        max_streams_per_conn: 1,
        idle_timeout: Duration::from_secs(600),
        surplus_idle_timeout: Duration::from_millis(150),
        ..PoolConfig::default()
    });
    let mut streams = Vec::new();
    for _ in 0..3 {
        streams.push(server.open(&pool, dst()).await.unwrap());
    }
    assert_eq!(pool.connections(), 3, "one stream per connection");
    for mut s in streams {
        s.shutdown().await.unwrap();
        read_all(&mut s).await.unwrap();
    }
    ringway_testbed::wait_for_async("surplus release", WAIT, || pool.connections() == 1).await;
    // The one left is not surplus: it outlives many surplus timeouts.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(pool.connections(), 1, "the last idle connection stays warm");
    let s = server.open(&pool, dst()).await.unwrap();
    assert_eq!(
        pool.connections_opened(),
        3,
        "the next stream rode the warm connection"
    );
    drop(s);
}

/// A peer that never answers PING (here: never reads at all) is closed after the PING
/// timeout; the waiting flow gets an error instead of hanging.
#[tokio::test]
async fn unanswered_ping_closes_connection() {
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = black_hole.local_addr().unwrap();
    let hold = tokio::spawn(async move {
        let (s, _) = black_hole.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(s);
    });
    let pool = Pool::new(PoolConfig {
        ping_interval: Duration::from_millis(100),
        ping_timeout: Duration::from_millis(200),
        ..PoolConfig::default()
    });
    let key = ringway_hbone::PoolKey {
        src_identity: "a".into(),
        dst_identity: "b".into(),
        src_ip: "127.0.0.1".parse().unwrap(),
        dst: addr,
        trust_generation: 0,
    };
    let started = tokio::time::Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        pool.connect(key, || dial(addr), ConnectHeaders::new(dst())),
    )
    .await
    .expect("connect must fail, not hang");
    let e = r.unwrap_err();
    assert!(matches!(e, HboneError::Connection(_)), "{e:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    ringway_testbed::wait_for_async("connection closed", WAIT, || pool.connections() == 0).await;
    hold.abort();
}

/// Evicting a source (its pod is gone) closes that source's connections at once: their
/// streams fail, other sources keep theirs, and the next flow from the source dials anew.
#[tokio::test]
async fn evict_closes_only_matching_connections() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let mut gone = server.open(&pool, dst()).await.unwrap();
    let mut other_key = server.key();
    other_key.src_ip = "127.0.0.2".parse().unwrap();
    let mut kept = pool
        .connect(
            other_key.clone(),
            || dial(server.addr),
            ConnectHeaders::new(dst()),
        )
        .await
        .unwrap();
    assert_eq!(pool.connections(), 2);
    let src = server.key().src_ip;
    assert_eq!(pool.evict(|k| k.src_ip == src), 1);
    // The evicted stream ends with an error (its connection is gone).
    let mut buf = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), gone.read_to_end(&mut buf)).await;
    assert!(
        matches!(r, Ok(Err(_))),
        "evicted stream must fail, got {r:?}"
    );
    // The other source's stream still echoes.
    kept.write_all(b"still here").await.unwrap();
    let mut b = [0u8; 10];
    kept.read_exact(&mut b).await.unwrap();
    assert_eq!(&b, b"still here");
    // Counters settle: one connection left, and a new flow from the evicted
    // source opens a fresh one.
    for _ in 0..100 {
        if pool.connections() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pool.connections(), 1);
    let s = server.open(&pool, dst()).await.unwrap();
    assert_eq!(pool.connections_opened(), 3);
    drop((s, kept));
}

/// The client's first bytes leave with the CONNECT: a peer that reads the
/// request body before it answers gets them (had they waited for the
/// `200`, it would wait forever), and the stream reports them as sent.
#[tokio::test]
async fn first_bytes_leave_with_the_connect_before_the_answer() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut conn = h2::server::handshake(tcp).await.unwrap();
        let (req, mut respond) = conn.accept().await.unwrap().unwrap();
        tokio::spawn(async move { while conn.accept().await.is_some() {} });
        let mut body = req.into_body();
        let first = tokio::time::timeout(Duration::from_secs(5), body.data())
            .await
            .expect("the first bytes came before the answer")
            .expect("a DATA frame")
            .unwrap();
        let _ = body.flow_control().release_capacity(first.len());
        let mut send = respond
            .send_response(http::Response::new(()), false)
            .unwrap();
        // Echo them, then whatever else comes, then end.
        send.send_data(first, false).unwrap();
        while let Some(d) = body.data().await {
            let d = d.unwrap();
            let _ = body.flow_control().release_capacity(d.len());
            send.send_data(d, false).unwrap();
        }
        send.send_data(bytes::Bytes::new(), true).unwrap();
    });
    let pool = pool();
    let mut s = pool
        .connect_with_data(
            key_for(addr),
            || dial(addr),
            ConnectHeaders::new(dst()),
            bytes::Bytes::from_static(b"GET / HTTP/1.1\r\n\r\n"),
        )
        .await
        .unwrap();
    assert_eq!(s.sent_first(), 18);
    s.write_all(b"more").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(
        read_all(&mut s).await.unwrap(),
        b"GET / HTTP/1.1\r\n\r\nmore"
    );
    peer.await.unwrap();
}

/// Through ringway's own server the first bytes reach the app ahead of the
/// rest, and its handler knows they were in hand; a stream without them
/// reports none sent and none in hand.
#[tokio::test]
async fn first_bytes_reach_the_app_through_the_server_in_order() {
    let server = Server::start(echo_handler()).await;
    let pool = pool();
    let addr = server.addr;
    let mut s = pool
        .connect_with_data(
            server.key(),
            || dial(addr),
            ConnectHeaders::new(dst()),
            bytes::Bytes::from_static(b"first"),
        )
        .await
        .unwrap();
    assert_eq!(s.sent_first(), 5);
    s.write_all(b", then the rest").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s).await.unwrap(), b"first, then the rest");
    let plain = server.open(&pool, dst()).await.unwrap();
    assert_eq!(plain.sent_first(), 0);
    assert_eq!(pool.connections_opened(), 1);
    // The handler is told which CONNECT came with bytes in hand (it may
    // then connect the app holding the handshake's last ACK for them).
    assert_eq!(
        server.seen(|r| r.early_data),
        [true, false],
        "early_data per request, in order"
    );
}

/// A connection dialled with certificates that expire soon (the server's
/// or the client's own) takes no new stream shortly before the expiry,
/// though its server never sends a GOAWAY (this test's server does not):
/// the next stream dials a new connection, the stream already open on the
/// old one goes on to its end, and the old connection is closed once its
/// last stream is done. Without the pool's own check, a server that keeps
/// its connections open would carry new tunnels on a proof that had run
/// out.
#[tokio::test]
async fn a_connection_takes_no_new_stream_once_its_certificates_are_about_to_expire() {
    let expiry = std::time::SystemTime::now() + Duration::from_secs(2);
    let (server, pool) = expiring_bed().await;
    let mut first = open_expiring(&server, &pool, expiry).await;
    echo_once(&mut first).await;
    // Before the expiry's margin (a tenth of the 2 s): still pooled.
    let second = open_expiring(&server, &pool, expiry).await;
    assert_eq!(
        pool.connections_opened(),
        1,
        "a timely connection is reused"
    );
    drop(second);
    assert_eq!(pool.accepting_connections(&server.key()), 1);
    // Past it: the connection takes no new stream.
    let due = ringway_hbone::move_on_at(expiry);
    tokio::time::sleep_until(due + Duration::from_millis(50)).await;
    assert_eq!(
        pool.accepting_connections(&server.key()),
        0,
        "a connection whose certificates are about to expire still takes streams"
    );
    let mut third = server.open(&pool, dst()).await.unwrap();
    assert_eq!(
        pool.connections_opened(),
        2,
        "the stream rode a connection whose certificates were about to expire"
    );
    assert_eq!(server.accepted(), 2);
    echo_once(&mut third).await;
    // The stream opened before goes on.
    echo_once(&mut first).await;
    assert_eq!(pool.connections(), 2);
    first.shutdown().await.unwrap();
    read_all(&mut first).await.unwrap();
    drop(first);
    // Its last stream done, the old connection is closed (the surplus
    // timeout); the new one stays.
    ringway_testbed::wait_for_async("expired connection closed", WAIT, || {
        pool.connections() == 1
    })
    .await;
    assert_eq!(pool.accepting_connections(&server.key()), 1);
    drop(third);
}

/// A connection past its certificates' move-on time is closed once its
/// last stream is done, after the short surplus timeout, even when no
/// other connection of its key took over: it can carry nothing new, so
/// keeping it for the idle timeout would only hold both ends' memory and
/// ping a proof that has run out.
#[tokio::test]
async fn a_connection_whose_certificates_are_about_to_expire_is_closed_when_its_streams_end() {
    let expiry = std::time::SystemTime::now() + Duration::from_secs(1);
    let (server, pool) = expiring_bed().await;
    let mut s = open_expiring(&server, &pool, expiry).await;
    tokio::time::sleep_until(ringway_hbone::move_on_at(expiry) + Duration::from_millis(50)).await;
    // Its open stream goes on past the move-on time.
    echo_once(&mut s).await;
    assert_eq!(pool.connections(), 1);
    s.shutdown().await.unwrap();
    read_all(&mut s).await.unwrap();
    drop(s);
    ringway_testbed::wait_for_async("the expiring connection closed", WAIT, || {
        pool.connections() == 0
    })
    .await;
}

/// An echoing server that never sends a GOAWAY, and a pool that keeps an
/// idle connection for 10 min (150 ms when surplus or retired).
async fn expiring_bed() -> (Server, Pool) {
    let server = Server::start(echo_handler()).await;
    let pool = Pool::new(PoolConfig {
        idle_timeout: Duration::from_secs(600),
        surplus_idle_timeout: Duration::from_millis(150),
        ..PoolConfig::default()
    });
    (server, pool)
}

/// A tunnel through `server`, on a connection (pooled, or dialled now)
/// authenticated with certificates the first of which expires at `expiry`.
async fn open_expiring(
    server: &Server,
    pool: &Pool,
    expiry: std::time::SystemTime,
) -> ringway_hbone::HboneStream {
    let addr = server.addr;
    let dial = || async move {
        Ok(ringway_hbone::Dialled::expiring(
            dial(addr).await?,
            Some(expiry),
        ))
    };
    pool.connect(server.key(), dial, ConnectHeaders::new(dst()))
        .await
        .unwrap()
}

async fn echo_once(s: &mut ringway_hbone::HboneStream) {
    s.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(WAIT, s.read_exact(&mut back))
        .await
        .expect("echo timed out")
        .unwrap();
    assert_eq!(&back, b"ping");
}
