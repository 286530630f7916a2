//! The owner tag: which pod a namespace's capture belongs to, stored in the
//! kernel with the rules themselves, so a restarted node agent can rebuild
//! its state from the namespaces alone.
//!
//! # Format
//! One versioned line, every field percent-escaped (`%`, `|`, `,` and every
//! byte outside printable ASCII become `%XX`), fields separated by `|`:
//!
//! ```text
//! v1|<uid>|<namespace>|<name>|<service account>|<node>|<container id>|<ip>,<ip>
//! ```
//!
//! The kernel keeps at most [`NFT_USERDATA_MAX`] bytes of user data per
//! object, so the line is cut into pieces of at most [`PIECE_MAX`] bytes.
//! Piece `i` of `n` is stored as the libnftnl *comment* `ringway-pod:i/n:<piece>`
//! (`nft list` shows it): piece 0 on the table, piece `i` on the `i`-th base
//! chain in creation order. A tag that needs more pieces than the rule set has
//! objects is refused ([`PodTag::pieces`]).
//!
//! The table lives in the pod's own network namespace: a container with
//! CAP_NET_ADMIN there can rewrite the tag. Reading it back never trusts it
//! for sizes (a count above [`MAX_PIECES`], an index past the count, a piece
//! stored twice: [`TagError`], never a panic), and it is only ever a hint: the
//! node agent adopts a pod at restart only when the tag agrees with its own
//! record, kept where pods cannot write.

use std::net::IpAddr;

/// Prefix of every piece's comment.
pub(crate) const PIECE_PREFIX: &str = "ringway-pod:";
/// The tag version written by this crate.
pub(crate) const TAG_FORMAT: &str = "v1";
/// Bytes of user data the kernel keeps per table/chain (`NFT_USERDATA_MAXLEN`).
pub const NFT_USERDATA_MAX: usize = 256;
/// The longest piece of the line stored in one object: the comment TLV (2
/// bytes of header, the NUL) and the `ringway-pod:i/n:` prefix must fit too.
pub const PIECE_MAX: usize = 224;
/// The most pieces a tag is ever cut into (the rule set has fewer objects).
/// A stored count above it is refused: the tag is pod-writable, so no count
/// read back may size an allocation.
pub const MAX_PIECES: usize = 16;

/// The pod that owns a namespace's capture.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodTag {
    /// Pod UID (required, the key the node proxy knows the pod by).
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Pod namespace.
    pub namespace: String,
    /// Service account (may be empty when the enroller did not know it).
    pub service_account: String,
    /// The Kubernetes node the pod was enrolled on.
    pub node: String,
    /// The CNI sandbox (container) id, empty when not enrolled through CNI.
    pub container_id: String,
    /// The pod's IPs.
    pub ips: Vec<IpAddr>,
}

/// Why a tag cannot be stored: its line needs more pieces than the rule set
/// has objects to hold them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the owner tag of pod {uid} needs {len} bytes, but the rule set stores at most {} ({slots} objects of {PIECE_MAX} bytes)",
    slots * PIECE_MAX
)]
pub(crate) struct TagTooLong {
    /// The pod's UID.
    pub(crate) uid: String,
    /// The length of the encoded line.
    pub(crate) len: usize,
    /// The objects available to hold pieces.
    pub(crate) slots: usize,
}

/// Why a stored tag could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("owner tag of table inet ringway is unreadable: {0}")]
pub struct TagError(pub String);

fn escape(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b == b'%' || b == b'|' || b == b',' || !(0x20..0x7f).contains(&b) {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push(b as char);
        }
    }
}

fn unescape(s: &str, field: &str) -> Result<String, TagError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| TagError(format!("field {field}: bad escape at byte {i}")))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| TagError(format!("field {field}: not UTF-8")))
}

impl PodTag {
    /// The tag as one line (see the module docs).
    pub fn encode(&self) -> String {
        let mut s = String::from(TAG_FORMAT);
        for f in [
            &self.uid,
            &self.namespace,
            &self.name,
            &self.service_account,
            &self.node,
            &self.container_id,
        ] {
            s.push('|');
            escape(f, &mut s);
        }
        s.push('|');
        let ips: Vec<String> = self.ips.iter().map(|ip| ip.to_string()).collect();
        s.push_str(&ips.join(","));
        s
    }

