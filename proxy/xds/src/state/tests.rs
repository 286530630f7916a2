//! Responses applied to the mesh: what each one changes, what a refusal
//! leaves behind, what the next stream resumes from.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use prost_types::Any;
use ringway_config::authz::{evaluate, ConnInfo, Identity};
use ringway_config::{MeshConfig, NoEnv};

use super::*;
use crate::proto::security::{Authorization, Clause, Match, Rule, StringMatch};
use crate::proto::workload::{address, Address, NetworkAddress, Port, PortList, Service, Workload};
use crate::Resource;

type Published = Arc<Mutex<Vec<Arc<Mesh>>>>;

fn state() -> (MeshState, Published) {
    let base = MeshConfig::load_str("rootNamespace: istio-system\n", "file.yaml", &NoEnv).unwrap();
    let seen: Published = Arc::default();
    let sink = seen.clone();
    let st = MeshState::new(
        Arc::new(base),
        Arc::new(XdsStatus::default()),
        Box::new(move |m| sink.lock().unwrap().push(m)),
    );
    (st, seen)
}

/// [`state`] with the workloads `pods` (namespace, name, address) applied.
fn state_with(pods: &[(&str, &str, &str)]) -> (MeshState, Published) {
    let (mut st, seen) = state();
    let resources = pods
        .iter()
        .map(|(ns, name, addr)| wl_res(pod(ns, name, addr), "1"))
        .collect();
    st.on_response(&response(ADDRESS_TYPE_URL, resources, &[]))
        .unwrap();
    (st, seen)
}

fn last(p: &Published) -> Arc<Mesh> {
    p.lock()
        .unwrap()
        .last()
        .cloned()
        .expect("a snapshot was published")
}

fn v4(s: &str) -> Vec<u8> {
    s.parse::<std::net::Ipv4Addr>().unwrap().octets().to_vec()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn pod(ns: &str, name: &str, addr: &str) -> Workload {
    Workload {
        uid: format!("c//Pod/{ns}/{name}"),
        name: name.into(),
        namespace: ns.into(),
        addresses: vec![v4(addr)],
        tunnel_protocol: 1,
        service_account: name.into(),
        ..Default::default()
    }
}

fn wl_res(w: Workload, version: &str) -> Resource {
    let name = w.uid.clone();
    Resource::new(
        name,
        version,
        Address {
            kind: Some(address::Kind::Workload(w)),
        }
        .to_any(),
    )
}

fn svc_res(ns: &str, host: &str, vip: &str, version: &str) -> Resource {
    let s = Service {
        name: host.into(),
        namespace: ns.into(),
        hostname: host.into(),
        addresses: vec![NetworkAddress {
            network: String::new(),
            address: v4(vip),
        }],
        ports: vec![Port {
            service_port: 80,
            target_port: 8080,
        }],
        ..Default::default()
    };
    Resource::new(
        format!("{ns}/{host}"),
        version,
        Address {
            kind: Some(address::Kind::Service(s)),
        }
        .to_any(),
    )
}

fn deny_from(ns: &str, name: &str, from_ns: &str) -> Resource {
    let a = Authorization {
        name: name.into(),
        namespace: ns.into(),
        scope: 1,
        action: 1,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    namespaces: vec![StringMatch {
                        match_type: Some(crate::proto::security::string_match::MatchType::Exact(
                            from_ns.into(),
                        )),
                    }],
                    ..Default::default()
                }],
            }],
        }],
        dry_run: false,
    };
    Resource::new(format!("{ns}/{name}"), "1", a.to_any())
}

fn response(type_url: &str, resources: Vec<Resource>, removed: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        type_url: type_url.into(),
        resources,
        removed_resources: removed.iter().map(|s| s.to_string()).collect(),
        nonce: "n".into(),
        ..Default::default()
    }
}

