//! Signed download URLs: `/files/refs/{file_ref}?exp=<unix ms>&sig=<hex HMAC-SHA256>`.

use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use xagent_protocol_types::{ConnectorChannelId, FileRef, Secret, paths};

use crate::TransferError;

type HmacSha256 = Hmac<Sha256>;

/// Default lifetime of a signed download URL: 15 minutes.
pub const DEFAULT_URL_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// Shortest accepted signing secret, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// Domain separator, so a signature made for this purpose can never be replayed elsewhere.
const DOMAIN: &[u8] = b"xagent.file-transfer.download-url.v1";

/// Why a signature was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// The signature does not match (tampered URL, other channel, other key, bad hex).
    #[error("the download URL signature is invalid")]
    Invalid,
    /// The signature is genuine but its expiry has passed.
    #[error("the download URL has expired; ask for a fresh one")]
    Expired,
}

impl From<SignatureError> for TransferError {
    fn from(error: SignatureError) -> Self {
        match error {
            SignatureError::Invalid => Self::Forbidden("the download URL signature is invalid"),
            SignatureError::Expired => {
                Self::FileNotFound("the download URL has expired; ask for a fresh one")
            }
        }
    }
}

/// A download URL together with the moment it stops working.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedUrl {
    /// The URL, relative unless the signer has an absolute base.
    pub url: String,
    /// Expiry of the signature (Unix ms).
    pub expires_at: u64,
}

/// Signs and verifies download URLs with HMAC-SHA256 over the file_ref, the expiry and the
/// channel, keyed by a server secret. Cheap to clone.
///
/// The three fields are length-prefixed before hashing, so no choice of channel id can make two
/// different triples hash the same input.
#[derive(Clone)]
pub struct UrlSigner {
    key: Arc<Secret>,
    lifetime: Duration,
    base: Arc<str>,
}

impl std::fmt::Debug for UrlSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UrlSigner")
            .field("key", &self.key)
            .field("lifetime", &self.lifetime)
            .field("base", &self.base)
            .finish()
    }
}

impl UrlSigner {
    /// A signer keyed by `secret`, which must hold at least [`MIN_SECRET_BYTES`] bytes (use 32
    /// random bytes). Keep the secret stable across restarts so issued URLs stay valid.
    pub fn new(secret: Secret) -> Result<Self, TransferError> {
        if secret.expose().len() < MIN_SECRET_BYTES {
            return Err(TransferError::WeakSecret { min: MIN_SECRET_BYTES });
        }
        Ok(Self { key: Arc::new(secret), lifetime: DEFAULT_URL_LIFETIME, base: Arc::from("") })
    }

    /// A signer with a fresh random 256-bit key. URLs it issued stop working after a restart.
    pub fn random() -> Self {
        let mut key = [0u8; 32];
        rand::fill(&mut key[..]);
        Self {
            key: Arc::new(Secret::new(hex::encode(key))),
            lifetime: DEFAULT_URL_LIFETIME,
            base: Arc::from(""),
        }
    }

    /// Sets how long issued URLs stay valid (default 15 minutes).
    #[must_use]
    pub fn with_lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Sets what goes in front of `/files/refs/...`: the Base URL path prefix (`/connector`) or a
    /// whole absolute Base URL (`https://host/connector`). A trailing `/` is dropped.
    #[must_use]
    pub fn with_base(mut self, base: impl AsRef<str>) -> Self {
        self.base = Arc::from(base.as_ref().trim_end_matches('/'));
        self
    }

    /// How long issued URLs stay valid.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// The hex signature for one file, channel and expiry.
    pub fn sign(
        &self,
        file_ref: &FileRef,
        channel: &ConnectorChannelId,
        expires_at: u64,
    ) -> String {
        hex::encode(self.mac(file_ref, channel, expires_at).finalize().into_bytes())
    }

    /// Checks a signature in constant time, then its expiry against `now` (Unix ms). A bad
    /// signature is reported as [`SignatureError::Invalid`] even when it has also expired.
    pub fn verify(
        &self,
        file_ref: &FileRef,
        channel: &ConnectorChannelId,
        expires_at: u64,
        signature: &str,
        now: u64,
    ) -> Result<(), SignatureError> {
        let bytes = hex::decode(signature).map_err(|_| SignatureError::Invalid)?;
        self.mac(file_ref, channel, expires_at)
            .verify_slice(&bytes)
            .map_err(|_| SignatureError::Invalid)?;
        if now > expires_at {
            return Err(SignatureError::Expired);
        }
        Ok(())
    }

