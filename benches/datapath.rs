//! The benchmark suite: direct vs ringway (TPROXY fast path, TPROXY both
//! hops, REDIRECT, HBONE on one node and between two nodes, plaintext
//! between two nodes) and HAProxy when installed; then the scrape impact and
//! pod churn. Writes `results/report.md`, `results/results.json` and SVG
//! charts.
//!
//! `cargo bench -p ringway-benches` (full; with the cross-check, the upgrade
//! pass and the control plane, 20-27 min on 2 cores in the last runs);
//! `RINGWAY_BENCH_QUICK=1 cargo bench -p ringway-benches` or
//! `cargo bench -p ringway-benches -- --quick` (< 2 min, to `results/quick/`).
//! Progress goes to stderr; the report to stdout. Exits non-zero when the
//! report is incomplete or inconsistent, never because of the numbers.
//!
//! `cargo bench -p ringway-benches -- --profile-conn-rate [--perf]`: only
//! the connection-rate loop through `RINGWAY_BENCH_PROFILE_SCENARIO`
//! (default `tproxy_fast`; any one-node proxy scenario) for
//! `RINGWAY_BENCH_SECS` (default 15) seconds, with the proxy's syscalls per
//! connection (`perf stat`) and the machine's CPU split between the proxy,
//! the load generator and the rest; `perf record -a -g` beside it when
//! `--perf` is given (to `results/profile/connrate.perf.data`; see
//! BENCHMARKS.md).
//! `--profile-hbone-stream`: one stream through HBONE on one node instead;
//! `--profile-cni-add`: `RINGWAY_BENCH_CHURN_PODS` CNI ADDs one after another.
//!
//! `cargo bench -p ringway-benches -- --cni-add-ca [--quick]`: CNI ADD
//! latency with the certificate service (`ringway ca`) against a local CA
//! key and without HBONE, 200 pods each, and the CSR round trip (see
//! `cni_ca`).
//!
//! `cargo bench -p ringway-benches -- --ca-flood [--quick]`: the
//! certificate service's CSR renewals, quiet and while one source tries to
//! hold 4,096 idle HTTP/2 connections to it and sends junk-token calls; its
//! RSS (see `ca_flood`).
//!
//! `--profile-latency`: a 64 B closed-loop ping-pong through
//! `RINGWAY_BENCH_PROFILE_SCENARIO` (default `tproxy_2hop`) with the proxy's
//! syscalls, io_uring ops and context switches counted by `perf stat`.
//!
//! `cargo bench -p ringway-benches -- --cross-check`: the bundled generator
//! beside iperf3, sockperf and wrk + nginx on the same paths (see
//! `crosscheck`), to `results/crosscheck/`; the full run includes it.
//!
//! `cargo bench -p ringway-benches -- --upgrade [--quick]`: p50/p99/max
//! and failures of new connections at 1,000/s, quiet and through a rolling
//! proxy upgrade, HBONE and plaintext (see `measure::upgrade`); the full
//! run includes it (`upgrade.md` beside `report.md`).
//!
//! `cargo bench -p ringway-benches -- --flood [--quick]`: the
//! `hbone_preauth_flood` scenario alone (see `flood`), to `results/flood/`.
//!
//! `cargo bench -p ringway-benches -- --control-plane [--quick]`: the mesh
//! sources at scale (10,000 workloads, 2,000 services, 1,000 policies; a
//! tenth with `--quick`): xDS against the Kubernetes watch (see
//! `control_plane`), to `results/control-plane/` (`quick/` in it); the full and quick runs
//! include it (`control_plane.md` beside `report.md`).
//!
//! `cargo bench -p ringway-benches -- --rerender [DIR]`: renders `report.md`
//! and the charts again from `DIR/results.json` (default `results/`) and
//! checks them, without measuring.

use std::path::PathBuf;

