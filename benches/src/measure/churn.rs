//! Pod churn, one round, two ways over the same `churn_pods` bare pod
//! namespaces (lo only):
//! 1. handed to a fresh proxy on its command line: time from process start
//!    to every pod's listeners open, RSS against a proxy with no pods;
//! 2. enrolled one after another by a CNI ADD through the plugin's library
//!    entry (`ringway_cni::run`, what the `ringway-cni` binary runs) over the
//!    node agent's socket: the agent (in this process) applies the capture
//!    rules in the pod and hands the netns to a fresh proxy over ZDS, which
//!    acks once the pod's listeners are open; each ADD timed end to end.

use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ringway_testbed::ns::Netns;

use crate::bed;
use crate::child::{ProxyArgs, ProxyChild};
use crate::config::Config;
use crate::figures::{Churn, Figures};
use crate::stat::quantiles;

/// Runs both ways for `round`, the agent's files under `scratch`.
pub fn run(config: &Config, scratch: &FsPath, round: usize) -> anyhow::Result<Figures<Churn>> {
    let mut f = Figures::new();
    let t0 = Instant::now();
    let mut pods = Vec::with_capacity(config.churn_pods);
    for i in 0..config.churn_pods {
        pods.push(Netns::create(&format!("churn{round}-{i}"))?);
    }
    f.set(Churn::NetnsCreateS, t0.elapsed().as_secs_f64());
    let env = vec![("RINGWAY_DRAIN_PERIOD", "200ms".to_string())];
    let mut empty = ProxyChild::start_ringway(
        &config.proxy_bin,
        &env,
        &ProxyArgs::pods(&[]),
        Duration::from_secs(20),
    )?;
    std::thread::sleep(config.settle);
    let rss0 = empty.rss_kib();
    empty.stop();
    let specs: Vec<(String, PathBuf)> = pods
        .iter()
        .map(|p| (p.name().to_string(), p.path().to_path_buf()))
        .collect();
    let mut full = ProxyChild::start_ringway(
        &config.proxy_bin,
        &env,
        &ProxyArgs::pods(&specs),
        Duration::from_secs(120),
    )?;
    let startup = full.startup;
    let cpu = full.cpu_seconds();
    std::thread::sleep(config.settle);
    let rss = full.rss_kib();
    full.stop();
    f.set(Churn::EnrollS, startup.as_secs_f64());
    f.set(Churn::EnrollCpuS, cpu);
    f.set(Churn::RssEmptyMib, rss0 / 1024.0);
    f.set(Churn::RssPodsMib, rss / 1024.0);
    f.set(
        Churn::KibPerPod,
        (rss - rss0) / config.churn_pods.max(1) as f64,
    );
    cni(config, scratch, round, &pods, &mut f)?;
    drop(pods);
    Ok(f)
}

/// The CNI ADD way: a node agent in this process, a fresh proxy for it,
/// one ADD per pod of `pods`, one after another.
pub fn cni(
    config: &Config,
    scratch: &FsPath,
    round: usize,
    pods: &[Netns],
    f: &mut Figures<Churn>,
) -> anyhow::Result<()> {
    let dir = scratch.join(format!("agent{round}"));
    std::fs::create_dir_all(&dir)?;
    let settings = ringway_config::ProxySettings::default();
    let agent = ringway_cni::node::NodeAgent::start(ringway_cni::node::AgentConfig {
        zds_socket: dir.join("zds.sock"),
        cni_socket: dir.join("cni.sock"),
        capture: ringway_proxy::capture_spec(&settings),
        // Nothing to rediscover: no netns dirs, an empty procfs stand-in.
        netns_dirs: vec![],
        proc_root: dir.clone(),
        node_name: "node1".into(),
        reconcile_interval: Duration::from_secs(3600),
        // The churn pods' identity (CNI passes no service account).
        service_accounts: vec!["bench=churn".parse()?],
        ..ringway_cni::node::AgentConfig::default()
    })
    .context("starting the node agent")?;
    let mut args = ProxyArgs::pods(&[]);
    args.zds_socket = Some(dir.join("zds.sock"));
    let mut proxy = bed::start_proxy_for_agent(&config.proxy_bin, &args, &agent)?;
    std::thread::sleep(config.settle);
    let rss0 = proxy.rss_kib();
    let mut lat_ms = Vec::with_capacity(pods.len());
    let t_all = Instant::now();
    for (i, ns) in pods.iter().enumerate() {
        let took = bed::cni_add(&dir.join("cni.sock"), ns, i)
            .with_context(|| format!("CNI ADD of pod {i} ({})", ns.name()))?;
        lat_ms.push(took.as_secs_f64() * 1e3);
    }
    let total = t_all.elapsed().as_secs_f64();
    std::thread::sleep(config.settle);
    let rss = proxy.rss_kib();
    let enrolled = agent.pods().len();
    if enrolled != pods.len() {
        bail!("the agent holds {enrolled} pods after {} ADDs", pods.len());
    }
    for (figure, q) in Churn::CNI_ADD.into_iter().zip(quantiles(lat_ms)) {
        f.set(figure, q);
    }
    f.set(Churn::CniAddTotalS, total);
    f.set(Churn::CniKibPerPod, (rss - rss0) / pods.len().max(1) as f64);
    if !proxy.alive() {
        bail!("the proxy exited: {}", proxy.log_tail());
    }
    proxy.stop();
    agent.shutdown();
    Ok(())
}
