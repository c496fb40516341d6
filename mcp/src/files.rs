//! Files the agent hands to a Connector: a file reference argument names either a file this
//! bridge offers as a resource (an inbound file, `xagent-connector://files/ID`) or a file under
//! one of the directories allowed on the command line (`--allow-dir`). Nothing else is read.
//!
//! A path is opened beneath an allowed directory's handle in one step (`cap-std`: `openat2`
//! with `RESOLVE_BENEATH` where the kernel has it, a component-by-component walk otherwise), so
//! no name can be swapped for a link between a check and the read: the bytes uploaded are read
//! from the handle that was checked. The last component must not be a symbolic link, nothing
//! on the way may leave the directory, and the file must be a regular file with one link (a
//! hard link is refused: it may be another name of an outside file). Every refusal gives the
//! same answer, so nothing tells whether a path outside exists.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use xagent_protocol_types::ErrorCode;

/// URI prefix of the file resources the bridge offers.
pub const FILE_URI_PREFIX: &str = "xagent-connector://files/";

/// Largest file the bridge uploads for the agent (25 MiB).
pub const MAX_UPLOAD_BYTES: u64 = 25 * 1024 * 1024;

/// Why a file reference cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileRefError {
    /// The reference names no file the bridge may send: outside every allowed directory,
    /// absent, a symbolic or hard link, not a regular file, or not a path at all. One answer
    /// for all of them, so it reveals nothing about files outside.
    #[error(
        "{0:?} is no file this server may send; pass a resource URI it offers ({FILE_URI_PREFIX}...) or the path of a regular file (not a symbolic or hard link) under a directory given with --allow-dir"
    )]
    Unavailable(String),
    /// Too large to upload.
    #[error("{name:?} has {size} bytes; at most {max} bytes are uploaded")]
    TooLarge {
        /// The reference.
        name: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The file was opened but could not be read.
    #[error("{0:?} could not be read; check that the file is readable")]
    Unreadable(String),
    /// An allowed directory given on the command line does not exist.
    #[error("--allow-dir {0:?} is not a directory")]
    BadAllowedDir(String),
}

impl FileRefError {
    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Unavailable(_) | Self::Unreadable(_) | Self::BadAllowedDir(_) => {
                ErrorCode::InvalidArguments
            }
            Self::TooLarge { .. } => ErrorCode::PayloadTooLarge,
        }
    }
}

/// Where a file reference points.
#[derive(Debug)]
pub enum FileSource {
    /// A file of the bridge's inbox, by id.
    Inbox(String),
    /// A file on disk beneath an allowed directory, already opened and checked.
    Disk(DiskFile),
}

/// A file opened beneath an allowed directory: a regular file with one link, at most
/// [`MAX_UPLOAD_BYTES`]. Read it with [`DiskFile::read_all`] (the same handle that was checked).
#[derive(Debug)]
pub struct DiskFile {
    /// The path's last component (for the file name and MIME type).
    pub name: String,
    /// Its size when it was checked.
    pub len: u64,
    file: std::fs::File,
    reference: String,
}

impl DiskFile {
    /// Reads the opened file, at most [`MAX_UPLOAD_BYTES`] (a file that grew past the limit
    /// after the check is refused).
    pub fn read_all(self) -> Result<Vec<u8>, FileRefError> {
        let mut bytes = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0));
        self.file
            .take(MAX_UPLOAD_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|_| FileRefError::Unreadable(self.reference.clone()))?;
        if bytes.len() as u64 > MAX_UPLOAD_BYTES {
            return Err(FileRefError::TooLarge {
                name: self.reference,
                size: bytes.len() as u64,
                max: MAX_UPLOAD_BYTES,
            });
        }
        Ok(bytes)
    }
}

/// One allowed directory: its canonical path, the path as given, and an open handle every
/// file is opened beneath (so renaming the directory away does not redirect the bridge).
#[derive(Debug)]
struct AllowedDir {
    canonical: PathBuf,
    given: PathBuf,
    handle: cap_std::fs::Dir,
}

/// The directories the agent may take files from.
#[derive(Debug, Clone, Default)]
pub struct AllowedDirs(Arc<Vec<AllowedDir>>);

