//! The `im.matrix` Connector put together: its options, the Card with the `matrix_room` flow,
//! the IM target and the two Tools, and [`Matrix`], which logs the bot in and runs the
//! runtime with the sync loop. The parts live in the crate's private modules; the names
//! other crates use are re-exported here.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_sdk::Client;
use matrix_sdk::ruma::OwnedUserId;
use xagent_protocol_types::{
    Clock, PROFILE_IM_V2, Secret, Security, SystemClock, TargetDeclaration, TargetType, TrustLevel,
};
use xagent_server_runtime::{
    BoundReason, ChannelContext, Connector, ConnectorServer, FlowSpec, RuntimeConfig, ServerError,
};

use crate::MatrixError;
use crate::app::App;
use crate::bot::{self, Credentials};
use crate::delivery::MatrixTarget;
use crate::flow::RoomFlow;
use crate::pairing::Pairing;
use crate::tools::MatrixSender;

pub use crate::delivery::{MAX_EVENT_TEXT_BYTES, split_text};
pub use crate::intake::{message_id_of, refused_notice};
pub use crate::names::{CARD_ID, PROVIDER, ROOM_FLOW, SKILL, TOOL_FILE_SEND, TOOL_MESSAGE_SEND};
pub use crate::sync::UNBOUND_ROOM_TTL_MS;

/// How long fetching one inbound file may take (by default; [`MatrixOptions::download_timeout`]).
pub const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings of an `im.matrix` Connector.
pub struct MatrixOptions {
    /// The homeserver's client API, e.g. `https://matrix.example.org`.
    pub homeserver: String,
    /// The bot's user id, `@bot:example.org`.
    pub user: String,
    /// How the bot logs in.
    pub credentials: Credentials,
    /// Where the runtime keeps its database and files, and the bot its session and stores.
    pub state_dir: PathBuf,
    /// The system API key xAgent must present.
    pub api_key: Option<Secret>,
    /// The runtime's limits and timings (the HTTP listener's among them).
    pub runtime: RuntimeConfig,
    /// The clock the runtime and the bot read (pairing codes, rates, leaving idle rooms);
    /// tests move a [`xagent_protocol_types::ManualClock`] instead of waiting.
    pub clock: Arc<dyn Clock>,
    /// How long a file posted in a room may take to download from the media repository
    /// before the agent is told it could not be fetched (the sync waits meanwhile).
    pub download_timeout: Duration,
    /// The least time between two edits of a streamed reply.
    pub edit_interval: Duration,
    /// The largest file taken from or posted to a room.
    pub max_file_bytes: u64,
    /// Rooms the bot stays in without a channel (invites beyond it are declined).
    pub max_unbound_rooms: usize,
    /// Inbound messages taken per room and minute (more are dropped, with a note in the room).
    pub room_messages_per_minute: u32,
    /// How long the homeserver may stay unreachable before channels show `offline`.
    pub offline_after: Duration,
    /// The runtime's state in this PostgreSQL database (feature `postgres`).
    #[cfg(feature = "postgres")]
    pub database_url: Option<xagent_server_runtime::ops::DatabaseUrl>,
}

impl MatrixOptions {
    /// Options with the defaults for everything but the account and the state directory.
    pub fn new(
        homeserver: impl Into<String>,
        user: impl Into<String>,
        credentials: Credentials,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            homeserver: homeserver.into(),
            user: user.into(),
            credentials,
            state_dir: state_dir.into(),
            api_key: None,
            runtime: RuntimeConfig::default(),
            clock: Arc::new(SystemClock),
            download_timeout: DOWNLOAD_TIMEOUT,
            edit_interval: Duration::from_millis(1_000),
            max_file_bytes: 25 * 1024 * 1024,
            max_unbound_rooms: 20,
            room_messages_per_minute: 60,
            offline_after: Duration::from_secs(30),
            #[cfg(feature = "postgres")]
            database_url: None,
        }
    }
}

