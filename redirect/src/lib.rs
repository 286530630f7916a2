//! Programs a pod's traffic capture inside the pod's network namespace, in
//! one atomic step, entirely over netlink (no `nft`, `ip` or `iptables`
//! binary at run time), verifies it, and removes it leaving nothing behind.
//!
//! # API
//! - [`apply`] (idempotent): `lo` up, `net.ipv4.tcp_migrate_req=1`, the
//!   conntrack `TIME_WAIT` capped at 30 s, ip rules + local routes, then the
//!   whole nft table in one nfnetlink batch. On failure it rolls back what it
//!   added.
//! - [`apply_for`]: the same, with the owning pod's [`PodTag`] stored in the
//!   table's user data; [`read_tag`] reads it back (how a restarted node agent
//!   finds out which pod a namespace belongs to).
//! - [`verify`]: a list of [`Drift`]s, empty when everything is in place;
//!   [`verify_for`] also checks the owner tag.
//! - [`remove`] (idempotent): deletes the table, the ip rules and the routes.
//! - [`open_netns`] / [`check_pod_netns`]: every call refuses an fd that is not
//!   a network namespace, or that is PID 1's, this process's (a node agent
//!   runs in the host namespace) or the calling thread's own namespace. Where
//!   even root may not read `/proc/1/ns/net` (sandboxes deny ptrace access to
//!   PID 1), that one comparison is skipped and logged at debug.
//!
//! The work runs on a short-lived thread that `setns(CLONE_NEWNET)`s into the
//! pod namespace and opens its netlink sockets there (a netlink socket acts
//! on the namespace it was created in), so the caller's thread never moves.
//!
//! # The rule set
//! Everything lives in one table, `inet ringway` (IPv4 and IPv6 at once). Rule
//! numbers are 1-based positions in their chain; they are what errors and
//! [`Drift`] reports cite. Defaults of [`CaptureSpec`] shown: proxy mark
//! `0x539`, capture mark `0x111`, mask `0xfff`, ports 15001/15006/15008, table
//! 133, probe sources `169.254.7.127` / `fd16:9254:7127:1337:ffff:ffff:ffff:ffff`.
//! Marks are always compared as `mark & mask == value`.
//!
//! **`prerouting`** — `type filter hook prerouting priority -150` (mangle), both modes:
//!
//! | # | rule | why |
//! | --- | --- | --- |
//! | 1 | `meta l4proto != tcp return` | only TCP is captured |
//! | 2 | `meta mark & 0xfff == 0x539 ct direction original ct mark set 0x111 return` | the proxy's own (spoofed-source) packets looping on `lo` toward the app, on connections the proxy opened: remember the connection so the app's replies come back to the proxy |
//! | 3 | `meta mark & 0xfff == 0x539 return` | the proxy's replies on `lo` to an app's connection (a redirected outbound one): no mark on that connection, whose packets reach the proxy's local address without a re-route (a marked connection costs every later packet of the app a policy re-route) |
//! | 4 | `iif "lo" socket transparent 1 meta mark set 0x111 accept` | packets for the proxy's transparent sockets looping on `lo` (the app's replies): delivered locally through the policy route |
//! | 5 | `iif "lo" return` | nothing else on `lo` is captured (loopback, the pod's own IPs, redirected outbound) |
//!
//! TPROXY mode ([`CaptureMode::Tproxy`], the default) continues `prerouting`:
//!
//! | # | rule | why |
//! | --- | --- | --- |
//! | 6 | `tcp flags & (syn \| ack) != syn socket transparent 1 accept` | established inbound flows of the proxy's transparent sockets; no mark is set on packets from the pod's interfaces, so `src_valid_mark=1` cannot reroute them. An opening SYN never matches: if its 4-tuple still has one of our sockets in TIME_WAIT (the client reused its port), the tproxy rule retires it and captures the SYN |
//! | 7 | `ct direction reply return` | replies to connections the pod opened |
//! | 8 | `ip saddr 169.254.7.127 return` | kubelet probes are never captured |
//! | 9 | `ip6 saddr fd16:9254:7127:1337:ffff:ffff:ffff:ffff return` | same, IPv6 |
//! | 10 | `tcp dport 15008 return` | the tunnel (HBONE) port is never captured |
//! | 11 | `meta l4proto tcp tproxy to :15006 accept` | inbound: handed to the transparent listener on 15006 without NAT; the accepted socket's local address is the original destination |
//! | 12 | `meta l4proto tcp drop` | fail closed: with no listener on 15006 the SYN is dropped (the client retransmits), never delivered uncaptured |
//!
//! REDIRECT mode ([`CaptureMode::Redirect`]) adds **`nat_prerouting`** —
//! `type nat hook prerouting priority -100`:
//!
//! | # | rule |
//! | --- | --- |
//! | 1 | `meta l4proto != tcp return` |
//! | 2 | `iif "lo" return` |
//! | 3 | `meta mark & 0xfff == 0x539 return` |
//! | 4 | `ip saddr 169.254.7.127 return` |
//! | 5 | `ip6 saddr fd16:9254:7127:1337:ffff:ffff:ffff:ffff return` |
//! | 6 | `tcp dport 15008 return` |
//! | 7 | `meta l4proto tcp redirect to :15006` (original destination via `SO_ORIGINAL_DST`) |
//!
//! Both modes, **`output`** — `type route hook output priority -150`:
//!
//! | # | rule | why |
//! | --- | --- | --- |
//! | 1 | `meta l4proto != tcp return` | |
//! | 2 | `meta mark & 0xfff == 0x539 return` | the proxy's own sockets |
//! | 3 | `ct mark & 0xfff == 0x111 meta mark set 0x111` | the app's replies on a spoofed-source connection: the mark re-routes them (route chain) through table 133 back to `lo` and the proxy |
//!
//! Both modes, **`nat_output`** — `type nat hook output priority -100`:
//!
//! | # | rule | why |
//! | --- | --- | --- |
//! | 1 | `meta l4proto != tcp return` | |
//! | 2 | `meta mark & 0xfff == 0x539 return` | the proxy's upstream connections |
//! | 3 | `oif "lo" return` | loopback and the pod's own IPs are not captured |
//! | 4 | `ct direction reply return` | |
//! | 5 | `meta nfproto ipv4 meta l4proto tcp dnat ip to jhash ip daddr . tcp dport mod 16777214 seed 0x72696e67 offset 127.0.0.1:15001` | IPv4 outbound: to the proxy on a loopback address keyed by the destination (`127.0.0.1` to `127.255.255.254`; the hash is put in network order), original destination via `SO_ORIGINAL_DST`. One address for every destination would let the proxy's TIME_WAIT sockets (it closes first whenever the far side does) meet the app's next connection from the same port to another destination, whose SYN then fails PAWS and waits a retransmission |
//! | 6 | `meta nfproto ipv6 meta l4proto tcp meta mark set 0x111 ct mark set 0x111 dnat ip6 to [fd16:9254:7127:1500::/96 + jhash ip6 daddr . tcp dport]:15001` | IPv6 outbound, same: `::1` is the only IPv6 loopback address, so the block `fd16:9254:7127:1500::/96` (the low 32 bits the hash) is made local by the capture mark: this rule marks the first packet and the connection, `output` rule 3 marks the rest, and table 133's `local ::/0 dev lo` delivers them to the proxy |
//!
//! Policy routing, IPv4 and IPv6: `ip rule add fwmark 0x111/0xfff lookup 133
//! priority 100` and `ip route add local 0.0.0.0/0 dev lo table 133` (and
//! `local ::/0`), with `lo` up. When IPv6 is disabled in the namespace the
//! IPv6 rule and route are skipped (logged). The rules work with
//! `net.ipv4.conf.*.src_valid_mark=1` (tested), so that sysctl is left alone.
//!
//! Two sysctls are set in the pod namespace (never the node's):
//! - `net.ipv4.tcp_migrate_req=1` (kernel 5.14+; skipped and logged on older
//!   kernels). When a proxy closes its `SO_REUSEPORT` listeners (an upgrade:
//!   the old proxy leaves, the new one already listens), the connections
//!   queued on them migrate to the remaining listeners instead of being
//!   reset. [`verify`] reports it as drift when it is 0.
//! - `net.netfilter.nf_conntrack_tcp_timeout_time_wait` at most
//!   [`CONNTRACK_TIME_WAIT_CAP_S`] (30; a lower value stays). The `ct` rules
//!   above make the namespace track every TCP connection (a pod without
//!   capture tracks none), and a closed connection's entry waits this long,
//!   120 s by default. The table's size is node-wide (`nf_conntrack_max`,
//!   not settable in a pod): at 120 s a pod making or taking about 2,000
//!   new connections a second through the proxy (1,000 on the plaintext
//!   path through both hops, which tracks the app's connection and the
//!   proxy's) fills it in two minutes and its SYNs are dropped; at 30 s it
//!   takes 4x that rate. [`verify`] reports a value above the cap.
//!
//! [`remove`] leaves both set (harmless without the rules).
//!
//! **Why outbound is REDIRECT even in TPROXY mode.** With outbound TPROXY
//! each accepted socket's local address is the *remote* (`pod0:9000`), and
//! the kernel puts it in the bind bucket of that port inside the pod
//! (`__inet_inherit_port`), so the app then gets `EADDRINUSE` listening on
//! 9000. A nat REDIRECT'ed socket is local to `127.0.0.1:15001` instead.
//!
//! # Atomicity, verification, ownership
//! The nft part is one `NFNL_MSG_BATCH_BEGIN`..`END` batch: create the table
//! if absent, delete it, create it again with every chain and rule, each
//! message with `NLM_F_ACK`. The kernel validates every message and applies
//! all or nothing, so a re-apply replaces the rule set without a moment of
//! no capture, and a refused batch leaves the previous rule set untouched.
//! The ip rules and routes are added first (harmless on their own: nothing
//! carries the capture mark without the nft rules) and rolled back if the
//! batch is refused. Each rule carries a comment
//! `ringway:v1:<chain>:<n>:<hash of its expressions>` (visible in
//! `nft list`), which lets [`verify`] tell missing, extra, foreign and
//! changed rules apart; verify also checks the table, each chain's type,
//! hook, priority and policy, `lo`, the ip rules and the routes.
//!
//! # Layers
//! Each module names only modules below it (checked by the workspace's
//! module-graph test, `tests/tests/it/crate_graph.rs`): `abi` and `tag` (leaves),
//! `nl` (the netlink codec), `nft`, `drift`, `error`, then `spec`, `socket`,
//! `netns` and `sysctl`, then `route` and `ruleset`, then `verify`, and the
//! crate root on top with the operations ([`apply`], [`verify`], [`remove`]).
//!
//! # No unsafe code
//! The crate is `#![forbid(unsafe_code)]`: netlink sockets, `setns`, `fstat`
//! and `fstatfs` come from `nix`'s safe wrappers, and all messages are
//! encoded by hand into byte vectors. Instead of the `NS_GET_NSTYPE` ioctl
//! (which would need an unsafe call), a namespace fd is recognised by nsfs'
//! magic number plus `/proc/thread-self/fd/<n>` reading `net:[inode]`; for an
//! fd opened through a bind mount (`/run/netns/<name>`, where that link shows
//! the path) a `setns(CLONE_NEWNET)` on a throwaway thread decides.

