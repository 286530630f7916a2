//! The mapping of `security.istio.io` objects, field by field, from objects
//! shaped as the API defines them, checked by the decisions the merged mesh
//! makes (and the fail-safe cases: attributes a node proxy cannot see).

use std::net::IpAddr;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::authz::{evaluate, ConnInfo, Decision, DenyReason, Identity};
use crate::kube::{build_mesh, Cluster, KubeMesh, KubeOptions};
use crate::{Mesh, MeshConfig, MtlsMode};

const FILE: &str = r#"
trustDomain: example.org
trustDomainAliases: [old.example.org]
workloads:
  - {uid: w-web, name: web-0, namespace: shop, serviceAccount: web, ips: [10.1.0.5], node: n, labels: {app: web}}
  - {uid: w-db, name: db-0, namespace: shop, serviceAccount: db, ips: [10.1.0.6], node: n, labels: {app: db}}
  - {uid: w-api, name: api-0, namespace: other, serviceAccount: api, ips: [10.2.0.5], node: n, labels: {app: web}}
  - {uid: w-dual, name: dual-0, namespace: dual, serviceAccount: dual, ips: [10.3.0.5, "fd00:3::5"], node: n, labels: {app: dual}}
policies:
  - name: file-policy
    namespace: shop
    action: DENY
    rules: [{from: [{ipBlocks: [192.0.2.0/24]}]}]
"#;

fn file() -> Mesh {
    MeshConfig::load_str(FILE, "config.yaml", &[]).unwrap()
}

fn object(kind: &str, version: &str, ns: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": format!("security.istio.io/{version}"),
        "kind": kind,
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
            "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
    })
}

/// An `AuthorizationPolicy` (v1) in `ns`.
fn ap(ns: &str, name: &str, spec: Value) -> Value {
    object("AuthorizationPolicy", "v1", ns, name, spec)
}

/// A `PeerAuthentication` (v1) in `ns`.
fn pa(ns: &str, name: &str, spec: Value) -> Value {
    object("PeerAuthentication", "v1", ns, name, spec)
}

fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Arc<T> {
    Arc::new(serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}")))
}

fn build(aps: Vec<Value>, pas: Vec<Value>) -> KubeMesh {
    let cluster = Cluster {
        authorization_policies: aps.into_iter().map(typed).collect(),
        peer_authentications: pas.into_iter().map(typed).collect(),
        ..Cluster::default()
    };
    build_mesh(&file(), &cluster, &KubeOptions::default())
}

/// A peer: its address and identity (`ns/sa` in `example.org`, or a whole
/// SPIFFE ID), or plaintext.
struct Peer<'a> {
    ip: &'a str,
    id: Option<&'a str>,
}

const WEB: Peer<'static> = Peer {
    ip: "10.1.0.5",
    id: Some("shop/web"),
};
const PLAIN: Peer<'static> = Peer {
    ip: "10.9.9.9",
    id: None,
};

fn identity(id: &str) -> Identity {
    if id.starts_with("spiffe://") {
        Identity::from_spiffe_id(id).unwrap()
    } else {
        let (ns, sa) = id.split_once('/').unwrap();
        Identity::new("example.org", ns, sa)
    }
}

fn decide(mesh: &Mesh, peer: &Peer<'_>, dst_uid: &str, port: u16) -> Decision {
    let dst = mesh.workload_by_uid(dst_uid).unwrap();
    decide_to(mesh, peer, dst_uid, dst.ips[0], port)
}

/// As [`decide`], to the workload's address `dst_ip`.
fn decide_to(mesh: &Mesh, peer: &Peer<'_>, dst_uid: &str, dst_ip: IpAddr, port: u16) -> Decision {
    let id = peer.id.map(identity);
    let ip: IpAddr = peer.ip.parse().unwrap();
    evaluate(
        mesh,
        &ConnInfo {
            src_ip: ip,
            src_identity: id.as_ref(),
            dst_workload: mesh.workload_by_uid(dst_uid).unwrap(),
            dst_ip,
            dst_port: port,
        },
    )
}

fn allowed(mesh: &Mesh, peer: &Peer<'_>, dst_uid: &str, port: u16) -> bool {
    decide(mesh, peer, dst_uid, port).is_allowed()
}

fn peer<'a>(ip: &'a str, id: Option<&'a str>) -> Peer<'a> {
    Peer { ip, id }
}

fn notes(k: &KubeMesh) -> Vec<(String, bool, &'static str)> {
    k.mesh
        .cluster_policy_notes()
        .iter()
        .map(|n| (n.object.clone(), n.skipped, n.code))
        .collect()
}

/// One ALLOW policy on `shop/web-0` with one rule whose only source is `source`.
fn allow_from(source: Value) -> Mesh {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}}, "action": "ALLOW",
                "rules": [{"from": [{"source": source}]}]}),
        )],
        vec![],
    );
    assert!(k.skipped.is_empty(), "{:?}", k.skipped);
    k.mesh
}

/// One ALLOW policy on `shop/web-0` with one rule whose only condition is `when`.
fn allow_when(when: Value) -> Mesh {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}},
                "rules": [{"when": [when]}]}),
        )],
        vec![],
    );
    assert!(k.skipped.is_empty(), "{:?}", k.skipped);
    k.mesh
}

// ------------------------------------------------------------ the policy itself

#[test]
fn authorization_policy_becomes_a_cluster_policy_named_by_its_object() {
    let k = build(
        vec![ap(
            "shop",
            "file-policy",
            json!({"action": "DENY", "rules": [{}]}),
        )],
        vec![],
    );
    let names: Vec<&str> = k
        .mesh
        .policies()
        .map(|p| p.qualified_name().as_ref())
        .collect();
    // The file's policy of the same namespace and name stays: names never collide.
    assert_eq!(names, ["shop/file-policy", "istio/shop/file-policy"]);
    let p = &k.mesh.policies().nth(1).unwrap();
    assert_eq!(
        p.origin.as_deref(),
        Some("AuthorizationPolicy shop/file-policy")
    );
    assert_eq!(p.namespace, "shop");
    assert!(!p.mesh_wide);
}