    /// Parses a line written by [`PodTag::encode`].
    pub fn decode(line: &str) -> Result<PodTag, TagError> {
        let fields: Vec<&str> = line.split('|').collect();
        match fields.first() {
            Some(&TAG_FORMAT) => {}
            Some(v) => {
                return Err(TagError(format!(
                    "unknown format {v:?} (this build reads {TAG_FORMAT})"
                )))
            }
            None => return Err(TagError("empty".into())),
        }
        if fields.len() != 8 {
            return Err(TagError(format!(
                "{} fields, want 8 (v1|uid|namespace|name|serviceaccount|node|containerid|ips)",
                fields.len()
            )));
        }
        let ips = if fields[7].is_empty() {
            Vec::new()
        } else {
            fields[7]
                .split(',')
                .map(|ip| {
                    ip.parse::<IpAddr>()
                        .map_err(|_| TagError(format!("ips: {ip:?} is not an IP address")))
                })
                .collect::<Result<_, _>>()?
        };
        let tag = PodTag {
            uid: unescape(fields[1], "uid")?,
            namespace: unescape(fields[2], "namespace")?,
            name: unescape(fields[3], "name")?,
            service_account: unescape(fields[4], "serviceaccount")?,
            node: unescape(fields[5], "node")?,
            container_id: unescape(fields[6], "containerid")?,
            ips,
        };
        if tag.uid.is_empty() {
            return Err(TagError("uid is empty".into()));
        }
        Ok(tag)
    }

    /// The comments to store: piece 0 for the table, then one per chain.
    /// Fails when the line needs more than `slots` pieces.
    pub(crate) fn pieces(&self, slots: usize) -> Result<Vec<String>, TagTooLong> {
        let line = self.encode();
        // The line is ASCII (escaped), so cutting at any byte is safe.
        let chunks: Vec<&str> = line
            .as_bytes()
            .chunks(PIECE_MAX)
            .map(|c| std::str::from_utf8(c).unwrap_or_default())
            .collect();
        if chunks.len() > slots {
            return Err(TagTooLong {
                uid: self.uid.clone(),
                len: line.len(),
                slots,
            });
        }
        let n = chunks.len();
        Ok(chunks
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{PIECE_PREFIX}{i}/{n}:{c}"))
            .collect())
    }
}

/// Splits a stored comment into (index, count, piece), or `None` when it is
/// not one of ours.
pub(crate) fn parse_piece(comment: &str) -> Option<Result<(usize, usize, &str), TagError>> {
    let rest = comment.strip_prefix(PIECE_PREFIX)?;
    let bad = || {
        TagError(format!(
            "malformed piece {comment:?} (want {PIECE_PREFIX}<i>/<n>:<text>, i < n <= {MAX_PIECES})"
        ))
    };
    let parsed = (|| {
        let (pos, piece) = rest.split_once(':')?;
        let (i, n) = pos.split_once('/')?;
        let (i, n): (usize, usize) = (i.parse().ok()?, n.parse().ok()?);
        (i < n && n <= MAX_PIECES).then_some((i, n, piece))
    })();
    Some(parsed.ok_or_else(bad))
}

