//! [`ConfigError`]: every configuration error names where the bad value came
//! from (file or environment variable), the field and the problem.

use std::sync::Arc;

/// Configuration errors: each names the field and what is wrong with it.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A proxy setting holds a value that cannot be used
    /// ([`ProxySettings::validate`](crate::ProxySettings::validate)).
    #[error("invalid `{field}`: {problem}")]
    Invalid {
        /// Dotted field path.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },
    /// A field of a configuration file (or a field set by an environment
    /// variable) failed validation:
    /// `config.yaml: workloads[2].ips[0]: "10.0.0.300" is not an IP address`.
    #[error("{origin}: {path}: {problem}")]
    Field {
        /// The file the value came from, or `environment variable NAME`.
        origin: String,
        /// Field path in the YAML document: `policies[0].rules[1].from[0].ipBlocks[0]`.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The file is not YAML of the expected shape (syntax error, unknown
    /// field, wrong type); line and column are 1-based.
    #[error("{origin}:{line}:{column}: {message}")]
    Parse {
        /// The file.
        origin: String,
        /// Line of the problem.
        line: usize,
        /// Column of the problem.
        column: usize,
        /// The parser's message, starting with the field path when it has one.
        message: String,
    },
    /// An environment variable holds a value that cannot be parsed.
    #[error("environment variable {var}: {problem}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong (quotes the value).
        problem: String,
    },
    /// The file is larger than [`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES)
    /// (or a device or FIFO that does not end): not read past the limit.
    #[error("{origin}: larger than the limit of {limit} bytes ({} MiB); refusing to read it", limit >> 20)]
    TooLarge {
        /// The file.
        origin: String,
        /// The limit, bytes.
        limit: u64,
    },
    /// The file cannot be read.
    #[error("{origin}: {source}")]
    Io {
        /// The file.
        origin: String,
        /// The operating system's error.
        #[source]
        source: IoError,
    },
}

impl ConfigError {
    pub(crate) fn io(origin: impl Into<String>, source: std::io::Error) -> ConfigError {
        ConfigError::Io {
            origin: origin.into(),
            source: IoError(Arc::new(source)),
        }
    }

    /// Turns a `serde_norway` error into [`ConfigError::Parse`], keeping its
    /// line and column and dropping the duplicate "at line N column M" from
    /// the message.
    pub(crate) fn yaml(origin: &str, err: &serde_norway::Error) -> ConfigError {
        let mut message = err.to_string();
        let (line, column) = err
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((1, 1));
        let suffix = format!(" at line {line} column {column}");
        if let Some(at) = message.find(&suffix) {
            message.replace_range(at..at + suffix.len(), "");
        }
        ConfigError::Parse {
            origin: origin.to_owned(),
            line,
            column,
            message,
        }
    }
}

/// An [`std::io::Error`] that can be cloned and compared (by kind and
/// message), so [`ConfigError`] stays `Clone + Eq`.
#[derive(Debug, Clone)]
pub struct IoError(Arc<std::io::Error>);

impl IoError {
    /// The error's kind (`NotFound`, `PermissionDenied`, ...).
    pub fn kind(&self) -> std::io::ErrorKind {
        self.0.kind()
    }
}

impl std::fmt::Display for IoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for IoError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for IoError {
    fn eq(&self, other: &Self) -> bool {
        self.0.kind() == other.0.kind() && self.0.to_string() == other.0.to_string()
    }
}

impl Eq for IoError {}
