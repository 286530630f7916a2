//! What the control plane has sent, applied: [`MeshState`] is the client's
//! [`Handler`]. Each response is applied to the mesh snapshot incrementally
//! (only the resources it names are read and only their entries change,
//! [`ringway_config::MeshEdit`]) and the new snapshot is published once per
//! response. Nothing here is ever emptied because a stream dropped: the
//! versions held are what the next stream resumes from.
//!
//! Refusals, each NACKed naming the resource and the field:
//! - a workload or service that cannot be read (or one named twice in a
//!   response) is not taken. The copy held before, if any, stays in force
//!   (a control plane newer than this proxy must not take down what it
//!   served) when the refused version decodes and agrees with it on how its
//!   connections are authorized (identity, namespace, the policies naming
//!   it) and does not ask for its traffic to go another way (a waypoint, a
//!   network gateway, an application tunnel); otherwise the copy is
//!   dropped. With no copy in force, the addresses the refused version (and
//!   the dropped copy) claim resolve to nothing
//!   ([`ringway_config::Claimant::Refused`]): traffic to them is refused,
//!   never sent in plaintext as if they were outside the mesh, and an
//!   enrolled pod at one waits `proxy.workloadWait` and is refused;
//! - a policy is never dropped: what of it cannot be read is read toward
//!   deny ([`crate::convert`]), and a policy that cannot be decoded at all,
//!   or is named twice, denies everything it could have selected.
//!
//! The rest of the response is applied either way.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use ringway_config::Mesh;

use crate::client::{Event, Handler, Nack};
use crate::convert::{self, Entry};
use crate::proto::{security, workload, AnyError, DeltaDiscoveryResponse, TypedResource};
use crate::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

/// Why a resource could not be read; its message starts the NACK's line
/// for that resource.
#[derive(Debug, thiserror::Error)]
enum Unreadable {
    /// The resource has no `Any`.
    #[error("the resource carries no payload")]
    NoPayload,
    /// The `Any` is of another type or does not decode.
    #[error(transparent)]
    Any(#[from] AnyError),
    /// An address that decodes but cannot be taken (the field and why).
    #[error(transparent)]
    Refused(#[from] convert::Refused),
}

/// The message `r` carries.
fn decode<T: TypedResource>(r: &crate::Resource) -> Result<T, Unreadable> {
    let any = r.resource.as_ref().ok_or(Unreadable::NoPayload)?;
    Ok(T::from_any(any)?)
}

/// One of the two type URLs, as the `'static` metrics label.
fn static_url(type_url: &str) -> Option<&'static str> {
    [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL]
        .into_iter()
        .find(|u| *u == type_url)
}

/// What one held resource name stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Held {
    /// A workload, by uid (the resource's name).
    Workload,
    /// A service, by `namespace/hostname` (the resource's name).
    Service,
    /// A policy, by the name it is enforced under.
    Policy(String),
}

#[derive(Debug, Clone)]
struct HeldResource {
    /// The version to resume from; `None` when the resource was refused
    /// (the server must send it again).
    version: Option<String>,
    held: Held,
}

/// A resource refused, or read toward deny, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `address` or `authorization`.
    pub kind: &'static str,
    /// The resource's name.
    pub name: String,
    /// What could not be read, and what was done instead.
    pub why: String,
}

/// Labels of `istio_xds_connection_terminations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabels {
    /// Why the stream ended (`XdsError::reason`).
    pub reason: &'static str,
}

/// Labels of the per-type xDS metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    /// The type URL.
    pub url: &'static str,
}

/// Labels of `ringway_xds_resources` and `ringway_xds_refused_resources`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `workload`, `service` or `authorization`.
    pub kind: &'static str,
}

/// The xDS client's metrics and state, shared with the control endpoints
/// (readiness, metrics, `config_dump`).
#[derive(Debug, Default)]
pub struct XdsStatus {
    /// A stream is open.
    connected: AtomicBool,
    /// The first response of workloads/services was applied.
    first_addresses: AtomicBool,
    /// The first response of policies was applied.
    first_policies: AtomicBool,
    /// `ringway_xds_connected`.
    pub connected_gauge: Gauge,
    /// `istio_xds_connection_terminations_total{reason}`.
    pub terminations: Family<TerminationLabels, Counter>,
    /// `istio_xds_message_total{url}`: responses received.
    pub messages: Family<TypeLabels, Counter>,
    /// `ringway_xds_nacks_total{url}`: responses refused (in part).
    pub nacks: Family<TypeLabels, Counter>,
    /// `ringway_xds_resources{kind}`: resources held.
    pub resources: Family<KindLabels, Gauge>,
    /// `ringway_xds_refused_resources{kind}`: resources refused, or policies
    /// read toward deny, now.
    pub refused: Family<KindLabels, Gauge>,
    /// `ringway_xds_contested_addresses`: addresses two resources claim
    /// (they resolve to neither).
    pub contested_gauge: Gauge,
    problems: Mutex<Vec<Problem>>,
    contested: Mutex<Vec<(IpAddr, Vec<String>)>>,
}

