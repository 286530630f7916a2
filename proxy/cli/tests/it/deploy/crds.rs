//! The bundled mesh CRDs (AuthorizationPolicy, PeerAuthentication): structural
//! schemas, every field the mesh reads, and admission ([`super::admission`]) agreeing
//! with what the proxy reads.

use std::collections::BTreeMap;

use serde_json::Value as Json;

use super::admission::{admit, cel_rule, schema_fields, schema_nodes, SCHEMA_KEYWORDS};
use super::invariants::check_rbac;
use super::objects::{documents, typed_objects};
use super::render::render_chart;
use super::NAMESPACE;

/// `istioCRDs.install`: the AuthorizationPolicy and PeerAuthentication CRDs, off by
/// default; their group, names and versions are the ones the proxy watches.
#[test]
fn authorization_policy_and_peer_authentication_crds_are_optional() {
    let o = typed_objects(&render_chart("", NAMESPACE).unwrap());
    assert!(o.custom_resource_definitions.is_empty());
    let o = typed_objects(&render_chart("istioCRDs: {install: true}", NAMESPACE).unwrap());
    let names: Vec<&String> = o.custom_resource_definitions.keys().collect();
    assert_eq!(
        names,
        [
            "authorizationpolicies.security.istio.io",
            "peerauthentications.security.istio.io"
        ]
    );
    for (name, kind, plural) in [
        (
            "authorizationpolicies.security.istio.io",
            "AuthorizationPolicy",
            "authorizationpolicies",
        ),
        (
            "peerauthentications.security.istio.io",
            "PeerAuthentication",
            "peerauthentications",
        ),
    ] {
        let spec = &o.custom_resource_definitions[name].spec;
        assert_eq!(spec.group, ringway_config::kube::istio::SECURITY_GROUP);
        assert_eq!(spec.names.kind, kind);
        assert_eq!(spec.names.plural, plural);
        assert_eq!(spec.scope, "Namespaced");
        let versions: Vec<(&str, bool, bool)> = spec
            .versions
            .iter()
            .map(|v| (v.name.as_str(), v.served, v.storage))
            .collect();
        assert_eq!(versions, [("v1", true, true), ("v1beta1", true, false)]);
        for v in &spec.versions {
            let schema = v
                .schema
                .as_ref()
                .unwrap()
                .open_api_v3_schema
                .as_ref()
                .unwrap();
            // A real schema for the spec (pruned, as the mesh's); the status keeps anything.
            let properties = schema.properties.as_ref().unwrap();
            assert_eq!(
                properties["spec"].x_kubernetes_preserve_unknown_fields,
                None
            );
            assert!(properties["spec"].properties.is_some());
            assert_eq!(
                properties["status"].x_kubernetes_preserve_unknown_fields,
                Some(true)
            );
        }
    }
    check_rbac(&o, true);
}

const AP_CRD: &str = "authorizationpolicies.security.istio.io";
const PA_CRD: &str = "peerauthentications.security.istio.io";

/// The `openAPIV3Schema` of each version of the bundled CRDs (`istioCRDs.install`),
/// keyed by (CRD name, version), as rendered.
fn istio_crd_schemas() -> BTreeMap<(String, String), Json> {
    let text = render_chart("istioCRDs: {install: true}", NAMESPACE).unwrap();
    let mut out = BTreeMap::new();
    for (_, doc) in documents(&text) {
        if doc["kind"] != "CustomResourceDefinition" {
            continue;
        }
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        for v in doc["spec"]["versions"].as_array().unwrap() {
            let version = v["name"].as_str().unwrap().to_string();
            let schema = v["schema"]["openAPIV3Schema"].clone();
            assert!(schema.is_object(), "{name} {version}: no openAPIV3Schema");
            out.insert((name.clone(), version), schema);
        }
    }
    assert_eq!(out.len(), 4, "two CRDs, two versions each");
    out
}

/// The CRD of a kind.
fn crd_of(kind: &str) -> &'static str {
    match kind {
        "AuthorizationPolicy" => AP_CRD,
        "PeerAuthentication" => PA_CRD,
        other => panic!("no bundled CRD for {other}"),
    }
}

/// A `security.istio.io` object of `kind` with `spec`, as a cluster holds it.
fn istio_object(kind: &str, version: &str, ns: &str, name: &str, spec: Json) -> Json {
    serde_json::json!({
        "apiVersion": format!("security.istio.io/{version}"),
        "kind": kind,
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    })
}

/// Realistic objects the mesh's own CRDs admit (the shapes of the mesh's documented
/// examples: deny-all, allow-nothing, L4 and L7 rules, a waypoint's and an external
/// authorizer's policy, mesh-wide and per-port mutual TLS).
const MESH_EXAMPLES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-nothing, namespace: shop}
spec: {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: istio-system}
spec:
  action: DENY
  rules:
    - {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-viewer, namespace: shop}
