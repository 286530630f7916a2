//! When io_uring is unavailable (here: blocked by a seccomp filter, as a
//! container runtime's profile would), the proxy falls back to the epoll
//! datapath with one clear log line and still proxies traffic; with
//! `datapath: uring` it refuses to start instead.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ringway_config::{CaptureMode, Datapath, ProxySettings};
use ringway_proxy::{Backend, Proxy, ProxyError};
use ringway_testbed::traffic::{client_exchange, connect, listen, PayloadServer};
use ringway_testbed::{run_isolated, VirtualNode};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn block_io_uring_for_this_thread() {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    #[cfg(target_arch = "x86_64")]
    let arch = TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    let arch = TargetArch::aarch64;
    let filter = SeccompFilter::new(
        [(libc::SYS_io_uring_setup, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .expect("seccomp filter");
    let prog: BpfProgram = filter.try_into().expect("compile filter");
    seccompiler::apply_filter(&prog).expect("apply seccomp filter");
}

#[test]
fn falls_back_to_epoll_when_io_uring_is_blocked() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let dispatch = tracing::dispatcher::get_default(|d| d.clone());
    // The filter applies to this thread and every thread it spawns (the
    // proxy's workers included); other tests' threads are unaffected.
    std::thread::spawn(move || {
        let _g = tracing::dispatcher::set_default(&dispatch);
        block_io_uring_for_this_thread();
        let settings = ProxySettings {
            datapath: Datapath::Uring,
            workers: 1,
            ..ProxySettings::default()
        };
        match Proxy::start(settings) {
            Err(ProxyError::UringUnavailable(e)) => {
                assert_eq!(e.raw_os_error(), Some(libc::EPERM))
            }
            other => panic!("datapath: uring must refuse without io_uring, got {other:?}"),
        }
        run_isolated("falls_back_to_epoll_when_io_uring_is_blocked", || {
            let _g = tracing::dispatcher::set_default(&dispatch);
            let vn = VirtualNode::build(1, 2).unwrap();
            let settings = ProxySettings {
                datapath: Datapath::Auto,
                workers: 1,
                same_node_fast_path: false,
                ..ProxySettings::default()
            };
            let proxy = Proxy::start(settings.clone()).unwrap();
            assert_eq!(proxy.backend(), Backend::Epoll);
            let spec = ringway_proxy::capture_spec(&ProxySettings {
                capture_mode: CaptureMode::Tproxy,
                ..settings
            });
            for p in &vn.pods {
                ringway_redirect::apply(p.netns.fd(), &spec).unwrap();
                proxy.add_pod(&p.name, p.netns.dup_fd().unwrap()).unwrap();
            }
            let (a, b) = (vn.pod(0).clone(), vn.pod(1).clone());
            let addr = SocketAddr::new(b.ip(false), 8080);
            let l = b.netns.run(|| listen(addr)).unwrap();
            let srv = PayloadServer::start(l, 1);
            let got = a
                .netns
                .run(|| client_exchange(connect(addr, Duration::from_secs(10))?, 300_000, 200_000))
                .unwrap();
            assert_eq!(got, 200_000);
            let rep = srv.next_report(Duration::from_secs(10)).unwrap();
            assert_eq!(rep.received.unwrap(), 300_000);
            assert_eq!(rep.peer.ip(), a.ip(false));
            assert_eq!(proxy.stats().accepted, 2, "captured at both ends");
        });
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p));
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let fallback_lines = text
        .lines()
        .filter(|l| l.contains("falling back to the epoll datapath"))
        .count();
    assert_eq!(
        fallback_lines, 1,
        "exactly one clear log line expected:\n{text}"
    );
}
