//! The capture rule set, built from a [`CaptureSpec`]. The crate docs carry
//! the same rule set as a table; keep the two in step.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::abi::*;
use crate::nft::{Chain, ChainKind, Expr, Rule, TABLE};
use crate::spec::{CaptureMode, CaptureSpec};

/// Priority of the mangle-position chains (`prerouting`, `output`).
pub(crate) const PRIO_MANGLE: i32 = -150;
/// Priority of the nat chains (`dstnat`; nft 1.0.6 refuses the name on output).
pub(crate) const PRIO_DSTNAT: i32 = -100;

fn rule(desc: String, parts: Vec<Vec<Expr>>) -> Rule {
    Rule {
        desc,
        exprs: parts.into_iter().flatten().collect(),
    }
}

fn cmp(op: u32, data: &[u8]) -> Expr {
    Expr::Cmp {
        op,
        data: data.to_vec(),
    }
}

fn l4proto_is_not_tcp() -> Vec<Expr> {
    vec![
        Expr::MetaLoad(NFT_META_L4PROTO),
        cmp(NFT_CMP_NEQ, &[IPPROTO_TCP]),
    ]
}

fn l4proto_is_tcp() -> Vec<Expr> {
    vec![
        Expr::MetaLoad(NFT_META_L4PROTO),
        cmp(NFT_CMP_EQ, &[IPPROTO_TCP]),
    ]
}

/// `(meta mark | ct mark) & mask == value` (never a bare bit test).
fn masked_mark_is(load: Expr, value: u32, mask: u32) -> Vec<Expr> {
    vec![
        load,
        Expr::Bitwise {
            mask: mask.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        },
        cmp(NFT_CMP_EQ, &value.to_ne_bytes()),
    ]
}

fn set_ct_mark(value: u32) -> Vec<Expr> {
    vec![
        Expr::Immediate(value.to_ne_bytes().to_vec()),
        Expr::CtSet(NFT_CT_MARK),
    ]
}

fn set_meta_mark(value: u32) -> Vec<Expr> {
    vec![
        Expr::Immediate(value.to_ne_bytes().to_vec()),
        Expr::MetaSet(NFT_META_MARK),
    ]
}

fn iif_is_lo() -> Vec<Expr> {
    vec![
        Expr::MetaLoad(NFT_META_IIF),
        cmp(NFT_CMP_EQ, &LOOPBACK_IFINDEX.to_ne_bytes()),
    ]
}

fn oif_is_lo() -> Vec<Expr> {
    vec![
        Expr::MetaLoad(NFT_META_OIF),
        cmp(NFT_CMP_EQ, &LOOPBACK_IFINDEX.to_ne_bytes()),
    ]
}

/// `tcp flags & (syn|ack) != syn`: anything but an opening SYN.
fn not_opening_syn() -> Vec<Expr> {
    vec![
        Expr::Payload {
            base: NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 13,
            len: 1,
        },
        Expr::Bitwise {
            mask: vec![0x12],
            xor: vec![0],
        },
        cmp(NFT_CMP_NEQ, &[0x02]),
    ]
}

fn socket_transparent() -> Vec<Expr> {
    vec![Expr::Socket(NFT_SOCKET_TRANSPARENT), cmp(NFT_CMP_EQ, &[1])]
}

fn ct_direction_reply() -> Vec<Expr> {
    vec![
        Expr::CtLoad(NFT_CT_DIRECTION),
        cmp(NFT_CMP_EQ, &[IP_CT_DIR_REPLY]),
    ]
}

fn ct_direction_original() -> Vec<Expr> {
    vec![
        Expr::CtLoad(NFT_CT_DIRECTION),
        cmp(NFT_CMP_EQ, &[IP_CT_DIR_ORIGINAL]),
    ]
}

/// `meta nfproto <family>`
fn nfproto_is(family: u8) -> Vec<Expr> {
    vec![Expr::MetaLoad(NFT_META_NFPROTO), cmp(NFT_CMP_EQ, &[family])]
}

