//! The plugin's commands end to end through `run` with a scripted agent:
//! every command's output and exit code, pass-through pods, the agent's
//! answers as CNI codes, and the config and environment errors.

use std::collections::HashMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::*;
use crate::conf::{Attachment, DEFAULT_AGENT_SOCKET};
use crate::testing::{Call, FakeAgent};
use crate::PodIp;

const CONTAINER: &str = "f00dcafe01";
const NETNS: &str = "/var/run/netns/cni-1234";
const K8S_ARGS: &str = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-7d9f;\
                        K8S_POD_INFRA_CONTAINER_ID=f00dcafe01;K8S_POD_UID=9a8b-7c6d";

fn env(command: &str) -> HashMap<String, String> {
    [
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", CONTAINER),
        ("CNI_NETNS", NETNS),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        ("CNI_ARGS", K8S_ARGS),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn env_with(command: &str, changes: &[(&str, Option<&str>)]) -> HashMap<String, String> {
    let mut m = env(command);
    for (k, v) in changes {
        match v {
            Some(v) => m.insert((*k).to_owned(), (*v).to_owned()),
            None => m.remove(*k),
        };
    }
    m
}

/// What the main plugin (e.g. a bridge/ptp plugin) returns, at 1.0.0.
fn prev_100() -> Value {
    json!({
        "cniVersion": "1.0.0",
        "interfaces": [
            {"name": "cni0", "mac": "02:00:00:00:00:01"},
            {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": NETNS}
        ],
        "ips": [
            {"address": "10.244.1.7/24", "gateway": "10.244.1.1", "interface": 1},
            {"address": "fd00:10:244:1::7/64", "interface": 1}
        ],
        "routes": [{"dst": "0.0.0.0/0", "gw": "10.244.1.1"}],
        "dns": {"nameservers": ["10.96.0.10"]}
    })
}

fn conf(version: &str, prev: Option<Value>) -> Vec<u8> {
    let mut c = json!({
        "cniVersion": version,
        "name": "k8s-pod-network",
        "type": "ringway-cni",
        "logLevel": "debug",
        "capabilities": {"io.kubernetes.cri.pod-annotations": true}
    });
    if let Some(p) = prev {
        c["prevResult"] = p;
    }
    c.to_string().into_bytes()
}

fn pod() -> PodRef {
    PodRef {
        name: "cart-7d9f".into(),
        namespace: "shop".into(),
        uid: Some("9a8b-7c6d".into()),
        infra_container_id: Some(CONTAINER.into()),
    }
}

fn ips() -> Vec<PodIp> {
    vec![
        "10.244.1.7/24".parse().unwrap(),
        "fd00:10:244:1::7/64".parse().unwrap(),
    ]
}

fn ok(out: &Outcome) -> &str {
    assert_eq!(out.exit_code, 0, "expected success, got {}", out.stdout);
    &out.stdout
}

fn failed(out: &Outcome) -> &str {
    assert_eq!(out.exit_code, 1, "expected failure, got {}", out.stdout);
    &out.stdout
}

const RESULT_100: &str = r#"{"cniVersion":"1.0.0","dns":{"nameservers":["10.96.0.10"]},"interfaces":[{"mac":"02:00:00:00:00:01","name":"cni0"},{"mac":"02:00:00:00:00:02","name":"eth0","sandbox":"/var/run/netns/cni-1234"}],"ips":[{"address":"10.244.1.7/24","gateway":"10.244.1.1","interface":1},{"address":"fd00:10:244:1::7/64","interface":1}],"routes":[{"dst":"0.0.0.0/0","gw":"10.244.1.1"}]}"#;

// ---------------------------------------------------------------- ADD

#[test]
fn add_captures_the_pod_and_prints_prev_result() {
    let agent = FakeAgent::new();
    let out = run(&env("ADD"), &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(ok(&out), RESULT_100);
    assert_eq!(
        agent.calls(),
        [Call::Add(AddRequest {
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            network: "k8s-pod-network".into(),
            container_id: CONTAINER.into(),
            netns: PathBuf::from(NETNS),
            ifname: "eth0".into(),
            pod: pod(),
            ips: ips(),
        })]
    );
}

/// The agent's selection rule passes the pod over: the ADD succeeds with prevResult,
/// as for a pod the plugin itself passes through.
#[test]
fn add_succeeds_when_the_agent_passes_the_pod_through() {
    let agent = FakeAgent::new();
    agent.pass_through("neither pod nor namespace labelled ringway.io/dataplane-mode=enabled or istio.io/dataplane-mode=ambient");
    let out = run(&env("ADD"), &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(ok(&out), RESULT_100);
    assert_eq!(agent.calls().len(), 1);
}

#[test]
fn add_uses_the_configured_agent_socket() {
    let agent = FakeAgent::new();
    let mut c: Value = serde_json::from_slice(&conf("1.0.0", Some(prev_100()))).unwrap();
    c["agentSocket"] = json!("/run/ringway/other.sock");
    let out = run(&env("ADD"), c.to_string().as_bytes(), &agent);
    ok(&out);
    let Call::Add(req) = &agent.calls()[0] else {
        panic!("expected an add")
    };
    assert_eq!(req.agent_socket, PathBuf::from("/run/ringway/other.sock"));
}

#[test]
fn add_reencodes_prev_result_at_1_1_0() {
    let mut prev = prev_100();
    prev["cniVersion"] = json!("0.4.0");
    prev["ips"][0]["version"] = json!("4");
    prev["ips"][1]["version"] = json!("6");
    let out = run(&env("ADD"), &conf("1.1.0", Some(prev)), &FakeAgent::new());
    assert_eq!(ok(&out), RESULT_100.replace(r#""1.0.0""#, r#""1.1.0""#));
}

#[test]
fn add_reencodes_prev_result_at_1_0_0() {
    // A 1.1.0 result (route mtu/table are 1.1 fields, kept) printed at 1.0.0.
    let prev = json!({
        "cniVersion": "1.1.0",
        "interfaces": [{"name": "eth0", "sandbox": NETNS, "mtu": 1450}],
        "ips": [{"address": "10.244.1.7/24", "interface": 0}],
        "routes": [{"dst": "0.0.0.0/0", "mtu": 1400, "table": 100}]
    });
    let out = run(&env("ADD"), &conf("1.0.0", Some(prev)), &FakeAgent::new());
    assert_eq!(
        ok(&out),
        r#"{"cniVersion":"1.0.0","interfaces":[{"mtu":1450,"name":"eth0","sandbox":"/var/run/netns/cni-1234"}],"ips":[{"address":"10.244.1.7/24","interface":0}],"routes":[{"dst":"0.0.0.0/0","mtu":1400,"table":100}]}"#
    );
}

#[test]
fn add_reencodes_prev_result_at_0_4_0_with_ip_versions() {
    let out = run(
        &env("ADD"),
        &conf("0.4.0", Some(prev_100())),
        &FakeAgent::new(),
    );
    assert_eq!(
        ok(&out),
        r#"{"cniVersion":"0.4.0","dns":{"nameservers":["10.96.0.10"]},"interfaces":[{"mac":"02:00:00:00:00:01","name":"cni0"},{"mac":"02:00:00:00:00:02","name":"eth0","sandbox":"/var/run/netns/cni-1234"}],"ips":[{"address":"10.244.1.7/24","gateway":"10.244.1.1","interface":1,"version":"4"},{"address":"fd00:10:244:1::7/64","interface":1,"version":"6"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.244.1.1"}]}"#
    );
}

#[test]
fn add_without_prev_result_is_code_7() {
    let agent = FakeAgent::new();
    let out = run(&env("ADD"), &conf("1.0.0", None), &agent);
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":7,"msg":"network config has no \"prevResult\": must be chained after a plugin that returns a result","details":"list \"ringway-cni\" after the main CNI plugin in the conflist's \"plugins\""}"#
    );
    assert!(agent.calls().is_empty());
}

#[test]
fn add_with_agent_unavailable_is_try_again_later() {
    let agent = FakeAgent::unavailable("connect /var/run/ringway/cni/cni.sock: connection refused");
    let out = run(&env("ADD"), &conf("1.1.0", Some(prev_100())), &agent);
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.1.0","code":11,"msg":"try again later: node agent unavailable: connect /var/run/ringway/cni/cni.sock: connection refused","details":"agentSocket /var/run/ringway/cni/cni.sock; a pod does not start before ringway captures its traffic, the runtime retries"}"#
    );
    assert_eq!(agent.calls().len(), 1);
}

#[test]
fn add_with_agent_not_ready_is_try_again_later() {
    let agent = FakeAgent::failing(AgentError::NotReady {
        reason: "no node proxy connected".into(),
    });
    let out = run(&env("ADD"), &conf("0.4.0", Some(prev_100())), &agent);
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["cniVersion"], "0.4.0", "error at the config's version");
    assert_eq!(v["code"], 11);
    assert_eq!(
        v["msg"],
        "try again later: node agent not ready: no node proxy connected"
    );
}

#[test]
fn add_rejected_or_garbled_by_the_agent() {
    for (err, code, msg) in [
        (
            AgentError::Rejected {
                reason: "netns is the host's".into(),
            },
            100,
            "node agent refused the request: netns is the host's",
        ),
        (
            AgentError::Protocol {
                reason: "HTTP/1.1 502".into(),
            },
            101,
            "node agent answered outside the protocol: HTTP/1.1 502",
        ),
    ] {
        let out = run(
            &env("ADD"),
            &conf("1.0.0", Some(prev_100())),
            &FakeAgent::failing(err),
        );
        let v: Value = serde_json::from_str(failed(&out)).unwrap();
        assert_eq!(
            (v["code"].as_u64(), v["msg"].as_str()),
            (Some(code), Some(msg))
        );
        assert_eq!(v["details"], "agentSocket /var/run/ringway/cni/cni.sock");
    }
}

#[test]
fn add_passes_ringway_system_pods_through() {
    let agent = FakeAgent::unavailable("agent not started yet");
    let e = env_with(
        "ADD",
        &[(
            "CNI_ARGS",
            Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=ringway-system;K8S_POD_NAME=ringway-node-x1"),
        )],
    );
    let out = run(&e, &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(ok(&out), RESULT_100);
    assert!(
        agent.calls().is_empty(),
        "the agent's own pods never wait for it"
    );
}

#[test]
fn add_passes_configured_namespaces_through() {
    let agent = FakeAgent::new();
    let mut c: Value = serde_json::from_slice(&conf("1.0.0", Some(prev_100()))).unwrap();
    c["excludeNamespaces"] = json!(["kube-system", "shop"]);
    let out = run(&env("ADD"), c.to_string().as_bytes(), &agent);
    assert_eq!(ok(&out), RESULT_100);
    assert!(agent.calls().is_empty());

    // The list replaces the default: ringway-system is captured now.
    let e = env_with(
        "ADD",
        &[(
            "CNI_ARGS",
            Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=ringway-system;K8S_POD_NAME=x"),
        )],
    );
    ok(&run(&e, c.to_string().as_bytes(), &agent));
    assert_eq!(agent.calls().len(), 1);
}

#[test]
fn add_passes_non_kubernetes_sandboxes_through() {
    for args in [
        None,
        Some("IgnoreUnknown=1"),
        Some("IgnoreUnknown=1;K8S_POD_NAME=web"),
        Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME="),
    ] {
        let agent = FakeAgent::new();
        let e = env_with("ADD", &[("CNI_ARGS", args)]);
        let out = run(&e, &conf("1.0.0", Some(prev_100())), &agent);
        assert_eq!(ok(&out), RESULT_100, "{args:?}");
        assert!(agent.calls().is_empty(), "{args:?}");
    }
}

#[test]
fn add_names_each_missing_variable() {
    for var in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_PATH"] {
        let agent = FakeAgent::new();
        let out = run(
            &env_with("ADD", &[(var, None)]),
            &conf("1.0.0", Some(prev_100())),
            &agent,
        );
        assert_eq!(
            failed(&out),
            format!(
                r#"{{"cniVersion":"1.0.0","code":4,"msg":"required environment variable {var} is not set or empty (needed for ADD)","details":""}}"#
            )
        );
        assert!(agent.calls().is_empty());
    }
}

#[test]
fn add_with_bad_prev_result() {
    let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.244.1.7"}]});
    let out = run(&env("ADD"), &conf("1.0.0", Some(prev)), &FakeAgent::new());
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":7,"msg":"prevResult.ips[0].address \"10.244.1.7\" is not an address with a prefix length (like 10.0.0.5/24)","details":""}"#
    );
}

// ---------------------------------------------------------- bad input

#[test]
fn stdin_that_is_not_json_is_code_6() {
    let out = run(&env("ADD"), b"garbage", &FakeAgent::new());
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.1.0","code":6,"msg":"network config is not valid JSON: expected value at line 1 column 1","details":""}"#
    );
}

