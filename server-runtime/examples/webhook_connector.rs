//! A Connector whose target system pushes its messages over HTTP, as most real targets do: a
//! webhook route added through the builder, next to the protocol's endpoints, and served by
//! `serve_from_env` with its logging, limits and metrics. Built on the published crates only.
//!
//! ```sh
//! XAGENT_CONNECTOR_API_KEY=some-long-key WEBHOOK_SECRET=a-secret-of-16-or-more \
//!   cargo run -p xagent-server-runtime --example webhook_connector
//! # xAgent signs a channel in to an inbox (flow `webhook_inbox`, input inbox=support):
//! xagent-connector mock-xagent --base-url http://127.0.0.1:8080 --api-key some-long-key \
//!   --flow webhook_inbox --input inbox=support
//! # The target system posts an event; xAgent receives it as a chat.message:
//! curl -X POST http://127.0.0.1:8080/webhook/support \
//!   -H 'Authorization: Bearer a-secret-of-16-or-more' -H 'Content-Type: application/json' \
//!   -d '{"id":"evt-1","from":"ada","text":"hello"}'
//! ```
//!
//! The webhook answers `202` once the message is durably in the outbox (a repeat of the same
//! `id` is the same message: the target may retry safely), `401` for a wrong secret, `404`
//! when no channel is signed in to the inbox, `400` for a malformed event, `413` beyond
//! 64 KiB. What the agent sends back is printed (a real Connector would post it to the target).
//!
//! The Connector's state (`.state(..)`) is its settings: the Tool `webhook_inbox_info` tells
//! the agent which URL the target system posts to (`WEBHOOK_PUBLIC_URL`, default
//! `http://127.0.0.1:8080`). Its handlers are plain `async fn`s, unit-tested at the end of this
//! file by calling them (`cargo test -p xagent-server-runtime --examples`).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::post;
use xagent_server_runtime::prelude::*;

/// The largest webhook body taken.
const MAX_BODY: usize = 64 * 1024;

#[derive(Deserialize, JsonSchema)]
struct InboxForm {
    /// Inbox name: lower-case letters, digits and '-'
    inbox: String,
}

/// One event the target system posts.
#[derive(Deserialize)]
struct Event {
    /// The target's id of the event: a retried post carries the same one.
    id: String,
    from: String,
    text: String,
}

/// The Connector's state: what its handlers need to know.
#[derive(Clone)]
struct Settings {
    /// Where the target system reaches this Connector.
    public_url: Arc<str>,
}

/// No arguments.
#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

/// The channel's inbox and where its events are posted.
#[derive(Serialize, JsonSchema)]
struct InboxInfo {
    /// The inbox the channel is signed in to.
    inbox: String,
    /// The URL the target system posts the inbox's events to.
    webhook_url: String,
}

/// `webhook_inbox`: signs the channel in to an inbox.
async fn choose_inbox(_ctx: AuthContext<Settings>, form: InboxForm) -> Result<AuthStep, AuthError> {
    if !valid_name(&form.inbox, 64) {
        let why = "inbox: 1-64 lower-case letters, digits or '-'";
        return Err(AuthError::new(ErrorCode::InvalidArguments, why));
    }
    let target = DescriptorTarget::new("webhook", format!("Inbox {}", form.inbox));
    Ok(AuthStep::Authenticated(Binding::new(target).with_secret("inbox", Secret::new(form.inbox))))
}

/// `webhook_inbox_info`: the channel's inbox and the URL of its webhook.
async fn inbox_info(ctx: ToolContext<Settings>, _args: NoArgs) -> Result<InboxInfo, ToolError> {
    let Some(inbox) = ctx.binding.secret("inbox").map(|s| s.expose().to_owned()) else {
        return Err(ToolError::permission_denied("this channel is signed in to no inbox"));
    };
    let base = ctx.state().public_url.trim_end_matches('/');
    Ok(InboxInfo { webhook_url: format!("{base}/webhook/{inbox}"), inbox })
}

struct Hook {
    handle: ConnectorHandle,
    secret: String,
}

