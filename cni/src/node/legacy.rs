//! The socket paths of the previous release, kept working through an upgrade.
//!
//! Up to this release both sockets lived in `/var/run/ringway/` and the proxy
//! mounted that whole directory. Now each has a directory of its own and the
//! proxy mounts only the ZDS one. During a rolling upgrade an agent of this
//! release can meet a proxy (and CNI entries) of the previous one: the agent
//! links the old paths to the new sockets, so an old proxy reconnects at once
//! and an old entry's ADD still reaches the agent. (A new proxy beside an old
//! agent stays unready, and the old proxy keeps serving, until the agent on
//! its node is upgraded: the proxy's rollout waits for readiness.)

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

/// The ZDS socket of the previous release.
pub const LEGACY_ZDS_SOCKET: &str = "/var/run/ringway/zds.sock";
/// The CNI socket of the previous release.
pub const LEGACY_CNI_SOCKET: &str = "/var/run/ringway/cni.sock";

/// Makes `legacy` a symlink to `socket`. Replaces what a previous agent left
/// there (a socket or a link); leaves anything else alone (`Ok(false)`), as
/// it does when `legacy`'s directory does not exist or is `socket` itself.
pub fn link_legacy_socket(socket: &Path, legacy: &Path) -> io::Result<bool> {
    if legacy == socket || !legacy.parent().is_some_and(Path::is_dir) {
        return Ok(false);
    }
    match std::fs::symlink_metadata(legacy) {
        Ok(m) if m.file_type().is_socket() || m.file_type().is_symlink() => {
            std::fs::remove_file(legacy)?;
        }
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(socket, legacy)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_paths_lead_to_the_new_sockets() {
        let dir = ringway_testbed::TempDir::new("legacy");
        std::fs::create_dir_all(dir.join("zds")).unwrap();
        let socket = dir.join("zds/zds.sock");
        let _l = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let legacy = dir.join("zds.sock");
        // A stale socket of the previous agent is replaced by the link.
        let _old = std::os::unix::net::UnixListener::bind(&legacy).unwrap();
        assert!(link_legacy_socket(&socket, &legacy).unwrap());
        assert_eq!(std::fs::read_link(&legacy).unwrap(), socket);
        std::os::unix::net::UnixStream::connect(&legacy)
            .expect("the old path reaches the new socket");
        // Again (an agent restart): still a link to the socket.
        assert!(link_legacy_socket(&socket, &legacy).unwrap());
        // A regular file is not ours to replace; a missing directory is skipped.
        let other = dir.join("notes");
        std::fs::write(&other, "x").unwrap();
        assert!(!link_legacy_socket(&socket, &other).unwrap());
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "x");
        assert!(!link_legacy_socket(&socket, &dir.join("gone/zds.sock")).unwrap());
        assert!(!link_legacy_socket(&socket, &socket).unwrap());
    }
}
