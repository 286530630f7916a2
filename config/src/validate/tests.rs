//! One test per class of invalid input, each asserting the exact message.

use std::net::IpAddr;

use crate::{ConfigError, MeshConfig, NoEnv};

const ORIGIN: &str = "config.yaml";

/// The error `yaml` produces, as displayed.
fn error(yaml: &str) -> String {
    match MeshConfig::load_str(yaml, ORIGIN, &NoEnv) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// Two valid workloads, then `rest`.
fn with_workloads(rest: &str) -> String {
    format!(
        "workloads:
  - {{uid: w1, name: web-0, namespace: shop, serviceAccount: web, ips: [10.0.0.1, \"fd00::1\"], node: node-a, tunnel: true}}
  - {{uid: w2, name: db-0, namespace: shop, serviceAccount: db, ips: [10.0.0.2], node: node-b}}
{rest}"
    )
}

/// A policy whose only rule has the source `source`.
fn with_source(source: &str) -> String {
    format!("policies:\n  - {{name: p, namespace: shop, action: ALLOW, rules: [{{from: [{source}]}}]}}\n")
}

/// A policy whose only rule has the destination `to`.
fn with_to(to: &str) -> String {
    format!("policies:\n  - {{name: p, namespace: shop, action: ALLOW, rules: [{{to: [{to}]}}]}}\n")
}

/// One workload with the extra `fields`.
fn workload(fields: &str) -> String {
    format!(
        "workloads:\n  - {{uid: w1, name: web-0, namespace: shop, ips: [10.0.0.1], node: n, {fields}}}\n"
    )
}

#[test]
fn parse_errors_keep_line_and_column() {
    assert_eq!(
        error("workloads:\n  - uid: a\n    nme: x\n"),
        "config.yaml:3:5: workloads[0]: unknown field `nme`, expected one of `uid`, `name`, \
         `namespace`, `serviceAccount`, `ips`, `node`, `tunnel`, `healthy`, `labels`, `workloadName`, `locality`"
    );
    assert_eq!(
        error("trustDomain: x\nproxy:\n  workers: many\n"),
        "config.yaml:3:12: proxy.workers: invalid type: string \"many\", expected usize"
    );
    assert_eq!(
        error("proxy: {workers: 1}\n\tfoo: [\n"),
        "config.yaml:2:1: found character that cannot start any token, while scanning for the next token"
    );
    assert_eq!(
        error("workloads:\n  - {uid: a, name: b}\n"),
        "config.yaml:2:5: workloads[0]: missing field `namespace`"
    );
    assert_eq!(
        error("services:\n  - hostname: a\n    namespace: b\n    ports: {80: 8080, 80: 9090}\n"),
        "config.yaml:4:12: services[0].ports: service port 80 is listed twice"
    );
    assert_eq!(
        error("proxy:\n  drainPeriod: 100000\n"),
        "config.yaml:2:16: proxy.drainPeriod: 100000 seconds is outside 0..=86400"
    );
    assert_eq!(
        error("policies:\n  - {name: p, action: ALLOW, rules: [{to: [{ports: [\"80\"]}]}]}\n"),
        "config.yaml:2:53: policies[0].rules[0].to[0].ports[0]: invalid type: string \"80\", expected i64"
    );
}

#[test]
fn empty_document_and_old_top_level_settings_are_refused() {
    for empty in ["", "# only a comment\n", "~\n"] {
        assert_eq!(
            error(empty),
            "config.yaml:1:1: the document is empty (write `{}` to run with every default)"
        );
    }
    MeshConfig::load_str("{}", ORIGIN, &NoEnv).unwrap();
    assert_eq!(
        error("captureMode: redirect\n"),
        "config.yaml:1:1: unknown field `captureMode`, expected one of `proxy`, `trustDomain`, \
         `rootNamespace`, `ca`, `workloads`, `services`, `policies`, `clusterId`, `locality`, `trustDomainAliases` (proxy settings live under \
         `proxy:`: write `proxy: {captureMode: ...}`)"
    );
}

#[test]
fn proxy_settings_errors_carry_the_proxy_prefix() {
    assert_eq!(
        error("proxy: {ports: {outbound: 1, inbound: 1, tunnel: 3}}\n"),
        "config.yaml: proxy.ports: outbound (1), inbound (1) and tunnel (3) must differ"
    );
    assert_eq!(
        error("proxy: {ports: {outbound: 1, inbound: 2, tunnel: 0}}\n"),
        "config.yaml: proxy.ports.tunnel: port 0 is not a usable listener port"
    );
    assert_eq!(
        error("proxy: {pipeSize: 10}\n"),
        "config.yaml: proxy.pipeSize: 10 is outside 4096..=67108864 bytes"
    );
    assert_eq!(
        error("proxy: {busyPollMicros: 5000}\n"),
        "config.yaml: proxy.busyPollMicros: 5000 µs is outside 0..=1000 µs"
    );
    assert_eq!(
        error("proxy: {workers: 5000}\n"),
        "config.yaml: proxy.workers: 5000 workers is more than 1024"
    );
    assert_eq!(
        error("proxy: {backlog: 0}\n"),
        "config.yaml: proxy.backlog: a listen backlog of 0 refuses bursts"
    );
    assert_eq!(
        error("proxy: {proxyMark: 0}\n"),
        "config.yaml: proxy.proxyMark: 0 is no mark: the proxy's own packets would be captured again"
    );
}

#[test]
fn trust_domain_and_root_namespace() {
    assert_eq!(
        error("trustDomain: Cluster.Local\n"),
        "config.yaml: trustDomain: \"Cluster.Local\" is not a valid trust domain: contains \"C\" \
         (only lowercase letters, digits, \".\", \"-\" and \"_\" are allowed)"
    );
    assert_eq!(
        error("trustDomain: 'a b'\n"),
        "config.yaml: trustDomain: \"a b\" is not a valid trust domain: contains \" \" \
         (only lowercase letters, digits, \".\", \"-\" and \"_\" are allowed)"
    );
    assert_eq!(
        error("trustDomain: ''\n"),
        "config.yaml: trustDomain: must not be empty"
    );
    assert_eq!(
        error("rootNamespace: -system\n"),
        "config.yaml: rootNamespace: \"-system\" is not a valid namespace: it must start and end \
         with a letter or digit"
    );
}

#[test]
fn ca_paths_must_be_absolute() {
    assert_eq!(
        error("ca: {certFile: /etc/ca.crt, keyFile: ca/key.pem}\n"),
        "config.yaml: ca.keyFile: \"ca/key.pem\" is a relative path; CA files must be absolute paths"
    );
    assert_eq!(
        error("ca: {certFile: ca.crt, keyFile: /k}\n"),
        "config.yaml: ca.certFile: \"ca.crt\" is a relative path; CA files must be absolute paths"
    );
    assert_eq!(
        error("ca: {certFile: /c, keyFile: /k, bundleFiles: [/b, b2.pem]}\n"),
        "config.yaml: ca.bundleFiles[1]: \"b2.pem\" is a relative path; CA files must be absolute paths"
    );
    assert_eq!(
        error("ca: {certFile: '', keyFile: /k}\n"),
        "config.yaml: ca.certFile: must not be empty"
    );
}

#[test]
fn ca_is_a_local_ca_or_a_certificate_service_never_both() {
    let cases = [
        (
            "ca: {certFile: /c, keyFile: /k, address: 'ca:15012'}\n",
            "config.yaml: ca: certFile/keyFile (the local CA) and address/serverName/rootCertFile/tokenFile \
             (a certificate service) exclude each other: choose one mode",
        ),
        (
            "ca: {}\n",
            "config.yaml: ca: needs certFile and keyFile (the local CA) or address and rootCertFile (a certificate service)",
        ),
        ("ca: {certFile: /c}\n", "config.yaml: ca.keyFile: is required with ca.certFile"),
        (
            "ca: {rootCertFile: /r}\n",
            "config.yaml: ca.address: is required for a certificate service",
        ),
        (
            "ca: {address: ringway-ca, rootCertFile: /r}\n",
            "config.yaml: ca.address: \"ringway-ca\" is not host:port",
        ),
        (
            "ca: {address: 'ringway-ca:0', rootCertFile: /r}\n",
            "config.yaml: ca.address: \"ringway-ca:0\" is not host:port",
        ),
        (
            "ca: {address: 'ringway-ca:15012'}\n",
            "config.yaml: ca.rootCertFile: is required for a certificate service (the root its certificate chains to)",
        ),
        (
            "ca: {address: 'ringway-ca:15012', rootCertFile: r.pem}\n",
            "config.yaml: ca.rootCertFile: \"r.pem\" is a relative path; CA files must be absolute paths",
        ),
        (
            "ca: {address: 'ringway-ca:15012', rootCertFile: /r, tokenFile: t}\n",
            "config.yaml: ca.tokenFile: \"t\" is a relative path; CA files must be absolute paths",
        ),
        (
            "ca: {address: 'ringway-ca:15012', rootCertFile: /r, serverName: ''}\n",
            "config.yaml: ca.serverName: must not be empty",
        ),
    ];
    for (yaml, want) in cases {
        assert_eq!(error(yaml), want, "{yaml}");
    }
    let m = MeshConfig::load_str(
        "ca: {address: 'ringway-ca.ringway-system.svc:15012', rootCertFile: /etc/mesh/root.pem}\n",
        ORIGIN,
        &NoEnv,
    )
    .unwrap();
    assert!(m.ca().is_none(), "no local CA in the service mode");
    let svc = m.ca_service().unwrap();
    assert_eq!(svc.address, "ringway-ca.ringway-system.svc:15012");
    assert_eq!(svc.server_name, "ringway-ca.ringway-system.svc");
    assert_eq!(
        svc.token_file,
        std::path::PathBuf::from(crate::DEFAULT_CA_TOKEN_FILE)
    );
    let local = MeshConfig::load_str("ca: {certFile: /c, keyFile: /k}\n", ORIGIN, &NoEnv).unwrap();
    assert!(local.ca().is_some() && local.ca_service().is_none());
}

#[test]
fn workload_fields() {
    assert_eq!(
        error("workloads:\n  - {uid: '', name: w, namespace: n, ips: [10.0.0.1], node: n}\n"),
        "config.yaml: workloads[0].uid: must not be empty"
    );
    assert_eq!(
        error("workloads:\n  - {uid: 'a b', name: w, namespace: n, ips: [10.0.0.1], node: n}\n"),
        "config.yaml: workloads[0].uid: \"a b\" contains whitespace or control characters"
    );
    assert_eq!(
        error("workloads:\n  - {uid: u, name: Web, namespace: n, ips: [10.0.0.1], node: n}\n"),
        "config.yaml: workloads[0].name: \"Web\" is not a valid workload name: contains \"W\" \
         (only lowercase letters, digits, \"-\" and \".\" are allowed)"
    );
    assert_eq!(
        error("workloads:\n  - {uid: u, name: w, namespace: my.ns, ips: [10.0.0.1], node: n}\n"),
        "config.yaml: workloads[0].namespace: \"my.ns\" is not a valid namespace: contains \".\" \
         (only lowercase letters, digits and \"-\" are allowed)"
    );
    assert_eq!(
        error(&workload("serviceAccount: 'sa_1'")),
        "config.yaml: workloads[0].serviceAccount: \"sa_1\" is not a valid service account: \
         contains \"_\" (only lowercase letters, digits, \"-\" and \".\" are allowed)"
    );
    assert_eq!(
        error("workloads:\n  - {uid: u, name: w, namespace: n, ips: [10.0.0.1], node: a..b}\n"),
        "config.yaml: workloads[0].node: \"a..b\" is not a valid node name: each dot-separated \
         part must start and end with a letter or digit"
    );
    let long = "a".repeat(64);
    assert_eq!(
        error(&format!(
            "workloads:\n  - {{uid: u, name: w, namespace: {long}, ips: [10.0.0.1], node: n}}\n"
        )),
        format!(
            "config.yaml: workloads[0].namespace: \"{long}\" is not a valid namespace: 64 \
             characters is more than 63"
        )
    );
}

#[test]
fn workload_addresses() {
    assert_eq!(
        error(&with_workloads(
            "  - {uid: w3, name: c, namespace: shop, ips: [10.0.0.3], node: n}\n  - {uid: w4, name: d, namespace: shop, ips: [10.0.0.300], node: n}\n"
        )),
        "config.yaml: workloads[3].ips[0]: \"10.0.0.300\" is not an IP address"
    );
    assert_eq!(
        error("workloads:\n  - {uid: u, name: w, namespace: n, ips: [], node: n}\n"),
        "config.yaml: workloads[0].ips: a workload needs at least one IP address"
    );
    assert_eq!(
        error(
            "workloads:\n  - {uid: u, name: w, namespace: n, ips: [10.0.0.1, 0.0.0.0], node: n}\n"
        ),
        "config.yaml: workloads[0].ips[1]: \"0.0.0.0\" is not a unicast address"
    );
    assert_eq!(
        error("workloads:\n  - {uid: u, name: w, namespace: n, ips: [\"ff02::1\"], node: n}\n"),
        "config.yaml: workloads[0].ips[0]: \"ff02::1\" is not a unicast address"
    );
    assert_eq!(
        error(&with_workloads(
            "  - {uid: w3, name: c, namespace: shop, ips: [\"::ffff:10.0.0.2\"], node: n}\n"
        )),
        "config.yaml: workloads[2].ips[0]: \"::ffff:10.0.0.2\" is already an address of workloads[1] (shop/db-0)"
    );
    assert_eq!(
        error(&with_workloads(
            "  - {uid: w1, name: c, namespace: shop, ips: [10.0.0.9], node: n}\n"
        )),
        "config.yaml: workloads[2].uid: \"w1\" is already the uid of workloads[0]"
    );
}

#[test]
fn service_fields() {
    let svc = |fields: &str| {
        with_workloads(&format!(
            "services:\n  - {{hostname: web.shop.svc.cluster.local, namespace: shop, vips: [10.96.0.1], ports: {{80: 8080}}, endpoints: [w1]}}\n  - {{{fields}}}\n"
        ))
    };
    assert_eq!(
        error(&svc("hostname: Web, namespace: shop")),
        "config.yaml: services[1].hostname: \"Web\" is not a valid host name: contains \"W\" \
         (only lowercase letters, digits, \"-\" and \".\" are allowed)"
    );
    assert_eq!(
        error(&svc(
            "hostname: web.shop.svc.cluster.local, namespace: shop"
        )),
        "config.yaml: services[1].hostname: \"web.shop.svc.cluster.local\" in namespace \"shop\" \
         is already defined by services[0]"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, vips: [10.96.0.300]")),
        "config.yaml: services[1].vips[0]: \"10.96.0.300\" is not an IP address"
    );
    assert_eq!(
        error(&svc(
            "hostname: b, namespace: shop, vips: [10.96.0.2, 10.96.0.1]"
        )),
        "config.yaml: services[1].vips[1]: \"10.96.0.1\" is already a VIP of services[0] \
         (web.shop.svc.cluster.local)"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, vips: [10.0.0.2]")),
        "config.yaml: services[1].vips[0]: \"10.0.0.2\" is an address of workloads[1] (shop/db-0)"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, ports: {0: 80}")),
        "config.yaml: services[1].ports[0]: service port 0 is not a port (1..=65535)"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, ports: {80: 0}")),
        "config.yaml: services[1].ports[80]: target port 0 is not a port (1..=65535)"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, ports: {80: 70000}")),
        "config.yaml: services[1].ports[80]: target port 70000 is not a port (1..=65535)"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, ports: {-1: 80}")),
        "config.yaml: services[1].ports[-1]: service port -1 is not a port (1..=65535)"
    );
    assert_eq!(
        error(&svc("hostname: b, namespace: shop, endpoints: [w2, w9]")),
        "config.yaml: services[1].endpoints[1]: no workload has uid \"w9\""
    );
    assert_eq!(
        error(&svc(
            "hostname: b, namespace: shop, endpoints: [w2, w1, w2]"
        )),
        "config.yaml: services[1].endpoints[2]: \"w2\" is listed twice"
    );
    let lb = |lb: &str| {
        svc(&format!(
            "hostname: b, namespace: shop, loadBalancing: {lb}"
        ))
    };
    assert_eq!(
        error(&lb("{routingPreference: [node, rack]}")),
        "config.yaml: services[1].loadBalancing.routingPreference[1]: \"rack\" is not a scope \
         (region, zone, subzone, node, cluster, network)"
    );
    assert_eq!(
        error(&lb("{routingPreference: [zone, zone]}")),
        "config.yaml: services[1].loadBalancing.routingPreference[1]: \"zone\" is listed twice"
    );
    assert_eq!(
        error(&lb("{mode: STRICT}")),
        "config.yaml: services[1].loadBalancing.mode: \"STRICT\" is not a mode \
         (strict, failover, passthrough)"
    );
    assert_eq!(
        error(&lb("{healthPolicy: all}")),
        "config.yaml: services[1].loadBalancing.healthPolicy: \"all\" is not a health policy \
         (onlyHealthy, allowAll)"
    );
    assert!(error(&lb("{routing: [node]}")).contains("unknown field `routing`"));
    let m = MeshConfig::load_str(
        &lb("{routingPreference: [node], mode: strict, healthPolicy: allowAll}"),
        ORIGIN,
        &NoEnv,
    )
    .unwrap();
    let b = m.services().find(|s| s.hostname == "b").unwrap();
    assert_eq!(
        b.load_balancing,
        Some(crate::LoadBalancing {
            routing_preference: vec![crate::Scope::Node],
            mode: crate::LbMode::Strict,
            allow_unhealthy: true,
        })
    );
}

#[test]
fn policy_fields() {
    let pol = |fields: &str| format!("policies:\n  - {{{fields}}}\n");
    assert_eq!(
        error(&pol("name: Allow_All, action: ALLOW")),
        "config.yaml: policies[0].name: \"Allow_All\" is not a valid policy name: contains \"A\" \
         (only lowercase letters, digits, \"-\" and \".\" are allowed)"
    );
    assert_eq!(
        error(&pol("name: p, namespace: Shop, action: ALLOW")),
        "config.yaml: policies[0].namespace: \"Shop\" is not a valid namespace: contains \"S\" \
         (only lowercase letters, digits and \"-\" are allowed)"
    );
    assert_eq!(
        error(&pol("name: p, action: PERMIT")),
        "config.yaml: policies[0].action: \"PERMIT\" is not one of \"ALLOW\", \"DENY\""
    );
    assert_eq!(
        error(&pol("name: p, action: DENY, selector: {workloads: []}")),
        "config.yaml: policies[0].selector.workloads: an empty list selects no workload (omit \
         `selector` to apply the policy to every workload in its scope)"
    );
    assert_eq!(
        error(&pol(
            "name: p, action: DENY, selector: {workloads: [web-0, '']}"
        )),
        "config.yaml: policies[0].selector.workloads[1]: must not be empty"
    );
    assert!(error(&pol(
        "name: p, action: DENY, selector: {matchLabels: {'app/': web}}"
    ))
    .starts_with("config.yaml: policies[0].selector.matchLabels: "));
    assert!(error(&pol(
        "name: p, action: DENY, selector: {matchLabels: {app: 'no spaces'}}"
    ))
    .starts_with("config.yaml: policies[0].selector.matchLabels[app]: "));
    let when = |c: &str| pol(&format!("name: p, action: DENY, rules: [{{when: [{c}]}}]"));
    assert_eq!(
        error(&when("{key: 'request.headers[x]', values: [a]}")),
        "config.yaml: policies[0].rules[0].when[0].key: \"request.headers[x]\" is not an L4 \
         attribute (source.ip, source.namespace, source.principal, destination.ip, destination.port)"
    );
    assert_eq!(
        error(&when("{key: source.ip}")),
        "config.yaml: policies[0].rules[0].when[0]: a condition needs `values` or `notValues`"
    );
    assert!(error(&when("{key: destination.port, values: ['0']}"))
        .starts_with("config.yaml: policies[0].rules[0].when[0].values[0]: "));
    assert!(error(&when("{key: source.ip, notValues: [10.0.0.0/33]}"))
        .starts_with("config.yaml: policies[0].rules[0].when[0].notValues[0]: "));
    assert!(error(&when("{key: source.principal, values: ['a*b']}"))
        .starts_with("config.yaml: policies[0].rules[0].when[0].values[0]: "));
    assert!(error(
        "trustDomainAliases: ['Not A Domain']
"
    )
    .starts_with("config.yaml: trustDomainAliases[0]: "));
    // The file cannot set mutual-TLS modes (they come from the cluster).
    assert!(error(
        "peerAuthentications: []
"
    )
    .contains("unknown field `peerAuthentications`"));
    // A policy without a namespace is a root-namespace policy: same name = duplicate.
    assert_eq!(
        error(
            "policies:\n  - {name: p, action: ALLOW}\n  - {name: q, namespace: shop, action: ALLOW}\n  - {name: p, namespace: ringway-system, action: DENY}\n"
        ),
        "config.yaml: policies[2].name: \"ringway-system/p\" is already defined by policies[0]"
    );
    assert_eq!(
        error(&with_source("{}")),
        "config.yaml: policies[0].rules[0].from[0]: a source needs at least one field (to match \
         any source, leave `from` out)"
    );
    assert_eq!(
        error(&with_source("{namespaces: []}")),
        "config.yaml: policies[0].rules[0].from[0]: a source needs at least one field (to match \
         any source, leave `from` out)"
    );
    assert_eq!(
        error(&with_to("{}")),
        "config.yaml: policies[0].rules[0].to[0]: a destination needs at least one field (to \
         match any port, leave `to` out)"
    );
}

#[test]
fn source_fields() {
    let from = |s: &str| error(&with_source(s));
    let at = "config.yaml: policies[0].rules[0].from[0]";
    assert_eq!(
        from("{ipBlocks: [10.0.0.0/8, 10.0.0.0/33]}"),
        format!("{at}.ipBlocks[1]: \"10.0.0.0/33\": prefix length 33 is longer than 32")
    );
    assert_eq!(
        from("{notIpBlocks: [\"fd00::/129\"]}"),
        format!("{at}.notIpBlocks[0]: \"fd00::/129\": prefix length 129 is longer than 128")
    );
    assert_eq!(
        from("{ipBlocks: [10.0.0.300/24]}"),
        format!("{at}.ipBlocks[0]: \"10.0.0.300/24\": \"10.0.0.300\" is not an IP address")
    );
    assert_eq!(
        from("{ipBlocks: [10.0.0.0/x]}"),
        format!("{at}.ipBlocks[0]: \"10.0.0.0/x\": \"x\" is not a prefix length")
    );
    assert_eq!(
        from("{ipBlocks: [10.1.2.3/16]}"),
        format!("{at}.ipBlocks[0]: \"10.1.2.3/16\": host bits are set (the block is 10.1.0.0/16)")
    );
    assert_eq!(
        from("{principals: [\"spiffe://cluster.local/ns/default\"]}"),
        format!(
            "{at}.principals[0]: \"spiffe://cluster.local/ns/default\" is not a principal: \
             expected spiffe://<trust domain>/ns/<namespace>/sa/<service account>"
        )
    );
    assert_eq!(
        from("{principals: [\"spiffe://cluster.local/ns/default/sa/\"]}"),
        format!(
            "{at}.principals[0]: \"spiffe://cluster.local/ns/default/sa/\" is not a principal: \
             service account: must not be empty"
        )
    );
    assert_eq!(
        from("{notPrincipals: [\"spiffe://Cluster/ns/a/sa/b\"]}"),
        format!(
            "{at}.notPrincipals[0]: \"spiffe://Cluster/ns/a/sa/b\" is not a principal: trust \
             domain: \"Cluster\" is not a valid trust domain: contains \"C\" (only lowercase \
             letters, digits, \".\", \"-\" and \"_\" are allowed)"
        )
    );
    assert_eq!(
        from("{principals: [\"cluster.local/*/sa/web\"]}"),
        format!(
            "{at}.principals[0]: \"cluster.local/*/sa/web\" is not a principal: \"*\" may appear \
             once, at the start or at the end"
        )
    );
    assert_eq!(
        from("{principals: [\"*/sa/*\"]}"),
        format!(
            "{at}.principals[0]: \"*/sa/*\" is not a principal: \"*\" may appear once, at the \
             start or at the end"
        )
    );
    assert_eq!(
        from("{principals: [\"*/sa/Web\"]}"),
        format!(
            "{at}.principals[0]: \"*/sa/Web\" is not a principal: contains \"W\"; expected \
             spiffe://<trust domain>/ns/<namespace>/sa/<service account>, \"*\", or a prefix or \
             suffix of one with \"*\" in place of the rest"
        )
    );
    assert_eq!(
        from("{principals: [\"\"]}"),
        format!("{at}.principals[0]: must not be empty")
    );
    assert_eq!(
        from("{namespaces: [Shop]}"),
        format!(
            "{at}.namespaces[0]: \"Shop\" is not a valid namespace: contains \"S\" (only \
             lowercase letters, digits and \"-\" are allowed)"
        )
    );
    assert_eq!(
        from("{notNamespaces: [\"prod_*\"]}"),
        format!(
            "{at}.notNamespaces[0]: \"prod_*\" is not a valid namespace pattern: contains \"_\" \
             (only lowercase letters, digits and \"-\" are allowed)"
        )
    );
    assert_eq!(
        from("{namespaces: [\"a*b\"]}"),
        format!("{at}.namespaces[0]: \"a*b\": \"*\" may appear once, at the start or at the end")
    );
    assert_eq!(
        from("{serviceAccounts: [web]}"),
        format!("{at}.serviceAccounts[0]: \"web\" is not <namespace>/<service account>")
    );
    assert_eq!(
        from("{notServiceAccounts: [\"shop/Web\"]}"),
        format!(
            "{at}.notServiceAccounts[0]: \"shop/Web\": \"Web\" is not a valid service account: \
             contains \"W\" (only lowercase letters, digits, \"-\" and \".\" are allowed)"
        )
    );
}

#[test]
fn destination_fields() {
    assert_eq!(
        error(&with_to("{ports: [80, 0]}")),
        "config.yaml: policies[0].rules[0].to[0].ports[1]: 0 is not a port (1..=65535)"
    );
    assert_eq!(
        error(&with_to("{notPorts: [70000]}")),
        "config.yaml: policies[0].rules[0].to[0].notPorts[0]: 70000 is not a port (1..=65535)"
    );
}

#[test]
fn valid_forms_are_accepted_and_normalized() {
    let yaml = with_workloads(
        "policies:
  - name: all
    action: allow
    rules: [{}]
  - name: p
    namespace: shop
    action: Deny
    rules:
      - from:
          - principals: [\"cluster.local/ns/shop/sa/web\", \"spiffe://td/ns/a/*\", \"*/sa/db\", \"*\"]
            namespaces: [\"*\", \"kube-*\", \"*-system\", shop]
            serviceAccounts: [shop/web]
            ipBlocks: [10.0.0.0/8, \"fd00::/8\", 192.168.1.1, \"::ffff:10.0.0.0/104\"]
        to:
          - {ports: [80, 65535], notPorts: [1]}
",
    );
    let mesh = MeshConfig::load_str(&yaml, ORIGIN, &NoEnv).unwrap();
    let [all, p] = mesh.policies().collect::<Vec<_>>()[..] else {
        panic!("two policies")
    };
    assert!(all.mesh_wide);
    assert_eq!(&**all.qualified_name(), "ringway-system/all");
    assert_eq!(all.action, crate::Action::Allow);
    assert_eq!(p.action, crate::Action::Deny);
    let src = &p.rules[0].from[0];
    let principals: Vec<String> = src.principals.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        principals,
        [
            "spiffe://cluster.local/ns/shop/sa/web",
            "spiffe://td/ns/a/*",
            "*/sa/db",
            "*"
        ]
    );
    let blocks: Vec<String> = src.ip_blocks.iter().map(|c| c.to_string()).collect();
    assert_eq!(
        blocks,
        ["10.0.0.0/8", "fd00::/8", "192.168.1.1/32", "10.0.0.0/8"]
    );
}

#[test]
fn indexes() {
    let yaml = with_workloads(
        "services:
  - {hostname: web.shop.svc.cluster.local, namespace: shop, vips: [10.96.0.1, \"fd00:96::1\"], ports: {80: 8080, 443: 8443}, endpoints: [w1, w2]}
policies:
  - {name: root, action: ALLOW, rules: [{}]}
  - {name: only-web, namespace: shop, action: DENY, selector: {workloads: [web-0]}}
  - {name: other, namespace: other, action: DENY}
",
    );
    let mesh = MeshConfig::load_str(&yaml, ORIGIN, &NoEnv).unwrap();
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(mesh.workload_by_ip(ip("10.0.0.2")).unwrap().uid, "w2");
    assert_eq!(
        mesh.workload_by_ip(ip("::ffff:10.0.0.1")).unwrap().uid,
        "w1"
    );
    assert_eq!(mesh.workload_by_ip(ip("fd00::1")).unwrap().uid, "w1");
    assert!(mesh.workload_by_ip(ip("10.0.0.3")).is_none());
    assert_eq!(mesh.workload_by_uid("w2").unwrap().name, "db-0");
    let svc = mesh.service_by_vip(ip("fd00:96::1")).unwrap();
    assert_eq!(svc.target_port(443), Some(8443));
    assert_eq!(svc.target_port(8080), None);
    let names: Vec<&str> = mesh.endpoints(svc).map(|(w, _)| w.name.as_str()).collect();
    assert_eq!(names, ["web-0", "db-0"]);
    let web = mesh.workload_by_uid("w1").unwrap();
    let db = mesh.workload_by_uid("w2").unwrap();
    let governing = |w| {
        mesh.policies_for(w)
            .map(|p| p.qualified_name().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(governing(web), ["ringway-system/root", "shop/only-web"]);
    assert_eq!(governing(db), ["ringway-system/root"]);
    assert_eq!(mesh.namespace_policies("other").count(), 1);
    assert_eq!(mesh.mesh_wide_policies().count(), 1);
    assert_eq!(
        web.identity(mesh.trust_domain()).to_string(),
        "spiffe://cluster.local/ns/shop/sa/web"
    );
}

#[test]
fn errors_compare_and_clone() {
    let a = MeshConfig::load_str("trustDomain: X\n", ORIGIN, &NoEnv).unwrap_err();
    assert_eq!(a.clone(), a);
    assert!(matches!(a, ConfigError::Field { ref path, .. } if path == "trustDomain"));
}
