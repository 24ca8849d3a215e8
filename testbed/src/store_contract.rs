//! The state store contract (see `sql_pseudo_trigger::state`): every store's tests run these assertions, the
//! memory and file stores in `tests/state_stores.rs`, Azure Blob against Azurite in `tests/blob_store.rs`.

use sql_pseudo_trigger::state::{StateStore, StoreError};

/// Create, conditional replace, refusal of a stale or blind write, and sorted listing, on a fresh store.
pub async fn create_then_cas(store: &dyn StateStore) {
    let key = "contract/fn.json";
    assert!(store.load(key).await.expect("load").is_none());
    let e1 = store.save_if(key, b"one", None).await.expect("create");
    assert!(matches!(store.save_if(key, b"again", None).await, Err(StoreError::Conflict)));
    let got = store.load(key).await.expect("load").expect("exists");
    assert_eq!(got.bytes, b"one");
    assert_eq!(got.etag, e1);
    let e2 = store.save_if(key, b"two", Some(&e1)).await.expect("cas");
    assert_ne!(e1, e2);
    assert!(matches!(store.save_if(key, b"stale", Some(&e1)).await, Err(StoreError::Conflict)));
    assert_eq!(store.load(key).await.expect("load").expect("exists").bytes, b"two");
    store.save_if("contract/q/2.json", b"q", None).await.expect("create");
    store.save_if("contract/q/1.json", b"q", None).await.expect("create");
    assert_eq!(
        store.list("contract/q/").await.expect("list"),
        vec!["contract/q/1.json".to_string(), "contract/q/2.json".to_string()]
    );
    assert!(store.operations() >= 9);
}
