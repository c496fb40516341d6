package xagentvalidate_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	xagentvalidate "github.com/xagent-connector/xagent-connector-rs/go"
)

// goldenCase is one line of testdata/cases.tsv, written by validate-ffi/tests/go_package.rs.
type goldenCase struct {
	kind, document, card, report string
}

func readCases(t *testing.T) []goldenCase {
	t.Helper()
	file, err := os.Open("testdata/cases.tsv")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	var cases []goldenCase
	scanner := bufio.NewScanner(file)
	for scanner.Scan() {
		line := scanner.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 4 {
			t.Fatalf("cases.tsv: want 4 tab-separated fields, got %q", line)
		}
		cases = append(cases, goldenCase{fields[0], fields[1], fields[2], fields[3]})
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	return cases
}

// validate calls the package function a golden case's kind names.
func validate(kind string, doc, card []byte) (*xagentvalidate.Report, error) {
	switch kind {
	case "card":
		return xagentvalidate.ValidateCard(doc)
	case "descriptor":
		return xagentvalidate.ValidateDescriptor(doc, card)
	case "packet":
		return xagentvalidate.ValidatePacket(doc, card)
	case "packet@connector":
		return xagentvalidate.ValidatePacketFrom(doc, card, xagentvalidate.SenderConnector)
	case "packet@xagent":
		return xagentvalidate.ValidatePacketFrom(doc, card, xagentvalidate.SenderXagent)
	case "skill":
		return xagentvalidate.ValidateSkill(doc, card)
	}
	return nil, errors.New("unknown kind " + kind)
}

func senderOf(kind string) xagentvalidate.Sender {
	switch kind {
	case "packet@connector":
		return xagentvalidate.SenderConnector
	case "packet@xagent":
		return xagentvalidate.SenderXagent
	}
	return xagentvalidate.SenderUnknown
}

// TestGoldens validates every fixture case through the package and compares each report with
// the one Rust gave, byte for byte; packets also go through the hot path.
func TestGoldens(t *testing.T) {
	cases := readCases(t)
	if len(cases) < 40 {
		t.Fatalf("only %d golden cases", len(cases))
	}
	validators := map[string]*xagentvalidate.PacketValidator{}
	defer func() {
		for _, v := range validators {
			v.Close()
		}
	}()
	for _, c := range cases {
		c := c
		name := strings.TrimSuffix(strings.TrimPrefix(c.report, "testdata/reports/"), ".json")
		t.Run(name, func(t *testing.T) {
			doc := mustRead(t, c.document)
			var card []byte
			if c.card != "-" {
				card = mustRead(t, c.card)
			}
			want := mustRead(t, c.report)
			r, err := validate(c.kind, doc, card)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(r.Raw, want) {
				t.Fatalf("report differs from Rust's\n  go:   %s\n  rust: %s", r.Raw, want)
			}
			checkTyped(t, r)
			if !strings.HasPrefix(c.kind, "packet") {
				return
			}
			v, ok := validators[c.card]
			if !ok {
				v, err = xagentvalidate.NewPacketValidator(card)
				if err != nil {
					t.Fatal(err)
				}
				validators[c.card] = v
			}
			valid, err := v.IsValid(doc, senderOf(c.kind))
			if err != nil || valid != r.Valid {
				t.Errorf("IsValid says %v (%v), the report %v", valid, err, r.Valid)
			}
			again, err := v.Report(doc, senderOf(c.kind))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again.Raw, want) {
				t.Errorf("PacketValidator.Report differs:\n  got:  %s\n  want: %s", again.Raw, want)
			}
		})
	}
}