fn denied(m: &Mesh, dst: &str, from_ns: &str) -> bool {
    let w = m.workload_by_ip(ip(dst)).expect("destination known");
    let id = Identity::new("cluster.local", from_ns, "x");
    !evaluate(
        m,
        &ConnInfo {
            src_ip: ip("10.9.9.9"),
            src_identity: Some(&id),
            dst_workload: w,
            dst_ip: ip(dst),
            dst_port: 8080,
        },
    )
    .is_allowed()
}

#[test]
fn responses_are_applied_and_published_with_the_files_settings() {
    let (mut st, seen) = state();
    assert!(!st.status().synced());
    let mut web = pod("shop", "web-0", "10.1.0.10");
    web.services.insert(
        "shop/web".into(),
        PortList {
            ports: vec![Port {
                service_port: 80,
                target_port: 9090,
            }],
        },
    );
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![wl_res(web, "1"), svc_res("shop", "web", "10.96.0.1", "1")],
        &[],
    ))
    .unwrap();
    assert_eq!(st.status().waiting_for(), ["authorization policies"]);
    let m = last(&seen);
    assert!(!m.is_complete(), "a control plane's mesh may lag");
    assert_eq!(m.root_namespace(), "istio-system", "the file's settings");
    let svc = m.service_by_vip(ip("10.96.0.1")).unwrap();
    let eps: Vec<_> = m
        .healthy_endpoints(svc, 80, false)
        .map(|(_, a)| a)
        .collect();
    assert_eq!(eps, ["10.1.0.10:9090".parse().unwrap()]);
    st.on_response(&response(
        AUTHORIZATION_TYPE_URL,
        vec![deny_from("shop", "no-evil", "evil")],
        &[],
    ))
    .unwrap();
    assert!(st.status().synced());
    let m = last(&seen);
    assert!(denied(&m, "10.1.0.10", "evil"));
    assert!(!denied(&m, "10.1.0.10", "front"));
    assert_eq!(
        st.resource_versions(ADDRESS_TYPE_URL),
        [
            ("c//Pod/shop/web-0".to_owned(), "1".to_owned()),
            ("shop/web".to_owned(), "1".to_owned())
        ]
        .into()
    );
    assert_eq!(st.resource_versions(AUTHORIZATION_TYPE_URL).len(), 1);

    // Removals.
    st.on_response(&response(AUTHORIZATION_TYPE_URL, vec![], &["shop/no-evil"]))
        .unwrap();
    assert!(!denied(&last(&seen), "10.1.0.10", "evil"));
    st.on_response(&response(ADDRESS_TYPE_URL, vec![], &["c//Pod/shop/web-0"]))
        .unwrap();
    let m = last(&seen);
    assert!(m.workload_by_ip(ip("10.1.0.10")).is_none());
    assert!(st.resource_versions(AUTHORIZATION_TYPE_URL).is_empty());
    assert_eq!(st.resource_versions(ADDRESS_TYPE_URL).len(), 1);
}

#[test]
fn an_update_replaces_only_what_it_names() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![
            wl_res(pod("shop", "a", "10.1.0.1"), "1"),
            wl_res(pod("shop", "b", "10.1.0.2"), "1"),
        ],
        &[],
    ))
    .unwrap();
    let before = last(&seen);
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![wl_res(pod("shop", "a", "10.1.0.9"), "2")],
        &[],
    ))
    .unwrap();
    let after = last(&seen);
    assert!(after.workload_by_ip(ip("10.1.0.1")).is_none());
    assert_eq!(after.workload_by_ip(ip("10.1.0.9")).unwrap().name, "a");
    assert!(
        std::ptr::eq(
            before.workload_by_ip(ip("10.1.0.2")).unwrap(),
            after.workload_by_ip(ip("10.1.0.2")).unwrap()
        ),
        "b was not touched: the same entry is shared"
    );
    assert_eq!(before.workload_by_ip(ip("10.1.0.1")).unwrap().name, "a");
}

