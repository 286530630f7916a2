//! The CONNECT request headers of the reference wire format: `forwarded`, `baggage`,
//! `traceparent`, and their encoding and strict/lenient parsing.
//!
//! - `forwarded` is security relevant (the server spoofs that source toward the app), so its
//!   parser is strict: exactly one header, one element, one `for` parameter holding an IP
//!   literal with an optional port; anything else is a 400.
//! - `baggage` and `traceparent` are telemetry: malformed values are logged and ignored.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use crate::HboneError;

/// Header names (lower case, as HTTP/2 sends them).
pub const FORWARDED: &str = "forwarded";
/// W3C baggage header.
pub const BAGGAGE: &str = "baggage";
/// W3C trace context header.
pub const TRACEPARENT: &str = "traceparent";

/// What the client proxy tells the server about a proxied connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectHeaders {
    /// The original destination `ip:port` (`:authority`).
    pub authority: SocketAddr,
    /// The client's address (`forwarded: for="…"`), so the server can spoof it.
    pub forwarded_for: Option<SocketAddr>,
    /// The service host name the client connected to (`forwarded: …;host=`),
    /// sent with `for` only; telemetry (the server's metrics), never trusted.
    pub forwarded_host: Option<String>,
    /// Names of the source workload (`baggage`).
    pub baggage: Baggage,
    /// The trace context; `None` sends a fresh random one (new per connection).
    pub traceparent: Option<TraceParent>,
}

impl ConnectHeaders {
    /// Headers for `authority` with nothing else known; a new trace id is made when sent.
    pub fn new(authority: SocketAddr) -> Self {
        ConnectHeaders {
            authority,
            forwarded_for: None,
            forwarded_host: None,
            baggage: Baggage::default(),
            traceparent: None,
        }
    }

    /// Sets `forwarded: for=`.
    pub fn forwarded_for(mut self, client: SocketAddr) -> Self {
        self.forwarded_for = Some(client);
        self
    }

    /// Sets `forwarded: …;host=` (a host name: token characters only, else
    /// it is not sent).
    pub fn forwarded_host(mut self, host: &str) -> Self {
        self.forwarded_host = Some(host.to_owned());
        self
    }

    /// Sets the baggage.
    pub fn baggage(mut self, baggage: Baggage) -> Self {
        self.baggage = baggage;
        self
    }

    /// Builds the HTTP/2 CONNECT request.
    pub(crate) fn to_request(&self) -> Result<http::Request<()>, HboneError> {
        let mut b = http::Request::builder()
            .method(http::Method::CONNECT)
            .uri(self.authority.to_string())
            .version(http::Version::HTTP_2);
        if let Some(f) = self.forwarded_for {
            let mut v = format_forwarded(f);
            if let Some(h) = self.forwarded_host.as_deref().filter(|h| valid_host(h)) {
                v.push_str(";host=");
                v.push_str(h);
            }
            b = b.header(FORWARDED, v);
        }
        let baggage = self.baggage.encode()?;
        if !baggage.is_empty() {
            b = b.header(BAGGAGE, baggage);
        }
        let tp = self.traceparent.unwrap_or_else(TraceParent::random);
        b = b.header(TRACEPARENT, tp.to_string());
        b.body(()).map_err(|e| HboneError::InvalidHeader {
            name: "request",
            reason: e.to_string(),
        })
    }
}

/// `for="1.2.3.4:80"` or `for="[2001:db8::1]:80"` (quoted, as RFC 7239 requires for `:`).
pub fn format_forwarded(client: SocketAddr) -> String {
    format!("for=\"{client}\"")
}

/// The longest `host=` taken (a DNS name's limit).
pub const MAX_FORWARDED_HOST: usize = 253;

fn valid_host(h: &str) -> bool {
    !h.is_empty() && h.len() <= MAX_FORWARDED_HOST && h.bytes().all(is_tchar)
}

