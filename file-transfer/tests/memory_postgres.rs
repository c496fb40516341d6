//! On PostgreSQL too, uploads and downloads are streamed: a write holds at most one 256 KiB
//! chunk row and a read fetches one row at a time, so resident memory does not grow with the
//! file size. Its own test binary, like `memory.rs`.

#![cfg(feature = "postgres")]

mod common;

use common::memory::{MIB, round_trip};
use common::{START, TempDir, serve, signer};
use xagent_file_transfer::{FileStore, StoreConfig};
use xagent_protocol_types::ManualClock;
use xagent_storage_postgres::{PoolOptions, connect};
use xagent_testkit::postgres::TestPostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_and_download_on_postgres_are_streamed_not_buffered() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let pool = connect(&url, PoolOptions::default().with_max_size(4)).await.unwrap();
    let clock = ManualClock::new(START);
    let store = FileStore::open_postgres(
        pool,
        StoreConfig::default(),
        signer(),
        std::sync::Arc::new(clock.clone()),
    )
    .await
    .unwrap();
    let server = serve(store, clock, TempDir::new("unused"), 48 * MIB, Some(common::API_KEY)).await;
    round_trip(server, 48 * MIB, 24).await;
}
