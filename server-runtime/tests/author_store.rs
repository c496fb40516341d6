//! The author store (a Connector's own records in the runtime's storage): the same cases on
//! SQLite and on PostgreSQL (feature `postgres`, testkit's server), and, through a running
//! server, writes staged on a Tool call that commit with its tool-call record.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use support::Place;
use xagent_protocol_types::{
    AuthField, AuthFlow, ConnectorChannelId, ErrorCode, PROFILE_IM_V2, Packet, TargetDeclaration,
    TargetType, ToolInvoke, ToolInvokeContext,
};
use xagent_server_runtime::storage::{ToolCallRecord, WriteOp};
use xagent_server_runtime::{
    AuthorScan, AuthorStore, AuthorStoreError, AuthorWrite, Connector, MAX_AUTHOR_KEY_BYTES,
    MAX_AUTHOR_VALUE_BYTES, ToolContext, ToolError, ToolSpec,
};
use xagent_testkit::{ECHO_CARD_ID, ECHO_FLOW, WsClient, has_error, payload_json};

fn keys(records: &[xagent_server_runtime::AuthorRecord]) -> Vec<&str> {
    records.iter().map(|r| r.key.as_str()).collect()
}

mod cases {
    use super::*;

    pub async fn records_round_trip_and_survive_a_restart(place: &Place) {
        {
            let store = AuthorStore::new(place.open().await);
            // Bytes that are not UTF-8 and hold NULs are stored as given.
            store.put("app.notes", "k/1", vec![0u8, 255, 0, 7]).await.unwrap();
            store.put("app.notes", "k/2", b"two".to_vec()).await.unwrap();
            store.put("app.notes", "k/2", b"two again".to_vec()).await.unwrap();
            store.put("app.other", "k/1", b"other".to_vec()).await.unwrap();
        }
        let store = AuthorStore::new(place.open().await);
        assert_eq!(store.get("app.notes", "k/1").await.unwrap(), Some(vec![0u8, 255, 0, 7]));
        assert_eq!(store.get("app.notes", "k/2").await.unwrap(), Some(b"two again".to_vec()));
        assert_eq!(store.get("app.other", "k/1").await.unwrap(), Some(b"other".to_vec()));
        assert_eq!(store.get("app.notes", "k/3").await.unwrap(), None);
        store.delete("app.notes", "k/1").await.unwrap();
        assert_eq!(store.get("app.notes", "k/1").await.unwrap(), None);
        assert_eq!(store.count("app.notes", "").await.unwrap(), 1);
    }

    pub async fn several_records_are_read_at_once_in_the_order_asked(place: &Place) {
        let store = AuthorStore::new(place.open().await);
        store.put("app.notes", "a", b"one".to_vec()).await.unwrap();
        store.put("app.notes", "c", vec![0u8, 3]).await.unwrap();
        store.put("app.other", "b", b"elsewhere".to_vec()).await.unwrap();
        let asked: Vec<String> = ["c", "b", "a", "c"].map(String::from).into();
        assert_eq!(
            store.get_many("app.notes", &asked).await.unwrap(),
            [Some(vec![0u8, 3]), None, Some(b"one".to_vec()), Some(vec![0u8, 3])],
            "in the order asked, a repeat answered twice, another namespace's key not found"
        );
        assert!(store.get_many("app.notes", &[]).await.unwrap().is_empty());
        let too_long = vec!["k".repeat(MAX_AUTHOR_KEY_BYTES + 1)];
        assert!(matches!(
            store.get_many("app.notes", &too_long).await,
            Err(AuthorStoreError::KeyTooLong(_))
        ));
    }

    pub async fn scans_page_in_byte_order_of_keys(place: &Place) {
        let store = AuthorStore::new(place.open().await);
        // Byte order, not a collation: upper case before lower case, `é` (0xC3..) after `z`.
        let names = ["r/B", "r/a", "r/z", "r/é", "r/aa", "r", "r0", "q/x"];
        let writes =
            names.iter().map(|k| AuthorWrite::put("app.notes", k, k.as_bytes().to_vec()).unwrap());
        store.commit(writes.collect()).await.unwrap();
        let all = store.scan("app.notes", &AuthorScan::prefix("r/", 100)).await.unwrap();
        assert_eq!(keys(&all), ["r/B", "r/a", "r/aa", "r/z", "r/é"]);
        let page =
            store.scan("app.notes", &AuthorScan::prefix("r/", 2).after("r/a")).await.unwrap();
        assert_eq!(keys(&page), ["r/aa", "r/z"]);
        let back = store.scan("app.notes", &AuthorScan::prefix("r/", 2).reversed()).await.unwrap();
        assert_eq!(keys(&back), ["r/é", "r/z"]);
        let back = store
            .scan("app.notes", &AuthorScan::prefix("r/", 9).reversed().after("r/aa"))
            .await
            .unwrap();
        assert_eq!(keys(&back), ["r/a", "r/B"]);
        assert_eq!(store.count("app.notes", "r/").await.unwrap(), 5);
        assert_eq!(store.count("app.notes", "r/é").await.unwrap(), 1);
        store.delete_prefix("app.notes", "r/a").await.unwrap();
        let left = store.scan("app.notes", &AuthorScan::prefix("", 100)).await.unwrap();
        assert_eq!(keys(&left), ["q/x", "r", "r/B", "r/z", "r/é", "r0"]);
    }

