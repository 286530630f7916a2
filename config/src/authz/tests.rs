//! Scenario tests of each rule of the semantics, then a randomized
//! comparison against an independent, naive oracle written from the
//! reference's description (on the file-level strings, not the compiled
//! matchers).

use std::net::IpAddr;

use super::*;
use crate::{MeshConfig, NoEnv};

const WORKLOADS: &str = "workloads:
  - {uid: web, name: web-0, namespace: shop, serviceAccount: web, ips: [10.0.0.1, \"fd00::1\"], node: a}
  - {uid: db, name: db-0, namespace: shop, serviceAccount: db, ips: [10.0.0.2], node: a}
  - {uid: fe, name: frontend-0, namespace: front, serviceAccount: frontend, ips: [10.0.1.1], node: b}
  - {uid: sys, name: agent-0, namespace: ringway-system, ips: [10.0.9.9], node: b}
";

fn mesh(policies: &str) -> Mesh {
    let yaml = format!("{WORKLOADS}policies:\n{policies}");
    MeshConfig::load_str(&yaml, "test.yaml", &NoEnv).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn id(ns: &str, sa: &str) -> Identity {
    Identity::new("cluster.local", ns, sa)
}

/// Evaluates a connection from `src` (with `identity`) to workload `dst` on `port`.
fn check(m: &Mesh, src: &str, identity: Option<&Identity>, dst: &str, port: u16) -> Decision {
    let dst_workload = m.workload_by_uid(dst).expect("known workload");
    evaluate(
        m,
        &ConnInfo {
            src_ip: src.parse().unwrap(),
            src_identity: identity,
            dst_workload,
            dst_ip: dst_workload.ips[0],
            dst_port: port,
        },
    )
}

fn allowed(m: &Mesh, src: &str, identity: Option<&Identity>, dst: &str, port: u16) -> bool {
    check(m, src, identity, dst, port).is_allowed()
}

#[test]
fn no_policy_allows() {
    let m = mesh("  []\n");
    assert_eq!(check(&m, "10.9.9.9", None, "web", 80), Decision::Allow);
}

#[test]
fn deny_is_evaluated_before_allow() {
    let m = mesh(
        "  - {name: allow-all, namespace: shop, action: ALLOW, rules: [{}]}
  - {name: no-9090, namespace: shop, action: DENY, rules: [{to: [{ports: [8080]}]}, {to: [{ports: [9090]}]}]}
",
    );
    assert_eq!(
        check(&m, "10.9.9.9", None, "web", 9090),
        Decision::Deny {
            policy: "shop/no-9090".into(),
            reason: DenyReason::DenyPolicyMatched { rule: 1 }
        }
    );
    assert!(allowed(&m, "10.9.9.9", None, "web", 80));
    assert_eq!(
        check(&m, "10.9.9.9", None, "web", 9090).to_string(),
        "denied by DENY policy shop/no-9090 (rules[1])"
    );
}

#[test]
fn allow_policies_make_everything_else_denied() {
    let m = mesh(
        "  - {name: web-80, namespace: shop, action: ALLOW, rules: [{to: [{ports: [80]}]}]}
  - {name: web-443, namespace: shop, action: ALLOW, rules: [{to: [{ports: [443]}]}]}
",
    );
    assert!(allowed(&m, "10.9.9.9", None, "web", 80));
    assert!(allowed(&m, "10.9.9.9", None, "web", 443));
    let d = check(&m, "10.9.9.9", None, "web", 22);
    assert_eq!(
        d,
        Decision::Deny {
            policy: "shop/web-80".into(),
            reason: DenyReason::NoAllowPolicyMatched { allow_policies: 2 }
        }
    );
    assert_eq!(
        d.to_string(),
        "denied: 2 ALLOW policies apply (first: shop/web-80) and none matched"
    );
    // Workloads of other namespaces are not governed by shop's policies.
    assert!(allowed(&m, "10.9.9.9", None, "fe", 22));
}

#[test]
fn empty_rules() {
    // ALLOW without rules matches nothing: deny all it governs.
    let m = mesh("  - {name: deny-all, namespace: shop, action: ALLOW}\n");
    assert!(!allowed(
        &m,
        "10.0.1.1",
        Some(&id("front", "frontend")),
        "web",
        80
    ));
    assert!(allowed(&m, "10.0.0.1", None, "fe", 80));
    let m = mesh("  - {name: deny-all, namespace: shop, action: ALLOW, rules: []}\n");
    assert!(!allowed(&m, "10.0.1.1", None, "db", 80));
    // One rule without conditions matches everything: allow all.
    let m = mesh("  - {name: allow-all, namespace: shop, action: ALLOW, rules: [{}]}\n");
    assert!(allowed(&m, "10.0.1.1", None, "db", 80));
    // A rule with only empty lists is the same.
    let m = mesh(
        "  - {name: allow-all, namespace: shop, action: ALLOW, rules: [{from: [], to: []}]}\n",
    );
    assert!(allowed(&m, "10.0.1.1", None, "db", 80));
    // DENY without rules never denies.
    let m = mesh("  - {name: nothing, action: DENY}\n");
    assert!(allowed(&m, "10.0.1.1", None, "db", 80));
    // DENY with an empty rule denies everything.
    let m = mesh("  - {name: everything, action: DENY, rules: [{}]}\n");
    assert!(!allowed(
        &m,
        "10.0.1.1",
        Some(&id("front", "frontend")),
        "fe",
        1
    ));
}

#[test]
fn scope_root_namespace_and_selectors() {
    let m = mesh(
        "  - {name: root-by-name, namespace: ringway-system, action: DENY, selector: {workloads: [frontend-0]}, rules: [{}]}
  - {name: shop-web-only, namespace: shop, action: ALLOW, selector: {workloads: [web-0]}, rules: [{to: [{ports: [80]}]}]}
",
    );
    // The mesh-wide policy with a selector reaches frontend-0 in another namespace.
    assert!(!allowed(&m, "10.0.0.1", None, "fe", 80));
    // The selector limits shop's ALLOW to web-0: db-0 has no ALLOW policy.
    assert!(!allowed(&m, "10.0.0.2", None, "web", 22));
    assert!(allowed(&m, "10.0.0.2", None, "web", 80));
    assert!(allowed(&m, "10.0.0.1", None, "db", 22));
    // Root namespace workloads get only the mesh-wide policies.
    assert!(allowed(&m, "10.0.0.1", None, "sys", 22));
}

#[test]
fn custom_root_namespace() {
    let yaml = format!(
        "rootNamespace: mesh-root\n{WORKLOADS}policies:
  - {{name: a, namespace: mesh-root, action: DENY, rules: [{{}}]}}
  - {{name: b, namespace: ringway-system, action: DENY, rules: [{{}}]}}
"
    );
    let m = MeshConfig::load_str(&yaml, "t", &NoEnv).unwrap();
    // mesh-root is mesh-wide now; ringway-system is an ordinary namespace.
    assert_eq!(
        check(&m, "10.1.1.1", None, "web", 1),
        Decision::Deny {
            policy: "mesh-root/a".into(),
            reason: DenyReason::DenyPolicyMatched { rule: 0 }
        }
    );
    assert!(m.policies().next().unwrap().mesh_wide && !m.policies().nth(1).unwrap().mesh_wide);
}

#[test]
fn plaintext_and_identity_fields() {
    let frontend = id("front", "frontend");
    let m =
        mesh("  - {name: mtls-only, action: ALLOW, rules: [{from: [{principals: [\"*\"]}]}]}\n");
    assert!(allowed(&m, "10.0.1.1", Some(&frontend), "web", 80));
    assert!(!allowed(&m, "10.0.1.1", None, "web", 80));
    for field in ["namespaces: [\"*\"]", "serviceAccounts: [front/frontend]"] {
        let m = mesh(&format!(
            "  - {{name: p, action: ALLOW, rules: [{{from: [{{{field}}}]}}]}}\n"
        ));
        assert!(
            allowed(&m, "10.0.1.1", Some(&frontend), "web", 80),
            "{field}"
        );
        assert!(
            !allowed(&m, "10.0.1.1", None, "web", 80),
            "{field}: plaintext"
        );
    }
    // The idiom that refuses plaintext: DENY notPrincipals "*".
    let m = mesh(
        "  - {name: no-plaintext, action: DENY, rules: [{from: [{notPrincipals: [\"*\"]}]}]}\n",
    );
    assert!(!allowed(&m, "10.0.1.1", None, "web", 80));
    assert!(allowed(&m, "10.0.1.1", Some(&frontend), "web", 80));
    // ipBlocks match plaintext peers.
    let m =
        mesh("  - {name: by-ip, action: ALLOW, rules: [{from: [{ipBlocks: [10.0.1.0/24]}]}]}\n");
    assert!(allowed(&m, "10.0.1.7", None, "web", 80));
    assert!(!allowed(&m, "10.0.2.7", None, "web", 80));
}

#[test]
fn negations() {
    let frontend = id("front", "frontend");
    let web = id("shop", "web");
    let m = mesh(
        "  - name: p
    namespace: shop
    action: ALLOW
    rules:
      - from:
          - {notNamespaces: [shop], notIpBlocks: [10.0.1.128/25], notServiceAccounts: [front/admin]}
        to:
          - {notPorts: [22]}
",
    );
    assert!(allowed(&m, "10.0.1.1", Some(&frontend), "db", 80));
    assert!(
        !allowed(&m, "10.0.1.1", Some(&web), "db", 80),
        "notNamespaces"
    );
    assert!(
        !allowed(&m, "10.0.1.200", Some(&frontend), "db", 80),
        "notIpBlocks"
    );
    assert!(
        !allowed(&m, "10.0.1.1", Some(&id("front", "admin")), "db", 80),
        "notServiceAccounts"
    );
    assert!(
        !allowed(&m, "10.0.1.1", Some(&frontend), "db", 22),
        "notPorts"
    );
    // Plaintext has no namespace nor service account to exclude.
    assert!(allowed(&m, "10.0.1.1", None, "db", 80));
}

#[test]
fn fields_and_within_a_source_or_across_sources() {
    let frontend = id("front", "frontend");
    let m = mesh(
        "  - name: p
    namespace: shop
    action: ALLOW
    rules:
      - from:
          - {namespaces: [front], ipBlocks: [10.0.1.0/24]}
          - {ipBlocks: [\"fd00:aa::/32\"]}
        to:
          - {ports: [80]}
          - {ports: [443]}
",
    );
    assert!(allowed(&m, "10.0.1.1", Some(&frontend), "web", 80));
    assert!(allowed(&m, "10.0.1.1", Some(&frontend), "web", 443));
    assert!(!allowed(&m, "10.0.1.1", Some(&frontend), "web", 8080), "to");
    assert!(
        !allowed(&m, "10.0.2.1", Some(&frontend), "web", 80),
        "AND within a source"
    );
    assert!(
        !allowed(&m, "10.0.1.1", Some(&id("shop", "x")), "web", 80),
        "AND within a source"
    );
    assert!(
        allowed(&m, "fd00:aa:1::1", None, "web", 80),
        "OR across sources"
    );
}

#[test]
fn cidrs_v4_v6_and_mapped_sources() {
    let m = mesh(
        "  - {name: p, action: ALLOW, rules: [{from: [{ipBlocks: [10.1.0.0/16, \"fd00:1::/32\", 192.168.7.7]}]}]}\n",
    );
    for (src, want) in [
        ("10.1.255.255", true),
        ("10.2.0.0", false),
        ("::ffff:10.1.2.3", true),
        ("fd00:1:ffff::1", true),
        ("fd00:2::1", false),
        ("192.168.7.7", true),
        ("192.168.7.8", false),
        ("::ffff:192.168.7.7", true),
    ] {
        assert_eq!(allowed(&m, src, None, "web", 80), want, "{src}");
    }
    let m = mesh("  - {name: p, action: ALLOW, rules: [{from: [{ipBlocks: [0.0.0.0/0]}]}]}\n");
    assert!(allowed(&m, "1.2.3.4", None, "web", 80));
    assert!(
        !allowed(&m, "2001:db8::1", None, "web", 80),
        "a v4 block never holds a v6 address"
    );
}

#[test]
fn principal_and_namespace_globs() {
    let cases = [
        ("spiffe://cluster.local/ns/front/sa/frontend", true),
        ("cluster.local/ns/front/sa/frontend", true),
        ("spiffe://cluster.local/ns/front/sa/frontend-x", false),
        ("spiffe://cluster.local/ns/front/*", true),
        ("spiffe://cluster.local/ns/fr*", true),
        ("cluster.local/ns/shop/*", false),
        ("*/sa/frontend", true),
        ("*/ns/front/sa/frontend", true),
        ("*end", true),
        ("*/sa/web", false),
        ("spiffe://other.td/*", false),
        ("*", true),
    ];
    let frontend = id("front", "frontend");
    for (pattern, want) in cases {
        let m = mesh(&format!(
            "  - {{name: p, action: ALLOW, rules: [{{from: [{{principals: [\"{pattern}\"]}}]}}]}}\n"
        ));
        assert_eq!(
            allowed(&m, "10.0.1.1", Some(&frontend), "web", 80),
            want,
            "{pattern}"
        );
    }
    for (pattern, want) in [
        ("front", true),
        ("fr*", true),
        ("*ont", true),
        ("*", true),
        ("shop", false),
        ("front-*", false),
    ] {
        let m = mesh(&format!(
            "  - {{name: p, action: ALLOW, rules: [{{from: [{{namespaces: [\"{pattern}\"]}}]}}]}}\n"
        ));
        assert_eq!(
            allowed(&m, "10.0.1.1", Some(&frontend), "web", 80),
            want,
            "{pattern}"
        );
    }
}

#[test]
fn identities_parse_and_print() {
    let i = Identity::from_spiffe_id("spiffe://cluster.local/ns/front/sa/frontend").unwrap();
    assert_eq!(i, id("front", "frontend"));
    assert_eq!(i.to_string(), "spiffe://cluster.local/ns/front/sa/frontend");
    for (bad, reason) in [
        ("cluster.local/ns/a/sa/b", "expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>"),
        ("spiffe://td/ns/a/sa/b/c", "expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>"),
        ("spiffe://td/ns//sa/b", "namespace: must not be empty"),
        ("spiffe://TD/ns/a/sa/b", "trust domain: \"TD\" is not a valid trust domain: contains \"T\" (only lowercase letters, digits, \".\", \"-\" and \"_\" are allowed)"),
    ] {
        let err = Identity::from_spiffe_id(bad).unwrap_err();
        assert_eq!(err.reason(), reason, "{bad}");
        assert_eq!(err.to_string(), format!("{bad:?} is not a SPIFFE workload identity: {reason}"));
    }
}

// ---------------------------------------------------------------------
// Randomized comparison against an oracle.

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
    fn some(&mut self, pool: &[&str]) -> Vec<String> {
        (0..1 + self.below(2))
            .map(|_| (*self.pick(pool)).to_owned())
            .collect()
    }
}

const NAMESPACES: &[&str] = &["", "ringway-system", "shop", "front"];
const SELECTED: &[&str] = &["web-0", "db-0", "frontend-0", "nobody"];
const PRINCIPALS: &[&str] = &[
    "*",
    "spiffe://cluster.local/ns/front/sa/frontend",
    "cluster.local/ns/shop/sa/web",
    "spiffe://cluster.local/ns/front*",
    "*/sa/frontend",
    "*/ns/shop/sa/web",
    "spiffe://other.td/*",
];
const NS_PATTERNS: &[&str] = &["*", "front", "front-*", "*-2", "shop"];
const ACCOUNTS: &[&str] = &["front/frontend", "shop/web", "front-2/frontend"];
const BLOCKS: &[&str] = &[
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.3",
    "0.0.0.0/0",
    "fd00::/8",
    "fd00:1::/32",
    "::/0",
];
const SOURCES: &[&str] = &[
    "10.1.2.3",
    "10.1.9.9",
    "10.200.0.1",
    "192.168.0.1",
    "fd00:1::5",
    "fd00:2::5",
    "2001:db8::1",
    "::ffff:10.1.2.3",
];
const PORTS: &[i64] = &[80, 443, 8080, 9090];

fn identities() -> Vec<Option<Identity>> {
    vec![
        None,
        Some(id("front", "frontend")),
        Some(id("shop", "web")),
        Some(id("front-2", "frontend")),
        Some(Identity::new("other.td", "front", "frontend")),
    ]
}

fn random_source(rng: &mut Rng) -> crate::SourceConfig {
    loop {
        let mut s = crate::SourceConfig::default();
        let fields: [(&mut Vec<String>, &[&str]); 8] = [
            (&mut s.principals, PRINCIPALS),
            (&mut s.not_principals, PRINCIPALS),
            (&mut s.namespaces, NS_PATTERNS),
            (&mut s.not_namespaces, NS_PATTERNS),
            (&mut s.service_accounts, ACCOUNTS),
            (&mut s.not_service_accounts, ACCOUNTS),
            (&mut s.ip_blocks, BLOCKS),
            (&mut s.not_ip_blocks, BLOCKS),
        ];
        for (field, pool) in fields {
            if rng.chance(20) {
                *field = rng.some(pool);
            }
        }
        if s != crate::SourceConfig::default() {
            return s;
        }
    }
}

fn random_operation(rng: &mut Rng) -> crate::OperationConfig {
    let mut o = crate::OperationConfig::default();
    let ports = |rng: &mut Rng| (0..1 + rng.below(2)).map(|_| *rng.pick(PORTS)).collect();
    match rng.below(3) {
        0 => o.ports = ports(rng),
        1 => o.not_ports = ports(rng),
        _ => {
            o.ports = ports(rng);
            o.not_ports = ports(rng);
        }
    }
    o
}

fn random_config(rng: &mut Rng) -> MeshConfig {
    let mut cfg = MeshConfig::parse(WORKLOADS, "t").unwrap();
    for i in 0..rng.below(5) {
        let rules = (0..rng.below(3))
            .map(|_| crate::RuleConfig {
                from: (0..rng.below(3)).map(|_| random_source(rng)).collect(),
                to: (0..rng.below(2)).map(|_| random_operation(rng)).collect(),
                when: Vec::new(),
            })
            .collect();
        cfg.policies.push(crate::PolicyConfig {
            name: format!("p{i}"),
            namespace: (*rng.pick(NAMESPACES)).to_owned(),
            selector: rng.chance(25).then(|| crate::SelectorConfig {
                workloads: rng.some(SELECTED),
                match_labels: Default::default(),
            }),
            action: (*rng.pick(&["ALLOW", "DENY"])).to_owned(),
            rules,
            origin: None,
        });
    }
    cfg
}

/// The oracle: the semantics transcribed naively onto the file's strings.
mod oracle {
    use super::*;
    use crate::{PolicyConfig, RuleConfig, SourceConfig};

    pub struct Conn<'a> {
        pub ip: IpAddr,
        pub id: Option<&'a Identity>,
        pub dst: &'a Workload,
        pub port: u16,
    }

    fn glob(pattern: &str, value: &str) -> bool {
        if pattern == "*" {
            true
        } else if let Some(p) = pattern.strip_suffix('*') {
            value.starts_with(p)
        } else if let Some(s) = pattern.strip_prefix('*') {
            value.ends_with(s)
        } else {
            pattern == value
        }
    }

    fn principal(pattern: &str, id: &Identity) -> bool {
        let pattern = if pattern.starts_with("spiffe://") || pattern.starts_with('*') {
            pattern.to_owned()
        } else {
            format!("spiffe://{pattern}")
        };
        glob(&pattern, &id.to_string())
    }

    /// (is IPv4, address bits left-aligned in 128 bits).
    fn bits(ip: IpAddr) -> (bool, u128) {
        match ip {
            IpAddr::V4(v4) => (true, u128::from(u32::from(v4)) << 96),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => (true, u128::from(u32::from(v4)) << 96),
                None => (false, u128::from(v6)),
            },
        }
    }

    fn in_block(block: &str, ip: IpAddr) -> bool {
        let (addr, len) = match block.split_once('/') {
            Some((a, l)) => (a.parse::<IpAddr>().unwrap(), l.parse::<u32>().unwrap()),
            None => {
                let a = block.parse::<IpAddr>().unwrap();
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let (net_v4, net) = bits(addr);
        let (ip_v4, ip) = bits(ip);
        net_v4 == ip_v4 && (len == 0 || (net ^ ip) >> (128 - len) == 0)
    }

    /// A field: absent = true; positive = some value matches; negated = none does.
    fn field(values: &[String], negated: bool, f: impl Fn(&str) -> bool) -> bool {
        if values.is_empty() {
            return true;
        }
        let hit = values.iter().any(|v| f(v));
        if negated {
            !hit
        } else {
            hit
        }
    }

    fn source(s: &SourceConfig, c: &Conn<'_>) -> bool {
        let with_id = |f: &dyn Fn(&Identity) -> bool| c.id.is_some_and(f);
        field(&s.principals, false, |p| with_id(&|i| principal(p, i)))
            && field(&s.not_principals, true, |p| with_id(&|i| principal(p, i)))
            && field(&s.namespaces, false, |p| {
                with_id(&|i| glob(p, &i.namespace))
            })
            && field(&s.not_namespaces, true, |p| {
                with_id(&|i| glob(p, &i.namespace))
            })
            && field(&s.service_accounts, false, |p| {
                with_id(&|i| p == format!("{}/{}", i.namespace, i.service_account))
            })
            && field(&s.not_service_accounts, true, |p| {
                with_id(&|i| p == format!("{}/{}", i.namespace, i.service_account))
            })
            && field(&s.ip_blocks, false, |b| in_block(b, c.ip))
            && field(&s.not_ip_blocks, true, |b| in_block(b, c.ip))
    }

    fn rule(r: &RuleConfig, c: &Conn<'_>) -> bool {
        (r.from.is_empty() || r.from.iter().any(|s| source(s, c)))
            && (r.to.is_empty()
                || r.to.iter().any(|o| {
                    let port = i64::from(c.port);
                    (o.ports.is_empty() || o.ports.contains(&port)) && !o.not_ports.contains(&port)
                }))
    }

    fn governs(p: &PolicyConfig, root: &str, w: &Workload) -> bool {
        let mesh_wide = p.namespace.is_empty() || p.namespace == root;
        (mesh_wide || p.namespace == w.namespace)
            && p.selector
                .as_ref()
                .is_none_or(|s| s.workloads.contains(&w.name))
    }

    /// `None` = allow; `Some(names of matching DENY policies)` or
    /// `Some(empty)` for "ALLOW policies apply and none matched".
    pub fn evaluate(cfg: &MeshConfig, c: &Conn<'_>) -> Option<Vec<String>> {
        let governing: Vec<&PolicyConfig> = cfg
            .policies
            .iter()
            .filter(|p| governs(p, &cfg.root_namespace, c.dst))
            .collect();
        let matches = |p: &PolicyConfig| p.rules.iter().any(|r| rule(r, c));
        let denying: Vec<String> = governing
            .iter()
            .filter(|p| p.action == "DENY" && matches(p))
            .map(|p| {
                let ns = if p.namespace.is_empty() {
                    &cfg.root_namespace
                } else {
                    &p.namespace
                };
                format!("{ns}/{}", p.name)
            })
            .collect();
        if !denying.is_empty() {
            return Some(denying);
        }
        let allows: Vec<&&PolicyConfig> =
            governing.iter().filter(|p| p.action == "ALLOW").collect();
        if allows.is_empty() || allows.iter().any(|p| matches(p)) {
            None
        } else {
            Some(Vec::new())
        }
    }
}

#[test]
fn random_meshes_agree_with_the_oracle() {
    let seed = 0x5eed_1234_abcd_0001;
    let mut rng = Rng(seed);
    let identities = identities();
    let (mut allows, mut deny_matches, mut no_allow) = (0, 0, 0);
    for round in 0..3000 {
        let cfg = random_config(&mut rng);
        let mesh = cfg
            .validate("random")
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        for _ in 0..30 {
            let ip: IpAddr = rng.pick(SOURCES).parse().unwrap();
            let identity = rng.pick(&identities).as_ref();
            let all: Vec<_> = mesh.workloads().collect();
            let dst = *rng.pick(&all);
            let port = *rng.pick(PORTS) as u16;
            let got = evaluate(
                &mesh,
                &ConnInfo {
                    src_ip: ip,
                    src_identity: identity,
                    dst_workload: dst,
                    dst_ip: dst.ips[0],
                    dst_port: port,
                },
            );
            let want = oracle::evaluate(
                &cfg,
                &oracle::Conn {
                    ip,
                    id: identity,
                    dst,
                    port,
                },
            );
            let context = || {
                format!(
                    "seed {seed:#x} round {round}: {ip} {identity:?} -> {} :{port}\n{cfg:#?}",
                    dst.name
                )
            };
            match (&got, &want) {
                (Decision::Allow, None) => allows += 1,
                (
                    Decision::Deny {
                        policy,
                        reason: DenyReason::DenyPolicyMatched { .. },
                    },
                    Some(denying),
                ) if denying.contains(&policy.to_string()) => deny_matches += 1,
                (
                    Decision::Deny {
                        reason: DenyReason::NoAllowPolicyMatched { .. },
                        ..
                    },
                    Some(denying),
                ) if denying.is_empty() => no_allow += 1,
                _ => panic!("got {got:?}, oracle {want:?}; {}", context()),
            }
        }
    }
    // The generator exercises every outcome.
    assert!(
        allows > 5000 && deny_matches > 5000 && no_allow > 5000,
        "{allows} {deny_matches} {no_allow}"
    );
}

#[test]
fn properties_of_added_policies() {
    let mut rng = Rng(0xfeed_0000_0000_0042);
    let identities = identities();
    for _ in 0..500 {
        let base = random_config(&mut rng);
        let ns = (*rng.pick(NAMESPACES)).to_owned();
        let with = |action: &str, rules: Vec<crate::RuleConfig>| {
            let mut cfg = base.clone();
            cfg.policies.push(crate::PolicyConfig {
                name: "added".into(),
                namespace: ns.clone(),
                selector: None,
                action: action.into(),
                rules,
                origin: None,
            });
            cfg.validate("added").unwrap()
        };
        let base_mesh = base.validate("base").unwrap();
        let deny_all = with("DENY", vec![Default::default()]);
        let allow_all = with("ALLOW", vec![Default::default()]);
        let allow_none = with("ALLOW", vec![]);
        let deny_none = with("DENY", vec![]);
        for _ in 0..20 {
            let identity = rng.pick(&identities).as_ref();
            let dst_index = rng.below(base_mesh.workload_count());
            let conn = |m: &Mesh| {
                let dst = m.workloads().nth(dst_index).unwrap();
                evaluate(
                    m,
                    &ConnInfo {
                        src_ip: rng_ip(dst_index),
                        src_identity: identity,
                        dst_workload: dst,
                        dst_ip: dst.ips[0],
                        dst_port: 80,
                    },
                )
            };
            let dst = base_mesh.workloads().nth(dst_index).unwrap();
            let governed = ns.is_empty() || ns == "ringway-system" || ns == dst.namespace;
            let before = conn(&base_mesh);
            let deny_matched = matches!(
                before,
                Decision::Deny {
                    reason: DenyReason::DenyPolicyMatched { .. },
                    ..
                }
            );
            // A DENY that matches everything denies, whatever ALLOW says.
            assert_eq!(
                conn(&deny_all).is_allowed(),
                before.is_allowed() && !governed
            );
            // An ALLOW that matches everything allows unless a DENY matched.
            if governed {
                assert_eq!(conn(&allow_all).is_allowed(), !deny_matched);
            }
            // An ALLOW with no rules denies what it governs, unless another
            // ALLOW policy governs it (and, since it was allowed, matched).
            let had_allow = base_mesh
                .policies_for(dst)
                .any(|p| p.action == crate::Action::Allow);
            assert_eq!(
                conn(&allow_none).is_allowed(),
                before.is_allowed() && (!governed || had_allow)
            );
            // A DENY with no rules changes nothing.
            assert_eq!(conn(&deny_none), before);
        }
    }
}

fn rng_ip(i: usize) -> IpAddr {
    SOURCES[i % SOURCES.len()].parse().unwrap()
}
