//! The flood scenario's report: its typed document (`flood.json`: every
//! round, the medians), the Markdown and the check that it is complete.
//! Reported, never asserted: the flood / quiet p99 ratio stands beside the
//! issue's 2x bound.

use std::collections::BTreeMap;
use std::path::Path as FsPath;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::config::FloodConfig;

/// The neighbour's figures in one state (quiet or flooded).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Neighbour {
    /// Round trip of 64 B at a fixed rate (open loop), µs.
    pub p50_us: f64,
    /// 90th percentile, µs.
    pub p90_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
    /// Requests completed per second (the asked rate unless the path lagged).
    pub achieved_rps: f64,
    /// One stream's throughput, Gbit/s.
    pub tput_gbps: f64,
    /// The proxy's CPU (all threads) during the two runs / their wall
    /// time: cores it used.
    pub proxy_cores: f64,
    /// The datapath workers' run-queue delay (runnable, waiting for a CPU:
    /// `schedstat`), summed over the `ringway-wk-N` worker threads, ms per second
    /// of the latency run (not the throughput run, which saturates the
    /// cores by design): the scheduling share of the neighbour's tail.
    pub worker_wait_ms_per_s: f64,
    /// CPU of the proxy's `ringway-tls-hs` thread (pre-auth TLS, when the
    /// proxy has one) during the latency run / its wall time: 0 when
    /// handshakes run on the workers.
    pub handshake_cores: f64,
    /// p99 of how late the neighbour's load generator sent, µs. Each of its
    /// connections waits for a reply before the next request, so a reply
    /// later than the send interval makes the next sends late too: this is
    /// the generator's own scheduling delay plus that carry-over.
    pub gen_lateness_p99_us: f64,
}

/// The proxy's resources at one moment.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Resources {
    /// VmRSS, MiB.
    pub rss_mib: f64,
    /// Open fds.
    pub fds: usize,
}

/// What the flood generators did, summed over the processes.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct FloodCounts {
    /// Connections attempted (the burst and the reopenings).
    pub attempted: u64,
    /// Connections of the burst established (TCP).
    pub opened: u64,
    /// Connects or ClientHello writes that failed.
    pub failed: u64,
    /// Connections opened again after the proxy closed one.
    pub reopened: u64,
    /// Connections the proxy closed or reset while the flood ran.
    pub closed_by_proxy: u64,
    /// Connections the generators still held when stopped.
    pub held_at_end: u64,
    /// Seconds the burst took (slowest process).
    pub burst_secs: f64,
    /// Whether the generators were pinned to their CPU.
    pub pinned: bool,
    /// The generators' CPU seconds (all processes), read before they stop.
    pub cpu_s: f64,
    /// The first failure, if any.
    pub first_error: Option<String>,
}

/// Connections opened together to the victim's 15008 that never start TLS,
/// each closed at its own pre-authentication deadline (jittered within
/// `[handshakeTimeout / 2, handshakeTimeout]`): how far apart they closed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeadlineSpread {
    /// Silent connections opened together.
    pub conns: usize,
    /// The proxy's `handshakeTimeout`, s.
    pub timeout_s: f64,
    /// The shortest life, from before its connect to its close, s.
    pub shortest_s: f64,
    /// The longest, s.
    pub longest_s: f64,
    /// `longest_s - shortest_s`: 0 when they all expire in one burst.
    pub spread_s: f64,
    /// Connections the proxy had not closed after `handshakeTimeout` plus
    /// 10 s.
    pub not_closed: usize,
}

/// One round.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodRound {
    /// The neighbour, no flood.
    pub quiet: Neighbour,
    /// The neighbour while the flood runs.
    pub flood: Neighbour,
    /// The proxy before the flood (after the quiet measurements).
    pub before: Resources,
    /// The proxy's largest RSS and fds sampled while the flood ran.
    pub during: Resources,
    /// The proxy once the flood stopped and its fds settled (bounded wait).
    pub after: Resources,
    /// The generators' counts.
    pub counts: FloodCounts,
    /// `ringway_hbone_refused_total{reason}` at the end of the round.
    pub refused: BTreeMap<String, f64>,
    /// Silent connections opened together before the flood: how spread
    /// their closes were.
    pub deadlines: DeadlineSpread,
}

/// Medians over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodSummary {
    /// Median quiet neighbour figures.
    pub quiet: Neighbour,
    /// Median flooded neighbour figures.
    pub flood: Neighbour,
    /// flood p99 / quiet p99, from the medians above.
    pub p99_ratio: f64,
    /// flood throughput / quiet throughput, from the medians above.
    pub tput_ratio: f64,
    /// Whether `p99_ratio` is at most 2 (the bound; reported, not asserted).
    pub p99_within_2x: bool,
    /// Median RSS before / during / after, MiB.
    pub rss_mib: [f64; 3],
    /// Median fds before / during / after.
    pub fds: [f64; 3],
    /// Median refused counts by reason.
    pub refused: BTreeMap<String, f64>,
}

