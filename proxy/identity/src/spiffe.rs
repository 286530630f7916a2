//! SPIFFE IDs: parsing with the trust domain checked, and reading the one
//! URI SAN of a certificate.

use ringway_config::authz::Identity;
use rustls::CommonState;
use rustls_pki_types::CertificateDer;
use x509_parser::extensions::GeneralName;

use crate::error::{IdentityError, SpiffeError};

/// Parses `spiffe://<trust_domain>/ns/<namespace>/sa/<service account>`,
/// requiring the trust domain to be `trust_domain`.
pub fn parse_spiffe(id: &str, trust_domain: &str) -> Result<Identity, SpiffeError> {
    let Some(rest) = id.strip_prefix("spiffe://") else {
        let scheme = id.split_once("://").map_or("", |(s, _)| s);
        return Err(SpiffeError::WrongScheme {
            id: id.to_owned(),
            scheme: scheme.to_owned(),
        });
    };
    let (td, path) = rest.split_once('/').unwrap_or((rest, ""));
    if td != trust_domain {
        return Err(SpiffeError::WrongTrustDomain {
            id: id.to_owned(),
            found: td.to_owned(),
            expected: trust_domain.to_owned(),
        });
    }
    let parts: Vec<&str> = path.split('/').collect();
    if !matches!(parts[..], ["ns", ns, "sa", sa] if !ns.is_empty() && !sa.is_empty()) {
        return Err(SpiffeError::MissingParts {
            id: id.to_owned(),
            path: format!("/{path}"),
        });
    }
    Ok(Identity::from_spiffe_id(id)?)
}

/// The SPIFFE ID of a certificate: its only URI SAN (the X.509-SVID rule).
/// The chain is not verified here.
pub fn spiffe_id_of(cert: &CertificateDer<'_>) -> Result<String, IdentityError> {
    let bad = |reason: String| IdentityError::PeerCertificate(reason);
    let (_, x509) = x509_parser::parse_x509_certificate(cert)
        .map_err(|e| bad(format!("not a valid X.509 certificate: {e}")))?;
    let san = x509
        .subject_alternative_name()
        .map_err(|e| bad(format!("bad subjectAltName: {e}")))?
        .ok_or_else(|| bad("no subjectAltName (a SPIFFE ID is required)".into()))?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    match uris[..] {
        [one] => Ok(one.to_owned()),
        [] => Err(bad("no URI SAN (a SPIFFE ID is required)".into())),
        _ => Err(bad(format!(
            "{} URI SANs, a SPIFFE certificate has exactly one",
            uris.len()
        ))),
    }
}

/// The identity of the peer of an established connection
/// (`&ServerConnection` or `&ClientConnection`, both deref to
/// [`CommonState`]).
///
/// Call it only on a connection made with this crate's configs: the
/// verifiers have then checked the chain and the trust domain, and this
/// reads the SPIFFE ID that they accepted.
pub fn peer_identity(conn: &CommonState) -> Result<Identity, IdentityError> {
    peer_identity_from_certs(conn.peer_certificates().unwrap_or_default())
}

/// [`peer_identity`] from the peer's certificate chain (leaf first).
pub fn peer_identity_from_certs(chain: &[CertificateDer<'_>]) -> Result<Identity, IdentityError> {
    let leaf = chain.first().ok_or(IdentityError::NoPeerCertificate)?;
    let id = spiffe_id_of(leaf)?;
    Identity::from_spiffe_id(&id).map_err(|e| IdentityError::Spiffe(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_explains() {
        let id = parse_spiffe("spiffe://cluster.local/ns/shop/sa/web", "cluster.local").unwrap();
        assert_eq!(id, Identity::new("cluster.local", "shop", "web"));
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/web");

        let e = parse_spiffe("https://cluster.local/ns/shop/sa/web", "cluster.local").unwrap_err();
        assert!(
            matches!(&e, SpiffeError::WrongScheme { scheme, .. } if scheme == "https"),
            "{e}"
        );
        assert!(e.to_string().contains("scheme must be \"spiffe\""), "{e}");
        let e = parse_spiffe("cluster.local/ns/shop/sa/web", "cluster.local").unwrap_err();
        assert!(matches!(e, SpiffeError::WrongScheme { .. }), "{e}");

        let e = parse_spiffe("spiffe://evil.org/ns/shop/sa/web", "cluster.local").unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"spiffe://evil.org/ns/shop/sa/web\" is in trust domain \"evil.org\", not \"cluster.local\""
        );

        for bad in [
            "spiffe://cluster.local",
            "spiffe://cluster.local/ns/shop",
            "spiffe://cluster.local/ns/shop/sa/",
            "spiffe://cluster.local/ns//sa/web",
            "spiffe://cluster.local/sa/web/ns/shop",
            "spiffe://cluster.local/ns/shop/sa/web/extra",
        ] {
            let e = parse_spiffe(bad, "cluster.local").unwrap_err();
            assert!(matches!(e, SpiffeError::MissingParts { .. }), "{bad}: {e}");
        }
        let e = parse_spiffe("spiffe://cluster.local/ns/Shop/sa/web", "cluster.local").unwrap_err();
        assert!(e.to_string().contains("namespace"), "{e}");
    }
}