fn valid_name(text: &str, max: usize) -> bool {
    !text.is_empty()
        && text.len() <= max
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

async fn receive(
    State(hook): State<Arc<Hook>>,
    Path(inbox): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .unwrap_or_default();
    if !constant_time_eq(presented.as_bytes(), hook.secret.as_bytes()) {
        return (StatusCode::UNAUTHORIZED, "wrong or missing webhook secret".into());
    }
    let event: Event = match serde_json::from_slice(&body) {
        Ok(event) => event,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("not an event: {e}")),
    };
    let id_ok = !event.id.is_empty()
        && event.id.len() <= 64
        && event.id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !id_ok || event.from.len() > 128 {
        return (
            StatusCode::BAD_REQUEST,
            "id: 1-64 of [A-Za-z0-9_-]; from: at most 128 bytes".into(),
        );
    }
    let handle = &hook.handle;
    let channel = handle.channels().into_iter().find(|channel| {
        handle
            .binding(channel)
            .and_then(|b| b.secret("inbox").map(|s| s.expose() == inbox))
            .unwrap_or(false)
    });
    let Some(channel) = channel else {
        return (StatusCode::NOT_FOUND, format!("no channel is signed in to inbox {inbox:?}"));
    };
    let message =
        ChatMessage::text(format!("wh_{}", event.id), format!("{}: {}", event.from, event.text));
    match handle.send_message(&channel, message).await {
        Ok(()) => (StatusCode::ACCEPTED, "queued for the agent".into()),
        Err(e) => {
            let status = StatusCode::from_u16(e.code().http_status());
            (status.unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), e.to_string())
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secret = std::env::var("WEBHOOK_SECRET").unwrap_or_default();
    if secret.len() < 16 {
        return Err(
            "set WEBHOOK_SECRET (at least 16 characters): the target system presents it".into()
        );
    }
    let public_url =
        std::env::var("WEBHOOK_PUBLIC_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let connector = Connector::builder("im.webhook", "Webhook inbox", env!("CARGO_PKG_VERSION"))
        .target(TargetDeclaration::new(TargetType::Im, "webhook", "Webhook inbox"))
        .profile(PROFILE_IM_V2)
        .state(Settings { public_url: public_url.into() })
        .form_flow(FlowSpec::new("webhook_inbox", "Choose an inbox"), choose_inbox)
        .on_message(|_, msg| async move { println!("agent: {}", msg.text.unwrap_or_default()) })
        .tool(
            ToolSpec::new(
                "webhook_inbox_info",
                "Inbox info\nThe inbox this channel is signed in to and the URL its events are posted to.",
            )
            .read_only(),
            inbox_info,
        )
        .build()?;
    ConnectorServer::builder(connector)
        .routes(move |handle| {
            let hook = Arc::new(Hook { handle, secret });
            Router::new()
                .route("/webhook/{inbox}", post(receive))
                .layer(DefaultBodyLimit::max(MAX_BODY))
                .with_state(hook)
        })
        .serve_from_env()
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings { public_url: "https://hooks.example.org/".into() }
    }

    fn signed_in(inbox: &str) -> Binding {
        Binding::new(DescriptorTarget::new("webhook", "Inbox"))
            .with_secret("inbox", Secret::new(inbox))
    }

    #[tokio::test]
    async fn inbox_info_names_the_url_the_target_posts_to() {
        let ctx = ToolContext::for_test(signed_in("support"), settings()).unwrap();
        let info = inbox_info(ctx, NoArgs {}).await.unwrap();
        assert_eq!(info.inbox, "support");
        assert_eq!(info.webhook_url, "https://hooks.example.org/webhook/support");
    }

    #[tokio::test]
    async fn inbox_info_refuses_a_channel_signed_in_to_no_inbox() {
        let binding = Binding::new(DescriptorTarget::new("webhook", "Inbox"));
        let ctx = ToolContext::for_test(binding, settings()).unwrap();
        let error = inbox_info(ctx, NoArgs {}).await.err().unwrap();
        assert_eq!(error.code, ErrorCode::PermissionDenied);
    }

    #[tokio::test]
    async fn choose_inbox_refuses_a_name_outside_the_webhook_path_rules() {
        let ctx = AuthContext::for_test("webhook_inbox", settings()).unwrap();
        let form = InboxForm { inbox: "../admin".into() };
        let error = choose_inbox(ctx, form).await.err().unwrap();
        assert_eq!(error.code, ErrorCode::InvalidArguments);
    }

    #[tokio::test]
    async fn choose_inbox_keeps_the_inbox_in_the_binding() {
        let ctx = AuthContext::for_test("webhook_inbox", settings()).unwrap();
        let step = choose_inbox(ctx, InboxForm { inbox: "support".into() }).await.unwrap();
        let AuthStep::Authenticated(binding) = step else { panic!("{step:?}") };
        assert_eq!(
            binding.secret("inbox").map(|s| s.expose().to_owned()).as_deref(),
            Some("support")
        );
    }
}
