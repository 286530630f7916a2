//! Incremental edits of a snapshot ([`crate::MeshEdit`]): what each
//! operation changes, what it must not (the snapshot it came from, entries
//! it did not touch), contested addresses, endpoints with their own ports,
//! policies that apply by name, and the control plane's rule forms.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::authz::{evaluate, evaluate_dry_run, ConnInfo, Decision, DenyReason, Identity};
use crate::{
    Action, AuthorizationPolicy, Cidr, Claimant, Clause, Match, MatchFields, Mesh, MeshConfig,
    NoEnv, Rule, Service, ServiceAccountRef, StringMatch, Unsupported, Workload,
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn empty() -> Mesh {
    MeshConfig::load_str("{}", "test.yaml", &NoEnv).unwrap()
}

fn workload(uid: &str, ns: &str, sa: &str, ips: &[&str]) -> Workload {
    Workload {
        host_network: false,
        uid: uid.into(),
        name: uid.into(),
        namespace: ns.into(),
        service_account: sa.into(),
        ips: ips.iter().map(|s| ip(s)).collect(),
        node: "node-a".into(),
        tunnel: true,
        healthy: true,
        labels: BTreeMap::new(),
        locality: Default::default(),
        workload_name: uid.into(),
        trust_domain: None,
        canonical: None,
        unsupported: None,
        authorization_policies: Vec::new(),
    }
}

fn service(ns: &str, host: &str, vips: &[&str], ports: &[(u16, u16)]) -> Service {
    Service {
        load_balancing: None,
        hostname: host.into(),
        namespace: ns.into(),
        vips: vips.iter().map(|s| ip(s)).collect(),
        ports: ports.iter().copied().collect(),
        unsupported: None,
    }
}

fn member(svc: &str, ports: &[(u16, u16)]) -> BTreeMap<String, BTreeMap<u16, u16>> {
    [(svc.to_owned(), ports.iter().copied().collect())].into()
}

#[test]
fn an_edit_leaves_the_snapshot_it_came_from_unchanged() {
    let mut e = empty().edit();
    e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
    let first = e.finish();
    let mut e = first.edit();
    e.upsert_workload(workload("b", "shop", "db", &["10.0.0.2"]), BTreeMap::new());
    e.remove_workload("a");
    let second = e.finish();
    assert_eq!(first.workload_count(), 1);
    assert_eq!(first.workload_by_ip(ip("10.0.0.1")).unwrap().uid, "a");
    assert!(first.workload_by_ip(ip("10.0.0.2")).is_none());
    assert_eq!(second.workload_count(), 1);
    assert!(second.workload_by_ip(ip("10.0.0.1")).is_none());
    assert_eq!(second.workload_by_uid("b").unwrap().service_account, "db");
}

#[test]
fn a_replaced_workload_takes_only_its_new_addresses() {
    let mut e = empty().edit();
    e.upsert_workload(
        workload("a", "shop", "web", &["10.0.0.1", "fd00::1"]),
        BTreeMap::new(),
    );
    assert!(e.upsert_workload(workload("a", "shop", "web", &["10.0.0.9"]), BTreeMap::new()));
    let m = e.finish();
    assert!(m.workload_by_ip(ip("10.0.0.1")).is_none());
    assert!(m.workload_by_ip(ip("fd00::1")).is_none());
    assert_eq!(m.workload_by_ip(ip("10.0.0.9")).unwrap().uid, "a");
    assert!(
        m.workload_by_ip(ip("::ffff:10.0.0.9")).is_some(),
        "mapped v4"
    );
    assert_eq!(m.workload_count(), 1);
}

#[test]
fn adversarial_an_address_two_workloads_claim_resolves_to_neither() {
    let mut e = empty().edit();
    e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
    e.upsert_workload(
        workload("b", "evil", "x", &["10.0.0.1", "10.0.0.2"]),
        BTreeMap::new(),
    );
    let m = e.finish();
    assert!(
        m.workload_by_ip(ip("10.0.0.1")).is_none(),
        "neither the first nor the last claimant may own a contested address"
    );
    assert_eq!(
        m.address_claimants(ip("10.0.0.1")),
        [
            Claimant::Workload(Arc::from("a")),
            Claimant::Workload(Arc::from("b"))
        ]
    );
    assert_eq!(m.contested_addresses().count(), 1);
    assert_eq!(m.workload_by_ip(ip("10.0.0.2")).unwrap().uid, "b");
    // Once one lets go, the other owns it.
    let mut e = m.edit();
    e.remove_workload("b");
    let m = e.finish();
    assert_eq!(m.workload_by_ip(ip("10.0.0.1")).unwrap().uid, "a");
    assert_eq!(m.contested_addresses().count(), 0);
}

#[test]
fn adversarial_a_vip_that_is_also_a_workload_address_resolves_to_neither() {
    let mut e = empty().edit();
    e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
    e.upsert_service(service(
        "shop",
        "web.shop.svc",
        &["10.0.0.1"],
        &[(80, 8080)],
    ));
    let m = e.finish();
    assert!(m.workload_by_ip(ip("10.0.0.1")).is_none());
    assert!(m.service_by_vip(ip("10.0.0.1")).is_none());
    let mut e = m.edit();
    assert!(e.remove_service("shop/web.shop.svc"));
    assert!(!e.remove_service("shop/web.shop.svc"));
    assert_eq!(e.finish().workload_by_ip(ip("10.0.0.1")).unwrap().uid, "a");
}

#[test]
fn endpoints_follow_the_workloads_and_their_own_ports() {
    let mut e = empty().edit();
    e.upsert_service(service(
        "shop",
        "web.shop.svc",
        &["10.96.0.1"],
        &[(80, 8080), (443, 0)],
    ));
    e.upsert_workload(
        workload("a", "shop", "web", &["10.0.0.1"]),
        member("shop/web.shop.svc", &[(443, 8443)]),
    );
    e.upsert_workload(
        workload("b", "shop", "web", &["10.0.0.2"]),
        member("shop/web.shop.svc", &[(80, 9090)]),
    );
    let mut unhealthy = workload("c", "shop", "web", &["10.0.0.3"]);
    unhealthy.healthy = false;
    e.upsert_workload(unhealthy, member("shop/web.shop.svc", &[]));
    // An endpoint of a service that has not arrived yet.
    e.upsert_workload(
        workload("d", "shop", "web", &["10.0.0.4"]),
        member("shop/later.shop.svc", &[]),
    );
    let m = e.finish();
    let web = m.service_by_vip(ip("10.96.0.1")).unwrap();
    assert_eq!(m.endpoint_uids(web), ["a", "b", "c"]);
    let to = |port| -> Vec<SocketAddr> {
        m.healthy_endpoints(web, port, false)
            .map(|(_, a)| a)
            .collect()
    };
    assert_eq!(
        to(80),
        [
            "10.0.0.1:8080".parse().unwrap(),
            "10.0.0.2:9090".parse().unwrap()
        ],
        "the service's target port, else the endpoint's own; unhealthy ones left out"
    );
    assert_eq!(
        to(443),
        ["10.0.0.1:8443".parse::<SocketAddr>().unwrap()],
        "a service port whose target only endpoints name"
    );
    assert!(
        m.healthy_endpoints(web, 80, true).next().is_none(),
        "no IPv6"
    );
    assert_eq!(
        m.services_of("a")
            .map(|s| s.hostname.as_str())
            .collect::<Vec<_>>(),
        ["web.shop.svc"]
    );
    assert_eq!(m.services_of("d").count(), 0);

    // The service arrives; b leaves it; a is removed.
    let mut e = m.edit();
    e.upsert_service(service(
        "shop",
        "later.shop.svc",
        &["10.96.0.2"],
        &[(80, 80)],
    ));
    e.upsert_workload(workload("b", "shop", "web", &["10.0.0.2"]), BTreeMap::new());
    e.remove_workload("a");
    let m = e.finish();
    let web = m.service_by_vip(ip("10.96.0.1")).unwrap();
    assert_eq!(m.endpoint_uids(web), ["c"]);
    assert_eq!(m.services_of("b").count(), 0);
    let later = m.service("shop/later.shop.svc").unwrap();
    assert_eq!(m.endpoint_uids(later), ["d"]);
}

fn policy(ns: &str, name: &str, action: Action, rules: Vec<Rule>) -> AuthorizationPolicy {
    let mut p = AuthorizationPolicy::new(ns, name, action);
    p.rules = rules;
    p
}

fn clause(matches: Vec<Match>) -> Clause {
    Clause { matches }
}

fn fields(f: MatchFields) -> Match {
    Match::Fields(Box::new(f))
}

fn rule(clauses: Vec<Clause>) -> Rule {
    Rule {
        clauses,
        ..Rule::default()
    }
}

fn conn<'a>(
    dst: &'a Workload,
    src: &str,
    identity: Option<&'a Identity>,
    port: u16,
) -> ConnInfo<'a> {
    ConnInfo {
        src_ip: ip(src),
        src_identity: identity,
        dst_workload: dst,
        dst_ip: dst.ips[0],
        dst_port: port,
    }
}

