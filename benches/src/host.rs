//! The bench process and the machine it runs on: progress lines, the fd
//! limit (raised so large idle counts fit, and why it could not be), a
//! tmpfs private to the bench's mount namespace, the machine's description
//! and how its idle CPUs wait, and its CPU counters. A leaf: it names no
//! other module of the crate.

use std::path::PathBuf;

use anyhow::Context;

/// A progress line on stderr (the report goes to stdout).
pub fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// RLIMIT_NOFILE as the run found and left it.
#[derive(Debug, Clone, Default)]
pub struct FdLimit {
    /// Soft limit in force (the bench's and, inherited, the proxies').
    pub soft: u64,
    /// Hard limit in force.
    pub hard: u64,
    /// `/proc/sys/fs/nr_open`: the most any process may be given.
    pub nr_open: u64,
    /// Whether CAP_SYS_RESOURCE (needed to raise the hard limit) is in this
    /// process's effective set.
    pub cap_sys_resource: bool,
    /// Whether it is in the bounding set (no process here can gain it otherwise).
    pub cap_sys_resource_bounding: bool,
}

impl FdLimit {
    /// Why `asked` idle connections may not be reachable, in one sentence.
    pub fn note(&self, asked: usize) -> String {
        let why = if self.cap_sys_resource {
            "raising it failed".to_string()
        } else if self.cap_sys_resource_bounding {
            "this process lacks CAP_SYS_RESOURCE, which raising a hard limit needs".to_string()
        } else {
            "CAP_SYS_RESOURCE, which raising a hard limit needs, is not even in this machine's \
             capability bounding set (CapBnd), so no process here, root included, can raise it"
                .to_string()
        };
        format!(
            "RLIMIT_NOFILE is {} (hard {}; fs.nr_open {}) and cannot be raised: {why}. \
             Every process (the load generator, each proxy) is capped at {} open fds, so the large \
             idle count ({asked} asked) is lowered per scenario to what its proxy's measured fds per \
             idle connection and the load generator's 2 allow (the count reached is in the table)",
            self.soft, self.hard, self.nr_open, self.soft
        )
    }
}

/// Whether capability `bit` is set in the `field` line of /proc/self/status.
fn has_cap(field: &str, bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|h| u64::from_str_radix(h, 16).ok())
        })
        .is_some_and(|mask| mask & (1 << bit) != 0)
}

/// Raises RLIMIT_NOFILE, soft and hard, to `want` (at most `nr_open`) so
/// large idle counts fit; the proxy children inherit it (and the proxy sets
/// its soft limit to its hard one). Raising the hard limit needs
/// CAP_SYS_RESOURCE; without it the soft limit goes up to the hard one.
pub fn raise_nofile(want: u64) -> FdLimit {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const CAP_SYS_RESOURCE: u32 = 24;
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 20);
    let want = want.min(nr_open);
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < want && setrlimit(Resource::RLIMIT_NOFILE, want, want.max(hard)).is_err() {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    FdLimit {
        soft,
        hard,
        nr_open,
        cap_sys_resource: has_cap("CapEff:", CAP_SYS_RESOURCE),
        cap_sys_resource_bounding: has_cap("CapBnd:", CAP_SYS_RESOURCE),
    }
}

/// The soft RLIMIT_NOFILE in force now.
pub fn nofile_soft() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(s, _)| s)
        .unwrap_or(1024)
}

/// Directory on a tmpfs private to the bench's mount namespace: the test CA
/// (key included) and the proxies' configuration files vanish with it.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Mounts it (inside the bench's isolated namespaces). Each one has a
    /// path of its own (`ringway-bench-<pid>-<n>`): two measurements of one
    /// process (the tests' binary) never mount on, nor remove, the same
    /// directory.
    pub fn new() -> anyhow::Result<Scratch> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ringway-bench-{}-{n}", std::process::id()));
        ringway_testbed::private_tmpfs(&dir).context("mounting the bench's tmpfs")?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The machine's description: (what, value) rows of the reports.
pub fn machine() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem = read("/proc/meminfo")
        .lines()
        .next()
        .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| format!("{:.1} GiB", k / 1024.0 / 1024.0))
        .unwrap_or_default();
    vec![
        ("CPUs".into(), cpus().to_string()),
        ("CPU".into(), cpu),
        ("memory".into(), mem),
        (
            "kernel".into(),
            read("/proc/sys/kernel/osrelease").trim().to_string(),
        ),
        (
            "load average at the end".into(),
            read("/proc/loadavg")
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        ),
    ]
}

/// CPUs this process may run on.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The CPU idle driver, governor and (with the `haltpoll` driver of a KVM
/// guest) how long an idle vCPU polls before it halts: waking a halted vCPU
/// takes a trip through the hypervisor, which can outweigh the proxy's own
/// work per message (benches/HISTORY.md, "What bounds a 64 B round trip on
/// a VM"), so latencies compare only between machines that idle alike.
pub fn cpu_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver");
    let governor = read("/sys/devices/system/cpu/cpuidle/current_governor");
    let mut s = format!("cpuidle driver {driver}, governor {governor}");
    if driver == "haltpoll" {
        let ns = read("/sys/module/haltpoll/parameters/guest_halt_poll_ns");
        s.push_str(&format!(", guest_halt_poll_ns {ns}"));
    }
    s
}

/// CPU-seconds the whole machine spent busy so far (`/proc/stat`: every
/// state but idle and iowait, all CPUs).
pub fn machine_busy_seconds() -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next() else {
        return f64::NAN;
    };
    let f: Vec<u64> = cpu
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest is in user).
    let busy: u64 = f
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| v)
        .sum();
    busy as f64 / ticks
}
