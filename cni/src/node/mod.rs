//! The node agent: enrolls pods (capture rules + handoff to the node proxy over
//! ZDS), serves the CNI plugin's event socket, and survives its own restart
//! without touching traffic.
//!
//! Control plane only: blocking std threads, no async runtime.
//!
//! | thread | owns |
//! | --- | --- |
//! | `ringway-zds-accept` | the ZDS listener (`zds_socket`, SOCK_SEQPACKET, mode 0600; peers checked against `peer_uids` with SO_PEERCRED; at most [`MAX_ZDS_CONNECTIONS`]) |
//! | `ringway-zds-<n>` (one per proxy connection) | hello, snapshot, catch-up, then an idle watch for hang-ups |
//! | `ringway-cni-accept` | the CNI event socket (`cni_socket`, unix stream, mode 0600; peers checked against `peer_uids` before a byte is read) |
//! | `ringway-cni` (one per request, at most [`MAX_CNI_HANDLERS`]) | one request line, one response line |
//! | `ringway-reconcile` | every `reconcile_interval`: releases the netns of pods whose namespace is gone; verifies every held pod's capture and re-applies what drifted |
//!
//! Rule programming runs on short-lived threads inside the pod's netns
//! (`ringway-redirect`); the caller never moves.
//!
//! # Which pods: the selection rule
//! One rule decides for the CNI ADD and the Kubernetes watch ([`Selection`],
//! [`AgentConfig::selection`]): pods of `exclude_namespaces` never; then, with
//! [`Selection::All`] (no cluster: the sandbox, tests) every other pod, with
//! [`Selection::Kubernetes`] the pods [`crate::kube::decide`] wants (label
//! `ringway.io/dataplane-mode=enabled` or `istio.io/dataplane-mode=ambient` on
//! the pod or its namespace, pod label `ringway.io/dataplane-mode=disabled` or
//! `istio.io/dataplane-mode=none` opts out and wins over any enrollment, never
//! hostNetwork: [`ringway_config::enrollment`]), answered from the watch's caches or,
//! for a pod the watch has not seen yet, from the API server
//! ([`crate::kube::Selector`]). A CNI ADD for a pod the rule passes over answers
//! `{"ok":true,"passThrough":"<why>"}`: no rules, no `Add` to the proxy, and the
//! plugin prints `prevResult` back. When the API server cannot be read the ADD
//! is "try again later" (code 11): see [`crate::kube`] for why it does not guess.
//! The watch applies the same rule, so it never unenrolls a pod the ADD captured
//! and enrolls the wanted pods the ADD did not see (running before the agent).
//! A CHECK for a pod the agent does not hold succeeds when the rule passes over
//! it.
//!
//! # The pod's identity
//! CNI passes a pod's namespace, name and uid, never its service account,
//! and the agent never guesses one: the first `Add` a proxy gets must carry
//! the pod's real identity (a proxy may keep the first `Add` of a netns and
//! ignore later ones). The CNI ADD takes it from [`Selection::select`]:
//! with [`Selection::Kubernetes`] from the watch's cache or the API server,
//! only for the pod of that uid (or the mirror pod of that static pod); a pod
//! the API server does not know under that uid is "try again later". With
//! [`Selection::All`] (no API) from [`AgentConfig::service_accounts`]
//! (`--pod-service-account NS=SA` or `NS/POD=SA`); a pod no rule covers is
//! refused. A request that names another service account than the one found
//! is refused, and [`Enrollment::enroll`] refuses a pod without one.
//!
//! A request without a uid (the runtime gave no `K8S_POD_UID`) is matched by
//! name instead: the pod held with that sandbox under that namespace and
//! name, else with [`Selection::Kubernetes`] the API server's pod of that
//! name when it is on this node and not being deleted
//! ([`crate::kube::Selector::select_by_name`]); where none counts, the
//! namespace decides, and a pod of a captured one is "try again later".
//! The residual risk: a pod force-deleted and re-created under its name on
//! this node while the old sandbox's ADD is retried is taken for the new one.
//! Whatever gave the uid, [`Enrollment::enroll`] refuses one held for
//! another namespace or name: one uid is one pod.
//!
//! # Enrollment
//! [`Enrollment::enroll`] (CNI ADD, and the Kubernetes watch) refuses bad
//! input (an empty uid, name, namespace or service account) and the host's netns, fails fast with [`EnrollError::NoProxy`] when
//! no proxy is ready, applies the capture rules tagged with the pod's identity
//! ([`ringway_redirect::apply_for`]), records the pod (pinning its netns with
//! an open fd), and sends `Add` with the netns fd to the newest ready proxy,
//! waiting up to [`ACK_TIMEOUT`] for its ack. If that proxy's connection
//! breaks, the next newest is tried. On a nack or with no proxy left, a pod
//! that was new is rolled back (forgotten, `Del` to the proxy that nacked,
//! rules removed), so a failed ADD leaves nothing behind; a repeated enroll
//! of an already enrolled pod (same netns) keeps it. A new netns for a known
//! UID (a re-created sandbox) replaces the old one. With a proxy ready, a
//! pod held with one of the new pod's addresses whose netns is gone (its
//! DEL was missed) is unenrolled before the new pod's own work; one whose
//! netns is live is left, and the proxy refuses the second claim on the
//! address.
//!
//! [`Enrollment::unenroll`] (CNI DEL, the watch) forgets the pod, sends `Del`
//! to every ready proxy (acks awaited with [`ACK_TIMEOUT`]; a nack is
//! logged), removes the rules when the agent still holds the netns, and
//! releases it. Unknown UIDs are fine.
//!
//! # The `ambient.istio.io/redirection` annotation
//! With an [`AgentConfig::annotator`] (`--kube`), a successful enroll asks
//! for `ambient.istio.io/redirection: enabled` on the pod (after its rules
//! are in place and the proxy acked it), and an unenroll, or a failed
//! re-enroll that drops a pod the agent held, for its removal, as the Istio
//! ambient mesh's CNI agent does (its control plane and sidecars read it).
//! The request is queued and patched on the Kubernetes runtime, retried with
//! backoff: it never blocks or fails the CNI ADD. The watch reports the pods
//! whose annotation disagrees with what the agent holds
//! ([`crate::kube::Enrollment::annotation_seen`]), so it is repaired after a
//! restart.
//!
//! # ZDS, per proxy connection
//! Hello within 5 s (else the connection is closed), then the snapshot: `Add`
//! with the netns fd for every pod whose netns is held, `Keep` for pods known
//! without one, each acked before the next, then `SnapshotSent` (acked too).
//! Changes made while the snapshot was on the wire are sent next (`Add`/`Del`),
//! and only then does the connection become *ready*: eligible for new `Add`s
//! and counted by STATUS. `Add` goes to the newest ready connection, `Del` to
//! all of them. 5 s read/write deadlines; a deadline, a hang-up (seen on use,
//! or while idle by a poll: POLLHUP, or POLLIN with a zero-length read for a
//! half-close), an unsolicited packet or anything that is not the protocol
//! closes that connection only.
//!
//! # Restart
//! The agent records every pod it enrolls in its state file
//! ([`AgentConfig::state_file`], a journal appended to after every enroll and
//! unenroll), on the node where pods cannot write. [`NodeAgent::start`] first
//! rebuilds the pods from the kernel and that record: it scans
//! `proc_root/*/ns/net` and `netns_dirs`, dedupes by namespace inode, skips
//! the agent's own and the host's namespace, and adopts a namespace whose
//! `inet ringway` table carries an owner tag ([`ringway_redirect::read_tag`])
//! for this node only when the record holds that pod UID *with that
//! namespace inode* and the tag agrees with the record on namespace, name,
//! service account, sandbox id and IPs. The owner tag is pod-writable (a
//! container with CAP_NET_ADMIN in its own netns rewrites it): it is a hint,
//! the pod's identity comes from the record; a tag that cannot be read (or
//! asks for more than [`ringway_redirect::MAX_PIECES`] pieces) is skipped,
//! never a crash. Each adopted pod's rules are verified; only on drift are
//! they re-applied (an atomic table replacement that keeps connections).
//! Rediscovery never removes rules; the record is then rewritten with the
//! adopted pods. The first proxy to connect gets the full snapshot. With no
//! usable record (unreadable, or gone), nothing is adopted, and the pods
//! this node's tags name are sent as `Keep` (never an identity), written
//! beside the record (`<state file>.kept`) to be kept again at the next
//! start, until each is enrolled, unenrolled (CNI DEL or the watch), or its
//! namespaces are gone.
//!
//! # Gone namespaces
//! A pod's namespace is *live* while a process is in it, it is mounted in one
//! of `netns_dirs`, or the path it was enrolled with still names it. Before
//! every snapshot and every `reconcile_interval`, the agent releases the fd
//! of a pod whose namespace is no longer live (the namespace can then be
//! freed); the pod stays known and is sent as `Keep` until it is unenrolled.
//!
//! # CNI event socket
//! One JSON request line, one JSON response line ([`protocol`]); the plugin's
//! side is [`UnixAgent`].
//!
//! # The Kubernetes watch
//! [`Enroller`] also implements [`crate::kube::Enrollment`], the trait the
//! watch calls with a pod's identity only: the agent uses the namespace it
//! already holds for the UID, else finds it among the processes whose
//! `<proc_root>/<pid>/cgroup` names the UID (oldest first, never the host's
//! namespace, confirmed by one of the pod's IPs). The watch calls it again for
//! a held pod whose identity differs from the one the agent holds (e.g. a
//! file-mode rule that disagrees with the API server): the agent re-tags the rules
//! (an atomic replacement that keeps connections) and re-sends `Add` with the
//! full `WorkloadInfo` for the same netns.
//!
//! # Layers
//! One owner of the state, leaf services that receive what they need; each
//! module uses only those listed before it:
//! - leaves: `error`, `locks`, `lifecycle` (shutdown, workers, socket files),
//!   `pod` (the pod model, the owner tag), `accounts`, `record` (the state
//!   file), `netns` (namespace scans, finding a pod's namespace), `metrics`,
//!   [`protocol`], [`legacy`];
//! - `config` ([`AgentConfig`], [`Selection`], the limits), `sockets` (socket
//!   files, peer checks), `proxy_conn` (one proxy connection and its
//!   requests), `client` ([`UnixAgent`], the plugin's side);
//! - `table` (the pods and connections kept under one lock, no I/O),
//!   `discover` (rediscovery at start: returns what it found);
//! - `zds_server` and `cni_server`: the servers, each reaching the pods
//!   through a narrow trait of its own (`Proxies`, `Pods`);
//! - `state`: `Core`, the owner of the state, which implements those traits
//!   (and the metrics' pod count) and adopts what rediscovery found;
//! - `handle` ([`NodeAgent`], [`AgentHandle`], [`Enroller`]) and
//!   `kube_bridge` (the Kubernetes watch's [`crate::kube::Enrollment`]) on top;
//! - this module is a facade: its docs and re-exports, no code.

mod accounts;
mod client;
mod cni_server;
mod config;
mod discover;
mod error;
mod handle;
mod kube_bridge;
pub mod legacy;
mod lifecycle;
mod locks;
pub mod metrics;
mod netns;
mod pod;
pub mod protocol;
mod proxy_conn;
mod record;
mod sockets;
mod state;
mod table;
mod zds_server;

pub use accounts::{service_account_of, ServiceAccountRule, ServiceAccountRuleError};
pub use client::UnixAgent;
pub use config::{
    AgentConfig, Selection, ACK_TIMEOUT, CNI_IO_TIMEOUT, DEFAULT_NETNS_DIR, DEFAULT_STATE_FILE,
    MAX_CNI_HANDLERS, MAX_ZDS_CONNECTIONS,
};
pub use error::{EnrollError, StartError, Unhealthy};
pub use handle::{AgentHandle, Enroller, Enrollment, NodeAgent};
pub use netns::FindNetnsError;
pub use pod::{Pod, PodSource, PodStatus, ProxyStatus, Rediscovery};
pub use record::{InvalidRecord, RecordError, RecordedPod, MAX_RECORD_BYTES};