#![forbid(unsafe_code)]

mod abi;
mod drift;
mod error;
mod netns;
mod nft;
mod nl;
mod route;
mod ruleset;
mod socket;
mod spec;
mod sysctl;
mod tag;
mod verify;

use std::os::fd::BorrowedFd;

use nix::errno::Errno;
use nix::sys::socket::SockProtocol;

pub use drift::Drift;
pub use error::RedirectError;
pub use netns::{check_pod_netns, open_netns};
pub use ruleset::render;
pub use socket::wait_closed;
pub use spec::{CaptureMode, CaptureSpec};
pub use sysctl::CONNTRACK_TIME_WAIT_CAP_S;
pub use tag::{PodTag, TagError, MAX_PIECES, NFT_USERDATA_MAX, PIECE_MAX};

use nft::Chain;
#[cfg(feature = "testing")]
use nft::{Expr, Rule};
use nl::DecodeError;
use route::{Added, Family};
use socket::{NlError, NlSocket};

/// Programs the capture for `spec` in the pod network namespace `netns`.
///
/// Idempotent; a re-apply (also with another mode or ports) atomically
/// replaces the nft rule set. Steps: `lo` up; the ip rule and local route per
/// family (an identical existing one is kept); a check that they are exactly
/// in place; the nft batch; a check of the nft result. If a step fails, the
/// ip rules/routes this call created are deleted again and the previous nft
/// rule set (if any) is untouched. Policy routing from an earlier spec with
/// other marks/table is not removed: call [`remove`] with that spec.
/// Calls for the same pod must not run concurrently.
/// The capture carries no owner tag: a re-apply with `apply` drops the tag an
/// earlier [`apply_for`] stored.
pub fn apply(netns: BorrowedFd<'_>, spec: &CaptureSpec) -> Result<(), RedirectError> {
    apply_chains(netns, spec, ruleset::chains(spec), Vec::new())
}

