//! The auth flows that bind a channel to a room: `webchat_room` (a form with the room's codes)
//! and `webchat_qr_login` (a one-time pairing link), and what unbinding and rebinding do.

use crate::app::{App, binding_for};
use crate::error::WebchatError;
use crate::guess::Refused;
use crate::names::ROOM_SECRET;
use crate::pairing::PairingStatus;
use crate::store::{SignIn, Store};
use schemars::JsonSchema;
use serde::Deserialize;
use std::sync::Arc;
use xagent_protocol_types::Secret;
use xagent_server_runtime::{
    AuthContext, AuthError, AuthPrompt, AuthStep, AuthValues, BoundReason, ChannelContext,
    FlowHandler,
};

/// The input of the `webchat_room` form flow (its Card fields are generated from it).
#[derive(Deserialize, JsonSchema)]
pub struct RoomForm {
    /// Room name
    #[schemars(example = &"support")]
    pub room_name: String,
    /// Access code
    /// Visitors enter this code to join the room (at least 8 characters for a new room).
    pub access_code: Secret,
    /// Owner code
    /// Yours, not the visitors': a new room needs it (F7), and it moves the room to another
    /// channel or changes its access code (at least 8 characters, not the access code).
    pub owner_code: Option<Secret>,
}

/// `webchat_room`: creates the room, or signs the channel in to it (M9: moving a room another
/// channel serves, or changing its access code, takes the room's owner code).
pub(crate) async fn room_sign_in(
    ctx: AuthContext<Arc<App>>,
    form: RoomForm,
) -> Result<AuthStep, AuthError> {
    let app = ctx.state();
    if form.access_code.expose().chars().count() < 4 {
        return Ok(AuthStep::Failed("the access code needs at least 4 characters".into()));
    }
    let owner = form.owner_code.as_ref().map(|o| o.expose()).filter(|o| !o.is_empty());
    let claim = match checked_sign_in(app, &ctx, &form, owner).await {
        Ok(claim) => claim,
        Err(refused) => {
            let secs = refused.wait_millis().div_ceil(1_000).max(1);
            let whose = match refused {
                Refused::Key { .. } => "from this channel",
                Refused::Room { .. } => "for this room",
            };
            tracing::warn!(channel = %ctx.channel, "sign-in refused: too many wrong codes");
            return Ok(AuthStep::Failed(format!(
                "too many wrong codes {whose}; try again in {secs} s"
            )));
        }
    };
    let room = match claim {
        Ok(SignIn::Created(room) | SignIn::Matched(room)) => room,
        Ok(SignIn::Rotated { room, revoked }) => {
            // The store revoked the sessions; their open streams end now too (F4).
            app.hub.end_room_sessions(&room.room_id);
            tracing::info!(room = %room.room_id, revoked, "the room's access code changed; visitor sessions ended");
            room
        }
        Ok(SignIn::WrongCode) => {
            return Ok(AuthStep::Failed("this room exists with another access code".into()));
        }
        Ok(SignIn::WrongOwner) => {
            return Ok(AuthStep::Failed("the owner code of this room is another one".into()));
        }
        Ok(SignIn::OwnerCodeNeeded) => {
            return Ok(AuthStep::Failed(
                "a new room needs an owner code (at least 8 characters, not the access code)"
                    .into(),
            ));
        }
        Ok(SignIn::OwnerRequired) => {
            return Ok(AuthStep::Failed(
                "another channel serves this room: sign in with the room's owner code to move it here"
                    .into(),
            ));
        }
        Err(WebchatError::InvalidInput(reason)) => return Ok(AuthStep::Failed(reason)),
        Err(error) => return Err(AuthError::internal(error)),
    };
    Ok(AuthStep::Authenticated(app.bind(&ctx.handle, &room, &ctx.channel).await?))
}

/// The store's sign-in under the sign-in limiter (F21): wrong access or owner codes count
/// against the channel (in this process) and the room (in the storage, one budget for every
/// replica), and a refused try is never checked. The admission, the check and its count
/// happen under one lock of this process.
async fn checked_sign_in(
    app: &App,
    ctx: &AuthContext<Arc<App>>,
    form: &RoomForm,
    owner: Option<&str>,
) -> Result<Result<SignIn, WebchatError>, Refused> {
    let now = ctx.handle.now_millis();
    let store = match app.store() {
        Ok(store) => store,
        Err(error) => return Ok(Err(error)),
    };
    let room_key = crate::store::room_id_from_name(&form.room_name);
    let mut limiter = app.sign_ins.lock().await;
    limiter.admit(Some(&ctx.channel), now)?;
    let guess = match &room_key {
        Some(room) => match store.begin_guess("signin", room, limiter.room_rate(), now).await {
            Ok(Ok(guess)) => Some(guess),
            Ok(Err(wait)) => return Err(limiter.refused_by_room(Some(&ctx.channel), wait, now)),
            Err(error) => return Ok(Err(error)),
        },
        None => None,
    };
    let claim = store
        .sign_in_room(&form.room_name, form.access_code.expose(), owner, &ctx.channel, now)
        .await;
    match &claim {
        Ok(SignIn::WrongCode | SignIn::WrongOwner) => limiter.wrong(Some(&ctx.channel), now),
        Ok(SignIn::Created(_) | SignIn::Matched(_) | SignIn::Rotated { .. }) => {
            limiter.right(Some(&ctx.channel));
        }
        _ => {}
    }
    let counts = matches!(&claim, Ok(SignIn::WrongCode | SignIn::WrongOwner));
    if let Some(guess) = guess
        && !counts
        && let Err(error) = store.forget_guess(guess).await
    {
        tracing::warn!(%error, "a right code's try stays in the room's budget");
    }
    Ok(claim)
}

