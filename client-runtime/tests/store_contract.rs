//! The contract of `XagentStore`, one suite for every backend: each case is a function taking
//! a backend, called from one module per backend (memory, SQLite, and PostgreSQL with the
//! `postgres` feature, on testkit's real server). A backend passes when every case passes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use xagent_client_runtime::store::{
    AdmissionSnapshot, CommitError, Fence, LeaseRequest, LeaseState, RememberedChannel,
    XagentStore, XagentWrite,
};
use xagent_profile_im::{
    CompletedRecord, Fingerprint, IdempotencyWrite, OutboxWrite, PendingRecord,
};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};

type Opened = Pin<Box<dyn Future<Output = Arc<dyn XagentStore>> + Send>>;

/// A backend under test: `open` gives a store on the same data every time it is called (a
/// restarted process).
struct Backend {
    open: Box<dyn Fn() -> Opened + Send + Sync>,
}

impl Backend {
    async fn open(&self) -> Arc<dyn XagentStore> {
        (self.open)().await
    }
}

const CARD: &str = "im.contract";

fn id(text: &str) -> ConnectorChannelId {
    ConnectorChannelId::new(text)
}

fn pending(channel: &str, message: &str, seq: u64) -> PendingRecord {
    PendingRecord {
        channel: id(channel),
        message_id: MessageId::new(message),
        seq,
        payload: format!(
            r#"{{"type":"chat.message","payload":{{"message_id":"{message}","text":"hi"}}}}"#
        ),
        attempts: 0,
        first_responsibility_at: 1,
        expires_at: 3_600_001,
        next_attempt_at: 1,
        last_error: None,
    }
}

fn completed(channel: &str, message: &str, at: u64) -> CompletedRecord {
    CompletedRecord {
        channel: id(channel),
        message_id: MessageId::new(message),
        fingerprint: Fingerprint::from_hex("ab"),
        completed_at: at,
    }
}

fn save_channel(channel: &str, owner: Option<&str>) -> XagentWrite {
    XagentWrite::SaveChannel { channel: id(channel), owner: owner.map(str::to_owned) }
}

async fn commit(store: &Arc<dyn XagentStore>, writes: Vec<XagentWrite>) {
    store.commit(None, writes).await.expect("commits");
}

/// Channels, pending messages and completed ids, sorted, as the store holds them.
async fn snapshot(
    store: &Arc<dyn XagentStore>,
) -> (Vec<RememberedChannel>, Vec<String>, Vec<String>) {
    let channels = store.load_channels().await.expect("loads channels");
    let mut pending: Vec<String> = store
        .load_pending()
        .await
        .expect("loads pending")
        .into_iter()
        .map(|r| format!("{}/{}", r.channel, r.message_id))
        .collect();
    pending.sort();
    let mut done = Vec::new();
    for channel in ["cch_1", "cch_2", "cch_3", "cch_9"] {
        for message in ["in_1", "in_2", "in_3"] {
            if store
                .lookup_completed(&id(channel), &MessageId::new(message))
                .await
                .expect("looks up")
                .is_some()
            {
                done.push(format!("{channel}/{message}"));
            }
        }
    }
    (channels, pending, done)
}

/// Channels keep their order and owner (a save without an owner keeps the stored one); a
/// deleted channel is gone; all of it survives a restart.
async fn channels_and_owners_survive_a_restart(backend: Backend) {
    let store = backend.open().await;
    assert!(store.load_channels().await.expect("loads").is_empty(), "a fresh store is empty");
    commit(&store, vec![save_channel("cch_1", Some("alice")), save_channel("cch_2", None)]).await;
    commit(&store, vec![save_channel("cch_1", None), save_channel("cch_3", Some("carol"))]).await;
    commit(&store, vec![XagentWrite::DeleteChannel(id("cch_3"))]).await;
    drop(store);
    let store = backend.open().await;
    assert_eq!(
        store.load_channels().await.expect("loads"),
        vec![
            RememberedChannel { channel: id("cch_1"), owner: Some("alice".into()) },
            RememberedChannel { channel: id("cch_2"), owner: None },
        ]
    );
}