#[test]
fn config_without_type_is_code_7() {
    let c = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "prevResult": prev_100()});
    let out = run(&env("ADD"), c.to_string().as_bytes(), &FakeAgent::new());
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":7,"msg":"network config has no \"type\"","details":""}"#
    );
}

#[test]
fn unknown_command_is_code_4() {
    let out = run(
        &env("FOO"),
        &conf("1.0.0", Some(prev_100())),
        &FakeAgent::new(),
    );
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_COMMAND \"FOO\" is not one of ADD, DEL, CHECK, VERSION, STATUS, GC","details":""}"#
    );
}

#[test]
fn missing_command_is_code_4() {
    let e = env_with("ADD", &[("CNI_COMMAND", None)]);
    let out = run(&e, &conf("1.0.0", None), &FakeAgent::new());
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":4,"msg":"required environment variable CNI_COMMAND is not set","details":""}"#
    );
}

#[test]
fn malformed_cni_args_is_code_4() {
    let agent = FakeAgent::new();
    let e = env_with(
        "ADD",
        &[("CNI_ARGS", Some("K8S_POD_NAMESPACE=shop;K8S_POD_NAME"))],
    );
    let out = run(&e, &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":4,"msg":"CNI_ARGS \"K8S_POD_NAMESPACE=shop;K8S_POD_NAME\" is malformed: pair \"K8S_POD_NAME\" has no '='","details":"expected K=V pairs separated by ';'"}"#
    );
    assert!(agent.calls().is_empty());
}

