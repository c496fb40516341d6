//! Files the agent hands to a Connector: a file reference argument names either a file this
//! bridge offers as a resource (an inbound file, `xagent-connector://files/ID`) or a file under
//! one of the directories allowed on the command line (`--allow-dir`). Nothing else is read:
//! a path is resolved with every symbolic link followed and must then still lie inside an
//! allowed directory.

use std::path::{Path, PathBuf};

use xagent_protocol_types::ErrorCode;

/// URI prefix of the file resources the bridge offers.
pub const FILE_URI_PREFIX: &str = "xagent-connector://files/";

/// Largest file the bridge uploads for the agent (25 MiB).
pub const MAX_UPLOAD_BYTES: u64 = 25 * 1024 * 1024;

/// Why a file reference cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileRefError {
    /// The reference names no file the bridge may read.
    #[error(
        "{0:?} is outside every allowed directory; pass a resource URI this server offers ({FILE_URI_PREFIX}...) or a path under a directory given with --allow-dir"
    )]
    NotAllowed(String),
    /// No such file.
    #[error("no file at {0:?}; check the name")]
    NotFound(String),
    /// The reference is not a regular file.
    #[error("{0:?} is not a regular file")]
    NotAFile(String),
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
    /// An allowed directory given on the command line does not exist.
    #[error("--allow-dir {0:?} is not a directory")]
    BadAllowedDir(String),
}

impl FileRefError {
    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotAllowed(_) | Self::NotAFile(_) | Self::BadAllowedDir(_) => {
                ErrorCode::InvalidArguments
            }
            Self::NotFound(_) => ErrorCode::FileNotFound,
            Self::TooLarge { .. } => ErrorCode::PayloadTooLarge,
        }
    }
}

/// Where a file reference points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// A file of the bridge's inbox, by id.
    Inbox(String),
    /// A file on disk, inside an allowed directory (already checked).
    Disk(PathBuf),
}

/// The directories the agent may take files from, canonical.
#[derive(Debug, Clone, Default)]
pub struct AllowedDirs(Vec<PathBuf>);

