//! A QR login polled through `auth.status`: pending -> (expired code) qr_refresh_required ->
//! `refresh: true` issues a new code -> scanned -> authenticated, driven by a test
//! FlowHandler on the injected ManualClock (no sleeping). Also `auth.cancel` of a pending
//! session and the lease expiry cancelling open auth sessions.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use xagent_protocol_types::{
    AuthCancel, AuthFlow, AuthStart, AuthStatusRequest, Clock, ConnectorChannelId,
    DescriptorTarget, ErrorCode, PROFILE_IM_V2, Packet, TargetDeclaration, TargetType,
};
use xagent_server_runtime::{
    AuthContext, AuthError, AuthPrompt, AuthStep, AuthValues, Binding, Connector, FlowHandler,
    RuntimeConfig,
};
use xagent_testkit::{ECHO_CARD_ID, WsClient, has_error, payload_json};

const QR_FLOW: &str = "qr_scan";
const CODE_TTL: u64 = 60_000;
const CONFIRM_AFTER: u64 = 5_000;

#[derive(Clone, Debug)]
struct QrSession {
    code: u32,
    expires_at: u64,
    scanned_at: Option<u64>,
}

/// The simulated target system: a QR code per session that expires after a minute; the test
/// plays the phone (`scan`), confirmation follows five simulated seconds after the scan.
#[derive(Clone, Default)]
struct Phone {
    sessions: Arc<Mutex<HashMap<String, QrSession>>>,
    canceled: Arc<Mutex<Vec<String>>>,
}

impl Phone {
    fn scan(&self, session: &str, now: u64) {
        if let Some(s) = self.sessions.lock().unwrap().get_mut(session) {
            s.scanned_at = Some(now);
        }
    }

    fn prompt(session: &str, s: &QrSession) -> AuthPrompt {
        AuthPrompt {
            qr_code_text: Some(format!("qrlogin://{session}/{}", s.code)),
            expires_at: Some(s.expires_at),
            poll_interval_millis: Some(2000),
            message: Some("scan the code with the phone app".into()),
            ..AuthPrompt::default()
        }
    }
}

impl FlowHandler for Phone {
    async fn start(&self, ctx: AuthContext, _input: AuthValues) -> Result<AuthStep, AuthError> {
        let now = ctx.handle.now_millis();
        let session = QrSession { code: 1, expires_at: now + CODE_TTL, scanned_at: None };
        let prompt = Self::prompt(ctx.auth_session_id.as_str(), &session);
        self.sessions.lock().unwrap().insert(ctx.auth_session_id.as_str().to_owned(), session);
        Ok(AuthStep::Pending(prompt))
    }

    async fn status(&self, ctx: AuthContext, refresh: bool) -> Result<AuthStep, AuthError> {
        let now = ctx.handle.now_millis();
        let id = ctx.auth_session_id.as_str();
        let mut sessions = self.sessions.lock().unwrap();
        let Some(session) = sessions.get_mut(id) else {
            return Err(AuthError::new(ErrorCode::AuthSessionNotFound, "unknown QR session"));
        };
        if refresh {
            session.code += 1;
            session.expires_at = now + CODE_TTL;
            session.scanned_at = None;
            return Ok(AuthStep::Pending(Self::prompt(id, session)));
        }
        match session.scanned_at {
            Some(at) if now >= at + CONFIRM_AFTER => {
                let binding =
                    Binding::new(DescriptorTarget::new("qrchat", "QR account").with_label("QR"));
                Ok(AuthStep::Authenticated(binding))
            }
            Some(_) => Ok(AuthStep::Scanned(Self::prompt(id, session))),
            None if now >= session.expires_at => {
                Ok(AuthStep::QrRefreshRequired(Self::prompt(id, session)))
            }
            None => Ok(AuthStep::Pending(Self::prompt(id, session))),
        }
    }

    async fn cancel(&self, ctx: AuthContext) {
        self.canceled.lock().unwrap().push(ctx.auth_session_id.as_str().to_owned());
    }
}

fn qr_connector(phone: &Phone) -> Connector {
    Connector::builder(ECHO_CARD_ID, "QR", "1.0.0")
        .target(TargetDeclaration::new(TargetType::Im, "qrchat", "QR chat"))
        .profile(PROFILE_IM_V2)
        .im_target(support::AcceptAll)
        .auth_flow_with(
            AuthFlow::qr_login(QR_FLOW, TargetType::Im, "Scan to sign in"),
            phone.clone(),
        )
        .build()
        .unwrap()
}

