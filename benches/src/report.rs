//! The report: medians and spreads, ratios to direct, targets, and the
//! files (`report.md`, `results.json`, `throughput.svg`, `latency.svg`,
//! `scrape.svg`, `churn.svg`). `check` verifies a written report is complete
//! and self-consistent; it never judges the numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::suite::{Figures, Kind, Results, REQUIRED_SCENARIOS};

/// A figure of a scenario (or of the scrape or churn sections).
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
        "idle_large_n",
        "large idle count reached",
        "conns",
        false,
        0,
    ),
    fig(
        "rss_large_mib",
        "proxy RSS at the large idle count",
        "MiB",
        true,
        1,
    ),
    fig(
        "kib_per_idle_conn",
        "proxy KiB per idle connection (large count)",
        "KiB",
        true,
        2,
    ),
    fig(
        "fds_per_idle_conn",
        "proxy fds per idle connection",
        "fds",
        true,
        2,
    ),
    fig(
        "rss_target_idle_mib",
        "proxy RSS at 10k idle conns (extrapolated unless the large count is 10k)",
        "MiB",
        true,
        1,
    ),
];

/// Scrape-impact figures (one set per round).
pub const SCRAPE_FIGURES: &[FigureDef] = &[
    fig("scrape_off_p50_us", "p50 without scraper", "µs", false, 1),
    fig("scrape_on_p50_us", "p50 with scraper", "µs", false, 1),
    fig("scrape_off_p90_us", "p90 without scraper", "µs", false, 1),
    fig("scrape_on_p90_us", "p90 with scraper", "µs", false, 1),
    fig("scrape_off_p99_us", "p99 without scraper", "µs", false, 1),
    fig("scrape_on_p99_us", "p99 with scraper", "µs", false, 1),
    fig(
        "scrape_off_p999_us",
        "p99.9 without scraper",
        "µs",
        false,
        1,
    ),
    fig("scrape_on_p999_us", "p99.9 with scraper", "µs", false, 1),
    fig("scrape_off_max_us", "max without scraper", "µs", false, 1),
    fig("scrape_on_max_us", "max with scraper", "µs", false, 1),
    fig(
        "scrape_off_worker_cpu_s_per_1k_req",
        "worker threads' CPU-s per 1k requests without scraper",
        "CPU-s",
        false,
        4,
    ),
    fig(
        "scrape_on_worker_cpu_s_per_1k_req",
        "worker threads' CPU-s per 1k requests with scraper",
        "CPU-s",
        false,
        4,
    ),
    fig("scrapes_per_s", "scrapes achieved", "scrapes/s", false, 1),
    fig("metrics_kib", "/metrics body", "KiB", false, 1),
    fig(
        "scrape_ms_p50",
        "one scrape (GET /metrics + GET /config_dump), median",
        "ms",
        false,
        2,
    ),
    fig(
        "control_cpu_ms_per_scrape",
        "control threads' CPU per scrape",
        "CPU-ms",
        false,
        3,
    ),
];

/// Rows of the scrape table: (title, without key, with key, ratio key).
pub const SCRAPE_ROWS: &[(&str, &str, &str, &str)] = &[
    ("p50", "scrape_off_p50_us", "scrape_on_p50_us", "p50_x"),
    ("p90", "scrape_off_p90_us", "scrape_on_p90_us", "p90_x"),
    ("p99", "scrape_off_p99_us", "scrape_on_p99_us", "p99_x"),
    ("p99.9", "scrape_off_p999_us", "scrape_on_p999_us", "p999_x"),
    ("max", "scrape_off_max_us", "scrape_on_max_us", "max_x"),
    (
        "worker threads' CPU-s per 1k requests",
        "scrape_off_worker_cpu_s_per_1k_req",
        "scrape_on_worker_cpu_s_per_1k_req",
        "worker_cpu_x",
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
        "command line: proxy start to every pod's listeners open",
        "s",
        false,
        3,
    ),
    fig(
        "enroll_cpu_s",
        "command line: proxy CPU for it",
        "CPU-s",
        false,
        3,
    ),
    fig(
        "rss_empty_mib",
        "command line: proxy RSS, no pods",
        "MiB",
        false,
        1,
    ),
    fig(
        "rss_pods_mib",
        "command line: proxy RSS, all pods",
        "MiB",
        false,
        1,
    ),
    fig(
        "kib_per_pod",
        "command line: proxy RSS per pod",
        "KiB",
        false,
        1,
    ),
    fig("cni_add_p50_ms", "CNI ADD latency p50", "ms", false, 2),
    fig("cni_add_p90_ms", "CNI ADD latency p90", "ms", false, 2),
    fig("cni_add_p99_ms", "CNI ADD latency p99", "ms", false, 2),
    fig("cni_add_max_ms", "CNI ADD latency max", "ms", false, 2),
    fig(
        "cni_add_total_s",
        "CNI ADD: every pod, one after another",
        "s",
        false,
        3,
    ),
    fig(
        "cni_kib_per_pod",
        "CNI ADD: proxy RSS per pod",
        "KiB",
        false,
        1,
    ),
];

