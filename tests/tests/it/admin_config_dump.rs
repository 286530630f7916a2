//! The admin endpoint's `GET /config_dump` in the reference node proxy's
//! shape (`workloads`, `services`, `policies`, `certificates`, as
//! `istioctl ztunnel-config` reads them), served over HTTP from a real
//! proxy and parsed back: every field ringway says it fills, for each kind,
//! from a mesh with both file entries and control-plane (xDS-style) ones,
//! and each checked against the types istioctl decodes the dump into.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ringway_config::{
    Action, AuthorizationPolicy, Cidr, Clause, Locality, Match, MatchFields, MeshConfig, NoEnv,
    Rule, Service, ServiceAccountRef, StringMatch, Unsupported, Workload,
};
use ringway_identity::{CaSigner, Identity, IdentityManager, TrustBundle};
use ringway_proxy::control::ControlServer;
use ringway_testbed::run_isolated;
use serde_json::{json, Value};

use crate::common;

const FILE: &str = r#"
trustDomain: cluster.local
rootNamespace: istio-system
clusterId: cluster-7
workloads:
  - uid: file-web-0
    name: web-0
    namespace: shop
    serviceAccount: web
    ips: [10.244.1.2]
    node: node-a
    tunnel: true
    labels: {app: web, version: v1}
    locality: {region: eu-west1, zone: eu-west1-b}
  - uid: file-legacy-0
    name: legacy-0
    namespace: legacy
    ips: [10.244.2.9]
    node: node-b
    healthy: false
services:
  - hostname: web.shop.svc.cluster.local
    namespace: shop
    vips: [10.96.0.20]
    ports: {80: 8080}
    endpoints: [file-web-0]
policies:
  - name: require-mtls
    action: DENY
    rules:
      - from:
          - notPrincipals: ["*"]
            notIpBlocks: [10.244.2.9/32]
  - name: web-from-frontend
    namespace: shop
    selector:
      workloads: [web-0]
    action: ALLOW
    rules:
      - from:
          - principals: ["spiffe://cluster.local/ns/front/sa/frontend"]
          - namespaces: ["front-*"]
        to:
          - ports: [8080]
        when:
          - key: destination.ip
            values: [10.244.1.0/24]
  - name: no-debug
    namespace: shop
    action: DENY
    rules:
      - to:
          - ports: [9090]
"#;

/// The control plane's entries, added the way the xDS client adds them.
fn xds_entries(mesh: &ringway_config::Mesh) -> ringway_config::Mesh {
    let mut edit = mesh.edit();
    edit.upsert_service(Service {
        load_balancing: None,
        hostname: "reviews.bookinfo.svc.cluster.local".into(),
        namespace: "bookinfo".into(),
        vips: vec!["10.96.0.30".parse().unwrap()],
        ports: BTreeMap::from([(9080, 9080), (9443, 0)]),
        unsupported: Some(Unsupported::Waypoint(
            "bookinfo/waypoint.bookinfo.svc.cluster.local:15008".into(),
        )),
    });
    edit.upsert_workload(
        Workload {
            host_network: false,
            uid: "Kubernetes//Pod/bookinfo/reviews-v2-5b6".into(),
            name: "reviews-v2-5b6".into(),
            namespace: "bookinfo".into(),
            service_account: "bookinfo-reviews".into(),
            ips: vec!["10.244.3.7".parse().unwrap()],
            node: "node-c".into(),
            tunnel: true,
            healthy: true,
            labels: BTreeMap::new(),
            locality: Locality {
                subzone: String::new(),
                region: "us-east1".into(),
                zone: "us-east1-c".into(),
            },
            workload_name: "reviews-v2".into(),
            trust_domain: Some("other.example".into()),
            canonical: Some(("reviews".into(), "v2".into())),
            unsupported: Some(Unsupported::Waypoint("10.96.0.40:15008".into())),
            authorization_policies: vec![Arc::from("bookinfo/audit-reviews")],
        },
        BTreeMap::from([(
            "bookinfo/reviews.bookinfo.svc.cluster.local".to_string(),
            BTreeMap::from([(9443, 8443)]),
        )]),
    );
    let mut p = AuthorizationPolicy::new("bookinfo", "audit-reviews", Action::Deny);
    p.listed = true;
    p.dry_run = true;
    p.origin = Some("xds:bookinfo/audit-reviews".into());
    p.rules = vec![Rule {
        clauses: vec![
            Clause {
                matches: vec![
                    Match::Fields(Box::new(MatchFields {
                        principals: vec![StringMatch::Prefix("spiffe://cluster.local/ns/".into())],
                        service_accounts: vec![ServiceAccountRef {
                            namespace: "bookinfo".into(),
                            name: "productpage".into(),
                        }],
                        not_source_ips: vec![Cidr::parse("10.0.0.0/8").unwrap()],
                        ..MatchFields::default()
                    })),
                    Match::Always,
                ],
            },
            Clause {
                matches: vec![Match::Fields(Box::new(MatchFields {
                    destination_ports: vec![9080],
                    namespaces: vec![StringMatch::Any],
                    ..MatchFields::default()
                }))],
            },
        ],
        ..Rule::default()
    }];
    edit.upsert_policy(p);
    edit.finish()
}

