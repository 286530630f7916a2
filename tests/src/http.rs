//! The one HTTP/1.1 client of the tests and benches: a request with
//! `Connection: close` to the proxy's and agent's endpoints (metrics,
//! readiness, admin), the answer read to the end.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::prom::Metrics;
use crate::Error;

/// How long connecting, writing and reading may each take.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// An answer: status code, header block, body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code (0 when the status line was not HTTP).
    pub status: u16,
    /// The header lines, without the status line.
    pub head: String,
    /// Everything after the blank line.
    pub body: String,
}

impl Response {
    /// The value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// `GET path`.
pub fn get(addr: SocketAddr, path: &str) -> io::Result<Response> {
    request(addr, "GET", path, &[])
}

/// The body of `GET /metrics` at `addr`: an error when the endpoint does
/// not answer or answers another status than 200, never an empty page in
/// its place (a check that a counter is absent or zero must not pass
/// because the endpoint is down).
pub fn scrape(addr: SocketAddr) -> Result<String, Error> {
    let r = get(addr, "/metrics").map_err(|e| Error::Io("scraping /metrics", e))?;
    if r.status != 200 {
        return Err(Error::Status {
            path: "/metrics".into(),
            status: r.status,
            body: r.body,
        });
    }
    Ok(r.body)
}

/// [`scrape`], parsed.
pub fn scrape_metrics(addr: SocketAddr) -> Result<Metrics, Error> {
    Ok(Metrics::parse(&scrape(addr)?)?)
}

/// `method path` with `headers` (and `Content-Length: 0`), to `addr`.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: ringway\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    Ok(parse(&String::from_utf8_lossy(&raw)))
}

fn parse(raw: &str) -> Response {
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((raw, ""));
    let (status_line, head) = head.split_once("\r\n").unwrap_or((head, ""));
    let status = status_line
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Response {
        status,
        head: head.replace("\r\n", "\n"),
        body: body.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::ReadNoIntr;

    /// A metrics endpoint that is down, or answers an error, is an error.
    #[test]
    fn scrape_fails_when_the_endpoint_is_down_or_errs() {
        crate::run_isolated("scrape_fails_when_the_endpoint_is_down_or_errs", || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            drop(l);
            assert!(matches!(scrape(addr), Err(Error::Io(..))));
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read_no_intr(&mut buf).unwrap();
                s.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown")
                    .unwrap();
            });
            let e = scrape(addr).unwrap_err();
            server.join().unwrap();
            assert!(matches!(e, Error::Status { status: 503, .. }), "{e}");
        });
    }

    #[test]
    fn parses_status_headers_and_body() {
        let r = parse("HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nX-A: b\r\n\r\nnot ready\n");
        assert_eq!(r.status, 503);
        assert_eq!(r.header("Content-Type"), Some("text/plain"));
        assert_eq!(r.header("x-a"), Some("b"));
        assert_eq!(r.body, "not ready\n");
        assert_eq!(parse("garbage").status, 0);
    }
}
