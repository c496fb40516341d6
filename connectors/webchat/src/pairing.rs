//! The QR pairing flow (`webchat_qr_login`) as a sans-I/O state machine: `auth.start` mints
//! a one-time link, opening it moves the session to `scanned`, confirming on the page
//! completes it, and the link expires. Time comes in as Unix ms so tests drive it directly.

use std::collections::HashMap;

use xagent_protocol_types::{AuthSessionId, ConnectorChannelId};

use crate::store::random_hex;

/// How long a pairing link can be opened and confirmed (5 minutes).
pub const PAIRING_LINK_TTL_MILLIS: u64 = 5 * 60 * 1000;

/// Where a pairing stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairingState {
    /// Waiting for somebody to open the link.
    Pending,
    /// The link was opened; waiting for confirmation on the page.
    Scanned,
    /// Confirmed on the page: the room was created for the channel.
    Confirmed {
        /// The room.
        room_id: String,
    },
}

/// One pairing session.
#[derive(Clone, Debug)]
pub struct Pairing {
    /// The runtime's auth session.
    pub session: AuthSessionId,
    /// The channel being signed in.
    pub channel: ConnectorChannelId,
    /// The secret part of the link (`/chat/pair/{token}`).
    pub token: String,
    /// When the link stops working (Unix ms).
    pub expires_at: u64,
    /// State.
    pub state: PairingState,
}

/// What `auth.status` should report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PairingStatus {
    /// Still waiting for the link to be opened.
    Pending(PairingPrompt),
    /// Opened, waiting for confirmation.
    Scanned(PairingPrompt),
    /// Done: bind the channel to this room.
    Confirmed(String),
    /// The link expired before confirmation: a refresh issues a new one.
    RefreshRequired,
    /// No such session.
    Unknown,
}

/// The token and expiry to show (the caller turns them into a link and a QR code).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairingPrompt {
    /// The link token.
    pub token: String,
    /// Expiry (Unix ms).
    pub expires_at: u64,
}

/// Why a step on the page failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairingError {
    /// No session has this link (never issued, replaced by a refresh, or already used).
    #[error("this pairing link is not valid; ask for a new QR code")]
    Unknown,
    /// The link expired.
    #[error("this pairing link has expired; ask for a new QR code")]
    Expired,
    /// The link was already confirmed.
    #[error("this pairing link was already used")]
    Used,
}

/// All open pairings of the Connector (in memory: like the runtime's auth sessions, an
/// interrupted pairing is started again).
#[derive(Debug, Default)]
pub struct Pairings {
    sessions: HashMap<AuthSessionId, Pairing>,
}

impl Pairings {
    /// Starts a pairing for an auth session and returns its prompt.
    pub fn start(
        &mut self,
        session: AuthSessionId,
        channel: ConnectorChannelId,
        now: u64,
    ) -> PairingPrompt {
        let pairing = Pairing {
            session: session.clone(),
            channel,
            token: random_hex(16),
            expires_at: now.saturating_add(PAIRING_LINK_TTL_MILLIS),
            state: PairingState::Pending,
        };
        let prompt = PairingPrompt { token: pairing.token.clone(), expires_at: pairing.expires_at };
        self.sessions.insert(session, pairing);
        prompt
    }

    fn by_token(&mut self, token: &str) -> Option<&mut Pairing> {
        self.sessions.values_mut().find(|p| p.token == token)
    }

    /// The link was opened: `pending` -> `scanned`. Opening it again is harmless.
    pub fn scan(&mut self, token: &str, now: u64) -> Result<Pairing, PairingError> {
        let pairing = self.by_token(token).ok_or(PairingError::Unknown)?;
        if matches!(pairing.state, PairingState::Confirmed { .. }) {
            return Err(PairingError::Used);
        }
        if now >= pairing.expires_at {
            return Err(PairingError::Expired);
        }
        pairing.state = PairingState::Scanned;
        Ok(pairing.clone())
    }

    /// Confirmation on the page. Returns the pairing so the caller can create the room; call
    /// [`Pairings::complete`] once it exists.
    pub fn confirmable(&mut self, token: &str, now: u64) -> Result<Pairing, PairingError> {
        let pairing = self.by_token(token).ok_or(PairingError::Unknown)?;
        match pairing.state {
            PairingState::Confirmed { .. } => Err(PairingError::Used),
            _ if now >= pairing.expires_at => Err(PairingError::Expired),
            _ => Ok(pairing.clone()),
        }
    }

    /// Marks the pairing confirmed for `room_id`.
    pub fn complete(&mut self, session: &AuthSessionId, room_id: String) {
        if let Some(pairing) = self.sessions.get_mut(session) {
            pairing.state = PairingState::Confirmed { room_id };
        }
    }

