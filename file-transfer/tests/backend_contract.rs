//! The file store's contract, one suite for every backend: each case is a function taking a
//! [`Harness`], run once on a directory and (feature `postgres`) once on a fresh PostgreSQL
//! database from testkit (or `XAGENT_TEST_DATABASE_URL`).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{START, TempDir};
use tokio::io::AsyncReadExt;
use xagent_file_transfer::{
    CleanupReport, FileStore, NewFile, StoreConfig, StoreUsage, TransferError, UrlSigner,
};
use xagent_protocol_types::{ConnectorChannelId, FileType, ManualClock, Secret};

const HOUR: u64 = 60 * 60 * 1000;
const KIB: usize = 1024;

/// Where a case's stores live; every [`Harness::open`] opens another store on the same place.
enum Place {
    Dir(TempDir),
    #[cfg(feature = "postgres")]
    Postgres(Box<xagent_storage_postgres::DatabaseUrl>),
}

/// One backend under test, with the simulated clock every store of the case shares.
struct Harness {
    place: Place,
    clock: ManualClock,
}

impl Harness {
    fn dir() -> Self {
        Self { place: Place::Dir(TempDir::new("contract")), clock: ManualClock::new(START) }
    }

    #[cfg(feature = "postgres")]
    async fn postgres() -> Self {
        let url = xagent_testkit::postgres::TestPostgres::shared().await.fresh_database().await;
        Self { place: Place::Postgres(Box::new(url)), clock: ManualClock::new(START) }
    }

    /// A store on this backend (a restart when an earlier one was dropped).
    async fn open(&self, config: StoreConfig) -> FileStore {
        self.try_open(config).await.unwrap()
    }

    async fn try_open(&self, config: StoreConfig) -> Result<FileStore, TransferError> {
        let signer = UrlSigner::new(Secret::new("contract-test-url-secret")).unwrap();
        match &self.place {
            Place::Dir(dir) => FileStore::open(&dir.0, config, signer, self.clock.clone()).await,
            #[cfg(feature = "postgres")]
            Place::Postgres(url) => {
                let options = xagent_storage_postgres::PoolOptions::default().with_max_size(4);
                let pool = xagent_storage_postgres::connect(url, options).await?;
                FileStore::open_postgres(
                    pool,
                    config,
                    signer,
                    std::sync::Arc::new(self.clock.clone()),
                )
                .await
            }
        }
    }

    /// A second replica beside `first`: on a directory (one process owns it) the same store,
    /// on a database another store with its own connections.
    async fn replica(&self, first: &FileStore, config: StoreConfig) -> FileStore {
        match &self.place {
            Place::Dir(_) => {
                let _ = config;
                first.clone()
            }
            #[cfg(feature = "postgres")]
            Place::Postgres(_) => self.open(config).await,
        }
    }

    fn advance(&self, millis: u64) {
        self.clock.advance(millis);
    }
}

fn channel(name: &str) -> ConnectorChannelId {
    ConnectorChannelId::new(name)
}

async fn read_all(store: &FileStore, file_ref: &xagent_protocol_types::FileRef) -> Vec<u8> {
    let (_, mut reader) = store.open_file(file_ref).await.unwrap();
    let mut content = Vec::new();
    reader.read_to_end(&mut content).await.unwrap();
    content
}

/// Bytes whose every position is recognisable.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8 ^ (i / 251 % 256) as u8).collect()
}

