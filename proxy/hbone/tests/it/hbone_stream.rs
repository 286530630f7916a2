//! Byte integrity, half-close and reset mapping through a tunnel to a real TCP upstream.

use crate::support;

use std::io::ErrorKind;
use std::time::Duration;

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn dst() -> std::net::SocketAddr {
    "10.0.0.2:9000".parse().unwrap()
}

/// Different payloads from 1 B to 8 MiB flow both directions at the same time, each
/// followed by a half-close; both ends get exactly the other's bytes, then EOF.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_integrity_both_directions_at_once() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    for (i, len) in [1usize, 17, 16_384, 65_537, 1 << 20, (4 << 20) + 3, 8 << 20]
        .into_iter()
        .enumerate()
    {
        let up_data = payload(len, 2 * i as u64);
        let down_data = payload(len, 2 * i as u64 + 1);
        let s = server.open(&pool, dst()).await.unwrap();
        let upstream = backend.next().await;
        let (mut cr, mut cw) = tokio::io::split(s);
        let (mut ur, mut uw) = upstream.into_split();
        let (c_sent, u_sent) = (up_data.clone(), down_data.clone());
        let client_writer = tokio::spawn(async move {
            cw.write_all(&c_sent).await.unwrap();
            cw.shutdown().await.unwrap();
            cw
        });
        let upstream_writer = tokio::spawn(async move {
            uw.write_all(&u_sent).await.unwrap();
            uw.shutdown().await.unwrap();
            uw
        });
        let (got_down, got_up) = tokio::join!(read_all(&mut cr), read_all(&mut ur));
        let (got_down, got_up) = (got_down.unwrap(), got_up.unwrap());
        assert!(
            got_up == up_data,
            "client->upstream corrupted at {len} B (got {} B)",
            got_up.len()
        );
        assert!(
            got_down == down_data,
            "upstream->client corrupted at {len} B (got {} B)",
            got_down.len()
        );
        let _ = client_writer.await.unwrap();
        let _ = upstream_writer.await.unwrap();
    }
    assert_eq!(pool.connections_opened(), 1);
}

/// Client half-closes first: the upstream reads EOF, and still sends its answer back over
/// the direction that stays open.
#[tokio::test]
async fn half_close_client_first() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    s.write_all(b"request").await.unwrap();
    s.shutdown().await.unwrap();
    // Upstream sees all bytes then EOF (FIN), not a reset.
    assert_eq!(read_all(&mut up).await.unwrap(), b"request");
    // Its direction still works after the client's FIN.
    up.write_all(b"response after your FIN").await.unwrap();
    up.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s).await.unwrap(), b"response after your FIN");
}

/// Upstream half-closes first: the client reads EOF, and its later bytes still arrive.
#[tokio::test]
async fn half_close_upstream_first() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    up.write_all(b"banner").await.unwrap();
    up.shutdown().await.unwrap();
    assert_eq!(read_all(&mut s).await.unwrap(), b"banner");
    // A read after EOF stays EOF.
    assert_eq!(s.read(&mut [0u8; 8]).await.unwrap(), 0);
    s.write_all(b"late bytes").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut up).await.unwrap(), b"late bytes");
}

/// Upstream resets (RST): the client's read fails with ConnectionReset, not EOF.
#[tokio::test]
async fn upstream_reset_reaches_client() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let up = backend.next().await;
    s.write_all(b"ping").await.unwrap();
    up.set_zero_linger().unwrap();
    drop(up); // RST
    let mut buf = Vec::new();
    let e = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    // Writing on the reset stream fails too.
    let e = s.write_all(b"more").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
}

/// Client drops the stream without shutdown: RST_STREAM, and the upstream TCP connection
/// is reset (not closed with FIN).
#[tokio::test]
async fn client_drop_resets_upstream() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    s.write_all(b"hello").await.unwrap();
    let mut got = [0u8; 5];
    up.read_exact(&mut got).await.unwrap();
    drop(s);
    let mut rest = Vec::new();
    let e = tokio::time::timeout(Duration::from_secs(5), up.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{e}");
    ringway_testbed::wait_for_async("stream released", WAIT, || pool.streams() == 0).await;
    // The connection survives a stream reset and carries the next tunnel.
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    s.write_all(b"ok").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut up).await.unwrap(), b"ok");
    assert_eq!(pool.connections_opened(), 1);
}

