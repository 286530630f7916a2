//! The README's first command, `ringway sandbox`, runs the datapath on a
//! virtual node and exits 0; run twice in a row it still works.

use std::process::Command;

fn run_sandbox(extra: &[&str]) -> String {
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let out = Command::new(env!("CARGO_BIN_EXE_ringway"))
        .args(["--log-format", "text", "sandbox", "--bytes", "200000"])
        .args(extra)
        .output()
        .expect("run ringway sandbox");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "ringway sandbox failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn sandbox_runs_the_datapath_twice_in_a_row() {
    if ringway_testbed::skip_privileged("sandbox_runs_the_datapath_twice_in_a_row") {
        return;
    }
    for mode in ["tproxy", "redirect"] {
        let out = run_sandbox(&["--mode", mode]);
        // Pods enrolled through the CNI plugin path on both nodes.
        assert_eq!(out.matches("CNI ADD").count(), 4, "{out}");
        for want in [
            "plaintext  n1-pod0 -> 10.244.1.3:8080",
            "HBONE/mTLS n1-pod0 -> 10.244.2.2:8080",
            "HBONE/mTLS n1-pod0 -> [fd00:244:2::2]:8080",
            "the app saw 10.244.1.2",
            "the app saw fd00:244:1::2",
            "denied by policy demo/no-admin-port",
            "mutual_tls series on node1",
            "sandbox done",
        ] {
            assert!(out.contains(want), "missing {want:?} in:\n{out}");
        }
    }
}

#[test]
fn sandbox_rejects_a_bad_config_file_naming_the_field() {
    let dir = ringway_testbed::TempDir::new("cfg");
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let f = dir.join("bad.yaml");
    std::fs::write(&f, "proxy:\n  pipeSize: 12\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ringway"))
        .args(["proxy", "--config"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pipeSize") && err.contains("12 is outside"),
        "{err}"
    );
    assert!(err.contains("bad.yaml"), "{err}");
    std::fs::write(&f, "proxy:\n  wokers: 2\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ringway"))
        .args(["proxy", "--config"])
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown field `wokers`"), "{err}");
    drop(dir);
}

/// `ringway sandbox --ca-service`: the proxies get their certificates from a
/// certificate service (the only holder of the root key) over gRPC/TLS, and
/// HBONE between the nodes works with those certificates; without the flag
/// the sandbox still runs with a local key and says so.
#[test]
fn csr_sandbox_ca_service_mode_runs_hbone_with_ca_issued_certificates() {
    if ringway_testbed::skip_privileged(
        "csr_sandbox_ca_service_mode_runs_hbone_with_ca_issued_certificates",
    ) {
        return;
    }
    let out = run_sandbox(&["--ca-service"]);
    for want in [
        "certificates: from the certificate service at 127.0.0.1:",
        "root key only there",
        "the proxies' configs name no key",
        "HBONE/mTLS n1-pod0 -> 10.244.2.2:8080",
        "HBONE/mTLS n1-pod0 -> [fd00:244:2::2]:8080",
        "the app saw 10.244.1.2",
        "mutual_tls series on node1",
        " 0 request(s) refused",
        "CSR round trip",
        "sandbox done",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let issued: u64 = out
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("certificate service: ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no issued count in:\n{out}"));
    assert!(issued > 0, "no certificate issued:\n{out}");
    // The measured CSR round trip, for the record (no assertion on speed).
    if let Some(l) = out.lines().find(|l| l.contains("CSR round trip")) {
        println!("{}", l.trim());
    }

    let out = run_sandbox(&[]);
    for want in [
        "certificates: signed in each proxy with a local test CA key",
        "HBONE/mTLS n1-pod0 -> 10.244.2.2:8080",
        "sandbox done",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(!out.contains("certificate service:"), "{out}");
}
