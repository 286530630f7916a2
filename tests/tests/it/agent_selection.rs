//! The agent's selection rule with a (fake) Kubernetes API server: the CNI ADD
//! captures exactly the pods the Kubernetes watch would keep, asks the API
//! server about a pod the watch has not seen yet, passes the others straight
//! through (prevResult back, no rules, nothing to the proxy), fails with
//! "try again later" when the API server cannot be read; the watch leaves the
//! CNI-captured pods enrolled and fills in their service account. The pods it
//! captures carry `ambient.istio.io/redirection: enabled` until released, and
//! a failing patch of it never fails a CNI ADD.
//!
//! The fake API server (`ringway_testbed::kube_api::FakeApiServer`) and the watch
//! run on a tokio runtime driven by a thread of the test, as `ringway agent
//! --kube` runs them. Runs inside `run_isolated`.

use crate::agent_support;

use std::time::{Duration, Instant};

use agent_support::*;
use ringway_cni::kube::{
    run_watch_with, Annotator, AnnotatorConfig, Enrollment as WatchEnrollment, Selector,
    WatchConfig,
};
use ringway_cni::node::{AgentConfig, Selection};
use ringway_redirect::{read_tag, verify, CaptureSpec, Drift};
use ringway_testbed::kube_api::{ApiMode, FakeApiServer, FakePod, Kind};
use ringway_testbed::{run_isolated, VirtualNode};

