//! The agent's own record of the pods it enrolled: a file on the node
//! ([`super::AgentConfig::state_file`]), where pods cannot write.
//!
//! The owner tag in a pod's `inet ringway` table is in the pod's own network
//! namespace: a container with CAP_NET_ADMIN rewrites it at will. At restart
//! the agent therefore adopts a namespace only when its tag agrees with this
//! record (same pod UID, namespace, name, service account, sandbox id, IPs,
//! and the namespace inode the pod was enrolled with), and takes the pod's
//! identity from the record, never from the tag alone.
//!
//! The file is a journal of JSON lines: a header (`{"version":2,"node":..}`),
//! then one line per change (`{"put":{..pod..}}` or `{"del":"<uid>"}`), so a
//! CNI ADD appends one line (and `fsync`s it) instead of rewriting every
//! pod. [`RecordWriter`] rewrites the file whole (temp file, fsync, rename: a
//! crash leaves the old or the new file, never half of one) at its first
//! write after start and whenever the journal has grown past twice the pods
//! it holds. A last line without its newline (the agent died while
//! appending it) is ignored when the file is read; any other bad line makes
//! the whole record invalid. Version 1 files (one JSON object) are still
//! read. Mode 0600 in a directory of mode 0700. It belongs under a tmpfs
//! such as `/var/run`: pod namespaces do not survive a reboot, and neither
//! should the record.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The version of the file written by this build (the journal).
pub const RECORD_VERSION: u32 = 2;
/// The single-object format of earlier builds, still read.
const RECORD_VERSION_1: u32 = 1;
/// A journal is rewritten whole once it holds more lines than this plus
/// twice the pods it records.
const COMPACT_SLACK: usize = 64;
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

/// The first line of a journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    version: u32,
    node: String,
}

/// One change, one line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum Change {
    /// The pod is enrolled (or its record changed).
    Put(RecordedPod),
    /// The pod is no longer enrolled.
    Del(String),
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
    /// A record written by the agent of another node (a copied or moved
    /// disk, a node renamed): none of its pods are this node's to adopt.
    #[error("the agent's state file {} is the record of node {recorded:?}, not of this node {this:?}: refused", path.display())]
    OtherNode {
        /// The state file.
        path: PathBuf,
        /// The node it names.
        recorded: String,
        /// This node.
        this: String,
    },
    /// Not a record of this format.
    #[error("the agent's state file {} is not a valid record: {reason}", path.display())]
    Invalid {
        /// The state file.
        path: PathBuf,
        /// What is wrong.
        reason: InvalidRecord,
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

/// What makes a state file not a valid record.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRecord {
    /// A version this build does not read.
    #[error("version {0} (this build reads {RECORD_VERSION_1} and {RECORD_VERSION})")]
    UnknownVersion(u32),
    /// A header line claiming version 1 (which has none).
    #[error("a version 1 record is one JSON object with its pods, not a header line")]
    HeaderOfVersion1,
    /// One JSON object claiming version 2 (a journal).
    #[error("a version 2 record starts with its header alone on the first line")]
    ObjectOfVersion2,
    /// Neither form parses.
    #[error("neither a journal (first line: {header}) nor one JSON object ({object})")]
    Unreadable {
        /// Why the first line is not a header.
        header: serde_json::Error,
        /// Why the whole file is not one object.
        object: serde_json::Error,
    },
    /// A version 1 object that does not parse.
    #[error("{0}")]
    Object(serde_json::Error),
    /// A version 1 pod without a uid.
    #[error("a pod with an empty uid")]
    EmptyUid,
    /// A version 1 pod listed twice.
    #[error("pod {0} is recorded twice")]
    Twice(String),
    /// A journal line that does not parse.
    #[error("line {line}: {error}")]
    Line {
        /// Its number, the header being 1.
        line: usize,
        /// Why.
        error: serde_json::Error,
    },
    /// A journal line recording a pod without a uid.
    #[error("line {0}: a pod with an empty uid")]
    LineEmptyUid(usize),
}

