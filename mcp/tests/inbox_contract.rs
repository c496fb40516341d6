//! The contract of the bridge's inbox, one suite for both backends: each case is a function
//! taking a backend, called from one module per backend (SQLite in a state directory, and
//! PostgreSQL on testkit's real server). Every open is another process on the same data, so
//! the cross-bridge cases (two stores of one redelivered message at once, two takers at once)
//! run on two inboxes sharing it.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use xagent_mcp::inbox::{Copied, Inbox, InboxError, NewMessage, Stored, StoredFile};

type Opened = Pin<Box<dyn Future<Output = Inbox> + Send>>;

/// A backend under test: `open` gives an inbox on the same data every time it is called (a
/// restarted or another bridge).
struct Backend {
    open: Box<dyn Fn() -> Opened + Send + Sync>,
}

impl Backend {
    async fn open(&self) -> Inbox {
        (self.open)().await
    }
}

/// The file size limit every backend is opened with here.
const MAX_FILE: u64 = 4096;

fn message<'a>(channel: &'a str, id: &'a str, text: &'a str) -> NewMessage<'a> {
    NewMessage {
        channel,
        message_id: id,
        text: Some(text),
        files: &[],
        created_at: Some(1),
        received_at: 2,
    }
}

fn file(id: &str, size: u64) -> StoredFile {
    StoredFile {
        id: id.into(),
        filename: format!("{id}.txt"),
        mime_type: "text/plain".into(),
        byte_size: size,
    }
}

async fn store(inbox: &Inbox, message: NewMessage<'_>) -> Stored {
    inbox.store(&message).await.expect("stores")
}

async fn taken_id(inbox: &Inbox, channel: Option<&str>) -> Option<String> {
    inbox.take_next(channel).await.expect("takes").map(|m| m.message_id)
}

/// A redelivered `(channel, message_id)` lands once and says which message it was; the same
/// id on another channel is another message.
async fn a_redelivered_message_is_stored_once(backend: Backend) {
    let inbox = backend.open().await;
    let Stored::New(seq) = store(&inbox, message("cch_1", "m1", "hello")).await else {
        panic!("a first store is new");
    };
    assert_eq!(store(&inbox, message("cch_1", "m1", "hello")).await, Stored::Known(seq));
    assert!(matches!(store(&inbox, message("cch_2", "m1", "hi")).await, Stored::New(_)));
    assert!(inbox.contains("cch_1", "m1").await.expect("looks up"));
    assert!(!inbox.contains("cch_1", "m2").await.expect("looks up"));
    assert_eq!(inbox.recent("cch_1", 10).await.expect("reads").len(), 1);
    assert_eq!(inbox.count().await.expect("counts"), 2);
}

/// A message is handed once, also after a restart; the handed state is stored.
async fn a_message_is_handed_once_even_after_reopening(backend: Backend) {
    {
        let inbox = backend.open().await;
        store(&inbox, message("cch_1", "m1", "one")).await;
        store(&inbox, message("cch_1", "m2", "two")).await;
        assert_eq!(taken_id(&inbox, None).await.as_deref(), Some("m1"));
    }
    let inbox = backend.open().await;
    assert_eq!(inbox.pending(None).await.expect("counts"), 1);
    let next = inbox.take_next(Some("cch_1")).await.expect("takes").expect("m2 is pending");
    assert_eq!((next.message_id.as_str(), next.taken), ("m2", true));
    assert_eq!(next.text.as_deref(), Some("two"));
    assert_eq!((next.created_at, next.received_at), (Some(1), 2));
    assert_eq!(taken_id(&inbox, None).await, None);
    let recent = inbox.recent("cch_1", 10).await.expect("reads");
    assert_eq!(recent.iter().map(|m| m.message_id.as_str()).collect::<Vec<_>>(), ["m1", "m2"]);
    assert!(recent.iter().all(|m| m.taken));
}

/// A take names a channel or takes from any; pending counts follow.
async fn take_next_and_pending_filter_by_channel(backend: Backend) {
    let inbox = backend.open().await;
    store(&inbox, message("cch_1", "m1", "one")).await;
    store(&inbox, message("cch_2", "m2", "two")).await;
    assert_eq!(inbox.pending(None).await.expect("counts"), 2);
    assert_eq!(inbox.pending(Some("cch_2")).await.expect("counts"), 1);
    assert_eq!(inbox.pending(Some("cch_9")).await.expect("counts"), 0);
    assert_eq!(taken_id(&inbox, Some("cch_9")).await, None);
    assert_eq!(taken_id(&inbox, Some("cch_2")).await.as_deref(), Some("m2"));
    assert_eq!(inbox.pending(Some("cch_2")).await.expect("counts"), 0);
    assert_eq!(taken_id(&inbox, None).await.as_deref(), Some("m1"));
    assert_eq!(inbox.pending(None).await.expect("counts"), 0);
}

