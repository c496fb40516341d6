//! Tests of the SQLite storage: channels, tool calls, meta, IM stores, file modes.

use super::*;
use crate::binding::Binding;
use crate::storage::write_op::{binding_from_json, binding_to_json};
use xagent_profile_im::{OutboxWrite, PendingRecord};
use xagent_protocol_types::MessageId;
use xagent_protocol_types::{
    ConnectionStatus, DescriptorTarget, DescriptorTool, Secret, TargetType,
};
use xagent_protocol_types::{ToolId, ToolStatus};

fn channel(id: &str) -> ChannelRecord {
    ChannelRecord {
        id: ConnectorChannelId::new(id),
        connector_id: ConnectorId::new("conn_x"),
        status: ConnectionStatus::Connected,
        binding: Some(
            Binding::new(DescriptorTarget::new("echo", "Echo ab***"))
                .with_secret("token", Secret::new("t0k")),
        ),
        tool_overrides: [(
            ToolId::new("echo_send"),
            DescriptorTool::new("echo_send", ToolStatus::Unavailable),
        )]
        .into_iter()
        .collect(),
        created_at: 5,
    }
}

#[cfg(unix)]
#[tokio::test]
async fn m6_the_state_directory_and_the_database_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("state");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = SqliteStorage::open(&dir).unwrap();
    store.commit_meta("url_signing_secret", "s3cret").committed().await.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

#[tokio::test]
async fn file_database_uses_wal_and_survives_reopen() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    {
        let store = SqliteStorage::open(dir).unwrap();
        assert_eq!(store.journal_mode().unwrap(), "wal");
        store.commit_connector_id(Some(&ConnectorId::new("conn_a"))).committed().await.unwrap();
        store.commit_channel(&channel("cch_1")).committed().await.unwrap();
    }
    let store = SqliteStorage::open(dir).unwrap();
    assert_eq!(store.load_connector_id().await.unwrap(), Some(ConnectorId::new("conn_a")));
    let channels = store.load_channels().await.unwrap();
    assert_eq!(channels, vec![channel("cch_1")]);
    assert_eq!(channels[0].binding.as_ref().unwrap().secret("token").unwrap().expose(), "t0k");
}

#[tokio::test]
async fn delete_channel_cascades() {
    let store = SqliteStorage::in_memory().unwrap();
    let id = ConnectorChannelId::new("cch_1");
    store.commit_channel(&channel("cch_1")).committed().await.unwrap();
    let call = ToolCallRecord {
        fingerprint: "f".into(),
        result: Some(serde_json::json!({"ok": true})),
        error: None,
        completed_at: 10,
    };
    store.commit_tool_call(&id, "call_1", &call).committed().await.unwrap();
    assert_eq!(store.load_tool_call(&id, "call_1").await.unwrap(), Some(call));
    let pending = PendingRecord {
        channel: id.clone(),
        message_id: MessageId::new("m1"),
        seq: 1,
        payload: "{}".into(),
        attempts: 0,
        first_responsibility_at: 1,
        expires_at: 2,
        next_attempt_at: 1,
        last_error: None,
    };
    store.commit_im(vec![OutboxWrite::Save(pending)], Vec::new()).committed().await.unwrap();
    assert_eq!(store.load_pending().await.unwrap().len(), 1);
    store.commit_delete_channel(&id).committed().await.unwrap();
    assert!(store.load_channels().await.unwrap().is_empty());
    assert!(store.load_tool_call(&id, "call_1").await.unwrap().is_none());
    assert!(store.load_pending().await.unwrap().is_empty());
}

#[tokio::test]
async fn prune_tool_calls_by_age() {
    let store = SqliteStorage::in_memory().unwrap();
    let id = ConnectorChannelId::new("cch_1");
    for (key, at) in [("a", 10), ("b", 20)] {
        let record =
            ToolCallRecord { fingerprint: "f".into(), result: None, error: None, completed_at: at };
        store.commit_tool_call(&id, key, &record).committed().await.unwrap();
    }
    assert_eq!(store.prune_tool_calls(15).await.unwrap(), 1);
    assert!(store.load_tool_call(&id, "a").await.unwrap().is_none());
    assert!(store.load_tool_call(&id, "b").await.unwrap().is_some());
}

/// Admits a message as the runtime does: the point read only for ids memory does not hold.
async fn admit(
    set: &mut xagent_profile_im::ReceiverIdempotency<xagent_profile_im::DeferredStore>,
    storage: &SqliteStorage,
    channel: &ConnectorChannelId,
    message: &xagent_protocol_types::ChatMessage,
    now: u64,
) -> xagent_profile_im::Admission {
    let stored = if set.needs_lookup(channel, &message.message_id) {
        storage.lookup_completed(channel, &message.message_id).await.unwrap()
    } else {
        None
    };
    set.begin_chat_with_stored(channel, message, stored, now)
}

