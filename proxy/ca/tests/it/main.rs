//! The integration tests of ringway-ca: one test binary (`cargo test -p
//! ringway-ca --test it`). `ca_service`: who gets which certificate, limits,
//! the TokenReview client, the gRPC transport over TLS. Waits and scratch
//! directories are the test bed's (`ringway_testbed::{wait_for, TempDir}`).

mod ca_service;
