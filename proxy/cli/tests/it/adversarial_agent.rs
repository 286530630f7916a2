//! Hostile pods against the real `ringway agent` binary. The owner tag in a
//! pod's `inet ringway` table lives in the pod's own network namespace: a
//! container with CAP_NET_ADMIN there rewrites it with `nft`, exactly as
//! these tests do. Nothing it writes may crash or block the agent.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::support;

use ringway_testbed::{run_isolated, wait_until, TempDir, VirtualNode};
use support::{live, Proc};

/// The tag of the issue: a piece count of u64::MAX (the agent used to size a
/// vector with it and exit with code 101 at every start).
const FORGED: &str = "ringway-pod:0/18446744073709551615:x";

fn start_agent(dir: &Path, metrics: SocketAddr) -> Proc {
    let child = support::agent_command(dir, Path::new("/run/netns"), &dir.join("agent.log"))
        .arg("--metrics-addr")
        .arg(metrics.to_string())
        .spawn()
        .unwrap();
    Proc(child)
}

/// Waits (bounded) for the agent's `/healthz/live` (no proxy here, so it is
/// never ready); panics with its log
/// when it exits or never answers.
fn wait_serving(agent: &mut Proc, dir: &Path, metrics: SocketAddr) {
    let log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    let serving = wait_until(Duration::from_secs(60), || {
        if let Some(status) = agent.0.try_wait().unwrap() {
            panic!(
                "ringway agent exited with {status} at start; its log:\n{}",
                log()
            );
        }
        live(metrics)
    });
    assert!(serving, "the agent never served; its log:\n{}", log());
}

/// One raw request line on the CNI socket, the response line back.
fn cni_request(socket: &Path, line: &str) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn adversarial_forged_owner_tag_neither_crashes_the_agent_nor_uses_up_its_handlers() {
    run_isolated("adversarial_forged_owner_tag", || {
        let dir = TempDir::new("adversarial-forged-tag");
        let vn = VirtualNode::build(71, 1).unwrap();
        let pod = vn.pod(0);
        let metrics: SocketAddr = "127.0.0.1:15122".parse().unwrap();
        let mut agent = start_agent(&dir, metrics);
        wait_serving(&mut agent, &dir, metrics);
        // No proxy has connected: every ADD of a pod to capture would fail,
        // so the agent says it is not ready, and why (issue 13 item 4).
        let r = ringway_testbed::http::get(metrics, "/healthz/ready").unwrap();
        assert_eq!(r.status, 503, "{r:?}");
        assert!(r.body.contains("no proxy has taken the snapshot"), "{r:?}");
        // What a container with CAP_NET_ADMIN in its own netns can do.
        pod.netns
            .exec(
                "nft",
                &[
                    "add",
                    "table",
                    "inet",
                    "ringway",
                    &format!("{{ comment \"{FORGED}\"; }}"),
                ],
            )
            .unwrap();

        // DEL of a pod the agent does not hold, naming the forged namespace:
        // the agent reads the tag to clean up stray rules. More DELs than the
        // agent has handler slots (64): every one is answered, so none of them
        // kept its slot.
        let del = serde_json::json!({
            "op": "del",
            "containerId": "sandbox-1",
            "netns": pod.netns.path(),
            "pod": {"uid": "uid-victim", "name": "web", "namespace": "shop"},
        })
        .to_string();
        for i in 0..80 {
            let resp = cni_request(&dir.join("cni.sock"), &del);
            assert!(
                resp.contains("\"ok\":true"),
                "DEL {i}: {resp:?}; agent log:\n{}",
                std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default()
            );
        }
        assert!(
            agent.0.try_wait().unwrap().is_none(),
            "the agent is still running"
        );
        assert!(live(metrics), "and still serving");

        // A restarted agent finds the forged tag in its scan: it starts and
        // serves all the same.
        drop(agent);
        let mut agent = start_agent(&dir, metrics);
        wait_serving(&mut agent, &dir, metrics);
        let resp = cni_request(&dir.join("cni.sock"), &del);
        assert!(resp.contains("\"ok\":true"), "{resp:?}");
        // The forged table is the pod's business: left as it was.
        let table = pod
            .netns
            .exec("nft", &["list", "table", "inet", "ringway"])
            .unwrap();
        assert!(table.contains(FORGED), "{table}");
        let log = std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
        assert!(
            log.contains("owner tag unreadable") && !log.contains("panicked"),
            "{log}"
        );
        drop(agent);
    });
}
