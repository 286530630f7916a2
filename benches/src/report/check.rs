//! Checks a written report: complete (every scenario has every figure it
//! should, in every round, finite; the scrape and churn sections too),
//! self-consistent (medians and spreads match the rounds, ratios match the
//! printed medians, percentiles ordered, targets' met? matches their
//! measured value, the Markdown and charts are what the JSON renders, no
//! NaN/inf, every scenario in the per-scenario charts), files present. It
//! never judges the numbers.

use std::path::Path;

use super::charts::{esc, CHARTS};
use super::doc::{vs_direct, with_vs_without, Report, ScenarioDoc};
use super::markdown::{churn_row, ratio_cell, stat_cell, to_markdown};
use super::targets::TARGETS;
use crate::figures::{Churn, Datapath, Figure, Scrape, ScrapeRatio, VsDirect};
use crate::scenario::REQUIRED_SCENARIOS;
use crate::stat::{median, Stat};

/// Checks the rounds of one figure: all present and finite, median and
/// spread as the rounds give them. Returns the problem, if any.
fn check_stats(f: Option<&Stat>, rounds: usize) -> Option<String> {
    let Some(f) = f else {
        return Some("missing".into());
    };
    let vals: Vec<f64> = f.rounds.iter().filter_map(|v| v.finite()).collect();
    if vals.len() != rounds {
        return Some(format!("{} finite round values, want {rounds}", vals.len()));
    }
    let (m, lo, hi) = (f.median.finite(), f.min.finite(), f.max.finite());
    let close =
        |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0));
    if !close(m, median(&vals)) || lo.is_none() || hi.is_none() || lo > m || m > hi {
        return Some("median/spread inconsistent with its rounds".into());
    }
    None
}

/// The finite medians of `which` in `figures`, in order.
fn ordered<F: Figure>(figures: &std::collections::BTreeMap<F, Stat>, which: &[F]) -> Vec<f64> {
    which
        .iter()
        .filter_map(|f| figures.get(f).and_then(|s| s.median.finite()))
        .collect()
}

/// Whether all `n` are there, ascending.
fn is_ordered(p: &[f64], n: usize) -> bool {
    p.len() == n && p.windows(2).all(|w| w[0] <= w[1])
}

/// The problems of one scenario's figures and ratios.
fn check_scenario(doc: &Report, s: &ScenarioDoc, md: &str, errs: &mut Vec<String>) {
    let rounds = doc.run.rounds;
    let name = s.name.as_str();
    for f in Datapath::ALL {
        let stat = s.figures.get(f);
        if !f.applies(s.proxied) {
            if stat.is_some() {
                errs.push(format!(
                    "{name}: {} should not be reported without a proxy",
                    f.key()
                ));
            }
            continue;
        }
        let measurable = f.def().where_measurable;
        if measurable && stat.is_none_or(|st| st.median.finite().is_none()) {
            // Not measurable in this scenario (a peer, two proxies).
            continue;
        }
        if let Some(p) = check_stats(stat, rounds) {
            errs.push(format!("{name}: {}: {p}", f.key()));
            continue;
        }
        if *f != Datapath::ConnFailures
            && !measurable
            && stat
                .and_then(|f| f.median.finite())
                .is_some_and(|m| m < 0.0)
        {
            errs.push(format!("{name}: {} negative", f.key()));
        }
    }
    let p = ordered(&s.figures, &Datapath::LATENCY);
    if !is_ordered(&p, 5) {
        errs.push(format!(
            "{name}: latency percentiles missing or not ordered: {p:?}"
        ));
    }
    let Some(base) = doc.scenario(&s.base) else {
        errs.push(format!("{name}: its direct baseline {} is missing", s.base));
        return;
    };
    if base.key == s.key {
        return;
    }
    for v in VsDirect::ALL {
        let want = vs_direct(&s.figures, &base.figures, *v);
        let got = s.vs_direct.get(v).map_or(f64::NAN, |n| n.0);
        if !want.is_finite() || (got - want).abs() > 1e-9 * want.abs().max(1.0) {
            errs.push(format!(
                "{name}: {} = {got}, but the printed figures give {want}",
                v.key()
            ));
        }
        if !md.contains(&ratio_cell(s, *v)) {
            errs.push(format!("{name}: {} not printed", v.key()));
        }
    }
}

