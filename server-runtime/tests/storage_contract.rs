//! The storage contract: one set of cases, each a function taking a place to open a backend,
//! run once on `SqliteStorage` (a temporary directory) and once on `PostgresStorage` (a fresh
//! database of testkit's PostgreSQL; feature `postgres`). The PostgreSQL-only rules (a newer
//! schema is refused, an unreachable server is named without the password) follow at the end.

mod support;

use std::sync::Arc;

use support::Place;
use xagent_profile_im::{
    AttemptUpdate, CompletedRecord, Fingerprint, IdempotencyWrite, OutboxWrite, PendingRecord,
};
use xagent_protocol_types::{
    ConnectionStatus, ConnectorChannelId, ConnectorId, DescriptorTarget, DescriptorTool, MessageId,
    Secret, ToolId, ToolStatus,
};
use xagent_server_runtime::Binding;
use xagent_server_runtime::storage::{
    ChannelRecord, MAX_STORED_KEY_BYTES, Storage, ToolCallRecord, WriteOp,
};

fn ch(id: &str) -> ConnectorChannelId {
    ConnectorChannelId::new(id)
}

fn channel(id: &str, created_at: u64) -> ChannelRecord {
    ChannelRecord {
        id: ch(id),
        connector_id: ConnectorId::new("conn_x"),
        status: ConnectionStatus::Connected,
        binding: Some(
            Binding::new(DescriptorTarget::new("echo", "Echo ab***"))
                .with_secret("token", Secret::new(format!("t0k-{id}"))),
        ),
        tool_overrides: [(
            ToolId::new("echo_send"),
            DescriptorTool::new("echo_send", ToolStatus::Unavailable),
        )]
        .into_iter()
        .collect(),
        created_at,
    }
}

fn tool_call(channel: &str, key: &str, completed_at: i64) -> WriteOp {
    WriteOp::ToolCall {
        channel: channel.into(),
        key: key.into(),
        fingerprint: format!("fp-{key}"),
        result: Some(format!("{{\"key\":\"{key}\"}}")),
        error: None,
        completed_at,
    }
}

fn pending(channel: &str, id: &str, seq: u64) -> PendingRecord {
    PendingRecord {
        channel: ch(channel),
        message_id: MessageId::new(id),
        seq,
        payload: format!("{{\"type\":\"chat.message\",\"payload\":{{\"n\":{seq}}}}}"),
        attempts: 0,
        first_responsibility_at: 100,
        expires_at: 1_000,
        next_attempt_at: 100,
        last_error: None,
    }
}

fn completed(channel: &str, id: &str, at: u64) -> CompletedRecord {
    CompletedRecord {
        channel: ch(channel),
        message_id: MessageId::new(id),
        fingerprint: Fingerprint::from_hex(format!("ab{at:02x}")),
        completed_at: at,
    }
}

fn meta(key: &str, value: Option<&str>) -> WriteOp {
    WriteOp::Meta { key: key.into(), value: value.map(str::to_owned) }
}

async fn commit(storage: &dyn Storage, ops: Vec<WriteOp>) {
    storage.commit(ops).committed().await.expect("commits");
}

async fn pending_by_seq(storage: &dyn Storage) -> Vec<PendingRecord> {
    let mut records = storage.load_pending().await.expect("loads");
    records.sort_by_key(|r| r.seq);
    records
}

async fn completed_ids(storage: &dyn Storage, channel: &str, ids: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for id in ids {
        if storage
            .lookup_completed(&ch(channel), &MessageId::new(*id))
            .await
            .expect("reads")
            .is_some()
        {
            found.push((*id).to_owned());
        }
    }
    found
}

/// Every case, each an `async fn(&Place)`.
mod cases {
    use super::*;

