//! Cross-check: the bundled load generator and the standard tools (iperf3,
//! sockperf, wrk against nginx, all from Debian: [`crate::tools`]) on the
//! same paths, in the same run, side by side, so a reader can reproduce the
//! headline figures with tools they already trust.
//!
//! Everything runs in the bench's own namespaces (`run_isolated`). Per
//! round and scenario (one fresh proxy for all of them), alternating
//! bundled and tool: one stream (`load::throughput` / `iperf3 -t`), 4
//! streams (`load::throughput` with 4 / `iperf3 -P 4`), 64 B closed-loop
//! ping-pong (`load::ping_pong` / `sockperf ping-pong --tcp -m 64
//! --full-rtt`), new connections/s (`load::conn_rate` / `wrk -t2 -c16` with
//! `Connection: close` against nginx). The figures are
//! [`CrossCheck`]'s, shared with the suite where it measures the same.

use std::collections::BTreeMap;
use std::path::Path as FsPath;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::bed::{self, next_port, Bed, Proxies};
use crate::config::Config;
use crate::figures::{CrossCheck, Figure, RatioKind};
use crate::host::{cpu_idle, cpus, machine_busy_seconds, progress};
use crate::load::{self, Path};
use crate::scenario;
use crate::stat::median;
use crate::tools::{self, Tools};

/// The scenarios the cross-check measures (keys of the catalogue).
pub const SCENARIOS: &[&str] = &["direct", "tproxy_2hop", "tproxy_fast", "hbone_1node"];

/// The standard tool that measures `f`.
pub const fn tool(f: CrossCheck) -> &'static str {
    match f {
        CrossCheck::Tput1Gbps => "iperf3 -t S",
        CrossCheck::Tput4Gbps => "iperf3 -P 4 -t S",
        CrossCheck::PingPongP50Us | CrossCheck::PingPongP99Us => {
            "sockperf pp --tcp -m 64 --full-rtt"
        }
        CrossCheck::ConnPerS => "wrk -t2 -c16 -H 'Connection: close' -> nginx",
        CrossCheck::CpuSPerGb => "iperf3 -t S (proxy /proc)",
    }
}

/// One scenario's figures: per figure, one value per round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    /// Scenario key.
    pub key: String,
    /// Scenario title.
    pub name: String,
    /// The bundled load generator's figures.
    pub bundled: BTreeMap<CrossCheck, Vec<f64>>,
    /// The standard tools' figures.
    pub tools: BTreeMap<CrossCheck, Vec<f64>>,
}

impl Row {
    /// Figure `f`'s value per round, by the standard tool or the bundled
    /// generator.
    fn rounds(&self, f: &CrossCheck, tool: bool) -> Option<&Vec<f64>> {
        if tool {
            self.tools.get(f)
        } else {
            self.bundled.get(f)
        }
    }
}

/// The cross-check's document (`crosscheck.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CrossCheckDoc {
    /// Rounds run.
    pub rounds: usize,
    /// Seconds per measurement.
    pub secs: f64,
    /// Tools found on the machine (name -> path).
    pub tools_found: BTreeMap<String, String>,
    /// Tools not installed (their columns are empty).
    pub tools_missing: Vec<String>,
    /// The scenarios, in order.
    pub rows: Vec<Row>,
    /// Measurements that failed.
    pub errors: Vec<String>,
    /// How the machine's idle CPUs wait ([`cpu_idle`]): on a VM it sets
    /// most of a 64 B round trip.
    #[serde(default)]
    pub cpu_idle: String,
}

/// A started scenario: the path the load runs on, its proxies, and the
/// next server port.
struct Started<'a> {
    path: &'a Path,
    proxies: &'a Proxies,
    port: &'a mut u16,
}

impl Started<'_> {
    /// The path on a fresh port.
    fn next(&mut self) -> Path {
        self.path.on_port(next_port(self.port))
    }
}

