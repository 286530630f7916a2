//! The CA's view of the cluster's pods: an index kept by a watch (so an
//! impersonation check costs neither an API call nor a scan of the
//! cluster's pods), and an in-memory directory for tests and single-node
//! use.
//!
//! [`WatchedPods`] lists and watches every namespace's pods and keeps two
//! indexes, updated by each event: pods by namespace/name, and the number of
//! live pods with a service account by (node, namespace, service account).
//! A check is one lookup under a read lock, whatever the cluster's size.
//!
//! A watch that fails is started again from a fresh list (with backoff);
//! the index in hand keeps answering meanwhile, for at most the configured
//! bound (`--pod-watch-stale-secs`): after that, [`PodDirectory::ready`]
//! says why, impersonation is refused and `/healthz/ready` fails, until a
//! list succeeds again. A cache the watch no longer feeds would go on
//! lending a deleted or moved pod's identity to its old node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use ringway_config::Backoff;

use crate::authz::{NotReady, PodDirectory, PodView};

/// A pod as the CA sees it.
pub fn view(pod: &Pod) -> Option<PodView> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref()?;
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    Some(PodView {
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        uid: meta.uid.clone().unwrap_or_default(),
        node: spec.node_name.clone().unwrap_or_default(),
        // No service account (a static or mirror pod): no identity, never
        // `default`'s.
        service_account: spec.service_account_name.clone().unwrap_or_default(),
        // A pod being deleted still runs through its grace period (a
        // preStop hook, a drain): its identity is still its own, and a node
        // proxy that restarts meanwhile must get it.
        live: !matches!(phase, "Succeeded" | "Failed"),
        terminating: meta.deletion_timestamp.is_some(),
    })
}

/// The pods known, by name, and the identities held on each node.
#[derive(Debug, Default)]
struct PodIndex {
    by_name: HashMap<(String, String), PodView>,
    /// `node/namespace/serviceAccount` (none of the three holds a `/`) ->
    /// how many pods there hold it ([`PodView::holds_identity`]).
    identities: HashMap<String, usize>,
}

fn identity_key(node: &str, namespace: &str, service_account: &str) -> String {
    format!("{node}/{namespace}/{service_account}")
}

impl PodIndex {
    fn key_of(v: &PodView) -> Option<String> {
        (v.holds_identity() && !v.node.is_empty())
            .then(|| identity_key(&v.node, &v.namespace, &v.service_account))
    }

    fn insert(&mut self, v: PodView) {
        if let Some(k) = Self::key_of(&v) {
            *self.identities.entry(k).or_default() += 1;
        }
        if let Some(old) = self
            .by_name
            .insert((v.namespace.clone(), v.name.clone()), v)
        {
            self.uncount(&old);
        }
    }

    /// Removes `namespace/name` when it is the pod `uid` (any pod of that
    /// name when `uid` is empty).
    fn remove(&mut self, namespace: &str, name: &str, uid: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        if self
            .by_name
            .get(&key)
            .is_some_and(|v| uid.is_empty() || v.uid == uid)
        {
            if let Some(old) = self.by_name.remove(&key) {
                self.uncount(&old);
            }
        }
    }

    /// The pod `namespace/name`: one entry looked up.
    fn pod(&self, namespace: &str, name: &str) -> Option<&PodView> {
        examine(1);
        self.by_name.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// Whether a pod holds `node/namespace/serviceAccount`: one entry
    /// looked up.
    fn holds(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        examine(1);
        self.identities
            .contains_key(&identity_key(node, namespace, service_account))
    }

    fn uncount(&mut self, v: &PodView) {
        let Some(k) = Self::key_of(v) else { return };
        if let Some(n) = self.identities.get_mut(&k) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.identities.remove(&k);
            }
        }
    }
}

/// The watch's health.
#[derive(Debug, Default)]
struct Health {
    /// A complete list has been indexed.
    listed: bool,
    /// Since when the watch has been failing, and its last error; `None`
    /// once a list succeeds again.
    failing: Option<(Instant, String)>,
}

struct Shared {
    index: RwLock<PodIndex>,
    health: Mutex<Health>,
    stale_after: Duration,
}