/// The pods recorded in `path` by UID, a record of node `node`; `Ok(None)`
/// when there is no file (a first start). A record of another node is an
/// error: its pods are never adopted here.
pub fn load(path: &Path, node: &str) -> Result<Option<BTreeMap<String, RecordedPod>>, RecordError> {
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
    let invalid = |reason: InvalidRecord| RecordError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let first = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let other_node = |recorded: String| RecordError::OtherNode {
        path: path.to_path_buf(),
        recorded,
        this: node.to_owned(),
    };
    match serde_json::from_slice::<Header>(first) {
        Ok(h) if h.version == RECORD_VERSION && h.node != node => Err(other_node(h.node)),
        Ok(h) if h.version == RECORD_VERSION => parse_journal(&bytes).map(Some).map_err(invalid),
        Ok(h) if h.version == RECORD_VERSION_1 => Err(invalid(InvalidRecord::HeaderOfVersion1)),
        Ok(h) => Err(invalid(InvalidRecord::UnknownVersion(h.version))),
        // Not a journal's header line: one JSON object, as version 1 wrote?
        Err(header) => match serde_json::from_slice::<Versioned>(&bytes) {
            Ok(v) if v.version == RECORD_VERSION_1 => match parse_v1(&bytes).map_err(invalid)? {
                (recorded, _) if recorded != node => Err(other_node(recorded)),
                (_, pods) => Ok(Some(pods)),
            },
            Ok(v) if v.version == RECORD_VERSION => Err(invalid(InvalidRecord::ObjectOfVersion2)),
            Ok(v) => Err(invalid(InvalidRecord::UnknownVersion(v.version))),
            Err(object) => Err(invalid(InvalidRecord::Unreadable { header, object })),
        },
    }
}

/// Only the version of a one-object record.
#[derive(Deserialize)]
struct Versioned {
    version: u32,
}

/// A version 1 record's node and pods.
fn parse_v1(bytes: &[u8]) -> Result<(String, BTreeMap<String, RecordedPod>), InvalidRecord> {
    let file: RecordFile = serde_json::from_slice(bytes).map_err(InvalidRecord::Object)?;
    let mut pods = BTreeMap::new();
    for p in file.pods {
        if p.uid.is_empty() {
            return Err(InvalidRecord::EmptyUid);
        }
        if let Some(dup) = pods.insert(p.uid.clone(), p) {
            return Err(InvalidRecord::Twice(dup.uid));
        }
    }
    Ok((file.node, pods))
}

/// The pods a journal leaves recorded. Its first line is the header.
fn parse_journal(bytes: &[u8]) -> Result<BTreeMap<String, RecordedPod>, InvalidRecord> {
    let complete = bytes.ends_with(b"\n");
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    // After a final newline `split` yields an empty piece; without one, the
    // last piece is a line the agent died writing.
    let (whole, torn) = lines.split_at(lines.len() - 1);
    if !complete && !torn[0].is_empty() && !whole.is_empty() {
        tracing::warn!(
            bytes = torn[0].len(),
            "the agent's record ends in a line cut short (the agent stopped while writing it): ignored"
        );
    }
    let mut pods = BTreeMap::new();
    for (i, line) in whole.iter().enumerate().skip(1) {
        let change: Change = serde_json::from_slice(line)
            .map_err(|error| InvalidRecord::Line { line: i + 1, error })?;
        match change {
            Change::Put(p) if p.uid.is_empty() => return Err(InvalidRecord::LineEmptyUid(i + 1)),
            Change::Put(p) => {
                pods.insert(p.uid.clone(), p);
            }
            Change::Del(uid) => {
                pods.remove(&uid);
            }
        }
    }
    Ok(pods)
}

fn write_error(path: &Path) -> impl Fn(std::io::Error) -> RecordError + '_ {
    move |source| RecordError::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the whole journal for `pods` and returns it opened for appending.
