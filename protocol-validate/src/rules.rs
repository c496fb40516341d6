//! Every rule the validators enforce, with its stable id, severity and source section.
//!
//! Section names: "protocol N" is a section of the common protocol text, "IM v1 §N",
//! "IM v2 §N" and "Device §N" are sections of the Profile texts, "notes" is the project's
//! binding spec notes. The table in the crate documentation is generated from [`ALL`] (a test
//! keeps them equal).

use crate::report::{Report, Rule, Severity};

macro_rules! rules {
    ($( $name:ident = $id:literal, $sev:ident, $section:literal, $summary:literal; )+) => {
        $(
            #[doc = concat!("`", $id, "` (", $section, "): ", $summary)]
            pub const $name: Rule = Rule {
                id: $id,
                severity: Severity::$sev,
                section: $section,
                summary: $summary,
            };
        )+
        /// Every rule, in table order.
        pub const ALL: &[Rule] = &[$($name),+];
    };
}

rules! {
    DOCUMENT_NOT_JSON = "document.not_json", Error, "protocol 4.1, 7", "The input must be JSON text.";
    DOCUMENT_NOT_OBJECT = "document.not_object", Error, "protocol 4.1, 7", "The document must be a JSON object.";

    CARD_SCHEMA = "card.schema", Error, "protocol 4.1", "`schema` must be `xagent.connector/v1`.";
    CARD_PROTOCOL_VERSION = "card.protocol_version", Error, "protocol 4.1, 12", "`protocol_version` must be declared explicitly as `3.0`.";
    CARD_BUILD = "card.build", Error, "notes (strict on write)", "`build` must be an object with a string `build_time`.";
    CARD_BUILD_TIME_FORMAT = "card.build_time_format", Warning, "notes (strict on write)", "`build.build_time` should be `YYMMDDHHMM` in UTC.";
    CARD_CONNECTOR_CARD_ID = "card.connector_card_id", Error, "protocol 4.1", "`connector_card_id` is required and non-empty.";
    CARD_CONNECTOR_NAME = "card.connector_name", Error, "protocol 4.1", "`connector.name` is required and non-empty.";
    CARD_CONNECTOR_VERSION = "card.connector_version", Error, "protocol 4.1", "`connector.version` is required and non-empty.";
    CARD_SUPPORTS = "card.supports", Error, "protocol 4.1", "`supports` must be an object.";
    CARD_TARGET_TYPES = "card.target_types", Error, "protocol 4.1", "`supports.target_types` must be a non-empty array of unique strings.";
    CARD_TARGET_TYPE_UNKNOWN = "card.target_type_unknown", Error, "protocol 4.1", "Target types are `im`, `email`, `calendar`, `ticket` or `device`.";
    CARD_PROFILES = "card.profiles", Error, "protocol 4.1", "`supports.profiles` must be a non-empty array of unique, non-empty strings.";
    CARD_PROFILE_UNKNOWN = "card.profile_unknown", Warning, "protocol 11", "A declared Profile should be a standard one the catalog knows.";
    CARD_PROFILE_TARGET_TYPE = "card.profile_target_type", Error, "protocol 4.1; notes (Profiles)", "A declared Profile's target types must intersect `supports.target_types`.";
    CARD_IM_PROFILES_EXCLUSIVE = "card.im_profiles_exclusive", Error, "IM v1 §3, §5", "A Card declares one IM Profile: `xagent.im.v1` or `xagent.im.v2`, not both.";
    CARD_USER_CHANNEL_MODE = "card.user_channel_mode", Error, "protocol 4.1", "`supports.user_channel_mode` is `single` or `multiple`.";
    CARD_TARGET_DECLARATION = "card.target_declaration", Warning, "protocol 4.1", "`supports.targets[]` should declare `target_type`, `provider` and `label`.";
    CARD_TOOL_ID = "card.tool_id", Error, "protocol 4.1", "`tools[].tool_id` is required and non-empty.";
    CARD_TOOL_ID_FORMAT = "card.tool_id_format", Error, "protocol 4.1, 10", "`tool_id` has at most 256 ASCII letters, digits, `_`, `-` or `.`.";
    CARD_TOOL_ID_UNIQUE = "card.tool_id_unique", Error, "protocol 4.1", "`tool_id`s are unique within the Card.";
    CARD_TOOL_PROFILE = "card.tool_profile", Error, "protocol 4.1", "`tools[].profile` must appear in `supports.profiles`.";
    CARD_TOOL_INPUT_SCHEMA = "card.tool_input_schema", Error, "protocol 4.1", "`tools[].input_schema` must be an object schema (`type: object`).";
    CARD_TOOL_CHANNEL_ARGUMENT = "card.tool_channel_argument", Error, "protocol 4.1, 10", "`input_schema.properties.connector_channel_id` must exist with type string.";
    CARD_TOOL_CHANNEL_REQUIRED = "card.tool_channel_required", Error, "protocol 4.1, 10", "`input_schema.required` must contain `connector_channel_id`.";
    CARD_TOOL_CARD_ID_ARGUMENT = "card.tool_card_id_argument", Error, "protocol 4.1, 10.1", "A Tool schema must not declare a `connector_card_id` argument.";
    CARD_TOOL_RELATED_SKILL = "card.tool_related_skill", Error, "protocol 4.2; notes (Profiles)", "`related_skill_ids` entries are the primary Skill name or it plus `-<purpose>`.";
    CARD_TOOL_WIRE_REFERENCE = "card.tool_wire_reference", Error, "protocol 5, 10; notes (Upload-reference arguments)", "A Tool's `title`, `description` and the descriptions in its `input_schema` send the model to no Transfer Plane endpoint (`/files/uploads`, `/files/refs`, `POST /files`) and name no wire packet (`tool.invoke`, `chat.message`, ...).";
    CARD_IM_TOOL_TARGET_ARGUMENT = "card.im_tool_target_argument", Error, "IM v1 §4, §6", "An IM Tool lets the model fill no send target, contact id or platform token (`chat_id`, `contact_id`, `bot_token`, ...): the channel routes.";
    CARD_AUTH_FLOW_REQUIRED = "card.auth_flow_required", Error, "protocol 4.1 (auth_flows table)", "`auth_flows[]` need `id`, `target_type`, `type` and `title`.";
    CARD_AUTH_FLOW_ID_UNIQUE = "card.auth_flow_id_unique", Error, "protocol 4.1, 8.7", "`auth_flows[].id`s are unique within the Card: `auth.start` names a flow by its id.";
    CARD_AUTH_FLOW_TYPE = "card.auth_flow_type", Warning, "protocol 4.1; notes", "`auth_flows[].type` should be `qr_login` or `form`.";
    CARD_AUTH_FLOW_TARGET_TYPE = "card.auth_flow_target_type", Warning, "protocol 4.1", "`auth_flows[].target_type` should be one of `supports.target_types`.";
    CARD_AUTH_FORM_FIELDS = "card.auth_form_fields", Error, "protocol 4.1", "A `form` flow must have at least one field.";
    CARD_AUTH_FIELD_REQUIRED = "card.auth_field_required", Error, "protocol 4.1 (fields table)", "Form fields need `name`, `label` and `input_type`.";
    CARD_AUTH_FIELD_NAME_UNIQUE = "card.auth_field_name_unique", Error, "protocol 4.1 (fields table)", "Field names are unique within a flow.";
    CARD_AUTH_FIELD_INPUT_TYPE = "card.auth_field_input_type", Warning, "protocol 4.1; notes", "`input_type` should be `text` or `password`.";
    CARD_AUTH_FIELD_SECRET = "card.auth_field_secret", Warning, "protocol 4.1 (fields table)", "A password field should set `secret: true`.";
    CARD_AUTH_FIELD_DEFAULT_SECRET = "card.auth_field_default_secret", Error, "protocol 4.1 (fields table)", "A sensitive field must not have a `default_value`.";
    CARD_TRUST_LEVEL = "card.trust_level", Error, "protocol 4.1", "`security.trust_level` is `unknown`, `builtin`, `verified`, `third_party` or `local`.";
    CARD_SERVER_BASE_URL = "card.server_base_url", Error, "protocol 4.1 (forbidden)", "The Card must not contain `server_base_url`.";
    CARD_SECRET_LEAK = "card.secret_leak", Error, "protocol 3, 4.1 (forbidden)", "The Card must not contain a key, token or other secret.";

    DESCRIPTOR_SCHEMA = "descriptor.schema", Error, "protocol 9", "`schema` must be `xagent.connection/v2`.";
    DESCRIPTOR_SCHEMA_LEGACY = "descriptor.schema_legacy", Warning, "protocol 12; notes (Versions)", "A `xagent.connection/v1` Descriptor is read and normalised but should not be emitted.";
    DESCRIPTOR_CONNECTION = "descriptor.connection", Error, "protocol 9", "`connection` must be an object.";
    DESCRIPTOR_CONNECTOR_CARD_ID = "descriptor.connector_card_id", Error, "protocol 9", "`connection.connector_card_id` is required.";
    DESCRIPTOR_CARD_MISMATCH = "descriptor.card_mismatch", Error, "protocol 9", "`connection.connector_card_id` must equal the Card's id.";
    DESCRIPTOR_CONNECTOR_ID = "descriptor.connector_id", Error, "protocol 9", "`connection.connector_id` is required and non-empty.";
    DESCRIPTOR_CONNECTOR_CHANNEL_ID = "descriptor.connector_channel_id", Error, "protocol 9", "`connection.connector_channel_id` is required and non-empty.";
    DESCRIPTOR_CHANNEL_MISMATCH = "descriptor.channel_mismatch", Error, "protocol 9", "`connection.connector_channel_id` must equal the channel it describes.";
    DESCRIPTOR_TARGET_TYPE = "descriptor.target_type", Error, "protocol 9", "`connection.target_type` is `im`, `email`, `calendar`, `ticket` or `device`.";
    DESCRIPTOR_PROFILES = "descriptor.profiles", Error, "protocol 9", "`connection.profiles` must be a non-empty array of unique strings.";
    DESCRIPTOR_PROFILE_NOT_IN_CARD = "descriptor.profile_not_in_card", Error, "protocol 9", "Every `connection.profiles` entry must be declared in the Card.";
    DESCRIPTOR_PROFILE_TARGET_TYPE = "descriptor.profile_target_type", Error, "Device §2; IM v2 §1", "Each enabled Profile must allow `connection.target_type`.";
    DESCRIPTOR_STATUS = "descriptor.status", Error, "protocol 9", "`connection.status` must be a supported state.";
    DESCRIPTOR_TARGET = "descriptor.target", Error, "protocol 9", "`target` must be an object with a non-empty `provider`.";
    DESCRIPTOR_TARGET_DISPLAY_NAME = "descriptor.target_display_name", Error, "notes (strict on write)", "`target.display_name` is required by the published schema.";
    DESCRIPTOR_TOOL_ID = "descriptor.tool_id", Error, "protocol 9", "`tools[].tool_id` is required and non-empty.";
    DESCRIPTOR_TOOL_ID_UNIQUE = "descriptor.tool_id_unique", Error, "protocol 9", "A Tool appears at most once in the Descriptor's `tools[]`.";
    DESCRIPTOR_TOOL_STATUS = "descriptor.tool_status", Error, "protocol 9; notes", "`tools[].status` is required and a supported value.";
    DESCRIPTOR_TOOL_PERMISSION_STATE = "descriptor.tool_permission_state", Error, "protocol 9", "`tools[].target_permission_state` must be a supported value.";
    DESCRIPTOR_TOOL_NOT_IN_CARD = "descriptor.tool_not_in_card", Error, "protocol 9", "A Tool absent from the Card cannot appear in the Descriptor.";
    DESCRIPTOR_SECRET_LEAK = "descriptor.secret_leak", Error, "protocol 3, 9", "The Descriptor must hold only display-level, redacted information.";

    SKILL_FRONT_MATTER = "skill.front_matter", Error, "protocol 4.2", "`SKILL.md` starts with a `---` front matter block that has a `name`.";
    SKILL_BYTE_ORDER_MARK = "skill.byte_order_mark", Warning, "protocol 4.2; notes (tolerant on read)", "`SKILL.md` should not start with a byte-order mark; readers skip one and read the front matter after it.";
    SKILL_NAME_FORMAT = "skill.name_format", Error, "protocol 4.2", "A Skill name is lowercase hyphen-case: `a-z`, `0-9` and single inner hyphens.";
    SKILL_NAME_CARD = "skill.name_card", Error, "protocol 4.2; notes (Profiles)", "A Skill name is `connector-<card id>` or that plus `-<purpose>`.";
    SKILL_SECRET_LEAK = "skill.secret_leak", Error, "protocol 4.2", "A Skill must not contain a secret, key, token or one-time material.";
    SKILL_WIRE_REFERENCE = "skill.wire_reference", Error, "protocol 4.2, 5; notes (Upload-reference arguments)", "A Skill sends the agent to no Transfer Plane endpoint (`/files/uploads`, `/files/refs`, `POST /files`) and names no wire packet (`tool.invoke`, `chat.message`, ...): the agent acts through Tools.";
    SKILL_RELATED_SKILL_IDS = "skill.related_skill_ids", Error, "protocol 4.2", "The Card's `related_skill_ids` name the Skill the Connector serves, exactly; a Connector serving none lists none.";

    HEALTH_STATUS = "health.status", Error, "protocol 4.3", "`status` is a required string.";
    HEALTH_CARD_ID = "health.card_id", Error, "protocol 4.3", "A returned `connector_card_id` must equal the Card's.";
    HEALTH_PROTOCOL_VERSION = "health.protocol_version", Error, "protocol 4.3", "`protocol_version` must equal the Card's.";
    HEALTH_BUILD = "health.build", Error, "protocol 4.3", "`build` must equal the Card's `build`.";
    HEALTH_CARD_VERSION = "health.card_version", Warning, "protocol 4.3", "A `connector_card_version` differing from the Card means the Card is stale.";

    BASE_URL_SYNTAX = "base_url.syntax", Error, "protocol 3", "The Base URL must be an absolute URL.";
    BASE_URL_SCHEME = "base_url.scheme", Error, "protocol 3", "The Base URL scheme must be `http` or `https`.";
    BASE_URL_HOST = "base_url.host", Error, "protocol 3", "The Base URL must have a host.";
    BASE_URL_USERINFO = "base_url.userinfo", Error, "protocol 3", "The Base URL must not contain userinfo.";
    BASE_URL_QUERY = "base_url.query", Error, "protocol 3", "The Base URL must not contain a query.";
    BASE_URL_FRAGMENT = "base_url.fragment", Error, "protocol 3", "The Base URL must not contain a fragment.";

    HELLO_CARD_ID = "hello.card_id", Error, "protocol 8.1", "`connector_card_id` is required and equals the Card's.";
    HELLO_PROTOCOL_VERSION = "hello.protocol_version", Error, "protocol 8.1, 12; notes (Versions)", "The hello's version must be admitted (omitted means 1.0).";
    HELLO_SUPPORTED_PROFILES = "hello.supported_profiles", Error, "protocol 8.1; notes (Versions)", "`supported_profiles` must be sent explicitly as an array of strings.";
    HELLO_NO_SHARED_PROFILE = "hello.no_shared_profile", Warning, "protocol 8.1", "The hello should share at least one Profile with the Card.";
    HELLO_ACK_CARD_ID = "hello_ack.card_id", Error, "protocol 8.2", "`connector_card_id` is required and equals the hello's (the Card's).";
    HELLO_ACK_CONNECTOR_ID = "hello_ack.connector_id", Error, "protocol 8.2", "`connector_id` is required and non-empty.";
    HELLO_ACK_PROTOCOL_VERSION = "hello_ack.protocol_version", Error, "protocol 8.2, 12", "The ack's version must equal the Card's and lie in the admission window.";

    PACKET_SCHEMA = "packet.schema", Error, "protocol 7", "`schema` must be `xagent.connector.packet/v1`.";
    PACKET_PACKET_ID = "packet.packet_id", Error, "protocol 7", "`packet_id` is a required non-empty string.";
    PACKET_TYPE = "packet.type", Error, "protocol 7", "`type` is a required non-empty string.";
    PACKET_TYPE_UNKNOWN = "packet.type_unknown", Error, "protocol 8, 8.23", "The packet type must be one the protocol or a Profile defines.";
    PACKET_FIELD_TYPE = "packet.field_type", Error, "protocol 7", "Envelope ids are strings, `time` a non-negative integer, `payload` an object.";
    PACKET_TIME = "packet.time", Warning, "protocol 7", "`time` (Unix milliseconds) is recommended.";
    PACKET_REQUEST_ID = "packet.request_id", Error, "protocol 7", "Requests and acks carry a non-empty `request_id`.";
    PACKET_REPLY_TO = "packet.reply_to", Warning, "protocol 7", "Acks should set `reply_to` to the request's `packet_id`.";
    PACKET_CHANNEL_REQUIRED = "packet.channel_required", Error, "protocol 7", "User-level packets carry a non-empty `connector_channel_id`.";
    PACKET_PAYLOAD_REQUIRED = "packet.payload_required", Error, "protocol 8", "This packet type needs a payload object.";
    PACKET_PAYLOAD_INVALID = "packet.payload_invalid", Error, "protocol 8", "The payload must match its type's structure.";
    PACKET_ERROR_REQUIRED = "packet.error_required", Error, "protocol 7, 8.23", "An `error` packet carries an `error` object.";
    PACKET_ERROR_CODE = "packet.error_code", Error, "protocol 7", "`error` is an object with a non-empty string `code`.";
    PACKET_PROFILE_NOT_DECLARED = "packet.profile_not_declared", Error, "protocol 11", "A Profile packet needs its Profile declared in the Card.";
    PACKET_SECRET_LEAK = "packet.secret_leak", Error, "protocol 3, 7, 8.19", "Packets, results and error messages must not contain secrets.";
    PACKET_DESCRIPTOR = "packet.descriptor", Error, "protocol 8.4, 8.16, 8.17", "This packet carries a `connection_descriptor` object.";
    PACKET_STATUS = "packet.status", Error, "protocol 8.6-8.14", "The payload `status` is required and one this packet type allows.";

    CHANNEL_OPEN_ACK_CHANNEL = "channel_open_ack.channel", Error, "protocol 8.4", "`payload.connector_channel_id` is required and equals the envelope's.";
    AUTH_FLOW_ID = "auth.flow_id", Error, "protocol 8.7", "`auth.start` names a `flow_id` declared in the Card.";
    AUTH_SESSION_ID = "auth.session_id", Error, "protocol 8.9, 8.11", "`auth.status` and `auth.cancel` name an `auth_session_id`.";
    TOOL_INVOKE_TOOL_ID = "tool_invoke.tool_id", Error, "protocol 8.18", "`tool_id` is required and declared in the Card.";
    TOOL_INVOKE_ARGUMENTS = "tool_invoke.arguments", Error, "protocol 8.18", "`arguments` is an object.";
    TOOL_PROGRESS_TOOL_ID = "tool_progress.tool_id", Error, "protocol 8.20", "`tool.progress.push` names its `tool_id`.";
    TOOL_PROGRESS_PROGRESS = "tool_progress.progress", Error, "protocol 8.20", "`progress` is a number from 0 to 1.";

    MESSAGE_PUSH_REQUIRED_FIELD = "message_push.required_field", Error, "IM v1 §5", "`message.push` has every Must field of the IM v1 table.";
    MESSAGE_PUSH_RECOMMENDED_FIELD = "message_push.recommended_field", Warning, "IM v1 §5", "`message.push` should have the Should fields of the IM v1 table.";
    MESSAGE_PUSH_PROFILE = "message_push.profile", Error, "IM v1 §5", "`payload.profile` is `xagent.im.v1`.";
    MESSAGE_PUSH_TARGET_SESSION = "message_push.target_session", Error, "protocol 8.21", "At most one of `target_session_ref`, `session_ref`, `target_session_id`.";
    MESSAGE_PUSH_CARD_REFERENCE = "message_push.card_reference", Error, "IM v1 §6; protocol 4.2", "Tool ids and Skill names a push cites (`reply.tool_id`, `skill`, its `activation_message`) are the Card's.";
    IM_FILE_REF = "im.file_ref", Error, "IM v1 §9; IM v2 §5", "Each file item has a `file_ref`, unique within a `chat.message`.";
    IM_FILE_TYPE = "im.file_type", Error, "IM v2 §5", "`files[].type` is `image`, `video`, `audio` or `file`.";
    IM_FILE_URL = "im.file_url", Warning, "IM v1 §9", "`message.push` file items should give `download_url` or `url`.";
    IM_FILE_BYTES = "im.file_bytes", Error, "IM v2 §5", "Messages and file items carry no file bytes, base64 or local paths (`base64`, `data`, `path`, ...).";
    IM_DOWNLOAD_URL_SCHEME = "im.download_url_scheme", Error, "IM v2 §5", "`download_url`/`url` is an absolute http(s) URL or a relative Connector URI; `file:`, `data:`, other schemes and local paths are refused.";
    IM_V1_FORBIDDEN_FIELD = "im_v1.forbidden_field", Error, "IM v1 §10", "xAgent-internal ids (`session_id`, `user_connector_id`, `user_id`, `connector_id`, `role`) must not appear in a `message.push` payload.";
    IM_V2_FORBIDDEN_FIELD = "im_v2.forbidden_field", Error, "IM v2 §3", "IM v2 payloads must not carry `session_id`, `user_connector_id`, `user_id`, `connector_id` or `role`.";
    IM_V2_MESSAGE_ID = "im_v2.message_id", Error, "IM v2 §5-7", "`message_id` is a required non-empty string.";
    CHAT_MESSAGE_CONTENT = "chat_message.content", Error, "IM v2 §5", "At least one of `text` and `files` is non-empty.";
    CHAT_MESSAGE_DOWNLOAD_URL = "chat_message.download_url", Error, "IM v2 §5", "Connector-to-xAgent file items carry `download_url`.";
    CHAT_DELTA_SEQUENCE = "chat_delta.sequence", Error, "IM v2 §6", "`sequence` is an integer starting at 1.";
    CHAT_DELTA_TEXT = "chat_delta.text", Error, "IM v2 §6", "`text` is a required string.";
    CHAT_DELTA_FILES = "chat_delta.files", Error, "IM v2 §6", "A delta carries text only, never files.";
    CHAT_ACK_REPLY_TO = "chat_ack.reply_to", Error, "IM v2 §7", "`chat.message.ack` sets `reply_to` to the acknowledged message's `packet_id`.";
    CHAT_ACK_STATUS = "chat_ack.status", Error, "IM v2 §7", "`status` is `accepted`, `duplicate` or `rejected`.";
    CHAT_ACK_REJECTED = "chat_ack.rejected", Error, "IM v2 §7", "A `rejected` ack gives a stable `code` and a Boolean `retryable`.";
    CHAT_ACTIVITY_STATUS = "chat_activity.status", Error, "IM v2 §8", "`status` is `thinking`, `tool` or `idle`.";
    CHAT_ACTIVITY_TOOL_NAME = "chat_activity.tool_name", Error, "IM v2 §8", "`tool_name` is required for `tool` (max 256 bytes) and forbidden otherwise.";
    CHAT_ACTIVITY_CONTENT = "chat_activity.content", Error, "IM v2 §8", "An activity carries no reasoning, Tool arguments or results, or error details, and its `tool_name` is no path or URL.";
}

