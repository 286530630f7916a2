//! `cargo bench -p ringway-benches -- --ca-flood [--quick]`: the certificate
//! service's renewals while one source floods its port before
//! authentication (issue 23, 3), in one run.
//!
//! `ringway ca` runs as a child process (the same `ringway::main`) with its
//! default limits, reviewing tokens and watching pods through a fake API
//! server over HTTP in this process (`ringway_testbed::kube_api`), as
//! `cni_ca` does. Two node proxies (`proxy-node1`, `proxy-node2`, each with
//! its own bound token) renew their pods' certificates the way a proxy does
//! (a P-256 key, a CSR, the gRPC call over TLS with `ImpersonatedIdentity`,
//! the chain checked: `ringway_ca::client::RemoteSource`), each one every
//! `renew_every`, first quiet for `secs`, then for `secs` while an attacker
//! in this process, on a source address of its own (127.0.0.66), tries to
//! hold `idle_conns` idle HTTP/2 connections (TLS and preface done, no
//! stream; each refused or closed one is opened again after `idle_retry`)
//! and sends junk-token calls on `junk_conns` connections, `junk_streams`
//! at a time on each, as fast as they are answered (every other call with
//! one repeated junk token, the others with a new token each).
//!
//! Reported, never asserted: the renewals' p50/p90/p99/max quiet and under
//! the flood, failed renewals, the CA's RSS (before, peak, after) and CPU,
//! what the attacker got (connections held at most, refused, closed by the
//! CA; junk calls by status) and what the CA counted
//! (`ringway_ca_connections_refused_total{reason}`,
//! `ringway_ca_requests_total{code,reason}`), and the TokenReviews the
//! flood cost the API server. Everything stops by itself: the attack and
//! the renewals run until their deadline.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use prost::Message;
use ringway_testbed::kube_api::{fixtures, FakeApiServer, FakePod};
use ringway_testbed::prom::Sample;
use ringway_testbed::TempDir;

use crate::bed::TRUST_DOMAIN;
use crate::cni_ca::{start_ca, CA_ADDR, CA_METRICS, CA_NAME};
use crate::host::progress;
use crate::stat::quantiles;

/// The attacker's source address (on the namespace's `lo`).
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 66);

/// How big a run is.
#[derive(Debug, Clone)]
pub struct CaFloodConfig {
    /// "full", "quick" or "tiny (test)".
    pub label: String,
    /// Seconds of each phase (quiet, flood).
    pub secs: f64,
    /// Idle HTTP/2 connections the attacker tries to hold.
    pub idle_conns: usize,
    /// How long an idle holder waits before it opens a refused or closed
    /// connection again.
    pub idle_retry: Duration,
    /// Connections carrying junk calls.
    pub junk_conns: usize,
    /// Junk calls in flight at once on each of them.
    pub junk_streams: usize,
    /// Each node proxy renews this often (a call that takes longer is
    /// followed by the next at once).
    pub renew_every: Duration,
}

impl CaFloodConfig {
    /// 20 s per phase, 4,096 idle connections.
    pub fn full() -> CaFloodConfig {
        CaFloodConfig {
            label: "full".into(),
            secs: 20.0,
            idle_conns: 4096,
            idle_retry: Duration::from_secs(1),
            junk_conns: 32,
            junk_streams: 8,
            renew_every: Duration::from_millis(100),
        }
    }

    /// 5 s per phase, the same flood.
    pub fn quick() -> CaFloodConfig {
        CaFloodConfig {
            label: "quick".into(),
            secs: 5.0,
            ..CaFloodConfig::full()
        }
    }

    /// The CI-sized run (`benches/tests/it/ca_flood_report.rs`).
    pub fn tiny() -> CaFloodConfig {
        CaFloodConfig {
            label: "tiny (test)".into(),
            secs: 1.0,
            idle_conns: 200,
            idle_retry: Duration::from_millis(200),
            junk_conns: 2,
            junk_streams: 2,
            renew_every: Duration::from_millis(100),
        }
    }

    /// `RINGWAY_BENCH_SECS`, `RINGWAY_BENCH_CA_FLOOD_CONNS`.
    pub fn with_env_overrides(mut self) -> CaFloodConfig {
        let get = |k: &str| std::env::var(k).ok();
        if let Some(s) = get("RINGWAY_BENCH_SECS").and_then(|v| v.parse().ok()) {
            self.secs = s;
        }
        if let Some(n) = get("RINGWAY_BENCH_CA_FLOOD_CONNS").and_then(|v| v.parse().ok()) {
            self.idle_conns = n;
        }
        self
    }
}

