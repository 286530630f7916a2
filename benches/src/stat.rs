//! Numbers as the reports hold and print them: a measured value that may
//! be missing ([`Num`], `null` in JSON), a figure over the rounds ([`Stat`]:
//! median, spread, every round), the median and nearest-rank percentiles,
//! and the one way a value is printed ([`fmt`]) that ratios are computed
//! from ([`printed`]). A leaf: it names no other module of the crate.

use serde::{Deserialize, Serialize};

/// A measured value. Not finite (not measured, or a failed measurement) is
/// written as `null` and read back as NaN; the field itself is required
/// (a document without it is refused, naming it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Num(pub f64);

impl Num {
    /// The value when it is finite.
    pub fn finite(self) -> Option<f64> {
        self.0.is_finite().then_some(self.0)
    }
}

impl Serialize for Num {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.0.is_finite() {
            s.serialize_f64(self.0)
        } else {
            s.serialize_none()
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Num, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Num;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number, or null for a value that was not measured")
            }
            fn visit_f64<E>(self, v: f64) -> Result<Num, E> {
                Ok(Num(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Num, E> {
                Ok(Num(v as f64))
            }
            fn visit_unit<E>(self) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
            fn visit_none<E>(self) -> Result<Num, E> {
                Ok(Num(f64::NAN))
            }
        }
        // `deserialize_any`, not `Option`'s: a missing field is an error.
        d.deserialize_any(V)
    }
}

/// One figure over the rounds: median, spread, every round's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// Median of the finite round values.
    pub median: Num,
    /// Smallest finite round value.
    pub min: Num,
    /// Largest finite round value.
    pub max: Num,
    /// Every round's value, in round order.
    pub rounds: Vec<Num>,
}

impl Stat {
    /// The figure of `rounds` (one value per round, NaN where it was not
    /// measured): median and spread over the finite values.
    pub fn of(rounds: &[f64]) -> Stat {
        let finite: Vec<f64> = rounds.iter().copied().filter(|v| v.is_finite()).collect();
        Stat {
            median: Num(median(&finite)),
            min: Num(finite.iter().copied().fold(f64::INFINITY, f64::min)),
            max: Num(finite.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
            rounds: rounds.iter().copied().map(Num).collect(),
        }
    }

    /// The median when it is finite.
    pub fn finite_median(&self) -> Option<f64> {
        self.median.finite()
    }
}

/// Median (mean of the middle two for an even count); NaN when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Nearest-rank percentile `p` (0..=1) of `sorted` (ascending); NaN when
/// empty.
pub fn nearest_rank(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// p50, p90, p99 and max of `v` by nearest rank (NaN when empty).
pub fn quantiles(mut v: Vec<f64>) -> [f64; 4] {
    v.sort_by(f64::total_cmp);
    let max = v.last().copied().unwrap_or(f64::NAN);
    [
        nearest_rank(&v, 0.50),
        nearest_rank(&v, 0.90),
        nearest_rank(&v, 0.99),
        max,
    ]
}

/// Prints a value as the reports do.
pub fn fmt(v: f64, decimals: usize) -> String {
    format!("{v:.decimals$}")
}

/// A value rounded as [`fmt`] prints it: ratios are taken from the printed
/// figures, so the report's columns agree with each other.
pub fn printed(v: f64, decimals: usize) -> f64 {
    fmt(v, decimals).parse().unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_percentiles() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantiles(v), [50.0, 90.0, 99.0, 100.0]);
        assert!(quantiles(Vec::new()).iter().all(|q| q.is_nan()));
    }

    #[test]
    fn stat_ignores_unmeasured_rounds() {
        let s = Stat::of(&[2.0, f64::NAN, 4.0]);
        assert_eq!((s.median.0, s.min.0, s.max.0), (3.0, 2.0, 4.0));
        assert_eq!(s.rounds.len(), 3);
        assert!(Stat::of(&[]).finite_median().is_none());
    }

    #[test]
    fn a_missing_value_is_null() {
        assert_eq!(serde_json::to_string(&Num(f64::NAN)).unwrap(), "null");
        let back: Num = serde_json::from_str("null").unwrap();
        assert!(back.0.is_nan());
    }
}
