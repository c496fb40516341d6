//! The Connector definition an author builds: Card metadata, typed Tools, auth flows declared
//! with their code, an IM target, hooks and an optional Skill. The Card's `tools[]` and
//! `auth_flows[]` are generated from what is registered, so every declared Tool is callable
//! and every declared flow is handled.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use xagent_protocol_types::{
    AuthFlow, BuildInfo, ConnectorCard, ConnectorInfo, DescriptorTarget, FlowId, PROFILE_DEVICE_V1,
    ProfileId, Security, TargetDeclaration, TargetType, ToolId, UiHints, UserChannelMode,
};

use crate::author::auth::form_fields;
use crate::author::call::DeviceCode;
use crate::author::call::{AuthCode, BoundHook, DynFlow, FormFlow, ImCode, UnboundHook, WithState};
use crate::author::tool::{RegisteredTool, register};
use crate::author::{
    AuthContext, AuthError, AuthStep, Binding, BoundReason, ChannelContext, FlowHandler, FlowSpec,
    ImTarget, ToolContext, ToolError, ToolSpec,
};
use crate::author::{DeviceConfig, DeviceTarget, RiskLevel, ToolCategory};
use crate::error::DefinitionError;

/// A complete Connector definition: the Card and the code behind it. Build it with
/// [`Connector::builder`] and serve it with [`crate::ConnectorServer`].
pub struct Connector {
    pub(crate) card: ConnectorCard,
    /// Looked up on every `tool.invoke` by the peer's Tool id: the seeded foldhash
    /// (docs/DECISIONS.md, "Hashers of internal maps").
    pub(crate) tools: HashMap<ToolId, RegisteredTool, foldhash::fast::RandomState>,
    pub(crate) auth: AuthCode,
    pub(crate) im: Option<ImCode>,
    pub(crate) device: Option<crate::device::DeviceDef>,
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
    /// the author's implementation version. The build stamp defaults to that version and the
    /// build time of the running executable (`YYMMDDHHMM`, UTC); see
    /// [`ConnectorBuilder::build_info`].
    pub fn builder(
        card_id: impl Into<String>,
        name: impl Into<String>,
        version: impl Into<String>,
    ) -> ConnectorBuilder {
        let version = version.into();
        ConnectorBuilder {
            card_id: card_id.into(),
            build: crate::build_info::executable_build_info(&version),
            info: ConnectorInfo::new(name, version),
            target_types: Vec::new(),
            targets: Vec::new(),
            profiles: Vec::new(),
            user_channel_mode: None,
            flows: Vec::new(),
            security: None,
            ui: None,
            skill: None,
            tools: Vec::new(),
            errors: Vec::new(),
            auth: AuthCode::default(),
            im: None,
            device: None,
            device_tools: Vec::new(),
            unconstrained: Vec::new(),
            state: (),
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

    /// The binding of a channel of a Connector without auth flows: the first target's facts.
    pub(crate) fn open_binding(&self) -> Binding {
        let target = match self.card.supports.targets.first() {
            Some(target) => DescriptorTarget::new(target.provider.clone(), target.label.clone())
                .with_label(target.label.clone()),
            None => DescriptorTarget::new(
                self.card.connector_card_id.to_string(),
                self.card.connector.name.clone(),
            ),
        };
        // No flow chose a target type: the negotiated Profiles decide it
        // (`Shared::channel_target_type`).
        Binding::new(target)
    }
}

/// A flow as registered; its Card entry is made at build, when the target type is known.
enum PendingFlow {
    Declared(Box<AuthFlow>),
    Qr(FlowSpec),
    Form(FlowSpec, Vec<xagent_protocol_types::AuthField>),
}

/// Builder of a [`Connector`]. `S` is the Connector's state, set with
/// [`ConnectorBuilder::state`] (`()` without one): every handler registered after it gets the
/// state in its context.
pub struct ConnectorBuilder<S = ()> {
    card_id: String,
    info: ConnectorInfo,
    build: BuildInfo,
    target_types: Vec<TargetType>,
    targets: Vec<TargetDeclaration>,
    profiles: Vec<ProfileId>,
    user_channel_mode: Option<UserChannelMode>,
    flows: Vec<PendingFlow>,
    security: Option<Security>,
    ui: Option<UiHints>,
    skill: Option<String>,
    tools: Vec<RegisteredTool>,
    errors: Vec<DefinitionError>,
    auth: AuthCode,
    im: Option<ImCode>,
    device: Option<(DeviceCode, DeviceConfig)>,
    device_tools: Vec<(ToolId, ToolCategory, RiskLevel)>,
    /// Device Tool arguments the operator explicitly allowed to stay unconstrained
    /// (Tool id, JSON pointer of the property).
    unconstrained: Vec<(ToolId, String)>,
    /// Handed to every handler registered on this builder (a clone per call).
    state: S,
}

impl<S: Clone + Send + Sync + 'static> ConnectorBuilder<S> {
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

    /// Replaces the build stamp (default: the version given to [`Connector::builder`] and the
    /// executable's build time; [`crate::build_info!`] adds your crate's git revision).
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

    /// Declares a form flow and its code in one place. The fields are generated from `Form`
    /// (`#[derive(Deserialize, JsonSchema)]`): one field per property, doc comments as labels,
    /// a [`xagent_protocol_types::Secret`] property as a password field; required fields are
    /// checked before `handler` runs, which gets the typed input.
    #[must_use]
    pub fn form_flow<Form, F, Fut>(mut self, spec: FlowSpec, handler: F) -> Self
    where
        Form: DeserializeOwned + JsonSchema + Send + 'static,
        F: Fn(AuthContext<S>, Form) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<AuthStep, AuthError>> + Send + 'static,
    {
        match form_fields::<Form>() {
            Ok(fields) => {
                let code = FormFlow { handler, form: std::marker::PhantomData::<fn() -> Form> };
                let code = self.bind(code);
                self.add_flow(PendingFlow::Form(spec.clone(), fields), &spec.id, Arc::new(code))
            }
            Err(reason) => {
                self.errors.push(DefinitionError::FlowForm { flow: spec.id.to_string(), reason });
                self
            }
        }
    }

    /// Declares a QR-login flow and its code in one place.
    #[must_use]
    pub fn qr_flow(self, spec: FlowSpec, handler: impl FlowHandler<S>) -> Self {
        let id = spec.id.clone();
        let code = self.bind(handler);
        self.add_flow(PendingFlow::Qr(spec), &id, Arc::new(code))
    }

    /// Declares any auth flow (a Card entry written by hand) with its code.
    #[must_use]
    pub fn auth_flow_with(self, flow: AuthFlow, handler: impl FlowHandler<S>) -> Self {
        let id = flow.id.clone();
        let code = self.bind(handler);
        self.add_flow(PendingFlow::Declared(Box::new(flow)), &id, Arc::new(code))
    }

    /// Author code with this builder's state bound to it.
    fn bind<C>(&self, code: C) -> WithState<C, S> {
        WithState { code, state: self.state.clone() }
    }

    fn add_flow(mut self, flow: PendingFlow, id: &FlowId, code: Arc<dyn DynFlow>) -> Self {
        if self.auth.flows.insert(id.clone(), code).is_some() {
            self.errors.push(DefinitionError::DuplicateFlow(id.to_string()));
        }
        self.flows.push(flow);
        self
    }

    /// Runs `hook` whenever a channel becomes bound: after a sign-in, for each signed-in
    /// channel restored at startup, and when a Connector without auth flows opens a channel.
    /// The place to attach target consumers ([`crate::ConnectorHandle::attach_consumer`]).
    /// Contained: a panic is logged and the channel stays usable.
    #[must_use]
    pub fn on_bound<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(ChannelContext<S>, BoundReason) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let state = self.state.clone();
        let hook: Arc<BoundHook> = Arc::new(move |ctx: ChannelContext, reason| {
            Box::pin(hook(ctx.with_state(state.clone()), reason))
        });
        self.auth.on_bound = Some(hook);
        self
    }

