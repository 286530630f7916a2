//! The figures, declared once: every figure a measurement records, the
//! report prints, `results.json` holds and the cross-check compares is a
//! variant of one of the enums below, with its key (the JSON name), title,
//! unit and decimals in one line. A measurement sets a figure by variant
//! ([`Figures::set`]); the report iterates [`Figure::ALL`]; the JSON writes
//! and reads the key (an unknown key is refused, naming it). No figure is a
//! string anywhere else, so a new one is added in one place.
//!
//! The kinds: [`Datapath`] (each scenario, each round), [`Scrape`] (the
//! scrape-impact run), [`Churn`] (pod churn), the derived [`VsDirect`]
//! (a scenario against its no-proxy baseline) and [`ScrapeRatio`] (with /
//! without the scraper), and [`CrossCheck`] (the bundled generator beside
//! the standard tools, sharing its figures with [`Datapath`]). The bottom
//! layer of the crate: it names no other module.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

/// What the reports need to print a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FigureDef {
    /// JSON key.
    pub key: &'static str,
    /// Title (a table's column or row).
    pub title: &'static str,
    /// Unit.
    pub unit: &'static str,
    /// Decimals printed.
    pub decimals: usize,
    /// Only meaningful with a proxy (CPU and memory of the proxy process):
    /// absent from a no-proxy scenario.
    pub proxy_only: bool,
    /// Measured only where it can be (one ringway proxy): absent elsewhere,
    /// and a difference that may be negative.
    pub where_measurable: bool,
}

impl FigureDef {
    /// A figure of any scenario.
    pub const fn new(
        key: &'static str,
        title: &'static str,
        unit: &'static str,
        decimals: usize,
    ) -> FigureDef {
        FigureDef {
            key,
            title,
            unit,
            decimals,
            proxy_only: false,
            where_measurable: false,
        }
    }

    /// The same, measured on the proxy process only.
    pub const fn of_proxy(self) -> FigureDef {
        FigureDef {
            proxy_only: true,
            ..self
        }
    }

    /// The same, measured only where it can be ([`FigureDef::where_measurable`]).
    pub const fn where_measurable(self) -> FigureDef {
        FigureDef {
            where_measurable: true,
            ..self
        }
    }
}

/// A kind of figure: an enum whose variants are its figures.
pub trait Figure:
    Copy + Ord + fmt::Debug + serde::Serialize + serde::de::DeserializeOwned + 'static
{
    /// Every figure of the kind, in report order.
    const ALL: &'static [Self];
    /// The kind's name in messages (`datapath`, `scrape`, ...).
    const SECTION: &'static str;
    /// Its key, title, unit and decimals.
    fn def(self) -> FigureDef;

    /// Its JSON key.
    fn key(self) -> &'static str {
        self.def().key
    }

    /// Whether it applies to a scenario with (or without) a proxy.
    fn applies(self, proxied: bool) -> bool {
        proxied || !self.def().proxy_only
    }

    /// The figure whose key is `key`.
    fn from_key(key: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|f| f.key() == key)
    }
}

/// Declares a kind of figure: the enum, its [`Figure`] impl (every variant
/// in `ALL`, in declaration order) and its serde impls (by key).
macro_rules! figures {
    (
        $(#[$meta:meta])*
        pub enum $name:ident in $section:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $def:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl Figure for $name {
            const ALL: &'static [$name] = &[$($name::$variant),+];
            const SECTION: &'static str = $section;
            fn def(self) -> FigureDef {
                match self {
                    $( $name::$variant => $def, )+
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.key())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                d.deserialize_str(KeyVisitor::<$name>(PhantomData))
            }
        }
    };
}

/// Reads a figure from its key.
struct KeyVisitor<F>(PhantomData<F>);

impl<F: Figure> serde::de::Visitor<'_> for KeyVisitor<F> {
    type Value = F;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the key of a {} figure", F::SECTION)
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<F, E> {
        F::from_key(v).ok_or_else(|| E::custom(format!("unknown {} figure `{v}`", F::SECTION)))
    }
}

