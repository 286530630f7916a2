//! The previous plugin's result (`prevResult`): decoded enough to find the pod's
//! IPs, and re-encoded at the config's cniVersion.
//!
//! The result is kept as raw JSON so that fields ringway does not interpret (and
//! fields of newer spec versions) pass through unchanged. Re-encoding changes only
//! what differs between the versions this plugin speaks: `cniVersion`, and
//! `ips[].version`, which results before 1.0.0 carry and 1.0.0+ results do not.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::error::{CniError, ErrorCode};
use crate::version::CniVersion;

/// An IP address with its prefix length, as in `ips[].address` (`10.0.0.5/24`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodIp {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length (0..=32 for IPv4, 0..=128 for IPv6).
    pub prefix_len: u8,
}

impl FromStr for PodIp {
    type Err = PodIpError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = || PodIpError::NotAddressWithPrefix(s.to_owned());
        let (addr, prefix) = s.split_once('/').ok_or_else(expected)?;
        let addr: IpAddr = addr.parse().map_err(|_| expected())?;
        let prefix_len: u8 = prefix.parse().map_err(|_| expected())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(PodIpError::PrefixTooLong {
                value: s.to_owned(),
                max,
            });
        }
        Ok(PodIp { addr, prefix_len })
    }
}

/// Why a string is not a [`PodIp`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PodIpError {
    /// Not `address/prefix`.
    #[error("{0:?} is not an address with a prefix length (like 10.0.0.5/24)")]
    NotAddressWithPrefix(String),
    /// The prefix is longer than the address.
    #[error("{value:?} has a prefix length above {max}")]
    PrefixTooLong {
        /// The string.
        value: String,
        /// 32 or 128.
        max: u8,
    },
}

impl fmt::Display for PodIp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// A decoded `prevResult`.
#[derive(Debug, Clone, PartialEq)]
pub struct PrevResult {
    raw: Map<String, Value>,
    version: CniVersion,
    ips: Vec<PodIp>,
}

impl PrevResult {
    /// Decodes `prevResult`. A result without `cniVersion` is taken to be at the
    /// config's version (results before 1.0.0 did not always carry one).
    ///
    /// Wrong JSON types fail with code 6; an unsupported version with code 1; an
    /// address that is not `IP/prefix`, or an `ips[].version` that contradicts the
    /// address, with code 7.
    pub fn parse(value: &Value, conf_version: CniVersion) -> Result<PrevResult, CniError> {
        let decode = |msg: String| CniError::new(ErrorCode::Decode, msg);
        let Value::Object(raw) = value else {
            return Err(decode(format!(
                "prevResult is {}, expected a JSON object",
                json_type(value)
            )));
        };
        let version = match raw.get("cniVersion") {
            None => conf_version,
            Some(Value::String(s)) if s.is_empty() => conf_version,
            Some(Value::String(s)) => CniVersion::parse("prevResult cniVersion", s)?,
            Some(other) => {
                return Err(decode(format!(
                    "prevResult cniVersion is {}, expected a string",
                    json_type(other)
                )))
            }
        };

        let mut ips = Vec::new();
        match raw.get("ips") {
            None | Some(Value::Null) => {}
            Some(Value::Array(entries)) => {
                for (i, entry) in entries.iter().enumerate() {
                    let Value::Object(entry) = entry else {
                        return Err(decode(format!(
                            "prevResult.ips[{i}] is {}, expected a JSON object",
                            json_type(entry)
                        )));
                    };
                    let address = match entry.get("address") {
                        Some(Value::String(s)) => s,
                        None => {
                            return Err(CniError::new(
                                ErrorCode::InvalidConfig,
                                format!("prevResult.ips[{i}] has no \"address\""),
                            ))
                        }
                        Some(other) => {
                            return Err(decode(format!(
                                "prevResult.ips[{i}].address is {}, expected a string",
                                json_type(other)
                            )))
                        }
                    };
                    let ip: PodIp = address.parse().map_err(|problem| {
                        CniError::new(
                            ErrorCode::InvalidConfig,
                            format!("prevResult.ips[{i}].address {problem}"),
                        )
                    })?;
                    if let Some(v) = entry.get("version") {
                        let family = if ip.addr.is_ipv4() { "4" } else { "6" };
                        if v.as_str() != Some(family) {
                            return Err(CniError::new(
                                ErrorCode::InvalidConfig,
                                format!(
                                    "prevResult.ips[{i}].version is {v}, but address {address:?} is IPv{family}"
                                ),
                            ));
                        }
                    }
                    if let Some(idx) = entry.get("interface") {
                        if !idx.is_u64() {
                            return Err(decode(format!(
                                "prevResult.ips[{i}].interface is {idx}, expected an index (a non-negative integer)"
                            )));
                        }
                    }
                    ips.push(ip);
                }
            }
            Some(other) => {
                return Err(decode(format!(
                    "prevResult.ips is {}, expected an array",
                    json_type(other)
                )))
            }
        }
        for field in ["interfaces", "routes"] {
            if let Some(v) = raw.get(field) {
                if !(v.is_array() || v.is_null()) {
                    return Err(decode(format!(
                        "prevResult.{field} is {}, expected an array",
                        json_type(v)
                    )));
                }
            }
        }
        if let Some(v) = raw.get("dns") {
            if !(v.is_object() || v.is_null()) {
                return Err(decode(format!(
                    "prevResult.dns is {}, expected a JSON object",
                    json_type(v)
                )));
            }
        }

        Ok(PrevResult {
            raw: raw.clone(),
            version,
            ips,
        })
    }

