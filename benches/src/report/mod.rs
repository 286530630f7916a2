//! The suite's report: the typed document (`results.json`: every figure of
//! every round, medians, spreads, ratios to direct, targets; [`doc`]),
//! built here from a run's [`Results`]; its Markdown ([`markdown`]) and
//! charts ([`charts`]); the targets it reports and never asserts
//! ([`targets`]); and [`check`], which verifies a written report is
//! complete and self-consistent without ever judging the numbers. Above
//! the figure model and the raw results; below the suite, which writes it.

pub mod charts;
pub mod check;
pub mod doc;
pub mod markdown;
pub mod targets;

use std::collections::BTreeMap;
use std::path::Path;

pub use self::check::check;
use self::doc::{vs_direct, with_vs_without};
pub use self::doc::{FdLimitDoc, Report, ReportError, Run, ScenarioDoc, ScrapeDoc, TargetRow};
pub use self::markdown::to_markdown;
use crate::figures::{Churn, Datapath, Figure, Figures, Scrape, ScrapeRatio, VsDirect};
use crate::results::Results;
use crate::stat::{Num, Stat};

/// Every figure of kind `F` over the rounds of a section.
fn section<F: Figure>(rounds: &[Figures<F>], which: impl Iterator<Item = F>) -> BTreeMap<F, Stat> {
    which
        .map(|f| {
            let v: Vec<f64> = rounds.iter().map(|r| r.value(f)).collect();
            (f, Stat::of(&v))
        })
        .collect()
}

/// Builds the report document of a run: every figure of every round,
/// medians, spreads, ratios, targets.
pub fn to_report(r: &Results) -> Report {
    let mut scenarios = Vec::new();
    for (i, sc) in r.scenarios.iter().enumerate() {
        let proxied = sc.kind.proxied();
        let stats = |s: usize| -> BTreeMap<Datapath, Stat> {
            Datapath::ALL
                .iter()
                .copied()
                .filter(|f| f.applies(proxied))
                .map(|f| (f, Stat::of(&r.series(s, f))))
                .collect()
        };
        let figures = stats(i);
        let mut ratios = BTreeMap::new();
        let base = r.scenarios.iter().position(|s| s.key == sc.base);
        if let Some(base) = base.filter(|b| *b != i) {
            let base = stats(base);
            for v in VsDirect::ALL {
                ratios.insert(*v, Num(vs_direct(&figures, &base, *v)));
            }
        }
        scenarios.push(ScenarioDoc {
            key: sc.key.to_string(),
            name: sc.name.to_string(),
            class: sc.kind.class(),
            nodes: if sc.two_nodes { 2 } else { 1 },
            base: sc.base.to_string(),
            proxied,
            figures,
            vs_direct: ratios,
        });
    }
    let scrape = section(&r.scrape, Scrape::ALL.iter().copied());
    let with_vs = ScrapeRatio::ALL
        .iter()
        .map(|row| (*row, Num(with_vs_without(&scrape, *row))))
        .collect();
    let c = &r.config;
    let l = &r.fd_limit;
    let mut doc = Report {
        run: Run {
            label: c.label.clone(),
            rounds: c.rounds,
            seconds_per_throughput_run: c.secs,
            streams: c.streams,
            latency_rate_rps: c.rps,
            latency_connections: c.lat_conns,
            latency_seconds: c.lat_secs,
            request_bytes: 64,
            conn_threads: c.conn_threads,
            conn_seconds: c.conn_secs,
            idle_connections: c.idle,
            idle_target: c.idle_target,
            churn_pods: c.churn_pods,
            scrape_rate: c.scrape_rate,
            proxy_binary: c.proxy_bin.display().to_string(),
            wall_seconds: r.wall_secs,
        },
        fd_limit: FdLimitDoc {
            soft: l.soft,
            hard: l.hard,
            nr_open: l.nr_open,
            cap_sys_resource: l.cap_sys_resource,
            cap_sys_resource_in_bounding_set: l.cap_sys_resource_bounding,
        },
        machine: r.machine.iter().cloned().collect(),
        scenarios,
        scrape: ScrapeDoc {
            with_vs_without: with_vs,
            figures: scrape,
        },
        churn: section(&r.churn, Churn::ALL.iter().copied()),
        errors: r.errors.clone(),
        notes: r.notes.clone(),
        targets: Vec::new(),
    };
    doc.targets = targets::rows(&doc);
    doc
}

/// Renders `report.md` and the charts again from `dir/results.json` (after a
/// change to the report's code), then checks them. Returns the problems.
pub fn rerender(dir: &Path) -> Result<Vec<String>, ReportError> {
    let doc = Report::from_json(&std::fs::read_to_string(dir.join("results.json"))?)?;
    write(dir, &doc)?;
    Ok(check(dir))
}

/// Writes `report.md`, `results.json` and the charts to `dir`; returns the
/// Markdown.
pub fn write(dir: &Path, doc: &Report) -> Result<String, ReportError> {
    std::fs::create_dir_all(dir)?;
    let md = to_markdown(doc);
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(doc)?)?;
    for chart in charts::CHARTS {
        std::fs::write(dir.join(chart.file), (chart.render)(doc))?;
    }
    Ok(md)
}
