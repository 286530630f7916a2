//! Single values of the configuration, checked: addresses, ports, cluster
//! object names, and the patterns of policy rules (namespaces, principals,
//! service accounts), each with its typed error ([`ValueError`]). The
//! Kubernetes source reads the cluster's policy objects with the same checks.

use std::net::IpAddr;

use crate::model::{Identity, ServiceAccountRef};
use crate::names::{check_label, check_subdomain, CidrError, NameError, PatternError, StringMatch};

/// What is wrong with one value (the field's path is the caller's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ValueError {
    /// A name.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A pattern.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// A CIDR block.
    #[error(transparent)]
    Cidr(#[from] CidrError),
    /// Not an IP address.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// An address no workload or VIP can have.
    #[error("{0:?} is not a unicast address")]
    NotUnicast(String),
    /// A number that is not a port.
    #[error("port {0} is not a port (1..=65535)")]
    Port(i64),
    /// Text that is not a port.
    #[error("{0:?} is not a port (1..=65535)")]
    PortText(String),
    /// A cluster object's name not of the form `istio/<namespace>/<name>`.
    #[error("{0:?} is not istio/<namespace>/<name>")]
    ClusterName(String),
    /// A namespace pattern with a character a namespace cannot have.
    #[error(
        "{text:?} is not a valid namespace pattern: contains {found:?} (only lowercase \
         letters, digits and \"-\" are allowed)"
    )]
    NamespacePattern {
        /// The pattern.
        text: String,
        /// The first character not allowed.
        found: String,
    },
    /// A principal pattern with `*` elsewhere than at one end.
    #[error("{0:?} is not a principal: \"*\" may appear once, at the start or at the end")]
    PrincipalStar(String),
    /// An exact principal that is not a SPIFFE workload identity.
    #[error("{text:?} is not a principal: {reason}")]
    Principal {
        /// The principal.
        text: String,
        /// Why it is not an identity.
        reason: String,
    },
    /// A principal prefix or suffix with a character no SPIFFE ID has.
    #[error("{text:?} is not a principal: contains {found:?}; {PRINCIPAL_SHAPE}")]
    PrincipalCharacter {
        /// The principal.
        text: String,
        /// The first character not allowed.
        found: String,
    },
    /// Not `namespace/serviceAccount`.
    #[error("{0:?} is not <namespace>/<service account>")]
    ServiceAccountShape(String),
    /// A `namespace/serviceAccount` with a bad part.
    #[error("{text:?}: {source}")]
    ServiceAccount {
        /// The pair as written.
        text: String,
        /// The bad part.
        source: NameError,
    },
}

const PRINCIPAL_SHAPE: &str =
    "expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>, \
                               \"*\", or a prefix or suffix of one with \"*\" in place of the rest";

/// A workload address or VIP: an IP, not unspecified, multicast or broadcast.
pub(crate) fn unicast(text: &str) -> Result<IpAddr, ValueError> {
    let ip: IpAddr = text
        .parse()
        .map_err(|_| ValueError::Address(text.to_owned()))?;
    let ip = ip.to_canonical();
    let unusable = ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    if unusable {
        return Err(ValueError::NotUnicast(text.to_owned()));
    }
    Ok(ip)
}

/// A port: 1..=65535.
pub(crate) fn port_number(n: i64) -> Result<u16, ValueError> {
    u16::try_from(n)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(ValueError::Port(n))
}

/// A port written as text (a `when` condition's value).
pub(crate) fn port_text(v: &str) -> Result<u16, ValueError> {
    v.parse::<i64>()
        .map_err(|_| ValueError::PortText(v.to_owned()))
        .and_then(port_number)
}

/// A cluster object's name: `istio/<namespace>/<name>` (a form no file
/// policy name can take, so the two never collide).
pub(crate) fn cluster_name(name: &str) -> Result<(), ValueError> {
    let parts: Vec<&str> = name.split('/').collect();
    let ["istio", ns, n] = parts[..] else {
        return Err(ValueError::ClusterName(name.to_owned()));
    };
    check_label("namespace", ns)?;
    Ok(check_subdomain("name", n)?)
}

/// `default`, `*`, `prod-*`, `*-system`.
pub(crate) fn namespace_pattern(text: &str) -> Result<StringMatch, ValueError> {
    let m = StringMatch::parse(text)?;
    match &m {
        StringMatch::Any => {}
        StringMatch::Exact(ns) => check_label("namespace", ns)?,
        StringMatch::Prefix(part) | StringMatch::Suffix(part) => {
            if let Some(c) = part
                .chars()
                .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
            {
                return Err(ValueError::NamespacePattern {
                    text: text.to_owned(),
                    found: c.to_string(),
                });
            }
        }
    }
    Ok(m)
}

/// `spiffe://<td>/ns/<ns>/sa/<sa>` (or Istio's form without `spiffe://`),
/// `*`, `prefix*`, `*suffix`.
pub(crate) fn principal_pattern(text: &str) -> Result<StringMatch, ValueError> {
    if text.is_empty() {
        return Err(PatternError::Empty.into());
    }
    let normalized;
    let full = if text.starts_with("spiffe://") || text.starts_with('*') {
        text
    } else {
        normalized = format!("spiffe://{text}");
        &normalized
    };
    let m = StringMatch::parse(full).map_err(|_| ValueError::PrincipalStar(text.to_owned()))?;
    match &m {
        StringMatch::Any => {}
        StringMatch::Exact(id) => {
            Identity::from_spiffe_id(id).map_err(|e| ValueError::Principal {
                text: text.to_owned(),
                reason: e.reason().to_owned(),
            })?;
        }
        StringMatch::Prefix(part) | StringMatch::Suffix(part) => {
            if let Some(c) = part.chars().find(|c| {
                !(c.is_ascii_lowercase()
                    || c.is_ascii_digit()
                    || matches!(c, '.' | '-' | '_' | '/' | ':'))
            }) {
                return Err(ValueError::PrincipalCharacter {
                    text: text.to_owned(),
                    found: c.to_string(),
                });
            }
        }
    }
    Ok(m)
}

/// `namespace/serviceAccount`.
pub(crate) fn service_account(text: &str) -> Result<ServiceAccountRef, ValueError> {
    let Some((ns, sa)) = text.split_once('/') else {
        return Err(ValueError::ServiceAccountShape(text.to_owned()));
    };
    let part = |source| ValueError::ServiceAccount {
        text: text.to_owned(),
        source,
    };
    check_label("namespace", ns).map_err(part)?;
    check_subdomain("service account", sa).map_err(part)?;
    Ok(ServiceAccountRef {
        namespace: ns.to_owned(),
        name: sa.to_owned(),
    })
}
