//! Who is calling: the bearer token, reviewed by the Kubernetes API
//! (TokenReview), with the audience checked.
//!
//! A refusal tells the caller, who is not authenticated yet, only what kind
//! of failure it was (`token_rejected`, `token_review_failed`, ...): the API
//! server's own words are logged, never sent back.

use std::future::Future;
use std::pin::Pin;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;

use crate::grpc::{Code, Status};

/// An authenticated caller: a service account, and the pod its token was
/// bound to (when it was).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The service account's namespace.
    pub namespace: String,
    /// The service account.
    pub service_account: String,
    /// `authentication.kubernetes.io/pod-name` of a bound token.
    pub pod_name: Option<String>,
    /// `authentication.kubernetes.io/pod-uid` of a bound token.
    pub pod_uid: Option<String>,
    /// `authentication.kubernetes.io/node-name` (newer clusters).
    pub node_name: Option<String>,
}

impl Caller {
    /// `namespace/serviceAccount`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.service_account)
    }

    /// Whose request budget a call spends: the pod a bound token names
    /// (`namespace/serviceAccount/pod`), else the service account. Every
    /// node proxy of a cluster runs as one service account: a budget per
    /// service account would let one node (a node an attacker holds, or one
    /// starting a burst of pods) use up every other node's.
    pub fn rate_key(&self) -> String {
        match &self.pod_name {
            Some(pod) => format!("{}/{}/{pod}", self.namespace, self.service_account),
            None => self.key(),
        }
    }
}

/// A boxed future (the reviewer is used as a trait object).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Checks a bearer token.
pub trait TokenReviewer: Send + Sync {
    /// The caller the token belongs to, or why it is refused
    /// (`Unauthenticated`; `Unavailable` when the reviewer cannot be asked).
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Caller, Status>>;
}

/// Extra keys of a bound service-account token's review.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// See [`EXTRA_POD_NAME`].
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// See [`EXTRA_POD_NAME`].
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// The Kubernetes TokenReview API.
#[derive(Clone)]
pub struct KubeTokenReviewer {
    client: kube::Client,
    audience: String,
}

impl std::fmt::Debug for KubeTokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTokenReviewer")
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl KubeTokenReviewer {
    /// Reviews tokens with `client`, requiring `audience` (the reference
    /// uses `istio-ca`).
    pub fn new(client: kube::Client, audience: impl Into<String>) -> Self {
        KubeTokenReviewer {
            client,
            audience: audience.into(),
        }
    }
}

impl TokenReviewer for KubeTokenReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Caller, Status>> {
        Box::pin(async move {
            let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
            let tr = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_owned()),
                    audiences: Some(vec![self.audience.clone()]),
                },
                ..TokenReview::default()
            };
            let reviewed = api.create(&PostParams::default(), &tr).await.map_err(|e| {
                // The API server's words (its addresses, its storage's
                // errors) are for this log, not for a caller not yet
                // authenticated.
                tracing::warn!(error = %e, "TokenReview failed");
                Status::new(
                    Code::Unavailable,
                    "token_review_failed",
                    "cannot review the token now; retry",
                )
            })?;
            caller_from_review(&reviewed, &self.audience)
        })
    }
}

/// The caller a TokenReview's answer names, or why it is refused.
pub fn caller_from_review(tr: &TokenReview, audience: &str) -> Result<Caller, Status> {
    let unauth = |reason, m: String| Status::new(Code::Unauthenticated, reason, m);
    let status = tr
        .status
        .as_ref()
        .ok_or_else(|| unauth("token_rejected", "the token review has no status".into()))?;
    if status.authenticated != Some(true) {
        // Why the API server refused it is logged, not told: the caller is
        // not authenticated, and the reason can name the cluster's keys and
        // authenticators.
        tracing::info!(
            ca.review_error = status.error.as_deref().unwrap_or(""),
            "the Kubernetes API did not authenticate a token"
        );
        return Err(unauth(
            "token_rejected",
            "the token was not authenticated".into(),
        ));
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|a| a.iter().any(|x| x == audience))
    {
        return Err(unauth(
            "wrong_audience",
            format!("the token is not for audience {audience:?}"),
        ));
    }
    let user = status
        .user
        .as_ref()
        .ok_or_else(|| unauth("token_rejected", "the token review names no user".into()))?;
    let username = user.username.as_deref().unwrap_or_default();
    let rest = username
        .strip_prefix("system:serviceaccount:")
        .ok_or_else(|| {
            unauth(
                "not_a_service_account",
                format!("{username:?} is not a service account"),
            )
        })?;
    let (namespace, service_account) = rest
        .split_once(':')
        .filter(|(ns, sa)| !ns.is_empty() && !sa.is_empty() && !sa.contains(':'))
        .ok_or_else(|| {
            unauth(
                "not_a_service_account",
                format!("{username:?} is not a service account"),
            )
        })?;
    let extra = |key: &str| {
        user.extra
            .as_ref()
            .and_then(|m| m.get(key))
            .and_then(|v| match v.as_slice() {
                [one] if !one.is_empty() => Some(one.clone()),
                _ => None,
            })
    };
    Ok(Caller {
        namespace: namespace.to_owned(),
        service_account: service_account.to_owned(),
        pod_name: extra(EXTRA_POD_NAME),
        pod_uid: extra(EXTRA_POD_UID),
        node_name: extra(EXTRA_NODE_NAME),
    })
}