/// What the attacker got.
#[derive(Debug, Default)]
struct AttackStats {
    attempts: AtomicU64,
    /// Refused: reset at accept, or closed during TLS or the preface.
    refused: AtomicU64,
    held: AtomicUsize,
    held_max: AtomicUsize,
    /// Held, then closed by the CA.
    closed: AtomicU64,
    /// Junk calls answered, by gRPC status code.
    answered: [AtomicU64; 17],
    /// Junk calls that got no status (the connection went).
    call_errors: AtomicU64,
}

impl AttackStats {
    fn answered(&self, code: ringway_ca::Code) -> u64 {
        self.answered[code.as_u32() as usize].load(Ordering::Relaxed)
    }
}

/// A TLS + HTTP/2 connection from the attacker's address; the task
/// driving it ends when the connection does.
async fn connect(
    tls: &Arc<rustls::ClientConfig>,
) -> Result<
    (
        h2::client::SendRequest<bytes::Bytes>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let ca: SocketAddr = CA_ADDR.parse().map_err(|e| format!("{e}"))?;
    let sock = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
    sock.bind(SocketAddr::new(IpAddr::V4(ATTACKER), 0))
        .map_err(|e| e.to_string())?;
    let tcp = sock.connect(ca).await.map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from(CA_NAME).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(tls.clone())
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (send, conn) = h2::client::handshake(tls)
        .await
        .map_err(|e| e.to_string())?;
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    let send = send.ready().await.map_err(|e| e.to_string())?;
    Ok((send, task))
}

/// Holds one idle connection at a time until `until`.
async fn idle_holder(
    tls: Arc<rustls::ClientConfig>,
    stats: Arc<AttackStats>,
    until: tokio::time::Instant,
    retry: Duration,
) {
    while tokio::time::Instant::now() < until {
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout_at(until, connect(&tls)).await {
            Err(_) => return,
            Ok(Err(_)) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Ok((send, conn))) => {
                let now = stats.held.fetch_add(1, Ordering::Relaxed) + 1;
                stats.held_max.fetch_max(now, Ordering::Relaxed);
                let ended = tokio::time::timeout_at(until, conn).await;
                stats.held.fetch_sub(1, Ordering::Relaxed);
                drop(send);
                if ended.is_err() {
                    return;
                }
                stats.closed.fetch_add(1, Ordering::Relaxed);
            }
        }
        let _ = tokio::time::timeout_at(until, tokio::time::sleep(retry)).await;
    }
}

/// One junk call; its gRPC status, `None` when the connection failed.
async fn junk_call(
    send: &mut h2::client::SendRequest<bytes::Bytes>,
    token: &str,
    body: &bytes::Bytes,
) -> Option<u32> {
    let req = http::Request::post(format!(
        "https://{CA_NAME}/istio.v1.auth.IstioCertificateService/CreateCertificate"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("authorization", format!("Bearer {token}"))
    .body(())
    .ok()?;
    let mut ready = send.clone().ready().await.ok()?;
    let (resp, mut stream) = ready.send_request(req, false).ok()?;
    stream.send_data(body.clone(), true).ok()?;
    let resp = resp.await.ok()?;
    let code = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u32>().ok())
    };
    if let Some(c) = code(resp.headers()) {
        return Some(c);
    }
    let mut body = resp.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.ok()?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    code(&body.trailers().await.ok()??)
}

/// Junk calls on one connection, `streams` at a time, until `until`
/// (another connection when the CA closes it).
async fn junk_sender(
    tls: Arc<rustls::ClientConfig>,
    stats: Arc<AttackStats>,
    until: tokio::time::Instant,
    id: usize,
    streams: usize,
    body: bytes::Bytes,
) {
    let mut n = 0u64;
    while tokio::time::Instant::now() < until {
        stats.attempts.fetch_add(1, Ordering::Relaxed);
        let send = match tokio::time::timeout_at(until, connect(&tls)).await {
            Err(_) => return,
            Ok(Err(_)) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                let _ =
                    tokio::time::timeout_at(until, tokio::time::sleep(Duration::from_millis(10)))
                        .await;
                continue;
            }
            Ok(Ok((send, _conn))) => send,
        };
        let mut lanes = tokio::task::JoinSet::new();
        for lane in 0..streams {
            let (mut send, stats, body) = (send.clone(), stats.clone(), body.clone());
            let base = n + lane as u64 * 1_000_000_000;
            lanes.spawn(async move {
                let mut k = 0u64;
                while tokio::time::Instant::now() < until {
                    k += 1;
                    let token = if k.is_multiple_of(2) {
                        "junk-repeated-token".to_owned()
                    } else {
                        format!("junk-{id}-{}", base + k)
                    };
                    match tokio::time::timeout_at(until, junk_call(&mut send, &token, &body)).await
                    {
                        Err(_) => return k,
                        Ok(Some(code)) => {
                            stats.answered[(code as usize).min(16)].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(None) => {
                            stats.call_errors.fetch_add(1, Ordering::Relaxed);
                            return k;
                        }
                    }
                }
                k
            });
        }
        while let Some(k) = lanes.join_next().await {
            n += k.unwrap_or(0);
        }
    }
}

