//! What every xDS test shares: the CA and the test control plane, a client
//! running on a control thread of its own (as the proxy runs it), and a
//! handler whose state the test reads.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ringway_identity::CaSigner;
use ringway_testbed::TempDir;
use ringway_xds::proto::workload::{self, address, Workload};
use ringway_xds::proto::{security, TypedResource};
use ringway_xds::testing::{server_tls, RecordedRequest, XdsServer};
use ringway_xds::{
    AdsClient, Backoff, ClientConfig, DeltaDiscoveryResponse, Event, Handler, Nack, Node, Resource,
    ADDRESS_TYPE_URL,
};
use rustls_pki_types::{CertificateDer, ServerName};

/// The name the control plane's certificate is for.
pub const SERVER_NAME: &str = "istiod.istio-system.svc";
/// The node proxy's token.
pub const TOKEN: &str = "token-of-node-a";
/// The cluster name sent as `clusterid`.
pub const CLUSTER: &str = "Kubernetes";
/// The bound of every wait (a failure, not a pass, when it runs out).
pub const WAIT: Duration = Duration::from_secs(20);

/// Runs `body` in fresh network and mount namespaces.
pub fn isolated(name: &str, body: impl FnOnce() + Send) {
    ringway_testbed::init_logs();
    ringway_testbed::run_isolated(name, body);
}

/// A TLS client config trusting only `root`, TLS 1.3, ALPN h2.
pub fn client_tls(root: &CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).expect("root");
    let mut cfg = rustls::ClientConfig::builder_with_provider(ringway_identity::crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(cfg)
}

/// The mesh CA, a control plane on 127.0.0.1 of the test's namespace, and
/// a scratch dir holding the token file.
pub struct Bed {
    /// The mesh root the client trusts.
    pub ca: CaSigner,
    /// The control plane.
    pub server: XdsServer,
    /// Scratch files.
    pub dir: TempDir,
}

impl Bed {
    /// A control plane presenting a certificate for [`SERVER_NAME`] from
    /// the mesh root, and [`TOKEN`] in the token file.
    pub fn new(test: &str) -> Bed {
        let ca = CaSigner::generate_for_tests("cluster.local");
        let leaf = ca.issue_dns_for_tests(SERVER_NAME);
        Bed::serving(test, ca, leaf)
    }

    /// A control plane presenting `leaf`; the client trusts `ca`.
    pub fn serving(test: &str, ca: CaSigner, leaf: ringway_identity::TestLeaf) -> Bed {
        let tls = server_tls(leaf.chain, leaf.key).expect("server TLS");
        let server = XdsServer::start("127.0.0.1:0".parse().unwrap(), tls).expect("server");
        let dir = TempDir::new(test);
        std::fs::write(dir.join("token"), format!("{TOKEN}\n")).unwrap();
        Bed { ca, server, dir }
    }

    /// The token file.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// The client's config: this server, the mesh root, fast backoff.
    pub fn config(&self) -> ClientConfig {
        let node = Node::node_proxy(
            &["10.244.1.2".parse().unwrap()],
            "ringway-node-a",
            "istio-system",
            "node-a",
            "cluster.local",
        );
        let mut c = ClientConfig::new(
            self.server.addr().to_string(),
            ServerName::try_from(SERVER_NAME).unwrap(),
            client_tls(self.ca.cert()),
            self.token_file(),
            CLUSTER,
            node,
        );
        c.backoff = Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(200),
        };
        c
    }

    /// Waits for a request `pred` accepts; fails the test naming `what`.
    pub fn request(&self, what: &str, pred: impl Fn(&RecordedRequest) -> bool) -> RecordedRequest {
        self.server
            .wait_for_request(WAIT, pred)
            .unwrap_or_else(|e| panic!("waiting for {what}: {e}"))
    }
}

/// What the handler saw of the client's events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A stream opened.
    Connected,
    /// An ACK went out.
    Acked { nonce: String },
    /// A NACK went out.
    Nacked { nonce: String, message: String },
    /// An attempt ended.
    Disconnected {
        reason: &'static str,
        error: String,
        established: bool,
    },
}

/// The handler's state, shared with the test.
#[derive(Debug, Default)]
pub struct Store {
    /// type URL -> name -> version, as applied.
    pub held: HashMap<String, BTreeMap<String, String>>,
    /// Every response the handler was given.
    pub responses: Vec<DeltaDiscoveryResponse>,
    /// Every event.
    pub events: Vec<Seen>,
    /// The smallest number of resources held when a disconnect was seen.
    pub held_at_disconnect: Vec<usize>,
}

impl Store {
    /// What is held of `type_url`.
    pub fn held(&self, type_url: &str) -> BTreeMap<String, String> {
        self.held.get(type_url).cloned().unwrap_or_default()
    }

    /// Disconnects with `reason`.
    pub fn disconnects(&self, reason: &str) -> Vec<&Seen> {
        self.events
            .iter()
            .filter(|e| matches!(e, Seen::Disconnected { reason: r, .. } if *r == reason))
            .collect()
    }

