//! `ringway ca`: the certificate service, its control endpoints and its
//! pod watch.

use crate::args::CaArgs;
use crate::signals::block_stop_signals;
use anyhow::bail;
use anyhow::Context;

pub(crate) fn run_ca(args: CaArgs) -> anyhow::Result<()> {
    use std::sync::Arc;
    let stop = block_stop_signals();
    if args.root_certs.len() != args.root_keys.len() {
        bail!(
            "{} --root-cert but {} --root-key: give them in pairs",
            args.root_certs.len(),
            args.root_keys.len()
        );
    }
    let (np_ns, np_sa) = args
        .node_proxy_sa
        .split_once('/')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .with_context(|| {
            format!(
                "--node-proxy-sa {:?} is not namespace/serviceAccount",
                args.node_proxy_sa
            )
        })?;
    let secs = std::time::Duration::from_secs;
    let limits = ringway_ca::Limits {
        max_lifetime: secs(args.max_lifetime_secs),
        default_lifetime: secs(args.max_lifetime_secs),
        rate_per_caller: args.rate_per_caller,
        review_cache_ttl: secs(args.token_review_cache_secs),
        refusal_cache_ttl: secs(args.token_refusal_cache_secs),
        known_token_ttl: secs(args.known_token_secs),
        review_cache_entries: args.review_cache_entries,
        max_concurrent_reviews: args.max_concurrent_reviews,
        reserved_reviews: args.reserved_reviews,
        review_wait: secs(args.review_wait_secs),
        review_rate_per_source: args.reviews_per_source,
        review_burst_per_source: args.review_burst_per_source,
        ..ringway_ca::Limits::default()
    };
    let server_limits = ringway_ca::server::ServerLimits {
        max_connections: args.max_connections,
        max_connections_per_source: args.max_connections_per_source,
        handshake_timeout: secs(args.handshake_timeout_secs),
        preface_timeout: secs(args.preface_timeout_secs),
        idle_timeout: secs(args.idle_timeout_secs),
        request_timeout: secs(args.request_timeout_secs),
        max_concurrent_streams: args.max_streams_per_connection,
        preauth_body_bytes: args.preauth_body_bytes,
        ..ringway_ca::server::ServerLimits::default()
    };
    limits
        .validate()
        .context("the certificate service's limits")?;
    server_limits
        .validate()
        .context("the certificate service's connection limits")?;
    let signers = args
        .root_certs
        .iter()
        .zip(&args.root_keys)
        .map(|(c, k)| ringway_identity::CaSigner::load(c, k).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .context("loading a signing root")?;
    let tls = ringway_ca::server::tls_config_from_files(&args.tls_cert, &args.tls_key)
        .context("loading the CA service's serving certificate")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ringway-ca")
        .enable_all()
        .build()
        .context("starting the CA runtime")?;
    let client = rt
        .block_on(kube::Client::try_default())
        .context("the certificate service needs the Kubernetes API (TokenReview, pods)")?;
    let pods = {
        let _guard = rt.enter();
        Arc::new(ringway_ca::pods::WatchedPods::start(
            client.clone(),
            std::time::Duration::from_secs(args.pod_watch_stale_secs),
        ))
    };

    let service = Arc::new(ringway_ca::CaService::new(
        ringway_ca::Policy {
            trust_domain: args.trust_domain.clone(),
            node_proxy: (np_ns.to_owned(), np_sa.to_owned()),
        },
        limits,
        Arc::new(ringway_ca::KubeTokenReviewer::new(
            client,
            args.audience.clone(),
        )),
        pods.clone(),
        signers,
    )?);
    let server =
        ringway_ca::server::Server::start(rt, args.listen, tls, service.clone(), server_limits)
            .with_context(|| format!("binding the certificate service on {}", args.listen))?;
    let metrics = service.clone();
    let ready_pods = pods;
    let control = ringway_control::ControlServer::serve(
        args.metrics_addr,
        Arc::new(move |method, path, _, _| match (method, path) {
            (&hyper::Method::GET, "/metrics") => (
                hyper::StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode_metrics(),
            ),
            (&hyper::Method::GET, "/healthz/ready") => {
                use ringway_ca::PodDirectory;
                match ready_pods.ready() {
                    Ok(()) => (
                        hyper::StatusCode::OK,
                        "text/plain; charset=utf-8",
                        "ready\n".into(),
                    ),
                    Err(e) => (
                        hyper::StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain; charset=utf-8",
                        format!("not ready: {}\n", e.detail()),
                    ),
                }
            }
            (_, path) => (
                hyper::StatusCode::NOT_FOUND,
                "text/plain; charset=utf-8",
                format!("no such endpoint: {path}\n"),
            ),
        }),
    )
    .with_context(|| format!("binding the CA's metrics endpoint on {}", args.metrics_addr))?;
    tracing::info!(listen = %args.listen, metrics = %control.addr, trust_domain = %args.trust_domain, "certificate service serving");
    let sig = stop.wait()?;
    tracing::info!(signal = ?sig, "certificate service stopping");
    server.stop();
    drop(control);
    Ok(())
}
