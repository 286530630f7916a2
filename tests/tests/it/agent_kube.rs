//! The agent behind the Kubernetes watch's `Enrollment` trait: a running pod
//! named only by its identity is found through the processes whose cgroup
//! names its UID (systemd and cgroupfs spellings), confirmed by its IPs, and
//! enrolled; a pod the CNI plugin enrolled gets its service account filled
//! in; unenroll goes through the same path as CNI DEL.
//!
//! `proc_root` points at a fake procfs whose entries link to real processes'
//! `ns` and `stat`, so no cgroup of the machine is touched. Runs inside
//! `run_isolated`.

use crate::agent_support;

use std::os::unix::fs::symlink;
use std::path::Path;

use agent_support::*;
use ringway_cni::kube::{Enrollment as WatchEnrollment, PodIdentity};
use ringway_redirect::read_tag;
use ringway_testbed::{run_isolated, VirtualNode};

/// `<proc>/<pid>/{cgroup, ns -> /proc/<real>/ns, stat -> /proc/<real>/stat}`.
fn fake_process(proc_root: &Path, pid: u32, cgroup: &str, real: &str) {
    let d = proc_root.join(pid.to_string());
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("cgroup"), cgroup).unwrap();
    symlink(format!("/proc/{real}/ns"), d.join("ns")).unwrap();
    symlink(format!("/proc/{real}/stat"), d.join("stat")).unwrap();
}

#[test]
fn the_watch_enrolls_running_pods_found_by_cgroup_and_ip() {
    run_isolated("agent_kube", || {
        init_logs();
        let dir = TempDir::new("agent_kube");
        let mut cfg = config("agent_kube", dir.path());
        let vn = VirtualNode::build(51, 3).unwrap();
        let pauses: Vec<_> = (0..3).map(|i| vn.pod(i).start_pause().unwrap()).collect();
        let (u0, u1) = (
            "0c9f6a7e-1d2b-4c3d-8e9f-0a1b2c3d4e50",
            "0c9f6a7e-1d2b-4c3d-8e9f-0a1b2c3d4e51",
        );
        let proc_root = dir.path().join("proc");
        // Pod 0 with the systemd cgroup driver ('-' -> '_'), and a process of
        // the same pod in the host namespace (it is skipped).
        fake_process(
            &proc_root,
            100,
            &format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-1.scope\n",
                u0.replace('-', "_")
            ),
            &pauses[0].pid().to_string(),
        );
        fake_process(
            &proc_root,
            99,
            &format!("0::/kubepods/pod{u0}/host\n"),
            "self",
        );
        // Pod 1 with the cgroupfs driver.
        fake_process(
            &proc_root,
            101,
            &format!("0::/kubepods/besteffort/pod{u1}/abcdef\n"),
            &pauses[1].pid().to_string(),
        );
        cfg.proc_root = proc_root.clone();
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let watch = agent.enrollment();
        let ident = |uid: &str, i: usize, sa: &str| PodIdentity {
            uid: uid.into(),
            name: vn.pod(i).name.clone(),
            namespace: "shop".into(),
            service_account: sa.into(),
            ips: vec![vn.pod(i).ipv4.into()],
        };

        WatchEnrollment::enroll(&watch, &ident(u0, 0, "web")).unwrap();
        let add = &proxy.wait_for(2)[1];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", u0));
        assert_eq!(add.netns_inode, Some(vn.pod(0).netns.inode()));
        assert_eq!(add.info.as_ref().unwrap().2, "web");
        // The pod's addresses from its status, for the proxy to hold.
        assert_eq!(add.addresses, vec![vn.pod(0).ip(false)]);
        assert_eq!(
            read_tag(vn.pod(0).netns.fd())
                .unwrap()
                .unwrap()
                .service_account,
            "web"
        );

        // The IPs must match: pod 1's process with pod 0's IP is refused.
        let e = WatchEnrollment::enroll(&watch, &ident(u1, 0, "db")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "no network namespace of pod {u1} found: net:[{}] of pid 101 holds none of the pod's IPs [{}]",
                vn.pod(1).netns.inode(),
                vn.pod(0).ipv4
            )
        );
        WatchEnrollment::enroll(&watch, &ident(u1, 1, "db")).unwrap();
        assert_eq!(
            proxy.wait_for(3)[2].netns_inode,
            Some(vn.pod(1).netns.inode())
        );

        let e = WatchEnrollment::enroll(&watch, &ident("uid-nowhere", 2, "x")).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "no process of pod uid-nowhere found (no {}/*/cgroup names it)",
                proc_root.display()
            )
        );

        // A pod the CNI plugin enrolled (no service account): the watch's
        // enroll fills it in, keeping the sandbox id.
        let cni = CniPod::of(vn.pod(2), "uid-cni");
        ok(plugin("ADD", &cni, &cfg.cni_socket));
        proxy.wait_for(4);
        WatchEnrollment::enroll(&watch, &ident("uid-cni", 2, "cart")).unwrap();
        let add = &proxy.wait_for(5)[4];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "uid-cni"));
        assert_eq!(add.info.as_ref().unwrap().2, "cart");
        let tag = read_tag(vn.pod(2).netns.fd()).unwrap().unwrap();
        assert_eq!(tag.service_account, "cart");
        assert_eq!(tag.container_id, "sandbox-uid-cni");

        let mut enrolled: Vec<_> = WatchEnrollment::enrolled(&watch)
            .into_iter()
            .map(|p| (p.uid, p.service_account))
            .collect();
        enrolled.sort();
        assert_eq!(
            enrolled,
            [
                (u0.to_string(), "web".to_string()),
                (u1.to_string(), "db".to_string()),
                ("uid-cni".to_string(), "cart".to_string())
            ]
        );

        WatchEnrollment::unenroll(&watch, u0).unwrap();
        let del = &proxy.wait_for(6)[5];
        assert_eq!((del.kind, del.uid.as_str()), ("Del", u0));
        assert_eq!(read_tag(vn.pod(0).netns.fd()).unwrap(), None);

        // Pod 1's object is gone from the API server while its containers
        // still run (a forced delete): the proxies drop it, and its capture
        // stays, so nothing reaches its app uncaptured.
        WatchEnrollment::release_gone(&watch, u1).unwrap();
        let del = &proxy.wait_for(7)[6];
        assert_eq!((del.kind, del.uid.as_str()), ("Del", u1));
        assert!(
            !WatchEnrollment::enrolled(&watch)
                .iter()
                .any(|p| p.uid == u1),
            "forgotten by the agent"
        );
        let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings::default());
        assert_eq!(
            ringway_redirect::verify(vn.pod(1).netns.fd(), &spec).unwrap(),
            vec![],
            "its rules are in place"
        );
        let to = std::net::SocketAddr::new(vn.pod(1).ip(false), 8080);
        let app = vn
            .pod(1)
            .netns
            .run(|| std::net::TcpListener::bind(to))
            .unwrap();
        app.set_nonblocking(true).unwrap();
        // From the node (the bridge's namespace): nothing captures there.
        let tried = vn.node.run(|| {
            std::net::TcpStream::connect_timeout(&to, std::time::Duration::from_millis(500))
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            app.accept().is_err(),
            "a connection reached the released pod's app uncaptured (client: {tried:?})"
        );
        drop(pauses);
    });
}