/// Appends `v` to figure `f`'s rounds.
fn put(m: &mut BTreeMap<CrossCheck, Vec<f64>>, f: CrossCheck, v: f64) {
    m.entry(f).or_default().push(v)
}

/// One round of the standard tools on `path` (those installed).
fn tools_round(
    tools: &Tools,
    scratch: &FsPath,
    secs: f64,
    on: &mut Started<'_>,
    row: &mut BTreeMap<CrossCheck, Vec<f64>>,
    t: &mut dyn FnMut(&str, Result<(), tools::ToolError>),
) {
    let proxies = on.proxies;
    if let Some(bin) = tools.get("iperf3") {
        for (f, n) in [(CrossCheck::Tput1Gbps, 1), (CrossCheck::Tput4Gbps, 4)] {
            let c0 = proxies.cpu();
            let r = tools::iperf3(bin, &on.next(), n, secs).map(|(g, bytes)| {
                put(row, f, g);
                if let (1, Some(c0), Some(c1)) = (n, c0, proxies.cpu()) {
                    put(row, CrossCheck::CpuSPerGb, (c1 - c0) / (bytes / 1e9));
                }
            });
            t(&format!("iperf3 -P {n}"), r);
        }
    }
    if let Some(bin) = tools.get("sockperf") {
        let r = tools::sockperf(bin, &on.next(), secs).map(|(p50, p99)| {
            put(row, CrossCheck::PingPongP50Us, p50);
            put(row, CrossCheck::PingPongP99Us, p99);
        });
        t("sockperf", r);
    }
    if let (Some(w), Some(n)) = (tools.get("wrk"), tools.get("nginx")) {
        let (c0, m0) = (proxies.cpu(), machine_busy_seconds());
        let t0 = std::time::Instant::now();
        let r = tools::wrk(w, n, scratch, &on.next(), secs).map(|rps| {
            put(row, CrossCheck::ConnPerS, rps);
            // How busy the machine was over wrk's run (nginx's start and
            // stop included), and the proxies' share: a rate held back by
            // idle CPUs is latency, one at full CPUs is cost.
            let wall = t0.elapsed().as_secs_f64() * cpus() as f64;
            let busy = machine_busy_seconds() - m0;
            let proxy = match (c0, proxies.cpu()) {
                (Some(a), Some(b)) => format!(", proxies {:.0}% of it", (b - a) / busy * 100.0),
                _ => String::new(),
            };
            progress(format!(
                "    wrk: {rps:.0} conn/s; machine busy {:.0}% of its CPUs over the run{proxy}",
                busy / wall * 100.0
            ));
        });
        t("wrk", r);
    }
}

/// One round of the bundled generator on `path`.
fn bundled_round(
    config: &Config,
    on: &mut Started<'_>,
    row: &mut BTreeMap<CrossCheck, Vec<f64>>,
    t: &mut dyn FnMut(&str, anyhow::Result<()>),
) {
    let proxies = on.proxies;
    let secs = config.secs;
    let dur = Duration::from_secs_f64(secs);
    for (f, n) in [(CrossCheck::Tput1Gbps, 1), (CrossCheck::Tput4Gbps, 4)] {
        let c0 = proxies.cpu();
        let r = load::throughput(&on.next(), n, dur).map(|tp| {
            put(row, f, tp.gbps());
            if let (1, Some(c0), Some(c1)) = (n, c0, proxies.cpu()) {
                put(
                    row,
                    CrossCheck::CpuSPerGb,
                    (c1 - c0) / (tp.bytes as f64 / 1e9),
                );
            }
        });
        t(&format!("bundled throughput {n}"), r);
    }
    let r = load::ping_pong(&on.next(), dur, (secs * 200_000.0) as u64).map(|l| {
        put(
            row,
            CrossCheck::PingPongP50Us,
            l.hist.value_at_quantile(0.5) as f64 / 1e3,
        );
        put(
            row,
            CrossCheck::PingPongP99Us,
            l.hist.value_at_quantile(0.99) as f64 / 1e3,
        );
    });
    t("bundled ping-pong", r);
    let r = load::conn_rate(
        &on.next(),
        config.conn_threads,
        dur,
        (secs * 100_000.0) as u64,
    )
    .map(|c| put(row, CrossCheck::ConnPerS, c.conns as f64 / c.secs));
    t("bundled connection rate", r);
}