/// A refused update that agrees with the copy held on how the workload's
/// connections are authorized keeps that copy in force (a control plane
/// newer than the proxy must not take down what it served); one that cannot
/// be decoded drops it, its address resolving to nothing. A refused new
/// resource's addresses resolve to nothing (refused, never taken for
/// addresses outside the mesh), and keep doing so when a later version
/// cannot be decoded at all. Every refused name is listed on the next
/// stream with a version no server gives, so it comes again, or its removal.
#[test]
fn adversarial_unreadable_addresses_are_refused_by_name_keeping_only_a_copy_that_agrees() {
    let (mut st, seen) = state_with(&[("shop", "a", "10.1.0.1"), ("shop", "d", "10.1.0.4")]);
    let garbage = |name: &str, version: &str| {
        Resource::new(
            name,
            version,
            Any {
                type_url: ADDRESS_TYPE_URL.into(),
                value: vec![0xff, 0xff, 0xff, 0x0f, 0x01],
            },
        )
    };
    let mut newer = pod("shop", "a", "10.1.0.1");
    newer.tunnel_protocol = 7;
    let mut bad = pod("shop", "b", "10.1.0.2");
    bad.addresses.push(vec![9; 7]);
    let nack = st
        .on_response(&response(
            ADDRESS_TYPE_URL,
            vec![
                wl_res(newer, "2"),
                garbage("c//Pod/shop/d", "2"),
                wl_res(bad, "1"),
                wl_res(pod("shop", "c", "10.1.0.3"), "1"),
                Resource::new(
                    "shop/x",
                    "1",
                    Any {
                        type_url: "type.googleapis.com/other.Thing".into(),
                        value: vec![],
                    },
                ),
            ],
            &[],
        ))
        .unwrap_err();
    let m = last(&seen);
    for want in [
        "c//Pod/shop/a: workload.tunnelProtocol: 7 is not a tunnel protocol",
        "the copy held (version \"1\") stays in force",
        "c//Pod/shop/d: resource is not a valid",
        "the copy held dropped: the new version could not be read",
        "c//Pod/shop/b: workload.addresses[1]: 7 bytes are not an IPv4",
        "(10.1.0.2) resolve to nothing",
        "shop/x: resource is of type",
    ] {
        assert!(nack.message.contains(want), "{want:?} not in {nack}");
    }
    assert_eq!(
        m.workload_by_ip(ip("10.1.0.1")).unwrap().name,
        "a",
        "the copy held before is still served"
    );
    assert_eq!(m.refused_claim(ip("10.1.0.1")), None);
    assert!(
        m.workload_by_ip(ip("10.1.0.4")).is_none(),
        "an undecodable version's copy"
    );
    assert_eq!(m.refused_claim(ip("10.1.0.4")), Some("c//Pod/shop/d"));
    assert!(m.workload_by_ip(ip("10.1.0.2")).is_none());
    assert_eq!(
        m.refused_claim(ip("10.1.0.2")),
        Some("c//Pod/shop/b"),
        "a refused new workload's readable address resolves to nothing"
    );
    assert_eq!(
        m.workload_by_ip(ip("10.1.0.3")).unwrap().name,
        "c",
        "the rest applied"
    );
    let versions = st.resource_versions(ADDRESS_TYPE_URL);
    let want: HashMap<String, String> = [
        ("c//Pod/shop/a", "1"),
        ("c//Pod/shop/b", ""),
        ("c//Pod/shop/c", "1"),
        ("c//Pod/shop/d", ""),
        ("shop/x", ""),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v.to_owned()))
    .collect();
    assert_eq!(
        versions, want,
        "a refused update resumes from the copy held; a refused name is listed with a version no server gives"
    );
    assert_eq!(st.status().problems().len(), 4);
    // A version of b that cannot be decoded at all: its address still
    // resolves to nothing (never outside the mesh).
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![garbage("c//Pod/shop/b", "2")],
        &[],
    ))
    .unwrap_err();
    assert_eq!(
        last(&seen).refused_claim(ip("10.1.0.2")),
        Some("c//Pod/shop/b")
    );
    // A readable version clears the problem and the refused claim.
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![
            wl_res(pod("shop", "a", "10.1.0.1"), "3"),
            wl_res(pod("shop", "b", "10.1.0.2"), "3"),
            wl_res(pod("shop", "d", "10.1.0.4"), "3"),
        ],
        &[],
    ))
    .unwrap();
    assert_eq!(st.status().problems().len(), 1);
    let m = last(&seen);
    assert!(m.workload_by_ip(ip("10.1.0.1")).is_some());
    assert_eq!(m.workload_by_ip(ip("10.1.0.2")).unwrap().name, "b");
    assert_eq!(m.workload_by_ip(ip("10.1.0.4")).unwrap().name, "d");
    assert_eq!(m.refused_claim(ip("10.1.0.2")), None);
    assert_eq!(m.refused_claim(ip("10.1.0.4")), None);
    // A refused name the server removes (it went while the proxy was
    // refusing it): nothing of it is left.
    st.on_response(&response(ADDRESS_TYPE_URL, vec![], &["shop/x"]))
        .unwrap();
    assert!(st.status().problems().is_empty());
    assert!(!st
        .resource_versions(ADDRESS_TYPE_URL)
        .contains_key("shop/x"));
}