/// Ratios and differences to the scenario's direct baseline: (key, title,
/// figure, kind).
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

/// A measured value. Not finite (not measured, or a failed measurement) is
/// written as `null` and read back as NaN; the field itself is required
/// (a document without it is refused, naming it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl Num {
    /// The value when it is finite.
    pub fn finite(self) -> Option<f64> {
        self.0.is_finite().then_some(self.0)
    }
}

impl Serialize for Num {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else {
            s.serialize_none()
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Num, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Num;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number, or null for a value that was not measured")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Num, E> {
                Ok(Num(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_unit<E>(self) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
            fn visit_none<E>(self) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
        }
        // `deserialize_any`, not `Option`'s: a missing field is an error.
        d.deserialize_any(V)
    }
}

/// One figure over the rounds: median, spread, every round's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// Median of the finite round values.
    pub median: Num,
    /// Smallest finite round value.
    pub min: Num,
    /// Largest finite round value.
    pub max: Num,
    /// Every round's value, in round order.
    pub rounds: Vec<Num>,
}

/// The run's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// `quick`, `full`, `tiny`.
    pub label: String,
    /// Rounds.
    pub rounds: usize,
    /// Seconds per throughput run.
    pub seconds_per_throughput_run: f64,
    /// Streams of the N-streams run.
    pub streams: usize,
    /// Request rate of the latency run.
    pub latency_rate_rps: f64,
    /// Connections of the latency run.
    pub latency_connections: usize,
    /// Seconds of the latency run.
    pub latency_seconds: f64,
    /// Request size of the latency run.
    pub request_bytes: u64,
    /// Concurrent connections of the connection-rate run (over 2 client
    /// threads, event-driven, like `wrk -t2 -c<n>`).
    pub conn_threads: usize,
    /// Seconds of the connection-rate run.
    pub conn_seconds: f64,
    /// The small and large idle-connection counts.
    pub idle_connections: [usize; 2],
    /// The idle count the memory target speaks of.
    pub idle_target: usize,
    /// Pods of the churn runs.
    pub churn_pods: usize,
    /// Scrapes per second of the scrape-impact run.
    pub scrape_rate: f64,
    /// The proxy program measured.
    pub proxy_binary: String,
    /// Wall time of the run, seconds.
    pub wall_seconds: f64,
}

/// RLIMIT_NOFILE of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FdLimitDoc {
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
    /// fs.nr_open.
    pub nr_open: u64,
    /// CAP_SYS_RESOURCE held.
    pub cap_sys_resource: bool,
    /// CAP_SYS_RESOURCE in the bounding set.
    pub cap_sys_resource_in_bounding_set: bool,
}

/// One scenario's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioDoc {
    /// Key (`direct`, `tproxy_fast`, ...).
    pub key: String,
    /// Display name.
    pub name: String,
    /// `direct`, `plaintext`, `hbone` or `peer`.
    pub class: String,
    /// Virtual nodes (1 or 2).
    pub nodes: u8,
    /// Key of its direct baseline.
    pub base: String,
    /// Whether a proxy is in the path.
    pub proxied: bool,
    /// Every figure that applies, by key.
    pub figures: BTreeMap<String, Stat>,
    /// Ratios and differences to the baseline, by key (empty for a baseline).
    pub vs_direct: BTreeMap<String, Num>,
}

/// The scrape-impact section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScrapeDoc {
    /// With / without the scraper, from the printed medians, by row key.
    pub with_vs_without: BTreeMap<String, Num>,
    /// Every scrape figure, by key.
    #[serde(flatten)]
    pub figures: BTreeMap<String, Stat>,
}