const fn fig(key: &'static str, title: &'static str, unit: &'static str, d: usize) -> FigureDef {
    FigureDef::new(key, title, unit, d)
}

figures! {
    /// A scenario's figures, each round: throughput, latency at a fixed
    /// rate, connection rate, the proxy's CPU and memory.
    pub enum Datapath in "datapath" {
        /// Bytes over one stream / time.
        Tput1Gbps => fig("tput1_gbps", "one stream", "Gbit/s", 2),
        /// The same over N parallel streams.
        TputNGbps => fig("tputn_gbps", "N streams", "Gbit/s", 2),
        /// Latency at a fixed rate, from the scheduled send: p50.
        LatP50Us => fig("lat_p50_us", "p50", "µs", 1),
        /// p90.
        LatP90Us => fig("lat_p90_us", "p90", "µs", 1),
        /// p99.
        LatP99Us => fig("lat_p99_us", "p99", "µs", 1),
        /// p99.9.
        LatP999Us => fig("lat_p999_us", "p99.9", "µs", 1),
        /// max.
        LatMaxUs => fig("lat_max_us", "max", "µs", 1),
        /// Requests completed / time of the latency run.
        LatRps => fig("lat_rps", "achieved request rate", "req/s", 0),
        /// How late the generator itself sent, p99.
        GenLateP99Us => fig("gen_late_p99_us", "load generator send lateness p99", "µs", 1),
        /// Connections (connect, 1 B each way, close) per second.
        ConnPerS => fig("conn_per_s", "new connections/s", "conn/s", 0),
        /// Connection attempts that failed.
        ConnFailures => fig("conn_failures", "failed connections", "count", 0),
        /// The bench process's CPU per GB of the one-stream run.
        GenCpuSPerGb => fig("gen_cpu_s_per_gb", "load generator CPU-s/GB (one stream)", "CPU-s/GB", 3),
        /// The proxies' CPU per GB, one stream.
        CpuSPerGb => fig("cpu_s_per_gb", "proxy CPU-s/GB, one stream", "CPU-s/GB", 3).of_proxy(),
        /// The proxies' CPU per GB, N streams.
        CpuSPerGbN => fig("cpu_s_per_gb_n", "proxy CPU-s/GB, N streams", "CPU-s/GB", 3).of_proxy(),
        /// The proxies' CPU per 1,000 requests of the latency run.
        CpuSPer1kReq => fig("cpu_s_per_1k_req", "proxy CPU-s per 1k requests", "CPU-s", 4).of_proxy(),
        /// The proxies' CPU per connection of the connection-rate run.
        CpuUsPerConn => fig("cpu_us_per_conn", "proxy CPU-µs per new connection", "CPU-µs", 1).of_proxy(),
        /// RSS after start, before traffic.
        RssIdleMib => fig("rss_idle_mib", "proxy RSS idle", "MiB", 1).of_proxy(),
        /// RSS with the small idle count open.
        RssSmallMib => fig("rss_small_mib", "proxy RSS, idle conns (small)", "MiB", 1).of_proxy(),
        /// The large idle count reached (lowered to what the fd limit holds).
        IdleLargeN => fig("idle_large_n", "large idle count reached", "conns", 0),
        /// RSS with the large idle count open, measured.
        RssLargeMib => fig("rss_large_mib", "proxy RSS at the large idle count", "MiB", 1).of_proxy(),
        /// (RSS with the large count - RSS before) / count.
        KibPerIdleConn => fig("kib_per_idle_conn", "proxy KiB per idle connection (large count)", "KiB", 2).of_proxy(),
        /// The proxies' fds per idle connection (small count).
        FdsPerIdleConn => fig("fds_per_idle_conn", "proxy fds per idle connection", "fds", 2).of_proxy(),
        /// RSS at the target's idle count: measured, or extrapolated.
        RssTargetIdleMib => fig("rss_target_idle_mib", "proxy RSS at 10k idle conns (extrapolated unless the large count is 10k)", "MiB", 1).of_proxy(),
        /// RSS after every load run of the round (idle connections,
        /// throughput, latency, connection rate) and a quiet period.
        RssAfterLoadMib => fig("rss_after_load_mib", "proxy RSS after the load", "MiB", 1).of_proxy(),
        /// RSS after the load - RSS idle (before it).
        RssAfterLoadOverIdleMib => fig("rss_after_load_over_idle_mib", "proxy RSS after the load - idle", "MiB", 1).of_proxy(),
        /// The same for the anonymous part of RSS (`RssAnon`: heaps,
        /// stacks, buffers), leaving out the program's own pages that the
        /// load paged in (file-backed, shared with the page cache).
        RssAnonAfterLoadOverIdleMib => fig("rss_anon_after_load_over_idle_mib", "proxy anonymous RSS after the load - idle", "MiB", 1).of_proxy(),
        /// What the proxy still holds after the load, over idle: its heaps'
        /// live bytes (`ringway_heap_in_use_bytes`: the warm tunnels, the
        /// tables) and the program's own pages the load paged in
        /// (`RssFile`). One proxy only (its metrics are read).
        RssHeldAfterLoadMib => fig("rss_held_after_load_mib", "proxy still holds after the load (live heap + program pages, over idle)", "MiB", 1).of_proxy().where_measurable(),
        /// (RSS after the load - idle - still held) / idle: what the load
        /// left that the proxy does not hold (free memory kept resident).
        RssRestAfterLoadPct => fig("rss_rest_after_load_pct", "proxy RSS after the load beyond idle + still held, % of idle", "%", 1).of_proxy().where_measurable(),
    }
}

