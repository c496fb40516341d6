//! `xagent-connector backup`: taken while `webchat` runs on the directory, it restores into a
//! directory another `webchat` starts on with the same signed-in room; the archive and its
//! entries are owner-only; an existing archive or a directory that is no state directory is
//! refused.

mod support;

use std::process::Command;

const API_KEY: &str = "sk-cli-backup-8e2a61";

fn backup(state: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_xagent-connector"))
        .arg("backup")
        .arg("--state-dir")
        .arg(state)
        .arg("--out")
        .arg(out)
        .output()
        .expect("backup runs")
}

fn channels_in(db: &std::path::Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).expect("open");
    let mut statement = conn.prepare("SELECT id FROM channels ORDER BY id").expect("query");
    let rows = statement.query_map([], |row| row.get::<_, String>(0)).expect("rows");
    rows.map(|r| r.expect("row")).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_online_backup_restores_into_a_directory_a_connector_starts_on() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let webchat = support::start_webchat(&state, None, API_KEY).await;
    let plane = support::connect(&webchat.addr, API_KEY).await;
    let channel = support::open_room(&plane).await;

    // While the Connector runs and holds the directory's lock.
    let archive = dir.path().join("backup.tar");
    let out = backup(&state, &archive);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("database(s)"), "{said}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&archive).expect("archive").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the archive holds credentials");
    }
    let listing = Command::new("tar").arg("-tvf").arg(&archive).output().expect("tar runs");
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("connector.sqlite3"), "{listing}");
    assert!(!listing.contains("-wal") && !listing.contains(" lock"), "{listing}");
    for line in listing.lines() {
        assert!(line.starts_with("-rw-------") || line.starts_with("drwx------"), "{line}");
    }

    // Again to the same file: refused, the archive stays.
    let again = backup(&state, &archive);
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("exists"));
    assert!(std::fs::metadata(&archive).expect("kept").len() > 0);
    plane.close().await;
    drop(webchat);

    // Restore and start on it: the signed-in room's channel is there.
    let restored = dir.path().join("restored");
    std::fs::create_dir(&restored).expect("mkdir");
    let unpacked = Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&restored)
        .status()
        .expect("tar runs");
    assert!(unpacked.success());
    assert_eq!(channels_in(&restored.join("connector.sqlite3")), vec![channel.to_string()]);
    let back = support::start_webchat(&restored, None, API_KEY).await;
    let plane = support::connect(&back.addr, API_KEY).await;
    plane.open_channel(Some(&channel)).await.expect("the restored channel reopens");
    plane.close().await;

    let not_state = backup(dir.path(), &dir.path().join("other.tar"));
    assert_eq!(not_state.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&not_state.stderr).contains("not a Connector's state directory")
    );
    assert!(!dir.path().join("other.tar").exists());
}

/// With `--database-url` the directory holds the lock and, for im.matrix, the bot's stores:
/// `backup` copies what is there and says to dump PostgreSQL; a directory with only the lock
/// is refused with that advice (DEPLOY.md's "Backups").
#[test]
fn a_postgresql_replicas_directory_backs_up_its_files_and_points_to_pg_dump() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    std::fs::create_dir(&state).expect("state dir");
    std::fs::write(state.join(xagent_server_runtime::ops::LOCK_FILE), b"").expect("lock");

    let only_lock = backup(&state, &dir.path().join("lock-only.tar"));
    assert_eq!(only_lock.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&only_lock.stderr);
    assert!(stderr.contains("holds only the lock") && stderr.contains("pg_dump"), "{stderr}");
    assert!(!dir.path().join("lock-only.tar").exists());

    // A store of the bot's, as matrix-sdk keeps it beside the lock.
    let store = state.join("matrix").join("matrix-sdk-crypto.sqlite3");
    std::fs::create_dir(store.parent().expect("parent")).expect("store dir");
    rusqlite::Connection::open(&store)
        .and_then(|c| c.execute_batch("CREATE TABLE keys (k TEXT); INSERT INTO keys VALUES ('a');"))
        .expect("a store");
    let archive = dir.path().join("replica.tar");
    let out = backup(&state, &archive);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("1 database(s)") && stdout.contains("pg_dump"), "{stdout}");
    let listing = Command::new("tar").arg("-tf").arg(&archive).output().expect("tar runs");
    let names = String::from_utf8_lossy(&listing.stdout);
    assert!(names.contains("matrix/matrix-sdk-crypto.sqlite3"), "{names}");
    assert!(!names.lines().any(|n| n.ends_with(xagent_server_runtime::ops::LOCK_FILE)), "{names}");
}
