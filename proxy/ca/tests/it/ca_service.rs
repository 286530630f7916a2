//! The certificate service: who gets which certificate, what the CA (not the
//! CSR) decides, malformed input, limits; the Kubernetes TokenReview client
//! against kube's mock service; and the gRPC transport end to end over TLS in
//! a network namespace of the test's own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use prost::Message;
use rcgen::{CertificateParams, IsCa, KeyPair, SanType};
use ringway_ca::authn::{caller_from_review, BoxFuture};
use ringway_ca::grpc::encode_frame;
use ringway_ca::pods::StaticPods;
use ringway_ca::proto::IstioCertificateRequest;
use ringway_ca::{
    CaClient, CaService, Caller, ClientError, Code, KubeTokenReviewer, Limits, PodView, Policy,
    Status, TokenReviewer,
};
use ringway_identity::{CaSigner, Identity};
use ringway_testbed::{wait_for, wait_for_async, TempDir};
use rustls_pki_types::CertificateDer;
use x509_parser::prelude::*;

const TD: &str = "cluster.local";
/// How long anything awaited here may take (a watch, a refresher, a slot).
const WAIT: Duration = Duration::from_secs(20);

/// Tokens and the callers they stand for; anything else is rejected.
#[derive(Default)]
struct FakeReviewer(HashMap<String, Caller>);

impl TokenReviewer for FakeReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Caller, Status>> {
        Box::pin(async move {
            self.0.get(token).cloned().ok_or_else(|| {
                Status::new(Code::Unauthenticated, "token_rejected", "unknown token")
            })
        })
    }
}

fn caller(ns: &str, sa: &str, pod: Option<(&str, &str)>) -> Caller {
    Caller {
        namespace: ns.into(),
        service_account: sa.into(),
        pod_name: pod.map(|(n, _)| n.into()),
        pod_uid: pod.map(|(_, u)| u.into()),
        node_name: None,
    }
}

fn pod(ns: &str, name: &str, uid: &str, node: &str, sa: &str) -> PodView {
    PodView {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.into(),
        node: node.into(),
        service_account: sa.into(),
        live: true,
        terminating: false,
    }
}

struct Bed {
    service: Arc<CaService>,
    ca: Arc<CaSigner>,
    pods: StaticPods,
}

fn bed_with(limits: Limits, signers: Vec<Arc<CaSigner>>) -> Bed {
    bed_reviewed_by(limits, signers, Arc::new(FakeReviewer(known_tokens())))
}

fn known_tokens() -> HashMap<String, Caller> {
    let mut tokens = HashMap::new();
    tokens.insert(
        "web-token".into(),
        caller("shop", "web", Some(("web-1", "u-web-1"))),
    );
    tokens.insert(
        "proxy-a".into(),
        caller("ringway-system", "ringway-proxy", Some(("proxy-a", "u-pa"))),
    );
    tokens.insert(
        "proxy-a-replaced".into(),
        caller(
            "ringway-system",
            "ringway-proxy",
            Some(("proxy-a", "u-old")),
        ),
    );
    tokens.insert(
        "proxy-b".into(),
        caller("ringway-system", "ringway-proxy", Some(("proxy-b", "u-pb"))),
    );
    tokens.insert(
        "proxy-unbound".into(),
        caller("ringway-system", "ringway-proxy", None),
    );
    tokens
}

fn bed_reviewed_by(
    limits: Limits,
    signers: Vec<Arc<CaSigner>>,
    reviewer: Arc<dyn TokenReviewer>,
) -> Bed {
    let pods = StaticPods::default();
    pods.put(pod("shop", "web-1", "u-web-1", "node-a", "web"));
    pods.put(pod("shop", "cart-1", "u-cart-1", "node-a", "cart"));
    pods.put(pod("bank", "vault-1", "u-vault-1", "node-b", "vault"));
    pods.put(pod(
        "ringway-system",
        "proxy-a",
        "u-pa",
        "node-a",
        "ringway-proxy",
    ));
    pods.put(pod(
        "ringway-system",
        "proxy-b",
        "u-pb",
        "node-b",
        "ringway-proxy",
    ));
    let ca = signers[0].clone();
    let service = CaService::new(
        Policy {
            trust_domain: TD.into(),
            node_proxy: ("ringway-system".into(), "ringway-proxy".into()),
        },
        limits,
        reviewer,
        Arc::new(pods.clone()),
        signers,
    )
    .unwrap();
    Bed {
        service: Arc::new(service),
        ca,
        pods,
    }
}

fn bed() -> Bed {
    bed_with(
        Limits::default(),
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
    )
}

/// A CSR that asks for much more than it may get: another identity, a DNS
/// name, CA rights.
fn greedy_csr() -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["evil.example".to_owned()]).unwrap();
    params.subject_alt_names.push(SanType::URI(
        "spiffe://cluster.local/ns/kube-system/sa/admin"
            .try_into()
            .unwrap(),
    ));
    params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn request(csr: &str) -> IstioCertificateRequest {
    IstioCertificateRequest {
        csr: csr.to_owned(),
        validity_duration: 0,
        metadata: None,
    }
}

fn body(req: &IstioCertificateRequest) -> Vec<u8> {
    encode_frame(&req.encode_to_vec()).to_vec()
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn call(b: &Bed, token: Option<&str>, body: &[u8]) -> Result<Vec<CertificateDer<'static>>, Status> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let resp = rt().block_on(b.service.create_certificate(auth.as_deref(), body))?;
    Ok(resp
        .cert_chain
        .iter()
        .map(|p| CertificateDer::from(::pem::parse(p).unwrap().into_contents()))
        .collect())
}

