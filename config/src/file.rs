//! The configuration file as written: serde structs that refuse unknown
//! fields, parsed from YAML ([`MeshConfig::parse`]). The layers above apply
//! the environment's overrides to one (`env`) and validate it into a
//! [`Mesh`](crate::Mesh) snapshot (`validate`, `load`).
//!
//! Addresses, CIDR blocks, principals, actions and ports are kept as
//! written here (strings, wide integers) so that validation, not the YAML
//! parser, reports a bad one with its field path and a precise message.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::error::ConfigError;
use crate::settings::ProxySettings;

/// Default `trustDomain`.
pub const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";
/// Overrides `trustDomain`.
pub const ENV_TRUST_DOMAIN: &str = "RINGWAY_TRUST_DOMAIN";
/// Default `rootNamespace`: policies there apply to the whole mesh.
pub const DEFAULT_ROOT_NAMESPACE: &str = "ringway-system";
/// Overrides `rootNamespace`.
pub const ENV_ROOT_NAMESPACE: &str = "RINGWAY_ROOT_NAMESPACE";

/// The configuration used when no file is given (`config/default.yaml`).
pub const EMBEDDED_DEFAULT: &str = include_str!("../default.yaml");
/// How errors and the summary name [`EMBEDDED_DEFAULT`].
pub const EMBEDDED_ORIGIN: &str = "<embedded default.yaml>";

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MeshConfig {
    /// Datapath settings.
    pub proxy: ProxySettings,
    /// SPIFFE trust domain of this mesh's identities.
    pub trust_domain: String,
    /// Namespace whose policies (and policies with no namespace) apply to
    /// every workload.
    pub root_namespace: String,
    /// The CA that issues workload certificates; none = no identities.
    pub ca: Option<CaConfig>,
    /// The pods of the mesh.
    pub workloads: Vec<WorkloadConfig>,
    /// Services: virtual IPs in front of workloads.
    pub services: Vec<ServiceConfig>,
    /// Layer-4 authorization policies.
    pub policies: Vec<PolicyConfig>,
    /// The cluster this mesh runs in: the `source_cluster` and
    /// `destination_cluster` labels of the `istio_tcp_*` metrics (default
    /// `Kubernetes`, the reference's default cluster ID).
    pub cluster_id: String,
    /// This node's topology (its `topology.kubernetes.io/region` and `zone`
    /// labels): the `*_region`/`*_zone` metric labels of the pods this proxy
    /// serves. Empty: `unknown`.
    pub locality: LocalityConfig,
    /// Other trust domains that stand for this mesh's (a trust-domain
    /// migration): a cluster policy's principal in one of them, or in
    /// `cluster.local`, also matches the same identity in the others and in
    /// `trustDomain` (the reference's rule for its policy objects).
    pub trust_domain_aliases: Vec<String>,
    /// Mutual-TLS modes (never from the file: the Kubernetes source fills
    /// them from the cluster's `PeerAuthentication` objects).
    #[serde(skip)]
    pub peer_authentications: Vec<PeerAuthenticationConfig>,
}

/// Default `clusterId` (the reference's).
pub const DEFAULT_CLUSTER_ID: &str = "Kubernetes";
/// Overrides `clusterId`.
pub const ENV_CLUSTER_ID: &str = "RINGWAY_CLUSTER_ID";
/// Overrides `locality.region` (this node's region).
pub const ENV_NODE_REGION: &str = "RINGWAY_NODE_REGION";
/// Overrides `locality.zone` (this node's zone).
pub const ENV_NODE_ZONE: &str = "RINGWAY_NODE_ZONE";

/// A node's topology: its `topology.kubernetes.io/region` and
/// `topology.kubernetes.io/zone` labels (empty: not known).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityConfig {
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            proxy: ProxySettings::default(),
            trust_domain: DEFAULT_TRUST_DOMAIN.to_owned(),
            root_namespace: DEFAULT_ROOT_NAMESPACE.to_owned(),
            ca: None,
            workloads: Vec::new(),
            services: Vec::new(),
            policies: Vec::new(),
            cluster_id: DEFAULT_CLUSTER_ID.to_owned(),
            locality: LocalityConfig::default(),
            trust_domain_aliases: Vec::new(),
            peer_authentications: Vec::new(),
        }
    }
}