/// A current-thread runtime driven by its own thread until dropped, with the
/// fake API server on it.
struct Kube {
    api: FakeApiServer,
    selector: Selector,
    annotator: Annotator,
    runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Kube {
    fn start(lookup_timeout: Duration) -> Kube {
        Kube::start_with(
            lookup_timeout,
            AnnotatorConfig {
                retry_min: Duration::from_millis(20),
                retry_max: Duration::from_millis(200),
                request_timeout: Duration::from_millis(500),
            },
        )
    }

    /// With the annotator's timings.
    fn start_with(lookup_timeout: Duration, annotator: AnnotatorConfig) -> Kube {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let runtime = rt.handle().clone();
        let (client, api) = FakeApiServer::start(&runtime);
        let annotator = Annotator::start(client.clone(), &runtime, annotator);
        let selector = Selector::with_lookup_timeout(client, runtime.clone(), lookup_timeout);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            rt.block_on(async {
                let _ = stopped.await;
            })
        });
        Kube {
            api,
            selector,
            annotator,
            runtime,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Starts the watch of `node` for the agent, on the selector.
    fn watch(&self, node: &str, agent: &ringway_cni::node::AgentHandle) {
        let config = WatchConfig {
            node: node.into(),
            retry_min: Duration::from_millis(50),
            retry_max: Duration::from_millis(200),
            orphan_grace: Duration::from_millis(300),
            watch_backoff_min: Duration::from_millis(20),
            watch_backoff_max: Duration::from_millis(100),
            trust_after_failure: Duration::from_millis(200),
        };
        let enrollment: std::sync::Arc<dyn WatchEnrollment> =
            std::sync::Arc::new(agent.enrollment());
        self.runtime
            .spawn(run_watch_with(self.selector.clone(), config, enrollment));
    }
}

impl Drop for Kube {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// As `ringway agent --kube` runs: the selector and the annotator on the
/// Kubernetes runtime.
fn config_with(test: &str, dir: &TempDir, kube: &Kube) -> AgentConfig {
    AgentConfig {
        selection: Selection::Kubernetes(kube.selector.clone()),
        annotator: Some(kube.annotator.clone()),
        ..config(test, dir.path())
    }
}

/// The bed most of these tests share, inside `run_isolated`: logs on, a
/// temporary directory, the fake API server (2 s lookups) with namespace
/// `shop` labelled for capture and `plain` not, the agent's configuration
/// for it, and virtual node `node` with `pods` pods. Keep the directory
/// for the test's length.
fn labelled_bed(test: &str, node: u8, pods: usize) -> (TempDir, Kube, AgentConfig, VirtualNode) {
    init_logs();
    let dir = TempDir::new(test);
    let kube = Kube::start(Duration::from_secs(2));
    let cfg = config_with(test, &dir, &kube);
    let vn = VirtualNode::build(node, pods).unwrap();
    kube.api.apply_namespace("shop", Some("enabled"));
    kube.api.apply_namespace("plain", None);
    (dir, kube, cfg, vn)
}

/// No rules at all in the pod's namespace.
fn assert_uncaptured(pod: &ringway_testbed::Pod) {
    assert_eq!(read_tag(pod.netns.fd()).unwrap(), None, "{}", pod.name);
    assert!(
        verify(pod.netns.fd(), &CaptureSpec::default())
            .unwrap()
            .contains(&Drift::TableMissing),
        "{}",
        pod.name
    );
}

/// The stored pod's `ambient.istio.io/redirection` annotation.
fn redirection(api: &FakeApiServer, ns: &str, name: &str) -> Option<String> {
    api.get(Kind::Pod, ns, name)?["metadata"]["annotations"]["ambient.istio.io/redirection"]
        .as_str()
        .map(str::to_owned)
}

/// The value of the agent's `name` sample with labels `matchers` (0 when
/// absent).
fn sample(agent: &ringway_cni::node::AgentHandle, name: &str, matchers: &[&str]) -> u64 {
    ringway_testbed::prom::value(&agent.metrics_text(), name, matchers).unwrap_or(0.0) as u64
}

/// The CNI error code a failed plugin run printed.
fn cni_code(o: &ringway_cni::Outcome) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_str(&o.stdout).ok()?;
    v["code"].as_u64()
}

#[test]
fn cni_add_captures_only_what_the_labels_select() {
    run_isolated("agent_selection_add", || {
        let (_dir, kube, cfg, vn) = labelled_bed("agent_selection_add", 61, 3);
        let api = &kube.api;
        let pod = |i: usize, uid: &str, ns: &str| CniPod::of(vn.pod(i), uid).in_namespace(ns);
        let labelled = pod(0, "uid-shop", "shop");
        let unlabelled = pod(1, "uid-plain", "plain");
        let opted_out = pod(2, "uid-out", "shop");
        api.apply_pod(FakePod::new(&labelled.uid, "shop", &labelled.name, &cfg.node_name).json());
        api.apply_pod(
            FakePod::new(&unlabelled.uid, "plain", &unlabelled.name, &cfg.node_name).json(),
        );
        api.apply_pod(
            FakePod::new(&opted_out.uid, "shop", &opted_out.name, &cfg.node_name)
                .mode("disabled")
                .json(),
        );
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        // A pod of a labelled namespace, unknown to the (not running) watch: the
        // agent GETs the pod and its namespace, then captures it.
        let out = ok(plugin("ADD", &labelled, &cfg.cni_socket));
        assert!(out.stdout.contains("\"ips\""), "{}", out.stdout);
        assert_eq!(
            api.gets(),
            [
                format!("/api/v1/namespaces/shop/pods/{}", labelled.name),
                "/api/v1/namespaces/shop".to_string()
            ]
        );
        let add = &proxy.wait_for(2)[1];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "uid-shop"));
        assert_eq!(
            read_tag(vn.pod(0).netns.fd()).unwrap().unwrap().uid,
            "uid-shop"
        );

        // Unlabelled, and opted out: prevResult back, no rules, nothing to the proxy.
        for p in [&unlabelled, &opted_out] {
            let out = ok(plugin("ADD", p, &cfg.cni_socket));
            assert!(out.stdout.contains("\"ips\""), "{}", out.stdout);
            // CHECK agrees: nothing to check.
            ok(plugin("CHECK", p, &cfg.cni_socket));
            // DEL of a pod passed through: fine.
            ok(plugin("DEL", p, &cfg.cni_socket));
        }
        assert_uncaptured(vn.pod(1));
        assert_uncaptured(vn.pod(2));
        // A barrier instead of a pause: the proxy's connection is ordered,
        // so once a request that does reach it (the captured pod's ADD
        // again) is there, anything the pass-through pods caused would be
        // there before it.
        ok(plugin("ADD", &labelled, &cfg.cni_socket));
        proxy.wait_for(3);
        assert_eq!(
            proxy.kinds()[1..],
            [
                ("Add", "uid-shop".to_string()),
                ("Add", "uid-shop".to_string())
            ],
            "the pass-through pods reached the proxy"
        );
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-shop"]);

        // The raw answer names the reason.
        let line = format!(
            r#"{{"op":"add","containerId":"c-1","netns":"{}","pod":{{"name":"{}","namespace":"plain","uid":"uid-plain"}}}}"#,
            unlabelled.netns.display(),
            unlabelled.name
        );
        assert_eq!(
            cni_line(&cfg.cni_socket, format!("{line}\n").as_bytes()),
            r#"{"ok":true,"passThrough":"neither pod nor namespace labelled ringway.io/dataplane-mode=enabled or istio.io/dataplane-mode=ambient"}"#
        );
        // The agent's own namespace passes through whatever its labels say.
        api.apply_namespace("ringway-system", Some("enabled"));
        let line = format!(
            r#"{{"op":"add","containerId":"c-2","netns":"{}","pod":{{"name":"agent-0","namespace":"ringway-system","uid":"uid-own"}}}}"#,
            unlabelled.netns.display(),
        );
        assert_eq!(
            cni_line(&cfg.cni_socket, format!("{line}\n").as_bytes()),
            r#"{"ok":true,"passThrough":"namespace excluded from capture (exclude_namespaces)"}"#
        );
        assert_uncaptured(vn.pod(1));
        agent.shutdown();
    });
}

