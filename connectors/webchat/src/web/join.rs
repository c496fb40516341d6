//! Joining a room with its access code (throttled per address and per room), the session it
//! gives, and leaving.

use super::visitor::{
    MAX_ACCESS_CODE_BYTES, Web, session_cookie, throttled, visitor, visitor_write, with_session,
};
use crate::error::WebchatError;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::{Extensions, HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use std::net::IpAddr;

/// Takes one of the address's joins (F12): a new visitor session costs a database row, so an
/// address may start [`VisitorLimits::joins_per_address_burst`] at once and then
/// [`VisitorLimits::joins_per_address_per_minute`]; beyond that 429 with `Retry-After`.
fn take_join(web: &Web, peer: Option<IpAddr>, now: u64) -> Result<(), WebchatError> {
    web.join_rate().take(peer, now, &web.limits).map_err(|wait_millis| {
        let secs = wait_millis.div_ceil(1_000).max(1);
        WebchatError::TooManyRequests {
            message: format!("too many new chat sessions from your address; try again in {secs} s"),
            retry_after_secs: secs,
        }
    })
}

#[derive(Deserialize)]
pub(crate) struct JoinBody {
    pub(crate) access_code: String,
}

pub(crate) async fn join(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    extensions: Extensions,
    Json(body): Json<JoinBody>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    let peer: Option<IpAddr> = xagent_server_runtime::ops::peer_ip(&extensions);
    take_join(&web, peer, now)?;
    if let Err(error) = check_join_code(&web, &room_id, peer, &body.access_code, now).await {
        // A wrong or refused code starts no session: the join throttle counts it instead.
        web.join_rate().refund(peer, now, &web.limits);
        return Err(error);
    }
    let room = web.app.store()?.room(&room_id).await?.ok_or(WebchatError::Forbidden)?;
    let expires_at = now.saturating_add(web.limits.token_lifetime_millis);
    let token = web.app.store()?.add_visitor(&room_id, now, expires_at).await?;
    let body = json!({
        "token": token, "room_id": room.room_id, "room_name": room.name, "expires_at": expires_at,
    });
    Ok(with_session(&web, &room_id, &token, body))
}

/// Checks a visitor's access code under the join throttle (F5): the address's backoff in
/// this process, the room's budget in the storage (shared by every replica). The admission,
/// the check and its count happen under one lock of this process, so parallel tries cannot
/// slip past the limits.
async fn check_join_code(
    web: &Web,
    room_id: &str,
    peer: Option<IpAddr>,
    code: &str,
    now: u64,
) -> Result<(), WebchatError> {
    let store = web.app.store()?;
    let mut throttle = web.throttle.lock().await;
    throttle.admit(peer, now).map_err(throttled)?;
    if !crate::store::is_room_id(room_id) {
        // No room has this id: a wrong code, kept by the address alone.
        throttle.failed(peer, now);
        return Err(WebchatError::Forbidden);
    }
    let guess = match store.begin_guess("join", room_id, throttle.room_rate(), now).await? {
        Ok(guess) => guess,
        Err(wait) => return Err(throttled(throttle.refused_by_room(peer, wait, now))),
    };
    let right = code.len() <= MAX_ACCESS_CODE_BYTES && store.check_code(room_id, code).await?;
    if right {
        throttle.succeeded(peer);
        drop(throttle);
        store.forget_guess(guess).await?;
        return Ok(());
    }
    throttle.failed(peer, now);
    drop(throttle);
    tracing::warn!(room = ?room_id, peer = ?peer, "wrong access code for a room");
    Err(WebchatError::Forbidden)
}

pub(crate) async fn session(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, WebchatError> {
    visitor(&web, &room_id, &headers).await?;
    let room = web.app.store()?.room(&room_id).await?.ok_or(WebchatError::Forbidden)?;
    Ok(Json(json!({ "room_id": room.room_id, "room_name": room.name })).into_response())
}

/// Ends the session: the token stops working and the cookie is cleared.
pub(crate) async fn leave(
    State(web): State<Web>,
    Path(room_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, WebchatError> {
    let token = visitor_write(&web, &room_id, &headers).await?;
    web.app.end_visitor_session(&token).await?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    if let Some(cookie) = session_cookie(&web, &room_id, "", 0) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    Ok(response)
}
