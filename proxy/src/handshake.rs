//! Before authentication on the tunnel listener (15008): the per-connection
//! jitter of its deadlines, so connections admitted together do not expire
//! together.

use std::cell::Cell;
use std::hash::BuildHasher;
use std::time::Duration;

/// `timeout` scaled into `[timeout / 2, timeout)` by `r` (uniform over
/// `u64`): the deadline of one pre-authentication phase (TLS handshake,
/// HTTP/2 preface) of one connection. The configured value stays the
/// upper bound.
pub fn jittered_by(timeout: Duration, r: u64) -> Duration {
    let half = timeout / 2;
    let span = timeout.saturating_sub(half).as_nanos();
    // (span * r) / 2^64 < span; span fits in u64 nanoseconds for any
    // configured timeout (584 years), so the product fits in u128.
    let extra = (span.min(u128::from(u64::MAX)) * u128::from(r)) >> 64;
    half + Duration::from_nanos(extra as u64)
}

/// [`jittered_by`] with a random draw (a per-thread generator, seeded once
/// from the standard library's random hash keys).
pub fn jittered(timeout: Duration) -> Duration {
    jittered_by(timeout, next_random())
}

thread_local! {
    static RNG: Cell<u64> = Cell::new(std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64));
}

/// splitmix64: statistically fine for spreading deadlines, not for secrets.
fn next_random() -> u64 {
    RNG.with(|s| {
        let x = s.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        s.set(x);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The jittered deadline stays within `[timeout / 2, timeout]`: never
    /// longer than configured, and connections admitted together spread
    /// over half of it.
    #[test]
    fn preauth_deadline_jitter_stays_in_bounds() {
        for t in [
            Duration::from_millis(3),
            Duration::from_secs(1),
            Duration::from_secs(5),
            Duration::from_secs(3600),
        ] {
            assert_eq!(jittered_by(t, 0), t / 2, "lowest draw for {t:?}");
            let top = jittered_by(t, u64::MAX);
            assert!(top <= t, "highest draw for {t:?} is {top:?}");
            assert!(
                top >= t - (t - t / 2) / 1000,
                "the highest draw for {t:?} ({top:?}) reaches the top of the range"
            );
            for _ in 0..1000 {
                let d = jittered(t);
                assert!(d >= t / 2 && d <= t, "{d:?} outside [{:?}, {t:?}]", t / 2);
            }
        }
        // A thousand draws of 5 s cover the range: no two halves empty.
        let t = Duration::from_secs(5);
        let draws: Vec<_> = (0..1000).map(|_| jittered(t)).collect();
        let low = draws.iter().filter(|d| **d < t * 3 / 4).count();
        assert!(
            (300..=700).contains(&low),
            "{low} of 1000 draws in the lower half of the range"
        );
    }
}
