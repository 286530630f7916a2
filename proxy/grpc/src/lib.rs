//! gRPC's framing over HTTP/2, shared by ringway's hand-written gRPC
//! clients and servers (the certificate service, the xDS client): the 5-byte
//! message prefix (compressed flag, big-endian length), status codes and the
//! `grpc-status`/`grpc-message` trailers.
//!
//! - Unary calls: [`decode_unary`] (a whole request body holding exactly one
//!   message) and [`encode_frame`].
//! - Streams: [`MessageDecoder`] takes HTTP/2 DATA chunks as they arrive and
//!   yields whole messages, across chunk boundaries and several per chunk; a
//!   message whose prefix announces more than the configured limit is refused
//!   from its prefix, before any of it is buffered ([`FrameError`]).
//! - Status: [`Code`] and [`Status`] for what ringway sends, [`WireStatus`]
//!   for what a peer sent (any code number), with `grpc-message`'s
//!   percent-encoding ([`encode_message`], [`decode_message`]).
//!
//! - [`ClientTls`]: a client's TLS config that can be replaced while the
//!   client runs (the mesh's roots rotated); each connect takes the one in
//!   force.
//!
//! No compression is negotiated anywhere, so a compressed message is refused.

#![forbid(unsafe_code)]

mod decoder;
mod tls;

pub use decoder::{FrameError, MessageDecoder, PREFIX_LEN};
pub use tls::ClientTls;

use bytes::{BufMut, Bytes, BytesMut};

/// gRPC status codes used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    /// 0.
    Ok = 0,
    /// 3: a malformed request; nothing changed.
    InvalidArgument = 3,
    /// 5: no such method.
    NotFound = 5,
    /// 7: authenticated, but not allowed this identity.
    PermissionDenied = 7,
    /// 8: a limit was hit.
    ResourceExhausted = 8,
    /// 12: a feature the server does not have (compressed messages).
    Unimplemented = 12,
    /// 13: the server failed.
    Internal = 13,
    /// 14: try again later (the API server cannot be reached, caches not synced).
    Unavailable = 14,
    /// 16: no or bad credentials.
    Unauthenticated = 16,
}

impl Code {
    /// The number on the wire.
    pub fn as_u32(self) -> u32 {
        self as u32
    }

    /// The lowercase name (metric label).
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// From the wire (unknown numbers: `None`).
    pub fn from_u32(n: u32) -> Option<Code> {
        [
            Code::Ok,
            Code::InvalidArgument,
            Code::NotFound,
            Code::PermissionDenied,
            Code::ResourceExhausted,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::Unauthenticated,
        ]
        .into_iter()
        .find(|c| c.as_u32() == n)
    }
}

/// A non-OK outcome: the code and a message that says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} ({}): {message}", code.name(), code.as_u32())]
pub struct Status {
    /// The code.
    pub code: Code,
    /// Why, for the caller (never secret material).
    pub message: String,
    /// A short fixed reason for the metric label.
    pub reason: &'static str,
}

impl Status {
    /// A status with `code`, a metric `reason` and a message.
    pub fn new(code: Code, reason: &'static str, message: impl Into<String>) -> Status {
        Status {
            code,
            message: message.into(),
            reason,
        }
    }
}

/// Decodes the one message of a unary request body. The body must be
/// exactly one frame; the frame must be uncompressed and at most `limit`
/// bytes.
pub fn decode_unary(body: &[u8], limit: usize) -> Result<&[u8], Status> {
    let bad = |m: String| Status::new(Code::InvalidArgument, "malformed_frame", m);
    if body.len() < 5 {
        return Err(bad(format!(
            "request body is {} bytes, shorter than a gRPC message prefix (5)",
            body.len()
        )));
    }
    let compressed = body[0];
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if compressed == 1 {
        return Err(Status::new(
            Code::Unimplemented,
            "compressed",
            "compressed messages are not supported (send grpc-encoding identity)",
        ));
    }
    if compressed != 0 {
        return Err(bad(format!(
            "compressed flag is {compressed}, expected 0 or 1"
        )));
    }
    if len > limit {
        return Err(Status::new(
            Code::ResourceExhausted,
            "too_large",
            format!("request message is {len} bytes, more than the limit of {limit}"),
        ));
    }
    let rest = &body[5..];
    if rest.len() != len {
        return Err(bad(format!(
            "message prefix says {len} bytes, the body holds {} after it (a unary call carries exactly one message)",
            rest.len()
        )));
    }
    Ok(rest)
}

/// One uncompressed message frame.
pub fn encode_frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(5 + message.len());
    b.put_u8(0);
    b.put_u32(message.len() as u32);
    b.put_slice(message);
    b.freeze()
}