fn uris(cert: &CertificateDer<'_>) -> Vec<String> {
    let (_, x) = parse_x509_certificate(cert).unwrap();
    x.subject_alternative_name()
        .unwrap()
        .map(|s| {
            s.value
                .general_names
                .iter()
                .map(|n| match n {
                    GeneralName::URI(u) => u.to_string(),
                    other => format!("{other:?}"),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn issued(b: &Bed) -> u64 {
    b.service.count(Code::Ok, "issued")
}

#[test]
fn csr_a_pod_gets_its_own_identity_whatever_it_asks_for() {
    let b = bed();
    let mut req = request(&greedy_csr());
    req.validity_duration = 10 * 365 * 86400;
    let chain = call(&b, Some("web-token"), &body(&req)).unwrap();
    assert_eq!(chain.len(), 2, "leaf, then the root");
    assert_eq!(chain[1].as_ref(), b.ca.cert().as_ref(), "the root last");
    assert_eq!(
        uris(&chain[0]),
        ["spiffe://cluster.local/ns/shop/sa/web"],
        "the SAN is the caller's identity and nothing else"
    );
    let (_, leaf) = parse_x509_certificate(&chain[0]).unwrap();
    assert!(
        !leaf
            .basic_constraints()
            .unwrap()
            .is_some_and(|bc| bc.value.ca),
        "never a CA"
    );
    let ku = leaf.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment() && !ku.key_cert_sign());
    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    let lifetime = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    assert!(
        lifetime <= (24 * 3600 + 300) as i64,
        "the lifetime is capped at the configured 24 h (+ backdate), got {lifetime} s"
    );
    // Signed by the CA.
    let (_, root) = parse_x509_certificate(&chain[1]).unwrap();
    leaf.verify_signature(Some(root.public_key())).unwrap();
    assert_eq!(issued(&b), 1);
}

#[test]
fn adversarial_csr_impersonation_by_a_pod_is_refused() {
    let b = bed();
    let req = request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/cart");
    let e = call(&b, Some("web-token"), &body(&req)).unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    assert!(
        e.message.contains("only the node proxy's service account"),
        "{e}"
    );
    assert_eq!(
        b.service
            .count(Code::PermissionDenied, "impersonation_not_allowed"),
        1
    );
    assert_eq!(issued(&b), 0);
    // Asking for its own identity through the field is fine.
    let own = request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/web");
    call(&b, Some("web-token"), &body(&own)).unwrap();
}

#[test]
fn csr_the_node_proxy_gets_the_identity_of_a_pod_on_its_node() {
    let b = bed();
    let req = request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/cart");
    let chain = call(&b, Some("proxy-a"), &body(&req)).unwrap();
    assert_eq!(uris(&chain[0]), ["spiffe://cluster.local/ns/shop/sa/cart"]);
}

/// A pod being deleted runs through its grace period: its node's proxy
/// still gets its identity (a proxy restarted meanwhile must serve it). A
/// node proxy being deleted may no longer impersonate anyone.
#[test]
fn adversarial_csr_terminating_pods_keep_their_identity_but_a_terminating_proxy_impersonates_none()
{
    let b = bed();
    let cart = request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/cart");
    b.pods.put(PodView {
        terminating: true,
        ..pod("shop", "cart-1", "u-cart-1", "node-a", "cart")
    });
    let chain = call(&b, Some("proxy-a"), &body(&cart)).expect("a terminating pod's identity");
    assert_eq!(uris(&chain[0]), ["spiffe://cluster.local/ns/shop/sa/cart"]);
    b.pods.put(PodView {
        terminating: true,
        ..pod(
            "ringway-system",
            "proxy-a",
            "u-pa",
            "node-a",
            "ringway-proxy",
        )
    });
    let e = call(&b, Some("proxy-a"), &body(&cart)).unwrap_err();
    assert_eq!(
        (e.code, e.reason),
        (Code::PermissionDenied, "caller_pod_not_running")
    );
}

#[test]
fn adversarial_csr_a_node_proxy_cannot_mint_identities_of_pods_elsewhere() {
    let b = bed();
    let cases = [
        // A pod that runs on node-b only.
        (
            "proxy-a",
            "spiffe://cluster.local/ns/bank/sa/vault",
            Code::PermissionDenied,
            "identity_not_on_node",
        ),
        // Nobody runs as this.
        (
            "proxy-a",
            "spiffe://cluster.local/ns/kube-system/sa/admin",
            Code::PermissionDenied,
            "identity_not_on_node",
        ),
        // Another trust domain.
        (
            "proxy-a",
            "spiffe://evil.example/ns/shop/sa/cart",
            Code::PermissionDenied,
            "foreign_trust_domain",
        ),
        // A token of an earlier pod of the same name.
        (
            "proxy-a-replaced",
            "spiffe://cluster.local/ns/shop/sa/cart",
            Code::PermissionDenied,
            "caller_pod_replaced",
        ),
        // A token bound to no pod: the caller's node is unknown.
        (
            "proxy-unbound",
            "spiffe://cluster.local/ns/shop/sa/cart",
            Code::PermissionDenied,
            "token_not_bound_to_a_pod",
        ),
        // Not a SPIFFE workload identity.
        (
            "proxy-a",
            "spiffe://cluster.local/ns/shop",
            Code::InvalidArgument,
            "bad_impersonated_identity",
        ),
    ];
    for (token, wanted, code, reason) in cases {
        let req = request(&greedy_csr()).with_impersonation(wanted);
        let e = call(&b, Some(token), &body(&req)).unwrap_err();
        assert_eq!(
            (e.code, e.reason),
            (code, reason),
            "{token} asking {wanted}: {e}"
        );
    }
    // The pod moved away (deleted, then the same identity only on node-b).
    b.pods.remove("shop", "cart-1");
    b.pods
        .put(pod("shop", "cart-2", "u-cart-2", "node-b", "cart"));
    let req = request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/cart");
    let e = call(&b, Some("proxy-a"), &body(&req)).unwrap_err();
    assert_eq!(e.reason, "identity_not_on_node", "{e}");
    assert_eq!(issued(&b), 0);
}

/// A token that names a pod but not its UID (a legacy or forged-looking
/// review answer) does not prove which incarnation of the pod holds it: a
/// replaced pod's token would pass. Impersonation needs a bound token.
#[test]
fn adversarial_impersonation_needs_a_token_bound_to_the_pods_uid() {
    let mut tokens = known_tokens();
    let mut no_uid = caller("ringway-system", "ringway-proxy", Some(("proxy-a", "")));
    no_uid.pod_uid = None;
    tokens.insert("proxy-a-no-uid".into(), no_uid);
    let b = bed_reviewed_by(
        Limits::default(),
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
        Arc::new(FakeReviewer(tokens)),
    );
    let req = request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/cart");
    let e = call(&b, Some("proxy-a-no-uid"), &body(&req)).unwrap_err();
    assert_eq!(
        (e.code, e.reason),
        (Code::PermissionDenied, "token_not_bound_to_a_pod"),
        "{e}"
    );
    assert_eq!(issued(&b), 0);
    // Its own identity needs no pod.
    call(&b, Some("proxy-a-no-uid"), &body(&request(&greedy_csr()))).unwrap();
    // The same pod's bound token is served.
    call(&b, Some("proxy-a"), &body(&req)).unwrap();
}

/// A pod without a service account (a static or mirror pod, which a
/// node's kubelet may create in any namespace) has no identity: the CA never
/// counts it as holding `sa/default`, so a node proxy cannot get
/// `ns/<any>/sa/default` on its strength.
#[test]
fn adversarial_a_pod_without_a_service_account_lends_its_node_no_identity() {
    let b = bed();
    let mirror: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "kube-system", "name": "etcd-node-a", "uid": "u-etcd"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "etcd"}]},
        "status": {"phase": "Running"}
    }))
    .unwrap();
    let view = ringway_ca::pods::view(&mirror).unwrap();
    assert_eq!(
        view.service_account, "",
        "no service account, not `default`"
    );
    b.pods.put(view);
    // An explicit empty name is no service account either.
    b.pods
        .put(pod("payments", "static-1", "u-static-1", "node-a", ""));
    for ns in ["kube-system", "payments"] {
        let wanted = format!("spiffe://cluster.local/ns/{ns}/sa/default");
        let req = request(&greedy_csr()).with_impersonation(&wanted);
        let e = call(&b, Some("proxy-a"), &body(&req)).unwrap_err();
        assert_eq!(
            (e.code, e.reason),
            (Code::PermissionDenied, "identity_not_on_node"),
            "{wanted}: {e}"
        );
    }
    assert_eq!(issued(&b), 0);
}

/// A service whose pods come from `pods`, with the usual tokens.
fn service_with_pods(pods: Arc<dyn ringway_ca::PodDirectory>) -> Arc<CaService> {
    Arc::new(
        CaService::new(
            Policy {
                trust_domain: TD.into(),
                node_proxy: ("ringway-system".into(), "ringway-proxy".into()),
            },
            Limits::default(),
            Arc::new(FakeReviewer(known_tokens())),
            pods,
            vec![Arc::new(CaSigner::generate_for_tests(TD))],
        )
        .unwrap(),
    )
}

/// A pod watch that keeps failing leaves the CA with a cache that grows
/// older every second: a pod deleted or moved meanwhile would still lend
/// its identity to its old node. Impersonation is refused once the watch
/// has been failing for longer than its bound (served within it), readiness
/// says why, and both come back with the watch.
#[test]
fn adversarial_impersonation_is_refused_once_the_pod_watch_has_failed_too_long() {
    use ringway_testbed::kube_api::{ApiMode, FakeApiServer, FakePod, Kind};
    let watch_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (client, api) = FakeApiServer::start(watch_rt.handle());
    for (uid, ns, name, sa) in [
        ("u-pa", "ringway-system", "proxy-a", "ringway-proxy"),
        ("u-cart-1", "shop", "cart-1", "cart"),
    ] {
        api.apply_pod(
            FakePod::new(uid, ns, name, "node-a")
                .service_account(sa)
                .running(&[])
                .json(),
        );
    }
    let (strict, patient) = {
        let _g = watch_rt.enter();
        (
            Arc::new(ringway_ca::pods::WatchedPods::start(
                client.clone(),
                Duration::ZERO,
            )),
            Arc::new(ringway_ca::pods::WatchedPods::start(
                client,
                Duration::from_secs(3600),
            )),
        )
    };
    let (strict_ca, patient_ca) = (
        service_with_pods(strict.clone()),
        service_with_pods(patient.clone()),
    );
    let req =
        body(&request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/cart"));
    let ask = |ca: &CaService| rt().block_on(ca.create_certificate(Some("Bearer proxy-a"), &req));
    use ringway_ca::PodDirectory;
    wait_for("both watches listed", WAIT, || {
        strict.ready().is_ok() && patient.ready().is_ok()
    });
    ask(&strict_ca).unwrap();
    ask(&patient_ca).unwrap();

    // The API server goes away: the open watches end, and every new list and
    // watch fails.
    api.set_mode_of(Kind::Pod, ApiMode::Unreachable);
    api.end_watches(Kind::Pod);
    wait_for("the strict directory stops answering", WAIT, || {
        strict.ready().is_err()
    });
    let why = strict.ready().unwrap_err().detail();
    assert!(why.contains("pod watch"), "readiness says why: {why}");
    let e = ask(&strict_ca).unwrap_err();
    assert_eq!(
        (e.code, e.reason),
        (Code::Unavailable, "pod_cache_stale"),
        "{e}"
    );
    // Within its bound the other one still answers, knowing the watch fails.
    wait_for("the patient directory sees the failure", WAIT, || {
        patient.watch_failing().is_some()
    });
    assert!(patient.ready().is_ok());
    ask(&patient_ca).unwrap();

    // The watch comes back (a fresh list): both answer again.
    api.set_mode_of(Kind::Pod, ApiMode::Serve);
    wait_for("the strict directory recovers", WAIT, || {
        strict.ready().is_ok()
    });
    wait_for("the patient directory recovers", WAIT, || {
        patient.watch_failing().is_none()
    });
    ask(&strict_ca).unwrap();
    assert_eq!(strict_ca.count(Code::Unavailable, "pod_cache_stale"), 1);
}

#[test]
fn adversarial_csr_malformed_requests_get_invalid_argument_and_change_nothing() {
    let b = bed();
    let good = greedy_csr();
    let mut tampered = good.clone();
    // Flip a character inside the base64 body: the signature no longer verifies
    // (or the DER no longer parses).
    let i = tampered.len() / 2;
    let c = tampered.as_bytes()[i];
    tampered.replace_range(i..i + 1, if c == b'A' { "B" } else { "A" });
    let mut meta_number = request(&good);
    meta_number.metadata = Some(prost_types::Struct {
        fields: [(
            "ImpersonatedIdentity".to_owned(),
            prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(7.0)),
            },
        )]
        .into_iter()
        .collect(),
    });
    let mut negative = request(&good);
    negative.validity_duration = -5;
    let huge = request(&"A".repeat(20_000));
    let cases: Vec<(&str, Vec<u8>, Code, &str)> = vec![
        (
            "empty body",
            vec![],
            Code::InvalidArgument,
            "malformed_frame",
        ),
        (
            "not protobuf",
            encode_frame(&[0xff, 0xff, 0xff]).to_vec(),
            Code::InvalidArgument,
            "malformed_request",
        ),
        (
            "no csr",
            body(&request("")),
            Code::InvalidArgument,
            "no_csr",
        ),
        (
            "not a CSR",
            body(&request("hello")),
            Code::InvalidArgument,
            "bad_csr",
        ),
        (
            "tampered CSR",
            body(&request(&tampered)),
            Code::InvalidArgument,
            "bad_csr",
        ),
        (
            "metadata not a string",
            body(&meta_number),
            Code::InvalidArgument,
            "bad_metadata",
        ),
        (
            "negative validity",
            body(&negative),
            Code::InvalidArgument,
            "bad_validity",
        ),
        (
            "oversized CSR",
            body(&huge),
            Code::InvalidArgument,
            "csr_too_large",
        ),
        (
            "oversized message",
            encode_frame(&vec![0u8; 70_000]).to_vec(),
            Code::ResourceExhausted,
            "too_large",
        ),
    ];
    for (what, bytes, code, reason) in cases {
        let e = call(&b, Some("web-token"), &bytes).unwrap_err();
        assert_eq!((e.code, e.reason), (code, reason), "{what}: {e}");
        assert!(!e.message.is_empty(), "{what}: the message says why");
    }
    assert_eq!(issued(&b), 0, "nothing was issued");
    // And the service still works.
    call(&b, Some("web-token"), &body(&request(&good))).unwrap();
}