impl Datapath {
    /// The latency percentiles, in order (p50, p90, p99, p99.9, max).
    pub const LATENCY: [Datapath; 5] = [
        Datapath::LatP50Us,
        Datapath::LatP90Us,
        Datapath::LatP99Us,
        Datapath::LatP999Us,
        Datapath::LatMaxUs,
    ];
}

figures! {
    /// The scrape-impact run, each round: the same fixed-rate latency run
    /// without and with a concurrent `/metrics` + `/config_dump` scraper.
    pub enum Scrape in "scrape" {
        /// p50 without the scraper.
        OffP50Us => fig("scrape_off_p50_us", "p50 without scraper", "µs", 1),
        /// p50 with it.
        OnP50Us => fig("scrape_on_p50_us", "p50 with scraper", "µs", 1),
        /// p90 without.
        OffP90Us => fig("scrape_off_p90_us", "p90 without scraper", "µs", 1),
        /// p90 with.
        OnP90Us => fig("scrape_on_p90_us", "p90 with scraper", "µs", 1),
        /// p99 without.
        OffP99Us => fig("scrape_off_p99_us", "p99 without scraper", "µs", 1),
        /// p99 with.
        OnP99Us => fig("scrape_on_p99_us", "p99 with scraper", "µs", 1),
        /// p99.9 without.
        OffP999Us => fig("scrape_off_p999_us", "p99.9 without scraper", "µs", 1),
        /// p99.9 with.
        OnP999Us => fig("scrape_on_p999_us", "p99.9 with scraper", "µs", 1),
        /// max without.
        OffMaxUs => fig("scrape_off_max_us", "max without scraper", "µs", 1),
        /// max with.
        OnMaxUs => fig("scrape_on_max_us", "max with scraper", "µs", 1),
        /// The worker threads' CPU per 1,000 requests, without.
        OffWorkerCpu => fig("scrape_off_worker_cpu_s_per_1k_req", "worker threads' CPU-s per 1k requests without scraper", "CPU-s", 4),
        /// The same, with.
        OnWorkerCpu => fig("scrape_on_worker_cpu_s_per_1k_req", "worker threads' CPU-s per 1k requests with scraper", "CPU-s", 4),
        /// Scrapes done per second.
        ScrapesPerS => fig("scrapes_per_s", "scrapes achieved", "scrapes/s", 1),
        /// The `/metrics` body's size.
        MetricsKib => fig("metrics_kib", "/metrics body", "KiB", 1),
        /// One scrape's duration, median.
        ScrapeMsP50 => fig("scrape_ms_p50", "one scrape (GET /metrics + GET /config_dump), median", "ms", 2),
        /// The control threads' CPU per scrape.
        ControlCpuMsPerScrape => fig("control_cpu_ms_per_scrape", "control threads' CPU per scrape", "CPU-ms", 3),
    }
}

