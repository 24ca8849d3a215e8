//! The blob state store against a real Azurite: the `StateStore` contract, CAS under contention, the refusal
//! of a wrong key, an outage, and the round-trip latency of load and save.
//!
//! Azurite comes from `TEST_AZURITE_CONNECTION_STRING` when set; otherwise each test starts its own
//! in-memory server through the test bed (`embedded::Azurite`), so tests stay independent and can stop it.

use sql_pseudo_trigger::config::Secret;
use sql_pseudo_trigger::state::{BlobStore, Etag, StateStore, StoreError};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEV_KEY: &str = testbed::embedded::DEV_ACCOUNT_KEY;

/// Azurite for one test: `TEST_AZURITE_CONNECTION_STRING` when set, else a private in-memory server from the
/// test bed (a parent-death-signalled child), so a test may stop it.
struct Azurite {
    server: Option<testbed::embedded::Azurite>,
    connection_string: String,
}

impl Azurite {
    fn start() -> Azurite {
        let _ = rustls::crypto::ring::default_provider().install_default();
        if let Ok(cs) = std::env::var("TEST_AZURITE_CONNECTION_STRING") {
            return Azurite { server: None, connection_string: cs };
        }
        let server = testbed::embedded::Azurite::start().expect("Azurite starts (scripts/test installs it)");
        let connection_string = server.connection_string();
        Azurite { server: Some(server), connection_string }
    }

    /// Stops the server; a shared server from the environment is replaced by an endpoint nobody listens on.
    fn stop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.stop().expect("Azurite stops");
        } else {
            let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
            self.connection_string = format!(
                "AccountName=devstoreaccount1;AccountKey={DEV_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1"
            );
        }
    }

    fn store(&self, container: &str) -> BlobStore {
        BlobStore::from_connection_string(&Secret::new(self.connection_string.clone()), container).expect("store")
    }
}

/// A container name no other test (or earlier run against a shared Azurite) uses.
fn fresh_container(label: &str) -> String {
    format!("{label}-{}", uuid::Uuid::new_v4().simple())
}

#[tokio::test]
async fn keeps_the_state_store_contract_against_azurite() {
    // GIVEN a fresh container (a missing container reads as not found)
    let azurite = Azurite::start();
    let store = azurite.store(&fresh_container("contract"));

    // WHEN / THEN: the contract every store keeps
    testbed::store_contract::create_then_cas(&store).await;
}

#[tokio::test]
async fn an_etag_for_a_deleted_or_unknown_version_is_a_conflict_and_listing_a_missing_container_is_empty() {
    let azurite = Azurite::start();
    let store = azurite.store(&fresh_container("edges"));
    assert_eq!(store.list("").await.expect("list"), Vec::<String>::new());

    // GIVEN no blob at all, WHEN replacing a version that never existed THEN another writer "moved first".
    let made_up = Etag("\"0x8DEADBEEF\"".into());
    assert!(matches!(store.save_if("edges/a.json", b"x", Some(&made_up)).await, Err(StoreError::Conflict)));
    // AND an empty document round-trips with its etag.
    let etag = store.save_if("edges/empty.json", b"", None).await.expect("create empty");
    let got = store.load("edges/empty.json").await.expect("load").expect("exists");
    assert_eq!((got.bytes.len(), got.etag), (0, etag));
    // AND a key that Blob Storage would rename is refused before any request.
    let before = store.operations();
    assert!(matches!(store.load("a/../b").await, Err(StoreError::Refused(_))));
    assert_eq!(store.operations(), before);
}

#[tokio::test]
async fn concurrent_cas_from_eight_tasks_has_exactly_one_winner_per_round() {
    // GIVEN one blob and eight writers sharing a store
    let azurite = Azurite::start();
    let store = Arc::new(azurite.store(&fresh_container("race")));
    let key = "race/fn.json";
    let mut expected: Option<Etag> = None;

    for round in 0..5 {
        // WHEN all eight write against the same expected version
        let writers: Vec<_> = (0..8)
            .map(|task| {
                let store = store.clone();
                let expected = expected.clone();
                tokio::spawn(async move {
                    let body = format!("{{\"round\":{round},\"task\":{task}}}");
                    (body.clone(), store.save_if(key, body.as_bytes(), expected.as_ref()).await)
                })
            })
            .collect();
        let mut winners = Vec::new();
        for writer in writers {
            match writer.await.expect("task") {
                (body, Ok(etag)) => winners.push((body, etag)),
                (_, Err(StoreError::Conflict)) => {}
                (_, Err(other)) => panic!("round {round}: unexpected error {other}"),
            }
        }

        // THEN exactly one wins, and the blob holds the winner's bytes at the winner's etag
        assert_eq!(winners.len(), 1, "round {round}: winners {winners:?}");
        let (body, etag) = winners.remove(0);
        let got = store.load(key).await.expect("load").expect("exists");
        assert_eq!((got.bytes, &got.etag), (body.into_bytes(), &etag), "round {round}");
        expected = Some(etag);
    }
}

