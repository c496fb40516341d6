package xagentvalidate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"strings"
	"sync"
	"testing"

	xagentvalidate "github.com/xagent-connector/xagent-connector-rs/go"
)

func mustRead(t *testing.T, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// encode writes a report back as JSON the way the Rust side does (no HTML escaping, no
// trailing newline), so a typed report that lost or renamed a member cannot round-trip.
func encode(t *testing.T, r *xagentvalidate.Report) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// checkTyped checks that the typed fields carry everything the raw JSON says.
func checkTyped(t *testing.T, r *xagentvalidate.Report) {
	t.Helper()
	var generic struct {
		Valid      *bool                    `json:"valid"`
		Violations []map[string]interface{} `json:"violations"`
	}
	if err := json.Unmarshal(r.Raw, &generic); err != nil || generic.Valid == nil {
		t.Fatalf("the raw report is not a report (%v): %s", err, r.Raw)
	}
	if r.Valid != *generic.Valid {
		t.Errorf("Valid is %v, the JSON says %v", r.Valid, *generic.Valid)
	}
	if len(r.Violations) != len(generic.Violations) {
		t.Fatalf("%d typed violations, %d in the JSON", len(r.Violations), len(generic.Violations))
	}
	hasError := false
	for i, v := range r.Violations {
		g := generic.Violations[i]
		if v.Rule == "" || v.Rule != g["rule"] || string(v.Severity) != g["severity"] ||
			v.Path != g["path"] || v.Message != g["message"] {
			t.Errorf("violation %d typed as %+v, the JSON has %v", i, v, g)
		}
		if v.Severity != xagentvalidate.SeverityError && v.Severity != xagentvalidate.SeverityWarning {
			t.Errorf("violation %d has severity %q", i, v.Severity)
		}
		if v.Path != "" && !strings.HasPrefix(v.Path, "/") {
			t.Errorf("violation %d: path %q is not a JSON pointer", i, v.Path)
		}
		hasError = hasError || v.Severity == xagentvalidate.SeverityError
	}
	if r.Valid == hasError {
		t.Errorf("Valid is %v but an error-severity violation is present: %v", r.Valid, hasError)
	}
	if (r.Err() == nil) != r.Valid {
		t.Errorf("Err() is %v for a report with Valid %v", r.Err(), r.Valid)
	}
	strict := json.NewDecoder(bytes.NewReader(r.Raw))
	strict.DisallowUnknownFields()
	var again xagentvalidate.Report
	if err := strict.Decode(&again); err != nil {
		t.Errorf("the report has a member the Go types do not know: %v", err)
	}
	if back := encode(t, r); !bytes.Equal(back, r.Raw) {
		t.Errorf("the typed report does not round-trip:\n  typed: %s\n  raw:   %s", back, r.Raw)
	}
}

func ffiData(t *testing.T, name string) []byte {
	t.Helper()
	return mustRead(t, path.Join("..", "validate-ffi", "tests", "data", name))
}

func TestInvalidCardNamesItsRules(t *testing.T) {
	r, err := xagentvalidate.ValidateCard(ffiData(t, "card-invalid.json"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Valid || len(r.Errors()) < 5 {
		t.Fatalf("want an invalid report with several errors, got %s", r.Raw)
	}
	for _, rule := range []string{"card.protocol_version", "card.connector_card_id", "card.tool_id_format"} {
		if !r.Has(rule) {
			t.Errorf("no %s in %v", rule, r.Rules())
		}
	}
	if r.Violations[0].Path != "/protocol_version" {
		t.Errorf("first path %q", r.Violations[0].Path)
	}
	err = r.Err()
	var invalid *xagentvalidate.ValidationError
	if !errors.As(err, &invalid) || invalid.Report != r {
		t.Fatalf("Err() = %#v, want a *ValidationError with the report", err)
	}
	if !strings.Contains(err.Error(), "card.protocol_version") || !strings.Contains(err.Error(), "more error(s)") {
		t.Errorf("error text %q", err)
	}
}

func TestValidDocumentsHaveNoErrors(t *testing.T) {
	card := ffiData(t, "card.json")
	reports := map[string]func() (*xagentvalidate.Report, error){
		"card": func() (*xagentvalidate.Report, error) {
			return xagentvalidate.ValidateCard(card)
		},
		"descriptor": func() (*xagentvalidate.Report, error) {
			return xagentvalidate.ValidateDescriptor(ffiData(t, "descriptor.json"), card)
		},
		"packet": func() (*xagentvalidate.Report, error) {
			return xagentvalidate.ValidatePacket(ffiData(t, "packet.json"), card)
		},
		"skill": func() (*xagentvalidate.Report, error) {
			return xagentvalidate.ValidateSkill(ffiData(t, "SKILL.md"), card)
		},
	}
	for name, report := range reports {
		r, err := report()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !r.Valid || r.Violations == nil || len(r.Errors()) != 0 || r.Err() != nil {
			t.Errorf("%s: %s", name, r.Raw)
		}
		// The Card breaks one recommendation, which leaves it valid.
		if name == "card" {
			if w := r.Warnings(); len(w) != 1 || w[0].Rule != "card.auth_field_secret" {
				t.Errorf("card warnings: %s", r.Raw)
			}
		} else if string(r.Raw) != `{"valid":true,"violations":[]}` {
			t.Errorf("%s: raw %s", name, r.Raw)
		}
	}
}

// A Connector-sent chat.message file needs download_url; an xAgent-sent one does not.
var fileWithoutURL = []byte(`{"schema":"xagent.connector.packet/v1","packet_id":"p","type":"chat.message",` +
	`"connector_channel_id":"c","time":1,"payload":{"message_id":"m","files":[{"type":"image","file_ref":"f"}]}}`)

func TestSenderDecidesTheDirectionRules(t *testing.T) {
	r, err := xagentvalidate.ValidatePacket(fileWithoutURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Valid || len(r.Violations) != 1 || r.Violations[0].Rule != "chat_message.download_url" {
		t.Fatalf("without a sender: %s", r.Raw)
	}
	if r.Violations[0].Sender != xagentvalidate.SenderConnector {
		t.Errorf("the violation names sender %v, want connector", r.Violations[0].Sender)
	}
	if !strings.Contains(r.Violations[0].String(), "(when sent by connector)") {
		t.Errorf("String() = %q", r.Violations[0].String())
	}
	checkTyped(t, r)
	v, err := xagentvalidate.NewPacketValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	for sender, want := range map[xagentvalidate.Sender]bool{
		xagentvalidate.SenderConnector: false,
		xagentvalidate.SenderXagent:    true,
		xagentvalidate.SenderUnknown:   false,
		xagentvalidate.Sender(7):       false, // any other value counts as unknown
	} {
		r, err := xagentvalidate.ValidatePacketFrom(fileWithoutURL, nil, sender)
		if err != nil || r.Valid != want {
			t.Errorf("sender %d: valid %v (%v), want %v: %s", sender, r.Valid, err, want, r.Raw)
		}
		if sender == xagentvalidate.SenderConnector || sender == xagentvalidate.SenderXagent {
			for _, violation := range r.Violations {
				if violation.Sender != xagentvalidate.SenderUnknown {
					t.Errorf("sender %v given, yet a violation names %v", sender, violation.Sender)
				}
			}
		}
		if got, err := v.IsValid(fileWithoutURL, sender); err != nil || got != want {
			t.Errorf("IsValid, sender %d: %v (%v), want %v", sender, got, err, want)
		}
	}
}

func TestGarbageIsReportedNotAnError(t *testing.T) {
	for name, doc := range map[string][]byte{
		"not JSON":  []byte(`{"schema": "xagent.connector/v1",`),
		"not UTF-8": {'{', 0xff, 0xfe, '}'},
		"empty":     nil,
	} {
		r, err := xagentvalidate.ValidateCard(doc)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Valid || len(r.Violations) != 1 || r.Violations[0].Rule != "document.not_json" || r.Violations[0].Path != "" {
			t.Errorf("%s: %s", name, r.Raw)
		}
		checkTyped(t, r)
	}
	r, err := xagentvalidate.ValidateCard([]byte(`[1, 2]`))
	if err != nil || !r.Has("document.not_object") {
		t.Errorf("an array: %v %s", err, r.Raw)
	}
	v, err := xagentvalidate.NewPacketValidator(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	for _, doc := range [][]byte{nil, []byte("nope"), {0xff}} {
		if ok, err := v.IsValid(doc, xagentvalidate.SenderUnknown); ok || err != nil {
			t.Errorf("IsValid(%q) = %v, %v", doc, ok, err)
		}
	}
}

func TestBadReferenceCardIsReportedAtSlashCard(t *testing.T) {
	descriptor := ffiData(t, "descriptor.json")
	for name, card := range map[string][]byte{
		"array":     []byte(`[1, 2]`),
		"not JSON":  []byte(`{`),
		"empty":     {},
		"not UTF-8": {0xc3},
	} {
		r, err := xagentvalidate.ValidateDescriptor(descriptor, card)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Valid || len(r.Violations) != 1 || r.Violations[0].Path != "/card" {
			t.Errorf("%s: %s", name, r.Raw)
		}
	}
	// A nil Card is no Card; a Skill needs one, so there it is reported.
	if r, err := xagentvalidate.ValidateDescriptor(descriptor, nil); err != nil || !r.Valid {
		t.Errorf("no Card: %v %s", err, r.Raw)
	}
	r, err := xagentvalidate.ValidateSkill(ffiData(t, "SKILL.md"), nil)
	if err != nil || r.Valid || r.Violations[0].Path != "/card" {
		t.Errorf("Skill without a Card: %v %s", err, r.Raw)
	}
}

func TestPacketValidatorRefusesACardItCannotRead(t *testing.T) {
	for _, card := range [][]byte{[]byte("nope"), []byte(`"a string"`), {}} {
		v, err := xagentvalidate.NewPacketValidator(card)
		var refused *xagentvalidate.CardError
		if v != nil || !errors.As(err, &refused) {
			t.Fatalf("NewPacketValidator(%q) = %v, %v; want a *CardError", card, v, err)
		}
		if refused.Report == nil || refused.Report.Violations[0].Path != "/card" {
			t.Errorf("the refusal does not say why: %+v", refused.Report)
		}
		if !strings.Contains(err.Error(), "reference Card") {
			t.Errorf("error text %q", err)
		}
	}
	// A Card that is an object but breaks Card rules is accepted: the Card rules are
	// ValidateCard's business.
	v, err := xagentvalidate.NewPacketValidator(ffiData(t, "card-invalid.json"))
	if err != nil {
		t.Fatal(err)
	}
	v.Close()
}

func TestPacketValidatorClose(t *testing.T) {
	v, err := xagentvalidate.NewPacketValidator(ffiData(t, "card.json"))
	if err != nil {
		t.Fatal(err)
	}
	packet := ffiData(t, "packet.json")
	if ok, err := v.IsValid(packet, xagentvalidate.SenderConnector); !ok || err != nil {
		t.Fatalf("IsValid = %v, %v", ok, err)
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if err := v.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if ok, err := v.IsValid(packet, xagentvalidate.SenderConnector); ok || !errors.Is(err, xagentvalidate.ErrClosed) {
		t.Errorf("IsValid after Close = %v, %v", ok, err)
	}
	if r, err := v.Report(packet, xagentvalidate.SenderConnector); r != nil || !errors.Is(err, xagentvalidate.ErrClosed) {
		t.Errorf("Report after Close = %v, %v", r, err)
	}
}

// Many goroutines share one validator and it is closed under them while they call it: each
// call either answers or returns ErrClosed, and none runs on freed memory.
func TestPacketValidatorConcurrentUseAndClose(t *testing.T) {
	v, err := xagentvalidate.NewPacketValidator(ffiData(t, "card.json"))
	if err != nil {
		t.Fatal(err)
	}
	packet := ffiData(t, "packet.json")
	const goroutines = 8
	var started, done sync.WaitGroup
	failures := make(chan string, goroutines)
	for g := 0; g < goroutines; g++ {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			for i := 0; ; i++ {
				ok, err := v.IsValid(packet, xagentvalidate.SenderUnknown)
				if i == 0 {
					started.Done()
				}
				if errors.Is(err, xagentvalidate.ErrClosed) {
					if i == 0 {
						failures <- "closed before the first call"
					}
					return
				}
				if !ok || err != nil {
					failures <- fmt.Sprintf("a valid packet was refused (%v)", err)
					return
				}
			}
		}()
	}
	started.Wait() // every goroutine has made a call and keeps calling
	v.Close()
	done.Wait()
	close(failures)
	for failure := range failures {
		t.Error(failure)
	}
}

func TestVersion(t *testing.T) {
	info, err := xagentvalidate.Version()
	if err != nil {
		t.Fatal(err)
	}
	if info.ABI != xagentvalidate.ABIVersion || info.Protocol != "3.0" || info.Library == "" {
		t.Errorf("Version() = %+v, compiled against ABI %d", info, xagentvalidate.ABIVersion)
	}
}

func TestSenderText(t *testing.T) {
	for _, s := range []xagentvalidate.Sender{xagentvalidate.SenderUnknown, xagentvalidate.SenderXagent, xagentvalidate.SenderConnector} {
		parsed, err := xagentvalidate.ParseSender(s.String())
		if err != nil || parsed != s {
			t.Errorf("ParseSender(%q) = %v, %v", s.String(), parsed, err)
		}
	}
	if _, err := xagentvalidate.ParseSender("platform"); err == nil {
		t.Error("ParseSender accepted an unknown side")
	}
	var v xagentvalidate.Violation
	if err := json.Unmarshal([]byte(`{"sender":"platform"}`), &v); err == nil {
		t.Error("an unknown sender in a report decoded without error")
	}
}

// The hot path through the package (the read lock, the cgo call, the verdict); compare with
// the raw cgo loop of validate-ffi/tests/go (`validatecheck bench`) on the same packet.
func BenchmarkPacketValidatorIsValid(b *testing.B) {
	packet, err := os.ReadFile("../validate-ffi/tests/data/packet.json")
	if err != nil {
		b.Fatal(err)
	}
	v, err := xagentvalidate.NewPacketValidator(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if ok, err := v.IsValid(packet, xagentvalidate.SenderUnknown); !ok || err != nil {
			b.Fatal("the sample packet was refused")
		}
	}
}

// The same from every GOMAXPROCS goroutine at once on one shared validator.
func BenchmarkPacketValidatorIsValidParallel(b *testing.B) {
	packet, err := os.ReadFile("../validate-ffi/tests/data/packet.json")
	if err != nil {
		b.Fatal(err)
	}
	v, err := xagentvalidate.NewPacketValidator(nil)
	if err != nil {
		b.Fatal(err)
	}
	defer v.Close()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if ok, err := v.IsValid(packet, xagentvalidate.SenderUnknown); !ok || err != nil {
				b.Error("the sample packet was refused")
				return
			}
		}
	})
}
