//! nf_tables objects (table, chains, rules, expressions), their netlink
//! encoding, and parsing of what the kernel dumps back.
//!
//! Every expression works on register 1 (`NFT_REG_1`, 16 bytes) and the
//! verdict register, like `nft` itself. Kernel conventions followed here:
//! register numbers and other integer attributes are big-endian u32; the
//! data compared against `meta mark`/`iif`/`oif`/`ct mark` is the host-endian
//! u32 the kernel loads; `l4proto`, `nfproto`, `ct direction` and `socket
//! transparent` load one byte; ports and addresses are in network order.

use crate::abi::*;
use crate::nl::{self, Attrs, DecodeError, Msg, RxMsg};
use crate::tag::NFT_USERDATA_MAX;

/// Name of the table that holds the whole rule set.
pub(crate) const TABLE: &str = "ringway";
/// Version of the tag format and rule set layout, part of every rule tag.
pub(crate) const TAG_VERSION: &str = "v1";
const TAG_PREFIX: &str = "ringway:";

/// One nf_tables expression.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expr {
    /// `meta load <key> => reg 1`
    MetaLoad(u32),
    /// `meta set <key> with reg 1`
    MetaSet(u32),
    /// `cmp <op> reg 1 <data>`
    Cmp { op: u32, data: Vec<u8> },
    /// `bitwise reg 1 = (reg 1 & mask) ^ xor`
    Bitwise { mask: Vec<u8>, xor: Vec<u8> },
    /// `immediate reg 1 <data>`
    Immediate(Vec<u8>),
    /// `immediate reg 0 <verdict>`
    Verdict(i32),
    /// `ct load <key> => reg 1`
    CtLoad(u32),
    /// `ct set <key> with reg 1`
    CtSet(u32),
    /// `socket load <key> => reg 1`
    Socket(u32),
    /// `payload load <len>b @ <base> + <offset> => reg 1`
    Payload { base: u32, offset: u32, len: u32 },
    /// `tproxy port reg 1` (family unspec: both IPv4 and IPv6 in an inet table)
    TproxyPort,
    /// `redir proto_min reg 1 flags PROTO_SPECIFIED`
    RedirPort,
    /// `payload load <len>b @ <base> + <offset> => reg <dreg>` (a second
    /// field of a concatenation, e.g. `NFT_REG32_01`)
    PayloadTo {
        dreg: u32,
        base: u32,
        offset: u32,
        len: u32,
    },
    /// `reg <dreg> = jhash(reg <sreg>, <len>) % <modulus> + <offset>`
    /// (fixed seed)
    Jhash {
        sreg: u32,
        dreg: u32,
        len: u32,
        modulus: u32,
        seed: u32,
        offset: u32,
    },
    /// `byteorder reg 1 = hton(reg 1, 4, 4)`
    Hton32,
    /// `immediate reg 2 <data>`
    Immediate2(Vec<u8>),
    /// `nat dnat <family> addr_min reg 1 proto_min reg 2` (`NFPROTO_IPV4`
    /// or `NFPROTO_IPV6`)
    Dnat(u8),
    /// `bitwise reg <dreg> = reg <sreg>` (`<len>` bytes: a copy)
    Copy { sreg: u32, dreg: u32, len: u32 },
    /// Any expression, raw (fault injection for tests; feature `testing`).
    #[cfg(feature = "testing")]
    Raw { name: String, data: Vec<u8> },
}

impl Expr {
    pub(crate) fn name(&self) -> &str {
        match self {
            Expr::MetaLoad(_) | Expr::MetaSet(_) => "meta",
            Expr::Cmp { .. } => "cmp",
            Expr::Bitwise { .. } => "bitwise",
            Expr::Immediate(_) | Expr::Verdict(_) => "immediate",
            Expr::CtLoad(_) | Expr::CtSet(_) => "ct",
            Expr::Socket(_) => "socket",
            Expr::Payload { .. } => "payload",
            Expr::TproxyPort => "tproxy",
            Expr::RedirPort => "redir",
            Expr::PayloadTo { .. } => "payload",
            Expr::Jhash { .. } => "hash",
            Expr::Hton32 => "byteorder",
            Expr::Immediate2(_) => "immediate",
            Expr::Dnat(_) => "nat",
            Expr::Copy { .. } => "bitwise",
            #[cfg(feature = "testing")]
            Expr::Raw { name, .. } => name,
        }
    }

