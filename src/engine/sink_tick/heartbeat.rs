//! The heartbeat: renews the lease on the batch in flight while a sink delivers it, writing through the ledger.
//! Dropping it ends the renewals at once: an abandoned tick must not keep a lease alive.

use super::super::document::StateDoc;
use super::super::ledger::{Ledger, Saved};
use super::super::parts::Trigger;
use super::reapply;
use crate::state::Etag;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Lease renewals per lease duration while a delivery runs.
const RENEWALS_PER_LEASE: u32 = 4;

/// What the heartbeat leaves: the latest document this instance wrote, its etag, and why renewing stopped
/// early (another writer changed the state), if it did.
pub(super) struct Heldover {
    pub doc: StateDoc,
    pub etag: Etag,
    pub lost: Option<String>,
}

/// Renews the lease on the batch in flight while a delivery runs.
pub(super) struct Heartbeat {
    held: Arc<Mutex<Heldover>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Heartbeat {
    pub(super) fn start(trigger: &Trigger, doc: StateDoc, etag: Etag) -> Self {
        let held = Arc::new(Mutex::new(Heldover { doc, etag, lost: None }));
        let lease = trigger.config.settings.lease_duration;
        let every = lease / RENEWALS_PER_LEASE;
        if every.is_zero() {
            return Self { held, stop: None, task: None };
        }
        let renewal = Renewal {
            ledger: trigger.ledger.clone(),
            owner: trigger.owner.clone(),
            function: trigger.config.name.clone(),
            lease,
            held: held.clone(),
        };
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(every) => {}
                }
                if !renewal.renew().await {
                    return;
                }
            }
        });
        Self { held, stop: Some(stop), task: Some(task) }
    }

    /// Ends the renewals (a renewal in progress finishes first) and returns where they left the state.
    pub(super) async fn stop(mut self) -> Heldover {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let held = self.held.lock().expect("heartbeat lock");
        Heldover { doc: held.doc.clone(), etag: held.etag.clone(), lost: held.lost.clone() }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One function's lease renewal: everything the heartbeat task needs, owned, so it can outlive a borrow.
struct Renewal {
    ledger: Arc<Ledger>,
    owner: String,
    function: String,
    lease: Duration,
    held: Arc<Mutex<Heldover>>,
}

impl Renewal {
    /// Extends the lease by one lease duration from now. `false`: stop renewing (the state moved on). A renewal
    /// that loses to an operator's write that left the batch and the lease as they were is applied again on top
    /// of it (`reapply`), so a pause during a delivery does not cost the delivery its acknowledgement.
    async fn renew(&self) -> bool {
        let (mut doc, etag) = {
            let held = self.held.lock().expect("heartbeat lock");
            (held.doc.clone(), held.etag.clone())
        };
        let held = doc.clone();
        let mut etag = etag;
        for _ in 0..reapply::ATTEMPTS {
            if !doc.extend_lease(self.ledger.clock().now() + self.lease) {
                return false;
            }
            match self.ledger.save(&mut doc, Some(&etag), &self.owner).await {
                Ok(Saved::Written(etag)) => {
                    self.adopt(doc, etag);
                    return true;
                }
                Ok(Saved::Conflict) => match reapply::reread(&self.ledger, &held, &self.owner).await {
                    Ok(Some((fresh, fresh_etag))) => (doc, etag) = (fresh, fresh_etag),
                    _ => break,
                },
                Err(e) => {
                    // The write may have been applied with its answer lost: if the stored document is this very
                    // write, continue from it rather than conflict with ourselves at the next write.
                    if let Some(etag) = self.ledger.find_own_write(&doc).await {
                        self.adopt(doc, etag);
                        return true;
                    }
                    tracing::warn!(function = %self.function, error = %e, "could not renew the lease; trying again");
                    return true;
                }
            }
        }
        let why = "another writer changed the state during the delivery (an operator, or an instance that took the batch over)";
        tracing::warn!(function = %self.function, "lease renewal refused: {why}");
        self.held.lock().expect("heartbeat lock").lost = Some(why.into());
        false
    }

    fn adopt(&self, doc: StateDoc, etag: Etag) {
        let mut held = self.held.lock().expect("heartbeat lock");
        held.doc = doc;
        held.etag = etag;
    }
}
