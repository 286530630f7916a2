//! The integration tests of ringway-xds: one test binary (`cargo test -p
//! ringway-xds --test it`). The xDS client against the test control plane
//! over real TLS (a CA and serving certificate from `ringway-identity`'s
//! test fixtures), each test in network namespaces of its own
//! (`ringway_testbed::run_isolated`): the protocol as a correct client
//! speaks it (`protocol`), and what a hostile or broken server or
//! environment must not achieve (`adversarial`).

mod adversarial;
mod protocol;
mod support;
