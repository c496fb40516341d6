package xagentvalidate

// No #cgo LDFLAGS here on purpose: whether the library is linked statically
// (libxagent_validate_ffi.a plus the system libraries it needs) or dynamically
// (-lxagent_validate_ffi) is the builder's choice, given in CGO_LDFLAGS; the header
// directory comes from CGO_CFLAGS. See README.md.

/*
#include <string.h>
#include "xagent_validate.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"unsafe"
)

// ABIVersion is the version of the C ABI this package is written for. When the library is
// loaded dynamically it may come from another build: compare with [Version] at start-up.
const ABIVersion = 1

// The package does not compile against a header of another ABI version (one of the two
// differences would be negative): its calls are written for this one.
const _ = uint(ABIVersion-C.XAGENT_VALIDATE_ABI_VERSION) + uint(C.XAGENT_VALIDATE_ABI_VERSION-ABIVersion)

// Sender is the side that sent a data-plane packet. Some packet rules depend on it: a
// Connector-sent chat.message file needs a download_url, an xAgent-sent one does not.
type Sender int32

const (
	// SenderUnknown judges a packet without knowing who sent it: a type only one side sends
	// is judged as sent by that side, a type both sides send is judged for both, and a
	// violation that holds for one of them names it in Violation.Sender.
	SenderUnknown Sender = C.XAGENT_SENDER_UNKNOWN
	// SenderXagent is xAgent, the platform side.
	SenderXagent Sender = C.XAGENT_SENDER_XAGENT
	// SenderConnector is the Connector.
	SenderConnector Sender = C.XAGENT_SENDER_CONNECTOR
)

// String returns "xagent", "connector" or "unknown" (the report's spelling for the first two).
func (s Sender) String() string {
	switch s {
	case SenderXagent:
		return "xagent"
	case SenderConnector:
		return "connector"
	default:
		return "unknown"
	}
}

// ParseSender reads "xagent", "connector" or "unknown" (or "") as a Sender.
func ParseSender(text string) (Sender, error) {
	switch text {
	case "xagent":
		return SenderXagent, nil
	case "connector":
		return SenderConnector, nil
	case "unknown", "":
		return SenderUnknown, nil
	}
	return SenderUnknown, fmt.Errorf("xagentvalidate: unknown sender %q (want connector or xagent)", text)
}

// MarshalText writes the sender as the report spells it.
func (s Sender) MarshalText() ([]byte, error) {
	return []byte(s.String()), nil
}

// UnmarshalText reads the sender as the report spells it.
func (s *Sender) UnmarshalText(text []byte) error {
	parsed, err := ParseSender(string(text))
	if err != nil {
		return err
	}
	*s = parsed
	return nil
}

// emptyByte gives a non-NULL address for a present but empty Card: the C ABI reads NULL as
// "no Card", and an empty Card must be reported, not ignored.
var emptyByte [1]byte

// documentArg passes a document's bytes to C as pointer and length (NULL and 0 when empty,
// which the library reads as the empty document). The library does not keep the pointer.
func documentArg(b []byte) (*C.uint8_t, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// cardArg passes an optional reference Card: nil means no Card (NULL), any other slice is a
// Card to check against, even an empty one.
func cardArg(card []byte) (*C.uint8_t, C.size_t) {
	if card == nil {
		return nil, 0
	}
	if len(card) == 0 {
		return (*C.uint8_t)(unsafe.Pointer(&emptyByte[0])), 0
	}
	return documentArg(card)
}

// takeReport copies the library's report into Go memory, releases the C string and decodes it.
func takeReport(out *C.char) (*Report, error) {
	if out == nil {
		return nil, ErrNoReport
	}
	defer C.xagent_validate_free(out)
	n := C.strlen(out)
	raw := make([]byte, int(n))
	copy(raw, unsafe.Slice((*byte)(unsafe.Pointer(out)), int(n)))
	return parseReport(raw)
}

// ValidateCard validates a Connector Card (connector-card.json).
func ValidateCard(card []byte) (*Report, error) {
	d, dl := documentArg(card)
	return takeReport(C.xagent_validate_card(d, dl))
}

// ValidateDescriptor validates a Connection Descriptor, also against the Connector Card in
// card unless card is nil. A card that is not a JSON object is reported at the path "/card".
func ValidateDescriptor(descriptor, card []byte) (*Report, error) {
	d, dl := documentArg(descriptor)
	c, cl := cardArg(card)
	return takeReport(C.xagent_validate_descriptor(d, dl, c, cl))
}

// ValidatePacket validates one data-plane packet without knowing its sender (see
// SenderUnknown), also against the Connector Card in card unless card is nil.
func ValidatePacket(packet, card []byte) (*Report, error) {
	d, dl := documentArg(packet)
	c, cl := cardArg(card)
	return takeReport(C.xagent_validate_packet(d, dl, c, cl))
}

// ValidatePacketFrom validates one data-plane packet sent by sender, applying the rules that
// depend on the direction for that side, also against the Card in card unless card is nil.
// With SenderUnknown it judges as ValidatePacket does.
func ValidatePacketFrom(packet, card []byte, sender Sender) (*Report, error) {
	d, dl := documentArg(packet)
	c, cl := cardArg(card)
	return takeReport(C.xagent_validate_packet_from(d, dl, c, cl, C.int32_t(sender)))
}

// ValidateSkill validates a SKILL.md (UTF-8 Markdown) against the Connector Card whose Skill
// it is. The Card is required: a nil card is reported as an empty Card at "/card".
func ValidateSkill(skill, card []byte) (*Report, error) {
	d, dl := documentArg(skill)
	c, cl := cardArg(card)
	return takeReport(C.xagent_validate_skill(d, dl, c, cl))
}

// VersionInfo names the versions of the library in use.
type VersionInfo struct {
	// Library is the version of the xagent-validate-ffi crate, e.g. "0.1.0".
	Library string `json:"library"`
	// Protocol is the xAgent Connector Protocol version it implements, e.g. "3.0".
	Protocol string `json:"protocol"`
	// ABI is the C ABI version of the loaded library; compare it with ABIVersion.
	ABI int `json:"abi"`
}

// Version asks the library which versions it implements.
func Version() (VersionInfo, error) {
	var info VersionInfo
	text := C.GoString(C.xagent_validate_version())
	if err := json.Unmarshal([]byte(text), &info); err != nil {
		return info, &DecodeError{Raw: []byte(text), Err: err}
	}
	return info, nil
}