#[test]
fn incompatible_cni_version_is_code_1() {
    let out = run(
        &env("ADD"),
        &conf("2.0.0", Some(prev_100())),
        &FakeAgent::new(),
    );
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.1.0","code":1,"msg":"cniVersion \"2.0.0\" is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)","details":""}"#
    );
}

#[test]
fn prev_result_at_an_unsupported_version_is_code_1() {
    let prev = json!({"cniVersion": "0.2.0", "ip4": {"ip": "10.244.1.7/24"}});
    let out = run(&env("ADD"), &conf("1.0.0", Some(prev)), &FakeAgent::new());
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["code"], 1);
    assert_eq!(
        v["msg"],
        r#"prevResult cniVersion "0.2.0" is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"#
    );
}

// ---------------------------------------------------------------- DEL

#[test]
fn del_releases_the_pod() {
    let agent = FakeAgent::new();
    let out = run(&env("DEL"), &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(ok(&out), "");
    assert_eq!(
        agent.calls(),
        [Call::Del(DelRequest {
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            network: "k8s-pod-network".into(),
            container_id: CONTAINER.into(),
            netns: Some(PathBuf::from(NETNS)),
            ifname: "eth0".into(),
            pod: pod(),
        })]
    );
}

#[test]
fn del_with_empty_netns_succeeds() {
    for netns in [Some(""), None] {
        let agent = FakeAgent::new();
        let e = env_with("DEL", &[("CNI_NETNS", netns)]);
        let out = run(&e, &conf("1.0.0", None), &agent);
        assert_eq!(ok(&out), "");
        let Call::Del(req) = &agent.calls()[0] else {
            panic!("expected a del")
        };
        assert_eq!(req.netns, None);
    }
}

#[test]
fn del_succeeds_whatever_the_agent_says() {
    for err in [
        AgentError::Unavailable {
            reason: "connection refused".into(),
        },
        AgentError::NotReady {
            reason: "starting".into(),
        },
        AgentError::UnknownContainer {
            container_id: CONTAINER.into(),
        },
        AgentError::Rejected {
            reason: "nope".into(),
        },
        AgentError::Protocol {
            reason: "garbage".into(),
        },
    ] {
        let agent = FakeAgent::failing(err.clone());
        let out = run(&env("DEL"), &conf("1.0.0", None), &agent);
        assert_eq!(ok(&out), "", "{err}");
        assert_eq!(agent.calls().len(), 1);
    }
}

#[test]
fn del_twice_is_fine() {
    let agent = FakeAgent::new();
    agent.answer(Ok(()));
    agent.answer(Err(AgentError::UnknownContainer {
        container_id: CONTAINER.into(),
    }));
    ok(&run(&env("DEL"), &conf("1.0.0", None), &agent));
    ok(&run(&env("DEL"), &conf("1.0.0", None), &agent));
    assert_eq!(agent.calls().len(), 2);
}

#[test]
fn del_ignores_a_bad_cached_prev_result() {
    let out = run(
        &env("DEL"),
        &conf("1.0.0", Some(json!("garbage"))),
        &FakeAgent::new(),
    );
    assert_eq!(ok(&out), "");
}

#[test]
fn del_of_pass_through_pods_does_not_call_the_agent() {
    let agent = FakeAgent::new();
    let e = env_with(
        "DEL",
        &[(
            "CNI_ARGS",
            Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=ringway-system;K8S_POD_NAME=n"),
        )],
    );
    ok(&run(&e, &conf("1.0.0", None), &agent));
    ok(&run(
        &env_with("DEL", &[("CNI_ARGS", None)]),
        &conf("1.0.0", None),
        &agent,
    ));
    assert!(agent.calls().is_empty());
}

#[test]
fn del_still_needs_container_id_and_ifname() {
    for var in ["CNI_CONTAINERID", "CNI_IFNAME"] {
        let out = run(
            &env_with("DEL", &[(var, None)]),
            &conf("1.0.0", None),
            &FakeAgent::new(),
        );
        let v: Value = serde_json::from_str(failed(&out)).unwrap();
        assert_eq!(v["code"], 4);
        assert_eq!(
            v["msg"],
            format!("required environment variable {var} is not set or empty (needed for DEL)")
        );
    }
}

#[test]
fn del_with_a_config_it_cannot_fully_parse_still_releases_the_pod() {
    // Each of these makes ADD fail with code 6 or 7; DEL must still reach the
    // agent (with what it could read) and succeed, or the primary plugin's DEL,
    // which libcni runs after ours, never runs.
    let sock = "/run/custom/cni.sock";
    let cases: Vec<(Vec<u8>, &str, &str)> = vec![
        (
            json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "ringway-cni",
                   "agentSocket": sock, "logLevel": "loud"})
            .to_string()
            .into_bytes(),
            sock,
            "logLevel",
        ),
        (
            json!({"cniVersion": "9.9.9", "name": "k8s-pod-network", "type": "ringway-cni",
                   "agentSocket": sock})
            .to_string()
            .into_bytes(),
            sock,
            "9.9.9",
        ),
        (
            json!({"name": 7, "type": "ringway-cni", "agentSocket": sock,
                   "excludeNamespaces": "kube-system"})
            .to_string()
            .into_bytes(),
            sock,
            "excludeNamespaces",
        ),
        (
            json!({"cniVersion": "1.0.0", "name": "n", "type": "ringway-cni",
                   "agentSocket": "relative/cni.sock"})
            .to_string()
            .into_bytes(),
            DEFAULT_AGENT_SOCKET,
            "agentSocket",
        ),
        (b"{not json".to_vec(), DEFAULT_AGENT_SOCKET, "JSON"),
        (b"[1,2]".to_vec(), DEFAULT_AGENT_SOCKET, "object"),
    ];
    for (stdin, expected_socket, what) in cases {
        let add = run(&env("ADD"), &stdin, &FakeAgent::new());
        assert_eq!(add.exit_code, 1, "ADD must refuse the config ({what})");
        let agent = FakeAgent::new();
        let out = run(&env("DEL"), &stdin, &agent);
        assert_eq!(ok(&out), "", "DEL with a bad {what}");
        let calls = agent.calls();
        let [Call::Del(req)] = calls.as_slice() else {
            panic!("DEL with a bad {what} did not reach the agent: {calls:?}")
        };
        assert_eq!(req.agent_socket, PathBuf::from(expected_socket), "{what}");
        assert_eq!(req.container_id, CONTAINER);
        assert_eq!(req.pod, pod());
    }
}