impl Scrape {
    /// Latency percentiles (p50 ... max) and worker CPU without (`false`)
    /// or with (`true`) the scraper.
    pub const fn side(with: bool) -> ([Scrape; 5], Scrape) {
        if with {
            (
                [
                    Scrape::OnP50Us,
                    Scrape::OnP90Us,
                    Scrape::OnP99Us,
                    Scrape::OnP999Us,
                    Scrape::OnMaxUs,
                ],
                Scrape::OnWorkerCpu,
            )
        } else {
            (
                [
                    Scrape::OffP50Us,
                    Scrape::OffP90Us,
                    Scrape::OffP99Us,
                    Scrape::OffP999Us,
                    Scrape::OffMaxUs,
                ],
                Scrape::OffWorkerCpu,
            )
        }
    }

    /// What the scraper itself did (the figures of one side only).
    pub const SCRAPER: [Scrape; 4] = [
        Scrape::ScrapesPerS,
        Scrape::MetricsKib,
        Scrape::ScrapeMsP50,
        Scrape::ControlCpuMsPerScrape,
    ];
}

figures! {
    /// Pod churn, each round: pods given to a proxy on its command line,
    /// and enrolled by CNI ADDs one after another.
    pub enum Churn in "churn" {
        /// Creating the pods' namespaces (the test bed's work, not the proxy's).
        NetnsCreateS => fig("netns_create_s", "creating the pod netns (test bed, not proxy)", "s", 2),
        /// Proxy start to every pod's listeners open.
        EnrollS => fig("enroll_s", "command line: proxy start to every pod's listeners open", "s", 3),
        /// The proxy's CPU for it.
        EnrollCpuS => fig("enroll_cpu_s", "command line: proxy CPU for it", "CPU-s", 3),
        /// RSS of a proxy without pods.
        RssEmptyMib => fig("rss_empty_mib", "command line: proxy RSS, no pods", "MiB", 1),
        /// RSS with every pod.
        RssPodsMib => fig("rss_pods_mib", "command line: proxy RSS, all pods", "MiB", 1),
        /// (RSS with the pods - without) / pods.
        KibPerPod => fig("kib_per_pod", "command line: proxy RSS per pod", "KiB", 1),
        /// One CNI ADD, call to result: p50.
        CniAddP50Ms => fig("cni_add_p50_ms", "CNI ADD latency p50", "ms", 2),
        /// p90.
        CniAddP90Ms => fig("cni_add_p90_ms", "CNI ADD latency p90", "ms", 2),
        /// p99.
        CniAddP99Ms => fig("cni_add_p99_ms", "CNI ADD latency p99", "ms", 2),
        /// max.
        CniAddMaxMs => fig("cni_add_max_ms", "CNI ADD latency max", "ms", 2),
        /// Every pod's ADD, one after another.
        CniAddTotalS => fig("cni_add_total_s", "CNI ADD: every pod, one after another", "s", 3),
        /// The proxy's RSS per pod enrolled through CNI.
        CniKibPerPod => fig("cni_kib_per_pod", "CNI ADD: proxy RSS per pod", "KiB", 1),
    }
}

