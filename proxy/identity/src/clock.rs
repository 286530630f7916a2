//! Where identity management reads the time: [`Clock`], the system's
//! ([`SystemClock`]) and a manual one for tests ([`ManualClock`]). A leaf:
//! the manager and the certificate verifiers both take one.

use std::fmt;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// Where the manager reads the time: issuance, rotation and certificate
/// validity checks all use it. [`SystemClock`] in production.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> SystemTime;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told (tests).
#[derive(Debug)]
pub struct ManualClock(Mutex<SystemTime>);

impl ManualClock {
    /// Starts at `now`.
    pub fn new(now: SystemTime) -> Self {
        ManualClock(Mutex::new(now))
    }

    /// Moves forward.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
