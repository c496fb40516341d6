//! Versioned schema migrations, in the same style as `xagent-storage-postgres`: every
//! component (`server-runtime`, `client-runtime`, `im`, `mcp-inbox`, ...) keeps its version in
//! one row of `xagent_schema` and brings its tables up to date in one `BEGIN IMMEDIATE`
//! transaction, so two processes opening the file at once do not race and a half-applied
//! migration is never left behind.

use rusqlite::{Connection, OptionalExtension as _, TransactionBehavior, params};

use crate::error::{SqliteError, SqliteResultExt as _};

/// One step of a component's schema: the SQL that takes it from `version - 1` to `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// 1 for the first step, then 2, 3, ... without gaps.
    pub version: i64,
    /// One or more statements (run as a batch, inside the migration's transaction).
    pub sql: &'static str,
}

impl Migration {
    /// A step of the schema.
    pub const fn new(version: i64, sql: &'static str) -> Self {
        Self { version, sql }
    }
}

const SCHEMA_TABLE: &str = "CREATE TABLE IF NOT EXISTS xagent_schema (
  component TEXT PRIMARY KEY, version INTEGER NOT NULL)";

/// Brings `component`'s tables to the newest of `migrations` (applying the missing steps in
/// order, in one transaction) and returns the version found before. A database whose stored
/// version is newer than the newest step is refused with [`SqliteError::SchemaTooNew`].
pub fn migrate(
    conn: &mut Connection,
    component: &str,
    migrations: &[Migration],
) -> Result<i64, SqliteError> {
    let known = check_list(component, migrations)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .sqlite("begin the migration")?;
    tx.execute_batch(SCHEMA_TABLE).sqlite("create xagent_schema")?;
    let found: i64 = tx
        .query_row(
            "SELECT version FROM xagent_schema WHERE component = ?1",
            params![component],
            |row| row.get(0),
        )
        .optional()
        .sqlite("read the schema version")?
        .unwrap_or(0);
    if found > known {
        return Err(SqliteError::SchemaTooNew { component: component.to_owned(), found, known });
    }
    if found < known {
        for step in migrations.iter().filter(|m| m.version > found) {
            tx.execute_batch(step.sql).sqlite("apply a migration")?;
        }
        tx.execute(
            "INSERT INTO xagent_schema (component, version) VALUES (?1, ?2)
             ON CONFLICT (component) DO UPDATE SET version = excluded.version",
            params![component, known],
        )
        .sqlite("record the schema version")?;
    }
    tx.commit().sqlite("commit the migration")?;
    Ok(found)
}

/// Checks the list is 1, 2, 3, ... and returns its newest version (0 when empty).
fn check_list(component: &str, migrations: &[Migration]) -> Result<i64, SqliteError> {
    let invalid =
        |reason: String| SqliteError::InvalidMigrations { component: component.to_owned(), reason };
    if component.is_empty() || component.len() > 64 {
        return Err(invalid("the component name must be 1 to 64 bytes".into()));
    }
    for (expected, step) in (1i64..).zip(migrations) {
        if step.version != expected {
            return Err(invalid(format!(
                "step {} stands where version {expected} belongs: versions run 1, 2, 3, ...",
                step.version
            )));
        }
    }
    Ok(i64::try_from(migrations.len()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEPS: &[Migration] = &[
        Migration::new(1, "CREATE TABLE notes (id INTEGER PRIMARY KEY)"),
        Migration::new(2, "ALTER TABLE notes ADD COLUMN body TEXT"),
    ];

    #[test]
    fn steps_apply_once_in_order_and_a_newer_database_is_refused() -> Result<(), SqliteError> {
        let mut conn = Connection::open_in_memory().sqlite("open")?;
        assert_eq!(migrate(&mut conn, "notes", &STEPS[..1])?, 0);
        assert_eq!(migrate(&mut conn, "notes", STEPS)?, 1, "only step 2 was missing");
        assert_eq!(migrate(&mut conn, "notes", STEPS)?, 2, "nothing left to apply");
        conn.execute("INSERT INTO notes (id, body) VALUES (1, 'x')", []).sqlite("insert")?;
        let refused = migrate(&mut conn, "notes", &STEPS[..1]);
        assert!(matches!(refused, Err(SqliteError::SchemaTooNew { found: 2, known: 1, .. })));
        Ok(())
    }

    #[test]
    fn a_failed_step_leaves_nothing_behind() -> Result<(), SqliteError> {
        let mut conn = Connection::open_in_memory().sqlite("open")?;
        let broken = [STEPS[0], Migration::new(2, "NOT SQL")];
        assert!(migrate(&mut conn, "notes", &broken).is_err());
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master WHERE name = 'notes'", [], |r| r.get(0))
            .sqlite("count")?;
        assert_eq!(tables, 0, "step 1 was rolled back with step 2");
        Ok(())
    }

    #[test]
    fn versions_must_run_from_one_without_gaps() {
        assert_eq!(check_list("c", STEPS).ok(), Some(2));
        assert_eq!(check_list("c", &[]).ok(), Some(0));
        for bad in [&[Migration::new(2, "")][..], &[STEPS[0], Migration::new(3, "")]] {
            assert!(matches!(check_list("c", bad), Err(SqliteError::InvalidMigrations { .. })));
        }
        assert!(check_list("", STEPS).is_err());
    }
}
