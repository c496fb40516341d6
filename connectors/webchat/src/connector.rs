//! The Connector definition: Card, auth flows, the IM target (the room's page), the Tools and
//! the Skill — all on the public API of `xagent-server-runtime`.

use crate::app::{App, entry_files};
use crate::error::WebchatError;
use crate::flows::{PairingFlow, RoomForm, rebind, room_sign_in, unbind};
use crate::hub::{Activity, Draft};
use crate::names::{CARD_ID, PROVIDER, QR_FLOW, ROOM_FLOW, SKILL};
use crate::store::{Author, ChatEntry, EntryStatus};
use crate::tools::WebchatSender;
use std::sync::Arc;
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{
    ActivityStatus, ChatMessage, ErrorCode, PROFILE_IM_V2, Security, TargetDeclaration, TargetType,
    TrustLevel,
};
use xagent_server_runtime::{
    ChannelContext, Connector, DeliveryError, DeltaUpdate, FinalDelivery, FlowSpec, ImTarget,
};

struct WebchatTarget(Arc<App>);

impl ImTarget for WebchatTarget {
    const STREAMS_DELTAS: bool = true;
    const ACTIVITY: ActivityCapability = ActivityCapability::CustomStatus;

    async fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        _how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        let Some(room) = self.0.room_of(&ctx.channel).await else {
            return Err(DeliveryError::permanent(
                ErrorCode::ConnectionNotAuthenticated,
                "the channel serves no chat room",
            ));
        };
        let entry = ChatEntry {
            message_id: message.message_id.to_string(),
            author: Author::Assistant,
            text: message.text.clone(),
            files: entry_files(&message),
            status: EntryStatus::Shown,
            error: None,
            client_id: None,
            created_at: message.created_at.unwrap_or_else(|| ctx.handle.now_millis()),
        };
        // Showing the final replaces the streamed draft with the same id on the page.
        self.0.show_agent_message(&room.room_id, entry).await.map_err(DeliveryError::internal)?;
        Ok(())
    }

    async fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> Option<String> {
        let room = self.0.room_of(&ctx.channel).await?;
        let message_id = update.message_id.to_string();
        self.0.hub.draft(
            &room.room_id,
            Draft { message_id: message_id.clone(), text: update.text_so_far },
        );
        Some(message_id)
    }

    async fn activity(&self, ctx: ChannelContext, action: ActivityAction) {
        let Some(room) = self.0.room_of(&ctx.channel).await else { return };
        let activity = match action {
            ActivityAction::Show { status, tool_name } => Some(Activity {
                status: if status == ActivityStatus::Tool { "tool" } else { "thinking" }.into(),
                tool_name,
            }),
            ActivityAction::Typing => Some(Activity { status: "thinking".into(), tool_name: None }),
            ActivityAction::Clear => None,
            _ => return,
        };
        self.0.hub.activity(&room.room_id, activity);
    }
}

/// Builds the Connector definition around the shared state.
pub(crate) fn build(app: Arc<App>) -> Result<Connector, WebchatError> {
    let (room_app, unbind_app, rebind_app) = (Arc::clone(&app), Arc::clone(&app), Arc::clone(&app));
    let connector = Connector::builder(CARD_ID, "Web Chat", env!("CARGO_PKG_VERSION"))
        .description(
            "Puts an xAgent agent on a web page: visitors chat in the browser, replies stream back live.",
        )
        .vendor("xagent-connector-rs")
        .target(TargetDeclaration::new(TargetType::Im, PROVIDER, "Web chat"))
        .profile(PROFILE_IM_V2)
        .security(Security::new(TrustLevel::Local, true).with_data_class("message").with_data_class("file"))
        .qr_flow(
            FlowSpec::new(QR_FLOW, "Pair with a web chat room").description(
                "Open the link or scan the code in a browser and confirm: a new room is created for this channel.",
            ),
            PairingFlow(Arc::clone(&app)),
        )
        .form_flow(
            FlowSpec::new(ROOM_FLOW, "Open a named web chat room")
                .description("Creates the room, or joins it when the access code matches."),
            move |ctx, form: RoomForm| room_sign_in(Arc::clone(&room_app), ctx, form),
        )
        .on_unbound(move |ctx| unbind(Arc::clone(&unbind_app), ctx))
        .on_bound(move |ctx, reason| rebind(Arc::clone(&rebind_app), ctx, reason))
        .im_target(WebchatTarget(Arc::clone(&app)))
        .skill(SKILL)
        .im_send_tools(PROVIDER, WebchatSender(Arc::clone(&app)))
        .build()?;
    Ok(connector)
}
