//! Hot reload: [`ConfigWatcher`] polls the configuration file and publishes
//! a new [`Mesh`] snapshot when a valid edit lands.
//!
//! Polling, not inotify: it follows Kubernetes ConfigMap updates (a symlink
//! swap of the `..data` directory, which inotify on the file itself misses)
//! and atomic renames without special cases, and one `stat` per 250 ms is
//! cheap. The file is read only when its identity (device, inode), size or
//! modification time change, or while its modification time is less than
//! two seconds old (an edit in the same clock tick with the same size would
//! otherwise go unseen); an unchanged content hash is then ignored.
//!
//! A read or validation failure is reported only once the same content has
//! failed on two consecutive polls, so an editor that truncates and then
//! writes does not produce a spurious error; the same failure is reported
//! once, and the previous snapshot stays in force until a valid edit.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::control_thread::ControlThread;
use crate::env::EnvSource;
use crate::file::{content_hash, read_file};
use crate::{ConfigError, Mesh, MeshConfig};

/// How often the file is checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Within this age of the file's mtime, the content is re-read every poll.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Watches one configuration file from a background thread
/// (`ringway-config`). Dropping it (or [`ConfigWatcher::stop`]) stops the
/// thread and waits for it; the callbacks run on that thread.
#[derive(Debug)]
pub struct ConfigWatcher {
    current: Arc<Mutex<Arc<Mesh>>>,
    polls: Arc<AtomicU64>,
    /// Each message asks for one poll now and carries its acknowledgement.
    thread: ControlThread<mpsc::Sender<mpsc::Sender<()>>>,
}

impl ConfigWatcher {
    /// Loads `path` now (an error here is returned: start-up must not go on
    /// with a broken configuration), then polls it every [`POLL_INTERVAL`].
    /// `on_change` gets every later valid snapshot (not the first one: see
    /// [`ConfigWatcher::current`]); `on_error` gets each rejected edit.
    pub fn spawn<E, C, R>(
        path: impl Into<PathBuf>,
        env: E,
        on_change: C,
        on_error: R,
    ) -> Result<ConfigWatcher, ConfigError>
    where
        E: EnvSource + Send + 'static,
        C: Fn(Arc<Mesh>) + Send + 'static,
        R: Fn(ConfigError) + Send + 'static,
    {
        ConfigWatcher::spawn_with_interval(path, env, POLL_INTERVAL, on_change, on_error)
    }

    /// [`ConfigWatcher::spawn`] with another poll interval.
    pub fn spawn_with_interval<E, C, R>(
        path: impl Into<PathBuf>,
        env: E,
        interval: Duration,
        on_change: C,
        on_error: R,
    ) -> Result<ConfigWatcher, ConfigError>
    where
        E: EnvSource + Send + 'static,
        C: Fn(Arc<Mesh>) + Send + 'static,
        R: Fn(ConfigError) + Send + 'static,
    {
        let path = path.into();
        let origin = path.display().to_string();
        let fingerprint = Fingerprint::of(&path).map_err(|e| ConfigError::io(&origin, e))?;
        let bytes = read_file(&path, &origin)?;
        let hash = content_hash(&bytes);
        let mesh = Arc::new(load(&bytes, &origin, &env)?);
        let current = Arc::new(Mutex::new(mesh));
        let mut poller = Poller {
            path,
            origin,
            env,
            fingerprint: Some(fingerprint),
            handled: Some(hash),
            published: hash,
            pending: None,
            current: current.clone(),
            on_change,
            on_error,
        };
        let polls = Arc::new(AtomicU64::new(0));
        let counted = polls.clone();
        let (requests, requested) = mpsc::channel::<mpsc::Sender<()>>();
        let thread = ControlThread::spawn("ringway-config", requests, move || loop {
            // Stops when the watcher (the sender) is gone.
            let ack = match requested.recv_timeout(interval) {
                Ok(ack) => Some(ack),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            poller.poll();
            counted.fetch_add(1, Ordering::Release);
            if let Some(ack) = ack {
                let _ = ack.send(());
            }
        })
        .map_err(|e| ConfigError::io("spawning the ringway-config thread", e))?;
        Ok(ConfigWatcher {
            current,
            polls,
            thread,
        })
    }

    /// How many polls have completed (timed ones and [`ConfigWatcher::poll_now`]).
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Acquire)
    }

    /// Checks the file now, on the watcher's thread, and returns once that
    /// poll (and any callback it ran) has completed. Lets a caller (a
    /// reload signal, a test) observe exactly what one poll saw; `false`
    /// when the watcher has stopped.
    pub fn poll_now(&self) -> bool {
        let Some(requests) = self.thread.signal() else {
            return false;
        };
        let (ack, acked) = mpsc::channel();
        requests.send(ack).is_ok() && acked.recv().is_ok()
    }

    /// The snapshot in force: the first load, or the last valid edit.
    pub fn current(&self) -> Arc<Mesh> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops polling and waits for the thread (and any callback running).
    pub fn stop(mut self) {
        self.thread.stop();
    }
}

