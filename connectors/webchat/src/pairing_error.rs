//! Why a pairing step on the page failed: below both the pairings (which refuse with it) and
//! the crate's error type (which carries it), so neither imports the other's module for it.

/// Why a step on the page failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    /// No session has this link (never issued, replaced by a refresh, or already used).
    #[error("this pairing link is not valid; ask for a new QR code")]
    Unknown,
    /// The link expired.
    #[error("this pairing link has expired; ask for a new QR code")]
    Expired,
    /// The link was already confirmed (or is being confirmed in another window).
    #[error("this pairing link was already used")]
    Used,
}
