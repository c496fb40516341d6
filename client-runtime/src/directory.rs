//! Channels as xAgent sees them: who owns each, its Descriptor (auth state, connection status,
//! Tool availability, target permission), kept current from `channel.open.ack` and
//! `connection.descriptor.push` after the Descriptor rules; and the channel resolution of
//! protocol section 10.1 for Card Tool calls.

use std::sync::Arc;

use serde::Serialize;
use xagent_protocol_types::{
    ConnectionDescriptor, ConnectionStatus, ConnectorCard, ConnectorCardId, ConnectorChannelId,
    ErrorCode, UserChannelMode, WireError,
};
use xagent_protocol_validate::{CardFacts, DescriptorContext};

use crate::error::UserChannelLimit;

/// A dedicated xAgent session's fixed binding to one channel of one Card (step 1 of 10.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionBinding {
    /// The Card the session is bound to.
    pub connector_card_id: ConnectorCardId,
    /// The channel the session is bound to.
    pub connector_channel_id: ConnectorChannelId,
}

impl SessionBinding {
    /// A binding to a channel of a Card.
    pub fn new(card: impl Into<ConnectorCardId>, channel: impl Into<ConnectorChannelId>) -> Self {
        Self { connector_card_id: card.into(), connector_channel_id: channel.into() }
    }
}

/// One channel in the directory.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChannelEntry {
    /// The channel id.
    pub connector_channel_id: ConnectorChannelId,
    /// The xAgent user who owns it (`None`: opened without an owner).
    pub owner: Option<String>,
    /// Its latest Descriptor that passed the rules.
    pub descriptor: Option<ConnectionDescriptor>,
}

impl ChannelEntry {
    /// The Descriptor's `connection.status`, if a Descriptor is known.
    pub fn status(&self) -> Option<&ConnectionStatus> {
        self.descriptor.as_ref().map(|d| &d.connection.status)
    }

    /// Signed in: `offline` and `error` still count as authenticated but inactive (protocol
    /// 9); `created`, `authenticating`, `expired` and `revoked` do not.
    pub fn is_authenticated(&self) -> bool {
        matches!(
            self.status(),
            Some(
                ConnectionStatus::Connected
                    | ConnectionStatus::Degraded
                    | ConnectionStatus::Offline
                    | ConnectionStatus::Error
            )
        )
    }

    /// Whether a Card Tool can run here now: the Descriptor's availability rule
    /// ([`ConnectionDescriptor::is_tool_available`]), the same one the Tool projection asks.
    pub fn tool_available(&self, tool_id: &str) -> bool {
        self.descriptor.as_ref().is_some_and(|descriptor| descriptor.is_tool_available(tool_id))
    }
}

/// Why a Descriptor was refused: the validator's rule ids and messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Descriptor breaks the rules: {0}")]
pub struct DescriptorRefused(pub String);

/// Every channel this xAgent knows on one Connector, in the order they were opened.
#[derive(Debug, Clone, Default)]
pub struct ChannelDirectory {
    card: Option<ConnectorCard>,
    /// What the rules know of `card`: one copy, shared with the packet rules of the data
    /// plane through [`ChannelDirectory::card_facts`].
    facts: Option<Arc<CardFacts>>,
    entries: Vec<ChannelEntry>,
    /// Users with a first `channel.open` in flight under `user_channel_mode: single`
    /// (held by `crate::channel_mode`).
    pub(crate) opening: Vec<String>,
}

impl ChannelDirectory {
    /// An empty directory checked against `card` (unchecked without one).
    pub fn new(card: Option<ConnectorCard>) -> Self {
        let facts = card.as_ref().map(|card| Arc::new(CardFacts::from_card(card)));
        Self { card, facts, entries: Vec::new(), opening: Vec::new() }
    }

    /// The admitted Card.
    pub fn card(&self) -> Option<&ConnectorCard> {
        self.card.as_ref()
    }

    /// What the validator knows of the admitted Card (shared, not copied).
    pub fn card_facts(&self) -> Option<Arc<CardFacts>> {
        self.facts.clone()
    }

    /// Replaces the Card (after a refetch re-admitted the Connector).
    pub fn set_card(&mut self, card: ConnectorCard) {
        self.facts = Some(Arc::new(CardFacts::from_card(&card)));
        self.card = Some(card);
    }

    /// Replaces the Card with the facts the data plane's admission already derived from it
    /// (one copy shared by the packet rules and the Descriptor rules).
    pub(crate) fn set_admitted(&mut self, card: ConnectorCard, facts: Arc<CardFacts>) {
        self.facts = Some(facts);
        self.card = Some(card);
    }

