//! Finding network namespaces: the /proc and netns-directory scans behind
//! rediscovery at start and the liveness check of pinned namespaces.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::net::IpAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use ringway_redirect::PodTag;

use super::record::{self, RecordedPod};
use super::state::{canonical_netns, Core, Entry};
use super::{AgentConfig, Pod, PodSource, Rediscovery};

/// A network namespace found by a scan.
#[derive(Debug, Clone)]
struct Found {
    inode: u64,
    /// `<proc_root>/<pid>/ns/net` or a file in a netns directory.
    path: PathBuf,
    via_process: bool,
}

/// `net:[4026532000]` -> 4026532000.
fn parse_ns_link(link: &str) -> Option<u64> {
    link.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// (pid, netns inode) of every process, pids ascending.
fn processes(cfg: &AgentConfig) -> Vec<(u32, u64)> {
    let Ok(dir) = std::fs::read_dir(&cfg.proc_root) else {
        tracing::warn!(proc_root = %cfg.proc_root.display(), "cannot read proc_root");
        return Vec::new();
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
    out
}

/// (path, inode) of every file in the netns directories.
fn mounted(cfg: &AgentConfig) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for d in &cfg.netns_dirs {
        let Ok(dir) = std::fs::read_dir(d) else {
            continue;
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
    out
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

/// Inodes of every namespace a process is in or a netns directory mounts.
pub(super) fn live_inodes(cfg: &AgentConfig) -> HashSet<u64> {
    processes(cfg)
        .into_iter()
        .map(|(_, ino)| ino)
        .chain(mounted(cfg).into_iter().map(|(_, ino)| ino))
        .collect()
}

/// Every distinct namespace, processes first (oldest pid first), then mounts.
fn scan(cfg: &AgentConfig) -> Vec<Found> {
    let own = own_inodes();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (pid, inode) in processes(cfg) {
        if !own.contains(&inode) && seen.insert(inode) {
            out.push(Found {
                inode,
                path: cfg.proc_root.join(pid.to_string()).join("ns/net"),
                via_process: true,
            });
        }
    }
    for (path, inode) in mounted(cfg) {
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

fn pod_from_record(rec: &RecordedPod) -> Pod {
    Pod {
        uid: rec.uid.clone(),
        name: rec.name.clone(),
        namespace: rec.namespace.clone(),
        service_account: rec.service_account.clone(),
        ips: rec.ips.clone(),
        container_id: rec.container_id.clone(),
    }
}

/// Why an owner tag found in namespace `inode` does not match the agent's
/// record (`None`: it matches). The tag is pod-writable: every field the
/// pod's identity is made of must agree, and the namespace must be the one
/// the pod was enrolled with.
fn disagreement(tag: &PodTag, rec: &RecordedPod, inode: u64) -> Option<String> {
    if rec.netns_inode != Some(inode) {
        return Some(format!(
            "the agent enrolled it in {}",
            rec.netns_inode
                .map(|i| format!("net:[{i}]"))
                .unwrap_or_else(|| "a namespace that is gone".into())
        ));
    }
    let rec_cid = rec.container_id.as_deref().unwrap_or("");
    for (field, tagged, recorded) in [
        ("namespace", tag.namespace.as_str(), rec.namespace.as_str()),
        ("name", tag.name.as_str(), rec.name.as_str()),
        (
            "service account",
            tag.service_account.as_str(),
            rec.service_account.as_str(),
        ),
        ("sandbox id", tag.container_id.as_str(), rec_cid),
    ] {
        if tagged != recorded {
            return Some(format!(
                "its tag says {field} {tagged:?}, the agent recorded {recorded:?}"
            ));
        }
    }
    if tag.ips != rec.ips {
        return Some(format!(
            "its tag says IPs {:?}, the agent recorded {:?}",
            tag.ips, rec.ips
        ));
    }
    None
}

/// Rebuilds the enrolled pods from the owner tags in the kernel that agree
/// with the agent's record (see the module docs, "Restart"). Verifies each
/// pod's rules and re-applies them only on drift; never removes any.
pub(super) fn rediscover(core: &Core) -> Rediscovery {
    let cfg = core.config();
    let recorded = match cfg
        .state_file
        .as_deref()
        .map(|p| record::load(p, &cfg.node_name))
    {
        None => {
            tracing::info!("no state file configured: no pod is adopted at start");
            BTreeMap::new()
        }
        Some(Ok(Some(pods))) => pods,
        Some(Ok(None)) => {
            tracing::info!("no state file yet: no pod to adopt");
            BTreeMap::new()
        }
        Some(Err(e)) => {
            tracing::error!(error = %e, "the agent's record is unreadable: no pod is adopted (their rules stay in place)");
            BTreeMap::new()
        }
    };
    let found = scan(cfg);
    let mut report = Rediscovery {
        namespaces: found.len(),
        ..Rediscovery::default()
    };
    let mut adopted: BTreeMap<String, (RecordedPod, OwnedFd, Found)> = BTreeMap::new();
    for f in found {
        let fd = match File::open(&f.path) {
            Ok(file) => OwnedFd::from(file),
            // The process exited or the mount went away since the scan.
            Err(e) => {
                tracing::debug!(path = %f.path.display(), error = %e, "namespace vanished");
                continue;
            }
        };
        if let Err(e) = ringway_redirect::check_pod_netns(fd.as_fd()) {
            tracing::debug!(path = %f.path.display(), error = %e, "not a pod namespace");
            continue;
        }
        let tag = match ringway_redirect::read_tag(fd.as_fd()) {
            Ok(Some(tag)) => tag,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(path = %f.path.display(), netns.inode = f.inode, error = %e, "owner tag unreadable: the namespace is left as it is");
                report
                    .skipped
                    .push(format!("net:[{}] ({}): {e}", f.inode, f.path.display()));
                continue;
            }
        };
        if !cfg.node_name.is_empty() && tag.node != cfg.node_name {
            tracing::info!(pod.uid = %tag.uid, node = %tag.node, netns.inode = f.inode, "pod tagged for another node: not adopted");
            report.skipped.push(format!(
                "pod {} in net:[{}] is tagged for node {:?}",
                tag.uid, f.inode, tag.node
            ));
            continue;
        }
        let Some(rec) = recorded.get(&tag.uid) else {
            tracing::warn!(pod.uid = %tag.uid, netns.inode = f.inode, "owner tag of a pod the agent has no record of: not adopted");
            report.skipped.push(format!(
                "pod {} in net:[{}] is not in the agent's record",
                tag.uid, f.inode
            ));
            continue;
        };
        if let Some(why) = disagreement(&tag, rec, f.inode) {
            tracing::warn!(pod.uid = %tag.uid, netns.inode = f.inode, reason = %why, "owner tag disagrees with the agent's record: not adopted");
            report.skipped.push(format!(
                "pod {} in net:[{}] disagrees with the agent's record: {why}",
                tag.uid, f.inode
            ));
            continue;
        }
        match adopted.get(&tag.uid) {
            Some((_, _, prev)) if prev.via_process || !f.via_process => {
                tracing::warn!(pod.uid = %tag.uid, kept = prev.inode, other = f.inode, "two namespaces carry the same pod's tag; keeping the first");
                report.skipped.push(format!(
                    "pod {} in net:[{}]: duplicate of net:[{}]",
                    tag.uid, f.inode, prev.inode
                ));
            }
            _ => match canonical_netns(&fd) {
                Ok(fd) => {
                    adopted.insert(tag.uid.clone(), (rec.clone(), fd, f));
                }
                Err(e) => {
                    tracing::warn!(pod.uid = %tag.uid, error = %e, "cannot enter the pod's namespace: not adopted");
                    report.skipped.push(format!(
                        "pod {} in net:[{}]: cannot enter it: {e}",
                        tag.uid, f.inode
                    ));
                }
            },
        }
    }
    let spec = &cfg.capture;
    let mut entries = Vec::new();
    for (uid, (rec, fd, f)) in adopted {
        let pod = pod_from_record(&rec);
        let tag = core.tag(&pod);
        match ringway_redirect::verify_for(fd.as_fd(), spec, &tag) {
            Ok(drift) if drift.is_empty() => {
                tracing::info!(pod.uid = %uid, netns.inode = f.inode, "rediscovered; rules in place");
            }
            Ok(drift) => {
                let drift: Vec<String> = drift.iter().map(|d| d.to_string()).collect();
                match ringway_redirect::apply_for(fd.as_fd(), spec, &tag) {
                    Ok(()) => {
                        tracing::warn!(pod.uid = %uid, netns.inode = f.inode, drift = %drift.join("; "), "rediscovered; rules had drifted and were re-applied");
                        report.reapplied.push(uid.clone());
                    }
                    Err(e) => {
                        tracing::error!(pod.uid = %uid, netns.inode = f.inode, error = %e, "rediscovered; re-applying the drifted rules failed")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(pod.uid = %uid, error = %e, "rediscovered; verifying the rules failed, left as they are")
            }
        }
        report.adopted.push(uid);
        entries.push(Entry {
            pod,
            netns: Some(fd),
            inode: Some(f.inode),
            path: Some(f.path),
            source: PodSource::Rediscovered,
        });
    }
    core.insert_rediscovered(entries);
    report
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
    cfg: &AgentConfig,
    uid: &str,
    ips: &[IpAddr],
) -> Result<(OwnedFd, PathBuf), FindNetnsError> {
    let needles = [uid.to_string(), uid.replace('-', "_")];
    let own = own_inodes();
    let dir = std::fs::read_dir(&cfg.proc_root).map_err(|source| FindNetnsError::ProcRoot {
        proc_root: cfg.proc_root.clone(),
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
            proc_root: cfg.proc_root.clone(),
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
        let path = cfg.proc_root.join(pid.to_string()).join("ns/net");
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

/// Why [`find_pod_netns`] found no namespace for a pod.
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

    #[test]
    fn adversarial_a_tag_that_disagrees_with_the_record_is_refused() {
        let rec = RecordedPod {
            uid: "u".into(),
            name: "n".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
            container_id: None,
            ips: vec!["10.0.0.1".parse().unwrap()],
            netns_inode: Some(7),
        };
        let tag = PodTag {
            uid: "u".into(),
            name: "n".into(),
            namespace: "ns".into(),
            service_account: "sa".into(),
            node: "node".into(),
            container_id: String::new(),
            ips: vec!["10.0.0.1".parse().unwrap()],
        };
        assert_eq!(disagreement(&tag, &rec, 7), None);
        let p = pod_from_record(&rec);
        assert_eq!((p.container_id, p.ips), (None, rec.ips.clone()));
        let e = disagreement(&tag, &rec, 8).unwrap();
        assert_eq!(e, "the agent enrolled it in net:[7]");
        let forged = PodTag {
            namespace: "bank".into(),
            service_account: "admin".into(),
            ..tag.clone()
        };
        let e = disagreement(&forged, &rec, 7).unwrap();
        assert_eq!(
            e,
            "its tag says namespace \"bank\", the agent recorded \"ns\""
        );
        let forged = PodTag {
            service_account: "admin".into(),
            ..tag.clone()
        };
        assert!(disagreement(&forged, &rec, 7)
            .unwrap()
            .contains("service account \"admin\""));
        let forged = PodTag {
            container_id: "c".into(),
            ..tag
        };
        assert!(disagreement(&forged, &rec, 7).is_some());
    }
}