/// `webchat_qr_login`: a one-time pairing link shown as a QR code.
pub(crate) struct PairingFlow;

impl FlowHandler<Arc<App>> for PairingFlow {
    async fn start(
        &self,
        ctx: AuthContext<Arc<App>>,
        _input: AuthValues,
    ) -> Result<AuthStep, AuthError> {
        let app = ctx.state();
        let prompt = app
            .pairings()
            .map_err(AuthError::internal)?
            .start(ctx.auth_session_id.clone(), ctx.channel.clone(), ctx.handle.now_millis())
            .await
            .map_err(AuthError::internal)?;
        Ok(AuthStep::Pending(app.prompt(&prompt, "open the link (or scan the code) and confirm")?))
    }

    async fn status(
        &self,
        ctx: AuthContext<Arc<App>>,
        refresh: bool,
    ) -> Result<AuthStep, AuthError> {
        let app = ctx.state();
        let now = ctx.handle.now_millis();
        let status = app
            .pairings()
            .map_err(AuthError::internal)?
            .status(&ctx.auth_session_id, refresh, now)
            .await
            .map_err(AuthError::internal)?;
        match status {
            PairingStatus::Pending(prompt) => {
                Ok(AuthStep::Pending(app.prompt(&prompt, "waiting for the link to be opened")?))
            }
            PairingStatus::Scanned(prompt) => {
                Ok(AuthStep::Scanned(app.prompt(&prompt, "opened; waiting for confirmation")?))
            }
            PairingStatus::RefreshRequired => Ok(AuthStep::QrRefreshRequired(AuthPrompt {
                message: Some("the pairing link expired; ask for a new one".into()),
                ..AuthPrompt::default()
            })),
            PairingStatus::Unknown => Ok(AuthStep::Expired),
            PairingStatus::Confirmed(room_id) => {
                let room = app
                    .store()
                    .map_err(AuthError::internal)?
                    .room(&room_id)
                    .await
                    .map_err(AuthError::internal)?
                    .ok_or_else(|| AuthError::internal("the paired room disappeared"))?;
                Ok(AuthStep::Authenticated(binding_for(&room)))
            }
        }
    }

    async fn cancel(&self, ctx: AuthContext<Arc<App>>) {
        let cancelled = match ctx.state().pairings() {
            Ok(pairings) => pairings.cancel(&ctx.auth_session_id).await,
            Err(error) => Err(error),
        };
        if let Err(error) = cancelled {
            tracing::warn!(%error, "a cancelled pairing stays until it is pruned");
        }
    }
}

/// Sign-out (logout or unregistration): the room stays, without an agent.
pub(crate) async fn unbind(ctx: ChannelContext<Arc<App>>) -> Result<(), AuthError> {
    let app = ctx.state();
    if let Some(room) = app.room_of(&ctx.channel).await {
        app.hub.set_online(&room.room_id, false);
    }
    let store = app.store().map_err(AuthError::internal)?;
    store.release_channel(&ctx.channel).await.map_err(AuthError::internal)
}

/// A restored channel: the room row still names it, nothing to re-attach (the page
/// reconnects on its own). Re-bind when the row was lost (e.g. an older database).
pub(crate) async fn rebind(ctx: ChannelContext<Arc<App>>, reason: BoundReason) {
    let app = ctx.state();
    if reason != BoundReason::Restored {
        return;
    }
    let Some(room_id) = ctx.binding.secret(ROOM_SECRET).map(|s| s.expose().to_owned()) else {
        return;
    };
    // At start this runs while the runtime is being built, before the App holds its store;
    // the handle's author store holds the same records.
    let store = match app.store() {
        Ok(store) => store.clone(),
        Err(_) => Store::new(ctx.handle.author_store()),
    };
    match store.room_by_channel(&ctx.channel).await {
        Ok(Some(_)) => {}
        Ok(None) => {
            if let Err(error) = store.set_room_channel(&room_id, Some(&ctx.channel)).await {
                tracing::warn!(%error, "a restored channel's room could not be bound again");
            }
        }
        Err(error) => tracing::warn!(%error, "a restored channel's room could not be read"),
    }
}
