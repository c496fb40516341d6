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

/// What was wrong with a Connector's certificate, read from a refused TLS handshake. Its text
/// says what is wrong and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsProblem {
    /// No trusted authority issued the certificate.
    #[error(
        "the certificate was issued by an authority this side does not trust (unknown issuer); \
         give that authority's certificate with --ca-cert FILE (TlsTrust::with_ca_pem_file)"
    )]
    UnknownIssuer,
    /// The certificate does not name the host of the Base URL.
    #[error(
        "the certificate is not valid for the host of the Base URL (name mismatch); use the \
         host name or address the certificate lists, or have it issued for this one"
    )]
    NameMismatch,
    /// The certificate expired.
    #[error("the certificate has expired; renew the Connector's certificate")]
    Expired,
    /// The certificate is not valid yet.
    #[error(
        "the certificate is not valid yet; check the clock of this machine and of the one that issued it"
    )]
    NotYetValid,
    /// The server presents a self-signed authority certificate as its own: a certificate
    /// marked as a CA cannot also be the server's certificate, even when given to `--ca-cert`.
    #[error(
        "the server presents a self-signed CA certificate as its own certificate, which TLS \
         refuses even when that certificate is given to --ca-cert; make a CA and a server \
         certificate it signs, give the server the second and --ca-cert the first (docs/DEPLOY.md, \"xAgent in front of a private CA\")"
    )]
    SelfSignedServerCertificate,
    /// Any other refusal, in rustls' words.
    #[error("{0}; check the certificate the Connector serves and the --ca-cert given")]
    Other(String),
}

impl TlsProblem {
    fn from_rustls(error: &rustls::Error) -> Self {
        use rustls::CertificateError as Cert;
        let rustls::Error::InvalidCertificate(certificate) = error else {
            return Self::Other(error.to_string());
        };
        match certificate {
            Cert::UnknownIssuer => Self::UnknownIssuer,
            Cert::NotValidForName | Cert::NotValidForNameContext { .. } => Self::NameMismatch,
            Cert::Expired | Cert::ExpiredContext { .. } => Self::Expired,
            Cert::NotValidYet | Cert::NotValidYetContext { .. } => Self::NotYetValid,
            Cert::Other(other)
                if std::error::Error::source(other)
                    .and_then(|source| source.downcast_ref::<webpki::Error>())
                    .is_some_and(|e| matches!(e, webpki::Error::CaUsedAsEndEntity)) =>
            {
                Self::SelfSignedServerCertificate
            }
            other => Self::Other(format!("the certificate was refused: {other}")),
        }
    }

    /// The TLS refusal in an error's source chain, if any (reqwest, hyper and tungstenite wrap
    /// rustls' error, some inside an `io::Error`).
    pub fn find(error: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut current = Some(error);
        while let Some(error) = current {
            if let Some(tls) = error.downcast_ref::<rustls::Error>() {
                return Some(Self::from_rustls(tls));
            }
            // An io::Error's source() skips what it wraps (tokio-rustls wraps rustls' error in
            // one io::Error, and hyper in another): look inside each.
            let mut io = error.downcast_ref::<std::io::Error>();
            while let Some(inner) = io.and_then(std::io::Error::get_ref) {
                if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                    return Some(Self::from_rustls(tls));
                }
                io = inner.downcast_ref::<std::io::Error>();
            }
            current = error.source();
        }
        None
    }
}

/// An error and its sources as one line (`a: b: c`), without repeating a source whose text
/// its wrapper already shows.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(source) = current {
        let part = source.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        current = source.source();
    }
    text
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