/// The `host=` parameter of the request's one `forwarded` header: lenient
/// (telemetry), `None` when absent, repeated, malformed or longer than
/// [`MAX_FORWARDED_HOST`]. The caller trusts it no further than the
/// services of the destination it already knows.
pub fn parse_forwarded_host(headers: &http::HeaderMap) -> Option<String> {
    let mut values = headers.get_all(FORWARDED).iter();
    let v = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let mut found = None;
    for pair in split_unquoted(v, ';') {
        let Some((name, val)) = pair.trim().split_once('=') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("host") {
            if found.is_some() {
                return None;
            }
            found = Some(unquote(val.trim())?);
        }
    }
    found.filter(|h| valid_host(h))
}

/// Why a `forwarded` header was rejected (the 400's logged reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardedError {
    /// More than one `forwarded` header line.
    #[error("more than one forwarded header")]
    Repeated,
    /// Not visible ASCII.
    #[error("forwarded header is not ASCII")]
    NotAscii,
    /// More than one element (`for=a, for=b`): a client proxy sends exactly one.
    #[error("forwarded header has more than one element")]
    MultipleElements,
    /// A parameter that is not `name=value`, or a repeated parameter.
    #[error("malformed forwarded parameter {0:?}")]
    MalformedParam(String),
    /// No `for` parameter.
    #[error("forwarded header has no for= parameter")]
    MissingFor,
    /// `for` is not an IP literal with an optional port (e.g. `unknown`, `_hidden`, a name).
    #[error("forwarded for= is not an IP address with optional port: {0:?}")]
    BadNode(String),
}

/// Parses all `forwarded` header values of a request. `Ok(None)` when absent.
pub fn parse_forwarded_headers(
    headers: &http::HeaderMap,
) -> Result<Option<SocketAddr>, ForwardedError> {
    let mut values = headers.get_all(FORWARDED).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ForwardedError::Repeated);
    }
    let s = v.to_str().map_err(|_| ForwardedError::NotAscii)?;
    parse_forwarded(s).map(Some)
}

/// Parses one `forwarded` value into the client address. A bare IP gets port 0
/// ("any port" when spoofing).
pub fn parse_forwarded(value: &str) -> Result<SocketAddr, ForwardedError> {
    if value.contains(',') && !in_quotes_only(value, ',') {
        return Err(ForwardedError::MultipleElements);
    }
    let mut found = None;
    for pair in split_unquoted(value, ';') {
        let pair = pair.trim();
        if pair.is_empty() {
            return Err(ForwardedError::MalformedParam(pair.to_string()));
        }
        let (name, val) = pair
            .split_once('=')
            .ok_or_else(|| ForwardedError::MalformedParam(pair.to_string()))?;
        let name = name.trim();
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(ForwardedError::MalformedParam(pair.to_string()));
        }
        let val = unquote(val.trim()).ok_or_else(|| ForwardedError::MalformedParam(pair.into()))?;
        if name.eq_ignore_ascii_case("for") {
            if found.is_some() {
                return Err(ForwardedError::MalformedParam(pair.to_string()));
            }
            found = Some(parse_node(&val)?);
        }
    }
    found.ok_or(ForwardedError::MissingFor)
}

fn parse_node(node: &str) -> Result<SocketAddr, ForwardedError> {
    if let Ok(sa) = node.parse::<SocketAddr>() {
        return Ok(sa);
    }
    if let Some(inner) = node.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        if let Ok(ip) = inner.parse::<std::net::Ipv6Addr>() {
            return Ok(SocketAddr::new(IpAddr::V6(ip), 0));
        }
    }
    if let Ok(ip) = node.parse::<std::net::Ipv4Addr>() {
        return Ok(SocketAddr::new(IpAddr::V4(ip), 0));
    }
    Err(ForwardedError::BadNode(node.to_string()))
}

fn in_quotes_only(s: &str, c: char) -> bool {
    split_unquoted(s, c).count() == 1
}