#[test]
fn authorization_policy_without_a_namespace_is_skipped_never_mesh_wide() {
    let mut obj = ap("shop", "p", json!({"action": "DENY", "rules": [{}]}));
    obj["metadata"].as_object_mut().unwrap().remove("namespace");
    let mut pa_obj = pa("shop", "p", json!({"mtls": {"mode": "STRICT"}}));
    pa_obj["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let k = build(vec![obj], vec![pa_obj]);
    assert_eq!(k.mesh.policy_count(), 1, "the file's only");
    assert!(k.mesh.peer_authentications().is_empty());
    assert!(allowed(&k.mesh, &PLAIN, "w-api", 80));
    assert_eq!(notes(&k).iter().filter(|n| n.1).count(), 2);
}

#[test]
fn authorization_policy_without_action_is_allow() {
    let k = build(vec![ap("shop", "p", json!({"rules": [{}]}))], vec![]);
    assert_eq!(
        k.mesh.policies().nth(1).unwrap().action,
        crate::Action::Allow
    );
}

#[test]
fn authorization_policy_of_v1beta1_reads_the_same() {
    let obj = object(
        "AuthorizationPolicy",
        "v1beta1",
        "shop",
        "p",
        json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["8080"]}}]}]}),
    );
    let k = build(vec![obj], vec![]);
    assert!(!allowed(&k.mesh, &WEB, "w-db", 8080));
    assert!(allowed(&k.mesh, &WEB, "w-db", 9090));
}

#[test]
fn authorization_policy_scope_is_its_namespace() {
    let k = build(
        vec![ap("shop", "p", json!({"action": "DENY", "rules": [{}]}))],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(allowed(&k.mesh, &WEB, "w-api", 80));
}

#[test]
fn authorization_policy_in_the_root_namespace_is_mesh_wide() {
    let k = build(
        vec![ap(
            "istio-system",
            "p",
            json!({"action": "DENY", "rules": [{}]}),
        )],
        vec![],
    );
    assert!(k.mesh.policies().nth(1).unwrap().mesh_wide);
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-api", 80));
}

#[test]
fn authorization_policy_root_namespace_is_configurable() {
    let cluster = Cluster {
        authorization_policies: vec![typed(ap(
            "mesh-root",
            "p",
            json!({"action": "DENY", "rules": [{}]}),
        ))],
        ..Cluster::default()
    };
    let options = KubeOptions {
        istio_root_namespace: "mesh-root".into(),
        ..KubeOptions::default()
    };
    let k = build_mesh(&file(), &cluster, &options);
    assert!(!allowed(&k.mesh, &WEB, "w-api", 80));
}

#[test]
fn authorization_policy_selector_matches_pod_labels() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "db"}}, "action": "DENY", "rules": [{}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_selector_in_the_root_namespace_selects_in_every_namespace() {
    let k = build(
        vec![ap(
            "istio-system",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}}, "action": "DENY", "rules": [{}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-api", 80));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
}

#[test]
fn authorization_policy_empty_selector_selects_the_whole_namespace() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {}}, "action": "DENY", "rules": [{}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_allow_without_rules_denies_everything_it_governs() {
    let k = build(vec![ap("shop", "p", json!({"action": "ALLOW"}))], vec![]);
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(allowed(&k.mesh, &WEB, "w-api", 80));
    // One empty rule allows everything.
    let k = build(vec![ap("shop", "p", json!({"rules": [{}]}))], vec![]);
    assert!(allowed(&k.mesh, &PLAIN, "w-db", 80));
}

// ------------------------------------------------------------ from.source

#[test]
fn authorization_policy_maps_principals() {
    let m = allow_from(json!({"principals": ["example.org/ns/shop/sa/db"]}));
    assert!(allowed(&m, &peer("10.1.0.6", Some("shop/db")), "w-web", 80));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    assert!(!allowed(&m, &PLAIN, "w-web", 80));
}

#[test]
fn authorization_policy_maps_not_principals() {
    let m = allow_from(json!({"notPrincipals": ["example.org/ns/shop/sa/db"]}));
    assert!(!allowed(
        &m,
        &peer("10.1.0.6", Some("shop/db")),
        "w-web",
        80
    ));
    assert!(allowed(&m, &WEB, "w-web", 80));
    // A plaintext peer has no principal in the list.
    assert!(allowed(&m, &PLAIN, "w-web", 80));
}

#[test]
fn authorization_policy_maps_principal_globs() {
    let m = allow_from(json!({"principals": ["*/ns/shop/sa/db"]}));
    assert!(allowed(
        &m,
        &peer("10.1.0.6", Some("spiffe://elsewhere.net/ns/shop/sa/db")),
        "w-web",
        80
    ));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    let m = allow_from(json!({"principals": ["example.org/ns/shop/*"]}));
    assert!(allowed(&m, &WEB, "w-web", 80));
    assert!(!allowed(
        &m,
        &peer("10.2.0.5", Some("other/api")),
        "w-web",
        80
    ));
    let m = allow_from(json!({"principals": ["*"]}));
    assert!(allowed(&m, &WEB, "w-web", 80));
    assert!(!allowed(&m, &PLAIN, "w-web", 80));
}

#[test]
fn adversarial_authorization_policy_principals_are_not_rewritten_to_the_trust_domain() {
    // The reference's conversion for its node proxy passes principals
    // through unchanged: with `trustDomain: example.org` (and an alias), an
    // ALLOW naming `cluster.local/...` or the alias admits only that exact
    // trust domain, never the mesh's own.
    let db = |td: &str| format!("spiffe://{td}/ns/shop/sa/db");
    let m = allow_from(json!({"principals": ["cluster.local/ns/shop/sa/db"]}));
    for td in ["example.org", "old.example.org"] {
        assert!(
            !allowed(&m, &peer("10.1.0.6", Some(&db(td))), "w-web", 80),
            "cluster.local admitted {td}"
        );
    }
    assert!(allowed(
        &m,
        &peer("10.1.0.6", Some(&db("cluster.local"))),
        "w-web",
        80
    ));
    let m = allow_from(json!({"principals": ["old.example.org/ns/shop/sa/db"]}));
    assert!(!allowed(
        &m,
        &peer("10.1.0.6", Some(&db("example.org"))),
        "w-web",
        80
    ));
    // `when source.principal` likewise.
    let m = allow_when(json!({"key": "source.principal",
        "values": ["cluster.local/ns/shop/sa/db"]}));
    assert!(!allowed(
        &m,
        &peer("10.1.0.6", Some(&db("example.org"))),
        "w-web",
        80
    ));
    // A DENY naming the alias denies only the alias.
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"action": "DENY", "rules": [{"from": [{"source":
                {"principals": ["old.example.org/ns/shop/sa/db"]}}]}]}),
        )],
        vec![],
    );
    assert!(allowed(
        &k.mesh,
        &peer("10.1.0.6", Some(&db("example.org"))),
        "w-web",
        80
    ));
    assert!(!allowed(
        &k.mesh,
        &peer("10.1.0.6", Some(&db("old.example.org"))),
        "w-web",
        80
    ));
    // A foreign trust domain is taken literally.
    let m = allow_from(json!({"principals": ["partner.net/ns/shop/sa/db"]}));
    assert!(allowed(
        &m,
        &peer("10.1.0.6", Some(&db("partner.net"))),
        "w-web",
        80
    ));
}

