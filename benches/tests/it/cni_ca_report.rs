//! `--cni-add-ca` at its smallest (3 pods per mode, 3 CSRs): the node agents,
//! the proxy children in the three modes, `ringway ca` with the fake API
//! server behind it, and the CSR round trips all run, every pod of a mode
//! with certificates gets its own, and the report has every row. Never
//! asserts performance.

use ringway_benches::cni_ca::CniCaConfig;

#[test]
fn tiny_cni_add_ca_measures_every_mode() {
    let _turn = super::one_at_a_time();
    let bin = super::proxy_bin();
    let cfg = CniCaConfig {
        pods: 3,
        csr_rounds: 3,
    };
    let Some(md) = ringway_benches::run_cni_add_ca(cfg, bin).expect("cni-add-ca run") else {
        return; // privileges missing: run_isolated printed the banner (and panics under CI)
    };
    for row in [
        "| off |",
        "| local key |",
        "| service |",
        "CSR round trip",
        // 3 pods' certificates and 3 CSR round trips, each authenticated.
        " calls (the rest answered from the CA's review cache)",
    ] {
        assert!(md.contains(row), "missing {row:?} in:\n{md}");
    }
    assert_eq!(
        md.matches("| 3/3 |").count(),
        2,
        "certificates in hand:\n{md}"
    );
    assert!(md.contains(" for 6 calls "), "every call counted:\n{md}");
}
