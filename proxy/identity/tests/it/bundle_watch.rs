//! The roots' files followed while running: a `FileWatcher` with
//! `BundleFiles` against real files laid out as a ConfigMap volume mounts
//! them (`root-cert.pem -> ..data/root-cert.pem`, `..data` a symlink swapped
//! to a new directory on every update), and a plain extra file replaced by
//! rename. The watcher polls only when asked (`poll_now`), so each step
//! knows exactly what one poll saw.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use ringway_config::FileWatcher;
use ringway_identity::{BundleFiles, CaSigner, IdentityError, TrustBundle};
use ringway_testbed::TempDir;

const TD: &str = "cluster.local";

/// A ConfigMap volume holding `root-cert.pem`: each update writes a new
/// timestamped directory and swaps the `..data` symlink to it, as the
/// kubelet does.
struct ConfigMapVolume {
    dir: PathBuf,
    updates: usize,
}

impl ConfigMapVolume {
    fn new(dir: &Path, pem: &str) -> ConfigMapVolume {
        fs::create_dir_all(dir).unwrap();
        let mut v = ConfigMapVolume {
            dir: dir.to_owned(),
            updates: 0,
        };
        v.update(pem);
        symlink("..data/root-cert.pem", dir.join("root-cert.pem")).unwrap();
        v
    }

    fn file(&self) -> PathBuf {
        self.dir.join("root-cert.pem")
    }

    fn update(&mut self, pem: &str) {
        self.updates += 1;
        let version = format!("..2026_12_06_{:02}", self.updates);
        fs::create_dir(self.dir.join(&version)).unwrap();
        fs::write(self.dir.join(&version).join("root-cert.pem"), pem).unwrap();
        let tmp = self.dir.join("..data_tmp");
        symlink(&version, &tmp).unwrap();
        fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

/// Writes `text` beside `path` and renames it over `path`.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).unwrap();
    fs::rename(&tmp, path).unwrap();
}

struct Followed {
    watcher: FileWatcher<TrustBundle>,
    changes: Receiver<Arc<TrustBundle>>,
    errors: Receiver<IdentityError>,
}

fn follow(files: Vec<PathBuf>) -> Result<Followed, IdentityError> {
    let (change_tx, changes) = mpsc::channel();
    let (error_tx, errors) = mpsc::channel();
    let watcher = FileWatcher::spawn(
        "test-roots",
        files,
        BundleFiles,
        Duration::from_secs(3600),
        move |b| change_tx.send(b).unwrap(),
        move |e| error_tx.send(e).unwrap(),
    )?;
    Ok(Followed {
        watcher,
        changes,
        errors,
    })
}

impl Followed {
    /// One poll, and what it published, if anything.
    fn poll(&self) -> Option<Arc<TrustBundle>> {
        assert!(self.watcher.poll_now());
        self.changes.try_recv().ok()
    }

    /// Two polls of the same contents (a failure is reported on the
    /// second sight), and the error reported, if any.
    fn poll_twice_for_error(&self) -> Option<IdentityError> {
        assert!(self.poll().is_none(), "a broken edit was published");
        assert!(self.poll().is_none(), "a broken edit was published");
        self.errors.try_recv().ok()
    }
}

#[test]
fn a_configmap_update_of_the_roots_is_loaded_and_a_broken_edit_keeps_the_roots_in_force() {
    let dir = TempDir::new("bundle-watch");
    let (a, b, c) = (
        CaSigner::generate_for_tests(TD),
        CaSigner::generate_for_tests(TD),
        CaSigner::generate_for_tests(TD),
    );
    let mut volume = ConfigMapVolume::new(&dir.join("cm"), &a.cert_pem());
    let extra = dir.join("extra.pem");
    fs::write(&extra, c.cert_pem()).unwrap();
    let f = follow(vec![volume.file(), extra.clone()]).unwrap();
    let roots = |b: &TrustBundle| b.roots().to_vec();
    assert_eq!(
        roots(&f.watcher.current()),
        vec![a.cert().clone(), c.cert().clone()]
    );
    assert!(f.poll().is_none(), "nothing changed");

    // The rotation's first step: both roots in the ConfigMap.
    volume.update(&format!("{}{}", a.cert_pem(), b.cert_pem()));
    let both = f.poll().expect("the ConfigMap update was not loaded");
    assert_eq!(
        roots(&both),
        vec![a.cert().clone(), b.cert().clone(), c.cert().clone()]
    );

    // Broken edits, each named, none published; the roots in force stay.
    for (text, want) in [
        ("garbage, not PEM", "no PEM CERTIFICATE block"),
        ("", "no PEM CERTIFICATE block"),
        (
            "-----BEGIN CERTIFICATE-----\nAAAA\n",
            "malformed PEM: a section has no END line",
        ),
    ] {
        replace(&extra, text);
        let e = f
            .poll_twice_for_error()
            .unwrap_or_else(|| panic!("{text:?} was not reported"));
        let msg = e.to_string();
        assert!(
            msg.contains(want) && msg.contains("extra.pem"),
            "{text:?}: {msg}"
        );
        assert_eq!(roots(&f.watcher.current()), roots(&both));
    }
    // A file gone is reported too, naming it.
    fs::remove_file(&extra).unwrap();
    let e = f
        .poll_twice_for_error()
        .expect("a missing file was not reported");
    assert!(e.to_string().contains("extra.pem"), "{e}");
    assert_eq!(roots(&f.watcher.current()), roots(&both));

    // Back as it was: nothing to publish (the contents in force).
    fs::write(&extra, c.cert_pem()).unwrap();
    assert!(f.poll().is_none());
    assert!(f.errors.try_recv().is_err());

    // The rotation's last step: the old root removed.
    volume.update(&b.cert_pem());
    let new_only = f.poll().expect("the ConfigMap update was not loaded");
    assert_eq!(roots(&new_only), vec![b.cert().clone(), c.cert().clone()]);
}

#[test]
fn adversarial_roots_that_do_not_load_at_start_are_an_error_naming_the_file() {
    let dir = TempDir::new("bundle-watch-start");
    let file = dir.join("root-cert.pem");
    fs::write(&file, "not a certificate").unwrap();
    let e = follow(vec![file.clone()])
        .err()
        .expect("garbage roots were taken");
    assert!(
        e.to_string().contains("root-cert.pem") && e.to_string().contains("no PEM CERTIFICATE"),
        "{e}"
    );
    let e = follow(vec![dir.join("missing.pem")])
        .err()
        .expect("a missing file was taken");
    assert!(e.to_string().contains("missing.pem"), "{e}");
}