    /// The version the result was encoded at.
    pub fn version(&self) -> CniVersion {
        self.version
    }

    /// The addresses of `ips`, in order: the pod's IPs.
    pub fn ips(&self) -> &[PodIp] {
        &self.ips
    }

    /// The raw JSON object, as received.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }

    /// The result re-encoded at `version`: `cniVersion` set, `ips[].version` added
    /// (before 1.0.0) or removed (1.0.0 on); everything else unchanged.
    pub fn encode(&self, version: CniVersion) -> Value {
        let mut out = self.raw.clone();
        out.insert("cniVersion".into(), Value::String(version.as_str().into()));
        if let Some(Value::Array(entries)) = out.get_mut("ips") {
            for (entry, ip) in entries.iter_mut().zip(&self.ips) {
                if let Value::Object(entry) = entry {
                    if version.results_have_ip_version() {
                        let family = if ip.addr.is_ipv4() { "4" } else { "6" };
                        entry.insert("version".into(), Value::String(family.into()));
                    } else {
                        entry.remove("version");
                    }
                }
            }
        }
        Value::Object(out)
    }

    /// [`encode`](Self::encode), as JSON text with object keys sorted.
    pub fn to_json(&self, version: CniVersion) -> String {
        to_canonical_json(&self.encode(version))
    }
}

/// JSON text with every object's keys in sorted order, whatever serde_json's
/// `preserve_order` feature says (another crate in the build may turn it on).
pub fn to_canonical_json(value: &Value) -> String {
    serde_json::to_string(&Sorted(value)).unwrap_or_default()
}

struct Sorted<'a>(&'a Value);

impl Serialize for Sorted<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                let mut m = serializer.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    m.serialize_entry(k, &Sorted(v))?;
                }
                m.end()
            }
            Value::Array(items) => {
                let mut s = serializer.serialize_seq(Some(items.len()))?;
                for v in items {
                    s.serialize_element(&Sorted(v))?;
                }
                s.end()
            }
            other => other.serialize(serializer),
        }
    }
}

