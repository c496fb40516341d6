//! Tests of the PostgreSQL writer's own paths (the contract both backends share is in
//! `tests/storage_contract.rs`): a statement the database refuses mid-batch sends the batch
//! through the savepoint path, where only its submission fails.

use super::*;
use xagent_testkit::postgres::TestPostgres;

fn tool_call(key: &str) -> WriteOp {
    WriteOp::ToolCall {
        channel: "cch_1".into(),
        key: key.into(),
        fingerprint: "f".into(),
        result: Some("{\"ok\":true}".into()),
        error: None,
        completed_at: 10,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_the_database_refuses_fails_its_submission_alone_and_the_batch_commits() {
    let url = TestPostgres::shared().await.fresh_database().await;
    // A long wait lets the whole burst below ride one batch after the first.
    let config =
        GroupCommitConfig { max_wait: std::time::Duration::from_millis(200), ..Default::default() };
    let storage =
        PostgresStorage::connect(&url, PostgresOptions::default().with_group_commit(config))
            .await
            .unwrap();
    // A trigger refusing one key stands in for a write that breaks a constraint.
    storage
        .client("test setup")
        .await
        .unwrap()
        .batch_execute(
            "CREATE FUNCTION refuse_bad() RETURNS trigger AS $$
             BEGIN IF NEW.key LIKE 'bad%' THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END
             $$ LANGUAGE plpgsql;
             CREATE TRIGGER refuse BEFORE INSERT ON server_tool_calls
             FOR EACH ROW EXECUTE FUNCTION refuse_bad();",
        )
        .await
        .unwrap();
    // Two concurrent rounds teach the writer that writers are concurrent, so it batches.
    for round in 0..2 {
        let tickets: Vec<_> =
            (0..8).map(|i| storage.commit(vec![tool_call(&format!("warm{round}-{i}"))])).collect();
        for ticket in tickets {
            ticket.committed().await.unwrap();
        }
    }
    let before = storage.group_commit_stats();
    let good = storage.commit(vec![tool_call("good")]);
    let bad = storage.commit(vec![tool_call("neighbour"), tool_call("bad")]);
    let after = storage.commit(vec![tool_call("after")]);
    assert!(bad.committed().await.is_err());
    good.committed().await.unwrap();
    after.committed().await.unwrap();
    let stats = storage.group_commit_stats();
    assert!(stats.transactions - before.transactions < 3, "one batch carried them: {stats:?}");
    let channel = ConnectorChannelId::new("cch_1");
    for (key, kept) in [("good", true), ("neighbour", false), ("bad", false), ("after", true)] {
        assert_eq!(storage.load_tool_call(&channel, key).await.unwrap().is_some(), kept, "{key}");
    }
}

const CRASH_URL: &str = "XSR_POSTGRES_CRASH_URL";

/// The child half of the crash test: commits one write, then submits more and aborts the
/// process inside the second batch, after its statements ran and before its `COMMIT`. Prints
/// `ACK <key>` for every write it was told is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by a_crash_between_the_statements_and_commit_acknowledges_nothing in a child"]
async fn crash_child() {
    use std::io::Write;
    let Ok(url) = std::env::var(CRASH_URL) else { return };
    let Ok(url) = xagent_storage_postgres::DatabaseUrl::parse(&url) else { return };
    let config =
        GroupCommitConfig { crash_before_commit_of_batch: Some(2), ..GroupCommitConfig::default() };
    let Ok(storage) =
        PostgresStorage::connect(&url, PostgresOptions::default().with_group_commit(config)).await
    else {
        return;
    };
    let ack = |key: &str| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "ACK {key}");
        let _ = out.flush();
    };
    if storage.commit(vec![tool_call("before")]).committed().await.is_ok() {
        ack("before");
    }
    let tickets: Vec<_> = (0..20)
        .map(|i| (format!("during{i}"), storage.commit(vec![tool_call(&format!("during{i}"))])))
        .collect();
    for (key, ticket) in tickets {
        if ticket.committed().await.is_ok() {
            ack(&key);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_statements_and_commit_acknowledges_nothing() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let exe = std::env::current_exe().unwrap();
    let output = tokio::process::Command::new(exe)
        .args(["--exact", "storage::postgres::tests::crash_child", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CRASH_URL, url.expose())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "the child was meant to abort: {stdout}");
    let acked: Vec<&str> = stdout
        .lines()
        .filter_map(|line| line.split_once("ACK ").map(|(_, key)| key.trim()))
        .collect();
    assert_eq!(acked, vec!["before"], "only the write committed before the crash is acked");
    // The server rolled the open transaction back when the connection died.
    let storage = PostgresStorage::connect(&url, PostgresOptions::default()).await.unwrap();
    let channel = ConnectorChannelId::new("cch_1");
    assert!(storage.load_tool_call(&channel, "before").await.unwrap().is_some());
    for i in 0..20 {
        let key = format!("during{i}");
        assert!(storage.load_tool_call(&channel, &key).await.unwrap().is_none(), "{key}");
    }
}
