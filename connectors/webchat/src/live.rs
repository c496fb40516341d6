//! Live events across replicas. A replica that changes a room's conversation (a visitor's
//! message, the agent's reply, a delivery state) pushes it to its own open pages at once and
//! tells every replica through the runtime's cluster broadcast ([`TOPIC`]), as a write in the
//! very transaction that stores the change (so a replica dying right after its commit cannot
//! leave the others' pages behind); each replica reads the change from the author store and
//! pushes it to its pages (`follow.rs`). The broadcast carries a hint
//! only (`{origin} {room_id} {message_id}`, far below its 1 KiB): what a page shows always
//! comes from the stored record, so a hint delivered twice shows the same message twice (the
//! page upserts by `message_id`), and a page whose replica missed a hint gets the message in
//! the snapshot of its next (re)connect, on any replica.

/// The broadcast topic of room news.
pub(crate) const TOPIC: &str = "webchat.news";

/// The hint that `message_id` in `room_id` is new or changed, sent by `origin`.
pub(crate) fn hint(origin: &str, room_id: &str, message_id: &str) -> String {
    format!("{origin} {room_id} {message_id}")
}

/// A hint's parts, or `None` for anything else.
pub(crate) fn parse(text: &str) -> Option<(&str, &str, &str)> {
    let mut parts = text.splitn(3, ' ');
    let (origin, room, message) = (parts.next()?, parts.next()?, parts.next()?);
    (!origin.is_empty()
        && crate::store::is_room_id(room)
        && !message.is_empty()
        && !message.contains(' '))
    .then_some((origin, room, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_names_its_origin_room_and_message_and_nothing_else_parses() {
        let text = hint("0a1b", "support-desk", "msg_web_1");
        assert_eq!(parse(&text), Some(("0a1b", "support-desk", "msg_web_1")));
        assert!(text.len() < 1_024);
        for bad in [
            "",
            "0a1b",
            "0a1b lobby",
            "0a1b Lobby msg",
            "0a1b a/b msg",
            " lobby msg",
            "o lobby a b",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
