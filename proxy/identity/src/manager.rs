//! Workload certificates: issued in memory, cached per identity, rotated at
//! half-life; the rustls configs built from them, cached too.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, RwLock, TryLockError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use ringway_config::authz::Identity;
use ringway_config::{Backoff, Jitter};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::ca::{fmt_time, CaSigner, TrustBundle};
use crate::cert::WorkloadCert;
use crate::clock::{Clock, SystemClock};
use crate::error::{IdentityError, IssueError};
use crate::spiffe::{self, peer_identity_from_certs};
use crate::summary::CertState;
use crate::tls::{self, SpiffeClientVerifier, SpiffeServerVerifier};

/// Default workload certificate lifetime (as the reference mesh).
pub const DEFAULT_CERT_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How far `notBefore` is set in the past, for clock skew between nodes.
pub const DEFAULT_BACKDATE: Duration = Duration::from_secs(5 * 60);
/// Issuances (key generation + signing) allowed at once.
pub const DEFAULT_MAX_CONCURRENT_ISSUANCE: usize = 8;

/// What a [`CertSource`] issues: the chain (leaf first) and the leaf's key.
pub type Issued = (Vec<CertificateDer<'static>>, PrivatePkcs8KeyDer<'static>);

/// Where workload certificates come from: the CA itself ([`CaSigner`], the
/// local-key mode) or a certificate service reached over the network.
pub trait CertSource: Send + Sync + fmt::Debug {
    /// A chain (leaf first) and its key for `identity`, valid from
    /// `not_before` until at most `not_after` (the source may cap it).
    fn issue(
        &self,
        identity: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Issued, IssueError>;

    /// When the source stops being able to issue (a local CA's expiry);
    /// `None` when not known here.
    fn expires(&self) -> Option<SystemTime>;

    /// Whether issuing goes over the network. Then the datapath never
    /// issues: it uses the certificate in hand or fails closed, and the
    /// control thread and the refresher (with jittered backoff) get them.
    fn remote(&self) -> bool;

    /// Whether `e` is a failure that may pass by itself (the source could
    /// not be reached, did not answer in time, or was overloaded), rather
    /// than an answer that something is wrong (a refusal, a malformed
    /// answer): readiness waits only for certificates whose issuance failed
    /// so ([`IdentityManager::awaited`]), and a pod's prefetch skips a
    /// source that just failed so.
    fn transient(&self, _e: &IssueError) -> bool {
        false
    }
}

impl CertSource for CaSigner {
    fn issue(
        &self,
        identity: &Identity,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<Issued, IssueError> {
        CaSigner::issue(self, identity, not_before, not_after).map_err(IssueError::Sign)
    }

    fn expires(&self) -> Option<SystemTime> {
        Some(self.not_after())
    }

    fn remote(&self) -> bool {
        false
    }
}

/// One identity's current certificate, and the lock that makes its
/// issuance single-flight.
#[derive(Debug, Default)]
struct Slot {
    current: RwLock<Option<Arc<WorkloadCert>>>,
    /// The certificate in hand no longer chains to the trusted roots (a
    /// root was removed): renew it now, not at half-life.
    untrusted: std::sync::atomic::AtomicBool,
    issuing: Mutex<()>,
    /// Failed issuances (a remote source: the refresher retries with
    /// jittered exponential backoff).
    retry: Mutex<Retry>,
}

/// One identity's failed issuances in a row.
#[derive(Debug)]
struct Retry {
    /// The failures counted, and so the next delay ([`retry_backoff`]).
    backoff: Backoff,
    /// When the next try is due; `None` while nothing failed.
    due: Option<SystemTime>,
    /// Why the last try failed; empty while nothing failed.
    reason: String,
    /// The last try failed in a way that may pass by itself
    /// ([`CertSource::transient`]).
    transient: bool,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            backoff: retry_backoff(),
            due: None,
            reason: String::new(),
            transient: false,
        }
    }
}

/// The delays between tries of a failing issuance: 1 s doubling to 32 s,
/// with up to a quarter of each added at random so a node's proxies do not
/// retry in step after a CA outage.
fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(1), Duration::from_secs(32)).with_jitter(Jitter::Up(0.25))
}

/// A counting semaphore for issuance (std only; waits are short: one
/// P-256 key generation and one signature).
#[derive(Debug)]
struct Permits {
    free: Mutex<usize>,
    freed: Condvar,
}

impl Permits {
    fn acquire(&self) -> PermitGuard<'_> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        while *free == 0 {
            free = self
                .freed
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *free -= 1;
        PermitGuard(self)
    }
}

struct PermitGuard<'a>(&'a Permits);

impl Drop for PermitGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        self.0.freed.notify_one();
    }
}

/// Configs cached per key with the certificate and the trust they were
/// built from: either replaced, and the entry is stale.
type ConfigCache<K, C> = RwLock<HashMap<K, (Arc<WorkloadCert>, Arc<Trust>, Arc<C>)>>;

/// The roots peers are verified against, and what is built from them.
/// Replaced as a whole ([`IdentityManager::set_bundle`]).
struct Trust {
    bundle: TrustBundle,
    roots: Arc<RootCertStore>,
    client_verifier: Arc<SpiffeClientVerifier>,
}

/// What [`IdentityManager::set_bundle`] changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustChange {
    /// Roots trusted now that were not.
    pub added: usize,
    /// Roots no longer trusted.
    pub removed: usize,
    /// Roots trusted now.
    pub roots: usize,
    /// Certificates in hand that no longer chain to the roots: renewed
    /// at once (by the refresher) instead of at half-life.
    pub renewing: usize,
}

/// Issues, caches and rotates workload certificates, and hands out the
/// rustls configs for HBONE. Share it as `Arc<IdentityManager>`; every
/// method takes `&self`.
pub struct IdentityManager {
    ca: Arc<dyn CertSource>,
    trust: RwLock<Arc<Trust>>,
    /// Roots trusted whatever the bundle says: the local CA's own
    /// certificate.
    pinned: Vec<CertificateDer<'static>>,
    trust_domain: String,
    lifetime: Duration,
    backdate: Duration,
    provider: Arc<CryptoProvider>,
    clock: Arc<dyn Clock>,
    certs: RwLock<HashMap<Identity, Arc<Slot>>>,
    server_configs: ConfigCache<Identity, ServerConfig>,
    client_configs: ConfigCache<(Identity, Identity), ClientConfig>,
    permits: Arc<Permits>,
    issued: AtomicU64,
    issue_failures: AtomicU64,
    /// Trust bundles put in force after the first, and edits refused.
    bundle_reloads: AtomicU64,
    /// See [`IdentityManager::trust_generation`].
    trust_generation: AtomicU64,
    /// Told each new generation ([`IdentityManager::watch_trust`]).
    trust_changes: tokio::sync::watch::Sender<u64>,
    /// Held by [`IdentityManager::set_bundle`]: two edits applied at once
    /// (the watcher's first read and its first poll) go one after the
    /// other, the later one last.
    swapping: Mutex<()>,
    bundle_rejections: AtomicU64,
    /// When a remote source last failed without refusing (unreachable,
    /// slow), and why; `None` once it issued again.
    failing: Mutex<Option<(SystemTime, String)>>,
}

/// How long after a remote source failed (without refusing) a pod's
/// prefetch does not wait for it: the refresher retries.
const FAILING_FOR: Duration = Duration::from_secs(10);

