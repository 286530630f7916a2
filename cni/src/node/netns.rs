//! Network namespaces, a leaf: the inode of a namespace fd and its canonical
//! `/proc/thread-self/ns/net` form, the scans of `proc_root` and the netns
//! directories behind rediscovery and the liveness check of pinned
//! namespaces, and finding a running pod's namespace for the Kubernetes
//! watch.

use std::collections::HashSet;
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The inode of a namespace fd.
pub(super) fn inode_of(fd: BorrowedFd<'_>) -> Option<u64> {
    nix::sys::stat::fstat(fd.as_raw_fd()).ok().map(|s| s.st_ino)
}

/// The same namespace, reopened through `/proc/thread-self/ns/net` by a
/// short-lived thread that entered it. An fd opened through a bind mount
/// (`/var/run/netns/cni-...`, what runtimes pass as CNI_NETNS) shows that
/// path in `/proc/<pid>/fd`; proxies that identify a netns fd by its link
/// (`net:[inode]`) would refuse it, so every fd handed out is of this form.
pub(super) fn canonical_netns(fd: &OwnedFd) -> std::io::Result<OwnedFd> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            std::fs::File::open("/proc/thread-self/ns/net").map(OwnedFd::from)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("netns reopen thread panicked")))
    })
}

/// A network namespace found by a scan.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub(super) inode: u64,
    /// `<proc_root>/<pid>/ns/net` or a file in a netns directory.
    pub(super) path: PathBuf,
    /// Found through a process (else through a mount).
    pub(super) via_process: bool,
}

/// `net:[4026532000]` -> 4026532000.
fn parse_ns_link(link: &str) -> Option<u64> {
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// (pid, netns inode) of every process, pids ascending; `None` (warned)
/// when `proc_root` cannot be read.
fn processes(proc_root: &Path) -> Option<Vec<(u32, u64)>> {
    let dir = match std::fs::read_dir(proc_root) {
        Ok(dir) => dir,
        Err(e) => {
            tracing::warn!(proc_root = %proc_root.display(), error = %e, "cannot read proc_root");
            return None;
        }
    };
    let mut out: Vec<(u32, u64)> = dir
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let link = std::fs::read_link(e.path().join("ns/net")).ok()?;
            Some((pid, parse_ns_link(link.to_str()?)?))
        })
        .collect();
    out.sort_unstable();
    Some(out)
}

/// (path, inode) of every file in the netns directories (one that does not
/// exist holds none), and whether every one that exists could be read (one
/// that cannot is warned about and skipped).
fn mounted(netns_dirs: &[PathBuf]) -> (Vec<(PathBuf, u64)>, bool) {
    let mut out = Vec::new();
    let mut complete = true;
    for d in netns_dirs {
        let dir = match std::fs::read_dir(d) {
            Ok(dir) => dir,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(netns_dir = %d.display(), error = %e, "cannot read a netns directory");
                complete = false;
                continue;
            }
        };
        let mut here: Vec<(PathBuf, u64)> = dir
            .flatten()
            .filter_map(|e| {
                let p = e.path();
                let m = std::fs::metadata(&p).ok()?;
                Some((p, m.ino()))
            })
            .collect();
        here.sort();
        out.extend(here);
    }
    (out, complete)
}

/// Inodes of namespaces that are never a pod's: this process's, the calling
/// thread's, PID 1's.
fn own_inodes() -> HashSet<u64> {
    [
        "/proc/self/ns/net",
        "/proc/thread-self/ns/net",
        "/proc/1/ns/net",
    ]
    .iter()
    .filter_map(|p| std::fs::metadata(p).ok().map(|m| m.ino()))
    .collect()
}

/// Inodes of every namespace a process is in or a netns directory mounts;
/// `None` when `proc_root` or a netns directory that exists cannot be read:
/// a scan that saw nothing is no proof that a namespace is gone.
pub(super) fn live_inodes(proc_root: &Path, netns_dirs: &[PathBuf]) -> Option<HashSet<u64>> {
    let processes = processes(proc_root)?;
    let (mounted, complete) = mounted(netns_dirs);
    if !complete {
        return None;
    }
    Some(
        processes
            .into_iter()
            .map(|(_, ino)| ino)
            .chain(mounted.into_iter().map(|(_, ino)| ino))
            .collect(),
    )
}

/// Every distinct namespace, processes first (oldest pid first), then mounts.
pub(super) fn scan(proc_root: &Path, netns_dirs: &[PathBuf]) -> Vec<Found> {
    let own = own_inodes();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    // What cannot be read is skipped (warned): nothing is found there.
    for (pid, inode) in processes(proc_root).unwrap_or_default() {
        if !own.contains(&inode) && seen.insert(inode) {
            out.push(Found {
                inode,
                path: proc_root.join(pid.to_string()).join("ns/net"),
                via_process: true,
            });
        }
    }
    for (path, inode) in mounted(netns_dirs).0 {
        if !own.contains(&inode) && seen.insert(inode) {
            out.push(Found {
                inode,
                path,
                via_process: false,
            });
        }
    }
    out
}