    /// Runs `hook` when a channel is signed out (`auth.logout`) or unregistered (lease
    /// expiry): sign out in the target system. An error refuses the logout.
    #[must_use]
    pub fn on_unbound<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(ChannelContext<S>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), AuthError>> + Send + 'static,
    {
        let state = self.state.clone();
        let hook: Arc<UnboundHook> =
            Arc::new(move |ctx: ChannelContext| Box::pin(hook(ctx.with_state(state.clone()))));
        self.auth.on_unbound = Some(hook);
        self
    }

    /// Sets the IM target (required when an IM Profile is declared).
    #[must_use]
    pub fn im_target(mut self, target: impl ImTarget<S>) -> Self {
        self.im = Some(ImCode(Arc::new(self.bind(target))));
        self
    }

    /// Sets a simple IM target from one closure: each final `chat.message` from xAgent is
    /// handed to `deliver` once (the runtime answers duplicates, streams deltas into the final
    /// message, and acks). `deliver` returns `()` or `Result<(), DeliveryError>`. Use [`ConnectorBuilder::im_target`] for edits, deltas or activity.
    #[must_use]
    pub fn on_message<F, Fut>(self, deliver: F) -> Self
    where
        F: Fn(ChannelContext<S>, xagent_protocol_types::ChatMessage) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: crate::author::im::DeliveryOutcome,
    {
        self.im_target(crate::author::im::DeliverFn(deliver))
    }

