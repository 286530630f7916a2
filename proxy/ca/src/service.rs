//! `CreateCertificate`: authenticate (from the headers, before the body is
//! read), limit, decode, authorize, sign.
//!
//! What an unauthenticated caller may cost, in order:
//! - a token refused moments ago is refused again from memory
//!   ([`crate::review_cache`]);
//! - a review is charged to the caller's source address
//!   ([`Limits::review_rate_per_source`], a token bucket), unless the token
//!   passed a review before;
//! - a review waits for one of [`Limits::max_concurrent_reviews`] slots, at
//!   most [`Limits::review_wait`]; a token that passed a review before may
//!   also use one of [`Limits::reserved_reviews`], which junk never gets.
//!
//! The transport ([`crate::server`]) reads the body only once the caller is
//! authenticated.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use prost::Message;
use ringway_identity::CaSigner;
use tokio::sync::{Semaphore, SemaphorePermit};

use crate::authn::{Caller, TokenReviewer};
use crate::authz::{authorize, PodDirectory, Policy};
use crate::grpc::{decode_unary, Code, Status};
use crate::proto::{IstioCertificateRequest, IstioCertificateResponse};
use crate::review_cache::{CacheLimits, Outcome, ReviewCache};

/// Limits and lifetimes.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Largest request message (the gRPC frame's payload).
    pub max_request_bytes: usize,
    /// Largest CSR (PEM text).
    pub max_csr_bytes: usize,
    /// Requests per second per caller ([`crate::Caller::rate_key`]: the pod
    /// of a bound token, else the service account), sustained.
    pub rate_per_caller: f64,
    /// Requests a caller may send at once above the rate.
    pub burst_per_caller: f64,
    /// Token reviews in flight at once (each is a call to the API server),
    /// for any token.
    pub max_concurrent_reviews: usize,
    /// Further reviews in flight at once for tokens that passed a review
    /// before ([`Limits::known_token_ttl`]): junk tokens cannot take them.
    pub reserved_reviews: usize,
    /// How long a call waits for a review slot before it is refused
    /// (RESOURCE_EXHAUSTED `too_many_reviews`).
    pub review_wait: Duration,
    /// Token reviews per second one source address may cause, sustained
    /// (tokens that passed a review before are not charged).
    pub review_rate_per_source: f64,
    /// Reviews a source may cause at once above the rate.
    pub review_burst_per_source: f64,
    /// Lifetime when the request asks for none.
    pub default_lifetime: Duration,
    /// The longest lifetime granted, whatever the request asks.
    pub max_lifetime: Duration,
    /// How far before now certificates start (clock skew between nodes).
    pub backdate: Duration,
    /// How long a successful token review is used for later calls with the
    /// same token (never past the token's `exp`); zero reviews every call.
    /// A revoked token is refused at the latest this long after revocation.
    pub review_cache_ttl: Duration,
    /// How long a token the API server refused is refused again without a
    /// review; zero reviews every call.
    pub refusal_cache_ttl: Duration,
    /// How long a token that passed a review counts as known (never past
    /// its `exp`): its later reviews may use the reserved slots and are not
    /// charged to its source.
    pub known_token_ttl: Duration,
    /// Tokens kept at once in each of the review memories (accepted,
    /// refused, known); beyond, new ones are not kept.
    pub review_cache_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_request_bytes: 64 * 1024,
            max_csr_bytes: 16 * 1024,
            rate_per_caller: 20.0,
            burst_per_caller: 100.0,
            max_concurrent_reviews: 64,
            reserved_reviews: 16,
            review_wait: Duration::from_secs(5),
            review_rate_per_source: 5.0,
            review_burst_per_source: 20.0,
            default_lifetime: Duration::from_secs(24 * 3600),
            max_lifetime: Duration::from_secs(24 * 3600),
            backdate: Duration::from_secs(300),
            review_cache_ttl: Duration::from_secs(10),
            refusal_cache_ttl: Duration::from_secs(10),
            known_token_ttl: Duration::from_secs(3600),
            review_cache_entries: 10_000,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReviewLabels {
    /// [`crate::review_cache::Outcome::label`].
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    code: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

/// Token buckets, one per key.
#[derive(Debug)]
struct Buckets<K> {
    rate: f64,
    burst: f64,
    map: Mutex<HashMap<K, (f64, Instant)>>,
}

impl<K: Hash + Eq + Clone> Buckets<K> {
    fn new(rate: f64, burst: f64) -> Self {
        Buckets {
            rate,
            burst,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token from `key`'s bucket; `false` when it is empty.
    fn take(&self, key: &K) -> bool {
        let now = Instant::now();
        let (rate, burst) = (self.rate, self.burst);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 100_000 {
            // Forget keys that have been quiet long enough to be full again.
            let full_after = Duration::from_secs_f64(burst / rate);
            map.retain(|_, (_, last)| now.duration_since(*last) < full_after);
        }
        let (tokens, last) = match map.get_mut(key) {
            Some(b) => b,
            None => map.entry(key.clone()).or_insert((burst, now)),
        };
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(burst);
        *last = now;
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        true
    }
}

/// Counts a call waiting for a review slot while it lives.
struct Waiting<'a>(&'a Gauge);

impl<'a> Waiting<'a> {
    fn new(g: &'a Gauge) -> Self {
        g.inc();
        Waiting(g)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The certificate service, independent of the transport.
pub struct CaService {
    policy: Policy,
    limits: Limits,
    reviewer: Arc<dyn TokenReviewer>,
    pods: Arc<dyn PodDirectory>,
    /// Newest first.
    signers: Vec<Arc<CaSigner>>,
    reviews: Semaphore,
    reserved: Semaphore,
    review_cache: ReviewCache,
    reviewed: Family<ReviewLabels, Counter>,
    waiting: Gauge,
    callers: Buckets<String>,
    sources: Buckets<IpAddr>,
    requests: Family<RequestLabels, Counter>,
    conn_refused: Family<ReasonLabels, Counter>,
    connections: Gauge,
    registry: Registry,
}

impl std::fmt::Debug for CaService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaService")
            .field("policy", &self.policy)
            .field("limits", &self.limits)
            .field("signers", &self.signers)
            .finish_non_exhaustive()
    }
}

/// A CA service that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// No signing root was given.
    #[error("the certificate service needs at least one CA certificate and key")]
    NoSigner,
    /// A limit is out of range.
    #[error("limit {0} must be positive")]
    BadLimit(&'static str),
}

impl Limits {
    /// Checks the values; the error names the limit.
    pub fn validate(&self) -> Result<(), ServiceError> {
        let rate_ok = |r: f64| r.is_finite() && r > 0.0;
        let burst_ok = |b: f64| b.is_finite() && b >= 1.0;
        for (what, bad) in [
            ("max_request_bytes", self.max_request_bytes == 0),
            ("max_csr_bytes", self.max_csr_bytes == 0),
            ("rate_per_caller", !rate_ok(self.rate_per_caller)),
            ("burst_per_caller", !burst_ok(self.burst_per_caller)),
            (
                "review_rate_per_source",
                !rate_ok(self.review_rate_per_source),
            ),
            (
                "review_burst_per_source",
                !burst_ok(self.review_burst_per_source),
            ),
            ("max_concurrent_reviews", self.max_concurrent_reviews == 0),
            ("max_lifetime", self.max_lifetime.is_zero()),
            ("default_lifetime", self.default_lifetime.is_zero()),
        ] {
            if bad {
                return Err(ServiceError::BadLimit(what));
            }
        }
        Ok(())
    }
}

impl CaService {
    /// A service signing with the newest of `signers` (by start of validity).
    pub fn new(
        policy: Policy,
        limits: Limits,
        reviewer: Arc<dyn TokenReviewer>,
        pods: Arc<dyn PodDirectory>,
        mut signers: Vec<Arc<CaSigner>>,
    ) -> Result<CaService, ServiceError> {
        if signers.is_empty() {
            return Err(ServiceError::NoSigner);
        }
        limits.validate()?;
        signers.sort_by_key(|s| std::cmp::Reverse(s.not_before()));
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "ringway_ca_requests",
            "CreateCertificate calls by gRPC code and reason",
            requests.clone(),
        );
        let reviewed = Family::<ReviewLabels, Counter>::default();
        registry.register(
            "ringway_ca_token_reviews",
            "Callers authenticated or refused, by whether their token was reviewed for the call, a recent review of the same token was used, or a recent refusal of it",
            reviewed.clone(),
        );
        let waiting = Gauge::default();
        registry.register(
            "ringway_ca_token_reviews_waiting",
            "Calls waiting for a token review slot",
            waiting.clone(),
        );
        let conn_refused = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "ringway_ca_connections_refused",
            "Connections to the service reset at accept (per_source, global) or closed before or without a call (handshake_timeout, handshake_failed, preface_timeout, preface_failed, idle_timeout)",
            conn_refused.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "ringway_ca_connections",
            "Connections to the service open now",
            connections.clone(),
        );
        Ok(CaService {
            policy,
            reviews: Semaphore::new(limits.max_concurrent_reviews),
            reserved: Semaphore::new(limits.reserved_reviews),
            review_cache: ReviewCache::new(CacheLimits {
                ttl: limits.review_cache_ttl,
                refusal_ttl: limits.refusal_cache_ttl,
                known_ttl: limits.known_token_ttl,
                max_entries: limits.review_cache_entries,
            }),
            reviewed,
            waiting,
            callers: Buckets::new(limits.rate_per_caller, limits.burst_per_caller),
            sources: Buckets::new(
                limits.review_rate_per_source,
                limits.review_burst_per_source,
            ),
            limits,
            reviewer,
            pods,
            signers,
            requests,
            conn_refused,
            connections,
            registry,
        })
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The service's metrics in the OpenMetrics text format.
    pub fn encode_metrics(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    fn outcomes(&self, o: Outcome) -> u64 {
        self.reviewed
            .get_or_create(&ReviewLabels { outcome: o.label() })
            .get()
    }

    /// Calls so far answered by a review another call with the same token
    /// made, earlier or while they waited (`cached`), and by a review of
    /// their own (`reviewed`); refusals are counted too.
    pub fn reviews(&self) -> (u64, u64) {
        (
            self.outcomes(Outcome::Cached),
            self.outcomes(Outcome::Reviewed),
        )
    }

    /// Calls so far refused from the memory of an earlier refusal of their
    /// token.
    pub fn refusals_cached(&self) -> u64 {
        self.outcomes(Outcome::RefusalCached)
    }

    /// Tokens whose review is kept now (reviewed or being reviewed).
    pub fn cached_tokens(&self) -> usize {
        self.review_cache.len()
    }

    /// Refused tokens remembered now.
    pub fn refused_tokens(&self) -> usize {
        self.review_cache.refused_len()
    }

    /// Calls waiting for a review slot now.
    pub fn reviews_waiting(&self) -> i64 {
        self.waiting.get()
    }

    /// The number of calls that ended with `code` and `reason` so far.
    pub fn count(&self, code: Code, reason: &'static str) -> u64 {
        self.requests
            .get_or_create(&RequestLabels {
                code: code.name(),
                reason,
            })
            .get()
    }

    /// Connections refused or closed for `reason` so far (see
    /// `ringway_ca_connections_refused_total`).
    pub fn connections_refused(&self, reason: &'static str) -> u64 {
        self.conn_refused
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Counts a connection refused or closed by the transport.
    pub(crate) fn connection_refused(&self, reason: &'static str) {
        self.conn_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The open-connections gauge (the transport moves it).
    pub(crate) fn connections_gauge(&self) -> &Gauge {
        &self.connections
    }

    /// Counts a call's outcome in `ringway_ca_requests_total{code,reason}`.
    pub fn record<T>(&self, result: &Result<T, Status>) {
        let (code, reason) = match result {
            Ok(_) => (Code::Ok, "issued"),
            Err(s) => (s.code, s.reason),
        };
        self.requests
            .get_or_create(&RequestLabels {
                code: code.name(),
                reason,
            })
            .inc();
    }

    /// One `CreateCertificate` call (no source address: no per-source
    /// budget): the `authorization` header and the request body (gRPC
    /// framed). Counted.
    pub async fn create_certificate(
        &self,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<IstioCertificateResponse, Status> {
        let result = self.call(None, authorization, body).await;
        self.record(&result);
        result
    }

    /// [`CaService::create_certificate`] from `source` (its reviews are
    /// charged to that address's budget).
    pub async fn create_certificate_from(
        &self,
        source: IpAddr,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<IstioCertificateResponse, Status> {
        let result = self.call(Some(source), authorization, body).await;
        self.record(&result);
        result
    }

    async fn call(
        &self,
        source: Option<IpAddr>,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<IstioCertificateResponse, Status> {
        let caller = self.authenticate(source, authorization).await?;
        self.issue(&caller, body).await
    }

    /// Who is calling, from the `authorization` header alone (the transport
    /// reads no body before this): remembered, or reviewed within the
    /// source's budget and a review slot. Not counted ([`CaService::record`]
    /// counts the call).
    pub async fn authenticate(
        &self,
        source: Option<IpAddr>,
        authorization: Option<&str>,
    ) -> Result<Caller, Status> {
        let token = bearer(authorization)?;
        let (caller, outcome) = self
            .review_cache
            .review(token, |known| async move {
                if let (false, Some(src)) = (known, source) {
                    if !self.sources.take(&src) {
                        return Err(Status::new(
                            Code::ResourceExhausted,
                            "source_rate_limited",
                            format!(
                                "{src} asks for more than {} token reviews per second; retry later",
                                self.limits.review_rate_per_source
                            ),
                        ));
                    }
                }
                let _slot = self.review_slot(known).await?;
                Ok(self.reviewer.review(token).await)
            })
            .await;
        if outcome != Outcome::NotReviewed {
            self.reviewed
                .get_or_create(&ReviewLabels {
                    outcome: outcome.label(),
                })
                .inc();
        }
        caller
    }

    /// A review slot: an ordinary one, or for a known token a reserved one,
    /// whichever comes first within [`Limits::review_wait`].
    async fn review_slot(&self, known: bool) -> Result<SemaphorePermit<'_>, Status> {
        let _waiting = Waiting::new(&self.waiting);
        let wait = self.limits.review_wait;
        let slot = async {
            if known && self.limits.reserved_reviews > 0 {
                tokio::select! {
                    biased;
                    p = self.reviews.acquire() => p,
                    p = self.reserved.acquire() => p,
                }
            } else {
                self.reviews.acquire().await
            }
        };
        match tokio::time::timeout(wait, slot).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Status::new(
                Code::ResourceExhausted,
                "too_many_reviews",
                format!("no token review could start within {wait:?}; retry"),
            )),
        }
    }

    /// The certificate an authenticated `caller` asks for with `body` (the
    /// request, gRPC framed). Not counted ([`CaService::record`] counts the
    /// call).
    pub async fn issue(
        &self,
        caller: &Caller,
        body: &[u8],
    ) -> Result<IstioCertificateResponse, Status> {
        self.rate_limit(&caller.rate_key())?;
        let invalid = |reason, m: String| Status::new(Code::InvalidArgument, reason, m);
        let msg = decode_unary(body, self.limits.max_request_bytes)?;
        let req = IstioCertificateRequest::decode(msg).map_err(|e| {
            invalid(
                "malformed_request",
                format!("not an IstioCertificateRequest: {e}"),
            )
        })?;
        if req.csr.is_empty() {
            return Err(invalid("no_csr", "the request has no csr".into()));
        }
        if req.csr.len() > self.limits.max_csr_bytes {
            return Err(invalid(
                "csr_too_large",
                format!(
                    "csr is {} bytes, more than the limit of {}",
                    req.csr.len(),
                    self.limits.max_csr_bytes
                ),
            ));
        }
        if req.validity_duration < 0 {
            return Err(invalid(
                "bad_validity",
                format!(
                    "validity_duration is {}, expected >= 0",
                    req.validity_duration
                ),
            ));
        }
        let impersonate = req
            .impersonated_identity()
            .map_err(|e| invalid("bad_metadata", e.to_string()))?;
        let identity = authorize(&self.policy, caller, impersonate, &*self.pods)?;

        let now = SystemTime::now();
        let signer = self
            .signers
            .iter()
            .find(|s| s.not_before() <= now && now < s.not_after())
            .ok_or_else(|| {
                Status::new(
                    Code::Unavailable,
                    "no_valid_root",
                    "no CA certificate is valid now",
                )
            })?;
        let asked = u64::try_from(req.validity_duration).unwrap_or(0);
        let lifetime = if asked == 0 {
            self.limits.default_lifetime
        } else {
            Duration::from_secs(asked)
        }
        .min(self.limits.max_lifetime);
        let not_before = now
            .checked_sub(self.limits.backdate)
            .unwrap_or(now)
            .max(signer.not_before());
        let chain = signer
            .sign_csr(&req.csr, &identity, not_before, now + lifetime)
            .map_err(|e| invalid("bad_csr", e.to_string()))?;
        tracing::info!(
            ca.caller = %caller.key(),
            ca.pod = caller.pod_name.as_deref().unwrap_or(""),
            ca.identity = %identity,
            ca.impersonated = impersonate.is_some(),
            ca.lifetime_s = lifetime.as_secs(),
            "certificate issued"
        );
        Ok(IstioCertificateResponse {
            cert_chain: chain
                .iter()
                .map(|c| pem::encode(&pem::Pem::new("CERTIFICATE", c.as_ref().to_vec())))
                .collect(),
        })
    }

    fn rate_limit(&self, caller: &str) -> Result<(), Status> {
        if self.callers.take(&caller.to_owned()) {
            return Ok(());
        }
        Err(Status::new(
            Code::ResourceExhausted,
            "rate_limited",
            format!(
                "{caller} sends more than {} requests per second",
                self.limits.rate_per_caller
            ),
        ))
    }
}

fn bearer(authorization: Option<&str>) -> Result<&str, Status> {
    let unauth = |m: &str| Status::new(Code::Unauthenticated, "no_token", m.to_owned());
    let h = authorization
        .ok_or_else(|| unauth("no authorization header (expected: Bearer <token>)"))?;
    let (scheme, token) = h
        .split_once(' ')
        .ok_or_else(|| unauth("authorization header is not \"Bearer <token>\""))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(unauth("authorization header is not \"Bearer <token>\""));
    }
    Ok(token.trim())
}
