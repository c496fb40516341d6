//! The pairing link's page steps: scanning the QR code and confirming the pairing.

use super::visitor::{Web, with_session};
use crate::error::WebchatError;
use crate::store::{RoomClaim, random_hex};
use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

pub(crate) async fn pair_scan(
    State(web): State<Web>,
    Path(token): Path<String>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    let opened = web.app.pairings()?.scan(&token, now).await?;
    Ok(Json(json!({
        "state": "scanned",
        "expires_at": opened.expires_at,
        "suggested_room_name": opened.suggested_room_name,
    }))
    .into_response())
}

#[derive(Deserialize)]
pub(crate) struct ConfirmBody {
    #[serde(default)]
    pub(crate) room_name: Option<String>,
}

pub(crate) async fn pair_confirm(
    State(web): State<Web>,
    Path(token): Path<String>,
    Json(body): Json<ConfirmBody>,
) -> Result<Response, WebchatError> {
    let now = web.now();
    // The link is this confirmation's from here on, on every replica (one-time).
    let claim = web.app.pairings()?.claim(&token, now).await?;
    let name = body
        .room_name
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| claim.suggested_room_name.clone());
    let access_code = random_hex(6);
    let created = match web.app.store()?.claim_room(&name, &access_code, now).await {
        Ok(RoomClaim::Created(room)) => Ok(room),
        Ok(_) => Err(WebchatError::InvalidInput(
            "a room with this name exists already; choose another name".into(),
        )),
        Err(error) => Err(error),
    };
    let room = match created {
        Ok(room) => room,
        Err(error) => {
            // No room was made: the link can be confirmed again (with another name).
            web.app.pairings()?.release(claim).await?;
            return Err(error);
        }
    };
    web.app.store()?.set_room_channel(&room.room_id, Some(&claim.channel)).await?;
    web.app.pairings()?.complete(claim, &room.room_id).await?;
    let expires_at = now.saturating_add(web.limits.token_lifetime_millis);
    let visitor_token = web.app.store()?.add_visitor(&room.room_id, now, expires_at).await?;
    let body = json!({
        "token": visitor_token,
        "room_id": room.room_id,
        "room_name": room.name,
        "access_code": access_code,
        "expires_at": expires_at,
    });
    Ok(with_session(&web, &room.room_id, &visitor_token, body))
}
