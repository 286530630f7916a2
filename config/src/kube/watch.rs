//! The watches: reflector caches of Pods, Services, EndpointSlices and
//! Namespaces, and a snapshot built from them (debounced) whenever they or
//! the configuration file change.
//!
//! Every namespace is watched (name and labels kept), not only the enrolled
//! ones: either of two labels enrolls a namespace, and two label-selected
//! watches cannot order an update that moves it from one label to the other
//! (see [`crate::enrollment`], "Watching the namespaces").

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::Fuse;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, Pod, PodSpec, PodStatus, Service as KubeService,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, store::Writer, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::istio::{AuthorizationPolicyObject, PeerAuthenticationObject, SecurityVersion};
use super::{build_mesh, Cluster, KubeOptions, Skipped};
use crate::control_thread::ControlThread;
use crate::{Backoff, Jitter, Mesh};

/// Why the Kubernetes source could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeError {
    /// Neither in-cluster config (service account token and CA,
    /// `KUBERNETES_SERVICE_*`) nor a kubeconfig was found or usable.
    #[error("no Kubernetes API config: {0}")]
    Config(#[source] kube::config::InferConfigError),
    /// The config was found but no client could be built from it.
    #[error("cannot build a Kubernetes API client: {0}")]
    Client(#[source] kube::Error),
    /// A [`KubeOptions`] value is unusable.
    #[error("Kubernetes mesh source: {0}")]
    Options(String),
    /// The control thread could not be started.
    #[error("spawning the ringway-kube thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// A client for the API server: in-cluster config when running in a pod
/// (the service account's token and CA), else the kubeconfig (`KUBECONFIG`,
/// `~/.kube/config`). Does not contact the server; call it inside the
/// runtime that will run the watch.
pub async fn connect() -> Result<Client, KubeError> {
    let config = kube::Config::infer().await.map_err(KubeError::Config)?;
    info!(api.url = %config.cluster_url, "Kubernetes API config");
    Client::try_from(config).map_err(KubeError::Client)
}

/// The Kubernetes mesh source on its own control thread (`ringway-kube`,
/// a current-thread tokio runtime): see [`run`]. Dropping it (or
/// [`MeshWatch::stop`]) stops the watches and waits for the thread.
#[derive(Debug)]
pub struct MeshWatch {
    // First, so that dropping stops the thread before anything else goes.
    thread: ControlThread<oneshot::Sender<()>>,
    file: watch::Sender<Arc<Mesh>>,
    current: Arc<Mutex<Option<Arc<Mesh>>>>,
}

impl MeshWatch {
    /// Runs [`run`] with `client` on `runtime`, on a new `ringway-kube`
    /// thread. `client` must have been made inside `runtime` (kube's client
    /// spawns its I/O on the runtime it is made in). `file` is the
    /// configuration file's snapshot; [`MeshWatch::set_file`] replaces it.
    /// `on_change` runs on that thread with every new snapshot; the first
    /// comes once every watch has listed its objects.
    pub fn start<C>(
        runtime: tokio::runtime::Runtime,
        client: Client,
        file: Arc<Mesh>,
        options: KubeOptions,
        on_change: C,
    ) -> Result<MeshWatch, KubeError>
    where
        C: Fn(Arc<Mesh>) + Send + 'static,
    {
        options.validate()?;
        let (file_tx, file_rx) = watch::channel(file);
        let current = Arc::new(Mutex::new(None));
        let (stop, stopped) = oneshot::channel::<()>();
        let latest = current.clone();
        let thread = ControlThread::spawn("ringway-kube", stop, move || {
            runtime.block_on(async move {
                let publish = move |mesh: Arc<Mesh>| {
                    *latest.lock().unwrap_or_else(PoisonError::into_inner) = Some(mesh.clone());
                    on_change(mesh);
                };
                tokio::select! {
                    result = run(client, file_rx, options, publish) => {
                        if let Err(e) = result {
                            error!(error = %e, "Kubernetes mesh source stopped");
                        }
                    }
                    // The sender is dropped: stop.
                    _ = stopped => {}
                }
            });
        })
        .map_err(KubeError::Spawn)?;
        Ok(MeshWatch {
            file: file_tx,
            current,
            thread,
        })
    }

    /// A new snapshot of the configuration file (its hot reload): the next
    /// snapshot merges it with the cluster's objects.
    pub fn set_file(&self, file: Arc<Mesh>) {
        self.file.send_replace(file);
    }

    /// The last snapshot published, `None` before the first.
    pub fn current(&self) -> Option<Arc<Mesh>> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the watches and waits for the thread (and a callback running).
    pub fn stop(mut self) {
        self.thread.stop();
    }
}

/// Watches Pods, Services, EndpointSlices and Namespaces (cluster-wide), and calls `on_change` with
/// [`build_mesh`] of the latest `file` and the cached objects: first once
/// every watch has listed its objects, then after changes, at most once per
/// [`KubeOptions::debounce`] and at most that long after the change, and
/// only when the snapshot differs from the last one. Objects left out are
/// logged at warn once each (while they stay left out). Watch errors are
/// logged and retried with backoff ([`KubeOptions::backoff_min`] doubling up
/// to [`KubeOptions::backoff_max`], jittered); the last snapshot stays in
/// force meanwhile. Runs until the future is dropped, or until `file`'s
/// sender is (`Ok`); fails only on invalid `options`.
pub async fn run<C>(
    client: Client,
    mut file: watch::Receiver<Arc<Mesh>>,
    options: KubeOptions,
    on_change: C,
) -> Result<(), KubeError>
where
    C: Fn(Arc<Mesh>),
{
    options.validate()?;
    let backoff = || watch_backoff(&options);
    let mut pods = Cache::new(
        "pods",
        watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
            .modify(slim_pod)
            .backoff(backoff()),
    );
    let mut namespaces = Cache::new(
        "namespaces",
        watcher(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
        )
        // Name and labels: the enrollment rule's.
        .modify(|ns: &mut Namespace| {
            slim_meta(&mut ns.metadata);
            ns.spec = None;
            ns.status = None;
        })
        .backoff(backoff()),
    );
    let mut services = Cache::new(
        "services",
        watcher(
            Api::<KubeService>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(|s: &mut KubeService| {
            slim_meta(&mut s.metadata);
            s.status = None;
        })
        .backoff(backoff()),
    );
    // Only the topology labels of nodes are kept (the region and zone of
    // the pods on them).
    let mut nodes = Cache::new(
        "nodes",
        watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .modify(|n: &mut Node| {
                let labels = n.metadata.labels.take().map(|l| {
                    l.into_iter()
                        .filter(|(k, _)| {
                            k == super::map::REGION_LABEL || k == super::map::ZONE_LABEL
                        })
                        .collect()
                });
                slim_meta(&mut n.metadata);
                n.metadata.labels = labels;
                n.spec = None;
                n.status = None;
            })
            .backoff(backoff()),
    );
    let mut slices = Cache::new(
        "endpointslices",
        watcher(
            Api::<EndpointSlice>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(|s: &mut EndpointSlice| slim_meta(&mut s.metadata))
        .backoff(backoff()),
    );
    let mut authz = Cache::new(
        "authorizationpolicies",
        istio_stream::<AuthorizationPolicyObject>(client.clone(), &options),
    );
    let mut peer_authn = Cache::new(
        "peerauthentications",
        istio_stream::<PeerAuthenticationObject>(client, &options),
    );
    info!(
        istio.root_namespace = %options.istio_root_namespace,
        "watching pods, services, endpointslices, nodes, namespaces, \
         authorizationpolicies and peerauthentications for the mesh"
    );

    let mut due: Option<Instant> = None;
    let mut publisher = Publisher::default();
    loop {
        let changed = tokio::select! {
            Some(event) = pods.stream.next() => pods.apply(event),
            Some(event) = namespaces.stream.next() => namespaces.apply(event),
            Some(event) = services.stream.next() => services.apply(event),
            Some(event) = slices.stream.next() => slices.apply(event),
            Some(event) = nodes.stream.next() => nodes.apply(event),
            Some(event) = authz.stream.next() => authz.apply(event),
            Some(event) = peer_authn.stream.next() => peer_authn.apply(event),
            changed = file.changed() => {
                if changed.is_err() {
                    debug!("the configuration's sender is gone: Kubernetes mesh source stopping");
                    return Ok(());
                }
                true
            }
            () = sleep_until(due) => {
                due = None;
                if pods.ready
                    && namespaces.ready
                    && services.ready
                    && slices.ready
                    && nodes.ready
                    && authz.ready
                    && peer_authn.ready
                {
                    let base = file.borrow_and_update().clone();
                    let cluster = Cluster {
                        pods: pods.store.state(),
                        namespaces: namespaces.store.state(),
                        services: services.store.state(),
                        endpoint_slices: slices.store.state(),
                        nodes: nodes.store.state(),
                        authorization_policies: authz.store.state(),
                        peer_authentications: peer_authn.store.state(),
                    };
                    if let Some(mesh) = publisher.rebuild(base, &cluster, &options) {
                        on_change(mesh);
                    }
                }
                false
            }
        };
        if changed && due.is_none() {
            due = Some(Instant::now() + options.debounce);
        }
    }
}

/// What was published last, to publish only what changed.
#[derive(Default)]
struct Publisher {
    /// (the file's snapshot, the snapshot published).
    last: Option<(Arc<Mesh>, Arc<Mesh>)>,
    /// The objects left out of it (each warned about once).
    reported: HashSet<Skipped>,
}

impl Publisher {
    /// The snapshot of `base` and `cluster`, unless it has the workloads and
    /// services of the last one and the same file.
    fn rebuild(
        &mut self,
        base: Arc<Mesh>,
        cluster: &Cluster,
        options: &KubeOptions,
    ) -> Option<Arc<Mesh>> {
        let built = build_mesh(&base, cluster, options);
        let fresh: HashSet<Skipped> = built.skipped.into_iter().collect();
        let mut new: Vec<&Skipped> = fresh.difference(&self.reported).collect();
        new.sort();
        for s in new {
            warn!(object = %s.object, reason = %s.reason, "Kubernetes object left out of the mesh");
        }
        self.reported = fresh;
        let mesh = built.mesh;
        let same = self.last.as_ref().is_some_and(|(f, m)| {
            Arc::ptr_eq(f, &base)
                && m.same_entries(&mesh)
                && m.cluster_policy_notes() == mesh.cluster_policy_notes()
        });
        if same {
            return None;
        }
        let mesh = Arc::new(mesh);
        let (workloads, services) = (mesh.workload_count(), mesh.service_count());
        let (policies, peer_authentications) =
            (mesh.policy_count(), mesh.peer_authentications().len());
        let left_out = self.reported.len();
        if self.last.is_none() {
            info!(
                workloads,
                services, policies, peer_authentications, left_out, "mesh from Kubernetes ready"
            );
        } else {
            debug!(
                workloads,
                services, policies, peer_authentications, left_out, "mesh from Kubernetes updated"
            );
        }
        self.last = Some((base, mesh.clone()));
        Some(mesh)
    }
}

/// One watched kind: the watcher's stream and the reflector cache it fills.
struct Cache<K, S>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    what: &'static str,
    /// Fused: kube's watcher streams never end, but a branch of the
    /// `select!` must not poll a finished one.
    stream: std::pin::Pin<Box<Fuse<S>>>,
    writer: Writer<K>,
    store: Store<K>,
    /// The first list is in.
    ready: bool,
    /// The last watch failed (logged once until it recovers).
    failing: bool,
}

impl<K, S> Cache<K, S>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    fn new(what: &'static str, stream: S) -> Self {
        let (store, writer) = reflector::store();
        Cache {
            what,
            stream: Box::pin(stream.fuse()),
            writer,
            store,
            ready: false,
            failing: false,
        }
    }

    /// Applies one event to the cache; whether the cache changed.
    fn apply(&mut self, event: Result<watcher::Event<K>, watcher::Error>) -> bool {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                if self.failing {
                    debug!(kind = self.what, error = %e, "Kubernetes watch still failing");
                } else {
                    warn!(kind = self.what, error = %e, "Kubernetes watch failed; retrying with backoff, the last snapshot stays in force");
                }
                self.failing = true;
                return false;
            }
        };
        if self.failing {
            info!(kind = self.what, "Kubernetes watch recovered");
            self.failing = false;
        }
        self.writer.apply_watcher_event(&event);
        match event {
            // Buffered by the writer until the list is complete.
            watcher::Event::Init | watcher::Event::InitApply(_) => false,
            watcher::Event::InitDone => {
                if !self.ready {
                    debug!(
                        kind = self.what,
                        objects = self.store.len(),
                        "Kubernetes list complete"
                    );
                }
                self.ready = true;
                true
            }
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => true,
        }
    }
}

