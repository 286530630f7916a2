//! Restarting the node agent leaves traffic alone: a new agent rebuilds its
//! pods from the kernel (owner tags found through `/proc/<pid>/ns/net` or the
//! netns directories), verifies their rules without rewriting them (the nft
//! rule handles do not change), re-applies only drifted ones, and resends
//! the full snapshot to the proxy.
//!
//! Every test runs inside `run_isolated` on its own virtual node.

use crate::agent_support;

use std::path::PathBuf;

use agent_support::*;
use ringway_cni::node::{PodSource, Rediscovery};
use ringway_redirect::{apply, apply_for, read_tag, verify_for, CaptureSpec, PodTag};
use ringway_testbed::{run_isolated, VirtualNode};

#[test]
fn a_restarted_agent_rebuilds_its_pods_from_the_kernel_and_resends_the_snapshot() {
    run_isolated("agent_restart", || {
        init_logs();
        let dir = TempDir::new("agent_restart");
        let mut cfg = config("agent_restart", dir.path());
        let vn = VirtualNode::build(31, 5).unwrap();
        // Pods 0-2 have a process (like a pause container); 3 and 4 do not.
        let pauses: Vec<_> = (0..3).map(|i| vn.pod(i).start_pause().unwrap()).collect();
        let spec = CaptureSpec::default();

        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let uids = ["uid-0", "uid-1", "uid-2"];
        let cni: Vec<CniPod> = (0..3).map(|i| CniPod::of(vn.pod(i), uids[i])).collect();
        for p in &cni {
            ok(plugin("ADD", p, &cfg.cni_socket));
        }
        proxy.wait_for(4);
        let before: Vec<Vec<String>> = (0..3).map(|i| handles(vn.pod(i))).collect();
        assert!(before.iter().all(|h| h.len() == 22), "{before:?}");
        let enrolled = agent.pods();

        // Pod 3: tagged for another node. Pod 4: captured without a tag.
        let foreign = PodTag {
            uid: "uid-elsewhere".into(),
            node: "another-node".into(),
            ..PodTag::default()
        };
        apply_for(vn.pod(3).netns.fd(), &spec, &foreign).unwrap();
        apply(vn.pod(4).netns.fd(), &spec).unwrap();

        // The agent stops (pods, rules and the proxy's listeners stay).
        agent.shutdown();
        assert!(
            proxy.log().len() == 4,
            "no Del on shutdown: {:?}",
            proxy.kinds()
        );
        proxy.disconnect();
        for (i, h) in before.iter().enumerate() {
            assert_eq!(&handles(vn.pod(i)), h, "shutdown leaves the rules");
        }

        // Meanwhile pod 1's rules drift: a chain is flushed.
        vn.pod(1)
            .netns
            .exec("nft", &["flush", "chain", "inet", "ringway", "output"])
            .unwrap();

        // A new agent that may only look at /proc (no netns directories).
        cfg.netns_dirs = vec![];
        let agent = start(&cfg);
        let r: &Rediscovery = agent.rediscovery();
        assert_eq!(r.adopted, uids, "{r:?}");
        assert_eq!(r.reapplied, ["uid-1"], "{r:?}");
        let rebuilt = agent.pods();
        for (old, new) in enrolled.iter().zip(&rebuilt) {
            assert_eq!(old.pod, new.pod, "identity rebuilt from the tag");
            assert_eq!(old.netns_inode, new.netns_inode);
            assert_eq!(new.source, PodSource::Rediscovered);
        }
        // Verified, not rewritten: same rule handles; the drifted pod was
        // repaired with its tag.
        assert_eq!(handles(vn.pod(0)), before[0]);
        assert_eq!(handles(vn.pod(2)), before[2]);
        assert_ne!(handles(vn.pod(1)), before[1]);
        for (i, uid) in uids.iter().enumerate() {
            let tag = read_tag(vn.pod(i).netns.fd()).unwrap().unwrap();
            assert_eq!(&tag.uid, uid);
            assert_eq!(
                verify_for(vn.pod(i).netns.fd(), &spec, &tag).unwrap(),
                vec![]
            );
        }

        // The proxy reconnects and gets the whole snapshot.
        let p = FakeProxy::connect(&cfg.zds_socket);
        for (i, uid) in uids.iter().enumerate() {
            let r = p.recv();
            assert_eq!((r.kind, r.uid.as_str()), ("Add", *uid));
            assert_eq!(r.netns_inode, Some(vn.pod(i).netns.inode()));
            assert_eq!(
                r.info,
                Some((
                    vn.pod(i).name.clone(),
                    "shop".to_string(),
                    "shop-sa".to_string()
                ))
            );
            p.ack();
        }
        assert_eq!(p.recv().kind, "SnapshotSent");
        p.ack();
        wait_ready_proxies(&agent, 1);
        // And DEL works for a rediscovered pod (its sandbox id came back too).
        let del = plugin_in_background("DEL", &cni[2], &cfg.cni_socket);
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Del", "uid-2"));
        p.ack();
        ok(del.join().unwrap());
        assert_eq!(read_tag(vn.pod(2).netns.fd()).unwrap(), None);
        agent.shutdown();
        drop(p);

        // A third agent that may only look at the netns directory (and no
        // processes) finds the same pods, plus the tagged pod of the other
        // node, which it skips; the untagged pod is not a candidate.
        let empty_proc = dir.path().join("empty-proc");
        std::fs::create_dir_all(&empty_proc).unwrap();
        cfg.netns_dirs = vec![PathBuf::from("/run/netns")];
        cfg.proc_root = empty_proc;
        let agent = start(&cfg);
        let r = agent.rediscovery();
        assert_eq!(r.adopted, ["uid-0", "uid-1"], "{r:?}");
        assert_eq!(r.reapplied, Vec::<String>::new(), "{r:?}");
        assert_eq!(
            r.skipped,
            [format!(
                "pod uid-elsewhere in net:[{}] is tagged for node \"another-node\"",
                vn.pod(3).netns.inode()
            )],
            "{r:?}"
        );
        drop(pauses);
    });
}

