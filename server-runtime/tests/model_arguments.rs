//! The model's redundant `connector_channel_id` argument (issue 22, item 6): published in every
//! Card Tool's `input_schema`, but routing is by the envelope only, so the Connector removes it
//! before the Tool's argument check: a call without it, or with a value that is not a string,
//! runs like any other.

mod support;

use serde_json::{Value, json};
use xagent_protocol_types::{
    ConnectorChannelId, ConnectorHello, ErrorCode, PROFILE_IM_V2, Packet, ToolInvoke,
};
use xagent_server_runtime::RuntimeConfig;
use xagent_server_runtime::prelude::*;
use xagent_testkit::{WsClient, has_error, payload_json};

const CARD: &str = "im.model_args";

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Text {
    /// The text.
    text: String,
}

fn connector() -> Connector {
    Connector::builder(CARD, "Model arguments", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "model_args", "Model arguments"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .tool(
            ToolSpec::new("model_args_echo", "Echo\n\nReturns its text."),
            |ctx, a: Text| async move { Ok(json!({ "text": a.text, "channel": ctx.channel })) },
        )
        .build()
        .expect("builds")
}

async fn open(client: &mut WsClient) -> ConnectorChannelId {
    let hello = client.request(ConnectorHello::new(CARD, vec![PROFILE_IM_V2.into()]), None);
    let ack = client.call(hello).await;
    assert!(ack.error.is_none(), "{ack:?}");
    client.open_channel(None).await.0
}

async fn call(client: &mut WsClient, channel: &ConnectorChannelId, arguments: Value) -> Packet {
    let invoke =
        ToolInvoke::new("model_args_echo", arguments.as_object().cloned().unwrap_or_default());
    let packet = client.request(invoke, Some(channel));
    client.call(packet).await
}

#[tokio::test]
async fn rule_the_channel_argument_is_neither_required_nor_type_checked() {
    let connector = connector();
    let schema = &connector.card().tools[0].input_schema;
    assert_eq!(schema["properties"]["connector_channel_id"]["type"], "string", "still published");
    assert!(
        schema["required"]
            .as_array()
            .is_some_and(|r| r.iter().any(|v| v == "connector_channel_id")),
        "still required in the published schema, as the protocol asks: {schema:?}"
    );
    let server = support::serve_custom(connector, RuntimeConfig::default(), None).await;
    let mut client = server.client().await;
    let channel = open(&mut client).await;
    let expected = json!({ "text": "hi", "channel": channel });
    for arguments in [
        json!({ "text": "hi" }),
        json!({ "text": "hi", "connector_channel_id": 42 }),
        json!({ "text": "hi", "connector_channel_id": null }),
        json!({ "text": "hi", "connector_channel_id": { "id": "cch_x" } }),
        json!({ "text": "hi", "connector_channel_id": "cch_made_up_by_the_model" }),
        json!({ "text": "hi", "connector_channel_id": channel }),
    ] {
        let reply = call(&mut client, &channel, arguments.clone()).await;
        assert!(reply.error.is_none(), "{arguments}: {reply:?}");
        assert_eq!(payload_json(&reply)["result"], expected, "{arguments}: runs on the envelope's");
    }
    // The author's own arguments are still checked.
    let reply = call(&mut client, &channel, json!({ "connector_channel_id": channel })).await;
    assert!(has_error(&reply, &ErrorCode::InvalidArguments), "{reply:?}");
    let reply = call(&mut client, &channel, json!({ "text": 1 })).await;
    assert!(has_error(&reply, &ErrorCode::InvalidArguments), "{reply:?}");
    let reply = call(&mut client, &channel, json!({ "text": "hi", "other": true })).await;
    assert!(has_error(&reply, &ErrorCode::InvalidArguments), "{reply:?}");
    client.close().await;
    server.stop().await;
}