/// The attack on a thread of its own (a current-thread runtime), until
/// `secs` have passed.
fn attack(
    cfg: &CaFloodConfig,
    tls: Arc<rustls::ClientConfig>,
    body: bytes::Bytes,
    secs: f64,
) -> (std::thread::JoinHandle<()>, Arc<AttackStats>) {
    let stats = Arc::new(AttackStats::default());
    let cfg = cfg.clone();
    let s = stats.clone();
    let thread = std::thread::Builder::new()
        .name("ca-flood".into())
        .spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let until = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
                let mut tasks = tokio::task::JoinSet::new();
                for id in 0..cfg.junk_conns {
                    tasks.spawn(junk_sender(
                        tls.clone(),
                        s.clone(),
                        until,
                        id,
                        cfg.junk_streams,
                        body.clone(),
                    ));
                }
                for _ in 0..cfg.idle_conns {
                    tasks.spawn(idle_holder(tls.clone(), s.clone(), until, cfg.idle_retry));
                }
                while tasks.join_next().await.is_some() {}
            });
            // Dropping the runtime closes every connection still open.
        })
        .expect("spawning the flood thread");
    (thread, stats)
}

/// One node proxy renewing `id` every `every` until `until`: the round
/// trips (ms) and the failures.
fn renew(
    source: &ringway_ca::client::RemoteSource,
    id: &ringway_identity::Identity,
    until: Instant,
    every: Duration,
) -> (Vec<f64>, Vec<String>) {
    use ringway_identity::CertSource;
    let (mut took, mut failed) = (Vec::new(), Vec::new());
    let mut next = Instant::now();
    while Instant::now() < until {
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        }
        next += every;
        let t0 = Instant::now();
        let wall = SystemTime::now();
        match source.issue(id, wall, wall + Duration::from_secs(3600)) {
            Ok(_) => took.push(t0.elapsed().as_secs_f64() * 1e3),
            Err(e) => failed.push(e.to_string()),
        }
    }
    (took, failed)
}

/// Both node proxies renewing for `secs` (on threads of their own), while
/// the CA's RSS is sampled: the round trips, the failures, the peak RSS
/// (KiB).
fn renewals(
    sources: &[(ringway_ca::client::RemoteSource, ringway_identity::Identity)],
    secs: f64,
    every: Duration,
    ca_pid: u32,
) -> (Vec<f64>, Vec<String>, f64) {
    let until = Instant::now() + Duration::from_secs_f64(secs);
    std::thread::scope(|s| {
        let workers: Vec<_> = sources
            .iter()
            .map(|(src, id)| s.spawn(move || renew(src, id, until, every)))
            .collect();
        let mut peak = 0f64;
        while Instant::now() < until {
            peak = peak.max(crate::child::proc_rss_kib(ca_pid));
            std::thread::sleep(Duration::from_millis(100));
        }
        let (mut took, mut failed) = (Vec::new(), Vec::new());
        for w in workers {
            if let Ok((t, f)) = w.join() {
                took.extend(t);
                failed.extend(f);
            }
        }
        peak = peak.max(crate::child::proc_rss_kib(ca_pid));
        (took, failed, peak)
    })
}

/// `TcpExt` counters of this network namespace (`/proc/self/net/netstat`):
/// `ListenOverflows` and `ListenDrops` (SYNs and handshakes dropped
/// because a listener's accept queue was full).
fn listen_drops() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/net/netstat").unwrap_or_default();
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return (0, 0);
    };
    let get = |want: &str| {
        names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == want)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    };
    (get("ListenOverflows"), get("ListenDrops"))
}

