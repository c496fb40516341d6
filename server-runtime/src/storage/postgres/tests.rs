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
