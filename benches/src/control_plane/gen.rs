//! One mesh of a given size, generated twice: as the workload API's
//! resources (what the control plane serves over xDS) and as the
//! Kubernetes objects the API server would hold for it (what the
//! Kubernetes watch lists). Deterministic: the same [`Shape`] always gives
//! the same objects.
//!
//! The mesh: `namespaces()` namespaces `ns-<k>` (40 services each) enrolled
//! with `istio.io/dataplane-mode=ambient`; service `s` (`svc-<s>` in
//! `ns-<s mod namespaces>`, VIP `10.96.0.0 + s + 1`, ports 80 -> 8080 and
//! 443 -> 8443); workload `i` (`pod-<i>`, address `10.64.0.0 + i + 1`,
//! service account `sa-<s>`, on `node-<i mod 100>`) in service
//! `s = i mod services`, so each service has `workloads / services`
//! endpoints. Policies of the three scopes, each with two rules (a
//! principal and a port; a namespace prefix or an address block, and a port
//! excluded): 1% mesh-wide (in `istio-system`), 30% namespace-wide, the rest
//! selecting one service's workloads (over xDS: `WORKLOAD_SELECTOR`, named
//! in those workloads' `authorization_policies`; in Kubernetes: a
//! `selector` on their `app` label).

use std::net::Ipv4Addr;

use ringway_testbed::kube_api::fixtures;
use ringway_testbed::kube_api::{FakePod, Kind};
use ringway_xds::proto::security::{self, string_match::MatchType, StringMatch};
use ringway_xds::proto::workload::{self, address, NetworkAddress, Port, PortList};
use ringway_xds::proto::TypedResource;
use ringway_xds::Resource;
use serde_json::{json, Value};

/// The namespace whose policies apply mesh-wide.
pub const ROOT_NAMESPACE: &str = "istio-system";
/// The cluster the workloads' uids name.
pub const CLUSTER: &str = "Kubernetes";
/// Services per namespace.
const SERVICES_PER_NAMESPACE: usize = 40;
/// Nodes the workloads are spread over.
const NODES: usize = 100;
/// The ports of every service: service port -> target port.
pub const PORTS: [(u16, u16); 2] = [(80, 8080), (443, 8443)];

/// A policy's scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every workload of the mesh (`istio-system`).
    Global,
    /// Every workload of its namespace.
    Namespace,
    /// The workloads of one service (its index).
    Selector(usize),
}

/// How big the mesh is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    /// Workloads (pods).
    pub workloads: usize,
    /// Services (each with an EndpointSlice).
    pub services: usize,
    /// Authorization policies.
    pub policies: usize,
}

impl Shape {
    /// Namespaces: one per 40 services (at least one).
    pub fn namespaces(&self) -> usize {
        self.services.div_ceil(SERVICES_PER_NAMESPACE).max(1)
    }

    /// Policies per scope: `[global, namespace, selector]` (1%, 30%, the
    /// rest; at least one global policy when there are any).
    pub fn scopes(&self) -> [usize; 3] {
        let global = (self.policies / 100).max(1).min(self.policies);
        let namespace = (self.policies * 3 / 10).min(self.policies - global);
        [global, namespace, self.policies - global - namespace]
    }

    /// The service workload `i` is an endpoint of.
    pub fn service_of(&self, i: usize) -> usize {
        i % self.services.max(1)
    }

    /// The namespace of service `s`.
    pub fn service_namespace(&self, s: usize) -> String {
        format!("ns-{}", s % self.namespaces())
    }

    /// The namespace of workload `i` (its service's).
    pub fn workload_namespace(&self, i: usize) -> String {
        self.service_namespace(self.service_of(i))
    }