fn saddr_v4_is(a: Ipv4Addr) -> Vec<Expr> {
    let mut v = nfproto_is(NFPROTO_IPV4);
    v.extend([
        Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset: 12,
            len: 4,
        },
        cmp(NFT_CMP_EQ, &a.octets()),
    ]);
    v
}

fn saddr_v6_is(a: Ipv6Addr) -> Vec<Expr> {
    let mut v = nfproto_is(NFPROTO_IPV6);
    v.extend([
        Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset: 8,
            len: 16,
        },
        cmp(NFT_CMP_EQ, &a.octets()),
    ]);
    v
}

fn tcp_dport_is(port: u16) -> Vec<Expr> {
    let mut v = l4proto_is_tcp();
    v.push(Expr::Payload {
        base: NFT_PAYLOAD_TRANSPORT_HEADER,
        offset: 2,
        len: 2,
    });
    v.push(cmp(NFT_CMP_EQ, &port.to_be_bytes()));
    v
}

fn tproxy_to(port: u16) -> Vec<Expr> {
    vec![
        Expr::Immediate(port.to_be_bytes().to_vec()),
        Expr::TproxyPort,
    ]
}

/// First address of the outbound DNAT block (`127.0.0.1`, host order).
const OUTBOUND_V4_FIRST: u32 = 0x7f00_0001;
/// Addresses in the block: `127.0.0.1` to `127.255.255.254`.
const OUTBOUND_V4_COUNT: u32 = 0x00ff_fffe;
/// Fixed, so the mapping survives a re-apply and the verifier can read it
/// back (the kernel would draw a new one otherwise, and not dump it).
const OUTBOUND_HASH_SEED: u32 = 0x7269_6e67;

/// IPv4 outbound: `dnat` to `127.h.h.h:<port>`, `h` a hash of the original
/// destination address and port. A plain `redirect` sends every outbound
/// connection to `127.0.0.1:<port>`, so the proxy's accepted sockets (which
/// close first whenever the far side does, and so wait in TIME_WAIT) share
/// one address with every destination, and conntrack's source-port remaps
/// make the client's next ports collide with them: its SYN meets a
/// TIME_WAIT socket whose timestamps came from another 4-tuple, is refused
/// (PAWS) and retried after a second. Keyed by destination, a proxy-side
/// TIME_WAIT can only meet the client's next connection to that same
/// destination (the same 4-tuple, as without the proxy).
fn dnat_v4_by_destination(port: u16) -> Vec<Expr> {
    let mut v = nfproto_is(NFPROTO_IPV4);
    v.extend(l4proto_is_tcp());
    v.extend(destination_key(false));
    v.extend([
        Expr::Jhash {
            sreg: NFT_REG_1,
            dreg: NFT_REG_1,
            len: 8,
            modulus: OUTBOUND_V4_COUNT,
            seed: OUTBOUND_HASH_SEED,
            offset: OUTBOUND_V4_FIRST,
        },
        Expr::Hton32,
        Expr::Immediate2(port.to_be_bytes().to_vec()),
        Expr::Dnat(NFPROTO_IPV4),
    ]);
    v
}

/// `ip daddr . tcp dport` (`ip6 daddr` with `v6`) from register 1 on, the
/// key the outbound DNAT hashes: 8 bytes (20 with `v6`; the port is padded
/// to 4).
fn destination_key(v6: bool) -> [Expr; 2] {
    let (offset, len) = if v6 { (24, 16) } else { (16, 4) };
    [
        Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset,
            len,
        },
        // The 32-bit register right behind the address. With `v6` that is
        // `NFT_REG32_04`, which the kernel names (and dumps) `NFT_REG_2`.
        Expr::PayloadTo {
            dreg: if v6 { NFT_REG_2 } else { NFT_REG32_01 },
            base: NFT_PAYLOAD_TRANSPORT_HEADER,
            offset: 2,
            len: 2,
        },
    ]
}

