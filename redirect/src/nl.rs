//! Netlink messages and attributes: encoding requests and parsing what the
//! kernel sends back. Pure byte work, no socket and no crate error: a reply
//! that cannot be parsed is a [`DecodeError`], which the caller names.
//!
//! Header fields and rtnetlink attributes are host-endian; nf_tables puts
//! its integers in attributes big-endian (the callers choose).

use crate::abi::*;

/// Why bytes from the kernel could not be read as what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DecodeError {
    /// An attribute's length runs past the buffer (or is below its header).
    #[error("attribute of type {ty} claims {len} bytes, {left} left")]
    AttrLength {
        /// The attribute's type.
        ty: u16,
        /// The length it claims.
        len: usize,
        /// The bytes left in the buffer.
        left: usize,
    },
    /// A message's length runs past the datagram (or is below its header).
    #[error("netlink message claims {len} bytes, {left} left")]
    MsgLength {
        /// The length it claims.
        len: usize,
        /// The bytes left in the datagram.
        left: usize,
    },
    /// A family header (`fib_rule_hdr`, `rtmsg`) is cut short.
    #[error("short {0}")]
    ShortHeader(&'static str),
    /// An nfnetlink message is shorter than its `nfgenmsg` header.
    #[error("message shorter than its nfgenmsg header")]
    ShortNfgenmsg,
    /// An object lacks an attribute it always carries (`chain without a name`).
    #[error("{object} without a {attribute}")]
    Missing {
        /// What was parsed (`chain`, `rule`, `expression`).
        object: &'static str,
        /// The attribute it lacks (`name`, `chain`).
        attribute: &'static str,
    },
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A growing buffer of netlink attributes.
#[derive(Debug, Clone)]
pub(crate) struct Attrs {
    buf: Vec<u8>,
    nest_flag: u16,
}

impl Attrs {
    /// Attributes to send: nests carry `NLA_F_NESTED`, as libmnl sends them.
    pub(crate) fn new() -> Attrs {
        Attrs {
            buf: Vec::new(),
            nest_flag: NLA_F_NESTED,
        }
    }

    /// Attributes as the kernel dumps them back (nests without `NLA_F_NESTED`):
    /// the form compared against dumps and hashed into rule tags.
    pub(crate) fn canonical() -> Attrs {
        Attrs {
            buf: Vec::new(),
            nest_flag: 0,
        }
    }

    pub(crate) fn put(&mut self, ty: u16, payload: &[u8]) -> &mut Attrs {
        let len = NLA_HDRLEN + payload.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(align4(self.buf.len()), 0);
        self
    }

    pub(crate) fn u32_be(&mut self, ty: u16, v: u32) -> &mut Attrs {
        self.put(ty, &v.to_be_bytes())
    }

    pub(crate) fn u32_ne(&mut self, ty: u16, v: u32) -> &mut Attrs {
        self.put(ty, &v.to_ne_bytes())
    }

    /// A NUL-terminated string.
    pub(crate) fn strz(&mut self, ty: u16, s: &str) -> &mut Attrs {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.put(ty, &v)
    }

    /// A nested attribute whose content `f` writes.
    pub(crate) fn nest(&mut self, ty: u16, f: impl FnOnce(&mut Attrs)) -> &mut Attrs {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0u8; NLA_HDRLEN]);
        f(self);
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self.buf[start + 2..start + 4].copy_from_slice(&(ty | self.nest_flag).to_ne_bytes());
        self
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }
}

/// One attribute parsed from a reply (type with flag bits masked off).
pub(crate) type Attr<'a> = (u16, &'a [u8]);

/// Parses a run of attributes.
pub(crate) fn parse_attrs(mut buf: &[u8]) -> Result<Vec<Attr<'_>>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLA_HDRLEN {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let ty = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < NLA_HDRLEN || len > buf.len() {
            return Err(DecodeError::AttrLength {
                ty,
                len,
                left: buf.len(),
            });
        }
        out.push((ty, &buf[NLA_HDRLEN..len]));
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// The payload of the first attribute of type `ty`.
pub(crate) fn find<'a>(attrs: &[Attr<'a>], ty: u16) -> Option<&'a [u8]> {
    attrs.iter().find(|(t, _)| *t == ty).map(|(_, p)| *p)
}

pub(crate) fn be32(p: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(p.get(..4)?.try_into().ok()?))
}

pub(crate) fn ne32(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

pub(crate) fn be64(p: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(p.get(..8)?.try_into().ok()?))
}

/// A string attribute (NUL terminator optional).
pub(crate) fn strz(p: &[u8]) -> String {
    let end = p.iter().position(|&b| b == 0).unwrap_or(p.len());
    String::from_utf8_lossy(&p[..end]).into_owned()
}

/// A request to send: type, flags (without `NLM_F_REQUEST`), and body
/// (the family header followed by attributes).
#[derive(Debug, Clone)]
pub(crate) struct Msg {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) body: Vec<u8>,
}

impl Msg {
    pub(crate) fn new(ty: u16, flags: u16, header: &[u8], attrs: &Attrs) -> Msg {
        let mut body = header.to_vec();
        body.resize(align4(body.len()), 0);
        body.extend_from_slice(attrs.bytes());
        Msg { ty, flags, body }
    }