spec:
  selector:
    matchLabels: {app: web, app.kubernetes.io/version: v1}
  action: ALLOW
  rules:
    - from:
        - source:
            principals: ["cluster.local/ns/shop/sa/frontend", "*/ns/shop/sa/admin"]
        - source:
            namespaces: ["monitoring"]
      to:
        - operation:
            ports: ["8080", "9090"]
      when:
        - key: source.ip
          values: ["10.0.0.0/8"]
          notValues: ["10.0.9.0/24"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: by-service-account, namespace: shop}
spec:
  selector:
    matchLabels: {app: db}
  rules:
    - from:
        - source:
            serviceAccounts: ["web", "jobs/backup"]
      to:
        - operation:
            notPorts: ["22"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: http-read-only, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  action: ALLOW
  rules:
    - from:
        - source:
            requestPrincipals: ["https://issuer.example.com/*"]
            notRemoteIpBlocks: ["192.0.2.0/24"]
      to:
        - operation:
            hosts: ["web.shop.svc.cluster.local"]
            methods: ["GET", "HEAD"]
            paths: ["/api/*"]
            notPaths: ["/api/admin*"]
      when:
        - key: request.auth.claims[groups]
          values: ["readers"]
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: block-external, namespace: shop}
spec:
  action: DENY
  rules:
    - from:
        - source:
            notIpBlocks: ["10.0.0.0/8", "fd00::/8"]
            notNamespaces: ["shop"]
      to:
        - operation:
            ports: ["5432"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: waypoint-policy, namespace: shop}
spec:
  targetRefs:
    - kind: Gateway
      group: gateway.networking.k8s.io
      name: waypoint
  action: DENY
  rules:
    - to:
        - operation:
            methods: ["DELETE"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: service-policy, namespace: shop}
spec:
  targetRef: {kind: Service, group: "", name: web}
  rules:
    - from:
        - source:
            principals: ["cluster.local/ns/shop/sa/frontend"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext-authz, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  action: CUSTOM
  provider: {name: my-ext-authz}
  rules:
    - to:
        - operation:
            paths: ["/admin/*"]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit, namespace: shop}
spec:
  action: AUDIT
  rules:
    - to:
        - operation:
            ports: ["443"]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: legacy}
spec:
  mtls: {mode: PERMISSIVE}
---
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: web, namespace: shop}
spec:
  selector:
    matchLabels: {app: web}
  mtls: {mode: STRICT}
  portLevelMtls:
    "8080": {mode: PERMISSIVE}
    "9090": {mode: DISABLE}
    "15021": {mode: UNSET}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: inherit, namespace: shop}
spec: {}
"#;

