//! Comparing what is programmed in a pod's network namespace with the spec.

use std::collections::HashMap;
use std::fmt;

use nix::errno::Errno;

use crate::abi::NF_ACCEPT;
use crate::error::RedirectError;
use crate::nft::{self, Chain, DumpedChain, DumpedRule, TABLE};
use crate::nl::{NlError, NlSocket};
use crate::route::{self, Family};
use crate::CaptureSpec;

/// One way in which a pod's capture differs from the spec. `Display` says
/// exactly what is missing or different.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Drift {
    /// The nft table is missing (so are all its chains and rules).
    TableMissing,
    /// A chain of the rule set is missing.
    ChainMissing {
        /// Chain name.
        chain: String,
    },
    /// A chain exists with another type, hook, priority or policy.
    ChainDiffers {
        /// Chain name.
        chain: String,
        /// What the spec wants (`type route hook output priority -150 policy accept`).
        want: String,
        /// What is there.
        found: String,
    },
    /// A chain that is not part of the rule set sits in our table.
    ForeignChain {
        /// Chain name.
        chain: String,
        /// Its type/hook/priority.
        found: String,
    },
    /// A rule is missing.
    RuleMissing {
        /// Chain name.
        chain: String,
        /// 1-based rule number in the chain.
        number: usize,
        /// The rule, in nft syntax.
        rule: String,
    },
    /// A rule carrying our tag for this position has other expressions.
    RuleDiffers {
        /// Chain name.
        chain: String,
        /// 1-based rule number in the chain.
        number: usize,
        /// The wanted rule, in nft syntax.
        rule: String,
        /// How it differs.
        detail: String,
    },
    /// A rule without our tag (added by someone else).
    ForeignRule {
        /// Chain name.
        chain: String,
        /// 1-based position in the chain.
        position: usize,
        /// Kernel rule handle.
        handle: u64,
    },
    /// A second copy of one of our rules, or a rule of ours that the spec
    /// does not contain.
    ExtraRule {
        /// Chain name.
        chain: String,
        /// 1-based position in the chain.
        position: usize,
        /// Kernel rule handle.
        handle: u64,
        /// Its tag.
        tag: String,
    },
    /// All rules are there but in another order.
    RulesOutOfOrder {
        /// Chain name.
        chain: String,
    },
    /// The policy-routing rule is missing.
    IpRuleMissing {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The rule (`ip rule fwmark 0x111/0xfff lookup 133`).
        rule: String,
    },
    /// The policy-routing rule exists, but not at the wanted priority.
    IpRulePriority {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The rule.
        rule: String,
        /// Priorities found.
        found: Vec<u32>,
        /// The wanted priority.
        want: u32,
    },
    /// The local default route of the capture table is missing.
    RouteMissing {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The route (`ip route local 0.0.0.0/0 dev lo table 133`).
        route: String,
    },
    /// The loopback interface is down.
    LoopbackDown,
    /// A sysctl of the pod's namespace has another value than the capture needs.
    SysctlDiffers {
        /// The sysctl (`net.ipv4.tcp_migrate_req`).
        key: String,
        /// The value the capture sets.
        want: String,
        /// The value found.
        found: String,
    },
    /// The table carries no owner tag ([`crate::verify_for`]).
    OwnerMissing {
        /// UID of the pod that should own the capture.
        want_uid: String,
    },
    /// The table's owner tag names another pod, or the same pod differently.
    OwnerDiffers {
        /// The wanted tag ([`crate::PodTag::encode`]).
        want: String,
        /// The stored tag.
        found: String,
    },
    /// The table's owner tag cannot be read back.
    OwnerUnreadable {
        /// What is wrong with it.
        detail: String,
    },
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::TableMissing => write!(f, "nft table inet {TABLE} missing"),
            Drift::ChainMissing { chain } => write!(f, "nft chain inet {TABLE} {chain} missing"),
            Drift::ChainDiffers { chain, want, found } => write!(
                f,
                "nft chain inet {TABLE} {chain} differs: want {want}, found {found}"
            ),
            Drift::ForeignChain { chain, found } => {
                write!(f, "foreign nft chain inet {TABLE} {chain} ({found})")
            }
            Drift::RuleMissing {
                chain,
                number,
                rule,
            } => write!(f, "rule {number} of chain {chain} missing ({rule})"),
            Drift::RuleDiffers {
                chain,
                number,
                rule,
                detail,
            } => write!(
                f,
                "rule {number} of chain {chain} differs: {detail} (want: {rule})"
            ),
            Drift::ForeignRule {
                chain,
                position,
                handle,
            } => write!(
                f,
                "foreign rule at position {position} of chain {chain} (handle {handle}, no ringway tag)"
            ),
            Drift::ExtraRule {
                chain,
                position,
                handle,
                tag,
            } => write!(
                f,
                "extra rule at position {position} of chain {chain} (handle {handle}, tag {tag})"
            ),
            Drift::RulesOutOfOrder { chain } => {
                write!(f, "rules of chain {chain} are out of order")
            }
            Drift::IpRuleMissing { family, rule } => write!(f, "{rule} ({family}) missing"),
            Drift::IpRulePriority {
                family,
                rule,
                found,
                want,
            } => write!(
                f,
                "{rule} ({family}) has priority {found:?}, want {want}"
            ),
            Drift::RouteMissing { family, route } => write!(f, "{route} ({family}) missing"),
            Drift::LoopbackDown => write!(f, "link lo is down"),
            Drift::SysctlDiffers { key, want, found } => {
                write!(f, "sysctl {key} is {found}, want {want}")
            }
            Drift::OwnerMissing { want_uid } => {
                write!(f, "table inet {TABLE} has no owner tag (want pod {want_uid})")
            }
            Drift::OwnerDiffers { want, found } => write!(
                f,
                "table inet {TABLE} owner tag differs: want {want}, found {found}"
            ),
            Drift::OwnerUnreadable { detail } => {
                write!(f, "table inet {TABLE} owner tag is unreadable: {detail}")
            }
        }
    }
}

