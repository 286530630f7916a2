//! The proxy's control endpoints, served by [`ControlServer`]s (the shared
//! control server of `ringway-control`: its own thread and current-thread
//! tokio runtime, never a datapath worker; bounded, see [`ControlLimits`]).
//!
//! | port | path | answer |
//! | --- | --- | --- |
//! | 15021 | `GET /healthz/ready` | 200 `ready` once the node agent's snapshot is applied and no pod is pending; 503 with the reason otherwise |
//! | 15020 | `GET /metrics` | Prometheus text 0.0.4, or OpenMetrics when the `Accept` header asks for `application/openmetrics-text` |
//! | 127.0.0.1:15000 | `GET /config_dump`, `POST /logging?level=` | the admin endpoint ([`admin_handler`]) |
//!
//! Also the idle trim ([`IdleTrim`]): a control-plane thread that gives the
//! heaps' free memory back to the kernel once the proxy has been quiet for
//! a while, never on the datapath workers.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::StatusCode;
use ringway_control::{content_type, encode};
pub use ringway_control::{
    readiness_handler, Answer, ControlLimits, ControlServer, Handler, JSON, TEXT,
};

use crate::metrics::Metrics;
use crate::stats::Stats;

/// The metrics handler.
pub fn metrics_handler(metrics: Arc<Metrics>, stats: Arc<Stats>) -> Handler {
    metrics_handler_with(metrics, stats, |_| {})
}

