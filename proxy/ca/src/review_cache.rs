//! Token reviews remembered for a short while.
//!
//! Every node proxy signs its CSRs with its own service-account token, the
//! same one for every pod it starts; without a cache, each certificate costs
//! one TokenReview call to the API server, on the path of the pod's start.
//! A successful review is kept for [`crate::Limits::review_cache_ttl`] (and
//! never past the token's own `exp`), keyed by the token's SHA-256 digest, so
//! the cache holds no token. Calls with one token that arrive while it is
//! being reviewed wait for that review and get its answer, refusals
//! included, instead of making their own.
//!
//! Only authentication is remembered: what the caller may be issued (for
//! impersonation, from the pod directory) and its rate budget are checked on
//! every call. A refused review is never kept, and a token revoked at the
//! API server (its pod deleted) is refused here at the latest one TTL later. The number of
//! tokens held is bounded: beyond it, calls are reviewed without caching.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use crate::authn::Caller;
use crate::grpc::Status;

type Digest = [u8; 32];

struct Slot {
    /// Until when a successful review may be used.
    expires: Instant,
    /// The review's answer, refusals included: the calls waiting on one
    /// review all get its answer. A refusal's slot leaves the map at once.
    review: tokio::sync::OnceCell<Result<Caller, Status>>,
}

/// How a call was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered from a review made earlier (or in flight) for the same token.
    Cached,
    /// Reviewed for this call.
    Reviewed,
}

impl Outcome {
    /// The `outcome` label of `ringway_ca_token_reviews_total`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Cached => "cached",
            Outcome::Reviewed => "reviewed",
        }
    }
}

pub(crate) struct ReviewCache {
    ttl: Duration,
    max_entries: usize,
    slots: Mutex<HashMap<Digest, Arc<Slot>>>,
}

impl ReviewCache {
    /// `ttl` zero keeps nothing.
    pub(crate) fn new(ttl: Duration, max_entries: usize) -> ReviewCache {
        ReviewCache {
            ttl,
            max_entries,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// Tokens held now (reviewed or being reviewed).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The caller `token` stands for: remembered, or from `review` (which is
    /// run at most once at a time per token).
    pub(crate) async fn review<F>(
        &self,
        token: &str,
        review: F,
    ) -> (Result<Caller, Status>, Outcome)
    where
        F: Future<Output = Result<Caller, Status>>,
    {
        let Some((key, slot)) = self.slot(token) else {
            return (review.await, Outcome::Reviewed);
        };
        // Whatever happens to this call (answered, refused, or dropped while
        // the review runs), a slot without an accepted answer does not stay.
        let _forget = ForgetUnanswered {
            cache: self,
            key,
            slot: slot.clone(),
        };
        let mut ran = false;
        let result = slot
            .review
            .get_or_init(|| {
                ran = true;
                review
            })
            .await
            .clone();
        let outcome = if ran {
            Outcome::Reviewed
        } else {
            Outcome::Cached
        };
        (result, outcome)
    }

    /// The slot for `token`, made if needed; `None` when the token may not be
    /// kept (caching off, the token expires before the TTL would, or the
    /// cache is full of live entries).
    fn slot(&self, token: &str) -> Option<(Digest, Arc<Slot>)> {
        if self.ttl.is_zero() || self.max_entries == 0 {
            return None;
        }
        let now = Instant::now();
        let key = digest(token);
        let mut slots = self.lock();
        if let Some(s) = slots.get(&key) {
            if s.expires > now {
                return Some((key, s.clone()));
            }
            slots.remove(&key);
        }
        let expires = now.checked_add(self.ttl.min(token_lifetime_left(token)?))?;
        if slots.len() >= self.max_entries {
            slots.retain(|_, s| s.expires > now);
            if slots.len() >= self.max_entries {
                return None;
            }
        }
        let slot = Arc::new(Slot {
            expires,
            review: tokio::sync::OnceCell::new(),
        });
        slots.insert(key, slot.clone());
        Some((key, slot))
    }
}

/// Removes a slot that holds no accepted review when the call that took it
/// ends (if the map still holds that slot).
struct ForgetUnanswered<'a> {
    cache: &'a ReviewCache,
    key: Digest,
    slot: Arc<Slot>,
}

impl Drop for ForgetUnanswered<'_> {
    fn drop(&mut self) {
        if matches!(self.slot.review.get(), Some(Ok(_))) {
            return;
        }
        let mut slots = self.cache.lock();
        if slots
            .get(&self.key)
            .is_some_and(|s| Arc::ptr_eq(s, &self.slot))
        {
            slots.remove(&self.key);
        }
    }
}

fn digest(token: &str) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// How long `token` is still valid by its own `exp` claim when it is a JWT
/// that has one; `None` when it has expired (or expires within a second);
/// [`Duration::MAX`] when it says nothing (the TTL alone then bounds it).
/// The claim is only read to bound the cache: the API server's review is
/// what authenticates the token.
fn token_lifetime_left(token: &str) -> Option<Duration> {
    let Some(exp) = jwt_exp(token) else {
        return Some(Duration::MAX);
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    exp.checked_sub(now)
        .filter(|left| *left >= 1)
        .map(Duration::from_secs)
}

/// The `exp` claim of a JWT (`header.payload.signature`, base64url), if the
/// token is one and has a numeric `exp`.
fn jwt_exp(token: &str) -> Option<u64> {
    // Service-account tokens are about 1 KiB; a larger payload is not read.
    const MAX_PAYLOAD: usize = 16 * 1024;
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || payload.len() > MAX_PAYLOAD {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    match claims.get("exp")? {
        serde_json::Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && *f >= 0.0)
                .map(|f| f as u64)
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(r#"{"alg":"RS256"}"#),
            e.encode(claims)
        )
    }

    fn now_s() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
    }

    #[test]
    fn exp_is_read_from_jwts_and_nothing_else() {
        assert_eq!(jwt_exp(&jwt(r#"{"exp":1700000000}"#)), Some(1_700_000_000));
        assert_eq!(
            jwt_exp(&jwt(r#"{"exp":1700000000.5}"#)),
            Some(1_700_000_000)
        );
        assert_eq!(jwt_exp(&jwt(r#"{"exp":"soon"}"#)), None);
        assert_eq!(jwt_exp(&jwt(r#"{"exp":-5}"#)), None);
        assert_eq!(jwt_exp(&jwt(r#"{"sub":"x"}"#)), None);
        assert_eq!(jwt_exp(&jwt("not json")), None);
        assert_eq!(jwt_exp("opaque-token"), None);
        assert_eq!(jwt_exp("a.b"), None);
        assert_eq!(jwt_exp("a.b.c.d"), None);
        assert_eq!(jwt_exp("a.!!!.c"), None);
        let huge = format!("a.{}.c", "A".repeat(17 * 1024));
        assert_eq!(jwt_exp(&huge), None);
    }

    #[test]
    fn lifetime_is_bounded_by_exp() {
        let t = jwt(&format!(r#"{{"exp":{}}}"#, now_s() + 100));
        let left = token_lifetime_left(&t).unwrap();
        assert!(left <= Duration::from_secs(100) && left >= Duration::from_secs(98));
        let past = jwt(&format!(r#"{{"exp":{}}}"#, now_s() - 1));
        assert_eq!(token_lifetime_left(&past), None);
        assert_eq!(token_lifetime_left("opaque"), Some(Duration::MAX));
    }
}
