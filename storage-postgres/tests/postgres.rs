//! The plumbing against a real PostgreSQL (testkit's, or `XAGENT_TEST_DATABASE_URL`'s):
//! pool and timeouts, migrations, group commit, and that the password never leaks.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::Notify;
use xagent_storage_postgres::deadpool_postgres::Transaction;
use xagent_storage_postgres::{
    ApplyWrites, DatabaseUrl, GroupCommit, GroupCommitConfig, ListenEvent, Listener, Migration,
    PgError, PgResultExt, Pool, PoolOptions, connect, migrate,
};
use xagent_testkit::postgres::TestPostgres;

async fn fresh_pool() -> Pool {
    let url = TestPostgres::shared().await.fresh_database().await;
    connect(&url, PoolOptions::default()).await.expect("connect to the fresh database")
}

async fn count(pool: &Pool, sql: &str) -> i64 {
    let client = pool.get().await.unwrap();
    client.query_one(sql, &[]).await.unwrap().get(0)
}

async fn table_exists(pool: &Pool, name: &str) -> bool {
    let client = pool.get().await.unwrap();
    client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.unwrap().get(0)
}

const NOTES: &[Migration] = &[
    // Not IF NOT EXISTS: applying a step twice fails loudly.
    Migration::new(1, "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL)"),
    Migration::new(2, "ALTER TABLE notes ADD COLUMN added_at BIGINT NOT NULL DEFAULT 0"),
];

#[tokio::test]
async fn migrations_apply_once_and_a_rerun_is_a_no_op() {
    let pool = fresh_pool().await;
    let first = migrate(&pool, "notes", &NOTES[..1]).await.unwrap();
    assert_eq!((first.from, first.to, first.applied()), (0, 1, true));
    let upgrade = migrate(&pool, "notes", NOTES).await.unwrap();
    assert_eq!((upgrade.from, upgrade.to), (1, 2));
    let again = migrate(&pool, "notes", NOTES).await.unwrap();
    assert_eq!((again.from, again.to, again.applied()), (2, 2, false));
    assert_eq!(
        count(&pool, "SELECT version::BIGINT FROM xagent_schema WHERE component = 'notes'").await,
        2
    );
    // Components keep their own versions side by side.
    let other = migrate(&pool, "other", &[Migration::new(1, "CREATE TABLE other_t (x INT)")])
        .await
        .unwrap();
    assert_eq!((other.from, other.to), (0, 1));
    assert_eq!(count(&pool, "SELECT count(*) FROM xagent_schema").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_migrate_calls_do_not_race() {
    let pool = fresh_pool().await;
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { migrate(&pool, "notes", NOTES).await })
        })
        .collect();
    let mut applied = 0;
    for run in runs {
        let outcome = run.await.unwrap().expect("every concurrent migrate succeeds");
        assert_eq!(outcome.to, 2);
        applied += usize::from(outcome.applied());
    }
    assert_eq!(applied, 1, "exactly one caller applied the steps");
    assert!(table_exists(&pool, "notes").await);
}

#[tokio::test]
async fn a_newer_stored_version_is_refused_with_schema_too_new() {
    let pool = fresh_pool().await;
    migrate(&pool, "notes", NOTES).await.unwrap();
    // A newer binary ran against this database.
    pool.get()
        .await
        .unwrap()
        .execute("UPDATE xagent_schema SET version = 7 WHERE component = 'notes'", &[])
        .await
        .unwrap();
    let err = migrate(&pool, "notes", NOTES).await.unwrap_err();
    assert_eq!(
        err,
        PgError::SchemaTooNew { component: "notes".into(), found: 7, known: 2 },
        "{err}"
    );
    let message = err.to_string();
    assert!(message.contains("upgrade the binary"), "{message}");
    assert!(!err.is_transient());
}