/// The `connector_id` is absent, then the last one stored, also after a restart.
async fn the_connector_id_survives_a_restart(backend: Backend) {
    let store = backend.open().await;
    assert_eq!(store.load_connector_id().await.expect("loads"), None);
    commit(&store, vec![XagentWrite::ConnectorId(ConnectorId::new("conn_1"))]).await;
    commit(&store, vec![XagentWrite::ConnectorId(ConnectorId::new("conn_2"))]).await;
    drop(store);
    let store = backend.open().await;
    assert_eq!(store.load_connector_id().await.expect("loads"), Some(ConnectorId::new("conn_2")));
}

fn card_snapshot(version: &str, skill: Option<&str>) -> AdmissionSnapshot {
    AdmissionSnapshot {
        card: serde_json::json!({
            "connector_card_id": CARD,
            "connector": {"name": "Contract", "version": version},
            "x_kept": {"unknown": [1, 2]}
        }),
        skill: skill.map(str::to_owned),
    }
}

fn admission(version: &str, skill: Option<&str>) -> XagentWrite {
    XagentWrite::Admission(card_snapshot(version, skill))
}

/// Architecture 10 (the Card snapshot and the Skill cache are durable): absent on a fresh
/// store, then the last one stored, unknown Card fields and the Skill text kept, also after a
/// restart; a Connector without a Skill is stored as such.
async fn the_card_snapshot_and_skill_cache_survive_a_restart(backend: Backend) {
    let store = backend.open().await;
    assert_eq!(store.load_admission().await.expect("loads"), None, "a fresh store has none");
    commit(&store, vec![admission("1.0.0", Some("---\nname: connector-im-contract\n---\n"))]).await;
    commit(&store, vec![admission("1.1.0", Some("---\nname: connector-im-contract\n---\nv2"))])
        .await;
    drop(store);
    let store = backend.open().await;
    let expected = card_snapshot("1.1.0", Some("---\nname: connector-im-contract\n---\nv2"));
    assert_eq!(store.load_admission().await.expect("loads"), Some(expected));
    commit(&store, vec![admission("1.2.0", None)]).await;
    let stored = store.load_admission().await.expect("loads").expect("stored");
    assert_eq!((stored.card["connector"]["version"].as_str(), stored.skill), (Some("1.2.0"), None));
}

/// The snapshot is replaced only by a batch that commits: a batch carrying a new snapshot and
/// a refused write leaves the previous Card and Skill in place, together.
async fn a_refused_batch_keeps_the_previous_card_snapshot(backend: Backend) {
    let store = backend.open().await;
    commit(&store, vec![admission("1.0.0", Some("old"))]).await;
    let refused = store
        .commit(
            None,
            vec![
                admission("2.0.0", Some("new")),
                XagentWrite::RenameChannel { from: id("cch_unknown"), to: id("cch_other") },
            ],
        )
        .await;
    assert!(refused.is_err(), "a rename of an unknown channel is refused");
    let stored = store.load_admission().await.expect("loads").expect("still stored");
    assert_eq!(
        (stored.card["connector"]["version"].as_str(), stored.skill.as_deref()),
        (Some("1.0.0"), Some("old"))
    );
}

/// A batch is applied in order; a batch with a refused write leaves none of its writes.
async fn a_batch_is_applied_in_order_and_all_or_none(backend: Backend) {
    let store = backend.open().await;
    commit(
        &store,
        vec![
            XagentWrite::Outbox(OutboxWrite::Save(pending("cch_1", "m1", 1))),
            XagentWrite::Outbox(OutboxWrite::Save(pending("cch_1", "m2", 2))),
            XagentWrite::Outbox(OutboxWrite::Delete(id("cch_1"), MessageId::new("m1"))),
            save_channel("cch_1", None),
        ],
    )
    .await;
    let before = snapshot(&store).await;
    assert_eq!(before.1, ["cch_1/m2"], "applied in order");
    let refused = store
        .commit(
            None,
            vec![
                XagentWrite::Outbox(OutboxWrite::Save(pending("cch_1", "m3", 3))),
                XagentWrite::Outbox(OutboxWrite::Delete(id("cch_1"), MessageId::new("m2"))),
                save_channel("cch_2", None),
                // Refused: the channel is not remembered.
                XagentWrite::RenameChannel { from: id("cch_404"), to: id("cch_5") },
            ],
        )
        .await;
    assert!(matches!(refused, Err(CommitError::Store(_))), "{refused:?}");
    assert_eq!(snapshot(&store).await, before, "the refused batch changed nothing");
}