/// A refused update that changes how the workload's connections are
/// authorized (here: a policy that selects it by label, which the control
/// plane lists on the workload) cannot be stood in for by the copy held,
/// which would let through what that policy denies: the copy is dropped and
/// its address resolves to nothing.
#[test]
fn adversarial_a_refused_update_naming_a_new_policy_drops_the_copy_held() {
    let (mut st, seen) = state_with(&[("shop", "a", "10.1.0.1")]);
    let mut next = pod("shop", "a", "10.1.0.1");
    next.tunnel_protocol = 7;
    next.authorization_policies = vec!["shop/deny-front".into()];
    let nack = st
        .on_response(&response(ADDRESS_TYPE_URL, vec![wl_res(next, "2")], &[]))
        .unwrap_err();
    assert!(
        nack.message
            .contains("changes how its connections are authorized"),
        "{nack}"
    );
    let m = last(&seen);
    assert!(m.workload_by_ip(ip("10.1.0.1")).is_none());
    assert_eq!(m.refused_claim(ip("10.1.0.1")), Some("c//Pod/shop/a"));
}

/// A refused update that sends the workload's traffic another way (here a
/// waypoint) cannot be stood in for by the copy held: the copy is dropped
/// and its addresses, old and new, resolve to nothing.
#[test]
fn adversarial_a_refused_update_naming_a_waypoint_drops_the_copy_held() {
    let (mut st, seen) = state_with(&[("shop", "a", "10.1.0.1")]);
    let mut next = pod("shop", "a", "10.1.0.1");
    next.addresses.push(v4("10.1.0.9"));
    next.tunnel_protocol = 7;
    next.waypoint = Some(crate::proto::workload::GatewayAddress {
        destination: None,
        hbone_mtls_port: 15008,
    });
    let nack = st
        .on_response(&response(ADDRESS_TYPE_URL, vec![wl_res(next, "2")], &[]))
        .unwrap_err();
    assert!(nack.message.contains("the copy held dropped"), "{nack}");
    let m = last(&seen);
    for a in ["10.1.0.1", "10.1.0.9"] {
        assert!(m.workload_by_ip(ip(a)).is_none(), "{a}");
        assert_eq!(m.refused_claim(ip(a)), Some("c//Pod/shop/a"), "{a}");
    }
    assert_eq!(
        st.resource_versions(ADDRESS_TYPE_URL).get("c//Pod/shop/a"),
        Some(&String::new())
    );
}

