//! `cargo bench -p ringway-benches -- --cni-add-ca`: what the certificate
//! service costs a pod's enrollment, in one run.
//!
//! The same CNI ADD path three times over `pods` fresh pod namespaces each
//! (the plugin's library entry over the node agent's socket, the agent in
//! this process, the proxy a child process that acks the pod over ZDS once
//! its listeners are open and, with HBONE on, its certificate is in hand or
//! 2 s have passed), each pod with a service account of its own, so every
//! ADD gets a certificate (the worst case: pods sharing a service account
//! share one certificate):
//! - `off`: no `ca:` (no HBONE, no certificate): the baseline;
//! - `local key`: `ca.certFile`/`ca.keyFile`, the proxy signs itself;
//! - `service`: `ca.address`, a `ringway ca` child process (the same
//!   `ringway::main`) signing from CSRs, authenticating every call with a
//!   TokenReview to a fake API server over HTTP in this process
//!   (`ringway_testbed::kube_api`).
//!
//! Then the CSR round trip as the proxy makes it (a P-256 key, a CSR, the
//! gRPC call over TLS, the chain checked), `csr_rounds` times in a row.
//! Prints p50/p90/p99/max of each; asserts nothing about the numbers, but
//! fails when a pod did not get its certificate.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use ringway_testbed::kube_api::{fixtures, FakeApiServer, FakePod};
use ringway_testbed::{Netns, TempDir};

use crate::bed::TRUST_DOMAIN;
use crate::child::{ProxyArgs, ProxyChild};
use crate::host::progress;
use crate::stat::quantiles;

pub(crate) const CA_NAME: &str = "ringway-ca.ringway-system.svc";
pub(crate) const CA_ADDR: &str = "127.0.0.1:15012";
pub(crate) const CA_METRICS: &str = "127.0.0.1:15014";
const PROXY_POD: &str = "proxy-node1";
const TOKEN: &str = "bench-node1-proxy-token";

/// How many pods and CSRs.
#[derive(Debug, Clone)]
pub struct CniCaConfig {
    /// Pods per mode.
    pub pods: usize,
    /// CSR round trips measured.
    pub csr_rounds: usize,
}

impl CniCaConfig {
    /// 200 pods per mode, 200 CSRs.
    pub fn full() -> CniCaConfig {
        CniCaConfig {
            pods: 200,
            csr_rounds: 200,
        }
    }

    /// 20 and 20.
    pub fn quick() -> CniCaConfig {
        CniCaConfig {
            pods: 20,
            csr_rounds: 20,
        }
    }

    /// `RINGWAY_BENCH_CNI_CA_PODS`, `RINGWAY_BENCH_CSR_ROUNDS`.
    pub fn with_env_overrides(mut self) -> CniCaConfig {
        let get = |k: &str| std::env::var(k).ok().and_then(|v| v.parse().ok());
        if let Some(n) = get("RINGWAY_BENCH_CNI_CA_PODS") {
            self.pods = n;
        }
        if let Some(n) = get("RINGWAY_BENCH_CSR_ROUNDS") {
            self.csr_rounds = n;
        }
        self
    }
}

