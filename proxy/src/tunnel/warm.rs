//! An upgrade's warm-up of outbound tunnels: a proxy keeps a small record
//! of the tunnels it holds (pool keys: source address and identity, the
//! peer's tunnel address and identity; no secret) in its state directory,
//! and the proxy that replaces it reads that record before it reports
//! ready and dials the same tunnels on every worker, so the first
//! connections after the switch find them open instead of each worker
//! paying a TCP connect and a TLS handshake per peer.
//!
//! The record ([`RECORD_FILE`]) is untrusted input: bounded in size and in
//! entries, every field validated, and an entry is dialled only when the
//! mesh in force plans exactly that tunnel for a pod this proxy serves
//! (the same source and peer identities): the file can only select among
//! tunnels the proxy would dial anyway, and the peer still has to prove its
//! identity in TLS as usual. A refused record is one log line and changes
//! nothing. Written on change (checked every second, so at most once a
//! second), through a temporary file renamed over the record, and no more
//! once the proxy drains (the record keeps the tunnels it held before).

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringway_hbone::{Pool, PoolKey};
use serde::{Deserialize, Serialize};

use super::outbound::{outbound_plan, warm_outbound, ConnCtx, OutboundPlan};
use crate::in_force::InForce;
use crate::pod::PodShared;
use crate::policy::pod_identity;

/// The record's file name in the state directory.
pub const RECORD_FILE: &str = "tunnels.json";

/// The record's largest size read (a few hundred entries fit).
pub const MAX_RECORD_BYTES: u64 = 64 * 1024;

/// The most entries a record may hold (and a proxy writes).
pub const MAX_ENTRIES: usize = 256;

/// The longest identity accepted (a SPIFFE id is far shorter).
const MAX_IDENTITY: usize = 512;

/// The record's format version.
const VERSION: u32 = 1;