/// The problems of the scrape-impact and churn sections.
fn check_sections(doc: &Report, md: &str, errs: &mut Vec<String>) {
    let rounds = doc.run.rounds;
    // Scrape impact: complete, ratios from the printed medians, printed.
    let sc = &doc.scrape;
    for f in Scrape::ALL {
        let stat = sc.figures.get(f);
        if let Some(p) = check_stats(stat, rounds) {
            errs.push(format!("scrape: {}: {p}", f.key()));
        }
        if !md.contains(&stat_cell(stat, *f)) {
            errs.push(format!("scrape: {} not printed", f.key()));
        }
    }
    for row in ScrapeRatio::ALL {
        let want = with_vs_without(&sc.figures, *row);
        let got = sc.with_vs_without.get(row).map_or(f64::NAN, |v| v.0);
        if !want.is_finite() || (got - want).abs() > 1e-9 * got.abs().max(1.0) {
            errs.push(format!(
                "scrape: {} = {got}, but the printed figures give {want}",
                row.key()
            ));
        }
    }
    for with in [false, true] {
        let (latency, _) = Scrape::side(with);
        let p = ordered(&sc.figures, &latency);
        if !is_ordered(&p, 5) {
            errs.push(format!(
                "scrape ({}): percentiles missing or not ordered: {p:?}",
                if with { "on" } else { "off" }
            ));
        }
    }
    for f in Churn::ALL {
        if let Some(p) = check_stats(doc.churn.get(f), rounds) {
            errs.push(format!("churn: {}: {p}", f.key()));
        }
        if !md.contains(&churn_row(doc, *f)) {
            errs.push(format!("churn: {} not printed", f.key()));
        }
    }
    let cni = ordered(&doc.churn, &Churn::CNI_ADD);
    if !is_ordered(&cni, 4) {
        errs.push(format!(
            "churn: CNI ADD percentiles missing or not ordered: {cni:?}"
        ));
    }
}

/// The problems of the target rows.
fn check_targets(doc: &Report, errs: &mut Vec<String>) {
    let want_rows: usize = TARGETS.iter().map(|t| t.rows(doc).len()).sum();
    if doc.targets.len() != want_rows {
        errs.push(format!(
            "{} target rows, want {want_rows}",
            doc.targets.len()
        ));
    }
    for t in &doc.targets {
        let (v, lim) = (t.measured.0, t.limit.0);
        let met = if t.at_most { v <= lim } else { v >= lim };
        if !v.is_finite() || t.met != met {
            errs.push(format!(
                "target {:?}: measured {v}, met? inconsistent",
                t.target
            ));
        }
    }
    if !doc.targets.iter().any(|t| t.target.starts_with("HBONE")) {
        errs.push("no HBONE target row".into());
    }
}

/// Checks the report written to `dir`. Returns the problems found.
pub fn check(dir: &Path) -> Vec<String> {
    let mut errs = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f));
    let (Ok(md), Ok(js)) = (read("report.md"), read("results.json")) else {
        return vec![format!("missing report files in {}", dir.display())];
    };
    let mut svgs = Vec::new();
    for chart in CHARTS {
        match read(chart.file) {
            Ok(svg) => {
                if !svg.starts_with("<svg")
                    || !svg.trim_end().ends_with("</svg>")
                    || svg.contains("NaN")
                    || svg.contains("inf")
                {
                    errs.push(format!("{} is not a complete, finite SVG", chart.file));
                }
                svgs.push((chart, svg));
            }
            Err(_) => errs.push(format!("{} missing", chart.file)),
        }
    }
    let doc = match Report::from_json(&js) {
        Ok(v) => v,
        Err(e) => return vec![e.to_string()],
    };
    // The same document renders the same Markdown and charts.
    if to_markdown(&doc) != md {
        errs.push("report.md differs from the report rendered from results.json".into());
    }
    for (chart, svg) in &svgs {
        if (chart.render)(&doc) != *svg {
            errs.push(format!(
                "{} differs from the chart rendered from results.json",
                chart.file
            ));
        }
    }
    for c in md.split('|').map(str::trim) {
        if c.contains("NaN") || c.ends_with("inf") || c.starts_with("inf") {
            errs.push(format!("report.md has a non-finite cell: {c:?}"));
        }
    }
    for e in &doc.errors {
        errs.push(format!("failed measurement: {e}"));
    }
    for want in REQUIRED_SCENARIOS {
        if doc.scenario(want).is_none() {
            errs.push(format!("scenario {want} missing"));
        }
    }
    for s in &doc.scenarios {
        let name = s.name.as_str();
        if !md.contains(&format!("| {name} |")) {
            errs.push(format!("{name}: no row in report.md"));
        }
        for (chart, svg) in &svgs {
            if chart.per_scenario && !svg.contains(&esc(name)) {
                errs.push(format!("{name}: not in {}", chart.file));
            }
        }
        check_scenario(&doc, s, &md, &mut errs);
    }
    check_sections(&doc, &md, &mut errs);
    check_targets(&doc, &mut errs);
    errs
}
