//! The CNI spec versions this plugin speaks, and the VERSION command's answer.

use serde::Serialize;

/// A CNI spec version this plugin supports (for configs and for results).
///
/// Ordered by release: `V0_3_0 < V0_3_1 < V0_4_0 < V1_0_0 < V1_1_0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CniVersion {
    /// 0.3.0: first version with the `interfaces`/`ips`/`routes` result.
    V0_3_0,
    /// 0.3.1.
    V0_3_1,
    /// 0.4.0: adds CHECK and prevResult on DEL.
    V0_4_0,
    /// 1.0.0: drops `ips[].version` from results.
    V1_0_0,
    /// 1.1.0: adds STATUS, GC, `cniVersions`, `disableGC`.
    V1_1_0,
}

/// Every version, oldest first: the `supportedVersions` of the VERSION answer.
pub const SUPPORTED_VERSIONS: [CniVersion; 5] = [
    CniVersion::V0_3_0,
    CniVersion::V0_3_1,
    CniVersion::V0_4_0,
    CniVersion::V1_0_0,
    CniVersion::V1_1_0,
];

impl CniVersion {
    /// The newest version this plugin speaks.
    pub const LATEST: CniVersion = CniVersion::V1_1_0;

    /// The version string, e.g. `"1.0.0"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CniVersion::V0_3_0 => "0.3.0",
            CniVersion::V0_3_1 => "0.3.1",
            CniVersion::V0_4_0 => "0.4.0",
            CniVersion::V1_0_0 => "1.0.0",
            CniVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Parses an exact version string; `None` for anything not supported.
    pub fn from_str_exact(s: &str) -> Option<CniVersion> {
        SUPPORTED_VERSIONS.into_iter().find(|v| v.as_str() == s)
    }

    /// Parses the `cniVersion` of `what` ("cniVersion", "prevResult cniVersion"),
    /// failing with the supported list (a [`crate::CniError`] of code 1 through
    /// `?`).
    pub fn parse(what: &'static str, s: &str) -> Result<CniVersion, UnsupportedVersion> {
        CniVersion::from_str_exact(s).ok_or_else(|| UnsupportedVersion {
            what,
            value: s.to_owned(),
        })
    }

    /// Results from 1.0.0 on have no `ips[].version`.
    pub fn results_have_ip_version(self) -> bool {
        self < CniVersion::V1_0_0
    }
}

impl std::fmt::Display for CniVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `cniVersion` this plugin does not speak: code 1 (incompatible version) in
/// the error the runtime gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} is not supported (supported: {})", supported_list())]
pub struct UnsupportedVersion {
    /// Which field: `cniVersion`, `prevResult cniVersion`.
    pub what: &'static str,
    /// The version it holds.
    pub value: String,
}

/// `0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0`
pub fn supported_list() -> String {
    SUPPORTED_VERSIONS
        .iter()
        .map(|v| v.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The VERSION command's output:
/// `{"cniVersion":"<version>","supportedVersions":["0.3.0",...,"1.1.0"]}`.
pub fn version_info_json(version: CniVersion) -> String {
    #[derive(Serialize)]
    struct Wire {
        #[serde(rename = "cniVersion")]
        cni_version: &'static str,
        #[serde(rename = "supportedVersions")]
        supported_versions: Vec<&'static str>,
    }
    let wire = Wire {
        cni_version: version.as_str(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.as_str()).collect(),
    };
    serde_json::to_string(&wire).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip_and_order() {
        for v in SUPPORTED_VERSIONS {
            assert_eq!(CniVersion::from_str_exact(v.as_str()), Some(v));
        }
        assert!(CniVersion::V0_4_0 < CniVersion::V1_0_0);
        assert!(CniVersion::V1_0_0 < CniVersion::V1_1_0);
        assert_eq!(CniVersion::LATEST, CniVersion::V1_1_0);
    }

    #[test]
    fn unsupported_version_names_the_list() {
        let e = CniVersion::parse("cniVersion", "2.0.0").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"cniVersion "2.0.0" is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"#
        );
        assert!(CniVersion::from_str_exact("0.2.0").is_none());
        assert!(CniVersion::from_str_exact("1.0").is_none());
    }

    #[test]
    fn version_info_lists_every_supported_version() {
        assert_eq!(
            version_info_json(CniVersion::V1_0_0),
            r#"{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0","1.1.0"]}"#
        );
    }
}
