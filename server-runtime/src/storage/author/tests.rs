use std::sync::Arc;

use super::*;
use crate::storage::SqliteStorage;

fn store() -> AuthorStore {
    AuthorStore::new(Arc::new(SqliteStorage::in_memory().unwrap()))
}

#[test]
fn keys_values_and_namespaces_have_typed_limits() {
    let key = "k".repeat(MAX_AUTHOR_KEY_BYTES);
    assert!(AuthorWrite::put("app.notes", &key, vec![0u8; MAX_AUTHOR_VALUE_BYTES]).is_ok());
    let long = "k".repeat(MAX_AUTHOR_KEY_BYTES + 1);
    assert!(matches!(
        AuthorWrite::put("app.notes", &long, b"v".to_vec()),
        Err(AuthorStoreError::KeyTooLong(513))
    ));
    assert!(matches!(
        AuthorWrite::delete("app.notes", &long),
        Err(AuthorStoreError::KeyTooLong(_))
    ));
    assert!(matches!(
        AuthorWrite::put("app.notes", "k", vec![0u8; MAX_AUTHOR_VALUE_BYTES + 1]),
        Err(AuthorStoreError::ValueTooLarge(n)) if n == MAX_AUTHOR_VALUE_BYTES + 1
    ));
    assert!(matches!(
        AuthorWrite::put("app.notes", "a\0b", b"v".to_vec()),
        Err(AuthorStoreError::KeyHasNul)
    ));
    // A multi-byte key counts its bytes, not its characters.
    let wide = "é".repeat(MAX_AUTHOR_KEY_BYTES / 2 + 1);
    assert!(matches!(
        AuthorWrite::put("app.notes", &wide, Vec::new()),
        Err(AuthorStoreError::KeyTooLong(_))
    ));
    for bad in ["", "App", "9lives", "a b", "a/b", &"n".repeat(MAX_AUTHOR_NAMESPACE_BYTES + 1)] {
        assert!(
            matches!(AuthorWrite::put(bad, "k", Vec::new()), Err(AuthorStoreError::Namespace(_))),
            "{bad:?}"
        );
    }
    for good in ["webchat.messages", "a", "x-1_y.z"] {
        assert!(AuthorWrite::put(good, "k", Vec::new()).is_ok(), "{good:?}");
    }
    let error = AuthorWrite::put("app.notes", "k", vec![0u8; MAX_AUTHOR_VALUE_BYTES + 1])
        .unwrap_err()
        .to_string();
    assert!(error.contains("split it"), "the message says what to do: {error}");
}

#[test]
fn the_prefix_upper_bound_is_the_next_byte_string() {
    use crate::storage::write_op_prefix_upper_bound as upper;
    assert_eq!(upper(b""), None);
    assert_eq!(upper(b"room/"), Some(b"room0".to_vec()));
    assert_eq!(upper(&[0x61, 0xff]), Some(vec![0x62]));
    assert_eq!(upper(&[0xff, 0xff]), None);
}

#[tokio::test]
async fn scan_pages_in_key_order_by_prefix_both_ways() {
    let store = store();
    let mut writes = Vec::new();
    for i in (0..25).rev() {
        writes
            .push(AuthorWrite::put("app.notes", &format!("room/{i:03}"), format!("v{i}")).unwrap());
    }
    // Neighbours of the prefix that a scan of `room/` must not return.
    writes.push(AuthorWrite::put("app.notes", "room0", b"after".to_vec()).unwrap());
    writes.push(AuthorWrite::put("app.notes", "room", b"short".to_vec()).unwrap());
    writes.push(AuthorWrite::put("app.other", "room/000", b"other ns".to_vec()).unwrap());
    store.commit(writes).await.unwrap();

    let mut seen = Vec::new();
    let mut scan = AuthorScan::prefix("room/", 10);
    loop {
        let page = store.scan("app.notes", &scan).await.unwrap();
        let Some(last) = page.last() else { break };
        scan = scan.clone().after(last.key.clone());
        seen.extend(page.into_iter().map(|r| r.key));
    }
    let expected: Vec<String> = (0..25).map(|i| format!("room/{i:03}")).collect();
    assert_eq!(seen, expected, "three pages, ascending, only the prefix");

    let newest = store.scan("app.notes", &AuthorScan::prefix("room/", 3).reversed()).await.unwrap();
    let keys: Vec<&str> = newest.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["room/024", "room/023", "room/022"]);
    assert_eq!(newest[0].value, b"v24");
    let older = store
        .scan("app.notes", &AuthorScan::prefix("room/", 2).reversed().after("room/022"))
        .await
        .unwrap();
    let keys: Vec<&str> = older.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["room/021", "room/020"]);

    assert_eq!(store.count("app.notes", "room/").await.unwrap(), 25);
    assert_eq!(store.count("app.notes", "").await.unwrap(), 27);
    assert_eq!(store.count("app.other", "").await.unwrap(), 1);
    assert!(store.scan("app.notes", &AuthorScan::prefix("", 0)).await.unwrap().is_empty());
    assert!(matches!(
        store.scan("app.notes", &AuthorScan::prefix("", MAX_AUTHOR_SCAN_LIMIT + 1)).await,
        Err(AuthorStoreError::ScanTooLarge(_))
    ));

    store.delete_prefix("app.notes", "room/").await.unwrap();
    assert_eq!(store.count("app.notes", "").await.unwrap(), 2, "room and room0 stay");
    assert_eq!(store.count("app.other", "").await.unwrap(), 1);
}

#[tokio::test]
async fn get_put_delete_and_json() {
    let store = store();
    assert_eq!(store.get("app.notes", "k").await.unwrap(), None);
    store.put("app.notes", "k", vec![0u8, 1, 255]).await.unwrap();
    assert_eq!(store.get("app.notes", "k").await.unwrap(), Some(vec![0u8, 1, 255]));
    store
        .commit(vec![
            AuthorWrite::put_json("app.notes", "j", &serde_json::json!({"a": 1})).unwrap(),
        ])
        .await
        .unwrap();
    let value: serde_json::Value = store.get_json("app.notes", "j").await.unwrap().unwrap();
    assert_eq!(value["a"], 1);
    assert!(matches!(
        store.get_json::<serde_json::Value>("app.notes", "k").await,
        Err(AuthorStoreError::Json(_))
    ));
    store.delete("app.notes", "k").await.unwrap();
    assert_eq!(store.get("app.notes", "k").await.unwrap(), None);
}
