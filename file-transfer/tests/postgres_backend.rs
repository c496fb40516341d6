//! Rules of the PostgreSQL backend itself (the behaviour every backend shares is in
//! `backend_contract.rs`): bounded chunk rows, visibility only at commit, the schema
//! version check, and the idle timeout that tells a dead replica's upload from a live one.

#![cfg(feature = "postgres")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::START;
use xagent_file_transfer::{FileStore, NewFile, StoreConfig, StoreUsage, TransferError, UrlSigner};
use xagent_protocol_types::{ConnectorChannelId, ManualClock, Secret};
use xagent_storage_postgres::{DatabaseUrl, PgError, Pool, PoolOptions, connect};
use xagent_testkit::postgres::TestPostgres;

const KIB: usize = 1024;

async fn database() -> (DatabaseUrl, Pool) {
    let url = TestPostgres::shared().await.fresh_database().await;
    let pool = connect(&url, PoolOptions::default().with_max_size(4)).await.unwrap();
    (url, pool)
}

async fn store_on(
    url: &DatabaseUrl,
    clock: &ManualClock,
    config: StoreConfig,
) -> Result<FileStore, TransferError> {
    let pool = connect(url, PoolOptions::default().with_max_size(4)).await?;
    let signer = UrlSigner::new(Secret::new("postgres-test-url-secret")).unwrap();
    FileStore::open_postgres(pool, config, signer, Arc::new(clock.clone())).await
}

fn channel() -> ConnectorChannelId {
    ConnectorChannelId::new("cch_pg")
}

async fn scalar(pool: &Pool, sql: &str) -> i64 {
    let client = pool.get().await.unwrap();
    client.query_one(sql, &[]).await.unwrap().get(0)
}

#[tokio::test]
async fn bytes_live_in_bounded_chunk_rows_and_a_file_is_visible_only_once_committed() {
    let (url, pool) = database().await;
    let clock = ManualClock::new(START);
    let store = store_on(&url, &clock, StoreConfig::default()).await.unwrap();
    let mut pending = store.begin(NewFile::new(channel(), "big.bin")).await.unwrap();
    pending.write(&vec![7u8; 300 * KIB]).await.unwrap();
    // One full chunk row is written, the rest waits for the next write or the finish.
    assert_eq!(scalar(&pool, "SELECT count(*) FROM xagent_file_chunks").await, 1);
    assert_eq!(
        scalar(&pool, "SELECT count(*) FROM xagent_files WHERE NOT complete").await,
        1,
        "the upload is a row that is not complete"
    );
    let file_ref = pending.file_ref().clone();
    assert!(store.get(&file_ref).await.unwrap().is_none());
    pending.write(&vec![8u8; 400 * KIB]).await.unwrap();
    pending.finish().await.unwrap();
    assert!(store.get(&file_ref).await.unwrap().is_some());
    assert_eq!(scalar(&pool, "SELECT count(*) FROM xagent_file_chunks").await, 3);
    assert!(
        scalar(&pool, "SELECT max(length(data))::BIGINT FROM xagent_file_chunks").await
            <= 256 * KIB as i64
    );
    assert_eq!(
        scalar(&pool, "SELECT sum(length(data))::BIGINT FROM xagent_file_chunks").await,
        700 * KIB as i64
    );
    assert!(store.remove(&file_ref).await.unwrap());
    assert_eq!(scalar(&pool, "SELECT count(*) FROM xagent_file_chunks").await, 0, "bytes go too");
}

#[tokio::test]
async fn a_database_with_a_newer_file_schema_is_refused() {
    let (url, pool) = database().await;
    let clock = ManualClock::new(START);
    store_on(&url, &clock, StoreConfig::default()).await.unwrap();
    let client = pool.get().await.unwrap();
    client
        .execute("UPDATE xagent_schema SET version = 99 WHERE component = 'file-transfer'", &[])
        .await
        .unwrap();
    let refused = store_on(&url, &clock, StoreConfig::default()).await.unwrap_err();
    assert!(
        matches!(&refused, TransferError::Database(PgError::SchemaTooNew { found: 99, .. })),
        "{refused}"
    );
    assert!(refused.to_string().contains("upgrade"), "{refused}");
    assert!(!refused.to_wire().message().contains("99"), "the wire gets a generic message");
}

#[tokio::test]
async fn only_an_upload_idle_past_the_timeout_is_taken_for_a_dead_replicas() {
    let (url, _pool) = database().await;
    let clock = ManualClock::new(START);
    let config = StoreConfig::default().with_upload_idle_timeout(Duration::from_secs(600));
    let a = store_on(&url, &clock, config.clone()).await.unwrap();
    let mut live = a.begin(NewFile::new(channel(), "live")).await.unwrap();
    live.write(b"still writing").await.unwrap();
    clock.advance(599_000);
    // Another replica starting (and cleaning up) leaves a live upload alone.
    let b = store_on(&url, &clock, config).await.unwrap();
    b.cleanup(b.now()).await.unwrap();
    live.write(b", and done").await.unwrap();
    let finished = live.finish().await.unwrap();
    assert!(b.get(&finished.record.file_ref).await.unwrap().is_some());

    let mut stalled = a.begin(NewFile::new(channel(), "stalled")).await.unwrap();
    stalled.write(b"half").await.unwrap();
    clock.advance(600_000);
    b.cleanup(b.now()).await.unwrap();
    let usage = b.usage().await.unwrap();
    assert_eq!((usage.pending_files, usage.pending_bytes), (0, 0), "its capacity is released");
    // The stalled writer was not dead after all: it learns its upload is gone.
    assert!(matches!(stalled.write(b"more").await, Err(TransferError::Io(_))));
    assert!(stalled.finish().await.is_err());
    assert_eq!(
        b.usage().await.unwrap(),
        StoreUsage { files: 1, bytes: 23, ..StoreUsage::default() }
    );
}

#[tokio::test]
async fn replicas_agree_on_the_first_signing_secret_stored() {
    use xagent_file_transfer::backend::PostgresBackend;
    let (url, pool) = database().await;
    let first = PostgresBackend::open(pool, &StoreConfig::default(), START).await.unwrap();
    let other_pool = connect(&url, PoolOptions::default().with_max_size(2)).await.unwrap();
    let second = PostgresBackend::open(other_pool, &StoreConfig::default(), START).await.unwrap();
    let (a, b) = tokio::join!(first.signing_secret("secret-a"), second.signing_secret("secret-b"));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "both replicas sign with one secret");
    assert!(a == "secret-a" || a == "secret-b");
    assert_eq!(first.signing_secret("secret-c").await.unwrap(), a, "a stored secret stays");
}