#[test]
fn policies_that_apply_by_name_reach_only_the_workloads_that_name_them() {
    let mut e = empty().edit();
    let mut named = workload("a", "shop", "web", &["10.0.0.1"]);
    named.authorization_policies = vec![Arc::from("istio-system/deny-all")];
    e.upsert_workload(named, BTreeMap::new());
    e.upsert_workload(workload("b", "shop", "db", &["10.0.0.2"]), BTreeMap::new());
    let mut p = policy("istio-system", "deny-all", Action::Deny, vec![rule(vec![])]);
    p.listed = true;
    e.upsert_policy(p);
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    let b = m.workload_by_uid("b").unwrap();
    assert!(!evaluate(&m, &conn(a, "10.9.9.9", None, 80)).is_allowed());
    assert!(evaluate(&m, &conn(b, "10.9.9.9", None, 80)).is_allowed());
    // Removed: the name on the workload refers to nothing and is skipped.
    let mut e = m.edit();
    assert!(e.remove_policy("istio-system/deny-all"));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(evaluate(&m, &conn(a, "10.9.9.9", None, 80)).is_allowed());
    assert_eq!(m.policy_count(), 0);
}

#[test]
fn control_plane_rules_clauses_and_matches() {
    let front = Identity::new("cluster.local", "front", "fe");
    let other = Identity::new("cluster.local", "other", "x");
    let from_front = fields(MatchFields {
        namespaces: vec![StringMatch::Exact("front".into())],
        ..Default::default()
    });
    let port_80 = fields(MatchFields {
        destination_ports: vec![80],
        ..Default::default()
    });
    let mut e = empty().edit();
    e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
    let mut p = policy(
        "shop",
        "front-on-80",
        Action::Allow,
        vec![rule(vec![clause(vec![from_front]), clause(vec![port_80])])],
    );
    p.namespace = "shop".into();
    e.upsert_policy(p);
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(evaluate(&m, &conn(a, "10.1.1.1", Some(&front), 80)).is_allowed());
    assert!(
        !evaluate(&m, &conn(a, "10.1.1.1", Some(&front), 81)).is_allowed(),
        "clauses are ANDed"
    );
    assert!(!evaluate(&m, &conn(a, "10.1.1.1", Some(&other), 80)).is_allowed());
    assert!(
        !evaluate(&m, &conn(a, "10.1.1.1", None, 80)).is_allowed(),
        "a plaintext peer has no namespace"
    );

    // An empty clause matches; an empty match does not.
    let mut e = m.edit();
    e.upsert_policy(policy(
        "shop",
        "front-on-80",
        Action::Allow,
        vec![rule(vec![clause(vec![])])],
    ));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(evaluate(&m, &conn(a, "10.1.1.1", None, 9)).is_allowed());
    let mut e = m.edit();
    e.upsert_policy(policy(
        "shop",
        "front-on-80",
        Action::Allow,
        vec![rule(vec![clause(vec![fields(MatchFields::default())])])],
    ));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(!evaluate(&m, &conn(a, "10.1.1.1", Some(&front), 80)).is_allowed());
}

