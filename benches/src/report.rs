//! The report: medians and spreads, ratios to direct, targets, and the
//! files (`report.md`, `results.json`, `throughput.svg`, `latency.svg`).
//! `check` verifies a written report is complete and self-consistent; it
//! never judges the numbers.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::suite::{Kind, Results};

/// A figure of a scenario.
#[derive(Debug, Clone, Copy)]
pub struct FigureDef {
    /// JSON key.
    pub key: &'static str,
    /// Column title.
    pub title: &'static str,
    /// Unit.
    pub unit: &'static str,
    /// Only meaningful with a proxy (CPU and memory of the proxy process).
    pub proxy_only: bool,
    /// Decimals printed.
    pub decimals: usize,
}

const fn fig(
    key: &'static str,
    title: &'static str,
    unit: &'static str,
    proxy_only: bool,
    decimals: usize,
) -> FigureDef {
    FigureDef {
        key,
        title,
        unit,
        proxy_only,
        decimals,
    }
}

/// Every per-scenario figure, in report order.
pub const FIGURES: &[FigureDef] = &[
    fig("tput1_gbps", "one stream", "Gbit/s", false, 2),
    fig("tputn_gbps", "N streams", "Gbit/s", false, 2),
    fig("lat_p50_us", "p50", "µs", false, 1),
    fig("lat_p90_us", "p90", "µs", false, 1),
    fig("lat_p99_us", "p99", "µs", false, 1),
    fig("lat_p999_us", "p99.9", "µs", false, 1),
    fig("lat_max_us", "max", "µs", false, 1),
    fig("lat_rps", "achieved request rate", "req/s", false, 0),
    fig(
        "gen_late_p99_us",
        "load generator send lateness p99",
        "µs",
        false,
        1,
    ),
    fig("conn_per_s", "new connections/s", "conn/s", false, 0),
    fig("conn_failures", "failed connections", "count", false, 0),
    fig(
        "gen_cpu_s_per_gb",
        "load generator CPU-s/GB (one stream)",
        "CPU-s/GB",
        false,
        3,
    ),
    fig(
        "cpu_s_per_gb",
        "proxy CPU-s/GB, one stream",
        "CPU-s/GB",
        true,
        3,
    ),
    fig(
        "cpu_s_per_gb_n",
        "proxy CPU-s/GB, N streams",
        "CPU-s/GB",
        true,
        3,
    ),
    fig(
        "cpu_s_per_1k_req",
        "proxy CPU-s per 1k requests",
        "CPU-s",
        true,
        4,
    ),
    fig(
        "cpu_us_per_conn",
        "proxy CPU-µs per new connection",
        "CPU-µs",
        true,
        1,
    ),
    fig("rss_idle_mib", "proxy RSS idle", "MiB", true, 1),
    fig(
        "rss_small_mib",
        "proxy RSS, idle conns (small)",
        "MiB",
        true,
        1,
    ),
    fig(
        "rss_large_mib",
        "proxy RSS, idle conns (large)",
        "MiB",
        true,
        1,
    ),
    fig(
        "kib_per_idle_conn",
        "proxy KiB per idle connection",
        "KiB",
        true,
        2,
    ),
    fig(
        "rss_target_idle_mib",
        "proxy RSS at 10k idle conns (measured, else extrapolated from the large count)",
        "MiB",
        true,
        1,
    ),
];

/// Pod churn figures.
pub const CHURN_FIGURES: &[FigureDef] = &[
    fig(
        "netns_create_s",
        "creating the pod netns (test bed, not proxy)",
        "s",
        false,
        2,
    ),
    fig(
        "enroll_s",
        "proxy start to every pod's listeners open",
        "s",
        false,
        3,
    ),
    fig("enroll_cpu_s", "proxy CPU for it", "CPU-s", false, 3),
    fig("rss_empty_mib", "proxy RSS, no pods", "MiB", false, 1),
    fig("rss_pods_mib", "proxy RSS, all pods", "MiB", false, 1),
    fig("kib_per_pod", "proxy RSS per pod", "KiB", false, 1),
];

