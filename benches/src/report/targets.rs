//! The targets the report states (issue 6's, for the one-node scenarios),
//! each a row of *target / measured / met?*: reported, never asserted. A
//! target reads a typed figure (a scenario's, its ratio to direct, or pod
//! churn's), so it cannot name one the report does not have.

use super::doc::{med, Report, ScenarioDoc, TargetRow};
use crate::figures::{Churn, Datapath, Figure, VsDirect};
use crate::scenario::Class;
use crate::stat::Num;

/// Which ringway scenarios (on one node) a target is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum For {
    /// The plaintext ones.
    Plaintext,
    /// HBONE.
    Hbone,
    /// Both.
    Ringway,
}

impl For {
    /// Whether scenario `s` is one of them (targets speak of one node).
    pub fn includes(self, s: &ScenarioDoc) -> bool {
        s.nodes == 1
            && matches!(
                (self, s.class),
                (For::Plaintext | For::Ringway, Class::Plaintext)
                    | (For::Hbone | For::Ringway, Class::Hbone)
            )
    }
}

/// What a target reads of a scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// A figure's median.
    Figure(Datapath),
    /// A ratio or difference to direct.
    VsDirect(VsDirect),
    /// The p99 latency over the p50.
    P99OverP50,
}

impl Value {
    /// Its key in `results.json`'s target rows.
    pub fn key(self) -> &'static str {
        match self {
            Value::Figure(f) => f.key(),
            Value::VsDirect(v) => v.key(),
            Value::P99OverP50 => "p99_over_p50",
        }
    }

    /// Its value in scenario `s`, NaN when not measured.
    pub fn of(self, s: &ScenarioDoc) -> f64 {
        match self {
            Value::Figure(f) => med(&s.figures, f),
            Value::VsDirect(v) => s.vs_direct.get(&v).map_or(f64::NAN, |n| n.0),
            Value::P99OverP50 => {
                med(&s.figures, Datapath::LatP99Us) / med(&s.figures, Datapath::LatP50Us)
            }
        }
    }
}

/// What a target is measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// A value of each scenario it is for.
    Scenarios(For, Value),
    /// A pod churn figure.
    Churn(Churn),
}

/// A target: what it says, what it reads, and the limit.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// What it says.
    pub text: &'static str,
    /// What it reads.
    pub subject: Subject,
    /// `measured <= limit` when true, `>=` otherwise.
    pub at_most: bool,
    /// The limit.
    pub limit: f64,
}

impl Target {
    /// Its rows in `doc`: one per scenario it is for, or one for churn.
    pub fn rows(&self, doc: &Report) -> Vec<TargetRow> {
        let row = |key: &str, scenario: &str, measured: f64| TargetRow {
            target: self.text.to_string(),
            key: key.to_string(),
            scenario: scenario.to_string(),
            limit: Num(self.limit),
            at_most: self.at_most,
            measured: Num(measured),
            met: self.met(measured),
        };
        match self.subject {
            Subject::Churn(c) => vec![row(c.key(), "pod churn", med(&doc.churn, c))],
            Subject::Scenarios(who, value) => doc
                .scenarios
                .iter()
                .filter(|s| who.includes(s))
                .map(|s| row(value.key(), &s.name, value.of(s)))
                .collect(),
        }
    }

    /// Whether `measured` meets it.
    pub fn met(&self, measured: f64) -> bool {
        if self.at_most {
            measured <= self.limit
        } else {
            measured >= self.limit
        }
    }
}

const fn target(text: &'static str, subject: Subject, at_most: bool, limit: f64) -> Target {
    Target {
        text,
        subject,
        at_most,
        limit,
    }
}

const AT_MOST: bool = true;
const AT_LEAST: bool = false;

/// Issue 6's targets, in report order.
pub const TARGETS: &[Target] = &[
    target(
        "plaintext one stream ≥ 0.6x direct",
        Subject::Scenarios(For::Plaintext, Value::VsDirect(VsDirect::Tput1X)),
        AT_LEAST,
        0.6,
    ),
    target(
        "plaintext ≤ 0.5 proxy CPU-s/GB (one stream)",
        Subject::Scenarios(For::Plaintext, Value::Figure(Datapath::CpuSPerGb)),
        AT_MOST,
        0.5,
    ),
    target(
        "HBONE one stream ≥ 0.4x direct",
        Subject::Scenarios(For::Hbone, Value::VsDirect(VsDirect::Tput1X)),
        AT_LEAST,
        0.4,
    ),
    target(
        "HBONE ≤ 0.9 proxy CPU-s/GB (one stream)",
        Subject::Scenarios(For::Hbone, Value::Figure(Datapath::CpuSPerGb)),
        AT_MOST,
        0.9,
    ),
    target(
        "added p50 round trip ≤ 25 µs (plaintext)",
        Subject::Scenarios(For::Plaintext, Value::VsDirect(VsDirect::AddedP50Us)),
        AT_MOST,
        25.0,
    ),
    target(
        "added p50 round trip ≤ 45 µs (HBONE)",
        Subject::Scenarios(For::Hbone, Value::VsDirect(VsDirect::AddedP50Us)),
        AT_MOST,
        45.0,
    ),
    target(
        "p99 ≤ 2x p50",
        Subject::Scenarios(For::Ringway, Value::P99OverP50),
        AT_MOST,
        2.0,
    ),
    target(
        "new connections/s ≥ 0.5x direct",
        Subject::Scenarios(For::Ringway, Value::VsDirect(VsDirect::ConnX)),
        AT_LEAST,
        0.5,
    ),
    target(
        "≤ 6 KiB proxy RSS per idle connection",
        Subject::Scenarios(For::Ringway, Value::Figure(Datapath::KibPerIdleConn)),
        AT_MOST,
        6.0,
    ),
    target(
        "RSS with 10k idle connections ≤ 80 MiB (extrapolated unless 10k was reached)",
        Subject::Scenarios(For::Ringway, Value::Figure(Datapath::RssTargetIdleMib)),
        AT_MOST,
        80.0,
    ),
    // Issue 26's: after a load, back within 10 % of idle plus what the
    // proxy still holds.
    target(
        "RSS after the load ≤ idle + 10 % + what the proxy still holds",
        Subject::Scenarios(For::Ringway, Value::Figure(Datapath::RssRestAfterLoadPct)),
        AT_MOST,
        10.0,
    ),
    target(
        "pods enrolled in ≤ 5 s (1,000 in the full run): proxy given them on its command line",
        Subject::Churn(Churn::EnrollS),
        AT_MOST,
        5.0,
    ),
    target(
        "pods enrolled in ≤ 5 s (1,000 in the full run): CNI ADDs one after another",
        Subject::Churn(Churn::CniAddTotalS),
        AT_MOST,
        5.0,
    ),
    target(
        "≤ 50 KiB proxy RSS per pod",
        Subject::Churn(Churn::KibPerPod),
        AT_MOST,
        50.0,
    ),
];

/// Every target's rows in `doc`, in order.
pub fn rows(doc: &Report) -> Vec<TargetRow> {
    TARGETS.iter().flat_map(|t| t.rows(doc)).collect()
}
