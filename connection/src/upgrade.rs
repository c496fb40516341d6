//! The xAgent side's WebSocket upgrade request, written once for every client of `/ws` (the
//! runtime, the conformance probe, the test kit's raw client, the benchmarks): the protocol's
//! subprotocol offered and the system API key as `Authorization: Bearer`.

use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use xagent_protocol_types::SUBPROTOCOL;

/// Why an upgrade request could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UpgradeRequestError {
    /// The URL is not a `ws`/`wss` URL.
    #[error("bad WebSocket URL: {0}")]
    Url(String),
    /// The API key holds characters a header cannot carry.
    #[error("the API key is not a valid header value")]
    ApiKey,
}

/// The upgrade request to `ws_url`: `Sec-WebSocket-Protocol` offers [`SUBPROTOCOL`] and, with
/// a key, `Authorization: Bearer <key>` is sent.
///
/// ```
/// let request = xagent_connection::upgrade_request("ws://127.0.0.1:1/ws", Some("k"))?;
/// assert_eq!(request.headers()["Authorization"], "Bearer k");
/// assert_eq!(request.headers()["Sec-WebSocket-Protocol"], xagent_protocol_types::SUBPROTOCOL);
/// # Ok::<(), xagent_connection::UpgradeRequestError>(())
/// ```
pub fn upgrade_request(
    ws_url: &str,
    api_key: Option<&str>,
) -> Result<Request, UpgradeRequestError> {
    let mut request =
        ws_url.into_client_request().map_err(|e| UpgradeRequestError::Url(e.to_string()))?;
    let headers = request.headers_mut();
    headers.insert("Sec-WebSocket-Protocol", HeaderValue::from_static(SUBPROTOCOL));
    if let Some(key) = api_key {
        let value = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| UpgradeRequestError::ApiKey)?;
        headers.insert("Authorization", value);
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_with_a_newline_and_a_url_without_a_host_are_refused() {
        assert_eq!(
            upgrade_request("ws://127.0.0.1:1/ws", Some("k\n")).err(),
            Some(UpgradeRequestError::ApiKey)
        );
        assert!(matches!(upgrade_request("not a url", None), Err(UpgradeRequestError::Url(_))));
        let request = upgrade_request("ws://127.0.0.1:1/ws", None).expect("a request");
        assert!(!request.headers().contains_key("Authorization"));
    }
}
