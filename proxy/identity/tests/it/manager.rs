//! Loading the CA and bundle from files, issuance, caching and rotation.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, SystemTime};

use ringway_identity::{
    CaError, CaProblem, CaSigner, Identity, IdentityError, IdentityManager, ManualClock,
    TrustBundle, DEFAULT_CERT_LIFETIME,
};

use ringway_testbed::{wait_for, TempDir};

const TD: &str = "cluster.local";

fn write_ca(d: &Path, name: &str, ca: &CaSigner) -> (PathBuf, PathBuf) {
    let (c, k) = (d.join(format!("{name}.crt")), d.join(format!("{name}.key")));
    ca.write_pem_files(&c, &k).unwrap();
    (c, k)
}

fn load_err(cert: &Path, key: &Path) -> CaError {
    CaSigner::load(cert, key).expect_err("load must fail")
}

#[test]
fn ca_loads_from_files_and_issues_verifiable_certs() {
    let d = TempDir::new("identity-load-ok");
    let (cert, key) = write_ca(&d, "ca", &CaSigner::generate_for_tests(TD));
    let ca = CaSigner::load(&cert, &key).unwrap();
    let m = IdentityManager::new(ca, TrustBundle::new(), TD, DEFAULT_CERT_LIFETIME).unwrap();
    let web = Identity::new(TD, "shop", "web");
    let before = SystemTime::now();
    let c = m.fetch(&web).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(&c.chain()[0]).unwrap();
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert_eq!(
        format!("{:?}", san.value.general_names),
        "[URI(\"spiffe://cluster.local/ns/shop/sa/web\")]"
    );
    assert!(san.critical, "SAN is critical with an empty subject");
    assert!(!leaf.is_ca());
    assert_eq!(
        leaf.public_key().algorithm.algorithm.to_id_string(),
        "1.2.840.10045.2.1"
    );
    let nb = leaf.validity().not_before.timestamp();
    let na = leaf.validity().not_after.timestamp();
    let now = before
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (now - 301..=now - 299).contains(&nb),
        "backdated 5 min: {nb} vs {now}"
    );
    assert!(
        (now + 86399..=now + 86401).contains(&na),
        "24 h: {na} vs {now}"
    );
    let half = c.refresh_at().duration_since(before).unwrap();
    assert!(
        half >= Duration::from_secs(12 * 3600 - 2) && half <= Duration::from_secs(12 * 3600 + 2)
    );
}

#[test]
fn ca_load_errors_name_the_file_and_the_problem() {
    let d = TempDir::new("identity-load-errors");
    let a = CaSigner::generate_for_tests(TD);
    let b = CaSigner::generate_for_tests(TD);
    let (a_cert, a_key) = write_ca(&d, "a", &a);
    let (_, b_key) = write_ca(&d, "b", &b);

    // Missing files.
    let missing = d.join("nope.crt");
    let e = load_err(&missing, &a_key);
    assert_eq!(e.file, missing);
    assert!(matches!(e.problem, CaProblem::Read(_)));
    assert!(
        e.to_string()
            .starts_with(&format!("{}: cannot read it", missing.display())),
        "{e}"
    );
    let e = load_err(&a_cert, &d.join("nope.key"));
    assert!(e.to_string().contains("nope.key: cannot read it"), "{e}");

    // Not PEM.
    let junk = d.join("junk");
    std::fs::write(&junk, "this is not a certificate\n").unwrap();
    let e = load_err(&junk, &a_key);
    assert_eq!(e.file, junk);
    assert!(e.to_string().contains("no PEM CERTIFICATE block"), "{e}");
    let e = load_err(&a_cert, &junk);
    assert!(
        e.to_string().contains("junk: no PEM PRIVATE KEY block"),
        "{e}"
    );

    // Key of another CA.
    let e = load_err(&a_cert, &b_key);
    assert_eq!(e.file, b_key);
    assert_eq!(
        e.to_string(),
        format!(
            "{}: the private key does not match the certificate in {}",
            b_key.display(),
            a_cert.display()
        )
    );

    // A leaf is not a CA.
    let leaf = a.issue_for_tests(
        &Identity::new(TD, "shop", "web"),
        SystemTime::now(),
        SystemTime::now() + Duration::from_secs(3600),
    );
    let (leaf_cert, leaf_key) = (d.join("leaf.crt"), d.join("leaf.key"));
    std::fs::write(
        &leaf_cert,
        pem::encode(&pem::Pem::new("CERTIFICATE", leaf.chain[0].to_vec())),
    )
    .unwrap();
    std::fs::write(
        &leaf_key,
        pem::encode(&pem::Pem::new(
            "PRIVATE KEY",
            leaf.key.secret_der().to_vec(),
        )),
    )
    .unwrap();
    let e = load_err(&leaf_cert, &leaf_key);
    assert_eq!(e.file, leaf_cert);
    assert!(matches!(e.problem, CaProblem::NotCa { .. }), "{e}");
    assert!(e.to_string().contains("is not a CA"), "{e}");

    // Expired CA.
    let day = Duration::from_secs(86400);
    let old = CaSigner::generate_for_tests_with_validity(
        TD,
        SystemTime::now() - 30 * day,
        SystemTime::now() - day,
    );
    let (old_cert, old_key) = write_ca(&d, "old", &old);
    let e = load_err(&old_cert, &old_key);
    assert_eq!(e.file, old_cert);
    assert!(matches!(e.problem, CaProblem::Expired { .. }), "{e}");
    assert!(e.to_string().contains("expired at"), "{e}");

    // A corrupt EC PRIVATE KEY (SEC1): named, and no key bytes in the message.
    let sec1 = d.join("sec1.key");
    std::fs::write(
        &sec1,
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIL\n-----END EC PRIVATE KEY-----\n",
    )
    .unwrap();
    let e = load_err(&a_cert, &sec1);
    assert_eq!(e.file, sec1);
    assert!(e.to_string().contains("not a usable private key"), "{e}");
    assert!(!e.to_string().contains("MHcCAQEEIL"), "{e}");

    // Bundle files.
    let e = TrustBundle::from_pem_files(&[&a_cert, &missing]).unwrap_err();
    assert_eq!(e.file, missing);
    let e = TrustBundle::from_pem_files(&[&junk]).unwrap_err();
    assert!(
        e.to_string().contains("junk: no PEM CERTIFICATE block"),
        "{e}"
    );
    let both = d.join("both.crt");
    std::fs::write(&both, format!("{}{}", a.cert_pem(), b.cert_pem())).unwrap();
    assert_eq!(
        TrustBundle::from_pem_files(&[&both, &a_cert])
            .unwrap()
            .roots()
            .len(),
        2
    );
}

