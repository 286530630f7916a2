//! Backoff delays, a leaf of the `kube` module: the retries of the
//! reconciler and the annotator, and the watcher's own after an error.

use std::time::Duration;

use kube::runtime::utils::Backoff;

/// `min * 2^(failures-1)`, at most `max`.
pub(crate) fn backoff(min: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.saturating_sub(1).min(20);
    min.saturating_mul(factor).min(max)
}

/// The watcher's backoff after an error: `min` doubling up to `max`, each delay scaled by
/// a random factor in [0.5, 1) so that the agents of every node do not relist at the
/// same instant after an API server outage; reset by kube's watcher on the next success.
#[derive(Debug, Clone)]
pub(crate) struct ExponentialBackoff {
    min: Duration,
    max: Duration,
    failures: u32,
}

impl ExponentialBackoff {
    pub(crate) fn new(min: Duration, max: Duration) -> ExponentialBackoff {
        ExponentialBackoff {
            min,
            max,
            failures: 0,
        }
    }
}

impl Iterator for ExponentialBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        let delay = backoff(self.min, self.max, self.failures);
        Some(delay.mul_f64(0.5 + 0.5 * random_unit()))
    }
}

/// A random number in [0, 1): std's per-process random hash keys, so no RNG dependency
/// (the quality needed here is "not the same on every node").
fn random_unit() -> f64 {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(0u8) >> 11;
    bits as f64 / (1u64 << 53) as f64
}

impl Backoff for ExponentialBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}