    /// Writes the expression's `NFTA_EXPR_DATA` content.
    pub(crate) fn encode_data(&self, a: &mut Attrs) {
        match self {
            Expr::MetaLoad(key) => {
                a.u32_be(NFTA_META_KEY, *key)
                    .u32_be(NFTA_META_DREG, NFT_REG_1);
            }
            Expr::MetaSet(key) => {
                a.u32_be(NFTA_META_KEY, *key)
                    .u32_be(NFTA_META_SREG, NFT_REG_1);
            }
            Expr::Cmp { op, data } => {
                a.u32_be(NFTA_CMP_SREG, NFT_REG_1)
                    .u32_be(NFTA_CMP_OP, *op)
                    .nest(NFTA_CMP_DATA, |d| {
                        d.put(NFTA_DATA_VALUE, data);
                    });
            }
            Expr::Bitwise { mask, xor } => bitwise(a, NFT_REG_1, NFT_REG_1, mask, xor),
            Expr::Immediate(data) => immediate(a, NFT_REG_1, data),
            Expr::Verdict(code) => {
                a.u32_be(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT)
                    .nest(NFTA_IMMEDIATE_DATA, |d| {
                        d.nest(NFTA_DATA_VERDICT, |v| {
                            v.u32_be(NFTA_VERDICT_CODE, *code as u32);
                        });
                    });
            }
            Expr::CtLoad(key) => {
                a.u32_be(NFTA_CT_KEY, *key).u32_be(NFTA_CT_DREG, NFT_REG_1);
            }
            Expr::CtSet(key) => {
                a.u32_be(NFTA_CT_KEY, *key).u32_be(NFTA_CT_SREG, NFT_REG_1);
            }
            Expr::Socket(key) => {
                a.u32_be(NFTA_SOCKET_KEY, *key)
                    .u32_be(NFTA_SOCKET_DREG, NFT_REG_1);
            }
            Expr::Payload { base, offset, len } => payload(a, NFT_REG_1, *base, *offset, *len),
            Expr::TproxyPort => {
                a.u32_be(NFTA_TPROXY_FAMILY, u32::from(NFPROTO_UNSPEC))
                    .u32_be(NFTA_TPROXY_REG_PORT, NFT_REG_1);
            }
            Expr::RedirPort => {
                a.u32_be(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1)
                    .u32_be(NFTA_REDIR_FLAGS, NF_NAT_RANGE_PROTO_SPECIFIED);
            }
            Expr::PayloadTo {
                dreg,
                base,
                offset,
                len,
            } => payload(a, *dreg, *base, *offset, *len),
            Expr::Jhash {
                sreg,
                dreg,
                len,
                modulus,
                seed,
                offset,
            } => {
                a.u32_be(NFTA_HASH_SREG, *sreg)
                    .u32_be(NFTA_HASH_DREG, *dreg)
                    .u32_be(NFTA_HASH_LEN, *len)
                    .u32_be(NFTA_HASH_MODULUS, *modulus)
                    .u32_be(NFTA_HASH_SEED, *seed)
                    .u32_be(NFTA_HASH_TYPE, NFT_HASH_JENKINS);
                // The kernel dumps the offset only when it is not 0.
                if *offset != 0 {
                    a.u32_be(NFTA_HASH_OFFSET, *offset);
                }
            }
            Expr::Hton32 => {
                a.u32_be(NFTA_BYTEORDER_SREG, NFT_REG_1)
                    .u32_be(NFTA_BYTEORDER_DREG, NFT_REG_1)
                    .u32_be(NFTA_BYTEORDER_OP, NFT_BYTEORDER_HTON)
                    .u32_be(NFTA_BYTEORDER_LEN, 4)
                    .u32_be(NFTA_BYTEORDER_SIZE, 4);
            }
            Expr::Immediate2(data) => immediate(a, NFT_REG_2, data),
            Expr::Dnat(family) => {
                a.u32_be(NFTA_NAT_TYPE, NFT_NAT_DNAT)
                    .u32_be(NFTA_NAT_FAMILY, u32::from(*family))
                    .u32_be(NFTA_NAT_REG_ADDR_MIN, NFT_REG_1)
                    .u32_be(NFTA_NAT_REG_PROTO_MIN, NFT_REG_2);
            }
            Expr::Copy { sreg, dreg, len } => {
                let n = *len as usize;
                bitwise(a, *sreg, *dreg, &vec![0xff; n], &vec![0; n]);
            }
            #[cfg(feature = "testing")]
            Expr::Raw { data, .. } => {
                a.put_raw(data);
            }
        }
    }