impl Shared {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, PodIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, PodIndex> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists and watches until the runtime stops; a failure starts over
    /// from a fresh list after a backoff.
    async fn run(self: Arc<Self>, api: kube::Api<Pod>) {
        let mut backoff = relist_backoff();
        loop {
            let mut stream = std::pin::pin!(watcher(api.clone(), watcher::Config::default()));
            // The list in progress: the index in hand keeps answering until
            // it is complete.
            let mut listing: Option<PodIndex> = None;
            let error = loop {
                let event = match stream.next().await {
                    Some(Ok(e)) => e,
                    Some(Err(e)) => break e.to_string(),
                    None => break "the pod watch ended".to_owned(),
                };
                match event {
                    watcher::Event::Init => listing = Some(PodIndex::default()),
                    watcher::Event::InitApply(p) => {
                        if let (Some(l), Some(v)) = (listing.as_mut(), view(&p)) {
                            l.insert(v);
                        }
                    }
                    watcher::Event::InitDone => {
                        let fresh = listing.take().unwrap_or_default();
                        let pods = fresh.by_name.len();
                        let old = std::mem::replace(&mut *self.write(), fresh);
                        drop(old);
                        let was_failing = {
                            let mut h = self.health();
                            h.listed = true;
                            h.failing.take()
                        };
                        backoff.reset();
                        match was_failing {
                            Some((since, _)) => tracing::info!(
                                ca.pods = pods,
                                ca.failed_for_s = since.elapsed().as_secs(),
                                "pod watch healthy again"
                            ),
                            None => tracing::info!(ca.pods = pods, "pod cache synced"),
                        }
                    }
                    watcher::Event::Apply(p) => {
                        if let Some(v) = view(&p) {
                            self.write().insert(v);
                        }
                    }
                    watcher::Event::Delete(p) => {
                        let m = &p.metadata;
                        if let (Some(ns), Some(name)) = (m.namespace.as_deref(), m.name.as_deref())
                        {
                            self.write()
                                .remove(ns, name, m.uid.as_deref().unwrap_or(""));
                        }
                    }
                }
            };
            let delay = backoff.next_delay();
            tracing::warn!(error = %error, ca.retry_in_ms = delay.as_millis() as u64, "pod watch failed; listing again after a backoff");
            self.health()
                .failing
                .get_or_insert_with(|| (Instant::now(), String::new()))
                .1 = error;
            tokio::time::sleep(delay).await;
        }
    }
}

/// The delays before the pod watch lists again after a failure: 500 ms
/// doubling to 30 s, not jittered (one certificate service per cluster);
/// reset once a list is complete.
fn relist_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
}

/// Pods from a watch of every namespace's pods (see the module docs).
#[derive(Clone)]
pub struct WatchedPods {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WatchedPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedPods")
            .field("health", &*self.shared.health())
            .field("stale_after", &self.shared.stale_after)
            .finish_non_exhaustive()
    }
}

impl WatchedPods {
    /// Starts the watch on the current tokio runtime. After `stale_after`
    /// of a failing watch (zero: at once), the directory stops answering
    /// until a list succeeds again.
    pub fn start(client: kube::Client, stale_after: Duration) -> WatchedPods {
        let shared = Arc::new(Shared {
            index: RwLock::new(PodIndex::default()),
            health: Mutex::new(Health::default()),
            stale_after,
        });
        tokio::spawn(shared.clone().run(kube::Api::<Pod>::all(client)));
        WatchedPods { shared }
    }

    /// Whether the watch is failing now (whether or not the bound has
    /// passed): since how long, and its last error.
    pub fn watch_failing(&self) -> Option<(Duration, String)> {
        self.shared
            .health()
            .failing
            .as_ref()
            .map(|(since, e)| (since.elapsed(), e.clone()))
    }

    /// Pods indexed now.
    pub fn len(&self) -> usize {
        self.shared.read().by_name.len()
    }