/// Ratios and differences to direct: (key, title, figure, kind).
pub const RATIOS: &[(&str, &str, &str, RatioKind)] = &[
    (
        "tput1_x",
        "one stream vs direct",
        "tput1_gbps",
        RatioKind::Ratio,
    ),
    (
        "tputn_x",
        "N streams vs direct",
        "tputn_gbps",
        RatioKind::Ratio,
    ),
    (
        "conn_x",
        "connections/s vs direct",
        "conn_per_s",
        RatioKind::Ratio,
    ),
    ("added_p50_us", "added p50", "lat_p50_us", RatioKind::Added),
    ("added_p99_us", "added p99", "lat_p99_us", RatioKind::Added),
];

/// How a derived figure relates to direct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioKind {
    /// figure / direct's.
    Ratio,
    /// figure - direct's.
    Added,
}

/// Median (mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Prints a value as the report does.
pub fn fmt(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// Rounds a value as the report prints it.
fn printed(v: f64, decimals: usize) -> f64 {
    fmt(v, decimals).parse().unwrap_or(f64::NAN)
}

fn stats(vals: &[f64]) -> Value {
    let rounds = vals.to_vec();
    let vals: Vec<f64> = vals.iter().copied().filter(|v| v.is_finite()).collect();
    let vals = &vals[..];
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    json!({"median": median(vals), "min": lo, "max": hi, "rounds": rounds})
}

fn applies(def: &FigureDef, kind: Kind) -> bool {
    !(def.proxy_only && kind == Kind::Direct)
}

/// A report target: (text, scenario figure or churn figure, comparison).
struct Target {
    text: &'static str,
    key: &'static str,
    churn: bool,
    le: bool,
    limit: f64,
}

const TARGETS: &[Target] = &[
    Target {
        text: "plaintext one stream ≥ 0.6x direct",
        key: "tput1_x",
        churn: false,
        le: false,
        limit: 0.6,
    },
    Target {
        text: "plaintext ≤ 0.5 proxy CPU-s/GB (one stream)",
        key: "cpu_s_per_gb",
        churn: false,
        le: true,
        limit: 0.5,
    },
    Target {
        text: "added p50 round trip ≤ 25 µs (plaintext)",
        key: "added_p50_us",
        churn: false,
        le: true,
        limit: 25.0,
    },
    Target {
        text: "p99 ≤ 2x p50",
        key: "p99_over_p50",
        churn: false,
        le: true,
        limit: 2.0,
    },
    Target {
        text: "new connections/s ≥ 0.5x direct",
        key: "conn_x",
        churn: false,
        le: false,
        limit: 0.5,
    },
    Target {
        text: "≤ 6 KiB proxy RSS per idle connection",
        key: "kib_per_idle_conn",
        churn: false,
        le: true,
        limit: 6.0,
    },
    Target {
        text: "RSS with 10k idle connections ≤ 80 MiB (extrapolated when capped)",
        key: "rss_target_idle_mib",
        churn: false,
        le: true,
        limit: 80.0,
    },
    Target {
        text: "pods enrolled in ≤ 5 s (1,000 in the full run)",
        key: "enroll_s",
        churn: true,
        le: true,
        limit: 5.0,
    },
    Target {
        text: "≤ 50 KiB proxy RSS per pod",
        key: "kib_per_pod",
        churn: true,
        le: true,
        limit: 50.0,
    },
];

/// Builds the JSON document of a run: every figure of every round, medians,
/// spreads, ratios, targets.
pub fn to_json(r: &Results) -> Value {
    let direct = r
        .scenarios
        .iter()
        .position(|s| s.kind == Kind::Direct)
        .expect("direct scenario");
    let series = |s: usize, key: &str| -> Vec<f64> {
        r.rounds
            .iter()
            .map(|round| round[s].get(key).copied().unwrap_or(f64::NAN))
            .collect()
    };
    let mut scenarios = Vec::new();
    for (i, sc) in r.scenarios.iter().enumerate() {
        let mut figs = serde_json::Map::new();
        for def in FIGURES.iter().filter(|d| applies(d, sc.kind)) {
            figs.insert(def.key.into(), stats(&series(i, def.key)));
        }
        let mut ratios = serde_json::Map::new();
        if i != direct {
            for (key, _, fkey, kind) in RATIOS {
                let def = FIGURES.iter().find(|d| d.key == *fkey).expect("figure");
                // From the printed medians, so the report's columns agree.
                let m = printed(median(&series(i, fkey)), def.decimals);
                let d = printed(median(&series(direct, fkey)), def.decimals);
                let v = match kind {
                    RatioKind::Ratio => m / d,
                    RatioKind::Added => m - d,
                };
                ratios.insert((*key).into(), json!(v));
            }
        }
        scenarios.push(json!({
            "key": sc.key, "name": sc.name,
            "proxied": sc.kind != Kind::Direct,
            "figures": figs, "vs_direct": ratios,
        }));
    }
    let mut churn = serde_json::Map::new();
    for def in CHURN_FIGURES {
        let v: Vec<f64> = r
            .churn
            .iter()
            .map(|f| f.get(def.key).copied().unwrap_or(f64::NAN))
            .collect();
        churn.insert(def.key.into(), stats(&v));
    }
    let mut doc = json!({
        "run": {
            "label": r.config.label, "rounds": r.config.rounds,
            "seconds_per_throughput_run": r.config.secs, "streams": r.config.streams,
            "latency_rate_rps": r.config.rps, "latency_connections": r.config.lat_conns,
            "latency_seconds": r.config.lat_secs, "request_bytes": 64,
            "conn_threads": r.config.conn_threads, "conn_seconds": r.config.conn_secs,
            "idle_connections": r.config.idle, "idle_target": r.config.idle_target, "churn_pods": r.config.churn_pods,
            "proxy_binary": r.config.proxy_bin.display().to_string(),
            "wall_seconds": r.wall_secs,
        },
        "machine": r.machine.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "scenarios": scenarios,
        "churn": churn,
        "hbone": "not measured: HBONE scenarios do not exist yet",
        "errors": r.errors,
        "notes": r.notes,
    });
    let targets = targets(&doc);
    doc["targets"] = targets;
    doc
}

fn scenario_value(s: &Value, key: &str) -> f64 {
    if key == "p99_over_p50" {
        return scenario_value(s, "lat_p99_us") / scenario_value(s, "lat_p50_us");
    }
    s["vs_direct"][key]
        .as_f64()
        .or_else(|| s["figures"][key]["median"].as_f64())
        .unwrap_or(f64::NAN)
}

fn targets(doc: &Value) -> Value {
    let mut rows = Vec::new();
    for t in TARGETS {
        let mut push = |scenario: &str, measured: f64| {
            let met = if t.le {
                measured <= t.limit
            } else {
                measured >= t.limit
            };
            rows.push(json!({
                "target": t.text, "key": t.key, "scenario": scenario,
                "limit": t.limit, "at_most": t.le, "measured": measured, "met": met,
            }));
        };
        if t.churn {
            push(
                "pod churn",
                doc["churn"][t.key]["median"].as_f64().unwrap_or(f64::NAN),
            );
        } else {
            for s in doc["scenarios"].as_array().into_iter().flatten() {
                if s["key"]
                    .as_str()
                    .is_some_and(|k| k.starts_with("tproxy") || k.starts_with("redirect"))
                {
                    push(s["name"].as_str().unwrap_or(""), scenario_value(s, t.key));
                }
            }
        }
    }
    json!(rows)
}

fn fig_def(key: &str) -> Option<&'static FigureDef> {
    FIGURES.iter().find(|d| d.key == key)
}

