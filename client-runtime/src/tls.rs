//! Which certificate authorities xAgent trusts for an `https` / `wss` Connector.
//!
//! One [`TlsTrust`] serves every socket xAgent opens to a Connector: the control and transfer
//! planes (HTTP), the data plane (WebSocket) and inbound downloads. By default it is the
//! system's trust store; a deployment whose Connector sits behind a proxy with a private CA
//! adds that CA's certificate ([`TlsTrust::with_ca_pem_file`]) instead of turning checks off.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// The certificate authorities a client trusts; cheap to clone.
///
/// ```
/// use xagent_client_runtime::TlsTrust;
///
/// let trust = TlsTrust::system();
/// assert_eq!(trust.extra_authorities(), 0);
/// assert!(TlsTrust::system().with_ca_pem(b"not a certificate").is_err());
/// ```
#[derive(Clone, Default)]
pub struct TlsTrust {
    /// The system's roots plus the added ones, ready for rustls; `None` for the system's alone
    /// (each library's own default then).
    added: Option<Added>,
}

#[derive(Clone)]
struct Added {
    /// The added authorities, kept so a later addition builds on them.
    certificates: Vec<CertificateDer<'static>>,
    config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTrust").field("extra_authorities", &self.extra_authorities()).finish()
    }
}

/// Why a CA certificate could not be trusted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read the CA certificate file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// What the system said.
        reason: String,
    },
    /// The text holds no PEM `CERTIFICATE` block, or a broken one.
    #[error(
        "{source_name} holds no usable PEM certificate ({reason}): give the CA's certificate, the `-----BEGIN CERTIFICATE-----` block"
    )]
    NoCertificate {
        /// Where the text came from.
        source_name: String,
        /// What was wrong.
        reason: String,
    },
    /// rustls could not be set up (no safe protocol version with the crypto provider).
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

impl TlsTrust {
    /// The system's trust store only (the default).
    pub fn system() -> Self {
        Self::default()
    }

    /// Also trusts the certificate authorities in a PEM file (one or more `CERTIFICATE` blocks).
    pub fn with_ca_pem_file(self, path: &Path) -> Result<Self, TlsError> {
        let pem = std::fs::read(path).map_err(|e| TlsError::Unreadable {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        self.add(&pem, &path.display().to_string())
    }

    /// Also trusts the certificate authorities in PEM text.
    pub fn with_ca_pem(self, pem: &[u8]) -> Result<Self, TlsError> {
        self.add(pem, "the PEM text")
    }

    /// How many authorities were added to the system's.
    pub fn extra_authorities(&self) -> usize {
        self.added.as_ref().map_or(0, |added| added.certificates.len())
    }

    fn add(self, pem: &[u8], source_name: &str) -> Result<Self, TlsError> {
        let no_certificate = |reason: String| TlsError::NoCertificate {
            source_name: source_name.to_owned(),
            reason,
        };
        let certificates = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| no_certificate(e.to_string()))?;
        if certificates.is_empty() {
            return Err(no_certificate("no CERTIFICATE block".into()));
        }
        let mut all = self.added.map(|added| added.certificates).unwrap_or_default();
        all.extend(certificates);
        let mut roots = RootCertStore { roots: system_roots().roots.clone() };
        for certificate in &all {
            roots.add(certificate.clone()).map_err(|e| no_certificate(e.to_string()))?;
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Setup(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self { added: Some(Added { certificates: all, config: Arc::new(config) }) })
    }

    /// `builder` trusting these authorities (unchanged for the system's alone), for a client of
    /// one's own that must agree with the runtime's.
    pub fn http(&self, builder: reqwest::ClientBuilder) -> reqwest::ClientBuilder {
        match &self.added {
            Some(added) => builder.tls_backend_preconfigured(added.config.as_ref().clone()),
            None => builder,
        }
    }

    /// The WebSocket connector trusting these authorities (`None`: the system's alone, which
    /// tokio-tungstenite's own connector uses), for `connect_async_tls_with_config`.
    pub fn websocket(&self) -> Option<tokio_tungstenite::Connector> {
        self.added.as_ref().map(|added| tokio_tungstenite::Connector::Rustls(added.config.clone()))
    }
}

/// The system's root certificates, read once per process.
fn system_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        roots
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed CA made with openssl for these tests (its key was discarded).
    const TEST_CA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/test-ca.pem");

    #[test]
    fn a_ca_file_is_added_to_the_systems_and_later_ones_keep_the_earlier() {
        let trust = TlsTrust::system().with_ca_pem_file(Path::new(TEST_CA)).expect("a CA");
        assert_eq!(trust.extra_authorities(), 1);
        assert!(trust.websocket().is_some(), "the data plane gets the same trust");
        let twice = trust.with_ca_pem_file(Path::new(TEST_CA)).expect("again");
        assert_eq!(twice.extra_authorities(), 2);
        assert_eq!(format!("{twice:?}"), "TlsTrust { extra_authorities: 2 }");
        assert!(TlsTrust::system().websocket().is_none(), "the system's: the library default");
    }

    #[test]
    fn an_unusable_ca_file_is_an_error_that_says_what_to_give() {
        let missing = TlsTrust::system().with_ca_pem_file(Path::new("/nonexistent/ca.pem"));
        assert!(matches!(missing, Err(TlsError::Unreadable { .. })));
        let empty = TlsTrust::system().with_ca_pem(b"# no certificate here\n").unwrap_err();
        assert!(matches!(empty, TlsError::NoCertificate { .. }));
        assert!(empty.to_string().contains("BEGIN CERTIFICATE"), "{empty}");
        let broken = TlsTrust::system()
            .with_ca_pem(b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n");
        assert!(broken.is_err());
    }
}
