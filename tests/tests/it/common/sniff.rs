//! Frames seen in a test's own namespaces: an AF_PACKET sniffer and the
//! TCP segments of what it saw.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::TIMEOUT;

/// Captures every frame on every interface of a netns (AF_PACKET) from a
/// thread inside it, until stopped; returns the frames, each with whether it
/// was seen on the link device named at start.
pub struct Sniffer {
    stop: Arc<AtomicBool>,
    join: std::thread::JoinHandle<Vec<(bool, Vec<u8>)>>,
}

impl Sniffer {
    pub fn start(ns: &ringway_testbed::Netns, link_dev: &str) -> Sniffer {
        let link_dev = link_dev.to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let join = ns.spawn(move || {
            use socket2::{Domain, Protocol, Socket, Type};
            // ETH_P_ALL in network byte order.
            let eth_p_all = (libc::ETH_P_ALL as u16).to_be() as i32;
            let s = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(eth_p_all)))
                .expect("AF_PACKET socket");
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            // Best effort (capped by net.core.rmem_max): fewer drops in bursts.
            let _ = s.set_recv_buffer_size(8 << 20);
            let link =
                nix::net::if_::if_nametoindex(link_dev.as_str()).expect("link device") as usize;
            ready_tx.send(()).unwrap();
            let mut frames = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(120);
            let mut buf = vec![0u8; 65536];
            while Instant::now() < deadline {
                // Frames are queued on the socket as they are sent: once
                // stopped, what is queued is still read (a sniffer that
                // fell behind on a busy machine lost the tail of the last
                // connection), until a read finds nothing.
                let stopping = st.load(Ordering::SeqCst);
                // The sender's link-layer address names the interface.
                use std::os::fd::AsRawFd;
                match nix::sys::socket::recvfrom::<nix::sys::socket::LinkAddr>(
                    s.as_raw_fd(),
                    &mut buf,
                ) {
                    Ok((n, from)) => {
                        let on_link = from.is_some_and(|a| a.ifindex() == link);
                        frames.push((on_link, buf[..n].to_vec()));
                    }
                    Err(_) if stopping => break,
                    Err(_) => {}
                }
            }
            frames
        });
        ready_rx.recv_timeout(TIMEOUT).expect("sniffer ready");
        Sniffer { stop, join }
    }

    pub fn finish(self) -> Vec<(bool, Vec<u8>)> {
        self.stop.store(true, Ordering::SeqCst);
        self.join.join().expect("sniffer thread")
    }
}

/// One TCP segment of an IPv4 frame.
pub struct Seg {
    pub src: (IpAddr, u16),
    pub dst: (IpAddr, u16),
    /// Payload bytes.
    pub len: usize,
    pub fin: bool,
    pub syn: bool,
}

