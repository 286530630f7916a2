//! `ringway-redirect`'s owner tag and its sysctls (`tcp_migrate_req`, the
//! conntrack `TIME_WAIT` cap), in real
//! pod network namespaces: what `apply_for` stores, what `read_tag` gives
//! back (also for tags that span the chains), what `nft list` shows, and how
//! `verify`/`verify_for` report a missing or foreign owner and a reset sysctl.
//!
//! Every test runs inside `run_isolated` on its own virtual node.

use ringway_redirect::{
    apply, apply_for, read_tag, remove, verify, verify_for, CaptureMode, CaptureSpec, Drift,
    PodTag, RedirectError,
};
use ringway_testbed::{run_isolated, Pod, VirtualNode};

fn nft(pod: &Pod, args: &[&str]) -> String {
    pod.netns.nft(args)
}

fn tag_for(pod: &Pod, uid: &str) -> PodTag {
    PodTag {
        uid: uid.into(),
        name: pod.name.clone(),
        namespace: "shop".into(),
        service_account: "web".into(),
        node: "node-a".into(),
        container_id: "f00d".repeat(16),
        ips: vec![pod.ipv4.into(), pod.ipv6.into()],
    }
}

/// The table's handle, then its rules' handles: what changes on a re-apply
/// (rule handles restart in a re-created table, the table handle does not).
fn handles(pod: &Pod) -> Vec<String> {
    pod.netns.ringway_handles()
}

#[test]
fn owner_tag_round_trips_and_survives_verify() {
    run_isolated("owner_tag_round_trips_and_survives_verify", || {
        let vn = VirtualNode::build(1, 1).expect("virtual node");
        let pod = vn.pod(0);
        let spec = CaptureSpec::default();
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), None, "no table, no tag");

        let tag = tag_for(pod, "7d0e1f2a-3b4c-4d5e-8f60-718293a4b5c6");
        apply_for(pod.netns.fd(), &spec, &tag).expect("apply_for");
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), Some(tag.clone()));
        assert_eq!(verify_for(pod.netns.fd(), &spec, &tag).unwrap(), vec![]);
        assert_eq!(verify(pod.netns.fd(), &spec).unwrap(), vec![]);

        // nft shows the tag as the table's comment.
        let listing = nft(pod, &["list", "table", "inet", "ringway"]);
        let want = format!("comment \"ringway-pod:0/1:{}\"", tag.encode());
        assert!(listing.contains(&want), "{listing}");

        // Verify reads; it never rewrites (the rule handles stay).
        let before = handles(pod);
        assert_eq!(before.len(), 22, "{before:?}");
        for _ in 0..3 {
            assert_eq!(verify_for(pod.netns.fd(), &spec, &tag).unwrap(), vec![]);
        }
        assert_eq!(handles(pod), before);

        // Another pod's tag is drift; so is the lack of one.
        let other = PodTag {
            uid: "other".into(),
            ..tag.clone()
        };
        let d = verify_for(pod.netns.fd(), &spec, &other).unwrap();
        assert_eq!(
            d,
            vec![Drift::OwnerDiffers {
                want: other.encode(),
                found: tag.encode()
            }]
        );
        assert!(d[0]
            .to_string()
            .starts_with("table inet ringway owner tag differs: want v1|other|shop|"));
        apply(pod.netns.fd(), &spec).expect("plain apply");
        assert_eq!(
            read_tag(pod.netns.fd()).unwrap(),
            None,
            "plain apply drops it"
        );
        let d = verify_for(pod.netns.fd(), &spec, &tag).unwrap();
        assert_eq!(
            d.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
            vec!["table inet ringway has no owner tag (want pod 7d0e1f2a-3b4c-4d5e-8f60-718293a4b5c6)"]
        );

        // Re-applying with the tag (and with another mode) keeps it readable.
        let redirect = CaptureSpec {
            mode: CaptureMode::Redirect,
            ..CaptureSpec::default()
        };
        apply_for(pod.netns.fd(), &redirect, &tag).expect("apply_for redirect");
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), Some(tag.clone()));
        remove(pod.netns.fd(), &redirect).expect("remove");
        assert_eq!(
            read_tag(pod.netns.fd()).unwrap(),
            None,
            "remove takes the tag"
        );
    });
}

