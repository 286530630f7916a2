//! The report's document (`results.json`) is read into typed structs: a
//! document that lacks a field or a figure is refused with an error naming
//! it, instead of rendering a default (0, "", "—") that hides the hole.
//! No measurement runs here: the document is built from synthetic results.

use std::path::PathBuf;

use ringway_benches::config::Config;
use ringway_benches::figures::{Churn, Datapath, Figure, Figures, Scrape};
use ringway_benches::host::FdLimit;
use ringway_benches::report;
use ringway_benches::results::Results;
use ringway_benches::scenario::scenarios;
use ringway_testbed::TempDir;

/// Every figure of the kind, each a different value in declaration order
/// (so percentiles come out ordered).
fn figures<F: Figure>() -> Figures<F> {
    F::ALL
        .iter()
        .enumerate()
        .map(|(i, f)| (*f, 1.0 + i as f64))
        .collect()
}

fn results() -> Results {
    let config = Config::tiny(PathBuf::from("/nonexistent/ringway"));
    let scenarios = scenarios(false);
    let rounds = config.rounds;
    Results {
        rounds: vec![vec![figures::<Datapath>(); scenarios.len()]; rounds],
        scrape: vec![figures::<Scrape>(); rounds],
        churn: vec![figures::<Churn>(); rounds],
        scenarios,
        config,
        errors: Vec::new(),
        notes: Vec::new(),
        fd_limit: FdLimit::default(),
        wall_secs: 1.0,
        machine: vec![("cpu".into(), "test".into())],
    }
}

/// A written report whose `results.json` then loses what `edit` removes.
fn edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> TempDir {
    let dir = TempDir::new(&format!("report-fields-{name}"));
    report::write(&dir, &report::to_report(&results())).unwrap();
    let path = dir.join("results.json");
    let mut doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    dir
}

fn refused(name: &str, field: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let dir = edited(name, edit);
    match report::rerender(&dir) {
        Ok(problems) => panic!(
            "a results.json without {field} was rendered (problems: {problems:?}); \
             report.md now says:\n{}",
            std::fs::read_to_string(dir.join("report.md")).unwrap_or_default()
        ),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains(field),
                "the error does not name {field}: {msg}"
            );
        }
    }
    let problems = report::check(&dir);
    assert!(
        problems.iter().any(|p| p.contains(field)),
        "check does not name {field}: {problems:?}"
    );
}

#[test]
fn a_complete_document_renders() {
    let dir = edited("complete", |_| {});
    report::rerender(&dir).expect("a complete document renders");
}

#[test]
fn adversarial_report_missing_run_field_is_named() {
    refused("wall", "wall_seconds", |d| {
        d["run"].as_object_mut().unwrap().remove("wall_seconds");
    });
}

#[test]
fn adversarial_report_missing_targets_is_named() {
    refused("targets", "targets", |d| {
        d.as_object_mut().unwrap().remove("targets");
    });
}

#[test]
fn adversarial_report_missing_median_is_named() {
    refused("median", "median", |d| {
        d["churn"]["enroll_s"]
            .as_object_mut()
            .unwrap()
            .remove("median");
    });
}

#[test]
fn adversarial_report_missing_figure_is_named() {
    refused("figure", "cni_add_p99_ms", |d| {
        d["churn"].as_object_mut().unwrap().remove("cni_add_p99_ms");
    });
    refused("scenario_figure", "lat_p50_us", |d| {
        d["scenarios"][0]["figures"]
            .as_object_mut()
            .unwrap()
            .remove("lat_p50_us");
    });
}

#[test]
fn adversarial_report_unknown_figure_is_named() {
    // Figures are typed: a key no figure has (a typo, a figure renamed
    // since the document was written) is refused, not carried along.
    refused("unknown", "enrol_s", |d| {
        let churn = d["churn"].as_object_mut().unwrap();
        let v = churn.remove("enroll_s").unwrap();
        churn.insert("enrol_s".into(), v);
    });
}

#[test]
fn an_unmeasured_value_is_null_and_reads_back() {
    // A failed measurement is written as null and is not a missing field.
    let dir = edited("null", |d| {
        d["churn"]["enroll_s"]["median"] = serde_json::Value::Null;
    });
    report::rerender(&dir).expect("null is a value that was not measured");
}
