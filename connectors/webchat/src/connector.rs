//! The Connector definition: Card, auth flows, the IM target (the room's page), the Tools and
//! the Skill — all on the public API of `xagent-server-runtime`.

use crate::app::{App, entry_files};
use crate::error::WebchatError;
use crate::flows::{PairingFlow, rebind, room_sign_in, unbind};
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

/// The room's page as the IM target; the rooms are in the Connector's state.
struct WebchatTarget;

impl ImTarget<Arc<App>> for WebchatTarget {
    const STREAMS_DELTAS: bool = true;
    const ACTIVITY: ActivityCapability = ActivityCapability::CustomStatus;

    async fn deliver(
        &self,
        ctx: ChannelContext<Arc<App>>,
        message: ChatMessage,
        _how: FinalDelivery,
    ) -> Result<(), DeliveryError> {
        let app = ctx.state();
        let Some(room) = app.room_of(&ctx.channel).await else {
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
        app.show_agent_message(&room.room_id, entry).await.map_err(DeliveryError::internal)?;
        Ok(())
    }

    async fn delta(&self, ctx: ChannelContext<Arc<App>>, update: DeltaUpdate) -> Option<String> {
        let app = ctx.state();
        let room = app.room_of(&ctx.channel).await?;
        let message_id = update.message_id.to_string();
        app.hub.draft(
            &room.room_id,
            Draft { message_id: message_id.clone(), text: update.text_so_far },
        );
        Some(message_id)
    }

    async fn activity(&self, ctx: ChannelContext<Arc<App>>, action: ActivityAction) {
        let app = ctx.state();
        let Some(room) = app.room_of(&ctx.channel).await else { return };
        let activity = match action {
            ActivityAction::Show { status, tool_name } => Some(Activity {
                status: if status == ActivityStatus::Tool { "tool" } else { "thinking" }.into(),
                tool_name,
            }),
            ActivityAction::Typing => Some(Activity { status: "thinking".into(), tool_name: None }),
            ActivityAction::Clear => None,
            _ => return,
        };
        app.hub.activity(&room.room_id, activity);
    }
}

/// Builds the Connector definition around the shared state.
pub(crate) fn build(app: Arc<App>) -> Result<Connector, WebchatError> {
    let connector = Connector::builder(CARD_ID, "Web Chat", env!("CARGO_PKG_VERSION"))
        .description(
            "Puts an xAgent agent on a web page: visitors chat in the browser, replies stream back live.",
        )
        .vendor("xagent-connector-rs")
        .target(TargetDeclaration::new(TargetType::Im, PROVIDER, "Web chat"))
        .profile(PROFILE_IM_V2)
        .security(Security::new(TrustLevel::Local, true).with_data_class("message").with_data_class("file"))
        .state(app)
        .qr_flow(
            FlowSpec::new(QR_FLOW, "Pair with a web chat room").description(
                "Open the link or scan the code in a browser and confirm: a new room is created for this channel.",
            ),
            PairingFlow,
        )
        .form_flow(
            FlowSpec::new(ROOM_FLOW, "Open a named web chat room")
                .description("Creates the room, or joins it when the access code matches."),
            room_sign_in,
        )
        .on_unbound(unbind)
        .on_bound(rebind)
        .im_target(WebchatTarget)
        .skill(SKILL)
        .im_send_tools(PROVIDER, WebchatSender)
        .build()?;
    Ok(connector)
}