/// Like [`apply`], and tags the table with the pod that owns it, so that
/// [`read_tag`] gives it back (a node agent rebuilds its state from the
/// namespaces after a restart). The tag lives in the table's and chains' user
/// data (see [`PodTag`] for the format); it is replaced with the rules, in the
/// same batch. Fails with [`RedirectError::TagTooLong`] when the tag does not
/// fit (about 900 bytes in TPROXY mode), before anything is changed.
pub fn apply_for(
    netns: BorrowedFd<'_>,
    spec: &CaptureSpec,
    owner: &PodTag,
) -> Result<(), RedirectError> {
    let chains = ruleset::chains(spec);
    let pieces = owner
        .pieces((chains.len() + 1).min(tag::MAX_PIECES))
        .map_err(|e| RedirectError::TagTooLong(e.to_string()))?;
    apply_chains(netns, spec, chains, pieces)
}

/// The owner tag stored by [`apply_for`]: `Ok(None)` when the namespace has
/// no `inet ringway` table or its table carries no tag of ours (e.g. it was
/// programmed by [`apply`]).
pub fn read_tag(netns: BorrowedFd<'_>) -> Result<Option<PodTag>, RedirectError> {
    netns::run_in(netns, "read-tag", || {
        let mut nf = open_nfnetlink()?;
        read_tag_here(&mut nf)
    })
}