#[test]
fn control_plane_match_fields() {
    let fe = Identity::new("cluster.local", "front", "fe");
    let td = Identity::new("other.td", "front", "fe");
    let mut e = empty().edit();
    e.upsert_workload(
        workload("a", "shop", "web", &["10.0.0.1", "fd00::1"]),
        BTreeMap::new(),
    );
    let deny = |f: MatchFields| {
        policy(
            "shop",
            "d",
            Action::Deny,
            vec![rule(vec![clause(vec![fields(f)])])],
        )
    };
    e.upsert_policy(deny(MatchFields {
        principals: vec![StringMatch::Exact(
            "spiffe://cluster.local/ns/front/sa/fe".into(),
        )],
        ..Default::default()
    }));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(!evaluate(&m, &conn(a, "10.1.1.1", Some(&fe), 80)).is_allowed());
    assert!(evaluate(&m, &conn(a, "10.1.1.1", Some(&td), 80)).is_allowed());
    assert!(evaluate(&m, &conn(a, "10.1.1.1", None, 80)).is_allowed());

    // STRICT as the control plane sends it: deny what has no principal.
    let mut e = m.edit();
    e.upsert_policy(deny(MatchFields {
        not_principals: vec![StringMatch::Any],
        ..Default::default()
    }));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(!evaluate(&m, &conn(a, "10.1.1.1", None, 80)).is_allowed());
    assert!(evaluate(&m, &conn(a, "10.1.1.1", Some(&fe), 80)).is_allowed());

    let cases: Vec<(MatchFields, &str, Option<&Identity>, u16, bool)> = vec![
        (
            MatchFields {
                service_accounts: vec![ServiceAccountRef {
                    namespace: "front".into(),
                    name: "fe".into(),
                }],
                ..Default::default()
            },
            "10.1.1.1",
            Some(&td),
            80,
            true,
        ),
        (
            MatchFields {
                not_service_accounts: vec![ServiceAccountRef {
                    namespace: "front".into(),
                    name: "fe".into(),
                }],
                ..Default::default()
            },
            "10.1.1.1",
            None,
            80,
            true,
        ),
        (
            MatchFields {
                source_ips: vec![Cidr::parse("10.1.0.0/16").unwrap()],
                ..Default::default()
            },
            "::ffff:10.1.2.3",
            None,
            80,
            true,
        ),
        (
            MatchFields {
                not_source_ips: vec![Cidr::parse("10.1.0.0/16").unwrap()],
                ..Default::default()
            },
            "10.1.2.3",
            None,
            80,
            false,
        ),
        (
            MatchFields {
                destination_ips: vec![Cidr::parse("10.0.0.1/32").unwrap()],
                not_destination_ports: vec![22],
                ..Default::default()
            },
            "10.1.2.3",
            None,
            80,
            true,
        ),
        (
            MatchFields {
                destination_ips: vec![Cidr::parse("10.0.0.1/32").unwrap()],
                not_destination_ports: vec![22],
                ..Default::default()
            },
            "10.1.2.3",
            None,
            22,
            false,
        ),
        (
            MatchFields {
                namespaces: vec![StringMatch::Prefix("fr".into())],
                ..Default::default()
            },
            "10.1.2.3",
            Some(&fe),
            80,
            true,
        ),
    ];
    for (i, (f, src, id, port, denied)) in cases.into_iter().enumerate() {
        let mut e = empty().edit();
        e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
        e.upsert_policy(deny(f.clone()));
        let m = e.finish();
        let a = m.workload_by_uid("a").unwrap();
        assert_eq!(
            !evaluate(&m, &conn(a, src, id, port)).is_allowed(),
            denied,
            "case {i}: {f:?}"
        );
    }
}

