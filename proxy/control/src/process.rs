//! The standard process metrics (`process_*`), read from `/proc/self` at
//! scrape time: every ringway process registers [`ProcessCollector`].

/// The standard process metrics of the running process, read from
/// `/proc/self` at scrape time: `process_cpu_seconds_total`,
/// `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
/// `process_open_fds`, `process_max_fds`, `process_start_time_seconds`.
/// Register it with `Registry::register_collector`; the proxy's registry
/// has it, and the binary adds it to the agent's. A value that cannot be
/// read is left out of that scrape.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

/// What [`ProcessCollector`] reads from `/proc/self`.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    /// User + system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<i64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<i64>,
    /// Open file descriptors.
    pub open_fds: Option<i64>,
    /// The soft RLIMIT_NOFILE.
    pub max_fds: Option<i64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
}

impl ProcessSample {
    /// Reads the running process's figures.
    pub fn read() -> ProcessSample {
        use nix::unistd::{sysconf, SysconfVar};
        let ticks = sysconf(SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)
            .unwrap_or(100) as f64;
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .filter(|p| *p > 0)
            .unwrap_or(4096) as i64;
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        // Fields after the command name (which may hold spaces and ')'):
        // index 0 is field 3 (state) of proc(5), so field N is at N - 3.
        let fields: Vec<&str> = stat
            .as_deref()
            .and_then(|s| s.rsplit_once(')'))
            .map(|(_, rest)| rest.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let cpu_seconds = match (field(14), field(15)) {
            (Some(u), Some(s)) => Some((u + s) as f64 / ticks),
            _ => None,
        };
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        let start_time_seconds = match (boot, field(22)) {
            (Some(b), Some(st)) => Some(b as f64 + st as f64 / ticks),
            _ => None,
        };
        let statm = std::fs::read_to_string("/proc/self/statm").ok();
        let statm_field = |i: usize| {
            statm
                .as_deref()
                .and_then(|s| s.split_whitespace().nth(i))
                .and_then(|v| v.parse::<i64>().ok())
                .map(|pages| pages.saturating_mul(page))
        };
        let open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as i64);
        let max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .ok()
            .map(|(soft, _)| i64::try_from(soft).unwrap_or(i64::MAX));
        ProcessSample {
            cpu_seconds,
            resident_bytes: statm_field(1),
            virtual_bytes: statm_field(0),
            open_fds,
            max_fds,
            start_time_seconds,
        }
    }
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let p = ProcessSample::read();
        if let Some(v) = p.cpu_seconds {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                c.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                p.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                p.virtual_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                p.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (soft RLIMIT_NOFILE)",
                p.max_fds,
            ),
        ];
        for (name, help, v) in gauges {
            if let Some(v) = v {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
            }
        }
        if let Some(v) = p.start_time_seconds {
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    /// Every figure is read, in both formats, under the standard names.
    #[test]
    fn process_metrics_are_read_and_encoded_in_both_formats() {
        let mut r = Registry::default();
        r.register_collector(Box::new(ProcessCollector));
        let om = crate::encode(&r, true);
        let prom = crate::encode(&r, false);
        assert!(om.trim_end().ends_with("# EOF"), "{om}");
        assert!(!prom.contains("# EOF"), "{prom}");
        for text in [&om, &prom] {
            for name in [
                "process_cpu_seconds_total ",
                "process_resident_memory_bytes ",
                "process_virtual_memory_bytes ",
                "process_open_fds ",
                "process_max_fds ",
                "process_start_time_seconds ",
            ] {
                assert!(
                    text.lines().any(|l| l.starts_with(name)),
                    "{name}missing: {text}"
                );
            }
        }
        assert!(om.contains("# TYPE process_cpu_seconds counter"), "{om}");
        assert!(
            prom.contains("# TYPE process_cpu_seconds_total counter"),
            "{prom}"
        );
        let p = ProcessSample::read();
        let (soft, _) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(p.max_fds, Some(soft as i64));
        assert!(p.open_fds.unwrap() >= 3, "{p:?}");
        assert!(p.resident_bytes.unwrap() > 0, "{p:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = p.start_time_seconds.unwrap();
        assert!(
            started <= now + 1.0 && started > now - 86400.0 * 365.0,
            "{started} vs {now}"
        );
        assert!(p.cpu_seconds.unwrap() >= 0.0);
        assert_eq!(
            crate::content_type(false),
            "text/plain; version=0.0.4; charset=utf-8"
        );
    }
}
