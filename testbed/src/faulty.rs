//! A fault-injecting [`StateStore`] wrapper, for tests of what the engine does when the store misbehaves
//! (the failure matrix in docs: commit failure, ambiguous commit, lost race).
//!
//! Faults are queued per operation and consumed one call at a time, so a test names exactly which call goes
//! wrong: `store.fail_next(StoreOp::Save, Fault::Ambiguous, 1)` makes the next `save_if` apply the write and
//! then report the store unavailable, as a commit whose response timed out would. A hook queued with
//! [`FaultyStore::before_next_save`] runs just before the next `save_if` goes on, which is how a test lets
//! another writer slip in between a tick's read and its conditional write.
//!
//! Every call through the wrapper counts as one operation, failed ones included: a request that timed out
//! was still a round trip. Hooks act through their own handles, so their operations are not counted here.

use sql_pseudo_trigger::state::{Etag, StateStore, StoreError, Versioned};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The store operation a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    Load,
    Save,
    List,
}

/// What an injected fault does to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails before reaching the inner store: nothing is read or written. Returns `Unavailable`.
    Unavailable,
    /// Reaches the inner store (a write is applied if its precondition holds), then returns `Unavailable`:
    /// the request worked, its response was lost (Case G, commit response timeout).
    Ambiguous,
    /// Returns `Conflict` without reaching the inner store, as if another writer had moved first.
    Conflict,
    /// No fault: the call reaches the inner store as usual. Queued ahead of a fault, it lets the first calls
    /// through (a crash after the n-th write).
    Pass,
}

/// Runs right before a `save_if`; typically another trigger's tick writing through its own store handle.
pub type SaveHook = Box<dyn FnOnce() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

#[derive(Default)]
struct Plan {
    loads: VecDeque<Fault>,
    saves: VecDeque<Fault>,
    lists: VecDeque<Fault>,
    hooks: VecDeque<SaveHook>,
}

impl Plan {
    fn queue(&mut self, op: StoreOp) -> &mut VecDeque<Fault> {
        match op {
            StoreOp::Load => &mut self.loads,
            StoreOp::Save => &mut self.saves,
            StoreOp::List => &mut self.lists,
        }
    }
}

/// Wraps any store; without queued faults or hooks it behaves exactly like the inner store.
pub struct FaultyStore {
    inner: Arc<dyn StateStore>,
    plan: Mutex<Plan>,
    ops: AtomicU64,
    injected: AtomicU64,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let plan = self.plan.lock().expect("faulty store lock");
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .field("loads", &plan.loads)
            .field("saves", &plan.saves)
            .field("lists", &plan.lists)
            .field("hooks", &plan.hooks.len())
            .finish()
    }
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn StateStore>) -> Self {
        Self { inner, plan: Mutex::default(), ops: AtomicU64::new(0), injected: AtomicU64::new(0) }
    }

    /// The next `n` calls of `op` (after any already queued) fail with `fault`.
    pub fn fail_next(&self, op: StoreOp, fault: Fault, n: usize) {
        self.plan.lock().expect("faulty store lock").queue(op).extend(std::iter::repeat_n(fault, n));
    }

    /// Runs `hook` to completion right before the next `save_if` (after any hooks already queued), before
    /// that call's own fault, if any, is applied.
    pub fn before_next_save<F, Fut>(&self, hook: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let hook: SaveHook = Box::new(move || Box::pin(hook()));
        self.plan.lock().expect("faulty store lock").hooks.push_back(hook);
    }

    /// Faults injected so far (hooks not included).
    pub fn faults_injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Faults still waiting for their call.
    pub fn pending_faults(&self) -> usize {
        let plan = self.plan.lock().expect("faulty store lock");
        plan.loads.len() + plan.saves.len() + plan.lists.len()
    }

    /// Hooks still waiting for a save.
    pub fn pending_hooks(&self) -> usize {
        self.plan.lock().expect("faulty store lock").hooks.len()
    }

    fn next_fault(&self, op: StoreOp) -> Option<Fault> {
        self.ops.fetch_add(1, Ordering::Relaxed);
        let fault = self.plan.lock().expect("faulty store lock").queue(op).pop_front();
        if fault.is_some_and(|f| !matches!(f, Fault::Pass)) {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        fault
    }

    /// Applies `fault` around `call`, the inner store's operation.
    async fn around<T>(
        fault: Option<Fault>,
        what: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match fault {
            None | Some(Fault::Pass) => call.await,
            Some(Fault::Unavailable) => {
                Err(StoreError::Unavailable(format!("injected: {what} failed before reaching the store")))
            }
            Some(Fault::Conflict) => Err(StoreError::Conflict),
            Some(Fault::Ambiguous) => {
                // Whatever the inner store did (applied, or refused with a conflict), the caller never hears it.
                let _ = call.await;
                Err(StoreError::Unavailable(format!("injected: {what} reached the store but its response was lost")))
            }
        }
    }
}

#[async_trait::async_trait]
impl StateStore for FaultyStore {
    async fn load(&self, key: &str) -> Result<Option<Versioned>, StoreError> {
        let fault = self.next_fault(StoreOp::Load);
        Self::around(fault, "load", self.inner.load(key)).await
    }

