//! A network namespace's counters, read from a thread inside it: TCP's
//! (`/proc/net/snmp`, `/proc/net/netstat`) and conntrack's
//! (`/proc/net/stat/nf_conntrack`), for the profiles and the upgrade pass.

use ringway_testbed::ns::Netns;

/// The netns's TCP counters (/proc/net/snmp `Tcp:` and /proc/net/netstat
/// `TcpExt:`), read from a thread inside it.
pub fn tcp_counters(ns: &Netns) -> std::collections::BTreeMap<String, u64> {
    ns.run(|| {
        let mut m = std::collections::BTreeMap::new();
        for file in ["snmp", "netstat"] {
            let text = std::fs::read_to_string(format!("/proc/thread-self/net/{file}"))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                let mut n = names.split_whitespace();
                let mut v = values.split_whitespace();
                let (Some(prefix), Some(_)) = (n.next(), v.next()) else {
                    continue;
                };
                if prefix != "Tcp:" && prefix != "TcpExt:" {
                    continue;
                }
                for (k, val) in n.zip(v) {
                    if let Ok(val) = val.parse::<u64>() {
                        m.insert(k.to_string(), val);
                    }
                }
            }
        }
        m
    })
}

/// The TCP counters of `ns` (/proc/net/snmp and netstat) and its
/// conntrack statistics (`ct.` + name, summed over CPUs).
pub fn trouble_counters(ns: &Netns) -> std::collections::BTreeMap<String, u64> {
    let mut m = tcp_counters(ns);
    let ct = ns.run(|| std::fs::read_to_string("/proc/thread-self/net/stat/nf_conntrack"));
    if let Ok(text) = ct {
        let mut lines = text.lines();
        let names: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
        for l in lines {
            for (k, v) in names.iter().zip(l.split_whitespace()) {
                let Ok(v) = u64::from_str_radix(v, 16) else {
                    continue;
                };
                if *k == "entries" {
                    // The netns's whole table, on every CPU's line.
                    m.insert("ct.entries".into(), v);
                } else {
                    *m.entry(format!("ct.{k}")).or_default() += v;
                }
            }
        }
    }
    m
}

/// The counters that only move when something goes wrong (a SYN or a
/// segment resent, a queue full, a timestamp refused, a reset, conntrack
/// refusing or dropping), as `name +delta` for those that moved.
pub fn trouble_deltas(
    a: &std::collections::BTreeMap<String, u64>,
    b: &std::collections::BTreeMap<String, u64>,
) -> String {
    const WATCHED: &[&str] = &[
        "RetransSegs",
        "AttemptFails",
        "EstabResets",
        "OutRsts",
        "InErrs",
        "TCPSynRetrans",
        "TCPTimeouts",
        "ListenOverflows",
        "ListenDrops",
        "TCPReqQFullDrop",
        "TCPReqQFullDoCookies",
        "TCPBacklogDrop",
        "PAWSActive",
        "PAWSEstab",
        "TCPACKSkippedPAWS",
        "TCPACKSkippedSynRecv",
        "TCPACKSkippedTimeWait",
        "TCPChallengeACK",
        "TCPSYNChallenge",
        "TCPTimeWaitOverflow",
        "TWRecycled",
        "TCPAbortOnData",
        "TCPAbortOnClose",
        "TCPAbortOnTimeout",
        "TCPMigrateReqSuccess",
        "TCPMigrateReqFailure",
        "TCPRcvQDrop",
        "TCPZeroWindowDrop",
        "ct.invalid",
        "ct.insert_failed",
        "ct.drop",
        "ct.early_drop",
        "ct.clashres",
    ];
    WATCHED
        .iter()
        .filter_map(|k| {
            let d = b.get(*k)?.saturating_sub(*a.get(*k)?);
            (d > 0).then(|| format!("{k} +{d}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