impl fmt::Debug for IdentityManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdentityManager")
            .field("trust_domain", &self.trust_domain)
            .field("ca", &self.ca)
            .field("bundle", &read(&self.trust).bundle)
            .field("lifetime", &self.lifetime)
            .field("backdate", &self.backdate)
            .field("clock", &self.clock)
            .field("issued", &self.issued.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

impl IdentityManager {
    /// A manager issuing with `ca` for identities of `trust_domain`, each
    /// certificate valid for `lifetime` ([`DEFAULT_CERT_LIFETIME`] is the
    /// usual choice). Peers are trusted when they chain to a root of
    /// `bundle` or to `ca`'s own certificate.
    pub fn new(
        ca: CaSigner,
        mut bundle: TrustBundle,
        trust_domain: &str,
        lifetime: Duration,
    ) -> Result<Self, IdentityError> {
        let pinned = ca.cert().clone();
        bundle.add(pinned.clone());
        let mut m = Self::with_source(Arc::new(ca), bundle, trust_domain, lifetime)?;
        m.pinned.push(pinned);
        Ok(m)
    }

    /// A manager getting its certificates from `source`; peers are trusted
    /// when they chain to a root of `bundle` (which must hold the mesh's
    /// root).
    pub fn with_source(
        source: Arc<dyn CertSource>,
        bundle: TrustBundle,
        trust_domain: &str,
        lifetime: Duration,
    ) -> Result<Self, IdentityError> {
        let ca = source;
        // The config crate's checks, through a well-formed ID.
        Identity::from_spiffe_id(&format!("spiffe://{trust_domain}/ns/x/sa/x")).map_err(|e| {
            IdentityError::BadTrustDomain {
                trust_domain: trust_domain.to_owned(),
                reason: e.reason().to_owned(),
            }
        })?;
        if lifetime < Duration::from_secs(2) {
            return Err(IdentityError::BadLifetime(lifetime));
        }
        let provider = tls::crypto_provider();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let trust = Trust::new(bundle, trust_domain, &provider, &clock)?;
        Ok(IdentityManager {
            ca,
            trust: RwLock::new(Arc::new(trust)),
            pinned: Vec::new(),
            trust_domain: trust_domain.to_owned(),
            lifetime,
            backdate: DEFAULT_BACKDATE,
            provider,
            clock,
            certs: RwLock::default(),
            server_configs: RwLock::default(),
            client_configs: RwLock::default(),
            permits: Arc::new(Permits {
                free: Mutex::new(DEFAULT_MAX_CONCURRENT_ISSUANCE),
                freed: Condvar::new(),
            }),
            issued: AtomicU64::new(0),
            issue_failures: AtomicU64::new(0),
            bundle_reloads: AtomicU64::new(0),
            trust_generation: AtomicU64::new(0),
            trust_changes: tokio::sync::watch::Sender::new(0),
            swapping: Mutex::new(()),
            bundle_rejections: AtomicU64::new(0),
            failing: Mutex::new(None),
        })
    }

    /// A manager from the configuration's `ca:` section (`certFile`,
    /// `keyFile`, `bundleFiles`) and `trustDomain`.
    pub fn from_config(
        ca: &ringway_config::CaPaths,
        trust_domain: &str,
        lifetime: Duration,
    ) -> Result<Self, IdentityError> {
        let signer = CaSigner::load(&ca.cert_file, &ca.key_file)?;
        let bundle = TrustBundle::from_pem_files(&ca.bundle_files)?;
        Self::new(signer, bundle, trust_domain, lifetime)
    }

    /// Caps concurrent issuances (at least 1).
    pub fn with_max_concurrent_issuance(self, n: usize) -> Self {
        *self
            .permits
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = n.max(1);
        self
    }

    /// How far `notBefore` is backdated ([`DEFAULT_BACKDATE`]).
    pub fn with_backdate(mut self, backdate: Duration) -> Self {
        self.backdate = backdate;
        self
    }

    /// Replaces the clock (tests: [`ManualClock`](crate::ManualClock)). Call before any fetch.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        let trust = self.trust.get_mut().unwrap_or_else(PoisonError::into_inner);
        *trust = Arc::new(Trust {
            bundle: trust.bundle.clone(),
            roots: trust.roots.clone(),
            client_verifier: Arc::new(trust.client_verifier.with_clock(clock.clone())),
        });
        self.clock = clock;
        self
    }

    /// Our trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// The trusted roots (the bundle plus the local CA's certificate).
    pub fn bundle(&self) -> TrustBundle {
        read(&self.trust).bundle.clone()
    }

    /// Replaces the trusted roots (a root rotation, the roots' file
    /// edited): every handshake from now on, in both directions, verifies
    /// the peer against `bundle` (plus the local CA's own certificate), as
    /// does every certificate issued from now on. Connections already open
    /// are not touched here: a removal moves [`Self::trust_generation`] on,
    /// which the callers' connections check before carrying a new stream.
    /// Certificates in hand that no longer chain to the roots are renewed
    /// at once by the refresher, not at half-life.
    ///
    /// An empty bundle is refused (it would refuse every peer), and so is
    /// a root rustls cannot use; either way the roots in force stay.
    pub fn set_bundle(&self, mut bundle: TrustBundle) -> Result<TrustChange, IdentityError> {
        for p in &self.pinned {
            bundle.add(p.clone());
        }
        if bundle.roots().is_empty() {
            self.count_rejected_bundle();
            return Err(IdentityError::EmptyTrustBundle);
        }
        let _one_at_a_time = self.swapping.lock().unwrap_or_else(PoisonError::into_inner);
        let (added, removed) = {
            let was = read(&self.trust).clone();
            let (was, now) = (was.bundle.roots(), bundle.roots());
            (
                now.iter().filter(|r| !was.contains(r)).count(),
                was.iter().filter(|r| !now.contains(r)).count(),
            )
        };
        let roots = bundle.roots().len();
        if added == 0 && removed == 0 {
            // The same roots (in another order, or read again): nothing to do.
            return Ok(TrustChange {
                added,
                removed,
                roots,
                renewing: 0,
            });
        }
        let new = Arc::new(
            Trust::new(bundle, &self.trust_domain, &self.provider, &self.clock)
                .inspect_err(|_| self.count_rejected_bundle())?,
        );
        *write(&self.trust) = new.clone();
        if removed > 0 {
            let generation = self.trust_generation.fetch_add(1, Ordering::SeqCst) + 1;
            self.trust_changes.send_replace(generation);
        }
        self.bundle_reloads.fetch_add(1, Ordering::Relaxed);
        // The caches check the trust they were built from; dropping them
        // here only frees the memory sooner.
        write(&self.server_configs).clear();
        write(&self.client_configs).clear();
        let renewing = self.recheck_certificates(&new);
        Ok(TrustChange {
            added,
            removed,
            roots,
            renewing,
        })
    }

    /// Every identity's slot, taken out of the map's lock.
    fn slots(&self) -> Vec<(Identity, Arc<Slot>)> {
        read(&self.certs)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Flags every certificate in hand that does not chain to `trust` for
    /// renewal at once (its retry backoff reset), and clears the flag of
    /// those that do (a root removed, then put back). Returns how many are
    /// flagged.
    fn recheck_certificates(&self, trust: &Trust) -> usize {
        let slots = self.slots();
        let mut renewing = 0;
        for (id, slot) in slots {
            let Some(cert) = read(&slot.current).clone() else {
                continue;
            };
            match self.verify_with(trust, &id, cert.chain()) {
                Ok(()) => slot.untrusted.store(false, Ordering::Relaxed),
                Err(e) => {
                    tracing::warn!(identity = %id, error = %e,
                        "the certificate in hand does not verify against the trusted roots; renewing it now");
                    slot.untrusted.store(true, Ordering::Relaxed);
                    slot.retry
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .due = None;
                    renewing += 1;
                }
            }
        }
        renewing
    }

    /// Bumped each time a root stops being trusted: a connection
    /// authenticated before (the peer's chain checked against a root since
    /// removed) must not carry new streams once it has moved.
    pub fn trust_generation(&self) -> u64 {
        self.trust_generation.load(Ordering::SeqCst)
    }

    /// Changes each time [`Self::trust_generation`] moves on: a connection
    /// waits on it to check its peer again at once, not at its next stream.
    pub fn watch_trust(&self) -> tokio::sync::watch::Receiver<u64> {
        self.trust_changes.subscribe()
    }

    /// Counts an edit of the roots' files that was refused (it did not
    /// load, or [`Self::set_bundle`] refused it).
    pub fn count_rejected_bundle(&self) {
        self.bundle_rejections.fetch_add(1, Ordering::Relaxed);
    }

    /// Trust bundles put in force after the first, and edits of the roots'
    /// files refused (metrics).
    pub fn bundle_reload_counts(&self) -> (u64, u64) {
        (
            self.bundle_reloads.load(Ordering::Relaxed),
            self.bundle_rejections.load(Ordering::Relaxed),
        )
    }

    /// Certificates issued so far (metrics, tests).
    pub fn issued_count(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// Issuances and renewals that failed so far.
    pub fn issue_failure_count(&self) -> u64 {
        self.issue_failures.load(Ordering::Relaxed)
    }

    /// Each identity with a certificate in hand and when it expires, sorted.
    pub fn certificates(&self) -> Vec<(Identity, SystemTime)> {
        let mut out: Vec<(Identity, SystemTime)> = read(&self.certs)
            .iter()
            .filter_map(|(id, slot)| {
                read(&slot.current)
                    .as_ref()
                    .map(|c| (id.clone(), c.not_after()))
            })
            .collect();
        out.sort_by_key(|a| a.0.to_string());
        out
    }

    /// Every identity this manager holds a slot for (issued, being issued
    /// or failing) and the state of its certificate, sorted by identity: a
    /// certificate past its expiry that nothing renewed is `Unavailable`.
    pub fn certificate_states(&self) -> Vec<(Identity, CertState)> {
        let now = self.clock.now();
        let mut out: Vec<(Identity, CertState)> = read(&self.certs)
            .iter()
            .map(|(id, slot)| {
                let current = read(&slot.current).clone();
                let failed = slot
                    .retry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .reason
                    .clone();
                let state = match current {
                    Some(c) if now < c.not_after() => CertState::Available(c),
                    Some(_) if failed.is_empty() => CertState::Unavailable(
                        "the certificate expired and no renewal has been tried".to_owned(),
                    ),
                    _ if !failed.is_empty() => CertState::Unavailable(failed),
                    _ => CertState::Initializing,
                };
                (id.clone(), state)
            })
            .collect();
        out.sort_by_key(|a| a.0.to_string());
        out
    }

    /// With a remote source, the identities wanted whose certificate is not
    /// in hand and may still come (the first issuance under way, or the
    /// last one failed in a way that may pass: unreachable, slow,
    /// overloaded), with why: a proxy that takes over a node before these
    /// are in hand would refuse their pods' HBONE. Not one the source
    /// answered it would not issue, nor one its answer was wrong for.
    /// Empty with a local CA (it issues while asked).
    pub fn awaited(&self) -> Vec<(Identity, String)> {
        if !self.ca.remote() {
            return Vec::new();
        }
        let now = self.clock.now();
        let mut out: Vec<(Identity, String)> = read(&self.certs)
            .iter()
            .filter_map(|(id, slot)| {
                if read(&slot.current)
                    .as_ref()
                    .is_some_and(|c| now < c.not_after())
                {
                    return None;
                }
                let r = slot.retry.lock().unwrap_or_else(PoisonError::into_inner);
                match (r.reason.is_empty(), r.transient) {
                    (true, _) => Some((id.clone(), "being issued".to_owned())),
                    (false, true) => Some((id.clone(), r.reason.clone())),
                    (false, false) => None,
                }
            })
            .collect();
        out.sort_by_key(|a| a.0.to_string());
        out
    }

    /// [`crate::parse_spiffe`] in our trust domain.
    pub fn parse_spiffe(&self, id: &str) -> Result<Identity, IdentityError> {
        Ok(spiffe::parse_spiffe(id, &self.trust_domain)?)
    }

    fn check_domain(&self, id: &Identity) -> Result<(), IdentityError> {
        if id.trust_domain != self.trust_domain {
            return Err(IdentityError::ForeignIdentity {
                identity: id.clone(),
                trust_domain: self.trust_domain.clone(),
            });
        }
        Identity::from_spiffe_id(&id.to_string()).map_err(|e| IdentityError::Spiffe(e.into()))?;
        Ok(())
    }

    /// The identity's slot; an identity seen for the first time is
    /// checked (trust domain, names) before it gets one.
    fn slot(&self, id: &Identity) -> Result<Arc<Slot>, IdentityError> {
        if let Some(s) = read(&self.certs).get(id) {
            return Ok(s.clone());
        }
        self.check_domain(id)?;
        Ok(write(&self.certs).entry(id.clone()).or_default().clone())
    }

    /// The current certificate of `identity`, issued on first use and
    /// renewed once past its half-life. While a renewal runs on another
    /// thread, the old (still valid) certificate is returned at once; a
    /// first issuance waits for the single issuance in flight.
    pub fn fetch(&self, identity: &Identity) -> Result<Arc<WorkloadCert>, IdentityError> {
        let slot = self.slot(identity)?;
        let current = read(&slot.current).clone();
        let now = self.clock.now();
        match current {
            Some(c) if now < c.refresh_at() => Ok(c),
            Some(c) if now < c.not_after() => {
                let _guard = match slot.issuing.try_lock() {
                    Ok(g) => g,
                    Err(TryLockError::Poisoned(p)) => p.into_inner(),
                    Err(TryLockError::WouldBlock) => return Ok(c),
                };
                match self.renew_locked(&slot, identity) {
                    Ok(new) => Ok(new),
                    Err(e) => {
                        tracing::warn!(identity = %identity, error = %e,
                            "certificate renewal failed; keeping the current one");
                        Ok(c)
                    }
                }
            }
            _ => {
                let _guard = slot.issuing.lock().unwrap_or_else(PoisonError::into_inner);
                self.renew_locked(&slot, identity)
            }
        }
    }

    /// The certificate of `identity` in hand, never issuing: what the
    /// datapath uses with a remote source. Without a valid one the caller
    /// fails closed ([`IdentityError::NotIssued`]); the identity is then
    /// wanted, and the refresher gets its certificate.
    pub fn cached(&self, identity: &Identity) -> Result<Arc<WorkloadCert>, IdentityError> {
        let slot = self.slot(identity)?;
        let current = read(&slot.current).clone();
        match current {
            Some(c) if self.clock.now() < c.not_after() => Ok(c),
            _ => Err(IdentityError::NotIssued {
                identity: identity.clone(),
                reason: {
                    let r = slot.retry.lock().unwrap_or_else(PoisonError::into_inner);
                    if r.reason.is_empty() {
                        "not issued yet".to_owned()
                    } else {
                        r.reason.clone()
                    }
                },
            }),
        }
    }

    /// Gets `identity`'s certificate ahead of its first connection (a pod
    /// was added). With a local CA this is [`Self::fetch`]. With a remote
    /// source it waits at most `wait` (the caller is a control thread that
    /// must answer the agent in time): a slower or failing issuance goes on
    /// in the background and the refresher retries it, while the datapath
    /// fails closed for that identity.
    pub fn prefetch(
        self: &Arc<Self>,
        identity: &Identity,
        wait: Duration,
    ) -> Result<(), IdentityError> {
        if !self.ca.remote() {
            return self.fetch(identity).map(|_| ());
        }
        if self.cached(identity).is_ok() {
            return Ok(());
        }
        // The source failed moments ago: each pod added now would wait the
        // whole `wait` for it (one after another, on the thread that takes
        // the pods), so none does; the identity is wanted, and the
        // refresher gets it.
        let failing = self
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .filter(|(at, _)| {
                self.clock
                    .now()
                    .duration_since(*at)
                    .is_ok_and(|d| d < FAILING_FOR)
            });
        if let Some((_, why)) = failing {
            self.slot(identity)?;
            return Err(IdentityError::NotIssued {
                identity: identity.clone(),
                reason: format!(
                    "the certificate service failed moments ago ({why}); the refresher retries"
                ),
            });
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let (me, id) = (self.clone(), identity.clone());
        std::thread::Builder::new()
            .name("ringway-identity-fetch".into())
            .spawn(move || {
                let _ = tx.send(me.fetch(&id).map(|_| ()));
            })
            .map_err(|e| IdentityError::Issue {
                identity: identity.clone(),
                reason: format!("cannot start a fetch thread: {e}"),
            })?;
        match rx.recv_timeout(wait) {
            Ok(r) => r,
            Err(_) => Err(IdentityError::NotIssued {
                identity: identity.clone(),
                reason: format!(
                    "the certificate service has not answered within {wait:?}; still trying"
                ),
            }),
        }
    }

    /// [`Self::cached`] for a remote source, [`Self::fetch`] otherwise.
    fn for_datapath(&self, identity: &Identity) -> Result<Arc<WorkloadCert>, IdentityError> {
        if self.ca.remote() {
            self.cached(identity)
        } else {
            self.fetch(identity)
        }
    }

    /// Issues into `slot` unless another holder of the issuing lock just
    /// did. Caller holds `slot.issuing`.
    fn renew_locked(&self, slot: &Slot, id: &Identity) -> Result<Arc<WorkloadCert>, IdentityError> {
        if let Some(c) = read(&slot.current).as_ref() {
            if self.clock.now() < c.refresh_at() && !slot.untrusted.load(Ordering::Relaxed) {
                return Ok(c.clone());
            }
        }
        let trust = read(&self.trust).clone();
        let cert = match self.issue(id, &trust) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                self.issue_failures.fetch_add(1, Ordering::Relaxed);
                let mut r = slot.retry.lock().unwrap_or_else(PoisonError::into_inner);
                r.due = Some(self.clock.now() + r.backoff.next_delay());
                r.reason = e.to_string();
                r.transient =
                    matches!(&e, IdentityError::Source { source, .. } if self.ca.transient(source));
                if r.transient {
                    *self.failing.lock().unwrap_or_else(PoisonError::into_inner) =
                        Some((self.clock.now(), e.to_string()));
                }
                return Err(e);
            }
        };
        *slot.retry.lock().unwrap_or_else(PoisonError::into_inner) = Retry::default();
        slot.untrusted.store(false, Ordering::Relaxed);
        *self.failing.lock().unwrap_or_else(PoisonError::into_inner) = None;
        let old = write(&slot.current).replace(cert.clone());
        // The roots changed while this was issued and checked: check it
        // against those in force now (a swap's re-check may have seen the
        // certificate this one replaces).
        let now_trust = read(&self.trust).clone();
        if !Arc::ptr_eq(&trust, &now_trust)
            && self.verify_with(&now_trust, id, cert.chain()).is_err()
        {
            slot.untrusted.store(true, Ordering::Relaxed);
        }
        // Invalidate configs holding the old certificate.
        write(&self.server_configs).remove(id);
        write(&self.client_configs).retain(|(local, _), _| local != id);
        tracing::info!(
            identity = %id,
            serial = %cert.serial(),
            not_after = %fmt_time(cert.not_after()),
            rotated = old.is_some(),
            "issued workload certificate"
        );
        Ok(cert)
    }

    fn issue(&self, id: &Identity, trust: &Trust) -> Result<WorkloadCert, IdentityError> {
        let now = self.clock.now();
        if let Some(expires) = self.ca.expires().filter(|e| now >= *e) {
            return Err(IdentityError::CaExpired {
                identity: id.clone(),
                not_after: fmt_time(expires),
            });
        }
        let fail = |reason: String| IdentityError::Issue {
            identity: id.clone(),
            reason,
        };
        let not_before = now.checked_sub(self.backdate).unwrap_or(now);
        let mut not_after = now + self.lifetime;
        if let Some(expires) = self.ca.expires() {
            not_after = not_after.min(expires);
        }
        let (chain, key) = {
            let _permit = self.permits.acquire();
            self.ca
                .issue(id, not_before, not_after)
                .map_err(|source| IdentityError::Source {
                    identity: id.clone(),
                    source,
                })?
        };
        // Whatever the source, the leaf must carry exactly this identity.
        match peer_identity_from_certs(&chain) {
            Ok(got) if &got == id => {}
            Ok(got) => return Err(fail(format!("the certificate issued is for {got}"))),
            Err(e) => return Err(fail(format!("the certificate issued: {e}"))),
        }
        // And it must chain to our own trust bundle, valid now: peers check
        // it against theirs (the same roots), and a leaf they would refuse
        // (a service signing with a root not yet distributed) must not
        // replace one they accept.
        self.verify_with(trust, id, &chain).map_err(|e| {
            fail(format!(
                "the certificate issued does not verify against the trust bundle: {e}"
            ))
        })?;
        // The validity actually granted (a service may cap it).
        let (not_before, not_after) = x509_parser::parse_x509_certificate(&chain[0])
            .map(|(_, x)| {
                let t = |v: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(v.max(0) as u64);
                (
                    t(x.validity().not_before.timestamp()),
                    t(x.validity().not_after.timestamp()),
                )
            })
            .map_err(|e| fail(format!("reading the new certificate: {e}")))?;
        self.issued.fetch_add(1, Ordering::Relaxed);
        self.assemble(id, chain, key, now, not_before, not_after)
    }

    /// Loads a freshly issued chain and key into a [`WorkloadCert`].
    fn assemble(
        &self,
        id: &Identity,
        chain: Vec<CertificateDer<'static>>,
        key: rustls_pki_types::PrivatePkcs8KeyDer<'static>,
        now: SystemTime,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<WorkloadCert, IdentityError> {
        let fail = |reason: String| IdentityError::Issue {
            identity: id.clone(),
            reason,
        };
        let signing_key = self
            .provider
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(key))
            .map_err(|e| fail(format!("loading the new key: {e}")))?;
        let serial = x509_parser::parse_x509_certificate(&chain[0])
            .map(|(_, x)| x.raw_serial_as_string().replace(':', ""))
            .map_err(|e| fail(format!("reading the new certificate: {e}")))?;
        // Timestamps as written in the certificate (whole seconds).
        let secs = |t: SystemTime| {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            SystemTime::UNIX_EPOCH + Duration::from_secs(d.as_secs())
        };
        let not_after = secs(not_after);
        let refresh_at = now + not_after.duration_since(now).unwrap_or_default() / 2;
        let certified = CertifiedKey::new(chain, signing_key);
        // A faulty (or caching) service may answer with a valid leaf for
        // another key: every handshake with it would fail at the peer.
        match certified.keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(e) => {
                return Err(fail(format!(
                    "the certificate issued is not for the key this proxy generated: {e}"
                )))
            }
        }
        Ok(WorkloadCert::new(
            id.clone(),
            Arc::new(certified),
            serial,
            secs(not_before),
            not_after,
            refresh_at,
        ))
    }

    /// Renews every cached certificate past its half-life; returns how many
    /// were renewed. The refresher thread calls this; so may a timer.
    pub fn refresh_due(&self) -> usize {
        let slots = self.slots();
        let mut renewed = 0;
        for (id, slot) in slots {
            let now = self.clock.now();
            let due = match read(&slot.current).as_ref() {
                Some(c) => now >= c.refresh_at() || slot.untrusted.load(Ordering::Relaxed),
                // Wanted but not in hand (a remote source's first issuance
                // failed, or the datapath asked first).
                None => self.ca.remote(),
            };
            let backing_off = slot
                .retry
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .due
                .is_some_and(|next| now < next);
            if !due || backing_off {
                continue;
            }
            let Ok(_guard) = slot.issuing.try_lock() else {
                continue; // a fetch is renewing it
            };
            match self.renew_locked(&slot, &id) {
                Ok(_) => renewed += 1,
                Err(e) => tracing::warn!(identity = %id, error = %e, "certificate renewal failed"),
            }
        }
        renewed
    }

    /// Drops `identity`'s certificate and configs (its last pod left the
    /// node). Open connections keep theirs.
    pub fn forget(&self, identity: &Identity) {
        write(&self.certs).remove(identity);
        write(&self.server_configs).remove(identity);
        write(&self.client_configs).retain(|(local, _), _| local != identity);
    }

    /// Forgets ([`Self::forget`]) every identity `keep` refuses, and
    /// returns them: the refresher stops renewing a certificate no pod here
    /// needs any more (its pod gone, or given another identity).
    pub fn retain(&self, keep: impl Fn(&Identity) -> bool) -> Vec<Identity> {
        let gone: Vec<Identity> = read(&self.certs)
            .keys()
            .filter(|id| !keep(id))
            .cloned()
            .collect();
        for id in &gone {
            self.forget(id);
        }
        gone
    }

    /// With a remote source, makes sure `identity` has a slot: the
    /// refresher gets its certificate (and [`Self::awaited`] lists it until
    /// then). Nothing with a local CA, which issues at first use. An
    /// identity outside the trust domain is ignored (never issued).
    pub fn want(&self, identity: &Identity) {
        if self.ca.remote() {
            let _ = self.slot(identity);
        }
    }

    /// Starts a thread (`ringway-identity-refresh`) that calls
    /// [`Self::refresh_due`] every `interval`, so the datapath seldom
    /// issues. It stops when the returned handle is dropped or the manager
    /// is.
    pub fn spawn_refresher(self: &Arc<Self>, interval: Duration) -> std::io::Result<Refresher> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let weak: Weak<Self> = Arc::downgrade(self);
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ringway-identity-refresh".into())
            .spawn(move || loop {
                {
                    let (lock, cv) = &*stop2;
                    let stopped = lock.lock().unwrap_or_else(PoisonError::into_inner);
                    let (stopped, _) = cv
                        .wait_timeout_while(stopped, interval, |s| !*s)
                        .unwrap_or_else(PoisonError::into_inner);
                    if *stopped {
                        return;
                    }
                }
                let Some(manager) = weak.upgrade() else {
                    return;
                };
                manager.refresh_due();
            })?;
        Ok(Refresher {
            stop,
            thread: Some(thread),
        })
    }

    /// The HBONE server config of a pod whose identity is `local`: presents
    /// `local`'s certificate, requires a client certificate chaining to the
    /// bundle with a SPIFFE ID of our trust domain. Cached; rebuilt after
    /// rotation.
    pub fn server_config(&self, local: &Identity) -> Result<Arc<ServerConfig>, IdentityError> {
        let cert = self.for_datapath(local)?;
        let trust = read(&self.trust).clone();
        if let Some((c, t, cfg)) = read(&self.server_configs).get(local) {
            if Arc::ptr_eq(c, &cert) && Arc::ptr_eq(t, &trust) {
                return Ok(cfg.clone());
            }
        }
        let cfg = Arc::new(
            tls::server_config(&self.provider, trust.client_verifier.clone(), &cert).map_err(
                |source| IdentityError::Tls {
                    identity: local.clone(),
                    source: Box::new(source),
                },
            )?,
        );
        write(&self.server_configs).insert(local.clone(), (cert, trust, cfg.clone()));
        Ok(cfg)
    }

    /// The HBONE client config of a pod `local` dialing a workload whose
    /// identity must be exactly `expected_server`. Use
    /// [`crate::placeholder_server_name`] as the server name. Cached per
    /// pair; rebuilt after `local`'s rotation.
    pub fn client_config(
        &self,
        local: &Identity,
        expected_server: &Identity,
    ) -> Result<Arc<ClientConfig>, IdentityError> {
        let cert = self.for_datapath(local)?;
        let key = (local.clone(), expected_server.clone());
        let trust = read(&self.trust).clone();
        if let Some((c, t, cfg)) = read(&self.client_configs).get(&key) {
            if Arc::ptr_eq(c, &cert) && Arc::ptr_eq(t, &trust) {
                return Ok(cfg.clone());
            }
        }
        self.check_domain(expected_server)?;
        let verifier = Arc::new(SpiffeServerVerifier::new(
            trust.roots.clone(),
            expected_server.clone(),
            self.provider.clone(),
            self.clock.clone(),
        ));
        let cfg = Arc::new(tls::client_config(&self.provider, verifier, &cert).map_err(
            |source| IdentityError::Tls {
                identity: local.clone(),
                source: Box::new(source),
            },
        )?);
        write(&self.client_configs).insert(key, (cert, trust, cfg.clone()));
        Ok(cfg)
    }

    /// The verifier a server's certificate must pass for `expected`
    /// (for callers building their own `ClientConfig`).
    pub fn server_verifier(&self, expected: &Identity) -> SpiffeServerVerifier {
        SpiffeServerVerifier::new(
            read(&self.trust).roots.clone(),
            expected.clone(),
            self.provider.clone(),
            self.clock.clone(),
        )
    }

    /// The verifier a client's certificate must pass (for callers building
    /// their own `ServerConfig`).
    pub fn client_verifier(&self) -> Arc<SpiffeClientVerifier> {
        read(&self.trust).client_verifier.clone()
    }

    /// Whether `chain` is a valid certificate of `id` under `trust`'s
    /// roots, as a peer would check it.
    fn verify_with(
        &self,
        trust: &Trust,
        id: &Identity,
        chain: &[CertificateDer<'static>],
    ) -> Result<(), rustls::Error> {
        use rustls::client::danger::ServerCertVerifier;
        let Some((leaf, rest)) = chain.split_first() else {
            return Err(rustls::Error::NoCertificatesPresented);
        };
        SpiffeServerVerifier::new(
            trust.roots.clone(),
            id.clone(),
            self.provider.clone(),
            self.clock.clone(),
        )
        .verify_server_cert(
            leaf,
            rest,
            &tls::placeholder_server_name(),
            &[],
            rustls_pki_types::UnixTime::now(),
        )
        .map(|_| ())
    }
}