impl XdsStatus {
    /// Whether a stream to the control plane is open.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    /// Whether the first response of each type has been applied (the proxy
    /// is ready only then).
    pub fn synced(&self) -> bool {
        self.first_addresses.load(Ordering::SeqCst) && self.first_policies.load(Ordering::SeqCst)
    }

    /// What is missing before [`XdsStatus::synced`], in words.
    pub fn waiting_for(&self) -> Vec<&'static str> {
        let mut w = Vec::new();
        if !self.first_addresses.load(Ordering::SeqCst) {
            w.push("workloads and services");
        }
        if !self.first_policies.load(Ordering::SeqCst) {
            w.push("authorization policies");
        }
        w
    }

    /// The resources refused, or read toward deny, now.
    pub fn problems(&self) -> Vec<Problem> {
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The addresses two resources claim now, with who claims them.
    pub fn contested(&self) -> Vec<(IpAddr, Vec<String>)> {
        self.contested
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Registers the metrics in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "ringway_xds_connected",
            "Whether a stream to the control plane (xDS) is open",
            self.connected_gauge.clone(),
        );
        r.register(
            "istio_xds_connection_terminations",
            "xDS streams that ended, by reason",
            self.terminations.clone(),
        );
        r.register(
            "istio_xds_message",
            "xDS responses received, by type URL",
            self.messages.clone(),
        );
        r.register(
            "ringway_xds_nacks",
            "xDS responses refused in part (NACKed), by type URL",
            self.nacks.clone(),
        );
        r.register(
            "ringway_xds_resources",
            "Resources held from the control plane, by kind",
            self.resources.clone(),
        );
        r.register(
            "ringway_xds_refused_resources",
            "Resources from the control plane refused (workloads, services) or read toward deny (policies), now, by kind",
            self.refused.clone(),
        );
        r.register(
            "ringway_xds_contested_addresses",
            "Addresses that two workloads or services from the control plane claim: they resolve to neither, so their traffic is refused",
            self.contested_gauge.clone(),
        );
    }
}

/// Where each new snapshot goes (the proxy's `set_mesh`).
pub type Publish = Box<dyn FnMut(Arc<Mesh>) + Send>;

/// The client's handler: the mesh as the control plane says it.
pub struct MeshState {
    /// The file's snapshot: settings, trust domain, CA, root namespace.
    base: Arc<Mesh>,
    /// The entries from the control plane (`base`'s settings).
    entries: Mesh,
    held: [HashMap<String, HeldResource>; 2],
    problems: BTreeMap<(&'static str, String), String>,
    /// Address resources refused with no copy in force, and the addresses
    /// they claim as [`ringway_config::Claimant::Refused`].
    refused_claims: HashMap<String, Vec<IpAddr>>,
    contested: BTreeSet<IpAddr>,
    status: Arc<XdsStatus>,
    publish: Publish,
}

impl std::fmt::Debug for MeshState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshState")
            .field("workloads", &self.entries.workload_count())
            .field("services", &self.entries.service_count())
            .field("policies", &self.entries.policy_count())
            .finish_non_exhaustive()
    }
}

const ADDRESSES: usize = 0;
const POLICIES: usize = 1;

impl MeshState {
    /// State on top of the file's snapshot `base` (its settings; the
    /// control plane brings every workload, service and policy), publishing
    /// to `publish`, counting into `status`.
    pub fn new(base: Arc<Mesh>, status: Arc<XdsStatus>, publish: Publish) -> Self {
        // The control plane brings every entry: none of the file's.
        let entries = base.without_entries();
        MeshState {
            base,
            entries,
            held: [HashMap::new(), HashMap::new()],
            problems: BTreeMap::new(),
            refused_claims: HashMap::new(),
            contested: BTreeSet::new(),
            status,
            publish,
        }
    }

    /// The shared status.
    pub fn status(&self) -> &Arc<XdsStatus> {
        &self.status
    }