/// `grpc-message` encoding: percent-encodes what is not printable ASCII
/// (and `%`).
pub fn encode_message(m: &str) -> String {
    let mut out = String::with_capacity(m.len());
    for b in m.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of [`encode_message`] (bad escapes kept as they are).
pub fn decode_message(m: &str) -> String {
    fn hex(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let bytes = m.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The `grpc-status` and `grpc-message` a peer sent in a header block (the
/// trailers, or the headers of a trailers-only response), with the code as a
/// number: a peer may send codes [`Code`] has no name for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireStatus {
    /// `grpc-status`; a value that is not a number reads as 2 (UNKNOWN), as
    /// gRPC clients treat it.
    pub code: u32,
    /// `grpc-message`, percent-decoded (empty when absent).
    pub message: String,
}

/// gRPC's UNKNOWN code, for a `grpc-status` that is not a number.
pub const CODE_UNKNOWN: u32 = 2;

impl WireStatus {
    /// The status in `headers`, or `None` when there is no `grpc-status`.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<WireStatus> {
        let raw = headers.get("grpc-status")?;
        let code = raw
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .unwrap_or(CODE_UNKNOWN);
        let message = headers
            .get("grpc-message")
            .map(|v| decode_message(&String::from_utf8_lossy(v.as_bytes())))
            .unwrap_or_default();
        Some(WireStatus { code, message })
    }

    /// True for code 0.
    pub fn is_ok(&self) -> bool {
        self.code == 0
    }

    /// The code's lowercase name, when [`Code`] knows the number.
    pub fn code_name(&self) -> Option<&'static str> {
        Code::from_u32(self.code).map(Code::name)
    }
}

impl std::fmt::Display for WireStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.code_name() {
            Some(name) => write!(f, "{name} ({}): {}", self.code, self.message),
            None => write!(f, "code {}: {}", self.code, self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_frames_are_refused_with_a_reason() {
        let cases: Vec<(Vec<u8>, Code, &str)> = vec![
            (
                vec![],
                Code::InvalidArgument,
                "shorter than a gRPC message prefix",
            ),
            (vec![0, 0, 0], Code::InvalidArgument, "shorter"),
            (vec![1, 0, 0, 0, 1, 7], Code::Unimplemented, "compressed"),
            (
                vec![2, 0, 0, 0, 0],
                Code::InvalidArgument,
                "compressed flag is 2",
            ),
            (
                vec![0, 0, 0, 0, 3, 1],
                Code::InvalidArgument,
                "says 3 bytes",
            ),
            (
                vec![0, 0, 0, 0, 1, 1, 2],
                Code::InvalidArgument,
                "exactly one message",
            ),
            (
                vec![0, 0xff, 0xff, 0xff, 0xff],
                Code::ResourceExhausted,
                "limit of 1024",
            ),
        ];
        for (body, code, words) in cases {
            let e = decode_unary(&body, 1024).unwrap_err();
            assert_eq!(e.code, code, "{body:?}: {e}");
            assert!(e.message.contains(words), "{body:?}: {e}");
        }
        assert_eq!(decode_unary(&[0, 0, 0, 0, 2, 8, 9], 1024).unwrap(), &[8, 9]);
        assert_eq!(decode_unary(&encode_frame(b"abc"), 3).unwrap(), b"abc");
    }

    #[test]
    fn messages_round_trip_through_percent_encoding() {
        for m in ["plain", "100% sure", "üñí\ncode", "", "%zz%4"] {
            assert_eq!(decode_message(&encode_message(m)), m);
        }
        assert_eq!(encode_message("a%b\n"), "a%25b%0A");
        assert_eq!(decode_message("%zz%4%"), "%zz%4%", "bad escapes are kept");
        assert_eq!(decode_message("%C3%BC"), "ü");
    }

    #[test]
    fn a_peers_status_is_read_from_its_headers() {
        let mut h = http::HeaderMap::new();
        assert_eq!(WireStatus::from_headers(&h), None, "no grpc-status");
        h.insert("grpc-status", http::HeaderValue::from_static("14"));
        h.insert(
            "grpc-message",
            http::HeaderValue::from_static("%C3%BCberlastet 100%25"),
        );
        let s = WireStatus::from_headers(&h).unwrap();
        assert_eq!(s.code, 14);
        assert_eq!(s.message, "überlastet 100%");
        assert_eq!(s.to_string(), "unavailable (14): überlastet 100%");
        h.insert("grpc-status", http::HeaderValue::from_static("99"));
        assert_eq!(
            WireStatus::from_headers(&h).unwrap().to_string(),
            "code 99: überlastet 100%"
        );
        h.insert("grpc-status", http::HeaderValue::from_static("x"));
        let s = WireStatus::from_headers(&h).unwrap();
        assert_eq!(s.code, CODE_UNKNOWN, "not a number reads as UNKNOWN");
        assert!(!s.is_ok());
        h.insert("grpc-status", http::HeaderValue::from_static("0"));
        h.remove("grpc-message");
        let s = WireStatus::from_headers(&h).unwrap();
        assert!(s.is_ok());
        assert_eq!(s.message, "");
    }
}
