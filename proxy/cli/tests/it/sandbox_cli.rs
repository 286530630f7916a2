//! The README's first command, `ringway sandbox`, runs the datapath on a
//! virtual node and exits 0; run twice in a row it still works. It reads as
//! a demo: its steps and results on stdout, the components' logs in the
//! file it names (or on stderr with `--verbose`), and no warning or error
//! anywhere on a clean run.

use std::path::PathBuf;
use std::process::Command;

/// Log levels as the text format writes them (`2026-... WARN target: ...`).
const LEVELS: [&str; 5] = [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "];

/// What a sandbox run printed, and the components' log.
struct Run {
    stdout: String,
    stderr: String,
    /// The log file's contents (`--verbose`: the components logged to stderr).
    log: String,
}

/// Runs the sandbox (exit 0 required) and checks what every clean run must
/// show: the demo's steps on stdout and no component's log line there; the
/// components' logs where the demo says (the file it names at its start and
/// end, then removed here; or stderr with `--verbose`), with their INFO
/// lines and without a WARN or an ERROR.
fn run_sandbox(extra: &[&str]) -> Run {
    // Alone: the sandbox's agents scan the machine's network namespaces as a
    // node agent does, so another test's tagged pods (same node name) would
    // be reported, rightly, as pods they have no record of.
    let _alone = ringway_testbed::exclusive::alone();
    let out = Command::new(env!("CARGO_BIN_EXE_ringway"))
        .args(["--log-format", "text", "sandbox", "--bytes", "200000"])
        .args(extra)
        .output()
        .expect("run ringway sandbox");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "ringway sandbox failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for step in [
        "1. The mesh",
        "2. Two nodes",
        "3. Pods enrolled",
        "4. Traffic",
        "5. A connection the policy denies",
        "6. What an operator sees",
        "7. Stopped in order",
        "sandbox done",
    ] {
        assert!(stdout.contains(step), "missing step {step:?} in:\n{stdout}");
    }
    for line in stdout.lines() {
        assert!(
            !LEVELS.iter().any(|l| line.contains(l)),
            "a component's log line on stdout: {line}\nstdout:\n{stdout}"
        );
    }
    let named: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("components' logs: "))
        .collect();
    let verbose = extra.iter().any(|a| *a == "--verbose" || *a == "-v");
    let log = if verbose {
        assert_eq!(named, ["this terminal (--verbose)"], "{stdout}");
        stderr.clone()
    } else {
        assert!(
            stderr.is_empty(),
            "a clean run printed on stderr:\n{stderr}"
        );
        assert_eq!(
            named.len(),
            2,
            "the log file is named at start and end:\n{stdout}"
        );
        assert_eq!(named[0], named[1], "{stdout}");
        let path = PathBuf::from(named[0]);
        assert!(path.is_absolute(), "{}", path.display());
        if let Some(i) = extra.iter().position(|a| *a == "--log-file") {
            assert_eq!(path, PathBuf::from(extra[i + 1]), "--log-file");
        }
        let log = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("the named log file {}: {e}", path.display()));
        std::fs::remove_file(&path).unwrap();
        log
    };
    // The components' INFO lines: both agents, both proxies, the CNI plugin,
    // the access log.
    for want in [
        "ringway_cni::node::handle: node agent serving",
        "ringway_proxy::zds_client: connected to the node agent",
        "ringway_cni::run: pod captured",
        "access: connection closed",
        "ringway_cni::node::handle: node agent stopped",
    ] {
        assert!(
            log.lines()
                .any(|l| l.contains(" INFO ") && l.contains(want)),
            "no INFO line with {want:?} in the components' log:\n{log}"
        );
    }
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        bad.is_empty(),
        "warnings or errors on a clean run:\n{}",
        bad.join("\n")
    );
    Run {
        stdout,
        stderr,
        log,
    }
}

#[test]
fn sandbox_runs_the_datapath_twice_in_a_row() {
    if ringway_testbed::skip_privileged("sandbox_runs_the_datapath_twice_in_a_row") {
        return;
    }
    // The second run's log goes where --log-file says.
    let dir = ringway_testbed::TempDir::new("sandbox-log");
    let given = dir.join("demo.log");
    for (mode, log) in [("tproxy", None), ("redirect", given.to_str())] {
        let mut args = vec!["--mode", mode];
        args.extend(log.map(|l| ["--log-file", l]).into_iter().flatten());
        let out = run_sandbox(&args).stdout;
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
    let out = run_sandbox(&["--ca-service"]).stdout;
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

    // With --verbose the components' logs are on stderr (checked clean by
    // run_sandbox), never mixed into stdout.
    let run = run_sandbox(&["--verbose"]);
    assert!(run.stderr.contains(" INFO "), "{}", run.stderr);
    assert_eq!(run.log, run.stderr);
    let out = run.stdout;
    for want in [
        "certificates: signed in each proxy with a local test CA key",
        "HBONE/mTLS n1-pod0 -> 10.244.2.2:8080",
        "sandbox done",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    assert!(!out.contains("certificate service:"), "{out}");
}
