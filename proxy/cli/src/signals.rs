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
