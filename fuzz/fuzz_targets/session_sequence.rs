//! The data-plane sequencing machine fed packet sequences: the input is split into lines, each
//! line a packet (alternately received and sent, chosen by its first byte). Whatever arrives,
//! the session answers with an `Accepted` or a `Rejection` carrying an error code, never a
//! panic, and its bookkeeping stays bounded by what it was fed.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xagent_protocol_types::{Packet, ProfileId, Side};
use xagent_protocol_validate::{AdmissionWindow, Session};

fuzz_target!(|data: &[u8]| {
    let side =
        if data.first().is_some_and(|b| b & 1 == 1) { Side::Xagent } else { Side::Connector };
    let mut session = Session::from_parts(
        side,
        "im.echo".into(),
        vec![ProfileId::from("xagent.im.v2"), ProfileId::from("xagent.im.v1")],
        AdmissionWindow::default(),
    );
    let mut fed = 0usize;
    for line in data.split(|b| *b == b'\n').skip(1).take(64) {
        let Some((&direction, body)) = line.split_first() else { continue };
        let packet = match Packet::decode(body) {
            Ok(packet) => packet,
            Err(_) => continue,
        };
        fed += 1;
        let outcome =
            if direction == b'>' { session.on_sent(&packet) } else { session.on_received(&packet) };
        if let Err(rejection) = outcome {
            let _ = rejection.code();
            let _ = rejection.error_packet("pkt_err", &packet);
        }
    }
    assert!(session.pending_requests().count() <= fed);
    assert!(session.pending_messages().count() <= fed);
    assert!(session.open_channels().count() <= fed);
});
