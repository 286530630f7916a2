//! The control-plane HTTP endpoints, served from their own thread and
//! current-thread tokio runtime, never from a datapath worker.
//!
//! | path | answer |
//! | --- | --- |
//! | `GET /healthz/ready` | 200 `ready` once the node agent's snapshot is applied and no pod is pending; 503 with the reason otherwise |

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;

use crate::zds_client::Readiness;

/// A running control server.
#[derive(Debug)]
pub struct ControlServer {
    /// The bound address.
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `addr` and serves on a new thread named `ringway-control`.
    pub fn start(addr: SocketAddr, ready: Arc<Readiness>) -> std::io::Result<ControlServer> {
        let std_listener = std::net::TcpListener::bind(addr)?;
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
                                let Ok((stream, _)) = acc else { continue };
                                let ready = ready.clone();
                                tokio::spawn(async move {
                                    let svc = hyper::service::service_fn(move |req| handle(req, ready.clone()));
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
    ready: Arc<Readiness>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/healthz/ready") => {
            if ready.is_ready() {
                (StatusCode::OK, "ready\n".to_string())
            } else {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready: {}\n", ready.reason()),
                )
            }
        }
        (_, "/healthz/ready") => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string()),
        (_, path) => (StatusCode::NOT_FOUND, format!("no such endpoint: {path}\n")),
    };
    Ok(Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::from_static(b"internal error\n")))))
}
