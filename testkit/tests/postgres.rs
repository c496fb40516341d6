//! testkit's PostgreSQL: one server per process for every thread and runtime, a fresh
//! database per call, and a dedicated server a test may stop and start.

use xagent_storage_postgres::{PgError, PoolOptions, connect};
use xagent_testkit::postgres::TestPostgres;

#[test]
fn runtimes_on_several_threads_share_one_server_and_get_their_own_databases() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(async {
                    let server = TestPostgres::shared().await;
                    let url = server.fresh_database().await;
                    let pool = connect(&url, PoolOptions::default()).await.expect("connect");
                    let client = pool.get().await.expect("a connection");
                    let row = client.query_one("SELECT current_database()", &[]).await.unwrap();
                    assert_eq!(row.get::<_, String>(0), url.database());
                    (server.admin_url().redacted().to_owned(), url.database().to_owned())
                })
            })
        })
        .collect();
    let results: Vec<(String, String)> =
        threads.into_iter().map(|t| t.join().expect("thread")).collect();
    assert!(results.iter().all(|(admin, _)| *admin == results[0].0), "one server: {results:?}");
    let mut names: Vec<&String> = results.iter().map(|(_, db)| db).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 4, "four databases: {results:?}");
}

#[tokio::test]
async fn a_dedicated_server_stops_and_starts_again() {
    let server = TestPostgres::dedicated().await.expect("a dedicated server");
    let url = server.fresh_database().await;
    let options = PoolOptions::default().with_connect_timeout(std::time::Duration::from_secs(2));
    connect(&url, options.clone()).await.expect("up");
    server.stop().await.expect("stop");
    let err = connect(&url, options.clone()).await.unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err}");
    server.start().await.expect("start again");
    connect(&url, options).await.expect("up again, same data");
    let shared = TestPostgres::shared().await;
    if shared.is_local() {
        assert!(shared.stop().await.is_err(), "the shared server is not for stopping");
    }
}
