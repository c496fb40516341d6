//! Opening a database private to its owner: the directory 0700 and the files 0600 before
//! SQLite touches them, then WAL, the chosen `synchronous`, a busy timeout and a statement
//! cache on every connection.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;

use crate::error::{SqliteError, SqliteResultExt as _};

/// How hard SQLite makes each commit durable (`PRAGMA synchronous`, in WAL mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Sync the WAL on every commit: a committed write survives an OS crash or power loss.
    /// The default.
    #[default]
    Full,
    /// Sync only at checkpoints: survives a killed process, but an OS crash or power loss
    /// may lose the last commits. Faster; choose it knowingly.
    Normal,
}

impl Synchronous {
    /// The pragma value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }

    /// Reads `full` / `normal` (any case), e.g. from a configuration file or flag.
    pub fn parse(text: &str) -> Option<Self> {
        match text.to_ascii_lowercase().as_str() {
            "full" => Some(Self::Full),
            "normal" => Some(Self::Normal),
            _ => None,
        }
    }
}

/// How long a statement waits for another connection's (or process's) write to finish.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Prepared statements kept per connection (rusqlite's default is 16): room for every write
/// statement plus the transaction's own, so the hot ones are never parsed again.
const STATEMENT_CACHE: usize = 64;

/// Creates `dir` (and its parents) and makes it 0700, also when an earlier version left it
/// readable by others.
pub fn private_dir(dir: &Path) -> Result<(), SqliteError> {
    let failed = |source| SqliteError::Files { path: dir.to_path_buf(), source };
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        builder.mode(0o700);
        builder.create(dir).map_err(failed)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(failed)
    }
    #[cfg(not(unix))]
    {
        builder.create(dir).map_err(failed)
    }
}

/// Makes `dir` 0700 and creates `dir/file_name` 0600 before SQLite opens it, tightening the
/// database and its `-wal`/`-shm` files when an earlier version left them readable by others.
/// Returns the database's path.
pub fn private_database(dir: &Path, file_name: &str) -> Result<PathBuf, SqliteError> {
    private_dir(dir)?;
    let database = dir.join(file_name);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let failed = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SqliteError::Files { path, source }
        };
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&database)
            .map_err(failed(&database))?;
        for suffix in ["", "-wal", "-shm"] {
            let mut name = database.as_os_str().to_owned();
            name.push(suffix);
            let path = PathBuf::from(name);
            if path.exists() {
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                    .map_err(failed(&path))?;
            }
        }
    }
    Ok(database)
}

/// Opens (creating if needed) the SQLite file at `path` in WAL mode with the given
/// durability, [`BUSY_TIMEOUT`] and a statement cache: the settings every connection shares.
/// Make the file private first with [`private_database`].
pub fn open(path: &Path, synchronous: Synchronous) -> Result<Connection, SqliteError> {
    let conn = Connection::open(path).sqlite("open the database")?;
    conn.pragma_update(None, "journal_mode", "WAL").sqlite("enable WAL")?;
    conn.pragma_update(None, "synchronous", synchronous.as_str()).sqlite("set synchronous")?;
    settle(conn)
}

/// An in-memory database with the same busy timeout and statement cache (tests, ephemeral
/// stores).
pub fn open_in_memory() -> Result<Connection, SqliteError> {
    settle(Connection::open_in_memory().sqlite("open an in-memory database")?)
}

fn settle(conn: Connection) -> Result<Connection, SqliteError> {
    conn.busy_timeout(BUSY_TIMEOUT).sqlite("set the busy timeout")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_database_is_private_in_wal_mode_with_full_sync() -> Result<(), Box<dyn std::error::Error>>
    {
        let root = tempfile::tempdir()?;
        let dir = root.path().join("state");
        let path = private_database(&dir, "db.sqlite3")?;
        let conn = open(&path, Synchronous::default())?;
        let mode: String = conn.query_row("PRAGMA journal_mode", [], |row| row.get(0))?;
        assert_eq!(mode, "wal");
        let sync: i64 = conn.query_row("PRAGMA synchronous", [], |row| row.get(0))?;
        assert_eq!(sync, 2, "FULL");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode_of = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
            assert_eq!(mode_of(&dir)?, 0o700);
            assert_eq!(mode_of(&path)?, 0o600);
            // An earlier version's loose modes are tightened on the next open.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
            private_database(&dir, "db.sqlite3")?;
            assert_eq!((mode_of(&dir)?, mode_of(&path)?), (0o700, 0o600));
        }
        Ok(())
    }

    #[test]
    fn synchronous_reads_either_case_and_nothing_else() {
        assert_eq!(Synchronous::parse("NORMAL"), Some(Synchronous::Normal));
        assert_eq!(Synchronous::parse("full"), Some(Synchronous::Full));
        assert_eq!(Synchronous::parse("off"), None);
    }
}
