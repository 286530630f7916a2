//! The node agent's ZDS server against a fake proxy driven step by step:
//! the snapshot's order (Add with the netns fd per pod, one ack each, Keep
//! for a pod whose namespace is gone, then SnapshotSent), readiness only
//! after it, and every kind of garbage from a proxy closing that connection
//! only.
//!
//! Every test runs inside `run_isolated` on its own virtual node.

use crate::agent_support;

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use agent_support::*;
use ringway_testbed::{run_isolated, VirtualNode};
use ringway_zds as zds;

#[test]
fn snapshot_is_adds_one_ack_each_keep_for_gone_netns_then_snapshot_sent() {
    run_isolated("agent_zds_snapshot", || {
        init_logs();
        let dir = TempDir::new("agent_zds_snapshot");
        let cfg = config("agent_zds_snapshot", dir.path());
        let mut vn = VirtualNode::build(21, 3).unwrap();
        let agent = start(&cfg);
        let first = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let inodes: Vec<u64> = vn.pods.iter().map(|p| p.netns.inode()).collect();
        for (i, uid) in ["uid-0", "uid-1", "uid-2"].iter().enumerate() {
            ok(plugin("ADD", &CniPod::of(vn.pod(i), uid), &cfg.cni_socket));
        }
        first.wait_for(4);

        // Pod 2's namespace goes away behind the agent's back (its DEL is
        // lost): no process, no mount. The agent releases its fd.
        let name = vn.pod(2).name.clone();
        vn.remove_pod(&name).unwrap();
        assert_eq!(agent.reconcile_now(), vec!["uid-2".to_string()]);
        let st = agent.pods();
        assert_eq!(st[2].netns_inode, None);
        assert_eq!(st[0].netns_inode, Some(inodes[0]));

        // The first proxy leaves; the next one gets the snapshot.
        first.disconnect();
        wait_until(WAIT, || agent.proxies().is_empty());
        let p = FakeProxy::connect(&cfg.zds_socket);
        let status = || cni_line(&cfg.cni_socket, b"{\"op\":\"status\"}\n");
        for (i, uid) in ["uid-0", "uid-1"].iter().enumerate() {
            let r = p.recv();
            assert_eq!((r.kind, r.uid.as_str()), ("Add", *uid));
            assert_eq!(r.netns_inode, Some(inodes[i]));
            assert_eq!(r.info.as_ref().unwrap().1, "shop");
            // One request at a time: nothing more until this one is acked.
            assert_eq!(p.recv_within(Duration::from_millis(300)).unwrap(), None);
            p.ack();
        }
        let r = p.recv();
        assert_eq!(
            (r.kind, r.uid.as_str(), r.netns_inode),
            ("Keep", "uid-2", None)
        );
        p.ack();
        let r = p.recv();
        assert_eq!(r.kind, "SnapshotSent");
        // Not ready before SnapshotSent is acked.
        assert!(status().contains("\"kind\":\"notReady\""), "{}", status());
        assert!(agent.proxies().iter().all(|p| !p.ready));
        p.ack();
        wait_ready_proxies(&agent, 1);
        assert_eq!(status(), r#"{"ok":true}"#);

        // Live traffic after the snapshot: a DEL of the gone pod is a Del.
        let del = std::thread::spawn({
            let sock = cfg.cni_socket.clone();
            move || {
                cni_line(
                    &sock,
                    b"{\"op\":\"del\",\"containerId\":\"sandbox-uid-2\",\"pod\":{\"name\":\"x\",\"namespace\":\"shop\",\"uid\":\"uid-2\"}}\n",
                )
            }
        });
        let r = p.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Del", "uid-2"));
        p.ack();
        assert_eq!(del.join().unwrap(), r#"{"ok":true}"#);
        assert_eq!(agent.pods().len(), 2);
    });
}

#[test]
fn changes_during_the_snapshot_are_caught_up_before_ready() {
    run_isolated("agent_zds_catch_up", || {
        init_logs();
        let dir = TempDir::new("agent_zds_catch_up");
        let cfg = config("agent_zds_catch_up", dir.path());
        let vn = VirtualNode::build(22, 2).unwrap();
        let agent = start(&cfg);
        let old = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        ok(plugin(
            "ADD",
            &CniPod::of(vn.pod(0), "uid-0"),
            &cfg.cni_socket,
        ));

        // A new proxy is mid-snapshot (Add uid-0 not acked yet) when pod 1
        // is added and pod 0 deleted: both go to the old, ready proxy...
        let new = FakeProxy::connect(&cfg.zds_socket);
        let r = new.recv();
        assert_eq!((r.kind, r.uid.as_str()), ("Add", "uid-0"));
        ok(plugin(
            "ADD",
            &CniPod::of(vn.pod(1), "uid-1"),
            &cfg.cni_socket,
        ));
        ok(plugin(
            "DEL",
            &CniPod::of(vn.pod(0), "uid-0"),
            &cfg.cni_socket,
        ));
        assert_eq!(
            old.kinds()[1..],
            [
                ("Add", "uid-0".to_string()),
                ("Add", "uid-1".to_string()),
                ("Del", "uid-0".to_string())
            ]
        );
        // ...and the new one catches up after SnapshotSent, then is ready.
        new.ack();
        assert_eq!(new.recv().kind, "SnapshotSent");
        new.ack();
        let mut rest = Vec::new();
        for _ in 0..2 {
            let r = new.recv();
            rest.push((r.kind, r.uid.clone(), r.netns_inode));
            new.ack();
        }
        rest.sort();
        assert_eq!(
            rest,
            [
                ("Add", "uid-1".to_string(), Some(vn.pod(1).netns.inode())),
                ("Del", "uid-0".to_string(), None)
            ]
        );
        wait_ready_proxies(&agent, 2);
    });
}

/// Connects a misbehaving proxy, lets `script` misbehave, and checks that
/// the agent closes that connection while the good proxy stays ready.
fn misbehave(
    cfg: &ringway_cni::node::AgentConfig,
    agent: &ringway_cni::node::AgentHandle,
    what: &str,
    within: Duration,
    script: impl FnOnce(&FakeProxy),
) {
    let bad = FakeProxy::connect_raw(&cfg.zds_socket);
    let started = Instant::now();
    script(&bad);
    assert!(
        bad.closed_within(within),
        "{what}: the agent did not close the connection within {within:?}"
    );
    assert!(
        wait_until(WAIT, || agent.proxies().len() == 1),
        "{what}: {:?}",
        agent.proxies()
    );
    assert!(
        agent.proxies()[0].ready,
        "{what}: the good proxy is still ready"
    );
    eprintln!("{what}: closed after {:?}", started.elapsed());
}

#[test]
fn garbage_from_a_proxy_closes_only_its_connection() {
    run_isolated("agent_zds_garbage", || {
        init_logs();
        let dir = TempDir::new("agent_zds_garbage");
        let cfg = config("agent_zds_garbage", dir.path());
        let vn = VirtualNode::build(23, 2).unwrap();
        let agent = start(&cfg);
        let good = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        ok(plugin(
            "ADD",
            &CniPod::of(vn.pod(0), "uid-0"),
            &cfg.cni_socket,
        ));
        let quick = Duration::from_secs(2);
        let deadline = Duration::from_secs(7);

        misbehave(&cfg, &agent, "garbage hello", quick, |p| {
            p.send_raw(&[0xff, 0xff, 0xff])
        });
        misbehave(&cfg, &agent, "hello with version 7", quick, |p| p.hello(7));
        misbehave(&cfg, &agent, "hello of 2000 bytes", quick, |p| {
            p.send_raw(&[0u8; 2000])
        });
        misbehave(&cfg, &agent, "hello with an fd", quick, |p| {
            let f = std::fs::File::open("/dev/null").unwrap();
            zds::send(
                p.sock.as_fd(),
                &zds::ZdsHello { version: 1 },
                Some(f.as_fd()),
            )
            .unwrap();
        });
        misbehave(&cfg, &agent, "no hello (5 s deadline)", deadline, |_| {});
        // Good hello; then bad answers to the snapshot's Add.
        let bad_answer = |bytes: &'static [u8]| {
            move |p: &FakeProxy| {
                p.hello(1);
                assert_eq!(p.recv().kind, "Add");
                p.send_raw(bytes);
            }
        };
        misbehave(
            &cfg,
            &agent,
            "response without payload",
            quick,
            bad_answer(&[0x10, 0x01]),
        );
        misbehave(
            &cfg,
            &agent,
            "undecodable response",
            quick,
            bad_answer(&[0x0a, 0x7f]),
        );
        misbehave(
            &cfg,
            &agent,
            "oversize response",
            quick,
            bad_answer(&[0u8; 1500]),
        );
        misbehave(&cfg, &agent, "response with an fd", quick, |p| {
            p.hello(1);
            assert_eq!(p.recv().kind, "Add");
            let f = std::fs::File::open("/dev/null").unwrap();
            zds::send(p.sock.as_fd(), &zds::ack(None), Some(f.as_fd())).unwrap();
        });
        misbehave(&cfg, &agent, "no ack (5 s deadline)", deadline, |p| {
            p.hello(1);
            assert_eq!(p.recv().kind, "Add");
        });
        misbehave(&cfg, &agent, "unsolicited packet while idle", quick, |p| {
            p.hello(1);
            assert_eq!(p.recv().kind, "Add");
            p.ack();
            assert_eq!(p.recv().kind, "SnapshotSent");
            p.ack();
            assert!(wait_until(WAIT, || agent.proxies().iter().all(|x| x.ready)));
            p.ack();
        });

        // Still serving: a pod goes to the good proxy.
        ok(plugin(
            "ADD",
            &CniPod::of(vn.pod(1), "uid-1"),
            &cfg.cni_socket,
        ));
        let kinds = good.kinds();
        assert_eq!(kinds.last().unwrap(), &("Add", "uid-1".to_string()));
    });
}

/// The agent's readiness check (served as `/healthz/ready` next to its
/// metrics): ready while serving, not ready — naming why — when a socket
/// file the plugin or the proxies dial has been removed, or while stopping.
#[test]
fn health_check_names_what_is_wrong() {
    run_isolated("agent_health", || {
        init_logs();
        let dir = TempDir::new("agent_health");
        let cfg = config("agent_health", dir.path());
        let agent = start(&cfg);
        let health = agent.health_source();
        let live = agent.liveness_source();
        // Without a proxy every ADD of a pod to capture fails (code 11): not
        // ready, saying why; but live (a restart would not help).
        let why = health()
            .expect_err("an agent without a proxy is not ready")
            .to_string();
        assert!(why.contains("no proxy has taken the snapshot"), "{why}");
        live().expect("an agent waiting for its proxy is live");
        let _p = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        let ok = health().expect("ready once a proxy took the snapshot");
        assert!(
            ok.contains("0 pods enrolled") && ok.contains("1 proxies connected"),
            "{ok}"
        );
        std::fs::remove_file(&cfg.cni_socket).unwrap();
        let err = health().expect_err("CNI socket removed").to_string();
        assert!(
            err.contains("CNI event socket") && err.contains("is gone"),
            "{err}"
        );
        let err = live()
            .expect_err("CNI socket removed: not live either")
            .to_string();
        assert!(err.contains("is gone"), "{err}");
        agent.shutdown();
        let err = health().expect_err("stopped").to_string();
        assert!(err.contains("shutting down"), "{err}");
    });
}

/// Any process that reaches the ZDS socket and says hello gets every pod's
/// netns fd. Connections beyond `MAX_ZDS_CONNECTIONS` are closed at once (a
/// node runs one proxy, two during an upgrade), and the slot of a closed
/// connection is given back.
#[test]
fn adversarial_zds_connections_beyond_the_cap_are_refused() {
    run_isolated("adversarial_zds_cap", || {
        init_logs();
        let dir = TempDir::new("adversarial_zds_cap");
        let cfg = config("adversarial_zds_cap", dir.path());
        let agent = start(&cfg);
        // Hold every slot with connections that never say hello.
        let mut held: Vec<FakeProxy> = (0..ringway_cni::node::MAX_ZDS_CONNECTIONS)
            .map(|_| FakeProxy::connect_raw(&cfg.zds_socket))
            .collect();
        // The next one is closed without a word (well before the 5 s hello
        // deadline that closes the silent ones).
        let extra = FakeProxy::connect_raw(&cfg.zds_socket);
        assert!(
            extra.closed_within(Duration::from_secs(3)),
            "a connection beyond the cap was served"
        );
        assert!(agent.proxies().is_empty());
        // One slot is given back: a real proxy gets in.
        drop(held.pop());
        let deadline = Instant::now() + WAIT;
        let p = loop {
            let p = FakeProxy::connect_raw(&cfg.zds_socket);
            // Refused while the slot is not back yet: the send may fail.
            let _ = zds::send(p.sock.as_fd(), &zds::ZdsHello { version: 1 }, None);
            match p.recv_within(Duration::from_secs(1)) {
                Ok(Some(r)) => {
                    assert_eq!(r.kind, "SnapshotSent");
                    break p;
                }
                _ => assert!(Instant::now() < deadline, "the slot never came back"),
            }
        };
        p.ack();
        wait_ready_proxies(&agent, 1);
        assert!(agent.metrics_text().contains(
            r#"ringway_agent_connections_refused_total{socket="zds",reason="connection_cap"}"#
        ));
        drop(held);
        agent.shutdown();
    });
}

/// A stopping agent takes its ZDS socket's name away before it closes the
/// proxies' connections: a proxy that sees its connection end and reconnects
/// at once finds no agent (it waits for the next one), never the agent on
/// its way out, which would serve it a snapshot and drop it again.
#[test]
fn a_stopping_agent_is_gone_before_its_proxies_see_their_connection_end() {
    run_isolated("agent_zds_stop", || {
        init_logs();
        let dir = TempDir::new("agent_zds_stop");
        let cfg = config("agent_zds_stop", dir.path());
        let agent = start(&cfg);
        let p = FakeProxy::connect(&cfg.zds_socket);
        p.empty_snapshot();
        wait_ready_proxies(&agent, 1);
        let stopping = std::thread::spawn(move || agent.shutdown());
        assert!(
            p.closed_within(WAIT),
            "the agent never closed the connection"
        );
        let again = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::SEQPACKET, None)
            .unwrap()
            .connect(&socket2::SockAddr::unix(&cfg.zds_socket).unwrap());
        assert!(
            again.is_err(),
            "a proxy reconnected to the agent on its way out"
        );
        stopping.join().unwrap();
    });
}

