//! Signing a channel in, start to end: `auth.start` with the flow's form values, then, while
//! the Connector reports the flow not finished (a QR code waiting to be scanned), `auth.status`
//! at the pace the Connector asks for (`poll_interval_millis`, within
//! [`MIN_POLL_MILLIS`]..=[`MAX_POLL_MILLIS`]), with `refresh` after `qr_refresh_required`,
//! until the status is final. A channel that reaches `authenticated` is remembered
//! ([`DataPlane::remember_channel`]): xAgent persists a channel only once it is signed in.
//!
//! The waits run on tokio's clock (paused in tests), like every other timer of the data plane.
//! Every step is published on a watch channel, so an application can show a QR link the
//! moment it arrives and hear when the flow ends.

use std::time::Duration;

use tokio::sync::watch;
use xagent_protocol_types::{
    AuthInput, AuthProgress, AuthSessionId, AuthStart, AuthStartAck, AuthStatus, AuthStatusAck,
    AuthStatusRequest, ConnectorChannelId, ErrorCode, WireError,
};

use crate::{ClientError, DataPlane};

/// The poll interval used when the Connector suggests none.
pub const DEFAULT_POLL_MILLIS: u64 = 2_000;
/// The shortest poll interval honoured (a Connector asking for less is polled this often).
pub const MIN_POLL_MILLIS: u64 = 500;
/// The longest poll interval honoured.
pub const MAX_POLL_MILLIS: u64 = 10_000;
/// Failed `auth.status` polls in a row (no answer, not connected) after which the driver
/// gives up; an error the Connector answers with ends the flow at once.
pub const MAX_POLL_FAILURES: u32 = 30;

/// How long to wait before the next `auth.status` after `progress`.
pub fn poll_interval(progress: &AuthProgress) -> Duration {
    let millis = progress
        .poll_interval_millis
        .unwrap_or(DEFAULT_POLL_MILLIS)
        .clamp(MIN_POLL_MILLIS, MAX_POLL_MILLIS);
    Duration::from_millis(millis)
}

/// A sign-in running on one channel. Dropping it stops the polling (the Connector's session
/// stays until it expires); [`SignIn::finished`] waits for the end.
#[derive(Debug)]
pub struct SignIn {
    channel: ConnectorChannelId,
    flow_id: String,
    progress: watch::Receiver<AuthProgress>,
    task: Option<tokio::task::JoinHandle<Result<AuthProgress, ClientError>>>,
}

impl SignIn {
    /// The channel being signed in.
    pub fn channel(&self) -> &ConnectorChannelId {
        &self.channel
    }

    /// The flow.
    pub fn flow_id(&self) -> &str {
        &self.flow_id
    }

    /// The latest progress the Connector reported.
    pub fn progress(&self) -> AuthProgress {
        self.progress.borrow().clone()
    }

    /// A receiver that sees each change of the progress (status, QR code, message).
    pub fn watch(&self) -> watch::Receiver<AuthProgress> {
        self.progress.clone()
    }

    /// True while the driver follows the flow in the background (it was not final after
    /// `auth.start` and came with an `auth_session_id` to poll).
    pub fn is_following(&self) -> bool {
        self.task.as_ref().is_some_and(|task| !task.is_finished())
    }

    /// True when the flow needs nothing more from this side (its status is final).
    pub fn is_final(&self) -> bool {
        self.progress.borrow().status.is_final()
    }

    /// Waits until the flow ends and returns its last progress (`authenticated`, `expired`,
    /// `failed`, ...). A progress without an `auth_session_id` cannot be followed: it is
    /// returned as it is. Fails when the Connector answered a poll with an error, when the
    /// data plane closed, or after [`MAX_POLL_FAILURES`] unanswered polls in a row.
    pub async fn finished(mut self) -> Result<AuthProgress, ClientError> {
        match self.task.take() {
            None => Ok(self.progress()),
            Some(task) => task.await.map_err(|e| {
                ClientError::Internal(format!("the sign-in driver stopped unexpectedly: {e}"))
            })?,
        }
    }
}

