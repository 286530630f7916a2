//! The installer's watch, a leaf of it: a thread that runs the installer's
//! check now, on every inotify event of the conf dir and at least every
//! recheck interval, until [`InstallWatch::stop`] (or a drop) wakes it
//! through a pipe and joins it.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tracing::{debug, info, warn};

use super::error::InstallError;

/// Starts the watch thread on `dir` (see the installer's module docs): `ensure` now,
/// on every inotify event of the conf dir, and at least every `recheck_interval`.
/// Failures are logged (at warn when they change, so a missing primary config does
/// not log every second) and retried.
pub(super) fn start(
    dir: PathBuf,
    recheck_interval: Duration,
    ensure: impl FnMut() -> Result<(), InstallError> + Send + 'static,
) -> Result<InstallWatch, InstallError> {
    let watch_err = |source: io::Error| InstallError::Watch {
        dir: dir.clone(),
        source,
    };
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
        .map_err(|e| watch_err(e.into()))?;
    inotify
        .add_watch(
            &dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_ATTRIB,
        )
        .map_err(|e| watch_err(e.into()))?;
    let (stop_rx, stop_tx) = nix::unistd::pipe().map_err(|e| watch_err(e.into()))?;
    let watched = dir.display().to_string();
    let thread = std::thread::Builder::new()
        .name("cni-install-watch".into())
        .spawn(move || watch_loop(&watched, recheck_interval, ensure, &inotify, &stop_rx))
        .map_err(watch_err)?;
    Ok(InstallWatch {
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

fn watch_loop(
    dir: &str,
    recheck_interval: Duration,
    mut ensure: impl FnMut() -> Result<(), InstallError>,
    inotify: &Inotify,
    stop: &OwnedFd,
) {
    info!(conf.dir = %dir, "watching CNI conf dir");
    let timeout = PollTimeout::try_from(recheck_interval).unwrap_or(PollTimeout::MAX);
    let mut last_error: Option<String> = None;
    loop {
        match ensure() {
            Ok(_) => {
                if last_error.take().is_some() {
                    info!(conf.dir = %dir, "CNI entry in place again");
                }
            }
            Err(e) => {
                let msg = e.to_string();
                if last_error.as_deref() != Some(msg.as_str()) {
                    warn!(conf.dir = %dir, error = %msg, "cannot insert CNI entry, retrying");
                } else {
                    debug!(conf.dir = %dir, error = %msg, "cannot insert CNI entry, retrying");
                }
                last_error = Some(msg);
            }
        }
        let mut fds = [
            PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                warn!(conf.dir = %dir, error = %e, "poll failed, watch stopped");
                return;
            }
        }
        let stop_ready = fds[1].revents().is_some_and(|r| !r.is_empty());
        if stop_ready {
            debug!(conf.dir = %dir, "CNI conf dir watch stopped");
            return;
        }
        // Drain: one ensure covers any number of events.
        while let Ok(events) = inotify.read_events() {
            if events.is_empty() {
                break;
            }
            for ev in &events {
                debug!(conf.dir = %dir, file = ?ev.name, mask = ?ev.mask, "conf dir event");
            }
        }
    }
}

/// The running watch of [`Installer::watch`](crate::install::Installer::watch). Dropping it stops the watch too.
#[derive(Debug)]
pub struct InstallWatch {
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl InstallWatch {
    /// Stops the watch and waits for its thread (at most the time of one
    /// [`Installer::ensure_entry`](crate::install::Installer::ensure_entry)).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            // A closed write end wakes the reader with POLLHUP: no byte needed.
            drop(stop);
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!("CNI conf dir watch thread panicked");
            }
        }
    }
}

impl Drop for InstallWatch {
    fn drop(&mut self) {
        self.shutdown();
    }
}