    async fn save_if(&self, key: &str, bytes: &[u8], expected: Option<&Etag>) -> Result<Etag, StoreError> {
        // Take the hook out before running it: the lock is not held across an await, and a hook that saves
        // through this same store does not run itself again.
        let hook = self.plan.lock().expect("faulty store lock").hooks.pop_front();
        if let Some(hook) = hook {
            hook().await;
        }
        let fault = self.next_fault(StoreOp::Save);
        Self::around(fault, "save", self.inner.save_if(key, bytes, expected)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let fault = self.next_fault(StoreOp::List);
        Self::around(fault, "list", self.inner.list(prefix)).await
    }

    fn operations(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sql_pseudo_trigger::state::MemoryStore;
    use std::sync::atomic::AtomicBool;

    fn faulty() -> (Arc<MemoryStore>, FaultyStore) {
        let inner = Arc::new(MemoryStore::new());
        (inner.clone(), FaultyStore::new(inner))
    }

    #[tokio::test]
    async fn keeps_the_store_contract_when_no_fault_is_queued() {
        crate::store_contract::create_then_cas(&faulty().1).await;
    }

    #[tokio::test]
    async fn unavailable_applies_nothing_and_only_hits_the_next_n_calls() {
        // GIVEN two queued Unavailable faults on saves
        let (inner, store) = faulty();
        store.fail_next(StoreOp::Save, Fault::Unavailable, 2);
        // WHEN three saves are attempted
        let first = store.save_if("k", b"1", None).await;
        let second = store.save_if("k", b"2", None).await;
        let third = store.save_if("k", b"3", None).await;
        // THEN the first two fail without a trace in the inner store, and the third works
        assert!(matches!(first, Err(StoreError::Unavailable(_))));
        assert!(matches!(second, Err(StoreError::Unavailable(_))));
        assert!(third.is_ok());
        assert_eq!(inner.load("k").await.expect("load").expect("exists").bytes, b"3");
        assert_eq!((store.faults_injected(), store.pending_faults(), store.operations()), (2, 0, 3));
    }

    #[tokio::test]
    async fn ambiguous_applies_the_write_and_reports_it_unavailable() {
        // GIVEN an ambiguous fault on the next save
        let (inner, store) = faulty();
        store.fail_next(StoreOp::Save, Fault::Ambiguous, 1);
        // WHEN a document is created
        let result = store.save_if("k", b"applied", None).await;
        // THEN the caller hears Unavailable (an ambiguous error), but the write is durable
        let err = result.expect_err("reported as failed");
        assert!(err.is_ambiguous());
        assert_eq!(inner.load("k").await.expect("load").expect("exists").bytes, b"applied");
    }

    #[tokio::test]
    async fn conflict_and_load_faults_leave_the_document_alone() {
        // GIVEN a document and a conflict queued on saves and an outage on loads
        let (inner, store) = faulty();
        let etag = store.save_if("k", b"one", None).await.expect("create");
        store.fail_next(StoreOp::Save, Fault::Conflict, 1);
        store.fail_next(StoreOp::Load, Fault::Unavailable, 1);
        // WHEN a valid CAS and a load are attempted
        let saved = store.save_if("k", b"two", Some(&etag)).await;
        let loaded = store.load("k").await;
        // THEN both fail as injected and the document is unchanged
        assert!(matches!(saved, Err(StoreError::Conflict)));
        assert!(matches!(loaded, Err(StoreError::Unavailable(_))));
        assert_eq!(inner.load("k").await.expect("load").expect("exists").bytes, b"one");
        assert_eq!(store.load("k").await.expect("load").expect("exists").etag, etag);
    }

    #[tokio::test]
    async fn a_hook_runs_once_right_before_the_next_save_and_can_win_the_race() {
        // GIVEN a document read at etag e1, and a hook that moves it on through the inner store
        let (inner, store) = faulty();
        let e1 = store.save_if("k", b"one", None).await.expect("create");
        let ran = Arc::new(AtomicBool::new(false));
        let (other, flag, read_at) = (inner.clone(), ran.clone(), e1.clone());
        store.before_next_save(move || async move {
            other.save_if("k", b"other writer", Some(&read_at)).await.expect("the other writer wins");
            flag.store(true, Ordering::SeqCst);
        });
        assert!(!ran.load(Ordering::SeqCst), "queued, not run");
        assert_eq!(store.pending_hooks(), 1);
        // WHEN this writer saves at e1
        let lost = store.save_if("k", b"mine", Some(&e1)).await;
        // THEN the hook ran first, so this writer loses; the next save runs no hook
        assert!(ran.load(Ordering::SeqCst));
        assert!(matches!(lost, Err(StoreError::Conflict)));
        assert_eq!(inner.load("k").await.expect("load").expect("exists").bytes, b"other writer");
        assert_eq!(store.pending_hooks(), 0);
        // Hook operations went through the inner handle, so only this wrapper's own 2 calls are counted.
        assert_eq!(store.operations(), 2);
    }
}
