//! The idle trim ([`IdleTrim`]): a control-plane thread (never a datapath
//! worker) that gives the heaps' free memory back to the kernel once the
//! proxy has been quiet for a while after a load.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

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
    /// While quiet after a trim, the heaps' free bytes growing by this much
    /// (memory freed without load: surplus tunnels closing after their idle
    /// timeout, connections held idle then closed) trims again.
    pub freed_since_trim: u64,
}

impl Default for IdleTrimConfig {
    /// Every 500 ms; quiet for 1 s; busy above 2% of a core; again when
    /// 1 MiB more is free. Under load the workers alone use far more CPU (a
    /// proxied connection costs ~0.3 CPU-ms, a GB ~0.5 CPU-s), so the trim
    /// never runs during it; a proxy that only answers scrapes or holds
    /// idle connections stays below.
    fn default() -> Self {
        IdleTrimConfig {
            tick: Duration::from_millis(500),
            quiet_for: Duration::from_secs(1),
            busy_share: 0.02,
            freed_since_trim: 1 << 20,
        }
    }
}

/// Decides, tick by tick, when to trim: once the process has been quiet
/// for [`IdleTrimConfig::quiet_for`] after being busy, once; then, still
/// quiet, only when the heaps' free bytes have grown by
/// [`IdleTrimConfig::freed_since_trim`] since that trim (memory freed by
/// timers, not load: an idle proxy that frees nothing is not trimmed again).
#[derive(Debug)]
struct QuietClock {
    config: IdleTrimConfig,
    quiet: Duration,
    /// Busy since the last trim (true at start: the start-up's garbage).
    armed: bool,
    /// The heaps' free bytes right after the last trim.
    free_after_trim: Option<u64>,
}

impl QuietClock {
    fn new(config: IdleTrimConfig) -> QuietClock {
        QuietClock {
            config,
            quiet: Duration::ZERO,
            armed: true,
            free_after_trim: None,
        }
    }

    /// One tick of `elapsed` in which the process used `cpu`: whether to
    /// trim now. `free` reads the heaps' free bytes; it is called only on
    /// quiet ticks after a trim (it locks every arena in turn).
    fn tick(
        &mut self,
        elapsed: Duration,
        cpu: Duration,
        free: impl FnOnce() -> Option<u64>,
    ) -> bool {
        if cpu.as_secs_f64() > elapsed.as_secs_f64() * self.config.busy_share {
            self.quiet = Duration::ZERO;
            self.armed = true;
            return false;
        }
        self.quiet += elapsed;
        if self.quiet < self.config.quiet_for {
            return false;
        }
        if self.armed {
            self.armed = false;
            return true;
        }
        match (self.free_after_trim, free()) {
            (Some(then), Some(now)) => now >= then.saturating_add(self.config.freed_since_trim),
            _ => false,
        }
    }

    /// The trim ran; the heaps then had `free` bytes free.
    fn trimmed(&mut self, free: Option<u64>) {
        self.free_after_trim = free;
    }
}

