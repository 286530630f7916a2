//! The test bed itself: isolation holds, pods reach each other directly.

use std::time::Duration;

use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{ns, run_isolated, VirtualNode};

#[test]
fn isolated_world_is_not_the_host_netns() {
    let host = ns::current_netns_inode();
    run_isolated("isolated_world_is_not_the_host_netns", || {
        assert_ne!(
            ns::current_netns_inode(),
            host,
            "test did not leave the host netns"
        );
        let links = std::process::Command::new("ip")
            .args(["-o", "link"])
            .output()
            .unwrap();
        let links = String::from_utf8_lossy(&links.stdout).to_string();
        assert_eq!(
            links.lines().count(),
            1,
            "fresh netns should only have lo: {links}"
        );
    });
}

#[test]
fn pods_talk_directly_over_v4_and_v6() {
    run_isolated("pods_talk_directly_over_v4_and_v6", || {
        let vn = VirtualNode::build(1, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        for v6 in [false, true] {
            let addr = std::net::SocketAddr::new(b.ip(v6), 8080);
            let l = b.netns.run(|| listen(addr)).unwrap();
            let srv = PayloadServer::start(l, 1);
            let got = a
                .netns
                .run(|| client_exchange(connect(addr, Duration::from_secs(5))?, 100_000, 50_000))
                .unwrap();
            assert_eq!(got, 50_000);
            let rep = srv.next_report(Duration::from_secs(5)).unwrap();
            assert_eq!(rep.received.unwrap(), 100_000);
            assert_eq!(rep.peer.ip(), a.ip(v6));
        }
    });
}

/// Set in the unprivileged child of the test below.
const PROBE_CHILD: &str = "RINGWAY_TESTBED_UNPRIVILEGED_PROBE";

/// A privileged test run without root must not look like a pass: it fails,
/// unless `RINGWAY_ALLOW_UNPRIVILEGED_SKIP=1` says the skip is wanted, and
/// that opt-out does nothing under `CI=true`.
#[test]
fn adversarial_unprivileged_run_fails_unless_the_skip_is_opted_out() {
    const NAME: &str = "adversarial_unprivileged_run_fails_unless_the_skip_is_opted_out";
    if std::env::var_os(PROBE_CHILD).is_some() {
        // The child, as `nobody`: this is the privileged test that cannot run.
        let ran = run_isolated("unprivileged_probe", || ());
        assert!(ran.is_none(), "ran without privileges");
        println!("probe returned");
        return;
    }
    if ringway_testbed::skip_privileged(NAME) {
        return;
    }
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt;
    // The unprivileged child is a copy of this binary in a memfd, executed
    // through the memfd's magic link in /proc: `nobody` may not be able to
    // walk the path to the binary (a checkout under a 0700 directory such as
    // root's home or a `mktemp -d`), nor execute the binary itself (cargo
    // writes it 0700 under a root umask of 077). A memfd is mode 0777 and its
    // link in /proc skips the path walk. The descriptor is close-on-exec,
    // which an ELF program does not mind.
    let copy = {
        let mut exe = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
        let memfd = nix::sys::memfd::memfd_create(
            c"ringway-unprivileged-probe",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .unwrap();
        let mut copy = std::fs::File::from(memfd);
        std::io::copy(&mut exe, &mut copy).unwrap();
        copy
    };
    let program = format!("/proc/self/fd/{}", copy.as_raw_fd());
    // The child runs this test only, named as libtest knows it (its module
    // path in this binary).
    let exact = ringway_testbed::libtest_name(module_path!(), NAME);
    // Forks outside run_isolated (see `ringway_testbed::exclusive`).
    let _running = ringway_testbed::exclusive::shared();
    let probe = |env: &[(&str, &str)]| {
        let mut cmd = std::process::Command::new(&program);
        cmd.args(["--exact", &exact, "--nocapture", "--test-threads=1"])
            .current_dir("/")
            .env(PROBE_CHILD, "1")
            .env_remove("CI")
            .env_remove(ringway_testbed::ALLOW_UNPRIVILEGED_SKIP)
            .uid(65534)
            .gid(65534);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running the probe ({program}) as uid 65534: {e}"));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (passed, text) = probe(&[]);
    assert!(!passed, "reported as passed without root:\n{text}");
    assert!(text.contains("cannot run: not root"), "{text}");
    assert!(!text.contains("probe returned"), "{text}");

    let (passed, text) = probe(&[(ringway_testbed::ALLOW_UNPRIVILEGED_SKIP, "1")]);
    assert!(passed, "the opt-out did not skip:\n{text}");
    assert!(text.contains("SKIPPED"), "{text}");

    let (passed, text) = probe(&[
        (ringway_testbed::ALLOW_UNPRIVILEGED_SKIP, "1"),
        ("CI", "true"),
    ]);
    assert!(!passed, "skipped under CI=true:\n{text}");
    assert!(text.contains("cannot run under CI=true"), "{text}");
}
