//! The Connector definition an author builds: Card metadata, typed Tools, auth flows, an IM
//! target and an optional Skill. The Card's `tools[]` is generated from the registered
//! handlers, so every declared Tool is callable.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use xagent_protocol_types::{
    AuthFlow, BuildInfo, CardTool, ChatMessage, ConnectorCard, ConnectorInfo, DescriptorTarget,
    ProfileId, Security, Supports, TargetDeclaration, TargetType, ToolId, UiHints, UserChannelMode,
};

use crate::author::{
    AuthContext, AuthError, AuthProvider, AuthStep, AuthValues, ChannelContext, DeliveryError,
    DeltaUpdate, FinalDelivery, ImTarget, NoAuth, ToolContext, ToolError,
};

pub(crate) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Object-safe face of [`AuthProvider`].
pub(crate) trait DynAuth: Send + Sync {
    fn start(&self, ctx: AuthContext, input: AuthValues)
    -> BoxFut<'_, Result<AuthStep, AuthError>>;
    fn status(&self, ctx: AuthContext, refresh: bool) -> BoxFut<'_, Result<AuthStep, AuthError>>;
    fn cancel(&self, ctx: AuthContext) -> BoxFut<'_, ()>;
    fn logout(&self, ctx: ChannelContext) -> BoxFut<'_, Result<(), AuthError>>;
    fn unregister(&self, ctx: ChannelContext) -> BoxFut<'_, ()>;
    fn restore(&self, ctx: ChannelContext) -> BoxFut<'_, ()>;
}

impl<A: AuthProvider> DynAuth for A {
    fn start(
        &self,
        ctx: AuthContext,
        input: AuthValues,
    ) -> BoxFut<'_, Result<AuthStep, AuthError>> {
        Box::pin(AuthProvider::start(self, ctx, input))
    }
    fn status(&self, ctx: AuthContext, refresh: bool) -> BoxFut<'_, Result<AuthStep, AuthError>> {
        Box::pin(AuthProvider::status(self, ctx, refresh))
    }
    fn cancel(&self, ctx: AuthContext) -> BoxFut<'_, ()> {
        Box::pin(AuthProvider::cancel(self, ctx))
    }
    fn logout(&self, ctx: ChannelContext) -> BoxFut<'_, Result<(), AuthError>> {
        Box::pin(AuthProvider::logout(self, ctx))
    }
    fn unregister(&self, ctx: ChannelContext) -> BoxFut<'_, ()> {
        Box::pin(AuthProvider::unregister(self, ctx))
    }
    fn restore(&self, ctx: ChannelContext) -> BoxFut<'_, ()> {
        Box::pin(AuthProvider::restore(self, ctx))
    }
}

/// Object-safe face of [`ImTarget`].
pub(crate) trait DynIm: Send + Sync {
    fn streams_deltas(&self) -> bool;
    fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> BoxFut<'_, Result<(), DeliveryError>>;
    fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> BoxFut<'_, Option<String>>;
    fn activity_capability(&self) -> xagent_profile_im::ActivityCapability;
    fn activity(
        &self,
        ctx: ChannelContext,
        action: xagent_profile_im::ActivityAction,
    ) -> BoxFut<'_, ()>;
}

impl<T: ImTarget> DynIm for T {
    fn streams_deltas(&self) -> bool {
        T::STREAMS_DELTAS
    }
    fn deliver(
        &self,
        ctx: ChannelContext,
        message: ChatMessage,
        how: FinalDelivery,
    ) -> BoxFut<'_, Result<(), DeliveryError>> {
        Box::pin(ImTarget::deliver(self, ctx, message, how))
    }
    fn delta(&self, ctx: ChannelContext, update: DeltaUpdate) -> BoxFut<'_, Option<String>> {
        Box::pin(ImTarget::delta(self, ctx, update))
    }
    fn activity_capability(&self) -> xagent_profile_im::ActivityCapability {
        T::ACTIVITY
    }
    fn activity(
        &self,
        ctx: ChannelContext,
        action: xagent_profile_im::ActivityAction,
    ) -> BoxFut<'_, ()> {
        Box::pin(ImTarget::activity(self, ctx, action))
    }
}

type ToolCall = dyn Fn(ToolContext, Map<String, Value>) -> BoxFut<'static, Result<Value, ToolError>>
    + Send
    + Sync;