use ringway_benches::config::Config;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let quick = args.iter().any(|a| a == "--quick")
        || std::env::var("RINGWAY_BENCH_QUICK").is_ok_and(|v| v == "1" || v == "true");
    let bin = ringway_benches::proxy_binary(std::path::Path::new(env!(
        "CARGO_BIN_EXE_ringway-bench-proxy"
    )));
    let config = if quick {
        Config::quick(bin)
    } else {
        Config::full(bin)
    }
    .with_env_overrides();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("results");
    let what = args.iter().find_map(|a| match a.as_str() {
        "--profile-conn-rate" => Some(ringway_benches::profile::Profile::ConnRate),
        "--profile-hbone-stream" => Some(ringway_benches::profile::Profile::HboneStream),
        "--profile-cni-add" => Some(ringway_benches::profile::Profile::CniAdd),
        "--profile-latency" => Some(ringway_benches::profile::Profile::Latency),
        _ => None,
    });
    if let Some(what) = what {
        let secs = std::env::var("RINGWAY_BENCH_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(15.0);
        let out = args.iter().any(|a| a == "--perf").then(|| {
            let dir = root.join("profile");
            let _ = std::fs::create_dir_all(&dir);
            dir.join(format!("{what:?}.perf.data").to_lowercase())
        });
        print_or_exit(
            "profile",
            ringway_benches::run_profile(config, what, secs, out),
        );
        return;
    }
    if args.iter().any(|a| a == "--cni-add-ca") {
        let cfg = if quick {
            ringway_benches::cni_ca::CniCaConfig::quick()
        } else {
            ringway_benches::cni_ca::CniCaConfig::full()
        }
        .with_env_overrides();
        print_or_exit(
            "cni-add-ca",
            ringway_benches::run_cni_add_ca(cfg, config.proxy_bin.clone()),
        );
        return;
    }
    if args.iter().any(|a| a == "--ca-flood") {
        let cfg = if quick {
            ringway_benches::ca_flood::CaFloodConfig::quick()
        } else {
            ringway_benches::ca_flood::CaFloodConfig::full()
        }
        .with_env_overrides();
        print_or_exit(
            "ca-flood",
            ringway_benches::run_ca_flood(cfg, config.proxy_bin.clone()),
        );
        return;
    }
    if args.iter().any(|a| a == "--upgrade") {
        let cfg = if quick {
            ringway_benches::measure::upgrade::UpgradeConfig::quick()
        } else {
            ringway_benches::measure::upgrade::UpgradeConfig::full()
        }
        .with_env_overrides();
        print_or_exit(
            "upgrade",
            ringway_benches::run_upgrade(cfg, config.proxy_bin.clone()),
        );
        return;
    }
    if args.iter().any(|a| a == "--flood") {
        let flood = if quick {
            ringway_benches::flood::FloodConfig::quick()
        } else {
            ringway_benches::flood::FloodConfig::full()
        }
        .with_env_overrides();
        let out = std::env::var("RINGWAY_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("flood"));
        let flood_bin = PathBuf::from(env!("CARGO_BIN_EXE_ringway-bench-flood"));
        match ringway_benches::run_flood(flood, config.proxy_bin.clone(), flood_bin, &out) {
            Ok(Some((md, _, problems))) => {
                println!("{md}");
                eprintln!("[bench] flood report written to {}", out.display());
                if !problems.is_empty() {
                    for p in &problems {
                        eprintln!("[bench] report problem: {p}");
                    }
                    std::process::exit(1);
                }
            }
            Ok(None) => eprintln!("[bench] not run: privileges missing (see the banner above)"),
            Err(e) => {
                eprintln!("[bench] flood failed: {e:#}");
                std::process::exit(1);
            }
        }
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--rerender") {
        // `cargo bench` appends `--bench`: a folder is any other word.
        let dir = args
            .get(i + 1)
            .filter(|a| !a.starts_with("--"))
            .map(PathBuf::from)
            .unwrap_or(root);
        match ringway_benches::report::rerender(&dir) {
            Ok(problems) if problems.is_empty() => {
                eprintln!("[bench] {} re-rendered, consistent", dir.display())
            }
            Ok(problems) => {
                for p in &problems {
                    eprintln!("[bench] report problem: {p}");
                }
                std::process::exit(1);
            }
            Err(e) => {
                eprintln!("[bench] cannot re-render {}: {e}", dir.display());
                std::process::exit(1);
            }
        }
        return;
    }
    let control_plane_config = || {
        if quick {
            ringway_benches::control_plane::ControlPlaneConfig::quick()
        } else {
            ringway_benches::control_plane::ControlPlaneConfig::full()
        }
        .with_env_overrides()
    };
    if args.iter().any(|a| a == "--control-plane") {
        let out = std::env::var("RINGWAY_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| {
                let dir = root.join("control-plane");
                if quick {
                    dir.join("quick")
                } else {
                    dir
                }
            });
        match ringway_benches::run_control_plane(
            control_plane_config(),
            config.proxy_bin.clone(),
            &out,
        ) {
            Ok(Some((md, _, problems))) => {
                println!("{md}");
                if !problems.is_empty() {
                    for p in &problems {
                        eprintln!("[bench] control-plane report problem: {p}");
                    }
                    std::process::exit(1);
                }
            }
            Ok(None) => eprintln!("[bench] not run: privileges missing (see the banner above)"),
            Err(e) => {
                eprintln!("[bench] control-plane failed: {e:#}");
                std::process::exit(1);
            }
        }
        return;
    }
    if args.iter().any(|a| a == "--cross-check") {
        let out = std::env::var("RINGWAY_BENCH_OUT")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("crosscheck"));
        print_or_exit("cross-check", ringway_benches::run_crosscheck(config, &out));
        return;
    }
    // 2 s per measurement keeps the cross-check's 5 rounds near 8 min.
    let mut crosscheck_config = config.clone();
    crosscheck_config.secs = crosscheck_config.secs.min(2.0);
    let out = match std::env::var("RINGWAY_BENCH_OUT") {
        Ok(d) => PathBuf::from(d),
        Err(_) if quick => root.join("quick"),
        Err(_) => root,
    };
    let proxy_bin = config.proxy_bin.clone();
    match ringway_benches::run_and_report(config, &out) {
        Ok(Some((md, mut problems))) => {
            println!("{md}");
            // The full run: the same paths measured with iperf3, sockperf
            // and wrk (when installed; loud when not), in its own file
            // beside the report. Not in the quick run (it must stay < 2 min).
            if !quick {
                match ringway_benches::run_crosscheck(crosscheck_config, &out) {
                    Ok(Some(cc)) => println!("\n{cc}"),
                    Ok(None) => {}
                    Err(e) => {
                        eprintln!("[bench] cross-check failed: {e:#}");
                        std::process::exit(1);
                    }
                }
            }
            // Latency through a rolling upgrade (about 40 s), in its own
            // file beside the report. Not in the quick run.
            if !quick {
                let cfg =
                    ringway_benches::measure::upgrade::UpgradeConfig::full().with_env_overrides();
                match ringway_benches::run_upgrade(cfg, proxy_bin.clone()) {
                    Ok(Some(up)) => {
                        let _ = std::fs::write(out.join("upgrade.md"), &up);
                        println!("\n{up}");
                    }
                    Ok(None) => {}
                    Err(e) => problems.push(format!("upgrade: {e:#}")),
                }
            }
            // The mesh sources at scale (a tenth of the sizes in the quick
            // run), in its own files beside the report.
            match ringway_benches::run_control_plane(control_plane_config(), proxy_bin, &out) {
                Ok(Some((cp, _, cp_problems))) => {
                    println!("\n{cp}");
                    problems.extend(
                        cp_problems
                            .into_iter()
                            .map(|p| format!("control plane: {p}")),
                    );
                }
                Ok(None) => {}
                Err(e) => problems.push(format!("control plane: {e:#}")),
            }
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("[bench] report problem: {p}");
                }
                std::process::exit(1);
            }
        }
        Ok(None) => eprintln!("[bench] not run: privileges missing (see the banner above)"),
        Err(e) => {
            eprintln!("[bench] failed: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Prints a scenario's report; says so when it could not run for lack of
/// privileges (the banner above says why); exits 1 when it failed.
fn print_or_exit(what: &str, r: anyhow::Result<Option<String>>) {
    match r {
        Ok(Some(md)) => println!("{md}"),
        Ok(None) => eprintln!("[bench] not run: privileges missing (see the banner above)"),
        Err(e) => {
            eprintln!("[bench] {what} failed: {e:#}");
            std::process::exit(1);
        }
    }
}