#[test]
fn cni_add_is_try_again_later_when_the_api_server_cannot_be_read() {
    run_isolated("agent_selection_api_down", || {
        init_logs();
        let dir = TempDir::new("agent_selection_api_down");
        let kube = Kube::start(Duration::from_millis(300));
        let cfg = config_with("agent_selection_api_down", &dir, &kube);
        let vn = VirtualNode::build(62, 1).unwrap();
        kube.api.apply_namespace("shop", Some("enabled"));
        let p = CniPod::of(vn.pod(0), "uid-a");
        kube.api
            .apply_pod(FakePod::new(&p.uid, "shop", &p.name, &cfg.node_name).json());
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        for mode in [ApiMode::Unreachable, ApiMode::Hang] {
            kube.api.set_mode(mode);
            let started = Instant::now();
            let out = plugin("ADD", &p, &cfg.cni_socket);
            assert_eq!(out.exit_code, 1, "{mode:?}: {}", out.stdout);
            assert_eq!(cni_code(&out), Some(11), "{mode:?}: {}", out.stdout);
            assert!(
                out.stdout
                    .contains("cannot tell whether to capture pod shop/"),
                "{}",
                out.stdout
            );
            assert!(started.elapsed() < Duration::from_secs(10), "{mode:?}");
            assert_uncaptured(vn.pod(0));
            assert!(agent.pods().is_empty());
        }
        assert_eq!(proxy.log().len(), 1, "{:?}", proxy.kinds());

        // The API server is back: the runtime's retry captures the pod.
        kube.api.set_mode(ApiMode::Serve);
        ok(plugin("ADD", &p, &cfg.cni_socket));
        assert_eq!(proxy.wait_for(2)[1].kind, "Add");
        agent.shutdown();
    });
}

/// A pod captured by CNI ADD while the watch runs: the ADD is answered from
/// the watch's cache, with the pod's service account in its first `Add`; the
/// watch never unenrolls it nor re-sends it once the pod runs (same
/// identity). A pod passed through is not enrolled by the watch either.
#[test]
fn the_watch_and_cni_agree_and_the_first_add_carries_the_service_account() {
    run_isolated("agent_selection_watch", || {
        let (_dir, kube, cfg, vn) = labelled_bed("agent_selection_watch", 63, 2);
        let api = &kube.api;
        let meshed = CniPod::of(vn.pod(0), "uid-m");
        let mut plain = CniPod::of(vn.pod(1), "uid-p");
        plain.namespace = "plain".into();
        let fake = |p: &CniPod| {
            FakePod::new(&p.uid, &p.namespace, &p.name, &cfg.node_name).service_account("cart")
        };
        api.apply_pod(fake(&meshed).json());
        api.apply_pod(fake(&plain).json());
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        kube.watch(&cfg.node_name, &agent);
        assert!(
            wait_until(WAIT, || kube.selector.synced()),
            "watch not synced"
        );

        ok(plugin("ADD", &meshed, &cfg.cni_socket));
        ok(plugin("ADD", &plain, &cfg.cni_socket));
        // Both answered from the watch's cache.
        assert_eq!(api.gets(), Vec::<String>::new());
        let add = &proxy.wait_for(2)[1];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "uid-m"));
        assert_eq!(
            add.info,
            Some((meshed.name.clone(), "shop".into(), "cart".into())),
            "the first Add carries the pod's real identity"
        );
        assert_eq!(add.netns_inode, Some(vn.pod(0).netns.inode()));
        let tag = read_tag(vn.pod(0).netns.fd()).unwrap().unwrap();
        assert_eq!(tag.service_account, "cart");
        assert_eq!(tag.container_id, "sandbox-uid-m");

        // The pods run: the watch sees the identity the agent holds.
        let ip = |p: &CniPod| {
            p.ips
                .iter()
                .map(|a| a.split('/').next().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        let running = |p: &CniPod| {
            let ips = ip(p);
            let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
            fake(p).running(&ips)
        };
        // Pod events applied by the watch so far: the four updates below are
        // counted from here (a count taken later could include one of the
        // first two still in flight).
        let applied = kube.selector.events_applied();
        api.apply_pod(running(&meshed).json());
        api.apply_pod(running(&plain).json());

        // More updates of both pods: no more calls, no flapping.
        let mut again = running(&meshed).json();
        again["metadata"]["annotations"] = serde_json::json!({"touched": "1"});
        api.apply_pod(again);
        let mut again = running(&plain).json();
        again["metadata"]["annotations"] = serde_json::json!({"touched": "1"});
        api.apply_pod(again);
        // The watch has applied the four updates (and made any call they
        // lead to).
        assert!(
            wait_until(WAIT, || kube.selector.events_applied() >= applied + 4),
            "the watch did not apply the four updates: {} events",
            kube.selector.events_applied() - applied
        );
        assert_eq!(proxy.log().len(), 2, "{:?}", proxy.kinds());
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-m"]);
        assert_uncaptured(vn.pod(1));

        // The namespace loses its label: the same rule now releases the pod.
        api.apply_namespace("shop", None);
        let del = &proxy.wait_for(3)[2];
        assert_eq!((del.kind, del.uid.as_str()), ("Del", "uid-m"));
        assert_uncaptured(vn.pod(0));
        agent.shutdown();
    });
}

