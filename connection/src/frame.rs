//! One WebSocket message, independent of the WebSocket library, and the close codes the
//! data plane uses.

/// One WebSocket message, independent of the WebSocket library (the kinds are fixed by
/// WebSocket, so matching on all of them is fine).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    /// A text frame (one JSON packet).
    Text(String),
    /// A binary frame (not part of the protocol).
    Binary(Vec<u8>),
    /// A WebSocket ping (answered by the WebSocket layer).
    Ping(Vec<u8>),
    /// A WebSocket pong.
    Pong(Vec<u8>),
    /// A close frame with an optional code and reason.
    Close(Option<(u16, String)>),
}

/// A failure reading a frame, typed by the adapter that read it (each WebSocket library maps
/// its own errors), so the driver never reads an error's text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The frame exceeded the size limit (answered with close 1009).
    #[error("the frame is larger than the size limit")]
    TooLarge,
    /// A text frame was not valid UTF-8 (answered with close 1007).
    #[error("a text frame was not UTF-8")]
    InvalidUtf8,
    /// Reading failed otherwise (the socket broke).
    #[error("{0}")]
    Read(String),
}

/// WebSocket close code: normal closure.
pub const CLOSE_NORMAL: u16 = 1000;
/// WebSocket close code: policy violation (unsupported protocol version, a refused hello).
pub const CLOSE_POLICY: u16 = 1008;
/// WebSocket close code: message too big.
pub const CLOSE_TOO_BIG: u16 = 1009;
/// WebSocket close code: going away (server shutdown).
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// WebSocket close code: invalid frame payload data (a text frame that is not UTF-8).
pub const CLOSE_INVALID_DATA: u16 = 1007;