impl std::fmt::Debug for MatrixOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The credentials and the API key print redacted (they are `Secret`s).
        f.debug_struct("MatrixOptions")
            .field("homeserver", &self.homeserver)
            .field("user", &self.user)
            .field("credentials", &self.credentials)
            .field("state_dir", &self.state_dir)
            .field("api_key", &self.api_key)
            .field("runtime", &self.runtime)
            .field("download_timeout", &self.download_timeout)
            .field("edit_interval", &self.edit_interval)
            .field("max_file_bytes", &self.max_file_bytes)
            .field("max_unbound_rooms", &self.max_unbound_rooms)
            .field("room_messages_per_minute", &self.room_messages_per_minute)
            .field("offline_after", &self.offline_after)
            .finish_non_exhaustive()
    }
}

/// The shared state of a new Connector: no room paired yet, the limits from `options`.
fn new_app(client: Client, user: OwnedUserId, options: &MatrixOptions) -> App {
    App {
        client,
        link: format!("https://matrix.to/#/{user}"),
        bot: user,
        pairing: Mutex::new(Pairing::new()),
        prompts: Mutex::default(),
        paired: Mutex::default(),
        rooms: Mutex::default(),
        held: Mutex::default(),
        streams: Mutex::default(),
        rates: Mutex::default(),
        utd: Mutex::default(),
        unbound_since: Mutex::default(),
        edit_interval: options.edit_interval,
        max_file_bytes: options.max_file_bytes,
        download_timeout: options.download_timeout,
        max_unbound_rooms: options.max_unbound_rooms,
        room_messages_per_minute: options.room_messages_per_minute,
        offline_after: options.offline_after,
    }
}

/// The definition: Card, `matrix_room` flow, bound/unbound hooks, IM target, Skill and Tools.
fn build(app: &Arc<App>) -> Result<Connector, xagent_server_runtime::DefinitionError> {
    let (bound_app, unbound_app) = (Arc::clone(app), Arc::clone(app));
    Connector::builder(CARD_ID, "Matrix", env!("CARGO_PKG_VERSION"))
        .description("Puts an xAgent agent in Matrix rooms, end-to-end encrypted ones too: room members chat with it in any Matrix client.")
        .vendor("xagent-connector-rs")
        .target(TargetDeclaration::new(TargetType::Im, PROVIDER, "Matrix"))
        .profile(PROFILE_IM_V2)
        .security(Security::new(TrustLevel::Local, true).with_data_class("message").with_data_class("file"))
        .qr_flow(
            FlowSpec::new(ROOM_FLOW, "Pair a Matrix room").description(
                "Invite the bot to your room (the link opens its profile), then post the pairing code there.",
            ),
            RoomFlow(Arc::clone(app)),
        )
        .on_bound(move |ctx: ChannelContext, _reason: BoundReason| {
            let app = Arc::clone(&bound_app);
            async move { app.bound(&ctx).await }
        })
        .on_unbound(move |ctx: ChannelContext| {
            let app = Arc::clone(&unbound_app);
            async move {
                app.unbound(&ctx).await;
                Ok(())
            }
        })
        .im_target(MatrixTarget(Arc::clone(app)))
        .skill(SKILL)
        .im_send_tools(PROVIDER, MatrixSender(Arc::clone(app)))
        .build()
}

/// A running `im.matrix` Connector: the bot's client and the runtime.
pub struct Matrix {
    client: Client,
    server: ConnectorServer,
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Matrix").field("user", &self.client.user_id()).finish_non_exhaustive()
    }
}

impl Matrix {
    /// Logs the bot in (or restores its session) and builds the runtime; [`Matrix::serve`]
    /// starts the sync loop with the server.
    pub async fn open(options: MatrixOptions) -> Result<Self, MatrixError> {
        let user: OwnedUserId = options.user.as_str().try_into().map_err(|_| {
            MatrixError::Config(format!(
                "--user {:?} is not a Matrix user id like @bot:example.org",
                options.user
            ))
        })?;
        std::fs::create_dir_all(&options.state_dir).map_err(|e| {
            MatrixError::State(format!("create {}: {e}", options.state_dir.display()))
        })?;
        let client =
            bot::open(&options.homeserver, user.as_str(), &options.credentials, &options.state_dir)
                .await?;
        let app = Arc::new(new_app(client.clone(), user, &options));
        let connector = build(&app).map_err(ServerError::from)?;
        let mut builder = ConnectorServer::builder(connector);
        #[cfg(feature = "postgres")]
        if let Some(url) = options.database_url.clone() {
            builder = builder.database_url(url);
        }
        let sync_app = Arc::clone(&app);
        builder = builder
            .config(options.runtime)
            .clock(options.clock)
            .state_dir(&options.state_dir)?
            .task(move |handle, shutdown| sync_app.sync_loop(handle, shutdown));
        if let Some(key) = options.api_key {
            builder = builder.api_key(key);
        }
        let server = builder.build().await?;
        Ok(Self { client, server })
    }

