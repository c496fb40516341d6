//! The shared IM send Tools (`ConnectorBuilder::im_send_tools`) over a real socket: the Card
//! declares both with their output schemas, the runtime checks the arguments and opens the
//! file, and the Connector's sender gets the call's effect id.

mod support;

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use xagent_protocol_types::{
    ConnectorChannelId, ConnectorHello, ErrorCode, PROFILE_IM_V2, Packet, ToolInvoke,
    ToolInvokeContext,
};
use xagent_server_runtime::im_tools::{ImSender, OpenedFile};
use xagent_server_runtime::prelude::*;
use xagent_testkit::{WsClient, payload_json};

const CARD: &str = "im.memo";

/// One post the sender was asked for: effect id, text or file name, file bytes, caption.
#[derive(Clone, Debug, PartialEq)]
struct Post {
    effect_id: String,
    text: Option<String>,
    file: Option<(String, Vec<u8>)>,
}

#[derive(Clone, Default)]
struct Memo(Arc<Mutex<Vec<Post>>>);

impl Memo {
    fn posts(&self) -> Vec<Post> {
        self.0.lock().unwrap().clone()
    }
}

impl ImSender for Memo {
    const PLACE: &'static str = "memo board";

    async fn send_text(
        &self,
        _ctx: &ToolContext,
        effect_id: &str,
        text: String,
    ) -> Result<String, ToolError> {
        let post = Post { effect_id: effect_id.to_owned(), text: Some(text), file: None };
        self.0.lock().unwrap().push(post);
        Ok(format!("memo-{effect_id}"))
    }

    async fn send_file(
        &self,
        _ctx: &ToolContext,
        effect_id: &str,
        mut file: OpenedFile,
        caption: Option<String>,
    ) -> Result<String, ToolError> {
        let mut bytes = Vec::new();
        file.reader.read_to_end(&mut bytes).await.map_err(ToolError::internal)?;
        let post = Post {
            effect_id: effect_id.to_owned(),
            text: caption,
            file: Some((file.record.filename, bytes)),
        };
        self.0.lock().unwrap().push(post);
        Ok(format!("memo-{effect_id}"))
    }
}

fn connector(memo: &Memo) -> Connector {
    Connector::builder(CARD, "Memo", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "memo", "Memo"))
        .profile(PROFILE_IM_V2)
        .on_message(|_, _| async {})
        .im_send_tools("memo", memo.clone())
        .build()
        .unwrap()
}

async fn open(client: &mut WsClient) -> ConnectorChannelId {
    let hello = client.request(ConnectorHello::new(CARD, vec![PROFILE_IM_V2.into()]), None);
    let ack = client.call(hello).await;
    assert!(ack.error.is_none(), "{ack:?}");
    client.open_channel(None).await.0
}

async fn invoke(
    client: &mut WsClient,
    channel: &ConnectorChannelId,
    tool: &str,
    arguments: Value,
    call_id: &str,
) -> Packet {
    let Value::Object(mut arguments) = arguments else { panic!("object arguments") };
    arguments.insert("connector_channel_id".into(), json!(channel.as_str()));
    let invoke =
        ToolInvoke::new(tool, arguments).with_context(ToolInvokeContext::with_call_id(call_id));
    let packet = client.request(invoke, Some(channel));
    client.call(packet).await
}

#[test]
fn both_shared_tools_declare_typed_results_and_an_upload_reference() {
    let connector = connector(&Memo::default());
    let card = connector.card();
    let ids: Vec<&str> = card.tools.iter().map(|t| t.tool_id.as_str()).collect();
    assert_eq!(ids, ["memo_message_send", "memo_file_send"]);
    for tool in &card.tools {
        let output = tool.output_schema.as_ref().expect("a typed result has an output schema");
        assert_eq!(output["properties"]["status"]["enum"], json!(["sent"]), "{output:#?}");
        assert_eq!(output["properties"]["message_id"]["type"], "string");
        assert!(tool.title.as_deref().is_some_and(|t| t.ends_with("memo board")), "{tool:?}");
    }
    let file = &card.tools[1];
    assert_eq!(file.input_schema["properties"]["file_ref"]["x-xagent-upload-ref"], true);
    let message = &card.tools[0];
    assert_eq!(message.input_schema["properties"]["text"]["maxLength"], 32_000);
}

#[tokio::test]
async fn the_shared_tools_post_through_the_sender_with_the_calls_effect_id() {
    let memo = Memo::default();
    let dir = support::temp_dir("im-tools");
    let server = support::serve_custom_in(connector(&memo), &dir).await;
    let mut client = server.client().await;
    let channel = open(&mut client).await;

    let sent =
        invoke(&mut client, &channel, "memo_message_send", json!({"text": "hi"}), "c1").await;
    assert!(sent.error.is_none(), "{sent:?}");
    let result = &payload_json(&sent)["result"];
    assert_eq!(result["status"], "sent");
    let posts = memo.posts();
    assert_eq!(posts.len(), 1);
    assert_eq!(posts[0].text.as_deref(), Some("hi"));
    assert_eq!(result["message_id"], format!("memo-{}", posts[0].effect_id));

    // Another call with the same text is another effect.
    let again =
        invoke(&mut client, &channel, "memo_message_send", json!({"text": "hi"}), "c2").await;
    assert!(again.error.is_none(), "{again:?}");
    let posts = memo.posts();
    assert_eq!(posts.len(), 2);
    assert_ne!(posts[0].effect_id, posts[1].effect_id);

    // A blank text never reaches the sender.
    let blank =
        invoke(&mut client, &channel, "memo_message_send", json!({"text": " "}), "c3").await;
    assert_eq!(blank.error.as_ref().map(|e| e.code.clone()), Some(ErrorCode::InvalidArguments));
    assert_eq!(memo.posts().len(), 2);

    // An unknown file is file_not_found, with what to do about it.
    let unknown = json!({"file_ref": "file_00000000000000000000000000000000"});
    let missing = invoke(&mut client, &channel, "memo_file_send", unknown, "c4").await;
    let error = missing.error.expect("an unknown file is refused");
    assert_eq!(error.code, ErrorCode::FileNotFound);
    let message = error.message.unwrap_or_default();
    assert!(message.contains("from this conversation"), "{message}");
    assert_eq!(memo.posts().len(), 2);

    // A file of the channel is opened by the runtime and handed over with its caption.
    let form = reqwest::multipart::Form::new()
        .part("file", reqwest::multipart::Part::bytes(b"chart".to_vec()).file_name("c.png"));
    let upload = reqwest::Client::new()
        .post(format!("http://{}/files/uploads", server.addr))
        .header("X-XAgent-Connector-Channel-ID", channel.as_str())
        .multipart(form)
        .send()
        .await
        .unwrap();
    assert_eq!(upload.status(), 200);
    let file_ref = upload.json::<Value>().await.unwrap()["file_ref"].clone();
    let arguments = json!({"file_ref": file_ref, "text": "the chart"});
    let posted = invoke(&mut client, &channel, "memo_file_send", arguments, "c5").await;
    assert!(posted.error.is_none(), "{posted:?}");
    let result = &payload_json(&posted)["result"];
    assert_eq!((&result["status"], &result["file_ref"]), (&json!("sent"), &file_ref));
    let post = memo.posts().pop().unwrap();
    assert_eq!(post.file, Some(("c.png".to_owned(), b"chart".to_vec())));
    assert_eq!(post.text.as_deref(), Some("the chart"));

    client.close().await;
    server.stop().await;
    let _ = std::fs::remove_dir_all(dir);
}