/// One row of the targets table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetRow {
    /// What the target says.
    pub target: String,
    /// The figure or ratio it reads.
    pub key: String,
    /// The scenario it was measured in.
    pub scenario: String,
    /// The limit.
    pub limit: Num,
    /// `measured <= limit` when true, `>=` otherwise.
    pub at_most: bool,
    /// The measured value.
    pub measured: Num,
    /// Whether it was met.
    pub met: bool,
}

/// The whole report document (`results.json`). Every field is required:
/// reading a document without one fails with an error that names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Parameters.
    pub run: Run,
    /// The fd limit.
    pub fd_limit: FdLimitDoc,
    /// Machine description.
    pub machine: BTreeMap<String, String>,
    /// Scenarios, in run order.
    pub scenarios: Vec<ScenarioDoc>,
    /// Scrape impact.
    pub scrape: ScrapeDoc,
    /// Pod churn figures, by key.
    pub churn: BTreeMap<String, Stat>,
    /// Failed measurements.
    pub errors: Vec<String>,
    /// Notes for the reader.
    pub notes: Vec<String>,
    /// Target rows.
    pub targets: Vec<TargetRow>,
}

/// Why a report document cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Not JSON, or a field missing or of the wrong type (serde names it).
    #[error("results.json: {0}")]
    Json(#[from] serde_json::Error),
    /// A figure the report shows is not in the document.
    #[error("results.json: {section}: figure `{key}` missing")]
    MissingFigure {
        /// Where (a scenario's name, `scrape`, `churn`).
        section: String,
        /// The figure's key.
        key: String,
    },
}

impl Report {
    /// Reads a document, refusing one with a missing field or figure.
    pub fn from_json(text: &str) -> Result<Report, ReportError> {
        let r: Report = serde_json::from_str(text)?;
        r.validate()?;
        Ok(r)
    }

    /// Every figure the report renders is present.
    fn validate(&self) -> Result<(), ReportError> {
        let missing = |section: &str, key: &str| ReportError::MissingFigure {
            section: section.to_string(),
            key: key.to_string(),
        };
        for s in &self.scenarios {
            for def in FIGURES.iter().filter(|d| applies(d, s.proxied)) {
                if !s.figures.contains_key(def.key) {
                    return Err(missing(&s.name, def.key));
                }
            }
            if s.base != s.key {
                for (key, ..) in RATIOS {
                    if !s.vs_direct.contains_key(*key) {
                        return Err(missing(&s.name, key));
                    }
                }
            }
        }
        for def in SCRAPE_FIGURES {
            if !self.scrape.figures.contains_key(def.key) {
                return Err(missing("scrape", def.key));
            }
        }
        for (_, _, _, key) in SCRAPE_ROWS {
            if !self.scrape.with_vs_without.contains_key(*key) {
                return Err(missing("scrape", key));
            }
        }
        for def in CHURN_FIGURES {
            if !self.churn.contains_key(def.key) {
                return Err(missing("churn", def.key));
            }
        }
        Ok(())
    }
}

/// The median of a figure of a map, NaN when absent.
fn med(figs: &BTreeMap<String, Stat>, key: &str) -> f64 {
    figs.get(key).map_or(f64::NAN, |f| f.median.0)
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

fn stats(vals: &[f64]) -> Stat {
    let rounds = vals.iter().copied().map(Num).collect();
    let vals: Vec<f64> = vals.iter().copied().filter(|v| v.is_finite()).collect();
    let vals = &vals[..];
    let lo = vals.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    Stat {
        median: Num(median(vals)),
        min: Num(lo),
        max: Num(hi),
        rounds,
    }
}

/// Every figure of `defs` over the rounds of a section (scrape, churn).
fn section(rounds: &[Figures], defs: &[FigureDef]) -> BTreeMap<String, Stat> {
    let mut m = BTreeMap::new();
    for def in defs {
        let v: Vec<f64> = rounds
            .iter()
            .map(|f| f.get(def.key).copied().unwrap_or(f64::NAN))
            .collect();
        m.insert(def.key.into(), stats(&v));
    }
    m
}

/// What a scenario is, for the targets: `direct`, `plaintext` or `hbone`
/// (ringway), `peer` (HAProxy).
fn class(kind: Kind) -> &'static str {
    match kind {
        Kind::Direct => "direct",
        Kind::Ringway { hbone: false, .. } => "plaintext",
        Kind::Ringway { hbone: true, .. } => "hbone",
        Kind::Haproxy => "peer",
    }
}

fn applies(def: &FigureDef, proxied: bool) -> bool {
    !def.proxy_only || proxied
}

