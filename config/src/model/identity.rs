//! A workload's SPIFFE identity (`spiffe://<td>/ns/<ns>/sa/<sa>`): what a
//! certificate names and what policies match a peer against.

use std::fmt;

use crate::names::{check_label, check_subdomain, check_trust_domain};

/// A peer's SPIFFE identity: `spiffe://<trust_domain>/ns/<namespace>/sa/<service_account>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Trust domain.
    pub trust_domain: String,
    /// Namespace.
    pub namespace: String,
    /// Service account.
    pub service_account: String,
}

/// A string that is not a SPIFFE workload identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{id:?} is not a SPIFFE workload identity: {reason}")]
pub struct IdentityError {
    id: String,
    reason: String,
}

impl IdentityError {
    /// What is wrong, without the identity.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl Identity {
    /// An identity from its parts (not checked).
    pub fn new(trust_domain: &str, namespace: &str, service_account: &str) -> Identity {
        Identity {
            trust_domain: trust_domain.to_owned(),
            namespace: namespace.to_owned(),
            service_account: service_account.to_owned(),
        }
    }

    /// Parses and checks `spiffe://<td>/ns/<ns>/sa/<sa>` (as found in a
    /// certificate's URI SAN).
    pub fn from_spiffe_id(id: &str) -> Result<Identity, IdentityError> {
        let fail = |reason: String| IdentityError {
            id: id.to_owned(),
            reason,
        };
        const SHAPE: &str = "expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>";
        let rest = id
            .strip_prefix("spiffe://")
            .ok_or_else(|| fail(SHAPE.into()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [td, "ns", ns, "sa", sa] = parts[..] else {
            return Err(fail(SHAPE.into()));
        };
        check_trust_domain(td).map_err(|e| fail(format!("trust domain: {e}")))?;
        check_label("namespace", ns).map_err(|e| fail(format!("namespace: {e}")))?;
        check_subdomain("service account", sa)
            .map_err(|e| fail(format!("service account: {e}")))?;
        Ok(Identity::new(td, ns, sa))
    }

    /// The SPIFFE ID's parts; concatenated they are the ID.
    pub(crate) fn pieces(&self) -> [&str; 6] {
        [
            "spiffe://",
            &self.trust_domain,
            "/ns/",
            &self.namespace,
            "/sa/",
            &self.service_account,
        ]
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pieces().iter().try_for_each(|p| f.write_str(p))
    }
}
