//! ringway's end-to-end benchmarks, run by `cargo bench -p
//! ringway-benches` (see BENCHMARKS.md), in layers with arrows one way
//! (each names only the layers below it; `cargo test -p ringway-testbed
//! --test it -- crate_graph::` checks there is no cycle):
//!
//! 1. **The model and the leaves.** [`figures`]: every figure, declared
//!    once as a variant of a typed kind; [`stat`]: medians, spreads,
//!    printed values; [`config`]: how big a run is; [`scenario`]: what
//!    carries the traffic; [`results`]: what a run measured; [`host`]: the
//!    bench process and its machine; [`child`]: proxies as child processes;
//!    [`load`]: the load generator.
//! 2. **The bed.** [`bed`]: two virtual nodes, starting a scenario's
//!    proxies, the node agent's side of a CNI ADD, scraping `/metrics`
//!    (with the test bed's parser, `ringway_testbed::prom`); [`tools`]:
//!    iperf3, sockperf and wrk + nginx on a path.
//! 3. **The measurements.** [`measure`]: a scenario's datapath figures,
//!    scrape impact, pod churn, the upgrade window; [`profile`]: one
//!    measurement alone under `perf`; [`crosscheck`]: the bundled generator
//!    beside the standard tools; and the scenarios with reports of their
//!    own: [`flood`] (15008 before authentication), [`cni_ca`] (CNI ADD with
//!    the certificate service), [`ca_flood`] (the certificate service under
//!    a junk flood), [`control_plane`] (xDS against the Kubernetes watch at
//!    scale).
//! 4. **The report.** [`report`]: the typed document, its Markdown, charts,
//!    targets and consistency check.
//! 5. **The suite.** [`suite`]: every scenario and measurement, round after
//!    round; and this crate root, which runs each in isolated namespaces
//!    and writes its report.

#![forbid(unsafe_code)]

pub mod bed;
pub mod ca_flood;
pub mod child;
pub mod cni_ca;
pub mod config;
pub mod control_plane;
pub mod crosscheck;
pub mod figures;
pub mod flood;
pub mod host;
pub mod load;
pub mod measure;
pub mod netstat;
pub mod profile;
pub mod report;
pub mod results;
pub mod scenario;
pub mod stat;
pub mod suite;
pub mod tools;

/// The `ringway` program the suite runs (as `BIN proxy ...`):
/// `RINGWAY_BENCH_PROXY_BIN` when set (to measure another build), else
/// `own`, the crate's `ringway-bench-proxy`: `ringway::main` itself, rebuilt
/// from the current sources by every `cargo bench`.
pub fn proxy_binary(own: &std::path::Path) -> std::path::PathBuf {
    match std::env::var("RINGWAY_BENCH_PROXY_BIN") {
        Ok(p) => p.into(),
        Err(_) => own.to_path_buf(),
    }
}

/// Runs the suite in isolated namespaces, writes the report to `out` and
/// checks it. Returns the Markdown report and the problems `check` found;
/// `None` when the bench cannot run here and the caller opted into the skip
/// (`RINGWAY_ALLOW_UNPRIVILEGED_SKIP=1`; a banner says so); without the
/// opt-out, missing privileges panic (see `ringway_testbed::skip_privileged`).
pub fn run_and_report(
    config: config::Config,
    out: &std::path::Path,
) -> anyhow::Result<Option<(String, Vec<String>)>> {
    let label = config.label.clone();
    let Some(results) = ringway_testbed::run_isolated("bench_suite", move || suite::run(config))
    else {
        return Ok(None);
    };
    let results = results?;
    let doc = report::to_report(&results);
    let md = report::write(out, &doc)?;
    let problems = report::check(out);
    eprintln!(
        "[bench] {label} report written to {} ({} consistency problems)",
        out.display(),
        problems.len()
    );
    Ok(Some((md, problems)))
}

/// Runs one measurement alone for `secs` in isolated namespaces (see
/// [`profile::profile`]), with `perf record -a -g` to `perf_out` beside it
/// when given. Returns a summary line; `None` without privileges.
pub fn run_profile(
    config: config::Config,
    what: profile::Profile,
    secs: f64,
    perf_out: Option<std::path::PathBuf>,
) -> anyhow::Result<Option<String>> {
    ringway_testbed::run_isolated("bench_profile", move || {
        profile::profile(&config, what, secs, perf_out.as_deref())
    })
    .transpose()
}

