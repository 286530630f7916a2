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

/// What a [`FileWatcher`] makes of the files it watches.
pub trait Loader: Send + 'static {
    /// What the files load into.
    type Output: Send + Sync + 'static;
    /// Why a file could not be read or loaded; its text tells one failure
    /// from another (the same failure is reported once).
    type Error: std::fmt::Display + Send + 'static;
    /// Reads one of the files (bounded in size).
    fn read(&self, path: &Path) -> Result<Vec<u8>, Self::Error>;
    /// Loads the files' contents (`contents[i]` is `paths[i]`'s).
    fn load(&self, paths: &[PathBuf], contents: &[Vec<u8>]) -> Result<Self::Output, Self::Error>;
}

/// The watcher's thread could not be started.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the {name} thread: {source}")]
pub struct ThreadFailed {
    /// The thread's name.
    pub name: String,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

impl From<ThreadFailed> for ConfigError {
    fn from(e: ThreadFailed) -> ConfigError {
        ConfigError::io(format!("spawning the {} thread", e.name), e.source)
    }
}

/// Watches a set of files from a background thread and publishes what
/// they load into when a valid edit lands (the first load, and each later
/// one that differs and loads). Dropping it (or [`FileWatcher::stop`])
/// stops the thread and waits for it; the callbacks run on that thread.
pub struct FileWatcher<T> {
    current: Arc<Mutex<Arc<T>>>,
    polls: Arc<AtomicU64>,
    /// Each message asks for one poll now and carries its acknowledgement.
    thread: ControlThread<mpsc::Sender<mpsc::Sender<()>>>,
}

impl<T> std::fmt::Debug for FileWatcher<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWatcher")
            .field("polls", &self.polls.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> FileWatcher<T> {
    /// Loads `paths` with `loader` now (an error here is returned: the
    /// caller decides whether it may start without them), then polls them
    /// every `interval` on a thread called `name`. `on_change` gets every
    /// later valid load (not the first one: see [`FileWatcher::current`]);
    /// `on_error` gets each rejected edit.
    pub fn spawn<L, C, R>(
        name: &str,
        paths: Vec<PathBuf>,
        loader: L,
        interval: Duration,
        on_change: C,
        on_error: R,
    ) -> Result<FileWatcher<T>, L::Error>
    where
        L: Loader<Output = T>,
        L::Error: From<ThreadFailed>,
        C: Fn(Arc<T>) + Send + 'static,
        R: Fn(L::Error) + Send + 'static,
    {
        let fingerprints = paths.iter().map(|p| Fingerprint::of(p).ok()).collect();
        let contents = paths
            .iter()
            .map(|p| loader.read(p))
            .collect::<Result<Vec<_>, _>>()?;
        let hash = hash_all(&contents);
        let first = Arc::new(loader.load(&paths, &contents)?);
        let current = Arc::new(Mutex::new(first));
        let mut poller = Poller {
            paths,
            loader,
            fingerprints,
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
        let thread = ControlThread::spawn(name, requests, move || loop {
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
        });
        let thread = thread.map_err(|source| {
            L::Error::from(ThreadFailed {
                name: name.to_owned(),
                source,
            })
        })?;
        Ok(FileWatcher {
            current,
            polls,
            thread,
        })
    }

    /// How many polls have completed (timed ones and [`FileWatcher::poll_now`]).
    pub fn polls(&self) -> u64 {
        self.polls.load(Ordering::Acquire)
    }

    /// Checks the files now, on the watcher's thread, and returns once that
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

    /// What is in force: the first load, or the last valid edit.
    pub fn current(&self) -> Arc<T> {
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

/// The configuration file, read and validated as [`MeshConfig::load`] does.
struct MeshFile<E> {
    origin: String,
    env: E,
}

impl<E: EnvSource + Send + 'static> Loader for MeshFile<E> {
    type Output = Mesh;
    type Error = ConfigError;

    fn read(&self, path: &Path) -> Result<Vec<u8>, ConfigError> {
        read_file(path, &self.origin)
    }

    fn load(&self, _: &[PathBuf], contents: &[Vec<u8>]) -> Result<Mesh, ConfigError> {
        load(&contents[0], &self.origin, &self.env)
    }
}

/// Watches one configuration file from a background thread
/// (`ringway-config`). Dropping it (or [`ConfigWatcher::stop`]) stops the
/// thread and waits for it; the callbacks run on that thread.
#[derive(Debug)]
pub struct ConfigWatcher(FileWatcher<Mesh>);

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
        // A file that cannot be seen at start is an error (not a wait).
        Fingerprint::of(&path).map_err(|e| ConfigError::io(&origin, e))?;
        FileWatcher::spawn(
            "ringway-config",
            vec![path],
            MeshFile { origin, env },
            interval,
            on_change,
            on_error,
        )
        .map(ConfigWatcher)
    }

    /// How many polls have completed (timed ones and [`ConfigWatcher::poll_now`]).
    pub fn polls(&self) -> u64 {
        self.0.polls()
    }

    /// Checks the file now, on the watcher's thread, and returns once that
    /// poll (and any callback it ran) has completed; `false` when the
    /// watcher has stopped.
    pub fn poll_now(&self) -> bool {
        self.0.poll_now()
    }

    /// The snapshot in force: the first load, or the last valid edit.
    pub fn current(&self) -> Arc<Mesh> {
        self.0.current()
    }

    /// Stops polling and waits for the thread (and any callback running).
    pub fn stop(self) {
        self.0.stop();
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

/// One hash of several files' contents (each length-prefixed, so moving
/// bytes from one file to the next changes it).
fn hash_all(contents: &[Vec<u8>]) -> u64 {
    let mut all = Vec::with_capacity(contents.iter().map(|c| c.len() + 8).sum());
    for c in contents {
        all.extend_from_slice(&(c.len() as u64).to_le_bytes());
        all.extend_from_slice(c);
    }
    content_hash(&all)
}

struct Poller<L: Loader, C, R> {
    paths: Vec<PathBuf>,
    loader: L,
    /// Each file as last seen (`None`: could not be seen).
    fingerprints: Vec<Option<Fingerprint>>,
    /// Hash of the last outcome dealt with (published or reported).
    handled: Option<u64>,
    /// Hash of the contents of what is in force.
    published: u64,
    /// A failure seen once, reported if it is seen again.
    pending: Option<u64>,
    current: Arc<Mutex<Arc<L::Output>>>,
    on_change: C,
    on_error: R,
}

impl<L, C, R> Poller<L, C, R>
where
    L: Loader,
    C: Fn(Arc<L::Output>),
    R: Fn(L::Error),
{
    fn poll(&mut self) {
        let fingerprints: Vec<_> = self.paths.iter().map(|p| Fingerprint::of(p).ok()).collect();
        let changed = fingerprints != self.fingerprints;
        let recent = fingerprints.iter().flatten().any(|f| f.is_recent());
        if !changed && !recent && self.pending.is_none() {
            return;
        }
        self.fingerprints = fingerprints;
        let read = self
            .paths
            .iter()
            .map(|p| self.loader.read(p))
            .collect::<Result<Vec<_>, _>>();
        let (hash, outcome) = match read {
            Ok(contents) => {
                let hash = hash_all(&contents);
                if Some(hash) == self.handled && self.pending.is_none() {
                    return;
                }
                if hash == self.published {
                    // Back to the contents in force (e.g. a broken edit reverted).
                    self.handled = Some(hash);
                    self.pending = None;
                    return;
                }
                (hash, self.loader.load(&self.paths, &contents))
            }
            Err(err) => (content_hash(err.to_string().as_bytes()) ^ 1, Err(err)),
        };
        match outcome {
            Ok(loaded) => {
                let loaded = Arc::new(loaded);
                *self.current.lock().unwrap_or_else(|e| e.into_inner()) = loaded.clone();
                self.published = hash;
                self.handled = Some(hash);
                self.pending = None;
                (self.on_change)(loaded);
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