/// Every object the mapping's tests (config/src/kube/istio/tests.rs) read that the
/// mesh's API admits, by spec: (kind, spec). Entries a node proxy reads as never
/// matching or skips one by one (`+80`, `not-an-ip`, `a*b`, `spiffe://...`) are strings,
/// so the API admits them; the proxy notes them.
fn mapping_test_objects() -> Vec<(&'static str, Json)> {
    use serde_json::json;
    let ap = |spec: Json| ("AuthorizationPolicy", spec);
    let pa = |spec: Json| ("PeerAuthentication", spec);
    let web = json!({"matchLabels": {"app": "web"}});
    let allow_from = |source: Json| {
        ap(json!({"selector": web, "action": "ALLOW", "rules": [{"from": [{"source": source}]}]}))
    };
    let allow_when = |when: Json| ap(json!({"selector": web, "rules": [{"when": [when]}]}));
    let deny_from =
        |source: Json| ap(json!({"action": "DENY", "rules": [{"from": [{"source": source}]}]}));
    let allow_rule = |rule: Json| ap(json!({"selector": web, "rules": [rule]}));
    let with_l7 = |l7: Json| {
        ap(json!({"selector": web, "action": "ALLOW", "rules": [
            l7, {"from": [{"source": {"namespaces": ["other"]}}]}]}))
    };
    let spiffe = "spiffe://example.org/ns/shop/sa/db";
    let mut out = vec![
        // the policy itself
        ap(json!({"action": "DENY", "rules": [{}]})),
        ap(json!({"rules": [{}]})),
        ap(json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["8080"]}}]}]})),
        ap(json!({"selector": {"matchLabels": {"app": "db"}}, "action": "DENY", "rules": [{}]})),
        ap(json!({"selector": web, "action": "DENY", "rules": [{}]})),
        ap(json!({"selector": {"matchLabels": {}}, "action": "DENY", "rules": [{}]})),
        ap(json!({"action": "ALLOW"})),
        ap(json!({"action": "AUDIT", "rules": [{}]})),
        ap(json!({"action": "CUSTOM", "provider": {"name": "ext-authz"}, "rules": [{}]})),
        ap(
            json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io",
            "name": "waypoint"}], "action": "DENY", "rules": [{}]}),
        ),
        ap(
            json!({"targetRef": {"kind": "Service", "group": "", "name": "web"},
            "action": "DENY", "rules": [{}]}),
        ),
        // from.source, to.operation, when
        ap(json!({"rules": [{"to": [{"operation": {"ports": ["8080", "9090"]}}]}]})),
        ap(json!({"rules": [{"to": [{"operation": {"notPorts": ["22"]}}]}]})),
        ap(json!({"rules": [{"when": [{"key": "destination.ip", "values": ["10.1.0.6/32"]}]}]})),
        ap(json!({"rules": [{"when": [{"key": "destination.ip", "notValues": ["10.1.0.6"]}]}]})),
        ap(json!({"rules": [{"when": [{"key": "destination.ip", "values": ["10.3.0.0/16"]}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "destination.ip", "values": ["fd00::/8"]}]}]})),
        ap(json!({"selector": web, "rules": [{
            "from": [{"source": {"namespaces": ["shop"]}}],
            "to": [{"operation": {"ports": ["80"]}}],
            "when": [{"key": "source.ip", "values": ["10.1.0.0/24"]},
                     {"key": "destination.port", "notValues": ["81"]}]}]})),
        ap(json!({"action": "DENY", "rules": [{"from": [{"source":
            {"principals": ["old.example.org/ns/shop/sa/db"]}}]}]})),
        // fail-safe cases: attributes a node proxy cannot see
        ap(json!({"selector": web, "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]})),
        ap(json!({"action": "DENY", "rules": [{"to": [{"operation":
            {"ports": ["8080"], "methods": ["DELETE"], "paths": ["/admin"]}}]}]})),
        ap(json!({"action": "DENY", "rules": [{
            "from": [{"source": {"requestPrincipals": ["issuer/bad"]}}],
            "to": [{"operation": {"ports": ["8080"]}}]}]})),
        ap(json!({"action": "DENY", "rules": [{
            "from": [{"source": {"namespaces": ["shop"]}}],
            "when": [{"key": "request.headers[x-debug]", "values": ["1"]}]}]})),
        // entries read one by one
        ap(json!({"action": "DENY",
            "rules": [{"to": [{"operation": {"ports": ["+80", "http", "99999", "8080"]}}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"to": [{"operation": {"ports": ["+80"]}}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "destination.port", "values": ["+80", "0", "8080"]}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "source.ip", "values": ["nope", "10.1.0.0/16"]}]}]})),
        ap(json!({"action": "DENY",
            "rules": [{"when": [{"key": "source.principal", "values": [spiffe]}]}]})),
        // PeerAuthentication
        pa(json!({"mtls": {"mode": "STRICT"}})),
        pa(json!({"mtls": {"mode": "PERMISSIVE"}})),
        pa(json!({"mtls": {"mode": "DISABLE"}})),
        pa(json!({})),
        pa(json!({"selector": web, "mtls": {"mode": "UNSET"}})),
        pa(json!({"selector": {"matchLabels": {"app": "db"}}, "mtls": {"mode": "PERMISSIVE"}})),
        pa(json!({"selector": web, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}, "9090": {"mode": "DISABLE"}}})),
        pa(json!({"selector": web, "portLevelMtls": {"8443": {"mode": "STRICT"}}})),
        pa(json!({"selector": web, "portLevelMtls": {"8080": {"mode": "DISABLE"}}})),
        pa(json!({"selector": web, "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}}})),
        pa(json!({"selector": web, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"8080": {"mode": "DISABLE"}}})),
        pa(json!({"selector": web, "mtls": {"mode": "PERMISSIVE"},
            "portLevelMtls": {"8080": {"mode": "STRICT"}}})),
        // Go's ParseInt (CEL's int()) reads "+80" as 80: admitted; the proxy skips that
        // entry as the reference's ParseUint does, and keeps the rest.
        pa(json!({"selector": web, "mtls": {"mode": "STRICT"},
            "portLevelMtls": {"+80": {"mode": "PERMISSIVE"}, "8080": {"mode": "PERMISSIVE"}}})),
    ];
    for source in [
        json!({"principals": ["example.org/ns/shop/sa/db"]}),
        json!({"notPrincipals": ["example.org/ns/shop/sa/db"]}),
        json!({"principals": ["*/ns/shop/sa/db"]}),
        json!({"principals": ["example.org/ns/shop/*"]}),
        json!({"principals": ["*"]}),
        json!({"principals": ["cluster.local/ns/shop/sa/db"]}),
        json!({"principals": ["old.example.org/ns/shop/sa/db"]}),
        json!({"principals": ["partner.net/ns/shop/sa/db"]}),
        json!({"namespaces": ["oth*"]}),
        json!({"notNamespaces": ["other"]}),
        json!({"serviceAccounts": ["db", "other/api"]}),
        json!({"notServiceAccounts": ["db"]}),
        json!({"ipBlocks": ["10.9.0.0/16", "10.1.0.6"]}),
        json!({"notIpBlocks": ["10.9.0.0/16"]}),
        json!({"notIpBlocks": ["10.1.2.3/16"]}),
        json!({"principals": ["example.org/ns/shop/sa/db", "a*b"]}),
        json!({"ipBlocks": ["not-an-ip"]}),
        json!({"principals": ["ns/*/sa/x"]}),
        json!({"namespaces": ["Not_A_Namespace"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "ipBlocks": ["nope"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "notIpBlocks": ["nope"]}),
        json!({"principals": [spiffe]}),
        json!({"principals": [spiffe, "example.org/ns/shop/sa/web"]}),
        json!({"principals": ["*//example.org/ns/shop/sa/db"]}),
        json!({"principals": ["spiffe://*"]}),
    ] {
        out.push(allow_from(source));
    }
    for source in [
        json!({"principals": ["example.org/ns/shop/sa/db", "cluster.local/ns/*/sa/x"]}),
        json!({"ipBlocks": ["not-an-ip", "10.0.0.0/8"]}),
        json!({"namespaces": ["Shop", "shop"]}),
        json!({"serviceAccounts": ["a/b/c", "db"]}),
        json!({"ipBlocks": ["10.1.2.3/8"]}),
        json!({"ipBlocks": ["not-an-ip"]}),
        json!({"principals": ["example.org/ns/shop/sa/db"], "ipBlocks": ["nope"]}),
        json!({"principals": [spiffe]}),
        json!({"notPrincipals": [spiffe]}),
        json!({"ipBlocks": ["10.1.0.6/32"], "notPrincipals": [spiffe]}),
    ] {
        out.push(deny_from(source));
    }
    for when in [
        json!({"key": "source.ip", "values": ["10.9.0.0/16"]}),
        json!({"key": "source.ip", "notValues": ["10.9.0.0/16"]}),
        json!({"key": "source.namespace", "values": ["other"]}),
        json!({"key": "source.namespace", "notValues": ["other"]}),
        json!({"key": "source.principal", "values": ["example.org/ns/shop/sa/web"]}),
        json!({"key": "source.principal", "notValues": ["*/sa/web"]}),
        json!({"key": "source.principal", "values": ["cluster.local/ns/shop/sa/db"]}),
        json!({"key": "destination.port", "values": ["8080"]}),
        json!({"key": "destination.port", "notValues": ["8080"]}),
        json!({"key": "source.ip", "values": ["nope"]}),
        json!({"key": "source.ip"}),
    ] {
        out.push(allow_when(when));
    }
    for rule in [
        json!({"to": [{"operation": {"ports": ["0"]}}]}),
        json!({"to": [{"operation": {"ports": ["0", "80"]}}]}),
        json!({"to": [{"operation": {"ports": ["+80"]}}]}),
        json!({"from": [{"source": {}}]}),
        json!({"from": [{}]}),
        json!({"to": [{"operation": {}}]}),
        json!({"to": [{}]}),
        json!({"from": [{"source": {"principals": ["example.org/ns/shop/sa/db"]}},
            {"source": {}}]}),
        json!({"to": [{"operation": {"ports": ["8080"]}}, {}]}),
    ] {
        out.push(allow_rule(rule.clone()));
        out.push(ap(json!({"action": "DENY", "rules": [rule]})));
    }
    for op in [
        json!({"methods": ["GET"]}),
        json!({"notMethods": ["POST"]}),
        json!({"paths": ["/public/*"]}),
        json!({"notPaths": ["/admin"]}),
        json!({"hosts": ["web.shop"]}),
        json!({"notHosts": ["evil"]}),
        json!({"ports": ["80"], "methods": ["GET"]}),
    ] {
        out.push(with_l7(
            json!({"from": [{"source": {"namespaces": ["shop"]}}],
            "to": [{"operation": op}]}),
        ));
    }
    for source in [
        json!({"namespaces": ["shop"], "requestPrincipals": ["issuer/subject"]}),
        json!({"notRequestPrincipals": ["*"]}),
        json!({"remoteIpBlocks": ["10.1.0.0/16"]}),
        json!({"notRemoteIpBlocks": ["10.9.0.0/16"]}),
    ] {
        out.push(with_l7(json!({"from": [{"source": source}]})));
    }
    for key in [
        "request.headers[x-user]",
        "request.auth.claims[groups]",
        "connection.sni",
        "experimental.envoy.filters.network.mysql_proxy[db.table]",
    ] {
        out.push(with_l7(
            json!({"from": [{"source": {"namespaces": ["shop"]}}],
            "when": [{"key": key, "values": ["x"]}]}),
        ));
    }
    out
}

/// Every object a cluster with the mesh's CRDs would hold, from [`MESH_EXAMPLES`] and
/// [`mapping_test_objects`], whole (in namespace `shop`, both versions).
fn admissible_objects() -> Vec<Json> {
    let mut out: Vec<Json> = serde_norway::Deserializer::from_str(MESH_EXAMPLES)
        .map(|d| <Json as k8s_openapi::serde::Deserialize>::deserialize(d).unwrap())
        .collect();
    for (i, (kind, spec)) in mapping_test_objects().into_iter().enumerate() {
        for version in ["v1", "v1beta1"] {
            out.push(istio_object(
                kind,
                version,
                "shop",
                &format!("p{i}"),
                spec.clone(),
            ));
        }
    }
    out
}

fn schema_for<'a>(schemas: &'a BTreeMap<(String, String), Json>, object: &Json) -> &'a Json {
    let kind = object["kind"].as_str().unwrap();
    let version = object["apiVersion"]
        .as_str()
        .unwrap()
        .strip_prefix("security.istio.io/")
        .unwrap();
    &schemas[&(crd_of(kind).to_string(), version.to_string())]
}

