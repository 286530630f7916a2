//! The agent's socket files and peers, a leaf used by both servers: a socket
//! is bound under a temporary name, made 0600 and renamed into place; a stale
//! file is cleared, a live one refused; a peer's uid is checked with
//! SO_PEERCRED before a byte is read.

use std::os::fd::AsFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::StartError;

/// Makes `path` free for a new socket: a stale socket file is removed, a
/// live one (something answers a connect) or a non-socket is refused.
pub(super) fn clear_stale(path: &Path, probe: impl Fn(&Path) -> bool) -> Result<(), StartError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(StartError::Socket {
                what: "inspecting",
                path: path.to_path_buf(),
                source: e,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(StartError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if probe(path) {
        return Err(StartError::InUse {
            path: path.to_path_buf(),
        });
    }
    tracing::info!(path = %path.display(), "removing a stale socket file");
    std::fs::remove_file(path).map_err(|e| StartError::Socket {
        what: "removing the stale socket",
        path: path.to_path_buf(),
        source: e,
    })
}

/// A temporary name beside `path`: sockets are bound there, made 0600, then
/// renamed into place, so nobody can connect before the mode is set.
pub(super) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Creates the socket's directory (mode 0700 for what it creates: each
/// socket has a directory of its own, mounted only by who may use it).
pub(super) fn create_parent(path: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StartError::Socket {
                what: "creating the directory of",
                path: path.to_path_buf(),
                source: e,
            })?;
    }
    Ok(())
}

pub(super) fn chmod_600(path: &Path) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

/// Why a peer may not use the agent's sockets.
#[derive(Debug, thiserror::Error)]
pub(super) enum PeerRefused {
    /// Its uid is not one of the allowed.
    #[error("peer uid {uid} (pid {pid}) is not allowed on the {socket} socket (allowed uids: {allowed:?})")]
    Uid {
        /// `zds` or `cni`.
        socket: &'static str,
        /// The peer's uid.
        uid: u32,
        /// The peer's pid.
        pid: i32,
        /// [`super::AgentConfig::peer_uids`].
        allowed: Vec<u32>,
    },
    /// SO_PEERCRED failed.
    #[error("cannot read the peer's credentials: {0}")]
    Unknown(#[source] nix::errno::Errno),
}

impl PeerRefused {
    /// The `reason` label of `ringway_agent_connections_refused_total`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            PeerRefused::Uid { .. } => "peer_uid",
            PeerRefused::Unknown(_) => "peer_unknown",
        }
    }
}

/// Whether the peer of `sock` may use the agent's `socket` (`zds`, `cni`):
/// its uid (SO_PEERCRED) is one of `allowed`.
pub(super) fn check_peer(
    sock: &impl AsFd,
    socket: &'static str,
    allowed: &[u32],
) -> Result<(), PeerRefused> {
    match nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(c) if allowed.contains(&c.uid()) => Ok(()),
        Ok(c) => Err(PeerRefused::Uid {
            socket,
            uid: c.uid(),
            pid: c.pid(),
            allowed: allowed.to_vec(),
        }),
        Err(e) => Err(PeerRefused::Unknown(e)),
    }
}
