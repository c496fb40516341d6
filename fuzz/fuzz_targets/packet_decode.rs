//! Packet decoding: any bytes either decode to a packet or give a `DecodeError` with a stable
//! code, never a panic. A decoded packet re-encodes and decodes again to the same type, and the
//! rule-based packet validator accepts any JSON value without panicking.

#![no_main]

use libfuzzer_sys::fuzz_target;
use xagent_protocol_types::Packet;
use xagent_protocol_validate::{PacketContext, validate_packet};

fuzz_target!(|data: &[u8]| {
    match Packet::decode(data) {
        Ok(packet) => {
            let json = packet.to_json().expect("a decoded packet serialises");
            let again = Packet::decode_str(&json).expect("a re-encoded packet decodes");
            assert_eq!(again.type_str(), packet.type_str());
            assert_eq!(again.packet_id, packet.packet_id);
        }
        Err(error) => {
            let _ = error.code();
            let _ = error.to_wire();
        }
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let report = validate_packet(&value, PacketContext::default());
        let _ = report.valid;
    }
});
