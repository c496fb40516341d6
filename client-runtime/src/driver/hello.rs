//! What the connection's life reads from `connector.hello.ack`. The core judged the ack
//! before it was paired (the session's Card id, version window and pairing, then the packet
//! rules with the admitted Card), so a refused ack failed the hello already.

use xagent_protocol_types::{ConnectorHelloAck, Packet, PacketBody};

use crate::ClientError;

/// The accepted `connector.hello.ack` of `packet`: an ack carrying an error is the Connector's
/// refusal.
pub(crate) fn hello_ack(packet: Packet) -> Result<ConnectorHelloAck, ClientError> {
    if let Some(error) = packet.error {
        return Err(ClientError::Remote(error));
    }
    match packet.body {
        PacketBody::ConnectorHelloAck(Some(ack)) => Ok(*ack),
        _ => Err(ClientError::Protocol(format!(
            "expected connector.hello.ack, got {}",
            packet.type_str()
        ))),
    }
}
