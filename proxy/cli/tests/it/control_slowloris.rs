//! A slowloris against the real `ringway agent`'s control port (15022,
//! the kubelet's probes and Prometheus), inside the test's own network
//! namespace: thousands of connections that send nothing or half a request
//! must not run the agent out of fds nor keep `/healthz/live` from
//! answering, and the idle ones must be closed after the header timeout.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use ringway_testbed::run_isolated;

use crate::support;

/// Connections the attacker opens.
const FLOOD: usize = 2_000;
/// The soft fd limit the agent is started with (a common default).
const AGENT_SOFT_NOFILE: u64 = 1024;

struct Agent {
    child: support::Proc,
    _dir: ringway_testbed::TempDir,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// (soft, hard) "Max open files" of the running agent.
    fn nofile(&self) -> (String, String) {
        let limits = std::fs::read_to_string(format!("/proc/{}/limits", self.pid())).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .to_string();
        let f: Vec<&str> = line.split_whitespace().collect();
        (f[3].to_string(), f[4].to_string())
    }
}

/// Starts `ringway agent` with a soft fd limit of [`AGENT_SOFT_NOFILE`]
/// (set on this process around the spawn; the child inherits it).
fn start_agent(addr: SocketAddr) -> Agent {
    let dir = ringway_testbed::TempDir::new("slowloris");
    std::fs::create_dir_all(dir.join("netns")).unwrap();
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert!(
        hard >= AGENT_SOFT_NOFILE + 3 * FLOOD as u64,
        "the hard fd limit {hard} is too low for this test"
    );
    setrlimit(Resource::RLIMIT_NOFILE, AGENT_SOFT_NOFILE, hard).unwrap();
    let spawned = support::agent_command(&dir, &dir.join("netns"), &dir.join("agent.log"))
        .args(["--metrics-addr", &addr.to_string()])
        .spawn();
    // This process needs room for the flood (both ends are not here, only
    // the client ends, but keep a margin).
    setrlimit(Resource::RLIMIT_NOFILE, hard.max(soft), hard).unwrap();
    let agent = Agent {
        child: support::Proc(spawned.unwrap()),
        _dir: dir,
    };
    // No proxy connects in this test: the agent serves (live) but is not
    // ready; its liveness probe is what the kubelet restarts it by.
    ringway_testbed::wait_for(
        "the agent's /healthz/live to answer 200",
        Duration::from_secs(60),
        || support::live(addr),
    );
    agent
}

/// One probe as the kubelet sends it: a fresh connection, the whole request,
/// a 2 s timeout. Returns the status line or why there is none.
fn probe(addr: SocketAddr) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    s.write_all(b"GET /healthz/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {e} (got {out:?})"))?;
    Ok(out.lines().next().unwrap_or("").to_string())
}

/// Whether the server has closed `s` (EOF or reset), without blocking.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 512];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == ErrorKind::WouldBlock => false,
        Err(_) => true,
    }
}

#[test]
fn adversarial_control_port_slowloris() {
    // It lowers this process's fd limit around the agent's spawn and then
    // holds thousands of sockets: no other test may run beside it.
    let _alone = ringway_testbed::exclusive::alone();
    run_isolated("adversarial_control_port_slowloris", || {
        let addr: SocketAddr = "127.0.0.1:15022".parse().unwrap();
        let mut agent = start_agent(addr);

        // The flood: every other connection sends half a request's headers
        // and stops; the rest send nothing.
        let mut flood = Vec::with_capacity(FLOOD);
        let mut refused = 0;
        for i in 0..FLOOD {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(3)) {
                Ok(mut s) => {
                    if i % 2 == 0 {
                        let _ = s.write_all(b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n");
                    }
                    s.set_nonblocking(true).unwrap();
                    flood.push(s);
                }
                Err(_) => {
                    // The backlog is full: the agent stopped accepting.
                    // Bounded: a few more seconds of trying, not minutes.
                    refused += 1;
                    if refused >= 3 {
                        break;
                    }
                }
            }
        }
        eprintln!(
            "flood: {} connections open, {refused} connects timed out",
            flood.len()
        );

        // The probe still answers while the flood holds its connections.
        let t0 = Instant::now();
        let mut answers = Vec::new();
        let ok = loop {
            let r = probe(addr);
            let ok = matches!(&r, Ok(line) if line.starts_with("HTTP/1.1 200"));
            answers.push(r);
            if ok || t0.elapsed() > Duration::from_secs(5) {
                break ok;
            }
        };
        let fds = agent.open_fds();
        let (soft, hard) = agent.nofile();
        eprintln!("agent: {fds} fds open, RLIMIT_NOFILE {soft} / {hard}");
        assert!(
            ok,
            "/healthz/live did not answer 200 during the flood: {answers:?} (agent fds {fds})"
        );
        assert!(
            agent.child.0.try_wait().unwrap().is_none(),
            "the agent exited"
        );
        // The agent raised its soft limit as the proxy does.
        assert_eq!(soft, hard, "the agent kept a soft fd limit of {soft}");
        // The connection cap holds the agent's fds, whatever the flood.
        assert!(
            fds < 600,
            "the agent holds {fds} fds for {FLOOD} idle connections"
        );

        // Idle and partial connections are closed by the header timeout:
        // wait, bounded, for every one of them to see EOF or a reset.
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut open: Vec<TcpStream> = flood;
        while !open.is_empty() && Instant::now() < deadline {
            open.retain_mut(|s| !closed(s));
            if !open.is_empty() {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        assert!(
            open.is_empty(),
            "{} idle connections still open 20 s after the flood",
            open.len()
        );
        // And the port serves as before.
        assert!(matches!(probe(addr), Ok(l) if l.starts_with("HTTP/1.1 200")));
    });
}