#[test]
fn key_material_stays_out_of_debug_output() {
    let d = TempDir::new("identity-debug");
    let (cert, key) = write_ca(&d, "ca", &CaSigner::generate_for_tests(TD));
    let key_pem = std::fs::read_to_string(&key).unwrap();
    let body: Vec<&str> = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let ca = CaSigner::load(&cert, &key).unwrap();
    let m = IdentityManager::new(ca, TrustBundle::new(), TD, DEFAULT_CERT_LIFETIME).unwrap();
    let c = m.fetch(&Identity::new(TD, "shop", "web")).unwrap();
    for text in [format!("{m:?}"), format!("{m:#?}"), format!("{c:?}")] {
        assert!(text.contains("<redacted>"), "{text}");
        assert!(!text.contains("PRIVATE"), "{text}");
        for line in &body {
            for chunk in line.as_bytes().chunks(16) {
                let chunk = std::str::from_utf8(chunk).unwrap();
                assert!(
                    chunk.len() < 16 || !text.contains(chunk),
                    "key PEM in {text}"
                );
            }
        }
    }
}

#[test]
fn manager_refuses_bad_input() {
    let ca = || CaSigner::generate_for_tests(TD);
    let e = IdentityManager::new(
        ca(),
        TrustBundle::new(),
        "Bad.Domain",
        DEFAULT_CERT_LIFETIME,
    )
    .unwrap_err();
    assert!(matches!(e, IdentityError::BadTrustDomain { .. }), "{e}");
    let e =
        IdentityManager::new(ca(), TrustBundle::new(), TD, Duration::from_millis(500)).unwrap_err();
    assert!(matches!(e, IdentityError::BadLifetime(_)), "{e}");

    let m = IdentityManager::new(ca(), TrustBundle::new(), TD, DEFAULT_CERT_LIFETIME).unwrap();
    let e = m
        .fetch(&Identity::new("evil.org", "shop", "web"))
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "spiffe://evil.org/ns/shop/sa/web is not in this proxy's trust domain \"cluster.local\""
    );
    let e = m.fetch(&Identity::new(TD, "Shop", "web")).unwrap_err();
    assert!(e.to_string().contains("namespace"), "{e}");
    assert_eq!(
        m.parse_spiffe("spiffe://cluster.local/ns/a/sa/b").unwrap(),
        Identity::new(TD, "a", "b")
    );
    assert!(m.parse_spiffe("spiffe://other/ns/a/sa/b").is_err());
}

