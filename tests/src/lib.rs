//! The ringway test bed: a *virtual node* made of real network namespaces.
//!
//! Every test (and bench, and the sandbox) starts with [`run_isolated`], which
//! runs the test body on a thread that has first moved into fresh network and
//! mount namespaces of its own. Only then are the node and pod namespaces
//! created, *inside* that isolated world, so no test packet can reach the
//! machine's real interfaces and no route or address is ever added to the
//! machine's root namespace. Everything is torn down when the thread ends.
//!
//! Privileged tests never pass silently: without the needed privileges the
//! test prints a loud banner, and under `CI=true` it fails.

#![forbid(unsafe_code)]

pub mod node;
pub mod ns;
pub mod traffic;

pub use node::{link_nodes, NodeLink, PauseProcess, Pod, VirtualNode};
pub use ns::{private_tmpfs, Netns};

/// Errors of the test bed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A syscall failed.
    #[error("{0}: {1}")]
    Sys(&'static str, #[source] nix::Error),
    /// An I/O operation failed.
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    /// A helper command (`ip`, `nft`) failed.
    #[error("command `{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A capacity or lookup limit of the test bed.
    #[error("{0}")]
    Capacity(&'static str),
}

/// Why privileged tests cannot run here, or `None` when they can.
pub fn missing_privileges() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some(format!(
            "not root (euid {}): network-namespace tests need root (CAP_NET_ADMIN + CAP_SYS_ADMIN)",
            nix::unistd::geteuid()
        ));
    }
    if std::process::Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` program (iproute2) is not installed".to_string());
    }
    None
}

/// True when running under CI (`CI=true`).
pub fn under_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Runs `body` on a fresh thread inside new network and mount namespaces.
///
/// Returns `None` (after a loud banner) when privileges are missing outside CI;
/// panics when they are missing under `CI=true`.
pub fn run_isolated<T: Send, F: FnOnce() -> T + Send>(test: &str, body: F) -> Option<T> {
    if let Some(why) = missing_privileges() {
        let banner = format!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !!! PRIVILEGED TEST `{test}` DID NOT RUN: {why}\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
        );
        eprintln!("{banner}");
        if under_ci() {
            panic!("privileged test `{test}` cannot run under CI=true: {why}");
        }
        return None;
    }
    let out = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(format!("isolated:{test}"))
            .spawn_scoped(s, || {
                ns::isolate_current_thread().unwrap_or_else(|e| {
                    panic!("test `{test}`: cannot isolate into fresh namespaces: {e}")
                });
                body()
            })
            .expect("spawn isolated test thread")
            .join()
    });
    match out {
        Ok(v) => Some(v),
        Err(p) => std::panic::resume_unwind(p),
    }
}
