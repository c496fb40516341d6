//! Tools: the typed declaration ([`ToolSpec`]), the error a handler returns, and the
//! registration that turns a typed handler into a Card entry plus a callable.

use std::future::Future;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use xagent_protocol_types::{CardTool, ErrorCode, ProfileId, SkillId, WireError};

use super::context::ToolContext;
use crate::error::DefinitionError;
use futures_util::future::BoxFuture as BoxFut;

/// How a Tool is declared: its id and one doc text (first line the title, the whole text the
/// description), whether it only observes, its Profile and related Skills. The argument and
/// result schemas come from the handler's types.
///
/// ```
/// use xagent_server_runtime::ToolSpec;
/// let spec = ToolSpec::new("example_shout", "Shout\n\nUpper-cases the text.").read_only();
/// assert_eq!(spec.title(), "Shout");
/// ```
#[derive(Clone, Debug)]
pub struct ToolSpec {
    id: String,
    doc: String,
    read_only: bool,
    profile: Option<ProfileId>,
    skills: Vec<SkillId>,
}

impl ToolSpec {
    /// A Tool with its id (a model function name) and its doc text.
    pub fn new(id: impl Into<String>, doc: impl Into<String>) -> Self {
        Self { id: id.into(), doc: doc.into(), read_only: false, profile: None, skills: Vec::new() }
    }

    /// Marks the Tool as an observation without side effects: a repeated call runs again
    /// instead of being answered from the durable repeated-call record (concurrent repeats of
    /// one call still share one run). Never use it for a Tool that changes anything.
    #[must_use]
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// The Profile the Tool belongs to (default: the first declared Profile).
    #[must_use]
    pub fn profile(mut self, profile: impl Into<ProfileId>) -> Self {
        self.profile = Some(profile.into());
        self
    }

    /// Whether a Profile was set with [`ToolSpec::profile`].
    pub(crate) fn has_profile(&self) -> bool {
        self.profile.is_some()
    }

    /// A Skill recommended when using this Tool.
    #[must_use]
    pub fn related_skill(mut self, skill: impl Into<SkillId>) -> Self {
        self.skills.push(skill.into());
        self
    }

    /// The title: the doc text's first line, without a final period.
    pub fn title(&self) -> &str {
        self.doc.lines().next().unwrap_or_default().trim().trim_end_matches('.')
    }

    /// The description: the doc text without its title line when more follows, else all of it.
    pub fn description(&self) -> &str {
        match self.doc.split_once('\n') {
            Some((_, rest)) if !rest.trim().is_empty() => rest.trim(),
            _ => self.doc.trim(),
        }
    }
}

/// A failed Tool run: a stable code and a message (no secrets) for the ack error.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// Stable code.
    pub code: ErrorCode,
    /// Readable reason.
    pub message: String,
}

impl ToolError {
    /// An error with a code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// `tool_invoke_failed`.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ToolInvokeFailed, message)
    }

    /// `permission_denied` (the target system refused).
    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PermissionDenied, message)
    }

    /// An internal failure (a database, a bug): the cause is logged here and xAgent gets
    /// `internal_error` with a generic message, so no internal detail (an SQL error, a path)
    /// reaches the model.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(%cause, "tool failed internally");
        Self::new(ErrorCode::InternalError, crate::error::INTERNAL_MESSAGE)
    }

    /// The wire error of the ack (made once, where the runtime calls the Tool).
    pub(crate) fn into_wire(self) -> WireError {
        WireError::new(self.code, self.message)
    }
}

/// A registered Tool's callable: validated arguments in, JSON result or error out.
pub(crate) type ToolCall = dyn Fn(ToolContext, Map<String, Value>) -> BoxFut<'static, Result<Value, ToolError>>
    + Send
    + Sync;

/// One registered Tool: its Card declaration, the compiled argument schema and the handler.
pub(crate) struct RegisteredTool {
    pub(crate) card: CardTool,
    /// The author's argument schema compiled (without the injected `connector_channel_id`).
    validator: jsonschema::Validator,
    pub(crate) call: Arc<ToolCall>,
    /// False for read-only Tools: no durable repeated-call record (concurrent repeats still
    /// share one run).
    pub(crate) records_calls: bool,
}

