//! Opaque identifiers as distinct types, so a channel id can never be passed where a packet id
//! is expected. None of them is a credential.

id_newtype!(
    /// `packet_id`: one transmission of one packet.
    PacketId
);
id_newtype!(
    /// `request_id`: chosen by the requester and echoed unchanged by the ack.
    RequestId
);
id_newtype!(
    /// `connector_channel_id`: the user-level channel, assigned by the Connector.
    ConnectorChannelId
);
id_newtype!(
    /// `connector_id`: the Connector Server runtime instance, issued in `connector.hello.ack`.
    ConnectorId
);
id_newtype!(
    /// `connector_card_id`: the stable identity of a Connector implementation (e.g. `im.wechat`).
    ConnectorCardId
);
id_newtype!(
    /// `auth_session_id`: one authentication attempt.
    AuthSessionId
);
id_newtype!(
    /// `flow_id` / `auth_flows[].id`: an authentication flow declared in the Card.
    FlowId
);
id_newtype!(
    /// `file_ref`: a Connector-internal file key bound to one channel.
    FileRef
);
id_newtype!(
    /// `message_id`: the business idempotency key of an IM message within a channel.
    MessageId
);
id_newtype!(
    /// `tool_id`: a Tool declared in the Card; also the model function name.
    ToolId
);
id_newtype!(
    /// `context.tool_call_id`: xAgent's correlation id for one model Tool call.
    ToolCallId
);
id_newtype!(
    /// A Profile id such as `xagent.im.v2`.
    ProfileId
);
id_newtype!(
    /// A Skill name such as `connector-im-wechat`.
    SkillId
);
