//! The mesh's roots followed while the proxy runs. A root rotation edits
//! the roots' files (the ConfigMap of `root-cert.pem` updated, the bundle
//! files replaced); each edit that loads is put in force without a restart:
//! the HBONE handshakes' roots in both directions, the roots the
//! certificate service's and the control plane's serving certificates are
//! checked against. An edit that does not load (unreadable, no
//! certificate, garbage) is rejected and counted; the roots in force stay.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ringway_config::FileWatcher;
use ringway_grpc::ClientTls;
use ringway_identity::{BundleFiles, IdentityManager, TrustBundle};

/// How often the roots' files are checked: a `stat` each; a ConfigMap's
/// update reaches the pod's volume a minute or so after the edit anyway.
pub(crate) const POLL: Duration = Duration::from_secs(1);

/// Who takes the roots of one set of files.
#[derive(Default)]
pub(crate) struct RootsUsers {
    /// HBONE: peers verified against them (and the certificates issued).
    pub identities: Option<Arc<IdentityManager>>,
    /// gRPC clients (the certificate service, the control plane) whose
    /// server's certificate is checked against them.
    pub clients: Vec<(&'static str, ClientTls)>,
    /// Where a refused edit is counted (`ringway_trust_bundle_rejected`).
    pub counted_by: Option<Arc<IdentityManager>>,
}

/// Follows `files` (in order: every certificate of each) and hands each
/// edit that loads to `users`. `None` without files. The users were built
/// from the files read moments before; what the watcher reads first is
/// handed to them too, so an edit in between is not missed. A file that
/// cannot be read now fails the start.
pub(crate) fn follow(
    files: Vec<PathBuf>,
    users: RootsUsers,
) -> anyhow::Result<Option<FileWatcher<TrustBundle>>> {
    if files.is_empty() {
        return Ok(None);
    }
    let names = files
        .iter()
        .map(|f| f.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let rejected_by = users.counted_by.clone();
    let users = Arc::new(Applier {
        users,
        edited: std::sync::Mutex::new(false),
    });
    let on_change = users.clone();
    let watcher = FileWatcher::spawn(
        "ringway-roots",
        files,
        BundleFiles,
        POLL,
        move |bundle: Arc<TrustBundle>| on_change.edited(&bundle),
        move |e| {
            if let Some(ids) = &rejected_by {
                ids.count_rejected_bundle();
            }
            tracing::error!(error = %e, "trust bundle edit rejected; keeping the roots in force");
        },
    )
    .with_context(|| format!("following the mesh's roots in {names}"))?;
    users.first(&watcher);
    Ok(Some(watcher))
}

/// Hands the watcher's loads to the users, one at a time.
struct Applier {
    users: RootsUsers,
    /// Whether an edit was applied: the first read is then older.
    edited: std::sync::Mutex<bool>,
}

impl Applier {
    /// An edit the watcher loaded.
    fn edited(&self, bundle: &TrustBundle) {
        let mut edited = self.edited.lock().unwrap_or_else(|p| p.into_inner());
        apply(bundle, &self.users);
        *edited = true;
    }

    /// What the watcher read first (the users were built from a read just
    /// before it), unless an edit it loaded since came first.
    fn first(&self, watcher: &FileWatcher<TrustBundle>) {
        let edited = self.edited.lock().unwrap_or_else(|p| p.into_inner());
        if !*edited {
            apply(&watcher.current(), &self.users);
        }
    }
}

fn apply(bundle: &TrustBundle, users: &RootsUsers) {
    if let Some(ids) = &users.identities {
        match ids.set_bundle(bundle.clone()) {
            Ok(c) if c.added + c.removed == 0 => {}
            Ok(c) => tracing::info!(
                roots = c.roots,
                added = c.added,
                removed = c.removed,
                renewing = c.renewing,
                "trust bundle reloaded: new HBONE handshakes verify peers against it"
            ),
            Err(e) => {
                tracing::error!(error = %e, "trust bundle edit rejected; keeping the roots in force");
                return;
            }
        }
    }
    // The clients' configs are rebuilt whatever changed: each is one
    // allocation, made once per edit.
    for (who, tls) in &users.clients {
        match ringway_ca::CaClient::tls_config(bundle.roots()) {
            Ok(cfg) => {
                tls.replace(cfg);
                tracing::debug!(client = who, roots = bundle.roots().len(), "roots in force");
            }
            Err(e) => tracing::error!(client = who, error = %e,
                "roots edit rejected; keeping the roots in force"),
        }
    }
}
