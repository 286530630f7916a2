//! The integration tests of ringway-proxy: one test binary (`cargo test -p
//! ringway-proxy --test it`). `uring_fallback`: the datapath falls back to
//! epoll when io_uring is refused (on the test's own thread: a seccomp
//! filter of that thread alone, in namespaces of its own).

mod uring_fallback;
