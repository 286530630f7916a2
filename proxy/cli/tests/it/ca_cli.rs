//! `ringway ca` refuses bad configuration at start with an error that names
//! what is wrong (it never gets as far as the network: no traffic here).

use std::process::Command;

fn run(args: &[&str]) -> (i32, String) {
    // A fork outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let out = Command::new(env!("CARGO_BIN_EXE_ringway"))
        .arg("ca")
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ringway_ca_names_what_is_wrong_in_its_configuration() {
    let dir = ringway_testbed::TempDir::new("ca-cli");
    let ca = ringway_identity::CaSigner::generate_for_tests("cluster.local");
    let (cert, key) = (dir.join("root.pem"), dir.join("root-key.pem"));
    ca.write_pem_files(&cert, &key).unwrap();
    let (c, k) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let missing = dir.join("nope.pem");
    let m = missing.to_str().unwrap();

    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--tls-cert",
                c,
                "--tls-key",
                k,
                "--root-cert",
                c,
                "--root-cert",
                c,
                "--root-key",
                k,
            ],
            "2 --root-cert but 1 --root-key",
        ),
        (
            vec![
                "--tls-cert",
                c,
                "--tls-key",
                k,
                "--root-cert",
                c,
                "--root-key",
                k,
                "--node-proxy-sa",
                "just-a-name",
            ],
            "--node-proxy-sa \"just-a-name\" is not namespace/serviceAccount",
        ),
        (
            vec![
                "--tls-cert",
                c,
                "--tls-key",
                k,
                "--root-cert",
                m,
                "--root-key",
                k,
            ],
            "nope.pem",
        ),
        (
            vec![
                "--tls-cert",
                m,
                "--tls-key",
                k,
                "--root-cert",
                c,
                "--root-key",
                k,
            ],
            "serving certificate",
        ),
        (
            // The root's key as the serving key of another certificate: a pair
            // that does not match is refused, not served.
            vec![
                "--tls-cert",
                c,
                "--tls-key",
                m,
                "--root-cert",
                c,
                "--root-key",
                k,
            ],
            "nope.pem",
        ),
    ];
    // Limits out of range are named before anything is served.
    let good = [
        "--tls-cert",
        c,
        "--tls-key",
        k,
        "--root-cert",
        c,
        "--root-key",
        k,
    ];
    let limit_cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--max-connections-per-source", "5000"],
            "max_connections_per_source: 5000 is more than max_connections (4096)",
        ),
        (
            vec!["--idle-timeout-secs", "0"],
            "idle_timeout: must be more than 0",
        ),
        (
            vec!["--reviews-per-source", "0"],
            "limit review_rate_per_source must be positive",
        ),
    ];
    let cases = cases
        .into_iter()
        .chain(limit_cases.into_iter().map(|(extra, words)| {
            let mut args = good.to_vec();
            args.extend(extra);
            (args, words)
        }));
    for (args, words) in cases {
        let (code, err) = run(&args);
        assert_ne!(code, 0, "{args:?} must fail");
        assert!(
            err.contains(words),
            "{args:?}: expected {words:?} in:\n{err}"
        );
    }
}