/// The TCP segment of an IPv4 frame (Ethernet header first; `lo` too).
pub fn tcp_segment(f: &[u8]) -> Option<Seg> {
    if f.len() < 14 + 20 || f[12] != 0x08 || f[13] != 0x00 {
        return None;
    }
    let ip = &f[14..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ip[9] != 6 || ip.len() < ihl + 20 {
        return None;
    }
    let tcp = &ip[ihl..];
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let thl = usize::from(tcp[12] >> 4) * 4;
    Some(Seg {
        src: (
            IpAddr::from([ip[12], ip[13], ip[14], ip[15]]),
            u16::from_be_bytes([tcp[0], tcp[1]]),
        ),
        dst: (
            IpAddr::from([ip[16], ip[17], ip[18], ip[19]]),
            u16::from_be_bytes([tcp[2], tcp[3]]),
        ),
        len: total.saturating_sub(ihl + thl),
        fin: tcp[13] & 0x01 != 0,
        syn: tcp[13] & 0x02 != 0,
    })
}

/// TCP payload bytes of the IPv4 frames to `dst:port`.
pub fn tcp_to_port<'a>(frames: impl Iterator<Item = &'a Vec<u8>>, dst: IpAddr, port: u16) -> u64 {
    frames
        .filter_map(|f| tcp_segment(f))
        .filter(|s| s.dst == (dst, port))
        .map(|s| s.len as u64)
        .sum()
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The segments of each TCP connection to `dst`, by client port, in the
/// order seen (`frames` deduplicated: `lo` shows each frame twice).
pub fn connections_to(frames: &[(bool, Vec<u8>)], dst: (IpAddr, u16)) -> Vec<(u16, Vec<Seg>)> {
    let mut once: Vec<&Vec<u8>> = frames.iter().map(|(_, f)| f).collect();
    once.dedup();
    let mut conns: Vec<(u16, Vec<Seg>)> = Vec::new();
    for seg in once.into_iter().filter_map(|f| tcp_segment(f)) {
        if seg.dst != dst {
            continue;
        }
        let port = seg.src.1;
        match conns.iter_mut().find(|(p, _)| *p == port) {
            Some((_, segs)) => segs.push(seg),
            None => conns.push((port, vec![seg])),
        }
    }
    conns
}

/// What follows each connection's SYN: whether its first other segment
/// carries bytes (`true`) or is the handshake's bare ACK (`false`).
pub fn first_segment_after_syn_carries_bytes(conns: &[(u16, Vec<Seg>)]) -> Vec<bool> {
    conns
        .iter()
        .filter(|(_, segs)| segs.first().is_some_and(|s| s.syn))
        .map(|(port, segs)| {
            let next = segs
                .iter()
                .find(|s| !s.syn)
                .unwrap_or_else(|| panic!("connection from port {port}: nothing after its SYN"));
            next.len > 0
        })
        .collect()
}

/// A client that writes at once after connecting, as the proxy does with
/// bytes in hand: its handshake's last ACK waits for its first bytes, so
/// the proxy's accept finds them with the connection (what the proxy then
/// has in hand does not depend on how fast the test thread writes).
pub fn connect_with_bytes_ready(addr: SocketAddr) -> std::io::Result<std::net::TcpStream> {
    let s = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )?;
    s.set_quickack(false)?;
    s.connect_timeout(&addr.into(), TIMEOUT)?;
    Ok(s.into())
}

/// `rounds` connections whose client speaks first, then `rounds` to an app
/// that speaks first, from `client` to an app listening on `addr` in
/// `server`, sniffed in `server` (every interface): the frames seen. The
/// client-first ones connect with [`connect_with_bytes_ready`]; each app
/// answers `ok` and closes; every exchange is checked.
pub fn first_bytes_rounds(
    client: &ringway_testbed::Netns,
    server: &ringway_testbed::Netns,
    addr: SocketAddr,
    rounds: usize,
) -> Vec<(bool, Vec<u8>)> {
    use ringway_testbed::traffic::{connect, listen};
    use std::io::{Read, Write};
    const REQUEST: &[u8] = b"GET / HTTP/1.0\r\n\r\n";
    const BANNER: &[u8] = b"220 ready\r\n";
    let l = server.run(|| listen(addr)).unwrap();
    let sniffer = Sniffer::start(server, "lo");
    let app = std::thread::spawn(move || -> std::io::Result<()> {
        for round in 0..2 * rounds {
            let (mut s, _) = l.accept()?;
            s.set_read_timeout(Some(TIMEOUT))?;
            if round >= rounds {
                s.write_all(BANNER)?;
            }
            let mut req = [0u8; 64];
            let n = s.read(&mut req)?;
            assert!(n > 0, "round {round}: the client's bytes");
            s.write_all(b"ok")?;
        }
        Ok(())
    });
    for round in 0..2 * rounds {
        let speaks_first = round < rounds;
        let got = client
            .run(|| -> std::io::Result<Vec<u8>> {
                let mut s = if speaks_first {
                    connect_with_bytes_ready(addr)?
                } else {
                    connect(addr, TIMEOUT)?
                };
                s.set_read_timeout(Some(TIMEOUT))?;
                let mut got = Vec::new();
                if !speaks_first {
                    let mut banner = vec![0u8; BANNER.len()];
                    s.read_exact(&mut banner)?;
                    got.extend_from_slice(&banner);
                }
                s.write_all(REQUEST)?;
                s.read_to_end(&mut got)?;
                Ok(got)
            })
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let want: &[u8] = if speaks_first {
            b"ok"
        } else {
            b"220 ready\r\nok"
        };
        assert_eq!(got, want, "round {round}");
    }
    app.join().unwrap().unwrap();
    sniffer.finish()
}