impl RegisteredTool {
    /// The arguments as the handler may see them: the model's redundant `connector_channel_id`
    /// removed (routing is by the envelope only, so it is neither required nor type-checked,
    /// whatever the model sent), the rest checked against the Tool's argument schema. The one
    /// place a call's arguments are admitted.
    pub(crate) fn admit_arguments(
        &self,
        mut arguments: Map<String, Value>,
    ) -> Result<Map<String, Value>, WireError> {
        arguments.remove(xagent_protocol_types::CHANNEL_ARGUMENT);
        let arguments = Value::Object(arguments);
        if !self.validator.is_valid(&arguments) {
            let problems: Vec<String> = self
                .validator
                .iter_errors(&arguments)
                .take(5)
                .map(|e| {
                    let path = e.instance_path().to_string();
                    if path.is_empty() { e.to_string() } else { format!("{path}: {e}") }
                })
                .collect();
            let message =
                format!("the arguments do not match the input schema: {}", problems.join("; "));
            return Err(WireError::new(ErrorCode::InvalidArguments, message));
        }
        match arguments {
            Value::Object(arguments) => Ok(arguments),
            _ => Ok(Map::new()),
        }
    }
}

/// The JSON Schema of `T` as a bare object map (no `$schema`, no `title`); `None` when it
/// constrains nothing (e.g. `serde_json::Value`).
fn schema_map<T: JsonSchema>() -> Option<Map<String, Value>> {
    match schemars::schema_for!(T).to_value() {
        Value::Object(mut map) => {
            map.remove("$schema");
            map.remove("title");
            (!map.is_empty()).then_some(map)
        }
        _ => None,
    }
}

/// Turns a typed handler into a registered Tool: `Args`' schema (with `connector_channel_id`
/// injected) becomes `input_schema`, `Out`'s schema `output_schema`.
pub(crate) fn register<Args, Out, F, Fut>(
    spec: ToolSpec,
    handler: F,
) -> Result<RegisteredTool, DefinitionError>
where
    Args: DeserializeOwned + JsonSchema + Send + 'static,
    Out: Serialize + JsonSchema + Send + 'static,
    F: Fn(ToolContext, Args) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Out, ToolError>> + Send + 'static,
{
    let tool_id = spec.id.clone();
    let valid_id = !tool_id.is_empty()
        && tool_id.len() <= xagent_protocol_types::TOOL_ID_MAX_LEN
        && tool_id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !valid_id {
        return Err(DefinitionError::BadToolId(tool_id));
    }
    let schema_error =
        |reason: String| DefinitionError::ToolSchema { tool: tool_id.clone(), reason };
    let schema = schema_map::<Args>()
        .filter(|s| s.get("type") == Some(&Value::String("object".into())))
        .ok_or_else(|| {
            schema_error("the argument type must be a struct (an object schema)".into())
        })?;
    // The arguments are checked against the author's own schema: the model's copy of the
    // channel is removed before the check (`RegisteredTool::admit_arguments`), so it is
    // published in the Card but never required nor type-checked.
    let validator = jsonschema::validator_for(&Value::Object(schema.clone()))
        .map_err(|error| schema_error(format!("the input schema does not compile: {error}")))?;
    let schema = xagent_protocol_validate::with_connector_channel_id(&schema)
        .map_err(|error| schema_error(error.to_string()))?;
    let handler = Arc::new(handler);
    let call: Arc<ToolCall> = Arc::new(move |ctx: ToolContext, arguments: Map<String, Value>| {
        let handler = Arc::clone(&handler);
        Box::pin(async move {
            let args: Args = serde_json::from_value(Value::Object(arguments)).map_err(|error| {
                ToolError::new(
                    ErrorCode::InvalidArguments,
                    format!("the arguments do not match the tool's input schema: {error}"),
                )
            })?;
            let out = handler(ctx, args).await?;
            serde_json::to_value(out).map_err(ToolError::internal)
        }) as BoxFut<'static, Result<Value, ToolError>>
    });
    let mut card = CardTool::new(tool_id.as_str(), schema)
        .with_title(spec.title())
        .with_description(spec.description());
    if let Some(output) = schema_map::<Out>() {
        card = card.with_output_schema(output);
    }
    if let Some(profile) = spec.profile.clone() {
        card = card.with_profile(profile);
    }
    for skill in spec.skills {
        card = card.with_related_skill(skill);
    }
    if spec.read_only {
        card = card.with_read_only_hint(true);
    }
    Ok(RegisteredTool { card, validator, call, records_calls: !spec.read_only })
}