impl Churn {
    /// The CNI ADD latency percentiles, in order (p50, p90, p99, max).
    pub const CNI_ADD: [Churn; 4] = [
        Churn::CniAddP50Ms,
        Churn::CniAddP90Ms,
        Churn::CniAddP99Ms,
        Churn::CniAddMaxMs,
    ];
}

/// How a derived figure relates to the baseline's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioKind {
    /// figure / baseline's.
    Ratio,
    /// figure - baseline's.
    Added,
}

impl RatioKind {
    /// The derived value of `figure` against `baseline`.
    pub fn of(self, figure: f64, baseline: f64) -> f64 {
        match self {
            RatioKind::Ratio => figure / baseline,
            RatioKind::Added => figure - baseline,
        }
    }
}

figures! {
    /// A scenario against its no-proxy baseline (`direct`, or
    /// `direct_2node` between nodes), from the printed medians.
    pub enum VsDirect in "vs-direct" {
        /// One stream / direct's.
        Tput1X => fig("tput1_x", "one stream vs direct", "x", 2),
        /// N streams / direct's.
        TputNX => fig("tputn_x", "N streams vs direct", "x", 2),
        /// Connections/s / direct's.
        ConnX => fig("conn_x", "connections/s vs direct", "x", 2),
        /// p50 - direct's.
        AddedP50Us => fig("added_p50_us", "added p50", "µs", 1),
        /// p99 - direct's.
        AddedP99Us => fig("added_p99_us", "added p99", "µs", 1),
    }
}

impl VsDirect {
    /// The figure it derives from, and how.
    pub const fn basis(self) -> (Datapath, RatioKind) {
        match self {
            VsDirect::Tput1X => (Datapath::Tput1Gbps, RatioKind::Ratio),
            VsDirect::TputNX => (Datapath::TputNGbps, RatioKind::Ratio),
            VsDirect::ConnX => (Datapath::ConnPerS, RatioKind::Ratio),
            VsDirect::AddedP50Us => (Datapath::LatP50Us, RatioKind::Added),
            VsDirect::AddedP99Us => (Datapath::LatP99Us, RatioKind::Added),
        }
    }
}

figures! {
    /// The scrape-impact run: with the scraper / without, from the printed
    /// medians.
    pub enum ScrapeRatio in "scrape ratio" {
        /// p50.
        P50 => fig("p50_x", "p50", "x", 2),
        /// p90.
        P90 => fig("p90_x", "p90", "x", 2),
        /// p99.
        P99 => fig("p99_x", "p99", "x", 2),
        /// p99.9.
        P999 => fig("p999_x", "p99.9", "x", 2),
        /// max.
        Max => fig("max_x", "max", "x", 2),
        /// The worker threads' CPU per 1,000 requests.
        WorkerCpu => fig("worker_cpu_x", "worker threads' CPU-s per 1k requests", "x", 2),
    }
}

impl ScrapeRatio {
    /// The figure without the scraper and with it.
    pub const fn pair(self) -> (Scrape, Scrape) {
        match self {
            ScrapeRatio::P50 => (Scrape::OffP50Us, Scrape::OnP50Us),
            ScrapeRatio::P90 => (Scrape::OffP90Us, Scrape::OnP90Us),
            ScrapeRatio::P99 => (Scrape::OffP99Us, Scrape::OnP99Us),
            ScrapeRatio::P999 => (Scrape::OffP999Us, Scrape::OnP999Us),
            ScrapeRatio::Max => (Scrape::OffMaxUs, Scrape::OnMaxUs),
            ScrapeRatio::WorkerCpu => (Scrape::OffWorkerCpu, Scrape::OnWorkerCpu),
        }
    }
}