/// `recent` gives the latest `limit` messages of one channel, oldest first.
async fn recent_is_the_latest_messages_oldest_first(backend: Backend) {
    let inbox = backend.open().await;
    for id in ["m1", "m2", "m3", "m4"] {
        store(&inbox, message("cch_1", id, id)).await;
    }
    store(&inbox, message("cch_2", "other", "x")).await;
    let recent = inbox.recent("cch_1", 2).await.expect("reads");
    assert_eq!(recent.iter().map(|m| m.message_id.as_str()).collect::<Vec<_>>(), ["m3", "m4"]);
    assert!(recent[0].seq < recent[1].seq, "seq grows with arrival");
    assert!(inbox.recent("cch_9", 10).await.expect("reads").is_empty());
}

/// A file's bytes are kept before its message is stored; its record and bytes are read by
/// id once the message is stored; the file list is newest first.
async fn file_records_and_bytes_round_trip(backend: Backend) {
    let inbox = backend.open().await;
    inbox.save_file("f_a", b"alpha".to_vec(), 10).await.expect("saves");
    inbox.save_file("f_b", b"bravo!".to_vec(), 10).await.expect("saves");
    assert_eq!(inbox.saved_size("f_a").await.expect("sizes"), Some(5));
    assert_eq!(inbox.saved_size("f_none").await.expect("sizes"), None);
    // Saved bytes no stored message names are no file of the inbox.
    assert_eq!(inbox.read_file("f_a").await.expect("reads"), None);
    let first = [file("f_a", 5)];
    store(&inbox, NewMessage { files: &first, ..message("cch_1", "m1", "with a") }).await;
    let second = [file("f_b", 6)];
    store(&inbox, NewMessage { files: &second, ..message("cch_1", "m2", "with b") }).await;
    assert_eq!(inbox.file("f_a").await.expect("reads"), Some(file("f_a", 5)));
    assert_eq!(inbox.file("f_none").await.expect("reads"), None);
    assert_eq!(inbox.read_file("f_b").await.expect("reads"), Some(b"bravo!".to_vec()));
    assert_eq!(inbox.read_file("f_none").await.expect("reads"), None);
    let listed: Vec<String> =
        inbox.files(10).await.expect("lists").into_iter().map(|f| f.id).collect();
    assert_eq!(listed, ["f_b", "f_a"]);
    assert_eq!(inbox.files(1).await.expect("lists").len(), 1);
    let taken = inbox.take_next(None).await.expect("takes").expect("m1");
    assert_eq!(taken.files, first);
    // Another bridge (a restart) reads the same bytes.
    drop(inbox);
    let again = backend.open().await;
    assert_eq!(again.read_file("f_a").await.expect("reads"), Some(b"alpha".to_vec()));
}

/// The size limit: a file of exactly the limit is kept, one byte more is refused.
async fn limit_a_file_larger_than_the_limit_is_refused(backend: Backend) {
    let inbox = backend.open().await;
    assert_eq!(inbox.max_file_bytes(), MAX_FILE);
    let limit = usize::try_from(MAX_FILE).expect("fits");
    inbox.save_file("f_max", vec![7; limit], 1).await.expect("a file at the limit is kept");
    let refused = inbox.save_file("f_over", vec![7; limit + 1], 1).await;
    assert!(
        matches!(refused, Err(InboxError::FileTooLarge { size, max: MAX_FILE, .. }) if size == MAX_FILE + 1),
        "{refused:?}"
    );
    assert_eq!(inbox.saved_size("f_over").await.expect("sizes"), None, "nothing was kept");
}

/// Pruning forgets messages handed before the cutoff with their files (records and bytes);
/// a message not handed stays, however old.
async fn pruning_forgets_only_old_handed_messages_and_their_files(backend: Backend) {
    let inbox = backend.open().await;
    inbox.save_file("f_old", b"a".to_vec(), 1).await.expect("saves");
    let files = [file("f_old", 1)];
    store(&inbox, NewMessage { files: &files, ..message("cch_1", "m1", "old") }).await;
    store(&inbox, message("cch_1", "m2", "old, handed")).await;
    store(&inbox, NewMessage { received_at: 50, ..message("cch_1", "m3", "new") }).await;
    for expected in ["m1", "m2", "m3"] {
        assert_eq!(taken_id(&inbox, None).await.as_deref(), Some(expected));
    }
    store(&inbox, message("cch_1", "m4", "old, pending")).await;
    assert_eq!(inbox.prune_taken(10).await.expect("prunes"), 2);
    let left: Vec<String> =
        inbox.recent("cch_1", 10).await.expect("reads").into_iter().map(|m| m.message_id).collect();
    assert_eq!(left, ["m3", "m4"]);
    assert_eq!(inbox.file("f_old").await.expect("reads"), None);
    assert_eq!(inbox.saved_size("f_old").await.expect("sizes"), None, "the bytes went too");
    assert!(inbox.files(10).await.expect("lists").is_empty());
    assert_eq!(inbox.prune_taken(10).await.expect("prunes"), 0);
}