/// Pending records keep every field and their attempt bookkeeping changes alone; completed
/// ids are found by a point read, trimmed to a channel's newest and expired by age.
async fn outbox_and_idempotency_records_round_trip(backend: Backend) {
    let store = backend.open().await;
    let mut record = pending("cch_1", "m1", 7);
    record.last_error = Some("timeout".into());
    commit(&store, vec![XagentWrite::Outbox(OutboxWrite::Save(record.clone()))]).await;
    let update = xagent_profile_im::AttemptUpdate {
        channel: id("cch_1"),
        message_id: MessageId::new("m1"),
        attempts: 3,
        next_attempt_at: 99,
        last_error: None,
    };
    commit(&store, vec![XagentWrite::Outbox(OutboxWrite::Attempt(update.clone()))]).await;
    update.apply_to(&mut record);
    assert_eq!(store.load_pending().await.expect("loads"), vec![record]);
    commit(
        &store,
        vec![
            XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_1", "in_1", 10))),
            XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_1", "in_2", 20))),
            XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_1", "in_3", 30))),
            XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_2", "in_1", 5))),
        ],
    )
    .await;
    let found = store.lookup_completed(&id("cch_1"), &MessageId::new("in_2")).await.expect("reads");
    assert_eq!(found, Some(completed("cch_1", "in_2", 20)));
    commit(
        &store,
        vec![XagentWrite::Idempotency(IdempotencyWrite::Trim { channel: id("cch_1"), keep: 2 })],
    )
    .await;
    assert_eq!(
        snapshot(&store).await.2,
        ["cch_1/in_2", "cch_1/in_3", "cch_2/in_1"],
        "newest two kept"
    );
    commit(&store, vec![XagentWrite::Idempotency(IdempotencyWrite::Expire { before: 25 })]).await;
    assert_eq!(snapshot(&store).await.2, ["cch_1/in_3"], "older than 25 expired");
}

/// A rename moves the channel (its owner kept), its outbox and its idempotency entries, and
/// it survives a restart; one onto a remembered id, of an unknown id, or onto an id with
/// stored messages is refused and changes nothing.
async fn rename_is_all_or_none(backend: Backend) {
    let store = backend.open().await;
    commit(
        &store,
        vec![
            save_channel("cch_1", Some("alice")),
            save_channel("cch_2", Some("bob")),
            XagentWrite::Outbox(OutboxWrite::Save(pending("cch_1", "m1", 1))),
            XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_1", "in_1", 1))),
            // Messages under an id nobody remembers (a channel forgotten mid-flight).
            XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_3", "in_3", 1))),
        ],
    )
    .await;
    let before = snapshot(&store).await;
    for (from, to, why) in [
        ("cch_1", "cch_2", "already remembered"),
        ("cch_404", "cch_5", "not remembered"),
        ("cch_1", "cch_3", "stored messages"),
    ] {
        let refused = store
            .commit(None, vec![XagentWrite::RenameChannel { from: id(from), to: id(to) }])
            .await;
        assert!(
            matches!(&refused, Err(error) if error.to_string().contains(why)),
            "{from} -> {to}: {refused:?}"
        );
        assert_eq!(snapshot(&store).await, before, "{from} -> {to} changed nothing");
    }
    commit(&store, vec![XagentWrite::RenameChannel { from: id("cch_1"), to: id("cch_9") }]).await;
    drop(store);
    let store = backend.open().await;
    let (channels, pending, done) = snapshot(&store).await;
    assert_eq!(
        channels,
        vec![
            RememberedChannel { channel: id("cch_9"), owner: Some("alice".into()) },
            RememberedChannel { channel: id("cch_2"), owner: Some("bob".into()) },
        ],
        "the owner and the place move with the channel"
    );
    assert_eq!(pending, ["cch_9/m1"]);
    assert_eq!(done, ["cch_3/in_3", "cch_9/in_1"]);
}

