//! Each field of the workload API as the model reads it, and every refusal
//! naming what was wrong.

use super::*;
use crate::proto::security::{Address as SecAddress, Authorization, Clause as SecClause};
use crate::proto::workload::{GatewayAddress, NamespacedHostname, NetworkAddress, Port, PortList};

fn v4(s: &str) -> Vec<u8> {
    s.parse::<Ipv4Addr>().unwrap().octets().to_vec()
}

fn v6(s: &str) -> Vec<u8> {
    s.parse::<Ipv6Addr>().unwrap().octets().to_vec()
}

fn pod() -> wl::Workload {
    wl::Workload {
        uid: "Kubernetes//Pod/shop/web-0".into(),
        name: "web-0".into(),
        namespace: "shop".into(),
        addresses: vec![v4("10.1.0.10"), v6("fd00::10")],
        tunnel_protocol: wl::TunnelProtocol::Hbone as i32,
        service_account: "web".into(),
        node: "node-a".into(),
        canonical_name: "web".into(),
        canonical_revision: "v1".into(),
        workload_name: "web".into(),
        services: [(
            "shop/web.shop.svc.cluster.local".to_owned(),
            PortList {
                ports: vec![Port {
                    service_port: 80,
                    target_port: 8080,
                }],
            },
        )]
        .into(),
        authorization_policies: vec!["shop/web-allow".into()],
        locality: Some(wl::Locality {
            region: "eu".into(),
            zone: "eu-1".into(),
            subzone: String::new(),
        }),
        ..Default::default()
    }
}

fn address_of(w: wl::Workload) -> wl::Address {
    wl::Address {
        kind: Some(address::Kind::Workload(w)),
    }
}

