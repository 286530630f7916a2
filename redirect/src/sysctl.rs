//! Per-namespace sysctls the capture needs, read and written through
//! `/proc/sys/net`, which resolves to the network namespace of the calling
//! *thread* (the netns worker thread of [`crate::netns`]).

use crate::drift::Drift;
use crate::error::RedirectError;

/// `net.ipv4.tcp_migrate_req` (kernel 5.14+, per namespace, default 0; it
/// covers IPv6 sockets too). With 1, when a `SO_REUSEPORT` listener closes,
/// the connections queued on it (handshake done or in progress) move to
/// another listener of the same group instead of being reset: an old proxy
/// closing its listeners during an upgrade hands its queue to the new one.
pub(crate) const MIGRATE_REQ: &str = "net.ipv4.tcp_migrate_req";
const MIGRATE_REQ_PATH: &str = "/proc/sys/net/ipv4/tcp_migrate_req";

/// The sysctl's value in the calling thread's namespace; `None` when the
/// kernel does not have it.
fn read(path: &str, key: &str) -> Result<Option<String>, RedirectError> {
    match std::fs::read_to_string(path) {
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RedirectError::io(format!("reading sysctl {key}"), e)),
    }
}

/// Sets `net.ipv4.tcp_migrate_req=1` unless it already is; logs and carries
/// on when the kernel lacks it.
pub(crate) fn enable_migrate_req() -> Result<(), RedirectError> {
    match read(MIGRATE_REQ_PATH, MIGRATE_REQ)? {
        None => {
            tracing::info!(
                sysctl = MIGRATE_REQ,
                "the kernel has no {MIGRATE_REQ} (needs 5.14+): queued connections are \
                 reset, not migrated, when a proxy closes its listeners"
            );
            Ok(())
        }
        Some(v) if v == "1" => Ok(()),
        Some(_) => std::fs::write(MIGRATE_REQ_PATH, "1")
            .map_err(|e| RedirectError::io(format!("setting sysctl {MIGRATE_REQ}=1"), e)),
    }
}

/// A drift when the sysctl exists and is not 1.
pub(crate) fn migrate_req_drift() -> Result<Option<Drift>, RedirectError> {
    Ok(match read(MIGRATE_REQ_PATH, MIGRATE_REQ)? {
        Some(v) if v != "1" => Some(Drift::SysctlDiffers {
            key: MIGRATE_REQ.to_string(),
            want: "1".to_string(),
            found: v,
        }),
        _ => None,
    })
}
