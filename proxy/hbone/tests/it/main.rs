//! The integration tests of ringway-hbone: one test binary (`cargo test -p
//! ringway-hbone --test it`), each area a module (`hbone_server`,
//! `hbone_pool`, `hbone_stream`, `hbone_limits`, `hbone_tls`,
//! `hbone_memory`), sharing `support` (an HBONE server on loopback and a
//! backend the test drives, in-process).
//!
//! `hbone_memory` prints the process's RSS per idle stream: a figure to
//! read with it running alone (`-- hbone_memory:: --nocapture`), since the
//! other modules' tests share the process when the whole binary runs.

mod hbone_limits;
mod hbone_memory;
mod hbone_pool;
mod hbone_server;
mod hbone_stream;
mod hbone_tls;
mod support;