    pub async fn connector_id_round_trip(place: &Place) {
        let storage = place.open().await;
        assert_eq!(storage.load_connector_id().await.unwrap(), None);
        commit(&*storage, vec![meta("connector_id", Some("conn_a"))]).await;
        assert_eq!(storage.load_connector_id().await.unwrap(), Some(ConnectorId::new("conn_a")));
        commit(&*storage, vec![meta("connector_id", None)]).await;
        assert_eq!(storage.load_connector_id().await.unwrap(), None);
    }

    pub async fn channels_with_bindings(place: &Place) {
        let storage = place.open().await;
        let (a, b) = (channel("cch_a", 7), channel("cch_b", 5));
        storage.commit_channel(&a).committed().await.unwrap();
        storage.commit_channel(&b).committed().await.unwrap();
        let loaded = storage.load_channels().await.unwrap();
        assert_eq!(loaded, vec![b.clone(), a.clone()], "oldest first");
        assert_eq!(
            loaded[1].binding.as_ref().unwrap().secret("token").unwrap().expose(),
            "t0k-cch_a"
        );
        // An update replaces the record but keeps its creation time.
        let mut signed_out = a.clone();
        signed_out.status = ConnectionStatus::Created;
        signed_out.binding = None;
        signed_out.tool_overrides.clear();
        signed_out.created_at = 99;
        storage.commit_channel(&signed_out).committed().await.unwrap();
        let loaded = storage.load_channels().await.unwrap();
        signed_out.created_at = 7;
        assert_eq!(loaded, vec![b, signed_out]);
    }

    pub async fn delete_channel_removes_its_outbox_idempotency_and_tool_calls(place: &Place) {
        let storage = place.open().await;
        for id in ["cch_gone", "cch_kept"] {
            storage.commit_channel(&channel(id, 1)).committed().await.unwrap();
            commit(
                &*storage,
                vec![
                    tool_call(id, "call_1", 10),
                    WriteOp::Outbox(OutboxWrite::Save(pending(id, "m1", 1))),
                    WriteOp::Idempotency(IdempotencyWrite::Save(completed(id, "in1", 5))),
                ],
            )
            .await;
        }
        commit(&*storage, vec![WriteOp::DeleteChannel("cch_gone".into())]).await;
        let channels: Vec<_> =
            storage.load_channels().await.unwrap().into_iter().map(|c| c.id).collect();
        assert_eq!(channels, vec![ch("cch_kept")]);
        assert!(storage.load_tool_call(&ch("cch_gone"), "call_1").await.unwrap().is_none());
        assert!(storage.load_tool_call(&ch("cch_kept"), "call_1").await.unwrap().is_some());
        let left: Vec<_> = pending_by_seq(&*storage).await.into_iter().map(|p| p.channel).collect();
        assert_eq!(left, vec![ch("cch_kept")]);
        assert!(completed_ids(&*storage, "cch_gone", &["in1"]).await.is_empty());
        assert_eq!(completed_ids(&*storage, "cch_kept", &["in1"]).await, ["in1"]);
    }

    pub async fn a_tool_call_is_found_again_by_channel_and_key(place: &Place) {
        let storage = place.open().await;
        let record = ToolCallRecord {
            fingerprint: "fp".into(),
            result: Some(serde_json::json!({"ok": true, "text": "x\u{0}y"})),
            error: None,
            completed_at: 10,
        };
        storage.commit_tool_call(&ch("cch_1"), "call_1", &record).committed().await.unwrap();
        assert_eq!(storage.load_tool_call(&ch("cch_1"), "call_1").await.unwrap(), Some(record));
        assert_eq!(storage.load_tool_call(&ch("cch_1"), "call_2").await.unwrap(), None);
        assert_eq!(storage.load_tool_call(&ch("cch_2"), "call_1").await.unwrap(), None);
        // A failure is kept too, its author's message as given (a NUL included), and a repeat
        // of the key replaces the record.
        let failed = ToolCallRecord {
            fingerprint: "fp2".into(),
            result: None,
            error: Some(("upstream_failed".into(), "bad\u{0}gateway ü".into())),
            completed_at: 11,
        };
        storage.commit_tool_call(&ch("cch_1"), "call_1", &failed).committed().await.unwrap();
        assert_eq!(storage.load_tool_call(&ch("cch_1"), "call_1").await.unwrap(), Some(failed));
    }