/// An explicit `reset()` also resets the upstream, even after the client half-closed.
#[tokio::test]
async fn explicit_reset_after_half_close_resets_upstream() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    s.write_all(b"x").await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(read_all(&mut up).await.unwrap(), b"x");
    s.reset();
    let e = tokio::time::timeout(Duration::from_secs(5), async {
        // Upstream keeps writing until the reset reaches it.
        loop {
            if let Err(e) = up.write_all(&[0u8; 65536]).await {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    assert!(
        matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe),
        "{e}"
    );
}

/// The upstream's answer and its FIN arrive together: the chunk that carries
/// the answer is known to be the last one as it is handed out (so the
/// caller can put the FIN on the same segment); then the end.
#[tokio::test]
async fn the_last_chunk_is_known_as_the_last_when_the_end_came_with_it() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let up = backend.next().await;
    // The answer and the FIN in one segment from the upstream.
    let sent = socket2::SockRef::from(&up)
        .send_with_flags(b"the answer", libc::MSG_MORE)
        .unwrap();
    assert_eq!(sent, 10);
    socket2::SockRef::from(&up)
        .shutdown(std::net::Shutdown::Write)
        .unwrap();
    let chunk = std::future::poll_fn(|cx| s.poll_chunk(cx)).await.unwrap();
    assert_eq!(chunk.as_deref(), Some(&b"the answer"[..]));
    assert!(s.at_end(), "END_STREAM came with the answer");
    let end = std::future::poll_fn(|cx| s.poll_chunk(cx)).await.unwrap();
    assert!(end.is_none());
}

/// Two chunks already in before the first is read: the look for the end
/// takes the second and hands it out next, intact and in order; only then
/// is the end known; a chunk with more to follow is never taken for the last.
#[tokio::test]
async fn a_chunk_looked_ahead_is_handed_out_next() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    up.write_all(b"one").await.unwrap();
    // The first chunk out as its own DATA frame before the second is written
    // (the pauses only shape the traffic: a slower server would merge them).
    tokio::time::sleep(Duration::from_millis(200)).await;
    up.write_all(b"two").await.unwrap();
    up.shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = std::future::poll_fn(|cx| s.poll_chunk(cx)).await.unwrap();
    assert_eq!(first.as_deref(), Some(&b"one"[..]));
    assert!(!s.at_end(), "more follows the first chunk");
    let second = std::future::poll_fn(|cx| s.poll_chunk(cx)).await.unwrap();
    assert_eq!(second.as_deref(), Some(&b"two"[..]));
    assert!(s.at_end());
    assert!(std::future::poll_fn(|cx| s.poll_chunk(cx))
        .await
        .unwrap()
        .is_none());
}

/// An upstream that answers and then resets: the answer is handed out, and
/// the reset reaches the reader after it (not lost in the look ahead, and
/// never taken for a clean end).
#[tokio::test]
async fn a_reset_looked_ahead_is_reported_after_the_chunk() {
    let mut backend = Backend::start().await;
    let server = Server::start(backend.handler()).await;
    let pool = pool();
    let mut s = server.open(&pool, dst()).await.unwrap();
    let mut up = backend.next().await;
    up.write_all(b"partial").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // RST from the upstream: the server resets the stream.
    up.set_zero_linger().unwrap();
    drop(up);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = std::future::poll_fn(|cx| s.poll_chunk(cx)).await.unwrap();
    assert_eq!(first.as_deref(), Some(&b"partial"[..]));
    assert!(!s.at_end(), "a reset is not an end");
    let err = std::future::poll_fn(|cx| s.poll_chunk(cx))
        .await
        .expect_err("the reset after the chunk");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
}