/// CNI passes no service account. The first `Add` must still carry the pod's
/// real one (looked up before the ADD is acked), never a default and never
/// one the request or the agent's file-mode rules claim; a pod whose service
/// account the API server cannot vouch for (unknown there, or known under
/// another uid: a pod re-created under the same name) is not captured yet.
#[test]
fn adversarial_cni_add_enrolls_only_with_the_pods_real_service_account() {
    run_isolated("adversarial_cni_add_sa", || {
        init_logs();
        let dir = TempDir::new("adversarial_cni_add_sa");
        let kube = Kube::start(Duration::from_secs(2));
        // config() also holds the file-mode rule shop=shop-sa: unused with the API.
        let cfg = config_with("adversarial_cni_add_sa", &dir, &kube);
        let vn = VirtualNode::build(64, 3).unwrap();
        let api = &kube.api;
        api.apply_namespace("shop", Some("enabled"));
        let web = CniPod::of(vn.pod(0), "uid-web");
        let recreated = CniPod::of(vn.pod(1), "uid-new");
        let unknown = CniPod::of(vn.pod(2), "uid-unknown");
        api.apply_pod(
            FakePod::new(&web.uid, "shop", &web.name, &cfg.node_name)
                .service_account("web")
                .json(),
        );
        // The API server holds another pod of that name (the old one).
        api.apply_pod(
            FakePod::new("uid-old", "shop", &recreated.name, &cfg.node_name)
                .service_account("admin")
                .json(),
        );
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        // A request that claims another service account is refused.
        let line = format!(
            r#"{{"op":"add","containerId":"c-1","netns":"{}","pod":{{"name":"{}","namespace":"shop","uid":"uid-web","serviceAccount":"admin"}}}}"#,
            web.netns.display(),
            web.name
        );
        let resp = cni_line(&cfg.cni_socket, format!("{line}\n").as_bytes());
        assert!(
            resp.contains(r#""kind":"rejected""#)
                && resp.contains(r#"runs as service account \"admin\", the agent knows \"web\""#),
            "{resp}"
        );
        assert_uncaptured(vn.pod(0));

        // The plugin's ADD: the first Add carries the API server's answer.
        ok(plugin("ADD", &web, &cfg.cni_socket));
        let add = &proxy.wait_for(2)[1];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "uid-web"));
        assert_eq!(
            add.info,
            Some((web.name.clone(), "shop".into(), "web".into()))
        );
        assert_eq!(
            read_tag(vn.pod(0).netns.fd())
                .unwrap()
                .unwrap()
                .service_account,
            "web"
        );

        // Unknown to the API server, or known under another uid: try again
        // later (code 11), nothing captured, nothing sent.
        for (p, i) in [(&recreated, 1), (&unknown, 2)] {
            let out = plugin("ADD", p, &cfg.cni_socket);
            assert_eq!(cni_code(&out), Some(11), "{}: {}", p.uid, out.stdout);
            assert!(
                out.stdout.contains("its service account is unknown"),
                "{}",
                out.stdout
            );
            assert_uncaptured(vn.pod(i));
        }
        assert_eq!(proxy.log().len(), 2, "{:?}", proxy.kinds());
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-web"]);
        agent.shutdown();
    });
}