    /// Writes the expression as one `NFTA_LIST_ELEM`.
    fn encode(&self, a: &mut Attrs) {
        a.nest(NFTA_LIST_ELEM, |e| {
            e.strz(NFTA_EXPR_NAME, self.name());
            e.nest(NFTA_EXPR_DATA, |d| self.encode_data(d));
        });
    }

    /// True when the dumped expression `name`/`data` carries every attribute
    /// this expression sets, byte for byte (the kernel may add more, e.g.
    /// `NFTA_BITWISE_OP` or `NFTA_REDIR_REG_PROTO_MAX`).
    pub(crate) fn matches_dump(&self, name: &str, data: &[u8]) -> bool {
        if self.name() != name {
            return false;
        }
        let mut want = Attrs::canonical();
        self.encode_data(&mut want);
        let (Ok(want), Ok(got)) = (nl::parse_attrs(want.bytes()), nl::parse_attrs(data)) else {
            return false;
        };
        want.iter().all(|w| got.iter().any(|g| attr_eq(g, w)))
    }
}

/// `payload load <len>b @ <base> + <offset> => reg <dreg>`
fn payload(a: &mut Attrs, dreg: u32, base: u32, offset: u32, len: u32) {
    a.u32_be(NFTA_PAYLOAD_DREG, dreg)
        .u32_be(NFTA_PAYLOAD_BASE, base)
        .u32_be(NFTA_PAYLOAD_OFFSET, offset)
        .u32_be(NFTA_PAYLOAD_LEN, len);
}

/// `immediate reg <dreg> <data>`
fn immediate(a: &mut Attrs, dreg: u32, data: &[u8]) {
    a.u32_be(NFTA_IMMEDIATE_DREG, dreg)
        .nest(NFTA_IMMEDIATE_DATA, |d| {
            d.put(NFTA_DATA_VALUE, data);
        });
}

/// `bitwise reg <dreg> = (reg <sreg> & mask) ^ xor`
fn bitwise(a: &mut Attrs, sreg: u32, dreg: u32, mask: &[u8], xor: &[u8]) {
    a.u32_be(NFTA_BITWISE_SREG, sreg)
        .u32_be(NFTA_BITWISE_DREG, dreg)
        .u32_be(NFTA_BITWISE_LEN, mask.len() as u32)
        .nest(NFTA_BITWISE_MASK, |d| {
            d.put(NFTA_DATA_VALUE, mask);
        })
        .nest(NFTA_BITWISE_XOR, |d| {
            d.put(NFTA_DATA_VALUE, xor);
        });
}

/// Attribute equality that ignores `NLA_F_NESTED` at any depth: payloads are
/// equal when their bytes are, or when both parse as attribute lists whose
/// elements are equal in turn.
fn attr_eq(a: &nl::Attr<'_>, b: &nl::Attr<'_>) -> bool {
    a.0 == b.0 && payload_eq(a.1, b.1)
}

fn payload_eq(x: &[u8], y: &[u8]) -> bool {
    if x == y {
        return true;
    }
    if x.len() != y.len() {
        return false;
    }
    match (nl::parse_attrs(x), nl::parse_attrs(y)) {
        (Ok(xs), Ok(ys)) if !xs.is_empty() && xs.len() == ys.len() => {
            xs.iter().zip(&ys).all(|(p, q)| attr_eq(p, q))
        }
        _ => false,
    }
}

impl Attrs {
    /// Appends pre-encoded attributes.
    #[cfg(feature = "testing")]
    pub(crate) fn put_raw(&mut self, raw: &[u8]) -> &mut Attrs {
        // Reuse `put`'s padding by splitting into attributes when possible.
        match nl::parse_attrs(raw) {
            Ok(list) if !list.is_empty() => {
                for (ty, p) in list {
                    self.put(ty, p);
                }
            }
            _ => {
                if !raw.is_empty() {
                    self.put(0, raw);
                }
            }
        }
        self
    }
}