/// Splits on `sep` outside double quotes.
fn split_unquoted(s: &str, sep: char) -> impl Iterator<Item = &str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    for (i, ch) in s.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match ch {
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter()
}

fn unquote(v: &str) -> Option<String> {
    if let Some(inner) = v.strip_prefix('"') {
        let inner = inner.strip_suffix('"')?;
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next()?),
                '"' => return None,
                c => out.push(c),
            }
        }
        Some(out)
    } else if !v.is_empty() && v.bytes().all(is_tchar) {
        Some(v.to_string())
    } else {
        None
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The source workload's names, carried in the W3C `baggage` header with the keys the
/// reference mesh uses (`k8s.cluster.name`, `k8s.namespace.name`, `k8s.<kind>.name`,
/// `service.name`, `service.version`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Baggage {
    /// Cluster name.
    pub cluster: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Workload kind as a lower-case word (`deployment`, `statefulset`, `pod`…);
    /// `deployment` when a workload name is set without a kind.
    pub workload_kind: Option<String>,
    /// Workload name.
    pub workload: Option<String>,
    /// Canonical service name.
    pub service: Option<String>,
    /// Canonical service revision.
    pub revision: Option<String>,
}

const WORKLOAD_KINDS: &[&str] = &[
    "deployment",
    "statefulset",
    "daemonset",
    "replicaset",
    "job",
    "cronjob",
    "pod",
];

impl Baggage {
    /// `k=v` list; empty when nothing is known. Values must be baggage tokens (no
    /// separators, spaces or control characters: Kubernetes names always are).
    pub fn encode(&self) -> Result<String, HboneError> {
        let mut out = Vec::new();
        let kind = self.workload_kind.as_deref().unwrap_or("deployment");
        if !kind.bytes().all(|b| b.is_ascii_lowercase()) {
            return Err(HboneError::InvalidHeader {
                name: BAGGAGE,
                reason: format!("workload kind {kind:?} is not a lower-case word"),
            });
        }
        let workload_key = format!("k8s.{kind}.name");
        for (key, val) in [
            ("k8s.cluster.name", &self.cluster),
            ("k8s.namespace.name", &self.namespace),
            (workload_key.as_str(), &self.workload),
            ("service.name", &self.service),
            ("service.version", &self.revision),
        ] {
            if let Some(v) = val {
                if v.is_empty() || !v.bytes().all(is_baggage_value_char) {
                    return Err(HboneError::InvalidHeader {
                        name: BAGGAGE,
                        reason: format!("{key} value {v:?} is not a baggage token"),
                    });
                }
                out.push(format!("{key}={v}"));
            }
        }
        Ok(out.join(","))
    }

    /// Lenient parse: unknown keys and malformed members are skipped.
    pub fn parse(value: &str) -> Baggage {
        let mut b = Baggage::default();
        for member in value.split(',') {
            let member = member.split(';').next().unwrap_or("").trim();
            let Some((k, v)) = member.split_once('=') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if v.is_empty() || !v.bytes().all(is_baggage_value_char) {
                continue;
            }
            let v = Some(v.to_string());
            match k {
                "k8s.cluster.name" => b.cluster = v,
                "k8s.namespace.name" => b.namespace = v,
                "service.name" => b.service = v,
                "service.version" => b.revision = v,
                _ => {
                    if let Some(kind) = k
                        .strip_prefix("k8s.")
                        .and_then(|r| r.strip_suffix(".name"))
                        .filter(|kind| WORKLOAD_KINDS.contains(kind))
                    {
                        b.workload_kind = Some(kind.to_string());
                        b.workload = v;
                    }
                }
            }
        }
        b
    }
}

fn is_baggage_value_char(b: u8) -> bool {
    // W3C baggage-octet minus '%' (no percent-encoding is produced or decoded here).
    matches!(b, 0x21 | 0x23..=0x24 | 0x26..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
}

/// A W3C `traceparent` (version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 128-bit trace id, never zero.
    pub trace_id: u128,
    /// 64-bit parent (span) id, never zero.
    pub span_id: u64,
    /// Trace flags (bit 0 = sampled).
    pub flags: u8,
}