/// The Istio ambient mesh's labels, end to end: a pod labelled
/// `istio.io/dataplane-mode=none` in a namespace labelled
/// `istio.io/dataplane-mode=ambient` is never captured (its CNI ADD passes it
/// through; the watch never enrolls it, not once it runs, not when it and its
/// namespace gain ringway's `enabled` too: the opt-out wins) nor annotated; a
/// captured pod whose label changes from `ambient` to `none` is released (`Del`
/// to the proxy, its rules removed, its `ambient.istio.io/redirection`
/// annotation removed).
#[test]
fn adversarial_an_istio_opt_out_is_never_captured_and_a_switch_to_none_releases() {
    run_isolated("adversarial_istio_opt_out", || {
        init_logs();
        let dir = TempDir::new("adversarial_istio_opt_out");
        let kube = Kube::start(Duration::from_secs(2));
        let cfg = config_with("adversarial_istio_opt_out", &dir, &kube);
        let vn = VirtualNode::build(65, 2).unwrap();
        let api = &kube.api;
        api.apply_namespace_labels("amb", &[("istio.io/dataplane-mode", "ambient")]);
        let pod = |i: usize, uid: &str| {
            let mut p = CniPod::of(vn.pod(i), uid);
            p.namespace = "amb".into();
            p
        };
        let (opted_out, switched) = (pod(0, "uid-none"), pod(1, "uid-switch"));
        let fake = |p: &CniPod, istio: &str| {
            FakePod::new(&p.uid, "amb", &p.name, &cfg.node_name)
                .service_account("web")
                .istio_mode(istio)
        };
        let running = |f: FakePod, p: &CniPod| {
            let ips: Vec<String> = p
                .ips
                .iter()
                .map(|a| a.split('/').next().unwrap().to_string())
                .collect();
            let ips: Vec<&str> = ips.iter().map(String::as_str).collect();
            f.running(&ips)
        };
        api.apply_pod(fake(&opted_out, "none").json());
        api.apply_pod(fake(&switched, "ambient").json());
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);
        kube.watch(&cfg.node_name, &agent);
        assert!(
            wait_until(WAIT, || kube.selector.synced()),
            "watch not synced"
        );

        // The CNI ADD: the opted-out pod passes through, the other is captured.
        let line = format!(
            r#"{{"op":"add","containerId":"c-1","netns":"{}","pod":{{"name":"{}","namespace":"amb","uid":"uid-none"}}}}"#,
            opted_out.netns.display(),
            opted_out.name
        );
        assert_eq!(
            cni_line(&cfg.cni_socket, format!("{line}\n").as_bytes()),
            r#"{"ok":true,"passThrough":"pod opted out (ringway.io/dataplane-mode=disabled or istio.io/dataplane-mode=none)"}"#
        );
        ok(plugin("ADD", &opted_out, &cfg.cni_socket));
        assert_uncaptured(vn.pod(0));
        ok(plugin("ADD", &switched, &cfg.cni_socket));
        let add = &proxy.wait_for(2)[1];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "uid-switch"));
        assert!(
            wait_until(WAIT, || redirection(api, "amb", &switched.name).as_deref()
                == Some("enabled")),
            "the captured pod is not annotated"
        );

        // Both run; then everything else says "enroll" for the opted-out pod.
        api.apply_pod(running(fake(&opted_out, "none"), &opted_out).json());
        api.apply_pod(running(fake(&switched, "ambient"), &switched).json());
        api.apply_namespace_labels(
            "amb",
            &[
                ("istio.io/dataplane-mode", "ambient"),
                ("ringway.io/dataplane-mode", "enabled"),
            ],
        );
        api.apply_pod(running(fake(&opted_out, "none").mode("enabled"), &opted_out).json());
        // The switch to none comes after those on the same pod watch: once its
        // Del is at the proxy, they have been applied.
        api.apply_pod(running(fake(&switched, "none"), &switched).json());
        let del = &proxy.wait_for(3)[2];
        assert_eq!((del.kind, del.uid.as_str()), ("Del", "uid-switch"));
        assert!(
            wait_until(WAIT, || agent.pods().is_empty()),
            "the agent still holds {:?}",
            agent.pods()
        );
        // The rules go after the proxy's ack of the Del.
        assert!(
            wait_until(WAIT, || read_tag(vn.pod(1).netns.fd()).unwrap().is_none()),
            "the released pod's rules are still there"
        );
        assert_uncaptured(vn.pod(1));
        assert_uncaptured(vn.pod(0));
        assert_eq!(proxy.log().len(), 3, "{:?}", proxy.kinds());
        // The released pod's annotation is removed (one patch naming it, null);
        // the opted-out pod's is never written.
        let removed = |p: &ringway_testbed::kube_api::ApiRequest| {
            p.path.ends_with(&format!("/pods/{}/status", switched.name))
                && p.body.as_deref().is_some_and(|b| {
                    serde_json::from_str::<serde_json::Value>(b).unwrap()["metadata"]["annotations"]
                        ["ambient.istio.io/redirection"]
                        .is_null()
                })
        };
        assert!(
            wait_until(WAIT, || api.patches().iter().any(removed)),
            "no removal of the released pod's annotation: {:?}",
            api.patches()
        );
        assert!(
            api.patches()
                .iter()
                .all(|p| !p.path.contains(&format!("/pods/{}/", opted_out.name))),
            "{:?}",
            api.patches()
        );
        agent.shutdown();
    });
}