/// Which scenarios a target row is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum For {
    /// ringway plaintext scenarios on one node.
    Plaintext,
    /// ringway HBONE on one node.
    Hbone,
    /// Both.
    Ringway,
    /// A churn figure.
    Churn,
}

/// A report target: (text, scenario figure or churn figure, comparison).
struct Target {
    text: &'static str,
    key: &'static str,
    applies: For,
    le: bool,
    limit: f64,
}

const TARGETS: &[Target] = &[
    Target {
        text: "plaintext one stream ≥ 0.6x direct",
        key: "tput1_x",
        applies: For::Plaintext,
        le: false,
        limit: 0.6,
    },
    Target {
        text: "plaintext ≤ 0.5 proxy CPU-s/GB (one stream)",
        key: "cpu_s_per_gb",
        applies: For::Plaintext,
        le: true,
        limit: 0.5,
    },
    Target {
        text: "HBONE one stream ≥ 0.4x direct",
        key: "tput1_x",
        applies: For::Hbone,
        le: false,
        limit: 0.4,
    },
    Target {
        text: "HBONE ≤ 0.9 proxy CPU-s/GB (one stream)",
        key: "cpu_s_per_gb",
        applies: For::Hbone,
        le: true,
        limit: 0.9,
    },
    Target {
        text: "added p50 round trip ≤ 25 µs (plaintext)",
        key: "added_p50_us",
        applies: For::Plaintext,
        le: true,
        limit: 25.0,
    },
    Target {
        text: "added p50 round trip ≤ 45 µs (HBONE)",
        key: "added_p50_us",
        applies: For::Hbone,
        le: true,
        limit: 45.0,
    },
    Target {
        text: "p99 ≤ 2x p50",
        key: "p99_over_p50",
        applies: For::Ringway,
        le: true,
        limit: 2.0,
    },
    Target {
        text: "new connections/s ≥ 0.5x direct",
        key: "conn_x",
        applies: For::Ringway,
        le: false,
        limit: 0.5,
    },
    Target {
        text: "≤ 6 KiB proxy RSS per idle connection",
        key: "kib_per_idle_conn",
        applies: For::Ringway,
        le: true,
        limit: 6.0,
    },
    Target {
        text: "RSS with 10k idle connections ≤ 80 MiB (extrapolated unless 10k was reached)",
        key: "rss_target_idle_mib",
        applies: For::Ringway,
        le: true,
        limit: 80.0,
    },
    Target {
        text:
            "pods enrolled in ≤ 5 s (1,000 in the full run): proxy given them on its command line",
        key: "enroll_s",
        applies: For::Churn,
        le: true,
        limit: 5.0,
    },
    Target {
        text: "pods enrolled in ≤ 5 s (1,000 in the full run): CNI ADDs one after another",
        key: "cni_add_total_s",
        applies: For::Churn,
        le: true,
        limit: 5.0,
    },
    Target {
        text: "≤ 50 KiB proxy RSS per pod",
        key: "kib_per_pod",
        applies: For::Churn,
        le: true,
        limit: 50.0,
    },
];

