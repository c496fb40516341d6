//! The xAgent side's PostgreSQL schema: one migration per version (never edited once
//! released), component [`super::POSTGRES_COMPONENT`]; tables carry the `xagent_client_` prefix.

use xagent_storage_postgres::Migration;

/// The schema, one migration per version (never edited once released).
pub(super) const MIGRATIONS: &[Migration] = &[Migration::new(
    1,
    "CREATE TABLE xagent_client_channels (
       scope TEXT NOT NULL, id TEXT NOT NULL, owner TEXT,
       position BIGINT GENERATED ALWAYS AS IDENTITY,
       PRIMARY KEY (scope, id));
     CREATE TABLE xagent_client_meta (
       scope TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
       PRIMARY KEY (scope, key));
     CREATE TABLE xagent_client_pending (
       scope TEXT NOT NULL, channel TEXT NOT NULL, message_id TEXT NOT NULL,
       seq BIGINT NOT NULL, payload TEXT NOT NULL, attempts BIGINT NOT NULL,
       first_responsibility_at BIGINT NOT NULL, expires_at BIGINT NOT NULL,
       next_attempt_at BIGINT NOT NULL, last_error TEXT,
       PRIMARY KEY (scope, channel, message_id));
     CREATE TABLE xagent_client_completed (
       scope TEXT NOT NULL, channel TEXT NOT NULL, message_id TEXT NOT NULL,
       fingerprint TEXT NOT NULL, completed_at BIGINT NOT NULL,
       PRIMARY KEY (scope, channel, message_id));
     CREATE INDEX xagent_client_completed_age ON xagent_client_completed (scope, completed_at);
     CREATE INDEX xagent_client_completed_channel_age
       ON xagent_client_completed (scope, channel, completed_at);
     CREATE TABLE xagent_client_lease (
       card TEXT PRIMARY KEY, holder TEXT NOT NULL, fencing BIGINT NOT NULL,
       expires_at BIGINT NOT NULL);",
)];
