//! Scrape impact, one round: the default scenario (TPROXY fast path), one
//! proxy, the same fixed-rate latency run twice: alone, and with a scraper
//! hitting `/metrics` (15020) and `/config_dump` (15000) `scrape_rate`
//! times a second. The order alternates with the round. Metrics and admin
//! are served by the control thread, so the workers' latency and CPU should
//! not move.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use ringway_config::CaptureMode;

use super::set_latency;
use crate::bed::{self, next_port, Bed};
use crate::child::{ProxyArgs, ProxyChild};
use crate::config::Config;
use crate::figures::{Figures, Scrape};
use crate::load;
use crate::stat::median;

/// What the scraper did.
struct Scraped {
    scrapes: u64,
    secs: f64,
    metrics_bytes: usize,
    durations_ms: Vec<f64>,
    error: Option<String>,
}

/// Scrapes `GET /metrics` then `GET /config_dump` at `rate` per second until
/// `stop` (and at most `max` times).
fn scraper(
    metrics: SocketAddr,
    admin: SocketAddr,
    rate: f64,
    max: u64,
    stop: Arc<AtomicBool>,
) -> Scraped {
    let interval = Duration::from_secs_f64(1.0 / rate.max(0.1));
    let t0 = Instant::now();
    let mut out = Scraped {
        scrapes: 0,
        secs: 0.0,
        metrics_bytes: 0,
        durations_ms: Vec::new(),
        error: None,
    };
    while !stop.load(Ordering::Relaxed) && out.scrapes < max {
        let at = t0 + interval.mul_f64(out.scrapes as f64);
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        let t = Instant::now();
        match bed::http_get(metrics, "/metrics")
            .and_then(|b| bed::http_get(admin, "/config_dump").map(|_| b))
        {
            Ok(b) => {
                out.metrics_bytes = b.len();
                out.durations_ms.push(t.elapsed().as_secs_f64() * 1e3);
                out.scrapes += 1;
            }
            Err(e) => {
                out.error.get_or_insert_with(|| e.to_string());
                break;
            }
        }
    }
    out.secs = t0.elapsed().as_secs_f64();
    out
}

/// Runs the scrape-impact measurement of `round` on node 1's ringway pods.
pub fn run(
    config: &Config,
    bed: &Bed,
    round: usize,
    port: &mut u16,
) -> anyhow::Result<Figures<Scrape>> {
    let mut f = Figures::new();
    let sc = crate::scenario::by_key("tproxy_fast").expect("the default scenario");
    let (client, server) = bed.pods(&sc);
    bed::capture(&[client, server], CaptureMode::Tproxy)?;
    let args = ProxyArgs::pods(&[bed::pod_arg(client), bed::pod_arg(server)]);
    let host = args.control_host;
    let mut proxy = ProxyChild::start_ringway(
        &config.proxy_bin,
        &bed::ringway_env(CaptureMode::Tproxy, Some(true)),
        &args,
        Duration::from_secs(20),
    )?;
    let metrics = SocketAddr::new(IpAddr::V4(host), 15020);
    let admin = SocketAddr::new(IpAddr::V4(host), 15000);
    let path = Bed::path(client, server);
    // Series to encode: a few hundred connections first.
    load::conn_rate(
        &path.on_port(next_port(port)),
        1,
        Duration::from_millis(300),
        200,
    )?;
    let dur = Duration::from_secs_f64(config.lat_secs);
    let order = if round.is_multiple_of(2) {
        [false, true]
    } else {
        [true, false]
    };
    for with in order {
        let stop = Arc::new(AtomicBool::new(false));
        let scrape = with.then(|| {
            let stop = stop.clone();
            let max = (config.lat_secs * config.scrape_rate).ceil() as u64 + 5;
            let rate = config.scrape_rate;
            std::thread::spawn(move || scraper(metrics, admin, rate, max, stop))
        });
        let (c0, w0) = (
            proxy.thread_cpu_seconds("ringway-control"),
            proxy.thread_cpu_seconds(ringway_proxy::worker::THREAD_PREFIX),
        );
        let l = load::latency(
            &path.on_port(next_port(port)),
            config.rps,
            config.lat_conns,
            dur,
        );
        stop.store(true, Ordering::Relaxed);
        let scraped = scrape.map(|h| h.join().expect("scraper thread"));
        let (c1, w1) = (
            proxy.thread_cpu_seconds("ringway-control"),
            proxy.thread_cpu_seconds(ringway_proxy::worker::THREAD_PREFIX),
        );
        let l = l?;
        let (latency, worker_cpu) = Scrape::side(with);
        set_latency(&mut f, latency, &l);
        f.set(worker_cpu, (w1 - w0) / (l.requests as f64 / 1e3));
        if let Some(s) = scraped {
            if let Some(e) = s.error {
                bail!("scraper: {e}");
            }
            if s.scrapes == 0 {
                bail!("no scrape completed");
            }
            f.set(Scrape::ScrapesPerS, s.scrapes as f64 / s.secs);
            f.set(Scrape::MetricsKib, s.metrics_bytes as f64 / 1024.0);
            f.set(Scrape::ScrapeMsP50, median(&s.durations_ms));
            f.set(
                Scrape::ControlCpuMsPerScrape,
                (c1 - c0) * 1e3 / s.scrapes as f64,
            );
        }
    }
    if !proxy.alive() {
        bail!("the proxy exited: {}", proxy.log_tail());
    }
    proxy.stop();
    Ok(f)
}