/// One rule: a human description (nft syntax) and its expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub(crate) desc: String,
    pub(crate) exprs: Vec<Expr>,
}

impl Rule {
    /// The expressions in canonical (dump) encoding: what the tag hashes.
    fn canonical_expressions(&self) -> Vec<u8> {
        let mut a = Attrs::canonical();
        for e in &self.exprs {
            e.encode(&mut a);
        }
        a.bytes().to_vec()
    }

    /// The tag stored in the rule's user data: `ringway:v1:<chain>:<n>:<hash>`
    /// where `n` is the 1-based position and `hash` covers the expressions.
    pub(crate) fn tag(&self, chain: &str, number: usize) -> String {
        format!(
            "{TAG_PREFIX}{TAG_VERSION}:{chain}:{number}:{:016x}",
            fnv1a64(&self.canonical_expressions())
        )
    }
}

/// FNV-1a, 64 bit: a stable, dependency-free fingerprint (not security).
pub(crate) fn fnv1a64(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// True when a tag looks like one of ours (any version).
pub(crate) fn is_our_tag(tag: &str) -> bool {
    tag.starts_with(TAG_PREFIX)
}

/// Chain type (`type filter|route|nat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChainKind {
    Filter,
    Route,
    Nat,
}

impl ChainKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ChainKind::Filter => "filter",
            ChainKind::Route => "route",
            ChainKind::Nat => "nat",
        }
    }
}

/// A base chain of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chain {
    pub(crate) name: &'static str,
    pub(crate) kind: ChainKind,
    pub(crate) hook: u32,
    pub(crate) priority: i32,
    pub(crate) rules: Vec<Rule>,
}

pub(crate) fn hook_name(hook: u32) -> &'static str {
    match hook {
        NF_INET_PRE_ROUTING => "prerouting",
        1 => "input",
        2 => "forward",
        NF_INET_LOCAL_OUT => "output",
        4 => "postrouting",
        _ => "unknown",
    }
}

impl Chain {
    /// `type nat hook output priority -100`
    pub(crate) fn header(&self) -> String {
        format!(
            "type {} hook {} priority {}",
            self.kind.as_str(),
            hook_name(self.hook),
            self.priority
        )
    }
}

const fn nft_type(msg: u16) -> u16 {
    (NFNL_SUBSYS_NFTABLES << 8) | msg
}

fn inet_hdr() -> [u8; 4] {
    nl::nfgenmsg(NFPROTO_INET, 0)
}

pub(crate) fn msg_new_table(comment: Option<&str>) -> Msg {
    let mut a = Attrs::new();
    a.strz(NFTA_TABLE_NAME, TABLE).u32_be(NFTA_TABLE_FLAGS, 0);
    if let Some(c) = comment {
        a.put(NFTA_TABLE_USERDATA, &comment_udata(c));
    }
    Msg::new(nft_type(NFT_MSG_NEWTABLE), NLM_F_CREATE, &inet_hdr(), &a)
}

pub(crate) fn msg_del_table() -> Msg {
    let mut a = Attrs::new();
    a.strz(NFTA_TABLE_NAME, TABLE);
    Msg::new(nft_type(NFT_MSG_DELTABLE), 0, &inet_hdr(), &a)
}

pub(crate) fn msg_get_table() -> Msg {
    let mut a = Attrs::new();
    a.strz(NFTA_TABLE_NAME, TABLE);
    Msg::new(nft_type(NFT_MSG_GETTABLE), 0, &inet_hdr(), &a)
}

