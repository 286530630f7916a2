//! The node agent driving the real proxy (its ZDS client) on a virtual node:
//! pods enrolled through the CNI socket carry traffic through the proxy; an
//! agent restart leaves a long-lived proxied connection and the rules alone
//! while the proxy gets a fresh snapshot; DEL takes the pod out of the proxy.
//!
//! Runs inside `run_isolated`.

use crate::agent_support;
use crate::common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_support::*;
use ringway_cni::node::{AgentConfig, AgentHandle};
use ringway_config::{CaptureMode, Datapath};
use ringway_proxy::zds_client::{self, Readiness, ZdsClientConfig};
use ringway_proxy::Proxy;
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{run_isolated, Pod, VirtualNode};

#[test]
fn agent_and_proxy_capture_pods_and_survive_an_agent_restart() {
    run_isolated("agent_proxy_e2e", || {
        init_logs();
        let dir = TempDir::new("agent_proxy_e2e");
        let cfg = config("agent_proxy_e2e", dir.path());
        let vn = VirtualNode::build(41, 2).unwrap();
        let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        let pauses = [a.start_pause().unwrap(), b.start_pause().unwrap()];

        let agent = start(&cfg);
        let RealProxy {
            proxy,
            ready,
            stop,
            client,
        } = RealProxy::start(&cfg, &agent);

        let pods = [CniPod::of(&a, "uid-a"), CniPod::of(&b, "uid-b")];
        for p in &pods {
            ok(plugin("ADD", p, &cfg.cni_socket));
        }
        let mut uids: Vec<String> = proxy.pods().into_iter().map(|p| p.uid).collect();
        uids.sort();
        assert_eq!(uids, ["uid-a", "uid-b"]);

        // a -> b through the proxy; b sees a's own address.
        let addr = SocketAddr::new(b.ip(false), 8080);
        let l = b.netns.run(|| listen(addr)).unwrap();
        let srv = PayloadServer::start(l, 2);
        captured_exchange(&proxy, &a, addr, &srv, 1000, 70_000);

        // A long-lived connection (a -> b:9090, echo) across an agent restart.
        let echo_addr = SocketAddr::new(b.ip(false), 9090);
        let echo_l: TcpListener = b.netns.run(|| listen(echo_addr)).unwrap();
        let echo = std::thread::spawn(move || {
            let (mut s, _) = echo_l.accept().unwrap();
            let mut buf = [0u8; 4];
            for _ in 0..2 {
                s.read_exact(&mut buf).unwrap();
                s.write_all(&buf).unwrap();
            }
        });
        let mut conn = a.netns.run(|| connect(echo_addr, WAIT)).unwrap();
        conn.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = [0u8; 4];
        conn.write_all(b"ping").unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");

        let handles_before = [handles(&a), handles(&b)];
        let snapshots = ready.snapshots.load(Ordering::SeqCst);
        agent.shutdown();
        let agent = start(&cfg);
        assert_eq!(agent.rediscovery().adopted, ["uid-a", "uid-b"]);
        wait_ready_proxies(&agent, 1);
        assert!(wait_until(WAIT, || ready.snapshots.load(Ordering::SeqCst) > snapshots));
        assert!(wait_until(WAIT, || ready.is_ready()), "{}", ready.reason());
        assert_eq!(
            [handles(&a), handles(&b)],
            handles_before,
            "rules untouched"
        );
        assert_eq!(proxy.pods().len(), 2);

        conn.write_all(b"pong").unwrap();
        conn.read_exact(&mut buf).unwrap();
        assert_eq!(
            &buf, b"pong",
            "the long-lived connection survived the restart"
        );
        echo.join().unwrap();
        let got = a
            .netns
            .run(|| client_exchange(connect(addr, WAIT)?, 10, 10))
            .unwrap();
        assert_eq!(got, 10);

        // DEL takes b out of the proxy and removes its rules.
        ok(plugin("DEL", &pods[1], &cfg.cni_socket));
        assert!(wait_until(WAIT, || proxy.pods().len() == 1));
        assert_eq!(proxy.pods()[0].uid, "uid-a");
        assert_eq!(ringway_redirect::read_tag(b.netns.fd()).unwrap(), None);

        agent.shutdown();
        stop.store(true, Ordering::SeqCst);
        client.join().unwrap();
        drop(pauses);
    });
}

