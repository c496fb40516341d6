package xagentvalidate

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Severity says how much a violation weighs: an error makes a document invalid, a warning
// does not.
type Severity string

const (
	// SeverityError marks a broken Must: a missing required member, a forbidden value, a
	// failed structural check. Any error makes the report invalid.
	SeverityError Severity = "error"
	// SeverityWarning marks a broken Should; the document stays valid.
	SeverityWarning Severity = "warning"
)

// RuleInternalError is the rule id the library reports when it failed internally (a caught
// panic) instead of judging the document. The validating functions turn such a report into
// an error matching [ErrInternal].
const RuleInternalError = "ffi.internal_error"

// Violation is one finding of a validator.
type Violation struct {
	// Rule is the stable rule id, e.g. "card.protocol_version" or "document.not_json".
	Rule string `json:"rule"`
	// Severity is SeverityError or SeverityWarning.
	Severity Severity `json:"severity"`
	// Path is a JSON pointer (RFC 6901) to the offending value, "" for the whole document.
	// "/card" means the reference Card given beside the document could not be read.
	Path string `json:"path"`
	// Message says what is wrong and what to do about it. It never repeats a secret found in
	// the document.
	Message string `json:"message"`
	// Sender is set only on packet reports judged without a sender, for a rule that holds
	// when one side sends the packet: the side it holds for. SenderUnknown otherwise.
	Sender Sender `json:"sender,omitempty"`
}

// String gives the violation on one line: severity, rule, path and message.
func (v Violation) String() string {
	path := v.Path
	if path == "" {
		path = "(document)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s at %s: %s", v.Severity, v.Rule, path, v.Message)
	if v.Sender != SenderUnknown {
		fmt.Fprintf(&b, " (when sent by %s)", v.Sender)
	}
	return b.String()
}

// Report is the verdict of one validation: the report JSON of the C ABI, decoded.
type Report struct {
	// Valid is true when no violation has SeverityError.
	Valid bool `json:"valid"`
	// Violations lists every finding, in the order the validator found them. It is empty,
	// not nil, for a clean document.
	Violations []Violation `json:"violations"`
	// Raw is the report JSON exactly as the library returned it (a Go copy; nothing to free).
	// It is what `xagent-connector check --format json` prints for the same input.
	Raw []byte `json:"-"`
}

// Errors returns the violations with SeverityError.
func (r *Report) Errors() []Violation {
	return r.filter(SeverityError)
}

// Warnings returns the violations with SeverityWarning.
func (r *Report) Warnings() []Violation {
	return r.filter(SeverityWarning)
}

func (r *Report) filter(severity Severity) []Violation {
	var out []Violation
	for _, v := range r.Violations {
		if v.Severity == severity {
			out = append(out, v)
		}
	}
	return out
}

// Rules returns the rule id of every violation, in report order (repeated when a rule is
// broken more than once).
func (r *Report) Rules() []string {
	out := make([]string, 0, len(r.Violations))
	for _, v := range r.Violations {
		out = append(out, v.Rule)
	}
	return out
}

// Has reports whether any violation carries the rule id.
func (r *Report) Has(rule string) bool {
	for _, v := range r.Violations {
		if v.Rule == rule {
			return true
		}
	}
	return false
}

// Err returns nil for a valid report and a *ValidationError holding the report otherwise,
// for callers that treat an invalid document as a failure.
func (r *Report) Err() error {
	if r.Valid {
		return nil
	}
	return &ValidationError{Report: r}
}

// ValidationError is the error [Report.Err] returns for an invalid document.
type ValidationError struct {
	// Report is the full report; its Errors say why the document was refused.
	Report *Report
}

// Error names the first error-severity violation and how many there are in all.
func (e *ValidationError) Error() string {
	errs := e.Report.Errors()
	switch len(errs) {
	case 0:
		return "xagentvalidate: the document is invalid"
	case 1:
		return "xagentvalidate: invalid document: " + errs[0].String()
	default:
		return fmt.Sprintf("xagentvalidate: invalid document: %s (and %d more error(s))",
			errs[0].String(), len(errs)-1)
	}
}

// ErrNoReport is returned when the library returned a NULL report, which its contract rules
// out; it points at a mismatched or broken library.
var ErrNoReport = errors.New("xagentvalidate: the library returned no report")

// ErrInternal is matched (with errors.Is) by the error returned when the library reported
// that it failed internally (rule RuleInternalError) instead of judging the input.
var ErrInternal = errors.New("xagentvalidate: the validator failed internally")

// ErrClosed is returned by a PacketValidator's methods after Close.
var ErrClosed = errors.New("xagentvalidate: the packet validator is closed")

// InternalError carries the report of a library failure; errors.Is(err, ErrInternal) holds.
type InternalError struct {
	// Report is the library's report, whose RuleInternalError violation describes the failure.
	Report *Report
}

// Error returns the library's message.
func (e *InternalError) Error() string {
	for _, v := range e.Report.Violations {
		if v.Rule == RuleInternalError {
			return ErrInternal.Error() + ": " + v.Message
		}
	}
	return ErrInternal.Error()
}

// Is makes errors.Is(err, ErrInternal) true.
func (e *InternalError) Is(target error) bool {
	return target == ErrInternal
}

// DecodeError is returned when the library's answer is not a report this package
// understands (a library built for another ABI, or corrupted memory).
type DecodeError struct {
	// Raw is the text the library returned.
	Raw []byte
	// Err says why it could not be decoded.
	Err error
}

// Error says why the report could not be read.
func (e *DecodeError) Error() string {
	return "xagentvalidate: cannot read the library's report: " + e.Err.Error()
}

// Unwrap returns the decoding error.
func (e *DecodeError) Unwrap() error {
	return e.Err
}

// CardError is returned by NewPacketValidator when the library refuses the reference Card
// because it is not UTF-8 JSON or not a JSON object.
type CardError struct {
	// Report explains the refusal with a violation at the path "/card" (nil if the library
	// gave no reason). For the Card's own rules, use ValidateCard.
	Report *Report
}

// Error names the reason the Card was refused.
func (e *CardError) Error() string {
	if e.Report != nil && len(e.Report.Violations) > 0 {
		return "xagentvalidate: the reference Card was refused: " + e.Report.Violations[0].Message
	}
	return "xagentvalidate: the reference Card was refused"
}

// parseReport decodes the report text the library returned; raw becomes Report.Raw.
func parseReport(raw []byte) (*Report, error) {
	var shape struct {
		Valid      *bool        `json:"valid"`
		Violations *[]Violation `json:"violations"`
	}
	if err := json.Unmarshal(raw, &shape); err != nil {
		return nil, &DecodeError{Raw: raw, Err: err}
	}
	if shape.Valid == nil || shape.Violations == nil {
		return nil, &DecodeError{Raw: raw, Err: errors.New(`"valid" or "violations" is missing`)}
	}
	report := &Report{Valid: *shape.Valid, Violations: *shape.Violations, Raw: raw}
	if report.Has(RuleInternalError) {
		return nil, &InternalError{Report: report}
	}
	return report, nil
}