#[test]
fn adversarial_csr_calls_without_a_valid_token_are_unauthenticated() {
    let b = bed();
    let req = body(&request(&greedy_csr()));
    for (auth, reason) in [
        (None, "no_token"),
        (Some("Basic abc"), "no_token"),
        (Some("Bearer "), "no_token"),
        (Some("Bearer not-a-known-token"), "token_rejected"),
    ] {
        let e = rt()
            .block_on(b.service.create_certificate(auth, &req))
            .unwrap_err();
        assert_eq!(
            (e.code, e.reason),
            (Code::Unauthenticated, reason),
            "{auth:?}: {e}"
        );
    }
    assert_eq!(issued(&b), 0);
}

#[test]
fn adversarial_csr_each_caller_is_rate_limited_on_its_own() {
    let b = bed_with(
        Limits {
            rate_per_caller: 0.001,
            burst_per_caller: 3.0,
            ..Limits::default()
        },
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
    );
    let req = body(&request(&greedy_csr()));
    for _ in 0..3 {
        call(&b, Some("web-token"), &req).unwrap();
    }
    let e = call(&b, Some("web-token"), &req).unwrap_err();
    assert_eq!(
        (e.code, e.reason),
        (Code::ResourceExhausted, "rate_limited"),
        "{e}"
    );
    // Another caller is not affected.
    call(&b, Some("proxy-a"), &req).unwrap();
    let metrics = b.service.encode_metrics();
    assert!(
        metrics.contains(
            r#"ringway_ca_requests_total{code="resource_exhausted",reason="rate_limited"} 1"#
        ),
        "{metrics}"
    );
}

/// Every node proxy of the cluster runs as the same service account: one
/// node's proxy (a node an attacker holds, or one enrolling a burst of
/// pods) must not use up the requests of the proxies of other nodes.
#[test]
fn adversarial_csr_one_node_proxy_flood_does_not_starve_the_other_nodes() {
    let b = bed_with(
        Limits {
            rate_per_caller: 0.001,
            burst_per_caller: 3.0,
            ..Limits::default()
        },
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
    );
    let on_a =
        body(&request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/web"));
    for _ in 0..3 {
        call(&b, Some("proxy-a"), &on_a).unwrap();
    }
    let e = call(&b, Some("proxy-a"), &on_a).unwrap_err();
    assert_eq!(
        (e.code, e.reason),
        (Code::ResourceExhausted, "rate_limited"),
        "{e}"
    );
    assert!(
        e.message.contains("proxy-a"),
        "the message names the pod: {e}"
    );
    // Node b's proxy, same service account, is served.
    let on_b =
        body(&request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/bank/sa/vault"));
    let chain = call(&b, Some("proxy-b"), &on_b)
        .unwrap_or_else(|e| panic!("node b's proxy starved by node a's: {e}"));
    assert_eq!(uris(&chain[0]), ["spiffe://cluster.local/ns/bank/sa/vault"]);
}

#[test]
fn csr_with_several_roots_the_newest_valid_one_signs() {
    let now = SystemTime::now();
    let old = Arc::new(CaSigner::generate_for_tests_with_validity(
        TD,
        now - Duration::from_secs(86400 * 300),
        now + Duration::from_secs(86400 * 30),
    ));
    let new = Arc::new(CaSigner::generate_for_tests_with_validity(
        TD,
        now - Duration::from_secs(3600),
        now + Duration::from_secs(86400 * 3000),
    ));
    let future = Arc::new(CaSigner::generate_for_tests_with_validity(
        TD,
        now + Duration::from_secs(86400),
        now + Duration::from_secs(86400 * 4000),
    ));
    let b = bed_with(Limits::default(), vec![old, future, new.clone()]);
    let chain = call(&b, Some("web-token"), &body(&request(&greedy_csr()))).unwrap();
    assert_eq!(chain.last().unwrap().as_ref(), new.cert().as_ref());
    let (_, leaf) = parse_x509_certificate(&chain[0]).unwrap();
    assert!(
        leaf.validity().not_before.timestamp()
            >= parse_x509_certificate(new.cert())
                .unwrap()
                .1
                .validity()
                .not_before
                .timestamp(),
        "a leaf never starts before its issuer"
    );
}

// ------------------------------------------------ TokenReview against kube's mock service

/// A kube client whose API server answers TokenReview POSTs with `answer`
/// (given the request's JSON), recording the requests.
fn kube_client(
    answer: impl Fn(&serde_json::Value) -> serde_json::Value + Send + Sync + 'static,
) -> (kube::Client, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
    kube_client_answering(move |req| (201, answer(req)))
}

/// As [`kube_client`], the answer's HTTP status chosen too.
fn kube_client_answering(
    answer: impl Fn(&serde_json::Value) -> (u16, serde_json::Value) + Send + Sync + 'static,
) -> (kube::Client, Arc<std::sync::Mutex<Vec<serde_json::Value>>>) {
    use http_body_util::BodyExt;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let answer = Arc::new(answer);
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let (seen, answer) = (seen2.clone(), answer.clone());
        async move {
            assert_eq!(req.method(), http::Method::POST);
            assert_eq!(
                req.uri().path(),
                "/apis/authentication.k8s.io/v1/tokenreviews"
            );
            let bytes = req.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let (code, out) = answer(&v);
            seen.lock().unwrap().push(v);
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(serde_json::to_vec(&out).unwrap()))
                    .unwrap(),
            )
        }
    });
    (kube::Client::new(svc, "default"), seen)
}

fn review_answer(req: &serde_json::Value, status: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": req["spec"].clone(),
        "status": status,
    })
}

#[test]
fn csr_token_reviews_go_to_the_kubernetes_api_with_the_audience() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, seen) = kube_client(|req| {
            let token = req["spec"]["token"].as_str().unwrap();
            let status = match token {
                "good" => serde_json::json!({
                    "authenticated": true,
                    "audiences": ["istio-ca"],
                    "user": {
                        "username": "system:serviceaccount:ringway-system:ringway-proxy",
                        "extra": {
                            "authentication.kubernetes.io/pod-name": ["proxy-a"],
                            "authentication.kubernetes.io/pod-uid": ["u-pa"],
                            "authentication.kubernetes.io/node-name": ["node-a"]
                        }
                    }
                }),
                "other-audience" => serde_json::json!({
                    "authenticated": true,
                    "audiences": ["kubernetes"],
                    "user": {"username": "system:serviceaccount:shop:web"}
                }),
                "a-user" => serde_json::json!({
                    "authenticated": true,
                    "audiences": ["istio-ca"],
                    "user": {"username": "alice"}
                }),
                _ => serde_json::json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            review_answer(req, status)
        });
        let reviewer = KubeTokenReviewer::new(client, "istio-ca");
        let c = reviewer.review("good").await.unwrap();
        assert_eq!(
            c,
            Caller {
                namespace: "ringway-system".into(),
                service_account: "ringway-proxy".into(),
                pod_name: Some("proxy-a".into()),
                pod_uid: Some("u-pa".into()),
                node_name: Some("node-a".into()),
            }
        );
        assert_eq!(
            seen.lock().unwrap()[0]["spec"]["audiences"],
            serde_json::json!(["istio-ca"]),
            "the audience is sent"
        );
        for (token, reason) in [
            ("other-audience", "wrong_audience"),
            ("a-user", "not_a_service_account"),
            ("forged", "token_rejected"),
        ] {
            let e = reviewer.review(token).await.unwrap_err();
            assert_eq!(
                (e.code, e.reason),
                (Code::Unauthenticated, reason),
                "{token}: {e}"
            );
        }
    });
}