#[test]
fn authorization_policy_maps_namespaces() {
    let m = allow_from(json!({"namespaces": ["oth*"]}));
    assert!(allowed(
        &m,
        &peer("10.2.0.5", Some("other/api")),
        "w-web",
        80
    ));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    assert!(!allowed(&m, &PLAIN, "w-web", 80));
}

#[test]
fn authorization_policy_maps_not_namespaces() {
    let m = allow_from(json!({"notNamespaces": ["other"]}));
    assert!(!allowed(
        &m,
        &peer("10.2.0.5", Some("other/api")),
        "w-web",
        80
    ));
    assert!(allowed(&m, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_maps_service_accounts() {
    // `sa` alone is in the policy's namespace; `ns/sa` is as written.
    let m = allow_from(json!({"serviceAccounts": ["db", "other/api"]}));
    assert!(allowed(&m, &peer("10.1.0.6", Some("shop/db")), "w-web", 80));
    assert!(allowed(
        &m,
        &peer("10.2.0.5", Some("other/api")),
        "w-web",
        80
    ));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    let m = allow_from(json!({"notServiceAccounts": ["db"]}));
    assert!(!allowed(
        &m,
        &peer("10.1.0.6", Some("shop/db")),
        "w-web",
        80
    ));
    assert!(allowed(&m, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_maps_ip_blocks() {
    let m = allow_from(json!({"ipBlocks": ["10.9.0.0/16", "10.1.0.6"]}));
    assert!(allowed(&m, &PLAIN, "w-web", 80));
    assert!(allowed(&m, &peer("10.1.0.6", None), "w-web", 80));
    assert!(!allowed(&m, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_maps_not_ip_blocks() {
    let m = allow_from(json!({"notIpBlocks": ["10.9.0.0/16"]}));
    assert!(!allowed(&m, &PLAIN, "w-web", 80));
    assert!(allowed(&m, &WEB, "w-web", 80));
}

// ------------------------------------------------------------ to.operation

#[test]
fn authorization_policy_maps_ports() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"rules": [{"to": [{"operation": {"ports": ["8080", "9090"]}}]}]}),
        )],
        vec![],
    );
    assert!(allowed(&k.mesh, &WEB, "w-db", 8080));
    assert!(allowed(&k.mesh, &WEB, "w-db", 9090));
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
}

#[test]
fn authorization_policy_maps_not_ports() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"rules": [{"to": [{"operation": {"notPorts": ["22"]}}]}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-db", 22));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
}

// ------------------------------------------------------------ when

#[test]
fn authorization_policy_maps_when_source_ip() {
    let m = allow_when(json!({"key": "source.ip", "values": ["10.9.0.0/16"]}));
    assert!(allowed(&m, &PLAIN, "w-web", 80));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    let m = allow_when(json!({"key": "source.ip", "notValues": ["10.9.0.0/16"]}));
    assert!(!allowed(&m, &PLAIN, "w-web", 80));
    assert!(allowed(&m, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_maps_when_source_namespace() {
    let m = allow_when(json!({"key": "source.namespace", "values": ["other"]}));
    assert!(allowed(
        &m,
        &peer("10.2.0.5", Some("other/api")),
        "w-web",
        80
    ));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    assert!(!allowed(&m, &PLAIN, "w-web", 80));
    let m = allow_when(json!({"key": "source.namespace", "notValues": ["other"]}));
    assert!(!allowed(
        &m,
        &peer("10.2.0.5", Some("other/api")),
        "w-web",
        80
    ));
    assert!(allowed(&m, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_maps_when_source_principal() {
    let m = allow_when(json!({"key": "source.principal",
        "values": ["example.org/ns/shop/sa/web"]}));
    assert!(allowed(&m, &WEB, "w-web", 80));
    assert!(!allowed(
        &m,
        &peer("10.1.0.5", Some("spiffe://old.example.org/ns/shop/sa/web")),
        "w-web",
        80
    ));
    assert!(!allowed(
        &m,
        &peer("10.1.0.6", Some("shop/db")),
        "w-web",
        80
    ));
    let m = allow_when(json!({"key": "source.principal", "notValues": ["*/sa/web"]}));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    assert!(allowed(&m, &peer("10.1.0.6", Some("shop/db")), "w-web", 80));
}

#[test]
fn authorization_policy_maps_when_destination_ip() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"rules": [{"when": [{"key": "destination.ip", "values": ["10.1.0.6/32"]}]}]}),
        )],
        vec![],
    );
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"rules": [{"when": [{"key": "destination.ip", "notValues": ["10.1.0.6"]}]}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
}

/// `destination.ip` is the address the connection was made to, not any of
/// the workload's: an ALLOW for a dual-stack pod's IPv4 address does not
/// admit connections to its IPv6 one.
#[test]
fn adversarial_authorization_policy_destination_ip_is_the_connections_address() {
    let k = build(
        vec![ap(
            "dual",
            "v4-only",
            json!({"rules": [{"when": [{"key": "destination.ip", "values": ["10.3.0.0/16"]}]}]}),
        )],
        vec![],
    );
    let v4: IpAddr = "10.3.0.5".parse().unwrap();
    let v6: IpAddr = "fd00:3::5".parse().unwrap();
    assert!(decide_to(&k.mesh, &WEB, "w-dual", v4, 80).is_allowed());
    assert!(
        !decide_to(&k.mesh, &WEB, "w-dual", v6, 80).is_allowed(),
        "an ALLOW for the IPv4 address admitted a connection to the IPv6 one"
    );
    let k = build(
        vec![ap(
            "dual",
            "no-v6",
            json!({"action": "DENY", "rules": [{"when": [{"key": "destination.ip", "values": ["fd00::/8"]}]}]}),
        )],
        vec![],
    );
    assert!(decide_to(&k.mesh, &WEB, "w-dual", v4, 80).is_allowed());
    assert!(!decide_to(&k.mesh, &WEB, "w-dual", v6, 80).is_allowed());
}

#[test]
fn authorization_policy_maps_when_destination_port() {
    let m = allow_when(json!({"key": "destination.port", "values": ["8080"]}));
    assert!(allowed(&m, &WEB, "w-web", 8080));
    assert!(!allowed(&m, &WEB, "w-web", 80));
    let m = allow_when(json!({"key": "destination.port", "notValues": ["8080"]}));
    assert!(!allowed(&m, &WEB, "w-web", 8080));
    assert!(allowed(&m, &WEB, "w-web", 80));
}

#[test]
fn authorization_policy_when_conditions_all_apply_with_from_and_to() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}}, "rules": [{
                "from": [{"source": {"namespaces": ["shop"]}}],
                "to": [{"operation": {"ports": ["80"]}}],
                "when": [{"key": "source.ip", "values": ["10.1.0.0/24"]},
                         {"key": "destination.port", "notValues": ["81"]}]}]}),
        )],
        vec![],
    );
    assert!(allowed(
        &k.mesh,
        &peer("10.1.0.6", Some("shop/db")),
        "w-web",
        80
    ));
    assert!(!allowed(
        &k.mesh,
        &peer("10.1.1.6", Some("shop/db")),
        "w-web",
        80
    ));
    assert!(!allowed(
        &k.mesh,
        &peer("10.1.0.6", Some("shop/db")),
        "w-web",
        81
    ));
    assert!(!allowed(
        &k.mesh,
        &peer("10.1.0.6", Some("other/db")),
        "w-web",
        80
    ));
}

