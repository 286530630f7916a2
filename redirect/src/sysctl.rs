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

/// `net.netfilter.nf_conntrack_tcp_timeout_time_wait` (per namespace,
/// default 120 s; IPv4 and IPv6). The capture's `ct` rules make the pod's
/// namespace track every TCP connection, and a closed connection's entry
/// waits this long. The table's size is node-wide (`nf_conntrack_max`,
/// which a pod cannot change), so at 120 s a pod opening or accepting
/// about 2,000 connections a second through the proxy fills it and its new
/// SYNs are dropped. Capped at [`CONNTRACK_TIME_WAIT_CAP_S`].
pub(crate) const CT_TIME_WAIT: &str = "net.netfilter.nf_conntrack_tcp_timeout_time_wait";
const CT_TIME_WAIT_PATH: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_time_wait";

/// The longest a closed connection's conntrack entry waits in a captured
/// pod, in seconds (a lower value already set is kept). The entry only has
/// to outlive the closing handshake's late segments: a peer whose final
/// ACK from us was lost resends its FIN, about five times within 30 s
/// (backoff from 200 ms), and the sockets keep their own `TIME_WAIT` (60 s). At 30 s a pod's table holds 4x the
/// connection rate it held at the kernel's 120 s.
pub const CONNTRACK_TIME_WAIT_CAP_S: u64 = 30;

/// The sysctl's value in the calling thread's namespace; `None` when the
/// kernel does not have it.
fn read(path: &str, key: &str) -> Result<Option<String>, RedirectError> {
    match std::fs::read_to_string(path) {
        Ok(v) => Ok(Some(v.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(RedirectError::io(format!("reading sysctl {key}"), e)),
    }
}

fn write(path: &str, key: &str, value: &str) -> Result<(), RedirectError> {
    std::fs::write(path, value)
        .map_err(|e| RedirectError::io(format!("setting sysctl {key}={value}"), e))
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
        Some(_) => write(MIGRATE_REQ_PATH, MIGRATE_REQ, "1"),
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

/// Whether a value read from the conntrack sysctl is within the cap.
fn within_cap(v: &str) -> bool {
    v.parse::<u64>()
        .is_ok_and(|s| s <= CONNTRACK_TIME_WAIT_CAP_S)
}

/// Caps `nf_conntrack_tcp_timeout_time_wait` at
/// [`CONNTRACK_TIME_WAIT_CAP_S`] (a lower value stays). Returns whether the
/// sysctl exists: it appears with conntrack, which a modular kernel may
/// load only for the capture's own rules (the caller then tries again).
pub(crate) fn cap_conntrack_time_wait() -> Result<bool, RedirectError> {
    match read(CT_TIME_WAIT_PATH, CT_TIME_WAIT)? {
        None => Ok(false),
        Some(v) if within_cap(&v) => Ok(true),
        Some(_) => write(
            CT_TIME_WAIT_PATH,
            CT_TIME_WAIT,
            &CONNTRACK_TIME_WAIT_CAP_S.to_string(),
        )
        .map(|()| true),
    }
}

/// A drift when the sysctl exists and is above the cap.
pub(crate) fn conntrack_time_wait_drift() -> Result<Option<Drift>, RedirectError> {
    Ok(match read(CT_TIME_WAIT_PATH, CT_TIME_WAIT)? {
        Some(v) if !within_cap(&v) => Some(Drift::SysctlDiffers {
            key: CT_TIME_WAIT.to_string(),
            want: format!("at most {CONNTRACK_TIME_WAIT_CAP_S}"),
            found: v,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_lower_values_and_refuses_higher_or_unreadable_ones() {
        assert!(within_cap("30"));
        assert!(within_cap("1"));
        assert!(within_cap("0"));
        assert!(!within_cap("31"));
        assert!(!within_cap("120"));
        assert!(!within_cap(""));
        assert!(!within_cap("-1"));
        assert!(!within_cap("thirty"));
    }
}
