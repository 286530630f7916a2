//! Service accounts of pods enrolled through CNI without a Kubernetes API
//! (file mode): CNI passes a pod's namespace, name and uid, never its
//! service account, and the agent never guesses one. The configuration says
//! it ([`ServiceAccountRule`], `ringway agent --pod-service-account`); a pod
//! no rule covers is refused at ADD.

use std::str::FromStr;

/// One rule: `NS=SA` (every pod of namespace `NS`) or `NS/POD=SA` (one pod;
/// wins over its namespace's rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRule {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name; `None` for every pod of the namespace.
    pub pod: Option<String>,
    /// The service account.
    pub service_account: String,
}

/// Why a `--pod-service-account` value is not a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("service account rule {value:?}: {reason} (want NS=SA or NS/POD=SA)")]
pub struct ServiceAccountRuleError {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// A Kubernetes name: DNS label / subdomain characters only.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl FromStr for ServiceAccountRule {
    type Err = ServiceAccountRuleError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let err = |reason| ServiceAccountRuleError {
            value: value.to_string(),
            reason,
        };
        let (who, sa) = value.split_once('=').ok_or_else(|| err("no '='"))?;
        let (namespace, pod) = match who.split_once('/') {
            Some((ns, pod)) => (ns, Some(pod)),
            None => (who, None),
        };
        if !is_name(namespace) {
            return Err(err("the namespace is not a Kubernetes name"));
        }
        if pod.is_some_and(|p| !is_name(p)) {
            return Err(err("the pod is not a Kubernetes name"));
        }
        if !is_name(sa) {
            return Err(err("the service account is not a Kubernetes name"));
        }
        Ok(ServiceAccountRule {
            namespace: namespace.to_string(),
            pod: pod.map(str::to_string),
            service_account: sa.to_string(),
        })
    }
}

impl std::fmt::Display for ServiceAccountRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.pod {
            Some(pod) => write!(f, "{}/{pod}={}", self.namespace, self.service_account),
            None => write!(f, "{}={}", self.namespace, self.service_account),
        }
    }
}

/// The service account `rules` give pod `namespace`/`name`: the pod's own
/// rule, else its namespace's (the last one given wins among equals).
pub fn service_account_of<'r>(
    rules: &'r [ServiceAccountRule],
    namespace: &str,
    name: &str,
) -> Option<&'r str> {
    let own = rules
        .iter()
        .rev()
        .find(|r| r.namespace == namespace && r.pod.as_deref() == Some(name));
    own.or_else(|| {
        rules
            .iter()
            .rev()
            .find(|r| r.namespace == namespace && r.pod.is_none())
    })
    .map(|r| r.service_account.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_the_pods_own_wins() {
        let rules: Vec<ServiceAccountRule> = ["shop=shop", "shop/web=web", "bank/vault=vault"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(service_account_of(&rules, "shop", "web"), Some("web"));
        assert_eq!(service_account_of(&rules, "shop", "cart"), Some("shop"));
        assert_eq!(service_account_of(&rules, "bank", "vault"), Some("vault"));
        assert_eq!(service_account_of(&rules, "bank", "teller"), None);
        assert_eq!(service_account_of(&rules, "other", "web"), None);
        assert_eq!(rules[1].to_string(), "shop/web=web");
        for bad in ["shop", "=sa", "shop=", "Shop=sa", "shop/=sa", "shop=s a"] {
            let e = bad.parse::<ServiceAccountRule>().unwrap_err();
            assert!(e.to_string().contains("want NS=SA or NS/POD=SA"), "{e}");
        }
    }
}