// ------------------------------------------------------------ fail-safe cases

/// An ALLOW rule with attributes a node proxy cannot see is omitted: it
/// allows nothing, the policy's other rules still do.
fn allow_with_l7_rule(l7_rule: Value) -> KubeMesh {
    build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}}, "action": "ALLOW", "rules": [
                l7_rule,
                {"from": [{"source": {"namespaces": ["other"]}}]},
            ]}),
        )],
        vec![],
    )
}

fn assert_l7_rule_omitted(l7_rule: Value) {
    let k = allow_with_l7_rule(l7_rule.clone());
    assert!(
        !allowed(&k.mesh, &WEB, "w-web", 80),
        "{l7_rule}: the L7 rule must allow nothing"
    );
    assert!(
        allowed(&k.mesh, &peer("10.2.0.5", Some("other/api")), "w-web", 80),
        "{l7_rule}: the other rule still allows"
    );
    assert_eq!(
        notes(&k),
        [(
            "AuthorizationPolicy shop/p".to_owned(),
            false,
            "l7-rule-omitted"
        )],
        "{l7_rule}"
    );
}

#[test]
fn adversarial_authorization_policy_allow_with_http_operations_allows_nothing() {
    for op in [
        json!({"methods": ["GET"]}),
        json!({"notMethods": ["POST"]}),
        json!({"paths": ["/public/*"]}),
        json!({"notPaths": ["/admin"]}),
        json!({"hosts": ["web.shop"]}),
        json!({"notHosts": ["evil"]}),
        json!({"ports": ["80"], "methods": ["GET"]}),
    ] {
        assert_l7_rule_omitted(json!({"from": [{"source": {"namespaces": ["shop"]}}],
            "to": [{"operation": op}]}));
    }
}

#[test]
fn adversarial_authorization_policy_allow_with_request_principals_allows_nothing() {
    for source in [
        json!({"namespaces": ["shop"], "requestPrincipals": ["issuer/subject"]}),
        json!({"notRequestPrincipals": ["*"]}),
        json!({"remoteIpBlocks": ["10.1.0.0/16"]}),
        json!({"notRemoteIpBlocks": ["10.9.0.0/16"]}),
    ] {
        assert_l7_rule_omitted(json!({"from": [{"source": source}]}));
    }
}

#[test]
fn adversarial_authorization_policy_allow_with_l7_when_keys_allows_nothing() {
    for key in [
        "request.headers[x-user]",
        "request.auth.claims[groups]",
        "connection.sni",
        "experimental.envoy.filters.network.mysql_proxy[db.table]",
    ] {
        assert_l7_rule_omitted(json!({"from": [{"source": {"namespaces": ["shop"]}}],
            "when": [{"key": key, "values": ["x"]}]}));
    }
}

#[test]
fn adversarial_authorization_policy_allow_with_unknown_attributes_allows_nothing() {
    // A field this proxy does not know is never silently dropped from an ALLOW rule.
    assert_l7_rule_omitted(json!({"from": [{"source": {"namespaces": ["shop"],
        "newAttribute": ["x"]}}]}));
    assert_l7_rule_omitted(json!({"to": [{"operation": {"ports": ["80"], "futureField": "x"}}]}));
}

#[test]
fn adversarial_authorization_policy_allow_with_only_l7_rules_denies_everything() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}},
                "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
}

