//! The PostgreSQL schema of the runtime's storage, as versioned migrations of the component
//! [`COMPONENT`]. Tables carry the `server_` prefix so the xAgent side's and the Transfer
//! Plane's tables can live in the same database.
//!
//! Columns mirror the SQLite tables one for one; times and counters are `BIGINT` (a `u64` past
//! `i64::MAX` is stored as `i64::MAX`, as on SQLite). Two columns hold free text written by a
//! Connector author or a remote peer (`error_message`, `last_error`); they are `BYTEA` (UTF-8
//! bytes) because PostgreSQL's `TEXT` refuses a NUL character that SQLite stores, and both
//! backends must take the same values.

use xagent_storage_postgres::Migration;

/// The component name of the runtime's tables in `xagent_schema`.
pub(crate) const COMPONENT: &str = "server-runtime";

/// The notification channel every replica of the database listens on (its wake-ups and
/// lease take-overs are `NOTIFY`ed there).
pub(crate) const NOTIFY_CHANNEL: &str = "xagent_server";

/// Every migration, in order; the last one's version is what this binary knows.
pub(crate) const MIGRATIONS: &[Migration] = &[
    // 1: meta, channels, tool calls, the IM outbox and receiver idempotency.
    Migration::new(
        1,
        "
CREATE TABLE server_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE server_channels (
  id TEXT PRIMARY KEY, connector_id TEXT NOT NULL, status TEXT NOT NULL,
  binding TEXT, tool_overrides TEXT NOT NULL, created_at BIGINT NOT NULL);
CREATE TABLE server_tool_calls (
  channel TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, result TEXT,
  error_code TEXT, error_message BYTEA, completed_at BIGINT NOT NULL,
  PRIMARY KEY (channel, key));
CREATE INDEX server_tool_calls_age ON server_tool_calls (completed_at);
CREATE TABLE server_im_pending (
  channel TEXT NOT NULL, message_id TEXT NOT NULL, seq BIGINT NOT NULL, payload TEXT NOT NULL,
  attempts BIGINT NOT NULL, first_responsibility_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL, next_attempt_at BIGINT NOT NULL, last_error BYTEA,
  PRIMARY KEY (channel, message_id));
CREATE SEQUENCE server_im_completed_order;
CREATE TABLE server_im_completed (
  channel TEXT NOT NULL, message_id TEXT NOT NULL, fingerprint TEXT NOT NULL,
  completed_at BIGINT NOT NULL,
  inserted BIGINT NOT NULL DEFAULT nextval('server_im_completed_order'),
  PRIMARY KEY (channel, message_id));
CREATE INDEX server_im_completed_age ON server_im_completed (completed_at);
CREATE INDEX server_im_completed_newest ON server_im_completed (channel, completed_at, inserted);
",
    ),
    // 2: the Connector's own records (the author store), keys as bytes for a byte order
    // that does not depend on the database's collation.
    Migration::new(
        2,
        "
CREATE TABLE server_author_records (
  namespace TEXT NOT NULL, key BYTEA NOT NULL, value BYTEA NOT NULL,
  PRIMARY KEY (namespace, key));
",
    ),
    // 3: replicas: leases with fencing numbers (the data plane's, consumers'), the fence
    // check every submission of the data-plane holder runs first, and an index for one
    // channel's outbox records.
    Migration::new(
        3,
        "
CREATE TABLE server_leases (
  name TEXT PRIMARY KEY, holder TEXT, fence BIGINT NOT NULL DEFAULT 0,
  expires_at BIGINT NOT NULL DEFAULT 0, released_at BIGINT);
INSERT INTO server_leases (name) VALUES ('data_plane');
CREATE FUNCTION server_check_fence(expected BIGINT) RETURNS VOID LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM server_leases WHERE name = 'data_plane' AND fence = expected FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'fenced: this replica no longer holds the data plane (its fencing number % was superseded); nothing of this submission was stored', expected
      USING ERRCODE = 'XAF01';
  END IF;
END $$;
",
    ),
];
