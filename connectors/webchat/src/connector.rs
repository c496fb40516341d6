//! The Connector definition: Card, auth flows, the IM target (the room's page), the Tools and
//! the Skill — all on the public API of `xagent-server-runtime`.

use std::sync::Arc;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use xagent_profile_im::{ActivityAction, ActivityCapability};
use xagent_protocol_types::{
    ActivityStatus, ChatMessage, ConnectionStatus, ConnectorChannelId, DescriptorTarget, ErrorCode,
    FileRef, PROFILE_IM_V2, Secret, Security, TargetDeclaration, TargetType, TrustLevel,
};
use xagent_server_runtime::{
    AuthContext, AuthError, AuthPrompt, AuthStep, AuthValues, Binding, BoundReason, ChannelContext,
    Connector, ConnectorHandle, DeliveryError, DeltaUpdate, FinalDelivery, FlowHandler, FlowSpec,
    ImTarget, ToolContext, ToolError, ToolSpec,
};

use crate::error::WebchatError;
use crate::guess::{GuessLimiter, Refused};
use crate::hub::{Activity, Draft, Hub};
use crate::messages::{Messages, Prepared};
use crate::pairing::{PairingPrompt, PairingStatus, Pairings};
use crate::store::{Author, ChatEntry, EntryFile, EntryStatus, Inserted, Room, SignIn, Store};

/// Card id.
pub const CARD_ID: &str = "im.webchat";
/// Target provider.
pub const PROVIDER: &str = "webchat";
/// The QR pairing flow.
pub const QR_FLOW: &str = "webchat_qr_login";
/// The room form flow.
pub const ROOM_FLOW: &str = "webchat_room";
/// Tool: send text to the room.
pub const TOOL_MESSAGE_SEND: &str = "webchat_message_send";
/// Tool: send a file to the room.
pub const TOOL_FILE_SEND: &str = "webchat_file_send";
/// Binding secret holding the room id.
const ROOM_SECRET: &str = "room_id";

/// The primary Skill, served at `/skill.md`.
pub const SKILL: &str = include_str!("../assets/skill.md");

/// State shared by the Connector code and the chat page's HTTP API.
pub(crate) struct App {
    /// The Connector's own records in the runtime's storage (set once the runtime is built).
    pub(crate) store: std::sync::OnceLock<Store>,
    /// The rooms' conversations in the runtime's storage (set once the runtime is built).
    pub(crate) messages: std::sync::OnceLock<Messages>,
    pub(crate) hub: Hub,
    /// The runtime's handle (set once it is built): room news go to the other replicas.
    pub(crate) handle: std::sync::OnceLock<ConnectorHandle>,
    /// This process's name in its room news (its own come back to it and are skipped).
    pub(crate) origin: String,
    /// The pairings of every replica in the runtime's storage (set once the runtime is built).
    pub(crate) pairings: std::sync::OnceLock<Pairings>,
    /// Wrong codes given through `auth.start`, per channel and per room (F21).
    pub(crate) sign_ins: tokio::sync::Mutex<GuessLimiter<ConnectorChannelId>>,
    /// Absolute URL the pairing links and page links start with (no trailing slash).
    pub(crate) public_url: String,
}

impl App {
    /// The pairings (available once the runtime is built, before it serves).
    pub(crate) fn pairings(&self) -> Result<&Pairings, WebchatError> {
        self.pairings.get().ok_or(WebchatError::ShuttingDown)
    }

    /// Ends one visitor session (the page's "leave"): the token stops working and every
    /// event stream it holds ends now (F4).
    pub(crate) async fn end_visitor_session(&self, token: &str) -> Result<(), WebchatError> {
        self.store()?.revoke_visitor(token).await?;
        self.hub.end_session(&crate::store::hash_token(token));
        Ok(())
    }

    pub(crate) fn pairing_link(&self, token: &str) -> String {
        format!("{}/chat/pair/{token}", self.public_url)
    }

    /// The prompt of a pairing: with the link and its QR code when this replica minted the
    /// token (another replica knows only its hash and reports the state and expiry).
    fn prompt(&self, prompt: &PairingPrompt, message: &str) -> Result<AuthPrompt, AuthError> {
        let link = prompt.token.as_deref().map(|token| self.pairing_link(token));
        let image = match &link {
            Some(link) => Some(crate::qr::qr_data_url(link).map_err(AuthError::internal)?),
            None => None,
        };
        Ok(AuthPrompt {
            qr_code_text: link,
            qr_code_image: image,
            expires_at: Some(prompt.expires_at),
            poll_interval_millis: Some(1_000),
            message: Some(message.to_owned()),
        })
    }

