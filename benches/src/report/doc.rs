//! The report's document, `results.json`, as typed structs: the run's
//! parameters, each scenario's figures over the rounds and its ratios to
//! direct, the scrape-impact and churn sections, the targets. Every field
//! is required and every figure is keyed by its [`Figure`]: reading a
//! document that lacks one, or names one this report does not know, fails
//! naming it. Also the derived values (ratios from the printed medians)
//! that building and checking the document share.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::figures::{Churn, Datapath, Figure, Scrape, ScrapeRatio, VsDirect};
use crate::scenario::Class;
use crate::stat::{printed, Num, Stat};

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
    pub class: Class,
    /// Virtual nodes (1 or 2).
    pub nodes: u8,
    /// Key of its direct baseline.
    pub base: String,
    /// Whether a proxy is in the path.
    pub proxied: bool,
    /// Every figure that applies.
    pub figures: BTreeMap<Datapath, Stat>,
    /// Ratios and differences to the baseline (empty for a baseline).
    pub vs_direct: BTreeMap<VsDirect, Num>,
}

impl ScenarioDoc {
    /// Whether it is its own baseline (a no-proxy scenario).
    pub fn is_baseline(&self) -> bool {
        self.base == self.key
    }
}

/// The scrape-impact section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScrapeDoc {
    /// With / without the scraper, from the printed medians.
    pub with_vs_without: BTreeMap<ScrapeRatio, Num>,
    /// Every scrape figure.
    #[serde(flatten)]
    pub figures: BTreeMap<Scrape, Stat>,
}

/// One row of the targets table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetRow {
    /// What the target says.
    pub target: String,
    /// The key of the figure or ratio it reads.
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
    /// Pod churn figures.
    pub churn: BTreeMap<Churn, Stat>,
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
    /// Not JSON, or a field missing or of the wrong type, or a figure this
    /// report does not know (serde names it).
    #[error("results.json: {0}")]
    Json(#[from] serde_json::Error),
    /// A figure the report shows is not in the document.
    #[error("results.json: {section}: figure `{key}` missing")]
    MissingFigure {
        /// Where (a scenario's name, `scrape`, `churn`).
        section: String,
        /// The figure's key.
        key: &'static str,
    },
    /// Reading or writing the report's files.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The first of `want` absent from `have`, as the error naming it.
fn first_missing<F: Figure, V>(
    section: &str,
    have: &BTreeMap<F, V>,
    want: impl IntoIterator<Item = F>,
) -> Result<(), ReportError> {
    match want.into_iter().find(|f| !have.contains_key(f)) {
        Some(f) => Err(ReportError::MissingFigure {
            section: section.to_string(),
            key: f.key(),
        }),
        None => Ok(()),
    }
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
        for s in &self.scenarios {
            let applies = Datapath::ALL.iter().copied();
            first_missing(
                &s.name,
                &s.figures,
                applies.filter(|f| f.applies(s.proxied)),
            )?;
            if !s.is_baseline() {
                first_missing(&s.name, &s.vs_direct, VsDirect::ALL.iter().copied())?;
            }
        }
        first_missing("scrape", &self.scrape.figures, Scrape::ALL.iter().copied())?;
        first_missing(
            "scrape",
            &self.scrape.with_vs_without,
            ScrapeRatio::ALL.iter().copied(),
        )?;
        first_missing("churn", &self.churn, Churn::ALL.iter().copied())
    }

    /// The scenario of `key`, if measured.
    pub fn scenario(&self, key: &str) -> Option<&ScenarioDoc> {
        self.scenarios.iter().find(|s| s.key == key)
    }
}

/// The median of `figure` in `figures`, NaN when absent.
pub fn med<F: Figure>(figures: &BTreeMap<F, Stat>, figure: F) -> f64 {
    figures.get(&figure).map_or(f64::NAN, |s| s.median.0)
}

/// The median of `figure` as the report prints it.
pub fn printed_med<F: Figure>(figures: &BTreeMap<F, Stat>, figure: F) -> f64 {
    printed(med(figures, figure), figure.def().decimals)
}

/// `derived` of scenario `s` against its baseline `base`, from the printed
/// medians (so the report's columns agree with each other).
pub fn vs_direct(
    s: &BTreeMap<Datapath, Stat>,
    base: &BTreeMap<Datapath, Stat>,
    v: VsDirect,
) -> f64 {
    let (figure, kind) = v.basis();
    kind.of(printed_med(s, figure), printed_med(base, figure))
}

/// with / without the scraper for `row`, from the printed medians.
pub fn with_vs_without(figures: &BTreeMap<Scrape, Stat>, row: ScrapeRatio) -> f64 {
    let (off, on) = row.pair();
    printed_med(figures, on) / printed_med(figures, off)
}