fn chain_want(c: &Chain) -> String {
    format!("{} policy accept", c.header())
}

fn chain_found(d: &DumpedChain) -> String {
    let policy = match d.policy {
        Some(p) if p == NF_ACCEPT as u32 => " policy accept",
        Some(_) => " policy drop",
        None => "",
    };
    format!("{}{policy}", d.header())
}

/// Splits one of our tags into (chain, number).
fn tag_position(tag: &str) -> Option<(&str, usize)> {
    let mut it = tag.split(':');
    let (_, _, chain, number) = (it.next()?, it.next()?, it.next()?, it.next()?);
    Some((chain, number.parse().ok()?))
}

/// Compares the rules of one chain.
pub(crate) fn compare_chain(c: &Chain, dumped: &[&DumpedRule]) -> Vec<Drift> {
    let mut drift = Vec::new();
    let tags: Vec<String> = c
        .rules
        .iter()
        .enumerate()
        .map(|(i, r)| r.tag(c.name, i + 1))
        .collect();
    let mut seen = vec![false; c.rules.len()];
    let mut order = Vec::new();
    for (pos, d) in dumped.iter().enumerate() {
        let position = pos + 1;
        let Some(tag) = d.tag.as_deref().filter(|t| nft::is_our_tag(t)) else {
            drift.push(Drift::ForeignRule {
                chain: c.name.to_string(),
                position,
                handle: d.handle,
            });
            continue;
        };
        if let Some(k) = tags.iter().position(|t| t == tag) {
            if seen[k] {
                drift.push(Drift::ExtraRule {
                    chain: c.name.to_string(),
                    position,
                    handle: d.handle,
                    tag: tag.to_string(),
                });
                continue;
            }
            seen[k] = true;
            order.push(k);
            if !d.matches(&c.rules[k]) {
                drift.push(Drift::RuleDiffers {
                    chain: c.name.to_string(),
                    number: k + 1,
                    rule: c.rules[k].desc.clone(),
                    detail: format!(
                        "its expressions were changed (found {})",
                        d.exprs
                            .iter()
                            .map(|(n, _)| n.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                });
            }
            continue;
        }
        match tag_position(tag) {
            Some((ch, n)) if ch == c.name && (1..=c.rules.len()).contains(&n) && !seen[n - 1] => {
                seen[n - 1] = true;
                order.push(n - 1);
                drift.push(Drift::RuleDiffers {
                    chain: c.name.to_string(),
                    number: n,
                    rule: c.rules[n - 1].desc.clone(),
                    detail: format!("it was programmed from another spec or version (tag {tag})"),
                });
            }
            _ => drift.push(Drift::ExtraRule {
                chain: c.name.to_string(),
                position,
                handle: d.handle,
                tag: tag.to_string(),
            }),
        }
    }
    for (k, s) in seen.iter().enumerate() {
        if !s {
            drift.push(Drift::RuleMissing {
                chain: c.name.to_string(),
                number: k + 1,
                rule: c.rules[k].desc.clone(),
            });
        }
    }
    if drift.is_empty() && order.windows(2).any(|w| w[0] > w[1]) {
        drift.push(Drift::RulesOutOfOrder {
            chain: c.name.to_string(),
        });
    }
    drift
}

/// Checks the nft table, chains and rules.
pub(crate) fn nft_drift(nf: &mut NlSocket, chains: &[Chain]) -> Result<Vec<Drift>, RedirectError> {
    match nf.get(&nft::msg_get_table()) {
        Ok(_) => {}
        Err(NlError::Kernel(Errno::ENOENT)) => return Ok(vec![Drift::TableMissing]),
        Err(e) => return Err(e.context(format!("reading table inet {TABLE}"), false)),
    }
    let proto = |what: &str, detail: String| RedirectError::Protocol {
        what: what.to_string(),
        detail,
    };
    let what_chains = format!("listing the chains of table inet {TABLE}");
    let dumped_chains: Vec<DumpedChain> = nf
        .dump(&nft::msg_dump_chains())
        .map_err(|e| e.context(what_chains.clone(), false))?
        .iter()
        .map(|m| nft::parse_chain(m).map_err(|d| proto(&what_chains, d)))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|c| c.table == TABLE)
        .collect();
    let what_rules = format!("listing the rules of table inet {TABLE}");
    let dumped_rules: Vec<DumpedRule> = nf
        .dump(&nft::msg_dump_rules())
        .map_err(|e| e.context(what_rules.clone(), false))?
        .iter()
        .map(|m| nft::parse_rule(m).map_err(|d| proto(&what_rules, d)))
        .collect::<Result<_, _>>()?;
    let mut by_chain: HashMap<&str, Vec<&DumpedRule>> = HashMap::new();
    for r in &dumped_rules {
        by_chain.entry(r.chain.as_str()).or_default().push(r);
    }

    let mut drift = Vec::new();
    for c in chains {
        let Some(d) = dumped_chains.iter().find(|d| d.name == c.name) else {
            drift.push(Drift::ChainMissing {
                chain: c.name.to_string(),
            });
            continue;
        };
        let (want, found) = (chain_want(c), chain_found(d));
        if want != found {
            drift.push(Drift::ChainDiffers {
                chain: c.name.to_string(),
                want,
                found,
            });
        }
        let rules = by_chain.remove(c.name).unwrap_or_default();
        drift.extend(compare_chain(c, &rules));
    }
    for d in &dumped_chains {
        if !chains.iter().any(|c| c.name == d.name) {
            drift.push(Drift::ForeignChain {
                chain: d.name.clone(),
                found: chain_found(d),
            });
        }
    }
    Ok(drift)
}

/// Checks `lo`, the ip rules and the local routes of `families`.
pub(crate) fn routing_drift(
    rt: &mut NlSocket,
    spec: &CaptureSpec,
    families: &[Family],
) -> Result<Vec<Drift>, RedirectError> {
    let mut drift = Vec::new();
    if !route::lo_is_up(rt)? {
        drift.push(Drift::LoopbackDown);
    }
    for &f in families {
        let ours: Vec<u32> = route::dump_rules(rt, f)?
            .iter()
            .filter(|r| r.is_ours(spec))
            .map(|r| r.priority)
            .collect();
        if ours.is_empty() {
            drift.push(Drift::IpRuleMissing {
                family: f.label(),
                rule: route::rule_desc(spec),
            });
        } else if !ours.contains(&spec.rule_priority) {
            drift.push(Drift::IpRulePriority {
                family: f.label(),
                rule: route::rule_desc(spec),
                found: ours,
                want: spec.rule_priority,
            });
        }
        if !route::dump_routes(rt, f)?.iter().any(|r| r.is_ours(spec)) {
            drift.push(Drift::RouteMissing {
                family: f.label(),
                route: route::route_desc(spec, f),
            });
        }
    }
    Ok(drift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nft::{Chain, ChainKind, Expr, Rule};

    fn chain() -> Chain {
        let r = |n: u32| Rule {
            desc: format!("rule {n}"),
            exprs: vec![Expr::MetaLoad(n), Expr::Verdict(NF_ACCEPT)],
        };
        Chain {
            name: "output",
            kind: ChainKind::Route,
            hook: 3,
            priority: -150,
            rules: vec![r(3), r(4), r(5)],
        }
    }

    fn dumped(c: &Chain, k: usize, handle: u64) -> DumpedRule {
        let r = &c.rules[k];
        DumpedRule {
            chain: c.name.into(),
            handle,
            tag: Some(r.tag(c.name, k + 1)),
            exprs: r
                .exprs
                .iter()
                .map(|e| {
                    let mut a = crate::nl::Attrs::canonical();
                    e.encode_data(&mut a);
                    (e.name().to_string(), a.bytes().to_vec())
                })
                .collect(),
        }
    }

    #[test]
    fn identical_chain_has_no_drift() {
        let c = chain();
        let d: Vec<_> = (0..3).map(|k| dumped(&c, k, k as u64 + 10)).collect();
        let refs: Vec<_> = d.iter().collect();
        assert!(compare_chain(&c, &refs).is_empty());
    }

    #[test]
    fn missing_foreign_changed_extra_and_order() {
        let c = chain();
        let d0 = dumped(&c, 0, 10);
        let d2 = dumped(&c, 2, 12);
        let missing = compare_chain(&c, &[&d0, &d2]);
        assert_eq!(
            missing.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            vec!["rule 2 of chain output missing (rule 4)"]
        );

        let mut foreign = dumped(&c, 1, 11);
        foreign.tag = None;
        let drift = compare_chain(&c, &[&d0, &foreign, &d2]);
        assert!(drift.contains(&Drift::ForeignRule {
            chain: "output".into(),
            position: 2,
            handle: 11
        }));

        let mut changed = dumped(&c, 1, 11);
        changed.exprs[0] = dumped(&c, 2, 0).exprs[0].clone();
        let drift = compare_chain(&c, &[&d0, &changed, &d2]);
        assert_eq!(drift.len(), 1);
        assert!(drift[0]
            .to_string()
            .starts_with("rule 2 of chain output differs"));

        let mut stale = dumped(&c, 1, 11);
        stale.tag = Some("ringway:v0:output:2:0000".into());
        let drift = compare_chain(&c, &[&d0, &stale, &d2]);
        assert!(matches!(drift[0], Drift::RuleDiffers { number: 2, .. }));

        let d1 = dumped(&c, 1, 11);
        let dup = dumped(&c, 1, 13);
        let drift = compare_chain(&c, &[&d0, &d1, &d2, &dup]);
        assert!(matches!(drift[0], Drift::ExtraRule { position: 4, .. }));

        let drift = compare_chain(&c, &[&d0, &d2, &d1]);
        assert_eq!(
            drift,
            vec![Drift::RulesOutOfOrder {
                chain: "output".into()
            }]
        );
    }

    #[test]
    fn drift_messages() {
        assert_eq!(
            Drift::ChainMissing {
                chain: "prerouting".into()
            }
            .to_string(),
            "nft chain inet ringway prerouting missing"
        );
        assert_eq!(
            Drift::IpRuleMissing {
                family: "IPv6",
                rule: "ip rule fwmark 0x111/0xfff lookup 133".into()
            }
            .to_string(),
            "ip rule fwmark 0x111/0xfff lookup 133 (IPv6) missing"
        );
        assert_eq!(
            Drift::TableMissing.to_string(),
            "nft table inet ringway missing"
        );
    }
}
