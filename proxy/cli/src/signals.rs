//! SIGINT/SIGTERM as something a command waits for.

/// Blocks SIGINT/SIGTERM in the calling thread (and the threads it spawns
/// later) so they can be waited for with `wait_for_stop`.
pub(crate) fn block_stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    let _ = set.thread_block();
    set
}

/// Whether a stop signal of `set` (blocked, see [`block_stop_signals`]) is
/// pending, without taking it: a later `set.wait()` still returns it.
/// For waits on the main thread that must end on SIGTERM.
pub(crate) struct StopProbe(nix::sys::signalfd::SignalFd);

impl StopProbe {
    pub(crate) fn new(set: &nix::sys::signal::SigSet) -> nix::Result<StopProbe> {
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        SignalFd::with_flags(set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC).map(StopProbe)
    }

    /// A stop signal is pending (readable on the signalfd; never read).
    pub(crate) fn pending(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{SigSet, Signal};

    /// The probe sees a pending stop signal and leaves it for `wait`.
    #[test]
    fn a_pending_stop_signal_is_seen_and_left_for_wait() {
        // A thread of its own: the signal is sent to it alone, blocked.
        std::thread::spawn(|| {
            let mut set = SigSet::empty();
            set.add(Signal::SIGUSR2);
            set.thread_block().unwrap();
            let probe = StopProbe::new(&set).unwrap();
            assert!(!probe.pending(), "nothing sent yet");
            // `raise` sends to the calling thread.
            nix::sys::signal::raise(Signal::SIGUSR2).unwrap();
            assert!(probe.pending(), "sent, blocked: pending");
            assert!(probe.pending(), "still pending: the probe takes nothing");
            assert_eq!(set.wait().unwrap(), Signal::SIGUSR2);
            assert!(!probe.pending(), "taken by wait");
        })
        .join()
        .unwrap();
    }
}
