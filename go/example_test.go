package xagentvalidate_test

import (
	"fmt"
	"log"

	xagentvalidate "github.com/xagent-connector/xagent-connector-rs/go"
)

// A Card that still declares protocol 2.0 and lacks its ids is refused, and the report names
// every rule it breaks with a JSON pointer to the place.
func ExampleValidateCard() {
	card := []byte(`{"schema": "xagent.connector/v1", "protocol_version": "2.0"}`)
	report, err := xagentvalidate.ValidateCard(card)
	if err != nil {
		log.Fatal(err) // the library failed; an invalid Card is not an error
	}
	fmt.Println("valid:", report.Valid)
	for _, v := range report.Errors()[:3] {
		fmt.Println(v.Rule, v.Path)
	}
	// Output:
	// valid: false
	// card.protocol_version /protocol_version
	// card.build /build
	// card.connector_card_id /connector_card_id
}

// The hot path: one validator for the backend's life, a verdict per packet, and the report
// only for the packets it refuses.
func ExamplePacketValidator() {
	validator, err := xagentvalidate.NewPacketValidator(nil) // nil: no reference Card
	if err != nil {
		log.Fatal(err)
	}
	defer validator.Close()

	packet := []byte(`{"schema": "xagent.connector.packet/v1", "packet_id": "pkt_1",
		"type": "chat.message", "connector_channel_id": "cch_1", "time": 1790000000000,
		"payload": {"message_id": "msg_1", "files": [{"type": "image", "file_ref": "f_1"}]}}`)
	for _, sender := range []xagentvalidate.Sender{xagentvalidate.SenderXagent, xagentvalidate.SenderConnector} {
		ok, err := validator.IsValid(packet, sender)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("sent by %s: valid %v\n", sender, ok)
		if !ok {
			report, err := validator.Report(packet, sender)
			if err != nil {
				log.Fatal(err)
			}
			fmt.Println(report.Rules())
		}
	}
	// Output:
	// sent by xagent: valid true
	// sent by connector: valid false
	// [chat_message.download_url]
}