    /// Binds `room` to `channel`: the room's earlier channel (if another one) is marked
    /// `revoked`, since a room is served by one channel at a time.
    async fn bind(
        &self,
        handle: &ConnectorHandle,
        room: &Room,
        channel: &ConnectorChannelId,
    ) -> Result<Binding, AuthError> {
        let previous = self
            .store()
            .map_err(AuthError::internal)?
            .set_room_channel(&room.room_id, Some(channel))
            .await
            .map_err(AuthError::internal)?;
        if let Some(previous) = previous.filter(|p| p != channel) {
            tracing::info!(room = %room.room_id, %previous, "room moved to another channel");
            let _ = handle.set_status(&previous, ConnectionStatus::Revoked).await;
        }
        self.hub.set_online(&room.room_id, handle.is_routed(channel));
        Ok(binding_for(room))
    }

    async fn room_of(&self, channel: &ConnectorChannelId) -> Option<Room> {
        let room = match self.store() {
            Ok(store) => store.room_by_channel(channel).await,
            Err(error) => Err(error),
        };
        match room {
            Ok(room) => room,
            Err(error) => {
                tracing::error!(%error, "room lookup failed");
                None
            }
        }
    }

    /// The Connector's records (available once the runtime is built, before it serves).
    pub(crate) fn store(&self) -> Result<&Store, WebchatError> {
        self.store.get().ok_or(WebchatError::ShuttingDown)
    }

    /// Shows a new or changed message on this replica's pages of the room. The message is
    /// stored already, and the other replicas heard of it in the same transaction (the hint
    /// rides with the message's writes, see `live.rs`).
    pub(crate) fn publish(&self, room_id: &str, entry: ChatEntry) {
        self.hub.message(room_id, entry);
    }

    /// The rooms' conversations (available once the runtime is built, before it serves).
    pub(crate) fn messages(&self) -> Result<&Messages, WebchatError> {
        self.messages.get().ok_or(WebchatError::ShuttingDown)
    }

    /// Adds an agent message to a room (idempotent by `message_id`), committed now, and shows
    /// it.
    pub(crate) async fn show_agent_message(
        &self,
        room_id: &str,
        entry: ChatEntry,
    ) -> Result<ChatEntry, WebchatError> {
        match self.messages()?.insert(room_id, &entry, None).await? {
            Inserted::New(entry) => {
                self.publish(room_id, entry.clone());
                Ok(entry)
            }
            Inserted::Existing(entry) => Ok(entry),
        }
    }
}

/// Adds an agent message to a room from a Tool call: its records are staged on the call, so
/// they commit with the call's tool-call record (one transaction), and the page is shown the
/// message once that committed. A repeat (same `message_id`) returns the stored one.
async fn stage_agent_message(
    app: &Arc<App>,
    ctx: &ToolContext,
    room_id: &str,
    entry: ChatEntry,
) -> Result<ChatEntry, WebchatError> {
    match app.messages()?.prepare(room_id, &entry).await? {
        Prepared::Existing(existing) => Ok(existing),
        Prepared::New { entry, writes } => {
            for write in writes {
                ctx.stage(write);
            }
            let (shown, app, room_id) = (entry.clone(), Arc::clone(app), room_id.to_owned());
            ctx.after_commit(move || app.publish(&room_id, shown));
            Ok(entry)
        }
    }
}

fn binding_for(room: &Room) -> Binding {
    let target = DescriptorTarget::new(PROVIDER, format!("Web chat room {}", room.name))
        .with_label("Web chat")
        .with_account_hint(room.room_id.clone());
    Binding::new(target).with_secret(ROOM_SECRET, Secret::new(room.room_id.clone()))
}