#[test]
fn del_with_an_unparsable_config_keeps_default_exclusions() {
    // ringway's own pods were never captured: the default exclusions still hold.
    let agent = FakeAgent::new();
    let e = env_with(
        "DEL",
        &[(
            "CNI_ARGS",
            Some("IgnoreUnknown=1;K8S_POD_NAMESPACE=ringway-system;K8S_POD_NAME=n"),
        )],
    );
    ok(&run(&e, b"{not json", &agent));
    assert!(agent.calls().is_empty());
}

#[test]
fn unknown_config_keys_are_named_with_a_suggestion() {
    let c = NetConf::parse(
        json!({"cniVersion": "1.0.0", "name": "n", "type": "ringway-cni",
               "agentsocket": "/x.sock", "ipam": {}, "dns": {}, "capabilities": {},
               "cni.dev/attachments": [], "mtu": 1400, "log_level": "debug"})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let unknown: Vec<String> = c.unknown_keys().iter().map(ToString::to_string).collect();
    assert_eq!(
        unknown,
        [
            r#""agentsocket" (did you mean "agentSocket"?)"#,
            r#""log_level" (did you mean "logLevel"?)"#,
            r#""mtu""#,
        ]
    );
    // Not an error: the misspelled key only warns, ADD still works.
    assert_eq!(c.agent_socket, PathBuf::from(DEFAULT_AGENT_SOCKET));
}

// -------------------------------------------------------------- CHECK

#[test]
fn check_asks_the_agent() {
    let agent = FakeAgent::new();
    let out = run(&env("CHECK"), &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(ok(&out), "");
    assert_eq!(
        agent.calls(),
        [Call::Check(CheckRequest {
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            network: "k8s-pod-network".into(),
            container_id: CONTAINER.into(),
            netns: PathBuf::from(NETNS),
            ifname: "eth0".into(),
            pod: pod(),
            ips: ips(),
        })]
    );
}

#[test]
fn check_of_an_unknown_container_is_code_3() {
    let agent = FakeAgent::failing(AgentError::UnknownContainer {
        container_id: CONTAINER.into(),
    });
    let out = run(&env("CHECK"), &conf("1.0.0", Some(prev_100())), &agent);
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":3,"msg":"node agent does not know container f00dcafe01","details":"agentSocket /var/run/ringway/cni/cni.sock"}"#
    );
}

#[test]
fn check_with_agent_unavailable_is_code_11() {
    let agent = FakeAgent::unavailable("timeout");
    let out = run(&env("CHECK"), &conf("1.0.0", Some(prev_100())), &agent);
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["code"], 11);
}

