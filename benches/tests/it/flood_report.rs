//! The `hbone_preauth_flood` scenario at its smallest (500 connections, one
//! round, half a second per measurement): the flood generator, the proxy
//! child, the neighbour's measurements and the metrics scrape all run and
//! the typed report is complete. Never asserts performance.

use ringway_benches::flood::{FloodConfig, FloodReport};
use ringway_testbed::TempDir;

#[test]
fn tiny_flood_writes_a_complete_report() {
    let _turn = super::one_at_a_time();
    let proxy = super::proxy_bin();
    let flood = super::flood_bin();
    let out = TempDir::new("flood-test");
    let Some((md, report, problems)) =
        ringway_benches::run_flood(FloodConfig::tiny(), proxy, flood, &out).expect("flood run")
    else {
        return; // privileges missing: run_isolated printed the banner (and panics under CI)
    };
    assert!(problems.is_empty(), "report problems: {problems:#?}\n{md}");
    let round = &report.rounds[0];
    assert!(
        round.counts.opened > 0,
        "the flood opened connections: {md}"
    );
    assert_eq!(
        round.deadlines.not_closed, 0,
        "every silent connection is closed at its pre-authentication deadline: {md}"
    );
    assert!(
        round.refused.values().sum::<f64>() > 0.0,
        "500 connections from 4 sources pass the per-source cap of 64: some are refused\n{md}"
    );
    // The document reads back as the typed report and renders the same
    // Markdown (serde_json may round a float's last digit: not compared).
    let text = std::fs::read_to_string(out.join("flood.json")).expect("flood.json");
    let back: FloodReport = serde_json::from_str(&text).expect("flood.json parses");
    assert_eq!(back.rounds.len(), report.rounds.len());
    assert_eq!(ringway_benches::flood::render(&back), md);
}
