//! The CNI installer: puts the plugin binary in the CNI bin dir and ringway's chained
//! entry into the node's primary network config, keeps it there while the primary CNI
//! rewrites its file, and takes both out again on [`Installer::uninstall`].
//!
//! # Which file
//! The **primary** config is the first file, in byte-wise lexical order of its name, among
//! the regular files (or symlinks) of the conf dir ending in `.conflist`, `.conf` or
//! `.json`: the file the container runtime uses. It is never skipped when malformed (the
//! runtime would not skip it either): the error names the file and what is wrong.
//!
//! | primary file | what [`Installer::ensure_entry`] does |
//! | --- | --- |
//! | `*.conflist` | our entry becomes the **last** element of `plugins`, written in place |
//! | `*.conf`, `*.json` (a single plugin, as containerd reads them) | wrapped into `<stem>.conflist` = `{"cniVersion","name","plugins":[<the plugin minus cniVersion/name>, ours]}`, then the original is removed |
//!
//! Our entry is `{"type":"ringway-cni","agentSocket":..,"logLevel":..}`
//! ([`InstallConfig::entry`]). The result always holds **exactly one** entry of type
//! `ringway-cni`, equal to ours, in the last position:
//! - an entry of ours found elsewhere (in the middle, or twice) is **moved to the end**:
//!   a chained plugin after ours (portmap, bandwidth, tuning, ...) could still change the
//!   pod's network after capture, and ours must see the final `prevResult`;
//! - an entry of ours with other fields (an older `agentSocket`, a changed `logLevel`) is
//!   replaced by the configured one;
//! - when the file already is in that state nothing is written (no mtime change, no
//!   inotify event for the runtime).
//!
//! Everything else in the file is kept: the other plugins and unknown fields, in the same
//! order. The JSON is re-serialized (two-space indent, object keys in sorted order).
//!
//! # Every write is atomic
//! A temp file `.<name>.ringway-tmp` in the same dir (an extension the runtime never
//! loads) is written, fsynced and renamed over the target, then the dir is fsynced, so the
//! runtime reads the old file or the new one, never half of one. The config keeps the
//! original file's permission bits (0644 for a new `.conflist`); the binary gets 0755.
//! Just before the rename the target is read again: if the primary CNI changed it in the
//! meantime, the edit is redone on its new content (so a concurrent rewrite is not lost).
//!
//! # Watching
//! [`Installer::watch`] starts a thread that runs [`Installer::ensure_entry`] at start,
//! whenever inotify reports a change in the conf dir, and at least every
//! [`InstallConfig::recheck_interval`] (so a missed event, or a conf dir that was removed
//! and made again, is caught within that time). [`InstallWatch::stop`] (or dropping the
//! handle) wakes the thread through a pipe and joins it.
//!
//! # Uninstall
//! [`Installer::uninstall`] removes every `ringway-cni` entry from every config file of
//! the conf dir that parses (a `.conflist` made by wrapping a `.conf` stays a
//! `.conflist`, holding the original plugin alone: equivalent for the runtime), then
//! removes the binary. Entry first, binary second: the runtime must never be pointed at a
//! missing binary.
//!
//! # Layers
//! `error` ([`InstallError`]) at the bottom; `files` (which file is primary, reading
//! and atomic writes) and `watch` ([`InstallWatch`], given the check to run) on it;
//! this module ([`Installer`]: what the entry must be and the edits) on top.

mod error;
mod files;
mod watch;

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};
use tracing::{debug, info};

pub use self::error::InstallError;
use self::files::{
    conf_files, file_has_our_entry, file_mode, is_conflist, is_ours, parse_object, plugins_mut,
    read, sync_dir, temp_path, to_json, write_atomic,
};
pub use self::files::{primary_conf, CONF_EXTENSIONS, PLUGIN_TYPE};
pub use self::watch::InstallWatch;
use crate::conf::{LogLevel, DEFAULT_AGENT_SOCKET};