/// Median cell (and spread) as printed.
fn cell(s: &Value, key: &str) -> String {
    let Some(def) = fig_def(key) else {
        return "—".into();
    };
    let f = &s["figures"][key];
    match f["median"].as_f64() {
        Some(m) => fmt(m, def.decimals),
        None => "—".into(),
    }
}

fn spread(s: &Value, key: &str) -> String {
    let def = fig_def(key).expect("figure");
    let f = &s["figures"][key];
    match (f["min"].as_f64(), f["max"].as_f64()) {
        (Some(lo), Some(hi)) => format!("{}–{}", fmt(lo, def.decimals), fmt(hi, def.decimals)),
        _ => "—".into(),
    }
}

fn ratio_cell(s: &Value, key: &str) -> String {
    match s["vs_direct"][key].as_f64() {
        Some(v) if key.starts_with("added") => format!("{v:+.1}"),
        Some(v) => format!("{v:.2}x"),
        None => "—".into(),
    }
}

/// The Markdown report.
pub fn to_markdown(doc: &Value) -> String {
    let mut m = String::new();
    let run = &doc["run"];
    let scen = doc["scenarios"].as_array().cloned().unwrap_or_default();
    let idle = run["idle_connections"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let (small, large) = (
        idle.first().and_then(Value::as_u64).unwrap_or(0),
        idle.get(1).and_then(Value::as_u64).unwrap_or(0),
    );
    let _ = writeln!(
        m,
        "# ringway benchmark report ({} run)\n",
        run["label"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        m,
        "Median of {} rounds alternating the scenarios; spread is min–max over the rounds. \
         Pod -> pod on one virtual node (veth + bridge, inside private namespaces). \
         Proxy: `{}` as a child process (its CPU from /proc/<pid>/task/*/schedstat, its RSS from /proc/<pid>/status). \
         Wall time {:.0} s.\n",
        run["rounds"],
        run["proxy_binary"].as_str().unwrap_or(""),
        run["wall_seconds"].as_f64().unwrap_or(0.0)
    );
    let _ = writeln!(m, "| machine | |\n| --- | --- |");
    for (k, v) in doc["machine"].as_object().into_iter().flatten() {
        let _ = writeln!(m, "| {k} | {} |", v.as_str().unwrap_or(""));
    }
    let _ = writeln!(
        m,
        "\nParameters: throughput {} s per run, N = {} streams; latency {} req/s of 64 B over {} connections for {} s (open loop); \
         connection rate {} client threads for {} s; idle connections {small} and {large}; churn {} pods.\n",
        run["seconds_per_throughput_run"], run["streams"], run["latency_rate_rps"], run["latency_connections"],
        run["latency_seconds"], run["conn_threads"], run["conn_seconds"], run["churn_pods"]
    );

    let _ = writeln!(m, "## Summary (medians)\n");
    let _ = writeln!(m, "| scenario | one stream Gbit/s | vs direct | N streams Gbit/s | vs direct | p50 µs | added p50 | p99 µs | added p99 | conn/s | vs direct | proxy CPU-s/GB | proxy KiB/idle conn |");
    let _ = writeln!(
        m,
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for s in &scen {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s["name"].as_str().unwrap_or(""),
            cell(s, "tput1_gbps"),
            ratio_cell(s, "tput1_x"),
            cell(s, "tputn_gbps"),
            ratio_cell(s, "tputn_x"),
            cell(s, "lat_p50_us"),
            ratio_cell(s, "added_p50_us"),
            cell(s, "lat_p99_us"),
            ratio_cell(s, "added_p99_us"),
            cell(s, "conn_per_s"),
            ratio_cell(s, "conn_x"),
            cell(s, "cpu_s_per_gb"),
            cell(s, "kib_per_idle_conn"),
        );
    }

    let table = |m: &mut String, title: &str, keys: &[&str]| {
        let _ = writeln!(m, "\n## {title}\n");
        let mut head = String::from("| scenario |");
        let mut sep = String::from("| --- |");
        for k in keys {
            let d = fig_def(k).expect("figure");
            let t = d
                .title
                .replace("(small)", &format!("{small}"))
                .replace("(large)", &format!("{large}"));
            let _ = write!(head, " {t} ({}) | spread |", d.unit);
            sep.push_str(" --- | --- |");
        }
        let _ = writeln!(m, "{head}\n{sep}");
        for s in &scen {
            let mut row = format!("| {} |", s["name"].as_str().unwrap_or(""));
            for k in keys {
                let _ = write!(row, " {} | {} |", cell(s, k), spread(s, k));
            }
            let _ = writeln!(m, "{row}");
        }
    };
    table(
        &mut m,
        "Throughput (bytes counted exactly: clients' writes = server's reads)",
        &["tput1_gbps", "tputn_gbps", "gen_cpu_s_per_gb"],
    );
    table(
        &mut m,
        "Latency at a fixed request rate (64 B request/reply, from the scheduled send)",
        &[
            "lat_p50_us",
            "lat_p90_us",
            "lat_p99_us",
            "lat_p999_us",
            "lat_max_us",
            "lat_rps",
            "gen_late_p99_us",
        ],
    );
    table(
        &mut m,
        "Connection rate (connect + 1 B request/reply + close)",
        &["conn_per_s", "conn_failures"],
    );
    table(
        &mut m,
        "Proxy cost",
        &[
            "cpu_s_per_gb",
            "cpu_s_per_gb_n",
            "cpu_s_per_1k_req",
            "cpu_us_per_conn",
            "rss_idle_mib",
            "rss_small_mib",
            "rss_large_mib",
            "kib_per_idle_conn",
            "rss_target_idle_mib",
        ],
    );

    let _ = writeln!(m, "\n## Pod churn\n\nBare pod network namespaces (lo only) given to a fresh proxy on its command line; \
        time from process start to every pod's listeners open, RSS against a proxy with no pods. \
        CNI ADD latency through `ringway agent` + the plugin is not measured yet.\n");
    let _ = writeln!(m, "| figure | median | spread |\n| --- | --- | --- |");
    for def in CHURN_FIGURES {
        let f = &doc["churn"][def.key];
        let (md, lo, hi) = (f["median"].as_f64(), f["min"].as_f64(), f["max"].as_f64());
        let p = |v: Option<f64>| {
            v.map(|v| fmt(v, def.decimals))
                .unwrap_or_else(|| "—".into())
        };
        let _ = writeln!(
            m,
            "| {} ({}) | {} | {}–{} |",
            def.title,
            def.unit,
            p(md),
            p(lo),
            p(hi)
        );
    }

    let errors = doc["errors"].as_array().cloned().unwrap_or_default();
    if !errors.is_empty() {
        let _ = writeln!(m, "\n## Failed measurements ({})\n", errors.len());
        for e in &errors {
            let _ = writeln!(m, "- {}", e.as_str().unwrap_or("").replace('|', "/"));
        }
    }
    let notes = doc["notes"].as_array().cloned().unwrap_or_default();
    if !notes.is_empty() {
        let _ = writeln!(m, "\n## Notes\n");
        for e in &notes {
            let _ = writeln!(m, "- {}", e.as_str().unwrap_or("").replace('|', "/"));
        }
    }
    let _ = writeln!(m, "\n## HBONE\n\nNot measured: HBONE scenarios (pod -> pod on one node, and between two virtual nodes) do not exist yet. Slot kept for them.\n");

    let _ = writeln!(m, "## Targets (from issue 6; reported, never asserted)\n");
    let _ = writeln!(
        m,
        "| target | scenario | target | measured | met? |\n| --- | --- | --- | --- | --- |"
    );
    for t in doc["targets"].as_array().into_iter().flatten() {
        let lim = t["limit"].as_f64().unwrap_or(f64::NAN);
        let op = if t["at_most"].as_bool().unwrap_or(true) {
            "≤"
        } else {
            "≥"
        };
        let _ = writeln!(
            m,
            "| {} | {} | {op} {} | {} | {} |",
            t["target"].as_str().unwrap_or(""),
            t["scenario"].as_str().unwrap_or(""),
            lim,
            fmt(t["measured"].as_f64().unwrap_or(f64::NAN), 3),
            if t["met"].as_bool().unwrap_or(false) {
                "yes"
            } else {
                "**no**"
            },
        );
    }
    let _ = writeln!(
        m,
        "| HBONE targets (≥ 0.4x, ≤ 0.9 CPU-s/GB, ≤ 45 µs) | — | — | not measured | — |"
    );
    let _ = writeln!(
        m,
        "\nCharts: `throughput.svg`, `latency.svg`. Every figure of every round: `results.json`."
    );
    m
}

const COLORS: &[&str] = &[
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Throughput bars (one stream and N streams per scenario).
pub fn throughput_svg(doc: &Value) -> String {
    let scen = doc["scenarios"].as_array().cloned().unwrap_or_default();
    let vals: Vec<(String, f64, f64)> = scen
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_string(),
                s["figures"]["tput1_gbps"]["median"].as_f64().unwrap_or(0.0),
                s["figures"]["tputn_gbps"]["median"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    let max = vals
        .iter()
        .map(|v| v.1.max(v.2))
        .fold(0.0, f64::max)
        .max(1e-9);
    let (w, row, left) = (900.0, 44.0, 380.0);
    let h = 60.0 + row * vals.len() as f64 + 30.0;
    let scale = (w - left - 90.0) / max;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\">Throughput, median (Gbit/s): one stream (dark), N streams (light)</text>\n"
    );
    for (i, (name, one, n)) in vals.iter().enumerate() {
        let y = 45.0 + row * i as f64;
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>",
            left - 8.0,
            y + 18.0,
            esc(name)
        );
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{y}\" width=\"{:.1}\" height=\"16\" fill=\"#4c72b0\"/>",
            one * scale
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\">{one:.2}</text>",
            left + one * scale + 4.0,
            y + 12.0
        );
        let _ = writeln!(
            s,
            "<rect x=\"{left}\" y=\"{}\" width=\"{:.1}\" height=\"16\" fill=\"#a1c4e8\"/>",
            y + 18.0,
            n * scale
        );
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\">{n:.2}</text>",
            left + n * scale + 4.0,
            y + 30.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Latency percentile curves (p50, p90, p99, p99.9, max; log-scaled µs).
pub fn latency_svg(doc: &Value) -> String {
    let scen = doc["scenarios"].as_array().cloned().unwrap_or_default();
    let keys = [
        "lat_p50_us",
        "lat_p90_us",
        "lat_p99_us",
        "lat_p999_us",
        "lat_max_us",
    ];
    let labels = ["p50", "p90", "p99", "p99.9", "max"];
    let series: Vec<(String, Vec<f64>)> = scen
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_string(),
                keys.iter()
                    .map(|k| s["figures"][k]["median"].as_f64().unwrap_or(1.0).max(1.0))
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
    let (w, h, l, r, t, b) = (1_150.0, 420.0, 70.0, 560.0, 40.0, 50.0);
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
    for (i, lab) in labels.iter().enumerate() {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{lab}</text>",
            x(i),
            h - b + 20.0
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

/// Writes `report.md`, `results.json`, `throughput.svg`, `latency.svg` to `dir`.
pub fn write(dir: &Path, doc: &Value) -> std::io::Result<String> {
    std::fs::create_dir_all(dir)?;
    let md = to_markdown(doc);
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(doc)?)?;
    std::fs::write(dir.join("throughput.svg"), throughput_svg(doc))?;
    std::fs::write(dir.join("latency.svg"), latency_svg(doc))?;
    Ok(md)
}

/// Checks a written report: complete (every scenario has every figure it
/// should, in every round, finite), self-consistent (medians and spreads
/// match the rounds, ratios match the printed medians, percentiles ordered,
/// targets' met? matches their measured value, the Markdown shows what the
/// JSON holds and no NaN/inf), files present. Returns the problems found.
pub fn check(dir: &Path) -> Vec<String> {
    let mut errs = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f));
    let (Ok(md), Ok(js), Ok(tsvg), Ok(lsvg)) = (
        read("report.md"),
        read("results.json"),
        read("throughput.svg"),
        read("latency.svg"),
    ) else {
        return vec![format!("missing report files in {}", dir.display())];
    };
    for (name, svg) in [("throughput.svg", &tsvg), ("latency.svg", &lsvg)] {
        if !svg.starts_with("<svg")
            || !svg.trim_end().ends_with("</svg>")
            || svg.contains("NaN")
            || svg.contains("inf")
        {
            errs.push(format!("{name} is not a complete, finite SVG"));
        }
    }
    let doc: Value = match serde_json::from_str(&js) {
        Ok(v) => v,
        Err(e) => return vec![format!("results.json: {e}")],
    };
    // The same document renders the same Markdown.
    if to_markdown(&doc) != md {
        errs.push("report.md differs from the report rendered from results.json".into());
    }
    for c in md.split('|').map(str::trim) {
        if c.contains("NaN") || c.ends_with("inf") || c.starts_with("inf") {
            errs.push(format!("report.md has a non-finite cell: {c:?}"));
        }
    }
    let rounds = doc["run"]["rounds"].as_u64().unwrap_or(0) as usize;
    for e in doc["errors"].as_array().into_iter().flatten() {
        errs.push(format!("failed measurement: {}", e.as_str().unwrap_or("")));
    }
    let scen = doc["scenarios"].as_array().cloned().unwrap_or_default();
    let Some(direct) = scen.iter().find(|s| s["key"] == "direct") else {
        return vec!["no direct scenario".into()];
    };
    for want in ["direct", "tproxy_fast", "tproxy_2hop", "redirect_2hop"] {
        if !scen.iter().any(|s| s["key"] == want) {
            errs.push(format!("scenario {want} missing"));
        }
    }
    for s in &scen {
        let name = s["name"].as_str().unwrap_or("?");
        if !md.contains(&format!("| {name} |")) {
            errs.push(format!("{name}: no row in report.md"));
        }
        let proxied = s["proxied"].as_bool().unwrap_or(true);
        for def in FIGURES {
            let f = &s["figures"][def.key];
            if def.proxy_only && !proxied {
                if !f.is_null() {
                    errs.push(format!(
                        "{name}: {} should not be reported without a proxy",
                        def.key
                    ));
                }
                continue;
            }
            let vals: Vec<f64> = f["rounds"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .collect();
            if vals.len() != rounds {
                errs.push(format!(
                    "{name}: {} has {} finite round values, want {rounds}",
                    def.key,
                    vals.len()
                ));
                continue;
            }
            if vals.iter().any(|v| !v.is_finite()) {
                errs.push(format!("{name}: {} not finite", def.key));
            }
            let (m, lo, hi) = (f["median"].as_f64(), f["min"].as_f64(), f["max"].as_f64());
            let close = |a: Option<f64>, b: f64| {
                a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0))
            };
            if !close(m, median(&vals)) || lo.is_none() || hi.is_none() || lo > m || m > hi {
                errs.push(format!(
                    "{name}: {} median/spread inconsistent with its rounds",
                    def.key
                ));
            }
            if def.key != "conn_failures" && m.is_some_and(|m| m < 0.0) {
                errs.push(format!("{name}: {} negative", def.key));
            }
        }
        let p: Vec<f64> = [
            "lat_p50_us",
            "lat_p90_us",
            "lat_p99_us",
            "lat_p999_us",
            "lat_max_us",
        ]
        .iter()
        .filter_map(|k| s["figures"][k]["median"].as_f64())
        .collect();
        if p.len() != 5 || p.windows(2).any(|w| w[0] > w[1]) {
            errs.push(format!(
                "{name}: latency percentiles missing or not ordered: {p:?}"
            ));
        }
        if proxied {
            for (key, _, fkey, kind) in RATIOS {
                let def = fig_def(fkey).expect("figure");
                let pm = printed(
                    s["figures"][fkey]["median"].as_f64().unwrap_or(f64::NAN),
                    def.decimals,
                );
                let pd = printed(
                    direct["figures"][fkey]["median"]
                        .as_f64()
                        .unwrap_or(f64::NAN),
                    def.decimals,
                );
                let want = match kind {
                    RatioKind::Ratio => pm / pd,
                    RatioKind::Added => pm - pd,
                };
                let got = s["vs_direct"][key].as_f64().unwrap_or(f64::NAN);
                if !want.is_finite() || (got - want).abs() > 1e-9 * want.abs().max(1.0) {
                    errs.push(format!(
                        "{name}: {key} = {got}, but the printed figures give {want}"
                    ));
                }
                if !md.contains(&ratio_cell(s, key)) {
                    errs.push(format!("{name}: {key} not printed"));
                }
            }
        }
    }
    for def in CHURN_FIGURES {
        let f = &doc["churn"][def.key];
        let n = f["rounds"].as_array().map(|a| {
            a.iter()
                .filter(|v| v.as_f64().is_some_and(f64::is_finite))
                .count()
        });
        if n != Some(rounds) || !f["median"].as_f64().is_some_and(f64::is_finite) {
            errs.push(format!("churn: {} incomplete", def.key));
        }
    }
    let targets = doc["targets"].as_array().cloned().unwrap_or_default();
    let want_rows = TARGETS
        .iter()
        .map(|t| if t.churn { 1 } else { 3 })
        .sum::<usize>();
    if targets.len() != want_rows {
        errs.push(format!("{} target rows, want {want_rows}", targets.len()));
    }
    for t in &targets {
        let (v, lim) = (
            t["measured"].as_f64().unwrap_or(f64::NAN),
            t["limit"].as_f64().unwrap_or(f64::NAN),
        );
        let met = if t["at_most"].as_bool().unwrap_or(true) {
            v <= lim
        } else {
            v >= lim
        };
        if !v.is_finite() || t["met"].as_bool() != Some(met) {
            errs.push(format!(
                "target {}: measured {v}, met? inconsistent",
                t["target"]
            ));
        }
    }
    errs
}