#[tokio::test]
async fn a_failing_step_leaves_nothing_of_the_migration() {
    let pool = fresh_pool().await;
    // Another component's schema, so xagent_schema exists before the failing run.
    migrate(&pool, "other", &[Migration::new(1, "CREATE TABLE other_t (x INT)")]).await.unwrap();
    let broken = [NOTES[0], Migration::new(2, "ALTER TABLE no_such_table ADD COLUMN x INT")];
    let err = migrate(&pool, "notes", &broken).await.unwrap_err();
    assert_eq!(err.sqlstate(), Some("42P01"), "{err}");
    assert!(err.to_string().contains("migration 2 of notes"), "{err}");
    assert!(!table_exists(&pool, "notes").await, "step 1 was rolled back with step 2");
    let version = pool
        .get()
        .await
        .unwrap()
        .query_opt("SELECT version FROM xagent_schema WHERE component = 'notes'", &[])
        .await
        .unwrap();
    assert!(version.is_none());
}

#[tokio::test]
async fn a_statement_over_the_timeout_is_cancelled() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let options = PoolOptions::default().with_statement_timeout(Duration::from_millis(100));
    let pool = connect(&url, options).await.unwrap();
    let client = pool.get().await.unwrap();
    let err = client.simple_query("SELECT pg_sleep(5)").await.pg("sleep").unwrap_err();
    assert!(matches!(err, PgError::StatementTimeout { .. }), "{err}");
    assert!(err.is_transient());
}

#[tokio::test]
async fn a_busy_pool_reports_a_timeout() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let options =
        PoolOptions::default().with_max_size(1).with_wait_timeout(Duration::from_millis(50));
    let pool = connect(&url, options).await.unwrap();
    let held = pool.get().await.unwrap();
    let err = pool.get().await.unwrap_err();
    assert_eq!(err, PgError::PoolTimeout { waited: Duration::from_millis(50), max_size: 1 });
    drop(held);
    assert!(pool.get().await.is_ok());
}

#[tokio::test]
async fn bad_pool_options_are_refused() {
    let url = TestPostgres::shared().await.admin_url().clone();
    for options in [
        PoolOptions::default().with_max_size(0),
        PoolOptions::default().with_statement_timeout(Duration::ZERO),
        PoolOptions::default().with_application_name("bad\nname"),
    ] {
        let err = connect(&url, options).await.unwrap_err();
        assert!(matches!(err, PgError::InvalidOptions { .. }), "{err}");
    }
}

/// A distinctive password, searched for in everything printed.
const PASSWORD: &str = "Pw-7f3a9-do-not-print";

