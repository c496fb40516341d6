//! A page's view of its room: the snapshot, and the live event stream (bounded per visitor,
//! address and room; ended when the session ends).

use super::guard::VisitorLimits;
use super::visitor::{SESSION_RECHECK, Web, visitor};
use crate::error::WebchatError;
use crate::hub::{RoomEvent, StreamCaps, StreamLimit};
use crate::store::hash_token;
use axum::extract::{Path, State};
use axum::http::{Extensions, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::StreamExt;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

/// The snapshot a page gets on (re)connecting: the newest messages that fit in
/// [`VisitorLimits::snapshot_bytes`].
async fn snapshot(web: &Web, room_id: &str) -> Result<RoomEvent, WebchatError> {
    let room = web.app.store()?.room(room_id).await?.ok_or(WebchatError::Forbidden)?;
    let (_, drafts, activity) = web.app.hub.subscribe(room_id);
    let online = room.channel.as_ref().is_some_and(|channel| web.handle.is_routed(channel));
    let mut messages = web.app.messages()?.history(room_id).await?;
    let mut budget = web.limits.snapshot_bytes;
    let mut keep = 0;
    for entry in messages.iter().rev() {
        let size = serde_json::to_vec(entry).map_or(usize::MAX, |bytes| bytes.len());
        if size > budget {
            break;
        }
        budget -= size;
        keep += 1;
    }
    messages.drain(..messages.len() - keep);
    Ok(RoomEvent::Snapshot {
        room_id: room.room_id,
        room_name: room.name,
        agent_online: online,
        messages,
        drafts,
        activity,
    })
}

fn sse_event(event: &RoomEvent) -> Event {
    Event::default().data(serde_json::to_string(event).unwrap_or_else(|_| "{}".into()))
}

/// What a live stream carries besides the room's broadcast receiver.
struct Live {
    pub(crate) web: Web,
    pub(crate) room_id: String,
    pub(crate) token: String,
    pub(crate) rx: tokio::sync::broadcast::Receiver<RoomEvent>,
    /// Cancelled when the session ends (leave, code change): the stream ends at once (F4).
    pub(crate) ended: CancellationToken,
    /// When the session expires (Unix ms, the injected clock).
    pub(crate) expires_at: u64,
    pub(crate) _place: crate::hub::StreamGuard,
}

/// The stream caps of [`VisitorLimits`] as the hub takes them.
fn stream_caps(limits: &VisitorLimits) -> StreamCaps {
    StreamCaps {
        per_token: limits.streams_per_token,
        per_address: limits.streams_per_address,
        per_room: limits.streams_per_room,
        total: limits.streams_total,
    }
}

impl Live {
    /// Whether the session may still see events: checked before each one (F4).
    pub(crate) fn session_open(&self) -> bool {
        !self.ended.is_cancelled() && self.web.now() < self.expires_at
    }

    /// How long to wait for the next event before looking at the session again.
    pub(crate) fn recheck_in(&self) -> Duration {
        let left = self.expires_at.saturating_sub(self.web.now());
        SESSION_RECHECK.min(Duration::from_millis(left.max(1)))
    }

    /// The next event for the page, or `None` when the stream ends: the session ended or
    /// expired, the reader is too slow, or the room's broadcast closed.
    pub(crate) async fn next_event(&mut self) -> Option<Event> {
        loop {
            if !self.session_open() {
                return None;
            }
            let wait = self.recheck_in();
            let next = tokio::select! {
                biased;
                () = self.ended.cancelled() => return None,
                next = tokio::time::timeout(wait, self.rx.recv()) => next,
            };
            match next {
                Ok(Ok(event)) if self.session_open() => return Some(sse_event(&event)),
                Ok(Ok(_)) => return None,
                // Too slow a reader: the stream ends and the page reconnects to a fresh
                // snapshot, instead of the Connector buffering for it.
                Ok(Err(RecvError::Lagged(_) | RecvError::Closed)) => return None,
                Err(_) => {
                    let now = self.web.now();
                    let room = match self.web.app.store() {
                        Ok(store) => store.visitor_room(&self.token, now).await,
                        Err(error) => Err(error),
                    };
                    match room {
                        Ok(Some(room)) if room == self.room_id => {}
                        // Expired or revoked: the page learns it when it reconnects.
                        _ => return None,
                    }
                }
            }
        }
    }
}

pub(crate) async fn events(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
    extensions: Extensions,
) -> Result<impl axum::response::IntoResponse, WebchatError> {
    let token = visitor(&web, &room_id, &headers).await?;
    // Counted per address too (F6), so one address never holds a room's streams.
    let address = xagent_server_runtime::ops::peer_ip(&extensions).map(super::guard::addr_key);
    let caps = stream_caps(&web.limits);
    let opened = web.app.hub.open_stream(&room_id, &hash_token(&token), address, caps);
    let place = opened.map_err(|limit| {
        let message = match limit {
            StreamLimit::Token => "this session has too many open pages; close one",
            StreamLimit::Address => {
                "too many chat pages are open from your address; close one and try again"
            }
            StreamLimit::Room => "this room has too many open pages right now; try again later",
            StreamLimit::Total => "the chat is too busy right now; try again later",
        };
        WebchatError::TooManyRequests { message: message.into(), retry_after_secs: 10 }
    })?;
    // F4: the session is looked at again now that its end signal is registered, so an end
    // between the first check and the registration is not missed.
    let ended = place.session_ended();
    let session = web
        .app
        .store()?
        .visitor_session(&token, web.now())
        .await?
        .filter(|session| session.room_id == room_id && !ended.is_cancelled())
        .ok_or(WebchatError::Forbidden)?;
    // Subscribe before reading the snapshot so nothing falls between them.
    let (rx, _, _) = web.app.hub.subscribe(&room_id);
    let first = sse_event(&snapshot(&web, &room_id).await?).retry(Duration::from_millis(1_000));
    let shutdown = web.shutdown.clone();
    let expires_at = session.expires_at;
    let live = Live { web, room_id, token, rx, ended, expires_at, _place: place };
    let live = futures_util::stream::unfold(live, |mut live| async move {
        live.next_event().await.map(|event| (event, live))
    });
    let stream = futures_util::stream::once(async move { first })
        .chain(live)
        .map(Ok::<Event, Infallible>)
        .take_until(shutdown.cancelled_owned());
    let sse = Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)));
    // nginx buffers proxied responses by default, which would hold events back until a
    // buffer fills: this header turns that off for the stream alone.
    Ok(([(axum::http::header::HeaderName::from_static("x-accel-buffering"), "no")], sse))
}
