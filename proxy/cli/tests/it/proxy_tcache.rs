//! `ringway proxy` runs with glibc's per-thread malloc cache off: it
//! executes itself again at start with `GLIBC_TUNABLES=glibc.malloc.tcache_count=0`
//! (the cache's chunks keep a worker's heap pages resident after a load),
//! keeping its pid and arguments; tunables an operator set are kept as they
//! are.

use std::process::{Command, Stdio};
use std::time::Duration;

use ringway_testbed::http::scrape;
use ringway_testbed::{prom, run_isolated, wait_for, TempDir};

use crate::support::Proc;

/// How long the proxy may take to serve its metrics.
const WAIT: Duration = Duration::from_secs(30);

/// The proxy's environment, command line and log, read once it serves its
/// metrics (so it is the program that runs, not a launcher).
fn started_proxy(dir: &TempDir, tunables: Option<&str>) -> (Vec<String>, Vec<String>, String) {
    let config = dir.join("proxy.yaml");
    std::fs::write(&config, "clusterId: test-cluster\n").unwrap();
    let metrics = "127.0.0.1:15020".parse().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ringway"));
    let log = dir.join("proxy.log");
    cmd.args(["--log", "info", "proxy", "--config"])
        .arg(&config)
        .args(["--metrics-addr", "127.0.0.1:15020"])
        .args(["--admin-addr", "127.0.0.1:15000"])
        .args(["--readiness-addr", "127.0.0.1:15021"])
        .args(["--zds-socket"])
        .arg(dir.join("nobody.sock"))
        .env_remove("GLIBC_TUNABLES")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(t) = tunables {
        cmd.env("GLIBC_TUNABLES", t);
    }
    let proxy = Proc(cmd.spawn().expect("spawn ringway proxy"));
    let pid = proxy.0.id();
    wait_for("the proxy serves its metrics", WAIT, || {
        scrape(metrics).is_ok_and(|m| prom::value(&m, "ringway_pods_enrolled", &[]).is_some())
    });
    let split = |file: &str| -> Vec<String> {
        std::fs::read(format!("/proc/{pid}/{file}"))
            .unwrap()
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    let (env, args) = (split("environ"), split("cmdline"));
    drop(proxy);
    (env, args, std::fs::read_to_string(&log).unwrap())
}

/// The `GLIBC_TUNABLES=` entries of an environment.
fn tunables(env: &[String]) -> Vec<&str> {
    env.iter()
        .filter(|e| e.starts_with("GLIBC_TUNABLES="))
        .map(String::as_str)
        .collect()
}

#[test]
fn the_proxy_runs_with_the_per_thread_cache_off() {
    run_isolated("the_proxy_runs_with_the_per_thread_cache_off", || {
        let dir = TempDir::new("tcache");
        let (env, args, log) = started_proxy(&dir, None);
        assert_eq!(
            tunables(&env),
            vec!["GLIBC_TUNABLES=glibc.malloc.tcache_count=0"],
            "the running proxy's environment"
        );
        // The same program and arguments (argv[0] included), in the same
        // process: the spawned pid is the one that serves.
        assert_eq!(args[0], env!("CARGO_BIN_EXE_ringway"));
        assert_eq!(&args[1..4], ["--log", "info", "proxy"]);
        assert!(
            log.contains("glibc's per-thread malloc cache is off"),
            "{log}"
        );
        assert_eq!(log.matches("effective configuration").count(), 1, "{log}");
    });
}

#[test]
fn tunables_an_operator_set_are_kept() {
    run_isolated("tunables_an_operator_set_are_kept", || {
        for set in [
            "glibc.malloc.tcache_count=3",
            "glibc.malloc.arena_max=2:glibc.malloc.tcache_count=3",
        ] {
            let dir = TempDir::new("tcache-set");
            let (env, _, log) = started_proxy(&dir, Some(set));
            // glibc 2.36 rewrites the variable in place and leaves its first
            // tunable visible; nothing was added in front of it.
            let t = tunables(&env);
            assert_eq!(t.len(), 1, "{env:?}");
            assert!(
                set.starts_with(t[0].strip_prefix("GLIBC_TUNABLES=").unwrap()),
                "{set}: {t:?}"
            );
            assert!(
                log.contains("GLIBC_TUNABLES is set: left as it is"),
                "{log}"
            );
        }
    });
}