/// The flood report (`flood.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FloodReport {
    /// The run's size.
    pub config: FloodConfig,
    /// The proxy binary measured.
    pub proxy_bin: String,
    /// The proxy's pre-auth limits in force (defaults of `hbone:`).
    pub limits: BTreeMap<String, String>,
    /// Every round.
    pub rounds: Vec<FloodRound>,
    /// Medians; `None` when no round completed.
    pub summary: Option<FloodSummary>,
    /// Measurements that failed.
    pub errors: Vec<String>,
    /// Machine description.
    pub machine: Vec<(String, String)>,
}

/// Median of the rounds' values of `f`.
fn med(rounds: &[FloodRound], f: impl Fn(&FloodRound) -> f64) -> f64 {
    crate::stat::median(&rounds.iter().map(f).collect::<Vec<_>>())
}

/// The medians over `rounds`; `None` without a round.
pub fn summarize(rounds: &[FloodRound]) -> Option<FloodSummary> {
    if rounds.is_empty() {
        return None;
    }
    let neighbour = |g: fn(&FloodRound) -> &Neighbour| Neighbour {
        p50_us: med(rounds, |r| g(r).p50_us),
        p90_us: med(rounds, |r| g(r).p90_us),
        p99_us: med(rounds, |r| g(r).p99_us),
        max_us: med(rounds, |r| g(r).max_us),
        achieved_rps: med(rounds, |r| g(r).achieved_rps),
        tput_gbps: med(rounds, |r| g(r).tput_gbps),
        proxy_cores: med(rounds, |r| g(r).proxy_cores),
        worker_wait_ms_per_s: med(rounds, |r| g(r).worker_wait_ms_per_s),
        handshake_cores: med(rounds, |r| g(r).handshake_cores),
        gen_lateness_p99_us: med(rounds, |r| g(r).gen_lateness_p99_us),
    };
    let quiet = neighbour(|r| &r.quiet);
    let flood = neighbour(|r| &r.flood);
    let p99_ratio = flood.p99_us / quiet.p99_us;
    let reasons: std::collections::BTreeSet<&String> =
        rounds.iter().flat_map(|r| r.refused.keys()).collect();
    Some(FloodSummary {
        p99_ratio,
        tput_ratio: flood.tput_gbps / quiet.tput_gbps,
        p99_within_2x: p99_ratio <= 2.0,
        rss_mib: [
            med(rounds, |r| r.before.rss_mib),
            med(rounds, |r| r.during.rss_mib),
            med(rounds, |r| r.after.rss_mib),
        ],
        fds: [
            med(rounds, |r| r.before.fds as f64),
            med(rounds, |r| r.during.fds as f64),
            med(rounds, |r| r.after.fds as f64),
        ],
        refused: reasons
            .into_iter()
            .map(|k| {
                (
                    k.clone(),
                    med(rounds, |r| r.refused.get(k).copied().unwrap_or(0.0)),
                )
            })
            .collect(),
        quiet,
        flood,
    })
}