    /// Whether no pod is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
thread_local! {
    /// Pod entries this thread's lookups have examined: per thread, so that
    /// the unit tests running beside each other do not count each other's.
    static EXAMINED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts `n` pod entries examined by a lookup (the unit tests' measure of
/// a check's cost; nothing outside tests).
#[inline]
fn examine(n: u64) {
    #[cfg(test)]
    EXAMINED.with(|c| c.set(c.get() + n));
    #[cfg(not(test))]
    let _ = n;
}

/// Pod entries this thread's lookups have examined so far.
#[cfg(test)]
fn examined() -> u64 {
    EXAMINED.with(|n| n.get())
}

impl PodDirectory for WatchedPods {
    fn ready(&self) -> Result<(), NotReady> {
        let h = self.shared.health();
        let error = h.failing.as_ref().map(|(_, e)| e.clone());
        if !h.listed {
            return Err(NotReady::NotListed { error });
        }
        match &h.failing {
            Some((since, e)) if since.elapsed() >= self.shared.stale_after => {
                Err(NotReady::Stale {
                    failing_for: since.elapsed(),
                    allowed: self.shared.stale_after,
                    error: e.clone(),
                })
            }
            _ => Ok(()),
        }
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodView> {
        self.shared.read().pod(namespace, name).cloned()
    }

    fn has_identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        if service_account.is_empty() {
            return false;
        }
        self.shared.read().holds(node, namespace, service_account)
    }
}

/// A fixed set of pods (tests; single-node use without an API server).
#[derive(Debug, Default, Clone)]
pub struct StaticPods(Arc<Mutex<HashMap<(String, String), PodView>>>);

impl StaticPods {
    /// Adds or replaces a pod.
    pub fn put(&self, pod: PodView) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((pod.namespace.clone(), pod.name.clone()), pod);
    }

    /// Removes a pod.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(namespace.to_owned(), name.to_owned()));
    }
}

impl PodDirectory for StaticPods {
    fn ready(&self) -> Result<(), NotReady> {
        Ok(())
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodView> {
        examine(1);
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// A scan of every pod (a fixed set is small).
    fn has_identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|v| {
                examine(1);
                v.holds_identity()
                    && v.node == node
                    && v.namespace == namespace
                    && v.service_account == service_account
            })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ringway_testbed::kube_api::{FakeApiServer, FakePod, Kind};

    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    /// Waits (at most 20 s) for `cond`.
    fn until(what: &str, cond: impl FnMut() -> bool) {
        ringway_testbed::wait_for(what, Duration::from_secs(20), cond);
    }

    fn running(uid: &str, ns: &str, name: &str, node: &str, sa: &str) -> serde_json::Value {
        FakePod::new(uid, ns, name, node)
            .service_account(sa)
            .running(&[])
            .json()
    }

    fn watched(
        api_pods: &[serde_json::Value],
    ) -> (tokio::runtime::Runtime, FakeApiServer, WatchedPods) {
        let rt = runtime();
        let (client, api) = FakeApiServer::start(rt.handle());
        for p in api_pods {
            api.apply_pod(p.clone());
        }
        let pods = {
            let _g = rt.enter();
            WatchedPods::start(client, Duration::from_secs(60))
        };
        until("the pod watch listed", || pods.ready().is_ok());
        (rt, api, pods)
    }

    /// An impersonation check looks its answer up: it neither clones nor
    /// scans the cluster's pods (each check did, on the CA's two threads: a
    /// node proxy's burst of renewals in a large cluster kept them busy).
    /// The measure is the pod entries each lookup examines; the same checks
    /// against a store that scans ([`StaticPods`]) show it sees a scan.
    #[test]
    fn adversarial_impersonation_checks_do_not_scan_the_pod_store() {
        const PODS: usize = 5_000;
        let view = |i: usize| PodView {
            namespace: format!("ns-{}", i % 100),
            name: format!("p-{i}"),
            uid: format!("u-{i}"),
            node: format!("node-{}", i % 50),
            service_account: format!("sa-{}", i % 7),
            live: true,
            terminating: false,
        };
        let many: Vec<_> = (0..PODS)
            .map(|i| {
                let v = view(i);
                running(&v.uid, &v.namespace, &v.name, &v.node, &v.service_account)
            })
            .collect();
        let (_rt, _api, pods) = watched(&many);
        let scanning = StaticPods::default();
        (0..PODS).for_each(|i| scanning.put(view(i)));
        // 1,000 checks as a node proxy's renewals make them: pod i is
        // ns-(i%100) on node-(i%50) as sa-(i%7), so check i asks exactly for
        // pod i's identity. Returns how many pod entries they examined.
        let checks = |store: &dyn PodDirectory| {
            let before = examined();
            let mut hits = 0;
            for i in 0..1_000 {
                let v = view(i);
                if store.has_identity_on_node(&v.node, &v.namespace, &v.service_account) {
                    hits += 1;
                }
                assert!(store.pod(&v.namespace, &v.name).is_some());
            }
            assert_eq!(hits, 1_000);
            examined() - before
        };
        let indexed = checks(&pods);
        assert_eq!(
            indexed, 2_000,
            "2,000 lookups examined {indexed} pod entries (the store has {PODS} pods)"
        );
        // The measure sees a scan: each check's scan stops at a pod of the
        // identity (about 1 in 700 holds it), so hundreds of entries each.
        let scanned = checks(&scanning);
        println!("pod entries examined by 2,000 lookups: index {indexed}, scan {scanned}");
        assert!(
            scanned >= 100 * indexed,
            "the scanning store examined only {scanned} entries"
        );
    }

    /// The index is kept by the watch's events: a finished, deleted, moved or
    /// relisted-away pod stops counting (one being deleted still runs, and
    /// counts), a second pod with the same identity
    /// keeps it counted until it goes too, and a pod without a service
    /// account never counts.
    #[test]
    fn adversarial_the_pod_index_follows_the_watch() {
        let (_rt, api, pods) = watched(&[
            running("u-web", "shop", "web-1", "node-a", "web"),
            running("u-cart", "shop", "cart-1", "node-a", "cart"),
            running("u-api-1", "shop", "api-1", "node-a", "api"),
            running("u-api-2", "shop", "api-2", "node-a", "api"),
            FakePod::new("u-etcd", "kube-system", "etcd-node-a", "node-a")
                .running(&[])
                .json(),
        ]);
        let has = |node: &str, ns: &str, sa: &str| pods.has_identity_on_node(node, ns, sa);
        assert!(has("node-a", "shop", "web") && has("node-a", "shop", "cart"));
        assert!(!has("node-b", "shop", "web"));
        assert!(!has("node-a", "kube-system", "default") && !has("node-a", "kube-system", ""));
        assert_eq!(
            pods.pod("kube-system", "etcd-node-a")
                .unwrap()
                .service_account,
            ""
        );

        // Being deleted, still running its grace period: still counts.
        api.apply_pod(
            FakePod::new("u-web", "shop", "web-1", "node-a")
                .service_account("web")
                .running(&[])
                .terminating()
                .json(),
        );
        until("the deletion's start arrived", || {
            pods.pod("shop", "web-1")
                .is_some_and(|p| p.uid == "u-web" && p.live)
        });
        assert!(has("node-a", "shop", "web"), "a terminating pod's identity");

        // Finished.
        api.apply_pod(
            FakePod::new("u-web", "shop", "web-1", "node-a")
                .service_account("web")
                .running(&[])
                .phase("Succeeded")
                .json(),
        );
        until("a finished pod stops counting", || {
            !has("node-a", "shop", "web")
        });
        assert!(!pods.pod("shop", "web-1").unwrap().live);

        // Two pods with one identity: it counts until both are gone.
        api.delete_pod("shop", "api-1");
        until("the deletion arrived", || {
            pods.pod("shop", "api-1").is_none()
        });
        assert!(has("node-a", "shop", "api"));
        api.delete_pod("shop", "api-2");
        until("the last api pod's identity goes", || {
            !has("node-a", "shop", "api")
        });

        // Moved: the same name again, another UID, on node-b.
        api.apply_pod(running("u-cart-2", "shop", "cart-1", "node-b", "cart"));
        until("the moved pod counts on its new node", || {
            has("node-b", "shop", "cart")
        });
        assert!(!has("node-a", "shop", "cart"));

        // Deleted while the watch did not see it, then a relist (410 Gone).
        api.delete_unseen(Kind::Pod, "shop", "cart-1");
        api.apply_pod(running("u-new", "shop", "new-1", "node-c", "new"));
        until("the new pod arrived", || has("node-c", "shop", "new"));
        assert!(
            has("node-b", "shop", "cart"),
            "unseen: still counted until a relist"
        );
        api.expire(Kind::Pod);
        until("the relist forgets the pod deleted unseen", || {
            !has("node-b", "shop", "cart")
        });
        assert!(pods.pod("shop", "cart-1").is_none());
        assert!(has("node-c", "shop", "new"), "the relist keeps what exists");
        assert!(pods.ready().is_ok());
    }

    /// The doubling, the cap and the reset are `ringway_config::Backoff`'s
    /// (its tests); here, the pod watch's figures.
    #[test]
    fn the_pod_watch_relists_after_500ms_doubling_to_30s_without_jitter() {
        let b = relist_backoff();
        assert_eq!(b.jitter(), ringway_config::Jitter::None);
        let ms: Vec<u64> = (1..=8)
            .map(|n| b.base_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(ms, [500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]);
    }
}
