//! `xagent-connector migrate-state --state-dir DIR --database-url URL`: moves a Connector's
//! SQLite state directory into an empty PostgreSQL database, so the Connector (and its
//! replicas) can then run with `--database-url`.
//!
//! What moves: the runtime's database (`connector.sqlite3`: the connector id, channels and
//! bindings, tool-call records, the IM outbox and receiver records, meta, author records), in
//! one transaction through `PostgresStorage`'s writer; then the Transfer Plane's files
//! (`files/`: records and bytes, and the URL signing secret, so signed URLs stay valid),
//! through `file-transfer`'s PostgreSQL backend, one file at a time. Everything is read with
//! the SQLite code that wrote it and written through the PostgreSQL backends' own write paths.
//! A database that already holds state is refused.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use xagent_file_transfer::backend::{FileBackend, PostgresBackend};
use xagent_file_transfer::{FileStore, StoreConfig, UrlSigner};
use xagent_protocol_types::{Secret, SystemClock};
use xagent_server_runtime::{
    DATABASE_FILE, DatabaseUrl, ExportCounts, PostgresOptions, PostgresStorage, SqliteStorage,
    WriteOp,
};

use crate::EXIT_USAGE;

/// The meta key of the Transfer Plane's URL signing secret in the runtime's database.
const SIGNING_SECRET_KEY: &str = "url_signing_secret";

/// `migrate-state`'s flags.
#[derive(Debug, Args)]
pub struct MigrateStateArgs {
    /// The SQLite state directory to move (the --state-dir the Connector ran with). It is
    /// only read; delete it yourself once the Connector runs on PostgreSQL.
    #[arg(long, value_name = "DIR")]
    state_dir: PathBuf,
    /// The target database (empty: migrate-state refuses one that holds state).
    #[command(flatten)]
    database: crate::database_args::DatabaseArgs,
}

/// Why a migration stopped.
#[derive(Debug, thiserror::Error)]
enum MigrateError {
    /// Nothing was written.
    #[error("{0}")]
    Refused(String),
    /// Something failed before anything was committed.
    #[error("{0}; nothing was written to the database")]
    NothingWritten(String),
    /// The runtime's state committed, the files only partly.
    #[error(
        "{reason}; the runtime's state was moved, but not all of the {total} files: to start \
         over, drop and re-create the database (DROP DATABASE; CREATE DATABASE) and run \
         migrate-state again"
    )]
    Partial {
        /// What failed.
        reason: String,
        /// Files to move.
        total: usize,
    },
}

/// What was moved.
#[derive(Debug, Default)]
struct Moved {
    runtime: Option<ExportCounts>,
    files: usize,
    file_bytes: u64,
    left: Vec<&'static str>,
}

/// Runs the subcommand.
pub fn run_command(args: MigrateStateArgs) -> ExitCode {
    let Some(url) = args.database.database_url.clone() else {
        return crate::usage(
            "migrate-state",
            "--database-url (or XAGENT_CONNECTOR_DATABASE_URL) names the target database",
        );
    };
    if !args.state_dir.is_dir() {
        return crate::usage(
            "migrate-state",
            format!("--state-dir {} is not a directory", args.state_dir.display()),
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage(
                "migrate-state",
                format!("cannot start the async runtime: {error}"),
            );
        }
    };
    match runtime.block_on(migrate(&args.state_dir, &url)) {
        Ok(moved) => {
            report(&args.state_dir, &url, &moved);
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("xagent-connector migrate-state: {error}");
            ExitCode::from(match error {
                MigrateError::Refused(_) => EXIT_USAGE,
                _ => 1,
            })
        }
    }
}

fn report(dir: &Path, url: &DatabaseUrl, moved: &Moved) {
    println!("moved {} into {url}:", dir.display());
    match &moved.runtime {
        Some(c) => println!(
            "  runtime: {} meta values, {} channels, {} tool calls, {} outbox messages, {} \
             receiver records, {} author records",
            c.meta, c.channels, c.tool_calls, c.outbox, c.completed, c.author_records
        ),
        None => println!("  runtime: no {DATABASE_FILE} in the directory"),
    }
    println!("  files: {} ({} bytes)", moved.files, moved.file_bytes);
    for note in &moved.left {
        println!("  not moved: {note}");
    }
}

fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A URL signer over `secret` (a fresh one when the directory held none).
fn signer(secret: Option<String>) -> Result<UrlSigner, xagent_file_transfer::TransferError> {
    UrlSigner::new(Secret::new(secret.unwrap_or_else(fresh_secret)))
}

