//! The node agent through its CNI socket, driven by the real plugin code
//! (`ringway_cni::run` + `UnixAgent`): ADD captures the pod and hands its
//! netns to the (fake) proxy, no proxy or a nack is "try again later",
//! DEL is idempotent and reaches every proxy, and malformed requests get
//! exact error texts while the agent keeps serving.
//!
//! Every test runs inside `run_isolated` on its own virtual node.

use crate::agent_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use agent_support::*;
use ringway_cni::node::PodSource;
use ringway_redirect::{read_tag, verify, verify_for, CaptureSpec, Drift, PodTag};
use ringway_testbed::{run_isolated, VirtualNode};

fn tag(cfg: &ringway_cni::node::AgentConfig, p: &CniPod, pod: &ringway_testbed::Pod) -> PodTag {
    PodTag {
        uid: p.uid.clone(),
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        service_account: "shop-sa".into(),
        node: cfg.node_name.clone(),
        container_id: p.container_id.clone(),
        ips: vec![pod.ipv4.into(), pod.ipv6.into()],
    }
}

#[test]
fn cni_add_captures_the_pod_and_hands_its_netns_to_the_proxy() {
    run_isolated("agent_cni_add", || {
        init_logs();
        let dir = TempDir::new("agent_cni_add");
        let cfg = config("agent_cni_add", dir.path());
        let vn = VirtualNode::build(11, 1).unwrap();
        let pod = vn.pod(0);
        let agent = start(&cfg);
        // Socket modes.
        for s in [&cfg.cni_socket, &cfg.zds_socket] {
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(s).unwrap().permissions(),
            );
            assert_eq!(mode & 0o777, 0o600, "{}", s.display());
        }
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        assert_eq!(proxy.kinds(), vec![("SnapshotSent", String::new())]);

        let p = CniPod::of(pod, "uid-a");
        let out = ok(plugin("ADD", &p, &cfg.cni_socket));
        assert!(
            out.stdout.contains("\"ips\""),
            "ADD prints prevResult: {}",
            out.stdout
        );

        // The proxy got the pod, with an fd that is the pod's netns.
        let log = proxy.wait_for(2);
        let add = &log[1];
        assert_eq!(add.kind, "Add");
        assert_eq!(add.uid, "uid-a");
        assert_eq!(
            add.info,
            Some((pod.name.clone(), "shop".to_string(), "shop-sa".to_string()))
        );
        assert_eq!(add.netns_inode, Some(pod.netns.inode()));
        assert_eq!(add.is_pod_netns, Some(true));
        // The pod's addresses from the CNI result, for the proxy to hold.
        assert_eq!(add.addresses, vec![pod.ip(false), pod.ip(true)]);
        // Reopened from inside the namespace: its link names the namespace,
        // not the runtime's bind-mount path (proxies may check that).
        assert_eq!(
            add.netns_link.as_deref(),
            Some(format!("net:[{}]", pod.netns.inode()).as_str())
        );

        // The rules are in place, tagged with the pod.
        let spec = CaptureSpec::default();
        let want = tag(&cfg, &p, pod);
        assert_eq!(verify_for(pod.netns.fd(), &spec, &want).unwrap(), vec![]);
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), Some(want));
        let pods = agent.pods();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0].pod.uid, "uid-a");
        assert_eq!(pods[0].netns_inode, Some(pod.netns.inode()));
        assert_eq!(pods[0].source, PodSource::Enrolled);

        // CHECK and STATUS pass; ADD again is idempotent (same netns: the
        // rules are not rewritten, the proxy gets the Add again).
        ok(plugin("CHECK", &p, &cfg.cni_socket));
        ok(plugin("STATUS", &p, &cfg.cni_socket));
        let before = handles(pod);
        ok(plugin("ADD", &p, &cfg.cni_socket));
        assert_eq!(handles(pod), before);
        assert_eq!(proxy.wait_for(3)[2].kind, "Add");

        // DEL: Del to the proxy, rules gone, pod forgotten.
        ok(plugin("DEL", &p, &cfg.cni_socket));
        let log = proxy.wait_for(4);
        assert_eq!((log[3].kind, log[3].uid.as_str()), ("Del", "uid-a"));
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), None);
        assert!(verify(pod.netns.fd(), &spec)
            .unwrap()
            .contains(&Drift::TableMissing));
        assert!(agent.pods().is_empty());

        // DEL again, and DEL of a pod never seen, with or without a netns:
        // success, and nothing reaches the proxy.
        ok(plugin("DEL", &p, &cfg.cni_socket));
        let mut gone = CniPod::of(pod, "uid-never-seen");
        gone.netns = "".into();
        ok(plugin("DEL", &gone, &cfg.cni_socket));
        // A barrier instead of a pause: the proxy's connection is ordered,
        // so once the next request that does reach it (a new ADD) is there,
        // anything those DELs sent would be there before it.
        ok(plugin("ADD", &p, &cfg.cni_socket));
        let log = proxy.wait_for(5);
        assert_eq!(
            proxy.kinds()[3..],
            [("Del", "uid-a".to_string()), ("Add", "uid-a".to_string())],
            "the repeated DELs reached the proxy"
        );
        assert_eq!(log.len(), 5);
        ok(plugin("DEL", &p, &cfg.cni_socket));
        proxy.wait_for(6);

        // CHECK of a pod that is not enrolled: code 3 (unknown container).
        let o = plugin("CHECK", &p, &cfg.cni_socket);
        assert_eq!(o.exit_code, 1);
        assert!(o.stdout.contains("\"code\":3"), "{}", o.stdout);
        agent.shutdown();
        assert!(!cfg.cni_socket.exists() && !cfg.zds_socket.exists());
    });
}