    fn entry_mut(&mut self, channel: &ConnectorChannelId) -> &mut ChannelEntry {
        let index = match self.entries.iter().position(|e| &e.connector_channel_id == channel) {
            Some(index) => index,
            None => {
                self.entries.push(ChannelEntry {
                    connector_channel_id: channel.clone(),
                    owner: None,
                    descriptor: None,
                });
                self.entries.len() - 1
            }
        };
        &mut self.entries[index]
    }

    /// Adds a channel remembered from the store.
    pub fn remember(&mut self, channel: ConnectorChannelId, owner: Option<String>) {
        let entry = self.entry_mut(&channel);
        if owner.is_some() {
            entry.owner = owner;
        }
    }

    /// Sets who owns a channel.
    pub fn set_owner(&mut self, channel: &ConnectorChannelId, owner: &str) {
        self.entry_mut(channel).owner = Some(owner.to_owned());
    }

    /// Who owns a channel.
    pub fn owner(&self, channel: &ConnectorChannelId) -> Option<String> {
        self.get(channel).and_then(|e| e.owner.clone())
    }

    /// A channel's entry.
    pub fn get(&self, channel: &ConnectorChannelId) -> Option<&ChannelEntry> {
        self.entries.iter().find(|e| &e.connector_channel_id == channel)
    }

    /// Every channel, in the order they were first seen.
    pub fn entries(&self) -> &[ChannelEntry] {
        &self.entries
    }

    /// The channels of one user (step 2 of 10.1 queries these).
    pub fn owned_by<'a>(&'a self, owner: &'a str) -> impl Iterator<Item = &'a ChannelEntry> {
        self.entries.iter().filter(move |e| e.owner.as_deref() == Some(owner))
    }

    /// Drops every Descriptor (owners stay): they described a Connector runtime instance that
    /// is gone, and no Tool may resolve to a channel until the new one described it.
    pub(crate) fn forget_descriptors(&mut self) {
        for entry in &mut self.entries {
            entry.descriptor = None;
        }
    }

    /// Forgets a channel.
    pub fn forget(&mut self, channel: &ConnectorChannelId) {
        self.entries.retain(|e| &e.connector_channel_id != channel);
    }

    /// A reopened channel came back under a new id. The reopen's ack may already have recorded
    /// its Descriptor under the new id: the two entries become one (that Descriptor, the
    /// earlier owner), never two entries with one id.
    pub fn rename(&mut self, previous: &ConnectorChannelId, current: &ConnectorChannelId) {
        if previous == current {
            return;
        }
        let Some(index) = self.entries.iter().position(|e| &e.connector_channel_id == previous)
        else {
            return;
        };
        let old = self.entries.remove(index);
        let entry = self.entry_mut(current);
        if entry.owner.is_none() {
            entry.owner = old.owner;
        }
    }

    /// `supports.user_channel_mode` (protocol 4.1), asked before `channel.open` for `owner`:
    /// with `multiple`, or without an admitted Card, anything goes. Otherwise (`single`, also
    /// when the Card leaves the mode out) a user who owns a channel may reopen only that one
    /// (`existing`), and a user whose first open is still in flight may not start another.
    /// `Ok(true)`: a new channel, whose place the caller holds until its open completes.
    pub fn check_user_channel_mode(
        &self,
        owner: &str,
        existing: Option<&ConnectorChannelId>,
    ) -> Result<bool, UserChannelLimit> {
        let Some(card) = &self.card else { return Ok(false) };
        if card.supports.effective_user_channel_mode() == UserChannelMode::Multiple {
            return Ok(false);
        }
        if let Some(other) =
            self.owned_by(owner).find(|e| Some(&e.connector_channel_id) != existing)
        {
            return Err(UserChannelLimit {
                owner: owner.to_owned(),
                existing: Some(other.connector_channel_id.clone()),
            });
        }
        if existing.is_some_and(|channel| self.owner(channel).as_deref() == Some(owner)) {
            return Ok(false);
        }
        if self.opening.iter().any(|o| o == owner) {
            return Err(UserChannelLimit { owner: owner.to_owned(), existing: None });
        }
        Ok(true)
    }

    /// Checks a Descriptor for `channel` against the Descriptor rules (identity, Profiles within
    /// the Card, Tools within the Card, `target_type` among the Card's) and records it.
    pub fn apply_descriptor(
        &mut self,
        channel: &ConnectorChannelId,
        descriptor: &ConnectionDescriptor,
    ) -> Result<(), DescriptorRefused> {
        self.check_descriptor(channel, descriptor)?;
        self.entry_mut(channel).descriptor = Some(descriptor.clone());
        Ok(())
    }

