//! Round trips, and decoding of bytes built by hand from the schema's field
//! numbers: a wrong tag in a definition fails here, not against a server.

use std::collections::HashMap;

use prost::Message;

use super::security::{self, string_match::MatchType, Authorization, StringMatch};
use super::workload::{self, address, gateway_address, Workload};
use super::*;

/// A varint.
fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// Field `tag` as a varint (wire type 0).
fn vi(tag: u64, value: u64) -> Vec<u8> {
    let mut out = varint(tag << 3);
    out.extend(varint(value));
    out
}

/// Field `tag`, length-delimited (wire type 2).
fn ld(tag: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = varint((tag << 3) | 2);
    out.extend(varint(payload.len() as u64));
    out.extend_from_slice(payload);
    out
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn hand_built_delta_response_decodes_field_by_field() {
    let resource = cat(&[
        ld(1, b"v7"),
        ld(
            2,
            &cat(&[ld(1, ADDRESS_TYPE_URL.as_bytes()), ld(2, b"\x0a\x00")]),
        ),
        ld(3, b"uid-1"),
        ld(4, b"net/10.0.0.1"),
        ld(6, &vi(1, 30)),
    ]);
    let bytes = cat(&[
        ld(1, b"sys-9"),
        ld(2, &resource),
        ld(4, ADDRESS_TYPE_URL.as_bytes()),
        ld(5, b"nonce-3"),
        ld(6, b"gone"),
    ]);
    let r = DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(r.system_version_info, "sys-9");
    assert_eq!(r.type_url, ADDRESS_TYPE_URL);
    assert_eq!(r.nonce, "nonce-3");
    assert_eq!(r.removed_resources, ["gone"]);
    let res = &r.resources[0];
    assert_eq!((res.name.as_str(), res.version.as_str()), ("uid-1", "v7"));
    assert_eq!(res.aliases, ["net/10.0.0.1"]);
    assert_eq!(res.ttl.unwrap().seconds, 30);
    let any = res.resource.as_ref().unwrap();
    let addr = workload::Address::from_any(any).unwrap();
    assert!(matches!(addr.kind, Some(address::Kind::Workload(_))));
}

#[test]
fn hand_built_delta_request_decodes_field_by_field() {
    let node = cat(&[
        ld(
            1,
            b"ztunnel~10.0.0.9~zt.istio-system~istio-system.svc.cluster.local",
        ),
        ld(2, b"c"),
        ld(
            3,
            &ld(1, &cat(&[ld(1, b"NODE_NAME"), ld(2, &ld(3, b"node-a"))])),
        ),
    ]);
    let bytes = cat(&[
        ld(1, &node),
        ld(2, AUTHORIZATION_TYPE_URL.as_bytes()),
        ld(3, b"*"),
        ld(4, b"old"),
        ld(5, &cat(&[ld(1, b"ns/pol"), ld(2, b"v1")])),
        ld(6, b"n-1"),
        ld(7, &cat(&[vi(1, 3), ld(2, b"bad policy ns/pol")])),
    ]);
    let r = DeltaDiscoveryRequest::decode(bytes.as_slice()).unwrap();
    let n = r.node.as_ref().unwrap();
    assert!(n.id.starts_with("ztunnel~10.0.0.9~"));
    assert_eq!(n.cluster, "c");
    assert_eq!(n.metadata_str("NODE_NAME"), Some("node-a"));
    assert_eq!(r.type_url, AUTHORIZATION_TYPE_URL);
    assert_eq!(r.resource_names_subscribe, ["*"]);
    assert_eq!(r.resource_names_unsubscribe, ["old"]);
    assert_eq!(
        r.initial_resource_versions,
        HashMap::from([("ns/pol".to_owned(), "v1".to_owned())])
    );
    assert_eq!(r.response_nonce, "n-1");
    let e = r.error_detail.as_ref().unwrap();
    assert_eq!((e.code, e.message.as_str()), (3, "bad policy ns/pol"));
    assert!(r.is_nack() && !r.is_ack());
    // And what we encode decodes back to the same thing.
    assert_eq!(
        DeltaDiscoveryRequest::decode(r.encode_to_vec().as_slice()).unwrap(),
        r
    );
}

#[test]
fn hand_built_workload_decodes_field_by_field() {
    let port = cat(&[vi(1, 80), vi(2, 8080)]);
    let services_entry = cat(&[
        ld(1, b"shop/web.shop.svc.cluster.local"),
        ld(2, &ld(1, &port)),
    ]);
    let gateway = cat(&[
        ld(2, &cat(&[ld(1, b"net2"), ld(2, &[10, 9, 9, 9])])),
        vi(3, 15008),
    ]);
    let workload = cat(&[
        ld(20, b"Kubernetes//v1/Pod/shop/web-1"),
        ld(1, b"web-1"),
        ld(2, b"shop"),
        ld(3, &[10, 244, 1, 5]),
        ld(3, &[0xfd, 0, 2, 0x44, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5]),
        ld(21, b"web-1.example"),
        ld(4, b"net1"),
        vi(5, 1),
        ld(6, b"td.example"),
        ld(7, b"web"),
        ld(8, &gateway),
        ld(19, &gateway),
        ld(9, b"node-a"),
        ld(10, b"web"),
        ld(11, b"v2"),
        vi(12, 2),
        ld(13, b"web-deploy"),
        vi(14, 1),
        ld(23, &cat(&[vi(1, 1), vi(2, 15088)])),
        ld(22, &services_entry),
        ld(16, b"shop/allow-web"),
        vi(17, 1),
        ld(18, b"Kubernetes"),
        ld(24, &cat(&[ld(1, b"r"), ld(2, b"z"), ld(3, b"s")])),
        vi(25, 1),
        ld(26, &ld(1, b"ext")),
        ld(27, &vi(1, 5)),
    ]);
    let a = workload::Address::decode(ld(1, &workload).as_slice()).unwrap();
    let Some(address::Kind::Workload(w)) = a.kind else {
        panic!("not a workload: {a:?}")
    };
    assert_eq!(w.uid, "Kubernetes//v1/Pod/shop/web-1");
    assert_eq!((w.name.as_str(), w.namespace.as_str()), ("web-1", "shop"));
    assert_eq!(w.addresses.len(), 2);
    assert_eq!(w.addresses[0], [10, 244, 1, 5]);
    assert_eq!(w.addresses[1].len(), 16);
    assert_eq!(w.hostname, "web-1.example");
    assert_eq!(w.network, "net1");
    assert_eq!(w.tunnel_protocol(), workload::TunnelProtocol::Hbone);
    assert_eq!(w.trust_domain, "td.example");
    assert_eq!(w.service_account, "web");
    for g in [
        w.waypoint.as_ref().unwrap(),
        w.network_gateway.as_ref().unwrap(),
    ] {
        assert_eq!(g.hbone_mtls_port, 15008);
        let Some(gateway_address::Destination::Address(na)) = &g.destination else {
            panic!("{g:?}")
        };
        assert_eq!(
            (na.network.as_str(), na.address.as_slice()),
            ("net2", &[10, 9, 9, 9][..])
        );
    }
    assert_eq!(w.node, "node-a");
    assert_eq!(w.canonical_name, "web");
    assert_eq!(w.canonical_revision, "v2");
    assert_eq!(w.workload_type(), workload::WorkloadType::Pod);
    assert_eq!(w.workload_name, "web-deploy");
    assert!(w.native_tunnel);
    let at = w.application_tunnel.as_ref().unwrap();
    assert_eq!(at.protocol(), workload::application_tunnel::Protocol::Proxy);
    assert_eq!(at.port, 15088);
    let ports = &w.services["shop/web.shop.svc.cluster.local"].ports;
    assert_eq!(
        ports,
        &[workload::Port {
            service_port: 80,
            target_port: 8080
        }]
    );
    assert_eq!(w.authorization_policies, ["shop/allow-web"]);
    assert_eq!(w.status(), workload::WorkloadStatus::Unhealthy);
    assert_eq!(w.cluster_id, "Kubernetes");
    let l = w.locality.as_ref().unwrap();
    assert_eq!(
        (l.region.as_str(), l.zone.as_str(), l.subzone.as_str()),
        ("r", "z", "s")
    );
    assert_eq!(w.network_mode(), workload::NetworkMode::HostNetwork);
    assert_eq!(w.extensions[0].name, "ext");
    assert_eq!(w.capacity, Some(5));
}

#[test]
fn hand_built_service_decodes_field_by_field() {
    let service = cat(&[
        ld(1, b"web"),
        ld(2, b"shop"),
        ld(3, b"web.shop.svc.cluster.local"),
        ld(4, &cat(&[ld(1, b"net1"), ld(2, &[10, 96, 0, 10])])),
        ld(5, &cat(&[vi(1, 80), vi(2, 8080)])),
        ld(6, b"spiffe://td/ns/shop/sa/web"),
        ld(
            7,
            &cat(&[
                ld(1, &cat(&[ld(1, b"shop"), ld(2, b"wp.shop.svc")])),
                vi(3, 15008),
            ]),
        ),
        ld(8, &cat(&[ld(1, &[2, 1]), vi(2, 2), vi(3, 1), vi(4, 1)])),
        vi(9, 3),
        ld(10, &ld(1, b"e")),
        vi(11, 1),
    ]);
    let a = workload::Address::decode(ld(2, &service).as_slice()).unwrap();
    let Some(address::Kind::Service(s)) = a.kind else {
        panic!("not a service: {a:?}")
    };
    assert_eq!((s.name.as_str(), s.namespace.as_str()), ("web", "shop"));
    assert_eq!(s.hostname, "web.shop.svc.cluster.local");
    assert_eq!(s.addresses[0].network, "net1");
    assert_eq!(s.addresses[0].address, [10, 96, 0, 10]);
    assert_eq!(
        s.ports,
        [workload::Port {
            service_port: 80,
            target_port: 8080
        }]
    );
    assert_eq!(s.subject_alt_names, ["spiffe://td/ns/shop/sa/web"]);
    let wp = s.waypoint.as_ref().unwrap();
    let Some(gateway_address::Destination::Hostname(h)) = &wp.destination else {
        panic!("{wp:?}")
    };
    assert_eq!(
        (h.namespace.as_str(), h.hostname.as_str()),
        ("shop", "wp.shop.svc")
    );
    let lb = s.load_balancing.as_ref().unwrap();
    use workload::load_balancing::{HealthPolicy, Mode, Scope};
    assert_eq!(
        lb.routing_preference().collect::<Vec<_>>(),
        [Scope::Zone, Scope::Region],
        "packed repeated enum"
    );
    assert_eq!(lb.mode(), Mode::Failover);
    assert_eq!(lb.health_policy(), HealthPolicy::AllowAll);
    assert_eq!(lb.dns_connect_strategy, 1);
    assert_eq!(s.ip_families(), workload::IpFamilies::Dual);
    assert_eq!(s.extensions[0].name, "e");
    assert!(s.canonical);
}

#[test]
fn hand_built_authorization_decodes_field_by_field() {
    let string_match = |tag: u64, v: &[u8]| ld(tag, v);
    let m = cat(&[
        ld(1, &string_match(1, b"shop")),
        ld(2, &string_match(2, b"kube-")),
        ld(3, &string_match(3, b"/sa/web")),
        ld(4, &ld(4, b"")),
        ld(5, &cat(&[ld(1, &[10, 0, 0, 0]), vi(2, 8)])),
        ld(6, &cat(&[ld(1, &[10, 0, 0, 1]), vi(2, 32)])),
        ld(7, &cat(&[ld(1, &[192, 168, 0, 0]), vi(2, 16)])),
        ld(8, &cat(&[ld(1, &[192, 168, 1, 1]), vi(2, 32)])),
        ld(9, &cat(&[varint(80), varint(443)])), // packed
        vi(10, 22),                              // not packed: also accepted
        ld(11, &cat(&[ld(1, b"shop"), ld(2, b"web")])),
        ld(12, &cat(&[ld(1, b"bank"), ld(2, b"vault")])),
    ]);
    let bytes = cat(&[
        ld(1, b"deny-plain"),
        ld(2, b"istio-system"),
        vi(3, 2),
        vi(4, 1),
        ld(5, &ld(1, &ld(2, &m))),
        vi(6, 1),
    ]);
    let p = Authorization::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        (p.name.as_str(), p.namespace.as_str()),
        ("deny-plain", "istio-system")
    );
    assert_eq!(p.scope(), security::Scope::WorkloadSelector);
    assert_eq!(p.action(), security::Action::Deny);
    assert!(p.dry_run);
    let m = &p.rules[0].clauses[0].matches[0];
    let kind = |s: &StringMatch| s.match_type.clone();
    assert_eq!(
        kind(&m.namespaces[0]),
        Some(MatchType::Exact("shop".into()))
    );
    assert_eq!(
        kind(&m.not_namespaces[0]),
        Some(MatchType::Prefix("kube-".into()))
    );
    assert_eq!(
        kind(&m.principals[0]),
        Some(MatchType::Suffix("/sa/web".into()))
    );
    assert_eq!(kind(&m.not_principals[0]), Some(MatchType::Presence(())));
    assert_eq!(
        (m.source_ips[0].address.as_slice(), m.source_ips[0].length),
        (&[10, 0, 0, 0][..], 8)
    );
    assert_eq!(m.not_source_ips[0].length, 32);
    assert_eq!(m.destination_ips[0].length, 16);
    assert_eq!(m.not_destination_ips[0].address, [192, 168, 1, 1]);
    assert_eq!(m.destination_ports, [80, 443]);
    assert_eq!(m.not_destination_ports, [22]);
    assert_eq!(m.service_accounts[0].namespace, "shop");
    assert_eq!(m.service_accounts[0].service_account, "web");
    assert_eq!(m.not_service_accounts[0].service_account, "vault");
}

