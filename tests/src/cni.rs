//! A CNI call as a container runtime makes it for a chained plugin: the
//! `CNI_*` environment and the network configuration with the primary
//! plugin's result (`prevResult`) on stdin.

use std::path::{Path, PathBuf};

use crate::Pod;

/// A pod as the runtime describes it to the plugin.
#[derive(Debug, Clone)]
pub struct CniPod {
    /// `K8S_POD_UID`.
    pub uid: String,
    /// `K8S_POD_NAME`.
    pub name: String,
    /// `K8S_POD_NAMESPACE`.
    pub namespace: String,
    /// `CNI_CONTAINERID` (the sandbox).
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: PathBuf,
    /// The primary plugin's addresses, CIDR notation.
    pub ips: Vec<String>,
}

impl CniPod {
    /// Test bed pod `pod` as pod `uid` of namespace `shop` (see
    /// [`CniPod::in_namespace`]), sandbox `sandbox-<uid>`, with its IPv4
    /// (/24) and IPv6 (/64) addresses.
    pub fn of(pod: &Pod, uid: &str) -> CniPod {
        CniPod {
            uid: uid.into(),
            name: pod.name.clone(),
            namespace: "shop".into(),
            container_id: format!("sandbox-{uid}"),
            netns: pod.netns.path().to_path_buf(),
            ips: vec![format!("{}/24", pod.ipv4), format!("{}/64", pod.ipv6)],
        }
    }

    /// The same pod in namespace `namespace`.
    pub fn in_namespace(mut self, namespace: &str) -> CniPod {
        self.namespace = namespace.into();
        self
    }

    /// The `CNI_*` variables of `command` (`ADD`, `DEL`, ...), plugins
    /// looked up in `cni_path`.
    pub fn env(&self, command: &str, cni_path: &Path) -> Vec<(String, String)> {
        [
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", self.container_id.clone()),
            ("CNI_NETNS", self.netns.display().to_string()),
            ("CNI_IFNAME", "eth0".to_string()),
            ("CNI_PATH", cni_path.display().to_string()),
            (
                "CNI_ARGS",
                format!(
                    "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};\
                     K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
                    self.namespace, self.name, self.container_id, self.uid
                ),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The chained network configuration for `ringway-cni` (spec
    /// `cni_version`, network `network`, agent at `agent_socket`) with the
    /// primary plugin's result: `eth0` in the pod's netns and its addresses.
    pub fn netconf(&self, cni_version: &str, network: &str, agent_socket: &Path) -> String {
        let ips: Vec<serde_json::Value> = self
            .ips
            .iter()
            .map(|a| serde_json::json!({"address": a, "interface": 0}))
            .collect();
        serde_json::json!({
            "cniVersion": cni_version,
            "name": network,
            "type": "ringway-cni",
            "agentSocket": agent_socket,
            "prevResult": {
                "cniVersion": cni_version,
                "interfaces": [{"name": "eth0", "sandbox": self.netns}],
                "ips": ips,
            }
        })
        .to_string()
    }

    /// Runs the plugin binary `plugin` for `command` as a runtime does
    /// (this pod's `CNI_*` environment only, [`CniPod::netconf`] at CNI
    /// 1.0.0 in network `k8s-pod-network` on stdin), plugins looked up in
    /// `cni_path`; its exit status and output.
    pub fn run_plugin_binary(
        &self,
        plugin: &Path,
        command: &str,
        cni_path: &Path,
        agent_socket: &Path,
    ) -> std::io::Result<std::process::Output> {
        use std::io::Write;
        use std::process::{Command, Stdio};
        let mut child = Command::new(plugin)
            .env_clear()
            .envs(self.env(command, cni_path))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let conf = self.netconf("1.0.0", "k8s-pod-network", agent_socket);
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(conf.as_bytes())?;
        child.wait_with_output()
    }
}