#[test]
fn concurrent_first_fetches_issue_once() {
    let m = Arc::new(
        IdentityManager::new(
            CaSigner::generate_for_tests(TD),
            TrustBundle::new(),
            TD,
            DEFAULT_CERT_LIFETIME,
        )
        .unwrap()
        .with_max_concurrent_issuance(2),
    );
    let n = 16;
    let barrier = Arc::new(Barrier::new(n));
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (m, barrier) = (m.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let web = m.fetch(&Identity::new(TD, "shop", "web")).unwrap();
                let own = m
                    .fetch(&Identity::new(TD, "ns", &format!("sa{}", i % 4)))
                    .unwrap();
                (web.serial().to_owned(), own)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        results.iter().all(|(s, _)| *s == results[0].0),
        "one certificate for web"
    );
    assert_eq!(m.issued_count(), 1 + 4, "single flight per identity");
}

#[test]
fn refresher_renews_certificates_past_half_life() {
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let m = Arc::new(
        IdentityManager::new(
            CaSigner::generate_for_tests(TD),
            TrustBundle::new(),
            TD,
            Duration::from_secs(3600),
        )
        .unwrap()
        .with_clock(clock.clone()),
    );
    let (a, b) = (Identity::new(TD, "a", "a"), Identity::new(TD, "b", "b"));
    let a1 = m.fetch(&a).unwrap();
    clock.advance(Duration::from_secs(20 * 60));
    let b1 = m.fetch(&b).unwrap();
    assert_eq!(m.refresh_due(), 0);

    clock.advance(Duration::from_secs(11 * 60)); // a: 31 min old, b: 11 min
    let refresher = m.spawn_refresher(Duration::from_millis(10)).unwrap();
    wait_for("the refresher to renew", Duration::from_secs(30), || {
        m.issued_count() >= 3
    });
    drop(refresher);
    let a2 = m.fetch(&a).unwrap();
    assert_ne!(a1.serial(), a2.serial());
    assert_eq!(b1.serial(), m.fetch(&b).unwrap().serial(), "b not due yet");
    assert_eq!(m.issued_count(), 3);

    // A forgotten identity is issued afresh.
    m.forget(&b);
    assert_ne!(b1.serial(), m.fetch(&b).unwrap().serial());
}

#[test]
fn workload_certs_never_outlive_the_ca() {
    let now = SystemTime::now();
    let ca = CaSigner::generate_for_tests_with_validity(
        TD,
        now - Duration::from_secs(60),
        now + Duration::from_secs(600),
    );
    let m = IdentityManager::new(ca, TrustBundle::new(), TD, DEFAULT_CERT_LIFETIME).unwrap();
    let c = m.fetch(&Identity::new(TD, "a", "a")).unwrap();
    assert!(c.not_after() <= now + Duration::from_secs(600));
    assert!(c.refresh_at() <= now + Duration::from_secs(301));
}

/// cert-manager writes `EC PRIVATE KEY` (SEC1) by default: it loads too.
#[test]
fn ca_key_in_sec1_encoding_loads() {
    let d = TempDir::new("identity-sec1");
    let ca = CaSigner::generate_for_tests(TD);
    let (cert, key) = write_ca(&d, "ca", &ca);
    // The SEC1 ECPrivateKey is the OCTET STRING inside the PKCS#8 document.
    let pkcs8 = pem::parse(std::fs::read(&key).unwrap()).unwrap();
    let (_, doc) = x509_parser::der_parser::parse_der(pkcs8.contents()).unwrap();
    let fields = doc.as_sequence().unwrap();
    let sec1 = fields[2].as_slice().unwrap();
    let sec1_file = d.join("sec1.key");
    std::fs::write(
        &sec1_file,
        pem::encode(&pem::Pem::new("EC PRIVATE KEY", sec1.to_vec())),
    )
    .unwrap();
    let loaded = CaSigner::load(&cert, &sec1_file).unwrap();
    let m = IdentityManager::new(loaded, TrustBundle::new(), TD, DEFAULT_CERT_LIFETIME).unwrap();
    m.fetch(&Identity::new(TD, "a", "a")).unwrap();

    // The key of another CA in SEC1 form is still caught as a mismatch.
    let other = CaSigner::generate_for_tests(TD);
    let (_, other_key) = write_ca(&d, "other", &other);
    let pkcs8 = pem::parse(std::fs::read(&other_key).unwrap()).unwrap();
    let (_, doc) = x509_parser::der_parser::parse_der(pkcs8.contents()).unwrap();
    let other_sec1 = doc.as_sequence().unwrap()[2].as_slice().unwrap().to_vec();
    std::fs::write(
        &sec1_file,
        pem::encode(&pem::Pem::new("EC PRIVATE KEY", other_sec1)),
    )
    .unwrap();
    let e = load_err(&cert, &sec1_file);
    assert!(matches!(e.problem, CaProblem::KeyMismatch { .. }), "{e}");
}

