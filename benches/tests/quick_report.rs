//! Runs the suite at its smallest (seconds) and checks the report it writes
//! is complete and self-consistent: the quick mode's checks, exercised by
//! `cargo test --workspace`. Never asserts performance.

use ringway_benches::config::Config;

#[test]
fn tiny_run_writes_a_complete_consistent_report() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_ringway-bench-proxy"));
    let out = std::env::temp_dir().join(format!("ringway-bench-test-{}", std::process::id()));
    let t0 = std::time::Instant::now();
    let Some((md, problems)) =
        ringway_benches::run_and_report(Config::tiny(bin), &out).expect("bench run")
    else {
        return; // privileges missing and RINGWAY_ALLOW_UNPRIVILEGED_SKIP=1: the banner says so
    };
    eprintln!("tiny run took {:?}", t0.elapsed());
    assert!(problems.is_empty(), "report problems: {problems:#?}\n{md}");
    assert!(md.contains("## Targets"));
    let _ = std::fs::remove_dir_all(&out);
}