/// The bundled schemas are structural as the API server requires (every node typed,
/// `properties` and `additionalProperties` never together), the same for v1 and
/// v1beta1, use only what the test's validator implements (keywords and CEL rules),
/// and keep unknown fields under `status` only: the spec is pruned as the mesh's is.
#[test]
fn bundled_istio_crds_have_structural_schemas_pruning_all_but_status() {
    let schemas = istio_crd_schemas();
    for crd in [AP_CRD, PA_CRD] {
        let v1 = &schemas[&(crd.to_string(), "v1".to_string())];
        let v1beta1 = &schemas[&(crd.to_string(), "v1beta1".to_string())];
        assert_eq!(v1, v1beta1, "{crd}: v1 and v1beta1 have the same shape");
        let mut nodes = Vec::new();
        schema_nodes(v1, "", &mut nodes);
        let mut preserved = Vec::new();
        for (path, node) in &nodes {
            let s = node.as_object().unwrap();
            for k in s.keys() {
                assert!(
                    SCHEMA_KEYWORDS.contains(&k.as_str()),
                    "{crd} {path}: `{k}` is not checked by the test's validator"
                );
            }
            assert!(
                s.contains_key("type") || s.contains_key("x-kubernetes-int-or-string"),
                "{crd} {path}: not structural: every node needs a type"
            );
            assert!(
                !(s.contains_key("properties") && s.contains_key("additionalProperties")),
                "{crd} {path}: properties and additionalProperties together"
            );
            if s.get("x-kubernetes-preserve-unknown-fields") == Some(&Json::Bool(true)) {
                preserved.push(path.clone());
            }
            for r in s
                .get("x-kubernetes-validations")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                cel_rule(r["rule"].as_str().expect("a rule"));
                assert!(r["message"].is_string(), "{crd} {path}: a rule's message");
            }
        }
        assert_eq!(schema_fields(v1, ""), ["spec", "status"], "{crd}");
        assert_eq!(
            preserved,
            ["status"],
            "{crd}: only status keeps unknown fields"
        );
    }
}