/// One registered Tool: its Card declaration, the compiled argument schema and the handler.
pub(crate) struct RegisteredTool {
    pub(crate) card: CardTool,
    pub(crate) validator: jsonschema::Validator,
    pub(crate) call: Arc<ToolCall>,
    /// False for Tools registered with [`ConnectorBuilder::read_only_tool`]: no durable
    /// repeated-call record (concurrent repeats still share one run).
    pub(crate) records_calls: bool,
}

/// A problem in the Connector definition, found by [`ConnectorBuilder::build`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DefinitionError {
    /// A Tool id is empty, too long, or has characters other than ASCII letters, digits,
    /// `_`, `-`, `.`.
    #[error(
        "tool id {0:?} is not a valid model function name: use 1-256 ASCII letters, digits, '_', '-', '.'"
    )]
    BadToolId(String),
    /// Two Tools share an id.
    #[error("tool id {0:?} is registered twice; tool ids must be unique")]
    DuplicateTool(String),
    /// A Tool's argument type does not produce a usable object schema.
    #[error("tool {tool:?}: {reason}")]
    ToolSchema {
        /// The Tool.
        tool: String,
        /// Why.
        reason: String,
    },
    /// The Card fails validation.
    #[error("the generated Connector Card is invalid: {0}")]
    InvalidCard(String),
    /// The generated Card breaks hard rules of the protocol (`error` violations of
    /// `xagent_protocol_validate::validate_card`): a Connector never serves such a Card.
    /// Warnings are logged, not refused.
    #[error("the generated Connector Card breaks {} rule(s): {}", .0.len(), join_violations(.0))]
    CardViolations(Vec<xagent_protocol_validate::Violation>),
    /// The Card declares an IM Profile but no IM target was given.
    #[error("the Card declares {0} but no ImTarget was registered; call .im_target(...)")]
    MissingImTarget(String),
    /// The Card declares auth flows but no provider was given.
    #[error("the Card declares auth flows but no AuthProvider was registered; call .auth(...)")]
    MissingAuthProvider,
}

/// A complete Connector definition: the Card and the code behind it. Build it with
/// [`Connector::builder`] and serve it with [`crate::ConnectorServer`].
pub struct Connector {
    pub(crate) card: ConnectorCard,
    pub(crate) tools: HashMap<ToolId, RegisteredTool>,
    pub(crate) auth: Arc<dyn DynAuth>,
    pub(crate) im: Option<Arc<dyn DynIm>>,
    pub(crate) skill: Option<String>,
    pub(crate) unbound_target: DescriptorTarget,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("card_id", &self.card.connector_card_id)
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// Starts a definition with the fixed identity: Card id (e.g. `im.echo`), display name and
    /// implementation version.
    pub fn builder(
        card_id: impl Into<String>,
        name: impl Into<String>,
        version: impl Into<String>,
    ) -> ConnectorBuilder {
        ConnectorBuilder {
            card_id: card_id.into(),
            info: ConnectorInfo::new(name, version),
            build: crate::runtime_build_info(),
            target_types: Vec::new(),
            targets: Vec::new(),
            profiles: Vec::new(),
            user_channel_mode: None,
            auth_flows: Vec::new(),
            security: None,
            ui: None,
            skill: None,
            tools: Vec::new(),
            errors: Vec::new(),
            auth: None,
            im: None,
        }
    }

    /// The generated Connector Card.
    pub fn card(&self) -> &ConnectorCard {
        &self.card
    }

    /// The primary Skill (Markdown), if any.
    pub fn skill(&self) -> Option<&str> {
        self.skill.as_deref()
    }
}

/// Builder of a [`Connector`].
pub struct ConnectorBuilder {
    card_id: String,
    info: ConnectorInfo,
    build: BuildInfo,
    target_types: Vec<TargetType>,
    targets: Vec<TargetDeclaration>,
    profiles: Vec<ProfileId>,
    user_channel_mode: Option<UserChannelMode>,
    auth_flows: Vec<AuthFlow>,
    security: Option<Security>,
    ui: Option<UiHints>,
    skill: Option<String>,
    tools: Vec<RegisteredTool>,
    errors: Vec<DefinitionError>,
    auth: Option<Arc<dyn DynAuth>>,
    im: Option<Arc<dyn DynIm>>,
}

impl ConnectorBuilder {
    /// Sets the vendor.
    #[must_use]
    pub fn vendor(mut self, vendor: impl Into<String>) -> Self {
        self.info = self.info.with_vendor(vendor);
        self
    }

