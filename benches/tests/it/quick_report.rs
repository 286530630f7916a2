//! Runs the suite at its smallest (seconds) and checks the report it writes
//! is complete and self-consistent: the quick mode's checks, exercised by
//! `cargo test --workspace`. Never asserts performance.

use ringway_benches::config::Config;
use ringway_testbed::TempDir;

#[test]
fn tiny_run_writes_a_complete_consistent_report() {
    let _turn = super::one_at_a_time();
    let bin = super::proxy_bin();
    let out = TempDir::new("bench-test");
    let t0 = std::time::Instant::now();
    let Some((md, problems)) =
        ringway_benches::run_and_report(Config::tiny(bin), &out).expect("bench run")
    else {
        return; // privileges missing and RINGWAY_ALLOW_UNPRIVILEGED_SKIP=1: the banner says so
    };
    eprintln!("tiny run took {:?}", t0.elapsed());
    assert!(problems.is_empty(), "report problems: {problems:#?}\n{md}");
    assert!(md.contains("## Targets"));
}