    /// The snapshot now: the file's settings with the control plane's
    /// entries.
    pub fn mesh(&self) -> Mesh {
        self.base.with_entries_of(&self.entries)
    }

    /// Publishes the snapshot now (before the first response: the file's
    /// settings with no entries, not complete).
    pub fn publish(&mut self) {
        let mesh = Arc::new(self.mesh());
        (self.publish)(mesh);
    }

    /// A reloaded file: its settings apply from now on (its workloads,
    /// services and policies do not: the control plane's do).
    pub fn set_base(&mut self, base: Arc<Mesh>) {
        self.base = base;
        let mesh = Arc::new(self.mesh());
        (self.publish)(mesh);
    }

    fn forget(&mut self, ty: usize, name: &str, edit: &mut ringway_config::MeshEdit) {
        if let Some(old) = self.held[ty].remove(name) {
            match old.held {
                Held::Workload => {
                    edit.remove_workload(name);
                }
                Held::Service => {
                    edit.remove_service(name);
                }
                Held::Policy(p) => {
                    edit.remove_policy(&p);
                }
            }
        }
    }

    fn apply(&mut self, resp: &DeltaDiscoveryResponse) -> Result<(), Nack> {
        let (ty, kind) = match resp.type_url.as_str() {
            ADDRESS_TYPE_URL => (ADDRESSES, "address"),
            AUTHORIZATION_TYPE_URL => (POLICIES, "authorization"),
            other => {
                return Err(Nack::new(format!(
                    "type {other:?} is not one this proxy subscribed to"
                )))
            }
        };
        let root = self.base.root_namespace().to_owned();
        let mut edit = self.entries.edit();
        let mut nacks: Vec<String> = Vec::new();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for r in &resp.resources {
            *counts.entry(r.name.as_str()).or_default() += 1;
        }
        for name in &resp.removed_resources {
            self.forget(ty, name, &mut edit);
            if ty == ADDRESSES {
                self.set_refused_claims(name, Vec::new(), &mut edit);
            }
            self.problems.remove(&(kind, name.clone()));
        }
        for (name, n) in counts.iter().filter(|(_, n)| **n > 1) {
            let why = format!("named {n} times in one response: none of them applied");
            if ty == ADDRESSES {
                let decoded: Vec<Option<workload::Address>> = resp
                    .resources
                    .iter()
                    .filter(|r| r.name == **name)
                    .map(|r| decode::<workload::Address>(r).ok())
                    .collect();
                let unread = decoded.iter().any(Option::is_none);
                let copies: Vec<workload::Address> = decoded.into_iter().flatten().collect();
                let why = self.refuse_address(name, &copies, unread, why, &mut edit);
                nacks.push(format!("{name}: {why}"));
                self.problems.insert((kind, (*name).to_owned()), why);
                continue;
            }
            self.forget(ty, name, &mut edit);
            let p = convert::deny_everything(name, &root);
            let enforced = p.qualified_name().to_string();
            edit.upsert_policy(p);
            self.held[ty].insert(
                (*name).to_owned(),
                HeldResource {
                    version: None,
                    held: Held::Policy(enforced),
                },
            );
            nacks.push(format!("{name}: {why}"));
            self.problems.insert((kind, (*name).to_owned()), why);
        }
        for r in resp
            .resources
            .iter()
            .filter(|r| counts[r.name.as_str()] == 1)
        {
            let name = &r.name;
            let problem = match ty {
                ADDRESSES => self.apply_address(r, &mut edit),
                _ => self.apply_policy(r, &root, &mut edit),
            };
            match problem {
                Some(why) => {
                    nacks.push(format!("{name}: {why}"));
                    self.problems.insert((kind, name.clone()), why);
                }
                None => {
                    self.problems.remove(&(kind, name.clone()));
                }
            }
        }
        self.entries = edit.finish();
        self.check_contested(&resp.resources);
        self.report(ty);
        let mesh = Arc::new(self.mesh());
        (self.publish)(mesh);
        if nacks.is_empty() {
            Ok(())
        } else {
            let n = nacks.len();
            Err(Nack::new(format!(
                "{n} {kind} resource(s) refused or read toward deny: {}",
                nacks.join("; ")
            )))
        }
    }

