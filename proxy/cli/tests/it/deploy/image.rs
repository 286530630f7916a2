//! The image: the seccomp profile and the Dockerfile.

use std::collections::BTreeSet;

use serde_json::Value as Json;

use super::{chart_dir, deploy, read, root, BINARY_IN_IMAGE};

#[test]
fn seccomp_profile_is_runtime_default_plus_io_uring() {
    let shipped = read(&deploy().join("seccomp/ringway-proxy.json"));
    assert_eq!(
        shipped,
        read(&chart_dir().join("files/ringway-proxy.json")),
        "deploy/seccomp/ringway-proxy.json and the chart's copy must be identical"
    );
    let p: Json = serde_json::from_str(&shipped).expect("the profile is JSON");
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO", "deny by default");
    let allowed: BTreeSet<&str> = p["syscalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none())
        .flat_map(|r| r["names"].as_array().unwrap())
        .map(|n| n.as_str().unwrap())
        .collect();
    for needed in [
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "setns",
        "splice",
        "epoll_wait",
        "accept4",
        "recvmsg",
    ] {
        assert!(allowed.contains(needed), "the profile must allow {needed}");
    }
    // Everything RuntimeDefault gates behind CAP_SYS_ADMIN other than setns stays denied.
    for denied in [
        "mount",
        "umount2",
        "unshare",
        "bpf",
        "perf_event_open",
        "ptrace",
        "kexec_load",
    ] {
        assert!(
            !allowed.contains(denied),
            "the profile must not allow {denied}"
        );
    }
}

#[test]
fn dockerfile_builds_with_the_pinned_toolchain_and_the_documented_command() {
    let dockerfile = read(&deploy().join("Dockerfile"));
    let toolchain = read(&root().join("rust-toolchain.toml"));
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|l| l.split('"').nth(1))
        .expect("rust-toolchain.toml: channel");
    assert!(
        dockerfile.contains(&format!("ARG RUST_VERSION={channel}\n")),
        "deploy/Dockerfile: ARG RUST_VERSION must be {channel} (rust-toolchain.toml)"
    );
    let build = "cargo build --release --locked -p ringway --no-default-features";
    assert!(dockerfile.contains(build), "deploy/Dockerfile: `{build}`");
    let readme = read(&deploy().join("README.md"));
    assert!(
        readme.contains(build),
        "deploy/README.md documents the image's build command `{build}`"
    );
    assert!(
        dockerfile.contains(&format!(" {BINARY_IN_IMAGE}\n")),
        "deploy/Dockerfile installs the binary at {BINARY_IN_IMAGE}"
    );
    assert!(dockerfile.contains("FROM debian:bookworm-slim"));
}
