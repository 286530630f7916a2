//! The measurements of the suite, each on a started scenario or its own
//! proxy, each filling one round's [`Figures`](crate::figures::Figures) of
//! its kind: [`datapath`] (throughput, latency at a fixed rate, connection
//! rate, idle connections, through one scenario), [`scrape`] (the latency
//! run with and without a scraper) and [`churn`] (pods by command line and
//! by CNI ADD), and [`upgrade`] (latency through a rolling proxy upgrade,
//! a report of its own). Above the bed, the load generator and the figure model;
//! below the suite and the profiles, which run them.

pub mod churn;
pub mod datapath;
pub mod scrape;
pub mod upgrade;

use crate::figures::{Figure, Figures};
use crate::load;

/// Records a latency run's percentiles as `at` (p50, p90, p99, p99.9, max;
/// µs).
pub fn set_latency<F: Figure>(f: &mut Figures<F>, at: [F; 5], l: &load::Latency) {
    let [p50, p90, p99, p999, max] = at;
    for (figure, q) in [(p50, 0.50), (p90, 0.90), (p99, 0.99), (p999, 0.999)] {
        f.set(figure, l.hist.value_at_quantile(q) as f64 / 1e3);
    }
    f.set(max, l.hist.max() as f64 / 1e3);
}