/// Why a record was refused or could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The record could not be read (a missing one is no error: see
    /// [`read_record`]).
    #[error("cannot read the tunnel record {path}: {source}")]
    Read {
        /// The record.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Larger than [`MAX_RECORD_BYTES`].
    #[error("the tunnel record {path} is over {max} bytes")]
    TooLarge {
        /// The record.
        path: PathBuf,
        /// The limit.
        max: u64,
    },
    /// Not the record's JSON.
    #[error("the tunnel record {path} is malformed: {source}")]
    Malformed {
        /// The record.
        path: PathBuf,
        /// What the parser said.
        source: serde_json::Error,
    },
    /// Another format version.
    #[error("the tunnel record {path} has version {found}, this proxy reads {VERSION}")]
    Version {
        /// The record.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// More than [`MAX_ENTRIES`] entries.
    #[error("the tunnel record {path} has {count} entries, at most {MAX_ENTRIES} are read")]
    TooMany {
        /// The record.
        path: PathBuf,
        /// How many it has.
        count: usize,
    },
    /// An entry fails validation.
    #[error("the tunnel record {path}: entry {index}: {why}")]
    BadEntry {
        /// The record.
        path: PathBuf,
        /// The entry's index.
        index: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The record could not be written.
    #[error("cannot write the tunnel record {path}: {source}")]
    Write {
        /// The record.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One tunnel of the record: a pool key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelEntry {
    /// The source pod's address the tunnel is dialled from.
    pub src_ip: IpAddr,
    /// The identity the source presents.
    pub src_identity: String,
    /// The peer's tunnel address (`ip:15008`).
    pub dst: SocketAddr,
    /// The identity the peer must present.
    pub dst_identity: String,
}

impl From<&PoolKey> for TunnelEntry {
    fn from(k: &PoolKey) -> Self {
        TunnelEntry {
            src_ip: k.src_ip,
            src_identity: k.src_identity.clone(),
            dst: k.dst,
            dst_identity: k.dst_identity.clone(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    version: u32,
    tunnels: Vec<TunnelEntry>,
}

fn valid_identity(id: &str) -> bool {
    id.len() <= MAX_IDENTITY
        && id.starts_with("spiffe://")
        && id.bytes().all(|b| b.is_ascii_graphic())
}

fn check_entry(e: &TunnelEntry) -> Result<(), &'static str> {
    if !valid_identity(&e.src_identity) {
        return Err("the source identity is not a SPIFFE id");
    }
    if !valid_identity(&e.dst_identity) {
        return Err("the peer identity is not a SPIFFE id");
    }
    if e.dst.port() != ringway_hbone::HBONE_PORT {
        return Err("the peer address is not a tunnel port");
    }
    let unusable = |ip: IpAddr| ip.is_unspecified() || ip.is_multicast();
    if unusable(e.src_ip) || unusable(e.dst.ip()) {
        return Err("an address is unspecified or multicast");
    }
    Ok(())
}

/// Reads and validates the record at `path`: `Ok(None)` when there is none.
pub fn read_record(path: &Path) -> Result<Option<Vec<TunnelEntry>>, WarmError> {
    let read_err = |source| WarmError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_err(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(WarmError::TooLarge {
            path: path.to_path_buf(),
            max: MAX_RECORD_BYTES,
        });
    }
    let record: Record = serde_json::from_slice(&bytes).map_err(|source| WarmError::Malformed {
        path: path.to_path_buf(),
        source,
    })?;
    if record.version != VERSION {
        return Err(WarmError::Version {
            path: path.to_path_buf(),
            found: record.version,
        });
    }
    if record.tunnels.len() > MAX_ENTRIES {
        return Err(WarmError::TooMany {
            path: path.to_path_buf(),
            count: record.tunnels.len(),
        });
    }
    for (index, e) in record.tunnels.iter().enumerate() {
        check_entry(e).map_err(|why| WarmError::BadEntry {
            path: path.to_path_buf(),
            index,
            why,
        })?;
    }
    Ok(Some(record.tunnels))
}

/// Writes `entries` (at most [`MAX_ENTRIES`] of them) as the record at
/// `path`: a temporary file beside it, renamed over it.
pub fn write_record(path: &Path, entries: &[TunnelEntry]) -> Result<(), WarmError> {
    let write_err = |source| WarmError::Write {
        path: path.to_path_buf(),
        source,
    };
    let record = Record {
        version: VERSION,
        tunnels: entries.iter().take(MAX_ENTRIES).cloned().collect(),
    };
    let bytes = serde_json::to_vec(&record).map_err(|e| write_err(std::io::Error::other(e)))?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_data()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(write_err)
}

/// The record of the keys of `pools` (deduplicated, sorted, bounded).
pub fn entries_of(pools: &[Pool]) -> Vec<TunnelEntry> {
    let set: BTreeSet<TunnelEntry> = pools
        .iter()
        .flat_map(|p| p.keys())
        .map(|k| TunnelEntry::from(&k))
        .collect();
    set.into_iter().take(MAX_ENTRIES).collect()
}

/// A tunnel to dial: the pod it leaves from and the plan the mesh made.
#[derive(Debug, Clone)]
pub struct WarmTarget {
    /// The source pod.
    pub pod: Arc<PodShared>,
    /// The tunnel as the mesh in force plans it.
    pub plan: Arc<OutboundPlan>,
    /// The peer is a pod of this proxy's: its tunnel port is shared with
    /// the proxy being replaced until that one drains.
    pub same_node: bool,
}

/// The entries of `record` the mesh in force plans exactly so for a pod of
/// `pods` (the same source and peer identities), as targets; the others
/// (pods gone, mesh changed) are counted in the second value.
pub fn targets(
    record: &[TunnelEntry],
    pods: &[Arc<PodShared>],
    in_force: &InForce,
) -> (Vec<WarmTarget>, usize) {
    let mut out = Vec::new();
    let mut stale = 0;
    for e in record {
        let Some(pod) = pods.iter().find(|p| p.ips.contains(&e.src_ip)) else {
            stale += 1;
            continue;
        };
        match outbound_plan(in_force, pod, e.dst) {
            Some(plan)
                if plan.src_identity.to_string() == e.src_identity
                    && plan.dst_identity.to_string() == e.dst_identity =>
            {
                out.push(WarmTarget {
                    pod: pod.clone(),
                    plan: Arc::new(plan),
                    same_node: pods.iter().any(|p| p.ips.contains(&e.dst.ip())),
                });
            }
            _ => stale += 1,
        }
    }
    (out, stale)
}

/// What one worker's warm-up did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WarmReport {
    /// Connections dialled.
    pub dialled: usize,
    /// Targets already pooled (live traffic dialled them first).
    pub pooled: usize,
    /// Dials that failed or ran out of time.
    pub failed: usize,
}

impl std::ops::AddAssign for WarmReport {
    fn add_assign(&mut self, o: Self) {
        self.dialled += o.dialled;
        self.pooled += o.pooled;
        self.failed += o.failed;
    }
}

/// Dials every target into `pool` (a worker's), one after another (from
/// the worker's own starting point), until `deadline`; a failure is a
/// debug line and the next target is tried.
///
/// A same-node target's dial may reach the proxy being replaced (both
/// listen on the peer pod's tunnel port until it drains, and then sends
/// GOAWAY): up to [`SAME_NODE_DIALS`] dials are made (even when one is
/// pooled: a connection's own dial may have gone there) until one is
/// served by this proxy; the others stay pooled and carry streams until
/// then.
pub async fn dial_all(
    cx: &ConnCtx<'_>,
    pool: &Pool,
    targets: &[WarmTarget],
    deadline: Instant,
) -> WarmReport {
    let mut r = WarmReport::default();
    // Each worker starts at another target: the workers' dials to one
    // target do not all wait for the same places at once
    // (`TunnelState::dial_slot`).
    let start = cx.worker % targets.len().max(1);
    for t in targets[start..].iter().chain(&targets[..start]) {
        for attempt in 0..SAME_NODE_DIALS {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                r.failed += 1;
                break;
            };
            // A same-node tunnel already pooled (a connection came first)
            // may have reached the other proxy: dial one to check anyway.
            let extra = attempt > 0 || t.same_node;
            let dial = warm_outbound(cx, pool, &t.pod, &t.plan, extra);
            let local = match tokio::time::timeout(left, dial).await {
                Ok(Ok(Some(local))) => {
                    r.dialled += 1;
                    local
                }
                Ok(Ok(None)) => {
                    r.pooled += 1;
                    break;
                }
                Ok(Err(e)) => {
                    r.failed += 1;
                    tracing::debug!(worker = cx.worker, dst.addr = %t.plan.dst, error = %e, "warm-up dial failed");
                    break;
                }
                Err(_) => {
                    r.failed += 1;
                    break;
                }
            };
            if !t.same_node || served_here(cx, local, deadline).await {
                break;
            }
            tracing::debug!(worker = cx.worker, dst.addr = %t.plan.dst, "warm-up dial reached the other proxy; dialling again");
        }
    }
    r
}

/// Dials per same-node target at most, until one reaches this proxy.
pub const SAME_NODE_DIALS: usize = 6;

/// Whether this proxy's server end took the dial from `local`, waiting a
/// little for it (its handshake ends just after the client's).
async fn served_here(cx: &ConnCtx<'_>, local: SocketAddr, deadline: Instant) -> bool {
    let until = deadline.min(Instant::now() + Duration::from_millis(25));
    loop {
        if cx.tunnel.served_here(local) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The warm-up of a proxy serving `pods`: their server TLS configs made,
/// then the tunnels of the record at `path` that the mesh in force still
/// plans, handed to every worker by `dispatch` (which returns where each
/// worker replies), waited for at most `budget`. A refused record is a
/// warning and dials nothing. Logs what it did and how long each part took.
pub fn warm_up(
    path: &Path,
    pods: &[Arc<PodShared>],
    in_force: &InForce,
    budget: Duration,
    dispatch: impl FnOnce(Arc<Vec<WarmTarget>>, Instant) -> Vec<std::sync::mpsc::Receiver<WarmReport>>,
) -> WarmReport {
    let t0 = Instant::now();
    if let Some((ids, mesh)) = in_force.enabled() {
        for id in pods.iter().filter_map(|p| pod_identity(&mesh, p)) {
            if let Err(e) = ids.server_config(&id) {
                tracing::warn!(identity = %id, error = %e, "warm-up: no server TLS config");
            }
        }
    }
    let certs = t0.elapsed();
    let record = match read_record(path) {
        Ok(r) => r.unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "tunnel record refused: no tunnel warmed");
            Vec::new()
        }
    };
    let (targets, stale) = targets(&record, pods, in_force);
    let mut report = WarmReport::default();
    if !targets.is_empty() {
        let deadline = t0 + budget;
        let n = targets.len();
        for rx in dispatch(Arc::new(targets), deadline) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left + Duration::from_millis(100)) {
                Ok(r) => report += r,
                Err(_) => report.failed += n,
            }
        }
    }
    tracing::info!(
        record = %path.display(),
        tunnels = record.len(),
        stale,
        dialled = report.dialled,
        pooled = report.pooled,
        failed = report.failed,
        certs_ms = certs.as_secs_f64() * 1e3,
        took_ms = t0.elapsed().as_secs_f64() * 1e3,
        "warm-up done"
    );
    report
}

/// The longest an upgrade's warm-up delays readiness.
pub const WARM_UP_BUDGET: Duration = Duration::from_secs(1);

/// How often the record is brought up to date (at most one write each).
pub const RECORD_EVERY: Duration = Duration::from_secs(1);

/// The thread (`ringway-record`) keeping the record up to date: every
/// [`RECORD_EVERY`] it takes the pools' keys and writes them when they
/// changed, once armed (after this proxy's own warm-up read the record it
/// found) and until stopped (the drain) or dropped.
#[derive(Debug)]
pub struct Recorder {
    shared: Arc<RecorderShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct RecorderShared {
    /// Stopped (no more writes), under the lock the thread waits on.
    stopped: std::sync::Mutex<bool>,
    wake: std::sync::Condvar,
    armed: std::sync::atomic::AtomicBool,
}

impl Recorder {
    /// Starts the thread for the record at `path` of the keys of `pools`.
    pub fn start(path: PathBuf, pools: Vec<Pool>) -> std::io::Result<Recorder> {
        use std::sync::atomic::Ordering;
        let shared = Arc::new(RecorderShared::default());
        let me = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ringway-record".into())
            .spawn(move || {
                let mut last: Option<Vec<TunnelEntry>> = None;
                loop {
                    {
                        let stopped = me.stopped.lock().unwrap_or_else(|p| p.into_inner());
                        let (stopped, _) = me
                            .wake
                            .wait_timeout_while(stopped, RECORD_EVERY, |s| !*s)
                            .unwrap_or_else(|p| p.into_inner());
                        if *stopped {
                            return;
                        }
                    }
                    if !me.armed.load(Ordering::SeqCst) {
                        continue;
                    }
                    let now = entries_of(&pools);
                    if last.as_ref() == Some(&now) {
                        continue;
                    }
                    match write_record(&path, &now) {
                        Ok(()) => tracing::debug!(tunnels = now.len(), "tunnel record written"),
                        Err(e) => tracing::warn!(error = %e, "tunnel record not written"),
                    }
                    last = Some(now);
                }
            })?;
        Ok(Recorder {
            shared,
            thread: Some(thread),
        })
    }

    /// Writes from now on.
    pub fn arm(&self) {
        self.shared
            .armed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether it writes (the warm-up has run).
    pub fn armed(&self) -> bool {
        self.shared.armed.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// No more writes (the record keeps what it holds).
    pub fn stop(&self) {
        *self
            .shared
            .stopped
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = true;
        self.shared.wake.notify_all();
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dst: &str) -> TunnelEntry {
        TunnelEntry {
            src_ip: "10.0.0.2".parse().unwrap(),
            src_identity: "spiffe://cluster.local/ns/a/sa/a".into(),
            dst: dst.parse().unwrap(),
            dst_identity: "spiffe://cluster.local/ns/b/sa/b".into(),
        }
    }

    /// A private scratch directory (removed on drop) and the record's path in it.
    fn scratch(name: &str) -> (ringway_testbed::TempDir, PathBuf) {
        let d = ringway_testbed::TempDir::new(&format!("warm-{name}"));
        let path = d.join(RECORD_FILE);
        (d, path)
    }

    #[test]
    fn a_written_record_reads_back_and_a_missing_one_is_none() {
        let (_dir, path) = scratch("roundtrip");
        assert!(read_record(&path).unwrap().is_none());
        let v = vec![entry("10.0.0.3:15008"), entry("[fd00::3]:15008")];
        write_record(&path, &v).unwrap();
        assert_eq!(read_record(&path).unwrap(), Some(v));
    }

    #[test]
    fn bad_records_are_refused_with_their_reason() {
        let (_dir, path) = scratch("bad");
        let good = serde_json::to_string(&entry("10.0.0.3:15008")).unwrap();
        let many = vec![good.as_str(); MAX_ENTRIES + 1].join(",");
        let cases: Vec<(String, &str)> = vec![
            (format!(r#"{{"version":1,"tunnels":[{good}"#), "malformed"),
            (
                format!(r#"{{"version":1,"tunnels":[{good}],"x":1}}"#),
                "malformed",
            ),
            (
                format!(r#"{{"version":2,"tunnels":[{good}]}}"#),
                "version 2",
            ),
            (
                format!(r#"{{"version":1,"tunnels":[{many}]}}"#),
                "257 entries",
            ),
            (
                format!(r#"{{"version":1,"tunnels":[]}}{}"#, " ".repeat(70_000)),
                "is over 65536 bytes",
            ),
            (
                format!(
                    r#"{{"version":1,"tunnels":[{good},{}]}}"#,
                    good.replace("10.0.0.3:15008", "10.0.0.3:80")
                ),
                "entry 1: the peer address is not a tunnel port",
            ),
            (
                format!(
                    r#"{{"version":1,"tunnels":[{}]}}"#,
                    good.replace("spiffe://cluster.local/ns/b/sa/b", "https://x")
                ),
                "entry 0: the peer identity is not a SPIFFE id",
            ),
            (
                format!(
                    r#"{{"version":1,"tunnels":[{}]}}"#,
                    good.replace("10.0.0.2", "0.0.0.0")
                ),
                "entry 0: an address is unspecified",
            ),
        ];
        for (text, why) in cases {
            std::fs::write(&path, &text).unwrap();
            let e = read_record(&path).expect_err(why).to_string();
            assert!(e.contains(why), "{why}: {e}");
        }
    }
}