fn find<'a>(list: &'a Value, key: &str, value: &str) -> &'a Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .find(|e| e[key] == value)
        .unwrap_or_else(|| panic!("no {key}={value} in {list:#}"))
}

#[test]
fn config_dump_has_the_reference_workloads_services_policies_and_certificates() {
    run_isolated(
        "config_dump_has_the_reference_workloads_services_policies_and_certificates",
        || {
            common::init_logs();
            let file = MeshConfig::load_str(FILE, "admin_config_dump", &NoEnv).unwrap();
            let mesh = Arc::new(xds_entries(&file));
            let proxy = Arc::new(
                ringway_proxy::Proxy::start(common::settings(
                    ringway_config::CaptureMode::Tproxy,
                    ringway_config::Datapath::Auto,
                ))
                .unwrap(),
            );
            proxy.set_mesh(mesh);
            let ca = CaSigner::generate_for_tests("cluster.local");
            let ca_pem_der = ca.cert().clone();
            let ids = Arc::new(
                IdentityManager::new(
                    ca,
                    TrustBundle::new(),
                    "cluster.local",
                    Duration::from_secs(3600),
                )
                .unwrap(),
            );
            let web = Identity::new("cluster.local", "shop", "web");
            let issued = ids.fetch(&web).unwrap();
            let waiting = Identity::new("cluster.local", "legacy", "default");
            assert!(ids.cached(&waiting).is_err(), "never issues");
            proxy.set_identity(Some(ids));
            let admin = ControlServer::serve(
                "127.0.0.1:0".parse().unwrap(),
                ringway_proxy::control::admin_handler(proxy.clone(), Arc::new(|_: &str| Ok(()))),
            )
            .unwrap();
            let r = ringway_testbed::http::request(admin.addr, "GET", "/config_dump", &[]).unwrap();
            assert_eq!(r.status, 200, "{}", r.body);
            let dump: Value = serde_json::from_str(&r.body).unwrap();
            // ringway's own keys stay.
            for key in ["settings", "datapath", "pods", "mesh", "hbone", "stats"] {
                assert!(dump.get(key).is_some(), "{key} missing");
            }
            // Every key of the four lists that istioctl decodes has the
            // JSON type it decodes into; the others are ringway's, named.
            let (wrong, unknown) = against_istioctl(&dump);
            assert!(wrong.is_empty(), "istioctl could not decode: {wrong:#?}");
            assert_eq!(
                unknown,
                [
                    "policies[].dryRun",
                    "policies[].rules[][][].unreadable",
                    "services[].endpoints{}.status",
                    "services[].waypoint.hboneMtlsPort",
                    "workloads[].services",
                    "workloads[].waypoint.hboneMtlsPort",
                ]
                .map(String::from)
                .into(),
                "keys istioctl does not decode (ARCHITECTURE.md names them)"
            );

            // --- workloads ------------------------------------------------
            let workloads = &dump["workloads"];
            assert_eq!(workloads.as_array().unwrap().len(), 3, "{workloads:#}");
            let w = find(workloads, "uid", "file-web-0");
            let want = json!({
                "uid": "file-web-0",
                "workloadIps": ["10.244.1.2"],
                "protocol": "HBONE",
                "name": "web-0",
                "namespace": "shop",
                "serviceAccount": "web",
                "workloadName": "web-0",
                "workloadType": "pod",
                "canonicalName": "web",
                "canonicalRevision": "v1",
                "clusterId": "cluster-7",
                "trustDomain": "cluster.local",
                "locality": {"region": "eu-west1", "zone": "eu-west1-b"},
                "node": "node-a",
                "status": "Healthy",
                // Selected by name: listed on the workload, as the reference.
                "authorizationPolicies": ["shop/web-from-frontend"],
                "services": ["shop/web.shop.svc.cluster.local"],
            });
            assert_eq!(w, &want, "{w:#}");
            let legacy = find(workloads, "uid", "file-legacy-0");
            assert_eq!(legacy["protocol"], "TCP");
            assert_eq!(legacy["status"], "Unhealthy");
            assert_eq!(legacy["serviceAccount"], "default");
            assert_eq!(legacy["canonicalName"], "legacy-0");
            assert_eq!(legacy["canonicalRevision"], "latest");
            for absent in ["locality", "waypoint", "authorizationPolicies", "services"] {
                assert!(legacy.get(absent).is_none(), "{absent}: {legacy:#}");
            }
            let reviews = find(workloads, "uid", "Kubernetes//Pod/bookinfo/reviews-v2-5b6");
            let want = json!({
                "uid": "Kubernetes//Pod/bookinfo/reviews-v2-5b6",
                "workloadIps": ["10.244.3.7"],
                "waypoint": {"destination": "/10.96.0.40", "hboneMtlsPort": 15008},
                "protocol": "HBONE",
                "name": "reviews-v2-5b6",
                "namespace": "bookinfo",
                "serviceAccount": "bookinfo-reviews",
                "workloadName": "reviews-v2",
                "workloadType": "pod",
                "canonicalName": "reviews",
                "canonicalRevision": "v2",
                "clusterId": "cluster-7",
                "trustDomain": "other.example",
                "locality": {"region": "us-east1", "zone": "us-east1-c"},
                "node": "node-c",
                "status": "Healthy",
                "authorizationPolicies": ["bookinfo/audit-reviews"],
                "services": ["bookinfo/reviews.bookinfo.svc.cluster.local"],
            });
            assert_eq!(reviews, &want, "{reviews:#}");

            // --- services -------------------------------------------------
            let services = &dump["services"];
            assert_eq!(services.as_array().unwrap().len(), 2, "{services:#}");
            let s = find(services, "hostname", "web.shop.svc.cluster.local");
            let want = json!({
                "name": "web",
                "namespace": "shop",
                "hostname": "web.shop.svc.cluster.local",
                "vips": ["/10.96.0.20"],
                "ports": {"80": 8080},
                "endpoints": {
                    "file-web-0": {"workloadUid": "file-web-0", "port": {"80": 8080}, "status": "Healthy"},
                },
            });
            assert_eq!(s, &want, "{s:#}");
            let s = find(services, "hostname", "reviews.bookinfo.svc.cluster.local");
            let want = json!({
                "name": "reviews",
                "namespace": "bookinfo",
                "hostname": "reviews.bookinfo.svc.cluster.local",
                "vips": ["/10.96.0.30"],
                "ports": {"9080": 9080, "9443": 0},
                // The endpoint's own target port over the service's.
                "endpoints": {
                    "Kubernetes//Pod/bookinfo/reviews-v2-5b6": {
                        "workloadUid": "Kubernetes//Pod/bookinfo/reviews-v2-5b6",
                        "port": {"9080": 9080, "9443": 8443},
                        "status": "Healthy",
                    },
                },
                "waypoint": {
                    "destination": "bookinfo/waypoint.bookinfo.svc.cluster.local",
                    "hboneMtlsPort": 15008,
                },
            });
            assert_eq!(s, &want, "{s:#}");

            // --- policies -------------------------------------------------
            let policies = &dump["policies"];
            assert_eq!(policies.as_array().unwrap().len(), 4, "{policies:#}");
            let p = find(policies, "name", "require-mtls");
            let want = json!({
                "name": "require-mtls",
                "namespace": "istio-system",
                "scope": "Global",
                "action": "Deny",
                "rules": [[[{"notPrincipals": [{"Presence": []}], "notSourceIps": ["10.244.2.9/32"]}]]],
                "dryRun": false,
            });
            assert_eq!(p, &want, "{p:#}");
            let p = find(policies, "name", "web-from-frontend");
            let want = json!({
                "name": "web-from-frontend",
                "namespace": "shop",
                "scope": "WorkloadSelector",
                "action": "Allow",
                // from (any source), to, then each `when` as a clause.
                "rules": [[
                    [
                        {"principals": [{"Exact": "cluster.local/ns/front/sa/frontend"}]},
                        {"namespaces": [{"Prefix": "front-"}]},
                    ],
                    [{"destinationPorts": [8080]}],
                    [{"destinationIps": ["10.244.1.0/24"]}],
                ]],
                "dryRun": false,
            });
            assert_eq!(p, &want, "{p:#}");
            let p = find(policies, "name", "no-debug");
            assert_eq!(p["scope"], "Namespace");
            assert_eq!(p["rules"], json!([[[{"destinationPorts": [9090]}]]]));
            let p = find(policies, "name", "audit-reviews");
            let want = json!({
                "name": "audit-reviews",
                "namespace": "bookinfo",
                "scope": "WorkloadSelector",
                "action": "Deny",
                "rules": [[
                    [
                        {
                            "principals": [{"Prefix": "cluster.local/ns/"}],
                            "serviceAccounts": [{"namespace": "bookinfo", "serviceAccount": "productpage"}],
                            "notSourceIps": ["10.0.0.0/8"],
                        },
                        {"unreadable": "matchesAll"},
                    ],
                    [{"namespaces": [{"Presence": []}], "destinationPorts": [9080]}],
                ]],
                "dryRun": true,
            });
            assert_eq!(p, &want, "{p:#}");

            // --- certificates ---------------------------------------------
            let certs = dump["certificates"].as_array().unwrap();
            assert_eq!(certs.len(), 2, "{certs:#?}");
            let c = &certs[0];
            assert_eq!(c["identity"], "spiffe://cluster.local/ns/legacy/sa/default");
            assert_eq!(c["state"], "Initializing");
            assert_eq!(c["certChain"], json!([]));
            assert_eq!(c["rootCerts"], json!([]));
            let c = &certs[1];
            assert_eq!(c["identity"], web.to_string());
            assert_eq!(c["state"], "Available");
            // The leaf alone: the CA that signed it is the root.
            let chain = c["certChain"].as_array().unwrap();
            assert_eq!(chain.len(), 1, "{c:#}");
            let roots = c["rootCerts"].as_array().unwrap();
            assert_eq!(roots.len(), 1, "{c:#}");
            let der_of = |entry: &Value| {
                let pem_text =
                    String::from_utf8(decode_base64(entry["pem"].as_str().unwrap())).unwrap();
                let lines: Vec<&str> = pem_text.lines().collect();
                assert_eq!(lines.first(), Some(&"-----BEGIN CERTIFICATE-----"));
                assert_eq!(lines.last(), Some(&"-----END CERTIFICATE-----"));
                decode_base64(&lines[1..lines.len() - 1].concat())
            };
            assert_eq!(der_of(&chain[0]), issued.chain()[0].as_ref());
            assert_eq!(der_of(&roots[0]), ca_pem_der.as_ref());
            let leaf = &chain[0];
            let serial = leaf["serialNumber"].as_str().unwrap();
            assert!(serial.bytes().all(|b| b.is_ascii_digit()), "{serial}");
            assert_eq!(
                hex_of_decimal(serial),
                issued.serial().to_ascii_lowercase().trim_start_matches('0'),
                "the decimal serial is the leaf's"
            );
            assert_eq!(
                leaf["expirationTime"],
                ringway_identity::rfc3339(issued.not_after())
            );
            assert_eq!(
                leaf["validFrom"],
                ringway_identity::rfc3339(issued.not_before())
            );
            assert!(leaf["validFrom"].as_str().unwrap().ends_with('Z'));
        },
    );
}