    /// Sets the description.
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.info = self.info.with_description(description);
        self
    }

    /// Replaces the build stamp (default: the runtime's; use [`crate::build_info!`] for yours).
    #[must_use]
    pub fn build_info(mut self, build: BuildInfo) -> Self {
        self.build = build;
        self
    }

    /// Declares a concrete target (its type joins `supports.target_types`).
    #[must_use]
    pub fn target(mut self, target: TargetDeclaration) -> Self {
        if !self.target_types.contains(&target.target_type) {
            self.target_types.push(target.target_type.clone());
        }
        self.targets.push(target);
        self
    }

    /// Declares a Profile in `supports.profiles`.
    #[must_use]
    pub fn profile(mut self, profile: impl Into<ProfileId>) -> Self {
        let profile = profile.into();
        if !self.profiles.contains(&profile) {
            self.profiles.push(profile);
        }
        self
    }

    /// Sets `supports.user_channel_mode`.
    #[must_use]
    pub fn user_channel_mode(mut self, mode: UserChannelMode) -> Self {
        self.user_channel_mode = Some(mode);
        self
    }

    /// Declares an auth flow; its steps are run by the [`AuthProvider`] given to `.auth(...)`.
    #[must_use]
    pub fn auth_flow(mut self, flow: AuthFlow) -> Self {
        self.auth_flows.push(flow);
        self
    }

    /// Sets the code behind the auth flows.
    #[must_use]
    pub fn auth(mut self, provider: impl AuthProvider) -> Self {
        self.auth = Some(Arc::new(provider));
        self
    }

    /// Sets the IM target (required when an IM Profile is declared).
    #[must_use]
    pub fn im_target(mut self, target: impl ImTarget) -> Self {
        self.im = Some(Arc::new(target));
        self
    }

    /// Sets the security declarations.
    #[must_use]
    pub fn security(mut self, security: Security) -> Self {
        self.security = Some(security);
        self
    }

    /// Sets the UI hints.
    #[must_use]
    pub fn ui(mut self, ui: UiHints) -> Self {
        self.ui = Some(ui);
        self
    }

    /// Sets the primary Skill (Markdown served at `/skill.md`).
    #[must_use]
    pub fn skill(mut self, markdown: impl Into<String>) -> Self {
        self.skill = Some(markdown.into());
        self
    }

    /// Registers a Tool. `Args` describes the model arguments (its JSON Schema becomes the
    /// Tool's `input_schema`, with `connector_channel_id` injected); the handler gets the
    /// validated, typed arguments. The Tool belongs to the first declared Profile.
    #[must_use]
    pub fn tool<Args, F, Fut>(
        self,
        tool_id: &str,
        title: &str,
        description: &str,
        handler: F,
    ) -> Self
    where
        Args: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(ToolContext, Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        self.add_tool(register_tool::<Args, F, Fut>(tool_id, title, description, handler))
    }

    /// Registers a Tool without side effects (an observation: a status, a lookup, a no-op).
    /// It is declared and called like [`ConnectorBuilder::tool`], but a repeated call after
    /// the first has finished runs again instead of being answered from a durable record:
    /// re-running it is harmless, and it spares a storage write on every call. Concurrent
    /// repeats of one `tool_call_id` still share one run. Never use it for a Tool that changes
    /// anything in the target system.
    pub fn read_only_tool<Args, F, Fut>(
        self,
        tool_id: &str,
        title: &str,
        description: &str,
        handler: F,
    ) -> Self
    where
        Args: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(ToolContext, Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        let registered = register_tool::<Args, F, Fut>(tool_id, title, description, handler)
            .map(|tool| RegisteredTool { records_calls: false, ..tool });
        self.add_tool(registered)
    }

    fn add_tool(mut self, registered: Result<RegisteredTool, DefinitionError>) -> Self {
        match registered {
            Ok(tool) => {
                let tool_id = tool.card.tool_id.to_string();
                if self.tools.iter().any(|t| t.card.tool_id.as_str() == tool_id) {
                    self.errors.push(DefinitionError::DuplicateTool(tool_id));
                } else {
                    self.tools.push(tool);
                }
            }
            Err(error) => self.errors.push(error),
        }
        self
    }

    /// Checks and assembles the definition.
    pub fn build(mut self) -> Result<Connector, DefinitionError> {
        if let Some(error) = self.errors.drain(..).next() {
            return Err(error);
        }
        let mut supports = Supports::new(self.target_types.clone(), self.profiles.clone());
        supports.targets = self.targets.clone();
        supports.user_channel_mode = self.user_channel_mode.clone();
        let mut card = ConnectorCard::new(self.card_id.clone(), self.build, self.info, supports);
        let default_profile = self.profiles.first().cloned();
        let mut tools = HashMap::new();
        for mut tool in self.tools {
            if tool.card.profile.is_none() {
                tool.card.profile = default_profile.clone();
            }
            card.tools.push(tool.card.clone());
            tools.insert(tool.card.tool_id.clone(), tool);
        }
        card.auth_flows = self.auth_flows;
        card.ui = self.ui;
        card.security = self.security;
        let im_profile =
            self.profiles.iter().find(|p| p.as_str() == xagent_protocol_types::PROFILE_IM_V2);
        if let (Some(profile), None) = (im_profile, &self.im) {
            return Err(DefinitionError::MissingImTarget(profile.to_string()));
        }
        let auth: Arc<dyn DynAuth> = match self.auth {
            Some(auth) => auth,
            None if card.auth_flows.is_empty() => Arc::new(NoAuth),
            None => return Err(DefinitionError::MissingAuthProvider),
        };
        let unbound_target = match self.targets.first() {
            Some(target) => DescriptorTarget::new(
                target.provider.clone(),
                format!("{} not bound", target.label),
            )
            .with_label(target.label.clone()),
            None => DescriptorTarget::new(card.connector_card_id.to_string(), "not bound"),
        };
        check_card(&card)?;
        Ok(Connector { card, tools, auth, im: self.im, skill: self.skill, unbound_target })
    }
}

