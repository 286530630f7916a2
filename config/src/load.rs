//! The whole way from a file to a snapshot: read the file (or the embedded
//! default), parse it, apply the environment's overrides, validate
//! ([`MeshConfig::load`], [`MeshConfig::load_str`], [`MeshConfig::validate`]).
//! The snapshot keeps the configuration it came from, for the Kubernetes
//! source to merge cluster objects into.

use std::path::Path;

use crate::env::EnvSource;
use crate::error::ConfigError;
use crate::file::{content_hash, read_file, MeshConfig, EMBEDDED_DEFAULT, EMBEDDED_ORIGIN};
use crate::model::Mesh;
use crate::validate;

impl MeshConfig {
    /// Checks every field and builds the snapshot; `origin` names the file
    /// in errors.
    pub fn validate(&self, origin: &str) -> Result<Mesh, ConfigError> {
        Ok(validate::validate(self, origin, &[], 0)?.with_source(|| self.clone()))
    }

    /// Reads `path` (or the embedded default when `None`), applies `env`'s
    /// overrides and validates. A field set by a variable that fails
    /// validation is reported against the variable.
    pub fn load(path: Option<&Path>, env: &dyn EnvSource) -> Result<Mesh, ConfigError> {
        match path {
            None => MeshConfig::load_str(EMBEDDED_DEFAULT, EMBEDDED_ORIGIN, env),
            Some(p) => {
                let origin = p.display().to_string();
                let bytes = read_file(p, &origin)?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    ConfigError::io(
                        &origin,
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "stream did not contain valid UTF-8",
                        ),
                    )
                })?;
                MeshConfig::load_str(&text, &origin, env)
            }
        }
    }

    /// [`MeshConfig::load`] for text already read.
    pub fn load_str(text: &str, origin: &str, env: &dyn EnvSource) -> Result<Mesh, ConfigError> {
        let mut cfg = MeshConfig::parse(text, origin)?;
        let overrides = cfg.apply_env(env)?;
        let mesh = validate::validate(&cfg, origin, &overrides, content_hash(text.as_bytes()))?;
        Ok(mesh.with_source(|| cfg))
    }
}