fn request(holder: &str, now: u64) -> LeaseRequest {
    LeaseRequest { card: CARD.into(), holder: holder.into(), now, ttl_ms: 4_000 }
}

fn held(state: LeaseState) -> (Fence, u64) {
    match state {
        LeaseState::Held { fence, expires_at } => (fence, expires_at),
        other => panic!("expected the lease to be held, got {other:?}"),
    }
}

/// One holder at a time: a second process sees the holder until the lease expires, then
/// takes it over with a higher fencing number; the old holder's renewal then reports the new
/// holder; a released lease is free at once.
async fn the_lease_has_one_holder_and_every_takeover_raises_the_fence(backend: Backend) {
    let store = backend.open().await;
    let (a, expires) = held(store.acquire_lease(&request("a", 1_000)).await.expect("acquires"));
    assert_eq!((a.number, expires), (1, 5_000));
    let seen = store.acquire_lease(&request("b", 2_000)).await.expect("reads");
    assert_eq!(seen, LeaseState::Other { holder: "a".into(), number: 1, expires_at: 5_000 });
    let (renewed, expires) = held(store.renew_lease(&a, 3_000, 4_000).await.expect("renews"));
    assert_eq!((renewed.clone(), expires), (a.clone(), 7_000));
    assert!(
        matches!(store.acquire_lease(&request("b", 6_999)).await, Ok(LeaseState::Other { .. })),
        "not before the renewed expiry"
    );
    let (b, _) = held(store.acquire_lease(&request("b", 7_000)).await.expect("takes over"));
    assert_eq!((b.holder.as_str(), b.number), ("b", 2));
    let stale = store.renew_lease(&a, 7_100, 4_000).await.expect("answers");
    assert!(
        matches!(stale, LeaseState::Other { ref holder, number: 2, .. } if holder == "b"),
        "{stale:?}"
    );
    store.release_lease(&a).await.expect("a stale release is ignored");
    assert!(matches!(
        store.acquire_lease(&request("a", 7_200)).await,
        Ok(LeaseState::Other { .. })
    ));
    store.release_lease(&b).await.expect("releases");
    let (a_again, _) = held(store.acquire_lease(&request("a", 7_300)).await.expect("free at once"));
    assert_eq!(a_again.number, 3);
    drop(store);
    let store = backend.open().await;
    let seen = store.acquire_lease(&request("c", 7_400)).await.expect("reads after a restart");
    assert!(matches!(seen, LeaseState::Other { number: 3, .. }), "{seen:?}");
}

/// The negative rule of fencing: once another process took the lease over, a batch written
/// under the old fence is refused by the database and changes nothing; the holder's batch
/// under the current fence commits.
async fn fencing_rule_a_stale_holder_cannot_write(backend: Backend) {
    let store = backend.open().await;
    let (a, _) = held(store.acquire_lease(&request("a", 1_000)).await.expect("acquires"));
    store
        .commit(Some(a.clone()), vec![save_channel("cch_1", None)])
        .await
        .expect("the holder writes");
    let (b, _) = held(store.acquire_lease(&request("b", 5_000)).await.expect("takes over"));
    let before = snapshot(&store).await;
    let stale = store
        .commit(
            Some(a.clone()),
            vec![
                XagentWrite::Idempotency(IdempotencyWrite::Save(completed("cch_1", "in_1", 6))),
                XagentWrite::Outbox(OutboxWrite::Delete(id("cch_1"), MessageId::new("m1"))),
                save_channel("cch_2", None),
            ],
        )
        .await;
    assert!(matches!(&stale, Err(CommitError::Fenced { number: 1, .. })), "{stale:?}");
    assert!(stale.is_err_and(|e| e.is_fenced()));
    assert_eq!(snapshot(&store).await, before, "nothing of the stale batch landed");
    // A forged fence (the right number, another holder) is refused too.
    let forged = Fence { holder: "a".into(), ..b.clone() };
    assert!(store.commit(Some(forged), vec![save_channel("cch_3", None)]).await.is_err());
    store.commit(Some(b), vec![save_channel("cch_2", None)]).await.expect("the new holder writes");
    assert_eq!(store.load_channels().await.expect("loads").len(), 2);
}