fn store_journal<'a>(
    path: &Path,
    node: &str,
    pods: impl Iterator<Item = &'a RecordedPod>,
) -> Result<std::fs::File, RecordError> {
    let write = write_error(path);
    make_parent(path).map_err(&write)?;
    let mut body = Vec::new();
    let header = Header {
        version: RECORD_VERSION,
        node: node.to_string(),
    };
    line(&mut body, &header).map_err(&write)?;
    for p in pods {
        line(&mut body, &Change::Put(p.clone())).map_err(&write)?;
    }
    replace_file(path, &body).map_err(&write)?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(write)
}

/// Makes `path`'s directory (mode 0700: pods cannot reach in) if need be.
fn make_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir),
        None => Ok(()),
    }
}

/// Replaces `path` with `body` whole: written to `<path>.tmp` (mode 0600),
/// fsynced, renamed over it; a crash leaves the old file or the new one.
fn replace_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
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
        f.write_all(body)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The pods kept at the proxies without a record of them (uid -> the
/// namespace inodes whose tags name it; see `Rediscovery::kept`), beside the
/// record in `<state file>.kept`, so a restart keeps them again (never
/// adopts them).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeptFile {
    version: u32,
    node: String,
    kept: BTreeMap<String, Vec<u64>>,
}

/// `<state file>.kept`.
pub(super) fn kept_path(state_file: &Path) -> PathBuf {
    let mut p = state_file.as_os_str().to_owned();
    p.push(".kept");
    PathBuf::from(p)
}

/// The kept pods written beside `state_file` for this `node` (none when
/// there is no such file; an unreadable one, or another node's, is logged
/// and counts as none).
pub(super) fn load_kept(state_file: &Path, node: &str) -> BTreeMap<String, Vec<u64>> {
    let path = kept_path(state_file);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return BTreeMap::new(),
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "reading the kept pods' file: none kept");
            return BTreeMap::new();
        }
    };
    match serde_json::from_slice::<KeptFile>(&bytes) {
        Ok(k) if k.version == 1 && k.node == node => k.kept,
        Ok(k) => {
            tracing::error!(path = %path.display(), version = k.version, node = %k.node, "the kept pods' file is not this node's (or of an unknown version): none kept");
            BTreeMap::new()
        }
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "the kept pods' file is not valid: none kept");
            BTreeMap::new()
        }
    }
}

/// Writes the kept pods beside `state_file` (temp file, fsync, rename), or
/// removes the file when there are none.
pub(super) fn store_kept(
    state_file: &Path,
    node: &str,
    kept: &BTreeMap<String, Vec<u64>>,
) -> Result<(), RecordError> {
    let path = kept_path(state_file);
    let write = write_error(&path);
    if kept.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(write(e)),
            _ => Ok(()),
        };
    }
    make_parent(&path).map_err(&write)?;
    let body = serde_json::to_vec(&KeptFile {
        version: 1,
        node: node.to_owned(),
        kept: kept.clone(),
    })
    .map_err(|e| write(std::io::Error::other(e)))?;
    replace_file(&path, &body).map_err(write)
}

fn line(out: &mut Vec<u8>, v: &impl Serialize) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, v).map_err(std::io::Error::other)?;
    out.push(b'\n');
    Ok(())
}

/// Keeps the state file in step with the enrolled pods: each
/// [`RecordWriter::sync`] appends the changes since the last one, or
/// rewrites the file whole (the first time, after a failed write, and when
/// the journal has grown past twice the pods it holds).
#[derive(Debug)]
pub struct RecordWriter {
    path: PathBuf,
    node: String,
    /// What the file records (or, after a failed write, should).
    written: BTreeMap<String, RecordedPod>,
    /// The file opened for appending, while its content is known to be
    /// `written`; `None` makes the next sync rewrite it whole.
    append: Option<std::fs::File>,
    /// Lines after the header.
    lines: usize,
}

impl RecordWriter {
    /// A writer of `path`; its first sync rewrites the file whole.
    pub fn new(path: &Path, node: &str) -> RecordWriter {
        RecordWriter {
            path: path.to_path_buf(),
            node: node.to_string(),
            written: BTreeMap::new(),
            append: None,
            lines: 0,
        }
    }

