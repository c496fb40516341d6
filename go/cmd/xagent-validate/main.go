// Command xagent-validate validates one xAgent Connector Protocol document with the
// xagentvalidate package and prints the report.
//
// Usage:
//
//	xagent-validate [-kind KIND] [-card CARD] [-sender SIDE] [-format json|text] FILE
//
// FILE is a Connector Card, a Connection Descriptor, a data-plane packet or a SKILL.md ("-"
// reads standard input). KIND is auto (the default: a .md file is a Skill, a JSON document is
// told by its "schema" member), card, descriptor, packet or skill. CARD is the reference Card
// to check a Descriptor, packet or Skill against (required for a Skill). SIDE, for a packet,
// is connector or xagent. The JSON report is the one `xagent-connector check --format json`
// prints; text gives one violation a line.
//
// The exit status is 0 for a valid document, 1 for an invalid one and 2 when the document
// could not be validated (bad usage, unreadable file, library failure).
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	xagentvalidate "github.com/xagent-connector/xagent-connector-rs/go"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the command with its arguments and streams given; it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	flags := flag.NewFlagSet("xagent-validate", flag.ContinueOnError)
	flags.SetOutput(stderr)
	kind := flags.String("kind", "auto", "auto, card, descriptor, packet or skill")
	cardPath := flags.String("card", "", "reference Card for a Descriptor, packet or Skill")
	senderName := flags.String("sender", "", "who sent the packet: connector or xagent")
	format := flags.String("format", "json", "json (the report) or text (a line per violation)")
	flags.Usage = func() {
		fmt.Fprintln(stderr, "usage: xagent-validate [-kind KIND] [-card CARD] [-sender SIDE] [-format json|text] FILE")
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if flags.NArg() != 1 || (*format != "json" && *format != "text") {
		flags.Usage()
		return 2
	}
	report, err := validate(flags.Arg(0), *kind, *cardPath, *senderName, stdin)
	if err != nil {
		fmt.Fprintln(stderr, "xagent-validate:", err)
		return 2
	}
	if *format == "json" {
		fmt.Fprintf(stdout, "%s\n", report.Raw)
	} else {
		for _, v := range report.Violations {
			fmt.Fprintln(stdout, v)
		}
		fmt.Fprintf(stdout, "valid: %v (%d error(s), %d warning(s))\n",
			report.Valid, len(report.Errors()), len(report.Warnings()))
	}
	if !report.Valid {
		return 1
	}
	return 0
}

func validate(path, kind, cardPath, senderName string, stdin io.Reader) (*xagentvalidate.Report, error) {
	doc, err := readInput(path, stdin)
	if err != nil {
		return nil, err
	}
	var card []byte
	if cardPath != "" {
		if card, err = os.ReadFile(cardPath); err != nil {
			return nil, err
		}
	}
	sender, err := xagentvalidate.ParseSender(senderName)
	if err != nil {
		return nil, err
	}
	if kind == "auto" {
		if kind, err = detect(path, doc); err != nil {
			return nil, err
		}
	}
	if senderName != "" && kind != "packet" {
		return nil, fmt.Errorf("-sender applies to packets, not to a %s", kind)
	}
	switch kind {
	case "card":
		if card != nil {
			return nil, errors.New("-card applies to a Descriptor, a packet or a Skill, not to a Card")
		}
		return xagentvalidate.ValidateCard(doc)
	case "descriptor":
		return xagentvalidate.ValidateDescriptor(doc, card)
	case "packet":
		return xagentvalidate.ValidatePacketFrom(doc, card, sender)
	case "skill":
		if card == nil {
			return nil, errors.New("a Skill is validated against its Card: give -card")
		}
		return xagentvalidate.ValidateSkill(doc, card)
	}
	return nil, fmt.Errorf("unknown -kind %q (want auto, card, descriptor, packet or skill)", kind)
}

func readInput(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(stdin)
	}
	return os.ReadFile(path)
}

// detect tells the kind of a document: a Markdown file is a Skill, a JSON one is known by
// its "schema" member.
func detect(path string, doc []byte) (string, error) {
	if strings.HasSuffix(strings.ToLower(path), ".md") {
		return "skill", nil
	}
	var head struct {
		Schema string `json:"schema"`
	}
	if err := json.NewDecoder(bytes.NewReader(doc)).Decode(&head); err != nil {
		return "", fmt.Errorf("cannot tell what %s is, it does not start with a JSON object (%v); "+
			"give -kind to have it reported", path, err)
	}
	switch {
	case head.Schema == "xagent.connector/v1":
		return "card", nil
	case strings.HasPrefix(head.Schema, "xagent.connection/"):
		return "descriptor", nil
	case head.Schema == "xagent.connector.packet/v1":
		return "packet", nil
	}
	return "", fmt.Errorf("cannot tell what %s is (schema %q); give -kind", path, head.Schema)
}