/// Like [`MeshConfig::load`] (which refuses a file that is not UTF-8 the
/// same way), for bytes already read.
fn load(bytes: &[u8], origin: &str, env: &dyn EnvSource) -> Result<Mesh, ConfigError> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        ConfigError::io(
            origin,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            ),
        )
    })?;
    MeshConfig::load_str(text, origin, env)
}

/// What identifies a version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    modified: Option<SystemTime>,
}

impl Fingerprint {
    /// Follows symlinks: a ConfigMap's `config.yaml -> ..data/config.yaml`.
    fn of(path: &Path) -> std::io::Result<Fingerprint> {
        let m = std::fs::metadata(path)?;
        Ok(Fingerprint {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            modified: m.modified().ok(),
        })
    }

    fn is_recent(&self) -> bool {
        self.modified
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < RACY_WINDOW)
    }
}

struct Poller<E, C, R> {
    path: PathBuf,
    origin: String,
    env: E,
    /// The file as last seen (`None`: could not be seen).
    fingerprint: Option<Fingerprint>,
    /// Hash of the last outcome dealt with (published or reported).
    handled: Option<u64>,
    /// Hash of the content of the snapshot in force.
    published: u64,
    /// A failure seen once, reported if it is seen again.
    pending: Option<u64>,
    current: Arc<Mutex<Arc<Mesh>>>,
    on_change: C,
    on_error: R,
}

impl<E, C, R> Poller<E, C, R>
where
    E: EnvSource,
    C: Fn(Arc<Mesh>),
    R: Fn(ConfigError),
{
    fn poll(&mut self) {
        let fingerprint = Fingerprint::of(&self.path).ok();
        let changed = fingerprint != self.fingerprint;
        let recent = fingerprint.is_some_and(|f| f.is_recent());
        if !changed && !recent && self.pending.is_none() {
            return;
        }
        self.fingerprint = fingerprint;
        let (hash, outcome) = match read_file(&self.path, &self.origin) {
            Ok(bytes) => {
                let hash = content_hash(&bytes);
                if Some(hash) == self.handled && self.pending.is_none() {
                    return;
                }
                if hash == self.published {
                    // Back to the content in force (e.g. a broken edit reverted).
                    self.handled = Some(hash);
                    self.pending = None;
                    return;
                }
                (hash, load(&bytes, &self.origin, &self.env))
            }
            Err(err) => (content_hash(err.to_string().as_bytes()) ^ 1, Err(err)),
        };
        match outcome {
            Ok(mesh) => {
                let mesh = Arc::new(mesh);
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = mesh.clone();
                self.published = hash;
                self.handled = Some(hash);
                self.pending = None;
                (self.on_change)(mesh);
            }
            Err(err) => {
                if Some(hash) == self.handled {
                    self.pending = None;
                } else if self.pending == Some(hash) {
                    self.pending = None;
                    self.handled = Some(hash);
                    (self.on_error)(err);
                } else {
                    self.pending = Some(hash);
                }
            }
        }
    }
}
