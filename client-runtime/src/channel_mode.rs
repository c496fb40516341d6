//! `supports.user_channel_mode` before `channel.open`: the place a user's first channel holds
//! while its open is in flight, so two concurrent opens cannot both pass the check
//! ([`ChannelDirectory::check_user_channel_mode`] decides).

use std::sync::{Mutex, PoisonError};

use xagent_protocol_types::ConnectorChannelId;

use crate::directory::ChannelDirectory;
use crate::error::UserChannelLimit;

/// Holds a user's place while a first `channel.open` is in flight in `single` mode, so two
/// concurrent opens cannot both pass the check; released when dropped.
pub(crate) struct OpenReservation<'a> {
    directory: &'a Mutex<ChannelDirectory>,
    owner: Option<String>,
}

impl Drop for OpenReservation<'_> {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            let mut directory = self.directory.lock().unwrap_or_else(PoisonError::into_inner);
            directory.opening.retain(|o| o != &owner);
        }
    }
}

/// Applies `supports.user_channel_mode` before a `channel.open` for `owner`
/// ([`ChannelDirectory::check_user_channel_mode`]) and, for a new channel in `single` mode,
/// reserves the user's one channel until the returned guard is dropped.
pub(crate) fn reserve_open<'a>(
    directory: &'a Mutex<ChannelDirectory>,
    owner: &str,
    existing: Option<&ConnectorChannelId>,
) -> Result<OpenReservation<'a>, UserChannelLimit> {
    let mut guard = directory.lock().unwrap_or_else(PoisonError::into_inner);
    let reserve = guard.check_user_channel_mode(owner, existing)?;
    let owner = reserve.then(|| {
        guard.opening.push(owner.to_owned());
        owner.to_owned()
    });
    Ok(OpenReservation { directory, owner })
}

#[cfg(test)]
mod tests {
    use super::*;
    use xagent_protocol_types::{
        BuildInfo, ConnectorCard, ConnectorInfo, Supports, TargetType, UserChannelMode,
    };

    fn card_with_mode(mode: Option<UserChannelMode>) -> ConnectorCard {
        let mut card = ConnectorCard::new(
            "im.x",
            BuildInfo::new("1"),
            ConnectorInfo::new("X", "1.0.0"),
            Supports::new(vec![TargetType::Im], vec!["xagent.im.v2".into()]),
        );
        card.supports.user_channel_mode = mode;
        card
    }

    #[test]
    fn user_channel_mode_rule_single_refuses_a_second_channel_before_channel_open() {
        for mode in [None, Some(UserChannelMode::Single)] {
            let mut directory = ChannelDirectory::new(Some(card_with_mode(mode.clone())));
            let first = ConnectorChannelId::new("cch_a");
            assert_eq!(directory.check_user_channel_mode("alice", None), Ok(true), "{mode:?}");
            directory.set_owner(&first, "alice");
            let refused =
                directory.check_user_channel_mode("alice", None).expect_err("a second channel");
            assert_eq!(refused.existing.as_ref(), Some(&first));
            assert!(refused.to_string().contains("reopen that channel"), "{refused}");
            // Reopening the user's own channel is not a second one; another user is not limited.
            assert_eq!(directory.check_user_channel_mode("alice", Some(&first)), Ok(false));
            assert_eq!(directory.check_user_channel_mode("bob", None), Ok(true));
            // Restoring some other channel id would still be a second channel.
            let other = ConnectorChannelId::new("cch_other");
            assert!(directory.check_user_channel_mode("alice", Some(&other)).is_err());
            // Once forgotten, the user may open a new one.
            directory.forget(&first);
            assert_eq!(directory.check_user_channel_mode("alice", None), Ok(true));
        }
    }

    #[test]
    fn user_channel_mode_rule_multiple_or_no_card_does_not_limit() {
        let mut directory =
            ChannelDirectory::new(Some(card_with_mode(Some(UserChannelMode::Multiple))));
        directory.set_owner(&ConnectorChannelId::new("cch_a"), "alice");
        assert_eq!(directory.check_user_channel_mode("alice", None), Ok(false));
        let mut unchecked = ChannelDirectory::new(None);
        unchecked.set_owner(&ConnectorChannelId::new("cch_a"), "alice");
        assert_eq!(unchecked.check_user_channel_mode("alice", None), Ok(false));
    }

    #[test]
    fn user_channel_mode_rule_single_holds_the_place_of_an_open_in_flight() {
        let directory = Mutex::new(ChannelDirectory::new(Some(card_with_mode(None))));
        let held = reserve_open(&directory, "alice", None).expect("the first open");
        let refused = reserve_open(&directory, "alice", None).err().expect("a concurrent second");
        assert_eq!(refused.existing, None);
        assert!(refused.to_string().contains("a channel being opened"), "{refused}");
        drop(held);
        assert!(reserve_open(&directory, "alice", None).is_ok(), "released when the open ends");
    }
}