impl Trust {
    fn new(
        bundle: TrustBundle,
        trust_domain: &str,
        provider: &Arc<CryptoProvider>,
        clock: &Arc<dyn Clock>,
    ) -> Result<Trust, IdentityError> {
        let bad = |source| IdentityError::TrustBundle {
            source: Box::new(source),
        };
        let roots = Arc::new(bundle.root_store().map_err(bad)?);
        let client_verifier =
            SpiffeClientVerifier::new(roots.clone(), trust_domain, provider.clone(), clock.clone())
                .map_err(bad)?;
        Ok(Trust {
            bundle,
            roots,
            client_verifier: Arc::new(client_verifier),
        })
    }
}

/// The background refresher; stops (and joins) when dropped.
#[derive(Debug)]
pub struct Refresher {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Refresher {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 32-byte private scalar of a P-256 PKCS#8 key as ring writes it.
    fn scalar(pkcs8: &[u8]) -> &[u8] {
        let at = pkcs8
            .windows(5)
            .position(|w| w == [0x02, 0x01, 0x01, 0x04, 0x20])
            .expect("ECPrivateKey");
        &pkcs8[at + 5..at + 37]
    }

    #[test]
    fn debug_never_shows_the_private_key() {
        let td = "cluster.local";
        let ca = CaSigner::generate_for_tests_for_unit(td);
        let m = IdentityManager::new(ca, TrustBundle::new(), td, DEFAULT_CERT_LIFETIME).unwrap();
        let id = Identity::new(td, "shop", "web");
        let now = SystemTime::now();
        let (chain, key) =
            m.ca.issue(&id, now, now + Duration::from_secs(3600))
                .unwrap();
        let secret = scalar(key.secret_pkcs8_der()).to_vec();
        let cert = Arc::new(
            m.assemble(&id, chain, key, now, now, now + Duration::from_secs(3600))
                .unwrap(),
        );
        let server = tls::server_config(&m.provider, m.client_verifier(), &cert).unwrap();
        let client =
            tls::client_config(&m.provider, Arc::new(m.server_verifier(&id)), &cert).unwrap();
        let hex_lower: String = secret.iter().map(|b| format!("{b:02x}")).collect();
        let decimal = format!("{:?}", &secret[..8]);
        let decimal = &decimal[1..decimal.len() - 1];
        for (what, text) in [
            ("WorkloadCert", format!("{cert:?} {cert:#?}")),
            ("IdentityManager", format!("{m:?} {m:#?}")),
            ("ServerConfig", format!("{server:?}")),
            ("ClientConfig", format!("{client:?}")),
        ] {
            assert!(
                !text.to_lowercase().contains(&hex_lower),
                "{what} shows the key (hex)"
            );
            assert!(
                !text.contains(decimal),
                "{what} shows the key (bytes): {text}"
            );
            assert!(!text.contains("PRIVATE KEY"), "{what}: {text}");
        }
        assert!(format!("{cert:?}").contains("<redacted>"));
        assert!(format!("{m:?}").contains("<redacted>"));
    }