/// What the API server says about a token it refuses, or about itself when
/// it fails, is for the CA's log: an unauthenticated caller gets a generic
/// status (the API server's addresses, its storage's errors and its
/// verdict's details would tell an attacker about the cluster).
#[test]
fn adversarial_api_server_error_text_never_reaches_the_caller() {
    const SECRET: &str = "etcd-3.internal:2379 key kid-7f3a";
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, _) = kube_client_answering(|req| {
            match req["spec"]["token"].as_str().unwrap() {
                "api-down" => (
                    500,
                    serde_json::json!({
                        "kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": format!("etcdserver: request timed out talking to {SECRET}"),
                        "reason": "InternalError", "code": 500
                    }),
                ),
                _ => (
                    201,
                    review_answer(
                        req,
                        serde_json::json!({
                            "authenticated": false,
                            "error": format!("[invalid bearer token, square/go-jose: error in cryptographic primitive: {SECRET}]")
                        }),
                    ),
                ),
            }
        });
        let reviewer = KubeTokenReviewer::new(client, "istio-ca");
        for (token, code, reason) in [
            ("api-down", Code::Unavailable, "token_review_failed"),
            ("forged", Code::Unauthenticated, "token_rejected"),
        ] {
            let e = reviewer.review(token).await.unwrap_err();
            assert_eq!((e.code, e.reason), (code, reason), "{token}: {e}");
            for leak in ["etcd", "kid-7f3a", "go-jose", "invalid bearer token", "500"] {
                assert!(
                    !e.message.contains(leak),
                    "{token}: the caller is told {leak:?}: {e}"
                );
            }
            assert!(!e.message.is_empty(), "{token}: still a status that says what failed");
        }
    });
}

#[test]
fn csr_a_review_answer_with_odd_service_account_names_is_refused() {
    for username in [
        "system:serviceaccount:",
        "system:serviceaccount:ns",
        "system:serviceaccount::sa",
        "system:serviceaccount:ns:",
        "system:serviceaccount:ns:sa:extra",
    ] {
        let tr: k8s_openapi::api::authentication::v1::TokenReview =
            serde_json::from_value(serde_json::json!({
                "spec": {},
                "status": {"authenticated": true, "audiences": ["istio-ca"], "user": {"username": username}}
            }))
            .unwrap();
        let e = caller_from_review(&tr, "istio-ca").unwrap_err();
        assert_eq!(e.reason, "not_a_service_account", "{username}");
    }
}

// ------------------------------------------------------------- over TLS, end to end

struct Served {
    client: CaClient,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    bed: Bed,
    addr: std::net::SocketAddr,
    /// A client TLS config trusting the serving certificate (ALPN h2).
    tls: Arc<rustls::ClientConfig>,
}

/// The service on 127.0.0.1 (in the caller's own network namespace) with a
/// serving certificate for `ca.test`.
async fn serve(bed: Bed) -> Served {
    serve_limited(bed, ringway_ca::server::ServerLimits::default()).await
}

/// [`serve`] with these transport limits.
async fn serve_limited(bed: Bed, limits: ringway_ca::server::ServerLimits) -> Served {
    serve_at(bed, limits, "127.0.0.1:0".parse().unwrap()).await
}

/// [`serve_limited`] on `at`.
async fn serve_at(
    bed: Bed,
    limits: ringway_ca::server::ServerLimits,
    at: std::net::SocketAddr,
) -> Served {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["ca.test".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let mut tls = rustls::ServerConfig::builder_with_provider(ringway_identity::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let listener = tokio::net::TcpListener::bind(at).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(ringway_ca::server::serve(
        listener,
        Arc::new(tls),
        bed.service.clone(),
        limits,
        async {
            let _ = stopped.await;
        },
    ));
    let tls = CaClient::tls_config(&[cert.der().clone()]).unwrap();
    let client = CaClient::new(
        addr,
        rustls_pki_types::ServerName::try_from("ca.test").unwrap(),
        tls.clone(),
    );
    Served {
        client,
        stop: Some(stop),
        bed,
        addr,
        tls,
    }
}

fn isolated<F: std::future::Future<Output = ()>>(name: &str, f: impl FnOnce() -> F + Send) {
    ringway_testbed::run_isolated(name, || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(f())
    });
}

/// A certificate service named `host:port` (as `ca.address` is): the name
/// is resolved at every request and each of its addresses tried until one
/// completes TCP and TLS. The first address of the name drops every
/// connection (a replica going away), the second serves: a certificate
/// comes from the second. Then the name moves to another address (the
/// Service re-created) and the first server stops: the next request
/// follows the name there, with no restart of the client.
#[test]
fn csr_the_certificate_service_name_is_resolved_at_every_request_and_each_address_tried() {
    isolated("ca_resolving", || async {
        let hosts = TempDir::new("ca_resolving_hosts");
        ringway_testbed::ns::override_etc_hosts(&hosts, "127.0.0.2 ca.test\n127.0.0.3 ca.test\n")
            .unwrap();
        let order: Vec<std::net::IpAddr> = tokio::net::lookup_host("ca.test:1")
            .await
            .unwrap()
            .map(|a| a.ip())
            .collect();
        assert_eq!(order.len(), 2, "{order:?}");
        let limits = ringway_ca::server::ServerLimits::default();
        let first = serve_at(
            bed(),
            limits.clone(),
            std::net::SocketAddr::new(order[1], 0),
        )
        .await;
        let port = first.addr.port();
        // The name's first address takes connections and drops them.
        let dropping = tokio::net::TcpListener::bind((order[0], port))
            .await
            .unwrap();
        let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let d = dropped.clone();
        let dropper = tokio::spawn(async move {
            while let Ok((tcp, _)) = dropping.accept().await {
                d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                drop(tcp);
            }
        });
        let tls = ringway_grpc::ClientTls::new(first.tls.clone());
        let client = CaClient::resolving(
            format!("ca.test:{port}"),
            rustls_pki_types::ServerName::try_from("ca.test").unwrap(),
            tls.clone(),
        );
        let csr = CertificateParams::default()
            .serialize_request(&KeyPair::generate().unwrap())
            .unwrap()
            .pem()
            .unwrap();
        let cart = Identity::new(TD, "shop", "cart");
        let hour = Duration::from_secs(3600);
        client
            .create_certificate("proxy-a", &csr, &cart, true, hour)
            .await
            .expect("a certificate through the name's second address");
        assert!(
            dropped.load(std::sync::atomic::Ordering::SeqCst) >= 1,
            "the first address was not tried"
        );
        assert_eq!(issued(&first.bed), 1);
        dropper.abort();

        // The name moves and the first server stops: the service answers
        // only at the new address now (with a serving certificate of its
        // own, which the same client is told to trust).
        ringway_testbed::ns::override_etc_hosts(&hosts, "127.0.0.4 ca.test\n").unwrap();
        drop(first);
        let second = serve_at(
            bed(),
            limits,
            std::net::SocketAddr::new([127, 0, 0, 4].into(), port),
        )
        .await;
        tls.replace(second.tls.clone());
        client
            .create_certificate("proxy-a", &csr, &cart, true, hour)
            .await
            .expect("a certificate from the name's new address");
        assert_eq!(issued(&second.bed), 1);
    });
}

#[test]
fn csr_a_node_proxy_gets_a_pods_certificate_over_grpc_and_tls() {
    isolated("ca_grpc_end_to_end", || async {
        let mut s = serve(bed()).await;
        let key = KeyPair::generate().unwrap();
        let csr = CertificateParams::default()
            .serialize_request(&key)
            .unwrap()
            .pem()
            .unwrap();
        let cart = Identity::new(TD, "shop", "cart");
        let chain = s
            .client
            .create_certificate("proxy-a", &csr, &cart, true, Duration::from_secs(3600))
            .await
            .unwrap();
        assert_eq!(uris(&chain[0]), ["spiffe://cluster.local/ns/shop/sa/cart"]);
        let (_, leaf) = parse_x509_certificate(&chain[0]).unwrap();
        assert_eq!(
            leaf.public_key().subject_public_key.data.as_ref(),
            key.public_key_raw(),
            "the leaf certifies the proxy's own key"
        );

        // A refusal reaches the client as the gRPC status with its message.
        let vault = Identity::new(TD, "bank", "vault");
        let e = s
            .client
            .create_certificate("proxy-a", &csr, &vault, true, Duration::from_secs(3600))
            .await
            .unwrap_err();
        match e {
            ClientError::Refused(st) => {
                assert_eq!(st.code, Code::PermissionDenied);
                assert!(st.message.contains("node-a"), "{}", st.message);
            }
            other => panic!("expected a refusal, got {other}"),
        }

        // The client refuses a certificate for another identity than it asked
        // for: a pod's own token gets the pod's identity, whatever was asked.
        let e = s
            .client
            .create_certificate("web-token", &csr, &cart, false, Duration::from_secs(3600))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ClientError::WrongIdentity { got, .. } if got == "spiffe://cluster.local/ns/shop/sa/web"),
            "{e}"
        );
        assert_eq!(s.bed.service.count(Code::Ok, "issued"), 2);
        let _ = s.stop.take().unwrap().send(());
    });
}

