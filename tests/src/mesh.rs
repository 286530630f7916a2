//! The mesh configuration's `workloads:` list as the tests, the benches and
//! the sandbox write it (YAML text; they load it with `ringway_config`).

use std::net::IpAddr;

use crate::Pod;

/// One entry of `workloads:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadYaml {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub service_account: String,
    pub ips: Vec<IpAddr>,
    pub node: String,
    /// Speaks HBONE (`tunnel: true`).
    pub tunnel: bool,
    /// `healthy: false` is written only when this is false.
    pub healthy: bool,
}

impl WorkloadYaml {
    /// Test bed pod `pod` (its name, both addresses) as workload `uid` of
    /// `namespace`/`service_account` on `node`; tunnel, healthy.
    pub fn of_pod(
        pod: &Pod,
        uid: &str,
        namespace: &str,
        service_account: &str,
        node: &str,
    ) -> WorkloadYaml {
        WorkloadYaml {
            uid: uid.into(),
            name: pod.name.clone(),
            namespace: namespace.into(),
            service_account: service_account.into(),
            ips: vec![IpAddr::V4(pod.ipv4), IpAddr::V6(pod.ipv6)],
            node: node.into(),
            tunnel: true,
            healthy: true,
        }
    }

    /// The list item, indented for `workloads:`.
    pub fn item(&self) -> String {
        let ips: Vec<String> = self.ips.iter().map(|ip| format!("\"{ip}\"")).collect();
        let mut s = format!(
            "  - uid: {}\n    name: {}\n    namespace: {}\n    serviceAccount: {}\n    ips: [{}]\n    node: {}\n    tunnel: {}\n",
            self.uid,
            self.name,
            self.namespace,
            self.service_account,
            ips.join(", "),
            self.node,
            self.tunnel
        );
        if !self.healthy {
            s.push_str("    healthy: false\n");
        }
        s
    }
}

/// `workloads:` with `ws`.
pub fn workloads_yaml(ws: &[WorkloadYaml]) -> String {
    let mut s = String::from("workloads:\n");
    for w in ws {
        s.push_str(&w.item());
    }
    s
}
