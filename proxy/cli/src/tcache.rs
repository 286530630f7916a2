//! The proxy runs with glibc's per-thread cache (tcache) off.
//!
//! glibc keeps, on every thread, up to 7 freed chunks of each small size
//! (up to 1,032 bytes) for that thread's next `malloc`. To the arena those
//! chunks are still in use: after a load, the ones a worker kept are
//! scattered across its heap, split the free space around them and keep
//! their pages resident, so `malloc_trim` (the idle trim) cannot give them
//! back. Measured on HBONE (benches/HISTORY.md, "glibc's per-thread cache
//! and the memory after the load"): 3.0 MiB stayed over the fresh proxy's
//! RSS after a burst with the cache, 0.8 MiB without it, and neither the
//! connection rate nor the CPU per GB moved beyond the noise.
//!
//! glibc reads its tunables once, when the program starts, so `ringway
//! proxy` executes itself again, before it does anything else, with
//! `GLIBC_TUNABLES=glibc.malloc.tcache_count=0`, unless `GLIBC_TUNABLES` is
//! already set: an operator who sets glibc's tunables keeps exactly theirs
//! (add `glibc.malloc.tcache_count=0` to them to keep the cache off). A set
//! variable is never changed, so the program is executed again at most
//! once. The variable cannot be amended instead: glibc 2.36 rewrites it in
//! place at start, and the program then sees only its first tunable (all of
//! them still apply).

use std::ffi::{OsStr, OsString};

/// The variable the proxy runs with when none is set.
pub(crate) const TCACHE_OFF: &str = "glibc.malloc.tcache_count=0";

/// What [`reexec_with_tcache_off`] found, for the log once it is set up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tcache {
    /// The cache is off: this is the program executed again.
    Off,
    /// `GLIBC_TUNABLES` was set by whoever started the proxy (as much of
    /// it as glibc leaves visible): left as it is.
    Operators(String),
    /// The program could not be executed again: why. It runs on with the
    /// cache (more memory stays after a load; nothing else changes).
    NotReexecuted(String),
}

/// The `GLIBC_TUNABLES` to execute the program again with, or `None` when
/// it is set already (`current`, empty counts as unset).
pub(crate) fn tunables_to_set(current: Option<&OsStr>) -> Option<OsString> {
    match current {
        Some(c) if !c.is_empty() => None,
        _ => Some(TCACHE_OFF.into()),
    }
}

/// Executes this program again, same arguments and `argv[0]`, with the
/// cache off; returns only when it was not executed again.
pub(crate) fn reexec_with_tcache_off() -> Tcache {
    let current = std::env::var_os("GLIBC_TUNABLES");
    let Some(tunables) = tunables_to_set(current.as_deref()) else {
        let current = current.unwrap_or_default();
        return if current == TCACHE_OFF {
            Tcache::Off
        } else {
            Tcache::Operators(current.to_string_lossy().into_owned())
        };
    };
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return Tcache::NotReexecuted("not a glibc build".into());
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return Tcache::NotReexecuted(format!("its path is unknown: {e}")),
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    use std::os::unix::process::CommandExt;
    let e = std::process::Command::new(&exe)
        .arg0(argv0)
        .args(args)
        .env("GLIBC_TUNABLES", tunables)
        .exec();
    Tcache::NotReexecuted(format!("executing {} again: {e}", exe.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_tunables_turn_the_cache_off() {
        assert_eq!(tunables_to_set(None), Some(TCACHE_OFF.into()));
        assert_eq!(
            tunables_to_set(Some(OsStr::new(""))),
            Some(TCACHE_OFF.into())
        );
        assert_eq!(TCACHE_OFF, "glibc.malloc.tcache_count=0");
    }

    /// Set tunables are never changed (nor is the program executed again:
    /// that also ends the re-execution, whose own variable is set).
    #[test]
    fn set_tunables_are_kept() {
        for set in [
            "glibc.malloc.tcache_count=3",
            "glibc.malloc.arena_max=2",
            TCACHE_OFF,
        ] {
            assert_eq!(tunables_to_set(Some(OsStr::new(set))), None, "{set}");
        }
    }
}
