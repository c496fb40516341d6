//! TLS to PostgreSQL: verified against a private CA, refused when the certificate does not
//! verify (never a silent fall back to plain text), plain when the URL does not ask for it.

use std::time::Duration;

use xagent_storage_postgres::{DatabaseUrl, PgError, Pool, PoolOptions, connect, connect_unpooled};
use xagent_testkit::postgres::TestPostgres;

async fn encrypted(pool: &Pool) -> bool {
    let client = pool.get().await.expect("a connection");
    let row = client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .expect("pg_stat_ssl");
    row.get(0)
}

#[tokio::test]
async fn tls_is_verified_against_the_given_ca_and_refused_when_it_does_not_verify() {
    let server = TestPostgres::dedicated_with_tls().await.expect("a TLS server");
    let ca = server.tls_root_cert().expect("the CA");
    let port = server.admin_url().config().get_ports()[0];
    let base = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let options = PoolOptions::default().with_connect_timeout(Duration::from_secs(5));

    // Verified against the private CA: encrypted, for the pool and for an unpooled client.
    let url =
        DatabaseUrl::parse(&format!("{base}?sslmode=verify-full&sslrootcert={}", ca.display()))
            .unwrap();
    let pool = connect(&url, options.clone()).await.expect("TLS with the private CA");
    assert!(encrypted(&pool).await);
    let (client, connection) = connect_unpooled(&url, &options).await.expect("unpooled TLS");
    tokio::spawn(connection.run());
    let row = client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));

    // The same name by `localhost` verifies too (the certificate names both).
    let by_name = DatabaseUrl::parse(&format!(
        "postgres://postgres@localhost:{port}/postgres?sslmode=require&sslrootcert={}",
        ca.display()
    ))
    .unwrap();
    assert!(encrypted(&connect(&by_name, options.clone()).await.expect("by name")).await);

    // The system's roots do not know the private CA: refused, not downgraded.
    let system = DatabaseUrl::parse(&format!("{base}?sslmode=require")).unwrap();
    let err = connect(&system, options.clone()).await.unwrap_err();
    assert!(matches!(err, PgError::Connect { .. }), "{err}");
    assert!(err.to_string().to_lowercase().contains("certificate"), "{err}");

    // A root file that is not the signer (the server's own certificate is no CA): refused.
    let wrong_root = ca.with_file_name("server.pem");
    let wrong = DatabaseUrl::parse(&format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        wrong_root.display()
    ))
    .unwrap();
    assert!(connect(&wrong, options.clone()).await.is_err());

    // A missing root file is a clear error before any connection.
    let missing =
        DatabaseUrl::parse(&format!("{base}?sslmode=verify-full&sslrootcert=/no/such/ca.pem"))
            .unwrap();
    let err = connect(&missing, options.clone()).await.unwrap_err();
    assert!(err.to_string().contains("/no/such/ca.pem"), "{err}");

    // Without sslmode: plain TCP.
    let plain = DatabaseUrl::parse(&base).unwrap();
    assert!(!encrypted(&connect(&plain, options).await.expect("plain")).await);
}