#[test]
fn a_workload_is_read_field_by_field() {
    let (w, services) = workload(&pod()).unwrap();
    assert_eq!(w.uid, "Kubernetes//Pod/shop/web-0");
    assert_eq!(w.ips, [ip("10.1.0.10"), ip("fd00::10")]);
    assert!(w.tunnel && w.healthy);
    assert_eq!(
        w.trust_domain.as_deref(),
        Some("cluster.local"),
        "the default"
    );
    assert_eq!(
        w.identity("ignored.example").to_string(),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
    assert_eq!(
        (w.canonical_service(), w.canonical_revision()),
        ("web", "v1")
    );
    assert_eq!(w.locality.zone, "eu-1");
    assert_eq!(&*w.authorization_policies[0], "shop/web-allow");
    assert_eq!(
        services["shop/web.shop.svc.cluster.local"],
        [(80, 8080)].into()
    );
    assert!(w.unsupported.is_none());

    let mut p = pod();
    p.service_account.clear();
    p.trust_domain = "example.org".into();
    p.status = wl::WorkloadStatus::Unhealthy as i32;
    p.tunnel_protocol = wl::TunnelProtocol::None as i32;
    p.canonical_name.clear();
    p.canonical_revision.clear();
    let (w, _) = workload(&p).unwrap();
    assert_eq!(
        w.identity("cluster.local").to_string(),
        "spiffe://example.org/ns/shop/sa/default"
    );
    assert!(!w.healthy && !w.tunnel);
    assert_eq!(w.canonical, None, "from labels (none): the workload name");
    assert_eq!(w.canonical_service(), "web");
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn waypoints_and_gateways_are_unsupported_and_named() {
    let mut p = pod();
    p.waypoint = Some(GatewayAddress {
        destination: Some(gateway_address::Destination::Hostname(NamespacedHostname {
            namespace: "shop".into(),
            hostname: "waypoint.shop.svc.cluster.local".into(),
        })),
        hbone_mtls_port: 15008,
    });
    let (w, _) = workload(&p).unwrap();
    assert_eq!(
        w.unsupported,
        Some(Unsupported::Waypoint(
            "shop/waypoint.shop.svc.cluster.local:15008".into()
        ))
    );
    let mut p = pod();
    p.network_gateway = Some(GatewayAddress {
        destination: Some(gateway_address::Destination::Address(NetworkAddress {
            network: "west".into(),
            address: v4("192.0.2.1"),
        })),
        hbone_mtls_port: 15008,
    });
    let (w, _) = workload(&p).unwrap();
    assert_eq!(
        w.unsupported.unwrap().label(),
        "network_gateway",
        "reached through a gateway"
    );
    let s = service(&wl::Service {
        namespace: "shop".into(),
        hostname: "db".into(),
        waypoint: p.network_gateway.clone(),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(s.unsupported.unwrap().label(), "waypoint");
}

#[test]
fn adversarial_an_application_tunnel_is_unsupported_never_ignored() {
    use crate::proto::workload::{application_tunnel::Protocol, ApplicationTunnel};
    let with = |protocol: i32, port: u32| {
        let mut p = pod();
        p.application_tunnel = Some(ApplicationTunnel { protocol, port });
        workload(&p).unwrap().0.unsupported
    };
    assert_eq!(
        with(Protocol::None as i32, 0),
        None,
        "bytes unchanged: served"
    );
    let u = with(Protocol::Proxy as i32, 15088).expect("PROXY: unsupported");
    assert_eq!(u.label(), "application_tunnel");
    assert_eq!(
        u,
        Unsupported::ApplicationTunnel("a PROXY protocol header on port 15088".into())
    );
    assert_eq!(
        with(7, 0),
        Some(Unsupported::ApplicationTunnel(
            "tunnel protocol 7 (unknown)".into()
        )),
        "an unknown protocol: unsupported too"
    );
    let mut p = pod();
    p.native_tunnel = true;
    assert_eq!(
        workload(&p).unwrap().0.unsupported,
        None,
        "native_tunnel: served"
    );
}

/// A pod on its node's network: its addresses are the node's. Kept, so a
/// service it serves can reach it there, but marked, so they never name it
/// (the model indexes no address of such a workload).
#[test]
fn a_host_network_workload_keeps_its_addresses_but_claims_none() {
    let mut p = pod();
    p.network_mode = wl::NetworkMode::HostNetwork as i32;
    let (w, _) = workload(&p).unwrap();
    assert!(w.host_network);
    assert_eq!(w.ips, [ip("10.1.0.10"), ip("fd00::10")]);
    let (w, _) = workload(&pod()).unwrap();
    assert!(!w.host_network);
}

/// A service's `load_balancing`, field by field, and every value this
/// proxy does not know refused naming the field (its endpoints would
/// otherwise be picked against what the control plane asked).
#[test]
fn a_services_load_balancing_is_read_and_unknown_values_refused() {
    use wl::load_balancing::{HealthPolicy, Mode, Scope as S};
    let svc = |lb: wl::LoadBalancing| wl::Service {
        name: "web".into(),
        namespace: "shop".into(),
        hostname: "web.shop.svc.cluster.local".into(),
        load_balancing: Some(lb),
        ..Default::default()
    };
    let lb = |scopes: &[S], mode: Mode, health: HealthPolicy| wl::LoadBalancing {
        routing_preference: scopes.iter().map(|s| *s as i32).collect(),
        mode: mode as i32,
        health_policy: health as i32,
        dns_connect_strategy: 0,
    };
    let read = service(&svc(lb(
        &[S::Node],
        Mode::Strict,
        HealthPolicy::OnlyHealthy,
    )))
    .unwrap()
    .load_balancing
    .unwrap();
    assert_eq!(read.routing_preference, [Scope::Node]);
    assert_eq!(read.mode, LbMode::Strict);
    assert!(!read.allow_unhealthy);
    let read = service(&svc(lb(
        &[S::Network, S::Region, S::Zone, S::Subzone, S::Cluster],
        Mode::Failover,
        HealthPolicy::AllowAll,
    )))
    .unwrap()
    .load_balancing
    .unwrap();
    assert_eq!(
        read.routing_preference,
        [
            Scope::Network,
            Scope::Region,
            Scope::Zone,
            Scope::Subzone,
            Scope::Cluster
        ]
    );
    assert_eq!(read.mode, LbMode::Failover);
    assert!(read.allow_unhealthy);
    let read = service(&svc(lb(&[], Mode::Passthrough, HealthPolicy::OnlyHealthy)))
        .unwrap()
        .load_balancing
        .unwrap();
    assert_eq!(read.mode, LbMode::Passthrough);
    let read = service(&svc(lb(
        &[S::Zone],
        Mode::UnspecifiedMode,
        HealthPolicy::OnlyHealthy,
    )))
    .unwrap()
    .load_balancing
    .unwrap();
    assert_eq!(
        read.mode,
        LbMode::Failover,
        "a preference, never a restriction"
    );
    assert!(
        service(&svc(lb(&[], Mode::Strict, HealthPolicy::OnlyHealthy)))
            .unwrap()
            .load_balancing
            .is_some()
    );
    for (bad, field) in [
        (
            wl::LoadBalancing {
                routing_preference: vec![S::Zone as i32, 9],
                ..Default::default()
            },
            "service.loadBalancing.routingPreference[1]",
        ),
        (
            wl::LoadBalancing {
                routing_preference: vec![S::UnspecifiedScope as i32],
                ..Default::default()
            },
            "service.loadBalancing.routingPreference[0]",
        ),
        (
            wl::LoadBalancing {
                mode: 7,
                ..Default::default()
            },
            "service.loadBalancing.mode",
        ),
        (
            wl::LoadBalancing {
                health_policy: 5,
                ..Default::default()
            },
            "service.loadBalancing.healthPolicy",
        ),
    ] {
        let e = service(&svc(bad)).unwrap_err().to_string();
        assert!(e.contains(field), "{e}");
    }
}

#[test]
fn adversarial_unreadable_workloads_and_services_are_refused_naming_the_field() {
    type Spoil = Box<dyn Fn(&mut wl::Workload)>;
    let cases: Vec<(Spoil, &str)> = vec![
        (
            Box::new(|p| p.uid.clear()),
            "workload.uid: must not be empty",
        ),
        (
            Box::new(|p| p.addresses.push(vec![1, 2, 3])),
            "workload.addresses[2]: 3 bytes are not an IPv4 (4) or IPv6 (16) address",
        ),
        (
            Box::new(|p| p.tunnel_protocol = 7),
            "workload.tunnelProtocol: 7 is not a tunnel protocol",
        ),
        (
            Box::new(|p| p.status = 9),
            "workload.status: 9 is not a status",
        ),
        (
            Box::new(|p| p.service_account = "Bad_SA".into()),
            "workload.{trustDomain,namespace,serviceAccount}",
        ),
        (
            Box::new(|p| p.namespace.clear()),
            "workload.{trustDomain,namespace,serviceAccount}",
        ),
        (
            Box::new(|p| {
                p.services.insert(
                    "shop/x".into(),
                    PortList {
                        ports: vec![Port {
                            service_port: 70000,
                            target_port: 1,
                        }],
                    },
                );
            }),
            "workload.services[shop/x].ports[0].servicePort: 70000 is not a port",
        ),
        (
            Box::new(|p| {
                p.services.insert("noslash".into(), PortList::default());
            }),
            "workload.services[noslash]: a service is named namespace/hostname",
        ),
    ];
    for (i, (spoil, want)) in cases.into_iter().enumerate() {
        let mut p = pod();
        spoil(&mut p);
        let name = p.uid.clone();
        let e = address(&name, &address_of(p)).unwrap_err().to_string();
        assert!(e.starts_with(want), "case {i}: {e}");
    }
    let e = address("other-uid", &address_of(pod())).unwrap_err();
    assert_eq!(e.field, "workload.uid");
    let e = address("x", &wl::Address { kind: None }).unwrap_err();
    assert!(
        e.problem.contains("neither a workload nor a service"),
        "{e}"
    );
    let svc = wl::Service {
        namespace: "shop".into(),
        hostname: "web".into(),
        addresses: vec![NetworkAddress {
            network: String::new(),
            address: vec![0; 5],
        }],
        ..Default::default()
    };
    let kind = Some(address::Kind::Service(svc));
    let e = address("shop/web", &wl::Address { kind: kind.clone() }).unwrap_err();
    assert_eq!(
        e.to_string(),
        "service.addresses[0]: 5 bytes are not an IPv4 (4) or IPv6 (16) address"
    );
    let e = address("shop/other", &wl::Address { kind }).unwrap_err();
    assert!(e.problem.contains("is not the resource's name"), "{e}");
}

#[test]
fn a_service_is_read() {
    let s = service(&wl::Service {
        name: "web".into(),
        namespace: "shop".into(),
        hostname: "web.shop.svc.cluster.local".into(),
        addresses: vec![
            NetworkAddress {
                network: String::new(),
                address: v4("10.96.0.10"),
            },
            NetworkAddress {
                network: String::new(),
                address: v6("::ffff:10.96.0.10"),
            },
        ],
        ports: vec![
            Port {
                service_port: 80,
                target_port: 8080,
            },
            Port {
                service_port: 443,
                target_port: 0,
            },
        ],
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        s.vips,
        [ip("10.96.0.10")],
        "a mapped address is the same VIP"
    );
    assert_eq!(s.ports, [(80, 8080), (443, 0)].into());
    assert_eq!(s.key(), "shop/web.shop.svc.cluster.local");
}

fn string(m: MatchType) -> security::StringMatch {
    security::StringMatch {
        match_type: Some(m),
    }
}

fn authz(action: i32, scope: i32, matches: Vec<security::Match>) -> Authorization {
    Authorization {
        name: "p".into(),
        namespace: "shop".into(),
        scope,
        action,
        rules: vec![security::Rule {
            clauses: vec![SecClause { matches }],
        }],
        dry_run: false,
    }
}

#[test]
fn policies_scopes_actions_and_fields() {
    let m = security::Match {
        principals: vec![
            string(MatchType::Exact("cluster.local/ns/front/sa/fe".into())),
            string(MatchType::Prefix("cluster.local/ns/front/".into())),
            string(MatchType::Suffix("/sa/fe".into())),
            string(MatchType::Presence(())),
        ],
        namespaces: vec![string(MatchType::Exact("front".into()))],
        source_ips: vec![
            SecAddress {
                address: v4("10.1.2.3"),
                length: 16,
            },
            SecAddress {
                address: v6("::ffff:10.9.0.0"),
                length: 112,
            },
        ],
        destination_ports: vec![80, 443],
        service_accounts: vec![security::ServiceAccountMatch {
            namespace: "front".into(),
            service_account: "fe".into(),
        }],
        ..Default::default()
    };
    let a = authz(
        security::Action::Allow as i32,
        security::Scope::WorkloadSelector as i32,
        vec![m],
    );
    let p = authorization("shop/p", &a, "istio-system");
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    let p = p.policy;
    assert!(p.listed && !p.mesh_wide && p.action == Action::Allow);
    assert_eq!(&**p.qualified_name(), "shop/p");
    let Match::Fields(f) = &p.rules[0].clauses[0].matches[0] else {
        panic!("read")
    };
    assert_eq!(
        f.principals,
        [
            StringMatch::Exact("spiffe://cluster.local/ns/front/sa/fe".into()),
            StringMatch::Prefix("spiffe://cluster.local/ns/front/".into()),
            StringMatch::Suffix("/sa/fe".into()),
            StringMatch::Any,
        ]
    );
    assert_eq!(f.namespaces, [StringMatch::Exact("front".into())]);
    assert_eq!(
        f.source_ips,
        [
            Cidr::parse("10.1.0.0/16").unwrap(),
            Cidr::parse("10.9.0.0/16").unwrap()
        ],
        "host bits cleared; a mapped block is the IPv4 block"
    );
    assert_eq!(f.destination_ports, [80, 443]);
    assert_eq!(f.service_accounts[0].name, "fe");

    let g = authorization(
        "shop/p",
        &authz(0, security::Scope::Global as i32, vec![]),
        "istio-system",
    );
    assert!(g.policy.mesh_wide && !g.policy.listed);
    let n = authorization(
        "shop/p",
        &authz(1, security::Scope::Namespace as i32, vec![]),
        "istio-system",
    );
    assert!(!n.policy.mesh_wide && !n.policy.listed && n.policy.action == Action::Deny);
}

/// `shop/web-0` (10.1.0.10, [`pod`]) in a mesh holding only `policies`,
/// and what `authz::evaluate` says of a connection to it on 8080 from
/// `front/fe` at 10.9.9.9 (and what the dry-run evaluation would say).
fn verdicts(
    policies: Vec<AuthorizationPolicy>,
) -> (
    ringway_config::authz::Decision,
    Option<ringway_config::authz::Decision>,
) {
    use ringway_config::authz::{evaluate, evaluate_dry_run, ConnInfo};
    let base = ringway_config::MeshConfig::load_str(
        "rootNamespace: istio-system\n",
        "file.yaml",
        &ringway_config::NoEnv,
    )
    .unwrap();
    let (w, services) = workload(&pod()).unwrap();
    let mut edit = base.without_entries().edit();
    edit.upsert_workload(w, services);
    for p in policies {
        edit.upsert_policy(p);
    }
    let mesh = edit.finish();
    let id = Identity::new("cluster.local", "front", "fe");
    let conn = ConnInfo {
        src_ip: ip("10.9.9.9"),
        src_identity: Some(&id),
        dst_workload: mesh.workload_by_ip(ip("10.1.0.10")).unwrap(),
        dst_ip: ip("10.1.0.10"),
        dst_port: 8080,
    };
    let actual = evaluate(&mesh, &conn);
    let shadow = evaluate_dry_run(&mesh, &conn, &actual);
    (actual, shadow)
}

fn allowed(policies: Vec<AuthorizationPolicy>) -> bool {
    verdicts(policies).0.is_allowed()
}

/// A match only `nobody/x` passes: no connection of [`verdicts`] does.
fn nobody() -> security::Match {
    security::Match {
        principals: vec![string(MatchType::Exact(
            "cluster.local/ns/nobody/sa/x".into(),
        ))],
        ..Default::default()
    }
}

fn no_rules(mut a: Authorization) -> Authorization {
    a.rules.clear();
    a
}

fn read(ns: &str, a: Authorization) -> Policy {
    let a = Authorization {
        namespace: ns.into(),
        ..a
    };
    authorization(&format!("{ns}/p"), &a, "istio-system")
}

#[test]
fn adversarial_unknown_enum_values_fail_toward_deny() {
    const UNKNOWN_ACTION: i32 = 5;
    const UNKNOWN_SCOPE: i32 = 9;
    let ns_scope = security::Scope::Namespace as i32;
    let allow = security::Action::Allow as i32;
    assert!(allowed(vec![]), "no policy: allowed");

    // An unknown action denies every connection to what the policy
    // selects, whatever its rules say...
    let p = read("shop", no_rules(authz(UNKNOWN_ACTION, ns_scope, vec![])));
    assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
    assert!(p.problems[0].starts_with("action: 5 is not ALLOW (0) or DENY (1)"));
    assert!(!allowed(vec![p.policy]), "unknown action, no rules: denied");
    let p = read("shop", authz(UNKNOWN_ACTION, ns_scope, vec![nobody()]));
    assert!(
        !allowed(vec![p.policy]),
        "unknown action, rules that match nothing: denied"
    );
    // ...and nothing it does not select.
    let p = read("other", no_rules(authz(UNKNOWN_ACTION, ns_scope, vec![])));
    assert!(!p.policy.mesh_wide);
    assert!(allowed(vec![p.policy]), "another namespace's: not selected");
    let p = read(
        "shop",
        no_rules(authz(
            UNKNOWN_ACTION,
            security::Scope::WorkloadSelector as i32,
            vec![],
        )),
    );
    assert!(p.policy.listed);
    assert!(
        allowed(vec![p.policy]),
        "selecting workloads that list it (web-0 lists shop/web-allow only)"
    );

    // An unknown scope selects what it could have: its namespace's
    // workloads (every workload for the root namespace's). An ALLOW of
    // unknown scope grants nothing: its rules were written for workloads
    // it may not select.
    let deny = security::Action::Deny as i32;
    let p = read("other", authz(deny, UNKNOWN_SCOPE, vec![]));
    assert!(!p.policy.mesh_wide && !p.policy.listed);
    assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
    assert!(
        p.problems[0].starts_with("scope: 9 is not GLOBAL")
            && p.problems[0].ends_with("applied to every workload of its namespace"),
        "{:?}",
        p.problems
    );
    assert!(allowed(vec![p.policy]), "another namespace's: not selected");
    let p = read("shop", authz(deny, UNKNOWN_SCOPE, vec![]));
    assert!(!allowed(vec![p.policy]), "its namespace's DENY: denied");
    let p = read("istio-system", authz(deny, UNKNOWN_SCOPE, vec![]));
    assert!(p.policy.mesh_wide, "the root namespace's: every workload");
    assert!(!allowed(vec![p.policy]));
    let fe = security::Match {
        principals: vec![string(MatchType::Exact(
            "cluster.local/ns/front/sa/fe".into(),
        ))],
        ..Default::default()
    };
    let p = read("shop", authz(allow, UNKNOWN_SCOPE, vec![fe.clone()]));
    assert!(p.policy.rules.is_empty(), "grants nothing");
    assert!(p.problems[0].ends_with("as an ALLOW it grants nothing"));
    assert!(!allowed(vec![p.policy]), "unknown scope with ALLOW: denied");
    // Both unknown: denies everything it could select.
    let p = read(
        "shop",
        no_rules(authz(UNKNOWN_ACTION, UNKNOWN_SCOPE, vec![])),
    );
    assert_eq!(p.problems.len(), 2, "{:?}", p.problems);
    assert!(!allowed(vec![p.policy]));
}

/// An ALLOW whose scope cannot be read never lets through a peer that
/// the workload's own ALLOW does not: it once applied mesh-wide, rules
/// and all, granting its principals every workload that had an ALLOW.
#[test]
fn adversarial_an_allow_of_unknown_scope_grants_nothing() {
    let fe = security::Match {
        principals: vec![string(MatchType::Exact(
            "cluster.local/ns/front/sa/fe".into(),
        ))],
        ..Default::default()
    };
    let allow = security::Action::Allow as i32;
    let own = read(
        "shop",
        authz(allow, security::Scope::Namespace as i32, vec![nobody()]),
    );
    assert!(own.problems.is_empty());
    assert!(
        !allowed(vec![own.policy.clone()]),
        "shop's own ALLOW: front/fe denied"
    );
    for ns in ["other", "shop", "istio-system"] {
        let stray = read(ns, authz(allow, 9, vec![fe.clone()]));
        assert!(
            !allowed(vec![own.policy.clone(), stray.policy]),
            "{ns}'s ALLOW of unknown scope let front/fe in"
        );
    }
}

#[test]
fn a_dry_run_deny_that_matches_is_reported_not_enforced() {
    let front = security::Match {
        namespaces: vec![string(MatchType::Exact("front".into()))],
        ..Default::default()
    };
    let mut a = authz(security::Action::Deny as i32, 1, vec![front]);
    let enforced = read("shop", a.clone()).policy;
    assert!(!enforced.dry_run);
    assert!(!allowed(vec![enforced]), "the same DENY enforced: denied");
    a.dry_run = true;
    let p = read("shop", a);
    assert!(p.problems.is_empty(), "{:?}", p.problems);
    assert!(p.policy.dry_run, "dry_run is read");
    let (actual, shadow) = verdicts(vec![p.policy]);
    assert!(actual.is_allowed(), "never enforced: {actual}");
    let shadow = shadow.expect("the dry run's verdict differs and is reported");
    assert!(!shadow.is_allowed(), "{shadow}");
    assert_eq!(
        shadow.to_string(),
        "denied by DENY policy shop/p (rules[0])"
    );
}

#[test]
fn adversarial_unreadable_matches_fail_toward_deny() {
    let bad = vec![
        security::Match {
            namespaces: vec![security::StringMatch { match_type: None }],
            ..Default::default()
        },
        security::Match {
            destination_ports: vec![70000],
            ..Default::default()
        },
        security::Match {
            source_ips: vec![SecAddress {
                address: v4("10.0.0.0"),
                length: 33,
            }],
            ..Default::default()
        },
        security::Match {
            not_destination_ips: vec![SecAddress {
                address: vec![1, 2],
                length: 8,
            }],
            ..Default::default()
        },
        security::Match {
            not_service_accounts: vec![security::ServiceAccountMatch::default()],
            ..Default::default()
        },
    ];
    let deny = authorization("shop/p", &authz(1, 1, bad.clone()), "istio-system");
    assert_eq!(deny.problems.len(), 5, "{:?}", deny.problems);
    assert!(deny.policy.rules[0].clauses[0]
        .matches
        .iter()
        .all(|m| *m == Match::Always));
    assert!(
        deny.problems[1].contains("destinationPorts[0]: 70000 is not a port")
            && deny.problems[1].ends_with("it matches every connection"),
        "{:?}",
        deny.problems
    );
    let allow = authorization("shop/p", &authz(0, 1, bad), "istio-system");
    assert!(allow.policy.rules[0].clauses[0]
        .matches
        .iter()
        .all(|m| *m == Match::Never));
    assert!(allow.problems[2].ends_with("it matches no connection"));
}

#[test]
fn adversarial_a_policy_named_unlike_its_resource_denies_what_it_could_select() {
    let p = authorization("shop/p", &authz(0, 1, vec![]), "istio-system");
    assert!(p.problems.is_empty());
    let p = authorization("shop/other", &authz(0, 1, vec![]), "istio-system");
    assert_eq!(p.problems.len(), 1);
    assert_eq!(p.policy.action, Action::Deny);
    assert_eq!(&**p.policy.qualified_name(), "shop/other");
    assert!(!p.policy.mesh_wide, "its namespace by the resource's name");
    assert_eq!(p.policy.rules[0].clauses[0].matches, [Match::Always]);
    let g = deny_everything("garbage-without-namespace", "istio-system");
    assert!(g.mesh_wide, "the namespace cannot be told: every workload");
    let r = deny_everything("istio-system/x", "istio-system");
    assert!(r.mesh_wide, "the root namespace's policies are mesh-wide");
}

/// A policy field this proxy does not know, at the top: a DENY selects
/// at least its whole namespace (the field may widen what it selects), an
/// ALLOW grants nothing.
#[test]
fn adversarial_an_unknown_top_level_field_errs_toward_deny() {
    let unknown = crate::proto::wire::UnknownFields {
        policy: vec![20],
        ..Default::default()
    };
    let deny = security::Action::Deny as i32;
    let listed = authz(deny, security::Scope::WorkloadSelector as i32, vec![]);
    let a = Authorization {
        namespace: "shop".into(),
        ..listed.clone()
    };
    let read = authorization(&format!("shop/{}", a.name), &a, "istio-system");
    assert!(read.policy.listed && read.problems.is_empty());
    let p = authorization_with(&format!("shop/{}", a.name), &a, &unknown, "istio-system");
    assert!(
        !p.policy.listed && !p.policy.mesh_wide,
        "its whole namespace"
    );
    assert!(
        p.problems[0].starts_with("fields 20 unknown to this proxy: its rules are enforced"),
        "{:?}",
        p.problems
    );
    let root = Authorization {
        namespace: "istio-system".into(),
        ..listed
    };
    let p = authorization_with(
        &format!("istio-system/{}", root.name),
        &root,
        &unknown,
        "istio-system",
    );
    assert!(p.policy.mesh_wide, "the root namespace's: every workload");
    let allow = Authorization {
        namespace: "shop".into(),
        ..authz(security::Action::Allow as i32, 1, vec![])
    };
    let p = authorization_with(
        &format!("shop/{}", allow.name),
        &allow,
        &unknown,
        "istio-system",
    );
    assert!(p.policy.rules.is_empty(), "grants nothing");
}

/// '~' is in no Kubernetes name: a resource that has one is unreadable, and
/// its stand-in never shares a name with another resource's.
#[test]
fn adversarial_a_tilde_in_a_policy_name_is_unreadable_and_never_collides() {
    let a = Authorization {
        namespace: "istio-system".into(),
        name: "~foo".into(),
        ..authz(security::Action::Allow as i32, 0, vec![])
    };
    let p = authorization("istio-system/~foo", &a, "istio-system");
    assert_eq!(p.policy.action, Action::Deny);
    assert!(!p.problems.is_empty());
    let garbage = deny_everything("foo", "istio-system");
    assert_ne!(p.policy.qualified_name(), garbage.qualified_name());
    assert_eq!(&**garbage.qualified_name(), "istio-system/~foo");
    assert_eq!(
        &**p.policy.qualified_name(),
        "istio-system/~istio-system~s~~foo"
    );
}