/// The fields the mesh's API defines, by place (its CRDs' schemas). The bundled
/// schemas define exactly these: a field the mesh defines is never pruned (the proxy
/// sees every attribute it cannot enforce and omits an ALLOW rule that has one), and
/// no field the mesh lacks is admitted.
const MESH_FIELDS: &[(&str, &str, &[&str])] = &[
    (
        AP_CRD,
        "spec",
        &[
            "action",
            "provider",
            "rules",
            "selector",
            "targetRef",
            "targetRefs",
        ],
    ),
    (AP_CRD, "spec.selector", &["matchLabels"]),
    (
        AP_CRD,
        "spec.targetRef",
        &["group", "kind", "name", "namespace"],
    ),
    (
        AP_CRD,
        "spec.targetRefs[]",
        &["group", "kind", "name", "namespace"],
    ),
    (AP_CRD, "spec.provider", &["name"]),
    (AP_CRD, "spec.rules[]", &["from", "to", "when"]),
    (AP_CRD, "spec.rules[].from[]", &["source"]),
    (
        AP_CRD,
        "spec.rules[].from[].source",
        &[
            "ipBlocks",
            "namespaces",
            "notIpBlocks",
            "notNamespaces",
            "notPrincipals",
            "notRemoteIpBlocks",
            "notRequestPrincipals",
            "notServiceAccounts",
            "principals",
            "remoteIpBlocks",
            "requestPrincipals",
            "serviceAccounts",
        ],
    ),
    (AP_CRD, "spec.rules[].to[]", &["operation"]),
    (
        AP_CRD,
        "spec.rules[].to[].operation",
        &[
            "hosts",
            "methods",
            "notHosts",
            "notMethods",
            "notPaths",
            "notPorts",
            "paths",
            "ports",
        ],
    ),
    (
        AP_CRD,
        "spec.rules[].when[]",
        &["key", "notValues", "values"],
    ),
    (PA_CRD, "spec", &["mtls", "portLevelMtls", "selector"]),
    (PA_CRD, "spec.selector", &["matchLabels"]),
    (PA_CRD, "spec.mtls", &["mode"]),
    (PA_CRD, "spec.portLevelMtls{}", &["mode"]),
];

