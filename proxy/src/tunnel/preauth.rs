//! Before authentication on a pod's tunnel listener (15008): its places,
//! capped per pod and per source (`proxy.hbone.maxPreauthPerPod`,
//! `maxPreauthPerSource`), one [`PreauthSlots`] per pod shared by every
//! worker serving it, and the guard that gives a place back.

use std::net::IpAddr;
use std::sync::Arc;

use ringway_config::HboneSettings;

use super::refusal::HboneRefusal;

/// A pod's tunnel connections before authentication (TLS and the HTTP/2
/// preface not yet through), in total and per source; one per pod, shared
/// by every worker serving it. While the pod is at its cap its listeners
/// stop accepting ([`PreauthSlots::room`]): what comes beyond waits in the
/// kernel's backlog and costs the proxy nothing, rather than being accepted
/// only to be reset.
#[derive(Debug, Default)]
pub struct PreauthSlots {
    counts: std::sync::Mutex<PodPreauth>,
    /// Woken when a place comes free (and when the pod goes).
    freed: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct PodPreauth {
    total: u32,
    by_source: std::collections::HashMap<IpAddr, u32>,
}

impl PreauthSlots {
    /// How many connections of the pod are before authentication.
    pub fn held(&self) -> u32 {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).total
    }

    /// Returns once the pod has fewer than `per_pod` connections before
    /// authentication, or `gone` says its listeners are closing (checked on
    /// every place freed and on [`PreauthSlots::wake_all`], which closing a
    /// pod's listeners calls). Cancel-safe.
    pub async fn room(&self, per_pod: u32, gone: impl Fn() -> bool) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check: a place freed in between wakes it.
            freed.as_mut().enable();
            if self.held() < per_pod || gone() {
                return;
            }
            freed.await;
        }
    }

    /// Wakes every listener waiting for a place (the pod is going).
    pub fn wake_all(&self) {
        self.freed.notify_waiters();
    }
}

/// One admitted pre-authentication connection; dropping it (once the
/// preface arrived, or the connection ended) gives the place back.
#[derive(Debug)]
pub struct PreauthGuard {
    slots: Arc<PreauthSlots>,
    src: IpAddr,
}

impl Drop for PreauthGuard {
    fn drop(&mut self) {
        {
            let mut p = self.slots.counts.lock().unwrap_or_else(|p| p.into_inner());
            p.total = p.total.saturating_sub(1);
            if let Some(n) = p.by_source.get_mut(&self.src) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    p.by_source.remove(&self.src);
                }
            }
        }
        // One place, one waiting listener (a stored permit when none waits
        // costs one extra check later).
        self.slots.freed.notify_one();
    }
}

/// Admits one more connection of `src` to the pod of `slots` before
/// authentication, under `limits` (`proxy.hbone`), or names the cap it
/// would pass.
pub fn admit_preauth(
    limits: &HboneSettings,
    slots: &Arc<PreauthSlots>,
    src: IpAddr,
) -> Result<PreauthGuard, HboneRefusal> {
    let src = src.to_canonical();
    let mut p = slots.counts.lock().unwrap_or_else(|p| p.into_inner());
    if p.total >= limits.max_preauth_per_pod {
        return Err(HboneRefusal::PerPod);
    }
    let n = p.by_source.entry(src).or_default();
    if *n >= limits.max_preauth_per_source {
        return Err(HboneRefusal::PerSource);
    }
    *n += 1;
    p.total += 1;
    Ok(PreauthGuard {
        slots: slots.clone(),
        src,
    })
}