    /// The doubling, the cap, the jitter and the reset are
    /// `ringway_config::Backoff`'s (its tests); here, a failing issuance's
    /// figures, and a slot that starts with none failed.
    #[test]
    fn failed_issuances_retry_1s_doubling_to_32s_with_up_to_a_quarter_more() {
        let b = retry_backoff();
        assert_eq!(b.jitter(), Jitter::Up(0.25));
        let secs: Vec<u64> = (1..=8).map(|n| b.base_delay(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 32, 32, 32]);
        let fresh = Retry::default();
        assert_eq!(
            (fresh.backoff.failures(), fresh.due, fresh.reason.as_str()),
            (0, None, "")
        );
    }

    /// A source that always fails: as a certificate service that is down
    /// (`Down`, a failure that may pass), or one that refuses every
    /// identity (`Refusing`: it looked and said no, as for an identity not
    /// on the node).
    #[derive(Debug)]
    enum Failing {
        Down,
        Refusing,
    }
    use Failing::{Down, Refusing};

    impl CertSource for Failing {
        fn issue(&self, _: &Identity, _: SystemTime, _: SystemTime) -> Result<Issued, IssueError> {
            Err(IssueError::remote(match self {
                Down => std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "the certificate service is down",
                ),
                Refusing => std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    "no pod of the node has this identity",
                ),
            }))
        }

