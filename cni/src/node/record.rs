//! The agent's own record of the pods it enrolled: a JSON file on the node
//! ([`super::AgentConfig::state_file`]), where pods cannot write.
//!
//! The owner tag in a pod's `inet ringway` table is in the pod's own network
//! namespace: a container with CAP_NET_ADMIN rewrites it at will. At restart
//! the agent therefore adopts a namespace only when its tag agrees with this
//! record (same pod UID, namespace, name, service account, sandbox id, IPs,
//! and the namespace inode the pod was enrolled with), and takes the pod's
//! identity from the record, never from the tag alone.
//!
//! The file is rewritten after every change (temp file, fsync, rename: a
//! crash leaves the old or the new file, never half of one), mode 0600 in a
//! directory of mode 0700. It belongs under a tmpfs such as `/var/run`: pod
//! namespaces do not survive a reboot, and neither should the record.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The version of the file written by this build.
pub const RECORD_VERSION: u32 = 1;
/// The largest state file read (far above any node's pods; a bigger file is
/// refused rather than read).
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// One enrolled pod, as the agent recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedPod {
    /// Pod UID.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Service account.
    pub service_account: String,
    /// The CNI sandbox id, when enrolled through CNI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The pod's IPs.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// Inode of the network namespace the pod was enrolled with (`None` once
    /// the namespace is gone: such a pod is never adopted again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_inode: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RecordFile {
    version: u32,
    node: String,
    pods: Vec<RecordedPod>,
}

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Reading the file failed.
    #[error("reading the agent's state file {}: {source}", path.display())]
    Read {
        /// The state file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_RECORD_BYTES`].
    #[error("the agent's state file {} is larger than {MAX_RECORD_BYTES} bytes: refused", path.display())]
    TooLarge {
        /// The state file.
        path: PathBuf,
    },
    /// Not a record of this format.
    #[error("the agent's state file {} is not a valid record: {reason}", path.display())]
    Invalid {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Writing the file failed.
    #[error("writing the agent's state file {}: {source}", path.display())]
    Write {
        /// The state file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// The pods recorded in `path` by UID; `Ok(None)` when there is no file (a
/// first start).
pub fn load(path: &Path) -> Result<Option<BTreeMap<String, RecordedPod>>, RecordError> {
    let read = |source| RecordError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    let invalid = |reason: String| RecordError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let file: RecordFile = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if file.version != RECORD_VERSION {
        return Err(invalid(format!(
            "version {} (this build reads {RECORD_VERSION})",
            file.version
        )));
    }
    let mut pods = BTreeMap::new();
    for p in file.pods {
        if p.uid.is_empty() {
            return Err(invalid("a pod with an empty uid".into()));
        }
        if let Some(dup) = pods.insert(p.uid.clone(), p) {
            return Err(invalid(format!("pod {} is recorded twice", dup.uid)));
        }
    }
    Ok(Some(pods))
}

/// Replaces the record in `path` with `pods` (temp file + fsync + rename).
pub fn store(path: &Path, node: &str, pods: Vec<RecordedPod>) -> Result<(), RecordError> {
    let write = |source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(write)?;
    }
    let body = serde_json::to_vec_pretty(&RecordFile {
        version: RECORD_VERSION,
        node: node.to_string(),
        pods,
    })
    .map_err(|e| write(std::io::Error::other(e)))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(write(e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> RecordedPod {
        RecordedPod {
            uid: uid.into(),
            namespace: "shop".into(),
            name: "web".into(),
            service_account: "web".into(),
            container_id: Some("c1".into()),
            ips: vec!["10.0.0.2".parse().unwrap()],
            netns_inode: Some(4026532000),
        }
    }

    #[test]
    fn round_trip_and_missing_file() {
        let dir = std::env::temp_dir().join(format!("ringway-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/pods.json");
        assert!(load(&path).unwrap().is_none());
        store(&path, "node1", vec![pod("a"), pod("b")]).unwrap();
        let got = load(&path).unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got["a"], pod("a"));
        store(&path, "node1", vec![]).unwrap();
        assert!(load(&path).unwrap().unwrap().is_empty());
        std::fs::write(&path, b"{\"version\":9,\"node\":\"n\",\"pods\":[]}").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("version 9 (this build reads 1)"), "{e}");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(load(&path), Err(RecordError::Invalid { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
