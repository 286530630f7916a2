//! The client side of `CreateCertificate`, as a node proxy uses it: TLS to
//! the CA (its certificate checked against the mesh's root), the token as a
//! bearer credential, and the returned leaf checked to carry exactly the
//! identity asked for.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request};
use prost::Message;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;

use ringway_identity::{peer_identity_from_certs, Identity};

use crate::grpc::{decode_message, decode_unary, Code, Status};
use crate::proto::{IstioCertificateRequest, IstioCertificateResponse, CREATE_CERTIFICATE_PATH};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Resolving, connecting, TLS or HTTP/2 failed.
    #[error("cannot reach the CA at {addr}: {detail}")]
    Transport {
        /// The CA's address (the name and the address tried last, for a
        /// name).
        addr: String,
        /// What failed.
        detail: String,
    },
    /// The CA answered with a gRPC error.
    #[error("the CA refused: {0}")]
    Refused(Status),
    /// The answer is not what the protocol says.
    #[error("the CA's answer is malformed: {0}")]
    Malformed(String),
    /// The certificate is not for the identity asked for.
    #[error("the CA returned a certificate for {got}, not for {wanted}")]
    WrongIdentity {
        /// Asked for.
        wanted: Identity,
        /// In the leaf.
        got: String,
    },
}