/// Runs the cross-check inside the bench's namespaces (call inside
/// `run_isolated`).
pub fn run(config: &Config) -> anyhow::Result<CrossCheckDoc> {
    let tools = Tools::find();
    let bed = Bed::build()?;
    let scenarios: Vec<_> = SCENARIOS
        .iter()
        .map(|k| scenario::by_key(k).expect("a cross-check scenario is in the catalogue"))
        .collect();
    let mut doc = CrossCheckDoc {
        rounds: config.crosscheck_rounds,
        secs: config.secs,
        tools_found: tools
            .found
            .iter()
            .map(|(k, v)| (k.clone(), v.display().to_string()))
            .collect(),
        tools_missing: tools.missing.clone(),
        rows: scenarios
            .iter()
            .map(|s| Row {
                key: s.key.into(),
                name: s.name.into(),
                ..Row::default()
            })
            .collect(),
        errors: Vec::new(),
        cpu_idle: cpu_idle(),
    };
    let mut port = bed::PORT_BASE;
    for round in 0..config.crosscheck_rounds {
        for (i, sc) in scenarios.iter().enumerate() {
            progress(format!(
                "cross-check round {}/{}: {}",
                round + 1,
                config.crosscheck_rounds,
                sc.name
            ));
            let (path, mut proxies) = match bed::start(config, &bed, sc) {
                Ok(x) => x,
                Err(e) => {
                    doc.errors
                        .push(format!("round {}, {}: start: {e:#}", round + 1, sc.key));
                    continue;
                }
            };
            std::thread::sleep(config.settle);
            let row = &mut doc.rows[i];
            let mut errors = Vec::new();
            let mut failed = |what: &str, e: String| {
                progress(format!("  {what} failed: {e}"));
                errors.push(format!("round {}, {}, {what}: {e}", round + 1, sc.key));
            };
            let mut on = Started {
                path: &path,
                proxies: &proxies,
                port: &mut port,
            };
            // Alternate which goes first by round.
            for first_tool in [round % 2 == 1, round % 2 == 0] {
                if first_tool {
                    tools_round(
                        &tools,
                        &bed.scratch.0,
                        config.secs,
                        &mut on,
                        &mut row.tools,
                        &mut |what, r| {
                            if let Err(e) = r {
                                failed(what, e.to_string());
                            }
                        },
                    );
                } else {
                    bundled_round(config, &mut on, &mut row.bundled, &mut |what, r| {
                        if let Err(e) = r {
                            failed(what, format!("{e:#}"));
                        }
                    });
                }
            }
            doc.errors.extend(errors);
            for p in &mut proxies.0 {
                p.stop();
            }
        }
    }
    Ok(doc)
}

fn med(v: Option<&Vec<f64>>) -> Option<f64> {
    v.filter(|v| !v.is_empty()).map(|v| median(v))
}