/// Runs the measurement (in the caller's isolated namespaces); returns the
/// report lines (Markdown).
pub fn run(cfg: &CniCaConfig, bin: &Path) -> anyhow::Result<String> {
    if cfg.pods == 0 || cfg.csr_rounds == 0 {
        bail!("nothing to measure: {cfg:?}");
    }
    let dir = TempDir::new("bench-cni-ca");
    let root = dir.path().to_path_buf();
    // The local-key mode's CA.
    let local = root.join("local");
    std::fs::create_dir_all(&local)?;
    ringway_identity::CaSigner::generate_for_tests(TRUST_DOMAIN)
        .write_pem_files(&local.join("ca.crt"), &local.join("ca.key"))?;
    // The service's root (only `ringway ca` reads the key), its serving
    // certificate, and the public root the proxy gets.
    let secret = root.join("ca-secret");
    std::fs::create_dir_all(&secret)?;
    let signer = ringway_identity::CaSigner::generate_for_tests(TRUST_DOMAIN);
    signer.write_pem_files(&secret.join("root.crt"), &secret.join("root.key"))?;
    signer
        .issue_dns_for_tests(CA_NAME)
        .write_pem_files(&secret.join("tls.crt"), &secret.join("tls.key"))?;
    let public_root = root.join("mesh-root.crt");
    std::fs::write(&public_root, signer.cert_pem())?;
    drop(signer);
    let token_file = root.join("node1.token");
    std::fs::write(&token_file, TOKEN)?;

    // The fake API server: the node proxy's token and pod, and every pod of
    // the service mode, for TokenReview and the CA's pod watch.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let api_addr = listener.local_addr()?;
    let api = FakeApiServer::serve_http(rt.handle(), listener)?;
    let kubeconfig = root.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{api_addr}\nusers:\n- name: ca\n  user:\n    token: bench-ca-token\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: ca\ncurrent-context: fake\n"
        ),
    )?;
    api.apply_pod(
        FakePod::new("uid-proxy-node1", "ringway-system", PROXY_POD, "node1")
            .service_account("ringway-proxy")
            .running(&[])
            .json(),
    );
    api.add_token(
        TOKEN,
        fixtures::service_account_user(
            "ringway-system",
            "ringway-proxy",
            Some((PROXY_POD, "uid-proxy-node1", "node1")),
        ),
        &["istio-ca"],
    );

    let mut out = String::new();
    out.push_str(&format!(
        "CNI ADD latency, {} pods per mode, one service account each (every ADD gets a certificate), the modes' ADDs interleaved:\n\n| mode | p50 ms | p90 ms | p99 ms | max ms | certificates in hand |\n| --- | --- | --- | --- | --- | --- |\n",
        cfg.pods
    ));
    // The service mode's pods, as the API server (and so the CA) sees them.
    for i in 0..cfg.pods {
        api.apply_pod(
            FakePod::new(
                &format!("uid-cnisvc-{i}"),
                "bench",
                &format!("cnisvc-{i}"),
                "node1",
            )
            .service_account(&format!("sa-{i}"))
            .running(&[])
            .json(),
        );
    }
    // One node enrolling pods back to back: above the default 20/s of
    // one caller, which would refuse some and leave them to the refresher
    // (the ADD would then not wait for their certificate).
    let mut ca = start_ca(bin, &kubeconfig, &secret, &["--rate-per-caller", "1000"])?;
    let mut modes = Vec::new();
    for (k, (mode, tag)) in [("off", "off"), ("local key", "local"), ("service", "svc")]
        .into_iter()
        .enumerate()
    {
        let pods = (0..cfg.pods)
            .map(|i| Netns::create(&format!("cni{tag}-{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        let yaml = match mode {
            "off" => "{}\n".to_string(),
            "local key" => format!(
                "trustDomain: {TRUST_DOMAIN}\nca:\n  certFile: \"{}\"\n  keyFile: \"{}\"\n",
                local.join("ca.crt").display(),
                local.join("ca.key").display()
            ),
            _ => format!(
                "trustDomain: {TRUST_DOMAIN}\nca:\n  address: \"{CA_ADDR}\"\n  serverName: {CA_NAME}\n  rootCertFile: \"{}\"\n  tokenFile: \"{}\"\n",
                public_root.display(),
                token_file.display()
            ),
        };
        let config = root.join(format!("{tag}.yaml"));
        std::fs::write(&config, yaml)?;
        let node = Node::start(
            &root.join(format!("agent-{tag}")),
            bin,
            &config,
            &pods,
            Ipv4Addr::new(127, 0, 0, 2 + k as u8),
        )?;
        modes.push((mode, pods, node, Vec::with_capacity(cfg.pods)));
    }
    progress(format!(
        "CNI ADD: {} pods in each of off, local key, service, interleaved",
        cfg.pods
    ));
    // Round robin: whatever else loads the machine loads every mode alike.
    for i in 0..cfg.pods {
        for (mode, pods, node, lat) in modes.iter_mut() {
            let took = crate::bed::cni_add(&node.dir.join("cni.sock"), &pods[i], i)
                .with_context(|| format!("{mode}: CNI ADD of pod {i}"))?;
            lat.push(took.as_secs_f64() * 1e3);
        }
    }
    for (mode, pods, node, lat) in modes {
        let certs = node.stop()?;
        let [p50, p90, p99, max] = quantiles(lat);
        let in_hand = match mode {
            "off" => "-".to_string(),
            _ => format!("{certs}/{}", pods.len()),
        };
        if mode != "off" && certs != pods.len() {
            bail!(
                "{mode}: {certs} certificates in hand after {} ADDs",
                pods.len()
            );
        }
        out.push_str(&format!(
            "| {mode} | {p50:.1} | {p90:.1} | {p99:.1} | {max:.1} | {in_hand} |\n"
        ));
    }
    let csr = csr_round_trips(&public_root, &token_file, cfg.csr_rounds)?;
    let [p50, p90, p99, max] = quantiles(csr);
    out.push_str(&format!(
        "\nCSR round trip (a P-256 key, a CSR, the gRPC call over TLS, the caller authenticated by TokenReview, the chain checked), {} in a row: p50 {p50:.2} ms, p90 {p90:.2} ms, p99 {p99:.2} ms, max {max:.2} ms\n",
        cfg.csr_rounds
    ));
    let metrics =
        crate::bed::scrape(CA_METRICS.parse()?).context("the certificate service's metrics")?;
    let refused: Vec<_> = metrics
        .matching("ringway_ca_requests_total", &[])
        .filter(|s| s.label("code") != Some("ok") && s.value > 0.0)
        .map(|s| s.to_string())
        .collect();
    if !refused.is_empty() {
        bail!(
            "the certificate service refused requests:\n{}",
            refused.join("\n")
        );
    }
    let reviews = |outcome: &str| {
        metrics.get(
            "ringway_ca_token_reviews_total",
            &[&format!("outcome=\"{outcome}\"")],
        )
    };
    match (reviews("reviewed"), reviews("cached")) {
        (None, None) => out.push_str(
            "\nToken reviews: not counted by this `ringway ca` (no ringway_ca_token_reviews_total)\n",
        ),
        (made, cached) => out.push_str(&format!(
            "\nToken reviews: {} made to the API server for {} calls (the rest answered from the CA's review cache)\n",
            made.unwrap_or(0.0),
            made.unwrap_or(0.0) + cached.unwrap_or(0.0)
        )),
    }
    ca.stop();
    drop(rt);
    Ok(out)
}

/// `ringway ca` (the same `ringway::main` as the proxy child) with the
/// root and serving certificate in `secret` and `extra` flags, ready.
pub(crate) fn start_ca(
    bin: &Path,
    kubeconfig: &Path,
    secret: &Path,
    extra: &[&str],
) -> anyhow::Result<ProxyChild> {
    let mut cmd = Command::new(bin);
    cmd.env_clear()
        .env("KUBECONFIG", kubeconfig)
        .env("RINGWAY_LOG", "info")
        .env("RINGWAY_LOG_FORMAT", "text")
        .args(["ca", "--listen", CA_ADDR, "--metrics-addr", CA_METRICS])
        .arg("--tls-cert")
        .arg(secret.join("tls.crt"))
        .arg("--tls-key")
        .arg(secret.join("tls.key"))
        .arg("--root-cert")
        .arg(secret.join("root.crt"))
        .arg("--root-key")
        .arg(secret.join("root.key"))
        .args(extra);
    let ca = ProxyChild::spawn(
        cmd,
        Some("certificate service serving"),
        Duration::from_secs(20),
    )?;
    let t = Instant::now();
    let addr: SocketAddr = CA_METRICS.parse()?;
    while !ringway_testbed::http::get(addr, "/healthz/ready").is_ok_and(|r| r.status == 200) {
        if t.elapsed() > Duration::from_secs(20) {
            bail!("ringway ca never became ready: {}", ca.log_tail());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(ca)
}

/// One mode's node: an agent in this process (each pod with a service
/// account of its own) and a proxy child with `config`.
struct Node {
    dir: PathBuf,
    agent: ringway_cni::node::AgentHandle,
    proxy: ProxyChild,
    host: Ipv4Addr,
}

impl Node {
    fn start(
        dir: &Path,
        bin: &Path,
        config: &Path,
        pods: &[Netns],
        host: Ipv4Addr,
    ) -> anyhow::Result<Node> {
        std::fs::create_dir_all(dir)?;
        let settings = ringway_config::ProxySettings::default();
        let mut accounts = Vec::with_capacity(pods.len());
        for (i, p) in pods.iter().enumerate() {
            accounts.push(format!("bench/{}=sa-{i}", p.name()).parse()?);
        }
        let agent = ringway_cni::node::NodeAgent::start(ringway_cni::node::AgentConfig {
            zds_socket: dir.join("zds.sock"),
            cni_socket: dir.join("cni.sock"),
            capture: ringway_proxy::capture_spec(&settings),
            netns_dirs: vec![],
            proc_root: dir.to_path_buf(),
            node_name: "node1".into(),
            reconcile_interval: Duration::from_secs(3600),
            service_accounts: accounts,
            ..ringway_cni::node::AgentConfig::default()
        })
        .context("starting the node agent")?;
        let mut args = ProxyArgs::pods(&[]);
        args.zds_socket = Some(dir.join("zds.sock"));
        args.config = Some(config.to_path_buf());
        args.control_host = host;
        let proxy = crate::bed::start_proxy_for_agent(bin, &args, &agent)?;
        Ok(Node {
            dir: dir.to_path_buf(),
            agent,
            proxy,
            host,
        })
    }

    /// Stops both; returns how many certificates the proxy held.
    fn stop(mut self) -> anyhow::Result<usize> {
        let certs = certificates_held(SocketAddr::new(self.host.into(), 15020));
        if !self.proxy.alive() {
            bail!("the proxy exited: {}", self.proxy.log_tail());
        }
        self.proxy.stop();
        self.agent.shutdown();
        certs
    }
}

/// How many certificates the proxy whose `/metrics` is at `metrics` holds
/// (its `ringway_certificate_expiry_timestamp_seconds` series).
/// An error naming the endpoint when it cannot be scraped, never 0.
pub(crate) fn certificates_held(metrics: SocketAddr) -> anyhow::Result<usize> {
    Ok(crate::bed::scrape(metrics)?
        .matching("ringway_certificate_expiry_timestamp_seconds", &[])
        .count())
}

/// `rounds` CSR round trips as the proxy makes them, for the identity of
/// the service mode's first pod; each in ms.
fn csr_round_trips(root: &Path, token_file: &Path, rounds: usize) -> anyhow::Result<Vec<f64>> {
    use ringway_identity::CertSource;
    let bundle = ringway_identity::TrustBundle::from_pem_files(&[root])?;
    let tls = ringway_ca::CaClient::tls_config(bundle.roots())
        .map_err(|e| anyhow::anyhow!("the certificate service's TLS: {e}"))?;
    let source = ringway_ca::client::RemoteSource::new(
        ringway_ca::CaClient::new(
            CA_ADDR.parse()?,
            rustls_pki_types::ServerName::try_from(CA_NAME)?,
            tls,
        ),
        token_file,
    )?;
    let id = ringway_identity::parse_spiffe(
        &format!("spiffe://{TRUST_DOMAIN}/ns/bench/sa/sa-0"),
        TRUST_DOMAIN,
    )?;
    let mut took = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let now = SystemTime::now();
        let t0 = Instant::now();
        source
            .issue(&id, now, now + Duration::from_secs(3600))
            .map_err(|e| anyhow::anyhow!("a measured CSR was refused: {e}"))?;
        took.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// Answers one request on `l` with `answer`.
    fn answer_once(l: TcpListener, answer: &'static str) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(answer.as_bytes()).unwrap();
        })
    }

    /// A proxy whose `/metrics` is down, or answers an error, is an error
    /// that names the endpoint, never "0 certificates"; a page is counted.
    #[test]
    fn certificates_held_fails_naming_the_endpoint_when_it_is_down() {
        ringway_testbed::run_isolated(
            "certificates_held_fails_naming_the_endpoint_when_it_is_down",
            || {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let down = l.local_addr().unwrap();
                drop(l);
                let e = certificates_held(down).expect_err("a down endpoint is an error");
                assert!(format!("{e:#}").contains(&down.to_string()), "{e:#}");

                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let erring = l.local_addr().unwrap();
                let server = answer_once(
                    l,
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\ndown",
                );
                let e = certificates_held(erring).expect_err("a 503 is an error");
                server.join().unwrap();
                assert!(format!("{e:#}").contains(&erring.to_string()), "{e:#}");

                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let up = l.local_addr().unwrap();
                let server = answer_once(
                    l,
                    "HTTP/1.1 200 OK\r\n\r\n\
                     # TYPE ringway_certificate_expiry_timestamp_seconds gauge\n\
                     ringway_certificate_expiry_timestamp_seconds{identity=\"spiffe://a\"} 1.8e9\n\
                     ringway_certificate_expiry_timestamp_seconds{identity=\"spiffe://b\"} 1.8e9\n\
                     ringway_other 1\n",
                );
                assert_eq!(certificates_held(up).unwrap(), 2);
                server.join().unwrap();
            },
        );
    }
}
