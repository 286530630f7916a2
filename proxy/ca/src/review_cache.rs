//! Token reviews remembered for a short while: accepted ones, refused ones,
//! and which tokens passed a review before.
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
//! A token the API server refused (UNAUTHENTICATED: not a token, another
//! audience, not a service account) is refused again from memory for
//! [`crate::Limits::refusal_cache_ttl`]: junk sent in a loop costs one
//! review, not one per call. A review that failed (the API server did not
//! answer) is never kept. A token that passed a review is remembered as
//! *known* for [`crate::Limits::known_token_ttl`] (never past its `exp`):
//! when its accepted review has expired, its next review may use the review
//! slots reserved for such tokens and is not charged to its source's budget
//! (see [`crate::service`]), so floods of junk tokens cannot starve the
//! renewals of callers that authenticated before.
//!
//! Only authentication is remembered: what the caller may be issued (for
//! impersonation, from the pod directory) and its rate budget are checked on
//! every call. A token revoked at the API server (its pod deleted) is
//! refused here at the latest one TTL later. Each of the three memories
//! holds at most [`crate::Limits::review_cache_entries`] tokens: beyond,
//! expired entries are dropped, and if none has expired the new one is not
//! kept (accepted tokens are then reviewed without caching).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use crate::authn::Caller;
use crate::grpc::{Code, Status};

type Digest = [u8; 32];

/// The answer of one review: the caller, or the review's refusal (shared by
/// every call that waited on it).
type Answer = Result<Caller, Status>;

struct Slot {
    /// Until when a successful review may be used.
    expires: Instant,
    /// The review's answer, refusals included: the calls waiting on one
    /// review all get its answer. A refusal's slot leaves the map at once.
    review: tokio::sync::OnceCell<Answer>,
}

/// How a call was authenticated (or refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered from a review made earlier (or in flight) for the same token.
    Cached,
    /// Reviewed for this call.
    Reviewed,
    /// Refused from the memory of an earlier refusal of the same token.
    RefusalCached,
    /// Refused before any review could start (the source's budget, no
    /// review slot in time).
    NotReviewed,
}

impl Outcome {
    /// The `outcome` label of `ringway_ca_token_reviews_total`.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Cached => "cached",
            Outcome::Reviewed => "reviewed",
            Outcome::RefusalCached => "refusal_cached",
            Outcome::NotReviewed => "not_reviewed",
        }
    }
}

/// The cache's lifetimes and bound.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CacheLimits {
    /// Accepted reviews (zero: none kept).
    pub ttl: Duration,
    /// Refusals (zero: none kept).
    pub refusal_ttl: Duration,
    /// Known tokens (zero: none).
    pub known_ttl: Duration,
    /// Bound of each memory.
    pub max_entries: usize,
}

pub(crate) struct ReviewCache {
    limits: CacheLimits,
    slots: Mutex<HashMap<Digest, Arc<Slot>>>,
    /// Refused tokens: until when, and the refusal.
    refused: Mutex<HashMap<Digest, (Instant, Status)>>,
    /// Tokens that passed a review: until when they count as known.
    known: Mutex<HashMap<Digest, Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Inserts into a bounded map: when full, expired entries go first; when
/// none has, nothing is inserted.
fn bounded_insert<V>(
    map: &mut HashMap<Digest, V>,
    max: usize,
    key: Digest,
    value: V,
    now: Instant,
    expires: impl Fn(&V) -> Instant,
) {
    if max == 0 {
        return;
    }
    if map.len() >= max && !map.contains_key(&key) {
        map.retain(|_, v| expires(v) > now);
        if map.len() >= max {
            return;
        }
    }
    map.insert(key, value);
}

impl ReviewCache {
    pub(crate) fn new(limits: CacheLimits) -> ReviewCache {
        ReviewCache {
            limits,
            slots: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
        }
    }

