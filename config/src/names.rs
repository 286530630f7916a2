//! Checks for the names that appear in a mesh (namespaces, service
//! accounts, trust domains, label keys and values), `*` globs, and CIDR
//! blocks, each with its typed error.

use std::fmt;
use std::net::IpAddr;

/// A name that is not valid where it appears (a namespace, a service
/// account, a trust domain, a label key or value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty where one is required.
    #[error("must not be empty")]
    Empty,
    /// It holds a character the kind of name does not allow.
    #[error("{value:?} is not a valid {what}: contains {found:?} (only {allowed} are allowed)")]
    Character {
        /// The name.
        value: String,
        /// The kind of name (`namespace`, `trust domain`, ...).
        what: String,
        /// The first character not allowed.
        found: String,
        /// The characters allowed, in words.
        allowed: &'static str,
    },
    /// A DNS label that starts or ends with `-`.
    #[error("{value:?} is not a valid {what}: it must start and end with a letter or digit")]
    LabelEdge {
        /// The name.
        value: String,
        /// The kind of name.
        what: String,
    },
    /// A DNS subdomain with a part that is empty or starts or ends with `-`.
    #[error("{value:?} is not a valid {what}: each dot-separated part must start and end with a letter or digit")]
    SubdomainPart {
        /// The name.
        value: String,
        /// The kind of name.
        what: String,
    },
    /// Longer than the kind of name allows.
    #[error("{value:?} is not a valid {what}: {len} characters is more than {max}")]
    TooLong {
        /// The name.
        value: String,
        /// The kind of name.
        what: String,
        /// Its length.
        len: usize,
        /// The longest allowed.
        max: usize,
    },
    /// A label value longer than 63 characters.
    #[error("{value:?}: {len} characters is more than 63")]
    LabelValueTooLong {
        /// The value.
        value: String,
        /// Its length.
        len: usize,
    },
    /// A label value with a character other than letters, digits, `-`, `_`
    /// and `.`.
    #[error(
        "{value:?} contains {found:?} (only letters, digits, \"-\", \"_\" and \".\" are allowed)"
    )]
    LabelValueCharacter {
        /// The value.
        value: String,
        /// The first character not allowed.
        found: String,
    },
    /// A label value that does not start and end with a letter or digit.
    #[error("{value:?} must start and end with a letter or digit")]
    LabelValueEdge {
        /// The value.
        value: String,
    },
    /// A label key (`[prefix/]name`) with an empty name.
    #[error("label key {key:?} has an empty name")]
    LabelKeyEmptyName {
        /// The key.
        key: String,
    },
    /// A label key whose name part is not a valid label value.
    #[error("label key name {0}")]
    LabelKeyName(Box<NameError>),
}

/// A string pattern (`*`, `prefix*`, `*suffix`) that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PatternError {
    /// The pattern is empty.
    #[error("must not be empty")]
    Empty,
    /// `*` appears more than once, or inside.
    #[error("{0:?}: \"*\" may appear once, at the start or at the end")]
    Star(String),
}

/// A CIDR block (`10.0.0.0/8`, `fd00::/8`, an address) that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// The address part is not an IP address.
    #[error("{text:?}: {addr:?} is not an IP address")]
    Address {
        /// The block as written.
        text: String,
        /// Its address part.
        addr: String,
    },
    /// The length part is not a whole number.
    #[error("{text:?}: {len:?} is not a prefix length")]
    Length {
        /// The block as written.
        text: String,
        /// Its length part.
        len: String,
    },
    /// The prefix is longer than the address.
    #[error("{text:?}: prefix length {len} is longer than {max}")]
    TooLong {
        /// The block as written.
        text: String,
        /// The prefix length.
        len: u32,
        /// The address's length in bits.
        max: u32,
    },
    /// An address and a prefix length ([`Cidr::from_prefix`]) whose length
    /// is longer than the address.
    #[error("{addr}/{len}: prefix length {len} is longer than {max}")]
    PrefixTooLong {
        /// The address.
        addr: IpAddr,
        /// The prefix length.
        len: u32,
        /// The address's length in bits.
        max: u32,
    },
    /// Bits below the prefix are set (and are refused, not cleared).
    #[error("{text:?}: host bits are set (the block is {network}/{len})")]
    HostBits {
        /// The block as written.
        text: String,
        /// The block it would be with the host bits cleared.
        network: IpAddr,
        /// The prefix length.
        len: u8,
    },
}

/// The first character of `s` that `ok` refuses, as a string.
fn first_bad(s: &str, ok: impl Fn(char) -> bool) -> Option<String> {
    s.chars().find(|c| !ok(*c)).map(|c| c.to_string())
}