/// Polls until the store's usage is `expected` (a dropped upload is discarded by a task).
async fn usage_becomes(store: &FileStore, expected: StoreUsage) {
    for _ in 0..200 {
        if store.usage().await.unwrap() == expected {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(store.usage().await.unwrap(), expected);
}

async fn register_read_and_delete(h: Harness) {
    let store = h.open(StoreConfig::default()).await;
    let registered = store
        .register_bytes(
            NewFile::new(channel("cch_a"), "photo.JPG")
                .with_recipient_ref("r1")
                .with_reply_token("t1"),
            b"jpeg bytes",
        )
        .await
        .unwrap();
    let record = &registered.record;
    assert_eq!(record.byte_size, 10);
    assert_eq!(record.mime_type, "image/jpeg");
    assert_eq!(record.file_type, FileType::Image);
    assert_eq!(record.expires_at, START + 24 * HOUR);
    assert!(registered.download.url.starts_with(&format!("/files/refs/{}?exp=", record.file_ref)));
    assert_eq!(registered.chat_file().byte_size, Some(10));
    assert_eq!(store.get(&record.file_ref).await.unwrap().as_ref(), Some(record));
    assert_eq!(read_all(&store, &record.file_ref).await, b"jpeg bytes");
    let mut part = Vec::new();
    store.open_range(record, 5, 3).await.unwrap().read_to_end(&mut part).await.unwrap();
    assert_eq!(part, b"byt");
    let usage = store.usage().await.unwrap();
    assert_eq!(usage, StoreUsage { files: 1, bytes: 10, pending_files: 0, pending_bytes: 0 });

    assert!(store.remove(&record.file_ref).await.unwrap());
    assert!(!store.remove(&record.file_ref).await.unwrap(), "a second removal finds nothing");
    assert!(store.get(&record.file_ref).await.unwrap().is_none());
    assert!(matches!(store.open_file(&record.file_ref).await, Err(TransferError::FileNotFound(_))));
    assert_eq!(store.usage().await.unwrap(), StoreUsage::default());
}

async fn streams_and_readers_of_many_chunks_round_trip_with_ranges(h: Harness) {
    let store = h.open(StoreConfig::default()).await;
    // Odd chunk sizes, more than two 256 KiB rows on a database.
    let content = pattern(700 * KIB + 13);
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        content.chunks(7 * KIB + 3).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let streamed = store
        .register_stream(NewFile::new(channel("c"), "a.txt"), futures_util::stream::iter(chunks))
        .await
        .unwrap();
    assert_eq!(streamed.record.byte_size, content.len() as u64);
    assert_eq!(streamed.record.mime_type, "text/plain");
    assert_eq!(read_all(&store, &streamed.record.file_ref).await, content);
    for (start, len) in [(0, 1), (256 * KIB - 1, 2), (300 * KIB, 300 * KIB), (700 * KIB, 100)] {
        let mut part = Vec::new();
        store
            .open_range(&streamed.record, start as u64, len as u64)
            .await
            .unwrap()
            .read_to_end(&mut part)
            .await
            .unwrap();
        let end = (start + len).min(content.len());
        assert_eq!(part, &content[start..end], "range {start}+{len}");
    }
    let read = store
        .register_reader(NewFile::new(channel("c"), "b.bin"), &content[..300 * KIB])
        .await
        .unwrap();
    assert_eq!(read.record.file_type, FileType::File);
    assert_eq!(read_all(&store, &read.record.file_ref).await, &content[..300 * KIB]);
    let empty = store.register_bytes(NewFile::new(channel("c"), "e"), b"").await.unwrap();
    assert_eq!(read_all(&store, &empty.record.file_ref).await, b"");
}

async fn limit_per_file_is_refused_while_streaming(h: Harness) {
    let store = h.open(StoreConfig::default().with_max_file_bytes(5)).await;
    let mut pending = store.begin(NewFile::new(channel("c"), "a")).await.unwrap();
    pending.write(b"12345").await.unwrap();
    assert!(matches!(pending.write(b"6").await, Err(TransferError::TooLarge { limit: 5 })));
    drop(pending);
    let endless =
        futures_util::stream::repeat_with(|| Ok::<_, std::io::Error>(Bytes::from_static(b"x")));
    let refused = store.register_stream(NewFile::new(channel("c"), "b"), endless).await;
    assert!(matches!(refused, Err(TransferError::TooLarge { limit: 5 })), "an endless stream ends");
    usage_becomes(&store, StoreUsage::default()).await;
}

async fn limit_total_bytes_is_refused_while_streaming_and_released(h: Harness) {
    let store = h.open(StoreConfig::default().with_max_total_bytes(10)).await;
    store.register_bytes(NewFile::new(channel("c"), "a"), [0u8; 6]).await.unwrap();
    let mut too_big = store.begin(NewFile::new(channel("c"), "b")).await.unwrap();
    too_big.write(&[0u8; 4]).await.unwrap();
    assert!(matches!(too_big.write(&[0u8; 1]).await, Err(TransferError::CapacityExceeded)));
    drop(too_big);
    usage_becomes(&store, StoreUsage { files: 1, bytes: 6, pending_files: 0, pending_bytes: 0 })
        .await;
    store.register_bytes(NewFile::new(channel("c"), "c"), [0u8; 4]).await.unwrap();
    let usage = store.usage().await.unwrap();
    assert_eq!((usage.files, usage.bytes), (2, 10));
}

async fn limit_file_count_is_refused_and_expired_files_make_room(h: Harness) {
    let store = h.open(StoreConfig::default().with_max_files(2)).await;
    let first = store.register_bytes(NewFile::new(channel("c"), "1"), b"1").await.unwrap();
    let pending = store.begin(NewFile::new(channel("c"), "2")).await.unwrap();
    let third = store.register_bytes(NewFile::new(channel("c"), "3"), b"3").await;
    assert!(matches!(third, Err(TransferError::CapacityExceeded)), "uploads in progress count");
    drop(pending);
    usage_becomes(&store, StoreUsage { files: 1, bytes: 1, pending_files: 0, pending_bytes: 0 })
        .await;
    store.register_bytes(NewFile::new(channel("c"), "4"), b"4").await.unwrap();
    assert!(matches!(
        store.register_bytes(NewFile::new(channel("c"), "5"), b"5").await,
        Err(TransferError::CapacityExceeded)
    ));
    assert!(
        store.get(&first.record.file_ref).await.unwrap().is_some(),
        "nothing unexpired is evicted"
    );
    h.advance(25 * HOUR);
    store.register_bytes(NewFile::new(channel("c"), "6"), b"6").await.unwrap();
    assert_eq!(store.usage().await.unwrap().files, 1, "the expired files were reclaimed");
}

async fn interleaved_uploads_share_the_byte_capacity(h: Harness) {
    let store = h.open(StoreConfig::default().with_max_total_bytes(10)).await;
    let mut first = store.begin(NewFile::new(channel("c"), "1")).await.unwrap();
    let mut second = store.begin(NewFile::new(channel("c"), "2")).await.unwrap();
    first.write(&[0; 6]).await.unwrap();
    assert!(matches!(second.write(&[0; 5]).await, Err(TransferError::CapacityExceeded)));
    // A refused write keeps nothing: a smaller one still fits.
    second.write(&[0; 4]).await.unwrap();
    assert_eq!(
        store.usage().await.unwrap(),
        StoreUsage { files: 0, bytes: 0, pending_files: 2, pending_bytes: 10 }
    );
    first.finish().await.unwrap();
    second.finish().await.unwrap();
    let usage = store.usage().await.unwrap();
    assert_eq!((usage.bytes, usage.pending_bytes), (10, 0));
}

async fn concurrent_uploads_on_two_replicas_cannot_exceed_the_total(h: Harness) {
    let config = StoreConfig::default().with_max_total_bytes(100 * KIB as u64);
    let a = h.open(config.clone()).await;
    let b = h.replica(&a, config).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            let chunks = (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 4 * KIB])));
            store
                .register_stream(
                    NewFile::new(channel("c"), format!("{i}")),
                    futures_util::stream::iter(chunks),
                )
                .await
        }));
    }
    let mut stored = 0u64;
    let mut refused = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(file) => stored += file.record.byte_size,
            Err(TransferError::CapacityExceeded) => refused += 1,
            Err(other) => panic!("unexpected {other}"),
        }
    }
    assert!(stored <= 100 * KIB as u64, "{stored} bytes stored past the quota");
    assert!(refused >= 9, "16 files of 16 KiB cannot all fit in 100 KiB ({refused} refused)");
    usage_becomes(&a, StoreUsage { files: 16 - refused, bytes: stored, ..StoreUsage::default() })
        .await;
}

