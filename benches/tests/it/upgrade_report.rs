//! `--upgrade` at its smallest (200 new connections/s for a second,
//! through HBONE on one node): the old proxy, the new one started beside
//! it, the SIGTERM and the load all run, and the table has both windows
//! with connections in each. Never asserts performance (nor the failure
//! count: the restart drill proves no connection fails).

use ringway_benches::measure::upgrade::UpgradeConfig;

#[test]
fn tiny_upgrade_measures_both_windows() {
    let _turn = super::one_at_a_time();
    let bin = super::proxy_bin();
    let Some(md) = ringway_benches::run_upgrade(UpgradeConfig::tiny(), bin).expect("upgrade run")
    else {
        return; // privileges missing: run_isolated printed the banner (and panics under CI)
    };
    for window in ["| hbone_1node | quiet | ", "| hbone_1node | upgrade | "] {
        let row = md
            .lines()
            .find(|l| l.starts_with(window))
            .unwrap_or_else(|| panic!("no row {window:?} in:\n{md}"));
        let conns: u64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
        assert!(conns > 0, "no connection in {window:?}:\n{md}");
    }
}
