//! Retry delays, a leaf: [`Backoff`], the one exponential backoff of every
//! retry loop in ringway (the node agent's watches, calls and annotations,
//! the proxy's Kubernetes watches and node-agent reconnects, the xDS client,
//! certificate renewals, the certificate service's pod watch). Each user
//! keeps its own figures; see where each builds its [`Backoff`].
//!
//! The delay after the n-th failure in a row is `min · 2^(n−1)`, at most
//! `max`, then spread at random by its [`Jitter`] so that the proxies of a
//! fleet do not retry in step after an outage. [`Backoff::reset`] (after a
//! success) starts again from `min`.
//!
//! ```
//! use std::time::Duration;
//! use ringway_config::{Backoff, Jitter};
//!
//! let ms = Duration::from_millis;
//! let mut b = Backoff::new(ms(10), ms(50));
//! let delays: Vec<_> = (0..4).map(|_| b.next_delay()).collect();
//! assert_eq!(delays, [ms(10), ms(20), ms(40), ms(50)]);
//! assert_eq!(b.failures(), 4);
//! b.reset();
//! assert_eq!(b.next_delay(), ms(10));
//!
//! let mut jittered = Backoff::new(ms(100), ms(1000)).with_jitter(Jitter::Down(0.5));
//! let d = jittered.next_delay();
//! assert!(ms(50) <= d && d <= ms(100));
//! ```

use std::time::Duration;

use rand::Rng;

/// How a delay is spread at random. The fraction is clamped to `[0, 1]`
/// for [`Jitter::Down`] and to `[0, ∞)` for [`Jitter::Up`]; a NaN counts
/// as 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// The delay as it doubles, never spread.
    None,
    /// Up to this fraction of the delay taken off: a delay `d` becomes one
    /// in `[d·(1−f), d]` (0.5: between half and all of it).
    Down(f64),
    /// Up to this fraction of the delay added: `d` becomes one in
    /// `[d, d·(1+f)]` (0.25: up to a quarter more).
    Up(f64),
}

impl Jitter {
    /// The factors a delay is scaled by: the lowest and the highest.
    fn factors(self) -> (f64, f64) {
        match self {
            Jitter::None => (1.0, 1.0),
            Jitter::Down(f) => (1.0 - fraction(f, 1.0), 1.0),
            Jitter::Up(f) => (1.0, 1.0 + fraction(f, f64::INFINITY)),
        }
    }
}

/// `f` clamped to `[0, most]`, a NaN read as 0.
fn fraction(f: f64, most: f64) -> f64 {
    if f.is_nan() {
        0.0
    } else {
        f.clamp(0.0, most)
    }
}

/// An exponential backoff and its progress: how many failures in a row it
/// has counted, and so the next delay. Cheap to copy; a user that retries
/// many things (pods, identities) keeps one per thing.
///
/// Also an [`Iterator`] of delays (each `next` is [`Backoff::next_delay`]),
/// and, with the `kube-backoff` feature (part of `kube`), the backoff kube's
/// watchers take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: Jitter,
    failures: u32,
}

impl Backoff {
    /// `min` doubling after each failure up to `max`, not jittered. A `min`
    /// above `max` gives `max` every time; a zero `min` gives zero delays
    /// (users validate their figures).
    pub const fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            jitter: Jitter::None,
            failures: 0,
        }
    }

    /// The same backoff with its delays spread by `jitter`.
    pub const fn with_jitter(self, jitter: Jitter) -> Backoff {
        Backoff { jitter, ..self }
    }

    /// The first delay. (Not `min`: [`Iterator::min`] would take that name
    /// and never return.)
    pub fn min_delay(&self) -> Duration {
        self.min
    }

    /// The longest delay before jitter.
    pub fn max_delay(&self) -> Duration {
        self.max
    }

    /// How the delays are spread.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// Failures in a row counted since the start or the last
    /// [`Backoff::reset`]: the number of delays handed out.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// The delay after the `failures`-th failure in a row, before jitter:
    /// `min · 2^(failures−1)`, at most `max` (`min` for 0 and 1).
    pub fn base_delay(&self, failures: u32) -> Duration {
        match 1u32.checked_shl(failures.saturating_sub(1)) {
            Some(factor) => self.min.saturating_mul(factor).min(self.max),
            None => self.max,
        }
    }

    /// Counts a failure and returns the delay before the next try, jittered
    /// with the thread's random number generator.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_with(&mut rand::rng())
    }

    /// [`Backoff::next_delay`] with the jitter drawn from `rng` (tests pass
    /// one whose draws they know).
    pub fn next_delay_with<R: Rng + ?Sized>(&mut self, rng: &mut R) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let base = self.base_delay(self.failures);
        let (low, high) = self.jitter.factors();
        if low == high {
            return scale(base, low);
        }
        let unit: f64 = rng.random(); // [0, 1)
        scale(base, low + (high - low) * unit)
    }

    /// Forgets the failures (after a success): the next delay is `min` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// `d · factor` for a finite `factor >= 0`, saturating at [`Duration::MAX`].