/// A DNS-1123 label (a Kubernetes namespace): 1 to 63 lowercase letters,
/// digits and `-`, starting and ending with a letter or digit.
pub(crate) fn check_label(what: &str, s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(found) = first_bad(s, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
    }) {
        return Err(NameError::Character {
            value: s.to_owned(),
            what: what.to_owned(),
            found,
            allowed: "lowercase letters, digits and \"-\"",
        });
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(NameError::LabelEdge {
            value: s.to_owned(),
            what: what.to_owned(),
        });
    }
    too_long(what, s, 63)
}

fn too_long(what: &str, s: &str, max: usize) -> Result<(), NameError> {
    if s.len() > max {
        return Err(NameError::TooLong {
            value: s.to_owned(),
            what: what.to_owned(),
            len: s.len(),
            max,
        });
    }
    Ok(())
}

/// A DNS-1123 subdomain (a Kubernetes object name, a service account, a
/// host name): at most 253 characters, dot-separated parts of lowercase
/// letters, digits and `-`, each starting and ending with a letter or digit.
pub(crate) fn check_subdomain(what: &str, s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(found) = first_bad(s, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'
    }) {
        return Err(NameError::Character {
            value: s.to_owned(),
            what: what.to_owned(),
            found,
            allowed: "lowercase letters, digits, \"-\" and \".\"",
        });
    }
    for part in s.split('.') {
        if part.is_empty() || part.starts_with('-') || part.ends_with('-') {
            return Err(NameError::SubdomainPart {
                value: s.to_owned(),
                what: what.to_owned(),
            });
        }
    }
    too_long(what, s, 253)
}

/// A SPIFFE trust domain: lowercase letters, digits, `.`, `-` and `_`.
pub(crate) fn check_trust_domain(s: &str) -> Result<(), NameError> {
    const WHAT: &str = "trust domain";
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(found) = first_bad(s, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_')
    }) {
        return Err(NameError::Character {
            value: s.to_owned(),
            what: WHAT.to_owned(),
            found,
            allowed: "lowercase letters, digits, \".\", \"-\" and \"_\"",
        });
    }
    too_long(WHAT, s, 255)
}

/// A Kubernetes label value: empty, or at most 63 letters, digits, `-`,
/// `_` and `.`, starting and ending with a letter or digit.
pub(crate) fn check_label_value(s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Ok(());
    }
    if s.len() > 63 {
        return Err(NameError::LabelValueTooLong {
            value: s.to_owned(),
            len: s.len(),
        });
    }
    if let Some(found) = first_bad(s, |c| {
        c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
    }) {
        return Err(NameError::LabelValueCharacter {
            value: s.to_owned(),
            found,
        });
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(s.chars().next()) || !alnum(s.chars().last()) {
        return Err(NameError::LabelValueEdge {
            value: s.to_owned(),
        });
    }
    Ok(())
}

/// A Kubernetes label key: `[prefix/]name`, the prefix a DNS subdomain, the
/// name as a non-empty label value.
pub(crate) fn check_label_key(k: &str) -> Result<(), NameError> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        check_subdomain("label key prefix", p)?;
    }
    if name.is_empty() {
        return Err(NameError::LabelKeyEmptyName { key: k.to_owned() });
    }
    check_label_value(name).map_err(|e| NameError::LabelKeyName(Box::new(e)))
}

/// A string pattern of an authorization rule: exact, `*` (anything
/// present), `prefix*` or `*suffix`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StringMatch {
    /// `*`: any value, as long as there is one (an identity for principals).
    Any,
    /// The value itself.
    Exact(Box<str>),
    /// `prefix*`.
    Prefix(Box<str>),
    /// `*suffix`.
    Suffix(Box<str>),
}

impl StringMatch {
    /// Splits a pattern into its kind and literal part; `*` may appear only
    /// once, at the start or at the end.
    pub(crate) fn parse(s: &str) -> Result<StringMatch, PatternError> {
        if s.is_empty() {
            return Err(PatternError::Empty);
        }
        if s == "*" {
            return Ok(StringMatch::Any);
        }
        let stars = s.matches('*').count();
        let m = if stars == 0 {
            StringMatch::Exact(s.into())
        } else if stars == 1 && s.ends_with('*') {
            StringMatch::Prefix(s[..s.len() - 1].into())
        } else if stars == 1 && s.starts_with('*') {
            StringMatch::Suffix(s[1..].into())
        } else {
            return Err(PatternError::Star(s.to_owned()));
        };
        Ok(m)
    }

