//! Fakes for tests of this crate and (with the `testing` feature) of others: a
//! scripted, recording fake of the node agent ([`FakeAgent`]). The fake
//! Kubernetes API server is the test bed's (`ringway_testbed::kube_api`).

use std::collections::VecDeque;
use std::sync::Mutex;

use crate::agent::{
    AddRequest, Added, Agent, AgentError, CheckRequest, DelRequest, GcRequest, StatusRequest,
};

/// One call the fake received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// `add`.
    Add(AddRequest),
    /// `del`.
    Del(DelRequest),
    /// `check`.
    Check(CheckRequest),
    /// `status`.
    Status(StatusRequest),
    /// `gc`.
    Gc(GcRequest),
}

/// Answers `Ok(())` unless answers were queued with [`FakeAgent::answer`] (used in
/// order, one per call, whatever the method) or a standing failure was set with
/// [`FakeAgent::always`]. Records every call.
#[derive(Debug, Default)]
pub struct FakeAgent {
    queued: Mutex<VecDeque<Result<(), AgentError>>>,
    always: Mutex<Option<AgentError>>,
    pass_through: Mutex<Option<String>>,
    calls: Mutex<Vec<Call>>,
}

impl FakeAgent {
    /// A fake that accepts everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fake that fails every call with `err`.
    pub fn failing(err: AgentError) -> Self {
        let fake = Self::default();
        fake.always(err);
        fake
    }

    /// A fake that fails every call with [`AgentError::Unavailable`].
    pub fn unavailable(reason: &str) -> Self {
        Self::failing(AgentError::Unavailable {
            reason: reason.to_owned(),
        })
    }

    /// Queues an answer. Queued answers are used first, one per call, in order.
    pub fn answer(&self, result: Result<(), AgentError>) {
        lock(&self.queued).push_back(result);
    }

    /// Fails every call without a queued answer with `err`.
    pub fn always(&self, err: AgentError) {
        *lock(&self.always) = Some(err);
    }

    /// Answers every successful `add` with [`Added::PassedThrough`]`(why)`.
    pub fn pass_through(&self, why: &str) {
        *lock(&self.pass_through) = Some(why.to_owned());
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    fn record(&self, call: Call) -> Result<(), AgentError> {
        lock(&self.calls).push(call);
        if let Some(answer) = lock(&self.queued).pop_front() {
            return answer;
        }
        match &*lock(&self.always) {
            Some(err) => Err(err.clone()),
            None => Ok(()),
        }
    }
}

/// A poisoned lock only means another test thread panicked: keep going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Agent for FakeAgent {
    fn add(&self, req: &AddRequest) -> Result<Added, AgentError> {
        self.record(Call::Add(req.clone()))?;
        Ok(match &*lock(&self.pass_through) {
            Some(why) => Added::PassedThrough(why.clone()),
            None => Added::Captured,
        })
    }
    fn del(&self, req: &DelRequest) -> Result<(), AgentError> {
        self.record(Call::Del(req.clone()))
    }
    fn check(&self, req: &CheckRequest) -> Result<(), AgentError> {
        self.record(Call::Check(req.clone()))
    }
    fn status(&self, req: &StatusRequest) -> Result<(), AgentError> {
        self.record(Call::Status(req.clone()))
    }
    fn gc(&self, req: &GcRequest) -> Result<(), AgentError> {
        self.record(Call::Gc(req.clone()))
    }
}
