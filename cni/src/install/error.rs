//! Why an install step failed, a leaf of the installer: each variant names
//! the file and the problem.

use std::io;
use std::path::PathBuf;

/// Why an install step failed. Each variant names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The conf dir could not be listed.
    #[error("cannot list CNI conf dir {dir}: {source}")]
    ReadDir {
        /// The conf dir.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// No `*.conflist`, `*.conf` or `*.json` in the conf dir: the primary CNI has not
    /// written its config yet.
    #[error("no CNI network config (*.conflist, *.conf, *.json) in {dir}")]
    NoConfFile {
        /// The conf dir.
        dir: PathBuf,
    },
    /// A config file could not be read.
    #[error("cannot read CNI config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A config file is not JSON.
    #[error("CNI config {path} is not JSON: {source}")]
    NotJson {
        /// The file.
        path: PathBuf,
        /// The parser's error (with line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A config file is JSON but not an object.
    #[error("CNI config {path} is a JSON {found}, expected an object")]
    NotObject {
        /// The file.
        path: PathBuf,
        /// The JSON type found.
        found: &'static str,
    },
    /// A `.conflist` without a `plugins` array.
    #[error("CNI config list {path} has no \"plugins\" array")]
    NoPlugins {
        /// The file.
        path: PathBuf,
    },
    /// An element of `plugins` is not an object.
    #[error("CNI config list {path}: plugins[{index}] is a JSON {found}, expected an object")]
    PluginNotObject {
        /// The file.
        path: PathBuf,
        /// The element's index.
        index: usize,
        /// The JSON type found.
        found: &'static str,
    },
    /// A single-plugin config (`.conf`, `.json`) without a string field the wrap needs.
    #[error("CNI config {path} has no string \"{field}\" (a single-plugin config needs one)")]
    MissingField {
        /// The file.
        path: PathBuf,
        /// `type` or `name`.
        field: &'static str,
    },
    /// Wrapping a `.conf` would overwrite a `.conflist` that is not ours.
    #[error("cannot wrap CNI config {conf}: {target} exists and was not written by ringway")]
    WrapTargetExists {
        /// The single-plugin config.
        conf: PathBuf,
        /// The `.conflist` it would become.
        target: PathBuf,
    },
    /// The config kept changing while we tried to edit it.
    #[error("CNI config {path} changed under every one of {attempts} attempts to edit it")]
    Contended {
        /// The file.
        path: PathBuf,
        /// How many attempts were made.
        attempts: usize,
    },
    /// Writing, syncing or renaming a file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file being written (the final name, not the temp file).
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Removing a file failed.
    #[error("cannot remove {path}: {source}")]
    Remove {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The plugin binary could not be copied.
    #[error("cannot copy plugin binary {from} to {to}: {source}")]
    CopyBinary {
        /// The source binary.
        from: PathBuf,
        /// The installed path.
        to: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The primary config does not hold our entry in last position ([`Installer::check`](crate::install::Installer::check)).
    #[error("CNI config {path} does not have the ringway-cni entry as its last plugin")]
    NotInstalled {
        /// The primary config.
        path: PathBuf,
    },
    /// The watch could not be set up (inotify, pipe, thread).
    #[error("cannot watch CNI conf dir {dir}: {source}")]
    Watch {
        /// The conf dir.
        dir: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}
