//! One scenario, one round: a fresh start of what carries its traffic, then
//! throughput (one stream and N), latency at a fixed rate, the connection
//! rate and the proxies' memory with idle connections open, with the
//! proxies' CPU over each; then the proxies' memory after all that load and
//! a quiet period; last, a check that the traffic took the path the
//! scenario says (mutual TLS for HBONE, plaintext otherwise).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;

use super::set_latency;
use crate::bed::{self, next_port, Bed, Proxies};
use crate::child::{proc_fd_count, proc_fd_kinds};
use crate::config::Config;
use crate::figures::{Datapath, Figures};
use crate::host::{progress, FdLimit};
use crate::load;
use crate::scenario::{Kind, Scenario};

/// What one scenario gave in one round: its figures, the measurements that
/// failed (with the proxy's last log lines), and notes for the reader.
#[derive(Debug, Default)]
pub struct Measured {
    /// The figures measured.
    pub figures: Figures<Datapath>,
    /// Failed measurements.
    pub errors: Vec<String>,
    /// Notes (e.g. connections that failed).
    pub notes: Vec<String>,
}

/// Runs every measurement of scenario `sc` once. A failed measurement is
/// recorded and the others still run; only a scenario that cannot start is
/// an error.
pub fn run(
    config: &Config,
    limit: &FdLimit,
    bed: &Bed,
    sc: &Scenario,
    port: &mut u16,
) -> anyhow::Result<Measured> {
    let mut f = Figures::new();
    let (path, proxies) = bed::start(config, bed, sc)?;
    let proxied = !proxies.0.is_empty();
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    // A failed measurement is recorded (with the proxy's last log lines) and
    // the others still run: the report shows the hole and why.
    let mut record = |what: &str, r: anyhow::Result<()>, p: &Proxies| {
        if let Err(e) = r {
            let tail = p.log_tail();
            progress(format!("  {what} failed: {e:#}"));
            errors.push(if tail.is_empty() {
                format!("{what}: {e:#}")
            } else {
                format!("{what}: {e:#}; proxy log: {}", tail.replace('\n', " / "))
            });
        }
    };
    let mut rss_anon_idle = None;
    let mut held_idle = None;
    if proxied {
        std::thread::sleep(config.settle);
        f.set(
            Datapath::RssIdleMib,
            proxies.rss_kib().unwrap_or(f64::NAN) / 1024.0,
        );
        rss_anon_idle = proxies.rss_anon_kib();
        held_idle = held_mib(sc, &proxies);
    }
    // Idle connections: proxy RSS with each count open, measured first, on
    // the fresh proxy: after the throughput runs the memory their buffers
    // freed stays resident in the workers' heaps (glibc keeps up to 16 MiB
    // free per heap, `sys::keep_heap_pages`), and idle connections allocated
    // from it hardly moved RSS (0.03-2 KiB per HBONE connection where a
    // fresh proxy grows 6.7; benches/HISTORY.md, 2026-12-04). The small count
    // also tells how many fds an idle connection holds in each proxy, which
    // bounds the large count under the fd limit.
    let mut large = config.idle[1];
    for (is_large, asked) in [(false, config.idle[0]), (true, config.idle[1])] {
        let r = (|| {
            // Let the proxy finish closing the previous run's sockets so
            // "before" is its idle state again.
            std::thread::sleep(config.settle);
            let n = if is_large { large } else { asked };
            let before = proxies.rss_kib();
            let fds_before: Vec<usize> = proxies.0.iter().map(|p| p.fds()).collect();
            let gen_before = proc_fd_count(std::process::id());
            let kinds_before: Vec<_> = proxies.0.iter().map(|p| proc_fd_kinds(p.pid)).collect();
            let idle = load::open_idle(&path.on_port(next_port(port)), n)?;
            std::thread::sleep(config.settle);
            if std::env::var_os("RINGWAY_BENCH_FD_DUMP").is_some() {
                for (p, b) in proxies.0.iter().zip(&kinds_before) {
                    progress(format!(
                        "  fds of {} with {n} idle: {:?} (before: {b:?})",
                        p.pid,
                        proc_fd_kinds(p.pid)
                    ));
                }
            }
            if let (Some(rss), Some(before)) = (proxies.rss_kib(), before) {
                let per = (rss - before) / idle.len() as f64;
                if is_large {
                    f.set(Datapath::RssLargeMib, rss / 1024.0);
                    f.set(Datapath::KibPerIdleConn, per);
                    let est = if idle.len() >= config.idle_target {
                        rss
                    } else {
                        before + per * config.idle_target as f64
                    };
                    f.set(Datapath::RssTargetIdleMib, est / 1024.0);
                } else {
                    f.set(Datapath::RssSmallMib, rss / 1024.0);
                }
            }
            if is_large {
                f.set(Datapath::IdleLargeN, idle.len() as f64);
            } else {
                // fds each process holds per idle connection; the large count
                // is what the tightest process can hold under the limit.
                let margin = 600u64;
                let soft = limit.soft;
                let mut cap = soft.saturating_sub(gen_before as u64 + margin) / 2;
                let mut per_conn_total = 0.0;
                for (p, b) in proxies.0.iter().zip(&fds_before) {
                    let per = (p.fds().saturating_sub(*b) as f64 / n.max(1) as f64).max(1.0);
                    per_conn_total += per;
                    cap = cap.min((soft.saturating_sub(*b as u64 + margin) as f64 / per) as u64);
                }
                if sc.kind == Kind::Haproxy {
                    cap = cap.min(bed::haproxy_maxconn().saturating_sub(100) as u64);
                }
                if proxied {
                    f.set(Datapath::FdsPerIdleConn, per_conn_total);
                }
                let cap = (cap / 100 * 100) as usize;
                if cap < config.idle[1] {
                    large = cap.max(n);
                }
            }
            drop(idle);
            Ok(())
        })();
        record(&format!("{asked} idle connections"), r, &proxies);
    }
    // Throughput, one stream and N.
    for (streams, tput, cpu) in [
        (1, Datapath::Tput1Gbps, Datapath::CpuSPerGb),
        (config.streams, Datapath::TputNGbps, Datapath::CpuSPerGbN),
    ] {
        let r = (|| {
            let c0 = proxies.cpu();
            let t = load::throughput(
                &path.on_port(next_port(port)),
                streams,
                Duration::from_secs_f64(config.secs),
            )?;
            let gb = t.bytes as f64 / 1e9;
            f.set(tput, t.gbps());
            if tput == Datapath::Tput1Gbps {
                f.set(Datapath::GenCpuSPerGb, t.gen_cpu / gb);
            }
            if let (Some(c0), Some(c1)) = (c0, proxies.cpu()) {
                f.set(cpu, (c1 - c0) / gb);
            }
            Ok(())
        })();
        record(&format!("throughput, {streams} stream(s)"), r, &proxies);
    }
    // Latency at a fixed rate.
    let r = (|| {
        let c0 = proxies.cpu();
        let l = load::latency(
            &path.on_port(next_port(port)),
            config.rps,
            config.lat_conns,
            Duration::from_secs_f64(config.lat_secs),
        )?;
        set_latency(&mut f, Datapath::LATENCY, &l);
        f.set(
            Datapath::GenLateP99Us,
            l.lateness.value_at_quantile(0.99) as f64 / 1e3,
        );
        f.set(Datapath::LatRps, l.requests as f64 / l.secs);
        if let (Some(c0), Some(c1)) = (c0, proxies.cpu()) {
            f.set(
                Datapath::CpuSPer1kReq,
                (c1 - c0) / (l.requests as f64 / 1e3),
            );
        }
        Ok(())
    })();
    record("latency", r, &proxies);
    // Connection rate.
    let r = (|| {
        let c0 = proxies.cpu();
        let cr = load::conn_rate(
            &path.on_port(next_port(port)),
            config.conn_threads,
            Duration::from_secs_f64(config.conn_secs),
            config.conn_max,
        )?;
        f.set(Datapath::ConnPerS, cr.conns as f64 / cr.secs);
        f.set(Datapath::ConnFailures, cr.failures as f64);
        if let Some(e) = cr.first_error {
            notes.push(format!(
                "{}: {} of {} connections failed, first: {e}",
                sc.name,
                cr.failures,
                cr.failures + cr.conns
            ));
        }
        if let (Some(c0), Some(c1)) = (c0, proxies.cpu()) {
            f.set(Datapath::CpuUsPerConn, (c1 - c0) / cr.conns as f64 * 1e6);
        }
        Ok(())
    })();
    record("connection rate", r, &proxies);
    // Memory after the load: every run above is over and its connections
    // closed; after a quiet period the proxy should have given back what
    // the load made it allocate (only the warm pooled tunnels, one per
    // worker and peer, still hold some). Read from /proc only: nothing asks
    // the proxy to give memory back.
    if proxied {
        std::thread::sleep(config.after_load);
        if let Some(rss) = proxies.rss_kib() {
            let after = rss / 1024.0;
            f.set(Datapath::RssAfterLoadMib, after);
            if let Some(idle) = f.get(Datapath::RssIdleMib).filter(|v| v.is_finite()) {
                f.set(Datapath::RssAfterLoadOverIdleMib, after - idle);
            }
        }
        if let (Some(idle), Some(after)) = (rss_anon_idle, proxies.rss_anon_kib()) {
            f.set(
                Datapath::RssAnonAfterLoadOverIdleMib,
                (after - idle) / 1024.0,
            );
        }
        if let (Some(idle), Some(after)) = (held_idle, held_mib(sc, &proxies)) {
            let held = after - idle;
            f.set(Datapath::RssHeldAfterLoadMib, held);
            let rss = |d: Datapath| f.get(d).filter(|v| v.is_finite());
            if let (Some(idle), Some(over)) = (
                rss(Datapath::RssIdleMib),
                rss(Datapath::RssAfterLoadOverIdleMib),
            ) {
                f.set(Datapath::RssRestAfterLoadPct, (over - held) / idle * 100.0);
            }
        }
    }
    // The traffic took the path the scenario says: every connection the
    // client-side proxy opened was mutual TLS with HBONE, none without.
    if let Kind::Ringway { hbone, .. } = sc.kind {
        let metrics = bed::PROXY_METRICS;
        match opened_by_security(metrics) {
            Ok(m) => {
                let mtls = m.get("mutual_tls").copied().unwrap_or(0.0);
                let plain = m.get("none").copied().unwrap_or(0.0);
                let ok = if hbone {
                    mtls > 0.0 && plain == 0.0
                } else {
                    mtls == 0.0 && plain > 0.0
                };
                if !ok {
                    errors.push(format!(
                        "connections opened by security policy, as the client-side proxy reports them: {m:?}; \
                         want {} only",
                        if hbone { "mutual_tls" } else { "none" }
                    ));
                }
            }
            Err(e) => errors.push(format!("{e:#}")),
        }
    }
    let mut proxies = proxies;
    for p in &mut proxies.0 {
        if !p.alive() {
            errors.push(format!(
                "the proxy exited during the scenario: {}",
                p.log_tail()
            ));
        }
        p.stop();
    }
    Ok(Measured {
        figures: f,
        errors,
        notes,
    })
}

