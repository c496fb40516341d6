//! Two `im.webchat` processes on one PostgreSQL database (feature `postgres`, testkit's
//! server), each with its own state directory: a message one of them stores is in the
//! other's history, because the conversation lives in the runtime's storage.
#![cfg(feature = "postgres")]

use xagent_connector_webchat::{Webchat, WebchatOptions};
use xagent_protocol_types::ChatMessage;
use xagent_server_runtime::AuthorScan;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_stored_by_one_replica_is_seen_by_the_other() {
    let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
    let dir_a = xagent_testkit::temp_state_dir("webchat-replica-a");
    let dir_b = xagent_testkit::temp_state_dir("webchat-replica-b");
    let open = |dir: &std::path::Path| {
        Webchat::open(
            WebchatOptions::new(dir, "http://127.0.0.1:9")
                .with_api_key(xagent_protocol_types::Secret::new("sk-test-replica-9a8b7c"))
                .with_database_url(url.clone()),
        )
    };
    let a = open(&dir_a).await.expect("replica a opens");
    let b = open(&dir_b).await.expect("replica b opens");
    let message = ChatMessage::text("msg_web_replica_1", "hello from a").created_at(1_000);
    a.store_unqueued_visitor_message("lobby", &message, "c-1").await.expect("stored on a");
    let seen = b
        .handle()
        .author_store()
        .scan("webchat.messages", &AuthorScan::prefix("lobby/", 10))
        .await
        .expect("b reads");
    assert_eq!(seen.len(), 1, "b sees the message a stored");
    let stored: serde_json::Value = seen[0].json().unwrap();
    assert_eq!(stored["entry"]["message_id"], "msg_web_replica_1");
    assert_eq!(stored["entry"]["status"], "sending");
    let _ = std::fs::remove_dir_all(dir_a);
    let _ = std::fs::remove_dir_all(dir_b);
}
