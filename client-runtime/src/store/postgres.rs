//! The PostgreSQL store (feature `postgres`): the same state as the SQLite store in tables of
//! one database that several xAgent processes share, every row under a scope (the Connector
//! Card id, so several Cards can share a database), written through the shared group commit of
//! `xagent-storage-postgres`. A batch written under the holder lease starts with the fence
//! check: `SELECT ... FOR SHARE` on the Card's lease row with the batch's holder and fencing
//! number. No row: the batch is refused; a row: it stays locked until the batch commits, so a
//! takeover (an `UPDATE` of that row) waits for it and a stale holder's batch can never land
//! after the takeover.

use std::sync::Arc;

use async_trait::async_trait;
use xagent_profile_im::{CompletedRecord, Fingerprint, PendingRecord, StoreError};
use xagent_protocol_types::{ConnectorChannelId, ConnectorId, MessageId};
use xagent_storage_postgres::deadpool_postgres::Transaction;
use xagent_storage_postgres::tokio_postgres::Row;
use xagent_storage_postgres::{
    ApplyWrites, DatabaseUrl, GroupCommit, GroupCommitConfig, PgError, Pool, PoolOptions,
};

use super::{
    AdmissionSnapshot, CommitError, CommitTicket, Fence, LeaseRequest, LeaseState, META_ADMISSION,
    RememberedChannel, Submitted, XagentStore, XagentWrite, check_rename, rename_onto_messages,
    renewed_lease, taken_lease, to_i64, to_u64,
};

mod schema;
mod writes;
use schema::MIGRATIONS;
use writes::{idempotency, outbox};

/// The component name of this backend's schema in `xagent_schema`.
pub const POSTGRES_COMPONENT: &str = "client-runtime";

/// The `xagent_client_meta` key of the last accepted `connector_id`.
const META_CONNECTOR_ID: &str = "connector_id";

/// The context of a fence refusal inside the group commit (told apart from other failures).
const FENCED: &str = "the holder lease fence";

/// One item of a submission: the fence check first (when under a lease), then the writes.
#[derive(Debug)]
enum Item {
    Fence(Fence),
    Write(XagentWrite),
}

/// The PostgreSQL store. Clones share the pool and the writer.
#[derive(Clone)]
pub struct PostgresXagentStore {
    pool: Pool,
    scope: Arc<str>,
    writer: Arc<GroupCommit<Item>>,
}

impl std::fmt::Debug for PostgresXagentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresXagentStore")
            .field("database", self.pool.url())
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

fn store_error(operation: &'static str) -> impl Fn(PgError) -> StoreError {
    move |e| StoreError::from_source(operation, e)
}

impl PostgresXagentStore {
    /// Connects to `url`, applies this backend's migrations (refusing a database whose
    /// schema is newer than this binary knows) and opens the store of `scope`: the Connector
    /// Card id whose state it holds (every process of one Card uses the same scope).
    pub async fn connect(url: &DatabaseUrl, scope: &str) -> Result<Self, StoreError> {
        let options = PoolOptions::default().with_application_name("xagent-client-runtime");
        let pool = xagent_storage_postgres::connect(url, options)
            .await
            .map_err(store_error("connect to PostgreSQL"))?;
        Self::open(pool, scope).await
    }

    /// Opens the store of `scope` over an existing pool (its migrations applied first).
    pub async fn open(pool: Pool, scope: &str) -> Result<Self, StoreError> {
        xagent_storage_postgres::migrate(&pool, POSTGRES_COMPONENT, MIGRATIONS)
            .await
            .map_err(store_error("migrate the client-runtime schema"))?;
        let scope: Arc<str> = Arc::from(scope);
        let apply = Apply { scope: Arc::clone(&scope) };
        let writer = GroupCommit::start(pool.clone(), apply, GroupCommitConfig::default());
        Ok(Self { pool, scope, writer: Arc::new(writer) })
    }

