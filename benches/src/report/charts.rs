//! The report's charts, SVG written by hand: throughput bars, latency
//! percentile curves (log scale), scrape impact and CNI ADD latency. Each
//! is rendered from the document alone, so `check` can render it again and
//! compare.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::doc::Report;
use crate::figures::{Churn, Datapath, Figure, Scrape};
use crate::stat::{fmt, Stat};

const COLORS: &[&str] = &[
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
    "#ccb974", "#64b5cd",
];

/// `s` escaped for SVG text.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Horizontal bar chart: one group per label, one bar per value (the bars
/// of a group share `shades`).
fn bars_svg(
    title: &str,
    groups: &[(String, Vec<f64>)],
    shades: &[&str],
    unit_fmt: usize,
) -> String {
    let max = groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .fold(0.0, f64::max)
        .max(1e-9);
    let per = groups.iter().map(|g| g.1.len()).max().unwrap_or(1).max(1) as f64;
    let (w, left) = (900.0, 420.0);
    let row = 6.0 + 18.0 * per;
    let h = 60.0 + row * groups.len() as f64 + 20.0;
    let scale = (w - left - 90.0) / max;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\">{}</text>\n",
        esc(title)
    );
    for (i, (name, vals)) in groups.iter().enumerate() {
        let y = 45.0 + row * i as f64;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            left - 8.0,
            y + 12.0 + 9.0 * (vals.len() as f64 - 1.0),
            esc(name)
        );
        for (j, v) in vals.iter().enumerate() {
            let yy = y + 18.0 * j as f64;
            let _ = writeln!(
                s,
                "<rect x=\"{left}\" y=\"{yy}\" width=\"{:.1}\" height=\"16\" fill=\"{}\"/>",
                v * scale,
                shades[j % shades.len()]
            );
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\">{}</text>",
                left + v * scale + 4.0,
                yy + 12.0,
                fmt(*v, unit_fmt)
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// A bar's length: the figure's median, 0 when absent or not finite.
fn median_of<F: Figure>(figs: &BTreeMap<F, Stat>, figure: F) -> f64 {
    figs.get(&figure)
        .and_then(|f| f.median.finite())
        .unwrap_or(0.0)
}

/// Throughput bars (one stream and N streams per scenario).
pub fn throughput_svg(doc: &Report) -> String {
    let groups: Vec<(String, Vec<f64>)> = doc
        .scenarios
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                vec![
                    median_of(&s.figures, Datapath::Tput1Gbps),
                    median_of(&s.figures, Datapath::TputNGbps),
                ],
            )
        })
        .collect();
    bars_svg(
        "Throughput, median (Gbit/s): one stream (dark), N streams (light)",
        &groups,
        &["#4c72b0", "#a1c4e8"],
        2,
    )
}

/// Scrape impact bars: p50 and p99, without (dark) and with (orange) the
/// scraper.
pub fn scrape_svg(doc: &Report) -> String {
    let sc = &doc.scrape.figures;
    let (off, _) = Scrape::side(false);
    let (on, _) = Scrape::side(true);
    // p50, p90, p99.
    let groups: Vec<(String, Vec<f64>)> = (0..3)
        .map(|i| {
            (
                Datapath::LATENCY[i].def().title.to_string(),
                vec![median_of(sc, off[i]), median_of(sc, on[i])],
            )
        })
        .collect();
    bars_svg(
        "Datapath latency, median (µs): without (dark) and with (orange) a /metrics + /config_dump scraper",
        &groups,
        &["#4c72b0", "#dd8452"],
        1,
    )
}

/// CNI ADD latency percentiles.
pub fn churn_svg(doc: &Report) -> String {
    let ch = &doc.churn;
    let groups: Vec<(String, Vec<f64>)> = Churn::CNI_ADD
        .iter()
        .map(|f| {
            (
                f.def().title.replace(" latency", ""),
                vec![median_of(ch, *f)],
            )
        })
        .collect();
    bars_svg(
        "CNI ADD latency through plugin + agent + ZDS, median of rounds (ms)",
        &groups,
        &["#55a868"],
        2,
    )
}

/// Latency percentile curves (p50, p90, p99, p99.9, max; log-scaled µs).
pub fn latency_svg(doc: &Report) -> String {
    let scen = &doc.scenarios;
    let keys = Datapath::LATENCY;
    let series: Vec<(String, Vec<f64>)> = scen
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                keys.iter()
                    .map(|k| {
                        s.figures
                            .get(k)
                            .and_then(|f| f.median.finite())
                            .unwrap_or(1.0)
                            .max(1.0)
                    })
                    .collect(),
            )
        })
        .collect();
    let all = series.iter().flat_map(|s| s.1.iter().copied());
    let hi = all.clone().fold(1.0, f64::max).log10().ceil().max(1.0);
    let lo = all
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor()
        .min(hi - 1.0);
    let (w, l, r, t, b) = (1_250.0, 70.0, 660.0, 40.0, 50.0);
    let h = (t + 20.0 + 20.0 * series.len() as f64).max(420.0);
    let x = |i: usize| l + (w - l - r) * i as f64 / (keys.len() - 1) as f64;
    let y = |v: f64| t + (h - t - b) * (1.0 - (v.log10() - lo) / (hi - lo));
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\">Round-trip latency at a fixed rate, median of rounds (µs, log scale)</text>\n"
    );
    let mut dec = lo;
    while dec <= hi {
        let v = 10f64.powf(dec);
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" x2=\"{}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>",
            w - r,
            y(v),
            y(v)
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{v}</text>",
            l - 6.0,
            y(v) + 4.0
        );
        dec += 1.0;
    }
    for (i, f) in keys.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            x(i),
            h - b + 20.0,
            f.def().title
        );
    }
    for (j, (name, vals)) in series.iter().enumerate() {
        let c = COLORS[j % COLORS.len()];
        let pts: Vec<String> = vals
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/>",
            pts.join(" ")
        );
        for p in &pts {
            let (px, py) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, "<circle cx=\"{px}\" cy=\"{py}\" r=\"3\" fill=\"{c}\"/>");
        }
        let ly = t + 10.0 + 20.0 * j as f64;
        let _ = writeln!(
            s,
            "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{c}\"/>",
            w - r + 15.0,
            ly
        );
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\">{}</text>",
            w - r + 35.0,
            ly + 6.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A chart: its file and how it is drawn.
#[derive(Debug, Clone, Copy)]
pub struct Chart {
    /// File name beside `report.md`.
    pub file: &'static str,
    /// Draws it from the document.
    pub render: fn(&Report) -> String,
    /// Whether every scenario has a series in it (its name appears).
    pub per_scenario: bool,
}

/// Every chart, in the order `report.md` names them.
pub const CHARTS: &[Chart] = &[
    Chart {
        file: "throughput.svg",
        render: throughput_svg,
        per_scenario: true,
    },
    Chart {
        file: "latency.svg",
        render: latency_svg,
        per_scenario: true,
    },
    Chart {
        file: "scrape.svg",
        render: scrape_svg,
        per_scenario: false,
    },
    Chart {
        file: "churn.svg",
        render: churn_svg,
        per_scenario: false,
    },
];
