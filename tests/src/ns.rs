//! Network namespaces for tests: the isolated world a test runs in, and the
//! named namespaces (node, pods) created inside it.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};

use crate::error::Error;

/// Where named namespaces are bind-mounted. Inside the test's private mount
/// namespace this directory is a fresh tmpfs, so nothing leaks to the host.
pub const NETNS_RUN_DIR: &str = "/run/netns";

/// A network namespace created by the test bed, pinned by an open fd and
/// bind-mounted at `/run/netns/<name>` (inside the private mount namespace)
/// so that `ip -n <name>` and CNI-style paths work.
#[derive(Debug, Clone)]
pub struct Netns {
    inner: Arc<NetnsInner>,
}

#[derive(Debug)]
struct NetnsInner {
    name: String,
    fd: OwnedFd,
    path: PathBuf,
}

impl Netns {
    /// Creates a fresh network namespace named `name` with `lo` up.
    pub fn create(name: &str) -> Result<Netns, Error> {
        let path = Path::new(NETNS_RUN_DIR).join(name);
        let path2 = path.clone();
        let fd = std::thread::scope(|s| {
            s.spawn(move || -> Result<OwnedFd, Error> {
                unshare(CloneFlags::CLONE_NEWNET)
                    .map_err(|e| Error::Sys("unshare(CLONE_NEWNET)", e))?;
                let f = File::open("/proc/thread-self/ns/net")
                    .map_err(|e| Error::Io("open /proc/thread-self/ns/net", e))?;
                File::create(&path2).map_err(|e| Error::Io("create netns mount point", e))?;
                mount(
                    Some("/proc/thread-self/ns/net"),
                    &path2,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
                .map_err(|e| Error::Sys("bind-mount netns", e))?;
                Ok(OwnedFd::from(f))
            })
            .join()
            .expect("netns creation thread panicked")
        })?;
        let ns = Netns {
            inner: Arc::new(NetnsInner {
                name: name.to_string(),
                fd,
                path,
            }),
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        // No duplicate address detection on the bed's links: a tentative
        // link-local address delays the first IPv6 neighbour resolution by
        // a second or two, which only adds noise to tests.
        for key in [
            "net/ipv6/conf/all/accept_dad",
            "net/ipv6/conf/default/accept_dad",
        ] {
            let _ = ns.sysctl(key, "0");
        }
        Ok(ns)
    }

    /// The namespace's name (as used with `ip -n`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The bind-mount path, `/run/netns/<name>` (what a runtime passes as CNI_NETNS).
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Borrows the namespace fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }

    /// A new owned fd referring to this namespace (e.g. to hand to the proxy).
    pub fn dup_fd(&self) -> Result<OwnedFd, Error> {
        self.inner
            .fd
            .try_clone()
            .map_err(|e| Error::Io("dup netns fd", e))
    }

    /// Runs `f` on a new thread that has entered this namespace and waits for it.
    pub fn run<T: Send, F: FnOnce() -> T + Send>(&self, f: F) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(self.fd(), CloneFlags::CLONE_NEWNET).expect("setns into test netns");
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Spawns `f` on a new thread inside this namespace.
    pub fn spawn<T: Send + 'static, F: FnOnce() -> T + Send + 'static>(
        &self,
        f: F,
    ) -> std::thread::JoinHandle<T> {
        let ns = self.clone();
        std::thread::spawn(move || {
            setns(ns.fd(), CloneFlags::CLONE_NEWNET).expect("setns into test netns");
            f()
        })
    }

    /// Runs `ip -n <name> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<String, Error> {
        let mut full = vec!["-n", self.name()];
        full.extend_from_slice(args);
        run_cmd("ip", &full)
    }

    /// Runs a batch of `ip` commands (one per line) inside this namespace.
    pub fn ip_batch(&self, lines: &[String]) -> Result<(), Error> {
        let input = lines.join("\n") + "\n";
        run_cmd_stdin("ip", &["-n", self.name(), "-batch", "-"], &input).map(|_| ())
    }

