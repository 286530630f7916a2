//! The messages of `istio.v1.auth.IstioCertificateService`, written by hand
//! with prost's derive (field numbers as the protocol defines them).

/// `istio.v1.auth.IstioCertificateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded PKCS#10 request: the CA uses its public key only.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested lifetime in seconds (0: the CA's default).
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Optional; `ImpersonatedIdentity` (a string) asks for a pod's identity.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<prost_types::Struct>,
}

/// `istio.v1.auth.IstioCertificateResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    /// PEM certificates, the leaf first and the root last.
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}

/// The metadata key of the identity a node proxy asks for on a pod's behalf.
pub const IMPERSONATED_IDENTITY: &str = "ImpersonatedIdentity";

/// The gRPC method's full path.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";

/// `metadata.ImpersonatedIdentity` holds something other than a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("metadata.{} is not a string", IMPERSONATED_IDENTITY)]
pub struct ImpersonationNotAString;

impl IstioCertificateRequest {
    /// `metadata.ImpersonatedIdentity`: `Ok(None)` when absent, an error when
    /// present but not a string.
    pub fn impersonated_identity(&self) -> Result<Option<&str>, ImpersonationNotAString> {
        use prost_types::value::Kind;
        let Some(meta) = &self.metadata else {
            return Ok(None);
        };
        match meta
            .fields
            .get(IMPERSONATED_IDENTITY)
            .and_then(|v| v.kind.as_ref())
        {
            None | Some(Kind::NullValue(_)) => Ok(None),
            Some(Kind::StringValue(s)) if s.is_empty() => Ok(None),
            Some(Kind::StringValue(s)) => Ok(Some(s)),
            Some(_) => Err(ImpersonationNotAString),
        }
    }

    /// A request with `ImpersonatedIdentity` set (for clients and tests).
    pub fn with_impersonation(mut self, identity: &str) -> Self {
        let mut meta = self.metadata.take().unwrap_or_default();
        meta.fields.insert(
            IMPERSONATED_IDENTITY.to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(identity.to_owned())),
            },
        );
        self.metadata = Some(meta);
        self
    }
}