#[test]
fn adversarial_authorization_policy_deny_with_http_operations_denies_more_broadly() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"action": "DENY", "rules": [{
                "to": [{"operation": {"ports": ["8080"], "methods": ["DELETE"], "paths": ["/admin"]}}]}]}),
        )],
        vec![],
    );
    // Every connection to 8080 is denied (the method and path are not seen).
    assert!(!allowed(&k.mesh, &WEB, "w-db", 8080));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
    assert_eq!(
        notes(&k),
        [(
            "AuthorizationPolicy shop/p".to_owned(),
            false,
            "l7-attributes-ignored"
        )]
    );
}

#[test]
fn adversarial_authorization_policy_deny_with_only_l7_source_denies_every_source() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"action": "DENY", "rules": [{
                "from": [{"source": {"requestPrincipals": ["issuer/bad"]}}],
                "to": [{"operation": {"ports": ["8080"]}}]}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-db", 8080));
    assert!(!allowed(&k.mesh, &PLAIN, "w-db", 8080));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
}

#[test]
fn adversarial_authorization_policy_deny_with_l7_when_ignores_the_condition() {
    let k = build(
        vec![ap(
            "shop",
            "p",
            json!({"action": "DENY", "rules": [{
                "from": [{"source": {"namespaces": ["shop"]}}],
                "when": [{"key": "request.headers[x-debug]", "values": ["1"]}]}]}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(allowed(
        &k.mesh,
        &peer("10.2.0.5", Some("other/api")),
        "w-db",
        80
    ));
}

#[test]
fn authorization_policy_audit_and_custom_are_skipped_with_a_note() {
    let k = build(
        vec![
            ap("shop", "audit", json!({"action": "AUDIT", "rules": [{}]})),
            ap(
                "shop",
                "custom",
                json!({"action": "CUSTOM", "provider": {"name": "ext-authz"}, "rules": [{}]}),
            ),
        ],
        vec![],
    );
    assert_eq!(k.mesh.policy_count(), 1, "only the file's");
    assert_eq!(
        notes(&k),
        [
            (
                "AuthorizationPolicy shop/audit".to_owned(),
                true,
                "unsupported-action"
            ),
            (
                "AuthorizationPolicy shop/custom".to_owned(),
                true,
                "unsupported-action"
            ),
        ]
    );
    assert!(k
        .skipped
        .iter()
        .any(|s| s.object == "AuthorizationPolicy shop/audit" && s.reason.contains("AUDIT")));
}

#[test]
fn authorization_policy_with_target_refs_is_skipped() {
    let k = build(
        vec![
            ap(
                "shop",
                "waypoint",
                json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io",
                    "name": "waypoint"}], "action": "DENY", "rules": [{}]}),
            ),
            ap(
                "shop",
                "service",
                json!({"targetRef": {"kind": "Service", "group": "", "name": "web"},
                    "action": "DENY", "rules": [{}]}),
            ),
        ],
        vec![],
    );
    assert_eq!(k.mesh.policy_count(), 1);
    assert!(allowed(&k.mesh, &WEB, "w-db", 80));
    assert!(notes(&k).iter().all(|(_, s, c)| *s && *c == "target-ref"));
}

#[test]
fn adversarial_authorization_policy_unreadable_objects_deny_what_they_could_select() {
    let k = build(
        vec![
            ap(
                "shop",
                "bad-action",
                json!({"action": "PERMIT", "rules": [{}]}),
            ),
            ap(
                "shop",
                "bad-deny",
                json!({"action": "DENY", "rules": "everything"}),
            ),
            ap("shop", "bad-spec", json!("everything")),
            ap("shop", "good", json!({"action": "DENY", "rules": [{}]})),
        ],
        vec![],
    );
    let names: Vec<&str> = k
        .mesh
        .policies()
        .map(|p| p.qualified_name().as_ref())
        .collect();
    assert_eq!(
        names,
        [
            "shop/file-policy",
            "istio/shop/bad-action",
            "istio/shop/bad-deny",
            "istio/shop/bad-spec",
            "istio/shop/good"
        ],
        "nothing dropped"
    );
    let toward_deny: Vec<String> = notes(&k)
        .into_iter()
        .filter(|(_, s, c)| !*s && *c == "unreadable-deny-all")
        .map(|(o, _, _)| o)
        .collect();
    assert_eq!(toward_deny.len(), 3, "{:?}", k.mesh.cluster_policy_notes());
    // Without `good`, each bad one alone denies its namespace.
    for bad in [
        json!({"action": "PERMIT", "rules": [{}]}),
        json!({"action": "deny", "rules": [{}]}),
        json!({"action": "DENY", "rules": "everything"}),
        json!("everything"),
    ] {
        let k = build(vec![ap("shop", "bad", bad.clone())], vec![]);
        assert!(
            !allowed(&k.mesh, &WEB, "w-db", 80),
            "{bad} let web reach db"
        );
        assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80), "{bad}");
    }
    // A readable selector narrows it to what it selects.
    let k = build(
        vec![ap(
            "shop",
            "bad",
            json!({"selector": {"matchLabels": {"app": "web"}}, "action": "DENY", "rules": 7}),
        )],
        vec![],
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80), "selects web only");
}

/// The policy `p` in `shop` with `spec`, which must be kept.
fn kept(spec: Value) -> KubeMesh {
    let k = build(vec![ap("shop", "p", spec)], vec![]);
    assert!(
        k.mesh
            .policies()
            .any(|p| &**p.qualified_name() == "istio/shop/p"),
        "the policy was left out: {:?}",
        k.mesh.cluster_policy_notes()
    );
    k
}

fn deny_from(source: Value) -> KubeMesh {
    kept(json!({"action": "DENY", "rules": [{"from": [{"source": source}]}]}))
}

fn allow_from_kept(source: Value) -> KubeMesh {
    kept(json!({"selector": {"matchLabels": {"app": "web"}},
        "rules": [{"from": [{"source": source}]}]}))
}

const DB: Peer<'static> = Peer {
    ip: "10.1.0.6",
    id: Some("shop/db"),
};
const OUTSIDE: Peer<'static> = Peer {
    ip: "172.16.0.1",
    id: None,
};