#[test]
fn bundled_istio_crds_define_every_field_of_the_mesh_and_prune_only_unknown_ones() {
    let schemas = istio_crd_schemas();
    for (crd, path, fields) in MESH_FIELDS {
        let schema = &schemas[&(crd.to_string(), "v1".to_string())];
        assert_eq!(schema_fields(schema, path), *fields, "{crd} {path}");
    }
    // An object that sets every field the mesh defines is admitted whole: nothing pruned.
    let every = serde_json::json!({
        "selector": {"matchLabels": {"app": "web"}},
        "action": "DENY",
        "rules": [{
            "from": [{"source": {
                "principals": ["a"], "notPrincipals": ["b"],
                "requestPrincipals": ["c"], "notRequestPrincipals": ["d"],
                "namespaces": ["e"], "notNamespaces": ["f"],
                "ipBlocks": ["10.0.0.0/8"], "notIpBlocks": ["10.1.0.0/16"],
                "remoteIpBlocks": ["10.2.0.0/16"], "notRemoteIpBlocks": ["10.3.0.0/16"]}},
                {"source": {"serviceAccounts": ["g"], "notServiceAccounts": ["h"]}}],
            "to": [{"operation": {
                "ports": ["80"], "notPorts": ["81"], "hosts": ["i"], "notHosts": ["j"],
                "methods": ["GET"], "notMethods": ["PUT"], "paths": ["/k"], "notPaths": ["/l"]}}],
            "when": [{"key": "source.ip", "values": ["10.0.0.1"], "notValues": ["10.0.0.2"]}]}],
    });
    let custom = serde_json::json!({"action": "CUSTOM", "provider": {"name": "authz"},
        "targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway",
            "name": "waypoint", "namespace": ""}]});
    let target = serde_json::json!({"targetRef": {"group": "", "kind": "Service",
        "name": "web", "namespace": ""}});
    let pa = serde_json::json!({"selector": {"matchLabels": {"app": "web"}},
        "mtls": {"mode": "STRICT"}, "portLevelMtls": {"8080": {"mode": "PERMISSIVE"}}});
    for (kind, spec) in [
        ("AuthorizationPolicy", every),
        ("AuthorizationPolicy", custom),
        ("AuthorizationPolicy", target),
        ("PeerAuthentication", pa),
    ] {
        for version in ["v1", "v1beta1"] {
            let o = istio_object(kind, version, "shop", "every", spec.clone());
            let a = admit(schema_for(&schemas, &o), &o);
            assert!(a.admitted_whole(), "{kind} {version} {spec}: {a:?}");
        }
    }
    // A field the mesh does not define is pruned (or, with kubectl's strict field
    // validation, refused), wherever it is; the status keeps anything.
    let pruned = |kind: &str, spec: Json| {
        let o = istio_object(kind, "v1", "shop", "p", spec);
        admit(schema_for(&schemas, &o), &o)
    };
    for (kind, spec, field) in [
        (
            "AuthorizationPolicy",
            serde_json::json!({"rules": [{"from": [{"source": {"namespaces": ["shop"],
                "newAttribute": ["x"]}}]}]}),
            "spec.rules[0].from[0].source.newAttribute",
        ),
        (
            "AuthorizationPolicy",
            serde_json::json!({"rules": [{"to": [{"operation": {"ports": ["80"],
                "futureField": "x"}}]}]}),
            "spec.rules[0].to[0].operation.futureField",
        ),
        (
            "AuthorizationPolicy",
            serde_json::json!({"rules": [{"from": [{"source": {}}], "nextThing": {}}]}),
            "spec.rules[0].nextThing",
        ),
        (
            "AuthorizationPolicy",
            serde_json::json!({"actions": "DENY"}),
            "spec.actions",
        ),
        (
            "PeerAuthentication",
            serde_json::json!({"mtls": {"mode": "STRICT", "strict": true}}),
            "spec.mtls.strict",
        ),
    ] {
        let a = pruned(kind, spec.clone());
        assert!(a.errors.is_empty(), "{spec}: {a:?}");
        assert_eq!(a.pruned, [field], "{spec}");
    }
    let mut o = istio_object(
        "PeerAuthentication",
        "v1",
        "shop",
        "p",
        serde_json::json!({}),
    );
    o["status"] = serde_json::json!({"conditions": [{"type": "Reconciled"}], "anything": 1});
    let a = admit(schema_for(&schemas, &o), &o);
    assert!(a.admitted_whole(), "{a:?}");
}

/// Realistic objects, and every object of the mapping's tests that the mesh's API
/// admits, are admitted whole by both versions of the bundled CRDs.
#[test]
fn bundled_istio_crds_admit_what_the_mesh_admits() {
    let schemas = istio_crd_schemas();
    let objects = admissible_objects();
    assert!(objects.len() > 150, "{}", objects.len());
    for o in &objects {
        let a = admit(schema_for(&schemas, o), o);
        assert!(a.admitted_whole(), "{o}: {a:?}");
    }
}

