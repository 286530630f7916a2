//! A scratch directory per test: `tempfile`'s, made with `mkdtemp`
//! semantics (a new directory with a random name, mode 0700, never a
//! predictable path that another test or user could have made first), so
//! tests of one name in one process, or in two processes, never share one.

use std::path::{Path, PathBuf};

/// `$TMPDIR/ringway-<test>-<random>`, new and private when made, removed
/// (with its contents) on drop.
#[derive(Debug)]
pub struct TempDir(tempfile::TempDir);

impl TempDir {
    /// Panics when the directory cannot be made (a test cannot go on).
    pub fn new(test: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt as _;
        tempfile::Builder::new()
            .prefix(&format!("ringway-{test}-"))
            // Private: tempfile leaves a new directory to the umask.
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .map(TempDir)
            .unwrap_or_else(|e| panic!("creating a scratch dir for {test}: {e}"))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        self.0.path()
    }

    /// `name` inside it.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.path().join(name)
    }
}

/// A `TempDir` is used where a path is: `&dir` is a `&Path`.
impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        self.0.path()
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        self.0.path()
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::TempDir;

    /// Two directories of one test name are two directories, each new and
    /// private (0700); both are gone once dropped.
    #[test]
    fn each_dir_is_new_private_and_removed() {
        let (a, b) = (TempDir::new("same"), TempDir::new("same"));
        assert_ne!(a.path(), b.path());
        for d in [&a, &b] {
            let meta = std::fs::symlink_metadata(d.path()).unwrap();
            assert!(meta.is_dir() && !meta.file_type().is_symlink());
            assert_eq!(meta.permissions().mode() & 0o777, 0o700);
            let name = d.path().file_name().unwrap().to_string_lossy().into_owned();
            assert!(name.starts_with("ringway-same-"), "{name}");
        }
        std::fs::write(a.join("f"), b"x").unwrap();
        let (pa, pb) = (a.path().to_path_buf(), b.path().to_path_buf());
        drop((a, b));
        assert!(!pa.exists() && !pb.exists());
    }
}