/// What a ringway proxy holds, MiB: its heaps' live bytes (from its
/// metrics) plus its file-backed resident pages. `None` for a peer, or
/// with two proxies (the second one's metrics are in another node's
/// namespace).
fn held_mib(sc: &Scenario, proxies: &Proxies) -> Option<f64> {
    if !matches!(sc.kind, Kind::Ringway { .. }) || proxies.0.len() != 1 {
        return None;
    }
    let metrics = bed::PROXY_METRICS;
    let page = bed::scrape(metrics).ok()?;
    let heap = page
        .matching("ringway_heap_in_use_bytes", &[])
        .next()?
        .value;
    let file_kib = proxies.0[0].rss_file_kib();
    file_kib
        .is_finite()
        .then(|| heap / 1048576.0 + file_kib / 1024.0)
}

/// Connections a proxy reported opening as the source side, by
/// `connection_security_policy` (`mutual_tls`, `none`), from its `/metrics`.
fn opened_by_security(metrics: SocketAddr) -> anyhow::Result<BTreeMap<String, f64>> {
    let page = bed::scrape(metrics).context("the proxy's metrics")?;
    let mut m = BTreeMap::new();
    for s in page.matching(
        "istio_tcp_connections_opened_total",
        &["reporter=\"source\""],
    ) {
        let policy = s.label("connection_security_policy").unwrap_or("");
        *m.entry(policy.to_string()).or_insert(0.0) += s.value;
    }
    Ok(m)
}