/// A refused update of a service keeps its VIP resolving to the copy held:
/// never taken for an address outside the mesh. A refused new service's
/// VIP resolves to nothing.
#[test]
fn adversarial_a_refused_service_keeps_its_copy_or_its_vip_resolves_to_nothing() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![svc_res("shop", "web.shop.svc", "10.96.0.1", "1")],
        &[],
    ))
    .unwrap();
    let bad_port = |host: &str, vip: &str, version: &str| {
        let mut r = svc_res("shop", host, vip, version);
        let mut a =
            <Address as prost::Message>::decode(&r.resource.as_ref().unwrap().value[..]).unwrap();
        if let Some(address::Kind::Service(s)) = &mut a.kind {
            s.ports[0].service_port = 0;
        }
        r.resource = Some(a.to_any());
        r
    };
    let nack = st
        .on_response(&response(
            ADDRESS_TYPE_URL,
            vec![
                bad_port("web.shop.svc", "10.96.0.1", "2"),
                bad_port("new.shop.svc", "10.96.0.2", "1"),
            ],
            &[],
        ))
        .unwrap_err();
    assert!(
        nack.message.contains("shop/web.shop.svc: service.ports[0]"),
        "{nack}"
    );
    let m = last(&seen);
    assert_eq!(
        m.service_by_vip(ip("10.96.0.1")).unwrap().hostname,
        "web.shop.svc",
        "the copy held"
    );
    assert!(m.service_by_vip(ip("10.96.0.2")).is_none());
    assert_eq!(m.refused_claim(ip("10.96.0.2")), Some("shop/new.shop.svc"));
    // Removed: its VIP is free again.
    st.on_response(&response(ADDRESS_TYPE_URL, vec![], &["shop/new.shop.svc"]))
        .unwrap();
    assert_eq!(last(&seen).refused_claim(ip("10.96.0.2")), None);
}

#[test]
fn adversarial_a_name_twice_in_one_response_applies_neither_version() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![wl_res(pod("shop", "a", "10.1.0.1"), "1")],
        &[],
    ))
    .unwrap();
    let nack = st
        .on_response(&response(
            ADDRESS_TYPE_URL,
            vec![
                wl_res(pod("shop", "a", "10.1.0.7"), "2"),
                wl_res(pod("shop", "a", "10.1.0.8"), "3"),
            ],
            &[],
        ))
        .unwrap_err();
    assert!(
        nack.message.contains("named 2 times in one response"),
        "{nack}"
    );
    let m = last(&seen);
    assert_eq!(
        m.workload_by_ip(ip("10.1.0.1")).unwrap().name,
        "a",
        "the copy held stays in force"
    );
    for a in ["10.1.0.7", "10.1.0.8"] {
        assert!(m.workload_by_ip(ip(a)).is_none(), "{a}");
        assert_eq!(
            m.refused_claim(ip(a)),
            Some("c//Pod/shop/a"),
            "{a}: an address only the refused versions claim resolves to nothing"
        );
    }
    // Policies named twice deny everything they could select.
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![wl_res(pod("shop", "a", "10.1.0.1"), "4")],
        &[],
    ))
    .unwrap();
    let nack = st
        .on_response(&response(
            AUTHORIZATION_TYPE_URL,
            vec![
                deny_from("shop", "p", "evil"),
                deny_from("shop", "p", "other"),
            ],
            &[],
        ))
        .unwrap_err();
    assert!(nack.message.contains("shop/p: named 2 times"), "{nack}");
    assert!(denied(&last(&seen), "10.1.0.1", "front"));
}

#[test]
fn adversarial_garbage_policy_denies_everything_in_its_namespace() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![
            wl_res(pod("shop", "a", "10.1.0.1"), "1"),
            wl_res(pod("other", "b", "10.2.0.1"), "1"),
        ],
        &[],
    ))
    .unwrap();
    let nack = st
        .on_response(&response(
            AUTHORIZATION_TYPE_URL,
            vec![Resource::new(
                "shop/corrupt",
                "1",
                Any {
                    type_url: AUTHORIZATION_TYPE_URL.into(),
                    value: vec![0x0a, 0xff],
                },
            )],
            &[],
        ))
        .unwrap_err();
    assert!(nack.message.contains("shop/corrupt"), "{nack}");
    let m = last(&seen);
    assert!(denied(&m, "10.1.0.1", "front"), "its namespace: denied");
    assert!(
        !denied(&m, "10.2.0.1", "front"),
        "another namespace: untouched"
    );
    assert_eq!(
        st.resource_versions(AUTHORIZATION_TYPE_URL),
        HashMap::from([("shop/corrupt".to_owned(), String::new())]),
        "listed on the next stream with a version no server gives: sent again, or its removal"
    );
    // Removed: the deny goes with it.
    st.on_response(&response(AUTHORIZATION_TYPE_URL, vec![], &["shop/corrupt"]))
        .unwrap();
    assert!(!denied(&last(&seen), "10.1.0.1", "front"));
    assert!(st.status().problems().is_empty());
}