    /// The pods the file records.
    pub fn written(&self) -> &BTreeMap<String, RecordedPod> {
        &self.written
    }

    /// Records `put` (pods new or changed) and drops `del` (UIDs no longer
    /// enrolled). On an error the file is rewritten whole at the next sync.
    pub fn sync(&mut self, put: Vec<RecordedPod>, del: Vec<String>) -> Result<(), RecordError> {
        // `written` takes every change first: whatever fails below, the
        // next sync can rewrite the file whole from it.
        let del: Vec<String> = del
            .into_iter()
            .filter(|uid| self.written.remove(uid).is_some())
            .collect();
        for p in &put {
            self.written.insert(p.uid.clone(), p.clone());
        }
        let changes = del.len() + put.len();
        let mut body = Vec::new();
        let lined = del
            .into_iter()
            .map(Change::Del)
            .chain(put.into_iter().map(Change::Put))
            .try_for_each(|c| line(&mut body, &c));
        if let Err(e) = lined {
            self.append = None;
            return Err(write_error(&self.path)(e));
        }
        let grown = self.lines + changes > 2 * self.written.len() + COMPACT_SLACK;
        match self.append.as_mut() {
            Some(f) if !grown => {
                if body.is_empty() {
                    return Ok(());
                }
                let appended = f.write_all(&body).and_then(|()| f.sync_data());
                match appended {
                    Ok(()) => {
                        self.lines += changes;
                        Ok(())
                    }
                    Err(e) => {
                        self.append = None;
                        Err(write_error(&self.path)(e))
                    }
                }
            }
            _ => {
                self.append = None;
                let f = store_journal(&self.path, &self.node, self.written.values())?;
                self.append = Some(f);
                self.lines = self.written.len();
                Ok(())
            }
        }
    }
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

    use ringway_testbed::TempDir as Dir;

    fn uids(path: &Path) -> Vec<String> {
        load(path, "node1").unwrap().unwrap().into_keys().collect()
    }

    fn lines(path: &Path) -> usize {
        std::fs::read_to_string(path).unwrap().lines().count()
    }

    /// A record the agent of another node wrote (a copied or moved disk, a
    /// renamed node) is refused whole: none of its pods is this node's.
    #[test]
    fn adversarial_a_record_of_another_node_is_refused() {
        let dir = Dir::new("record-other-node");
        let path = dir.join("pods.json");
        let mut w = RecordWriter::new(&path, "node1");
        w.sync(vec![pod("a")], vec![]).unwrap();
        assert_eq!(load(&path, "node1").unwrap().unwrap().len(), 1);
        let e = load(&path, "node2").unwrap_err();
        assert!(
            matches!(&e, RecordError::OtherNode { recorded, this, .. } if recorded == "node1" && this == "node2"),
            "{e}"
        );
        std::fs::write(&path, br#"{"version":1,"node":"node1","pods":[]}"#).unwrap();
        assert!(matches!(
            load(&path, "node2"),
            Err(RecordError::OtherNode { .. })
        ));
    }

    #[test]
    fn round_trip_and_missing_file() {
        let dir = Dir::new("record-rt");
        let path = dir.join("sub/pods.json");
        assert!(load(&path, "node1").unwrap().is_none());
        let mut w = RecordWriter::new(&path, "node1");
        w.sync(vec![pod("a"), pod("b")], vec![]).unwrap();
        let got = load(&path, "node1").unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got["a"], pod("a"));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(path.parent().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode, 0o700);
        w.sync(vec![], vec!["a".into(), "b".into()]).unwrap();
        assert!(load(&path, "node1").unwrap().unwrap().is_empty());
    }

