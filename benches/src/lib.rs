//! ringway's end-to-end benchmarks: a load generator (`load`), the proxies
//! under test as child processes (`child`), the scenarios and rounds
//! (`suite`) and the report with its consistency check (`report`).
//! `cargo bench -p ringway-benches` runs the suite; see BENCHMARKS.md.

#![forbid(unsafe_code)]

pub mod child;
pub mod load;
pub mod report;
pub mod suite;

use ringway_config::CaptureMode;
use ringway_testbed::Pod;

pub use report::median;

/// Installs the production capture rules in `pod`.
pub fn capture(pod: &Pod, mode: CaptureMode) {
    let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings {
        capture_mode: mode,
        ..ringway_config::ProxySettings::default()
    });
    ringway_redirect::apply(pod.netns.fd(), &spec).expect("capture rules");
}

/// The proxy binary the suite runs: `RINGWAY_BENCH_PROXY_BIN` when set, else
/// the real `ringway` binary beside `wrapper` (built by `cargo build
/// --release --bin ringway`) when present, else `wrapper` (the crate's
/// `ringway-bench-proxy`: the same datapath library without the control
/// endpoints).
pub fn proxy_binary(wrapper: &std::path::Path) -> std::path::PathBuf {
    if let Ok(p) = std::env::var("RINGWAY_BENCH_PROXY_BIN") {
        return p.into();
    }
    if let Some(real) = wrapper.parent().map(|d| d.join("ringway")) {
        if real.exists() {
            return real;
        }
    }
    wrapper.to_path_buf()
}

/// Runs the suite in isolated namespaces, writes the report to `out` and
/// checks it. Returns the Markdown report and the problems `check` found;
/// `None` when the bench cannot run here (no privileges; a banner says so).
pub fn run_and_report(
    config: suite::Config,
    out: &std::path::Path,
) -> anyhow::Result<Option<(String, Vec<String>)>> {
    let label = config.label.clone();
    let Some(results) = ringway_testbed::run_isolated("bench_suite", move || suite::run(config))
    else {
        return Ok(None);
    };
    let results = results?;
    let doc = report::to_json(&results);
    let md = report::write(out, &doc)?;
    let problems = report::check(out);
    eprintln!(
        "[bench] {label} report written to {} ({} consistency problems)",
        out.display(),
        problems.len()
    );
    Ok(Some((md, problems)))
}