/// `ca`: where workload certificates come from. Either the CA's own files
/// (`certFile`, `keyFile`: the local-key mode, every node holds the root key)
/// or a certificate service (`address`, `rootCertFile`, `tokenFile`: the
/// root key stays in the CA's pods). Only paths: the key is never read by
/// this crate.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaConfig {
    /// The CA certificate (PEM), absolute path (local-key mode).
    #[serde(default)]
    pub cert_file: Option<String>,
    /// The CA private key (PEM), absolute path (local-key mode).
    #[serde(default)]
    pub key_file: Option<String>,
    /// Extra trusted roots (PEM), absolute paths.
    #[serde(default)]
    pub bundle_files: Vec<String>,
    /// The certificate service, `host:port` (service mode).
    #[serde(default)]
    pub address: Option<String>,
    /// The name the service's certificate must be valid for (default: the
    /// host of `address`).
    #[serde(default)]
    pub server_name: Option<String>,
    /// The mesh root (PEM) that the service's certificate and the issued
    /// certificates chain to (service mode), absolute path.
    #[serde(default)]
    pub root_cert_file: Option<String>,
    /// The proxy's service-account token for the service (service mode),
    /// absolute path; read again for every request (projected tokens rotate).
    #[serde(default)]
    pub token_file: Option<String>,
}

/// `workloads[]`: one pod.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadConfig {
    /// Unique id (the pod's UID).
    pub uid: String,
    /// Pod name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Service account (default `default`).
    #[serde(default = "default_service_account")]
    pub service_account: String,
    /// Pod IPs.
    pub ips: Vec<String>,
    /// Node the pod runs on.
    pub node: String,
    /// Whether the workload's node proxy speaks HBONE on port 15008.
    #[serde(default)]
    pub tunnel: bool,
    /// Whether the workload takes traffic sent to its services (default
    /// true; in a cluster, the EndpointSlice's `ready` condition).
    #[serde(default = "default_healthy")]
    pub healthy: bool,
    /// The pod's labels (Kubernetes syntax); the metrics' canonical service
    /// and revision come from them.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The workload the pod belongs to (its Deployment, StatefulSet, ...:
    /// the metrics' `*_workload`); the pod's name when not set.
    #[serde(default)]
    pub workload_name: Option<String>,
    /// The topology of the pod's node, when known (the Kubernetes source
    /// takes it from the Node's topology labels).
    #[serde(default)]
    pub locality: LocalityConfig,
}

fn default_healthy() -> bool {
    true
}

fn default_service_account() -> String {
    "default".to_owned()
}

/// `services[]`: a virtual IP in front of workloads.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceConfig {
    /// DNS name, e.g. `reviews.default.svc.cluster.local`.
    pub hostname: String,
    /// Namespace.
    pub namespace: String,
    /// Virtual IPs (none for a headless service).
    #[serde(default)]
    pub vips: Vec<String>,
    /// `servicePort: targetPort`.
    #[serde(default)]
    pub ports: PortMapConfig,
    /// Uids of the workloads behind the service.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// How a connection picks among the endpoints (default: any healthy
    /// one).
    #[serde(default)]
    pub load_balancing: Option<LoadBalancingConfig>,
}

/// `services[].loadBalancing`: which endpoints a connection may go to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancingConfig {
    /// What an endpoint should share with the client, in order:
    /// `region`, `zone`, `subzone`, `node`, `cluster`, `network`.
    #[serde(default)]
    pub routing_preference: Vec<String>,
    /// `strict` (only endpoints sharing every scope), `failover` (the
    /// closest ones first; the default) or `passthrough` (no endpoint
    /// picked: to the address dialled).
    #[serde(default)]
    pub mode: Option<String>,
    /// `onlyHealthy` (the default) or `allowAll` (endpoints that are not
    /// ready too).
    #[serde(default)]
    pub health_policy: Option<String>,
}