    /// Workload `i`'s address.
    pub fn workload_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 64, 0, 0)) + i as u32 + 1)
    }

    /// Service `s`'s VIP.
    pub fn service_vip(s: usize) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + s as u32 + 1)
    }

    /// Workload `i`'s uid over xDS (the control plane's
    /// `<cluster>//v1/Pod/<ns>/<name>`).
    pub fn workload_uid(&self, i: usize) -> String {
        format!("{CLUSTER}//v1/Pod/{}/pod-{i}", self.workload_namespace(i))
    }

    /// Pod `i`'s `metadata.uid` in Kubernetes (the workload's uid there).
    pub fn pod_uid(&self, i: usize) -> String {
        fixtures::uid(&self.workload_namespace(i), &format!("pod-{i}"))
    }

    /// Service `s`'s host name.
    pub fn service_hostname(&self, s: usize) -> String {
        format!("svc-{s}.{}.svc.cluster.local", self.service_namespace(s))
    }

    /// Service `s`'s key (`namespace/hostname`, its resource name).
    pub fn service_key(&self, s: usize) -> String {
        format!("{}/{}", self.service_namespace(s), self.service_hostname(s))
    }

    /// Policy `j`: namespace, name, scope.
    pub fn policy(&self, j: usize) -> (String, String, Scope) {
        let [global, namespace, _] = self.scopes();
        if j < global {
            (
                ROOT_NAMESPACE.to_owned(),
                format!("mesh-{j}"),
                Scope::Global,
            )
        } else if j < global + namespace {
            (
                format!("ns-{}", j % self.namespaces()),
                format!("ns-pol-{j}"),
                Scope::Namespace,
            )
        } else {
            let s = (j - global - namespace) % self.services.max(1);
            (
                self.service_namespace(s),
                format!("sel-{j}"),
                Scope::Selector(s),
            )
        }
    }

    /// Policy `j`'s resource name over xDS (`namespace/name`).
    pub fn policy_name(&self, j: usize) -> String {
        let (ns, name, _) = self.policy(j);
        format!("{ns}/{name}")
    }

    /// The selector policies (their xDS names) that select service `s`'s
    /// workloads.
    pub fn selector_policies_of(&self, s: usize) -> Vec<String> {
        let [global, namespace, selector] = self.scopes();
        let first = global + namespace;
        (first..first + selector)
            .filter(|j| (j - first) % self.services.max(1) == s)
            .map(|j| self.policy_name(j))
            .collect()
    }

    /// The workloads (indexes) of service `s`.
    pub fn endpoints_of(&self, s: usize) -> impl Iterator<Item = usize> {
        (s..self.workloads).step_by(self.services.max(1))
    }

    // ---- the workload API ----

    /// Workload `i` as an `Address` resource at `version`; `tunnel`: HBONE
    /// (enrolled), else NONE (opted out).
    pub fn xds_workload(&self, i: usize, tunnel: bool, version: u64) -> Resource {
        let s = self.service_of(i);
        let ns = self.workload_namespace(i);
        let ports = PortList {
            ports: PORTS
                .iter()
                .map(|(sp, tp)| Port {
                    service_port: u32::from(*sp),
                    target_port: u32::from(*tp),
                })
                .collect(),
        };
        let w = workload::Workload {
            uid: self.workload_uid(i),
            name: format!("pod-{i}"),
            namespace: ns,
            addresses: vec![Self::workload_ip(i).octets().to_vec()],
            tunnel_protocol: if tunnel {
                workload::TunnelProtocol::Hbone
            } else {
                workload::TunnelProtocol::None
            } as i32,
            trust_domain: "cluster.local".into(),
            service_account: format!("sa-{s}"),
            node: format!("node-{}", i % NODES),
            canonical_name: format!("svc-{s}"),
            canonical_revision: "v1".into(),
            workload_type: workload::WorkloadType::Deployment as i32,
            workload_name: format!("svc-{s}"),
            services: [(self.service_key(s), ports)].into_iter().collect(),
            authorization_policies: self.selector_policies_of(s),
            status: workload::WorkloadStatus::Healthy as i32,
            cluster_id: CLUSTER.into(),
            ..Default::default()
        };
        let a = workload::Address {
            kind: Some(address::Kind::Workload(w)),
        };
        Resource::new(self.workload_uid(i), version.to_string(), a.to_any())
    }

    /// Service `s` as an `Address` resource.
    pub fn xds_service(&self, s: usize) -> Resource {
        let svc = workload::Service {
            name: format!("svc-{s}"),
            namespace: self.service_namespace(s),
            hostname: self.service_hostname(s),
            addresses: vec![NetworkAddress {
                network: String::new(),
                address: Self::service_vip(s).octets().to_vec(),
            }],
            ports: PORTS
                .iter()
                .map(|(sp, tp)| Port {
                    service_port: u32::from(*sp),
                    target_port: u32::from(*tp),
                })
                .collect(),
            ..Default::default()
        };
        let a = workload::Address {
            kind: Some(address::Kind::Service(svc)),
        };
        Resource::new(self.service_key(s), "1", a.to_any())
    }

    /// Every workload (enrolled) and service, version 1.
    pub fn xds_addresses(&self) -> Vec<Resource> {
        (0..self.workloads)
            .map(|i| self.xds_workload(i, true, 1))
            .chain((0..self.services).map(|s| self.xds_service(s)))
            .collect()
    }

    /// Policy `j` as an `Authorization` resource at `version`; `variant`
    /// moves the port of its first rule (a policy change).
    pub fn xds_policy(&self, j: usize, variant: u32, version: u64) -> Resource {
        let (ns, name, scope) = self.policy(j);
        let exact = |v: String| StringMatch {
            match_type: Some(MatchType::Exact(v)),
        };
        let peer = j.wrapping_mul(7) % self.services.max(1);
        let a = security::Authorization {
            name: name.clone(),
            namespace: ns.clone(),
            scope: match scope {
                Scope::Global => security::Scope::Global,
                Scope::Namespace => security::Scope::Namespace,
                Scope::Selector(_) => security::Scope::WorkloadSelector,
            } as i32,
            action: if j.is_multiple_of(2) {
                security::Action::Allow
            } else {
                security::Action::Deny
            } as i32,
            rules: vec![
                security::Rule {
                    clauses: vec![
                        security::Clause {
                            matches: vec![security::Match {
                                principals: vec![exact(format!(
                                    "cluster.local/ns/{}/sa/sa-{peer}",
                                    self.service_namespace(peer)
                                ))],
                                ..Default::default()
                            }],
                        },
                        security::Clause {
                            matches: vec![security::Match {
                                destination_ports: vec![8080 + variant],
                                ..Default::default()
                            }],
                        },
                    ],
                },
                security::Rule {
                    clauses: vec![
                        security::Clause {
                            matches: vec![
                                security::Match {
                                    namespaces: vec![StringMatch {
                                        match_type: Some(MatchType::Prefix("ns-1".into())),
                                    }],
                                    ..Default::default()
                                },
                                security::Match {
                                    source_ips: vec![security::Address {
                                        address: vec![10, 64, 0, 0],
                                        length: 16,
                                    }],
                                    ..Default::default()
                                },
                            ],
                        },
                        security::Clause {
                            matches: vec![security::Match {
                                not_destination_ports: vec![9090],
                                ..Default::default()
                            }],
                        },
                    ],
                },
            ],
            dry_run: false,
        };
        Resource::new(format!("{ns}/{name}"), version.to_string(), a.to_any())
    }

    /// Every policy, version 1.
    pub fn xds_policies(&self) -> Vec<Resource> {
        (0..self.policies)
            .map(|j| self.xds_policy(j, 0, 1))
            .collect()
    }

    // ---- Kubernetes ----

    /// The namespaces: `istio-system` and the mesh's, enrolled.
    pub fn kube_namespaces(&self) -> Vec<Value> {
        std::iter::once(fixtures::namespace_with_labels(ROOT_NAMESPACE, &[]))
            .chain((0..self.namespaces()).map(|k| {
                fixtures::namespace_with_labels(
                    &format!("ns-{k}"),
                    &[(
                        ringway_config::enrollment::ISTIO_DATAPLANE_MODE_LABEL,
                        ringway_config::enrollment::ISTIO_DATAPLANE_MODE_AMBIENT,
                    )],
                )
            }))
            .collect()
    }

    /// Pod `i`, running; `opted_out`: labelled `istio.io/dataplane-mode=none`
    /// (not enrolled: the workload's `tunnel` is false).
    pub fn kube_pod(&self, i: usize, opted_out: bool) -> Value {
        let s = self.service_of(i);
        let ns = self.workload_namespace(i);
        let ip = Self::workload_ip(i).to_string();
        let mut pod = FakePod::new(
            &self.pod_uid(i),
            &ns,
            &format!("pod-{i}"),
            &format!("node-{}", i % NODES),
        )
        .label("app", &format!("svc-{s}"))
        .service_account(&format!("sa-{s}"))
        .created("2026-01-01T00:00:00Z")
        .container_ports(json!([
            {"name": "http", "containerPort": 8080},
            {"name": "https", "containerPort": 8443}
        ]))
        .running(&[&ip]);
        if opted_out {
            pod = pod.istio_mode(ringway_config::enrollment::ISTIO_DATAPLANE_MODE_NONE);
        }
        pod.json()
    }

    /// Service `s`.
    pub fn kube_service(&self, s: usize) -> Value {
        let ports: Vec<Value> = PORTS
            .iter()
            .zip(["http", "https"])
            .map(|((sp, tp), name)| {
                json!({"name": name, "port": sp, "targetPort": tp, "protocol": "TCP"})
            })
            .collect();
        fixtures::service(
            &self.service_namespace(s),
            &format!("svc-{s}"),
            &[&Self::service_vip(s).to_string()],
            json!(ports),
        )
    }

    /// Service `s`'s EndpointSlice: its workloads, ready.
    pub fn kube_slice(&self, s: usize) -> Value {
        let ns = self.service_namespace(s);
        let endpoints: Vec<Value> = self
            .endpoints_of(s)
            .map(|i| {
                fixtures::endpoint(
                    &ns,
                    &format!("pod-{i}"),
                    &Self::workload_ip(i).to_string(),
                    Some(true),
                )
            })
            .collect();
        fixtures::slice(
            &ns,
            &format!("svc-{s}-abcde"),
            &format!("svc-{s}"),
            "IPv4",
            json!(endpoints),
            json!([
                {"name": "http", "port": 8080, "protocol": "TCP"},
                {"name": "https", "port": 8443, "protocol": "TCP"}
            ]),
        )
    }

    /// Policy `j` as an AuthorizationPolicy; `variant` moves the port of its
    /// first rule (a policy change).
    pub fn kube_policy(&self, j: usize, variant: u32) -> Value {
        let (ns, name, scope) = self.policy(j);
        let peer = j.wrapping_mul(7) % self.services.max(1);
        let mut spec = json!({
            "action": if j.is_multiple_of(2) { "ALLOW" } else { "DENY" },
            "rules": [
                {"from": [{"source": {"principals": [format!(
                    "cluster.local/ns/{}/sa/sa-{peer}", self.service_namespace(peer))]}}],
                 "to": [{"operation": {"ports": [(8080 + variant).to_string()]}}]},
                {"from": [{"source": {"namespaces": ["ns-1*"]}},
                          {"source": {"ipBlocks": ["10.64.0.0/16"]}}],
                 "to": [{"operation": {"notPorts": ["9090"]}}]}
            ]
        });
        if let Scope::Selector(s) = scope {
            spec["selector"] = json!({"matchLabels": {"app": format!("svc-{s}")}});
        }
        json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("ap-{ns}-{name}")},
            "spec": spec
        })
    }

    /// Every Kubernetes object of the mesh, in the order to create them.
    pub fn kube_objects(&self) -> Vec<(Kind, Value)> {
        let mut v: Vec<(Kind, Value)> = self
            .kube_namespaces()
            .into_iter()
            .map(|n| (Kind::Namespace, n))
            .collect();
        v.extend((0..self.workloads).map(|i| (Kind::Pod, self.kube_pod(i, false))));
        for s in 0..self.services {
            v.push((Kind::Service, self.kube_service(s)));
            v.push((Kind::EndpointSlice, self.kube_slice(s)));
        }
        v.extend((0..self.policies).map(|j| (Kind::AuthorizationPolicy, self.kube_policy(j, 0))));
        v
    }
}