fn entry_files(message: &ChatMessage) -> Vec<EntryFile> {
    message
        .files
        .iter()
        .map(|f| EntryFile {
            file_ref: f.file_ref.to_string(),
            filename: f.filename.clone().unwrap_or_else(|| f.file_ref.to_string()),
            mime_type: f.mime_type.clone(),
            byte_size: f.byte_size,
        })
        .collect()
}

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
async fn room_sign_in(
    app: Arc<App>,
    ctx: AuthContext,
    form: RoomForm,
) -> Result<AuthStep, AuthError> {
    if form.access_code.expose().chars().count() < 4 {
        return Ok(AuthStep::Failed("the access code needs at least 4 characters".into()));
    }
    let owner = form.owner_code.as_ref().map(|o| o.expose()).filter(|o| !o.is_empty());
    let claim = match checked_sign_in(&app, &ctx, &form, owner).await {
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
    ctx: &AuthContext,
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
struct PairingFlow(Arc<App>);

impl FlowHandler for PairingFlow {
    async fn start(&self, ctx: AuthContext, _input: AuthValues) -> Result<AuthStep, AuthError> {
        let app = &self.0;
        let prompt = app
            .pairings()
            .map_err(AuthError::internal)?
            .start(ctx.auth_session_id.clone(), ctx.channel.clone(), ctx.handle.now_millis())
            .await
            .map_err(AuthError::internal)?;
        Ok(AuthStep::Pending(app.prompt(&prompt, "open the link (or scan the code) and confirm")?))
    }

    async fn status(&self, ctx: AuthContext, refresh: bool) -> Result<AuthStep, AuthError> {
        let app = &self.0;
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

    async fn cancel(&self, ctx: AuthContext) {
        let cancelled = match self.0.pairings() {
            Ok(pairings) => pairings.cancel(&ctx.auth_session_id).await,
            Err(error) => Err(error),
        };
        if let Err(error) = cancelled {
            tracing::warn!(%error, "a cancelled pairing stays until it is pruned");
        }
    }
}

/// Sign-out (logout or unregistration): the room stays, without an agent.
async fn unbind(app: Arc<App>, ctx: ChannelContext) -> Result<(), AuthError> {
    if let Some(room) = app.room_of(&ctx.channel).await {
        app.hub.set_online(&room.room_id, false);
    }
    let store = app.store().map_err(AuthError::internal)?;
    store.release_channel(&ctx.channel).await.map_err(AuthError::internal)
}

/// A restored channel: the room row still names it, nothing to re-attach (the page
/// reconnects on its own). Re-bind when the row was lost (e.g. an older database).
async fn rebind(app: Arc<App>, ctx: ChannelContext, reason: BoundReason) {
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

/// Arguments of `webchat_message_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessageSendArgs {
    /// The text to show in the chat room, as the agent.
    pub text: String,
}

/// Arguments of `webchat_file_send`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct FileSendArgs {
    /// The file to show in the chat room.
    #[schemars(extend("x-xagent-upload-ref" = true))]
    pub file_ref: String,
    /// Optional text shown with the file.
    #[serde(default)]
    pub text: Option<String>,
}

/// The message id of a Tool send: derived from the call, so a repeat of the same call (even
/// after the runtime's idempotency window) shows one message.
fn tool_message_id(ctx: &ToolContext) -> String {
    use sha2::{Digest, Sha256};
    let key = ctx
        .tool_call_id
        .as_ref()
        .map(|id| id.to_string())
        .or_else(|| ctx.request_id.as_ref().map(|id| id.to_string()));
    match key {
        Some(key) => {
            let digest = Sha256::digest(format!("{}\n{}\n{key}", ctx.channel, ctx.tool_id));
            format!("msg_tool_{}", hex::encode(&digest[..12]))
        }
        None => format!("msg_tool_{}", crate::store::random_hex(12)),
    }
}

async fn tool_room(app: &App, ctx: &ToolContext) -> Result<Room, ToolError> {
    app.room_of(&ctx.channel).await.ok_or_else(|| {
        ToolError::permission_denied("this channel serves no chat room; sign in again")
    })
}

async fn message_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: MessageSendArgs,
) -> Result<Value, ToolError> {
    if args.text.trim().is_empty() {
        return Err(ToolError::new(ErrorCode::InvalidArguments, "text must not be empty"));
    }
    let room = tool_room(&app, &ctx).await?;
    let entry = ChatEntry {
        message_id: tool_message_id(&ctx),
        author: Author::Assistant,
        text: Some(args.text),
        files: vec![],
        status: EntryStatus::Shown,
        error: None,
        client_id: None,
        created_at: ctx.handle.now_millis(),
    };
    let shown =
        stage_agent_message(&app, &ctx, &room.room_id, entry).await.map_err(ToolError::internal)?;
    Ok(json!({ "status": "sent", "message_id": shown.message_id, "room_id": room.room_id }))
}

async fn file_send(
    app: Arc<App>,
    ctx: ToolContext,
    args: FileSendArgs,
) -> Result<Value, ToolError> {
    let room = tool_room(&app, &ctx).await?;
    let file_ref = FileRef::new(args.file_ref.as_str());
    let (record, _file) = ctx.handle.open_file(&ctx.channel, &file_ref).await.map_err(|_| {
        ToolError::new(
            ErrorCode::FileNotFound,
            "no such file on this channel (unknown or expired); send a file from this conversation",
        )
    })?;
    let entry = ChatEntry {
        message_id: tool_message_id(&ctx),
        author: Author::Assistant,
        text: args.text.filter(|t| !t.trim().is_empty()),
        files: vec![EntryFile {
            file_ref: record.file_ref.to_string(),
            filename: record.filename.clone(),
            mime_type: Some(record.mime_type.clone()),
            byte_size: Some(record.byte_size),
        }],
        status: EntryStatus::Shown,
        error: None,
        client_id: None,
        created_at: ctx.handle.now_millis(),
    };
    let shown =
        stage_agent_message(&app, &ctx, &room.room_id, entry).await.map_err(ToolError::internal)?;
    Ok(json!({ "status": "sent", "message_id": shown.message_id, "file_ref": record.file_ref }))
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
        .tool_with(
            &app,
            ToolSpec::new(
                TOOL_MESSAGE_SEND,
                "Send a web chat message\nShow an extra text message in the chat room bound to the current channel. Your normal reply is delivered without this tool.",
            ),
            message_send,
        )
        .tool_with(
            &app,
            ToolSpec::new(
                TOOL_FILE_SEND,
                "Send a file to the web chat\nShow a file from this conversation in the chat room bound to the current channel, with optional text.",
            ),
            file_send,
        )
        .build()?;
    Ok(connector)
}