/// Runs the measurement (in the caller's isolated namespace); returns the
/// report lines (Markdown).
pub fn run(cfg: &CaFloodConfig, bin: &Path) -> anyhow::Result<String> {
    if cfg.secs <= 0.0 {
        bail!("nothing to measure: {cfg:?}");
    }
    // The attacker's connections and the ones the CA resets.
    let fds = crate::host::raise_nofile(4 * cfg.idle_conns as u64 + 4096);
    let dir = TempDir::new("bench-ca-flood");
    let root = dir.path().to_path_buf();
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
    let bundle = ringway_identity::TrustBundle::from_pem_files(&[&public_root])?;
    let tls = ringway_ca::CaClient::tls_config(bundle.roots())
        .map_err(|e| anyhow::anyhow!("the certificate service's TLS: {e}"))?;
    let mut sources = Vec::new();
    for n in [1, 2] {
        let (proxy_pod, node) = (format!("proxy-node{n}"), format!("node{n}"));
        let uid = format!("uid-{proxy_pod}");
        api.apply_pod(
            FakePod::new(&uid, "ringway-system", &proxy_pod, &node)
                .service_account("ringway-proxy")
                .running(&[])
                .json(),
        );
        api.apply_pod(
            FakePod::new(&format!("uid-app-{n}"), "bench", &format!("app-{n}"), &node)
                .service_account(&format!("app-{n}"))
                .running(&[])
                .json(),
        );
        let token = format!("bench-{proxy_pod}-token");
        api.add_token(
            &token,
            fixtures::service_account_user(
                "ringway-system",
                "ringway-proxy",
                Some((&proxy_pod, &uid, &node)),
            ),
            &["istio-ca"],
        );
        let token_file = root.join(format!("{proxy_pod}.token"));
        std::fs::write(&token_file, &token)?;
        let source = ringway_ca::client::RemoteSource::new(
            ringway_ca::CaClient::new(
                CA_ADDR.parse()?,
                rustls_pki_types::ServerName::try_from(CA_NAME)?,
                tls.clone(),
            ),
            &token_file,
        )?;
        let id = ringway_identity::parse_spiffe(
            &format!("spiffe://{TRUST_DOMAIN}/ns/bench/sa/app-{n}"),
            TRUST_DOMAIN,
        )?;
        sources.push((source, id));
    }
    // A request as a proxy sends it, for the junk calls.
    let csr = {
        let key = rcgen::KeyPair::generate()?;
        rcgen::CertificateParams::default()
            .serialize_request(&key)?
            .pem()?
    };
    let junk_body = ringway_ca::grpc::encode_frame(
        &ringway_ca::proto::IstioCertificateRequest {
            csr,
            validity_duration: 3600,
            metadata: None,
        }
        .with_impersonation(&format!("spiffe://{TRUST_DOMAIN}/ns/kube-system/sa/admin"))
        .encode_to_vec(),
    );

    let mut ca = start_ca(bin, &kubeconfig, &secret, &[])?;
    let pid = ca.pid;
    let rss_mib = |kib: f64| kib / 1024.0;

    // Warm up: each proxy's token reviewed once (known), its first
    // certificate issued.
    renewals(&sources, 0.5, cfg.renew_every, pid);
    let rss_before = crate::child::proc_rss_kib(pid);
    progress(format!("ca-flood: quiet renewals for {} s", cfg.secs));
    let cpu0 = ca.cpu_seconds();
    let (quiet, quiet_failed, quiet_peak) = renewals(&sources, cfg.secs, cfg.renew_every, pid);
    let quiet_cpu = ca.cpu_seconds() - cpu0;

    progress(format!(
        "ca-flood: {} idle connections and {}x{} junk streams from {ATTACKER}, renewals for {} s",
        cfg.idle_conns, cfg.junk_conns, cfg.junk_streams, cfg.secs
    ));
    let reviews0 = api.token_reviews();
    let drops0 = listen_drops();
    // The flood starts a second before the renewals and ends with them.
    let ramp = 1.0;
    let (attacker, stats) = attack(cfg, tls.clone(), junk_body, cfg.secs + ramp);
    std::thread::sleep(Duration::from_secs_f64(ramp));
    let cpu0 = ca.cpu_seconds();
    let (flood, flood_failed, flood_peak) = renewals(&sources, cfg.secs, cfg.renew_every, pid);
    let flood_cpu = ca.cpu_seconds() - cpu0;
    let _ = attacker.join();
    let reviews = api.token_reviews() - reviews0;
    let drops = listen_drops();
    let (overflows, drops) = (drops.0 - drops0.0, drops.1 - drops0.1);
    // The CA lets go of what the attacker held.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = crate::child::proc_rss_kib(pid);
    let metrics = crate::bed::scrape(CA_METRICS.parse()?);
    if !ca.alive() {
        bail!("ringway ca exited: {}", ca.log_tail());
    }
    ca.stop();
    let metrics = metrics.context("the certificate service's metrics")?;
    drop(rt);

    let mut out = format!(
        "Certificate service under a junk flood ({}): `ringway ca` with its default limits; two node proxies renewing (each a CSR round trip every {} ms: a P-256 key, a CSR, gRPC over TLS, the pod's identity through ImpersonatedIdentity, the chain checked), {} s quiet, then {} s while one source ({ATTACKER}) tries to hold {} idle HTTP/2 connections (reopening each refused or closed one after {} ms) and sends junk-token calls on {} connections, {} at a time on each, as fast as they are answered (every other call one repeated junk token, the others a new token each). RLIMIT_NOFILE {}.\n\n| phase | renewals | failed | p50 ms | p90 ms | p99 ms | max ms | CA RSS peak MiB | CA CPU s |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        cfg.label,
        cfg.renew_every.as_millis(),
        cfg.secs,
        cfg.secs,
        cfg.idle_conns,
        cfg.idle_retry.as_millis(),
        cfg.junk_conns,
        cfg.junk_streams,
        fds.soft,
    );
    for (phase, took, failed, peak, cpu) in [
        ("quiet", quiet, &quiet_failed, quiet_peak, quiet_cpu),
        ("flood", flood, &flood_failed, flood_peak, flood_cpu),
    ] {
        let n = took.len();
        let [p50, p90, p99, max] = quantiles(took);
        out.push_str(&format!(
            "| {phase} | {n} | {} | {p50:.2} | {p90:.2} | {p99:.2} | {max:.2} | {:.1} | {cpu:.2} |\n",
            failed.len(),
            rss_mib(peak)
        ));
    }
    use ringway_ca::Code;
    let by = |name: &str, label: &dyn Fn(&Sample) -> String| -> Vec<String> {
        metrics
            .matching(name, &[])
            .map(|s| format!("{} {}", label(s), s.value))
            .collect()
    };
    let refused_by = by("ringway_ca_connections_refused_total", &|s| {
        s.label("reason").unwrap_or("?").to_string()
    });
    let calls_by = by("ringway_ca_requests_total", &|s| {
        format!(
            "{}/{}",
            s.label("code").unwrap_or("?"),
            s.label("reason").unwrap_or("?")
        )
    });
    let reviews_by = by("ringway_ca_token_reviews_total", &|s| {
        s.label("outcome").unwrap_or("?").to_string()
    });
    let a = &stats;
    out.push_str(&format!(
        "\nThe attacker: {} connection attempts, {} refused (reset at accept or closed in the handshake), at most {} held at once, {} closed by the CA after being held; {} junk calls answered ({} UNAUTHENTICATED, {} RESOURCE_EXHAUSTED, {} other), {} without an answer (their connection was closed or reset).\n",
        a.attempts.load(Ordering::Relaxed),
        a.refused.load(Ordering::Relaxed),
        a.held_max.load(Ordering::Relaxed),
        a.closed.load(Ordering::Relaxed),
        a.answered.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>(),
        a.answered(Code::Unauthenticated),
        a.answered(Code::ResourceExhausted),
        a.answered.iter().map(|c| c.load(Ordering::Relaxed)).sum::<u64>()
            - a.answered(Code::Unauthenticated)
            - a.answered(Code::ResourceExhausted),
        a.call_errors.load(Ordering::Relaxed),
    ));
    out.push_str(&format!(
        "\nThe CA: RSS {:.1} MiB before, {:.1} MiB at the flood's peak, {:.1} MiB 2 s after; TokenReviews the flood phase cost the API server: {reviews}; connections refused: {}; calls: {}; token reviews: {}. The namespace's listen queues overflowed {overflows} times during the flood ({drops} SYNs or handshakes dropped).\n",
        rss_mib(rss_before),
        rss_mib(flood_peak),
        rss_mib(rss_after),
        if refused_by.is_empty() { "none".into() } else { refused_by.join(", ") },
        calls_by.join(", "),
        reviews_by.join(", "),
    ));
    let failures: Vec<&String> = quiet_failed.iter().chain(&flood_failed).take(3).collect();
    if !failures.is_empty() {
        out.push_str(&format!(
            "\nFailed renewals (first {}): {failures:?}\n",
            failures.len()
        ));
    }
    Ok(out)
}