figures! {
    /// The cross-check: each measured by the bundled generator and by a
    /// standard tool on the same path; where the suite measures the same
    /// figure, it is the suite's own definition.
    pub enum CrossCheck in "cross-check" {
        /// One stream (the bundled generator / `iperf3`).
        Tput1Gbps => Datapath::Tput1Gbps.def(),
        /// 4 streams (the bundled generator / `iperf3 -P 4`).
        Tput4Gbps => fig("tput4_gbps", "4 streams", "Gbit/s", 2),
        /// 64 B closed-loop ping-pong round trip, p50 (`sockperf`).
        PingPongP50Us => fig("pp_p50_us", "64 B ping-pong RTT p50", "µs", 2),
        /// The same, p99.
        PingPongP99Us => fig("pp_p99_us", "64 B ping-pong RTT p99", "µs", 2),
        /// New connections/s (`wrk` against nginx).
        ConnPerS => Datapath::ConnPerS.def(),
        /// The proxy's CPU per GB over the one-stream run.
        CpuSPerGb => Datapath::CpuSPerGb.def(),
    }
}

impl CrossCheck {
    /// How it compares to direct: a ratio, an added round trip, or not at
    /// all (direct has no proxy to spend CPU).
    pub const fn vs_direct(self) -> Option<RatioKind> {
        match self {
            CrossCheck::Tput1Gbps | CrossCheck::Tput4Gbps | CrossCheck::ConnPerS => {
                Some(RatioKind::Ratio)
            }
            CrossCheck::PingPongP50Us | CrossCheck::PingPongP99Us => Some(RatioKind::Added),
            CrossCheck::CpuSPerGb => None,
        }
    }
}

/// One round's values of figures of kind `F`, each set by the measurement
/// that produced it; a figure not set was not measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures<F: Figure>(BTreeMap<F, f64>);

impl<F: Figure> Default for Figures<F> {
    fn default() -> Self {
        Figures(BTreeMap::new())
    }
}

impl<F: Figure> Figures<F> {
    /// None measured yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `figure`.
    pub fn set(&mut self, figure: F, value: f64) {
        self.0.insert(figure, value);
    }

    /// `figure`, if measured.
    pub fn get(&self, figure: F) -> Option<f64> {
        self.0.get(&figure).copied()
    }

    /// `figure`, NaN when not measured.
    pub fn value(&self, figure: F) -> f64 {
        self.get(figure).unwrap_or(f64::NAN)
    }

    /// Whether none was measured.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `key=value` of each measured figure, for a progress line.
    pub fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(k, v)| format!("{}={v:.3}", k.key()))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl<F: Figure> FromIterator<(F, f64)> for Figures<F> {
    fn from_iter<I: IntoIterator<Item = (F, f64)>>(iter: I) -> Self {
        Figures(iter.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_unique<F: Figure>() {
        let mut keys: Vec<&str> = F::ALL.iter().map(|f| f.key()).collect();
        keys.sort_unstable();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "{}: a key is declared twice", F::SECTION);
        for f in F::ALL {
            assert_eq!(F::from_key(f.key()), Some(*f));
            let json = serde_json::to_string(f).unwrap();
            assert_eq!(json, format!("\"{}\"", f.key()));
            assert_eq!(serde_json::from_str::<F>(&json).unwrap(), *f);
        }
    }

    #[test]
    fn every_kind_has_unique_keys_that_read_back() {
        keys_unique::<Datapath>();
        keys_unique::<Scrape>();
        keys_unique::<Churn>();
        keys_unique::<VsDirect>();
        keys_unique::<ScrapeRatio>();
        keys_unique::<CrossCheck>();
    }

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let e = serde_json::from_str::<Churn>("\"enrol_s\"").unwrap_err();
        assert!(
            e.to_string().contains("unknown churn figure `enrol_s`"),
            "{e}"
        );
    }

    #[test]
    fn the_cross_check_shares_the_suites_figures() {
        assert_eq!(CrossCheck::Tput1Gbps.def(), Datapath::Tput1Gbps.def());
        assert_eq!(CrossCheck::ConnPerS.key(), Datapath::ConnPerS.key());
        assert!(CrossCheck::CpuSPerGb.def().proxy_only);
    }
}
