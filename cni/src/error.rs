//! CNI error codes and the error object printed on stdout.

use serde::Serialize;

use crate::version::{CniVersion, UnsupportedVersion};

/// The error codes of the CNI spec (1.0.0/1.1.0), plus ringway's own (100 and up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1: the config's (or a result's) cniVersion is not one this plugin speaks.
    IncompatibleVersion,
    /// 2: a field of the config is not supported by this plugin.
    UnsupportedField,
    /// 3: the container does not exist or is not known to the plugin.
    UnknownContainer,
    /// 4: a `CNI_*` environment variable is missing or malformed.
    InvalidEnvironment,
    /// 5: reading stdin or another I/O operation failed.
    Io,
    /// 6: stdin (or part of it) could not be decoded.
    Decode,
    /// 7: the network config decoded but is not valid.
    InvalidConfig,
    /// 11: a transient failure: the runtime should retry the operation later.
    TryAgainLater,
    /// 50: STATUS: the plugin cannot serve ADD now.
    NotAvailable,
    /// 51: STATUS: the plugin cannot serve ADD now and existing attachments may have
    /// limited connectivity.
    NotAvailableLimitedConnectivity,
    /// 100 (ringway): the node agent answered and refused the request.
    AgentRejected,
    /// 101 (ringway): the node agent answered something that is not the protocol.
    AgentProtocol,
}

impl ErrorCode {
    /// The number printed in the `code` field.
    pub fn as_u32(self) -> u32 {
        match self {
            ErrorCode::IncompatibleVersion => 1,
            ErrorCode::UnsupportedField => 2,
            ErrorCode::UnknownContainer => 3,
            ErrorCode::InvalidEnvironment => 4,
            ErrorCode::Io => 5,
            ErrorCode::Decode => 6,
            ErrorCode::InvalidConfig => 7,
            ErrorCode::TryAgainLater => 11,
            ErrorCode::NotAvailable => 50,
            ErrorCode::NotAvailableLimitedConnectivity => 51,
            ErrorCode::AgentRejected => 100,
            ErrorCode::AgentProtocol => 101,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.as_u32())
    }
}

/// A failed CNI operation: what the runtime gets on stdout, with a non-zero exit.
///
/// `msg` names exactly what was wrong (the variable, the field, the value);
/// `details` adds the underlying cause or what happens next, and may be empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CNI error {code}: {msg}")]
pub struct CniError {
    /// The spec's error code.
    pub code: ErrorCode,
    /// Short, specific description.
    pub msg: String,
    /// Longer explanation, possibly empty.
    pub details: String,
}

impl CniError {
    /// An error without details.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Sets `details`.
    #[must_use]
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// The JSON error object of the spec, encoded at `version`:
    /// `{"cniVersion":..,"code":..,"msg":..,"details":..}`.
    pub fn to_json(&self, version: CniVersion) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            #[serde(rename = "cniVersion")]
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            details: &'a str,
        }
        let wire = Wire {
            cni_version: version.as_str(),
            code: self.code.as_u32(),
            msg: &self.msg,
            details: &self.details,
        };
        // Serializing a struct of strings and integers cannot fail.
        serde_json::to_string(&wire).unwrap_or_default()
    }
}

impl From<UnsupportedVersion> for CniError {
    /// Code 1 (incompatible version), naming the supported versions.
    fn from(e: UnsupportedVersion) -> CniError {
        CniError::new(ErrorCode::IncompatibleVersion, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_json_has_the_four_fields_in_spec_order() {
        let e = CniError::new(ErrorCode::InvalidConfig, "network config has no \"type\"")
            .with_details("see the conflist");
        assert_eq!(
            e.to_json(CniVersion::V1_0_0),
            r#"{"cniVersion":"1.0.0","code":7,"msg":"network config has no \"type\"","details":"see the conflist"}"#
        );
    }

    #[test]
    fn unsupported_version_is_code_1_with_the_list() {
        let e = CniError::from(CniVersion::parse("cniVersion", "2.0.0").unwrap_err());
        assert_eq!(e.code, ErrorCode::IncompatibleVersion);
        assert_eq!(
            e.msg,
            r#"cniVersion "2.0.0" is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"#
        );
    }

    #[test]
    fn codes_match_the_spec() {
        let codes = [
            (ErrorCode::IncompatibleVersion, 1),
            (ErrorCode::UnsupportedField, 2),
            (ErrorCode::UnknownContainer, 3),
            (ErrorCode::InvalidEnvironment, 4),
            (ErrorCode::Io, 5),
            (ErrorCode::Decode, 6),
            (ErrorCode::InvalidConfig, 7),
            (ErrorCode::TryAgainLater, 11),
            (ErrorCode::NotAvailable, 50),
            (ErrorCode::NotAvailableLimitedConnectivity, 51),
            (ErrorCode::AgentRejected, 100),
            (ErrorCode::AgentProtocol, 101),
        ];
        for (code, n) in codes {
            assert_eq!(code.as_u32(), n, "{code:?}");
        }
    }
}
