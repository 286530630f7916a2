//! Moving the bytes: each direction of a proxied connection is a loop of
//! `splice(socket -> pipe)` and `splice(pipe -> socket)`, woken by readiness
//! from the worker's event loop. The bytes never enter user space, and a
//! direction waiting for data holds no buffer at all: pipes come from a
//! per-worker pool and go back as soon as they are empty.
//!
//! Why not io_uring reads into user buffers? Two hops through one process
//! would copy every byte four times; splice moves page references instead
//! (ARCHITECTURE.md, "The datapath"). And there is no user-space
//! buffer that a cancelled read could lose bytes into: data waiting in a
//! pipe is still in the kernel when anything stops.
//!
//! Half-close: EOF on one side becomes `shutdown(SHUT_WR)` on the other,
//! after everything read before it was written; the other direction keeps
//! flowing. Reset: an error reading one side resets the other side at once
//! (RST), an error writing one side resets the side we read from.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::sock::Sock;
use crate::stats::Stats;
use crate::sys::{self, Pipe};
use crate::uring::op::Interest;

/// Per-worker pool of empty pipes; how many are in use and idle is kept in
/// the datapath's [`Stats`] (exported as `ringway_pipes`).
#[derive(Debug)]
pub struct PipePool {
    pipes: RefCell<Vec<Pipe>>,
    size: usize,
    keep: usize,
    stats: Arc<Stats>,
}

/// A pipe taken from the pool (counted in use until dropped or put back).
#[derive(Debug)]
struct Leased<'a> {
    pipe: Option<Pipe>,
    stats: &'a Stats,
}

impl std::ops::Deref for Leased<'_> {
    type Target = Pipe;
    fn deref(&self) -> &Pipe {
        self.pipe.as_ref().expect("a leased pipe until put back")
    }
}

impl Drop for Leased<'_> {
    fn drop(&mut self) {
        self.stats.pipes_in_use.dec();
    }
}

impl PipePool {
    /// A pool of pipes of `size` bytes, keeping at most `keep` idle ones.
    pub fn new(size: usize, keep: usize, stats: Arc<Stats>) -> PipePool {
        PipePool {
            pipes: RefCell::new(Vec::new()),
            size,
            keep,
            stats,
        }
    }

    fn get(&self) -> io::Result<Leased<'_>> {
        let pipe = match self.pipes.borrow_mut().pop() {
            Some(p) => {
                self.stats.pipes_idle.dec();
                p
            }
            None => Pipe::new(self.size)?,
        };
        self.stats.pipes_in_use.inc();
        Ok(Leased {
            pipe: Some(pipe),
            stats: &self.stats,
        })
    }

    /// Returns an *empty* pipe for reuse.
    fn put(&self, mut p: Leased<'_>) {
        let Some(pipe) = p.pipe.take() else { return };
        let mut v = self.pipes.borrow_mut();
        if v.len() < self.keep {
            v.push(pipe);
            self.stats.pipes_idle.inc();
        }
    }
}

/// Where a direction counts the bytes it moves: the datapath total and the
/// connection's metric counters (advanced as bytes move, not at close).
#[derive(Debug)]
pub struct Meter<'a> {
    /// Datapath-wide total.
    pub total: &'a AtomicU64,
    /// Per-connection metric counters.
    pub counters: Vec<prometheus_client::metrics::counter::Counter>,
}

impl Meter<'_> {
    /// Counts `n` bytes moved.
    pub fn add(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
        for c in &self.counters {
            c.inc_by(n);
        }
    }
}

/// How one direction ended.
#[derive(Debug)]
pub enum DirEnd {
    /// The source sent FIN; everything was forwarded and FIN passed on.
    Eof,
    /// Reading the source failed (typically a reset); the destination was reset.
    ReadFailed(io::Error),
    /// Writing the destination failed; the source was reset.
    WriteFailed(io::Error),
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// Copies `src` -> `dst` until EOF or error. `counter` is advanced as bytes
/// are written to `dst`.
pub async fn copy_one_way(
    src: &Sock,
    dst: &Sock,
    pool: &PipePool,
    meter: &Meter<'_>,
) -> (DirEnd, u64) {
    let mut total = 0u64;
    let mut pipe: Option<Leased<'_>> = None;
    loop {
        let p = match pipe.take() {
            Some(p) => p,
            None => match pool.get() {
                Ok(p) => p,
                Err(e) => {
                    // Out of fds or memory for a pipe: end this connection
                    // with a reset on both sides rather than stall it.
                    sys::tcp_abort(dst.fd());
                    sys::tcp_abort(src.fd());
                    return (DirEnd::ReadFailed(e), total);
                }
            },
        };
        // After a short read this splice usually returns EAGAIN: it stays.
        // Readiness is edge-triggered (see `Sock`), and a short read does not
        // prove the socket drained (a FIN or segment that came with the data,
        // a full pipe's slots, a pending signal): waiting without reading to
        // EAGAIN could leave a FIN unforwarded until data that never comes.
        let n = match sys::splice_nb(src.fd(), p.w.as_fd(), p.capacity) {
            Ok(0) => {
                pool.put(p);
                let _ = sys::shutdown_write(dst.fd());
                return (DirEnd::Eof, total);
            }
            Ok(n) => n,
            Err(e) if would_block(&e) => {
                // Idle: give the (empty) pipe back while waiting.
                pool.put(p);
                if let Err(e) = src.wait(Interest::Readable).await {
                    sys::tcp_abort(dst.fd());
                    return (DirEnd::ReadFailed(e), total);
                }
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                pipe = Some(p);
                continue;
            }
            Err(e) => {
                // A pipe holding nothing can go back.
                pool.put(p);
                sys::tcp_abort(dst.fd());
                return (DirEnd::ReadFailed(e), total);
            }
        };
        let mut pending = n;
        while pending > 0 {
            match sys::splice_nb(p.r.as_fd(), dst.fd(), pending) {
                Ok(m) => {
                    pending -= m;
                    total += m as u64;
                    meter.add(m as u64);
                }
                Err(e) if would_block(&e) => {
                    if let Err(e) = dst.wait(Interest::Writable).await {
                        sys::tcp_abort(src.fd());
                        return (DirEnd::WriteFailed(e), total);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // The pipe still holds bytes: drop it rather than reuse it.
                    sys::tcp_abort(src.fd());
                    return (DirEnd::WriteFailed(e), total);
                }
            }
        }
        pipe = Some(p);
    }
}
