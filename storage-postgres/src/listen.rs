//! A reusable `LISTEN` loop: one connection outside the pool listens on a notification
//! channel and hands each payload to its owner; when the connection breaks it is opened again
//! with backoff (100 ms doubling to 5 s), and every (re)subscription is announced, since what
//! was notified while nobody listened is lost and the owner must resynchronise.

use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::AsyncMessage;

use crate::error::PgError;
use crate::pool::{PoolOptions, connect_unpooled};
use crate::url::DatabaseUrl;

/// What a [`Listener`] hears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListenEvent<'a> {
    /// The listener subscribed (first time or after a reconnection): notifications sent
    /// before this may have been missed, so re-read whatever they announce.
    Resync,
    /// One `NOTIFY` payload on the channel.
    Notification(&'a str),
}

/// A task listening on one notification channel until dropped.
#[derive(Debug)]
pub struct Listener {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Starts listening on `channel` (a plain lower-case SQL identifier) inside the current
    /// tokio runtime; `on_event` runs on the listener's task for every event.
    pub fn start(
        url: DatabaseUrl,
        options: PoolOptions,
        channel: &str,
        on_event: impl FnMut(ListenEvent<'_>) + Send + 'static,
    ) -> Result<Self, PgError> {
        let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        if channel.is_empty() || channel.len() > 63 || !channel.chars().all(plain) {
            return Err(PgError::InvalidOptions {
                reason: format!(
                    "the notification channel {channel:?} must be 1 to 63 lower-case letters, \
                     digits or underscores"
                ),
            });
        }
        let command = format!("LISTEN {channel}");
        Ok(Self { task: tokio::spawn(listen(url, options, command, on_event)) })
    }
}

/// Listens forever (the task is aborted by [`Listener`]'s drop), reconnecting with backoff.
async fn listen(
    url: DatabaseUrl,
    options: PoolOptions,
    command: String,
    mut on_event: impl FnMut(ListenEvent<'_>),
) {
    let mut delay = Duration::from_millis(100);
    loop {
        match connect_unpooled(&url, &options).await {
            Ok((client, connection)) => {
                subscribe(&client, connection, &command, &mut on_event, &mut delay).await;
            }
            Err(error) => {
                tracing::warn!(%error, "could not connect to listen for notifications; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

/// Subscribes on one connection and hands on what it hears until it breaks.
async fn subscribe(
    client: &tokio_postgres::Client,
    mut connection: crate::pool::Connection,
    command: &str,
    on_event: &mut impl FnMut(ListenEvent<'_>),
    delay: &mut Duration,
) {
    let subscribe = client.batch_execute(command);
    tokio::pin!(subscribe);
    let mut listening = false;
    loop {
        tokio::select! {
            outcome = &mut subscribe, if !listening => match outcome {
                Ok(()) => {
                    listening = true;
                    *delay = Duration::from_millis(100);
                    on_event(ListenEvent::Resync);
                }
                Err(error) => {
                    let error = PgError::from_driver("listen for notifications", &error);
                    tracing::warn!(%error, "could not listen for notifications; retrying");
                    return;
                }
            },
            message = connection.next() => match message {
                Some(Ok(AsyncMessage::Notification(note))) => {
                    on_event(ListenEvent::Notification(note.payload()));
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::warn!(%error, "the connection listening for notifications broke; reconnecting");
                    return;
                }
                None => return,
            },
        }
    }
}
