//! Tests of the SQLite storage: channels, tool calls, meta, IM stores, file modes.

use super::*;
use xagent_profile_im::PendingRecord;
use xagent_protocol_types::MessageId;
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
#[test]
fn m6_the_state_directory_and_the_database_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("state");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let store = SqliteStorage::open(&dir).unwrap();
    store.save_meta("url_signing_secret", "s3cret").unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

#[test]
fn file_database_uses_wal_and_survives_reopen() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    {
        let store = SqliteStorage::open(dir).unwrap();
        assert_eq!(store.journal_mode().unwrap(), "wal");
        store.save_connector_id(Some(&ConnectorId::new("conn_a"))).unwrap();
        store.save_channel(&channel("cch_1")).unwrap();
    }
    let store = SqliteStorage::open(dir).unwrap();
    assert_eq!(store.load_connector_id().unwrap(), Some(ConnectorId::new("conn_a")));
    let channels = store.load_channels().unwrap();
    assert_eq!(channels, vec![channel("cch_1")]);
    assert_eq!(channels[0].binding.as_ref().unwrap().secret("token").unwrap().expose(), "t0k");
}

#[test]
fn delete_channel_cascades() {
    let mut store = SqliteStorage::in_memory().unwrap();
    let id = ConnectorChannelId::new("cch_1");
    store.save_channel(&channel("cch_1")).unwrap();
    let call = ToolCallRecord {
        fingerprint: "f".into(),
        result: Some(serde_json::json!({"ok": true})),
        error: None,
        completed_at: 10,
    };
    store.save_tool_call(&id, "call_1", &call).unwrap();
    assert_eq!(store.load_tool_call(&id, "call_1").unwrap(), Some(call));
    store
        .save_pending(&PendingRecord {
            channel: id.clone(),
            message_id: MessageId::new("m1"),
            seq: 1,
            payload: "{}".into(),
            attempts: 0,
            first_responsibility_at: 1,
            expires_at: 2,
            next_attempt_at: 1,
            last_error: None,
        })
        .unwrap();
    assert_eq!(store.load_pending().unwrap().len(), 1);
    store.delete_channel(&id).unwrap();
    assert!(store.load_channels().unwrap().is_empty());
    assert!(store.load_tool_call(&id, "call_1").unwrap().is_none());
    assert!(store.load_pending().unwrap().is_empty());
}

#[test]
fn prune_tool_calls_by_age() {
    let store = SqliteStorage::in_memory().unwrap();
    let id = ConnectorChannelId::new("cch_1");
    for (key, at) in [("a", 10), ("b", 20)] {
        let record =
            ToolCallRecord { fingerprint: "f".into(), result: None, error: None, completed_at: at };
        store.save_tool_call(&id, key, &record).unwrap();
    }
    assert_eq!(store.prune_tool_calls(15).unwrap(), 1);
    assert!(store.load_tool_call(&id, "a").unwrap().is_none());
    assert!(store.load_tool_call(&id, "b").unwrap().is_some());
}