/// The Markdown: per figure, the bundled and the tool's medians side by
/// side, each with its ratio to direct (added µs for latency); then each
/// round's own ratio to direct, for the figures given as ratios.
pub fn render(doc: &CrossCheckDoc) -> String {
    let mut s = String::new();
    s.push_str("## Cross-check with the standard tools\n\n");
    s.push_str(&format!(
        "Same namespaces, same proxies, same run: for each scenario one fresh proxy, then the bundled \
         generator and the tool alternately (order swapped every round); medians of {} rounds, {} s per \
         measurement. Bundled: `load::throughput`, `load::ping_pong` (closed loop, one connection), \
         `load::conn_rate`. Tools: {}.\n\n",
        doc.rounds,
        doc.secs,
        CrossCheck::ALL
            .iter()
            .map(|f| format!("{}: `{}`", f.key(), tool(*f)))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    if !doc.cpu_idle.is_empty() {
        s.push_str(&format!(
            "Machine idle: {} (on a VM, how idle vCPUs wait sets most of a 64 B round trip: compare \
             latencies only between runs that idle alike).\n\n",
            doc.cpu_idle
        ));
    }
    if !doc.tools_missing.is_empty() {
        s.push_str(&format!(
            "**Not installed: {}; their columns are empty** (`apt-get install -y iperf3 sockperf wrk nginx-light`).\n\n",
            doc.tools_missing.join(", ")
        ));
    }
    let direct = doc.rows.iter().find(|r| r.key == "direct");
    let fmt = |v: f64| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.2}")
        }
    };
    s.push_str("| measure | by |");
    for r in &doc.rows {
        s.push_str(&format!(" {} |", r.name));
    }
    s.push_str("\n| --- | --- |");
    for _ in &doc.rows {
        s.push_str(" --- |");
    }
    s.push('\n');
    for f in CrossCheck::ALL {
        let d = f.def();
        for (by, tool) in [("bundled", false), ("tool", true)] {
            let pick = |r: &Row| med(r.rounds(f, tool));
            let base = direct.and_then(pick);
            s.push_str(&format!("| {} ({}) | {by} |", d.title, d.unit));
            for r in &doc.rows {
                let cell = match (pick(r), base, f.vs_direct()) {
                    (None, _, _) => "—".to_string(),
                    (Some(m), Some(b), Some(RatioKind::Added)) if r.key != "direct" => {
                        format!("{} (+{:.1})", fmt(m), m - b)
                    }
                    (Some(m), Some(b), Some(RatioKind::Ratio)) if r.key != "direct" => {
                        format!("{} ({:.2}x)", fmt(m), m / b)
                    }
                    (Some(m), _, _) => fmt(m),
                };
                s.push_str(&format!(" {cell} |"));
            }
            s.push('\n');
        }
    }
    s.push_str(
        "\nRatios are to direct (`x`), added round trip to direct (`+µs`), computed from the medians above.\n",
    );
    s.push_str(&round_ratios(doc));
    if !doc.errors.is_empty() {
        s.push_str("\nFailed measurements:\n\n");
        for e in &doc.errors {
            s.push_str(&format!("- {e}\n"));
        }
    }
    s
}