impl Drop for SignIn {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn changed(before: &AuthProgress, after: &AuthProgress) -> bool {
    before.status != after.status
        || before.qr_code_text != after.qr_code_text
        || before.qr_code_image != after.qr_code_image
        || before.message != after.message
        || before.auth_session_id != after.auth_session_id
}

/// Whether a failed poll is worth repeating: nothing was answered (no connection, timeout,
/// withheld before hello). An answer from the Connector, a refusal of this side or a closed
/// client ends the flow.
fn transient(error: &ClientError) -> bool {
    matches!(
        error,
        ClientError::NotConnected
            | ClientError::Timeout { .. }
            | ClientError::Withheld(_)
            | ClientError::Transport { .. }
    )
}

impl DataPlane {
    /// Starts signing `channel` in with `flow_id` (and its form values, which may hold secrets
    /// and are never logged). The Card must declare the flow (`invalid_arguments`, naming the
    /// flows it does declare). Returns once `auth.start` is acked; a flow that is not finished
    /// then (a QR code to scan) is followed in the background, see [`SignIn`].
    pub async fn sign_in(
        &self,
        channel: &ConnectorChannelId,
        flow_id: &str,
        input: AuthInput,
    ) -> Result<SignIn, ClientError> {
        if let Some(card) = self.directory().card()
            && card.auth_flow(flow_id).is_none()
        {
            let known: Vec<&str> = card.auth_flows.iter().map(|f| f.id.as_str()).collect();
            return Err(ClientError::Refused(WireError::new(
                ErrorCode::InvalidArguments,
                format!("the Card has no auth flow {flow_id:?}; it declares {known:?}"),
            )));
        }
        let mut start = AuthStart::new(flow_id);
        if !input.0.is_empty() {
            start = start.with_input(input);
        }
        let AuthStartAck(progress) = self.request(Some(channel), start).await?;
        if progress.status == AuthStatus::Authenticated {
            self.remember_channel(channel.clone()).await;
        }
        let follow = !progress.status.is_final() && progress.auth_session_id.is_some();
        let (sender, receiver) = watch::channel(progress);
        let task = follow.then(|| {
            tokio::spawn(self.clone().follow_sign_in(channel.clone(), flow_id.to_owned(), sender))
        });
        Ok(SignIn {
            channel: channel.clone(),
            flow_id: flow_id.to_owned(),
            progress: receiver,
            task,
        })
    }

    async fn follow_sign_in(
        self,
        channel: ConnectorChannelId,
        flow_id: String,
        progress: watch::Sender<AuthProgress>,
    ) -> Result<AuthProgress, ClientError> {
        let mut failures = 0u32;
        loop {
            let current = progress.borrow().clone();
            let Some(session) = current.auth_session_id.clone() else {
                return Ok(current);
            };
            tokio::time::sleep(poll_interval(&current)).await;
            let request = self.status_request(&current, session, &flow_id);
            match self.request(Some(&channel), request).await {
                Ok(AuthStatusAck(mut next)) => {
                    failures = 0;
                    // A Connector that leaves the session id out of a poll answer keeps it.
                    if next.auth_session_id.is_none() {
                        next.auth_session_id = current.auth_session_id.clone();
                    }
                    if changed(&current, &next) {
                        tracing::info!(%channel, status = %next.status, "sign-in progressed");
                    }
                    if next.status == AuthStatus::Authenticated {
                        self.remember_channel(channel.clone()).await;
                    }
                    let done = next.status.is_final();
                    progress.send_if_modified(|kept| {
                        let modified = changed(kept, &next);
                        *kept = next.clone();
                        modified
                    });
                    if done {
                        return Ok(next);
                    }
                }
                Err(error) if transient(&error) && failures + 1 < MAX_POLL_FAILURES => {
                    failures += 1;
                    tracing::warn!(%channel, %error, failures, "auth.status failed; polling again");
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn status_request(
        &self,
        current: &AuthProgress,
        session: AuthSessionId,
        flow_id: &str,
    ) -> AuthStatusRequest {
        let request = AuthStatusRequest::new(session).with_flow_id(flow_id);
        if current.status == AuthStatus::QrRefreshRequired { request.refresh() } else { request }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_interval_rule_the_connector_pace_is_kept_within_bounds() {
        let mut progress = AuthProgress::new(AuthStatus::Pending);
        assert_eq!(poll_interval(&progress), Duration::from_millis(DEFAULT_POLL_MILLIS));
        progress.poll_interval_millis = Some(1);
        assert_eq!(poll_interval(&progress), Duration::from_millis(MIN_POLL_MILLIS));
        progress.poll_interval_millis = Some(3_000);
        assert_eq!(poll_interval(&progress), Duration::from_millis(3_000));
        progress.poll_interval_millis = Some(u64::MAX);
        assert_eq!(poll_interval(&progress), Duration::from_millis(MAX_POLL_MILLIS));
    }

    #[test]
    fn only_unanswered_polls_are_repeated() {
        assert!(transient(&ClientError::NotConnected));
        assert!(transient(&ClientError::Timeout { expected: "auth.status.ack", millis: 10 }));
        assert!(!transient(&ClientError::Closed));
        assert!(!transient(&ClientError::Remote(WireError::new(
            ErrorCode::AuthSessionNotFound,
            "gone"
        ))));
    }
}