    /// The scope (Connector Card id) this store holds.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    async fn client(
        &self,
        operation: &'static str,
    ) -> Result<xagent_storage_postgres::deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(store_error(operation))
    }

    async fn query(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn xagent_storage_postgres::tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let client = self.client(operation).await?;
        client
            .query(sql, params)
            .await
            .map_err(|e| StoreError::from_source(operation, self.pool.error(operation, &e)))
    }

    /// This scope's value of a meta `key`, if any.
    async fn meta(&self, operation: &'static str, key: &str) -> Result<Option<String>, StoreError> {
        let scope: &str = &self.scope;
        let sql = "SELECT value FROM xagent_client_meta WHERE scope = $1 AND key = $2";
        let rows = self.query(operation, sql, &[&scope, &key]).await?;
        Ok(rows.first().map(|row| row.get::<_, String>(0)))
    }

    /// One lease statement and the row after it, in one transaction (the row is locked
    /// by the statement, so the answer is what the statement left).
    async fn lease_statement(
        &self,
        operation: &'static str,
        sql: &str,
        params: &[&(dyn xagent_storage_postgres::tokio_postgres::types::ToSql + Sync)],
        card: &str,
    ) -> Result<Option<(String, u64, u64)>, StoreError> {
        let mut client = self.client(operation).await?;
        let pg = |e: &xagent_storage_postgres::tokio_postgres::Error| {
            StoreError::from_source(operation, self.pool.error(operation, e))
        };
        let tx = client.transaction().await.map_err(|e| pg(&e))?;
        tx.execute(sql, params).await.map_err(|e| pg(&e))?;
        let row = tx
            .query_opt(
                "SELECT holder, fencing, expires_at FROM xagent_client_lease WHERE card = $1",
                &[&card],
            )
            .await
            .map_err(|e| pg(&e))?;
        tx.commit().await.map_err(|e| pg(&e))?;
        Ok(row.map(|row| {
            (row.get::<_, String>(0), to_u64(row.get::<_, i64>(1)), to_u64(row.get::<_, i64>(2)))
        }))
    }
}

/// The writer's SQL.
struct Apply {
    scope: Arc<str>,
}

fn sql_error(context: &str, e: &xagent_storage_postgres::tokio_postgres::Error) -> PgError {
    PgError::from_driver(context.to_owned(), e)
}

#[async_trait]
impl ApplyWrites<Item> for Apply {
    async fn apply(&self, tx: &Transaction<'_>, items: &[Item]) -> Result<(), PgError> {
        let scope: &str = &self.scope;
        for item in items {
            match item {
                Item::Fence(fence) => {
                    let held = tx
                        .query_opt(
                            "SELECT 1 FROM xagent_client_lease
                             WHERE card = $1 AND holder = $2 AND fencing = $3 FOR SHARE",
                            &[&fence.card.as_str(), &fence.holder, &to_i64(fence.number)],
                        )
                        .await
                        .map_err(|e| sql_error("check the holder lease", &e))?;
                    if held.is_none() {
                        return Err(PgError::apply(FENCED, format!("{}", fence.number)));
                    }
                }
                Item::Write(write) => apply_write(tx, scope, write).await?,
            }
        }
        Ok(())
    }
}

async fn exec(
    tx: &Transaction<'_>,
    context: &str,
    sql: &str,
    params: &[&(dyn xagent_storage_postgres::tokio_postgres::types::ToSql + Sync)],
) -> Result<u64, PgError> {
    tx.execute(sql, params).await.map_err(|e| sql_error(context, &e))
}

async fn apply_write(
    tx: &Transaction<'_>,
    scope: &str,
    write: &XagentWrite,
) -> Result<(), PgError> {
    match write {
        XagentWrite::SaveChannel { channel, owner } => {
            exec(
                tx,
                "save_channel",
                "INSERT INTO xagent_client_channels (scope, id, owner) VALUES ($1, $2, $3)
                 ON CONFLICT (scope, id) DO UPDATE
                   SET owner = COALESCE(excluded.owner, xagent_client_channels.owner)",
                &[&scope, &channel.as_str(), owner],
            )
            .await?;
        }
        XagentWrite::DeleteChannel(channel) => {
            exec(
                tx,
                "delete_channel",
                "DELETE FROM xagent_client_channels WHERE scope = $1 AND id = $2",
                &[&scope, &channel.as_str()],
            )
            .await?;
        }
        XagentWrite::RenameChannel { from, to } => rename(tx, scope, from, to).await?,
        XagentWrite::ConnectorId(id) => {
            save_meta(tx, scope, "save_connector_id", META_CONNECTOR_ID, id.as_str()).await?;
        }
        XagentWrite::Admission(snapshot) => {
            let value =
                snapshot.encode().map_err(|e| PgError::apply("save_admission", e.to_string()))?;
            save_meta(tx, scope, "save_admission", META_ADMISSION, &value).await?;
        }
        XagentWrite::Outbox(write) => outbox(tx, scope, write).await?,
        XagentWrite::Idempotency(write) => idempotency(tx, scope, write).await?,
    }
    Ok(())
}