/// Completes an admitted message and commits its writes.
async fn complete(
    set: &mut xagent_profile_im::ReceiverIdempotency<xagent_profile_im::DeferredStore>,
    storage: &SqliteStorage,
    admission: xagent_profile_im::Admission,
    now: u64,
) {
    let xagent_profile_im::Admission::Process(ticket) = admission else { panic!("a new id") };
    let (channel, id) = (ticket.channel().clone(), ticket.message_id().clone());
    let (_, writes) = set.complete_deferred(ticket, now);
    storage.commit_im(Vec::new(), writes).committed().await.unwrap();
    set.committed(&channel, &id);
}

/// Receiver idempotency over the file database: ids live in `im_completed`, memory holds a
/// small cache; a redelivery after the cache dropped the id, a conflict, and a restart are all
/// answered from the store; a completion in the writer's queue but not committed is found by
/// a redelivery (it is held in memory until its commit).
#[tokio::test]
async fn idempotency_rule_completed_ids_are_answered_from_sqlite_after_cache_eviction_and_restart()
{
    use xagent_profile_im::{Admission, IdempotencyConfig, ReceiverIdempotency};
    use xagent_protocol_types::{AckStatus, ChatMessage};

    let temp = tempfile::tempdir().unwrap();
    let config = IdempotencyConfig { cache_capacity: 2, ..IdempotencyConfig::default() };
    let a = ConnectorChannelId::new("cch_a");
    let m1 = ChatMessage::text("m1", "hi");
    let changed = ChatMessage::text("m1", "changed");
    {
        let storage = SqliteStorage::open(temp.path()).unwrap();
        let mut set = ReceiverIdempotency::deferred(config);
        let Admission::Process(ticket) = admit(&mut set, &storage, &a, &m1, 1).await else {
            panic!()
        };
        let (ack, writes) = set.complete_deferred(ticket, 1);
        assert_eq!(ack.status, AckStatus::Accepted);
        // Batched, not committed yet: the store does not have it, the memory does.
        let commit = storage.commit_im(Vec::new(), writes);
        assert!(matches!(admit(&mut set, &storage, &a, &m1, 2).await, Admission::Duplicate(_)));
        commit.committed().await.unwrap();
        set.committed(&a, &MessageId::new("m1"));
        // Push m1 out of the two-entry cache with other channels' completions.
        for i in 0..3 {
            let other = ConnectorChannelId::new(format!("cch_{i}"));
            let m = ChatMessage::text(format!("x{i}"), "filler");
            let admission = admit(&mut set, &storage, &other, &m, 3).await;
            complete(&mut set, &storage, admission, 3).await;
        }
        assert_eq!(set.stats().remembered, 2);
        let lookups = set.stats().store_lookups;
        assert!(matches!(admit(&mut set, &storage, &a, &m1, 4).await, Admission::Duplicate(_)));
        assert_eq!(set.stats().store_lookups, lookups + 1, "answered by the point read");
        for id in ["y", "z"] {
            let m = ChatMessage::text(id, "filler");
            let admission = admit(&mut set, &storage, &a, &m, 5).await;
            complete(&mut set, &storage, admission, 5).await;
        }
        let conflict = admit(&mut set, &storage, &a, &changed, 6).await;
        assert!(matches!(conflict, Admission::Conflict(_)));
    }
    // Restart: nothing is loaded into memory, the store still answers both ways.
    let storage = SqliteStorage::open(temp.path()).unwrap();
    let mut set = ReceiverIdempotency::deferred(config);
    assert_eq!(set.stats().remembered, 0);
    assert!(matches!(admit(&mut set, &storage, &a, &m1, 60_000).await, Admission::Duplicate(_)));
    let conflict = admit(&mut set, &storage, &a, &changed, 60_000).await;
    assert!(matches!(conflict, Admission::Conflict(_)));
}

#[test]
fn the_reader_connection_keeps_a_small_page_cache() {
    let temp = tempfile::tempdir().unwrap();
    let storage = SqliteStorage::open(temp.path()).unwrap();
    let size: i64 =
        storage.lock().pragma_query_value(None, "cache_size", |row| row.get(0)).unwrap();
    assert_eq!(size, -READER_CACHE_KIB, "KiB (negative), not SQLite's 2,000 KiB default");
}

#[test]
fn a_binding_keeps_the_target_type_of_its_flow_and_older_bindings_read_without_one() {
    let binding = Binding::new(DescriptorTarget::new("lab", "Lab device"))
        .with_secret("device", Secret::new("dev-1"))
        .with_target_type(TargetType::Device);
    let text = binding_to_json(&binding).expect("encodes");
    let back = binding_from_json(&text).expect("decodes");
    assert_eq!(back, binding);
    assert_eq!(back.target_type(), Some(&TargetType::Device));
    let older = r#"{"target":{"provider":"lab","display_name":"Lab"},"secrets":{"device":"d"}}"#;
    let older = binding_from_json(older).expect("a binding stored before decodes");
    assert_eq!(older.target_type(), None);
    assert_eq!(older.secret("device").map(|s| s.expose().to_owned()).as_deref(), Some("d"));
}
