//! The background thread behind [`ConfigWatcher`](crate::ConfigWatcher) and
//! the Kubernetes `MeshWatch`: stopped by dropping the sending end of a
//! channel its body listens to, and joined when stopped or dropped.

use std::thread::JoinHandle;

/// A named thread and its stop signal `S`, the sending end of a channel
/// whose receiving end the thread's body holds: the body must return once
/// that receiver sees the sender gone.
#[derive(Debug)]
pub(crate) struct ControlThread<S> {
    stop: Option<S>,
    thread: Option<JoinHandle<()>>,
}

impl<S> ControlThread<S> {
    /// Runs `body` on a new thread called `name`.
    pub(crate) fn spawn(
        name: &str,
        stop: S,
        body: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<ControlThread<S>> {
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(body)?;
        Ok(ControlThread {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The stop signal while the thread runs (a channel's sender may carry
    /// requests to the body too).
    pub(crate) fn signal(&self) -> Option<&S> {
        self.stop.as_ref()
    }

    /// Drops the stop signal and waits for the thread (and whatever callback
    /// it is running). Idempotent.
    pub(crate) fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // A panicking callback ended the thread already; nothing to undo.
            let _ = thread.join();
        }
    }
}

impl<S> Drop for ControlThread<S> {
    fn drop(&mut self) {
        self.stop();
    }
}