/// The block the IPv6 outbound DNAT maps destinations into (`/96`; the low
/// 32 bits are the hash). IPv6 has one loopback address, so these are made
/// local by the capture mark: the rule marks the connection, the `output`
/// chain marks its later packets, and table 133 (`local ::/0 dev lo`) takes
/// them to the proxy.
const OUTBOUND_V6_BLOCK: Ipv6Addr = Ipv6Addr::new(0xfd16, 0x9254, 0x7127, 0x1500, 0, 0, 0, 0);

/// IPv6 outbound: as [`dnat_v4_by_destination`], to
/// `[OUTBOUND_V6_BLOCK + h]:<port>`, the connection marked with the
/// capture mark so that every packet routes locally.
fn dnat_v6_by_destination(s: &CaptureSpec) -> Vec<Expr> {
    let mut v = nfproto_is(NFPROTO_IPV6);
    v.extend(l4proto_is_tcp());
    v.extend(set_meta_mark(s.capture_mark));
    v.push(Expr::CtSet(NFT_CT_MARK));
    v.extend(destination_key(true));
    v.extend([
        Expr::Jhash {
            sreg: NFT_REG_1,
            dreg: NFT_REG32_05,
            len: 20,
            modulus: u32::MAX,
            seed: OUTBOUND_HASH_SEED,
            offset: 0,
        },
        Expr::Immediate(OUTBOUND_V6_BLOCK.octets().to_vec()),
        Expr::Copy {
            sreg: NFT_REG32_05,
            dreg: NFT_REG32_03,
            len: 4,
        },
        Expr::Immediate2(s.outbound_port.to_be_bytes().to_vec()),
        Expr::Dnat(NFPROTO_IPV6),
    ]);
    v
}

fn redirect_to(port: u16) -> Vec<Expr> {
    vec![
        Expr::Immediate(port.to_be_bytes().to_vec()),
        Expr::RedirPort,
    ]
}

fn verdict(code: i32) -> Vec<Expr> {
    vec![Expr::Verdict(code)]
}

fn ret() -> Vec<Expr> {
    verdict(NFT_RETURN)
}

/// Rules 1-5 of `prerouting`, shared by both modes: the proxy's own packets
/// and its transparent sockets on `lo`.
fn prerouting_common(s: &CaptureSpec) -> Vec<Rule> {
    let (pm, cm, mask) = (s.proxy_mark, s.capture_mark, s.mark_mask);
    vec![
        rule(
            "meta l4proto != tcp return".into(),
            vec![l4proto_is_not_tcp(), ret()],
        ),
        rule(
            format!(
                "meta mark & {mask:#x} == {pm:#x} ct direction original ct mark set {cm:#x} return"
            ),
            vec![
                masked_mark_is(Expr::MetaLoad(NFT_META_MARK), pm, mask),
                ct_direction_original(),
                set_ct_mark(cm),
                ret(),
            ],
        ),
        // The proxy's replies on `lo` to an app's connection (redirected
        // outbound): no mark on the connection, whose packets reach the
        // proxy's local address without it.
        rule(
            format!("meta mark & {mask:#x} == {pm:#x} return"),
            vec![
                masked_mark_is(Expr::MetaLoad(NFT_META_MARK), pm, mask),
                ret(),
            ],
        ),
        rule(
            format!("iif \"lo\" socket transparent 1 meta mark set {cm:#x} accept"),
            vec![
                iif_is_lo(),
                socket_transparent(),
                set_meta_mark(cm),
                verdict(NF_ACCEPT),
            ],
        ),
        rule("iif \"lo\" return".into(), vec![iif_is_lo(), ret()]),
    ]
}

fn probe_source_rules(s: &CaptureSpec) -> Vec<Rule> {
    vec![
        rule(
            format!("ip saddr {} return", s.probe_source_v4),
            vec![saddr_v4_is(s.probe_source_v4), ret()],
        ),
        rule(
            format!("ip6 saddr {} return", s.probe_source_v6),
            vec![saddr_v6_is(s.probe_source_v6), ret()],
        ),
    ]
}

