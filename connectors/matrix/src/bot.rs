//! The bot's Matrix account: one login kept in the state directory and reused across
//! restarts (its device, and with it the end-to-end keys in the crypto store, stay the same).
//!
//! Layout under `<state dir>/matrix/` (the directory mode 0700, files 0600):
//! - `session.json`: the user id, device id and access token of the login;
//! - `store/`: matrix-sdk's SQLite state and crypto stores.
//!
//! With a password the bot logs in once and keeps the access token it got; with an access
//! token it asks the homeserver who the token belongs to. A session for another user, or a
//! store left without its session, is started afresh (a new device).

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::config::RequestConfig;
use matrix_sdk::{Client, SessionMeta, SessionTokens};
use xagent_protocol_types::Secret;

use crate::MatrixError;

/// How the bot proves who it is (from `XAGENT_MATRIX_PASSWORD` or
/// `XAGENT_MATRIX_ACCESS_TOKEN`; never the command line).
#[derive(Clone, Debug)]
pub enum Credentials {
    /// Log in with the account's password (once; the access token is kept).
    Password(Secret),
    /// Use an access token made for the bot (its device is the token's).
    AccessToken(Secret),
}

/// The name the bot's device gets in the user's device list.
pub const DEVICE_NAME: &str = "xAgent im.matrix";

/// How long one request may take; a sync's long poll is shorter than this.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

