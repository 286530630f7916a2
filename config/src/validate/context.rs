//! Where a validation error is reported: against the environment variable
//! that set the field, else against the file.

use std::fmt;

use crate::error::ConfigError;
use crate::model::EnvOverride;

/// The origin of the values being validated.
pub(super) struct Ctx<'a> {
    pub(super) origin: &'a str,
    pub(super) overrides: &'a [EnvOverride],
}

impl Ctx<'_> {
    /// An error at `path`, reported against the environment variable that
    /// set the field, else against the file.
    pub(super) fn err(&self, path: impl Into<String>, problem: impl fmt::Display) -> ConfigError {
        let path = path.into();
        let origin = self
            .overrides
            .iter()
            .find(|o| {
                path.strip_prefix(o.field)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            })
            .map(|o| format!("environment variable {}", o.var))
            .unwrap_or_else(|| self.origin.to_owned());
        ConfigError::Field {
            origin,
            path,
            problem: problem.to_string(),
        }
    }
}

/// A validation result.
pub(super) type Result<T> = std::result::Result<T, ConfigError>;