    /// The literal part (empty for [`StringMatch::Any`]).
    pub fn literal(&self) -> &str {
        match self {
            StringMatch::Any => "",
            StringMatch::Exact(s) | StringMatch::Prefix(s) | StringMatch::Suffix(s) => s,
        }
    }

    /// Whether `value` matches.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            StringMatch::Any => true,
            StringMatch::Exact(s) => value == &**s,
            StringMatch::Prefix(p) => value.starts_with(&**p),
            StringMatch::Suffix(x) => value.ends_with(&**x),
        }
    }

    /// Whether the concatenation of `pieces` matches, without building it.
    pub(crate) fn matches_pieces(&self, pieces: &[&str]) -> bool {
        match self {
            StringMatch::Any => true,
            StringMatch::Exact(s) => {
                pieces.iter().map(|p| p.len()).sum::<usize>() == s.len()
                    && starts_with_pieces(pieces, s.as_bytes())
            }
            StringMatch::Prefix(p) => starts_with_pieces(pieces, p.as_bytes()),
            StringMatch::Suffix(x) => ends_with_pieces(pieces, x.as_bytes()),
        }
    }
}

fn starts_with_pieces(pieces: &[&str], mut prefix: &[u8]) -> bool {
    for piece in pieces {
        let piece = piece.as_bytes();
        if prefix.len() <= piece.len() {
            return piece.starts_with(prefix);
        }
        if !prefix.starts_with(piece) {
            return false;
        }
        prefix = &prefix[piece.len()..];
    }
    prefix.is_empty()
}

fn ends_with_pieces(pieces: &[&str], mut suffix: &[u8]) -> bool {
    for piece in pieces.iter().rev() {
        let piece = piece.as_bytes();
        if suffix.len() <= piece.len() {
            return piece.ends_with(suffix);
        }
        if !suffix.ends_with(piece) {
            return false;
        }
        suffix = &suffix[..suffix.len() - piece.len()];
    }
    suffix.is_empty()
}

impl fmt::Display for StringMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StringMatch::Any => f.write_str("*"),
            StringMatch::Exact(s) => f.write_str(s),
            StringMatch::Prefix(p) => write!(f, "{p}*"),
            StringMatch::Suffix(x) => write!(f, "*{x}"),
        }
    }
}

/// An IPv4 or IPv6 address block (`10.0.0.0/8`, `fd00::/8`; a bare address
/// is a block of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    addr: IpAddr,
    prefix_len: u8,
}

impl Cidr {
    /// Parses `addr/len` or `addr`. Host bits must be zero; an IPv4-mapped
    /// IPv6 block (`::ffff:10.0.0.0/104`) becomes the IPv4 block it means.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        Cidr::read(s, false).map(|(c, _)| c)
    }

    /// As [`Cidr::parse`], but host bits are cleared instead of refused
    /// (`10.1.2.3/8` is `10.0.0.0/8`, as the reference reads a cluster
    /// policy's blocks); also tells whether any were set.
    #[cfg(feature = "kube")]
    pub(crate) fn parse_masked(s: &str) -> Result<(Cidr, bool), CidrError> {
        Cidr::read(s, true)
    }

    /// The block of `addr`/`prefix_len`, host bits cleared (as the
    /// reference reads a control plane's blocks). `Err` when the length is
    /// longer than the address.
    pub fn from_prefix(addr: IpAddr, prefix_len: u32) -> Result<Cidr, CidrError> {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(CidrError::PrefixTooLong {
                addr,
                len: prefix_len,
                max,
            });
        }
        Cidr::read(&format!("{addr}/{prefix_len}"), true).map(|(c, _)| c)
    }

    fn read(s: &str, mask: bool) -> Result<(Cidr, bool), CidrError> {
        let (addr_text, len_text) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| CidrError::Address {
            text: s.to_owned(),
            addr: addr_text.to_owned(),
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = match len_text {
            None => max,
            Some(l) => {
                let n: u8 = l
                    .parse()
                    .ok()
                    .filter(|_| l.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| CidrError::Length {
                        text: s.to_owned(),
                        len: l.to_owned(),
                    })?;
                if n > max {
                    return Err(CidrError::TooLong {
                        text: s.to_owned(),
                        len: n.into(),
                        max: max.into(),
                    });
                }
                n
            }
        };
        let network = Cidr { addr, prefix_len }.network();
        let masked = network != addr;
        if masked && !mask {
            return Err(CidrError::HostBits {
                text: s.to_owned(),
                network,
                len: prefix_len,
            });
        }
        if let IpAddr::V6(v6) = network {
            if let (Some(v4), true) = (v6.to_ipv4_mapped(), prefix_len >= 96) {
                let cidr = Cidr {
                    addr: IpAddr::V4(v4),
                    prefix_len: prefix_len - 96,
                };
                return Ok((cidr, masked));
            }
        }
        Ok((
            Cidr {
                addr: network,
                prefix_len,
            },
            masked,
        ))
    }

    /// The block's first address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        self.prefix_len
    }

    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => IpAddr::V4((u32::from(a) & mask32(self.prefix_len)).into()),
            IpAddr::V6(a) => IpAddr::V6((u128::from(a) & mask128(self.prefix_len)).into()),
        }
    }

    /// Whether `ip` is in the block; an IPv4-mapped IPv6 address counts as
    /// the IPv4 address it carries.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                (u32::from(net) ^ u32::from(ip)) & mask32(self.prefix_len) == 0
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                (u128::from(net) ^ u128::from(ip)) & mask128(self.prefix_len) == 0
            }
            _ => false,
        }
    }
}