fn scale(d: Duration, factor: f64) -> Duration {
    if factor == 1.0 {
        return d;
    }
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

impl Iterator for Backoff {
    type Item = Duration;

    /// Never `None`: a backoff has a next delay after any number of failures.
    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// kube's watchers back off with it after an error and reset it on the next
/// success.
#[cfg(feature = "kube-backoff")]
impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        Backoff::reset(self);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::RngCore;

    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// An RNG that always draws the same bits: `Fixed(0)` draws 0.0,
    /// `Fixed(u64::MAX)` the highest value below 1.
    struct Fixed(u64);

    impl RngCore for Fixed {
        fn next_u32(&mut self) -> u32 {
            self.0 as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            for (i, b) in dest.iter_mut().enumerate() {
                *b = self.0.to_le_bytes()[i % 8];
            }
        }
    }

    #[test]
    fn delays_double_from_min_to_the_cap_and_count_the_failures() {
        let mut b = Backoff::new(ms(500), ms(5000));
        let got: Vec<_> = (0..7).map(|_| b.next_delay()).collect();
        assert_eq!(
            got,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(5000),
                ms(5000),
                ms(5000)
            ]
        );
        assert_eq!(b.failures(), 7);
        assert_eq!(
            (0..=3).map(|n| b.base_delay(n)).collect::<Vec<_>>(),
            [ms(500), ms(500), ms(1000), ms(2000)]
        );
    }

    #[test]
    fn reset_starts_again_from_min() {
        let mut b = Backoff::new(ms(100), ms(1000));
        for _ in 0..5 {
            b.next_delay();
        }
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.next_delay(), ms(100));
        assert_eq!(b.next_delay(), ms(200));
    }

    #[test]
    fn no_overflow_after_any_number_of_failures() {
        let mut b = Backoff::new(ms(500), Duration::from_secs(30));
        assert_eq!(b.base_delay(u32::MAX), Duration::from_secs(30));
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay(), Duration::from_secs(30));
        // A cap far above what 31 doublings reach is still reached.
        let long = Backoff::new(Duration::from_nanos(1), Duration::from_secs(3600));
        assert_eq!(long.base_delay(40), Duration::from_secs(3600));
        // Saturates instead of overflowing, and the cap holds.
        let huge = Backoff::new(Duration::MAX / 2, Duration::MAX).with_jitter(Jitter::Up(0.25));
        let mut h = huge;
        for _ in 0..40 {
            assert!(h.next_delay_with(&mut Fixed(u64::MAX)) >= Duration::MAX / 2);
        }
        // min above max: max every time.
        assert_eq!(Backoff::new(ms(10), ms(5)).next_delay(), ms(5));
    }

    #[test]
    fn jitter_down_spreads_each_delay_between_its_fraction_and_itself() {
        let mut b = Backoff::new(ms(100), ms(1000)).with_jitter(Jitter::Down(0.5));
        let lowest: Vec<_> = (0..6).map(|_| b.next_delay_with(&mut Fixed(0))).collect();
        assert_eq!(
            lowest,
            [ms(50), ms(100), ms(200), ms(400), ms(500), ms(500)]
        );
        b.reset();
        let highest: Vec<_> = (0..6)
            .map(|_| b.next_delay_with(&mut Fixed(u64::MAX)))
            .collect();
        for (d, full) in highest.iter().zip([100, 200, 400, 800, 1000, 1000]) {
            // Within a nanosecond of the full delay, never above it.
            assert!(
                *d <= ms(full) && ms(full) - *d <= Duration::from_nanos(1),
                "{d:?}"
            );
        }
    }

    #[test]
    fn jitter_up_adds_at_most_its_fraction() {
        let s = Duration::from_secs;
        let mut b = Backoff::new(s(1), s(32)).with_jitter(Jitter::Up(0.25));
        let lowest: Vec<_> = (0..3).map(|_| b.next_delay_with(&mut Fixed(0))).collect();
        assert_eq!(lowest, [s(1), s(2), s(4)]);
        b.reset();
        let d = b.next_delay_with(&mut Fixed(u64::MAX));
        assert!(
            d <= ms(1250) && ms(1250) - d <= Duration::from_nanos(1),
            "{d:?}"
        );
    }

    #[test]
    fn jittered_delays_vary_and_stay_in_their_range() {
        for (jitter, low, high) in [
            (Jitter::Down(0.5), ms(50), ms(100)),
            (Jitter::Up(0.25), ms(100), ms(125)),
        ] {
            let mut b = Backoff::new(ms(100), ms(100)).with_jitter(jitter);
            let seen: BTreeSet<Duration> = (0..50).map(|_| b.next_delay()).collect();
            assert!(seen.len() > 10, "{jitter:?} not jittered: {seen:?}");
            for d in seen {
                assert!(low <= d && d <= high, "{jitter:?}: {d:?}");
            }
        }
    }

    #[test]
    fn jitter_fractions_out_of_range_are_clamped() {
        let mut all = Backoff::new(ms(100), ms(100)).with_jitter(Jitter::Down(7.0));
        assert_eq!(all.next_delay_with(&mut Fixed(0)), Duration::ZERO);
        for jitter in [Jitter::Down(-1.0), Jitter::Up(-1.0), Jitter::Down(f64::NAN)] {
            let mut b = Backoff::new(ms(100), ms(100)).with_jitter(jitter);
            assert_eq!(b.next_delay_with(&mut Fixed(0)), ms(100), "{jitter:?}");
            assert_eq!(
                b.next_delay_with(&mut Fixed(u64::MAX)),
                ms(100),
                "{jitter:?}"
            );
        }
    }

    #[test]
    fn an_iterator_of_delays() {
        let b = Backoff::new(ms(10), ms(40));
        assert_eq!(
            b.take(4).collect::<Vec<_>>(),
            [ms(10), ms(20), ms(40), ms(40)]
        );
    }
}