    pub async fn limits_are_the_same_on_every_backend(place: &Place) {
        let storage = place.open().await;
        let store = AuthorStore::new(storage.clone());
        let longest = "k".repeat(MAX_AUTHOR_KEY_BYTES);
        store.put("app.notes", &longest, vec![1u8; MAX_AUTHOR_VALUE_BYTES]).await.unwrap();
        assert_eq!(
            store.get("app.notes", &longest).await.unwrap().map(|v| v.len()),
            Some(MAX_AUTHOR_VALUE_BYTES)
        );
        assert!(matches!(
            AuthorWrite::put("app.notes", &format!("{longest}k"), Vec::new()),
            Err(AuthorStoreError::KeyTooLong(_))
        ));
        // A raw write past the limits, handed to the backend directly, is refused there too,
        // with the whole submission.
        let oversized = WriteOp::AuthorPut {
            namespace: "app.notes".into(),
            key: "big".into(),
            value: vec![0u8; MAX_AUTHOR_VALUE_BYTES + 1],
        };
        let fine = AuthorWrite::put("app.notes", "fine", b"v".to_vec()).unwrap().into_write_op();
        assert!(storage.commit(vec![fine, oversized]).committed().await.is_err());
        assert_eq!(store.get("app.notes", "fine").await.unwrap(), None);
        let bad_namespace =
            WriteOp::AuthorPut { namespace: "Bad NS".into(), key: "k".into(), value: Vec::new() };
        assert!(storage.commit(vec![bad_namespace]).committed().await.is_err());
    }

    pub async fn author_writes_and_a_tool_call_record_commit_together(place: &Place) {
        let storage = place.open().await;
        let store = AuthorStore::new(storage.clone());
        let channel = ConnectorChannelId::new("cch_t");
        let record = ToolCallRecord {
            fingerprint: "fp".into(),
            result: Some(json!({ "ok": true })),
            error: None,
            completed_at: 5,
        };
        let tool_call = WriteOp::tool_call(&channel, "call_1", &record).unwrap();
        let put = AuthorWrite::put("app.notes", "n/1", b"staged".to_vec()).unwrap();
        storage.commit(vec![put.into_write_op(), tool_call.clone()]).committed().await.unwrap();
        assert!(storage.load_tool_call(&channel, "call_1").await.unwrap().is_some());
        assert_eq!(store.get("app.notes", "n/1").await.unwrap(), Some(b"staged".to_vec()));

        // One refused write in the submission: neither the record nor the author write.
        let second = WriteOp::tool_call(&channel, "call_2", &record).unwrap();
        let put = AuthorWrite::put("app.notes", "n/2", b"staged".to_vec()).unwrap();
        let refused = WriteOp::AuthorDelete { namespace: "app.notes".into(), key: "k".repeat(600) };
        assert!(
            storage.commit(vec![put.into_write_op(), second, refused]).committed().await.is_err()
        );
        assert!(storage.load_tool_call(&channel, "call_2").await.unwrap().is_none());
        assert_eq!(store.get("app.notes", "n/2").await.unwrap(), None);
    }
}

support::contract!(
    records_round_trip_and_survive_a_restart,
    several_records_are_read_at_once_in_the_order_asked,
    scans_page_in_byte_order_of_keys,
    limits_are_the_same_on_every_backend,
    author_writes_and_a_tool_call_record_commit_together,
);

/// The namespace the Tool below writes to; a trigger makes SQLite refuse it in the failure
/// test.
const REFUSED: &str = "test.refused";

#[derive(Deserialize, JsonSchema)]
struct NoteArgs {
    /// The note.
    text: String,
    /// Where to keep it.
    namespace: String,
}

/// Runs of the Tool and of its after-commit callbacks.
#[derive(Clone, Default)]
struct Counts {
    runs: Arc<AtomicUsize>,
    shown: Arc<AtomicUsize>,
}

fn note_connector(counts: &Counts) -> Connector {
    let counts = counts.clone();
    Connector::builder(ECHO_CARD_ID, "Notes", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "echo", "Echo"))
        .profile(PROFILE_IM_V2)
        .im_target(support::AcceptAll)
        .auth_flow_with(
            AuthFlow::form(
                ECHO_FLOW,
                TargetType::Im,
                "Sign in",
                vec![AuthField::password("token", "Token").required()],
            ),
            support::InstantAuth,
        )
        .tool::<NoteArgs, _, _, _>(
            ToolSpec::new("note_add", concat!("Add a note", "\n", "Keeps a note.")),
            move |ctx: ToolContext, args: NoteArgs| {
                let counts = counts.clone();
                async move {
                    let run = counts.runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let write = AuthorWrite::put(&args.namespace, &args.text, format!("run {run}"))
                        .map_err(|e| ToolError::failed(e.to_string()))?;
                    ctx.stage(write);
                    if args.text == "then fail" {
                        return Err(ToolError::failed("failed after staging"));
                    }
                    let shown = counts.shown.clone();
                    ctx.after_commit(move || {
                        shown.fetch_add(1, Ordering::SeqCst);
                    });
                    Ok(json!({ "run": run }))
                }
            },
        )
        .build()
        .unwrap()
}