async fn poll(
    c: &mut WsClient,
    channel: &ConnectorChannelId,
    session: &str,
    refresh: bool,
) -> Packet {
    let mut request = AuthStatusRequest::new(session);
    if refresh {
        request.refresh = Some(true);
    }
    let packet = c.request(request, Some(channel));
    let ack = c.call(packet).await;
    assert_eq!(ack.type_str(), "auth.status.ack");
    ack
}

#[tokio::test]
async fn rule_qr_login_polls_pending_scanned_authenticated_and_refresh_issues_a_new_code() {
    let phone = Phone::default();
    let h = support::serve_custom(qr_connector(&phone), RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;

    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let started = payload_json(&c.call(start).await);
    assert_eq!(started["status"], "pending");
    let session = started["auth_session_id"].as_str().unwrap().to_owned();
    let first_code = started["qr_code_text"].as_str().unwrap().to_owned();
    assert_eq!(started["expires_at"], support::START + CODE_TTL);
    assert_eq!(started["poll_interval_millis"], 2000);
    assert_eq!(started["flow_id"], QR_FLOW);
    assert_eq!(started["connector_channel_id"], channel.as_str());
    assert_eq!(status_of(&h, &channel), "authenticating");

    // Polling while nobody scanned: still pending, same code.
    h.clock.advance(2000);
    let polled = payload_json(&poll(&mut c, &channel, &session, false).await);
    assert_eq!(polled["status"], "pending");
    assert_eq!(polled["qr_code_text"], first_code.as_str());

    // The code expires unscanned: qr_refresh_required; refresh issues a new code.
    h.clock.advance(CODE_TTL);
    let stale = payload_json(&poll(&mut c, &channel, &session, false).await);
    assert_eq!(stale["status"], "qr_refresh_required");
    let refreshed = payload_json(&poll(&mut c, &channel, &session, true).await);
    assert_eq!(refreshed["status"], "pending");
    assert_eq!(refreshed["auth_session_id"], session.as_str(), "refresh keeps the session");
    let second_code = refreshed["qr_code_text"].as_str().unwrap();
    assert_ne!(second_code, first_code, "refresh: true must issue a new QR code");
    assert_eq!(refreshed["expires_at"], h.clock.now_millis() + CODE_TTL);

    // The phone scans; confirmation follows later.
    phone.scan(&session, h.clock.now_millis());
    let scanned = payload_json(&poll(&mut c, &channel, &session, false).await);
    assert_eq!(scanned["status"], "scanned");
    assert!(scanned.get("connection_descriptor").is_none());
    h.clock.advance(CONFIRM_AFTER);
    let done = payload_json(&poll(&mut c, &channel, &session, false).await);
    assert_eq!(done["status"], "authenticated");
    assert_eq!(done["connection_descriptor"]["connection"]["status"], "connected");
    assert_eq!(done["connection_descriptor"]["target"]["provider"], "qrchat");

    // A final session answers from its state without asking the provider again.
    let again = payload_json(&poll(&mut c, &channel, &session, false).await);
    assert_eq!(again["status"], "authenticated");
    assert!(h.server.handle().binding(&channel).is_some());
    h.stop().await;
}

#[tokio::test]
async fn rule_auth_cancel_ends_a_pending_qr_session_and_the_channel_returns_to_created() {
    let phone = Phone::default();
    let h = support::serve_custom(qr_connector(&phone), RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let session =
        payload_json(&c.call(start).await)["auth_session_id"].as_str().unwrap().to_owned();

    let cancel = c.request(AuthCancel::new(session.as_str()), Some(&channel));
    let canceled = payload_json(&c.call(cancel).await);
    assert_eq!(canceled["status"], "canceled");
    assert_eq!(canceled["auth_status"], "unauthenticated");
    assert_eq!(*phone.canceled.lock().unwrap(), vec![session.clone()]);
    assert_eq!(status_of(&h, &channel), "created");
    // The session is gone.
    let after = poll_raw(&mut c, &channel, &session).await;
    assert!(has_error(&after, &ErrorCode::AuthSessionNotFound));
    h.stop().await;
}

/// Section 8.11: `auth.cancel` ends only a sign-in attempt. One that already completed is
/// `ignored`, answered with the current Descriptor; a new attempt on the signed-in channel is
/// `canceled` and the channel keeps its sign-in.
#[tokio::test]
async fn rule_auth_cancel_after_completion_is_ignored_and_never_signs_a_channel_out() {
    let phone = Phone::default();
    let h = support::serve_custom(qr_connector(&phone), RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let first = payload_json(&c.call(start).await)["auth_session_id"].as_str().unwrap().to_owned();
    phone.scan(&first, h.clock.now_millis());
    h.clock.advance(CONFIRM_AFTER);
    let done = payload_json(&poll(&mut c, &channel, &first, false).await);
    assert_eq!(done["status"], "authenticated");

    // Completed: ignored, with the current Descriptor; the provider is not asked to cancel.
    let cancel = c.request(AuthCancel::new(first.as_str()), Some(&channel));
    let ignored = payload_json(&c.call(cancel).await);
    assert_eq!(ignored["status"], "ignored", "{ignored}");
    assert_eq!(ignored["auth_status"], "authenticated", "{ignored}");
    assert_eq!(ignored["connection_descriptor"]["connection"]["status"], "connected");
    assert!(phone.canceled.lock().unwrap().is_empty(), "nothing was left to cancel");

    // A second attempt on the signed-in channel, canceled: the sign-in stays.
    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let second = payload_json(&c.call(start).await)["auth_session_id"].as_str().unwrap().to_owned();
    let cancel = c.request(AuthCancel::new(second.as_str()), Some(&channel));
    let canceled = payload_json(&c.call(cancel).await);
    assert_eq!(canceled["status"], "canceled", "{canceled}");
    assert_eq!(canceled["auth_status"], "authenticated", "{canceled}");
    assert_eq!(*phone.canceled.lock().unwrap(), vec![second]);
    assert!(h.server.handle().binding(&channel).is_some(), "the binding is kept");
    assert_eq!(status_of(&h, &channel), "connected");
    h.stop().await;
}

fn status_of(h: &support::Custom, channel: &ConnectorChannelId) -> String {
    let descriptor = h.server.handle().descriptor(channel).unwrap();
    let value = serde_json::to_value(&descriptor).unwrap();
    value["connection"]["status"].as_str().unwrap().to_owned()
}

async fn poll_raw(c: &mut WsClient, channel: &ConnectorChannelId, session: &str) -> Packet {
    let packet = c.request(AuthStatusRequest::new(session), Some(channel));
    c.call(packet).await
}

#[tokio::test]
async fn rule_lease_expiry_cancels_open_auth_sessions() {
    let phone = Phone::default();
    let config = RuntimeConfig::default().with_lease(Duration::from_secs(600));
    let h = support::serve_custom(qr_connector(&phone), config, None).await;
    let handle = h.server.handle();
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let session =
        payload_json(&c.call(start).await)["auth_session_id"].as_str().unwrap().to_owned();
    c.close().await;
    for _ in 0..500 {
        if !handle.is_online() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!handle.is_online());
    // The lease (10 min here) ends before the auth session's own time-to-live (30 min), so
    // the cancel below comes from the lease cascade.
    h.clock.advance(10 * 60_000);
    h.server.tick().await;
    assert!(handle.channels().is_empty());
    assert_eq!(*phone.canceled.lock().unwrap(), vec![session]);
    h.stop().await;
}

#[tokio::test]
async fn rule_auth_logout_cancels_a_pending_sign_in_attempt() {
    let phone = Phone::default();
    let h = support::serve_custom(qr_connector(&phone), RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let session =
        payload_json(&c.call(start).await)["auth_session_id"].as_str().unwrap().to_owned();
    let logout = c.request(xagent_protocol_types::AuthLogout::default(), Some(&channel));
    let out = payload_json(&c.call(logout).await);
    assert_eq!(out["status"], "ok");
    assert_eq!(*phone.canceled.lock().unwrap(), vec![session.clone()], "the provider cancels it");
    assert_eq!(status_of(&h, &channel), "created");
    let after = poll_raw(&mut c, &channel, &session).await;
    assert!(has_error(&after, &ErrorCode::AuthSessionNotFound));
    h.stop().await;
}

#[tokio::test]
async fn rule_an_auth_session_past_its_ttl_is_canceled_and_the_channel_is_created_again() {
    let phone = Phone::default();
    let h = support::serve_custom(qr_connector(&phone), RuntimeConfig::default(), None).await;
    let mut c = h.client().await;
    c.hello(None).await;
    let (channel, _) = c.open_channel(None).await;
    let start = c.request(AuthStart::new(QR_FLOW), Some(&channel));
    let session =
        payload_json(&c.call(start).await)["auth_session_id"].as_str().unwrap().to_owned();
    assert_eq!(status_of(&h, &channel), "authenticating");
    // Default auth session TTL: 30 minutes.
    h.clock.advance(30 * 60_000 - 1);
    h.server.tick().await;
    assert!(phone.canceled.lock().unwrap().is_empty());
    h.clock.advance(1);
    h.server.tick().await;
    assert_eq!(*phone.canceled.lock().unwrap(), vec![session.clone()]);
    assert_eq!(status_of(&h, &channel), "created", "no sign-in is pending any more");
    let after = poll_raw(&mut c, &channel, &session).await;
    assert!(has_error(&after, &ErrorCode::AuthSessionNotFound));
    h.stop().await;
}
