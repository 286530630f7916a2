//! The scenarios: what carries the traffic (no proxy, ringway in each
//! capture mode with or without HBONE, HAProxy), on one node or between two,
//! and which no-proxy scenario each one's ratios are taken to. A catalogue:
//! it names no other module of the crate; the bed starts them
//! ([`crate::bed`]), the measurements run through them, the report groups
//! them by [`Class`].

use ringway_config::CaptureMode;
use serde::{Deserialize, Serialize};

/// What carries the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No proxy.
    Direct,
    /// ringway, capture rules in both pods.
    Ringway {
        /// TPROXY or REDIRECT.
        mode: CaptureMode,
        /// `sameNodeFastPath`.
        fast_path: bool,
        /// HBONE (mutual TLS + HTTP/2 CONNECT to 15008): the configuration
        /// has a `ca:` and lists both pods as tunnel workloads.
        hbone: bool,
    },
    /// HAProxy in TCP mode in the node netns: one hop, not transparent.
    Haproxy,
}

impl Kind {
    /// What it is, for the targets and the JSON.
    pub fn class(self) -> Class {
        match self {
            Kind::Direct => Class::Direct,
            Kind::Ringway { hbone: false, .. } => Class::Plaintext,
            Kind::Ringway { hbone: true, .. } => Class::Hbone,
            Kind::Haproxy => Class::Peer,
        }
    }

    /// Whether a proxy is in the path (its CPU and memory are figures).
    pub fn proxied(self) -> bool {
        self != Kind::Direct
    }
}

/// A scenario's class: `direct`, ringway `plaintext` or `hbone`, a `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// No proxy.
    Direct,
    /// ringway without HBONE.
    Plaintext,
    /// ringway with HBONE (mutual TLS).
    Hbone,
    /// Another proxy (HAProxy).
    Peer,
}

/// One scenario of the report.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short key (JSON, file names).
    pub key: &'static str,
    /// Row title.
    pub name: &'static str,
    /// What it is.
    pub kind: Kind,
    /// Client on node 1, server on node 2 (one proxy per node), instead of
    /// both pods on node 1.
    pub two_nodes: bool,
    /// The key of the no-proxy scenario its ratios are taken to.
    pub base: &'static str,
}

/// The scenarios, in report order.
pub fn scenarios(with_haproxy: bool) -> Vec<Scenario> {
    let ringway = |mode, fast_path, hbone| Kind::Ringway {
        mode,
        fast_path,
        hbone,
    };
    let one = |key, name, kind| Scenario {
        key,
        name,
        kind,
        two_nodes: false,
        base: "direct",
    };
    let two = |key, name, kind| Scenario {
        key,
        name,
        kind,
        two_nodes: true,
        base: "direct_2node",
    };
    let mut v = vec![
        one("direct", "direct (no proxy)", Kind::Direct),
        one(
            "tproxy_fast",
            "ringway TPROXY, same-node fast path (default, 1 hop)",
            ringway(CaptureMode::Tproxy, true, false),
        ),
        one(
            "tproxy_2hop",
            "ringway TPROXY, both hops",
            ringway(CaptureMode::Tproxy, false, false),
        ),
        one(
            "redirect_2hop",
            "ringway REDIRECT, both hops",
            ringway(CaptureMode::Redirect, false, false),
        ),
        one(
            "hbone_1node",
            "ringway HBONE, one node (fast path off, both hops, mTLS)",
            ringway(CaptureMode::Tproxy, false, true),
        ),
    ];
    if with_haproxy {
        v.push(one(
            "haproxy",
            "HAProxy TCP mode (peer, 1 hop, node netns)",
            Kind::Haproxy,
        ));
    }
    v.extend([
        two("direct_2node", "direct, two nodes (no proxy)", Kind::Direct),
        two(
            "tproxy_2node",
            "ringway TPROXY plaintext, two nodes (2 proxies)",
            ringway(CaptureMode::Tproxy, true, false),
        ),
        two(
            "hbone_2node",
            "ringway HBONE, two nodes (2 proxies, mTLS)",
            ringway(CaptureMode::Tproxy, true, true),
        ),
    ]);
    v
}

/// The scenario of `key` (HAProxy included).
pub fn by_key(key: &str) -> Option<Scenario> {
    scenarios(true).into_iter().find(|s| s.key == key)
}

/// The scenario keys every report must have (HAProxy is optional).
pub const REQUIRED_SCENARIOS: &[&str] = &[
    "direct",
    "tproxy_fast",
    "tproxy_2hop",
    "redirect_2hop",
    "hbone_1node",
    "direct_2node",
    "tproxy_2node",
    "hbone_2node",
];
