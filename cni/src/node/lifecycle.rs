//! The agent's lifecycle, a leaf service shared by the owner of the state and
//! the servers: the shutdown flag (and a wait that wakes on it), the worker
//! threads that shutdown waits for, and the socket files the agent created,
//! removed when it stops.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use super::locks::lock;

/// Shutdown, workers, socket files.
#[derive(Debug, Default)]
pub(super) struct Lifecycle {
    stopping: AtomicBool,
    stop_lock: Mutex<()>,
    stop_cv: Condvar,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Socket files this agent created, with their inodes, removed at shutdown.
    sockets: Mutex<Vec<(PathBuf, u64)>>,
}

impl Lifecycle {
    /// Whether the agent is shutting down.
    pub(super) fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Starts shutting down: sets the flag and wakes every [`Lifecycle::wait`].
    pub(super) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let _g = lock(&self.stop_lock);
        self.stop_cv.notify_all();
    }

    /// Waits `timeout` or until shutdown; returns whether the agent is
    /// shutting down.
    pub(super) fn wait(&self, timeout: Duration) -> bool {
        {
            let g = lock(&self.stop_lock);
            if self.is_stopping() {
                return true;
            }
            let _ = self
                .stop_cv
                .wait_timeout(g, timeout)
                .unwrap_or_else(PoisonError::into_inner);
        }
        self.is_stopping()
    }

    /// Runs `f` on a named thread that [`Lifecycle::finish`] waits for.
    pub(super) fn spawn_worker(
        &self,
        name: String,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<()> {
        let handle = std::thread::Builder::new().name(name).spawn(f)?;
        let mut workers = lock(&self.workers);
        workers.retain(|h| !h.is_finished());
        workers.push(handle);
        Ok(())
    }

    /// Remembers the socket file at `path` (with its inode) for removal at
    /// shutdown.
    pub(super) fn register_socket(&self, path: &Path) {
        if let Ok(m) = std::fs::symlink_metadata(path) {
            lock(&self.sockets).push((path.to_path_buf(), m.ino()));
        }
    }

    /// Removes the socket file at `path` now, if this agent created it (a
    /// new agent's file is left alone), and forgets it: new connections to
    /// it fail from here on, connections already made stay.
    pub(super) fn remove_socket(&self, path: &Path) {
        let mut sockets = lock(&self.sockets);
        sockets.retain(|(p, ino)| {
            if p != path {
                return true;
            }
            remove_own(p, *ino);
            false
        });
    }

    /// Waits for the worker threads, removes the socket files.
    pub(super) fn finish(&self) {
        let workers: Vec<_> = lock(&self.workers).drain(..).collect();
        for w in workers {
            let _ = w.join();
        }
        for (path, ino) in lock(&self.sockets).drain(..) {
            remove_own(&path, ino);
        }
    }
}

/// Removes the file at `path` only if it is still ours (inode `ino`): a new
/// agent may already have replaced it.
fn remove_own(path: &Path, ino: u64) {
    if std::fs::symlink_metadata(path).ok().map(|m| m.ino()) == Some(ino) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_wakes_a_wait_and_finish_joins_the_workers() {
        let l = std::sync::Arc::new(Lifecycle::default());
        assert!(!l.wait(Duration::from_millis(1)));
        let (tx, rx) = std::sync::mpsc::channel();
        let l2 = l.clone();
        l.spawn_worker("test-worker".into(), move || {
            let stopped = l2.wait(Duration::from_secs(60));
            tx.send(stopped).unwrap();
        })
        .unwrap();
        l.stop();
        l.finish();
        assert_eq!(rx.try_recv(), Ok(true), "the worker was woken and joined");
        assert!(l.wait(Duration::from_secs(60)), "no wait once stopping");
    }

    #[test]
    fn remove_socket_takes_only_its_own_file_away_at_once() {
        let dir = ringway_testbed::TempDir::new("lifecycle-sockets");
        let (ours, replaced) = (dir.join("zds.sock"), dir.join("cni.sock"));
        let l = Lifecycle::default();
        for p in [&ours, &replaced] {
            std::fs::write(p, b"").unwrap();
            l.register_socket(p);
        }
        l.remove_socket(&ours);
        assert!(!ours.exists(), "removed at once, before finish");
        // A new agent's file at the other path (another inode) stays.
        std::fs::remove_file(&replaced).unwrap();
        std::fs::write(dir.join("new"), b"").unwrap();
        std::fs::rename(dir.join("new"), &replaced).unwrap();
        l.remove_socket(&replaced);
        assert!(replaced.exists(), "another agent's file is left alone");
        std::fs::write(&ours, b"").unwrap();
        l.finish();
        assert!(ours.exists(), "forgotten once removed: a later file stays");
    }
}
