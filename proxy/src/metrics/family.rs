//! An `istio_tcp_*` counter family indexed by the pods on either side of
//! each series, so a removed pod's series can be dropped.

use std::collections::{HashMap, HashSet};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::labels::TcpLabels;

/// A pod as the labels spell it: (namespace, workload).
pub(super) type Owner = (String, String);

impl TcpLabels {
    /// The two pods of the series: source and destination.
    fn owners(&self) -> [Owner; 2] {
        [
            (
                self.source_workload_namespace.clone(),
                self.source_workload.clone(),
            ),
            (
                self.destination_workload_namespace.clone(),
                self.destination_workload.clone(),
            ),
        ]
    }
}

/// What every unnamed side is labelled: never an owner to forget.
const UNKNOWN: (&str, &str) = ("unknown", "unknown");

/// An `istio_tcp_*` family that indexes its series by the pods on either
/// side, so the series of a removed pod can be dropped
/// ([`Metrics::forget_workload`](super::Metrics::forget_workload)): with pod churn the exposition (and the
/// proxy's memory) would otherwise grow with every pod that ever ran here
/// or talked to a pod here.
#[derive(Debug, Default)]
pub struct TcpFamily {
    family: Family<TcpLabels, Counter>,
    owners: std::sync::Mutex<HashMap<Owner, HashSet<TcpLabels>>>,
}

impl TcpFamily {
    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, HashSet<TcpLabels>>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The counter of `labels`, created (and indexed under its pods) on
    /// first use. A series seen before costs a read lock, as a plain family.
    pub fn get_or_create(&self, labels: &TcpLabels) -> Counter {
        if let Some(c) = self.family.get(labels) {
            return c.clone();
        }
        let mut owners = self.index();
        let c = self.family.get_or_create_owned(labels);
        for o in labels.owners() {
            owners.entry(o).or_default().insert(labels.clone());
        }
        c
    }

    /// The family, for registration.
    pub fn family(&self) -> &Family<TcpLabels, Counter> {
        &self.family
    }

    /// Every series' labels and value.
    pub(super) fn samples(&self) -> Vec<(TcpLabels, u64)> {
        let owners = self.index();
        let mut all: HashSet<&TcpLabels> = HashSet::new();
        for set in owners.values() {
            all.extend(set.iter());
        }
        all.into_iter()
            .filter_map(|l| Some((l.clone(), self.family.get(l)?.get())))
            .collect()
    }

    /// Series in the family (every one is created through
    /// [`TcpFamily::get_or_create`], so the index holds them all).
    pub fn len(&self) -> usize {
        let owners = self.index();
        let mut all: HashSet<&TcpLabels> = HashSet::new();
        for set in owners.values() {
            all.extend(set.iter());
        }
        all.len()
    }

    /// Whether the family has no series.
    pub fn is_empty(&self) -> bool {
        self.index().is_empty()
    }

    /// Drops every series with `owner` on either side; returns how many.
    pub(super) fn forget(&self, owner: &Owner) -> usize {
        if (owner.0.as_str(), owner.1.as_str()) == UNKNOWN {
            return 0;
        }
        let mut owners = self.index();
        let Some(set) = owners.remove(owner) else {
            return 0;
        };
        for labels in &set {
            self.family.remove(labels);
            for other in labels.owners() {
                if let Some(s) = owners.get_mut(&other) {
                    s.remove(labels);
                    if s.is_empty() {
                        owners.remove(&other);
                    }
                }
            }
        }
        set.len()
    }
}