/// [`metrics_handler`] with more metrics: `extend` registers them (the xDS
/// client's, say) beside the proxy's.
pub fn metrics_handler_with(
    metrics: Arc<Metrics>,
    stats: Arc<Stats>,
    extend: impl FnOnce(&mut prometheus_client::registry::Registry),
) -> Handler {
    let mut registry = metrics.registry();
    extend(&mut registry);
    let registry = Arc::new(registry);
    Arc::new(move |method, path, _, openmetrics| match (method, path) {
        (&hyper::Method::GET, "/metrics") | (&hyper::Method::GET, "/stats/prometheus") => {
            // Derived from the datapath's own counters at scrape time, so
            // the workers count each event once.
            metrics.refresh(&stats);
            let body = encode(&registry, openmetrics);
            (StatusCode::OK, content_type(openmetrics), body)
        }
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

/// Changes the log filter at run time (the binary's logging implements it).
pub type SetLogLevel = Arc<dyn Fn(&str) -> Result<(), LogLevelError> + Send + Sync>;

/// An error of the logging, as the binary's logging library gives it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a [`SetLogLevel`] did not change the log filter. The admin endpoint
/// answers 400 with `bad log filter "<level>": ` and this message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogLevelError {
    /// The filter does not parse: the parser's reason, as it gave it.
    #[error(transparent)]
    Invalid(BoxError),
    /// The filter parsed but the logging could not take it.
    #[error("the logging cannot take a new filter: {0}")]
    Apply(#[source] BoxError),
    /// This process never set its logging up.
    #[error("logging not initialised")]
    NotInitialised,
}

/// The admin handler (bind it to 127.0.0.1:15000 only):
/// `GET /config_dump` (settings, pods with their listeners, counters, and
/// the reference node proxy's `workloads`, `services`, `policies` and
/// `certificates`: [`crate::config_dump`]) and
/// `POST /logging?level=<tracing filter>`.
pub fn admin_handler(proxy: Arc<crate::Proxy>, set_level: SetLogLevel) -> Handler {
    Arc::new(move |method, path, query, _| match (method, path) {
        (&hyper::Method::GET, "/config_dump") => (StatusCode::OK, JSON, config_dump(&proxy)),
        (&hyper::Method::POST, "/logging") => {
            let level = log_filter_of(query);
            if level.is_empty() {
                return (
                    StatusCode::BAD_REQUEST,
                    TEXT,
                    "POST /logging?level=<filter>, e.g. level=debug or level=info,access=debug\n"
                        .into(),
                );
            }
            set_log_level(&level, &set_level)
        }
        (_, path) => (
            StatusCode::NOT_FOUND,
            TEXT,
            format!("no such endpoint: {path}\n"),
        ),
    })
}

/// `POST /logging` with a non-empty `level`: 200 once set, 400 with the
/// reason when not.
fn set_log_level(level: &str, set_level: &SetLogLevel) -> Answer {
    match set_level(level) {
        Ok(()) => (StatusCode::OK, TEXT, format!("log level: {level}\n")),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            TEXT,
            format!("bad log filter {level:?}: {e}\n"),
        ),
    }
}

/// The `level` of a `/logging` query string, decoded as
/// `application/x-www-form-urlencoded` (`%XX` escapes, `+` for a space; a
/// malformed escape is kept as it came, bytes that are not UTF-8 become
/// U+FFFD); the first one when several are given, empty when none is.
fn log_filter_of(query: &str) -> String {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "level")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

fn config_dump(proxy: &crate::Proxy) -> String {
    let pods: Vec<serde_json::Value> = proxy
        .pods()
        .into_iter()
        .map(|p| {
            serde_json::json!({
                "uid": p.uid,
                "name": p.identity.name,
                "namespace": p.identity.namespace,
                "serviceAccount": p.identity.service_account,
                "ips": p.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "netnsInode": p.netns_inode,
                "listeners": p.listeners.iter().map(|(k, a)| format!("{k} {a}")).collect::<Vec<_>>(),
                "authorizedFlows": p.authorized_flows,
            })
        })
        .collect();
    let st = proxy.stats();
    let mesh = proxy.mesh().map(|m| {
        serde_json::json!({
            "origin": m.origin(),
            "revision": format!("{:016x}", m.revision()),
            "trustDomain": m.trust_domain(),
            "workloads": m.workloads().map(|w| serde_json::json!({
                "uid": w.uid,
                "name": w.name,
                "namespace": w.namespace,
                "serviceAccount": w.service_account,
                "ips": w.ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "node": w.node,
                "tunnel": w.tunnel,
                "healthy": w.healthy,
            })).collect::<Vec<_>>(),
            "services": m.services().map(|s| serde_json::json!({
                "hostname": s.hostname,
                "namespace": s.namespace,
                "vips": s.vips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
                "ports": s.ports.iter().map(|(p, t)| (p.to_string(), *t)).collect::<std::collections::BTreeMap<_, _>>(),
                "endpoints": m.endpoint_uids(s),
            })).collect::<Vec<_>>(),
            "policies": m.policies().map(|p| serde_json::json!({
                "name": p.qualified_name().as_ref(),
                "action": p.action.to_string(),
                "rules": p.rules.len(),
                "origin": p.origin.as_deref().unwrap_or("file"),
                "matchLabels": p.match_labels,
            })).collect::<Vec<_>>(),
            "peerAuthentications": m.peer_authentications().iter().map(|p| serde_json::json!({
                "name": p.name.as_ref(),
                "origin": p.origin,
                "meshWide": p.mesh_wide,
                "matchLabels": p.match_labels,
                "mode": p.mode.to_string(),
                "portLevelMtls": p.port_modes.iter().map(|(port, m)| (port.to_string(), m.to_string())).collect::<std::collections::BTreeMap<_, _>>(),
            })).collect::<Vec<_>>(),
            "clusterPolicyNotes": m.cluster_policy_notes().iter().map(|n| serde_json::json!({
                "object": n.object,
                "skipped": n.skipped,
                "reason": n.code,
                "detail": n.reason,
            })).collect::<Vec<_>>(),
        })
    });
    let mesh_now = proxy.mesh();
    let ids = proxy.identities();
    let mut dump = serde_json::json!({
        "settings": serde_json::to_value(proxy.settings()).unwrap_or_default(),
        "datapath": proxy.backend().to_string(),
        "pods": pods,
        "mesh": mesh,
        "hbone": {
            "enabled": proxy.hbone_enabled(),
            "poolConnections": proxy.hbone_connections(),
            "poolStreams": proxy.hbone_streams(),
            "poolConnectionsOpened": proxy.hbone_connections_opened(),
        },
        "stats": {
            "accepted": st.accepted,
            "active": st.active,
            "connectFailed": st.connect_failed,
            "refused": st.refused,
            "sameNode": st.same_node,
            "bytesToUpstream": st.bytes_to_upstream,
            "bytesToClient": st.bytes_to_client,
        },
    });
    // The reference node proxy's sections, for `istioctl ztunnel-config`.
    if let Some(obj) = dump.as_object_mut() {
        obj.extend(crate::config_dump::reference_sections(
            mesh_now.as_deref(),
            ids.as_deref(),
        ));
    }
    serde_json::to_string_pretty(&dump).unwrap_or_default() + "\n"
}

/// When the idle trim gives memory back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IdleTrimConfig {
    /// How often the process's CPU time is looked at.
    pub tick: Duration,
    /// How long the proxy must have been quiet before the trim.
    pub quiet_for: Duration,
    /// A tick is busy when the process used more CPU than this share of
    /// one core during it (0.02: 10 ms of a 500 ms tick).
    pub busy_share: f64,
}

impl Default for IdleTrimConfig {
    /// Every 500 ms; quiet for 1 s; busy above 2% of a core. Under load
    /// the workers alone use far more (a proxied connection costs ~0.5
    /// CPU-ms, a GB ~0.5 CPU-s), so the trim never runs during it; a proxy
    /// that only answers scrapes or holds idle connections stays below.
    fn default() -> Self {
        IdleTrimConfig {
            tick: Duration::from_millis(500),
            quiet_for: Duration::from_secs(1),
            busy_share: 0.02,
        }
    }
}

/// Decides, tick by tick, when to trim: once the process has been quiet
/// for [`IdleTrimConfig::quiet_for`] after being busy, once (the next trim
/// waits for the next busy tick: an idle proxy frees nothing more).
#[derive(Debug)]
struct QuietClock {
    config: IdleTrimConfig,
    quiet: Duration,
    /// Busy since the last trim (true at start: the start-up's garbage).
    armed: bool,
}

impl QuietClock {
    fn new(config: IdleTrimConfig) -> QuietClock {
        QuietClock {
            config,
            quiet: Duration::ZERO,
            armed: true,
        }
    }

    /// One tick of `elapsed` in which the process used `cpu`: whether to
    /// trim now.
    fn tick(&mut self, elapsed: Duration, cpu: Duration) -> bool {
        if cpu.as_secs_f64() > elapsed.as_secs_f64() * self.config.busy_share {
            self.quiet = Duration::ZERO;
            self.armed = true;
            return false;
        }
        self.quiet += elapsed;
        if self.armed && self.quiet >= self.config.quiet_for {
            self.armed = false;
            return true;
        }
        false
    }
}

/// The idle trim's thread (`ringway-trim`): every tick it reads the
/// process's CPU time and, once the proxy has been quiet long enough after
/// some load, gives the heaps' free memory back: the idle trim threshold
/// ([`crate::sys::idle_heap_threshold`]), each worker releasing the free
/// top of its own heap, [`crate::sys::trim_heaps`] for the rest, then the
/// datapath's threshold again. Trims and bytes returned are counted in
/// `ringway_heap_trims_total` and `ringway_heap_trimmed_bytes_total`. The
/// workers keep up to [`crate::sys::MALLOC_TRIM_THRESHOLD`] free per heap
/// while they run (no page faults on the datapath); this returns it when
/// they stop. Stopped and joined on drop.
#[derive(Debug)]
pub struct IdleTrim {
    stop: Arc<(Mutex<bool>, Condvar)>,
    join: Option<JoinHandle<()>>,
}

impl IdleTrim {
    /// Starts the thread. `release_workers` has every datapath worker give
    /// the free top of its heap back ([`crate::sys::release_heap_top`] on
    /// the worker's own thread) and returns once they have.
    pub fn start(
        config: IdleTrimConfig,
        metrics: Arc<crate::metrics::Metrics>,
        release_workers: impl Fn() + Send + 'static,
    ) -> std::io::Result<IdleTrim> {
        IdleTrim::start_with(
            config,
            metrics,
            release_workers,
            crate::sys::process_cpu_time,
        )
    }

    /// [`IdleTrim::start`] with another CPU clock (the tests').
    fn start_with(
        config: IdleTrimConfig,
        metrics: Arc<crate::metrics::Metrics>,
        release_workers: impl Fn() + Send + 'static,
        mut cpu_time: impl FnMut() -> Duration + Send + 'static,
    ) -> std::io::Result<IdleTrim> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = stop.clone();
        let join = std::thread::Builder::new()
            .name("ringway-trim".into())
            .spawn(move || {
                let mut clock = QuietClock::new(config);
                let mut last = (std::time::Instant::now(), cpu_time());
                let (lock, cv) = &*flag;
                let mut stopped = lock.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    stopped = cv
                        .wait_timeout_while(stopped, config.tick, |s| !*s)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                    if *stopped {
                        return;
                    }
                    let now = (std::time::Instant::now(), cpu_time());
                    let trim = clock.tick(
                        now.0.saturating_duration_since(last.0),
                        now.1.saturating_sub(last.1),
                    );
                    last = now;
                    if trim {
                        trim_and_count(&metrics, &release_workers);
                        // The trim's own CPU is not load.
                        last = (std::time::Instant::now(), cpu_time());
                    }
                }
            })?;
        Ok(IdleTrim {
            stop,
            join: Some(join),
        })
    }
}