#[tokio::test]
async fn a_wrong_account_key_is_refused_with_a_clear_message() {
    // GIVEN a connection string whose key is valid base64 but not the account's
    let azurite = Azurite::start();
    let wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ==";
    let cs = azurite.connection_string.replace(DEV_KEY, wrong);
    let store = BlobStore::from_connection_string(&Secret::new(cs), &fresh_container("wrongkey")).expect("parses");

    // WHEN writing, reading and listing THEN each is refused, naming the status and what to check, never the key
    for result in [
        store.save_if("k.json", b"x", None).await.map(|_| ()),
        store.load("k.json").await.map(|_| ()),
        store.list("").await.map(|_| ()),
    ] {
        let Err(StoreError::Refused(message)) = result else { panic!("expected a refusal, got {result:?}") };
        assert!(message.contains("403") && message.contains("AccountKey"), "{message}");
        assert!(!message.contains(wrong) && !message.contains(DEV_KEY), "{message}");
    }
}

#[tokio::test]
async fn a_shared_access_signature_connection_string_works() {
    // GIVEN an account SAS (blob service; service, container and object; read/add/create/write/delete/list)
    // signed with the development key as documented for versions 2020-12-06 and later
    let azurite = Azurite::start();
    let endpoint = azurite
        .connection_string
        .split(';')
        .find_map(|part| part.strip_prefix("BlobEndpoint="))
        .expect("the test connection string has a BlobEndpoint")
        .to_string();
    let (sp, ss, srt, se, sv) = ("racwdl", "b", "sco", "2099-01-01T00:00:00Z", "2021-08-06");
    let string_to_sign = format!("devstoreaccount1\n{sp}\n{ss}\n{srt}\n\n{se}\n\n\n{sv}\n\n");
    let sig = {
        use base64::Engine as _;
        use hmac::Mac as _;
        let key = base64::engine::general_purpose::STANDARD.decode(DEV_KEY).expect("base64 key");
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("any key length");
        mac.update(string_to_sign.as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        sig.replace('+', "%2B").replace('/', "%2F").replace('=', "%3D")
    };
    let cs =
        format!("BlobEndpoint={endpoint};SharedAccessSignature=sv={sv}&ss={ss}&srt={srt}&sp={sp}&se={se}&sig={sig}");
    let store = BlobStore::from_connection_string(&Secret::new(cs), &fresh_container("sas")).expect("parses");

    // WHEN creating, replacing and listing THEN it behaves like the key-authorized store
    let e1 = store.save_if("sas/a.json", b"1", None).await.expect("create");
    store.save_if("sas/a.json", b"2", Some(&e1)).await.expect("cas");
    assert!(matches!(store.save_if("sas/a.json", b"3", Some(&e1)).await, Err(StoreError::Conflict)));
    assert_eq!(store.load("sas/a.json").await.expect("load").expect("exists").bytes, b"2");
    assert_eq!(store.list("sas/").await.expect("list"), vec!["sas/a.json".to_string()]);
    assert!(!store.describe().contains(&sig));
}

#[tokio::test]
async fn a_stopped_azurite_is_unavailable_quickly_and_never_a_panic() {
    // GIVEN a store that has written once
    let mut azurite = Azurite::start();
    let container = fresh_container("outage");
    let etag = azurite.store(&container).save_if("k.json", b"x", None).await.expect("create");

    // WHEN storage goes away
    azurite.stop();
    let store = azurite.store(&container);
    let started = Instant::now();

    // THEN every operation is Unavailable (ambiguous for writes), within the bounded retries
    let results = [
        store.load("k.json").await.map(|_| ()),
        store.save_if("k.json", b"y", Some(&etag)).await.map(|_| ()),
        store.list("").await.map(|_| ()),
    ];
    for result in results {
        let Err(error) = result else { panic!("expected an error, got {result:?}") };
        assert!(matches!(error, StoreError::Unavailable(_)), "{error}");
        assert!(error.is_ambiguous());
    }
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
}

#[tokio::test]
async fn measures_load_and_save_round_trips() {
    // Not an assertion on speed (shared CI machines vary): prints p50/p95 for the report.
    let azurite = Azurite::start();
    let store = azurite.store(&fresh_container("latency"));
    let key = "latency/fn.json";
    let doc = vec![b'x'; 1024];
    let mut etag = store.save_if(key, &doc, None).await.expect("create");
    let (mut saves, mut loads) = (Vec::with_capacity(200), Vec::with_capacity(200));
    for _ in 0..200 {
        let t = Instant::now();
        etag = store.save_if(key, &doc, Some(&etag)).await.expect("cas");
        saves.push(t.elapsed());
        let t = Instant::now();
        assert!(store.load(key).await.expect("load").is_some());
        loads.push(t.elapsed());
    }
    let pct = |v: &mut Vec<Duration>, p: usize| {
        v.sort();
        v[(v.len() * p / 100).min(v.len() - 1)]
    };
    println!(
        "azurite round trips over 200 ops (1 KiB doc): load p50 {:?} p95 {:?}; save_if p50 {:?} p95 {:?}",
        pct(&mut loads, 50),
        pct(&mut loads, 95),
        pct(&mut saves, 50),
        pct(&mut saves, 95)
    );
}
