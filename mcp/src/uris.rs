//! The URIs of the resources the bridge offers besides files (`xagent-connector://files/...`,
//! in [`crate::files`]): a channel's messages and a pending sign-in. Below both the link and
//! the MCP face, which both name them.

/// Resource that shows a pending sign-in (a QR flow's link and image).
pub const SIGN_IN_URI: &str = "xagent-connector://sign-in";

pub(crate) const CHANNEL_URI_PREFIX: &str = "xagent-connector://channels/";
pub(crate) const CHANNEL_URI_SUFFIX: &str = "/messages";

/// The resource URI of a channel's messages.
pub fn channel_uri(channel: &str) -> String {
    format!("{CHANNEL_URI_PREFIX}{channel}{CHANNEL_URI_SUFFIX}")
}

/// The channel a messages URI names, if it is one.
pub fn channel_of(uri: &str) -> Option<&str> {
    uri.strip_prefix(CHANNEL_URI_PREFIX)?.strip_suffix(CHANNEL_URI_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_uris_name_the_channel() {
        assert_eq!(channel_uri("cch_1"), "xagent-connector://channels/cch_1/messages");
        assert_eq!(channel_of(&channel_uri("cch_1")), Some("cch_1"));
        assert_eq!(channel_of("xagent-connector://channels/cch_1"), None);
    }
}
