//! Before authentication on the tunnel listener (15008): the per-connection
//! jitter of its deadlines, so connections admitted together do not expire
//! together, and the handshake thread that runs the server side of their
//! TLS handshakes off the datapath workers.

use std::cell::Cell;
use std::future::Future;
use std::hash::BuildHasher;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// The name of the thread that runs the server TLS handshakes. Within the
/// 15 bytes the kernel keeps of a thread's name, so `top -H`, `ps`, `perf`
/// and `/proc/<pid>/task/*/comm` show it whole.
pub const THREAD_NAME: &str = "ringway-tls-hs";
const _: () = assert!(
    THREAD_NAME.len() <= 15,
    "the kernel keeps 15 bytes of a thread name"
);

/// Whether the calling thread is the handshake thread.
pub fn on_handshake_thread() -> bool {
    std::thread::current().name() == Some(THREAD_NAME)
}

type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

enum Msg {
    Run(Job),
    Stop,
}

/// The handshake thread: its own current-thread tokio runtime (reactor and
/// timers) at a lower CPU priority than the workers (`hbone.handshakeNice`,
/// 10 by default: under a saturated datapath it still gets about a tenth of
/// a core, CFS weights 110 against 1024, so legitimate new tunnels are
/// slowed, never starved, and a handshake flood takes at most that share
/// from the workers; not `SCHED_IDLE`, which could starve them), running
/// the futures the workers hand it (one per server TLS handshake, each its
/// own task).
#[derive(Debug, Clone)]
pub struct Handshaker {
    tx: mpsc::UnboundedSender<Msg>,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Msg::Run(_) => "Run",
            Msg::Stop => "Stop",
        })
    }
}

impl Handshaker {
    /// Starts the thread at nice `nice` (not below the process's own).
    pub fn start(nice: i32) -> io::Result<(Handshaker, JoinHandle<()>)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
        let join = std::thread::Builder::new()
            .name(THREAD_NAME.into())
            .spawn(move || {
                if let Err(e) = crate::sys::lower_thread_priority(nice) {
                    tracing::warn!(error = %e, nice, "cannot lower the handshake thread's CPU priority");
                }
                rt.block_on(async move {
                    while let Some(msg) = rx.recv().await {
                        match msg {
                            Msg::Run(job) => {
                                tokio::spawn(job);
                            }
                            Msg::Stop => break,
                        }
                    }
                });
                // Dropping the runtime drops the handshakes under way: their
                // sockets close and their workers see the reply dropped.
                drop(rt);
                tracing::debug!("handshake thread stopped");
            })?;
        Ok((Handshaker { tx }, join))
    }

    /// Runs `job` on the handshake thread; `false` once it has stopped.
    pub fn run(&self, job: impl Future<Output = ()> + Send + 'static) -> bool {
        self.tx.send(Msg::Run(Box::pin(job))).is_ok()
    }

    /// Tells the thread to drop what it runs and exit.
    pub fn stop(&self) {
        let _ = self.tx.send(Msg::Stop);
    }
}

/// A socket that moves between threads with its TLS state: registered with
/// the reactor of the thread that drives it ([`Handoff::attach`]), taken off
/// it ([`Handoff::detach`]) before it moves. Detached, it refuses I/O.
#[derive(Debug)]
pub struct Handoff(Place);

#[derive(Debug)]
enum Place {
    Attached(TcpStream),
    Detached(std::net::TcpStream),
    Gone,
}

impl Handoff {
    /// A socket registered with the calling thread's reactor.
    pub fn new(tcp: TcpStream) -> Self {
        Handoff(Place::Attached(tcp))
    }

    /// Takes the socket off the calling thread's reactor (it may move).
    pub fn detach(&mut self) -> io::Result<()> {
        self.0 = match std::mem::replace(&mut self.0, Place::Gone) {
            Place::Attached(t) => Place::Detached(t.into_std()?),
            other => other,
        };
        Ok(())
    }

    /// Registers the socket with the calling thread's reactor.
    pub fn attach(&mut self) -> io::Result<()> {
        self.0 = match std::mem::replace(&mut self.0, Place::Gone) {
            Place::Detached(s) => Place::Attached(TcpStream::from_std(s)?),
            other => other,
        };
        Ok(())
    }

    fn tcp(&mut self) -> io::Result<&mut TcpStream> {
        match &mut self.0 {
            Place::Attached(t) => Ok(t),
            _ => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "tunnel socket is not registered with this thread's reactor",
            )),
        }
    }
}

impl tokio::io::AsyncRead for Handoff {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().tcp()?).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Handoff {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().tcp()?).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().tcp()?).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().tcp()?).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().tcp()?).poll_shutdown(cx)
    }
}

/// `timeout` scaled into `[timeout / 2, timeout)` by `r` (uniform over
/// `u64`): the deadline of one pre-authentication phase (TLS handshake,
/// HTTP/2 preface) of one connection. The configured value stays the
/// upper bound.
pub fn jittered_by(timeout: Duration, r: u64) -> Duration {
    let half = timeout / 2;
    let span = timeout.saturating_sub(half).as_nanos();
    // (span * r) / 2^64 < span; span fits in u64 nanoseconds for any
    // configured timeout (584 years), so the product fits in u128.
    let extra = (span.min(u128::from(u64::MAX)) * u128::from(r)) >> 64;
    half + Duration::from_nanos(extra as u64)
}

/// [`jittered_by`] with a random draw (a per-thread generator, seeded once
/// from the standard library's random hash keys).
pub fn jittered(timeout: Duration) -> Duration {
    jittered_by(timeout, next_random())
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64));
}

/// splitmix64: statistically fine for spreading deadlines, not for secrets.
fn next_random() -> u64 {
    RNG.with(|s| {
        let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The jittered deadline stays within `[timeout / 2, timeout]`: never
    /// longer than configured, and connections admitted together spread
    /// over half of it.
    #[test]
    fn preauth_deadline_jitter_stays_in_bounds() {
        for t in [
            Duration::from_millis(3),
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(3600),
        ] {
            assert_eq!(jittered_by(t, 0), t / 2, "lowest draw for {t:?}");
            let top = jittered_by(t, u64::MAX);
            assert!(top <= t, "highest draw for {t:?} is {top:?}");
            assert!(
                top >= t - (t - t / 2) / 1000,
                "the highest draw for {t:?} ({top:?}) reaches the top of the range"
            );
            for _ in 0..1000 {
                let d = jittered(t);
                assert!(d >= t / 2 && d <= t, "{d:?} outside [{:?}, {t:?}]", t / 2);
            }
        }
        // A thousand draws of 5 s cover the range: no two halves empty.
        let t = Duration::from_secs(5);
        let draws: Vec<_> = (0..1000).map(|_| jittered(t)).collect();
        let low = draws.iter().filter(|d| **d < t * 3 / 4).count();
        assert!(
            (300..=700).contains(&low),
            "{low} of 1000 draws in the lower half of the range"
        );
    }
}