/// Sets this scope's meta `key` to `value`.
async fn save_meta(
    tx: &Transaction<'_>,
    scope: &str,
    operation: &'static str,
    key: &str,
    value: &str,
) -> Result<(), PgError> {
    let sql = "INSERT INTO xagent_client_meta (scope, key, value) VALUES ($1, $2, $3)
               ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value";
    exec(tx, operation, sql, &[&scope, &key, &value]).await.map(drop)
}

/// The channel row, its pending messages and its completed ids move together (the
/// submission's savepoint undoes all of it on a refusal).
async fn rename(
    tx: &Transaction<'_>,
    scope: &str,
    from: &ConnectorChannelId,
    to: &ConnectorChannelId,
) -> Result<(), PgError> {
    let refused = |e: StoreError| PgError::apply("rename_channel", e.to_string());
    let known = |id: &ConnectorChannelId| {
        let id = id.as_str().to_owned();
        async move {
            tx.query_opt(
                "SELECT 1 FROM xagent_client_channels WHERE scope = $1 AND id = $2 FOR UPDATE",
                &[&scope, &id],
            )
            .await
            .map(|row| row.is_some())
            .map_err(|e| sql_error("rename_channel", &e))
        }
    };
    let (from_known, to_known) = (known(from).await?, known(to).await?);
    check_rename(from, to, from_known, to_known).map_err(refused)?;
    if from == to {
        return Ok(());
    }
    let taken = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM xagent_client_pending WHERE scope = $1 AND channel = $2)
             OR EXISTS (SELECT 1 FROM xagent_client_completed WHERE scope = $1 AND channel = $2)",
            &[&scope, &to.as_str()],
        )
        .await
        .map_err(|e| sql_error("rename_channel", &e))?
        .get::<_, bool>(0);
    if taken {
        return Err(refused(rename_onto_messages(to)));
    }
    let ids: [&(dyn xagent_storage_postgres::tokio_postgres::types::ToSql + Sync); 3] =
        [&scope, &to.as_str(), &from.as_str()];
    exec(
        tx,
        "rename_channel",
        "UPDATE xagent_client_channels SET id = $2 WHERE scope = $1 AND id = $3",
        &ids,
    )
    .await?;
    exec(
        tx,
        "rename_channel",
        "UPDATE xagent_client_pending SET channel = $2 WHERE scope = $1 AND channel = $3",
        &ids,
    )
    .await?;
    exec(
        tx,
        "rename_channel",
        "UPDATE xagent_client_completed SET channel = $2 WHERE scope = $1 AND channel = $3",
        &ids,
    )
    .await?;
    Ok(())
}

fn pending_of(row: &Row) -> PendingRecord {
    PendingRecord {
        channel: ConnectorChannelId::new(row.get::<_, String>(0)),
        message_id: MessageId::new(row.get::<_, String>(1)),
        seq: to_u64(row.get(2)),
        payload: row.get(3),
        attempts: u32::try_from(row.get::<_, i64>(4)).unwrap_or(u32::MAX),
        first_responsibility_at: to_u64(row.get(5)),
        expires_at: to_u64(row.get(6)),
        next_attempt_at: to_u64(row.get(7)),
        last_error: row.get(8),
    }
}

/// Turns the writer's answer into the ticket's: a fence refusal is [`CommitError::Fenced`].
fn commit_result(fence: Option<&Fence>, result: Result<(), PgError>) -> Result<(), CommitError> {
    match (result, fence) {
        (Ok(()), _) => Ok(()),
        (Err(PgError::Apply { context, .. }), Some(fence)) if context == FENCED => {
            Err(CommitError::fenced(fence))
        }
        (Err(error), _) => Err(StoreError::from_source("commit", error).into()),
    }
}

