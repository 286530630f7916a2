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
//! test fails, unless [`ALLOW_UNPRIVILEGED_SKIP`]` = 1` is set (never under
//! `CI=true`), in which case it prints a loud banner and returns early.

#![forbid(unsafe_code)]

pub mod cni;
mod error;
pub mod exclusive;
pub mod http;
#[cfg(feature = "kube-api")]
pub mod kube_api;
pub mod mesh;
pub mod modgraph;
pub mod node;
pub mod ns;
pub mod prom;
mod tempdir;
pub mod traffic;
mod wait;

pub use error::Error;
pub use node::{link_nodes, NodeLink, PauseProcess, Pod, VirtualNode};
pub use ns::{private_tmpfs, Netns};
pub use tempdir::TempDir;
#[cfg(feature = "async")]
pub use wait::wait_for_async;
pub use wait::{wait_for, wait_until};

/// The name libtest knows a test by, as `--exact` wants it when a test
/// runs itself again in a child process: `module` (the test's
/// `module_path!()`) without the crate's name, then `function`. E.g.
/// `libtest_name("it::proxy_bad_input", "out_of_fds")` is
/// `proxy_bad_input::out_of_fds`.
pub fn libtest_name(module: &str, function: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{function}"),
        None => function.to_string(),
    }
}

/// Logs to the test output (libtest's capture) when `RUST_LOG` is set.
/// Idempotent: the first call in a test binary installs the subscriber.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
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

/// The opt-out environment variable: `RINGWAY_ALLOW_UNPRIVILEGED_SKIP=1`
/// lets a privileged test that cannot run here return after a banner
/// instead of failing. Ignored under `CI=true`.
pub const ALLOW_UNPRIVILEGED_SKIP: &str = "RINGWAY_ALLOW_UNPRIVILEGED_SKIP";

/// Decides for a privileged test: `false` when it can run here; `true`
/// (after a loud banner) when it cannot and the caller opted out with
/// [`ALLOW_UNPRIVILEGED_SKIP`]` = 1` outside CI, so the test must return
/// without running. Panics when it cannot run otherwise: a test that did
/// not run must not look like a test that passed.
pub fn skip_privileged(test: &str) -> bool {
    let Some(why) = missing_privileges() else {
        return false;
    };
    let opted_out = std::env::var(ALLOW_UNPRIVILEGED_SKIP).is_ok_and(|v| v == "1");
    if under_ci() {
        panic!("privileged test `{test}` cannot run under CI=true: {why}");
    }
    if !opted_out {
        panic!(
            "privileged test `{test}` cannot run: {why} \
             (run as root, or set {ALLOW_UNPRIVILEGED_SKIP}=1 to skip it knowingly)"
        );
    }
    // Straight to the process's stderr: libtest's capture (which hides
    // `eprintln!` of passing tests) does not hold it back.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !!! PRIVILEGED TEST `{test}` SKIPPED ({ALLOW_UNPRIVILEGED_SKIP}=1): {why}\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    true
}

/// Runs `body` on a fresh thread inside new network and mount namespaces.
/// It holds [`exclusive::shared`] meanwhile: a test that must run
/// [`exclusive::alone`] in its process is not beside it.
///
/// Without the privileges this needs, see [`skip_privileged`]: panics,
/// or returns `None` after a banner when the caller opted out.
pub fn run_isolated<T: Send, F: FnOnce() -> T + Send>(test: &str, body: F) -> Option<T> {
    if skip_privileged(test) {
        return None;
    }
    let _running = exclusive::shared();
    let out = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(format!("isolated:{test}"))
            .spawn_scoped(s, || {
                exclusive::enter_child();
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