async fn serve(dir: &std::path::Path, counts: &Counts) -> support::Custom {
    support::serve_custom_in(note_connector(counts), dir).await
}

fn note(
    c: &mut WsClient,
    channel: &ConnectorChannelId,
    call_id: &str,
    ns: &str,
    text: &str,
) -> Packet {
    let args: Map<String, Value> =
        json!({ "connector_channel_id": channel, "text": text, "namespace": ns })
            .as_object()
            .cloned()
            .unwrap();
    c.request(
        ToolInvoke::new("note_add", args).with_context(ToolInvokeContext::with_call_id(call_id)),
        Some(channel),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_write_commits_with_the_tool_call_record_and_a_repeat_after_a_restart_finds_both()
{
    let dir = tempfile::tempdir().unwrap();
    let counts = Counts::default();
    let served = serve(dir.path(), &counts).await;
    let mut c = served.client().await;
    let connector_id =
        payload_json(&c.hello(None).await)["connector_id"].as_str().unwrap().to_owned();
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let ack = note(&mut c, &channel, "call_1", "test.notes", "first");
    let ack = c.call(ack).await;
    assert_eq!(payload_json(&ack)["result"], json!({ "run": 1 }), "{ack:?}");
    // The ack came after the commit: the write is readable, the callback ran.
    let store = served.server.handle().author_store();
    assert_eq!(store.get("test.notes", "first").await.unwrap(), Some(b"run 1".to_vec()));
    assert_eq!(counts.shown.load(Ordering::SeqCst), 1);
    c.close().await;
    served.stop().await;

    let served = serve(dir.path(), &counts).await;
    let mut c = served.client().await;
    c.hello(Some(&connector_id)).await;
    c.open_channel(Some(&channel)).await;
    let repeat = note(&mut c, &channel, "call_1", "test.notes", "first");
    let repeat = c.call(repeat).await;
    assert_eq!(payload_json(&repeat)["result"], json!({ "run": 1 }), "from the record: {repeat:?}");
    assert_eq!(counts.runs.load(Ordering::SeqCst), 1, "the Tool did not run again");
    let store = served.server.handle().author_store();
    assert_eq!(store.get("test.notes", "first").await.unwrap(), Some(b"run 1".to_vec()));
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_commit_acknowledges_neither_the_call_nor_its_staged_write() {
    let dir = tempfile::tempdir().unwrap();
    let counts = Counts::default();
    let served = serve(dir.path(), &counts).await;
    // A real refusal by the database: a trigger aborts any insert into the refused namespace.
    let db =
        rusqlite::Connection::open(dir.path().join(xagent_server_runtime::storage::DATABASE_FILE))
            .unwrap();
    db.execute_batch(&format!(
        "CREATE TRIGGER refuse BEFORE INSERT ON author_records WHEN NEW.namespace = '{REFUSED}'
         BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;"
    ))
    .unwrap();
    let mut c = served.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    c.sign_in(&channel, "tok").await;
    let ack = note(&mut c, &channel, "call_f", REFUSED, "lost");
    let ack = c.call(ack).await;
    assert!(has_error(&ack, &ErrorCode::InternalError), "{ack:?}");
    let storage = served.server.handle().author_store();
    assert_eq!(storage.get(REFUSED, "lost").await.unwrap(), None);
    assert_eq!(counts.shown.load(Ordering::SeqCst), 0, "nothing shown for a failed commit");
    // No tool-call record either: a repeat runs the Tool again (and fails the same way).
    let again = note(&mut c, &channel, "call_f", REFUSED, "lost");
    let again = c.call(again).await;
    assert!(has_error(&again, &ErrorCode::InternalError), "{again:?}");
    assert_eq!(counts.runs.load(Ordering::SeqCst), 2);
    // A call that fails after staging keeps nothing of what it staged.
    let failing = note(&mut c, &channel, "call_g", "test.notes", "then fail");
    let failing = c.call(failing).await;
    assert!(has_error(&failing, &ErrorCode::ToolInvokeFailed), "{failing:?}");
    assert_eq!(storage.get("test.notes", "then fail").await.unwrap(), None);
    assert_eq!(counts.runs.load(Ordering::SeqCst), 3);
    // Once the database takes it, the repeat succeeds and both are stored.
    db.execute_batch("DROP TRIGGER refuse").unwrap();
    let ok = note(&mut c, &channel, "call_f", REFUSED, "lost");
    let ok = c.call(ok).await;
    assert_eq!(payload_json(&ok)["result"], json!({ "run": 4 }), "{ok:?}");
    assert_eq!(storage.get(REFUSED, "lost").await.unwrap(), Some(b"run 4".to_vec()));
    assert_eq!(counts.shown.load(Ordering::SeqCst), 1);
    served.stop().await;
}
