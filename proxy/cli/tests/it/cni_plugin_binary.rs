//! The CNI plugin binary driven the way a runtime drives it (environment, stdin,
//! exit code, stdout), for what only the binary does: its log file and level,
//! the warning for unknown config keys, and DEL with a config it cannot fully
//! parse. The node agent is absent (its socket path does not exist), which is
//! also what DEL must survive. No network is involved.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::{json, Value};

struct Plugin {
    dir: ringway_testbed::TempDir,
    bin: PathBuf,
}

impl Plugin {
    fn new(name: &str) -> Plugin {
        let dir = ringway_testbed::TempDir::new(&format!("cni-bin-{name}"));
        let bin = dir.join("ringway-cni");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ringway"), &bin).unwrap();
        Plugin { dir, bin }
    }

    fn log(&self) -> PathBuf {
        self.dir.join("cni.log")
    }

    fn agent_socket(&self) -> PathBuf {
        self.dir.join("no-agent-here.sock")
    }

    fn call(&self, command: &str, stdin: &[u8]) -> Output {
        use std::io::Write;
        // A fork outside run_isolated (see `ringway_testbed::exclusive`).
        let _running = ringway_testbed::exclusive::shared();
        let mut child = Command::new(&self.bin)
            .env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", "c0ffee01")
            .env("CNI_NETNS", "/var/run/netns/gone")
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", "/opt/cni/bin")
            .env(
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart;K8S_POD_UID=u-1",
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }
}

fn conf(extra: Value) -> Vec<u8> {
    let mut c = json!({"cniVersion": "1.0.0", "name": "k8s-pod-network", "type": "ringway-cni"});
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c.to_string().into_bytes()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn assert_ok(out: &Output, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{what}: stdout {} stderr {}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn the_plugin_logs_to_its_log_file_at_its_log_level() {
    let p = Plugin::new("logfile");
    let stdin = conf(json!({
        "agentSocket": p.agent_socket(),
        "logFile": p.log(),
        "logLevel": "warn",
    }));
    let out = p.call("DEL", &stdin);
    assert_ok(&out, "DEL without an agent");
    let log = p.log_text();
    assert!(
        log.contains("DEL succeeds without the agent"),
        "the warning is in the log file: {log:?}"
    );
    assert!(
        !text(&out.stderr).contains("DEL succeeds without the agent"),
        "with a logFile the log does not go to stderr"
    );

    // Appended, not truncated; and logLevel error keeps warnings out.
    let before = log.len();
    let quiet = conf(json!({
        "agentSocket": p.agent_socket(),
        "logFile": p.log(),
        "logLevel": "error",
    }));
    assert_ok(&p.call("DEL", &quiet), "DEL at logLevel error");
    let after = p.log_text();
    assert!(after.starts_with(&log), "the log file is appended to");
    assert_eq!(
        after.len(),
        before,
        "nothing below error is logged: {after:?}"
    );
}

#[test]
fn an_unopenable_log_file_falls_back_to_stderr_and_the_call_still_works() {
    let p = Plugin::new("badlog");
    let missing_dir = p.dir.join("no/such/dir/cni.log");
    let out = p.call(
        "DEL",
        &conf(json!({"agentSocket": p.agent_socket(), "logFile": missing_dir})),
    );
    assert_ok(&out, "DEL with an unopenable logFile");
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot open logFile") && err.contains("no/such/dir"),
        "stderr names the log file: {err:?}"
    );
    assert!(err.contains("DEL succeeds without the agent"), "{err:?}");
}

#[test]
fn unknown_keys_are_warned_about_by_name_in_the_log() {
    let p = Plugin::new("unknown");
    let out = p.call(
        "DEL",
        &conf(json!({
            "agentsocket": "/var/run/somewhere/cni.sock",
            "agentSocket": p.agent_socket(),
            "logFile": p.log(),
            "ipam": {"type": "host-local"},
        })),
    );
    assert_ok(&out, "unknown keys are not an error");
    let log = p.log_text();
    assert!(
        log.contains(r#"\"agentsocket\" (did you mean \"agentSocket\"?)"#)
            || log.contains(r#""agentsocket" (did you mean "agentSocket"?)"#),
        "the misspelled key is named: {log:?}"
    );
    assert!(
        !log.contains("\"ipam\""),
        "spec keys are not warned about: {log:?}"
    );
}

#[test]
fn del_with_a_malformed_config_succeeds_and_logs_what_it_could_not_read() {
    let p = Plugin::new("baddel");
    let bad = conf(json!({
        "agentSocket": p.agent_socket(),
        "logFile": p.log(),
        "excludeNamespaces": "kube-system",
    }));
    // ADD refuses it (the runtime shows the error) ...
    let add = p.call("ADD", &bad);
    assert_eq!(add.status.code(), Some(1), "ADD refuses a malformed config");
    let err: Value = serde_json::from_slice(&add.stdout).unwrap();
    assert_eq!(err["code"], 6, "{err}");
    // ... DEL does its best and succeeds, so the chain's other DELs run.
    let del = p.call("DEL", &bad);
    assert_ok(&del, "DEL with a malformed config");
    assert!(del.stdout.is_empty(), "DEL prints nothing on success");
    let log = p.log_text();
    assert!(
        log.contains("cannot be fully read") && log.contains("excludeNamespaces"),
        "the log says what could not be read: {log:?}"
    );
    assert!(
        log.contains(&p.agent_socket().display().to_string()),
        "the agentSocket it could read is used: {log:?}"
    );

    // Not even JSON: still success.
    let garbage = p.call("DEL", b"{\"cniVersion\": ");
    assert_ok(&garbage, "DEL with stdin that is not JSON");
}