#[test]
fn unreadable_matches_err_toward_deny() {
    let mut e = empty().edit();
    e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
    // A DENY whose one match could not be read denies everything it governs.
    e.upsert_policy(policy(
        "shop",
        "d",
        Action::Deny,
        vec![rule(vec![clause(vec![Match::Always])])],
    ));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    let d = evaluate(&m, &conn(a, "10.9.9.9", None, 80));
    assert!(matches!(
        d,
        Decision::Deny {
            reason: DenyReason::DenyPolicyMatched { rule: 0 },
            ..
        }
    ));
    // An ALLOW whose one match could not be read admits nothing.
    let mut e = m.edit();
    e.remove_policy("shop/d");
    e.upsert_policy(policy(
        "shop",
        "al",
        Action::Allow,
        vec![rule(vec![clause(vec![Match::Never])])],
    ));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    assert!(!evaluate(&m, &conn(a, "10.9.9.9", None, 80)).is_allowed());
}

#[test]
fn dry_run_policies_are_evaluated_and_never_enforced() {
    let mut e = empty().edit();
    e.upsert_workload(workload("a", "shop", "web", &["10.0.0.1"]), BTreeMap::new());
    let mut p = policy("shop", "would-deny", Action::Deny, vec![rule(vec![])]);
    p.dry_run = true;
    e.upsert_policy(p);
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    let c = conn(a, "10.9.9.9", None, 80);
    let actual = evaluate(&m, &c);
    assert_eq!(actual, Decision::Allow, "never enforced");
    let shadow = evaluate_dry_run(&m, &c, &actual).expect("reported");
    assert_eq!(
        shadow.to_string(),
        "denied by DENY policy shop/would-deny (rules[0])"
    );
    // An enforced DENY decides; the dry run agrees and is not reported.
    let mut e = m.edit();
    e.upsert_policy(policy("shop", "deny", Action::Deny, vec![rule(vec![])]));
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    let c = conn(a, "10.9.9.9", None, 80);
    let actual = evaluate(&m, &c);
    assert!(!actual.is_allowed());
    assert_eq!(evaluate_dry_run(&m, &c, &actual), None);
    // No dry-run policy: nothing to report.
    let mut e = m.edit();
    e.remove_policy("shop/would-deny");
    let m = e.finish();
    let a = m.workload_by_uid("a").unwrap();
    let c = conn(a, "10.9.9.9", None, 80);
    assert_eq!(evaluate_dry_run(&m, &c, &evaluate(&m, &c)), None);
}