/// The agent marks the pods it captures `ambient.istio.io/redirection: enabled`,
/// as the Istio ambient mesh's CNI agent does, once their rules are in place and
/// the proxy acked them (a pod the proxy nacks is never marked, nor one passed
/// through), and removes the mark when it lets them go: at CNI DEL, and when the
/// watch releases a pod whose label opts it out. One merge patch each, of the
/// pod's status subresource, naming its uid. A mark lost while the pod is held
/// is put back from the watch.
#[test]
fn captured_pods_carry_the_redirection_annotation_until_released() {
    run_isolated("agent_selection_annotation", || {
        let (_dir, kube, cfg, vn) = labelled_bed("agent_selection_annotation", 66, 4);
        let api = &kube.api;
        let pod = |i: usize, uid: &str, ns: &str| CniPod::of(vn.pod(i), uid).in_namespace(ns);
        let web = pod(0, "uid-web", "shop");
        let nacked = pod(1, "uid-nacked", "shop");
        let plain = pod(2, "uid-plain", "plain");
        let later = pod(3, "uid-later", "shop");
        let fake = |p: &CniPod| {
            FakePod::new(&p.uid, &p.namespace, &p.name, &cfg.node_name).service_account("web")
        };
        for p in [&web, &nacked, &plain, &later] {
            api.apply_pod(fake(p).json());
        }
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        // Refused by the proxy (the ADD fails), passed through: never marked.
        proxy.refuse("uid-nacked", "no listeners");
        let out = plugin("ADD", &nacked, &cfg.cni_socket);
        assert_eq!(out.exit_code, 1, "{}", out.stdout);
        ok(plugin("ADD", &plain, &cfg.cni_socket));
        // Captured: marked. The annotator patches one pod at a time, oldest wish
        // first, so once web's patch is there, any wish about the other two would
        // have been patched before it.
        ok(plugin("ADD", &web, &cfg.cni_socket));
        assert!(
            wait_until(WAIT, || redirection(api, "shop", &web.name).as_deref()
                == Some("enabled")),
            "web not annotated: {:?}",
            api.patches()
        );
        let patches = api.patches();
        assert_eq!(patches.len(), 1, "{patches:?}");
        assert_eq!(
            patches[0].path,
            format!("/api/v1/namespaces/shop/pods/{}/status", web.name)
        );
        assert_eq!(
            patches[0].content_type.as_deref(),
            Some("application/merge-patch+json")
        );
        let body: serde_json::Value =
            serde_json::from_str(patches[0].body.as_deref().unwrap()).unwrap();
        assert_eq!(body["metadata"]["uid"], "uid-web");
        assert_eq!(redirection(api, "shop", &nacked.name), None);
        assert_eq!(redirection(api, "plain", &plain.name), None);

        // CNI DEL: removed.
        ok(plugin("DEL", &web, &cfg.cni_socket));
        assert!(
            wait_until(WAIT, || redirection(api, "shop", &web.name).is_none()),
            "web still annotated: {:?}",
            api.patches()
        );
        let body: serde_json::Value =
            serde_json::from_str(api.patches()[1].body.as_deref().unwrap()).unwrap();
        assert_eq!(
            body["metadata"]["annotations"]["ambient.istio.io/redirection"],
            serde_json::Value::Null
        );

        // The watch: a running pod captured at ADD, then opted out by its
        // label: released, and its mark removed.
        kube.watch(&cfg.node_name, &agent);
        assert!(
            wait_until(WAIT, || kube.selector.synced()),
            "watch not synced"
        );
        ok(plugin("ADD", &later, &cfg.cni_socket));
        assert!(
            wait_until(WAIT, || redirection(api, "shop", &later.name).as_deref()
                == Some("enabled")),
            "later not annotated"
        );
        let ip = later.ips[0].split('/').next().unwrap().to_string();
        // It runs, and its mark is removed by someone else (the object replaced
        // without it): the watch sees a pod the agent holds without it, and the
        // agent marks it again.
        api.apply_pod(fake(&later).running(&[&ip]).json());
        assert!(
            wait_until(WAIT, || redirection(api, "shop", &later.name).as_deref()
                == Some("enabled")),
            "later's lost annotation not repaired: {:?}",
            api.patches()
        );
        let mut opted_out = fake(&later).running(&[&ip]).mode("disabled").json();
        opted_out["metadata"]["annotations"] =
            serde_json::json!({"ambient.istio.io/redirection": "enabled"});
        api.apply_pod(opted_out);
        assert!(
            wait_until(WAIT, || redirection(api, "shop", &later.name).is_none()),
            "later still annotated after its release: {:?}",
            api.patches()
        );
        assert_eq!(
            proxy
                .kinds()
                .into_iter()
                .filter(|(_, uid)| uid == "uid-later")
                .map(|(k, _)| k)
                .collect::<Vec<_>>(),
            ["Add", "Del"]
        );
        assert!(
            wait_until(WAIT, || sample(
                &agent,
                "ringway_agent_redirection_annotation_patches_total",
                &["op=\"remove\"", "outcome=\"ok\""]
            ) == 2),
            "{}",
            agent.metrics_text()
        );
        assert_eq!(
            sample(
                &agent,
                "ringway_agent_redirection_annotation_patches_total",
                &["op=\"set\"", "outcome=\"ok\""]
            ),
            3,
            "{}",
            agent.metrics_text()
        );
        agent.shutdown();
    });
}

