//! The integration tests of ringway-config: one test binary (`cargo test -p
//! ringway-config --test it`), each area a module. Scratch directories and
//! waits are the test bed's (`ringway_testbed::{TempDir, wait_for}`).

mod file_size_limit;
mod watch_reload;