    /// The Descriptor rules, without recording.
    pub fn check_descriptor(
        &self,
        channel: &ConnectorChannelId,
        descriptor: &ConnectionDescriptor,
    ) -> Result<(), DescriptorRefused> {
        let value = serde_json::to_value(descriptor)
            .map_err(|e| DescriptorRefused(format!("[descriptor.connection] {e}")))?;
        let context =
            DescriptorContext { card: self.facts.as_deref(), channel: Some(channel.as_str()) };
        let report = xagent_protocol_validate::validate_descriptor(&value, context);
        let mut errors: Vec<String> = report.errors().map(ToString::to_string).collect();
        if let Some(card) = &self.card
            && !card.supports.target_types.contains(&descriptor.connection.target_type)
        {
            errors.push(format!(
                "error [descriptor.target_type] /connection/target_type: {} is not among the Card's supports.target_types",
                descriptor.connection.target_type
            ));
        }
        if errors.is_empty() { Ok(()) } else { Err(DescriptorRefused(errors.join("; "))) }
    }

    /// Section 10.1: the channel a Card Tool call by `owner` runs on.
    ///
    /// 1. With a session binding, its Card must be this Connector's
    ///    (`connector_channel_connector_mismatch`).
    /// 2. The Tool must be in the Card (`tool_not_found`); the user's channels are filtered by
    ///    authentication, connection status, the Descriptor's Tool state and target permission.
    /// 3. With a binding only the bound channel may be chosen (another user's:
    ///    `connector_channel_not_owned`; not available: `connector_channel_unavailable`);
    ///    without one the first available channel is chosen (none signed in:
    ///    `connection_not_found`; signed in but the Tool unavailable everywhere:
    ///    `connector_channel_unavailable`).
    pub fn resolve(
        &self,
        owner: &str,
        binding: Option<&SessionBinding>,
        tool_id: &str,
    ) -> Result<ConnectorChannelId, WireError> {
        let card = self.card.as_ref().ok_or_else(|| {
            WireError::new(
                ErrorCode::ConnectionNotFound,
                "no admitted Card: admit the Connector before invoking its Tools",
            )
        })?;
        if let Some(binding) = binding
            && binding.connector_card_id != card.connector_card_id
        {
            return Err(WireError::new(
                ErrorCode::ConnectorChannelConnectorMismatch,
                format!(
                    "the session is bound to Connector {}, not {}",
                    binding.connector_card_id, card.connector_card_id
                ),
            ));
        }
        if !card.tools.iter().any(|t| t.tool_id.as_str() == tool_id) {
            return Err(WireError::new(
                ErrorCode::ToolNotFound,
                format!("{tool_id} is not a Tool of {}", card.connector_card_id),
            ));
        }
        let mut available = self.owned_by(owner).filter(|e| e.tool_available(tool_id));
        match binding {
            Some(binding) => {
                let bound = &binding.connector_channel_id;
                if available.any(|e| &e.connector_channel_id == bound) {
                    return Ok(bound.clone());
                }
                match self.get(bound) {
                    Some(entry) if entry.owner.as_deref() == Some(owner) => Err(WireError::new(
                        ErrorCode::ConnectorChannelUnavailable,
                        format!("{tool_id} is not available on the session's channel now"),
                    )),
                    Some(_) => Err(WireError::new(
                        ErrorCode::ConnectorChannelNotOwned,
                        "the session's channel belongs to another user",
                    )),
                    None => Err(WireError::new(
                        ErrorCode::ConnectionNotFound,
                        "the session's channel is not known; sign in again",
                    )),
                }
            }
            None => {
                if let Some(entry) = available.next() {
                    return Ok(entry.connector_channel_id.clone());
                }
                if self.owned_by(owner).any(ChannelEntry::is_authenticated) {
                    Err(WireError::new(
                        ErrorCode::ConnectorChannelUnavailable,
                        format!("{tool_id} is not available on any of the user's channels now"),
                    ))
                } else {
                    Err(WireError::new(
                        ErrorCode::ConnectionNotFound,
                        format!(
                            "the user has no signed-in channel of {}; sign in first",
                            card.connector_card_id
                        ),
                    ))
                }
            }
        }
    }

    /// An explicit channel named by the model (`connector_message_send`): it must belong to
    /// `owner` and be signed in.
    pub fn check_explicit(
        &self,
        owner: &str,
        channel: &ConnectorChannelId,
    ) -> Result<&ChannelEntry, WireError> {
        let Some(entry) = self.get(channel) else {
            return Err(WireError::new(
                ErrorCode::ConnectionNotFound,
                "no such channel; list the channels with connector_channels_list",
            ));
        };
        if entry.owner.as_deref() != Some(owner) {
            return Err(WireError::new(
                ErrorCode::ConnectorChannelNotOwned,
                "the channel belongs to another user",
            ));
        }
        if !entry.is_authenticated() {
            return Err(WireError::new(
                ErrorCode::ConnectionNotAuthenticated,
                "the channel is not signed in",
            ));
        }
        Ok(entry)
    }
}

#[cfg(test)]
mod tests;
