//! The model's `connector_channel_id` argument. Every Card Tool declares it (a string, required,
//! protocol section 10), yet it selects nothing: section 10.1 resolves the channel from the
//! session binding and the user's channels, writes it into the `tool.invoke` envelope, and
//! passes the model's arguments unchanged; the Connector routes by the envelope only. An
//! xAgent side that stands in for the model (a bridge, a test client) fills the argument the
//! way a schema-following model would, so a Connector that checks its schema accepts the call.

use serde_json::{Map, Value};
use xagent_protocol_types::ConnectorChannelId;

/// The reserved model argument every Card Tool declares.
pub const CHANNEL_ARGUMENT: &str = "connector_channel_id";

/// Writes `channel` (the one section 10.1 resolved) into the arguments when the model left
/// `connector_channel_id` out; a value that is there is kept unchanged, whatever it is.
/// Returns whether it filled the argument in.
pub fn fill_channel_argument(
    arguments: &mut Map<String, Value>,
    channel: &ConnectorChannelId,
) -> bool {
    if arguments.contains_key(CHANNEL_ARGUMENT) {
        return false;
    }
    arguments.insert(CHANNEL_ARGUMENT.into(), Value::String(channel.to_string()));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn channel_argument_rule_a_missing_argument_is_filled_a_given_one_kept() {
        let channel = ConnectorChannelId::new("cch_resolved");
        let mut missing = Map::new();
        assert!(fill_channel_argument(&mut missing, &channel));
        assert_eq!(missing[CHANNEL_ARGUMENT], json!("cch_resolved"));
        let mut given = Map::new();
        given.insert(CHANNEL_ARGUMENT.into(), json!("cch_made_up"));
        assert!(!fill_channel_argument(&mut given, &channel));
        assert_eq!(given[CHANNEL_ARGUMENT], json!("cch_made_up"), "passed on unchanged");
    }
}