#[test]
fn csr_the_grpc_server_refuses_garbage_with_a_status() {
    isolated("ca_grpc_bad_calls", || async {
        let s = serve(bed()).await;
        // A body that is no gRPC frame, through the real client path.
        let e = s
            .client
            .call("web-token", &request("not a csr"))
            .await
            .unwrap_err();
        match e {
            ClientError::Refused(st) => assert_eq!(st.code, Code::InvalidArgument, "{st}"),
            other => panic!("{other}"),
        }
        assert_eq!(s.bed.service.count(Code::InvalidArgument, "bad_csr"), 1);
    });
}

// ------------------------------------------------- the node proxy as a client

/// A CA server on `addr` in a runtime of its own; stopped on drop.
fn serve_on(
    addr: std::net::SocketAddr,
    service: Arc<CaService>,
    tls: Arc<rustls::ServerConfig>,
) -> ringway_ca::server::Server {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    ringway_ca::server::Server::start(rt, addr, tls, service, Default::default()).unwrap()
}

#[test]
fn csr_a_proxy_gets_its_pods_certificates_from_the_service_and_fails_closed_without_it() {
    ringway_testbed::run_isolated("ca_remote_source", || {
        use ringway_identity::{IdentityManager, TrustBundle};
        let bed = bed();
        // The service's serving certificate, issued by the mesh root (the
        // proxy trusts only that root).
        let serving = bed.ca.issue_dns_for_tests("ringway-ca.test");
        let mut tls =
            rustls::ServerConfig::builder_with_provider(ringway_identity::crypto_provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(serving.chain.clone(), serving.key.clone_key())
                .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        let tls = Arc::new(tls);
        // A port to use later; nothing listens yet.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();

        let dir = TempDir::new("ca-remote");
        let token = dir.join("token");
        std::fs::write(&token, "proxy-a\n").unwrap();
        let mut bundle = TrustBundle::new();
        bundle.add(bed.ca.cert().clone());
        let client = CaClient::new(
            addr,
            rustls_pki_types::ServerName::try_from("ringway-ca.test").unwrap(),
            CaClient::tls_config(bundle.roots()).unwrap(),
        );
        let source = ringway_ca::client::RemoteSource::new(client, &token).unwrap();
        let ids = Arc::new(
            IdentityManager::with_source(Arc::new(source), bundle, TD, Duration::from_secs(3600))
                .unwrap(),
        );
        let cart = Identity::new(TD, "shop", "cart");
        let web = Identity::new(TD, "shop", "web");

        // The service is down: no certificate, and the datapath fails closed
        // (never another identity, never a wait).
        let e = ids.prefetch(&cart, Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains("cart"), "{e}");
        let e = ids.server_config(&cart).unwrap_err();
        assert!(
            matches!(e, ringway_identity::IdentityError::NotIssued { .. }),
            "fail closed while the CA is down: {e}"
        );
        assert!(
            ids.issue_failure_count() >= 1,
            "the failed issuance is counted"
        );
        assert!(ids.certificates().is_empty(), "no certificate in hand");
        let awaited: Vec<String> = ids.awaited().iter().map(|(id, _)| id.to_string()).collect();
        assert_eq!(
            awaited,
            ["spiffe://cluster.local/ns/shop/sa/cart"],
            "an unreachable service's certificate is awaited"
        );

        // The service comes up: the refresher gets the wanted certificate
        // on its own (after its backoff), with the pod's identity.
        let _server = serve_on(addr, bed.service.clone(), tls.clone());
        let _refresher = ids.spawn_refresher(Duration::from_millis(100)).unwrap();
        wait_for("the refresher to get the certificate", WAIT, || {
            ids.server_config(&cart).is_ok()
        });
        let cert = ids.cached(&cart).unwrap();
        assert_eq!(
            uris(&cert.chain()[0]),
            ["spiffe://cluster.local/ns/shop/sa/cart"]
        );
        // A second pod's identity on this node: prefetched at once.
        ids.prefetch(&web, Duration::from_secs(5)).unwrap();

        // A pod on another node: the CA refuses, nothing is served for it.
        let vault = Identity::new(TD, "bank", "vault");
        let e = ids.prefetch(&vault, Duration::from_secs(5)).unwrap_err();
        assert!(e.to_string().contains("node-a"), "{e}");
        assert!(ids.server_config(&vault).is_err());
        assert!(
            ids.awaited().is_empty(),
            "a certificate the service refused is not awaited: {:?}",
            ids.awaited()
        );

        // The service goes away again: the certificates in hand keep working.
        drop(_server);
        ids.server_config(&cart)
            .expect("a valid certificate outlives a CA outage");
    });
}

/// The proxy's identity manager (and so its `RemoteSource`, which owns a
/// runtime) can be dropped last from inside an async context: the metrics
/// endpoint's handler holds it and is dropped on that endpoint's runtime at
/// shutdown. That must not panic ("Cannot drop a runtime in a context where
/// blocking is not allowed"), as `ringway sandbox --ca-service` showed.
#[test]
fn csr_a_remote_source_dropped_inside_an_async_runtime_does_not_panic() {
    let ca = CaSigner::generate_for_tests(TD);
    let mut bundle = ringway_identity::TrustBundle::new();
    bundle.add(ca.cert().clone());
    let tls = CaClient::tls_config(bundle.roots()).unwrap();
    let client = CaClient::new(
        "127.0.0.1:9".parse().unwrap(),
        rustls_pki_types::ServerName::try_from("ringway-ca.test").unwrap(),
        tls,
    );
    let source = ringway_ca::client::RemoteSource::new(client, "/nonexistent/token").unwrap();
    let outer = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    outer.block_on(async move {
        drop(source);
    });
}

// ------------------------------------------------------------ review cache

/// The known tokens, counting the reviews made; each review takes `delay`,
/// and the first review of each token in `fail_once` fails as the API server
/// being unreachable would.
struct CountingReviewer {
    known: FakeReviewer,
    delay: Duration,
    reviews: std::sync::atomic::AtomicUsize,
    fail_once: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl CountingReviewer {
    fn new(delay: Duration, fail_once: &[&str]) -> Arc<CountingReviewer> {
        Self::knowing(delay, fail_once, &[])
    }

    /// Also accepts each of `node_proxy_tokens` as the node proxy's.
    fn knowing(
        delay: Duration,
        fail_once: &[&str],
        node_proxy_tokens: &[&str],
    ) -> Arc<CountingReviewer> {
        let mut known = known_tokens();
        for t in node_proxy_tokens {
            known.insert(
                t.to_string(),
                caller("ringway-system", "ringway-proxy", Some(("proxy-a", "u-pa"))),
            );
        }
        let node_proxy = caller("ringway-system", "ringway-proxy", Some(("proxy-a", "u-pa")));
        known.insert(jwt_expiring_in(-60), node_proxy.clone());
        known.insert(jwt_expiring_in(3600), node_proxy);
        for i in 0..100 {
            known.insert(
                format!("web-token-{i}"),
                caller("shop", "web", Some(("web-1", "u-web-1"))),
            );
        }
        Arc::new(CountingReviewer {
            known: FakeReviewer(known),
            delay,
            reviews: Default::default(),
            fail_once: std::sync::Mutex::new(fail_once.iter().map(|t| t.to_string()).collect()),
        })
    }

    fn reviews(&self) -> usize {
        self.reviews.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl TokenReviewer for CountingReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Caller, Status>> {
        Box::pin(async move {
            self.reviews
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            if self.fail_once.lock().unwrap().remove(token) {
                return Err(Status::new(
                    Code::Unavailable,
                    "token_review_failed",
                    "the API server did not answer",
                ));
            }
            self.known.review(token).await
        })
    }
}

/// A token shaped like a service-account JWT whose `exp` is `secs` from now
/// (the signature is not checked here: the reviewer decides).
fn jwt_expiring_in(secs: i64) -> String {
    use base64::Engine as _;
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    format!(
        "{}.{}.c2ln",
        e.encode(r#"{"alg":"RS256","kid":"k"}"#),
        e.encode(format!(
            r#"{{"sub":"system:serviceaccount:ringway-system:ringway-proxy","exp":{}}}"#,
            now + secs
        ))
    )
}

fn cache_bed(ttl: Duration, entries: usize, reviewer: Arc<CountingReviewer>) -> Bed {
    let limits = Limits {
        review_cache_ttl: ttl,
        review_cache_entries: entries,
        rate_per_caller: 1e6,
        burst_per_caller: 1e6,
        ..Limits::default()
    };
    bed_reviewed_by(
        limits,
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
        reviewer,
    )
}

fn node_proxy_request() -> Vec<u8> {
    body(&request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/shop/sa/web"))
}

/// A node proxy starting pods signs every CSR with its one token: the API
/// server reviews it once per TTL, not once per certificate; each call is
/// still authorized on its own.
#[test]
fn token_review_is_reused_within_its_ttl() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    for _ in 0..20 {
        call(&b, Some("proxy-a"), &req).unwrap();
    }
    assert_eq!(
        reviewer.reviews(),
        1,
        "one review for 20 calls with one token"
    );
    assert_eq!(b.service.reviews(), (19, 1));
    // Authorization is per call: the cached caller still may not have
    // an identity no pod on its node has.
    let vault =
        body(&request(&greedy_csr()).with_impersonation("spiffe://cluster.local/ns/bank/sa/vault"));
    let e = call(&b, Some("proxy-a"), &vault).unwrap_err();
    assert_eq!(e.code, Code::PermissionDenied, "{e}");
    assert_eq!(reviewer.reviews(), 1);
    // Another token is reviewed on its own.
    call(&b, Some("web-token"), &body(&request(&greedy_csr()))).unwrap();
    assert_eq!(reviewer.reviews(), 2);
    assert_eq!(issued(&b), 21);
}

#[test]
fn token_review_is_made_again_after_its_ttl() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = cache_bed(Duration::from_millis(50), 100, reviewer.clone());
    let req = node_proxy_request();
    // (Reuse within the TTL is `token_review_is_reused_within_its_ttl`'s:
    // here two calls 50 ms apart would race a loaded machine.)
    call(&b, Some("proxy-a"), &req).unwrap();
    assert_eq!(reviewer.reviews(), 1);
    std::thread::sleep(Duration::from_millis(80));
    call(&b, Some("proxy-a"), &req).unwrap();
    assert_eq!(
        reviewer.reviews(),
        2,
        "a review older than the TTL is not used"
    );
}

#[test]
fn token_review_cache_off_reviews_every_call() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = cache_bed(Duration::ZERO, 100, reviewer.clone());
    let req = node_proxy_request();
    for _ in 0..3 {
        call(&b, Some("proxy-a"), &req).unwrap();
    }
    assert_eq!(reviewer.reviews(), 3);
    assert_eq!(b.service.cached_tokens(), 0);
}

/// Calls with one token that arrive together share the review in flight.
#[test]
fn concurrent_calls_with_one_token_share_one_review() {
    let reviewer = CountingReviewer::new(Duration::from_millis(100), &[]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    let results = rt().block_on(async {
        let calls = (0..10).map(|_| b.service.create_certificate(Some("Bearer proxy-a"), &req));
        futures::future::join_all(calls).await
    });
    assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
    assert_eq!(reviewer.reviews(), 1);
    assert_eq!(b.service.reviews(), (9, 1));
}

/// A refused or failed review is never remembered: the next call asks the
/// API server again, and a token it rejects is never accepted.
#[test]
fn adversarial_token_review_failures_are_not_cached() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &["proxy-a"]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    let e = call(&b, Some("proxy-a"), &req).unwrap_err();
    assert_eq!(e.code, Code::Unavailable, "{e}");
    call(&b, Some("proxy-a"), &req).unwrap();
    assert_eq!(reviewer.reviews(), 2, "the failure was not kept");
    for _ in 0..3 {
        let e = call(&b, Some("forged"), &req).unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated, "{e}");
    }
    assert_eq!(
        reviewer.reviews(),
        3,
        "a rejected token is reviewed once, then refused from the refusal cache \
         (adversarial_a_refused_token_costs_one_review_until_its_refusal_expires)"
    );
    assert_eq!(
        b.service.cached_tokens(),
        1,
        "only the accepted token is kept"
    );
}

/// A review is never used past the token's own `exp`.
#[test]
fn adversarial_an_expired_token_is_never_answered_from_the_cache() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    let expired = jwt_expiring_in(-60);
    for _ in 0..3 {
        // The fake reviewer accepts it; a real API server would not. What
        // matters here is that each call asks.
        call(&b, Some(&expired), &req).unwrap();
    }
    assert_eq!(
        reviewer.reviews(),
        3,
        "an expired token is reviewed every time"
    );
    let fresh = jwt_expiring_in(3600);
    call(&b, Some(&fresh), &req).unwrap();
    call(&b, Some(&fresh), &req).unwrap();
    assert_eq!(reviewer.reviews(), 4, "a token valid for an hour is kept");
}