/// The start time (clock ticks since boot, field 22 of `stat`) of a process.
fn start_time(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: skip past its ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The addresses configured in the namespace `fd`.
fn addresses_in(fd: &OwnedFd) -> std::io::Result<Vec<IpAddr>> {
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(fd.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
            let addrs = nix::ifaddrs::getifaddrs()?;
            Ok(addrs
                .filter_map(|a| {
                    let a = a.address?;
                    if let Some(v4) = a.as_sockaddr_in() {
                        Some(IpAddr::V4(v4.ip()))
                    } else {
                        a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
                    }
                })
                .collect())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("address listing thread panicked")))
    })
}

/// Finds the network namespace of a running pod (for the Kubernetes watch,
/// which knows pods, not namespaces): the processes whose
/// `<proc_root>/<pid>/cgroup` names the pod UID (`pod<uid>` with the cgroupfs
/// driver, `pod<uid with _ for ->` with systemd's), oldest first; the first
/// of their namespaces that is a pod's (not the host's) and holds one of
/// `ips` (when any are given) wins. Returns the fd and the path it was opened by.
pub(super) fn find_pod_netns(
    proc_root: &Path,
    uid: &str,
    ips: &[IpAddr],
) -> Result<(OwnedFd, PathBuf), FindNetnsError> {
    let needles = [uid.to_string(), uid.replace('-', "_")];
    let own = own_inodes();
    let dir = std::fs::read_dir(proc_root).map_err(|source| FindNetnsError::ProcRoot {
        proc_root: proc_root.to_path_buf(),
        source,
    })?;
    let mut procs: Vec<(u64, u32, u64)> = dir
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cgroup = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
            if !needles.iter().any(|n| cgroup.contains(&format!("pod{n}"))) {
                return None;
            }
            let link = std::fs::read_link(e.path().join("ns/net")).ok()?;
            let ino = parse_ns_link(link.to_str()?)?;
            let started = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| start_time(&s))
                .unwrap_or(u64::MAX);
            Some((started, pid, ino))
        })
        .collect();
    if procs.is_empty() {
        return Err(FindNetnsError::NoProcess {
            uid: uid.to_owned(),
            proc_root: proc_root.to_path_buf(),
        });
    }
    procs.sort_unstable();
    let mut tried = HashSet::new();
    let mut why = Vec::new();
    for (_, pid, ino) in procs {
        if own.contains(&ino) {
            why.push(format!("pid {pid} is in the host's network namespace"));
            continue;
        }
        if !tried.insert(ino) {
            continue;
        }
        let path = proc_root.join(pid.to_string()).join("ns/net");
        let fd = match File::open(&path) {
            Ok(f) => OwnedFd::from(f),
            Err(e) => {
                why.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        if let Err(e) = ringway_redirect::check_pod_netns(fd.as_fd()) {
            why.push(e.to_string());
            continue;
        }
        if !ips.is_empty() {
            match addresses_in(&fd) {
                Ok(have) if ips.iter().any(|ip| have.contains(ip)) => {}
                Ok(_) => {
                    why.push(format!(
                        "net:[{ino}] of pid {pid} holds none of the pod's IPs {ips:?}"
                    ));
                    continue;
                }
                Err(e) => {
                    why.push(format!("listing the addresses of net:[{ino}]: {e}"));
                    continue;
                }
            }
        }
        return Ok((fd, path));
    }
    Err(FindNetnsError::NoNamespace {
        uid: uid.to_owned(),
        tried: why,
    })
}

/// Why `find_pod_netns` found no namespace for a pod.
#[derive(Debug, thiserror::Error)]
pub enum FindNetnsError {
    /// procfs could not be listed.
    #[error("cannot read {}: {source}", proc_root.display())]
    ProcRoot {
        /// The agent's `proc_root`.
        proc_root: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// No process's cgroup names the pod.
    #[error("no process of pod {uid} found (no {}/*/cgroup names it)", proc_root.display())]
    NoProcess {
        /// The pod's UID.
        uid: String,
        /// The agent's `proc_root`.
        proc_root: PathBuf,
    },
    /// The pod's processes were found, none in a namespace that is the pod's.
    #[error("no network namespace of pod {uid} found: {}", tried.join("; "))]
    NoNamespace {
        /// The pod's UID.
        uid: String,
        /// Why each candidate was passed over.
        tried: Vec<String>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_times_parse_past_odd_command_names() {
        let stat = "4242 (sle ep) (x) S 1 4242 4242 0 -1 4194560 103 0 0 0 0 0 0 0 20 0 1 0 987654 2457600 130";
        assert_eq!(start_time(stat), Some(987654));
        assert_eq!(start_time("garbage"), None);
    }

    #[test]
    fn ns_links_parse() {
        assert_eq!(parse_ns_link("net:[4026531840]"), Some(4026531840));
        assert_eq!(parse_ns_link("mnt:[4026531840]"), None);
        assert_eq!(parse_ns_link("net:[x]"), None);
    }

    /// A scan that could not look is no proof that anything is gone; a
    /// netns directory that does not exist (yet) is only empty.
    #[test]
    fn a_scan_that_cannot_read_finds_nothing_gone() {
        let dir = std::env::temp_dir().join(format!("ringway-live-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let missing = dir.join("missing");
        assert_eq!(live_inodes(&missing, &[]), None, "proc_root unreadable");
        assert_eq!(
            live_inodes(Path::new("/proc"), std::slice::from_ref(&file)),
            None,
            "a netns directory that is a file"
        );
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino();
        let live =
            live_inodes(Path::new("/proc"), &[missing]).expect("a missing netns dir is empty");
        assert!(live.contains(&own), "this process's namespace is live");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