    /// Sets the device target (Device Profile v1) and the device policies (serialisation,
    /// timeouts, high-risk Tools, device sharing; see [`DeviceConfig`]).
    #[must_use]
    pub fn device_target(mut self, target: impl DeviceTarget<S>, config: DeviceConfig) -> Self {
        self.device = Some((DeviceCode(Arc::new(self.bind(target))), config));
        self
    }

    /// Registers a device Tool: like [`ConnectorBuilder::tool`], plus its category and risk.
    /// Control Tools run one at a time per channel and their repeated calls are answered
    /// from the stored outcome; observation and media Tools run concurrently and are
    /// read-only. A high-risk Tool needs a confirmation (or is refused) as the
    /// [`DeviceConfig`] says. The build fails when the argument type lets the model supply a
    /// device fact (serial, address, platform account).
    #[must_use]
    pub fn device_tool<Args, Out, F, Fut>(
        mut self,
        spec: ToolSpec,
        category: ToolCategory,
        risk: RiskLevel,
        handler: F,
    ) -> Self
    where
        Args: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + JsonSchema + Send + 'static,
        F: Fn(ToolContext<S>, Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Out, ToolError>> + Send + 'static,
    {
        let spec = if category == ToolCategory::Control { spec } else { spec.read_only() };
        // A device Tool belongs to the Device Profile unless its spec says otherwise (not to
        // the Card's first Profile, which may be an IM one on a Card declaring both).
        let spec = if spec.has_profile() { spec } else { spec.profile(PROFILE_DEVICE_V1) };
        let registered = register(spec, self.with_state(handler));
        if let Ok(tool) = &registered {
            self.device_tools.push((tool.card.tool_id.clone(), category, risk));
        }
        self.add_tool(registered)
    }

    /// The operator's explicit opt-out of a Device v1 safety rule for one argument: the build
    /// otherwise refuses a device Tool whose `property` (a name like `command`, or a JSON
    /// pointer like `/steps/command` for a nested one) accepts a free-form command or file
    /// bytes. The model can then send anything there: use it only for a device you would give
    /// a shell to anyway, and say so in the Connector's docs (docs/DEVICE.md).
    #[must_use]
    pub fn allow_unconstrained_device_argument(
        mut self,
        tool: impl Into<ToolId>,
        property: impl Into<String>,
    ) -> Self {
        let property = property.into();
        let pointer = if property.starts_with('/') { property } else { format!("/{property}") };
        self.unconstrained.push((tool.into(), pointer));
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

    /// Registers a Tool declared by `spec`. `Args`' JSON Schema becomes the `input_schema`
    /// (with `connector_channel_id` injected), `Out`'s the `output_schema` (none for
    /// `serde_json::Value`); the handler gets the validated, typed arguments and returns a
    /// typed result. The Tool belongs to the spec's Profile, or the first declared one.
    #[must_use]
    pub fn tool<Args, Out, F, Fut>(self, spec: ToolSpec, handler: F) -> Self
    where
        Args: DeserializeOwned + JsonSchema + Send + 'static,
        Out: Serialize + JsonSchema + Send + 'static,
        F: Fn(ToolContext<S>, Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Out, ToolError>> + Send + 'static,
    {
        let handler = self.with_state(handler);
        self.add_tool(register(spec, handler))
    }

    /// A Tool handler taking `ToolContext<S>` as one the runtime calls with `ToolContext`.
    fn with_state<Args, Fut>(
        &self,
        handler: impl Fn(ToolContext<S>, Args) -> Fut + Send + Sync + 'static,
    ) -> impl Fn(ToolContext, Args) -> Fut + Send + Sync + 'static {
        let state = self.state.clone();
        move |ctx: ToolContext, args| handler(ctx.with_state(state.clone()), args)
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
}

mod build;
mod im_tools;
mod state;