/// Callers with ever new tokens cannot grow the cache past its bound, and
/// are all still answered.
#[test]
fn adversarial_unique_tokens_keep_the_review_cache_bounded() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = cache_bed(Duration::from_secs(3600), 8, reviewer.clone());
    let own = body(&request(&greedy_csr()));
    for i in 0..100 {
        call(&b, Some(&format!("web-token-{i}")), &own).unwrap();
        assert!(b.service.cached_tokens() <= 8);
    }
    for i in 0..100 {
        let e = call(&b, Some(&format!("unknown-{i}")), &own).unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated);
    }
    assert_eq!(b.service.cached_tokens(), 8);
    assert_eq!(reviewer.reviews(), 200);
    // The first 8 are kept and answered without a review.
    call(&b, Some("web-token-0"), &own).unwrap();
    assert_eq!(reviewer.reviews(), 200);
}

/// While the API server does not answer, calls waiting on one token's review
/// all get its answer at once, instead of each making its own review after
/// the last one failed; the next call asks again.
#[test]
fn adversarial_calls_waiting_on_a_failed_review_share_its_answer() {
    let reviewer = CountingReviewer::new(Duration::from_millis(100), &["proxy-a"]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    let results = rt().block_on(async {
        let calls = (0..10).map(|_| b.service.create_certificate(Some("Bearer proxy-a"), &req));
        futures::future::join_all(calls).await
    });
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| e.code == Code::Unavailable)),
        "{results:?}"
    );
    assert_eq!(reviewer.reviews(), 1, "one review answered all ten");
    assert_eq!(b.service.cached_tokens(), 0, "the refusal is not kept");
    call(&b, Some("proxy-a"), &req).unwrap();
    assert_eq!(reviewer.reviews(), 2);
}

/// A call dropped while its token is reviewed (a client that resets its
/// stream) leaves nothing in the cache: unique tokens and resets cannot fill
/// it.
#[test]
fn adversarial_a_call_dropped_mid_review_leaves_no_slot() {
    let reviewer = CountingReviewer::new(Duration::from_secs(5), &[]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    rt().block_on(async {
        for i in 0..20 {
            let token = format!("Bearer garbage-{i}");
            let mut call = std::pin::pin!(b.service.create_certificate(Some(&token), &req));
            // Polled until its review has started, then dropped mid-review.
            while reviewer.reviews() == i {
                tokio::select! {
                    r = &mut call => panic!("the 5 s review cannot have ended: {r:?}"),
                    () = tokio::time::sleep(Duration::from_millis(1)) => {}
                }
            }
        }
    });
    assert_eq!(reviewer.reviews(), 20);
    assert_eq!(b.service.cached_tokens(), 0);
}

/// A review is used until the token's own `exp` and not after, however long
/// the TTL.
#[test]
fn adversarial_a_review_ends_with_its_tokens_exp() {
    let soon = jwt_expiring_in(3);
    let reviewer = CountingReviewer::knowing(Duration::ZERO, &[], &[&soon]);
    let b = cache_bed(Duration::from_secs(3600), 100, reviewer.clone());
    let req = node_proxy_request();
    call(&b, Some(&soon), &req).unwrap();
    call(&b, Some(&soon), &req).unwrap();
    assert_eq!(reviewer.reviews(), 1);
    std::thread::sleep(Duration::from_millis(3100));
    // Past its exp: reviewed again (a real API server would now refuse it).
    let _ = call(&b, Some(&soon), &req);
    assert_eq!(
        reviewer.reviews(),
        2,
        "a review is not used past the token's exp"
    );
}

// ------------------------------------------------ before authentication (issue 23, 3)

/// The known tokens; each review of a token starting with `slow-` waits for
/// the gate to open (an API server that takes its time), the others are
/// answered at once. Counts the reviews started.
struct GatedReviewer {
    known: FakeReviewer,
    gate: tokio::sync::Semaphore,
    started: std::sync::atomic::AtomicUsize,
}

impl GatedReviewer {
    fn new() -> Arc<GatedReviewer> {
        Self::knowing(known_tokens())
    }

    /// The known tokens and `slow-web` (shop/web, pod web-1), whose review
    /// waits for the gate.
    fn with_slow_web() -> Arc<GatedReviewer> {
        let mut tokens = known_tokens();
        tokens.insert(
            "slow-web".into(),
            caller("shop", "web", Some(("web-1", "u-web-1"))),
        );
        Self::knowing(tokens)
    }

    fn knowing(tokens: HashMap<String, Caller>) -> Arc<GatedReviewer> {
        Arc::new(GatedReviewer {
            known: FakeReviewer(tokens),
            gate: tokio::sync::Semaphore::new(0),
            started: Default::default(),
        })
    }

    fn started(&self) -> usize {
        self.started.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn open(&self) {
        self.gate.add_permits(1 << 20);
    }
}

impl TokenReviewer for GatedReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Caller, Status>> {
        Box::pin(async move {
            self.started
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if token.starts_with("slow-") {
                let _ = self.gate.acquire().await;
            }
            self.known.review(token).await
        })
    }
}

fn src(s: &str) -> std::net::IpAddr {
    s.parse().unwrap()
}

/// A token the API server refused is refused again from memory for a short
/// while: the same junk sent in a loop costs one review, not one per call.
/// The memory is bounded, and keyed by the token's digest.
#[test]
fn adversarial_a_refused_token_costs_one_review_until_its_refusal_expires() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = cache_bed(Duration::from_secs(3600), 8, reviewer.clone());
    let req = node_proxy_request();
    for _ in 0..50 {
        let e = call(&b, Some("junk"), &req).unwrap_err();
        assert_eq!(
            (e.code, e.reason),
            (Code::Unauthenticated, "token_rejected"),
            "{e}"
        );
    }
    assert_eq!(
        reviewer.reviews(),
        1,
        "one review for 50 calls with one junk token"
    );
    assert_eq!(b.service.refusals_cached(), 49);
    // Unique junk: each is reviewed, and the refusals kept stay bounded.
    for i in 0..100 {
        let _ = call(&b, Some(&format!("junk-{i}")), &req).unwrap_err();
    }
    assert!(
        b.service.refused_tokens() <= 8,
        "{}",
        b.service.refused_tokens()
    );
    // A real token is still reviewed and served.
    call(&b, Some("proxy-a"), &req).unwrap();
}

