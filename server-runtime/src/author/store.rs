//! The author store: a Connector's own durable records (rooms, visitors, messages, ...) kept
//! in the runtime's storage, so they ride its group commit and, on PostgreSQL, every replica
//! sees them.
//!
//! Records are namespaced key/value pairs: a namespace is a short name the author chooses
//! (`webchat.messages`), a key is UTF-8 text compared as bytes (so a scan is in byte order on
//! every backend), a value is bytes (or JSON text through the `_json` helpers). Writes are
//! [`AuthorWrite`]s, checked when built and committed through [`crate::Storage::commit`]; on a
//! Tool call, [`crate::ToolContext::stage`] adds them to the transaction of the call's
//! tool-call record instead, so the ack, the record and the writes are one commit.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::storage::{Storage, StorageError, WriteOp};

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

/// One checked author write: build it with [`AuthorWrite::put`], [`AuthorWrite::put_json`],
/// [`AuthorWrite::delete`] or [`AuthorWrite::delete_prefix`].
#[derive(Clone, Debug, PartialEq)]
pub struct AuthorWrite(WriteOp);

impl AuthorWrite {
    /// Inserts or replaces the record `(namespace, key)`.
    pub fn put(
        namespace: &str,
        key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<Self, AuthorStoreError> {
        let value = value.into();
        check_record(namespace, key, Some(value.len()))?;
        Ok(Self(WriteOp::AuthorPut { namespace: namespace.into(), key: key.into(), value }))
    }

    /// [`AuthorWrite::put`] of a value as its JSON text.
    pub fn put_json(
        namespace: &str,
        key: &str,
        value: &impl Serialize,
    ) -> Result<Self, AuthorStoreError> {
        Self::put(namespace, key, serde_json::to_vec(value)?)
    }

    /// Deletes the record `(namespace, key)`, if present.
    pub fn delete(namespace: &str, key: &str) -> Result<Self, AuthorStoreError> {
        check_record(namespace, key, None)?;
        Ok(Self(WriteOp::AuthorDelete { namespace: namespace.into(), key: key.into() }))
    }

    /// Deletes every record of `namespace` whose key starts with `prefix`.
    pub fn delete_prefix(namespace: &str, prefix: &str) -> Result<Self, AuthorStoreError> {
        check_record(namespace, prefix, None)?;
        Ok(Self(WriteOp::AuthorDeletePrefix { namespace: namespace.into(), prefix: prefix.into() }))
    }

    /// The storage write it stands for.
    pub fn into_write_op(self) -> WriteOp {
        self.0
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

/// The author's handle on its records in the runtime's storage (from
/// [`crate::ConnectorHandle::author_store`]). Cheap to clone.
#[derive(Clone)]
pub struct AuthorStore {
    storage: Arc<dyn Storage>,
}

impl std::fmt::Debug for AuthorStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorStore").finish_non_exhaustive()
    }
}

impl AuthorStore {
    /// The author store over `storage` (the runtime's own; tests may pass any backend).
    pub fn new(storage: Arc<dyn Storage>) -> Self {
        Self { storage }
    }

    /// The value of `(namespace, key)`, if stored.
    pub async fn get(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, AuthorStoreError> {
        check_record(namespace, key, None)?;
        Ok(self.storage.author_get(namespace, key).await?)
    }

    /// [`AuthorStore::get`] decoded from JSON.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<T>, AuthorStoreError> {
        match self.get(namespace, key).await? {
            Some(value) => Ok(Some(serde_json::from_slice(&value)?)),
            None => Ok(None),
        }
    }

    /// The records `scan` selects, in its order.
    pub async fn scan(
        &self,
        namespace: &str,
        scan: &AuthorScan,
    ) -> Result<Vec<AuthorRecord>, AuthorStoreError> {
        scan.check(namespace)?;
        if scan.limit == 0 {
            return Ok(Vec::new());
        }
        Ok(self.storage.author_scan(namespace, scan).await?)
    }

    /// How many records of `namespace` have a key starting with `prefix`.
    pub async fn count(&self, namespace: &str, prefix: &str) -> Result<u64, AuthorStoreError> {
        check_record(namespace, prefix, None)?;
        Ok(self.storage.author_count(namespace, prefix).await?)
    }

    /// Commits `writes` as one transaction (group commit: shared with other writers'), in
    /// order; returns once it committed. On an error none of them happened.
    pub async fn commit(&self, writes: Vec<AuthorWrite>) -> Result<(), AuthorStoreError> {
        let ops = writes.into_iter().map(AuthorWrite::into_write_op).collect();
        Ok(self.storage.commit(ops).committed().await?)
    }

    /// Commits one [`AuthorWrite::put`].
    pub async fn put(
        &self,
        namespace: &str,
        key: &str,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), AuthorStoreError> {
        self.commit(vec![AuthorWrite::put(namespace, key, value)?]).await
    }

    /// Commits one [`AuthorWrite::delete`].
    pub async fn delete(&self, namespace: &str, key: &str) -> Result<(), AuthorStoreError> {
        self.commit(vec![AuthorWrite::delete(namespace, key)?]).await
    }

    /// Commits one [`AuthorWrite::delete_prefix`].
    pub async fn delete_prefix(
        &self,
        namespace: &str,
        prefix: &str,
    ) -> Result<(), AuthorStoreError> {
        self.commit(vec![AuthorWrite::delete_prefix(namespace, prefix)?]).await
    }
}

/// A function run once the writes it follows committed.
pub(crate) type AfterCommit = Box<dyn FnOnce() + Send>;

/// Writes staged by a Tool call, committed with its tool-call record (see
/// [`crate::ToolContext::stage`]), and what to run once they committed.
#[derive(Clone, Default)]
pub(crate) struct Staged(Arc<Mutex<StagedInner>>);

#[derive(Default)]
struct StagedInner {
    writes: Vec<WriteOp>,
    after: Vec<AfterCommit>,
}

impl Staged {
    fn lock(&self) -> std::sync::MutexGuard<'_, StagedInner> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn push(&self, write: AuthorWrite) {
        self.lock().writes.push(write.into_write_op());
    }

    pub(crate) fn after_commit(&self, run: AfterCommit) {
        self.lock().after.push(run);
    }

    /// Takes what was staged (the writes, and what to run once they committed).
    pub(crate) fn take(&self) -> (Vec<WriteOp>, Vec<AfterCommit>) {
        let mut inner = self.lock();
        (std::mem::take(&mut inner.writes), std::mem::take(&mut inner.after))
    }
}

impl std::fmt::Debug for Staged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Staged").field("writes", &self.lock().writes.len()).finish()
    }
}

#[cfg(test)]
mod tests;