/// A YAML map of service port to target port, kept in file order; a port
/// listed twice is a parse error (plain maps silently keep the last).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortMapConfig(pub Vec<(i64, i64)>);

impl<'de> Deserialize<'de> for PortMapConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PortMapVisitor;
        impl<'de> Visitor<'de> for PortMapVisitor {
            type Value = PortMapConfig;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of service port to target port")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries: Vec<(i64, i64)> = Vec::new();
                while let Some((port, target)) = map.next_entry::<i64, i64>()? {
                    if entries.iter().any(|(p, _)| *p == port) {
                        return Err(serde::de::Error::custom(format!(
                            "service port {port} is listed twice"
                        )));
                    }
                    entries.push((port, target));
                }
                Ok(PortMapConfig(entries))
            }
        }
        d.deserialize_map(PortMapVisitor)
    }
}

/// `policies[]`: an authorization policy.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyConfig {
    /// Name, unique within its namespace.
    pub name: String,
    /// Scope: empty or the root namespace = every workload, else the
    /// workloads of this namespace.
    #[serde(default)]
    pub namespace: String,
    /// Restricts the policy to some workloads of its scope.
    #[serde(default)]
    pub selector: Option<SelectorConfig>,
    /// `ALLOW` or `DENY` (any case).
    pub action: String,
    /// The rules; none = the policy matches nothing.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// The Kubernetes object a cluster policy was mapped from (`None` for
    /// the file's own). A cluster policy's `name` is `istio/<ns>/<name>`,
    /// which no file policy can have, and is its qualified name.
    #[serde(skip)]
    pub origin: Option<String>,
}

/// `policies[].selector`: the workloads of the policy's scope it applies
/// to; every field given must match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SelectorConfig {
    /// Workload (pod) names the policy applies to.
    pub workloads: Vec<String>,
    /// Pod labels a workload must all have.
    pub match_labels: BTreeMap<String, String>,
}

/// `peerAuthentications[]` (from the cluster only): the mutual-TLS mode of
/// the workloads in its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAuthenticationConfig {
    /// `istio/<ns>/<name>`.
    pub name: String,
    /// The object's namespace.
    pub namespace: String,
    /// Whether it is in the root namespace (without a selector: mesh-wide).
    pub mesh_wide: bool,
    /// Pod labels the selected workloads have; `None` = the whole scope.
    pub match_labels: Option<BTreeMap<String, String>>,
    /// `UNSET` (inherit), `PERMISSIVE` or `STRICT`.
    pub mode: String,
    /// Target port -> mode.
    pub port_modes: Vec<(i64, String)>,
    /// The Kubernetes object it was mapped from.
    pub origin: String,
}

/// `policies[].rules[]`: matches when `from` and `to` both match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuleConfig {
    /// Any of these sources; none = any source.
    pub from: Vec<SourceConfig>,
    /// Any of these destinations; none = any port.
    pub to: Vec<OperationConfig>,
    /// Conditions, all of which must match.
    pub when: Vec<ConditionConfig>,
}

/// `policies[].rules[].when[]`: an L4 attribute and the values it may
/// (`values`, any of) and may not (`notValues`, none of) have.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConditionConfig {
    /// `source.ip`, `source.namespace`, `source.principal`,
    /// `destination.ip` or `destination.port`.
    pub key: String,
    /// Any of these.
    pub values: Vec<String>,
    /// None of these.
    pub not_values: Vec<String>,
}