/// Runs the `hbone_preauth_flood` scenario (see [`flood`]) in isolated
/// namespaces with the proxy `proxy_bin` and the flood generator
/// `flood_bin`, writes `flood.json` and `flood.md` to `out` and checks the
/// report. Returns the Markdown, the report and its problems; `None`
/// without privileges.
pub fn run_flood(
    config: flood::FloodConfig,
    proxy_bin: std::path::PathBuf,
    flood_bin: std::path::PathBuf,
    out: &std::path::Path,
) -> anyhow::Result<Option<(String, flood::FloodReport, Vec<String>)>> {
    let Some(r) = ringway_testbed::run_isolated("bench_flood", move || {
        flood::run(config, &proxy_bin, &flood_bin)
    }) else {
        return Ok(None);
    };
    let r = r?;
    let md = flood::write(out, &r)?;
    let problems = flood::check(&r);
    Ok(Some((md, r, problems)))
}

/// Runs the `--cni-add-ca` measurement (see [`cni_ca`]) in isolated
/// namespaces with the `ringway` program `bin` (proxy and `ringway ca`).
/// Returns the report lines; `None` without privileges.
pub fn run_cni_add_ca(
    config: cni_ca::CniCaConfig,
    bin: std::path::PathBuf,
) -> anyhow::Result<Option<String>> {
    ringway_testbed::run_isolated("bench_cni_add_ca", move || cni_ca::run(&config, &bin))
        .transpose()
}

/// Runs the `--ca-flood` measurement (see [`ca_flood`]) in an isolated
/// namespace with the `ringway` program `bin` (`ringway ca`). Returns the
/// report lines; `None` without privileges.
pub fn run_ca_flood(
    config: ca_flood::CaFloodConfig,
    bin: std::path::PathBuf,
) -> anyhow::Result<Option<String>> {
    ringway_testbed::run_isolated("bench_ca_flood", move || ca_flood::run(&config, &bin))
        .transpose()
}

/// Runs the `--upgrade` measurement (see [`measure::upgrade`]) in isolated
/// namespaces with the `ringway` program `bin`. Returns the report table;
/// `None` without privileges.
pub fn run_upgrade(
    config: measure::upgrade::UpgradeConfig,
    bin: std::path::PathBuf,
) -> anyhow::Result<Option<String>> {
    ringway_testbed::run_isolated("bench_upgrade", move || {
        measure::upgrade::run(&config, &bin).map(|r| measure::upgrade::render(&r))
    })
    .transpose()
}

/// Runs the cross-check with the standard tools (see [`crosscheck`]) in
/// isolated namespaces, writes `crosscheck.json` and `crosscheck.md` to
/// `out`. Returns the Markdown; `None` without privileges.
pub fn run_crosscheck(
    config: config::Config,
    out: &std::path::Path,
) -> anyhow::Result<Option<String>> {
    let Some(doc) =
        ringway_testbed::run_isolated("bench_crosscheck", move || crosscheck::run(&config))
    else {
        return Ok(None);
    };
    let doc = doc?;
    let md = crosscheck::write(out, &doc)?;
    eprintln!(
        "[bench] cross-check written to {} ({} failed measurements)",
        out.display(),
        doc.errors.len()
    );
    Ok(Some(md))
}

/// Runs the `--control-plane` measurement (see [`control_plane`]) in
/// isolated namespaces with the `ringway` program `bin` as the proxy
/// children, writes `control_plane.json` and `control_plane.md` to `out`
/// and checks the report. Returns the Markdown, the report and its
/// problems; `None` without privileges.
pub fn run_control_plane(
    config: control_plane::ControlPlaneConfig,
    bin: std::path::PathBuf,
    out: &std::path::Path,
) -> anyhow::Result<Option<(String, control_plane::ControlPlaneReport, Vec<String>)>> {
    let Some(r) = ringway_testbed::run_isolated("bench_control_plane", move || {
        control_plane::run(&config, &bin)
    }) else {
        return Ok(None);
    };
    let r = r?;
    let md = control_plane::write(out, &r)?;
    let problems = control_plane::check(&r);
    eprintln!(
        "[bench] control-plane report written to {} ({} consistency problems)",
        out.display(),
        problems.len()
    );
    Ok(Some((md, r, problems)))
}
