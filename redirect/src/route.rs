//! Policy routing over rtnetlink: `lo` up, `ip rule fwmark <capture>/<mask>
//! lookup <table>` and `ip route add local default dev lo table <table>`,
//! for IPv4 and IPv6.

use nix::errno::Errno;

use crate::abi::*;
use crate::error::RedirectError;
use crate::nl::{self, Attrs, DecodeError, Msg, RxMsg};
use crate::socket::{NlError, NlSocket};
use crate::spec::CaptureSpec;

/// An address family of the policy routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    V4,
    V6,
}

impl Family {
    pub(crate) fn af(self) -> u8 {
        match self {
            Family::V4 => AF_INET,
            Family::V6 => AF_INET6,
        }
    }
    pub(crate) fn label(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
    pub(crate) fn any(self) -> &'static str {
        match self {
            Family::V4 => "0.0.0.0/0",
            Family::V6 => "::/0",
        }
    }
}

/// The ip rule, as `ip rule` prints it (without the priority).
pub(crate) fn rule_desc(s: &CaptureSpec) -> String {
    format!(
        "ip rule fwmark {:#x}/{:#x} lookup {}",
        s.capture_mark, s.mark_mask, s.route_table
    )
}

/// The local route, as `ip route` would take it.
pub(crate) fn route_desc(s: &CaptureSpec, f: Family) -> String {
    format!("ip route local {} dev lo table {}", f.any(), s.route_table)
}

/// Whether IPv6 is usable in the current thread's network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ipv6State {
    Enabled,
    /// `net.ipv6.conf.lo.disable_ipv6 = 1`.
    Disabled,
    /// The kernel has no IPv6 (`ipv6.disable=1` or not built).
    Unavailable,
}

/// Reads the IPv6 state of the calling thread's network namespace.
pub(crate) fn ipv6_state() -> Ipv6State {
    match std::fs::read_to_string("/proc/sys/net/ipv6/conf/lo/disable_ipv6") {
        Ok(v) if v.trim() == "0" => Ipv6State::Enabled,
        Ok(_) => Ipv6State::Disabled,
        Err(_) => Ipv6State::Unavailable,
    }
}

/// The families to program: IPv4 always, IPv6 when usable (logged otherwise).
pub(crate) fn families(op: &str) -> Vec<Family> {
    match ipv6_state() {
        Ipv6State::Enabled => vec![Family::V4, Family::V6],
        st => {
            // Said once per apply at info; verify (run by reconcile loops) at debug.
            if op == "apply" {
                tracing::info!(
                    ipv6 = ?st,
                    "IPv6 is not usable in this pod network namespace; skipping the IPv6 ip rule and local route"
                );
            } else {
                tracing::debug!(op, ipv6 = ?st, "IPv6 not usable; not checking IPv6 policy routing");
            }
            vec![Family::V4]
        }
    }
}

fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = AF_UNSPEC;
    h[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// Sets `lo` up (idempotent).
pub(crate) fn set_lo_up(sock: &mut NlSocket) -> Result<(), RedirectError> {
    let m = Msg::new(
        RTM_NEWLINK,
        0,
        &ifinfomsg(LOOPBACK_IFINDEX, IFF_UP, IFF_UP),
        &Attrs::new(),
    );
    sock.request(&m)
        .map_err(|e| e.context("setting link lo up", false))
}

/// Whether `lo` is up.
pub(crate) fn lo_is_up(sock: &mut NlSocket) -> Result<bool, RedirectError> {
    let m = Msg::new(
        RTM_GETLINK,
        0,
        &ifinfomsg(LOOPBACK_IFINDEX, 0, 0),
        &Attrs::new(),
    );
    let r = sock
        .get(&m)
        .map_err(|e| e.context("reading link lo", false))?;
    let flags = r
        .payload
        .get(8..12)
        .and_then(nl::ne32)
        .ok_or_else(|| RedirectError::Protocol {
            what: "reading link lo".into(),
            detail: "short ifinfomsg".into(),
        })?;
    Ok(flags & IFF_UP != 0)
}

fn fib_rule_hdr(f: Family, s: &CaptureSpec) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[0] = f.af();
    h[4] = if s.route_table < 256 {
        s.route_table as u8
    } else {
        RT_TABLE_UNSPEC
    };
    h[7] = FR_ACT_TO_TBL;
    h
}

fn rule_msg(ty: u16, flags: u16, f: Family, s: &CaptureSpec, with_priority: bool) -> Msg {
    let mut a = Attrs::new();
    if with_priority {
        a.u32_ne(FRA_PRIORITY, s.rule_priority);
    }
    a.u32_ne(FRA_FWMARK, s.capture_mark)
        .u32_ne(FRA_FWMASK, s.mark_mask)
        .u32_ne(FRA_TABLE, s.route_table);
    Msg::new(ty, flags, &fib_rule_hdr(f, s), &a)
}

fn rtmsg(f: Family, s: &CaptureSpec, scope: u8, proto: u8, ty: u8) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[0] = f.af();
    h[4] = if s.route_table < 256 {
        s.route_table as u8
    } else {
        RT_TABLE_UNSPEC
    };
    h[5] = proto;
    h[6] = scope;
    h[7] = ty;
    h
}

