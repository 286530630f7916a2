//! The control planes the clients talk to, on 127.0.0.1 of the bench's own
//! network namespace: the test xDS server (TLS, with a throwaway CA and a
//! token) and the fake Kubernetes API server over HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ringway_testbed::kube_api::{FakeApiServer, Kind};
use ringway_xds::testing::{server_tls, XdsServer};
use ringway_xds::{Resource, ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};

use super::config::SERVER_NAME;

/// Files both measurements share: the mesh root, the control plane's
/// certificate, the token, the proxy children's configuration.
pub(super) struct Files {
    pub(super) dir: PathBuf,
    pub(super) signer: ringway_identity::CaSigner,
    pub(super) root: PathBuf,
    pub(super) token: PathBuf,
}

impl Files {
    pub(super) fn new(dir: &Path) -> anyhow::Result<Files> {
        let signer = ringway_identity::CaSigner::generate_for_tests(crate::bed::TRUST_DOMAIN);
        let root = dir.join("ca.crt");
        signer.write_pem_files(&root, &dir.join("ca.key"))?;
        let token = dir.join("token");
        std::fs::write(&token, "bench-node-proxy-token\n")?;
        Ok(Files {
            dir: dir.to_path_buf(),
            signer,
            root,
            token,
        })
    }

    /// A control plane on 127.0.0.1 of this namespace serving `addresses`
    /// and `policies`.
    pub(super) fn xds_server(
        &self,
        addresses: Vec<Resource>,
        policies: Vec<Resource>,
    ) -> anyhow::Result<XdsServer> {
        let leaf = self.signer.issue_dns_for_tests(SERVER_NAME);
        let tls = server_tls(leaf.chain, leaf.key)?;
        let server = XdsServer::start_on(std::net::TcpListener::bind("127.0.0.1:0")?, tls)?;
        server.update_fixture(ADDRESS_TYPE_URL, addresses, vec![]);
        server.update_fixture(AUTHORIZATION_TYPE_URL, policies, vec![]);
        Ok(server)
    }
}

/// The fake API server over HTTP on 127.0.0.1, on a runtime thread of its
/// own, loaded with `objects`.
pub(super) struct Api {
    pub(super) api: FakeApiServer,
    pub(super) addr: SocketAddr,
    // Last: dropping it ends the serving task and its connections.
    pub(super) _rt: tokio::runtime::Runtime,
}

impl Api {
    pub(super) fn start(objects: Vec<(Kind, serde_json::Value)>) -> anyhow::Result<Api> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-apiserver")
            .enable_all()
            .build()?;
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let api = FakeApiServer::serve_http(rt.handle(), listener)?;
        for (kind, obj) in objects {
            api.apply(kind, obj);
        }
        Ok(Api { api, addr, _rt: rt })
    }

    /// A kubeconfig pointing at it (for a proxy child).
    pub(super) fn kubeconfig(&self, path: &Path) -> anyhow::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{}\nusers:\n- name: proxy\n  user:\n    token: bench-node-proxy-token\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: proxy\ncurrent-context: fake\n",
                self.addr
            ),
        )?;
        Ok(())
    }
}
