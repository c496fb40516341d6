// Calls the xAgent validators through the C ABI from Go (cgo, standard library only), as the
// Go xAgent backend does.
//
//	validatecheck check <manifest>   every line: kind, document, card ("-" for none) and the
//	                                 expected report file, tab-separated; the report returned
//	                                 through the C ABI must equal the expected bytes, and for
//	                                 packets xagent_packet_is_valid must give its verdict.
//	                                 Kinds packet@connector and packet@xagent go through
//	                                 xagent_validate_packet_from with that sender.
//	validatecheck bench <packet> <ms> [rounds]  calls xagent_packet_is_valid on one packet
//	                                 for about <ms> milliseconds a round, best of [rounds]
//	                                 (default 5), prints {"ns_per_call": N}.
//
// Built and run by validate-ffi/tests/go_cgo.rs and by `cargo xtask bench-decode`; the
// include and library directories come from CGO_CFLAGS and CGO_LDFLAGS.
package main

/*
#include <stdlib.h>
#include "xagent_validate.h"
*/
import "C"

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

func ptr(b []byte) (*C.uint8_t, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return (*C.uint8_t)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// report validates one document through the report functions and returns the JSON text.
func report(kind string, doc, card []byte) (string, error) {
	d, dl := ptr(doc)
	c, cl := ptr(card)
	var out *C.char
	switch kind {
	case "card":
		out = C.xagent_validate_card(d, dl)
	case "descriptor":
		out = C.xagent_validate_descriptor(d, dl, c, cl)
	case "packet":
		out = C.xagent_validate_packet(d, dl, c, cl)
	case "skill":
		out = C.xagent_validate_skill(d, dl, c, cl)
	case "packet@connector":
		out = C.xagent_validate_packet_from(d, dl, c, cl, C.XAGENT_SENDER_CONNECTOR)
	case "packet@xagent":
		out = C.xagent_validate_packet_from(d, dl, c, cl, C.XAGENT_SENDER_XAGENT)
	default:
		return "", fmt.Errorf("unknown kind %q", kind)
	}
	defer C.xagent_validate_free(out)
	return C.GoString(out), nil
}

// senderOf is the C sender value of a packet kind ("packet", "packet@connector", ...).
func senderOf(kind string) C.int32_t {
	switch kind {
	case "packet@connector":
		return C.XAGENT_SENDER_CONNECTOR
	case "packet@xagent":
		return C.XAGENT_SENDER_XAGENT
	}
	return C.XAGENT_SENDER_UNKNOWN
}

// verdict runs the hot path: 1 valid, 0 not.
func verdict(card, packet []byte, sender C.int32_t) (bool, error) {
	c, cl := ptr(card)
	v := C.xagent_packet_validator_new(c, cl)
	if card != nil && v == nil {
		return false, fmt.Errorf("the reference Card was refused")
	}
	defer C.xagent_packet_validator_free(v)
	p, pl := ptr(packet)
	return C.xagent_packet_is_valid(v, p, pl, sender) == 1, nil
}

func check(manifest string) int {
	file, err := os.Open(manifest)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer file.Close()
	fixtures, failures := 0, 0
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		fields := strings.Split(scanner.Text(), "\t")
		if len(fields) != 4 {
			continue
		}
		kind, docPath, cardPath, expectedPath := fields[0], fields[1], fields[2], fields[3]
		doc, err1 := os.ReadFile(docPath)
		expected, err2 := os.ReadFile(expectedPath)
		var card []byte
		var err3 error
		if cardPath != "-" {
			card, err3 = os.ReadFile(cardPath)
		}
		if err1 != nil || err2 != nil || err3 != nil {
			fmt.Println("FAIL cannot read", docPath, err1, err2, err3)
			failures++
			continue
		}
		fixtures++
		got, err := report(kind, doc, card)
		if err != nil || got != string(expected) {
			fmt.Printf("FAIL %s %s: report differs\n  go:   %s\n  rust: %s\n", kind, docPath, got, expected)
			failures++
			continue
		}
		if strings.HasPrefix(kind, "packet") {
			valid, err := verdict(card, doc, senderOf(kind))
			want := bytes.Contains(expected, []byte(`"valid":true`))
			if err != nil || valid != want {
				fmt.Printf("FAIL %s %s: xagent_packet_is_valid says %v, the report %v (%v)\n", kind, docPath, valid, want, err)
				failures++
				continue
			}
		}
		fmt.Printf("ok   %s %s\n", kind, docPath)
	}
	fmt.Printf("%d fixture(s), %d failure(s)\n", fixtures, failures)
	if failures > 0 || fixtures == 0 {
		return 1
	}
	return 0
}

func bench(path string, millis, rounds int) int {
	packet, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	v := C.xagent_packet_validator_new(nil, 0)
	defer C.xagent_packet_validator_free(v)
	p, pl := ptr(packet)
	if C.xagent_packet_is_valid(v, p, pl, C.XAGENT_SENDER_UNKNOWN) != 1 {
		fmt.Fprintln(os.Stderr, "the sample packet is not valid")
		return 1
	}
	best := 0.0
	for round := 0; round < rounds; round++ {
		n := 0
		start := time.Now()
		deadline := time.Duration(millis) * time.Millisecond
		for time.Since(start) < deadline {
			for i := 0; i < 64; i++ {
				C.xagent_packet_is_valid(v, p, pl, C.XAGENT_SENDER_UNKNOWN)
			}
			n += 64
		}
		ns := float64(time.Since(start).Nanoseconds()) / float64(n)
		if best == 0 || ns < best {
			best = ns
		}
	}
	fmt.Printf("{\"ns_per_call\": %.1f}\n", best)
	return 0
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "check" {
		os.Exit(check(os.Args[2]))
	}
	if (len(os.Args) == 4 || len(os.Args) == 5) && os.Args[1] == "bench" {
		ms, err := strconv.Atoi(os.Args[3])
		rounds := 5
		if len(os.Args) == 5 {
			rounds, _ = strconv.Atoi(os.Args[4])
		}
		if err == nil && rounds > 0 {
			os.Exit(bench(os.Args[2], ms, rounds))
		}
	}
	fmt.Fprintln(os.Stderr, "usage: validatecheck check <manifest> | bench <packet> <ms> [rounds]")
	os.Exit(2)
}