/// Every case, as `#[tokio::test]`s of one backend module.
macro_rules! contract_suite {
    ($backend:expr) => {
        #[tokio::test]
        async fn channels_and_owners_survive_a_restart() {
            super::channels_and_owners_survive_a_restart($backend).await;
        }
        #[tokio::test]
        async fn the_connector_id_survives_a_restart() {
            super::the_connector_id_survives_a_restart($backend).await;
        }
        #[tokio::test]
        async fn the_card_snapshot_and_skill_cache_survive_a_restart() {
            super::the_card_snapshot_and_skill_cache_survive_a_restart($backend).await;
        }
        #[tokio::test]
        async fn a_refused_batch_keeps_the_previous_card_snapshot() {
            super::a_refused_batch_keeps_the_previous_card_snapshot($backend).await;
        }
        #[tokio::test]
        async fn a_batch_is_applied_in_order_and_all_or_none() {
            super::a_batch_is_applied_in_order_and_all_or_none($backend).await;
        }
        #[tokio::test]
        async fn outbox_and_idempotency_records_round_trip() {
            super::outbox_and_idempotency_records_round_trip($backend).await;
        }
        #[tokio::test]
        async fn rename_is_all_or_none() {
            super::rename_is_all_or_none($backend).await;
        }
        #[tokio::test]
        async fn the_lease_has_one_holder_and_every_takeover_raises_the_fence() {
            super::the_lease_has_one_holder_and_every_takeover_raises_the_fence($backend).await;
        }
        #[tokio::test]
        async fn fencing_rule_a_stale_holder_cannot_write() {
            super::fencing_rule_a_stale_holder_cannot_write($backend).await;
        }
    };
}

mod memory {
    use super::*;
    use xagent_client_runtime::store::MemoryXagentStore;

    /// A "restart" is another handle on the same memory.
    fn backend() -> Backend {
        let store = MemoryXagentStore::new();
        Backend {
            open: Box::new(move || {
                let store: Arc<dyn XagentStore> = Arc::new(store.clone());
                Box::pin(async move { store })
            }),
        }
    }

    contract_suite!(backend());
}

mod sqlite {
    use super::*;
    use xagent_client_runtime::store::SqliteXagentStore;

    /// A fresh state directory; every open is a new connection on its file.
    fn backend() -> Backend {
        let dir = xagent_testkit::temp_state_dir("store-contract");
        Backend {
            open: Box::new(move || {
                let store = SqliteXagentStore::open(&dir).expect("opens");
                let store: Arc<dyn XagentStore> = Arc::new(store);
                Box::pin(async move { store })
            }),
        }
    }

    contract_suite!(backend());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use xagent_client_runtime::store::PostgresXagentStore;
    use xagent_testkit::postgres::TestPostgres;

    /// A fresh database on testkit's server; every open is a new pool (a new process).
    fn backend() -> Backend {
        let url = std::sync::Arc::new(tokio::sync::OnceCell::new());
        Backend {
            open: Box::new(move || {
                let url = std::sync::Arc::clone(&url);
                Box::pin(async move {
                    let url = url
                        .get_or_init(|| async {
                            TestPostgres::shared().await.fresh_database().await
                        })
                        .await;
                    let store = PostgresXagentStore::connect(url, CARD).await.expect("connects");
                    let store: Arc<dyn XagentStore> = Arc::new(store);
                    store
                })
            }),
        }
    }

    contract_suite!(backend());

    /// Two Cards in one database do not see each other's state (every row has its scope).
    #[tokio::test]
    async fn postgres_rule_two_cards_share_a_database_without_sharing_state() {
        let url = TestPostgres::shared().await.fresh_database().await;
        let one = PostgresXagentStore::connect(&url, "im.one").await.expect("connects");
        let two = PostgresXagentStore::connect(&url, "im.two").await.expect("connects");
        one.commit(None, vec![save_channel("cch_1", None)]).await.expect("commits");
        assert!(two.load_channels().await.expect("loads").is_empty());
        assert_eq!(one.scope(), "im.one");
    }
}
