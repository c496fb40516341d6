//! The group-commit writer keeps one connection for its batches (no pool round trip per
//! batch), and replaces it when it breaks: a batch on the killed connection fails, nothing of
//! it is acknowledged or stored, and the next batches commit on a new connection.

use std::sync::{Arc, Mutex};

use xagent_storage_postgres::deadpool_postgres::Transaction;
use xagent_storage_postgres::{
    ApplyWrites, GroupCommit, GroupCommitConfig, PgError, PgResultExt, PoolOptions, connect,
};
use xagent_testkit::postgres::TestPostgres;

/// Inserts ids and notes the server process (the connection) each batch ran on.
struct InsertNoting(Arc<Mutex<Vec<i32>>>);

#[async_trait::async_trait]
impl ApplyWrites<i64> for InsertNoting {
    async fn apply(&self, tx: &Transaction<'_>, writes: &[i64]) -> Result<(), PgError> {
        let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).await.pg("pid")?.get(0);
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(pid);
        let insert = tx.prepare_cached("INSERT INTO notes (id) VALUES ($1)").await.pg("prepare")?;
        for id in writes {
            tx.execute(&insert, &[id]).await.pg("insert")?;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_keeps_one_connection_and_replaces_it_when_it_breaks() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let pool = connect(&url, PoolOptions::default()).await.unwrap();
    let admin = pool.get().await.unwrap();
    admin.batch_execute("CREATE TABLE notes (id BIGINT PRIMARY KEY)").await.unwrap();
    let pids = Arc::new(Mutex::new(Vec::new()));
    let writer =
        GroupCommit::start(pool.clone(), InsertNoting(pids.clone()), GroupCommitConfig::default());
    for id in 1..=5 {
        writer.submit(vec![id]).await.expect("committed");
    }
    let first: Vec<i32> = pids.lock().unwrap().clone();
    assert_eq!(first.len(), 5, "one batch per write, one after the other");
    assert!(first.iter().all(|pid| *pid == first[0]), "one connection for every batch: {first:?}");

    // Kill the writer's connection from outside: the writer finds out and takes a new one.
    admin.execute("SELECT pg_terminate_backend($1)", &[&first[0]]).await.unwrap();
    let mut outcomes = Vec::new();
    for id in 6..=8 {
        outcomes.push(writer.submit(vec![id]).await);
    }
    assert!(outcomes.iter().skip(1).all(Result::is_ok), "later batches commit: {outcomes:?}");
    let after: Vec<i32> = pids.lock().unwrap()[5..].to_vec();
    let last = *after.last().expect("a batch ran after the kill");
    assert_ne!(last, first[0], "a new connection after the old one died");
    let rows = admin.query("SELECT id FROM notes ORDER BY id", &[]).await.unwrap();
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    let expected: Vec<i64> = (1..=8)
        .filter(|id| *id <= 5 || outcomes[usize::try_from(id - 6).unwrap()].is_ok())
        .collect();
    assert_eq!(ids, expected, "exactly the acknowledged writes are stored");
    writer.shutdown().await;
}