    /// Applies one address resource; the problem when it was refused.
    fn apply_address(
        &mut self,
        r: &crate::Resource,
        edit: &mut ringway_config::MeshEdit,
    ) -> Option<String> {
        let name = &r.name;
        let (decoded, read) = match decode::<workload::Address>(r) {
            Ok(a) => {
                let read = convert::address(name, &a).map_err(Unreadable::from);
                (Some(a), read)
            }
            Err(e) => (None, Err(e)),
        };
        match read {
            Ok(entry) => {
                self.set_refused_claims(name, Vec::new(), edit);
                let held = match entry {
                    Entry::Workload(w, services) => {
                        if self.held[ADDRESSES]
                            .get(name)
                            .is_some_and(|h| h.held != Held::Workload)
                        {
                            self.forget(ADDRESSES, name, edit);
                        }
                        let before = self.entries.workload_by_uid(name);
                        warn_unsupported(
                            "workload",
                            name,
                            &w.unsupported,
                            before.and_then(|b| b.unsupported.as_ref()),
                        );
                        edit.upsert_workload(*w, services);
                        Held::Workload
                    }
                    Entry::Service(s) => {
                        if self.held[ADDRESSES]
                            .get(name)
                            .is_some_and(|h| h.held != Held::Service)
                        {
                            self.forget(ADDRESSES, name, edit);
                        }
                        let before = self.entries.service(name);
                        warn_unsupported(
                            "service",
                            name,
                            &s.unsupported,
                            before.and_then(|b| b.unsupported.as_ref()),
                        );
                        edit.upsert_service(s);
                        Held::Service
                    }
                };
                self.held[ADDRESSES].insert(
                    name.clone(),
                    HeldResource {
                        version: Some(r.version.clone()),
                        held,
                    },
                );
                None
            }
            Err(why) => Some(self.refuse_address(
                name,
                decoded.as_slice(),
                decoded.is_none(),
                why.to_string(),
                edit,
            )),
        }
    }

    /// Refuses the address resource `name` (`versions`: what of the refused
    /// version(s) could be decoded; `unread`: one could not be). The copy
    /// held stays in force only when every refused version could be read
    /// far enough to show that it agrees
    /// with the copy on how its connections are authorized (identity,
    /// namespace, the policies naming it) and does not send its traffic
    /// another way (a waypoint, a network gateway, an application tunnel);
    /// otherwise it is dropped. The addresses the refused version claims
    /// that no copy in force claims (all of them, and the dropped copy's,
    /// when none is in force; those claimed before, when nothing of it
    /// could be read) resolve to nothing. Returns the problem, in words.
    fn refuse_address(
        &mut self,
        name: &str,
        versions: &[workload::Address],
        unread: bool,
        why: String,
        edit: &mut ringway_config::MeshEdit,
    ) -> String {
        let mut refused: Vec<IpAddr> = Vec::new();
        let mut elsewhere = false;
        for v in versions {
            let (claims, other_way) = convert::refused_claims(v);
            refused.extend(claims);
            elsewhere |= other_way;
        }
        if unread {
            // Not all of it could be read: what it claimed before still
            // resolves to nothing.
            refused.extend(self.refused_claims.get(name).into_iter().flatten());
        }
        let held = self.held[ADDRESSES].get(name).cloned();
        let held_workload = self.entries.workload_by_uid(name);
        let in_force: Vec<IpAddr> = if let Some(w) = held_workload {
            if w.host_network {
                Vec::new()
            } else {
                w.ips.clone()
            }
        } else if let Some(svc) = self.entries.service(name) {
            svc.vips.clone()
        } else {
            Vec::new()
        };
        // What would change how its connections are authorized or carried
        // (a tunnel protocol this proxy does not know says nothing here).
        let authority_changed = held_workload.is_some_and(|w| {
            let held = convert::held_authority(w);
            versions.iter().any(|v| match &v.kind {
                Some(workload::address::Kind::Workload(new)) => {
                    convert::authority(new) != held
                        || convert::tunnel(new).is_some_and(|t| t != w.tunnel)
                }
                _ => true,
            })
        });
        let kept = held
            .as_ref()
            .filter(|_| !unread && !versions.is_empty() && !elsewhere && !authority_changed);
        if kept.is_some() {
            refused.retain(|ip| !in_force.contains(&ip.to_canonical()));
        } else {
            refused.extend(in_force);
            self.forget(ADDRESSES, name, edit);
        }
        let mut claims: Vec<IpAddr> = Vec::with_capacity(refused.len());
        for ip in refused.into_iter().map(|ip| ip.to_canonical()) {
            if !claims.contains(&ip) {
                claims.push(ip);
            }
        }
        let what = match (kept, held.is_some()) {
            (Some(h), _) => format!(
                "refused; the copy held (version {:?}) stays in force",
                h.version.as_deref().unwrap_or("")
            ),
            (None, true) if unread => {
                "refused, and the copy held dropped: the new version could not be read".to_owned()
            }
            (None, true) if elsewhere => "refused, and the copy held dropped: the refused version sends its traffic another way (a waypoint, a network gateway or an application tunnel)".to_owned(),
            (None, true) => "refused, and the copy held dropped: the refused version changes how its connections are authorized or carried (its identity, namespace, the policies naming it, or whether it is in the mesh's tunnel)".to_owned(),
            (None, false) => "refused".to_owned(),
        };
        let problem = if claims.is_empty() {
            format!("{why}: {what} until a readable version comes")
        } else {
            let listed: Vec<String> = claims.iter().map(ToString::to_string).collect();
            format!(
                "{why}: {what}; the address(es) it claims that nothing in force does ({}) resolve to nothing, their traffic refused, until a readable version comes",
                listed.join(", ")
            )
        };
        self.set_refused_claims(name, claims, edit);
        problem
    }