#[test]
fn check_needs_0_4_0_and_a_prev_result() {
    let out = run(
        &env("CHECK"),
        &conf("0.3.1", Some(prev_100())),
        &FakeAgent::new(),
    );
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"0.3.1","code":1,"msg":"config version 0.3.1 does not allow CHECK (needs 0.4.0 or later)","details":""}"#
    );
    let out = run(&env("CHECK"), &conf("1.0.0", None), &FakeAgent::new());
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["code"], 7);
}

#[test]
fn check_of_pass_through_pods_does_not_call_the_agent() {
    let agent = FakeAgent::unavailable("down");
    let e = env_with("CHECK", &[("CNI_ARGS", Some("IgnoreUnknown=1"))]);
    ok(&run(&e, &conf("1.0.0", Some(prev_100())), &agent));
    assert!(agent.calls().is_empty());
}

// ------------------------------------------------------------- STATUS

#[test]
fn status_ok_when_the_agent_is_ready() {
    let agent = FakeAgent::new();
    let e: HashMap<String, String> = [("CNI_COMMAND".to_owned(), "STATUS".to_owned())].into();
    let out = run(&e, &conf("1.1.0", None), &agent);
    assert_eq!(ok(&out), "");
    assert_eq!(
        agent.calls(),
        [Call::Status(StatusRequest {
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            network: "k8s-pod-network".into(),
        })]
    );
}

