//! The integration tests of the `ringway` binary: the real processes
//! (`ringway proxy`, `ringway agent`, `ringway ca`, the `ringway-cni`
//! plugin, `ringway sandbox`) on virtual nodes, and the offline checks of
//! `deploy/`. One test binary (each former test file is a module), so the
//! tree is linked once: `cargo test -p ringway --test it`, with a module's
//! path as a filter to run one area (`-- csr_e2e::`).
//!
//! The helpers (waiting, HTTP and `/metrics`, scratch directories, the
//! virtual node) are the test bed's (`ringway_testbed`); `support` holds
//! only what is about these processes (a child killed on drop, readiness).
//! Each privileged test runs in namespaces of its own
//! (`ringway_testbed::run_isolated`); a test that needs the process to
//! itself (its fd limit, its forked children) takes
//! `ringway_testbed::exclusive::alone()`.

mod adversarial_agent;
mod ca_cli;
mod cni_plugin_binary;
mod control_slowloris;
mod csr_e2e;
mod deploy;
mod drill_cni;
mod drill_proxy_restart;
mod proxy_pod_flag;
mod proxy_reload;
mod proxy_tcache;
mod sandbox_cli;
mod support;
mod warm_tunnels;
mod xds_e2e;