#[test]
fn add_without_a_proxy_is_retryable_and_succeeds_once_one_connects() {
    run_isolated("agent_cni_no_proxy", || {
        init_logs();
        let dir = TempDir::new("agent_cni_no_proxy");
        let cfg = config("agent_cni_no_proxy", dir.path());
        let vn = VirtualNode::build(12, 1).unwrap();
        let pod = vn.pod(0);
        let p = CniPod::of(pod, "uid-b");

        // No agent at all: "try again later" too.
        let o = plugin("ADD", &p, &cfg.cni_socket);
        assert_eq!(o.exit_code, 1);
        assert!(o.stdout.contains("\"code\":11"), "{}", o.stdout);
        assert!(
            o.stdout
                .contains("node agent unavailable: cannot connect to"),
            "{}",
            o.stdout
        );

        let agent = start(&cfg);
        let o = plugin("ADD", &p, &cfg.cni_socket);
        assert_eq!(o.exit_code, 1);
        assert!(o.stdout.contains("\"code\":11"), "{}", o.stdout);
        assert!(
            o.stdout.contains(
                "try again later: node agent not ready: no node proxy is ready to take the pod"
            ),
            "{}",
            o.stdout
        );
        // Nothing was left behind: no rules, no state.
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), None);
        assert!(agent.pods().is_empty());
        // STATUS says the plugin is not available.
        let o = plugin("STATUS", &p, &cfg.cni_socket);
        assert!(o.stdout.contains("\"code\":50"), "{}", o.stdout);

        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        ok(plugin("STATUS", &p, &cfg.cni_socket));
        ok(plugin("ADD", &p, &cfg.cni_socket));
        let log = proxy.wait_for(2);
        assert_eq!((log[1].kind, log[1].uid.as_str()), ("Add", "uid-b"));
        assert_eq!(log[1].netns_inode, Some(pod.netns.inode()));
        assert!(read_tag(pod.netns.fd()).unwrap().is_some());
    });
}

#[test]
fn a_nack_is_retryable_and_leaves_nothing_behind() {
    run_isolated("agent_cni_nack", || {
        init_logs();
        let dir = TempDir::new("agent_cni_nack");
        let cfg = config("agent_cni_nack", dir.path());
        let vn = VirtualNode::build(13, 1).unwrap();
        let pod = vn.pod(0);
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let p = CniPod::of(pod, "uid-c");
        proxy.refuse("uid-c", "cannot bind 15001: address in use");

        let o = plugin("ADD", &p, &cfg.cni_socket);
        assert_eq!(o.exit_code, 1);
        assert!(o.stdout.contains("\"code\":11"), "{}", o.stdout);
        assert!(
            o.stdout.contains(
                "node agent not ready: node proxy refused pod uid-c: cannot bind 15001: address in use"
            ),
            "{}",
            o.stdout
        );
        // The proxy was told to forget the pod it keeps retrying; the rules
        // and the agent's state were rolled back.
        let log = proxy.wait_for(3);
        assert_eq!(
            proxy.kinds()[1..],
            [("Add", "uid-c".to_string()), ("Del", "uid-c".to_string())]
        );
        assert_eq!(log[1].netns_inode, Some(pod.netns.inode()));
        assert_eq!(read_tag(pod.netns.fd()).unwrap(), None);
        assert!(agent.pods().is_empty());

        // The runtime retries; this time the proxy takes it.
        proxy.accept("uid-c");
        ok(plugin("ADD", &p, &cfg.cni_socket));
        assert_eq!(proxy.wait_for(4)[3].kind, "Add");
        assert_eq!(agent.pods().len(), 1);
    });
}