/// Builds the report document of a run: every figure of every round,
/// medians, spreads, ratios, targets.
pub fn to_report(r: &Results) -> Report {
    let series = |s: usize, key: &str| -> Vec<f64> {
        r.rounds
            .iter()
            .map(|round| round[s].get(key).copied().unwrap_or(f64::NAN))
            .collect()
    };
    let mut scenarios = Vec::new();
    for (i, sc) in r.scenarios.iter().enumerate() {
        let proxied = sc.kind != Kind::Direct;
        let mut figs = BTreeMap::new();
        for def in FIGURES.iter().filter(|d| applies(d, proxied)) {
            figs.insert(def.key.into(), stats(&series(i, def.key)));
        }
        let mut ratios = BTreeMap::new();
        let base = r.scenarios.iter().position(|s| s.key == sc.base);
        if let Some(base) = base.filter(|b| *b != i) {
            for (key, _, fkey, kind) in RATIOS {
                let def = FIGURES.iter().find(|d| d.key == *fkey).expect("figure");
                // From the printed medians, so the report's columns agree.
                let m = printed(median(&series(i, fkey)), def.decimals);
                let d = printed(median(&series(base, fkey)), def.decimals);
                let v = match kind {
                    RatioKind::Ratio => m / d,
                    RatioKind::Added => m - d,
                };
                ratios.insert((*key).into(), Num(v));
            }
        }
        scenarios.push(ScenarioDoc {
            key: sc.key.to_string(),
            name: sc.name.to_string(),
            class: class(sc.kind).to_string(),
            nodes: if sc.two_nodes { 2 } else { 1 },
            base: sc.base.to_string(),
            proxied,
            figures: figs,
            vs_direct: ratios,
        });
    }
    let scrape = section(&r.scrape, SCRAPE_FIGURES);
    let mut scrape_ratios = BTreeMap::new();
    for (_, off, on, key) in SCRAPE_ROWS {
        let d = SCRAPE_FIGURES
            .iter()
            .find(|d| d.key == *off)
            .expect("figure");
        let a = printed(med(&scrape, off), d.decimals);
        let b = printed(med(&scrape, on), d.decimals);
        scrape_ratios.insert((*key).into(), Num(b / a));
    }
    let l = &r.fd_limit;
    let mut doc = Report {
        run: Run {
            label: r.config.label.clone(),
            rounds: r.config.rounds,
            seconds_per_throughput_run: r.config.secs,
            streams: r.config.streams,
            latency_rate_rps: r.config.rps,
            latency_connections: r.config.lat_conns,
            latency_seconds: r.config.lat_secs,
            request_bytes: 64,
            conn_threads: r.config.conn_threads,
            conn_seconds: r.config.conn_secs,
            idle_connections: r.config.idle,
            idle_target: r.config.idle_target,
            churn_pods: r.config.churn_pods,
            scrape_rate: r.config.scrape_rate,
            proxy_binary: r.config.proxy_bin.display().to_string(),
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
            with_vs_without: scrape_ratios,
            figures: scrape,
        },
        churn: section(&r.churn, CHURN_FIGURES),
        errors: r.errors.clone(),
        notes: r.notes.clone(),
        targets: Vec::new(),
    };
    doc.targets = targets(&doc);
    doc
}

fn scenario_value(s: &ScenarioDoc, key: &str) -> f64 {
    if key == "p99_over_p50" {
        return scenario_value(s, "lat_p99_us") / scenario_value(s, "lat_p50_us");
    }
    s.vs_direct
        .get(key)
        .and_then(|v| v.finite())
        .or_else(|| s.figures.get(key).and_then(|f| f.median.finite()))
        .unwrap_or(f64::NAN)
}

/// Whether a target row is for scenario `s` (targets speak of one node).
fn target_applies(t: &Target, s: &ScenarioDoc) -> bool {
    if s.nodes != 1 {
        return false;
    }
    matches!(
        (t.applies, s.class.as_str()),
        (For::Plaintext | For::Ringway, "plaintext") | (For::Hbone | For::Ringway, "hbone")
    )
}

fn targets(doc: &Report) -> Vec<TargetRow> {
    let mut rows = Vec::new();
    for t in TARGETS {
        let mut push = |scenario: &str, measured: f64| {
            let met = if t.le {
                measured <= t.limit
            } else {
                measured >= t.limit
            };
            rows.push(TargetRow {
                target: t.text.to_string(),
                key: t.key.to_string(),
                scenario: scenario.to_string(),
                limit: Num(t.limit),
                at_most: t.le,
                measured: Num(measured),
                met,
            });
        };
        if t.applies == For::Churn {
            push("pod churn", med(&doc.churn, t.key));
        } else {
            for s in &doc.scenarios {
                if target_applies(t, s) {
                    push(&s.name, scenario_value(s, t.key));
                }
            }
        }
    }
    rows
}

fn fig_def(key: &str) -> Option<&'static FigureDef> {
    FIGURES
        .iter()
        .chain(SCRAPE_FIGURES)
        .chain(CHURN_FIGURES)
        .find(|d| d.key == key)
}

/// Median cell as printed (`f` is the figure's stats, absent when the
/// figure does not apply).
fn stat_cell(f: Option<&Stat>, key: &str) -> String {
    match (fig_def(key), f.and_then(|f| f.median.finite())) {
        (Some(def), Some(m)) => fmt(m, def.decimals),
        _ => "—".into(),
    }
}

fn stat_spread(f: Option<&Stat>, key: &str) -> String {
    let Some(def) = fig_def(key) else {
        return "—".into();
    };
    match f.map(|f| (f.min.finite(), f.max.finite())) {
        Some((Some(lo), Some(hi))) => {
            format!("{}–{}", fmt(lo, def.decimals), fmt(hi, def.decimals))
        }
        _ => "—".into(),
    }
}

