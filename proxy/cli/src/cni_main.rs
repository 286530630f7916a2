//! `ringway-cni`: this binary run by the container runtime as the chained
//! CNI plugin.

use anyhow::Context;

/// The CNI plugin: result or error JSON on stdout, exit code as the spec says,
/// logs to the config's `logFile` (appended; stderr when unset or when it cannot
/// be opened) at its `logLevel` (`RINGWAY_CNI_LOG`, a tracing filter, overrides
/// the level when set). Never returns.
pub(crate) fn cni_plugin_main() -> ! {
    use std::io::{Read, Write};
    let mut stdin = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut stdin);
    let (log_file, level) = ringway_cni::conf::log_settings(&stdin);
    let filter = tracing_subscriber::EnvFilter::try_from_env("RINGWAY_CNI_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.as_str()));
    let file = log_file.as_ref().map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("ringway-cni: cannot open logFile {}", path.display()))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false);
    let _ = match file {
        Some(Ok(f)) => builder.with_writer(std::sync::Mutex::new(f)).try_init(),
        other => {
            if let Some(Err(why)) = other {
                eprintln!("{why:#}; logging to stderr");
            }
            builder.with_writer(std::io::stderr).try_init()
        }
    };
    let out = ringway_cni::run(
        &ringway_cni::ProcessEnv,
        &stdin,
        &ringway_cni::node::UnixAgent::default(),
    );
    let mut so = std::io::stdout().lock();
    if !out.stdout.is_empty() {
        let _ = writeln!(so, "{}", out.stdout);
    }
    let _ = so.flush();
    std::process::exit(out.exit_code)
}