/// "a string", "an array", ... for error messages.
pub(crate) fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn result_040() -> Value {
        json!({
            "cniVersion": "0.4.0",
            "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/var/run/netns/cni-1"}],
            "ips": [
                {"version": "4", "address": "10.244.1.7/24", "gateway": "10.244.1.1", "interface": 0},
                {"version": "6", "address": "fd00::7/64", "interface": 0}
            ],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dns": {}
        })
    }

    #[test]
    fn pod_ip_parse_and_display() {
        let ip: PodIp = "10.0.0.5/24".parse().unwrap();
        assert_eq!(ip.to_string(), "10.0.0.5/24");
        let ip: PodIp = "fd00::1/128".parse().unwrap();
        assert_eq!(ip.prefix_len, 128);
        assert_eq!(
            "10.0.0.5".parse::<PodIp>().unwrap_err().to_string(),
            r#""10.0.0.5" is not an address with a prefix length (like 10.0.0.5/24)"#
        );
        assert_eq!(
            "10.0.0.5/33".parse::<PodIp>().unwrap_err().to_string(),
            r#""10.0.0.5/33" has a prefix length above 32"#
        );
        assert!("nonsense/24".parse::<PodIp>().is_err());
    }

    #[test]
    fn ips_are_extracted_in_order() {
        let r = PrevResult::parse(&result_040(), CniVersion::V1_0_0).unwrap();
        assert_eq!(r.version(), CniVersion::V0_4_0);
        let ips: Vec<String> = r.ips().iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.244.1.7/24", "fd00::7/64"]);
    }

    #[test]
    fn encode_040_as_100_drops_ip_version() {
        let r = PrevResult::parse(&result_040(), CniVersion::V1_0_0).unwrap();
        assert_eq!(
            r.to_json(CniVersion::V1_0_0),
            r#"{"cniVersion":"1.0.0","dns":{},"interfaces":[{"mac":"aa:bb:cc:dd:ee:ff","name":"eth0","sandbox":"/var/run/netns/cni-1"}],"ips":[{"address":"10.244.1.7/24","gateway":"10.244.1.1","interface":0},{"address":"fd00::7/64","interface":0}],"routes":[{"dst":"0.0.0.0/0"}]}"#
        );
    }

    #[test]
    fn encode_110_as_031_adds_ip_version() {
        let v = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mtu": 1450}],
            "ips": [{"address": "fd00::7/64"}, {"address": "10.1.2.3/32"}]
        });
        let r = PrevResult::parse(&v, CniVersion::V0_3_1).unwrap();
        assert_eq!(
            r.to_json(CniVersion::V0_3_1),
            r#"{"cniVersion":"0.3.1","interfaces":[{"mtu":1450,"name":"eth0"}],"ips":[{"address":"fd00::7/64","version":"6"},{"address":"10.1.2.3/32","version":"4"}]}"#
        );
    }

    #[test]
    fn missing_version_means_the_config_version() {
        let r = PrevResult::parse(&json!({"ips": []}), CniVersion::V1_1_0).unwrap();
        assert_eq!(r.version(), CniVersion::V1_1_0);
        assert!(r.ips().is_empty());
        assert_eq!(
            r.to_json(CniVersion::V1_1_0),
            r#"{"cniVersion":"1.1.0","ips":[]}"#
        );
    }

    #[test]
    fn bad_results() {
        for (v, code, msg) in [
            (
                json!([]),
                ErrorCode::Decode,
                "prevResult is an array, expected a JSON object",
            ),
            (
                json!({"cniVersion": "0.2.0"}),
                ErrorCode::IncompatibleVersion,
                r#"prevResult cniVersion "0.2.0" is not supported (supported: 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0)"#,
            ),
            (
                json!({"cniVersion": 1}),
                ErrorCode::Decode,
                "prevResult cniVersion is a number, expected a string",
            ),
            (
                json!({"ips": {}}),
                ErrorCode::Decode,
                "prevResult.ips is an object, expected an array",
            ),
            (
                json!({"ips": ["x"]}),
                ErrorCode::Decode,
                "prevResult.ips[0] is a string, expected a JSON object",
            ),
            (
                json!({"ips": [{}]}),
                ErrorCode::InvalidConfig,
                r#"prevResult.ips[0] has no "address""#,
            ),
            (
                json!({"ips": [{"address": "10.0.0.1"}]}),
                ErrorCode::InvalidConfig,
                r#"prevResult.ips[0].address "10.0.0.1" is not an address with a prefix length (like 10.0.0.5/24)"#,
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/8", "version": "6"}]}),
                ErrorCode::InvalidConfig,
                r#"prevResult.ips[0].version is "6", but address "10.0.0.1/8" is IPv4"#,
            ),
            (
                json!({"ips": [{"address": "10.0.0.1/8", "interface": -1}]}),
                ErrorCode::Decode,
                "prevResult.ips[0].interface is -1, expected an index (a non-negative integer)",
            ),
            (
                json!({"routes": "x"}),
                ErrorCode::Decode,
                "prevResult.routes is a string, expected an array",
            ),
            (
                json!({"dns": []}),
                ErrorCode::Decode,
                "prevResult.dns is an array, expected a JSON object",
            ),
        ] {
            let e = PrevResult::parse(&v, CniVersion::V1_0_0).unwrap_err();
            assert_eq!((e.code, e.msg.as_str()), (code, msg), "{v}");
        }
    }

    #[test]
    fn canonical_json_sorts_nested_keys() {
        let v = json!({"b": [{"z": 1, "a": 2}], "a": null});
        assert_eq!(to_canonical_json(&v), r#"{"a":null,"b":[{"a":2,"z":1}]}"#);
    }
}
