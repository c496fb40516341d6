//! [`Storage`] over [`PostgresStorage`]'s own methods.

use super::*;

#[async_trait::async_trait]
impl Storage for PostgresStorage {
    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StorageError> {
        PostgresStorage::load_connector_id(self).await
    }

    async fn load_channels(&self) -> Result<Vec<ChannelRecord>, StorageError> {
        PostgresStorage::load_channels(self).await
    }

    async fn load_channel(
        &self,
        id: &ConnectorChannelId,
    ) -> Result<Option<ChannelRecord>, StorageError> {
        PostgresStorage::load_channel(self, id).await
    }

    async fn load_tool_call(
        &self,
        channel: &ConnectorChannelId,
        key: &str,
    ) -> Result<Option<ToolCallRecord>, StorageError> {
        PostgresStorage::load_tool_call(self, channel, key).await
    }

    async fn load_meta(&self, key: &str) -> Result<Option<String>, StorageError> {
        PostgresStorage::load_meta(self, key).await
    }

    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StorageError> {
        PostgresStorage::load_pending(self).await
    }

    async fn load_pending_of(
        &self,
        channel: &ConnectorChannelId,
    ) -> Result<Vec<PendingRecord>, StorageError> {
        PostgresStorage::load_pending_of(self, channel).await
    }

    async fn load_pending_ids(
        &self,
        channel: &ConnectorChannelId,
        ids: &[MessageId],
    ) -> Result<Vec<PendingRecord>, StorageError> {
        PostgresStorage::load_pending_ids(self, channel, ids).await
    }

    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StorageError> {
        PostgresStorage::lookup_completed(self, channel, message_id).await
    }

    async fn prune_tool_calls(&self, before: u64) -> Result<usize, StorageError> {
        PostgresStorage::prune_tool_calls(self, before).await
    }

    async fn author_get(
        &self,
        namespace: &str,
        key: &str,
    ) -> Result<Option<Vec<u8>>, StorageError> {
        PostgresStorage::author_get(self, namespace, key).await
    }

    async fn author_get_many(
        &self,
        namespace: &str,
        keys: &[String],
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        PostgresStorage::author_get_many(self, namespace, keys).await
    }

    async fn author_scan(
        &self,
        namespace: &str,
        scan: &crate::AuthorScan,
    ) -> Result<Vec<crate::AuthorRecord>, StorageError> {
        PostgresStorage::author_scan(self, namespace, scan).await
    }

    async fn author_count(&self, namespace: &str, prefix: &str) -> Result<u64, StorageError> {
        PostgresStorage::author_count(self, namespace, prefix).await
    }

    fn commit(&self, writes: Vec<WriteOp>) -> CommitTicket {
        PostgresStorage::commit(self, writes)
    }

    fn cluster(&self) -> Option<Arc<dyn crate::storage::Cluster>> {
        Some(Arc::clone(&self.cluster) as Arc<dyn crate::storage::Cluster>)
    }

    async fn ping(&self) -> Result<(), StorageError> {
        self.cluster.ping_pool().await
    }
}