    pub async fn prune_deletes_tool_calls_older_than_the_cut(place: &Place) {
        let storage = place.open().await;
        commit(&*storage, vec![tool_call("cch_1", "a", 10), tool_call("cch_1", "b", 20)]).await;
        assert_eq!(storage.prune_tool_calls(15).await.unwrap(), 1);
        assert!(storage.load_tool_call(&ch("cch_1"), "a").await.unwrap().is_none());
        assert!(storage.load_tool_call(&ch("cch_1"), "b").await.unwrap().is_some());
        assert_eq!(storage.prune_tool_calls(15).await.unwrap(), 0);
    }

    pub async fn meta_values_are_set_replaced_and_removed(place: &Place) {
        let storage = place.open().await;
        assert_eq!(storage.load_meta("url_signing_secret").await.unwrap(), None);
        commit(&*storage, vec![meta("url_signing_secret", Some("s1"))]).await;
        commit(&*storage, vec![meta("url_signing_secret", Some("s2")), meta("other", Some("o"))])
            .await;
        assert_eq!(storage.load_meta("url_signing_secret").await.unwrap().as_deref(), Some("s2"));
        assert_eq!(storage.load_meta("other").await.unwrap().as_deref(), Some("o"));
        commit(&*storage, vec![meta("other", None)]).await;
        assert_eq!(storage.load_meta("other").await.unwrap(), None);
    }

    pub async fn outbox_save_attempt_delete_and_reload_in_seq_order(place: &Place) {
        let storage = place.open().await;
        let saves = [("cch_1", "m3", 3), ("cch_2", "m1", 1), ("cch_1", "m2", 2)];
        for (c, m, seq) in saves {
            commit(&*storage, vec![WriteOp::Outbox(OutboxWrite::Save(pending(c, m, seq)))]).await;
        }
        let update = AttemptUpdate {
            channel: ch("cch_1"),
            message_id: MessageId::new("m2"),
            attempts: u32::MAX,
            next_attempt_at: 500,
            last_error: Some("ack timeout\u{0} ü".into()),
        };
        let mut missing = update.clone();
        missing.message_id = MessageId::new("m_gone");
        commit(
            &*storage,
            vec![
                WriteOp::Outbox(OutboxWrite::Attempt(update.clone())),
                WriteOp::Outbox(OutboxWrite::Attempt(missing)),
                WriteOp::Outbox(OutboxWrite::Delete(ch("cch_2"), MessageId::new("m1"))),
            ],
        )
        .await;
        let mut m2 = pending("cch_1", "m2", 2);
        m2.attempts = update.attempts;
        m2.next_attempt_at = update.next_attempt_at;
        m2.last_error = update.last_error.clone();
        assert_eq!(pending_by_seq(&*storage).await, vec![m2, pending("cch_1", "m3", 3)]);
    }

    pub async fn a_channels_pending_records_are_read_by_channel_and_by_message_id(place: &Place) {
        let storage = place.open().await;
        let saves = [("cch_1", "m3", 3), ("cch_2", "m1", 1), ("cch_1", "m2", 2)];
        for (c, m, seq) in saves {
            commit(&*storage, vec![WriteOp::Outbox(OutboxWrite::Save(pending(c, m, seq)))]).await;
        }
        assert_eq!(
            storage.load_pending_of(&ch("cch_1")).await.unwrap(),
            vec![pending("cch_1", "m2", 2), pending("cch_1", "m3", 3)]
        );
        let ids = [MessageId::new("m3"), MessageId::new("m1"), MessageId::new("m_gone")];
        assert_eq!(
            storage.load_pending_ids(&ch("cch_1"), &ids).await.unwrap(),
            vec![pending("cch_1", "m3", 3)],
            "only the channel's records among the ids (m1 is another channel's)"
        );
        assert!(storage.load_pending_ids(&ch("cch_1"), &[]).await.unwrap().is_empty());
    }

