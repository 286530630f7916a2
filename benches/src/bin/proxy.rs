//! `ringway-bench-proxy --pod UID=NETNS_PATH ...`: the ringway datapath as a
//! child process for the benches when the real `ringway` binary has not been
//! built. Same `ringway_proxy::Proxy`, settings from the same `RINGWAY_*`
//! environment variables; no control endpoints (readiness, metrics, admin).
//! Prints `serving` on stderr once every pod's listeners are open; exits on
//! SIGTERM/SIGINT.

#![forbid(unsafe_code)]

use anyhow::Context;
use nix::sys::signal::{SigSet, Signal};

fn main() -> anyhow::Result<()> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()?;
    // Warnings and errors (why a connection was reset) on stderr; the bench
    // keeps the last lines for its report.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("RINGWAY_BENCH_PROXY_LOG").unwrap_or_else(|_| "warn".into()),
        ))
        .with_writer(std::io::stderr)
        .init();
    let mesh = ringway_config::MeshConfig::load(None, &ringway_config::ProcessEnv)?;
    let proxy = ringway_proxy::Proxy::start(mesh.proxy().clone())?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let spec = match a.strip_prefix("--pod=") {
            Some(s) => s.to_string(),
            None if a == "--pod" => it.next().context("--pod needs a value")?.clone(),
            None => anyhow::bail!("unknown argument {a:?}"),
        };
        let (uid, path) = spec
            .split_once('=')
            .with_context(|| format!("--pod {spec:?} is not UID=NETNS_PATH"))?;
        let fd = ringway_redirect::open_netns(std::path::Path::new(path))?;
        proxy
            .add_pod(uid, fd)
            .with_context(|| format!("adding pod {uid}"))?;
    }
    eprintln!("serving; SIGTERM or SIGINT stops");
    set.wait()?;
    proxy.shutdown();
    Ok(())
}