/// Where container runtimes look for plugin binaries by default.
pub const DEFAULT_BIN_DIR: &str = "/opt/cni/bin";
/// Where container runtimes look for network configs by default.
pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
/// How often the watch re-checks the config when no inotify event came.
pub const DEFAULT_RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How often an edit is redone when the target keeps changing under it.
const MAX_ATTEMPTS: usize = 5;
/// Permission bits of a config file we create (a wrapped `.conflist`).
const NEW_CONF_MODE: u32 = 0o644;
/// Permission bits of the plugin binary.
const BINARY_MODE: u32 = 0o755;

/// What to install where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallConfig {
    /// The CNI bin dir the binary goes into ([`DEFAULT_BIN_DIR`]).
    pub bin_dir: PathBuf,
    /// The CNI conf dir holding the primary config ([`DEFAULT_CONF_DIR`]).
    pub conf_dir: PathBuf,
    /// The plugin binary to copy (in the agent's image).
    pub plugin_binary: PathBuf,
    /// `agentSocket` of our entry.
    pub agent_socket: PathBuf,
    /// `logLevel` of our entry.
    pub log_level: LogLevel,
    /// `logFile` of our entry (a path on the node; the plugin logs to the
    /// runtime's stderr, which runtimes mostly swallow, when `None`).
    pub log_file: Option<PathBuf>,
    /// The watch's re-check period when no inotify event comes.
    pub recheck_interval: Duration,
}

impl InstallConfig {
    /// The defaults, copying `plugin_binary`.
    pub fn new(plugin_binary: impl Into<PathBuf>) -> InstallConfig {
        InstallConfig {
            bin_dir: PathBuf::from(DEFAULT_BIN_DIR),
            conf_dir: PathBuf::from(DEFAULT_CONF_DIR),
            plugin_binary: plugin_binary.into(),
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            log_level: LogLevel::default(),
            log_file: None,
            recheck_interval: DEFAULT_RECHECK_INTERVAL,
        }
    }

    /// Our chained entry: `{"type":"ringway-cni","agentSocket":..,"logLevel":..}`.
    pub fn entry(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("type".into(), PLUGIN_TYPE.into());
        m.insert(
            "agentSocket".into(),
            self.agent_socket.to_string_lossy().into_owned().into(),
        );
        m.insert("logLevel".into(), self.log_level.as_str().into());
        if let Some(f) = &self.log_file {
            m.insert("logFile".into(), f.to_string_lossy().into_owned().into());
        }
        m
    }

    /// Where the binary is installed: `<bin_dir>/ringway-cni`.
    pub fn installed_binary(&self) -> PathBuf {
        self.bin_dir.join(PLUGIN_TYPE)
    }
}

/// What [`Installer::ensure_entry`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The file already had exactly our entry, last: nothing was written.
    Unchanged,
    /// Our entry was appended (there was none).
    Inserted,
    /// An entry of ours was there but not right (not last, duplicated, other fields):
    /// the file now has exactly ours, last.
    Updated,
    /// A single-plugin config was wrapped into the `.conflist` with our entry last, and
    /// removed.
    Wrapped {
        /// The removed single-plugin config.
        from: PathBuf,
    },
}

/// The primary config after [`Installer::ensure_entry`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// The `.conflist` that now holds our entry.
    pub path: PathBuf,
    /// What was done to it.
    pub change: Change,
}

/// What [`Installer::uninstall`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Uninstalled {
    /// The config files our entry was removed from.
    pub files: Vec<PathBuf>,
    /// Whether the binary was there and was removed.
    pub binary_removed: bool,
}

/// The installer for one node. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Installer {
    config: InstallConfig,
}

impl Installer {
    /// An installer for `config`.
    pub fn new(config: InstallConfig) -> Installer {
        Installer { config }
    }

    /// The configuration.
    pub fn config(&self) -> &InstallConfig {
        &self.config
    }

    /// Installs the binary, then the entry: what `ringway agent --install-cni` does at
    /// start (before [`Installer::watch`] keeps the entry in place).
    pub fn install(&self) -> Result<Installed, InstallError> {
        self.install_binary()?;
        self.ensure_entry()
    }