    /// Streams opened.
    pub fn connects(&self) -> usize {
        self.events
            .iter()
            .filter(|e| **e == Seen::Connected)
            .count()
    }
}

/// Applies responses to a [`Store`]: a resource named `bad...` is refused
/// (and named in the NACK); so is one whose payload is not of the type.
pub struct TestHandler(pub Arc<Mutex<Store>>);

impl Handler for TestHandler {
    fn on_response(&mut self, resp: &DeltaDiscoveryResponse) -> Result<(), Nack> {
        let mut store = self.0.lock().unwrap();
        store.responses.push(resp.clone());
        let mut refused = Vec::new();
        for r in &resp.resources {
            let decodes = match (&r.resource, resp.type_url.as_str()) {
                (Some(any), ADDRESS_TYPE_URL) => workload::Address::from_any(any).is_ok(),
                (Some(any), _) => security::Authorization::from_any(any).is_ok(),
                (None, _) => false,
            };
            if r.name.starts_with("bad") || !decodes {
                refused.push(r.name.clone());
                continue;
            }
            store
                .held
                .entry(resp.type_url.clone())
                .or_default()
                .insert(r.name.clone(), r.version.clone());
        }
        for name in &resp.removed_resources {
            store
                .held
                .entry(resp.type_url.clone())
                .or_default()
                .remove(name);
        }
        if refused.is_empty() {
            Ok(())
        } else {
            Err(Nack::new(format!("refused {}", refused.join(", "))))
        }
    }

    fn resource_versions(&self, type_url: &str) -> HashMap<String, String> {
        self.0.lock().unwrap().held(type_url).into_iter().collect()
    }

    fn on_event(&mut self, event: Event) {
        let mut store = self.0.lock().unwrap();
        let seen = match event {
            Event::Connected { .. } => Seen::Connected,
            Event::Acked { nonce, .. } => Seen::Acked { nonce },
            Event::Nacked { nonce, message, .. } => Seen::Nacked { nonce, message },
            Event::Disconnected {
                error, established, ..
            } => {
                let held = store.held.values().map(BTreeMap::len).sum();
                store.held_at_disconnect.push(held);
                Seen::Disconnected {
                    reason: error.reason(),
                    error: error.to_string(),
                    established,
                }
            }
            other => panic!("unexpected event {other:?}"),
        };
        store.events.push(seen);
    }
}

/// The client on a control thread of its own (a current-thread runtime, as
/// the proxy runs it); stopped and joined on drop.
pub struct RunningClient {
    store: Arc<Mutex<Store>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningClient {
    /// Starts a client with `config`.
    pub fn start(config: ClientConfig) -> RunningClient {
        let client = AdsClient::new(config).expect("client config");
        let store = Arc::new(Mutex::new(Store::default()));
        let mut handler = TestHandler(store.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("xds-control".into())
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(client.run(&mut handler, async {
                        let _ = stopped.await;
                    }));
            })
            .expect("control thread");
        RunningClient {
            store,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The handler's state now.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap()
    }

    /// Waits until `cond` holds of the handler's state; fails the test
    /// naming `what` (and showing the state) when it does not in time.
    pub fn wait(&self, what: &str, cond: impl Fn(&Store) -> bool) {
        if !ringway_testbed::wait_until(WAIT, || cond(&self.store())) {
            panic!("waiting for {what}: the handler holds {:#?}", self.store());
        }
    }

    /// Signals stop; the control thread has ended when this returns
    /// (bounded: fails the test when it does not end in time).
    pub fn stop(mut self) {
        self.shut_down(true);
    }

    fn shut_down(&mut self, check: bool) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(thread) = self.thread.take() else {
            return;
        };
        let ended = ringway_testbed::wait_until(WAIT, || thread.is_finished());
        if check && !ended {
            panic!("the client did not stop within {WAIT:?}");
        }
        if ended {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningClient {
    fn drop(&mut self) {
        self.shut_down(false);
    }
}

/// A workload resource named by `uid`, at `version`, with address `ip`.
pub fn workload(uid: &str, version: &str, ip: [u8; 4]) -> Resource {
    let w = Workload {
        uid: uid.to_owned(),
        name: uid.rsplit('/').next().unwrap_or(uid).to_owned(),
        namespace: "shop".into(),
        addresses: vec![ip.to_vec()],
        tunnel_protocol: workload::TunnelProtocol::Hbone as i32,
        service_account: "web".into(),
        node: "node-a".into(),
        ..Default::default()
    };
    let a = workload::Address {
        kind: Some(address::Kind::Workload(w)),
    };
    Resource::new(uid, version, a.to_any())
}

/// A policy resource named `<ns>/<name>`, at `version`.
pub fn policy(ns: &str, name: &str, version: &str) -> Resource {
    let p = security::Authorization {
        name: name.into(),
        namespace: ns.into(),
        scope: security::Scope::Namespace as i32,
        action: security::Action::Deny as i32,
        ..Default::default()
    };
    Resource::new(format!("{ns}/{name}"), version, p.to_any())
}

/// `(name, version)` pairs as a map.
pub fn versions(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}