/// Whether a watch error says the kind is not there for this client: not
/// served (404: the CRD is not installed, or not in this version) or not
/// allowed (403: the RBAC rules lack it).
fn not_served(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
            if status.code == 404 || status.code == 403 =>
        {
            Some(status.code)
        }
        _ => None,
    }
}

type EventStream<K> =
    std::pin::Pin<Box<dyn Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send>>;

/// The watch of a `security.istio.io` kind, of the version the API server
/// serves: `v1`, else `v1beta1`. When neither is served (404: the CRDs are
/// not installed, so no such policy can exist) before any list succeeded,
/// the kind counts as listed and empty, so that the mesh's snapshots never
/// wait for it. When the proxy may not list it (403: its RBAC role lacks
/// the kind), policies may exist that it cannot see: that never means "no
/// policies": the kind does not count as listed, so the first snapshot (the
/// proxy's readiness, its pods) waits for access, with an error each try.
/// After a list succeeded, the objects last listed stay either way. Both
/// versions are tried again after [`KubeOptions::backoff_max`].
fn istio_stream<K>(
    client: Client,
    options: &KubeOptions,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: kube::Resource<DynamicType = SecurityVersion, Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    struct State<K> {
        client: Client,
        version: SecurityVersion,
        inner: Option<EventStream<K>>,
        misses: u8,
        /// A list of the kind has completed once.
        listed: bool,
        pending: std::collections::VecDeque<watcher::Event<K>>,
        retry_at: Option<Instant>,
        backoff: Backoff,
        /// The wait before both versions are tried again.
        max: Duration,
    }
    let state = State {
        client,
        version: SecurityVersion::V1,
        inner: None,
        misses: 0,
        listed: false,
        pending: Default::default(),
        retry_at: None,
        backoff: watch_backoff(options),
        max: options.backoff_max,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(event) = st.pending.pop_front() {
                return Some((Ok(event), st));
            }
            if let Some(at) = st.retry_at.take() {
                tokio::time::sleep_until(at).await;
            }
            let version = st.version;
            let stream = st.inner.get_or_insert_with(|| {
                let api = Api::<K>::all_with(st.client.clone(), &version);
                Box::pin(
                    watcher(api, watcher::Config::default())
                        .modify(|o: &mut K| slim_meta(o.meta_mut()))
                        .backoff(st.backoff),
                )
            });
            match stream.next().await {
                None => st.inner = None,
                Some(Err(e)) => {
                    let Some(code) = not_served(&e) else {
                        return Some((Err(e), st));
                    };
                    st.inner = None;
                    st.misses += 1;
                    let kind = K::plural(&version).into_owned();
                    if st.misses < 2 {
                        debug!(
                            kind,
                            api.version = version.as_str(),
                            status = code,
                            "not served; trying the other version"
                        );
                        st.version = version.other();
                    } else if st.listed {
                        // Listed before: keep the last objects (the last
                        // snapshot stays in force, as for any failing watch).
                        warn!(
                            kind,
                            status = code,
                            "security.istio.io no longer served (or no longer allowed): \
                             keeping the cluster policies last listed; trying again later"
                        );
                        st.misses = 0;
                        st.version = SecurityVersion::V1;
                        st.retry_at = Some(Instant::now() + st.max);
                    } else if code == 403 {
                        // Policies may exist that this proxy may not see:
                        // never "no policies". Hold the first snapshot.
                        tracing::error!(
                            kind,
                            status = code,
                            "the proxy may not list security.istio.io {kind} (403: its RBAC \
                             role lacks the kind): cluster policies cannot be enforced unseen, \
                             so no snapshot is published (the proxy stays unready and takes no \
                             pods) until access is granted; trying again later"
                        );
                        st.misses = 0;
                        st.version = SecurityVersion::V1;
                        st.retry_at = Some(Instant::now() + st.max);
                    } else {
                        warn!(
                            kind,
                            status = code,
                            "security.istio.io is not served in v1 or v1beta1 (the CRDs are \
                             not installed): no cluster policies of this kind; trying again later"
                        );
                        st.misses = 0;
                        st.version = SecurityVersion::V1;
                        st.pending.push_back(watcher::Event::Init);
                        st.pending.push_back(watcher::Event::InitDone);
                        st.retry_at = Some(Instant::now() + st.max);
                    }
                }
                Some(Ok(event)) => {
                    // The watcher says `Init` before it lists: only what
                    // follows a list says the version is served.
                    if !matches!(event, watcher::Event::Init) {
                        st.misses = 0;
                    }
                    if matches!(event, watcher::Event::InitDone) {
                        st.listed = true;
                    }
                    return Some((Ok(event), st));
                }
            }
        }
    })
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Drops what the mapping never reads: the caches hold every pod of the
/// cluster.
fn slim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    meta.annotations = None;
    meta.owner_references = None;
    meta.finalizers = None;
}