/// Each round's own ratio to direct for the figures given as ratios: the
/// scenario's value over direct's from the same round, so a slow spell that
/// fell on one scenario's round shows as the spread it causes instead of
/// hiding in a ratio of medians taken from different rounds.
fn round_ratios(doc: &CrossCheckDoc) -> String {
    let Some(direct) = doc.rows.iter().find(|r| r.key == "direct") else {
        return String::new();
    };
    let mut lines = Vec::new();
    for f in CrossCheck::ALL {
        if f.vs_direct() != Some(RatioKind::Ratio) {
            continue;
        }
        for (by, tool) in [("bundled", false), ("tool", true)] {
            let Some(base) = direct.rounds(f, tool) else {
                continue;
            };
            for r in doc.rows.iter().filter(|r| r.key != "direct") {
                // Rounds are kept as measured, without their index: a
                // failed one shifts the rest, so only complete lists pair.
                let Some(v) = r.rounds(f, tool).filter(|v| v.len() == base.len()) else {
                    continue;
                };
                let ratios: Vec<f64> = v
                    .iter()
                    .zip(base)
                    .filter(|(_, b)| **b > 0.0)
                    .map(|(v, b)| v / b)
                    .collect();
                if ratios.is_empty() {
                    continue;
                }
                lines.push(format!(
                    "| {} ({}) | {by} | {} | {} | {:.3}–{:.3} |",
                    f.def().title,
                    r.name,
                    ratios
                        .iter()
                        .map(|x| format!("{x:.3}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    format_args!("{:.3}", median(&ratios)),
                    ratios.iter().cloned().fold(f64::INFINITY, f64::min),
                    ratios.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                ));
            }
        }
    }
    if lines.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n### Each round's ratio to direct\n\nThe scenario's value over direct's from the same round, in round order.\n\n\
         | measure (scenario) | by | per round | median | range |\n| --- | --- | --- | --- | --- |\n",
    );
    for l in lines {
        s.push_str(&l);
        s.push('\n');
    }
    s
}

/// Writes `crosscheck.json` and `crosscheck.md` to `out`; returns the Markdown.
pub fn write(out: &FsPath, doc: &CrossCheckDoc) -> anyhow::Result<String> {
    std::fs::create_dir_all(out)?;
    let md = render(doc);
    std::fs::write(
        out.join("crosscheck.json"),
        serde_json::to_string_pretty(doc)?,
    )?;
    std::fs::write(out.join("crosscheck.md"), &md)?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, tool: &[f64], bundled: &[f64]) -> Row {
        Row {
            key: key.into(),
            name: key.into(),
            bundled: BTreeMap::from([(CrossCheck::ConnPerS, bundled.to_vec())]),
            tools: BTreeMap::from([(CrossCheck::ConnPerS, tool.to_vec())]),
        }
    }

    /// Figures from the run on f39aaad: the ratio of medians (4,960 /
    /// 20,452 = 0.243) and each round's own ratio, which pairs each HBONE
    /// round with direct's of the same round.
    #[test]
    fn each_rounds_ratio_pairs_the_scenario_with_direct_of_the_same_round() {
        let doc = CrossCheckDoc {
            rounds: 3,
            secs: 2.0,
            rows: vec![
                row(
                    "direct",
                    &[18770.0, 20879.0, 20452.0],
                    &[21376.0, 22325.0, 21331.0],
                ),
                row(
                    "hbone_1node",
                    &[4960.0, 5152.0, 4954.0],
                    &[5114.0, 5155.0, 5177.0],
                ),
            ],
            ..CrossCheckDoc::default()
        };
        let md = render(&doc);
        assert!(
            md.contains("| 4960 (0.24x) |"),
            "the ratio of medians stays:\n{md}"
        );
        for (by, want) in [
            ("tool", "| 0.264, 0.247, 0.242 | 0.247 | 0.242–0.264 |"),
            ("bundled", "| 0.239, 0.231, 0.243 | 0.239 | 0.231–0.243 |"),
        ] {
            let line = md
                .lines()
                .find(|l| l.contains(&format!("(hbone_1node) | {by} |")))
                .unwrap_or_else(|| panic!("no per-round line by {by}:\n{md}"));
            assert!(line.contains(want), "{line}");
        }
        assert!(
            !md.contains("(direct) |"),
            "direct has no ratio to itself:\n{md}"
        );
    }

    /// A scenario with a failed round (fewer rounds than direct) gets no
    /// line: which round failed is not kept, so its rounds cannot be paired
    /// with direct's. Nor does a figure without direct's rounds.
    #[test]
    fn round_ratios_pair_only_complete_rounds() {
        let mut direct = row("direct", &[20000.0, 16000.0], &[]);
        direct.bundled.clear();
        let doc = CrossCheckDoc {
            rows: vec![
                direct,
                row("hbone_1node", &[4000.0], &[5000.0]),
                row("tproxy_fast", &[8000.0, 8000.0], &[8000.0]),
            ],
            ..CrossCheckDoc::default()
        };
        let md = render(&doc);
        assert!(
            md.contains("(tproxy_fast) | tool | 0.400, 0.500 | 0.450 | 0.400–0.500 |"),
            "{md}"
        );
        assert!(
            !md.contains("(hbone_1node) | tool"),
            "a failed round shifts the rest:\n{md}"
        );
        assert!(
            !md.contains("| bundled | 0."),
            "no bundled line without direct's:\n{md}"
        );
    }
}