#[test]
fn status_is_code_50_when_the_agent_is_unreachable() {
    let agent = FakeAgent::unavailable("connect: no such file or directory");
    let out = run(&env("STATUS"), &conf("1.1.0", None), &agent);
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.1.0","code":50,"msg":"plugin not available: node agent unavailable: connect: no such file or directory","details":"agentSocket /var/run/ringway/cni/cni.sock"}"#
    );
}

#[test]
fn status_needs_1_1_0() {
    let out = run(&env("STATUS"), &conf("1.0.0", None), &FakeAgent::new());
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.0.0","code":1,"msg":"config version 1.0.0 does not allow STATUS (needs 1.1.0 or later)","details":""}"#
    );
}

// ----------------------------------------------------------------- GC

fn gc_conf(extra: Value) -> Vec<u8> {
    let mut c: Value = serde_json::from_slice(&conf("1.1.0", None)).unwrap();
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c.to_string().into_bytes()
}

#[test]
fn gc_hands_both_attachment_lists_to_the_agent() {
    let agent = FakeAgent::new();
    let e: HashMap<String, String> = [
        ("CNI_COMMAND".to_owned(), "GC".to_owned()),
        ("CNI_PATH".to_owned(), "/opt/cni/bin".to_owned()),
    ]
    .into();
    let c = gc_conf(json!({
        "cni.dev/valid-attachments": [{"containerID": "b", "ifname": "eth0"}],
        "cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}, {"containerID": "b", "ifname": "eth0"}]
    }));
    assert_eq!(ok(&run(&e, &c, &agent)), "");
    let att = |id: &str| Attachment {
        container_id: id.into(),
        ifname: "eth0".into(),
    };
    assert_eq!(
        agent.calls(),
        [Call::Gc(GcRequest {
            agent_socket: PathBuf::from(DEFAULT_AGENT_SOCKET),
            network: "k8s-pod-network".into(),
            valid_attachments: vec![att("a"), att("b")],
        })]
    );
}

