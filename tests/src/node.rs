//! The virtual node: one node namespace holding a bridge, and N pod namespaces
//! joined to it by veth pairs, each pod with an IPv4 and an IPv6 address.
//!
//! Addressing for node `k` (1-based) and pod `i` (0-based):
//! - bridge `br0` in the node netns: `10.244.k.1/24`, `fd00:244:k::1/64`
//! - pod `eth0`: `10.244.k.(i+2)/24`, `fd00:244:k::(i+2)/64`, default routes via the bridge;
//!   no IPv6 link-local address and no router solicitations (see `QUIET_POD_IPV6`)
//!
//! Pods on one node talk over the bridge (layer 2); the node netns holds no
//! capture rules. Everything lives inside the test's own namespaces.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::Error;
use crate::ns::Netns;

/// One pod of a virtual node.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Pod name (also its netns name).
    pub name: String,
    /// The pod's network namespace.
    pub netns: Netns,
    /// The pod's IPv4 address.
    pub ipv4: Ipv4Addr,
    /// The pod's IPv6 address.
    pub ipv6: Ipv6Addr,
    /// Host-side veth name in the node netns.
    pub host_veth: String,
}

/// A process parked in a pod's network namespace (`sleep 600` started with
/// `ip netns exec`), as a pod's pause container would be: it makes the
/// namespace visible at `/proc/<pid>/ns/net`. Killed (by its PID) and reaped
/// on drop.
#[derive(Debug)]
pub struct PauseProcess {
    child: std::process::Child,
}

impl PauseProcess {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `/proc/<pid>/ns/net`.
    pub fn netns_path(&self) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/proc/{}/ns/net", self.pid()))
    }

    /// Kills and reaps the process now.
    pub fn stop(self) {}
}