/// Standard base64 (padded) to bytes, written here so the test does not
/// reuse the code it checks.
fn decode_base64(s: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut out = Vec::new();
    for chunk in s.as_bytes().chunks(4) {
        let digits: Vec<u32> = chunk
            .iter()
            .filter(|c| **c != b'=')
            .map(|c| value(*c))
            .collect();
        let n = digits.iter().fold(0u32, |n, d| (n << 6) | d) << (6 * (4 - digits.len()));
        out.extend(&n.to_be_bytes()[1..digits.len()]);
    }
    out
}

/// A decimal number's hex digits (lowercase, no leading zeros).
fn hex_of_decimal(dec: &str) -> String {
    let mut bytes: Vec<u8> = Vec::new(); // big-endian
    for d in dec.bytes() {
        let mut carry = u32::from(d - b'0');
        for b in bytes.iter_mut().rev() {
            let v = u32::from(*b) * 10 + carry;
            *b = (v & 0xff) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            bytes.insert(0, (carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.trim_start_matches('0').to_owned()
}

/// A JSON type as Go's `encoding/json` decodes it into istioctl's types.
enum Go {
    Str,
    /// An unsigned integer (`uint16`, `uint32`, `int`).
    Num,
    /// `any`.
    Any,
    List(&'static Go),
    /// A struct: its fields by JSON name.
    Struct(&'static [(&'static str, Go)]),
    /// `map[string]T`.
    Map(&'static Go),
    /// `map[uint16]T`: keys are port numbers.
    PortMap(&'static Go),
}

// The types `istioctl ztunnel-config` decodes the dump into, as read in
// istio/istio `istioctl/pkg/writer/ztunnel/configdump/api.go` at d929cf5
// (field names and types only).
const GATEWAY: Go = Go::Struct(&[("destination", Go::Str)]);
const WORKLOAD: Go = Go::Struct(&[
    ("uid", Go::Str),
    ("workloadIps", Go::List(&Go::Str)),
    ("waypoint", GATEWAY),
    ("networkGateway", GATEWAY),
    ("protocol", Go::Str),
    ("name", Go::Str),
    ("namespace", Go::Str),
    ("serviceAccount", Go::Str),
    ("workloadName", Go::Str),
    ("workloadType", Go::Str),
    ("canonicalName", Go::Str),
    ("canonicalRevision", Go::Str),
    ("clusterId", Go::Str),
    ("trustDomain", Go::Str),
    (
        "locality",
        Go::Struct(&[("region", Go::Str), ("zone", Go::Str), ("subzone", Go::Str)]),
    ),
    ("node", Go::Str),
    ("network", Go::Str),
    ("status", Go::Str),
    ("hostname", Go::Str),
    ("capacity", Go::Num),
    (
        "applicationTunnel",
        Go::Struct(&[("protocol", Go::Str), ("port", Go::Num)]),
    ),
    ("authorizationPolicies", Go::List(&Go::Str)),
]);
const SERVICE: Go = Go::Struct(&[
    ("name", Go::Str),
    ("namespace", Go::Str),
    ("hostname", Go::Str),
    ("vips", Go::List(&Go::Str)),
    ("ports", Go::Map(&Go::Num)),
    (
        "loadBalancer",
        Go::Struct(&[
            ("mode", Go::Str),
            ("routingPreferences", Go::List(&Go::Str)),
            ("healthPolicy", Go::Str),
        ]),
    ),
    ("waypoint", GATEWAY),
    (
        "endpoints",
        Go::Map(&Go::Struct(&[
            ("workloadUid", Go::Str),
            ("service", Go::Str),
            ("address", Go::Str),
            ("port", Go::PortMap(&Go::Num)),
        ])),
    ),
    ("subjectAltNames", Go::List(&Go::Str)),
    ("ipFamilies", Go::Str),
]);
const STRING_MATCH: Go = Go::List(&Go::Struct(&[
    ("Exact", Go::Str),
    ("Suffix", Go::Str),
    ("Prefix", Go::Str),
    ("Presence", Go::Any),
]));
const ACCOUNTS: Go = Go::List(&Go::Struct(&[
    ("namespace", Go::Str),
    ("serviceAccount", Go::Str),
]));
const MATCH: Go = Go::Struct(&[
    ("namespaces", STRING_MATCH),
    ("notNamespaces", STRING_MATCH),
    ("principals", STRING_MATCH),
    ("notPrincipals", STRING_MATCH),
    ("sourceIps", Go::List(&Go::Str)),
    ("notSourceIps", Go::List(&Go::Str)),
    ("destinationIps", Go::List(&Go::Str)),
    ("notDestinationIps", Go::List(&Go::Str)),
    ("destinationPorts", Go::List(&Go::Num)),
    ("notDestinationPorts", Go::List(&Go::Num)),
    ("serviceAccounts", ACCOUNTS),
    ("notServiceAccounts", ACCOUNTS),
]);
const POLICY: Go = Go::Struct(&[
    ("name", Go::Str),
    ("namespace", Go::Str),
    ("scope", Go::Str),
    ("action", Go::Str),
    ("rules", Go::List(&Go::List(&Go::List(&MATCH)))),
]);
const CERT: Go = Go::List(&Go::Struct(&[
    ("pem", Go::Str),
    ("serialNumber", Go::Str),
    ("validFrom", Go::Str),
    ("expirationTime", Go::Str),
]));
const CERTS: Go = Go::Struct(&[
    ("identity", Go::Str),
    ("state", Go::Str),
    ("certChain", CERT),
    ("rootCerts", CERT),
]);

/// Checks the dump's four reference lists against istioctl's types: the
/// values Go could not decode (path and why), and the keys it does not know
/// (paths, indexes left out).
fn against_istioctl(dump: &Value) -> (Vec<String>, std::collections::BTreeSet<String>) {
    fn walk(
        v: &Value,
        t: &Go,
        at: &str,
        wrong: &mut Vec<String>,
        unknown: &mut std::collections::BTreeSet<String>,
    ) {
        if v.is_null() {
            return; // Go decodes null into anything.
        }
        match (t, v) {
            (Go::Any, _) | (Go::Str, Value::String(_)) => {}
            (Go::Num, Value::Number(n)) if n.is_u64() => {}
            (Go::List(t), Value::Array(items)) => {
                for i in items {
                    walk(i, t, &format!("{at}[]"), wrong, unknown);
                }
            }
            (Go::Struct(fields), Value::Object(o)) => {
                for (k, v) in o {
                    let path = format!("{at}.{k}");
                    match fields.iter().find(|(name, _)| name == k) {
                        Some((_, t)) => walk(v, t, &path, wrong, unknown),
                        None => {
                            unknown.insert(path.trim_start_matches('.').to_owned());
                        }
                    }
                }
            }
            (Go::Map(t), Value::Object(o)) => {
                for v in o.values() {
                    walk(v, t, &format!("{at}{{}}"), wrong, unknown);
                }
            }
            (Go::PortMap(t), Value::Object(o)) => {
                for (k, v) in o {
                    if k.parse::<u16>().is_err() {
                        wrong.push(format!("{at}: key {k:?} is not a uint16"));
                    }
                    walk(v, t, &format!("{at}{{}}"), wrong, unknown);
                }
            }
            _ => wrong.push(format!("{at}: {v} does not decode into istioctl's type")),
        }
    }
    let mut wrong = Vec::new();
    let mut unknown = std::collections::BTreeSet::new();
    for (key, t) in [
        ("workloads", &WORKLOAD),
        ("services", &SERVICE),
        ("policies", &POLICY),
        ("certificates", &CERTS),
    ] {
        let list = dump.get(key).unwrap_or(&Value::Null);
        assert!(list.is_array(), "{key} is a list");
        walk(list, &Go::List(t), key, &mut wrong, &mut unknown);
    }
    (wrong, unknown)
}