#[test]
fn gc_with_an_empty_list_is_passed_on() {
    let agent = FakeAgent::new();
    ok(&run(
        &env("GC"),
        &gc_conf(json!({"cni.dev/valid-attachments": []})),
        &agent,
    ));
    let Call::Gc(req) = &agent.calls()[0] else {
        panic!("expected gc")
    };
    assert!(req.valid_attachments.is_empty());
}

#[test]
fn gc_without_a_list_is_refused() {
    let agent = FakeAgent::new();
    let out = run(&env("GC"), &gc_conf(json!({})), &agent);
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.1.0","code":7,"msg":"GC needs \"cni.dev/valid-attachments\" in the network config","details":""}"#
    );
    assert!(agent.calls().is_empty());
}

#[test]
fn gc_does_nothing_when_disabled() {
    let agent = FakeAgent::new();
    let c = gc_conf(json!({"disableGC": true, "cni.dev/valid-attachments": []}));
    ok(&run(&env("GC"), &c, &agent));
    assert!(agent.calls().is_empty());
}

#[test]
fn gc_with_agent_unavailable_is_code_11_and_needs_1_1_0() {
    let c = gc_conf(json!({"cni.dev/valid-attachments": []}));
    let out = run(&env("GC"), &c, &FakeAgent::unavailable("down"));
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["code"], 11);

    let out = run(&env("GC"), &conf("1.0.0", None), &FakeAgent::new());
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["code"], 1);
    assert_eq!(
        v["msg"],
        "config version 1.0.0 does not allow GC (needs 1.1.0 or later)"
    );
}

