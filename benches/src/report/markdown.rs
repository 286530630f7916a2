//! `report.md`: the machine and the run's parameters, the summary, HBONE
//! beside direct and plaintext, one table per group of figures with their
//! spreads, scrape impact, pod churn, failed measurements, notes and
//! targets. Rendered from the document alone, so `check` can render it
//! again and compare.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::doc::{Report, ScenarioDoc};
use crate::figures::{Churn, Datapath, Figure, RatioKind, Scrape, ScrapeRatio, VsDirect};
use crate::stat::{fmt, Stat};

/// A median as printed: `—` when the figure is absent or not finite.
pub fn stat_cell<F: Figure>(f: Option<&Stat>, figure: F) -> String {
    match f.and_then(|f| f.median.finite()) {
        Some(m) => fmt(m, figure.def().decimals),
        None => "—".into(),
    }
}

/// A spread (min–max) as printed.
pub fn stat_spread<F: Figure>(f: Option<&Stat>, figure: F) -> String {
    let d = figure.def().decimals;
    match f.map(|f| (f.min.finite(), f.max.finite())) {
        Some((Some(lo), Some(hi))) => format!("{}–{}", fmt(lo, d), fmt(hi, d)),
        _ => "—".into(),
    }
}

/// `figure`'s median in `figures`, as printed.
fn cell_of<F: Figure>(figures: &BTreeMap<F, Stat>, figure: F) -> String {
    stat_cell(figures.get(&figure), figure)
}

fn cell(s: &ScenarioDoc, figure: Datapath) -> String {
    cell_of(&s.figures, figure)
}

fn spread(s: &ScenarioDoc, figure: Datapath) -> String {
    stat_spread(s.figures.get(&figure), figure)
}

/// A ratio (`0.52x`) or an added latency (`+12.3`) as printed.
pub fn ratio_cell(s: &ScenarioDoc, v: VsDirect) -> String {
    let (_, kind) = v.basis();
    match s.vs_direct.get(&v).and_then(|n| n.finite()) {
        Some(x) if kind == RatioKind::Added => format!("{x:+.1}"),
        Some(x) => format!("{x:.2}x"),
        None => "—".into(),
    }
}

fn x_cell(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:.2}x"),
        None => "—".into(),
    }
}

/// The HBONE table's scenarios: direct and plaintext beside HBONE.
const HBONE_ROWS: &[&str] = &[
    "direct",
    "tproxy_fast",
    "tproxy_2hop",
    "hbone_1node",
    "direct_2node",
    "tproxy_2node",
    "hbone_2node",
];

