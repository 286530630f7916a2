//! `--ca-flood` at its smallest (1 s per phase, 200 idle connections): the
//! certificate service, the two renewing node proxies and the attacker all
//! run, the renewals succeed quiet and under the flood, the attacker holds
//! no more than its source's share of connections, and the report has
//! every row. Never asserts performance.

use ringway_benches::ca_flood::CaFloodConfig;

#[test]
fn tiny_ca_flood_measures_both_phases() {
    let _turn = super::one_at_a_time();
    let bin = super::proxy_bin();
    let Some(md) = ringway_benches::run_ca_flood(CaFloodConfig::tiny(), bin).expect("ca-flood run")
    else {
        return; // privileges missing: run_isolated printed the banner (and panics under CI)
    };
    eprintln!("{md}");
    for row in ["| quiet |", "| flood |", "The attacker:", "The CA: RSS"] {
        assert!(md.contains(row), "missing {row:?} in:\n{md}");
    }
    for line in md
        .lines()
        .filter(|l| l.starts_with("| quiet |") || l.starts_with("| flood |"))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_ne!(cells[2], "0", "no renewal measured: {line}");
        assert_eq!(cells[3], "0", "a renewal failed: {line}\n{md}");
    }
    assert!(
        md.contains("per_source"),
        "the per-source cap refused connections:\n{md}"
    );
}