    /// Copies the plugin binary to `<bin_dir>/ringway-cni` (temp file, fsync, 0755,
    /// rename: a runtime executing the old binary keeps it, new calls get the new one).
    pub fn install_binary(&self) -> Result<PathBuf, InstallError> {
        let from = &self.config.plugin_binary;
        let to = self.config.installed_binary();
        let tmp = temp_path(&to);
        let copy = || -> io::Result<()> {
            let mut src = File::open(from)?;
            let mut dst = File::create(&tmp)?;
            io::copy(&mut src, &mut dst)?;
            dst.set_permissions(fs::Permissions::from_mode(BINARY_MODE))?;
            dst.sync_all()?;
            fs::rename(&tmp, &to)?;
            sync_dir(&to)
        };
        copy().map_err(|source| {
            let _ = fs::remove_file(&tmp);
            InstallError::CopyBinary {
                from: from.clone(),
                to: to.clone(),
                source,
            }
        })?;
        info!(binary = %to.display(), from = %from.display(), "installed CNI plugin binary");
        Ok(to)
    }

    /// Makes the primary config hold exactly our entry, last (see the module docs).
    /// Idempotent: a second call returns [`Change::Unchanged`] and writes nothing.
    pub fn ensure_entry(&self) -> Result<Installed, InstallError> {
        let entry = Value::Object(self.config.entry());
        for _ in 0..MAX_ATTEMPTS {
            let path = primary_conf(&self.config.conf_dir)?;
            let bytes = read(&path)?;
            let outcome = if is_conflist(&path) {
                self.ensure_in_list(&path, &bytes, &entry)?
            } else {
                self.wrap(&path, &bytes, &entry)?
            };
            match outcome {
                Some(installed) => {
                    match &installed.change {
                        Change::Unchanged => {
                            debug!(conf = %installed.path.display(), "CNI entry in place")
                        }
                        change => {
                            info!(conf = %installed.path.display(), ?change, "inserted CNI entry")
                        }
                    }
                    return Ok(installed);
                }
                None => {
                    debug!(conf = %path.display(), "CNI config changed while editing it, redoing")
                }
            }
        }
        let path = primary_conf(&self.config.conf_dir)?;
        Err(InstallError::Contended {
            path,
            attempts: MAX_ATTEMPTS,
        })
    }

    /// `None`: the file changed under us, redo.
    fn ensure_in_list(
        &self,
        path: &Path,
        bytes: &[u8],
        entry: &Value,
    ) -> Result<Option<Installed>, InstallError> {
        let mut doc = parse_object(path, bytes)?;
        let plugins = plugins_mut(path, &mut doc)?;
        let had_ours = plugins.iter().any(is_ours);
        let before = plugins.clone();
        plugins.retain(|p| !is_ours(p));
        plugins.push(entry.clone());
        if *plugins == before {
            return Ok(Some(Installed {
                path: path.to_path_buf(),
                change: Change::Unchanged,
            }));
        }
        let out = to_json(&doc);
        let mode = file_mode(path).unwrap_or(NEW_CONF_MODE);
        if !write_atomic(path, &out, mode, Some(bytes))? {
            return Ok(None);
        }
        Ok(Some(Installed {
            path: path.to_path_buf(),
            change: if had_ours {
                Change::Updated
            } else {
                Change::Inserted
            },
        }))
    }

