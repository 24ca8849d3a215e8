//! The memory and file state stores keep the store contract (`testbed::store_contract`); Azure Blob keeps it
//! against Azurite in `tests/blob_store.rs`.

use sql_pseudo_trigger::state::{FileStore, MemoryStore};

#[tokio::test]
async fn the_memory_store_keeps_the_store_contract() {
    testbed::store_contract::create_then_cas(&MemoryStore::new()).await;
}

#[tokio::test]
async fn the_file_store_keeps_the_store_contract() {
    let root = testbed::embedded::ScratchDir::new("file-store-contract").expect("a scratch directory");
    testbed::store_contract::create_then_cas(&FileStore::new(root.path())).await;
}
