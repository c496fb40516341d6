//! `xagent-connector demo`: the whole protocol in one process. It starts the `im.webchat`
//! Connector (state under `./.xagent-demo/`) and an xAgent stand-in built on
//! `xagent-client-runtime` that connects over the real WebSocket, opens the room `demo` with
//! the form flow, and answers every visitor message with a streamed reply: activity,
//! deltas, the final message, and the visitor's file sent back when there was one. It prints
//! the URL to open, the system API key (`--api-key` sets it) and a ready-to-paste
//! `xagent-connector conformance` command that signs in to a room of its own.
//!
//! The stand-in rejects (for good) any message starting with `/reject`, to show how a
//! rejection looks on the page. The room's access code and the channel id are kept in the
//! state directory, so a second run reopens the same room and channel and delivers what
//! visitors sent meanwhile.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use xagent_client_runtime::prelude::*;
use xagent_client_runtime::{BaseUrl, ControlPlane};
use xagent_connector_webchat::{
    CARD_ID, QR_FLOW, ROOM_FLOW, Webchat, WebchatOptions, room_id_from_name,
};
use xagent_protocol_types::{
    AuthStart, AuthStatus, AuthStatusRequest, ChatActivity, ChatMessage, ConnectionStatus,
    PROFILE_IM_V2,
};

use crate::EXIT_USAGE;
use crate::common_args::bind;
use crate::webchat::init_logs;

/// Options of `demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address to listen on (host:port; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Directory for the demo's state.
    #[arg(long, default_value = ".xagent-demo")]
    state_dir: PathBuf,
    /// The URL visitors reach the page at (default http://<listen address>).
    #[arg(long)]
    public_url: Option<String>,
    /// Name of the room the stand-in opens.
    #[arg(long, default_value = "demo")]
    room: String,
    /// Milliseconds between streamed reply fragments.
    #[arg(long, default_value_t = 90)]
    delta_interval: u64,
    /// The system API key of the demo's Connector (default: a random one, printed).
    #[arg(long, env = "XAGENT_CONNECTOR_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The listener's connection limits (--trusted-proxy for a demo behind a reverse proxy).
    #[command(flatten)]
    listener: crate::listen_args::ListenArgs,
    /// Certificate authorities the agent stand-in trusts for an https --public-url (it reaches
    /// the Connector there, as xAgent would, so the download URLs it gets resolve).
    #[command(flatten)]
    tls: crate::tls_args::TlsArgs,
}

const ACCESS_CODE_FILE: &str = "demo-access-code";
/// The demo room's owner code (new rooms need one), kept beside the access code.
const OWNER_CODE_FILE: &str = "demo-owner-code";
const CHANNEL_FILE: &str = "demo-channel";
/// Channels of rooms paired through the QR flow, one per line: reopened at the next start so
/// paired rooms keep their agent across demo restarts.
const PAIRED_FILE: &str = "demo-paired-channels";

fn random_hex(bytes: usize) -> String {
    (0..bytes).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// Reads a small persisted value, or creates it.
fn persisted(dir: &Path, name: &str, make: impl FnOnce() -> String) -> std::io::Result<String> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(value) if !value.trim().is_empty() => Ok(value.trim().to_owned()),
        _ => {
            let value = make();
            std::fs::write(&path, &value)?;
            Ok(value)
        }
    }
}