fn cell(s: &ScenarioDoc, key: &str) -> String {
    stat_cell(s.figures.get(key), key)
}

fn spread(s: &ScenarioDoc, key: &str) -> String {
    stat_spread(s.figures.get(key), key)
}

fn ratio_cell(s: &ScenarioDoc, key: &str) -> String {
    match s.vs_direct.get(key).and_then(|v| v.finite()) {
        Some(v) if key.starts_with("added") => format!("{v:+.1}"),
        Some(v) => format!("{v:.2}x"),
        None => "—".into(),
    }
}

fn x_cell(v: Option<f64>) -> String {
    match v {
        Some(v) => format!("{v:.2}x"),
        None => "—".into(),
    }
}

/// The scenario of `key`, if measured.
fn scenario<'a>(scen: &'a [ScenarioDoc], key: &str) -> Option<&'a ScenarioDoc> {
    scen.iter().find(|s| s.key == key)
}

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
    for key in [
        "direct",
        "tproxy_fast",
        "tproxy_2hop",
        "hbone_1node",
        "direct_2node",
        "tproxy_2node",
        "hbone_2node",
    ] {
        let Some(s) = scenario(scen, key) else {
            continue;
        };
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            s.name,
            cell(s, "tput1_gbps"),
            ratio_cell(s, "tput1_x"),
            cell(s, "tputn_gbps"),
            ratio_cell(s, "tputn_x"),
            cell(s, "conn_per_s"),
            ratio_cell(s, "conn_x"),
            cell(s, "cpu_s_per_gb"),
            cell(s, "cpu_s_per_gb_n"),
            ratio_cell(s, "added_p50_us"),
            cell(s, "cpu_s_per_1k_req"),
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
        for s in scen {
            let mut row = format!("| {} |", s.name);
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
        "Proxy CPU",
        &[
            "cpu_s_per_gb",
            "cpu_s_per_gb_n",
            "cpu_s_per_1k_req",
            "cpu_us_per_conn",
        ],
    );
    table(
        &mut m,
        "Proxy memory (idle connections each proven by a 1 B exchange)",
        &[
            "rss_idle_mib",
            "rss_small_mib",
            "idle_large_n",
            "rss_large_mib",
            "kib_per_idle_conn",
            "fds_per_idle_conn",
            "rss_target_idle_mib",
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
    for (title, off, on, key) in SCRAPE_ROWS {
        let unit = fig_def(off).map(|d| d.unit).unwrap_or("");
        let _ = writeln!(
            m,
            "| {title} ({unit}) | {} | {} | {} | {} | {} |",
            stat_cell(sc.figures.get(*off), off),
            stat_spread(sc.figures.get(*off), off),
            stat_cell(sc.figures.get(*on), on),
            stat_spread(sc.figures.get(*on), on),
            x_cell(sc.with_vs_without.get(*key).and_then(|v| v.finite())),
        );
    }
    let _ = writeln!(m, "\n| scraper | median | spread |\n| --- | --- | --- |");
    for key in [
        "scrapes_per_s",
        "metrics_kib",
        "scrape_ms_p50",
        "control_cpu_ms_per_scrape",
    ] {
        let d = fig_def(key).expect("figure");
        let _ = writeln!(
            m,
            "| {} ({}) | {} | {} |",
            d.title,
            d.unit,
            stat_cell(sc.figures.get(key), key),
            stat_spread(sc.figures.get(key), key)
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
    for def in CHURN_FIGURES {
        let f = doc.churn.get(def.key);
        let _ = writeln!(
            m,
            "| {} ({}) | {} | {} |",
            def.title,
            def.unit,
            stat_cell(f, def.key),
            stat_spread(f, def.key)
        );
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

const COLORS: &[&str] = &[
    "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c",
    "#ccb974", "#64b5cd",
];

fn esc(s: &str) -> String {
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
fn median_of(figs: &BTreeMap<String, Stat>, key: &str) -> f64 {
    figs.get(key).and_then(|f| f.median.finite()).unwrap_or(0.0)
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
                    median_of(&s.figures, "tput1_gbps"),
                    median_of(&s.figures, "tputn_gbps"),
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
    let groups: Vec<(String, Vec<f64>)> = ["p50", "p90", "p99"]
        .iter()
        .map(|q| {
            (
                q.to_string(),
                vec![
                    median_of(sc, &format!("scrape_off_{q}_us")),
                    median_of(sc, &format!("scrape_on_{q}_us")),
                ],
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
    let groups: Vec<(String, Vec<f64>)> = [
        ("CNI ADD p50", "cni_add_p50_ms"),
        ("CNI ADD p90", "cni_add_p90_ms"),
        ("CNI ADD p99", "cni_add_p99_ms"),
        ("CNI ADD max", "cni_add_max_ms"),
    ]
    .iter()
    .map(|(t, k)| (t.to_string(), vec![median_of(ch, k)]))
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
                s.name.clone(),
                keys.iter()
                    .map(|k| {
                        s.figures
                            .get(*k)
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

/// The charts: (file name, renderer).
type Chart = (&'static str, fn(&Report) -> String);

const CHARTS: &[Chart] = &[
    ("throughput.svg", throughput_svg),
    ("latency.svg", latency_svg),
    ("scrape.svg", scrape_svg),
    ("churn.svg", churn_svg),
];

/// Renders `report.md` and the charts again from `dir/results.json` (after a
/// change to the report's code), then checks them. Returns the problems.
pub fn rerender(dir: &Path) -> std::io::Result<Vec<String>> {
    let doc = Report::from_json(&std::fs::read_to_string(dir.join("results.json"))?)
        .map_err(std::io::Error::other)?;
    write(dir, &doc)?;
    Ok(check(dir))
}

/// Writes `report.md`, `results.json` and the charts to `dir`.
pub fn write(dir: &Path, doc: &Report) -> std::io::Result<String> {
    std::fs::create_dir_all(dir)?;
    let md = to_markdown(doc);
    std::fs::write(dir.join("report.md"), &md)?;
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(doc)?)?;
    for (name, render) in CHARTS {
        std::fs::write(dir.join(name), render(doc))?;
    }
    Ok(md)
}

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

/// Checks a written report: complete (every scenario has every figure it
/// should, in every round, finite; the scrape and churn sections too),
/// self-consistent (medians and spreads match the rounds, ratios match the
/// printed medians, percentiles ordered, targets' met? matches their measured
/// value, the Markdown shows what the JSON holds and no NaN/inf, every
/// scenario in the charts), files present. Returns the problems found.
pub fn check(dir: &Path) -> Vec<String> {
    let mut errs = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f));
    let (Ok(md), Ok(js)) = (read("report.md"), read("results.json")) else {
        return vec![format!("missing report files in {}", dir.display())];
    };
    let mut svgs = Vec::new();
    for (name, _) in CHARTS {
        match read(name) {
            Ok(svg) => {
                if !svg.starts_with("<svg")
                    || !svg.trim_end().ends_with("</svg>")
                    || svg.contains("NaN")
                    || svg.contains("inf")
                {
                    errs.push(format!("{name} is not a complete, finite SVG"));
                }
                svgs.push((*name, svg));
            }
            Err(_) => errs.push(format!("{name} missing")),
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
    for (name, svg) in &svgs {
        let render = CHARTS.iter().find(|c| c.0 == *name).expect("chart").1;
        if render(&doc) != *svg {
            errs.push(format!(
                "{name} differs from the chart rendered from results.json"
            ));
        }
    }
    for c in md.split('|').map(str::trim) {
        if c.contains("NaN") || c.ends_with("inf") || c.starts_with("inf") {
            errs.push(format!("report.md has a non-finite cell: {c:?}"));
        }
    }
    let rounds = doc.run.rounds;
    for e in &doc.errors {
        errs.push(format!("failed measurement: {e}"));
    }
    let scen = &doc.scenarios;
    for want in REQUIRED_SCENARIOS {
        if !scen.iter().any(|s| s.key == *want) {
            errs.push(format!("scenario {want} missing"));
        }
    }
    for s in scen {
        let name = s.name.as_str();
        if !md.contains(&format!("| {name} |")) {
            errs.push(format!("{name}: no row in report.md"));
        }
        for (chart, svg) in &svgs {
            if ["throughput.svg", "latency.svg"].contains(chart) && !svg.contains(&esc(name)) {
                errs.push(format!("{name}: not in {chart}"));
            }
        }
        let proxied = s.proxied;
        for def in FIGURES {
            let f = s.figures.get(def.key);
            if !applies(def, proxied) {
                if f.is_some() {
                    errs.push(format!(
                        "{name}: {} should not be reported without a proxy",
                        def.key
                    ));
                }
                continue;
            }
            if let Some(p) = check_stats(f, rounds) {
                errs.push(format!("{name}: {}: {p}", def.key));
                continue;
            }
            if def.key != "conn_failures"
                && f.and_then(|f| f.median.finite()).is_some_and(|m| m < 0.0)
            {
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
        .filter_map(|k| s.figures.get(*k).and_then(|f| f.median.finite()))
        .collect();
        if p.len() != 5 || p.windows(2).any(|w| w[0] > w[1]) {
            errs.push(format!(
                "{name}: latency percentiles missing or not ordered: {p:?}"
            ));
        }
        let Some(base) = scenario(scen, &s.base) else {
            errs.push(format!("{name}: its direct baseline {} is missing", s.base));
            continue;
        };
        if base.key == s.key {
            continue;
        }
        for (key, _, fkey, kind) in RATIOS {
            let def = fig_def(fkey).expect("figure");
            let pm = printed(med(&s.figures, fkey), def.decimals);
            let pd = printed(med(&base.figures, fkey), def.decimals);
            let want = match kind {
                RatioKind::Ratio => pm / pd,
                RatioKind::Added => pm - pd,
            };
            let got = s.vs_direct.get(*key).map_or(f64::NAN, |v| v.0);
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
    // Scrape impact: complete, ratios from the printed medians, printed.
    let sc = &doc.scrape;
    for def in SCRAPE_FIGURES {
        if let Some(p) = check_stats(sc.figures.get(def.key), rounds) {
            errs.push(format!("scrape: {}: {p}", def.key));
        }
        if !md.contains(&stat_cell(sc.figures.get(def.key), def.key)) {
            errs.push(format!("scrape: {} not printed", def.key));
        }
    }
    for (_, off, on, key) in SCRAPE_ROWS {
        let d = fig_def(off).expect("figure");
        let a = printed(med(&sc.figures, off), d.decimals);
        let b = printed(med(&sc.figures, on), d.decimals);
        let got = sc.with_vs_without.get(*key).map_or(f64::NAN, |v| v.0);
        if !(b / a).is_finite() || (got - b / a).abs() > 1e-9 * got.abs().max(1.0) {
            errs.push(format!(
                "scrape: {key} = {got}, but the printed figures give {}",
                b / a
            ));
        }
    }
    for k in ["off", "on"] {
        let p: Vec<f64> = ["p50", "p90", "p99", "p999", "max"]
            .iter()
            .filter_map(|q| {
                sc.figures
                    .get(&format!("scrape_{k}_{q}_us"))
                    .and_then(|f| f.median.finite())
            })
            .collect();
        if p.len() != 5 || p.windows(2).any(|w| w[0] > w[1]) {
            errs.push(format!(
                "scrape ({k}): percentiles missing or not ordered: {p:?}"
            ));
        }
    }
    for def in CHURN_FIGURES {
        let f = doc.churn.get(def.key);
        if let Some(p) = check_stats(f, rounds) {
            errs.push(format!("churn: {}: {p}", def.key));
        }
        if !md.contains(&format!(
            "| {} ({}) | {} |",
            def.title,
            def.unit,
            stat_cell(f, def.key)
        )) {
            errs.push(format!("churn: {} not printed", def.key));
        }
    }
    let cni: Vec<f64> = [
        "cni_add_p50_ms",
        "cni_add_p90_ms",
        "cni_add_p99_ms",
        "cni_add_max_ms",
    ]
    .iter()
    .filter_map(|k| doc.churn.get(*k).and_then(|f| f.median.finite()))
    .collect();
    if cni.len() != 4 || cni.windows(2).any(|w| w[0] > w[1]) {
        errs.push(format!(
            "churn: CNI ADD percentiles missing or not ordered: {cni:?}"
        ));
    }
    let targets = &doc.targets;
    let want_rows: usize = TARGETS
        .iter()
        .map(|t| {
            if t.applies == For::Churn {
                1
            } else {
                scen.iter().filter(|s| target_applies(t, s)).count()
            }
        })
        .sum();
    if targets.len() != want_rows {
        errs.push(format!("{} target rows, want {want_rows}", targets.len()));
    }
    for t in targets {
        let (v, lim) = (t.measured.0, t.limit.0);
        let met = if t.at_most { v <= lim } else { v >= lim };
        if !v.is_finite() || t.met != met {
            errs.push(format!(
                "target {:?}: measured {v}, met? inconsistent",
                t.target
            ));
        }
    }
    if !targets.iter().any(|t| t.target.starts_with("HBONE")) {
        errs.push("no HBONE target row".into());
    }
    errs
}