/// `from` sends `send` bytes to `srv` at `addr` and reads `recv` back: the
/// connection is captured by `proxy` and arrives from `from`'s own address.
fn captured_exchange(
    proxy: &Proxy,
    from: &Pod,
    addr: SocketAddr,
    srv: &PayloadServer,
    send: u64,
    recv: u64,
) {
    let before = proxy.stats();
    let got = from
        .netns
        .run(|| client_exchange(connect(addr, WAIT)?, send, recv))
        .unwrap();
    assert_eq!(got, recv);
    let rep = srv.next_report(WAIT).unwrap();
    assert_eq!(rep.peer.ip(), from.ip(false), "the client's own address");
    assert!(
        proxy.stats().accepted > before.accepted,
        "captured by the proxy"
    );
}

/// The real proxy on the agent's ZDS socket: its ZDS client on its own
/// thread, connected and ready.
struct RealProxy {
    proxy: Arc<Proxy>,
    ready: Arc<Readiness>,
    stop: Arc<AtomicBool>,
    client: std::thread::JoinHandle<()>,
}

impl RealProxy {
    fn start(cfg: &AgentConfig, agent: &AgentHandle) -> RealProxy {
        let proxy =
            Arc::new(Proxy::start(common::settings(CaptureMode::Tproxy, Datapath::Auto)).unwrap());
        let ready = Arc::new(Readiness::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut zcfg = ZdsClientConfig::new(cfg.zds_socket.clone());
        zcfg.backoff_max = Duration::from_millis(200);
        zcfg.retry_every = Duration::from_millis(100);
        let client = std::thread::spawn({
            let (p, r, s) = (proxy.clone(), ready.clone(), stop.clone());
            move || zds_client::run(p, zcfg, r, s)
        });
        wait_ready_proxies(agent, 1);
        assert!(wait_until(WAIT, || ready.is_ready()), "{}", ready.reason());
        RealProxy {
            proxy,
            ready,
            stop,
            client,
        }
    }
}

/// A pod's sandbox is torn down and its CNI DEL never reaches the agent (the
/// agent refused it while busy, or was down: the plugin answers DEL as done
/// either way), then the runtime gives its address to a new pod. The pod
/// whose namespace is gone gives the address way: the new pod is enrolled
/// and served. While the holder's namespace is live, a second pod on its
/// address is still refused.
#[test]
fn a_pod_whose_del_never_came_gives_its_address_to_the_next_pod() {
    run_isolated("agent_proxy_missed_del", || {
        init_logs();
        let dir = TempDir::new("agent_proxy_missed_del");
        let cfg = config("agent_proxy_missed_del", dir.path());
        let mut vn = VirtualNode::build(42, 2).unwrap();
        let agent = start(&cfg);
        let real = RealProxy::start(&cfg, &agent);
        let proxy = &real.proxy;
        let (old, b) = (vn.pod(0).clone(), vn.pod(1).clone());
        ok(plugin("ADD", &CniPod::of(&old, "uid-old"), &cfg.cni_socket));

        // A live pod that claims the old pod's address is refused.
        let mut claim = CniPod::of(&b, "uid-claim");
        claim.ips = CniPod::of(&old, "uid-old").ips;
        let out = plugin("ADD", &claim, &cfg.cni_socket);
        assert_ne!(
            out.exit_code, 0,
            "a second live pod on one address: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("uid-old"),
            "names the holder: {}",
            out.stdout
        );
        let uids = |p: &Proxy| p.pods().into_iter().map(|p| p.uid).collect::<Vec<_>>();
        assert_eq!(uids(proxy), ["uid-old"]);

        // The old sandbox goes (no DEL), its address goes to a new pod.
        let (old_name, old_ip) = (old.name.clone(), old.ipv4);
        drop(old);
        let new = vn.replace_pod(&old_name).unwrap();
        assert_eq!(new.ipv4, old_ip);
        ok(plugin("ADD", &CniPod::of(&new, "uid-new"), &cfg.cni_socket));
        assert_eq!(uids(proxy), ["uid-new"]);
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-new"]);

        // b -> the new pod goes through the proxy and arrives from b.
        let addr = SocketAddr::new(new.ip(false), 8080);
        let l = new.netns.run(|| listen(addr)).unwrap();
        let srv = PayloadServer::start(l, 1);
        captured_exchange(proxy, &b, addr, &srv, 100, 1000);

        agent.shutdown();
        real.stop.store(true, Ordering::SeqCst);
        real.client.join().unwrap();
    });
}