/// The idle trim's thread (`ringway-trim`): every tick it reads the
/// process's CPU time and, once the proxy has been quiet long enough after
/// some load (or, still quiet, has freed [`IdleTrimConfig::freed_since_trim`]
/// more since its last trim), gives the heaps' free memory back: the idle trim threshold
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
            || crate::sys::heap_usage().map(|h| h.free),
        )
    }

    /// [`IdleTrim::start`] with another CPU clock and heap reading (the
    /// tests').
    fn start_with(
        config: IdleTrimConfig,
        metrics: Arc<crate::metrics::Metrics>,
        release_workers: impl Fn() + Send + 'static,
        mut cpu_time: impl FnMut() -> Duration + Send + 'static,
        mut heap_free: impl FnMut() -> Option<u64> + Send + 'static,
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
                        &mut heap_free,
                    );
                    last = now;
                    if trim {
                        trim_and_count(&metrics, &release_workers);
                        clock.trimmed(heap_free());
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
        freed_since_trim: 1 << 20,
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
            trims.push(c.tick(tick, cpu, || Some(0)));
            if trims.last() == Some(&true) {
                c.trimmed(Some(0));
            }
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

    /// Quiet after a trim, memory freed without load (the heaps' free bytes
    /// up by `freed_since_trim`) trims again, once; less than that, or no
    /// reading, does not; the growth is counted from the last trim.
    #[test]
    fn trims_again_when_memory_is_freed_while_quiet() {
        const MIB: u64 = 1 << 20;
        let tick = Duration::from_millis(500);
        let quiet = Duration::from_millis(5);
        let mut c = QuietClock::new(IdleTrimConfig::default());
        let mut run = |free: Option<u64>| {
            let t = c.tick(tick, quiet, || free);
            if t {
                c.trimmed(free);
            }
            t
        };
        // The first trim after the start-up's quiet second, at 10 MiB free.
        assert!(!run(Some(10 * MIB)));
        assert!(run(Some(10 * MIB)));
        // Quiet: a little freed, then nothing read: no trim.
        assert!(!run(Some(10 * MIB + MIB / 2)));
        assert!(!run(None));
        // 1 MiB more than after the trim: trim, once.
        assert!(run(Some(11 * MIB)));
        assert!(!run(Some(11 * MIB)));
        // Memory reused then freed again: counted from the last trim.
        assert!(!run(Some(9 * MIB)));
        assert!(!run(Some(11 * MIB + MIB / 2)));
        assert!(run(Some(12 * MIB)));
    }

    /// On a busy tick the heaps are not read (mallinfo2 locks every arena,
    /// which the workers would wait on), nor in the quiet second before
    /// the first trim.
    #[test]
    fn the_heaps_are_read_only_when_quiet_after_a_trim() {
        let tick = Duration::from_millis(500);
        let (busy, quiet) = (Duration::from_millis(400), Duration::from_millis(5));
        let mut c = QuietClock::new(IdleTrimConfig::default());
        let mut reads = 0;
        for cpu in [quiet, quiet, busy, busy, quiet, quiet, quiet, busy] {
            if c.tick(tick, cpu, || {
                reads += 1;
                Some(0)
            }) {
                c.trimmed(Some(0));
            }
        }
        // Ticks 0-1: armed (no read), trim at 1; busy 2-3; 4 quiet (< 1 s);
        // 5 trims (armed); 6 reads once; 7 busy.
        assert_eq!(reads, 1);
    }

    /// Waits (up to 10 s) until the thread has trimmed `n` times.
    fn wait_for_trims(metrics: &crate::metrics::Metrics, n: u64) {
        let t0 = std::time::Instant::now();
        while metrics.heap_trims.get() < n && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(5));
        }
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
        let trim = IdleTrim::start_with(
            TEST_TRIM,
            metrics.clone(),
            release,
            || Duration::ZERO,
            || Some(0),
        )
        .unwrap();
        wait_for_trims(&metrics, 1);
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

    /// Quiet after its trim, the thread trims again once the heaps' free
    /// bytes have grown (surplus tunnels closing, say), and not before.
    #[test]
    fn the_thread_trims_again_when_memory_is_freed_while_quiet() {
        let _heaps = crate::sys::HEAP_TEST_LOCK
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let free = Arc::new(std::sync::atomic::AtomicU64::new(1 << 20));
        let f = free.clone();
        let trim = IdleTrim::start_with(
            TEST_TRIM,
            metrics.clone(),
            || {},
            || Duration::ZERO,
            move || Some(f.load(std::sync::atomic::Ordering::Relaxed)),
        )
        .unwrap();
        wait_for_trims(&metrics, 1);
        // Ten more ticks with nothing freed: still one trim.
        std::thread::sleep(TEST_TRIM.tick * 10);
        assert_eq!(
            metrics.heap_trims.get(),
            1,
            "trimmed again with nothing freed"
        );
        free.fetch_add(2 << 20, std::sync::atomic::Ordering::Relaxed);
        wait_for_trims(&metrics, 2);
        drop(trim);
        assert_eq!(
            metrics.heap_trims.get(),
            2,
            "2 MiB freed while quiet: one more trim"
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
            || Some(0),
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
}
