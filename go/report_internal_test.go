package xagentvalidate

import (
	"errors"
	"strings"
	"testing"
)

// The library never returns these; parseReport must still turn them into errors, not into
// a report that looks valid.
func TestParseReportRefusesWhatIsNotAReport(t *testing.T) {
	for _, raw := range []string{``, `not json`, `[]`, `{}`, `{"valid":true}`, `{"violations":[]}`, `{"valid":true,"violations":null}`} {
		r, err := parseReport([]byte(raw))
		var decode *DecodeError
		if r != nil || !errors.As(err, &decode) || string(decode.Raw) != raw {
			t.Errorf("parseReport(%q) = %v, %v; want a *DecodeError", raw, r, err)
		}
	}
}

func TestInternalFailureIsAnError(t *testing.T) {
	raw := `{"valid":false,"violations":[{"rule":"ffi.internal_error","severity":"error","path":"","message":"the validator failed internally"}]}`
	r, err := parseReport([]byte(raw))
	if r != nil || !errors.Is(err, ErrInternal) {
		t.Fatalf("parseReport = %v, %v; want ErrInternal", r, err)
	}
	var internal *InternalError
	if !errors.As(err, &internal) || string(internal.Report.Raw) != raw {
		t.Errorf("the error does not carry the report: %#v", err)
	}
	if !strings.Contains(err.Error(), "failed internally") {
		t.Errorf("error text %q", err)
	}
}