#[test]
fn adversarial_two_workloads_claiming_one_address_resolve_to_neither() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![
            wl_res(pod("shop", "a", "10.1.0.1"), "1"),
            wl_res(pod("evil", "b", "10.1.0.1"), "1"),
        ],
        &[],
    ))
    .unwrap();
    assert!(last(&seen).workload_by_ip(ip("10.1.0.1")).is_none());
    let c = st.status().contested();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].1, ["workload c//Pod/evil/b", "workload c//Pod/shop/a"]);
    st.on_response(&response(ADDRESS_TYPE_URL, vec![], &["c//Pod/evil/b"]))
        .unwrap();
    assert_eq!(
        last(&seen).workload_by_ip(ip("10.1.0.1")).unwrap().name,
        "a"
    );
    assert!(st.status().contested().is_empty());
}

#[test]
fn a_name_that_changes_kind_replaces_the_old_entry() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![svc_res("shop", "web", "10.96.0.1", "1")],
        &[],
    ))
    .unwrap();
    let mut w = pod("shop", "web", "10.1.0.5");
    w.uid = "shop/web".into();
    st.on_response(&response(ADDRESS_TYPE_URL, vec![wl_res(w, "2")], &[]))
        .unwrap();
    let m = last(&seen);
    assert!(m.service_by_vip(ip("10.96.0.1")).is_none());
    assert!(m.workload_by_ip(ip("10.1.0.5")).is_some());
}

#[test]
fn a_reloaded_file_changes_the_settings_not_the_entries() {
    let (mut st, seen) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![wl_res(pod("shop", "a", "10.1.0.1"), "1")],
        &[],
    ))
    .unwrap();
    let file = MeshConfig::load_str(
        "trustDomain: example.org\nworkloads:\n  - {uid: f, name: f, namespace: x, ips: [10.7.0.1], node: n}\n",
        "file.yaml",
        &NoEnv,
    )
    .unwrap();
    st.set_base(Arc::new(file));
    let m = last(&seen);
    assert_eq!(m.trust_domain(), "example.org");
    assert!(m.workload_by_ip(ip("10.1.0.1")).is_some());
    assert!(
        m.workload_by_ip(ip("10.7.0.1")).is_none(),
        "the file's entries are not the mesh's"
    );
}