#[test]
fn gc_needs_cni_path() {
    let out = run(
        &env_with("GC", &[("CNI_PATH", None)]),
        &gc_conf(json!({"cni.dev/valid-attachments": []})),
        &FakeAgent::new(),
    );
    let v: Value = serde_json::from_str(failed(&out)).unwrap();
    assert_eq!(v["code"], 4);
    assert_eq!(
        v["msg"],
        "required environment variable CNI_PATH is not set or empty (needed for GC)"
    );
}

// ------------------------------------------------------------ VERSION

#[test]
fn version_echoes_the_config_version() {
    let e: HashMap<String, String> = [("CNI_COMMAND".to_owned(), "VERSION".to_owned())].into();
    for v in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"] {
        let out = run(
            &e,
            format!(r#"{{"cniVersion":"{v}"}}"#).as_bytes(),
            &FakeAgent::new(),
        );
        assert_eq!(
            ok(&out),
            format!(
                r#"{{"cniVersion":"{v}","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}}"#
            )
        );
    }
}

#[test]
fn version_answers_at_latest_when_it_cannot_echo() {
    let e: HashMap<String, String> = [("CNI_COMMAND".to_owned(), "VERSION".to_owned())].into();
    let latest =
        r#"{"cniVersion":"1.1.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#;
    for stdin in [&b""[..], b"  \n", br#"{"cniVersion":"9.0.0"}"#, b"{}"] {
        assert_eq!(ok(&run(&e, stdin, &FakeAgent::new())), latest);
    }
    let out = run(&e, b"{", &FakeAgent::new());
    assert_eq!(
        failed(&out),
        r#"{"cniVersion":"1.1.0","code":6,"msg":"network config is not valid JSON: EOF while parsing an object at line 1 column 1","details":""}"#
    );
}

#[test]
fn version_ignores_the_other_variables() {
    let e = env_with(
        "VERSION",
        &[
            ("CNI_ARGS", Some("garbage")),
            ("CNI_IFNAME", Some("bad/name")),
        ],
    );
    ok(&run(&e, &conf("1.0.0", None), &FakeAgent::new()));
}

// -------------------------------------------------------------- misc

#[test]
fn capture_target_decisions() {
    let c = NetConf::parse(&conf("1.0.0", None)).unwrap();
    let args = |s: &str| CniArgs::parse(s).unwrap();
    assert_eq!(
        capture_target(&args("K8S_POD_NAMESPACE=shop;K8S_POD_NAME=a"), &c).map(|p| p.to_string()),
        Ok("shop/a".to_owned())
    );
    assert_eq!(
        capture_target(&args("K8S_POD_NAMESPACE=ringway-system;K8S_POD_NAME=a"), &c),
        Err(PassThrough::ExcludedNamespace("ringway-system".into()))
    );
    assert_eq!(capture_target(&args(""), &c), Err(PassThrough::NotAPod));
    assert_eq!(
        PassThrough::ExcludedNamespace("x".into()).to_string(),
        r#"namespace "x" is in excludeNamespaces"#
    );
}