/// Trims the heaps, counting the trim and the resident bytes it returned:
/// with the idle trim threshold in force, the workers give the free top of
/// their heaps back (only a thread's own large free does that), then
/// `malloc_trim` the free memory inside every heap and the main heap's top;
/// then the threshold the datapath works with again.
fn trim_and_count(metrics: &crate::metrics::Metrics, release_workers: &impl Fn()) {
    let before = crate::sys::resident_bytes();
    crate::sys::idle_heap_threshold();
    release_workers();
    let released = crate::sys::trim_heaps();
    crate::sys::keep_heap_pages();
    let after = crate::sys::resident_bytes();
    let returned = match (before, after) {
        (Some(b), Some(a)) => b.saturating_sub(a),
        _ => 0,
    };
    metrics.heap_trims.inc();
    metrics.heap_trimmed_bytes.inc_by(returned);
    tracing::debug!(
        released,
        returned.bytes = returned,
        rss.bytes = after.unwrap_or(0),
        "idle: heaps trimmed"
    );
}

impl Drop for IdleTrim {
    fn drop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
        if let Some(j) = self.join.take() {
            let _ = j.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_TRIM: IdleTrimConfig = IdleTrimConfig {
        tick: Duration::from_millis(10),
        quiet_for: Duration::from_millis(30),
        busy_share: 0.02,
    };

    /// Quiet ticks after busy ones trim once, after `quiet_for`; busy
    /// ticks never trim and re-arm it; quiet ticks after a trim do not
    /// trim again.
    #[test]
    fn trims_once_per_quiet_period_after_load() {
        let tick = Duration::from_millis(500);
        let (busy, quiet) = (Duration::from_millis(400), Duration::from_millis(5));
        let mut c = QuietClock::new(IdleTrimConfig::default());
        let mut trims = vec![];
        // Start-up, then load, then quiet, then load again and quiet.
        for cpu in [
            quiet, quiet, quiet, quiet, busy, busy, busy, quiet, quiet, quiet, quiet, busy, quiet,
            busy, quiet, quiet, quiet,
        ] {
            trims.push(c.tick(tick, cpu));
        }
        let at: Vec<usize> = trims
            .iter()
            .enumerate()
            .filter(|(_, t)| **t)
            .map(|(i, _)| i)
            .collect();
        // After the start-up's 1 s of quiet; after the first load's 1 s of
        // quiet; the 500 ms of quiet between two loads is too short; after
        // the last load's 1 s.
        assert_eq!(at, vec![1, 8, 15]);
    }

    /// The thread trims once its clock says quiet, and counts it.
    #[test]
    fn the_thread_trims_when_quiet() {
        let _heaps = crate::sys::HEAP_TEST_LOCK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let asked = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let a = asked.clone();
        let release = move || {
            a.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        };
        let trim =
            IdleTrim::start_with(TEST_TRIM, metrics.clone(), release, || Duration::ZERO).unwrap();
        let t0 = std::time::Instant::now();
        while metrics.heap_trims.get() == 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(trim);
        assert_eq!(
            metrics.heap_trims.get(),
            1,
            "one trim: quiet from the start"
        );
        assert_eq!(
            asked.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "the workers were asked to release their heaps once"
        );
    }

    /// Under load (the CPU clock running as fast as the wall clock) the
    /// thread never trims.
    #[test]
    fn the_thread_does_not_trim_under_load() {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let t = ticks.clone();
        let t0 = std::time::Instant::now();
        let trim = IdleTrim::start_with(
            TEST_TRIM,
            metrics.clone(),
            || {},
            move || {
                t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // One core busy all the time.
                t0.elapsed()
            },
        )
        .unwrap();
        let wait = std::time::Instant::now();
        while ticks.load(std::sync::atomic::Ordering::Relaxed) < 20
            && wait.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(trim);
        assert!(ticks.load(std::sync::atomic::Ordering::Relaxed) >= 20);
        assert_eq!(metrics.heap_trims.get(), 0, "trimmed under load");
    }

    /// Each refusal names what was wrong: the parser's reason for a filter
    /// that does not parse, the logging's own otherwise.
    #[test]
    fn logging_answers_name_what_was_wrong() {
        let set: SetLogLevel = Arc::new(|level: &str| match level {
            "info" => Ok(()),
            "info[" => Err(LogLevelError::Invalid("unbalanced [".into())),
            "gone" => Err(LogLevelError::Apply("the subscriber is gone".into())),
            _ => Err(LogLevelError::NotInitialised),
        });
        for (level, code, body) in [
            ("info", 200, "log level: info\n"),
            ("info[", 400, "bad log filter \"info[\": unbalanced [\n"),
            (
                "gone",
                400,
                "bad log filter \"gone\": the logging cannot take a new filter: \
                 the subscriber is gone\n",
            ),
            (
                "debug",
                400,
                "bad log filter \"debug\": logging not initialised\n",
            ),
        ] {
            let (status, kind, text) = set_log_level(level, &set);
            assert_eq!((status.as_u16(), kind, text.as_str()), (code, TEXT, body));
        }
    }

    /// The `/logging` query is form-decoded as a browser, curl
    /// `--data-urlencode` or a hand-typed URL sends it.
    #[test]
    fn logging_level_is_form_decoded_whatever_the_client_sent() {
        for (query, level) in [
            // As typed: commas and `=` need no escape in a query.
            ("level=info,access=debug", "info,access=debug"),
            // Escaped by a client that escapes everything.
            ("level=info%2Caccess%3Ddebug", "info,access=debug"),
            ("level=info%2caccess%3ddebug", "info,access=debug"),
            // Directives with spans and fields: brackets, braces, quotes.
            (
                "level=ringway_proxy%5Bconn%7Bpod.uid%3D%22a%22%7D%5D%3Dtrace",
                "ringway_proxy[conn{pod.uid=\"a\"}]=trace",
            ),
            // `+` is a space in a form; an escaped `+` is a plus.
            ("level=info,+access=debug", "info, access=debug"),
            ("level=a%2Bb", "a+b"),
            // Among other parameters, in any order; the first `level` wins.
            ("x=1&level=warn&y=2", "warn"),
            ("level=warn&level=debug", "warn"),
            // A malformed escape is kept as sent, not dropped or guessed.
            ("level=info%2", "info%2"),
            ("level=%ZZdebug", "%ZZdebug"),
            // Bytes that are not UTF-8 cannot smuggle anything through.
            ("level=%FFdebug", "\u{FFFD}debug"),
            // An escaped `&` or `=` is part of the value, not a separator.
            ("level=a%26b%3Dc", "a&b=c"),
            // No level: empty (the handler answers 400).
            ("", ""),
            ("level", ""),
            ("level=", ""),
            ("levels=debug", ""),
            ("&&=&", ""),
        ] {
            assert_eq!(log_filter_of(query), level, "query {query:?}");
        }
    }
}
