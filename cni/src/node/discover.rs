//! Rediscovery at start, above the namespace scans and the record: the
//! pods whose owner tags in the kernel agree with the agent's record (see the
//! module docs of [`super`], "Restart"). It returns what it found
//! ([`Rediscovered`]); the owner of the state adopts it.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;

use ringway_redirect::PodTag;

use super::config::AgentConfig;
use super::netns;
use super::pod::{Pod, Rediscovery};
use super::record::{self, RecordedPod};
use super::table::Kept;

/// A pod found at start, its namespace pinned.
#[derive(Debug)]
pub(super) struct Adopted {
    /// The pod, as the record has it.
    pub(super) pod: Pod,
    /// Its namespace, in the canonical form handed to proxies.
    pub(super) netns: OwnedFd,
    /// The namespace's inode.
    pub(super) inode: u64,
    /// The path it was found by.
    pub(super) path: PathBuf,
}

/// What [`rediscover`] found: the report, and the pods to adopt.
#[derive(Debug)]
pub(super) struct Rediscovered {
    /// What was examined, adopted, re-applied, skipped.
    pub(super) report: Rediscovery,
    /// The pods to adopt.
    pub(super) pods: Vec<Adopted>,
    /// The pods to `Keep` only (see [`Rediscovery::kept`]).
    pub(super) keep: BTreeMap<String, Vec<Kept>>,
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

/// Finds the enrolled pods in the owner tags in the kernel that agree with
/// the agent's record (see the module docs of [`super`], "Restart"). Verifies
/// each pod's rules and re-applies them only on drift; never removes any.
/// The owner of the state adopts what it returns.
pub(super) fn rediscover(cfg: &AgentConfig) -> Rediscovered {
    // Whether the record can say which pods were enrolled: without it, the
    // pods this node's tags name are kept at the proxies, never adopted.
    let (recorded, usable) = match cfg
        .state_file
        .as_deref()
        .map(|p| record::load(p, &cfg.node_name))
    {
        None => {
            tracing::info!("no state file configured: no pod is adopted at start");
            (BTreeMap::new(), false)
        }
        Some(Ok(Some(pods))) => (pods, true),
        Some(Ok(None)) => {
            tracing::info!("no state file yet: no pod to adopt");
            (BTreeMap::new(), false)
        }
        Some(Err(e)) => {
            tracing::error!(error = %e, "the agent's record is unreadable: no pod is adopted (their rules stay in place; the proxies keep the pods this node's tags name)");
            (BTreeMap::new(), false)
        }
    };
    // Pods kept before this start (a record unusable at an earlier start):
    // kept again, in the namespaces they were kept in.
    let kept_before = match (usable, cfg.state_file.as_deref()) {
        (true, Some(p)) => record::load_kept(p, &cfg.node_name),
        _ => BTreeMap::new(),
    };
    let mut keep: BTreeMap<String, Vec<Kept>> = BTreeMap::new();
    let found = netns::scan(&cfg.proc_root, &cfg.netns_dirs);
    let mut report = Rediscovery {
        namespaces: found.len(),
        ..Rediscovery::default()
    };
    let mut adopted: BTreeMap<String, (RecordedPod, OwnedFd, netns::Found)> = BTreeMap::new();
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
            let kept = kept_before
                .get(&tag.uid)
                .is_some_and(|inodes| inodes.contains(&f.inode));
            if !usable || kept {
                tracing::warn!(pod.uid = %tag.uid, netns.inode = f.inode, "owner tag of this node, no record of the pod: not adopted; the proxies keep the pod");
                keep.entry(tag.uid.clone()).or_default().push(Kept {
                    inode: f.inode,
                    netns: fd,
                });
                continue;
            }
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
            _ => match netns::canonical_netns(&fd) {
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
    let mut pods = Vec::new();
    for (uid, (rec, fd, f)) in adopted {
        let pod = pod_from_record(&rec);
        let tag = pod.owner_tag(&cfg.node_name);
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
        pods.push(Adopted {
            pod,
            netns: fd,
            inode: f.inode,
            path: f.path,
        });
    }
    report.kept = keep.keys().cloned().collect();
    Rediscovered { report, pods, keep }
}

#[cfg(test)]
mod tests {
    use super::*;

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