/// The Markdown report.
pub fn to_markdown(doc: &Report) -> String {
    let mut m = String::new();
    let run = &doc.run;
    let scen = &doc.scenarios;
    let [small, large] = run.idle_connections;
    let _ = writeln!(m, "# ringway benchmark report ({} run)\n", run.label);
    let _ = writeln!(
        m,
        "Median of {} rounds alternating the scenarios; spread is min–max over the rounds. \
         Pod -> pod on one virtual node (veth + bridge), or from a pod of node 1 to a pod of node 2 \
         (two virtual nodes joined by a veth, one proxy each), inside private namespaces. \
         Proxy: `{}` as a child process (its CPU from /proc/<pid>/task/*/schedstat, its RSS from \
         /proc/<pid>/status; with two proxies, their sum). Wall time {:.0} s.\n",
        run.rounds, run.proxy_binary, run.wall_seconds
    );
    let _ = writeln!(m, "| machine | |\n| --- | --- |");
    for (k, v) in &doc.machine {
        let _ = writeln!(m, "| {k} | {v} |");
    }
    let fl = &doc.fd_limit;
    let _ = writeln!(
        m,
        "| RLIMIT_NOFILE (soft / hard / fs.nr_open) | {} / {} / {}; CAP_SYS_RESOURCE {} |",
        fl.soft,
        fl.hard,
        fl.nr_open,
        if fl.cap_sys_resource {
            "held"
        } else if fl.cap_sys_resource_in_bounding_set {
            "not held"
        } else {
            "not in the bounding set"
        }
    );
    let _ = writeln!(
        m,
        "\nParameters: throughput {} s per run, N = {} streams; latency {} req/s of 64 B over {} connections for {} s (open loop); \
         connection rate {} concurrent connections (2 event-driven client threads) for {} s; idle connections {small} and {large} (the large count lowered per scenario \
         when the fd limit cannot hold it); scraper {} scrapes/s; churn {} pods.\n",
        run.seconds_per_throughput_run, run.streams, run.latency_rate_rps, run.latency_connections,
        run.latency_seconds, run.conn_threads, run.conn_seconds, run.scrape_rate, run.churn_pods
    );

    let _ = writeln!(m, "## Summary (medians)\n");
    let _ = writeln!(
        m,
        "Ratios and added latency are to `direct (no proxy)` for one-node scenarios and to \
         `direct, two nodes (no proxy)` for two-node ones.\n"
    );
    let _ = writeln!(m, "| scenario | one stream Gbit/s | vs direct | N streams Gbit/s | vs direct | p50 µs | added p50 | p99 µs | added p99 | conn/s | vs direct | proxy CPU-s/GB | proxy KiB/idle conn |");
    let _ = writeln!(
        m,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for s in scen {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            cell(s, Datapath::Tput1Gbps),
            ratio_cell(s, VsDirect::Tput1X),
            cell(s, Datapath::TputNGbps),
            ratio_cell(s, VsDirect::TputNX),
            cell(s, Datapath::LatP50Us),
            ratio_cell(s, VsDirect::AddedP50Us),
            cell(s, Datapath::LatP99Us),
            ratio_cell(s, VsDirect::AddedP99Us),
            cell(s, Datapath::ConnPerS),
            ratio_cell(s, VsDirect::ConnX),
            cell(s, Datapath::CpuSPerGb),
            cell(s, Datapath::KibPerIdleConn),
        );
    }

    let _ = writeln!(
        m,
        "\n## HBONE next to direct and plaintext\n\n\
         HBONE on one node runs with `sameNodeFastPath: false` in the proxy's YAML, so pod -> pod \
         leaves as an HTTP/2 CONNECT over mutual TLS to the destination pod's 15008 on the same proxy \
         (as the reference mesh is measured); its plaintext counterpart is `TPROXY, both hops`. \
         Between nodes each node has its own proxy. Same medians as above.\n"
    );
    let _ = writeln!(
        m,
        "| scenario | one stream Gbit/s | vs direct | {n} streams Gbit/s | vs direct | new connections/s | vs direct | proxy CPU-s/GB (one stream) | proxy CPU-s/GB ({n} streams) | added p50 µs | proxy CPU-s per 1k requests | proxy KiB/idle conn |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        n = run.streams
    );
    for s in HBONE_ROWS.iter().filter_map(|k| doc.scenario(k)) {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            cell(s, Datapath::Tput1Gbps),
            ratio_cell(s, VsDirect::Tput1X),
            cell(s, Datapath::TputNGbps),
            ratio_cell(s, VsDirect::TputNX),
            cell(s, Datapath::ConnPerS),
            ratio_cell(s, VsDirect::ConnX),
            cell(s, Datapath::CpuSPerGb),
            cell(s, Datapath::CpuSPerGbN),
            ratio_cell(s, VsDirect::AddedP50Us),
            cell(s, Datapath::CpuSPer1kReq),
            cell(s, Datapath::KibPerIdleConn),
        );
    }

    let table = |m: &mut String, title: &str, figures: &[Datapath]| {
        let _ = writeln!(m, "\n## {title}\n");
        let mut head = String::from("| scenario |");
        let mut sep = String::from("| --- |");
        for f in figures {
            let d = f.def();
            let t = d
                .title
                .replace("(small)", &format!("{small}"))
                .replace("(large)", &format!("{large}"));
            let _ = write!(head, " {t} ({}) | spread |", d.unit);
            sep.push_str(" --- | --- |");
        }
        let _ = writeln!(m, "{head}\n{sep}");
        for s in scen {
            let mut row = format!("| {} |", s.name);
            for f in figures {
                let _ = write!(row, " {} | {} |", cell(s, *f), spread(s, *f));
            }
            let _ = writeln!(m, "{row}");
        }
    };
    table(
        &mut m,
        "Throughput (bytes counted exactly: clients' writes = server's reads)",
        &[
            Datapath::Tput1Gbps,
            Datapath::TputNGbps,
            Datapath::GenCpuSPerGb,
        ],
    );
    let mut latency = Datapath::LATENCY.to_vec();
    latency.extend([Datapath::LatRps, Datapath::GenLateP99Us]);
    table(
        &mut m,
        "Latency at a fixed request rate (64 B request/reply, from the scheduled send)",
        &latency,
    );
    table(
        &mut m,
        "Connection rate (connect + 1 B request/reply + close)",
        &[Datapath::ConnPerS, Datapath::ConnFailures],
    );
    table(
        &mut m,
        "Proxy CPU",
        &[
            Datapath::CpuSPerGb,
            Datapath::CpuSPerGbN,
            Datapath::CpuSPer1kReq,
            Datapath::CpuUsPerConn,
        ],
    );
    table(
        &mut m,
        "Proxy memory (idle connections each proven by a 1 B exchange)",
        &[
            Datapath::RssIdleMib,
            Datapath::RssSmallMib,
            Datapath::IdleLargeN,
            Datapath::RssLargeMib,
            Datapath::KibPerIdleConn,
            Datapath::FdsPerIdleConn,
            Datapath::RssTargetIdleMib,
            Datapath::RssAfterLoadMib,
            Datapath::RssAfterLoadOverIdleMib,
            Datapath::RssAnonAfterLoadOverIdleMib,
            Datapath::RssHeldAfterLoadMib,
            Datapath::RssRestAfterLoadPct,
        ],
    );

    let sc = &doc.scrape;
    let _ = writeln!(
        m,
        "\n## Scrape impact (metrics and admin are served by the control thread)\n\n\
         Default scenario (TPROXY fast path), the fixed-rate latency run twice with the same proxy: \
         alone, and while a scraper does `GET /metrics` (15020) then `GET /config_dump` (15000) {} times \
         a second (order alternating by round). Ratios from the printed medians.\n",
        run.scrape_rate
    );
    let _ = writeln!(
        m,
        "| figure | without scraper | spread | with scraper | spread | with / without |\n| --- | --- | --- | --- | --- | --- |"
    );
    for row in ScrapeRatio::ALL {
        let (off, on) = row.pair();
        let _ = writeln!(
            m,
            "| {} ({}) | {} | {} | {} | {} | {} |",
            row.def().title,
            off.def().unit,
            cell_of(&sc.figures, off),
            stat_spread(sc.figures.get(&off), off),
            cell_of(&sc.figures, on),
            stat_spread(sc.figures.get(&on), on),
            x_cell(sc.with_vs_without.get(row).and_then(|v| v.finite())),
        );
    }
    let _ = writeln!(m, "\n| scraper | median | spread |\n| --- | --- | --- |");
    for f in Scrape::SCRAPER {
        let d = f.def();
        let _ = writeln!(
            m,
            "| {} ({}) | {} | {} |",
            d.title,
            d.unit,
            cell_of(&sc.figures, f),
            stat_spread(sc.figures.get(&f), f)
        );
    }

    let _ = writeln!(
        m,
        "\n## Pod churn\n\n\
         The same bare pod network namespaces (lo only), enrolled two ways. *Command line*: given to a \
         fresh proxy as `--pod` flags; time from process start to every pod's listeners open, RSS against \
         a proxy with no pods. *CNI ADD*: one ADD after another through the plugin's code \
         (`ringway_cni::run`, what the `ringway-cni` binary runs) over the node agent's socket; the agent \
         applies the capture rules in the pod and hands its netns to a fresh proxy over ZDS, and the ADD \
         returns once the proxy acked with the pod's listeners open. Each ADD is timed from the call to \
         its result.\n"
    );
    let _ = writeln!(m, "| figure | median | spread |\n| --- | --- | --- |");
    for f in Churn::ALL {
        let _ = writeln!(m, "{}", churn_row(doc, *f));
    }

    if !doc.errors.is_empty() {
        let _ = writeln!(m, "\n## Failed measurements ({})\n", doc.errors.len());
        for e in &doc.errors {
            let _ = writeln!(m, "- {}", e.replace('|', "/"));
        }
    }
    if !doc.notes.is_empty() {
        let _ = writeln!(m, "\n## Notes\n");
        for e in &doc.notes {
            let _ = writeln!(m, "- {}", e.replace('|', "/"));
        }
    }

    let _ = writeln!(
        m,
        "\n## Targets (issue 6; one-node scenarios; reported, never asserted)\n"
    );
    let _ = writeln!(
        m,
        "| target | scenario | target | measured | met? |\n| --- | --- | --- | --- | --- |"
    );
    for t in &doc.targets {
        let op = if t.at_most { "≤" } else { "≥" };
        let _ = writeln!(
            m,
            "| {} | {} | {op} {} | {} | {} |",
            t.target,
            t.scenario,
            t.limit.0,
            fmt(t.measured.0, 3),
            if t.met { "yes" } else { "**no**" },
        );
    }
    let _ = writeln!(
        m,
        "\nCharts: `throughput.svg`, `latency.svg`, `scrape.svg`, `churn.svg`. Every figure of every round: `results.json`."
    );
    m
}

/// A churn figure's row, as printed.
pub fn churn_row(doc: &Report, f: Churn) -> String {
    let d = f.def();
    let s = doc.churn.get(&f);
    format!(
        "| {} ({}) | {} | {} |",
        d.title,
        d.unit,
        stat_cell(s, f),
        stat_spread(s, f)
    )
}
