//! `CreateCertificate`: decode, authenticate, limit, authorize, sign.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use prost::Message;
use ringway_identity::CaSigner;
use tokio::sync::Semaphore;

use crate::authn::TokenReviewer;
use crate::authz::{authorize, PodDirectory, Policy};
use crate::grpc::{decode_unary, Code, Status};
use crate::proto::{IstioCertificateRequest, IstioCertificateResponse};

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
    /// Token reviews in flight at once (each is a call to the API server).
    pub max_concurrent_reviews: usize,
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
    /// Tokens whose review is kept at once; beyond, calls are reviewed
    /// without caching.
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
            default_lifetime: Duration::from_secs(24 * 3600),
            max_lifetime: Duration::from_secs(24 * 3600),
            backdate: Duration::from_secs(300),
            review_cache_ttl: Duration::from_secs(10),
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

/// The certificate service, independent of the transport.
pub struct CaService {
    policy: Policy,
    limits: Limits,
    reviewer: Arc<dyn TokenReviewer>,
    pods: Arc<dyn PodDirectory>,
    /// Newest first.
    signers: Vec<Arc<CaSigner>>,
    reviews: Semaphore,
    review_cache: crate::review_cache::ReviewCache,
    reviewed: Family<ReviewLabels, Counter>,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    requests: Family<RequestLabels, Counter>,
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
        for (what, bad) in [
            ("max_request_bytes", limits.max_request_bytes == 0),
            ("max_csr_bytes", limits.max_csr_bytes == 0),
            (
                "rate_per_caller",
                !limits.rate_per_caller.is_finite() || limits.rate_per_caller <= 0.0,
            ),
            (
                "burst_per_caller",
                !limits.burst_per_caller.is_finite() || limits.burst_per_caller < 1.0,
            ),
            ("max_concurrent_reviews", limits.max_concurrent_reviews == 0),
            ("max_lifetime", limits.max_lifetime.is_zero()),
            ("default_lifetime", limits.default_lifetime.is_zero()),
        ] {
            if bad {
                return Err(ServiceError::BadLimit(what));
            }
        }
        signers.sort_by_key(|s| std::cmp::Reverse(s.not_before()));
        let requests = Family::<RequestLabels, Counter>::default();
        let mut registry = Registry::default();
        registry.register(
            "ringway_ca_requests",
            "CreateCertificate calls by gRPC code and reason",
            requests.clone(),
        );
        let reviewed = Family::<ReviewLabels, Counter>::default();
        registry.register(
            "ringway_ca_token_reviews",
            "Callers authenticated, by whether their token was reviewed for the call or a recent review of the same token was used",
            reviewed.clone(),
        );
        Ok(CaService {
            policy,
            reviews: Semaphore::new(limits.max_concurrent_reviews),
            review_cache: crate::review_cache::ReviewCache::new(
                limits.review_cache_ttl,
                limits.review_cache_entries,
            ),
            reviewed,
            limits,
            reviewer,
            pods,
            signers,
            buckets: Mutex::new(HashMap::new()),
            requests,
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

    /// Calls so far answered by a review another call with the same token
    /// made, earlier or while they waited (`cached`), and by a review of
    /// their own (`reviewed`); refusals are counted too.
    pub fn reviews(&self) -> (u64, u64) {
        use crate::review_cache::Outcome;
        let n = |o: Outcome| {
            let labels = ReviewLabels { outcome: o.label() };
            self.reviewed.get_or_create(&labels).get()
        };
        (n(Outcome::Cached), n(Outcome::Reviewed))
    }

    /// Tokens whose review is kept now (reviewed or being reviewed).
    pub fn cached_tokens(&self) -> usize {
        self.review_cache.len()
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

    /// One `CreateCertificate` call: the request body (gRPC framed) and the
    /// `authorization` header.
    pub async fn create_certificate(
        &self,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<IstioCertificateResponse, Status> {
        let result = self.handle(authorization, body).await;
        let (code, reason) = match &result {
            Ok(_) => (Code::Ok, "issued"),
            Err(s) => (s.code, s.reason),
        };
        self.requests
            .get_or_create(&RequestLabels {
                code: code.name(),
                reason,
            })
            .inc();
        result
    }

    async fn handle(
        &self,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Result<IstioCertificateResponse, Status> {
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
            .map_err(|m| invalid("bad_metadata", m))?;

        let token = bearer(authorization)?;
        let (caller, outcome) = self
            .review_cache
            .review(token, async {
                let _permit = self.reviews.try_acquire().map_err(|_| {
                    Status::new(
                        Code::ResourceExhausted,
                        "too_many_reviews",
                        "too many token reviews in flight; retry",
                    )
                })?;
                self.reviewer.review(token).await
            })
            .await;
        self.reviewed
            .get_or_create(&ReviewLabels {
                outcome: outcome.label(),
            })
            .inc();
        let caller = caller?;
        self.rate_limit(&caller.rate_key())?;
        let identity = authorize(&self.policy, &caller, impersonate, &*self.pods)?;

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
        let now = Instant::now();
        let (rate, burst) = (self.limits.rate_per_caller, self.limits.burst_per_caller);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() > 100_000 {
            // Forget callers that have been quiet long enough to be full again.
            let full_after = Duration::from_secs_f64(burst / rate);
            buckets.retain(|_, (_, last)| now.duration_since(*last) < full_after);
        }
        let (tokens, last) = buckets.entry(caller.to_owned()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(burst);
        *last = now;
        if *tokens < 1.0 {
            return Err(Status::new(
                Code::ResourceExhausted,
                "rate_limited",
                format!("{caller} sends more than {rate} requests per second"),
            ));
        }
        *tokens -= 1.0;
        Ok(())
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
