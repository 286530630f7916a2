//! What the proxy reads of a pod's network namespace before serving it:
//! that it is one (and not the host's: [`check_pod_netns`]), the addresses
//! it holds, and whether IPv6 is on; and addresses in canonical form.

use std::io;
use std::net::IpAddr;
use std::os::fd::BorrowedFd;

use crate::error::ProxyError;

/// Addresses in canonical form (IPv4-mapped IPv6 as IPv4), deduplicated.
pub(crate) fn canonical(addresses: &[IpAddr]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(addresses.len());
    for ip in addresses.iter().map(|ip| ip.to_canonical()) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// The calling thread's netns addresses, loopback and link-local excluded,
/// and nothing on a loopback interface (a pod's address is never there).
pub(crate) fn pod_addresses() -> Vec<IpAddr> {
    let mut ips = Vec::new();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for a in addrs {
            if a.flags
                .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK)
            {
                continue;
            }
            let Some(sa) = a.address else { continue };
            let ip = if let Some(v4) = sa.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else if let Some(v6) = sa.as_sockaddr_in6() {
                IpAddr::V6(v6.ip())
            } else {
                continue;
            };
            let link_local = matches!(ip, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80);
            if !ip.is_loopback() && !link_local && !ips.contains(&ip) {
                ips.push(ip);
            }
        }
    }
    ips
}

pub(crate) fn ipv6_available() -> bool {
    std::fs::read_to_string("/proc/sys/net/ipv6/conf/all/disable_ipv6")
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

/// Refuses anything but a pod's network namespace: a non-netns fd, and the
/// host's (PID 1's, this process's, the calling thread's). Accepts fds opened
/// through a bind mount (`/var/run/netns/cni-...`), as runtimes pass them.
pub fn check_pod_netns(uid: &str, fd: BorrowedFd<'_>) -> Result<(), ProxyError> {
    use ringway_redirect::RedirectError;
    match ringway_redirect::check_pod_netns(fd) {
        Ok(()) => Ok(()),
        Err(RedirectError::NotANetns { found, .. }) => Err(ProxyError::NotANetns {
            uid: uid.to_string(),
            what: found,
        }),
        Err(RedirectError::HostNetns { .. }) => Err(ProxyError::HostNetns {
            uid: uid.to_string(),
        }),
        Err(e) => Err(ProxyError::EnterNetns {
            uid: uid.to_string(),
            source: io::Error::other(e.to_string()),
        }),
    }
}
