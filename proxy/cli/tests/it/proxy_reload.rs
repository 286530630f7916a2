//! `ringway proxy` and an edit of its configuration file: one that changes
//! the trust domain while HBONE is on is rejected as a whole (the workload
//! certificates are of the trust domain the proxy started with), naming
//! both; an edit in the same trust domain is taken.

use std::process::{Command, Stdio};
use std::time::Duration;

use ringway_identity::CaSigner;
use ringway_testbed::http::scrape;
use ringway_testbed::{prom, run_isolated, wait_for, TempDir};

use crate::support::Proc;

/// How long the proxy may take to serve, or to see an edit.
const WAIT: Duration = Duration::from_secs(30);

fn config(trust_domain: &str, cluster: &str, dir: &TempDir) -> String {
    format!(
        "clusterId: {cluster}\ntrustDomain: {trust_domain}\nca:\n  certFile: {}\n  keyFile: {}\n",
        dir.join("ca.crt").display(),
        dir.join("ca.key").display()
    )
}

#[test]
fn a_reload_that_changes_the_trust_domain_is_rejected_and_one_that_does_not_is_taken() {
    run_isolated(
        "a_reload_that_changes_the_trust_domain_is_rejected_and_one_that_does_not_is_taken",
        || {
            let dir = TempDir::new("reload-td");
            CaSigner::generate_for_tests("a.example")
                .write_pem_files(&dir.join("ca.crt"), &dir.join("ca.key"))
                .unwrap();
            let path = dir.join("proxy.yaml");
            std::fs::write(&path, config("a.example", "one", &dir)).unwrap();
            let log = dir.join("proxy.log");
            let _proxy = Proc(
                Command::new(env!("CARGO_BIN_EXE_ringway"))
                    .args(["--log", "info", "proxy", "--config"])
                    .arg(&path)
                    .args(["--metrics-addr", "127.0.0.1:15020"])
                    .args(["--admin-addr", "127.0.0.1:15000"])
                    .args(["--readiness-addr", "127.0.0.1:15021"])
                    .args(["--zds-socket"])
                    .arg(dir.join("nobody.sock"))
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .expect("spawn ringway proxy"),
            );
            let metrics = "127.0.0.1:15020".parse().unwrap();
            wait_for("the proxy serves its metrics", WAIT, || {
                scrape(metrics)
                    .is_ok_and(|m| prom::value(&m, "ringway_pods_enrolled", &[]).is_some())
            });
            let text = || std::fs::read_to_string(&log).unwrap_or_default();
            assert!(text().contains("HBONE on"), "{}", text());
            // Another trust domain: rejected, naming both.
            std::fs::write(&path, config("b.example", "two", &dir)).unwrap();
            wait_for("the trust domain edit rejected", WAIT, || {
                text().contains("configuration edit rejected")
            });
            let rejected = text();
            let line = rejected
                .lines()
                .find(|l| l.contains("configuration edit rejected"))
                .unwrap();
            for want in ["b.example", "is not the running", "a.example", "restart"] {
                assert!(line.contains(want), "{want:?} not in {line}");
            }
            assert!(!rejected.contains("configuration reloaded"), "{rejected}");
            // The same trust domain: taken.
            std::fs::write(&path, config("a.example", "three", &dir)).unwrap();
            wait_for("the edit in the same trust domain taken", WAIT, || {
                text().contains("configuration reloaded")
            });
        },
    );
}
