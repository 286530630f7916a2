//! The suite: scenarios x measurements, several rounds alternating the
//! scenarios, into a run's [`Results`] (the report then renders them; see
//! [`crate::report`]).
//!
//! Per round: every scenario (a fresh proxy each, [`measure::datapath`]),
//! then the scrape-impact measurement ([`measure::scrape`]: fixed-rate
//! latency through the fast path with and without a concurrent scraper of
//! `/metrics` and `/config_dump`), then pod churn ([`measure::churn`]:
//! 1,000 pods given to a proxy on its command line, and 1,000 CNI ADDs
//! through the plugin code, the node agent and ZDS). The top of the
//! crate's layers: it runs the measurements on the bed and fills what the
//! report reads.

use std::time::Instant;

use crate::bed::{Bed, PORT_BASE};
use crate::child::haproxy_binary;
use crate::config::Config;
use crate::figures::{Figure, Figures};
use crate::host::{machine, progress, raise_nofile};
use crate::measure;
use crate::results::Results;
use crate::scenario::scenarios;

/// Runs one measurement, timed, with its progress lines; a failure is
/// recorded in `errors` (as `round N, what: why`) and gives no figures.
fn timed<F: Figure>(
    what: &str,
    round: usize,
    errors: &mut Vec<String>,
    measure: impl FnOnce() -> anyhow::Result<Figures<F>>,
) -> Figures<F> {
    let t = Instant::now();
    let f = measure().unwrap_or_else(|e| {
        progress(format!("  failed: {e:#}"));
        errors.push(format!("round {}, {what}: {e:#}", round + 1));
        Figures::new()
    });
    progress(format!(
        "  ({:.1} s) {}",
        t.elapsed().as_secs_f64(),
        f.summary()
    ));
    f
}

/// Runs the suite. Must be called inside `ringway_testbed::run_isolated`.
pub fn run(config: Config) -> anyhow::Result<Results> {
    let t_start = Instant::now();
    let fd_limit = raise_nofile((6 * config.idle[1] as u64 + 10_000).max(200_000));
    let mut notes = Vec::new();
    if fd_limit.soft < 6 * config.idle[1] as u64 + 2_000 {
        let msg = fd_limit.note(config.idle[1]);
        progress(&msg);
        notes.push(msg);
    }
    let with_haproxy = config.haproxy && haproxy_binary().is_some();
    if config.haproxy && !with_haproxy {
        progress("haproxy not installed: peer scenario skipped (apt-get install haproxy)");
    }
    let scenarios = scenarios(with_haproxy);
    progress(format!(
        "{} run: {} rounds x {} scenarios + scrape impact + pod churn, proxy {}",
        config.label,
        config.rounds,
        scenarios.len(),
        config.proxy_bin.display()
    ));
    let bed = Bed::build()?;
    let mut rounds = Vec::new();
    let mut scrape = Vec::new();
    let mut churn = Vec::new();
    let mut errors = Vec::new();
    let mut port = PORT_BASE;
    let n = config.rounds;
    for round in 0..n {
        let mut figs = Vec::new();
        for sc in &scenarios {
            progress(format!("round {}/{n}: {}", round + 1, sc.name));
            let (mut failed, mut noted) = (Vec::new(), Vec::new());
            let f = timed(sc.name, round, &mut errors, || {
                let m = measure::datapath::run(&config, &fd_limit, &bed, sc, &mut port)?;
                (failed, noted) = (m.errors, m.notes);
                Ok(m.figures)
            });
            notes.extend(
                noted
                    .into_iter()
                    .map(|e| format!("round {}, {e}", round + 1)),
            );
            errors.extend(
                failed
                    .into_iter()
                    .map(|e| format!("round {}, {}: {e}", round + 1, sc.name)),
            );
            figs.push(f);
        }
        rounds.push(figs);
        progress(format!(
            "round {}/{n}: scrape impact ({} scrapes/s)",
            round + 1,
            config.scrape_rate
        ));
        scrape.push(timed("scrape impact", round, &mut errors, || {
            measure::scrape::run(&config, &bed, round, &mut port)
        }));
        progress(format!(
            "round {}/{n}: pod churn ({} pods)",
            round + 1,
            config.churn_pods
        ));
        churn.push(timed("pod churn", round, &mut errors, || {
            measure::churn::run(&config, &bed.scratch.0, round)
        }));
    }
    drop(bed);
    Ok(Results {
        machine: machine(),
        config,
        scenarios,
        rounds,
        scrape,
        churn,
        errors,
        notes,
        fd_limit,
        wall_secs: t_start.elapsed().as_secs_f64(),
    })
}