        fn expires(&self) -> Option<SystemTime> {
            None
        }

        fn remote(&self) -> bool {
            true
        }

        fn transient(&self, _: &IssueError) -> bool {
            matches!(self, Down)
        }
    }

    /// A source signing with whichever CA it holds now (a service that
    /// moved to a new root), and, when told, handing out a key other than
    /// the certificate's.
    #[derive(Debug)]
    struct TestSource {
        ca: Mutex<CaSigner>,
        mismatch: std::sync::atomic::AtomicBool,
    }

    impl TestSource {
        fn new(ca: CaSigner) -> Arc<TestSource> {
            Arc::new(TestSource {
                ca: Mutex::new(ca),
                mismatch: Default::default(),
            })
        }
    }

    impl CertSource for TestSource {
        fn issue(
            &self,
            id: &Identity,
            nb: SystemTime,
            na: SystemTime,
        ) -> Result<Issued, IssueError> {
            let ca = self.ca.lock().unwrap();
            let (chain, key) = ca.issue(id, nb, na).map_err(IssueError::Sign)?;
            if self.mismatch.load(Ordering::SeqCst) {
                let (_, other) = ca.issue(id, nb, na).map_err(IssueError::Sign)?;
                return Ok((chain, other));
            }
            Ok((chain, key))
        }

        fn expires(&self) -> Option<SystemTime> {
            Some(self.ca.lock().unwrap().not_after())
        }

        fn remote(&self) -> bool {
            false
        }
    }

    /// A certificate that is not for the key the proxy generated is refused
    /// by name, and the one in hand is kept: it would fail every handshake.
    #[test]
    fn adversarial_a_certificate_for_another_key_is_refused_and_the_one_in_hand_kept() {
        let td = "cluster.local";
        let ca = CaSigner::generate_for_tests_for_unit(td);
        let mut bundle = TrustBundle::new();
        bundle.add(ca.cert().clone());
        let clock = Arc::new(crate::clock::ManualClock::new(SystemTime::now()));
        let source = TestSource::new(ca);
        let m = IdentityManager::with_source(source.clone(), bundle, td, DEFAULT_CERT_LIFETIME)
            .unwrap()
            .with_clock(clock.clone());
        let id = Identity::new(td, "shop", "web");
        let first = m.fetch(&id).unwrap();
        source.mismatch.store(true, Ordering::SeqCst);
        // A new identity gets none.
        let other = Identity::new(td, "shop", "api");
        let e = m.fetch(&other).unwrap_err();
        assert!(
            e.to_string().contains(
                "spiffe://cluster.local/ns/shop/sa/api: the certificate issued is not for the key this proxy generated"
            ),
            "{e}"
        );
        // Past its half-life, the renewal is refused and the one in hand kept.
        clock.advance(DEFAULT_CERT_LIFETIME * 3 / 5);
        let failures = m.issue_failure_count();
        let now = m.fetch(&id).unwrap();
        assert!(
            Arc::ptr_eq(&first, &now),
            "the certificate in hand was replaced"
        );
        assert!(m.issue_failure_count() > failures);
        source.mismatch.store(false, Ordering::SeqCst);
        let renewed = m.fetch(&id).unwrap();
        assert!(
            !Arc::ptr_eq(&first, &renewed),
            "renewed once the source is fixed"
        );
    }

    /// Readiness waits for a certificate being issued, or whose issuance
    /// failed in a way that may pass (unreachable, slow); never for one the
    /// source refused, nor for one in hand.
    #[test]
    fn the_awaited_certificates_are_those_that_may_still_come() {
        let td = "cluster.local";
        let mut bundle = TrustBundle::new();
        bundle.add(CaSigner::generate_for_tests_for_unit(td).cert().clone());
        let id = Identity::new(td, "shop", "web");
        let down =
            IdentityManager::with_source(Arc::new(Down), bundle.clone(), td, DEFAULT_CERT_LIFETIME)
                .unwrap();
        assert!(down.awaited().is_empty(), "nothing wanted yet");
        down.slot(&id).unwrap();
        assert_eq!(down.awaited(), [(id.clone(), "being issued".to_owned())]);
        let e = down.fetch(&id).unwrap_err();
        assert_eq!(down.awaited(), [(id.clone(), e.to_string())]);
        let refusing =
            IdentityManager::with_source(Arc::new(Refusing), bundle, td, DEFAULT_CERT_LIFETIME)
                .unwrap();
        refusing.fetch(&id).unwrap_err();
        assert!(refusing.awaited().is_empty(), "a refusal is not waited for");
        // A local CA issues while asked: nothing is ever awaited.
        let ca = CaSigner::generate_for_tests_for_unit(td);
        let local =
            IdentityManager::new(ca, TrustBundle::new(), td, DEFAULT_CERT_LIFETIME).unwrap();
        local.fetch(&id).unwrap();
        assert!(local.awaited().is_empty());
    }

    /// A source that is down, counting the calls made to it.
    #[derive(Debug, Default)]
    struct CountingDown(AtomicU64);

    impl CertSource for CountingDown {
        fn issue(
            &self,
            i: &Identity,
            nb: SystemTime,
            na: SystemTime,
        ) -> Result<Issued, IssueError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Down.issue(i, nb, na)
        }

        fn expires(&self) -> Option<SystemTime> {
            None
        }

        fn remote(&self) -> bool {
            true
        }

        fn transient(&self, _: &IssueError) -> bool {
            true
        }
    }

    /// Once the service has failed in a way that may pass, a pod added moments
    /// later does not wait for it (each would hold the thread taking pods
    /// for the whole wait, one after another): no call, `NotIssued` naming
    /// the failure, and the identity wanted (the refresher gets it). After
    /// `FAILING_FOR`, a prefetch tries the service again.
    #[test]
    fn a_prefetch_does_not_wait_for_a_service_that_just_failed() {
        let td = "cluster.local";
        let start = SystemTime::now();
        let clock = Arc::new(crate::clock::ManualClock::new(start));
        let mut bundle = TrustBundle::new();
        bundle.add(CaSigner::generate_for_tests_for_unit(td).cert().clone());
        let source = Arc::new(CountingDown::default());
        let m = Arc::new(
            IdentityManager::with_source(source.clone(), bundle, td, DEFAULT_CERT_LIFETIME)
                .unwrap()
                .with_clock(clock.clone()),
        );
        let (a, b) = (
            Identity::new(td, "shop", "a"),
            Identity::new(td, "shop", "b"),
        );
        m.prefetch(&a, Duration::from_secs(2)).unwrap_err();
        assert_eq!(source.0.load(Ordering::SeqCst), 1);
        let e = m.prefetch(&b, Duration::from_secs(2)).unwrap_err();
        assert_eq!(
            source.0.load(Ordering::SeqCst),
            1,
            "the service was asked again"
        );
        assert!(
            e.to_string().contains(
                "no certificate for spiffe://cluster.local/ns/shop/sa/b yet: the certificate service failed moments ago (cannot issue a certificate for spiffe://cluster.local/ns/shop/sa/a: the certificate service is down); the refresher retries"
            ),
            "{e}"
        );
        assert!(m.awaited().iter().any(|(id, _)| *id == b), "b is wanted");
        clock.advance(FAILING_FOR + Duration::from_secs(1));
        m.prefetch(&b, Duration::from_secs(2)).unwrap_err();
        assert_eq!(
            source.0.load(Ordering::SeqCst),
            2,
            "asked again after a while"
        );
    }

    /// A failed issuance says whose certificate and why, keeps the source's
    /// error as its source, and is tried again after the first delay.
    #[test]
    fn a_failing_source_is_named_and_backed_off() {
        let td = "cluster.local";
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let clock = Arc::new(crate::clock::ManualClock::new(start));
        // The mesh's root: any will do, nothing is issued.
        let mut bundle = TrustBundle::new();
        bundle.add(CaSigner::generate_for_tests_for_unit(td).cert().clone());
        let m = IdentityManager::with_source(Arc::new(Down), bundle, td, DEFAULT_CERT_LIFETIME)
            .unwrap()
            .with_clock(clock.clone());
        let id = Identity::new(td, "shop", "web");
        let e = m.fetch(&id).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot issue a certificate for spiffe://cluster.local/ns/shop/sa/web: \
             the certificate service is down"
        );
        let IdentityError::Source { source, .. } = &e else {
            panic!("{e:?}");
        };
        assert!(matches!(source, IssueError::Remote(_)), "{source:?}");
        let slot = m.slot(&id).unwrap();
        let retry = slot.retry.lock().unwrap();
        assert_eq!(retry.backoff.failures(), 1);
        assert_eq!(retry.reason, e.to_string());
        let due = retry.due.unwrap().duration_since(start).unwrap();
        assert!(
            Duration::from_secs(1) <= due && due <= Duration::from_millis(1250),
            "{due:?}"
        );
    }

    /// A chain `ca` issues for `shop/<sa>`, valid for an hour.
    fn leaf(ca: &CaSigner, sa: &str) -> Vec<CertificateDer<'static>> {
        let now = SystemTime::now();
        let id = Identity::new("cluster.local", "shop", sa);
        ca.issue(&id, now, now + Duration::from_secs(3600))
            .unwrap()
            .0
    }

    fn bundle_of(cas: &[&CaSigner]) -> TrustBundle {
        let mut b = TrustBundle::new();
        for ca in cas {
            b.add(ca.cert().clone());
        }
        b
    }

    /// Whether `chain` passes what a handshake checks of a peer, as this
    /// manager's server (the client verifier of its server config) and as
    /// its client (the server verifier of a client config).
    fn peer_passes(
        m: &IdentityManager,
        chain: &[CertificateDer<'static>],
        id: &Identity,
    ) -> (bool, bool) {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::server::danger::ClientCertVerifier;
        let now = rustls_pki_types::UnixTime::now();
        let as_server = m
            .client_verifier()
            .verify_client_cert(&chain[0], &chain[1..], now)
            .is_ok();
        let as_client = m
            .server_verifier(id)
            .verify_server_cert(
                &chain[0],
                &chain[1..],
                &tls::placeholder_server_name(),
                &[],
                now,
            )
            .is_ok();
        (as_server, as_client)
    }

    /// A rotation's first step without a restart: a root added to the
    /// bundle is trusted by the handshakes that follow, both ways, and the
    /// cached configs are rebuilt from it; the local CA's own certificate
    /// stays trusted whatever the bundle says.
    #[test]
    fn a_new_bundle_is_what_peers_are_verified_against_from_then_on() {
        let td = "cluster.local";
        let (ours, theirs) = (
            CaSigner::generate_for_tests_for_unit(td),
            CaSigner::generate_for_tests_for_unit(td),
        );
        let (peer, local_peer) = (leaf(&theirs, "api"), leaf(&ours, "db"));
        let m = IdentityManager::new(ours, TrustBundle::new(), td, DEFAULT_CERT_LIFETIME).unwrap();
        let (web, api, db) = (
            Identity::new(td, "shop", "web"),
            Identity::new(td, "shop", "api"),
            Identity::new(td, "shop", "db"),
        );
        let (server, client) = (
            m.server_config(&web).unwrap(),
            m.client_config(&web, &api).unwrap(),
        );
        assert_eq!(peer_passes(&m, &peer, &api), (false, false));
        assert_eq!(m.bundle().roots().len(), 1);

        let change = m.set_bundle(bundle_of(&[&theirs])).unwrap();
        assert_eq!(
            change,
            TrustChange {
                added: 1,
                removed: 0,
                roots: 2,
                renewing: 0
            }
        );
        assert_eq!(peer_passes(&m, &peer, &api), (true, true));
        assert_eq!(
            peer_passes(&m, &local_peer, &db),
            (true, true),
            "the local CA stays trusted"
        );
        assert!(
            !Arc::ptr_eq(&server, &m.server_config(&web).unwrap()),
            "server config rebuilt"
        );
        assert!(
            !Arc::ptr_eq(&client, &m.client_config(&web, &api).unwrap()),
            "client config rebuilt"
        );
        let again = m.server_config(&web).unwrap();
        assert!(
            Arc::ptr_eq(&again, &m.server_config(&web).unwrap()),
            "and cached again"
        );

        // The rotation's last step: the other root removed again.
        let change = m.set_bundle(TrustBundle::new()).unwrap();
        assert_eq!((change.added, change.removed, change.roots), (0, 1, 1));
        assert_eq!(peer_passes(&m, &peer, &api), (false, false));
        assert_eq!(m.bundle_reload_counts(), (2, 0));
    }

    /// An edit that would trust nothing is refused, counted, and the
    /// roots in force stay: an empty bundle would refuse every peer.
    #[test]
    fn adversarial_an_empty_bundle_is_refused_and_the_roots_in_force_kept() {
        let td = "cluster.local";
        let ca = CaSigner::generate_for_tests_for_unit(td);
        let id = Identity::new(td, "shop", "api");
        let peer = leaf(&ca, "api");
        let bundle = bundle_of(&[&ca]);
        let m =
            IdentityManager::with_source(TestSource::new(ca), bundle, td, DEFAULT_CERT_LIFETIME)
                .unwrap();
        let e = m.set_bundle(TrustBundle::new()).unwrap_err();
        assert!(matches!(e, IdentityError::EmptyTrustBundle), "{e}");
        assert!(e.to_string().contains("no root certificate"), "{e}");
        assert_eq!(m.bundle().roots().len(), 1);
        assert_eq!(peer_passes(&m, &peer, &id), (true, true));
        assert_eq!(m.bundle_reload_counts(), (0, 1));
    }

    /// A root removed while a certificate in hand still chains to it: that
    /// certificate would be refused by every peer holding the new bundle,
    /// so it is renewed at once, not at half-life; one that chains to a
    /// root still trusted is left alone.
    #[test]
    fn a_removed_root_renews_the_certificates_chained_to_it_at_once() {
        let td = "cluster.local";
        let (old, new) = (
            CaSigner::generate_for_tests_for_unit(td),
            CaSigner::generate_for_tests_for_unit(td),
        );
        let bundle = bundle_of(&[&old, &new]);
        let new_only = bundle_of(&[&new]);
        let source = TestSource::new(old);
        let m = IdentityManager::with_source(source.clone(), bundle, td, DEFAULT_CERT_LIFETIME)
            .unwrap();
        let (web, api) = (
            Identity::new(td, "shop", "web"),
            Identity::new(td, "shop", "api"),
        );
        let first = m.fetch(&web).unwrap();
        // The service moves to the new root; `api` is issued under it.
        *source.ca.lock().unwrap() = new;
        let api_cert = m.fetch(&api).unwrap();
        assert_eq!(m.refresh_due(), 0, "nothing is due before the edit");

        let change = m.set_bundle(new_only).unwrap();
        assert_eq!((change.removed, change.renewing), (1, 1));
        assert_eq!(m.refresh_due(), 1, "web's certificate renewed at once");
        let renewed = m.cached(&web).unwrap();
        assert_ne!(renewed.chain()[0], first.chain()[0]);
        assert!(m
            .verify_with(&read(&m.trust), &web, renewed.chain())
            .is_ok());
        assert!(
            Arc::ptr_eq(&api_cert, &m.cached(&api).unwrap()),
            "api's is left alone"
        );
        assert_eq!(m.refresh_due(), 0, "and nothing is due after");
    }

    /// A root removed, then put back before the renewal it called for:
    /// the renewal is called off (the certificate in hand chains to the
    /// roots again). The generation moves on each removal only.
    #[test]
    fn a_root_put_back_calls_off_the_renewal_its_removal_asked_for() {
        let td = "cluster.local";
        let (old, new) = (
            CaSigner::generate_for_tests_for_unit(td),
            CaSigner::generate_for_tests_for_unit(td),
        );
        let (both, new_only) = (bundle_of(&[&old, &new]), bundle_of(&[&new]));
        let m = IdentityManager::with_source(
            TestSource::new(old),
            both.clone(),
            td,
            DEFAULT_CERT_LIFETIME,
        )
        .unwrap();
        let web = Identity::new(td, "shop", "web");
        let first = m.fetch(&web).unwrap();
        assert_eq!(m.trust_generation(), 0);
        assert_eq!(m.set_bundle(new_only).unwrap().renewing, 1);
        assert_eq!(m.trust_generation(), 1);
        let back = m.set_bundle(both.clone()).unwrap();
        assert_eq!((back.added, back.removed, back.renewing), (1, 0, 0));
        assert_eq!(m.trust_generation(), 1, "an addition does not move it");
        assert_eq!(m.refresh_due(), 0, "the renewal is called off");
        assert!(Arc::ptr_eq(&first, &m.cached(&web).unwrap()));
        // The same roots again: nothing changes, nothing is counted.
        assert_eq!(
            m.set_bundle(both).unwrap(),
            TrustChange {
                added: 0,
                removed: 0,
                roots: 2,
                renewing: 0
            }
        );
        assert_eq!(m.bundle_reload_counts(), (2, 0));
    }
}