/// Runs the protocol's Card validator on the serialised Card: every `error` violation refuses
/// the definition, warnings are logged.
fn check_card(card: &ConnectorCard) -> Result<(), DefinitionError> {
    let value = serde_json::to_value(card).map_err(|error| {
        DefinitionError::InvalidCard(format!("the Card does not serialise: {error}"))
    })?;
    let report = xagent_protocol_validate::validate_card(&value);
    for warning in report.warnings() {
        tracing::warn!(rule = %warning.rule, path = %warning.path, "Connector Card: {}", warning.message);
    }
    let errors: Vec<_> = report.errors().cloned().collect();
    if errors.is_empty() { Ok(()) } else { Err(DefinitionError::CardViolations(errors)) }
}

fn join_violations(violations: &[xagent_protocol_validate::Violation]) -> String {
    violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

fn register_tool<Args, F, Fut>(
    tool_id: &str,
    title: &str,
    description: &str,
    handler: F,
) -> Result<RegisteredTool, DefinitionError>
where
    Args: DeserializeOwned + JsonSchema + Send + 'static,
    F: Fn(ToolContext, Args) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
{
    let valid_id = !tool_id.is_empty()
        && tool_id.len() <= xagent_protocol_types::TOOL_ID_MAX_LEN
        && tool_id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid_id {
        return Err(DefinitionError::BadToolId(tool_id.to_owned()));
    }
    let schema_error =
        |reason: String| DefinitionError::ToolSchema { tool: tool_id.to_owned(), reason };
    let generated = schemars::schema_for!(Args).to_value();
    let mut schema = match generated {
        Value::Object(map) => map,
        _ => {
            return Err(schema_error(
                "the argument type must be a struct (an object schema)".into(),
            ));
        }
    };
    schema.remove("$schema");
    schema.remove("title");
    let schema = xagent_protocol_validate::with_connector_channel_id(&schema)
        .map_err(|error| schema_error(error.to_string()))?;
    let validator = jsonschema::validator_for(&Value::Object(schema.clone()))
        .map_err(|error| schema_error(format!("the input schema does not compile: {error}")))?;
    let handler = Arc::new(handler);
    let call: Arc<ToolCall> =
        Arc::new(move |ctx: ToolContext, mut arguments: Map<String, Value>| {
            let handler = Arc::clone(&handler);
            // The model's copy of the channel is forwarded but never consumed: routing uses the
            // envelope only.
            arguments.remove(xagent_protocol_types::CHANNEL_ARGUMENT);
            Box::pin(async move {
                let args: Args =
                    serde_json::from_value(Value::Object(arguments)).map_err(|error| {
                        ToolError::new(
                            xagent_protocol_types::ErrorCode::InvalidArguments,
                            format!("the arguments do not match the tool's input schema: {error}"),
                        )
                    })?;
                handler(ctx, args).await
            }) as BoxFut<'static, Result<Value, ToolError>>
        });
    let card = CardTool::new(tool_id, schema).with_title(title).with_description(description);
    Ok(RegisteredTool { card, validator, call, records_calls: true })
}