/// Runs the demo until Ctrl-C.
pub fn run_command(args: DemoArgs) -> ExitCode {
    let limits = match args.listener.limits() {
        Ok(limits) => limits,
        Err(message) => return crate::usage("demo", message),
    };
    let tls = match args.tls.trust() {
        Ok(tls) => tls,
        Err(message) => return crate::usage("demo", message),
    };
    init_logs("warn");
    let Some(room_id) = room_id_from_name(&args.room) else {
        return crate::usage("demo", "the room name needs a letter or digit");
    };
    if let Err(error) = std::fs::create_dir_all(&args.state_dir) {
        eprintln!("xagent-connector demo: cannot create {}: {error}", args.state_dir.display());
        return ExitCode::from(EXIT_USAGE);
    }
    let access_code = match persisted(&args.state_dir, ACCESS_CODE_FILE, || random_hex(6)) {
        Ok(code) => code,
        Err(error) => return crate::usage("demo", format!("cannot keep the access code: {error}")),
    };
    let owner_code = match persisted(&args.state_dir, OWNER_CODE_FILE, || random_hex(12)) {
        Ok(code) => code,
        Err(error) => return crate::usage("demo", format!("cannot keep the owner code: {error}")),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            return crate::usage("demo", format!("cannot start the async runtime: {error}"));
        }
    };
    runtime.block_on(async move {
        let (listener, local_url) = match bind(&args.listen).await {
            Ok(bound) => bound,
            Err(error) => {
                eprintln!(
                    "xagent-connector demo: cannot listen on {}: {error} (choose another with --listen 127.0.0.1:PORT)",
                    args.listen
                );
                return ExitCode::from(EXIT_USAGE);
            }
        };
        let public_url = args.public_url.clone().unwrap_or_else(|| local_url.clone());
        // The key joins the two halves of this process, and lets `conformance` in.
        let api_key = args.api_key.clone().filter(|k| !k.is_empty()).unwrap_or_else(|| random_hex(24));
        let options = WebchatOptions::new(&args.state_dir, public_url)
            .with_api_key(Secret::new(api_key.clone()))
            .with_config(xagent_server_runtime::RuntimeConfig::default().with_listener(limits));
        let webchat = match Webchat::open(options).await {
            Ok(webchat) => webchat,
            Err(error) => {
                eprintln!("xagent-connector demo: {error}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(message) = args.listener.start_metrics(webchat.server()).await {
            return crate::usage("demo", message);
        }
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = {
            let webchat = webchat.clone();
            tokio::spawn(async move {
                webchat
                    .serve(listener, async move {
                        let _ = stop_rx.await;
                    })
                    .await
            })
        };
        let api_key_shown = api_key.clone();
        let conformance_code = random_hex(6);
        let stand_in = StandIn {
            base: match BaseUrl::parse(args.public_url.as_deref().unwrap_or(&local_url)) {
                Ok(base) => base,
                Err(error) => {
                    eprintln!("xagent-connector demo: {error}");
                    return ExitCode::FAILURE;
                }
            },
            api_key,
            state_dir: args.state_dir.clone(),
            room: args.room.clone(),
            access_code: access_code.clone(),
            owner_code,
            delta_interval: Duration::from_millis(args.delta_interval.clamp(10, 2_000)),
            tls,
        };
        let result = tokio::select! {
            result = stand_in.run(|| {
                println!("xAgent demo is running: an agent stand-in is connected to the im.webchat Connector.");
                println!();
                println!("  Open {}", webchat.room_url(&room_id, Some(&access_code)));
                println!();
                println!("(room {:?}, access code {access_code}; Connector Base URL {local_url}; Ctrl-C to stop)", args.room);
                println!();
                println!("  System API key: {api_key_shown}");
                println!("  Check the Connector (in a room of its own):");
                println!("    {} conformance --base-url {local_url} --api-key {api_key_shown} --flow {ROOM_FLOW} --input room_name=conformance --input access_code={conformance_code} --input owner_code=owner-{conformance_code}", crate::self_command());
            }) => result,
            () = xagent_server_runtime::ops::stop_signal() => Ok(()),
        };
        let _ = stop_tx.send(());
        let _ = server.await;
        match result {
            Ok(()) => {
                println!("demo stopped");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("xagent-connector demo: {error}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The xAgent stand-in.
struct StandIn {
    base: BaseUrl,
    api_key: String,
    state_dir: PathBuf,
    room: String,
    access_code: String,
    owner_code: String,
    delta_interval: Duration,
    tls: TlsTrust,
}

impl StandIn {
    /// Connects, opens (or reopens) the room's channel, signs it in, then answers messages
    /// until the data plane stops.
    async fn run(self, ready: impl FnOnce()) -> Result<(), String> {
        // Admitted like any xAgent admits a Connector, then checked against its Card.
        let Running { plane, mut events, .. } =
            Xagent::connect(self.base.as_str(), Secret::new(self.api_key.clone()))
                .expect_card(CARD_ID)
                .profiles([PROFILE_IM_V2])
                .tls(self.tls.clone())
                .start()
                .await
                .map_err(|e| format!("the stand-in did not admit the Connector: {e}"))?;
        tokio::time::timeout(Duration::from_secs(15), plane.connected())
            .await
            .map_err(|_| "the stand-in could not reach the Connector".to_owned())?
            .map_err(|e| e.to_string())?;
        let known = std::fs::read_to_string(self.state_dir.join(CHANNEL_FILE))
            .ok()
            .map(|id| ConnectorChannelId::new(id.trim()))
            .filter(|id| !id.as_str().is_empty());
        let ack = plane.open_channel(known.as_ref()).await.map_err(|e| e.to_string())?;
        let channel = ack.connector_channel_id.clone();
        if ack.connection_descriptor.connection.status != ConnectionStatus::Connected {
            let start = AuthStart::new(ROOM_FLOW).with_input(
                AuthInput::default()
                    .with("room_name", self.room.clone())
                    .with("access_code", self.access_code.clone())
                    .with("owner_code", self.owner_code.clone()),
            );
            let progress = plane.request(Some(&channel), start).await.map_err(|e| e.to_string())?;
            if progress.0.status != AuthStatus::Authenticated {
                return Err(format!(
                    "the room could not be opened: {}",
                    progress.0.message.unwrap_or_else(|| progress.0.status.to_string())
                ));
            }
        }
        let _ = std::fs::write(self.state_dir.join(CHANNEL_FILE), channel.as_str());
        plane.remember_channel(channel.clone()).await;
        reopen_paired(&plane, &self.state_dir).await;
        ready();
        tokio::spawn(offer_pairing(plane.clone(), self.state_dir.clone()));
        let control = plane.control();
        while let Some(event) = events.recv().await {
            match event {
                ClientEvent::ChatMessage(inbound) => {
                    let plane = plane.clone();
                    let control = control.clone();
                    let interval = self.delta_interval;
                    tokio::spawn(async move { answer(plane, control, inbound, interval).await });
                }
                ClientEvent::ChannelReopened { previous, current, .. }
                    if previous != current && previous == channel =>
                {
                    let _ = std::fs::write(self.state_dir.join(CHANNEL_FILE), current.as_str());
                }
                ClientEvent::Stopped { reason } => return Err(reason),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Offers a second room through the QR flow (`webchat_qr_login`): prints the pairing link,
/// polls `auth.status` (refreshing an expired link), and once a browser confirmed it answers
/// that room too. Then offers the next one.
async fn offer_pairing(plane: DataPlane, state_dir: PathBuf) {
    loop {
        match pair_once(&plane, &state_dir).await {
            Ok(()) => {}
            Err(error) => {
                eprintln!("pairing offer failed: {error}");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

/// Reopens the channels of rooms paired in earlier runs; forgets those the Connector no
/// longer has signed in.
async fn reopen_paired(plane: &DataPlane, state_dir: &Path) {
    let path = state_dir.join(PAIRED_FILE);
    let known = std::fs::read_to_string(&path).unwrap_or_default();
    let mut kept = Vec::new();
    for id in known.lines().map(str::trim).filter(|id| !id.is_empty()) {
        let id = ConnectorChannelId::new(id);
        match plane.open_channel(Some(&id)).await {
            Ok(ack)
                if ack.connector_channel_id == id
                    && ack.connection_descriptor.connection.status
                        == ConnectionStatus::Connected =>
            {
                plane.remember_channel(id.clone()).await;
                kept.push(id.as_str().to_owned());
            }
            _ => {}
        }
    }
    let _ = std::fs::write(&path, kept.join("\n"));
}

async fn pair_once(plane: &DataPlane, state_dir: &Path) -> Result<(), String> {
    let ack = plane.open_channel(None).await.map_err(|e| e.to_string())?;
    let channel = ack.connector_channel_id;
    let started =
        plane.request(Some(&channel), AuthStart::new(QR_FLOW)).await.map_err(|e| e.to_string())?.0;
    let mut session = started.auth_session_id.ok_or("auth.start.ack without a session")?;
    let mut link = started.qr_code_text.unwrap_or_default();
    println!("  Or pair a new room with the agent: {link}");
    let mut refresh = false;
    loop {
        tokio::time::sleep(Duration::from_millis(
            started.poll_interval_millis.unwrap_or(1_000).clamp(200, 5_000),
        ))
        .await;
        let mut poll = AuthStatusRequest::new(session.clone()).with_flow_id(QR_FLOW);
        if refresh {
            poll.refresh = Some(true);
            refresh = false;
        }
        let progress = plane.request(Some(&channel), poll).await.map_err(|e| e.to_string())?.0;
        if let Some(next) = progress.auth_session_id.clone() {
            session = next;
        }
        match progress.status {
            AuthStatus::Authenticated => {
                plane.remember_channel(channel.clone()).await;
                let path = state_dir.join(PAIRED_FILE);
                let mut known = std::fs::read_to_string(&path).unwrap_or_default();
                known.push_str(&format!("\n{channel}"));
                let _ = std::fs::write(&path, known.trim());
                println!(
                    "  Paired: the agent now also answers in {}",
                    progress
                        .connection_descriptor
                        .map(|d| d.target.display_name)
                        .unwrap_or_else(|| "the new room".into())
                );
                return Ok(());
            }
            AuthStatus::QrRefreshRequired => refresh = true,
            AuthStatus::Pending | AuthStatus::Scanned => {
                if let Some(text) = progress.qr_code_text.filter(|t| *t != link) {
                    link = text;
                    println!("  Or pair a new room with the agent: {link}");
                }
            }
            other => return Err(format!("the pairing ended with {other}")),
        }
    }
}

/// Answers one visitor message like an agent would: accept it, show activity, stream the
/// reply, then send the final message (with the visitor's file back, if any).
async fn answer(
    plane: DataPlane,
    control: ControlPlane,
    inbound: InboundMessage,
    interval: Duration,
) {
    let channel = inbound.channel.clone();
    let text = inbound.message.text.clone().unwrap_or_default();
    if text.trim_start().starts_with("/reject") {
        inbound.reject(
            ErrorCode::PermissionDenied,
            "the demo agent does not take messages starting with /reject",
            false,
        );
        return;
    }
    let files = inbound.message.files.clone();
    inbound.accept();
    let _ = plane.send_activity(&channel, ChatActivity::thinking()).await;
    tokio::time::sleep(interval * 4).await;
    let mut returned = Vec::new();
    let mut notes = Vec::new();
    for file in &files {
        let _ = plane.send_activity(&channel, ChatActivity::tool("inspect_file")).await;
        let name = file.filename.clone().unwrap_or_else(|| file.file_ref.to_string());
        let Some(url) = file.download_url.as_deref() else { continue };
        match control.download(url).await {
            Ok(download) => {
                let mime = file
                    .mime_type
                    .clone()
                    .or(download.content_type.clone())
                    .unwrap_or_else(|| "application/octet-stream".into());
                let size = download.bytes.len();
                let content =
                    FileContent { filename: name.clone(), mime_type: mime, bytes: download.bytes };
                match plane.upload_message_file(&channel, content).await {
                    Ok(uploaded) => {
                        returned.push(uploaded);
                        notes.push(format!("{name} ({size} bytes)"));
                    }
                    Err(error) => notes.push(format!("{name} (could not send it back: {error})")),
                }
            }
            Err(error) => {
                eprintln!("xagent-connector demo: a visitor's file was not downloaded: {error}");
                notes.push(format!("{name} (could not download it: {})", error.public_message()));
            }
        }
    }
    let reply = compose(&text, &notes);
    let message_id = format!("msg_demo_{}", random_hex(12));
    let words: Vec<&str> = reply.split_inclusive(' ').collect();
    // The runtime numbers the deltas (1, 2, 3, ...); the final message closes the stream.
    let mut stream = plane.stream_message(&channel, message_id.as_str());
    for chunk in words.chunks(3) {
        if stream.delta(chunk.concat()).await.is_err() {
            break;
        }
        tokio::time::sleep(interval).await;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let final_message = if returned.is_empty() {
        ChatMessage::text(message_id, reply)
    } else {
        ChatMessage::with_files(message_id, Some(reply), returned)
    }
    .created_at(now);
    if let Err(error) = stream.finish(final_message).await {
        eprintln!("the stand-in could not send its reply: {error}");
    }
}

/// The stand-in's reply text.
fn compose(text: &str, files: &[String]) -> String {
    let mut reply = String::new();
    if !files.is_empty() {
        reply.push_str(&format!(
            "Thanks, I received {}. I downloaded it from the Connector's Transfer Plane, uploaded it back to this channel and attached it here. ",
            files.join(", ")
        ));
    }
    if !text.trim().is_empty() {
        reply.push_str(&format!(
            "You wrote “{}”. This answer streamed to you as chat.message.delta packets over the Connector's WebSocket; the final chat.message has now replaced the draft. ",
            text.trim()
        ));
    }
    reply.push_str("Send a picture to see files travel both ways, or a message starting with /reject to see a rejection.");
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_mentions_the_text_and_the_files() {
        let reply = compose("hello", &["cat.png (3 bytes)".into()]);
        assert!(reply.contains("“hello”"));
        assert!(reply.contains("cat.png (3 bytes)"));
    }

    #[test]
    fn persisted_values_survive_a_second_read() {
        let dir = std::env::temp_dir().join(format!("xagent-demo-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = persisted(&dir, "value", || "abc".into()).unwrap();
        let second = persisted(&dir, "value", || "other".into()).unwrap();
        assert_eq!(first, second);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