fn private_dir(dir: &Path) -> Result<(), MatrixError> {
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| MatrixError::State(format!("prepare {}: {e}", dir.display())))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), MatrixError> {
    let tmp = path.with_extension("tmp");
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        std::io::Write::write_all(&mut file, bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    result.map_err(|e| MatrixError::State(format!("write {}: {e}", path.display())))
}

/// Opens the bot's client: restores the kept session or logs in, and keeps the result.
pub async fn open(
    homeserver: &str,
    user: &str,
    credentials: &Credentials,
    state_dir: &Path,
) -> Result<Client, MatrixError> {
    let dir = state_dir.join("matrix");
    private_dir(&dir)?;
    let session_file = dir.join("session.json");
    let store = dir.join("store");
    let kept: Option<MatrixSession> = match std::fs::read(&session_file) {
        Ok(bytes) => serde_json::from_slice(&bytes).ok(),
        Err(_) => None,
    };
    let kept = kept.filter(|s| s.meta.user_id.as_str() == user);
    if kept.is_none() && store.exists() {
        // A store without its session belongs to a device nobody can log in as any more.
        tracing::warn!("im.matrix: no usable session for the kept store; starting a new device");
        std::fs::remove_dir_all(&store)
            .map_err(|e| MatrixError::State(format!("remove {}: {e}", store.display())))?;
    }
    private_dir(&store)?;
    let client = client(homeserver, &store).await?;
    forget_sdk_sync_position(&client).await?;
    match kept {
        Some(session) => {
            client
                .restore_session(session)
                .await
                .map_err(MatrixError::sdk("restore the session"))?;
        }
        None => {
            let session = login(&client, user, credentials).await?;
            let text = serde_json::to_vec(&session)
                .map_err(|e| MatrixError::State(format!("encode the session: {e}")))?;
            write_private(&session_file, &text)?;
        }
    }
    Ok(client)
}

/// Drops the SDK's own copy of the sync position before the session is activated. The
/// Connector syncs from the position it stored after handing a batch over, which may be one
/// batch behind the SDK's (a kill between the two); asked again, the homeserver answers that
/// batch once more, and the SDK, still holding its newer position, would discard it as "the
/// same response twice", losing its messages. Without its copy the SDK processes the batch
/// again (room state and keys are idempotent) and the Connector hands its messages over.
async fn forget_sdk_sync_position(client: &Client) -> Result<(), MatrixError> {
    use matrix_sdk::store::StateStoreDataKey;
    client
        .state_store()
        .remove_kv_data(StateStoreDataKey::SyncToken)
        .await
        .map_err(|e| MatrixError::State(format!("reset the SDK's sync position: {e}")))
}

async fn client(homeserver: &str, store: &Path) -> Result<Client, MatrixError> {
    Client::builder()
        .homeserver_url(homeserver)
        .sqlite_store(store, None)
        .request_config(RequestConfig::new().timeout(REQUEST_TIMEOUT).retry_limit(1))
        .build()
        .await
        .map_err(|e| MatrixError::Homeserver(format!("cannot use the homeserver: {e}")))
}

async fn login(
    client: &Client,
    user: &str,
    credentials: &Credentials,
) -> Result<MatrixSession, MatrixError> {
    match credentials {
        Credentials::Password(password) => {
            client
                .matrix_auth()
                .login_username(user, password.expose())
                .initial_device_display_name(DEVICE_NAME)
                .send()
                .await
                .map_err(|e| MatrixError::Login(login_problem(&e.to_string())))?;
        }
        Credentials::AccessToken(token) => {
            let probe = Client::builder()
                .homeserver_url(client.homeserver())
                .request_config(RequestConfig::new().timeout(REQUEST_TIMEOUT).retry_limit(1))
                .build()
                .await
                .map_err(|e| MatrixError::Homeserver(format!("cannot use the homeserver: {e}")))?;
            // Who the token belongs to, asked with the token alone.
            let who = whoami(&probe, token).await?;
            if who.0 != user {
                return Err(MatrixError::Login(format!(
                    "the access token belongs to {}, not to {user}",
                    who.0
                )));
            }
            let session = MatrixSession {
                meta: SessionMeta {
                    user_id: who.0.as_str().try_into().map_err(|_| {
                        MatrixError::Login("the homeserver named an invalid user id".into())
                    })?,
                    device_id: who.1.as_str().into(),
                },
                tokens: SessionTokens {
                    access_token: token.expose().to_owned(),
                    refresh_token: None,
                },
            };
            client
                .restore_session(session)
                .await
                .map_err(MatrixError::sdk("use the access token"))?;
        }
    }
    let session = client
        .matrix_auth()
        .session()
        .ok_or_else(|| MatrixError::Login("the homeserver returned no session".into()))?;
    Ok(session)
}

/// The user id and device id of an access token.
async fn whoami(probe: &Client, token: &Secret) -> Result<(String, String), MatrixError> {
    let url = format!(
        "{}/_matrix/client/v3/account/whoami",
        probe.homeserver().as_str().trim_end_matches('/')
    );
    let answer = reqwest_client()?
        .get(url)
        .bearer_auth(token.expose())
        .send()
        .await
        .map_err(|e| MatrixError::Homeserver(format!("whoami: {}", e.without_url())))?;
    if !answer.status().is_success() {
        return Err(MatrixError::Login(format!(
            "the homeserver refused the access token ({})",
            answer.status()
        )));
    }
    let body: serde_json::Value = answer
        .json()
        .await
        .map_err(|e| MatrixError::Homeserver(format!("whoami: {}", e.without_url())))?;
    let user = body["user_id"].as_str().unwrap_or_default().to_owned();
    let device = body["device_id"].as_str().unwrap_or_default().to_owned();
    if user.is_empty() || device.is_empty() {
        return Err(MatrixError::Login(
            "the access token has no device: make one with a login, not an admin token".into(),
        ));
    }
    Ok((user, device))
}

fn reqwest_client() -> Result<reqwest::Client, MatrixError> {
    reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| MatrixError::Homeserver(format!("HTTP client: {e}")))
}

/// A login failure in words that say what to do (never the password).
fn login_problem(error: &str) -> String {
    if error.contains("M_FORBIDDEN") || error.contains("403") {
        "the homeserver refused the user or password: check XAGENT_MATRIX_PASSWORD and --user"
            .into()
    } else if error.contains("M_LIMIT_EXCEEDED") || error.contains("429") {
        "the homeserver rate-limits logins right now: try again in a minute".into()
    } else {
        format!("the login failed: {error}")
    }
}
