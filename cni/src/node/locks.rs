//! The agent's locking, a leaf: a poisoned lock is used as it is, and one
//! enroll or unenroll of a pod runs at a time ([`PodLocks`]).

use std::collections::HashSet;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::error::EnrollError;

/// How long an enroll/unenroll waits for another one of the same pod.
const BUSY_WAIT: Duration = Duration::from_secs(20);

/// A poisoned lock only means a thread panicked while holding it; the data
/// (maps of pods and connections) stays consistent at every await point.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The pods an enroll or unenroll is running for.
#[derive(Debug, Default)]
pub(super) struct PodLocks {
    busy: Mutex<HashSet<String>>,
    released: Condvar,
}

/// Held while one enroll/unenroll of a pod runs.
pub(super) struct PodGuard<'a> {
    locks: &'a PodLocks,
    uid: String,
}

impl Drop for PodGuard<'_> {
    fn drop(&mut self) {
        lock(&self.locks.busy).remove(&self.uid);
        self.locks.released.notify_all();
    }
}

impl PodLocks {
    /// Waits (up to 20 s) until no other enroll/unenroll of `uid` runs, and
    /// holds the pod until the guard drops.
    pub(super) fn lock(&self, uid: &str) -> Result<PodGuard<'_>, EnrollError> {
        let deadline = Instant::now() + BUSY_WAIT;
        let mut busy = lock(&self.busy);
        while busy.contains(uid) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(EnrollError::Busy {
                    uid: uid.to_string(),
                    secs: BUSY_WAIT.as_secs(),
                });
            }
            busy = self
                .released
                .wait_timeout(busy, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        busy.insert(uid.to_string());
        Ok(PodGuard {
            locks: self,
            uid: uid.to_string(),
        })
    }

    /// Holds `uid` if no enroll/unenroll of it runs now; never waits.
    pub(super) fn try_lock(&self, uid: &str) -> Option<PodGuard<'_>> {
        lock(&self.busy).insert(uid.to_string()).then(|| PodGuard {
            locks: self,
            uid: uid.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_is_held_until_its_guard_drops() {
        let locks = PodLocks::default();
        let g = locks.lock("u").unwrap();
        let other = locks.lock("v").expect("another pod is independent");
        drop(other);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| locks.lock("u").map(|_| ()));
            std::thread::sleep(Duration::from_millis(50));
            drop(g);
            waiter.join().unwrap().expect("free once the guard dropped");
        });
    }
}
