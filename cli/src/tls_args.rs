//! `--ca-cert`: the certificate authorities the xAgent-side commands (`conformance`, `mcp`,
//! `mock-xagent`) trust for an `https` Base URL, one definition for all of them.

use std::path::PathBuf;

use clap::Args;
use xagent_client_runtime::TlsTrust;

/// Which certificate authorities to trust besides the system's.
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Also trust the certificate authority in this PEM file for an https Base URL (a proxy
    /// whose certificate a private CA signed); repeatable. Default: the system's trust store.
    #[arg(long = "ca-cert", value_name = "FILE", env = "XAGENT_CONNECTOR_CA_CERT")]
    ca_certs: Vec<PathBuf>,
}

impl TlsArgs {
    /// The trust these flags describe, or a message naming the file that could not be used.
    pub fn trust(&self) -> Result<TlsTrust, String> {
        self.ca_certs.iter().try_fold(TlsTrust::system(), |trust, path| {
            trust.with_ca_pem_file(path).map_err(|e| format!("--ca-cert: {e}"))
        })
    }
}
