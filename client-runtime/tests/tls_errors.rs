//! A refused certificate is reported as a TLS problem that says what is wrong and what to
//! change, on the control plane (HTTP) and the data plane (WebSocket) alike.
//!
//! Each case runs a real TLS server on 127.0.0.1 (rustls, in a thread) with one of the
//! certificates in `tests/fixtures/tls/`, made with openssl: `ca.pem` issued `server.pem`
//! (127.0.0.1 and localhost), `wrong-name.pem` (other.example) and `expired.pem` (valid for one
//! day in 2020); `self-signed.pem` is a self-signed CA certificate used as a server's own, as
//! `openssl req -x509` makes it.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use xagent_client_runtime::tls::TlsProblem;
use xagent_client_runtime::transport::{Transport, WsTransport};
use xagent_client_runtime::{BaseUrl, ClientError, ControlPlane, TlsTrust};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls").join(name)
}

/// Serves TLS with `name.pem` / `name.key` on a free port for a few handshakes; a completed
/// handshake gets a 404 and the connection closes. Returns the port.
fn serve(name: &str) -> u16 {
    let certificates = CertificateDer::pem_file_iter(fixture(&format!("{name}.pem")))
        .expect("certificate file")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_file(fixture(&format!("{name}.key"))).expect("key");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certificates, key)
        .expect("server config");
    let config = Arc::new(config);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(8) {
            let Ok(mut tcp) = stream else { continue };
            let Ok(mut connection) = rustls::ServerConnection::new(config.clone()) else {
                continue;
            };
            let mut tls = rustls::Stream::new(&mut connection, &mut tcp);
            let mut buffer = [0u8; 4096];
            if tls.read(&mut buffer).is_ok() {
                let _ = tls.write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                );
                let _ = tls.flush();
            }
        }
    });
    port
}

fn trust(ca: Option<&str>) -> TlsTrust {
    match ca {
        Some(name) => TlsTrust::system().with_ca_pem_file(&fixture(name)).expect("CA file"),
        None => TlsTrust::system(),
    }
}

/// The control plane's and the data plane's errors for a server with `certificate`, trusting
/// `ca` besides the system's authorities.
async fn errors(certificate: &str, ca: Option<&str>) -> (ClientError, ClientError) {
    let port = serve(certificate);
    let base = BaseUrl::parse(&format!("https://127.0.0.1:{port}")).expect("Base URL");
    let control = ControlPlane::new(base.clone(), None).with_tls(&trust(ca));
    let http = control.health().await.expect_err("the request fails");
    let ws = WsTransport::new(base, None, 1 << 20).with_tls(trust(ca));
    let data = match ws.connect().await {
        Ok(_) => panic!("the WebSocket opened"),
        Err(error) => error,
    };
    (http, data)
}

fn problem(error: &ClientError) -> &TlsProblem {
    match error {
        ClientError::Tls { problem, .. } => problem,
        other => panic!("not a TLS error: {other}"),
    }
}

#[tokio::test]
async fn tls_unknown_issuer_names_tls_and_ca_cert() {
    let (http, data) = errors("server", None).await;
    for error in [&http, &data] {
        assert_eq!(problem(error), &TlsProblem::UnknownIssuer, "{error}");
        let text = error.to_string();
        assert!(text.starts_with("TLS to "), "{text}");
        assert!(text.contains("unknown issuer") && text.contains("--ca-cert"), "{text}");
        assert!(!text.contains("check that the Connector is running"), "{text}");
    }
}

#[tokio::test]
async fn tls_name_mismatch_is_named() {
    let (http, data) = errors("wrong-name", Some("ca.pem")).await;
    for error in [&http, &data] {
        assert_eq!(problem(error), &TlsProblem::NameMismatch, "{error}");
        assert!(error.to_string().contains("name mismatch"), "{error}");
    }
}

#[tokio::test]
async fn tls_expired_certificate_is_named() {
    let (http, data) = errors("expired", Some("ca.pem")).await;
    for error in [&http, &data] {
        assert_eq!(problem(error), &TlsProblem::Expired, "{error}");
        assert!(error.to_string().contains("expired"), "{error}");
    }
}

#[tokio::test]
async fn tls_self_signed_certificate_as_its_own_ca_is_refused_with_the_way_out() {
    let (http, data) = errors("self-signed", Some("self-signed.pem")).await;
    for error in [&http, &data] {
        assert_eq!(problem(error), &TlsProblem::SelfSignedServerCertificate, "{error}");
        let text = error.to_string();
        assert!(
            text.contains("self-signed CA certificate") && text.contains("DEPLOY.md"),
            "{text}"
        );
    }
}

#[tokio::test]
async fn tls_with_the_issuing_ca_the_handshake_succeeds() {
    let port = serve("server");
    let base = BaseUrl::parse(&format!("https://127.0.0.1:{port}")).expect("Base URL");
    let control = ControlPlane::new(base, None).with_tls(&trust(Some("ca.pem")));
    match control.health().await {
        Err(ClientError::Http { status: 404, .. }) => {}
        other => panic!("expected the server's 404 after the handshake, got {other:?}"),
    }
}

#[tokio::test]
async fn a_refused_connection_says_why_not_only_that_sending_failed() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    drop(listener);
    let base = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).expect("Base URL");
    let error = ControlPlane::new(base, None).health().await.expect_err("nothing listens");
    let text = error.to_string();
    assert!(matches!(error, ClientError::Transport { .. }), "{text}");
    assert!(text.to_lowercase().contains("refused"), "the cause is shown: {text}");
}