/// The rule with this id.
pub fn by_id(id: &str) -> Option<&'static Rule> {
    ALL.iter().find(|rule| rule.id == id)
}

/// The rules table as Markdown (the crate docs include it).
pub fn markdown_table() -> String {
    let mut out =
        String::from("| Rule id | Severity | Source | Requirement |\n|---|---|---|---|\n");
    for rule in ALL {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            rule.id, rule.severity, rule.section, rule.summary
        ));
    }
    out
}

// The refusal code is a fact of the rules table, so it lives beside it (the report module
// stays below this one).
impl Report {
    /// The wire error code a runtime answers a refused packet with: the most specific code
    /// the protocol has for its first error (`tool_not_found` for an undeclared Tool,
    /// `connector_channel_id_required` for a missing channel), else `invalid_packet`.
    pub fn error_code(&self) -> xagent_protocol_types::ErrorCode {
        use xagent_protocol_types::ErrorCode;
        match self.errors().next().map(|v| v.rule.as_str()) {
            Some(id) if id == TOOL_INVOKE_TOOL_ID.id => ErrorCode::ToolNotFound,
            Some(id) if id == PACKET_CHANNEL_REQUIRED.id => ErrorCode::ConnectorChannelIdRequired,
            _ => ErrorCode::InvalidPacket,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_well_formed() {
        let mut seen = std::collections::HashSet::new();
        for rule in ALL {
            assert!(seen.insert(rule.id), "duplicate {}", rule.id);
            assert!(
                rule.id.bytes().all(|b| b.is_ascii_lowercase()
                    || b == b'_'
                    || b == b'.'
                    || b.is_ascii_digit()),
                "{}",
                rule.id
            );
        }
    }

    #[test]
    fn crate_docs_table_is_current() {
        if std::env::var_os("XAGENT_BLESS").is_some() {
            let text = format!(
                "## Rules\n\nEvery rule the validators enforce. Severity `error` marks hard validation, forbidden\nitems, required fields and Must rules; `warning` marks Should rules. Sources: \"protocol N\" is\na section of the common protocol text, \"IM v1/IM v2/Device §N\" a section of a Profile text,\n\"notes\" the project's binding spec notes.\n\n{}",
                markdown_table()
            );
            std::fs::write(concat!(env!("CARGO_MANIFEST_DIR"), "/RULES.md"), text).unwrap();
            return;
        }
        let docs = include_str!("../RULES.md");
        assert!(
            docs.contains(&markdown_table()),
            "RULES.md is stale; regenerate it from rules::markdown_table()"
        );
    }
}