fn mask32(len: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0)
}

fn mask128(len: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0)
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_parse_and_contains() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.255.3".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.0.1".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(!c.contains("fd00::1".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("255.255.255.255".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let all6 = Cidr::parse("::/0").unwrap();
        assert!(all6.contains("fd00::1".parse().unwrap()));
        let one = Cidr::parse("fd00::5").unwrap();
        assert_eq!(one.to_string(), "fd00::5/128");
        assert!(one.contains("fd00::5".parse().unwrap()));
        assert!(!one.contains("fd00::6".parse().unwrap()));
        let mapped = Cidr::parse("::ffff:10.0.0.0/104").unwrap();
        assert_eq!(mapped.to_string(), "10.0.0.0/8");
        assert_eq!(
            Cidr::parse("10.0.0.0/33").unwrap_err().to_string(),
            r#""10.0.0.0/33": prefix length 33 is longer than 32"#
        );
        assert_eq!(
            Cidr::parse("fd00::/129").unwrap_err().to_string(),
            r#""fd00::/129": prefix length 129 is longer than 128"#
        );
        assert_eq!(
            Cidr::parse("10.0.0.1/24").unwrap_err().to_string(),
            r#""10.0.0.1/24": host bits are set (the block is 10.0.0.0/24)"#
        );
        assert_eq!(
            Cidr::parse("10.0.0.0/+8").unwrap_err().to_string(),
            r#""10.0.0.0/+8": "+8" is not a prefix length"#
        );
    }

    #[test]
    fn piecewise_matching_equals_concatenated_matching() {
        let pieces = ["spiffe://", "td", "/ns/", "a", "/sa/", "b"];
        let whole: String = pieces.concat();
        let patterns = [
            "*",
            "spiffe://td/ns/a/sa/b",
            "spiffe://td/ns/a/sa/bb",
            "spiffe://td/ns/a/sa/",
            "spiffe://td/ns/a/sa/*",
            "spiffe://td/ns/*",
            "spiffe://t*",
            "spiffe://td/ns/a/sa/b*",
            "spiffe://td/ns/a/sa/bc*",
            "*/sa/b",
            "*a/sa/b",
            "*b",
            "*spiffe://td/ns/a/sa/b",
            "*xspiffe://td/ns/a/sa/b",
            "*/ns/x/sa/b",
        ];
        for p in patterns {
            let m = StringMatch::parse(p).unwrap();
            assert_eq!(m.matches_pieces(&pieces), m.matches(&whole), "{p}");
        }
        assert!(StringMatch::parse("a*b").is_err());

        // Random pieces and patterns over a tiny alphabet, so that near
        // misses (same length, different bytes) are common.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n) as usize
        };
        let word = |next: &mut dyn FnMut(u64) -> usize| -> String {
            (0..next(4)).map(|_| ['a', 'b', '/'][next(3)]).collect()
        };
        for _ in 0..20_000 {
            let pieces: Vec<String> = (0..1 + next(5)).map(|_| word(&mut next)).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let whole = pieces.concat();
            let literal = match next(3) {
                0 => whole[..next(whole.len() as u64 + 1)].to_owned(),
                1 => whole[next(whole.len() as u64 + 1)..].to_owned(),
                _ => word(&mut next) + &word(&mut next),
            };
            let pattern = match next(3) {
                0 => format!("{literal}*"),
                1 => format!("*{literal}"),
                _ => literal,
            };
            let Ok(m) = StringMatch::parse(&pattern) else {
                continue;
            };
            assert_eq!(
                m.matches_pieces(&refs),
                m.matches(&whole),
                "{pattern:?} {refs:?}"
            );
        }
        assert!(StringMatch::parse("*a*").is_err());
    }
}