    pub async fn idempotency_lookup_trim_and_expire(place: &Place) {
        let storage = place.open().await;
        let mut ops: Vec<WriteOp> = [("m0", 3u64), ("m1", 1), ("m2", 4), ("m3", 2), ("m4", 4)]
            .into_iter()
            .map(|(id, at)| WriteOp::Idempotency(IdempotencyWrite::Save(completed("a", id, at))))
            .collect();
        ops.push(WriteOp::Idempotency(IdempotencyWrite::Save(completed("b", "x", 1))));
        commit(&*storage, ops).await;
        let record = storage.lookup_completed(&ch("a"), &MessageId::new("m0")).await.unwrap();
        assert_eq!(record, Some(completed("a", "m0", 3)));
        assert_eq!(storage.lookup_completed(&ch("b"), &MessageId::new("m0")).await.unwrap(), None);
        // Keep a's two newest; m2 and m4 tie on time and are both newer than the rest.
        commit(
            &*storage,
            vec![WriteOp::Idempotency(IdempotencyWrite::Trim { channel: ch("a"), keep: 2 })],
        )
        .await;
        let all = ["m0", "m1", "m2", "m3", "m4"];
        assert_eq!(completed_ids(&*storage, "a", &all).await, ["m2", "m4"]);
        // Ties are broken by insertion: of m2 and m4 (both at 4) the later insert stays.
        commit(
            &*storage,
            vec![WriteOp::Idempotency(IdempotencyWrite::Trim { channel: ch("a"), keep: 1 })],
        )
        .await;
        assert_eq!(completed_ids(&*storage, "a", &all).await, ["m4"]);
        assert_eq!(completed_ids(&*storage, "b", &["x"]).await, ["x"], "b untouched");
        commit(&*storage, vec![WriteOp::Idempotency(IdempotencyWrite::Expire { before: 2 })]).await;
        assert!(completed_ids(&*storage, "b", &["x"]).await.is_empty());
        assert_eq!(completed_ids(&*storage, "a", &all).await, ["m4"]);
        commit(
            &*storage,
            vec![WriteOp::Idempotency(IdempotencyWrite::Trim { channel: ch("a"), keep: 0 })],
        )
        .await;
        assert!(completed_ids(&*storage, "a", &all).await.is_empty());
    }

    pub async fn writes_apply_in_submission_order_within_and_across_submissions(place: &Place) {
        let storage = place.open().await;
        // Within one submission: save, delete, save again.
        let mut again = pending("cch_1", "m1", 9);
        again.payload = "{\"second\":true}".into();
        commit(
            &*storage,
            vec![
                WriteOp::Outbox(OutboxWrite::Save(pending("cch_1", "m1", 1))),
                WriteOp::Outbox(OutboxWrite::Delete(ch("cch_1"), MessageId::new("m1"))),
                WriteOp::Outbox(OutboxWrite::Save(again.clone())),
            ],
        )
        .await;
        assert_eq!(pending_by_seq(&*storage).await, vec![again]);
        // Across submissions made before any is awaited: the last one made wins, and an
        // attempt update submitted after its insert finds it.
        let tickets: Vec<_> = (0..50)
            .map(|i| storage.commit(vec![meta("k", Some(&i.to_string()))]))
            .chain([
                storage.commit(vec![WriteOp::Outbox(OutboxWrite::Save(pending("cch_2", "n", 2)))]),
                storage.commit(vec![WriteOp::Outbox(OutboxWrite::Attempt(AttemptUpdate {
                    channel: ch("cch_2"),
                    message_id: MessageId::new("n"),
                    attempts: 4,
                    next_attempt_at: 7,
                    last_error: None,
                }))]),
            ])
            .collect();
        for ticket in tickets {
            ticket.committed().await.unwrap();
        }
        assert_eq!(storage.load_meta("k").await.unwrap().as_deref(), Some("49"));
        let n = pending_by_seq(&*storage).await.into_iter().find(|p| p.message_id.as_str() == "n");
        assert_eq!(n.map(|p| p.attempts), Some(4));
    }

