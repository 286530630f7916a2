//! What prost leaves out: the field numbers, in a message's wire bytes,
//! that the hand-written struct does not name. prost skips such fields
//! silently, so a condition a newer control plane adds to a policy's
//! match would vanish, and the match would be read as if it were not
//! there: a DENY that no longer denies. [`unknown_in_authorization`] finds
//! them, level by level, for the reader to err toward deny.

use std::collections::BTreeMap;

/// The unknown field numbers of one `istio.security.Authorization`, by
/// where they sit (indexes as in the decoded message's lists).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct UnknownFields {
    /// In the `Authorization` itself.
    pub policy: Vec<u32>,
    /// In `rules[r]`.
    pub rules: BTreeMap<usize, Vec<u32>>,
    /// In `rules[r].clauses[c]`.
    pub clauses: BTreeMap<(usize, usize), Vec<u32>>,
    /// In `rules[r].clauses[c].matches[m]`.
    pub matches: BTreeMap<(usize, usize, usize), Vec<u32>>,
}

impl UnknownFields {
    /// Nothing unknown anywhere.
    pub fn is_empty(&self) -> bool {
        self.policy.is_empty()
            && self.rules.is_empty()
            && self.clauses.is_empty()
            && self.matches.is_empty()
    }
}

/// `Authorization`: name 1, namespace 2, scope 3, action 4, rules 5, dry_run 6.
const AUTHORIZATION_FIELDS: &[u32] = &[1, 2, 3, 4, 5, 6];
const AUTHORIZATION_RULES: u32 = 5;
/// `Rule`: clauses 1.
const RULE_FIELDS: &[u32] = &[1];
const RULE_CLAUSES: u32 = 1;
/// `Clause`: matches 2.
const CLAUSE_FIELDS: &[u32] = &[2];
const CLAUSE_MATCHES: u32 = 2;
/// `Match`: namespaces 1 ... not_service_accounts 12.
const MATCH_FIELDS: &[u32] = &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];

/// The unknown fields of the `Authorization` encoded in `bytes` (bytes
/// prost decoded: a walk that fails stops where it failed, with what it
/// found so far).
pub fn unknown_in_authorization(bytes: &[u8]) -> UnknownFields {
    let mut out = UnknownFields::default();
    let mut r = 0;
    for (field, value) in Fields(bytes) {
        if !AUTHORIZATION_FIELDS.contains(&field) {
            out.policy.push(field);
        } else if let (AUTHORIZATION_RULES, Some(rule)) = (field, value) {
            walk_rule(rule, r, &mut out);
            r += 1;
        }
    }
    out
}

fn walk_rule(bytes: &[u8], r: usize, out: &mut UnknownFields) {
    let mut c = 0;
    for (field, value) in Fields(bytes) {
        if !RULE_FIELDS.contains(&field) {
            out.rules.entry(r).or_default().push(field);
        } else if let (RULE_CLAUSES, Some(clause)) = (field, value) {
            walk_clause(clause, r, c, out);
            c += 1;
        }
    }
}

fn walk_clause(bytes: &[u8], r: usize, c: usize, out: &mut UnknownFields) {
    let mut m = 0;
    for (field, value) in Fields(bytes) {
        if !CLAUSE_FIELDS.contains(&field) {
            out.clauses.entry((r, c)).or_default().push(field);
        } else if let (CLAUSE_MATCHES, Some(matched)) = (field, value) {
            for (field, _) in Fields(matched) {
                if !MATCH_FIELDS.contains(&field) {
                    out.matches.entry((r, c, m)).or_default().push(field);
                }
            }
            m += 1;
        }
    }
}