/// Each source address has a budget of token reviews: junk from one pod
/// (a new token every call, so no cache helps) costs the API server the
/// budget's burst, not a review per call, and other sources keep theirs.
/// A token that passed a review before is not charged.
#[test]
fn adversarial_one_source_cannot_spend_more_than_its_review_budget() {
    let reviewer = CountingReviewer::new(Duration::ZERO, &[]);
    let b = bed_reviewed_by(
        Limits {
            review_rate_per_source: 0.001,
            review_burst_per_source: 5.0,
            // Every call reviewed: only the budget limits them.
            review_cache_ttl: Duration::ZERO,
            ..Limits::default()
        },
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
        reviewer.clone(),
    );
    let req = node_proxy_request();
    let own = body(&request(&greedy_csr()));
    let attacker = src("10.0.0.66");
    let ask = |from, token: &str, req: &[u8]| {
        rt().block_on(b.service.create_certificate_from(
            from,
            Some(&format!("Bearer {token}")),
            req,
        ))
    };
    // The node proxy on the attacker's address (a shared node address)
    // passes a review first.
    ask(attacker, "proxy-a", &req).unwrap();
    let mut limited = 0;
    for i in 0..50 {
        let e = ask(attacker, &format!("junk-{i}"), &req).unwrap_err();
        match (e.code, e.reason) {
            (Code::Unauthenticated, "token_rejected") => {}
            (Code::ResourceExhausted, "source_rate_limited") => limited += 1,
            other => panic!("{other:?}: {e}"),
        }
    }
    assert_eq!(
        reviewer.reviews(),
        5,
        "1 + the burst's 4 left: junk reviewed until the budget ran out"
    );
    assert_eq!(limited, 46);
    assert_eq!(
        b.service
            .count(Code::ResourceExhausted, "source_rate_limited"),
        46
    );
    // Another source is served, and so is the known token on the spent one.
    ask(src("10.0.0.1"), "web-token", &own).unwrap();
    ask(attacker, "proxy-a", &req).unwrap();
    assert_eq!(reviewer.reviews(), 7);
}

/// When every review slot is taken, a call waits for one (up to a
/// deadline) instead of failing at once.
#[test]
fn adversarial_calls_wait_for_a_review_slot_instead_of_failing_at_once() {
    let reviewer = GatedReviewer::with_slow_web();
    let b = bed_reviewed_by(
        Limits {
            max_concurrent_reviews: 1,
            reserved_reviews: 0,
            review_wait: Duration::from_secs(60),
            ..Limits::default()
        },
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
        reviewer.clone(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let own = body(&request(&greedy_csr()));
    let svc = b.service.clone();
    let o = own.clone();
    let first =
        runtime.spawn(async move { svc.create_certificate(Some("Bearer slow-web"), &o).await });
    wait_for("the first review holds the only slot", WAIT, || {
        reviewer.started() == 1
    });
    let svc = b.service.clone();
    let o = own.clone();
    let second =
        runtime.spawn(async move { svc.create_certificate(Some("Bearer proxy-a"), &o).await });
    wait_for(
        "the second call waits for the slot (or has failed)",
        WAIT,
        || b.service.reviews_waiting() == 1 || second.is_finished(),
    );
    reviewer.open();
    let (first, second) = runtime.block_on(async { (first.await.unwrap(), second.await.unwrap()) });
    first.unwrap();
    second.unwrap_or_else(|e| panic!("the second call did not wait for a slot: {e}"));
    assert_eq!(
        b.service.count(Code::ResourceExhausted, "too_many_reviews"),
        0
    );

    // With a short deadline, a call that gets no slot in time is refused.
    let closed = GatedReviewer::new();
    let b = bed_reviewed_by(
        Limits {
            max_concurrent_reviews: 1,
            reserved_reviews: 0,
            review_wait: Duration::from_millis(100),
            ..Limits::default()
        },
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
        closed.clone(),
    );
    let svc = b.service.clone();
    let o = own.clone();
    let _held =
        runtime.spawn(async move { svc.create_certificate(Some("Bearer slow-held"), &o).await });
    wait_for("the slot is held", WAIT, || closed.started() == 1);
    let e = runtime
        .block_on(b.service.create_certificate(Some("Bearer proxy-b"), &own))
        .unwrap_err();
    assert_eq!(
        (e.code, e.reason),
        (Code::ResourceExhausted, "too_many_reviews"),
        "{e}"
    );
}

/// Junk tokens from many sources can take every ordinary review slot; a
/// caller whose token passed a review before still gets reviewed, from the
/// slots reserved for such tokens, so renewals go on.
#[test]
fn adversarial_junk_tokens_cannot_starve_renewals_of_known_callers() {
    let reviewer = GatedReviewer::new();
    let b = bed_reviewed_by(
        Limits {
            max_concurrent_reviews: 4,
            reserved_reviews: 1,
            review_wait: Duration::from_secs(60),
            // Every renewal needs a review.
            review_cache_ttl: Duration::ZERO,
            ..Limits::default()
        },
        vec![Arc::new(CaSigner::generate_for_tests(TD))],
        reviewer.clone(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let req = node_proxy_request();
    // The node proxy renewed before: its token passed a review.
    runtime
        .block_on(b.service.create_certificate(Some("Bearer proxy-a"), &req))
        .unwrap();
    let mut junk = Vec::new();
    for i in 0..8 {
        let svc = b.service.clone();
        let r = req.clone();
        junk.push(runtime.spawn(async move {
            svc.create_certificate_from(
                format!("10.1.0.{i}").parse().unwrap(),
                Some(&format!("Bearer slow-junk-{i}")),
                &r,
            )
            .await
        }));
    }
    wait_for("junk holds every ordinary slot", WAIT, || {
        reviewer.started() == 1 + 4
    });
    wait_for("and more junk waits", WAIT, || {
        b.service.reviews_waiting() == 4
    });
    let renewal = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(30),
            b.service.create_certificate(Some("Bearer proxy-a"), &req),
        )
        .await
    });
    let renewal = renewal.unwrap_or_else(|_| panic!("the renewal waited behind the junk"));
    renewal.unwrap_or_else(|e| panic!("the renewal was starved by junk: {e}"));
    reviewer.open();
    for j in junk {
        let e = runtime.block_on(j).unwrap().unwrap_err();
        assert_eq!(e.code, Code::Unauthenticated, "{e}");
    }
}

// ---------------------------------------------- port 15012 before authentication

/// A TCP connection to `to` from the local address `from` (in the test's
/// own namespace: any 127.0.0.0/8 address is on its `lo`).
async fn tcp_from(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.bind(std::net::SocketAddr::new(from, 0))?;
    sock.connect(to).await
}

async fn tls_from(
    from: std::net::IpAddr,
    s: &Served,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let tcp = tcp_from(from, s.addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    tokio_rustls::TlsConnector::from(s.tls.clone())
        .connect(
            rustls_pki_types::ServerName::try_from("ca.test").unwrap(),
            tcp,
        )
        .await
        .map_err(|e| format!("TLS: {e}"))
}

/// An HTTP/2 connection from `from` (TLS and preface done); the task
/// driving it ends when the connection does.
async fn h2_from(
    from: std::net::IpAddr,
    s: &Served,
) -> Result<
    (
        h2::client::SendRequest<bytes::Bytes>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let tls = tls_from(from, s).await?;
    let (send, conn) = h2::client::handshake(tls)
        .await
        .map_err(|e| format!("HTTP/2: {e}"))?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    let send = send.ready().await.map_err(|e| format!("HTTP/2: {e}"))?;
    Ok((send, task))
}

fn grpc_request(token: &str) -> http::Request<()> {
    http::Request::post("https://ca.test/istio.v1.auth.IstioCertificateService/CreateCertificate")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap()
}

/// The gRPC status of a response (trailers-only, or its trailers).
async fn grpc_status(resp: h2::client::ResponseFuture) -> Result<u32, String> {
    let resp = resp.await.map_err(|e| format!("HTTP/2: {e}"))?;
    let code = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
    };
    if let Some(c) = code(resp.headers()) {
        return Ok(c);
    }
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| format!("HTTP/2: {e}"))?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body
        .trailers()
        .await
        .map_err(|e| format!("HTTP/2: {e}"))?
        .unwrap_or_default();
    code(&trailers).ok_or_else(|| "no grpc-status".into())
}