fn read_tag_here(nf: &mut NlSocket) -> Result<Option<PodTag>, RedirectError> {
    let what = format!("reading table inet {}", nft::TABLE);
    let table = match nf.get(&nft::msg_get_table()) {
        Ok(m) => m,
        Err(NlError::Kernel(Errno::ENOENT)) => return Ok(None),
        Err(e) => return Err(e.context(what, false)),
    };
    let proto = |what: &str, e: DecodeError| RedirectError::Protocol {
        what: what.to_string(),
        detail: e.to_string(),
    };
    let comment = nft::parse_table_comment(&table).map_err(|d| proto(&what, d))?;
    let Some(first) = comment.as_deref() else {
        return Ok(None);
    };
    let needs_chains = matches!(tag::parse_piece(first), Some(Ok((_, n, _))) if n > 1);
    let mut chain_comments = Vec::new();
    if needs_chains {
        let what = format!("listing the chains of table inet {}", nft::TABLE);
        for m in nf
            .dump(&nft::msg_dump_chains())
            .map_err(|e| e.context(what.clone(), false))?
        {
            let c = nft::parse_chain(&m).map_err(|d| proto(&what, d))?;
            if c.table == nft::TABLE {
                chain_comments.extend(c.comment);
            }
        }
    }
    Ok(tag::assemble(Some(first), &chain_comments)?)
}

