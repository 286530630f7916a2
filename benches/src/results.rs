//! What a run of the suite measured, before any statistics: every round's
//! figures of every scenario, of the scrape-impact run and of pod churn,
//! the failed measurements and notes, the fd limit and the machine. The
//! suite fills it ([`crate::suite`]); the report reads it
//! ([`crate::report`]), and so can a test, from synthetic values.

use crate::config::Config;
use crate::figures::{Churn, Datapath, Figures, Scrape};
use crate::host::FdLimit;
use crate::scenario::Scenario;

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct Results {
    /// The run's configuration.
    pub config: Config,
    /// Scenarios measured, in order.
    pub scenarios: Vec<Scenario>,
    /// `rounds[r][s]`: figures of scenario `s` in round `r`.
    pub rounds: Vec<Vec<Figures<Datapath>>>,
    /// Scrape-impact figures per round.
    pub scrape: Vec<Figures<Scrape>>,
    /// Churn figures per round.
    pub churn: Vec<Figures<Churn>>,
    /// Measurements that failed (the report lists them; `check` flags the holes).
    pub errors: Vec<String>,
    /// Things the reader should know (e.g. connections that failed).
    pub notes: Vec<String>,
    /// The fd limit in force and why the large idle count was lowered, if it was.
    pub fd_limit: FdLimit,
    /// Total wall time of the run, seconds.
    pub wall_secs: f64,
    /// Machine description lines.
    pub machine: Vec<(String, String)>,
}

impl Results {
    /// Scenario `s`'s values of `figure`, one per round (NaN where it was
    /// not measured).
    pub fn series(&self, s: usize, figure: Datapath) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|round| round.get(s).map_or(f64::NAN, |f| f.value(figure)))
            .collect()
    }
}