/// The report as Markdown: the neighbour quiet vs flooded (medians), the
/// proxy's resources, what was refused, and every round.
pub fn render(r: &FloodReport) -> String {
    let mut s = format!(
        "# hbone_preauth_flood ({})\n\n{} rounds; per round {} connections to one pod's 15008 \
         (half idle TCP, half a ClientHello then silence) from {} source addresses of one pod, \
         in {} generator process(es) pinned to the last CPU, every one the proxy closes opened \
         again (at most {} times the count); the neighbour pair's HBONE latency ({} req/s over {} \
         connections, 64 B, open loop) and one stream's throughput, {} s each, quiet then \
         flooded. Proxy: `{}`. Pre-auth limits: {}.\n\n",
        r.config.label,
        r.config.rounds,
        r.config.conns,
        r.config.sources,
        r.config.procs,
        r.config.reopen,
        r.config.rps,
        r.config.lat_conns,
        r.config.secs,
        r.proxy_bin,
        r.limits
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(m) = &r.summary {
        s.push_str(
            "| neighbour (medians) | p50 µs | p90 µs | p99 µs | max µs | req/s | Gbit/s | proxy cores | \
             workers' run-queue wait ms/s | handshake thread cores | generator send lateness p99 µs |\n",
        );
        s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
        for (k, n) in [("quiet", &m.quiet), ("flood", &m.flood)] {
            s.push_str(&format!(
                "| {k} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} | {:.1} | {:.2} | {:.0} |\n",
                n.p50_us,
                n.p90_us,
                n.p99_us,
                n.max_us,
                n.achieved_rps,
                n.tput_gbps,
                n.proxy_cores,
                n.worker_wait_ms_per_s,
                n.handshake_cores,
                n.gen_lateness_p99_us
            ));
        }
        s.push_str(&format!(
            "\np99 flood / quiet: **{:.2}x** ({} the issue's 2x); throughput flood / quiet: {:.2}x.\n\n",
            m.p99_ratio,
            if m.p99_within_2x { "within" } else { "over" },
            m.tput_ratio
        ));
        s.push_str(&format!(
            "Proxy RSS before / during (max) / after: {:.1} / {:.1} / {:.1} MiB; \
             fds {:.0} / {:.0} / {:.0}.\n\nRefused (`ringway_hbone_refused_total`, medians): {}.\n\n",
            m.rss_mib[0],
            m.rss_mib[1],
            m.rss_mib[2],
            m.fds[0],
            m.fds[1],
            m.fds[2],
            if m.refused.is_empty() {
                "none".to_string()
            } else {
                m.refused
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ));
    }
    s.push_str(
        "| round | quiet p50/p99 µs | flood p50/p99 µs | quiet / flood Gbit/s | RSS MiB b/d/a | fds b/d/a | \
         opened / failed / reopened / closed by proxy / held | generator CPU-s |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (i, x) in r.rounds.iter().enumerate() {
        s.push_str(&format!(
            "| {} | {:.0} / {:.0} | {:.0} / {:.0} | {:.2} / {:.2} | {:.1} / {:.1} / {:.1} | {} / {} / {} | {} / {} / {} / {} / {} | {:.1} |\n",
            i + 1,
            x.quiet.p50_us,
            x.quiet.p99_us,
            x.flood.p50_us,
            x.flood.p99_us,
            x.quiet.tput_gbps,
            x.flood.tput_gbps,
            x.before.rss_mib,
            x.during.rss_mib,
            x.after.rss_mib,
            x.before.fds,
            x.during.fds,
            x.after.fds,
            x.counts.opened,
            x.counts.failed,
            x.counts.reopened,
            x.counts.closed_by_proxy,
            x.counts.held_at_end,
            x.counts.cpu_s,
        ));
    }
    s.push_str(
        "\nPre-authentication deadlines: silent connections opened together to the victim's \
         15008 before the flood, each closed at its own jittered deadline within \
         [handshakeTimeout / 2, handshakeTimeout].\n\n\
         | round | connections | handshakeTimeout s | shortest s | longest s | spread s | not closed |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for (i, x) in r.rounds.iter().enumerate() {
        let d = &x.deadlines;
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {} |\n",
            i + 1,
            d.conns,
            d.timeout_s,
            d.shortest_s,
            d.longest_s,
            d.spread_s,
            d.not_closed
        ));
    }
    for e in &r.errors {
        s.push_str(&format!("\nFailed: {e}\n"));
    }
    s
}

/// Problems that make the report incomplete (never the numbers): a failed
/// round, a missing summary, a figure not finite.
pub fn check(r: &FloodReport) -> Vec<String> {
    let mut p: Vec<String> = r.errors.iter().map(|e| format!("failed: {e}")).collect();
    if r.rounds.len() != r.config.rounds {
        p.push(format!(
            "{} of {} rounds measured",
            r.rounds.len(),
            r.config.rounds
        ));
    }
    for (i, x) in r.rounds.iter().enumerate() {
        let d = &x.deadlines;
        let figs = [d.timeout_s, d.shortest_s, d.longest_s, d.spread_s];
        if d.conns == 0 || figs.iter().any(|v| !v.is_finite()) {
            p.push(format!(
                "round {}: deadline spread not measured: {d:?}",
                i + 1
            ));
        }
    }
    match &r.summary {
        None => p.push("no summary".into()),
        Some(m) => {
            let figs = [
                m.quiet.p50_us,
                m.quiet.p99_us,
                m.flood.p50_us,
                m.flood.p99_us,
                m.quiet.tput_gbps,
                m.flood.tput_gbps,
                m.p99_ratio,
                m.tput_ratio,
                m.quiet.worker_wait_ms_per_s,
                m.flood.worker_wait_ms_per_s,
                m.quiet.handshake_cores,
                m.flood.handshake_cores,
                m.flood.gen_lateness_p99_us,
            ];
            if figs.iter().any(|v| !v.is_finite()) {
                p.push(format!("a figure is not finite: {figs:?}"));
            }
            if (m.flood.p99_us / m.quiet.p99_us - m.p99_ratio).abs() > 1e-9 {
                p.push("p99 ratio does not follow from the medians".into());
            }
        }
    }
    p
}

/// Writes `flood.json` and `flood.md` to `out`; returns the Markdown.
pub fn write(out: &FsPath, r: &FloodReport) -> anyhow::Result<String> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("flood.json"), serde_json::to_string_pretty(r)?)?;
    let md = render(r);
    std::fs::write(out.join("flood.md"), &md)?;
    Ok(md)
}
