// Package xagentvalidate runs the xAgent Connector Protocol 3.0 validators from Go.
//
// It is a thin cgo layer over the C ABI of the Rust crate xagent-validate-ffi (header
// validate-ffi/include/xagent_validate.h, library libxagent_validate_ffi), so a Go backend
// applies exactly the checks that `xagent-connector check` applies: the same rules, the same
// rule ids, the same messages. Every validating function returns a typed [Report] whose Raw
// field holds the report JSON exactly as the library produced it.
//
// An invalid document is not a Go error: it yields a Report with Valid set to false and its
// violations listed (use [Report.Err] to turn that into an error). A Go error means the call
// itself went wrong: the library returned no report, a report that is not the expected JSON,
// or a report saying the library failed internally ([ErrInternal]).
//
// For the per-packet hot path, build a [PacketValidator] once and ask [PacketValidator.IsValid]
// for each packet; it answers valid or not without building a report. Release it with
// [PacketValidator.Close].
//
// Building: the package names no library and no path in its cgo directives. The builder
// chooses between the static archive and the shared library and says where they are through
// CGO_CFLAGS and CGO_LDFLAGS; go/README.md in the repository shows both ways. All memory the
// C library hands back is copied into Go memory and released by the package itself.
package xagentvalidate