/// Returns how the pod's capture differs from `spec`; empty when in place.
/// Besides the rules, routes and `lo`, checks that `net.ipv4.tcp_migrate_req`
/// is 1 and the conntrack `TIME_WAIT` at most [`CONNTRACK_TIME_WAIT_CAP_S`]
/// (when the kernel has them).
pub fn verify(netns: BorrowedFd<'_>, spec: &CaptureSpec) -> Result<Vec<Drift>, RedirectError> {
    verify_inner(netns, spec, None)
}

/// Like [`verify`], and also that the table carries `owner`'s tag
/// ([`Drift::OwnerMissing`], [`Drift::OwnerDiffers`], [`Drift::OwnerUnreadable`]).
pub fn verify_for(
    netns: BorrowedFd<'_>,
    spec: &CaptureSpec,
    owner: &PodTag,
) -> Result<Vec<Drift>, RedirectError> {
    verify_inner(netns, spec, Some(owner))
}

fn verify_inner(
    netns: BorrowedFd<'_>,
    spec: &CaptureSpec,
    owner: Option<&PodTag>,
) -> Result<Vec<Drift>, RedirectError> {
    spec.validate()?;
    let chains = ruleset::chains(spec);
    let ino = netns::inode(netns);
    let drift = netns::run_in(netns, "verify", || {
        let mut nf = open_nfnetlink()?;
        let mut drift = verify::nft_drift(&mut nf, &chains)?;
        if let Some(want) = owner {
            if !drift.contains(&Drift::TableMissing) {
                match read_tag_here(&mut nf) {
                    Ok(Some(found)) if &found == want => {}
                    Ok(Some(found)) => drift.push(Drift::OwnerDiffers {
                        want: want.encode(),
                        found: found.encode(),
                    }),
                    Ok(None) => drift.push(Drift::OwnerMissing {
                        want_uid: want.uid.clone(),
                    }),
                    Err(RedirectError::Tag(e)) => {
                        drift.push(Drift::OwnerUnreadable { detail: e.0 })
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let mut rt = open_rtnetlink()?;
        let fams = route::families("verify");
        drift.extend(verify::routing_drift(&mut rt, spec, &fams)?);
        drift.extend(sysctl::migrate_req_drift()?);
        drift.extend(sysctl::conntrack_time_wait_drift()?);
        Ok(drift)
    })?;
    if drift.is_empty() {
        tracing::debug!(netns.inode = ino, "capture verified in place");
    } else {
        tracing::warn!(
            netns.inode = ino,
            drift = %drift.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("; "),
            "capture drifted"
        );
    }
    Ok(drift)
}

/// Removes the capture: the nft table, the ip rules (any priority) and the
/// local routes of `spec.route_table`, both families. Idempotent.
pub fn remove(netns: BorrowedFd<'_>, spec: &CaptureSpec) -> Result<(), RedirectError> {
    spec.validate()?;
    let ino = netns::inode(netns);
    netns::run_in(netns, "remove", || {
        let mut nf = open_nfnetlink()?;
        let out = nf
            .batch(&[nft::msg_del_table()])
            .map_err(|e| e.context(format!("deleting table inet {}", nft::TABLE), false))?;
        let table_deleted = match (out.refused.first().copied(), out.batch_error) {
            (None, None) if out.unacked.is_empty() => true,
            (Some((_, Errno::ENOENT)), _) => false,
            (Some((_, errno)), _) | (None, Some(errno)) => {
                return Err(RedirectError::Netlink {
                    what: format!("deleting table inet {}", nft::TABLE),
                    errno,
                })
            }
            (None, None) => {
                return Err(RedirectError::Protocol {
                    what: format!("deleting table inet {}", nft::TABLE),
                    detail: "the kernel did not acknowledge the request".into(),
                })
            }
        };
        let mut rt = open_rtnetlink()?;
        let (mut rules, mut routes) = (0, 0);
        for f in [Family::V4, Family::V6] {
            rules += route::del_rules(&mut rt, f, spec)?;
            routes += route::del_routes(&mut rt, f, spec)?;
        }
        tracing::info!(
            netns.inode = ino,
            table_deleted,
            ip_rules_deleted = rules,
            routes_deleted = routes,
            "capture removed"
        );
        Ok(())
    })
}

fn open_nfnetlink() -> Result<NlSocket, RedirectError> {
    NlSocket::open(SockProtocol::NetlinkNetFilter, "nfnetlink")
}

fn open_rtnetlink() -> Result<NlSocket, RedirectError> {
    NlSocket::open(SockProtocol::NetlinkRoute, "rtnetlink")
}

/// Something apply added and must undo if a later step fails.
#[derive(Debug, Clone, Copy)]
enum Undo {
    Rule(Family),
    Route(Family),
}

fn apply_chains(
    netns: BorrowedFd<'_>,
    spec: &CaptureSpec,
    chains: Vec<Chain>,
    owner: Vec<String>,
) -> Result<(), RedirectError> {
    spec.validate()?;
    let ino = netns::inode(netns);
    netns::run_in(netns, "apply", || {
        let mut rt = open_rtnetlink()?;
        route::set_lo_up(&mut rt)?;
        // Harmless on its own and not rolled back: it only changes what
        // happens to the queue of a closing SO_REUSEPORT listener.
        sysctl::enable_migrate_req()?;
        // Capped before the rules make the namespace track connections;
        // where conntrack is a module the capture's rules load, the sysctl
        // appears with them and is capped after the batch.
        let ct_capped = sysctl::cap_conntrack_time_wait()?;
        let fams = route::families("apply");
        let mut added = Vec::new();
        let result = apply_steps(&mut rt, spec, &fams, &chains, &owner, &mut added);
        match result {
            Ok(()) => {
                if !ct_capped {
                    cap_conntrack_after_rules(ino);
                }
                tracing::info!(
                    netns.inode = ino,
                    mode = ?spec.mode,
                    rules = chains.iter().map(|c| c.rules.len()).sum::<usize>(),
                    "capture applied"
                );
                Ok(())
            }
            Err(error) => {
                tracing::warn!(netns.inode = ino, %error, undo = ?added, "apply failed; rolling back");
                match rollback(&mut rt, spec, &added) {
                    Ok(()) => Err(error),
                    Err(rb) => Err(RedirectError::RollbackFailed {
                        error: Box::new(error),
                        rollback: Box::new(rb),
                    }),
                }
            }
        }
    })
}

/// The second try of [`sysctl::cap_conntrack_time_wait`], once the rules
/// are in place. The capture works without the cap, so a failure here is
/// logged, not an apply failure (and [`verify`] reports the sysctl).
fn cap_conntrack_after_rules(ino: u64) {
    match sysctl::cap_conntrack_time_wait() {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            netns.inode = ino,
            sysctl = sysctl::CT_TIME_WAIT,
            "conntrack has no {} in this namespace: closed connections keep the kernel's \
             conntrack TIME_WAIT",
            sysctl::CT_TIME_WAIT
        ),
        Err(error) => tracing::warn!(
            netns.inode = ino,
            %error,
            "capping the conntrack TIME_WAIT failed; verify reports it"
        ),
    }
}

fn apply_steps(
    rt: &mut NlSocket,
    spec: &CaptureSpec,
    fams: &[Family],
    chains: &[Chain],
    owner: &[String],
    added: &mut Vec<Undo>,
) -> Result<(), RedirectError> {
    for &f in fams {
        if route::add_rule(rt, f, spec)? == Added::Created {
            added.push(Undo::Rule(f));
        }
        if route::add_route(rt, f, spec)? == Added::Created {
            added.push(Undo::Route(f));
        }
    }
    // Something foreign may occupy our table/route (EEXIST above): check
    // before the nft rules start marking packets.
    let drift = verify::routing_drift(rt, spec, fams)?;
    if !drift.is_empty() {
        return Err(RedirectError::NotInPlace { drift });
    }
    let mut nf = open_nfnetlink()?;
    let result = send_apply_batch(&mut nf, chains, owner).and_then(|()| {
        let drift = verify::nft_drift(&mut nf, chains)?;
        if drift.is_empty() {
            Ok(())
        } else {
            Err(RedirectError::NotInPlace { drift })
        }
    });
    socket::close_later(nf);
    result
}

fn send_apply_batch(
    nf: &mut NlSocket,
    chains: &[Chain],
    owner: &[String],
) -> Result<(), RedirectError> {
    let items = nft::apply_batch(chains, owner);
    let msgs: Vec<_> = items.iter().map(|(m, _)| m.clone()).collect();
    let what = format!(
        "sending the nft batch for table inet {} ({} messages)",
        nft::TABLE,
        msgs.len()
    );
    let out = nf
        .batch(&msgs)
        .map_err(|e| e.context(what.clone(), false))?;
    if out.ok() {
        return Ok(());
    }
    for (i, errno) in &out.refused {
        tracing::warn!(message = %items[*i].1.describe(), %errno, "nft batch message refused");
    }
    if let Some((i, errno)) = out.refused.first() {
        let item = &items[*i].1;
        return Err(socket::kernel_error(
            item.describe(),
            *errno,
            item.feature_errnos(),
        ));
    }
    if let Some(errno) = out.batch_error {
        return Err(RedirectError::Netlink {
            what: format!("committing the nft batch for table inet {}", nft::TABLE),
            errno,
        });
    }
    Err(RedirectError::Protocol {
        what,
        detail: format!(
            "the kernel did not acknowledge {} of {} messages (first: {})",
            out.unacked.len(),
            msgs.len(),
            out.unacked
                .first()
                .map(|i| items[*i].1.describe())
                .unwrap_or_default()
        ),
    })
}

fn rollback(rt: &mut NlSocket, spec: &CaptureSpec, added: &[Undo]) -> Result<(), RedirectError> {
    let mut first_err = None;
    for u in added.iter().rev() {
        let r = match *u {
            Undo::Rule(f) => route::del_rules(rt, f, spec).map(|_| ()),
            Undo::Route(f) => route::del_routes(rt, f, spec).map(|_| ()),
        };
        if let Err(e) = r {
            first_err.get_or_insert(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// A deliberately invalid rule for [`apply_with_extra_rule_for_test`]
/// (feature `testing`).
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InjectedFault {
    /// An expression type the kernel does not know (ENOENT).
    UnknownExpression,
    /// A `cmp` reading a register that does not exist (ERANGE).
    BadRegister,
}

/// Like [`apply`], with one invalid rule appended to chain `output`, to prove
/// that a refused batch applies nothing at all (feature `testing`: never in a
/// product build).
#[cfg(feature = "testing")]
pub fn apply_with_extra_rule_for_test(
    netns: BorrowedFd<'_>,
    spec: &CaptureSpec,
    fault: InjectedFault,
) -> Result<(), RedirectError> {
    let mut chains = ruleset::chains(spec);
    let rule = match fault {
        InjectedFault::UnknownExpression => Rule {
            desc: "injected test fault: unknown expression ringway_no_such_expr".into(),
            exprs: vec![Expr::Raw {
                name: "ringway_no_such_expr".into(),
                data: Vec::new(),
            }],
        },
        InjectedFault::BadRegister => {
            let mut a = nl::Attrs::new();
            a.u32_be(1 /* NFTA_CMP_SREG */, 99)
                .u32_be(2 /* NFTA_CMP_OP */, 0)
                .nest(3 /* NFTA_CMP_DATA */, |d| {
                    d.put(1 /* NFTA_DATA_VALUE */, &[1]);
                });
            Rule {
                desc: "injected test fault: cmp on register 99".into(),
                exprs: vec![Expr::Raw {
                    name: "cmp".into(),
                    data: a.bytes().to_vec(),
                }],
            }
        }
    };
    if let Some(c) = chains.iter_mut().find(|c| c.name == "output") {
        c.rules.push(rule);
    }
    apply_chains(netns, spec, chains, Vec::new())
}