pub(crate) fn msg_new_chain(c: &Chain, comment: Option<&str>) -> Msg {
    let mut a = Attrs::new();
    a.strz(NFTA_CHAIN_TABLE, TABLE)
        .strz(NFTA_CHAIN_NAME, c.name)
        .nest(NFTA_CHAIN_HOOK, |h| {
            h.u32_be(NFTA_HOOK_HOOKNUM, c.hook)
                .u32_be(NFTA_HOOK_PRIORITY, c.priority as u32);
        })
        .u32_be(NFTA_CHAIN_POLICY, NF_ACCEPT as u32)
        .strz(NFTA_CHAIN_TYPE, c.kind.as_str());
    if let Some(c) = comment {
        a.put(NFTA_CHAIN_USERDATA, &comment_udata(c));
    }
    Msg::new(nft_type(NFT_MSG_NEWCHAIN), NLM_F_CREATE, &inet_hdr(), &a)
}

pub(crate) fn msg_dump_chains() -> Msg {
    Msg::new(nft_type(NFT_MSG_GETCHAIN), 0, &inet_hdr(), &Attrs::new())
}

pub(crate) fn msg_dump_rules() -> Msg {
    let mut a = Attrs::new();
    a.strz(NFTA_RULE_TABLE, TABLE);
    Msg::new(nft_type(NFT_MSG_GETRULE), 0, &inet_hdr(), &a)
}

/// User data holding `tag` as a libnftnl comment TLV (`nft list` shows it).
/// The kernel keeps at most 256 bytes: type, length, the string and its NUL.
pub(crate) fn comment_udata(tag: &str) -> Vec<u8> {
    let bytes = tag.as_bytes();
    // The TLV length is one byte and includes the NUL.
    let n = bytes.len().min(NFT_USERDATA_MAX - 3);
    let mut v = Vec::with_capacity(n + 3);
    v.push(NFTNL_UDATA_RULE_COMMENT);
    v.push((n + 1) as u8);
    v.extend_from_slice(&bytes[..n]);
    v.push(0);
    v
}

/// The comment in rule user data, if any.
pub(crate) fn parse_comment(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (ty, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if ty == NFTNL_UDATA_RULE_COMMENT {
            return Some(nl::strz(value));
        }
        rest = &rest[2 + len..];
    }
    None
}

pub(crate) fn msg_new_rule(chain: &str, number: usize, rule: &Rule) -> Msg {
    let mut a = Attrs::new();
    a.strz(NFTA_RULE_TABLE, TABLE)
        .strz(NFTA_RULE_CHAIN, chain)
        .nest(NFTA_RULE_EXPRESSIONS, |l| {
            for e in &rule.exprs {
                e.encode(l);
            }
        })
        .put(NFTA_RULE_USERDATA, &comment_udata(&rule.tag(chain, number)));
    Msg::new(
        nft_type(NFT_MSG_NEWRULE),
        NLM_F_CREATE | NLM_F_APPEND,
        &inet_hdr(),
        &a,
    )
}

/// What one message of an apply batch does, for error messages.
#[derive(Debug, Clone)]
pub(crate) enum BatchItem {
    Table(&'static str),
    Chain(&'static str),
    Rule {
        chain: &'static str,
        number: usize,
        desc: String,
    },
}

impl BatchItem {
    pub(crate) fn describe(&self) -> String {
        match self {
            BatchItem::Table(op) => format!("{op} table inet {TABLE}"),
            BatchItem::Chain(c) => format!("adding chain {c} to table inet {TABLE}"),
            BatchItem::Rule {
                chain,
                number,
                desc,
            } => format!("adding rule {number} of chain {chain} ({desc})"),
        }
    }

    /// Whether ENOENT/EOPNOTSUPP on this message means a missing kernel
    /// feature (an expression or chain type the kernel does not know).
    pub(crate) fn feature_errnos(&self) -> bool {
        !matches!(self, BatchItem::Table("deleting"))
    }
}

/// The batch that atomically (re)creates the table with `chains`:
/// NEWTABLE (create if absent) + DELTABLE + NEWTABLE + chains + rules.
/// `owner` holds the owner tag's pieces: the first is the re-created table's
/// comment, the others the chains' comments in order (see [`crate::tag`]).
pub(crate) fn apply_batch(chains: &[Chain], owner: &[String]) -> Vec<(Msg, BatchItem)> {
    let mut out = vec![
        (msg_new_table(None), BatchItem::Table("creating")),
        (msg_del_table(), BatchItem::Table("deleting")),
        (
            msg_new_table(owner.first().map(String::as_str)),
            BatchItem::Table("re-creating"),
        ),
    ];
    for (i, c) in chains.iter().enumerate() {
        let comment = owner.get(i + 1).map(String::as_str);
        out.push((msg_new_chain(c, comment), BatchItem::Chain(c.name)));
    }
    for c in chains {
        for (i, r) in c.rules.iter().enumerate() {
            out.push((
                msg_new_rule(c.name, i + 1, r),
                BatchItem::Rule {
                    chain: c.name,
                    number: i + 1,
                    desc: r.desc.clone(),
                },
            ));
        }
    }
    out
}

/// A chain as the kernel dumps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DumpedChain {
    pub(crate) table: String,
    pub(crate) name: String,
    pub(crate) hook: Option<(u32, i32)>,
    pub(crate) policy: Option<u32>,
    pub(crate) kind: Option<String>,
    /// The chain's comment (user data), if any.
    pub(crate) comment: Option<String>,
}

impl DumpedChain {
    pub(crate) fn header(&self) -> String {
        match (&self.hook, &self.kind) {
            (Some((h, p)), Some(k)) => format!("type {k} hook {} priority {p}", hook_name(*h)),
            _ => "a regular (non-base) chain".to_string(),
        }
    }
}

/// A rule as the kernel dumps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DumpedRule {
    pub(crate) chain: String,
    pub(crate) handle: u64,
    pub(crate) tag: Option<String>,
    /// (expression name, raw `NFTA_EXPR_DATA` content)
    pub(crate) exprs: Vec<(String, Vec<u8>)>,
}

