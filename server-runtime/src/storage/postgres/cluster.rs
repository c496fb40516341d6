//! [`Cluster`] on PostgreSQL: leases are rows of `server_leases` changed by single statements
//! (the fencing number rises with every take-over), wake-ups are `NOTIFY xagent_server`
//! payloads, heard by one `xagent-storage-postgres` [`Listener`] per process (every
//! resubscription is announced as [`ClusterEvent::Resync`], since what was sent meanwhile is
//! lost).

use std::time::Duration;

use tokio::sync::broadcast;
use xagent_storage_postgres::{DatabaseUrl, ListenEvent, Listener, Pool, PoolOptions};

use super::super::cluster::{Cluster, ClusterEvent, DATA_PLANE_LEASE, LeaseState, Notice};
use super::super::write_op::{to_i64, to_u64};
use super::schema::NOTIFY_CHANNEL;
use super::{StorageError, get};

/// How long a health check may take before the replica counts as unable to reach its
/// database.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// Events buffered per subscriber before the slowest one lags (and resyncs).
const EVENT_BUFFER: usize = 4_096;

pub(crate) struct PgCluster {
    pool: Pool,
    replica: String,
    events: broadcast::Sender<ClusterEvent>,
    /// Hears the other replicas while this lives.
    _listener: Listener,
}

impl PgCluster {
    /// Names this replica and starts its listener (inside a tokio runtime).
    pub(crate) fn start(
        pool: Pool,
        url: DatabaseUrl,
        options: PoolOptions,
    ) -> Result<Self, StorageError> {
        let replica = format!("replica-{:016x}", rand::random::<u64>());
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let (sender, me) = (events.clone(), replica.clone());
        let listener = Listener::start(url, options, NOTIFY_CHANNEL, move |event| {
            let event = match event {
                ListenEvent::Notification(payload) => Notice::read(payload, &me),
                _ => Some(ClusterEvent::Resync),
            };
            if let Some(event) = event {
                let _ = sender.send(event);
            }
        })
        .map_err(|e| StorageError::new("listen for the other replicas", e))?;
        Ok(Self { pool, replica, events, _listener: listener })
    }

    fn error(&self, operation: &'static str, e: &tokio_postgres::Error) -> StorageError {
        StorageError::new(operation, self.pool.error(operation, e))
    }

    /// `SELECT 1` through the pool within [`PING_TIMEOUT`].
    pub(crate) async fn ping_pool(&self) -> Result<(), StorageError> {
        const OP: &str = "reach the database";
        let check = async {
            let client = self.pool.get().await.map_err(|e| StorageError::new(OP, e))?;
            client.simple_query("SELECT 1").await.map_err(|e| self.error(OP, &e))?;
            Ok(())
        };
        match tokio::time::timeout(PING_TIMEOUT, check).await {
            Ok(outcome) => outcome,
            Err(_) => {
                Err(StorageError::new(OP, format!("no answer within {} s", PING_TIMEOUT.as_secs())))
            }
        }
    }
}

const ACQUIRE: &str = "INSERT INTO server_leases (name, holder, fence, expires_at)
 VALUES ($1, $2, 1, $3)
 ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, fence = server_leases.fence + 1,
   expires_at = EXCLUDED.expires_at, released_at = NULL
 WHERE $4 OR server_leases.holder IS NULL OR server_leases.expires_at <= $5
   OR server_leases.holder = EXCLUDED.holder
 RETURNING fence";

#[async_trait::async_trait]
impl Cluster for PgCluster {
    fn replica(&self) -> &str {
        &self.replica
    }

    fn subscribe(&self) -> broadcast::Receiver<ClusterEvent> {
        self.events.subscribe()
    }

