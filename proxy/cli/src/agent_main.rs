//! `ringway agent`: the node agent, composed from `ringway-cni`'s `node`,
//! its Kubernetes watch and the CNI installer.

use crate::args::AgentArgs;
use crate::mesh_source::load_settings;
use crate::signals::block_stop_signals;
use anyhow::bail;
use anyhow::Context;

pub(crate) fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let stop = block_stop_signals();
    // As the proxy: the soft fd limit (often 1024) up to the hard one, so
    // connections to the control port, pods and proxies cannot run the
    // agent out of fds before its own caps apply.
    match ringway_proxy::sys::raise_nofile_limit() {
        Ok((old, new)) => {
            tracing::info!(rlimit.nofile.old = old, rlimit.nofile.new = new, "fd limit")
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the fd limit"),
    }
    let settings = load_settings(args.config.as_ref())?;
    // With --kube the CNI ADD and the watch follow one rule (the
    // `ringway.io/dataplane-mode` and `istio.io/dataplane-mode` labels),
    // answered from the watch's caches or the API server: the client and the
    // runtime it runs on exist before the agent serves its first ADD. The runtime is the agent's control plane, on
    // its own thread (`ringway-kube`, below), never the datapath's.
    let kube = if args.kube {
        if args.node_name.is_empty() {
            bail!("--kube needs the node's name (--node-name or NODE_NAME)");
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the Kubernetes watch runtime")?;
        let client = rt.block_on(ringway_cni::kube::connect()).context(
            "--kube: without the Kubernetes API the agent cannot tell which pods to capture",
        )?;
        // The pods it captures carry `ambient.istio.io/redirection: enabled`,
        // patched on the same runtime, never in the way of a CNI ADD.
        let annotator = ringway_cni::kube::Annotator::start(
            client.clone(),
            rt.handle(),
            ringway_cni::kube::AnnotatorConfig::default(),
        );
        let selector = ringway_cni::kube::Selector::new(client, rt.handle().clone());
        Some((rt, selector, annotator))
    } else {
        None
    };
    let (selection, annotator) = match &kube {
        Some((_, selector, annotator)) => (
            ringway_cni::node::Selection::Kubernetes(selector.clone()),
            Some(annotator.clone()),
        ),
        None => (ringway_cni::node::Selection::All, None),
    };
    let config = ringway_cni::node::AgentConfig {
        zds_socket: args.zds_socket.clone(),
        cni_socket: args.cni_socket.clone(),
        capture: ringway_proxy::capture_spec(&settings),
        netns_dirs: args.netns_dir.clone(),
        node_name: args.node_name.clone(),
        selection,
        state_file: Some(args.state_file.clone()),
        service_accounts: args.pod_service_account.clone(),
        peer_uids: args.peer_uids.clone(),
        annotator,
        ..ringway_cni::node::AgentConfig::default()
    };
    let agent = ringway_cni::node::NodeAgent::start(config).context("starting the node agent")?;
    // The previous release's socket paths, for its proxies and CNI entries
    // during a rolling upgrade (see `ringway_cni::node::legacy`).
    // Only for the default paths: an agent given paths of its own (tests, odd
    // installs) never touches the node's /var/run/ringway.
    for (socket, default, legacy) in [
        (
            &args.zds_socket,
            ringway_zds::DEFAULT_SOCKET,
            ringway_cni::node::legacy::LEGACY_ZDS_SOCKET,
        ),
        (
            &args.cni_socket,
            ringway_cni::conf::DEFAULT_AGENT_SOCKET,
            ringway_cni::node::legacy::LEGACY_CNI_SOCKET,
        ),
    ] {
        if socket.as_path() != std::path::Path::new(default) {
            continue;
        }
        match ringway_cni::node::legacy::link_legacy_socket(socket, std::path::Path::new(legacy)) {
            Ok(true) => {
                tracing::info!(legacy, socket = %socket.display(), "previous release's socket path linked")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(legacy, error = %e, "cannot link the previous release's socket path")
            }
        }
    }
    tracing::info!(zds = %args.zds_socket.display(), cni = %args.cni_socket.display(), pods = agent.pods().len(), kube = args.kube, "node agent serving");
    let install = if args.install_cni {
        let exe = std::env::current_exe().context("locating the ringway binary to install")?;
        let mut cfg = ringway_cni::install::InstallConfig::new(exe);
        cfg.bin_dir = args.cni_bin_dir.clone();
        cfg.conf_dir = args.cni_conf_dir.clone();
        cfg.agent_socket = args.cni_socket.clone();
        cfg.log_file = args.cni_log_file.clone();
        let installer = ringway_cni::install::Installer::new(cfg);
        installer
            .install_binary()
            .context("installing the CNI plugin binary")?;
        Some(installer.watch().context("watching the CNI config")?)
    } else {
        None
    };
    let kube_rt = match kube {
        Some((rt, selector, _)) => {
            let enrollment: std::sync::Arc<dyn ringway_cni::kube::Enrollment> =
                std::sync::Arc::new(agent.enrollment());
            let node = args.node_name.clone();
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            // Drives the runtime: the watch, and the API lookups of CNI ADDs.
            let thread = std::thread::Builder::new()
                .name("ringway-kube".into())
                .spawn(move || {
                    rt.block_on(async move {
                        tokio::select! {
                            _ = ringway_cni::kube::run_watch(selector, node, enrollment) => {}
                            _ = rx => {}
                        }
                    });
                })?;
            Some((tx, thread))
        }
        None => None,
    };
    // The agent's metrics and the process's, encoded by prometheus-client
    // in the format the scraper asked for.
    let mut registry = agent.metrics_registry();
    registry.register_collector(Box::new(ringway_control::ProcessCollector));
    let registry = std::sync::Arc::new(registry);
    let health = agent.health_source();
    let live = agent.liveness_source();
    let metrics_server = ringway_control::ControlServer::serve(
        args.metrics_addr,
        std::sync::Arc::new(move |method, path, _, openmetrics| match (method, path) {
            (&hyper::Method::GET, "/metrics") => (
                hyper::StatusCode::OK,
                ringway_control::content_type(openmetrics),
                ringway_control::encode(&registry, openmetrics),
            ),
            (&hyper::Method::GET, "/healthz/ready") => match health() {
                Ok(s) => (hyper::StatusCode::OK, "text/plain; charset=utf-8", s + "\n"),
                Err(e) => (
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    format!("not ready: {e}\n"),
                ),
            },
            (&hyper::Method::GET, "/healthz/live") => match live() {
                Ok(s) => (hyper::StatusCode::OK, "text/plain; charset=utf-8", s + "\n"),
                Err(e) => (
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain; charset=utf-8",
                    format!("not live: {e}\n"),
                ),
            },
            (_, path) => (
                hyper::StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                format!("no such endpoint: {path}\n"),
            ),
        }),
    )
    .with_context(|| {
        format!(
            "binding the agent's metrics endpoint on {}",
            args.metrics_addr
        )
    })?;
    tracing::info!(addr = %metrics_server.addr, "agent endpoint: GET /metrics, GET /healthz/ready, GET /healthz/live");
    let sig = stop.wait()?;
    drop(metrics_server);
    tracing::info!(signal = ?sig, "node agent stopping; pods, rules and the proxy are left as they are");
    if let Some((tx, thread)) = kube_rt {
        let _ = tx.send(());
        let _ = thread.join();
    }
    if let Some(w) = install {
        w.stop();
    }
    agent.shutdown();
    Ok(())
}