impl TraceParent {
    /// A fresh random trace (not sampled), as the client makes for every connection.
    pub fn random() -> Self {
        TraceParent {
            trace_id: rand::random::<u128>().max(1),
            span_id: rand::random::<u64>().max(1),
            flags: 0,
        }
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>`; `None` when malformed or all-zero ids.
    pub fn parse(s: &str) -> Option<Self> {
        let mut it = s.trim().split('-');
        let (ver, tid, sid, fl) = (it.next()?, it.next()?, it.next()?, it.next()?);
        if it.next().is_some() || ver != "00" || tid.len() != 32 || sid.len() != 16 || fl.len() != 2
        {
            return None;
        }
        let lower_hex = |x: &str| x.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !lower_hex(tid) || !lower_hex(sid) || !lower_hex(fl) {
            return None;
        }
        let tp = TraceParent {
            trace_id: u128::from_str_radix(tid, 16).ok()?,
            span_id: u64::from_str_radix(sid, 16).ok()?,
            flags: u8::from_str_radix(fl, 16).ok()?,
        };
        (tp.trace_id != 0 && tp.span_id != 0).then_some(tp)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(values: &[&str]) -> http::HeaderMap {
        let mut m = http::HeaderMap::new();
        for v in values {
            m.append(FORWARDED, http::HeaderValue::from_str(v).unwrap());
        }
        m
    }

    #[test]
    fn forwarded_host_is_sent_with_for_and_read_leniently() {
        let req = ConnectHeaders::new("10.0.0.2:80".parse().unwrap())
            .forwarded_for("10.0.0.1:4000".parse().unwrap())
            .forwarded_host("web.shop.svc.cluster.local")
            .to_request()
            .unwrap();
        let v = req.headers().get(FORWARDED).unwrap().to_str().unwrap();
        assert_eq!(v, "for=\"10.0.0.1:4000\";host=web.shop.svc.cluster.local");
        // The strict `for` parser still takes it.
        assert_eq!(
            parse_forwarded(v).unwrap(),
            "10.0.0.1:4000".parse().unwrap()
        );
        assert_eq!(
            parse_forwarded_host(req.headers()).as_deref(),
            Some("web.shop.svc.cluster.local")
        );
        // A host that is not a token is not sent.
        let req = ConnectHeaders::new("10.0.0.2:80".parse().unwrap())
            .forwarded_for("10.0.0.1:4000".parse().unwrap())
            .forwarded_host("a b")
            .to_request()
            .unwrap();
        assert_eq!(parse_forwarded_host(req.headers()), None);
        for (values, want) in [
            (&["for=1.2.3.4;host=\"a.b\""][..], Some("a.b")),
            (&["for=1.2.3.4"][..], None),
            (&["for=1.2.3.4;host=a;host=b"][..], None),
            (&["for=1.2.3.4;host=a", "for=1.2.3.4;host=b"][..], None),
            (&["for=1.2.3.4;host=\"a b\""][..], None),
            (&["for=1.2.3.4;host="][..], None),
        ] {
            assert_eq!(
                parse_forwarded_host(&map(values)).as_deref(),
                want,
                "{values:?}"
            );
        }
        let long = format!("for=1.2.3.4;host={}", "a".repeat(MAX_FORWARDED_HOST + 1));
        assert_eq!(parse_forwarded_host(&map(&[&long])), None);
    }

    #[test]
    fn forwarded_v4_v6_roundtrip() {
        for a in ["10.1.2.3:4567", "[fd00::1]:80", "[::ffff:1.2.3.4]:9"] {
            let sa: SocketAddr = a.parse().unwrap();
            let h = format_forwarded(sa);
            assert_eq!(parse_forwarded(&h), Ok(sa), "{h}");
        }
        assert_eq!(
            format_forwarded("[fd00::1]:80".parse().unwrap()),
            "for=\"[fd00::1]:80\""
        );
    }

    #[test]
    fn forwarded_lenient_forms() {
        assert_eq!(
            parse_forwarded("for=1.2.3.4"),
            Ok("1.2.3.4:0".parse().unwrap())
        );
        assert_eq!(
            parse_forwarded("For=\"[::1]\""),
            Ok("[::1]:0".parse().unwrap())
        );
        assert_eq!(
            parse_forwarded("proto=https; for=\"1.2.3.4:5\";by=x"),
            Ok("1.2.3.4:5".parse().unwrap())
        );
    }

    #[test]
    fn forwarded_garbage_rejected() {
        use ForwardedError::*;
        assert_eq!(
            parse_forwarded("garbage"),
            Err(MalformedParam("garbage".into()))
        );
        assert_eq!(
            parse_forwarded("for=unknown"),
            Err(BadNode("unknown".into()))
        );
        assert_eq!(
            parse_forwarded("for=_hidden"),
            Err(BadNode("_hidden".into()))
        );
        assert_eq!(
            parse_forwarded("for=\"evil.example:80\""),
            Err(BadNode("evil.example:80".into()))
        );
        assert_eq!(
            parse_forwarded("for=1.2.3.4, for=5.6.7.8"),
            Err(MultipleElements)
        );
        assert_eq!(
            parse_forwarded("for=1.2.3.4;for=5.6.7.8"),
            Err(MalformedParam("for=5.6.7.8".into()))
        );
        assert_eq!(
            parse_forwarded("for=::1"),
            Err(MalformedParam("for=::1".into()))
        );
        assert_eq!(
            parse_forwarded("for=\"1.2.3.4:5"),
            Err(MalformedParam("for=\"1.2.3.4:5".into()))
        );
        assert_eq!(parse_forwarded("proto=http"), Err(MissingFor));
        assert_eq!(
            parse_forwarded("for=\"1.2.3.4:99999\""),
            Err(BadNode("1.2.3.4:99999".into()))
        );
    }

    #[test]
    fn baggage_roundtrip_and_reference_keys() {
        let b = Baggage {
            cluster: Some("Kubernetes".into()),
            namespace: Some("default".into()),
            workload_kind: None,
            workload: Some("sleep".into()),
            service: Some("sleep".into()),
            revision: Some("v1".into()),
        };
        let s = b.encode().unwrap();
        assert_eq!(
            s,
            "k8s.cluster.name=Kubernetes,k8s.namespace.name=default,k8s.deployment.name=sleep,service.name=sleep,service.version=v1"
        );
        let back = Baggage::parse(&s);
        assert_eq!(back.workload_kind.as_deref(), Some("deployment"));
        assert_eq!(
            Baggage {
                workload_kind: None,
                ..back
            },
            b
        );
        assert_eq!(
            Baggage::parse("junk,,=x,k8s.pod.name=p;prop=1"),
            Baggage {
                workload_kind: Some("pod".into()),
                workload: Some("p".into()),
                ..Baggage::default()
            }
        );
        assert!(Baggage {
            namespace: Some("a,b".into()),
            ..Baggage::default()
        }
        .encode()
        .is_err());
        assert_eq!(Baggage::default().encode().unwrap(), "");
    }

    #[test]
    fn traceparent_format_and_parse() {
        let a = TraceParent::random();
        let b = TraceParent::random();
        assert_ne!(a.trace_id, b.trace_id);
        let s = a.to_string();
        assert_eq!(s.len(), 55);
        assert_eq!(TraceParent::parse(&s), Some(a));
        assert_eq!(
            TraceParent::parse("00-00000000000000000000000000000000-0000000000000001-01"),
            None
        );
        assert_eq!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None
        );
        assert!(
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").is_some()
        );
    }
}