#[test]
fn unknown_enum_values_reach_the_caller() {
    let p = Authorization::decode(cat(&[vi(3, 7), vi(4, 9)]).as_slice()).unwrap();
    assert_eq!((p.scope, p.action), (7, 9), "kept as numbers");
    assert!(security::Scope::try_from(p.scope).is_err());
    let w = Workload::decode(vi(5, 4).as_slice()).unwrap();
    assert_eq!(w.tunnel_protocol, 4);
}

#[test]
fn messages_round_trip() {
    let w = Workload {
        uid: "c//v1/Pod/ns/a".into(),
        addresses: vec![vec![10, 0, 0, 1]],
        services: HashMap::from([(
            "ns/svc.ns.svc.cluster.local".into(),
            workload::PortList {
                ports: vec![workload::Port {
                    service_port: 80,
                    target_port: 8080,
                }],
            },
        )]),
        capacity: Some(3),
        tunnel_protocol: workload::TunnelProtocol::Hbone as i32,
        ..Default::default()
    };
    let a = workload::Address {
        kind: Some(address::Kind::Workload(w)),
    };
    assert_eq!(workload::Address::from_any(&a.to_any()).unwrap(), a);

    let p = Authorization {
        name: "p".into(),
        namespace: "ns".into(),
        scope: security::Scope::Namespace as i32,
        rules: vec![security::Rule {
            clauses: vec![security::Clause {
                matches: vec![security::Match {
                    principals: vec![StringMatch {
                        match_type: Some(MatchType::Presence(())),
                    }],
                    destination_ports: vec![1, 65535],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: true,
        ..Default::default()
    };
    assert_eq!(Authorization::from_any(&p.to_any()).unwrap(), p);

    let resp = DeltaDiscoveryResponse {
        system_version_info: "s".into(),
        resources: vec![Resource::new("ns/p", "1", p.to_any())],
        type_url: AUTHORIZATION_TYPE_URL.into(),
        nonce: "n".into(),
        removed_resources: vec!["ns/q".into()],
    };
    assert_eq!(
        DeltaDiscoveryResponse::decode(resp.encode_to_vec().as_slice()).unwrap(),
        resp
    );
}

#[test]
fn an_any_of_another_type_or_garbage_is_refused() {
    let p = Authorization::default().to_any();
    let e = workload::Address::from_any(&p).unwrap_err();
    assert!(matches!(e, AnyError::WrongType { .. }), "{e}");
    assert!(
        e.to_string().contains("istio.security.Authorization"),
        "{e}"
    );
    let garbage = prost_types::Any {
        type_url: ADDRESS_TYPE_URL.into(),
        value: vec![0x0a, 0x05, 1],
    };
    let e = workload::Address::from_any(&garbage).unwrap_err();
    assert!(matches!(e, AnyError::Decode { .. }), "{e}");
}

#[test]
fn a_node_proxy_node_names_itself_as_the_control_plane_expects() {
    let n = Node::node_proxy(
        &["10.244.1.3".parse().unwrap(), "fd00::3".parse().unwrap()],
        "ringway-abc",
        "istio-system",
        "node-a",
        "cluster.local",
    )
    .with_metadata("CLUSTER_ID", "Kubernetes");
    assert_eq!(
        n.id,
        "ztunnel~10.244.1.3~ringway-abc.istio-system~istio-system.svc.cluster.local"
    );
    assert_eq!(n.metadata_str("NAME"), Some("ringway-abc"));
    assert_eq!(n.metadata_str("NAMESPACE"), Some("istio-system"));
    assert_eq!(n.metadata_str("INSTANCE_IPS"), Some("10.244.1.3,fd00::3"));
    assert_eq!(n.metadata_str("NODE_NAME"), Some("node-a"));
    assert_eq!(n.metadata_str("CLUSTER_ID"), Some("Kubernetes"));
    assert_eq!(n.metadata_str("MISSING"), None);
}