#[test]
fn add_goes_to_the_newest_proxy_del_to_all_and_dead_ones_are_dropped() {
    run_isolated("agent_cni_two_proxies", || {
        init_logs();
        let dir = TempDir::new("agent_cni_two_proxies");
        let cfg = config("agent_cni_two_proxies", dir.path());
        let vn = VirtualNode::build(14, 2).unwrap();
        let agent = start(&cfg);
        let old = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let new = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 2);

        let p0 = CniPod::of(vn.pod(0), "uid-d0");
        ok(plugin("ADD", &p0, &cfg.cni_socket));
        assert_eq!(
            new.wait_for(2)[1..]
                .iter()
                .map(|r| (r.kind, r.uid.as_str()))
                .collect::<Vec<_>>(),
            [("Add", "uid-d0")]
        );
        assert_eq!(
            old.kinds(),
            [("SnapshotSent", String::new())],
            "Add only to the newest"
        );

        ok(plugin("DEL", &p0, &cfg.cni_socket));
        assert_eq!(old.wait_for(2)[1].kind, "Del");
        assert_eq!(new.wait_for(3)[2].kind, "Del");
        assert_eq!(old.log()[1].uid, "uid-d0");

        // The new proxy goes away while idle: the agent notices (POLLHUP
        // watch) without anyone using the connection, and the next pod
        // goes to the remaining one.
        new.disconnect();
        wait_ready_proxies(&agent, 1);
        let p1 = CniPod::of(vn.pod(1), "uid-d1");
        ok(plugin("ADD", &p1, &cfg.cni_socket));
        let log = old.wait_for(3);
        assert_eq!((log[2].kind, log[2].uid.as_str()), ("Add", "uid-d1"));
        assert_eq!(log[2].netns_inode, Some(vn.pod(1).netns.inode()));
    });
}