    pub(crate) fn encode_into(&self, out: &mut Vec<u8>, seq: u32) {
        let len = NLMSG_HDRLEN + self.body.len();
        out.extend_from_slice(&(len as u32).to_ne_bytes());
        out.extend_from_slice(&self.ty.to_ne_bytes());
        out.extend_from_slice(&(self.flags | NLM_F_REQUEST).to_ne_bytes());
        out.extend_from_slice(&seq.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(&self.body);
        out.resize(align4(out.len()), 0);
    }
}

/// nfnetlink's family header: family, version, resource id (big-endian).
pub(crate) fn nfgenmsg(family: u8, res_id: u16) -> [u8; 4] {
    let r = res_id.to_be_bytes();
    [family, NFNETLINK_V0, r[0], r[1]]
}

/// A message received from the kernel.
#[derive(Debug, Clone)]
pub(crate) struct RxMsg {
    pub(crate) ty: u16,
    pub(crate) flags: u16,
    pub(crate) seq: u32,
    pub(crate) payload: Vec<u8>,
}

impl RxMsg {
    /// For `NLMSG_ERROR`: the (positive) errno, 0 for an ack.
    pub(crate) fn error_code(&self) -> Option<i32> {
        if self.ty != NLMSG_ERROR {
            return None;
        }
        let e = i32::from_ne_bytes(self.payload.get(..4)?.try_into().ok()?);
        Some(-e)
    }
}

/// Splits a datagram into netlink messages.
pub(crate) fn parse_msgs(mut buf: &[u8]) -> Result<Vec<RxMsg>, DecodeError> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return Err(DecodeError::MsgLength {
                len,
                left: buf.len(),
            });
        }
        out.push(RxMsg {
            ty: u16::from_ne_bytes([buf[4], buf[5]]),
            flags: u16::from_ne_bytes([buf[6], buf[7]]),
            seq: u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]),
            payload: buf[NLMSG_HDRLEN..len].to_vec(),
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attrs_are_padded_and_nested() {
        let mut a = Attrs::new();
        a.strz(1, "ab").nest(4, |n| {
            n.u32_be(2, 0x0102_0304);
        });
        let b = a.bytes();
        // "ab\0" -> len 7, padded to 8.
        assert_eq!(&b[..8], &[7, 0, 1, 0, b'a', b'b', 0, 0]);
        let nested_ty = u16::from_ne_bytes([b[10], b[11]]);
        assert_eq!(nested_ty, 4 | NLA_F_NESTED);
        assert_eq!(u16::from_ne_bytes([b[8], b[9]]), 12);
        assert_eq!(&b[12..20], &[8, 0, 2, 0, 1, 2, 3, 4]);
        let parsed = parse_attrs(b).unwrap();
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed[1].0, 4, "flag bits are masked off");
        let inner = parse_attrs(parsed[1].1).unwrap();
        assert_eq!(be32(find(&inner, 2).unwrap()), Some(0x0102_0304));
    }

    #[test]
    fn canonical_nests_have_no_flag() {
        let mut a = Attrs::canonical();
        a.nest(3, |_| {});
        assert_eq!(u16::from_ne_bytes([a.bytes()[2], a.bytes()[3]]), 3);
    }

    #[test]
    fn message_header_layout() {
        let mut attrs = Attrs::new();
        attrs.strz(NFTA_TABLE_NAME, "ringway");
        let m = Msg::new(
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE,
            NLM_F_CREATE,
            &nfgenmsg(NFPROTO_INET, 0),
            &attrs,
        );
        let mut buf = Vec::new();
        m.encode_into(&mut buf, 42);
        assert_eq!(buf.len(), 16 + 4 + 12);
        assert_eq!(u32::from_ne_bytes(buf[0..4].try_into().unwrap()), 32);
        assert_eq!(u16::from_ne_bytes([buf[4], buf[5]]), 0x0a00);
        assert_eq!(
            u16::from_ne_bytes([buf[6], buf[7]]),
            NLM_F_CREATE | NLM_F_REQUEST
        );
        assert_eq!(u32::from_ne_bytes(buf[8..12].try_into().unwrap()), 42);
        assert_eq!(&buf[16..20], &[NFPROTO_INET, 0, 0, 0]);
        let msgs = parse_msgs(&buf).unwrap();
        assert_eq!(msgs.len(), 1);
        assert_eq!(msgs[0].seq, 42);
    }

    #[test]
    fn batch_header_carries_subsystem_big_endian() {
        assert_eq!(nfgenmsg(AF_UNSPEC, NFNL_SUBSYS_NFTABLES), [0, 0, 0, 10]);
    }

    #[test]
    fn error_messages_decode() {
        let mut payload = (-2i32).to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0u8; 16]);
        let m = RxMsg {
            ty: NLMSG_ERROR,
            flags: 0,
            seq: 1,
            payload,
        };
        assert_eq!(m.error_code(), Some(2));
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        assert!(parse_attrs(&[200, 0, 1, 0, 0]).is_err());
        assert!(parse_attrs(&[2, 0, 1, 0]).is_err());
        assert!(parse_msgs(&[255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(parse_attrs(&[]).unwrap().is_empty());
    }
}