/// Malformed objects are refused at admission, each for its own reason (the path of
/// the error): what the mesh's own CRDs refuse.
#[test]
fn bundled_istio_crds_refuse_malformed_objects_at_admission() {
    use serde_json::json;
    let schemas = istio_crd_schemas();
    let web = json!({"matchLabels": {"app": "web"}});
    let ap = "AuthorizationPolicy";
    let pa = "PeerAuthentication";
    let many_labels: serde_json::Map<String, Json> =
        (0..4097).map(|i| (format!("l{i}"), json!("v"))).collect();
    let cases: Vec<(&str, Json, &str)> = vec![
        // Enums: as the API defines them, upper case.
        (ap, json!({"action": "deny", "rules": [{}]}), "spec.action: Unsupported value"),
        (ap, json!({"action": "PERMIT", "rules": [{}]}), "spec.action: Unsupported value"),
        (pa, json!({"mtls": {"mode": "strict"}}), "spec.mtls.mode: Unsupported value"),
        (pa, json!({"mtls": {"mode": "SOMETIMES"}}), "spec.mtls.mode: Unsupported value"),
        (
            pa,
            json!({"selector": web, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"8080": {"mode": "SOMETIMES"}, "9090": {"mode": "PERMISSIVE"}}}),
            "spec.portLevelMtls[8080].mode: Unsupported value",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"8080": {"mode": "permissive"}}}),
            "spec.portLevelMtls[8080].mode: Unsupported value",
        ),
        // Ports: strings, as in the mesh's API.
        (
            ap,
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": [{"number": 22}]}}]}]}),
            "spec.rules[0].to[0].operation.ports[0]: Invalid value: {\"number\":22}: must be of type string",
        ),
        (
            ap,
            json!({"action": "DENY", "rules": [{"to": [{"operation": {"ports": [22]}}]}]}),
            "spec.rules[0].to[0].operation.ports[0]: Invalid value: 22: must be of type string",
        ),
        (
            ap,
            json!({"rules": [{"to": [{"operation": {"notPorts": [8080]}}]}]}),
            "spec.rules[0].to[0].operation.notPorts[0]: Invalid value: 8080",
        ),
        (
            ap,
            json!({"rules": [{"when": [{"key": "destination.port", "values": [8080]}]}]}),
            "spec.rules[0].when[0].values[0]: Invalid value: 8080",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"8080": "STRICT"}}),
            "spec.portLevelMtls[8080]: Invalid value: \"STRICT\": must be of type object",
        ),
        // Conditions name their attribute.
        (
            ap,
            json!({"rules": [{"when": [{"values": ["10.0.0.0/8"]}]}]}),
            "spec.rules[0].when[0].key: Required value",
        ),
        (
            ap,
            json!({"rules": [{"when": [{"key": null, "values": ["x"]}]}]}),
            "spec.rules[0].when[0].key: Required value",
        ),
        // Selectors: string maps, no wildcards, no empty keys, bounded.
        (
            ap,
            json!({"selector": {"matchLabels": {"app": 1}}, "action": "DENY"}),
            "spec.selector.matchLabels[app]: Invalid value: 1: must be of type string",
        ),
        (
            pa,
            json!({"selector": {"matchLabels": {"strict": true}}, "mtls": {"mode": "STRICT"}}),
            "spec.selector.matchLabels[strict]: Invalid value: true: must be of type string",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": ["app=web"]}}),
            "spec.selector.matchLabels: Invalid value: [\"app=web\"]: must be of type object",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": {"app": "web-*"}}}),
            "spec.selector.matchLabels[app]: Invalid value: wildcard not allowed in label value",
        ),
        (
            pa,
            json!({"selector": {"matchLabels": {"app*": "web"}}}),
            "spec.selector.matchLabels: Invalid value: wildcard not allowed in label key",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": {"": "web"}}}),
            "spec.selector.matchLabels: Invalid value: key must not be empty",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": {"app": "w".repeat(64)}}}),
            "spec.selector.matchLabels[app]: Too many: 64 characters",
        ),
        (
            ap,
            json!({"selector": {"matchLabels": many_labels}}),
            "spec.selector.matchLabels: Too many: 4097 properties",
        ),
        // Lists of strings.
        (
            ap,
            json!({"rules": [{"from": [{"source": {"principals": "cluster.local/ns/a/sa/b"}}]}]}),
            "spec.rules[0].from[0].source.principals: Invalid value",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"namespaces": [["shop"]]}}]}]}),
            "spec.rules[0].from[0].source.namespaces[0]: Invalid value",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"serviceAccounts":
                (0..17).map(|i| format!("sa{i}")).collect::<Vec<_>>()}}]}]}),
            "spec.rules[0].from[0].source.serviceAccounts: Too many: 17 items",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"serviceAccounts": ["web"],
                "namespaces": ["shop"]}}]}]}),
            "spec.rules[0].from[0].source: Invalid value: Cannot set serviceAccounts",
        ),
        (
            ap,
            json!({"rules": [{"from": [{"source": {"notServiceAccounts": ["web"],
                "principals": ["cluster.local/ns/shop/sa/x"]}}]}]}),
            "spec.rules[0].from[0].source: Invalid value: Cannot set serviceAccounts",
        ),
        // Shapes.
        (ap, json!({"action": "DENY", "rules": "everything"}), "spec.rules: Invalid value"),
        (ap, json!({"selector": web, "rules": "everything"}), "spec.rules: Invalid value"),
        (ap, json!("everything"), "spec: Invalid value"),
        (pa, json!({"mtls": "STRICT"}), "spec.mtls: Invalid value"),
        (ap, json!({"rules": [{"from": {"source": {}}}]}), "spec.rules[0].from: Invalid value"),
        (
            ap,
            json!({"rules": (0..513).map(|_| json!({})).collect::<Vec<_>>()}),
            "spec.rules: Too many: 513 items",
        ),
        // Targets: whole references, one way of choosing the workloads.
        (
            ap,
            json!({"targetRef": {"kind": "Service"}, "action": "DENY"}),
            "spec.targetRef.name: Required value",
        ),
        (
            ap,
            json!({"targetRefs": [{"name": "waypoint"}], "action": "DENY"}),
            "spec.targetRefs[0].kind: Required value",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Service", "name": ""}}),
            "spec.targetRef.name: Too few: 0 characters",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Not A Kind", "name": "web"}}),
            "spec.targetRef.kind: Invalid value: \"Not A Kind\": should match",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Service", "group": "Core", "name": "web"}}),
            "spec.targetRef.group: Invalid value: \"Core\": should match",
        ),
        (
            ap,
            json!({"targetRefs": [{"kind": "Gateway", "name": "w", "namespace": "other"}]}),
            "spec.targetRefs[0].namespace: Invalid value: cross namespace",
        ),
        (
            ap,
            json!({"selector": web, "targetRefs": [{"kind": "Gateway", "name": "w"}]}),
            "spec: Invalid value: only one of targetRefs or selector",
        ),
        (
            ap,
            json!({"targetRef": {"kind": "Service", "name": "web"},
                "targetRefs": [{"kind": "Gateway", "name": "w"}]}),
            "spec: Invalid value: only one of targetRefs or selector",
        ),
        (
            ap,
            json!({"action": "CUSTOM", "provider": {"name": 7}}),
            "spec.provider.name: Invalid value",
        ),
        // Port-level modes: port keys, with a selector.
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"http": {"mode": "STRICT"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"0": {"mode": "STRICT"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {"65536": {"mode": "STRICT"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"selector": web, "mtls": {"mode": "STRICT"},
                "portLevelMtls": {"http": {"mode": "PERMISSIVE"}, "0": {"mode": "PERMISSIVE"},
                    "+80": {"mode": "PERMISSIVE"}, "8080": {"mode": "PERMISSIVE"}}}),
            "spec.portLevelMtls: Invalid value: port must be between 1-65535",
        ),
        (
            pa,
            json!({"portLevelMtls": {"8443": {"mode": "STRICT"}}}),
            "spec: Invalid value: portLevelMtls requires selector",
        ),
        (
            pa,
            json!({"selector": {"matchLabels": {}}, "portLevelMtls": {"8443": {"mode": "STRICT"}}}),
            "spec: Invalid value: portLevelMtls requires selector",
        ),
        (
            pa,
            json!({"selector": web, "portLevelMtls": {}}),
            "spec.portLevelMtls: Too few: 0 properties",
        ),
    ];
    for (kind, spec, want) in cases {
        for version in ["v1", "v1beta1"] {
            let o = istio_object(kind, version, "shop", "bad", spec.clone());
            let a = admit(schema_for(&schemas, &o), &o);
            assert!(
                a.errors.iter().any(|e| e.starts_with(want)),
                "{kind} {version} {spec}: not refused with {want:?}: {a:?}"
            );
        }
    }
}

