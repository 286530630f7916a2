//! The trust bundle's files followed while running: [`BundleFiles`] is
//! what a [`ringway_config::FileWatcher`] loads them with.

use std::path::{Path, PathBuf};

use crate::ca::TrustBundle;
use crate::error::IdentityError;

/// A trust bundle's files as a [`ringway_config::FileWatcher`] loads
/// them (the roots rotated: a ConfigMap updated, a file replaced): every
/// certificate of every file, in order. A file that cannot be read, is too
/// large, holds no certificate or one rustls cannot use as a root fails the
/// whole load, naming the file: the roots in force stay.
#[derive(Debug, Clone, Copy, Default)]
pub struct BundleFiles;

impl ringway_config::Loader for BundleFiles {
    type Output = TrustBundle;
    type Error = IdentityError;

    fn read(&self, path: &Path) -> Result<Vec<u8>, IdentityError> {
        Ok(crate::ca::read(path)?)
    }

    fn load(&self, paths: &[PathBuf], contents: &[Vec<u8>]) -> Result<TrustBundle, IdentityError> {
        let mut bundle = TrustBundle::new();
        for (file, bytes) in paths.iter().zip(contents) {
            bundle.add_pem(file, bytes)?;
        }
        Ok(bundle)
    }
}
