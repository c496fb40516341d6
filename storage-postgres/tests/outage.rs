//! The database goes away and comes back: callers get a transient error in bounded time (no
//! hang, nothing acknowledged), and the pool and the group commit work again afterwards.

use std::time::Duration;

use xagent_storage_postgres::deadpool_postgres::Transaction;
use xagent_storage_postgres::{
    ApplyWrites, GroupCommit, GroupCommitConfig, PgError, PgResultExt, PoolOptions, connect,
};
use xagent_testkit::postgres::TestPostgres;

struct Insert;

#[async_trait::async_trait]
impl ApplyWrites<i64> for Insert {
    async fn apply(&self, tx: &Transaction<'_>, writes: &[i64]) -> Result<(), PgError> {
        let insert = tx.prepare_cached("INSERT INTO notes (id) VALUES ($1)").await.pg("prepare")?;
        for id in writes {
            tx.execute(&insert, &[id]).await.pg("insert")?;
        }
        Ok(())
    }
}

#[tokio::test]
async fn an_outage_fails_writes_in_bounded_time_and_they_work_again_after_it() {
    let server = TestPostgres::dedicated().await.expect("a dedicated server");
    let url = server.fresh_database().await;
    let options = PoolOptions::default()
        .with_connect_timeout(Duration::from_secs(2))
        .with_wait_timeout(Duration::from_secs(2));
    let pool = connect(&url, options).await.unwrap();
    pool.get()
        .await
        .unwrap()
        .batch_execute("CREATE TABLE notes (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let writer = GroupCommit::start(pool.clone(), Insert, GroupCommitConfig::default());
    writer.submit(vec![1]).await.expect("before the outage");

    server.stop().await.expect("stop");
    let during = tokio::time::timeout(Duration::from_secs(20), writer.submit(vec![2]))
        .await
        .expect("an answer in bounded time, not a hang");
    let err = during.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    let err = pool.get().await.map(|_| ()).unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err}");

    server.start().await.expect("start again");
    // The first use after the restart may meet a connection the pool has not yet seen closed.
    let mut after = Err(PgError::WriterStopped);
    for _ in 0..20 {
        after = writer.submit(vec![3]).await;
        if after.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    after.expect("writes work again after the outage");
    let client = pool.get().await.unwrap();
    let ids: Vec<i64> = client
        .query("SELECT id FROM notes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![1, 3], "nothing of the failed write was kept");
}