#[test]
fn metrics_follow_the_state() {
    let (mut st, _) = state();
    st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![
            wl_res(pod("shop", "a", "10.1.0.1"), "1"),
            svc_res("shop", "web", "10.96.0.1", "1"),
        ],
        &[],
    ))
    .unwrap();
    let _ = st.on_response(&response(
        ADDRESS_TYPE_URL,
        vec![Resource::new("x", "1", Any::default())],
        &[],
    ));
    let mut r = Registry::default();
    st.status().register(&mut r);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
    for line in [
        "ringway_xds_resources{kind=\"workload\"} 1",
        "ringway_xds_resources{kind=\"service\"} 1",
        "ringway_xds_refused_resources{kind=\"address\"} 1",
        "istio_xds_message_total{url=\"type.googleapis.com/istio.workload.Address\"} 2",
        "ringway_xds_nacks_total{url=\"type.googleapis.com/istio.workload.Address\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

/// A resource that cannot be read says which way: no payload, another type.
#[test]
fn an_unreadable_resource_says_why() {
    let mut r = Resource::new(
        "shop/x",
        "1",
        Any {
            type_url: "type.googleapis.com/other.Thing".into(),
            value: vec![],
        },
    );
    let e = decode::<Address>(&r).unwrap_err();
    assert!(
        matches!(e, Unreadable::Any(AnyError::WrongType { .. })),
        "{e:?}"
    );
    r.resource = None;
    let e = decode::<Authorization>(&r).unwrap_err();
    assert!(matches!(e, Unreadable::NoPayload), "{e:?}");
    assert_eq!(e.to_string(), "the resource carries no payload");
}

/// A garbage policy whose name says no namespace stands in the root
/// namespace under a name of its own: it never replaces (nor, once
/// removed, takes away) the root namespace's policy of that short name.
#[test]
fn adversarial_a_garbage_policy_without_a_namespace_never_takes_another_policys_place() {
    let (mut st, seen) = state_with(&[("shop", "a", "10.1.0.1")]);
    let mut global = deny_from("istio-system", "foo", "front");
    {
        let mut a: Authorization = decode(&global).unwrap();
        a.scope = crate::proto::security::Scope::Global as i32;
        global = Resource::new("istio-system/foo", "1", a.to_any());
    }
    st.on_response(&response(AUTHORIZATION_TYPE_URL, vec![global], &[]))
        .unwrap();
    assert!(denied(&last(&seen), "10.1.0.1", "front"));
    assert!(!denied(&last(&seen), "10.1.0.1", "back"));
    let garbage = Resource::new(
        "foo",
        "1",
        Any {
            type_url: AUTHORIZATION_TYPE_URL.into(),
            value: vec![0x0a, 0xff],
        },
    );
    let nack = st
        .on_response(&response(AUTHORIZATION_TYPE_URL, vec![garbage], &[]))
        .unwrap_err();
    assert!(nack.message.contains("foo"), "{nack}");
    assert!(
        denied(&last(&seen), "10.1.0.1", "back"),
        "garbage: denies all"
    );
    st.on_response(&response(AUTHORIZATION_TYPE_URL, vec![], &["foo"]))
        .unwrap();
    let m = last(&seen);
    assert!(
        denied(&m, "10.1.0.1", "front"),
        "istio-system/foo is still in force"
    );
    assert!(
        !denied(&m, "10.1.0.1", "back"),
        "the garbage's deny is gone"
    );
    assert_eq!(
        st.resource_versions(AUTHORIZATION_TYPE_URL)
            .get("istio-system/foo")
            .map(String::as_str),
        Some("1")
    );
}

/// A DENY whose only condition is a field this proxy does not know (a
/// newer control plane's): prost drops the field, which left an empty
/// match that matches nothing, a DENY that denied nothing. It now matches
/// every connection, and the NACK names the field; an ALLOW's grants
/// nothing.
#[test]
fn adversarial_a_condition_of_a_newer_schema_errs_toward_deny() {
    use crate::proto::security::{self, string_match::MatchType};
    use prost::Message as _;
    let (mut st, seen) = state_with(&[("shop", "a", "10.1.0.1"), ("other", "b", "10.2.0.1")]);
    // Field 13 of Match, as a newer schema would add it.
    let mut unknown = Vec::new();
    prost::encoding::encode_key(13, prost::encoding::WireType::LengthDelimited, &mut unknown);
    prost::encoding::encode_varint(3, &mut unknown);
    unknown.extend_from_slice(b"new");
    let policy_bytes = |ns: &str, name: &str, action: i32, known: security::Match| {
        let mut m = known.encode_to_vec();
        m.extend_from_slice(&unknown);
        let mut clause = Vec::new();
        prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut clause);
        prost::encoding::encode_varint(m.len() as u64, &mut clause);
        clause.extend(m);
        let mut rule = Vec::new();
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut rule);
        prost::encoding::encode_varint(clause.len() as u64, &mut rule);
        rule.extend(clause);
        let mut a = Authorization {
            name: name.into(),
            namespace: ns.into(),
            scope: 1,
            action,
            rules: vec![],
            dry_run: false,
        }
        .encode_to_vec();
        prost::encoding::encode_key(5, prost::encoding::WireType::LengthDelimited, &mut a);
        prost::encoding::encode_varint(rule.len() as u64, &mut a);
        a.extend(rule);
        Resource::new(
            format!("{ns}/{name}"),
            "1",
            Any {
                type_url: AUTHORIZATION_TYPE_URL.into(),
                value: a,
            },
        )
    };
    let deny = policy_bytes("shop", "deny-new", 1, security::Match::default());
    let nack = st
        .on_response(&response(AUTHORIZATION_TYPE_URL, vec![deny], &[]))
        .unwrap_err();
    assert!(
        nack.message.contains("rules[0].clauses[0].matches[0]: fields 13 unknown to this proxy: it matches every connection"),
        "{nack}"
    );
    let m = last(&seen);
    assert!(denied(&m, "10.1.0.1", "front"), "the DENY denies");
    assert!(!denied(&m, "10.2.0.1", "front"), "in its namespace only");

    // An ALLOW of `other` for `front` with the unknown condition: grants
    // nothing, so `front` is refused there.
    let front = security::Match {
        namespaces: vec![StringMatch {
            match_type: Some(MatchType::Exact("front".into())),
        }],
        ..Default::default()
    };
    let allow = policy_bytes("other", "allow-new", 0, front);
    st.on_response(&response(AUTHORIZATION_TYPE_URL, vec![allow], &[]))
        .unwrap_err();
    assert!(denied(&last(&seen), "10.2.0.1", "front"));
}