/// A patch of the annotation that fails never fails, nor holds up, a CNI ADD:
/// while the API server leaves the patches unanswered (and the annotator would
/// wait a minute for each), or refuses them, pods are captured as usual; each
/// failure is logged and counted, the patch tried again, and it lands once the
/// API server takes it. A removal still refused when the watch sees the pod
/// deleted is dropped (the pending wishes stay bounded by the node's pods).
#[test]
fn a_failing_annotation_patch_never_fails_the_cni_add() {
    run_isolated("agent_selection_annotation_fails", || {
        init_logs();
        let dir = TempDir::new("agent_selection_annotation_fails");
        let kube = Kube::start_with(
            Duration::from_secs(2),
            AnnotatorConfig {
                retry_min: Duration::from_millis(20),
                retry_max: Duration::from_millis(200),
                // Far beyond the CNI socket's 5 s deadline: an ADD that waited for
                // a hanging patch would fail.
                request_timeout: Duration::from_secs(60),
            },
        );
        let cfg = config_with("agent_selection_annotation_fails", &dir, &kube);
        let vn = VirtualNode::build(67, 2).unwrap();
        let api = &kube.api;
        api.apply_namespace("shop", Some("enabled"));
        let (a, b) = (
            CniPod::of(vn.pod(0), "uid-a"),
            CniPod::of(vn.pod(1), "uid-b"),
        );
        for p in [&a, &b] {
            api.apply_pod(
                FakePod::new(&p.uid, "shop", &p.name, &cfg.node_name)
                    .service_account("web")
                    .json(),
            );
        }
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        api.set_patch_mode(ApiMode::Hang);
        ok(plugin("ADD", &a, &cfg.cni_socket));
        assert_eq!(proxy.wait_for(2)[1].uid, "uid-a");
        assert!(
            wait_until(WAIT, || api.patches().len() == 1),
            "no patch of a: {:?}",
            api.patches()
        );
        // The patch hangs; another ADD goes through meanwhile.
        ok(plugin("ADD", &b, &cfg.cni_socket));
        assert_eq!(proxy.wait_for(3)[2].uid, "uid-b");

        // Refused (the hanging patch is dropped): errors, counted, retried.
        api.set_patch_mode(ApiMode::Refuse(500));
        let errors = || {
            sample(
                &agent,
                "ringway_agent_redirection_annotation_patches_total",
                &["op=\"set\"", "outcome=\"error\""],
            )
        };
        assert!(
            wait_until(WAIT, || errors() >= 4),
            "{}",
            agent.metrics_text()
        );
        assert!(
            agent
                .metrics_text()
                .contains("ringway_agent_redirection_annotation_pending 2"),
            "{}",
            agent.metrics_text()
        );
        assert_eq!(redirection(api, "shop", &a.name), None);
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["uid-a", "uid-b"]);

        api.set_patch_mode(ApiMode::Serve);
        for p in [&a, &b] {
            assert!(
                wait_until(WAIT, || redirection(api, "shop", &p.name).as_deref()
                    == Some("enabled")),
                "{} not annotated",
                p.uid
            );
        }
        let pending = |n: u32| {
            let line = format!("ringway_agent_redirection_annotation_pending {n}");
            wait_until(WAIT, || agent.metrics_text().contains(&line))
        };
        assert!(pending(0), "{}", agent.metrics_text());

        // Refused again (RBAC lost): a's release is wished, refused, retried...
        api.set_patch_mode(ApiMode::Refuse(403));
        kube.watch(&cfg.node_name, &agent);
        assert!(
            wait_until(WAIT, || kube.selector.synced()),
            "watch not synced"
        );
        ok(plugin("DEL", &a, &cfg.cni_socket));
        assert!(pending(1), "{}", agent.metrics_text());
        // ... until the pod's object is gone: nothing left to un-annotate.
        api.delete_pod("shop", &a.name);
        assert!(pending(0), "{}", agent.metrics_text());
        agent.shutdown();
    });
}

