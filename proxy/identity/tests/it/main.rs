//! The integration tests of ringway-identity: one test binary (`cargo test
//! -p ringway-identity --test it`), each area a module: the CA, the
//! manager's issuance and renewal (`manager`), and mutual TLS handshakes
//! between the configs it makes (`handshake`), the roots' files followed
//! while running (`bundle_watch`). Scratch directories and
//! waits are the test bed's (`ringway_testbed::{TempDir, wait_for}`).

mod bundle_watch;
mod handshake;
mod manager;