/// A name sent twice, one copy of which cannot be decoded: nothing shows
/// what that copy says, so the copy held is dropped and its address
/// resolves to nothing, as for one undecodable version.
#[test]
fn adversarial_a_name_twice_with_an_undecodable_copy_drops_the_copy_held() {
    let (mut st, seen) = state_with(&[("shop", "a", "10.1.0.1")]);
    let garbage = Resource::new(
        "c//Pod/shop/a",
        "3",
        Any {
            type_url: ADDRESS_TYPE_URL.into(),
            value: vec![0xff, 0xff, 0xff, 0x0f, 0x01],
        },
    );
    let nack = st
        .on_response(&response(
            ADDRESS_TYPE_URL,
            vec![wl_res(pod("shop", "a", "10.1.0.1"), "2"), garbage],
            &[],
        ))
        .unwrap_err();
    assert!(nack.message.contains("could not be read"), "{nack}");
    let m = last(&seen);
    assert!(m.workload_by_ip(ip("10.1.0.1")).is_none());
    assert_eq!(m.refused_claim(ip("10.1.0.1")), Some("c//Pod/shop/a"));
}

/// A refused update that moves a workload into the mesh's tunnel (its
/// tunnel protocol NONE -> HBONE), same identity otherwise: the plain copy
/// held would have sources send it plaintext, so it is dropped.
#[test]
fn adversarial_a_refused_update_into_the_tunnel_drops_the_plain_copy_held() {
    let (mut st, seen) = state();
    let mut plain = pod("shop", "a", "10.1.0.1");
    plain.tunnel_protocol = 0;
    st.on_response(&response(ADDRESS_TYPE_URL, vec![wl_res(plain, "1")], &[]))
        .unwrap();
    assert!(!last(&seen).workload_by_ip(ip("10.1.0.1")).unwrap().tunnel);
    let mut next = pod("shop", "a", "10.1.0.1");
    next.addresses.push(vec![9; 7]);
    let nack = st
        .on_response(&response(ADDRESS_TYPE_URL, vec![wl_res(next, "2")], &[]))
        .unwrap_err();
    assert!(nack.message.contains("in the mesh's tunnel"), "{nack}");
    let m = last(&seen);
    assert!(m.workload_by_ip(ip("10.1.0.1")).is_none());
    assert_eq!(m.refused_claim(ip("10.1.0.1")), Some("c//Pod/shop/a"));
}
