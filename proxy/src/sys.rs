//! Thin syscall layer: entering a pod's network namespace, splice between
//! sockets and pipes, aborting a TCP connection with a reset, raising the
//! fd limit, a thread's nice value, glibc's heap thresholds and trimming
//! its heaps, what the heaps hold, the process's CPU time and resident
//! memory. Ten `unsafe` blocks (the reset, epoll registration, adopting an
//! SCM_RIGHTS fd and the ZDS receive that hands it over,
//! IP_LOCAL_PORT_RANGE, a thread's nice value, `mallopt` twice,
//! `malloc_trim`, `mallinfo2`), each explained in place; one `unsafe
//! fn` ([`adopt_received_fd`]) with its contract.

use std::cell::OnceCell;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{fcntl, splice, FcntlArg, OFlag, SpliceFFlags};
use nix::sched::{setns, CloneFlags};

thread_local! {
    /// The network namespace this thread started in, opened once.
    static HOME_NETNS: OnceCell<OwnedFd> = const { OnceCell::new() };
}

/// Runs `f` with the calling thread inside the network namespace `netns`,
/// then switches back. Sockets created by `f` stay in `netns` for good.
/// Costs two `setns` calls (a few microseconds); the way home is the
/// thread's own netns fd, opened on its first call (not a duplicate of it
/// per call: that cost an `fcntl` and a `close` per upstream socket).
pub fn in_netns<T>(netns: BorrowedFd<'_>, f: impl FnOnce() -> T) -> io::Result<T> {
    HOME_NETNS.with(|cell| {
        let home = match cell.get() {
            Some(fd) => fd,
            None => {
                let f = File::open("/proc/thread-self/ns/net")?;
                cell.get_or_init(|| OwnedFd::from(f))
            }
        };
        setns(netns, CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
        let out = f();
        if let Err(e) = setns(home.as_fd(), CloneFlags::CLONE_NEWNET) {
            // A thread stuck in a pod's namespace would create the next pod's
            // sockets in the wrong place: never continue.
            panic!("cannot return to the home network namespace: {e}");
        }
        Ok(out)
    })
}

/// Moves up to `len` bytes from `from` to `to` without copying through user
/// space. Non-blocking on the pipe side; sockets are non-blocking themselves.
pub fn splice_nb(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    splice(
        from,
        None,
        to,
        None,
        len,
        SpliceFFlags::SPLICE_F_MOVE | SpliceFFlags::SPLICE_F_NONBLOCK,
    )
    .map_err(io::Error::from)
}

/// A pipe used as the in-kernel buffer of one copy direction.
#[derive(Debug)]
pub struct Pipe {
    /// Read end.
    pub r: OwnedFd,
    /// Write end.
    pub w: OwnedFd,
    /// Capacity the kernel granted.
    pub capacity: usize,
}

impl Pipe {
    /// Creates a pipe and asks for `size` bytes of capacity (the kernel may
    /// grant less, e.g. beyond `fs.pipe-max-size` or the per-user limit).
    pub fn new(size: usize) -> io::Result<Pipe> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        let capacity = match fcntl(w.as_raw_fd(), FcntlArg::F_SETPIPE_SZ(size as i32)) {
            Ok(n) => n as usize,
            Err(_) => fcntl(w.as_raw_fd(), FcntlArg::F_GETPIPE_SZ)? as usize,
        };
        Ok(Pipe { r, w, capacity })
    }
}

/// Resets a TCP connection now: RST to the peer, socket closed, and every
/// pending poll or I/O on it completes. Safe to call on any socket state.
pub fn tcp_abort(fd: BorrowedFd<'_>) {
    let sock = socket2::SockRef::from(&fd);
    let _ = sock.set_linger(Some(std::time::Duration::ZERO));
    let addr = libc::sockaddr {
        sa_family: libc::AF_UNSPEC as libc::sa_family_t,
        sa_data: [0; 14],
    };
    // SAFETY: `fd` is a valid borrowed socket fd for the duration of the call,
    // and `addr` is a properly initialised sockaddr whose size we pass.
    // connect(AF_UNSPEC) on a TCP socket is tcp_disconnect(): it sends a RST
    // for a synchronised connection and wakes all waiters.
    unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &addr,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        );
    }
}

/// Shuts down the read side: a pending accept or read returns at once.
pub fn shutdown_read(fd: BorrowedFd<'_>) {
    let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Read);
}

/// Shuts down the write side (sends FIN once queued data is out).
pub fn shutdown_write(fd: BorrowedFd<'_>) -> io::Result<()> {
    nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Write)
        .map_err(io::Error::from)
}