/// Reassembles the line from the table's comment and the chains' comments.
pub(crate) fn assemble(
    table_comment: Option<&str>,
    chain_comments: &[String],
) -> Result<Option<PodTag>, TagError> {
    let Some(first) = table_comment.and_then(parse_piece) else {
        return Ok(None);
    };
    let (i, n, piece) = first?;
    if i != 0 {
        return Err(TagError(format!("the table holds piece {i}, want 0")));
    }
    // `parse_piece` bounds `n` by MAX_PIECES and `i` by `n`: the tag is
    // pod-writable, so nothing read from it sizes more than that.
    let mut pieces: [Option<&str>; MAX_PIECES] = [None; MAX_PIECES];
    pieces[0] = Some(piece);
    for c in chain_comments {
        if let Some(p) = parse_piece(c) {
            let (i, m, piece) = p?;
            if m != n {
                return Err(TagError(format!(
                    "a chain holds piece {i}/{m}, the table says {n} pieces"
                )));
            }
            let slot = pieces
                .get_mut(i)
                .ok_or_else(|| TagError(format!("piece {i} of {n} is out of range")))?;
            if slot.is_some() {
                return Err(TagError(format!("piece {i} of {n} is stored twice")));
            }
            *slot = Some(piece);
        }
    }
    let mut line = String::new();
    for (i, p) in pieces.iter().take(n).enumerate() {
        line.push_str(p.ok_or_else(|| TagError(format!("piece {i} of {n} is missing")))?);
    }
    PodTag::decode(&line).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> PodTag {
        PodTag {
            uid: "0c9f6a7e-1d2b-4c3d-8e9f-0a1b2c3d4e5f".into(),
            name: "web-7d9c|x".into(),
            namespace: "shop".into(),
            service_account: "web,sa%".into(),
            node: "node-1".into(),
            container_id: "abc123".into(),
            ips: vec!["10.244.1.2".parse().unwrap(), "fd00::2".parse().unwrap()],
        }
    }

    #[test]
    fn round_trip_with_escapes() {
        let t = tag();
        let line = t.encode();
        assert_eq!(
            line,
            "v1|0c9f6a7e-1d2b-4c3d-8e9f-0a1b2c3d4e5f|shop|web-7d9c%7Cx|web%2Csa%25|node-1|abc123|10.244.1.2,fd00::2"
        );
        assert_eq!(PodTag::decode(&line).unwrap(), t);
        let unicode = PodTag {
            name: "pödé\n".into(),
            ips: vec![],
            ..tag()
        };
        assert_eq!(PodTag::decode(&unicode.encode()).unwrap(), unicode);
    }

    #[test]
    fn pieces_reassemble_and_are_bounded() {
        let long = PodTag {
            name: "n".repeat(253),
            service_account: "s".repeat(253),
            ..tag()
        };
        let p = long.pieces(4).unwrap();
        assert_eq!(p.len(), 3);
        for piece in &p {
            // TLV: type, length, string, NUL.
            assert!(piece.len() + 3 <= NFT_USERDATA_MAX, "{}", piece.len());
        }
        assert!(p[0].starts_with("ringway-pod:0/3:v1|"));
        let got = assemble(Some(&p[0]), &[p[2].clone(), p[1].clone()]).unwrap();
        assert_eq!(got, Some(long.clone()));
        let e = assemble(Some(&p[0]), &[p[2].clone()]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "owner tag of table inet ringway is unreadable: piece 1 of 3 is missing"
        );
        let e = long.pieces(2).unwrap_err();
        assert!(
            e.to_string()
                .contains("needs 585 bytes, but the rule set stores at most 448"),
            "{e}"
        );
    }

    #[test]
    fn foreign_and_bad_tags() {
        assert_eq!(assemble(None, &[]).unwrap(), None);
        assert_eq!(assemble(Some("someone else's comment"), &[]).unwrap(), None);
        let e = assemble(Some("ringway-pod:0/1:v9|x"), &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "owner tag of table inet ringway is unreadable: unknown format \"v9\" (this build reads v1)"
        );
        let e = PodTag::decode("v1|u|ns|n|sa|node|c|10.0.0.300").unwrap_err();
        assert_eq!(e.0, "ips: \"10.0.0.300\" is not an IP address");
        let e = PodTag::decode("v1||ns|n|sa|node|c|").unwrap_err();
        assert_eq!(e.0, "uid is empty");
        let e = PodTag::decode("v1|u|n").unwrap_err();
        assert!(e.0.starts_with("3 fields, want 8"), "{e}");
        assert!(parse_piece("ringway-pod:3/2:x").unwrap().is_err());
    }

    /// The tag lives in the pod's own netns: a pod with CAP_NET_ADMIN writes
    /// whatever it likes there. No piece count may size an allocation or index
    /// past what the rule set can hold.
    #[test]
    fn adversarial_forged_piece_counts_are_refused_without_panic() {
        for forged in [
            "ringway-pod:0/18446744073709551615:x",
            "ringway-pod:0/4294967296:x",
            "ringway-pod:0/17:x",
            "ringway-pod:0/0:x",
            "ringway-pod:0/99999999999999999999999:x",
        ] {
            let e = assemble(Some(forged), &[]).unwrap_err();
            assert!(e.0.contains("malformed piece"), "{forged}: {e}");
        }
        // A chain's piece with an index past the table's count.
        let e = assemble(
            Some("ringway-pod:0/2:v1|u|ns|n|sa|node|c|"),
            &["ringway-pod:7/2:x".into()],
        )
        .unwrap_err();
        assert!(e.0.contains("malformed piece"), "{e}");
        // A well-formed count is still read.
        let t = PodTag {
            uid: "u".into(),
            ..PodTag::default()
        };
        let p = t.pieces(MAX_PIECES).unwrap();
        assert_eq!(assemble(Some(&p[0]), &[]).unwrap(), Some(t));
    }
}
