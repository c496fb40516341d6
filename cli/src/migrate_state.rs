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
//! An xAgent-side directory (`--connector-card-id`) moves its runtime state (`xagent.sqlite3`)
//! in one transaction, and an MCP bridge's inbox (`mcp-inbox.sqlite3` and its `files/`, which
//! then are the inbox's, not a Transfer Plane's) message by message, file bytes included,
//! through the inbox's own copy. A database that already holds state is refused.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use xagent_client_runtime::store::{
    PostgresXagentStore, SqliteXagentStore, XagentStore, XagentWrite,
};
use xagent_file_transfer::backend::{FileBackend, PostgresBackend};
use xagent_file_transfer::{FileStore, StoreConfig, UrlSigner};
use xagent_profile_im::{IdempotencyWrite, OutboxWrite};
use xagent_protocol_types::{Secret, SystemClock};
use xagent_server_runtime::ops::DatabaseUrl;
use xagent_server_runtime::storage::{
    DATABASE_FILE, ExportCounts, PostgresOptions, PostgresStorage, SqliteStorage, WriteOp,
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
    /// For an xAgent-side state directory (mcp or mock-xagent: it holds xagent.sqlite3): the
    /// Connector Card id its state belongs to (the `connector_card_id` of the Connector's
    /// Card), under which the processes on PostgreSQL find it.
    #[arg(long = "connector-card-id", value_name = "ID")]
    connector_card_id: Option<String>,
}

