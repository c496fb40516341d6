package xagentvalidate

/*
#include "xagent_validate.h"
*/
import "C"

import (
	"runtime"
	"sync"
)

// PacketValidator is the hot-path form of packet validation: it holds a parsed reference
// Card (or none), and answers valid or not for each packet without building a report, with
// the same verdict as the Valid field of ValidatePacketFrom's report.
//
// A PacketValidator is safe for concurrent use by many goroutines. It owns memory inside the
// C library: call Close when done with it. A finalizer releases it if it is garbage
// collected unclosed, but only as a backstop; when that happens is up to the collector.
type PacketValidator struct {
	// mu is held for reading by every call into the library and for writing by Close, so
	// Close waits for calls in flight and none starts on freed memory.
	mu   sync.RWMutex
	ptr  *C.XagentPacketValidator
	card []byte
}

// NewPacketValidator makes a validator that checks packets against the Connector Card in
// card, or against no Card when card is nil. It returns a *CardError when the library
// refuses the Card (not UTF-8 JSON, or not a JSON object); the Card's own rules are not
// checked here, ask ValidateCard for those.
func NewPacketValidator(card []byte) (*PacketValidator, error) {
	c, cl := cardArg(card)
	ptr := C.xagent_packet_validator_new(c, cl)
	if ptr == nil {
		if card == nil {
			// Without a Card the library refuses nothing; NULL means it failed internally.
			return nil, ErrInternal
		}
		// The report functions say why: an empty packet against this Card yields the
		// Card's violation at "/card".
		report, err := ValidatePacket(nil, card)
		if err != nil {
			return nil, &CardError{}
		}
		return nil, &CardError{Report: report}
	}
	v := &PacketValidator{ptr: ptr}
	if card != nil {
		v.card = append([]byte{}, card...)
	}
	runtime.SetFinalizer(v, (*PacketValidator).Close)
	return v, nil
}

// IsValid reports whether the packet (UTF-8 JSON) sent by sender breaks no error-severity
// rule. It builds no report: call Report for the reasons when a packet is refused. The only
// error is ErrClosed.
func (v *PacketValidator) IsValid(packet []byte, sender Sender) (bool, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.ptr == nil {
		return false, ErrClosed
	}
	p, pl := documentArg(packet)
	verdict := C.xagent_packet_is_valid(v.ptr, p, pl, C.int32_t(sender))
	return verdict == 1, nil
}

// Report validates the packet sent by sender against this validator's Card with the report
// function (ValidatePacketFrom), for the reasons behind an IsValid verdict.
func (v *PacketValidator) Report(packet []byte, sender Sender) (*Report, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if v.ptr == nil {
		return nil, ErrClosed
	}
	return ValidatePacketFrom(packet, v.card, sender)
}

// Close releases the validator's memory in the library, after any calls in flight return.
// Later calls of IsValid and Report return ErrClosed; closing again does nothing. The
// error is always nil; it is there so a PacketValidator is an io.Closer.
func (v *PacketValidator) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.ptr == nil {
		return nil
	}
	C.xagent_packet_validator_free(v.ptr)
	v.ptr = nil
	runtime.SetFinalizer(v, nil)
	return nil
}