    /// Tokens held now (reviewed or being reviewed).
    pub(crate) fn len(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Refused tokens remembered now (expired ones included until pruned).
    pub(crate) fn refused_len(&self) -> usize {
        lock(&self.refused).len()
    }

    /// The caller `token` stands for: remembered, or from the review
    /// `start(known)` begins (`known`: the token passed a review before).
    /// `start` runs at most once at a time per token; its outer `Err` is a
    /// refusal of this call alone (no review was made: not shared with the
    /// calls waiting on the token, not remembered), its `Ok` the review's
    /// answer.
    pub(crate) async fn review<F, Fut>(&self, token: &str, start: F) -> (Answer, Outcome)
    where
        F: FnOnce(bool) -> Fut,
        Fut: Future<Output = Result<Answer, Status>>,
    {
        let now = Instant::now();
        let key = digest(token);
        if let Some(refusal) = self.refused_now(&key, now) {
            return (Err(refusal), Outcome::RefusalCached);
        }
        let known = self.is_known(&key, now);
        let Some(slot) = self.slot(key, token, now) else {
            return match start(known).await {
                Err(local) => (Err(local), Outcome::NotReviewed),
                Ok(answer) => {
                    self.remember(key, token, &answer);
                    (answer, Outcome::Reviewed)
                }
            };
        };
        // Whatever happens to this call (answered, refused, or dropped while
        // the review runs), a slot without an accepted answer does not stay.
        let _forget = ForgetUnanswered {
            cache: self,
            key,
            slot: slot.clone(),
        };
        let mut ran = false;
        let got = slot
            .review
            .get_or_try_init(|| {
                ran = true;
                start(known)
            })
            .await;
        match got {
            // No review was made for this call; a call waiting on the same
            // token tries its own.
            Err(local) => (Err(local), Outcome::NotReviewed),
            Ok(answer) => {
                let answer = answer.clone();
                if ran {
                    self.remember(key, token, &answer);
                    (answer, Outcome::Reviewed)
                } else {
                    (answer, Outcome::Cached)
                }
            }
        }
    }

    fn refused_now(&self, key: &Digest, now: Instant) -> Option<Status> {
        let mut refused = lock(&self.refused);
        match refused.get(key) {
            Some((until, s)) if *until > now => Some(s.clone()),
            Some(_) => {
                refused.remove(key);
                None
            }
            None => None,
        }
    }

    fn is_known(&self, key: &Digest, now: Instant) -> bool {
        lock(&self.known).get(key).is_some_and(|until| *until > now)
    }

    /// Remembers a review's answer: an accepted token as known, a refused
    /// one as refused (an API server that did not answer is not a refusal).
    fn remember(&self, key: Digest, token: &str, answer: &Answer) {
        let now = Instant::now();
        let max = self.limits.max_entries;
        match answer {
            Ok(_) => {
                let Some(left) = token_lifetime_left(token) else {
                    return;
                };
                let ttl = self.limits.known_ttl.min(left);
                if ttl.is_zero() {
                    return;
                }
                if let Some(until) = now.checked_add(ttl) {
                    bounded_insert(&mut lock(&self.known), max, key, until, now, |u| *u);
                }
            }
            Err(s) if s.code == Code::Unauthenticated && !self.limits.refusal_ttl.is_zero() => {
                if let Some(until) = now.checked_add(self.limits.refusal_ttl) {
                    bounded_insert(
                        &mut lock(&self.refused),
                        max,
                        key,
                        (until, s.clone()),
                        now,
                        |(u, _)| *u,
                    );
                }
            }
            Err(_) => {}
        }
    }

    /// The slot for `token`, made if needed; `None` when the token may not be
    /// kept (caching off, the token expires before the TTL would, or the
    /// cache is full of live entries).
    fn slot(&self, key: Digest, token: &str, now: Instant) -> Option<Arc<Slot>> {
        let (ttl, max_entries) = (self.limits.ttl, self.limits.max_entries);
        if ttl.is_zero() || max_entries == 0 {
            return None;
        }
        let mut slots = lock(&self.slots);
        if let Some(s) = slots.get(&key) {
            if s.expires > now {
                return Some(s.clone());
            }
            slots.remove(&key);
        }
        let expires = now.checked_add(ttl.min(token_lifetime_left(token)?))?;
        if slots.len() >= max_entries {
            slots.retain(|_, s| s.expires > now);
            if slots.len() >= max_entries {
                return None;
            }
        }
        let slot = Arc::new(Slot {
            expires,
            review: tokio::sync::OnceCell::new(),
        });
        slots.insert(key, slot.clone());
        Some(slot)
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
        let mut slots = lock(&self.cache.slots);
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
