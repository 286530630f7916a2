//! The process's logging: stderr or a file, text or JSON, and the filter
//! the admin endpoint's `/logging` changes at run time.

use crate::args::LogFormat;

/// Changes the log filter at run time (the admin endpoint's `/logging`).
pub(crate) static LOG_RELOAD: std::sync::OnceLock<ringway_proxy::control::SetLogLevel> =
    std::sync::OnceLock::new();

/// Logs to stderr, or (`file`) to a file a person reads later: there
/// `auto` is text. Text has colours only on a terminal.
pub(crate) fn init_logs(filter: &str, format: LogFormat, file: Option<std::fs::File>) {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => file.is_none() && !std::io::stderr().is_terminal(),
    };
    let to_file = file.is_some();
    let writer = match file {
        Some(f) => BoxMakeWriter::new(std::sync::Mutex::new(f)),
        None => BoxMakeWriter::new(std::io::stderr),
    };
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(writer),
            )
            .init();
    } else {
        // Colours only for a person at a terminal, never in a file or a pipe.
        let ansi = !to_file && std::io::stderr().is_terminal();
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(writer),
            )
            .init();
    }
    let _ = LOG_RELOAD.set(std::sync::Arc::new(move |level: &str| {
        use ringway_proxy::control::LogLevelError;
        let f = tracing_subscriber::EnvFilter::try_new(level)
            .map_err(|e| LogLevelError::Invalid(e.into()))?;
        handle.reload(f).map_err(|e| LogLevelError::Apply(e.into()))
    }));
}
