//! Finding, validating and entering a pod's network namespace.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::errno::Errno;
use nix::sched::{setns, CloneFlags};
use nix::sys::statfs::{fstatfs, NSFS_MAGIC};

use crate::error::RedirectError;

/// (device, inode) of a namespace: its identity.
type NsId = (u64, u64);

fn fd_id(fd: BorrowedFd<'_>, what: &str) -> Result<NsId, RedirectError> {
    let st = nix::sys::stat::fstat(fd.as_raw_fd())
        .map_err(|e| RedirectError::sys(format!("fstat({what})"), e))?;
    Ok((st.st_dev, st.st_ino))
}

fn path_id(path: &str) -> Result<NsId, RedirectError> {
    let m = std::fs::metadata(path).map_err(|e| RedirectError::io(format!("stat {path}"), e))?;
    Ok((m.dev(), m.ino()))
}

/// Opens `path` (e.g. `/var/run/netns/<name>` or `/proc/<pid>/ns/net`) and
/// checks it with [`check_pod_netns`].
pub fn open_netns(path: &Path) -> Result<OwnedFd, RedirectError> {
    let f = File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => RedirectError::NetnsNotFound {
            path: path.to_path_buf(),
        },
        _ => RedirectError::io(format!("opening network namespace {}", path.display()), e),
    })?;
    let fd = OwnedFd::from(f);
    check_netns_fd(
        std::os::fd::AsFd::as_fd(&fd),
        &format!("{}", path.display()),
    )?;
    Ok(fd)
}

/// Refuses an fd that is not a network namespace, or that is the host's
/// (PID 1's) or the calling thread's own network namespace.
pub fn check_pod_netns(fd: BorrowedFd<'_>) -> Result<(), RedirectError> {
    check_netns_fd(fd, &format!("fd {}", fd.as_raw_fd()))
}

fn check_netns_fd(fd: BorrowedFd<'_>, what: &str) -> Result<(), RedirectError> {
    // A namespace fd lives on nsfs; /proc shows it as `<type>:[<inode>]`
    // unless it was opened through a bind mount (`/run/netns/<name>`), where
    // it shows the mount path. Then only setns() with the wanted type can
    // tell a net namespace from another kind, so try that on a scratch thread.
    let link = std::fs::read_link(format!("/proc/thread-self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "an unreadable fd".to_string());
    let on_nsfs = fstatfs(fd)
        .map(|s| s.filesystem_type() == NSFS_MAGIC)
        .map_err(|e| RedirectError::sys(format!("fstatfs({what})"), e))?;
    let not_netns = |found: String| RedirectError::NotANetns {
        what: what.to_string(),
        found,
    };
    if !on_nsfs {
        return Err(not_netns(link));
    }
    if !link.starts_with("net:[") {
        if link.contains(":[") && !link.starts_with('/') {
            return Err(not_netns(link));
        }
        match setns_probe(fd) {
            Ok(()) => {}
            Err(Errno::EINVAL) => {
                return Err(not_netns(format!("{link} (a namespace of another kind)")))
            }
            Err(e) => return Err(RedirectError::sys(format!("probing {what} with setns"), e)),
        }
    }
    let id = fd_id(fd, what)?;
    for (path, which) in HOST_NETNS_REFS {
        let found = match path_id(path) {
            Ok(found) => found,
            // PID 1's links need ptrace access to PID 1, which sandboxes and
            // hardened hosts deny even to root; the process's own namespace
            // (where a node agent runs) is still compared below.
            Err(RedirectError::Io { source, .. })
                if *path == "/proc/1/ns/net"
                    && source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                tracing::debug!(
                    "cannot read /proc/1/ns/net (permission denied); skipping that comparison"
                );
                continue;
            }
            Err(e) => return Err(e),
        };
        if found == id {
            return Err(RedirectError::HostNetns {
                what: what.to_string(),
                which,
                inode: id.1,
            });
        }
    }
    Ok(())
}

/// Namespaces that are never a pod's: PID 1's (the host's), this process's
/// (a node agent runs in the host namespace; in tests it is the machine's
/// root namespace), and the calling thread's own.
const HOST_NETNS_REFS: &[(&str, &str)] = &[
    ("/proc/1/ns/net", "the host network namespace (PID 1's)"),
    (
        "/proc/self/ns/net",
        "this process's own network namespace (its main thread's)",
    ),
    (
        "/proc/thread-self/ns/net",
        "the calling thread's own network namespace",
    ),
];

/// Whether `setns(fd, CLONE_NEWNET)` accepts `fd` (EINVAL: another kind of
/// namespace), tried on a throwaway thread so the caller never moves.
fn setns_probe(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    std::thread::scope(|s| {
        s.spawn(|| setns(fd, CloneFlags::CLONE_NEWNET))
            .join()
            .unwrap_or(Err(Errno::EINVAL))
    })
}

/// Runs `f` on a short-lived thread that has entered the network namespace
/// `netns` (after [`check_pod_netns`]); netlink sockets and /proc/sys/net
/// opened by `f` belong to that namespace.
pub(crate) fn run_in<T: Send>(
    netns: BorrowedFd<'_>,
    op: &'static str,
    f: impl FnOnce() -> Result<T, RedirectError> + Send,
) -> Result<T, RedirectError> {
    check_pod_netns(netns)?;
    let id = fd_id(netns, "netns fd")?;
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name(format!("ringway-{op}"))
            .spawn_scoped(s, move || {
                setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| {
                    RedirectError::sys(format!("{op}: setns(CLONE_NEWNET) into net:[{}]", id.1), e)
                })?;
                // Belt and braces: never program anything unless this thread
                // is really in the pod's namespace.
                let now = path_id("/proc/thread-self/ns/net")?;
                if now != id {
                    return Err(RedirectError::Protocol {
                        what: format!("{op}: entering net:[{}]", id.1),
                        detail: format!("thread is in net:[{}] after setns", now.1),
                    });
                }
                f()
            })
            .map_err(|e| RedirectError::io(format!("{op}: spawning the netns worker thread"), e))?;
        worker
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// The inode of a namespace fd (for logs).
pub(crate) fn inode(fd: BorrowedFd<'_>) -> u64 {
    fd_id(fd, "netns fd").map(|i| i.1).unwrap_or(0)
}