    /// One ADD appends one line; the file is rewritten whole only once the
    /// journal outgrows twice the pods it holds.
    #[test]
    fn changes_are_appended_and_the_journal_is_compacted() {
        let dir = Dir::new("record-journal");
        let path = dir.join("pods.json");
        let mut w = RecordWriter::new(&path, "node1");
        let all: Vec<RecordedPod> = (0..100).map(|i| pod(&format!("p{i}"))).collect();
        w.sync(all.clone(), vec![]).unwrap();
        assert_eq!(lines(&path), 101, "header + one line per pod");
        w.sync(vec![pod("new")], vec![]).unwrap();
        assert_eq!(lines(&path), 102, "one ADD, one appended line");
        let mut moved = pod("p1");
        moved.netns_inode = Some(1);
        w.sync(vec![moved.clone()], vec!["p2".into(), "unknown".into()])
            .unwrap();
        assert_eq!(
            lines(&path),
            104,
            "a changed pod and a removed one; nothing for an unknown uid"
        );
        let got = load(&path, "node1").unwrap().unwrap();
        assert_eq!(got.len(), 100);
        assert_eq!(got["p1"], moved);
        assert!(!got.contains_key("p2") && got.contains_key("new"));
        assert_eq!(&got, w.written());
        // Churn: the file stays bounded by the pods it holds.
        for round in 0..500 {
            let uid = format!("churn{round}");
            w.sync(vec![pod(&uid)], vec![]).unwrap();
            w.sync(vec![], vec![uid]).unwrap();
            assert!(
                lines(&path) <= 1 + 2 * 100 + COMPACT_SLACK + 1,
                "round {round}: {} lines",
                lines(&path)
            );
        }
        assert_eq!(&load(&path, "node1").unwrap().unwrap(), w.written());
    }