impl DumpedRule {
    /// True when the dumped expressions carry everything `rule` programs.
    pub(crate) fn matches(&self, rule: &Rule) -> bool {
        self.exprs.len() == rule.exprs.len()
            && rule
                .exprs
                .iter()
                .zip(&self.exprs)
                .all(|(e, (name, data))| e.matches_dump(name, data))
    }
}

fn nfgen_attrs(m: &RxMsg) -> Result<Vec<nl::Attr<'_>>, DecodeError> {
    let body = m.payload.get(4..).ok_or(DecodeError::ShortNfgenmsg)?;
    nl::parse_attrs(body)
}

fn missing(object: &'static str, attribute: &'static str) -> DecodeError {
    DecodeError::Missing { object, attribute }
}

pub(crate) fn parse_chain(m: &RxMsg) -> Result<DumpedChain, DecodeError> {
    let attrs = nfgen_attrs(m)?;
    let hook = match nl::find(&attrs, NFTA_CHAIN_HOOK) {
        Some(h) => {
            let h = nl::parse_attrs(h)?;
            let num = nl::find(&h, NFTA_HOOK_HOOKNUM).and_then(nl::be32);
            let prio = nl::find(&h, NFTA_HOOK_PRIORITY).and_then(nl::be32);
            match (num, prio) {
                (Some(n), Some(p)) => Some((n, p as i32)),
                _ => None,
            }
        }
        None => None,
    };
    Ok(DumpedChain {
        table: nl::find(&attrs, NFTA_CHAIN_TABLE)
            .map(nl::strz)
            .unwrap_or_default(),
        name: nl::find(&attrs, NFTA_CHAIN_NAME)
            .map(nl::strz)
            .ok_or_else(|| missing("chain", "name"))?,
        hook,
        policy: nl::find(&attrs, NFTA_CHAIN_POLICY).and_then(nl::be32),
        kind: nl::find(&attrs, NFTA_CHAIN_TYPE).map(nl::strz),
        comment: nl::find(&attrs, NFTA_CHAIN_USERDATA).and_then(parse_comment),
    })
}

/// The comment (user data) of a table the kernel returned, if any.
pub(crate) fn parse_table_comment(m: &RxMsg) -> Result<Option<String>, DecodeError> {
    let attrs = nfgen_attrs(m)?;
    Ok(nl::find(&attrs, NFTA_TABLE_USERDATA).and_then(parse_comment))
}