/// `send` with MSG_MORE, without waiting: the bytes wait in the socket for
/// more (or for the FIN of a `shutdown` that follows at once, which then
/// leaves in their segment). Never for bytes that nothing follows.
pub fn send_more(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    socket2::SockRef::from(&fd).send_with_flags(
        buf,
        libc::MSG_MORE | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
    )
}

/// A copy of the bytes a socket has already received, up to [`PEEK_MAX`], without
/// waiting and without taking them (`MSG_PEEK`): empty when there are none
/// yet, or when the peer sent FIN. An error (a reset) is returned.
pub fn peek_ready(fd: BorrowedFd<'_>) -> io::Result<bytes::Bytes> {
    use nix::sys::socket::MsgFlags;
    let mut buf = [0u8; PEEK_MAX];
    match nix::sys::socket::recv(
        fd.as_raw_fd(),
        &mut buf,
        MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_PEEK,
    ) {
        Ok(n) => Ok(bytes::Bytes::copy_from_slice(&buf[..n])),
        Err(nix::errno::Errno::EAGAIN) => Ok(bytes::Bytes::new()),
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Whether bytes wait to be read on `fd`: [`peek_ready`]'s question for
/// one byte, with no copy (EOF and errors count as none; never blocks).
pub fn bytes_waiting(fd: BorrowedFd<'_>) -> bool {
    let mut one = [0u8; 1];
    matches!(
        nix::sys::socket::recv(
            fd.as_raw_fd(),
            &mut one,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_PEEK,
        ),
        Ok(n) if n > 0
    )
}

/// The most [`peek_ready`] returns.
pub const PEEK_MAX: usize = 4 * 1024;

/// Takes `n` bytes that [`peek_ready`] saw off the socket's receive queue
/// (they were sent elsewhere). Fewer than `n` is an error.
pub fn consume_peeked(fd: BorrowedFd<'_>, n: usize) -> io::Result<()> {
    if n == 0 {
        return Ok(());
    }
    let mut buf = [0u8; PEEK_MAX];
    let want = n.min(PEEK_MAX);
    let got = nix::sys::socket::recv(
        fd.as_raw_fd(),
        &mut buf[..want],
        nix::sys::socket::MsgFlags::MSG_DONTWAIT,
    )?;
    if got == n {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{got} of the {n} bytes peeked were still queued"),
        ))
    }
}

/// Raises RLIMIT_NOFILE's soft limit to the hard limit. Returns (old, new).
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, hard))
}

/// Allocations this big or bigger get their own `mmap` (glibc's default
/// starts at 128 KiB and moves).
pub const MALLOC_MMAP_THRESHOLD: usize = 1024 * 1024;
/// Free memory glibc may keep at the top of each thread's heap before
/// giving it back to the kernel (default 128 KiB, moving).
pub const MALLOC_TRIM_THRESHOLD: usize = 16 * 1024 * 1024;

/// The trim threshold while the proxy is idle ([`idle_heap_threshold`]):
/// glibc's own default.
pub const IDLE_TRIM_THRESHOLD: usize = 128 * 1024;

/// Stops glibc from handing freed buffer memory back to the kernel and
/// faulting it in again on the next allocation. The HBONE path allocates
/// and frees 16-256 KiB buffers continually (TLS records, HTTP/2 frames,
/// socket reads); with the default thresholds a worker's heap top was
/// trimmed (`madvise(MADV_DONTNEED)`, ~850 per GB moved) and refilled with
/// fresh zeroed pages: ~90,000-216,000 page faults per GB through one
/// HBONE stream, 11-15% of the workers' time in fault handling. Fixed
/// thresholds ([`MALLOC_TRIM_THRESHOLD`], [`MALLOC_MMAP_THRESHOLD`]) keep
/// at most that much free memory resident per heap. Best effort (a libc
/// other than glibc keeps its own policy); returns whether both took.
pub fn keep_heap_pages() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only sets two of glibc's malloc tunables (plain
        // integers read under the arena locks); it touches no memory of
        // ours and is safe to call from any thread at any time.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD as libc::c_int) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD as libc::c_int) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Gives free heap memory back to the kernel now: glibc's `malloc_trim(0)`,