impl AllowedDirs {
    /// Opens each directory (each must exist).
    pub fn new(dirs: &[PathBuf]) -> Result<Self, FileRefError> {
        dirs.iter()
            .map(|dir| {
                let bad = || FileRefError::BadAllowedDir(dir.display().to_string());
                let canonical = dir.canonicalize().map_err(|_| bad())?;
                if !canonical.is_dir() {
                    return Err(bad());
                }
                let handle =
                    cap_std::fs::Dir::open_ambient_dir(&canonical, cap_std::ambient_authority())
                        .map_err(|_| bad())?;
                let given = std::path::absolute(dir).unwrap_or_else(|_| canonical.clone());
                Ok(AllowedDir { canonical, given, handle })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|dirs| Self(Arc::new(dirs)))
    }

    /// The directories (canonical paths).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.0.iter().map(|d| d.canonical.clone()).collect()
    }

    /// Resolves and opens a reference the agent supplied: an inbox resource URI, a `file://`
    /// URL or a path (a relative path is taken relative to each allowed directory in turn).
    /// Blocking (it opens files): call it off the async executor.
    pub fn resolve(&self, reference: &str) -> Result<FileSource, FileRefError> {
        let reference = reference.trim();
        let unavailable = || FileRefError::Unavailable(reference.to_owned());
        if let Some(id) = reference.strip_prefix(FILE_URI_PREFIX) {
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(unavailable());
            }
            return Ok(FileSource::Inbox(id.to_owned()));
        }
        let path = if let Some(rest) = reference.strip_prefix("file://") {
            url::Url::parse(&format!("file://{rest}"))
                .ok()
                .and_then(|u| u.to_file_path().ok())
                .ok_or_else(unavailable)?
        } else if reference.contains("://") || reference.is_empty() {
            return Err(unavailable());
        } else {
            PathBuf::from(reference)
        };
        for dir in self.0.iter() {
            let Some(relative) = beneath(dir, &path) else { continue };
            match open_beneath(dir, &relative, reference) {
                Ok(Some(file)) => return Ok(FileSource::Disk(file)),
                Ok(None) => continue,
                Err(error) => return Err(error),
            }
        }
        Err(unavailable())
    }
}

/// The path relative to `dir`: a relative path as it is; an absolute one only when it starts
/// with the directory (as canonicalised or as given), lexically. Whatever `..` it holds is left
/// to [`open_beneath`], which refuses to leave the directory.
fn beneath(dir: &AllowedDir, path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return Some(path.to_path_buf());
    }
    let rest = path.strip_prefix(&dir.canonical).or_else(|_| path.strip_prefix(&dir.given)).ok()?;
    Some(if rest.as_os_str().is_empty() { PathBuf::from(".") } else { rest.to_path_buf() })
}

/// Opens `relative` beneath `dir` without following a link out of it or at its last component,
/// and checks the handle: a regular file with one link, within the size limit. `Ok(None)`:
/// nothing this directory may give (the caller tries the next, then answers
/// [`FileRefError::Unavailable`]).
fn open_beneath(
    dir: &AllowedDir,
    relative: &Path,
    reference: &str,
) -> Result<Option<DiskFile>, FileRefError> {
    if relative.components().any(|c| matches!(c, Component::Prefix(_) | Component::RootDir)) {
        return Ok(None);
    }
    let mut options = cap_std::fs::OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No);
    #[cfg(unix)]
    {
        use cap_std::fs::OpenOptionsExt;
        // A FIFO or device must not block the open (it is refused just below).
        options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let Ok(file) = dir.handle.open_with(relative, &options) else { return Ok(None) };
    let file = file.into_std();
    let Ok(metadata) = file.metadata() else { return Ok(None) };
    if !metadata.is_file() || links(&metadata) != 1 {
        return Ok(None);
    }
    if metadata.len() > MAX_UPLOAD_BYTES {
        return Err(FileRefError::TooLarge {
            name: reference.to_owned(),
            size: metadata.len(),
            max: MAX_UPLOAD_BYTES,
        });
    }
    let name = relative
        .file_name()
        .map(|n| safe_filename(&n.to_string_lossy()))
        .unwrap_or_else(|| "file".into());
    Ok(Some(DiskFile { name, len: metadata.len(), file, reference: reference.to_owned() }))
}