    /// Makes the refused resource `name` claim exactly `ips` (none: it is
    /// no longer refused).
    fn set_refused_claims(
        &mut self,
        name: &str,
        ips: Vec<IpAddr>,
        edit: &mut ringway_config::MeshEdit,
    ) {
        let before = self.refused_claims.remove(name).unwrap_or_default();
        if before.is_empty() && ips.is_empty() {
            return;
        }
        edit.set_refused(name, &before, &ips);
        if !ips.is_empty() {
            self.refused_claims.insert(name.to_owned(), ips);
        }
    }

    /// Applies one policy resource; the problem when part of it (or all)
    /// was read toward deny.
    fn apply_policy(
        &mut self,
        r: &crate::Resource,
        root: &str,
        edit: &mut ringway_config::MeshEdit,
    ) -> Option<String> {
        let name = &r.name;
        let decoded = decode::<security::Authorization>(r);
        let (policy, problem, version) = match decoded {
            Ok(a) => {
                let unknown = r
                    .resource
                    .as_ref()
                    .map(|any| crate::proto::wire::unknown_in_authorization(&any.value))
                    .unwrap_or_default();
                let read = convert::authorization_with(name, &a, &unknown, root);
                let problem = (!read.problems.is_empty())
                    .then(|| convert::describe_problems(name, &read.problems));
                (read.policy, problem, Some(r.version.clone()))
            }
            Err(why) => (
                convert::deny_everything(name, root),
                Some(format!(
                    "{why}: it denies every connection to what it could select until a readable version comes"
                )),
                None,
            ),
        };
        self.forget(POLICIES, name, edit);
        let enforced = policy.qualified_name().to_string();
        edit.upsert_policy(policy);
        self.held[POLICIES].insert(
            name.clone(),
            HeldResource {
                version,
                held: Held::Policy(enforced),
            },
        );
        problem
    }

    /// Addresses of the entries this response touched that two entries now
    /// claim (and whether those claimed before still are): logged when
    /// they appear, counted, listed for the admin endpoint.
    fn check_contested(&mut self, touched: &[crate::Resource]) {
        let mut look: BTreeSet<IpAddr> = std::mem::take(&mut self.contested);
        let before = look.clone();
        for r in touched {
            if let Some(ips) = self.refused_claims.get(&r.name) {
                look.extend(ips.iter().copied());
            }
            if let Some(w) = self.entries.workload_by_uid(&r.name) {
                look.extend(w.ips.iter().copied());
            } else if let Some(s) = self.entries.service(&r.name) {
                look.extend(s.vips.iter().copied());
            }
        }
        for ip in look {
            let who = self.entries.address_claimants(ip);
            if who.len() > 1 {
                if !before.contains(&ip) {
                    let names: Vec<String> = who.iter().map(|c| c.to_string()).collect();
                    tracing::warn!(address = %ip, claimants = ?names,
                        "two resources from the control plane claim one address: it resolves to neither until one lets it go");
                }
                self.contested.insert(ip);
            }
        }
    }

