//! `ringway-bench-proxy`: the ringway node proxy as a child process for the
//! benches when the real `ringway` binary has not been built. It takes the
//! flags of `ringway proxy` that the benches use, with the same meaning:
//!
//! - `--pod UID=NETNS_PATH` (repeatable): pods to serve without an agent;
//! - `--zds-socket PATH`: pods from the node agent over ZDS instead;
//! - `--config FILE`: the YAML configuration (mesh, and `ca:` for HBONE);
//!   settings also from the usual `RINGWAY_*` variables;
//! - `--metrics-addr`, `--admin-addr`, `--readiness-addr`: the control
//!   endpoints, each on its own `ringway-control` thread, only when given.
//!
//! Same `ringway_proxy::Proxy`, identity manager and control handlers as
//! `ringway proxy`; what it lacks is the configuration hot reload and the
//! drain period (SIGTERM stops at once). Prints `serving` on stderr once
//! every `--pod` has its listeners; exits on SIGTERM/SIGINT.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use nix::sys::signal::{SigSet, Signal};
use ringway_proxy::control::ControlServer;
use ringway_proxy::zds_client::{Readiness, ZdsClientConfig};

#[derive(Default)]
struct Args {
    pods: Vec<(String, PathBuf)>,
    zds_socket: Option<PathBuf>,
    config: Option<PathBuf>,
    metrics: Option<SocketAddr>,
    admin: Option<SocketAddr>,
    readiness: Option<SocketAddr>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut a = Args::default();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || -> anyhow::Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value")),
            }
        };
        match flag {
            "--pod" => {
                let spec = value()?;
                let (uid, path) = spec
                    .split_once('=')
                    .with_context(|| format!("--pod {spec:?} is not UID=NETNS_PATH"))?;
                a.pods.push((uid.to_string(), PathBuf::from(path)));
            }
            "--zds-socket" => a.zds_socket = Some(value()?.into()),
            "--config" => a.config = Some(value()?.into()),
            "--metrics-addr" => a.metrics = Some(value()?.parse()?),
            "--admin-addr" => a.admin = Some(value()?.parse()?),
            "--readiness-addr" => a.readiness = Some(value()?.parse()?),
            _ => anyhow::bail!("unknown argument {arg:?}"),
        }
    }
    Ok(a)
}

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
    let args = parse_args()?;
    let mesh =
        ringway_config::MeshConfig::load(args.config.as_deref(), &ringway_config::ProcessEnv)?;
    let proxy = Arc::new(ringway_proxy::Proxy::start(mesh.proxy().clone())?);
    // HBONE exactly as `ringway proxy` turns it on: a `ca:` section.
    let _refresher = proxy.enable_hbone(&mesh)?;
    proxy.set_mesh(Arc::new(mesh));
    let ready = Arc::new(Readiness::default());
    let mut servers: Vec<ControlServer> = Vec::new();
    if let Some(addr) = args.metrics {
        servers.push(ControlServer::serve_shared(
            addr,
            ringway_proxy::control::metrics_handler(proxy.metrics(), proxy.stats_handle()),
        )?);
    }
    if let Some(addr) = args.admin {
        let no_reload: ringway_proxy::control::SetLogLevel =
            Arc::new(|_: &str| Err("not supported by ringway-bench-proxy".to_string()));
        servers.push(ControlServer::serve_shared(
            addr,
            ringway_proxy::control::admin_handler(proxy.clone(), no_reload),
        )?);
    }
    if let Some(addr) = args.readiness {
        servers.push(ControlServer::start(addr, ready.clone())?);
    }
    for (uid, path) in &args.pods {
        let fd = ringway_redirect::open_netns(path)?;
        proxy
            .add_pod(uid, fd)
            .with_context(|| format!("adding pod {uid}"))?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let zds = match &args.zds_socket {
        Some(path) => {
            let (p, r, st) = (proxy.clone(), ready.clone(), stop.clone());
            let cfg = ZdsClientConfig::new(path.clone());
            Some(
                std::thread::Builder::new()
                    .name("ringway-zds".into())
                    .spawn(move || ringway_proxy::zds_client::run(p, cfg, r, st))?,
            )
        }
        None => {
            ready.mark_snapshot_applied();
            None
        }
    };
    eprintln!("serving; SIGTERM or SIGINT stops");
    set.wait()?;
    stop.store(true, Ordering::SeqCst);
    if let Some(t) = zds {
        let _ = t.join();
    }
    drop(servers);
    match Arc::try_unwrap(proxy) {
        Ok(p) => p.shutdown(),
        Err(p) => p.stop_workers_now(),
    }
    Ok(())
}