#[test]
fn long_owner_tags_span_the_chains_and_too_long_ones_are_refused() {
    run_isolated("long_owner_tags_span_the_chains", || {
        let vn = VirtualNode::build(2, 1).expect("virtual node");
        let pod = vn.pod(0);
        let spec = CaptureSpec::default();
        // Kubernetes' own limits: names up to 253 bytes, namespace 63.
        let long = PodTag {
            name: "p".repeat(253),
            namespace: "n".repeat(63),
            service_account: "s".repeat(200),
            node: "node-with-a-long-name.example.internal".into(),
            ..tag_for(pod, "1b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9")
        };
        apply_for(pod.netns.fd(), &spec, &long).expect("apply_for long tag");
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), Some(long.clone()));
        assert_eq!(verify_for(pod.netns.fd(), &spec, &long).unwrap(), vec![]);
        let listing = nft(pod, &["list", "table", "inet", "ringway"]);
        assert!(listing.contains("comment \"ringway-pod:3/4:"), "{listing}");

        // A chain's piece gone: the tag is unreadable, and said so.
        nft(pod, &["delete", "chain", "inet", "ringway", "nat_output"]);
        let e = read_tag(pod.netns.fd()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "owner tag of table inet ringway is unreadable: piece 3 of 4 is missing"
        );
        let d = verify_for(pod.netns.fd(), &spec, &long).unwrap();
        assert!(
            d.contains(&Drift::OwnerUnreadable {
                detail: "piece 3 of 4 is missing".into()
            }),
            "{d:?}"
        );

        // Too long for four objects: refused before anything changes.
        apply_for(pod.netns.fd(), &spec, &long).expect("repair");
        let before = handles(pod);
        let huge = PodTag {
            service_account: "s".repeat(253),
            node: "x".repeat(253),
            ..long.clone()
        };
        let e = apply_for(pod.netns.fd(), &spec, &huge).unwrap_err();
        assert!(matches!(e, RedirectError::TagTooLong(_)), "{e}");
        assert!(
            e.to_string().starts_with(
                "owner tag refused: the owner tag of pod 1b2c3d4e-5f60-4718-8293-a4b5c6d7e8f9 needs"
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .ends_with("but the rule set stores at most 896 (4 objects of 224 bytes)"),
            "{e}"
        );
        assert_eq!(handles(pod), before);
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), Some(long));
    });
}

#[test]
fn apply_sets_tcp_migrate_req_and_verify_reports_it() {
    run_isolated("apply_sets_tcp_migrate_req", || {
        let vn = VirtualNode::build(3, 1).expect("virtual node");
        let pod = vn.pod(0);
        let key = "net.ipv4.tcp_migrate_req";
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "0", "kernel default");
        // The node namespace is not touched.
        let node_before = vn.node.read_sysctl(key).unwrap();

        let spec = CaptureSpec::default();
        apply(pod.netns.fd(), &spec).expect("apply");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "1");
        assert_eq!(vn.node.read_sysctl(key).unwrap(), node_before);
        assert_eq!(verify(pod.netns.fd(), &spec).unwrap(), vec![]);

        pod.netns.sysctl(key, "0").unwrap();
        let d = verify(pod.netns.fd(), &spec).unwrap();
        assert_eq!(
            d,
            vec![Drift::SysctlDiffers {
                key: key.into(),
                want: "1".into(),
                found: "0".into()
            }]
        );
        assert_eq!(
            d[0].to_string(),
            "sysctl net.ipv4.tcp_migrate_req is 0, want 1"
        );

        apply(pod.netns.fd(), &spec).expect("re-apply");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "1");
        assert_eq!(verify(pod.netns.fd(), &spec).unwrap(), vec![]);

        // remove leaves it (harmless), and a fresh apply_for sets it too.
        remove(pod.netns.fd(), &spec).expect("remove");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "1");
        pod.netns.sysctl(key, "0").unwrap();
        apply_for(pod.netns.fd(), &spec, &tag_for(pod, "u")).expect("apply_for");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "1");
    });
}

#[test]
fn apply_caps_the_conntrack_time_wait_and_verify_reports_it() {
    run_isolated("apply_caps_the_conntrack_time_wait", || {
        let vn = VirtualNode::build(3, 1).expect("virtual node");
        let pod = vn.pod(0);
        let key = "net.netfilter.nf_conntrack_tcp_timeout_time_wait";
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "120", "kernel default");
        let node_before = vn.node.read_sysctl(key).unwrap();
        let cap = ringway_redirect::CONNTRACK_TIME_WAIT_CAP_S.to_string();
        assert_eq!(cap, "30");

        let spec = CaptureSpec::default();
        apply(pod.netns.fd(), &spec).expect("apply");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), cap);
        // The node namespace is not touched.
        assert_eq!(vn.node.read_sysctl(key).unwrap(), node_before);
        assert_eq!(verify(pod.netns.fd(), &spec).unwrap(), vec![]);

        // Set back above the cap: drift, named, and a re-apply mends it.
        pod.netns.sysctl(key, "120").unwrap();
        let d = verify(pod.netns.fd(), &spec).unwrap();
        assert_eq!(
            d,
            vec![Drift::SysctlDiffers {
                key: key.into(),
                want: "at most 30".into(),
                found: "120".into()
            }]
        );
        assert_eq!(
            d[0].to_string(),
            "sysctl net.netfilter.nf_conntrack_tcp_timeout_time_wait is 120, want at most 30"
        );
        apply(pod.netns.fd(), &spec).expect("re-apply");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), cap);

        // A lower value (the pod's own choice) is no drift and stays.
        pod.netns.sysctl(key, "10").unwrap();
        assert_eq!(verify(pod.netns.fd(), &spec).unwrap(), vec![]);
        apply(pod.netns.fd(), &spec).expect("re-apply over a lower value");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "10");

        // remove leaves it (harmless without the rules).
        remove(pod.netns.fd(), &spec).expect("remove");
        assert_eq!(pod.netns.read_sysctl(key).unwrap(), "10");
    });
}