/// A runtime that gives no `K8S_POD_UID` (an old or unusual runtime, a
/// meta-plugin that drops it): the agent takes the pod's uid from the API
/// server's pod of that name on this node (a static pod's mirror: the
/// static pod's own uid), and the pod is captured and released as any
/// other. A pod of an excluded namespace passes through without a lookup;
/// where no pod of that name counts (none, another node's, or its uid held
/// by another pod) the namespace decides: passed through when it is not
/// captured, "try again later" naming `K8S_POD_UID` when it is. A held
/// sandbox is found by itself (CHECK needs no API server). Before, every
/// such ADD failed: no pod of the node could start.
#[test]
fn cni_add_without_a_pod_uid_takes_it_from_the_api_server() {
    run_isolated("agent_selection_no_uid", || {
        let (_dir, kube, cfg, vn) = labelled_bed("agent_selection_no_uid", 68, 4);
        let api = &kube.api;
        let no_uid = |i: usize, ns: &str| {
            let mut p = CniPod::of(vn.pod(i), "").in_namespace(ns);
            p.container_id = format!("sandbox-{i}");
            p
        };
        let web = no_uid(0, "shop");
        let plain = no_uid(1, "plain");
        let other = no_uid(2, "shop");
        let statik = no_uid(3, "shop");
        api.apply_pod(
            FakePod::new("uid-web", "shop", &web.name, &cfg.node_name)
                .service_account("web")
                .json(),
        );
        api.apply_pod(FakePod::new("uid-plain", "plain", &plain.name, &cfg.node_name).json());
        api.apply_pod(
            FakePod::new("uid-mirror", "shop", &statik.name, &cfg.node_name)
                .annotate("kubernetes.io/config.mirror", "static-hash")
                .json(),
        );
        let agent = start(&cfg);
        let proxy = AutoProxy::start(&cfg.zds_socket);
        wait_ready_proxies(&agent, 1);

        // Captured under the API server's uid, with its service account.
        ok(plugin("ADD", &web, &cfg.cni_socket));
        let add = &proxy.wait_for(2)[1];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "uid-web"));
        assert_eq!(
            add.info,
            Some((web.name.clone(), "shop".into(), "web".into()))
        );
        assert_eq!(
            read_tag(vn.pod(0).netns.fd()).unwrap().unwrap().uid,
            "uid-web"
        );

        // Unlabelled: passed through, as with a uid.
        let out = ok(plugin("ADD", &plain, &cfg.cni_socket));
        assert!(out.stdout.contains("\"ips\""), "{}", out.stdout);
        assert_uncaptured(vn.pod(1));

        // A static pod: held by its own uid, the one its mirror names.
        ok(plugin("ADD", &statik, &cfg.cni_socket));
        let add = &proxy.wait_for(3)[2];
        assert_eq!((add.kind, add.uid.as_str()), ("Add", "static-hash"));

        // No pod of that name counts, in a captured namespace: try again
        // later, naming what was missing and why; nothing captured.
        let refused = |why: &str| {
            let out = plugin("ADD", &other, &cfg.cni_socket);
            assert_eq!(cni_code(&out), Some(11), "{}", out.stdout);
            assert!(
                out.stdout.contains(&format!(
                    "the runtime gave no K8S_POD_UID for pod shop/{}, and {why}",
                    other.name
                )),
                "{}",
                out.stdout
            );
            assert_uncaptured(vn.pod(2));
        };
        refused("the API server has no such pod");
        api.apply_pod(FakePod::new("uid-far", "shop", &other.name, "another-node").json());
        refused("the API server's pod of that name is on node \\\"another-node\\\"");
        // The uid it gives is held for another pod (web): refused, naming
        // the holder, as a uid the runtime gave would be.
        api.apply_pod(FakePod::new("uid-web", "shop", &other.name, &cfg.node_name).json());
        failed_with(
            plugin("ADD", &other, &cfg.cni_socket),
            &format!(
                "the uid is held for pod shop/{}; one uid is one pod",
                web.name
            ),
        );
        assert_uncaptured(vn.pod(2));
        // In a namespace that is not captured: passed through.
        let mut elsewhere = other.clone();
        elsewhere.namespace = "plain".into();
        let out = ok(plugin("ADD", &elsewhere, &cfg.cni_socket));
        assert!(out.stdout.contains("\"ips\""), "{}", out.stdout);
        assert_uncaptured(vn.pod(2));

        // The agent's own namespace: passed through, no lookup.
        let gets = api.gets().len();
        let own = no_uid(2, "ringway-system");
        let out = ok(plugin("ADD", &own, &cfg.cni_socket));
        assert!(out.stdout.contains("\"ips\""), "{}", out.stdout);
        assert_eq!(api.gets()[gets..], [] as [String; 0]);
        assert_uncaptured(vn.pod(2));

        // CHECK finds the held sandbox by itself, with the API server away.
        api.set_mode(ApiMode::Unreachable);
        ok(plugin("CHECK", &web, &cfg.cni_socket));
        api.set_mode(ApiMode::Serve);

        // DEL without a uid finds the pod by its sandbox and releases it.
        ok(plugin("DEL", &web, &cfg.cni_socket));
        let del = &proxy.wait_for(4)[3];
        assert_eq!((del.kind, del.uid.as_str()), ("Del", "uid-web"));
        assert_eq!(read_tag(vn.pod(0).netns.fd()).unwrap(), None);
        let held: Vec<String> = agent.pods().into_iter().map(|p| p.pod.uid).collect();
        assert_eq!(held, ["static-hash"]);
        assert_eq!(proxy.log().len(), 4, "{:?}", proxy.kinds());
        agent.shutdown();
    });
}