async fn two_replicas_see_each_others_files(h: Harness) {
    let a = h.open(StoreConfig::default()).await;
    let b = h.replica(&a, StoreConfig::default()).await;
    let on_a = a.register_bytes(NewFile::new(channel("c"), "a.txt"), b"from a").await.unwrap();
    assert_eq!(b.get(&on_a.record.file_ref).await.unwrap().as_ref(), Some(&on_a.record));
    assert_eq!(read_all(&b, &on_a.record.file_ref).await, b"from a");
    let mut pending = b.begin(NewFile::new(channel("c"), "b.txt")).await.unwrap();
    pending.write(b"from b").await.unwrap();
    let file_ref = pending.file_ref().clone();
    assert!(a.get(&file_ref).await.unwrap().is_none(), "not visible before it is finished");
    pending.finish().await.unwrap();
    assert_eq!(read_all(&a, &file_ref).await, b"from b");
    assert!(b.remove(&on_a.record.file_ref).await.unwrap());
    assert!(a.get(&on_a.record.file_ref).await.unwrap().is_none(), "a removal is seen everywhere");
}

async fn ttl_expiry_hides_the_file_and_cleanup_deletes_it(h: Harness) {
    let store = h.open(StoreConfig::default().with_ttl(Duration::from_secs(3600))).await;
    let older = store.register_bytes(NewFile::new(channel("c"), "a"), b"1").await.unwrap();
    h.advance(HOUR / 2);
    let younger = store.register_bytes(NewFile::new(channel("c"), "b"), b"22").await.unwrap();
    h.advance(HOUR / 2 - 1);
    assert!(store.get(&older.record.file_ref).await.unwrap().is_some());
    h.advance(1);
    assert!(store.get(&older.record.file_ref).await.unwrap().is_none(), "expired at the TTL");
    assert!(matches!(
        store.open_file(&older.record.file_ref).await,
        Err(TransferError::FileNotFound(_))
    ));
    assert_eq!(store.cleanup(store.now()).await.unwrap(), CleanupReport { files: 1, bytes: 1 });
    let usage = store.usage().await.unwrap();
    assert_eq!((usage.files, usage.bytes), (1, 2));
    assert!(store.get(&younger.record.file_ref).await.unwrap().is_some());
    assert_eq!(store.cleanup(store.now()).await.unwrap(), CleanupReport::default());
    let url = store.download_url(&younger.record);
    h.advance(HOUR / 2 - 60_000);
    assert!(url.expires_at <= younger.record.expires_at);
    assert_eq!(store.download_url(&younger.record).expires_at, younger.record.expires_at);
}