    async fn acquire(
        &self,
        name: &str,
        force: bool,
        now: u64,
        valid_for_ms: u64,
    ) -> Result<Option<u64>, StorageError> {
        const OP: &str = "take a lease";
        let mut client = self.pool.get().await.map_err(|e| StorageError::new(OP, e))?;
        let tx = client.transaction().await.map_err(|e| self.error(OP, &e))?;
        let expires = to_i64(now.saturating_add(valid_for_ms));
        let row = tx
            .query_opt(ACQUIRE, &[&name, &self.replica, &expires, &force, &to_i64(now)])
            .await
            .map_err(|e| self.error(OP, &e))?;
        let Some(row) = row else { return Ok(None) };
        let fence = to_u64(get(&row, 0, OP)?);
        if name == DATA_PLANE_LEASE {
            // Heard by every replica when this commits: the previous holder stops at once.
            let notice = serde_json::json!({ "r": self.replica, "k": "lease", "f": fence });
            tx.execute("SELECT pg_notify($1, $2)", &[&NOTIFY_CHANNEL, &notice.to_string()])
                .await
                .map_err(|e| self.error(OP, &e))?;
        }
        tx.commit().await.map_err(|e| self.error(OP, &e))?;
        Ok(Some(fence))
    }

    async fn renew(
        &self,
        name: &str,
        fence: u64,
        now: u64,
        valid_for_ms: u64,
    ) -> Result<bool, StorageError> {
        const OP: &str = "renew a lease";
        let client = self.pool.get().await.map_err(|e| StorageError::new(OP, e))?;
        let expires = to_i64(now.saturating_add(valid_for_ms));
        let changed = client
            .execute(
                "UPDATE server_leases SET expires_at = $4
                 WHERE name = $1 AND fence = $2 AND holder = $3",
                &[&name, &to_i64(fence), &self.replica, &expires],
            )
            .await
            .map_err(|e| self.error(OP, &e))?;
        Ok(changed == 1)
    }

    async fn release(&self, name: &str, fence: u64, now: u64) -> Result<(), StorageError> {
        const OP: &str = "release a lease";
        let client = self.pool.get().await.map_err(|e| StorageError::new(OP, e))?;
        client
            .execute(
                "UPDATE server_leases SET holder = NULL, released_at = $4, expires_at = $4
                 WHERE name = $1 AND fence = $2 AND holder = $3",
                &[&name, &to_i64(fence), &self.replica, &to_i64(now)],
            )
            .await
            .map_err(|e| self.error(OP, &e))?;
        Ok(())
    }

    async fn lease(&self, name: &str) -> Result<LeaseState, StorageError> {
        const OP: &str = "read a lease";
        let client = self.pool.get().await.map_err(|e| StorageError::new(OP, e))?;
        let row = client
            .query_opt(
                "SELECT holder, fence, expires_at, released_at FROM server_leases WHERE name = $1",
                &[&name],
            )
            .await
            .map_err(|e| self.error(OP, &e))?;
        let Some(row) = row else {
            return Ok(LeaseState { holder: None, fence: 0, expires_at: 0, released_at: None });
        };
        Ok(LeaseState {
            holder: get(&row, 0, OP)?,
            fence: to_u64(get(&row, 1, OP)?),
            expires_at: to_u64(get(&row, 2, OP)?),
            released_at: get::<Option<i64>>(&row, 3, OP)?.map(to_u64),
        })
    }

    async fn claim_vacant(&self, name: &str, fence: u64, now: u64) -> Result<bool, StorageError> {
        const OP: &str = "claim a vacant lease";
        let client = self.pool.get().await.map_err(|e| StorageError::new(OP, e))?;
        let changed = client
            .execute(
                "UPDATE server_leases
                 SET fence = fence + 1, holder = NULL, released_at = NULL, expires_at = 0
                 WHERE name = $1 AND fence = $2 AND (holder IS NULL OR expires_at <= $3)",
                &[&name, &to_i64(fence), &to_i64(now)],
            )
            .await
            .map_err(|e| self.error(OP, &e))?;
        Ok(changed == 1)
    }

    async fn ping(&self) -> Result<(), StorageError> {
        self.ping_pool().await
    }
}
