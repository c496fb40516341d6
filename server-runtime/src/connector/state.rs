//! [`ConnectorBuilder::state`]: the one author state of a Connector, handed to every handler
//! registered after it.

use super::ConnectorBuilder;

impl ConnectorBuilder {
    /// Sets the Connector's state: one value every handler registered after this call gets
    /// in its context ([`crate::ToolContext::state`], [`crate::AuthContext::state`],
    /// [`crate::ChannelContext::state`]), a clone per call, so handlers can be plain `async fn`s and
    /// nothing is cloned by hand. Tools, form flows, hooks and `on_message` get it; so do
    /// [`crate::FlowHandler`], [`crate::ImTarget`] and [`crate::DeviceTarget`] implementations for `S`
    /// (`impl ImTarget<S> for MyTarget`). Make it cheap to clone: an `Arc`, or a struct of
    /// `Arc`s and handles.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use xagent_server_runtime::prelude::*;
    ///
    /// struct App { greeting: String }
    ///
    /// #[derive(Deserialize, JsonSchema)]
    /// struct Name { name: String }
    ///
    /// async fn greet(ctx: ToolContext<Arc<App>>, args: Name) -> Result<String, ToolError> {
    ///     Ok(format!("{}, {}", ctx.state().greeting, args.name))
    /// }
    ///
    /// let connector = Connector::builder("im.greeter", "Greeter", "0.1.0")
    ///     .target(TargetDeclaration::new(TargetType::Im, "greeter", "Greeter"))
    ///     .profile(PROFILE_IM_V2)
    ///     .state(Arc::new(App { greeting: "Hello".into() }))
    ///     .on_message(|_ctx, _message| async {})
    ///     .tool(ToolSpec::new("greeter_greet", "Greet someone"), greet)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(connector.card().tools.len(), 1);
    /// ```
    #[must_use]
    pub fn state<S: Clone + Send + Sync + 'static>(self, state: S) -> ConnectorBuilder<S> {
        let Self {
            card_id,
            info,
            build,
            target_types,
            targets,
            profiles,
            user_channel_mode,
            flows,
            security,
            ui,
            skill,
            tools,
            errors,
            auth,
            im,
            device,
            device_tools,
            unconstrained,
            state: (),
        } = self;
        ConnectorBuilder {
            card_id,
            info,
            build,
            target_types,
            targets,
            profiles,
            user_channel_mode,
            flows,
            security,
            ui,
            skill,
            tools,
            errors,
            auth,
            im,
            device,
            device_tools,
            unconstrained,
            state,
        }
    }
}