fn proxy_mark_return(s: &CaptureSpec) -> Rule {
    rule(
        format!(
            "meta mark & {:#x} == {:#x} return",
            s.mark_mask, s.proxy_mark
        ),
        vec![
            masked_mark_is(Expr::MetaLoad(NFT_META_MARK), s.proxy_mark, s.mark_mask),
            ret(),
        ],
    )
}

fn tunnel_return(s: &CaptureSpec) -> Rule {
    rule(
        format!("tcp dport {} return", s.tunnel_port),
        vec![tcp_dport_is(s.tunnel_port), ret()],
    )
}

fn output_chain(s: &CaptureSpec) -> Chain {
    let (cm, mask) = (s.capture_mark, s.mark_mask);
    Chain {
        name: "output",
        kind: ChainKind::Route,
        hook: NF_INET_LOCAL_OUT,
        priority: PRIO_MANGLE,
        rules: vec![
            rule(
                "meta l4proto != tcp return".into(),
                vec![l4proto_is_not_tcp(), ret()],
            ),
            proxy_mark_return(s),
            rule(
                format!("ct mark & {mask:#x} == {cm:#x} meta mark set {cm:#x}"),
                vec![
                    masked_mark_is(Expr::CtLoad(NFT_CT_MARK), cm, mask),
                    set_meta_mark(cm),
                ],
            ),
        ],
    }
}

fn nat_output_chain(s: &CaptureSpec) -> Chain {
    Chain {
        name: "nat_output",
        kind: ChainKind::Nat,
        hook: NF_INET_LOCAL_OUT,
        priority: PRIO_DSTNAT,
        rules: vec![
            rule(
                "meta l4proto != tcp return".into(),
                vec![l4proto_is_not_tcp(), ret()],
            ),
            proxy_mark_return(s),
            rule("oif \"lo\" return".into(), vec![oif_is_lo(), ret()]),
            rule(
                "ct direction reply return".into(),
                vec![ct_direction_reply(), ret()],
            ),
            rule(
                format!(
                    "meta nfproto ipv4 meta l4proto tcp dnat ip to jhash ip daddr . tcp dport mod {OUTBOUND_V4_COUNT} seed {OUTBOUND_HASH_SEED:#x} offset 127.0.0.1:{}",
                    s.outbound_port
                ),
                vec![dnat_v4_by_destination(s.outbound_port)],
            ),
            rule(
                format!(
                    "meta nfproto ipv6 meta l4proto tcp meta mark set {cm:#x} ct mark set {cm:#x} dnat ip6 to [{OUTBOUND_V6_BLOCK}/96 + jhash ip6 daddr . tcp dport seed {OUTBOUND_HASH_SEED:#x}]:{}",
                    s.outbound_port,
                    cm = s.capture_mark
                ),
                vec![dnat_v6_by_destination(s)],
            ),
        ],
    }
}

