//! Reading a secret (an API key, a password, a bearer token) from a file an operator keeps, so
//! that it never shows in the process list: one home for the checks every such file gets.

use std::io::Read;
use std::path::Path;

use xagent_protocol_types::Secret;

/// A secret read from a file, and whether the file is readable by other users than its owner
/// (the caller warns or refuses; always false off Unix).
#[derive(Debug)]
pub struct SecretFile {
    /// The file's first line, trimmed.
    pub value: Secret,
    /// True when group or others may read the file (its mode is looser than 0600).
    pub shared: bool,
}

/// Why a secret file cannot be used. The message is a phrase to follow the file's name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SecretFileError {
    /// The file cannot be opened or inspected.
    #[error("cannot be read ({0})")]
    Unreadable(std::io::Error),
    /// A directory or some other non-regular file.
    #[error("is not a regular file")]
    NotAFile,
    /// Larger than the limit the caller gave.
    #[error("is larger than {max_bytes} bytes; it must hold the secret on one line")]
    TooLarge {
        /// The limit.
        max_bytes: u64,
    },
    /// Not UTF-8 text.
    #[error("is not UTF-8 text")]
    NotText,
    /// Nothing but blanks on the first line.
    #[error("is empty; write the secret on its first line")]
    Empty,
}

/// Reads the secret file at `path`: a regular file of at most `max_bytes` bytes whose first
/// line, trimmed, is the (non-empty) secret; reports whether other users may read it.
pub fn read_secret_file(path: &Path, max_bytes: u64) -> Result<SecretFile, SecretFileError> {
    let file = std::fs::File::open(path).map_err(SecretFileError::Unreadable)?;
    let metadata = file.metadata().map_err(SecretFileError::Unreadable)?;
    if !metadata.is_file() {
        return Err(SecretFileError::NotAFile);
    }
    if metadata.len() > max_bytes {
        return Err(SecretFileError::TooLarge { max_bytes });
    }
    let mut bytes = Vec::new();
    // One byte past the limit tells a file that grew since `metadata` from one that did not.
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(SecretFileError::Unreadable)?;
    if bytes.len() as u64 > max_bytes {
        return Err(SecretFileError::TooLarge { max_bytes });
    }
    let text = String::from_utf8(bytes).map_err(|_| SecretFileError::NotText)?;
    let value = text.lines().next().unwrap_or("").trim();
    if value.is_empty() {
        return Err(SecretFileError::Empty);
    }
    Ok(SecretFile { value: Secret::new(value), shared: readable_by_others(&metadata) })
}

/// True when group or others may read a file with `metadata` (always false off Unix).
pub fn readable_by_others(metadata: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        metadata.permissions().mode() & 0o077 != 0
    }
    #[cfg(not(unix))]
    {
        let _ = metadata;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_file(name: &str, contents: &[u8]) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("xagent-secret-file-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let path = dir.join("secret");
        std::fs::write(&path, contents).expect("written");
        path
    }

    #[test]
    fn the_first_line_trimmed_is_the_secret_and_blank_or_binary_files_are_refused() {
        let path = temp_file("lines", b"  sk-123  \nsecond line\n");
        let read = read_secret_file(&path, 64).expect("reads");
        assert_eq!(read.value.expose(), "sk-123");
        std::fs::write(&path, "\n").expect("written");
        assert!(matches!(read_secret_file(&path, 64), Err(SecretFileError::Empty)));
        std::fs::write(&path, [0xff, 0xfe, b'\n']).expect("written");
        assert!(matches!(read_secret_file(&path, 64), Err(SecretFileError::NotText)));
        let missing = path.with_file_name("missing");
        assert!(matches!(read_secret_file(&missing, 64), Err(SecretFileError::Unreadable(_))));
        let dir = path.parent().expect("a parent");
        assert!(matches!(read_secret_file(dir, 64), Err(SecretFileError::NotAFile)));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_file_over_the_limit_is_refused_not_cut() {
        let path = temp_file("large", &[b'k'; 65]);
        let refused = read_secret_file(&path, 64);
        assert!(matches!(refused, Err(SecretFileError::TooLarge { max_bytes: 64 })), "{refused:?}");
        std::fs::write(&path, [b'k'; 64]).expect("written");
        assert_eq!(read_secret_file(&path, 64).expect("reads").value.expose().len(), 64);
        let _ = std::fs::remove_dir_all(path.parent().expect("a parent"));
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_read_is_reported_shared() {
        use std::os::unix::fs::PermissionsExt;
        let path = temp_file("mode", b"sk-123\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(!read_secret_file(&path, 64).expect("reads").shared);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        assert!(read_secret_file(&path, 64).expect("reads").shared);
        let _ = std::fs::remove_dir_all(path.parent().expect("a parent"));
    }
}