#[test]
fn adversarial_authorization_policy_bad_entry_skips_only_that_entry() {
    // A DENY keeps its good principal next to a malformed one (the
    // reference reads `ns/*/sa/x` as an exact string that never matches).
    let k = deny_from(json!({"principals":
        ["example.org/ns/shop/sa/db", "cluster.local/ns/*/sa/x"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    let entry_notes: Vec<_> = k
        .mesh
        .cluster_policy_notes()
        .iter()
        .filter(|n| !n.skipped && n.code == "entry-never-matches")
        .collect();
    assert_eq!(entry_notes.len(), 1, "{:?}", k.mesh.cluster_policy_notes());
    assert!(entry_notes[0].object == "AuthorizationPolicy shop/p");
    assert!(
        entry_notes[0].reason.contains("principals[1]")
            && entry_notes[0].reason.contains("cluster.local/ns/*/sa/x"),
        "{}",
        entry_notes[0].reason
    );
    // So do an unparsable block, namespace and service account.
    let k = deny_from(json!({"ipBlocks": ["not-an-ip", "10.0.0.0/8"]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(allowed(&k.mesh, &OUTSIDE, "w-web", 80));
    let k = deny_from(json!({"namespaces": ["Shop", "shop"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    let k = deny_from(json!({"serviceAccounts": ["a/b/c", "db"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    // An ALLOW keeps its good entry and admits nothing through the bad one.
    let k = allow_from_kept(json!({"principals": ["example.org/ns/shop/sa/db", "a*b"]}));
    assert!(allowed(&k.mesh, &DB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
}

#[test]
fn adversarial_authorization_policy_ip_block_with_host_bits_is_masked() {
    let k = deny_from(json!({"ipBlocks": ["10.1.2.3/8"]}));
    assert!(
        !allowed(&k.mesh, &PLAIN, "w-web", 80),
        "10.9.9.9 in 10.0.0.0/8"
    );
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(allowed(&k.mesh, &OUTSIDE, "w-web", 80));
    let k = allow_from_kept(json!({"notIpBlocks": ["10.1.2.3/16"]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
}

#[test]
fn adversarial_authorization_policy_field_with_every_entry_dropped_matches_nothing() {
    // ALLOW: a field left with no entry admits nothing, never anyone.
    for source in [
        json!({"ipBlocks": ["not-an-ip"]}),
        json!({"principals": ["ns/*/sa/x"]}),
        json!({"namespaces": ["Not_A_Namespace"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "ipBlocks": ["nope"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "notIpBlocks": ["nope"]}),
    ] {
        let k = allow_from_kept(source.clone());
        for p in [&DB, &WEB, &PLAIN, &OUTSIDE] {
            assert!(
                !allowed(&k.mesh, p, "w-web", 80),
                "{source} admitted {}",
                p.ip
            );
        }
    }
    // DENY: a source none of whose entries can be read may have named
    // anyone: it matches every peer (the reference would skip it and deny
    // no one; toward deny here).
    let k = deny_from(json!({"ipBlocks": ["not-an-ip"]}));
    for p in [&DB, &WEB, &PLAIN, &OUTSIDE] {
        assert!(!allowed(&k.mesh, p, "w-web", 80), "{} passed", p.ip);
    }
    // A DENY whose other fields remain denies at least what they name.
    let k = deny_from(json!({"principals": ["example.org/ns/shop/sa/db"], "ipBlocks": ["nope"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    // A `when` condition left with no value never matches; an ALLOW rule
    // with one allows nothing.
    let k = kept(json!({"selector": {"matchLabels": {"app": "web"}},
        "rules": [{"when": [{"key": "source.ip", "values": ["nope"]}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    let k = kept(json!({"selector": {"matchLabels": {"app": "web"}},
        "rules": [{"when": [{"key": "source.ip"}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    let k = kept(json!({"action": "DENY",
        "rules": [{"when": [{"key": "source.ip", "values": ["nope", "10.1.0.0/16"]}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
}

#[test]
fn adversarial_authorization_policy_unreadable_allow_denies_what_it_selects() {
    let k = kept(json!({"selector": {"matchLabels": {"app": "web"}}, "rules": "everything"}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-db", 80), "selects web only");
    assert!(notes(&k)
        .iter()
        .any(|(_, s, c)| !*s && *c == "unreadable-deny-all"));
}

#[test]
fn adversarial_authorization_policy_bad_port_skips_only_that_port() {
    // "+80": Go's ParseUint refuses it, so the reference drops the entry.
    let k = kept(json!({"action": "DENY",
        "rules": [{"to": [{"operation": {"ports": ["+80", "http", "99999", "8080"]}}]}]}));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 8080));
    // Port 0 never matches a connection: an ALLOW through it admits nothing.
    let k = kept(json!({"selector": {"matchLabels": {"app": "web"}},
        "rules": [{"to": [{"operation": {"ports": ["0"]}}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    let k = kept(json!({"selector": {"matchLabels": {"app": "web"}},
        "rules": [{"to": [{"operation": {"ports": ["0", "80"]}}]}]}));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 81));
    // Only unreadable ports: the ALLOW admits nothing; the DENY denies
    // every port (it may have named any).
    let k = kept(json!({"selector": {"matchLabels": {"app": "web"}},
        "rules": [{"to": [{"operation": {"ports": ["+80"]}}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    let k = kept(json!({"action": "DENY",
        "rules": [{"to": [{"operation": {"ports": ["+80"]}}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 8080));
    // Ports written as integers, as the API takes them, are ports.
    let k = kept(json!({"action": "DENY",
        "rules": [{"to": [{"operation": {"ports": [22, "8080"]}}]}]}));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 22));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 8080));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    // `when destination.port` likewise.
    let k = kept(json!({"action": "DENY",
        "rules": [{"when": [{"key": "destination.port", "values": ["+80", "0", "8080"]}]}]}));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 8080));
}

// ------------------------------------------------------------ PeerAuthentication

fn strict() -> Value {
    json!({"mtls": {"mode": "STRICT"}})
}

#[test]
fn peer_authentication_strict_namespace_refuses_plaintext() {
    let k = build(vec![], vec![pa("shop", "default", strict())]);
    let d = decide(&k.mesh, &PLAIN, "w-web", 80);
    assert_eq!(
        d,
        Decision::Deny {
            policy: "istio/shop/default".into(),
            reason: DenyReason::MtlsRequired
        }
    );
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-api", 80));
}

#[test]
fn peer_authentication_strict_in_the_root_namespace_is_mesh_wide() {
    let k = build(vec![], vec![pa("istio-system", "default", strict())]);
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-api", 80));
    assert!(allowed(&k.mesh, &WEB, "w-api", 80));
}

#[test]
fn peer_authentication_permissive_is_the_default_and_overrides_the_mesh() {
    let k = build(
        vec![],
        vec![
            pa("istio-system", "default", strict()),
            pa("shop", "default", json!({"mtls": {"mode": "PERMISSIVE"}})),
        ],
    );
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-api", 80));
    let k = build(vec![], vec![]);
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
}

#[test]
fn peer_authentication_unset_inherits_from_the_enclosing_scope() {
    let k = build(
        vec![],
        vec![
            pa("istio-system", "default", strict()),
            pa("shop", "default", json!({})),
            pa(
                "shop",
                "web",
                json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "UNSET"}}),
            ),
        ],
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-db", 80));
}

#[test]
fn peer_authentication_selector_overrides_the_namespace() {
    let k = build(
        vec![],
        vec![
            pa("shop", "default", strict()),
            pa(
                "shop",
                "db",
                json!({"selector": {"matchLabels": {"app": "db"}}, "mtls": {"mode": "PERMISSIVE"}}),
            ),
        ],
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-db", 80));
}

#[test]
fn peer_authentication_port_level_mtls() {
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}, "9090": {"mode": "DISABLE"}}}),
        )],
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 8080));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 9090));
    // A STRICT port on a PERMISSIVE workload.
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}},
                "portLevelMtls": {"8443": {"mode": "STRICT"}}}),
        )],
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 8443));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert_eq!(
        k.mesh
            .mtls_mode(k.mesh.workload_by_uid("w-web").unwrap(), 8443)
            .0,
        MtlsMode::Strict
    );
}

#[test]
fn peer_authentication_port_level_mtls_without_selector_is_ignored() {
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "default",
            json!({"portLevelMtls": {"8443": {"mode": "STRICT"}}}),
        )],
    );
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 8443));
    assert_eq!(
        notes(&k),
        [(
            "PeerAuthentication shop/default".to_owned(),
            false,
            "port-level-without-selector"
        )]
    );
}

#[test]
fn peer_authentication_disable_is_permissive() {
    let k = build(
        vec![],
        vec![
            pa("istio-system", "default", strict()),
            pa("shop", "default", json!({"mtls": {"mode": "DISABLE"}})),
        ],
    );
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert_eq!(
        notes(&k),
        [(
            "PeerAuthentication shop/default".to_owned(),
            false,
            "disable-as-permissive"
        )]
    );
}

#[test]
fn peer_authentication_oldest_of_a_scope_wins() {
    let mut newer = pa("shop", "a-newer", json!({"mtls": {"mode": "PERMISSIVE"}}));
    newer["metadata"]["creationTimestamp"] = json!("2026-06-01T00:00:00Z");
    let k = build(vec![], vec![newer, pa("shop", "z-older", strict())]);
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
}

#[test]
fn peer_authentication_with_a_selector_in_the_root_namespace_is_ignored() {
    let k = build(
        vec![],
        vec![pa(
            "istio-system",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"}}),
        )],
    );
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(notes(&k)[0].1);
}

#[test]
fn adversarial_peer_authentication_unreadable_objects_and_unknown_modes_are_strict() {
    let k = build(
        vec![],
        vec![
            pa("shop", "bad-mode", json!({"mtls": {"mode": "SOMETIMES"}})),
            pa("shop", "bad-shape", json!({"mtls": "STRICT"})),
            pa("other", "good", strict()),
        ],
    );
    assert_eq!(k.mesh.peer_authentications().len(), 3, "nothing dropped");
    assert!(!allowed(&k.mesh, &PLAIN, "w-api", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert_eq!(notes(&k).iter().filter(|n| n.1).count(), 0);
    let codes: Vec<&str> = notes(&k).iter().map(|n| n.2).collect();
    assert!(
        codes.contains(&"unknown-mode-strict") && codes.contains(&"unreadable-strict"),
        "{codes:?}"
    );
    // Each alone: `strict` in lower case (not the API's value) is STRICT;
    // so is an unreadable spec.
    for bad in [
        json!({"mtls": {"mode": "strict"}}),
        json!({"mtls": "STRICT"}),
        json!({"mtls": {"mode": 1}}),
    ] {
        let k = build(vec![], vec![pa("shop", "x", bad.clone())]);
        assert!(
            !allowed(&k.mesh, &PLAIN, "w-web", 80),
            "{bad} let plaintext in"
        );
        assert!(
            allowed(&k.mesh, &PLAIN, "w-api", 80),
            "{bad} reached another namespace"
        );
    }
    // A STRICT policy whose one port entry cannot be read stays STRICT.
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "x",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "PERMISSIVE"},
                "portLevelMtls": {"http": {"mode": "STRICT"}, "9090": {"mode": "PERMISSIVE"}}}),
        )],
    );
    assert!(
        !allowed(&k.mesh, &PLAIN, "w-web", 80),
        "an unplaceable STRICT entry makes the workload STRICT"
    );
    assert!(
        allowed(&k.mesh, &PLAIN, "w-web", 9090),
        "a readable exception stays"
    );
}

#[test]
fn adversarial_peer_authentication_bad_port_skips_only_that_port() {
    // A STRICT workload policy with unreadable port keys stays STRICT.
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"http": {"mode": "PERMISSIVE"}, "0": {"mode": "PERMISSIVE"},
                    "+80": {"mode": "PERMISSIVE"}, "8080": {"mode": "PERMISSIVE"}}}),
        )],
    );
    assert_eq!(k.mesh.peer_authentications().len(), 1, "{:?}", k.skipped);
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 8080));
    let entries = notes(&k)
        .iter()
        .filter(|n| !n.1 && n.2 == "entry-skipped")
        .count();
    assert_eq!(entries, 3, "{:?}", k.mesh.cluster_policy_notes());
}

#[test]
fn adversarial_authorization_policy_empty_source_or_operation_matches_nothing() {
    // The reference's node proxy skips an empty match: `source: {}`,
    // `from: [{}]`, `operation: {}`, `to: [{}]` never match.
    let allow =
        |rule: Value| kept(json!({"selector": {"matchLabels": {"app": "web"}}, "rules": [rule]}));
    for rule in [
        json!({"from": [{"source": {}}]}),
        json!({"from": [{}]}),
        json!({"to": [{"operation": {}}]}),
        json!({"to": [{}]}),
    ] {
        let k = allow(rule.clone());
        for p in [&DB, &WEB, &PLAIN] {
            assert!(
                !allowed(&k.mesh, p, "w-web", 80),
                "{rule} admitted {}",
                p.ip
            );
        }
        let k = kept(json!({"action": "DENY", "rules": [rule.clone()]}));
        assert!(allowed(&k.mesh, &WEB, "w-web", 80), "{rule} denied");
    }
    // Next to a source that names someone, only that one.
    let k = allow(
        json!({"from": [{"source": {"principals": ["example.org/ns/shop/sa/db"]}},
        {"source": {}}]}),
    );
    assert!(allowed(&k.mesh, &DB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    let k = allow(json!({"to": [{"operation": {"ports": ["8080"]}}, {}]}));
    assert!(allowed(&k.mesh, &WEB, "w-web", 8080));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
}

#[test]
fn adversarial_authorization_policy_spiffe_principal_never_matches() {
    // The reference's node proxy strips `spiffe://` from the peer's ID
    // before matching: a pattern that contains it never matches.
    let db = "spiffe://example.org/ns/shop/sa/db";
    let k = allow_from_kept(json!({"principals": [db]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    let n = k
        .mesh
        .cluster_policy_notes()
        .iter()
        .find(|n| n.code == "entry-never-matches")
        .expect("a note");
    assert_eq!(n.object, "AuthorizationPolicy shop/p");
    assert!(n.reason.contains("spiffe://"), "{}", n.reason);
    let k = allow_from_kept(json!({"principals": [db, "example.org/ns/shop/sa/web"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
    // A suffix that reaches into the scheme, likewise.
    let k = allow_from_kept(json!({"principals": ["*//example.org/ns/shop/sa/db"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    let k = allow_from_kept(json!({"principals": ["spiffe://*"]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    // DENY `principals` denies no one through it.
    let k = deny_from(json!({"principals": [db]}));
    assert!(allowed(&k.mesh, &DB, "w-web", 80));
    let k = kept(json!({"action": "DENY",
        "rules": [{"when": [{"key": "source.principal", "values": [db]}]}]}));
    assert!(allowed(&k.mesh, &DB, "w-web", 80));
    // `notPrincipals` with it excludes no one.
    let k = deny_from(json!({"notPrincipals": [db]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    assert!(!allowed(&k.mesh, &WEB, "w-web", 80));
    let k = deny_from(json!({"ipBlocks": ["10.1.0.6/32"], "notPrincipals": [db]}));
    assert!(!allowed(&k.mesh, &DB, "w-web", 80));
    assert!(allowed(&k.mesh, &WEB, "w-web", 80));
}

#[test]
fn adversarial_peer_authentication_unset_workload_port_disable_keeps_strict() {
    // The reference (`convertedSelectorPeerAuthentications`, mode unset
    // under a STRICT namespace) counts only PERMISSIVE port levels as
    // exceptions: DISABLE on a port leaves it STRICT.
    let web_ports = |ports: Value| {
        build(
            vec![],
            vec![
                pa("shop", "default", strict()),
                pa(
                    "shop",
                    "web",
                    json!({"selector": {"matchLabels": {"app": "web"}}, "portLevelMtls": ports}),
                ),
            ],
        )
    };
    let k = web_ports(json!({"8080": {"mode": "DISABLE"}}));
    assert!(
        !allowed(&k.mesh, &PLAIN, "w-web", 8080),
        "DISABLE opened 8080"
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    let k = web_ports(json!({"8080": {"mode": "PERMISSIVE"}}));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 8080));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    // Under a STRICT workload mode, DISABLE is an exception (as PERMISSIVE).
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "web",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"8080": {"mode": "DISABLE"}}}),
        )],
    );
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 8080));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
}

#[test]
fn adversarial_peer_authentication_permissive_workload_strict_port_stays_strict() {
    // The reference drops this port rule under a STRICT mesh (an operator
    // precedence slip in `convertPeerAuthentication`); ringway keeps it:
    // plaintext to 8080 is refused, to the other ports admitted.
    let k = build(
        vec![],
        vec![
            pa("istio-system", "default", strict()),
            pa(
                "shop",
                "web",
                json!({"selector": {"matchLabels": {"app": "web"}},
                    "mtls": {"mode": "PERMISSIVE"},
                    "portLevelMtls": {"8080": {"mode": "STRICT"}}}),
            ),
        ],
    );
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 8080));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 80));
}

#[test]
fn adversarial_peer_authentication_bad_port_mode_skips_only_that_port() {
    // A STRICT workload policy with an unknown port mode stays STRICT.
    let k = build(
        vec![],
        vec![pa(
            "shop",
            "p",
            json!({"selector": {"matchLabels": {"app": "web"}}, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"8080": {"mode": "SOMETIMES"}, "9090": {"mode": "PERMISSIVE"}}}),
        )],
    );
    assert_eq!(k.mesh.peer_authentications().len(), 1, "{:?}", k.skipped);
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 8080));
    assert!(!allowed(&k.mesh, &PLAIN, "w-web", 80));
    assert!(allowed(&k.mesh, &PLAIN, "w-web", 9090));
}
