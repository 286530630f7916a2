//! The `ringway` binary: one executable, several roles, each composed here from
//! the product libraries.
//!
//! - `ringway proxy`: the node proxy (`ringway-proxy`), pods from the node agent
//!   over ZDS (`ringway-zds`) or named on the command line; the mesh from the
//!   configuration (`ringway-config`) and optionally the Kubernetes API.
//! - `ringway agent`: the node agent (`ringway-cni`'s `node`): CNI events,
//!   capture rules (`ringway-redirect`), the ZDS server.
//! - `ringway redirect apply|verify|remove`: manage one pod's capture rules.
//! - `ringway-cni` (this binary under that name): the chained CNI plugin.
//! - `ringway sandbox` (feature `sandbox`, on by default, off in the image):
//!   build an isolated virtual node on this machine, capture its pods, run the
//!   proxy and a short demo (the README's first command). Only this feature
//!   reaches the test bed (`ringway-testbed`) and the test CA.
//!
//! [`main`] is the whole program; `src/main.rs` only calls it, and the benches'
//! proxy child calls it too.

#![forbid(unsafe_code)]

use clap::Parser;

use crate::agent_main::run_agent;
use crate::args::{Cli, Command};
use crate::ca_main::run_ca;
use crate::cni_main::cni_plugin_main;
use crate::logs::init_logs;
use crate::proxy_main::run_proxy;
use crate::redirect_main::redirect;

mod agent_main;
mod args;
mod ca_main;
mod ca_service;
mod cni_main;
mod logs;
mod mesh_source;
mod proxy_main;
mod redirect_main;
#[cfg(feature = "sandbox")]
mod sandbox;
#[cfg(feature = "sandbox")]
mod sandbox_main;
mod signals;
mod tcache;
mod trust;
mod xds;

/// The `ringway` program: parses the command line (or, run as `ringway-cni`,
/// the CNI call) and runs the command.
pub fn main() -> anyhow::Result<()> {
    // Installed as /opt/cni/bin/ringway-cni, the same binary is the CNI
    // plugin: the runtime passes the call in CNI_* variables and stdin.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&argv0).file_name() == Some(std::ffi::OsStr::new("ringway-cni")) {
        cni_plugin_main();
    }
    let cli = Cli::parse();
    // Before anything else (no thread, no fd, no log yet): the proxy runs
    // with glibc's per-thread cache off, by executing itself again.
    let tcache = matches!(cli.command, Command::Proxy(_)).then(tcache::reexec_with_tcache_off);
    #[cfg(feature = "sandbox")]
    use crate::sandbox_main::sandbox_log;
    let (log_file, file) = sandbox_log(&cli.command)?.unzip();
    #[cfg(not(feature = "sandbox"))]
    let _: Option<std::path::PathBuf> = log_file; // only the sandbox logs to a file
    init_logs(&cli.log, cli.log_format, file);
    match tcache {
        Some(tcache::Tcache::Off) => {
            tracing::info!(
                glibc.tunables = tcache::TCACHE_OFF,
                "glibc's per-thread malloc cache is off"
            );
        }
        Some(tcache::Tcache::Operators(set)) => {
            tracing::info!(glibc.tunables = %set, "GLIBC_TUNABLES is set: left as it is, glibc's per-thread malloc cache as it says");
        }
        Some(tcache::Tcache::NotReexecuted(why)) => {
            tracing::warn!(%why, "glibc's per-thread malloc cache stays on: more memory stays resident after a load");
        }
        None => {}
    }
    match cli.command {
        #[cfg(feature = "sandbox")]
        Command::Sandbox(args) => sandbox_main::run(args, log_file),
        Command::Proxy(args) => run_proxy(args),
        Command::Agent(args) => run_agent(args),
        Command::Ca(args) => run_ca(args),
        Command::Redirect { action } => redirect(action),
    }
}

/// Where the components log: the sandbox's own file unless `--verbose`
/// (path and file), stderr for every other command (`None`).
#[cfg(not(feature = "sandbox"))]
fn sandbox_log(_: &Command) -> anyhow::Result<Option<(std::path::PathBuf, std::fs::File)>> {
    Ok(None)
}
