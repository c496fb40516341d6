//! `xagent-connector webchat --database-url`: the runtime's state in PostgreSQL (testkit's
//! server). A tool call runs through the process; after a restart the channel and the call's
//! record come back from the database (a repeat of the call gets the first result), the state
//! directory holds no runtime database, and the log shows the URL only redacted.

mod support;

use xagent_protocol_types::ToolInvokeAck;
use xagent_testkit::postgres::TestPostgres;

use support::{connect, open_room, send, start_webchat, with_password};

const API_KEY: &str = "sk-cli-webchat-database-5c1e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webchat_keeps_the_runtime_state_in_postgres_across_a_restart() {
    let url = TestPostgres::shared().await.fresh_database().await;
    // testkit's server trusts local connections: a password in the URL is carried, not
    // checked, which lets the test see that the log never shows it.
    let url = with_password(&url, "hunter2-pg");
    let state = xagent_testkit::temp_state_dir("cli-webchat-database");

    let running = start_webchat(&state, Some(&url), API_KEY).await;
    let plane = connect(&running.addr, API_KEY).await;
    let channel = open_room(&plane).await;
    let first: ToolInvokeAck = plane
        .request(Some(&channel), send(&channel, "call-pg-1", "kept in PostgreSQL"))
        .await
        .expect("tool call");
    plane.close().await;
    let log = running.stop().await;

    // Redacted in the log, never in full; no runtime SQLite file beside the Connector's own.
    assert!(log.contains(&url.to_string()), "the log names the database, redacted:\n{log}");
    assert!(!log.contains("hunter2-pg"), "the password never appears in the log:\n{log}");
    assert!(
        !state.join(xagent_server_runtime::storage::DATABASE_FILE).exists(),
        "the runtime's state is not in SQLite"
    );

    // The same database after a restart: the channel, its binding and the call's record.
    let running = start_webchat(&state, Some(&url), API_KEY).await;
    let plane = connect(&running.addr, API_KEY).await;
    let reopened = plane.open_channel(Some(&channel)).await.expect("reopen");
    assert_eq!(reopened.connector_channel_id, channel, "the channel came back from PostgreSQL");
    plane.remember_channel(channel.clone()).await;
    let repeat: ToolInvokeAck = plane
        .request(Some(&channel), send(&channel, "call-pg-1", "kept in PostgreSQL"))
        .await
        .expect("repeat");
    assert_eq!(first.result, repeat.result, "the repeat is answered from the stored record");
    plane.close().await;
    running.stop().await;

    // And the rows are there, read back directly.
    let pool = xagent_storage_postgres::connect(&url, Default::default()).await.expect("pool");
    let client = pool.get().await.expect("connection");
    let calls = client
        .query_one(
            "SELECT COUNT(*) FROM server_tool_calls WHERE channel = $1 AND key = 'call:call-pg-1'",
            &[&channel.as_str()],
        )
        .await
        .expect("counts");
    assert_eq!(calls.get::<_, i64>(0), 1);
    let _ = std::fs::remove_dir_all(state);
}