    /// A signed URL valid from `now` for the configured lifetime, but never past `not_after`
    /// (the file's own expiry).
    pub fn signed_url(
        &self,
        file_ref: &FileRef,
        channel: &ConnectorChannelId,
        now: u64,
        not_after: u64,
    ) -> SignedUrl {
        let lifetime = u64::try_from(self.lifetime.as_millis()).unwrap_or(u64::MAX);
        let expires_at = now.saturating_add(lifetime).min(not_after);
        let sig = self.sign(file_ref, channel, expires_at);
        let url = format!(
            "{}{}{}?exp={expires_at}&sig={sig}",
            self.base,
            paths::FILE_REFS_PREFIX,
            file_ref.as_str()
        );
        SignedUrl { url, expires_at }
    }

    fn mac(&self, file_ref: &FileRef, channel: &ConnectorChannelId, expires_at: u64) -> HmacSha256 {
        // HMAC accepts keys of any length, so this never fails.
        let mut mac = match HmacSha256::new_from_slice(self.key.expose().as_bytes()) {
            Ok(mac) => mac,
            Err(_) => unreachable_hmac(),
        };
        let exp = expires_at.to_string();
        for part in
            [DOMAIN, file_ref.as_str().as_bytes(), exp.as_bytes(), channel.as_str().as_bytes()]
        {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }
}

#[cold]
fn unreachable_hmac() -> ! {
    unreachable!("HMAC-SHA256 accepts keys of every length")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> UrlSigner {
        UrlSigner::new(Secret::new("0123456789abcdef0123456789abcdef")).unwrap()
    }

    fn ids() -> (FileRef, ConnectorChannelId) {
        (FileRef::new("file_00112233445566778899aabbccddeeff"), ConnectorChannelId::new("cch_a"))
    }

    #[test]
    fn signature_round_trips() {
        let (file, channel) = ids();
        let sig = signer().sign(&file, &channel, 5_000);
        assert_eq!(sig.len(), 64);
        assert_eq!(signer().verify(&file, &channel, 5_000, &sig, 4_000), Ok(()));
        assert_eq!(signer().verify(&file, &channel, 5_000, &sig, 5_000), Ok(()));
    }

    #[test]
    fn signature_for_another_channel_is_invalid() {
        let (file, channel) = ids();
        let sig = signer().sign(&file, &channel, 5_000);
        let other = ConnectorChannelId::new("cch_b");
        assert_eq!(signer().verify(&file, &other, 5_000, &sig, 0), Err(SignatureError::Invalid));
    }

    #[test]
    fn signature_with_tampered_expiry_or_file_is_invalid() {
        let (file, channel) = ids();
        let sig = signer().sign(&file, &channel, 5_000);
        assert_eq!(signer().verify(&file, &channel, 9_000, &sig, 0), Err(SignatureError::Invalid));
        let other = FileRef::new("file_ffffffffffffffffffffffffffffffff");
        assert_eq!(signer().verify(&other, &channel, 5_000, &sig, 0), Err(SignatureError::Invalid));
    }

    #[test]
    fn signature_from_another_key_is_invalid() {
        let (file, channel) = ids();
        let sig = UrlSigner::random().sign(&file, &channel, 5_000);
        assert_eq!(signer().verify(&file, &channel, 5_000, &sig, 0), Err(SignatureError::Invalid));
    }

    #[test]
    fn malformed_signature_is_invalid_not_a_panic() {
        let (file, channel) = ids();
        for sig in ["", "zz", "abc", "é", &"0".repeat(64)] {
            assert_eq!(
                signer().verify(&file, &channel, 5_000, sig, 0),
                Err(SignatureError::Invalid),
                "{sig}"
            );
        }
    }

    #[test]
    fn expired_signature_is_reported_as_expired() {
        let (file, channel) = ids();
        let sig = signer().sign(&file, &channel, 5_000);
        assert_eq!(
            signer().verify(&file, &channel, 5_000, &sig, 5_001),
            Err(SignatureError::Expired)
        );
    }

    #[test]
    fn url_lifetime_defaults_to_15_minutes_and_stops_at_file_expiry() {
        let (file, channel) = ids();
        let url = signer().signed_url(&file, &channel, 1_000, u64::MAX);
        assert_eq!(url.expires_at, 1_000 + 15 * 60 * 1_000);
        let prefix = "/files/refs/file_00112233445566778899aabbccddeeff?exp=901000&sig=";
        assert!(url.url.starts_with(prefix), "{}", url.url);
        let short = signer().signed_url(&file, &channel, 1_000, 2_000);
        assert_eq!(short.expires_at, 2_000);
    }

    #[test]
    fn url_base_is_prepended() {
        let (file, channel) = ids();
        let url = signer().with_base("https://h/p/").signed_url(&file, &channel, 0, 10);
        assert!(url.url.starts_with("https://h/p/files/refs/file_"), "{}", url.url);
    }

    #[test]
    fn short_secret_is_refused() {
        assert!(matches!(
            UrlSigner::new(Secret::new("short")),
            Err(TransferError::WeakSecret { .. })
        ));
    }

    #[test]
    fn debug_does_not_show_the_key() {
        let text = format!("{:?}", signer());
        assert!(!text.contains("0123456789abcdef"), "{text}");
    }
}