/// How many names the file has (1 where the platform does not say).
fn links(metadata: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        metadata.nlink()
    }
    #[cfg(not(unix))]
    {
        let _ = metadata;
        1
    }
}

/// A file name safe to show and to store: the last path component, with control characters
/// and separators replaced, at most 200 characters.
pub fn safe_filename(name: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let cleaned: String = last
        .chars()
        .map(|c| if c.is_control() || matches!(c, '/' | '\\' | ':') { '_' } else { c })
        .take(200)
        .collect();
    let cleaned = cleaned.trim_matches(|c| c == '.' || c == ' ').to_owned();
    if cleaned.is_empty() { "file".to_owned() } else { cleaned }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, AllowedDirs) {
        let root = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let allowed = root.path().join("allowed");
        let outside = root.path().join("outside");
        for dir in [&allowed, &outside] {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(allowed.join("report.txt"), b"ok").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(outside.join("secret.txt"), b"no").unwrap_or_else(|e| panic!("{e}"));
        let dirs = AllowedDirs::new(&[allowed]).unwrap_or_else(|e| panic!("{e}"));
        (root, dirs)
    }

    /// The bytes a reference resolves to, or the error.
    fn read(dirs: &AllowedDirs, reference: &str) -> Result<Vec<u8>, FileRefError> {
        match dirs.resolve(reference)? {
            FileSource::Disk(file) => file.read_all(),
            FileSource::Inbox(id) => panic!("{reference} resolved to the inbox file {id}"),
        }
    }

    /// The refusal's message with the reference taken out (it is echoed back).
    fn answer(dirs: &AllowedDirs, reference: &str) -> String {
        match read(dirs, reference) {
            Ok(_) => "uploaded".into(),
            Err(error) => error.to_string().replace(reference, "REF"),
        }
    }

    #[test]
    fn a_path_under_an_allowed_dir_resolves() {
        let (root, dirs) = setup();
        let absolute = root.path().join("allowed/report.txt");
        assert_eq!(read(&dirs, &absolute.display().to_string()).ok(), Some(b"ok".to_vec()));
        assert_eq!(read(&dirs, "report.txt").ok(), Some(b"ok".to_vec()));
        let url = format!("file://{}", absolute.display());
        assert_eq!(read(&dirs, &url).ok(), Some(b"ok".to_vec()));
        // A `..` that stays inside is fine.
        std::fs::create_dir_all(root.path().join("allowed/sub")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&dirs, "sub/../report.txt").ok(), Some(b"ok".to_vec()));
        match dirs.resolve("report.txt") {
            Ok(FileSource::Disk(file)) => {
                assert_eq!((file.name.as_str(), file.len), ("report.txt", 2))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn file_ref_outside_allowed_dirs_is_refused() {
        let (root, dirs) = setup();
        let outside = root.path().join("outside/secret.txt");
        let error = read(&dirs, &outside.display().to_string()).err();
        assert!(matches!(error, Some(FileRefError::Unavailable(_))), "{error:?}");
        assert_eq!(error.map(|e| e.code()), Some(ErrorCode::InvalidArguments));
        // Climbing out with .. is refused too, also from an absolute path that starts inside.
        assert!(matches!(read(&dirs, "../outside/secret.txt"), Err(FileRefError::Unavailable(_))));
        let climbing = root.path().join("allowed/../outside/secret.txt");
        let climbing = climbing.display().to_string();
        assert!(matches!(read(&dirs, &climbing), Err(FileRefError::Unavailable(_))));
        // Other URL schemes are not files.
        assert!(matches!(read(&dirs, "https://example.com/x"), Err(FileRefError::Unavailable(_))));
    }

    #[test]
    fn allow_dir_answers_outside_and_absent_alike() {
        let (root, dirs) = setup();
        let refused = answer(&dirs, "missing.txt");
        assert_ne!(refused, "uploaded");
        for reference in [
            "../outside/secret.txt".to_owned(),
            "../outside/absent.txt".to_owned(),
            "../../../../../../etc/passwd".to_owned(),
            "../../../../../../etc/absent-file".to_owned(),
            root.path().join("outside/secret.txt").display().to_string(),
            root.path().join("outside/absent.txt").display().to_string(),
            "/etc/passwd".to_owned(),
            "/etc/absent-file".to_owned(),
        ] {
            assert_eq!(answer(&dirs, &reference), refused, "{reference}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn file_ref_symlink_escaping_an_allowed_dir_is_refused() {
        let (root, dirs) = setup();
        let link = root.path().join("allowed/link.txt");
        std::os::unix::fs::symlink(root.path().join("outside/secret.txt"), &link)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(read(&dirs, "link.txt"), Err(FileRefError::Unavailable(_))));
        // A directory link out of the allowed directory leads nowhere either.
        let out = root.path().join("allowed/out");
        std::os::unix::fs::symlink(root.path().join("outside"), &out)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(read(&dirs, "out/secret.txt"), Err(FileRefError::Unavailable(_))));
        // Even a link to a file inside is not followed: the last component is never a link.
        let inner = root.path().join("allowed/inner.txt");
        std::os::unix::fs::symlink("report.txt", &inner).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer(&dirs, "inner.txt"), answer(&dirs, "missing.txt"));
    }

    #[cfg(unix)]
    #[test]
    fn allow_dir_refuses_hard_links_to_outside_files() {
        let (root, dirs) = setup();
        let link = root.path().join("allowed/hard.txt");
        std::fs::hard_link(root.path().join("outside/secret.txt"), &link)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(read(&dirs, "hard.txt"), Err(FileRefError::Unavailable(_))));
        assert_eq!(answer(&dirs, "hard.txt"), answer(&dirs, "missing.txt"));
        // The same file under its one remaining name is an ordinary file again.
        std::fs::remove_file(root.path().join("outside/secret.txt"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read(&dirs, "hard.txt").ok(), Some(b"no".to_vec()));
    }

    #[cfg(unix)]
    #[test]
    fn allow_dir_symlink_swap_cannot_escape() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (root, dirs) = setup();
        let allowed = root.path().join("allowed");
        let name = allowed.join("race.txt");
        std::fs::write(&name, b"ok").unwrap_or_else(|e| panic!("{e}"));
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = Arc::clone(&stop);
            let secret = root.path().join("outside/secret.txt");
            let (link, file) = (allowed.join(".link"), allowed.join(".file"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::remove_file(&link);
                    let _ = std::os::unix::fs::symlink(&secret, &link);
                    let _ = std::fs::rename(&link, &name);
                    let _ = std::fs::write(&file, b"ok");
                    let _ = std::fs::rename(&file, &name);
                }
            })
        };
        let (mut read_inside, mut refused) = (0, 0);
        for _ in 0..3_000 {
            match read(&dirs, "race.txt") {
                Ok(bytes) => {
                    assert_eq!(bytes, b"ok", "an upload carried the outside file");
                    read_inside += 1;
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        let _ = swapper.join();
        assert!(
            read_inside > 0 && refused > 0,
            "the race ran ({read_inside} read, {refused} refused)"
        );
    }

    #[test]
    fn file_ref_without_allowed_dirs_takes_only_inbox_resources() {
        let none = AllowedDirs::default();
        assert!(matches!(none.resolve("report.txt"), Err(FileRefError::Unavailable(_))));
        assert!(matches!(
            none.resolve("xagent-connector://files/f_abc"),
            Ok(FileSource::Inbox(id)) if id == "f_abc"
        ));
        assert!(matches!(
            none.resolve("xagent-connector://files/../x"),
            Err(FileRefError::Unavailable(_))
        ));
    }

    #[test]
    fn directories_are_not_files() {
        let (_root, dirs) = setup();
        std::fs::create_dir_all(dirs.dirs()[0].join("sub")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(read(&dirs, "sub"), Err(FileRefError::Unavailable(_))));
        assert!(matches!(read(&dirs, "."), Err(FileRefError::Unavailable(_))));
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let (_root, dirs) = setup();
        let fifo = dirs.dirs()[0].join("pipe");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        assert!(matches!(read(&dirs, "pipe"), Err(FileRefError::Unavailable(_))));
    }

    #[test]
    fn filenames_are_made_safe() {
        assert_eq!(safe_filename("../../etc/passwd"), "passwd");
        assert_eq!(safe_filename("a\u{0}b.txt"), "a_b.txt");
        assert_eq!(safe_filename(".."), "file");
        assert_eq!(safe_filename("photo.png"), "photo.png");
    }
}