/// Both sockets check the peer's uid (SO_PEERCRED) against the configured
/// ones, on top of the files' mode: here only uid 4242 may connect, and the
/// test runs as root.
#[test]
fn adversarial_peers_whose_uid_is_not_allowed_are_refused_on_both_sockets() {
    run_isolated("adversarial_peer_uid", || {
        init_logs();
        let dir = TempDir::new("adversarial_peer_uid");
        let mut cfg = config("adversarial_peer_uid", dir.path());
        cfg.peer_uids = vec![4242];
        let agent = start(&cfg);
        let p = FakeProxy::connect_raw(&cfg.zds_socket);
        let _ = zds::send(p.sock.as_fd(), &zds::ZdsHello { version: 1 }, None);
        assert!(
            p.closed_within(Duration::from_secs(3)),
            "ZDS served a peer whose uid is not allowed"
        );
        assert!(agent.proxies().is_empty());
        let resp = cni_line(&cfg.cni_socket, b"{\"op\":\"status\"}\n");
        assert!(
            resp.contains(r#""kind":"rejected""#)
                && resp.contains("peer uid 0 (pid ")
                && resp.contains("is not allowed on the cni socket (allowed uids: [4242])"),
            "{resp}"
        );
        let m = agent.metrics_text();
        for socket in ["zds", "cni"] {
            assert!(
                m.contains(&format!(
                    r#"ringway_agent_connections_refused_total{{socket="{socket}",reason="peer_uid"}} 1"#
                )),
                "{m}"
            );
        }
        agent.shutdown();
    });
}