    pub async fn a_failing_submission_acknowledges_nothing_and_fails_alone(place: &Place) {
        let storage = place.open().await;
        let good = storage.commit(vec![tool_call("cch_1", "good", 1)]);
        // The second write breaks the backends' common rule (no NUL in a key): the whole
        // submission fails, its first write included.
        let bad = storage.commit(vec![
            tool_call("cch_1", "bad-neighbour", 1),
            tool_call("cch_1", "bad\u{0}", 1),
        ]);
        let after = storage.commit(vec![tool_call("cch_1", "after", 1)]);
        let refused = bad.committed().await;
        assert!(refused.is_err(), "{refused:?}");
        good.committed().await.unwrap();
        after.committed().await.unwrap();
        let reopened = place.open().await;
        for (key, kept) in [("good", true), ("bad-neighbour", false), ("after", true)] {
            let found = reopened.load_tool_call(&ch("cch_1"), key).await.unwrap();
            assert_eq!(found.is_some(), kept, "{key}");
        }
        // Submitted together (one batch where the backend batches), only the refused one fails.
        let tickets: Vec<_> = (0..20)
            .map(|i| {
                let key = if i == 7 { "x\u{0}".to_owned() } else { format!("k{i}") };
                (i, storage.commit(vec![tool_call("cch_2", &key, 1)]))
            })
            .collect();
        for (i, ticket) in tickets {
            assert_eq!(ticket.committed().await.is_ok(), i != 7, "submission {i}");
        }
    }

    pub async fn ids_and_keys_have_the_same_size_limit_on_every_backend(place: &Place) {
        let storage = place.open().await;
        let longest = "k".repeat(MAX_STORED_KEY_BYTES);
        let channel = "c".repeat(MAX_STORED_KEY_BYTES);
        commit(
            &*storage,
            vec![
                tool_call(&channel, &longest, 1),
                WriteOp::Idempotency(IdempotencyWrite::Save(completed(&channel, &longest, 1))),
            ],
        )
        .await;
        assert!(storage.load_tool_call(&ch(&channel), &longest).await.unwrap().is_some());
        let too_long = format!("{longest}k");
        for op in [
            tool_call("cch_1", &too_long, 1),
            WriteOp::Outbox(OutboxWrite::Save(pending("cch_1", &too_long, 1))),
            meta(&too_long, Some("v")),
        ] {
            let refused = storage.commit(vec![op]).committed().await;
            assert!(refused.is_err(), "{refused:?}");
        }
        assert!(storage.load_pending().await.unwrap().is_empty());
    }

