//! ringway's certificate service (`ringway ca`) and its client.
//!
//! The root key lives only in the CA's pods. A node proxy makes a key pair
//! per identity, sends a certificate signing request, and gets a signed
//! chain back, over the mesh's protocol: gRPC over TLS,
//! `istio.v1.auth.IstioCertificateService/CreateCertificate`, so a proxy can
//! also get its certificates from the reference control plane's CA.
//!
//! - [`authn`]: the bearer token, reviewed by the Kubernetes TokenReview API
//!   with the audience checked; a successful review is reused for a few
//!   seconds ([`review_cache`]), so a node proxy starting many pods costs
//!   the API server one review, not one per certificate.
//! - [`authz`]: a caller gets its own identity; `ImpersonatedIdentity` only
//!   for the node proxy's service account, and only for an identity a live
//!   pod on the caller's node has (the caller's node from its token's pod,
//!   pods from a watch, [`pods`]).
//! - [`service`]: limits (request and CSR size, requests per caller per
//!   second; before authentication, token reviews per source address, a
//!   bounded wait for a review slot, slots reserved for tokens that passed a
//!   review before, refusals remembered) and signing: the CA, not the CSR,
//!   decides the certificate (the authorized SPIFFE ID as the only SAN, key
//!   usages, a lifetime capped by configuration); with several roots, the
//!   newest valid one signs.
//! - [`server`] and [`client`]: the transport (h2 directly: one unary
//!   method needs no gRPC framework); the server bounds what a connection
//!   may cost before its caller is authenticated (connections per source and
//!   in all, handshake, preface, idle and call timeouts, the token checked
//!   before the body is read).
//!
//! Every refusal is a gRPC status whose message says why, counted in
//! `ringway_ca_requests_total{code,reason}`.

#![forbid(unsafe_code)]

/// gRPC framing and status codes, from the shared crate (`crate::grpc`
/// paths predate the split).
pub use ringway_grpc as grpc;

pub mod authn;
pub mod authz;
pub mod client;
pub mod pods;
pub mod proto;
pub mod review_cache;
pub mod server;
pub mod service;

pub use authn::{Caller, KubeTokenReviewer, TokenReviewer};
pub use authz::{NotReady, PodDirectory, PodView, Policy};
pub use client::{CaClient, ClientError, RemoteIssueError, TlsConfigError};
pub use grpc::{Code, Status};
pub use service::{CaService, Limits};
