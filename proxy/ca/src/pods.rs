//! The CA's view of the cluster's pods: a reflector cache filled by a watch
//! (so an impersonation check costs no API call), and an in-memory directory
//! for tests and single-node use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};

use crate::authz::{PodDirectory, PodView};

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
        live: meta.deletion_timestamp.is_none() && !matches!(phase, "Succeeded" | "Failed"),
    })
}

/// Pods from a kube-rs reflector (`list`+`watch` of every namespace's pods).
#[derive(Clone)]
pub struct WatchedPods {
    store: Store<Pod>,
    synced: Arc<AtomicBool>,
}

impl std::fmt::Debug for WatchedPods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedPods")
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl WatchedPods {
    /// Starts the watch on the current tokio runtime.
    pub fn start(client: kube::Client) -> WatchedPods {
        let (store, writer) = reflector::store();
        let synced = Arc::new(AtomicBool::new(false));
        let stream = watcher(kube::Api::<Pod>::all(client), watcher::Config::default())
            .modify(|p: &mut Pod| {
                // Only what the authorization reads.
                p.metadata.managed_fields = None;
                p.metadata.annotations = None;
                p.metadata.labels = None;
                if let Some(status) = p.status.as_mut() {
                    let phase = status.phase.take();
                    *status = Default::default();
                    status.phase = phase;
                }
            })
            .default_backoff()
            .reflect(writer);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    tracing::warn!(error = %e, "pod watch failed; retrying with backoff");
                }
            }
        });
        let s = store.clone();
        let flag = synced.clone();
        tokio::spawn(async move {
            if s.wait_until_ready().await.is_ok() {
                flag.store(true, Ordering::SeqCst);
                tracing::info!("pod cache synced");
            }
        });
        WatchedPods { store, synced }
    }
}

impl PodDirectory for WatchedPods {
    fn ready(&self) -> Result<(), String> {
        if self.synced.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("the pod cache has not listed the cluster's pods yet".into())
        }
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodView> {
        self.store
            .get(&ObjectRef::new(name).within(namespace))
            .and_then(|p| view(&p))
    }

    fn has_identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.store.state().iter().filter_map(|p| view(p)).any(|v| {
            v.holds_identity()
                && v.node == node
                && v.namespace == namespace
                && v.service_account == service_account
        })
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
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<PodView> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    fn has_identity_on_node(&self, node: &str, namespace: &str, service_account: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .any(|v| {
                v.holds_identity()
                    && v.node == node
                    && v.namespace == namespace
                    && v.service_account == service_account
            })
    }
}