    pub async fn concurrent_commits_from_many_tasks_are_all_durable_when_acknowledged(
        place: &Place,
    ) {
        let storage = place.open().await;
        let mut tasks = Vec::new();
        for t in 0..32 {
            let storage = Arc::clone(&storage);
            tasks.push(tokio::spawn(async move {
                for i in 0..8 {
                    let key = format!("t{t}-{i}");
                    storage.commit(vec![tool_call("cch_1", &key, i)]).committed().await.unwrap();
                    // Acknowledged means committed: another connection reads it at once.
                    assert!(storage.load_tool_call(&ch("cch_1"), &key).await.unwrap().is_some());
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        drop(storage);
        let reopened = place.open().await;
        for t in 0..32 {
            for i in 0..8 {
                let key = format!("t{t}-{i}");
                assert!(
                    reopened.load_tool_call(&ch("cch_1"), &key).await.unwrap().is_some(),
                    "{key}"
                );
            }
        }
    }

    pub async fn a_restart_sees_everything(place: &Place) {
        {
            let storage = place.open().await;
            storage.commit_channel(&channel("cch_1", 3)).committed().await.unwrap();
            commit(
                &*storage,
                vec![
                    meta("connector_id", Some("conn_r")),
                    meta("url_signing_secret", Some("s3cret")),
                    tool_call("cch_1", "call", 4),
                    WriteOp::Outbox(OutboxWrite::Save(pending("cch_1", "m1", 1))),
                    WriteOp::Idempotency(IdempotencyWrite::Save(completed("cch_1", "in", 5))),
                ],
            )
            .await;
        }
        let storage = place.open().await;
        assert_eq!(storage.load_connector_id().await.unwrap(), Some(ConnectorId::new("conn_r")));
        assert_eq!(
            storage.load_meta("url_signing_secret").await.unwrap().as_deref(),
            Some("s3cret")
        );
        assert_eq!(storage.load_channels().await.unwrap(), vec![channel("cch_1", 3)]);
        assert!(storage.load_tool_call(&ch("cch_1"), "call").await.unwrap().is_some());
        assert_eq!(pending_by_seq(&*storage).await, vec![pending("cch_1", "m1", 1)]);
        assert_eq!(completed_ids(&*storage, "cch_1", &["in"]).await, ["in"]);
    }
}

support::contract!(
    connector_id_round_trip,
    channels_with_bindings,
    delete_channel_removes_its_outbox_idempotency_and_tool_calls,
    a_tool_call_is_found_again_by_channel_and_key,
    prune_deletes_tool_calls_older_than_the_cut,
    meta_values_are_set_replaced_and_removed,
    outbox_save_attempt_delete_and_reload_in_seq_order,
    a_channels_pending_records_are_read_by_channel_and_by_message_id,
    idempotency_lookup_trim_and_expire,
    writes_apply_in_submission_order_within_and_across_submissions,
    a_failing_submission_acknowledges_nothing_and_fails_alone,
    ids_and_keys_have_the_same_size_limit_on_every_backend,
    concurrent_commits_from_many_tasks_are_all_durable_when_acknowledged,
    a_restart_sees_everything,
);

/// Rules only the PostgreSQL backend has.
#[cfg(feature = "postgres")]
mod postgres_only {
    use std::time::Duration;

    use xagent_server_runtime::ops::{DatabaseUrl, PgError, PoolOptions};
    use xagent_server_runtime::storage::{PostgresOptions, PostgresStorage};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_database_with_a_newer_schema_is_refused_with_schema_too_new() {
        let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
        drop(PostgresStorage::connect(&url, PostgresOptions::default()).await.unwrap());
        let pool = xagent_storage_postgres::connect(&url, PoolOptions::default()).await.unwrap();
        pool.get()
            .await
            .unwrap()
            .execute(
                "UPDATE xagent_schema SET version = version + 1 WHERE component = 'server-runtime'",
                &[],
            )
            .await
            .unwrap();
        let refused = PostgresStorage::connect(&url, PostgresOptions::default()).await.unwrap_err();
        let source = refused.source.downcast_ref::<PgError>();
        assert!(
            matches!(source, Some(PgError::SchemaTooNew { found, known, .. }) if *found == *known + 1),
            "{refused}"
        );
        assert!(refused.to_string().contains("upgrade"), "says what to do: {refused}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreachable_database_gives_a_clear_error_without_the_password() {
        // A port nothing listens on (bound, then released).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url =
            DatabaseUrl::parse(&format!("postgres://app:hunter2@127.0.0.1:{port}/state")).unwrap();
        let options = PostgresOptions::default()
            .with_pool(PoolOptions::default().with_connect_timeout(Duration::from_secs(2)));
        let refused =
            tokio::time::timeout(Duration::from_secs(20), PostgresStorage::connect(&url, options))
                .await
                .expect("fails within the connect timeout")
                .unwrap_err();
        let message = format!("{refused} {refused:?}");
        assert!(message.contains(&format!("127.0.0.1:{port}")), "names the server: {message}");
        assert!(!message.contains("hunter2"), "{message}");
    }
}
