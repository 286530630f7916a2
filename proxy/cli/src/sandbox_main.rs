//! `ringway sandbox` (feature `sandbox`): where its components log, and the
//! command itself, which checks its privileges and runs the demo
//! ([`crate::sandbox`]) on a thread in namespaces of its own.

use std::path::PathBuf;

use anyhow::bail;

use crate::args::{Command, SandboxArgs};
use crate::mesh_source::load_settings;
use crate::sandbox;
use crate::signals::block_stop_signals;

/// The sandbox tells its story on the terminal and writes the components'
/// logs to a file (path and file), unless `--verbose`; every other command
/// logs to stderr (`None`).
pub(crate) fn sandbox_log(command: &Command) -> anyhow::Result<Option<(PathBuf, std::fs::File)>> {
    match command {
        Command::Sandbox(args) if !args.verbose => {
            sandbox::open_log_file(args.log_file.as_deref()).map(Some)
        }
        _ => Ok(None),
    }
}

/// Runs the sandbox; its components log to `log` (a file) when given, else
/// to stderr.
pub(crate) fn run(args: SandboxArgs, log: Option<PathBuf>) -> anyhow::Result<()> {
    if let Some(why) = ringway_testbed::missing_privileges() {
        bail!(
            "ringway sandbox builds network namespaces and needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2: {why}"
        );
    }
    if args.pods < 2 {
        bail!("--pods must be at least 2 (a client and a server)");
    }
    let stop = block_stop_signals();
    let settings = load_settings(args.config.as_ref())?;
    let opts = sandbox::Options {
        pods: args.pods,
        mode: args.mode,
        bytes: args.bytes,
        settings,
        ca_service: args.ca_service,
        log: log.clone(),
    };
    let wait = args.wait.then_some(stop);
    let out = ringway_testbed::run_isolated("sandbox", || sandbox::run(&opts, wait))
        .unwrap_or_else(|| bail!("the sandbox could not run"));
    if let (Err(_), Some(log)) = (&out, &log) {
        eprintln!(
            "ringway sandbox failed; the components' logs are in {}",
            log.display()
        );
    }
    out
}