#[test]
fn bad_cni_requests_get_exact_errors_and_the_agent_keeps_serving() {
    run_isolated("agent_cni_bad_input", || {
        init_logs();
        let dir = TempDir::new("agent_cni_bad_input");
        let cfg = config("agent_cni_bad_input", dir.path());
        let vn = VirtualNode::build(15, 1).unwrap();
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let sock = &cfg.cni_socket;
        let bad = |msg: &str| format!(r#"{{"ok":false,"kind":"badRequest","error":"{msg}"}}"#);
        let rejected = |msg: &str| format!(r#"{{"ok":false,"kind":"rejected","error":"{msg}"}}"#);

        assert_eq!(
            cni_line(sock, b"hello\n"),
            bad("request is not valid JSON: expected value at line 1 column 1")
        );
        assert_eq!(
            cni_line(sock, b"[1,2]\n"),
            bad("request is not a JSON object")
        );
        assert_eq!(cni_line(sock, b"{}\n"), bad(r#"request has no \"op\""#));
        assert_eq!(
            cni_line(sock, b"{\"op\":\"frobnicate\"}\n"),
            bad(r#"unknown op \"frobnicate\" (expected add, del, check, status or gc)"#)
        );
        assert_eq!(
            cni_line(sock, b"{\"op\":\"add\",\"containerId\":\"c1\"}\n"),
            bad(r#"add request has no \"netns\""#)
        );
        assert_eq!(
            cni_line(
                sock,
                b"{\"op\":\"add\",\"containerId\":\"c1\",\"netns\":\"/x\",\"pod\":{\"name\":\"a\",\"namespace\":\"b\"}}\n"
            ),
            rejected(
                r#"add request for pod b/a has no \"pod.uid\" (the runtime gave no K8S_POD_UID), and without the Kubernetes API (--kube) the agent cannot learn it"#
            )
        );
        // A malformed request is named as such before a missing uid is.
        assert_eq!(
            cni_line(
                sock,
                b"{\"op\":\"add\",\"containerId\":\"c1\",\"netns\":\"/x\",\"pod\":{\"name\":\"a\",\"namespace\":\"b\"},\"ips\":[7]}\n"
            ),
            bad(r#"add request: \"ips\"[0] must be a string"#)
        );
        // The agent's own namespace needs no uid: passed through.
        assert_eq!(
            cni_line(
                sock,
                b"{\"op\":\"add\",\"containerId\":\"c1\",\"netns\":\"/x\",\"pod\":{\"name\":\"a\",\"namespace\":\"ringway-system\"}}\n"
            ),
            r#"{"ok":true,"passThrough":"namespace excluded from capture (exclude_namespaces)"}"#
        );
        assert_eq!(
            cni_line(
                sock,
                b"{\"op\":\"add\",\"containerId\":7,\"netns\":\"/x\"}\n"
            ),
            bad(r#"add request: \"containerId\" must be a string"#)
        );
        assert_eq!(
            cni_line(
                sock,
                b"{\"op\":\"add\",\"containerId\":\"c1\",\"netns\":\"/x\",\"pod\":{\"name\":\"a\",\"namespace\":\"b\",\"uid\":\"u\"},\"ips\":[\"10.0.0.1\"]}\n"
            ),
            bad(r#"add request: \"ips\"[0]: \"10.0.0.1\" is not an address with a prefix length (like 10.0.0.5/24)"#)
        );
        assert_eq!(
            cni_line(sock, b"{\"op\":\"gc\"}\n"),
            bad(r#"gc request has no \"validAttachments\""#)
        );
        let add = |netns: &str| {
            format!(
                "{{\"op\":\"add\",\"containerId\":\"c1\",\"netns\":\"{netns}\",\"pod\":{{\"name\":\"a\",\"namespace\":\"shop\",\"uid\":\"u\"}}}}\n"
            )
        };
        // The host's (the agent process's own) namespace.
        let self_ino = inode(std::path::Path::new("/proc/self/ns/net"));
        let which = if inode(std::path::Path::new("/proc/1/ns/net")) == self_ino {
            "the host network namespace (PID 1's)"
        } else {
            "this process's own network namespace (its main thread's)"
        };
        assert_eq!(
            cni_line(sock, add("/proc/self/ns/net").as_bytes()),
            rejected(&format!(
                "refusing /proc/self/ns/net: it is {which} (net:[{self_ino}]), not a pod's network namespace"
            ))
        );
        // A file that is not a namespace; one that does not exist.
        let file = dir.path().join("not-a-netns");
        std::fs::write(&file, b"x").unwrap();
        let f = file.display();
        assert_eq!(
            cni_line(sock, add(&f.to_string()).as_bytes()),
            rejected(&format!("{f} is not a network namespace (it is {f})"))
        );
        assert_eq!(
            cni_line(sock, add("/run/netns/no-such-pod").as_bytes()),
            rejected("network namespace /run/netns/no-such-pod not found")
        );
        // An excluded namespace (the agent's own): passed through, not refused
        // (a refusal would keep the agent's own pods from starting).
        let excluded = format!(
            "{{\"op\":\"add\",\"containerId\":\"c1\",\"netns\":\"{}\",\"pod\":{{\"name\":\"a\",\"namespace\":\"ringway-system\",\"uid\":\"u\"}}}}\n",
            vn.pod(0).netns.path().display()
        );
        assert_eq!(
            cni_line(sock, excluded.as_bytes()),
            r#"{"ok":true,"passThrough":"namespace excluded from capture (exclude_namespaces)"}"#
        );
        assert_eq!(read_tag(vn.pod(0).netns.fd()).unwrap(), None);
        // Too long a line.
        let mut long = vec![b' '; 70_000];
        long.push(b'\n');
        assert_eq!(
            cni_line(sock, &long),
            bad("request longer than 65536 bytes")
        );
        // A client that never finishes its line gets an answer after 5 s.
        let started = Instant::now();
        let mut s = UnixStream::connect(sock).unwrap();
        s.write_all(b"{\"op\":").unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert_eq!(resp.trim_end(), bad("no complete request line within 5s"));
        assert!(started.elapsed() >= Duration::from_millis(4900));

        // Nothing was enrolled, nothing reached the proxy, and the agent
        // still serves.
        assert!(agent.pods().is_empty());
        assert_eq!(proxy.kinds(), [("SnapshotSent", String::new())]);
        assert_eq!(cni_line(sock, b"{\"op\":\"status\"}\n"), r#"{"ok":true}"#);
        let p = CniPod::of(vn.pod(0), "uid-e");
        ok(plugin("ADD", &p, &cfg.cni_socket));
    });
}

#[test]
fn start_refuses_a_served_socket_and_replaces_a_stale_one() {
    run_isolated("agent_cni_sockets", || {
        init_logs();
        let dir = TempDir::new("agent_cni_sockets");
        let cfg = config("agent_cni_sockets", dir.path());
        let agent = start(&cfg);
        let e = ringway_cni::node::NodeAgent::start(cfg.clone()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} is in use: another agent answers on it",
                cfg.zds_socket.display()
            )
        );
        // The first agent still serves.
        assert_eq!(
            cni_line(&cfg.cni_socket, b"{\"op\":\"status\"}\n"),
            r#"{"ok":false,"kind":"notReady","error":"no node proxy is ready"}"#
        );
        agent.shutdown();
        assert!(!cfg.zds_socket.exists() && !cfg.cni_socket.exists());

        // Stale socket files (a crashed agent) are replaced.
        for p in [&cfg.zds_socket, &cfg.cni_socket] {
            drop(std::os::unix::net::UnixListener::bind(p).unwrap());
            assert!(p.exists());
        }
        let agent = start(&cfg);
        assert_eq!(
            cni_line(&cfg.cni_socket, b"{\"op\":\"status\"}\n"),
            r#"{"ok":false,"kind":"notReady","error":"no node proxy is ready"}"#
        );
        agent.shutdown();

        // Something that is not a socket is never deleted; a failed start
        // leaves no socket file behind.
        std::fs::write(&cfg.cni_socket, b"precious").unwrap();
        let e = ringway_cni::node::NodeAgent::start(cfg.clone()).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} exists and is not a socket; refusing to replace it",
                cfg.cni_socket.display()
            )
        );
        assert_eq!(std::fs::read(&cfg.cni_socket).unwrap(), b"precious");
        assert!(!cfg.zds_socket.exists());
    });
}

/// Without an API server (file mode) the service account comes from the
/// agent's configuration (`--pod-service-account`), a pod's own rule before
/// its namespace's; a pod no rule covers is refused, never enrolled as
/// `default` (or as nothing, which the proxy used to turn into `default`).
#[test]
fn adversarial_file_mode_add_without_a_configured_service_account_is_refused() {
    run_isolated("adversarial_file_mode_sa", || {
        init_logs();
        let dir = TempDir::new("adversarial_file_mode_sa");
        let vn = VirtualNode::build(33, 3).unwrap();
        let mut cfg = config("adversarial_file_mode_sa", dir.path());
        cfg.service_accounts = vec![
            "shop=shop-sa".parse().unwrap(),
            format!("shop/{}=web", vn.pod(1).name).parse().unwrap(),
        ];
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        // Namespace "bank" has no rule: refused (not retryable), nothing done.
        let mut bank = CniPod::of(vn.pod(0), "uid-bank");
        bank.namespace = "bank".into();
        let out = plugin("ADD", &bank, &cfg.cni_socket);
        assert!(out.exit_code != 0, "{out:?}");
        assert!(
            out.stdout
                .contains("no service account is configured for pod bank/")
                && out.stdout.contains("never guesses one"),
            "{}",
            out.stdout
        );
        assert_eq!(read_tag(vn.pod(0).netns.fd()).unwrap(), None);
        assert!(agent.pods().is_empty());

        // The pod's own rule wins over its namespace's.
        let web = CniPod::of(vn.pod(1), "uid-web");
        ok(plugin("ADD", &web, &cfg.cni_socket));
        let other = CniPod::of(vn.pod(2), "uid-other");
        ok(plugin("ADD", &other, &cfg.cni_socket));
        let log = proxy.wait_for(3);
        assert_eq!(log[1].info.as_ref().unwrap().2, "web");
        assert_eq!(log[2].info.as_ref().unwrap().2, "shop-sa");
        assert_eq!(proxy.log().len(), 3, "{:?}", proxy.kinds());
        agent.shutdown();
    });
}

/// CNI GC names the attachments that are still valid; anything that can
/// reach the CNI socket can send an empty list. GC removes only the capture
/// of pods whose network namespace is gone: a live pod stays captured (its
/// policy never fails open), and its DEL is what releases it.
#[test]
fn adversarial_gc_with_an_empty_attachment_list_keeps_live_pods_captured() {
    run_isolated("adversarial_gc_empty", || {
        init_logs();
        let dir = TempDir::new("adversarial_gc_empty");
        let mut vn = VirtualNode::build(34, 2).unwrap();
        let cfg = config("adversarial_gc_empty", dir.path());
        let (agent, proxy) = start_with_proxy(&cfg);
        add_all(&cfg, &[(0, vn.pod(0)), (1, vn.pod(1))]);
        proxy.wait_for(3);
        let gc = b"{\"op\":\"gc\",\"validAttachments\":[]}\n";
        assert_eq!(cni_line(&cfg.cni_socket, gc), r#"{"ok":true}"#);
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-0", "uid-1"], "live pods stay enrolled");
        for i in 0..2 {
            assert!(
                read_tag(vn.pod(i).netns.fd()).unwrap().is_some(),
                "pod {i} still captured"
            );
        }
        assert_eq!(proxy.log().len(), 3, "no Del: {:?}", proxy.kinds());

        // Pod 1's sandbox is gone (its netns unmounted, no process): now GC
        // releases it.
        let gone = vn.pod(1).name.clone();
        vn.remove_pod(&gone).unwrap();
        assert_eq!(cni_line(&cfg.cni_socket, gc), r#"{"ok":true}"#);
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-0"]);
        let del = &proxy.wait_for(4)[3];
        assert_eq!((del.kind, del.uid.as_str()), ("Del", "uid-1"));
        assert!(read_tag(vn.pod(0).netns.fd()).unwrap().is_some());
        agent.shutdown();
    });
}

/// A pod with `NET_ADMIN` deletes its capture table, or flushes a chain,
/// after it was enrolled: the agent finds the drift on its next reconcile
/// and puts the capture back (tag included), counting each repair; a pod
/// left alone is not touched.
#[test]
fn adversarial_a_pod_that_removes_its_own_capture_gets_it_back() {
    run_isolated("adversarial_capture_removed", || {
        init_logs();
        let dir = TempDir::new("adversarial_capture_removed");
        let vn = VirtualNode::build(35, 2).unwrap();
        let mut cfg = config("adversarial_capture_removed", dir.path());
        cfg.reconcile_interval = Duration::from_millis(200);
        let (agent, proxy) = start_with_proxy(&cfg);
        let pods = add_all(&cfg, &[(0, vn.pod(0)), (1, vn.pod(1))]);
        proxy.wait_for(3);
        let spec = CaptureSpec::default();
        let tags: Vec<PodTag> = (0..2).map(|i| tag(&cfg, &pods[i], vn.pod(i))).collect();
        let repairs = || {
            agent
                .metrics_text()
                .lines()
                .find_map(|l| l.strip_prefix("ringway_agent_capture_repairs_total "))
                .map(|v| v.trim().parse::<f64>().unwrap())
        };
        assert_eq!(repairs(), Some(0.0));
        let handles0 = vn
            .pod(0)
            .netns
            .exec("nft", &["-a", "list", "table", "inet", "ringway"])
            .unwrap();

        // Pod 1 deletes its table (the owner tag goes with it).
        vn.pod(1)
            .netns
            .exec("nft", &["delete", "table", "inet", "ringway"])
            .unwrap();
        assert!(
            wait_until(WAIT, || verify_for(vn.pod(1).netns.fd(), &spec, &tags[1])
                .unwrap()
                .is_empty()),
            "the deleted capture was never put back: {:?}",
            verify_for(vn.pod(1).netns.fd(), &spec, &tags[1])
        );
        assert!(
            wait_until(WAIT, || repairs() == Some(1.0)),
            "{:?}",
            repairs()
        );

        // Then it flushes the chain that captures its outbound.
        vn.pod(1)
            .netns
            .exec("nft", &["flush", "chain", "inet", "ringway", "output"])
            .unwrap();
        assert!(
            wait_until(WAIT, || verify_for(vn.pod(1).netns.fd(), &spec, &tags[1])
                .unwrap()
                .is_empty()),
            "the flushed chain was never put back"
        );
        assert!(
            wait_until(WAIT, || repairs() == Some(2.0)),
            "{:?}",
            repairs()
        );

        // Pod 0, untouched, keeps its very rules (same handles), and the
        // proxy saw no Del.
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(
            vn.pod(0)
                .netns
                .exec("nft", &["-a", "list", "table", "inet", "ringway"])
                .unwrap(),
            handles0
        );
        assert_eq!(
            verify_for(vn.pod(0).netns.fd(), &spec, &tags[0]).unwrap(),
            vec![]
        );
        assert_eq!(proxy.log().len(), 3, "{:?}", proxy.kinds());
        agent.shutdown();
    });
}

/// A CNI ADD that names another uid for a namespace the agent already
/// holds for a pod (a runtime's mistake, a reused path) is refused: the
/// first pod keeps its capture and its tag, and the proxy hears nothing.
#[test]
fn adversarial_a_second_pod_in_an_enrolled_netns_is_refused() {
    run_isolated("adversarial_netns_twice", || {
        init_logs();
        let dir = TempDir::new("adversarial_netns_twice");
        let vn = VirtualNode::build(36, 1).unwrap();
        let cfg = config("adversarial_netns_twice", dir.path());
        let (agent, proxy) = start_with_proxy(&cfg);
        add_all(&cfg, &[(0, vn.pod(0))]);
        proxy.wait_for(2);
        let mut second = CniPod::of(vn.pod(0), "uid-second");
        second.name = "second".into();
        failed_with(
            plugin("ADD", &second, &cfg.cni_socket),
            &format!(
                "pod uid-second: network namespace net:[{}] is pod uid-0's",
                vn.pod(0).netns.inode()
            ),
        );
        assert_eq!(
            read_tag(vn.pod(0).netns.fd()).unwrap().unwrap().uid,
            "uid-0"
        );
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-0"]);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(proxy.log().len(), 2, "{:?}", proxy.kinds());
        agent.shutdown();
    });
}

/// A CNI ADD that names a held pod's uid for another pod (another name, in
/// another network namespace: a runtime's or a meta-plugin's mistake) is
/// refused, naming the holder: the held pod keeps its capture and its
/// network namespace at the proxy, the other namespace gets no rules, and
/// the proxy hears nothing. Before, the uid moved to the second pod and
/// the first lost its capture at the proxies.
#[test]
fn adversarial_a_held_uid_for_another_pod_is_refused() {
    run_isolated("adversarial_uid_twice", || {
        init_logs();
        let dir = TempDir::new("adversarial_uid_twice");
        let vn = VirtualNode::build(69, 2).unwrap();
        let cfg = config("adversarial_uid_twice", dir.path());
        let (agent, proxy) = start_with_proxy(&cfg);
        let first = add_all(&cfg, &[(0, vn.pod(0))]).remove(0);
        proxy.wait_for(2);
        let mut other = CniPod::of(vn.pod(1), "uid-0");
        other.name = "other".into();
        other.container_id = "sandbox-other".into();
        failed_with(
            plugin("ADD", &other, &cfg.cni_socket),
            &format!(
                "pod uid-0 (shop/other): the uid is held for pod shop/{}; one uid is one pod",
                first.name
            ),
        );
        assert_eq!(
            read_tag(vn.pod(0).netns.fd()).unwrap().unwrap().uid,
            "uid-0"
        );
        assert_eq!(read_tag(vn.pod(1).netns.fd()).unwrap(), None);
        let held: Vec<_> = agent
            .pods()
            .into_iter()
            .map(|p| (p.pod.uid, p.pod.name))
            .collect();
        assert_eq!(held, [("uid-0".to_string(), first.name.clone())]);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(proxy.log().len(), 2, "{:?}", proxy.kinds());
        agent.shutdown();
    });
}
