//! Shared pieces of the end-to-end tests: a virtual node whose pods are
//! captured with the production rules and served by an in-process proxy.

#![allow(dead_code)]

use std::os::fd::AsFd;
use std::time::Duration;

use ringway_config::{CaptureMode, Datapath, ProxySettings};
use ringway_proxy::Proxy;
use ringway_testbed::{Pod, VirtualNode};

pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Installs the production capture rules in `pod`.
pub fn capture(pod: &Pod, mode: CaptureMode) {
    let file = match mode {
        CaptureMode::Tproxy => "/tmp/exp/rules.nft",
        CaptureMode::Redirect => "/tmp/exp/rules-redirect.nft",
    };
    pod.netns.exec("nft", &["-f", file]).unwrap();
    for fam in ["-4", "-6"] {
        pod.netns
            .ip(&[
                fam,
                "rule",
                "add",
                "fwmark",
                "0x111/0xfff",
                "lookup",
                "133",
                "priority",
                "100",
            ])
            .unwrap();
    }
    pod.netns
        .ip(&[
            "-4",
            "route",
            "add",
            "local",
            "0.0.0.0/0",
            "dev",
            "lo",
            "table",
            "133",
        ])
        .unwrap();
    pod.netns
        .ip(&[
            "-6", "route", "add", "local", "::/0", "dev", "lo", "table", "133",
        ])
        .unwrap();
    let _ = pod.netns.fd().as_fd();
}

/// Settings for tests: given mode and datapath, two workers.
/// Logs to the test output when RUST_LOG is set.
pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

pub fn settings(mode: CaptureMode, datapath: Datapath) -> ProxySettings {
    ProxySettings {
        capture_mode: mode,
        datapath,
        workers: 2,
        ..ProxySettings::default()
    }
}

/// A virtual node with `pods` pods, all captured and served by one proxy.
pub struct MeshNode {
    pub vn: VirtualNode,
    pub proxy: Proxy,
}

impl MeshNode {
    pub fn new(pods: usize, mode: CaptureMode, datapath: Datapath) -> MeshNode {
        Self::with_settings(pods, settings(mode, datapath))
    }

    pub fn with_settings(pods: usize, settings: ProxySettings) -> MeshNode {
        init_logs();
        let vn = VirtualNode::build(1, pods).unwrap();
        let mode = settings.capture_mode;
        let proxy = Proxy::start(settings).unwrap();
        for p in &vn.pods {
            capture(p, mode);
            proxy.add_pod(&p.name, p.netns.dup_fd().unwrap()).unwrap();
        }
        MeshNode { vn, proxy }
    }

    pub fn pod(&self, i: usize) -> &Pod {
        self.vn.pod(i)
    }
}