#[tokio::test]
async fn the_password_never_appears_in_errors_or_debug_output() {
    let server = TestPostgres::shared().await;
    let fresh = server.fresh_database().await;
    let config = fresh.config();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or("postgres").to_owned();
    let real_password = config.get_password().map(|p| String::from_utf8_lossy(p).into_owned());
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let with_password = |rest: &str| format!("postgres://{user}:{PASSWORD}@{rest}");
    let mut shown = Vec::new();

    // The URL itself (the real server and user, a made-up password).
    let host = fresh.target().rsplit_once(':').map(|(h, _)| h.to_owned()).unwrap_or_default();
    let url =
        DatabaseUrl::parse(&with_password(&format!("{host}:{port}/{}", fresh.database()))).unwrap();
    shown.push(("Debug of the URL", format!("{url:?}")));
    shown.push(("Display of the URL", url.to_string()));
    shown.push(("redacted URL", url.redacted().to_owned()));
    shown.push(("Debug of the real URL", format!("{fresh:?} {fresh}")));
    // Refused URLs.
    for text in [
        format!("mysql://u:{PASSWORD}@h/db"),
        with_password("h:port/db"),
        with_password("h/db?sslmode=prefer"),
        with_password("h/db?unknown_option=1"),
        format!("postgres://u@h/db?password={PASSWORD}&sslmode=bogus"),
    ] {
        let err = DatabaseUrl::parse(&text).unwrap_err();
        shown.push(("a refused URL's error", format!("{err} {err:?}")));
    }
    // Connection failures: no server on the port, a database that does not exist, and (on a
    // server that checks passwords) a wrong password.
    let unreachable = DatabaseUrl::parse(&with_password(&format!("{closed_port}/db"))).unwrap();
    let options = PoolOptions::default().with_connect_timeout(Duration::from_secs(2));
    let err = connect(&unreachable, options.clone()).await.unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err}");
    assert!(err.is_transient());
    shown.push(("an unreachable server's error", format!("{err} {err:?}")));
    let missing = fresh.with_database("no_such_database").unwrap();
    let err = connect(&missing, options.clone()).await.unwrap_err();
    assert!(err.to_string().contains("no_such_database"), "{err}");
    assert!(matches!(&err, PgError::Connect { code: Some(c), .. } if c == "3D000"), "{err:?}");
    assert!(!err.is_transient(), "a missing database stays missing");
    shown.push(("a missing database's error", format!("{err} {err:?}")));
    let wrong = connect(&url, options.clone()).await;
    if let Err(err) = &wrong {
        shown.push(("a wrong password's error", format!("{err} {err:?}")));
    }
    // A working pool, its Debug, and a statement error that quotes the password back (the
    // server echoes a bad value): the pool scrubs its own URL's password from it.
    let (working, secret) = match (wrong, &real_password) {
        (Ok(pool), _) => (pool, PASSWORD.to_owned()),
        (Err(_), Some(real)) => (connect(&fresh, options).await.unwrap(), real.clone()),
        (Err(e), None) => panic!("the server refused a user without password: {e}"),
    };
    shown.push(("Debug of the pool", format!("{working:?}")));
    let client = working.get().await.unwrap();
    let err = client
        .simple_query(&format!("SELECT '{}'::integer", secret.replace('\'', "''")))
        .await
        .map_err(|e| working.error("a statement", &e))
        .unwrap_err();
    assert_eq!(err.sqlstate(), Some("22P02"), "{err}");
    shown.push(("an SQL error through the pool", format!("{err} {err:?}")));

    let mut secrets = vec![PASSWORD.to_owned(), "Pw-7f3a9".to_owned()];
    secrets.extend(real_password);
    for (what, text) in &shown {
        for secret in &secrets {
            assert!(!text.contains(secret.as_str()), "{what} shows a password: {text}");
        }
    }
    assert!(shown.iter().any(|(_, t)| t.contains("***")), "the redacted form is shown");
}

// ---- group commit ----

#[derive(Debug)]
struct Note {
    id: i64,
    body: &'static str,
}

/// Inserts notes into `table`; a note with body "gate" announces itself and waits.
struct InsertNotes {
    table: &'static str,
    reached: Arc<Notify>,
    release: Arc<Notify>,
}

#[async_trait::async_trait]
impl ApplyWrites<Note> for InsertNotes {
    async fn apply(&self, tx: &Transaction<'_>, writes: &[Note]) -> Result<(), PgError> {
        let sql = format!("INSERT INTO {} (id, body) VALUES ($1, $2)", self.table);
        let insert = tx.prepare_cached(&sql).await.pg("prepare insert")?;
        for note in writes {
            tx.execute(&insert, &[&note.id, &note.body]).await.pg("insert a note")?;
            if note.body == "gate" {
                self.reached.notify_one();
                self.release.notified().await;
            }
        }
        Ok(())
    }
}

struct Gated {
    pool: Pool,
    writer: GroupCommit<Note>,
    reached: Arc<Notify>,
    release: Arc<Notify>,
}

async fn gated(table: &'static str, ddl: &'static str) -> Gated {
    let pool = fresh_pool().await;
    pool.get().await.unwrap().batch_execute(ddl).await.unwrap();
    let reached = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let apply = InsertNotes { table, reached: reached.clone(), release: release.clone() };
    let writer = GroupCommit::start(pool.clone(), apply, GroupCommitConfig::default());
    Gated { pool, writer, reached, release }
}

const NOTES_DDL: &str = "CREATE TABLE notes (id BIGINT PRIMARY KEY, body TEXT NOT NULL)";

#[tokio::test]
async fn a_ticket_resolves_only_after_its_transaction_committed() {
    let g = gated("notes", NOTES_DDL).await;
    let mut ticket = g.writer.submit(vec![Note { id: 1, body: "gate" }]);
    // The row is inserted, the transaction still open.
    g.reached.notified().await;
    assert!((&mut ticket).now_or_never().is_none(), "resolved before COMMIT");
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes").await, 0, "visible before COMMIT");
    g.release.notify_one();
    ticket.await.expect("committed");
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes").await, 1);
}