    /// `auth.status`: reports the state, or with `refresh` issues a new link (a confirmed
    /// session is reported as confirmed even with `refresh`).
    pub fn status(&mut self, session: &AuthSessionId, refresh: bool, now: u64) -> PairingStatus {
        let Some(pairing) = self.sessions.get_mut(session) else { return PairingStatus::Unknown };
        if let PairingState::Confirmed { room_id } = &pairing.state {
            let room_id = room_id.clone();
            self.sessions.remove(session);
            return PairingStatus::Confirmed(room_id);
        }
        if refresh {
            pairing.token = random_hex(16);
            pairing.expires_at = now.saturating_add(PAIRING_LINK_TTL_MILLIS);
            pairing.state = PairingState::Pending;
        } else if now >= pairing.expires_at {
            return PairingStatus::RefreshRequired;
        }
        let prompt = PairingPrompt { token: pairing.token.clone(), expires_at: pairing.expires_at };
        match pairing.state {
            PairingState::Scanned => PairingStatus::Scanned(prompt),
            _ => PairingStatus::Pending(prompt),
        }
    }

    /// Drops a session (cancel, or the runtime forgot it).
    pub fn cancel(&mut self, session: &AuthSessionId) {
        self.sessions.remove(session);
    }

    /// Drops sessions whose link expired more than a TTL ago (nobody refreshed them).
    pub fn prune(&mut self, now: u64) {
        self.sessions.retain(|_, p| {
            matches!(p.state, PairingState::Confirmed { .. })
                || now < p.expires_at.saturating_add(PAIRING_LINK_TTL_MILLIS)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(pairings: &mut Pairings, now: u64) -> (AuthSessionId, PairingPrompt) {
        let session = AuthSessionId::new("auth_1");
        let prompt = pairings.start(session.clone(), ConnectorChannelId::new("cch_1"), now);
        (session, prompt)
    }

    #[test]
    fn opening_the_link_moves_the_session_to_scanned_then_confirmed() {
        let mut pairings = Pairings::default();
        let (session, prompt) = start(&mut pairings, 1_000);
        assert!(matches!(pairings.status(&session, false, 1_001), PairingStatus::Pending(_)));
        pairings.scan(&prompt.token, 1_002).unwrap();
        assert!(matches!(pairings.status(&session, false, 1_003), PairingStatus::Scanned(_)));
        let pairing = pairings.confirmable(&prompt.token, 1_004).unwrap();
        pairings.complete(&pairing.session, "room-1".into());
        assert_eq!(
            pairings.status(&session, false, 1_005),
            PairingStatus::Confirmed("room-1".into())
        );
        // Reported once; the session is then gone.
        assert_eq!(pairings.status(&session, false, 1_006), PairingStatus::Unknown);
    }

    #[test]
    fn an_expired_link_cannot_be_opened_or_confirmed_and_status_asks_for_refresh() {
        let mut pairings = Pairings::default();
        let (session, prompt) = start(&mut pairings, 0);
        let late = PAIRING_LINK_TTL_MILLIS;
        assert_eq!(pairings.scan(&prompt.token, late).unwrap_err(), PairingError::Expired);
        assert_eq!(pairings.confirmable(&prompt.token, late).unwrap_err(), PairingError::Expired);
        assert_eq!(pairings.status(&session, false, late), PairingStatus::RefreshRequired);
    }

    #[test]
    fn refresh_issues_a_new_link_and_retires_the_old_one() {
        let mut pairings = Pairings::default();
        let (session, old) = start(&mut pairings, 0);
        let now = PAIRING_LINK_TTL_MILLIS + 10;
        let PairingStatus::Pending(new) = pairings.status(&session, true, now) else {
            panic!("refresh must give a pending prompt");
        };
        assert_ne!(new.token, old.token);
        assert_eq!(new.expires_at, now + PAIRING_LINK_TTL_MILLIS);
        assert_eq!(pairings.scan(&old.token, now).unwrap_err(), PairingError::Unknown);
        assert!(pairings.scan(&new.token, now).is_ok());
    }

    #[test]
    fn a_pairing_link_is_one_time() {
        let mut pairings = Pairings::default();
        let (_, prompt) = start(&mut pairings, 0);
        let pairing = pairings.confirmable(&prompt.token, 1).unwrap();
        pairings.complete(&pairing.session, "room".into());
        assert_eq!(pairings.scan(&prompt.token, 2).unwrap_err(), PairingError::Used);
        assert_eq!(pairings.confirmable(&prompt.token, 2).unwrap_err(), PairingError::Used);
    }

    #[test]
    fn unknown_links_and_cancelled_sessions_are_refused() {
        let mut pairings = Pairings::default();
        assert_eq!(pairings.scan("nope", 0).unwrap_err(), PairingError::Unknown);
        let (session, prompt) = start(&mut pairings, 0);
        pairings.cancel(&session);
        assert_eq!(pairings.scan(&prompt.token, 1).unwrap_err(), PairingError::Unknown);
        assert_eq!(pairings.status(&session, false, 1), PairingStatus::Unknown);
    }

    #[test]
    fn prune_drops_long_expired_sessions() {
        let mut pairings = Pairings::default();
        let (session, _) = start(&mut pairings, 0);
        pairings.prune(PAIRING_LINK_TTL_MILLIS * 2);
        assert_eq!(pairings.status(&session, false, 0), PairingStatus::Unknown);
    }
}