/// The chains of the table for `spec`, in the order they are created.
pub(crate) fn chains(s: &CaptureSpec) -> Vec<Chain> {
    let mut prerouting = prerouting_common(s);
    match s.mode {
        CaptureMode::Tproxy => {
            // Not for an opening SYN: a SYN whose 4-tuple still has one of
            // our transparent sockets in TIME_WAIT (the client reused its
            // port) must go on to the tproxy rule, which retires the
            // TIME_WAIT socket and hands the SYN to the listener. Accepted
            // here, it would reach the app's listener uncaptured or stall.
            prerouting.push(rule(
                "tcp flags & (syn | ack) != syn socket transparent 1 accept".into(),
                vec![not_opening_syn(), socket_transparent(), verdict(NF_ACCEPT)],
            ));
            prerouting.push(rule(
                "ct direction reply return".into(),
                vec![ct_direction_reply(), ret()],
            ));
            prerouting.extend(probe_source_rules(s));
            prerouting.push(tunnel_return(s));
            prerouting.push(rule(
                format!("meta l4proto tcp tproxy to :{} accept", s.inbound_port),
                vec![
                    l4proto_is_tcp(),
                    tproxy_to(s.inbound_port),
                    verdict(NF_ACCEPT),
                ],
            ));
            prerouting.push(rule(
                "meta l4proto tcp drop".into(),
                vec![l4proto_is_tcp(), verdict(NF_DROP)],
            ));
            vec![
                Chain {
                    name: "prerouting",
                    kind: ChainKind::Filter,
                    hook: NF_INET_PRE_ROUTING,
                    priority: PRIO_MANGLE,
                    rules: prerouting,
                },
                output_chain(s),
                nat_output_chain(s),
            ]
        }
        CaptureMode::Redirect => {
            let mut nat_pre = vec![
                rule(
                    "meta l4proto != tcp return".into(),
                    vec![l4proto_is_not_tcp(), ret()],
                ),
                rule("iif \"lo\" return".into(), vec![iif_is_lo(), ret()]),
                proxy_mark_return(s),
            ];
            nat_pre.extend(probe_source_rules(s));
            nat_pre.push(tunnel_return(s));
            nat_pre.push(rule(
                format!("meta l4proto tcp redirect to :{}", s.inbound_port),
                vec![l4proto_is_tcp(), redirect_to(s.inbound_port)],
            ));
            vec![
                Chain {
                    name: "prerouting",
                    kind: ChainKind::Filter,
                    hook: NF_INET_PRE_ROUTING,
                    priority: PRIO_MANGLE,
                    rules: prerouting,
                },
                Chain {
                    name: "nat_prerouting",
                    kind: ChainKind::Nat,
                    hook: NF_INET_PRE_ROUTING,
                    priority: PRIO_DSTNAT,
                    rules: nat_pre,
                },
                output_chain(s),
                nat_output_chain(s),
            ]
        }
    }
}