#[test]
fn a_workloads_own_trust_domain_and_canonical_names() {
    let mut w = workload("a", "shop", "web", &["10.0.0.1"]);
    assert_eq!(
        w.identity("cluster.local").to_string(),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
    w.trust_domain = Some("example.org".into());
    assert_eq!(
        w.identity("cluster.local").to_string(),
        "spiffe://example.org/ns/shop/sa/web"
    );
    w.labels.insert("app".into(), "from-label".into());
    assert_eq!(w.canonical_service(), "from-label");
    w.canonical = Some(("reviews".into(), "v2".into()));
    assert_eq!(w.canonical_service(), "reviews");
    assert_eq!(w.canonical_revision(), "v2");
    w.unsupported = Some(Unsupported::Waypoint("shop/waypoint".into()));
    assert_eq!(w.unsupported.as_ref().unwrap().label(), "waypoint");
}

#[test]
fn the_file_model_and_an_edit_agree() {
    let yaml = "workloads:
  - {uid: w1, name: web-0, namespace: shop, serviceAccount: web, ips: [10.0.0.1], node: a}
  - {uid: w2, name: web-1, namespace: shop, serviceAccount: web, ips: [10.0.0.2], node: a}
services:
  - {hostname: web.shop.svc, namespace: shop, vips: [10.96.0.1], ports: {80: 8080}, endpoints: [w1, w2]}
";
    let file = MeshConfig::load_str(yaml, "test.yaml", &NoEnv).unwrap();
    let mut e = empty().edit();
    for (uid, ip) in [("w1", "10.0.0.1"), ("w2", "10.0.0.2")] {
        let mut w = workload(uid, "shop", "web", &[ip]);
        w.name = if uid == "w1" { "web-0" } else { "web-1" }.into();
        w.workload_name = w.name.clone();
        w.node = "a".into();
        w.tunnel = false; // the file's default
        e.upsert_workload(w, member("shop/web.shop.svc", &[]));
    }
    e.upsert_service(service(
        "shop",
        "web.shop.svc",
        &["10.96.0.1"],
        &[(80, 8080)],
    ));
    let edited = e.finish();
    assert!(file.same_entries(&edited));
    let mut e = edited.edit();
    e.remove_workload("w2");
    assert!(!file.same_entries(&e.finish()));
}

/// A service's load balancing as the control plane sends it:
/// `publishNotReadyAddresses` takes endpoints that are not ready,
/// `internalTrafficPolicy: Local` (node, strict) only the client's node's
/// endpoints, none when its node has none (refused, never sent elsewhere),
/// `trafficDistribution: PreferClose` (failover) the closest ones, the
/// others only when there is nothing closer; an endpoint on its node's
/// network is taken at the node's address, which never names it.
#[test]
fn endpoints_follow_the_services_load_balancing() {
    use crate::{LbMode, LoadBalancing, Locality, Scope};
    let placed = |uid: &str, ip_: &str, node: &str, zone: &str| {
        let mut w = workload(uid, "shop", "web", &[ip_]);
        w.node = node.into();
        w.locality = Locality {
            region: "r1".into(),
            zone: zone.into(),
            subzone: String::new(),
        };
        w
    };
    let mut e = empty().edit();
    e.upsert_service(service(
        "shop",
        "web.shop.svc",
        &["10.96.0.1"],
        &[(80, 8080)],
    ));
    e.upsert_workload(
        placed("a", "10.0.0.1", "n1", "z1"),
        member("shop/web.shop.svc", &[]),
    );
    e.upsert_workload(
        placed("b", "10.0.0.2", "n2", "z1"),
        member("shop/web.shop.svc", &[]),
    );
    e.upsert_workload(
        placed("c", "10.0.0.3", "n3", "z2"),
        member("shop/web.shop.svc", &[]),
    );
    let mut not_ready = placed("d", "10.0.0.4", "n1", "z1");
    not_ready.healthy = false;
    e.upsert_workload(not_ready, member("shop/web.shop.svc", &[]));
    let mut host = placed("h", "192.168.0.9", "n9", "z2");
    host.host_network = true;
    e.upsert_workload(host, member("shop/web.shop.svc", &[]));
    // On another network, behind its gateway: never dialled straight.
    let mut remote = placed("g", "10.9.0.1", "n7", "z1");
    remote.unsupported = Some(Unsupported::NetworkGateway("east-west".into()));
    e.upsert_workload(remote, member("shop/web.shop.svc", &[]));
    let base = e.finish();
    let with = |lb: Option<LoadBalancing>| {
        let mut e = base.edit();
        let mut s = service("shop", "web.shop.svc", &["10.96.0.1"], &[(80, 8080)]);
        s.load_balancing = lb;
        e.upsert_service(s);
        e.finish()
    };
    let picked = |m: &Mesh, client: Option<&Workload>| -> Vec<String> {
        let svc = m.service_by_vip(ip("10.96.0.1")).unwrap();
        m.endpoints_for(svc, 80, false, client)
            .into_iter()
            .map(|(w, a)| format!("{}@{a}", w.uid))
            .collect()
    };
    let client_n1 = placed("client", "10.0.1.1", "n1", "z1");
    let client_n8 = placed("client", "10.0.1.1", "n8", "z2");

    // No load balancing: the healthy ones, the host-network one at its
    // node's address; that address names no workload.
    let m = with(None);
    assert_eq!(
        picked(&m, Some(&client_n1)),
        [
            "a@10.0.0.1:8080",
            "b@10.0.0.2:8080",
            "c@10.0.0.3:8080",
            "h@192.168.0.9:8080"
        ]
    );
    assert!(m.workload_by_ip(ip("192.168.0.9")).is_none());
    assert!(m.address_claimants(ip("192.168.0.9")).is_empty());
    // publishNotReadyAddresses.
    let m = with(Some(LoadBalancing {
        allow_unhealthy: true,
        ..Default::default()
    }));
    assert!(picked(&m, Some(&client_n1)).contains(&"d@10.0.0.4:8080".to_owned()));
    // internalTrafficPolicy: Local.
    let local = LoadBalancing {
        routing_preference: vec![Scope::Node],
        mode: LbMode::Strict,
        allow_unhealthy: false,
    };
    let m = with(Some(local));
    assert_eq!(picked(&m, Some(&client_n1)), ["a@10.0.0.1:8080"]);
    assert!(
        picked(&m, Some(&client_n8)).is_empty(),
        "none on its node: none at all"
    );
    assert!(picked(&m, None).is_empty(), "a client not known: none");
    // trafficDistribution: PreferClose.
    let close = LoadBalancing {
        routing_preference: vec![Scope::Network, Scope::Region, Scope::Zone, Scope::Subzone],
        mode: LbMode::Failover,
        allow_unhealthy: false,
    };
    let m = with(Some(close));
    assert_eq!(
        picked(&m, Some(&client_n1)),
        ["a@10.0.0.1:8080", "b@10.0.0.2:8080"],
        "its zone's"
    );
    assert_eq!(
        picked(&m, Some(&client_n8)),
        ["c@10.0.0.3:8080", "h@192.168.0.9:8080"],
        "its zone's"
    );
    let mut far = client_n1.clone();
    far.locality.region = "r2".into();
    assert_eq!(
        picked(&m, Some(&far)).len(),
        4,
        "nothing shares more than the network: every one"
    );
}
