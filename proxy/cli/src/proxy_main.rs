//! `ringway proxy`: the node proxy with its mesh source, its pods (from the
//! node agent over ZDS or the command line), its control endpoints and its
//! drain on stop.

use crate::args::{MeshSource, ProxyArgs};
use crate::ca_service;
use crate::logs::LOG_RELOAD;
use crate::mesh_source::load_mesh;
use crate::mesh_source::start_kube_mesh;
use crate::mesh_source::wait_first_snapshot;
use crate::mesh_source::FirstSnapshot;
use crate::signals::block_stop_signals;
use crate::xds;
use anyhow::Context;
use ringway_proxy::Proxy;
use std::time::Duration;
use std::time::Instant;

pub(crate) fn run_proxy(args: ProxyArgs) -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stop = block_stop_signals();
    let mesh = load_mesh(args.config.as_ref())?;
    let mut settings = mesh.proxy().clone();
    // A tunnel may never target the proxy's own control ports in a pod,
    // wherever they were moved to. Port 0 (an ephemeral port, as the tests
    // ask for) names no port and is not reserved: it would fail validation.
    for addr in [args.readiness_addr, args.metrics_addr, args.admin_addr] {
        if addr.port() != 0 && !settings.hbone.reserved_ports.contains(&addr.port()) {
            settings.hbone.reserved_ports.push(addr.port());
        }
    }
    let drain_period = settings.drain_period;
    if args.mesh_source == MeshSource::Xds {
        xds::check_file(&mesh)?;
    }
    let proxy = Arc::new(Proxy::start(settings)?);
    if let Some(dir) = &args.state_dir {
        proxy
            .set_state_dir(dir)
            .with_context(|| format!("the state directory {}", dir.display()))?;
    }
    // HBONE: on when the config has a CA (`ca:`); with the control plane as
    // the mesh source, its certificate service otherwise; off otherwise.
    // The roots' files followed while running (a rotation), and the
    // clients whose servers are checked against them.
    let (_refresher, root_files, mut roots_users) =
        match (mesh.ca(), mesh.ca_service(), args.mesh_source) {
            (None, None, MeshSource::Xds) => {
                let on = ca_service::enable_hbone_with_ca_service(
                    &proxy,
                    &args.xds.ca_service()?,
                    mesh.trust_domain(),
                )?;
                (
                    Some(on.refresher),
                    on.root_files,
                    vec![("certificate service", on.tls)],
                )
            }
            (_, None, _) => {
                let refresher = proxy.enable_hbone(&mesh)?;
                let files = match (&refresher, mesh.ca()) {
                    (Some(_), Some(ca)) => ca.bundle_files.clone(),
                    _ => Vec::new(),
                };
                (refresher, files, Vec::new())
            }
            (_, Some(svc), _) => {
                let on =
                    ca_service::enable_hbone_with_ca_service(&proxy, svc, mesh.trust_domain())?;
                (
                    Some(on.refresher),
                    on.root_files,
                    vec![("certificate service", on.tls)],
                )
            }
        };
    let mesh = Arc::new(mesh);
    if args.mesh_source != MeshSource::Xds {
        proxy.set_mesh(mesh.clone());
    }
    let ready = Arc::new(ringway_proxy::zds_client::Readiness::default());
    // With a certificate service, not ready (the old proxy keeps the node)
    // while a pod's certificate is awaited.
    if proxy.identities().is_some() {
        ready.wait_for_certificates(&proxy);
    }
    // `--mesh-source kubernetes`: the cluster's workloads and services are
    // added to the file's, on the `ringway-kube` control thread; until its
    // first snapshot (every watch listed) the file's mesh is in force.
    let (first_tx, first_rx) = std::sync::mpsc::sync_channel(1);
    let (mut kube_mesh, mut xds_mesh, mut first_snapshot) = (None, None, None);
    match args.mesh_source {
        MeshSource::File => {}
        MeshSource::Kubernetes => {
            kube_mesh = Some(Arc::new(start_kube_mesh(
                mesh,
                &args.cluster_domain,
                &args.istio_root_namespace,
                proxy.clone(),
                first_tx,
            )?));
            first_snapshot = Some(first_rx);
        }
        MeshSource::Xds => {
            xds_mesh = Some(Arc::new(xds::start(
                mesh,
                &args.xds,
                &args.cluster_domain,
                proxy.clone(),
                ready.clone(),
                first_tx,
            )?));
            first_snapshot = Some(first_rx);
        }
    }
    // The roots: one follower per set of files. The control plane's root
    // is the certificate service's when that is the control plane too.
    let mut root_watchers = Vec::new();
    if let Some(x) = &xds_mesh {
        let xds_files = vec![args.xds.xds_root_cert.clone()];
        if xds_files == root_files {
            roots_users.push(("control plane", x.tls().clone()));
        } else {
            root_watchers.push(crate::trust::follow(
                xds_files,
                crate::trust::RootsUsers {
                    identities: None,
                    clients: vec![("control plane", x.tls().clone())],
                    counted_by: proxy.identities(),
                },
            )?);
        }
    }
    root_watchers.push(crate::trust::follow(
        root_files,
        crate::trust::RootsUsers {
            identities: proxy.identities(),
            clients: roots_users,
            counted_by: proxy.identities(),
        },
    )?);
    // Hot reload of the mesh (workloads, policies): connections opened after
    // a valid edit use it; datapath settings and the CA need a restart (the
    // roots' files are followed above), and
    // an edit of the trust domain is rejected (HBONE on). With
    // the Kubernetes source the edit is merged with the cluster's objects.
    let _watcher = match &args.config {
        Some(path) => {
            let p = proxy.clone();
            let kube_mesh = kube_mesh.clone();
            let xds_mesh = xds_mesh.clone();
            Some(
                ringway_config::ConfigWatcher::spawn(
                    path.clone(),
                    ringway_config::ProcessEnv,
                    move |m| {
                        if let Err(e) = p.check_reload(&m) {
                            tracing::error!(error = %e, "configuration edit rejected; keeping the previous one");
                            return;
                        }
                        tracing::info!(revision = m.revision(), "configuration reloaded");
                        match (&kube_mesh, &xds_mesh) {
                            (Some(k), _) => k.set_file(m),
                            (None, Some(x)) => x.set_file(m),
                            (None, None) => {
                                p.set_mesh(m);
                            }
                        }
                    },
                    |e| tracing::error!(error = %e, "configuration edit rejected; keeping the previous one"),
                )
                .context("watching the configuration file")?,
            )
        }
        None => None,
    };
    let xds_status = xds_mesh.as_ref().map(|x| x.status().clone());
    let metrics_server = ringway_control::ControlServer::serve_shared(
        args.metrics_addr,
        ringway_proxy::control::metrics_handler_with(proxy.metrics(), proxy.stats_handle(), |r| {
            if let Some(s) = &xds_status {
                s.register(r);
            }
        }),
    )
    .with_context(|| format!("binding the metrics endpoint on {}", args.metrics_addr))?;
    tracing::info!(addr = %metrics_server.addr, "metrics endpoint: GET /metrics");
    let set_level = LOG_RELOAD.get().cloned().unwrap_or_else(|| {
        std::sync::Arc::new(|_: &str| Err(ringway_proxy::control::LogLevelError::NotInitialised))
    });
    let admin_server = ringway_control::ControlServer::serve_shared(
        args.admin_addr,
        ringway_proxy::control::admin_handler(proxy.clone(), set_level),
    )
    .with_context(|| format!("binding the admin endpoint on {}", args.admin_addr))?;
    tracing::info!(addr = %admin_server.addr, "admin endpoint: GET /config_dump, POST /logging?level=");
    let control = ringway_control::ControlServer::start(args.readiness_addr, ready.clone())
        .with_context(|| format!("binding the readiness endpoint on {}", args.readiness_addr))?;
    tracing::info!(addr = %control.addr, "readiness endpoint: GET /healthz/ready");
    // The pods on the command line: their netns opened now (a bad path
    // fails the start), taken below.
    let mut cli_pods = Vec::with_capacity(args.pods.len());
    for spec in &args.pods {
        let (uid, path) = spec
            .split_once('=')
            .with_context(|| format!("--pod {spec:?} is not UID=NETNS_PATH"))?;
        let fd = ringway_redirect::open_netns(std::path::Path::new(path))?;
        cli_pods.push((uid, fd));
    }
    // With a control plane or the cluster as the mesh source, they are
    // taken only once its first snapshot is in (workloads and policies):
    // a pod served before its policies came would pass what they deny.
    // This thread has the stop signals blocked: the wait polls for one.
    let mut stopped_early = false;
    if !cli_pods.is_empty() {
        if let Some(rx) = first_snapshot.take() {
            let probe = crate::signals::StopProbe::new(&stop)
                .context("watching for SIGTERM while waiting for the first mesh snapshot")?;
            match wait_first_snapshot(&rx, || probe.pending()) {
                FirstSnapshot::In => {}
                FirstSnapshot::Stopped => stopped_early = true,
                FirstSnapshot::Ended => anyhow::bail!(
                    "the mesh source ended before its first snapshot; the pods on the \
                     command line were not taken"
                ),
            }
        }
    }
    let zds_stop = Arc::new(AtomicBool::new(false));
    let zds_thread = if stopped_early {
        tracing::info!("stopped before the first mesh snapshot; no pod was taken");
        None
    } else {
        for (uid, fd) in cli_pods {
            // The mesh's workload with this uid names the pod (metrics,
            // identity), as the agent's record would.
            let identity = match proxy.mesh().as_deref().and_then(|m| m.workload_by_uid(uid)) {
                Some(w) => ringway_proxy::PodIdentity {
                    name: w.name.clone(),
                    namespace: w.namespace.clone(),
                    service_account: w.service_account.clone(),
                },
                None => {
                    tracing::warn!(
                        pod.uid = uid,
                        "--pod: no workload of the mesh has this uid; its metrics name it by uid"
                    );
                    ringway_proxy::PodIdentity::default()
                }
            };
            proxy
                .add_pod_with_identity(uid, fd, identity)
                .with_context(|| format!("adding pod {uid}"))?;
        }
        match &args.zds_socket {
            Some(path) => {
                let (p, r, st) = (proxy.clone(), ready.clone(), zds_stop.clone());
                let cfg = ringway_proxy::zds_client::ZdsClientConfig::new(path.clone());
                Some(
                    std::thread::Builder::new()
                        .name("ringway-zds".into())
                        .spawn(move || {
                            // With a control plane or the cluster as the
                            // mesh source, no pod is taken (and readiness
                            // stays 503) before its first snapshot: until
                            // then every destination would look outside
                            // the mesh and every policy would see no
                            // workload. The agent keeps the pods on the old
                            // proxy (or answers CNI ADD "try again").
                            if let Some(rx) = first_snapshot {
                                let first = wait_first_snapshot(&rx, || st.load(Ordering::SeqCst));
                                if first != FirstSnapshot::In {
                                    return;
                                }
                            }
                            ringway_proxy::zds_client::run(p, cfg, r, st)
                        })?,
                )
            }
            None => {
                // Without an agent the pods on the command line are the
                // snapshot (warmed up as the agent's would be).
                proxy.warm_up(ringway_proxy::tunnel::warm::WARM_UP_BUDGET);
                ready.mark_snapshot_applied();
                None
            }
        }
    };
    tracing::info!("serving; SIGTERM or SIGINT starts the drain");
    let sig = stop.wait()?;
    // Drain: close every listener at once (a new proxy bound to the same
    // ports takes the new connections; queued ones migrate to it), stop
    // taking pods, keep established connections for the drain period.
    let t0 = Instant::now();
    ready.set_draining();
    proxy.close_listeners();
    zds_stop.store(true, Ordering::SeqCst);
    let active = proxy.stats().active;
    tracing::info!(signal = ?sig, active, drain_period = ?drain_period, "draining");
    while proxy.stats().active > 0 && t0.elapsed() < drain_period {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = proxy.stats().active;
    if let Some(t) = zds_thread {
        let _ = t.join();
    }
    drop(root_watchers);
    drop(xds_mesh);
    drop(control);
    drop(metrics_server);
    drop(admin_server);
    match Arc::try_unwrap(proxy) {
        Ok(p) => p.shutdown(),
        Err(p) => {
            p.stop_workers_now();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    tracing::info!(reset = left, drained_for = ?t0.elapsed(), "stopped");
    Ok(())
}
