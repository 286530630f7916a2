//! The mesh's `security.istio.io` policy objects (`AuthorizationPolicy`,
//! `PeerAuthentication`, versions `v1` and `v1beta1`, which have the same
//! shape) -> entries of the file model, enforced as the reference's node
//! proxy enforces their L4 part. The rules and the reasons are in
//! `config/README.md` ("Policies from the cluster").
//!
//! The watch keeps each object's `spec` as raw JSON: an object whose spec
//! does not have the API's shape is one skipped object (named, with why),
//! never a failed watch.
//!
//! `objects` holds the objects and what both mappings share;
//! `authorization` maps AuthorizationPolicies, `peer` PeerAuthentications;
//! this module maps them all ([`map_policies`]).

mod authorization;
mod objects;
mod peer;

use std::sync::Arc;

pub(crate) use self::authorization::scope_of;
pub use self::authorization::L4_WHEN_KEYS;
pub(crate) use self::objects::PolicyContext;
pub use self::objects::{
    AuthorizationPolicyObject, PeerAuthenticationObject, SecurityVersion,
    DEFAULT_ISTIO_ROOT_NAMESPACE, SECURITY_GROUP,
};
use crate::file::{PeerAuthenticationConfig, PolicyConfig};
use crate::model::ClusterPolicyNote;

/// What the mapping made: the entries, and what was skipped or changed.
#[derive(Debug, Default)]
pub(crate) struct MappedPolicies {
    pub policies: Vec<PolicyConfig>,
    pub peer_authentications: Vec<PeerAuthenticationConfig>,
    pub notes: Vec<ClusterPolicyNote>,
}

/// Maps every object; an object that cannot be mapped is left out with a
/// note (`skipped`), a mapped one that lost a part gets a note too.
pub(crate) fn map_policies(
    authorization_policies: &[Arc<AuthorizationPolicyObject>],
    peer_authentications: &[Arc<PeerAuthenticationObject>],
    cx: &PolicyContext<'_>,
) -> MappedPolicies {
    let mut out = MappedPolicies::default();
    for obj in objects::oldest_first(authorization_policies, |o| &o.metadata) {
        if let Some(p) = authorization::authorization_policy(obj, cx, &mut out.notes) {
            out.policies.push(p);
        }
    }
    for obj in objects::oldest_first(peer_authentications, |o| &o.metadata) {
        if let Some(p) = peer::peer_authentication(obj, cx, &mut out.notes) {
            out.peer_authentications.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests;
