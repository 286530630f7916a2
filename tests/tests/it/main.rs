//! The integration tests of the test bed's crate: the virtual node, the
//! datapath, HBONE, the node agent, the redirect rules and the crate graph,
//! end to end. One test binary (each former test file is a module), so the
//! tree is linked once: `cargo test -p ringway-testbed --test it`, with a
//! module's path as a filter to run one area (`-- datapath_scale::`).
//!
//! The modules share the process. Each privileged test runs in network and
//! mount namespaces of its own (`ringway_testbed::run_isolated`), its
//! scratch files in a directory of its own (`ringway_testbed::TempDir`),
//! its agent under a node name of its own. What the process itself holds
//! (its fd table and fd limit, its CPU time, forked children's copies of
//! its fds) is shared: a test that needs it to itself takes
//! `ringway_testbed::exclusive::alone()` (`datapath_scale`,
//! `tproxy_pitfalls`), and a test that forks outside `run_isolated` takes
//! `exclusive::shared()`. A test that runs itself again in a child process
//! names itself with `ringway_testbed::libtest_name(module_path!(), ..)`.

mod admin_config_dump;
mod agent_cni;
mod agent_kube;
mod agent_proxy_e2e;
mod agent_restart;
mod agent_selection;
mod agent_support;
mod agent_zds;
mod busy_poll;
mod common;
mod connect_timeout;
mod conntrack;
mod crate_graph;
mod datapath_payloads;
mod datapath_scale;
mod datapath_semantics;
mod first_bytes;
mod hbone_e2e;
mod hbone_mesh;
mod hbone_trust;
mod metrics_labels;
mod metrics_scrape;
mod pod_addresses;
mod policy_cluster;
mod policy_local;
mod proxy_bad_input;
mod redirect_owner;
mod redirect_rules;
mod testbed_selftest;
mod tls_failure_reason;
mod tproxy_pitfalls;
mod zds_proxy;