    /// Writes a sysctl (path relative to /proc/sys, dotted or slashed) inside this namespace.
    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), Error> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        self.run(|| std::fs::write(&path, value))
            .map_err(|e| Error::Io("write sysctl", e))
    }

    /// Reads a sysctl inside this namespace.
    pub fn read_sysctl(&self, key: &str) -> Result<String, Error> {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        self.run(|| std::fs::read_to_string(&path))
            .map(|s| s.trim().to_string())
            .map_err(|e| Error::Io("read sysctl", e))
    }

    /// Runs an arbitrary program inside this namespace and returns its stdout.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String, Error> {
        let mut full = vec!["netns", "exec", self.name(), program];
        full.extend_from_slice(args);
        run_cmd("ip", &full)
    }

    /// Runs `nft <args>` inside this namespace and returns its output. The
    /// `nft` binary only inspects rules in tests (the product programs them
    /// over netlink). Panics, naming the package, when it is not installed,
    /// and with nft's message when the command fails.
    pub fn nft(&self, args: &[&str]) -> String {
        require_nft();
        self.exec("nft", args)
            .unwrap_or_else(|e| panic!("nft {args:?} in {}: {e}", self.name()))
    }

    /// The handle of the `inet ringway` table, then those of its rules
    /// (tagged `ringway:v1:`), in listing order; empty without the table.
    /// Rule handles count from 1 again in a re-created table, the table's
    /// handle does not (a namespace's table handles only grow), so a
    /// re-apply shows there.
    pub fn ringway_handles(&self) -> Vec<String> {
        require_nft();
        self.exec("nft", &["-a", "list", "table", "inet", "ringway"])
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("table ") || l.contains("comment \"ringway:v1:"))
            .filter_map(|l| {
                l.rsplit_once("# handle ")
                    .map(|(_, h)| h.trim().to_string())
            })
            .collect()
    }

    /// The namespace inode, for identity comparisons.
    pub fn inode(&self) -> u64 {
        nix::sys::stat::fstat(self.inner.fd.as_raw_fd())
            .map(|s| s.st_ino)
            .unwrap_or(0)
    }
}

impl Drop for NetnsInner {
    fn drop(&mut self) {
        let _ = umount2(&self.path, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_file(&self.path);
    }
}

pub(crate) fn run_cmd(program: &str, args: &[&str]) -> Result<String, Error> {
    run_cmd_stdin(program, args, "")
}

pub(crate) fn run_cmd_stdin(program: &str, args: &[&str], stdin: &str) -> Result<String, Error> {
    use std::io::Write;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::Io("spawn helper program", e))?;
    if let Some(mut si) = child.stdin.take() {
        si.write_all(stdin.as_bytes())
            .map_err(|e| Error::Io("write helper stdin", e))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::Io("wait helper program", e))?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Moves the *calling thread* into fresh network and mount namespaces, makes
/// every mount private (so nothing propagates back to the host), and mounts a
/// tmpfs on /run/netns. Threads it spawns afterwards inherit both namespaces.
pub(crate) fn isolate_current_thread() -> Result<(), Error> {
    unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWNS)
        .map_err(|e| Error::Sys("unshare(CLONE_NEWNET|CLONE_NEWNS)", e))?;
    make_mounts_private()?;
    tmpfs(std::path::Path::new(NETNS_RUN_DIR), "mode=0755")?;
    run_cmd("ip", &["link", "set", "lo", "up"])?;
    Ok(())
}

/// Makes every mount of the calling thread's mount namespace private: what
/// is mounted from then on never propagates to the namespace it came from.
fn make_mounts_private() -> Result<(), Error> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| Error::Sys("make mounts private", e))
}

/// Mounts a tmpfs only the owner can enter (mode 0700) on `dir`, creating
/// it. Called inside the isolated mount namespace, whatever is written there
/// (a CA key, sockets, configuration) vanishes with the namespace, even if
/// the process crashes.
pub fn private_tmpfs(dir: &std::path::Path) -> Result<(), Error> {
    tmpfs(dir, "mode=0700")
}

fn tmpfs(dir: &std::path::Path, mode: &str) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io("creating a tmpfs mount point", e))?;
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(mode),
    )
    .map_err(|e| Error::Sys("mounting a tmpfs", e))
}

/// Makes `/etc/hosts` read `hosts` for the calling thread's mount
/// namespace (and the threads it starts): a bind mount of a file in
/// `scratch` over it, so a test can give a name several addresses of its
/// own namespaces. Refused outside a namespace of the test's own (the
/// host's file is never touched).
pub fn override_etc_hosts(scratch: &std::path::Path, hosts: &str) -> Result<(), Error> {
    let ns = |p: &str| std::fs::metadata(p).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let ours = ns("/proc/thread-self/ns/mnt").map_err(|e| Error::Io("reading the mount ns", e))?;
    // The process's main thread stays in the namespace the tests started in.
    let process =
        ns("/proc/self/ns/mnt").map_err(|e| Error::Io("reading the process's mount ns", e))?;
    if ours == process {
        return Err(Error::Io(
            "overriding /etc/hosts",
            std::io::Error::other("not in a mount namespace of the test's own"),
        ));
    }
    // Whoever isolated the thread, nothing mounted here propagates out.
    make_mounts_private()?;
    let file = scratch.join("hosts");
    std::fs::write(&file, hosts).map_err(|e| Error::Io("writing the hosts file", e))?;
    mount(
        Some(&file),
        "/etc/hosts",
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| Error::Sys("bind-mounting /etc/hosts", e))
}

/// The inode of the calling thread's current network namespace.
pub fn current_netns_inode() -> u64 {
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap_or(0)
}

/// Panics unless the `nft` binary runs: tests that inspect rules must fail
/// loudly without it, never pass on an empty listing.
pub fn require_nft() {
    if std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!(
            "the `nft` binary is required to inspect rules in tests: apt-get install -y nftables"
        );
    }
}
