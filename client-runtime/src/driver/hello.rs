//! The checks on `connector.hello.ack`, shared by the connection's life (which waits for it)
//! and the reader (which reports a refused one with the validator's rule ids).

use xagent_protocol_types::{ConnectorHelloAck, Packet, Side};
use xagent_protocol_validate::PacketContext;

use crate::ClientError;
use crate::connection::Shared;

/// The checks on `connector.hello.ack` beyond the session's (which already checked the Card
/// id, the version window and the pairing): the schema rules of the validator, and the Card.
pub(crate) fn check_hello_ack(
    shared: &Shared,
    packet: &Packet,
) -> Result<ConnectorHelloAck, ClientError> {
    if let Some(error) = &packet.error {
        return Err(ClientError::Remote(error.clone()));
    }
    let value = packet.to_value().map_err(|e| ClientError::Protocol(e.to_string()))?;
    let admitted = shared.admission.current();
    let context = PacketContext { card: admitted.facts.as_deref(), sender: Some(Side::Connector) };
    // The configured window, not the default one: the same validator as every other packet.
    let report = shared.validator.packet(&value, context);
    let errors: Vec<String> = report.errors().map(ToString::to_string).collect();
    if !errors.is_empty() {
        return Err(ClientError::NotAdmissible(format!(
            "connector.hello.ack refused: {}",
            errors.join("; ")
        )));
    }
    let Some(ack) = packet.payload::<ConnectorHelloAck>().cloned() else {
        return Err(ClientError::Protocol(format!(
            "expected connector.hello.ack, got {}",
            packet.type_str()
        )));
    };
    if ack.connector_card_id != admitted.card_id {
        return Err(ClientError::NotAdmissible(format!(
            "[hello_ack.card_id] connector.hello.ack names card {}, expected {}",
            ack.connector_card_id, admitted.card_id
        )));
    }
    admitted
        .window
        .admit(ack.protocol_version.as_deref())
        .map_err(|e| ClientError::NotAdmissible(format!("[hello_ack.protocol_version] {e}")))?;
    if let Some(card) = &admitted.card
        && ack.protocol_version.as_deref() != Some(card.protocol_version.as_str())
    {
        return Err(ClientError::NotAdmissible(format!(
            "[hello_ack.protocol_version] connector.hello.ack says protocol {:?}, the admitted Card says {}",
            ack.protocol_version, card.protocol_version
        )));
    }
    Ok(ack)
}