impl AllowedDirs {
    /// Canonicalises each directory; each must exist.
    pub fn new(dirs: &[PathBuf]) -> Result<Self, FileRefError> {
        dirs.iter()
            .map(|dir| {
                let canonical = dir
                    .canonicalize()
                    .map_err(|_| FileRefError::BadAllowedDir(dir.display().to_string()))?;
                if canonical.is_dir() {
                    Ok(canonical)
                } else {
                    Err(FileRefError::BadAllowedDir(dir.display().to_string()))
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// The directories.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.0
    }

    /// Resolves a reference the agent supplied: an inbox resource URI, a `file://` URL or a
    /// path (a relative path is taken relative to each allowed directory in turn).
    pub fn resolve(&self, reference: &str) -> Result<FileSource, FileRefError> {
        let reference = reference.trim();
        if let Some(id) = reference.strip_prefix(FILE_URI_PREFIX) {
            if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(FileRefError::NotFound(reference.to_owned()));
            }
            return Ok(FileSource::Inbox(id.to_owned()));
        }
        let path = if let Some(rest) = reference.strip_prefix("file://") {
            url::Url::parse(&format!("file://{rest}"))
                .ok()
                .and_then(|u| u.to_file_path().ok())
                .ok_or_else(|| FileRefError::NotAllowed(reference.to_owned()))?
        } else if reference.contains("://") || reference.is_empty() {
            return Err(FileRefError::NotAllowed(reference.to_owned()));
        } else {
            PathBuf::from(reference)
        };
        let candidates: Vec<PathBuf> = if path.is_absolute() {
            vec![path]
        } else {
            self.0.iter().map(|dir| dir.join(&path)).collect()
        };
        let mut found_outside = false;
        for candidate in candidates {
            let Ok(canonical) = candidate.canonicalize() else { continue };
            if !self.0.iter().any(|dir| canonical.starts_with(dir)) {
                found_outside = true;
                continue;
            }
            let metadata = std::fs::metadata(&canonical)
                .map_err(|_| FileRefError::NotFound(reference.to_owned()))?;
            if !metadata.is_file() {
                return Err(FileRefError::NotAFile(reference.to_owned()));
            }
            if metadata.len() > MAX_UPLOAD_BYTES {
                return Err(FileRefError::TooLarge {
                    name: reference.to_owned(),
                    size: metadata.len(),
                    max: MAX_UPLOAD_BYTES,
                });
            }
            return Ok(FileSource::Disk(canonical));
        }
        // Say "not allowed" for anything outside, existing or not, so the answer does not
        // reveal which paths exist outside the allowed directories.
        if found_outside || Path::new(reference).is_absolute() || self.0.is_empty() {
            return Err(FileRefError::NotAllowed(reference.to_owned()));
        }
        Err(FileRefError::NotFound(reference.to_owned()))
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

    #[test]
    fn a_path_under_an_allowed_dir_resolves() {
        let (root, dirs) = setup();
        let absolute = root.path().join("allowed/report.txt");
        let expected = absolute.canonicalize().ok().map(FileSource::Disk);
        assert_eq!(dirs.resolve(&absolute.display().to_string()).ok(), expected);
        assert_eq!(dirs.resolve("report.txt").ok(), expected);
        assert_eq!(dirs.resolve(&format!("file://{}", absolute.display())).ok(), expected);
    }

    #[test]
    fn file_ref_outside_allowed_dirs_is_refused() {
        let (root, dirs) = setup();
        let outside = root.path().join("outside/secret.txt");
        let error = dirs.resolve(&outside.display().to_string()).err();
        assert!(matches!(error, Some(FileRefError::NotAllowed(_))), "{error:?}");
        assert_eq!(error.map(|e| e.code()), Some(ErrorCode::InvalidArguments));
        // Climbing out with .. is refused too.
        assert!(matches!(dirs.resolve("../outside/secret.txt"), Err(FileRefError::NotAllowed(_))));
        // A missing absolute path outside says the same, revealing nothing.
        assert!(matches!(dirs.resolve("/etc/nonexistent-file"), Err(FileRefError::NotAllowed(_))));
        // Other URL schemes are not files.
        assert!(matches!(dirs.resolve("https://example.com/x"), Err(FileRefError::NotAllowed(_))));
    }

    #[cfg(unix)]
    #[test]
    fn file_ref_symlink_escaping_an_allowed_dir_is_refused() {
        let (root, dirs) = setup();
        let link = root.path().join("allowed/link.txt");
        std::os::unix::fs::symlink(root.path().join("outside/secret.txt"), &link)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(dirs.resolve("link.txt"), Err(FileRefError::NotAllowed(_))));
    }

    #[test]
    fn file_ref_without_allowed_dirs_takes_only_inbox_resources() {
        let none = AllowedDirs::default();
        assert!(matches!(none.resolve("report.txt"), Err(FileRefError::NotAllowed(_))));
        assert_eq!(
            none.resolve("xagent-connector://files/f_abc").ok(),
            Some(FileSource::Inbox("f_abc".into()))
        );
        assert!(matches!(
            none.resolve("xagent-connector://files/../x"),
            Err(FileRefError::NotFound(_))
        ));
    }

    #[test]
    fn directories_are_not_files() {
        let (_root, dirs) = setup();
        std::fs::create_dir_all(dirs.dirs()[0].join("sub")).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(dirs.resolve("sub"), Err(FileRefError::NotAFile(_))));
    }

    #[test]
    fn filenames_are_made_safe() {
        assert_eq!(safe_filename("../../etc/passwd"), "passwd");
        assert_eq!(safe_filename("a\u{0}b.txt"), "a_b.txt");
        assert_eq!(safe_filename(".."), "file");
        assert_eq!(safe_filename("photo.png"), "photo.png");
    }
}