    /// Wraps a single-plugin config into `<stem>.conflist`. `None`: changed under us.
    fn wrap(
        &self,
        path: &Path,
        bytes: &[u8],
        entry: &Value,
    ) -> Result<Option<Installed>, InstallError> {
        let mut plugin = parse_object(path, bytes)?;
        if !matches!(plugin.get("type"), Some(Value::String(_))) {
            return Err(InstallError::MissingField {
                path: path.to_path_buf(),
                field: "type",
            });
        }
        let name = match plugin.remove("name") {
            Some(Value::String(name)) => name,
            _ => {
                return Err(InstallError::MissingField {
                    path: path.to_path_buf(),
                    field: "name",
                })
            }
        };
        let version = plugin.remove("cniVersion");
        let target = path.with_extension("conflist");
        if target.exists() && !file_has_our_entry(&target) {
            return Err(InstallError::WrapTargetExists {
                conf: path.to_path_buf(),
                target,
            });
        }

        let mut list = Map::new();
        if let Some(v) = version {
            list.insert("cniVersion".into(), v);
        }
        list.insert("name".into(), Value::String(name));
        list.insert(
            "plugins".into(),
            Value::Array(vec![Value::Object(plugin), entry.clone()]),
        );
        let mode = file_mode(path).unwrap_or(NEW_CONF_MODE);
        write_atomic(&target, &to_json(&list), mode, None)?;
        // The runtime may now see both; the single-plugin file sorts first (`x.conf` <
        // `x.conflist`) and is still valid, so it keeps working until the removal.
        match read(path) {
            Ok(now) if now == bytes => {}
            // Rewritten by the primary CNI meanwhile: wrap its new content.
            Ok(_) => return Ok(None),
            // Already gone (the primary CNI moved it away): nothing to remove.
            Err(_) => {}
        }
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(InstallError::Remove {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
        sync_dir(path).map_err(|source| InstallError::Write {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Some(Installed {
            path: target,
            change: Change::Wrapped {
                from: path.to_path_buf(),
            },
        }))
    }

    /// Whether the primary config holds our entry, equal to the configured one, as the
    /// last plugin (a readiness check; writes nothing). Returns the primary config.
    pub fn check(&self) -> Result<PathBuf, InstallError> {
        let path = primary_conf(&self.config.conf_dir)?;
        let bytes = read(&path)?;
        let mut doc = parse_object(&path, &bytes)?;
        if !is_conflist(&path) {
            return Err(InstallError::NotInstalled { path });
        }
        let plugins = plugins_mut(&path, &mut doc)?;
        let ours = Value::Object(self.config.entry());
        let n_ours = plugins.iter().filter(|p| is_ours(p)).count();
        if n_ours == 1 && plugins.last() == Some(&ours) {
            Ok(path)
        } else {
            Err(InstallError::NotInstalled { path })
        }
    }

    /// Removes our entry from every config file of the conf dir, then the binary.
    /// Files that do not parse, and a missing binary, are left alone (not errors).
    pub fn uninstall(&self) -> Result<Uninstalled, InstallError> {
        let mut done = Uninstalled::default();
        for path in conf_files(&self.config.conf_dir)? {
            if self.remove_entry(&path)? {
                info!(conf = %path.display(), "removed CNI entry");
                done.files.push(path);
            }
        }
        let binary = self.config.installed_binary();
        match fs::remove_file(&binary) {
            Ok(()) => {
                done.binary_removed = true;
                info!(binary = %binary.display(), "removed CNI plugin binary");
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(InstallError::Remove {
                    path: binary,
                    source,
                })
            }
        }
        Ok(done)
    }

    /// Whether our entry was in `path` (and is no longer).
    fn remove_entry(&self, path: &Path) -> Result<bool, InstallError> {
        for _ in 0..MAX_ATTEMPTS {
            let bytes = match fs::read(path) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(source) => {
                    return Err(InstallError::Read {
                        path: path.to_path_buf(),
                        source,
                    })
                }
            };
            let Ok(mut doc) = parse_object(path, &bytes) else {
                debug!(conf = %path.display(), "not a JSON object, skipped by uninstall");
                return Ok(false);
            };
            let Some(Value::Array(plugins)) = doc.get_mut("plugins") else {
                return Ok(false);
            };
            if !plugins.iter().any(is_ours) {
                return Ok(false);
            }
            plugins.retain(|p| !is_ours(p));
            let mode = file_mode(path).unwrap_or(NEW_CONF_MODE);
            if write_atomic(path, &to_json(&doc), mode, Some(&bytes))? {
                return Ok(true);
            }
        }
        Err(InstallError::Contended {
            path: path.to_path_buf(),
            attempts: MAX_ATTEMPTS,
        })
    }

    /// Starts the watch thread (see the module docs): [`Installer::ensure_entry`] now,
    /// on every inotify event of the conf dir, and at least every
    /// [`InstallConfig::recheck_interval`]. Failures are logged (at warn when they
    /// change, so a missing primary config does not log every second) and retried.
    pub fn watch(&self) -> Result<InstallWatch, InstallError> {
        let installer = self.clone();
        watch::start(
            self.config.conf_dir.clone(),
            self.config.recheck_interval,
            move || installer.ensure_entry().map(|_| ()),
        )
    }
}

#[cfg(test)]
mod tests;
