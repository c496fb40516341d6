//! Versioned schema migrations: every component (`server-runtime`, `client-runtime`,
//! `file-transfer`, ...) keeps its version in one row of `xagent_schema`, and brings its
//! tables up to date in one transaction under an advisory lock, so replicas starting at once
//! do not race and a half-applied migration is never left behind.

use crate::error::{PgError, PgResultExt};
use crate::pool::Pool;

/// One step of a component's schema: the SQL that takes it from `version - 1` to `version`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Migration {
    /// 1 for the first step, then 2, 3, ... without gaps.
    pub version: i32,
    /// One or more statements (run as a batch, inside the migration's transaction).
    pub sql: &'static str,
}

impl Migration {
    /// A step of the schema.
    pub const fn new(version: i32, sql: &'static str) -> Self {
        Self { version, sql }
    }
}

/// What [`migrate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationOutcome {
    /// The version found in the database (0: the component had no tables yet).
    pub from: i32,
    /// The version the database holds now (the newest the caller knows).
    pub to: i32,
}

impl MigrationOutcome {
    /// Whether any step was applied.
    pub fn applied(&self) -> bool {
        self.from != self.to
    }
}

/// The advisory lock every migration transaction holds (one for all components: migrations
/// are rare, and the shared `xagent_schema` table is created under it). "xAgentS1" in ASCII.
pub const MIGRATION_LOCK: i64 = 0x7841_6765_6e74_5331;

const SCHEMA_TABLE: &str = "CREATE TABLE IF NOT EXISTS xagent_schema (
  component TEXT PRIMARY KEY,
  version INTEGER NOT NULL)";

/// Brings `component`'s schema to the newest of `migrations`: applies the steps the
/// database lacks, in order, in one transaction, or nothing when it is up to date. A
/// database whose stored version is newer than the newest step is refused with
/// [`PgError::SchemaTooNew`].
pub async fn migrate(
    pool: &Pool,
    component: &str,
    migrations: &[Migration],
) -> Result<MigrationOutcome, PgError> {
    let known = check_list(component, migrations)?;
    let mut client = pool.get().await?;
    let tx = client.transaction().await.map_err(|e| pool.error("begin the migration", &e))?;
    // A large migration may take longer than the pool's statement timeout, and a replica
    // waiting for the lock must not give up while another applies it.
    tx.batch_execute("SET LOCAL statement_timeout = 0").await.pg("lift the statement timeout")?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .pg("take the migration lock")?;
    tx.batch_execute(SCHEMA_TABLE).await.pg("create xagent_schema")?;
    let found: i32 = tx
        .query_opt("SELECT version FROM xagent_schema WHERE component = $1", &[&component])
        .await
        .pg("read the schema version")?
        .map(|row| row.try_get(0))
        .transpose()
        .pg("read the schema version")?
        .unwrap_or(0);
    if found > known {
        // Dropping the transaction rolls it back (and releases the lock).
        return Err(PgError::SchemaTooNew { component: component.to_owned(), found, known });
    }
    if found == known {
        tx.commit().await.map_err(|e| pool.error("finish the migration check", &e))?;
        return Ok(MigrationOutcome { from: found, to: known });
    }
    for step in migrations.iter().filter(|m| m.version > found) {
        tx.batch_execute(step.sql)
            .await
            .pg(&format!("migration {} of {component}", step.version))?;
    }
    tx.execute(
        "INSERT INTO xagent_schema (component, version) VALUES ($1, $2)
         ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
        &[&component, &known],
    )
    .await
    .pg("record the schema version")?;
    tx.commit().await.map_err(|e| {
        if e.is_closed() {
            PgError::CommitOutcomeUnknown { context: format!("the migrations of {component}") }
        } else {
            pool.error(format!("commit the migrations of {component}"), &e)
        }
    })?;
    tracing::info!(component, from = found, to = known, "database schema migrated");
    Ok(MigrationOutcome { from: found, to: known })
}

/// Checks the list is 1, 2, 3, ... and returns its newest version (0 when empty).
fn check_list(component: &str, migrations: &[Migration]) -> Result<i32, PgError> {
    let invalid =
        |reason: String| PgError::InvalidMigrations { component: component.to_owned(), reason };
    if component.is_empty() || component.len() > 64 {
        return Err(invalid("the component name must be 1 to 64 bytes".into()));
    }
    let mut expected = 1i32;
    for step in migrations {
        if step.version != expected {
            return Err(invalid(format!(
                "step {} stands where version {expected} belongs: versions run 1, 2, 3, ... \
                 in order",
                step.version
            )));
        }
        expected = expected.saturating_add(1);
    }
    Ok(expected - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_must_run_from_one_without_gaps() {
        let ok = [Migration::new(1, "SELECT 1"), Migration::new(2, "SELECT 2")];
        assert_eq!(check_list("c", &ok).unwrap(), 2);
        assert_eq!(check_list("c", &[]).unwrap(), 0);
        for bad in [
            vec![Migration::new(2, "")],
            vec![Migration::new(1, ""), Migration::new(3, "")],
            vec![Migration::new(1, ""), Migration::new(1, "")],
        ] {
            let err = check_list("c", &bad).unwrap_err();
            assert!(matches!(err, PgError::InvalidMigrations { .. }), "{err}");
        }
        assert!(check_list("", &ok).is_err());
    }
}
