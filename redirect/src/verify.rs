//! Comparing what is programmed in a pod's network namespace with the spec.

use std::collections::HashMap;

use nix::errno::Errno;

use crate::abi::NF_ACCEPT;
use crate::drift::Drift;
use crate::error::RedirectError;
use crate::nft::{self, Chain, DumpedChain, DumpedRule, TABLE};
use crate::nl::DecodeError;
use crate::route::{self, Family};
use crate::socket::{NlError, NlSocket};
use crate::spec::CaptureSpec;

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
    let proto = |what: &str, e: DecodeError| RedirectError::Protocol {
        what: what.to_string(),
        detail: e.to_string(),
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
}