/// Owner tags are pod-writable: a pod with CAP_NET_ADMIN in its own netns
/// rewrites its `inet ringway` table at will. A restarted agent adopts a
/// namespace only when its tag agrees with the agent's own record (the state
/// file), and takes the identity from the record.
#[test]
fn adversarial_restart_does_not_adopt_forged_owner_tags() {
    run_isolated("adversarial_restart_forged_tags", || {
        init_logs();
        let dir = TempDir::new("adversarial_restart_forged_tags");
        let cfg = config("adversarial_restart_forged_tags", dir.path());
        let vn = VirtualNode::build(32, 4).unwrap();
        let spec = CaptureSpec::default();

        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let cni: Vec<CniPod> = (0..2)
            .map(|i| CniPod::of(vn.pod(i), &format!("uid-{i}")))
            .collect();
        for p in &cni {
            ok(plugin("ADD", p, &cfg.cni_socket));
        }
        proxy.wait_for(3);
        let enrolled = agent.pods();
        let honest = read_tag(vn.pod(0).netns.fd()).unwrap().unwrap();
        agent.shutdown();
        proxy.disconnect();

        // Pod 1 (enrolled) rewrites its own tag: another namespace and
        // service account, its own uid.
        let tag1 = read_tag(vn.pod(1).netns.fd()).unwrap().unwrap();
        let forged_identity = PodTag {
            namespace: "bank".into(),
            service_account: "admin".into(),
            ..tag1
        };
        apply_for(vn.pod(1).netns.fd(), &spec, &forged_identity).unwrap();
        // Pod 2 (never enrolled) copies pod 0's tag byte for byte.
        apply_for(vn.pod(2).netns.fd(), &spec, &honest).unwrap();
        // Pod 3 (never enrolled) tags itself as a pod the agent never saw.
        let stranger = PodTag {
            uid: "uid-stranger".into(),
            namespace: "bank".into(),
            name: "vault".into(),
            service_account: "admin".into(),
            ..honest.clone()
        };
        apply_for(vn.pod(3).netns.fd(), &spec, &stranger).unwrap();

        let agent = start(&cfg);
        let r = agent.rediscovery();
        assert_eq!(r.adopted, ["uid-0"], "{r:?}");
        let skipped = r.skipped.join("\n");
        for want in [
            format!(
                "pod uid-1 in net:[{}] disagrees with the agent's record: its tag says namespace \"bank\", the agent recorded \"shop\"",
                vn.pod(1).netns.inode()
            ),
            format!(
                "pod uid-0 in net:[{}] disagrees with the agent's record: the agent enrolled it in net:[{}]",
                vn.pod(2).netns.inode(),
                vn.pod(0).netns.inode()
            ),
            format!(
                "pod uid-stranger in net:[{}] is not in the agent's record",
                vn.pod(3).netns.inode()
            ),
        ] {
            assert!(skipped.contains(&want), "want {want:?} in:\n{skipped}");
        }
        let pods = agent.pods();
        assert_eq!(pods.len(), 1, "{pods:?}");
        assert_eq!(pods[0].pod, enrolled[0].pod, "identity from the record");
        assert_eq!(pods[0].netns_inode, Some(vn.pod(0).netns.inode()));
        // The proxy hears of the honest pod only.
        let p = FakeProxy::connect(&cfg.zds_socket);
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Add", "uid-0"));
        assert_eq!(r.netns_inode, Some(vn.pod(0).netns.inode()));
        p.ack();
        assert_eq!(p.recv().kind, "SnapshotSent");
        p.ack();
        wait_ready_proxies(&agent, 1);
        agent.shutdown();
    });
}

