//! Helpers shared by the process-level drills.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Whether the readiness endpoint at `addr` answers 200.
pub fn ready(addr: SocketAddr) -> bool {
    answers_200(addr, "/healthz/ready")
}

/// Whether the agent's liveness endpoint at `addr` answers 200 (it serves,
/// with or without a proxy).
pub fn live(addr: SocketAddr) -> bool {
    answers_200(addr, "/healthz/live")
}

fn answers_200(addr: SocketAddr, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

/// Echo server on `l`: every connection echoes what it reads until EOF,
/// until `stop` is set.
pub fn echo_server(l: TcpListener, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    l.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            match l.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 4096];
                        while let Ok(n) = s.read(&mut buf) {
                            if n == 0 || s.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    })
}