impl Drop for PauseProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Pod {
    /// Starts a process inside the pod's network namespace and returns once
    /// `/proc/<pid>/ns/net` names that namespace (at most 5 s).
    pub fn start_pause(&self) -> Result<PauseProcess, Error> {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", self.netns.name(), "sleep", "600"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| Error::Io("spawn pause process", e))?;
        let pause = PauseProcess { child };
        let want = self.netns.inode();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let ino = std::fs::metadata(pause.netns_path())
                .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                .unwrap_or(0);
            if ino == want {
                return Ok(pause);
            }
            if std::time::Instant::now() >= deadline {
                return Err(Error::Capacity(
                    "pause process did not enter the pod's namespace within 5s",
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The pod's address in the given family.
    pub fn ip(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.ipv6)
        } else {
            IpAddr::V4(self.ipv4)
        }
    }
}

/// IPv6 settings every pod netns gets before its `eth0` is made: no
/// router solicitations (the pods' routes are static) and no link-local
/// address (so no duplicate address detection for it and no multicast
/// group joined for it). Each frame a pod sends to a multicast group is
/// flooded by the bridge, queued once per port on the kernel's per-CPU
/// input queue: building a node of 200 pods sent about 1,175 such frames
/// (router solicitations, MLD reports), which queued about 136,000
/// packets, and bursts of them overflowed the queue
/// (`netdev_max_backlog`), dropping other pods' packets, ARP replies
/// among them. With these, 411 frames and 44,600 packets remain (the MLD
/// reports for the groups the global addresses need).
const QUIET_POD_IPV6: [(&str, &str); 2] = [
    ("net.ipv6.conf.default.router_solicitations", "0"),
    ("net.ipv6.conf.default.addr_gen_mode", "1"),
];

/// A virtual node: node netns + bridge + pods.
#[derive(Debug)]
pub struct VirtualNode {
    /// Node index `k` (1..=250), used in addresses.
    pub index: u8,
    /// The node's network namespace (holds the bridge).
    pub node: Netns,
    /// Pods created so far.
    pub pods: Vec<Pod>,
    next_pod: u16,
    /// Sandboxes made by [`VirtualNode::replace_pod`] so far (numbers their
    /// names).
    replaced: u16,
}

impl VirtualNode {
    /// Builds node `index` with `pods` pods.
    pub fn build(index: u8, pods: usize) -> Result<VirtualNode, Error> {
        assert!((1..=250).contains(&index), "node index out of range");
        let node = Netns::create(&format!("node{index}"))?;
        node.ip_batch(&[
            "link add br0 type bridge".to_string(),
            format!("addr add 10.244.{index}.1/24 dev br0"),
            format!("addr add fd00:244:{index}::1/64 dev br0 nodad"),
            "link set br0 up".to_string(),
        ])?;
        let mut vn = VirtualNode {
            index,
            node,
            pods: Vec::new(),
            next_pod: 0,
            replaced: 0,
        };
        for _ in 0..pods {
            vn.add_pod()?;
        }
        Ok(vn)
    }

    /// Adds one pod and returns it.
    pub fn add_pod(&mut self) -> Result<Pod, Error> {
        let i = self.next_pod;
        if i >= 250 {
            return Err(Error::Capacity("a virtual node holds at most 250 pods"));
        }
        self.next_pod += 1;
        let pod = self.make_pod(i, format!("n{}-pod{i}", self.index))?;
        self.pods.push(pod.clone());
        Ok(pod)
    }

    /// Removes pod `name` as [`VirtualNode::remove_pod`] does, then makes a
    /// new pod (a new network namespace, veth and name) with its addresses:
    /// a sandbox torn down and the address given to the next one, as the
    /// primary plugin's IPAM does; it takes the old pod's place in
    /// [`VirtualNode::pods`]. The old namespace goes once the caller's clones
    /// of the old pod are dropped.
    pub fn replace_pod(&mut self, name: &str) -> Result<Pod, Error> {
        let pos = self
            .pods
            .iter()
            .position(|p| p.name == name)
            .ok_or(Error::Capacity("no such pod"))?;
        let i = u16::from(self.pods[pos].ipv4.octets()[3]) - 2;
        self.remove_pod(name)?;
        self.replaced += 1;
        let name = format!("n{}-pod{i}r{}", self.index, self.replaced);
        let pod = self.make_pod(i, name)?;
        self.pods.insert(pos, pod.clone());
        Ok(pod)
    }

    /// Pod `i`'s namespace, veth and addresses, under `name`.
    fn make_pod(&self, i: u16, name: String) -> Result<Pod, Error> {
        let k = self.index;
        let netns = Netns::create(&name)?;
        // Before its `eth0` exists, so the device takes these (see
        // `QUIET_POD_IPV6`).
        for (key, value) in QUIET_POD_IPV6 {
            netns.sysctl(key, value)?;
        }
        let host = i + 2;
        let host_veth = format!("veth{i}");
        self.node.ip_batch(&[
            format!(
                "link add {host_veth} type veth peer name eth0 netns {}",
                netns.name()
            ),
            format!("link set {host_veth} master br0 up"),
        ])?;
        netns.ip_batch(&[
            format!("addr add 10.244.{k}.{host}/24 dev eth0"),
            format!("addr add fd00:244:{k}::{host:x}/64 dev eth0 nodad"),
            "link set eth0 up".to_string(),
            format!("route add default via 10.244.{k}.1 dev eth0"),
            format!("route add default via fd00:244:{k}::1 dev eth0"),
        ])?;
        let pod = Pod {
            name,
            netns,
            ipv4: Ipv4Addr::new(10, 244, k, host as u8),
            ipv6: format!("fd00:244:{k}::{host:x}").parse().expect("valid v6"),
            host_veth,
        };
        Ok(pod)
    }

    /// Removes pod `name`: deletes its veth (the pod netns goes when the last fd closes).
    pub fn remove_pod(&mut self, name: &str) -> Result<(), Error> {
        let pos = self
            .pods
            .iter()
            .position(|p| p.name == name)
            .ok_or(Error::Capacity("no such pod"))?;
        let pod = self.pods.remove(pos);
        self.node.ip(&["link", "del", &pod.host_veth])?;
        Ok(())
    }

    /// Pod by index.
    pub fn pod(&self, i: usize) -> &Pod {
        &self.pods[i]
    }
}

/// The link between two virtual nodes made by [`link_nodes`].
#[derive(Debug, Clone)]
pub struct NodeLink {
    /// The veth's name in node `a`'s netns.
    pub a_dev: String,
    /// The veth's name in node `b`'s netns.
    pub b_dev: String,
    /// Node `a`'s address on the link.
    pub a_ipv4: Ipv4Addr,
    /// Node `b`'s address on the link.
    pub b_ipv4: Ipv4Addr,
}

/// Joins two virtual nodes with a veth pair, as two hosts on one wire:
/// `10.<100+a>.<b>.1/30` + `fd00:0:<a>:<b>::1/64` on node `a`, `.2`/`::2` on
/// node `b`; each node routes the other's pod subnets (v4 and v6) via the
/// peer and forwards packets. Pods keep their default route via their bridge.
pub fn link_nodes(a: &VirtualNode, b: &VirtualNode) -> Result<NodeLink, Error> {
    let (ka, kb) = (a.index, b.index);
    assert_ne!(ka, kb, "cannot link a node to itself");
    let a_dev = format!("to-node{kb}");
    let b_dev = format!("to-node{ka}");
    let net4 = format!("10.{}.{kb}", 100 + u16::from(ka));
    let net6 = format!("fd00:0:{ka:x}:{kb:x}");
    a.node.ip_batch(&[format!(
        "link add {a_dev} type veth peer name {b_dev} netns {}",
        b.node.name()
    )])?;
    for (node, dev, me, peer_host, peer_k) in [(a, &a_dev, 1, 2, kb), (b, &b_dev, 2, 1, ka)] {
        node.node.ip_batch(&[
            format!("addr add {net4}.{me}/30 dev {dev}"),
            format!("addr add {net6}::{me}/64 dev {dev} nodad"),
            format!("link set {dev} up"),
            format!("route add 10.244.{peer_k}.0/24 via {net4}.{peer_host} dev {dev}"),
            format!("route add fd00:244:{peer_k}::/64 via {net6}::{peer_host} dev {dev}"),
        ])?;
        node.node.sysctl("net/ipv4/ip_forward", "1")?;
        node.node.sysctl("net/ipv6/conf/all/forwarding", "1")?;
    }
    Ok(NodeLink {
        a_dev,
        b_dev,
        a_ipv4: format!("{net4}.1").parse().expect("valid v4"),
        b_ipv4: format!("{net4}.2").parse().expect("valid v4"),
    })
}
