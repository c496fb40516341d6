//! `xagent-connector backup --state-dir DIR --out FILE`: an online backup of a state
//! directory, safe while the Connector runs. Every SQLite database (`*.sqlite3`, the
//! runtime's and the Connector's own, matrix-sdk's stores) is copied with `VACUUM INTO`,
//! which reads one consistent snapshot inside a read transaction while writers go on; every
//! other file (Transfer Plane files, the Matrix session) is copied as it is. The lock file and
//! SQLite's `-wal`/`-shm`/`-journal` companions are left out (the snapshots need none). The
//! result is one tar archive, created with mode 0600 (it holds the channels' credentials):
//! restore it with `mkdir -m 700 DIR && tar -xf FILE -C DIR` while the Connector is stopped
//! (every entry is owner-only: directories 0700, files 0600).
//!
//! With `--database-url` the runtime's state is in PostgreSQL (back it up with `pg_dump`) and
//! the directory keeps only what is not: the lock, and for im.matrix the bot's session and
//! crypto stores. `backup` copies those; a directory holding only the lock is refused with
//! that advice.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

/// Options of `backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The state directory to back up (the Connector may be running on it).
    #[arg(long)]
    state_dir: PathBuf,
    /// The archive to write: a tar file, created with mode 0600; an existing file is refused.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// How long a snapshot waits for a writer's lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the backup.
pub fn run_command(args: BackupArgs) -> ExitCode {
    match backup(&args.state_dir, &args.out) {
        Ok(summary) => {
            println!(
                "backed up {} to {}: {} database(s), {} other file(s), {} bytes",
                args.state_dir.display(),
                args.out.display(),
                summary.databases,
                summary.files,
                summary.bytes
            );
            if !args.state_dir.join("connector.sqlite3").is_file() {
                println!(
                    "the runtime's state is in PostgreSQL (--database-url): back it up with pg_dump as well"
                );
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            // A half-written archive is no backup.
            if !message.starts_with("refused:") {
                let _ = std::fs::remove_file(&args.out);
            }
            crate::usage("backup", message.trim_start_matches("refused: "))
        }
    }
}

/// What went into the archive.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub(crate) databases: usize,
    pub(crate) files: usize,
    pub(crate) bytes: u64,
}

pub(crate) fn backup(state_dir: &Path, out: &Path) -> Result<Summary, String> {
    let on_sqlite = state_dir.join("connector.sqlite3").is_file();
    if !on_sqlite && !state_dir.join(xagent_server_runtime::ops::LOCK_FILE).is_file() {
        return Err(format!(
            "refused: {} holds neither connector.sqlite3 nor a Connector's lock: not a Connector's state directory",
            state_dir.display()
        ));
    }
    let mut paths = Vec::new();
    collect(state_dir, state_dir, &mut paths)?;
    if !on_sqlite && paths.is_empty() {
        return Err(format!(
            "refused: {} holds only the lock: this Connector keeps its state in PostgreSQL (--database-url); back up the database with pg_dump",
            state_dir.display()
        ));
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let file = options.open(out).map_err(|e| match e.kind() {
        std::io::ErrorKind::AlreadyExists => {
            format!("refused: {} exists; name a new file", out.display())
        }
        _ => format!("refused: cannot create {}: {e}", out.display()),
    })?;
    let scratch = tempfile::Builder::new()
        .prefix("xagent-backup-")
        .tempdir()
        .map_err(|e| format!("cannot make a scratch directory: {e}"))?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(file));
    let mut summary = Summary::default();
    paths.sort();
    // Directories first, owner-only like the state directory itself.
    let mut dirs: Vec<PathBuf> =
        paths.iter().flat_map(|p| p.ancestors().skip(1)).map(Path::to_path_buf).collect();
    dirs.retain(|d| !d.as_os_str().is_empty());
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o700);
        header.set_size(0);
        header.set_mtime(now_secs());
        archive
            .append_data(&mut header, &dir, std::io::empty())
            .map_err(|e| format!("cannot add {} to the archive: {e}", dir.display()))?;
    }
    for relative in paths {
        let source = state_dir.join(&relative);
        let name = relative.to_string_lossy().into_owned();
        if name.ends_with(".sqlite3") {
            let snapshot = scratch.path().join(format!("db-{}", summary.databases));
            snapshot_database(&source, &snapshot)?;
            summary.bytes += append(&mut archive, &snapshot, &relative)?;
            summary.databases += 1;
        } else {
            summary.bytes += append(&mut archive, &source, &relative)?;
            summary.files += 1;
        }
    }
    let mut writer = archive.into_inner().map_err(|e| format!("cannot finish the archive: {e}"))?;
    std::io::Write::flush(&mut writer).map_err(|e| format!("cannot write the archive: {e}"))?;
    writer
        .into_inner()
        .map_err(|e| format!("cannot write the archive: {e}"))?
        .sync_all()
        .map_err(|e| format!("cannot write the archive: {e}"))?;
    Ok(summary)
}

/// Every regular file under `dir` (relative to `root`), minus the lock and SQLite's
/// companions; symbolic links are not followed.
fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let kind = entry.file_type().map_err(|e| format!("{}: {e}", entry.path().display()))?;
        let path = entry.path();
        if kind.is_dir() {
            collect(root, &path, out)?;
            continue;
        }
        if !kind.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let companion = [".sqlite3-wal", ".sqlite3-shm", ".sqlite3-journal"]
            .iter()
            .any(|suffix| name.ends_with(suffix));
        let lock = dir == root && name == xagent_server_runtime::ops::LOCK_FILE;
        if companion || lock {
            continue;
        }
        if let Ok(relative) = path.strip_prefix(root) {
            out.push(relative.to_path_buf());
        }
    }
    Ok(())
}

/// A consistent copy of a live database: `VACUUM INTO` reads one snapshot.
fn snapshot_database(source: &Path, target: &Path) -> Result<(), String> {
    let shown = source.display();
    let conn = rusqlite::Connection::open_with_flags(
        source,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("cannot open {shown}: {e}"))?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(|e| format!("{shown}: {e}"))?;
    let target = target.to_str().ok_or_else(|| format!("{} is not UTF-8", target.display()))?;
    conn.execute("VACUUM INTO ?1", [target]).map_err(|e| format!("cannot copy {shown}: {e}"))?;
    Ok(())
}

fn append<W: std::io::Write>(
    archive: &mut tar::Builder<W>,
    source: &Path,
    name: &Path,
) -> Result<u64, String> {
    let file = std::fs::File::open(source)
        .map_err(|e| format!("cannot read {}: {e}", source.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    // Owner-only whatever the source's mode: the state holds credentials.
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o600);
    header.set_mtime(now_secs());
    // A file still growing is cut at the size read above (the header must match).
    archive
        .append_data(&mut header, name, std::io::Read::take(file, size))
        .map_err(|e| format!("cannot add {} to the archive: {e}", name.display()))?;
    Ok(size)
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