/// `policies[].rules[].from[]`: matches when every field given matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SourceConfig {
    /// Source namespaces (from the peer's identity), globs allowed.
    pub namespaces: Vec<String>,
    /// Negation of `namespaces`.
    pub not_namespaces: Vec<String>,
    /// SPIFFE IDs, globs allowed.
    pub principals: Vec<String>,
    /// Negation of `principals`.
    pub not_principals: Vec<String>,
    /// `namespace/serviceAccount` pairs.
    pub service_accounts: Vec<String>,
    /// Negation of `serviceAccounts`.
    pub not_service_accounts: Vec<String>,
    /// Source address blocks.
    pub ip_blocks: Vec<String>,
    /// Negation of `ipBlocks`.
    pub not_ip_blocks: Vec<String>,
}

/// `policies[].rules[].to[]`: matches when every field given matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OperationConfig {
    /// Destination ports.
    pub ports: Vec<i64>,
    /// Negation of `ports`.
    pub not_ports: Vec<i64>,
}

/// The largest configuration file read (4 MiB): a bigger one (a runaway
/// ConfigMap, a path naming a device or a FIFO) is refused, not read whole.
pub const MAX_FILE_BYTES: u64 = 4 << 20;

/// Reads a configuration file, at most [`MAX_FILE_BYTES`] of it; `origin`
/// names it in errors.
pub(crate) fn read_file(path: &Path, origin: &str) -> Result<Vec<u8>, ConfigError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| ConfigError::io(origin, e))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ConfigError::io(origin, e))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(ConfigError::TooLarge {
            origin: origin.to_string(),
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(bytes)
}

/// Top-level names that used to be the whole file before the mesh model
/// (they now live under `proxy:`).
pub(crate) const PROXY_FIELDS: &[&str] = &[
    "captureMode",
    "ports",
    "proxyMark",
    "workers",
    "datapath",
    "pipeSize",
    "pipePool",
    "backlog",
    "sameNodeFastPath",
    "drainPeriod",
    "connectTimeout",
    "workloadWait",
    "hbone",
    "busyPollMicros",
];

impl MeshConfig {
    /// The embedded default ([`EMBEDDED_DEFAULT`]), parsed.
    pub fn embedded_default() -> MeshConfig {
        MeshConfig::parse(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN)
            .expect("the embedded default parses (tested)")
    }

    /// Parses YAML text; `origin` names the file in errors. An empty
    /// document is refused (an accidentally emptied ConfigMap must not
    /// silently drop every workload and policy): write `{}` for all defaults.
    pub fn parse(text: &str, origin: &str) -> Result<MeshConfig, ConfigError> {
        match serde_norway::from_str::<Option<MeshConfig>>(text) {
            Ok(Some(cfg)) => Ok(cfg),
            Ok(None) => Err(ConfigError::Parse {
                origin: origin.to_owned(),
                line: 1,
                column: 1,
                message: "the document is empty (write `{}` to run with every default)".into(),
            }),
            Err(e) => {
                let mut err = ConfigError::yaml(origin, &e);
                if let ConfigError::Parse { message, .. } = &mut err {
                    let moved = PROXY_FIELDS
                        .iter()
                        .find(|f| message.starts_with(&format!("unknown field `{f}`")));
                    if let Some(field) = moved {
                        message.push_str(&format!(
                            " (proxy settings live under `proxy:`: write `proxy: {{{field}: ...}}`)"
                        ));
                    }
                }
                Err(err)
            }
        }
    }
}

/// FNV-1a 64 of the file's bytes: the snapshot's revision and the
/// watcher's change detector (not a security measure).
pub(crate) fn content_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Action, Mesh, NoEnv};

    #[test]
    fn embedded_default_is_valid_and_equals_the_code_defaults() {
        let cfg = MeshConfig::embedded_default();
        assert_eq!(cfg, MeshConfig::default());
        let mesh = MeshConfig::load(None, &NoEnv).unwrap();
        assert_eq!(mesh.proxy(), &ProxySettings::default());
        assert_eq!(mesh.trust_domain(), DEFAULT_TRUST_DOMAIN);
        assert_eq!(mesh.root_namespace(), DEFAULT_ROOT_NAMESPACE);
        assert_eq!(mesh.origin(), EMBEDDED_ORIGIN);
        assert!(mesh.workload_count() == 0 && mesh.policy_count() == 0);
    }

    /// The commented examples in default.yaml are valid once uncommented.
    #[test]
    fn default_yaml_commented_examples_are_valid() {
        let uncommented: String = EMBEDDED_DEFAULT
            .lines()
            .map(|l| {
                if l.starts_with("#  ") {
                    l[1..].to_owned() // an example line
                } else if let Some(ca) = l.strip_prefix("# ca:") {
                    format!("ca:{ca}")
                } else if l.starts_with('#') {
                    String::new() // prose
                } else {
                    l.replace(": []", ":")
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let mesh = MeshConfig::load_str(&uncommented, "default.yaml uncommented", &NoEnv)
            .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
        assert_eq!(mesh.workload_count(), 1);
        assert_eq!(mesh.service_count(), 1);
        assert_eq!(mesh.policy_count(), 1);
        assert!(mesh.ca().is_some());
    }

    fn readme() -> &'static str {
        include_str!("../README.md")
    }

    fn readme_example() -> &'static str {
        let start = readme().find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
        let len = readme()[start..].find("```").expect("closed");
        &readme()[start..start + len]
    }

    #[test]
    fn readme_example_is_valid() {
        let mesh = MeshConfig::load_str(readme_example(), "config/README.md", &NoEnv)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mesh.workload_count(), 4);
        assert_eq!(mesh.service_count(), 1);
        assert_eq!(mesh.policy_count(), 3);
        assert_eq!(mesh.policies().next().unwrap().action, Action::Deny);
        assert!(mesh.policies().next().unwrap().mesh_wide);
        // Its proxy section spells out the defaults.
        assert_eq!(mesh.proxy(), &ProxySettings::default());
    }

    #[test]
    fn readme_documents_every_variable_and_proxy_field() {
        for var in crate::ENV_VARS {
            let row = format!("| `{}` | `{}` |", var.name, var.field);
            assert!(readme().contains(&row), "README lacks {row}");
        }
        for field in PROXY_FIELDS {
            assert!(
                readme_example().contains(&format!("  {field}:")),
                "README example lacks proxy.{field}"
            );
        }
    }

    #[test]
    fn proxy_fields_list_is_complete() {
        // Every name is a ProxySettings field...
        for field in PROXY_FIELDS {
            let err = serde_norway::from_str::<ProxySettings>(&format!("{field}: !bad x"))
                .unwrap_err()
                .to_string();
            assert!(!err.contains("unknown field"), "{field}: {err}");
        }
        // ...and the list names them all (serde's error enumerates the fields).
        let err = serde_norway::from_str::<ProxySettings>("nope: 1")
            .unwrap_err()
            .to_string();
        let listed = err.matches('`').count() / 2 - 1;
        assert_eq!(listed, PROXY_FIELDS.len(), "{err}");
    }

    #[test]
    fn summary_names_paths_and_overrides() {
        let yaml =
            "ca: {certFile: /s/ca.crt, keyFile: /s/ca.key}\npolicies: [{name: p, action: DENY}]\n";
        let mesh = MeshConfig::load_str(
            yaml,
            "/etc/ringway/config.yaml",
            &[("RINGWAY_WORKERS", "2")],
        )
        .unwrap();
        let s = mesh.effective_summary();
        assert!(!s.contains('\n'), "{s}");
        for part in [
            "source=/etc/ringway/config.yaml revision=",
            "env=[RINGWAY_WORKERS=2 -> proxy.workers]",
            "trustDomain=cluster.local",
            "captureMode=tproxy",
            "workers=2 (effective 2)",
            "proxyMark=0x539",
            "drainPeriod=30s",
            "ca.certFile=/s/ca.crt ca.keyFile=/s/ca.key ca.bundleFiles=[]",
            "workloads=0 services=0 policies=1 (allow 0, deny 1)",
        ] {
            assert!(s.contains(part), "{part:?} missing from {s}");
        }
        assert_eq!(
            mesh.revision(),
            content_hash(yaml.as_bytes()),
            "the revision is the file's hash"
        );
        let plain = MeshConfig::load(None, &NoEnv).unwrap().effective_summary();
        assert!(
            plain.contains(" ca=none") && !plain.contains("env=["),
            "{plain}"
        );
    }

    fn with_labels(labels: &str) -> Result<Mesh, ConfigError> {
        let text = format!(
            "workloads:\n  - {{ uid: u1, name: web-7d4-x2, namespace: shop, ips: [10.0.0.1], node: n1, labels: {labels} }}\n"
        );
        MeshConfig::load_str(&text, "test", &NoEnv)
    }

    /// The reference's canonical service and revision rules, label by label.
    #[test]
    fn canonical_service_and_revision_follow_the_reference_label_order() {
        let cases: &[(&str, &str, &str)] = &[
            ("{}", "web-7d4-x2", "latest"),
            ("{ app: web, version: v1 }", "web", "v1"),
            (
                "{ app: web, version: v1, app.kubernetes.io/name: shop-web, app.kubernetes.io/version: \"2.0\" }",
                "shop-web",
                "2.0",
            ),
            (
                "{ app: web, app.kubernetes.io/name: shop-web, service.istio.io/canonical-name: storefront, \
                   version: v1, service.istio.io/canonical-revision: canary }",
                "storefront",
                "canary",
            ),
            // The first label present wins, even empty (as the reference's lookup).
            ("{ app: \"\", version: v3 }", "", "v3"),
        ];
        for (labels, service, revision) in cases {
            let mesh = with_labels(labels).unwrap_or_else(|e| panic!("{labels}: {e}"));
            let w = mesh.workloads().next().unwrap();
            assert_eq!(w.canonical_service(), *service, "{labels}");
            assert_eq!(w.canonical_revision(), *revision, "{labels}");
        }
    }

    #[test]
    fn workload_labels_cluster_id_and_locality_are_validated() {
        for (labels, needle) in [
            ("{ \"bad key\": x }", "workloads[0].labels"),
            ("{ app: \"-web\" }", "workloads[0].labels[app]"),
            ("{ \"Example.com/x\": y }", "workloads[0].labels"),
            ("{ app: \"a\\nb\" }", "workloads[0].labels[app]"),
        ] {
            let e = with_labels(labels).unwrap_err().to_string();
            assert!(e.contains(needle), "{labels}: {e}");
        }
        let long = "v".repeat(64);
        let e = with_labels(&format!("{{ version: {long} }}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("more than 63"), "{e}");
        let e = MeshConfig::load_str("clusterId: \"\"\n", "t", &NoEnv)
            .unwrap_err()
            .to_string();
        assert!(e.contains("clusterId"), "{e}");
        let e = MeshConfig::load_str("clusterId: \"a b\"\n", "t", &NoEnv)
            .unwrap_err()
            .to_string();
        assert!(e.contains("clusterId"), "{e}");
        let e = MeshConfig::load_str("locality: { zone: \"z/1\" }\n", "t", &NoEnv)
            .unwrap_err()
            .to_string();
        assert!(e.contains("locality.zone"), "{e}");
        let mesh = MeshConfig::load_str(
            "clusterId: east-1\nlocality: { region: eu-west1, zone: eu-west1-b }\n",
            "t",
            &NoEnv,
        )
        .unwrap();
        assert_eq!(mesh.cluster_id(), "east-1");
        assert_eq!(mesh.node_locality().zone, "eu-west1-b");
        assert!(
            mesh.effective_summary()
                .contains(" clusterId=east-1 locality=eu-west1/eu-west1-b "),
            "{}",
            mesh.effective_summary()
        );
        assert_eq!(
            MeshConfig::load(None, &NoEnv).unwrap().cluster_id(),
            "Kubernetes"
        );
    }
}
