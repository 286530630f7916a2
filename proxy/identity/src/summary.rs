//! What a certificate says, for operators: its serial number, its validity
//! and its PEM text (the admin endpoint's certificate dump), and what each
//! identity's certificate is doing now ([`CertState`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls_pki_types::CertificateDer;

use crate::ca::fmt_time;
use crate::cert::WorkloadCert;
use crate::error::IdentityError;

/// The state of one identity's certificate, as the admin dump names it.
#[derive(Debug, Clone)]
pub enum CertState {
    /// Wanted, not in hand, and no issuance has failed yet (the first one
    /// may be under way).
    Initializing,
    /// In hand (it may be past its half-life and due for renewal).
    Available(Arc<WorkloadCert>),
    /// Not in hand: the last issuance failed, for this reason.
    Unavailable(String),
}

impl CertState {
    /// `Initializing`, `Available` or `Unavailable: <reason>`.
    pub fn label(&self) -> String {
        match self {
            CertState::Initializing => "Initializing".to_owned(),
            CertState::Available(_) => "Available".to_owned(),
            CertState::Unavailable(reason) => format!("Unavailable: {reason}"),
        }
    }
}

/// The fields of a certificate an operator reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSummary {
    /// The serial number in decimal (as the reference mesh prints it).
    pub serial: String,
    /// Start of validity (whole seconds).
    pub not_before: SystemTime,
    /// End of validity (whole seconds).
    pub not_after: SystemTime,
    /// The certificate as PEM text (`-----BEGIN CERTIFICATE-----`, lines of
    /// 64 base64 characters).
    pub pem: String,
}

/// Reads `der`'s serial number and validity and writes it as PEM.
pub fn describe_certificate(der: &CertificateDer<'_>) -> Result<CertSummary, IdentityError> {
    let (_, x) =
        x509_parser::parse_x509_certificate(der).map_err(|e| IdentityError::BadCertificate {
            reason: e.to_string(),
        })?;
    let at = |secs: i64| SystemTime::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    Ok(CertSummary {
        serial: x.tbs_certificate.serial.to_string(),
        not_before: at(x.validity().not_before.timestamp()),
        not_after: at(x.validity().not_after.timestamp()),
        pem: pem_of(der),
    })
}

/// `t` as RFC 3339 in UTC with whole seconds (`2025-01-02T03:04:05Z`).
pub fn rfc3339(t: SystemTime) -> String {
    fmt_time(t)
}

const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (RFC 4648 section 4).
pub fn base64(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(BASE64[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn pem_of(der: &[u8]) -> String {
    let body = base64(der);
    let mut pem = String::with_capacity(body.len() + body.len() / 64 + 64);
    pem.push_str("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        // Base64 is ASCII.
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (raw, want) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), want, "{raw:?}");
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn a_certificate_is_described_as_written() {
        let ca = crate::CaSigner::generate_for_tests("cluster.local");
        let s = describe_certificate(ca.cert()).unwrap();
        // The same certificate, decoded by the PEM crate.
        let parsed = pem::parse(&s.pem).unwrap();
        assert_eq!(parsed.tag(), "CERTIFICATE");
        assert_eq!(parsed.contents(), ca.cert().as_ref());
        assert!(s.pem.lines().all(|l| l.len() <= 64), "{}", s.pem);
        // The decimal serial is the certificate's serial bytes (converted
        // back here digit by digit, independently of the bignum library).
        assert!(s.serial.bytes().all(|b| b.is_ascii_digit()), "{}", s.serial);
        let mut bytes: Vec<u8> = Vec::new(); // big-endian
        for d in s.serial.bytes() {
            let mut carry = u32::from(d - b'0');
            for b in bytes.iter_mut().rev() {
                let v = u32::from(*b) * 10 + carry;
                *b = (v & 0xff) as u8;
                carry = v >> 8;
            }
            while carry > 0 {
                bytes.insert(0, (carry & 0xff) as u8);
                carry >>= 8;
            }
        }
        let (_, x) = x509_parser::parse_x509_certificate(ca.cert()).unwrap();
        let raw: Vec<u8> = x
            .raw_serial()
            .iter()
            .copied()
            .skip_while(|b| *b == 0)
            .collect();
        assert_eq!(bytes, raw);
        // Whole seconds, as the certificate holds them.
        let whole = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(whole(s.not_after), whole(ca.not_after()));
        assert_eq!(
            s.not_after
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos(),
            0
        );
        assert!(s.not_before < s.not_after);
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
            "2023-11-14T22:13:20Z"
        );
    }
}