/// Bytes saved for a message that was never stored (refused after its download) go with a
/// prune whose cutoff is past their saving; bytes a stored message names stay.
async fn pruning_forgets_bytes_no_message_names(backend: Backend) {
    let inbox = backend.open().await;
    let long_ago = 1;
    inbox.save_file("f_orphan", b"left".to_vec(), long_ago).await.expect("saves");
    inbox.save_file("f_named", b"kept".to_vec(), long_ago).await.expect("saves");
    let files = [file("f_named", 4)];
    store(&inbox, NewMessage { files: &files, ..message("cch_1", "m1", "pending") }).await;
    // A cutoff an hour from now is past every saving (the SQLite backend dates its files by
    // their modification time).
    let now = xagent_protocol_types::Clock::now_millis(&xagent_protocol_types::SystemClock);
    assert_eq!(inbox.prune_taken(now + 3_600_000).await.expect("prunes"), 0);
    assert_eq!(inbox.saved_size("f_orphan").await.expect("sizes"), None);
    assert_eq!(inbox.read_file("f_named").await.expect("reads"), Some(b"kept".to_vec()));
}

/// Two bridges taking at the same time never get the same message, and every message is
/// handed.
async fn concurrency_two_bridges_never_take_the_same_message(backend: Backend) {
    let one = Arc::new(backend.open().await);
    let two = Arc::new(backend.open().await);
    let ids: Vec<String> = (0..60).map(|i| format!("m{i:02}")).collect();
    for id in &ids {
        store(&one, message("cch_1", id, "x")).await;
    }
    let takers: Vec<_> = [&one, &two, &one, &two]
        .into_iter()
        .map(|inbox| {
            let inbox = Arc::clone(inbox);
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(id) = taken_id(&inbox, None).await {
                    got.push(id);
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for taker in takers {
        all.extend(taker.await.expect("the taker ran"));
    }
    all.sort();
    assert_eq!(all, ids, "each message handed exactly once");
}

/// Two bridges storing the same redelivered message at the same time store it once: one of
/// them finds it new, the other known.
async fn concurrency_two_bridges_store_one_redelivery_once(backend: Backend) {
    let one = Arc::new(backend.open().await);
    let two = Arc::new(backend.open().await);
    for round in 0..20 {
        let id = format!("m{round}");
        let stores: Vec<_> = [&one, &two]
            .into_iter()
            .map(|inbox| {
                let (inbox, id) = (Arc::clone(inbox), id.clone());
                tokio::spawn(async move { store(&inbox, message("cch_1", &id, "once")).await })
            })
            .collect();
        let mut outcomes = Vec::new();
        for stored in stores {
            outcomes.push(stored.await.expect("the store ran"));
        }
        let new: Vec<_> = outcomes.iter().filter(|s| matches!(s, Stored::New(_))).collect();
        assert_eq!(new.len(), 1, "round {round}: {outcomes:?}");
        let seqs: BTreeSet<i64> =
            outcomes.iter().map(|(Stored::New(s) | Stored::Known(s))| *s).collect();
        assert_eq!(seqs.len(), 1, "both name the one message: {outcomes:?}");
    }
    assert_eq!(one.count().await.expect("counts"), 20);
    assert_eq!(two.pending(None).await.expect("counts"), 20);
}

/// A copy from a SQLite inbox keeps every message in order, its handed state and its files'
/// bytes; a target holding messages is refused.
async fn a_sqlite_inbox_copies_into_this_backend(backend: Backend) {
    let dir = xagent_testkit::temp_state_dir("inbox-copy");
    let source = Inbox::open(&dir, MAX_FILE).expect("opens the source");
    source.save_file("f_1", b"one".to_vec(), 1).await.expect("saves");
    let files = [file("f_1", 3)];
    store(&source, NewMessage { files: &files, ..message("cch_1", "m1", "first") }).await;
    store(&source, message("cch_1", "m2", "second")).await;
    store(&source, message("cch_2", "m3", "third")).await;
    assert_eq!(taken_id(&source, None).await.as_deref(), Some("m1"));
    let target = backend.open().await;
    let copied = source.copy_into(&target, 5).await.expect("copies");
    assert_eq!(copied, Copied { messages: 3, files: 1, bytes: 3 });
    assert_eq!(target.pending(None).await.expect("counts"), 2);
    assert_eq!(target.read_file("f_1").await.expect("reads"), Some(b"one".to_vec()));
    assert_eq!(taken_id(&target, None).await.as_deref(), Some("m2"), "m1 stays handed");
    assert_eq!(taken_id(&target, None).await.as_deref(), Some("m3"));
    let again = source.copy_into(&target, 5).await;
    assert!(matches!(again, Err(InboxError::TargetNotEmpty(3))), "{again:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Every case, as `#[tokio::test]`s of one backend module.
macro_rules! contract_suite {
    ($backend:expr) => {
        contract_suite!(@cases $backend;
            a_redelivered_message_is_stored_once,
            a_message_is_handed_once_even_after_reopening,
            take_next_and_pending_filter_by_channel,
            recent_is_the_latest_messages_oldest_first,
            file_records_and_bytes_round_trip,
            limit_a_file_larger_than_the_limit_is_refused,
            pruning_forgets_only_old_handed_messages_and_their_files,
            pruning_forgets_bytes_no_message_names,
            concurrency_two_bridges_never_take_the_same_message,
            concurrency_two_bridges_store_one_redelivery_once,
            a_sqlite_inbox_copies_into_this_backend,
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case($backend).await;
            }
        )*
    };
}

mod sqlite {
    use super::*;

    /// A fresh state directory; every open is a new connection on its file.
    fn backend() -> Backend {
        let dir = xagent_testkit::temp_state_dir("inbox-contract");
        Backend {
            open: Box::new(move || {
                let inbox = Inbox::open(&dir, MAX_FILE).expect("opens");
                Box::pin(async move { inbox })
            }),
        }
    }

    contract_suite!(backend());
}

mod postgres {
    use super::*;
    use xagent_storage_postgres::{DatabaseUrl, PoolOptions};
    use xagent_testkit::postgres::TestPostgres;

    async fn open(url: &DatabaseUrl, scope: &str) -> Inbox {
        let pool =
            xagent_storage_postgres::connect(url, PoolOptions::default()).await.expect("connects");
        Inbox::open_postgres(pool, scope, MAX_FILE).await.expect("opens")
    }

    /// A fresh database on testkit's server; every open is a new pool (another bridge).
    fn backend() -> Backend {
        let url = Arc::new(tokio::sync::OnceCell::new());
        Backend {
            open: Box::new(move || {
                let url = Arc::clone(&url);
                Box::pin(async move {
                    let url = url
                        .get_or_init(|| async {
                            TestPostgres::shared().await.fresh_database().await
                        })
                        .await;
                    open(url, "im.contract").await
                })
            }),
        }
    }

    contract_suite!(backend());

    /// Two Cards in one database do not see each other's messages or files.
    #[tokio::test]
    async fn postgres_rule_two_cards_share_a_database_without_sharing_an_inbox() {
        let url = TestPostgres::shared().await.fresh_database().await;
        let one = open(&url, "im.one").await;
        let two = open(&url, "im.two").await;
        one.save_file("f_1", b"x".to_vec(), 1).await.expect("saves");
        let files = [file("f_1", 1)];
        store(&one, NewMessage { files: &files, ..message("cch_1", "m1", "for one") }).await;
        assert_eq!(two.pending(None).await.expect("counts"), 0);
        assert_eq!(two.file("f_1").await.expect("reads"), None);
        assert_eq!(two.saved_size("f_1").await.expect("sizes"), None);
        assert_eq!(taken_id(&two, None).await, None);
        assert!(matches!(store(&two, message("cch_1", "m1", "for two")).await, Stored::New(_)));
        assert_eq!(one.pending(None).await.expect("counts"), 1);
    }

    /// A shared inbox tells waiters to look again; a SQLite one does not need to.
    #[tokio::test]
    async fn postgres_rule_a_shared_inbox_is_polled() {
        let url = TestPostgres::shared().await.fresh_database().await;
        assert!(open(&url, "im.poll").await.poll_interval().is_some());
        let dir = xagent_testkit::temp_state_dir("inbox-poll");
        assert!(Inbox::open(&dir, MAX_FILE).expect("opens").poll_interval().is_none());
        let _ = std::fs::remove_dir_all(dir);
    }
}
