//! Shared helpers of ringway's benchmarks.

#![forbid(unsafe_code)]

use ringway_config::CaptureMode;
use ringway_testbed::Pod;

/// Installs the production capture rules in `pod`.
pub fn capture(pod: &Pod, mode: CaptureMode) {
    let spec = ringway_proxy::capture_spec(&ringway_config::ProxySettings {
        capture_mode: mode,
        ..ringway_config::ProxySettings::default()
    });
    ringway_redirect::apply(pod.netns.fd(), &spec).expect("capture rules");
}

/// CPU seconds (user + system) used so far by this process's threads whose
/// name starts with `prefix`.
pub fn cpu_seconds_of_threads(prefix: &str) -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let mut total = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    for e in dir.flatten() {
        let p = e.path();
        let Ok(comm) = std::fs::read_to_string(p.join("comm")) else {
            continue;
        };
        if !comm.trim().starts_with(prefix) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(p.join("stat")) else {
            continue;
        };
        // Fields after the ")" that closes the command name: utime is the
        // 14th field overall, stime the 15th.
        let Some(rest) = stat.rsplit(')').next() else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 12 {
            total += f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
        }
    }
    total as f64 / ticks
}

/// Median of a non-empty sample.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return f64::NAN;
    }
    s[s.len() / 2]
}
