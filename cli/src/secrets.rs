//! Secrets given to the long-running commands (`webchat`, `homie`): read from a file or the
//! environment, so they never show in the process list. One home for how a secret file is read.

use std::path::Path;

use xagent_client_runtime::secret_file::readable_by_others;

/// Largest secret file read (a key, a password: one line).
pub(crate) const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// The first line of a secret file, trimmed ([`xagent_client_runtime::secret_file::read_secret_file`]'s checks).
/// Warns on stderr (as `command`) when the file is readable by group or others; refuses an
/// empty or oversized file. `what` names the secret in messages (never its value).
pub(crate) fn read_secret_file(path: &Path, what: &str, command: &str) -> Result<String, String> {
    let read = xagent_client_runtime::secret_file::read_secret_file(path, MAX_SECRET_FILE_BYTES)
        .map_err(|e| format!("the {what} file {} {e}", path.display()))?;
    if read.shared {
        warn_shared(path, command);
    }
    Ok(read.value.expose().to_owned())
}

/// Warns (as `command`) when a file holding secrets is readable by other users.
pub(crate) fn warn_if_shared(path: &Path, command: &str) {
    if std::fs::metadata(path).is_ok_and(|m| readable_by_others(&m)) {
        warn_shared(path, command);
    }
}

fn warn_shared(path: &Path, command: &str) {
    eprintln!(
        "xagent-connector {command}: warning: {} is readable by other users; chmod 600 it",
        path.display()
    );
}

/// The system API key: `--api-key-file` first, else `XAGENT_CONNECTOR_API_KEY` / `--api-key`
/// (clap merges those two into `value`). Empty is refused.
pub(crate) fn api_key(
    file: Option<&Path>,
    value: Option<&str>,
    command: &str,
) -> Result<String, String> {
    let key = match file {
        Some(path) => read_secret_file(path, "API key", command)?,
        None => value.unwrap_or_default().trim().to_owned(),
    };
    if key.is_empty() {
        return Err(
            "the API key must not be empty: set XAGENT_CONNECTOR_API_KEY or pass --api-key-file"
                .into(),
        );
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_files_give_their_first_line_and_refuse_empty_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "  sk-123  \nsecond line\n").unwrap();
        assert_eq!(read_secret_file(&path, "API key", "t").unwrap(), "sk-123");
        assert_eq!(api_key(Some(&path), Some("ignored"), "t").unwrap(), "sk-123");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_secret_file(&path, "API key", "t").is_err());
        assert!(api_key(None, Some("  "), "t").is_err());
        assert_eq!(api_key(None, Some("k"), "t").unwrap(), "k");
        let err = read_secret_file(&dir.path().join("missing"), "broker password", "t");
        assert!(err.unwrap_err().contains("broker password"));
    }
}