/// which walks each arena (the workers' too, whichever thread calls it),
/// `madvise`s away the free pages inside every heap and releases the free
/// top of the main heap whatever [`MALLOC_TRIM_THRESHOLD`] says; not the
/// free top of the threads' heaps (see [`idle_heap_threshold`]). Each arena
/// is locked while it is walked and what is released is faulted in again
/// when allocated next: call it off the datapath, when the proxy is idle.
/// Returns whether any memory was released (`false` with a libc other than
/// glibc, which keeps its own policy).
pub fn trim_heaps() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `malloc_trim` only walks glibc's own arenas under their
        // locks and hands free pages back; it touches no live allocation of
        // ours and is safe to call from any thread at any time.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// What glibc's heaps hold now, summed over every arena ([`heap_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeapUsage {
    /// Bytes of live allocations (in the heaps and in their own mappings).
    pub in_use: u64,
    /// Free bytes inside the heaps, resident or not (what a trim can give
    /// back is part of it).
    pub free: u64,
}

/// The heaps' live and free bytes now (`mallinfo2`, every arena under its
/// lock: call it at scrape time, not per connection); `None` with a libc
/// other than glibc. A figure that grows with connections made, not with
/// connections open, is a leak; free bytes that stay high after a trim are
/// fragmentation.
pub fn heap_usage() -> Option<HeapUsage> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallinfo2` only reads glibc's arena statistics under
        // their locks and returns them by value; no memory of ours is
        // touched and it is safe from any thread.
        let m = unsafe { libc::mallinfo2() };
        Some(HeapUsage {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// CPU time this process has used so far, all threads, user and system.
pub fn process_cpu_time() -> std::time::Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(u) => {
            let d = |t: nix::sys::time::TimeVal| {
                std::time::Duration::from_secs(t.tv_sec().max(0) as u64)
                    + std::time::Duration::from_micros(t.tv_usec().max(0) as u64)
            };
            d(u.user_time()) + d(u.system_time())
        }
        Err(_) => std::time::Duration::ZERO,
    }
}

/// This process's resident memory now, bytes (`VmRSS` of
/// `/proc/self/status`); `None` when it cannot be read.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Lowers the trim threshold to [`IDLE_TRIM_THRESHOLD`] (for every heap)
/// while the proxy is idle, until [`keep_heap_pages`] sets it back: a
/// thread's heap then gives the free memory at its top back at its next
/// [`release_heap_top`] (or large free). [`trim_heaps`] cannot: it releases
/// the free top of the main heap only, not of the threads' heaps. Best
/// effort; returns whether it took.
pub fn idle_heap_threshold() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: as in `keep_heap_pages`: one of glibc's malloc tunables,
        // a plain integer; no memory of ours is touched.
        unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, IDLE_TRIM_THRESHOLD as libc::c_int) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Makes glibc check the calling thread's heap top against the trim
/// threshold now, as it does when a large block (64 KiB or more) is freed:
/// allocates and frees one. With [`idle_heap_threshold`] in force, the free
/// memory at the top of the thread's heap goes back to the kernel.
pub fn release_heap_top() {
    let block: Vec<u8> = Vec::with_capacity(128 * 1024);
    drop(std::hint::black_box(block));
}

/// Grows the process's fd table to hold `fds` descriptors now, once. The
/// kernel grows it by doubling when an fd crosses its size and waits for an
/// RCU grace period each time (~10 ms seen), on whichever thread allocates
/// that fd: a worker accepting a connection included. Done at start, the
/// datapath never pays it. Best effort.
pub fn reserve_fd_table(fds: u64) {
    let Ok(probe) = std::fs::File::open("/dev/null") else {
        return;
    };
    let target = fds.saturating_sub(1).min(i32::MAX as u64) as i32;
    if let Ok(high) = nix::fcntl::fcntl(
        probe.as_raw_fd(),
        nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(target),
    ) {
        let _ = nix::unistd::close(high);
    }
}

/// The inode of the network namespace behind `fd` (or of the calling thread
/// with `None`): used to refuse the host namespace where a pod's is expected.
pub fn netns_inode(fd: Option<BorrowedFd<'_>>) -> io::Result<u64> {
    match fd {
        Some(fd) => Ok(nix::sys::stat::fstat(fd.as_raw_fd())?.st_ino),
        None => Ok(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(
            "/proc/thread-self/ns/net",
        )?)),
    }
}

/// Registers a socket with the current tokio (epoll) reactor.
pub fn register_epoll(
    fd: std::sync::Arc<OwnedFd>,
) -> io::Result<tokio::io::unix::AsyncFd<std::sync::Arc<OwnedFd>>> {
    // SAFETY: the AsyncFd owns an `Arc<OwnedFd>` clone, so the descriptor
    // stays open and refers to the same socket for the AsyncFd's whole
    // lifetime, and `as_raw_fd` of an `Arc<OwnedFd>` always returns it.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// Takes ownership of an fd the kernel installed in our table for us
/// (SCM_RIGHTS, or `accept`): `None` for a negative one.
///
/// # Safety
///
/// `raw`, when not negative, must be an open descriptor that nothing else
/// owns or will close (as one just received with SCM_RIGHTS, or just
/// returned by `accept`), and must not be adopted twice: the returned
/// `OwnedFd` closes it when dropped.
pub unsafe fn adopt_received_fd(raw: std::os::fd::RawFd) -> Option<OwnedFd> {
    if raw < 0 {
        return None;
    }
    // SAFETY: the caller guarantees `raw` is open and owned by no one else
    // (this function's contract); we take ownership once.
    Some(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) })
}

/// Receives one ZDS packet on `sock`, taking ownership of the netns fd it
/// carried ([`ringway_zds::recv`] with [`adopt_received_fd`]).
pub fn zds_recv(sock: BorrowedFd<'_>) -> Result<ringway_zds::Packet, ringway_zds::ZdsError> {
    ringway_zds::recv(sock, &|raw| {
        // SAFETY: `ringway_zds::recv` calls its adopter only with each fd
        // it has just received with SCM_RIGHTS (`ringway_zds::AdoptFd`),
        // once: open, and owned by nothing else yet.
        unsafe { adopt_received_fd(raw) }
    })
}

/// Restricts the ports the kernel picks for this socket's automatic bind
/// (IP_LOCAL_PORT_RANGE, Linux 6.3+; within the netns-wide range). Older
/// kernels ignore it (logged once).
pub fn set_local_port_range(fd: BorrowedFd<'_>, lo: u16, hi: u16) {
    const IP_LOCAL_PORT_RANGE: libc::c_int = 51;
    let val: u32 = (u32::from(hi) << 16) | u32::from(lo);
    // SAFETY: `fd` is a valid socket for the call; we pass a pointer to a
    // live u32 and its exact size, as IP_LOCAL_PORT_RANGE expects.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_IP,
            IP_LOCAL_PORT_RANGE,
            std::ptr::addr_of!(val).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        static WARNED: std::sync::Once = std::sync::Once::new();
        let e = io::Error::last_os_error();
        WARNED.call_once(|| {
            tracing::warn!(error = %e, "IP_LOCAL_PORT_RANGE unavailable (kernel < 6.3?): spoofed and own source ports share one range")
        });
    }
}

/// Lowers the calling thread's CPU priority to nice `nice` (Linux keeps a
/// nice value per thread); a thread already at or below that priority
/// (a higher nice value) is left as it is.
pub fn lower_thread_priority(nice: i32) -> io::Result<()> {
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    nix::errno::Errno::clear();
    // SAFETY: getpriority/setpriority take plain integers (no pointers);
    // `tid` is the calling thread's own id, so only this thread changes.
    // getpriority may legitimately return -1: errno, cleared before, tells.
    let (current, rc) = unsafe {
        let current = libc::getpriority(libc::PRIO_PROCESS, tid);
        if current == -1 && nix::errno::Errno::last_raw() != 0 {
            return Err(io::Error::last_os_error());
        }
        if current >= nice {
            return Ok(());
        }
        (current, libc::setpriority(libc::PRIO_PROCESS, tid, nice))
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("setpriority(thread {tid}, nice {current} -> {nice}): {e}"),
        ));
    }
    Ok(())
}

/// Held by the tests that count a thread's page faults or trim the heaps:
/// a trim (which walks every thread's arena) would fault the counting
/// test's buffers in again.
#[cfg(test)]
pub(crate) static HEAP_TEST_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {

    /// The peek sees waiting bytes without taking them; nothing waiting and
    /// EOF both read as none, and neither blocks.
    #[test]
    fn bytes_waiting_peeks_without_taking_or_blocking() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!bytes_waiting(b.as_fd()), "nothing sent yet");
        a.write_all(b"x").unwrap();
        assert!(bytes_waiting(b.as_fd()), "one byte sent");
        assert!(bytes_waiting(b.as_fd()), "a peek leaves it there");
        let mut one = [0u8; 1];
        b.read_exact(&mut one).unwrap();
        assert_eq!(&one, b"x", "the byte is still the reader's");
        a.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(!bytes_waiting(b.as_fd()), "EOF is no bytes");
    }
    use super::*;

    /// Minor page faults of the calling thread so far.
    fn thread_faults() -> i64 {
        use nix::sys::resource::{getrusage, UsageWho};
        getrusage(UsageWho::RUSAGE_THREAD)
            .unwrap()
            .minor_page_faults()
    }

    /// A worker that keeps allocating and freeing a few MiB of buffers
    /// (what the HBONE path does) must not have glibc give the pages back
    /// and fault them in again every round: with glibc's default
    /// thresholds nearly every round faulted in all 2 MiB again (24,033
    /// faults in 50 rounds, of 25,600 pages).
    #[test]
    fn freed_buffers_are_not_faulted_in_again() {
        let _heaps = HEAP_TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        assert!(keep_heap_pages(), "mallopt refused the thresholds");
        // A thread of its own: its own arena, as a worker has.
        let faults = std::thread::spawn(|| {
            let round = || {
                let bufs: Vec<Vec<u8>> = (0..8)
                    .map(|i| {
                        let mut b = Vec::with_capacity(256 * 1024);
                        b.resize(256 * 1024, i as u8);
                        b
                    })
                    .collect();
                std::hint::black_box(&bufs);
            };
            round();
            let before = thread_faults();
            for _ in 0..50 {
                round();
            }
            thread_faults() - before
        })
        .join()
        .unwrap();
        // 50 rounds of 2 MiB is 25,600 pages; allow a few stray faults.
        assert!(
            faults < 200,
            "{faults} page faults in 50 rounds of allocating and freeing 2 MiB"
        );
    }

    /// What a worker's heap keeps free after a load (up to
    /// [`MALLOC_TRIM_THRESHOLD`] at its top, any amount below a live
    /// allocation) goes back to the kernel with [`trim_heaps`].
    #[test]
    fn trim_gives_freed_memory_back() {
        let _heaps = HEAP_TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        assert!(keep_heap_pages(), "mallopt refused the thresholds");
        const FREED: u64 = 48 * 1024 * 1024;
        // A thread of its own (its own arena, as a worker has) allocates
        // 48 MiB of buffers below the mmap threshold, touches them, and
        // frees all but the last: that one pins the heap's top, so glibc
        // keeps all of it resident.
        let (before, kept) = std::thread::spawn(|| {
            let bufs: Vec<Vec<u8>> = (0..FREED / (256 * 1024) + 1)
                .map(|i| vec![i as u8 | 1; 256 * 1024])
                .collect();
            let mut bufs = bufs;
            let last = bufs.pop().unwrap();
            drop(bufs);
            (resident_bytes().unwrap(), last)
        })
        .join()
        .unwrap();
        assert!(trim_heaps(), "malloc_trim released nothing");
        let after = resident_bytes().unwrap();
        std::hint::black_box(&kept);
        assert!(
            before.saturating_sub(after) >= FREED / 2,
            "RSS {before} -> {after} bytes after freeing {FREED} and trimming"
        );
    }

    /// The free memory at the top of a thread's heap (what a worker keeps
    /// after a load, under [`MALLOC_TRIM_THRESHOLD`]) goes back once the
    /// idle threshold is set and the thread releases its heap top; not
    /// before.
    #[test]
    fn idle_threshold_gives_a_thread_heap_top_back() {
        let _heaps = HEAP_TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        assert!(keep_heap_pages(), "mallopt refused the thresholds");
        const FREED: u64 = 12 * 1024 * 1024;
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let (done, step) = std::sync::mpsc::channel::<u64>();
        let thread = std::thread::spawn(move || {
            // 12 MiB of buffers, touched, then freed: under the threshold,
            // they stay at the top of this thread's heap.
            let bufs: Vec<Vec<u8>> = (0..FREED / (256 * 1024))
                .map(|i| vec![i as u8 | 1; 256 * 1024])
                .collect();
            drop(bufs);
            done.send(resident_bytes().unwrap()).unwrap();
            wait.recv().unwrap();
            release_heap_top();
            done.send(resident_bytes().unwrap()).unwrap();
        });
        let kept = step.recv().unwrap();
        // Neither another thread's large free nor a trim takes it.
        release_heap_top();
        trim_heaps();
        let trimmed = resident_bytes().unwrap();
        assert!(idle_heap_threshold(), "mallopt refused the idle threshold");
        go.send(()).unwrap();
        let released = step.recv().unwrap();
        thread.join().unwrap();
        assert!(keep_heap_pages(), "mallopt refused the thresholds");
        assert!(
            kept.saturating_sub(trimmed) < FREED / 2,
            "RSS {kept} -> {trimmed} bytes: the heap top went back before the idle threshold"
        );
        assert!(
            trimmed.saturating_sub(released) >= FREED / 2,
            "RSS {trimmed} -> {released} bytes after the idle threshold and the release"
        );
    }
}