#[test]
fn manager_from_config_paths() {
    let d = TempDir::new("identity-from-config");
    let (cert, key) = write_ca(&d, "ca", &CaSigner::generate_for_tests(TD));
    let (extra, _) = write_ca(&d, "extra", &CaSigner::generate_for_tests(TD));
    let paths = ringway_config::CaPaths {
        cert_file: cert.clone(),
        key_file: key.clone(),
        bundle_files: vec![extra.clone()],
    };
    let m = IdentityManager::from_config(&paths, TD, DEFAULT_CERT_LIFETIME).unwrap();
    assert_eq!(m.bundle().roots().len(), 2, "extra root + the CA's own");
    let bad = ringway_config::CaPaths {
        bundle_files: vec![d.join("missing.crt")],
        ..paths
    };
    let e = IdentityManager::from_config(&bad, TD, DEFAULT_CERT_LIFETIME).unwrap_err();
    assert!(matches!(e, IdentityError::Ca(_)), "{e}");
    assert!(e.to_string().contains("missing.crt: cannot read it"), "{e}");
}

/// CA and bundle files are read with the configuration's size limit
/// (4 MiB, issue 10 item 9): a huge or endless file (a device) is refused
/// with the file and the limit, not read whole.
#[test]
fn adversarial_oversized_ca_files_are_refused() {
    let d = TempDir::new("identity-oversized");
    let (cert, key) = write_ca(&d, "ca", &CaSigner::generate_for_tests(TD));
    // A valid bundle padded past the limit with text PEM parsers skip.
    let big = d.join("big.crt");
    let pem = std::fs::read_to_string(&cert).unwrap();
    std::fs::write(&big, format!("{pem}{}\n", "x".repeat(4 << 20))).unwrap();
    let want = "larger than the limit of 4194304 bytes (4 MiB); refusing to read it";
    let e = TrustBundle::from_pem_files(&[&big]).expect_err("an oversized bundle was loaded");
    assert_eq!(e.file, big);
    assert!(e.to_string().ends_with(want), "{e}");
    let e = load_err(&big, &key);
    assert_eq!(e.file, big);
    assert!(e.to_string().ends_with(want), "{e}");
    let zero = Path::new("/dev/zero");
    let e = load_err(&cert, zero);
    assert_eq!(e.file, zero);
    assert!(e.to_string().ends_with(want), "{e}");
}

/// The admin dump's states: a certificate in hand is `Available`, an
/// identity only asked for (`cached`, never issuing) is `Initializing`, and
/// one whose issuance failed (the CA expired) is `Unavailable` with why.
#[test]
fn certificate_states_name_available_initializing_and_unavailable() {
    use ringway_identity::CertState;
    let now = SystemTime::now();
    let ca = CaSigner::generate_for_tests_with_validity(
        TD,
        now - Duration::from_secs(60),
        now + Duration::from_secs(600),
    );
    let clock = Arc::new(ManualClock::new(now));
    let m = IdentityManager::new(ca, TrustBundle::new(), TD, DEFAULT_CERT_LIFETIME)
        .unwrap()
        .with_clock(clock.clone());
    let (a, b, c) = (
        Identity::new(TD, "a", "a"),
        Identity::new(TD, "b", "b"),
        Identity::new(TD, "c", "c"),
    );
    m.fetch(&a).unwrap();
    assert!(m.cached(&b).is_err());
    clock.advance(Duration::from_secs(700));
    assert!(m.fetch(&c).is_err(), "the CA has expired");
    let states = m.certificate_states();
    let names: Vec<String> = states.iter().map(|(id, _)| id.to_string()).collect();
    assert_eq!(names, [a.to_string(), b.to_string(), c.to_string()]);
    // `a`'s certificate ended with the CA: nothing renewed it.
    match &states[0].1 {
        CertState::Unavailable(why) => assert!(why.contains("expired"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(states[1].1, CertState::Initializing), "{states:?}");
    match &states[2].1 {
        CertState::Unavailable(why) => assert!(why.contains("expired"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(states[2].1.label().starts_with("Unavailable: "));
    // A certificate in hand is `Available`, with that certificate.
    let m2 = IdentityManager::new(
        CaSigner::generate_for_tests(TD),
        TrustBundle::new(),
        TD,
        DEFAULT_CERT_LIFETIME,
    )
    .unwrap();
    let cert = m2.fetch(&a).unwrap();
    match &m2.certificate_states()[..] {
        [(id, CertState::Available(got))] => {
            assert_eq!(id, &a);
            assert_eq!(got.serial(), cert.serial());
            assert_eq!(CertState::Available(got.clone()).label(), "Available");
        }
        other => panic!("{other:?}"),
    }
}