    fn report(&self, ty: usize) {
        let s = &self.status;
        match ty {
            ADDRESSES => s.first_addresses.store(true, Ordering::SeqCst),
            _ => s.first_policies.store(true, Ordering::SeqCst),
        }
        let e = &self.entries;
        for (kind, n) in [
            ("workload", e.workload_count()),
            ("service", e.service_count()),
            ("authorization", self.held[POLICIES].len()),
        ] {
            s.resources
                .get_or_create(&KindLabels { kind })
                .set(n as i64);
        }
        let mut refused: HashMap<&'static str, i64> = HashMap::new();
        let mut list = Vec::with_capacity(self.problems.len());
        for ((kind, name), why) in &self.problems {
            *refused.entry(*kind).or_default() += 1;
            list.push(Problem {
                kind,
                name: name.clone(),
                why: why.clone(),
            });
        }
        for kind in ["address", "authorization"] {
            s.refused
                .get_or_create(&KindLabels { kind })
                .set(refused.get(kind).copied().unwrap_or(0));
        }
        *s.problems.lock().unwrap_or_else(|p| p.into_inner()) = list;
        s.contested_gauge.set(self.contested.len() as i64);
        *s.contested.lock().unwrap_or_else(|p| p.into_inner()) = self
            .contested
            .iter()
            .map(|ip| {
                let who = self.entries.address_claimants(*ip);
                (*ip, who.iter().map(|c| c.to_string()).collect())
            })
            .collect();
    }
}

/// Logs once, when a workload or service starts to need what this proxy
/// does not support (each connection refused for it is logged and counted
/// by the datapath, `ringway_connections_refused_total{reason}`).
fn warn_unsupported(
    kind: &str,
    name: &str,
    now: &Option<ringway_config::Unsupported>,
    before: Option<&ringway_config::Unsupported>,
) {
    if let Some(u) = now {
        if before != Some(u) {
            tracing::warn!(resource = %name, reason = u.label(),
                "{kind} from the control plane: {u}: its traffic will be refused and counted");
        }
    }
}

impl Handler for MeshState {
    fn on_response(&mut self, resp: &DeltaDiscoveryResponse) -> Result<(), Nack> {
        let url = static_url(&resp.type_url);
        if let Some(url) = url {
            self.status
                .messages
                .get_or_create(&TypeLabels { url })
                .inc();
        }
        let out = self.apply(resp);
        if let (Err(_), Some(url)) = (&out, url) {
            self.status.nacks.get_or_create(&TypeLabels { url }).inc();
        }
        out
    }

    fn resource_versions(&self, type_url: &str) -> HashMap<String, String> {
        let ty = match type_url {
            ADDRESS_TYPE_URL => ADDRESSES,
            AUTHORIZATION_TYPE_URL => POLICIES,
            _ => return HashMap::new(),
        };
        // A name held without a version (a policy that stands in for one
        // that could not be read) or refused is listed with a version no
        // server gives (""): it is sent again if it still exists, and its
        // removal comes if it went while no stream was open (a server names
        // in `removed_resources` only what the client says it holds).
        let kind = if ty == ADDRESSES {
            "address"
        } else {
            "authorization"
        };
        let mut versions: HashMap<String, String> = self.held[ty]
            .iter()
            .map(|(n, r)| (n.clone(), r.version.clone().unwrap_or_default()))
            .collect();
        for (k, name) in self.problems.keys() {
            if *k == kind {
                versions.entry(name.clone()).or_default();
            }
        }
        versions
    }

    fn on_event(&mut self, event: Event) {
        let s = &self.status;
        match event {
            Event::Connected { .. } => {
                s.connected.store(true, Ordering::SeqCst);
                s.connected_gauge.set(1);
            }
            Event::Disconnected { error, .. } => {
                s.connected.store(false, Ordering::SeqCst);
                s.connected_gauge.set(0);
                s.terminations
                    .get_or_create(&TerminationLabels {
                        reason: error.reason(),
                    })
                    .inc();
            }
            _ => {}
        }
    }
}

/// A [`MeshState`] shared with the configuration's reload, which swaps the
/// file's settings under it ([`MeshState::set_base`]): the client's handler,
/// locking it for each call.
#[derive(Debug, Clone)]
pub struct SharedMeshState(pub Arc<Mutex<MeshState>>);

impl SharedMeshState {
    fn lock(&self) -> std::sync::MutexGuard<'_, MeshState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Handler for SharedMeshState {
    fn on_response(&mut self, response: &DeltaDiscoveryResponse) -> Result<(), Nack> {
        self.lock().on_response(response)
    }

    fn resource_versions(&self, type_url: &str) -> HashMap<String, String> {
        self.lock().resource_versions(type_url)
    }

    fn on_event(&mut self, event: Event) {
        self.lock().on_event(event)
    }
}

#[cfg(test)]
mod tests;