fn route_msg(ty: u16, flags: u16, f: Family, s: &CaptureSpec) -> Msg {
    let mut a = Attrs::new();
    a.u32_ne(RTA_TABLE, s.route_table)
        .u32_ne(RTA_OIF, LOOPBACK_IFINDEX);
    let hdr = if ty == RTM_NEWROUTE {
        rtmsg(f, s, RT_SCOPE_HOST, RTPROT_STATIC, RTN_LOCAL)
    } else {
        // Delete: any scope, any protocol, type local.
        rtmsg(f, s, RT_SCOPE_NOWHERE, 0, RTN_LOCAL)
    };
    Msg::new(ty, flags, &hdr, &a)
}

/// Whether an add created the object or found it already there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    Created,
    AlreadyThere,
}

pub(crate) fn add_rule(
    sock: &mut NlSocket,
    f: Family,
    s: &CaptureSpec,
) -> Result<Added, RedirectError> {
    let m = rule_msg(RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL, f, s, true);
    match sock.request(&m) {
        Ok(()) => Ok(Added::Created),
        Err(NlError::Kernel(Errno::EEXIST)) => Ok(Added::AlreadyThere),
        Err(e) => Err(e.context(
            format!(
                "adding {} priority {} ({})",
                rule_desc(s),
                s.rule_priority,
                f.label()
            ),
            true,
        )),
    }
}

pub(crate) fn add_route(
    sock: &mut NlSocket,
    f: Family,
    s: &CaptureSpec,
) -> Result<Added, RedirectError> {
    let m = route_msg(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, f, s);
    match sock.request(&m) {
        Ok(()) => Ok(Added::Created),
        Err(NlError::Kernel(Errno::EEXIST)) => Ok(Added::AlreadyThere),
        Err(e) => Err(e.context(format!("adding {} ({})", route_desc(s, f), f.label()), true)),
    }
}

/// "Nothing (left) to delete" answers.
fn gone(e: &NlError) -> bool {
    matches!(
        e,
        NlError::Kernel(Errno::ENOENT | Errno::ESRCH | Errno::EAFNOSUPPORT)
    )
}

/// Deletes every copy of our ip rule (any priority); returns how many.
pub(crate) fn del_rules(
    sock: &mut NlSocket,
    f: Family,
    s: &CaptureSpec,
) -> Result<usize, RedirectError> {
    let m = rule_msg(RTM_DELRULE, 0, f, s, false);
    let mut n = 0;
    // Bounded: a pod never legitimately holds more than a few copies.
    for _ in 0..64 {
        match sock.request(&m) {
            Ok(()) => n += 1,
            Err(e) if gone(&e) => return Ok(n),
            Err(e) => {
                return Err(e.context(format!("deleting {} ({})", rule_desc(s), f.label()), false))
            }
        }
    }
    Ok(n)
}

/// Deletes our local default route(s) in the table; returns how many.
pub(crate) fn del_routes(
    sock: &mut NlSocket,
    f: Family,
    s: &CaptureSpec,
) -> Result<usize, RedirectError> {
    let m = route_msg(RTM_DELROUTE, 0, f, s);
    let mut n = 0;
    for _ in 0..64 {
        match sock.request(&m) {
            Ok(()) => n += 1,
            Err(e) if gone(&e) => return Ok(n),
            Err(e) => {
                return Err(e.context(
                    format!("deleting {} ({})", route_desc(s, f), f.label()),
                    false,
                ))
            }
        }
    }
    Ok(n)
}

/// An ip rule as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FibRule {
    pub(crate) action: u8,
    pub(crate) table: u32,
    pub(crate) priority: u32,
    pub(crate) fwmark: Option<u32>,
    pub(crate) fwmask: Option<u32>,
}

fn parse_fib_rule(m: &RxMsg) -> Result<FibRule, DecodeError> {
    let hdr = m
        .payload
        .get(..12)
        .ok_or(DecodeError::ShortHeader("fib_rule_hdr"))?;
    let attrs = nl::parse_attrs(&m.payload[12..])?;
    Ok(FibRule {
        action: hdr[7],
        table: nl::find(&attrs, FRA_TABLE)
            .and_then(nl::ne32)
            .unwrap_or(u32::from(hdr[4])),
        priority: nl::find(&attrs, FRA_PRIORITY)
            .and_then(nl::ne32)
            .unwrap_or(0),
        fwmark: nl::find(&attrs, FRA_FWMARK).and_then(nl::ne32),
        fwmask: nl::find(&attrs, FRA_FWMASK).and_then(nl::ne32),
    })
}