/// The proxy reads whole every object the bundled CRDs admit: none of them is an
/// object it cannot read (`invalid`, `unreadable-deny-all`, `unreadable-strict`, `unknown-mode-strict`). Ports are strings on both
/// sides (the schema refuses a number, as the mesh's does).
#[test]
fn every_object_the_bundled_crds_admit_is_read_by_the_proxy() {
    let schemas = istio_crd_schemas();
    let base = ringway_config::MeshConfig::load_str("{}", "config.yaml", &ringway_config::NoEnv)
        .expect("an empty configuration");
    for o in admissible_objects() {
        assert!(admit(schema_for(&schemas, &o), &o).admitted_whole(), "{o}");
        let mut cluster = ringway_config::kube::Cluster::default();
        match o["kind"].as_str().unwrap() {
            "AuthorizationPolicy" => {
                cluster.authorization_policies = vec![std::sync::Arc::new(
                    serde_json::from_value(o.clone()).unwrap(),
                )]
            }
            _ => {
                cluster.peer_authentications = vec![std::sync::Arc::new(
                    serde_json::from_value(o.clone()).unwrap(),
                )]
            }
        }
        let k = ringway_config::kube::build_mesh(&base, &cluster, &Default::default());
        let unread: Vec<_> = k
            .mesh
            .cluster_policy_notes()
            .iter()
            .filter(|n| {
                matches!(
                    n.code,
                    "invalid" | "unreadable-deny-all" | "unreadable-strict" | "unknown-mode-strict"
                )
            })
            .collect();
        assert!(unread.is_empty(), "admitted but not read: {o}: {unread:?}");
    }
}
