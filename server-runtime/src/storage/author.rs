//! The author store: a Connector's own durable records (rooms, visitors, messages, ...) kept
//! in the runtime's storage, so they ride its group commit and, on PostgreSQL, every replica
//! sees them.
//!
//! Records are namespaced key/value pairs: a namespace is a short name the author chooses
//! (`webchat.messages`), a key is UTF-8 text compared as bytes (so a scan is in byte order on
//! every backend), a value is bytes (or JSON text through the `_json` helpers). Writes are
//! [`AuthorWrite`]s, checked when built and committed through [`crate::storage::Storage::commit`]; on a
//! Tool call, [`crate::ToolContext::stage`] adds them to the transaction of the call's
//! tool-call record instead, so the ack, the record and the writes are one commit.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::storage::{Storage, WriteOp};

use super::author_rules::check_record;
pub use super::author_rules::{
    AuthorRecord, AuthorScan, AuthorStoreError, MAX_AUTHOR_KEY_BYTES, MAX_AUTHOR_NAMESPACE_BYTES,
    MAX_AUTHOR_SCAN_LIMIT, MAX_AUTHOR_VALUE_BYTES,
};

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

    /// The values of several records of one namespace, in the order of `keys` (`None` for
    /// one not stored): one round trip on a networked backend instead of one per key.
    pub async fn get_many(
        &self,
        namespace: &str,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, AuthorStoreError> {
        for key in keys {
            check_record(namespace, key, None)?;
        }
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.storage.author_get_many(namespace, keys).await?)
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

    /// An author broadcast (see [`crate::ConnectorHandle::broadcast`]) as a write: committed
    /// with other writes (or staged on a Tool call), the other replicas hear it exactly when
    /// those writes are durable, and never when they are not. `None` on a storage only this
    /// process uses (nobody else to tell: show the change on this replica yourself).
    pub fn broadcast_write(
        &self,
        topic: &str,
        message: &str,
    ) -> Result<Option<AuthorWrite>, AuthorStoreError> {
        use super::{MAX_BROADCAST_MESSAGE_BYTES, MAX_BROADCAST_TOPIC_BYTES, Notice};
        for (what, text, limit) in [
            ("topic", topic, MAX_BROADCAST_TOPIC_BYTES),
            ("message", message, MAX_BROADCAST_MESSAGE_BYTES),
        ] {
            if text.len() > limit {
                return Err(AuthorStoreError::BroadcastTooLarge { what, size: text.len(), limit });
            }
        }
        Ok(self.storage.cluster().map(|cluster| {
            AuthorWrite(Notice::broadcast(cluster.replica(), topic, message).into_write())
        }))
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