#[async_trait]
impl XagentStore for PostgresXagentStore {
    async fn load_channels(&self) -> Result<Vec<RememberedChannel>, StoreError> {
        let scope: &str = &self.scope;
        let rows = self
            .query(
                "load_channels",
                "SELECT id, owner FROM xagent_client_channels WHERE scope = $1 ORDER BY position",
                &[&scope],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| RememberedChannel {
                channel: ConnectorChannelId::new(row.get::<_, String>(0)),
                owner: row.get(1),
            })
            .collect())
    }

    async fn load_connector_id(&self) -> Result<Option<ConnectorId>, StoreError> {
        Ok(self.meta("load_connector_id", META_CONNECTOR_ID).await?.map(ConnectorId::new))
    }

    async fn load_admission(&self) -> Result<Option<AdmissionSnapshot>, StoreError> {
        let value = self.meta("load_admission", META_ADMISSION).await?;
        value.as_deref().map(AdmissionSnapshot::decode).transpose()
    }

    async fn load_pending(&self) -> Result<Vec<PendingRecord>, StoreError> {
        let scope: &str = &self.scope;
        let rows = self
            .query(
                "load_pending",
                "SELECT channel, message_id, seq, payload, attempts, first_responsibility_at,
                   expires_at, next_attempt_at, last_error
                 FROM xagent_client_pending WHERE scope = $1",
                &[&scope],
            )
            .await?;
        Ok(rows.iter().map(pending_of).collect())
    }

    async fn lookup_completed(
        &self,
        channel: &ConnectorChannelId,
        message_id: &MessageId,
    ) -> Result<Option<CompletedRecord>, StoreError> {
        let scope: &str = &self.scope;
        let rows = self
            .query(
                "lookup_completed",
                "SELECT fingerprint, completed_at FROM xagent_client_completed
                 WHERE scope = $1 AND channel = $2 AND message_id = $3",
                &[&scope, &channel.as_str(), &message_id.as_str()],
            )
            .await?;
        Ok(rows.first().map(|row| CompletedRecord {
            channel: channel.clone(),
            message_id: message_id.clone(),
            fingerprint: Fingerprint::from_hex(row.get::<_, String>(0)),
            completed_at: to_u64(row.get(1)),
        }))
    }

    fn commit(&self, fence: Option<Fence>, writes: Vec<XagentWrite>) -> CommitTicket {
        let mut items: Vec<Item> = Vec::with_capacity(writes.len() + 1);
        items.extend(fence.clone().map(Item::Fence));
        items.extend(writes.into_iter().map(Item::Write));
        let (answer, ticket) = Submitted::pair();
        self.writer.submit_with(items, move |result| {
            answer.answer(commit_result(fence.as_ref(), result));
        });
        ticket
    }

    async fn acquire_lease(&self, request: &LeaseRequest) -> Result<LeaseState, StoreError> {
        let card = request.card.as_str();
        let row = self
            .lease_statement(
                "acquire_lease",
                "INSERT INTO xagent_client_lease (card, holder, fencing, expires_at)
                 VALUES ($1, $2, 1, $3)
                 ON CONFLICT (card) DO UPDATE SET holder = excluded.holder,
                   fencing = xagent_client_lease.fencing + 1, expires_at = excluded.expires_at
                 WHERE xagent_client_lease.expires_at <= $4 OR xagent_client_lease.holder = $2",
                &[&card, &request.holder, &to_i64(request.expires_at()), &to_i64(request.now)],
                card,
            )
            .await?;
        taken_lease(request, row)
    }

    async fn renew_lease(
        &self,
        fence: &Fence,
        now: u64,
        ttl_ms: u64,
    ) -> Result<LeaseState, StoreError> {
        let card = fence.card.as_str();
        let row = self
            .lease_statement(
                "renew_lease",
                "UPDATE xagent_client_lease SET expires_at = $4
                 WHERE card = $1 AND holder = $2 AND fencing = $3",
                &[&card, &fence.holder, &to_i64(fence.number), &to_i64(now.saturating_add(ttl_ms))],
                card,
            )
            .await?;
        Ok(renewed_lease(fence, row))
    }

    async fn release_lease(&self, fence: &Fence) -> Result<(), StoreError> {
        self.query(
            "release_lease",
            "UPDATE xagent_client_lease SET expires_at = 0
             WHERE card = $1 AND holder = $2 AND fencing = $3 RETURNING 1",
            &[&fence.card.as_str(), &fence.holder, &to_i64(fence.number)],
        )
        .await
        .map(|_| ())
    }
}