/// The rule set for `spec` in nft-like syntax, with each rule's number
/// (as used in errors and drift reports).
pub fn render(spec: &CaptureSpec) -> String {
    let mut out = format!("table inet {TABLE} {{\n");
    for c in chains(spec) {
        out.push_str(&format!(
            "  chain {} {{ # {}; policy accept\n",
            c.name,
            c.header()
        ));
        for (i, r) in c.rules.iter().enumerate() {
            out.push_str(&format!("    {:>2}: {}\n", i + 1, r.desc));
        }
        out.push_str("  }\n");
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tproxy_layout_matches_the_documented_table() {
        let c = chains(&CaptureSpec::default());
        let names: Vec<_> = c.iter().map(|c| c.name).collect();
        assert_eq!(names, ["prerouting", "output", "nat_output"]);
        let pre: Vec<_> = c[0].rules.iter().map(|r| r.desc.as_str()).collect();
        assert_eq!(
            pre,
            [
                "meta l4proto != tcp return",
                "meta mark & 0xfff == 0x539 ct direction original ct mark set 0x111 return",
                "meta mark & 0xfff == 0x539 return",
                "iif \"lo\" socket transparent 1 meta mark set 0x111 accept",
                "iif \"lo\" return",
                "tcp flags & (syn | ack) != syn socket transparent 1 accept",
                "ct direction reply return",
                "ip saddr 169.254.7.127 return",
                "ip6 saddr fd16:9254:7127:1337:ffff:ffff:ffff:ffff return",
                "tcp dport 15008 return",
                "meta l4proto tcp tproxy to :15006 accept",
                "meta l4proto tcp drop",
            ]
        );
        assert_eq!(c[0].header(), "type filter hook prerouting priority -150");
        assert_eq!(c[1].header(), "type route hook output priority -150");
        assert_eq!(c[2].header(), "type nat hook output priority -100");
        assert_eq!(
            c[2].rules[4].desc,
            "meta nfproto ipv4 meta l4proto tcp dnat ip to jhash ip daddr . tcp dport mod 16777214 seed 0x72696e67 offset 127.0.0.1:15001"
        );
        assert_eq!(
            c[2].rules.last().unwrap().desc,
            "meta nfproto ipv6 meta l4proto tcp meta mark set 0x111 ct mark set 0x111 dnat ip6 to [fd16:9254:7127:1500::/96 + jhash ip6 daddr . tcp dport seed 0x72696e67]:15001"
        );
    }

    #[test]
    fn redirect_layout() {
        let spec = CaptureSpec {
            mode: CaptureMode::Redirect,
            ..CaptureSpec::default()
        };
        let c = chains(&spec);
        let names: Vec<_> = c.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            ["prerouting", "nat_prerouting", "output", "nat_output"]
        );
        assert_eq!(c[0].rules.len(), 5);
        assert_eq!(c[1].header(), "type nat hook prerouting priority -100");
        assert_eq!(
            c[1].rules.last().unwrap().desc,
            "meta l4proto tcp redirect to :15006"
        );
        assert!(c
            .iter()
            .flat_map(|c| &c.rules)
            .all(|r| !r.exprs.contains(&Expr::TproxyPort)));
    }

    /// The exact register contents `nft --debug=netlink` prints for the
    /// same rules (captured from nft 1.0.6): marks and ifindexes host-endian,
    /// addresses and ports in network order, one-byte loads one byte long.
    #[test]
    fn data_matches_nft_debug_output() {
        let c = chains(&CaptureSpec::default());
        let pre = &c[0].rules;
        let cmp_data = |r: &Rule| -> Vec<Vec<u8>> {
            r.exprs
                .iter()
                .filter_map(|e| match e {
                    Expr::Cmp { data, .. } => Some(data.clone()),
                    Expr::Immediate(d) => Some(d.clone()),
                    _ => None,
                })
                .collect()
        };
        // [ cmp neq reg 1 0x00000006 ]
        assert_eq!(cmp_data(&pre[0]), vec![vec![6]]);
        // [ cmp eq reg 1 0x00000539 ] [ ct load direction => reg 1 ]
        // [ cmp eq reg 1 0x00000000 ] [ immediate reg 1 0x00000111 ]
        assert_eq!(
            cmp_data(&pre[1]),
            vec![
                0x539u32.to_ne_bytes().to_vec(),
                vec![0],
                0x111u32.to_ne_bytes().to_vec()
            ]
        );
        // [ cmp eq reg 1 0x00000539 ]
        assert_eq!(cmp_data(&pre[2]), vec![0x539u32.to_ne_bytes().to_vec()]);
        // [ cmp eq reg 1 0x7f07fea9 ] (169.254.7.127 in network order)
        assert_eq!(cmp_data(&pre[7]), vec![vec![2], vec![169, 254, 7, 127]]);
        // [ cmp eq reg 1 0x0000a03a ] (15008 big-endian)
        assert_eq!(cmp_data(&pre[9]), vec![vec![6], vec![0x3a, 0xa0]]);
        // [ immediate reg 1 0x00009e3a ] [ tproxy port reg 1 ]
        assert_eq!(cmp_data(&pre[10]), vec![vec![6], vec![0x3a, 0x9e]]);
        // v6 probe source: 16 bytes at network header + 8
        assert!(pre[8].exprs.contains(&Expr::Payload {
            base: NFT_PAYLOAD_NETWORK_HEADER,
            offset: 8,
            len: 16
        }));
    }

    #[test]
    fn spec_values_flow_into_rules() {
        let spec = CaptureSpec {
            inbound_port: 16006,
            proxy_mark: 0x77,
            ..CaptureSpec::default()
        };
        let r = render(&spec);
        assert!(r.contains("tproxy to :16006"), "{r}");
        assert!(r.contains("== 0x77"), "{r}");
        assert!(
            r.contains("11: meta l4proto tcp tproxy to :16006 accept"),
            "{r}"
        );
    }
}