/// One whole call on `send`.
async fn grpc_call(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    token: &str,
    body: Vec<u8>,
) -> Result<u32, String> {
    let (resp, mut stream) = send
        .send_request(grpc_request(token), false)
        .map_err(|e| format!("HTTP/2: {e}"))?;
    stream
        .send_data(body.into(), true)
        .map_err(|e| format!("HTTP/2: {e}"))?;
    grpc_status(resp).await
}

fn lo(n: u8) -> std::net::IpAddr {
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, n))
}

/// The token is read from the headers and checked before any of the body:
/// a caller with a bad token is refused at once, whatever it sends or holds
/// back, and an unauthenticated stream is granted no more flow-control
/// window than a CSR needs (h2 buffers what the window allows).
#[test]
fn adversarial_the_token_is_checked_before_the_body_is_read() {
    isolated("ca_token_before_body", || async {
        let reviewer = GatedReviewer::with_slow_web();
        let bed = bed_reviewed_by(
            Limits::default(),
            vec![Arc::new(CaSigner::generate_for_tests(TD))],
            reviewer.clone(),
        );
        let limits = ringway_ca::server::ServerLimits {
            request_timeout: Duration::from_secs(3),
            ..Default::default()
        };
        let preauth = limits.preauth_body_bytes;
        let s = serve_limited(bed, limits).await;
        let (mut h2, _conn) = h2_from(lo(1), &s).await.unwrap();

        // A junk token and a body that never ends: refused from the headers.
        let (resp, mut stream) = h2.send_request(grpc_request("junk"), false).unwrap();
        stream.send_data(vec![0u8; 1000].into(), false).unwrap();
        let code = tokio::time::timeout(Duration::from_secs(30), grpc_status(resp))
            .await
            .expect("an answer")
            .unwrap();
        assert_eq!(
            code,
            Code::Unauthenticated.as_u32(),
            "refused from its headers, not after waiting for the body"
        );

        // A token under review: the stream may send no more than a CSR needs
        // until it is authenticated.
        let (resp, mut stream) = h2.send_request(grpc_request("slow-web"), false).unwrap();
        wait_for_async("the review started", WAIT, || reviewer.started() == 2).await;
        stream.reserve_capacity(60_000);
        let granted = std::future::poll_fn(|cx| stream.poll_capacity(cx))
            .await
            .expect("a window")
            .expect("a window");
        assert!(
            granted as u32 <= preauth,
            "an unauthenticated stream was granted {granted} bytes of window (pre-auth cap {preauth})"
        );
        // Authenticated, the rest of a real request goes through.
        reviewer.open();
        stream
            .send_data(body(&request(&greedy_csr())).into(), true)
            .unwrap();
        assert_eq!(grpc_status(resp).await.unwrap(), 0);
        assert_eq!(s.bed.service.count(Code::Ok, "issued"), 1);
        // An authenticated caller's body larger than that window is read
        // (the window opens as it is) and judged: here, too large a CSR.
        let big = body(&request(&"A".repeat(40_000)));
        assert!(big.len() as u32 > preauth);
        let code = tokio::time::timeout(
            Duration::from_secs(30),
            grpc_call(&mut h2, "web-token", big),
        )
        .await
        .expect("an answer")
        .unwrap();
        assert_eq!(code, Code::InvalidArgument.as_u32());
        assert_eq!(
            s.bed.service.count(Code::InvalidArgument, "csr_too_large"),
            1
        );
    });
}

/// One source holding idle HTTP/2 connections gets its per-source share of
/// the connections and no more: the connections beyond are reset at
/// accept, before TLS, and another source is still served.
#[test]
fn adversarial_one_source_cannot_take_every_connection() {
    isolated("ca_per_source_cap", || async {
        let limits = ringway_ca::server::ServerLimits {
            max_connections: 8,
            max_connections_per_source: 4,
            ..Default::default()
        };
        let s = serve_limited(bed(), limits).await;
        let mut held = Vec::new();
        let mut refused = 0;
        for _ in 0..8 {
            match tokio::time::timeout(Duration::from_secs(20), h2_from(lo(1), &s)).await {
                Ok(Ok(c)) => held.push(c),
                Ok(Err(_)) => refused += 1,
                Err(_) => panic!("a connection neither served nor refused"),
            }
        }
        assert_eq!((held.len(), refused), (4, 4), "4 served, 4 reset");
        assert_eq!(s.bed.service.connections_refused("per_source"), 4);
        // Another source: served, while the first holds its share.
        let call = async {
            let (mut h2, _c) = h2_from(lo(2), &s).await?;
            grpc_call(&mut h2, "web-token", body(&request(&greedy_csr()))).await
        };
        let code = tokio::time::timeout(Duration::from_secs(30), call)
            .await
            .unwrap_or_else(|_| panic!("another source was starved"))
            .unwrap();
        assert_eq!(code, 0);
    });
}

/// A connection that stops at any stage is closed after that stage's
/// bound: silent TCP (the TLS handshake), TLS without the HTTP/2 preface,
/// and an HTTP/2 connection without a stream (idle); each counted.
#[test]
fn adversarial_silent_connections_are_closed_at_each_stage() {
    isolated("ca_silent_stages", || async {
        use tokio::io::AsyncReadExt;
        let limits = ringway_ca::server::ServerLimits {
            handshake_timeout: Duration::from_secs(1),
            preface_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let s = serve_limited(bed(), limits).await;
        let wait = Duration::from_secs(30);
        // Reads (what the server sends: its SETTINGS) until the server closes.
        async fn closed(mut r: impl tokio::io::AsyncRead + Unpin) -> bool {
            let mut buf = [0u8; 256];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                }
            }
        }
        // Silent TCP.
        let tcp = tcp_from(lo(1), s.addr).await.unwrap();
        assert!(
            tokio::time::timeout(wait, closed(tcp)).await.is_ok(),
            "silent TCP not closed"
        );
        // TLS, then no preface.
        let tls = tls_from(lo(1), &s).await.unwrap();
        assert!(
            tokio::time::timeout(wait, closed(tls)).await.is_ok(),
            "TLS without preface not closed"
        );
        // HTTP/2 without a stream.
        let (_send, conn) = h2_from(lo(1), &s).await.unwrap();
        tokio::time::timeout(wait, conn)
            .await
            .expect("an idle HTTP/2 connection was never closed")
            .unwrap();
        let svc = &s.bed.service;
        for reason in ["handshake_timeout", "preface_timeout", "idle_timeout"] {
            wait_for_async(reason, WAIT, || svc.connections_refused(reason) == 1).await;
        }
        // And a connection in use is served.
        let (mut h2, _c) = h2_from(lo(1), &s).await.unwrap();
        assert_eq!(
            grpc_call(&mut h2, "web-token", body(&request(&greedy_csr())))
                .await
                .unwrap(),
            0
        );
    });
}

/// A call that never finishes is ended at the request timeout, answered
/// UNAVAILABLE and counted: a valid token whose body never ends (the stream
/// held open after the headers), and a token whose review never answers.
/// Without the bound each holds its stream, and what the connection
/// buffers for it, for as long as the caller likes.
#[test]
fn adversarial_a_call_that_never_finishes_is_ended_at_the_request_timeout() {
    isolated("ca_request_timeout", || async {
        // The gate is never opened: a `slow-` token's review never answers.
        let reviewer = GatedReviewer::with_slow_web();
        let bed = bed_reviewed_by(
            Limits::default(),
            vec![Arc::new(CaSigner::generate_for_tests(TD))],
            reviewer.clone(),
        );
        let timeout = Duration::from_secs(1);
        let limits = ringway_ca::server::ServerLimits {
            request_timeout: timeout,
            ..Default::default()
        };
        let s = serve_limited(bed, limits).await;
        let svc = &s.bed.service;
        let (mut h2, _conn) = h2_from(lo(1), &s).await.unwrap();
        // Far above the timeout: how long a call may stay unanswered
        // before the test calls it never ended.
        let bound = Duration::from_secs(30);

        // A valid token, then the body never ends.
        let t0 = std::time::Instant::now();
        let (resp, _body_held_open) = h2.send_request(grpc_request("web-token"), false).unwrap();
        let code = tokio::time::timeout(bound, grpc_status(resp))
            .await
            .expect("a call whose body never ends was never ended")
            .unwrap();
        assert_eq!(code, Code::Unavailable.as_u32(), "ended as UNAVAILABLE");
        assert!(
            t0.elapsed() >= timeout,
            "answered after {:?}, before the request timeout: not by it",
            t0.elapsed()
        );
        assert_eq!(svc.count(Code::Unavailable, "request_timeout"), 1);
        assert_eq!(svc.count(Code::Ok, "issued"), 0);

        // A token still under review, its review never answering.
        let (resp, _held) = h2.send_request(grpc_request("slow-web"), false).unwrap();
        let code = tokio::time::timeout(bound, grpc_status(resp))
            .await
            .expect("a call whose review never answers was never ended")
            .unwrap();
        assert_eq!(code, Code::Unavailable.as_u32());
        assert_eq!(svc.count(Code::Unavailable, "request_timeout"), 2);
        assert!(reviewer.started() >= 2, "the slow token went to review");

        // The connection still serves a whole call.
        assert_eq!(
            grpc_call(&mut h2, "web-token", body(&request(&greedy_csr())))
                .await
                .unwrap(),
            0
        );
    });
}
