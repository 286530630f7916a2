//! The benchmark suite: direct vs ringway (TPROXY fast path, TPROXY both
//! hops, REDIRECT) and HAProxy when installed, on the virtual node; then pod
//! churn. Writes `results/report.md`, `results/results.json` and SVG charts.
//!
//! `cargo bench -p ringway-benches` (full, < 15 min on 2 cores);
//! `RINGWAY_BENCH_QUICK=1 cargo bench -p ringway-benches` or
//! `cargo bench -p ringway-benches -- --quick` (< 2 min, to `results/quick/`).
//! Progress goes to stderr; the report to stdout. Exits non-zero when the
//! report is incomplete or inconsistent, never because of the numbers.

use std::path::PathBuf;

use ringway_benches::suite::Config;

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
    let out = match std::env::var("RINGWAY_BENCH_OUT") {
        Ok(d) => PathBuf::from(d),
        Err(_) if quick => root.join("quick"),
        Err(_) => root,
    };
    match ringway_benches::run_and_report(config, &out) {
        Ok(Some((md, problems))) => {
            println!("{md}");
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
