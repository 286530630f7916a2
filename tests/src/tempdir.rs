//! A scratch directory per test.

use std::path::{Path, PathBuf};

/// `$TMPDIR/ringway-<test>-<pid>`, emptied when made and removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Panics when the directory cannot be made (a test cannot go on).
    pub fn new(test: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("ringway-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)
            .unwrap_or_else(|e| panic!("creating the scratch dir {}: {e}", d.display()));
        TempDir(d)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// `name` inside it.
    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `TempDir` is used where a path is: `&dir` is a `&Path`.
impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}