pub(crate) fn parse_rule(m: &RxMsg) -> Result<DumpedRule, DecodeError> {
    let attrs = nfgen_attrs(m)?;
    let mut exprs = Vec::new();
    if let Some(list) = nl::find(&attrs, NFTA_RULE_EXPRESSIONS) {
        for (ty, elem) in nl::parse_attrs(list)? {
            if ty != NFTA_LIST_ELEM {
                continue;
            }
            let e = nl::parse_attrs(elem)?;
            let name = nl::find(&e, NFTA_EXPR_NAME)
                .map(nl::strz)
                .ok_or_else(|| missing("expression", "name"))?;
            let data = nl::find(&e, NFTA_EXPR_DATA).unwrap_or_default().to_vec();
            exprs.push((name, data));
        }
    }
    Ok(DumpedRule {
        chain: nl::find(&attrs, NFTA_RULE_CHAIN)
            .map(nl::strz)
            .ok_or_else(|| missing("rule", "chain"))?,
        handle: nl::find(&attrs, NFTA_RULE_HANDLE)
            .and_then(nl::be64)
            .unwrap_or(0),
        tag: nl::find(&attrs, NFTA_RULE_USERDATA).and_then(parse_comment),
        exprs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expr_data(e: &Expr) -> Vec<u8> {
        let mut a = Attrs::new();
        e.encode_data(&mut a);
        a.bytes().to_vec()
    }

    fn a32(ty: u16, v: u32) -> Vec<u8> {
        let mut x = vec![8, 0];
        x.extend_from_slice(&ty.to_ne_bytes());
        x.extend_from_slice(&v.to_be_bytes());
        x
    }

    #[test]
    fn meta_load_encoding() {
        let d = expr_data(&Expr::MetaLoad(NFT_META_L4PROTO));
        let mut want = a32(NFTA_META_KEY, 16);
        want.extend(a32(NFTA_META_DREG, 1));
        assert_eq!(d, want);
    }

    #[test]
    fn cmp_encoding_nests_data_value() {
        let d = expr_data(&Expr::Cmp {
            op: NFT_CMP_NEQ,
            data: vec![6],
        });
        let mut want = a32(NFTA_CMP_SREG, 1);
        want.extend(a32(NFTA_CMP_OP, 1));
        // CMP_DATA (nested, 12 bytes) { DATA_VALUE (5 bytes, padded to 8) }
        want.extend([12, 0]);
        want.extend((NFTA_CMP_DATA | NLA_F_NESTED).to_ne_bytes());
        want.extend([5, 0]);
        want.extend(NFTA_DATA_VALUE.to_ne_bytes());
        want.extend([6, 0, 0, 0]);
        assert_eq!(d, want);
    }

    #[test]
    fn verdict_encoding() {
        let d = expr_data(&Expr::Verdict(NFT_RETURN));
        let mut want = a32(NFTA_IMMEDIATE_DREG, 0);
        want.extend([16, 0]);
        want.extend((NFTA_IMMEDIATE_DATA | NLA_F_NESTED).to_ne_bytes());
        want.extend([12, 0]);
        want.extend((NFTA_DATA_VERDICT | NLA_F_NESTED).to_ne_bytes());
        want.extend(a32(NFTA_VERDICT_CODE, (-5i32) as u32));
        assert_eq!(d, want);
    }

    #[test]
    fn tproxy_and_redir_encoding() {
        let mut want = a32(NFTA_TPROXY_FAMILY, 0);
        want.extend(a32(NFTA_TPROXY_REG_PORT, 1));
        assert_eq!(expr_data(&Expr::TproxyPort), want);
        let mut want = a32(NFTA_REDIR_REG_PROTO_MIN, 1);
        want.extend(a32(NFTA_REDIR_FLAGS, 2));
        assert_eq!(expr_data(&Expr::RedirPort), want);
    }

    #[test]
    fn socket_ct_payload_encoding() {
        let mut want = a32(NFTA_SOCKET_KEY, 0);
        want.extend(a32(NFTA_SOCKET_DREG, 1));
        assert_eq!(expr_data(&Expr::Socket(NFT_SOCKET_TRANSPARENT)), want);
        let mut want = a32(NFTA_CT_KEY, 3);
        want.extend(a32(NFTA_CT_SREG, 1));
        assert_eq!(expr_data(&Expr::CtSet(NFT_CT_MARK)), want);
        let mut want = a32(NFTA_PAYLOAD_DREG, 1);
        want.extend(a32(NFTA_PAYLOAD_BASE, 1));
        want.extend(a32(NFTA_PAYLOAD_OFFSET, 12));
        want.extend(a32(NFTA_PAYLOAD_LEN, 4));
        assert_eq!(
            expr_data(&Expr::Payload {
                base: NFT_PAYLOAD_NETWORK_HEADER,
                offset: 12,
                len: 4
            }),
            want
        );
    }

    #[test]
    fn comment_roundtrip() {
        let u = comment_udata("ringway:v1:output:3:00ff");
        assert_eq!(u[0], 0);
        assert_eq!(u[1] as usize, "ringway:v1:output:3:00ff".len() + 1);
        assert_eq!(*u.last().unwrap(), 0);
        assert_eq!(parse_comment(&u).unwrap(), "ringway:v1:output:3:00ff");
        assert_eq!(parse_comment(&[0, 200, 1]), None);
        assert_eq!(parse_comment(&[]), None);
    }

    #[test]
    fn tag_depends_on_expressions_and_position() {
        let r = Rule {
            desc: "x".into(),
            exprs: vec![Expr::MetaLoad(NFT_META_MARK)],
        };
        let mut r2 = r.clone();
        r2.exprs = vec![Expr::MetaLoad(NFT_META_IIF)];
        assert_ne!(r.tag("output", 1), r2.tag("output", 1));
        assert_ne!(r.tag("output", 1), r.tag("output", 2));
        assert!(r.tag("output", 1).starts_with("ringway:v1:output:1:"));
        assert!(r.tag("nat_prerouting", 12).len() < 128);
    }

    #[test]
    fn dump_match_accepts_extra_kernel_attributes() {
        let e = Expr::Bitwise {
            mask: 0xfffu32.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        };
        let mut dumped = Attrs::canonical();
        e.encode_data(&mut dumped);
        dumped.u32_be(6 /* NFTA_BITWISE_OP */, 0);
        assert!(e.matches_dump("bitwise", dumped.bytes()));
        let other = Expr::Bitwise {
            mask: 0xffu32.to_ne_bytes().to_vec(),
            xor: vec![0; 4],
        };
        assert!(!other.matches_dump("bitwise", dumped.bytes()));
        assert!(!e.matches_dump("cmp", dumped.bytes()));
    }

    #[test]
    fn rule_message_roundtrips_through_the_dump_parser() {
        let r = Rule {
            desc: "meta l4proto != tcp return".into(),
            exprs: vec![
                Expr::MetaLoad(NFT_META_L4PROTO),
                Expr::Cmp {
                    op: NFT_CMP_NEQ,
                    data: vec![6],
                },
                Expr::Verdict(NFT_RETURN),
            ],
        };
        let m = msg_new_rule("prerouting", 1, &r);
        let mut buf = Vec::new();
        m.encode_into(&mut buf, 7);
        let rx = nl::parse_msgs(&buf).unwrap();
        let d = parse_rule(&rx[0]).unwrap();
        assert_eq!(d.chain, "prerouting");
        assert_eq!(d.tag.as_deref(), Some(r.tag("prerouting", 1).as_str()));
        assert_eq!(d.exprs.len(), 3);
        // What we send carries NLA_F_NESTED; comparison masks it.
        assert!(d.matches(&r));
    }

    #[test]
    fn batch_orders_table_chains_rules() {
        let c = Chain {
            name: "output",
            kind: ChainKind::Route,
            hook: NF_INET_LOCAL_OUT,
            priority: -150,
            rules: vec![Rule {
                desc: "r".into(),
                exprs: vec![Expr::Verdict(NF_ACCEPT)],
            }],
        };
        let b = apply_batch(&[c], &[]);
        let kinds: Vec<String> = b.iter().map(|(_, i)| i.describe()).collect();
        assert_eq!(
            kinds,
            vec![
                "creating table inet ringway",
                "deleting table inet ringway",
                "re-creating table inet ringway",
                "adding chain output to table inet ringway",
                "adding rule 1 of chain output (r)",
            ]
        );
        assert_eq!(b[0].0.flags, NLM_F_CREATE);
        assert_eq!(b[4].0.flags, NLM_F_CREATE | NLM_F_APPEND);
        assert_eq!(b[3].0.ty, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWCHAIN);
    }
}
