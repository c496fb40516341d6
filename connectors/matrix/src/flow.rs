//! The `matrix_room` flow: a pairing code shown to the user, redeemed by posting it in a room.

use std::sync::Arc;

use matrix_sdk::Room;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use xagent_protocol_types::{AuthSessionId, ConnectorChannelId, DescriptorTarget, Secret};
use xagent_server_runtime::{
    AuthContext, AuthError, AuthPrompt, AuthStep, AuthValues, Binding, ConnectorHandle, FlowHandler,
};

use crate::app::{App, Paired, lock, room_hint};
use crate::names::{PAIRED_AT_SECRET, PROVIDER, ROOM_SECRET};
use crate::pairing::Redeem;

impl App {
    fn prompt(
        &self,
        session: &AuthSessionId,
        channel: &ConnectorChannelId,
        now: u64,
    ) -> AuthPrompt {
        let (code, expires_at) = lock(&self.pairing).issue((session.clone(), channel.clone()), now);
        let prompt = AuthPrompt {
            qr_code_text: Some(self.link.clone()),
            qr_code_image: None,
            expires_at: Some(expires_at),
            poll_interval_millis: Some(2_000),
            message: Some(format!(
                "Invite {} to your Matrix room (open the link or scan the code), then post this pairing code in the room: {code}",
                self.bot
            )),
        };
        lock(&self.prompts).insert(session.clone(), prompt.clone());
        prompt
    }

    /// A text posted in a room without a channel: maybe a pairing code.
    pub(crate) async fn pairing_attempt(
        &self,
        handle: &ConnectorHandle,
        room: &Room,
        sender: &str,
        text: &str,
        posted_at: u64,
    ) {
        let now = Self::now(handle);
        let verdict = lock(&self.pairing).redeem(room.room_id().as_str(), sender, text, now);
        let reply = match verdict {
            Redeem::NotACode | Redeem::Locked => return,
            Redeem::Wrong => {
                "That pairing code is not valid (or expired). Ask for a new one where you connect the agent."
            }
            Redeem::Bound((session, channel)) => {
                let taken = lock(&self.rooms).contains_key(room.room_id());
                if taken {
                    "This room is connected to an agent already."
                } else {
                    let name = match room.display_name().await {
                        Ok(name) => name.to_string(),
                        Err(_) => "Matrix room".to_owned(),
                    };
                    let paired = Paired { room_id: room.room_id().to_owned(), name, at: posted_at };
                    lock(&self.paired).insert(session, paired);
                    lock(&self.rooms).insert(room.room_id().to_owned(), channel);
                    "Paired: messages in this room now go to the agent."
                }
            }
        };
        let _ = room.send(RoomMessageEventContent::notice_plain(reply)).await;
    }
}

pub(crate) struct RoomFlow(pub(crate) Arc<App>);

impl FlowHandler for RoomFlow {
    async fn start(&self, ctx: AuthContext, _input: AuthValues) -> Result<AuthStep, AuthError> {
        let now = ctx.handle.now_millis();
        Ok(AuthStep::Pending(self.0.prompt(&ctx.auth_session_id, &ctx.channel, now)))
    }

    async fn status(&self, ctx: AuthContext, refresh: bool) -> Result<AuthStep, AuthError> {
        let app = &self.0;
        if let Some(paired) = lock(&app.paired).remove(&ctx.auth_session_id) {
            lock(&app.prompts).remove(&ctx.auth_session_id);
            let target = DescriptorTarget::new(PROVIDER, paired.name)
                .with_label("Matrix room")
                .with_account_hint(room_hint(&paired.room_id));
            let binding = Binding::new(target)
                .with_secret(ROOM_SECRET, Secret::new(paired.room_id.to_string()))
                .with_secret(PAIRED_AT_SECRET, Secret::new(paired.at.to_string()));
            return Ok(AuthStep::Authenticated(binding));
        }
        let now = ctx.handle.now_millis();
        if refresh {
            return Ok(AuthStep::Pending(app.prompt(&ctx.auth_session_id, &ctx.channel, now)));
        }
        let key = (ctx.auth_session_id.clone(), ctx.channel.clone());
        if !lock(&app.pairing).is_open(&key, now) {
            lock(&app.prompts).remove(&ctx.auth_session_id);
            return Ok(AuthStep::Expired);
        }
        let prompt = lock(&app.prompts).get(&ctx.auth_session_id).cloned().unwrap_or_default();
        Ok(AuthStep::Pending(prompt))
    }

    async fn cancel(&self, ctx: AuthContext) {
        let key = (ctx.auth_session_id.clone(), ctx.channel.clone());
        lock(&self.0.pairing).cancel(&key);
        lock(&self.0.prompts).remove(&ctx.auth_session_id);
        if let Some(paired) = lock(&self.0.paired).remove(&ctx.auth_session_id) {
            lock(&self.0.rooms).remove(&paired.room_id);
        }
    }
}