    /// A line the agent died writing is ignored; a bad line before the last
    /// makes the record invalid, naming the line.
    #[test]
    fn a_torn_last_line_is_ignored_and_a_bad_one_is_refused() {
        let dir = Dir::new("record-torn");
        let path = dir.join("pods.json");
        let mut w = RecordWriter::new(&path, "node1");
        w.sync(vec![pod("a"), pod("b")], vec![]).unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut torn = good.clone();
        torn.extend_from_slice(br#"{"put":{"uid":"c","namesp"#);
        std::fs::write(&path, &torn).unwrap();
        let got = load(&path, "node1").unwrap().unwrap();
        assert_eq!(got.keys().collect::<Vec<_>>(), ["a", "b"]);
        let mut bad = good.clone();
        bad.extend_from_slice(b"garbage\n{\"del\":\"a\"}\n");
        std::fs::write(&path, &bad).unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("line 4"), "{e}");
        let mut empty_uid = good;
        empty_uid.extend_from_slice(
            br#"{"put":{"uid":"","namespace":"n","name":"p","serviceAccount":"s"}}"#,
        );
        empty_uid.push(b'\n');
        std::fs::write(&path, &empty_uid).unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("line 4: a pod with an empty uid"), "{e}");
        // A writer started afterwards rewrites the file whole first.
        let mut w = RecordWriter::new(&path, "node1");
        w.sync(vec![pod("z")], vec![]).unwrap();
        assert_eq!(uids(&path), ["z"]);
    }

    #[test]
    fn other_versions_and_garbage_are_refused_by_name() {
        let dir = Dir::new("record-versions");
        let path = dir.join("pods.json");
        std::fs::write(&path, b"{\"version\":9,\"node\":\"n\",\"pods\":[]}").unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("version 9 (this build reads 1 and 2)"), "{e}");
        std::fs::write(&path, b"{\"version\":3,\"node\":\"n\"}\n").unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("version 3 (this build reads 1 and 2)"), "{e}");
        std::fs::write(&path, b"{\"version\":1,\"node\":\"n\"}\n").unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("a version 1 record is one JSON object"), "{e}");
        std::fs::write(&path, b"{\"version\":2,\"node\":\"n\",\"pods\":[]}").unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(
            e.contains("a version 2 record starts with its header alone"),
            "{e}"
        );
        std::fs::write(&path, b"{\"version\":2,\"no\n{\"put\":{}}\n").unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("neither a journal (first line: "), "{e}");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(matches!(
            load(&path, "node1"),
            Err(RecordError::Invalid { .. })
        ));
        std::fs::write(&path, vec![b' '; MAX_RECORD_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            load(&path, "node1"),
            Err(RecordError::TooLarge { .. })
        ));
    }

    /// A record written by an earlier build (one JSON object) is still read.
    #[test]
    fn version_1_records_are_read() {
        let dir = Dir::new("record-v1");
        let path = dir.join("pods.json");
        let v1 = serde_json::to_vec_pretty(&RecordFile {
            version: 1,
            node: "node1".into(),
            pods: vec![pod("a"), pod("b")],
        })
        .unwrap();
        std::fs::write(&path, v1).unwrap();
        let got = load(&path, "node1").unwrap().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got["b"], pod("b"));
        std::fs::write(&path, br#"{"version":1,"node":"n","pods":[{"uid":"a","namespace":"n","name":"p","serviceAccount":"s"},{"uid":"a","namespace":"n","name":"p","serviceAccount":"s"}]}"#).unwrap();
        let e = load(&path, "node1").unwrap_err().to_string();
        assert!(e.contains("pod a is recorded twice"), "{e}");
    }

    /// After a failed append, and after a failed rewrite, the next sync
    /// rewrites the file whole with every pod the failed ones were to add.
    #[test]
    fn failed_writes_are_mended_by_the_next_sync() {
        let dir = Dir::new("record-fail");
        let path = dir.join("pods.json");
        let mut w = RecordWriter::new(&path, "node1");
        w.sync(vec![pod("a")], vec![]).unwrap();
        // The append descriptor swapped for a read-only one: the write fails.
        w.append = Some(std::fs::File::open(&path).unwrap());
        let e = w.sync(vec![pod("b")], vec![]).unwrap_err().to_string();
        assert!(e.contains("writing the agent's state file"), "{e}");
        assert_eq!(uids(&path), ["a"]);
        // A directory where the file was: the rewrite cannot rename over it.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let e = w.sync(vec![pod("c")], vec![]).unwrap_err().to_string();
        assert!(e.contains("writing the agent's state file"), "{e}");
        std::fs::remove_dir(&path).unwrap();
        w.sync(vec![], vec![]).unwrap();
        assert_eq!(uids(&path), ["a", "b", "c"]);
        w.sync(vec![pod("d")], vec![]).unwrap();
        assert_eq!(lines(&path), 5, "appending again after the rewrite");
    }

    /// The kept pods' file: written and read back for its node, removed
    /// when nothing is kept; another node's, another version's or a damaged
    /// one keeps nothing (and says why in the log), never a crash.
    #[test]
    fn adversarial_the_kept_pods_file_round_trips_and_bad_ones_keep_nothing() {
        let dir = Dir::new("kept-file");
        let state = dir.join("state/pods.json");
        assert!(load_kept(&state, "node1").is_empty(), "no file");
        let kept = BTreeMap::from([
            ("a".to_string(), vec![4026532001, 4026532002]),
            ("b".to_string(), vec![4026532003]),
        ]);
        store_kept(&state, "node1", &kept).unwrap();
        assert_eq!(load_kept(&state, "node1"), kept);
        assert!(load_kept(&state, "node2").is_empty(), "another node's");
        let mode = std::fs::metadata(kept_path(&state)).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        for junk in [
            &b"{\"version\":2,\"node\":\"node1\",\"kept\":{}}"[..],
            b"{\"version\":1,\"node\":\"node1\",\"kept\":{\"a\":[\"x\"]}}",
            b"\xff\xfe",
            b"",
        ] {
            std::fs::write(kept_path(&state), junk).unwrap();
            assert!(load_kept(&state, "node1").is_empty(), "{junk:?}");
        }
        store_kept(&state, "node1", &BTreeMap::new()).unwrap();
        assert!(!kept_path(&state).exists(), "nothing kept: no file");
        store_kept(&state, "node1", &BTreeMap::new()).unwrap();
    }
}
