//! The rules and plain types of author records (limits, the record check both backends run,
//! scans and scanned records), below the storage backends and the author store that use them.

use serde::de::DeserializeOwned;

use crate::storage::StorageError;

/// Longest author record key, in bytes.
pub const MAX_AUTHOR_KEY_BYTES: usize = 512;
/// Largest author record value, in bytes (1 MiB).
pub const MAX_AUTHOR_VALUE_BYTES: usize = 1 << 20;
/// Longest namespace, in bytes.
pub const MAX_AUTHOR_NAMESPACE_BYTES: usize = 64;
/// Most records one scan returns (page on with [`AuthorScan::after`]).
pub const MAX_AUTHOR_SCAN_LIMIT: usize = 1_000;

/// A refused author store request, or the storage failure behind one.
#[derive(Debug, thiserror::Error)]
pub enum AuthorStoreError {
    /// The namespace is empty, too long, or holds other than `a-z`, `0-9`, `.`, `_`, `-`.
    #[error(
        "the author namespace {0:?} is not valid: use 1 to {MAX_AUTHOR_NAMESPACE_BYTES} bytes of \
         a-z, 0-9, '.', '_' or '-', starting with a letter"
    )]
    Namespace(String),
    /// The key is longer than [`MAX_AUTHOR_KEY_BYTES`].
    #[error(
        "an author key of {0} bytes is too long (at most {MAX_AUTHOR_KEY_BYTES}): use a shorter key"
    )]
    KeyTooLong(usize),
    /// The key holds a NUL character (no backend stores one in a key).
    #[error("an author key holds a NUL character: remove it")]
    KeyHasNul,
    /// The value is larger than [`MAX_AUTHOR_VALUE_BYTES`].
    #[error(
        "an author value of {0} bytes is too large (at most {MAX_AUTHOR_VALUE_BYTES}): split it \
         into several records"
    )]
    ValueTooLarge(usize),
    /// A scan asked for more than [`MAX_AUTHOR_SCAN_LIMIT`] records.
    #[error(
        "a scan of {0} records is too large (at most {MAX_AUTHOR_SCAN_LIMIT}): page with `after`"
    )]
    ScanTooLarge(usize),
    /// A broadcast's topic or message is too long.
    #[error(
        "an author broadcast's {what} is {size} bytes (at most {limit}): send a pointer to durable state"
    )]
    BroadcastTooLarge {
        /// `topic` or `message`.
        what: &'static str,
        /// Its size in bytes.
        size: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A value could not be encoded or decoded as JSON.
    #[error("an author value is not the JSON expected: {0}")]
    Json(#[from] serde_json::Error),
    /// The storage failed (the write did not happen, or the read saw nothing).
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The rules of one author record (one home for both backends: [`WriteOp::check`] calls it):
/// the namespace's form, the key's length and the value's size when one is written.
pub(crate) fn check_record(
    namespace: &str,
    key: &str,
    value_len: Option<usize>,
) -> Result<(), AuthorStoreError> {
    let valid_namespace = namespace.len() <= MAX_AUTHOR_NAMESPACE_BYTES
        && namespace.starts_with(|c: char| c.is_ascii_lowercase())
        && namespace.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-')
        });
    if !valid_namespace {
        return Err(AuthorStoreError::Namespace(namespace.chars().take(80).collect()));
    }
    if key.len() > MAX_AUTHOR_KEY_BYTES {
        return Err(AuthorStoreError::KeyTooLong(key.len()));
    }
    if key.contains('\0') {
        return Err(AuthorStoreError::KeyHasNul);
    }
    match value_len {
        Some(len) if len > MAX_AUTHOR_VALUE_BYTES => Err(AuthorStoreError::ValueTooLarge(len)),
        _ => Ok(()),
    }
}

/// Which records a scan returns: keys of one namespace starting with `prefix`, in byte order
/// (or reversed), after the key `after` in that order, at most `limit` of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorScan {
    /// Keys start with this (empty: every key of the namespace).
    pub prefix: String,
    /// Only keys after this one in the scan's order (the last key of the previous page).
    pub after: Option<String>,
    /// Most records returned (at most [`MAX_AUTHOR_SCAN_LIMIT`]).
    pub limit: usize,
    /// Newest (greatest) key first.
    pub reverse: bool,
}

impl AuthorScan {
    /// The first `limit` keys starting with `prefix`, ascending.
    pub fn prefix(prefix: impl Into<String>, limit: usize) -> Self {
        Self { prefix: prefix.into(), after: None, limit, reverse: false }
    }

    /// The next page: keys after `key` in this scan's order.
    pub fn after(mut self, key: impl Into<String>) -> Self {
        self.after = Some(key.into());
        self
    }

    /// Greatest key first.
    pub fn reversed(mut self) -> Self {
        self.reverse = true;
        self
    }

    /// Checks the namespace, the prefix and the limit.
    pub(crate) fn check(&self, namespace: &str) -> Result<(), AuthorStoreError> {
        check_record(namespace, &self.prefix, None)?;
        if let Some(after) = &self.after {
            check_record(namespace, after, None)?;
        }
        if self.limit > MAX_AUTHOR_SCAN_LIMIT {
            return Err(AuthorStoreError::ScanTooLarge(self.limit));
        }
        Ok(())
    }
}

/// One record a scan returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthorRecord {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
}

impl AuthorRecord {
    /// The value decoded from JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, AuthorStoreError> {
        Ok(serde_json::from_slice(&self.value)?)
    }
}