/// The agent's record cannot be read at restart (corrupt, or written by a
/// build this one cannot read): nothing is adopted (a tag is the pod's own
/// to write, never an identity), but the proxies are told to keep the pods
/// this node's tags name, so a lost record does not tear down every pod of
/// the node. A kept pod leaves the proxies on its DEL, or once its
/// namespace is gone.
#[test]
fn adversarial_an_unreadable_record_keeps_the_nodes_pods_at_the_proxy() {
    run_isolated("restart_unreadable_record", || {
        init_logs();
        let dir = TempDir::new("restart_unreadable_record");
        let mut cfg = config("restart_unreadable_record", dir.path());
        cfg.reconcile_interval = std::time::Duration::from_millis(200);
        let mut vn = VirtualNode::build(37, 5).unwrap();
        let (agent, proxy) = start_with_proxy(&cfg);
        // Pods 0-2 and 4 enrolled; pod 3 never is.
        let cni = add_all(&cfg, &[0, 1, 2, 4].map(|i| (i, vn.pod(i))));
        proxy.wait_for(5);
        agent.shutdown();
        proxy.disconnect();

        // The record's middle line is damaged.
        let path = cfg.state_file.clone().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 3, "{text}");
        lines[1] = "{\"put\": garbage";
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();

        let agent = start(&cfg);
        let r = agent.rediscovery();
        assert!(r.adopted.is_empty(), "{r:?}");
        assert_eq!(r.kept, ["uid-0", "uid-1", "uid-2", "uid-4"], "{r:?}");
        assert!(agent.pods().is_empty(), "nothing adopted");
        let p = FakeProxy::connect(&cfg.zds_socket);
        for uid in ["uid-0", "uid-1", "uid-2", "uid-4"] {
            let r = p.recv();
            assert_eq!((r.kind, r.uid.as_str()), ("Keep", uid));
            assert_eq!(r.netns_inode, None);
            p.ack();
        }
        assert_eq!(p.recv().kind, "SnapshotSent");
        p.ack();
        wait_ready_proxies(&agent, 1);

        // Restarted again: the record is readable now (rewritten with the
        // pods held: none), and the pods kept are kept again, from the file
        // beside it, in the namespaces they were kept in. Pod 3, never
        // enrolled, forges pod 0's tag meanwhile: not kept.
        agent.shutdown();
        drop(p);
        let tag0 = read_tag(vn.pod(0).netns.fd()).unwrap().unwrap();
        apply_for(vn.pod(3).netns.fd(), &CaptureSpec::default(), &tag0).unwrap();
        let agent = start(&cfg);
        let r = agent.rediscovery();
        assert_eq!(r.kept, ["uid-0", "uid-1", "uid-2", "uid-4"], "{r:?}");
        assert_eq!(
            r.skipped,
            [format!(
                "pod uid-0 in net:[{}] is not in the agent's record",
                vn.pod(3).netns.inode()
            )],
            "{r:?}"
        );
        let p = FakeProxy::connect(&cfg.zds_socket);
        for uid in ["uid-0", "uid-1", "uid-2", "uid-4"] {
            let r = p.recv();
            assert_eq!((r.kind, r.uid.as_str()), ("Keep", uid));
            p.ack();
        }
        assert_eq!(p.recv().kind, "SnapshotSent");
        p.ack();
        wait_ready_proxies(&agent, 1);
        // The Kubernetes watch sees them held with no identity: it enrolls
        // those it wants under the one it sees, and releases the others
        // (pod 4, opted out: its rules go too).
        let watch = agent.enrollment();
        let listed: Vec<(String, String)> = ringway_cni::kube::Enrollment::enrolled(&watch)
            .into_iter()
            .map(|p| (p.uid, p.namespace))
            .collect();
        assert_eq!(
            listed,
            ["uid-0", "uid-1", "uid-2", "uid-4"].map(|u| (u.to_string(), String::new()))
        );
        let pod4_inode = vn.pod(4).netns.inode();
        let release = std::thread::spawn({
            let watch = watch.clone();
            move || ringway_cni::kube::Enrollment::unenroll(&watch, "uid-4")
        });
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Del", "uid-4"));
        p.ack();
        release.join().unwrap().unwrap();
        assert_eq!(read_tag(vn.pod(4).netns.fd()).unwrap(), None);
        assert_eq!(vn.pod(4).netns.inode(), pod4_inode);

        // Another uid in a kept pod's namespace is refused.
        let mut intruder = CniPod::of(vn.pod(0), "uid-intruder");
        intruder.name = "intruder".into();
        let out = plugin("ADD", &intruder, &cfg.cni_socket);
        assert_ne!(out.exit_code, 0, "{}", out.stdout);
        assert!(out.stdout.contains("is pod uid-0's"), "{}", out.stdout);

        // Pod 0's DEL: the proxy drops it, and its rules go.
        let del = plugin_in_background("DEL", &cni[0], &cfg.cni_socket);
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Del", "uid-0"));
        p.ack();
        ok(del.join().unwrap());
        assert_eq!(read_tag(vn.pod(0).netns.fd()).unwrap(), None);

        // Pod 1's namespace goes without a DEL: dropped at the next
        // reconcile.
        let pod2_inode = vn.pod(2).netns.inode();
        let gone = vn.pod(1).name.clone();
        vn.remove_pod(&gone).unwrap();
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Del", "uid-1"));
        p.ack();

        // Pod 2 comes back through a CNI ADD (the runtime's retry, or the
        // watch): enrolled with the identity the agent is given, a real
        // `Add`, recorded again.
        let add = plugin_in_background("ADD", &cni[2], &cfg.cni_socket);
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Add", "uid-2"));
        assert_eq!(r.netns_inode, Some(pod2_inode));
        p.ack();
        ok(add.join().unwrap());
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-2"]);
        assert!(
            !std::path::Path::new(&format!("{}.kept", path.display())).exists(),
            "nothing kept any more: the file beside the record is gone"
        );
        agent.shutdown();
    });
}
