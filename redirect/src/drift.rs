//! How a pod's capture differs from its spec: [`Drift`], what verify
//! reports and what an apply that did not take carries in its error. Below
//! the crate's error type: errors, verify and the sysctl check name it, and
//! it names only the table (`nft::TABLE`).

use std::fmt;

use crate::nft::TABLE;

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
        /// The sysctl (`net.ipv4.tcp_migrate_req`,
        /// `net.netfilter.nf_conntrack_tcp_timeout_time_wait`).
        key: String,
        /// The value the capture sets (`1`), or its bound (`at most 30`).
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

#[cfg(test)]
mod tests {
    use super::*;

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
