//! The `security.istio.io` objects as the watch keeps them (metadata and raw
//! `spec`), their versions, and what both mappings share: names, notes,
//! the order objects are read in, the selector and the spec as far as they
//! can be read.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::ClusterPolicyNote;

/// The reference's root namespace: its policies there apply mesh-wide.
pub const DEFAULT_ISTIO_ROOT_NAMESPACE: &str = "istio-system";

/// The API group of both kinds.
pub const SECURITY_GROUP: &str = "security.istio.io";

/// Which served version of `security.istio.io` a watch uses (the kinds'
/// "dynamic type": the same Rust type reads both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecurityVersion {
    /// `v1` (Istio 1.22 and later).
    #[default]
    V1,
    /// `v1beta1`.
    V1beta1,
}

impl SecurityVersion {
    /// `v1` or `v1beta1`.
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityVersion::V1 => "v1",
            SecurityVersion::V1beta1 => "v1beta1",
        }
    }

    /// The other version.
    pub fn other(self) -> SecurityVersion {
        match self {
            SecurityVersion::V1 => SecurityVersion::V1beta1,
            SecurityVersion::V1beta1 => SecurityVersion::V1,
        }
    }
}

macro_rules! istio_kind {
    ($ty:ident, $kind:literal, $plural:literal) => {
        #[doc = concat!("A `security.istio.io` `", $kind, "` as the watch keeps it: its metadata and its raw `spec`.")]
        #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
        pub struct $ty {
            /// The object's metadata.
            pub metadata: ObjectMeta,
            /// The spec, as the API server sent it (read by the mapping).
            #[serde(default)]
            pub spec: Value,
        }

        impl ::kube::Resource for $ty {
            type DynamicType = SecurityVersion;
            type Scope = NamespaceResourceScope;

            fn kind(_: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }
            fn group(_: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed(SECURITY_GROUP)
            }
            fn version(v: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed(v.as_str())
            }
            fn plural(_: &SecurityVersion) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

istio_kind!(
    AuthorizationPolicyObject,
    "AuthorizationPolicy",
    "authorizationpolicies"
);
istio_kind!(
    PeerAuthenticationObject,
    "PeerAuthentication",
    "peerauthentications"
);

// ---- The API's shapes (the fields the mapping reads; anything else is kept
// in `other` so that an attribute this proxy does not know is never
// silently dropped from a rule). ----

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct WorkloadSelector {
    pub(super) match_labels: BTreeMap<String, String>,
}

/// How the mapping reads the objects.
#[derive(Debug, Clone)]
pub(crate) struct PolicyContext<'a> {
    /// Objects here apply mesh-wide.
    pub root_namespace: &'a str,
}

/// `Kind namespace/name`.
pub(super) fn object_name(kind: &str, meta: &ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// The entry name of a cluster object: `istio/<ns>/<name>`.
pub(super) fn entry_name(meta: &ObjectMeta) -> String {
    format!(
        "istio/{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

pub(super) fn note(
    object: &str,
    kind: &'static str,
    skipped: bool,
    code: &'static str,
    reason: String,
) -> ClusterPolicyNote {
    ClusterPolicyNote {
        object: object.to_owned(),
        kind,
        skipped,
        code,
        reason,
    }
}

/// Objects sorted oldest first (the reference's tie-break: the oldest
/// PeerAuthentication of a scope wins), then by namespace and name.
pub(super) fn oldest_first<T>(objects: &[Arc<T>], meta: impl Fn(&T) -> &ObjectMeta) -> Vec<&T> {
    let mut sorted: Vec<&T> = objects.iter().map(|o| &**o).collect();
    sorted.sort_by(|a, b| {
        let (a, b) = (meta(a), meta(b));
        (
            a.creation_timestamp.as_ref(),
            a.namespace.as_deref(),
            a.name.as_deref(),
        )
            .cmp(&(
                b.creation_timestamp.as_ref(),
                b.namespace.as_deref(),
                b.name.as_deref(),
            ))
    });
    sorted
}

/// The kinds, as notes and object names spell them.
pub(super) const AP: &str = "AuthorizationPolicy";
/// See [`AP`].
pub(super) const PA: &str = "PeerAuthentication";

/// The labels of a raw `selector.matchLabels` when they can be read (a map
/// of strings, not empty); `None` otherwise.
pub(super) fn readable_selector(spec: &Value) -> Option<BTreeMap<String, String>> {
    let labels = spec.get("selector")?.get("matchLabels")?;
    let map: BTreeMap<String, String> = serde_json::from_value(labels.clone()).ok()?;
    (!map.is_empty()).then_some(map)
}

/// A raw spec read as the API's shape `T` (an absent spec: `T`'s default).
pub(super) fn parse_spec<T: serde::de::DeserializeOwned + Default>(
    spec: &Value,
) -> Result<T, serde_json::Error> {
    if spec.is_null() {
        return Ok(T::default());
    }
    serde_json::from_value(spec.clone())
}