/// A new random URL signing secret (64 hex digits), as a Connector makes at its first start.
fn fresh_secret() -> String {
    rand::random::<[u8; 32]>().iter().map(|b| format!("{b:02x}")).collect()
}

/// A files configuration that admits everything the directory holds (its limits were
/// checked when the files were stored).
fn unbounded_files() -> StoreConfig {
    let mut config = StoreConfig::default();
    config.max_total_bytes = u64::MAX;
    config.max_files = usize::MAX;
    config
}

async fn migrate(dir: &Path, url: &DatabaseUrl) -> Result<Moved, MigrateError> {
    let refused = |e: &dyn std::fmt::Display| MigrateError::Refused(e.to_string());
    let nothing = |e: &dyn std::fmt::Display| MigrateError::NothingWritten(e.to_string());
    let now = now_millis();
    let storage =
        PostgresStorage::connect(url, PostgresOptions::default()).await.map_err(|e| refused(&e))?;
    let pool =
        xagent_storage_postgres::connect(url, xagent_storage_postgres::PoolOptions::default())
            .await
            .map_err(|e| refused(&e))?;
    let files_target =
        PostgresBackend::open(pool, &unbounded_files(), now).await.map_err(|e| refused(&e))?;
    let files_held = files_target.usage().await.map_err(|e| refused(&e))?;
    if storage.holds_state().await.map_err(|e| refused(&e))? || files_held.files > 0 {
        return Err(MigrateError::Refused(format!(
            "{url} already holds a Connector's state; migrate-state moves a state directory \
             only into an empty database: point --database-url at a new database, or drop and \
             re-create this one (DROP DATABASE; CREATE DATABASE) to start over"
        )));
    }
    let mut moved = Moved::default();

    // Read everything before writing anything.
    let mut signing_secret = None;
    let runtime_writes = if dir.join(DATABASE_FILE).is_file() {
        let sqlite = SqliteStorage::open(dir).map_err(|e| nothing(&e))?;
        let (writes, counts) = sqlite.export().await.map_err(|e| nothing(&e))?;
        signing_secret = writes.iter().find_map(|w| match w {
            WriteOp::Meta { key, value: Some(value) } if key == SIGNING_SECRET_KEY => {
                Some(value.clone())
            }
            _ => None,
        });
        Some((writes, counts))
    } else {
        None
    };
    let files_dir = dir.join("files");
    let files_source = if files_dir.is_dir() {
        // The signer only signs download URLs, which copying issues none of.
        let signer = signer(signing_secret.clone()).map_err(|e| nothing(&e))?;
        let source = FileStore::open(&files_dir, unbounded_files(), signer, SystemClock)
            .await
            .map_err(|e| nothing(&e))?;
        let usage = source.usage().await.map_err(|e| nothing(&e))?;
        Some((source, usage))
    } else {
        None
    };

    // 1. The runtime's state: one submission, one transaction (all or nothing).
    if let Some((writes, counts)) = runtime_writes {
        storage.commit(writes).committed().await.map_err(|e| nothing(&e))?;
        moved.runtime = Some(counts);
    }
    // 2. The files, one at a time (each keeps its reference, channel, names and times), and
    // the URL signing secret, so download URLs signed before the move stay valid.
    if let Some((source, usage)) = files_source {
        let partial = |reason: String| MigrateError::Partial { reason, total: usage.files };
        let candidate = signing_secret.clone().unwrap_or_else(fresh_secret);
        let secret = files_target
            .signing_secret(&candidate)
            .await
            .map_err(|e| partial(format!("storing the URL signing secret: {e}")))?;
        let signer = signer(Some(secret)).map_err(|e| partial(e.to_string()))?;
        let target = FileStore::with_backend(
            std::sync::Arc::new(files_target),
            unbounded_files(),
            signer,
            std::sync::Arc::new(SystemClock),
        );
        moved.files = source
            .copy_into(&target)
            .await
            .map_err(|e| partial(format!("moving the files: {e}")))?;
        moved.file_bytes = usage.bytes;
    }
    if dir.join(xagent_connector_webchat::WEBCHAT_DATABASE_FILE).is_file() {
        moved.left.push(
            "im.webchat's own database (webchat.sqlite3): keep it in the state directory \
             im.webchat runs with",
        );
    }
    if dir.join("xagent.sqlite3").is_file() {
        moved.left.push("an xAgent-side state (xagent.sqlite3, mcp or mock-xagent)");
    }
    Ok(moved)
}