async fn an_interrupted_upload_is_invisible_and_cleaned_up(h: Harness) {
    let config = StoreConfig::default().with_upload_idle_timeout(Duration::from_secs(600));
    let file_ref = {
        let store = h.open(config.clone()).await;
        let mut pending = store.begin(NewFile::new(channel("c"), "p")).await.unwrap();
        pending.write(&pattern(300 * KIB)).await.unwrap();
        let file_ref = pending.file_ref().clone();
        assert!(store.get(&file_ref).await.unwrap().is_none());
        // The process dies mid-upload: nothing runs the pending file's cleanup.
        std::mem::forget(pending);
        file_ref
    };
    h.advance(601_000);
    let store = h.open(config).await;
    store.cleanup(store.now()).await.unwrap();
    assert!(store.get(&file_ref).await.unwrap().is_none());
    assert_eq!(store.usage().await.unwrap(), StoreUsage::default());

    let chunks = futures_util::stream::iter(vec![
        Ok(Bytes::from_static(b"ab")),
        Err(std::io::Error::other("connection reset")),
    ]);
    let failed = store.register_stream(NewFile::new(channel("c"), "a"), chunks).await;
    assert!(matches!(failed, Err(TransferError::Io(_))));
    usage_becomes(&store, StoreUsage::default()).await;
}

async fn a_reopened_store_sees_the_files(h: Harness) {
    let kept = {
        let store = h.open(StoreConfig::default()).await;
        store
            .register_bytes(
                NewFile::new(channel("c"), "k.png").with_recipient_ref("r1").with_reply_token("t1"),
                b"png",
            )
            .await
            .unwrap()
            .record
    };
    h.advance(HOUR);
    let store = h.open(StoreConfig::default()).await;
    let again = store.get(&kept.file_ref).await.unwrap().unwrap();
    assert_eq!(again, kept);
    assert_eq!(again.recipient_ref.as_deref(), Some("r1"));
    assert_eq!(again.reply_token.as_deref(), Some("t1"));
    assert_eq!(read_all(&store, &kept.file_ref).await, b"png");
    let usage = store.usage().await.unwrap();
    assert_eq!((usage.files, usage.bytes), (1, 3));
}

