//! `xagent-connector migrate-state`: a state directory made by a real im.webchat run on
//! SQLite (a channel signed in, a tool call, an outbox message, a file) moves into testkit's
//! PostgreSQL; the database then holds all of it, a second run is refused, and im.webchat
//! started on the database answers a repeat of the call with the first result.

mod support;

use serde_json::json;
use tokio::io::AsyncReadExt;
use xagent_file_transfer::{FileStore, NewFile, StoreConfig, UrlSigner};
use xagent_profile_im::{OutboxWrite, PendingRecord};
use xagent_protocol_types::{ConnectorChannelId, MessageId, Secret, SystemClock, ToolInvokeAck};
use xagent_server_runtime::storage::{
    PostgresOptions, PostgresStorage, SqliteStorage, Storage, WriteOp,
};
use xagent_storage_postgres::DatabaseUrl;
use xagent_testkit::postgres::TestPostgres;

use support::{connect, open_room, send, start_webchat, with_password};

const API_KEY: &str = "sk-cli-migrate-state-3a9d";

/// Runs `migrate-state` on `state` into `url` (from the environment); status, stdout, stderr.
async fn migrate(state: &std::path::Path, url: &DatabaseUrl) -> (Option<i32>, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_DATABASE_URL", url.expose())
        .arg("migrate-state")
        .arg("--state-dir")
        .arg(state)
        .output()
        .await
        .expect("migrate-state runs");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn signer() -> UrlSigner {
    UrlSigner::new(Secret::new("a-signing-secret-for-the-test-only-0123456789")).expect("signer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_state_directory_moves_into_postgres_whole() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let url = with_password(&url, "hunter2-pg");
    let state = xagent_testkit::temp_state_dir("cli-migrate-state");

    // A real run on SQLite: a room signed in, a message sent through the Tool.
    let running = start_webchat(&state, None, API_KEY).await;
    let plane = connect(&running.addr, API_KEY).await;
    let channel = open_room(&plane).await;
    let first: ToolInvokeAck = plane
        .request(Some(&channel), send(&channel, "call-move-1", "moved to PostgreSQL"))
        .await
        .expect("tool call");
    plane.close().await;
    running.stop().await;
    assert!(state.join(xagent_server_runtime::storage::DATABASE_FILE).is_file(), "state in SQLite");

    // An outbox message still owed to xAgent and a stored file, in the same directory.
    let pending = PendingRecord {
        channel: channel.clone(),
        message_id: MessageId::new("msg_owed_1"),
        seq: 1,
        payload: json!({"message_id": "msg_owed_1", "text": "owed"}).to_string(),
        attempts: 0,
        first_responsibility_at: 1_790_000_000_000,
        expires_at: u64::MAX / 2,
        next_attempt_at: 1_790_000_000_000,
        last_error: None,
    };
    {
        let sqlite = SqliteStorage::open(&state).expect("the state's database");
        sqlite
            .commit(vec![WriteOp::Outbox(OutboxWrite::Save(pending.clone()))])
            .committed()
            .await
            .expect("the outbox message is stored");
    }
    let files = FileStore::open(state.join("files"), StoreConfig::default(), signer(), SystemClock)
        .await
        .expect("the state's files");
    let file = files
        .register_bytes(NewFile::new(channel.clone(), "notes.txt"), b"bytes that move")
        .await
        .expect("a file")
        .record;
    drop(files);

    let (status, stdout, stderr) = migrate(&state, &url).await;
    assert_eq!(status, Some(0), "migrate-state succeeds:\n{stdout}\n{stderr}");
    assert!(stdout.contains("1 channels") && stdout.contains("1 tool calls"), "{stdout}");
    assert!(stdout.contains("1 outbox messages"), "{stdout}");
    assert!(stdout.contains("files: 1 "), "{stdout}");
    assert!(!format!("{stdout}{stderr}").contains("hunter2-pg"), "the password is never shown");

    // Everything is in the database, read through the PostgreSQL backends.
    let storage =
        PostgresStorage::connect(&url, PostgresOptions::default()).await.expect("the database");
    let channels = storage.load_channels().await.expect("channels");
    assert_eq!(channels.len(), 1);
    assert_eq!(channels[0].id, channel);
    assert!(channels[0].binding.is_some(), "the binding with its private material moved");
    assert!(storage.load_connector_id().await.expect("meta").is_some());
    assert_eq!(storage.load_pending().await.expect("outbox"), vec![pending]);
    let pool = xagent_storage_postgres::connect(&url, Default::default()).await.expect("pool");
    let client = pool.get().await.expect("connection");
    let author_records = client
        .query_one("SELECT COUNT(*) FROM server_author_records", &[])
        .await
        .expect("counts")
        .get::<_, i64>(0);
    assert!(author_records > 0, "im.webchat's records on the author store moved");
    drop(client);
    let on_pg = FileStore::open_postgres(
        pool,
        StoreConfig::default(),
        signer(),
        std::sync::Arc::new(SystemClock),
    )
    .await
    .expect("the files on PostgreSQL");
    let (record, mut reader) = on_pg.open_file(&file.file_ref).await.expect("the file moved");
    assert_eq!(record.connector_channel_id, channel);
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).await.expect("its bytes");
    assert_eq!(bytes, b"bytes that move");
    drop(storage);

    // A database that holds state is refused, and nothing changes.
    let (status, _, stderr) = migrate(&state, &url).await;
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("already holds") && stderr.contains("start over"), "{stderr}");

    // im.webchat on the database: the channel comes back, a repeat gets the first result.
    let running = start_webchat(&state, Some(&url), API_KEY).await;
    let plane = connect(&running.addr, API_KEY).await;
    let reopened = plane.open_channel(Some(&channel)).await.expect("reopen");
    assert_eq!(reopened.connector_channel_id, channel);
    plane.remember_channel(channel.clone()).await;
    let repeat: ToolInvokeAck = plane
        .request(Some(&channel), send(&channel, "call-move-1", "moved to PostgreSQL"))
        .await
        .expect("repeat");
    assert_eq!(first.result, repeat.result, "the repeat is answered from the moved record");
    plane.close().await;
    running.stop().await;
    let _ = std::fs::remove_dir_all(state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_xagent_side_state_moves_under_its_card() {
    use xagent_client_runtime::store::{
        AdmissionSnapshot, PostgresXagentStore, SqliteXagentStore, XagentStore, XagentWrite,
    };
    use xagent_profile_im::{CompletedRecord, Fingerprint, IdempotencyWrite};
    use xagent_protocol_types::ConnectorId;

    let url = TestPostgres::shared().await.fresh_database().await;
    let state = xagent_testkit::temp_state_dir("cli-migrate-xagent");
    let channel = ConnectorChannelId::new("cch_remembered_1");
    let pending = PendingRecord {
        channel: channel.clone(),
        message_id: MessageId::new("msg_reply_1"),
        seq: 3,
        payload: json!({"message_id": "msg_reply_1", "text": "a reply"}).to_string(),
        attempts: 1,
        first_responsibility_at: 1_790_000_000_000,
        expires_at: u64::MAX / 2,
        next_attempt_at: 1_790_000_000_500,
        last_error: Some("timed out".into()),
    };
    let completed = CompletedRecord {
        channel: channel.clone(),
        message_id: MessageId::new("msg_in_1"),
        fingerprint: Fingerprint::from_hex("00ff"),
        completed_at: 1_790_000_000_100,
    };
    let admitted = AdmissionSnapshot {
        card: json!({"connector_card_id": "im.example", "connector": {"version": "1.0.0"}}),
        skill: Some("---\nname: connector-im-example\n---\n".into()),
    };
    {
        let sqlite = SqliteXagentStore::open(&state).expect("the xAgent-side store");
        sqlite
            .commit(
                None,
                vec![
                    XagentWrite::SaveChannel { channel: channel.clone(), owner: Some("u1".into()) },
                    XagentWrite::ConnectorId(ConnectorId::new("cid_1")),
                    XagentWrite::Admission(admitted.clone()),
                    XagentWrite::Outbox(OutboxWrite::Save(pending.clone())),
                    XagentWrite::Idempotency(IdempotencyWrite::Save(completed.clone())),
                ],
            )
            .await
            .expect("stored");
    }

    // Without the Card id the command says what it needs.
    let (status, _, stderr) = migrate(&state, &url).await;
    assert_eq!(status, Some(2), "{stderr}");
    assert!(stderr.contains("--connector-card-id"), "{stderr}");

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_DATABASE_URL", url.expose())
        .args(["migrate-state", "--connector-card-id", "im.example", "--state-dir"])
        .arg(&state)
        .output()
        .await
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("1 channels") && stdout.contains("1 outbox messages"), "{stdout}");

    let target = PostgresXagentStore::connect(&url, "im.example").await.expect("the database");
    let channels = target.load_channels().await.expect("channels");
    assert_eq!(channels.len(), 1);
    assert_eq!(channels[0].channel, channel);
    assert_eq!(channels[0].owner.as_deref(), Some("u1"));
    assert_eq!(target.load_connector_id().await.expect("id"), Some(ConnectorId::new("cid_1")));
    assert_eq!(target.load_admission().await.expect("snapshot"), Some(admitted));
    assert_eq!(target.load_pending().await.expect("outbox"), vec![pending]);
    let found = target.lookup_completed(&channel, &completed.message_id).await.expect("lookup");
    assert_eq!(found, Some(completed));
    let _ = std::fs::remove_dir_all(state);
}

#[tokio::test]
async fn a_password_in_the_database_url_flag_is_warned_about() {
    let state = xagent_testkit::temp_state_dir("cli-migrate-warning");
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env_remove("XAGENT_CONNECTOR_DATABASE_URL")
        .args(["migrate-state", "--database-url", "postgres://app:hunter2@127.0.0.1:1/none"])
        .arg("--state-dir")
        .arg(&state)
        .output()
        .await
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("process list"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    assert_ne!(output.status.code(), Some(0), "nothing listens on port 1");
    let _ = std::fs::remove_dir_all(state);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_bridge_inbox_moves_under_its_card_with_its_file_bytes() {
    use xagent_client_runtime::store::{SqliteXagentStore, XagentStore, XagentWrite};
    use xagent_mcp::inbox::{Inbox, NewMessage, StoredFile};

    let url = TestPostgres::shared().await.fresh_database().await;
    let state = xagent_testkit::temp_state_dir("cli-migrate-inbox");
    let channel = ConnectorChannelId::new("cch_bridge_1");
    {
        let sqlite = SqliteXagentStore::open(&state).expect("the xAgent-side store");
        let remember =
            XagentWrite::SaveChannel { channel: channel.clone(), owner: Some("mcp-bridge".into()) };
        sqlite.commit(None, vec![remember]).await.expect("stored");
        let inbox = Inbox::open(&state, 1024).expect("the bridge's inbox");
        inbox.save_file("f_report", b"report bytes".to_vec(), 1).await.expect("saved");
        let file = StoredFile {
            id: "f_report".into(),
            filename: "report.txt".into(),
            mime_type: "text/plain".into(),
            byte_size: 12,
        };
        let message = |id, files| NewMessage {
            channel: channel.as_str(),
            message_id: id,
            text: Some("hello"),
            files,
            created_at: None,
            received_at: 5,
        };
        inbox.store(&message("msg_handed", &[])).await.expect("stored");
        inbox.store(&message("msg_waiting", std::slice::from_ref(&file))).await.expect("stored");
        assert!(inbox.take_next(None).await.expect("taken").is_some());
    }

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_DATABASE_URL", url.expose())
        .args(["migrate-state", "--connector-card-id", "im.bridged", "--state-dir"])
        .arg(&state)
        .output()
        .await
        .expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.contains("MCP bridge inbox (mcp-inbox.sqlite3): 2 messages, 1 files (12 bytes)"),
        "{stdout}"
    );

    // The bridges on PostgreSQL find the inbox under the Card: the handed message stays
    // handed, the waiting one comes with its file's bytes.
    let pool = xagent_storage_postgres::connect(&url, Default::default()).await.expect("pool");
    let target = Inbox::open_postgres(pool, "im.bridged", 1024).await.expect("the inbox");
    assert_eq!(target.count().await.expect("counts"), 2);
    let waiting = target.take_next(None).await.expect("takes").expect("one waits");
    assert_eq!(waiting.message_id, "msg_waiting");
    assert_eq!(target.read_file("f_report").await.expect("reads"), Some(b"report bytes".to_vec()));
    assert_eq!(target.take_next(None).await.expect("takes"), None);

    // A second run finds the database holding the inbox and refuses.
    let again = tokio::process::Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .env("XAGENT_CONNECTOR_DATABASE_URL", url.expose())
        .args(["migrate-state", "--connector-card-id", "im.bridged", "--state-dir"])
        .arg(&state)
        .output()
        .await
        .expect("runs");
    assert_eq!(again.status.code(), Some(2), "{}", String::from_utf8_lossy(&again.stderr));
    let _ = std::fs::remove_dir_all(state);
}