/// The xAgent side's database file in a state directory (`client-runtime`'s).
const XAGENT_DATABASE_FILE: &str = "xagent.sqlite3";

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
    xagent: Option<XagentCounts>,
    files: usize,
    file_bytes: u64,
    webchat: Option<xagent_connector_webchat::LegacyImport>,
    inbox: Option<xagent_mcp::inbox::Copied>,
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
    let xagent_side = args.state_dir.join(XAGENT_DATABASE_FILE).is_file();
    let card = match (&args.connector_card_id, xagent_side) {
        (Some(card), true) => Some(card.clone()),
        (None, true) => {
            return crate::usage(
                "migrate-state",
                format!(
                    "{} holds an xAgent-side state ({XAGENT_DATABASE_FILE}): name its Card with \
                     --connector-card-id ID",
                    args.state_dir.display()
                ),
            );
        }
        (Some(_), false) => {
            return crate::usage(
                "migrate-state",
                format!(
                    "--connector-card-id is for an xAgent-side state, and {} holds no \
                     {XAGENT_DATABASE_FILE}",
                    args.state_dir.display()
                ),
            );
        }
        (None, false) => None,
    };
    match runtime.block_on(migrate(&args.state_dir, &url, card.as_deref())) {
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
    if let Some(c) = &moved.xagent {
        println!(
            "  xAgent side ({XAGENT_DATABASE_FILE}): {} channels, connector_id {}, Card snapshot \
             and Skill cache {}, {} outbox messages, {} receiver records",
            c.channels,
            if c.connector_id { "moved" } else { "none stored" },
            if c.admission { "moved" } else { "none stored" },
            c.outbox,
            c.completed
        );
    }
    if let Some(c) = &moved.inbox {
        println!(
            "  MCP bridge inbox ({}): {} messages, {} files ({} bytes)",
            xagent_mcp::inbox::SQLITE_FILE,
            c.messages,
            c.files,
            c.bytes
        );
    } else {
        println!("  files: {} ({} bytes)", moved.files, moved.file_bytes);
    }
    if let Some(w) = &moved.webchat {
        println!(
            "  im.webchat ({}): {} rooms, {} visitors, {} uploads, {} messages",
            xagent_connector_webchat::WEBCHAT_DATABASE_FILE,
            w.rooms,
            w.visitors,
            w.uploads,
            w.messages
        );
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

/// What an xAgent-side state held.
#[derive(Debug, Default)]
struct XagentCounts {
    channels: usize,
    connector_id: bool,
    admission: bool,
    outbox: usize,
    completed: usize,
}

/// Reads an xAgent-side state through its SQLite store: the writes that recreate it.
async fn xagent_export(dir: &Path) -> Result<(Vec<XagentWrite>, XagentCounts), MigrateError> {
    let nothing = |e: &dyn std::fmt::Display| MigrateError::NothingWritten(e.to_string());
    let store = SqliteXagentStore::open(dir).map_err(|e| nothing(&e))?;
    let mut writes = Vec::new();
    let mut counts = XagentCounts::default();
    for remembered in store.load_channels().await.map_err(|e| nothing(&e))? {
        writes.push(XagentWrite::SaveChannel {
            channel: remembered.channel,
            owner: remembered.owner,
        });
        counts.channels += 1;
    }
    if let Some(id) = store.load_connector_id().await.map_err(|e| nothing(&e))? {
        writes.push(XagentWrite::ConnectorId(id));
        counts.connector_id = true;
    }
    if let Some(snapshot) = store.load_admission().await.map_err(|e| nothing(&e))? {
        writes.push(XagentWrite::Admission(snapshot));
        counts.admission = true;
    }
    for record in store.load_pending().await.map_err(|e| nothing(&e))? {
        writes.push(XagentWrite::Outbox(OutboxWrite::Save(record)));
        counts.outbox += 1;
    }
    for (channel, message_id) in store.completed_ids().map_err(|e| nothing(&e))? {
        if let Some(record) =
            store.lookup_completed(&channel, &message_id).await.map_err(|e| nothing(&e))?
        {
            writes.push(XagentWrite::Idempotency(IdempotencyWrite::Save(record)));
            counts.completed += 1;
        }
    }
    Ok((writes, counts))
}

async fn migrate(dir: &Path, url: &DatabaseUrl, card: Option<&str>) -> Result<Moved, MigrateError> {
    let refused = |e: &dyn std::fmt::Display| MigrateError::Refused(e.to_string());
    let nothing = |e: &dyn std::fmt::Display| MigrateError::NothingWritten(e.to_string());
    let now = now_millis();
    let storage =
        PostgresStorage::connect(url, PostgresOptions::default()).await.map_err(|e| refused(&e))?;
    let pool =
        xagent_storage_postgres::connect(url, xagent_storage_postgres::PoolOptions::default())
            .await
            .map_err(|e| refused(&e))?;
    let files_target = PostgresBackend::open(pool.clone(), &unbounded_files(), now)
        .await
        .map_err(|e| refused(&e))?;
    // An MCP bridge's inbox: its target under the Card (every file it holds is admitted: its
    // limit was checked when the file was stored).
    let inbox_here = card.is_some() && dir.join(xagent_mcp::inbox::SQLITE_FILE).is_file();
    let inbox_target = match card {
        Some(card) if inbox_here => Some(
            xagent_mcp::inbox::Inbox::open_postgres(pool, card, u64::MAX)
                .await
                .map_err(|e| refused(&e))?,
        ),
        _ => None,
    };
    let inbox_held = match &inbox_target {
        Some(target) => target.count().await.map_err(|e| refused(&e))? > 0,
        None => false,
    };
    let files_held = files_target.usage().await.map_err(|e| refused(&e))?;
    let xagent_target = match card {
        Some(card) => Some(PostgresXagentStore::connect(url, card).await.map_err(|e| refused(&e))?),
        None => None,
    };
    let xagent_held = match &xagent_target {
        Some(target) => {
            !target.load_channels().await.map_err(|e| refused(&e))?.is_empty()
                || target.load_connector_id().await.map_err(|e| refused(&e))?.is_some()
                || target.load_admission().await.map_err(|e| refused(&e))?.is_some()
                || !target.load_pending().await.map_err(|e| refused(&e))?.is_empty()
        }
        None => false,
    };
    if storage.holds_state().await.map_err(|e| refused(&e))?
        || files_held.files > 0
        || xagent_held
        || inbox_held
    {
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
    // Beside a bridge's inbox, `files/` holds the inbox's files (moved with it below).
    let files_source = if files_dir.is_dir() && !inbox_here {
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

    let xagent_writes = match card {
        Some(_) => Some(xagent_export(dir).await?),
        None => None,
    };
    let inbox_source = match inbox_target {
        Some(_) => Some(xagent_mcp::inbox::Inbox::open(dir, u64::MAX).map_err(|e| nothing(&e))?),
        None => None,
    };

    // 1. The runtime's state: one submission, one transaction (all or nothing).
    if let Some((writes, counts)) = runtime_writes {
        storage.commit(writes).committed().await.map_err(|e| nothing(&e))?;
        moved.runtime = Some(counts);
    }
    // The xAgent side's state: one transaction too (no lease row: a lease is taken afresh).
    if let (Some(target), Some((writes, counts))) = (&xagent_target, xagent_writes) {
        let done = target.commit(None, writes).await;
        if let Err(e) = done {
            return Err(if moved.runtime.is_some() {
                MigrateError::Partial {
                    reason: format!("moving the xAgent-side state: {e}"),
                    total: 0,
                }
            } else {
                nothing(&e)
            });
        }
        moved.xagent = Some(counts);
    }
    // The bridge's inbox, message by message in arrival order (handed ones stay handed).
    if let (Some(source), Some(target)) = (&inbox_source, &inbox_target) {
        let copied = source.copy_into(target, now).await.map_err(|e| MigrateError::Partial {
            reason: format!("moving the MCP bridge's inbox: {e}"),
            total: 0,
        })?;
        moved.inbox = Some(copied);
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
    // 3. An older im.webchat's own database: its rooms, visitors, quota and messages become
    // author records (the file is renamed `.migrated` once they committed).
    let author = xagent_server_runtime::AuthorStore::new(std::sync::Arc::new(storage));
    match xagent_connector_webchat::import_legacy_state(dir, &author, now).await {
        Ok(imported) => moved.webchat = imported,
        Err(e) => {
            return Err(MigrateError::Partial {
                reason: format!("moving im.webchat's own database: {e}"),
                total: moved.files,
            });
        }
    }
    Ok(moved)
}