pub(crate) fn dump_rules(sock: &mut NlSocket, f: Family) -> Result<Vec<FibRule>, RedirectError> {
    let what = format!("listing ip rules ({})", f.label());
    let hdr = [f.af(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let msgs = sock
        .dump(&Msg::new(RTM_GETRULE, 0, &hdr, &Attrs::new()))
        .map_err(|e| e.context(what.clone(), false))?;
    msgs.iter()
        .filter(|m| m.ty == RTM_NEWRULE)
        .map(|m| {
            parse_fib_rule(m).map_err(|e| RedirectError::Protocol {
                what: what.clone(),
                detail: e.to_string(),
            })
        })
        .collect()
}

/// A route as dumped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteEntry {
    pub(crate) table: u32,
    pub(crate) dst_len: u8,
    pub(crate) kind: u8,
    pub(crate) oif: Option<u32>,
}

fn parse_route(m: &RxMsg) -> Result<RouteEntry, DecodeError> {
    let hdr = m
        .payload
        .get(..12)
        .ok_or(DecodeError::ShortHeader("rtmsg"))?;
    let attrs = nl::parse_attrs(&m.payload[12..])?;
    Ok(RouteEntry {
        table: nl::find(&attrs, RTA_TABLE)
            .and_then(nl::ne32)
            .unwrap_or(u32::from(hdr[4])),
        dst_len: hdr[1],
        kind: hdr[7],
        oif: nl::find(&attrs, RTA_OIF).and_then(nl::ne32),
    })
}

pub(crate) fn dump_routes(
    sock: &mut NlSocket,
    f: Family,
) -> Result<Vec<RouteEntry>, RedirectError> {
    let what = format!("listing routes ({})", f.label());
    let hdr = [f.af(), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let msgs = sock
        .dump(&Msg::new(RTM_GETROUTE, 0, &hdr, &Attrs::new()))
        .map_err(|e| e.context(what.clone(), false))?;
    msgs.iter()
        .filter(|m| m.ty == RTM_NEWROUTE)
        .map(|m| {
            parse_route(m).map_err(|e| RedirectError::Protocol {
                what: what.clone(),
                detail: e.to_string(),
            })
        })
        .collect()
}

impl FibRule {
    /// Our rule, at any priority.
    pub(crate) fn is_ours(&self, s: &CaptureSpec) -> bool {
        self.action == FR_ACT_TO_TBL
            && self.table == s.route_table
            && self.fwmark == Some(s.capture_mark)
            && self.fwmask == Some(s.mark_mask)
    }
}

impl RouteEntry {
    pub(crate) fn is_ours(&self, s: &CaptureSpec) -> bool {
        self.table == s.route_table
            && self.dst_len == 0
            && self.kind == RTN_LOCAL
            && self.oif == Some(LOOPBACK_IFINDEX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_message_layout() {
        let s = CaptureSpec::default();
        let m = rule_msg(RTM_NEWRULE, NLM_F_CREATE, Family::V6, &s, true);
        assert_eq!(m.body[0], AF_INET6);
        assert_eq!(m.body[4], 133);
        assert_eq!(m.body[7], FR_ACT_TO_TBL);
        let attrs = nl::parse_attrs(&m.body[12..]).unwrap();
        assert_eq!(nl::find(&attrs, FRA_PRIORITY).and_then(nl::ne32), Some(100));
        assert_eq!(nl::find(&attrs, FRA_FWMARK).and_then(nl::ne32), Some(0x111));
        assert_eq!(nl::find(&attrs, FRA_FWMASK).and_then(nl::ne32), Some(0xfff));
        assert_eq!(nl::find(&attrs, FRA_TABLE).and_then(nl::ne32), Some(133));
        let del = rule_msg(RTM_DELRULE, 0, Family::V4, &s, false);
        let attrs = nl::parse_attrs(&del.body[12..]).unwrap();
        assert!(nl::find(&attrs, FRA_PRIORITY).is_none());
    }

    #[test]
    fn route_message_layout() {
        let s = CaptureSpec::default();
        let m = route_msg(RTM_NEWROUTE, NLM_F_CREATE, Family::V4, &s);
        assert_eq!(
            &m.body[..8],
            &[
                AF_INET,
                0,
                0,
                0,
                133,
                RTPROT_STATIC,
                RT_SCOPE_HOST,
                RTN_LOCAL
            ]
        );
        let attrs = nl::parse_attrs(&m.body[12..]).unwrap();
        assert_eq!(nl::find(&attrs, RTA_OIF).and_then(nl::ne32), Some(1));
        // A table id above 255 goes only in RTA_TABLE.
        let big = CaptureSpec {
            route_table: 1000,
            ..CaptureSpec::default()
        };
        let m = route_msg(RTM_NEWROUTE, 0, Family::V6, &big);
        assert_eq!(m.body[4], RT_TABLE_UNSPEC);
        let attrs = nl::parse_attrs(&m.body[12..]).unwrap();
        assert_eq!(nl::find(&attrs, RTA_TABLE).and_then(nl::ne32), Some(1000));
    }

    #[test]
    fn descriptions() {
        let s = CaptureSpec::default();
        assert_eq!(rule_desc(&s), "ip rule fwmark 0x111/0xfff lookup 133");
        assert_eq!(
            route_desc(&s, Family::V6),
            "ip route local ::/0 dev lo table 133"
        );
    }
}