async fn files_are_bound_to_their_channel_and_removed_with_it(h: Harness) {
    let store = h.open(StoreConfig::default()).await;
    let a1 = store.register_bytes(NewFile::new(channel("a"), "1"), b"1").await.unwrap();
    store.register_bytes(NewFile::new(channel("a"), "2"), b"2").await.unwrap();
    let b1 = store.register_bytes(NewFile::new(channel("b"), "3"), b"3").await.unwrap();
    let sig = a1.download.url.rsplit("sig=").next().unwrap();
    let signer = store.signer();
    let exp = a1.download.expires_at;
    assert!(signer.verify(&a1.record.file_ref, &channel("a"), exp, sig, START).is_ok());
    assert!(signer.verify(&a1.record.file_ref, &channel("b"), exp, sig, START).is_err());

    let mut doomed = store.begin(NewFile::new(channel("a"), "4")).await.unwrap();
    let mut other = store.begin(NewFile::new(channel("b"), "5")).await.unwrap();
    doomed.write(b"x").await.unwrap();
    other.write(b"y").await.unwrap();
    assert_eq!(store.remove_channel(&channel("a")).await.unwrap(), 2);
    // An upload that begins after the removal is a new registration and is accepted.
    let later = store.register_bytes(NewFile::new(channel("a"), "6"), b"z").await.unwrap();
    assert!(matches!(doomed.finish().await, Err(TransferError::UnknownChannel)));
    other.finish().await.unwrap();
    assert!(store.get(&a1.record.file_ref).await.unwrap().is_none());
    assert!(store.get(&b1.record.file_ref).await.unwrap().is_some());
    assert!(store.get(&later.record.file_ref).await.unwrap().is_some());
    let usage = store.usage().await.unwrap();
    assert_eq!((usage.files, usage.bytes, usage.pending_files), (3, 3, 0));
}

async fn files_copied_from_a_directory_keep_their_refs_and_times(h: Harness) {
    let source_dir = TempDir::new("copy-source");
    let signer = UrlSigner::new(Secret::new("contract-test-url-secret")).unwrap();
    let source = FileStore::open(&source_dir.0, StoreConfig::default(), signer, h.clock.clone())
        .await
        .unwrap();
    let big = pattern(600 * KIB);
    let kept = source
        .register_bytes(NewFile::new(channel("c"), "k.bin").with_reply_token("t1"), &big)
        .await
        .unwrap()
        .record;
    h.advance(HOUR);
    let small = source.register_bytes(NewFile::new(channel("d"), "s.txt"), b"s").await.unwrap();
    let target = h.open(StoreConfig::default()).await;
    assert_eq!(source.copy_into(&target).await.unwrap(), 2);
    assert_eq!(target.get(&kept.file_ref).await.unwrap().as_ref(), Some(&kept));
    assert_eq!(target.get(&small.record.file_ref).await.unwrap(), Some(small.record.clone()));
    assert_eq!(read_all(&target, &kept.file_ref).await, big);
    assert_eq!(source.copy_into(&target).await.unwrap(), 0, "files already there are skipped");
    assert_eq!(target.list().await.unwrap().len(), 2);
    h.advance(23 * HOUR);
    assert_eq!(target.list().await.unwrap(), vec![small.record], "the copy expires on time");
}

/// Runs every case of the contract on the backend `$make` builds.
macro_rules! contract {
    ($make:expr) => {
        contract!($make;
            register_read_and_delete,
            streams_and_readers_of_many_chunks_round_trip_with_ranges,
            limit_per_file_is_refused_while_streaming,
            limit_total_bytes_is_refused_while_streaming_and_released,
            limit_file_count_is_refused_and_expired_files_make_room,
            interleaved_uploads_share_the_byte_capacity,
            concurrent_uploads_on_two_replicas_cannot_exceed_the_total,
            two_replicas_see_each_others_files,
            ttl_expiry_hides_the_file_and_cleanup_deletes_it,
            an_interrupted_upload_is_invisible_and_cleaned_up,
            a_reopened_store_sees_the_files,
            files_are_bound_to_their_channel_and_removed_with_it,
            files_copied_from_a_directory_keep_their_refs_and_times,
        );
    };
    ($make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                super::$case($make).await;
            }
        )+
    };
}

mod directory {
    use super::Harness;
    contract!(Harness::dir());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::Harness;
    contract!(Harness::postgres().await);
}