    /// The runtime (handle, Card, router).
    pub fn server(&self) -> &ConnectorServer {
        &self.server
    }

    /// The bot's Matrix client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        self.server.serve(listener, shutdown).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::Secret;

    /// The definition as the runtime builds it: its Card and Skill went through the
    /// protocol's validators (`card.tool_wire_reference`, `skill.wire_reference` among them).
    async fn definition() -> Connector {
        let homeserver = "http://127.0.0.1:9";
        let client = Client::builder().homeserver_url(homeserver).build().await.expect("client");
        let user = OwnedUserId::try_from("@bot:example.org").expect("user id");
        let credentials = Credentials::Password(Secret::new("unused"));
        let options = MatrixOptions::new(homeserver, user.as_str(), credentials, "unused");
        build(&Arc::new(new_app(client, user, &options))).expect("the validators accept it")
    }

    #[tokio::test]
    async fn the_tool_ids_and_argument_names_stay_what_callers_use() {
        let connector = definition().await;
        let tools: Vec<(String, Vec<String>)> = connector
            .card()
            .tools
            .iter()
            .map(|tool| {
                let properties = tool.input_schema["properties"].as_object().expect("properties");
                (tool.tool_id.to_string(), properties.keys().cloned().collect())
            })
            .collect();
        // The runtime adds `connector_channel_id` to every Tool's arguments.
        let names = |list: &[&str]| list.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            tools,
            [
                (TOOL_MESSAGE_SEND.to_owned(), names(&["connector_channel_id", "text"])),
                (TOOL_FILE_SEND.to_owned(), names(&["connector_channel_id", "file_ref", "text"])),
            ]
        );
        assert_eq!(
            (TOOL_MESSAGE_SEND, TOOL_FILE_SEND),
            ("matrix_message_send", "matrix_file_send")
        );
    }

    /// The texts the model reads, whitespace folded: the Skill, each Tool's title and
    /// description, and its arguments' descriptions.
    fn model_texts(connector: &Connector) -> Vec<String> {
        let mut texts = vec![SKILL.to_owned()];
        for tool in &connector.card().tools {
            texts.extend(tool.title.clone());
            texts.extend(tool.description.clone());
            for property in tool.input_schema["properties"].as_object().into_iter().flatten() {
                texts.extend(property.1["description"].as_str().map(str::to_owned));
            }
        }
        texts.iter().map(|t| t.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
    }

    /// Protocol section 5: the model hands over a file of the conversation and xAgent moves
    /// its bytes, so the texts point to such a file and never ask the model to upload one
    /// (the runtime's validators, run by `definition`, refuse Transfer Plane paths and packets).
    #[tokio::test]
    async fn the_file_texts_point_to_a_file_of_the_conversation_not_to_an_upload() {
        let connector = definition().await;
        let texts = model_texts(&connector);
        for text in &texts {
            assert!(!text.to_lowercase().contains("upload"), "{text}");
        }
        let file_ref = connector
            .card()
            .tools
            .iter()
            .find(|tool| tool.tool_id.as_str() == TOOL_FILE_SEND)
            .map(|tool| &tool.input_schema["properties"]["file_ref"]["description"]);
        let said = file_ref.and_then(|d| d.as_str()).expect("file_ref has a description");
        assert!(said.contains("from this conversation"), "{said}");
        assert!(texts[0].contains("`matrix_file_send` posts a file from this conversation"));
    }
}