/// The fields of a message's bytes: number, and the bytes of a
/// length-delimited one. Ends at the end, or at the first thing it cannot
/// read.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = (u32, Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let key = varint(&mut self.0)?;
        let field = u32::try_from(key >> 3).ok()?;
        let value = match key & 7 {
            0 => {
                varint(&mut self.0)?;
                None
            }
            1 => {
                self.0 = self.0.get(8..)?;
                None
            }
            2 => {
                let len = usize::try_from(varint(&mut self.0)?).ok()?;
                let (v, rest) = (self.0.get(..len)?, self.0.get(len..)?);
                self.0 = rest;
                Some(v)
            }
            5 => {
                self.0 = self.0.get(4..)?;
                None
            }
            // Groups (3, 4) are not in proto3; 6 and 7 do not exist.
            _ => {
                self.0 = &[];
                return None;
            }
        };
        Some((field, value))
    }
}

/// A base-128 varint from the front of `b` (at most 10 bytes).
fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(i)?;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *b = &b[i + 1..];
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::security::{self, string_match::MatchType};
    use prost::Message;

    fn policy() -> security::Authorization {
        let m = security::Match {
            namespaces: vec![security::StringMatch {
                match_type: Some(MatchType::Exact("front".into())),
            }],
            destination_ports: vec![80, 8080],
            ..Default::default()
        };
        security::Authorization {
            name: "p".into(),
            namespace: "shop".into(),
            scope: 1,
            action: 1,
            rules: vec![
                security::Rule {
                    clauses: vec![security::Clause {
                        matches: vec![m.clone()],
                    }],
                },
                security::Rule {
                    clauses: vec![
                        security::Clause {
                            matches: vec![m.clone(), m],
                        },
                        security::Clause { matches: vec![] },
                    ],
                },
            ],
            dry_run: true,
        }
    }

    /// A field `n` holding `payload` (length-delimited).
    fn ld(n: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        prost::encoding::encode_key(n, prost::encoding::WireType::LengthDelimited, &mut v);
        prost::encoding::encode_varint(payload.len() as u64, &mut v);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn every_field_this_proxy_reads_is_known() {
        let bytes = policy().encode_to_vec();
        assert_eq!(unknown_in_authorization(&bytes), UnknownFields::default());
    }

    #[test]
    fn unknown_fields_are_found_where_they_sit() {
        let p = policy();
        // A match of rules[1].clauses[0] with a field 13 (a condition
        // of a newer schema) and a varint field 14.
        let mut m = p.rules[1].clauses[0].matches[1].encode_to_vec();
        m.extend(ld(13, b"x"));
        prost::encoding::encode_key(14, prost::encoding::WireType::Varint, &mut m);
        prost::encoding::encode_varint(300, &mut m);
        let mut clause = ld(2, &p.rules[1].clauses[0].matches[0].encode_to_vec());
        clause.extend(ld(2, &m));
        clause.extend(ld(9, b"")); // a clause-level field
        let mut rule1 = ld(1, &clause);
        rule1.extend(ld(1, &[]));
        let mut bytes = security::Authorization {
            rules: vec![p.rules[0].clone()],
            ..p.clone()
        }
        .encode_to_vec();
        bytes.extend(ld(5, &rule1));
        // A fixed64 field at the top.
        prost::encoding::encode_key(20, prost::encoding::WireType::SixtyFourBit, &mut bytes);
        bytes.extend([0u8; 8]);
        // prost reads it whole, as if the unknown fields were not there.
        let decoded = security::Authorization::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded, p);
        let u = unknown_in_authorization(&bytes);
        assert_eq!(u.policy, [20]);
        assert!(u.rules.is_empty());
        assert_eq!(u.clauses, BTreeMap::from([((1, 0), vec![9])]));
        assert_eq!(u.matches, BTreeMap::from([((1, 0, 1), vec![13, 14])]));
        assert!(!u.is_empty());
    }

    #[test]
    fn adversarial_truncated_bytes_end_the_walk() {
        let bytes = policy().encode_to_vec();
        for cut in 0..bytes.len() {
            // Never panics; finds nothing that is not there.
            let u = unknown_in_authorization(&bytes[..cut]);
            assert!(u.is_empty(), "cut at {cut}: {u:?}");
        }
        assert!(unknown_in_authorization(&[0xff; 12]).is_empty());
    }
}
