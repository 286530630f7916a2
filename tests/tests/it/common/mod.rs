//! Shared pieces of the end-to-end tests: a virtual node whose pods are
//! captured with the production rules and served by an in-process proxy.

pub mod hbone;
pub mod sniff;

use std::time::Duration;

use ringway_config::{CaptureMode, Datapath, ProxySettings};
use ringway_proxy::Proxy;
use ringway_testbed::{Pod, VirtualNode};

pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Installs the production capture rules in `pod` (the redirect crate,
/// over netlink, exactly as the node agent does).
pub fn capture(pod: &Pod, mode: CaptureMode) {
    let spec = ringway_proxy::capture_spec(&ProxySettings {
        capture_mode: mode,
        ..ProxySettings::default()
    });
    ringway_redirect::apply(pod.netns.fd(), &spec)
        .unwrap_or_else(|e| panic!("capturing pod {}: {e}", pod.name));
}

pub use ringway_testbed::init_logs;

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

pub use ringway_testbed::wait_until;

/// Asserts that the proxy's `active` gauge drops back to 0 (within 10 s).
pub fn wait_no_active(proxy: &Proxy) {
    assert!(
        wait_until(Duration::from_secs(10), || proxy.stats().active == 0),
        "connections still active: {:?}",
        proxy.stats()
    );
}

/// Like [`MeshNode::with_settings`], but runs `prepare` on every pod after
/// the node is built and *before* its capture rules and the proxy exist.
pub fn mesh_node_prepared(
    pods: usize,
    settings: ProxySettings,
    prepare: impl Fn(&Pod),
) -> MeshNode {
    init_logs();
    let vn = VirtualNode::build(1, pods).unwrap();
    for p in &vn.pods {
        prepare(p);
    }
    let mode = settings.capture_mode;
    let proxy = Proxy::start(settings).unwrap();
    for p in &vn.pods {
        capture(p, mode);
        proxy.add_pod(&p.name, p.netns.dup_fd().unwrap()).unwrap();
    }
    MeshNode { vn, proxy }
}