/// Why [`CaClient::tls_config`] could not build a TLS config.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// A root of the bundle is not a usable trust anchor.
    #[error("CA root: {0}")]
    Root(#[source] rustls::Error),
    /// The crypto provider cannot do TLS 1.3.
    #[error("TLS 1.3 with the crypto provider: {0}")]
    Protocol(#[source] rustls::Error),
}

/// Why [`RemoteSource`] gave no certificate (as a
/// [`ringway_identity::IssueError::Remote`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteIssueError {
    /// Called on a thread of an async runtime, which the blocking call
    /// would stall.
    #[error("a certificate cannot be requested from inside an async runtime")]
    InsideRuntime,
    /// No key pair could be generated.
    #[error("generating a key: {0}")]
    Key(#[source] rcgen::Error),
    /// No CSR could be built over the key.
    #[error("building the CSR: {0}")]
    Csr(#[source] rcgen::Error),
    /// The token file cannot be read.
    #[error("reading the token {}: {source}", path.display())]
    Token {
        /// The token file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The source is being dropped.
    #[error("the certificate service client is shutting down")]
    ShuttingDown,
    /// The certificate service's call failed.
    #[error(transparent)]
    Call(#[from] ClientError),
}

/// How long one address of the CA's name may take to complete TCP and TLS
/// while another is left to try; the last one tried has what is left of
/// the call's own bound.
const ADDRESS_ATTEMPT: Duration = Duration::from_secs(5);

/// A client of a CA: one address, or every address a name resolves to.
#[derive(Debug, Clone)]
pub struct CaClient {
    /// `host:port` or `ip:port`, resolved at every call.
    address: String,
    server_name: ServerName<'static>,
    tls: ringway_grpc::ClientTls,
    timeout: Duration,
}

impl CaClient {
    /// A client of the CA at `addr`, whose serving certificate must be valid
    /// for `server_name` under `tls`'s roots (a [`ringway_grpc::ClientTls`]
    /// kept by the caller replaces them for the calls made after).
    pub fn new(
        addr: SocketAddr,
        server_name: ServerName<'static>,
        tls: impl Into<ringway_grpc::ClientTls>,
    ) -> Self {
        CaClient::resolving(addr.to_string(), server_name, tls)
    }

    /// A client of the CA at `address` (`host:port`), resolved at every
    /// call (a name that does not resolve, misspelt or not yet in DNS,
    /// fails each call as a transport error that may pass): each address
    /// it gives is tried in turn until one completes TCP and TLS, so a
    /// Service re-created at a new address, or one
    /// replica that refuses or stalls, does not cut the proxy off its
    /// certificates until it restarts. Otherwise as [`CaClient::new`].
    pub fn resolving(
        address: impl Into<String>,
        server_name: ServerName<'static>,
        tls: impl Into<ringway_grpc::ClientTls>,
    ) -> Self {
        CaClient {
            address: address.into(),
            server_name,
            tls: tls.into(),
            timeout: Duration::from_secs(15),
        }
    }

    /// A TLS config trusting `roots` for the CA's serving certificate, with
    /// ALPN h2.
    pub fn tls_config(
        roots: &[CertificateDer<'static>],
    ) -> Result<Arc<rustls::ClientConfig>, TlsConfigError> {
        let mut store = rustls::RootCertStore::empty();
        for r in roots {
            store.add(r.clone()).map_err(TlsConfigError::Root)?;
        }
        let mut cfg =
            rustls::ClientConfig::builder_with_provider(ringway_identity::crypto_provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(TlsConfigError::Protocol)?
                .with_root_certificates(store)
                .with_no_client_auth();
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// Asks for a certificate for `identity` over `csr_pem`; `impersonate`
    /// sets `ImpersonatedIdentity` (a node proxy asking for its pod). The
    /// chain returned is checked to name exactly `identity` in its leaf.
    pub async fn create_certificate(
        &self,
        token: &str,
        csr_pem: &str,
        identity: &Identity,
        impersonate: bool,
        validity: Duration,
    ) -> Result<Vec<CertificateDer<'static>>, ClientError> {
        let mut req = IstioCertificateRequest {
            csr: csr_pem.to_owned(),
            validity_duration: validity.as_secs() as i64,
            metadata: None,
        };
        if impersonate {
            req = req.with_impersonation(&identity.to_string());
        }
        let resp = self.call(token, &req).await?;
        let mut chain = Vec::with_capacity(resp.cert_chain.len());
        for p in &resp.cert_chain {
            let der =
                pem::parse(p).map_err(|e| ClientError::Malformed(format!("cert_chain: {e}")))?;
            chain.push(CertificateDer::from(der.into_contents()));
        }
        let got = peer_identity_from_certs(&chain)
            .map_err(|e| ClientError::Malformed(format!("leaf: {e}")))?;
        if &got != identity {
            return Err(ClientError::WrongIdentity {
                wanted: identity.clone(),
                got: got.to_string(),
            });
        }
        Ok(chain)
    }

    /// One raw call.
    pub async fn call(
        &self,
        token: &str,
        req: &IstioCertificateRequest,
    ) -> Result<IstioCertificateResponse, ClientError> {
        tokio::time::timeout(self.timeout, self.call_inner(token, req))
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Transport {
                    addr: self.address.clone(),
                    detail: format!("no answer within {:?}", self.timeout),
                })
            })
    }

    /// TCP and TLS to the CA: the first of its address's (or name's)
    /// addresses that completes both (each within [`ADDRESS_ATTEMPT`]
    /// while another is left; the last within the call's bound).
    async fn connect(
        &self,
    ) -> Result<(tokio_rustls::client::TlsStream<TcpStream>, String), ClientError> {
        let name = &self.address;
        // An `ip:port` is parsed, never looked up.
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(name.as_str())
            .await
            .map_err(|e| ClientError::Transport {
                addr: name.clone(),
                detail: format!("resolving: {e}"),
            })?
            .collect();
        let named = |addr: SocketAddr| match addr.to_string() {
            a if &a == name => a,
            a => format!("{name} ({a})"),
        };
        let mut last = ClientError::Transport {
            addr: name.clone(),
            detail: "the name has no address".into(),
        };
        let count = addrs.len();
        for (i, addr) in addrs.into_iter().enumerate() {
            let attempt = async {
                let tcp = TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let _ = tcp.set_nodelay(true);
                tokio_rustls::TlsConnector::from(self.tls.current())
                    .connect(self.server_name.clone(), tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))
            };
            let bounded = if i + 1 < count {
                tokio::time::timeout(ADDRESS_ATTEMPT, attempt).await
            } else {
                Ok(attempt.await)
            };
            let detail = match bounded {
                Ok(Ok(tls)) => return Ok((tls, named(addr))),
                Ok(Err(detail)) => detail,
                Err(_) => format!("no TCP and TLS within {ADDRESS_ATTEMPT:?}"),
            };
            tracing::debug!(ca.addr = %addr, error = %detail, "certificate service address failed");
            last = ClientError::Transport {
                addr: named(addr),
                detail,
            };
        }
        Err(last)
    }

    async fn call_inner(
        &self,
        token: &str,
        req: &IstioCertificateRequest,
    ) -> Result<IstioCertificateResponse, ClientError> {
        let (tls, addr) = self.connect().await?;
        let transport = |detail: String| ClientError::Transport {
            addr: addr.clone(),
            detail,
        };
        let (mut h2, conn) = h2::client::handshake(tls)
            .await
            .map_err(|e| transport(format!("HTTP/2: {e}")))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let request = Request::post(format!("https://ca{CREATE_CERTIFICATE_PATH}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header("te", "trailers")
            .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(())
            .map_err(|e| transport(format!("request: {e}")))?;
        let (resp, mut send) = h2
            .send_request(request, false)
            .map_err(|e| transport(format!("HTTP/2: {e}")))?;
        send.send_data(crate::grpc::encode_frame(&req.encode_to_vec()), true)
            .map_err(|e| transport(format!("HTTP/2: {e}")))?;
        let resp = resp.await.map_err(|e| transport(format!("HTTP/2: {e}")))?;
        if let Some(status) = grpc_status(resp.headers()) {
            return Err(ClientError::Refused(status));
        }
        let mut body = resp.into_body();
        let mut buf = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk: Bytes = chunk.map_err(|e| transport(format!("HTTP/2: {e}")))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if buf.len() + chunk.len() > 1024 * 1024 {
                return Err(ClientError::Malformed("answer larger than 1 MiB".into()));
            }
            buf.extend_from_slice(&chunk);
        }
        let trailers = body
            .trailers()
            .await
            .map_err(|e| transport(format!("HTTP/2: {e}")))?
            .unwrap_or_default();
        match grpc_status(&trailers) {
            Some(status) => return Err(ClientError::Refused(status)),
            None if trailers.get("grpc-status").is_none() => {
                return Err(ClientError::Malformed("no grpc-status trailer".into()))
            }
            None => {}
        }
        let msg = decode_unary(&buf, 1024 * 1024).map_err(|s| ClientError::Malformed(s.message))?;
        IstioCertificateResponse::decode(msg).map_err(|e| ClientError::Malformed(e.to_string()))
    }
}

/// A non-OK `grpc-status` in `h`, with its message.
fn grpc_status(h: &HeaderMap) -> Option<Status> {
    let code: u32 = h.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    if code == 0 {
        return None;
    }
    let message = h
        .get("grpc-message")
        .and_then(|v| v.to_str().ok())
        .map(decode_message)
        .unwrap_or_default();
    Some(Status::new(
        Code::from_u32(code).unwrap_or(Code::Internal),
        "remote",
        message,
    ))
}

/// A [`ringway_identity::CertSource`] backed by a certificate service: a new
/// P-256 key per certificate (it never leaves the process), a CSR over it,
/// the node proxy's token read from its file for every request (projected
/// tokens rotate), and `ImpersonatedIdentity` for the pod's identity.
pub struct RemoteSource {
    client: CaClient,
    token_file: std::path::PathBuf,
    /// `None` only while being dropped.
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for RemoteSource {
    fn drop(&mut self) {
        // The identity manager holding this source may be dropped last from
        // inside another runtime (the metrics endpoint's, at shutdown),
        // where dropping a runtime normally (waiting for its tasks) panics.
        // Nothing of ours runs between calls, so there is nothing to wait for.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl std::fmt::Debug for RemoteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteSource")
            .field("ca", &self.client.address)
            .field("token_file", &self.token_file)
            .finish_non_exhaustive()
    }
}

impl RemoteSource {
    /// A source asking `client`, with the token in `token_file`.
    pub fn new(
        client: CaClient,
        token_file: impl Into<std::path::PathBuf>,
    ) -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ringway-ca-client")
            .enable_all()
            .build()?;
        Ok(RemoteSource {
            client,
            token_file: token_file.into(),
            rt: Some(rt),
        })
    }
}

impl RemoteSource {
    /// A new key, a CSR over it, the token, one blocking call.
    fn request(
        &self,
        identity: &Identity,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Result<ringway_identity::Issued, RemoteIssueError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(RemoteIssueError::InsideRuntime);
        }
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(RemoteIssueError::Key)?;
        let csr = rcgen::CertificateParams::default()
            .serialize_request(&key)
            .and_then(|r| r.pem())
            .map_err(RemoteIssueError::Csr)?;
        let token = std::fs::read_to_string(&self.token_file).map_err(|source| {
            RemoteIssueError::Token {
                path: self.token_file.clone(),
                source,
            }
        })?;
        let validity = not_after.duration_since(not_before).unwrap_or_default();
        let rt = self.rt.as_ref().ok_or(RemoteIssueError::ShuttingDown)?;
        let chain = rt.block_on(self.client.create_certificate(
            token.trim(),
            &csr,
            identity,
            true,
            validity,
        ))?;
        Ok((
            chain,
            rustls_pki_types::PrivatePkcs8KeyDer::from(key.serialize_der()),
        ))
    }
}

impl ringway_identity::CertSource for RemoteSource {
    fn issue(
        &self,
        identity: &Identity,
        not_before: std::time::SystemTime,
        not_after: std::time::SystemTime,
    ) -> Result<ringway_identity::Issued, ringway_identity::IssueError> {
        self.request(identity, not_before, not_after)
            .map_err(ringway_identity::IssueError::remote)
    }

    fn expires(&self) -> Option<std::time::SystemTime> {
        None
    }

    fn remote(&self) -> bool {
        true
    }

    /// The service could not be reached, did not answer in time, or said
    /// so itself (`Unavailable`, `ResourceExhausted`), or the token could
    /// not be read (being rotated): these may pass. A refusal
    /// (`PermissionDenied`, `Unauthenticated`: istiod's answer to an
    /// impersonation it does not allow; `InvalidArgument`), a failure
    /// inside it (`Internal`, and any code this client does not know), a
    /// malformed answer or one for another identity are not waited for.
    fn transient(&self, e: &ringway_identity::IssueError) -> bool {
        let ringway_identity::IssueError::Remote(e) = e else {
            return false;
        };
        match e.downcast_ref::<RemoteIssueError>() {
            Some(RemoteIssueError::Call(ClientError::Transport { .. }))
            | Some(RemoteIssueError::Token { .. }) => true,
            Some(RemoteIssueError::Call(ClientError::Refused(s))) => {
                matches!(s.code, Code::Unavailable | Code::ResourceExhausted)
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringway_identity::{CertSource, IssueError};

    /// Which failures readiness waits out: the service unreachable or
    /// saying it is busy, the token not readable yet; never a refusal
    /// (istiod refuses an impersonation with `Unauthenticated`), a failure
    /// inside the service, a malformed answer or one for another identity.
    #[test]
    fn transient_failures_are_those_that_may_pass() {
        let ca = ringway_identity::CaSigner::generate_for_tests("cluster.local");
        let client = CaClient::new(
            "127.0.0.1:9".parse().unwrap(),
            ServerName::try_from("ringway-ca.test").unwrap(),
            CaClient::tls_config(&[ca.cert().clone()]).unwrap(),
        );
        let source = RemoteSource::new(client, "/nonexistent/token").unwrap();
        let addr = "127.0.0.1:9".to_string();
        let call = |e: ClientError| IssueError::remote(RemoteIssueError::Call(e));
        let status = |code| call(ClientError::Refused(Status::new(code, "test", "test")));
        let cases = [
            (
                "unreachable",
                call(ClientError::Transport {
                    addr,
                    detail: "connect: refused".into(),
                }),
                true,
            ),
            (
                "token",
                IssueError::remote(RemoteIssueError::Token {
                    path: "/t".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                }),
                true,
            ),
            ("Unavailable", status(Code::Unavailable), true),
            ("ResourceExhausted", status(Code::ResourceExhausted), true),
            ("PermissionDenied", status(Code::PermissionDenied), false),
            ("Unauthenticated", status(Code::Unauthenticated), false),
            ("InvalidArgument", status(Code::InvalidArgument), false),
            ("Internal", status(Code::Internal), false),
            (
                "malformed",
                call(ClientError::Malformed("no grpc-status trailer".into())),
                false,
            ),
            (
                "another identity",
                call(ClientError::WrongIdentity {
                    wanted: Identity::new("cluster.local", "shop", "web"),
                    got: "spiffe://cluster.local/ns/shop/sa/api".into(),
                }),
                false,
            ),
        ];
        for (what, e, transient) in cases {
            assert_eq!(source.transient(&e), transient, "{what}: {e}");
        }
    }
}