#[tokio::test]
async fn a_failing_submission_is_rolled_back_alone_and_the_others_commit() {
    let g = gated("notes", NOTES_DDL).await;
    let first = g.writer.submit(vec![Note { id: 1, body: "gate" }]);
    g.reached.notified().await;
    // Queued behind the open transaction: they form the next batch together.
    let good = g.writer.submit(vec![Note { id: 2, body: "a" }, Note { id: 3, body: "b" }]);
    let bad = g.writer.submit(vec![Note { id: 4, body: "c" }, Note { id: 2, body: "duplicate" }]);
    let later = g.writer.submit(vec![Note { id: 5, body: "d" }]);
    g.release.notify_one();
    first.await.unwrap();
    good.await.unwrap();
    let err = bad.await.unwrap_err();
    assert_eq!(err.sqlstate(), Some("23505"), "{err}");
    later.await.unwrap();
    // Nothing of the bad submission (not even its first, valid write).
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes WHERE id = 4").await, 0);
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes").await, 4);
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes WHERE id = 2 AND body = 'a'").await, 1);
}

#[tokio::test]
async fn when_the_commit_fails_every_ticket_of_the_batch_gets_the_error_and_nothing_is_kept() {
    // The uniqueness check runs at COMMIT: every statement succeeds, the transaction fails.
    let g = gated(
        "deferred_notes",
        "CREATE TABLE deferred_notes (id BIGINT, body TEXT NOT NULL,
           CONSTRAINT one_id UNIQUE (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .await;
    let first = g.writer.submit(vec![Note { id: 1, body: "gate" }]);
    g.reached.notified().await;
    g.release.notify_one();
    first.await.unwrap();
    let stats_before = g.writer.stats();
    // Hold the writer in a second gated batch while the clashing pair queues behind it.
    let gate = g.writer.submit(vec![Note { id: 10, body: "gate" }]);
    g.reached.notified().await;
    let a = g.writer.submit(vec![Note { id: 20, body: "a" }]);
    let b = g.writer.submit(vec![Note { id: 20, body: "b" }]);
    let c = g.writer.submit(vec![Note { id: 30, body: "c" }]);
    g.release.notify_one();
    gate.await.unwrap();
    for ticket in [a, b, c] {
        let err = ticket.await.unwrap_err();
        assert_eq!(err.sqlstate(), Some("23505"), "{err}");
    }
    assert_eq!(count(&g.pool, "SELECT count(*) FROM deferred_notes").await, 2, "ids 1 and 10");
    let stats = g.writer.stats();
    assert_eq!(stats.transactions - stats_before.transactions, 2, "one per batch: {stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_submissions_share_transactions() {
    let g = gated("notes", NOTES_DDL).await;
    let writer = Arc::new(g.writer);
    let tasks: Vec<_> = (0..200i64)
        .map(|id| {
            let writer = writer.clone();
            tokio::spawn(async move { writer.submit(vec![Note { id, body: "x" }]).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes").await, 200);
    let stats = writer.stats();
    assert_eq!((stats.submissions, stats.writes), (200, 200));
    assert!(stats.transactions < 200, "batched: {stats:?}");
}

#[tokio::test]
async fn after_shutdown_a_submission_fails_and_queued_ones_commit() {
    let g = gated("notes", NOTES_DDL).await;
    let queued = g.writer.submit(vec![Note { id: 1, body: "x" }]);
    g.writer.shutdown().await;
    queued.await.expect("what was queued before shutdown commits");
    let err = g.writer.submit(vec![Note { id: 2, body: "y" }]).await.unwrap_err();
    assert_eq!(err, PgError::WriterStopped);
    assert_eq!(count(&g.pool, "SELECT count(*) FROM notes").await, 1);
}

#[tokio::test]
async fn execute_in_order_sends_statements_in_order_and_reports_the_first_failure() {
    use xagent_storage_postgres::execute_in_order;
    use xagent_storage_postgres::tokio_postgres::types::ToSql;
    let pool = fresh_pool().await;
    let mut client = pool.get().await.unwrap();
    client.batch_execute(NOTES_DDL).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let insert = tx.prepare_cached("INSERT INTO notes (id, body) VALUES ($1, $2)").await.unwrap();
    let append =
        tx.prepare_cached("UPDATE notes SET body = body || $2 WHERE id = $1").await.unwrap();
    let (one, seven, a, b, c): (i64, i64, &str, &str, &str) = (1, 7, "a", "b", "c");
    let p1: [&(dyn ToSql + Sync); 2] = [&one, &a];
    let p2: [&(dyn ToSql + Sync); 2] = [&one, &b];
    let p3: [&(dyn ToSql + Sync); 2] = [&one, &c];
    let p4: [&(dyn ToSql + Sync); 2] = [&seven, &c];
    let steps = [(&insert, &p1[..]), (&append, &p2[..]), (&append, &p3[..]), (&append, &p4[..])];
    let counts = execute_in_order(&tx, "append", &steps).await.unwrap();
    assert_eq!(counts, vec![1, 1, 1, 0]);
    let row = tx.query_one("SELECT body FROM notes WHERE id = 1", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "abc");
    let (two, three): (i64, i64) = (2, 3);
    let q1: [&(dyn ToSql + Sync); 2] = [&two, &a];
    let q2: [&(dyn ToSql + Sync); 2] = [&two, &b];
    let q3: [&(dyn ToSql + Sync); 2] = [&three, &c];
    let clash = [(&insert, &q1[..]), (&insert, &q2[..]), (&insert, &q3[..])];
    let err = execute_in_order(&tx, "clash", &clash).await.unwrap_err();
    assert_eq!(err.sqlstate(), Some("23505"), "the first failure, not the aborted ones: {err}");
}

#[tokio::test]
async fn an_unpooled_connection_receives_notifications() {
    use futures_util::StreamExt;
    use xagent_storage_postgres::connect_unpooled;
    use xagent_storage_postgres::tokio_postgres::AsyncMessage;
    let pool = fresh_pool().await;
    let (listener, mut messages) =
        connect_unpooled(pool.url(), pool.options()).await.expect("unpooled");
    // The client's requests make progress only while the stream is polled.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = messages.next().await {
            if let Ok(AsyncMessage::Notification(n)) = message {
                let _ = tx.send((n.channel().to_owned(), n.payload().to_owned()));
            }
        }
    });
    listener.batch_execute("LISTEN outbox_wake").await.unwrap();
    let client = pool.get().await.unwrap();
    client.execute("SELECT pg_notify('outbox_wake', 'channel-7')", &[]).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("in time");
    assert_eq!(got, Some(("outbox_wake".to_owned(), "channel-7".to_owned())));
}

#[tokio::test]
async fn the_listener_hears_notifications_and_resyncs_after_its_connection_is_killed() {
    let url = TestPostgres::shared().await.fresh_database().await;
    let pool = connect(&url, PoolOptions::default()).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let listener =
        Listener::start(url.clone(), PoolOptions::default(), "notes_test", move |event| {
            let _ = tx.send(match event {
                ListenEvent::Notification(payload) => payload.to_owned(),
                _ => "resync".to_owned(),
            });
        })
        .unwrap();
    let next = async |rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>| {
        tokio::time::timeout(Duration::from_secs(20), rx.recv()).await.unwrap().unwrap()
    };
    assert_eq!(next(&mut rx).await, "resync", "subscribing is announced");
    let client = pool.get().await.unwrap();
    client.execute("SELECT pg_notify('notes_test', 'hello')", &[]).await.unwrap();
    assert_eq!(next(&mut rx).await, "hello");
    // The listening connection dies: the listener reconnects and announces the gap.
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND query = 'LISTEN notes_test'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(next(&mut rx).await, "resync", "a reconnection is announced");
    client.execute("SELECT pg_notify('notes_test', 'again')", &[]).await.unwrap();
    assert_eq!(next(&mut rx).await, "again");
    drop(listener);
    let refused = Listener::start(url, PoolOptions::default(), "Bad-Name", |_| {});
    assert!(matches!(refused, Err(PgError::InvalidOptions { .. })));
}