/// Keeps of a pod what [`build_mesh`] reads: metadata (labels, uid,
/// timestamps), service account, node, host network, container ports,
/// phase and IPs.
fn slim_pod(pod: &mut Pod) {
    slim_meta(&mut pod.metadata);
    let ports_only = |c: Container| Container {
        name: c.name,
        ports: c.ports,
        restart_policy: c.restart_policy,
        ..Container::default()
    };
    if let Some(spec) = pod.spec.take() {
        let sidecars: Vec<Container> = spec
            .init_containers
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .map(ports_only)
            .collect();
        pod.spec = Some(PodSpec {
            containers: spec.containers.into_iter().map(ports_only).collect(),
            init_containers: (!sidecars.is_empty()).then_some(sidecars),
            host_network: spec.host_network,
            node_name: spec.node_name,
            service_account_name: spec.service_account_name,
            service_account: spec.service_account,
            ..PodSpec::default()
        });
    }
    if let Some(status) = pod.status.take() {
        pod.status = Some(PodStatus {
            phase: status.phase,
            pod_ip: status.pod_ip,
            pod_ips: status.pod_ips,
            ..PodStatus::default()
        });
    }
}

/// The watchers' backoff after an error: [`KubeOptions::backoff_min`]
/// doubling up to [`KubeOptions::backoff_max`], each delay cut by up to half
/// at random so that the proxies of every node do not relist at the same
/// instant after an API server outage; kube's watcher resets it on the next
/// success.
fn watch_backoff(options: &KubeOptions) -> Backoff {
    Backoff::new(options.backoff_min, options.backoff_max).with_jitter(Jitter::Down(0.5))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The doubling, the cap, the jitter and the reset are `Backoff`'s (its
    /// tests); the watches' figures are the options', cut by up to half.
    #[test]
    fn the_watch_backoff_is_the_options_jittered_down_to_half() {
        let options = KubeOptions::default();
        let b = watch_backoff(&options);
        assert_eq!(
            (b.min_delay(), b.max_delay(), b.jitter()),
            (
                Duration::from_millis(800),
                Duration::from_secs(30),
                Jitter::Down(0.5)
            )
        );
        let delays: Vec<u64> = (1..=8)
            .map(|n| b.base_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [800, 1600, 3200, 6400, 12_800, 25_600, 30_000, 30_000]
        );
    }

    #[test]
    fn slim_pod_keeps_what_the_mapping_reads() {
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"},
                "annotations": {"big": "x"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "node-a", "serviceAccountName": "sa", "hostNetwork": false,
                "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [{"name": "app", "image": "i", "env": [{"name": "E", "value": "1"}],
                    "ports": [{"name": "http", "containerPort": 8080}]}],
                "initContainers": [
                    {"name": "init", "image": "i"},
                    {"name": "sidecar", "image": "i", "restartPolicy": "Always",
                        "ports": [{"name": "admin", "containerPort": 9000}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        slim_pod(&mut pod);
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": "n", "uid": "u", "labels": {"a": "b"}},
                "spec": {"nodeName": "node-a", "serviceAccountName": "sa", "hostNetwork": false,
                    "containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}],
                    "initContainers": [{"name": "sidecar", "restartPolicy": "Always",
                        "ports": [{"name": "admin", "containerPort": 9000}]}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}]}
            })
        );
    }
}
