//! The control-plane HTTP endpoints, served from their own thread and
//! current-thread tokio runtime, never from a datapath worker.
//!
//! | port | path | answer |
//! | --- | --- | --- |
//! | 15021 | `GET /healthz/ready` | 200 `ready` once the node agent's snapshot is applied and no pod is pending; 503 with the reason otherwise |
//! | 15020 | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics when the `Accept` header asks for `application/openmetrics-text` |

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::metrics::{content_type, encode, Metrics};
use crate::stats::Stats;
use crate::zds_client::Readiness;

/// What an endpoint answers: status, content type, body.
pub type Answer = (StatusCode, &'static str, String);

/// An endpoint handler: method, path, query string, whether OpenMetrics was asked for.
pub type Handler = Arc<dyn Fn(&hyper::Method, &str, &str, bool) -> Answer + Send + Sync>;

/// The readiness handler.
pub fn readiness_handler(ready: Arc<Readiness>) -> Handler {
    Arc::new(move |method, path, _, _| match (method, path) {
        (&hyper::Method::GET, "/healthz/ready") => {
            if ready.is_ready() {
                (StatusCode::OK, TEXT, "ready\n".to_string())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    TEXT,
                    format!("not ready: {}\n", ready.reason()),
                )
            }
        }
        (_, "/healthz/ready") => (StatusCode::METHOD_NOT_ALLOWED, TEXT, "GET only\n".into()),
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

/// The metrics handler.
pub fn metrics_handler(metrics: Arc<Metrics>, stats: Arc<Stats>) -> Handler {
    let registry = Arc::new(metrics.registry());
    Arc::new(move |method, path, _, openmetrics| match (method, path) {
        (&hyper::Method::GET, "/metrics") | (&hyper::Method::GET, "/stats/prometheus") => {
            // Derived from the datapath's own counters at scrape time, so
            // the workers count each event once.
            metrics.refresh(&stats);
            let body = encode(&registry, openmetrics);
            (StatusCode::OK, content_type(openmetrics), body)
        }
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

const TEXT: &str = "text/plain; charset=utf-8";
const JSON: &str = "application/json";

/// Changes the log filter at run time; returns the error text on a bad filter.
pub type SetLogLevel = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The admin handler (bind it to 127.0.0.1:15000 only):
/// `GET /config_dump` (settings, pods with their listeners, counters) and
/// `POST /logging?level=<tracing filter>`.
pub fn admin_handler(proxy: Arc<crate::Proxy>, set_level: SetLogLevel) -> Handler {
    Arc::new(move |method, path, query, _| match (method, path) {
        (&hyper::Method::GET, "/config_dump") => (StatusCode::OK, JSON, config_dump(&proxy)),
        (&hyper::Method::POST, "/logging") => {
            let level = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("level="))
                .unwrap_or("");
            if level.is_empty() {
                return (
                    StatusCode::BAD_REQUEST,
                    TEXT,
                    "POST /logging?level=<filter>, e.g. level=debug or level=info,access=debug\n"
                        .into(),
                );
            }
            let level = level.replace("%2C", ",").replace("%3D", "=");
            match set_level(&level) {
                Ok(()) => (StatusCode::OK, TEXT, format!("log level: {level}\n")),
                Err(e) => (
                    StatusCode::BAD_REQUEST,
                    TEXT,
                    format!("bad log filter {level:?}: {e}\n"),
                ),
            }
        }
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

fn config_dump(proxy: &crate::Proxy) -> String {
    let pods: Vec<serde_json::Value> = proxy
        .pods()
        .into_iter()
        .map(|p| {
            serde_json::json!({
                "uid": p.uid,
                "name": p.identity.name,
                "namespace": p.identity.namespace,
                "serviceAccount": p.identity.service_account,
                "ips": p.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "netnsInode": p.netns_inode,
                "listeners": p.listeners.iter().map(|(k, a)| format!("{k} {a}")).collect::<Vec<_>>(),
                "authorizedFlows": p.authorized_flows,
            })
        })
        .collect();
    let st = proxy.stats();
    let mesh = proxy.mesh().map(|m| {
        serde_json::json!({
            "origin": m.origin(),
            "revision": format!("{:016x}", m.revision()),
            "trustDomain": m.trust_domain(),
            "workloads": m.workloads().iter().map(|w| serde_json::json!({
                "uid": w.uid,
                "name": w.name,
                "namespace": w.namespace,
                "serviceAccount": w.service_account,
                "ips": w.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "node": w.node,
                "tunnel": w.tunnel,
                "healthy": w.healthy,
            })).collect::<Vec<_>>(),
            "services": m.services().iter().map(|s| serde_json::json!({
                "hostname": s.hostname,
                "namespace": s.namespace,
                "vips": s.vips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "ports": s.ports.iter().map(|(p, t)| (p.to_string(), *t)).collect::<std::collections::BTreeMap<_, _>>(),
                "endpoints": s.endpoints,
            })).collect::<Vec<_>>(),
            "policies": m.policies().iter().map(|p| serde_json::json!({
                "name": p.qualified_name().as_ref(),
                "action": p.action.to_string(),
                "rules": p.rules.len(),
            })).collect::<Vec<_>>(),
        })
    });
    let dump = serde_json::json!({
        "settings": serde_json::to_value(proxy.settings()).unwrap_or_default(),
        "datapath": proxy.backend().to_string(),
        "pods": pods,
        "mesh": mesh,
        "hbone": {
            "enabled": proxy.hbone_enabled(),
            "poolConnections": proxy.hbone_connections(),
            "poolStreams": proxy.hbone_streams(),
            "poolConnectionsOpened": proxy.hbone_connections_opened(),
        },
        "stats": {
            "accepted": st.accepted,
            "active": st.active,
            "connectFailed": st.connect_failed,
            "refused": st.refused,
            "sameNode": st.same_node,
            "bytesToUpstream": st.bytes_to_upstream,
            "bytesToClient": st.bytes_to_client,
        },
    });
    serde_json::to_string_pretty(&dump).unwrap_or_default() + "\n"
}

/// A running control server.
#[derive(Debug)]
pub struct ControlServer {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Serves the readiness endpoint on `addr`.
    pub fn start(addr: SocketAddr, ready: Arc<Readiness>) -> std::io::Result<ControlServer> {
        Self::serve(addr, readiness_handler(ready))
    }

    /// Binds `addr` and serves `handler` on a new thread named `ringway-control`.
    pub fn serve(addr: SocketAddr, handler: Handler) -> std::io::Result<ControlServer> {
        Self::serve_listener(std::net::TcpListener::bind(addr)?, handler)
    }

    /// [`ControlServer::serve`] with SO_REUSEPORT: during an upgrade the new
    /// proxy binds beside the old one (as its pod listeners do) instead of
    /// failing; until the old one exits, either may answer.
    pub fn serve_shared(addr: SocketAddr, handler: Handler) -> std::io::Result<ControlServer> {
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM.cloexec(),
            None,
        )?;
        sock.set_reuse_address(true)?;
        sock.set_reuse_port(true)?;
        sock.bind(&addr.into())?;
        sock.listen(128)?;
        Self::serve_listener(sock.into(), handler)
    }

    fn serve_listener(
        std_listener: std::net::TcpListener,
        handler: Handler,
    ) -> std::io::Result<ControlServer> {
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ringway-control".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot start the control runtime");
                        return;
                    }
                };
                rt.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!(error = %e, "cannot register the control listener");
                            return;
                        }
                    };
                    loop {
                        tokio::select! {
                            _ = &mut rx => break,
                            acc = listener.accept() => {
                                let Ok((stream, _)) = acc else {
                                    // Out of fds or similar: don't spin.
                                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                                    continue;
                                };
                                let handler = handler.clone();
                                tokio::spawn(async move {
                                    let svc = hyper::service::service_fn(move |req| handle(req, handler.clone()));
                                    let _ = hyper::server::conn::http1::Builder::new()
                                        .serve_connection(TokioIo::new(stream), svc)
                                        .await;
                                });
                            }
                        }
                    }
                });
            })?;
        Ok(ControlServer {
            addr,
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    handler: Handler,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let openmetrics = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let (status, ct, body) = handler(
        req.method(),
        req.uri().path(),
        req.uri().query().unwrap_or(""),
        openmetrics,
    );
    Ok(Response::builder()
        .status(status)
        .header("content-type", ct)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"internal error\n")))))
}
