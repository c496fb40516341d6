//! One process per state directory: an exclusive advisory lock on `<dir>/lock`, taken before
//! the database is opened and held for the runtime's life. The kernel drops it when the
//! process ends, however it ends (kill -9 included), so a crash never leaves a stale lock.
//! The file names the holder's pid, so the second process can say which one is in its way.
//!
//! Within one process the lock is shared: a runtime rebuilt on the same directory after a
//! shutdown (while the old one's last tasks still wind down) takes the same hold.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// The directories this process holds, by canonical path.
static HELD: Mutex<Option<HashMap<PathBuf, Weak<Held>>>> = Mutex::new(None);

/// The lock file's name inside the state directory.
pub const LOCK_FILE: &str = "lock";

/// Why the state directory could not be taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateLockError {
    /// Another process holds the directory.
    #[error(
        "the state directory {dir} is in use by {holder}: stop that process, or give this one a state directory of its own"
    )]
    InUse {
        /// The directory.
        dir: PathBuf,
        /// "process 1234", or "another process" when the file names none.
        holder: String,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock the state directory {dir}: {source}")]
    Io {
        /// The directory.
        dir: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
}

/// The held lock on a state directory; dropping the last holder in this process lets the
/// directory go.
#[derive(Debug, Clone)]
pub struct StateDirLock(Arc<Held>);

#[derive(Debug)]
struct Held {
    _file: File,
    dir: PathBuf,
}

impl StateDirLock {
    /// Takes `dir` (created 0700 when missing) for this process, or says who has it.
    pub fn acquire(dir: &Path) -> Result<Self, StateLockError> {
        let io = |source| StateLockError::Io { dir: dir.to_path_buf(), source };
        create_private_dir(dir).map_err(io)?;
        let key = dir.canonicalize().map_err(io)?;
        let mut held = HELD.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let held = held.get_or_insert_with(HashMap::new);
        held.retain(|_, weak| weak.strong_count() > 0);
        if let Some(ours) = held.get(&key).and_then(Weak::upgrade) {
            return Ok(Self(ours));
        }
        let file = lock_file(dir)?;
        let ours = Arc::new(Held { _file: file, dir: dir.to_path_buf() });
        held.insert(key, Arc::downgrade(&ours));
        Ok(Self(ours))
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.0.dir
    }
}

/// Opens and locks `<dir>/lock`, then writes this process's pid into it.
fn lock_file(dir: &Path) -> Result<File, StateLockError> {
    let io = |source| StateLockError::Io { dir: dir.to_path_buf(), source };
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(dir.join(LOCK_FILE)).map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut named = String::new();
            let _ = file.read_to_string(&mut named);
            let holder = match named.trim().parse::<u32>() {
                Ok(pid) => format!("process {pid}"),
                Err(_) => "another process".to_owned(),
            };
            return Err(StateLockError::InUse { dir: dir.to_path_buf(), holder });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    let pid = std::process::id().to_string();
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    file.write_all(pid.as_bytes()).map_err(io)?;
    file.flush().map_err(io)?;
    Ok(file)
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_another_holder_locked_is_refused_naming_its_pid_until_it_lets_go() {
        let dir = tempfile::tempdir().expect("dir");
        let state = dir.path().join("state");
        // Another process's hold: the same lock on the same file, by another open file.
        std::fs::create_dir_all(&state).expect("dir");
        let other = lock_file(&state).expect("the other takes it");
        let refused = StateDirLock::acquire(&state).expect_err("refused while held");
        let message = refused.to_string();
        assert!(
            message.contains(&format!("in use by process {}", std::process::id())),
            "{message}"
        );
        assert!(message.contains(&state.display().to_string()), "{message}");
        drop(other);
        StateDirLock::acquire(&state).expect("free again once the other let go");
    }

    #[test]
    fn within_one_process_the_hold_is_shared_and_ends_with_its_last_holder() {
        let dir = tempfile::tempdir().expect("dir");
        let first = StateDirLock::acquire(dir.path()).expect("first");
        let again = StateDirLock::acquire(dir.path()).expect("a rebuilt runtime shares it");
        drop(first);
        assert!(lock_file(dir.path()).is_err(), "still held by the second");
        drop(again);
        assert!(lock_file(dir.path()).is_ok(), "let go with the last holder");
    }

    #[cfg(unix)]
    #[test]
    fn the_lock_file_is_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let _lock = StateDirLock::acquire(dir.path()).expect("lock");
        let mode = std::fs::metadata(dir.path().join(LOCK_FILE)).expect("meta").permissions();
        assert_eq!(mode.mode() & 0o777, 0o600);
    }
}
